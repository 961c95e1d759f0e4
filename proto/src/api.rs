//! The JSON shapes of the view's HTTP API, shared by the CLI's `--json` output.
//!
//! One type per answer: [`Status`], [`JobList`] of [`Job`], [`JobDetail`], [`ServerList`] of
//! [`Server`], [`Logs`], [`Submitted`], [`Cancelled`], and [`ErrorBody`] for every error. The
//! view replica's HTTP API (`tessera-view-server`'s `http` module) serves them, the `tessera`
//! CLI prints the same with `--json`, and the OpenAPI document at `/v1/openapi.json` is
//! derived from them (`utoipa`), so the three cannot drift apart.
//!
//! The facts both sides compute come from one function each: [`gpu_bitmap`], [`free_gpus`]
//! (free means on an up server, not held and healthy; an unhealthy GPU is never free) and
//! [`GpuCounts::of`].

mod layout;
mod policy;
mod timeline;
pub use layout::{AddConfigSetBody, AddServersBody, ConfigSetInfo, ConfigSetList, LayoutChanged, free_server_names};
pub use policy::{
    ClassBody, ClassQuota, Policy, PolicyChanged, PriorityClass, Quota, QuotaBody, RevocationBody, Revoked,
};
pub use timeline::{TimelineStep, timeline};

use crate::v1;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_view::{Health, JobSpec, JobState, LocalityLevel, ServerRecord, TaskState, ViewSnapshot};
use utoipa::ToSchema;
use utoipa::openapi::schema::{Object, ObjectBuilder, SchemaType, Type};

/// Every job state, in life order (counts by state list zeros too).
pub const JOB_STATES: [JobState; 6] =
    [JobState::Pending, JobState::Placed, JobState::Running, JobState::Migrating, JobState::Finished, JobState::Failed];
/// Every server health.
pub const HEALTHS: [Health; 4] = [Health::Up, Health::Draining, Health::Down, Health::Removed];
/// Every task state.
pub const TASK_STATES: [TaskState; 3] = [TaskState::Starting, TaskState::Running, TaskState::Succeeded];
/// The raft roles a replica reports.
pub const ROLES: [&str; 4] = ["leader", "follower", "candidate", "pre-candidate"];

/// A string schema with these values only (nullable: `null` too).
fn enum_schema<'a>(values: impl IntoIterator<Item = &'a str>, nullable: bool, description: &str) -> Object {
    let mut values: Vec<serde_json::Value> = values.into_iter().map(serde_json::Value::from).collect();
    let ty = if nullable {
        values.push(serde_json::Value::Null);
        SchemaType::from_iter([Type::String, Type::Null])
    } else {
        SchemaType::Type(Type::String)
    };
    ObjectBuilder::new().schema_type(ty).enum_values(Some(values)).description(Some(description)).build()
}

fn job_state_schema() -> Object {
    enum_schema(JOB_STATES.map(JobState::as_str), false, "the job's state")
}

fn task_state_schema() -> Object {
    enum_schema(TASK_STATES.map(TaskState::as_str), false, "the task's state as its agent reported it")
}

fn health_schema() -> Object {
    enum_schema(HEALTHS.map(Health::as_str), false, "whether the server takes placements")
}

fn level_schema() -> Object {
    enum_schema(LocalityLevel::ALL.map(LocalityLevel::as_str), false, "a locality level, tightest first")
}

fn placed_level_schema() -> Object {
    enum_schema(LocalityLevel::ALL.map(LocalityLevel::as_str), true, "the level the placement achieved; null if none")
}

fn role_schema() -> Object {
    enum_schema(ROLES, false, "the replica's raft role")
}

fn spec_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some("the validated spec as the view holds it (resolved: members x gpus_per_member)"))
        .build()
}

/// Every error: a stable `code` to act on and a `message` for people, with the place in the
/// input at fault when there is one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Stable snake_case code, e.g. `unknown_job`, `never_fits`, `invalid_spec`,
    /// `malformed_json`, `malformed_toml`, `unavailable`.
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// The input field at fault, as a path (`locality.tolerate`, `command[0]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The line (1-based) of the body at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// The column (1-based, in characters) of the body at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
}

/// GPUs of the cluster by use. `total = used + free + unavailable`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GpuCounts {
    /// Every GPU of every server (removed servers have none).
    pub total: u64,
    /// Held by a job.
    pub used: u64,
    /// Free to place on: on an up server, not held, healthy ([`free_gpus`]).
    pub free: u64,
    /// Neither used nor free: unhealthy, or on a server that is draining or down.
    pub unavailable: u64,
}

impl GpuCounts {
    /// The counts of a view.
    pub fn of(s: &ViewSnapshot) -> GpuCounts {
        let mut c = GpuCounts::default();
        for (i, r) in s.servers.iter().enumerate().filter(|(_, r)| r.health != Health::Removed) {
            let devices = topology_of(s, i).map_or(0, |t| t.devices);
            let all = tessera_view::mask::low_bits(devices);
            c.total += u64::from(devices);
            c.used += u64::from((all & !r.free_gpus).count_ones());
            c.free += u64::from(free_gpus(r, devices, unhealthy_of(s, i)));
        }
        c.unavailable = c.total - c.used - c.free;
        c
    }
}

/// A server's GPUs free to place on: not held, healthy, and the server up. The one definition
/// of a free GPU for people (the API, the CLI, `/metrics`).
pub fn free_gpus(r: &ServerRecord, devices: u32, unhealthy: u64) -> u32 {
    if r.health != Health::Up {
        return 0;
    }
    (r.free_gpus & tessera_view::mask::low_bits(devices) & !unhealthy).count_ones()
}

/// A server's GPUs as one character each, device 0 first: `x` held by a job, `.` free, `!`
/// unhealthy, `-` not held but the server is not up (draining or down).
pub fn gpu_bitmap(devices: u32, free: u64, unhealthy: u64, up: bool) -> String {
    (0..devices.min(64))
        .map(|d| {
            let bit = 1u64 << d;
            if unhealthy & bit != 0 {
                '!'
            } else if free & bit == 0 {
                'x'
            } else if up {
                '.'
            } else {
                '-'
            }
        })
        .collect()
}

/// The set bits of a mask, lowest first.
fn indices(mask: u64) -> Vec<u32> {
    (0..64).filter(|i| mask >> i & 1 == 1).collect()
}

