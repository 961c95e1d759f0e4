//! Live migration in a scheduler host: moves small running jobs out of the way of a pending
//! job that fragmentation blocks.
//!
//! Every [`MigrationConfig::interval`] the host's migration task looks at the pending jobs the
//! host holds that have waited at least [`MigrationConfig::min_wait`], highest rank, then
//! smallest first ([`plan_order`]). A job is a candidate ([`may_plan_for`], the simulator's
//! rule too) when it needs more than one GPU, the GPUs of its type are busy (used fraction at
//! least [`MigrationConfig::min_utilization`]: under light load a free group turns up by
//! itself) and enough of them are free in total, and it cannot start now at a looser level it tolerates
//! (a job that declares its loss per level and waits for a tighter one waits by choice:
//! [`crate::locality_cost::can_start_looser`]). For the first candidates it reads a linearizable
//! snapshot, rebuilds the [`ClusterView`] from it and asks the pure planner
//! ([`tessera_view::migration_planner::plan_remembering`]) for the fewest moves that free a group
//! at the job's allowed level; a job the planner found no moves for is not searched for again
//! until something it reads changes. A plan with no moves means the job is not blocked (its scheduler task will
//! place it); otherwise the moves go to the leader in one `Migrate` call, each decided
//! atomically on its own by the approver (release old + take new). The blocked job itself is
//! then placed by its own scheduler task, which wakes on the view change like after any
//! release. The node agents do the rest: the old member is checkpointed and stopped
//! (SIGUSR1, grace, SIGTERM), the new one started, and its start report makes the job
//! `Running` again.
//!
//! Bounds: one plan per interval, at most `params.max_moves` moves in it per member of the
//! blocked job ([`MigrationParams::moves_for`]: a gang of `k` servers needs `k` freed), and a job moved
//! less than [`MigrationConfig::cooldown`] ago is never moved again. Live jobs carry no
//! remaining-time estimate, so the planner treats every job as far from its end; the cooldown
//! reaches the planner as a remaining time of −∞ (never moved). Each round counts its plans
//! (`tessera_host_migration_plans_total`): `moves` for the one sent, `none` for each candidate
//! no moves within those bounds could help.
//!
//! Hosts migrate only for the jobs they hold (each `Migrate` call names the job its moves make
//! room for, and the leader refuses a host that does not hold it), so no job is planned for by
//! two hosts; two hosts' moves may still race for the same GPUs, and the approver refuses the
//! loser's.

use crate::cache::ViewCache;
use crate::error::SchedulerError;
use crate::locality_cost;
use crate::reservation::Reservations;
use rand::Rng;
use rand::rngs::SmallRng;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use tessera_proto::backoff::seeded_rng;
use tessera_proto::client::ViewClient;
use tessera_proto::{RemoteDecision, v1};
use tessera_view::migration_planner::{self, FailedPlans, MigrationParams, MigrationPlan};
use tessera_view::{ClusterView, Health, JobId, JobState, Proposal, ProposalId, ViewSnapshot};
use tokio::sync::watch;

/// Candidates planned for per interval, at most (each plan costs a snapshot-sized rebuild).
pub(crate) const CANDIDATES_PER_INTERVAL: usize = 4;

/// How a host migrates.
#[derive(Clone, Debug, PartialEq)]
pub struct MigrationConfig {
    /// How often the host looks for blocked jobs; `None` turns live migration off.
    pub interval: Option<Duration>,
    /// Least used fraction of the blocked job's GPU type for moves to be planned.
    pub min_utilization: f64,
    /// Least time a job waits (since the host adopted it) before moves are planned for it:
    /// its scheduler gets the first chance.
    pub min_wait: Duration,
    /// A job moved less than this long ago is not moved again.
    pub cooldown: Duration,
    /// The planner's rules; [`MigrationParams::moves_for`] also bounds the moves of one interval.
    pub params: MigrationParams,
}

impl Default for MigrationConfig {
    fn default() -> Self {
        MigrationConfig {
            interval: Some(Duration::from_secs(5)),
            min_utilization: 0.5,
            min_wait: Duration::from_secs(5),
            cooldown: Duration::from_secs(300),
            params: MigrationParams::default(),
        }
    }
}

/// The jobs a host holds, with when it adopted each (published by the host loop).
pub(crate) type Held = watch::Receiver<Vec<(JobId, Instant)>>;

