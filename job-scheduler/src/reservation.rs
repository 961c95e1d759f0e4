//! Bounded reservations: a gang that needs whole servers, starved by smaller jobs that keep
//! taking the GPUs released one by one, has the servers it would drain soonest withheld from
//! the jobs behind it — for no longer than the reservation pays.
//!
//! A host that backfills (offers every waiting job, skipping those that do not fit) never lets
//! GPUs idle, but a gang of one or more whole servers starts only when all of a server's GPUs
//! happen to be free at once, and on a busy cluster a smaller job usually takes one first (or,
//! under light load, spreading puts a small job on every server). Holding the GPUs of a few
//! servers for the gang as they are released (EASY backfill's reservation) lets it start, at
//! the price of the jobs held back meanwhile.
//!
//! Both sides are counted in the unit average job completion time is made of, seconds of a
//! job's wait:
//! - **Gain**: the gang starts `waited − Ŵ` sooner, `Ŵ` the expected time until its servers are
//!   drained (release times from the host's observed per-GPU release rate, as
//!   [`crate::locality_cost`] estimates waits, or from running jobs' time limits). A gang that
//!   has waited `waited` for a coincidence of free servers is expected to wait about as long
//!   again: its wait so far is the only evidence of how rare the coincidence is (a Lindy
//!   estimate; no constant).
//! - **Cost**: the waiting it adds to the jobs it holds back. Expected: the idle GPU-seconds
//!   until the servers are drained, `I = f·Ŵ + Σ(Ŵ − tᵢ)` (the `f` GPUs free on them now idle the
//!   whole wait, each GPU released at `tᵢ` the rest), in jobs of the mean size `ḡ` of those
//!   waiting behind (`I/ḡ`: an idle GPU-second a job of `ḡ` GPUs could have used costs it `1/ḡ`
//!   of a second), and at most the `n` jobs waiting behind held the whole wait plus those
//!   expected to arrive meanwhile (at the observed job release rate `λ`) held half of it:
//!   `min(I/ḡ, n·Ŵ + λ·Ŵ²/2)`, amplified by the load (below). And the backlog's share: a
//!   GPU-second idled is capacity every job behind loses, so on a cluster of `G` GPUs each of
//!   the `n` finishes `I/G` later however long after the reservation it starts: `n·I/G`, which
//!   the first term misses when the queue outlives the reservation (traced in
//!   docs/EVALUATION.md). `C` is the larger of the two. Actual: every second, the number of jobs
//!   it holds back that its idle GPUs could hold (smallest first).
//!
//! A reservation is made only when `C ≤ waited − Ŵ`, and that gain is also its budget: the
//! job-seconds it actually holds others back are added up, and it is given up the moment the
//! sum exceeds the budget (a read after that already sees nothing withheld), so no reservation
//! costs others more waiting than the gang is expected to gain, however wrong `Ŵ` was. Later
//! reservations for the same gang have only what is left of the gain it had then. On a busy
//! cluster, where every idle GPU holds a job back, a gang so reserves only after a long wait; on
//! a quiet one, where few wait, at once. Its wait is bounded either way, as its gain grows with
//! it.
//!
//! One reservation at a time, for the first such gang in the host's queue order (the head of
//! the queue, as in EASY backfill). Jobs that outrank it, and jobs whose time limit ends them
//! before the gang is expected to start, may still use the withheld GPUs. Reservations are
//! host-local and not replicated: the approver knows nothing of them, and a host's reservation
//! fails harmlessly if another host takes the GPUs. Every host computes the same head from the
//! same replicated view, so hosts of one cluster withhold alike.
//!
//! The same type runs in the live host ([`crate::cache::CacheState::reservations`], read by
//! [`crate::PlaceMachine`]) and in the simulator. It is off by default (`tessera scheduler run
//! --reservations`; the simulator's `tessera-reserving` preset): on the robustness matrix it
//! costs more average completion time than it saves (docs/EVALUATION.md).

use crate::local_view::{LocalView, Overlay};
use crate::locality_cost::{self, ReleaseStats};
use crate::search::find_placement;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use tessera_view::fit::FitMode;
use tessera_view::{Health, Job, JobId, JobSpec, JobState, LocalityLevel, ServerId, ServerRecord};

/// Jobs whose spent reservation budget is remembered (the oldest are forgotten beyond it).
const SPENT_KEPT: usize = 1024;

/// The servers to drain for a gang, and what draining them is expected to cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Drain {
    /// The servers whose GPUs are withheld, in id order.
    pub servers: Vec<ServerId>,
    /// Expected seconds until they hold the gang (`Ŵ`).
    pub wait_s: f64,
    /// Expected GPU-seconds they idle meanwhile (`I`).
    pub idle_gpu_s: f64,
}

