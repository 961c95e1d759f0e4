//! The history of ended jobs that outlives the view: every job the view forgets (ended, and
//! past the newest `jobs_kept` ended ones) is written to this replica's store, keyed by its end
//! time, and kept for the cluster's accounting retention.
//!
//! Every replica applies the same log and so forgets the same jobs in the same order: each
//! writes its own history, with no raft traffic of its own. Writes are not synced: a crash can
//! lose the latest ones, but the replica then replays its log from its last snapshot (synced,
//! with everything written before it) and forgets, and writes, the same jobs again (a put per
//! key: idempotent). A replica that catches up by installing a leader's snapshot never applies
//! the entries in between, so the jobs forgotten there are missing from its history (the other
//! replicas have them).
//!
//! Keys: [`TIME_PREFIX`] + end time (Unix ms, big-endian) + job id (big-endian) → the job
//! (JSON), so that a forward scan reads jobs in the order they ended; [`ID_PREFIX`] + job id →
//! its end time, to find one job. Neither prefix meets the raft log's keys.

use crate::backend::{Backend, WriteBatch};
use crate::error::ReplicaError;
use tessera_view::{Job, JobId};

/// Key prefix of the records by end time.
pub const TIME_PREFIX: u8 = b'H';
/// Key prefix of the index by job id.
pub const ID_PREFIX: u8 = b'J';
/// The most jobs one page holds.
pub const MAX_PAGE: usize = 10_000;
/// The most records one page reads past those it keeps (a filter that keeps few jobs answers
/// with a cursor to go on from instead of scanning the whole history at once).
pub const MAX_SCANNED: usize = 100_000;
/// The most records one prune removes: the work per applied batch stays bounded, and what is
/// left goes at the next prune.
pub const PRUNE_BATCH: usize = 1_000;

/// Where a page ends: the end time and id of its last job; the next page starts after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    /// Its end time, Unix ms.
    pub ended_ms: u64,
    /// Its id.
    pub job: JobId,
}

/// Which ended jobs a page holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// Jobs that ended at or after this time (Unix ms).
    pub from_ms: u64,
    /// ... and before this one (Unix ms; 0: no bound).
    pub to_ms: u64,
    /// Only jobs of these tenants (`None`: every tenant).
    pub tenants: Option<Vec<String>>,
    /// Only this submitter's jobs.
    pub user: Option<String>,
    /// Only jobs after this one, in end order (the previous page's `next`).
    pub after: Option<Cursor>,
    /// At most this many jobs (0 or above [`MAX_PAGE`]: [`MAX_PAGE`]).
    pub limit: usize,
}

impl Query {
    fn keeps(&self, j: &Job) -> bool {
        self.tenants.as_ref().is_none_or(|ts| ts.contains(&j.spec.tenant))
            && self.user.as_ref().is_none_or(|u| *u == j.user)
    }
}

/// One page of the history, in end order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Page {
    /// The jobs.
    pub jobs: Vec<Job>,
    /// Where the next page starts; `None` on the last.
    pub next: Option<Cursor>,
}

fn time_key(c: Cursor) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = TIME_PREFIX;
    k[1..9].copy_from_slice(&c.ended_ms.to_be_bytes());
    k[9..].copy_from_slice(&c.job.0.to_be_bytes());
    k
}

fn id_key(job: JobId) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = ID_PREFIX;
    k[1..].copy_from_slice(&job.0.to_be_bytes());
    k
}

fn cursor_of(key: &[u8]) -> Result<Cursor, ReplicaError> {
    let bad = || ReplicaError::Decode { what: "history key", why: format!("{} bytes", key.len()) };
    let rest = key.strip_prefix(&[TIME_PREFIX]).ok_or_else(bad)?;
    let ended: [u8; 8] = rest.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(bad)?;
    let job: [u8; 8] = rest.get(8..).and_then(|b| b.try_into().ok()).ok_or_else(bad)?;
    Ok(Cursor { ended_ms: u64::from_be_bytes(ended), job: JobId(u64::from_be_bytes(job)) })
}

fn decode(bytes: &[u8]) -> Result<Job, ReplicaError> {
    serde_json::from_slice(bytes).map_err(|e| ReplicaError::Decode { what: "history record", why: e.to_string() })
}

/// Adds the records of `jobs` (forgotten by the view) to `batch`.
pub fn record(batch: &mut WriteBatch, jobs: &[Job]) -> Result<(), ReplicaError> {
    for j in jobs {
        let value =
            serde_json::to_vec(j).map_err(|e| ReplicaError::Encode { what: "history record", why: e.to_string() })?;
        let at = Cursor { ended_ms: j.times.ended_ms, job: j.id };
        batch.put(time_key(at), value);
        batch.put(id_key(j.id), at.ended_ms.to_be_bytes());
    }
    Ok(())
}

/// Adds to `batch` the removal of up to [`PRUNE_BATCH`] records of jobs that ended before
/// `before_ms`, oldest first; returns how many.
pub fn prune<B: Backend>(db: &B, before_ms: u64, batch: &mut WriteBatch) -> Result<usize, ReplicaError> {
    let old = db.scan(&[TIME_PREFIX], &time_key(Cursor { ended_ms: before_ms, job: JobId(0) }), PRUNE_BATCH)?;
    for (k, _) in &old {
        batch.delete(k);
        batch.delete(id_key(cursor_of(k)?.job));
    }
    Ok(old.len())
}