/// Runs the migration task until the host drops `held`'s sender (or forever, if it never
/// does); `host` names the host in logs.
pub(crate) async fn run(
    cfg: MigrationConfig,
    host: String,
    mut client: ViewClient,
    cache: ViewCache,
    held: Held,
    metrics: crate::metrics::HostMetrics,
    reserve: bool,
) {
    let Some(interval) = cfg.interval else { return };
    let mut moved_at: HashMap<JobId, Instant> = HashMap::new();
    // Failed plans, until what the planner reads changes: most rounds find the cluster as the
    // last one did, and plan for the same blocked jobs.
    let mut failed = FailedPlans::default();
    // Proposal ids only need to differ from every other id; the clock and the host's name
    // make this host's sequence its own.
    let mut rng = seeded_rng(crate::host::fnv(&host));
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // The host stopped (its sender is gone).
        if held.has_changed().is_err() {
            return;
        }
        moved_at.retain(|_, t| t.elapsed() < cfg.cooldown);
        let candidates = candidates(&cfg, &cache, &held.borrow());
        if candidates.is_empty() {
            continue;
        }
        // The host's reservation as it stands now (none where the host makes none).
        let reserved =
            if reserve { cache.read(|s| (s.reservations.clone(), s.now_s())) } else { (Reservations::new(), 0.0) };
        match step(&cfg, &mut client, &mut rng, &candidates, &moved_at, &reserved, &mut failed).await {
            Ok(Round { unplanned, sent }) => {
                metrics.planned(usize::from(sent.is_some()), unplanned);
                if unplanned > 0 {
                    tracing::debug!(
                        host = %host,
                        jobs = unplanned,
                        "migration: no moves within the planner's bounds free a group for these blocked jobs"
                    );
                }
                let Some((plan, answer)) = sent else { continue };
                let now = Instant::now();
                for job in answer.cooled(&plan) {
                    moved_at.insert(job, now);
                }
                let decided = match answer {
                    Answer::Decided(decided) => decided,
                    Answer::Lost(e) => {
                        tracing::warn!(
                            host = %host,
                            job_id = plan.job.0,
                            error = %crate::host::chain(&e),
                            jobs = ?plan.moves.iter().map(|m| m.job.0).collect::<Vec<_>>(),
                            "migration: a Migrate failed after it was sent, or its answer was lost, so its moves may have been applied; the jobs it names are not moved again until the cooldown ends, as if moved"
                        );
                        continue;
                    }
                };
                let accepted: Vec<JobId> = decided.iter().filter(|(_, d)| *d == Some(true)).map(|(j, _)| *j).collect();
                let refused = decided.iter().filter(|(_, d)| *d == Some(false)).count();
                metrics.migrated(accepted.len(), refused);
                let unknown: Vec<u64> = decided.iter().filter(|(_, d)| d.is_none()).map(|(j, _)| j.0).collect();
                if !unknown.is_empty() {
                    tracing::warn!(
                        host = %host,
                        job_id = plan.job.0,
                        jobs = ?unknown,
                        "migration: the leader does not know whether these moves were applied; the jobs are not moved again until the cooldown ends, as if moved"
                    );
                }
                tracing::info!(
                    host = %host,
                    job_id = plan.job.0,
                    moved = ?accepted.iter().map(|j| j.0).collect::<Vec<_>>(),
                    planned = plan.moves.len(),
                    cost_gpu_s = plan.cost_gpu_s,
                    "migration: moved jobs to free a group for a blocked job"
                );
            }
            Err(e) => tracing::warn!(host = %host, error = %crate::host::chain(&e), "migration step failed"),
        }
    }
}

/// Held pending jobs that waited long enough, cannot start looser now, and whose GPU type is
/// busy and has enough free GPUs in total: (job, seconds waited), in [`plan_order`].
fn candidates(cfg: &MigrationConfig, cache: &ViewCache, held: &[(JobId, Instant)]) -> Vec<(JobId, u64)> {
    cache.read(|s| {
        let mut out: Vec<(PlanOrder, (JobId, u64))> = held
            .iter()
            .filter(|(_, since)| since.elapsed() >= cfg.min_wait)
            .filter_map(|(id, since)| {
                let j = s.jobs.get(id).filter(|j| j.state == JobState::Pending)?;
                // A job that can start looser now waits by choice, not blocked.
                let allowed = j.spec.allowed_level(since.elapsed().as_secs());
                if locality_cost::can_start_looser(&s.view, &j.spec, allowed) {
                    return None;
                }
                may_plan_for(&s.view, j, cfg.min_utilization)
                    .then_some((plan_order(j), (*id, since.elapsed().as_secs())))
            })
            .collect();
        out.sort_by_key(|&(key, _)| key);
        out.into_iter().take(CANDIDATES_PER_INTERVAL).map(|(_, c)| c).collect()
    })
}