fn topology_of(s: &ViewSnapshot, server: usize) -> Option<&tessera_view::Topology> {
    let r = s.servers.get(server)?;
    let cs = s.config_sets.get(r.config_set.index())?;
    s.topologies.get(usize::from(cs.topology))
}

fn unhealthy_of(s: &ViewSnapshot, server: usize) -> u64 {
    s.unhealthy.get(server).copied().unwrap_or(0)
}

/// A server's name, or `#id` when the names do not reach it.
pub fn server_name(names: &[String], id: u32) -> String {
    names.get(id as usize).cloned().unwrap_or_else(|| format!("#{id}"))
}

/// Jobs of a view by state, every state listed.
pub fn jobs_by_state(s: &ViewSnapshot) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = JOB_STATES.iter().map(|st| (st.as_str().to_string(), 0)).collect();
    for j in &s.jobs {
        *out.entry(j.state.as_str().to_string()).or_insert(0) += 1;
    }
    out
}

/// The stable code of a refused submission, as the HTTP API's error `code` and the CLI print
/// it (`refused` when the replica did not say why).
pub fn refusal_code(r: v1::SubmitRefusal) -> &'static str {
    match r {
        v1::SubmitRefusal::NeverFits => "never_fits",
        v1::SubmitRefusal::InvalidSpec => "invalid_spec",
        v1::SubmitRefusal::OutcomeUnknown => "outcome_unknown",
        v1::SubmitRefusal::RequestReused => "request_reused",
        v1::SubmitRefusal::BadRequestId => "bad_request_id",
        v1::SubmitRefusal::Unspecified => "refused",
    }
}

/// A scheduler host and the pending jobs it holds under its lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SchedulerHost {
    /// Its name.
    pub host: String,
    /// The job ids it holds.
    pub jobs: Vec<u64>,
}

/// The answer of the probes `GET /healthz` (the replica serves) and `GET /readyz` (it also knows
/// a leader, so the cluster has a quorum it reaches and writes through it can commit).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Probe {
    /// `ok`, or what the replica lacks (`no leader known`).
    pub status: String,
    /// The answering replica.
    pub replica: u64,
    /// The replica's raft role.
    #[schema(schema_with = role_schema)]
    pub role: String,
    /// The leader's id (0: none known).
    pub leader: u64,
    /// The raft term.
    pub term: u64,
    /// The raft index the view reflects.
    pub applied_index: u64,
}

impl Probe {
    /// The probe of a replica that answered `s`: ready when it knows a leader.
    pub fn of(s: &v1::StatusResponse) -> Probe {
        Probe {
            status: if s.leader == 0 { "no leader known".into() } else { "ok".into() },
            replica: s.replica,
            role: s.role.clone(),
            leader: s.leader,
            term: s.term,
            applied_index: s.applied_index,
        }
    }

    /// Whether the replica knows a leader.
    pub fn ready(&self) -> bool {
        self.leader != 0
    }
}

/// A replica's raft status with the cluster in brief.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Status {
    /// The answering replica.
    pub replica: u64,
    /// The cluster's name.
    pub cluster: String,
    /// The replica's raft role.
    #[schema(schema_with = role_schema)]
    pub role: String,
    /// The leader's id (0: none known).
    pub leader: u64,
    /// The leader's client address (empty: none known).
    pub leader_addr: String,
    /// The raft term.
    pub term: u64,
    /// The raft index the view reflects.
    pub applied_index: u64,
    /// The view version.
    pub version: u64,
    /// The voting replicas.
    pub voters: Vec<u64>,
    /// Raft log entries held.
    pub log_entries: u64,
    /// The applied view's state hash, 16 hex digits (equal on replicas at the same index).
    #[schema(pattern = "^[0-9a-f]{16}$")]
    pub state_hash: String,
    /// Jobs by state (every state listed).
    pub jobs: BTreeMap<String, u64>,
    /// GPUs by use.
    pub gpus: GpuCounts,
    /// Servers by health (every health listed).
    pub servers: BTreeMap<String, u64>,
    /// Scheduler hosts holding pending jobs (the leader knows them; empty elsewhere).
    pub scheduler_hosts: Vec<SchedulerHost>,
}

impl Status {
    /// The status `st` of a replica with the view `s` it holds.
    pub fn of(st: &v1::StatusResponse, s: &ViewSnapshot) -> Status {
        let mut servers: BTreeMap<String, u64> = HEALTHS.iter().map(|h| (h.as_str().to_string(), 0)).collect();
        for r in &s.servers {
            *servers.entry(r.health.as_str().to_string()).or_insert(0) += 1;
        }
        Status {
            replica: st.replica,
            cluster: st.cluster.clone(),
            role: st.role.clone(),
            leader: st.leader,
            leader_addr: st.leader_addr.clone(),
            term: st.term,
            applied_index: st.applied_index,
            version: st.version,
            voters: st.voters.clone(),
            log_entries: st.log_entries,
            state_hash: format!("{:016x}", st.state_hash),
            jobs: jobs_by_state(s),
            gpus: GpuCounts::of(s),
            servers,
            scheduler_hosts: st
                .scheduler_hosts
                .iter()
                .map(|h| SchedulerHost { host: h.host.clone(), jobs: h.jobs.clone() })
                .collect(),
        }
    }
}

/// One gang member's placement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Member {
    /// The member's rank.
    pub member: u32,
    /// Its server's name.
    pub server: String,
    /// Its server's id.
    pub server_id: u32,
    /// Its GPUs (device indices).
    pub gpus: Vec<u32>,
    /// Its cores (core indices).
    pub cores: Vec<u32>,
    /// Its memory, MiB.
    pub memory_mib: u32,
}

/// One member's task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Task {
    /// The member's rank.
    pub member: u32,
    /// Its server's name.
    pub server: String,
    /// Its state.
    #[schema(schema_with = task_state_schema)]
    pub state: TaskState,
}

