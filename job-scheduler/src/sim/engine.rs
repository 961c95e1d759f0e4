//! The event loop of one simulated run, and its metrics.
//!
//! Events are arrivals, job completions, the end of a moved job's checkpoint-restart pause,
//! wake-ups when a waiting job's locality tolerance relaxes, and the view's own deadlines (a
//! running job reaching its next attained-service threshold). Before the events of an instant
//! the view's clock is set to it, as a leader's clock entries set a live view's, so the view
//! stamps placements and moves jobs down its queues on simulated time. After all events of one instant, a
//! scheduling pass offers waiting jobs in the host's order (arrival, or rank under
//! attained-service order; a job that does not fit is skipped, not waited on, as generic
//! schedulers do): after a release every waiting job is tried, after an arrival only the new
//! ones. A shape that failed once in a pass is not searched again in that pass.
//!
//! Each waiting job is placed by the live host's own [`PlaceMachine`] on simulated time: the
//! pass shows it the view and carries out what it asks (propose, preempt, give up, wait until
//! a relaxation step or a cost bound), as [`crate::runtime::place_job`] does over gRPC, so the
//! locality-cost rule, the preemption step and the retry rules are the ones a live cluster
//! runs. What the simulated host adds is what a live host runs beside its machines: the order
//! of the pass and migration planning for jobs nothing fits (the live migration task).
//! A job's progress is work (seconds at full speed) done at its current
//! speed; speeds change when jobs start, end or move beside it (interference) and are
//! recomputed for the jobs on the servers touched.
//!
//! | file | what |
//! |---|---|
//! | `engine.rs` | the run (`simulate`) and its event loop |
//! | `engine/pass.rs` | the scheduling pass: each waiting job's machine shown the view, its actions carried out; then moves for jobs nothing fit |
//! | `engine/migrate.rs` | migration plans for blocked jobs, applied through the approver |
//! | `engine/preempt.rs` | a machine's `Command::Preempt` through the approver, the victims stopped |
//! | `engine/fragmentation.rs` | the fragmentation-blocked wait of each pending job; free GPUs short of their core share |
//! | `engine/report.rs` | [`PolicyReport`], [`JobRecord`] and the report's assembly |

mod fragmentation;
mod migrate;
mod pass;
mod preempt;
mod report;

pub use report::{JobRecord, PolicyReport};

use super::compared_policies::{self, Contender, QueueOrder};
use super::model::SpeedModel;
use super::{SIZE_BUCKETS, Trace, size_bucket};
use crate::SchedulerError;
use crate::local_view::{LocalView, Overlay};
use crate::locality_cost::{self, ReleaseStats};
use crate::migration_task::{self, CANDIDATES_PER_INTERVAL, MigrationConfig};
use crate::reservation::Reservations;
use crate::runtime::{Action, Answer, Event as Look, PlaceMachine, Placed, RuntimeOptions};
use crate::scheduler::{Context, RunningIndex};
use crate::search::find_placement;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::time::Duration;
use tessera_view::attained::QueueKey;
use tessera_view::fit::FitMode;
use tessera_view::migration_planner::{self, MigrationParams};
use tessera_view::view::DEFAULT_CHANGE_LOG;
use tessera_view::{
    ClusterSpec, ClusterView, Command, CpuDemand, Decision, JobId, JobSpec, LocalityLevel, MemberPlacement, Outcome,
    Proposal, ProposalId, ServerId, TaskEvent, ViewError, invariants,
};

/// Ended jobs the simulated view keeps (the simulator keeps its own records).
const ENDED_KEPT: usize = 1024;
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

/// Simulated second `t` on a [`PlaceMachine`]'s clock.
fn machine_time(t: f64) -> Duration {
    Duration::from_secs_f64(t.max(0.0))
}

/// A live host's machine also looks again every `max_backoff` in case it missed a change of
/// the view; the simulated host misses none, so its machines' waits end only on their own
/// timers (a relaxation step, a cost bound, a backoff). A wait this long is no timer.
const NO_POLL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The contender: its scheduler, how it writes trace jobs as specs, whether it migrates.
    pub contender: Contender,
    /// Seed: the salt of the jobs' placement machines ([`RuntimeOptions::salt`]), as a live
    /// host's name salts its own: each job's probe offset (the salt plus the job id), proposal
    /// ids and backoff jitter derive from it (the only randomness).
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
    /// Its spec's device type as a number (types numbered as the run first meets them): the
    /// same type, the same number.
    ty: Option<u32>,
    /// The level its spec allows whatever it waited, if that does not change with the wait
    /// (no `relax_after_s` timer): [`JobSpec::allowed_level`] once, not once a pass.
    fixed_allowed: Option<LocalityLevel>,
    class: usize,
    theta: f64,
    gpus: u32,
    arrival_s: f64,
    /// When the host last adopted it: on arrival, and again when it was requeued after a
    /// preemption (the migration task's [`MigrationConfig::min_wait`] counts from then).
    adopted_s: f64,
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
    /// Since when it has been blocked by fragmentation (see [`PolicyReport::frag_blocked_s_by_size`]).
    frag_since: Option<f64>,
    /// Seconds it waited blocked by fragmentation.
    frag_blocked_s: f64,
}

