//! The agent's main loop: register, heartbeat under the lease, follow the view, and make the
//! placements on this server real.
//!
//! The loop is a reconciler, as a kubelet is: it keeps the jobs whose placement has a member
//! here (from a snapshot plus the view's `Watch` deltas), and on every change compares the tasks
//! those members want with the tasks the [`Runner`] holds. A member with no task is started (its
//! placement is checked against the discovered devices first); a task whose placement is gone
//! (the job was cancelled, failed elsewhere, or re-queued after a lease expiry) is stopped.
//! Task starts and exits go to the view as [`v1::ReportTaskRequest`]s through an outbox that is
//! retried until the view answers, so an exit reported during a leader change is not lost.
//!
//! Tasks outlive the agent: stopping or killing the agent leaves them running under their
//! shims, and the next agent on the same data directory re-adopts them (or reports how they
//! ended meanwhile) before it starts anything, so a restart neither duplicates nor orphans them.

use crate::discover::{DiscoverOptions, Discovery, GpuSource, HealthProbe, discover};
use crate::task::{Control, Runner, TaskExit, TaskId, TaskSpec};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;
use tessera_proto::client::{ClientError, ViewClient};
use tessera_proto::v1;
use tessera_view::{CoreMask, Job, JobState, ServerId, TaskState, Topology, ViewDelta, ViewSnapshot};
use thiserror::Error;
use tonic::Code;

/// Exit code reported for a member the agent could not start (bad placement, spawn failure).
pub const CANNOT_START: i32 = 125;

/// Finished task directories (specs, logs, exit records) kept for people to read; older ones
/// are removed once their job no longer holds a placement on this server.
pub const KEEP_FINISHED: usize = 512;

/// A file in a task directory: the view acknowledged the task's exit report.
const REPORTED: &str = "reported";

/// Longest exit message sent to the view (bytes); the view refuses longer ones.
const MAX_MESSAGE: usize = 1024;

/// Most task reports sent at once.
const FLUSH_BATCH: usize = 256;

/// How long one watch stream is followed before re-subscribing (from the current version).
const WATCH_REFRESH: Duration = Duration::from_secs(30);

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// View replica addresses (`host:port`).
    pub view: Vec<String>,
    /// This server's name in the cluster spec.
    pub name: String,
    /// Where task directories (specs, logs, exit records) live, under a directory named after
    /// the cluster's identity: `<data_dir>/<cluster>/tasks/<task>`; one per agent.
    pub data_dir: PathBuf,
    /// Fake-GPU mode: a topology preset name or file instead of NVML.
    pub topology: Option<String>,
    /// The command that runs a task's shim (`[tessera, "agent", "shim"]`).
    pub shim: Vec<String>,
    /// How long a stopped task has between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// Give tasks `MASTER_ADDR=127.0.0.1` instead of the first member's server name (every
    /// server of the cluster runs on this machine: `tessera dev`, tests).
    pub peers_on_loopback: bool,
    /// Fake-GPU mode: a file listing unhealthy device indices (a stand-in for NVML health).
    pub fake_health_file: Option<PathBuf>,
    /// Where the agent's own gRPC service (task logs) listens, `host:port` (port 0 picks one);
    /// none when absent. The bound address is announced to the view.
    pub listen: Option<String>,
}

/// Why the agent stopped.
#[derive(Debug, Error)]
pub enum AgentError {
    /// Discovery failed or found nothing to offer.
    #[error("discovery: {0}")]
    Discover(String),
    /// The view refused the registration for good (unknown name, different topology).
    #[error("the view refused server `{name}`: {why}")]
    Refused {
        /// The server name.
        name: String,
        /// The view's reason.
        why: String,
    },
    /// The task runner's state directory is unusable.
    #[error("task runner: {0}")]
    Runner(String),
}

