//! [`ViewCache`]: a scheduler's live copy of the cluster view.
//!
//! The cache starts from a linearizable snapshot, then follows the view's `Watch` stream in a
//! task of its own: each delta updates the server records (through [`LocalView::apply_delta`],
//! which refuses anything that would roll the copy back) and the jobs it names. When the stream
//! breaks (the replica died, the leader moved) the task subscribes again from the version it
//! holds (after a jittered [`Backoff`], 50 ms doubling to 2 s, reset by every event), through
//! the leader-following [`ViewClient`]; a replica that no longer holds that far
//! back answers with a snapshot, and the copy is rebuilt from it. Readers never wait for the
//! network: they read whatever the copy holds, and [`ViewCache::changed`] tells them when that
//! moved on.

use crate::LocalView;
use crate::SchedulerError;
use crate::locality_cost::{ReleaseStats, slot_kind};
use crate::reservation::Reservations;
use crate::scheduler::RunningIndex;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tessera_proto::backoff::{Backoff, seeded_rng};
use tessera_proto::client::ViewClient;
use tessera_proto::v1;
use tessera_view::attained::queue_key;
use tessera_view::{Job, JobId, JobState, ServerId, ServerRecord, ViewDelta, ViewSnapshot, ViewVersion};
use tokio::sync::watch;

/// How long one watch stream is followed before subscribing again (a replica that went quiet
/// without closing the stream cannot hold the copy back for longer).
const WATCH_REFRESH: Duration = Duration::from_secs(30);

/// The copy: server records with the search index, and every job the view still holds.
#[derive(Debug)]
pub struct CacheState {
    /// Server records, indexed for the search.
    pub view: LocalView,
    /// Jobs by id (ended ones until the view forgets them).
    pub jobs: HashMap<JobId, Job>,
    /// Server names, by id.
    pub server_names: Vec<String>,
    /// The jobs holding GPUs, per server (for schedulers' [`crate::scheduler::Context`]).
    pub running: RunningIndex,
    /// GPU releases and run times seen in the change stream, timed on this copy's clock (for
    /// [`crate::locality_cost`]).
    pub releases: ReleaseStats,
    /// The host's bounded reservation for a starved gang of whole servers, brought up to date
    /// with every change of the copy, on the same clock ([`crate::reservation`]), for a host
    /// that makes them (`reserving`).
    pub reservations: Reservations,
    /// Whether `reservations` is kept ([`ViewCache::set_reserving`]; off by default).
    reserving: bool,
    /// Whether the cluster orders waiting jobs by attained-service queues (its spec names
    /// thresholds): the host's order is the view's ([`tessera_view::attained::queue_key`]).
    queues: bool,
    /// The origin of that clock.
    clock: Instant,
}

impl CacheState {
    fn from_snapshot(s: &ViewSnapshot) -> CacheState {
        CacheState {
            view: LocalView::from_snapshot(s),
            jobs: s.jobs.iter().map(|j| (j.id, j.clone())).collect(),
            running: RunningIndex::from_jobs(&s.jobs).with_preemption_bound(s.priorities.max_preemptions),
            server_names: s.server_names.clone(),
            releases: ReleaseStats::new(),
            reservations: Reservations::new(),
            reserving: false,
            queues: !s.priorities.attained_service_gpu_s.is_empty(),
            clock: Instant::now(),
        }
        .observing(&s.jobs)
    }

    /// This copy with `jobs` observed now (what a snapshot shows running is timed from now).
    fn observing(mut self, jobs: &[Job]) -> CacheState {
        let now = self.now_s();
        for j in jobs {
            self.releases.observe(j, now);
        }
        self.reserve();
        self
    }

    /// Brings [`CacheState::reservations`] up to now, over the pending jobs in the host's order
    /// (`pending`), each waited since it became ready (the view's clock, on this machine's wall
    /// clock).
    fn reserve(&mut self) {
        if !self.reserving {
            return;
        }
        let (now, wall) = (self.now_s(), crate::host::wall_ms());
        let pending = in_host_order(&self.jobs, self.queues);
        let waited = |j: &Job| wall.saturating_sub(j.waiting_from_ms()) as f64 / 1000.0;
        let queue = pending.into_iter().map(|j| (j, if j.waiting_from_ms() == 0 { 0.0 } else { waited(j) }));
        self.reservations.update(&self.view, queue, &self.releases, now);
    }

