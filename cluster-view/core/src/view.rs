//! [`ClusterView`]: the replicated state machine.
//!
//! All mutation goes through [`ClusterView::apply`] (or the direct methods it dispatches to),
//! which is deterministic: replicas that apply the same commands in the same order hold the same
//! state and the same [`ClusterView::state_hash`]. The view's version counts the commands that
//! changed state. A bounded change log serves deltas to watchers; a watcher further behind than
//! the log reaches must take a snapshot.

use crate::cluster_spec::ClusterSpec;
use crate::config_set::ConfigSet;
use crate::error::ViewError;
use crate::fit;
use crate::hash::StateHasher;
use crate::ids::{ConfigSetId, JobId, ProposalId, RequestId, ServerId, ViewVersion};
use crate::job::{Job, JobSpec, JobState, TaskEvent, TaskState};
use crate::layout::LayoutChange;
use crate::locality::LocalityLevel;
use crate::placement::{Decision, Proposal};
use crate::priority::Priorities;
use crate::server::{Cordon, Health, HealthChange, ServerRecord};
use crate::topology::Topology;
use crate::usage::{JobTimes, Ledger, Usage, UsageBy, UsageKey, UsageReport, UsageRow};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

mod admission;
mod command;
mod health;
mod snapshot;

pub use command::{Command, Outcome};
pub use snapshot::ViewSnapshot;

/// Most characters of a task's exit message kept in [`Job::error`].
pub const MAX_ERROR_CHARS: usize = 512;

/// Default bound on the change log (entries).
pub const DEFAULT_CHANGE_LOG: usize = 1 << 16;
/// Default number of ended jobs kept for queries before the oldest are forgotten.
pub const DEFAULT_ENDED_JOBS_KEPT: usize = 100_000;

/// What changed at one version, for deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Server(ServerId),
    Job(JobId),
}

/// Everything that changed after a version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ViewDelta {
    /// The version the delta starts after.
    pub from: ViewVersion,
    /// The version it brings the reader to.
    pub to: ViewVersion,
    /// Current records of servers that changed.
    pub servers: Vec<(ServerId, ServerRecord)>,
    /// The unhealthy devices of each server in `servers`, in the same order (bit `i` = device
    /// `i`; [`ClusterView::unhealthy_devices`]): a record shows which devices are free, not
    /// which held ones will stay taken when their job releases them. Empty when the sender
    /// carried none (a peer that predates the field): the reader keeps the masks it holds.
    #[serde(default)]
    pub unhealthy: Vec<u64>,
    /// Current records of jobs that changed (ended jobs may be absent if forgotten).
    pub jobs: Vec<Job>,
}