/// A job in brief.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Job {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its tenant.
    pub tenant: String,
    /// Where it is in its life.
    #[schema(schema_with = job_state_schema)]
    pub state: JobState,
    /// GPUs of the whole gang.
    pub gpus: u32,
    /// Gang members.
    pub members: u32,
    /// GPUs per member.
    pub gpus_per_member: u32,
    /// The device type asked for, if any.
    pub gpu_type: Option<String>,
    /// The scheduler asked for (the host's default when null).
    pub scheduler: Option<String>,
    /// Higher runs first, and may preempt lower.
    pub priority: i32,
    /// The priority class it named, if it named one (its priority comes from it).
    pub class: Option<String>,
    /// The model it named, if any (a spec that declared no slowdown was admitted with that
    /// model's losses, shown in `slowdown`).
    pub model: Option<String>,
    /// Throughput it loses at each locality level, by level name, as admitted (empty: none
    /// declared; its host then accepts any level it tolerates at once).
    #[serde(default)]
    pub slowdown: BTreeMap<String, f64>,
    /// How many times a higher-ranked job preempted it.
    pub preemptions: u32,
    /// Its attained-service queue (0 = the least service); within a priority, a job may preempt
    /// jobs of a higher queue.
    pub service_queue: u8,
    /// The view version at which it was admitted.
    pub submitted_at: u64,
    /// The tightest locality wanted.
    #[schema(schema_with = level_schema)]
    pub prefer: LocalityLevel,
    /// The loosest locality accepted.
    #[schema(schema_with = level_schema)]
    pub tolerate: LocalityLevel,
    /// The level its placement achieved (null while it holds none).
    #[schema(schema_with = placed_level_schema)]
    pub locality: Option<LocalityLevel>,
    /// Its members' placement (empty while it holds none).
    pub placement: Vec<Member>,
    /// Why it failed, was cancelled, re-queued or preempted.
    pub error: Option<String>,
    /// Who submitted it (the authenticated caller; empty when unknown).
    pub user: String,
    /// When it was admitted, Unix ms (null: before the view kept times).
    pub submitted_ms: Option<u64>,
    /// When its current or last placement was approved, Unix ms (null: never placed).
    pub placed_ms: Option<u64>,
    /// When every member of its current or last placement had started, Unix ms.
    pub started_ms: Option<u64>,
    /// When it finished, failed or was cancelled, Unix ms.
    pub ended_ms: Option<u64>,
    /// Restarts after failures so far.
    pub restarts: u32,
    /// The restarts its policy allows (null: it has no restart policy, a failure ends it).
    pub max_restarts: Option<u32>,
    /// A restarted job is not placed before this time, Unix ms (null: any time).
    pub not_before_ms: Option<u64>,
    /// Jobs that must finish before it is placed (as submitted; an array's first job stands
    /// for the array).
    pub after: Vec<u64>,
    /// Jobs that must end, in any state, before it is placed.
    pub after_any: Vec<u64>,
    /// The jobs it still waits for (empty: none; it may be placed).
    pub waiting_for: Vec<u64>,
    /// Its index in its array (null: submitted alone); the array's first job is `id - index`.
    pub array_index: Option<u32>,
    /// The size of its array (null: submitted alone).
    pub array_size: Option<u32>,
}

impl Job {
    /// A job of the view; `names` are the servers' names by id.
    pub fn of(j: &tessera_view::Job, names: &[String]) -> Job {
        let spec = &j.spec;
        let members = j.placement.as_ref().map_or(&[][..], |p| p.members.as_slice());
        let placement = members
            .iter()
            .zip(0u32..)
            .map(|(m, rank)| Member {
                member: rank,
                server: server_name(names, m.server.0),
                server_id: m.server.0,
                gpus: indices(m.gpus),
                cores: m.cores.indices().collect(),
                memory_mib: m.memory_mib,
            })
            .collect();
        Job {
            id: j.id.0,
            name: spec.name.clone(),
            tenant: spec.tenant.clone(),
            state: j.state,
            gpus: spec.total_gpus(),
            members: spec.members,
            gpus_per_member: spec.gpus_per_member,
            gpu_type: spec.gpu_type.clone(),
            scheduler: spec.scheduler.clone(),
            priority: spec.priority,
            class: spec.class.clone(),
            model: spec.model.clone(),
            slowdown: spec.slowdown.iter().map(|(l, s)| (l.to_string(), *s)).collect(),
            preemptions: j.preemptions,
            service_queue: j.service_queue,
            submitted_at: j.submitted_at.0,
            prefer: spec.prefer,
            tolerate: spec.tolerate,
            locality: j.placement.as_ref().map(|p| p.level),
            placement,
            error: j.error.clone(),
            user: j.user.clone(),
            submitted_ms: nonzero(j.times.submitted_ms),
            placed_ms: nonzero(j.times.placed_ms),
            started_ms: nonzero(j.times.started_ms),
            ended_ms: nonzero(j.times.ended_ms),
            restarts: j.restarts,
            max_restarts: spec.run.restart.map(|r| r.max),
            not_before_ms: nonzero(j.not_before_ms),
            after: spec.after.iter().map(|d| d.0).collect(),
            after_any: spec.after_any.iter().map(|d| d.0).collect(),
            waiting_for: j.waiting_for.iter().map(|(d, _)| d.0).collect(),
            array_index: j.array_index,
            array_size: spec.array,
        }
    }
}

/// `None` for 0 (a time not yet reached, or not kept).
fn nonzero(ms: u64) -> Option<u64> {
    (ms != 0).then_some(ms)
}

/// Every reason a pending job waits ([`tessera_view::Waiting`]'s codes).
pub const WAIT_REASONS: [&str; 7] =
    ["never_fits", "quota", "capacity", "locality", "restarting", "dependency", "ready"];

fn wait_reason_schema() -> Object {
    enum_schema(
        WAIT_REASONS,
        false,
        "why it waits: never_fits, quota, capacity, locality, restarting (its restart backoff), dependency (other jobs must end first) or ready (it fits now)",
    )
}

fn level_or_null_schema() -> Object {
    enum_schema(LocalityLevel::ALL.map(LocalityLevel::as_str), true, "a locality level; null if none")
}

