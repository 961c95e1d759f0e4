//! Migration: atomic moves through the approver.
//!
//! Random fragmentation, then plans for a blocked job of random size, level and cores from
//! `migration_planner::plan`, which the leader's check
//! (`migration_check::moves_help`) lets through, applied as `Command::Migrate`, mixed
//! with corrupted moves (onto busy devices, of pending jobs) and retries. After every command
//! the invariant checker is clean and a refused move changes nothing; at the end, replaying the
//! log gives the same state hash, and so does a snapshot. A failed plan the planner remembers
//! is, through random changes, the answer its search gives.

use super::*;
use tessera_view::migration_check;
use tessera_view::migration_planner::{self, MigrationParams};

fn apply_checked(view: &mut ClusterView, log: &mut Vec<Command>, cmd: Command) -> Outcome {
    let before = view.state_hash();
    let out = view.apply(&cmd);
    if let Outcome::Decided(ds) = &out
        && ds.iter().all(|d| matches!(d, Decision::Rejected { .. } | Decision::AlreadyApplied { .. }))
    {
        assert_eq!(view.state_hash(), before, "refused or repeated moves change nothing: {ds:?}");
    }
    let r = invariants::check(view);
    assert!(r.is_clean(), "after {cmd:?}: {:?}", r.violations);
    log.push(cmd);
    out
}

/// Submits a small job and places it on the first server of a random order where it fits,
/// packed or spread at random: the job if placed.
fn submit_small(
    rng: &mut SmallRng,
    view: &mut ClusterView,
    log: &mut Vec<Command>,
    next_id: &mut u64,
) -> Option<JobId> {
    let gpus = *[1u32, 1, 1, 2, 4].choose(rng).expect("sizes");
    let mut s = JobSpec::simple("small", 1, gpus);
    s.cpu = CpuDemand::Fixed { cores_per_gpu: *[1u32, 1, 2, 4, 8, 16].choose(rng).expect("cores") };
    let Outcome::Submitted(Ok(job)) = apply_checked(view, log, Command::submit(s.clone())) else {
        return None;
    };
    let mode = if rng.random_bool(0.5) { FitMode::Spread } else { FitMode::Pack };
    let mut order: Vec<u32> = (0..view.servers().len() as u32).collect();
    order.shuffle(rng);
    let m = order.iter().find_map(|&k| {
        let rec = view.servers()[k as usize];
        let t = view.topology_of(rec.config_set);
        let req = fit::member_request(&s, t);
        fit::plan_member(t, &rec, ServerId(k), &req, LocalityLevel::Server, mode).map(|(m, _)| m)
    })?;
    *next_id += 1;
    let p = Proposal { id: ProposalId(*next_id), job, members: vec![m], based_on: view.version() };
    match apply_checked(view, log, Command::Propose(vec![p])) {
        Outcome::Decided(ds) if ds[0].is_placed() => Some(job),
        _ => None,
    }
}

fn scenario(seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let topo = Topology::preset(PRESETS[rng.random_range(0..PRESETS.len())]).expect("preset");
    let servers = rng.random_range(2..6u32);
    let spec = ClusterSpec::uniform(topo, servers, 2, 2);
    let mut view = ClusterView::from_spec(&spec);
    let mut log: Vec<Command> = Vec::new();
    let mut next_id = 1u64;
    let mut placed: Vec<JobId> = Vec::new();
    for _ in 0..rng.random_range(4..60) {
        if let Some(job) = submit_small(&mut rng, &mut view, &mut log, &mut next_id) {
            placed.push(job);
        }
        if !placed.is_empty() && rng.random_bool(0.3) {
            let j = placed.swap_remove(rng.random_range(0..placed.len()));
            apply_checked(&mut view, &mut log, Command::Release { job: j, failed: false });
        }
    }
    // The blocked job: a whole server, or 2 or 4 GPUs at a level whose groups may hold them
    // (the planner then frees a group occupant by occupant), wanting 1 to 6 cores per GPU.
    let devices = view.topologies()[0].devices;
    let big_gpus = *[devices, 2, 4].choose(&mut rng).expect("sizes");
    let level =
        *[LocalityLevel::PcieSwitch, LocalityLevel::Socket, LocalityLevel::Server].choose(&mut rng).expect("levels");
    let mut big = JobSpec::simple("big", 1, big_gpus);
    big.cpu = CpuDemand::Fixed { cores_per_gpu: rng.random_range(1..=6u32).min(32 / big_gpus) }; // every preset has 32 cores or more
    let Outcome::Submitted(Ok(big)) = apply_checked(&mut view, &mut log, Command::submit(big)) else {
        panic!("a one-server job fits")
    };
    let remaining: BTreeMap<JobId, f64> =
        placed.iter().map(|&j| (j, if rng.random_bool(0.2) { 1.0 } else { 1e9 })).collect();
    let params = MigrationParams { max_moves: rng.random_range(0..6), ..MigrationParams::default() };
    let plan = migration_planner::plan(&view, big, level, &remaining, &params);
    if let Some(plan) = plan {
        assert!(plan.moves.len() <= params.max_moves);
        for m in &plan.moves {
            assert!(remaining.get(&m.job).is_none_or(|r| *r >= params.min_remaining_s), "a job near its end moved");
        }
        // A corrupted move first: onto the target's devices when a job holds them, or a
        // move of the pending big job; either is refused whole.
        next_id += 1;
        let bad =
            Proposal { id: ProposalId(next_id), job: big, members: plan.target.clone(), based_on: view.version() };
        let out = apply_checked(&mut view, &mut log, Command::Migrate(vec![bad]));
        assert!(matches!(&out, Outcome::Decided(ds) if !ds[0].is_placed()), "{out:?}");
        let moves: Vec<Proposal> = plan
            .moves
            .iter()
            .map(|m| {
                next_id += 1;
                Proposal { id: ProposalId(next_id), job: m.job, members: m.to.clone(), based_on: view.version() }
            })
            .collect();
        if !moves.is_empty() {
            // The leader lets a host make them: each frees what the target or a needed move takes.
            let helps = migration_check::moves_help(&view, big, &plan.target, &moves);
            assert_eq!(helps, Ok(()), "{plan:?}");
        }
        let out = apply_checked(&mut view, &mut log, Command::Migrate(moves.clone()));
        assert!(matches!(&out, Outcome::Decided(ds) if ds.iter().all(Decision::is_placed)), "{out:?}");
        for m in &moves {
            assert_eq!(view.job(m.job).map(|j| j.state), Some(JobState::Migrating));
        }
        // A resend: the leader lets it through (nothing left to help), the approver changes nothing.
        if !moves.is_empty() {
            assert_eq!(migration_check::moves_help(&view, big, &plan.target, &moves), Ok(()), "a resend");
        }
        let out = apply_checked(&mut view, &mut log, Command::Migrate(moves.clone()));
        assert!(
            matches!(&out, Outcome::Decided(ds) if ds.iter().all(|d| matches!(d, Decision::AlreadyApplied { .. })))
        );
        next_id += 1;
        let target = Proposal { id: ProposalId(next_id), job: big, members: plan.target, based_on: view.version() };
        let out = apply_checked(&mut view, &mut log, Command::Propose(vec![target]));
        assert!(matches!(&out, Outcome::Decided(ds) if ds[0].is_placed()), "the plan's target is accepted: {out:?}");
        for m in &moves {
            let mem = &m.members[0];
            let ev =
                Command::Task { job: m.job, proposal: m.id, member: 0, server: mem.server, event: TaskEvent::Started };
            assert_eq!(apply_checked(&mut view, &mut log, ev), Outcome::TaskReported(Ok(JobState::Running)));
        }
    }
    let mut replay = ClusterView::from_spec(&spec);
    for c in &log {
        replay.apply(c);
    }
    assert_eq!(replay.state_hash(), view.state_hash(), "replaying the log gives the same state");
    assert_eq!(ClusterView::from_snapshot(view.snapshot()).state_hash(), view.state_hash());
}

