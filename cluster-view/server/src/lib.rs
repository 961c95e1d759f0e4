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
//! | [`config`] | [`ServeConfig`]: the TOML file and its defaults |
//! | [`node`] | the driver thread: requests in, ready rounds (persist, apply, send), answers out; leases |
//! | [`service`] | the `View` service: request checks, conversions, leader hints |
//! | [`transport`] | per-peer raft streams and the `Raft` service |
//! | [`http`] | the HTTP/JSON API (actix-web) over the view client, OpenAPI document, metrics |
//! | [`error`] | [`NodeError`] (→ gRPC status), [`ServeError`] |

pub mod adoption;
pub mod config;
pub mod error;
pub mod http;
pub mod node;
pub mod service;
pub mod transport;

pub use config::ServeConfig;
pub use error::{LEADER_KEY, NodeError, ServeError};
pub use tessera_proto::client::{self, ClientError, ViewClient};

use node::{Driver, DriverConfig, PeerSenders};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tessera_proto::v1;
use tessera_replica::{Replica, ReplicaConfig};
use tessera_view::{ClusterSpec, ClusterView};

/// The identity replicas agree on: the cluster's name and the hash of the view it starts from,
/// so replicas started from different cluster specs refuse each other (and each other's data
/// directories) instead of diverging.
pub fn cluster_identity(name: &str, initial: &ClusterView) -> String {
    format!("{name}@{:016x}", initial.state_hash())
}