/// A reservation held for one job.
#[derive(Clone, Debug, PartialEq)]
pub struct Reservation {
    /// The job it is for.
    pub job: JobId,
    /// That job's priority: jobs above it are not held back.
    pub priority: i32,
    /// The servers withheld, in id order.
    pub servers: Vec<ServerId>,
    /// When it was made, on the host's clock (seconds).
    pub since_s: f64,
    /// When the job is expected to start (`since_s + Ŵ`): a job whose time limit ends it
    /// sooner may use the withheld GPUs.
    pub expected_start_s: f64,
    /// Job-seconds it may hold others back: the gain that justified it, less what earlier
    /// reservations for the job held others back.
    pub budget_s: f64,
    /// Job-seconds it held others back up to `last_s`.
    pub held_back_s: f64,
    /// GPU-seconds it idled up to `last_s` that jobs it held back could have used.
    pub idled_gpu_s: f64,
    /// At `last_s`: the job-seconds per second it costs (the jobs held back that its idle GPUs
    /// could hold, amplified by the cluster's load), and those GPUs.
    held_now: f64,
    idle_now: u32,
    last_s: f64,
}

impl Reservation {
    /// Job-seconds held back up to `now_s` (what was held at the last observation stays so
    /// until the next: only observed changes free GPUs or bring jobs).
    pub fn held_back_by(&self, now_s: f64) -> f64 {
        self.held_back_s + self.held_now * (now_s - self.last_s).max(0.0)
    }

    /// Whether it has held others back longer than its budget by `now_s`.
    pub fn spent_by(&self, now_s: f64) -> bool {
        self.held_back_by(now_s) > self.budget_s
    }

    /// Counts what it held back and idled up to `now_s`.
    fn accrue(&mut self, now_s: f64) {
        let dt = (now_s - self.last_s).max(0.0);
        self.held_back_s += self.held_now * dt;
        self.idled_gpu_s += f64::from(self.idle_now) * dt;
        self.last_s = now_s;
    }
}

/// What a host's reservations came to (the simulator reports them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReservationStats {
    /// Reservations made.
    pub made: u64,
    /// Given up because they spent their whole budget (or a server left).
    pub abandoned: u64,
    /// Job-seconds they held other jobs back.
    pub held_back_s: f64,
    /// GPU-seconds they idled that jobs they held back could have used.
    pub idled_gpu_s: f64,
}

/// A host's reservation, if it holds one, and the budget each job has spent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reservations {
    current: Option<Reservation>,
    /// Job-seconds earlier reservations held others back, per job still waiting.
    spent: BTreeMap<JobId, f64>,
    stats: ReservationStats,
}

impl Reservations {
    /// None held.
    pub const fn new() -> Reservations {
        let stats = ReservationStats { made: 0, abandoned: 0, held_back_s: 0.0, idled_gpu_s: 0.0 };
        Reservations { current: None, spent: BTreeMap::new(), stats }
    }

    /// The reservation held, if any.
    pub fn current(&self) -> Option<&Reservation> {
        self.current.as_ref()
    }

    /// What the reservations came to so far (the one held counted up to its last update).
    pub fn stats(&self) -> ReservationStats {
        let mut s = self.stats;
        if let Some(r) = &self.current {
            s.held_back_s += r.held_back_s;
            s.idled_gpu_s += r.idled_gpu_s;
        }
        s
    }

