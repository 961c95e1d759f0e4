//! The HTTP/JSON API of a view replica (actix-web), started by [`crate::serve`] when the
//! config sets `http_listen`.
//!
//! Every handler is a client of the view's own gRPC API ([`ViewClient`]), pointed at this
//! replica first and then at the others, so a write reaches the leader wherever the HTTP call
//! lands and the HTTP layer holds no state of the view. gRPC work runs on the replica's tokio
//! runtime (tonic's types are http 1.x, actix-web's http 0.2: they meet only as Rust values
//! here, never as HTTP types); actix-web's worker threads only parse, wait and answer.
//!
//! | route | what |
//! |---|---|
//! | `GET /v1/status` | this replica's raft status, jobs by state, GPUs by use |
//! | `GET /v1/jobs`, `POST /v1/jobs` | every job; submit one (JSON or TOML) |
//! | `GET /v1/jobs/{id}`, `DELETE /v1/jobs/{id}` | one job with spec and tasks; cancel |
//! | `GET /v1/jobs/{id}/logs` | a member's stdout or stderr tail, from its node agent |
//! | `GET /v1/servers` | every server with its GPU bitmap |
//! | `GET /v1/openapi.json` | the OpenAPI 3.0 document of the above |
//! | `GET /metrics` | Prometheus text: replica, jobs, GPUs, HTTP requests and latency |
//!
//! Every error is `{"code": "snake_case", "message": "..."}` (plus `field` and `line` when the
//! input names them); [`http_of_grpc`] is the one place gRPC codes become HTTP statuses.

use crate::client::{ClientError, ViewClient};
use crate::error::ServeError;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, ResponseError, web};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_view::{Health, Job, JobSpec, JobState, SpecError, ViewSnapshot};
use thiserror::Error;
use tonic::Code;

/// Largest request body accepted, in bytes (a job spec is a few hundred).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Node agents asked at once for a finished job's log.
const AGENT_FANOUT: usize = 4;
/// Most node agents asked for one finished job's log.
const MAX_AGENTS_ASKED: usize = 1024;
/// How long one node agent may take to answer a log request.
const AGENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest log tail one request may ask for (the agents' own bound).
const MAX_TAIL_BYTES: u64 = 4 << 20;
/// actix-web worker threads: the handlers only wait on the replica, so few are enough.
const WORKERS: usize = 2;
/// Open HTTP connections per worker.
const MAX_CONNECTIONS_PER_WORKER: usize = 512;
/// Upper bounds (seconds) of the request latency histogram's buckets.
const LATENCY_BUCKETS_S: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
/// Every job state, in life order, for counts that list zeros too.
const JOB_STATES: [JobState; 6] =
    [JobState::Pending, JobState::Placed, JobState::Running, JobState::Migrating, JobState::Finished, JobState::Failed];

/// Settings of the HTTP API.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// This replica's id (metrics labels).
    pub replica: u64,
    /// View replicas' client addresses, this replica's first.
    pub view_addrs: Vec<String>,
    /// How long one HTTP request may take; the gRPC client gets a second less, so its own,
    /// more telling error usually comes first.
    pub request_timeout: Duration,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
}

/// Why an API request failed. Rendered as JSON `{"code", "message"}` with a fitting status.
#[derive(Debug, Error)]
pub enum ApiError {
    /// The request is malformed; `field` (and `line` in a TOML body) say where.
    #[error("{message}")]
    BadInput {
        /// Stable error code.
        code: &'static str,
        /// What is wrong.
        message: String,
        /// The field at fault, when known.
        field: Option<String>,
        /// The line of a TOML body at fault, when known.
        line: Option<u32>,
    },
    /// No job with this id in the view.
    #[error("unknown job {0}")]
    UnknownJob(u64),
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
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The method asked.
        method: String,
        /// The path asked.
        path: String,
    },
    /// The view answered with an error, or no replica answered.
    #[error(transparent)]
    View(#[from] ClientError),
    /// A write's outcome is unknown (e.g. the leader changed while it was in flight).
    #[error("{0}")]
    OutcomeUnknown(String),
    /// The request took longer than the per-request timeout.
    #[error("no answer within {0} ms")]
    Timeout(u64),
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
        Code::PermissionDenied | Code::Unauthenticated => (StatusCode::FORBIDDEN, "forbidden"),
        Code::Unimplemented => (StatusCode::NOT_IMPLEMENTED, "not_implemented"),
        Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => (StatusCode::BAD_GATEWAY, "view_error"),
    }
}

impl ApiError {
    fn bad(code: &'static str, field: &str, message: impl Into<String>) -> ApiError {
        ApiError::BadInput { code, message: message.into(), field: Some(field.to_string()), line: None }
    }

    /// The HTTP status and stable code.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadInput { code, .. } => (StatusCode::BAD_REQUEST, code),
            ApiError::UnknownJob(_) => (StatusCode::NOT_FOUND, "unknown_job"),
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
            ApiError::OutcomeUnknown(_) => (StatusCode::SERVICE_UNAVAILABLE, "outcome_unknown"),
            ApiError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status_and_code().0
    }

    fn error_response(&self) -> HttpResponse {
        let (status, code) = self.status_and_code();
        let message = match self {
            // The replica's own words, without the client's address-and-code wrapping.
            ApiError::View(ClientError::Status { status, .. }) => status.message().to_string(),
            other => other.to_string(),
        };
        let mut body = json!({ "code": code, "message": message });
        if let ApiError::BadInput { field, line, .. } = self {
            if let Some(f) = field {
                body["field"] = json!(f);
            }
            if let Some(l) = line {
                body["line"] = json!(l);
            }
        }
        HttpResponse::build(status).json(body)
    }
}

/// Request counts and latencies by route, for `/metrics`. Routes are the registered patterns
/// (or `unmatched`), methods a fixed list, so the label sets stay bounded.
#[derive(Debug, Default)]
struct HttpMetrics {
    inner: Mutex<MetricsInner>,
}

