//! Plain tests: targeted scenarios the random world reaches only by chance.

use super::*;

/// `servers` seed-8gpu servers, `per_rack` to a rack, two racks to an InfiniBand domain.
fn seed_view(servers: u32, per_rack: u32) -> ClusterView {
    ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), servers, per_rack, 2))
}

fn submit(view: &mut ClusterView, spec: JobSpec) -> JobId {
    match view.apply(&Command::submit(spec)) {
        Outcome::Submitted(Ok(id)) => id,
        other => panic!("submit: {other:?}"),
    }
}

fn decide(view: &mut ClusterView, p: &Proposal) -> Decision {
    match view.apply(&Command::Propose(vec![p.clone()])) {
        Outcome::Decided(mut ds) if ds.len() == 1 => ds.remove(0),
        other => panic!("propose: {other:?}"),
    }
}

/// Plans member `i` of `spec` on `on[i]`, with the shared fit function, on a copy of `servers`.
fn plan_on(view: &ClusterView, servers: &[ServerRecord], spec: &JobSpec, on: &[u32]) -> Vec<MemberPlacement> {
    let layout = Layout::of(view);
    let mut recs = servers.to_vec();
    on.iter()
        .map(|&s| {
            let rec = recs[s as usize];
            let topo = layout.topo(&rec);
            let req = fit::member_request(spec, topo);
            let (m, _) = fit::plan_member(topo, &rec, ServerId(s), &req, LocalityLevel::Server, FitMode::Pack)
                .unwrap_or_else(|| panic!("member does not fit on server#{s}"));
            take(&mut recs[s as usize], &m);
            m
        })
        .collect()
}

fn clean(view: &ClusterView) {
    let rep = invariants::check(view);
    assert!(rep.is_clean(), "{:#?}", rep.violations);
}

/// `fresh` starts with the current records of exactly the `conflicting` servers, in member order
/// (anything after them changed since the proposal's version; see `check_fresh`).
fn assert_fresh(view: &ClusterView, p: &Proposal, fresh: &[(ServerId, ServerRecord)], conflicting: &[u32]) {
    let want: Vec<(ServerId, ServerRecord)> =
        conflicting.iter().map(|&s| (ServerId(s), *view.server(ServerId(s)).expect("server"))).collect();
    assert!(fresh.len() >= want.len() && fresh[..want.len()] == want[..], "fresh {fresh:?}, want first {want:?}");
    let set = want.iter().map(|(s, _)| *s).collect();
    check_fresh(view, p, fresh, &set).unwrap_or_else(|e| panic!("{e:#}"));
}

