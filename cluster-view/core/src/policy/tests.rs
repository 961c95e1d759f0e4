use crate::cluster_spec::ClusterSpec;
use crate::error::ViewError;
use crate::ids::{JobId, ProposalId};
use crate::invariants;
use crate::job::JobSpec;
use crate::placement::{Decision, MemberPlacement, Proposal, Rejection};
use crate::topology::Topology;
use crate::view::{ClusterView, Command, Outcome};

/// One seed-8gpu server.
fn view() -> ClusterView {
    let mut v = ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1));
    v.advance_clock(1_800_000_000_000);
    v
}

fn policy(v: &mut ClusterView, cmd: Command) -> Result<(), ViewError> {
    match v.apply(&cmd) {
        Outcome::Policy(r) => r,
        o => panic!("unexpected outcome {o:?}"),
    }
}

fn quota(v: &mut ClusterView, tenant: &str, gpus: Option<u32>) -> Result<(), ViewError> {
    policy(v, Command::SetQuota { tenant: tenant.into(), gpus })
}

fn class(v: &mut ClusterView, class: &str, priority: Option<i32>) -> Result<(), ViewError> {
    policy(v, Command::SetPriorityClass { class: class.into(), priority })
}

fn job(tenant: &str, gpus: u32) -> JobSpec {
    JobSpec { tenant: tenant.into(), ..JobSpec::simple("j", 1, gpus) }
}

/// `gpus` GPUs (from device `first`) with their shares of cores and memory, on the server.
fn propose(v: &mut ClusterView, job: JobId, id: u64, first: u32, gpus: u32) -> Decision {
    let m = MemberPlacement::seed_8gpu(first, gpus);
    let p = Proposal { id: ProposalId(id), job, members: vec![m], based_on: v.version() };
    match v.apply(&Command::Propose(vec![p])) {
        Outcome::Decided(mut d) => d.remove(0),
        o => panic!("unexpected outcome {o:?}"),
    }
}

#[test]
fn a_quota_set_on_a_running_cluster_binds_admissions_and_new_placements_not_running_jobs() {
    let mut v = view();
    let running = v.submit(job("vision", 4)).expect("admitted");
    let d = propose(&mut v, running, 1, 0, 4);
    assert!(d.is_placed(), "{d:?}");
    let waiting = v.submit(job("vision", 2)).expect("admitted");
    let (hash, version) = (v.state_hash(), v.version());

    // Lowered under what the tenant holds: the running job keeps its GPUs, the pending one may
    // not be placed, and a larger job is refused at submission (the memo judged the old quota).
    quota(&mut v, "vision", Some(4)).expect("set");
    assert_ne!(v.state_hash(), hash, "the hash covers quotas");
    assert!(v.version() > version);
    assert_eq!(v.job(running).expect("job").placement.as_ref().map(|p| p.members.len()), Some(1));
    let d = propose(&mut v, waiting, 2, 4, 2);
    assert!(matches!(d, Decision::Rejected { reason: Rejection::QuotaExceeded { .. }, .. }), "{d:?}");
    let e = v.submit(job("vision", 5)).expect_err("over the quota");
    assert!(e.to_string().contains("quota of 4"), "{e}");
    assert!(v.submit(job("nlp", 5)).is_ok(), "another tenant is not bound");

    // Raised: the waiting job is placed. Setting the same value again changes nothing.
    quota(&mut v, "vision", Some(6)).expect("raised");
    assert!(propose(&mut v, waiting, 3, 4, 2).is_placed());
    let (hash, version) = (v.state_hash(), v.version());
    quota(&mut v, "vision", Some(6)).expect("the same");
    assert_eq!((v.state_hash(), v.version()), (hash, version), "a retried change is no change");

    // Removed: no bound; removing again changes nothing.
    quota(&mut v, "vision", None).expect("removed");
    assert!(v.quotas().get("vision").is_none());
    assert!(v.submit(job("vision", 8)).is_ok());
    let version = v.version();
    quota(&mut v, "vision", None).expect("already none");
    assert_eq!(v.version(), version);

    // Bad names change nothing.
    let hash = v.state_hash();
    for bad in ["", "two words", &"t".repeat(65), "tab\tbed"] {
        assert!(matches!(quota(&mut v, bad, Some(1)), Err(ViewError::Policy(_))), "`{bad}` taken");
    }
    assert_eq!(v.state_hash(), hash);
    let rep = invariants::check(&v);
    assert!(rep.is_clean(), "{:?}", rep.violations);
}

#[test]
fn a_policy_change_reaches_readers_by_snapshot_and_survives_one() {
    let mut v = view();
    let before = v.version();
    quota(&mut v, "vision", Some(3)).expect("set");
    class(&mut v, "urgent", Some(500)).expect("added");
    // Deltas carry no policy: a reader behind the change reads a snapshot.
    assert!(v.delta_since(before).is_none());
    let back = ClusterView::from_snapshot(v.snapshot());
    assert_eq!(back.quotas().get("vision"), Some(&3));
    assert_eq!(back.priorities().classes.get("urgent"), Some(&500));
    assert_eq!(back.state_hash(), v.state_hash());
}

#[test]
fn priority_classes_are_added_changed_and_removed_for_later_admissions() {
    let mut v = view();
    let spec = |c: &str| JobSpec { class: Some(c.into()), ..JobSpec::simple("p", 1, 1) };
    let e = v.submit(spec("urgent")).expect_err("no such class yet");
    assert!(e.to_string().contains("unknown priority class `urgent`"), "{e}");
    class(&mut v, "urgent", Some(500)).expect("added");
    let first = v.submit(spec("urgent")).expect("admitted");
    assert_eq!(v.job(first).expect("job").spec.priority, 500);
    // A change applies to jobs admitted afterwards; the admitted one keeps its priority.
    class(&mut v, "urgent", Some(400)).expect("changed");
    let second = v.submit(spec("urgent")).expect("admitted");
    assert_eq!(v.job(second).expect("job").spec.priority, 400);
    assert_eq!(v.job(first).expect("job").spec.priority, 500);
    // Removed: unknown again; the last class cannot go.
    class(&mut v, "urgent", None).expect("removed");
    assert!(v.submit(spec("urgent")).is_err());
    for c in ["production", "batch"] {
        class(&mut v, c, None).expect("removed");
    }
    let e = class(&mut v, "best-effort", None).expect_err("the last class");
    assert!(e.to_string().contains("last priority class"), "{e}");
    assert_eq!(v.priorities().classes.len(), 1);
    assert!(matches!(class(&mut v, "with space", Some(1)), Err(ViewError::Policy(_))));
}