#[derive(Debug, Default)]
struct MetricsInner {
    /// (route, method, status) → requests.
    requests: BTreeMap<(String, &'static str, u16), u64>,
    /// route → latency histogram.
    latency: BTreeMap<String, Histogram>,
}

#[derive(Clone, Debug, Default)]
struct Histogram {
    /// Observations at or below each bound of [`LATENCY_BUCKETS_S`] (not cumulative).
    buckets: [u64; LATENCY_BUCKETS_S.len()],
    sum_s: f64,
    count: u64,
}

impl HttpMetrics {
    fn observe(&self, route: &str, method: &'static str, status: u16, elapsed: Duration) {
        let Ok(mut m) = self.inner.lock() else { return };
        *m.requests.entry((route.to_string(), method, status)).or_insert(0) += 1;
        let h = m.latency.entry(route.to_string()).or_default();
        let s = elapsed.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS_S.iter().position(|b| s <= *b) {
            h.buckets[i] += 1;
        }
        h.sum_s += s;
        h.count += 1;
    }

    fn render(&self, out: &mut String) {
        let Ok(m) = self.inner.lock() else { return };
        out.push_str("# HELP tessera_http_requests_total HTTP API requests by route, method and status.\n");
        out.push_str("# TYPE tessera_http_requests_total counter\n");
        for ((route, method, status), n) in &m.requests {
            let _ = writeln!(
                out,
                "tessera_http_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {n}",
                label(route)
            );
        }
        out.push_str("# HELP tessera_http_request_duration_seconds HTTP API request latency by route.\n");
        out.push_str("# TYPE tessera_http_request_duration_seconds histogram\n");
        for (route, h) in &m.latency {
            let route = label(route);
            let mut cumulative = 0;
            for (bound, n) in LATENCY_BUCKETS_S.iter().zip(h.buckets) {
                cumulative += n;
                let _ = writeln!(
                    out,
                    "tessera_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "tessera_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(out, "tessera_http_request_duration_seconds_sum{{route=\"{route}\"}} {}", h.sum_s);
            let _ = writeln!(out, "tessera_http_request_duration_seconds_count{{route=\"{route}\"}} {}", h.count);
        }
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn method_label(m: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// What every handler shares.
#[derive(Debug)]
struct Api {
    /// The template client: each request works on a clone and writes it back, so the leader
    /// it found and the connections it opened serve the next request.
    client: Mutex<ViewClient>,
    /// This replica's client address.
    own: String,
    replica: u64,
    /// The replica's tokio runtime, where every gRPC call runs.
    rt: tokio::runtime::Handle,
    timeout: Duration,
    max_body_bytes: usize,
    metrics: HttpMetrics,
}

impl Api {
    /// Runs `f` with a view client on the replica's runtime, bounded by the request timeout.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(ViewClient) -> Fut,
        Fut: Future<Output = (ViewClient, Result<T, ApiError>)> + Send + 'static,
    {
        let client = self.client.lock().map_err(|_| ApiError::Internal("client lock poisoned".into()))?.clone();
        let ms = self.timeout.as_millis() as u64;
        let work = tokio::time::timeout(self.timeout, f(client));
        match self.rt.spawn(work).await {
            Ok(Ok((client, r))) => {
                if let Ok(mut c) = self.client.lock() {
                    *c = client;
                }
                r
            }
            Ok(Err(_)) => Err(ApiError::Timeout(ms)),
            Err(e) => Err(ApiError::Internal(format!("request task failed: {e}"))),
        }
    }

    /// The whole view, from the replica calls currently go to (this one until a write found
    /// the leader).
    async fn snapshot(&self) -> Result<(ViewSnapshot, u64), ApiError> {
        let wire = self
            .call(|mut c| async move {
                let r = c.snapshot(false).await.map_err(ApiError::from);
                (c, r)
            })
            .await?;
        decode_snapshot(wire)
    }

    /// This replica's status and view (both from this replica, so they agree).
    async fn own_state(&self) -> Result<(v1::StatusResponse, ViewSnapshot), ApiError> {
        let own = self.own.clone();
        let (status, wire) = self
            .call(|mut c| async move {
                let r = async {
                    let s = c.status_of(&own).await?;
                    let v = c.snapshot_of(&own, false).await?;
                    Ok::<_, ClientError>((s, v))
                }
                .await
                .map_err(ApiError::from);
                (c, r)
            })
            .await?;
        Ok((status, decode_snapshot(wire)?.0))
    }
}

fn decode_snapshot(wire: v1::SnapshotResponse) -> Result<(ViewSnapshot, u64), ApiError> {
    let applied = wire.applied_index;
    let snap = wire.snapshot.ok_or_else(|| ApiError::Internal("the replica sent an empty snapshot".into()))?;
    let snap = ViewSnapshot::try_from(snap).map_err(|e| ApiError::Internal(format!("the replica's snapshot: {e}")))?;
    Ok((snap, applied))
}

/// Binds the HTTP API and runs it on the current tokio runtime until `stopping` turns true.
/// Answers the bound addresses.
pub fn start(
    listener: std::net::TcpListener,
    cfg: HttpConfig,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<SocketAddr>, ServeError> {
    let at = listener.local_addr().map_or_else(|_| "HTTP listener".to_string(), |a| a.to_string());
    let fail = |why: String| ServeError::Server { addr: at.clone(), why: format!("HTTP API: {why}") };
    let own = cfg.view_addrs.first().cloned().ok_or_else(|| fail("no view address".into()))?;
    let client_deadline = cfg.request_timeout.saturating_sub(Duration::from_secs(1)).max(Duration::from_millis(500));
    let client =
        ViewClient::new(cfg.view_addrs.clone()).map_err(|e| fail(e.to_string()))?.with_deadline(client_deadline);
    let api = web::Data::new(Api {
        client: Mutex::new(client),
        own,
        replica: cfg.replica,
        rt: tokio::runtime::Handle::current(),
        timeout: cfg.request_timeout,
        max_body_bytes: cfg.max_body_bytes,
        metrics: HttpMetrics::default(),
    });
    let server = HttpServer::new(move || {
        let api = api.clone();
        let metrics = api.clone();
        App::new()
            .app_data(api)
            .wrap_fn(move |req, srv| {
                use actix_web::dev::Service as _;
                let start = Instant::now();
                let method = method_label(req.method());
                let metrics = metrics.clone();
                let fut = srv.call(req);
                async move {
                    let res = fut.await?;
                    let route = res.request().match_pattern().unwrap_or_else(|| "unmatched".to_string());
                    metrics.metrics.observe(&route, method, res.status().as_u16(), start.elapsed());
                    Ok(res)
                }
            })
            .configure(routes)
            .default_service(web::to(no_route))
    })
    .workers(WORKERS)
    .max_connections(MAX_CONNECTIONS_PER_WORKER)
    .client_request_timeout(Duration::from_secs(5))
    .disable_signals()
    .shutdown_timeout(1)
    .shutdown_signal(async move {
        let _ = stopping.wait_for(|s| *s).await;
    })
    .listen(listener)
    .map_err(|e| fail(e.to_string()))?;
    let addrs = server.addrs();
    let run = server.run();
    tracing::info!(replica = cfg.replica, addrs = ?addrs, "HTTP API serving");
    tokio::spawn(async move {
        if let Err(e) = run.await {
            tracing::error!(error = %e, "HTTP API stopped");
        }
    });
    Ok(addrs)
}

/// Every route; the OpenAPI document lists the same (a test checks).
fn routes(cfg: &mut web::ServiceConfig) {
    let resource = |path: &str| web::resource(path.to_string()).default_service(web::to(not_allowed));
    cfg.service(resource("/v1/status").route(web::get().to(status)))
        .service(resource("/v1/jobs").route(web::get().to(list_jobs)).route(web::post().to(submit)))
        .service(resource("/v1/jobs/{id}").route(web::get().to(get_job)).route(web::delete().to(cancel)))
        .service(resource("/v1/jobs/{id}/logs").route(web::get().to(logs)))
        .service(resource("/v1/servers").route(web::get().to(servers)))
        .service(resource("/v1/openapi.json").route(web::get().to(openapi)))
        .service(resource("/metrics").route(web::get().to(metrics)));
}

async fn no_route(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NoRoute { method: req.method().to_string(), path: req.path().to_string() })
}

async fn not_allowed(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed { method: req.method().to_string(), path: req.path().to_string() })
}

fn job_id(raw: &str) -> Result<u64, ApiError> {
    raw.parse::<u64>().map_err(|_| ApiError::bad("bad_job_id", "id", format!("`{raw}` is not a job id")))
}

/// The query string as a map; every key must be one of `known`.
fn query(req: &HttpRequest, known: &[&str]) -> Result<HashMap<String, String>, ApiError> {
    let q = web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .map_err(|e| ApiError::bad("bad_query", "query", e.to_string()))?
        .into_inner();
    if let Some(k) = q.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ApiError::bad(
            "bad_query",
            k,
            format!("unknown query parameter `{k}`; known: {}", known.join(", ")),
        ));
    }
    Ok(q)
}

// ---- status, servers, jobs: read from the view ----

/// GPUs of the view by use: allocated, free (on up servers, healthy), unavailable (the rest).
fn gpu_counts(s: &ViewSnapshot) -> (u64, u64, u64, u64) {
    let (mut total, mut used, mut free) = (0u64, 0u64, 0u64);
    for (i, r) in s.servers.iter().enumerate() {
        let devices = server_topology(s, i).map_or(0, |t| t.devices);
        let all = tessera_view::mask::low_bits(devices);
        let bad = s.unhealthy.get(i).copied().unwrap_or(0);
        total += u64::from(devices);
        used += u64::from((all & !r.free_gpus).count_ones());
        if r.health == Health::Up {
            free += u64::from((all & r.free_gpus & !bad).count_ones());
        }
    }
    (total, used, free, total - used - free)
}

fn server_topology(s: &ViewSnapshot, server: usize) -> Option<&tessera_view::Topology> {
    let r = s.servers.get(server)?;
    let cs = s.config_sets.get(usize::from(r.config_set.0))?;
    s.topologies.get(usize::from(cs.topology))
}

fn jobs_by_state(s: &ViewSnapshot) -> BTreeMap<&'static str, u64> {
    let mut out: BTreeMap<&'static str, u64> = JOB_STATES.iter().map(|st| (st.as_str(), 0)).collect();
    for j in &s.jobs {
        *out.entry(j.state.as_str()).or_insert(0) += 1;
    }
    out
}

async fn status(api: web::Data<Api>) -> Result<HttpResponse, ApiError> {
    let (st, snap) = api.own_state().await?;
    let (total, used, free, unavailable) = gpu_counts(&snap);
    let mut health: BTreeMap<&str, u64> = [("up", 0), ("draining", 0), ("down", 0)].into_iter().collect();
    for r in &snap.servers {
        *health.entry(r.health.as_str()).or_insert(0) += 1;
    }
    Ok(HttpResponse::Ok().json(json!({
        "replica": st.replica,
        "cluster": st.cluster,
        "role": st.role,
        "leader": st.leader,
        "leader_addr": st.leader_addr,
        "term": st.term,
        "applied_index": st.applied_index,
        "version": st.version,
        "voters": st.voters,
        "log_entries": st.log_entries,
        "state_hash": format!("{:016x}", st.state_hash),
        "jobs": jobs_by_state(&snap),
        "gpus": { "total": total, "used": used, "free": free, "unavailable": unavailable },
        "servers": health,
    })))
}

fn indices(mask: u64) -> Vec<u32> {
    (0..64).filter(|i| mask >> i & 1 == 1).collect()
}

fn server_name(s: &ViewSnapshot, id: u32) -> String {
    s.server_names.get(id as usize).cloned().unwrap_or_else(|| format!("#{id}"))
}

fn job_json(j: &Job, s: &ViewSnapshot, detail: bool) -> Value {
    let spec = &j.spec;
    let members = j.placement.as_ref().map_or(&[][..], |p| p.members.as_slice());
    let (mut placement, mut tasks) = (Vec::with_capacity(members.len()), Vec::with_capacity(members.len()));
    for (rank, m) in members.iter().enumerate() {
        let server = server_name(s, m.server.0);
        let state = j.tasks.get(rank).map_or("starting", |t| t.as_str());
        tasks.push(json!({ "member": rank, "server": server, "state": state }));
        placement.push(json!({
            "member": rank,
            "server": server,
            "server_id": m.server.0,
            "gpus": indices(m.gpus),
            "cores": m.cores.indices().collect::<Vec<u32>>(),
            "memory_mib": m.memory_mib,
        }));
    }
    let mut v = json!({
        "id": j.id.0,
        "name": spec.name,
        "tenant": spec.tenant,
        "state": j.state.as_str(),
        "gpus": spec.total_gpus(),
        "members": spec.members,
        "gpus_per_member": spec.gpus_per_member,
        "gpu_type": spec.gpu_type,
        "scheduler": spec.scheduler,
        "priority": spec.priority,
        "submitted_at": j.submitted_at.0,
        "locality": j.placement.as_ref().map(|p| p.level.as_str()),
        "placement": placement,
        "error": j.error,
    });
    if detail {
        v["spec"] = serde_json::to_value(spec).unwrap_or(Value::Null);
        v["proposals"] = json!(j.proposals.iter().map(|p| p.0).collect::<Vec<u64>>());
        v["tasks"] = json!(tasks);
    }
    v
}

async fn list_jobs(api: web::Data<Api>) -> Result<HttpResponse, ApiError> {
    let (snap, applied) = api.snapshot().await?;
    let jobs: Vec<Value> = snap.jobs.iter().map(|j| job_json(j, &snap, false)).collect();
    Ok(HttpResponse::Ok().json(json!({ "version": snap.version.0, "applied_index": applied, "jobs": jobs })))
}

async fn get_job(api: web::Data<Api>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = job_id(&id)?;
    let (snap, _) = api.snapshot().await?;
    let j = snap.jobs.iter().find(|j| j.id.0 == id).ok_or(ApiError::UnknownJob(id))?;
    Ok(HttpResponse::Ok().json(job_json(j, &snap, true)))
}

/// A server's GPUs as one character each, device 0 first: `x` allocated, `.` free,
/// `!` unhealthy.
pub fn gpu_bitmap(devices: u32, free: u64, unhealthy: u64) -> String {
    (0..devices.min(64))
        .map(|i| {
            if unhealthy >> i & 1 == 1 {
                '!'
            } else if free >> i & 1 == 1 {
                '.'
            } else {
                'x'
            }
        })
        .collect()
}

async fn servers(api: web::Data<Api>) -> Result<HttpResponse, ApiError> {
    let (snap, _) = api.snapshot().await?;
    let list: Vec<Value> = snap
        .servers
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let topo = server_topology(&snap, i);
            let cs = snap.config_sets.get(usize::from(r.config_set.0));
            let devices = topo.map_or(0, |t| t.devices);
            let bad = snap.unhealthy.get(i).copied().unwrap_or(0);
            let free = r.free_gpus & tessera_view::mask::low_bits(devices);
            json!({
                "id": i,
                "name": snap.server_names.get(i),
                "health": r.health.as_str(),
                "device_type": topo.map(|t| t.device_type.as_str()),
                "topology": topo.map(|t| t.name.as_str()),
                "rack": cs.and_then(|c| snap.racks.get(c.rack as usize)),
                "ib_domain": cs.and_then(|c| snap.ib_domains.get(c.ib_domain as usize)),
                "gpus": devices,
                "gpus_free": (free & !bad).count_ones(),
                "gpu_bitmap": gpu_bitmap(devices, free, bad),
                "unhealthy_gpus": indices(bad),
                "cores_free": r.free_cores.count(),
                "cores": topo.map_or(0, |t| t.cores_per_socket * t.sockets.len() as u32),
                "memory_free_mib": r.free_memory_mib,
                "memory_mib": topo.map_or(0, |t| t.memory_mib),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "version": snap.version.0, "servers": list })))
}

