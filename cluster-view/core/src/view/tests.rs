use super::*;
use crate::invariants;
use crate::mask::CoreMask;
use crate::placement::MemberPlacement;

fn seed_view(servers: u32) -> ClusterView {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    ClusterView::from_spec(&ClusterSpec::uniform(topo, servers, servers, 1))
}

fn gang(members: u32) -> JobSpec {
    JobSpec { memory_mib_per_gpu: Some(1024), ..JobSpec::simple("g", members, 1) }
}

/// Submits a gang of one GPU per member and places member `k` on server `k`, device 0.
fn placed(view: &mut ClusterView, members: u32, proposal: u64) -> JobId {
    let job = view.submit(gang(members)).expect("submit");
    place_again(view, job, members, proposal);
    job
}

fn report(view: &mut ClusterView, job: JobId, p: u64, m: u32, event: TaskEvent) -> Result<JobState, ViewError> {
    match view.apply(&Command::Task { job, proposal: ProposalId(p), member: m, server: ServerId(m), event }) {
        Outcome::TaskReported(r) => r,
        o => panic!("unexpected outcome {o:?}"),
    }
}

fn exited(code: i32, message: &str) -> TaskEvent {
    TaskEvent::Exited { code, message: message.into() }
}

fn clock(view: &mut ClusterView, at_ms: u64) -> Vec<JobId> {
    match view.apply(&Command::Clock { at_ms }) {
        Outcome::Clock { now_ms, expired } => {
            assert_eq!(now_ms, view.now_ms());
            expired
        }
        o => panic!("unexpected outcome {o:?}"),
    }
}

/// Places `job`'s members `k` on server `k`, device 0, under proposal `id`.
fn place_again(view: &mut ClusterView, job: JobId, members: u32, id: u64) {
    let ms = (0..members)
        .map(|k| MemberPlacement { server: ServerId(k), gpus: 1, cores: CoreMask::range(0, 4), memory_mib: 1024 })
        .collect();
    let p = Proposal { id: ProposalId(id), job, members: ms, based_on: view.version() };
    let d = view.apply(&Command::Propose(vec![p]));
    assert!(matches!(&d, Outcome::Decided(v) if v[0].is_placed()), "{d:?}");
}

#[test]
fn a_failed_member_restarts_the_gang_whole_with_doubling_backoff_until_the_policy_is_spent() {
    let t0 = 1_800_000_000_000;
    let mut view = seed_view(2);
    clock(&mut view, t0);
    let mut spec = gang(2);
    spec.run.restart = Some(crate::job::RestartPolicy { max: 2, backoff_s: 10 });
    let job = view.submit(spec).expect("submit");
    let free = view.servers()[0].free_gpus;
    for (attempt, proposal) in [(1u32, 1u64), (2, 2)] {
        place_again(&mut view, job, 2, proposal);
        report(&mut view, job, proposal, 0, TaskEvent::Started).expect("started");
        // Member 1 fails: the gang is released whole (member 0 still ran) and queued again.
        assert_eq!(report(&mut view, job, proposal, 1, exited(3, "")), Ok(JobState::Pending));
        let j = view.job(job).expect("job");
        assert_eq!((j.state, j.placement.is_none(), j.restarts), (JobState::Pending, true, attempt));
        // 10 s, then 20 s, from the view's clock at the failure.
        assert_eq!(j.not_before_ms, t0 + 10_000 * (1u64 << (attempt - 1)));
        let e = j.error.as_deref().unwrap_or_default();
        assert!(e.starts_with(&format!("restart {attempt} of 2 in")) && e.contains("exited with code 3"), "{e}");
        assert_eq!(view.servers()[0].free_gpus, free, "member 0's device is free again");
        assert!(invariants::check(&view).is_clean(), "{:?}", invariants::check(&view));
        // A late report from the released placement is stale, and changes nothing.
        assert!(matches!(report(&mut view, job, proposal, 0, exited(0, "")), Err(ViewError::StaleTask { .. })));
    }
    // The third failure: no restart left.
    place_again(&mut view, job, 2, 3);
    assert_eq!(report(&mut view, job, 3, 0, exited(1, "boom")), Ok(JobState::Failed));
    let j = view.job(job).expect("job");
    assert_eq!((j.state, j.restarts), (JobState::Failed, 2));
    assert_eq!(j.error.as_deref(), Some("member 0 on rack-0-s00 exited with code 1: boom (after 2 restarts)"));
    // Without a policy a failure ends the job at once, as before.
    let once = placed(&mut view, 1, 4);
    assert_eq!(report(&mut view, once, 4, 0, exited(2, "")), Ok(JobState::Failed));
    assert_eq!(view.job(once).map(|j| j.restarts), Some(0));
}

