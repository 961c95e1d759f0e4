//! `/v1/jobs`: list, read (the `GetJob` RPC), submit and cancel jobs. Answers are the
//! [`JobList`], [`JobDetail`], [`Submitted`] and [`Cancelled`] types the CLI prints too; a
//! refused submission is sorted by the view's structured [`v1::SubmitRefusal`], not by its
//! words.

use super::spec::{BodyFormat, JobFileBody, parse_spec};
use super::{Api, ApiError, Place, job_id, query, query_number};
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use tessera_proto::api::{Cancelled, ErrorBody, JobDetail, JobFilter, JobList, MAX_JOB_PAGE, Submitted, WaitInfo};
use tessera_proto::trace::{self, FutureExt as _};
use tessera_proto::v1;
use tracing::Instrument;

/// Longest cancellation reason, bytes (the view's own bound).
const MAX_REASON_BYTES: usize = 4096;

/// The jobs the view holds, by id, filtered and paged: `state` (comma-separated), `tenant`,
/// `user`, and pages of `limit` after the id `after` (the previous page's `next_after`).
#[utoipa::path(
    get,
    path = "/v1/jobs",
    tag = "jobs",
    params(
        ("state" = Option<String>, Query, pattern = "^(pending|placed|running|migrating|finished|failed)(,(pending|placed|running|migrating|finished|failed))*$", description = "only these states, comma-separated: pending, placed, running, migrating, finished, failed"),
        ("tenant" = Option<String>, Query, description = "only this tenant's jobs"),
        ("user" = Option<String>, Query, description = "only this submitter's jobs"),
        ("after" = Option<u64>, Query, maximum = 9223372036854775807_u64, description = "only ids above this: the previous page's `next_after`"),
        ("limit" = Option<u32>, Query, maximum = 10000, description = "jobs per page (default 1,000)"),
    ),
    responses(
        (status = 200, description = "one page of the jobs the filter keeps", body = JobList),
        (status = 400, description = "a bad query (code `bad_query`)", body = ErrorBody),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn list_jobs(api: web::Data<Api>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["state", "tenant", "user", "after", "limit"])?;
    let number = |key: &str| query_number::<u64>(&q, key, "a number");
    let limit = number("limit")?.unwrap_or(0);
    if limit > MAX_JOB_PAGE as u64 {
        return Err(ApiError::bad("bad_query", "limit", format!("at most {MAX_JOB_PAGE} jobs per page")));
    }
    let filter = JobFilter {
        states: match q.get("state") {
            Some(s) => JobFilter::parse_states(s).map_err(|e| ApiError::bad("bad_query", "state", e))?,
            None => Vec::new(),
        },
        tenant: q.get("tenant").cloned(),
        user: q.get("user").cloned(),
        after: match number("after")? {
            Some(a) if a > i64::MAX as u64 => {
                return Err(ApiError::bad("bad_query", "after", format!("{a} is past the largest job id")));
            }
            a => a,
        },
        limit: limit as usize,
    };
    let (snap, applied) = api.snapshot().await?;
    let mut list = JobList::of(&snap, applied);
    // A user sees its tenants' jobs alone (before counting them).
    let who = super::caller();
    if who.role == tessera_proto::tls::Role::User {
        list.jobs.retain(|j| who.acts_for(&j.tenant));
    }
    filter.apply(&mut list);
    Ok(HttpResponse::Ok().json(list))
}

/// One job, with its spec, proposals and per-member task states; while it is pending, why it
/// waits (`waiting`, as in `GET /v1/queue`).
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    tag = "jobs",
    params(("id" = u64, Path, description = "the job id")),
    responses(
        (status = 200, description = "the job", body = JobDetail),
        (status = 400, description = "the id is not a number (code `bad_job_id`)", body = ErrorBody),
        (status = 404, description = "no such job (code `unknown_job`)", body = ErrorBody),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn get_job(api: web::Data<Api>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = job_id(&id)?;
    let (job, waiting) = api.job(id).await?;
    let names = api.names_for(job.placement.iter().flat_map(|p| p.members.iter().map(|m| m.server.0))).await?;
    let mut detail = JobDetail::of(&job, &names);
    detail.waiting = waiting.as_ref().map(WaitInfo::of_wire);
    Ok(HttpResponse::Ok().json(detail))
}

/// Reads the body up to the limit; a declared length over it is refused before reading.
pub(super) async fn read_body(api: &Api, req: &HttpRequest, payload: web::Payload) -> Result<web::Bytes, ApiError> {
    let declared =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > api.max_body_bytes as u64) {
        return Err(ApiError::TooLarge(api.max_body_bytes));
    }
    let ms = api.timeout.as_millis() as u64;
    match tokio::time::timeout(api.timeout, payload.to_bytes_limited(api.max_body_bytes)).await {
        Err(_) => Err(ApiError::Timeout(ms)),
        Ok(Err(_)) => Err(ApiError::TooLarge(api.max_body_bytes)),
        Ok(Ok(Err(e))) => Err(ApiError::BadInput { code: "bad_body", message: e.to_string(), at: Place::default() }),
        Ok(Ok(Ok(b))) => Ok(b),
    }
}

