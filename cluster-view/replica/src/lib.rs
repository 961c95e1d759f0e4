//! # tessera-replica: one replica of the cluster view
//!
//! The view state machine of `tessera-view`, replicated with raft-rs, persisted through a
//! storage [`Backend`]: RocksDB in production, an in-memory simulated disk in the seeded
//! simulation.
//!
//! | module | what it holds |
//! |---|---|
//! | [`storage`] | [`RaftStorage`]: raft log, hard state, conf state, snapshots over a [`Backend`]; [`RocksStorage`] on RocksDB |
//! | [`backend`] | [`Backend`]: the durable key-value store under it (get, atomic batch with a sync flag, log scan, range scan) |
//! | [`history`] | the history of ended jobs the view forgot: written at apply, by end time, pruned past the retention |
//! | [`rocks`] | [`RocksBackend`]: the backend on RocksDB |
//! | [`mem`] | [`MemBackend`]: an in-memory disk that models what a crash keeps, with armable faults |
//! | [`replica`] | [`Replica`]: the RawNode driver — tick, step, propose, ready → persist, apply, send; the leader's pre-check and batching |
//! | [`clock`] | [`LeaderClock`]: the clock a leader writes into each entry, elapsed time on its monotonic clock, slewed toward its wall clock |
//! | [`codec`] | commands, snapshots and entry contexts as bytes |
//! | `forged` (private) | raft messages no correct peer sends, dropped before raft-rs sees them |
//! | [`logger`] | raft-rs's `slog` records into `tracing` |
//! | [`error`] | [`ReplicaError`] |
//!
//! The replica owns no thread or socket, and reads clocks only to stamp its entries: its owner drives it, so the same code runs in
//! the server and in the deterministic fault tests (`tests/sim.rs`). Its only I/O is its
//! storage: [`Replica::on_ready`] writes (and fsyncs) through the backend before it returns
//! (the history of ended jobs unsynced: a replay rebuilds it).
//!
//! With the `failpoints` feature, `fail` crate fail points sit at the storage and apply
//! boundaries: `replica::sync_write` (every synced write: the fsync), `replica::install_snapshot`
//! (a snapshot from the leader, checked, before it replaces anything),
//! `replica::compact_snapshot` (before a compaction snapshot is written), `replica::apply`
//! (before each committed entry is applied) and `replica::encode` (encoding of commands and
//! snapshots). Each one, set to `return`, makes the operation fail with a [`ReplicaError`].

/// A `fail` crate fail point, compiled in only with the `failpoints` feature.
macro_rules! fail_point {
    ($name:expr) => {{
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name);
    }};
    ($name:expr, $e:expr) => {{
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, $e);
    }};
}
pub(crate) use fail_point;

pub mod backend;
pub mod clock;
pub mod codec;
pub mod error;
mod forged;
pub mod history;
pub mod logger;
pub mod mem;
pub mod replica;
pub mod rocks;
pub mod storage;

pub use backend::Backend;
pub use clock::LeaderClock;
pub use error::ReplicaError;
pub use mem::{DiskFault, MemBackend};
pub use replica::{Answer, Replica, ReplicaConfig, Ticket};
pub use rocks::RocksBackend;
pub use storage::{RaftStorage, RocksStorage};
