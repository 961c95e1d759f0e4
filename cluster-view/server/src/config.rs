//! `tessera view serve` configuration: a TOML file, overridable by flags.
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
//! Every other key has a default (see [`ServeConfig`]).

use crate::error::ServeError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Settings of one replica process.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// This replica's id, non-zero, unique in the cluster.
    pub id: u64,
    /// The cluster's name; replicas of other clusters are refused.
    pub cluster: String,
    /// The cluster spec (racks, servers, topologies) every replica starts from.
    pub cluster_spec: PathBuf,
    /// gRPC listen address (clients and peers).
    pub listen: SocketAddr,
    /// Address peers and clients use to reach this replica; `listen` when absent.
    #[serde(default)]
    pub advertise: Option<String>,
    /// Separate listen address for raft traffic between replicas. Without it, raft shares the
    /// client port, which must then be reachable by trusted hosts only: raft messages are not
    /// authenticated and raft-rs panics on some forged ones.
    #[serde(default)]
    pub raft_listen: Option<SocketAddr>,
    /// Address peers use for this replica's raft port; `raft_listen` when absent.
    #[serde(default)]
    pub raft_advertise: Option<String>,
    /// Raft addresses of the founding voters as `id=host:port` (with `raft_listen`).
    #[serde(default)]
    pub raft_peers: Vec<String>,
    /// RocksDB directory.
    pub data_dir: PathBuf,
    /// Every founding voter as `id=host:port`, this replica included. Empty with `join`.
    #[serde(default)]
    pub peers: Vec<String>,
    /// Start as a new replica joining a running cluster (added with `AddReplica`), not a
    /// founding voter. `peers` then lists replicas to reach.
    #[serde(default)]
    pub join: bool,
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
    /// Address of the HTTP/JSON API and dashboard (actix-web), e.g. `127.0.0.1:8080`; none
    /// when absent.
    #[serde(default)]
    pub http_listen: Option<String>,
    /// Most concurrent `Watch` streams.
    #[serde(default = "d_max_watchers")]
    pub max_watchers: usize,
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

impl ServeConfig {
    /// Reads a config file; relative paths in it are resolved against its directory.
    pub fn from_file(path: &Path) -> Result<ServeConfig, ServeError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ServeError::Config { file: file.clone(), message: format!("cannot read: {e}") })?;
        let mut cfg: ServeConfig =
            toml::from_str(&text).map_err(|e| ServeError::Config { file: file.clone(), message: e.to_string() })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        if cfg.cluster_spec.is_relative() {
            cfg.cluster_spec = dir.join(&cfg.cluster_spec);
        }
        if cfg.data_dir.is_relative() {
            cfg.data_dir = dir.join(&cfg.data_dir);
        }
        Ok(cfg)
    }

    /// The address others use for this replica.
    pub fn advertised(&self) -> String {
        self.advertise.clone().unwrap_or_else(|| self.listen.to_string())
    }

    /// This replica's raft address (its client address when raft shares the port).
    pub fn raft_advertised(&self) -> String {
        match (&self.raft_advertise, self.raft_listen) {
            (Some(a), _) => a.clone(),
            (None, Some(l)) => l.to_string(),
            (None, None) => self.advertised(),
        }
    }

    /// The peers as id → address record (`client` or `client raft`, see [`split_addr`]).
    pub fn peer_map(&self) -> Result<BTreeMap<u64, String>, ServeError> {
        let mut out = parse_peers("peers", &self.peers)?;
        if self.raft_listen.is_some() {
            let raft = parse_peers("raft_peers", &self.raft_peers)?;
            for (id, client) in out.iter_mut() {
                let r = raft.get(id).ok_or_else(|| ServeError::Config {
                    file: "raft_peers".into(),
                    message: format!("replica {id} is in peers but not in raft_peers"),
                })?;
                *client = format!("{client} {r}");
            }
        } else if !self.raft_peers.is_empty() {
            return Err(ServeError::Config {
                file: "raft_peers".into(),
                message: "raft_peers needs raft_listen".into(),
            });
        }
        Ok(out)
    }

    /// Checks values that cannot work.
    pub fn validate(&self) -> Result<(), ServeError> {
        let bad = |m: &str| Err(ServeError::Config { file: "config".into(), message: m.to_string() });
        if self.id == 0 {
            return bad("id must be at least 1");
        }
        if self.cluster.trim().is_empty() {
            return bad("cluster name is empty");
        }
        if self.tick_ms == 0 || self.tick_ms > 10_000 {
            return bad("tick_ms must be in 1..=10000");
        }
        if self.heartbeat_tick == 0 || self.election_tick <= self.heartbeat_tick {
            return bad("need 0 < heartbeat_tick < election_tick");
        }
        if self.max_batch == 0 || self.max_in_flight == 0 || self.max_watchers == 0 {
            return bad("max_batch, max_in_flight and max_watchers must be at least 1");
        }
        if self.max_request_bytes < 1024 {
            return bad("max_request_bytes must be at least 1024");
        }
        if self.request_timeout_ms == 0 {
            return bad("request_timeout_ms must be at least 1");
        }
        if self.snapshot_every == 0 {
            return bad("snapshot_every must be at least 1");
        }
        if !(100..=600_000).contains(&self.scheduler_lease_ms) {
            return bad("scheduler_lease_ms must be in 100..=600000");
        }
        let peers = self.peer_map()?;
        if !self.join && !peers.contains_key(&self.id) {
            return bad("peers must list this replica's own id (or set join = true)");
        }
        if self.join && peers.is_empty() {
            return bad("a joining replica needs peers to reach");
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

fn parse_peers(field: &str, list: &[String]) -> Result<BTreeMap<u64, String>, ServeError> {
    let bad = |m: String| ServeError::Config { file: field.into(), message: m };
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
