//! Fail points at the storage and apply boundaries, on real RocksDB (`--features failpoints`).
//!
//! Each test makes one boundary fail, checks that `on_ready` fails and that nothing was written
//! that should not have been, then reopens the replica from its directory, as a restarted
//! process would, and checks that it recovers from what is durable. Fail points are global to
//! the process: every test holds a `FailScenario`, which runs them one at a time.

use std::path::Path;
use tessera_replica::{Answer, Replica, ReplicaError};
use tessera_view::{ClusterSpec, ClusterView, Command, JobSpec, Outcome, Topology};

mod common;

fn initial() -> ClusterView {
    ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1))
}

/// A single-voter replica on RocksDB in `dir`, leading.
fn leader(dir: &Path, snapshot_every: u64) -> Replica {
    common::single_voter_leader("failpoints", dir, snapshot_every, initial)
}

/// Submits a job and drives the replica until it is answered.
fn submit(r: &mut Replica, name: &str) -> Result<(), ReplicaError> {
    let t = r.propose(Command::submit(JobSpec::simple(name, 1, 1)))?;
    for _ in 0..10 {
        r.on_ready()?;
        if let Some((_, a)) = r.take_outcomes().into_iter().find(|(x, _)| *x == t) {
            assert!(matches!(a, Answer::Applied(Outcome::Submitted(Ok(_)))), "{a:?}");
            return Ok(());
        }
    }
    panic!("submit of {name} never answered");
}

fn job_names(r: &Replica) -> Vec<String> {
    let mut names: Vec<String> = r.view().jobs().into_iter().map(|j| j.spec.name.clone()).collect();
    names.sort();
    names
}

#[test]
fn a_command_that_cannot_be_encoded_is_never_appended() {
    let _scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().expect("tmp");
    let mut r = leader(dir.path(), 10_000);
    submit(&mut r, "before").expect("submit");
    let log = r.log_len();
    fail::cfg("replica::encode", "return").expect("fail point");
    let t = r.propose(Command::submit(JobSpec::simple("unencodable", 1, 1))).expect("queued");
    match r.on_ready() {
        Err(ReplicaError::Encode { what: "commands", .. }) => {}
        other => panic!("expected an encode error, got {other:?}"),
    }
    fail::remove("replica::encode");
    assert_eq!(r.log_len(), log, "nothing appended");
    assert!(r.take_outcomes().contains(&(t, Answer::Dropped)), "its client hears the outcome is unknown");
    drop(r);
    let r = leader(dir.path(), 10_000);
    assert_eq!(job_names(&r), ["before"]);
}

#[test]
fn a_failed_fsync_stops_the_replica_and_the_restart_has_what_was_synced() {
    let _scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().expect("tmp");
    let mut r = leader(dir.path(), 10_000);
    submit(&mut r, "synced").expect("submit");
    fail::cfg("replica::sync_write", "return").expect("fail point");
    match submit(&mut r, "lost") {
        Err(ReplicaError::Storage { why }) => assert!(why.contains("sync_write"), "{why}"),
        other => panic!("expected a storage error, got {other:?}"),
    }
    fail::remove("replica::sync_write");
    drop(r);
    let r = leader(dir.path(), 10_000);
    assert_eq!(job_names(&r), ["synced"]);
}

#[test]
fn a_failure_at_apply_or_at_a_compaction_snapshot_recovers_from_the_log() {
    for point in ["replica::apply", "replica::compact_snapshot"] {
        let _scenario = fail::FailScenario::setup();
        let dir = tempfile::tempdir().expect("tmp");
        // A snapshot every 3 entries: one of the next submits reaches a compaction.
        let mut r = leader(dir.path(), 3);
        submit(&mut r, "0").expect("submit");
        fail::cfg(point, "return").expect("fail point");
        let mut written = vec!["0".to_string()];
        let mut failed = false;
        for i in 1..=5 {
            written.push(i.to_string());
            match submit(&mut r, &i.to_string()) {
                Ok(()) => {}
                Err(ReplicaError::Storage { why }) => {
                    assert!(why.contains(point.trim_start_matches("replica::")), "{point}: {why}");
                    failed = true;
                    break;
                }
                Err(e) => panic!("{point}: {e}"),
            }
        }
        assert!(failed, "{point} was never reached");
        fail::remove(point);
        drop(r);
        // Reopened, the replica replays its durable log: the entry the failure interrupted had
        // been written (before it was applied, or before the snapshot), so it is applied now.
        let r = leader(dir.path(), 3);
        written.sort();
        assert_eq!(job_names(&r), written, "{point}");
        assert!(tessera_view::invariants::check(r.view()).is_clean());
    }
}