/// Discovers the server, registers it, and serves its placements until `shutdown` resolves.
/// Tasks keep running after it returns.
pub async fn run(cfg: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let discovery = discover(&DiscoverOptions { topology: cfg.topology.clone() })
        .map_err(|e| AgentError::Discover(e.to_string()))?;
    let Some(topology) = discovery.topology.clone() else {
        let why = match &discovery.gpus {
            GpuSource::Absent { reason } => reason.clone(),
            _ => "no GPUs found".to_string(),
        };
        return Err(AgentError::Discover(format!(
            "{why}; this server has nothing to offer (for a machine without GPUs, run in fake-GPU mode with --topology PRESET|FILE)"
        )));
    };
    for w in &discovery.warnings {
        tracing::warn!(server = %cfg.name, "{w}");
    }
    let mut client = ViewClient::new(cfg.view.clone())
        .map_err(|e| AgentError::Discover(format!("view addresses: {e}")))?
        .with_deadline(Duration::from_secs(3));
    let probe = HealthProbe::new(&discovery).with_fake_health_file(cfg.fake_health_file.clone());
    let wire = v1::Topology::from(&topology);
    // Bound before registering, so the registration can say where logs are served.
    let listener = match &cfg.listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| AgentError::Runner(format!("agent service address {a}: {e}")))?,
        ),
        None => None,
    };
    let agent_addr = match &listener {
        Some(l) => {
            let a = l.local_addr().map_err(|e| AgentError::Runner(e.to_string()))?;
            // A wildcard address names no host to reach: announce the server's name (as
            // MASTER_ADDR does), or loopback when every server runs on this machine.
            match (a.ip().is_unspecified(), cfg.peers_on_loopback) {
                (false, _) => a.to_string(),
                (true, true) => format!("127.0.0.1:{}", a.port()),
                (true, false) => format!("{}:{}", cfg.name, a.port()),
            }
        }
        None => String::new(),
    };
    let (server, lease) = register(&mut client, &cfg.name, &wire, &agent_addr).await?;
    // Task directories are kept per cluster identity (`name@hash of its initial view`): a view
    // rebuilt from scratch numbers jobs from 1 again, and must not meet the old directories.
    let cluster = client.status().await.map_err(|e| AgentError::Discover(format!("view status: {e}")))?.cluster;
    let state_dir = cfg.data_dir.join(dir_name(&cluster));
    let runner = Runner::open(&state_dir, cfg.shim.clone()).await.map_err(|e| AgentError::Runner(e.to_string()))?;
    let log_server = listener.map(|l| {
        let svc = v1::agent_server::AgentServer::new(crate::logs::LogService::new(state_dir.join("tasks")));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(l);
        tokio::spawn(tonic::transport::Server::builder().add_service(svc).serve_with_incoming(incoming))
    });
    let adopted = runner.running();
    if !adopted.is_empty() {
        tracing::info!(server = %cfg.name, tasks = adopted.len(), "re-adopted tasks left running by an earlier agent");
    }
    let every = if lease.is_zero() { Duration::from_secs(1) } else { (lease / 3).max(Duration::from_millis(20)) };
    // Heartbeats run on their own, so nothing the loop awaits (a snapshot, a task start, a
    // report during a leader change) can delay them past the lease.
    let beats = tokio::spawn(heartbeats(Beats {
        client: client.clone(),
        name: cfg.name.clone(),
        wire,
        server,
        every,
        probe,
        devices: topology.all_devices(),
        agent_addr,
    }));
    let agent = Agent {
        cfg,
        discovery,
        topology,
        client,
        runner: std::sync::Arc::new(runner),
        server,
        every,
        version: 0,
        names: Vec::new(),
        jobs: HashMap::new(),
        migrating: HashMap::new(),
        no_process: HashSet::new(),
        failed_start: HashSet::new(),
        stopping: HashSet::new(),
        grants: HashMap::new(),
        finished: VecDeque::new(),
        outbox: VecDeque::new(),
        synced: false,
    };
    let r = agent.serve(shutdown, beats).await;
    if let Some(h) = log_server {
        h.abort();
    }
    r
}

