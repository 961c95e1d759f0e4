//! Snapshots of the view and its state hash: what a replica sends a lagging peer or writes
//! to disk ([`ViewSnapshot`], [`ClusterView::snapshot`], [`ClusterView::from_snapshot`]), and
//! the hash replicas compare to prove they hold the same state ([`ClusterView::state_hash`]).
//! A view rebuilt from its snapshot derives its indexes (deadlines, attained-service marks,
//! dependents) again, and hashes equal to the view it was taken from.

use super::*;

impl ViewSnapshot {
    /// GPUs each tenant's placed gangs hold (what its quota bounds); tenants holding none are
    /// absent.
    pub fn tenant_used(&self) -> HashMap<String, u32> {
        let mut used: HashMap<String, u32> = HashMap::new();
        for j in self.jobs.iter().filter(|j| j.placement.is_some()) {
            *used.entry(j.spec.tenant.clone()).or_default() += j.spec.total_gpus();
        }
        used
    }

    /// The same by the jobs' priorities (what class quotas bound); priorities holding none are
    /// absent.
    pub fn rank_used(&self) -> HashMap<String, BTreeMap<i32, u32>> {
        let mut used: HashMap<String, BTreeMap<i32, u32>> = HashMap::new();
        for j in self.jobs.iter().filter(|j| j.placement.is_some()) {
            *used.entry(j.spec.tenant.clone()).or_default().entry(j.spec.priority).or_default() += j.spec.total_gpus();
        }
        used
    }
}

/// A whole view, enough to rebuild an identical [`ClusterView`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ViewSnapshot {
    /// Its version.
    pub version: ViewVersion,
    /// Topology table.
    pub topologies: Vec<Topology>,
    /// Configuration sets.
    pub config_sets: Vec<ConfigSet>,
    /// Rack names.
    pub racks: Vec<String>,
    /// InfiniBand domain names.
    pub ib_domains: Vec<String>,
    /// Server records, by id.
    pub servers: Vec<ServerRecord>,
    /// Server names, by id.
    pub server_names: Vec<String>,
    /// Jobs, by id.
    pub jobs: Vec<Job>,
    /// Tenant quotas.
    pub quotas: BTreeMap<String, u32>,
    /// Tenants' quotas at a priority class and above: tenant → class → GPUs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub class_quotas: BTreeMap<String, BTreeMap<String, u32>>,
    /// Priority classes and the preemption bound.
    #[serde(default)]
    pub priorities: Priorities,
    /// The next job id.
    pub next_job: u64,
    /// Ended jobs still kept, in the order they ended (the oldest is forgotten first).
    pub ended: Vec<JobId>,
    /// How many ended jobs are kept.
    pub ended_jobs_kept: u64,
    /// Unhealthy devices per server, by id (empty when none ever was).
    #[serde(default)]
    pub unhealthy: Vec<u64>,
    /// Cordoned servers, by id.
    #[serde(default)]
    pub cordons: Vec<(ServerId, Cordon)>,
    /// Each server's latest health changes, oldest first (servers without any are absent).
    #[serde(default)]
    pub health_history: Vec<(ServerId, Vec<HealthChange>)>,
    /// The view's clock, Unix milliseconds (0: no clock applied yet).
    #[serde(default)]
    pub now_ms: u64,
    /// How many hours the usage ledger keeps.
    #[serde(default = "default_usage_retention")]
    pub usage_retention_hours: u32,
    /// The usage ledger's buckets, oldest hour first.
    #[serde(default)]
    pub usage: Vec<(UsageKey, Usage)>,
    /// Revoked credentials, by fingerprint ([`crate::revocation`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revocations: Vec<(String, crate::revocation::Revocation)>,
    /// The version at which the revocation list last changed (0: never).
    #[serde(default, skip_serializing_if = "is_zero_version")]
    pub revocations_changed: ViewVersion,
}

fn is_zero_version(v: &ViewVersion) -> bool {
    v.0 == 0
}

fn default_usage_retention() -> u32 {
    crate::usage::DEFAULT_USAGE_RETENTION_HOURS
}

