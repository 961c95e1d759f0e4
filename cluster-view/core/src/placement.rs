//! Proposals, placements and the approver's decisions.

use crate::ids::{JobId, ProposalId, ServerId, ViewVersion};
use crate::locality::LocalityLevel;
use crate::mask::{CoreMask, format_indices};
use crate::server::{Health, ServerRecord};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// What one gang member is granted on one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberPlacement {
    /// The server.
    pub server: ServerId,
    /// Granted devices.
    pub gpus: u64,
    /// Granted cores.
    pub cores: CoreMask,
    /// Granted memory in MiB.
    pub memory_mib: u32,
}

#[cfg(test)]
impl MemberPlacement {
    /// For unit tests: `gpus` GPUs from device `first` of server 0, a seed-8gpu server, with
    /// their shares of its cores and memory.
    pub(crate) fn seed_8gpu(first: u32, gpus: u32) -> MemberPlacement {
        let t = crate::topology::Topology::preset("seed-8gpu").expect("preset");
        let (cores, memory) = (t.cores() / t.devices, t.memory_mib / t.devices);
        MemberPlacement {
            server: ServerId(0),
            gpus: ((1u64 << gpus) - 1) << first,
            cores: CoreMask::range(first * cores, gpus * cores),
            memory_mib: memory * gpus,
        }
    }
}

/// A scheduler's proposal: a whole gang for one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Unique id; the approver applies a proposal id at most once.
    pub id: ProposalId,
    /// The job.
    pub job: JobId,
    /// Every member, in rank order.
    pub members: Vec<MemberPlacement>,
    /// The view version the scheduler planned against (for diagnostics).
    pub based_on: ViewVersion,
}

/// A committed gang placement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangPlacement {
    /// The proposal that created it.
    pub proposal: ProposalId,
    /// Every member, in rank order.
    pub members: Vec<MemberPlacement>,
    /// The locality level achieved.
    pub level: LocalityLevel,
    /// The version at which it was committed.
    pub placed_at: ViewVersion,
}