// ---- writes ----

/// Reads the body up to the limit; a declared length over it is refused before reading.
async fn read_body(api: &Api, req: &HttpRequest, payload: web::Payload) -> Result<web::Bytes, ApiError> {
    let declared =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > api.max_body_bytes as u64) {
        return Err(ApiError::TooLarge(api.max_body_bytes));
    }
    let ms = api.timeout.as_millis() as u64;
    match tokio::time::timeout(api.timeout, payload.to_bytes_limited(api.max_body_bytes)).await {
        Err(_) => Err(ApiError::Timeout(ms)),
        Ok(Err(_)) => Err(ApiError::TooLarge(api.max_body_bytes)),
        Ok(Ok(Err(e))) => Err(ApiError::BadInput { code: "bad_body", message: e.to_string(), field: None, line: None }),
        Ok(Ok(Ok(b))) => Ok(b),
    }
}

/// The body's format, from its content type (JSON when none is given).
fn body_is_toml(req: &HttpRequest) -> Result<bool, ApiError> {
    let Some(ct) = req.headers().get(header::CONTENT_TYPE) else { return Ok(false) };
    let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
    let mime = ct.split(';').next().unwrap_or("").trim();
    match mime {
        "application/toml" | "text/toml" | "text/x-toml" => Ok(true),
        "application/json" | "" => Ok(false),
        other => Err(ApiError::UnsupportedMedia(other.to_string())),
    }
}