/// The cluster view. See the crate docs for its invariants.
#[derive(Debug, Clone)]
pub struct ClusterView {
    pub(crate) version: ViewVersion,
    pub(crate) topologies: Vec<Topology>,
    pub(crate) config_sets: Vec<ConfigSet>,
    pub(crate) racks: Vec<String>,
    pub(crate) ib_domains: Vec<String>,
    pub(crate) servers: Vec<ServerRecord>,
    pub(crate) server_names: Vec<String>,
    pub(crate) server_versions: Vec<ViewVersion>,
    pub(crate) server_by_name: HashMap<String, ServerId>,
    /// Unhealthy devices per server (cold: read on release and health changes only).
    pub(crate) unhealthy: Vec<u64>,
    /// Cordoned servers (cold: read by operators and on health changes).
    pub(crate) cordons: BTreeMap<ServerId, Cordon>,
    /// Latest health changes per server, at most [`HEALTH_HISTORY`] each (cold).
    pub(crate) health_history: BTreeMap<ServerId, VecDeque<HealthChange>>,
    /// The view's clock: the largest [`Command::Clock`] applied (Unix ms).
    pub(crate) now_ms: u64,
    /// Usage per hour, tenant and user (cold: written on release, read by reports).
    pub(crate) ledger: Ledger,
    /// When placements with a time limit run out: (deadline ms, job), derived from the jobs.
    pub(crate) deadlines: BTreeSet<(u64, JobId)>,
    /// When placed jobs reach their next attained-service threshold (derived; see
    /// [`crate::attained`]).
    pub(crate) service_marks: BTreeSet<(u64, JobId)>,
    /// The jobs that hold a placement, in id order (derived from [`Job::placement`]): what the
    /// migration planner reads, without walking the waiting and ended jobs.
    pub(crate) placed: BTreeSet<JobId>,
    pub(crate) jobs: HashMap<JobId, Job>,
    pub(crate) ended: VecDeque<JobId>,
    pub(crate) ended_kept: usize,
    pub(crate) next_job: u64,
    pub(crate) applied: HashMap<ProposalId, JobId>,
    /// Request ids of remembered jobs (derived from [`Job::request`]).
    pub(crate) requests: HashMap<RequestId, JobId>,
    pub(crate) quotas: BTreeMap<String, u32>,
    /// Quotas at a priority class and above: tenant → class → GPUs ([`crate::policy`]).
    pub(crate) class_quotas: BTreeMap<String, BTreeMap<String, u32>>,
    pub(crate) priorities: Priorities,
    /// Revoked credentials, by fingerprint ([`crate::revocation`]).
    pub(crate) revocations: BTreeMap<String, crate::revocation::Revocation>,
    /// When the revocation list last changed.
    pub(crate) revocations_changed: ViewVersion,
    pub(crate) tenant_used: HashMap<String, u32>,
    /// GPUs each tenant's placed gangs hold, by their priority (derived), for class quotas.
    pub(crate) rank_used: HashMap<String, BTreeMap<i32, u32>>,
    pub(crate) log: VecDeque<(ViewVersion, Change)>,
    pub(crate) log_cap: usize,
    pub(crate) log_floor: ViewVersion,
    /// Servers (not removed) per configuration set (derived; recounted on layout changes).
    pub(crate) cs_servers: Vec<u64>,
    /// The live jobs waiting for each job, in id order (derived from [`Job::waiting_for`]).
    pub(crate) dependents: HashMap<JobId, Vec<JobId>>,
    /// Whether jobs the view forgets are kept in [`ClusterView::forgotten`] for the caller to
    /// take (a replica writes them to its history); local, not part of snapshots.
    pub(crate) keep_forgotten: bool,
    /// Jobs forgotten since the last [`ClusterView::take_forgotten`], in the order forgotten.
    pub(crate) forgotten: Vec<Job>,
    /// Memo of [`ClusterView::never_fits`] per job shape; derived from the layout, dropped when
    /// it changes.
    pub(crate) fit_memo: HashMap<ShapeKey, Option<String>>,
}

/// What [`ClusterView::never_fits`] depends on in a job spec.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ShapeKey {
    gpu_type: Option<String>,
    tenant: String,
    /// Class quotas bind by priority.
    priority: i32,
    members: u32,
    gpus_per_member: u32,
    tolerate: LocalityLevel,
    cpu: (u8, u32, u64),
    memory_mib_per_gpu: Option<u32>,
}

impl ShapeKey {
    fn of(spec: &JobSpec) -> ShapeKey {
        use crate::job::CpuDemand;
        let cpu = match spec.cpu {
            CpuDemand::Proportional => (0, 0, 0),
            CpuDemand::Fixed { cores_per_gpu } => (1, cores_per_gpu, 0),
            CpuDemand::Predicted { predictor, min_cores_per_gpu } => (2, min_cores_per_gpu, predictor.theta.to_bits()),
        };
        ShapeKey {
            gpu_type: spec.gpu_type.clone(),
            tenant: spec.tenant.clone(),
            priority: spec.priority,
            members: spec.members,
            gpus_per_member: spec.gpus_per_member,
            tolerate: spec.tolerate,
            cpu,
            memory_mib_per_gpu: spec.memory_mib_per_gpu,
        }
    }
}

/// Bound on the never-fits memo.
const FIT_MEMO_CAP: usize = 4096;

