//! Locality as a cost: when a job that declares its `slowdown` per level cannot be placed at
//! the level it accepts without a decision (its *floor*, [`JobSpec::allowed_level`]), start it
//! now at a looser level, or wait for the tighter one?
//!
//! The answer compares expected completion times. Starting now at the looser level `l` costs
//! the extra run time `G = D·(1/(1−s_l) − 1/(1−s_f))` (`D` the job's run time at full speed,
//! `s` the declared slowdowns at `l` and at the floor `f`); waiting costs the expected wait `W`
//! for a slot at `f`. The job waits only while `W` is below the gain still to be had, and never
//! longer in all than `G` itself: a ski-rental bound, so a wrong estimate costs at most twice
//! the better choice. With no slowdown declared, or all 0 (the simulator's `ideal` model), `G`
//! is 0 and a job starts at once wherever it fits, as a locality-blind scheduler would.
//!
//! The estimates come from what a host observes ([`ReleaseStats`]), never from the job's own
//! future: `D` is the mean run time of recently ended jobs, and `W` assumes each busy GPU of
//! the job's type is released at the cluster's observed per-GPU release rate, and asks how long
//! until enough of the busy GPUs in the best group of the floor's level are freed (the expected
//! `k`-th release among `b` busy GPUs, `Σ 1/((b−i)·μ)`), times one plus the jobs ahead in
//! the host's queue that wait for the same kind of slot ([`crate::Context::ahead`]): they take
//! the first slots. Where running jobs declare a time limit (`run.time_limit_s`), their ends are
//! known at the latest: the approver fails a job whose limit passes, so its GPUs are free by
//! then. `W` is then also bounded by when the limits alone free enough GPUs of the group
//! (timed from when the host saw each job start, which is no earlier than its placement), and
//! a host that has observed no release yet still has that bound. Other jobs that would take
//! the released GPUs are not counted, so it errs on the side of waiting; the ski-rental bound
//! caps that error.
//! The job spec's `relax_after_s` stays the user's explicit bound: the floor loosens with it
//! whatever the estimates say.
//!
//! The same function ([`decide`]) runs in the live runtime ([`crate::PlaceMachine`]) and in the
//! simulator, so what `tessera sim` measures is the rule a host applies.

use crate::local_view::{LocalView, Overlay};
use crate::scheduler::{Attempt, Scheduler, Verdict};
use crate::search::find_placement;
use std::collections::{BTreeMap, VecDeque};
use tessera_view::fit::FitMode;
use tessera_view::{Health, Job, JobId, JobSpec, JobState, LocalityLevel, ProposalId, ServerId, ServerRecord};

/// Release events and run times kept for the estimates (a sliding window: the rates of the
/// recent past, in bounded memory).
pub const WINDOW: usize = 256;

/// What a host has observed of jobs ending: GPU releases over time and run lengths. Kept by
/// the live host's copy of the view ([`crate::cache::CacheState`]) and by the simulator, on
/// their own clocks (seconds from any origin: only differences are used).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReleaseStats {
    /// (time, GPUs released), oldest first, at most [`WINDOW`].
    releases: VecDeque<(f64, u32)>,
    /// Run lengths of jobs that ended, oldest first, at most [`WINDOW`].
    runs: VecDeque<f64>,
    /// When each job holding GPUs was seen to start ([`ReleaseStats::observe`]).
    started: BTreeMap<JobId, f64>,
    /// Jobs holding GPUs under a time limit: the placement the limit runs for (a move places a
    /// job again and restarts it) and the servers it holds.
    limited: BTreeMap<JobId, (ProposalId, Vec<ServerId>)>,
    /// Their GPUs per server: when the limit frees them at the latest, the devices, the job.
    limited_on: BTreeMap<ServerId, Vec<(f64, u64, JobId)>>,
}

impl ReleaseStats {
    /// Nothing observed.
    pub const fn new() -> ReleaseStats {
        ReleaseStats {
            releases: VecDeque::new(),
            runs: VecDeque::new(),
            started: BTreeMap::new(),
            limited: BTreeMap::new(),
            limited_on: BTreeMap::new(),
        }
    }

    /// `gpus` GPUs were released at `now_s` (a job ended or was preempted).
    pub fn record_release(&mut self, now_s: f64, gpus: u32) {
        if self.releases.len() == WINDOW {
            self.releases.pop_front();
        }
        self.releases.push_back((now_s, gpus));
    }

    /// A job ended after running `run_s` seconds.
    pub fn record_run(&mut self, run_s: f64) {
        if !run_s.is_finite() || run_s < 0.0 {
            return;
        }
        if self.runs.len() == WINDOW {
            self.runs.pop_front();
        }
        self.runs.push_back(run_s);
    }

