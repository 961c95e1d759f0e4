//! # tessera-replica: one replica of the cluster view
//!
//! The view state machine of `tessera-view`, replicated with raft-rs, persisted in RocksDB.
//!
//! | module | what it holds |
//! |---|---|
//! | [`storage`] | [`RocksStorage`]: raft log, hard state, conf state, snapshots in RocksDB |
//! | [`replica`] | [`Replica`]: the RawNode driver — tick, step, propose, ready → persist, apply, send; the leader's pre-check and batching |
//! | [`codec`] | commands, snapshots and entry contexts as bytes |
//! | [`logger`] | raft-rs's `slog` records into `tracing` |
//! | [`error`] | [`ReplicaError`] |
//!
//! The replica owns no thread, socket or clock: its owner drives it, so the same code runs in
//! the server and in the deterministic fault tests (`tests/sim.rs`).

pub mod codec;
pub mod error;
pub mod logger;
pub mod replica;
pub mod storage;

pub use error::ReplicaError;
pub use replica::{Answer, Replica, ReplicaConfig, Ticket};
pub use storage::RocksStorage;
