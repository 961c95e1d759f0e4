//! The event loop of one simulated run, and its metrics.
//!
//! Events are arrivals, job completions, the end of a moved job's checkpoint-restart pause,
//! wake-ups when a waiting job's locality tolerance relaxes, and the view's own deadlines (a
//! running job reaching its next attained-service threshold). Before the events of an instant
//! the view's clock is set to it, as a leader's clock entries set a live view's, so the view
//! stamps placements and moves jobs down its queues on simulated time. After all events of one instant, a
//! scheduling pass offers waiting jobs to the policy in arrival order (a job that does not fit
//! is skipped, not waited on, as generic schedulers do): after a release every waiting job is
//! tried, after an arrival only the new ones. A shape that failed once in a pass is not searched
//! again in that pass. A job's progress is work (seconds at full speed) done at its current
//! speed; speeds change when jobs start, end or move beside it (interference) and are
//! recomputed for the jobs on the servers touched.

use super::compared_policies::{self, Contender, QueueOrder};
use super::model::SpeedModel;
use super::{SIZE_BUCKETS, Trace, size_bucket};
use crate::SchedulerError;
use crate::local_view::{LocalView, Overlay};
use crate::locality_cost::{self, Decided, ReleaseStats};
use crate::migration_task::{CANDIDATES_PER_INTERVAL, free_gpus};
use crate::preemption::{self, Candidate};
use crate::reservation::Reservations;
use crate::scheduler::{Attempt, Context, RunningIndex, Verdict};
use crate::search::find_placement;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use tessera_view::fit::FitMode;
use tessera_view::migration_planner::{self, MigrationParams};
use tessera_view::view::DEFAULT_CHANGE_LOG;
use tessera_view::{
    ClusterSpec, ClusterView, Command, CpuDemand, Decision, JobId, JobSpec, LocalityLevel, MemberPlacement, Outcome,
    Preemption, Proposal, ProposalId, ServerId, TaskEvent, ViewError, invariants,
};

/// Ended jobs the simulated view keeps (the simulator keeps its own records).
const ENDED_KEPT: usize = 1024;
/// Simulated seconds after a round of migration planning found no plan before the next round:
/// bounds the planner's work (each attempt scans the cluster) and the rate of moves. A round
/// plans, as the live migration task does, for up to
/// `migration_task::CANDIDATES_PER_INTERVAL` blocked jobs that have enough GPUs of their
/// type free in total, in the order the pass offers them, and ends at the first plan carried out.
pub const MIGRATION_RETRY_S: f64 = 300.0;
/// Points of the utilization series.
const UTILIZATION_POINTS: usize = 400;
/// The view's clock at simulated second 0 (Unix ms): any fixed origin serves, as only
/// differences are read, but 0 is the view's "no clock yet".
const EPOCH_MS: u64 = 1_700_000_000_000;

/// The view's clock at simulated second `t`.
fn view_ms(t: f64) -> u64 {
    EPOCH_MS + (t.max(0.0) * 1000.0).round() as u64
}

/// The simulated second of the view's clock time `ms`.
fn sim_s(ms: u64) -> f64 {
    ms.saturating_sub(EPOCH_MS) as f64 / 1000.0
}

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The contender: its scheduler, how it writes trace jobs as specs, whether it migrates.
    pub contender: Contender,
    /// Seed: decorrelates the searches' probe order (the only randomness).
    pub seed: u64,
    /// Arrival-rate multiplier: arrival times are divided by it.
    pub load_scale: f64,
    /// Migration rules (for policies that migrate).
    pub migration: MigrationParams,
    /// Run the independent invariant checker every this many events (0: only at the end).
    pub invariant_check_every: u64,
}

impl SimConfig {
    /// Defaults for `contender` (a [`super::SimPolicy`] preset or any [`Contender`]).
    pub fn new(contender: impl Into<Contender>) -> SimConfig {
        SimConfig {
            contender: contender.into(),
            seed: 1,
            load_scale: 1.0,
            migration: MigrationParams::default(),
            invariant_check_every: 0,
        }
    }
}

/// The results of one policy (the object `tessera sim --json` prints per policy).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PolicyReport {
    /// Jobs simulated.
    pub jobs: u64,
    /// Jobs that finished.
    pub finished: u64,
    /// Mean job completion time (arrival to end), seconds.
    pub avg_jct_s: f64,
    /// Median JCT.
    pub p50_jct_s: f64,
    /// 95th-percentile JCT.
    pub p95_jct_s: f64,
    /// 99th-percentile JCT.
    pub p99_jct_s: f64,
    /// First arrival to last completion, seconds.
    pub makespan_s: f64,
    /// Busy GPU-seconds over GPU capacity × makespan.
    pub gpu_utilization: f64,
    /// Mean queueing delay (arrival to first start) by size bucket.
    pub queue_s_by_size: BTreeMap<String, f64>,
    /// Jobs per size bucket.
    pub jobs_by_size: BTreeMap<String, u64>,
    /// Mean queueing delay over all jobs.
    pub avg_queue_s: f64,
    /// Mean fraction of GPUs free while jobs waited (free GPUs no waiting job could use).
    pub fragmentation: f64,
    /// Share of jobs whose first placement was at their preferred level (the tightest level at
    /// which a job of their size fits a server of the cluster).
    pub preferred_locality_share: f64,
    /// Mean speed of jobs over their run (1 = the trace's duration).
    pub avg_speed: f64,
    /// Jobs moved by migration.
    pub migrations: u64,
    /// GPU-seconds lost to checkpoint-restart of moved jobs.
    pub migration_cost_gpu_s: f64,
    /// Gangs preempted (each released whole, re-queued, resumed later from a checkpoint taken
    /// when it was stopped). Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub preemptions: u64,
    /// GPU-seconds preempted gangs lost to checkpoint-restart. Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub preemption_cost_gpu_s: f64,
    /// Reservations the host made for starved gangs of whole servers ([`crate::reservation`]).
    /// Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub reservations: u64,
    /// Of those, the ones given up after idling their whole budget. Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub reservations_given_up: u64,
    /// Job-seconds reservations held other jobs back (the waiting they cost). Left out of the
    /// JSON when 0.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub reservation_held_back_s: f64,
    /// GPU-seconds reservations kept idle that jobs they held back could have used. Left out of
    /// the JSON when 0.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub reserved_idle_gpu_s: f64,
    /// Jobs whose CPU-aware spec could never fit and that ran with the GPU-proportional share.
    pub cpu_fallbacks: u64,
    /// Proposals the approver refused (0 expected: searches plan on a current view).
    pub rejected_proposals: u64,
    /// Mean seconds a job of each size bucket waited while it was blocked by fragmentation: the
    /// cluster had enough free GPUs of its type for it (in one rack or IB domain when its allowed
    /// level is that), yet no placement of its gang existed at its allowed level even with one
    /// core and no memory per GPU. This is what migration can fix, measured by the simulator
    /// itself, whatever the scheduler's verdict.
    pub frag_blocked_s_by_size: BTreeMap<String, f64>,
    /// Jobs the scheduler gave up on (cancelled with its reason; 0 for the built-ins on a
    /// cluster that admitted the jobs). Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub gave_up: u64,
    /// Invariant checks run.
    pub invariant_checks: u64,
    /// Violations they found (0 expected).
    pub invariant_violations: u64,
    /// Sorted JCTs, seconds (for CDFs; not in JSON).
    #[serde(skip)]
    pub jct_s: Vec<f64>,
    /// `(time_s, busy GPU fraction)`, time-averaged over equal intervals (not in JSON).
    #[serde(skip)]
    pub utilization: Vec<(f64, f64)>,
    /// `(gpus, queue_s)` per finished job (not in JSON).
    #[serde(skip)]
    pub queue_by_job: Vec<(u32, f64)>,
    /// Every job in trace order, finished or not (for per-job CSVs; not in JSON).
    #[serde(skip)]
    pub job_records: Vec<JobRecord>,
}