/// Where a blocked job stands among the candidates of a round: the host's own rank first
/// (highest priority, then the least attained-service queue, where the cluster has queues:
/// [`tessera_view::attained`]), then the fewest GPUs, then the oldest (the lowest id).
///
/// Every plan starts one job, so the round serves the smallest blocked job first: its plan
/// moves the fewest jobs (the bound grows with its members, [`MigrationParams::moves_for`]),
/// and the GPUs it takes hold up the fewest others while it runs. A job's size is all a host
/// knows of it (no durations), so this is shortest-first by size, the duration-agnostic order
/// Tiresias ranks by. A larger job is planned for when no smaller one is blocked, or none's
/// plan exists; a host that reserves withholds servers for a gang that still waits long,
/// where that pays ([`crate::reservation`]).
///
/// Size orders jobs within a rank only. A job of a lower rank (a later queue, where it fell by
/// the service it attained) is one the host offers the free GPUs to after every job above it,
/// and one that any waiting job above it may preempt: moves that start it ahead of a blocked
/// job of a higher rank would hand that job's GPUs to one the host ranks below it. On a
/// cluster without queues every job is in queue 0 and the rank is the priority.
pub(crate) type PlanOrder = (std::cmp::Reverse<i32>, u8, u32, JobId);

/// The [`PlanOrder`] key of pending `job`.
pub(crate) fn plan_order(job: &tessera_view::Job) -> PlanOrder {
    (std::cmp::Reverse(job.spec.priority), job.service_queue, job.spec.total_gpus(), job.id)
}

/// Whether moves may be planned for `job`, which nothing fits now: the rule the live task's
/// candidates and the simulator's share. It needs more than one GPU, its GPU type is used at
/// least `min_utilization` (under light load a free group turns up by itself), and enough
/// GPUs of that type are free in total.
///
/// A 1-GPU job is never one. Every free GPU is a group for it, so when it waits while GPUs
/// are free, what it lacks is the cores or memory beside them, not a group, and moves are
/// planned to free groups. A move frees cores for it only where the moved job needs fewer
/// per GPU than it does (a free GPU with enough cores for the moved job would otherwise hold
/// the waiting one too). Each such plan spends one of the round's [`CANDIDATES_PER_INTERVAL`],
/// and in size order 1-GPU jobs come before every larger one. The simulator always left them
/// out; the live task planned for them until stop 49, and simulating that changed the
/// robustness matrix's `tessera` column by a geometric mean of 1.0005 (docs/EVALUATION.md).
pub(crate) fn may_plan_for(view: &crate::LocalView, job: &tessera_view::Job, min_utilization: f64) -> bool {
    let ty = job.spec.gpu_type.as_deref();
    let gpus = job.spec.total_gpus();
    job.state == JobState::Pending
        && gpus > 1
        && view.utilization_of_type(ty) >= min_utilization
        && free_gpus(view, ty) >= u64::from(gpus)
}

/// Free GPUs of up servers of a device type (all types if `None`).
pub(crate) fn free_gpus(view: &crate::LocalView, ty: Option<&str>) -> u64 {
    view.servers()
        .iter()
        .filter(|r| r.health == Health::Up && ty.is_none_or(|t| t == view.topology_of(r.config_set).device_type))
        .map(|r| u64::from(r.free_gpus.count_ones()))
        .sum()
}

/// The remaining times a host gives the planner ([`migration_planner::plan`]): none is known
/// live, and an absent one counts as far from the end; −∞ marks each job in `cooled`, moved less
/// than [`MigrationConfig::cooldown`] ago, which the planner then leaves where it is. The
/// simulator gives the planner the same, not the true remaining times it could read.
pub(crate) fn planner_estimates(cooled: impl IntoIterator<Item = JobId>) -> BTreeMap<JobId, f64> {
    cooled.into_iter().map(|j| (j, f64::NEG_INFINITY)).collect()
}

