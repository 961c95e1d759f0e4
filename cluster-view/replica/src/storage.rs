//! [`RaftStorage`]: the raft log, hard state, conf state and the latest snapshot, over a
//! durable key-value [`Backend`] (RocksDB in production, [`crate::mem::MemBackend`] in the
//! seeded simulation).
//!
//! Layout (keys of the backend):
//!
//! | key | value |
//! |---|---|
//! | `e` + index (8 bytes, big-endian) | a log entry (raft protobuf) |
//! | `hs` | hard state |
//! | `cs` | conf state |
//! | `sm` | metadata of the latest snapshot (index, term, conf state) |
//! | `sd` | data of the latest snapshot (the view at that index) |
//! | `pt` | term of the entry just before the log's first (raft asks for it) |
//! | `id` | `cluster-name/replica-id`, written once; a mismatch refuses to open |
//! | `bt` | how many times this replica has been opened (its incarnation) |
//!
//! The log may start before the snapshot's index: compaction snapshots the applied state and
//! keeps a tail of older entries, so a follower a little behind catches up from the log rather
//! than by a whole snapshot (as etcd does). Entries are also cached in memory (write-through),
//! so `Storage` reads never touch the disk; compaction bounds the cache. Writes are synced when `sync` is set: a replica
//! acknowledges nothing it has not persisted. Encoding a record can fail only on a bug; it
//! fails the write (never writes empty bytes), and the replica stops.

use crate::backend::{Backend, WriteBatch, entry_key};
use crate::error::ReplicaError;
use crate::rocks::RocksBackend;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};
use std::path::Path;

const K_HARD: &[u8] = b"hs";
const K_CONF: &[u8] = b"cs";
const K_SNAP_META: &[u8] = b"sm";
const K_SNAP_DATA: &[u8] = b"sd";
const K_ID: &[u8] = b"id";
const K_PREV_TERM: &[u8] = b"pt";
const K_BOOT: &[u8] = b"bt";

fn decode<M: protobuf::Message>(what: &'static str, bytes: &[u8]) -> Result<M, ReplicaError> {
    M::parse_from_bytes(bytes).map_err(|e| ReplicaError::Decode { what, why: e.to_string() })
}

fn encode(what: &'static str, m: &impl protobuf::Message) -> Result<Vec<u8>, ReplicaError> {
    crate::codec::encode_proto(what, m)
}

fn decode_u64(what: &'static str, b: &[u8]) -> Result<u64, ReplicaError> {
    <[u8; 8]>::try_from(b)
        .map(u64::from_be_bytes)
        .map_err(|_| ReplicaError::Decode { what, why: format!("{} bytes, not 8", b.len()) })
}

/// Raft storage on RocksDB: the production storage.
pub type RocksStorage = RaftStorage<RocksBackend>;

/// Raft storage for one replica over the backend `B`.
pub struct RaftStorage<B: Backend> {
    db: B,
    sync: bool,
    hard: HardState,
    conf: ConfState,
    snap_meta: SnapshotMetadata,
    snap_data: Vec<u8>,
    /// Index of `entries[0]` (or `snapshot index + 1` when empty); never above that.
    first_idx: u64,
    /// The log, contiguous from `first_idx`.
    entries: Vec<Entry>,
    /// Term of the entry at `first_idx - 1`.
    prev_term: u64,
    /// This opening's incarnation number (1 for the first).
    boot: u64,
}

impl<B: Backend> std::fmt::Debug for RaftStorage<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftStorage")
            .field("first_index", &self.first())
            .field("last_index", &self.last())
            .field("snapshot_index", &self.snap_meta.index)
            .finish()
    }
}

impl RaftStorage<RocksBackend> {
    /// Opens (or creates) the storage in the RocksDB directory `dir` for replica `replica` of
    /// cluster `cluster`. A directory written by another cluster or replica is refused.
    pub fn open(dir: &Path, cluster: &str, replica: u64, sync: bool) -> Result<RocksStorage, ReplicaError> {
        RaftStorage::with_backend(RocksBackend::open(dir)?, &dir.display().to_string(), cluster, replica, sync)
    }
}