fn rejected(d: Decision) -> (Rejection, Vec<(ServerId, ServerRecord)>) {
    match d {
        Decision::Rejected { reason, fresh, .. } => (reason, fresh),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn conflict_rejection_carries_fresh_record_of_every_conflicting_server() {
    let mut view = seed_view(4, 4);
    let a = submit(&mut view, JobSpec::simple("a", 2, 4));
    let b = submit(&mut view, JobSpec::simple("b", 2, 4));
    let c = submit(&mut view, JobSpec::simple("c", 2, 4));
    // Two schedulers plan on the same snapshot and pick the same devices.
    let snap = view.snapshot();
    let pa = Proposal {
        id: ProposalId(1),
        job: a,
        members: plan_on(&view, &snap.servers, &view.job(a).expect("a").spec, &[0, 1]),
        based_on: snap.version,
    };
    let pb = Proposal {
        id: ProposalId(2),
        job: b,
        members: plan_on(&view, &snap.servers, &view.job(b).expect("b").spec, &[0, 1]),
        based_on: snap.version,
    };
    let devices = |p: &Proposal| p.members.iter().map(|m| (m.server, m.gpus)).collect::<Vec<_>>();
    assert_eq!(devices(&pa), devices(&pb), "both planned the same devices");
    assert!(matches!(decide(&mut view, &pa), Decision::Accepted { .. }));
    let (h, v) = (view.state_hash(), view.version());
    let mut fresh_all = Vec::new();
    let (reason, fresh) = rejected(decide(&mut view, &pb));
    assert!(reason.is_conflict(), "{reason:?}");
    assert_eq!(reason, Rejection::DevicesBusy { server: ServerId(0), mask: pa.members[0].gpus });
    assert_fresh(&view, &pb, &fresh, &[0, 1]);
    assert_eq!((view.state_hash(), view.version()), (h, v), "a rejection changes nothing");
    fresh_all.extend(fresh);

    // The conflicting server comes back first: b on a busy server and a free one.
    let pb2 = Proposal {
        id: ProposalId(3),
        members: plan_on(&view, &snap.servers, &view.job(b).expect("b").spec, &[1, 2]),
        ..pb.clone()
    };
    let (reason, fresh) = rejected(decide(&mut view, &pb2));
    assert!(matches!(reason, Rejection::DevicesBusy { server: ServerId(1), .. }), "{reason:?}");
    assert_fresh(&view, &pb2, &fresh, &[1]);
    fresh_all.extend(fresh);

    // A down server is a conflict too, and its record comes back with the busy one.
    assert_eq!(
        view.apply(&Command::SetHealth { server: ServerId(3), health: Health::Down, at_ms: 0 }),
        Outcome::HealthSet(Ok(vec![]))
    );
    let pc = Proposal {
        id: ProposalId(4),
        job: c,
        members: plan_on(&view, &snap.servers, &view.job(c).expect("c").spec, &[0, 3]),
        based_on: snap.version,
    };
    let (reason, fresh) = rejected(decide(&mut view, &pc));
    assert!(matches!(reason, Rejection::DevicesBusy { server: ServerId(0), .. }), "{reason:?}");
    assert_fresh(&view, &pc, &fresh, &[0, 3]);
    assert_eq!(fresh[1].1.health, Health::Down);
    fresh_all.extend(fresh);

    // A scheduler that applies every fresh record it got to its stale copy plans a gang that is
    // accepted: it avoids the down server and the devices now taken.
    let mut stale = snap.servers.clone();
    for (s, rec) in fresh_all {
        stale[s.index()] = rec;
    }
    let spec = view.job(c).expect("c").spec.clone();
    let mut members = Vec::new();
    for _ in 0..spec.members {
        let (s, m) = (0..stale.len())
            .find_map(|s| {
                let topo = Topology::preset("seed-8gpu").expect("preset");
                let req = fit::member_request(&spec, &topo);
                fit::plan_member(&topo, &stale[s], ServerId(s as u32), &req, LocalityLevel::Server, FitMode::Pack)
                    .map(|(m, _)| (s, m))
            })
            .expect("a member fits on the refreshed copy");
        take(&mut stale[s], &m);
        members.push(m);
    }
    assert!(members.iter().all(|m| m.server != ServerId(3)), "{members:?}");
    let retry = Proposal { id: ProposalId(5), members, ..pc };
    assert!(matches!(decide(&mut view, &retry), Decision::Accepted { .. }));
    clean(&view);
}

#[test]
fn down_server_requeues_a_multi_member_gang_whole_and_frees_every_member() {
    let mut view = seed_view(4, 2);
    let empty = view.servers().to_vec();
    let mut gang = JobSpec::simple("gang", 3, 4);
    gang.cpu = CpuDemand::Fixed { cores_per_gpu: 2 };
    gang.tenant = "vision".into();
    let g = submit(&mut view, gang.clone());
    let solo = submit(&mut view, JobSpec::simple("solo", 1, 8));
    let side = submit(&mut view, JobSpec::simple("side", 1, 2));
    let pg = Proposal {
        id: ProposalId(10),
        job: g,
        members: plan_on(&view, view.servers(), &gang, &[0, 1, 2]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &pg), Decision::Accepted { level: LocalityLevel::IbDomain, .. }));
    let ps = Proposal {
        id: ProposalId(11),
        job: solo,
        members: plan_on(&view, view.servers(), &view.job(solo).expect("solo").spec, &[3]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &ps), Decision::Accepted { .. }));
    let pside = Proposal {
        id: ProposalId(12),
        job: side,
        members: plan_on(&view, view.servers(), &view.job(side).expect("side").spec, &[0]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &pside), Decision::Accepted { .. }));
    assert_eq!(view.tenant_used("vision"), 12);
    let before = view.clone();

    let out = view.apply(&Command::SetHealth { server: ServerId(1), health: Health::Down, at_ms: 0 });
    assert_eq!(out, Outcome::HealthSet(Ok(vec![g])));
    let j = view.job(g).expect("gang");
    assert_eq!((j.state, j.placement.is_none()), (JobState::Pending, true), "re-queued whole");
    assert_eq!(view.tenant_used("vision"), 0);
    // Every member's resources are back, on every server: server 0 holds only `side`, 1 and 2 nothing.
    let mut want = empty.clone();
    adjust(&mut want, &pside.members, true);
    adjust(&mut want, &ps.members, true);
    want[1].health = Health::Down;
    assert_eq!(view.servers(), want.as_slice());
    assert_eq!(view.job(solo), before.job(solo), "a gang without a member there is untouched");
    assert_eq!(view.job(side), before.job(side));
    clean(&view);

    // The job is placed again elsewhere; a gang naming the down server is refused as a conflict.
    let resent = Proposal { id: ProposalId(13), ..pg.clone() };
    let (reason, fresh) = rejected(decide(&mut view, &resent));
    assert_eq!(reason, Rejection::ServerNotUp { server: ServerId(1), health: Health::Down });
    assert_fresh(&view, &resent, &fresh, &[1]);
    let again = Proposal {
        id: ProposalId(14),
        job: g,
        members: plan_on(&view, view.servers(), &gang, &[0, 2, 2]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &again), Decision::Accepted { .. }));
    assert_eq!(view.job(g).and_then(|j| j.placement.as_ref()).map(|p| p.members.len()), Some(3));
    clean(&view);
}