impl ClusterView {
    /// A view with every server of `spec` up and free.
    pub fn from_spec(spec: &ClusterSpec) -> ClusterView {
        let mut racks: Vec<String> = Vec::new();
        let mut ibs: Vec<String> = Vec::new();
        let mut rack_ix: HashMap<String, u32> = HashMap::new();
        let mut ib_ix: HashMap<String, u32> = HashMap::new();
        let mut config_sets = Vec::new();
        let mut servers = Vec::new();
        let mut names = Vec::new();
        let mut per_rack: HashMap<String, u32> = HashMap::new();
        for (i, g) in spec.groups.iter().enumerate() {
            let rack = index_of(&mut racks, &mut rack_ix, &g.rack);
            let ib = index_of(&mut ibs, &mut ib_ix, &g.ib_domain);
            let topo = &spec.topologies[g.topology];
            let id = ConfigSetId(i as u16);
            config_sets.push(ConfigSet {
                id,
                name: format!("{}/{}", g.rack, topo.name),
                topology: g.topology as u16,
                rack,
                ib_domain: ib,
                removed: false,
            });
            let n = per_rack.entry(g.rack.clone()).or_default();
            for _ in 0..g.servers {
                servers.push(ServerRecord {
                    free_gpus: topo.all_devices(),
                    free_cores: topo.all_cores(),
                    free_memory_mib: topo.memory_mib,
                    config_set: id,
                    health: Health::Up,
                });
                names.push(format!("{}-s{:02}", g.rack, *n));
                *n += 1;
            }
        }
        let server_by_name = names.iter().enumerate().map(|(i, n)| (n.clone(), ServerId(i as u32))).collect();
        let count = servers.len();
        ClusterView {
            version: ViewVersion(0),
            topologies: spec.topologies.clone(),
            config_sets,
            racks,
            ib_domains: ibs,
            servers,
            server_names: names,
            server_versions: vec![ViewVersion(0); count],
            server_by_name,
            unhealthy: vec![0; count],
            cordons: BTreeMap::new(),
            health_history: BTreeMap::new(),
            now_ms: 0,
            ledger: Ledger::with_retention(spec.accounting.retention_days.saturating_mul(24)),
            jobs: HashMap::new(),
            ended: VecDeque::new(),
            ended_kept: spec.accounting.ended_jobs_kept as usize,
            next_job: 1,
            applied: HashMap::new(),
            requests: HashMap::new(),
            quotas: spec.quotas.clone(),
            class_quotas: spec.class_quotas.clone(),
            priorities: spec.priorities.clone(),
            revocations: BTreeMap::new(),
            revocations_changed: ViewVersion(0),
            tenant_used: HashMap::new(),
            rank_used: HashMap::new(),
            log: VecDeque::new(),
            log_cap: DEFAULT_CHANGE_LOG,
            log_floor: ViewVersion(0),
            cs_servers: Vec::new(),
            dependents: HashMap::new(),
            keep_forgotten: false,
            forgotten: Vec::new(),
            fit_memo: HashMap::new(),
            deadlines: BTreeSet::new(),
            service_marks: BTreeSet::new(),
            placed: BTreeSet::new(),
        }
        .with_derived()
    }

    fn with_derived(mut self) -> ClusterView {
        self.count_servers();
        self.deadlines = self.jobs.values().filter_map(|j| j.deadline_ms().map(|d| (d, j.id))).collect();
        self.service_marks = self.derive_service_marks();
        self.placed = self.jobs.values().filter(|j| j.placement.is_some()).map(|j| j.id).collect();
        self.dependents = crate::dependency::dependents_of(&self.jobs);
        self
    }

    /// Sets the change-log bound (entries) and how many ended jobs are kept.
    pub fn with_limits(mut self, change_log: usize, ended_jobs_kept: usize) -> ClusterView {
        self.log_cap = change_log.max(1);
        self.ended_kept = ended_jobs_kept;
        self
    }

    /// Keeps the jobs this view forgets from now on, for [`ClusterView::take_forgotten`] (a
    /// replica writes them to its history of ended jobs). Off by default: nothing takes them
    /// elsewhere, and they would pile up.
    pub fn keeping_forgotten(mut self) -> ClusterView {
        self.keep_forgotten = true;
        self
    }

    /// The jobs forgotten (ended, past the newest `ended_jobs_kept`) since the last call, in the
    /// order forgotten; always empty unless [`ClusterView::keeping_forgotten`].
    pub fn take_forgotten(&mut self) -> Vec<Job> {
        std::mem::take(&mut self.forgotten)
    }

