//! The commands replicated through the log ([`Command`]) and what applying one returns
//! ([`Outcome`]); [`ClusterView::apply`] dispatches them.

use super::*;

/// A state change, replicated through the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Admit a job (refused if it could never fit). With a request id, admitted at most once:
    /// a retry under an id the view remembers is answered with the job it admitted.
    Submit {
        /// What the job asks for (boxed: the largest command by far).
        spec: Box<JobSpec>,
        /// The client's id for this submission, if it gave one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<RequestId>,
        /// Who submits it: the authenticated caller's name, set by the leader (never taken
        /// from the request body).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// The trace its admission was recorded under, set by the leader from the caller's
        /// trace context (see [`crate::trace`]); every member of an array shares it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace: Option<crate::JobTrace>,
    },
    /// The proposing leader's wall clock, Unix milliseconds, written first in every log entry.
    /// The view's clock becomes the largest stamp applied (it never goes back); jobs' times
    /// and the usage ledger read it (see [`crate::usage`]). Changes no version.
    Clock {
        /// Unix milliseconds on the proposing leader.
        at_ms: u64,
    },
    /// A batch of proposals, each approved or rejected on its own, each atomic.
    Propose(Vec<Proposal>),
    /// A batch of moves by the migration module, each atomic on its own: the job's current
    /// placement is released and the proposal's members taken in one step (see
    /// [`ClusterView::migrate`]).
    Migrate(Vec<Proposal>),
    /// Place a pending job on resources held by lower-priority jobs, atomically: every victim
    /// is released whole and re-queued and the preemptor placed, or nothing changes (see
    /// [`ClusterView::preempt`]).
    Preempt(crate::Preemption),
    /// Move a live job to another attained-service queue (0 = the least service). Within one
    /// priority a job may preempt jobs of a higher queue: the scheduler host that holds the job
    /// demotes it as it attains service, as Tiresias' discretized LAS does.
    SetServiceQueue {
        /// The job.
        job: JobId,
        /// Its new queue.
        queue: u8,
    },
    /// A job ended; release its resources.
    Release {
        /// The job.
        job: JobId,
        /// Whether it failed.
        failed: bool,
    },
    /// Cancel a job in any live state.
    Cancel {
        /// The job.
        job: JobId,
        /// Why, kept as the job's error (a scheduler that gives up says why here).
        #[serde(default)]
        reason: Option<String>,
        /// Seconds its tasks get between SIGTERM and SIGKILL, over its spec's `stop_grace_s`
        /// (at most [`crate::job::MAX_STOP_GRACE_S`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_s: Option<u64>,
    },
    /// Change a server's health; `Down` re-queues its gangs whole. `Up` on a cordoned server
    /// makes it [`Health::Draining`]: alive, taking no new placements.
    SetHealth {
        /// The server.
        server: ServerId,
        /// New health.
        health: Health,
        /// Unix milliseconds on the proposing leader, for the server's history (0: not given).
        #[serde(default)]
        at_ms: u64,
    },
    /// An operator cordons a server (no new placements; running gangs go on) or, with a
    /// deadline, drains it (see [`Cordon`]). Cordoning a cordoned server replaces its cordon.
    Cordon {
        /// The server.
        server: ServerId,
        /// Why and until when.
        cordon: Cordon,
    },
    /// An operator lifts a server's cordon; an alive server takes placements again.
    Uncordon {
        /// The server.
        server: ServerId,
        /// Unix milliseconds on the proposing leader.
        at_ms: u64,
    },
    /// A drain's deadline passed: every gang with a member on the cordoned server is
    /// re-queued whole (the leader proposes it; refused on a server that is not cordoned).
    Evict {
        /// The server.
        server: ServerId,
        /// Unix milliseconds on the proposing leader.
        at_ms: u64,
    },
    /// A node agent's report on one member's task of a placement.
    Task {
        /// The job.
        job: JobId,
        /// The placement the task was started for.
        proposal: ProposalId,
        /// The member (rank) within the gang.
        member: u32,
        /// The reporting server, which must be the member's.
        server: ServerId,
        /// What happened.
        event: TaskEvent,
    },
    /// The devices of a server its agent found unhealthy (bit `i` = device `i`); they are not
    /// placed on until reported healthy again. Jobs holding them keep them until they end.
    SetUnhealthyDevices {
        /// The server.
        server: ServerId,
        /// Every unhealthy device (replaces the previous set).
        devices: u64,
    },
    /// An operator adds a configuration set, with no servers yet (see [`crate::layout`]).
    AddConfigSet {
        /// Its rack (added to the rack table if new).
        rack: String,
        /// Its InfiniBand domain (added if new; a known rack must already be in it).
        ib_domain: String,
        /// Its servers' topology (added to the topology table unless an equal one is there).
        topology: Box<Topology>,
    },
    /// An operator adds servers to a configuration set; they start down until their agents
    /// register.
    AddServers {
        /// The configuration set.
        config_set: ConfigSetId,
        /// The new servers' names, in id order.
        names: Vec<String>,
        /// Unix milliseconds on the proposing leader, for the servers' history.
        at_ms: u64,
    },
    /// An operator removes a server that hosts no gang; its id is never reused.
    RemoveServer {
        /// The server.
        server: ServerId,
        /// Unix milliseconds on the proposing leader, for the server's history.
        at_ms: u64,
    },
    /// An operator removes a configuration set none of whose servers is left.
    RemoveConfigSet {
        /// The configuration set.
        config_set: ConfigSetId,
    },
    /// An admin sets a tenant's GPU quota, or its quota at a priority class and above, or
    /// removes it (see [`crate::policy`]).
    SetQuota {
        /// The tenant.
        tenant: String,
        /// Its quota in GPUs; `None` removes it.
        gpus: Option<u32>,
        /// The class whose priority and above the quota bounds; `None`: all its jobs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        class: Option<String>,
    },
    /// An admin sets a priority class's priority (adding the class), or removes the class.
    SetPriorityClass {
        /// The class.
        class: String,
        /// Its priority; `None` removes it.
        priority: Option<i32>,
    },
    /// An admin revokes a certificate or bearer token by its fingerprint, or takes it off the
    /// list (`None`); every replica and agent refuses a listed credential (see
    /// [`crate::revocation`]).
    SetRevocation {
        /// `sha256:` and 64 lowercase hex digits.
        fingerprint: String,
        /// The entry; `None` removes it.
        revocation: Option<crate::revocation::Revocation>,
    },
}