/// One job's run: when it arrived, started and ended, and where it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    /// The trace's job id.
    pub name: String,
    /// GPUs.
    pub gpus: u32,
    /// Arrival (after load scaling), seconds.
    pub arrival_s: f64,
    /// First start, if it started.
    pub start_s: Option<f64>,
    /// End, if it finished.
    pub end_s: Option<f64>,
    /// Locality level of its last placement (after any moves), if it started.
    pub level: Option<LocalityLevel>,
    /// Times it was moved by migration.
    pub moves: u64,
}

/// What decides whether a search can succeed in one pass: gang shape, allowed level, CPU
/// sweet point (bits), memory and device type.
/// Whether servers were withheld from it ([`crate::reservation`]) is part of it too.
type ShapeKey = (u32, u32, LocalityLevel, u64, Option<u32>, Option<String>, (i32, u8), bool);

/// [`locality_cost::slot_kind`], owned (a map key that outlives the borrow of the job).
type SlotKind = (u32, u32, LocalityLevel, Option<String>);

fn slot_kind(spec: &JobSpec) -> SlotKind {
    let (members, per, prefer, ty) = locality_cost::slot_kind(spec);
    (members, per, prefer, ty.map(str::to_owned))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(usize),
    Resume(usize, u64),
    Finish(usize, u64),
    Wake,
    /// The view's next deadline (a running job reaching its next attained-service threshold):
    /// the clock entry a leader writes when one passes on an idle log.
    Clock,
    /// A preempted job waits again: offered in the next pass like an arrival.
    Requeued(usize),
}

struct Rt {
    view_id: JobId,
    spec: JobSpec,
    class: usize,
    theta: f64,
    gpus: u32,
    arrival_s: f64,
    work_left_s: f64,
    speed: f64,
    since_s: f64,
    epoch: u64,
    start_s: Option<f64>,
    finish_s: Option<f64>,
    paused: bool,
    members: Vec<MemberPlacement>,
    level: LocalityLevel,
    preferred: LocalityLevel,
    at_preferred: bool,
    next_wake_s: f64,
    speed_time: f64,
    /// Counts the job's moves; a resume event names the move it ends.
    moves: u64,
    /// Times its scheduler was asked.
    attempts: u32,
    /// Since when it has been blocked by fragmentation (see [`PolicyReport::frag_blocked_s_by_size`]).
    frag_since: Option<f64>,
    /// Seconds it waited blocked by fragmentation.
    frag_blocked_s: f64,
    /// When its current run started.
    run_start_s: f64,
}

/// A running job as a possible victim: what [`preemption::choose_victims`] needs, its rank
/// ([`tessera_view::Job::rank`]) and how often it was preempted.
struct PoolEntry {
    candidate: Candidate,
    rank: (i32, Reverse<u8>),
    preemptions: u32,
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    model: &'a SpeedModel,
    view: ClusterView,
    local: LocalView,
    jobs: Vec<Rt>,
    by_view: HashMap<JobId, usize>,
    pending: BTreeSet<usize>,
    fresh: Vec<usize>,
    resources_freed: bool,
    woke: bool,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    next_proposal: u64,
    server_jobs: Vec<Vec<usize>>,
    /// The same jobs by view id, as schedulers see them ([`Context::running`]).
    running: RunningIndex,
    /// Releases and run times so far, as a live host observes them ([`Context::releases`]).
    releases: ReleaseStats,
    /// The host's bounded reservation for a starved gang, if its contender makes them.
    reservations: Reservations,
    total_gpus: u64,
    busy_gpus: u64,
    last_t: f64,
    busy_area: f64,
    frag_area: f64,
    frag_time: f64,
    busy_series: Vec<(f64, u64)>,
    next_plan_s: f64,
    /// The running jobs as possible victims, with their rank and preemptions, built once per
    /// pass and dropped whenever the running set changes.
    victim_pool: Option<Vec<PoolEntry>>,
    /// Whether the cluster orders waiting jobs by attained service (it names thresholds).
    ranked: bool,
    /// When the earliest [`Event::Clock`] queued is due (infinite when none is).
    clock_wake_s: f64,
    rep: PolicyReport,
}