/// Registers the server, retrying while the view is unavailable; a refusal (unknown name,
/// different model) is final. Answers the server's id and lease.
async fn register(
    client: &mut ViewClient,
    name: &str,
    wire: &v1::Topology,
    agent_addr: &str,
) -> Result<(ServerId, Duration), AgentError> {
    let mut backoff = Duration::from_millis(100);
    loop {
        match client.register_server(name, wire.clone(), agent_addr).await {
            Ok(l) => {
                tracing::info!(server = %name, id = l.server, lease_ms = l.lease_ms, "registered");
                return Ok((ServerId(l.server), Duration::from_millis(l.lease_ms)));
            }
            Err(ClientError::Status { status, .. })
                if matches!(status.code(), Code::NotFound | Code::FailedPrecondition | Code::InvalidArgument) =>
            {
                return Err(AgentError::Refused { name: name.to_string(), why: status.message().to_string() });
            }
            Err(e) => {
                tracing::warn!(server = %name, "registration failed, retrying: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// What the heartbeat task needs.
struct Beats {
    client: ViewClient,
    name: String,
    wire: v1::Topology,
    server: ServerId,
    every: Duration,
    probe: HealthProbe,
    /// Every device of the model: the health mask never names others.
    devices: u64,
    /// Where the agent's service listens (empty: nowhere).
    agent_addr: String,
}

/// Renews the lease every `every` with the devices' health; registers again when the view
/// marked the server down. Returns only on a final refusal.
async fn heartbeats(mut b: Beats) -> AgentError {
    let mut tick = tokio::time::interval(b.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // NVML calls block: off the async threads.
        let probe = b.probe;
        let (probe, (unhealthy, reasons)) = match tokio::task::spawn_blocking(move || {
            let mut probe = probe;
            let r = probe.probe();
            (probe, r)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => return AgentError::Discover(format!("the device health probe failed: {e}")),
        };
        b.probe = probe;
        match b.client.heartbeat(b.server.0, Some(unhealthy & b.devices), reasons, &b.agent_addr).await {
            Ok(_) => {}
            Err(ClientError::Status { status, .. }) if status.code() == Code::FailedPrecondition => {
                tracing::warn!(server = %b.name, "{}; registering again", status.message());
                if let Err(e) = register(&mut b.client, &b.name, &b.wire, &b.agent_addr).await {
                    return e;
                }
            }
            Err(e) => tracing::warn!(server = %b.name, "heartbeat failed: {e}"),
        }
    }
}

struct Agent {
    cfg: AgentConfig,
    discovery: Discovery,
    topology: Topology,
    client: ViewClient,
    runner: std::sync::Arc<Runner>,
    server: ServerId,
    /// How often the loop reconciles without an event (the heartbeat cadence).
    every: Duration,
    /// The view version the local copy reflects.
    version: u64,
    /// Server names by id (for `MASTER_ADDR`).
    names: Vec<String>,
    /// Jobs holding a placement with a member on this server.
    jobs: HashMap<u64, Job>,
    /// Jobs being moved (migrating), anywhere, by id: the proposal of their new placement. A
    /// task of an older placement of such a job is checkpointed before it stops.
    migrating: HashMap<u64, u64>,
    /// Members placed with no command (simulated jobs): reported started, nothing runs.
    no_process: HashSet<TaskId>,
    /// Members that could not start here (already reported failed).
    failed_start: HashSet<TaskId>,
    /// Tasks this agent stopped because their placement went away; their exits are not reported.
    stopping: HashSet<TaskId>,
    /// Devices and view cores of the tasks this agent started (adopted tasks are not known):
    /// a new task does not start on what a stopping task still holds.
    grants: HashMap<TaskId, (u64, CoreMask)>,
    /// Finished tasks whose directories are kept, oldest first.
    finished: VecDeque<TaskId>,
    /// Task reports not yet acknowledged by the view, oldest first.
    outbox: VecDeque<v1::ReportTaskRequest>,
    /// Whether the local copy has been loaded since the agent started.
    synced: bool,
}

impl Agent {
    async fn serve(
        mut self,
        shutdown: impl Future<Output = ()>,
        mut beats: tokio::task::JoinHandle<AgentError>,
    ) -> Result<(), AgentError> {
        enum Ev {
            Shutdown,
            Tick,
            Fatal(AgentError),
            Watch(Result<Option<v1::WatchEvent>, tonic::Status>),
            Exit(TaskExit),
        }
        let mut shutdown = std::pin::pin!(shutdown);
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stream: Option<tonic::Streaming<v1::WatchEvent>> = None;
        let mut opened = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        let runner = self.runner.clone();
        let result = loop {
            // Re-subscribing now and then (from the current version: a delta) bounds how long
            // a watch on a replica cut off from the others can go stale unnoticed.
            if stream.is_some() && opened.elapsed() > WATCH_REFRESH {
                stream = None;
            }
            if stream.is_none() {
                match self.open_watch().await {
                    Ok(s) => {
                        stream = Some(s);
                        opened = tokio::time::Instant::now();
                        backoff = Duration::from_millis(50);
                        self.reconcile().await;
                        self.flush().await;
                    }
                    Err(e) => {
                        tracing::warn!(server = %self.cfg.name, "cannot follow the view, retrying: {e}");
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                }
            }
            let next = async {
                match stream.as_mut() {
                    Some(s) => s.message().await,
                    None => {
                        tokio::time::sleep(backoff).await;
                        Ok(None)
                    }
                }
            };
            let synced = self.synced;
            let ev = tokio::select! {
                _ = &mut shutdown => Ev::Shutdown,
                r = &mut beats => Ev::Fatal(r.unwrap_or_else(|e| AgentError::Runner(format!("heartbeat task: {e}")))),
                _ = tick.tick() => Ev::Tick,
                ev = next => Ev::Watch(ev),
                // Exits wait for the first sync: keeping or forgetting a task directory needs
                // to know which placements live.
                exit = runner.next_exit(), if synced => Ev::Exit(exit),
            };
            match ev {
                Ev::Shutdown => break Ok(()),
                Ev::Fatal(e) => break Err(e),
                Ev::Tick => self.reconcile().await,
                Ev::Watch(Ok(Some(ev))) => {
                    if let Err(e) = self.apply(ev) {
                        tracing::warn!(server = %self.cfg.name, "bad watch event, reading the view again: {e}");
                        stream = None;
                        continue;
                    }
                    self.reconcile().await;
                }
                Ev::Watch(_) => {
                    if stream.take().is_some() {
                        tracing::info!(server = %self.cfg.name, "watch ended; reconnecting");
                    }
                }
                Ev::Exit(exit) => {
                    self.on_exit(exit);
                    self.reconcile().await;
                }
            }
            self.flush().await;
        };
        beats.abort();
        tracing::info!(server = %self.cfg.name, tasks = self.runner.running().len(), "agent stopping; tasks keep running");
        result
    }

    /// Follows the view from the local copy's version. The first time, the copy is loaded from
    /// a linearizable snapshot (server names, the jobs placed here), so a replica that lags
    /// cannot hand the agent an older view than the one its placements were made on.
    async fn open_watch(&mut self) -> Result<tonic::Streaming<v1::WatchEvent>, String> {
        if !self.synced {
            let snap = self.client.snapshot(true).await.map_err(|e| e.to_string())?;
            let snap = snap.snapshot.ok_or("the view answered no snapshot")?;
            self.apply(v1::WatchEvent { event: Some(v1::watch_event::Event::Snapshot(snap)) })?;
        }
        self.client.watch(self.version).await.map_err(|e| e.to_string())
    }

    /// Applies one watch event to the local copy.
    fn apply(&mut self, ev: v1::WatchEvent) -> Result<(), String> {
        match ev.event {
            Some(v1::watch_event::Event::Snapshot(s)) => {
                let snap = ViewSnapshot::try_from(s).map_err(|e| e.to_string())?;
                if snap.version.0 < self.version {
                    return Err(format!("snapshot at version {} but the copy is at {}", snap.version.0, self.version));
                }
                self.version = snap.version.0;
                self.names = snap.server_names;
                self.jobs.clear();
                self.migrating.clear();
                for j in snap.jobs {
                    self.keep(j);
                }
            }
            Some(v1::watch_event::Event::Delta(d)) => {
                let d = ViewDelta::try_from(d).map_err(|e| e.to_string())?;
                if d.from.0 != self.version {
                    return Err(format!("delta from version {} but the copy is at {}", d.from.0, self.version));
                }
                self.version = d.to.0;
                for j in d.jobs {
                    self.keep(j);
                }
            }
            None => return Err("empty watch event".into()),
        }
        self.synced = true;
        Ok(())
    }

    /// Keeps a job if it holds a placement with a member here; forgets it otherwise.
    fn keep(&mut self, j: Job) {
        // A moved job's new placement may have no member here while its old task still runs
        // here: remember the move (until the job runs again) to checkpoint that task.
        match (&j.placement, j.state) {
            (Some(p), JobState::Migrating) => {
                self.migrating.insert(j.id.0, p.proposal.0);
            }
            _ => {
                self.migrating.remove(&j.id.0);
            }
        }
        let here = j.state.holds_resources()
            && j.placement.as_ref().is_some_and(|p| p.members.iter().any(|m| m.server == self.server));
        if here {
            self.jobs.insert(j.id.0, j);
        } else {
            self.jobs.remove(&j.id.0);
        }
    }

    /// The tasks the placements want here: members not yet succeeded.
    fn desired(&self) -> HashMap<TaskId, (&Job, usize)> {
        let mut want = HashMap::new();
        for j in self.jobs.values() {
            // A migrating job's new members start here like a placed job's.
            if !matches!(j.state, JobState::Placed | JobState::Running | JobState::Migrating) {
                continue;
            }
            let Some(p) = &j.placement else { continue };
            for (k, m) in p.members.iter().enumerate() {
                if m.server == self.server && j.tasks.get(k) != Some(&TaskState::Succeeded) {
                    want.insert(TaskId { job: j.id.0, proposal: p.proposal.0, member: k as u32 }, (j, k));
                }
            }
        }
        want
    }

    async fn reconcile(&mut self) {
        if !self.synced {
            return;
        }
        let running: HashSet<TaskId> = self.runner.running().into_iter().collect();
        let (start, stop, unreported, wanted) = {
            let want = self.desired();
            let stop: Vec<TaskId> =
                running.iter().filter(|id| !want.contains_key(id) && !self.stopping.contains(id)).copied().collect();
            let mut start: Vec<(TaskId, Job, usize)> = want
                .iter()
                .filter(|(id, _)| {
                    !running.contains(id)
                        && !self.no_process.contains(id)
                        && !self.failed_start.contains(id)
                        && !self.runner.task_dir(id).exists()
                })
                .map(|(id, (j, k))| (*id, (*j).clone(), *k))
                .collect();
            start.sort_by_key(|(id, _, _)| *id);
            // Level-triggered: a running task the view still sees as starting (its report was
            // lost with an earlier agent) is reported again.
            let unreported: Vec<TaskId> = want
                .iter()
                .filter(|(id, (j, k))| {
                    running.contains(id) && j.tasks.get(*k).is_none_or(|t| *t == TaskState::Starting)
                })
                .map(|(id, _)| *id)
                .collect();
            let wanted: HashSet<TaskId> = want.keys().copied().collect();
            (start, stop, unreported, wanted)
        };
        self.no_process.retain(|id| wanted.contains(id));
        self.failed_start.retain(|id| wanted.contains(id));
        for id in unreported {
            if !self.outbox.iter().any(|r| is_report_of(r, id)) {
                self.report(id, None);
            }
        }
        for id in stop {
            // A moved job (migrating) holds its new placement from the moment the move commits;
            // the task of its old placement gets the chance to save its state first.
            let migrating = self.migrating.get(&id.job).is_some_and(|new| *new != id.proposal);
            let (what, control) = if migrating {
                ("job migrating: checkpointing its task", Control::Checkpoint { grace: self.cfg.stop_grace })
            } else {
                ("placement gone: stopping its task", Control::Stop { grace: self.cfg.stop_grace })
            };
            tracing::info!(server = %self.cfg.name, task = %id, "{what}");
            match self.runner.control(&id, control) {
                Ok(()) => {
                    self.stopping.insert(id);
                }
                Err(e) => tracing::warn!(server = %self.cfg.name, task = %id, "cannot stop: {e}"),
            }
        }
        let mut launch = Vec::new();
        for (id, job, k) in start {
            let m = job.placement.as_ref().and_then(|p| p.members.get(k)).map(|m| (m.gpus, m.cores));
            let busy = self.stopping.iter().any(|s| match (self.grants.get(s), m) {
                (Some((g, c)), Some((mg, mc))) => g & mg != 0 || c.intersects(mc),
                _ => true,
            });
            if busy {
                // Its devices or cores are still held by a task that is being stopped; the
                // start happens once that task's exit is in.
                tracing::info!(server = %self.cfg.name, task = %id, "waiting for a stopping task to release its grant");
                continue;
            }
            if let Some(spec) = self.prepare(id, &job, k) {
                launch.push(spec);
            }
        }
        // Every start of one round at once: each waits for its shim to report the process.
        let mut starting = tokio::task::JoinSet::new();
        for spec in launch {
            let runner = self.runner.clone();
            starting.spawn(async move { (spec.id, runner.start(spec).await) });
        }
        while let Some(done) = starting.join_next().await {
            let Ok((id, r)) = done else { continue };
            match r {
                Ok(()) => self.report(id, None),
                Err(e) => {
                    tracing::error!(server = %self.cfg.name, task = %id, "task did not start: {e}");
                    self.grants.remove(&id);
                    self.failed_start.insert(id);
                    self.report(id, Some((CANNOT_START, format!("the task could not start: {e}"))));
                }
            }
        }
    }

    /// The spec to start member `k` of `job` with; `None` (reported here) when it has nothing
    /// to run or cannot run on this server.
    fn prepare(&mut self, id: TaskId, job: &Job, k: usize) -> Option<TaskSpec> {
        let spec = match self.task_spec(id, job, k) {
            Ok(Some(spec)) => spec,
            Ok(None) => {
                tracing::info!(server = %self.cfg.name, task = %id, "placement has no command: nothing to run");
                self.no_process.insert(id);
                self.report(id, None);
                return None;
            }
            Err(why) => {
                tracing::error!(server = %self.cfg.name, task = %id, "cannot run the placement: {why}");
                self.failed_start.insert(id);
                self.report(id, Some((CANNOT_START, why)));
                return None;
            }
        };
        if let Some(m) = job.placement.as_ref().and_then(|p| p.members.get(k)) {
            self.grants.insert(id, (m.gpus, m.cores));
        }
        tracing::info!(server = %self.cfg.name, task = %id, command = ?spec.command, cpus = ?spec.cpus, "starting task");
        Some(spec)
    }

    /// What to run for member `k` of `job`; `None` when the job has no command; an error when
    /// the placement names devices or cores this server does not have.
    fn task_spec(&self, id: TaskId, job: &Job, k: usize) -> Result<Option<TaskSpec>, String> {
        let p = job.placement.as_ref().ok_or("the job has no placement")?;
        let m = p.members.get(k).ok_or_else(|| format!("the placement has no member {k}"))?;
        check_member(&self.topology, &self.cfg.name, m)?;
        if job.spec.command.is_empty() {
            return Ok(None);
        }
        let mut cpus: Vec<u32> = m
            .cores
            .indices()
            .flat_map(|c| self.discovery.core_cpus.get(c as usize).cloned().unwrap_or_default())
            .collect();
        cpus.sort_unstable();
        cpus.dedup();
        let devices: Vec<u32> = (0..64).filter(|d| m.gpus >> d & 1 == 1).collect();
        let visible: Vec<String> = match &self.discovery.gpus {
            GpuSource::Nvml { gpus, .. } => devices
                .iter()
                .map(|d| gpus.get(*d as usize).map_or_else(|| d.to_string(), |g| g.uuid.clone()))
                .collect(),
            _ => devices.iter().map(u32::to_string).collect(),
        };
        let local_rank = p.members[..k].iter().filter(|o| o.server == m.server).count();
        let local_world = p.members.iter().filter(|o| o.server == m.server).count();
        let master = if self.cfg.peers_on_loopback {
            "127.0.0.1".to_string()
        } else {
            self.names.get(p.members[0].server.index()).cloned().unwrap_or_else(|| "127.0.0.1".into())
        };
        let env = vec![
            ("CUDA_VISIBLE_DEVICES".into(), visible.join(",")),
            ("TESSERA_JOB_ID".into(), job.id.0.to_string()),
            ("TESSERA_JOB_NAME".into(), job.spec.name.clone()),
            ("TESSERA_PROPOSAL".into(), format!("{:x}", p.proposal.0)),
            ("TESSERA_SERVER".into(), self.cfg.name.clone()),
            ("TESSERA_GPUS".into(), tessera_view::mask::format_indices(m.gpus)),
            ("TESSERA_CORES".into(), m.cores.format()),
            ("RANK".into(), k.to_string()),
            ("LOCAL_RANK".into(), local_rank.to_string()),
            ("WORLD_SIZE".into(), p.members.len().to_string()),
            ("LOCAL_WORLD_SIZE".into(), local_world.to_string()),
            ("MASTER_ADDR".into(), master),
            ("MASTER_PORT".into(), master_port(id).to_string()),
            ("OMP_NUM_THREADS".into(), m.cores.count().max(1).to_string()),
        ];
        Ok(Some(TaskSpec {
            id,
            command: job.spec.command.clone(),
            env,
            cpus,
            memory_limit_mib: (m.memory_mib > 0).then_some(u64::from(m.memory_mib)),
        }))
    }

    fn on_exit(&mut self, exit: TaskExit) {
        let id = exit.id;
        let stopped_by_us = self.stopping.remove(&id);
        self.grants.remove(&id);
        self.keep_finished(id);
        if stopped_by_us {
            tracing::info!(server = %self.cfg.name, task = %id, "stopped task ended: {}", exit.message);
            return;
        }
        if self.runner.task_dir(&id).join(REPORTED).exists() {
            // An earlier agent's report of this exit was acknowledged; the runner delivers
            // every kept exit again after a restart.
            return;
        }
        let code = match (exit.code, exit.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => -s,
            (None, None) => 1,
        };
        tracing::info!(server = %self.cfg.name, task = %id, code, "task ended: {}", exit.message);
        let message = if code == 0 { String::new() } else { exit.message };
        self.report(id, Some((code, message)));
    }

    /// Keeps a finished task's directory (its logs) and forgets the oldest ones beyond
    /// [`KEEP_FINISHED`] whose job no longer holds a placement here. A directory is what tells
    /// [`Agent::reconcile`] that a member already ran, so none is removed while its placement
    /// lives.
    fn keep_finished(&mut self, id: TaskId) {
        self.finished.push_back(id);
        let mut kept = VecDeque::with_capacity(self.finished.len());
        while self.finished.len() + kept.len() > KEEP_FINISHED {
            let Some(old) = self.finished.pop_front() else { break };
            if self.jobs.get(&old.job).and_then(|j| j.placement.as_ref()).is_some_and(|p| p.proposal.0 == old.proposal)
            {
                kept.push_back(old);
                continue;
            }
            if let Err(e) = self.runner.forget(&old) {
                tracing::warn!(server = %self.cfg.name, task = %old, "cannot remove the task directory: {e}");
            }
        }
        while let Some(k) = kept.pop_back() {
            self.finished.push_front(k);
        }
    }

    /// Queues a report: started (`None`) or exited with `(code, message)`.
    fn report(&mut self, id: TaskId, exit: Option<(i32, String)>) {
        let event = match exit {
            None => v1::report_task_request::Event::Started(v1::TaskStarted {}),
            Some((code, mut message)) => {
                if message.len() > MAX_MESSAGE {
                    let mut end = MAX_MESSAGE;
                    while !message.is_char_boundary(end) {
                        end -= 1;
                    }
                    message.truncate(end);
                }
                v1::report_task_request::Event::Exited(v1::TaskExited { code, message })
            }
        };
        self.outbox.push_back(v1::ReportTaskRequest {
            job: id.job,
            proposal: id.proposal,
            member: id.member,
            server: self.server.0,
            event: Some(event),
        });
    }

    /// Sends queued reports. A report the view refuses for good (stale: the placement is gone;
    /// unknown job; malformed) is dropped; on any other error (unavailable, timed out, outcome
    /// unknown) it stays queued and is retried on the next pass: applying a report is
    /// idempotent.
    async fn flush(&mut self) {
        if self.outbox.is_empty() {
            return;
        }
        // Sent concurrently, so the view commits them together; order does not matter, because
        // the view's task state machine ignores a start after an exit.
        let batch: Vec<v1::ReportTaskRequest> = self.outbox.drain(..self.outbox.len().min(FLUSH_BATCH)).collect();
        let mut sending = tokio::task::JoinSet::new();
        for (i, r) in batch.iter().cloned().enumerate() {
            let mut client = self.client.clone();
            sending.spawn(async move { (i, client.report_task(r).await) });
        }
        let mut keep = vec![true; batch.len()];
        while let Some(Ok((i, res))) = sending.join_next().await {
            let r = &batch[i];
            match res {
                Ok(_) => {
                    keep[i] = false;
                    if let Some(v1::report_task_request::Event::Exited(_)) = r.event {
                        let id = TaskId { job: r.job, proposal: r.proposal, member: r.member };
                        // Best effort: without it, a restarted agent reports the exit again.
                        let _ = std::fs::write(self.runner.task_dir(&id).join(REPORTED), b"");
                    }
                }
                Err(ClientError::Status { status, .. })
                    if matches!(status.code(), Code::FailedPrecondition | Code::NotFound | Code::InvalidArgument) =>
                {
                    keep[i] = false;
                    tracing::info!(server = %self.cfg.name, job = r.job, "task report not applied: {}", status.message());
                }
                Err(e) => {
                    tracing::warn!(server = %self.cfg.name, job = r.job, "task report not delivered, will retry: {e}");
                }
            }
        }
        for (r, keep) in batch.into_iter().zip(keep).rev() {
            if keep {
                self.outbox.push_front(r);
            }
        }
    }
}

/// A cluster identity as a directory name: anything but `[A-Za-z0-9._-]` becomes `_`.
fn dir_name(cluster: &str) -> String {
    let name: String =
        cluster.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    if name.is_empty() || name.starts_with('.') { format!("cluster-{name}") } else { name }
}

/// Whether a queued report is the started report of task `id`.
fn is_report_of(r: &v1::ReportTaskRequest, id: TaskId) -> bool {
    (r.job, r.proposal, r.member) == (id.job, id.proposal, id.member)
        && matches!(r.event, Some(v1::report_task_request::Event::Started(_)))
}

/// Whether a member's grant exists on this server's model; the reason when it does not.
fn check_member(t: &Topology, server: &str, m: &tessera_view::MemberPlacement) -> Result<(), String> {
    let missing = m.gpus & !t.all_devices();
    if missing != 0 {
        return Err(format!(
            "placement names devices {} but server {server} has devices {}",
            tessera_view::mask::format_indices(missing),
            tessera_view::mask::format_indices(t.all_devices())
        ));
    }
    if !m.cores.is_subset_of(t.all_cores()) {
        return Err(format!(
            "placement names cores {} but server {server} has {} cores",
            m.cores.without(t.all_cores()).format(),
            t.cores()
        ));
    }
    Ok(())
}

/// A port for the gang's rendezvous, the same on every member: derived from the job and the
/// placement, in 20000..32000 (below Linux's default ephemeral range, 32768..60999). Two gangs
/// whose first members share a server may collide; the task's log then shows the bind error.
fn master_port(id: TaskId) -> u16 {
    let h = id.job.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id.proposal.rotate_left(17);
    20_000 + (h % 12_000) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::{CoreMask, MemberPlacement};

    #[test]
    fn a_member_naming_what_the_server_lacks_is_refused_with_the_reason() {
        let t = Topology::preset("pcie-4gpu").expect("preset");
        let m = |gpus: u64, cores: CoreMask| MemberPlacement { server: ServerId(0), gpus, cores, memory_mib: 1 };
        assert_eq!(check_member(&t, "s", &m(0b1111, CoreMask::range(0, 48))), Ok(()));
        let e = check_member(&t, "s", &m(1 << 6, CoreMask::range(0, 1))).expect_err("device 6");
        assert!(e.contains("devices 6") && e.contains("has devices 0-3"), "{e}");
        let e = check_member(&t, "s", &m(1, CoreMask::range(40, 10))).expect_err("cores 48, 49");
        assert!(e.contains("cores 48-49") && e.contains("48 cores"), "{e}");
    }

    #[test]
    fn every_member_of_a_gang_derives_the_same_port() {
        let id = |member| TaskId { job: 42, proposal: 0xabc, member };
        assert_eq!(master_port(id(0)), master_port(id(3)));
        assert!((20_000..32_000).contains(&master_port(id(0))));
    }
}
