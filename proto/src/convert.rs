//! Conversions between the core types of `tessera-view` and the wire types of [`crate::v1`].
//!
//! * Core to wire: `From<&Core> for v1::Wire` (and `From<Core>` for the `Copy` enums). These
//!   cannot fail and never produce an `UNSPECIFIED` enum value.
//! * Wire to core: `TryFrom<v1::Wire> for Core`, with [`WireError`]. These validate everything a
//!   buggy or hostile peer could get wrong (unknown or unspecified enums, absent sub-messages,
//!   ids that do not fit, masks beyond the device count, broken topologies, invalid job specs,
//!   inconsistent snapshots; see [`crate::validate`]) and never panic.
//!
//! Two conversions are asymmetric:
//!
//! * `MemberPlacement` has nothing to validate on its own, so the wire-to-core direction is a
//!   plain `From` (its ranges depend on the server, checked by the approver or by
//!   [`crate::validate::check_snapshot`]).
//! * A [`Rejection`] travels as its [`Rejection::code`], its `Display` text and
//!   [`Rejection::is_conflict`]; the structured reason is not rebuilt. A wire `Decision`
//!   therefore converts to a [`RemoteDecision`], which mirrors [`Decision`] with a
//!   [`RemoteRejection`] in place of the [`Rejection`]; `remote(&decision)` puts a
//!   local decision in the same form.
//!
//! `ServerRecord` and `ViewDelta` are checked structurally only: whether a record's masks fit its
//! server's topology depends on the view the reader holds.

use crate::error::WireError;
use crate::v1;
use crate::validate;
use std::collections::BTreeMap;
use std::fmt;
use tessera_view::job::MAX_MEMBERS;
use tessera_view::job::{RestartPolicy, RunSettings};
use tessera_view::placement::GangPlacement;
use tessera_view::preemption;
use tessera_view::server::{HEALTH_HISTORY, MAX_CORDON_REASON_CHARS, MAX_HEALTH_WHY_CHARS};
use tessera_view::{
    ConfigSet, ConfigSetId, CoreMask, CpuDemand, Decision, Health, Job, JobId, JobSpec, JobState, LocalityLevel,
    MemberPlacement, Predictor, Preemption, Priorities, Proposal, ProposalId, Rejection, RequestId, ServerId,
    ServerRecord, TaskState, Topology, ViewDelta, ViewError, ViewSnapshot, ViewVersion,
};
use tessera_view::{
    Cordon, HealthChange, HeldSpan, JobTimes, JobTrace, Revocation, Usage, UsageBy, UsageKey, UsageReport, UsageRow,
};

// ---------------------------------------------------------------- helpers

/// Reads an enum field: 0 (`UNSPECIFIED`) is missing, values this build does not know are errors.
fn wire_enum<E: TryFrom<i32>>(value: i32, message: &'static str, field: &'static str) -> Result<E, WireError> {
    if value == 0 {
        return Err(WireError::missing(message, field));
    }
    E::try_from(value).map_err(|_| WireError::UnknownEnum { message, field, value })
}

/// A required sub-message.
fn required<T>(v: Option<T>, message: &'static str, field: &'static str) -> Result<T, WireError> {
    v.ok_or(WireError::missing(message, field))
}

/// A 16-bit id or index carried as `uint32`.
fn u16_field(v: u32, message: &'static str, field: &'static str) -> Result<u16, WireError> {
    u16::try_from(v).map_err(|_| WireError::out_of_range(message, field, v.into(), "must fit 16 bits (0..=65535)"))
}

/// Converts every element, locating a failure as `field[i]`.
fn convert_all<W, T>(items: Vec<W>, field: &str) -> Result<Vec<T>, WireError>
where
    T: TryFrom<W, Error = WireError>,
{
    items.into_iter().enumerate().map(|(i, w)| T::try_from(w).map_err(|e| e.at(format!("{field}[{i}]")))).collect()
}

/// At most `MAX_MEMBERS` gang members.
fn member_count(n: usize, message: &'static str) -> Result<(), WireError> {
    if n > MAX_MEMBERS as usize {
        return Err(WireError::out_of_range(message, "members", n as u64, format!("at most {MAX_MEMBERS} members")));
    }
    Ok(())
}

// ---------------------------------------------------------------- enums

impl From<Health> for v1::Health {
    fn from(h: Health) -> Self {
        match h {
            Health::Up => v1::Health::Up,
            Health::Draining => v1::Health::Draining,
            Health::Down => v1::Health::Down,
            Health::Removed => v1::Health::Removed,
        }
    }
}

fn health(value: i32, message: &'static str, field: &'static str) -> Result<Health, WireError> {
    Ok(match wire_enum::<v1::Health>(value, message, field)? {
        v1::Health::Unspecified => return Err(WireError::missing(message, field)),
        v1::Health::Up => Health::Up,
        v1::Health::Draining => Health::Draining,
        v1::Health::Down => Health::Down,
        v1::Health::Removed => Health::Removed,
    })
}

impl TryFrom<v1::Health> for Health {
    type Error = WireError;
    fn try_from(h: v1::Health) -> Result<Self, WireError> {
        health(h as i32, "Health", "value")
    }
}

impl From<LocalityLevel> for v1::LocalityLevel {
    fn from(l: LocalityLevel) -> Self {
        match l {
            LocalityLevel::PcieSwitch => v1::LocalityLevel::PcieSwitch,
            LocalityLevel::Socket => v1::LocalityLevel::Socket,
            LocalityLevel::Server => v1::LocalityLevel::Server,
            LocalityLevel::Rack => v1::LocalityLevel::Rack,
            LocalityLevel::IbDomain => v1::LocalityLevel::IbDomain,
            LocalityLevel::Any => v1::LocalityLevel::Any,
        }
    }
}

fn locality(value: i32, message: &'static str, field: &'static str) -> Result<LocalityLevel, WireError> {
    Ok(match wire_enum::<v1::LocalityLevel>(value, message, field)? {
        v1::LocalityLevel::Unspecified => return Err(WireError::missing(message, field)),
        v1::LocalityLevel::PcieSwitch => LocalityLevel::PcieSwitch,
        v1::LocalityLevel::Socket => LocalityLevel::Socket,
        v1::LocalityLevel::Server => LocalityLevel::Server,
        v1::LocalityLevel::Rack => LocalityLevel::Rack,
        v1::LocalityLevel::IbDomain => LocalityLevel::IbDomain,
        v1::LocalityLevel::Any => LocalityLevel::Any,
    })
}

impl TryFrom<v1::LocalityLevel> for LocalityLevel {
    type Error = WireError;
    fn try_from(l: v1::LocalityLevel) -> Result<Self, WireError> {
        locality(l as i32, "LocalityLevel", "value")
    }
}

impl From<JobState> for v1::JobState {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Pending => v1::JobState::Pending,
            JobState::Placed => v1::JobState::Placed,
            JobState::Running => v1::JobState::Running,
            JobState::Migrating => v1::JobState::Migrating,
            JobState::Finished => v1::JobState::Finished,
            JobState::Failed => v1::JobState::Failed,
        }
    }
}

fn job_state(value: i32, message: &'static str, field: &'static str) -> Result<JobState, WireError> {
    Ok(match wire_enum::<v1::JobState>(value, message, field)? {
        v1::JobState::Unspecified => return Err(WireError::missing(message, field)),
        v1::JobState::Pending => JobState::Pending,
        v1::JobState::Placed => JobState::Placed,
        v1::JobState::Running => JobState::Running,
        v1::JobState::Migrating => JobState::Migrating,
        v1::JobState::Finished => JobState::Finished,
        v1::JobState::Failed => JobState::Failed,
    })
}

impl From<TaskState> for v1::TaskState {
    fn from(s: TaskState) -> Self {
        match s {
            TaskState::Starting => v1::TaskState::Starting,
            TaskState::Running => v1::TaskState::Running,
            TaskState::Succeeded => v1::TaskState::Succeeded,
        }
    }
}

fn task_state(value: i32) -> Result<TaskState, WireError> {
    Ok(match wire_enum::<v1::TaskState>(value, "Job", "tasks")? {
        v1::TaskState::Unspecified => return Err(WireError::missing("Job", "tasks")),
        v1::TaskState::Starting => TaskState::Starting,
        v1::TaskState::Running => TaskState::Running,
        v1::TaskState::Succeeded => TaskState::Succeeded,
    })
}

impl TryFrom<v1::JobState> for JobState {
    type Error = WireError;
    fn try_from(s: v1::JobState) -> Result<Self, WireError> {
        job_state(s as i32, "JobState", "value")
    }
}

// ---------------------------------------------------------------- topology and config sets

impl From<&Topology> for v1::Topology {
    fn from(t: &Topology) -> Self {
        v1::Topology {
            name: t.name.clone(),
            device_type: t.device_type.clone(),
            devices: t.devices,
            sockets: t.sockets.clone(),
            pcie_switches: t.pcie_switches.clone(),
            nvlink_groups: t.nvlink_groups.clone(),
            cores_per_socket: t.cores_per_socket,
            memory_mib: t.memory_mib,
        }
    }
}

/// Re-validated with [`validate::check_topology`].
impl TryFrom<v1::Topology> for Topology {
    type Error = WireError;
    fn try_from(w: v1::Topology) -> Result<Self, WireError> {
        let t = Topology {
            name: w.name,
            device_type: w.device_type,
            devices: w.devices,
            sockets: w.sockets,
            pcie_switches: w.pcie_switches,
            nvlink_groups: w.nvlink_groups,
            cores_per_socket: w.cores_per_socket,
            memory_mib: w.memory_mib,
        };
        validate::check_topology(&t)?;
        Ok(t)
    }
}

impl From<&ConfigSet> for v1::ConfigSet {
    fn from(c: &ConfigSet) -> Self {
        v1::ConfigSet {
            id: c.id.0.into(),
            name: c.name.clone(),
            topology: c.topology.into(),
            rack: c.rack,
            ib_domain: c.ib_domain,
            removed: c.removed,
        }
    }
}