    /// Brings the reservation up to `now_s`: counts what it held back, ends it if its job no
    /// longer waits, gives it up if it spent its budget or a server left, and otherwise, if none
    /// is held, makes one for the first job of `queue` (waiting jobs in the host's order, each
    /// with the seconds it has waited) that needs whole servers, fits nowhere now, and for
    /// which reserving pays. Call after every change of what is free or waiting.
    pub fn update<'j>(
        &mut self,
        view: &LocalView,
        queue: impl IntoIterator<Item = (&'j Job, f64)>,
        stats: &ReleaseStats,
        now_s: f64,
    ) {
        let queue: Vec<(&Job, f64)> = queue.into_iter().filter(|(j, _)| ready(j)).collect();
        if let Some(mut r) = self.current.take() {
            r.accrue(now_s);
            let waiting = queue.iter().any(|(j, _)| j.id == r.job);
            let server_left =
                r.servers.iter().any(|s| view.servers().get(s.index()).is_none_or(|x| x.health != Health::Up));
            if waiting && !server_left && r.held_back_s <= r.budget_s {
                self.current = Some(r);
            } else {
                self.stats.held_back_s += r.held_back_s;
                self.stats.idled_gpu_s += r.idled_gpu_s;
                if waiting {
                    *self.spent.entry(r.job).or_default() += r.held_back_s;
                    self.stats.abandoned += 1;
                    tracing::info!(
                        job_id = r.job.0,
                        held_back_s = r.held_back_s as u64,
                        budget_s = r.budget_s as u64,
                        server_left,
                        "reservation given up"
                    );
                } else {
                    self.spent.remove(&r.job);
                }
            }
        }
        if self.current.is_none() {
            self.current = self.reserve(view, &queue, stats, now_s);
            if let Some(r) = &self.current {
                self.stats.made += 1;
                tracing::info!(
                    job_id = r.job.0,
                    servers = r.servers.len(),
                    expected_start_in_s = (r.expected_start_s - now_s) as u64,
                    budget_s = r.budget_s as u64,
                    "reserving servers for a gang"
                );
            }
        }
        self.observe_free(view, queue.iter().map(|q| q.0), now_s);
        if self.spent.len() > SPENT_KEPT {
            let waiting: Vec<JobId> = queue.iter().map(|(j, _)| j.id).collect();
            self.spent.retain(|id, _| waiting.contains(id));
        }
    }

    /// Takes what the reservation holds back now: the waiting jobs it is withheld from (in
    /// `waiting`) that the free GPUs of its servers could hold, smallest first, and those
    /// GPUs. They stay so until the next observation. For a host that changed what is free or
    /// waiting since its last [`Reservations::update`] (it placed jobs).
    pub fn observe_free<'j>(&mut self, view: &LocalView, waiting: impl IntoIterator<Item = &'j Job>, now_s: f64) {
        if self.current.is_none() {
            return;
        }
        let free = self.free_on_withheld(view.servers());
        let mut sizes: Vec<u32> = (waiting.into_iter())
            .filter(|j| ready(j) && self.withholds(j, now_s))
            .map(|j| j.spec.total_gpus())
            .collect();
        sizes.sort_unstable();
        let (mut held, mut used) = (0, 0);
        for g in sizes {
            if used + g > free {
                break;
            }
            (held, used) = (held + 1, used + g);
        }
        let rate = f64::from(held) * load_amplification(up_gpus(view));
        if let Some(r) = &mut self.current {
            r.accrue(now_s);
            (r.held_now, r.idle_now) = (rate, used);
        }
    }

    /// GPUs free on the withheld servers in `servers` (a view's records); 0 when none is held.
    pub fn free_on_withheld(&self, servers: &[ServerRecord]) -> u32 {
        let Some(r) = &self.current else { return 0 };
        r.servers.iter().filter_map(|s| servers.get(s.index())).map(|x| x.free_gpus.count_ones()).sum()
    }

    /// A reservation for the head of `queue`, if it needs one and it pays.
    fn reserve(
        &self,
        view: &LocalView,
        queue: &[(&Job, f64)],
        stats: &ReleaseStats,
        now_s: f64,
    ) -> Option<Reservation> {
        let (head, waited) = queue.iter().copied().find(|(j, _)| needs_whole_servers(view, &j.spec))?;
        let allowed = head.spec.allowed_level(waited.max(0.0) as u64);
        if find_placement(view, &Overlay::default(), &head.spec, allowed, FitMode::Pack, 0).is_ok()
            || locality_cost::can_start_looser(view, &head.spec, allowed)
        {
            // It starts now, or can and waits for a tighter level by choice: nothing to hold.
            return None;
        }
        let drain = drain(view, &head.spec, allowed, stats, now_s)?;
        let spent = self.spent.get(&head.id).copied().unwrap_or(0.0);
        let budget = waited - drain.wait_s - spent;
        if budget <= 0.0 {
            return None;
        }
        // The jobs waiting behind that it would hold back (those that outrank it are not).
        let behind: Vec<u32> = (queue.iter())
            .filter(|(j, _)| j.id != head.id && j.spec.priority <= head.spec.priority)
            .map(|(j, _)| j.spec.total_gpus())
            .collect();
        let mean_gpus = if behind.is_empty() {
            stats.mean_release_gpus().unwrap_or(1.0)
        } else {
            f64::from(behind.iter().sum::<u32>()) / behind.len() as f64
        };
        let arrivals = stats.job_release_rate().unwrap_or(0.0);
        let w = drain.wait_s;
        let held = (drain.idle_gpu_s / mean_gpus.max(1.0)).min(behind.len() as f64 * w + arrivals * w * w / 2.0);
        // The backlog's share: a GPU-second idled is capacity every job behind loses, so on a
        // cluster of `G` GPUs each of the `n` behind finishes `I/G` later, however long after the
        // reservation it starts (what the held-back account above does not see).
        let gpus = up_gpus(view);
        let backlog = behind.len() as f64 * drain.idle_gpu_s / f64::from(gpus.1.max(1));
        let cost = (held * load_amplification(gpus)).max(backlog);
        (cost <= budget).then_some(Reservation {
            job: head.id,
            priority: head.spec.priority,
            servers: drain.servers,
            since_s: now_s,
            expected_start_s: now_s + w,
            budget_s: budget,
            held_back_s: 0.0,
            idled_gpu_s: 0.0,
            held_now: 0.0,
            idle_now: 0,
            last_s: now_s,
        })
    }

    /// The withheld servers as `job` must see them (no GPU free), or `None` when nothing is
    /// withheld from it at `now_s` ([`Reservations::withholds`]).
    pub fn withheld_from(&self, view: &LocalView, job: &Job, now_s: f64) -> Option<Vec<(ServerId, ServerRecord)>> {
        if !self.withholds(job, now_s) {
            return None;
        }
        let r = self.current.as_ref()?;
        let hidden = r.servers.iter().filter_map(|&s| {
            let rec = view.servers().get(s.index())?;
            (rec.free_gpus != 0).then_some((s, ServerRecord { free_gpus: 0, ..*rec }))
        });
        Some(hidden.collect())
    }

    /// Whether servers are withheld from `job` at `now_s`: a reservation is held, not for this
    /// job, which does not outrank it, whose time limit (if any) does not end it before the gang
    /// is expected to start, and the reservation has not spent its budget (it is given up at the
    /// next update).
    pub fn withholds(&self, job: &Job, now_s: f64) -> bool {
        let Some(r) = &self.current else { return false };
        let ends_first = job.spec.run.time_limit_s.is_some_and(|l| now_s + l as f64 <= r.expected_start_s);
        !(r.job == job.id || job.spec.priority > r.priority || ends_first || r.spent_by(now_s))
    }

    /// Whether any of `servers` is withheld from `job` at `now_s` (a move planned for it must
    /// not land there).
    pub fn withholds_any(&self, job: &Job, now_s: f64, mut servers: impl Iterator<Item = ServerId>) -> bool {
        self.withholds(job, now_s) && self.current.as_ref().is_some_and(|r| servers.any(|s| r.servers.contains(&s)))
    }

    /// `overlay` with the servers withheld from `job` at `now_s` added (their GPUs shown as
    /// taken), or `None` when nothing is withheld from it.
    pub fn overlay_for(&self, view: &LocalView, overlay: &Overlay, job: &Job, now_s: f64) -> Option<Overlay> {
        let hidden = self.withheld_from(view, job, now_s)?;
        let mut o = overlay.clone();
        let fresher: Vec<(ServerId, ServerRecord)> = hidden
            .into_iter()
            .map(|(s, rec)| (s, overlay.get(s).map_or(rec, |known| ServerRecord { free_gpus: 0, ..*known })))
            .collect();
        o.learn(&fresher);
        Some(o)
    }
}