    /// Follows `job` as a host's copy of the view sees it change at `now_s`: a job that starts
    /// holding GPUs is timed, and one that stops (ended, failed or preempted) is a release; one
    /// that ended is a run. Moves keep a job holding GPUs and count as neither. A placement
    /// under a time limit is kept with the latest time it frees its GPUs.
    pub fn observe(&mut self, job: &Job, now_s: f64) {
        let holds = job.state.holds_resources();
        self.follow_limit(job, holds, now_s);
        match (self.started.get(&job.id).copied(), holds) {
            (None, true) => {
                self.started.insert(job.id, now_s);
            }
            (Some(since), false) => {
                self.started.remove(&job.id);
                self.record_release(now_s, job.spec.total_gpus());
                if matches!(job.state, JobState::Finished | JobState::Failed) {
                    self.record_run(now_s - since);
                }
            }
            _ => {}
        }
    }

    /// Brings the jobs timed as running in line with `jobs`, a whole copy of the view read at
    /// `now_s` after a gap in the change stream: each job seen now is observed, and a timed job
    /// that no longer holds GPUs there was released within the gap (counted now).
    pub fn resync(&mut self, jobs: &[Job], now_s: f64) {
        let holding: BTreeMap<JobId, &Job> =
            jobs.iter().filter(|j| j.state.holds_resources()).map(|j| (j.id, j)).collect();
        let gone: Vec<JobId> = self.started.keys().filter(|id| !holding.contains_key(id)).copied().collect();
        for id in gone {
            self.started.remove(&id);
            if let Some(j) = jobs.iter().find(|j| j.id == id) {
                self.record_release(now_s, j.spec.total_gpus());
            }
        }
        for j in holding.values() {
            self.observe(j, now_s);
        }
    }

    /// Keeps `job`'s placement among the limited ones while it holds one under a time limit.
    fn follow_limit(&mut self, job: &Job, holds: bool, now_s: f64) {
        let placement = job.placement.as_ref().filter(|_| holds);
        let limit_s = job.spec.run.time_limit_s.filter(|_| placement.is_some());
        if let (Some((proposal, _)), Some(p)) = (self.limited.get(&job.id), placement)
            && *proposal == p.proposal
        {
            return;
        }
        if let Some((_, servers)) = self.limited.remove(&job.id) {
            for s in servers {
                if let Some(on) = self.limited_on.get_mut(&s) {
                    on.retain(|h| h.2 != job.id);
                    if on.is_empty() {
                        self.limited_on.remove(&s);
                    }
                }
            }
        }
        let (Some(p), Some(limit_s)) = (placement, limit_s) else { return };
        let ends_s = now_s + limit_s as f64;
        let servers: Vec<ServerId> = p.members.iter().map(|m| m.server).collect();
        for m in &p.members {
            self.limited_on.entry(m.server).or_default().push((ends_s, m.gpus, job.id));
        }
        self.limited.insert(job.id, (p.proposal, servers));
    }

    /// Seconds from `now_s` until the time limits of the jobs on server `s` have freed at least
    /// `k` of its GPUs in `mask`, at the latest; `None` when those limits hold fewer.
    pub fn freed_by_limits_s(&self, s: ServerId, mask: u64, k: u32, now_s: f64) -> Option<f64> {
        if k == 0 {
            return Some(0.0);
        }
        let mut holds: Vec<(f64, u32)> = (self.limited_on.get(&s)?.iter())
            .map(|&(ends_s, gpus, _)| (ends_s, (gpus & mask).count_ones()))
            .filter(|h| h.1 > 0)
            .collect();
        holds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut freed = 0;
        holds.into_iter().find_map(|(ends_s, n)| {
            freed += n;
            (freed >= k).then(|| (ends_s - now_s).max(0.0))
        })
    }

    /// GPUs released per second over the window, if at least two releases span some time.
    pub fn release_rate(&self) -> Option<f64> {
        let (&(first, _), &(last, _)) = (self.releases.front()?, self.releases.back()?);
        let span = last - first;
        // The first release opens the window; the GPUs after it were released within `span`.
        let gpus: u64 = self.releases.iter().skip(1).map(|&(_, g)| u64::from(g)).sum();
        (span > 0.0 && gpus > 0).then(|| gpus as f64 / span)
    }

    /// Jobs released per second over the window (their rate of ending, which in a steady
    /// state is their rate of arriving), if at least two releases span some time.
    pub fn job_release_rate(&self) -> Option<f64> {
        let (&(first, _), &(last, _)) = (self.releases.front()?, self.releases.back()?);
        let span = last - first;
        (span > 0.0).then(|| (self.releases.len() - 1) as f64 / span)
    }

    /// The mean GPUs of the jobs released within the window, if any were.
    pub fn mean_release_gpus(&self) -> Option<f64> {
        let n = self.releases.len();
        (n > 0).then(|| self.releases.iter().map(|&(_, g)| f64::from(g)).sum::<f64>() / n as f64)
    }

    /// The mean run time of the jobs that ended within the window, if any did.
    pub fn mean_run_s(&self) -> Option<f64> {
        (!self.runs.is_empty()).then(|| self.runs.iter().sum::<f64>() / self.runs.len() as f64)
    }
}

