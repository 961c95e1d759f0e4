//! `GET /v1/status`, `GET /v1/servers`, `GET /v1/servers/{name}` and
//! `POST /v1/servers/{name}/{action}`: this replica's status, the servers, one server with its
//! health history, and an operator's cordon, drain or uncordon; as the [`Status`],
//! [`ServerList`], [`ServerDetail`] and [`CordonChanged`] types the CLI prints too.

use super::{Api, ApiError, query};
use crate::service::MAX_DRAIN_TIMEOUT_S;
use actix_web::{HttpRequest, HttpResponse, web};
use tessera_proto::api::{CordonChanged, ErrorBody, ServerDetail, ServerList, Status};
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

/// An operator's command on a server: `cordon` (no new placements; running gangs go on),
/// `drain` (a cordon, and the gangs still on the server after `timeout_s` are re-queued whole)
/// or `uncordon`. The cordon outlives agent restarts and lost leases until lifted.
#[utoipa::path(
    post,
    path = "/v1/servers/{name}/{action}",
    tag = "cluster",
    params(
        ("name" = String, Path, description = "the server's name"),
        ("action" = CordonAction, Path, description = "what to do"),
        ("reason" = Option<String>, Query, description = "why (cordon, drain); at most 256 characters"),
        ("timeout_s" = Option<u64>, Query, minimum = 1, maximum = 2592000,
            description = "drain only, required: seconds until the gangs still on the server are re-queued"),
    ),
    responses(
        (status = 200, description = "done", body = CordonChanged),
        (status = 400, description = "a bad action or query (codes `bad_action`, `bad_query`)", body = ErrorBody),
        (status = 404, description = "no such server (code `unknown_server`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn cordon(
    api: web::Data<Api>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (name, action_name) = path.into_inner();
    let action = match action_name.as_str() {
        "cordon" => v1::CordonAction::Cordon,
        "drain" => v1::CordonAction::Drain,
        "uncordon" => v1::CordonAction::Uncordon,
        other => return Err(ApiError::bad("bad_action", "action", format!("`{other}`: cordon, drain or uncordon"))),
    };
    let known: &[&str] = match action {
        v1::CordonAction::Drain => &["reason", "timeout_s"],
        v1::CordonAction::Cordon => &["reason"],
        _ => &[],
    };
    let q = query(&req, known)?;
    let reason = q.get("reason").cloned().unwrap_or_default();
    if reason.chars().count() > MAX_CORDON_REASON_CHARS {
        return Err(ApiError::bad("bad_query", "reason", format!("at most {MAX_CORDON_REASON_CHARS} characters")));
    }
    let timeout_s = match (action, q.get("timeout_s")) {
        (v1::CordonAction::Drain, Some(t)) => match t.parse::<u64>() {
            Ok(t) if (1..=MAX_DRAIN_TIMEOUT_S).contains(&t) => t,
            _ => {
                return Err(ApiError::bad(
                    "bad_query",
                    "timeout_s",
                    format!("`{t}`: whole seconds, 1 to {MAX_DRAIN_TIMEOUT_S}"),
                ));
            }
        },
        (v1::CordonAction::Drain, None) => {
            return Err(ApiError::bad("bad_query", "timeout_s", "a drain needs timeout_s"));
        }
        _ => 0,
    };
    let (snap, _) = api.snapshot().await?;
    let id = server_index(&snap, &name)? as u32;
    let version = api
        .call(|mut c| async move {
            let r = c.cordon_server(id, action, &reason, timeout_s).await.map_err(ApiError::from);
            (c, r)
        })
        .await?;
    Ok(HttpResponse::Ok().json(CordonChanged { server: name, action: action_name, version }))
}

/// What `POST /v1/servers/{name}/{action}` accepts as its action.
#[derive(Clone, Copy, Debug, utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum CordonAction {
    /// No new placements.
    Cordon,
    /// A cordon with a deadline.
    Drain,
    /// Lift the cordon.
    Uncordon,
}