/// Why the approver refused a proposal.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum Rejection {
    /// The proposal names a job the view does not know.
    #[error("unknown job")]
    UnknownJob,
    /// The job is not waiting for a placement.
    #[error("job is {state}, not pending")]
    JobNotPending {
        /// Its state.
        state: String,
    },
    /// The job waits for other jobs to end first (its spec's `after` / `after_any`).
    #[error("job waits for {first} to end first ({count} job(s) left)")]
    DependencyPending {
        /// The first job it still waits for.
        first: JobId,
        /// How many it still waits for.
        count: u32,
    },
    /// A move was proposed for a job that does not hold a placement it could move (pending,
    /// ended, or already being moved).
    #[error("job is {state}; only a placed or running job can be moved")]
    NotMovable {
        /// Its state.
        state: String,
    },
    /// The proposal id was already used for another job.
    #[error("proposal id already used for {other}")]
    ProposalIdReused {
        /// The job it was used for.
        other: JobId,
    },
    /// The proposal id was applied before for this job and that placement has since ended
    /// (released, or failed with a server); plan again under a new id.
    #[error("proposal was applied before and its placement has ended; propose again with a new id")]
    ProposalSpent,
    /// The gang is not whole.
    #[error("gang has {got} members, job needs {expected}")]
    WrongMemberCount {
        /// Members the job needs.
        expected: u32,
        /// Members proposed.
        got: u32,
    },
    /// A member names a server that does not exist.
    #[error("member {member}: unknown server {server}")]
    UnknownServer {
        /// Member index.
        member: u32,
        /// The server id.
        server: ServerId,
    },
    /// A member names devices the server does not have.
    #[error("member {member}: server {server} has no devices {}", format_indices(*.mask))]
    DevicesOutOfRange {
        /// Member index.
        member: u32,
        /// The server.
        server: ServerId,
        /// The non-existent devices.
        mask: u64,
    },
    /// A member names cores the server does not have.
    #[error("member {member}: server {server} has no cores {}", .mask.format())]
    CoresOutOfRange {
        /// Member index.
        member: u32,
        /// The server.
        server: ServerId,
        /// The non-existent cores.
        mask: CoreMask,
    },
    /// A member has the wrong number of GPUs.
    #[error("member {member}: {got} GPUs, job needs {expected} per member")]
    WrongGpuCount {
        /// Member index.
        member: u32,
        /// GPUs per member.
        expected: u32,
        /// GPUs proposed.
        got: u32,
    },
    /// A member's core count is outside what the job accepts.
    #[error("member {member}: {got} cores, job accepts {min}..={max}")]
    WrongCoreCount {
        /// Member index.
        member: u32,
        /// Fewest accepted.
        min: u32,
        /// Most accepted.
        max: u32,
        /// Proposed.
        got: u32,
    },
    /// A member's memory differs from the job's demand.
    #[error("member {member}: {got} MiB of memory, job needs {expected} MiB")]
    WrongMemory {
        /// Member index.
        member: u32,
        /// Demand.
        expected: u32,
        /// Proposed.
        got: u32,
    },
    /// A server's device type is not the one the job requires.
    #[error("member {member}: server {server} has {got}, job needs {expected}")]
    WrongGpuType {
        /// Member index.
        member: u32,
        /// The server.
        server: ServerId,
        /// Required type.
        expected: String,
        /// The server's type.
        got: String,
    },
    /// Two members of the gang claim the same device or core.
    #[error("members overlap on server {server}")]
    OverlapWithinGang {
        /// The server.
        server: ServerId,
    },
    /// The gang is looser than the job tolerates.
    #[error("gang spans {achieved}, job tolerates at most {tolerate}")]
    LocalityTooLoose {
        /// Level achieved.
        achieved: crate::LocalityLevel,
        /// Level tolerated.
        tolerate: crate::LocalityLevel,
    },
    /// The tenant would exceed its GPU quota, or its quota at a priority class and above.
    #[error(
        "tenant {tenant} would hold {} GPUs{}, quota {quota}",
        .used + .asked,
        .class.as_ref().map(|c| format!(" at class `{c}` or above")).unwrap_or_default()
    )]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// The class whose quota it is, if a class quota (it bounds that class and above).
        class: Option<String>,
        /// Its quota.
        quota: u32,
        /// GPUs it holds.
        used: u32,
        /// GPUs asked.
        asked: u32,
    },
    /// Conflict: a server is not up.
    #[error("server {server} is {health}")]
    ServerNotUp {
        /// The server.
        server: ServerId,
        /// Its health.
        health: Health,
    },
    /// Conflict: devices already taken.
    #[error("server {server}: devices {} are taken", format_indices(*.mask))]
    DevicesBusy {
        /// The server.
        server: ServerId,
        /// The taken devices.
        mask: u64,
    },
    /// Conflict: cores already taken.
    #[error("server {server}: cores {} are taken", .mask.format())]
    CoresBusy {
        /// The server.
        server: ServerId,
        /// The taken cores.
        mask: CoreMask,
    },
    /// Conflict: not enough free memory.
    #[error("server {server}: {free} MiB free, {asked} MiB asked")]
    MemoryShort {
        /// The server.
        server: ServerId,
        /// Free memory.
        free: u32,
        /// Memory asked.
        asked: u32,
    },
    /// A preemption names no victim, or more than [`crate::preemption::MAX_VICTIMS`].
    #[error("a preemption names {got} victims; it needs 1 to {max}")]
    VictimCount {
        /// Victims named.
        got: u32,
        /// The most allowed.
        max: u32,
    },
    /// A preemption names a job it may not take resources from.
    #[error("victim {victim}: {problem}")]
    Victim {
        /// The victim.
        victim: JobId,
        /// Why it may not be preempted.
        problem: crate::preemption::VictimProblem,
    },
}