impl TryFrom<v1::ConfigSet> for ConfigSet {
    type Error = WireError;
    fn try_from(w: v1::ConfigSet) -> Result<Self, WireError> {
        Ok(ConfigSet {
            id: ConfigSetId(u16_field(w.id, "ConfigSet", "id")?),
            name: w.name,
            topology: u16_field(w.topology, "ConfigSet", "topology")?,
            rack: w.rack,
            ib_domain: w.ib_domain,
            removed: w.removed,
        })
    }
}

// ---------------------------------------------------------------- server records

impl From<&ServerRecord> for v1::ServerRecord {
    fn from(r: &ServerRecord) -> Self {
        v1::ServerRecord {
            free_gpus: r.free_gpus,
            free_cores_lo: r.free_cores.0[0],
            free_cores_hi: r.free_cores.0[1],
            free_memory_mib: r.free_memory_mib,
            config_set: r.config_set.0.into(),
            health: v1::Health::from(r.health).into(),
        }
    }
}

impl TryFrom<v1::ServerRecord> for ServerRecord {
    type Error = WireError;
    fn try_from(w: v1::ServerRecord) -> Result<Self, WireError> {
        Ok(ServerRecord {
            free_gpus: w.free_gpus,
            free_cores: CoreMask([w.free_cores_lo, w.free_cores_hi]),
            free_memory_mib: w.free_memory_mib,
            config_set: ConfigSetId(u16_field(w.config_set, "ServerRecord", "config_set")?),
            health: health(w.health, "ServerRecord", "health")?,
        })
    }
}

impl From<(ServerId, &Cordon)> for v1::Cordon {
    fn from((s, c): (ServerId, &Cordon)) -> Self {
        v1::Cordon { server: s.0, reason: c.reason.clone(), since_ms: c.since_ms, drain_by_ms: c.drain_by_ms }
    }
}

impl TryFrom<v1::Cordon> for (ServerId, Cordon) {
    type Error = WireError;
    fn try_from(w: v1::Cordon) -> Result<Self, WireError> {
        if w.reason.chars().count() > MAX_CORDON_REASON_CHARS {
            let msg = format!("at most {MAX_CORDON_REASON_CHARS} characters");
            return Err(WireError::invalid("Cordon", "reason", msg));
        }
        Ok((ServerId(w.server), Cordon { reason: w.reason, since_ms: w.since_ms, drain_by_ms: w.drain_by_ms }))
    }
}

impl From<&HealthChange> for v1::HealthChange {
    fn from(c: &HealthChange) -> Self {
        v1::HealthChange {
            version: c.version.0,
            at_ms: c.at_ms,
            health: v1::Health::from(c.health).into(),
            cordoned: c.cordoned,
            why: c.why.clone(),
        }
    }
}

impl TryFrom<v1::HealthChange> for HealthChange {
    type Error = WireError;
    fn try_from(w: v1::HealthChange) -> Result<Self, WireError> {
        if w.why.chars().count() > MAX_HEALTH_WHY_CHARS {
            let msg = format!("at most {MAX_HEALTH_WHY_CHARS} characters");
            return Err(WireError::invalid("HealthChange", "why", msg));
        }
        Ok(HealthChange {
            version: ViewVersion(w.version),
            at_ms: w.at_ms,
            health: health(w.health, "HealthChange", "health")?,
            cordoned: w.cordoned,
            why: w.why,
        })
    }
}

impl TryFrom<v1::ServerHistory> for (ServerId, Vec<HealthChange>) {
    type Error = WireError;
    fn try_from(w: v1::ServerHistory) -> Result<Self, WireError> {
        if w.changes.len() > HEALTH_HISTORY {
            let msg = format!("at most {HEALTH_HISTORY} changes, got {}", w.changes.len());
            return Err(WireError::invalid("ServerHistory", "changes", msg));
        }
        Ok((ServerId(w.server), convert_all(w.changes, "changes")?))
    }
}

impl From<&(ServerId, ServerRecord)> for v1::ServerEntry {
    fn from((id, r): &(ServerId, ServerRecord)) -> Self {
        v1::ServerEntry { server_id: id.0, record: Some(r.into()) }
    }
}

impl TryFrom<v1::ServerEntry> for (ServerId, ServerRecord) {
    type Error = WireError;
    fn try_from(w: v1::ServerEntry) -> Result<Self, WireError> {
        let record = required(w.record, "ServerEntry", "record")?;
        Ok((ServerId(w.server_id), ServerRecord::try_from(record).map_err(|e| e.at("record"))?))
    }
}

// ---------------------------------------------------------------- job specs

impl From<&Predictor> for v1::Predictor {
    fn from(p: &Predictor) -> Self {
        v1::Predictor { p0: p.p0, p1: p.p1, p2: p.p2, theta: p.theta }
    }
}

/// Validated with [`validate::check_predictor`].
impl TryFrom<v1::Predictor> for Predictor {
    type Error = WireError;
    fn try_from(w: v1::Predictor) -> Result<Self, WireError> {
        let p = Predictor { p0: w.p0, p1: w.p1, p2: w.p2, theta: w.theta };
        validate::check_predictor(&p)?;
        Ok(p)
    }
}

impl From<&CpuDemand> for v1::CpuDemand {
    fn from(c: &CpuDemand) -> Self {
        use v1::cpu_demand::{Fixed, Kind, Predicted, Proportional};
        let kind = match *c {
            CpuDemand::Proportional => Kind::Proportional(Proportional {}),
            CpuDemand::Fixed { cores_per_gpu } => Kind::Fixed(Fixed { cores_per_gpu }),
            CpuDemand::Predicted { predictor, min_cores_per_gpu } => {
                Kind::Predicted(Predicted { predictor: Some((&predictor).into()), min_cores_per_gpu })
            }
        };
        v1::CpuDemand { kind: Some(kind) }
    }
}

/// Validated with [`validate::check_cpu_demand`].
impl TryFrom<v1::CpuDemand> for CpuDemand {
    type Error = WireError;
    fn try_from(w: v1::CpuDemand) -> Result<Self, WireError> {
        use v1::cpu_demand::Kind;
        let c = match required(w.kind, "CpuDemand", "kind")? {
            Kind::Proportional(_) => CpuDemand::Proportional,
            Kind::Fixed(f) => CpuDemand::Fixed { cores_per_gpu: f.cores_per_gpu },
            Kind::Predicted(p) => {
                let predictor = required(p.predictor, "CpuDemand.Predicted", "predictor")?;
                CpuDemand::Predicted {
                    predictor: Predictor::try_from(predictor).map_err(|e| e.at("predicted.predictor"))?,
                    min_cores_per_gpu: p.min_cores_per_gpu,
                }
            }
        };
        validate::check_cpu_demand(&c)?;
        Ok(c)
    }
}

impl From<&JobSpec> for v1::JobSpec {
    fn from(s: &JobSpec) -> Self {
        v1::JobSpec {
            name: s.name.clone(),
            tenant: s.tenant.clone(),
            gpu_type: s.gpu_type.clone(),
            members: s.members,
            gpus_per_member: s.gpus_per_member,
            prefer: v1::LocalityLevel::from(s.prefer).into(),
            tolerate: v1::LocalityLevel::from(s.tolerate).into(),
            relax_after_s: s.relax_after_s,
            slowdown: s
                .slowdown
                .iter()
                .map(|(&level, &slowdown)| v1::LocalitySlowdown {
                    level: v1::LocalityLevel::from(level).into(),
                    slowdown,
                })
                .collect(),
            cpu: Some((&s.cpu).into()),
            memory_mib_per_gpu: s.memory_mib_per_gpu,
            priority: s.priority,
            command: s.command.clone(),
            scheduler: s.scheduler.clone(),
            class: s.class.clone(),
            env: s.run.env.clone().into_iter().collect(),
            workdir: s.run.workdir.clone(),
            time_limit_s: s.run.time_limit_s,
            restart: s.run.restart.map(|r| v1::RestartPolicy { max: r.max, backoff_s: r.backoff_s }),
            stop_grace_s: s.run.stop_grace_s,
            after: s.after.iter().map(|j| j.0).collect(),
            after_any: s.after_any.iter().map(|j| j.0).collect(),
            array: s.array,
            model: s.model.clone(),
        }
    }
}

/// Validated with [`validate::check_job_spec`]; a level listed twice in `slowdown` is an error.
impl TryFrom<v1::JobSpec> for JobSpec {
    type Error = WireError;
    fn try_from(w: v1::JobSpec) -> Result<Self, WireError> {
        let mut slowdown = BTreeMap::new();
        for (i, s) in w.slowdown.iter().enumerate() {
            let level = locality(s.level, "LocalitySlowdown", "level").map_err(|e| e.at(format!("slowdown[{i}]")))?;
            if slowdown.insert(level, s.slowdown).is_some() {
                return Err(WireError::invalid("JobSpec", "slowdown", format!("level {level} is listed twice")));
            }
        }
        let cpu = required(w.cpu, "JobSpec", "cpu")?;
        let spec = JobSpec {
            name: w.name,
            tenant: w.tenant,
            gpu_type: w.gpu_type,
            members: w.members,
            gpus_per_member: w.gpus_per_member,
            prefer: locality(w.prefer, "JobSpec", "prefer")?,
            tolerate: locality(w.tolerate, "JobSpec", "tolerate")?,
            relax_after_s: w.relax_after_s,
            slowdown,
            cpu: CpuDemand::try_from(cpu).map_err(|e| e.at("cpu"))?,
            memory_mib_per_gpu: w.memory_mib_per_gpu,
            priority: w.priority,
            command: w.command,
            scheduler: w.scheduler,
            class: w.class,
            model: w.model,
            run: RunSettings {
                env: w.env.into_iter().collect(),
                workdir: w.workdir,
                time_limit_s: w.time_limit_s,
                restart: w.restart.map(|r| RestartPolicy { max: r.max, backoff_s: r.backoff_s }),
                stop_grace_s: w.stop_grace_s,
            },
            after: w.after.into_iter().map(JobId).collect(),
            after_any: w.after_any.into_iter().map(JobId).collect(),
            array: w.array,
        };
        validate::check_job_spec(&spec)?;
        Ok(spec)
    }
}

// ---------------------------------------------------------------- placements and jobs