/// The body's format, from its content type (JSON when none is given).
fn body_format(req: &HttpRequest) -> Result<BodyFormat, ApiError> {
    let Some(ct) = req.headers().get(header::CONTENT_TYPE) else { return Ok(BodyFormat::Json) };
    let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
    let mime = ct.split(';').next().unwrap_or("").trim();
    match mime {
        "application/toml" | "text/toml" | "text/x-toml" => Ok(BodyFormat::Toml),
        "application/json" | "" => Ok(BodyFormat::Json),
        other => Err(ApiError::UnsupportedMedia(other.to_string())),
    }
}

/// Submit a job: a job file as TOML (`Content-Type: application/toml`) or the same fields as
/// JSON. Errors name the field, and the line and column in the body. With an
/// `Idempotency-Key` header the key is the submission's request id: the same key and body
/// sent again answer the job admitted the first time, never a second job.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    tag = "jobs",
    request_body(
        description = "a job file: JSON, or TOML with Content-Type application/toml",
        content((JobFileBody = "application/json"), (String = "application/toml")),
    ),
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "the submission's request id (1-96 printable ASCII characters, no spaces): a retry with the same key and body admits nothing new"),
        ("traceparent" = Option<String>, Header, description = "a W3C trace context: the job is admitted under this trace (a malformed one is ignored)"),
    ),
    responses(
        (status = 201, description = "admitted", body = Submitted),
        (status = 400, description = "the body is not a valid job spec, or the Idempotency-Key is malformed (codes `malformed_json`, `malformed_toml`, `invalid_spec`, `bad_body`, `bad_request_id`)", body = ErrorBody),
        (status = 409, description = "the Idempotency-Key was used before with another body (code `request_reused`)", body = ErrorBody),
        (status = 413, description = "the body is too large (code `too_large`)", body = ErrorBody),
        (status = 415, description = "neither JSON nor TOML (code `unsupported_media_type`)", body = ErrorBody),
        (status = 422, description = "the job can never fit this cluster (code `never_fits`)", body = ErrorBody),
        (status = 503, description = "no leader answered, or the outcome is unknown (codes `unavailable`, `outcome_unknown`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn submit(
    api: web::Data<Api>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let format = body_format(&req)?;
    let key = idempotency_key(&req)?;
    let body = read_body(&api, &req, payload).await?;
    let spec = parse_spec(&body, format)?;
    let wire = v1::JobSpec::from(&spec);
    // The call to the leader continues the caller's trace (a `traceparent` header), so the job
    // is admitted under it. The call also runs in the caller's context, which is what travels
    // when no subscriber records the span (a library user's process).
    let span = tracing::info_span!(target: trace::TARGET, "http.submit");
    let caller = trace::remote_from(|k| req.headers().get(k).and_then(|v| v.to_str().ok()));
    if let Some(cx) = caller.clone() {
        trace::set_parent(&span, cx);
    }
    let results = api
        .call(|mut c| {
            async move {
                let r = match &key {
                    Some(k) => c.submit_as(k.as_str(), vec![wire]).await,
                    None => c.submit(vec![wire]).await,
                };
                (c, r.map_err(ApiError::from))
            }
            .instrument(span)
            .with_context(caller.unwrap_or_default())
        })
        .await?;
    let r = results.into_iter().next().ok_or_else(|| ApiError::Internal("the view answered no result".into()))?;
    if r.job == 0 || !r.error.is_empty() {
        return Err(refused(r));
    }
    let location = HeaderValue::from_str(&format!("/v1/jobs/{}", r.job))
        .map_err(|e| ApiError::Internal(format!("location header: {e}")))?;
    Ok(HttpResponse::Created().insert_header((header::LOCATION, location)).json(Submitted::of(r.job, &spec)))
}

/// The `Idempotency-Key` header as a request id, when given.
fn idempotency_key(req: &HttpRequest) -> Result<Option<tessera_view::RequestId>, ApiError> {
    let Some(v) = req.headers().get("idempotency-key") else { return Ok(None) };
    let bad = |m: String| ApiError::BadInput {
        code: "bad_request_id",
        message: format!("Idempotency-Key: {m}"),
        at: Place { field: Some("Idempotency-Key".into()), ..Place::default() },
    };
    let text = v.to_str().map_err(|_| bad("not printable ASCII".into()))?;
    tessera_view::RequestId::new(text).map(Some).map_err(|e| bad(e.to_string()))
}

/// A refused submission as an error, by the view's structured reason (never its words).
fn refused(r: v1::SubmitResult) -> ApiError {
    match r.refusal() {
        v1::SubmitRefusal::NeverFits => ApiError::NeverFits(r.error),
        v1::SubmitRefusal::InvalidSpec => {
            ApiError::BadInput { code: "invalid_spec", message: r.error, at: Place::default() }
        }
        v1::SubmitRefusal::RequestReused => ApiError::RequestReused(r.error),
        v1::SubmitRefusal::BadRequestId => {
            ApiError::BadInput { code: "bad_request_id", message: r.error, at: Place::default() }
        }
        v1::SubmitRefusal::OutcomeUnknown | v1::SubmitRefusal::Unspecified => ApiError::OutcomeUnknown(r.error),
    }
}

/// Cancel a job in any live state; `reason` is kept as its error.
#[utoipa::path(
    delete,
    path = "/v1/jobs/{id}",
    tag = "jobs",
    params(
        ("id" = u64, Path, description = "the job id"),
        ("reason" = Option<String>, Query, description = "why, kept as the job's error (at most 4096 bytes)"),
        ("grace_s" = Option<u64>, Query, maximum = 3600, description = "seconds its tasks get between SIGTERM and SIGKILL (at most 3600; default: its spec's stop_grace_s)"),
    ),
    responses(
        (status = 200, description = "cancelled", body = Cancelled),
        (status = 400, description = "a bad id or query (codes `bad_job_id`, `bad_query`)", body = ErrorBody),
        (status = 404, description = "no such job (code `not_found`)", body = ErrorBody),
        (status = 409, description = "the job has ended (code `conflict`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn cancel(
    api: web::Data<Api>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = job_id(&id)?;
    let q = query(&req, &["reason", "grace_s"])?;
    let reason = q.get("reason").cloned().unwrap_or_default();
    let grace_s = match q.get("grace_s") {
        None => None,
        Some(g) => match g.parse::<u64>() {
            Ok(g) if g <= tessera_view::job::MAX_STOP_GRACE_S => Some(g),
            _ => {
                return Err(ApiError::bad(
                    "bad_query",
                    "grace_s",
                    format!("`{g}`: seconds, 0 to {}", tessera_view::job::MAX_STOP_GRACE_S),
                ));
            }
        },
    };
    if reason.len() > MAX_REASON_BYTES {
        return Err(ApiError::bad(
            "bad_query",
            "reason",
            format!("{} bytes; at most {MAX_REASON_BYTES}", reason.len()),
        ));
    }
    let version = api
        .call(|mut c| async move {
            let r = c.cancel_with(id, &reason, grace_s).await.map_err(ApiError::from);
            (c, r)
        })
        .await?;
    Ok(HttpResponse::Ok().json(Cancelled { job: id, cancelled: true, version }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_proto::api::refusal_code;

    #[test]
    fn refusals_keep_their_code_whatever_their_words() {
        for (refusal, status) in [
            (v1::SubmitRefusal::NeverFits, 422),
            (v1::SubmitRefusal::InvalidSpec, 400),
            (v1::SubmitRefusal::OutcomeUnknown, 503),
            (v1::SubmitRefusal::RequestReused, 409),
            (v1::SubmitRefusal::BadRequestId, 400),
        ] {
            let r = v1::SubmitResult { job: 0, error: "words that say nothing".into(), refusal: refusal.into() };
            let e = refused(r);
            assert_eq!(e.body().code, refusal_code(refusal));
            assert_eq!(e.status_and_code().0.as_u16(), status);
        }
    }
}
