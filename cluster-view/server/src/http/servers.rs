//! `GET /v1/status`, `GET /v1/servers`, `GET /v1/servers/{name}` and
//! `POST /v1/servers/{name}/cordon|drain|uncordon`: this replica's status, the servers, one server with its
//! health history, and an operator's cordon, drain or uncordon; as the [`Status`],
//! [`ServerList`], [`ServerDetail`] and [`CordonChanged`] types the CLI prints too.

use super::{Api, ApiError, query};
use crate::service::MAX_DRAIN_TIMEOUT_S;
use actix_web::{HttpRequest, HttpResponse, web};
use tessera_proto::api::{CordonChanged, ErrorBody, Replicas, ServerDetail, ServerList, Status};
use tessera_proto::v1;
use tessera_view::ViewSnapshot;
use tessera_view::server::MAX_CORDON_REASON_CHARS;

/// This replica's raft status, jobs by state and GPUs by use (from this replica, even while
/// calls go to the leader).
#[utoipa::path(
    get,
    path = "/v1/status",
    tag = "cluster",
    responses(
        (status = 200, description = "this replica's status", body = Status),
        (status = 503, description = "the replica did not answer (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn status(api: web::Data<Api>) -> Result<HttpResponse, ApiError> {
    let (st, snap) = api.own_state().await?;
    Ok(HttpResponse::Ok().json(Status::of(&st, &snap)))
}

/// Every replica this one knows (its configured peers), as each answers its status now: role,
/// leader, term, applied index and how far it lags the most advanced one; an unreachable
/// replica is listed with the error.
#[utoipa::path(
    get,
    path = "/v1/replicas",
    tag = "cluster",
    responses(
        (status = 200, description = "every known replica", body = Replicas),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn replicas(api: web::Data<Api>) -> Result<HttpResponse, ApiError> {
    let addrs = api.view_addrs.clone();
    // Each replica gets a short deadline of its own: one down replica must not hold the page.
    let per_replica = api.timeout.saturating_sub(std::time::Duration::from_secs(1)).min(super::REPLICA_STATUS_TIMEOUT);
    let answers = api
        .call_as(false, move |c| async move {
            let asks: Vec<_> = addrs
                .iter()
                .map(|a| {
                    let mut c = c.clone().with_deadline(per_replica);
                    let a = a.clone();
                    tokio::spawn(async move {
                        match tokio::time::timeout(per_replica, c.status_of(&a)).await {
                            Ok(Ok(s)) => Ok(s),
                            Ok(Err(e)) => Err(e.to_string()),
                            Err(_) => Err(format!("no answer within {} ms", per_replica.as_millis())),
                        }
                    })
                })
                .collect();
            let mut answers = Vec::with_capacity(asks.len());
            for (a, ask) in addrs.iter().zip(asks) {
                answers.push((a.clone(), ask.await.unwrap_or_else(|e| Err(format!("status task failed: {e}")))));
            }
            (c, Ok(answers))
        })
        .await?;
    Ok(HttpResponse::Ok().json(Replicas::of(answers)))
}

/// Every server with its health and GPU bitmap (`x` used, `.` free, `!` unhealthy, `-` the
/// server is not up).
#[utoipa::path(
    get,
    path = "/v1/servers",
    tag = "cluster",
    responses(
        (status = 200, description = "every server", body = ServerList),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn servers(api: web::Data<Api>) -> Result<HttpResponse, ApiError> {
    let (snap, _) = api.snapshot().await?;
    Ok(HttpResponse::Ok().json(ServerList::of(&snap)))
}

/// A server's id by name, from a view.
fn server_index(snap: &ViewSnapshot, name: &str) -> Result<usize, ApiError> {
    snap.server_names.iter().position(|n| n == name).ok_or_else(|| ApiError::UnknownServer(name.to_string()))
}

/// One server: its state, its cordon, and its latest health changes (at most 16, oldest first).
#[utoipa::path(
    get,
    path = "/v1/servers/{name}",
    tag = "cluster",
    params(("name" = String, Path, description = "the server's name, as `GET /v1/servers` lists it")),
    responses(
        (status = 200, description = "the server", body = ServerDetail),
        (status = 404, description = "no such server (code `unknown_server`)", body = ErrorBody),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn server(api: web::Data<Api>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let (snap, _) = api.snapshot().await?;
    let i = server_index(&snap, &name)?;
    let detail = ServerDetail::of(&snap, i).ok_or_else(|| ApiError::UnknownServer(name.to_string()))?;
    Ok(HttpResponse::Ok().json(detail))
}

/// Cordons a server: it takes no new placements; its running gangs go on. The cordon outlives
/// agent restarts and lost leases until lifted; cordoning a cordoned server replaces its cordon.
#[utoipa::path(
    post,
    path = "/v1/servers/{name}/cordon",
    tag = "cluster",
    params(
        ("name" = String, Path, description = "the server's name"),
        ("reason" = Option<String>, Query, max_length = 256, description = "why, kept with the cordon and in the server's history"),
    ),
    responses(
        (status = 200, description = "cordoned", body = CordonChanged),
        (status = 400, description = "a bad query (code `bad_query`)", body = ErrorBody),
        (status = 404, description = "no such server (code `unknown_server`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn cordon(
    api: web::Data<Api>,
    req: HttpRequest,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["reason"])?;
    change(&api, name.into_inner(), v1::CordonAction::Cordon, reason(&q)?, 0).await
}

/// Drains a server: a cordon, and the gangs still on it after `timeout_s` are re-queued whole
/// (to restart elsewhere from their checkpoints).
#[utoipa::path(
    post,
    path = "/v1/servers/{name}/drain",
    tag = "cluster",
    params(
        ("name" = String, Path, description = "the server's name"),
        ("timeout_s" = u64, Query, minimum = 1, maximum = 2592000,
            description = "seconds the running gangs have before they are re-queued"),
        ("reason" = Option<String>, Query, max_length = 256, description = "why, kept with the cordon and in the server's history"),
    ),
    responses(
        (status = 200, description = "draining", body = CordonChanged),
        (status = 400, description = "a bad or missing query parameter (code `bad_query`)", body = ErrorBody),
        (status = 404, description = "no such server (code `unknown_server`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn drain(
    api: web::Data<Api>,
    req: HttpRequest,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["reason", "timeout_s"])?;
    let timeout_s = match q.get("timeout_s") {
        Some(t) => match t.parse::<u64>() {
            Ok(t) if (1..=MAX_DRAIN_TIMEOUT_S).contains(&t) => t,
            _ => {
                let why = format!("`{t}`: whole seconds, 1 to {MAX_DRAIN_TIMEOUT_S}");
                return Err(ApiError::bad("bad_query", "timeout_s", why));
            }
        },
        None => return Err(ApiError::bad("bad_query", "timeout_s", "a drain needs timeout_s")),
    };
    change(&api, name.into_inner(), v1::CordonAction::Drain, reason(&q)?, timeout_s).await
}

/// Lifts a server's cordon: an alive server takes placements again.
#[utoipa::path(
    post,
    path = "/v1/servers/{name}/uncordon",
    tag = "cluster",
    params(("name" = String, Path, description = "the server's name")),
    responses(
        (status = 200, description = "uncordoned (also when it was not cordoned)", body = CordonChanged),
        (status = 400, description = "a query parameter (code `bad_query`: it takes none)", body = ErrorBody),
        (status = 404, description = "no such server (code `unknown_server`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn uncordon(
    api: web::Data<Api>,
    req: HttpRequest,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    change(&api, name.into_inner(), v1::CordonAction::Uncordon, String::new(), 0).await
}

/// The `reason` query parameter, checked.
fn reason(q: &std::collections::HashMap<String, String>) -> Result<String, ApiError> {
    let reason = q.get("reason").cloned().unwrap_or_default();
    if reason.chars().count() > MAX_CORDON_REASON_CHARS {
        return Err(ApiError::bad("bad_query", "reason", format!("at most {MAX_CORDON_REASON_CHARS} characters")));
    }
    Ok(reason)
}

/// Resolves the server's name on a view read and sends the command to the leader.
async fn change(
    api: &Api,
    name: String,
    action: v1::CordonAction,
    reason: String,
    timeout_s: u64,
) -> Result<HttpResponse, ApiError> {
    let (snap, _) = api.snapshot().await?;
    let id = server_index(&snap, &name)? as u32;
    let version = api
        .call(|mut c| async move {
            let r = c.cordon_server(id, action, &reason, timeout_s).await.map_err(ApiError::from);
            (c, r)
        })
        .await?;
    let action = match action {
        v1::CordonAction::Cordon => "cordon",
        v1::CordonAction::Drain => "drain",
        _ => "uncordon",
    };
    Ok(HttpResponse::Ok().json(CordonChanged { server: name, action: action.into(), version }))
}
