//! # tessera-testkit: local clusters for tests, benchmarks and `tessera dev`
//!
//! [`LocalCluster`] runs view replicas in this process, each on sockets the kit binds itself
//! (port 0 by default, so parallel tests never race for a port; fixed ports when asked, as
//! `tessera dev` does), each replica built from a [`ServeConfig`] value — no configuration file
//! is written. The same replicas a deployment runs: raft-rs on RocksDB, gRPC, the HTTP API.
//!
//! [`ProcessCluster`] runs them as `tessera view serve` processes instead (to kill one with
//! `SIGKILL` and restart it), the sockets still bound by the kit and passed to each process.
//! [`history`] follows a cluster's change stream and checks every step of it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tessera_testkit::KitError> {
//! use tessera_view::{ClusterSpec, Topology};
//! let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 4, 2, 1);
//! let cluster = tessera_testkit::LocalCluster::builder(spec).replicas(3).start().await?;
//! let mut client = cluster.client()?;
//! client.wait_for_leader().await?;
//! cluster.stop().await?;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tessera_proto::tls::Security;
use tessera_view::ClusterSpec;
use tessera_view_server::{ClientError, ListenAddrs, Listeners, ServeConfig, Tuning, ViewClient, ViewServerError};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod chaos;
pub mod commit_load;
pub mod fuzz;
pub mod history;
pub mod pki;
mod process;

pub use pki::Pki;
pub use process::ProcessCluster;

/// The kit's one error type: why a local cluster could not start or stopped badly, or why a
/// load against a cluster ([`commit_load`]) could not run to its end.
#[derive(Debug, Error)]
pub enum KitError {
    /// A replica could not be configured, bound or run.
    #[error("replica {replica}")]
    Replica {
        /// Its id.
        replica: u64,
        /// What failed.
        source: ViewServerError,
    },
    /// The data directory could not be made.
    #[error("data directory {dir}")]
    DataDir {
        /// The directory.
        dir: String,
        /// Why.
        source: std::io::Error,
    },
    /// The cluster spec could not be written into the data directory.
    #[error("cannot write the cluster spec into {dir}")]
    WriteSpec {
        /// The directory.
        dir: String,
        /// Why.
        source: tessera_view::SpecError,
    },
    /// A replica's task ended abnormally (it panicked).
    #[error("replica {replica} panicked: {why}")]
    Panicked {
        /// Its id.
        replica: u64,
        /// The panic.
        why: String,
    },
    /// A replica process could not be started, stopped or signalled.
    #[error("replica {replica} process: {why}")]
    Process {
        /// Its id.
        replica: u64,
        /// What failed.
        why: String,
    },
    /// No replica has this id.
    #[error("no replica {0} in this cluster")]
    NoReplica(u64),
    /// The client could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A call to the view failed for good.
    #[error("{what}")]
    Call {
        /// What the call was for.
        what: String,
        /// Why it failed.
        source: ClientError,
    },
    /// A load's settings cannot work; says which and why.
    #[error("{0}")]
    BadLoad(String),
    /// The target cluster cannot take this load (too small, not fresh, no leader in the kit).
    #[error("{0}")]
    ClusterUnfit(String),
    /// A reply from the view could not be decoded.
    #[error("{0}")]
    Decode(String),
    /// A load's client task panicked or was cancelled.
    #[error("a client task failed: {0}")]
    ClientTask(String),
    /// A fault could not be injected or healed (a `docker`, `nsenter`, `tc` or `iptables`
    /// command failed, or a file could not be written).
    #[error("{what}: {why}")]
    Fault {
        /// The command or action.
        what: String,
        /// Its error output or the I/O error.
        why: String,
    },
}

/// How to start a [`LocalCluster`].
#[derive(Debug)]
pub struct LocalClusterBuilder {
    spec: ClusterSpec,
    name: String,
    replicas: usize,
    raft_ports: bool,
    http: bool,
    tuning: Tuning,
    data_dir: Option<PathBuf>,
    listen: Option<Vec<ListenAddrs>>,
    log_filter: String,
    env: Vec<(String, String)>,
    tls: bool,
}