/// A job spec from a request body: TOML as in a job file, or JSON of the same shape (the JSON
/// is rewritten as TOML so both go through the one parser and its checks).
pub fn parse_spec(body: &[u8], toml_body: bool) -> Result<JobSpec, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| ApiError::BadInput {
        code: "bad_body",
        message: format!("not UTF-8: {e}"),
        field: None,
        line: None,
    })?;
    if toml_body {
        return JobSpec::from_toml("request body", text).map_err(|e| spec_error(e, text, true));
    }
    let json: Value = serde_json::from_str(text).map_err(|e| ApiError::BadInput {
        code: "malformed_json",
        message: format!("line {} column {}: {e}", e.line(), e.column()),
        field: None,
        line: Some(e.line() as u32),
    })?;
    if !json.is_object() {
        return Err(ApiError::BadInput {
            code: "malformed_json",
            message: "the body must be a JSON object (a job spec)".into(),
            field: None,
            line: None,
        });
    }
    let as_toml = toml::Value::try_from(without_nulls(json)).map_err(|e| ApiError::BadInput {
        code: "invalid_spec",
        message: e.to_string(),
        field: None,
        line: None,
    })?;
    let text = toml::to_string(&as_toml).map_err(|e| ApiError::BadInput {
        code: "invalid_spec",
        message: e.to_string(),
        field: None,
        line: None,
    })?;
    JobSpec::from_toml("request body", &text).map_err(|e| spec_error(e, &text, false))
}

