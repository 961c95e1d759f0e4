//! # tessera-view-server: the cluster view as a replicated gRPC service
//!
//! One process per replica (`tessera view serve`): a [`tessera_replica::Replica`] driven by one
//! OS thread ([`node`]), the `View` gRPC service for schedulers, agents and operators
//! ([`service`]) and raft messages to and from peers over gRPC ([`transport`]). The
//! leader-following client lives in `tessera-proto` (re-exported here as [`client`]) so that
//! the SDK and the agents need no RocksDB.
//!
//! | module | what it holds |
//! |---|---|
//! | [`adoption`] | scheduler hosts' leases on pending jobs (leader memory) |
//! | [`authz`] | who may do what (one pure rule function) and the audit log of refusals and admin actions |
//! | [`config`] | [`ServeConfig`] (a value), [`ServeFile`] (the TOML file), [`Listeners`] (bound sockets) |
//! | [`node`] | the driver thread: requests in, ready rounds (persist, apply, send), answers out; leases |
//! | [`service`] | the `View` service: request checks, conversions, leader hints |
//! | [`transport`] | per-peer raft streams and the `Raft` service |
//! | [`usage`], [`history`] | the `Usage` and `History` reads: requests checked and bounded into queries |
//! | [`watchers`] | open `Watch` streams, bounded per replica and per caller |
//! | [`http`] | the HTTP/JSON API (actix-web) over the view client, OpenAPI document, metrics |
//! | [`error`] | [`ViewServerError`], the crate's one error type, and its gRPC status |

pub mod adoption;
pub mod authz;
pub mod config;
pub mod error;
pub mod history;
pub mod http;
pub mod node;
pub mod service;
pub mod transport;
pub mod usage;
pub mod watchers;

pub use config::{ListenAddrs, Listeners, ServeConfig, ServeFile, Tuning};
pub use error::{LEADER_KEY, ViewServerError};
pub use tessera_proto::client::{self, ClientError, ViewClient};

use node::{Driver, DriverConfig, PeerSenders};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tessera_proto::tls::Security;
use tessera_proto::v1;
use tessera_replica::{Replica, ReplicaConfig};
use tessera_view::ClusterView;

/// The identity replicas agree on: the cluster's name and the hash of the view it starts from
/// ([`ClusterView::identity_hash`]), so replicas started from different cluster specs refuse
/// each other (and each other's data directories) instead of diverging. Servers and
/// configuration sets added or removed at run time do not change it: the spec file stays the
/// cluster's starting point, given unchanged to every replica, new ones included.
pub fn cluster_identity(name: &str, initial: &ClusterView) -> String {
    format!("{name}@{:016x}", initial.identity_hash())
}

