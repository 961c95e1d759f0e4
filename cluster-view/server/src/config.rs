//! A replica's configuration: [`ServeConfig`], a value (built in code or from a file), and
//! [`ServeFile`], the TOML file of `tessera view serve`, overridable by flags.
//!
//! ```toml
//! id = 1
//! cluster = "local"
//! cluster_spec = "cluster.toml"   # relative to this file
//! listen = "127.0.0.1:7101"
//! data_dir = "data/1"             # relative to this file
//! peers = ["1=127.0.0.1:7101", "2=127.0.0.1:7102", "3=127.0.0.1:7103"]
//! ```
//!
//! Every other key has a default (see [`ServeConfig`]). The file's listen addresses become
//! [`ListenAddrs`]; [`crate::serve`] itself takes sockets already bound ([`Listeners`]), so a
//! test binds port 0 and reads the address back, and nothing binds a port only to free it.
//! A process started by another that bound its sockets (systemd socket activation, or
//! `tessera-testkit`'s process clusters) takes them with [`Listeners::inherited`].

use crate::error::ViewServerError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use tessera_view::ClusterSpec;

/// Settings of one replica, as a value: the cluster spec is held, not named by a path.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServeConfig {
    /// This replica's id, non-zero, unique in the cluster.
    pub id: u64,
    /// The cluster's name; replicas of other clusters are refused.
    pub cluster: String,
    /// The cluster spec (racks, servers, topologies) every replica starts from.
    pub spec: ClusterSpec,
    /// RocksDB directory.
    pub data_dir: PathBuf,
    /// Address peers and clients use to reach this replica; the client listener's address
    /// when absent.
    #[serde(default)]
    pub advertise: Option<String>,
    /// Address peers use for this replica's raft port (with a raft listener); that listener's
    /// address when absent.
    #[serde(default)]
    pub raft_advertise: Option<String>,
    /// Raft addresses of the founding voters as `id=host:port` (with a raft listener).
    #[serde(default)]
    pub raft_peers: Vec<String>,
    /// Every founding voter as `id=host:port`, this replica included. Empty with `join`.
    #[serde(default)]
    pub peers: Vec<String>,
    /// Start as a new replica joining a running cluster (added with `AddReplica`), not a
    /// founding voter. `peers` then lists replicas to reach.
    #[serde(default)]
    pub join: bool,
    /// TLS directory (`ca.pem`, `cert.pem`, `key.pem` of a replica certificate, from
    /// `tessera tls issue --role replica`): every listener and every connection to a peer is
    /// mutual TLS.
    #[serde(default)]
    pub tls: Option<PathBuf>,
    /// Plaintext instead, nothing authenticated: must be chosen explicitly (exactly one of
    /// `tls` and `insecure`).
    #[serde(default)]
    pub insecure: bool,
    /// The tunables (timing, bounds), with defaults.
    #[serde(flatten)]
    pub tuning: Tuning,
}