/// The throughput `spec` declares it loses at `level`: its own figure there, else that of the
/// nearest tighter level it declares (a looser level never loses less), else 0.
pub fn slowdown_at(spec: &JobSpec, level: LocalityLevel) -> f64 {
    spec.slowdown.range(..=level).next_back().map_or(0.0, |(_, &s)| s.clamp(0.0, 0.99))
}

/// Seconds more a job of run time `run_s` runs at `looser` than at `tighter`.
pub fn extra_run_s(spec: &JobSpec, run_s: f64, tighter: LocalityLevel, looser: LocalityLevel) -> f64 {
    let time_at = |l| run_s / (1.0 - slowdown_at(spec, l));
    (time_at(looser) - time_at(tighter)).max(0.0)
}

/// The expected seconds from `now_s` (the clock of `stats`) until `spec` fits at `level` by
/// GPU count: the best group of that level (a PCIe switch, socket or server; a rack, an
/// InfiniBand domain or the cluster for gangs over servers), each busy GPU released at the
/// cluster's observed per-GPU rate, and no later than running jobs' time limits free enough
/// of them. `None` when nothing was observed, no limit frees enough, or nothing is busy.
pub fn expected_wait_s(
    view: &LocalView,
    overlay: &Overlay,
    spec: &JobSpec,
    level: LocalityLevel,
    stats: &ReleaseStats,
    now_s: f64,
) -> Option<f64> {
    let rate = stats.release_rate();
    if rate.is_none() && stats.limited.is_empty() {
        return None;
    }
    let typed = |r: &ServerRecord| can_hold_member(view, r, spec);
    let records: Vec<(usize, ServerRecord)> = view
        .servers()
        .iter()
        .enumerate()
        .map(|(i, r)| (i, overlay.get(tessera_view::ServerId(i as u32)).copied().unwrap_or(*r)))
        .filter(|(_, r)| typed(r))
        .collect();
    // An unhealthy device held by a job is not freed when the job ends: it is neither busy nor
    // free here. (The observed rate still counts every GPU a job released, unhealthy ones
    // included, which the stats cannot tell apart: slightly optimistic where a device is bad.)
    let bad = |s: usize| view.unhealthy_devices(ServerId(s as u32));
    let busy_of = |s: usize, r: &ServerRecord| {
        (view.topology_of(r.config_set).all_devices() & !r.free_gpus & !bad(s)).count_ones()
    };
    let busy_total: u32 = records.iter().map(|(s, r)| busy_of(*s, r)).sum();
    if busy_total == 0 {
        return None;
    }
    // Each busy GPU is released at this rate (per second), independently.
    let per_gpu = rate.map(|r| r / f64::from(busy_total));
    let kth_release =
        |k: u32, b: u32| -> Option<f64> { release_times(k, b, per_gpu?).map(|t| t.last().copied().unwrap_or(0.0)) };
    // The time limits bound the wait from above; the rate's expectation may be sooner.
    let sooner = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let by_limits = |s: usize, mask: u64, k: u32| stats.freed_by_limits_s(ServerId(s as u32), mask & !bad(s), k, now_s);
    let need = spec.total_gpus();
    if level.is_intra_server() {
        records
            .iter()
            .flat_map(|&(s, r)| {
                let t = view.topology_of(r.config_set);
                let healthy = !bad(s);
                t.groups(level)
                    .into_iter()
                    .map(move |g| g & healthy)
                    .filter(|g| g.count_ones() >= need)
                    .filter_map(move |g| {
                        let free = (r.free_gpus & g).count_ones();
                        // Something must be released even where the GPUs alone would fit (the
                        // floor was refused for cores or memory).
                        let k = need.saturating_sub(free).max(1);
                        sooner(kth_release(k, g.count_ones() - free), by_limits(s, g & !r.free_gpus, k))
                    })
                    .collect::<Vec<_>>()
            })
            .min_by(f64::total_cmp)
    } else {
        // Per domain of the level: the members that fit now, and for the rest the servers that
        // need the fewest GPUs released to hold one more member.
        let per = spec.gpus_per_member;
        // (slots, deficit, busy, server)
        let mut domains: BTreeMap<u32, Vec<(u32, u32, u32, usize)>> = BTreeMap::new();
        for &(s, r) in &records {
            let key = domain_of(view, &r, level);
            let free = r.free_gpus.count_ones();
            domains.entry(key).or_default().push((free / per, per - free % per, busy_of(s, &r), s));
        }
        domains
            .values_mut()
            .filter_map(|servers| {
                let slots: u32 = servers.iter().map(|s| s.0).sum();
                let missing = spec.members.saturating_sub(slots) as usize;
                if missing == 0 {
                    // Enough GPUs (refused for cores or memory): one release anywhere in it.
                    let limits = servers.iter().filter_map(|s| by_limits(s.3, u64::MAX, 1)).min_by(f64::total_cmp);
                    return sooner(kth_release(1, servers.iter().map(|s| s.2).sum()), limits);
                }
                servers.sort_by_key(|s| s.1);
                let chosen = servers.iter().filter(|s| s.2 >= s.1).take(missing).collect::<Vec<_>>();
                (chosen.len() == missing).then_some(())?;
                let k = chosen.iter().map(|s| s.1).sum();
                // By the limits, every chosen server must have freed its deficit.
                let limits =
                    chosen.iter().map(|s| by_limits(s.3, u64::MAX, s.1)).try_fold(0.0, |w: f64, l| l.map(|l| w.max(l)));
                sooner(kth_release(k, chosen.iter().map(|s| s.2).sum()), limits)
            })
            .min_by(f64::total_cmp)
    }
}

