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
use std::collections::BTreeMap;
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
    /// same rules again at apply. Work lost is unknown here (0 for every candidate), so victim
    /// choice falls back on the fewest gangs and the lowest rank.
    pub fn preemptible_by(&self, rank: (i32, Reverse<u8>)) -> Vec<Candidate> {
        self.victims
            .values()
            .filter(|(c, preemptions)| {
                *preemptions < self.max_preemptions && rank > (c.priority, Reverse(c.service_queue))
            })
            .map(|(c, _)| c.clone())
            .collect()
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
        self.victims.remove(&job);
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

    /// Brings the index up to date with `job` as it is now: listed on the servers of its
    /// placement while it holds one, nowhere otherwise.
    pub fn update(&mut self, job: &Job) {
        self.remove(job.id);
        if job.state.holds_resources()
            && let Some(p) = &job.placement
        {
            self.add(job.id, job.spec.total_gpus(), p.members.iter().map(|m| m.server));
            let victim = Candidate {
                job: job.id,
                members: p.members.clone(),
                priority: job.spec.priority,
                service_queue: job.service_queue,
                lost_s: 0.0,
            };
            self.victims.insert(job.id, (victim, job.preemptions));
        }
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
}
