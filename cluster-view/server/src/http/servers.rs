//! `GET /v1/status` and `GET /v1/servers`: this replica's status and the servers, as the
//! [`Status`] and [`ServerList`] types the CLI prints too.

use super::{Api, ApiError};
use actix_web::{HttpResponse, web};
use tessera_proto::api::{ErrorBody, ServerList, Status};

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
