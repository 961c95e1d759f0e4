use crate::cluster_spec::ClusterSpec;
use crate::error::ViewError;
use crate::ids::{JobId, ProposalId, RequestId, ServerId};
use crate::job::{JobSpec, JobState};
use crate::mask::CoreMask;
use crate::placement::{Decision, MemberPlacement, Proposal, Rejection};
use crate::topology::Topology;
use crate::view::{ClusterView, Command, Outcome};
use crate::wait::{Explainer, Waiting};

fn view() -> ClusterView {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
    v.advance_clock(1_800_000_000_000);
    v
}

fn one_gpu() -> JobSpec {
    JobSpec { memory_mib_per_gpu: Some(1024), ..JobSpec::simple("j", 1, 1) }
}

fn after(ids: &[JobId]) -> JobSpec {
    JobSpec { after: ids.to_vec(), ..one_gpu() }
}

fn after_any(ids: &[JobId]) -> JobSpec {
    JobSpec { after_any: ids.to_vec(), ..one_gpu() }
}

fn propose(v: &mut ClusterView, job: JobId, id: u64) -> Decision {
    let member = MemberPlacement { server: ServerId(0), gpus: 0, cores: CoreMask::range(0, 4), memory_mib: 1024 };
    // Device `id % 8` of server 0, so that jobs placed one after another do not collide.
    let member = MemberPlacement { gpus: 1 << (id % 8), ..member };
    let p = Proposal { id: ProposalId(id), job, members: vec![member], based_on: v.version() };
    match v.apply(&Command::Propose(vec![p])) {
        Outcome::Decided(mut d) => d.remove(0),
        o => panic!("unexpected outcome {o:?}"),
    }
}

/// Places `job` and releases it as finished (or failed).
fn run_to_end(v: &mut ClusterView, job: JobId, id: u64, failed: bool) {
    assert!(propose(v, job, id).is_placed(), "{job} places");
    assert_eq!(v.apply(&Command::Release { job, failed }), Outcome::Ended(Ok(())));
}

fn state(v: &ClusterView, job: JobId) -> JobState {
    v.job(job).expect("known").state
}

#[test]
fn a_job_after_another_is_not_placed_before_it_finishes_and_is_ready_from_its_end() {
    let mut v = view();
    let a = v.submit(one_gpu()).expect("a");
    let b = v.submit(after(&[a])).expect("b");
    assert_eq!(v.job(b).expect("b").waiting_for, vec![(a, true)]);
    match propose(&mut v, b, 1) {
        Decision::Rejected { reason: Rejection::DependencyPending { first, count }, .. } => {
            assert_eq!((first, count), (a, 1))
        }
        d => panic!("the approver must refuse a job that still waits: {d:?}"),
    }
    let w = Explainer::new(&v).explain(b).expect("pending");
    assert_eq!(w.waiting, Waiting::Dependency { first: a, must_finish: true, count: 1 });
    v.advance_clock(1_800_000_060_000);
    let before = v.version();
    run_to_end(&mut v, a, 2, false);
    let jb = v.job(b).expect("b");
    assert!(jb.waiting_for.is_empty(), "crossed off");
    assert_eq!(jb.ready_ms, 1_800_000_060_000, "its wait counts from the end of what it waited for");
    assert_eq!(jb.waiting_from_ms(), 1_800_000_060_000);
    // Watchers learn of it: the waiting job is in the delta of the release.
    let delta = v.delta_since(before).expect("delta");
    assert!(delta.jobs.iter().any(|j| j.id == b && j.waiting_for.is_empty()), "{delta:?}");
    assert!(propose(&mut v, b, 3).is_placed());
}

#[test]
fn a_failed_dependency_fails_the_chain_after_it_in_one_command_and_after_any_goes_on() {
    let mut v = view();
    let a = v.submit(one_gpu()).expect("a");
    let b = v.submit(after(&[a])).expect("b");
    let c = v.submit(after(&[b])).expect("c after b");
    let d = v.submit(after_any(&[a])).expect("d after any end of a");
    let e = v.submit(JobSpec { after: vec![c], after_any: vec![a], ..one_gpu() }).expect("e");
    assert!(propose(&mut v, a, 1).is_placed());
    let before = v.version();
    assert_eq!(v.apply(&Command::Release { job: a, failed: true }), Outcome::Ended(Ok(())));
    assert_eq!(v.version().0, before.0 + 1, "one command, one version, however long the chain");
    for (job, waited) in [(b, a), (c, b), (e, c)] {
        let j = v.job(job).expect("known");
        assert_eq!(j.state, JobState::Failed, "{job}");
        let err = j.error.as_deref().unwrap_or("");
        assert!(err.starts_with(&format!("{waited}, which it waited for, failed")), "{job}: {err}");
        assert!(j.waiting_for.is_empty());
    }
    assert_eq!(state(&v, d), JobState::Pending);
    assert!(v.job(d).expect("d").waiting_for.is_empty(), "after_any: any end will do");
    assert!(propose(&mut v, d, 2).is_placed());
    assert!(v.dependents.is_empty(), "nothing is left waiting: {:?}", v.dependents);
}