impl<B: Backend> RaftStorage<B> {
    /// Opens the storage held by `db` (named `place` in errors) for replica `replica` of
    /// cluster `cluster`: loads the log and the latest snapshot, counts this incarnation. A
    /// backend written by another cluster or replica is refused.
    pub fn with_backend(
        mut db: B,
        place: &str,
        cluster: &str,
        replica: u64,
        sync: bool,
    ) -> Result<RaftStorage<B>, ReplicaError> {
        let id = format!("{cluster}/{replica}");
        match db.get(K_ID)? {
            None => {
                let mut batch = WriteBatch::default();
                batch.put(K_ID, id.as_bytes());
                write(&mut db, batch, true)?;
            }
            Some(found) if found == id.as_bytes() => {}
            Some(found) => {
                let found = String::from_utf8_lossy(&found).into_owned();
                let (fc, fr) = found.rsplit_once('/').unwrap_or((found.as_str(), "0"));
                return Err(ReplicaError::WrongDataDir {
                    dir: place.to_string(),
                    cluster: cluster.to_string(),
                    replica,
                    found_cluster: fc.to_string(),
                    found_replica: fr.parse().unwrap_or(0),
                });
            }
        }
        let hard = match db.get(K_HARD)? {
            Some(b) => decode("hard state", &b)?,
            None => HardState::default(),
        };
        let conf = match db.get(K_CONF)? {
            Some(b) => decode("conf state", &b)?,
            None => ConfState::default(),
        };
        let snap_meta: SnapshotMetadata = match db.get(K_SNAP_META)? {
            Some(b) => decode("snapshot metadata", &b)?,
            None => SnapshotMetadata::default(),
        };
        let snap_data = db.get(K_SNAP_DATA)?.unwrap_or_default();
        let mut entries: Vec<Entry> = Vec::new();
        for (index, v) in db.entries()? {
            let e: Entry = decode("log entry", &v)?;
            if e.index != index {
                return Err(ReplicaError::Decode {
                    what: "log",
                    why: format!("entry {} stored under index {index}", e.index),
                });
            }
            if let Some(prev) = entries.last()
                && e.index != prev.index + 1
            {
                return Err(ReplicaError::Decode {
                    what: "log",
                    why: format!("gap: index {} follows {}", e.index, prev.index),
                });
            }
            entries.push(e);
        }
        let first_idx = entries.first().map_or(snap_meta.index + 1, |e| e.index);
        if first_idx > snap_meta.index + 1 {
            return Err(ReplicaError::Decode {
                what: "log",
                why: format!("log starts at {first_idx}, after the snapshot at {}", snap_meta.index),
            });
        }
        let prev_term = if first_idx == snap_meta.index + 1 {
            snap_meta.term
        } else {
            match db.get(K_PREV_TERM)? {
                Some(b) => decode_u64("term before the first entry", &b)?,
                None => {
                    return Err(ReplicaError::Decode {
                        what: "log",
                        why: "missing term before the first entry".into(),
                    });
                }
            }
        };
        let boot = match db.get(K_BOOT)? {
            Some(b) => decode_u64("incarnation", &b)? + 1,
            None => 1,
        };
        let mut batch = WriteBatch::default();
        batch.put(K_BOOT, boot.to_be_bytes());
        write(&mut db, batch, true)?;
        Ok(RaftStorage { db, sync, hard, conf, snap_meta, snap_data, first_idx, entries, prev_term, boot })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.db
    }

    /// Writes `batch` without syncing (state outside the raft log that a replay rebuilds: the
    /// history of ended jobs).
    pub fn write_unsynced(&mut self, batch: WriteBatch) -> Result<(), ReplicaError> {
        self.db.write(batch, false)
    }

    fn first(&self) -> u64 {
        self.first_idx
    }

    fn last(&self) -> u64 {
        (self.first_idx + self.entries.len() as u64).saturating_sub(1).max(self.snap_meta.index)
    }

    /// This opening's incarnation number: entries a replica proposed in an earlier life carry
    /// another one, so their outcomes are not reported to this life's clients.
    pub fn boot(&self) -> u64 {
        self.boot
    }

    /// Whether this storage has never held any state (a brand new replica).
    pub fn is_empty(&self) -> bool {
        self.last() == 0 && self.hard == HardState::default() && self.conf == ConfState::default()
    }

    /// The hard state.
    pub fn hard_state(&self) -> &HardState {
        &self.hard
    }