/// Why a pending job waits, from the view alone (`tessera_view::wait`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WaitInfo {
    /// The reason's code.
    #[schema(schema_with = wait_reason_schema)]
    pub reason: String,
    /// The reason in words.
    pub message: String,
    /// Its place in the queue (0: first): a higher priority, then a lower attained-service
    /// queue, then an earlier submission come first.
    pub position: u32,
    /// How long it has waited since submission, ms (the view's clock).
    pub waited_ms: u64,
    /// The loosest level it accepts now (its `prefer` loosened by `relax_after_s`).
    #[schema(schema_with = level_schema)]
    pub allowed: LocalityLevel,
    /// The tightest level with room now, within its tolerance (null: none).
    #[schema(schema_with = level_or_null_schema)]
    pub fits_at: Option<LocalityLevel>,
    /// When the level it accepts loosens next, Unix ms (null: no timer, or no step left).
    pub relax_at_ms: Option<u64>,
}

impl WaitInfo {
    /// The API shape of an explanation of `spec`'s job.
    pub fn of(e: &tessera_view::WaitExplanation, spec: &JobSpec) -> WaitInfo {
        WaitInfo::of_wire(&crate::convert::job_waiting(e, spec))
    }

    /// The API shape of an explanation from the wire (`GetJob`'s `waiting`).
    pub fn of_wire(w: &v1::JobWaiting) -> WaitInfo {
        let level = |l: i32| v1::LocalityLevel::try_from(l).ok().and_then(|l| LocalityLevel::try_from(l).ok());
        WaitInfo {
            reason: w.reason.clone(),
            message: w.message.clone(),
            position: w.position,
            waited_ms: w.waited_ms,
            allowed: level(w.allowed).unwrap_or(LocalityLevel::Any),
            fits_at: level(w.fits_at),
            relax_at_ms: (w.relax_at_ms != 0).then_some(w.relax_at_ms),
        }
    }
}

/// A pending job and why it waits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueuedJob {
    /// The job in brief.
    #[serde(flatten)]
    pub job: Job,
    /// Why it waits.
    pub waiting: WaitInfo,
}

/// The pending jobs in queue order, one page, each with why it waits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Queue {
    /// The view version read.
    pub version: u64,
    /// The raft index the view reflects.
    pub applied_index: u64,
    /// The view's clock, Unix ms.
    pub now_ms: u64,
    /// Pending jobs the filter keeps, on every page.
    pub total: u64,
    /// This page, in queue order.
    pub jobs: Vec<QueuedJob>,
}

/// Default page of a queue listing.
pub const DEFAULT_QUEUE_PAGE: usize = 100;
/// Largest page of a queue listing (each job is explained: a pass over the servers per shape).
pub const MAX_QUEUE_PAGE: usize = 1000;

impl Queue {
    /// The pending jobs of `s` that `keep` keeps, from position `offset`, at most `limit`
    /// (`s` becomes the view they are explained on: no copy of it).
    pub fn of(
        s: ViewSnapshot,
        applied_index: u64,
        keep: impl Fn(&tessera_view::Job) -> bool,
        offset: usize,
        limit: usize,
    ) -> Queue {
        let (version, now_ms, names) = (s.version.0, s.now_ms, s.server_names.clone());
        let view = tessera_view::ClusterView::from_snapshot(s);
        let mut ex = tessera_view::Explainer::new(&view);
        let queue = ex.queue();
        // Positions count every pending job, kept or not: the place in the real queue.
        let kept: Vec<(u32, &tessera_view::Job)> =
            queue.iter().zip(0u32..).filter(|(j, _)| keep(j)).map(|(j, i)| (i, *j)).collect();
        let jobs = kept
            .iter()
            .skip(offset)
            .take(limit)
            .map(|(pos, j)| QueuedJob {
                job: Job::of(j, &names),
                waiting: WaitInfo::of(&ex.explain_at(j, *pos), &j.spec),
            })
            .collect();
        Queue { version, applied_index, now_ms, total: kept.len() as u64, jobs }
    }
}

/// One replica as the HTTP API's replica reached it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReplicaState {
    /// Its id (0: it did not answer).
    pub replica: u64,
    /// Its client address.
    pub addr: String,
    /// Whether it answered.
    pub reachable: bool,
    /// Why it did not answer.
    pub error: Option<String>,
    /// Its raft role (empty when unreachable).
    pub role: String,
    /// The leader it knows (0: none).
    pub leader: u64,
    /// Its raft term.
    pub term: u64,
    /// The raft index its view reflects.
    pub applied_index: u64,
    /// Entries it is behind the most advanced replica that answered.
    pub lag: u64,
    /// Raft log entries it holds.
    pub log_entries: u64,
    /// Its view's state hash, 16 hex digits (equal on replicas at the same index).
    pub state_hash: String,
}

/// Every replica the answering one knows, as each answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Replicas {
    /// The replicas, by address as known (the answering replica first).
    pub replicas: Vec<ReplicaState>,
}

impl Replicas {
    /// The answers (or failures) of each replica address; lags against the highest index seen.
    pub fn of(answers: Vec<(String, Result<v1::StatusResponse, String>)>) -> Replicas {
        let top = answers.iter().filter_map(|(_, r)| r.as_ref().ok().map(|s| s.applied_index)).max().unwrap_or(0);
        let replicas = answers
            .into_iter()
            .map(|(addr, r)| match r {
                Ok(s) => ReplicaState {
                    replica: s.replica,
                    addr,
                    reachable: true,
                    error: None,
                    role: s.role,
                    leader: s.leader,
                    term: s.term,
                    applied_index: s.applied_index,
                    lag: top.saturating_sub(s.applied_index),
                    log_entries: s.log_entries,
                    state_hash: format!("{:016x}", s.state_hash),
                },
                Err(e) => ReplicaState {
                    replica: 0,
                    addr,
                    reachable: false,
                    error: Some(e),
                    role: String::new(),
                    leader: 0,
                    term: 0,
                    applied_index: 0,
                    lag: 0,
                    log_entries: 0,
                    state_hash: String::new(),
                },
            })
            .collect();
        Replicas { replicas }
    }
}

/// GPU and CPU-core time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageFigures {
    /// GPU-hours.
    pub gpu_hours: f64,
    /// CPU-core-hours.
    pub core_hours: f64,
    /// GPU-milliseconds (exact).
    pub gpu_ms: u64,
    /// CPU-core-milliseconds (exact).
    pub core_ms: u64,
}

impl UsageFigures {
    fn of(gpu_ms: u64, core_ms: u64) -> UsageFigures {
        let u = tessera_view::Usage { gpu_ms, core_ms };
        UsageFigures { gpu_hours: u.gpu_hours(), core_hours: u.core_hours(), gpu_ms, core_ms }
    }
}