#[test]
fn quota_is_enforced_at_submit_and_at_approval() {
    let mut spec = ClusterSpec::uniform(Topology::preset("pcie-4gpu").expect("preset"), 4, 2, 1);
    spec.quotas.insert("vision".into(), 8);
    let mut view = ClusterView::from_spec(&spec);
    let job = |name: &str, members: u32, gpus: u32| {
        let mut s = JobSpec::simple(name, members, gpus);
        s.tenant = "vision".into();
        s
    };
    // More than the quota can never run.
    let (h, v) = (view.state_hash(), view.version());
    let out = view.apply(&Command::submit(job("huge", 3, 4)));
    assert!(matches!(&out, Outcome::Submitted(Err(ViewError::NeverFits(m))) if m.contains("quota")), "{out:?}");
    assert_eq!((view.state_hash(), view.version()), (h, v));
    let a = submit(&mut view, job("a", 2, 4));
    let b = submit(&mut view, job("b", 1, 2));
    let other = submit(&mut view, JobSpec::simple("other", 1, 4));
    let pa = Proposal {
        id: ProposalId(1),
        job: a,
        members: plan_on(&view, view.servers(), &job("a", 2, 4), &[0, 1]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &pa), Decision::Accepted { .. }));
    assert_eq!(view.tenant_used("vision"), 8);
    let pb = Proposal {
        id: ProposalId(2),
        job: b,
        members: plan_on(&view, view.servers(), &job("b", 1, 2), &[2]),
        based_on: view.version(),
    };
    let (h, v) = (view.state_hash(), view.version());
    let (reason, fresh) = rejected(decide(&mut view, &pb));
    assert_eq!(reason, Rejection::QuotaExceeded { tenant: "vision".into(), class: None, quota: 8, used: 8, asked: 2 });
    assert!(reason.is_conflict() && fresh.is_empty(), "quota is a retryable conflict with no stale server");
    assert_eq!((view.state_hash(), view.version()), (h, v));
    // Other tenants are not limited.
    let po = Proposal {
        id: ProposalId(3),
        job: other,
        members: plan_on(&view, view.servers(), &JobSpec::simple("o", 1, 4), &[3]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &po), Decision::Accepted { .. }));
    // Once the tenant releases, the same placement is accepted under a new id.
    assert_eq!(view.apply(&Command::Release { job: a, failed: false }), Outcome::Ended(Ok(())));
    assert!(matches!(decide(&mut view, &Proposal { id: ProposalId(4), ..pb }), Decision::Accepted { .. }));
    assert_eq!(view.tenant_used("vision"), 2);
    clean(&view);
}

