//! `GET /v1/usage`: GPU and CPU-core time over a range, by tenant, user or job (the `Usage`
//! RPC, as the caller), as the [`UsageReport`] the CLI's `tessera usage --json` prints too.

use super::{Api, ApiError, query, query_number as number, query_tenants};
use crate::usage::MAX_USAGE_ROWS;
use actix_web::{HttpRequest, HttpResponse, web};
use tessera_proto::api::{ErrorBody, UsageReport};
use tessera_proto::v1;

/// GPU and CPU-core time used within `[from_ms, to_ms)`. Tenant and user rows come from the
/// replicated hourly ledger (whole hours) plus the placements held now; job rows are exact, for
/// the jobs still in the view. A user sees only its own tenants.
#[utoipa::path(
    get,
    path = "/v1/usage",
    tag = "accounting",
    params(
        ("from_ms" = Option<u64>, Query, maximum = 9223372036854775807_u64, description = "from, Unix ms (default 0: everything the ledger keeps); a range that ends before it starts is empty"),
        ("to_ms" = Option<u64>, Query, maximum = 9223372036854775807_u64, description = "until, Unix ms (default: now)"),
        ("by" = Option<String>, Query, pattern = "^(tenant|user|job)$", description = "`tenant` (default), `user` or `job`"),
        ("tenants" = Option<String>, Query, description = "only these tenants, comma-separated (at most 64)"),
        ("limit" = Option<u32>, Query, maximum = 10000, description = "at most this many rows (default 1,000); the total counts every row"),
    ),
    responses(
        (status = 200, description = "the report", body = UsageReport),
        (status = 400, description = "a bad query (codes `bad_query`, `invalid`)", body = ErrorBody),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn usage(api: web::Data<Api>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["from_ms", "to_ms", "by", "tenants", "limit"])?;
    let tenants = query_tenants(&q)?;
    let limit: u32 = number(&q, "limit", "a row count")?.unwrap_or(0);
    if limit as usize > MAX_USAGE_ROWS {
        return Err(ApiError::bad("bad_query", "limit", format!("at most {MAX_USAGE_ROWS} rows")));
    }
    let by = q.get("by").cloned().unwrap_or_else(|| "tenant".into());
    if by.parse::<tessera_view::UsageBy>().is_err() {
        return Err(ApiError::bad("bad_query", "by", format!("`{by}`: tenant, user or job")));
    }
    let from_ms: u64 = number(&q, "from_ms", "Unix milliseconds")?.unwrap_or(0);
    let to_ms: u64 = number(&q, "to_ms", "Unix milliseconds")?.unwrap_or(0);
    for (key, v) in [("from_ms", from_ms), ("to_ms", to_ms)] {
        if v > i64::MAX as u64 {
            return Err(ApiError::bad("bad_query", key, format!("{v} is past the largest time, {}", i64::MAX)));
        }
    }
    let r = v1::UsageRequest { from_ms, to_ms, by, tenants, limit, linearizable: false };
    let answer = api
        .call(move |mut c| async move {
            let out = c.usage(r).await.map_err(ApiError::from);
            (c, out)
        })
        .await?;
    Ok(HttpResponse::Ok().json(UsageReport::of(&answer)))
}
