//! [`Replica`]: one replica of the cluster view, driven by its owner.
//!
//! The replica does no network I/O and reads no clock. Its owner (a server task, or the
//! deterministic simulator in the tests) calls [`Replica::tick`] on a timer,
//! [`Replica::step`] with each message from a peer, [`Replica::propose_gang`] and
//! [`Replica::propose`] for client writes, and [`Replica::on_ready`], which persists through
//! its storage backend (RocksDB in production), applies committed entries to the
//! [`ClusterView`] and returns the messages to send. Outcomes of this replica's own proposals
//! come back from [`Replica::take_outcomes`], keyed by ticket. An error from `on_ready` (a
//! failed write, a value that cannot be encoded, a snapshot that breaks the invariants) means
//! the replica must stop: reopened, it recovers from what its storage holds durably.
//!
//! **Approver on the leader.** A gang proposal is pre-checked against the applied view plus
//! the resources of gangs already in flight (accepted by the pre-check, not yet applied); a
//! conflict is answered at once, with no log entry. Accepted proposals wait in a batch that the
//! next `on_ready` writes as one log entry. Apply re-validates every proposal on every replica
//! with the same code ([`ClusterView::propose`]), so a pre-check that passed on stale
//! reservations can still be refused at apply, deterministically everywhere. The pre-check's
//! test of the reservations is the approver's own ([`fit::check_member_free`]) on the server
//! records net of them: one definition of "free".
//!
//! **Snapshots are checked before they replace anything.** A snapshot from the leader (and the
//! one stored, at open) is decoded and checked like a snapshot from the wire
//! ([`tessera_proto::validate::check_snapshot`]), then its view against the invariants
//! ([`tessera_view::invariants::check`]); only then are the storage and the state replaced.

use crate::backend::{Backend, WriteBatch};
use crate::clock::LeaderClock;
use crate::codec::{self, SnapshotData};
use crate::error::ReplicaError;
use crate::history;
use crate::logger::raft_logger;
use crate::rocks::RocksBackend;
use crate::storage::{RaftStorage, RocksStorage};
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, Message, Snapshot};
use raft::{RawNode, StateRole};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;
use tessera_view::fit;
use tessera_view::placement::Rejection;
use tessera_view::{
    ClusterView, Command, CoreMask, Decision, Job, JobId, MemberPlacement, Outcome, Proposal, ProposalId, ServerId,
    ServerRecord,
};

/// How often (on the view's clock) a replica drops history records past the retention.
pub const HISTORY_PRUNE_EVERY_MS: u64 = 60_000;

/// A client's handle on a proposal made through this replica.
pub type Ticket = u64;

/// Settings of one replica.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This replica's id (non-zero).
    pub id: u64,
    /// Every voter's id at bootstrap, this one included.
    pub peers: Vec<u64>,
    /// Cluster name; a data dir written for another cluster is refused.
    pub cluster: String,
    /// Ticks without a leader before an election.
    pub election_tick: usize,
    /// Ticks between leader heartbeats.
    pub heartbeat_tick: usize,
    /// fsync every write (on in production; off only in simulation tests).
    pub sync: bool,
    /// Take a snapshot and compact the log after this many applied entries.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot for followers slightly behind.
    pub keep_entries: u64,
    /// Most proposals waiting for commit on the leader.
    pub max_in_flight: usize,
    /// Most gang proposals in one log entry.
    pub max_batch: usize,
    /// Changes the view remembers for deltas (watchers further behind get a snapshot).
    pub change_log: usize,
    /// Draw election timeouts from this seed instead of raft-rs's thread-local randomness, so
    /// that a simulation replays exactly (tests only).
    pub election_seed: Option<u64>,
}

impl ReplicaConfig {
    /// Defaults for replica `id` of a cluster of `peers`.
    pub fn new(id: u64, peers: Vec<u64>, cluster: &str) -> ReplicaConfig {
        ReplicaConfig {
            id,
            peers,
            cluster: cluster.to_string(),
            election_tick: 10,
            heartbeat_tick: 2,
            sync: true,
            snapshot_every: 10_000,
            keep_entries: 1_000,
            max_in_flight: 65_536,
            max_batch: 1_024,
            change_log: tessera_view::view::DEFAULT_CHANGE_LOG,
            election_seed: None,
        }
    }
}

/// What a client gets back for a proposal.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Applied: the outcome of the command.
    Applied(Outcome),
    /// Decided without a log entry (a pre-check conflict or an idempotent retry).
    Immediate(Decision),
    /// The outcome is unknown: the entry was overwritten after a leadership change, or this
    /// replica caught up by snapshot past it. Retrying a gang proposal under the same id is safe
    /// (the approver answers `AlreadyApplied` if it did commit).
    Dropped,
    /// A linearizable read may be served: this replica has applied at least `index`, the
    /// commit index the leader confirmed (with a quorum) after the read was asked.
    ReadReady {
        /// The confirmed commit index.
        index: u64,
    },
    /// Refused without changing anything (e.g. a membership change while another is pending).
    Refused(String),
    /// A membership change was applied: the voters after it.
    Membership {
        /// Voter ids.
        voters: Vec<u64>,
    },
}