/// A replica's timing and bounds; every field has a default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tuning {
    /// Milliseconds per raft tick.
    #[serde(default = "d_tick_ms")]
    pub tick_ms: u64,
    /// Ticks without hearing a leader before an election (the timeout is drawn from
    /// [election_tick, 2 × election_tick) ticks).
    #[serde(default = "d_election_tick")]
    pub election_tick: usize,
    /// Ticks between leader heartbeats.
    #[serde(default = "d_heartbeat_tick")]
    pub heartbeat_tick: usize,
    /// fsync every raft write. Only a throw-away test cluster may turn this off.
    #[serde(default = "d_true")]
    pub sync: bool,
    /// Snapshot and compact the log after this many applied entries.
    #[serde(default = "d_snapshot_every")]
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot for slightly lagging followers.
    #[serde(default = "d_keep_entries")]
    pub keep_entries: u64,
    /// Most gang proposals waiting for commit on the leader.
    #[serde(default = "d_max_in_flight")]
    pub max_in_flight: usize,
    /// Most commands per raft entry.
    #[serde(default = "d_max_batch")]
    pub max_batch: usize,
    /// Largest client request accepted, in bytes.
    #[serde(default = "d_max_request_bytes")]
    pub max_request_bytes: usize,
    /// Milliseconds a request may wait for its answer.
    #[serde(default = "d_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Server lease in milliseconds: a registered server that sends no heartbeat for this long
    /// is marked down and its gangs re-queued. 0 disables leases (clusters without agents).
    #[serde(default)]
    pub server_lease_ms: u64,
    /// Scheduler hosts' lease on the jobs they adopt, in milliseconds: a host that does not
    /// renew for this long loses its jobs to another host.
    #[serde(default = "d_scheduler_lease_ms")]
    pub scheduler_lease_ms: u64,
    /// Most concurrent `Watch` streams.
    #[serde(default = "d_max_watchers")]
    pub max_watchers: usize,
    /// Most concurrent `Watch` streams of one caller (one identity; replicas and admins count
    /// toward `max_watchers` only).
    #[serde(default = "d_max_watchers_per_caller")]
    pub max_watchers_per_caller: usize,
    /// Requests per second one caller (one identity; replicas and admins exempt) may make to
    /// this replica, sustained; bursts up to a second's worth. 0 turns the limit off.
    #[serde(default = "d_caller_rate")]
    pub caller_rate: u32,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            tick_ms: d_tick_ms(),
            election_tick: d_election_tick(),
            heartbeat_tick: d_heartbeat_tick(),
            sync: true,
            snapshot_every: d_snapshot_every(),
            keep_entries: d_keep_entries(),
            max_in_flight: d_max_in_flight(),
            max_batch: d_max_batch(),
            max_request_bytes: d_max_request_bytes(),
            request_timeout_ms: d_request_timeout_ms(),
            server_lease_ms: 0,
            scheduler_lease_ms: d_scheduler_lease_ms(),
            max_watchers: d_max_watchers(),
            max_watchers_per_caller: d_max_watchers_per_caller(),
            caller_rate: d_caller_rate(),
        }
    }
}

/// `tessera view serve`'s TOML file: a [`ServeConfig`] whose cluster spec is a path, plus
/// where to listen. Unknown keys are refused (see [`ServeFile::from_file`]); a value is
/// written with [`ServeFile::write`].
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct ServeFile {
    /// This replica's id.
    pub id: u64,
    /// The cluster's name.
    pub cluster: String,
    /// The cluster spec file (relative paths are resolved against this file's directory).
    pub cluster_spec: PathBuf,
    /// gRPC listen address (clients, and peers unless `raft_listen` is set).
    pub listen: SocketAddr,
    /// See [`ServeConfig::advertise`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// Separate listen address for raft traffic between replicas. Without it, raft shares the
    /// client port, which must then be reachable by trusted hosts only: raft messages are not
    /// authenticated and raft-rs panics on some forged ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raft_listen: Option<SocketAddr>,
    /// See [`ServeConfig::raft_advertise`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raft_advertise: Option<String>,
    /// See [`ServeConfig::raft_peers`].
    #[serde(default)]
    pub raft_peers: Vec<String>,
    /// RocksDB directory (relative paths are resolved against this file's directory).
    pub data_dir: PathBuf,
    /// See [`ServeConfig::peers`].
    #[serde(default)]
    pub peers: Vec<String>,
    /// See [`ServeConfig::join`].
    #[serde(default)]
    pub join: bool,
    /// Address of the HTTP/JSON API and `/metrics` (actix-web), e.g. `127.0.0.1:8080`; none
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_listen: Option<SocketAddr>,
    /// See [`ServeConfig::tls`] (relative paths are resolved against this file's directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<PathBuf>,
    /// See [`ServeConfig::insecure`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// Timing and bounds.
    #[serde(flatten)]
    pub tuning: Tuning,
}

/// Where a replica listens: the gRPC client port, raft's own port (optional: raft shares the
/// client port without it) and the HTTP API (optional).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenAddrs {
    /// gRPC for clients (and raft without `raft`).
    pub client: SocketAddr,
    /// Raft between replicas.
    pub raft: Option<SocketAddr>,
    /// The HTTP/JSON API.
    pub http: Option<SocketAddr>,
}

/// A replica's sockets, bound by its owner: [`crate::serve`] serves on them as they are.
#[derive(Debug)]
pub struct Listeners {
    /// gRPC for clients (and raft without `raft`).
    pub client: TcpListener,
    /// Raft between replicas, when it has its own port.
    pub raft: Option<TcpListener>,
    /// The HTTP/JSON API, when served.
    pub http: Option<TcpListener>,
}