impl Rt {
    /// The level its spec allows at `now` ([`JobSpec::allowed_level`] after its wait so far).
    fn allowed(&self, now: f64) -> LocalityLevel {
        self.fixed_allowed.unwrap_or_else(|| self.spec.allowed_level((now - self.arrival_s).max(0.0) as u64))
    }
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
    /// Moves of the last [`MigrationConfig::cooldown`] (at least; older ones are dropped when
    /// the next plan is made), oldest first: a live host does not move these jobs again yet.
    recent_moves: VecDeque<(f64, JobId)>,
    /// Plans found impossible on the cluster as it still is, as the live task keeps them.
    failed_plans: migration_planner::FailedPlans,
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
    /// Free GPUs short of their proportional core share, as of the last pass, and their
    /// integral while jobs waited ([`PolicyReport::coreless`]).
    coreless_gpus: u64,
    coreless_area: f64,
    frag_time: f64,
    busy_series: Vec<(f64, u64)>,
    /// When the migration task's next round may run: one round per live interval.
    next_plan_s: f64,
    /// The round a pass is already due for (a `Wake` pushed for it): one per interval.
    round_wake_s: f64,
    /// The lowest rank among the running jobs under the preemption bound, while current (the
    /// pass's check before any search).
    lowest_victim: Option<Option<(i32, Reverse<u8>)>>,
    /// Whether the cluster orders waiting jobs by attained service (it names thresholds).
    ranked: bool,
    /// Each waiting job's placement machine, the live host's ([`PlaceMachine`]): it asks the
    /// scheduler, weighs locality as a cost, preempts, proposes and says how long to wait.
    machines: Vec<Option<PlaceMachine<'a>>>,
    /// The machines' options: proposal ids and jitter seeded from the run's seed; no poll.
    runtime: RuntimeOptions,
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
    // A contender in attained-service order runs on a cluster that names its thresholds (and
    // its starvation bound, where it sets one): the view moves jobs down its queues itself, as
    // a live cluster's does.
    let mut cluster = cluster.clone();
    if let QueueOrder::AttainedService { thresholds_gpu_s, max_preemptions } = &cfg.contender.order {
        cluster.priorities.attained_service_gpu_s = thresholds_gpu_s.clone();
        if let Some(max) = max_preemptions {
            cluster.priorities.max_preemptions = *max;
        }
        cluster.priorities.validate().map_err(|(field, why)| SchedulerError::BadSetting {
            setting: "a contender's attained-service thresholds",
            expected: format!("what `priorities.{field}` accepts ({why})"),
            got: format!("{thresholds_gpu_s:?} for `{}`", cfg.contender.name),
        })?;
    }
    let mut view = ClusterView::from_spec(&cluster).with_limits(DEFAULT_CHANGE_LOG, ENDED_KEPT);
    view.apply(&Command::Clock { at_ms: view_ms(0.0) });
    let ranked = !view.priorities().attained_service_gpu_s.is_empty();
    let max_preemptions = view.priorities().max_preemptions;
    let local = LocalView::of_view(&view);
    let total_gpus = view.servers().iter().map(|r| u64::from(view.topology_of(r.config_set).devices)).sum();
    let mut sim = Sim {
        cfg,
        model,
        server_jobs: vec![Vec::new(); view.servers().len()],
        recent_moves: VecDeque::new(),
        failed_plans: migration_planner::FailedPlans::default(),
        running: RunningIndex::new().with_preemption_bound(max_preemptions),
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
        coreless_gpus: 0,
        coreless_area: 0.0,
        frag_time: 0.0,
        busy_series: vec![(0.0, 0)],
        next_plan_s: 0.0,
        round_wake_s: 0.0,
        lowest_victim: None,
        ranked,
        machines: Vec::with_capacity(trace.jobs.len()),
        runtime: RuntimeOptions { salt: cfg.seed, max_backoff: NO_POLL, ..RuntimeOptions::default() },
        clock_wake_s: f64::INFINITY,
        releases: ReleaseStats::new(),
        reservations: Reservations::new(),
        rep: PolicyReport::default(),
    };
    let scale = cfg.load_scale.max(1e-9);
    let mut types: HashMap<String, u32> = HashMap::new();
    for (i, j) in trace.jobs.iter().enumerate() {
        let class = model.class_of(&j.job_type);
        let theta = compared_policies::theta_of(j, model, class);
        let declared = model.declared_theta(theta);
        let spec = cfg.contender.style.spec(j, declared, &model.slowdown_of(class), sim.view.topologies());
        let preferred = compared_policies::preferred_level(j.gpus, sim.view.topologies());
        let next = types.len() as u32;
        let ty = spec.gpu_type.as_ref().map(|t| *types.entry(t.clone()).or_insert(next));
        let fixed_allowed = spec.relax_after_s.is_none_or(|step| step == 0).then(|| spec.allowed_level(0));
        sim.jobs.push(Rt {
            view_id: JobId(0),
            spec,
            ty,
            fixed_allowed,
            class,
            theta,
            gpus: j.gpus,
            arrival_s: j.arrival_s / scale,
            adopted_s: j.arrival_s / scale,
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
            frag_since: None,
            frag_blocked_s: 0.0,
        });
        sim.machines.push(None);
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
        if sim.schedule(now)? {
            sim.track_fragmentation(now);
        }
        sim.wake_for_clock();
    }
    progress(total_events, total_events);
    sim.check_invariants();
    Ok(sim.report(trace))
}

