//! The fuzz targets' checks on the corpus kept in `fuzz/corpus/` (seeds and what the fuzzer
//! found) and on freshly generated seeds, without cargo fuzz: every input the fuzzer ever
//! turned up stays a regression test. `fuzz/run.sh` fuzzes for real.

use std::path::{Path, PathBuf};
use tessera_testkit::fuzz::{self, TARGETS};
use tessera_view::{JobId, JobState};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository").to_path_buf()
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    fuzz::seeds(&root())
        .into_iter()
        .find(|(t, n, _)| *t == target && n == name)
        .map(|(_, _, input)| input)
        .unwrap_or_else(|| panic!("no seed {target}/{name}"))
}

#[test]
fn every_kept_input_passes_its_targets_checks() {
    for (target, check) in TARGETS {
        let dir = root().join("fuzz/corpus").join(target);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a corpus entry").path();
            let input = std::fs::read(&path).expect("a corpus file");
            // A panic names the target; the file is the last one read.
            eprintln!("{target}: {}", path.display());
            check(&input);
            n += 1;
        }
        assert!(n > 0, "{target} keeps no corpus in {}", dir.display());
    }
}

#[test]
fn every_seed_passes_its_targets_checks() {
    let seeds = fuzz::seeds(&root());
    for (target, _) in TARGETS {
        assert!(seeds.iter().any(|(t, _, _)| *t == target), "no seed for {target}");
    }
    for (target, name, input) in seeds {
        let (_, check) = TARGETS.iter().find(|(t, _)| *t == target).expect("a known target");
        eprintln!("{target}/{name}");
        check(&input);
    }
}

/// The seeds reach what they are for: a job's whole life, and moves, through the wire.
#[test]
fn the_wire_seeds_run_jobs_to_their_ends() {
    let view = fuzz::wire_commands_view(&seed("wire_commands", "life"));
    assert_eq!(view.job(JobId(1)).map(|j| j.state), Some(JobState::Finished), "placed, run and released");
    assert_eq!(view.job(JobId(2)).map(|j| j.state), Some(JobState::Failed), "cancelled");
    // Placed, moved, drained off its server, then the other's server went down.
    let view = fuzz::wire_commands_view(&seed("wire_commands", "moves"));
    let job = |id| view.job(JobId(id)).expect("the seed's job");
    assert_eq!(job(2).proposals.len(), 2, "placed, then migrated");
    assert!(job(2).error.as_deref().is_some_and(|e| e.contains("was drained")), "{:?}", job(2));
    assert!(job(1).error.as_deref().is_some_and(|e| e.contains("went down")), "{:?}", job(1));
}

/// The layout seed grows the cluster, places a job on a new server and removes another; its
/// snapshot, tombstone included, passes the wire checks.
#[test]
fn the_layout_seed_adds_places_on_and_removes_servers() {
    use tessera_view::{Health, ServerId};
    let view = fuzz::wire_commands_view(&seed("wire_commands", "layout"));
    let n = view.servers().len();
    let new = ServerId((n - 2) as u32);
    assert_eq!(view.server_name(new), Some("new-0"));
    assert_eq!(view.server(new).map(|r| r.health), Some(Health::Up), "its heartbeat brought it up");
    assert_eq!(view.server(ServerId((n - 1) as u32)).map(|r| r.health), Some(Health::Removed));
    let job = view.job(JobId(1)).expect("the seed's job");
    assert!(job.placement.as_ref().is_some_and(|p| p.members[0].server == new), "placed on the new server: {job:?}");
}

/// The policy seed sets and removes a quota and a class through the wire: the tenant over a
/// lowered quota keeps its gang, the job naming the class takes its priority, and the class
/// and quota are gone at the end; a credential is revoked and taken off the list.
#[test]
fn the_policy_seed_changes_quotas_and_classes() {
    let view = fuzz::wire_commands_view(&seed("wire_commands", "policy"));
    let job = |id| view.job(JobId(id)).expect("the seed's job");
    assert!(job(1).placement.is_some(), "placed under the quota, kept under the lowered one: {:?}", job(1));
    assert_eq!(view.jobs().len(), 2, "the 8-GPU job never fit the quota of 4; the urgent one was admitted");
    let urgent = view.jobs().into_iter().find(|j| j.spec.class.as_deref() == Some("urgent")).expect("admitted");
    assert_eq!(urgent.spec.priority, 500);
    assert!(view.quotas().is_empty() && !view.priorities().classes.contains_key("urgent"));
    // A credential was revoked (the list changed) and taken off again.
    assert!(view.revocations().is_empty() && view.revocations_changed().0 > 0);
}

/// The raft seeds make the replica a leader that commits, and a follower that applies.
#[test]
fn the_raft_seeds_lead_and_follow() {
    let leader = fuzz::raft_replica(&seed("raft_messages", "lead")).expect("the replica keeps running");
    assert!(leader.is_leader(), "the lead seed elects the replica");
    let follower = fuzz::raft_replica(&seed("raft_messages", "follow")).expect("the replica keeps running");
    assert_eq!(follower.leader_id(), 2, "the follow seed makes it follow replica 2");
    assert_eq!(follower.view().jobs().len(), 1, "it applied the submission replica 2 sent");
}

/// Writes the seeds into `fuzz/corpus/<target>/seed-<name>`; run after changing them:
/// `cargo test -p tessera-testkit --test fuzz_corpus -- --ignored write_seeds`.
#[test]
#[ignore = "writes into the repository"]
fn write_seeds() {
    for (target, name, input) in fuzz::seeds(&root()) {
        let dir = root().join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&dir).expect("corpus directory");
        std::fs::write(dir.join(format!("seed-{name}")), input).expect("write a seed");
    }
}
