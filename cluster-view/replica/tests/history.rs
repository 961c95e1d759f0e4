//! The history of ended jobs on real RocksDB: jobs the view forgets are read back from the
//! replica's store, in the order they ended, after a restart too (from the snapshot and the
//! replayed log, written once each), and records past the accounting retention are dropped.

use std::path::Path;
use tessera_replica::history::Query;
use tessera_replica::{Answer, Replica};
use tessera_view::{ClusterSpec, ClusterView, Command, JobId, JobSpec, JobState, Outcome, Topology};

mod common;

/// Two ended jobs kept in the view; the ledger (and the history) keeps one day.
fn initial() -> ClusterView {
    let mut spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
    spec.accounting.ended_jobs_kept = 2;
    spec.accounting.retention_days = 1;
    ClusterView::from_spec(&spec)
}

/// A single-voter replica on RocksDB in `dir`, leading.
fn leader(dir: &Path, snapshot_every: u64) -> Replica {
    common::single_voter_leader("history", dir, snapshot_every, initial)
}

/// Proposes `cmd` and drives the replica until it is answered.
fn run(r: &mut Replica, cmd: Command) -> Outcome {
    let t = r.propose(cmd).expect("propose");
    for _ in 0..10 {
        r.on_ready().expect("ready");
        if let Some((_, a)) = r.take_outcomes().into_iter().find(|(x, _)| *x == t) {
            let Answer::Applied(o) = a else { panic!("{a:?}") };
            return o;
        }
    }
    panic!("never answered");
}

/// Submits a job at `at_ms` on the leader's clock and cancels it a second later.
fn ended_job(r: &mut Replica, name: &str, at_ms: u64) -> JobId {
    run(r, Command::Clock { at_ms });
    let Outcome::Submitted(Ok(id)) = run(r, Command::submit(JobSpec::simple(name, 1, 1))) else { panic!("submit") };
    run(r, Command::Clock { at_ms: at_ms + 1_000 });
    assert_eq!(run(r, Command::Cancel { job: id, reason: None, grace_s: None }), Outcome::Ended(Ok(())));
    id
}

fn history_ids(r: &Replica) -> Vec<u64> {
    r.history_page(&Query::default()).expect("history").jobs.iter().map(|j| j.id.0).collect()
}

#[test]
fn forgotten_jobs_are_read_from_the_history_across_a_restart_and_pruned_past_the_retention() {
    let dir = tempfile::tempdir().expect("tmp");
    // Far past the wall clock the leader stamps on every entry, so these clocks lead.
    let t0 = 4_000_000_000_000;
    let ids: Vec<JobId> = {
        let mut r = leader(dir.path(), 6);
        let ids: Vec<JobId> = (0..5).map(|i| ended_job(&mut r, &format!("j{i}"), t0 + i * 60_000)).collect();
        // The view keeps the newest two; the other three are in the history, oldest first.
        assert!(r.view().job(ids[2]).is_none() && r.view().job(ids[3]).is_some());
        assert_eq!(history_ids(&r), vec![ids[0].0, ids[1].0, ids[2].0]);
        let j = r.history_job(ids[1]).expect("read").expect("kept");
        assert_eq!((j.spec.name.as_str(), j.state, j.times.ended_ms), ("j1", JobState::Failed, t0 + 61_000));
        ids
    };
    // Reopened: the snapshot and the log replayed after it forget the same jobs again; each is
    // in the history once.
    let mut r = leader(dir.path(), 6);
    assert_eq!(history_ids(&r), vec![ids[0].0, ids[1].0, ids[2].0]);
    let later = ended_job(&mut r, "j5", t0 + 10 * 60_000);
    assert_eq!(history_ids(&r), vec![ids[0].0, ids[1].0, ids[2].0, ids[3].0]);
    assert!(r.view().job(later).is_some());
    // A day and more later, a prune drops what ended before the retention (j0..j3); j4,
    // forgotten after it (when j6 ends), goes at the next prune, a minute on.
    ended_job(&mut r, "j6", t0 + 86_400_000 + 30 * 60_000);
    assert_eq!(history_ids(&r), vec![ids[4].0]);
    assert!(r.history_job(ids[0]).expect("read").is_none());
    run(&mut r, Command::Clock { at_ms: t0 + 86_400_000 + 32 * 60_000 });
    assert_eq!(history_ids(&r), Vec::<u64>::new());
}
