//! The agent's main loop: register, heartbeat under the lease, follow the view, and make the
//! placements on this server real.
//!
//! The loop is a reconciler, as a kubelet is: it keeps the jobs whose placement has a member
//! here (from a snapshot plus the view's `Watch` deltas), and on every change (and every
//! heartbeat tick) runs a round. The decisions of a round are [`crate::plan`]'s, a pure
//! function of the members the view wants here and the local task state; this module is the
//! async shell around it: it gathers those facts (the [`Runner`]'s running tasks, which task
//! directories exist, the queued reports), executes the planned actions (stop or checkpoint
//! signals, shim starts, reports) and records their outcomes in the plan's [`Memory`].
//! Task starts and exits go to the view as [`v1::ReportTaskRequest`]s through an outbox that is
//! retried until the view answers, so an exit reported during a leader change is not lost.
//!
//! Tasks outlive the agent: stopping or killing the agent leaves them running under their
//! shims, and the next agent on the same data directory re-adopts them (or reports how they
//! ended meanwhile) before it starts anything, so a restart neither duplicates nor orphans them.

use crate::discover::{DiscoverOptions, Discovery, GpuSource, HealthProbe, discover};
use crate::error::{AgentError, chain};
use crate::metrics::{AgentMetrics, Exit, Start};
use crate::plan::{self, Action, ExitDecision, Memory, Report, Round};
use crate::task::{Control, Runner, TaskExit, TaskId, TaskSpec};
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;
use tessera_proto::client::{ClientError, ViewClient};
use tessera_proto::tls::Security;
use tessera_proto::{trace, v1};
use tessera_view::{Job, JobId, JobState, ServerId, Topology, ViewDelta, ViewSnapshot};
use tonic::Code;
use tracing::{Instrument, error, info, instrument, warn};

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
    /// How long a stopped task has between SIGTERM and SIGKILL, unless its job sets its own
    /// (`stop_grace_s`).
    pub stop_grace: Duration,
    /// Give tasks `MASTER_ADDR=127.0.0.1` instead of the first member's server name (every
    /// server of the cluster runs on this machine: `tessera dev`, tests).
    pub peers_on_loopback: bool,
    /// Fake-GPU mode: a file listing unhealthy device indices (a stand-in for NVML health).
    pub fake_health_file: Option<PathBuf>,
    /// Where the agent's own gRPC service (task logs) listens, `host:port` (port 0 picks one);
    /// none when absent. The bound address is announced to the view.
    pub listen: Option<String>,
    /// Mutual TLS with an agent certificate named after the server (`tessera tls issue --role
    /// agent --name SERVER`), or plaintext.
    pub security: Security,
    /// The recorder the agent counts into ([`crate::metrics`]), labelled with its server name;
    /// the caller serves it (several agents may share one).
    pub metrics: std::sync::Arc<tessera_proto::prom::Metrics>,
}

