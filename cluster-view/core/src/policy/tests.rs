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
    policy(v, Command::SetQuota { tenant: tenant.into(), gpus, class: None })
}

fn class_quota(v: &mut ClusterView, tenant: &str, class: &str, gpus: Option<u32>) -> Result<(), ViewError> {
    policy(v, Command::SetQuota { tenant: tenant.into(), gpus, class: Some(class.into()) })
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

/// A move changes where a job's GPUs are, not how many its tenant holds: a tenant above a
/// lowered quota (plain or at a class) still has its running jobs moved, so a drain or a repack
/// does not cost them their work, while a new placement of the tenant is still refused.
#[test]
fn a_tenant_above_a_lowered_quota_can_still_have_its_jobs_moved() {
    let mut v = view();
    let plain = v.submit(job("vision", 4)).expect("admitted");
    assert!(propose(&mut v, plain, 1, 0, 4).is_placed());
    let ranked_job = v.submit(ranked("vision", 2, 50)).expect("admitted");
    assert!(propose(&mut v, ranked_job, 2, 4, 2).is_placed());
    quota(&mut v, "vision", Some(2)).expect("lowered under the 6 held");
    class_quota(&mut v, "vision", "batch", Some(1)).expect("lowered under the 2 held at batch");
    let waiting = v.submit(job("vision", 1)).expect("admitted: fits the quota alone");
    let d = propose(&mut v, waiting, 3, 6, 1);
    assert!(matches!(d, Decision::Rejected { reason: Rejection::QuotaExceeded { .. }, .. }), "{d:?}");

    let held = v.tenant_used("vision");
    for (id, job, first, gpus) in [(4, ranked_job, 6, 2), (5, plain, 2, 4)] {
        let p = Proposal {
            id: ProposalId(id),
            job,
            members: vec![MemberPlacement::seed_8gpu(first, gpus)],
            based_on: v.version(),
        };
        let d = match v.apply(&Command::Migrate(vec![p])) {
            Outcome::Decided(mut d) => d.remove(0),
            o => panic!("unexpected outcome {o:?}"),
        };
        assert!(matches!(d, Decision::Accepted { .. }), "job {job}: {d:?}");
    }
    assert_eq!(v.tenant_used("vision"), held, "a move changes no tenant's use");
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

/// A job of `tenant` at priority `priority` (a number, as a class would resolve to).
fn ranked(tenant: &str, gpus: u32, priority: i32) -> JobSpec {
    JobSpec { priority, ..job(tenant, gpus) }
}

#[test]
fn a_class_quota_bounds_what_a_tenant_holds_at_the_class_and_above_by_priority_not_by_name() {
    let mut v = view();
    class_quota(&mut v, "vision", "batch", Some(4)).expect("set");
    assert_eq!(v.class_quotas()["vision"]["batch"], 4);
    // Below the class: not bound. At batch (50) or above, by number or by a higher class: bound.
    let low = v.submit(ranked("vision", 2, 10)).expect("admitted");
    assert!(propose(&mut v, low, 1, 0, 2).is_placed());
    let batch = v.submit(ranked("vision", 3, 50)).expect("admitted");
    assert!(propose(&mut v, batch, 2, 2, 3).is_placed());
    assert_eq!(v.held_at_or_above("vision", 50), 3);
    let urgent = v.submit(JobSpec { class: Some("production".into()), ..job("vision", 2) }).expect("admitted");
    let d = propose(&mut v, urgent, 3, 5, 2);
    let Decision::Rejected { reason, .. } = &d else { panic!("{d:?}") };
    assert_eq!(
        *reason,
        Rejection::QuotaExceeded { tenant: "vision".into(), class: Some("batch".into()), quota: 4, used: 3, asked: 2 }
    );
    assert!(reason.to_string().contains("at class `batch` or above"), "{reason}");
    assert!(v.submit(ranked("vision", 5, 60)).expect_err("never fits").to_string().contains("at class `batch`"));
    assert!(v.submit(ranked("nlp", 5, 60)).is_ok(), "another tenant is not bound");
    // The batch job ends: room at batch and above again.
    v.apply(&Command::Release { job: batch, failed: false });
    assert_eq!(v.held_at_or_above("vision", 50), 0);
    assert!(propose(&mut v, urgent, 4, 2, 2).is_placed());
    let report = crate::invariants::check(&v);
    assert!(report.is_clean(), "{:?}", report.violations);
}

#[test]
fn class_quotas_name_known_classes_go_with_their_class_and_survive_a_snapshot() {
    let mut v = view();
    let e = class_quota(&mut v, "vision", "urgent", Some(4)).expect_err("no such class");
    assert!(e.to_string().contains("unknown priority class `urgent`"), "{e}");
    assert!(class_quota(&mut v, "vision", "two words", Some(4)).is_err());
    class_quota(&mut v, "vision", "production", Some(4)).expect("set");
    let (hash, version) = (v.state_hash(), v.version());
    class_quota(&mut v, "vision", "production", Some(4)).expect("the same");
    assert_eq!((v.state_hash(), v.version()), (hash, version), "a retried change is no change");
    let held = v.submit(ranked("vision", 2, 100)).expect("admitted");
    assert!(propose(&mut v, held, 1, 0, 2).is_placed());
    // Rebuilt from a snapshot: the same quotas, counters and hash.
    let copy = ClusterView::from_snapshot(v.snapshot());
    assert_eq!((copy.class_quotas(), copy.state_hash()), (v.class_quotas(), v.state_hash()));
    assert_eq!(copy.held_at_or_above("vision", 100), 2);
    // The class is removed: its quotas go with it. Removing a quota that is not there is no change.
    class(&mut v, "production", None).expect("removed");
    assert!(v.class_quotas().is_empty(), "{:?}", v.class_quotas());
    let version = v.version();
    class_quota(&mut v, "vision", "batch", None).expect("none to remove");
    assert_eq!(v.version(), version);
}