/// What a job-second of waiting held back costs in all on a cluster this loaded: a job held
/// back delays the queue behind it until the backlog clears, and on a cluster whose GPUs are a
/// fraction `ρ` busy a backlog clears `1/(1 − ρ)` times slower than it forms (the busy period of
/// a queue at utilization `ρ`). Infinite when every GPU is busy (capped at 1,000). Of the up
/// servers' `(busy, total)` GPUs ([`up_gpus`]).
fn load_amplification((busy, total): (u32, u32)) -> f64 {
    let rho = if total == 0 { 0.0 } else { f64::from(busy) / f64::from(total) };
    1.0 / (1.0 - rho).max(1e-3)
}

/// GPUs of the servers that are up: busy, and in all.
fn up_gpus(view: &LocalView) -> (u32, u32) {
    let (mut busy, mut total) = (0u32, 0u32);
    for r in view.servers().iter().filter(|r| r.health == Health::Up) {
        let devices = view.topology_of(r.config_set).devices;
        (busy, total) = (busy + devices - r.free_gpus.count_ones(), total + devices);
    }
    (busy, total)
}

/// Whether `job` waits for a placement alone (pending, no job it depends on still running).
fn ready(job: &Job) -> bool {
    job.state == JobState::Pending && job.waiting_for.is_empty()
}