/// JSON nulls mean "absent", which TOML cannot say otherwise.
fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, without_nulls(v))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// The last line of a TOML parser message: the reason, without the excerpt of the source.
fn without_location(message: &str) -> String {
    message.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(message).trim().to_string()
}

/// A spec error as a 400 naming the field and, when `lines_mean_something` (the sender wrote
/// the TOML, not our JSON rewrite), the line.
fn spec_error(e: SpecError, text: &str, lines_mean_something: bool) -> ApiError {
    let (message, field, line) = match e {
        SpecError::Invalid { file, field, message } => {
            let line = file.rsplit_once(':').and_then(|(_, l)| l.parse().ok());
            (format!("field `{field}`: {message}"), Some(field), line)
        }
        SpecError::Syntax { message, .. } => {
            let line = syntax_line(&message);
            // A missing field has no line of its own; anything else is named by its line.
            let field = if message.contains("missing field") {
                backticked_field(&message)
            } else {
                line.and_then(|l| key_at_line(text, l)).or_else(|| backticked_field(&message))
            };
            (without_location(&message), field, line)
        }
        SpecError::Io { .. } => return ApiError::Internal(e.to_string()),
    };
    let line = line.filter(|_| lines_mean_something);
    let message = match line {
        Some(l) => format!("line {l}: {message}"),
        None => message,
    };
    ApiError::BadInput { code: "invalid_spec", message, field, line }
}

/// `... at line 3, column 8 ...` → 3.
fn syntax_line(message: &str) -> Option<u32> {
    let rest = &message[message.find("line ")? + 5..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// ``unknown field `gpuz` `` or ``missing field `name` `` → the field.
fn backticked_field(message: &str) -> Option<String> {
    for lead in ["unknown field `", "missing field `", "duplicate key `"] {
        if let Some(i) = message.find(lead) {
            let rest = &message[i + lead.len()..];
            return rest.split('`').next().map(str::to_string);
        }
    }
    None
}

/// The dotted key written on `line` (1-based) of a TOML text, with its table's name.
fn key_at_line(text: &str, line: u32) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.get((line as usize).checked_sub(1)?)?;
    let key = at.split_once('=')?.0.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') {
        return None;
    }
    let table = lines[..line as usize - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('[') && !l.starts_with("[["))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_string(),
    })
}

async fn submit(api: web::Data<Api>, req: HttpRequest, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let toml_body = body_is_toml(&req)?;
    let body = read_body(&api, &req, payload).await?;
    let spec = parse_spec(&body, toml_body)?;
    let wire = v1::JobSpec::from(&spec);
    let results = api
        .call(|mut c| async move {
            let r = c.submit(vec![wire]).await.map_err(ApiError::from);
            (c, r)
        })
        .await?;
    let r = results.into_iter().next().ok_or_else(|| ApiError::Internal("the view answered no result".into()))?;
    if r.job == 0 || !r.error.is_empty() {
        // The service words refusals after the view's errors; sort them by those words.
        return Err(if r.error.starts_with("job can never fit") {
            ApiError::NeverFits(r.error)
        } else if r.error.starts_with("invalid job spec") {
            ApiError::BadInput { code: "invalid_spec", message: r.error, field: None, line: None }
        } else {
            ApiError::OutcomeUnknown(r.error)
        });
    }
    let location = HeaderValue::from_str(&format!("/v1/jobs/{}", r.job))
        .map_err(|e| ApiError::Internal(format!("location header: {e}")))?;
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, location))
        .json(json!({ "job": r.job, "name": spec.name })))
}

async fn cancel(api: web::Data<Api>, req: HttpRequest, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = job_id(&id)?;
    let q = query(&req, &["reason"])?;
    let reason = q.get("reason").cloned().unwrap_or_default();
    if reason.len() > 4096 {
        return Err(ApiError::bad("bad_query", "reason", format!("{} bytes; at most 4096", reason.len())));
    }
    let version = api
        .call(|mut c| async move {
            let r = c.cancel_because(id, &reason).await.map_err(ApiError::from);
            (c, r)
        })
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "job": id, "cancelled": true, "version": version })))
}

// ---- logs ----