/// Whether `r` could hold a member of `spec`: up, of the job's GPU type, with at least a
/// member's GPUs. The servers a wait or a drain is estimated over.
pub(crate) fn can_hold_member(view: &LocalView, r: &ServerRecord, spec: &JobSpec) -> bool {
    let t = view.topology_of(r.config_set);
    r.health == Health::Up
        && spec.gpu_type.as_ref().is_none_or(|w| *w == t.device_type)
        && t.devices >= spec.gpus_per_member
}

/// The domain of multi-server `level` that `r` is in ([`tessera_view::ConfigSet::domain`]).
pub(crate) fn domain_of(view: &LocalView, r: &ServerRecord, level: LocalityLevel) -> u32 {
    view.config_sets()[r.config_set.index()].domain(level)
}

/// The expected times, seconds from now, at which the first, second, … `k`-th of `busy` busy
/// GPUs are released, each independently at `per_gpu` per second (the order statistics of
/// exponentials: the `i`-th release comes `1 / ((busy − i) · per_gpu)` after the one before);
/// none where fewer than `k` are busy.
pub(crate) fn release_times(k: u32, busy: u32, per_gpu: f64) -> Option<Vec<f64>> {
    (k <= busy).then(|| {
        (0..k)
            .scan(0.0, |t, i| {
                *t += 1.0 / (f64::from(busy - i) * per_gpu);
                Some(*t)
            })
            .collect()
    })
}

/// The kind of slot a pending job waits for: its gang shape, GPU type and preferred level. Jobs
/// of one kind compete for the same slots, so the ones ahead take the first that open
/// ([`crate::Context::ahead`]; counted by the live host's copy of the view and the simulator).
pub fn slot_kind(spec: &JobSpec) -> (u32, u32, LocalityLevel, Option<&str>) {
    (spec.members, spec.gpus_per_member, spec.prefer, spec.gpu_type.as_deref())
}

/// What [`relax`] decided for a job its scheduler could not place at its floor.
#[derive(Clone, Debug, PartialEq)]
pub enum Relaxed {
    /// Nothing to decide: no slowdown declared, the floor is already the job's tolerance, or
    /// the job fits at no looser level either.
    Unchanged,
    /// Starting now at this looser level is expected to finish sooner than waiting.
    Start(LocalityLevel),
    /// Waiting for the floor is expected to pay; decide again by `until_waited_s` (the
    /// ski-rental bound) at the latest.
    Wait {
        /// Waited seconds at which starting looser is taken whatever the estimates say.
        until_waited_s: u64,
        /// Why, for logs and the queue's "why is my job waiting".
        why: String,
    },
}

/// The tightest level looser than `allowed` at which `spec` fits now, for a job whose host
/// weighs locality by cost (it declares its `slowdown`); `None` for any other job, or when
/// nothing looser fits either.
fn looser_fit(
    view: &LocalView,
    overlay: &Overlay,
    spec: &JobSpec,
    allowed: LocalityLevel,
    salt: u64,
) -> Option<LocalityLevel> {
    if spec.slowdown.is_empty() || allowed >= spec.tolerate {
        return None;
    }
    let found = find_placement(view, overlay, spec, spec.tolerate, FitMode::Pack, salt).ok()?;
    (found.level > allowed).then_some(found.level)
}

/// Whether a pending job allowed `allowed` now can start at once at a looser level it
/// tolerates, its host weighing the wait by cost ([`relax`]). No moves are planned for such a
/// job (live: [`crate::migration_task`]; the simulator alike): it is not blocked, it waits by
/// choice, and every move costs the moved job a checkpoint and restart.
pub fn can_start_looser(view: &LocalView, spec: &JobSpec, allowed: LocalityLevel) -> bool {
    looser_fit(view, &Overlay::default(), spec, allowed, 0).is_some()
}