/// Job `id`, if the history has it.
pub fn job<B: Backend>(db: &B, id: JobId) -> Result<Option<Job>, ReplicaError> {
    let Some(ended) = db.get(&id_key(id))? else { return Ok(None) };
    let ended_ms = <[u8; 8]>::try_from(ended.as_slice())
        .map(u64::from_be_bytes)
        .map_err(|_| ReplicaError::Decode { what: "history index", why: format!("{} bytes", ended.len()) })?;
    db.get(&time_key(Cursor { ended_ms, job: id }))?.map(|v| decode(&v)).transpose()
}

/// One page of the jobs `q` asks for, in end order.
pub fn page<B: Backend>(db: &B, q: &Query) -> Result<Page, ReplicaError> {
    let limit = if q.limit == 0 { MAX_PAGE } else { q.limit.min(MAX_PAGE) };
    let start = match q.after {
        // The key right after the cursor's.
        Some(c) => {
            let mut k = time_key(c).to_vec();
            k.push(0);
            k
        }
        None => time_key(Cursor { ended_ms: q.from_ms, job: JobId(0) }).to_vec(),
    };
    let end = match q.to_ms {
        0 => vec![TIME_PREFIX + 1],
        to => time_key(Cursor { ended_ms: to, job: JobId(0) }).to_vec(),
    };
    let mut out = Page::default();
    let mut from = start;
    let mut scanned = 0;
    loop {
        let chunk = db.scan(&from, &end, 1_000)?;
        let Some((last, _)) = chunk.last() else { return Ok(out) };
        from = last.clone();
        from.push(0);
        for (k, v) in &chunk {
            scanned += 1;
            let j = decode(v)?;
            if q.keeps(&j) {
                out.jobs.push(j);
            }
            if out.jobs.len() == limit || scanned == MAX_SCANNED {
                // More may follow: the next page starts after this record.
                out.next = Some(cursor_of(k)?);
                return Ok(out);
            }
        }
        if chunk.len() < 1_000 {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemBackend;
    use tessera_view::JobSpec;

    fn ended(id: u64, at_ms: u64, tenant: &str) -> Job {
        let mut view = tessera_view::ClusterView::from_spec(&tessera_view::ClusterSpec::uniform(
            tessera_view::Topology::preset("seed-8gpu").expect("preset"),
            1,
            1,
            1,
        ));
        let spec = JobSpec { tenant: tenant.into(), ..JobSpec::simple(&format!("j{id}"), 1, 1) };
        let first = view.submit(spec).expect("admitted");
        let mut j = view.job(first).expect("job").clone();
        j.id = JobId(id);
        j.times.ended_ms = at_ms;
        j
    }

    fn write(db: &mut MemBackend, jobs: &[Job]) {
        let mut b = WriteBatch::default();
        record(&mut b, jobs).expect("encode");
        db.write(b, false).expect("write");
    }

    #[test]
    fn pages_follow_end_order_filters_and_cursors() {
        let mut db = MemBackend::new();
        // Ended out of id order; two at the same millisecond.
        let jobs = [ended(5, 100, "a"), ended(2, 300, "b"), ended(9, 200, "a"), ended(3, 200, "a"), ended(7, 400, "b")];
        write(&mut db, &jobs);
        let ids = |p: &Page| p.jobs.iter().map(|j| j.id.0).collect::<Vec<_>>();
        let all = page(&db, &Query::default()).expect("page");
        assert_eq!((ids(&all), all.next), (vec![5, 3, 9, 2, 7], None));
        let q = Query { limit: 2, ..Query::default() };
        let p1 = page(&db, &q).expect("page");
        assert_eq!((ids(&p1), p1.next), (vec![5, 3], Some(Cursor { ended_ms: 200, job: JobId(3) })));
        let p2 = page(&db, &Query { after: p1.next, ..q.clone() }).expect("page");
        assert_eq!(ids(&p2), vec![9, 2]);
        let p3 = page(&db, &Query { after: p2.next, ..q }).expect("page");
        assert_eq!((ids(&p3), p3.next), (vec![7], None));
        let range = page(&db, &Query { from_ms: 200, to_ms: 400, ..Query::default() }).expect("page");
        assert_eq!(ids(&range), vec![3, 9, 2]);
        let b = page(&db, &Query { tenants: Some(vec!["b".into()]), ..Query::default() }).expect("page");
        assert_eq!(ids(&b), vec![2, 7]);
        assert_eq!(job(&db, JobId(9)).expect("read").map(|j| j.times.ended_ms), Some(200));
        assert_eq!(job(&db, JobId(4)).expect("read"), None);
        // Written again (a replay after a crash): the same records, nothing twice.
        write(&mut db, &jobs);
        assert_eq!(ids(&page(&db, &Query::default()).expect("page")), vec![5, 3, 9, 2, 7]);
    }

    #[test]
    fn a_prune_removes_the_jobs_that_ended_before_its_bound_and_their_index() {
        let mut db = MemBackend::new();
        let jobs: Vec<Job> = (1..=2_500).map(|i| ended(i, i * 10, "a")).collect();
        write(&mut db, &jobs);
        // Bounded work: at most PRUNE_BATCH a call.
        let mut removed = 0;
        loop {
            let mut b = WriteBatch::default();
            let n = prune(&db, 20_000, &mut b).expect("prune");
            db.write(b, false).expect("write");
            assert!(n <= PRUNE_BATCH);
            removed += n;
            if n == 0 {
                break;
            }
        }
        assert_eq!(removed, 1_999, "ended at 10..=19,990 ms");
        assert_eq!(job(&db, JobId(1_999)).expect("read"), None);
        assert!(job(&db, JobId(2_000)).expect("read").is_some());
        let left = page(&db, &Query::default()).expect("page");
        assert_eq!(left.jobs.len(), 501);
        assert_eq!(left.jobs[0].id, JobId(2_000));
    }
}