    /// Seconds on this copy's clock.
    pub fn now_s(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// A copy rebuilt from `s` that keeps what this one observed of releases, on the same clock.
    fn rebuilt(&mut self, s: &ViewSnapshot) -> CacheState {
        let mut fresh = CacheState::from_snapshot(s);
        fresh.clock = self.clock;
        fresh.releases = std::mem::take(&mut self.releases);
        let now = fresh.now_s();
        fresh.releases.resync(&s.jobs, now);
        fresh.reservations = std::mem::take(&mut self.reservations);
        fresh.reserving = self.reserving;
        fresh.reserve();
        fresh
    }

    /// Applies a delta; false (nothing changed) when it does not continue this copy.
    fn apply(&mut self, d: &ViewDelta) -> bool {
        if !self.view.apply_delta(d) {
            return false;
        }
        let now = self.now_s();
        for j in &d.jobs {
            self.releases.observe(j, now);
            self.running.update(j);
            self.jobs.insert(j.id, j.clone());
        }
        self.reserve();
        true
    }

    /// Pending jobs in the host's order ([`in_host_order`]).
    pub fn pending(&self) -> Vec<&Job> {
        in_host_order(&self.jobs, self.queues)
    }

    /// Pending jobs waiting for no other job ahead of `job` in the host's order (the view's:
    /// a higher priority, then a lower attained-service queue and less service attained where
    /// the cluster has queues, then submitted earlier) that wait for the same kind of slot: the
    /// same gang shape, GPU type and preferred level ([`crate::Context::ahead`]).
    pub fn same_kind_ahead(&self, job: &Job) -> u32 {
        let kind = slot_kind(&job.spec);
        let me = queue_key(job, self.queues, 0);
        self.jobs
            .values()
            .filter(|j| j.state == JobState::Pending && j.waiting_for.is_empty() && slot_kind(&j.spec) == kind)
            .filter(|j| queue_key(j, self.queues, 0) < me)
            .count() as u32
    }

    /// A server's name, or its id in words.
    pub fn server_name(&self, s: ServerId) -> String {
        self.server_names.get(s.index()).cloned().unwrap_or_else(|| s.to_string())
    }
}

/// The pending jobs of `jobs` in the host's order, the view's ([`queue_key`]; `queues`: the
/// cluster has attained-service queues). A waiting job holds no placement, so the clock its
/// attained service is read at does not matter.
fn in_host_order(jobs: &HashMap<JobId, Job>, queues: bool) -> Vec<&Job> {
    let mut v: Vec<&Job> = jobs.values().filter(|j| j.state == JobState::Pending).collect();
    v.sort_by_cached_key(|j| queue_key(j, queues, 0));
    v
}

/// A live copy of the cluster view, shared by every scheduler task of a process.
#[derive(Clone, Debug)]
pub struct ViewCache {
    state: Arc<RwLock<CacheState>>,
    version: watch::Receiver<u64>,
    follower: Arc<tokio::task::AbortHandle>,
}

impl Drop for ViewCache {
    fn drop(&mut self) {
        // The last clone stops the follower task.
        if Arc::strong_count(&self.follower) == 1 {
            self.follower.abort();
        }
    }
}

impl ViewCache {
    /// Reads a linearizable snapshot through `client` and starts following the view.
    pub async fn connect(mut client: ViewClient) -> Result<ViewCache, SchedulerError> {
        let snap = read_snapshot(&mut client).await?;
        let version = snap.version.0;
        let state = Arc::new(RwLock::new(CacheState::from_snapshot(&snap)));
        let (tx, rx) = watch::channel(version);
        let task = tokio::spawn(follow(client, state.clone(), tx));
        Ok(ViewCache { state, version: rx, follower: Arc::new(task.abort_handle()) })
    }

    /// Runs `f` on the copy as it is now.
    pub fn read<R>(&self, f: impl FnOnce(&CacheState) -> R) -> R {
        match self.state.read() {
            Ok(s) => f(&s),
            Err(poisoned) => f(&poisoned.into_inner()),
        }
    }