/// One row of a usage report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageLine {
    /// The tenant.
    pub tenant: String,
    /// The user (empty when grouped by tenant, or unknown).
    pub user: String,
    /// The job, when grouped by job.
    pub job: Option<u64>,
    /// What it used within the range.
    #[serde(flatten)]
    pub usage: UsageFigures,
}

/// GPU and CPU-core time used over a range, by tenant, user or job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    /// From, Unix ms (the ledger's hourly part starts at the hour).
    pub from_ms: u64,
    /// Until, Unix ms.
    pub to_ms: u64,
    /// The grouping: `tenant`, `user` or `job`.
    pub by: String,
    /// Rows, largest GPU time first.
    pub rows: Vec<UsageLine>,
    /// The sum over every row (also those past the limit).
    pub total: UsageFigures,
    /// The view version read.
    pub version: u64,
}

impl UsageReport {
    /// The answer of the `Usage` RPC.
    pub fn of(r: &v1::UsageResponse) -> UsageReport {
        UsageReport {
            from_ms: r.from_ms,
            to_ms: r.to_ms,
            by: r.by.clone(),
            rows: r
                .rows
                .iter()
                .map(|row| UsageLine {
                    tenant: row.tenant.clone(),
                    user: row.user.clone(),
                    job: row.job,
                    usage: UsageFigures::of(row.gpu_ms, row.core_ms),
                })
                .collect(),
            total: UsageFigures::of(r.total_gpu_ms, r.total_core_ms),
            version: r.version,
        }
    }
}

/// A job in full: the brief, its spec, the proposals made for it and its tasks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobDetail {
    /// The brief.
    #[serde(flatten)]
    pub job: Job,
    /// The validated spec.
    #[schema(schema_with = spec_schema)]
    pub spec: JobSpec,
    /// Proposals made for it, by id.
    pub proposals: Vec<u64>,
    /// Its members' tasks (empty while it holds no placement).
    pub tasks: Vec<Task>,
    /// Why it waits, while it is pending (null otherwise).
    pub waiting: Option<WaitInfo>,
    /// The distributed trace it was admitted under, 32 hex digits: search a tracing back end
    /// for it (null: admitted without one).
    pub trace_id: Option<String>,
    /// Its admission span as a W3C `traceparent` (null: no trace).
    pub traceparent: Option<String>,
    /// The steps of its life, oldest first (see `tessera status JOB --trace`).
    pub timeline: Vec<TimelineStep>,
}

impl JobDetail {
    /// A job of the view; `names` are the servers' names by id.
    pub fn of(j: &tessera_view::Job, names: &[String]) -> JobDetail {
        let job = Job::of(j, names);
        let tasks = job
            .placement
            .iter()
            .map(|m| Task {
                member: m.member,
                server: m.server.clone(),
                state: j.tasks.get(m.member as usize).copied().unwrap_or_default(),
            })
            .collect();
        JobDetail {
            job,
            spec: j.spec.clone(),
            proposals: j.proposals.iter().map(|p| p.0).collect(),
            tasks,
            waiting: None,
            trace_id: j.trace.as_ref().map(tessera_view::JobTrace::trace_hex),
            traceparent: j.trace.as_ref().map(tessera_view::JobTrace::traceparent),
            timeline: timeline(j),
        }
    }
}

/// The jobs the view holds that a filter keeps, one page of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    /// The view version read.
    pub version: u64,
    /// The raft index the view reflects.
    pub applied_index: u64,
    /// The jobs of this page, by id.
    pub jobs: Vec<Job>,
    /// How many jobs the filter keeps, on every page.
    #[serde(default)]
    pub total: u64,
    /// The id to pass as `after` for the next page; null on the last.
    #[serde(default)]
    pub next_after: Option<u64>,
}

/// A page of the history of ended jobs the view forgot (the `History` RPC), in the order
/// they ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobHistory {
    /// The jobs.
    pub jobs: Vec<Job>,
    /// With `next_after_job`, where the next page starts (pass them as `after_ended_ms` and
    /// `after_job`); null on the last page.
    pub next_after_ended_ms: Option<u64>,
    /// The last job of this page, when more may follow.
    pub next_after_job: Option<u64>,
}

impl JobHistory {
    /// The page a `History` answer holds; a job that does not convert is left out, with a
    /// warning.
    pub fn of(r: &v1::HistoryResponse) -> JobHistory {
        let jobs = r
            .jobs
            .iter()
            .filter_map(|w| match tessera_view::Job::try_from(w.clone()) {
                Ok(j) => Some(Job::of(&j, &[])),
                Err(e) => {
                    tracing::warn!(job_id = w.id, error = %e, "a job of the history does not convert");
                    None
                }
            })
            .collect();
        let more = r.next_after_job != 0;
        JobHistory {
            jobs,
            next_after_ended_ms: more.then_some(r.next_after_ended_ms),
            next_after_job: more.then_some(r.next_after_job),
        }
    }
}

/// Jobs per page when none is asked for.
pub const DEFAULT_JOB_PAGE: usize = 1_000;
/// The most jobs one page holds.
pub const MAX_JOB_PAGE: usize = 10_000;

/// Which jobs a list keeps, and which page of them: the one filter of `GET /v1/jobs` and
/// `tessera jobs`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobFilter {
    /// Only these states (empty: every state).
    pub states: Vec<JobState>,
    /// Only this tenant's.
    pub tenant: Option<String>,
    /// Only this submitter's.
    pub user: Option<String>,
    /// Only ids above this (the previous page's `next_after`).
    pub after: Option<u64>,
    /// At most this many (0: [`DEFAULT_JOB_PAGE`]; at most [`MAX_JOB_PAGE`]).
    pub limit: usize,
}

impl JobFilter {
    /// A comma-separated list of job states (`pending,running`).
    pub fn parse_states(text: &str) -> Result<Vec<JobState>, String> {
        text.split(',')
            .map(|s| {
                JOB_STATES.iter().copied().find(|st| st.as_str() == s).ok_or_else(|| {
                    let known: Vec<&str> = JOB_STATES.iter().map(|st| st.as_str()).collect();
                    format!("unknown job state `{s}`; known: {}", known.join(", "))
                })
            })
            .collect()
    }