impl Listeners {
    /// Binds every address of `a`.
    pub fn bind(a: &ListenAddrs) -> Result<Listeners, ViewServerError> {
        let bind = |addr: SocketAddr| {
            TcpListener::bind(addr).map_err(|source| ViewServerError::Listen { addr: addr.to_string(), source })
        };
        Ok(Listeners {
            client: bind(a.client)?,
            raft: a.raft.map(bind).transpose()?,
            http: a.http.map(bind).transpose()?,
        })
    }

    /// Fresh ports on 127.0.0.1 chosen by the kernel (port 0): a client port, a raft port
    /// with `raft`, an HTTP port with `http`. Read them back with [`Listeners::addrs`].
    pub fn loopback(raft: bool, http: bool) -> Result<Listeners, ViewServerError> {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Listeners::bind(&ListenAddrs { client: any, raft: raft.then_some(any), http: http.then_some(any) })
    }

    /// Sockets handed over by the process that started this one, by systemd's socket-activation
    /// protocol: `LISTEN_FDS` sockets from descriptor 3 on, named in order by `LISTEN_FDNAMES`
    /// (`client`, `raft`, `http`, separated by `:`; a single unnamed socket is the client's),
    /// and `LISTEN_PID`, which when set must be this process (otherwise nothing was passed to
    /// it). `None` when no socket was passed. The sockets are made close-on-exec.
    pub fn inherited() -> Result<Option<Listeners>, ViewServerError> {
        let mut fds = listenfd::ListenFd::from_env();
        let n = fds.len();
        if n == 0 {
            return Ok(None);
        }
        let bad = |m: String| ViewServerError::Inherited(m);
        let names: Vec<String> = match std::env::var("LISTEN_FDNAMES") {
            Ok(v) => v.split(':').map(str::to_string).collect(),
            Err(_) if n == 1 => vec!["client".to_string()],
            Err(_) => return Err(bad(format!("{n} sockets but no LISTEN_FDNAMES to say which is which"))),
        };
        if names.len() != n {
            return Err(bad(format!("{n} sockets but {} names in LISTEN_FDNAMES `{}`", names.len(), names.join(":"))));
        }
        let (mut client, mut raft, mut http) = (None, None, None);
        for (i, name) in names.iter().enumerate() {
            let fd = 3 + i as i32;
            let socket = |what: &'static str| {
                move |source: std::io::Error| ViewServerError::InheritedSocket { fd, name: name.clone(), what, source }
            };
            let l = fds
                .take_tcp_listener(i)
                .map_err(socket("not a TCP listener"))?
                .ok_or_else(|| bad(format!("descriptor {fd} (`{name}`) was already taken")))?;
            nix::fcntl::fcntl(&l, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
                .map_err(|e| socket("cannot set close-on-exec")(e.into()))?;
            let slot = match name.as_str() {
                "client" => &mut client,
                "raft" => &mut raft,
                "http" => &mut http,
                other => return Err(bad(format!("unknown socket name `{other}` (known: client, raft, http)"))),
            };
            if slot.replace(l).is_some() {
                return Err(bad(format!("socket `{name}` passed twice")));
            }
        }
        let client = client.ok_or_else(|| bad(format!("no `client` socket among `{}`", names.join(":"))))?;
        Ok(Some(Listeners { client, raft, http }))
    }

    /// Checks that these sockets are the ones `want` names (inherited sockets must agree with
    /// the configuration: the addresses peers and clients are told are the configuration's).
    pub fn check_bound_at(&self, want: &ListenAddrs) -> Result<(), ViewServerError> {
        let got = self.addrs()?;
        let pairs = [
            ("client", "listen", Some(got.client), Some(want.client)),
            ("raft", "raft_listen", got.raft, want.raft),
            ("http", "http_listen", got.http, want.http),
        ];
        for (socket, key, got, want) in pairs {
            if got != want {
                let show = |a: Option<SocketAddr>| a.map_or_else(|| "none".to_string(), |a| a.to_string());
                return Err(ViewServerError::Inherited(format!(
                    "the `{socket}` socket is {} but the configuration's {key} is {}",
                    show(got),
                    show(want)
                )));
            }
        }
        Ok(())
    }

    /// The bound addresses.
    pub fn addrs(&self) -> Result<ListenAddrs, ViewServerError> {
        let local = |l: &TcpListener| {
            l.local_addr().map_err(|source| ViewServerError::Listen { addr: "a listener".into(), source })
        };
        Ok(ListenAddrs {
            client: local(&self.client)?,
            raft: self.raft.as_ref().map(local).transpose()?,
            http: self.http.as_ref().map(local).transpose()?,
        })
    }
}