    /// The version the copy reflects.
    pub fn version(&self) -> ViewVersion {
        ViewVersion(*self.version.borrow())
    }

    /// One job as the copy holds it.
    pub fn job(&self, id: JobId) -> Option<Job> {
        self.read(|s| s.jobs.get(&id).cloned())
    }

    /// Keeps (or stops keeping) the host's bounded reservation in the copy
    /// ([`CacheState::reservations`]), brought up to date now.
    pub fn set_reserving(&self, on: bool) {
        if let Ok(mut s) = self.state.write() {
            s.reserving = on;
            if !on {
                s.reservations = Reservations::new();
            }
            s.reserve();
        }
    }

    /// Replaces server records with fresher ones (from a rejection), when they still fit.
    pub fn learn(&self, fresh: &[(ServerId, ServerRecord)]) {
        if let Ok(mut s) = self.state.write() {
            for &(id, rec) in fresh {
                s.view.apply_server(id, rec);
            }
        }
    }

    /// Waits until the copy moves past `seen` (or `timeout` passes); returns the version then.
    pub async fn changed_since(&self, seen: ViewVersion, timeout: Duration) -> ViewVersion {
        let mut rx = self.version.clone();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|v| *v > seen.0)).await;
        self.version()
    }

    /// Waits until `pred` holds for the copy (checked after every change), or `timeout`
    /// passes; returns whether it held.
    pub async fn wait_until(&self, timeout: Duration, mut pred: impl FnMut(&CacheState) -> bool) -> bool {
        let mut rx = self.version.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.read(&mut pred) {
                return true;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return self.read(&mut pred),
            }
        }
    }
}

async fn read_snapshot(client: &mut ViewClient) -> Result<ViewSnapshot, SchedulerError> {
    let r = client.snapshot(true).await.map_err(SchedulerError::call("Snapshot"))?;
    let wire = r.snapshot.ok_or(SchedulerError::NoSnapshot)?;
    ViewSnapshot::try_from(wire).map_err(SchedulerError::MalformedSnapshot)
}

/// Follows the watch stream for as long as the cache lives.
async fn follow(mut client: ViewClient, state: Arc<RwLock<CacheState>>, tx: watch::Sender<u64>) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut rng = seeded_rng(crate::host::fnv(client.current()));
    loop {
        let from = *tx.borrow();
        let mut stream = match client.watch(from).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "watch failed, retrying");
                tokio::time::sleep(backoff.next_delay(&mut rng)).await;
                continue;
            }
        };
        let refresh = tokio::time::sleep(WATCH_REFRESH);
        tokio::pin!(refresh);
        loop {
            let ev = tokio::select! {
                ev = stream.message() => ev,
                _ = &mut refresh => break,
            };
            let ev = match ev {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "watch stream ended");
                    break;
                }
            };
            backoff.reset();
            let to = match ev.event {
                Some(v1::watch_event::Event::Delta(d)) => match ViewDelta::try_from(d) {
                    Ok(d) => {
                        let ok = state.write().map(|mut s| s.apply(&d)).unwrap_or(false);
                        if ok {
                            Some(d.to.0)
                        } else {
                            // A gap or a refused record: start over from a snapshot.
                            match read_snapshot(&mut client).await {
                                Ok(s) => replace(&state, &s),
                                Err(e) => {
                                    tracing::debug!(error = %e, "snapshot after a refused delta failed");
                                    None
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "malformed delta from the view, ignored");
                        None
                    }
                },
                Some(v1::watch_event::Event::Snapshot(s)) => match ViewSnapshot::try_from(s) {
                    Ok(s) => replace(&state, &s),
                    Err(e) => {
                        tracing::warn!(error = %e, "malformed snapshot from the view, ignored");
                        None
                    }
                },
                None => None,
            };
            if let Some(v) = to
                && v > *tx.borrow()
            {
                let _ = tx.send(v);
            }
        }
        // Resubscribing to a replica that keeps closing the stream at once backs off too.
        tokio::time::sleep(backoff.next_delay(&mut rng)).await;
    }
}

