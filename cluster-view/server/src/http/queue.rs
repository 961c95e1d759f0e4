//! `GET /v1/queue`: the pending jobs in queue order, each with why it waits
//! ([`tessera_view::wait`]), as the [`Queue`] type. The view is this replica's (a whole-view
//! read); a user sees its tenants' jobs alone, at their places in the whole queue.

use super::{Api, ApiError, query, query_number as number};
use actix_web::{HttpRequest, HttpResponse, web};
use tessera_proto::api::{DEFAULT_QUEUE_PAGE, ErrorBody, MAX_QUEUE_PAGE, Queue};
use tessera_proto::tls::Role;

/// The pending jobs in queue order (a higher priority, then a lower attained-service queue, then
/// an earlier submission first), one page from `offset`, each with why it waits: `never_fits`,
/// `quota`, `capacity` (no free room anywhere), `locality` (room, but not within the level it
/// accepts now) or `ready` (it fits now; its scheduler host has not placed it yet).
#[utoipa::path(
    get,
    path = "/v1/queue",
    tag = "jobs",
    params(
        ("tenant" = Option<String>, Query, description = "only this tenant's jobs"),
        ("offset" = Option<u32>, Query, maximum = 2147483647, description = "skip this many of the jobs the filter keeps"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "jobs per page (default 100)"),
    ),
    responses(
        (status = 200, description = "one page of the queue", body = Queue),
        (status = 400, description = "a bad query (code `bad_query`)", body = ErrorBody),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn queue(api: web::Data<Api>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["tenant", "offset", "limit"])?;
    let limit: u32 = number(&q, "limit", "a job count")?.unwrap_or(DEFAULT_QUEUE_PAGE as u32);
    if limit == 0 || limit as usize > MAX_QUEUE_PAGE {
        return Err(ApiError::bad("bad_query", "limit", format!("1 to {MAX_QUEUE_PAGE} jobs per page")));
    }
    let offset: u32 = number(&q, "offset", "a job count")?.unwrap_or(0);
    if offset > i32::MAX as u32 {
        return Err(ApiError::bad("bad_query", "offset", format!("at most {}", i32::MAX)));
    }
    let tenant = q.get("tenant").cloned();
    let (snap, applied) = api.snapshot().await?;
    let who = super::caller();
    let user = who.role == Role::User;
    let keep = move |j: &tessera_view::Job| {
        tenant.as_ref().is_none_or(|t| *t == j.spec.tenant) && (!user || who.acts_for(&j.spec.tenant))
    };
    // Explaining walks the servers once per job shape: off the actix worker thread.
    let queue = web::block(move || Queue::of(snap, applied, keep, offset as usize, limit as usize))
        .await
        .map_err(|e| ApiError::Internal(format!("explaining the queue: {e}")))?;
    Ok(HttpResponse::Ok().json(queue))
}