impl Rejection {
    /// True when the proposal was well-formed but planned on stale state: the scheduler should
    /// apply the decision's fresh server records and try again.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Rejection::ServerNotUp { .. }
                | Rejection::DevicesBusy { .. }
                | Rejection::CoresBusy { .. }
                | Rejection::MemoryShort { .. }
                | Rejection::QuotaExceeded { .. }
        )
    }

    /// A short stable code for metrics and APIs.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::UnknownJob => "unknown_job",
            Rejection::JobNotPending { .. } => "job_not_pending",
            Rejection::DependencyPending { .. } => "dependency_pending",
            Rejection::NotMovable { .. } => "not_movable",
            Rejection::ProposalIdReused { .. } => "proposal_id_reused",
            Rejection::ProposalSpent => "proposal_spent",
            Rejection::WrongMemberCount { .. } => "wrong_member_count",
            Rejection::UnknownServer { .. } => "unknown_server",
            Rejection::DevicesOutOfRange { .. } => "devices_out_of_range",
            Rejection::CoresOutOfRange { .. } => "cores_out_of_range",
            Rejection::WrongGpuCount { .. } => "wrong_gpu_count",
            Rejection::WrongCoreCount { .. } => "wrong_core_count",
            Rejection::WrongMemory { .. } => "wrong_memory",
            Rejection::WrongGpuType { .. } => "wrong_gpu_type",
            Rejection::OverlapWithinGang { .. } => "overlap_within_gang",
            Rejection::LocalityTooLoose { .. } => "locality_too_loose",
            Rejection::QuotaExceeded { .. } => "quota_exceeded",
            Rejection::ServerNotUp { .. } => "server_not_up",
            Rejection::DevicesBusy { .. } => "devices_busy",
            Rejection::CoresBusy { .. } => "cores_busy",
            Rejection::MemoryShort { .. } => "memory_short",
            Rejection::VictimCount { .. } => "victim_count",
            Rejection::Victim { .. } => "victim_not_preemptible",
        }
    }
}

/// The approver's answer to a proposal. `R` is the rejection reason: [`Rejection`] where the
/// approver runs, or a wire form of it (code and message) on a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision<R = Rejection> {
    /// Committed: every member holds its resources.
    Accepted {
        /// The job.
        job: JobId,
        /// The proposal.
        proposal: ProposalId,
        /// The level achieved.
        level: LocalityLevel,
        /// The version that contains it.
        version: ViewVersion,
    },
    /// This proposal id was committed before (a retry); nothing changed.
    AlreadyApplied {
        /// The job.
        job: JobId,
        /// The proposal.
        proposal: ProposalId,
        /// The current version.
        version: ViewVersion,
    },
    /// Refused; nothing changed.
    Rejected {
        /// The job.
        job: JobId,
        /// The proposal.
        proposal: ProposalId,
        /// Why (the first problem found).
        reason: R,
        /// Current records of every server whose state conflicted, then (for conflicts) of the
        /// servers changed since the proposal's `based_on` version, up to
        /// [`crate::approver::FRESH_CAP`]: the scheduler retries without re-reading the view.
        fresh: Vec<(ServerId, ServerRecord)>,
        /// The current version.
        version: ViewVersion,
    },
}

impl<R> Decision<R> {
    /// Whether the job now holds the proposed placement.
    pub fn is_placed(&self) -> bool {
        matches!(self, Decision::Accepted { .. } | Decision::AlreadyApplied { .. })
    }

    /// The job.
    pub fn job(&self) -> JobId {
        match self {
            Decision::Accepted { job, .. } | Decision::AlreadyApplied { job, .. } | Decision::Rejected { job, .. } => {
                *job
            }
        }
    }

    /// The proposal.
    pub fn proposal(&self) -> ProposalId {
        match self {
            Decision::Accepted { proposal, .. }
            | Decision::AlreadyApplied { proposal, .. }
            | Decision::Rejected { proposal, .. } => *proposal,
        }
    }

    /// The view version after the decision.
    pub fn version(&self) -> ViewVersion {
        match self {
            Decision::Accepted { version, .. }
            | Decision::AlreadyApplied { version, .. }
            | Decision::Rejected { version, .. } => *version,
        }
    }

    /// The same decision with its rejection reason converted.
    pub fn map_reason<S>(self, f: impl FnOnce(R) -> S) -> Decision<S> {
        match self {
            Decision::Accepted { job, proposal, level, version } => {
                Decision::Accepted { job, proposal, level, version }
            }
            Decision::AlreadyApplied { job, proposal, version } => Decision::AlreadyApplied { job, proposal, version },
            Decision::Rejected { job, proposal, reason, fresh, version } => {
                Decision::Rejected { job, proposal, reason: f(reason), fresh, version }
            }
        }
    }
}
