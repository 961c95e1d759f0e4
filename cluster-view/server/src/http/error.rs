//! [`ApiError`]: why an API request failed, and the one place where a failure becomes an HTTP
//! status and an [`ErrorBody`] (`{"code", "message", "field"?, "line"?, "column"?}`);
//! [`http_of_grpc`] is the one mapping from gRPC codes to HTTP statuses.
//!
//! `ApiError` is the crate's HTTP mapping, not a second error type of the crate: the crate's
//! errors are [`ViewServerError`]s (one `From` brings them here, answered with the status of
//! their gRPC code); the other variants are faults of the HTTP request itself (a bad body, an
//! unknown route) or answers the HTTP layer got from the view and the node agents as a client.

use crate::client::ClientError;
use crate::error::{ViewServerError, chain};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use tessera_proto::api::ErrorBody;
use thiserror::Error;
use tonic::Code;

/// Where in a request body the fault is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// The field, as a path (`locality.tolerate`, `command[0]`).
    pub field: Option<String>,
    /// The line, 1-based.
    pub line: Option<u32>,
    /// The column, 1-based, in characters.
    pub column: Option<u32>,
}

/// Why an API request failed: the HTTP mapping of the crate's errors ([`ViewServerError`]) and of
/// the HTTP layer's own refusals. Rendered as an [`ErrorBody`] with a fitting status; the body's
/// message is the error with its causes ([`chain`]).
#[derive(Debug, Error)]
pub enum ApiError {
    /// The request is malformed; `at` says where when the input names a place.
    #[error("{message}")]
    BadInput {
        /// Stable error code.
        code: &'static str,
        /// What is wrong.
        message: String,
        /// The place at fault.
        at: Place,
    },
    /// No job with this id in the view.
    #[error("unknown job {0}")]
    UnknownJob(u64),
    /// No server with this name in the view.
    #[error("unknown server `{0}`")]
    UnknownServer(String),
    /// No node agent has the asked-for log.
    #[error("{0}")]
    NoLogs(String),
    /// The job is in a state where the request does not apply.
    #[error("{0}")]
    WrongState(String),
    /// The job could never be placed on this cluster.
    #[error("{0}")]
    NeverFits(String),
    /// The body is larger than the limit.
    #[error("request body over {0} bytes")]
    TooLarge(usize),
    /// The body's content type is neither JSON nor TOML.
    #[error("content type `{0}` not accepted; send application/json or application/toml")]
    UnsupportedMedia(String),
    /// No such route.
    #[error("no route {method} {path}; see GET /v1/openapi.json")]
    NoRoute {
        /// The method asked.
        method: String,
        /// The path asked.
        path: String,
    },
    /// The route exists but not with this method.
    #[error("{method} is not allowed on {path} (allowed: {allow})")]
    MethodNotAllowed {
        /// The method asked.
        method: String,
        /// The path asked.
        path: String,
        /// The methods it allows, as the `Allow` header lists them (RFC 9110 §15.5.6).
        allow: &'static str,
    },
    /// The view answered with an error, or no replica answered.
    #[error(transparent)]
    View(#[from] ClientError),
    /// This replica failed the request itself; answered with the status of its gRPC code.
    #[error(transparent)]
    ViewServer(#[from] ViewServerError),
    /// A node agent's address is not an endpoint, or no connection to it could be made.
    #[error("node agent {addr} unreachable")]
    AgentUnreachable {
        /// The agent's address.
        addr: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// A node agent answered with an error. Its status is held for its code, not as a source:
    /// the message says the status's message once.
    #[error("{addr}: {}", status.message())]
    AgentRefused {
        /// The agent's address.
        addr: String,
        /// Its answer.
        status: tonic::Status,
    },
    /// A node agent did not answer in time.
    #[error("{addr}: no answer within {} s", timeout.as_secs_f64())]
    AgentTimeout {
        /// The agent's address.
        addr: String,
        /// How long it had.
        timeout: std::time::Duration,
    },
    /// A write's outcome is unknown (e.g. the leader changed while it was in flight).
    #[error("{0}")]
    OutcomeUnknown(String),
    /// The submission's request id (Idempotency-Key) was used before with another spec.
    #[error("{0}")]
    RequestReused(String),
    /// The request took longer than the per-request timeout.
    #[error("no answer within {0} ms")]
    Timeout(u64),
    /// The request carries neither a client certificate nor a valid bearer token.
    #[error("{0}")]
    Unauthenticated(String),
    /// A fault of this server.
    #[error("{0}")]
    Internal(String),
}

/// The one mapping from gRPC status codes to HTTP statuses and error codes.
pub fn http_of_grpc(code: Code) -> (StatusCode, &'static str) {
    match code {
        Code::InvalidArgument | Code::OutOfRange => (StatusCode::BAD_REQUEST, "invalid_argument"),
        Code::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        Code::FailedPrecondition | Code::Aborted | Code::AlreadyExists => (StatusCode::CONFLICT, "conflict"),
        Code::Unavailable | Code::Cancelled => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "busy"),
        Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "forbidden"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
        Code::Unimplemented => (StatusCode::NOT_IMPLEMENTED, "not_implemented"),
        Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => (StatusCode::BAD_GATEWAY, "view_error"),
    }
}

impl ApiError {
    /// A bad query parameter or path segment, naming it.
    pub fn bad(code: &'static str, field: &str, message: impl Into<String>) -> ApiError {
        ApiError::BadInput {
            code,
            message: message.into(),
            at: Place { field: Some(field.to_string()), ..Place::default() },
        }
    }

    /// The HTTP status and stable code.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadInput { code, .. } => (StatusCode::BAD_REQUEST, code),
            ApiError::UnknownJob(_) => (StatusCode::NOT_FOUND, "unknown_job"),
            ApiError::UnknownServer(_) => (StatusCode::NOT_FOUND, "unknown_server"),
            ApiError::NoLogs(_) => (StatusCode::NOT_FOUND, "no_logs"),
            ApiError::WrongState(_) => (StatusCode::CONFLICT, "wrong_state"),
            ApiError::NeverFits(_) => (StatusCode::UNPROCESSABLE_ENTITY, "never_fits"),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            ApiError::UnsupportedMedia(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            ApiError::NoRoute { .. } => (StatusCode::NOT_FOUND, "no_such_route"),
            ApiError::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::View(ClientError::Status { status, .. }) => http_of_grpc(status.code()),
            ApiError::View(ClientError::Unavailable { .. }) => http_of_grpc(Code::Unavailable),
            ApiError::View(ClientError::NoAddress | ClientError::BadAddress(..)) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
            ApiError::ViewServer(e) => http_of_grpc(e.code()),
            ApiError::AgentUnreachable { .. } => http_of_grpc(Code::Unavailable),
            ApiError::AgentRefused { status, .. } => http_of_grpc(status.code()),
            ApiError::AgentTimeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            ApiError::OutcomeUnknown(_) => (StatusCode::SERVICE_UNAVAILABLE, "outcome_unknown"),
            ApiError::RequestReused(_) => (StatusCode::CONFLICT, "request_reused"),
            ApiError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            ApiError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// The JSON body of the answer.
    pub fn body(&self) -> ErrorBody {
        let (_, code) = self.status_and_code();
        let message = match self {
            // The replica's own words, without the client's address-and-code wrapping.
            ApiError::View(ClientError::Status { status, .. }) => status.message().to_string(),
            other => chain(other),
        };
        let at = match self {
            ApiError::BadInput { at, .. } => at.clone(),
            _ => Place::default(),
        };
        ErrorBody { code: code.to_string(), message, field: at.field, line: at.line, column: at.column }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status_and_code().0
    }

    fn error_response(&self) -> HttpResponse {
        let mut r = HttpResponse::build(self.status_code());
        if let ApiError::MethodNotAllowed { allow, .. } = self {
            r.insert_header((actix_web::http::header::ALLOW, *allow));
        }
        r.json(self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_map_to_http() {
        assert_eq!(http_of_grpc(Code::NotFound).0, StatusCode::NOT_FOUND);
        assert_eq!(http_of_grpc(Code::FailedPrecondition).0, StatusCode::CONFLICT);
        assert_eq!(http_of_grpc(Code::Unavailable).0, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn bodies_carry_the_place() {
        let e = ApiError::BadInput {
            code: "malformed_toml",
            message: "line 2 column 3: expected `=`".into(),
            at: Place { field: None, line: Some(2), column: Some(3) },
        };
        let b = e.body();
        assert_eq!((b.code.as_str(), b.line, b.column, b.field), ("malformed_toml", Some(2), Some(3), None));
        assert_eq!(ApiError::UnknownJob(7).body().code, "unknown_job");
    }

    #[test]
    fn view_server_errors_answer_with_the_status_of_their_grpc_code() {
        let e = ApiError::from(ViewServerError::Busy("request queue full".into()));
        assert_eq!(e.status_code(), StatusCode::TOO_MANY_REQUESTS);
        let e = ApiError::from(ViewServerError::Timeout { after_ms: 5000 });
        assert_eq!(e.status_code(), StatusCode::GATEWAY_TIMEOUT);
        let b = ApiError::from(ViewServerError::NotLeader { leader: 0, addr: None }).body();
        assert_eq!(b.code, "unavailable");
        assert!(b.message.contains("no leader is known yet"), "{}", b.message);
    }
}