fn d_scheduler_lease_ms() -> u64 {
    5_000
}

fn d_tick_ms() -> u64 {
    50
}
fn d_election_tick() -> usize {
    10
}
fn d_heartbeat_tick() -> usize {
    2
}
fn d_true() -> bool {
    true
}
fn d_snapshot_every() -> u64 {
    10_000
}
fn d_keep_entries() -> u64 {
    1_000
}
fn d_max_in_flight() -> usize {
    65_536
}
fn d_max_batch() -> usize {
    1_024
}
fn d_max_request_bytes() -> usize {
    4 << 20
}
fn d_request_timeout_ms() -> u64 {
    5_000
}
fn d_max_watchers() -> usize {
    1_024
}
fn d_max_watchers_per_caller() -> usize {
    16
}
fn d_caller_rate() -> u32 {
    2_000
}

/// The keys of [`ServeFile`] outside its tuning.
const FILE_KEYS: [&str; 14] = [
    "id",
    "cluster",
    "cluster_spec",
    "listen",
    "advertise",
    "raft_listen",
    "raft_advertise",
    "raft_peers",
    "data_dir",
    "peers",
    "join",
    "http_listen",
    "tls",
    "insecure",
];

impl ServeFile {
    /// Reads a config file; relative paths in it are resolved against its directory.
    pub fn from_file(path: &Path) -> Result<ServeFile, ViewServerError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| ViewServerError::ReadConfig { file: path.to_path_buf(), source })?;
        let parse = |e| ViewServerError::ParseConfig { file: path.to_path_buf(), source: Box::new(e) };
        // serde cannot refuse unknown keys of a struct with a flattened part: check the keys
        // first, against the file's own and the tuning's (read off its serialized defaults).
        let table: toml::Table = toml::from_str(&text).map_err(parse)?;
        let tuning = toml::Table::try_from(Tuning::default())
            .map_err(|source| ViewServerError::EncodeConfig { file: path.to_path_buf(), source })?;
        if let Some(k) = table.keys().find(|k| !FILE_KEYS.contains(&k.as_str()) && !tuning.contains_key(*k)) {
            let mut known: Vec<&str> = FILE_KEYS.to_vec();
            known.extend(tuning.keys().map(String::as_str));
            let message = format!("unknown key `{k}` (known: {})", known.join(", "));
            return Err(ViewServerError::Config { file, message });
        }
        let mut f: ServeFile = toml::from_str(&text).map_err(parse)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        if f.cluster_spec.is_relative() {
            f.cluster_spec = dir.join(&f.cluster_spec);
        }
        if f.data_dir.is_relative() {
            f.data_dir = dir.join(&f.data_dir);
        }
        if let Some(t) = f.tls.as_mut().filter(|t| t.is_relative()) {
            *t = dir.join(&*t);
        }
        Ok(f)
    }

    /// The file for replica `cfg` listening at `listen`, its cluster spec at `cluster_spec`.
    pub fn new(cfg: &ServeConfig, listen: &ListenAddrs, cluster_spec: PathBuf) -> ServeFile {
        ServeFile {
            id: cfg.id,
            cluster: cfg.cluster.clone(),
            cluster_spec,
            listen: listen.client,
            advertise: cfg.advertise.clone(),
            raft_listen: listen.raft,
            raft_advertise: cfg.raft_advertise.clone(),
            raft_peers: cfg.raft_peers.clone(),
            data_dir: cfg.data_dir.clone(),
            peers: cfg.peers.clone(),
            join: cfg.join,
            http_listen: listen.http,
            tls: cfg.tls.clone(),
            insecure: cfg.insecure,
            tuning: cfg.tuning.clone(),
        }
    }

    /// Writes the file; [`ServeFile::from_file`] reads it back equal.
    pub fn write(&self, path: &Path) -> Result<(), ViewServerError> {
        let file = || path.to_path_buf();
        let text = toml::to_string(self).map_err(|source| ViewServerError::EncodeConfig { file: file(), source })?;
        std::fs::write(path, text).map_err(|source| ViewServerError::WriteConfig { file: file(), source })
    }

    /// Where the file says to listen.
    pub fn listen_addrs(&self) -> ListenAddrs {
        ListenAddrs { client: self.listen, raft: self.raft_listen, http: self.http_listen }
    }

    /// The replica's configuration: the cluster spec file is read and checked.
    pub fn into_config(self) -> Result<ServeConfig, ViewServerError> {
        let spec = ClusterSpec::from_file(&self.cluster_spec).map_err(|e| ViewServerError::ClusterSpec(Box::new(e)))?;
        Ok(ServeConfig {
            id: self.id,
            cluster: self.cluster,
            spec,
            data_dir: self.data_dir,
            advertise: self.advertise,
            raft_advertise: self.raft_advertise,
            raft_peers: self.raft_peers,
            peers: self.peers,
            join: self.join,
            tls: self.tls,
            insecure: self.insecure,
            tuning: self.tuning,
        })
    }
}