/// Resources held by gangs in flight on one server.
#[derive(Clone, Copy, Debug, Default)]
struct Reserved {
    gpus: u64,
    cores: CoreMask,
    memory_mib: u64,
}

impl Reserved {
    /// `rec` with these reservations taken: what the pre-check may still grant.
    fn net_of(&self, rec: ServerRecord) -> ServerRecord {
        ServerRecord {
            free_gpus: rec.free_gpus & !self.gpus,
            free_cores: rec.free_cores.without(self.cores),
            free_memory_mib: (rec.free_memory_mib as u64).saturating_sub(self.memory_mib) as u32,
            ..rec
        }
    }
}

/// Checks snapshot data taken at raft index `index` (from the leader or from storage) like a
/// snapshot from the wire, builds its view and checks the view's invariants. Nothing is
/// replaced on failure.
fn checked_snapshot(
    index: u64,
    data: SnapshotData,
    change_log: usize,
) -> Result<(ClusterView, BTreeMap<u64, String>), ReplicaError> {
    let bad = |why: String| ReplicaError::BadSnapshot { index, why };
    if data.applied != index {
        return Err(bad(format!("its view is at index {}", data.applied)));
    }
    tessera_proto::validate::check_snapshot(&data.view).map_err(|e| bad(e.to_string()))?;
    // The jobs it forgets go to this replica's history of ended jobs (`write_history`).
    let view = ClusterView::from_snapshot(data.view).with_change_log(change_log).keeping_forgotten();
    let report = tessera_view::invariants::check(&view);
    if !report.is_clean() {
        let shown: Vec<&str> = report.violations.iter().take(3).map(String::as_str).collect();
        return Err(bad(format!("{} violations: {}", report.violations.len(), shown.join("; "))));
    }
    Ok((view, data.addrs))
}

/// One replica, over the storage backend `B` (RocksDB unless said otherwise).
pub struct Replica<B: Backend = RocksBackend> {
    cfg: ReplicaConfig,
    node: RawNode<RaftStorage<B>>,
    view: ClusterView,
    applied: u64,
    next_ticket: Ticket,
    outcomes: Vec<(Ticket, Answer)>,
    /// Commands waiting for the next entry; gangs are `Command::Propose` of one proposal.
    batch: Vec<(Ticket, Command)>,
    /// Linearizable reads waiting for their index to be applied: (index, ticket).
    reads: Vec<(u64, Ticket)>,
    /// Addresses of replicas, as announced in applied membership changes.
    addrs: BTreeMap<u64, String>,
    in_flight: HashMap<Ticket, Vec<MemberPlacement>>,
    in_flight_jobs: HashMap<JobId, Ticket>,
    in_flight_ids: HashMap<Ticket, (ProposalId, JobId)>,
    reserved: HashMap<ServerId, Reserved>,
    was_leader: bool,
    /// A membership change was applied: snapshot at once, so that a snapshot sent to a new
    /// replica names it among the voters (raft refuses one that does not).
    snapshot_now: bool,
    /// Entries this replica proposed and has not applied yet: (index, term, tickets).
    proposed: std::collections::VecDeque<(u64, u64, Vec<Ticket>)>,
    /// The view's clock at the last prune of the history of ended jobs (0: none yet).
    history_pruned_ms: u64,
    /// The clock this replica writes as leader (elapsed time, slewed toward its wall clock).
    clock: LeaderClock,
}

impl<B: Backend> std::fmt::Debug for Replica<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.cfg.id)
            .field("term", &self.node.raft.term)
            .field("leader", &self.node.raft.leader_id)
            .field("applied", &self.applied)
            .finish()
    }
}

impl Replica<RocksBackend> {
    /// Opens the replica stored in the RocksDB directory `dir`. A new directory is bootstrapped
    /// with `initial` (the view every replica of the cluster starts from) and the configured
    /// peers as voters; an existing one recovers from its snapshot and log alone.
    pub fn open(
        cfg: ReplicaConfig,
        dir: &Path,
        initial: impl FnOnce() -> ClusterView,
    ) -> Result<Replica, ReplicaError> {
        let store = RocksStorage::open(dir, &cfg.cluster, cfg.id, cfg.sync)?;
        Replica::with_storage(cfg, store, initial)
    }
}