    /// The conf state.
    pub fn conf_state(&self) -> &ConfState {
        &self.conf
    }

    /// The latest snapshot's metadata and data.
    pub fn latest_snapshot(&self) -> (&SnapshotMetadata, &[u8]) {
        (&self.snap_meta, &self.snap_data)
    }

    /// Writes the bootstrap state of a new replica: the voters and the initial view as the
    /// snapshot. A founding voter's snapshot is at index 1, term 1 (with the voters in it), so
    /// its log starts at 2 and a replica that joins later (bootstrapped empty, at index 0, with
    /// no voters) can only catch up through a snapshot, which carries the membership; replaying
    /// the log from its start would give the newcomer a voter set of its own.
    pub fn bootstrap(&mut self, cs: ConfState, data: Vec<u8>) -> Result<(), ReplicaError> {
        let mut meta = SnapshotMetadata::default();
        meta.set_conf_state(cs.clone());
        let founder = !cs.voters.is_empty();
        let mut hs = self.hard.clone();
        if founder {
            meta.index = 1;
            meta.term = 1;
            hs.term = hs.term.max(1);
            hs.commit = hs.commit.max(1);
        }
        let mut batch = WriteBatch::default();
        batch.put(K_CONF, encode("conf state", &cs)?);
        batch.put(K_SNAP_META, encode("snapshot metadata", &meta)?);
        batch.put(K_SNAP_DATA, &data);
        batch.put(K_HARD, encode("hard state", &hs)?);
        write(&mut self.db, batch, true)?;
        self.conf = cs;
        self.first_idx = meta.index + 1;
        self.prev_term = meta.term;
        self.hard = hs;
        self.snap_meta = meta;
        self.snap_data = data;
        Ok(())
    }

    /// Appends entries (overwriting a conflicting suffix) and persists them.
    pub fn append(&mut self, ents: &[Entry]) -> Result<(), ReplicaError> {
        self.persist(ents, None)
    }

    /// Appends entries (overwriting a conflicting suffix) and records the hard state, in one
    /// write with one fsync: the durable step of a raft ready.
    pub fn persist(&mut self, ents: &[Entry], hs: Option<HardState>) -> Result<(), ReplicaError> {
        let Some(first) = ents.first() else {
            if let Some(hs) = hs {
                self.set_hard_state(hs)?;
            }
            return Ok(());
        };
        if first.index < self.first() || first.index > self.last() + 1 {
            return Err(ReplicaError::Decode {
                what: "append",
                why: format!("entries start at {} but the log holds {}..={}", first.index, self.first(), self.last()),
            });
        }
        let mut batch = WriteBatch::default();
        // Remove the overwritten suffix from disk.
        let new_last = ents[ents.len() - 1].index;
        for i in (new_last + 1)..=self.last() {
            batch.delete(entry_key(i));
        }
        for e in ents {
            batch.put(entry_key(e.index), encode("log entry", e)?);
        }
        if let Some(hs) = &hs {
            batch.put(K_HARD, encode("hard state", hs)?);
        }
        write(&mut self.db, batch, self.sync)?;
        self.entries.truncate((first.index - self.first()) as usize);
        self.entries.extend_from_slice(ents);
        if let Some(hs) = hs {
            self.hard = hs;
        }
        Ok(())
    }

    /// Persists the hard state.
    pub fn set_hard_state(&mut self, hs: HardState) -> Result<(), ReplicaError> {
        self.put_hard(hs, self.sync)
    }

    /// Records the commit index alone, without an fsync: a commit index lost in a crash is
    /// learnt again from the leader (raft only needs term and vote to be durable).
    pub fn set_commit(&mut self, commit: u64) -> Result<(), ReplicaError> {
        let hs = HardState { commit, ..self.hard.clone() };
        self.put_hard(hs, false)
    }

    fn put_hard(&mut self, hs: HardState, sync: bool) -> Result<(), ReplicaError> {
        let mut batch = WriteBatch::default();
        batch.put(K_HARD, encode("hard state", &hs)?);
        write(&mut self.db, batch, sync)?;
        self.hard = hs;
        Ok(())
    }