/// Decides whether `a.job`, refused at its floor `a.allowed`, should start now at a looser
/// level it tolerates ([`Relaxed::Start`]) or wait ([`Relaxed::Wait`]), from what its host
/// observed ([`crate::Context::releases`]).
pub fn relax(a: &Attempt<'_>) -> Relaxed {
    let (spec, stats) = (&a.job.spec, a.ctx.releases);
    let Some(looser) = looser_fit(a.view, a.overlay, spec, a.allowed, a.salt) else {
        return Relaxed::Unchanged;
    };
    let Some(run_s) = stats.mean_run_s() else {
        // Nothing has ended yet: no run time to weigh a wait against.
        return Relaxed::Start(looser);
    };
    let gain = extra_run_s(spec, run_s, a.allowed, looser);
    let waited = a.waited_s as f64;
    if waited >= gain {
        return Relaxed::Start(looser);
    }
    let until_waited_s = gain.ceil() as u64;
    // The jobs ahead that wait for the same kind of slot take the first ones that open.
    let wait =
        expected_wait_s(a.view, a.overlay, spec, a.allowed, stats, a.ctx.now_s).map(|w| w * f64::from(a.ctx.ahead + 1));
    match wait {
        Some(w) if w >= gain - waited => Relaxed::Start(looser),
        w => Relaxed::Wait {
            until_waited_s,
            why: format!(
                "waiting for {} (expected wait {}; {looser} would run {:.0} s longer), at most until {until_waited_s} s",
                a.allowed,
                w.map_or("unknown".to_string(), |w| format!("{w:.0} s")),
                gain
            ),
        },
    }
}

/// A scheduler's verdict on an attempt with locality weighed as a cost: the scheduler is asked
/// at the job's floor; if it waits and [`relax`] says starting looser pays, it is asked again at
/// that level. Returns the verdict, the level it was asked at last, and when (in waited
/// seconds) the job's wait should be decided again.
///
/// Servers the host withholds for a starved gang ([`crate::Context::reservations`]) look taken
/// to every job they are withheld from, in each of these asks.
pub fn decide(scheduler: &dyn Scheduler, a: &Attempt<'_>) -> Decided {
    let masked = a.ctx.reservations.overlay_for(a.view, a.overlay, a.job, a.ctx.now_s);
    let a = &Attempt { overlay: masked.as_ref().unwrap_or(a.overlay), ..*a };
    let verdict = scheduler.schedule(a);
    if !matches!(verdict, Verdict::Wait(_)) {
        return Decided { verdict, allowed: a.allowed, recheck_waited_s: None, by_cost: false };
    }
    match relax(a) {
        Relaxed::Unchanged => Decided { verdict, allowed: a.allowed, recheck_waited_s: None, by_cost: false },
        Relaxed::Start(level) => {
            let looser = Attempt { allowed: level, ..*a };
            Decided { verdict: scheduler.schedule(&looser), allowed: level, recheck_waited_s: None, by_cost: false }
        }
        Relaxed::Wait { until_waited_s, why } => Decided {
            verdict: Verdict::Wait(why),
            allowed: a.allowed,
            recheck_waited_s: Some(until_waited_s),
            by_cost: true,
        },
    }
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, PartialEq)]
pub struct Decided {
    /// The scheduler's verdict (a cost-based wait replaces its reason with the cost's).
    pub verdict: Verdict,
    /// The level the verdict was made at.
    pub allowed: LocalityLevel,
    /// When to decide again at the latest, in seconds waited (a cost-based wait's bound).
    pub recheck_waited_s: Option<u64>,
    /// Whether the job waits by choice (a looser placement exists now): another job of the
    /// same shape that has waited longer may decide otherwise.
    pub by_cost: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{Context, LocalityTolerant, RunningIndex};
    use tessera_view::{ClusterSpec, ClusterView, Command, Decision, Proposal, ProposalId, ServerId, Topology};

    /// Two seed-8gpu servers in one rack, each running a 6-GPU job (2 GPUs free on each), and a
    /// pending 2 × 2-GPU job that prefers one server and loses 30% across servers.
    struct Fixture {
        view: ClusterView,
        job: JobId,
        fillers: Vec<JobId>,
    }

    fn fixture() -> Fixture {
        fixture_limited(None)
    }

    /// The same, the running jobs under a time limit of `limit_s`.
    fn fixture_limited(limit_s: Option<u64>) -> Fixture {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
        let mut fillers = Vec::new();
        for n in 0..2u64 {
            let mut filler = JobSpec::simple("filler", 1, 6);
            filler.run.time_limit_s = limit_s;
            let id = view.submit(filler).expect("admitted");
            let spec = view.job(id).expect("job").spec.clone();
            let local = LocalView::of_view(&view);
            let f = find_placement(&local, &Overlay::default(), &spec, LocalityLevel::Server, FitMode::Pack, n)
                .expect("a free server");
            let p = Proposal { id: ProposalId(100 + n), job: id, members: f.members, based_on: view.version() };
            assert!(matches!(view.propose(&p), Decision::Accepted { .. }));
            fillers.push(id);
        }
        let mut spec = JobSpec::simple("wants-one-server", 2, 2);
        (spec.prefer, spec.tolerate) = (LocalityLevel::Server, LocalityLevel::Any);
        spec.slowdown = BTreeMap::from([(LocalityLevel::Rack, 0.3)]);
        let job = view.submit(spec).expect("admitted");
        Fixture { view, job, fillers }
    }