#[test]
fn submissions_naming_unknown_or_already_failed_jobs_are_refused_and_change_nothing() {
    let mut v = view();
    let unknown = v.submit(after(&[JobId(99)])).expect_err("unknown");
    assert!(
        matches!(&unknown, ViewError::InvalidSpec(e) if e.field == "after" && e.message.contains("job-99 was never submitted")),
        "{unknown}"
    );
    let a = v.submit(one_gpu()).expect("a");
    run_to_end(&mut v, a, 1, true);
    let (version, hash) = (v.version(), v.state_hash());
    let failed = v.submit(after(&[a])).expect_err("a failed");
    assert!(failed.to_string().contains("after_any"), "says what would work: {failed}");
    assert_eq!((v.version(), v.state_hash()), (version, hash), "a refusal changes nothing");
    // After any end: it has ended, so nothing to wait for.
    let b = v.submit(after_any(&[a])).expect("after any");
    assert!(v.job(b).expect("b").waiting_for.is_empty());
    // A job that finished is not waited for either.
    let f = v.submit(one_gpu()).expect("f");
    run_to_end(&mut v, f, 2, false);
    let g = v.submit(after(&[f])).expect("after a finished job");
    assert!(v.job(g).expect("g").waiting_for.is_empty());
    // Bounds are the spec's: no id twice, ids from 1.
    assert!(v.submit(JobSpec { after: vec![f], after_any: vec![f], ..one_gpu() }).is_err());
    assert!(v.submit(after(&[JobId(0)])).is_err());
}

#[test]
fn an_array_admits_consecutive_jobs_once_and_its_first_id_stands_for_the_array() {
    let mut v = view();
    let req = RequestId::new("array-1".to_string()).expect("id");
    let spec = JobSpec { array: Some(3), ..one_gpu() };
    let first = v.submit_once(&spec, Some(&req)).expect("array");
    for i in 0..3u32 {
        let j = v.job(JobId(first.0 + u64::from(i))).expect("member");
        assert_eq!((j.array_index, j.array_first(), j.state), (Some(i), Some(first), JobState::Pending));
    }
    let next = v.submit(one_gpu()).expect("next");
    assert_eq!(next.0, first.0 + 3, "ids are consecutive");
    let version = v.version();
    assert_eq!(v.submit_once(&spec, Some(&req)), Ok(first), "a retry admits nothing");
    assert_eq!(v.version(), version);
    // Waiting for the array's first id waits for every member.
    let w = v.submit(after(&[first])).expect("after the array");
    let members: Vec<JobId> = (0..3).map(|i| JobId(first.0 + i)).collect();
    assert_eq!(v.job(w).expect("w").waiting_for, members.iter().map(|m| (*m, true)).collect::<Vec<_>>());
    run_to_end(&mut v, members[0], 1, false);
    run_to_end(&mut v, members[2], 2, false);
    assert_eq!(v.job(w).expect("w").waiting_for, vec![(members[1], true)]);
    run_to_end(&mut v, members[1], 3, false);
    assert!(v.job(w).expect("w").waiting_for.is_empty());
    // Out of bounds.
    assert!(v.submit(JobSpec { array: Some(0), ..one_gpu() }).is_err());
    assert!(v.submit(JobSpec { array: Some(crate::job::MAX_ARRAY + 1), ..one_gpu() }).is_err());
}

#[test]
fn a_view_restored_mid_wait_settles_the_same_way_as_the_one_it_was_taken_from() {
    let mut v = view();
    let a = v.submit(one_gpu()).expect("a");
    let arr = v.submit(JobSpec { array: Some(2), ..one_gpu() }).expect("array");
    for spec in [after(&[a]), after_any(&[arr]), after(&[a, arr]), after(&[a])] {
        v.submit(spec).expect("waiting job");
    }
    let mut restored = ClusterView::from_snapshot(v.snapshot());
    assert_eq!(restored.state_hash(), v.state_hash());
    assert_eq!(restored.dependents, v.dependents);
    for view in [&mut v, &mut restored] {
        assert!(propose(view, a, 1).is_placed());
        view.apply(&Command::Release { job: a, failed: true });
        assert!(propose(view, arr, 2).is_placed());
        view.apply(&Command::Release { job: arr, failed: false });
    }
    assert_eq!(restored.state_hash(), v.state_hash(), "same ends, same order, same hash");
    assert_eq!(restored.snapshot(), v.snapshot());
}