#[test]
fn jobs_that_can_never_fit_are_refused_at_submit() {
    let mut view = seed_view(4, 2);
    let (h, v) = (view.state_hash(), view.version());
    let refused = |view: &mut ClusterView, spec: JobSpec| match view.apply(&Command::submit(spec)) {
        Outcome::Submitted(Err(ViewError::NeverFits(why))) => why,
        other => panic!("expected a never-fits refusal, got {other:?}"),
    };
    // Larger than the whole cluster (4 servers x 8 GPUs).
    let why = refused(&mut view, JobSpec::simple("big", 5, 8));
    assert!(why.contains("5 members"), "{why}");
    // More GPUs per member than any server has.
    refused(&mut view, JobSpec::simple("wide", 1, 9));
    // An unknown device type.
    let mut typed = JobSpec::simple("typed", 1, 1);
    typed.gpu_type = Some("nvidia-bogus-1g".into());
    let why = refused(&mut view, typed);
    assert!(why.contains("nvidia-bogus-1g"), "{why}");
    // One server cannot hold two whole-server members.
    let mut tight = JobSpec::simple("tight", 2, 8);
    tight.tolerate = LocalityLevel::Server;
    refused(&mut view, tight);
    // One rack holds two servers: three whole-server members cannot share a rack.
    let mut rack = JobSpec::simple("rack", 3, 8);
    rack.tolerate = LocalityLevel::Rack;
    refused(&mut view, rack);
    assert_eq!((view.state_hash(), view.version()), (h, v), "refusals change nothing");
    assert!(view.jobs().is_empty());
    // The largest job that does fit is admitted.
    let ok = submit(&mut view, JobSpec::simple("fits", 4, 8));
    assert_eq!(view.job(ok).map(|j| j.state), Some(JobState::Pending));
}

#[test]
fn large_gangs_are_checked_for_overlap_too() {
    // More than 16 members switches the approver's overlap detection to a map.
    let spec = ClusterSpec::uniform(Topology::preset("pcie-4gpu").expect("preset"), 6, 6, 1);
    let mut view = ClusterView::from_spec(&spec);
    let gang = JobSpec::simple("many", 20, 1);
    let j = submit(&mut view, gang.clone());
    let on: Vec<u32> = (0..20).map(|i| i % 6).collect();
    let members = plan_on(&view, view.servers(), &gang, &on);
    let (h, v) = (view.state_hash(), view.version());
    for dup in [6usize, 17, 19] {
        // Member `dup` repeats member `dup - 6`, which sits on the same server.
        let mut bad = members.clone();
        bad[dup] = bad[dup - 6];
        let p = Proposal { id: ProposalId(dup as u64), job: j, members: bad.clone(), based_on: v };
        let (reason, _) = rejected(decide(&mut view, &p));
        assert_eq!(reason, Rejection::OverlapWithinGang { server: bad[dup].server }, "duplicate at {dup}");
        assert_eq!((view.state_hash(), view.version()), (h, v));
    }
    let p = Proposal { id: ProposalId(100), job: j, members, based_on: v };
    assert!(matches!(decide(&mut view, &p), Decision::Accepted { .. }));
    clean(&view);
}

/// A replica rebuilt from a snapshot must stay identical to the view it was taken from when both
/// apply the same commands. Regression: `from_snapshot` once rebuilt the queue of ended jobs in
/// job-id order instead of the order the jobs ended, so once more than `ended_jobs_kept` jobs
/// had ended the two forgot different jobs and their state hashes diverged.
#[test]
fn replica_from_snapshot_forgets_the_same_ended_jobs() {
    let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
    let mut view = ClusterView::from_spec(&spec).with_limits(DEFAULT_CHANGE_LOG, 2);
    let a = submit(&mut view, JobSpec::simple("a", 1, 1));
    let b = submit(&mut view, JobSpec::simple("b", 1, 1));
    // b ends before a.
    assert_eq!(view.apply(&Command::Cancel { job: b, reason: None, grace_s: None }), Outcome::Ended(Ok(())));
    assert_eq!(view.apply(&Command::Cancel { job: a, reason: None, grace_s: None }), Outcome::Ended(Ok(())));
    let mut replica = ClusterView::from_snapshot(view.snapshot()).with_limits(DEFAULT_CHANGE_LOG, 2);
    assert_eq!(replica.state_hash(), view.state_hash());
    // A third job ends: the oldest ended job (b) should be forgotten on both.
    for v in [&mut view, &mut replica] {
        let c = submit(v, JobSpec::simple("c", 1, 1));
        assert_eq!(v.apply(&Command::Cancel { job: c, reason: None, grace_s: None }), Outcome::Ended(Ok(())));
    }
    assert!(view.job(b).is_none() && view.job(a).is_some(), "the view forgets the first job to end");
    assert_eq!(replica.job(a).is_some(), view.job(a).is_some(), "the replica forgot another job");
    assert_eq!(replica.state_hash(), view.state_hash(), "replica diverged");
}