/// Whether a gang needs at least one whole server of its type: such a gang starts only when
/// every GPU of a server is free at once, which backfilled smaller jobs rarely allow.
pub fn needs_whole_servers(view: &LocalView, spec: &JobSpec) -> bool {
    let largest = (view.topologies().iter())
        .filter(|t| spec.gpu_type.as_ref().is_none_or(|w| *w == t.device_type) && t.devices >= spec.gpus_per_member)
        .map(|t| t.devices)
        .max();
    largest.is_some_and(|d| spec.total_gpus() >= d)
}

/// The servers at `level` (one server for a one-member gang; a rack, an InfiniBand domain or
/// the cluster otherwise) that are expected to hold `spec` soonest if nothing else took their
/// GPUs, with that wait and the GPU time they idle meanwhile. `None` when no domain can ever
/// hold the gang, or nothing is known to time the releases by.
pub fn drain(
    view: &LocalView,
    spec: &JobSpec,
    level: LocalityLevel,
    stats: &ReleaseStats,
    now_s: f64,
) -> Option<Drain> {
    let per = spec.gpus_per_member.max(1);
    if spec.members > 1 && level.is_intra_server() {
        return None;
    }
    // (server, free, busy, healthy devices) of the Up servers of the job's type; an unhealthy
    // device a job holds is not freed when it ends, so it is not busy here.
    let mut by_domain: BTreeMap<u32, Vec<(ServerId, u32, u32, u64)>> = BTreeMap::new();
    let mut busy_total = 0;
    for (i, r) in view.servers().iter().enumerate() {
        if !locality_cost::can_hold_member(view, r, spec) {
            continue;
        }
        let s = ServerId(i as u32);
        let healthy = view.topology_of(r.config_set).all_devices() & !view.unhealthy_devices(s);
        let free = r.free_gpus.count_ones();
        let busy = (healthy & !r.free_gpus).count_ones();
        busy_total += busy;
        let key = if spec.members == 1 { i as u32 } else { locality_cost::domain_of(view, r, level) };
        by_domain.entry(key).or_default().push((s, free, busy, healthy));
    }
    let per_gpu_rate = stats.release_rate().filter(|_| busy_total > 0).map(|r| r / f64::from(busy_total));
    by_domain
        .into_values()
        .filter_map(|servers| plan_domain(servers, spec.members, per, per_gpu_rate, stats, now_s))
        .min_by(|a, b| a.wait_s.total_cmp(&b.wait_s).then(a.idle_gpu_s.total_cmp(&b.idle_gpu_s)))
}

