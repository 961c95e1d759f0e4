//! Helpers shared by the replica's integration tests on real RocksDB.

use std::path::Path;
use tessera_replica::{Replica, ReplicaConfig};
use tessera_view::ClusterView;

/// A single-voter replica of cluster `cluster` on RocksDB in `dir` (synced writes, a snapshot
/// every `snapshot_every` entries, one entry kept behind it), leading.
pub fn single_voter_leader(cluster: &str, dir: &Path, snapshot_every: u64, initial: fn() -> ClusterView) -> Replica {
    let mut cfg = ReplicaConfig::new(1, vec![1], cluster);
    cfg.snapshot_every = snapshot_every;
    cfg.keep_entries = 1;
    let mut r = Replica::open(cfg, dir, initial).expect("open");
    r.campaign().expect("campaign");
    for _ in 0..10 {
        r.on_ready().expect("ready");
        if r.is_leader() {
            // Settle the leader's empty entry.
            r.on_ready().expect("ready");
            return r;
        }
    }
    panic!("a single voter did not lead");
}