/// Discovers the server, registers it, and serves its placements until `shutdown` resolves.
/// Tasks keep running after it returns. Everything it logs is under an `agent` span naming the
/// server (several agents share a process in `tessera dev`).
#[instrument(name = "agent", skip_all, fields(server = %cfg.name))]
pub async fn run(cfg: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let discovery = discover(&DiscoverOptions { topology: cfg.topology.clone() })?;
    let Some(topology) = discovery.topology.clone() else {
        let reason = match &discovery.gpus {
            GpuSource::Absent { reason } => reason.clone(),
            _ => "no GPUs found".to_string(),
        };
        return Err(AgentError::NothingToOffer { reason });
    };
    for w in &discovery.warnings {
        warn!(warning = %w, "discovery");
    }
    let mut client = ViewClient::new(cfg.view.clone())
        .map_err(AgentError::ViewAddresses)?
        .with_deadline(Duration::from_secs(3))
        .with_security(cfg.security.clone());
    let server_tls = match cfg.security.tls() {
        Some(t) => {
            Some(tessera_proto::tls::server::server_config(t, &[b"h2"]).map_err(|e| AgentError::Tls(e.to_string()))?)
        }
        None => None,
    };
    let probe = HealthProbe::new(&discovery).with_fake_health_file(cfg.fake_health_file.clone());
    let wire = v1::Topology::from(&topology);
    // Bound before registering, so the registration can say where logs are served.
    let listener = match &cfg.listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a).await.map_err(|source| AgentError::Listen { addr: a.clone(), source })?,
        ),
        None => None,
    };
    let agent_addr = match &listener {
        Some(l) => {
            let a = l
                .local_addr()
                .map_err(|source| AgentError::Listen { addr: cfg.listen.clone().unwrap_or_default(), source })?;
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
    let cluster = client.status().await?.cluster;
    let state_dir = cfg.data_dir.join(dir_name(&cluster));
    let runner = Runner::open(&state_dir, cfg.shim.clone()).await?;
    let log_server = listener.map(|l| {
        let svc = v1::agent_server::AgentServer::new(crate::logs::LogService::new(
            state_dir.join("tasks"),
            cfg.security.clone(),
        ));
        let router = tonic::transport::Server::builder().add_service(svc);
        match server_tls {
            Some(c) => {
                tokio::spawn(router.serve_with_incoming(tessera_proto::tls::server::incoming(l, c)).in_current_span())
            }
            None => tokio::spawn(
                router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)).in_current_span(),
            ),
        }
    });
    let metrics = AgentMetrics::new(cfg.metrics.clone(), &cfg.name);
    let adopted = runner.running();
    if !adopted.is_empty() {
        info!(tasks = adopted.len(), "re-adopted tasks left running by an earlier agent");
        metrics.adopted(adopted.len());
    }
    let every = if lease.is_zero() { Duration::from_secs(1) } else { (lease / 3).max(Duration::from_millis(20)) };
    // Heartbeats run on their own, so nothing the loop awaits (a snapshot, a task start, a
    // report during a leader change) can delay them past the lease.
    let beats = tokio::spawn(
        heartbeats(Beats {
            client: client.clone(),
            name: cfg.name.clone(),
            wire,
            server,
            every,
            probe,
            devices: topology.all_devices(),
            agent_addr,
            metrics: metrics.clone(),
        })
        .in_current_span(),
    );
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
        memory: Memory::default(),
        finished: VecDeque::new(),
        outbox: VecDeque::new(),
        synced: false,
        metrics,
        graces: HashMap::new(),
        cancel_graces: HashMap::new(),
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
                info!(id = l.server, lease_ms = l.lease_ms, "registered");
                return Ok((ServerId(l.server), Duration::from_millis(l.lease_ms)));
            }
            Err(ClientError::Status { status, .. })
                if matches!(
                    status.code(),
                    Code::NotFound
                        | Code::FailedPrecondition
                        | Code::InvalidArgument
                        | Code::PermissionDenied
                        | Code::Unauthenticated
                ) =>
            {
                return Err(AgentError::Refused { name: name.to_string(), why: status.message().to_string() });
            }
            Err(e) => {
                warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "registration failed, retrying");
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
    metrics: AgentMetrics,
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
            Err(source) => return AgentError::Panicked { what: "device health probe", source },
        };
        b.probe = probe;
        let (devices, sick) = (b.devices.count_ones(), (unhealthy & b.devices).count_ones());
        match b.client.heartbeat(b.server.0, Some(unhealthy & b.devices), reasons, &b.agent_addr).await {
            Ok(_) => b.metrics.heartbeat("ok", devices, sick),
            Err(ClientError::Status { status, .. }) if status.code() == Code::FailedPrecondition => {
                b.metrics.heartbeat("refused", devices, sick);
                warn!(reason = status.message(), "heartbeat refused; registering again");
                match register(&mut b.client, &b.name, &b.wire, &b.agent_addr).await {
                    Err(e) => return e,
                    // The name now means another server (this one was removed and the name
                    // given to a new one): this agent's tasks and id are the old server's.
                    Ok((id, _)) if id != b.server => {
                        return AgentError::Refused {
                            name: b.name.clone(),
                            why: format!(
                                "the name now means {id}, not {} (the server was removed and the name given to a new one); restart the agent",
                                b.server
                            ),
                        };
                    }
                    Ok(_) => {}
                }
            }
            Err(e) => {
                b.metrics.heartbeat("failed", devices, sick);
                warn!(error = %e, "heartbeat failed");
            }
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
    migrating: HashMap<u64, Option<u64>>,
    /// What the plan remembers between rounds: tasks being stopped, grants of the tasks started
    /// here, members with no process or that failed to start.
    memory: Memory,
    /// Finished tasks whose directories are kept, oldest first.
    finished: VecDeque<TaskId>,
    /// Task reports not yet acknowledged by the view, oldest first.
    outbox: VecDeque<v1::ReportTaskRequest>,
    /// Whether the local copy has been loaded since the agent started.
    synced: bool,
    metrics: AgentMetrics,
    /// The stop grace of the tasks started here whose job sets one.
    graces: HashMap<TaskId, Duration>,
    /// The stop grace a cancel asked for, per task of the cancelled job here, until it exits
    /// (over `graces`).
    cancel_graces: HashMap<TaskId, Duration>,
}

