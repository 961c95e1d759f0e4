//! [`MemBackend`]: an in-memory [`Backend`] that models a disk for the seeded simulation.
//!
//! It keeps apart what a crash keeps and what it may lose: a synced write makes itself and
//! every earlier write durable (as RocksDB's write-ahead log does); writes since the last sync
//! are visible to reads but a crash ([`MemBackend::crash`]) keeps only a prefix of them, chosen
//! by the owner. The owner can arm one [`DiskFault`] that strikes the next synced write: a
//! failed write, a torn one (the process dies in the middle), or a slow fsync that costs
//! virtual time. Clones share one disk: the owner keeps a clone to crash and restart the
//! replica on.

use crate::backend::{Backend, ENTRY_PREFIX, KeyValue, WriteBatch, WriteOp, entry_index};
use crate::error::ReplicaError;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A fault for the next synced write of a [`MemBackend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
    /// The write fails (an I/O error) and writes nothing; the disk refuses every write after
    /// it until the replica is crashed and reopened.
    Fail,
    /// The process dies during the write: the batch is lost, and the owner's crash may lose a
    /// suffix of the earlier unsynced writes too. The write returns an error (the replica
    /// stops); the disk refuses every write after it until the crash.
    Tear,
    /// The write succeeds, but its fsync takes this many units of the owner's virtual time
    /// (collected with [`MemBackend::take_stall`]).
    Slow(u64),
}

#[derive(Debug, Default)]
struct Disk {
    /// What a crash keeps.
    durable: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Writes since the last sync, in order.
    unsynced: Vec<WriteBatch>,
    /// `durable` with `unsynced` applied: what reads see.
    live: BTreeMap<Vec<u8>, Vec<u8>>,
    armed: Option<DiskFault>,
    /// A failed or torn write struck: writes are refused until the crash.
    struck: Option<DiskFault>,
    /// Virtual time owed by slow fsyncs.
    stall: u64,
}

fn apply(map: &mut BTreeMap<Vec<u8>, Vec<u8>>, batch: &WriteBatch) {
    for op in batch.ops() {
        match op {
            WriteOp::Put(k, v) => {
                map.insert(k.clone(), v.clone());
            }
            WriteOp::Delete(k) => {
                map.remove(k);
            }
        }
    }
}

/// A simulated disk (cheap to clone: clones share it).
#[derive(Clone, Debug, Default)]
pub struct MemBackend {
    disk: Arc<Mutex<Disk>>,
}

impl MemBackend {
    /// An empty disk.
    pub fn new() -> MemBackend {
        MemBackend::default()
    }

    fn disk(&self) -> MutexGuard<'_, Disk> {
        // A panic while holding the lock leaves the maps consistent (every change is a whole
        // insert or remove), so the disk stays usable.
        self.disk.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Arms `fault` for the next synced write (replacing one armed before).
    pub fn arm(&self, fault: DiskFault) {
        self.disk().armed = Some(fault);
    }

    /// Disarms a fault armed and not yet struck.
    pub fn disarm(&self) {
        self.disk().armed = None;
    }

    /// The failed or torn write that struck since the last crash, if any: the replica's error
    /// came from the disk, and the owner must crash it.
    pub fn struck(&self) -> Option<DiskFault> {
        self.disk().struck
    }

    /// Virtual time owed by slow fsyncs since the last call.
    pub fn take_stall(&self) -> u64 {
        std::mem::take(&mut self.disk().stall)
    }

    /// Writes since the last sync: what a crash may lose.
    pub fn unsynced(&self) -> usize {
        self.disk().unsynced.len()
    }

    /// The power goes out: of the writes since the last sync, the first `keep` survive (a
    /// torn write itself never does). Disarms any fault. Returns how many writes were lost.
    pub fn crash(&self, keep: usize) -> usize {
        let mut d = self.disk();
        let keep = keep.min(d.unsynced.len());
        let lost = d.unsynced.len() - keep;
        let kept: Vec<WriteBatch> = d.unsynced.drain(..).take(keep).collect();
        let mut durable = std::mem::take(&mut d.durable);
        for b in &kept {
            apply(&mut durable, b);
        }
        d.live = durable.clone();
        d.durable = durable;
        d.armed = None;
        d.struck = None;
        d.stall = 0;
        lost
    }
}

impl Backend for MemBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReplicaError> {
        Ok(self.disk().live.get(key).cloned())
    }

    fn write(&mut self, batch: WriteBatch, sync: bool) -> Result<(), ReplicaError> {
        let mut d = self.disk();
        if let Some(f) = d.struck {
            return Err(ReplicaError::Storage { why: format!("simulated disk is down after {f:?}") });
        }
        if sync && let Some(f) = d.armed.take() {
            match f {
                DiskFault::Fail | DiskFault::Tear => {
                    d.struck = Some(f);
                    return Err(ReplicaError::Storage { why: format!("simulated {f:?} of a synced write") });
                }
                DiskFault::Slow(units) => d.stall += units,
            }
        }
        apply(&mut d.live, &batch);
        if sync {
            let pending = std::mem::take(&mut d.unsynced);
            for b in pending.iter().chain(std::iter::once(&batch)) {
                apply(&mut d.durable, b);
            }
        } else {
            d.unsynced.push(batch);
        }
        Ok(())
    }

    fn entries(&self) -> Result<Vec<(u64, Vec<u8>)>, ReplicaError> {
        let d = self.disk();
        let mut out = Vec::new();
        for (k, v) in d.live.range(vec![ENTRY_PREFIX]..vec![ENTRY_PREFIX + 1]) {
            let index = entry_index(k)
                .ok_or_else(|| ReplicaError::Decode { what: "log entry key", why: format!("{} bytes", k.len()) })?;
            out.push((index, v.clone()));
        }
        Ok(out)
    }

    fn scan(&self, from: &[u8], to: &[u8], limit: usize) -> Result<Vec<KeyValue>, ReplicaError> {
        if from >= to {
            return Ok(Vec::new());
        }
        let d = self.disk();
        Ok(d.live.range(from.to_vec()..to.to_vec()).take(limit).map(|(k, v)| (k.clone(), v.clone())).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::entry_key;

    fn put(k: &[u8], v: &[u8]) -> WriteBatch {
        let mut b = WriteBatch::default();
        b.put(k, v);
        b
    }

    #[test]
    fn a_crash_keeps_synced_writes_and_the_chosen_prefix_of_the_rest() {
        let mut m = MemBackend::new();
        m.write(put(b"a", b"1"), true).expect("write");
        m.write(put(b"b", b"2"), false).expect("write");
        m.write(put(b"c", b"3"), false).expect("write");
        assert_eq!(m.get(b"c").expect("get"), Some(b"3".to_vec()));
        assert_eq!(m.unsynced(), 2);
        assert_eq!(m.crash(1), 1);
        assert_eq!(m.get(b"a").expect("get"), Some(b"1".to_vec()));
        assert_eq!(m.get(b"b").expect("get"), Some(b"2".to_vec()));
        assert_eq!(m.get(b"c").expect("get"), None);
        // A synced write makes the writes before it durable too.
        m.write(put(b"d", b"4"), false).expect("write");
        m.write(put(b"e", b"5"), true).expect("write");
        assert_eq!(m.crash(0), 0);
        assert_eq!(m.get(b"d").expect("get"), Some(b"4".to_vec()));
    }

    #[test]
    fn armed_faults_strike_the_next_synced_write() {
        let mut m = MemBackend::new();
        m.arm(DiskFault::Fail);
        m.write(put(b"a", b"1"), false).expect("unsynced writes pass");
        assert!(m.write(put(b"b", b"2"), true).is_err());
        assert_eq!(m.struck(), Some(DiskFault::Fail));
        assert!(m.write(put(b"c", b"3"), false).is_err(), "the disk is down until the crash");
        assert_eq!(m.get(b"b").expect("get"), None);
        m.crash(usize::MAX);
        assert_eq!(m.struck(), None);
        assert_eq!(m.get(b"a").expect("get"), Some(b"1".to_vec()));

        m.arm(DiskFault::Tear);
        assert!(m.write(put(b"t", b"1"), true).is_err());
        assert_eq!(m.struck(), Some(DiskFault::Tear));
        m.crash(usize::MAX);
        assert_eq!(m.get(b"t").expect("get"), None, "a torn write never survives");

        m.arm(DiskFault::Slow(7));
        m.write(put(b"s", b"1"), true).expect("slow writes succeed");
        assert_eq!(m.take_stall(), 7);
        assert_eq!(m.take_stall(), 0);
    }

    #[test]
    fn entries_scan_only_the_log_in_index_order() {
        let mut m = MemBackend::new();
        let mut b = WriteBatch::default();
        b.put(entry_key(2), b"two");
        b.put(entry_key(1), b"one");
        b.put(b"hs", b"x");
        b.put(b"f", b"after the log prefix");
        m.write(b, true).expect("write");
        let got = m.entries().expect("entries");
        assert_eq!(got, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
    }
}