impl ClusterView {
    /// The whole view.
    pub fn snapshot(&self) -> ViewSnapshot {
        ViewSnapshot {
            version: self.version,
            topologies: self.topologies.clone(),
            config_sets: self.config_sets.clone(),
            racks: self.racks.clone(),
            ib_domains: self.ib_domains.clone(),
            servers: self.servers.clone(),
            server_names: self.server_names.clone(),
            jobs: self.jobs().into_iter().cloned().collect(),
            quotas: self.quotas.clone(),
            class_quotas: self.class_quotas.clone(),
            priorities: self.priorities.clone(),
            next_job: self.next_job,
            ended: self.ended.iter().copied().collect(),
            ended_jobs_kept: self.ended_kept as u64,
            unhealthy: if self.unhealthy.iter().any(|u| *u != 0) { self.unhealthy.clone() } else { Vec::new() },
            cordons: self.cordons.iter().map(|(s, c)| (*s, c.clone())).collect(),
            health_history: self.health_history.iter().map(|(s, h)| (*s, h.iter().cloned().collect())).collect(),
            now_ms: self.now_ms,
            usage_retention_hours: self.ledger.retention_hours(),
            usage: self.ledger.buckets().map(|(k, u)| (k.clone(), *u)).collect(),
            revocations: self.revocations.iter().map(|(f, r)| (f.clone(), r.clone())).collect(),
            revocations_changed: self.revocations_changed,
        }
    }