async fn logs(api: web::Data<Api>, req: HttpRequest, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = job_id(&id)?;
    let q = query(&req, &["member", "stream", "tail_bytes"])?;
    let member: u32 = match q.get("member") {
        None => 0,
        Some(m) => {
            m.parse().map_err(|_| ApiError::bad("bad_query", "member", format!("`{m}` is not a member index")))?
        }
    };
    let stderr = match q.get("stream").map(String::as_str) {
        None | Some("stdout") => false,
        Some("stderr") => true,
        Some(s) => return Err(ApiError::bad("bad_query", "stream", format!("`{s}`: stdout or stderr"))),
    };
    let tail_bytes: u64 = match q.get("tail_bytes") {
        None => 0,
        Some(t) => match t.parse::<u64>() {
            Ok(n) if n <= MAX_TAIL_BYTES => n,
            _ => {
                return Err(ApiError::bad(
                    "bad_query",
                    "tail_bytes",
                    format!("`{t}`: a byte count up to {MAX_TAIL_BYTES}"),
                ));
            }
        },
    };
    let (snap, _) = api.snapshot().await?;
    let job = snap.jobs.iter().find(|j| j.id.0 == id).ok_or(ApiError::UnknownJob(id))?;
    if member >= job.spec.members {
        return Err(ApiError::bad(
            "bad_query",
            "member",
            format!("job {id} has {} members (0..{})", job.spec.members, job.spec.members),
        ));
    }
    let request = v1::LogsRequest { job: id, member, stderr, tail_bytes };
    let placed_on = job.placement.as_ref().and_then(|p| p.members.get(member as usize)).map(|m| m.server.0);
    if placed_on.is_none() && job.proposals.is_empty() {
        return Err(ApiError::WrongState(format!("job {id} is {} and has never been placed: no logs yet", job.state)));
    }
    let (server, answer) = match placed_on {
        Some(server) => {
            let answer = api
                .call(|mut c| async move {
                    let r = c.logs(server, request).await.map_err(ApiError::from);
                    (c, r)
                })
                .await?;
            (server, answer)
        }
        // Ended: the placement is gone, so the agent that ran the member is unknown; ask them all.
        None => {
            api.call(|mut c| async move {
                let r = match c.agents().await {
                    Ok(agents) => logs_from_any(agents, request).await,
                    Err(e) => Err(ApiError::from(e)),
                };
                (c, r)
            })
            .await?
        }
    };
    Ok(HttpResponse::Ok().json(json!({
        "job": id,
        "member": member,
        "stream": if stderr { "stderr" } else { "stdout" },
        "server": server_name(&snap, server),
        "path": answer.path,
        "size": answer.size,
        "truncated": answer.truncated,
        "data": String::from_utf8_lossy(&answer.data),
    })))
}

/// One agent's answer to a log request, bounded by [`AGENT_TIMEOUT`].
async fn agent_logs(addr: &str, req: v1::LogsRequest) -> Result<v1::LogsResponse, String> {
    let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("{addr}: {e}"))?
        .connect_timeout(AGENT_TIMEOUT)
        .timeout(AGENT_TIMEOUT);
    let work = async {
        let ch = ep.connect().await.map_err(|e| format!("{addr}: {e}"))?;
        v1::agent_client::AgentClient::new(ch)
            .max_decoding_message_size(8 << 20)
            .logs(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| format!("{addr}: {}", s.message()))
    };
    tokio::time::timeout(AGENT_TIMEOUT, work).await.map_err(|_| format!("{addr}: no answer within 2 s"))?
}

/// Asks the agents, [`AGENT_FANOUT`] at a time, for a log; the first that has it answers.
async fn logs_from_any(agents: Vec<v1::AgentInfo>, req: v1::LogsRequest) -> Result<(u32, v1::LogsResponse), ApiError> {
    let asked = agents.len().min(MAX_AGENTS_ASKED);
    let mut pending = agents.into_iter().take(MAX_AGENTS_ASKED);
    let mut running = tokio::task::JoinSet::new();
    let mut last = String::from("no node agent is known");
    loop {
        while running.len() < AGENT_FANOUT {
            let Some(a) = pending.next() else { break };
            running.spawn(async move { (a.server, agent_logs(&a.addr, req).await) });
        }
        match running.join_next().await {
            // Dropping the set aborts the asks still running.
            Some(Ok((server, Ok(r)))) => return Ok((server, r)),
            Some(Ok((_, Err(e)))) => last = e,
            Some(Err(e)) => last = format!("ask failed: {e}"),
            None => {
                return Err(ApiError::NoLogs(format!(
                    "no node agent has job {} member {} ({asked} asked; last answer: {last})",
                    req.job, req.member
                )));
            }
        }
    }
}

// ---- metrics and the document ----

async fn metrics(api: web::Data<Api>) -> HttpResponse {
    let mut out = String::new();
    let r = api.replica;
    match api.own_state().await {
        Ok((st, snap)) => {
            let _ = writeln!(out, "# HELP tessera_replica_up Whether this replica answered the scrape.");
            let _ = writeln!(out, "# TYPE tessera_replica_up gauge\ntessera_replica_up{{replica=\"{r}\"}} 1");
            let _ = writeln!(out, "# HELP tessera_replica_role The replica's raft role (1 for the current one).");
            let _ = writeln!(out, "# TYPE tessera_replica_role gauge");
            for role in ["leader", "follower", "candidate", "pre-candidate"] {
                let v = u8::from(st.role == role);
                let _ = writeln!(out, "tessera_replica_role{{replica=\"{r}\",role=\"{role}\"}} {v}");
            }
            for (name, help, v) in [
                ("tessera_replica_term", "The raft term.", st.term),
                ("tessera_replica_applied_index", "The raft index the view reflects.", st.applied_index),
                ("tessera_replica_leader", "The leader's replica id (0: none known).", st.leader),
                ("tessera_view_version", "The view version.", st.version),
            ] {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{replica=\"{r}\"}} {v}");
            }
            let _ = writeln!(out, "# HELP tessera_jobs Jobs the view holds, by state.\n# TYPE tessera_jobs gauge");
            for (state, n) in jobs_by_state(&snap) {
                let _ = writeln!(out, "tessera_jobs{{state=\"{state}\"}} {n}");
            }
            let (total, used, free, unavailable) = gpu_counts(&snap);
            let _ = writeln!(out, "# HELP tessera_gpus GPUs of the cluster by use.\n# TYPE tessera_gpus gauge");
            for (what, n) in [("total", total), ("used", used), ("free", free), ("unavailable", unavailable)] {
                let _ = writeln!(out, "tessera_gpus{{use=\"{what}\"}} {n}");
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "metrics: the replica did not answer");
            let _ = writeln!(out, "# HELP tessera_replica_up Whether this replica answered the scrape.");
            let _ = writeln!(out, "# TYPE tessera_replica_up gauge\ntessera_replica_up{{replica=\"{r}\"}} 0");
        }
    }
    api.metrics.render(&mut out);
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(out)
}