#[test]
fn a_restart_backoff_doubles_up_to_its_cap() {
    let r = crate::job::RestartPolicy { max: 100, backoff_s: 10 };
    assert_eq!([r.backoff_ms(1), r.backoff_ms(2), r.backoff_ms(3)], [10_000, 20_000, 40_000]);
    assert_eq!(r.backoff_ms(9), 2_560_000);
    assert_eq!(r.backoff_ms(10), crate::job::MAX_RESTART_BACKOFF_S * 1000);
    assert_eq!(r.backoff_ms(100), crate::job::MAX_RESTART_BACKOFF_S * 1000);
    assert_eq!(crate::job::RestartPolicy { max: 1, backoff_s: 0 }.backoff_ms(5), 0);
}

#[test]
fn times_and_usage_follow_the_clock_and_a_time_limit_fails_the_job_at_its_deadline() {
    let t0 = 1_800_000_000_000;
    let mut view = seed_view(2);
    clock(&mut view, t0);
    let mut spec = gang(2);
    spec.run.time_limit_s = Some(10);
    spec.tenant = "vision".into();
    let job = view.submit_as(&spec, None, Some("ana")).expect("submit");
    clock(&mut view, t0 + 2_000);
    let ms: Vec<MemberPlacement> = (0..2)
        .map(|k| MemberPlacement { server: ServerId(k), gpus: 1, cores: CoreMask::range(0, 4), memory_mib: 1024 })
        .collect();
    let d =
        view.apply(&Command::Propose(vec![Proposal { id: ProposalId(9), job, members: ms, based_on: view.version() }]));
    assert!(matches!(&d, Outcome::Decided(v) if v[0].is_placed()), "{d:?}");
    assert_eq!(view.next_deadline_ms(), Some(t0 + 12_000));
    for m in 0..2 {
        report(&mut view, job, 9, m, TaskEvent::Started).expect("started");
    }
    let j = view.job(job).expect("job");
    assert_eq!((j.times.submitted_ms, j.times.placed_ms, j.times.started_ms), (t0, t0 + 2_000, t0 + 2_000));
    // A clock behind the view's changes nothing; one before the deadline neither.
    assert!(clock(&mut view, t0).is_empty());
    assert!(clock(&mut view, t0 + 11_999).is_empty());
    let v = view.version();
    // The deadline: failed, released, charged 10.5 s × 2 GPUs and 8 cores, one version.
    assert_eq!(clock(&mut view, t0 + 12_500), vec![job]);
    assert_eq!(view.version().0, v.0 + 1);
    let j = view.job(job).expect("job");
    assert_eq!(j.state, JobState::Failed);
    assert!(j.error.as_deref().is_some_and(|e| e.contains("time limit of 10 s")), "{:?}", j.error);
    assert_eq!(j.times.ended_ms, t0 + 12_500);
    assert_eq!(j.held, vec![crate::HeldSpan { from_ms: t0 + 2_000, to_ms: t0 + 12_500, gpus: 2, cores: 8 }]);
    assert_eq!(view.next_deadline_ms(), None);
    let r = view.usage_report(0, u64::MAX / 2, UsageBy::User, t0 + 20_000, None, 10);
    assert_eq!(r.rows.len(), 1);
    assert_eq!((r.rows[0].tenant.as_str(), r.rows[0].user.as_str()), ("vision", "ana"));
    assert_eq!(r.rows[0].usage, Usage { gpu_ms: 2 * 10_500, core_ms: 8 * 10_500 });
    // Another tenant's filter sees none of it; the snapshot keeps the ledger, times and
    // (for a job still placed) its deadline.
    let none = view.usage_report(0, u64::MAX / 2, UsageBy::Tenant, t0, Some(&["nlp".to_string()]), 10);
    assert_eq!(none.total, Usage::default());
    let again = placed(&mut view, 1, 10);
    let mut s = view.job(again).expect("job").spec.clone();
    s.run.time_limit_s = Some(1);
    let limited = view.submit(s).expect("submit");
    let p = Proposal {
        id: ProposalId(11),
        job: limited,
        members: vec![MemberPlacement { server: ServerId(1), gpus: 1, cores: CoreMask::range(0, 4), memory_mib: 1024 }],
        based_on: view.version(),
    };
    assert!(matches!(view.apply(&Command::Propose(vec![p])), Outcome::Decided(v) if v[0].is_placed()));
    let back = ClusterView::from_snapshot(view.snapshot());
    assert_eq!(back.state_hash(), view.state_hash());
    assert_eq!(back.next_deadline_ms(), Some(t0 + 13_500));
    assert_eq!(back.ledger(), view.ledger());
}