    fn keeps(&self, j: &Job) -> bool {
        (self.states.is_empty() || self.states.contains(&j.state))
            && self.tenant.as_ref().is_none_or(|t| *t == j.tenant)
            && self.user.as_ref().is_none_or(|u| *u == j.user)
    }

    /// Keeps the jobs of `list` the filter matches, sets `total` to their number, then cuts
    /// the page: ids above `after`, at most `limit`, with `next_after` set when more follow.
    pub fn apply(&self, list: &mut JobList) {
        list.jobs.retain(|j| self.keeps(j));
        list.jobs.sort_by_key(|j| j.id);
        list.total = list.jobs.len() as u64;
        if let Some(after) = self.after {
            list.jobs.retain(|j| j.id > after);
        }
        let limit = if self.limit == 0 { DEFAULT_JOB_PAGE } else { self.limit.min(MAX_JOB_PAGE) };
        list.next_after = None;
        if list.jobs.len() > limit {
            list.jobs.truncate(limit);
            list.next_after = list.jobs.last().map(|j| j.id);
        }
    }
}

impl JobList {
    /// The jobs of a view read at `applied_index`, by id.
    pub fn of(s: &ViewSnapshot, applied_index: u64) -> JobList {
        let mut jobs: Vec<Job> = s.jobs.iter().map(|j| Job::of(j, &s.server_names)).collect();
        jobs.sort_by_key(|j| j.id);
        let total = jobs.len() as u64;
        JobList { version: s.version.0, applied_index, jobs, total, next_after: None }
    }
}

/// A server with its health and GPU bitmap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Server {
    /// Its id.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Whether it takes placements.
    #[schema(schema_with = health_schema)]
    pub health: Health,
    /// Its GPUs' device type.
    pub device_type: String,
    /// Its topology's name.
    pub topology: String,
    /// Its rack.
    pub rack: String,
    /// Its InfiniBand domain.
    pub ib_domain: String,
    /// Its GPUs.
    pub gpus: u32,
    /// Its GPUs free to place on ([`free_gpus`]).
    pub gpus_free: u32,
    /// One character per GPU ([`gpu_bitmap`]): `x` used, `.` free, `!` unhealthy, `-` the server is not up.
    #[schema(pattern = "^[x.!-]*$")]
    pub gpu_bitmap: String,
    /// Its unhealthy GPUs (device indices).
    pub unhealthy_gpus: Vec<u32>,
    /// Cores not held.
    pub cores_free: u32,
    /// Its cores.
    pub cores: u32,
    /// Memory not held, MiB.
    pub memory_free_mib: u32,
    /// Its memory, MiB.
    pub memory_mib: u32,
    /// An operator's cordon or drain, if it has one (it then takes no placements).
    pub cordon: Option<ServerCordon>,
}

/// An operator's hold on a server: no new placements; with a deadline, a drain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServerCordon {
    /// Why, in the operator's words.
    pub reason: String,
    /// When it was set, Unix milliseconds.
    pub since_ms: u64,
    /// A drain's deadline, Unix milliseconds: gangs still on the server then are re-queued.
    pub drain_by_ms: Option<u64>,
}

/// One change of a server's health or cordon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServerHealthChange {
    /// The view version of the change.
    pub version: u64,
    /// Unix milliseconds on the leader that made it (0: not recorded).
    pub at_ms: u64,
    /// The health after it.
    #[schema(schema_with = health_schema)]
    pub health: Health,
    /// Whether the server is cordoned after it.
    pub cordoned: bool,
    /// What happened.
    pub why: String,
}

/// One server in detail: its state and its latest health changes, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServerDetail {
    /// The view version read.
    pub version: u64,
    /// The server.
    pub server: Server,
    /// Its latest health and cordon changes (at most 16), oldest first.
    pub history: Vec<ServerHealthChange>,
}