/// Runs one replica until `shutdown` resolves or the replica fails.
pub async fn serve(cfg: ServeConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServeError> {
    cfg.validate()?;
    let spec = ClusterSpec::from_file(&cfg.cluster_spec)
        .map_err(|e| ServeError::Config { file: cfg.cluster_spec.display().to_string(), message: e.to_string() })?;
    let initial = ClusterView::from_spec(&spec);
    let identity = cluster_identity(&cfg.cluster, &initial);
    let mut peers = cfg.peer_map()?;
    let me = if cfg.raft_listen.is_some() {
        format!("{} {}", cfg.advertised(), cfg.raft_advertised())
    } else {
        cfg.advertised()
    };
    peers.insert(cfg.id, me);
    let voters: Vec<u64> = if cfg.join { Vec::new() } else { peers.keys().copied().collect() };
    let rcfg = ReplicaConfig {
        id: cfg.id,
        peers: voters,
        cluster: identity.clone(),
        election_tick: cfg.election_tick,
        heartbeat_tick: cfg.heartbeat_tick,
        sync: cfg.sync,
        snapshot_every: cfg.snapshot_every,
        keep_entries: cfg.keep_entries,
        max_in_flight: cfg.max_in_flight,
        max_batch: cfg.max_batch,
        change_log: tessera_view::view::DEFAULT_CHANGE_LOG,
        election_seed: None,
    };
    std::fs::create_dir_all(&cfg.data_dir).map_err(|e| ServeError::Config {
        file: cfg.data_dir.display().to_string(),
        message: format!("cannot create the data directory: {e}"),
    })?;
    let replica = Replica::open(rcfg, &cfg.data_dir, move || initial)?;
    let senders: PeerSenders = Arc::new(RwLock::new(HashMap::new()));
    let dcfg = DriverConfig {
        tick: Duration::from_millis(cfg.tick_ms),
        timeout: Duration::from_millis(cfg.request_timeout_ms),
        lease: Duration::from_millis(cfg.server_lease_ms),
        scheduler_lease: Duration::from_millis(cfg.scheduler_lease_ms),
        queue: 65_536,
        peer_queue: 8_192,
    };
    // Peer tasks are spawned from the driver thread through the runtime handle.
    let rt = tokio::runtime::Handle::current();
    let (spawn_tx, mut spawn_rx) = tokio::sync::mpsc::unbounded_channel::<(u64, String)>();
    let (driver, handle) = Driver::new(
        replica,
        dcfg.clone(),
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
        rt.spawn(async move {
            let mut tasks: HashMap<u64, tokio::task::JoinHandle<()>> = HashMap::new();
            while let Some((id, addr)) = spawn_rx.recv().await {
                let (tx, rx) = tokio::sync::mpsc::channel(dcfg.peer_queue);
                if let Ok(mut s) = senders.write() {
                    s.insert(id, tx);
                }
                if let Some(old) = tasks.remove(&id) {
                    old.abort();
                }
                tracing::info!(replica = me, peer = id, addr, "raft transport to peer");
                let t = tokio::spawn(transport::run_peer(identity.clone(), me, id, addr, rx, handle.clone()));
                tasks.insert(id, t);
            }
        });
    }
    let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<String>();
    let stop_driver = driver.stopper();
    let driver_thread = std::thread::Builder::new()
        .name(format!("replica-{}", cfg.id))
        .spawn(move || {
            // A panic drops `fail_tx` unsent, which the server also treats as a failure.
            if let Err(e) = driver.run() {
                tracing::error!(error = %e, "replica failed");
                let _ = fail_tx.send(e.to_string());
            }
        })
        .map_err(|e| ServeError::Server {
            addr: cfg.listen.to_string(),
            why: format!("cannot start the driver: {e}"),
        })?;

    let view = service::ViewService {
        node: handle.clone(),
        cluster: identity.clone(),
        watchers: Arc::new(AtomicUsize::new(0)),
        max_watchers: cfg.max_watchers,
    };
    let raft = transport::RaftService { cluster: identity.clone(), id: cfg.id, node: handle.clone() };
    // Accepted connections get TCP_NODELAY: without it, small raft and client messages wait
    // for delayed acknowledgements (tens of milliseconds).
    let incoming = tonic::transport::server::TcpIncoming::bind(cfg.listen)
        .map_err(|e| ServeError::Server { addr: cfg.listen.to_string(), why: e.to_string() })?
        .with_nodelay(Some(true));
    tracing::info!(replica = cfg.id, addr = %cfg.listen, cluster = %identity, "serving");
    let failed = Arc::new(std::sync::Mutex::new(None::<String>));
    let failed2 = failed.clone();
    // Set once shutdown begins; every listener and the grace timer watch it.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    if let Some(listen) = cfg.http_listen.clone() {
        // This replica first, then the others: reads stay local, writes follow the leader.
        let mut view_addrs = vec![cfg.advertised()];
        if let Ok(a) = handle.addrs.read() {
            let others = a.iter().filter(|(id, _)| **id != cfg.id);
            view_addrs.extend(others.map(|(_, r)| config::split_addr(r).0.to_string()));
        }
        let hcfg = http::HttpConfig {
            listen,
            replica: cfg.id,
            view_addrs,
            request_timeout: Duration::from_millis(cfg.request_timeout_ms) + Duration::from_secs(2),
            max_body_bytes: http::MAX_BODY_BYTES,
        };
        http::start(hcfg, stopping.clone())?;
    }
    let stop = async move {
        tokio::select! {
            () = shutdown => {}
            r = fail_rx => {
                let why = r.unwrap_or_else(|_| "the driver thread panicked (see the log above)".to_string());
                tracing::error!(%why, "stopping");
                if let Ok(mut f) = failed2.lock() {
                    *f = Some(why);
                }
            }
        }
        let _ = stopping_tx.send(true);
    };
    let view_server = v1::view_server::ViewServer::new(view)
        .max_decoding_message_size(cfg.max_request_bytes)
        .max_encoding_message_size(usize::MAX);
    let raft_server = v1::raft_server::RaftServer::new(raft)
        .max_decoding_message_size(transport::MAX_RAFT_BYTES)
        .max_encoding_message_size(transport::MAX_RAFT_BYTES);
    let server_err = |addr: String| move |e: tonic::transport::Error| ServeError::Server { addr, why: e.to_string() };
    let server: std::pin::Pin<Box<dyn Future<Output = Result<(), ServeError>> + Send>> = match cfg.raft_listen {
        // Raft on its own port: the client port carries only the View service.
        Some(raft_addr) => {
            let raft_incoming = tonic::transport::server::TcpIncoming::bind(raft_addr)
                .map_err(|e| ServeError::Server { addr: raft_addr.to_string(), why: e.to_string() })?
                .with_nodelay(Some(true));
            let mut stopping3 = stopping.clone();
            let raft = tonic::transport::Server::builder().add_service(raft_server).serve_with_incoming_shutdown(
                raft_incoming,
                async move {
                    let _ = stopping3.wait_for(|s| *s).await;
                },
            );
            let client = tonic::transport::Server::builder()
                .add_service(view_server)
                .serve_with_incoming_shutdown(incoming, stop);
            let (a, b) = (cfg.listen.to_string(), raft_addr.to_string());
            tracing::info!(replica = cfg.id, raft = %raft_addr, "raft on its own port");
            Box::pin(async move {
                tokio::select! {
                    r = client => r.map_err(server_err(a)),
                    r = raft => r.map_err(server_err(b)),
                }
            })
        }
        None => {
            let a = cfg.listen.to_string();
            let both = tonic::transport::Server::builder()
                .add_service(view_server)
                .add_service(raft_server)
                .serve_with_incoming_shutdown(incoming, stop);
            Box::pin(async move { both.await.map_err(server_err(a)) })
        }
    };
    // Graceful shutdown waits for open streams (peers' raft streams, watchers) to end: give
    // them a moment, then stop anyway. Every raft write is already durable.
    let mut stopping4 = stopping.clone();
    let grace = async move {
        let _ = stopping4.wait_for(|s| *s).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    tokio::select! {
        r = server => r?,
        () = grace => tracing::info!("open streams did not close within 1 s; stopping"),
    }
    // Stop the driver and wait for it, so RocksDB is closed before the process may exit (a
    // process exiting under a live RocksDB thread can abort in its static destructors).
    stop_driver.store(true, std::sync::atomic::Ordering::Relaxed);
    let joined = tokio::task::spawn_blocking(move || driver_thread.join());
    if tokio::time::timeout(Duration::from_secs(5), joined).await.is_err() {
        tracing::warn!(replica = cfg.id, "the driver did not stop within 5 s");
    }
    if let Some(why) = failed.lock().ok().and_then(|f| f.clone()) {
        return Err(ServeError::Server { addr: cfg.listen.to_string(), why: format!("replica failed: {why}") });
    }
    Ok(())
}