    /// Rebuilds a view from a snapshot; derived tables are recomputed. The change log starts
    /// empty at the snapshot's version.
    pub fn from_snapshot(s: ViewSnapshot) -> ClusterView {
        let tenant_used = s.tenant_used();
        let rank_used = s.rank_used();
        let mut applied = HashMap::new();
        let mut requests = HashMap::new();
        for j in &s.jobs {
            if let Some(r) = &j.request {
                requests.insert(r.clone(), j.id);
            }
            for &p in &j.proposals {
                applied.insert(p, j.id);
            }
        }
        let ended: VecDeque<JobId> = s.ended.iter().copied().collect();
        let count = s.servers.len();
        let mut unhealthy = s.unhealthy;
        unhealthy.resize(count, 0);
        ClusterView {
            version: s.version,
            server_by_name: s.server_names.iter().enumerate().map(|(i, n)| (n.clone(), ServerId(i as u32))).collect(),
            topologies: s.topologies,
            config_sets: s.config_sets,
            racks: s.racks,
            ib_domains: s.ib_domains,
            servers: s.servers,
            server_names: s.server_names,
            server_versions: vec![s.version; count],
            unhealthy,
            cordons: s.cordons.into_iter().collect(),
            health_history: s.health_history.into_iter().map(|(id, h)| (id, h.into_iter().collect())).collect(),
            now_ms: s.now_ms,
            ledger: Ledger::from_buckets(s.usage_retention_hours, s.usage),
            jobs: s.jobs.into_iter().map(|j| (j.id, j)).collect(),
            ended,
            ended_kept: s.ended_jobs_kept.min(usize::MAX as u64) as usize,
            next_job: s.next_job,
            applied,
            requests,
            quotas: s.quotas,
            class_quotas: s.class_quotas,
            priorities: s.priorities,
            revocations: s.revocations.into_iter().collect(),
            revocations_changed: s.revocations_changed,
            tenant_used,
            rank_used,
            log: VecDeque::new(),
            log_cap: DEFAULT_CHANGE_LOG,
            log_floor: s.version,
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

    /// A hash of the replicated state (not of the change log or caches). Replicas that
    /// applied the same commands have equal hashes.
    pub fn state_hash(&self) -> u64 {
        let mut h = self.hasher_without_names();
        // The layout's tables (they change only by layout commands, and only grow).
        for t in &self.topologies {
            h.str(&t.name);
            h.str(&t.device_type);
            h.u64(((t.devices as u64) << 32) | t.cores_per_socket as u64);
            h.u64(t.memory_mib as u64);
            for masks in [&t.sockets, &t.pcie_switches, &t.nvlink_groups] {
                h.u64(masks.len() as u64);
                for m in masks {
                    h.u64(*m);
                }
            }
        }
        for cs in &self.config_sets {
            h.str(&cs.name);
            h.u64(((cs.topology as u64) << 1) | cs.removed as u64);
            h.u64(((cs.rack as u64) << 32) | cs.ib_domain as u64);
        }
        for name in self.racks.iter().chain(&self.ib_domains).chain(&self.server_names) {
            h.str(name);
        }
        // Quotas (an admin may change them; see `policy`).
        for (tenant, gpus) in &self.quotas {
            h.str(tenant);
            h.u64(u64::from(*gpus));
        }
        for (tenant, classes) in &self.class_quotas {
            for (class, gpus) in classes {
                h.str(tenant);
                h.str(class);
                h.u64(u64::from(*gpus));
            }
        }
        // Revoked credentials (hashed only when some are, so views without any hash as before).
        for (fp, r) in &self.revocations {
            h.str(fp);
            h.str(&r.subject);
            h.str(&r.note);
            h.u64(r.not_after_ms);
            h.u64(r.at_ms);
        }
        if !self.revocations.is_empty() || self.revocations_changed.0 != 0 {
            h.u64(self.revocations_changed.0);
        }
        h.finish()
    }

    /// A hash of the replicated state without the layout's tables (topology, configuration
    /// set, rack, domain and server names; the records that refer to them are in it). A
    /// cluster's identity is this hash of its starting view (`tessera-view-server`'s
    /// `cluster_identity`), kept as it was before layouts could change so that data directories
    /// and peers of earlier releases keep their identity.
    pub fn identity_hash(&self) -> u64 {
        self.hasher_without_names().finish()
    }

    fn hasher_without_names(&self) -> StateHasher {
        let mut h = StateHasher::default();
        h.u64(self.version.0);
        h.u64(self.next_job);
        h.u64(self.priorities.max_preemptions as u64);
        for (class, p) in &self.priorities.classes {
            h.str(class);
            h.u64(*p as u32 as u64);
        }
        // Hashed only when set, so clusters without queues hash as before.
        for t in &self.priorities.attained_service_gpu_s {
            h.u64(*t);
        }
        for r in &self.servers {
            h.u64(r.free_gpus);
            h.u64(r.free_cores.0[0]);
            h.u64(r.free_cores.0[1]);
            h.u64(r.free_memory_mib as u64);
            h.u64(r.config_set.0 as u64);
            h.u64(r.health as u64);
        }
        for (i, u) in self.unhealthy.iter().enumerate().filter(|(_, u)| **u != 0) {
            h.u64(i as u64);
            h.u64(*u);
        }
        for (s, c) in &self.cordons {
            h.u64(s.0 as u64);
            h.str(&c.reason);
            h.u64(c.since_ms);
            h.u64(c.drain_by_ms.map_or(0, |d| d.saturating_add(1)));
        }
        for (s, changes) in &self.health_history {
            h.u64(s.0 as u64);
            for c in changes {
                h.u64(c.version.0);
                h.u64(c.at_ms);
                h.u64(c.health as u64);
                h.u64(c.cordoned as u64);
                h.str(&c.why);
            }
        }
        h.u64(self.now_ms);
        h.u64(self.ledger.retention_hours() as u64);
        for (k, u) in self.ledger.buckets() {
            h.u64(k.hour);
            h.str(&k.tenant);
            h.str(&k.user);
            h.u64(u.gpu_ms);
            h.u64(u.core_ms);
        }
        h.u64(self.ended_kept as u64);
        for j in &self.ended {
            h.u64(j.0);
        }
        for j in self.jobs() {
            h.u64(j.id.0);
            for p in &j.proposals {
                h.u64(p.0);
            }
            h.str(j.state.as_str());
            h.u64(j.submitted_at.0);
            for t in &j.tasks {
                h.str(t.as_str());
            }
            h.str(j.error.as_deref().unwrap_or(""));
            h.str(j.request.as_ref().map_or("", |r| r.as_str()));
            h.u64(j.preemptions as u64);
            h.u64(j.service_queue as u64);
            h.u64(j.spec.priority as u32 as u64);
            h.str(&j.user);
            for t in [j.times.submitted_ms, j.times.placed_ms, j.times.started_ms, j.times.ended_ms] {
                h.u64(t);
            }
            for s in &j.held {
                for x in [s.from_ms, s.to_ms, s.gpus as u64, s.cores as u64] {
                    h.u64(x);
                }
            }
            h.u64(j.restarts as u64);
            h.u64(j.not_before_ms);
            for (dep, must_finish) in &j.waiting_for {
                h.u64(dep.0);
                h.u64(*must_finish as u64);
            }
            h.u64(j.ready_ms);
            h.u64(j.array_index.map_or(0, |i| u64::from(i) + 1));
            h.u64(j.cancel_grace_s.map_or(0, |g| g.saturating_add(1)));
            // Only when present: the hash of a job without a trace is what it was before jobs
            // carried one.
            if let Some(t) = j.trace {
                h.u64((t.trace_id >> 64) as u64);
                h.u64(t.trace_id as u64);
                h.u64(t.span_id);
            }
            if let Some(p) = &j.placement {
                h.u64(p.proposal.0);
                h.u64(p.placed_at.0);
                h.u64(p.level.rank() as u64);
                for m in &p.members {
                    h.u64(m.server.0 as u64);
                    h.u64(m.gpus);
                    h.u64(m.cores.0[0]);
                    h.u64(m.cores.0[1]);
                    h.u64(m.memory_mib as u64);
                }
            }
        }
        h
    }
}