impl From<&MemberPlacement> for v1::MemberPlacement {
    fn from(m: &MemberPlacement) -> Self {
        v1::MemberPlacement {
            server: m.server.0,
            gpus: m.gpus,
            cores_lo: m.cores.0[0],
            cores_hi: m.cores.0[1],
            memory_mib: m.memory_mib,
        }
    }
}

/// Infallible: every bit pattern is a well-formed member; ranges depend on the server.
impl From<v1::MemberPlacement> for MemberPlacement {
    fn from(w: v1::MemberPlacement) -> Self {
        MemberPlacement {
            server: ServerId(w.server),
            gpus: w.gpus,
            cores: CoreMask([w.cores_lo, w.cores_hi]),
            memory_mib: w.memory_mib,
        }
    }
}

impl From<&GangPlacement> for v1::GangPlacement {
    fn from(g: &GangPlacement) -> Self {
        v1::GangPlacement {
            proposal: g.proposal.0,
            members: g.members.iter().map(Into::into).collect(),
            level: v1::LocalityLevel::from(g.level).into(),
            placed_at: g.placed_at.0,
        }
    }
}

impl TryFrom<v1::GangPlacement> for GangPlacement {
    type Error = WireError;
    fn try_from(w: v1::GangPlacement) -> Result<Self, WireError> {
        member_count(w.members.len(), "GangPlacement")?;
        Ok(GangPlacement {
            proposal: ProposalId(w.proposal),
            level: locality(w.level, "GangPlacement", "level")?,
            members: w.members.into_iter().map(Into::into).collect(),
            placed_at: ViewVersion(w.placed_at),
        })
    }
}

impl From<&Job> for v1::Job {
    fn from(j: &Job) -> Self {
        v1::Job {
            id: j.id.0,
            spec: Some((&j.spec).into()),
            state: v1::JobState::from(j.state).into(),
            placement: j.placement.as_ref().map(Into::into),
            submitted_at: j.submitted_at.0,
            proposals: j.proposals.iter().map(|p| p.0).collect(),
            tasks: j.tasks.iter().map(|t| v1::TaskState::from(*t).into()).collect(),
            error: j.error.clone().unwrap_or_default(),
            request_id: j.request.as_ref().map(|r| r.as_str().to_string()).unwrap_or_default(),
            preemptions: j.preemptions,
            service_queue: j.service_queue.into(),
            user: j.user.clone(),
            times: Some(v1::JobTimes {
                submitted_ms: j.times.submitted_ms,
                placed_ms: j.times.placed_ms,
                started_ms: j.times.started_ms,
                ended_ms: j.times.ended_ms,
            }),
            held: j
                .held
                .iter()
                .map(|s| v1::HeldSpan { from_ms: s.from_ms, to_ms: s.to_ms, gpus: s.gpus, cores: s.cores })
                .collect(),
            restarts: j.restarts,
            not_before_ms: j.not_before_ms,
            waiting_for: j
                .waiting_for
                .iter()
                .map(|(d, must_finish)| v1::JobDependency { job: d.0, must_finish: *must_finish })
                .collect(),
            ready_ms: j.ready_ms,
            array_index: j.array_index,
            cancel_grace_s: j.cancel_grace_s,
            trace: j.trace.as_ref().map(Into::into),
        }
    }
}

impl From<&JobTrace> for v1::JobTrace {
    fn from(t: &JobTrace) -> Self {
        v1::JobTrace { trace_id: t.trace_id.to_be_bytes().to_vec(), span_id: t.span_id }
    }
}

/// A trace of 16 bytes and a span id, neither zero.
impl TryFrom<v1::JobTrace> for JobTrace {
    type Error = WireError;
    fn try_from(w: v1::JobTrace) -> Result<Self, WireError> {
        let bytes: [u8; 16] =
            w.trace_id.as_slice().try_into().map_err(|_| {
                WireError::invalid("JobTrace", "trace_id", format!("16 bytes, got {}", w.trace_id.len()))
            })?;
        JobTrace::new(u128::from_be_bytes(bytes), w.span_id)
            .ok_or_else(|| WireError::invalid("JobTrace", "trace_id", "a trace id or span id of 0"))
    }
}

/// Most held spans a job on the wire may carry.
pub const MAX_HELD_SPANS: usize = 4096;

/// Validated with [`validate::check_job`]: the placement is present exactly while the state
/// holds resources, and whole.
impl TryFrom<v1::Job> for Job {
    type Error = WireError;
    fn try_from(w: v1::Job) -> Result<Self, WireError> {
        let spec = required(w.spec, "Job", "spec")?;
        let job = Job {
            id: JobId(w.id),
            spec: JobSpec::try_from(spec).map_err(|e| e.at("spec"))?,
            state: job_state(w.state, "Job", "state")?,
            placement: w.placement.map(GangPlacement::try_from).transpose().map_err(|e| e.at("placement"))?,
            submitted_at: ViewVersion(w.submitted_at),
            proposals: w.proposals.into_iter().map(ProposalId).collect(),
            tasks: w.tasks.into_iter().map(task_state).collect::<Result<_, _>>()?,
            error: (!w.error.is_empty()).then_some(w.error),
            request: if w.request_id.is_empty() {
                None
            } else {
                Some(RequestId::new(w.request_id).map_err(|e| WireError::invalid("Job", "request_id", e.to_string()))?)
            },
            preemptions: w.preemptions,
            service_queue: u8::try_from(w.service_queue).map_err(|_| {
                WireError::invalid("Job", "service_queue", format!("0 to 255, got {}", w.service_queue))
            })?,
            user: w.user,
            times: w.times.map_or_else(JobTimes::default, |t| JobTimes {
                submitted_ms: t.submitted_ms,
                placed_ms: t.placed_ms,
                started_ms: t.started_ms,
                ended_ms: t.ended_ms,
            }),
            held: {
                if w.held.len() > MAX_HELD_SPANS {
                    return Err(WireError::invalid(
                        "Job",
                        "held",
                        format!("at most {MAX_HELD_SPANS} spans, got {}", w.held.len()),
                    ));
                }
                w.held
                    .into_iter()
                    .map(|s| {
                        if s.to_ms < s.from_ms {
                            return Err(WireError::invalid(
                                "Job",
                                "held",
                                format!("a span ends ({}) before it starts ({})", s.to_ms, s.from_ms),
                            ));
                        }
                        Ok(HeldSpan { from_ms: s.from_ms, to_ms: s.to_ms, gpus: s.gpus, cores: s.cores })
                    })
                    .collect::<Result<_, _>>()?
            },
            restarts: w.restarts,
            not_before_ms: w.not_before_ms,
            waiting_for: {
                if w.waiting_for.len() > tessera_view::MAX_DEPENDENCIES * tessera_view::MAX_ARRAY as usize {
                    return Err(WireError::invalid("Job", "waiting_for", format!("{} jobs", w.waiting_for.len())));
                }
                w.waiting_for.into_iter().map(|d| (JobId(d.job), d.must_finish)).collect()
            },
            ready_ms: w.ready_ms,
            array_index: w.array_index,
            cancel_grace_s: w.cancel_grace_s,
            trace: w.trace.map(JobTrace::try_from).transpose().map_err(|e| e.at("trace"))?,
        };
        validate::check_job(&job)?;
        Ok(job)
    }
}

impl From<&Proposal> for v1::Proposal {
    fn from(p: &Proposal) -> Self {
        v1::Proposal {
            id: p.id.0,
            job: p.job.0,
            members: p.members.iter().map(Into::into).collect(),
            based_on: p.based_on.0,
        }
    }
}

/// Only the member count is bounded here; the approver validates the rest against the view.
impl TryFrom<v1::Proposal> for Proposal {
    type Error = WireError;
    fn try_from(w: v1::Proposal) -> Result<Self, WireError> {
        member_count(w.members.len(), "Proposal")?;
        Ok(Proposal {
            id: ProposalId(w.id),
            job: JobId(w.job),
            members: w.members.into_iter().map(Into::into).collect(),
            based_on: ViewVersion(w.based_on),
        })
    }
}

impl From<&Preemption> for v1::Preemption {
    fn from(p: &Preemption) -> Self {
        v1::Preemption {
            proposal: Some((&p.proposal).into()),
            victims: p.victims.iter().map(|j| j.0).collect(),
            reason: p.reason.clone(),
        }
    }
}

/// Bounded here (victim count, reason length); whether the victims may be preempted is the
/// approver's.
impl TryFrom<v1::Preemption> for Preemption {
    type Error = WireError;
    fn try_from(w: v1::Preemption) -> Result<Self, WireError> {
        let proposal = required(w.proposal, "Preemption", "proposal")?;
        if w.victims.is_empty() || w.victims.len() > preemption::MAX_VICTIMS {
            let msg = format!("1 to {} victims, got {}", preemption::MAX_VICTIMS, w.victims.len());
            return Err(WireError::invalid("Preemption", "victims", msg));
        }
        if w.reason.chars().count() > preemption::MAX_REASON_CHARS {
            let msg = format!("at most {} characters", preemption::MAX_REASON_CHARS);
            return Err(WireError::invalid("Preemption", "reason", msg));
        }
        Ok(Preemption {
            proposal: Proposal::try_from(proposal).map_err(|e| e.at("proposal"))?,
            victims: w.victims.into_iter().map(JobId).collect(),
            reason: w.reason,
        })
    }
}

impl From<&Priorities> for v1::Priorities {
    fn from(p: &Priorities) -> Self {
        v1::Priorities {
            classes: p.classes.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            max_preemptions: p.max_preemptions,
            attained_service_gpu_s: p.attained_service_gpu_s.clone(),
        }
    }
}

/// Checked with [`Priorities::validate`].
impl TryFrom<v1::Priorities> for Priorities {
    type Error = WireError;
    fn try_from(w: v1::Priorities) -> Result<Self, WireError> {
        let p = Priorities {
            classes: w.classes.into_iter().collect(),
            max_preemptions: w.max_preemptions,
            attained_service_gpu_s: w.attained_service_gpu_s,
        };
        p.validate().map_err(|(field, msg)| WireError::invalid("Priorities", "classes", format!("{field}: {msg}")))?;
        Ok(p)
    }
}

// ---------------------------------------------------------------- submissions

