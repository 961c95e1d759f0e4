//! The HTTP/JSON API of a view replica (actix-web), started by [`crate::serve`] when the
//! config sets `http_listen`.
//!
//! Every handler is a client of the view's own gRPC API ([`ViewClient`]), pointed at this
//! replica first and then at the others, so a write reaches the leader wherever the HTTP call
//! lands and the HTTP layer holds no state of the view. gRPC work runs on the replica's tokio
//! runtime (tonic's types are http 1.x, actix-web's http 0.2: they meet only as Rust values
//! here, never as HTTP types); actix-web's worker threads only parse, wait and answer.
//!
//! | route | what | module |
//! |---|---|---|
//! | `GET /healthz`, `GET /readyz` | probes: the replica serves; it also knows a leader | [`probes`] |
//! | `GET /v1/status` | this replica's raft status, jobs by state, GPUs by use | [`servers`] |
//! | `GET /v1/servers` | every server with its GPU bitmap | [`servers`] |
//! | `GET /v1/servers/{name}` | one server with its cordon and health history | [`servers`] |
//! | `POST /v1/servers/{name}/cordon`, `…/drain`, `…/uncordon` | an operator's cordon, drain (with a deadline) or uncordon | [`servers`] |
//! | `POST /v1/servers`, `DELETE /v1/servers/{name}` | an operator adds servers to a configuration set, removes an empty server | [`layout`] |
//! | `GET /v1/config-sets`, `POST /v1/config-sets`, `DELETE /v1/config-sets/{id}` | the configuration sets; an operator adds or removes one | [`layout`] |
//! | `GET /v1/policy`; `PUT`, `DELETE` `/v1/policy/quotas/{tenant}`, `/v1/policy/classes/{class}` | tenants' GPU quotas (with what each holds) and priority classes; an admin changes them | [`policy`] |
//! | `GET /v1/jobs`, `POST /v1/jobs` | jobs (filtered by state, tenant, user; paged by id); submit one (JSON or TOML, parsed by [`spec`]) | [`jobs`] |
//! | `GET /v1/jobs/{id}`, `DELETE /v1/jobs/{id}` | one job (the `GetJob` RPC) with spec and tasks; cancel | [`jobs`] |
//! | `GET /v1/jobs/{id}/logs` | a member's stdout or stderr tail, from its node agent | [`logs`] |
//! | `GET /v1/usage` | GPU and CPU-core time over a range, by tenant, user or job | [`usage`] |
//! | `GET /v1/history` | ended jobs the view forgot, from the replica's history, in end order | [`history`] |
//! | `GET /v1/queue` | pending jobs in queue order, each with why it waits | [`queue`] |
//! | `GET /v1/replicas` | every replica's role, term, applied index and lag, as each answers | [`servers`] |
//! | `GET /v1/events` | Server-Sent Events: the view version, each time it changes | [`events`] |
//! | `GET /ui` (and `/`) | the web dashboard, one self-contained page | [`dashboard`] |
//! | `GET /v1/openapi.json` | the OpenAPI 3.1 document, derived from the types | [`openapi`] |
//! | `GET /metrics` | Prometheus text: replica, jobs, GPUs, HTTP requests and latency | [`metrics`] |
//!
//! With TLS (the replica's `tls` directory) the API is HTTPS, and every route but the probes,
//! `/metrics`, the OpenAPI document and the dashboard's page needs a caller: a client certificate of the cluster CA
//! or `Authorization: Bearer <token>` (`tessera token create`); without one the answer is 401.
//! The API calls the view *on behalf of* its caller (`tessera-on-behalf-of`, honoured from a
//! replica alone), so the view's rules ([`crate::authz`]) decide, and refusals are 403. Whole-
//! view reads (the job list, servers, status) are the replica's own, and a user sees only its
//! tenants' jobs in the list.
//!
//! The answers are the types of [`tessera_proto::api`], which the CLI's `--json` prints too.
//! Every error is an [`ErrorBody`](tessera_proto::api::ErrorBody) `{"code", "message"}` (plus
//! `field`, `line` and `column` when the input names them); [`error`] is the one place where
//! failures and gRPC codes become HTTP statuses.