/// Rebuilds the copy from a snapshot unless that would take it back in time.
fn replace(state: &RwLock<CacheState>, s: &ViewSnapshot) -> Option<u64> {
    let mut st = state.write().ok()?;
    if s.version < st.view.version() {
        return None;
    }
    *st = st.rebuilt(s);
    Some(s.version.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::fit::FitMode;
    use tessera_view::{ClusterSpec, ClusterView, Command, Decision, JobSpec, Proposal, ProposalId, Topology};

    /// Pending `job`'s members packed on a free server of `v` (the host's own search).
    fn on_a_free_server(v: &ClusterView, job: JobId) -> Vec<tessera_view::MemberPlacement> {
        let spec = &v.job(job).expect("job").spec;
        let level = tessera_view::LocalityLevel::Server;
        crate::find_placement(&LocalView::of_view(v), &crate::Overlay::default(), spec, level, FitMode::Pack, 1)
            .expect("a free server")
            .members
    }

    #[test]
    fn on_a_cluster_with_queues_the_copy_orders_waiting_jobs_as_the_view_does() {
        // One seed-8gpu server; queues after 10 and 100 GPU-seconds.
        const T0: u64 = 1_800_000_000_000;
        let mut spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
        spec.priorities.attained_service_gpu_s = vec![10, 100];
        let mut v = ClusterView::from_spec(&spec);
        v.advance_clock(T0);
        let old = v.submit(JobSpec::simple("old", 1, 2)).expect("admitted");
        let young = v.submit(JobSpec::simple("young", 1, 2)).expect("admitted");
        let new = v.submit(JobSpec::simple("new", 1, 2)).expect("admitted");
        // `old` runs 40 s on 2 GPUs (80 GPU-s), `young` 10 s (20 GPU-s); each is then re-queued
        // by a drain of the server: both in queue 1, `new` in queue 0.
        let server = tessera_view::ServerId(0);
        let run = |v: &mut ClusterView, job: JobId, id: u64, from_ms: u64, to_ms: u64| {
            v.advance_clock(from_ms);
            let p = Proposal { id: ProposalId(id), job, members: on_a_free_server(v, job), based_on: v.version() };
            assert!(v.propose(&p).is_placed());
            v.advance_clock(to_ms);
            let drain = tessera_view::Cordon { reason: "drain".into(), since_ms: to_ms, drain_by_ms: Some(to_ms) };
            v.cordon(server, drain).expect("cordoned");
            assert_eq!(v.evict(server, to_ms).expect("evicted"), vec![job]);
            v.uncordon(server, to_ms).expect("uncordoned");
        };
        run(&mut v, old, 1, T0, T0 + 40_000);
        run(&mut v, young, 2, T0 + 40_000, T0 + 50_000);
        let queues: Vec<u8> = [old, young, new].iter().map(|&j| v.job(j).expect("job").service_queue).collect();
        assert_eq!(queues, vec![1, 1, 0]);
        let viewed: Vec<JobId> = tessera_view::Explainer::new(&v).queue().iter().map(|j| j.id).collect();
        assert_eq!(viewed, vec![new, young, old], "queue 0 first; in queue 1 the less attained");
        let state = CacheState::from_snapshot(&v.snapshot());
        assert_eq!(state.pending().iter().map(|j| j.id).collect::<Vec<_>>(), viewed, "the host's order is the view's");
        let ahead = |id| state.same_kind_ahead(&state.jobs[&id]);
        assert_eq!((ahead(new), ahead(young), ahead(old)), (0, 1, 2), "the jobs ahead of each, in that order");
    }

    #[test]
    fn the_copy_counts_jobs_ahead_for_the_same_slot_and_times_releases_from_the_stream() {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
        let first = v.submit(JobSpec::simple("a", 1, 8)).expect("admitted");
        let other_shape = v.submit(JobSpec::simple("b", 1, 4)).expect("admitted");
        let second = v.submit(JobSpec::simple("c", 1, 8)).expect("admitted");
        let urgent = v.submit(JobSpec { priority: 10, ..JobSpec::simple("d", 1, 8) }).expect("admitted");
        let mut state = CacheState::from_snapshot(&v.snapshot());
        let ahead = |s: &CacheState, id| s.same_kind_ahead(&s.jobs[&id]);
        assert_eq!(ahead(&state, urgent), 0, "a higher priority goes first");
        assert_eq!(ahead(&state, first), 1);
        assert_eq!(ahead(&state, second), 2, "the earlier job of its shape and the urgent one");
        assert_eq!(ahead(&state, other_shape), 0, "another shape waits for another slot");
        // The urgent job is placed and ends: the copy sees both in the change stream.
        let members = on_a_free_server(&v, urgent);
        let seen = v.version();
        let p = Proposal { id: ProposalId(9), job: urgent, members, based_on: seen };
        assert!(matches!(v.propose(&p), Decision::Accepted { .. }));
        assert!(state.apply(&v.delta_since(seen).expect("delta")));
        assert!(state.releases.mean_run_s().is_none(), "nothing ended yet");
        let seen = v.version();
        v.apply(&Command::Release { job: urgent, failed: false });
        assert!(state.apply(&v.delta_since(seen).expect("delta")));
        assert_eq!(ahead(&state, second), 1, "the urgent job is no longer waiting");
        assert!(state.releases.mean_run_s().is_some(), "its run was timed");
    }

    #[test]
    fn the_copy_reserves_servers_for_a_starved_gang_and_its_jobs_see_them_taken() {
        use crate::scheduler::{Attempt, Context, LocalityTolerant, Verdict};
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
        // The gang was submitted 10,000 s ago (the view's clock), when each server got a
        // one-GPU job limited to 100 s: 7 GPUs free on each, never 8 on one.
        v.apply(&Command::Clock { at_ms: crate::host::wall_ms() - 10_000_000 });
        let gang = v.submit(JobSpec::simple("gang", 2, 8)).expect("admitted");
        for n in 0..2u64 {
            let mut filler = JobSpec::simple("filler", 1, 1);
            filler.run.time_limit_s = Some(100);
            let id = v.submit(filler).expect("admitted");
            let spec = v.job(id).expect("job").spec.clone();
            let local = LocalView::of_view(&v);
            // On server n: the other one shown full.
            let other = ServerId(1 - n as u32);
            let mut o = crate::Overlay::default();
            o.learn(&[(other, ServerRecord { free_gpus: 0, ..v.servers()[other.index()] })]);
            let f = crate::find_placement(&local, &o, &spec, tessera_view::LocalityLevel::Any, FitMode::Pack, 0)
                .expect("room");
            let p = Proposal { id: ProposalId(10 + n), job: id, members: f.members, based_on: v.version() };
            assert!(matches!(v.propose(&p), Decision::Accepted { .. }));
        }
        assert_eq!(v.servers().iter().map(|r| r.free_gpus.count_ones()).collect::<Vec<_>>(), vec![7, 7]);
        let small = v.submit(JobSpec::simple("small", 1, 1)).expect("admitted");
        let mut state = CacheState::from_snapshot(&v.snapshot());
        assert!(state.reservations.current().is_none(), "a copy keeps no reservation unless its host makes them");
        state.reserving = true;
        state.reserve();
        let held = state.reservations.current().expect("the limits free both servers within 100 s");
        assert_eq!((held.job, held.servers.clone()), (gang, vec![ServerId(0), ServerId(1)]));
        // The small job's attempt, as a host task makes it: with the copy's context the withheld
        // servers look taken; a host that makes no reservations places it.
        let decide = |ctx: Context<'_>| {
            let a = Attempt {
                job: &state.jobs[&small],
                view: &state.view,
                overlay: &crate::Overlay::default(),
                allowed: tessera_view::LocalityLevel::Any,
                waited_s: 0,
                attempt: 0,
                salt: 1,
                ctx,
            };
            crate::locality_cost::decide(&LocalityTolerant::default(), &a).verdict
        };
        let ctx = Context {
            running: &state.running,
            releases: &state.releases,
            reservations: &state.reservations,
            ahead: 0,
            now_s: state.now_s(),
        };
        assert!(matches!(decide(ctx), Verdict::Wait(_)), "held back");
        assert!(matches!(decide(Context::empty()), Verdict::Propose(_)), "placed without the reservation");
    }
}
