//! The driver: one OS thread owns the [`Replica`] and runs its loop — take requests and raft
//! messages, tick, handle the ready state (persist with one fsync, apply, send), answer.
//!
//! gRPC handlers talk to it through a bounded channel ([`NodeHandle`]) and wait on one-shot
//! replies. The RocksDB writes block this thread only, never the async runtime. Requests
//! drained together share one ready round, so many concurrent proposals share one fsync and one
//! raft entry (group commit).
//!
//! Decisions take the time as an argument: the loop reads the clock once per event (a request,
//! a tick, the end of a round) and passes that reading down, so the lease tables
//! ([`leases::ServerLeases`], [`crate::adoption::Adoptions`]) are pure and unit-tested over
//! explicit instants.

pub mod leases;

use crate::adoption::{Adopted, Adoptions, Holder};
use crate::error::ViewServerError;
use leases::ServerLeases;
use raft::eraftpb::{Message, MessageType};
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_replica::clock::restamp;
use tessera_replica::{Answer, Replica, ReplicaError, Ticket};
use tessera_view::drain::{MAX_DRAIN_MOVES, drain_moves};
use tessera_view::{
    Command, Health, JobId, MemberPlacement, Outcome, Proposal, ProposalId, ServerId, Topology, ViewVersion,
};
use tokio::sync::{mpsc, oneshot, watch};

/// A reply to a request: the answer, or why there is none.
pub type Reply<T> = oneshot::Sender<Result<T, ViewServerError>>;

/// What a read is of: the whole view or one job.
#[derive(Debug)]
pub enum ReadTarget {
    /// The whole view.
    Snapshot,
    /// One job.
    Job(JobId),
    /// One job and, while it is pending, why it waits (a pass over the servers for its shape).
    JobExplained(JobId),
    /// A usage report.
    Usage(Box<crate::usage::UsageQuery>),
    /// A page of the history of ended jobs.
    History(Box<tessera_replica::history::Query>),
}

/// What a read returns.
#[derive(Debug)]
pub enum ReadOut {
    /// The view and the raft index it reflects.
    Snapshot(Box<v1::ViewSnapshot>, u64),
    /// The job (if known), why it waits (asked for and pending) and the view version.
    Job(Option<Box<v1::Job>>, Option<v1::JobWaiting>, u64),
    /// A usage report.
    Usage(Box<v1::UsageResponse>),
    /// A page of the history of ended jobs, or why the store could not be read.
    History(Result<Box<v1::HistoryResponse>, String>),
}

/// A step of a watch.
#[derive(Debug)]
pub enum WatchStep {
    /// The whole view (the asked-for changes are no longer held), shared by every watcher
    /// that needs it at one version: after a layout change resets the change log, each watcher
    /// needs one, and the driver builds it once.
    Snapshot(Arc<v1::ViewSnapshot>),
    /// The changes since the asked version.
    Delta(v1::ViewDelta),
}

/// The replica's status.
#[derive(Clone, Debug, Default)]
pub struct NodeStatus {
    /// This replica.
    pub id: u64,
    /// Role name.
    pub role: String,
    /// Leader id, 0 if unknown.
    pub leader: u64,
    /// Term.
    pub term: u64,
    /// Applied raft index.
    pub applied: u64,
    /// View version.
    pub version: u64,
    /// Voters.
    pub voters: Vec<u64>,
    /// Log entries held.
    pub log_entries: u64,
    /// State hash of the applied view.
    pub state_hash: u64,
    /// The leader only: scheduler hosts and the jobs they hold.
    pub scheduler_hosts: Vec<(String, Vec<JobId>)>,
}

/// A request to the driver thread, answered on its own reply channel (raft traffic has none).
#[derive(Debug)]
pub enum NodeRequest {
    /// Gang proposals, each answered on its own.
    Propose(Vec<(Proposal, Reply<(Answer, u64)>)>),
    /// Commands other than gang proposals, queued together (all or none reach the driver).
    Commands(Vec<(Command, Reply<(Answer, u64)>)>),
    /// A read.
    Read {
        /// Confirm with the leader first.
        linearizable: bool,
        /// What.
        what: ReadTarget,
        /// Where the answer goes.
        reply: Reply<ReadOut>,
    },
    /// Changes after a version.
    Delta(u64, Reply<WatchStep>),
    /// Status.
    Status(Reply<NodeStatus>),
    /// A server registers: name, topology and its agent's address (empty if none).
    Register(String, Topology, String, Reply<(ServerId, u64)>),
    /// A server renews its lease, with its unhealthy devices when its agent reports them, and
    /// its agent's address (empty if none).
    Heartbeat(ServerId, Option<u64>, String, Reply<u64>),
    /// A scheduler host renews its jobs and asks for more: host, held, want.
    AdoptJobs(String, Vec<JobId>, usize, Reply<(Adopted, u64, u64)>),
    /// The node agents' addresses the leader knows: (server, name, address).
    Agents(Reply<Vec<(u32, String, String)>>),
    /// Who holds each job, asked for by a scheduler host (named) before it schedules them
    /// (leader only; see [`Adoptions::holders`]).
    Holders(String, Vec<JobId>, Reply<Vec<Holder>>),
    /// Whether moves make room for a pending job at a target placement (leader only; see
    /// [`tessera_view::migration_check::moves_help`]): the job, the target, the moves.
    MovesHelp(JobId, Vec<MemberPlacement>, Vec<Proposal>, Reply<Result<(), String>>),
    /// A server's name, if the view has the server (authorization of agents).
    ServerName(ServerId, Reply<Option<String>>),
    /// Add (true) or remove a replica.
    Membership(bool, u64, String, Reply<Vec<u64>>),
    /// Raft messages from a peer.
    Raft(Vec<Message>),
    /// The transport could not reach a peer.
    Unreachable(u64),
    /// A snapshot message to a peer was sent (true) or failed.
    SnapshotSent(u64, bool),
    /// Raft traffic is waiting in the raft queue.
    Wake,
}