/// Regression: the approver applies a proposal id at most once. The view once forgot an id when
/// its gang was freed, so a late retry of an accepted proposal, arriving after its server went
/// down and came back, was applied a second time. Now it is refused as spent.
#[test]
fn a_proposal_id_is_applied_at_most_once() {
    let mut view = seed_view(2, 2);
    let spec = JobSpec::simple("j", 1, 8);
    let j = submit(&mut view, spec.clone());
    let p = Proposal {
        id: ProposalId(7),
        job: j,
        members: plan_on(&view, view.servers(), &spec, &[0]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &p), Decision::Accepted { .. }));
    assert!(matches!(decide(&mut view, &p), Decision::AlreadyApplied { .. }), "a retry while placed");
    assert_eq!(
        view.apply(&Command::SetHealth { server: ServerId(0), health: Health::Down, at_ms: 0 }),
        Outcome::HealthSet(Ok(vec![j]))
    );
    assert_eq!(
        view.apply(&Command::SetHealth { server: ServerId(0), health: Health::Up, at_ms: 0 }),
        Outcome::HealthSet(Ok(vec![]))
    );
    // The scheduler never saw the first answer and retries the same proposal.
    let (h, v) = (view.state_hash(), view.version());
    let d = decide(&mut view, &p);
    assert!(
        matches!(&d, Decision::Rejected { reason: Rejection::ProposalSpent, .. }),
        "proposal id applied twice: {d:?}"
    );
    assert_eq!((view.state_hash(), view.version()), (h, v));
}

/// Regression: `never_fits` once sized an intra-server tolerance by that level's groups alone.
/// A gang whose devices share an NVLink group is at `pcie-switch`, tighter than `socket`: on
/// `dgx-h100` (one 8-GPU NVLink group, 4-GPU sockets) a 6-GPU job tolerating `socket` fits at
/// `pcie-switch`, and must be admitted.
#[test]
fn never_fits_counts_nvlink_groups_within_a_socket_tolerance() {
    let spec = ClusterSpec::uniform(Topology::preset("dgx-h100").expect("preset"), 1, 1, 1);
    let mut view = ClusterView::from_spec(&spec);
    let mut job = JobSpec::simple("six", 1, 6);
    job.prefer = LocalityLevel::Socket;
    job.tolerate = LocalityLevel::Socket;
    // The shared fit function places it within the tolerance on the empty server.
    let topo = &view.topologies()[0];
    let req = fit::member_request(&job, topo);
    let rec = view.servers()[0];
    let (_, level) = fit::plan_member(topo, &rec, ServerId(0), &req, LocalityLevel::Socket, FitMode::Pack)
        .expect("fits at pcie-switch");
    assert_eq!(level, LocalityLevel::PcieSwitch);
    let out = view.apply(&Command::submit(job));
    assert!(matches!(out, Outcome::Submitted(Ok(_))), "refused a job that fits: {out:?}");
}

/// Regression: `never_fits` once checked one member's cores and memory, so gangs whose members
/// cannot share a server for cores or memory were admitted to wait forever.
#[test]
fn never_fits_counts_every_members_cores_and_memory() {
    // One seed-8gpu server (32 cores, 384 GiB) per rack.
    let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 4, 1, 4);
    let mut view = ClusterView::from_spec(&spec);
    let mut mem = JobSpec::simple("mem", 2, 2);
    mem.memory_mib_per_gpu = Some(98_305); // 2 members x 2 GPUs x 98,305 MiB > 393,216 MiB
    mem.tolerate = LocalityLevel::Server;
    assert!(view.never_fits(&mem).is_some_and(|w| w.contains("cores and memory")), "{:?}", view.never_fits(&mem));
    mem.tolerate = LocalityLevel::Rack;
    assert!(view.never_fits(&mem).is_some(), "one server per rack cannot hold both members");
    mem.tolerate = LocalityLevel::Any;
    assert!(view.never_fits(&mem).is_none(), "two servers anywhere can");
    let mut cpu = JobSpec::simple("cpu", 2, 1);
    cpu.cpu = CpuDemand::Fixed { cores_per_gpu: 20 };
    cpu.tolerate = LocalityLevel::Rack;
    assert!(view.never_fits(&cpu).is_some(), "two 20-core members never share a 32-core server");
    cpu.tolerate = LocalityLevel::IbDomain;
    assert!(view.never_fits(&cpu).is_none());
    assert!(matches!(view.apply(&Command::submit(cpu)), Outcome::Submitted(Ok(_))));
}