/// What one round of [`step`] did.
#[derive(Debug, Default)]
struct Round {
    /// Candidates for which the planner found no moves within its bounds.
    unplanned: usize,
    /// The plan sent and what came back, if a plan was sent.
    sent: Option<(MigrationPlan, Answer)>,
}

/// What came back for a sent plan.
#[derive(Debug)]
enum Answer {
    /// Per move, its job and whether the approver placed it (`None`: the leader answered that
    /// the outcome is unknown, e.g. it lost leadership while the command was in flight).
    Decided(Vec<(JobId, Option<bool>)>),
    /// No answer, or a refusal that may follow an applied first try (the call failed after it
    /// was sent: a leader change, a timeout, a retry refused): the moves may or may not have
    /// been applied.
    Lost(SchedulerError),
}

impl Answer {
    /// The jobs that go into the cooldown: those moved, and those whose move may have been
    /// (its outcome unknown, or the whole answer lost): a job moved twice within the cooldown
    /// restarts twice for one blocked job.
    fn cooled(&self, plan: &MigrationPlan) -> Vec<JobId> {
        match self {
            Answer::Decided(decided) => decided.iter().filter(|(_, d)| *d != Some(false)).map(|(j, _)| *j).collect(),
            Answer::Lost(_) => plan.moves.iter().map(|m| m.job).collect(),
        }
    }
}

