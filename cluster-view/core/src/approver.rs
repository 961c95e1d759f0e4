//! The approver: validates a gang proposal against the view and applies it atomically.
//!
//! Validation order: the proposal id (idempotency), the job, the gang's shape (member count,
//! servers, device and core ranges, counts, memory, device type), intra-gang overlap, locality
//! against the job's tolerance, the tenant's quota, and finally what is free. Shape errors stop
//! at the first problem; free-resource conflicts are gathered over every member so that the
//! decision carries the fresh state of every stale server at once. Apply takes every member or
//! none: nothing is written until every member has passed.
//!
//! A *move* ([`ClusterView::migrate`], the migration planner's transaction) goes through the same
//! checks for a job that already holds a placement: its new members are validated against the
//! records net of its own current placement, and apply releases the old placement and takes the
//! new one in one step, idempotent on the move's proposal id like any proposal.

use crate::config_set::ConfigSet;
use crate::fit;
use crate::ids::ServerId;
use crate::job::{Job, JobSpec, JobState, TaskState};
use crate::locality::LocalityLevel;
use crate::placement::{Decision, GangPlacement, MemberPlacement, Proposal, Rejection};
use crate::server::ServerRecord;
use crate::topology::Topology;
use crate::view::{Change, ClusterView};
use std::collections::HashMap;

/// Whether `job` may be placed now: it is pending and waits for no other job.
pub(crate) fn placeable(job: &Job) -> Result<(), Rejection> {
    if job.state != JobState::Pending {
        return Err(Rejection::JobNotPending { state: job.state.as_str().to_string() });
    }
    match job.waiting_for.first() {
        Some((first, _)) => Err(Rejection::DependencyPending { first: *first, count: job.waiting_for.len() as u32 }),
        None => Ok(()),
    }
}

/// Members beyond which overlap detection switches from a scan to a map.
const SCAN_LIMIT: usize = 16;
/// Most server records a rejection carries.
pub const FRESH_CAP: usize = 256;
/// Most change-log entries a rejection scans for servers changed since the proposal's version.
const FRESH_SCAN: usize = 4 * FRESH_CAP;

impl ClusterView {
    /// Validates and, if valid, applies a proposal. Idempotent on the proposal id.
    pub fn propose(&mut self, p: &Proposal) -> Decision {
        match self.precheck(p) {
            Ok(level) => {
                self.bump();
                self.take(p, level, JobState::Placed);
                Decision::Accepted { job: p.job, proposal: p.id, level, version: self.version }
            }
            Err(decision) => decision,
        }
    }

    /// Moves a job that holds a placement to `p.members`, atomically: its current placement is
    /// released and the new one taken in one step, or nothing changes. The new members are
    /// validated like a proposal's (shape, locality, health, free resources) against the records
    /// net of the job's own current placement, so a move may reuse some of the job's devices.
    /// The job becomes [`JobState::Migrating`] on the new placement, and running again once every
    /// new member reports started. Idempotent on the proposal id, like [`ClusterView::propose`].
    pub fn migrate(&mut self, p: &Proposal) -> Decision {
        match self.precheck_move(p) {
            Ok(level) => {
                self.bump();
                self.free_placement(p.job);
                self.take(p, level, JobState::Migrating);
                Decision::Accepted { job: p.job, proposal: p.id, level, version: self.version }
            }
            Err(decision) => decision,
        }
    }

    /// Everything [`ClusterView::migrate`] decides, without applying.
    pub fn precheck_move(&self, p: &Proposal) -> Result<LocalityLevel, Decision> {
        if let Some(d) = self.idempotency(p) {
            return Err(d);
        }
        let Some(job) = self.jobs.get(&p.job) else {
            return Err(self.reject(p, Rejection::UnknownJob, &[]));
        };
        if !matches!(job.state, JobState::Placed | JobState::Running) {
            return Err(self.reject(p, Rejection::NotMovable { state: job.state.as_str().to_string() }, &[]));
        }
        self.validate_members(p, job, &[job]).map_err(|(reason, stale)| self.reject(p, reason, &stale))
    }