/// The kind of a refusal, from the view error's variant (never from its words).
impl From<&ViewError> for v1::SubmitRefusal {
    fn from(e: &ViewError) -> Self {
        match e {
            ViewError::NeverFits(_) => v1::SubmitRefusal::NeverFits,
            ViewError::InvalidSpec(_) => v1::SubmitRefusal::InvalidSpec,
            ViewError::RequestReused { .. } => v1::SubmitRefusal::RequestReused,
            ViewError::BadRequestId(_) => v1::SubmitRefusal::BadRequestId,
            _ => v1::SubmitRefusal::Unspecified,
        }
    }
}

impl v1::SubmitResult {
    /// An admitted job.
    pub fn admitted(job: JobId) -> v1::SubmitResult {
        v1::SubmitResult { job: job.0, error: String::new(), refusal: v1::SubmitRefusal::Unspecified.into() }
    }

    /// A job the view refused: the error's text and its kind.
    pub fn refused(e: &ViewError) -> v1::SubmitResult {
        v1::SubmitResult { job: 0, error: e.to_string(), refusal: v1::SubmitRefusal::from(e).into() }
    }

    /// A submission whose outcome is unknown (it may or may not have been admitted).
    pub fn outcome_unknown(why: String) -> v1::SubmitResult {
        v1::SubmitResult { job: 0, error: why, refusal: v1::SubmitRefusal::OutcomeUnknown.into() }
    }
}

// ---------------------------------------------------------------- decisions

impl From<&Rejection> for v1::Rejection {
    fn from(r: &Rejection) -> Self {
        v1::Rejection { code: r.code().to_string(), message: r.to_string(), conflict: r.is_conflict() }
    }
}

impl From<&Decision> for v1::Decision {
    fn from(d: &Decision) -> Self {
        use v1::decision::{Accepted, AlreadyApplied, Outcome, Rejected};
        match d {
            Decision::Accepted { job, proposal, level, version } => v1::Decision {
                job: job.0,
                proposal: proposal.0,
                version: version.0,
                outcome: Some(Outcome::Accepted(Accepted { level: v1::LocalityLevel::from(*level).into() })),
            },
            Decision::AlreadyApplied { job, proposal, version } => v1::Decision {
                job: job.0,
                proposal: proposal.0,
                version: version.0,
                outcome: Some(Outcome::AlreadyApplied(AlreadyApplied {})),
            },
            Decision::Rejected { job, proposal, reason, fresh, version } => v1::Decision {
                job: job.0,
                proposal: proposal.0,
                version: version.0,
                outcome: Some(Outcome::Rejected(Rejected {
                    reason: Some(reason.into()),
                    fresh: fresh.iter().map(Into::into).collect(),
                })),
            },
        }
    }
}

/// A rejection as it travels: [`Rejection::code`], its `Display` text and whether it is a
/// conflict. The structured [`Rejection`] is not rebuilt from the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteRejection {
    /// Stable code, e.g. `devices_busy` (see [`Rejection::code`]); never empty.
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
    /// See [`Rejection::is_conflict`]: retry after applying the decision's fresh records.
    pub conflict: bool,
}

impl From<&Rejection> for RemoteRejection {
    fn from(r: &Rejection) -> Self {
        RemoteRejection { code: r.code().to_string(), message: r.to_string(), conflict: r.is_conflict() }
    }
}

impl TryFrom<v1::Rejection> for RemoteRejection {
    type Error = WireError;
    fn try_from(w: v1::Rejection) -> Result<Self, WireError> {
        if w.code.is_empty() {
            return Err(WireError::missing("Rejection", "code"));
        }
        Ok(RemoteRejection { code: w.code, message: w.message, conflict: w.conflict })
    }
}

impl fmt::Display for RemoteRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// The approver's answer as received over the wire: a [`Decision`] whose reason is a
/// [`RemoteRejection`] (the core [`Rejection`] cannot be rebuilt from its code and message).
pub type RemoteDecision = Decision<RemoteRejection>;

/// A local decision in the shape a client receives.
pub fn remote(d: &Decision) -> RemoteDecision {
    d.clone().map_reason(|r| RemoteRejection::from(&r))
}

impl TryFrom<v1::Decision> for RemoteDecision {
    type Error = WireError;
    fn try_from(w: v1::Decision) -> Result<Self, WireError> {
        use v1::decision::Outcome;
        let (job, proposal, version) = (JobId(w.job), ProposalId(w.proposal), ViewVersion(w.version));
        Ok(match required(w.outcome, "Decision", "outcome")? {
            Outcome::Accepted(a) => Decision::Accepted {
                job,
                proposal,
                level: locality(a.level, "Decision.Accepted", "level").map_err(|e| e.at("accepted"))?,
                version,
            },
            Outcome::AlreadyApplied(_) => Decision::AlreadyApplied { job, proposal, version },
            Outcome::Rejected(r) => {
                let at = |e: WireError| e.at("rejected");
                let reason = required(r.reason, "Decision.Rejected", "reason").map_err(at)?;
                Decision::Rejected {
                    job,
                    proposal,
                    reason: RemoteRejection::try_from(reason).map_err(|e| at(e.at("reason")))?,
                    fresh: convert_all(r.fresh, "fresh").map_err(at)?,
                    version,
                }
            }
        })
    }
}

// ---------------------------------------------------------------- why a job waits

/// Why a pending job waits, on the wire; `spec` is the job's (for the level it accepts now).
pub fn job_waiting(e: &tessera_view::WaitExplanation, spec: &tessera_view::JobSpec) -> v1::JobWaiting {
    use tessera_view::Waiting;
    let (fits_at, relax_at_ms) = match &e.waiting {
        Waiting::Locality { fits_at, relax_at_ms, .. } => (*fits_at, *relax_at_ms),
        Waiting::Ready { level } => (Some(*level), None),
        _ => (None, None),
    };
    v1::JobWaiting {
        reason: e.waiting.code().to_string(),
        message: e.waiting.to_string(),
        position: e.position,
        waited_ms: e.waited_ms,
        allowed: v1::LocalityLevel::from(spec.allowed_level(e.waited_ms / 1000)) as i32,
        fits_at: fits_at.map_or(v1::LocalityLevel::Unspecified, v1::LocalityLevel::from) as i32,
        relax_at_ms: relax_at_ms.unwrap_or(0),
    }
}

// ---------------------------------------------------------------- usage

/// A usage report on the wire (`version`: the view version read).
pub fn usage_response(r: &UsageReport, version: u64) -> v1::UsageResponse {
    v1::UsageResponse {
        from_ms: r.from_ms,
        to_ms: r.to_ms,
        by: r.by.as_str().to_string(),
        rows: r
            .rows
            .iter()
            .map(|row| v1::UsageRow {
                tenant: row.tenant.clone(),
                user: row.user.clone(),
                job: row.job.map(|j| j.0),
                gpu_ms: row.usage.gpu_ms,
                core_ms: row.usage.core_ms,
            })
            .collect(),
        total_gpu_ms: r.total.gpu_ms,
        total_core_ms: r.total.core_ms,
        version,
    }
}

/// A usage report from the wire; an unknown grouping is refused.
impl TryFrom<v1::UsageResponse> for UsageReport {
    type Error = WireError;
    fn try_from(w: v1::UsageResponse) -> Result<Self, WireError> {
        let by: UsageBy = w.by.parse().map_err(|e: String| WireError::invalid("UsageResponse", "by", e))?;
        Ok(UsageReport {
            from_ms: w.from_ms,
            to_ms: w.to_ms,
            by,
            rows: w
                .rows
                .into_iter()
                .map(|r| UsageRow {
                    tenant: r.tenant,
                    user: r.user,
                    job: r.job.map(JobId),
                    usage: Usage { gpu_ms: r.gpu_ms, core_ms: r.core_ms },
                })
                .collect(),
            total: Usage { gpu_ms: w.total_gpu_ms, core_ms: w.total_core_ms },
        })
    }
}

// ---------------------------------------------------------------- snapshots and deltas

impl From<&ViewSnapshot> for v1::ViewSnapshot {
    fn from(s: &ViewSnapshot) -> Self {
        v1::ViewSnapshot {
            version: s.version.0,
            topologies: s.topologies.iter().map(Into::into).collect(),
            config_sets: s.config_sets.iter().map(Into::into).collect(),
            racks: s.racks.clone(),
            ib_domains: s.ib_domains.clone(),
            servers: s.servers.iter().map(Into::into).collect(),
            server_names: s.server_names.clone(),
            jobs: s.jobs.iter().map(Into::into).collect(),
            quotas: s.quotas.clone(),
            class_quotas: s
                .class_quotas
                .iter()
                .flat_map(|(t, classes)| {
                    classes.iter().map(|(c, &gpus)| v1::ClassQuota { tenant: t.clone(), class: c.clone(), gpus })
                })
                .collect(),
            priorities: Some((&s.priorities).into()),
            next_job: s.next_job,
            ended: s.ended.iter().map(|j| j.0).collect(),
            ended_jobs_kept: s.ended_jobs_kept,
            unhealthy: s.unhealthy.clone(),
            cordons: s.cordons.iter().map(|(id, c)| v1::Cordon::from((*id, c))).collect(),
            health_history: s
                .health_history
                .iter()
                .map(|(id, h)| v1::ServerHistory { server: id.0, changes: h.iter().map(Into::into).collect() })
                .collect(),
            now_ms: s.now_ms,
            usage_retention_hours: s.usage_retention_hours,
            usage: s
                .usage
                .iter()
                .map(|(k, u)| v1::UsageBucket {
                    hour: k.hour,
                    tenant: k.tenant.clone(),
                    user: k.user.clone(),
                    gpu_ms: u.gpu_ms,
                    core_ms: u.core_ms,
                })
                .collect(),
            revocations: s.revocations.iter().map(|(fp, r)| revocation_to_wire(fp, r)).collect(),
            revocations_changed: s.revocations_changed.0,
        }
    }
}

/// A revocation on the wire.
pub fn revocation_to_wire(fingerprint: &str, r: &Revocation) -> v1::Revocation {
    v1::Revocation {
        fingerprint: fingerprint.to_string(),
        subject: r.subject.clone(),
        not_after_ms: r.not_after_ms,
        note: r.note.clone(),
        at_ms: r.at_ms,
    }
}