/// A cordon outlives the server going down and its agent coming back; the approver places
/// nothing on it; uncordon makes it placeable again; the history keeps the latest changes only,
/// and survives a snapshot.
#[test]
fn a_cordon_outlives_a_lost_server_and_blocks_placements_until_lifted() {
    use tessera_view::server::HEALTH_HISTORY;
    let mut view = seed_view(2, 2);
    let s0 = ServerId(0);
    let cordon = Cordon { reason: "replace a fan".into(), since_ms: 1_000, drain_by_ms: None };
    assert_eq!(view.apply(&Command::Cordon { server: s0, cordon: cordon.clone() }), Outcome::HealthSet(Ok(vec![])));
    assert_eq!(view.server(s0).map(|r| r.health), Some(Health::Draining));
    for (health, want) in [(Health::Down, Health::Down), (Health::Up, Health::Draining)] {
        view.apply(&Command::SetHealth { server: s0, health, at_ms: 2_000 });
        assert_eq!(view.server(s0).map(|r| r.health), Some(want), "after {health}");
        assert_eq!(view.cordon_of(s0), Some(&cordon));
    }
    let spec = JobSpec::simple("on-cordoned", 1, 2);
    let j = submit(&mut view, spec.clone());
    let members = plan_on(&view, &[ServerRecord { health: Health::Up, ..view.servers()[0] }], &spec, &[0]);
    let p = Proposal { id: ProposalId(1), job: j, members, based_on: view.version() };
    let (reason, _) = rejected(decide(&mut view, &p));
    assert!(matches!(reason, Rejection::ServerNotUp { health: Health::Draining, .. }), "{reason:?}");
    // An eviction needs a cordon; uncordon lifts it and the same plan is accepted.
    view.apply(&Command::Uncordon { server: s0, at_ms: 3_000 });
    assert!(matches!(
        view.apply(&Command::Evict { server: s0, at_ms: 3_001 }),
        Outcome::HealthSet(Err(ViewError::BadServer(..)))
    ));
    assert_eq!(view.server(s0).map(|r| r.health), Some(Health::Up));
    let p = Proposal { id: ProposalId(2), based_on: view.version(), ..p };
    assert!(matches!(decide(&mut view, &p), Decision::Accepted { .. }));
    // A drain's eviction re-queues it whole.
    let drain = Cordon { drain_by_ms: Some(9_000), ..cordon };
    view.apply(&Command::Cordon { server: s0, cordon: drain });
    assert_eq!(view.apply(&Command::Evict { server: s0, at_ms: 9_000 }), Outcome::HealthSet(Ok(vec![j])));
    assert_eq!(view.job(j).map(|x| x.state), Some(JobState::Pending));
    clean(&view);
    let whats: Vec<&str> = view.health_history(s0).map(|c| c.why.as_str()).collect();
    assert_eq!(whats.first(), Some(&"cordoned: replace a fan"), "{whats:?}");
    assert!(whats.last().is_some_and(|w| w.starts_with("drain deadline passed: 1 gang")), "{whats:?}");
    for i in 0..2 * HEALTH_HISTORY as u64 {
        view.apply(&Command::SetHealth { server: s0, health: [Health::Down, Health::Up][i as usize % 2], at_ms: i });
    }
    assert_eq!(view.health_history(s0).count(), HEALTH_HISTORY, "the history is bounded");
    let back = ClusterView::from_snapshot(view.snapshot());
    assert_eq!(back.state_hash(), view.state_hash());
    assert_eq!(back.health_history(s0).collect::<Vec<_>>(), view.health_history(s0).collect::<Vec<_>>());
    assert_eq!(back.cordon_of(s0), view.cordon_of(s0));
}
