//! [`Context`]: what a scheduler is shown beyond the server records — today the jobs running on
//! each server ([`RunningIndex`]), which affinity placements (Gandiva) need, and the running
//! jobs a waiting one may preempt ([`RunningIndex::preemptible_by`]), which victim choice needs.
//! It also carries the GPU releases the host has observed ([`ReleaseStats`]), from which the
//! cost of waiting for a tighter locality level is estimated ([`crate::locality_cost`]).
//! The host builds it once and shares it with every attempt: the live host keeps it in its
//! copy of the view ([`crate::cache::CacheState::running`]), the simulator beside its event loop.

use crate::locality_cost::ReleaseStats;
use crate::preemption::Candidate;
use crate::reservation::Reservations;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use tessera_view::{Job, JobId, ServerId};

/// What the host knows beyond the server records, shared by every attempt it makes.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// Jobs holding GPUs, per server.
    pub running: &'a RunningIndex,
    /// The GPU releases and run times the host has observed, for the estimates of
    /// [`crate::locality_cost`].
    pub releases: &'a ReleaseStats,
    /// The host's reservation for a starved gang, if it holds one: the servers it withholds
    /// look taken to the jobs they are withheld from ([`crate::locality_cost::decide`] masks
    /// them).
    pub reservations: &'a Reservations,
    /// Pending jobs ahead of this attempt's job in the host's queue that wait for the same kind
    /// of slot (the same gang shape, GPU type and floor level): they take the slots that open
    /// first. 0 when the host does not know.
    pub ahead: u32,
    /// Now, on the clock of `releases` (seconds): when the time limits it keeps free GPUs is
    /// read against it.
    pub now_s: f64,
}

/// No jobs known: what tests and tools that hold only server records pass.
static NOTHING_RUNNING: RunningIndex = RunningIndex::new();
static NOTHING_RELEASED: ReleaseStats = ReleaseStats::new();
static NOTHING_RESERVED: Reservations = Reservations::new();

impl Context<'static> {
    /// A context that knows nothing beyond the server records.
    pub fn empty() -> Context<'static> {
        Context {
            running: &NOTHING_RUNNING,
            releases: &NOTHING_RELEASED,
            reservations: &NOTHING_RESERVED,
            ahead: 0,
            now_s: 0.0,
        }
    }
}

impl<'a> Context<'a> {
    /// A context of running jobs `running`, with nothing released yet.
    pub fn of_running(running: &'a RunningIndex) -> Context<'a> {
        Context { running, releases: &NOTHING_RELEASED, reservations: &NOTHING_RESERVED, ahead: 0, now_s: 0.0 }
    }
}

/// A job's rank for preemption ([`Job::rank`]): priority, then the lowest attained-service queue.
type Rank = (i32, Reverse<u8>);

/// A candidate's rank.
fn rank_of(c: &Candidate) -> Rank {
    (c.priority, Reverse(c.service_queue))
}

/// A job holding GPUs on a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Running {
    /// The job.
    pub job: JobId,
    /// Its GPUs in all (over every server it spans).
    pub gpus: u32,
}

/// The jobs holding GPUs, per server; kept current by the host as jobs start, move and end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunningIndex {
    per_server: Vec<Vec<Running>>,
    /// The servers each listed job is on, so an update touches only those.
    servers_of: BTreeMap<JobId, Vec<ServerId>>,
    /// The jobs [`RunningIndex::update`] listed, as possible victims, with the preemptions they
    /// have had. ([`RunningIndex::add`] knows no rank: such jobs are never offered as victims.)
    victims: BTreeMap<JobId, (Candidate, u32)>,
    /// The same jobs by rank ([`Job::rank`]), lowest first: a waiting job reads only those it
    /// outranks.
    by_rank: BTreeSet<(Rank, JobId)>,
    /// The cluster's bound on preemptions of one job (`[priorities] max_preemptions`); 0 turns
    /// preemption off.
    max_preemptions: u32,
}

impl RunningIndex {
    /// An empty index.
    pub const fn new() -> RunningIndex {
        RunningIndex {
            per_server: Vec::new(),
            servers_of: BTreeMap::new(),
            victims: BTreeMap::new(),
            by_rank: BTreeSet::new(),
            max_preemptions: 0,
        }
    }

    /// The same index under the cluster's preemption bound ([`tessera_view::Priorities`]'s
    /// `max_preemptions`; the default, 0, offers no victims).
    pub fn with_preemption_bound(mut self, max_preemptions: u32) -> RunningIndex {
        self.max_preemptions = max_preemptions;
        self
    }