/// A revocation from the wire, checked as the view checks it: the fingerprint's form and the
/// texts' bounds (its expiry is the view's to judge, against its clock).
pub fn revocation_from_wire(w: v1::Revocation) -> Result<(String, Revocation), WireError> {
    let bad = |field: &'static str, e: tessera_view::ViewError| WireError::invalid("Revocation", field, e.to_string());
    tessera_view::revocation::check_fingerprint(&w.fingerprint).map_err(|e| bad("fingerprint", e))?;
    tessera_view::revocation::check_text("subject", &w.subject).map_err(|e| bad("subject", e))?;
    tessera_view::revocation::check_text("note", &w.note).map_err(|e| bad("note", e))?;
    Ok((w.fingerprint, Revocation { subject: w.subject, not_after_ms: w.not_after_ms, note: w.note, at_ms: w.at_ms }))
}

/// Every element is converted, then the whole is checked with [`validate::check_snapshot`], so
/// `ClusterView::from_snapshot` on the result gives a view whose invariants hold.
impl TryFrom<v1::ViewSnapshot> for ViewSnapshot {
    type Error = WireError;
    fn try_from(w: v1::ViewSnapshot) -> Result<Self, WireError> {
        let s = ViewSnapshot {
            version: ViewVersion(w.version),
            topologies: convert_all(w.topologies, "topologies")?,
            config_sets: convert_all(w.config_sets, "config_sets")?,
            racks: w.racks,
            ib_domains: w.ib_domains,
            servers: convert_all(w.servers, "servers")?,
            server_names: w.server_names,
            jobs: convert_all(w.jobs, "jobs")?,
            quotas: w.quotas,
            class_quotas: {
                let mut by: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
                for (i, q) in w.class_quotas.into_iter().enumerate() {
                    if by.entry(q.tenant.clone()).or_default().insert(q.class.clone(), q.gpus).is_some() {
                        return Err(WireError::invalid(
                            "ViewSnapshot",
                            "class_quotas",
                            format!("[{i}]: tenant `{}` at class `{}` is listed twice", q.tenant, q.class),
                        ));
                    }
                }
                by
            },
            priorities: Priorities::try_from(required(w.priorities, "ViewSnapshot", "priorities")?)
                .map_err(|e| e.at("priorities"))?,
            next_job: w.next_job,
            ended: w.ended.into_iter().map(JobId).collect(),
            ended_jobs_kept: w.ended_jobs_kept,
            unhealthy: w.unhealthy,
            cordons: convert_all(w.cordons, "cordons")?,
            health_history: convert_all(w.health_history, "health_history")?,
            now_ms: w.now_ms,
            usage_retention_hours: if w.usage_retention_hours == 0 {
                return Err(WireError::invalid("ViewSnapshot", "usage_retention_hours", "must be at least 1"));
            } else {
                w.usage_retention_hours
            },
            usage: w
                .usage
                .into_iter()
                .map(|b| {
                    (
                        UsageKey { hour: b.hour, tenant: b.tenant, user: b.user },
                        Usage { gpu_ms: b.gpu_ms, core_ms: b.core_ms },
                    )
                })
                .collect(),
            revocations: {
                let most = tessera_view::revocation::MAX_REVOCATIONS;
                if w.revocations.len() > most {
                    return Err(WireError::invalid(
                        "ViewSnapshot",
                        "revocations",
                        format!("{} entries; at most {most}", w.revocations.len()),
                    ));
                }
                let mut seen = std::collections::BTreeSet::new();
                let mut out = Vec::with_capacity(w.revocations.len());
                for (i, r) in w.revocations.into_iter().enumerate() {
                    let (fp, r) = revocation_from_wire(r).map_err(|e| e.at(format!("revocations[{i}]")))?;
                    if !seen.insert(fp.clone()) {
                        return Err(WireError::invalid(
                            "ViewSnapshot",
                            "revocations",
                            format!("[{i}]: {fp} is listed twice"),
                        ));
                    }
                    out.push((fp, r));
                }
                out
            },
            revocations_changed: ViewVersion(w.revocations_changed),
        };
        validate::check_snapshot(&s)?;
        Ok(s)
    }
}

impl From<&ViewDelta> for v1::ViewDelta {
    fn from(d: &ViewDelta) -> Self {
        v1::ViewDelta {
            from: d.from.0,
            to: d.to.0,
            servers: d.servers.iter().map(Into::into).collect(),
            jobs: d.jobs.iter().map(Into::into).collect(),
            unhealthy: d.unhealthy.clone(),
        }
    }
}