    /// Sets the change-log bound alone (it is local, not part of snapshots).
    pub fn with_change_log(mut self, change_log: usize) -> ClusterView {
        self.log_cap = change_log.max(1);
        self
    }

    /// The version: commands applied that changed state.
    #[inline]
    pub fn version(&self) -> ViewVersion {
        self.version
    }

    /// Topology table.
    pub fn topologies(&self) -> &[Topology] {
        &self.topologies
    }

    /// Configuration sets.
    pub fn config_sets(&self) -> &[ConfigSet] {
        &self.config_sets
    }

    /// Rack names, by index.
    pub fn racks(&self) -> &[String] {
        &self.racks
    }

    /// InfiniBand domain names, by index.
    pub fn ib_domains(&self) -> &[String] {
        &self.ib_domains
    }

    /// The topology of a configuration set.
    #[inline]
    pub fn topology_of(&self, cs: ConfigSetId) -> &Topology {
        &self.topologies[self.config_sets[cs.index()].topology as usize]
    }

    /// All server records, indexed by [`ServerId`].
    #[inline]
    pub fn servers(&self) -> &[ServerRecord] {
        &self.servers
    }

    /// One server's record.
    #[inline]
    pub fn server(&self, id: ServerId) -> Option<&ServerRecord> {
        self.servers.get(id.index())
    }

    /// One server's name.
    pub fn server_name(&self, id: ServerId) -> Option<&str> {
        self.server_names.get(id.index()).map(String::as_str)
    }

    /// A server by name.
    pub fn server_id(&self, name: &str) -> Option<ServerId> {
        self.server_by_name.get(name).copied()
    }

    /// The version at which a server last changed.
    pub fn server_version(&self, id: ServerId) -> Option<ViewVersion> {
        self.server_versions.get(id.index()).copied()
    }

