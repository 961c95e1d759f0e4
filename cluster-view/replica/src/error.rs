//! The replica's error type. Variants say what the caller should do.

use thiserror::Error;

/// Errors of a replica.
#[derive(Debug, Error)]
pub enum ReplicaError {
    /// This replica does not lead; send writes to `leader_hint` (0 if unknown).
    #[error("not the leader (leader hint: replica {leader_hint})")]
    NotLeader {
        /// The leader as this replica knows it, 0 if unknown.
        leader_hint: u64,
    },
    /// The data directory belongs to another cluster or replica; refuse to start.
    #[error(
        "data directory {dir} belongs to cluster `{found_cluster}` replica {found_replica}, not cluster `{cluster}` replica {replica}"
    )]
    WrongDataDir {
        /// The directory.
        dir: String,
        /// The cluster this replica was started for.
        cluster: String,
        /// Its replica id.
        replica: u64,
        /// The cluster recorded in the directory.
        found_cluster: String,
        /// The replica id recorded in the directory.
        found_replica: u64,
    },
    /// The storage backend failed (RocksDB, or a simulated disk fault): the replica stops and
    /// recovers from what is durable when reopened.
    #[error("storage: {why}")]
    Storage {
        /// What the backend said.
        why: String,
    },
    /// Raft refused an operation.
    #[error(transparent)]
    Raft(#[from] raft::Error),
    /// Stored or received bytes could not be decoded (corruption or a version mismatch).
    #[error("decode {what}: {why}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// Why it failed.
        why: String,
    },
    /// A value could not be encoded for the log, a snapshot or the wire. Nothing was written;
    /// the replica stops (a bug: no value is known to fail).
    #[error("encode {what}: {why}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// Why it failed.
        why: String,
    },
    /// A snapshot (from the leader, or the one stored) breaks the view's invariants: it was
    /// refused and nothing was replaced.
    #[error("snapshot at index {index} refused: {why}")]
    BadSnapshot {
        /// The snapshot's raft index.
        index: u64,
        /// The first broken rule.
        why: String,
    },
    /// The request is not one the replica takes.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Too many proposals wait for commit; retry after a backoff.
    #[error("too many proposals in flight ({0}); retry later")]
    Busy(usize),
}