/// Runs one replica on sockets its caller bound, until `shutdown` resolves or the replica
/// fails. Raft gets its own port when `listeners.raft` is given; the HTTP API is served when
/// `listeners.http` is.
pub async fn serve(
    listeners: Listeners,
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ViewServerError> {
    let listen = listeners.addrs()?;
    let raft_port = listen.raft.is_some();
    cfg.validate(raft_port)?;
    let security = Security::from_flags(cfg.tls.clone(), cfg.insecure, "view replica")?;
    let server_tls = match security.tls() {
        Some(t) => Some(tessera_proto::tls::server::server_config(t, &[b"h2"])?),
        None => None,
    };
    if let Some(id) = security.tls().and_then(|t| t.current().identity.clone())
        && id.role != tessera_proto::tls::Role::Replica
    {
        return Err(tessera_proto::tls::TlsError::Config(format!(
            "the certificate in {} is for {id}, not a replica",
            cfg.tls.as_deref().unwrap_or(std::path::Path::new("?")).display()
        ))
        .into());
    }
    let t = cfg.tuning.clone();
    let initial = ClusterView::from_spec(&cfg.spec);
    let identity = cluster_identity(&cfg.cluster, &initial);
    let mut peers = cfg.peer_map(raft_port)?;
    let me = if raft_port {
        format!("{} {}", cfg.advertised(&listen), cfg.raft_advertised(&listen))
    } else {
        cfg.advertised(&listen)
    };
    peers.insert(cfg.id, me);
    let voters: Vec<u64> = if cfg.join { Vec::new() } else { peers.keys().copied().collect() };
    let replica_cfg = ReplicaConfig {
        id: cfg.id,
        peers: voters,
        cluster: identity.clone(),
        election_tick: t.election_tick,
        heartbeat_tick: t.heartbeat_tick,
        sync: t.sync,
        snapshot_every: t.snapshot_every,
        keep_entries: t.keep_entries,
        max_in_flight: t.max_in_flight,
        max_batch: t.max_batch,
        change_log: tessera_view::view::DEFAULT_CHANGE_LOG,
        election_seed: None,
    };
    std::fs::create_dir_all(&cfg.data_dir)
        .map_err(|source| ViewServerError::DataDir { dir: cfg.data_dir.clone(), source })?;
    let replica = Replica::open(replica_cfg, &cfg.data_dir, move || initial)?;
    let senders: PeerSenders = Arc::new(RwLock::new(HashMap::new()));
    let driver_cfg = DriverConfig {
        tick: Duration::from_millis(t.tick_ms),
        timeout: Duration::from_millis(t.request_timeout_ms),
        lease: Duration::from_millis(t.server_lease_ms),
        scheduler_lease: Duration::from_millis(t.scheduler_lease_ms),
        queue: 65_536,
        peer_queue: 8_192,
        election: Duration::from_millis(t.tick_ms * 2 * t.election_tick as u64),
    };
    // Peer tasks are spawned from the driver thread through the runtime handle.
    let rt = tokio::runtime::Handle::current();
    let (spawn_tx, mut spawn_rx) = tokio::sync::mpsc::unbounded_channel::<(u64, String)>();
    let (mut driver, handle) = Driver::new(
        replica,
        driver_cfg.clone(),
        peers,
        senders.clone(),
        Box::new(move |id, addr| {
            let _ = spawn_tx.send((id, addr));
        }),
    );
    {
        let senders = senders.clone();
        let handle = handle.clone();
        let identity = identity.clone();
        let me = cfg.id;
        let security = security.clone();
        rt.spawn(async move {
            let mut tasks: HashMap<u64, tokio::task::JoinHandle<()>> = HashMap::new();
            while let Some((id, addr)) = spawn_rx.recv().await {
                let (tx, rx) = tokio::sync::mpsc::channel(driver_cfg.peer_queue);
                if let Ok(mut s) = senders.write() {
                    s.insert(id, tx);
                }
                if let Some(old) = tasks.remove(&id) {
                    old.abort();
                }
                tracing::info!(replica = me, peer = id, addr, "raft transport to peer");
                let t = tokio::spawn(transport::run_peer(
                    identity.clone(),
                    me,
                    id,
                    addr,
                    rx,
                    handle.clone(),
                    security.clone(),
                ));
                tasks.insert(id, t);
            }
        });
    }
    if let Some(tls) = security.tls().cloned() {
        // Every authentication of this replica (gRPC, raft, the HTTP API) refuses what the view
        // revokes from the round that applied it (`tessera_view::revocation`).
        driver.set_revocation_sink(Box::new(move |changed, fps| {
            tls.set_view_revoked(changed, fps);
        }));
    }
    let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<tessera_replica::ReplicaError>();
    let stop_driver = driver.stopper();
    // Dropped by the thread when it ends, however it ends: what `DriverThread` waits for.
    let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(format!("replica-{}", cfg.id))
        .spawn(move || {
            // Dropped last, after `run` has dropped the driver and closed its RocksDB.
            let _ended = ended_tx;
            // A panic drops `fail_tx` unsent, which the server also treats as a failure.
            if let Err(e) = driver.run() {
                tracing::error!(error = %error::chain(&e), "replica failed");
                let _ = fail_tx.send(e);
            }
        })
        .map_err(|source| ViewServerError::DriverThread { replica: cfg.id, source })?;
    let mut driver_thread = DriverThread { replica: cfg.id, stop: stop_driver, ended, thread: Some(thread) };

    let audit = Arc::new(authz::AuditLog::new(cfg.data_dir.join("audit.jsonl")));
    let approvals = Arc::new(http::metrics::ApprovalMetrics::new());
    let view = service::ViewService {
        approvals: approvals.clone(),
        node: handle.clone(),
        cluster: identity.clone(),
        watchers: watchers::Watchers::new(t.max_watchers, t.max_watchers_per_caller),
        security: security.clone(),
        audit: audit.clone(),
        limiter: Arc::new(std::sync::Mutex::new(authz::RateLimiter::new(t.caller_rate))),
    };
    let raft = transport::RaftService {
        cluster: identity.clone(),
        id: cfg.id,
        node: handle.clone(),
        security: security.clone(),
        audit,
    };
    // Accepted connections get TCP_NODELAY: without it, small raft and client messages wait
    // for delayed acknowledgements (tens of milliseconds).
    let incoming = |l: std::net::TcpListener, addr: SocketAddr| {
        let listen_error = |source| ViewServerError::Listen { addr: addr.to_string(), source };
        l.set_nonblocking(true).map_err(listen_error)?;
        let l = tokio::net::TcpListener::from_std(l).map_err(listen_error)?;
        Ok::<_, ViewServerError>(Incoming::new(l, server_tls.clone()))
    };
    let client_incoming = incoming(listeners.client, listen.client)?;
    tracing::info!(replica = cfg.id, addr = %listen.client, cluster = %identity, "serving");
    let failure = Arc::new(std::sync::Mutex::new(None::<ViewServerError>));
    let failure_seen = failure.clone();
    // Set once shutdown begins; every listener and the grace timer watch it.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let until_stopping = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    if let Some(http_listener) = listeners.http {
        // This replica first, then the others: reads stay local, writes follow the leader.
        let mut view_addrs = vec![cfg.advertised(&listen)];
        if let Ok(a) = handle.addrs.read() {
            let others = a.iter().filter(|(id, _)| **id != cfg.id);
            view_addrs.extend(others.map(|(_, r)| config::split_addr(r).0.to_string()));
        }
        let http_cfg = http::HttpConfig {
            replica: cfg.id,
            security: security.clone(),
            view_addrs,
            request_timeout: Duration::from_millis(t.request_timeout_ms) + Duration::from_secs(2),
            max_body_bytes: http::MAX_BODY_BYTES,
            version: Some(handle.version.clone()),
            approvals,
        };
        http::start(http_listener, http_cfg, stopping.clone())?;
    }
    let replica = cfg.id;
    let stop = async move {
        tokio::select! {
            () = shutdown => {}
            r = fail_rx => {
                let e = match r {
                    Ok(e) => ViewServerError::ReplicaFailed { replica, source: Box::new(e) },
                    Err(_) => ViewServerError::DriverPanicked { replica },
                };
                tracing::error!(error = %error::chain(&e), "stopping");
                if let Ok(mut f) = failure_seen.lock() {
                    *f = Some(e);
                }
            }
        }
        let _ = stopping_tx.send(true);
    };
    let view_server = v1::view_server::ViewServer::new(view)
        .max_decoding_message_size(t.max_request_bytes)
        .max_encoding_message_size(usize::MAX);
    let raft_server = v1::raft_server::RaftServer::new(raft)
        .max_decoding_message_size(transport::MAX_RAFT_BYTES)
        .max_encoding_message_size(transport::MAX_RAFT_BYTES);
    let server_err = |addr: String| move |source| ViewServerError::Serve { addr, source };
    let server: std::pin::Pin<Box<dyn Future<Output = Result<(), ViewServerError>> + Send>> =
        match (listeners.raft, listen.raft) {
            // Raft on its own port: the client port carries only the View service.
            (Some(raft_listener), Some(raft_addr)) => {
                let raft = incoming(raft_listener, raft_addr)?.serve(
                    tonic::transport::Server::builder().add_service(raft_server),
                    until_stopping(stopping.clone()),
                );
                let client = client_incoming.serve(tonic::transport::Server::builder().add_service(view_server), stop);
                let (a, b) = (listen.client.to_string(), raft_addr.to_string());
                tracing::info!(replica = cfg.id, raft = %raft_addr, "raft on its own port");
                Box::pin(async move {
                    tokio::select! {
                        r = client => r.map_err(server_err(a)),
                        r = raft => r.map_err(server_err(b)),
                    }
                })
            }
            _ => {
                let a = listen.client.to_string();
                let both = client_incoming
                    .serve(tonic::transport::Server::builder().add_service(view_server).add_service(raft_server), stop);
                Box::pin(async move { both.await.map_err(server_err(a)) })
            }
        };
    // Graceful shutdown waits for open streams (peers' raft streams, watchers) to end: give
    // them a moment, then stop anyway. Every raft write is already durable.
    let grace = {
        let stopped = until_stopping(stopping.clone());
        async move {
            stopped.await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    tokio::select! {
        r = server => r?,
        () = grace => tracing::info!("open streams did not close within 1 s; stopping"),
    }
    // Stop the driver and wait for it, so RocksDB is closed before the process may exit. Off
    // the runtime's threads: the wait blocks.
    let _ = tokio::task::spawn_blocking(move || driver_thread.stop_and_wait()).await;
    if let Some(e) = failure.lock().ok().and_then(|mut f| f.take()) {
        return Err(e);
    }
    Ok(())
}

/// How long stopping waits for the driver thread to end (it checks its stop flag every tick).
const DRIVER_STOP_WAIT: Duration = Duration::from_secs(5);

/// The replica's driver thread, which owns its RocksDB. Stopping it waits for the thread to end,
/// so the database is closed before the process may exit: a process that exits under a live
/// RocksDB can abort in its static destructors ("pthread lock: Invalid argument", SIGABRT).
/// Dropping it stops it too, so the wait also happens when [`serve`]'s future is dropped before
/// it ends (a runtime shut down under it, as at the end of a test that dropped its cluster).
struct DriverThread {
    replica: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Disconnected once the thread has ended.
    ended: std::sync::mpsc::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DriverThread {
    /// Stops the driver and waits for its thread, at most [`DRIVER_STOP_WAIT`]; a thread still
    /// running then is left to the process (logged).
    fn stop_and_wait(&mut self) {
        let Some(thread) = self.thread.take() else { return };
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.ended.recv_timeout(DRIVER_STOP_WAIT) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!(replica = self.replica, wait_s = DRIVER_STOP_WAIT.as_secs(), "the driver did not stop");
            }
            // The thread has ended (nothing is ever sent): its join returns at once.
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for DriverThread {
    fn drop(&mut self) {
        self.stop_and_wait();
    }
}

/// A listener's connections: plain TCP, or TLS after a finished handshake.
enum Incoming {
    Plain(tokio::net::TcpListener),
    Tls(tokio::net::TcpListener, Arc<tokio_rustls::rustls::ServerConfig>),
}

type ServeFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

impl Incoming {
    fn new(l: tokio::net::TcpListener, tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>) -> Incoming {
        match tls {
            Some(c) => Incoming::Tls(l, c),
            None => Incoming::Plain(l),
        }
    }

    /// Serves `router` on these connections until `signal`.
    fn serve(
        self,
        router: tonic::transport::server::Router,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> ServeFuture {
        match self {
            Incoming::Plain(l) => Box::pin(router.serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true)),
                signal,
            )),
            Incoming::Tls(l, c) => {
                Box::pin(router.serve_with_incoming_shutdown(tessera_proto::tls::server::incoming(l, c), signal))
            }
        }
    }
}