impl LocalClusterBuilder {
    /// Mutual TLS between the replicas and with their clients (on by default: a CA and the
    /// certificates are made in the cluster's directory, see [`LocalCluster::pki`]); off is
    /// plaintext, as `--insecure`.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// The `RUST_LOG` filter of replica processes (`info` by default; see
    /// [`LocalClusterBuilder::start_processes`]).
    pub fn log_filter(mut self, filter: &str) -> Self {
        self.log_filter = filter.to_string();
        self
    }

    /// An environment variable of replica processes (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`); see
    /// [`LocalClusterBuilder::start_processes`]. `{replica}` in the value reads as each
    /// replica's id (a file of its own, say).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Number of replicas (1 by default).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n.max(1);
        self
    }

    /// The cluster's name (`local` by default).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Give raft its own port on every replica.
    pub fn raft_ports(mut self, on: bool) -> Self {
        self.raft_ports = on;
        self
    }

    /// Serve the HTTP API on the first replica.
    pub fn http(mut self, on: bool) -> Self {
        self.http = on;
        self
    }

    /// The replicas' tuning.
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// Keep the replicas' data here (`replica-N` below it) instead of a temporary directory
    /// removed when the cluster is dropped.
    pub fn data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(dir.to_path_buf());
        self
    }

    /// Fixed addresses, one per replica (client, raft, HTTP); without them every socket is
    /// bound to a fresh loopback port. An address in use fails the start with the reason.
    pub fn listen(mut self, addrs: Vec<ListenAddrs>) -> Self {
        self.replicas = addrs.len().max(1);
        self.listen = Some(addrs);
        self
    }

    /// Binds every socket, then starts every replica on the current tokio runtime. Returns once
    /// they are serving (a leader may not be elected yet: see [`ViewClient::wait_for_leader`]).
    pub async fn start(self) -> Result<LocalCluster, KitError> {
        let (tmp, dir) = self.directory()?;
        let (listeners, addrs) = self.bind_all()?;
        let pki = if self.tls { Some(Pki::create(&dir.join("tls"))?) } else { None };
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = Vec::with_capacity(listeners.len());
        for (i, l) in listeners.into_iter().enumerate() {
            let id = i as u64 + 1;
            let cfg = ServeConfig::new(id, &self.name, self.spec.clone(), dir.join(format!("replica-{id}")))
                .with_peers(&addrs)
                .with_tuning(self.tuning.clone());
            let cfg = match &pki {
                Some(p) => {
                    cfg.with_tls(p.issue(tessera_proto::tls::Role::Replica, &format!("replica-{id}"), &[], &[])?)
                }
                None => cfg.with_insecure(),
            };
            let mut rx = stop_rx.clone();
            let stopped = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            tasks.push((id, tokio::spawn(tessera_view_server::serve(l, cfg, stopped))));
        }
        tracing::info!(replicas = addrs.len(), dir = %dir.display(), "local cluster started");
        let client_security = match &pki {
            Some(p) => p.admin()?,
            None => Security::Insecure,
        };
        Ok(LocalCluster { addrs, dir, stop: stop_tx, tasks, pki, client_security, _tmp: tmp })
    }
}

