//! `GET /healthz` and `GET /readyz`, the probes of a supervisor (Docker's health check, a
//! Kubernetes liveness and readiness probe, a load balancer). Both ask this replica's own gRPC
//! `Status`, so they test the process that serves, not only its HTTP thread:
//! - `/healthz`: 200 when the replica answers; restart it when this fails.
//! - `/readyz`: 200 when it also knows a leader, 503 otherwise (no quorum it can reach, or an
//!   election under way): send clients elsewhere meanwhile, but do not restart it.

use super::{Api, ApiError};
use actix_web::{HttpResponse, web};
use serde::Serialize;
use tessera_proto::api::{ErrorBody, Probe};

/// What `GET /readyz` answers with 503: the probe of a replica that knows no leader, or the error
/// of one that did not answer (documentation only: the OpenAPI document's `oneOf`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum NotReady {
    /// The replica answered and knows no leader.
    Leaderless(Probe),
    /// The replica did not answer.
    Unanswered(ErrorBody),
}

/// Liveness: the replica serves its gRPC API.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses(
        (status = 200, description = "the replica answers (its role, term and leader as it knows them)", body = Probe),
        (status = 503, description = "the replica did not answer (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn healthz(api: web::Data<Api>) -> Result<HttpResponse, ApiError> {
    let probe = Probe::of(&api.own_status().await?);
    Ok(HttpResponse::Ok().json(probe))
}

/// Readiness: the replica serves and knows a leader.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "the replica knows a leader", body = Probe),
        (status = 503, description = "no leader known (the probe says so), or the replica did not answer (an `ErrorBody`, code `unavailable`)", body = NotReady),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn readyz(api: web::Data<Api>) -> Result<HttpResponse, ApiError> {
    let probe = Probe::of(&api.own_status().await?);
    Ok(if probe.ready() { HttpResponse::Ok() } else { HttpResponse::ServiceUnavailable() }.json(probe))
}