impl<B: Backend> Replica<B> {
    /// Opens the replica held by `backend` (a simulated disk in the tests), as
    /// [`Replica::open`] does a RocksDB directory.
    pub fn with_backend(
        cfg: ReplicaConfig,
        backend: B,
        initial: impl FnOnce() -> ClusterView,
    ) -> Result<Replica<B>, ReplicaError> {
        let store = RaftStorage::with_backend(backend, "the storage backend", &cfg.cluster, cfg.id, cfg.sync)?;
        Replica::with_storage(cfg, store, initial)
    }

    fn with_storage(
        cfg: ReplicaConfig,
        mut store: RaftStorage<B>,
        initial: impl FnOnce() -> ClusterView,
    ) -> Result<Replica<B>, ReplicaError> {
        if store.is_empty() {
            // With no peers the replica joins a running cluster: no voters until the leader's
            // log or snapshot tells it the membership.
            let cs = ConfState { voters: cfg.peers.clone(), ..Default::default() };
            let data = codec::encode_snapshot(&SnapshotData {
                applied: if cfg.peers.is_empty() { 0 } else { 1 },
                view: initial().snapshot(),
                addrs: Default::default(),
            })?;
            store.bootstrap(cs, data)?;
        }
        let (meta, data) = store.latest_snapshot();
        let applied = meta.index;
        let (view, addrs) = checked_snapshot(applied, codec::decode_snapshot(data)?, cfg.change_log)?;
        let raft_cfg = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_tick,
            heartbeat_tick: cfg.heartbeat_tick,
            applied,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        raft_cfg.validate()?;
        let node = RawNode::new(&raft_cfg, store, &raft_logger(cfg.id))?;
        tracing::info!(replica = cfg.id, applied, "replica opened");
        let mut replica = Replica {
            cfg,
            node,
            view,
            applied,
            next_ticket: 1,
            outcomes: Vec::new(),
            batch: Vec::new(),
            reads: Vec::new(),
            addrs,
            in_flight: HashMap::new(),
            in_flight_jobs: HashMap::new(),
            in_flight_ids: HashMap::new(),
            reserved: HashMap::new(),
            was_leader: false,
            snapshot_now: false,
            proposed: std::collections::VecDeque::new(),
            history_pruned_ms: 0,
            clock: LeaderClock::default(),
        };
        replica.seed_election_timeout();
        Ok(replica)
    }

    /// This replica's id.
    pub fn id(&self) -> u64 {
        self.cfg.id
    }

    /// The applied view (what followers serve reads from), at [`Replica::applied_index`].
    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    /// The raft index the view reflects.
    pub fn applied_index(&self) -> u64 {
        self.applied
    }