    /// The decision for a proposal id that was applied before, if it was.
    pub(crate) fn idempotency(&self, p: &Proposal) -> Option<Decision> {
        let &owner = self.applied.get(&p.id)?;
        if owner != p.job {
            return Some(self.reject(p, Rejection::ProposalIdReused { other: owner }, &[]));
        }
        let current = self.jobs.get(&p.job).and_then(|j| j.placement.as_ref()).map(|pl| pl.proposal);
        if current == Some(p.id) {
            return Some(Decision::AlreadyApplied { job: p.job, proposal: p.id, version: self.version });
        }
        Some(self.reject(p, Rejection::ProposalSpent, &[]))
    }

    /// Everything [`ClusterView::propose`] decides, without applying: `Ok(level)` if the
    /// proposal would be accepted now, else the decision it would get (already applied, or
    /// rejected with its fresh records). The replicated leader pre-checks with this before
    /// spending a log entry; apply re-checks on every replica.
    pub fn precheck(&self, p: &Proposal) -> Result<LocalityLevel, Decision> {
        if let Some(d) = self.idempotency(p) {
            return Err(d);
        }
        self.validate(p).map_err(|(reason, stale)| self.reject(p, reason, &stale))
    }

    /// Checks a proposal without applying it. On success returns the gang's locality level; on
    /// failure the first reason and the servers whose state conflicted.
    pub fn validate(&self, p: &Proposal) -> Result<LocalityLevel, (Rejection, Vec<ServerId>)> {
        let fail = |r: Rejection| Err((r, Vec::new()));
        let Some(job) = self.jobs.get(&p.job) else {
            return fail(Rejection::UnknownJob);
        };
        if let Err(r) = placeable(job) {
            return fail(r);
        }
        self.validate_members(p, job, &[])
    }

    /// The member checks of [`ClusterView::validate`] for `job`, against the records with the
    /// resources of the `released` jobs given back: the job itself for a move, the victims for a
    /// preemption. Their GPUs do not count against their tenants' quotas either. A move is not
    /// checked against quotas at all: it changes where a job's GPUs are, not how many its tenant
    /// holds, so a tenant above a lowered quota can still have its jobs moved (drained, repacked)
    /// instead of losing them.
    pub(crate) fn validate_members(
        &self,
        p: &Proposal,
        job: &Job,
        released: &[&Job],
    ) -> Result<LocalityLevel, (Rejection, Vec<ServerId>)> {
        let spec = &job.spec;
        let held = || released.iter().filter_map(|j| j.placement.as_ref()).flat_map(|g| g.members.iter());
        let (level, claims) = self.gang_shape(p, spec).map_err(|r| (r, Vec::new()))?;
        let mut first: Option<Rejection> = None;
        let mut stale: Vec<ServerId> = Vec::new();
        let moving = released.iter().any(|r| r.id == job.id);
        if let Some(&quota) = self.quotas.get(&spec.tenant).filter(|_| !moving) {
            let own: u32 = released
                .iter()
                .filter(|j| j.placement.is_some() && j.spec.tenant == spec.tenant)
                .map(|j| j.spec.total_gpus())
                .sum();
            let used = self.tenant_used(&spec.tenant).saturating_sub(own);
            if used + spec.total_gpus() > quota {
                first = Some(Rejection::QuotaExceeded {
                    tenant: spec.tenant.clone(),
                    class: None,
                    quota,
                    used,
                    asked: spec.total_gpus(),
                });
            }
        }
        // Its tenant's quotas at its class and at the classes below it, net of what the
        // released gangs of that tenant hold at those ranks.
        for (class, floor, quota) in self.class_limits(&spec.tenant, spec.priority) {
            if first.is_some() || moving {
                break;
            }
            let own: u32 = released
                .iter()
                .filter(|j| j.placement.is_some() && j.spec.tenant == spec.tenant && j.spec.priority >= floor)
                .map(|j| j.spec.total_gpus())
                .sum();
            let used = self.held_at_or_above(&spec.tenant, floor).saturating_sub(own);
            if used + spec.total_gpus() > quota {
                first = Some(Rejection::QuotaExceeded {
                    tenant: spec.tenant.clone(),
                    class: Some(class.to_string()),
                    quota,
                    used,
                    asked: spec.total_gpus(),
                });
            }
        }
        for m in claims {
            let mut rec = self.servers[m.server.index()];
            for h in held().filter(|h| h.server == m.server) {
                rec.give_back(h, self.unhealthy[m.server.index()]);
            }
            if let Err(r) = fit::check_member_free(&rec, &m) {
                first.get_or_insert(r);
                stale.push(m.server);
            }
        }
        match first {
            None => Ok(level),
            Some(r) => Err((r, stale)),
        }
    }