#[test]
fn task_reports_run_and_finish_a_gang() {
    let mut view = seed_view(2);
    let job = placed(&mut view, 2, 1);
    assert_eq!(view.job(job).map(|j| j.tasks.clone()), Some(vec![TaskState::Starting; 2]));
    assert_eq!(report(&mut view, job, 1, 0, TaskEvent::Started), Ok(JobState::Placed));
    let v = view.version();
    assert_eq!(report(&mut view, job, 1, 0, TaskEvent::Started), Ok(JobState::Placed));
    assert_eq!(view.version(), v, "a repeated report changes nothing");
    assert_eq!(report(&mut view, job, 1, 1, TaskEvent::Started), Ok(JobState::Running));
    // Reports for another placement, member or server are stale and change nothing.
    let stale = |r: Result<JobState, ViewError>| matches!(r, Err(ViewError::StaleTask { .. }));
    assert!(stale(report(&mut view, job, 9, 0, exited(0, ""))));
    assert!(stale(report(&mut view, job, 1, 5, exited(0, ""))));
    let wrong_server =
        Command::Task { job, proposal: ProposalId(1), member: 0, server: ServerId(1), event: exited(1, "") };
    assert!(matches!(view.apply(&wrong_server), Outcome::TaskReported(Err(ViewError::StaleTask { .. }))));
    assert_eq!(view.version().0, v.0 + 1);
    assert_eq!(report(&mut view, job, 1, 0, exited(0, "")), Ok(JobState::Running));
    assert_eq!(report(&mut view, job, 1, 1, exited(0, "")), Ok(JobState::Finished));
    let j = view.job(job).expect("kept");
    assert!(j.placement.is_none() && j.tasks.is_empty() && j.error.is_none());
    assert_eq!(view.servers()[0].free_gpus, 0xff);
    assert!(invariants::check(&view).is_clean());
    assert!(stale(report(&mut view, job, 1, 0, exited(0, ""))), "an ended job takes no reports");
}

#[test]
fn a_failed_member_fails_and_releases_the_gang() {
    let mut view = seed_view(2);
    let job = placed(&mut view, 2, 1);
    assert_eq!(report(&mut view, job, 1, 1, exited(127, "command `x` not found")), Ok(JobState::Failed));
    let j = view.job(job).expect("kept");
    assert_eq!(j.state, JobState::Failed);
    let e = j.error.clone().unwrap_or_default();
    assert!(e.contains("member 1") && e.contains("code 127") && e.contains("`x` not found"), "{e}");
    assert_eq!((view.servers()[0].free_gpus, view.servers()[1].free_gpus), (0xff, 0xff));
    let job = placed(&mut view, 1, 2);
    report(&mut view, job, 2, 0, exited(-9, "")).expect("applies");
    assert!(view.job(job).and_then(|j| j.error.clone()).unwrap_or_default().contains("signal 9"));
    assert!(invariants::check(&view).is_clean());
}

#[test]
fn unhealthy_devices_are_not_free_until_healthy_again() {
    let mut view = seed_view(1);
    let set = |view: &mut ClusterView, devices: u64| match view
        .apply(&Command::SetUnhealthyDevices { server: ServerId(0), devices })
    {
        Outcome::DevicesSet(r) => r,
        o => panic!("unexpected outcome {o:?}"),
    };
    let job = placed(&mut view, 1, 1); // holds device 0
    set(&mut view, 0b1001).expect("devices 0 and 3");
    assert_eq!(view.servers()[0].free_gpus, 0xff & !0b1001);
    assert!(invariants::check(&view).is_clean(), "{:?}", invariants::check(&view));
    // A proposal on the unhealthy device is refused.
    let other = view.submit(gang(1)).expect("submit");
    let p = Proposal {
        id: ProposalId(2),
        job: other,
        members: vec![MemberPlacement {
            server: ServerId(0),
            gpus: 0b1000,
            cores: CoreMask::range(4, 4),
            memory_mib: 1024,
        }],
        based_on: view.version(),
    };
    assert!(matches!(view.apply(&Command::Propose(vec![p])), Outcome::Decided(d) if !d[0].is_placed()));
    // The job keeps its unhealthy device; releasing it does not free it.
    view.release(job, false).expect("release");
    assert_eq!(view.servers()[0].free_gpus, 0xff & !0b1001);
    let snap = ClusterView::from_snapshot(view.snapshot());
    assert_eq!(snap.state_hash(), view.state_hash(), "unhealthy devices survive a snapshot");
    assert_eq!(snap.unhealthy_devices(ServerId(0)), 0b1001);
    set(&mut view, 0).expect("all healthy");
    assert_eq!(view.servers()[0].free_gpus, 0xff);
    assert!(invariants::check(&view).is_clean());
    assert!(matches!(set(&mut view, 1 << 8), Err(ViewError::BadServer(..))), "no device 8");
    assert!(matches!(
        view.apply(&Command::SetUnhealthyDevices { server: ServerId(7), devices: 1 }),
        Outcome::DevicesSet(Err(ViewError::UnknownServer(_)))
    ));
}

#[test]
fn specs_built_in_code_are_validated_not_trusted() {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
    let before = view.state_hash();
    for bad in [JobSpec::simple("zero-gpus", 1, 0), JobSpec::simple("zero-members", 0, 1)] {
        assert!(matches!(view.submit(bad.clone()), Err(ViewError::InvalidSpec(_))), "{bad:?}");
        assert!(view.never_fits(&bad).is_some());
    }
    let mut loose = JobSpec::simple("inverted", 1, 1);
    loose.prefer = LocalityLevel::Rack;
    loose.tolerate = LocalityLevel::Socket;
    assert!(matches!(view.submit(loose), Err(ViewError::InvalidSpec(e)) if e.field == "locality.tolerate"));
    assert_eq!(view.state_hash(), before, "refused submissions change nothing");
}