/// Most raft messages waiting for the driver; more are dropped (raft resends).
const RAFT_QUEUE: usize = 16_384;

/// A cheap, cloneable handle on the driver.
#[derive(Clone, Debug)]
pub struct NodeHandle {
    tx: SyncSender<NodeRequest>,
    /// Raft messages and transport reports: a queue of their own, drained first by the driver,
    /// so client load cannot crowd them out, and reports are never dropped.
    raft: Arc<std::sync::Mutex<std::collections::VecDeque<NodeRequest>>>,
    /// The applied view version, for watchers.
    pub version: watch::Receiver<u64>,
    /// The leader this replica knows (0: none), for watchers: a replica cut off from the others
    /// knows none, and its view stops moving.
    pub leader: watch::Receiver<u64>,
    /// How long a replica may know no leader before its watch streams end: longer than an
    /// election takes (twice the longest election timeout).
    pub leaderless_grace: Duration,
    /// Replica id → address record, `client` or `client raft` (configured peers plus announced
    /// ones).
    pub addrs: Arc<RwLock<BTreeMap<u64, String>>>,
    /// Request timeout.
    pub timeout: Duration,
}

impl NodeHandle {
    /// Queues a request; a full queue answers `Busy` at once.
    pub fn send(&self, req: NodeRequest) -> Result<(), ViewServerError> {
        self.tx.try_send(req).map_err(|e| match e {
            TrySendError::Full(_) => ViewServerError::Busy("request queue full".into()),
            TrySendError::Disconnected(_) => ViewServerError::Stopped("driver thread ended".into()),
        })
    }

    /// Queues raft traffic (`NodeRequest::Raft`, `NodeRequest::Unreachable`,
    /// `NodeRequest::SnapshotSent`) on the raft queue. Messages beyond its bound are dropped;
    /// snapshot reports never are.
    pub fn send_raft(&self, req: NodeRequest) {
        if let Ok(mut q) = self.raft.lock() {
            let keep = match &req {
                NodeRequest::SnapshotSent(..) => true,
                NodeRequest::Unreachable(to) => !q.iter().any(|r| matches!(r, NodeRequest::Unreachable(t) if t == to)),
                _ => q.len() < RAFT_QUEUE,
            };
            if keep {
                q.push_back(req);
            }
        }
        // A full request queue means the driver is busy and drains the raft queue soon anyway.
        let _ = self.tx.try_send(NodeRequest::Wake);
    }

    /// Sends a request built around a reply channel and waits for the answer (bounded by the
    /// request timeout).
    pub async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> NodeRequest) -> Result<T, ViewServerError> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        self.wait(rx).await
    }

    /// Waits for one reply, bounded by the request timeout.
    pub async fn wait<T>(&self, rx: oneshot::Receiver<Result<T, ViewServerError>>) -> Result<T, ViewServerError> {
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(ViewServerError::Stopped("request dropped by the driver".into())),
            Err(_) => Err(ViewServerError::Timeout { after_ms: self.timeout.as_millis() as u64 }),
        }
    }

    /// The client address of replica `id`, if known.
    pub fn addr_of(&self, id: u64) -> Option<String> {
        client_addr(&self.addrs, id)
    }
}

/// The client address of replica `id` in an address-record map.
fn client_addr(addrs: &RwLock<BTreeMap<u64, String>>, id: u64) -> Option<String> {
    addrs.read().ok().and_then(|a| a.get(&id).map(|r| crate::config::split_addr(r).0.to_string()))
}

/// Settings of the driver loop.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Raft tick.
    pub tick: Duration,
    /// Request timeout (pending requests older than twice this are failed).
    pub timeout: Duration,
    /// Server lease; zero disables leases.
    pub lease: Duration,
    /// Scheduler hosts' lease on the jobs they adopt.
    pub scheduler_lease: Duration,
    /// Capacity of the request queue.
    pub queue: usize,
    /// Capacity of each peer's outgoing message queue.
    pub peer_queue: usize,
    /// The longest election timeout (`2 × election_tick` ticks).
    pub election: Duration,
}