/// A failure the planner remembers (`migration_planner::FailedPlans`) is the answer its search
/// gives: through random changes to jobs, remaining times and rules (or none), one memory kept
/// across them, `plan_remembering` answers as `plan` does for two blocked jobs at two levels.
fn remembered_scenario(seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let topo = Topology::preset(PRESETS[rng.random_range(0..PRESETS.len())]).expect("preset");
    let devices = topo.devices;
    let spec = ClusterSpec::uniform(topo, rng.random_range(2..5u32), 2, 2);
    let mut view = ClusterView::from_spec(&spec);
    let mut log: Vec<Command> = Vec::new();
    let mut next_id = 1u64;
    let mut placed: Vec<JobId> = Vec::new();
    for _ in 0..rng.random_range(4..30) {
        placed.extend(submit_small(&mut rng, &mut view, &mut log, &mut next_id));
    }
    let mut blocked = Vec::new();
    for gpus in [devices, (devices / 2).max(2)] {
        let mut s = JobSpec::simple("blocked", 1, gpus);
        s.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
        let Outcome::Submitted(Ok(job)) = apply_checked(&mut view, &mut log, Command::submit(s)) else {
            panic!("a one-server job fits")
        };
        blocked.push(job);
    }
    let mut remaining: BTreeMap<JobId, f64> = BTreeMap::new();
    let mut params = MigrationParams { max_moves: rng.random_range(0..4), ..MigrationParams::default() };
    let mut failed = migration_planner::FailedPlans::default();
    let mut searched = 0;
    for _ in 0..rng.random_range(10..40) {
        match rng.random_range(0..7) {
            0 if !placed.is_empty() => {
                let j = placed.swap_remove(rng.random_range(0..placed.len()));
                apply_checked(&mut view, &mut log, Command::Release { job: j, failed: false });
            }
            1 => placed.extend(submit_small(&mut rng, &mut view, &mut log, &mut next_id)),
            2 => {
                // A job that arrives and waits.
                apply_checked(&mut view, &mut log, Command::submit(JobSpec::simple("waits", 1, devices)));
            }
            3 if !placed.is_empty() => {
                let j = placed[rng.random_range(0..placed.len())];
                remaining.insert(j, if rng.random_bool(0.5) { 1.0 } else { 1e9 });
            }
            4 => params.max_moves = rng.random_range(0..4),
            5 => params.chained_moves = !params.chained_moves,
            _ => {}
        }
        for &job in &blocked {
            for level in [LocalityLevel::Server, LocalityLevel::Socket] {
                let p = migration_planner::plan(&view, job, level, &remaining, &params);
                let before = failed.remembered();
                let r = migration_planner::plan_remembering(&view, job, level, &remaining, &params, &mut failed);
                assert_eq!(r, p, "job {job:?} at {level:?}");
                searched += usize::from(failed.remembered() == before);
            }
        }
    }
    assert!(searched > 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    #[test]
    fn a_remembered_failed_plan_is_the_planners_answer(seed in any::<u64>()) {
        remembered_scenario(seed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    #[test]
    fn moves_are_atomic_idempotent_and_keep_every_invariant(seed in any::<u64>()) {
        scenario(seed);
    }
}