pub mod dashboard;
pub mod error;
pub mod events;
pub mod history;
pub mod jobs;
pub mod layout;
pub mod logs;
pub mod metrics;
pub mod openapi;
pub mod policy;
pub mod probes;
pub mod queue;
pub mod servers;
pub mod spec;
pub mod usage;

pub use error::{ApiError, Place, http_of_grpc};
pub use openapi::openapi_document;
pub use spec::{BodyFormat, parse_spec};

use crate::client::{ClientError, ViewClient};
use crate::error::ViewServerError;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tessera_proto::tls::{CallerAuth, Identity, Security};
use tessera_proto::v1;
use tessera_view::ViewSnapshot;

tokio::task_local! {
    /// The authenticated caller of the request being handled (set around each handler).
    static CALLER: Identity;
}

/// The caller of the request being handled (the plaintext identity outside a request).
pub(crate) fn caller() -> Identity {
    CALLER.try_with(Identity::clone).unwrap_or_else(|_| tessera_proto::tls::insecure_identity())
}

/// A TLS connection's peer certificates, kept by the on-connect hook.
#[derive(Clone, Debug)]
struct PeerCerts(Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>);

/// Routes anyone may call: probes, metrics, the OpenAPI document, and the dashboard's page
/// (which holds no data: what it reads needs a caller).
fn open_route(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/v1/openapi.json" | "/" | "/ui")
}

/// Largest request body accepted, in bytes (a job spec is a few hundred).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// actix-web worker threads: the handlers only wait on the replica, so few are enough.
const WORKERS: usize = 2;
/// Open HTTP connections per worker.
const MAX_CONNECTIONS_PER_WORKER: usize = 512;

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
    /// HTTPS and authenticated callers, or plaintext.
    pub security: Security,
    /// The replica's applied view version, followed by `GET /v1/events` (none: the route
    /// answers 503).
    pub version: Option<tokio::sync::watch::Receiver<u64>>,
    /// What the replica's gRPC service answered to proposals (counted there, shown on
    /// `/metrics`).
    pub approvals: Arc<metrics::ApprovalMetrics>,
}

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct Api {
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
    metrics: metrics::HttpMetrics,
    /// The gRPC service's proposal counts, shared with it.
    approvals: Arc<metrics::ApprovalMetrics>,
    /// Server names by id (the cluster spec fixes them), read from a snapshot once.
    names: RwLock<Arc<Vec<String>>>,
    /// How callers are authenticated.
    security: Security,
    /// Every replica's client address, this one's first (`GET /v1/replicas`).
    view_addrs: Vec<String>,
    /// The applied view version (`GET /v1/events`).
    version: Option<tokio::sync::watch::Receiver<u64>>,
    /// Open event streams.
    event_streams: Arc<std::sync::atomic::AtomicUsize>,
}

/// How long `GET /v1/replicas` waits for each replica's status.
const REPLICA_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

impl Api {
    /// Runs `f` with a view client on the replica's runtime, bounded by the request timeout,
    /// on behalf of the request's caller.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(ViewClient) -> Fut,
        Fut: Future<Output = (ViewClient, Result<T, ApiError>)> + Send + 'static,
    {
        self.call_as(true, f).await
    }