    impl Fixture {
        /// What the cost rule decides after `waited_s`, given `stats`.
        fn relax(&self, waited_s: u64, stats: &ReleaseStats) -> Relaxed {
            self.relax_behind(waited_s, stats, 0)
        }

        /// The same, with `ahead` jobs waiting for the same kind of slot before it.
        fn relax_behind(&self, waited_s: u64, stats: &ReleaseStats, ahead: u32) -> Relaxed {
            self.with_attempt(waited_s, stats, ahead, relax)
        }

        /// What [`decide`] answers for the default scheduler after `waited_s`, given `stats`.
        fn decide(&self, waited_s: u64, stats: &ReleaseStats) -> Decided {
            self.with_attempt(waited_s, stats, 0, |a| decide(&LocalityTolerant::default(), a))
        }

        /// Runs `f` on the job's attempt after `waited_s`, as a host that observed `stats` and
        /// knows of `ahead` jobs before it makes it.
        fn with_attempt<R>(
            &self,
            waited_s: u64,
            stats: &ReleaseStats,
            ahead: u32,
            f: impl FnOnce(&Attempt<'_>) -> R,
        ) -> R {
            let job = self.view.job(self.job).expect("job");
            let local = LocalView::of_view(&self.view);
            let running = RunningIndex::from_jobs(self.view.jobs());
            let reservations = crate::reservation::Reservations::new();
            f(&Attempt {
                job,
                view: &local,
                overlay: &Overlay::default(),
                allowed: job.spec.allowed_level(waited_s),
                waited_s,
                attempt: 0,
                salt: 7,
                ctx: Context { running: &running, releases: stats, reservations: &reservations, ahead, now_s: 0.0 },
            })
        }
    }

    /// Stats of `runs` runs of `run_s` and a GPU released every `every_s` seconds, 100 times.
    fn stats(run_s: f64, every_s: f64) -> ReleaseStats {
        let mut s = ReleaseStats::new();
        for i in 0..100 {
            s.record_release(f64::from(i) * every_s, 1);
            s.record_run(run_s);
        }
        s
    }

    #[test]
    fn the_stats_follow_jobs_through_the_view_and_stay_bounded() {
        let mut f = fixture();
        let mut s = ReleaseStats::new();
        for j in f.view.jobs() {
            s.observe(j, 10.0);
        }
        assert_eq!((s.release_rate(), s.mean_run_s()), (None, None), "nothing ended yet");
        f.view.apply(&Command::Release { job: f.fillers[0], failed: false });
        s.observe(f.view.job(f.fillers[0]).expect("kept a while"), 110.0);
        assert_eq!(s.mean_run_s(), Some(100.0));
        assert_eq!(s.release_rate(), None, "one release spans no time");
        f.view.apply(&Command::Release { job: f.fillers[1], failed: false });
        s.observe(f.view.job(f.fillers[1]).expect("kept a while"), 130.0);
        assert_eq!(s.release_rate(), Some(6.0 / 20.0), "6 GPUs released within 20 s after the first");
        assert_eq!(s.mean_run_s(), Some(110.0));
        // Seeing an ended job again changes nothing.
        s.observe(f.view.job(f.fillers[1]).expect("kept a while"), 500.0);
        assert_eq!(s.mean_run_s(), Some(110.0));
        let mut big = ReleaseStats::new();
        for i in 0..(3 * WINDOW) {
            big.record_release(i as f64, 1);
            big.record_run(i as f64);
        }
        assert_eq!((big.releases.len(), big.runs.len()), (WINDOW, WINDOW));
        assert_eq!(big.release_rate(), Some(1.0));
    }

    #[test]
    fn declared_slowdowns_cover_the_levels_between_and_beyond_them() {
        let mut spec = JobSpec::simple("j", 2, 2);
        spec.slowdown = BTreeMap::from([(LocalityLevel::Socket, 0.1), (LocalityLevel::Rack, 0.5)]);
        assert_eq!(slowdown_at(&spec, LocalityLevel::PcieSwitch), 0.0);
        assert_eq!(slowdown_at(&spec, LocalityLevel::Server), 0.1);
        assert_eq!(slowdown_at(&spec, LocalityLevel::Any), 0.5);
        assert_eq!(extra_run_s(&spec, 100.0, LocalityLevel::Socket, LocalityLevel::Rack), 200.0 - 100.0 / 0.9);
        assert_eq!(extra_run_s(&spec, 100.0, LocalityLevel::Rack, LocalityLevel::Socket), 0.0);
    }