enum Pending {
    Answer(Reply<(Answer, u64)>),
    Read(ReadTarget, Reply<ReadOut>),
    Register(ServerId, Reply<(ServerId, u64)>),
    Membership(Reply<Vec<u64>>),
    /// The driver's own command (lease expiry): nobody waits.
    Internal,
}

/// Now, in Unix milliseconds: the time the leader writes into the commands it proposes (a
/// server's history, cordons). 0 for a clock before 1970. The replica's own wall-clock reading.
pub use tessera_replica::clock::wall_ms as unix_ms;

/// Peers' outgoing queues, created by the transport.
pub type PeerSenders = Arc<RwLock<HashMap<u64, mpsc::Sender<Message>>>>;

/// The driver's state.
pub struct Driver {
    replica: Replica,
    cfg: DriverConfig,
    rx: Receiver<NodeRequest>,
    raft: Arc<std::sync::Mutex<std::collections::VecDeque<NodeRequest>>>,
    version_tx: watch::Sender<u64>,
    leader_tx: watch::Sender<u64>,
    addrs: Arc<RwLock<BTreeMap<u64, String>>>,
    peers: PeerSenders,
    /// Called with (id, address) for each replica whose address becomes known.
    on_new_peer: Box<dyn FnMut(u64, String) + Send>,
    pending: HashMap<Ticket, (Instant, Pending)>,
    /// Servers' leases (leader only).
    leases: ServerLeases,
    /// Scheduler hosts' holds on pending jobs (leader only).
    adoptions: Adoptions,
    /// Node agents' service addresses, from registrations and heartbeats (leader only).
    agents: HashMap<ServerId, String>,
    was_leader: bool,
    /// Set by the server when it stops: the loop returns (and the replica closes RocksDB)
    /// even though transport tasks still hold handles.
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// (applied index, state hash) of the last Status.
    hash_at: Option<(u64, u64)>,
    /// Drained servers whose eviction this leader proposed, and when (one try a second).
    evicting: HashMap<ServerId, Instant>,
    /// When this leader last wrote a clock entry for a time limit that passed.
    clock_tick: Option<Instant>,
    /// The last whole view sent to a watcher, at its version (see [`WatchStep::Snapshot`]).
    watch_snapshot: Option<Arc<v1::ViewSnapshot>>,
    /// Drained servers this leader last planned early moves for, and when.
    drain_moved: HashMap<ServerId, Instant>,
    /// The sequence in the proposal ids of those moves.
    move_seq: u64,
    /// Where the view's revoked credentials go when they change (the replica's authentication),
    /// and the version of the list it was last given.
    revocation_sink: Option<(RevocationSink, Option<ViewVersion>)>,
}

/// Takes the view's revoked fingerprints, with the version at which the list last changed.
pub type RevocationSink = Box<dyn FnMut(u64, std::collections::HashSet<String>) + Send>;

/// How often a drained server's gangs are planned for early moves.
const DRAIN_MOVE_EVERY: Duration = Duration::from_secs(2);

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("replica", &self.replica).finish()
    }
}