    /// The running jobs a job of rank `rank` ([`Job::rank`]) may preempt: those it outranks,
    /// preempted fewer times than the cluster's bound, in job order. The approver checks the
    /// same rules again at apply. Borrowed: a host asks once per waiting job and attempt.
    pub fn preemptible_by(&self, rank: Rank) -> Vec<&Candidate> {
        if self.max_preemptions == 0 {
            return Vec::new();
        }
        self.by_rank
            .range(..(rank, JobId(0)))
            .filter_map(|(_, id)| self.victims.get(id))
            .filter(|(_, preemptions)| *preemptions < self.max_preemptions)
            .map(|(c, _)| c)
            .collect()
    }

    /// The lowest rank among the jobs that may still be preempted (under the bound), if any: a
    /// waiting job that does not outrank it can displace no one.
    pub fn lowest_preemptible(&self) -> Option<Rank> {
        if self.max_preemptions == 0 {
            return None;
        }
        self.by_rank
            .iter()
            .find(|(_, id)| self.victims.get(id).is_some_and(|(_, n)| *n < self.max_preemptions))
            .map(|(rank, _)| *rank)
    }

    /// The index of the jobs among `jobs` that hold a placement.
    pub fn from_jobs<'j>(jobs: impl IntoIterator<Item = &'j Job>) -> RunningIndex {
        let mut idx = RunningIndex::new();
        for j in jobs {
            idx.update(j);
        }
        idx
    }

    /// The jobs on server `s`, in the order they arrived there.
    pub fn on(&self, s: ServerId) -> &[Running] {
        self.per_server.get(s.index()).map_or(&[], Vec::as_slice)
    }

    /// Records that `job` (of `gpus` GPUs in all) holds GPUs on `servers`.
    pub fn add(&mut self, job: JobId, gpus: u32, servers: impl IntoIterator<Item = ServerId>) {
        for s in servers {
            if self.per_server.len() <= s.index() {
                self.per_server.resize_with(s.index() + 1, Vec::new);
            }
            let on = &mut self.per_server[s.index()];
            if !on.iter().any(|r| r.job == job) {
                on.push(Running { job, gpus });
                self.servers_of.entry(job).or_default().push(s);
            }
        }
    }

    /// Forgets `job` wherever it is listed.
    pub fn remove(&mut self, job: JobId) {
        if let Some((c, _)) = self.victims.remove(&job) {
            self.by_rank.remove(&(rank_of(&c), job));
        }
        for s in self.servers_of.remove(&job).unwrap_or_default() {
            if let Some(on) = self.per_server.get_mut(s.index()) {
                on.retain(|r| r.job != job);
            }
        }
    }

    /// Jobs listed.
    pub fn jobs(&self) -> usize {
        self.servers_of.len()
    }

    /// Brings a listed job's rank and preemption count up to date with `job` (the view moved it
    /// down a queue), leaving where it runs alone; a job not listed as a victim is left out.
    pub fn rerank(&mut self, job: &Job) {
        let Some((c, preemptions)) = self.victims.get_mut(&job.id) else { return };
        let old = rank_of(c);
        (c.priority, c.service_queue, *preemptions) = (job.spec.priority, job.service_queue, job.preemptions);
        let new = rank_of(c);
        if old != new {
            self.by_rank.remove(&(old, job.id));
            self.by_rank.insert((new, job.id));
        }
    }

    /// Brings the index up to date with `job` as it is now: listed on the servers of its
    /// placement while it holds one, nowhere otherwise. A job still on the same servers keeps
    /// its place in their lists (a host updates on every change to a job, not only on moves).
    pub fn update(&mut self, job: &Job) {
        let Some(victim) = Candidate::of(job) else {
            self.remove(job.id);
            return;
        };
        let mut servers: Vec<ServerId> = Vec::with_capacity(victim.members.len());
        for m in &victim.members {
            if !servers.contains(&m.server) {
                servers.push(m.server);
            }
        }
        if self.servers_of.get(&job.id) == Some(&servers) {
            if let Some((old, _)) = self.victims.remove(&job.id) {
                self.by_rank.remove(&(rank_of(&old), job.id));
            }
        } else {
            self.remove(job.id);
            self.add(job.id, job.spec.total_gpus(), servers);
        }
        self.by_rank.insert((rank_of(&victim), job.id));
        self.victims.insert(job.id, (victim, job.preemptions));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::fit::FitMode;
    use tessera_view::{
        ClusterSpec, ClusterView, Command, Decision, JobSpec, LocalityLevel, Proposal, ProposalId, Topology,
    };

    #[test]
    fn the_index_follows_jobs_as_they_are_placed_and_end() {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
        let id = v.submit(JobSpec::simple("j", 2, 8)).expect("admitted");
        let mut idx = RunningIndex::from_jobs(v.jobs());
        assert_eq!(idx.jobs(), 0, "a pending job holds nothing");
        let spec = v.job(id).expect("job").spec.clone();
        let local = crate::LocalView::of_view(&v);
        let found =
            crate::find_placement(&local, &crate::Overlay::default(), &spec, LocalityLevel::Any, FitMode::Pack, 1);
        let members = found.expect("two free servers").members;
        let d = v.propose(&Proposal { id: ProposalId(1), job: id, members, based_on: v.version() });
        assert!(matches!(d, Decision::Accepted { .. }), "{d:?}");
        idx.update(v.job(id).expect("job"));
        assert_eq!(idx.on(ServerId(0)), [Running { job: id, gpus: 16 }]);
        assert_eq!(idx.on(ServerId(1)), [Running { job: id, gpus: 16 }]);
        assert_eq!(idx, RunningIndex::from_jobs(v.jobs()), "incremental equals rebuilt");
        v.apply(&Command::Release { job: id, failed: false });
        idx.update(v.job(id).expect("ended jobs are kept a while"));
        assert_eq!((idx.jobs(), idx.on(ServerId(0)).len()), (0, 0));
        assert!(idx.on(ServerId(99)).is_empty(), "an unknown server runs nothing");
    }

    /// Submits `spec` to `v` and places it where the search (probe offset `n`) finds room, as
    /// proposal `n + 1`.
    fn place(v: &mut ClusterView, spec: JobSpec, n: u64) -> JobId {
        let id = v.submit(spec.clone()).expect("admitted");
        let local = crate::LocalView::of_view(v);
        let found =
            crate::find_placement(&local, &crate::Overlay::default(), &spec, LocalityLevel::Any, FitMode::Pack, n);
        let p =
            Proposal { id: ProposalId(n + 1), job: id, members: found.expect("free").members, based_on: v.version() };
        assert!(matches!(v.propose(&p), Decision::Accepted { .. }));
        id
    }

    #[test]
    fn victims_are_offered_by_rank_under_the_bound_with_their_run_start() {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
        v.apply(&Command::Clock { at_ms: 5_000 });
        let mut ids = Vec::new();
        for (n, priority) in [(0u64, 1), (1, 3)] {
            ids.push(place(&mut v, JobSpec { priority, ..JobSpec::simple("j", 1, 8) }, n));
        }
        let idx = RunningIndex::from_jobs(v.jobs());
        assert!(idx.preemptible_by((9, Reverse(0))).is_empty(), "the default bound, 0, offers no victims");
        assert_eq!(idx.lowest_preemptible(), None);
        let idx = idx.with_preemption_bound(2);
        let offered: Vec<JobId> = idx.preemptible_by((2, Reverse(0))).iter().map(|c| c.job).collect();
        assert_eq!(offered, vec![ids[0]], "priority 2 outranks only the priority-1 job");
        assert_eq!(idx.preemptible_by((2, Reverse(0)))[0].since_ms, 5_000, "its placement's time on the view's clock");
        assert_eq!(idx.lowest_preemptible(), Some((1, Reverse(0))));
        // The priority-1 job falls to queue 2: a job of priority 1, queue 0 now outranks it.
        let mut fell = v.job(ids[0]).expect("job").clone();
        fell.service_queue = 2;
        let mut reranked = idx.clone();
        reranked.rerank(&fell);
        assert_eq!(reranked.lowest_preemptible(), Some((1, Reverse(2))));
        let offered: Vec<JobId> = reranked.preemptible_by((1, Reverse(0))).iter().map(|c| c.job).collect();
        assert_eq!(offered, vec![ids[0]]);
        let mut updated = idx.clone();
        updated.update(&fell);
        assert_eq!(reranked, updated, "reranking equals updating a job that did not move");
    }

    #[test]
    fn a_job_updated_in_place_keeps_its_place_on_its_server() {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 1, 1, 1));
        let mut ids = Vec::new();
        for n in 0..2u64 {
            ids.push(place(&mut v, JobSpec::simple("j", 1, 4), n));
        }
        let mut idx = RunningIndex::new().with_preemption_bound(1);
        for &id in &ids {
            idx.update(v.job(id).expect("job"));
        }
        let order = |idx: &RunningIndex| idx.on(ServerId(0)).iter().map(|r| r.job).collect::<Vec<_>>();
        assert_eq!(order(&idx), ids, "in the order they arrived");
        // A change that does not move the first job (it falls a queue): its place stays.
        let mut fell = v.job(ids[0]).expect("job").clone();
        fell.service_queue = 1;
        idx.update(&fell);
        assert_eq!(order(&idx), ids, "a job updated in place keeps its place");
        assert_eq!(idx.lowest_preemptible(), Some((0, Reverse(1))), "and its new rank");
        assert_eq!(idx.preemptible_by((0, Reverse(0))).len(), 1, "listed once as a victim");
    }
}
