//! [`RocksBackend`]: the production [`Backend`], one RocksDB instance per replica (default
//! column family). A synced write syncs RocksDB's write-ahead log before it returns.

use crate::backend::{Backend, ENTRY_PREFIX, KeyValue, WriteBatch, WriteOp, entry_index, entry_key};
use crate::error::ReplicaError;
use rocksdb::{DB, Direction, IteratorMode, Options, WriteOptions};
use std::path::Path;

impl From<rocksdb::Error> for ReplicaError {
    fn from(e: rocksdb::Error) -> ReplicaError {
        ReplicaError::Storage { why: e.into_string() }
    }
}

/// A replica's RocksDB.
pub struct RocksBackend {
    db: DB,
}

impl std::fmt::Debug for RocksBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksBackend").field("path", &self.db.path()).finish()
    }
}

impl RocksBackend {
    /// Opens (or creates) the database in `dir`.
    pub fn open(dir: &Path) -> Result<RocksBackend, ReplicaError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        Ok(RocksBackend { db: DB::open(&opts, dir)? })
    }
}

impl Backend for RocksBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReplicaError> {
        Ok(self.db.get(key)?)
    }

    fn write(&mut self, batch: WriteBatch, sync: bool) -> Result<(), ReplicaError> {
        let mut b = rocksdb::WriteBatch::default();
        for op in batch.ops() {
            match op {
                WriteOp::Put(k, v) => b.put(k, v),
                WriteOp::Delete(k) => b.delete(k),
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(b, &wo)?;
        Ok(())
    }

    fn entries(&self) -> Result<Vec<(u64, Vec<u8>)>, ReplicaError> {
        let mut out = Vec::new();
        for item in self.db.iterator(IteratorMode::From(&entry_key(0), Direction::Forward)) {
            let (k, v) = item?;
            if k.first() != Some(&ENTRY_PREFIX) {
                break;
            }
            let index = entry_index(&k)
                .ok_or_else(|| ReplicaError::Decode { what: "log entry key", why: format!("{} bytes", k.len()) })?;
            out.push((index, v.into_vec()));
        }
        Ok(out)
    }

    fn scan(&self, from: &[u8], to: &[u8], limit: usize) -> Result<Vec<KeyValue>, ReplicaError> {
        let mut out = Vec::new();
        for item in self.db.iterator(IteratorMode::From(from, Direction::Forward)) {
            let (k, v) = item?;
            if out.len() >= limit || &*k >= to {
                break;
            }
            out.push((k.into_vec(), v.into_vec()));
        }
        Ok(out)
    }
}