    #[test]
    fn the_expected_wait_is_that_of_the_best_group_at_the_observed_rate() {
        let f = fixture();
        let spec = &f.view.job(f.job).expect("job").spec;
        let local = LocalView::of_view(&f.view);
        // 99 GPUs released in 99 s: 1 GPU/s over 12 busy GPUs. A server has 6 busy and needs 2
        // more free: the 2nd of 6 releases, (1/6 + 1/5) × 12 s.
        let w = expected_wait_s(&local, &Overlay::default(), spec, LocalityLevel::Server, &stats(1.0, 1.0), 0.0);
        assert!((w.expect("estimated") - 12.0 * (1.0 / 6.0 + 1.0 / 5.0)).abs() < 1e-9, "{w:?}");
        // Across servers it fits now, but something must still be released to count.
        let rack = expected_wait_s(&local, &Overlay::default(), spec, LocalityLevel::Rack, &stats(1.0, 1.0), 0.0);
        assert!(rack.expect("estimated") < w.expect("estimated"));
        assert_eq!(
            expected_wait_s(&local, &Overlay::default(), spec, LocalityLevel::Server, &ReleaseStats::new(), 0.0),
            None
        );
    }

    #[test]
    fn unhealthy_devices_a_job_holds_are_not_expected_to_be_released() {
        let mut f = fixture();
        let spec = f.view.job(f.job).expect("job").spec.clone();
        let held = |v: &ClusterView, j: JobId| {
            let m = v.job(j).and_then(|j| j.placement.as_ref()).expect("placed").members[0];
            (m.server, m.gpus)
        };
        // Every GPU the first filler holds went bad: only the other server's 6 are busy, 1 GPU/s
        // over 6, and its 2nd of 6 releases comes (1/6 + 1/5) × 6 s from now.
        let (s0, gpus0) = held(&f.view, f.fillers[0]);
        f.view.set_unhealthy_devices(s0, gpus0).expect("set");
        let at = |v: &ClusterView| {
            expected_wait_s(
                &LocalView::of_view(v),
                &Overlay::default(),
                &spec,
                LocalityLevel::Server,
                &stats(1.0, 1.0),
                0.0,
            )
        };
        let w = at(&f.view).expect("estimated");
        assert!((w - 6.0 * (1.0 / 6.0 + 1.0 / 5.0)).abs() < 1e-9, "{w}");
        // And 5 of the other's 6: no server will have 4 healthy GPUs free.
        let (s1, gpus1) = held(&f.view, f.fillers[1]);
        f.view.set_unhealthy_devices(s1, gpus1 & (gpus1 - 1)).expect("set");
        assert_eq!(at(&f.view), None);
    }

    #[test]
    fn running_jobs_time_limits_bound_the_expected_wait_and_are_forgotten_with_their_placement() {
        let mut f = fixture_limited(Some(600));
        let spec = f.view.job(f.job).expect("job").spec.clone();
        let local = LocalView::of_view(&f.view);
        let at = |s: &ReleaseStats, level, now_s| expected_wait_s(&local, &Overlay::default(), &spec, level, s, now_s);
        let observed = |mut s: ReleaseStats| {
            f.view.jobs().into_iter().for_each(|j| s.observe(j, 10.0));
            s
        };
        // Nothing released yet, but each filler frees its 6 GPUs by 610 s at the latest.
        let limits = observed(ReleaseStats::new());
        assert_eq!(at(&limits, LocalityLevel::Server, 110.0), Some(500.0));
        assert_eq!(at(&limits, LocalityLevel::Rack, 110.0), Some(500.0), "one release in the rack");
        assert_eq!(at(&limits, LocalityLevel::Server, 900.0), Some(0.0), "overdue: any moment now");
        assert_eq!(at(&ReleaseStats::new(), LocalityLevel::Server, 110.0), None, "no limit known, no rate");
        // A rate that expects the slot sooner stands (4.4 s); one that expects it later than
        // the limits allow is capped by them.
        let fast = at(&observed(stats(1.0, 1.0)), LocalityLevel::Server, 110.0).expect("estimated");
        assert!((fast - 12.0 * (1.0 / 6.0 + 1.0 / 5.0)).abs() < 1e-9, "{fast}");
        assert_eq!(at(&observed(stats(1.0, 1_000.0)), LocalityLevel::Server, 110.0), Some(500.0));
        // A filler that ends is forgotten with its placement; the other one still counts.
        let mut s = limits;
        let gone = f.fillers[0];
        let server = f.view.job(gone).and_then(|j| j.placement.as_ref()).expect("placed").members[0].server;
        f.view.apply(&Command::Release { job: gone, failed: false });
        s.observe(f.view.job(gone).expect("kept a while"), 200.0);
        assert_eq!(s.freed_by_limits_s(server, u64::MAX, 1, 200.0), None);
        let other = ServerId(1 - server.0);
        assert_eq!(s.freed_by_limits_s(other, u64::MAX, 6, 200.0), Some(410.0));
        assert_eq!(s.freed_by_limits_s(other, u64::MAX, 7, 200.0), None, "it holds 6");
        assert_eq!((s.limited.len(), s.limited_on.len()), (1, 1));
    }

