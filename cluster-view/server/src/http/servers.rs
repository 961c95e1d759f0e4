//! `GET /v1/status`, `GET /v1/servers`, `GET /v1/servers/{name}` and
//! `POST /v1/servers/{name}/cordon|drain|uncordon`: this replica's status, the servers, one server with its
//! health history, and an operator's cordon, drain or uncordon; as the [`Status`],
//! [`ServerList`], [`ServerDetail`] and [`CordonChanged`] types the CLI prints too.

use super::{Api, ApiError, query, query_number};
use crate::service::MAX_DRAIN_TIMEOUT_S;
use actix_web::{HttpRequest, HttpResponse, web};
use tessera_proto::api::{
    CordonChanged, ErrorBody, MAX_SERVER_PAGE, Replicas, ServerDetail, ServerFilter, ServerList, Status,
};
use tessera_proto::v1;
use tessera_view::ViewSnapshot;
use tessera_view::cluster_spec::MAX_SERVERS;
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

/// The servers with their health and GPU bitmap (`x` used, `.` free, `!` unhealthy, `-` the
/// server is not up), by id, filtered and paged: `health` (comma-separated), `rack`, `type`,
/// `min_free_gpus`, `cordoned`, and pages of `limit` after the id `after`.
#[utoipa::path(
    get,
    path = "/v1/servers",
    tag = "cluster",
    params(
        ("health" = Option<String>, Query, pattern = "^(up|draining|down|removed)(,(up|draining|down|removed))*$", description = "only these healths, comma-separated: up, draining, down, removed (without it, every server but the removed ones)"),
        ("rack" = Option<String>, Query, description = "only this rack's servers"),
        ("type" = Option<String>, Query, description = "only servers of this GPU type (e.g. nvidia-h100-80g)"),
        ("min_free_gpus" = Option<u32>, Query, maximum = 64, description = "only servers with at least this many GPUs free to place on"),
        ("cordoned" = Option<bool>, Query, description = "only cordoned (true) or uncordoned (false) servers"),
        ("after" = Option<u32>, Query, maximum = 16777215, description = "only ids above this: the previous page's `next_after` (server ids are below 2^24)"),
        ("limit" = Option<u32>, Query, maximum = 100000, description = "servers per page (default 10,000)"),
    ),
    responses(
        (status = 200, description = "one page of the servers the filter keeps", body = ServerList),
        (status = 400, description = "a bad query (code `bad_query`)", body = ErrorBody),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn servers(api: web::Data<Api>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["health", "rack", "type", "min_free_gpus", "cordoned", "after", "limit"])?;
    let limit = query_number::<u32>(&q, "limit", "a number")?.unwrap_or(0);
    if limit as usize > MAX_SERVER_PAGE {
        return Err(ApiError::bad("bad_query", "limit", format!("at most {MAX_SERVER_PAGE} servers per page")));
    }
    let min_free_gpus = query_number::<u32>(&q, "min_free_gpus", "a number")?.unwrap_or(0);
    if min_free_gpus > 64 {
        return Err(ApiError::bad("bad_query", "min_free_gpus", "a server has at most 64 GPUs"));
    }
    let filter = ServerFilter {
        health: match q.get("health") {
            Some(h) => ServerFilter::parse_health(h).map_err(|e| ApiError::bad("bad_query", "health", e))?,
            None => Vec::new(),
        },
        rack: q.get("rack").cloned(),
        device_type: q.get("type").cloned(),
        min_free_gpus,
        cordoned: match q.get("cordoned").map(String::as_str) {
            None => None,
            Some("true") => Some(true),
            Some("false") => Some(false),
            Some(other) => return Err(ApiError::bad("bad_query", "cordoned", format!("`{other}`: true or false"))),
        },
        after: match query_number::<u32>(&q, "after", "a server id")? {
            Some(a) if u64::from(a) >= MAX_SERVERS => {
                return Err(ApiError::bad("bad_query", "after", format!("server ids are below {MAX_SERVERS}")));
            }
            a => a,
        },
        limit: limit as usize,
    };
    let (snap, _) = api.snapshot().await?;
    Ok(HttpResponse::Ok().json(filter.list(&snap)))
}

/// A server's id by name, from a view: the last server of that name (a removed server's name
/// may have been given to a later one, which it then means).
pub(super) fn server_index(snap: &ViewSnapshot, name: &str) -> Result<usize, ApiError> {
    snap.server_names.iter().rposition(|n| n == name).ok_or_else(|| ApiError::UnknownServer(name.to_string()))
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
        (status = 409, description = "the server was removed from the cluster (code `conflict`)", body = ErrorBody),
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

/// Drains a server: a cordon; its gangs move now where they fit no looser (the leader's
/// early moves), and those still on it after `timeout_s` are re-queued whole (to restart
/// elsewhere from their checkpoints).
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
        (status = 409, description = "the server was removed from the cluster (code `conflict`)", body = ErrorBody),
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