impl LocalClusterBuilder {
    /// The data directory: the one given (made if missing), or a temporary one.
    fn directory(&self) -> Result<(Option<tempfile::TempDir>, PathBuf), KitError> {
        match &self.data_dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .map_err(|source| KitError::DataDir { dir: d.display().to_string(), source })?;
                Ok((None, d.clone()))
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("tessera-local-")
                    .tempdir()
                    .map_err(|source| KitError::DataDir { dir: std::env::temp_dir().display().to_string(), source })?;
                let p = t.path().to_path_buf();
                Ok((Some(t), p))
            }
        }
    }

    /// Every replica's sockets (its fixed addresses, or fresh loopback ports) and where they are
    /// bound, replica 1 first.
    fn bind_all(&self) -> Result<(Vec<Listeners>, Vec<ListenAddrs>), KitError> {
        let mut listeners = Vec::with_capacity(self.replicas);
        let mut addrs = Vec::with_capacity(self.replicas);
        for i in 0..self.replicas {
            let replica = i as u64 + 1;
            let bound = match &self.listen {
                Some(fixed) => Listeners::bind(&fixed[i]),
                None => Listeners::loopback(self.raft_ports, self.http && i == 0),
            };
            let l = bound.map_err(|source| KitError::Replica { replica, source })?;
            addrs.push(l.addrs().map_err(|source| KitError::Replica { replica, source })?);
            listeners.push(l);
        }
        Ok((listeners, addrs))
    }
}

/// View replicas running in this process. Dropping it signals them to stop without waiting (a
/// replica whose runtime then goes away still stops and closes its storage as its task is
/// dropped); prefer [`LocalCluster::stop`], which waits until every replica has closed its
/// storage and reports how each ended.
#[derive(Debug)]
pub struct LocalCluster {
    addrs: Vec<ListenAddrs>,
    dir: PathBuf,
    stop: watch::Sender<bool>,
    tasks: Vec<(u64, JoinHandle<Result<(), ViewServerError>>)>,
    pki: Option<Pki>,
    client_security: Security,
    _tmp: Option<tempfile::TempDir>,
}

impl LocalCluster {
    /// A builder over the cluster `spec`.
    pub fn builder(spec: ClusterSpec) -> LocalClusterBuilder {
        LocalClusterBuilder {
            spec,
            name: "local".to_string(),
            replicas: 1,
            raft_ports: false,
            http: false,
            tuning: Tuning::default(),
            data_dir: None,
            listen: None,
            log_filter: "info".to_string(),
            env: Vec::new(),
            tls: true,
        }
    }

    /// The replicas' client addresses (`host:port`), replica 1 first.
    pub fn addrs(&self) -> Vec<String> {
        self.addrs.iter().map(|a| a.client.to_string()).collect()
    }

    /// Replica `id`'s sockets.
    pub fn listen_addrs(&self, id: u64) -> Option<ListenAddrs> {
        self.addrs.get((id as usize).checked_sub(1)?).copied()
    }

    /// The HTTP API's address, when one is served.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.addrs.iter().find_map(|a| a.http)
    }

    /// Where the replicas keep their data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A leader-following client of every replica, with a 20 s deadline per call.
    pub fn client(&self) -> Result<ViewClient, KitError> {
        Ok(ViewClient::new(self.addrs())?.with_deadline(Duration::from_secs(20)).with_security(self.security()))
    }

    /// The CA and certificates of the cluster (`None` in plaintext).
    pub fn pki(&self) -> Option<&Pki> {
        self.pki.as_ref()
    }

    /// An admin's security on this cluster (plaintext when the cluster is).
    pub fn security(&self) -> Security {
        self.client_security.clone()
    }

    /// The security of a component or caller `role` `name` (a user's `tenants`): its own
    /// certificate, issued now; plaintext when the cluster is.
    pub fn security_for(
        &self,
        role: tessera_proto::tls::Role,
        name: &str,
        tenants: &[&str],
    ) -> Result<Security, KitError> {
        match &self.pki {
            Some(p) => p.security(role, name, tenants),
            None => Ok(Security::Insecure),
        }
    }

    /// Stops every replica and waits for each to close its storage; the first failure wins.
    pub async fn stop(mut self) -> Result<(), KitError> {
        let _ = self.stop.send(true);
        let mut first = Ok(());
        for (replica, t) in std::mem::take(&mut self.tasks) {
            let r = match t.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(source)) => Err(KitError::Replica { replica, source }),
                Err(e) => Err(KitError::Panicked { replica, why: e.to_string() }),
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