impl Agent {
    /// The loop: one event at a time (shutdown, a fatal heartbeat error, a tick, a watch event,
    /// a task exit), each followed by a round and a flush of the outbox.
    async fn serve(
        mut self,
        shutdown: impl Future<Output = ()>,
        mut beats: tokio::task::JoinHandle<AgentError>,
    ) -> Result<(), AgentError> {
        enum LoopEvent {
            Shutdown,
            Tick,
            Fatal(AgentError),
            // Boxed: a snapshot event is large, and the loop moves these around every round.
            Watch(Box<Result<Option<v1::WatchEvent>, tonic::Status>>),
            Exit(TaskExit),
        }
        let mut shutdown = std::pin::pin!(shutdown);
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stream: Option<tonic::Streaming<v1::WatchEvent>> = None;
        let mut opened = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        let mut following = false;
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
                        if !following {
                            // Once per agent: its first round on the view is done (the process
                            // tests wait for this line).
                            following = true;
                            info!(
                                version = self.version,
                                jobs = self.jobs.len(),
                                tasks = self.runner.running().len(),
                                "following the view"
                            );
                        }
                    }
                    Err(e) => {
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                        warn!(error = %chain(&e), retry_in_ms = backoff.as_millis() as u64, "cannot follow the view, retrying");
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
                _ = &mut shutdown => LoopEvent::Shutdown,
                r = &mut beats => {
                    LoopEvent::Fatal(r.unwrap_or_else(|source| AgentError::Panicked { what: "heartbeat", source }))
                }
                _ = tick.tick() => LoopEvent::Tick,
                ev = next => LoopEvent::Watch(Box::new(ev)),
                // Exits wait for the first sync: keeping or forgetting a task directory needs
                // to know which placements live.
                exit = runner.next_exit(), if synced => LoopEvent::Exit(exit),
            };
            match ev {
                LoopEvent::Shutdown => break Ok(()),
                LoopEvent::Fatal(e) => break Err(e),
                LoopEvent::Tick => self.reconcile().await,
                LoopEvent::Watch(ev) => match *ev {
                    Ok(Some(ev)) => {
                        if let Err(e) = self.apply(ev) {
                            warn!(error = %chain(&e), version = self.version, "bad watch event, reading the view again");
                            stream = None;
                            continue;
                        }
                        self.reconcile().await;
                    }
                    _ => {
                        if stream.take().is_some() {
                            info!(version = self.version, "watch ended; reconnecting");
                        }
                    }
                },
                LoopEvent::Exit(exit) => {
                    self.on_exit(exit);
                    self.reconcile().await;
                }
            }
            self.flush().await;
            self.metrics.state(self.runner.running().len(), self.outbox.len(), self.version);
        };
        beats.abort();
        info!(tasks = self.runner.running().len(), "agent stopping; tasks keep running");
        result
    }

    /// Follows the view from the local copy's version. The first time, the copy is loaded from
    /// a linearizable snapshot (server names, the jobs placed here), so a replica that lags
    /// cannot hand the agent an older view than the one its placements were made on.
    async fn open_watch(&mut self) -> Result<tonic::Streaming<v1::WatchEvent>, AgentError> {
        if !self.synced {
            let snap = self.client.snapshot(true).await?;
            let snap = snap.snapshot.ok_or(AgentError::NoSnapshot)?;
            self.apply(v1::WatchEvent { event: Some(v1::watch_event::Event::Snapshot(snap)) })?;
        }
        Ok(self.client.watch(self.version).await?)
    }

    /// Applies one watch event to the local copy.
    fn apply(&mut self, ev: v1::WatchEvent) -> Result<(), AgentError> {
        match ev.event {
            Some(v1::watch_event::Event::Snapshot(s)) => {
                let snap =
                    ViewSnapshot::try_from(s).map_err(|source| AgentError::Malformed { what: "snapshot", source })?;
                if snap.version.0 < self.version {
                    return Err(AgentError::StaleSnapshot { version: snap.version.0, copy: self.version });
                }
                self.version = snap.version.0;
                // The log service refuses what the view revokes (a change reaches watchers as a
                // snapshot); a list older than the one held is ignored.
                if let Some(tls) = self.cfg.security.tls() {
                    tls.set_view_revoked(
                        snap.revocations_changed.0,
                        snap.revocations.iter().map(|(fp, _)| fp.clone()).collect(),
                    );
                }
                self.names = snap.server_names;
                self.jobs.clear();
                self.migrating.clear();
                for j in snap.jobs {
                    self.keep(j);
                }
            }
            Some(v1::watch_event::Event::Delta(d)) => {
                let d = ViewDelta::try_from(d).map_err(|source| AgentError::Malformed { what: "delta", source })?;
                if d.from.0 != self.version {
                    return Err(AgentError::DeltaGap { from: d.from.0, copy: self.version });
                }
                self.version = d.to.0;
                for j in d.jobs {
                    self.keep(j);
                }
            }
            None => return Err(AgentError::EmptyWatchEvent),
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
                self.migrating.insert(j.id.0, Some(p.proposal.0));
            }
            // Back to pending (preempted, or re-queued) while its task may still run here: the
            // task saves its state, as the job will run again.
            (None, JobState::Pending) if self.jobs.contains_key(&j.id.0) || self.migrating.contains_key(&j.id.0) => {
                self.migrating.insert(j.id.0, None);
            }
            _ => {
                self.migrating.remove(&j.id.0);
            }
        }
        let here = j.state.holds_resources()
            && j.placement.as_ref().is_some_and(|p| p.members.iter().any(|m| m.server == self.server));
        if here {
            self.jobs.insert(j.id.0, j);
        } else if let Some(old) = self.jobs.remove(&j.id.0)
            && let (Some(g), Some(p)) = (j.cancel_grace_s, &old.placement)
        {
            // Cancelled with a grace of its own: the job leaves the copy before its tasks here
            // are stopped, so the grace stays with each of them still running (`grace` reads it
            // first; `on_exit` forgets it).
            let running = self.runner.running();
            for (k, m) in p.members.iter().enumerate() {
                if let (true, Ok(member)) = (m.server == self.server, u32::try_from(k)) {
                    let id = TaskId { job: j.id.0, proposal: p.proposal.0, member };
                    if running.contains(&id) {
                        self.cancel_graces.insert(id, Duration::from_secs(g));
                    }
                }
            }
        }
    }

    /// One round: gathers the facts [`plan::plan`] decides on (the plan itself does no I/O) and
    /// executes its actions in order; the round's starts run together at the end.
    #[instrument(level = "debug", skip_all, fields(version = self.version))]
    async fn reconcile(&mut self) {
        if !self.synced {
            return;
        }
        let desired = plan::desired(self.jobs.values(), self.server);
        let running: BTreeSet<TaskId> = self.runner.running().into_iter().collect();
        let ran: HashSet<TaskId> =
            desired.keys().filter(|id| !running.contains(*id) && self.runner.task_dir(id).exists()).copied().collect();
        let start_queued: HashSet<TaskId> = self.outbox.iter().filter_map(started_report).collect();
        let actions = plan::plan(&Round {
            desired: &desired,
            running: &running,
            ran: &ran,
            start_queued: &start_queued,
            migrating: &self.migrating,
            memory: &self.memory,
            model: &self.topology,
            server: &self.cfg.name,
        });
        let mut launch = Vec::new();
        for action in actions {
            match action {
                Action::Forget(id) => self.memory.forget(id),
                Action::ReportStarted(id) => {
                    tracing::debug!(task = %id, "the view sees a running task as starting: reporting it started");
                    self.report(id, Report::Started);
                }
                Action::Checkpoint(id) => {
                    let grace = self.grace(id);
                    let grace_ms = grace.as_millis() as u64;
                    info!(job_id = id.job, task = %id, grace_ms, "job moved or preempted: checkpointing its task");
                    self.signal_stop(id, Control::Checkpoint { grace });
                }
                Action::Stop(id) => {
                    let grace = self.grace(id);
                    let grace_ms = grace.as_millis() as u64;
                    info!(job_id = id.job, task = %id, grace_ms, "placement gone: stopping its task");
                    self.signal_stop(id, Control::Stop { grace });
                }
                Action::Wait { id, behind } => {
                    info!(task = %id, behind = %behind, "waiting for a stopping task to release its grant");
                }
                Action::Refuse { id, why } => self.refuse(id, why),
                Action::NoProcess(id) => {
                    info!(task = %id, "placement has no command: nothing to run");
                    self.memory.no_process.insert(id);
                    self.report(id, Report::Started);
                }
                Action::Start { id, grant } => match self.task_spec(id) {
                    Ok(spec) => {
                        self.memory.grants.insert(id, grant);
                        if let Some(g) = self.jobs.get(&id.job).and_then(|j| j.spec.run.stop_grace_s) {
                            self.graces.insert(id, Duration::from_secs(g));
                        }
                        info!(job_id = id.job, task = %id, command = ?spec.command, cpus = ?spec.cpus, "starting task");
                        launch.push(spec);
                    }
                    Err(why) => self.refuse(id, chain(&why)),
                },
            }
        }
        self.launch(launch).await;
    }

    /// How long task `id` has between SIGTERM and SIGKILL: the grace its job's cancel asked
    /// for, else its job's `stop_grace_s` (kept from its start, as the job may be gone from the
    /// copy by the time it is stopped), else the agent's own.
    fn grace(&self, id: TaskId) -> Duration {
        let of_job = || self.jobs.get(&id.job).and_then(|j| j.spec.run.stop_grace_s).map(Duration::from_secs);
        let of_cancel = self.cancel_graces.get(&id).copied();
        of_cancel.or_else(|| self.graces.get(&id).copied()).or_else(of_job).unwrap_or(self.cfg.stop_grace)
    }

    /// Sends a stop or checkpoint; a task that took it is remembered as stopping (its exit is
    /// not reported). On failure the next round plans the stop again.
    fn signal_stop(&mut self, id: TaskId, control: Control) {
        match self.runner.control(&id, control) {
            Ok(()) => {
                self.memory.stopping.insert(id);
            }
            Err(e) => warn!(task = %id, error = %chain(&e), "cannot stop the task"),
        }
    }

    /// Reports a member that cannot run here as ended with [`CANNOT_START`], once.
    fn refuse(&mut self, id: TaskId, why: String) {
        error!(job_id = id.job, task = %id, reason = %why, "cannot run the placement");
        self.metrics.start(Start::Refused);
        self.memory.failed_start.insert(id);
        self.report(id, Report::Exited { code: CANNOT_START, message: why });
    }

    /// Starts a round's tasks together (each waits for its shim to report the process) and
    /// reports each start, or its failure.
    ///
    /// Each start is an `agent.start` span under its job's trace, and the task gets that span
    /// as `TRACEPARENT` (the OpenTelemetry convention), so its own spans can join the trace
    /// (unless the job's `env` sets one).
    async fn launch(&mut self, specs: Vec<TaskSpec>) {
        let mut starting = tokio::task::JoinSet::new();
        for mut spec in specs {
            let runner = self.runner.clone();
            let of_job = self.jobs.get(&spec.id.job).and_then(|j| j.trace);
            let span = trace::on_job(
                tracing::info_span!(
                    target: trace::TARGET,
                    "agent.start",
                    job_id = spec.id.job,
                    member = spec.id.member,
                    server = %self.cfg.name
                ),
                of_job.as_ref(),
            );
            // A job that sets its own TRACEPARENT keeps it.
            let own = spec.env.iter().any(|(k, _)| k == "TRACEPARENT");
            if let Some(t) = trace::trace_of(&span).or(of_job).filter(|_| !own) {
                spec.env.push(("TRACEPARENT".into(), t.traceparent()));
            }
            starting.spawn(async move { (spec.id, runner.start(spec).await) }.instrument(span));
        }
        while let Some(done) = starting.join_next().await {
            let Ok((id, r)) = done else { continue };
            match r {
                Ok(()) => {
                    self.metrics.start(Start::Started);
                    self.report(id, Report::Started);
                }
                Err(e) => {
                    let e = chain(&e);
                    error!(task = %id, error = %e, "task did not start");
                    self.metrics.start(Start::Failed);
                    self.memory.start_failed(id);
                    let message = format!("the task could not start: {e}");
                    self.report(id, Report::Exited { code: CANNOT_START, message });
                }
            }
        }
    }

    /// What to run for member `id` of a job in the local copy (the plan checked its grant
    /// against the model, and that the job has a command).
    fn task_spec(&self, id: TaskId) -> Result<TaskSpec, AgentError> {
        let job_id = JobId(id.job);
        let job = self.jobs.get(&id.job).ok_or(AgentError::JobNotInCopy { job: job_id })?;
        let p = job.placement.as_ref().ok_or(AgentError::NoPlacement { job: job_id })?;
        let k = id.member as usize;
        let m = p.members.get(k).ok_or(AgentError::NoMember { job: job_id, member: k })?;
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
        // The job's own variables first; the agent's (which the spec may not name) after.
        let mut env: Vec<(String, String)> = job.spec.run.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        env.extend([
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
        ]);
        // An array member learns where it stands (Slurm's SLURM_ARRAY_TASK_ID and friends).
        if let (Some(index), Some(first)) = (job.array_index, job.array_first()) {
            env.extend([
                ("TESSERA_ARRAY_INDEX".into(), index.to_string()),
                ("TESSERA_ARRAY_SIZE".into(), job.spec.array.unwrap_or(1).to_string()),
                ("TESSERA_ARRAY_JOB_ID".into(), first.0.to_string()),
            ]);
        }
        Ok(TaskSpec {
            id,
            command: job.spec.command.clone(),
            env,
            cpus,
            memory_limit_mib: (m.memory_mib > 0).then_some(u64::from(m.memory_mib)),
            workdir: job.spec.run.workdir.as_ref().map(std::path::PathBuf::from),
        })
    }

    /// A task ended: keeps its directory, and reports the exit unless this agent stopped it or
    /// an earlier agent's report of it was acknowledged ([`plan::on_exit`] decides).
    fn on_exit(&mut self, exit: TaskExit) {
        let id = exit.id;
        self.graces.remove(&id);
        self.cancel_graces.remove(&id);
        let stopped_here = self.memory.ended(id);
        self.keep_finished(id);
        // Read only when it can matter.
        let reported_before = !stopped_here && self.runner.task_dir(&id).join(REPORTED).exists();
        self.metrics.exit(match (stopped_here, exit.success()) {
            (true, _) => Exit::Stopped,
            (false, true) => Exit::Succeeded,
            (false, false) => Exit::Failed,
        });
        match plan::on_exit(&exit, stopped_here, reported_before) {
            ExitDecision::StoppedHere => info!(task = %id, exit = %exit.message, "stopped task ended"),
            ExitDecision::ReportedBefore => {}
            ExitDecision::Report(report) => {
                if let Report::Exited { code, .. } = &report {
                    info!(job_id = id.job, task = %id, code = *code, exit = %exit.message, "task ended");
                }
                self.report(id, report);
            }
        }
    }

    /// Keeps a finished task's directory (its logs) and removes the oldest ones beyond
    /// [`KEEP_FINISHED`] whose job no longer holds that placement here ([`plan::prune_finished`]).
    fn keep_finished(&mut self, id: TaskId) {
        let jobs = &self.jobs;
        let lives = |t: &TaskId| {
            jobs.get(&t.job).and_then(|j| j.placement.as_ref()).is_some_and(|p| p.proposal.0 == t.proposal)
        };
        for old in plan::prune_finished(&mut self.finished, id, KEEP_FINISHED, lives) {
            if let Err(e) = self.runner.forget(&old) {
                warn!(task = %old, error = %chain(&e), "cannot remove the task directory");
            }
        }
    }

    /// Queues a report for the view.
    fn report(&mut self, id: TaskId, report: Report) {
        let event = match report {
            Report::Started => v1::report_task_request::Event::Started(v1::TaskStarted {}),
            Report::Exited { code, mut message } => {
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
    #[instrument(level = "debug", skip_all, fields(queued = self.outbox.len()))]
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
                    self.metrics.report("delivered");
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
                    self.metrics.report("dropped");
                    info!(job_id = r.job, member = r.member, reason = status.message(), "task report not applied");
                }
                Err(e) => {
                    self.metrics.report("retried");
                    warn!(job_id = r.job, member = r.member, error = %e, "task report not delivered, will retry");
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

/// The task whose started report this queued report is, if it is one.
fn started_report(r: &v1::ReportTaskRequest) -> Option<TaskId> {
    matches!(r.event, Some(v1::report_task_request::Event::Started(_))).then_some(TaskId {
        job: r.job,
        proposal: r.proposal,
        member: r.member,
    })
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

    #[test]
    fn every_member_of_a_gang_derives_the_same_port() {
        let id = |member| TaskId { job: 42, proposal: 0xabc, member };
        assert_eq!(master_port(id(0)), master_port(id(3)));
        assert!((20_000..32_000).contains(&master_port(id(0))));
    }
}