    /// What [`ClusterView::validate_members`] decides of `p`'s members before quotas and free
    /// resources: their count, servers, device type, shapes (devices, cores and memory of what a
    /// member of `spec` asks), no overlap between members on one server, and the gang's level
    /// within `spec.tolerate`. Returns the level and the members merged per server (what the
    /// gang takes of each). The leader's migration check reads it too.
    pub(crate) fn gang_shape(
        &self,
        p: &Proposal,
        spec: &JobSpec,
    ) -> Result<(LocalityLevel, Vec<MemberPlacement>), Rejection> {
        if p.members.len() != spec.members as usize {
            return Err(Rejection::WrongMemberCount { expected: spec.members, got: p.members.len() as u32 });
        }
        // Shape of every member, and each member's resources net of earlier members of the gang.
        let mut claims = Claims::new(p.members.len());
        for (i, m) in p.members.iter().enumerate() {
            let member = i as u32;
            let Some(rec) = self.servers.get(m.server.index()) else {
                return Err(Rejection::UnknownServer { member, server: m.server });
            };
            let topo = self.topology_of(rec.config_set);
            if let Some(want) = &spec.gpu_type
                && *want != topo.device_type
            {
                return Err(Rejection::WrongGpuType {
                    member,
                    server: m.server,
                    expected: want.clone(),
                    got: topo.device_type.clone(),
                });
            }
            let req = fit::member_request(spec, topo);
            fit::check_member_shape(topo, m, &req, member)?;
            if !claims.add(m) {
                return Err(Rejection::OverlapWithinGang { server: m.server });
            }
        }
        let level = self.gang_level(&p.members);
        if level > spec.tolerate {
            return Err(Rejection::LocalityTooLoose { achieved: level, tolerate: spec.tolerate });
        }
        Ok((level, claims.merged))
    }

    /// The locality level a set of members achieves.
    pub fn gang_level(&self, members: &[MemberPlacement]) -> LocalityLevel {
        gang_level(&self.topologies, &self.config_sets, &self.servers, members)
    }

    /// Writes a validated placement (the caller bumped the version) and puts the job in `state`.
    pub(crate) fn take(&mut self, p: &Proposal, level: LocalityLevel, state: JobState) {
        for m in &p.members {
            let r = &mut self.servers[m.server.index()];
            // Second line of defence: validation proved these; a failure here is a bug.
            assert_eq!(m.gpus & !r.free_gpus, 0, "{}: devices of {} not free at apply", p.job, m.server);
            assert!(m.cores.is_subset_of(r.free_cores), "{}: cores of {} not free at apply", p.job, m.server);
            assert!(m.memory_mib <= r.free_memory_mib, "{}: memory of {} not free at apply", p.job, m.server);
            r.free_gpus &= !m.gpus;
            r.free_cores = r.free_cores.without(m.cores);
            r.free_memory_mib -= m.memory_mib;
            self.touch_server(m.server);
        }
        let version = self.version;
        let job = self.jobs.get_mut(&p.job).expect("validated job exists");
        job.state = state;
        job.placement = Some(GangPlacement { proposal: p.id, members: p.members.clone(), level, placed_at: version });
        job.proposals.push(p.id);
        job.tasks = vec![TaskState::Starting; p.members.len()];
        (job.times.placed_ms, job.times.started_ms) = (self.now_ms, 0);
        if let Some(d) = job.deadline_ms() {
            self.deadlines.insert((d, p.job));
        }
        self.placed.insert(p.job);
        let (tenant, total, priority) = (job.spec.tenant.clone(), job.spec.total_gpus(), job.spec.priority);
        self.hold_rank(&tenant, priority, total);
        *self.tenant_used.entry(tenant).or_default() += total;
        self.applied.insert(p.id, p.job);
        self.note(Change::Job(p.job));
        self.mark_service(p.job);
    }