async fn openapi() -> HttpResponse {
    HttpResponse::Ok().json(openapi_document())
}

/// The OpenAPI 3.0 document of the API, served at `/v1/openapi.json`. Built in pieces: one
/// `json!` of the whole would pass the macro's recursion limit.
pub fn openapi_document() -> Value {
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Tessera view API",
            "version": "1",
            "description": "The cluster view of a Tessera GPU cluster over HTTP/JSON, served by every view replica; \
                writes reach the raft leader wherever they land. Errors are JSON objects with a stable `code` and a `message`."
        },
        "paths": openapi_paths(),
        "components": { "schemas": openapi_schemas() },
    })
}

fn openapi_paths() -> Value {
    let error = || json!({ "description": "error", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } });
    let ok = |schema: &str| json!({ "description": "OK", "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } });
    let id = json!({ "name": "id", "in": "path", "required": true, "schema": { "type": "integer", "format": "int64", "minimum": 1 } });
    let mut paths = serde_json::Map::new();
    paths.insert(
        "/v1/status".into(),
        json!({ "get": {
            "summary": "This replica's raft status, jobs by state and GPUs by use",
            "responses": { "200": ok("Status"), "503": error() }
        }}),
    );
    let created = json!({ "description": "admitted", "content": { "application/json": { "schema": {
        "type": "object", "properties": { "job": { "type": "integer" }, "name": { "type": "string" } }
    }}}});
    let body = json!({ "required": true, "content": {
        "application/json": { "schema": { "$ref": "#/components/schemas/JobSpec" } },
        "application/toml": { "schema": { "type": "string", "description": "a job file, as for `tessera submit`" } }
    }});
    paths.insert(
        "/v1/jobs".into(),
        json!({
            "get": { "summary": "Every job the view holds", "responses": { "200": ok("JobList"), "503": error() } },
            "post": {
                "summary": "Submit a job (JSON, or TOML with Content-Type application/toml)",
                "requestBody": body,
                "responses": {
                    "201": created, "400": error(), "413": error(), "415": error(),
                    "422": { "description": "the job can never fit this cluster (code `never_fits`)" }, "503": error()
                }
            }
        }),
    );
    paths.insert(
        "/v1/jobs/{id}".into(),
        json!({
            "get": {
                "summary": "One job, with its spec, proposals and per-member task states",
                "parameters": [id.clone()],
                "responses": { "200": ok("JobDetail"), "400": error(), "404": error() }
            },
            "delete": {
                "summary": "Cancel a job",
                "parameters": [id.clone(), { "name": "reason", "in": "query", "schema": { "type": "string", "maxLength": 4096 } }],
                "responses": { "200": { "description": "cancelled" }, "404": error(), "409": error() }
            }
        }),
    );
    let log_params = json!([
        id,
        { "name": "member", "in": "query", "schema": { "type": "integer", "default": 0 } },
        { "name": "stream", "in": "query", "schema": { "type": "string", "enum": ["stdout", "stderr"], "default": "stdout" } },
        { "name": "tail_bytes", "in": "query", "schema": { "type": "integer", "maximum": MAX_TAIL_BYTES, "description": "0: 64 KiB" } }
    ]);
    paths.insert(
        "/v1/jobs/{id}/logs".into(),
        json!({ "get": {
            "summary": "The tail of a member's stdout or stderr, from its node agent (every agent is asked once the job ended)",
            "parameters": log_params,
            "responses": { "200": ok("Logs"), "400": error(), "404": error(), "409": error(), "503": error() }
        }}),
    );
    paths.insert(
        "/v1/servers".into(),
        json!({ "get": {
            "summary": "Every server with its health and GPU bitmap (`x` used, `.` free, `!` unhealthy)",
            "responses": { "200": ok("ServerList"), "503": error() }
        }}),
    );
    paths.insert(
        "/v1/openapi.json".into(),
        json!({ "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3.0 document" } } } }),
    );
    paths.insert(
        "/metrics".into(),
        json!({ "get": {
            "summary": "Prometheus text format: replica role, term, applied index; jobs by state; GPUs by use; HTTP requests and latency",
            "responses": { "200": { "description": "metrics", "content": { "text/plain": { "schema": { "type": "string" } } } } }
        }}),
    );
    Value::Object(paths)
}

