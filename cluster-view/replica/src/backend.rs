//! [`Backend`]: the durable key-value store under the raft log, and its batch of writes.
//!
//! The raft-log logic of [`crate::storage::RaftStorage`] (entry cache, first and last index,
//! snapshot metadata, compaction, `raft::Storage`) knows only this trait, as TiKV's
//! `engine_traits` knows nothing of RocksDB. Two implementations:
//! [`crate::rocks::RocksBackend`] (production) and [`crate::mem::MemBackend`] (the seeded
//! simulation: it models what a crash keeps and can be armed with disk faults).
//!
//! A backend needs four things: point reads, one atomic batch of puts and deletes per write
//! (synced to stable storage when asked: a replica acknowledges nothing it has not synced), a
//! scan of the log entries' key range when the log is loaded at open, and bounded range scans
//! (the ended-job history, [`crate::history`]).

use crate::error::ReplicaError;

/// One put or delete of a [`WriteBatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    /// Sets `key` to `value`.
    Put(Vec<u8>, Vec<u8>),
    /// Removes `key`.
    Delete(Vec<u8>),
}

/// Writes applied together or not at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<WriteOp>,
}

impl WriteBatch {
    /// Sets `key` to `value`.
    pub fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.ops.push(WriteOp::Put(key.as_ref().to_vec(), value.as_ref().to_vec()));
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: impl AsRef<[u8]>) {
        self.ops.push(WriteOp::Delete(key.as_ref().to_vec()));
    }

    /// The writes, in order.
    pub fn ops(&self) -> &[WriteOp] {
        &self.ops
    }

    /// Whether the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A key and its value, as a scan returns them.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// Key prefix of log entries: `ENTRY_PREFIX` + index (8 bytes, big-endian), so a forward scan
/// of the prefix reads the log in index order.
pub const ENTRY_PREFIX: u8 = b'e';

/// The key of the log entry at `index`.
pub fn entry_key(index: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = ENTRY_PREFIX;
    k[1..].copy_from_slice(&index.to_be_bytes());
    k
}

/// The index in an entry key; `None` for any other key.
pub fn entry_index(key: &[u8]) -> Option<u64> {
    match key {
        [ENTRY_PREFIX, rest @ ..] => <[u8; 8]>::try_from(rest).ok().map(u64::from_be_bytes),
        _ => None,
    }
}

/// A durable key-value store for one replica.
pub trait Backend {
    /// The value of `key`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReplicaError>;

    /// Applies `batch` atomically; with `sync`, returns only once it is on stable storage
    /// (and everything written before it). An error means the batch may or may not have been
    /// written: the replica stops and recovers from what is durable.
    fn write(&mut self, batch: WriteBatch, sync: bool) -> Result<(), ReplicaError>;

    /// Every log entry (keys with [`ENTRY_PREFIX`]) in index order: (index, value).
    fn entries(&self) -> Result<Vec<(u64, Vec<u8>)>, ReplicaError>;

    /// Up to `limit` pairs with keys in `from..to`, in key order (the job history's reads).
    fn scan(&self, from: &[u8], to: &[u8], limit: usize) -> Result<Vec<KeyValue>, ReplicaError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_keys_sort_by_index_and_decode() {
        let keys: Vec<[u8; 9]> = [0u64, 1, 255, 256, u64::MAX].iter().map(|&i| entry_key(i)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(entry_index(&entry_key(300)), Some(300));
        assert_eq!(entry_index(b"hs"), None);
        assert_eq!(entry_index(&entry_key(3)[..8]), None);
    }
}