impl Command {
    /// Admit `spec` with no request id (no deduplication of retries).
    pub fn submit(spec: JobSpec) -> Command {
        Command::Submit { spec: Box::new(spec), request: None, user: None, trace: None }
    }
}

/// The result of applying a [`Command`].
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The new job's id, or why it was refused.
    Submitted(Result<JobId, ViewError>),
    /// One decision per proposal, in order.
    Decided(Vec<Decision>),
    /// Release, cancel or service-queue result.
    Ended(Result<(), ViewError>),
    /// Jobs re-queued by a health change, a cordon or an eviction.
    HealthSet(Result<Vec<JobId>, ViewError>),
    /// The job's state after a task report.
    TaskReported(Result<JobState, ViewError>),
    /// Device health recorded.
    DevicesSet(Result<(), ViewError>),
    /// What a layout command added (nothing, for a removal), or why it was refused.
    Layout(Result<crate::layout::LayoutChange, ViewError>),
    /// A quota, priority class or revocation set, or why it was refused.
    Policy(Result<(), ViewError>),
    /// The view's clock after a [`Command::Clock`] (Unix ms), and the jobs it failed because
    /// their time limit passed.
    Clock {
        /// The view's clock.
        now_ms: u64,
        /// Jobs failed by their time limit, one version each.
        expired: Vec<JobId>,
    },
}