impl Driver {
    /// A driver for `replica` and the handle to reach it.
    pub fn new(
        replica: Replica,
        cfg: DriverConfig,
        addrs: BTreeMap<u64, String>,
        peers: PeerSenders,
        on_new_peer: Box<dyn FnMut(u64, String) + Send>,
    ) -> (Driver, NodeHandle) {
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.queue);
        let (version_tx, version) = watch::channel(replica.view().version().0);
        let (leader_tx, leader) = watch::channel(replica.leader_id());
        let mut all = addrs;
        for (id, a) in replica.announced_addrs() {
            all.insert(*id, a.clone());
        }
        let addrs = Arc::new(RwLock::new(all));
        let raft = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let handle = NodeHandle {
            tx,
            raft: raft.clone(),
            version,
            leader,
            leaderless_grace: 2 * cfg.election,
            addrs: addrs.clone(),
            timeout: cfg.timeout,
        };
        let adoptions = Adoptions::new(cfg.scheduler_lease, Instant::now());
        let leases = ServerLeases::new(cfg.lease);
        let d = Driver {
            replica,
            adoptions,
            cfg,
            rx,
            raft,
            version_tx,
            leader_tx,
            addrs,
            peers,
            on_new_peer,
            pending: HashMap::new(),
            leases,
            agents: HashMap::new(),
            was_leader: false,
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            hash_at: None,
            evicting: HashMap::new(),
            clock_tick: None,
            watch_snapshot: None,
            drain_moved: HashMap::new(),
            move_seq: 0,
            revocation_sink: None,
        };
        (d, handle)
    }

    /// Gives `sink` the view's revoked credentials now and after every round that changed
    /// them, so that this replica refuses them from the moment it applies the change.
    pub fn set_revocation_sink(&mut self, sink: RevocationSink) {
        self.revocation_sink = Some((sink, None));
        self.publish_revocations();
    }

    fn publish_revocations(&mut self) {
        let view = self.replica.view();
        let Some((sink, published)) = &mut self.revocation_sink else { return };
        let changed = view.revocations_changed();
        if *published == Some(changed) {
            return;
        }
        sink(changed.0, view.revocations().keys().cloned().collect());
        *published = Some(changed);
    }

    /// A flag that makes [`Driver::run`] return at its next round.
    pub fn stopper(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.stop.clone()
    }

    /// Runs until every handle is dropped or the stopper is set; an error is a storage or raft
    /// failure the replica cannot continue after.
    pub fn run(mut self) -> Result<(), ReplicaError> {
        let known: Vec<(u64, String)> = self.addrs.read().map(|a| a.clone().into_iter().collect()).unwrap_or_default();
        for (id, a) in known {
            if id != self.replica.id() {
                (self.on_new_peer)(id, crate::config::split_addr(&a).1.to_string());
            }
        }
        let mut next_tick = Instant::now() + self.cfg.tick;
        loop {
            if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(());
            }
            let wait = next_tick.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Ok(req) => {
                    self.handle(req, Instant::now());
                    let mut n = 0;
                    while let Ok(req) = self.rx.try_recv() {
                        self.handle(req, Instant::now());
                        n += 1;
                        if n >= 16_384 {
                            break;
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            let queued = self.raft.lock().map(|mut q| std::mem::take(&mut *q)).unwrap_or_default();
            for req in queued {
                self.handle(req, Instant::now());
            }
            let now = Instant::now();
            if now >= next_tick {
                self.replica.tick();
                next_tick += self.cfg.tick;
                if next_tick < now {
                    // Fell far behind (a long fsync, a paused process): do not burst ticks.
                    next_tick = now + self.cfg.tick;
                }
                self.housekeeping(now);
            }
            let peers = self.peers.clone();
            let mut failed = Vec::new();
            let msgs = self.replica.on_ready_with(&mut |m| failed.extend(send_to(&peers, m)))?;
            failed.extend(send_to(&peers, msgs));
            for to in failed {
                self.replica.report_snapshot(to, false);
            }
            self.answer();
            self.after_round(Instant::now());
        }
    }

    fn status(&mut self, now: Instant) -> NodeStatus {
        // The hash walks the whole view: compute it once per applied index, not per poll.
        let applied = self.replica.applied_index();
        let state_hash = match self.hash_at {
            Some((at, h)) if at == applied => h,
            _ => {
                let h = self.replica.view().state_hash();
                self.hash_at = Some((applied, h));
                h
            }
        };
        let r = &self.replica;
        let role = r.role();
        NodeStatus {
            id: r.id(),
            role: role.into(),
            leader: r.leader_id(),
            term: r.term(),
            applied: r.applied_index(),
            version: r.view().version().0,
            voters: r.voters(),
            log_entries: r.log_len() as u64,
            state_hash,
            scheduler_hosts: if r.is_leader() { self.adoptions.hosts(now) } else { Vec::new() },
        }
    }

    fn not_leader(&self) -> ViewServerError {
        let leader = self.replica.leader_id();
        ViewServerError::NotLeader { leader, addr: client_addr(&self.addrs, leader) }
    }

    fn map_err(&self, e: ReplicaError) -> ViewServerError {
        match e {
            ReplicaError::NotLeader { .. } => self.not_leader(),
            ReplicaError::Busy(n) => ViewServerError::Busy(format!("{n} proposals in flight")),
            ReplicaError::Invalid(why) => ViewServerError::Invalid(why),
            other => ViewServerError::from(other),
        }
    }

    fn track(
        &mut self,
        r: Result<Ticket, ReplicaError>,
        p: Pending,
        now: Instant,
    ) -> Result<(), (ViewServerError, Pending)> {
        match r {
            Ok(t) => {
                self.pending.insert(t, (now, p));
                Ok(())
            }
            Err(e) => Err((self.map_err(e), p)),
        }
    }

    /// Handles one request; `now` is the clock read for it.
    fn handle(&mut self, req: NodeRequest, now: Instant) {
        match req {
            NodeRequest::Propose(items) => {
                for (p, reply) in items {
                    let r = self.replica.propose_gang(p);
                    if let Err((e, Pending::Answer(reply))) = self.track(r, Pending::Answer(reply), now) {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            NodeRequest::Commands(items) => {
                for (cmd, reply) in items {
                    // Times in an operator's command (a cordon, a drain's deadline, a layout
                    // change) read the view's clock, not the wall clock of the replica that
                    // took the call (see `tessera_replica::clock`).
                    let cmd = if self.replica.is_leader() { restamp(cmd, || self.replica.clock_ms()) } else { cmd };
                    let r = self.replica.propose(cmd);
                    if let Err((e, Pending::Answer(reply))) = self.track(r, Pending::Answer(reply), now) {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            NodeRequest::Read { linearizable, what, reply } => {
                if linearizable {
                    let t = self.replica.read_index();
                    self.pending.insert(t, (now, Pending::Read(what, reply)));
                } else {
                    let _ = reply.send(Ok(self.read(&what)));
                }
            }
            NodeRequest::Delta(from, reply) => {
                let view = self.replica.view();
                let step = match view.delta_since(ViewVersion(from)) {
                    Some(d) => WatchStep::Delta(v1::ViewDelta::from(&d)),
                    None => {
                        let version = view.version().0;
                        let snap = match &self.watch_snapshot {
                            Some(s) if s.version == version => Arc::clone(s),
                            _ => {
                                let s = Arc::new(v1::ViewSnapshot::from(&view.snapshot()));
                                self.watch_snapshot = Some(Arc::clone(&s));
                                s
                            }
                        };
                        WatchStep::Snapshot(snap)
                    }
                };
                let _ = reply.send(Ok(step));
            }
            NodeRequest::Status(reply) => {
                let _ = reply.send(Ok(self.status(now)));
            }
            NodeRequest::Register(name, topo, agent, reply) => self.register(&name, &topo, agent, reply, now),
            NodeRequest::Heartbeat(server, unhealthy, agent, reply) => {
                let r = self.heartbeat(server, unhealthy, now);
                if r.is_ok() || matches!(r, Err(ViewServerError::Invalid(_))) {
                    self.note_agent(server, agent);
                }
                let _ = reply.send(r);
            }
            NodeRequest::AdoptJobs(host, held, want, reply) => {
                if !self.replica.is_leader() {
                    let _ = reply.send(Err(self.not_leader()));
                    return;
                }
                let view = self.replica.view();
                let got = self.adoptions.adopt(view, &host, &held, want, now);
                if !got.adopted.is_empty() || !got.dropped.is_empty() {
                    tracing::debug!(host, adopted = ?got.adopted, dropped = ?got.dropped, "scheduler host jobs");
                }
                let lease_ms = self.adoptions.lease().as_millis() as u64;
                let _ = reply.send(Ok((got, lease_ms, view.version().0)));
            }
            NodeRequest::Agents(reply) => {
                if !self.replica.is_leader() {
                    let _ = reply.send(Err(self.not_leader()));
                    return;
                }
                let view = self.replica.view();
                let mut out: Vec<(u32, String, String)> = self
                    .agents
                    .iter()
                    .filter(|(s, _)| view.server(**s).is_some_and(|r| r.health != Health::Removed))
                    .map(|(s, a)| (s.0, view.server_name(*s).unwrap_or_default().to_string(), a.clone()))
                    .collect();
                out.sort();
                let _ = reply.send(Ok(out));
            }
            NodeRequest::Holders(host, jobs, reply) => {
                if !self.replica.is_leader() {
                    let _ = reply.send(Err(self.not_leader()));
                    return;
                }
                let _ = reply.send(Ok(self.adoptions.holders(self.replica.view(), &host, &jobs, now)));
            }
            NodeRequest::MovesHelp(job, target, moves, reply) => {
                if !self.replica.is_leader() {
                    let _ = reply.send(Err(self.not_leader()));
                    return;
                }
                let helps = tessera_view::migration_check::moves_help(self.replica.view(), job, &target, &moves);
                let _ = reply.send(Ok(helps));
            }
            NodeRequest::ServerName(server, reply) => {
                let _ = reply.send(Ok(self.replica.view().server_name(server).map(str::to_string)));
            }
            NodeRequest::Membership(add, id, addr, reply) => {
                let r = self.replica.propose_membership(add, id, &addr);
                if let Err((e, Pending::Membership(reply))) = self.track(r, Pending::Membership(reply), now) {
                    let _ = reply.send(Err(e));
                }
            }
            NodeRequest::Raft(msgs) => {
                for m in msgs {
                    self.replica.step(m);
                }
            }
            NodeRequest::Unreachable(id) => self.replica.report_unreachable(id),
            NodeRequest::SnapshotSent(id, ok) => self.replica.report_snapshot(id, ok),
            NodeRequest::Wake => {}
        }
    }

    fn read(&self, what: &ReadTarget) -> ReadOut {
        let view = self.replica.view();
        match what {
            ReadTarget::Snapshot => {
                ReadOut::Snapshot(Box::new(v1::ViewSnapshot::from(&view.snapshot())), self.replica.applied_index())
            }
            ReadTarget::Job(id) => {
                let job = view.job(*id).map(|j| Box::new(v1::Job::from(j))).or_else(|| self.history_job(*id));
                ReadOut::Job(job, None, view.version().0)
            }
            ReadTarget::JobExplained(id) => {
                let job = view.job(*id);
                if job.is_none() {
                    return ReadOut::Job(self.history_job(*id), None, view.version().0);
                }
                // Computed here, on the view itself: cheaper than copying the view out (one pass
                // over the servers; 1.7 ms on 16,000 servers, docs/BENCHMARKS.md).
                let waiting = job.and_then(|j| {
                    tessera_view::Explainer::new(view)
                        .explain(*id)
                        .map(|e| tessera_proto::convert::job_waiting(&e, &j.spec))
                });
                ReadOut::Job(job.map(|j| Box::new(v1::Job::from(j))), waiting, view.version().0)
            }
            ReadTarget::Usage(q) => ReadOut::Usage(Box::new(q.answer(view))),
            ReadTarget::History(q) => ReadOut::History(
                self.replica.history_page(q).map(|p| Box::new(crate::history::response(&p))).map_err(|e| e.to_string()),
            ),
        }
    }

    /// Job `id` from this replica's history of ended jobs (the view forgot it), if it has it.
    fn history_job(&self, id: JobId) -> Option<Box<v1::Job>> {
        match self.replica.history_job(id) {
            Ok(j) => j.map(|j| Box::new(v1::Job::from(&j))),
            Err(e) => {
                tracing::warn!(job_id = id.0, error = %e, "cannot read the history of ended jobs");
                None
            }
        }
    }

    fn lease_ms(&self) -> u64 {
        self.leases.lease_ms()
    }

    /// Remembers where a server's agent serves (an empty address changes nothing).
    fn note_agent(&mut self, server: ServerId, addr: String) {
        if !addr.is_empty() && self.agents.get(&server) != Some(&addr) {
            self.agents.insert(server, addr);
        }
    }

    fn register(&mut self, name: &str, topo: &Topology, agent: String, reply: Reply<(ServerId, u64)>, now: Instant) {
        if !self.replica.is_leader() {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        let view = self.replica.view();
        let Some(id) = view.server_id(name) else {
            let _ = reply.send(Err(ViewServerError::NotFound(format!(
                "server `{name}` is not in the cluster (neither in its spec nor added with `tessera servers add`)"
            ))));
            return;
        };
        let Some(rec) = view.server(id).copied() else {
            let _ = reply.send(Err(ViewServerError::NotFound(format!("server `{name}` has no record"))));
            return;
        };
        if rec.health == Health::Removed {
            let _ = reply.send(Err(ViewServerError::NotFound(format!(
                "server `{name}` was removed from the cluster; an operator adds it again with `tessera servers add`"
            ))));
            return;
        }
        let want = view.topology_of(rec.config_set);
        if let Some(diff) = topology_mismatch(want, topo) {
            let _ = reply.send(Err(ViewServerError::Precondition(format!(
                "server `{name}` reports a topology that differs from its configuration set `{}`: {diff}",
                want.name
            ))));
            return;
        }
        self.leases.register(id, now);
        self.note_agent(id, agent);
        if rec.health == Health::Up {
            let _ = reply.send(Ok((id, self.lease_ms())));
            return;
        }
        let at_ms = self.replica.clock_ms();
        let r = self.replica.propose(Command::SetHealth { server: id, health: Health::Up, at_ms });
        if let Err((e, Pending::Register(_, reply))) = self.track(r, Pending::Register(id, reply), now) {
            let _ = reply.send(Err(e));
        }
    }

    fn heartbeat(&mut self, server: ServerId, unhealthy: Option<u64>, now: Instant) -> Result<u64, ViewServerError> {
        if !self.replica.is_leader() {
            return Err(self.not_leader());
        }
        let view = self.replica.view();
        let Some(rec) = view.server(server).copied() else {
            return Err(ViewServerError::NotFound(format!("no server with id {server}")));
        };
        if rec.health == Health::Removed {
            self.agents.remove(&server);
        }
        let all = view.topology_of(rec.config_set).all_devices();
        let known = view.unhealthy_devices(server);
        self.leases.renew(server, rec.health, now)?;
        // The lease is renewed even when the health report is bad: a malformed mask must not
        // take the server down.
        if let Some(u) = unhealthy
            && u & !all != 0
        {
            return Err(ViewServerError::Invalid(format!(
                "lease renewed, but unhealthy devices {} do not exist on server {server} (it has {})",
                tessera_view::mask::format_indices(u & !all),
                tessera_view::mask::format_indices(all)
            )));
        }
        if let Some(u) = unhealthy.filter(|u| *u != known) {
            tracing::warn!(
                server = server.0,
                unhealthy = %tessera_view::mask::format_indices(u),
                "device health changed: unhealthy devices are not placed on"
            );
            // Fire and forget: the next heartbeat repeats the report if this one is lost.
            let r = self.replica.propose(Command::SetUnhealthyDevices { server, devices: u });
            let _ = self.track(r, Pending::Internal, now);
        }
        Ok(self.lease_ms())
    }

    /// Proposes [`Command::Evict`] for every drained server whose deadline has passed and
    /// that still hosts gangs, at most once a second per server (leader only).
    fn evict_drained(&mut self, now: Instant) {
        let now_ms = self.replica.clock_ms();
        let view = self.replica.view();
        let due: Vec<ServerId> = view
            .cordons()
            .filter(|(_, c)| c.drain_by_ms.is_some_and(|by| by <= now_ms))
            .map(|(s, _)| s)
            .filter(|s| self.evicting.get(s).is_none_or(|at| now.duration_since(*at) >= Duration::from_secs(1)))
            .filter(|s| view.hosts_gangs(*s))
            .collect();
        self.evicting.retain(|s, _| view.cordon_of(*s).is_some());
        for s in due {
            let r = self.replica.propose(Command::Evict { server: s, at_ms: now_ms });
            if r.is_ok() {
                tracing::warn!(server = s.0, "drain deadline passed: re-queuing the gangs still on the server");
                self.evicting.insert(s, now);
            }
            let _ = self.track(r, Pending::Internal, now);
        }
    }

    /// Proposes `Migrate` for the gangs a drain can move before its deadline
    /// ([`tessera_view::drain::drain_moves`]: whole, to placements no looser than theirs): for
    /// every drained server whose deadline is ahead and that hosts gangs, at most every
    /// [`DRAIN_MOVE_EVERY`] per server and [`MAX_DRAIN_MOVES`] gangs at a time (leader only).
    /// Gangs with no such placement stay until the deadline's eviction.
    fn move_drained(&mut self, now: Instant) {
        let now_ms = self.replica.clock_ms();
        let view = self.replica.view();
        let due: Vec<ServerId> = view
            .cordons()
            .filter(|(_, c)| c.drain_by_ms.is_some_and(|by| by > now_ms))
            .map(|(s, _)| s)
            .filter(|s| self.drain_moved.get(s).is_none_or(|at| now.duration_since(*at) >= DRAIN_MOVE_EVERY))
            .filter(|s| view.hosts_gangs(*s))
            .collect();
        self.drain_moved.retain(|s, _| view.cordon_of(*s).is_some());
        let mut batches = Vec::new();
        for s in due {
            self.drain_moved.insert(s, now);
            let moves = drain_moves(view, s, MAX_DRAIN_MOVES);
            if moves.is_empty() {
                continue;
            }
            let proposals: Vec<Proposal> = moves
                .into_iter()
                .map(|m| {
                    self.move_seq = self.move_seq.wrapping_add(1);
                    // Unique among this leader's (a millisecond and a sequence) and, with
                    // overwhelming odds, among the hosts' random ids; a collision is refused.
                    let id = ProposalId((now_ms << 16) | (self.move_seq & 0xffff) | 1);
                    Proposal { id, job: m.job, members: m.to, based_on: view.version() }
                })
                .collect();
            batches.push((s, proposals));
        }
        for (s, proposals) in batches {
            let jobs: Vec<u64> = proposals.iter().map(|p| p.job.0).collect();
            let r = self.replica.propose(Command::Migrate(proposals));
            if r.is_ok() {
                tracing::info!(server = s.0, jobs = ?jobs, "drain: moving gangs off the server before its deadline");
            }
            let _ = self.track(r, Pending::Internal, now);
        }
    }

    /// Writes a clock entry when a placement's time limit has passed (leader only, at most once
    /// a second): the view fails such jobs as its clock reaches their deadline, and on a busy
    /// cluster every entry moves the clock anyway, but an idle log would hold them forever.
    fn expire_time_limits(&mut self, now: Instant) {
        let now_ms = self.replica.clock_ms();
        if self.replica.view().next_deadline_ms().is_none_or(|d| d > now_ms)
            || self.clock_tick.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1))
        {
            return;
        }
        let r = self.replica.propose(Command::Clock { at_ms: now_ms });
        if r.is_ok() {
            tracing::info!("a time limit passed: writing the clock");
            self.clock_tick = Some(now);
        }
        let _ = self.track(r, Pending::Internal, now);
    }

    /// Expired requests and leases.
    fn housekeeping(&mut self, now: Instant) {
        let limit = self.cfg.timeout * 2;
        let expired: Vec<Ticket> =
            self.pending.iter().filter(|(_, (at, _))| now.duration_since(*at) > limit).map(|(t, _)| *t).collect();
        for t in expired {
            if let Some((_, p)) = self.pending.remove(&t) {
                fail(p, ViewServerError::Timeout { after_ms: limit.as_millis() as u64 });
            }
        }
        if !self.replica.is_leader() {
            return;
        }
        self.move_drained(now);
        self.evict_drained(now);
        self.expire_time_limits(now);
        for s in self.leases.expired(now) {
            if self.replica.view().server(s).is_none_or(|r| r.health == Health::Removed) {
                // Removed while it held a lease: nothing to mark down.
                self.leases.marked_down(s);
                self.agents.remove(&s);
                continue;
            }
            let at_ms = self.replica.clock_ms();
            let r = self.replica.propose(Command::SetHealth { server: s, health: Health::Down, at_ms });
            if r.is_ok() {
                // Only once the change is queued; otherwise the next tick tries again.
                self.leases.marked_down(s);
                tracing::warn!(server = s.0, "lease expired: marking the server down, its gangs go back to pending");
            }
            let _ = self.track(r, Pending::Internal, now);
        }
    }

    fn answer(&mut self) {
        let version = self.replica.view().version().0;
        for (t, a) in self.replica.take_outcomes() {
            let Some((_, p)) = self.pending.remove(&t) else { continue };
            match (p, a) {
                (Pending::Answer(reply), a) => {
                    let _ = reply.send(Ok((a, version)));
                }
                (Pending::Read(what, reply), Answer::ReadReady { .. }) => {
                    let _ = reply.send(Ok(self.read(&what)));
                }
                (Pending::Register(id, reply), Answer::Applied(Outcome::HealthSet(Ok(_)))) => {
                    let _ = reply.send(Ok((id, self.lease_ms())));
                }
                (Pending::Register(_, reply), Answer::Applied(Outcome::HealthSet(Err(e)))) => {
                    let _ = reply.send(Err(ViewServerError::View(e)));
                }
                (Pending::Membership(reply), Answer::Membership { voters }) => {
                    let _ = reply.send(Ok(voters));
                }
                (p, Answer::Refused(why)) => fail(p, ViewServerError::Precondition(why)),
                (p, Answer::Dropped) => fail(
                    p,
                    ViewServerError::Stopped(
                        "leadership changed before the request committed; its outcome is unknown".into(),
                    ),
                ),
                (p, other) => fail(p, ViewServerError::Internal(format!("unexpected answer {other:?}"))),
            }
        }
    }

    /// Publishes the round's version and follows leadership changes; `now` is the clock read at
    /// the end of the round.
    fn after_round(&mut self, now: Instant) {
        let v = self.replica.view().version().0;
        if *self.version_tx.borrow() != v {
            self.publish_revocations();
            let _ = self.version_tx.send(v);
        }
        let known = self.replica.leader_id();
        if *self.leader_tx.borrow() != known {
            let _ = self.leader_tx.send(known);
        }
        let leader = self.replica.is_leader();
        if leader && !self.was_leader {
            tracing::info!(replica = self.replica.id(), term = self.replica.term(), "became leader");
            self.adoptions.took_office(now);
            // Every server that is alive (not down, not removed) gets a full lease from the new
            // leader.
            let not_down = self
                .replica
                .view()
                .servers()
                .iter()
                .enumerate()
                .filter(|(_, s)| !matches!(s.health, Health::Down | Health::Removed));
            self.leases.took_office(now, not_down.map(|(i, _)| ServerId(i as u32)));
        }
        if !leader && self.was_leader {
            tracing::info!(replica = self.replica.id(), "lost leadership");
            self.leases.left_office();
        }
        self.was_leader = leader;
        // Every round, but a write lock only when a membership change announced something new.
        let new: Vec<(u64, String)> = match self.addrs.read() {
            Ok(addrs) => self
                .replica
                .announced_addrs()
                .iter()
                .filter(|(id, a)| addrs.get(*id) != Some(*a))
                .map(|(id, a)| (*id, a.clone()))
                .collect(),
            Err(_) => Vec::new(),
        };
        if !new.is_empty()
            && let Ok(mut addrs) = self.addrs.write()
        {
            addrs.extend(new.iter().cloned());
        }
        for (id, a) in new {
            if id != self.replica.id() {
                (self.on_new_peer)(id, crate::config::split_addr(&a).1.to_string());
            }
        }
    }
}

/// Queues messages on their peers' transports without blocking; returns the peers whose
/// snapshot message could not be queued (raft must hear that it failed).
fn send_to(peers: &PeerSenders, msgs: Vec<Message>) -> Vec<u64> {
    let mut failed_snapshots = Vec::new();
    let Ok(peers) = peers.read() else { return failed_snapshots };
    for m in msgs {
        let to = m.to;
        let snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
        let queued = match peers.get(&to) {
            // A full queue or a gone peer task: raft resends.
            Some(tx) => tx.try_send(m).is_ok(),
            None => {
                tracing::debug!(to, "no transport to replica; message dropped");
                false
            }
        };
        if snapshot && !queued {
            failed_snapshots.push(to);
        }
    }
    failed_snapshots
}

fn fail(p: Pending, e: ViewServerError) {
    match p {
        Pending::Answer(r) => {
            let _ = r.send(Err(e));
        }
        Pending::Read(_, r) => {
            let _ = r.send(Err(e));
        }
        Pending::Register(_, r) => {
            let _ = r.send(Err(e));
        }
        Pending::Membership(r) => {
            let _ = r.send(Err(e));
        }
        Pending::Internal => {}
    }
}

/// What differs between the configured topology and a discovered one (names aside).
pub fn topology_mismatch(want: &Topology, got: &Topology) -> Option<String> {
    let mut diffs = Vec::new();
    if want.device_type != got.device_type {
        diffs.push(format!("device type {} vs {}", got.device_type, want.device_type));
    }
    if want.devices != got.devices {
        diffs.push(format!("{} devices vs {}", got.devices, want.devices));
    }
    if want.sockets != got.sockets {
        diffs.push(format!("socket masks {:x?} vs {:x?}", got.sockets, want.sockets));
    }
    if want.pcie_switches != got.pcie_switches {
        diffs.push(format!("PCIe switch masks {:x?} vs {:x?}", got.pcie_switches, want.pcie_switches));
    }
    if want.nvlink_groups != got.nvlink_groups {
        diffs.push(format!("NVLink groups {:x?} vs {:x?}", got.nvlink_groups, want.nvlink_groups));
    }
    if want.cores_per_socket != got.cores_per_socket {
        diffs.push(format!("{} cores per socket vs {}", got.cores_per_socket, want.cores_per_socket));
    }
    if want.memory_mib != got.memory_mib {
        diffs.push(format!("{} MiB memory vs {}", got.memory_mib, want.memory_mib));
    }
    (!diffs.is_empty()).then(|| format!("{} (reported vs configured)", diffs.join(", ")))
}