#[test]
fn a_job_cancelled_while_waiting_leaves_the_lists_and_a_cancel_keeps_its_grace() {
    let mut v = view();
    let a = v.submit(one_gpu()).expect("a");
    let b = v.submit(after(&[a])).expect("b");
    let cancel = |job, grace_s| Command::Cancel { job, reason: None, grace_s };
    assert_eq!(v.apply(&cancel(b, Some(45))), Outcome::Ended(Ok(())));
    let jb = v.job(b).expect("b");
    assert_eq!((jb.state, jb.cancel_grace_s, jb.waiting_for.len()), (JobState::Failed, Some(45), 0));
    assert!(v.dependents.is_empty(), "{:?}", v.dependents);
    let too_long = v.apply(&cancel(a, Some(crate::job::MAX_STOP_GRACE_S + 1)));
    assert!(matches!(too_long, Outcome::Ended(Err(ViewError::InvalidSpec(_)))), "{too_long:?}");
    assert_eq!(state(&v, a), JobState::Pending, "a refused cancel cancels nothing");
}

#[test]
fn a_long_chain_fails_whole_without_recursion() {
    let mut v = view().with_limits(1 << 16, 1 << 20);
    let first = v.submit(one_gpu()).expect("first");
    let mut last = first;
    for _ in 0..20_000 {
        last = v.submit(after(&[last])).expect("link");
    }
    assert!(propose(&mut v, first, 1).is_placed());
    v.apply(&Command::Release { job: first, failed: true });
    assert_eq!(state(&v, last), JobState::Failed);
    assert!(v.dependents.is_empty());
}

#[test]
fn a_retried_array_admits_nothing_while_any_member_is_remembered() {
    // Keeps one ended job: the array's first member is forgotten when the second ends.
    let mut v = view().with_limits(1 << 16, 1);
    let req = RequestId::new("array-2".to_string()).expect("id");
    let spec = JobSpec { array: Some(3), ..one_gpu() };
    let first = v.submit_once(&spec, Some(&req)).expect("array");
    let members: Vec<JobId> = (0..3).map(|i| JobId(first.0 + i)).collect();
    run_to_end(&mut v, members[0], 1, false);
    run_to_end(&mut v, members[1], 2, false);
    assert!(v.job(first).is_none(), "the first member is forgotten");
    // To the lowest member still kept: the second, ended but not yet forgotten.
    assert_eq!(v.job(members[1]).and_then(|j| j.request.clone()), Some(req.clone()), "the request passed on");
    assert_eq!(v.job_of_request(&req), Some(first), "answered with the array's first id");
    let version = v.version();
    assert_eq!(v.submit_once(&spec, Some(&req)), Ok(first), "a retry admits nothing");
    assert_eq!(v.version(), version);
    let other = JobSpec { name: "other".into(), ..spec.clone() };
    assert_eq!(
        v.submit_once(&other, Some(&req)),
        Err(ViewError::RequestReused { request: "array-2".into(), job: first })
    );
    let restored = ClusterView::from_snapshot(v.snapshot()).with_limits(1 << 16, 1);
    assert_eq!(restored.job_of_request(&req), Some(first), "a snapshot keeps it");
    assert!(crate::invariants::check(&v).is_clean());
    // Once every member is forgotten, the id is free again.
    run_to_end(&mut v, members[2], 3, false);
    assert_eq!(v.job(members[2]).and_then(|j| j.request.clone()), Some(req.clone()), "passed on again");
    assert_eq!(v.job_of_request(&req), Some(first));
    let last = v.submit(one_gpu()).expect("last");
    run_to_end(&mut v, last, 4, false);
    assert_eq!(v.job_of_request(&req), None);
    assert_ne!(v.submit_once(&spec, Some(&req)), Ok(first), "admitted afresh");
}

#[test]
fn forgotten_jobs_have_ended_for_after_any_and_are_unknown_outcomes_for_after() {
    // Keeps one ended job.
    let mut v = view().with_limits(1 << 16, 1);
    let a = v.submit(one_gpu()).expect("a");
    let arr = v.submit(JobSpec { array: Some(3), ..one_gpu() }).expect("array");
    let filler = v.submit(one_gpu()).expect("filler");
    run_to_end(&mut v, a, 1, false);
    run_to_end(&mut v, arr, 2, false);
    run_to_end(&mut v, filler, 3, false);
    assert!(v.job(a).is_none() && v.job(arr).is_none(), "both forgotten");
    let err = v.submit(after(&[a])).expect_err("after a forgotten job");
    assert!(err.to_string().contains("whether it finished is not known"), "{err}");
    let b = v.submit(after_any(&[a])).expect("after any end of a forgotten job");
    assert!(v.job(b).expect("b").waiting_for.is_empty());
    // The array's first job is forgotten; its members still running are found by their first id.
    let c = v.submit(after_any(&[arr])).expect("after any end of the array");
    let rest = vec![(JobId(arr.0 + 1), false), (JobId(arr.0 + 2), false)];
    assert_eq!(v.job(c).expect("c").waiting_for, rest);
    assert!(v.submit(after(&[arr])).is_err(), "its first member's outcome is not known");
}