    #[test]
    fn a_known_time_limit_can_make_waiting_for_the_level_not_pay() {
        // Runs of 1,000 s lose 429 s across servers. With no release seen, the wait for one
        // server is unknown and the job waits (up to the ski-rental bound); when the jobs on
        // both servers run for 6,000 s more at the latest, waiting costs more than it gains.
        let mut runs = ReleaseStats::new();
        runs.record_run(1_000.0);
        assert!(matches!(fixture().relax(0, &runs), Relaxed::Wait { .. }));
        let f = fixture_limited(Some(6_000));
        f.view.jobs().into_iter().for_each(|j| runs.observe(j, 0.0));
        assert_eq!(f.relax(0, &runs), Relaxed::Start(LocalityLevel::Rack));
    }

    #[test]
    fn a_job_starts_looser_only_when_waiting_for_its_level_is_expected_to_cost_more() {
        let f = fixture();
        assert_eq!(f.relax(0, &ReleaseStats::new()), Relaxed::Start(LocalityLevel::Rack), "no run time known");
        // Runs of 10,000 s lose 4,286 s across servers; a slot on one server is seconds away.
        let gain: f64 = 10_000.0 / 0.7 - 10_000.0;
        let fast = stats(10_000.0, 1.0);
        let Relaxed::Wait { until_waited_s, why } = f.relax(0, &fast) else { panic!("waiting pays") };
        assert_eq!(until_waited_s, gain.ceil() as u64);
        assert!(why.contains("waiting for server"), "{why}");
        // The ski-rental bound: waited as long as the level could save, start.
        assert_eq!(f.relax(until_waited_s, &fast), Relaxed::Start(LocalityLevel::Rack));
        // Releases so rare that the slot is expected later than the gain: start now.
        assert_eq!(f.relax(0, &stats(10_000.0, 10_000.0)), Relaxed::Start(LocalityLevel::Rack));
        // A slot 4.4 s away is one 4,400 s away for the 1,000th in line for it.
        assert!(matches!(f.relax_behind(0, &fast, 100), Relaxed::Wait { .. }));
        assert_eq!(f.relax_behind(0, &fast, 999), Relaxed::Start(LocalityLevel::Rack));
        // Short runs gain less than the expected wait.
        assert_eq!(f.relax(0, &stats(5.0, 1.0)), Relaxed::Start(LocalityLevel::Rack));
    }

    #[test]
    fn only_a_job_that_weighs_its_cost_and_fits_looser_now_is_left_out_of_migration() {
        let f = fixture();
        let local = LocalView::of_view(&f.view);
        let mut spec = f.view.job(f.job).expect("job").spec.clone();
        assert!(can_start_looser(&local, &spec, LocalityLevel::Server), "2 + 2 GPUs free across the servers");
        assert!(!can_start_looser(&local, &spec, LocalityLevel::Any), "already allowed its tolerance");
        spec.members = 3;
        assert!(!can_start_looser(&local, &spec, LocalityLevel::Server), "3 × 2 GPUs fit nowhere: blocked");
        spec.members = 2;
        spec.slowdown.clear();
        assert!(!can_start_looser(&local, &spec, LocalityLevel::Server), "no cost declared: its timer rules");
    }

    #[test]
    fn with_no_loss_declared_a_job_starts_wherever_it_fits_at_once() {
        let mut f = fixture();
        let mut spec = f.view.job(f.job).expect("job").spec.clone();
        spec.slowdown = LocalityLevel::ALL.iter().map(|&l| (l, 0.0)).collect();
        f.job = f.view.submit(spec).expect("admitted");
        assert_eq!(f.view.job(f.job).expect("job").spec.allowed_level(0), LocalityLevel::Any);
        assert_eq!(f.relax(0, &stats(10_000.0, 1.0)), Relaxed::Unchanged, "nothing to weigh");
        let d = f.decide(0, &stats(10_000.0, 1.0));
        assert!(matches!(d.verdict, Verdict::Propose(ref m) if m.len() == 2), "{d:?}");
        assert!(!d.by_cost);
    }

    #[test]
    fn decide_asks_the_scheduler_again_at_the_level_the_cost_chose() {
        let f = fixture();
        for (stats, placed) in [(stats(10_000.0, 10_000.0), true), (stats(10_000.0, 1.0), false)] {
            let d = f.decide(0, &stats);
            if placed {
                assert!(matches!(d.verdict, Verdict::Propose(_)), "{d:?}");
                assert_eq!((d.allowed, d.by_cost), (LocalityLevel::Rack, false));
            } else {
                assert!(matches!(d.verdict, Verdict::Wait(_)), "{d:?}");
                assert_eq!((d.allowed, d.by_cost), (LocalityLevel::Server, true));
                assert!(d.recheck_waited_s.is_some());
            }
        }
    }
}