impl ServerDetail {
    /// Server `i` of a view in detail, if it has one.
    pub fn of(s: &ViewSnapshot, i: usize) -> Option<ServerDetail> {
        let server = Server::of(s, i)?;
        let history = s
            .health_history
            .iter()
            .find(|(id, _)| id.index() == i)
            .map(|(_, h)| {
                h.iter()
                    .map(|c| ServerHealthChange {
                        version: c.version.0,
                        at_ms: c.at_ms,
                        health: c.health,
                        cordoned: c.cordoned,
                        why: c.why.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(ServerDetail { version: s.version.0, server, history })
    }
}

impl Server {
    /// Server `i` of a view, if it has one.
    pub fn of(s: &ViewSnapshot, i: usize) -> Option<Server> {
        let r = s.servers.get(i)?;
        let topo = topology_of(s, i)?;
        let cs = s.config_sets.get(r.config_set.index())?;
        let devices = topo.devices;
        let bad = unhealthy_of(s, i);
        // A removed server holds nothing: every GPU reads `-` (not up), none `x` (held).
        let free = match r.health {
            Health::Removed => tessera_view::mask::low_bits(devices),
            _ => r.free_gpus & tessera_view::mask::low_bits(devices),
        };
        Some(Server {
            id: u32::try_from(i).ok()?,
            name: s.server_names.get(i).cloned().unwrap_or_default(),
            health: r.health,
            device_type: topo.device_type.clone(),
            topology: topo.name.clone(),
            rack: s.racks.get(cs.rack as usize).cloned().unwrap_or_default(),
            ib_domain: s.ib_domains.get(cs.ib_domain as usize).cloned().unwrap_or_default(),
            gpus: devices,
            gpus_free: free_gpus(r, devices, bad),
            gpu_bitmap: gpu_bitmap(devices, free, bad, r.health == Health::Up),
            unhealthy_gpus: indices(bad),
            cores_free: r.free_cores.count(),
            cores: topo.cores(),
            memory_free_mib: r.free_memory_mib,
            memory_mib: topo.memory_mib,
            cordon: s.cordons.iter().find(|(id, _)| id.index() == i).map(|(_, c)| ServerCordon {
                reason: c.reason.clone(),
                since_ms: c.since_ms,
                drain_by_ms: c.drain_by_ms,
            }),
        })
    }
}

/// Servers of the view: one page of those a [`ServerFilter`] keeps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServerList {
    /// The view version read.
    pub version: u64,
    /// The servers of this page, by id.
    pub servers: Vec<Server>,
    /// How many servers the filter keeps, on every page.
    #[serde(default)]
    pub total: u64,
    /// The id to pass as `after` for the next page; null on the last.
    #[serde(default)]
    pub next_after: Option<u32>,
}

/// Servers per page when none is asked for.
pub const DEFAULT_SERVER_PAGE: usize = 10_000;
/// The most servers one page holds.
pub const MAX_SERVER_PAGE: usize = 100_000;

/// Which servers a list keeps, and which page of them: the one filter of `GET /v1/servers` and
/// `tessera servers`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerFilter {
    /// Only these healths (empty: any but removed: tombstones are listed only when asked for).
    pub health: Vec<Health>,
    /// Only this rack's.
    pub rack: Option<String>,
    /// Only servers of this GPU type.
    pub device_type: Option<String>,
    /// Only servers with at least this many GPUs free to place on.
    pub min_free_gpus: u32,
    /// Only cordoned (true) or uncordoned (false) servers.
    pub cordoned: Option<bool>,
    /// Only ids above this (the previous page's `next_after`).
    pub after: Option<u32>,
    /// At most this many (0: [`DEFAULT_SERVER_PAGE`]; at most [`MAX_SERVER_PAGE`]).
    pub limit: usize,
}

impl ServerFilter {
    /// A comma-separated list of healths (`up,draining`).
    pub fn parse_health(text: &str) -> Result<Vec<Health>, String> {
        text.split(',')
            .map(|h| {
                HEALTHS
                    .iter()
                    .copied()
                    .find(|x| x.as_str() == h)
                    .ok_or_else(|| format!("unknown health `{h}`; known: up, draining, down, removed"))
            })
            .collect()
    }

    fn keeps(&self, s: &Server) -> bool {
        let health = if self.health.is_empty() { s.health != Health::Removed } else { self.health.contains(&s.health) };
        health
            && self.rack.as_ref().is_none_or(|r| *r == s.rack)
            && self.device_type.as_ref().is_none_or(|t| *t == s.device_type)
            && s.gpus_free >= self.min_free_gpus
            && self.cordoned.is_none_or(|c| c == s.cordon.is_some())
    }

    /// The servers of a view this filter keeps, one page of them, `total` counting them all.
    pub fn list(&self, s: &ViewSnapshot) -> ServerList {
        let limit = if self.limit == 0 { DEFAULT_SERVER_PAGE } else { self.limit.min(MAX_SERVER_PAGE) };
        let mut total = 0u64;
        let mut servers = Vec::new();
        let mut next_after = None;
        for server in (0..s.servers.len()).filter_map(|i| Server::of(s, i)).filter(|x| self.keeps(x)) {
            total += 1;
            if self.after.is_some_and(|a| server.id <= a) {
                continue;
            }
            if servers.len() == limit {
                next_after = servers.last().map(|x: &Server| x.id);
                continue;
            }
            servers.push(server);
        }
        ServerList { version: s.version.0, servers, total, next_after }
    }
}

impl ServerList {
    /// Every server of a view (one page of at most [`MAX_SERVER_PAGE`]).
    pub fn of(s: &ViewSnapshot) -> ServerList {
        ServerFilter { limit: MAX_SERVER_PAGE, ..ServerFilter::default() }.list(s)
    }
}

/// A job admitted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Submitted {
    /// Its id (an array's first job).
    pub job: u64,
    /// Its name.
    pub name: String,
    /// Every job admitted: `job` alone, or an array's jobs in index order (consecutive ids).
    pub jobs: Vec<u64>,
}

impl Submitted {
    /// The answer for `spec` admitted as `first` (an array: `first` and the ids after it).
    pub fn of(first: u64, spec: &JobSpec) -> Submitted {
        let count = u64::from(spec.array.unwrap_or(1));
        Submitted { job: first, name: spec.name.clone(), jobs: (first..first.saturating_add(count)).collect() }
    }
}

/// An operator's cordon, drain or uncordon, done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CordonChanged {
    /// The server's name.
    pub server: String,
    /// What was done: `cordon`, `drain` or `uncordon`.
    pub action: String,
    /// The view version after it.
    pub version: u64,
}

/// A job cancelled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Cancelled {
    /// Its id.
    pub job: u64,
    /// Always true.
    pub cancelled: bool,
    /// The view version after the cancellation.
    pub version: u64,
}