impl ServeConfig {
    /// A founding replica `id` of cluster `cluster` over `spec`, storing in `data_dir`, with
    /// default tuning and no peers yet (see [`ServeConfig::with_peers`]).
    pub fn new(id: u64, cluster: &str, spec: ClusterSpec, data_dir: impl Into<PathBuf>) -> ServeConfig {
        ServeConfig {
            id,
            cluster: cluster.to_string(),
            spec,
            data_dir: data_dir.into(),
            advertise: None,
            raft_advertise: None,
            raft_peers: Vec::new(),
            peers: Vec::new(),
            join: false,
            tls: None,
            insecure: false,
            tuning: Tuning::default(),
        }
    }

    /// Serves and connects with mutual TLS from `dir` (see [`ServeConfig::tls`]).
    pub fn with_tls(mut self, dir: impl Into<PathBuf>) -> ServeConfig {
        self.tls = Some(dir.into());
        self.insecure = false;
        self
    }

    /// Serves and connects in plaintext, nothing authenticated.
    pub fn with_insecure(mut self) -> ServeConfig {
        self.tls = None;
        self.insecure = true;
        self
    }

    /// The founding voters: replica `i + 1` at `addrs[i]` (client, and raft when given).
    pub fn with_peers(mut self, addrs: &[ListenAddrs]) -> ServeConfig {
        self.peers = addrs.iter().enumerate().map(|(i, a)| format!("{}={}", i + 1, a.client)).collect();
        self.raft_peers =
            addrs.iter().enumerate().filter_map(|(i, a)| a.raft.map(|r| format!("{}={r}", i + 1))).collect();
        self
    }

    /// Replaces the tuning.
    pub fn with_tuning(mut self, tuning: Tuning) -> ServeConfig {
        self.tuning = tuning;
        self
    }

    /// The address others use for this replica, given where it listens.
    pub fn advertised(&self, listen: &ListenAddrs) -> String {
        self.advertise.clone().unwrap_or_else(|| listen.client.to_string())
    }

    /// This replica's raft address (its client address when raft shares the port).
    pub fn raft_advertised(&self, listen: &ListenAddrs) -> String {
        match (&self.raft_advertise, listen.raft) {
            (Some(a), _) => a.clone(),
            (None, Some(l)) => l.to_string(),
            (None, None) => self.advertised(listen),
        }
    }

    /// The peers as id → address record (`client` or `client raft`, see [`split_addr`]);
    /// `raft_port`: raft has its own port.
    pub fn peer_map(&self, raft_port: bool) -> Result<BTreeMap<u64, String>, ViewServerError> {
        let mut out = parse_peers("peers", &self.peers)?;
        if raft_port {
            let raft = parse_peers("raft_peers", &self.raft_peers)?;
            for (id, client) in out.iter_mut() {
                let r = raft.get(id).ok_or_else(|| ViewServerError::Config {
                    file: "raft_peers".into(),
                    message: format!("replica {id} is in peers but not in raft_peers"),
                })?;
                *client = format!("{client} {r}");
            }
        } else if !self.raft_peers.is_empty() {
            return Err(ViewServerError::Config {
                file: "raft_peers".into(),
                message: "raft_peers needs a raft listener (raft_listen)".into(),
            });
        }
        Ok(out)
    }