/// One domain's drain: the servers with free member slots first, then those needing the fewest
/// GPUs released for one more, until the gang's members are covered.
fn plan_domain(
    mut servers: Vec<(ServerId, u32, u32, u64)>,
    members: u32,
    per: u32,
    per_gpu_rate: Option<f64>,
    stats: &ReleaseStats,
    now_s: f64,
) -> Option<Drain> {
    // Slots a server holds when drained, and the GPUs to release for them.
    servers.sort_by_key(|&(s, free, busy, _)| {
        let slots_now = free / per;
        (Reverse(slots_now), busy, s)
    });
    let mut covered = 0;
    let mut chosen = Vec::new();
    let (mut free_held, mut to_release, mut busy_held) = (0u32, 0u32, 0u32);
    let mut by_limits: Option<f64> = Some(0.0);
    for &(s, free, busy, healthy) in &servers {
        if covered >= members {
            break;
        }
        let slots = (free + busy) / per;
        if slots == 0 {
            continue;
        }
        let take = slots.min(members - covered);
        let need = (take * per).saturating_sub(free);
        covered += take;
        chosen.push(s);
        free_held += free;
        to_release += need;
        busy_held += busy;
        by_limits = match (by_limits, stats.freed_by_limits_s(s, healthy, need, now_s)) {
            (Some(w), Some(l)) => Some(w.max(l)),
            _ => None,
        };
    }
    if covered < members || to_release == 0 {
        return None;
    }
    // Release times of the `to_release` GPUs, each busy one at the per-GPU rate.
    let times: Option<Vec<f64>> = per_gpu_rate.and_then(|mu| locality_cost::release_times(to_release, busy_held, mu));
    let by_rate = times.as_ref().and_then(|t| t.last().copied());
    let wait_s = match (by_rate, by_limits) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    // Released GPUs idle from their release to the start; with only the limits' bound, half
    // the wait on average.
    let released_idle = match &times {
        Some(t) if by_rate == Some(wait_s) => t.iter().map(|ti| wait_s - ti).sum(),
        _ => f64::from(to_release) * wait_s / 2.0,
    };
    chosen.sort();
    Some(Drain { servers: chosen, wait_s, idle_gpu_s: f64::from(free_held) * wait_s + released_idle })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::{ClusterSpec, ClusterView, Decision, Proposal, ProposalId, Topology};

    /// Four seed-8gpu servers in one rack with 8, 2, 4 and 8 GPUs busy (one job each), a pending
    /// 16-GPU gang (2 × 8) submitted first and a pending 1-GPU job behind it.
    struct Fixture {
        view: ClusterView,
        gang: JobId,
        small: JobId,
    }

    fn fixture() -> Fixture {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo, 4, 4, 1));
        let gang = view.submit(JobSpec::simple("gang", 2, 8)).expect("admitted");
        for (n, (server, busy)) in [(0u32, 8u32), (1, 2), (2, 4), (3, 8)].into_iter().enumerate() {
            let id = view.submit(JobSpec::simple("filler", 1, busy)).expect("admitted");
            let spec = view.job(id).expect("job").spec.clone();
            let rec = view.servers()[server as usize];
            let topo = view.topology_of(rec.config_set);
            let req = tessera_view::fit::member_request(&spec, topo);
            let (m, _) =
                tessera_view::fit::plan_member(topo, &rec, ServerId(server), &req, LocalityLevel::Any, FitMode::Pack)
                    .expect("fits");
            let p = Proposal { id: ProposalId(n as u64 + 1), job: id, members: vec![m], based_on: view.version() };
            assert!(matches!(view.propose(&p), Decision::Accepted { .. }), "filler on {server}");
        }
        let small = view.submit(JobSpec::simple("small", 1, 1)).expect("admitted");
        Fixture { view, gang, small }
    }

    /// Releases observed: a one-GPU job every 100 s over the last 1,000 s, so 0.01 GPU/s over
    /// the 22 busy GPUs, and 0.01 jobs/s.
    fn stats() -> ReleaseStats {
        let mut s = ReleaseStats::new();
        for i in 0..=10 {
            s.record_release(f64::from(i) * 100.0, 1);
        }
        s
    }

    impl Fixture {
        fn local(&self) -> LocalView {
            LocalView::of_view(&self.view)
        }

        /// The pending jobs in submission order, the gang having waited `gang_waited_s`.
        fn queue(&self, gang_waited_s: f64) -> Vec<(&Job, f64)> {
            [self.gang, self.small].iter().map(|id| (self.view.job(*id).expect("job"), gang_waited_s)).collect()
        }
    }

    #[test]
    fn the_drain_picks_the_servers_with_fewest_busy_gpus_and_times_their_releases() {
        let f = fixture();
        let spec = f.view.job(f.gang).expect("gang").spec.clone();
        let d = drain(&f.local(), &spec, LocalityLevel::Any, &stats(), 1_000.0).expect("a drain");
        assert_eq!(d.servers, vec![ServerId(1), ServerId(2)], "2 and 4 busy: the fewest to release");
        // 6 releases among the 6 busy GPUs there, each at 0.01/22 per second.
        let mu = 0.01 / 22.0;
        let times: Vec<f64> = (0..6)
            .scan(0.0, |t, i| {
                *t += 1.0 / (f64::from(6 - i) * mu);
                Some(*t)
            })
            .collect();
        let w = times[5];
        assert!((d.wait_s - w).abs() < 1e-6, "{} vs {w}", d.wait_s);
        // The 10 GPUs free there now idle the whole wait; each released one the rest of it.
        let idle = 10.0 * w + times.iter().map(|t| w - t).sum::<f64>();
        assert!((d.idle_gpu_s - idle).abs() < 1e-6, "{} vs {idle}", d.idle_gpu_s);
        // A level that cannot hold two members over servers has no drain; nothing observed, none.
        assert_eq!(drain(&f.local(), &spec, LocalityLevel::Server, &stats(), 1_000.0), None);
        assert_eq!(drain(&f.local(), &spec, LocalityLevel::Any, &ReleaseStats::new(), 1_000.0), None);
    }

    #[test]
    fn a_server_with_an_unhealthy_device_held_is_not_drained_for_a_whole_member() {
        let mut f = fixture();
        let spec = f.view.job(f.gang).expect("gang").spec.clone();
        // One of the 2 GPUs busy on server 1 went bad: it will not be freed, so server 1 never
        // holds an 8-GPU member; the next fewest busy after server 2 are server 0's 8.
        let held = f.view.servers()[1].free_gpus ^ 0xff;
        f.view.set_unhealthy_devices(ServerId(1), held & held.wrapping_neg()).expect("set");
        let d = drain(&f.local(), &spec, LocalityLevel::Any, &stats(), 1_000.0).expect("a drain");
        assert_eq!(d.servers, vec![ServerId(0), ServerId(2)]);
    }

    /// The fixture's load amplification: 22 of 32 GPUs busy, so a backlog clears 32/10 times
    /// slower than it forms.
    const AMPLIFY: f64 = 3.2;

    /// What reserving for the fixture's gang is expected to cost (job-seconds): its idle GPU
    /// time in one-GPU jobs, at most the one job behind held the whole wait plus arrivals at
    /// the observed 0.01 jobs/s held half of it, amplified by the load.
    fn expected_cost(d: &Drain) -> f64 {
        d.idle_gpu_s.min(d.wait_s + 0.01 * d.wait_s * d.wait_s / 2.0) * AMPLIFY
    }

    #[test]
    fn a_gang_reserves_only_once_its_wait_pays_for_the_jobs_held_back_and_only_others_are_held() {
        let f = fixture();
        let local = f.local();
        let spec = f.view.job(f.gang).expect("gang").spec.clone();
        let d = drain(&local, &spec, LocalityLevel::Any, &stats(), 1_000.0).expect("a drain");
        // Reserving pays once waited − Ŵ ≥ the expected cost.
        let break_even = d.wait_s + expected_cost(&d);
        let mut r = Reservations::new();
        r.update(&local, f.queue(break_even - 1.0), &stats(), 1_000.0);
        assert_eq!(r.current(), None, "not yet: holding the small job back would cost more than the gang gains");
        r.update(&local, f.queue(break_even + 1.0), &stats(), 1_000.0);
        let held = r.current().expect("reserved").clone();
        assert_eq!((held.job, held.servers.clone()), (f.gang, vec![ServerId(1), ServerId(2)]));
        assert!((held.budget_s - (break_even + 1.0 - d.wait_s)).abs() < 1e-6);
        assert!((held.expected_start_s - (1_000.0 + d.wait_s)).abs() < 1e-6);
        // The small job sees the withheld servers taken; the gang sees them as they are.
        let small = f.view.job(f.small).expect("small");
        let hidden = r.withheld_from(&local, small, 1_000.0).expect("withheld from the small job");
        let shown: Vec<(ServerId, u64)> = hidden.iter().map(|h| (h.0, h.1.free_gpus)).collect();
        assert_eq!(shown, vec![(ServerId(1), 0), (ServerId(2), 0)]);
        let masked = r.overlay_for(&local, &Overlay::default(), small, 1_000.0).expect("masked");
        let found = find_placement(&local, &masked, &small.spec, LocalityLevel::Any, FitMode::Pack, 0);
        assert!(found.is_err(), "servers 0 and 3 are full, 1 and 2 withheld: {found:?}");
        assert!(r.withheld_from(&local, f.view.job(f.gang).expect("gang"), 1_000.0).is_none());
        // Moves planned for the small job may not land on them; the gang's may.
        assert!(r.withholds_any(small, 1_000.0, [ServerId(0), ServerId(2)].into_iter()));
        assert!(!r.withholds_any(small, 1_000.0, [ServerId(0), ServerId(3)].into_iter()));
        assert!(!r.withholds_any(f.view.job(f.gang).expect("gang"), 1_000.0, [ServerId(1)].into_iter()));
        // A job that outranks the gang, or whose time limit ends it before the gang is expected
        // to start, is not held back.
        let mut urgent = small.clone();
        urgent.spec.priority = 1;
        assert!(!r.withholds(&urgent, 1_000.0));
        let mut brief = small.clone();
        brief.spec.run.time_limit_s = Some((d.wait_s / 2.0) as u64);
        assert!(!r.withholds(&brief, 1_000.0));
        brief.spec.run.time_limit_s = Some((d.wait_s * 2.0) as u64);
        assert!(r.withholds(&brief, 1_000.0));
    }

    #[test]
    fn behind_a_long_queue_reserving_costs_what_the_idle_gpus_delay_every_waiting_job_by() {
        let mut f = fixture();
        let mut behind = vec![f.small];
        for _ in 1..200 {
            behind.push(f.view.submit(JobSpec::simple("small", 1, 1)).expect("admitted"));
        }
        let local = f.local();
        let spec = f.view.job(f.gang).expect("gang").spec.clone();
        let d = drain(&local, &spec, LocalityLevel::Any, &stats(), 1_000.0).expect("a drain");
        let n = behind.len() as f64;
        // The held-back account: the idle GPU time in one-GPU jobs (the 200 jobs could fill it),
        // amplified by the load. The backlog's share: each of the 200 finishes I/32 later, the
        // fixture having 32 GPUs. Here the second is the larger.
        let held = d.idle_gpu_s.min(n * d.wait_s + 0.01 * d.wait_s * d.wait_s / 2.0) * AMPLIFY;
        let backlog = n * d.idle_gpu_s / 32.0;
        assert!(backlog > held * 1.5, "backlog {backlog} vs held back {held}");
        let queue = |waited: f64| -> Vec<(&Job, f64)> {
            std::iter::once(f.gang)
                .chain(behind.iter().copied())
                .map(|id| (f.view.job(id).expect("job"), waited))
                .collect()
        };
        let mut r = Reservations::new();
        r.update(&local, queue(d.wait_s + held + 1.0), &stats(), 1_000.0);
        assert_eq!(r.current(), None, "enough for the jobs held back, not for the backlog's delay");
        r.update(&local, queue(d.wait_s + backlog + 1.0), &stats(), 1_000.0);
        assert_eq!(r.current().expect("reserved").job, f.gang);
    }

    #[test]
    fn a_reservation_holds_others_back_no_longer_than_its_budget_and_ends_with_its_gangs_wait() {
        let f = fixture();
        let local = f.local();
        let spec = f.view.job(f.gang).expect("gang").spec.clone();
        let d = drain(&local, &spec, LocalityLevel::Any, &stats(), 0.0).expect("a drain");
        let waited = d.wait_s + expected_cost(&d) + 100.0;
        let mut r = Reservations::new();
        r.update(&local, f.queue(waited), &stats(), 0.0);
        let budget = r.current().expect("reserved").budget_s;
        // 10 GPUs free on the withheld servers hold back the one waiting one-GPU job: one job
        // held, costing 3.2 job-seconds a second on this load, so the budget lasts `budget / 3.2`
        // seconds, and the reservation is not applied past it even between updates.
        let lasts = budget / AMPLIFY;
        assert!((r.current().expect("held").held_back_by(lasts / 2.0) - budget / 2.0).abs() < 1e-6);
        let small = f.view.job(f.small).expect("small");
        assert!(r.withholds(small, lasts * 0.99) && !r.withholds(small, lasts * 1.01));
        r.update(&local, f.queue(waited), &stats(), lasts * 1.01);
        assert!(r.current().is_none(), "given up once over budget");
        let s = r.stats();
        assert_eq!((s.made, s.abandoned), (1, 1));
        assert!((s.held_back_s - budget * 1.01).abs() < 1e-3, "{} vs {budget}", s.held_back_s);
        assert!((s.idled_gpu_s - lasts * 1.01).abs() < 1e-3, "one GPU the small job could use: {}", s.idled_gpu_s);
        // What it cost is spent: the gang's next reservation has only the rest of its gain.
        r.update(&local, f.queue(waited + 2.0 * budget), &stats(), lasts * 1.01);
        let again = r.current().expect("reserved again, later");
        assert!((again.budget_s - (waited + 2.0 * budget - d.wait_s - s.held_back_s)).abs() < 1e-3);
        // Alone in the queue, it holds nobody back: nothing is counted.
        let alone = vec![(f.view.job(f.gang).expect("gang"), waited + 2.0 * budget)];
        r.update(&local, alone.clone(), &stats(), lasts * 1.01);
        r.update(&local, alone, &stats(), 20.0 * lasts);
        assert_eq!(r.current().map(|c| c.held_back_s), Some(0.0), "nobody else waited");
        // The gang no longer waits (placed): the reservation ends, not counted as given up.
        r.update(&local, vec![(small, 0.0)], &stats(), 20.0 * lasts);
        assert!(r.current().is_none());
        assert_eq!((r.stats().made, r.stats().abandoned), (2, 1));
    }

    #[test]
    fn jobs_smaller_than_a_server_or_that_fit_now_reserve_nothing() {
        let f = fixture();
        let local = f.local();
        assert!(needs_whole_servers(&local, &f.view.job(f.gang).expect("gang").spec));
        assert!(!needs_whole_servers(&local, &JobSpec::simple("four", 1, 4)));
        assert!(needs_whole_servers(&local, &JobSpec::simple("eight", 1, 8)));
        // Only the small job waits: nothing to reserve for, however long it waited.
        let mut r = Reservations::new();
        r.update(&local, vec![(f.view.job(f.small).expect("small"), 1e9)], &stats(), 0.0);
        assert_eq!(r.current(), None);
        // An 8-GPU job on an empty cluster fits now: nothing to hold.
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut empty = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
        let id = empty.submit(JobSpec::simple("eight", 1, 8)).expect("admitted");
        let e = LocalView::of_view(&empty);
        r.update(&e, vec![(empty.job(id).expect("job"), 1e9)], &stats(), 0.0);
        assert_eq!(r.current(), None);
    }
}