/// Runs one policy over `trace` on `cluster`. `progress(done, total)` is called now and then
/// with events processed (for a progress bar); the run itself is deterministic.
pub fn simulate(
    cluster: &ClusterSpec,
    trace: &Trace,
    model: &SpeedModel,
    cfg: &SimConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PolicyReport, SchedulerError> {
    // A contender in attained-service order runs on a cluster that names its thresholds: the
    // view moves jobs down its queues itself, as a live cluster's does.
    let mut cluster = cluster.clone();
    if let QueueOrder::AttainedService { thresholds_gpu_s } = &cfg.contender.order {
        cluster.priorities.attained_service_gpu_s = thresholds_gpu_s.clone();
        cluster.priorities.validate().map_err(|(field, why)| SchedulerError::BadSetting {
            setting: "a contender's attained-service thresholds",
            expected: format!("what `priorities.{field}` accepts ({why})"),
            got: format!("{thresholds_gpu_s:?} for `{}`", cfg.contender.name),
        })?;
    }
    let mut view = ClusterView::from_spec(&cluster).with_limits(DEFAULT_CHANGE_LOG, ENDED_KEPT);
    view.apply(&Command::Clock { at_ms: view_ms(0.0) });
    let ranked = !view.priorities().attained_service_gpu_s.is_empty();
    let local = LocalView::of_view(&view);
    let total_gpus = view.servers().iter().map(|r| u64::from(view.topology_of(r.config_set).devices)).sum();
    let mut sim = Sim {
        cfg,
        model,
        server_jobs: vec![Vec::new(); view.servers().len()],
        running: RunningIndex::new(),
        view,
        local,
        jobs: Vec::with_capacity(trace.jobs.len()),
        by_view: HashMap::new(),
        pending: BTreeSet::new(),
        fresh: Vec::new(),
        resources_freed: false,
        woke: false,
        heap: BinaryHeap::new(),
        seq: 0,
        next_proposal: 1,
        total_gpus,
        busy_gpus: 0,
        last_t: 0.0,
        busy_area: 0.0,
        frag_area: 0.0,
        frag_time: 0.0,
        busy_series: vec![(0.0, 0)],
        next_plan_s: 0.0,
        victim_pool: None,
        ranked,
        clock_wake_s: f64::INFINITY,
        releases: ReleaseStats::new(),
        reservations: Reservations::new(),
        rep: PolicyReport::default(),
    };
    let scale = cfg.load_scale.max(1e-9);
    for (i, j) in trace.jobs.iter().enumerate() {
        let class = model.class_of(&j.job_type);
        let theta = compared_policies::theta_of(j, model, class);
        let declared = model.declared_theta(theta);
        let spec = cfg.contender.style.spec(j, declared, &model.slowdown_of(class), sim.view.topologies());
        let preferred = compared_policies::preferred_level(j.gpus, sim.view.topologies());
        sim.jobs.push(Rt {
            view_id: JobId(0),
            spec,
            class,
            theta,
            gpus: j.gpus,
            arrival_s: j.arrival_s / scale,
            work_left_s: j.duration_s,
            speed: 0.0,
            since_s: 0.0,
            epoch: 0,
            start_s: None,
            finish_s: None,
            paused: false,
            members: Vec::new(),
            level: LocalityLevel::Any,
            preferred,
            at_preferred: false,
            next_wake_s: 0.0,
            speed_time: 0.0,
            moves: 0,
            attempts: 0,
            frag_since: None,
            frag_blocked_s: 0.0,
            run_start_s: 0.0,
        });
        let t = sim.jobs[i].arrival_s;
        sim.push(t, Event::Arrive(i));
    }
    let total_events = trace.jobs.len() as u64 * 2;
    let mut events = 0u64;
    while let Some(Reverse((bits, _, ev))) = sim.heap.pop() {
        let now = f64::from_bits(bits);
        sim.advance(now);
        sim.tick(now);
        sim.handle(ev, now, trace)?;
        events += 1;
        if cfg.invariant_check_every > 0 && events.is_multiple_of(cfg.invariant_check_every) {
            sim.check_invariants();
        }
        if events.is_multiple_of(1024) {
            progress(events.min(total_events), total_events);
        }
        if sim.heap.peek().is_some_and(|Reverse((b, _, _))| *b == bits) {
            continue;
        }
        // Between passes nothing frees GPUs or relaxes a level (releases, arrivals and relax
        // timers all start one), so fragmentation states change only after a pass.
        if sim.schedule(now) {
            sim.track_fragmentation(now);
        }
        sim.wake_for_clock();
    }
    progress(total_events, total_events);
    sim.check_invariants();
    Ok(sim.report(trace))
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Sim<'_> {
    fn push(&mut self, t: f64, ev: Event) {
        self.seq += 1;
        self.heap.push(Reverse((t.max(0.0).to_bits(), self.seq, ev)));
    }

    /// Integrates utilization and fragmentation up to `now`.
    fn advance(&mut self, now: f64) {
        let dt = now - self.last_t;
        if dt > 0.0 {
            self.busy_area += self.busy_gpus as f64 * dt;
            if !self.pending.is_empty() {
                self.frag_area += (self.total_gpus - self.busy_gpus) as f64 * dt;
                self.frag_time += dt;
            }
            self.last_t = now;
        }
    }

    fn set_busy(&mut self, now: f64, busy: u64) {
        self.busy_gpus = busy;
        self.busy_series.push((now, busy));
    }

    fn handle(&mut self, ev: Event, now: f64, trace: &Trace) -> Result<(), SchedulerError> {
        match ev {
            Event::Arrive(i) => self.arrive(i, now, trace)?,
            Event::Finish(i, epoch) if self.jobs[i].epoch == epoch && !self.jobs[i].paused => self.finish(i, now),
            Event::Resume(i, moves) if self.jobs[i].moves == moves && self.jobs[i].paused => self.resume(i, now),
            Event::Wake => self.woke = true,
            Event::Requeued(i) => self.fresh.push(i),
            Event::Clock if now >= self.clock_wake_s => self.clock_wake_s = f64::INFINITY,
            _ => {}
        }
        Ok(())
    }

    fn arrive(&mut self, i: usize, now: f64, trace: &Trace) -> Result<(), SchedulerError> {
        let spec = self.jobs[i].spec.clone();
        let id = match self.view.submit(spec.clone()) {
            Ok(id) => id,
            Err(ViewError::NeverFits(_)) if !matches!(spec.cpu, CpuDemand::Proportional) => {
                // A CPU or memory request no server can grant: run with the proportional share.
                let mut spec = spec;
                spec.cpu = CpuDemand::Proportional;
                spec.memory_mib_per_gpu = None;
                self.rep.cpu_fallbacks += 1;
                self.jobs[i].spec = spec.clone();
                self.view
                    .submit(spec)
                    .map_err(|source| SchedulerError::Admission { job: trace.jobs[i].name.clone(), source })?
            }
            Err(source) => return Err(SchedulerError::Admission { job: trace.jobs[i].name.clone(), source }),
        };
        self.jobs[i].view_id = id;
        self.jobs[i].next_wake_s = now;
        self.by_view.insert(id, i);
        self.pending.insert(i);
        self.fresh.push(i);
        Ok(())
    }

    fn next_proposal(&mut self) -> ProposalId {
        self.next_proposal += 1;
        ProposalId(self.next_proposal)
    }

    /// One scheduling pass at `now`.
    /// Returns whether a pass ran (anything could have changed what is free or allowed).
    fn schedule(&mut self, now: f64) -> bool {
        let mut candidates: Vec<usize> = if self.resources_freed || self.woke {
            self.pending.iter().copied().collect()
        } else {
            self.fresh.iter().copied().filter(|i| self.pending.contains(i)).collect()
        };
        if self.ranked {
            // Priority, then the least attained service, then arrival (the index).
            candidates.sort_by_cached_key(|&i| self.rank_key(i));
        }
        self.fresh.clear();
        self.resources_freed = false;
        self.woke = false;
        self.victim_pool = None;
        if candidates.is_empty() {
            return false;
        }
        self.local.catch_up(&self.view);
        if self.cfg.contender.reserves {
            self.update_reservation(now);
        }
        let mut failed: BTreeSet<ShapeKey> = BTreeSet::new();
        // Pending jobs by the kind of slot they wait for, in arrival order, and how many of
        // each kind this pass placed (for `Context::ahead`); built when first needed.
        let mut kinds: Option<BTreeMap<SlotKind, Vec<usize>>> = None;
        let mut placed_kinds: BTreeMap<SlotKind, u32> = BTreeMap::new();
        // Migration as the live task plans it (`migration_task`): for up to
        // `CANDIDATES_PER_INTERVAL` blocked jobs a round, each with enough GPUs of its type free
        // in total, until one plan is carried out; a round that finds none waits
        // `MIGRATION_RETRY_S`.
        let (mut planned_for, mut moved) = (0, false);
        let preempts = self.cfg.contender.preempts;
        for i in candidates {
            let free = self.total_gpus - self.busy_gpus;
            if free == 0 && !preempts {
                break;
            }
            if free == 0 {
                // Nothing free: only a job that outranks some running job can start. Offered by
                // rank, no later job can once one cannot.
                let me = (self.jobs[i].spec.priority, Reverse(self.queue_of(i)));
                if self.lowest_preemptible(now).is_none_or(|low| me <= low) {
                    if self.ranked {
                        break;
                    }
                    continue;
                }
            }
            let rt = &self.jobs[i];
            if u64::from(rt.gpus) > free && !preempts {
                continue;
            }
            let job = self.view.job(rt.view_id).expect("a pending job is in the view");
            // Servers withheld for a starved gang look taken to the jobs they are withheld from
            // (`locality_cost::decide` masks them): what is free to such a job is less.
            let withheld = self.reservations.withholds(job, now);
            if withheld && !preempts && u64::from(rt.gpus) > free - self.withheld_free() {
                continue;
            }
            let waited = now - rt.arrival_s;
            let allowed = rt.spec.allowed_level(waited.max(0.0) as u64);
            let key = (
                rt.spec.members,
                rt.spec.gpus_per_member,
                allowed,
                rt.theta.to_bits(),
                rt.spec.memory_mib_per_gpu,
                rt.spec.gpu_type.clone(),
                // What it may preempt depends on its rank.
                if preempts { (rt.spec.priority, self.queue_of(i)) } else { (0, 0) },
                withheld,
            );
            let by_shape = self.cfg.contender.scheduler.decides_by_shape();
            if by_shape && failed.contains(&key) {
                self.wake_later(i, now, allowed);
                continue;
            }
            let salt = splitmix(self.cfg.seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
            let decided = if u64::from(self.jobs[i].gpus) > free {
                // Only a preempting host gets here: no search can place it without victims.
                let verdict = Verdict::Wait("fewer GPUs free than it needs".into());
                Decided { verdict, allowed, recheck_waited_s: None, by_cost: false }
            } else {
                let rt = &self.jobs[i];
                let ahead = if rt.spec.slowdown.is_empty() || allowed >= rt.spec.tolerate {
                    0
                } else {
                    let kinds = kinds.get_or_insert_with(|| {
                        let mut m: BTreeMap<SlotKind, Vec<usize>> = BTreeMap::new();
                        for &p in &self.pending {
                            m.entry(slot_kind(&self.jobs[p].spec)).or_default().push(p);
                        }
                        m
                    });
                    let kind = slot_kind(&rt.spec);
                    let earlier = kinds.get(&kind).map_or(0, |v| v.partition_point(|&p| p < i)) as u32;
                    earlier.saturating_sub(placed_kinds.get(&kind).copied().unwrap_or(0))
                };
                let job = self.view.job(rt.view_id).expect("a pending job is in the view");
                let attempt = Attempt {
                    job,
                    view: &self.local,
                    overlay: &Overlay::default(),
                    allowed,
                    waited_s: waited.max(0.0) as u64,
                    attempt: rt.attempts,
                    salt,
                    ctx: Context {
                        running: &self.running,
                        releases: &self.releases,
                        reservations: &self.reservations,
                        ahead,
                        now_s: now,
                    },
                };
                locality_cost::decide(self.cfg.contender.scheduler.as_ref(), &attempt)
            };
            self.jobs[i].attempts += 1;
            if let Some(w) = decided.recheck_waited_s {
                // Waiting for a tighter level by choice: decide again when that stops paying.
                // Another job of this shape may have waited longer and choose otherwise, so the
                // shape is not marked as failed. No moves are planned for it: it can start now.
                self.wake_at(i, self.jobs[i].arrival_s + w as f64);
                continue;
            }
            let found = match decided.verdict {
                Verdict::Propose(members) => Some(members),
                Verdict::Wait(_) => None,
                Verdict::GiveUp(reason) => {
                    self.give_up(i, reason);
                    continue;
                }
                Verdict::Preempt { members, victims } => {
                    let why = format!("scheduler `{}`", self.cfg.contender.scheduler.name());
                    if !self.preempt(i, members, victims, &why, now) {
                        failed.insert(key);
                        self.wake_later(i, now, allowed);
                    }
                    continue;
                }
            };
            match found {
                Some(members) => {
                    if self.propose(i, members, now) {
                        *placed_kinds.entry(slot_kind(&self.jobs[i].spec)).or_default() += 1;
                    } else {
                        failed.insert(key);
                    }
                }
                None => {
                    // Moving jobs first (they keep running), preempting only when no move helps.
                    let gpus = self.jobs[i].gpus;
                    let plan_now = self.cfg.contender.migrates
                        && now >= self.next_plan_s
                        && !moved
                        && planned_for < CANDIDATES_PER_INTERVAL
                        && gpus > 1
                        && free_gpus(&self.local, self.jobs[i].spec.gpu_type.as_deref()) >= u64::from(gpus);
                    if plan_now {
                        planned_for += 1;
                        moved = self.try_migrate(i, allowed, now);
                    }
                    let started = (plan_now && moved) || (preempts && self.try_preempt(i, allowed, salt, now));
                    if !started {
                        failed.insert(key);
                        self.wake_later(i, now, allowed);
                    }
                }
            }
        }
        if planned_for > 0 && !moved {
            // Planned for, and none could be helped: the round is over.
            self.next_plan_s = now + MIGRATION_RETRY_S;
        }
        if self.cfg.contender.reserves {
            // What the pass took or freed on the withheld servers idles from now on.
            self.local.catch_up(&self.view);
            let waiting = self.pending.iter().filter_map(|&i| self.view.job(self.jobs[i].view_id));
            self.reservations.observe_free(&self.local, waiting, now);
        }
        true
    }

    /// GPUs free on the servers the host's reservation withholds.
    fn withheld_free(&self) -> u64 {
        u64::from(self.reservations.free_on_withheld(self.view.servers()))
    }

    /// Where job `i` stands in attained-service order: priority, then the least attained
    /// service, then arrival (the index).
    fn rank_key(&self, i: usize) -> (Reverse<i32>, u8, usize) {
        (Reverse(self.jobs[i].spec.priority), self.queue_of(i), i)
    }

    /// Brings the host's reservation up to `now` ([`Reservations::update`]) over the waiting
    /// jobs in the order the host offers them.
    fn update_reservation(&mut self, now: f64) {
        let mut order: Vec<usize> = self.pending.iter().copied().collect();
        if self.ranked {
            order.sort_by_cached_key(|&i| self.rank_key(i));
        }
        let queue = order.iter().filter_map(|&i| {
            let rt = &self.jobs[i];
            self.view.job(rt.view_id).map(|j| (j, now - rt.arrival_s))
        });
        self.reservations.update(&self.local, queue, &self.releases, now);
    }

    /// Brings every pending job's fragmentation-blocked state up to date at `now` (after a pass:
    /// only passes change what is free).
    fn track_fragmentation(&mut self, now: f64) {
        if self.pending.is_empty() {
            return;
        }
        self.local.catch_up(&self.view);
        let local = &self.local;
        let free = FreeGpus::of(local);
        let mut probed: BTreeMap<(u32, u32, LocalityLevel, Option<String>), bool> = BTreeMap::new();
        for &i in &self.pending {
            let rt = &self.jobs[i];
            let allowed = rt.spec.allowed_level((now - rt.arrival_s).max(0.0) as u64);
            let blocked = free.enough(&rt.spec, allowed) && {
                let key = (rt.spec.members, rt.spec.gpus_per_member, allowed, rt.spec.gpu_type.clone());
                let fits = *probed.entry(key).or_insert_with(|| {
                    let probe = JobSpec {
                        cpu: CpuDemand::Fixed { cores_per_gpu: 1 },
                        memory_mib_per_gpu: Some(0),
                        ..rt.spec.clone()
                    };
                    find_placement(local, &Overlay::default(), &probe, allowed, FitMode::Pack, 0).is_ok()
                });
                !fits
            };
            let rt = &mut self.jobs[i];
            match (blocked, rt.frag_since) {
                (true, None) => rt.frag_since = Some(now),
                (false, Some(since)) => {
                    rt.frag_blocked_s += now - since;
                    rt.frag_since = None;
                }
                _ => {}
            }
        }
    }

    /// Cancels job `i` for its scheduler, which gave up on it.
    fn give_up(&mut self, i: usize, reason: String) {
        let job = self.jobs[i].view_id;
        let out = self.view.apply(&Command::Cancel { job, reason: Some(reason), grace_s: None });
        debug_assert_eq!(out, Outcome::Ended(Ok(())));
        self.pending.remove(&i);
        self.rep.gave_up += 1;
    }

    /// Schedules a pass when a waiting job's tolerance next relaxes.
    fn wake_later(&mut self, i: usize, now: f64, allowed: LocalityLevel) {
        let rt = &self.jobs[i];
        let Some(step) = rt.spec.relax_after_s.filter(|_| allowed < rt.spec.tolerate) else { return };
        let waited = (now - rt.arrival_s).max(0.0);
        let next = rt.arrival_s + ((waited / step as f64).floor() + 1.0) * step as f64;
        self.wake_at(i, next);
    }

    /// Schedules a pass at `t` for job `i`, unless one is due for it no earlier.
    fn wake_at(&mut self, i: usize, t: f64) {
        if t > self.jobs[i].next_wake_s {
            self.jobs[i].next_wake_s = t;
            self.push(t, Event::Wake);
        }
    }

    /// Proposes `members` for job `i` and starts it if accepted.
    fn propose(&mut self, i: usize, members: Vec<MemberPlacement>, now: f64) -> bool {
        let id = self.next_proposal();
        let p = Proposal { id, job: self.jobs[i].view_id, members: members.clone(), based_on: self.view.version() };
        match self.view.propose(&p) {
            Decision::Accepted { level, .. } => {
                self.start(i, id, members, level, now);
                true
            }
            _ => {
                self.rep.rejected_proposals += 1;
                false
            }
        }
    }

    fn start(&mut self, i: usize, proposal: ProposalId, members: Vec<MemberPlacement>, level: LocalityLevel, now: f64) {
        self.pending.remove(&i);
        if let Some(since) = self.jobs[i].frag_since.take() {
            self.jobs[i].frag_blocked_s += now - since;
        }
        self.report_started(i, proposal, &members);
        self.observe(i, now);
        let rt = &mut self.jobs[i];
        if rt.start_s.is_none() {
            rt.start_s = Some(now);
            rt.at_preferred = level <= rt.preferred;
        }
        rt.run_start_s = now;
        rt.level = level;
        rt.members = members;
        rt.since_s = now;
        let gpus = u64::from(rt.gpus);
        self.set_busy(now, self.busy_gpus + gpus);
        self.occupy(i);
        self.local.catch_up(&self.view);
        self.victim_pool = None;
    }

    /// Job `i`'s attained-service queue, as the view keeps it.
    fn queue_of(&self, i: usize) -> u8 {
        self.view.job(self.jobs[i].view_id).map_or(0, |j| j.service_queue)
    }

    /// Advances the view's clock to `now`, as the leader's clock entries do. Jobs whose
    /// attained service reached a threshold of the cluster's move down a queue in the view
    /// ([`tessera_view::attained`]); then every waiting job is offered again, as one of a lower
    /// queue may now preempt them.
    fn tick(&mut self, now: f64) {
        let at_ms = view_ms(now);
        if at_ms <= self.view.now_ms() {
            return;
        }
        let due = self.view.next_deadline_ms().is_some_and(|d| d <= at_ms);
        let out = self.view.apply(&Command::Clock { at_ms });
        debug_assert!(matches!(&out, Outcome::Clock { expired, .. } if expired.is_empty()), "no time limits: {out:?}");
        if due {
            self.woke = true;
            self.victim_pool = None;
        }
    }

    /// Queues an [`Event::Clock`] for the view's next deadline unless one is due no later.
    fn wake_for_clock(&mut self) {
        let Some(d) = self.view.next_deadline_ms() else { return };
        let t = sim_s(d);
        if t < self.clock_wake_s {
            self.clock_wake_s = t;
            self.push(t, Event::Clock);
        }
    }

    /// Preempts lower-ranked gangs so that job `i` starts, if victims exist; true if it started.
    /// The lowest rank among running jobs still under the preemption bound, if any.
    fn lowest_preemptible(&mut self, now: f64) -> Option<(i32, Reverse<u8>)> {
        let max = self.view.priorities().max_preemptions;
        self.fill_victim_pool(now);
        self.victim_pool.iter().flatten().filter(|e| e.preemptions < max).map(|e| e.rank).min()
    }

    /// Builds [`Sim::victim_pool`] unless it is current.
    fn fill_victim_pool(&mut self, now: f64) {
        if self.victim_pool.is_none() {
            let mut pool = Vec::new();
            let mut seen = BTreeSet::new();
            for &j in self.server_jobs.iter().flatten() {
                if !seen.insert(j) || self.jobs[j].paused {
                    continue;
                }
                let Some(v) = self.view.job(self.jobs[j].view_id) else { continue };
                let Some(p) = v.placement.as_ref() else { continue };
                let c = Candidate {
                    job: v.id,
                    members: p.members.clone(),
                    priority: v.spec.priority,
                    service_queue: v.service_queue,
                    // Checkpointed when stopped: only the restart is lost, the same for every
                    // victim; prefer the ones that ran least since they last started.
                    lost_s: now - self.jobs[j].run_start_s,
                };
                pool.push(PoolEntry { candidate: c, rank: v.rank(), preemptions: v.preemptions });
            }
            self.victim_pool = Some(pool);
        }
    }

    fn try_preempt(&mut self, i: usize, allowed: LocalityLevel, salt: u64, now: f64) -> bool {
        let Some(me) = self.view.job(self.jobs[i].view_id).map(|j| j.rank()) else { return false };
        let max = self.view.priorities().max_preemptions;
        self.fill_victim_pool(now);
        let candidates: Vec<Candidate> = self
            .victim_pool
            .iter()
            .flatten()
            .filter(|e| me > e.rank && e.preemptions < max)
            .map(|e| e.candidate.clone())
            .collect();
        if !preemption::could_make_room(&candidates, self.total_gpus - self.busy_gpus, self.jobs[i].gpus) {
            return false;
        }
        let spec = self.jobs[i].spec.clone();
        let Some(choice) = preemption::choose_victims(&self.local, &spec, allowed, FitMode::Pack, salt, &candidates)
        else {
            return false;
        };
        self.preempt(i, choice.members, choice.victims, "attained-service order", now)
    }

    /// Sends one `Command::Preempt` for job `i` (a host's choice, or its scheduler's
    /// [`Verdict::Preempt`]); on acceptance stops the victims and starts the job. True if it
    /// started.
    fn preempt(&mut self, i: usize, members: Vec<MemberPlacement>, victims: Vec<JobId>, why: &str, now: f64) -> bool {
        let id = self.next_proposal();
        let proposal =
            Proposal { id, job: self.jobs[i].view_id, members: members.clone(), based_on: self.view.version() };
        let pre = Preemption { proposal, victims: victims.clone(), reason: why.into() };
        let Outcome::Decided(ds) = self.view.apply(&Command::Preempt(pre)) else { return false };
        let Some(Decision::Accepted { level, .. }) = ds.first().cloned() else {
            self.rep.rejected_proposals += 1;
            return false;
        };
        for v in &victims {
            if let Some(&j) = self.by_view.get(v) {
                self.stop_preempted(j, now);
            }
        }
        self.start(i, id, members, level, now);
        // The victims wait again, and what they held beyond the preemptor's gang is free: a
        // pass at this instant offers every waiting job, as a live host's waiting jobs all see
        // the view change (offering only the victims left those GPUs idle until a job ended).
        self.resources_freed = true;
        for v in &victims {
            if let Some(&j) = self.by_view.get(v) {
                self.push(now, Event::Requeued(j));
            }
        }
        true
    }

    /// A preempted gang: stopped whole (checkpointed on the stop signal), back to waiting, and
    /// paying a checkpoint-restart when it runs again.
    fn stop_preempted(&mut self, j: usize, now: f64) {
        self.set_speed(j, now);
        let servers = self.vacate(j);
        let cost = self.cfg.migration.checkpoint_restart_s;
        let rt = &mut self.jobs[j];
        rt.work_left_s += cost;
        rt.speed = 0.0;
        rt.epoch += 1;
        rt.members.clear();
        let gpus = rt.gpus;
        self.observe(j, now);
        self.rep.preemptions += 1;
        self.rep.preemption_cost_gpu_s += f64::from(gpus) * cost;
        self.set_busy(now, self.busy_gpus - u64::from(gpus));
        self.pending.insert(j);
        self.respeed(&servers);
        self.victim_pool = None;
    }

    /// The host's copy of the view sees job `i` change at `now` ([`ReleaseStats::observe`], as
    /// a live host's does): a start is timed, a stop is a release, an end a run.
    fn observe(&mut self, i: usize, now: f64) {
        if let Some(j) = self.view.job(self.jobs[i].view_id) {
            self.releases.observe(j, now);
        }
    }

    /// Node agents' reports: every member started (the job runs).
    fn report_started(&mut self, i: usize, proposal: ProposalId, members: &[MemberPlacement]) {
        let job = self.jobs[i].view_id;
        for (k, m) in members.iter().enumerate() {
            let cmd = Command::Task { job, proposal, member: k as u32, server: m.server, event: TaskEvent::Started };
            let out = self.view.apply(&cmd);
            debug_assert!(matches!(out, Outcome::TaskReported(Ok(_))), "{out:?}");
        }
    }

    /// Adds job `i` to its servers and recomputes the speeds there.
    fn occupy(&mut self, i: usize) {
        let servers: BTreeSet<ServerId> = self.jobs[i].members.iter().map(|m| m.server).collect();
        for s in &servers {
            self.server_jobs[s.index()].push(i);
        }
        self.running.add(self.jobs[i].view_id, self.jobs[i].gpus, servers.iter().copied());
        self.respeed(&servers);
    }

    /// Removes job `i` from its servers and recomputes the speeds of the others there.
    fn vacate(&mut self, i: usize) -> BTreeSet<ServerId> {
        let servers: BTreeSet<ServerId> = self.jobs[i].members.iter().map(|m| m.server).collect();
        for s in &servers {
            self.server_jobs[s.index()].retain(|&j| j != i);
        }
        self.running.remove(self.jobs[i].view_id);
        servers
    }

    fn respeed(&mut self, servers: &BTreeSet<ServerId>) {
        let affected: BTreeSet<usize> =
            servers.iter().flat_map(|s| self.server_jobs[s.index()].iter().copied()).collect();
        let now = self.last_t;
        for j in affected {
            self.set_speed(j, now);
        }
    }

    /// Recomputes job `j`'s speed at `now` and reschedules its completion.
    fn set_speed(&mut self, j: usize, now: f64) {
        let rt = &self.jobs[j];
        let done = rt.speed * (now - rt.since_s);
        let speed = if rt.paused { 0.0 } else { self.speed_of(j) };
        let rt = &mut self.jobs[j];
        rt.work_left_s = (rt.work_left_s - done).max(0.0);
        rt.speed_time += rt.speed * (now - rt.since_s);
        rt.since_s = now;
        rt.speed = speed;
        rt.epoch += 1;
        if speed > 0.0 {
            let (t, epoch) = (now + rt.work_left_s / speed, rt.epoch);
            self.push(t, Event::Finish(j, epoch));
        }
    }

    fn speed_of(&self, j: usize) -> f64 {
        let rt = &self.jobs[j];
        let servers: BTreeSet<ServerId> = rt.members.iter().map(|m| m.server).collect();
        let cores_per_gpu = rt
            .members
            .iter()
            .map(|m| f64::from(m.cores.count()) / f64::from(m.gpus.count_ones().max(1)))
            .fold(f64::INFINITY, f64::min);
        let interfered = rt.members.iter().any(|m| {
            let topo = self.view.topology_of(self.view.servers()[m.server.index()].config_set);
            let mine = topo.pcie_switches.iter().filter(|&&sw| sw & m.gpus != 0).fold(0u64, |a, sw| a | sw);
            self.server_jobs[m.server.index()]
                .iter()
                .filter(|&&o| o != j)
                .any(|&o| self.jobs[o].members.iter().any(|om| om.server == m.server && om.gpus & mine != 0))
        });
        self.model.speed(rt.class, rt.theta, rt.level, servers.len(), cores_per_gpu, interfered)
    }

    fn finish(&mut self, i: usize, now: f64) {
        self.set_speed(i, now);
        let job = self.jobs[i].view_id;
        let out = self.view.apply(&Command::Release { job, failed: false });
        debug_assert_eq!(out, Outcome::Ended(Ok(())));
        let servers = self.vacate(i);
        let rt = &mut self.jobs[i];
        rt.finish_s = Some(now);
        rt.epoch += 1;
        let gpus = u64::from(rt.gpus);
        self.observe(i, now);
        self.set_busy(now, self.busy_gpus - gpus);
        self.respeed(&servers);
        self.resources_freed = true;
    }

    fn resume(&mut self, i: usize, now: f64) {
        let (job, members) = (self.jobs[i].view_id, self.jobs[i].members.clone());
        let Some(proposal) = self.view.job(job).and_then(|j| j.placement.as_ref()).map(|p| p.proposal) else { return };
        self.report_started(i, proposal, &members);
        self.jobs[i].paused = false;
        self.set_speed(i, now);
    }

    /// Plans and applies moves that let job `i` start; true if it started.
    fn try_migrate(&mut self, i: usize, level: LocalityLevel, now: f64) -> bool {
        let remaining: BTreeMap<JobId, f64> = self
            .server_jobs
            .iter()
            .flatten()
            .map(|&j| {
                let rt = &self.jobs[j];
                let left = rt.work_left_s - rt.speed * (now - rt.since_s);
                (rt.view_id, if rt.speed > 0.0 { left / rt.speed } else { f64::INFINITY })
            })
            .collect();
        let job = self.jobs[i].view_id;
        let Some(plan) = migration_planner::plan(&self.view, job, level, &remaining, &self.cfg.migration) else {
            return false;
        };
        // Neither the job nor the jobs moved for it may land on servers withheld from it.
        let lands = plan.target.iter().chain(plan.moves.iter().flat_map(|m| m.to.iter())).map(|m| m.server);
        if self.view.job(job).is_some_and(|j| self.reservations.withholds_any(j, now, lands)) {
            return false;
        }
        let moves: Vec<Proposal> = plan
            .moves
            .iter()
            .map(|m| {
                self.next_proposal += 1;
                Proposal {
                    id: ProposalId(self.next_proposal),
                    job: m.job,
                    members: m.to.clone(),
                    based_on: self.view.version(),
                }
            })
            .collect();
        if !moves.is_empty() {
            let Outcome::Decided(ds) = self.view.apply(&Command::Migrate(moves.clone())) else { return false };
            for (p, d) in moves.iter().zip(&ds) {
                if !d.is_placed() {
                    self.rep.rejected_proposals += 1;
                    continue;
                }
                let Some(&j) = self.by_view.get(&p.job) else { continue };
                self.pause_for_move(j, p, now);
            }
            self.local.catch_up(&self.view);
            if !ds.iter().all(Decision::is_placed) {
                return false;
            }
        }
        self.propose(i, plan.target, now)
    }

    /// A moved job: new members, no progress until its checkpoint-restart pause ends.
    fn pause_for_move(&mut self, j: usize, p: &Proposal, now: f64) {
        let mut servers = self.vacate(j);
        let cost = self.cfg.migration.checkpoint_restart_s;
        self.rep.migrations += 1;
        self.rep.migration_cost_gpu_s += f64::from(self.jobs[j].gpus) * cost;
        let level = self.view.gang_level(&p.members);
        {
            let rt = &mut self.jobs[j];
            rt.paused = true;
            rt.members = p.members.clone();
            rt.level = level;
        }
        self.set_speed(j, now);
        servers.extend(p.members.iter().map(|m| m.server));
        let to: BTreeSet<ServerId> = p.members.iter().map(|m| m.server).collect();
        for s in &to {
            self.server_jobs[s.index()].push(j);
        }
        self.running.add(self.jobs[j].view_id, self.jobs[j].gpus, to);
        self.observe(j, now);
        self.respeed(&servers);
        self.jobs[j].moves += 1;
        let moves = self.jobs[j].moves;
        self.push(now + cost, Event::Resume(j, moves));
    }

    fn check_invariants(&mut self) {
        let r = invariants::check(&self.view);
        self.rep.invariant_checks += 1;
        self.rep.invariant_violations += r.violations.len() as u64;
        debug_assert!(r.is_clean(), "{:?}", r.violations);
    }

    fn report(mut self, trace: &Trace) -> PolicyReport {
        let mut rep = std::mem::take(&mut self.rep);
        rep.jobs = self.jobs.len() as u64;
        let held = self.reservations.stats();
        (rep.reservations, rep.reservations_given_up) = (held.made, held.abandoned);
        (rep.reservation_held_back_s, rep.reserved_idle_gpu_s) = (held.held_back_s, held.idled_gpu_s);
        rep.job_records = self
            .jobs
            .iter()
            .zip(&trace.jobs)
            .map(|(j, t)| JobRecord {
                name: t.name.clone(),
                gpus: j.gpus,
                arrival_s: j.arrival_s,
                start_s: j.start_s,
                end_s: j.finish_s,
                level: j.start_s.map(|_| j.level),
                moves: j.moves,
            })
            .collect();
        let first = self.jobs.iter().map(|j| j.arrival_s).fold(f64::INFINITY, f64::min);
        let last = self.jobs.iter().filter_map(|j| j.finish_s).fold(0.0, f64::max);
        let mut jct = Vec::new();
        let mut queue_sum = [0.0f64; 4];
        let mut queue_n = [0u64; 4];
        let mut at_pref = 0u64;
        let mut frag_sum = [0.0f64; 4];
        let mut frag_n = [0u64; 4];
        for j in &self.jobs {
            let b = size_bucket(j.gpus);
            frag_sum[b] += j.frag_blocked_s;
            frag_n[b] += 1;
        }
        let mut speed_sum = 0.0;
        for j in &self.jobs {
            let (Some(start), Some(end)) = (j.start_s, j.finish_s) else { continue };
            rep.finished += 1;
            jct.push(end - j.arrival_s);
            let b = size_bucket(j.gpus);
            queue_sum[b] += start - j.arrival_s;
            queue_n[b] += 1;
            rep.queue_by_job.push((j.gpus, start - j.arrival_s));
            at_pref += u64::from(j.at_preferred);
            if end > start {
                speed_sum += j.speed_time / (end - start);
            }
        }
        jct.sort_by(f64::total_cmp);
        let n = jct.len().max(1) as f64;
        let pct = |p: f64| -> f64 {
            if jct.is_empty() {
                return 0.0;
            }
            jct[((p * jct.len() as f64).ceil() as usize).clamp(1, jct.len()) - 1]
        };
        rep.avg_jct_s = jct.iter().sum::<f64>() / n;
        rep.p50_jct_s = pct(0.50);
        rep.p95_jct_s = pct(0.95);
        rep.p99_jct_s = pct(0.99);
        rep.makespan_s = if last > first { last - first } else { 0.0 };
        rep.gpu_utilization =
            if rep.makespan_s > 0.0 { self.busy_area / (self.total_gpus as f64 * rep.makespan_s) } else { 0.0 };
        for (b, name) in SIZE_BUCKETS.iter().enumerate() {
            let mean = if queue_n[b] > 0 { queue_sum[b] / queue_n[b] as f64 } else { 0.0 };
            rep.queue_s_by_size.insert((*name).to_string(), mean);
            rep.jobs_by_size.insert((*name).to_string(), queue_n[b]);
            let frag = if frag_n[b] > 0 { frag_sum[b] / frag_n[b] as f64 } else { 0.0 };
            rep.frag_blocked_s_by_size.insert((*name).to_string(), frag);
        }
        rep.avg_queue_s = queue_sum.iter().sum::<f64>() / n;
        rep.fragmentation =
            if self.frag_time > 0.0 { self.frag_area / (self.total_gpus as f64 * self.frag_time) } else { 0.0 };
        rep.preferred_locality_share = at_pref as f64 / n;
        rep.avg_speed = speed_sum / n;
        rep.utilization = downsample(&self.busy_series, last, self.total_gpus);
        rep.jct_s = jct;
        rep
    }
}

/// Time-averages a step series of busy GPUs into [`UTILIZATION_POINTS`] equal intervals.
fn downsample(series: &[(f64, u64)], end: f64, total: u64) -> Vec<(f64, f64)> {
    if end <= 0.0 || total == 0 {
        return Vec::new();
    }
    let dt = end / UTILIZATION_POINTS as f64;
    let mut out = Vec::with_capacity(UTILIZATION_POINTS);
    let mut k = 0;
    for p in 0..UTILIZATION_POINTS {
        let (a, b) = (p as f64 * dt, (p + 1) as f64 * dt);
        let mut area = 0.0;
        while k + 1 < series.len() && series[k + 1].0 <= a {
            k += 1;
        }
        let mut q = k;
        while q < series.len() && series[q].0 < b {
            let from = series[q].0.max(a);
            let to = series.get(q + 1).map_or(b, |n| n.0.min(b));
            area += series[q].1 as f64 * (to - from).max(0.0);
            q += 1;
        }
        out.push((a, area / dt / total as f64));
    }
    out
}

fn is_zero_f(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Free GPUs of each device type: in the whole cluster, and per rack and per IB domain, for the
/// aggregate half of the fragmentation test.
struct FreeGpus<'v> {
    cluster: BTreeMap<&'v str, u32>,
    rack: BTreeMap<(&'v str, u32), u32>,
    ib: BTreeMap<(&'v str, u32), u32>,
}

impl<'v> FreeGpus<'v> {
    fn of(view: &'v LocalView) -> FreeGpus<'v> {
        let mut f = FreeGpus { cluster: BTreeMap::new(), rack: BTreeMap::new(), ib: BTreeMap::new() };
        for rec in view.servers() {
            let n = rec.free_gpus.count_ones();
            if n == 0 || rec.health != tessera_view::Health::Up {
                continue;
            }
            let cs = &view.config_sets()[rec.config_set.index()];
            let t = view.topology_of(rec.config_set).device_type.as_str();
            *f.cluster.entry(t).or_default() += n;
            *f.rack.entry((t, cs.rack)).or_default() += n;
            *f.ib.entry((t, cs.ib_domain)).or_default() += n;
        }
        f
    }

    /// Whether enough GPUs of the job's type are free where its allowed level needs them.
    fn enough(&self, spec: &JobSpec, allowed: LocalityLevel) -> bool {
        let g = spec.total_gpus();
        let typed = |t: &str| spec.gpu_type.as_deref().is_none_or(|w| w == t);
        match allowed {
            LocalityLevel::Rack => self.rack.iter().any(|((t, _), n)| typed(t) && *n >= g),
            LocalityLevel::IbDomain => self.ib.iter().any(|((t, _), n)| typed(t) && *n >= g),
            _ => self.cluster.iter().filter(|(t, _)| typed(t)).map(|(_, n)| *n).sum::<u32>() >= g,
        }
    }
}