    /// [`Api::call`] as this replica itself (`as_caller` false: whole-view reads, which the
    /// handler filters for its caller).
    async fn call_as<T, F, Fut>(&self, as_caller: bool, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(ViewClient) -> Fut,
        Fut: Future<Output = (ViewClient, Result<T, ApiError>)> + Send + 'static,
    {
        let mut client = self.client.lock().map_err(|_| ApiError::Internal("client lock poisoned".into()))?.clone();
        if as_caller && self.security.tls().is_some() {
            let who = caller();
            let auth = CallerAuth::new(None, Some(&who)).map_err(|e| ApiError::Internal(e.to_string()))?;
            client = client.with_auth(auth);
        }
        let ms = self.timeout.as_millis() as u64;
        let work = tokio::time::timeout(self.timeout, f(client));
        match self.rt.spawn(work).await {
            Ok(Ok((client, r))) => {
                if let Ok(mut c) = self.client.lock() {
                    *c = client.with_auth(CallerAuth::default());
                }
                r
            }
            Ok(Err(_)) => Err(ApiError::Timeout(ms)),
            Err(e) => Err(ApiError::Internal(format!("request task failed: {e}"))),
        }
    }

    /// The whole view, from the replica calls currently go to (this one until a write found
    /// the leader), with the raft index it reflects.
    async fn snapshot(&self) -> Result<(ViewSnapshot, u64), ApiError> {
        let wire = self
            .call_as(false, |mut c| async move {
                let r = c.snapshot(false).await.map_err(ApiError::from);
                (c, r)
            })
            .await?;
        let snap = decode_snapshot(wire)?;
        self.remember_names(&snap.0);
        Ok(snap)
    }

    /// This replica's raft status alone (the probes: no snapshot).
    async fn own_status(&self) -> Result<v1::StatusResponse, ApiError> {
        let own = self.own.clone();
        self.call_as(false, |mut c| async move {
            let r = c.status_of(&own).await.map_err(ApiError::from);
            (c, r)
        })
        .await
    }

    /// This replica's status and view (both from this replica, so they agree).
    async fn own_state(&self) -> Result<(v1::StatusResponse, ViewSnapshot), ApiError> {
        let own = self.own.clone();
        let (status, wire) = self
            .call_as(false, |mut c| async move {
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
        let (snap, _) = decode_snapshot(wire)?;
        self.remember_names(&snap);
        Ok((status, snap))
    }

    /// One job, by the `GetJob` RPC (not a whole snapshot), with why it waits while pending.
    async fn job(&self, id: u64) -> Result<(tessera_view::Job, Option<v1::JobWaiting>), ApiError> {
        let answer = self
            .call(move |mut c| async move {
                let r = match c.job(id, false).await {
                    Ok(a) => Ok(a),
                    Err(ClientError::Status { status, .. }) if status.code() == tonic::Code::NotFound => {
                        Err(ApiError::UnknownJob(id))
                    }
                    Err(e) => Err(ApiError::from(e)),
                };
                (c, r)
            })
            .await?;
        let wire = answer.job.ok_or_else(|| ApiError::Internal("the replica sent no job".into()))?;
        let job =
            tessera_view::Job::try_from(wire).map_err(|e| ApiError::Internal(format!("the replica's job: {e}")))?;
        Ok((job, answer.waiting))
    }

    /// Server names by id, covering `ids` (read from a snapshot when a name is not known yet).
    async fn names_for(&self, ids: impl Iterator<Item = u32>) -> Result<Arc<Vec<String>>, ApiError> {
        let known = self.names.read().map_err(|_| ApiError::Internal("names lock poisoned".into()))?.clone();
        let mut ids = ids;
        if ids.all(|id| (id as usize) < known.len()) {
            return Ok(known);
        }
        let (snap, _) = self.snapshot().await?;
        Ok(Arc::new(snap.server_names))
    }

    fn remember_names(&self, s: &ViewSnapshot) {
        if let Ok(mut names) = self.names.write()
            && names.len() < s.server_names.len()
        {
            *names = Arc::new(s.server_names.clone());
        }
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
) -> Result<Vec<SocketAddr>, ViewServerError> {
    let at = listener.local_addr().map_or_else(|_| "HTTP listener".to_string(), |a| a.to_string());
    let client_error = |e| ViewServerError::HttpClient { addr: at.clone(), source: Box::new(e) };
    let own = cfg.view_addrs.first().cloned().ok_or_else(|| client_error(ClientError::NoAddress))?;
    let client_deadline = cfg.request_timeout.saturating_sub(Duration::from_secs(1)).max(Duration::from_millis(500));
    let client = ViewClient::new(cfg.view_addrs.clone())
        .map_err(client_error)?
        .with_deadline(client_deadline)
        .with_security(cfg.security.clone());
    let tls_config = match cfg.security.tls() {
        Some(t) => Some(tessera_proto::tls::server::server_config(t, &[b"h2", b"http/1.1"])?),
        None => None,
    };
    let api = web::Data::new(Api {
        client: Mutex::new(client),
        own,
        replica: cfg.replica,
        rt: tokio::runtime::Handle::current(),
        timeout: cfg.request_timeout,
        max_body_bytes: cfg.max_body_bytes,
        metrics: metrics::HttpMetrics::new(),
        approvals: cfg.approvals.clone(),
        names: RwLock::new(Arc::new(Vec::new())),
        security: cfg.security.clone(),
        view_addrs: cfg.view_addrs.clone(),
        version: cfg.version.clone(),
        event_streams: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    });
    let server = HttpServer::new(move || {
        let api = api.clone();
        let observed = api.clone();
        let auth = api.clone();
        App::new()
            .app_data(api)
            .wrap_fn(move |req, srv| {
                use actix_web::dev::Service as _;
                // The caller, before any handler runs: 401 without a certificate or token.
                let who = if open_route(req.path()) {
                    Ok(tessera_proto::tls::insecure_identity())
                } else {
                    let certs = req.conn_data::<PeerCerts>().map(|c| c.0.as_slice());
                    let bearer = req.headers().get(tessera_proto::tls::AUTHORIZATION).and_then(|v| v.to_str().ok());
                    tessera_proto::tls::authenticate(&auth.security, certs, bearer, None, tessera_proto::tls::unix_s())
                        .map_err(|e| ApiError::Unauthenticated(e.to_string()))
                };
                let fut = who.as_ref().ok().map(|_| srv.call(req));
                async move {
                    match (who, fut) {
                        (Ok(who), Some(fut)) => CALLER.scope(who, fut).await,
                        (Err(e), _) => Err(e.into()),
                        (Ok(_), None) => Err(ApiError::Internal("no handler".into()).into()),
                    }
                }
            })
            .wrap_fn(move |req, srv| {
                use actix_web::dev::Service as _;
                let start = Instant::now();
                let method = metrics::method_label(req.method());
                let observed = observed.clone();
                let fut = srv.call(req);
                async move {
                    let res = fut.await?;
                    let route = res.request().match_pattern().unwrap_or_else(|| "unmatched".to_string());
                    observed.metrics.observe(&route, method, res.status().as_u16(), start.elapsed());
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
    .on_connect(|conn, ext| {
        type Tls = actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>;
        if let Some(tls) = conn.downcast_ref::<Tls>()
            && let Some(certs) = tls.get_ref().1.peer_certificates()
        {
            ext.insert(PeerCerts(certs.iter().map(|c| c.clone().into_owned()).collect()));
        }
    });
    let listen_error = |source| ViewServerError::Listen { addr: format!("{at} (HTTP API)"), source };
    let server = match tls_config {
        Some(c) => server.listen_rustls_0_23(listener, (*c).clone()).map_err(listen_error)?,
        None => server.listen(listener).map_err(listen_error)?,
    };
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
    // Each resource with the methods it allows, which a refused method's `Allow` header lists.
    let resource = |path: &str, allow: &'static str| {
        web::resource(path.to_string()).default_service(web::to(move |req: HttpRequest| not_allowed(req, allow)))
    };
    const GET: &str = "GET";
    cfg.service(resource("/", GET).route(web::get().to(dashboard::root)))
        .service(resource("/ui", GET).route(web::get().to(dashboard::page)))
        .service(resource("/healthz", GET).route(web::get().to(probes::healthz)))
        .service(resource("/readyz", GET).route(web::get().to(probes::readyz)))
        .service(resource("/v1/status", GET).route(web::get().to(servers::status)))
        .service(
            resource("/v1/jobs", "GET, POST").route(web::get().to(jobs::list_jobs)).route(web::post().to(jobs::submit)),
        )
        .service(
            resource("/v1/jobs/{id}", "GET, DELETE")
                .route(web::get().to(jobs::get_job))
                .route(web::delete().to(jobs::cancel)),
        )
        .service(resource("/v1/jobs/{id}/logs", GET).route(web::get().to(logs::logs)))
        .service(
            resource("/v1/servers", "GET, POST")
                .route(web::get().to(servers::servers))
                .route(web::post().to(layout::add_servers)),
        )
        .service(
            resource("/v1/servers/{name}", "GET, DELETE")
                .route(web::get().to(servers::server))
                .route(web::delete().to(layout::remove_server)),
        )
        .service(
            resource("/v1/config-sets", "GET, POST")
                .route(web::get().to(layout::config_sets))
                .route(web::post().to(layout::add_config_set)),
        )
        .service(resource("/v1/config-sets/{id}", "DELETE").route(web::delete().to(layout::remove_config_set)))
        .service(resource("/v1/servers/{name}/cordon", "POST").route(web::post().to(servers::cordon)))
        .service(resource("/v1/servers/{name}/drain", "POST").route(web::post().to(servers::drain)))
        .service(resource("/v1/servers/{name}/uncordon", "POST").route(web::post().to(servers::uncordon)))
        .service(resource("/v1/policy", GET).route(web::get().to(policy::policy)))
        .service(
            resource("/v1/policy/quotas/{tenant}", "PUT, DELETE")
                .route(web::put().to(policy::set_quota))
                .route(web::delete().to(policy::remove_quota)),
        )
        .service(
            resource("/v1/policy/quotas/{tenant}/classes/{class}", "PUT, DELETE")
                .route(web::put().to(policy::set_class_quota))
                .route(web::delete().to(policy::remove_class_quota)),
        )
        .service(
            resource("/v1/policy/classes/{class}", "PUT, DELETE")
                .route(web::put().to(policy::set_class))
                .route(web::delete().to(policy::remove_class)),
        )
        .service(
            resource("/v1/policy/revocations/{fingerprint}", "PUT, DELETE")
                .route(web::put().to(policy::revoke))
                .route(web::delete().to(policy::unrevoke)),
        )
        .service(resource("/v1/usage", GET).route(web::get().to(usage::usage)))
        .service(resource("/v1/history", GET).route(web::get().to(history::history)))
        .service(resource("/v1/queue", GET).route(web::get().to(queue::queue)))
        .service(resource("/v1/replicas", GET).route(web::get().to(servers::replicas)))
        .service(resource("/v1/events", GET).route(web::get().to(events::events)))
        .service(resource("/v1/openapi.json", GET).route(web::get().to(openapi::openapi)))
        .service(resource("/metrics", GET).route(web::get().to(metrics::metrics)));
}

async fn no_route(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NoRoute { method: req.method().to_string(), path: req.path().to_string() })
}

async fn not_allowed(req: HttpRequest, allow: &'static str) -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed { method: req.method().to_string(), path: req.path().to_string(), allow })
}

/// A job id from the path.
fn job_id(raw: &str) -> Result<u64, ApiError> {
    raw.parse::<u64>().map_err(|_| ApiError::bad("bad_job_id", "id", format!("`{raw}` is not a job id")))
}

/// The query string as a map; every key must be one of `known`.
/// A number parameter of a query (`None` when absent), or 400 `bad_query` naming it and
/// saying what it must be.
fn query_number<T: std::str::FromStr>(
    q: &HashMap<String, String>,
    key: &str,
    what: &str,
) -> Result<Option<T>, ApiError> {
    q.get(key)
        .map(|v| v.parse::<T>().map_err(|_| ApiError::bad("bad_query", key, format!("`{v}` is not {what}"))))
        .transpose()
}

/// The `tenants` parameter (comma-separated, at most [`MAX_USAGE_TENANTS`]) of the usage and
/// history reads; none: empty.
fn query_tenants(q: &HashMap<String, String>) -> Result<Vec<String>, ApiError> {
    let tenants: Vec<String> = q
        .get("tenants")
        .map(|t| t.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect())
        .unwrap_or_default();
    if tenants.len() > crate::usage::MAX_USAGE_TENANTS {
        let most = crate::usage::MAX_USAGE_TENANTS;
        return Err(ApiError::bad("bad_query", "tenants", format!("at most {most} tenants")));
    }
    Ok(tenants)
}

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