    /// Checks values that cannot work; `raft_port`: raft has its own listener.
    pub fn validate(&self, raft_port: bool) -> Result<(), ViewServerError> {
        let bad = |m: &str| Err(ViewServerError::Config { file: "config".into(), message: m.to_string() });
        let t = &self.tuning;
        if self.id == 0 {
            return bad("id must be at least 1");
        }
        if self.cluster.trim().is_empty() {
            return bad("cluster name is empty");
        }
        if t.tick_ms == 0 || t.tick_ms > 10_000 {
            return bad("tick_ms must be in 1..=10000");
        }
        if t.heartbeat_tick == 0 || t.election_tick <= t.heartbeat_tick {
            return bad("need 0 < heartbeat_tick < election_tick");
        }
        if t.max_batch == 0 || t.max_in_flight == 0 || t.max_watchers == 0 || t.max_watchers_per_caller == 0 {
            return bad("max_batch, max_in_flight, max_watchers and max_watchers_per_caller must be at least 1");
        }
        if t.max_request_bytes < 1024 {
            return bad("max_request_bytes must be at least 1024");
        }
        if t.request_timeout_ms == 0 {
            return bad("request_timeout_ms must be at least 1");
        }
        if t.snapshot_every == 0 {
            return bad("snapshot_every must be at least 1");
        }
        if !(100..=600_000).contains(&t.scheduler_lease_ms) {
            return bad("scheduler_lease_ms must be in 100..=600000");
        }
        let peers = self.peer_map(raft_port)?;
        if !self.join && !peers.contains_key(&self.id) {
            return bad("peers must list this replica's own id (or set join = true)");
        }
        if self.join && peers.is_empty() {
            return bad("a joining replica needs peers to reach");
        }
        match (&self.tls, self.insecure) {
            (Some(_), true) => return bad("tls and insecure exclude each other"),
            (None, false) => {
                return bad(
                    "set tls (a directory from `tessera tls issue --role replica`) or, for plaintext, insecure = true",
                );
            }
            _ => {}
        }
        Ok(())
    }
}

/// Splits an address record into (client address, raft address).
pub fn split_addr(record: &str) -> (&str, &str) {
    match record.split_once(' ') {
        Some((c, r)) => (c, r),
        None => (record, record),
    }
}

fn parse_peers(field: &str, list: &[String]) -> Result<BTreeMap<u64, String>, ViewServerError> {
    let bad = |m: String| ViewServerError::Config { file: field.into(), message: m };
    let mut out = BTreeMap::new();
    for p in list {
        let (id, addr) = p.split_once('=').ok_or_else(|| bad(format!("`{p}` is not `id=host:port`")))?;
        let id: u64 = id.trim().parse().map_err(|_| bad(format!("`{p}`: `{id}` is not a replica id")))?;
        let addr = addr.trim();
        if id == 0 {
            return Err(bad(format!("`{p}`: replica ids start at 1")));
        }
        if !addr.contains(':') {
            return Err(bad(format!("`{p}`: `{addr}` has no port")));
        }
        if out.insert(id, addr.to_string()).is_some() {
            return Err(bad(format!("replica {id} is listed twice")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back_equal() {
        let dir = tempfile::tempdir().expect("tmp");
        let listen = Listeners::loopback(true, true).expect("bind");
        let addrs = listen.addrs().expect("addrs");
        let spec = ClusterSpec::uniform(tessera_view::Topology::preset("seed-8gpu").expect("preset"), 4, 2, 1);
        let mut tuning = Tuning { tick_ms: 20, server_lease_ms: 600, ..Tuning::default() };
        tuning.sync = false;
        let cfg = ServeConfig::new(1, "t", spec, dir.path().join("data")).with_peers(&[addrs]).with_tuning(tuning);
        let file = ServeFile::new(&cfg, &addrs, dir.path().join("cluster.toml"));
        let path = dir.path().join("replica-1.toml");
        file.write(&path).expect("write");
        assert_eq!(ServeFile::from_file(&path).expect("read back"), file);
        assert_eq!(file.listen_addrs(), addrs);
    }

    #[test]
    fn sockets_must_be_where_the_config_says() {
        let l = Listeners::loopback(true, false).expect("bind");
        let a = l.addrs().expect("addrs");
        l.check_bound_at(&a).expect("the same addresses");
        let e = l.check_bound_at(&ListenAddrs { raft: None, ..a }).expect_err("an extra raft socket");
        assert!(e.to_string().contains("raft_listen is none"), "{e}");
        let other = SocketAddr::from(([127, 0, 0, 1], 1));
        let e = l.check_bound_at(&ListenAddrs { client: other, ..a }).expect_err("another client address");
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    }
}