    /// The raft role: "leader", "follower", "candidate" or "pre-candidate".
    pub fn role(&self) -> &'static str {
        match self.node.raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        }
    }

    /// Whether this replica leads.
    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    /// The leader as this replica knows it (0 if none).
    pub fn leader_id(&self) -> u64 {
        self.node.raft.leader_id
    }

    /// The view's time now as this replica would write it (Unix ms), never before the view's
    /// clock: as leader, the clock its next entry will carry (see [`crate::clock`]); as a
    /// follower, its estimate from the entries it saw. For decisions the leader takes on time
    /// (drain deadlines, time limits), so that a step of this machine's wall clock moves them
    /// no more than it moves the view.
    pub fn clock_ms(&mut self) -> u64 {
        let now = Instant::now();
        let t = if self.is_leader() {
            self.clock.stamp(crate::clock::wall_ms(), now)
        } else {
            self.clock.estimate(now).unwrap_or_else(crate::clock::wall_ms)
        };
        t.max(self.view.now_ms())
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// Entries in the log (bounded by compaction).
    pub fn log_len(&self) -> usize {
        self.node.store().entry_count()
    }

    /// Advances the logical clock by one tick.
    pub fn tick(&mut self) {
        self.node.tick();
        self.seed_election_timeout();
    }

    /// With `election_seed`, replaces raft-rs's random election timeout by one derived from
    /// (seed, replica, term, role): different across replicas and terms, identical on replay.
    fn seed_election_timeout(&mut self) {
        let Some(seed) = self.cfg.election_seed else { return };
        let r = &mut self.node.raft;
        let mut h = tessera_view::hash::StateHasher::default();
        h.u64(seed);
        h.u64(self.cfg.id);
        h.u64(r.term);
        h.u64(r.state as u64);
        let (lo, hi) = (self.cfg.election_tick, 2 * self.cfg.election_tick);
        let t = lo + (h.finish() % (hi - lo) as u64) as usize;
        if r.randomized_election_timeout() != t {
            r.set_randomized_election_timeout(t);
        }
    }

    /// Starts an election now (tests and leader transfer).
    pub fn campaign(&mut self) -> Result<(), ReplicaError> {
        self.node.campaign()?;
        self.seed_election_timeout();
        Ok(())
    }

    /// Takes a message from a peer. Malformed or unknown-peer messages are dropped with a log
    /// line, and so are messages no correct peer sends that raft-rs would end the process on
    /// (`cluster-view/replica/src/forged.rs`): a peer cannot make this replica fail.
    pub fn step(&mut self, msg: Message) {
        if let Some(why) = crate::forged::forged(&self.node.raft, &msg) {
            tracing::warn!(replica = self.cfg.id, from = msg.from, why = %why, "dropped a raft message no correct peer sends");
            return;
        }
        if let Err(e) = self.node.step(msg) {
            tracing::debug!(replica = self.cfg.id, error = %e, "dropped raft message");
        }
        self.seed_election_timeout();
    }

    /// The transport's report on a snapshot message sent to `to`: delivered or not. Without a
    /// failure report the leader keeps that follower paused, waiting for the snapshot.
    pub fn report_snapshot(&mut self, to: u64, delivered: bool) {
        let status = if delivered { raft::SnapshotStatus::Finish } else { raft::SnapshotStatus::Failure };
        self.node.report_snapshot(to, status);
    }

    /// The transport could not reach `to`; raft slows its replication to that peer.
    pub fn report_unreachable(&mut self, to: u64) {
        self.node.report_unreachable(to);
    }

    /// Decodes and takes a message from a peer's bytes.
    pub fn step_bytes(&mut self, bytes: &[u8]) -> Result<(), ReplicaError> {
        let m = Message::parse_from_bytes(bytes)
            .map_err(|e| ReplicaError::Decode { what: "raft message", why: e.to_string() })?;
        self.step(m);
        Ok(())
    }

    fn ticket(&mut self) -> Ticket {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    fn check_leader(&self) -> Result<(), ReplicaError> {
        if !self.is_leader() {
            return Err(ReplicaError::NotLeader { leader_hint: self.leader_id() });
        }
        if self.in_flight.len() + self.batch.len() >= self.cfg.max_in_flight {
            return Err(ReplicaError::Busy(self.cfg.max_in_flight));
        }
        Ok(())
    }

    /// Queues any command for the next log entry (commands are batched with gangs). A
    /// `Command::Propose` of one gang takes the [`Replica::propose_gang`] path (pre-check, one
    /// ticket); several gangs in one command are refused as `Invalid`. A `Command::Preempt`
    /// is pre-checked against the applied view (a refusal comes back at once as
    /// [`Answer::Immediate`]); apply decides again, on every replica.
    pub fn propose(&mut self, cmd: Command) -> Result<Ticket, ReplicaError> {
        if let Command::Propose(mut ps) = cmd {
            // Gangs go through the pre-check, one ticket each.
            return match ps.pop() {
                Some(p) if ps.is_empty() => self.propose_gang(p),
                _ => Err(ReplicaError::Invalid("propose gangs one at a time (propose_gang)".into())),
            };
        }
        self.check_leader()?;
        let t = self.ticket();
        if let Command::Preempt(pre) = &cmd
            && let Err(d) = self.view.precheck_preempt(pre)
        {
            self.outcomes.push((t, Answer::Immediate(d)));
            return Ok(t);
        }
        self.batch.push((t, cmd));
        Ok(t)
    }

    /// Asks for a linearizable read: [`Answer::ReadReady`] comes back once the leader has
    /// confirmed its commit index with a quorum and this replica has applied up to it. Works
    /// on followers (raft forwards the request to the leader); a read asked while no leader is
    /// known may never be answered, so the owner bounds the wait.
    pub fn read_index(&mut self) -> Ticket {
        let t = self.ticket();
        // The tag names this replica and incarnation: tags of different replicas (or of an
        // earlier life of this one) never collide at the leader or answer the wrong request.
        self.node.read_index(codec::encode_context(self.cfg.id, self.node.store().boot(), &[t]));
        t
    }

    /// Proposes a membership change; `addr` (the new replica's address) travels in the change
    /// and is recorded by every replica when applied. Answered with [`Answer::Membership`].
    pub fn propose_membership(&mut self, add: bool, id: u64, addr: &str) -> Result<Ticket, ReplicaError> {
        self.check_leader()?;
        let t = self.ticket();
        let mut cc = ConfChange::default();
        cc.set_change_type(if add { ConfChangeType::AddNode } else { ConfChangeType::RemoveNode });
        cc.node_id = id;
        cc.context = addr.as_bytes().to_vec().into();
        self.node.propose_conf_change(codec::encode_context(self.cfg.id, self.node.store().boot(), &[t]), cc)?;
        self.track(vec![t]);
        Ok(t)
    }

    /// Current voters.
    pub fn voters(&self) -> Vec<u64> {
        let mut v = self.node.store().conf_state().voters.clone();
        v.sort_unstable();
        v
    }

    /// Addresses of replicas announced by applied membership changes.
    pub fn announced_addrs(&self) -> &BTreeMap<u64, String> {
        &self.addrs
    }

    /// Pre-checks a gang proposal and queues it for the next batch entry. A decision reached
    /// without the log (conflict with applied or in-flight state, idempotent retry) comes back
    /// from [`Replica::take_outcomes`] at once as [`Answer::Immediate`].
    pub fn propose_gang(&mut self, p: Proposal) -> Result<Ticket, ReplicaError> {
        self.check_leader()?;
        let t = self.ticket();
        if let Err(d) = self.view.precheck(&p) {
            self.outcomes.push((t, Answer::Immediate(d)));
            return Ok(t);
        }
        if let Some(&t0) = self.in_flight_jobs.get(&p.job)
            && self.in_flight_ids.get(&t0).map(|(id, _)| *id) == Some(p.id)
        {
            // A retry of a proposal still in flight: its outcome is not known yet.
            return Err(ReplicaError::Busy(self.in_flight.len()));
        }
        if self.in_flight_jobs.contains_key(&p.job) {
            let d = Decision::Rejected {
                job: p.job,
                proposal: p.id,
                reason: Rejection::JobNotPending { state: "being placed by another proposal".into() },
                fresh: Vec::new(),
                version: self.view.version(),
            };
            self.outcomes.push((t, Answer::Immediate(d)));
            return Ok(t);
        }
        if let Some(d) = self.conflicts_in_flight(&p) {
            self.outcomes.push((t, Answer::Immediate(d)));
            return Ok(t);
        }
        for m in &p.members {
            let r = self.reserved.entry(m.server).or_default();
            r.gpus |= m.gpus;
            r.cores = r.cores.or(m.cores);
            r.memory_mib += m.memory_mib as u64;
        }
        self.in_flight_jobs.insert(p.job, t);
        self.in_flight_ids.insert(t, (p.id, p.job));
        self.in_flight.insert(t, p.members.clone());
        self.batch.push((t, Command::Propose(vec![p])));
        Ok(t)
    }

    /// A rejection if `p` claims what gangs in flight hold; its fresh records show the servers
    /// net of those reservations. The test is the approver's: the gang's members on one server
    /// taken together (their memory adds up), checked by [`fit::check_member_free`] against the
    /// server's record net of the reservations.
    fn conflicts_in_flight(&self, p: &Proposal) -> Option<Decision> {
        let mut claims: Vec<MemberPlacement> = Vec::with_capacity(p.members.len());
        for m in &p.members {
            match claims.iter_mut().find(|c| c.server == m.server) {
                Some(c) => {
                    c.gpus |= m.gpus;
                    c.cores = c.cores.or(m.cores);
                    c.memory_mib = c.memory_mib.saturating_add(m.memory_mib);
                }
                None => claims.push(*m),
            }
        }
        let mut stale: Vec<(ServerId, ServerRecord)> = Vec::new();
        let mut first: Option<Rejection> = None;
        for c in &claims {
            let Some(r) = self.reserved.get(&c.server) else { continue };
            let net = r.net_of(self.view.server(c.server).copied()?);
            if let Err(reason) = fit::check_member_free(&net, c) {
                first.get_or_insert(reason);
                stale.push((c.server, net));
            }
        }
        first.map(|reason| Decision::Rejected {
            job: p.job,
            proposal: p.id,
            reason,
            fresh: stale,
            version: self.view.version(),
        })
    }

    fn release_in_flight(&mut self, t: Ticket) {
        let Some(members) = self.in_flight.remove(&t) else { return };
        if let Some((_, job)) = self.in_flight_ids.remove(&t)
            && self.in_flight_jobs.get(&job) == Some(&t)
        {
            self.in_flight_jobs.remove(&job);
        }
        for m in members {
            if let Some(r) = self.reserved.get_mut(&m.server) {
                r.gpus &= !m.gpus;
                r.cores = r.cores.without(m.cores);
                r.memory_mib = r.memory_mib.saturating_sub(m.memory_mib as u64);
                if r.gpus == 0 && r.cores.is_empty() && r.memory_mib == 0 {
                    self.reserved.remove(&m.server);
                }
            }
        }
    }

    /// Remembers where the entry just proposed sits in the log.
    fn track(&mut self, tickets: Vec<Ticket>) {
        let index = self.node.raft.raft_log.last_index();
        self.proposed.push_back((index, self.node.raft.term, tickets));
    }

    fn drop_tickets(&mut self, tickets: Vec<Ticket>) {
        for t in tickets {
            self.release_in_flight(t);
            self.outcomes.push((t, Answer::Dropped));
        }
    }

    /// Settles tracked proposals at or before `index`: one of ours at `index` with the same
    /// `term` is the entry being applied (returns true: report its outcome); any other was
    /// replaced by another entry, or jumped over by a snapshot, so its outcome is unknown.
    fn settle(&mut self, index: u64, term: Option<u64>) -> bool {
        let mut ours = false;
        while let Some(&(i, t, _)) = self.proposed.front() {
            if i > index {
                break;
            }
            let (_, _, tickets) = self.proposed.pop_front().unwrap_or_default();
            if i == index && term == Some(t) {
                ours = true;
            } else {
                self.drop_tickets(tickets);
            }
        }
        ours
    }

    /// Outcomes of this replica's proposals decided since the last call.
    pub fn take_outcomes(&mut self) -> Vec<(Ticket, Answer)> {
        std::mem::take(&mut self.outcomes)
    }

    /// Log entries this replica proposed whose fate is not settled yet, plus batched gangs.
    pub fn proposed_unsettled(&self) -> usize {
        self.proposed.len() + self.batch.len()
    }

    /// Index and term of each proposed entry not settled yet (diagnostics).
    pub fn unsettled(&self) -> Vec<(u64, u64)> {
        self.proposed.iter().map(|(i, t, _)| (*i, *t)).collect()
    }

    /// Proposals accepted by the pre-check and not yet applied.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Writes queued commands as log entries of at most `max_batch` commands (a gang counts
    /// as one). In each entry the gangs form one `Command::Propose`, first, then the other
    /// commands in arrival order; the context lists the tickets in the order of the outcomes.
    /// A chunk that cannot be encoded is not proposed: its tickets are dropped and the error
    /// returned (the replica stops).
    fn flush_batch(&mut self) -> Result<(), ReplicaError> {
        while !self.batch.is_empty() {
            let mut size = 0;
            let mut n = 0;
            for (_, c) in &self.batch {
                let w = match c {
                    Command::Propose(ps) => ps.len().max(1),
                    _ => 1,
                };
                if n > 0 && size + w > self.cfg.max_batch {
                    break;
                }
                size += w;
                n += 1;
            }
            let chunk: Vec<(Ticket, Command)> = self.batch.drain(..n).collect();
            let mut gangs: Vec<Proposal> = Vec::new();
            let mut gang_tickets: Vec<Ticket> = Vec::new();
            let mut others: Vec<Command> = Vec::new();
            let mut other_tickets: Vec<Ticket> = Vec::new();
            for (t, c) in chunk {
                match c {
                    Command::Propose(mut ps) if ps.len() == 1 => {
                        gangs.append(&mut ps);
                        gang_tickets.push(t);
                    }
                    c => {
                        others.push(c);
                        other_tickets.push(t);
                    }
                }
            }
            // Every entry starts with this leader's clock: the view's times and usage ledger
            // read it, the same on every replica (see `tessera_view::usage`).
            let mut cmds = Vec::with_capacity(others.len() + 2);
            cmds.push(Command::Clock { at_ms: self.clock.stamp(crate::clock::wall_ms(), Instant::now()) });
            if !gangs.is_empty() {
                cmds.push(Command::Propose(gangs));
            }
            cmds.extend(others);
            let mut tickets = gang_tickets;
            tickets.extend(other_tickets);
            let boot = self.node.store().boot();
            let ctx = codec::encode_context(self.cfg.id, boot, &tickets);
            let data = match codec::encode_commands(&cmds) {
                Ok(data) => data,
                Err(e) => {
                    tracing::error!(replica = self.cfg.id, error = %e, commands = tickets.len(), "batch not encodable");
                    self.drop_tickets(tickets);
                    return Err(e);
                }
            };
            match self.node.propose(ctx, data) {
                Ok(()) => self.track(tickets),
                Err(e) => {
                    tracing::warn!(replica = self.cfg.id, error = %e, commands = tickets.len(), "batch dropped");
                    self.drop_tickets(tickets);
                }
            }
        }
        Ok(())
    }

    /// Writes pending batches, then handles raft's ready state: persists, applies, and returns
    /// the messages to send to peers.
    pub fn on_ready(&mut self) -> Result<Vec<Message>, ReplicaError> {
        let mut early = Vec::new();
        let mut rest = self.on_ready_with(&mut |m| early.extend(m))?;
        early.append(&mut rest);
        Ok(early)
    }

    /// Like [`Replica::on_ready`], but hands the messages that may leave before this
    /// replica's own fsync (a leader's appends and heartbeats) to `send_early` first, so
    /// followers write in parallel with the leader; returns the rest, which must only be sent
    /// after the write (votes, acknowledgements).
    pub fn on_ready_with(&mut self, send_early: &mut dyn FnMut(Vec<Message>)) -> Result<Vec<Message>, ReplicaError> {
        self.flush_batch()?;
        self.on_role_change();
        if !self.node.has_ready() {
            return Ok(Vec::new());
        }
        let mut rd = self.node.ready();
        let early = rd.take_messages();
        if !early.is_empty() {
            send_early(early);
        }
        let mut out = Vec::new();
        for rs in rd.take_read_states() {
            if let [t] = self.own_tickets(&rs.request_ctx, true)[..] {
                self.reads.push((rs.index, t));
            }
        }
        if *rd.snapshot() != Snapshot::default() {
            let snap = rd.snapshot().clone();
            let index = snap.get_metadata().index;
            // Checked before it replaces anything: a bad snapshot stops the replica with its
            // storage and state as they were.
            let (view, addrs) = checked_snapshot(index, codec::decode_snapshot(snap.get_data())?, self.cfg.change_log)?;
            crate::fail_point!("replica::install_snapshot", |_| Err(ReplicaError::Storage {
                why: "fail point install_snapshot".into()
            }));
            self.node.mut_store().apply_snapshot(&snap)?;
            self.view = view;
            self.addrs = addrs;
            self.applied = index;
            let _ = self.settle(self.applied, None);
            tracing::info!(replica = self.cfg.id, index = self.applied, "installed snapshot");
        }
        self.apply(rd.take_committed_entries())?;
        let hs = rd.hs().cloned();
        self.node.mut_store().persist(rd.entries(), hs)?;
        out.extend(rd.take_persisted_messages());
        let mut light = self.node.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.node.mut_store().set_commit(commit)?;
        }
        out.extend(light.take_messages());
        self.apply(light.take_committed_entries())?;
        self.write_history()?;
        self.node.advance_apply_to(self.applied);
        self.answer_reads();
        self.maybe_compact()?;
        Ok(out)
    }

    /// Writes the jobs the view forgot to this replica's history of ended jobs (unsynced: a
    /// replay after a crash writes them again), and, at most once per
    /// [`HISTORY_PRUNE_EVERY_MS`] of the view's clock, drops up to
    /// [`history::PRUNE_BATCH`] records older than the accounting retention.
    fn write_history(&mut self) -> Result<(), ReplicaError> {
        let gone = self.view.take_forgotten();
        let now_ms = self.view.now_ms();
        let prune = now_ms >= self.history_pruned_ms.saturating_add(HISTORY_PRUNE_EVERY_MS);
        if gone.is_empty() && !prune {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        history::record(&mut batch, &gone)?;
        if prune {
            self.history_pruned_ms = now_ms;
            let kept_ms = u64::from(self.view.ledger().retention_hours()) * 3_600_000;
            history::prune(self.node.store().backend(), now_ms.saturating_sub(kept_ms), &mut batch)?;
        }
        if !batch.is_empty() {
            self.node.mut_store().write_unsynced(batch)?;
        }
        if !gone.is_empty() {
            tracing::debug!(replica = self.cfg.id, jobs = gone.len(), "ended jobs moved to the history");
        }
        Ok(())
    }

    /// Job `id` from this replica's history of ended jobs (forgotten by the view), if it has it.
    pub fn history_job(&self, id: JobId) -> Result<Option<Job>, ReplicaError> {
        history::job(self.node.store().backend(), id)
    }

    /// A page of this replica's history of ended jobs.
    pub fn history_page(&self, q: &history::Query) -> Result<history::Page, ReplicaError> {
        history::page(self.node.store().backend(), q)
    }

    /// Answers the linearizable reads whose confirmed index is applied.
    fn answer_reads(&mut self) {
        let applied = self.applied;
        let mut i = 0;
        while i < self.reads.len() {
            if self.reads[i].0 <= applied {
                let (index, t) = self.reads.swap_remove(i);
                self.outcomes.push((t, Answer::ReadReady { index }));
            } else {
                i += 1;
            }
        }
    }

    /// On losing leadership, answer every pending proposal `Dropped` (outcome unknown: an
    /// entry may still commit under the next leader, or never) and forget reservations;
    /// entries that do commit are re-validated at apply like any other.
    fn on_role_change(&mut self) {
        let leader = self.is_leader();
        if self.was_leader && !leader {
            self.clock.step_down();
            let mut tickets: Vec<Ticket> = self.batch.drain(..).map(|(t, _)| t).collect();
            tickets.extend(self.proposed.drain(..).flat_map(|(_, _, t)| t));
            for t in tickets {
                self.outcomes.push((t, Answer::Dropped));
            }
            self.reserved.clear();
            self.in_flight.clear();
            self.in_flight_jobs.clear();
            self.in_flight_ids.clear();
        }
        self.was_leader = leader;
    }

    /// The tickets in a context written by this replica in this life (empty otherwise): one
    /// check for entries (`ours`: still tracked at this index and term) and read states.
    fn own_tickets(&self, ctx: &[u8], ours: bool) -> Vec<Ticket> {
        match codec::decode_context(ctx) {
            Some((origin, boot, tickets)) if ours && origin == self.cfg.id && boot == self.node.store().boot() => {
                tickets
            }
            _ => Vec::new(),
        }
    }

    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), ReplicaError> {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            crate::fail_point!("replica::apply", |_| Err(ReplicaError::Storage { why: "fail point apply".into() }));
            self.applied = e.index;
            let ours = self.settle(e.index, Some(e.term));
            match e.get_entry_type() {
                EntryType::EntryNormal => {
                    if e.data.is_empty() {
                        // raft-rs turns a membership change it refuses (another one pending)
                        // into an empty entry with our context.
                        for t in self.own_tickets(&e.context, ours) {
                            let why = "another membership change is in progress; retry".to_string();
                            self.outcomes.push((t, Answer::Refused(why)));
                        }
                        continue;
                    }
                    let cmds = match codec::decode_commands(&e.data) {
                        Ok(c) => c,
                        Err(err) => {
                            // Every replica decodes the same bytes the same way: skipping keeps
                            // replicas identical.
                            tracing::error!(replica = self.cfg.id, index = e.index, error = %err, "undecodable entry skipped");
                            continue;
                        }
                    };
                    let mut tickets = self.own_tickets(&e.context, ours).into_iter();
                    for (i, cmd) in cmds.iter().enumerate() {
                        let outcome = self.view.apply(cmd);
                        if i == 0 && matches!(cmd, Command::Clock { .. }) {
                            // The entry's stamp, written by the leader itself: no ticket. Seen
                            // under a known leader, it tells this replica the view's time
                            // (entries replayed at start, before any leader, do not).
                            if self.node.raft.leader_id != 0 {
                                self.clock.observe(self.view.now_ms(), Instant::now());
                            }
                            continue;
                        }
                        match (cmd, outcome) {
                            // A batch of single gangs: one ticket per decision.
                            (Command::Propose(ps), Outcome::Decided(ds)) if ps.len() == ds.len() && ps.len() > 1 => {
                                for d in ds {
                                    if let Some(t) = tickets.next() {
                                        self.release_in_flight(t);
                                        self.outcomes.push((t, Answer::Applied(Outcome::Decided(vec![d]))));
                                    }
                                }
                            }
                            (_, outcome) => {
                                if let Some(t) = tickets.next() {
                                    self.release_in_flight(t);
                                    self.outcomes.push((t, Answer::Applied(outcome)));
                                }
                            }
                        }
                    }
                }
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&e.data)
                        .map_err(|err| ReplicaError::Decode { what: "conf change", why: err.to_string() })?;
                    match cc.get_change_type() {
                        ConfChangeType::RemoveNode => {
                            self.addrs.remove(&cc.node_id);
                        }
                        _ => {
                            if let Ok(addr) = std::str::from_utf8(&cc.context)
                                && !addr.is_empty()
                            {
                                self.addrs.insert(cc.node_id, addr.to_string());
                            }
                        }
                    }
                    let cs = match self.node.apply_conf_change(&cc) {
                        Ok(cs) => cs,
                        Err(err) => {
                            // Deterministic on every replica (e.g. removing the last voter).
                            tracing::warn!(replica = self.cfg.id, error = %err, "membership change refused");
                            self.node.store().conf_state().clone()
                        }
                    };
                    self.snapshot_now = true;
                    let mut voters = cs.voters.clone();
                    voters.sort_unstable();
                    self.node.mut_store().set_conf_state(cs)?;
                    tracing::info!(replica = self.cfg.id, ?voters, "membership changed");
                    if let Some(&t) = self.own_tickets(&e.context, ours).first() {
                        self.outcomes.push((t, Answer::Membership { voters }));
                    }
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&e.data)
                        .map_err(|err| ReplicaError::Decode { what: "conf change", why: err.to_string() })?;
                    let cs = self.node.apply_conf_change(&cc)?;
                    self.node.mut_store().set_conf_state(cs)?;
                    self.snapshot_now = true;
                }
            }
        }
        Ok(())
    }

    fn maybe_compact(&mut self) -> Result<(), ReplicaError> {
        let (meta, _) = self.node.store().latest_snapshot();
        let due = self.applied >= meta.index + self.cfg.snapshot_every;
        if !(due || self.snapshot_now && self.applied > meta.index) {
            return Ok(());
        }
        crate::fail_point!("replica::compact_snapshot", |_| Err(ReplicaError::Storage {
            why: "fail point compact_snapshot".into()
        }));
        self.snapshot_now = false;
        let data = codec::encode_snapshot(&SnapshotData {
            applied: self.applied,
            view: self.view.snapshot(),
            addrs: self.addrs.clone(),
        })?;
        let (applied, keep) = (self.applied, self.cfg.keep_entries);
        self.node.mut_store().compact(applied, data, keep)?;
        tracing::info!(replica = self.cfg.id, index = applied, "snapshot taken, log compacted");
        Ok(())
    }
}