/// The tail of a member's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Logs {
    /// The job.
    pub job: u64,
    /// The member.
    pub member: u32,
    /// `stdout` or `stderr`.
    #[schema(pattern = "^(stdout|stderr)$")]
    pub stream: String,
    /// The server whose agent answered.
    pub server: String,
    /// The log file's path on that server.
    pub path: String,
    /// The log's whole size, bytes.
    pub size: u64,
    /// Whether bytes before the tail were left out.
    pub truncated: bool,
    /// The tail, as UTF-8 (invalid bytes replaced).
    pub data: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::{ClusterSpec, ClusterView, ServerId};

    #[test]
    fn a_filter_keeps_matching_jobs_and_pages_them_by_id() {
        let mut v = ClusterView::from_spec(&ClusterSpec::uniform(
            tessera_view::Topology::preset("seed-8gpu").expect("preset"),
            1,
            1,
            1,
        ));
        for i in 0..5 {
            let mut s = JobSpec::simple(&format!("j{i}"), 1, 1);
            s.tenant = if i % 2 == 0 { "vision".into() } else { "nlp".into() };
            v.submit_as(&s, None, Some(if i < 2 { "ana" } else { "bob" })).expect("submit");
        }
        let all = JobList::of(&v.snapshot(), 1);
        let page = |f: JobFilter| {
            let mut l = all.clone();
            f.apply(&mut l);
            (l.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), l.total, l.next_after)
        };
        assert_eq!(page(JobFilter::default()), (vec![1, 2, 3, 4, 5], 5, None));
        assert_eq!(page(JobFilter { tenant: Some("vision".into()), ..Default::default() }), (vec![1, 3, 5], 3, None));
        assert_eq!(page(JobFilter { user: Some("ana".into()), ..Default::default() }), (vec![1, 2], 2, None));
        assert_eq!(page(JobFilter { limit: 2, ..Default::default() }), (vec![1, 2], 5, Some(2)));
        assert_eq!(page(JobFilter { limit: 2, after: Some(2), ..Default::default() }), (vec![3, 4], 5, Some(4)));
        assert_eq!(page(JobFilter { limit: 2, after: Some(4), ..Default::default() }), (vec![5], 5, None));
        let running = JobFilter::parse_states("running").expect("state");
        assert_eq!(page(JobFilter { states: running, ..Default::default() }), (vec![], 0, None));
        assert!(JobFilter::parse_states("pending,done").unwrap_err().contains("unknown job state `done`"));
    }

    fn view() -> ViewSnapshot {
        let spec = ClusterSpec::from_toml(
            "<test>",
            "name = \"api\"\n[[racks]]\nname = \"r0\"\nib_domain = \"ib0\"\ntopology = \"seed-8gpu\"\nservers = 2\n",
            None,
        )
        .expect("a cluster spec");
        ClusterView::from_spec(&spec).snapshot()
    }

    #[test]
    fn a_replica_is_ready_only_while_it_knows_a_leader() {
        let mut s =
            v1::StatusResponse { replica: 2, role: "follower".into(), leader: 1, term: 4, ..Default::default() };
        let p = Probe::of(&s);
        assert!(p.ready());
        assert_eq!((p.status.as_str(), p.replica, p.leader, p.term), ("ok", 2, 1, 4));
        (s.role, s.leader) = ("candidate".into(), 0);
        let p = Probe::of(&s);
        assert!(!p.ready());
        assert_eq!((p.status.as_str(), p.role.as_str()), ("no leader known", "candidate"));
    }

    #[test]
    fn bitmap_marks_used_free_unhealthy_and_not_up() {
        assert_eq!(gpu_bitmap(8, 0b0011_0011, 0, true), "..xx..xx");
        assert_eq!(gpu_bitmap(4, 0b1101, 0b0100, true), ".x!.");
        assert_eq!(gpu_bitmap(4, 0b1101, 0b0100, false), "-x!-");
    }

    #[test]
    fn unhealthy_gpus_and_servers_not_up_are_not_free() {
        let mut s = view();
        assert_eq!(GpuCounts::of(&s), GpuCounts { total: 16, used: 0, free: 16, unavailable: 0 });
        // An unhealthy GPU still in the record's free mask is not free (the API and the CLI
        // once disagreed here).
        s.unhealthy = vec![0b11, 0];
        s.servers[1].health = Health::Draining;
        s.servers[0].free_gpus &= !0b1000;
        let c = GpuCounts::of(&s);
        assert_eq!(c, GpuCounts { total: 16, used: 1, free: 5, unavailable: 10 });
        let list = ServerList::of(&s);
        assert_eq!(list.servers[0].gpus_free, 5);
        assert_eq!(list.servers[0].gpu_bitmap, "!!.x....");
        assert_eq!(list.servers[1].gpus_free, 0);
        assert_eq!(list.servers[1].gpu_bitmap, "--------");
        assert_eq!(list.servers.iter().map(|s| u64::from(s.gpus_free)).sum::<u64>(), c.free);
    }

    #[test]
    fn a_server_filter_keeps_matching_servers_and_pages_them_by_id() {
        let spec = ClusterSpec::from_toml(
            "<test>",
            "name = \"api\"\n[[racks]]\nname = \"r0\"\nib_domain = \"ib0\"\ntopology = \"seed-8gpu\"\nservers = 3\n\
             [[racks]]\nname = \"r1\"\nib_domain = \"ib0\"\ntopology = \"pcie-4gpu\"\nservers = 2\n",
            None,
        )
        .expect("a cluster spec");
        let mut v = ClusterView::from_spec(&spec);
        v.set_health(tessera_view::ServerId(1), Health::Down).expect("known server");
        let s = v.snapshot();
        let page = |f: ServerFilter| {
            let l = f.list(&s);
            (l.servers.iter().map(|x| x.id).collect::<Vec<_>>(), l.total, l.next_after)
        };
        assert_eq!(page(ServerFilter::default()), (vec![0, 1, 2, 3, 4], 5, None));
        assert_eq!(page(ServerFilter { rack: Some("r1".into()), ..Default::default() }), (vec![3, 4], 2, None));
        let up = ServerFilter::parse_health("up").expect("health");
        assert_eq!(page(ServerFilter { health: up, ..Default::default() }), (vec![0, 2, 3, 4], 4, None));
        // The down server has no GPU free; the 4-GPU servers have fewer than 5.
        assert_eq!(page(ServerFilter { min_free_gpus: 5, ..Default::default() }), (vec![0, 2], 2, None));
        let t = s.topologies.iter().find(|t| t.devices == 4).expect("pcie-4gpu").device_type.clone();
        assert_eq!(page(ServerFilter { device_type: Some(t), ..Default::default() }).1, 2);
        assert_eq!(page(ServerFilter { cordoned: Some(true), ..Default::default() }), (vec![], 0, None));
        assert_eq!(page(ServerFilter { limit: 2, ..Default::default() }), (vec![0, 1], 5, Some(1)));
        assert_eq!(page(ServerFilter { limit: 2, after: Some(1), ..Default::default() }), (vec![2, 3], 5, Some(3)));
        assert_eq!(page(ServerFilter { limit: 2, after: Some(3), ..Default::default() }), (vec![4], 5, None));
        assert!(ServerFilter::parse_health("up,gone").unwrap_err().contains("unknown health `gone`"));
    }

    #[test]
    fn job_round_trips_through_json() {
        let mut v = ClusterView::from_snapshot(view());
        let id = v.submit(JobSpec::simple("a", 2, 2)).expect("admitted");
        let s = v.snapshot();
        let j = s.jobs.iter().find(|j| j.id == id).expect("the job");
        let detail = JobDetail::of(j, &s.server_names);
        let text = serde_json::to_string(&detail).expect("JSON");
        let back: JobDetail = serde_json::from_str(&text).expect("the same shape back");
        assert_eq!(back, detail);
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["state"], "pending");
        assert_eq!(v["prefer"], "pcie-switch");
        assert_eq!(v["locality"], serde_json::Value::Null);
        assert_eq!(v["gpus"], 4);
        assert_eq!(server_name(&s.server_names, 99), "#99");
        assert_eq!(server_name(&s.server_names, ServerId(0).0), s.server_names[0]);
    }
}