    /// A job.
    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// The jobs that hold a placement (placed, running, migrating or stopping), in id order.
    pub fn placed_jobs(&self) -> impl Iterator<Item = &Job> + '_ {
        self.placed.iter().filter_map(|id| self.jobs.get(id))
    }

    /// All known jobs, in id order.
    pub fn jobs(&self) -> Vec<&Job> {
        let mut v: Vec<&Job> = self.jobs.values().collect();
        v.sort_by_key(|j| j.id);
        v
    }

    /// GPUs a tenant holds.
    pub fn tenant_used(&self, tenant: &str) -> u32 {
        self.tenant_used.get(tenant).copied().unwrap_or(0)
    }

    /// Tenant quotas.
    pub fn quotas(&self) -> &BTreeMap<String, u32> {
        &self.quotas
    }

    /// Priority classes and the preemption bound.
    pub fn priorities(&self) -> &Priorities {
        &self.priorities
    }

    /// Applies one command. Deterministic.
    pub fn apply(&mut self, cmd: &Command) -> Outcome {
        match cmd {
            Command::Submit { spec, request, user, trace } => {
                Outcome::Submitted(self.submit_traced(spec, request.as_ref(), user.as_deref(), *trace))
            }
            Command::Clock { at_ms } => {
                let (now_ms, expired) = self.advance_clock_expiring(*at_ms);
                Outcome::Clock { now_ms, expired }
            }
            Command::Propose(ps) => Outcome::Decided(ps.iter().map(|p| self.propose(p)).collect()),
            Command::Migrate(ps) => Outcome::Decided(ps.iter().map(|p| self.migrate(p)).collect()),
            Command::Preempt(p) => Outcome::Decided(vec![self.preempt(p)]),
            Command::SetServiceQueue { job, queue } => Outcome::Ended(self.set_service_queue(*job, *queue)),
            Command::Release { job, failed } => Outcome::Ended(self.release(*job, *failed)),
            Command::Cancel { job, reason, grace_s } => {
                Outcome::Ended(self.cancel_with(*job, reason.clone(), *grace_s))
            }
            Command::SetHealth { server, health, at_ms } => {
                Outcome::HealthSet(self.set_health_at(*server, *health, *at_ms))
            }
            Command::Cordon { server, cordon } => Outcome::HealthSet(self.cordon(*server, cordon.clone())),
            Command::Uncordon { server, at_ms } => Outcome::HealthSet(self.uncordon(*server, *at_ms)),
            Command::Evict { server, at_ms } => Outcome::HealthSet(self.evict(*server, *at_ms)),
            Command::Task { job, proposal, member, server, event } => {
                Outcome::TaskReported(self.task_event(*job, *proposal, *member, *server, event))
            }
            Command::SetUnhealthyDevices { server, devices } => {
                Outcome::DevicesSet(self.set_unhealthy_devices(*server, *devices))
            }
            Command::AddConfigSet { rack, ib_domain, topology } => Outcome::Layout(
                self.add_config_set(rack, ib_domain, topology)
                    .map(|cs| LayoutChange { config_set: Some(cs), ..LayoutChange::default() }),
            ),
            Command::AddServers { config_set, names, at_ms } => {
                Outcome::Layout(self.add_servers(*config_set, names, *at_ms))
            }
            Command::RemoveServer { server, at_ms } => {
                Outcome::Layout(self.remove_server(*server, *at_ms).map(|()| LayoutChange::default()))
            }
            Command::RemoveConfigSet { config_set } => {
                Outcome::Layout(self.remove_config_set(*config_set).map(|()| LayoutChange::default()))
            }
            Command::SetQuota { tenant, gpus, class: None } => Outcome::Policy(self.set_quota(tenant, *gpus)),
            Command::SetQuota { tenant, gpus, class: Some(class) } => {
                Outcome::Policy(self.set_class_quota(tenant, class, *gpus))
            }
            Command::SetPriorityClass { class, priority } => Outcome::Policy(self.set_priority_class(class, *priority)),
            Command::SetRevocation { fingerprint, revocation } => {
                Outcome::Policy(self.set_revocation(fingerprint, revocation.as_ref()))
            }
        }
    }

    /// The view's clock: the largest leader clock applied, Unix milliseconds (0 before any).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Moves the view's clock to `at_ms` unless it is already later, and drops the usage
    /// buckets the retention no longer keeps; returns the clock. A simulator calls it with
    /// virtual time.
    pub fn advance_clock(&mut self, at_ms: u64) -> u64 {
        self.advance_clock_expiring(at_ms).0
    }

    /// [`ClusterView::advance_clock`], and fails every job whose placement's time limit
    /// ([`crate::job::RunSettings::time_limit_s`]) the new clock reached (one version each);
    /// returns the clock and those jobs.
    pub fn advance_clock_expiring(&mut self, at_ms: u64) -> (u64, Vec<JobId>) {
        if at_ms <= self.now_ms {
            return (self.now_ms, Vec::new());
        }
        self.now_ms = at_ms;
        self.ledger.prune(at_ms);
        // Queues first: a job whose time limit ends now held its GPUs up to now, and what it
        // attained by then must show in its queue before it is released.
        self.advance_service_queues(at_ms);
        let mut expired = Vec::new();
        while let Some(&(deadline, job)) = self.deadlines.first()
            && deadline <= at_ms
        {
            let Some(j) = self.jobs.get(&job) else {
                self.deadlines.remove(&(deadline, job));
                continue;
            };
            let limit = j.spec.run.time_limit_s.unwrap_or(0);
            let why = format!("time limit of {limit} s reached (placed at {} ms, clock {at_ms} ms)", j.times.placed_ms);
            self.bump();
            self.free_placement(job);
            if let Some(j) = self.jobs.get_mut(&job) {
                j.error = Some(why);
            }
            self.end_job(job, JobState::Failed);
            // free_placement dropped its deadline; a stale entry must not loop.
            self.deadlines.remove(&(deadline, job));
            expired.push(job);
        }
        (self.now_ms, expired)
    }

    /// The earliest time limit of a placement held now, or time a placed job reaches its next
    /// attained-service threshold (Unix ms), if any: the leader writes a clock entry when it
    /// passes on an otherwise idle log.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let limit = self.deadlines.first().map(|(d, _)| *d);
        limit.into_iter().chain(self.next_service_mark()).min()
    }

    /// The usage ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// This view with a usage ledger keeping `hours` (at least 1).
    pub fn with_usage_retention(mut self, hours: u32) -> ClusterView {
        let buckets: Vec<(UsageKey, Usage)> = self.ledger.buckets().map(|(k, u)| (k.clone(), *u)).collect();
        self.ledger = Ledger::from_buckets(hours, buckets);
        self.ledger.prune(self.now_ms);
        self
    }

    /// GPU and CPU-core time used within `[from_ms, to_ms)`, grouped `by` tenant, user or
    /// job, at most `limit` rows (the total counts every row). Placements still held are
    /// charged up to `now_ms` (the caller's present; the view's clock if later). Tenant and
    /// user rows come from the ledger (whole hours: `from_ms` rounds down, `to_ms` up) plus
    /// the placements held now; job rows come from the jobs still in the view, exact to the
    /// millisecond. With `tenants`, only those tenants' usage.
    pub fn usage_report(
        &self,
        from_ms: u64,
        to_ms: u64,
        by: UsageBy,
        now_ms: u64,
        tenants: Option<&[String]>,
        limit: usize,
    ) -> UsageReport {
        let now_ms = now_ms.max(self.now_ms);
        let wanted = |t: &str| tenants.is_none_or(|ts| ts.iter().any(|x| x == t));
        let mut rows: BTreeMap<(String, String, Option<JobId>), Usage> = BTreeMap::new();
        let user_of = |u: &str| if by == UsageBy::Tenant { String::new() } else { u.to_string() };
        match by {
            UsageBy::Job => {
                for j in self.jobs.values().filter(|j| wanted(&j.spec.tenant)) {
                    let u = j.usage_within(from_ms, to_ms, now_ms);
                    rows.entry((j.spec.tenant.clone(), j.user.clone(), Some(j.id))).or_default().add(u);
                }
            }
            UsageBy::Tenant | UsageBy::User => {
                for (k, u) in self.ledger.within(from_ms, to_ms).filter(|(k, _)| wanted(&k.tenant)) {
                    rows.entry((k.tenant.clone(), user_of(&k.user), None)).or_default().add(*u);
                }
                // Placements held now are charged to the ledger only when released: add them
                // over the same whole hours.
                let hour = crate::usage::HOUR_MS;
                let (lo, hi) = (from_ms / hour * hour, to_ms.div_ceil(hour).saturating_mul(hour));
                for j in self.jobs.values().filter(|j| wanted(&j.spec.tenant)) {
                    if let Some(s) = j.holding_span(now_ms) {
                        rows.entry((j.spec.tenant.clone(), user_of(&j.user), None))
                            .or_default()
                            .add(s.usage_within(lo, hi));
                    }
                }
            }
        }
        let rows = rows.into_iter().map(|((tenant, user, job), usage)| UsageRow { tenant, user, job, usage }).collect();
        UsageReport::new(from_ms, to_ms, by, rows, limit)
    }

    /// Releases a job's resources: it finished (`failed = false`) or failed.
    pub fn release(&mut self, job: JobId, failed: bool) -> Result<(), ViewError> {
        let j = self.jobs.get(&job).ok_or(ViewError::UnknownJob(job))?;
        if !j.state.holds_resources() {
            return Err(ViewError::BadJobState { job, state: j.state.as_str(), action: "release" });
        }
        self.bump();
        self.free_placement(job);
        self.end_job(job, if failed { JobState::Failed } else { JobState::Finished });
        Ok(())
    }

    /// Cancels a pending or running job.
    pub fn cancel(&mut self, job: JobId) -> Result<(), ViewError> {
        self.cancel_because(job, None)
    }

    /// Cancels a pending or running job, recording why as its error.
    pub fn cancel_because(&mut self, job: JobId, reason: Option<String>) -> Result<(), ViewError> {
        self.cancel_with(job, reason, None)
    }

    /// [`ClusterView::cancel_because`], giving its tasks `grace_s` seconds between SIGTERM and
    /// SIGKILL (over its spec's `stop_grace_s`; at most [`crate::job::MAX_STOP_GRACE_S`]).
    pub fn cancel_with(&mut self, job: JobId, reason: Option<String>, grace_s: Option<u64>) -> Result<(), ViewError> {
        let j = self.jobs.get(&job).ok_or(ViewError::UnknownJob(job))?;
        if let Some(g) = grace_s
            && g > crate::job::MAX_STOP_GRACE_S
        {
            return Err(ViewError::InvalidSpec(crate::error::FieldError::new(
                "grace_s",
                format!("must be at most {} seconds, got {g}", crate::job::MAX_STOP_GRACE_S),
            )));
        }
        match j.state {
            JobState::Finished | JobState::Failed => {
                Err(ViewError::BadJobState { job, state: j.state.as_str(), action: "cancel" })
            }
            s => {
                self.bump();
                if s.holds_resources() {
                    self.free_placement(job);
                }
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.error = Some(reason.unwrap_or_else(|| "cancelled".to_string()));
                    j.cancel_grace_s = grace_s;
                }
                self.end_job(job, JobState::Failed);
                Ok(())
            }
        }
    }

    /// Changes since `since`, or `None` when the change log no longer reaches back that far
    /// (the reader must take a [`ClusterView::snapshot`]).
    pub fn delta_since(&self, since: ViewVersion) -> Option<ViewDelta> {
        if since < self.log_floor || since > self.version {
            return None;
        }
        let mut servers: Vec<ServerId> = Vec::new();
        let mut jobs: Vec<JobId> = Vec::new();
        for (_, c) in self.log.iter().rev().take_while(|(v, _)| *v > since) {
            match c {
                Change::Server(s) => servers.push(*s),
                Change::Job(j) => jobs.push(*j),
            }
        }
        servers.sort_unstable();
        servers.dedup();
        jobs.sort_unstable();
        jobs.dedup();
        Some(ViewDelta {
            from: since,
            to: self.version,
            unhealthy: servers.iter().map(|s| self.unhealthy[s.index()]).collect(),
            servers: servers.into_iter().map(|s| (s, self.servers[s.index()])).collect(),
            jobs: jobs.into_iter().filter_map(|j| self.jobs.get(&j).cloned()).collect(),
        })
    }

    /// Calls `f` for each server changed after `since` (possibly more than once), or returns
    /// false when the change log no longer reaches back that far. Allocation-free.
    pub fn for_each_changed_server(&self, since: ViewVersion, mut f: impl FnMut(ServerId, &ServerRecord)) -> bool {
        if since < self.log_floor || since > self.version {
            return false;
        }
        for (_, c) in self.log.iter().rev().take_while(|(v, _)| *v > since) {
            if let Change::Server(s) = c {
                f(*s, &self.servers[s.index()]);
            }
        }
        true
    }

    // ---- internal mutation helpers, shared with the approver ----

    pub(crate) fn bump(&mut self) {
        self.version = ViewVersion(self.version.0 + 1);
    }

    pub(crate) fn note(&mut self, c: Change) {
        if self.log.len() >= self.log_cap
            && let Some((v, _)) = self.log.pop_front()
        {
            self.log_floor = self.log_floor.max(v);
        }
        self.log.push_back((self.version, c));
    }

    pub(crate) fn touch_server(&mut self, s: ServerId) {
        self.server_versions[s.index()] = self.version;
        self.note(Change::Server(s));
    }

    /// Returns a job's resources to its servers; asserts they were held.
    pub(crate) fn free_placement(&mut self, job: JobId) {
        self.unmark_service(job);
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let Some(span) = j.holding_span(self.now_ms) else {
            return self.free_members(job);
        };
        j.held.push(span);
        let (tenant, user) = (j.spec.tenant.clone(), j.user.clone());
        self.ledger.charge(&tenant, &user, &span);
        self.free_members(job);
    }

    /// Returns a job's placement's resources to its servers (no accounting).
    fn free_members(&mut self, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if let Some(d) = j.deadline_ms() {
            self.deadlines.remove(&(d, job));
        }
        let Some(p) = j.placement.take() else { return };
        self.placed.remove(&job);
        j.tasks.clear();
        let total = j.spec.total_gpus();
        let (tenant, priority) = (j.spec.tenant.clone(), j.spec.priority);
        for m in &p.members {
            let r = &mut self.servers[m.server.index()];
            assert_eq!(r.free_gpus & m.gpus, 0, "{job}: releasing devices that are already free on {}", m.server);
            assert!(!r.free_cores.intersects(m.cores), "{job}: releasing cores that are already free on {}", m.server);
            r.give_back(m, self.unhealthy[m.server.index()]);
            self.touch_server(m.server);
        }
        if let Some(u) = self.tenant_used.get_mut(&tenant) {
            *u = u.saturating_sub(total);
        }
        self.unhold_rank(&tenant, priority, total);
        self.note(Change::Job(job));
    }

    /// Moves a live job to attained-service queue `queue`; an ended job is
    /// [`ViewError::BadJobState`]. Setting the queue it is in changes nothing.
    pub fn set_service_queue(&mut self, job: JobId, queue: u8) -> Result<(), ViewError> {
        let j = self.jobs.get(&job).ok_or(ViewError::UnknownJob(job))?;
        if matches!(j.state, JobState::Finished | JobState::Failed) {
            return Err(ViewError::BadJobState { job, state: j.state.as_str(), action: "change its service queue" });
        }
        // Never above the service the job attained, by the cluster's own thresholds.
        let queue = queue.max(self.priorities.service_queue(j.attained_gpu_ms(self.now_ms)));
        if j.service_queue == queue {
            return Ok(());
        }
        self.bump();
        if let Some(j) = self.jobs.get_mut(&job) {
            j.service_queue = queue;
        }
        self.note(Change::Job(job));
        Ok(())
    }

    /// Releases a job's placement whole and puts it back to pending, saying why.
    pub(crate) fn requeue(&mut self, job: JobId, why: String) {
        self.free_placement(job);
        if let Some(j) = self.jobs.get_mut(&job) {
            j.state = JobState::Pending;
            j.error = Some(why);
        }
        self.note(Change::Job(job));
    }

    /// Ends a job, then settles the jobs that waited for it
    /// ([`ClusterView::settle_dependents`]), and so on down the chain (a work list, not
    /// recursion: chains may be long).
    fn end_job(&mut self, job: JobId, state: JobState) {
        let mut ending = vec![(job, state)];
        while let Some((job, state)) = ending.pop() {
            let mut waited = Vec::new();
            if let Some(j) = self.jobs.get_mut(&job) {
                j.state = state;
                j.times.ended_ms = self.now_ms;
                waited = std::mem::take(&mut j.waiting_for);
            }
            self.note(Change::Job(job));
            self.ended.push_back(job);
            self.settle_dependents(job, state, waited, &mut ending);
        }
        while self.ended.len() > self.ended_kept {
            if let Some(old) = self.ended.pop_front()
                && let Some(j) = self.jobs.remove(&old)
            {
                for p in &j.proposals {
                    self.applied.remove(p);
                }
                if let Some(r) = j.request.clone() {
                    self.hand_on_request(&j, r);
                }
                if self.keep_forgotten {
                    self.forgotten.push(j);
                }
            }
        }
    }

    /// The request id of `gone`, a forgotten job: an array's passes to its lowest member still
    /// kept, so that a retried submission admits nothing while any member is remembered;
    /// otherwise it is forgotten with the job.
    fn hand_on_request(&mut self, gone: &Job, request: RequestId) {
        let heir = gone.array_first().and_then(|first| {
            let size = u64::from(gone.spec.array.unwrap_or(1));
            (first.0..first.0.saturating_add(size)).map(JobId).find(|m| self.jobs.contains_key(m))
        });
        match heir.and_then(|h| self.jobs.get_mut(&h)) {
            Some(h) => {
                h.request = Some(request.clone());
                let id = h.id;
                self.requests.insert(request, id);
                // Its record changed: watchers get it in the delta.
                self.note(Change::Job(id));
            }
            None => {
                self.requests.remove(&request);
            }
        }
    }
}

fn index_of(v: &mut Vec<String>, ix: &mut HashMap<String, u32>, name: &str) -> u32 {
    if let Some(&i) = ix.get(name) {
        return i;
    }
    v.push(name.to_string());
    let i = (v.len() - 1) as u32;
    ix.insert(name.to_string(), i);
    i
}

#[cfg(test)]
mod tests;
