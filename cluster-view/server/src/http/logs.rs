//! `GET /v1/jobs/{id}/logs`: the tail of a member's stdout or stderr from the node agent of
//! its server while the job is placed; once it ended (the placement is gone) every known agent
//! is asked, [`AGENT_FANOUT`] at a time, each bounded by [`AGENT_TIMEOUT`].

use super::{Api, ApiError, job_id, query};
use actix_web::{HttpRequest, HttpResponse, web};
use std::time::Duration;
use tessera_proto::api::{ErrorBody, Logs, server_name};
use tessera_proto::tls::Security;
use tessera_proto::v1;

/// Node agents asked at once for a finished job's log.
const AGENT_FANOUT: usize = 4;
/// Most node agents asked for one finished job's log.
const MAX_AGENTS_ASKED: usize = 1024;
/// How long one node agent may take to answer a log request.
const AGENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest log tail one request may ask for (the agents' own bound).
pub const MAX_TAIL_BYTES: u64 = 4 << 20;

/// Which output of a task: the values of the `stream` query parameter (documented as an
/// enumeration, so that a client knows an empty or other value is refused).
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub(super) enum LogStream {
    /// Standard output (the default).
    Stdout,
    /// Standard error.
    Stderr,
}

/// The tail of a member's stdout or stderr, from its node agent (every agent is asked once
/// the job ended).
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/logs",
    tag = "jobs",
    params(
        ("id" = u64, Path, description = "the job id"),
        ("member" = Option<u32>, Query, description = "the member's rank (default 0)"),
        ("stream" = Option<LogStream>, Query, description = "`stdout` (default) or `stderr`"),
        ("tail_bytes" = Option<u64>, Query, maximum = 4194304, description = "bytes from the end; 0 or none: 64 KiB"),
    ),
    responses(
        (status = 200, description = "the tail", body = Logs),
        (status = 400, description = "a bad id or query (codes `bad_job_id`, `bad_query`)", body = ErrorBody),
        (status = 404, description = "no such job, no such member of it, or no agent has the log (codes `unknown_job`, `no_logs`, `not_found`)", body = ErrorBody),
        (status = 409, description = "the job was never placed (code `wrong_state`)", body = ErrorBody),
        (status = 503, description = "no replica or agent answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn logs(
    api: web::Data<Api>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = job_id(&id)?;
    let q = query(&req, &["member", "stream", "tail_bytes"])?;
    let member: u32 = match q.get("member") {
        None => 0,
        Some(m) => {
            m.parse().map_err(|_| ApiError::bad("bad_query", "member", format!("`{m}` is not a member index")))?
        }
    };
    let stream = match q.get("stream").map(String::as_str) {
        None | Some("stdout") => LogStream::Stdout,
        Some("stderr") => LogStream::Stderr,
        Some(s) => return Err(ApiError::bad("bad_query", "stream", format!("`{s}`: stdout or stderr"))),
    };
    let stderr = matches!(stream, LogStream::Stderr);
    let tail_bytes: u64 = match q.get("tail_bytes") {
        None => 0,
        Some(t) => match t.parse::<u64>() {
            Ok(n) if n <= MAX_TAIL_BYTES => n,
            _ => {
                return Err(ApiError::bad(
                    "bad_query",
                    "tail_bytes",
                    format!("`{t}`: a byte count up to {MAX_TAIL_BYTES}"),
                ));
            }
        },
    };
    let (job, _) = api.job(id).await?;
    if member >= job.spec.members {
        // A member this job does not have: a log that does not exist (404), like an unknown
        // job; the query itself is well formed (schemathesis flagged the 400 this was).
        return Err(ApiError::NoLogs(format!(
            "job {id} has no member {member}: it has {} (0..{})",
            job.spec.members, job.spec.members
        )));
    }
    let request = v1::LogsRequest { job: id, member, stderr, tail_bytes };
    let placed_on = job.placement.as_ref().and_then(|p| p.members.get(member as usize)).map(|m| m.server.0);
    if placed_on.is_none() && job.proposals.is_empty() {
        return Err(ApiError::WrongState(format!("job {id} is {} and has never been placed: no logs yet", job.state)));
    }
    let (server, answer) = match placed_on {
        Some(server) => {
            // The job was read as the caller (its tenant checked); the agent is asked as this
            // replica.
            let answer = api
                .call_as(false, |mut c| async move {
                    let r = c.logs(server, request).await.map_err(ApiError::from);
                    (c, r)
                })
                .await?;
            (server, answer)
        }
        // Ended: the placement is gone, so the agent that ran the member is unknown; ask them all.
        None => {
            let security = api.security.clone();
            api.call_as(false, |mut c| async move {
                let r = match c.agents().await {
                    Ok(agents) => logs_from_any(agents, request, security).await,
                    Err(e) => Err(ApiError::from(e)),
                };
                (c, r)
            })
            .await?
        }
    };
    let names = api.names_for(std::iter::once(server)).await?;
    Ok(HttpResponse::Ok().json(Logs {
        job: id,
        member,
        stream: if stderr { "stderr" } else { "stdout" }.to_string(),
        server: server_name(&names, server),
        path: answer.path,
        size: answer.size,
        truncated: answer.truncated,
        data: String::from_utf8_lossy(&answer.data).into_owned(),
    }))
}

/// One agent's answer to a log request, bounded by [`AGENT_TIMEOUT`].
async fn agent_logs(addr: &str, req: v1::LogsRequest, security: &Security) -> Result<v1::LogsResponse, ApiError> {
    let unreachable = |source| ApiError::AgentUnreachable { addr: addr.to_string(), source };
    let ep = security.endpoint(addr).map_err(unreachable)?.connect_timeout(AGENT_TIMEOUT).timeout(AGENT_TIMEOUT);
    let work = async {
        let ch = ep.connect().await.map_err(unreachable)?;
        v1::agent_client::AgentClient::new(ch)
            .max_decoding_message_size(8 << 20)
            .logs(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|status| ApiError::AgentRefused { addr: addr.to_string(), status })
    };
    tokio::time::timeout(AGENT_TIMEOUT, work)
        .await
        .map_err(|_| ApiError::AgentTimeout { addr: addr.to_string(), timeout: AGENT_TIMEOUT })?
}

/// Asks the agents, [`AGENT_FANOUT`] at a time, for a log; the first that has it answers.
async fn logs_from_any(
    agents: Vec<v1::AgentInfo>,
    req: v1::LogsRequest,
    security: Security,
) -> Result<(u32, v1::LogsResponse), ApiError> {
    let asked = agents.len().min(MAX_AGENTS_ASKED);
    let mut pending = agents.into_iter().take(MAX_AGENTS_ASKED);
    let mut running = tokio::task::JoinSet::new();
    let mut last = String::from("no node agent is known");
    loop {
        while running.len() < AGENT_FANOUT {
            let Some(a) = pending.next() else { break };
            let security = security.clone();
            running.spawn(async move { (a.server, agent_logs(&a.addr, req, &security).await) });
        }
        match running.join_next().await {
            // Dropping the set aborts the asks still running.
            Some(Ok((server, Ok(r)))) => return Ok((server, r)),
            Some(Ok((_, Err(e)))) => last = e.to_string(),
            Some(Err(e)) => last = format!("ask failed: {e}"),
            None => {
                return Err(ApiError::NoLogs(format!(
                    "no node agent has job {} member {} ({asked} asked; last answer: {last})",
                    req.job, req.member
                )));
            }
        }
    }
}