    /// Persists the conf state.
    pub fn set_conf_state(&mut self, cs: ConfState) -> Result<(), ReplicaError> {
        let mut batch = WriteBatch::default();
        batch.put(K_CONF, encode("conf state", &cs)?);
        write(&mut self.db, batch, self.sync)?;
        self.conf = cs;
        Ok(())
    }

    /// Installs a snapshot received from the leader: replaces the log and the snapshot.
    pub fn apply_snapshot(&mut self, snap: &Snapshot) -> Result<(), ReplicaError> {
        let meta = snap.get_metadata();
        if meta.index < self.snap_meta.index {
            return Err(ReplicaError::Raft(raft::Error::Store(StorageError::SnapshotOutOfDate)));
        }
        let mut batch = WriteBatch::default();
        for i in self.first()..=self.last() {
            batch.delete(entry_key(i));
        }
        let mut hs = self.hard.clone();
        hs.term = hs.term.max(meta.term);
        hs.commit = meta.index;
        batch.put(K_SNAP_META, encode("snapshot metadata", meta)?);
        batch.put(K_SNAP_DATA, snap.get_data());
        batch.put(K_HARD, encode("hard state", &hs)?);
        batch.put(K_CONF, encode("conf state", meta.get_conf_state())?);
        write(&mut self.db, batch, self.sync)?;
        self.entries.clear();
        self.first_idx = meta.index + 1;
        self.prev_term = meta.term;
        self.hard = hs;
        self.conf = meta.get_conf_state().clone();
        self.snap_meta = meta.clone();
        self.snap_data = snap.get_data().to_vec();
        Ok(())
    }

    /// Records `data`, the applied state at `index` (an index in the log), as the latest
    /// snapshot, then drops the log before `index + 1 - keep`: the last `keep` entries up to the
    /// snapshot stay for followers slightly behind.
    pub fn compact(&mut self, index: u64, data: Vec<u8>, keep: u64) -> Result<(), ReplicaError> {
        if index <= self.snap_meta.index || index > self.last() || index < self.first() {
            return Ok(());
        }
        let mut meta = SnapshotMetadata { index, term: raft::Storage::term(self, index)?, ..Default::default() };
        meta.set_conf_state(self.conf.clone());
        let new_first = (index + 1).saturating_sub(keep).max(self.first_idx);
        let drop = (new_first - self.first_idx) as usize;
        let prev_term = raft::Storage::term(self, new_first - 1)?;
        let mut batch = WriteBatch::default();
        batch.put(K_SNAP_META, encode("snapshot metadata", &meta)?);
        batch.put(K_SNAP_DATA, &data);
        batch.put(K_PREV_TERM, prev_term.to_be_bytes());
        for e in &self.entries[..drop] {
            batch.delete(entry_key(e.index));
        }
        write(&mut self.db, batch, self.sync)?;
        self.entries.drain(..drop);
        self.first_idx = new_first;
        self.prev_term = prev_term;
        self.snap_meta = meta;
        self.snap_data = data;
        Ok(())
    }

    /// Entries held in the log.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }
}

/// Writes `batch` through the backend; the synced write is the fsync boundary (fail point
/// `replica::sync_write`).
fn write<B: Backend>(db: &mut B, batch: WriteBatch, sync: bool) -> Result<(), ReplicaError> {
    if sync {
        crate::fail_point!("replica::sync_write", |_| Err(ReplicaError::Storage {
            why: "fail point sync_write".into()
        }));
    }
    db.write(batch, sync)
}

impl<B: Backend> raft::Storage for RaftStorage<B> {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState { hard_state: self.hard.clone(), conf_state: self.conf.clone() })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let lo = (low - self.first()) as usize;
        let hi = (high - self.first()) as usize;
        let mut out = self.entries[lo..hi].to_vec();
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx >= self.first() && idx < self.first() + self.entries.len() as u64 {
            return Ok(self.entries[(idx - self.first()) as usize].term);
        }
        if idx == self.snap_meta.index {
            return Ok(self.snap_meta.term);
        }
        if idx + 1 == self.first() {
            return Ok(self.prev_term);
        }
        if idx < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        Err(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snap_meta.index < request_index || self.snap_data.is_empty() {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        let mut s = Snapshot::default();
        s.set_metadata(self.snap_meta.clone());
        s.set_data(self.snap_data.clone().into());
        Ok(s)
    }
}
