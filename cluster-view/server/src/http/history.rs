//! `GET /v1/history`: jobs the view forgot (ended, past the cluster's `ended_jobs_kept`), from
//! the answering replica's history of ended jobs (the `History` RPC, as the caller), as the
//! [`JobHistory`] that `tessera jobs --history --json` prints too.

use super::{Api, ApiError, query, query_number as number, query_tenants};
use actix_web::{HttpRequest, HttpResponse, web};
use tessera_proto::api::{ErrorBody, JobHistory};
use tessera_proto::v1;
use tessera_replica::history::MAX_PAGE;

/// Ended jobs the view no longer keeps, in the order they ended within `[from_ms, to_ms)`,
/// kept for the cluster's accounting retention. A user sees only its own tenants'.
#[utoipa::path(
    get,
    path = "/v1/history",
    tag = "jobs",
    params(
        ("from_ms" = Option<u64>, Query, maximum = 9223372036854775807_u64, description = "jobs that ended at or after this time, Unix ms (default 0)"),
        ("to_ms" = Option<u64>, Query, maximum = 9223372036854775807_u64, description = "... and before this one, Unix ms (default: no bound)"),
        ("tenants" = Option<String>, Query, description = "only these tenants, comma-separated (at most 64)"),
        ("user" = Option<String>, Query, description = "only this submitter's jobs"),
        ("after_ended_ms" = Option<u64>, Query, maximum = 9223372036854775807_u64, description = "with `after_job`: the previous page's `next_after_ended_ms`"),
        ("after_job" = Option<u64>, Query, maximum = 9223372036854775807_u64, description = "the previous page's `next_after_job`: this page starts after that job"),
        ("limit" = Option<u32>, Query, maximum = 10000, description = "jobs per page (default 1,000)"),
    ),
    responses(
        (status = 200, description = "one page of the history", body = JobHistory),
        (status = 400, description = "a bad query (codes `bad_query`, `invalid`)", body = ErrorBody),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn history(api: web::Data<Api>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["from_ms", "to_ms", "tenants", "user", "after_ended_ms", "after_job", "limit"])?;
    let tenants = query_tenants(&q)?;
    let limit: u32 = number(&q, "limit", "a job count")?.unwrap_or(0);
    if limit as usize > MAX_PAGE {
        return Err(ApiError::bad("bad_query", "limit", format!("at most {MAX_PAGE} jobs per page")));
    }
    let mut n = [0u64; 4];
    for (i, key) in ["from_ms", "to_ms", "after_ended_ms", "after_job"].into_iter().enumerate() {
        n[i] = number(&q, key, "a number")?.unwrap_or(0);
        if n[i] > i64::MAX as u64 {
            return Err(ApiError::bad("bad_query", key, format!("{} is past the largest value, {}", n[i], i64::MAX)));
        }
    }
    let [from_ms, to_ms, after_ended_ms, after_job] = n;
    let user = q.get("user").cloned().unwrap_or_default();
    let r = v1::HistoryRequest { from_ms, to_ms, tenants, user, after_ended_ms, after_job, limit };
    let answer = api
        .call(move |mut c| async move {
            let out = c.history(r).await.map_err(ApiError::from);
            (c, out)
        })
        .await?;
    Ok(HttpResponse::Ok().json(JobHistory::of(&answer)))
}