impl<'a> Sim<'a> {
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
                self.coreless_area += self.coreless_gpus as f64 * dt;
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
            Event::Requeued(i) => {
                // The live host adopts a preempted job anew: a new machine, its wait counted
                // from its submission as before (`Job::waiting_from_ms`).
                self.machines[i] = Some(self.machine(i));
                self.jobs[i].adopted_s = now;
                self.fresh.push(i);
            }
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
        self.machines[i] = Some(self.machine(i));
        self.by_view.insert(id, i);
        self.pending.insert(i);
        self.fresh.push(i);
        Ok(())
    }

    /// A placement machine for job `i`, waiting since its arrival.
    fn machine(&self, i: usize) -> PlaceMachine<'a> {
        let rt = &self.jobs[i];
        PlaceMachine::new(self.cfg.contender.scheduler.as_ref(), rt.view_id, machine_time(rt.arrival_s), &self.runtime)
    }

    fn next_proposal(&mut self) -> ProposalId {
        self.next_proposal += 1;
        ProposalId(self.next_proposal)
    }

    /// Cancels job `i` for its scheduler, which gave up on it.
    fn give_up(&mut self, i: usize, reason: String) {
        let job = self.jobs[i].view_id;
        let out = self.view.apply(&Command::Cancel { job, reason: Some(reason), grace_s: None });
        debug_assert_eq!(out, Outcome::Ended(Ok(())));
        self.pending.remove(&i);
        self.machines[i] = None;
        self.rep.gave_up += 1;
    }

    /// Schedules a pass at `t` for job `i`, unless one is due for it before `t` and after now.
    fn wake_at(&mut self, i: usize, t: f64) {
        let due = self.jobs[i].next_wake_s;
        if due <= self.last_t || t < due {
            self.jobs[i].next_wake_s = t;
            self.push(t, Event::Wake);
        }
    }

    /// Sends `p` for job `i` to the approver, as a live host's `Propose` call does, and starts
    /// the job if it is accepted.
    fn propose(&mut self, i: usize, p: Proposal, now: f64) -> Answer {
        let d = self.view.propose(&p);
        if let Decision::Accepted { level, .. } = d {
            self.start(i, p.id, p.members, level, now);
        } else {
            self.rep.rejected_proposals += 1;
        }
        Answer::decided(d)
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
        rt.level = level;
        rt.members = members;
        rt.since_s = now;
        let gpus = u64::from(rt.gpus);
        self.set_busy(now, self.busy_gpus + gpus);
        self.machines[i] = None;
        self.occupy(i);
        self.local.catch_up(&self.view);
        self.lowest_victim = None;
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
            // Running jobs moved down a queue: they rank lower as victims.
            self.woke = true;
            for list in &self.server_jobs {
                for &j in list {
                    if let Some(v) = self.view.job(self.jobs[j].view_id) {
                        self.running.rerank(v);
                    }
                }
            }
            self.lowest_victim = None;
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
        if let Some(v) = self.view.job(self.jobs[i].view_id) {
            self.running.update(v);
        }
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
        // Its run restarted: the host's index sees the new start, as a live host's does.
        if let Some(v) = self.view.job(job) {
            self.running.update(v);
        }
        self.jobs[i].paused = false;
        self.set_speed(i, now);
    }

    fn check_invariants(&mut self) {
        let r = invariants::check(&self.view);
        self.rep.invariant_checks += 1;
        self.rep.invariant_violations += r.violations.len() as u64;
        debug_assert!(r.is_clean(), "{:?}", r.violations);
    }
}