/// Checked structurally (each record and job on its own, `from <= to`); whether the records fit
/// the reader's view is the reader's to check.
impl TryFrom<v1::ViewDelta> for ViewDelta {
    type Error = WireError;
    fn try_from(w: v1::ViewDelta) -> Result<Self, WireError> {
        if w.from > w.to {
            return Err(WireError::out_of_range("ViewDelta", "from", w.from, format!("after to = {}", w.to)));
        }
        if !w.unhealthy.is_empty() && w.unhealthy.len() != w.servers.len() {
            return Err(WireError::invalid(
                "ViewDelta",
                "unhealthy",
                format!("{} entries for {} servers", w.unhealthy.len(), w.servers.len()),
            ));
        }
        let servers: Vec<(ServerId, ServerRecord)> = convert_all(w.servers, "servers")?;
        // An unhealthy device is never free (the view's invariant).
        if let Some(((s, r), bad)) = servers.iter().zip(&w.unhealthy).find(|((_, r), bad)| r.free_gpus & **bad != 0) {
            return Err(WireError::invalid(
                "ViewDelta",
                "unhealthy",
                format!(
                    "server {} lists devices {} free and unhealthy",
                    s.0,
                    tessera_view::mask::format_indices(r.free_gpus & bad)
                ),
            ));
        }
        Ok(ViewDelta {
            from: ViewVersion(w.from),
            to: ViewVersion(w.to),
            servers,
            unhealthy: w.unhealthy,
            jobs: convert_all(w.jobs, "jobs")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use tessera_view::fit::{self, FitMode};
    use tessera_view::{ClusterSpec, ClusterView, invariants};

    fn seed() -> Topology {
        Topology::preset("seed-8gpu").expect("preset")
    }

    /// Encodes and decodes, as a peer would.
    fn wire_trip<W: Message + Default + PartialEq + fmt::Debug>(w: &W) -> W {
        let back = W::decode(w.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(&back, w);
        back
    }

    #[test]
    fn a_job_keeps_its_trace_on_the_wire_and_a_malformed_trace_is_refused() {
        let mut v = ClusterView::from_spec(&ClusterSpec::uniform(seed(), 1, 1, 1));
        let trace = JobTrace::new(0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c, 0xb7ad_6b71_6920_3331);
        let id = v.submit_traced(&JobSpec::simple("t", 1, 1), None, None, trace).expect("admitted");
        let job = v.job(id).expect("the job").clone();
        let wire = wire_trip(&v1::Job::from(&job));
        assert_eq!(wire.trace.as_ref().map(|t| t.trace_id.len()), Some(16));
        assert_eq!(Job::try_from(wire.clone()).expect("valid"), job);
        let snap = v.snapshot();
        assert_eq!(ViewSnapshot::try_from(wire_trip(&v1::ViewSnapshot::from(&snap))).expect("valid"), snap);

        for (trace_id, span_id, why) in
            [(vec![1; 15], 1, "16 bytes"), (vec![0; 16], 1, "of 0"), (vec![1; 16], 0, "of 0"), (vec![], 1, "16 bytes")]
        {
            let mut w = wire.clone();
            w.trace = Some(v1::JobTrace { trace_id, span_id });
            let e = Job::try_from(w).expect_err("a malformed trace").to_string();
            assert!(e.contains("trace") && e.contains(why), "{e}");
        }
    }

    /// A spec that sets every field away from its default.
    fn rich_spec() -> JobSpec {
        let mut spec = JobSpec::simple("train", 2, 2);
        spec.tenant = "vision".into();
        spec.gpu_type = Some("nvidia-v100-16g".into());
        spec.prefer = LocalityLevel::Socket;
        spec.tolerate = LocalityLevel::Rack;
        spec.relax_after_s = Some(60);
        spec.slowdown = BTreeMap::from([(LocalityLevel::Server, 0.05), (LocalityLevel::Rack, 0.28)]);
        spec.cpu = CpuDemand::Predicted {
            predictor: Predictor { p0: 1.0, p1: 0.02, p2: 2.5, theta: 6.0 },
            min_cores_per_gpu: 2,
        };
        spec.memory_mib_per_gpu = Some(32_768);
        spec.priority = -3;
        spec.command = vec!["python3".into(), "train.py".into()];
        spec.scheduler = Some("optimus".into());
        spec.model = Some("ResNet-50".into());
        spec
    }

    /// Plans one member of `job` on `server` with the shared fit function.
    fn plan(view: &ClusterView, job: JobId, server: ServerId) -> MemberPlacement {
        let spec = &view.job(job).expect("job").spec;
        let rec = *view.server(server).expect("server");
        let topo = view.topology_of(rec.config_set);
        let req = fit::member_request(spec, topo);
        fit::plan_member(topo, &rec, server, &req, LocalityLevel::Server, FitMode::Pack).expect("fits").0
    }

    /// 4 seed-8gpu servers in 2 racks: a placed 2x2 gang on rack-0, a pending job, a cancelled
    /// one; and one decision of each kind.
    fn busy_view() -> (ClusterView, Vec<Decision>) {
        let mut view = ClusterView::from_spec(&ClusterSpec::uniform(seed(), 4, 2, 1));
        let job = view.submit(rich_spec()).expect("admitted");
        let members = vec![plan(&view, job, ServerId(0)), plan(&view, job, ServerId(1))];
        let p = Proposal { id: ProposalId(41), job, members, based_on: view.version() };
        let accepted = view.propose(&p);
        assert!(matches!(accepted, Decision::Accepted { level: LocalityLevel::Rack, .. }), "{accepted:?}");
        let again = view.propose(&p);
        assert!(matches!(again, Decision::AlreadyApplied { .. }), "{again:?}");
        let pending = view.submit(JobSpec::simple("waiting", 1, 8)).expect("admitted");
        // Planned on the idle server 2, then moved to the busy server 0: a stale-state conflict.
        let mut m = plan(&view, pending, ServerId(2));
        m.server = ServerId(0);
        let stale = Proposal { id: ProposalId(42), job: pending, members: vec![m], based_on: view.version() };
        let rejected = view.propose(&stale);
        assert!(
            matches!(&rejected, Decision::Rejected { reason, fresh, .. } if reason.is_conflict() && fresh.len() == 1)
        );
        let gone = view.submit(JobSpec::simple("gone", 1, 1)).expect("admitted");
        view.cancel_with(gone, None, Some(5)).expect("cancelled");
        // An array of two waiting for the placed gang (and for the cancelled job's end: done).
        let array =
            JobSpec { after: vec![job], after_any: vec![gone], array: Some(2), ..JobSpec::simple("after", 1, 1) };
        let first = view.submit(array).expect("admitted");
        assert_eq!(view.job(first).expect("first").waiting_for, vec![(job, true)]);
        view.set_health(ServerId(3), Health::Draining).expect("known server");
        assert!(invariants::check(&view).is_clean());
        (view, vec![accepted, again, rejected])
    }

    #[test]
    fn submit_refusals_carry_their_kind() {
        let mut view = ClusterView::from_spec(&ClusterSpec::uniform(seed(), 4, 2, 1));
        let never = view.submit(JobSpec::simple("huge", 1, 64)).expect_err("64 GPUs on one server never fit");
        let r = v1::SubmitResult::refused(&never);
        assert_eq!((r.job, r.refusal()), (0, v1::SubmitRefusal::NeverFits));
        assert!(!r.error.is_empty());
        let mut bad = JobSpec::simple("loose", 1, 1);
        bad.tolerate = LocalityLevel::PcieSwitch;
        bad.prefer = LocalityLevel::Rack;
        let invalid = view.submit(bad).expect_err("tolerate tighter than prefer");
        assert_eq!(v1::SubmitResult::refused(&invalid).refusal(), v1::SubmitRefusal::InvalidSpec);
        let ok = v1::SubmitResult::admitted(JobId(7));
        assert_eq!((ok.job, ok.error.as_str(), ok.refusal()), (7, "", v1::SubmitRefusal::Unspecified));
        let unknown = v1::SubmitResult::outcome_unknown("leader changed".into());
        assert_eq!(unknown.refusal(), v1::SubmitRefusal::OutcomeUnknown);
        // The kind survives the wire.
        let back = v1::SubmitResult::decode(r.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(back.refusal(), v1::SubmitRefusal::NeverFits);
    }

    #[test]
    fn preemptions_classes_and_service_queues_cross_the_wire() {
        let mut spec = ClusterSpec::uniform(seed(), 2, 2, 1);
        spec.priorities.classes.insert("urgent".into(), 1000);
        spec.priorities.max_preemptions = 5;
        let mut view = ClusterView::from_spec(&spec);
        let low = view.submit(JobSpec::simple("low", 1, 8)).expect("admitted");
        let p = Proposal {
            id: ProposalId(1),
            job: low,
            members: vec![plan(&view, low, ServerId(0))],
            based_on: view.version(),
        };
        assert!(view.propose(&p).is_placed());
        view.set_service_queue(low, 2).expect("live job");
        let high = view.submit(JobSpec { class: Some("urgent".into()), ..rich_spec() }).expect("admitted");
        assert_eq!(view.job(high).expect("job").spec.priority, 1000, "the class resolved at admission");
        let small = view.submit(JobSpec { class: Some("batch".into()), ..JobSpec::simple("small", 1, 4) }).expect("ok");
        // Planned as if the victim were gone.
        let mut without = view.clone();
        without.release(low, false).expect("placed");
        let pre = Preemption {
            proposal: Proposal {
                id: ProposalId(2),
                job: small,
                members: vec![plan(&without, small, ServerId(0))],
                based_on: view.version(),
            },
            victims: vec![low],
            reason: "batch over best effort".into(),
        };
        let wire = wire_trip(&v1::Preemption::from(&pre));
        assert_eq!(Preemption::try_from(wire).expect("valid"), pre);
        assert!(view.preempt(&pre).is_placed());
        let snap = view.snapshot();
        let back = ViewSnapshot::try_from(wire_trip(&v1::ViewSnapshot::from(&snap))).expect("valid snapshot");
        assert_eq!(back, snap);
        let j = back.jobs.iter().find(|j| j.id == low).expect("victim");
        assert_eq!((j.preemptions, j.service_queue, j.state), (1, 2, JobState::Pending));
        assert_eq!(ClusterView::from_snapshot(back).state_hash(), view.state_hash());
        // Bounds: no victims, too long a reason, a queue beyond a byte, an empty class table.
        let mut w = v1::Preemption::from(&pre);
        w.victims.clear();
        assert!(Preemption::try_from(w.clone()).is_err());
        w.victims = vec![1];
        w.reason = "x".repeat(tessera_view::preemption::MAX_REASON_CHARS + 1);
        assert!(Preemption::try_from(w).is_err());
        let mut job = v1::Job::from(&snap.jobs[0]);
        job.service_queue = 256;
        assert!(Job::try_from(job).is_err());
        let mut s = v1::ViewSnapshot::from(&snap);
        s.priorities = Some(v1::Priorities { max_preemptions: 1, ..Default::default() });
        assert!(ViewSnapshot::try_from(s.clone()).is_err());
        s.priorities = None;
        assert!(ViewSnapshot::try_from(s).is_err(), "priorities are required");
    }

    #[test]
    fn snapshot_round_trips_through_bytes() {
        let (mut view, _) = busy_view();
        view.advance_clock(1_000);
        let fp = format!("sha256:{}", "ab".repeat(32));
        let r = Revocation { subject: "user/alice".into(), not_after_ms: 9_000, note: "leaked".into(), at_ms: 0 };
        view.set_revocation(&fp, Some(&r)).expect("revoked");
        let snap = view.snapshot();
        assert_eq!(snap.revocations.len(), 1);
        assert!(snap.jobs.iter().any(|j| j.placement.is_some()));
        assert!(snap.jobs.iter().any(|j| j.state == JobState::Failed));
        let wire = wire_trip(&v1::ViewSnapshot::from(&snap));
        let back = ViewSnapshot::try_from(wire).expect("valid snapshot");
        assert_eq!(back, snap);
        let rebuilt = ClusterView::from_snapshot(back);
        assert_eq!(rebuilt.state_hash(), view.state_hash());
        assert!(invariants::check(&rebuilt).is_clean());
        // A revocation the view would refuse is refused on the wire, naming where.
        let mut w = v1::ViewSnapshot::from(&snap);
        w.revocations[0].fingerprint = "sha256:AB".into();
        let e = ViewSnapshot::try_from(w.clone()).expect_err("malformed fingerprint");
        assert!(e.to_string().contains("revocations[0]"), "{e}");
        w.revocations[0].fingerprint = fp.clone();
        w.revocations.push(w.revocations[0].clone());
        assert!(ViewSnapshot::try_from(w).expect_err("twice").to_string().contains("listed twice"));
    }

    #[test]
    fn delta_and_proposal_round_trip() {
        let (view, _) = busy_view();
        let delta = view.delta_since(ViewVersion(0)).expect("log reaches back");
        assert!(!delta.servers.is_empty() && !delta.jobs.is_empty());
        let back = ViewDelta::try_from(wire_trip(&v1::ViewDelta::from(&delta))).expect("valid delta");
        assert_eq!(back, delta);

        let job = view.jobs()[0];
        let placement = job.placement.as_ref().expect("placed");
        let p =
            Proposal { id: ProposalId(7), job: job.id, members: placement.members.clone(), based_on: view.version() };
        assert_eq!(Proposal::try_from(wire_trip(&v1::Proposal::from(&p))), Ok(p));
        let back = GangPlacement::try_from(wire_trip(&v1::GangPlacement::from(placement)));
        assert_eq!(back.as_ref(), Ok(placement));
        for t in tessera_view::topology::PRESETS.iter().map(|(n, _)| Topology::preset(n).expect("preset")) {
            assert_eq!(Topology::try_from(wire_trip(&v1::Topology::from(&t))), Ok(t));
        }
        for cpu in [CpuDemand::Proportional, CpuDemand::Fixed { cores_per_gpu: 4 }, rich_spec().cpu] {
            assert_eq!(CpuDemand::try_from(wire_trip(&v1::CpuDemand::from(&cpu))), Ok(cpu));
        }
        for h in [Health::Up, Health::Draining, Health::Down, Health::Removed] {
            assert_eq!(Health::try_from(v1::Health::from(h)), Ok(h));
        }
        for l in LocalityLevel::ALL {
            assert_eq!(LocalityLevel::try_from(v1::LocalityLevel::from(l)), Ok(l));
        }
        for s in [JobState::Pending, JobState::Placed, JobState::Running, JobState::Migrating, JobState::Finished] {
            assert_eq!(JobState::try_from(v1::JobState::from(s)), Ok(s));
        }
    }

    #[test]
    fn decisions_round_trip_as_remote_decisions() {
        let (_, decisions) = busy_view();
        for d in &decisions {
            let got = RemoteDecision::try_from(wire_trip(&v1::Decision::from(d))).expect("valid decision");
            assert_eq!(got, remote(d));
            assert_eq!(got.is_placed(), d.is_placed());
        }
        let Some(Decision::Rejected { reason, fresh, .. }) = decisions.last().map(remote) else {
            panic!("the last decision is a rejection");
        };
        assert_eq!(reason.code, "devices_busy");
        assert!(reason.conflict && reason.message.contains("are taken"), "{reason}");
        assert_eq!(fresh[0].0, ServerId(0));
    }

    #[test]
    fn server_record_is_small_on_the_wire() {
        let t = seed();
        let fresh = ServerRecord {
            free_gpus: t.all_devices(),
            free_cores: t.all_cores(),
            free_memory_mib: t.memory_mib,
            config_set: ConfigSetId(0),
            health: Health::Up,
        };
        // Idle seed-8gpu server: 24 bytes (cores 64..128 and config set 0 are defaults, not sent).
        assert_eq!(v1::ServerRecord::from(&fresh).encoded_len(), 24);
        let worst = ServerRecord {
            free_gpus: u64::MAX,
            free_cores: CoreMask([u64::MAX, u64::MAX]),
            free_memory_mib: u32::MAX,
            config_set: ConfigSetId(u16::MAX),
            health: Health::Draining,
        };
        // Every field at its widest: 39 bytes, 3 x (1 + 8) fixed64 + (1 + 5) + (1 + 3) + (1 + 1).
        let wire = v1::ServerRecord::from(&worst);
        assert_eq!(wire.encoded_len(), 39);
        assert_eq!(ServerRecord::try_from(wire_trip(&wire)), Ok(worst));
    }

    // ------------------------------------------------------------ hostile input

    #[test]
    fn unknown_and_unspecified_enums_are_refused() {
        let rec = v1::ServerRecord::from(&ServerRecord {
            free_gpus: 1,
            free_cores: CoreMask::EMPTY,
            free_memory_mib: 1,
            config_set: ConfigSetId(0),
            health: Health::Up,
        });
        for (health, want) in [
            (0, WireError::missing("ServerRecord", "health")),
            (5, WireError::UnknownEnum { message: "ServerRecord", field: "health", value: 5 }),
            (-1, WireError::UnknownEnum { message: "ServerRecord", field: "health", value: -1 }),
        ] {
            assert_eq!(ServerRecord::try_from(v1::ServerRecord { health, ..rec }), Err(want));
        }
        assert!(Health::try_from(v1::Health::Unspecified).is_err());
        assert!(LocalityLevel::try_from(v1::LocalityLevel::Unspecified).is_err());

        let spec = v1::JobSpec::from(&rich_spec());
        let e = JobSpec::try_from(v1::JobSpec { prefer: 99, ..spec.clone() }).expect_err("unknown level");
        assert_eq!(e, WireError::UnknownEnum { message: "JobSpec", field: "prefer", value: 99 });
        let mut bad = spec.clone();
        bad.slowdown[1].level = 17;
        let e = JobSpec::try_from(bad).expect_err("unknown level");
        assert_eq!(e.to_string(), "slowdown[1]: LocalitySlowdown.level: unknown enum value 17");

        let (view, decisions) = busy_view();
        let mut job = v1::Job::from(view.jobs()[0]);
        job.state = 0;
        assert_eq!(Job::try_from(job.clone()).map(|_| ()), Err(WireError::missing("Job", "state")));
        job.state = v1::JobState::Placed.into();
        job.placement.as_mut().expect("placed").level = 42;
        assert!(matches!(
            Job::try_from(job).expect_err("unknown level").root(),
            WireError::UnknownEnum { field: "level", value: 42, .. }
        ));
        let mut d = v1::Decision::from(&decisions[0]);
        d.outcome = Some(v1::decision::Outcome::Accepted(v1::decision::Accepted { level: 0 }));
        assert_eq!(
            RemoteDecision::try_from(d).map(|_| ()),
            Err(WireError::missing("Decision.Accepted", "level").at("accepted"))
        );
    }

    #[test]
    fn malformed_topologies_are_refused() {
        let good = v1::Topology::from(&seed());
        let refuse = |f: &dyn Fn(&mut v1::Topology)| {
            let mut t = good.clone();
            f(&mut t);
            Topology::try_from(t).expect_err("must be refused")
        };
        // A socket naming device 8 of an 8-device server.
        let e = refuse(&|t| t.sockets[1] |= 1 << 8);
        assert!(matches!(e, WireError::OutOfRange { field: "sockets", value: 0x1F0, .. }), "{e}");
        let e = refuse(&|t| t.nvlink_groups = vec![1 << 63 | 1]);
        assert!(matches!(e, WireError::OutOfRange { field: "nvlink_groups", .. }), "{e}");
        for devices in [0, 65, u32::MAX] {
            let e = refuse(&|t| t.devices = devices);
            assert!(matches!(e, WireError::OutOfRange { field: "devices", .. }), "{e}");
        }
        let e = refuse(&|t| t.pcie_switches = vec![0b11, 0b1100, 0b11_0000, 0b1100_0000 | 0b1_0000_0000]);
        assert!(matches!(e, WireError::OutOfRange { field: "pcie_switches", .. }), "{e}");
        let e = refuse(&|t| t.pcie_switches = vec![0b11, 0b1_1100, 0b110_0000, 0b1000_0000]);
        assert!(e.to_string().contains("spans sockets"), "{e}");
        let e = refuse(&|t| t.pcie_switches.truncate(3));
        assert!(e.to_string().contains("device 6 is in no group"), "{e}");
        let e = refuse(&|t| t.sockets = vec![0b1111, 0b1111_1100]);
        assert!(e.to_string().contains("device 2 is in two groups"), "{e}");
        let e = refuse(&|t| t.sockets.clear());
        assert!(matches!(e, WireError::Invalid { field: "sockets", .. }), "{e}");
        let e = refuse(&|t| t.cores_per_socket = 65);
        assert!(matches!(e, WireError::OutOfRange { field: "cores_per_socket", .. }), "{e}");
        let e = refuse(&|t| t.cores_per_socket = u32::MAX);
        assert!(matches!(e, WireError::OutOfRange { field: "cores_per_socket", .. }), "{e}");
        let e = refuse(&|t| t.nvlink_groups = vec![0b1]);
        assert!(e.to_string().contains("fewer than two"), "{e}");
        let e = refuse(&|t| t.memory_mib = 0);
        assert!(matches!(e, WireError::OutOfRange { field: "memory_mib", .. }), "{e}");
        let e = refuse(&|t| t.name.clear());
        assert!(matches!(e, WireError::Invalid { field: "name", .. }), "{e}");
    }

    #[test]
    fn missing_fields_and_bad_values_are_refused() {
        let spec = v1::JobSpec::from(&rich_spec());
        let e = JobSpec::try_from(v1::JobSpec { cpu: None, ..spec.clone() });
        assert_eq!(e, Err(WireError::missing("JobSpec", "cpu")));
        let e = JobSpec::try_from(v1::JobSpec { cpu: Some(v1::CpuDemand { kind: None }), ..spec.clone() });
        assert_eq!(e, Err(WireError::missing("CpuDemand", "kind").at("cpu")));
        let predicted = |predictor, min| v1::CpuDemand {
            kind: Some(v1::cpu_demand::Kind::Predicted(v1::cpu_demand::Predicted {
                predictor,
                min_cores_per_gpu: min,
            })),
        };
        assert!(CpuDemand::try_from(predicted(None, 1)).is_err());
        let p = v1::Predictor { p0: 1.0, p1: 0.0, p2: 1.0, theta: 4.0 };
        assert!(CpuDemand::try_from(predicted(Some(p), 5)).is_err());
        assert!(CpuDemand::try_from(predicted(Some(v1::Predictor { theta: f64::NAN, ..p }), 1)).is_err());
        assert!(CpuDemand::try_from(predicted(Some(v1::Predictor { p1: f64::INFINITY, ..p }), 1)).is_err());
        let fixed =
            |c| v1::CpuDemand { kind: Some(v1::cpu_demand::Kind::Fixed(v1::cpu_demand::Fixed { cores_per_gpu: c })) };
        assert!(CpuDemand::try_from(fixed(0)).is_err() && CpuDemand::try_from(fixed(129)).is_err());
        for bad in [
            v1::JobSpec { members: 0, ..spec.clone() },
            v1::JobSpec { members: 4097, ..spec.clone() },
            v1::JobSpec { gpus_per_member: 65, ..spec.clone() },
            v1::JobSpec { name: " ".into(), ..spec.clone() },
            v1::JobSpec { gpu_type: Some(String::new()), ..spec.clone() },
            v1::JobSpec { relax_after_s: Some(0), ..spec.clone() },
            v1::JobSpec { memory_mib_per_gpu: Some(0), ..spec.clone() },
            v1::JobSpec { tolerate: v1::LocalityLevel::PcieSwitch.into(), ..spec.clone() },
            v1::JobSpec { command: vec![String::new()], ..spec.clone() },
        ] {
            assert!(JobSpec::try_from(bad).is_err());
        }
        let mut bad = spec.clone();
        bad.slowdown[0].slowdown = f64::NAN;
        assert!(matches!(JobSpec::try_from(bad), Err(WireError::Invalid { field: "slowdown", .. })));
        let mut bad = spec.clone();
        bad.slowdown.push(bad.slowdown[0]);
        assert!(JobSpec::try_from(bad).expect_err("duplicate").to_string().contains("listed twice"));

        let (view, decisions) = busy_view();
        let job = v1::Job::from(view.jobs()[0]);
        assert_eq!(Job::try_from(v1::Job { spec: None, ..job.clone() }), Err(WireError::missing("Job", "spec")));
        let e = Job::try_from(v1::Job { placement: None, ..job.clone() }).expect_err("placed without placement");
        assert!(matches!(e, WireError::Invalid { field: "placement", .. }), "{e}");
        let mut partial = job.clone();
        partial.placement.as_mut().expect("placed").members.pop();
        assert!(Job::try_from(partial).is_err());
        let pending = v1::Job { state: v1::JobState::Pending.into(), ..job.clone() };
        assert!(Job::try_from(pending).is_err());

        let entry = v1::ServerEntry { server_id: 3, record: None };
        assert_eq!(<(ServerId, ServerRecord)>::try_from(entry), Err(WireError::missing("ServerEntry", "record")));
        let d = v1::Decision { outcome: None, ..v1::Decision::from(&decisions[0]) };
        assert_eq!(RemoteDecision::try_from(d), Err(WireError::missing("Decision", "outcome")));
        let mut d = v1::Decision::from(&decisions[2]);
        if let Some(v1::decision::Outcome::Rejected(r)) = &mut d.outcome {
            r.reason = None;
        }
        assert!(RemoteDecision::try_from(d).is_err());

        let cs = v1::ConfigSet { id: 70_000, ..Default::default() };
        assert!(matches!(ConfigSet::try_from(cs), Err(WireError::OutOfRange { field: "id", value: 70_000, .. })));
        let rec = v1::ServerRecord { config_set: 65_536, health: 1, ..Default::default() };
        assert!(matches!(ServerRecord::try_from(rec), Err(WireError::OutOfRange { field: "config_set", .. })));
        let many = v1::Proposal { members: vec![Default::default(); 4097], ..Default::default() };
        assert!(Proposal::try_from(many).is_err());
        let backwards = v1::ViewDelta { from: 5, to: 4, ..Default::default() };
        assert!(ViewDelta::try_from(backwards).is_err());
    }

    /// A delta carries each changed server's unhealthy devices beside its record: one mask per
    /// record or none, and never a device listed free.
    #[test]
    fn deltas_carry_unhealthy_devices_per_changed_server() {
        let mut view = ClusterView::from_spec(&ClusterSpec::uniform(seed(), 2, 2, 1));
        let v0 = view.version();
        view.set_unhealthy_devices(ServerId(1), 0b110).expect("set");
        let d = view.delta_since(v0).expect("delta");
        assert_eq!(d.unhealthy, vec![0b110]);
        let back = ViewDelta::try_from(wire_trip(&v1::ViewDelta::from(&d))).expect("valid");
        assert_eq!(back, d);
        let mut w = v1::ViewDelta::from(&d);
        w.unhealthy.push(0);
        assert!(matches!(ViewDelta::try_from(w), Err(WireError::Invalid { field: "unhealthy", .. })));
        let mut w = v1::ViewDelta::from(&d);
        w.unhealthy[0] = 0b1;
        let e = ViewDelta::try_from(w).expect_err("device 0 is free");
        assert!(e.to_string().contains("free and unhealthy"), "{e}");
        // A sender that carries none.
        let mut w = v1::ViewDelta::from(&d);
        w.unhealthy.clear();
        assert!(ViewDelta::try_from(w).expect("valid").unhealthy.is_empty());
    }

    /// A removed server is a tombstone on the wire too: held by no job, offering nothing, not
    /// cordoned, with no sick devices; its name may name a later server, never an earlier live
    /// one; no live server in a removed set.
    #[test]
    fn snapshots_with_removed_servers_are_checked() {
        let (mut view, _) = busy_view();
        view.remove_server(ServerId(2), 1).expect("server 2 is idle");
        let name = view.server_name(ServerId(2)).expect("name").to_string();
        view.add_servers(ConfigSetId(1), std::slice::from_ref(&name), 2).expect("the name again");
        let good = v1::ViewSnapshot::from(&view.snapshot());
        let back = ViewSnapshot::try_from(good.clone()).expect("a tombstone and its name given again pass");
        assert_eq!(ClusterView::from_snapshot(back).server_id(&name), Some(ServerId(4)));
        let refuse = |f: &dyn Fn(&mut v1::ViewSnapshot)| {
            let mut s = good.clone();
            f(&mut s);
            ViewSnapshot::try_from(s).expect_err("must be refused").to_string()
        };
        let e = refuse(&|s| s.servers[2].free_gpus = 1);
        assert!(e.starts_with("servers[2]") && e.contains("differs from capacity"), "{e}");
        let e = refuse(&|s| {
            // The member moves from server 1 to the tombstone; server 1 gets its resources back.
            let m = &mut s.jobs[0].placement.as_mut().expect("placed").members[1];
            m.server = 2;
            let (gpus, lo, hi, mem) = (m.gpus, m.cores_lo, m.cores_hi, m.memory_mib);
            let r = &mut s.servers[1];
            r.free_gpus |= gpus;
            r.free_cores_lo |= lo;
            r.free_cores_hi |= hi;
            r.free_memory_mib += mem;
        });
        assert!(e.contains("held on a removed server"), "{e}");
        let e = refuse(&|s| s.unhealthy = vec![0, 0, 1, 0, 0]);
        assert!(e.contains("removed yet has unhealthy"), "{e}");
        let e = refuse(&|s| {
            s.cordons.insert(0, v1::Cordon { server: 2, reason: "x".into(), since_ms: 1, drain_by_ms: None });
            s.cordons.sort_by_key(|c| c.server);
        });
        assert!(e.contains("cordoned but removed"), "{e}");
        let e = refuse(&|s| s.config_sets[0].removed = true);
        assert!(e.contains("was removed, yet the server is"), "{e}");
        // A live server's name given to a later tombstone: the name would mean the tombstone.
        let e = refuse(&|s| s.server_names[2] = s.server_names[0].clone());
        assert!(e.contains("names two servers"), "{e}");
    }

    #[test]
    fn inconsistent_snapshots_are_refused() {
        let (view, _) = busy_view();
        let good = v1::ViewSnapshot::from(&view.snapshot());
        let refuse = |f: &dyn Fn(&mut v1::ViewSnapshot)| {
            let mut s = good.clone();
            f(&mut s);
            ViewSnapshot::try_from(s).expect_err("must be refused").to_string()
        };
        // Server 0 claims a device free that the placed gang holds.
        let held = good.jobs[0].placement.as_ref().expect("placed").members[0].gpus;
        let e = refuse(&|s| s.servers[0].free_gpus |= held);
        assert!(e.starts_with("servers[0]") && e.contains("differs from capacity"), "{e}");
        let e = refuse(&|s| s.servers[1].free_memory_mib += 1);
        assert!(e.contains("differs from capacity"), "{e}");
        let e = refuse(&|s| s.servers[2].free_gpus = 1 << 9);
        assert!(e.contains("differs from capacity"), "{e}");
        let e = refuse(&|s| s.servers[0].config_set = 9);
        assert!(e.contains("servers[0]: ServerRecord.config_set: 9 is out of range"), "{e}");
        let e = refuse(&|s| s.config_sets[1].topology = 3);
        assert!(e.contains("config_sets[1]: ConfigSet.topology"), "{e}");
        let e = refuse(&|s| s.config_sets[1].id = 0);
        assert!(e.contains("config_sets[1]: ConfigSet.id"), "{e}");
        let e = refuse(&|s| s.topologies[0].sockets[0] |= 1 << 40);
        assert!(e.starts_with("topologies[0]: Topology.sockets"), "{e}");
        let e = refuse(&|s| {
            s.server_names.pop();
        });
        assert!(e.contains("server_names"), "{e}");
        let e = refuse(&|s| s.server_names[1] = s.server_names[0].clone());
        assert!(e.contains("names two servers"), "{e}");
        let e = refuse(&|s| s.jobs[1].id = s.jobs[0].id);
        assert!(e.contains("appears twice"), "{e}");
        let e = refuse(&|s| s.next_job = 1);
        assert!(e.contains("Job.id"), "{e}");
        let e = refuse(&|s| s.jobs[0].placement.as_mut().expect("placed").members[1].server = 99);
        assert!(e.contains("jobs[0].placement.members[1]: MemberPlacement.server"), "{e}");
        let e = refuse(&|s| {
            let p = s.jobs[0].placement.as_mut().expect("placed");
            p.members[1] = p.members[0];
        });
        assert!(e.contains("held twice"), "{e}");
    }

    /// A tiny deterministic generator (xorshift64*), so the fuzz cases are reproducible.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Corrupted bytes never panic: they fail to decode, fail to convert, or convert to a snapshot
    /// whose view keeps its invariants through further commands.
    #[test]
    fn corrupted_bytes_never_panic() {
        let (view, decisions) = busy_view();
        let snapshot = v1::ViewSnapshot::from(&view.snapshot()).encode_to_vec();
        let delta = v1::ViewDelta::from(&view.delta_since(ViewVersion(0)).expect("delta")).encode_to_vec();
        let decision = v1::Decision::from(&decisions[2]).encode_to_vec();
        let mut rng = Rng(0x5EED_7E55_E7A0_0001);
        let (mut accepted, mut refused, mut undecodable) = (0, 0, 0);
        for round in 0..3000 {
            let mut bytes = match round % 3 {
                0 => snapshot.clone(),
                1 => delta.clone(),
                _ => decision.clone(),
            };
            for _ in 0..1 + rng.below(4) {
                match rng.below(3) {
                    0 => {
                        let i = rng.below(bytes.len());
                        bytes[i] ^= 1 << rng.below(8);
                    }
                    1 => {
                        let i = rng.below(bytes.len());
                        bytes[i] = rng.next() as u8;
                    }
                    _ => bytes.truncate(rng.below(bytes.len() + 1)),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            let result = match round % 3 {
                0 => v1::ViewSnapshot::decode(bytes.as_slice()).map(|w| {
                    ViewSnapshot::try_from(w).map(|s| {
                        let mut v = ClusterView::from_snapshot(s);
                        assert!(invariants::check(&v).is_clean());
                        for j in v.jobs().iter().map(|j| j.id).collect::<Vec<_>>() {
                            let _ = v.cancel(j);
                        }
                        for s in 0..v.servers().len() as u32 {
                            let _ = v.set_health(ServerId(s), Health::Down);
                        }
                        assert!(invariants::check(&v).is_clean());
                    })
                }),
                1 => v1::ViewDelta::decode(bytes.as_slice()).map(|w| ViewDelta::try_from(w).map(drop)),
                _ => v1::Decision::decode(bytes.as_slice()).map(|w| RemoteDecision::try_from(w).map(drop)),
            };
            match result {
                Ok(Ok(())) => accepted += 1,
                Ok(Err(_)) => refused += 1,
                Err(_) => undecodable += 1,
            }
        }
        // Every path is exercised.
        assert!(accepted > 0 && refused > 0 && undecodable > 0, "{accepted} {refused} {undecodable}");
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = Rng(42);
        for _ in 0..5000 {
            let len = rng.below(64);
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if let Ok(w) = v1::ViewSnapshot::decode(bytes.as_slice()) {
                let _ = ViewSnapshot::try_from(w);
            }
            if let Ok(w) = v1::Job::decode(bytes.as_slice()) {
                let _ = Job::try_from(w);
            }
            if let Ok(w) = v1::Topology::decode(bytes.as_slice()) {
                let _ = Topology::try_from(w);
            }
            if let Ok(w) = v1::Decision::decode(bytes.as_slice()) {
                let _ = RemoteDecision::try_from(w);
            }
            if let Ok(w) = v1::Proposal::decode(bytes.as_slice()) {
                let _ = Proposal::try_from(w);
            }
        }
    }
}