fn openapi_schemas() -> Value {
    let int = || json!({ "type": "integer" });
    let string = || json!({ "type": "string" });
    let ints = || json!({ "type": "array", "items": { "type": "integer" } });
    let mut s = serde_json::Map::new();
    s.insert(
        "Error".into(),
        json!({ "type": "object", "required": ["code", "message"], "properties": {
            "code": { "type": "string", "description": "stable snake_case code, e.g. `unknown_job`, `never_fits`, `invalid_spec`, `unavailable`" },
            "message": string(),
            "field": { "type": "string", "description": "the input field at fault" },
            "line": { "type": "integer", "description": "the line of a TOML or JSON body at fault" }
        }}),
    );
    s.insert(
        "Status".into(),
        json!({ "type": "object", "properties": {
            "replica": int(), "cluster": string(),
            "role": { "type": "string", "enum": ["leader", "follower", "candidate", "pre-candidate"] },
            "leader": int(), "leader_addr": string(), "term": int(), "applied_index": int(), "version": int(),
            "voters": ints(), "log_entries": int(), "state_hash": string(),
            "jobs": { "type": "object", "additionalProperties": int() },
            "gpus": { "type": "object", "properties": { "total": int(), "used": int(), "free": int(), "unavailable": int() } },
            "servers": { "type": "object", "additionalProperties": int() }
        }}),
    );
    let locality = json!({
        "prefer": { "$ref": "#/components/schemas/Locality" }, "tolerate": { "$ref": "#/components/schemas/Locality" },
        "relax_after_s": int(), "slowdown": { "type": "object", "additionalProperties": { "type": "number" } }
    });
    let cpu = json!({
        "cores_per_gpu": int(), "min_cores_per_gpu": int(),
        "predictor": { "type": "object", "properties": {
            "p0": { "type": "number" }, "p1": { "type": "number" }, "p2": { "type": "number" }, "theta": { "type": "number" }
        }}
    });
    s.insert(
        "JobSpec".into(),
        json!({ "type": "object", "required": ["name"], "description": "the fields of a job file", "properties": {
            "name": string(), "gpus": int(), "members": int(), "gpus_per_member": int(), "gpu_type": string(),
            "tenant": string(), "priority": int(), "memory_mib_per_gpu": int(),
            "command": { "type": "array", "items": string() }, "scheduler": string(),
            "locality": { "type": "object", "properties": locality },
            "cpu": { "type": "object", "properties": cpu }
        }}),
    );
    s.insert(
        "Locality".into(),
        json!({ "type": "string", "enum": ["pcie-switch", "socket", "server", "rack", "ib-domain", "any"] }),
    );
    s.insert(
        "Member".into(),
        json!({ "type": "object", "properties": {
            "member": int(), "server": string(), "server_id": int(), "gpus": ints(), "cores": ints(), "memory_mib": int()
        }}),
    );
    s.insert(
        "Job".into(),
        json!({ "type": "object", "properties": {
            "id": int(), "name": string(), "tenant": string(),
            "state": { "type": "string", "enum": ["pending", "placed", "running", "migrating", "finished", "failed"] },
            "gpus": int(), "members": int(), "gpus_per_member": int(),
            "gpu_type": { "type": "string", "nullable": true }, "scheduler": { "type": "string", "nullable": true },
            "priority": int(), "submitted_at": int(),
            "locality": { "nullable": true, "allOf": [{ "$ref": "#/components/schemas/Locality" }] },
            "placement": { "type": "array", "items": { "$ref": "#/components/schemas/Member" } },
            "error": { "type": "string", "nullable": true }
        }}),
    );
    let task = json!({ "type": "object", "properties": {
        "member": int(), "server": string(), "state": { "type": "string", "enum": ["starting", "running", "succeeded"] }
    }});
    s.insert(
        "JobDetail".into(),
        json!({ "allOf": [{ "$ref": "#/components/schemas/Job" }, { "type": "object", "properties": {
            "spec": { "type": "object", "description": "the validated spec as the view holds it" },
            "proposals": ints(),
            "tasks": { "type": "array", "items": task }
        }}]}),
    );
    s.insert(
        "JobList".into(),
        json!({ "type": "object", "properties": {
            "version": int(), "applied_index": int(), "jobs": { "type": "array", "items": { "$ref": "#/components/schemas/Job" } }
        }}),
    );
    s.insert(
        "Logs".into(),
        json!({ "type": "object", "properties": {
            "job": int(), "member": int(), "stream": string(), "server": string(), "path": string(), "size": int(),
            "truncated": { "type": "boolean" },
            "data": { "type": "string", "description": "the tail, as UTF-8 (invalid bytes replaced)" }
        }}),
    );
    s.insert(
        "Server".into(),
        json!({ "type": "object", "properties": {
            "id": int(), "name": string(), "health": { "type": "string", "enum": ["up", "draining", "down"] },
            "device_type": string(), "topology": string(), "rack": string(), "ib_domain": string(),
            "gpus": int(), "gpus_free": int(), "gpu_bitmap": { "type": "string", "example": "xx..xx.." },
            "unhealthy_gpus": ints(), "cores_free": int(), "cores": int(), "memory_free_mib": int(), "memory_mib": int()
        }}),
    );
    s.insert(
        "ServerList".into(),
        json!({ "type": "object", "properties": {
            "version": int(), "servers": { "type": "array", "items": { "$ref": "#/components/schemas/Server" } }
        }}),
    );
    Value::Object(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_marks_used_free_and_unhealthy() {
        assert_eq!(gpu_bitmap(8, 0b1100_1100, 0), "xx..xx..");
        assert_eq!(gpu_bitmap(4, 0b1111, 0b0010), ".!..");
    }

    #[test]
    fn toml_errors_name_line_and_field() {
        let text = "name = \"a\"\ngpus = 2\n[locality]\nprefer = \"socket\"\ntolerate = \"nowhere\"\n";
        match parse_spec(text.as_bytes(), true) {
            Err(ApiError::BadInput { field, line, .. }) => {
                assert_eq!(line, Some(5));
                assert_eq!(field.as_deref(), Some("locality.tolerate"));
            }
            other => panic!("expected a bad input, got {other:?}"),
        }
    }

    #[test]
    fn json_spec_takes_the_job_file_shape() {
        let spec = parse_spec(
            br#"{"name": "a", "gpus": 4, "members": 2, "locality": {"tolerate": "rack"}, "gpu_type": null}"#,
            false,
        )
        .expect("a valid JSON spec");
        assert_eq!((spec.members, spec.gpus_per_member), (2, 2));
        match parse_spec(br#"{"name": "a", "gpuz": 4}"#, false) {
            Err(ApiError::BadInput { field, .. }) => assert_eq!(field.as_deref(), Some("gpuz")),
            other => panic!("expected a bad input, got {other:?}"),
        }
    }

    #[test]
    fn grpc_codes_map_to_http() {
        assert_eq!(http_of_grpc(Code::NotFound).0, StatusCode::NOT_FOUND);
        assert_eq!(http_of_grpc(Code::FailedPrecondition).0, StatusCode::CONFLICT);
        assert_eq!(http_of_grpc(Code::Unavailable).0, StatusCode::SERVICE_UNAVAILABLE);
    }
}