    /// A rejection. Its `fresh` records start with the conflicting servers and, for a conflict,
    /// go on with the servers changed since the version the proposal was planned on (newest
    /// first, up to [`FRESH_CAP`] in all), so the scheduler catches up on exactly what it
    /// missed without re-reading the view.
    pub(crate) fn reject(&self, p: &Proposal, reason: Rejection, stale: &[ServerId]) -> Decision {
        let mut ids: Vec<ServerId> = stale.to_vec();
        if reason.is_conflict() {
            for (v, c) in self.log.iter().rev().take(FRESH_SCAN) {
                if *v <= p.based_on || ids.len() >= FRESH_CAP {
                    break;
                }
                if let Change::Server(s) = c
                    && !ids.contains(s)
                {
                    ids.push(*s);
                }
            }
        }
        Decision::Rejected {
            job: p.job,
            proposal: p.id,
            reason,
            fresh: ids.into_iter().map(|s| (s, self.servers[s.index()])).collect(),
            version: self.version,
        }
    }
}

/// The locality level `members` achieve: one server → the tightest intra-server group holding
/// all their devices; several → `rack`, `ib-domain` or `any`. Shared by the approver and the
/// schedulers' search so both name levels alike.
pub fn gang_level(
    topologies: &[Topology],
    config_sets: &[ConfigSet],
    servers: &[ServerRecord],
    members: &[MemberPlacement],
) -> LocalityLevel {
    let Some(first) = members.first() else { return LocalityLevel::PcieSwitch };
    let cs_of = |m: &MemberPlacement| &config_sets[servers[m.server.index()].config_set.index()];
    let c0 = cs_of(first);
    if members.iter().all(|m| m.server == first.server) {
        let all = members.iter().fold(0u64, |a, m| a | m.gpus);
        return topologies[c0.topology as usize].level_of(all);
    }
    if members.iter().all(|m| cs_of(m).rack == c0.rack) {
        LocalityLevel::Rack
    } else if members.iter().all(|m| cs_of(m).ib_domain == c0.ib_domain) {
        LocalityLevel::IbDomain
    } else {
        LocalityLevel::Any
    }
}

/// The resources a gang claims, merged per server, with overlap detection.
struct Claims {
    merged: Vec<MemberPlacement>,
    by_server: Option<HashMap<ServerId, usize>>,
}

impl Claims {
    fn new(members: usize) -> Claims {
        Claims { merged: Vec::with_capacity(members), by_server: (members > SCAN_LIMIT).then(HashMap::new) }
    }

    /// Adds a member; false if it overlaps an earlier member on the same server.
    fn add(&mut self, m: &MemberPlacement) -> bool {
        let found = match &self.by_server {
            Some(map) => map.get(&m.server).copied(),
            None => self.merged.iter().position(|x| x.server == m.server),
        };
        match found {
            Some(i) => {
                let x = &mut self.merged[i];
                if x.gpus & m.gpus != 0 || x.cores.intersects(m.cores) {
                    return false;
                }
                x.gpus |= m.gpus;
                x.cores = x.cores.or(m.cores);
                x.memory_mib = x.memory_mib.saturating_add(m.memory_mib);
            }
            None => {
                if let Some(map) = &mut self.by_server {
                    map.insert(m.server, self.merged.len());
                }
                self.merged.push(*m);
            }
        }
        true
    }
}