/// Plans for the first candidate that needs moves and submits them ([`Round::sent`], `None`
/// when no candidate needs or has a plan), counting the candidates before it that no moves
/// could help ([`Round::unplanned`]).
async fn step(
    cfg: &MigrationConfig,
    client: &mut ViewClient,
    rng: &mut SmallRng,
    candidates: &[(JobId, u64)],
    moved_at: &HashMap<JobId, Instant>,
    reserved: &(Reservations, f64),
    failed: &mut FailedPlans,
) -> Result<Round, SchedulerError> {
    let wire = client.snapshot(true).await.map_err(|source| SchedulerError::Call { call: "snapshot", source })?;
    let snap = wire.snapshot.ok_or(SchedulerError::NoSnapshot)?;
    let view = ClusterView::from_snapshot(ViewSnapshot::try_from(snap).map_err(SchedulerError::MalformedSnapshot)?);
    let remaining_s = planner_estimates(moved_at.keys().copied());
    let mut round = Round::default();
    for &(job, waited_s) in candidates {
        let Some(level) =
            view.job(job).filter(|j| j.state == JobState::Pending).map(|j| j.spec.allowed_level(waited_s))
        else {
            continue;
        };
        let Some(plan) = migration_planner::plan_remembering(&view, job, level, &remaining_s, &cfg.params, failed)
        else {
            round.unplanned += 1;
            continue;
        };
        let members = view.job(job).map_or(1, |j| j.spec.members);
        if plan.moves.is_empty() || plan.moves.len() > cfg.params.moves_for(members) {
            // Not blocked: a group is free and its scheduler will take it.
            continue;
        }
        // Neither the job nor the jobs moved for it may land on servers the host withholds
        // from it for a starved gang.
        let lands = plan.target.iter().chain(plan.moves.iter().flat_map(|m| m.to.iter())).map(|m| m.server);
        if view.job(job).is_some_and(|j| reserved.0.withholds_any(j, reserved.1, lands)) {
            continue;
        }
        let moves: Vec<v1::Proposal> = plan
            .moves
            .iter()
            .map(|m| {
                let p = Proposal {
                    id: ProposalId(rng.random::<u64>() | 1),
                    job: m.job,
                    members: m.to.clone(),
                    based_on: view.version(),
                };
                v1::Proposal::from(&p)
            })
            .collect();
        let results =
            match client.migrate(Some(job.0), plan.target.iter().map(v1::MemberPlacement::from).collect(), moves).await
            {
                Ok(results) => results,
                // Refused as malformed: checked before anything was applied.
                Err(source) if source.status().is_some_and(|s| s.code() == tonic::Code::InvalidArgument) => {
                    return Err(SchedulerError::Call { call: "Migrate", source });
                }
                // Any other failure may have come after the moves were applied (a retry after a
                // leader change is refused as a spent proposal id once the first try applied).
                Err(source) => {
                    round.sent = Some((plan, Answer::Lost(SchedulerError::Call { call: "Migrate", source })));
                    return Ok(round);
                }
            };
        // A result missing or without a decision is an unknown outcome.
        let decided: Vec<(JobId, Option<bool>)> = plan
            .moves
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let d = results.get(i).and_then(|r| r.decision.clone()).map(RemoteDecision::try_from);
                (m.job, d.and_then(Result::ok).map(|d| d.is_placed()))
            })
            .collect();
        round.sent = Some((plan, Answer::Decided(decided)));
        return Ok(round);
    }
    Ok(round)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalView;
    use tessera_view::fit::FitMode;
    use tessera_view::{ClusterSpec, Decision, JobSpec, LocalityLevel, ServerId, Topology};

    /// Two seed-8gpu servers, each with a 4-GPU job on it (half the GPUs busy, 4 free on each),
    /// and pending jobs of 1, 2, 8 and 9 GPUs.
    fn fixture() -> (ClusterView, [JobId; 4]) {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
        for server in 0..2u32 {
            let id = view.submit(JobSpec::simple("filler", 1, 4)).expect("admitted");
            let spec = view.job(id).expect("job").spec.clone();
            let rec = view.servers()[server as usize];
            let req = tessera_view::fit::member_request(&spec, view.topology_of(rec.config_set));
            let (m, _) = tessera_view::fit::plan_member(
                view.topology_of(rec.config_set),
                &rec,
                ServerId(server),
                &req,
                LocalityLevel::Any,
                FitMode::Pack,
            )
            .expect("fits");
            let p =
                Proposal { id: ProposalId(u64::from(server) + 1), job: id, members: vec![m], based_on: view.version() };
            assert!(matches!(view.propose(&p), Decision::Accepted { .. }), "filler on {server}");
        }
        let pending =
            [(1, 1), (1, 2), (1, 8), (3, 3)].map(|(m, g)| view.submit(JobSpec::simple("p", m, g)).expect("admitted"));
        (view, pending)
    }

    #[test]
    fn moves_are_planned_for_jobs_of_two_gpus_or_more_that_the_free_gpus_could_hold() {
        let (view, [one, two, eight, nine]) = fixture();
        let local = LocalView::of_view(&view);
        let job = |id| view.job(id).expect("job");
        // A 1-GPU job is never one, with 8 GPUs free: any free GPU is a group for it.
        assert!(!may_plan_for(&local, job(one), 0.5));
        assert!(may_plan_for(&local, job(two), 0.5));
        assert!(may_plan_for(&local, job(eight), 0.5));
        // More GPUs than are free in total: no move makes room.
        assert!(!may_plan_for(&local, job(nine), 0.5));
        // Under the utilization bound: a free group turns up by itself.
        assert!(!may_plan_for(&local, job(eight), 0.6));
    }

    #[test]
    fn jobs_whose_move_may_have_been_applied_are_cooled() {
        let mv = |j: u64| migration_planner::Move { job: JobId(j), from: Vec::new(), to: Vec::new() };
        let plan = MigrationPlan {
            job: JobId(9),
            target: Vec::new(),
            level: LocalityLevel::Any,
            moves: vec![mv(1), mv(2), mv(3)],
            cost_gpu_s: 0.0,
        };
        let decided = Answer::Decided(vec![(JobId(1), Some(false)), (JobId(2), Some(true)), (JobId(3), None)]);
        assert_eq!(decided.cooled(&plan), vec![JobId(2), JobId(3)], "moved, and perhaps moved");
        assert_eq!(Answer::Lost(SchedulerError::NoSnapshot).cooled(&plan), vec![JobId(1), JobId(2), JobId(3)]);
    }

    #[test]
    fn the_plan_order_is_rank_then_size_then_age() {
        let (mut view, [one, two, eight, _]) = fixture();
        let mut spec = JobSpec::simple("urgent", 1, 8);
        spec.priority = 1;
        let urgent = view.submit(spec).expect("admitted");
        let mut order = [eight, urgent, two, one];
        order.sort_by_key(|&id| plan_order(view.job(id).expect("job")));
        assert_eq!(order, [urgent, one, two, eight]);
        // A job that fell a queue comes after a larger one of the queue above it.
        let mut fell = view.job(two).expect("job").clone();
        fell.service_queue = 1;
        assert!(plan_order(view.job(eight).expect("job")) < plan_order(&fell));
    }
}
