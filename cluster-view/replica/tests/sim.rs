//! Deterministic multi-replica fault tests.
//!
//! Three replicas, each on its own disk, exchange raft messages through a simulated network
//! driven by a seed: messages are delayed (and so reordered), dropped and cut by partitions;
//! replicas crash and restart from their disks. Clients submit jobs (some of a higher priority),
//! propose gangs planned by the real placement search (often on a stale follower view), preempt
//! lower-priority gangs with victims the real victim choice picks, and release jobs. After every
//! step the checks below run; after the faults stop the cluster must make progress again.
//!
//! Two kinds of disk. On the simulated disk (`MemBackend`, fast, 1,000 seeds) every write is
//! synced as in production, a crash is either a process crash (the OS keeps every write) or a
//! power loss (writes not yet synced — the commit index — keep only a random prefix), and the
//! disk itself fails: a failed write (the replica stops; it is crashed and restarted from what
//! is durable), a torn write (a power loss in the middle of a synced write: the batch and a
//! suffix of the unsynced writes are lost) and a slow fsync (the replica stalls for that much
//! virtual time: no ticks, no messages in or out). On RocksDB (300 seeds) writes are not synced
//! and crashes are process crashes, as before.
//!
//! Checks: no device or core allocated twice on any replica (`invariants::check`); replicas
//! that applied the same index have the same state hash; every placement a client saw
//! acknowledged is present on every live replica once they caught up (unless that client
//! released it, or saw it preempted); progress resumes after faults stop. A coverage check on the totals proves the
//! schedules reached placements, crashes and every disk fault.
//!
//! `SIM_SEEDS=N` runs N seeds in each test; `SIM_SEED=S` replays seed S (add the test name to
//! replay it on one disk kind only). A failure prints its seed.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use tempfile::TempDir;
use tessera_replica::{Answer, Backend, DiskFault, MemBackend, Replica, ReplicaConfig, RocksBackend, Ticket};
use tessera_scheduler::preemption::{Candidate, choose_victims};
use tessera_scheduler::{LocalView, Overlay, find_placement};
use tessera_view::fit::FitMode;
use tessera_view::{
    ClusterSpec, ClusterView, Command, Decision, JobId, JobSpec, Outcome, Preemption, Proposal, ProposalId, Topology,
};

const REPLICAS: u64 = 3;

fn initial() -> ClusterView {
    ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 6, 3, 1))
}

struct InFlight {
    deliver_at: u64,
    from: u64,
    to: u64,
    snapshot: bool,
    bytes: Vec<u8>,
}

/// The replicas' disks, by replica index.
trait Disks: Sized {
    /// The storage backend of a replica.
    type B: Backend;
    /// Whether replicas sync their writes.
    const SYNC: bool;
    fn new() -> Self;
    fn open(&self, i: usize, cfg: ReplicaConfig) -> Replica<Self::B>;
    /// Replica `i` went down; with `power_loss` its disk loses writes not synced (a random
    /// prefix of them is kept). Returns how many writes were lost.
    fn crash(&self, i: usize, power_loss: bool, rng: &mut SmallRng) -> u64;
    /// Arms `fault` on replica `i`'s disk (a no-op on disks without faults).
    fn arm(&self, i: usize, fault: DiskFault);
    fn disarm(&self, i: usize);
    /// The failed or torn write that stopped replica `i`, if its error came from the disk.
    fn struck(&self, i: usize) -> Option<DiskFault>;
    /// Virtual time owed by replica `i`'s slow fsyncs.
    fn take_stall(&self, i: usize) -> u64;
}

/// Simulated disks: synced writes, power losses, disk faults.
struct MemDisks(Vec<MemBackend>);

impl Disks for MemDisks {
    type B = MemBackend;
    const SYNC: bool = true;
    fn new() -> Self {
        MemDisks((0..REPLICAS).map(|_| MemBackend::new()).collect())
    }
    fn open(&self, i: usize, cfg: ReplicaConfig) -> Replica<MemBackend> {
        Replica::with_backend(cfg, self.0[i].clone(), initial).expect("open replica")
    }
    fn crash(&self, i: usize, power_loss: bool, rng: &mut SmallRng) -> u64 {
        let d = &self.0[i];
        let keep = if power_loss { rng.random_range(0..=d.unsynced()) } else { usize::MAX };
        d.crash(keep) as u64
    }
    fn arm(&self, i: usize, fault: DiskFault) {
        self.0[i].arm(fault);
    }
    fn disarm(&self, i: usize) {
        self.0[i].disarm();
    }
    fn struck(&self, i: usize) -> Option<DiskFault> {
        self.0[i].struck()
    }
    fn take_stall(&self, i: usize) -> u64 {
        self.0[i].take_stall()
    }
}

/// RocksDB directories, writes not synced (a crash is a process crash: the OS keeps them).
struct RocksDisks(Vec<TempDir>);

impl Disks for RocksDisks {
    type B = RocksBackend;
    const SYNC: bool = false;
    fn new() -> Self {
        RocksDisks((0..REPLICAS).map(|_| tempfile::tempdir().expect("tmp")).collect())
    }
    fn open(&self, i: usize, cfg: ReplicaConfig) -> Replica<RocksBackend> {
        Replica::open(cfg, self.0[i].path(), initial).expect("open replica")
    }
    fn crash(&self, _: usize, _: bool, _: &mut SmallRng) -> u64 {
        0
    }
    fn arm(&self, _: usize, _: DiskFault) {}
    fn disarm(&self, _: usize) {}
    fn struck(&self, _: usize) -> Option<DiskFault> {
        None
    }
    fn take_stall(&self, _: usize) -> u64 {
        0
    }
}

struct Sim<D: Disks> {
    seed: u64,
    rng: SmallRng,
    disks: D,
    replicas: Vec<Option<Replica<D::B>>>,
    /// A replica in a slow fsync does nothing until this step.
    stalled_until: Vec<u64>,
    net: Vec<InFlight>,
    now: u64,
    /// Replicas cut off from the others (a minority side).
    isolated: Option<u64>,
    drop_p: f64,
    /// Ticket → (replica, what the client asked).
    pending: HashMap<(u64, Ticket), Ask>,
    /// Placements a client saw acknowledged and has not released: job → proposal.
    acknowledged: BTreeMap<JobId, ProposalId>,
    /// Jobs the clients know were submitted.
    jobs: Vec<JobId>,
    next_proposal: u64,
    stats: Stats,
}

#[derive(Default, Debug)]
struct Stats {
    accepted: u64,
    /// Preemptions acknowledged.
    preempted: u64,
    rejected: u64,
    dropped: u64,
    crashes: u64,
    elections_seen: u64,
    /// Crashes that lost power (unsynced writes at risk).
    power_losses: u64,
    /// Unsynced writes lost in power losses. With every write synced, only the commit index
    /// is written without a sync, and the next synced write covers it: few are ever at risk.
    unsynced_lost: u64,
    /// Replicas stopped by a failed write, restarted from their disk.
    failed_writes: u64,
    /// Replicas stopped by a torn write.
    torn_writes: u64,
    /// Slow fsyncs that stalled a replica.
    slow_syncs: u64,
}

impl Stats {
    fn add(&mut self, s: &Stats) {
        self.accepted += s.accepted;
        self.preempted += s.preempted;
        self.rejected += s.rejected;
        self.dropped += s.dropped;
        self.crashes += s.crashes;
        self.elections_seen += s.elections_seen;
        self.power_losses += s.power_losses;
        self.unsynced_lost += s.unsynced_lost;
        self.failed_writes += s.failed_writes;
        self.torn_writes += s.torn_writes;
        self.slow_syncs += s.slow_syncs;
    }
}

enum Ask {
    Submit,
    Gang(Proposal),
    Release(JobId),
    /// A preemption and its victims.
    Preempt(Proposal, Vec<JobId>),
}

impl<D: Disks> Sim<D> {
    fn new(seed: u64) -> Sim<D> {
        let mut sim = Sim {
            seed,
            rng: SmallRng::seed_from_u64(seed),
            disks: D::new(),
            replicas: Vec::new(),
            stalled_until: vec![0; REPLICAS as usize],
            net: Vec::new(),
            now: 0,
            isolated: None,
            drop_p: 0.0,
            pending: HashMap::new(),
            acknowledged: BTreeMap::new(),
            jobs: Vec::new(),
            next_proposal: 1,
            stats: Stats::default(),
        };
        for id in 1..=REPLICAS {
            let r = sim.open(id);
            sim.replicas.push(Some(r));
        }
        sim
    }

    fn open(&self, id: u64) -> Replica<D::B> {
        let mut cfg = ReplicaConfig::new(id, (1..=REPLICAS).collect(), "sim");
        cfg.election_seed = Some(self.seed);
        cfg.sync = D::SYNC;
        cfg.snapshot_every = 40;
        cfg.keep_entries = 10;
        self.disks.open((id - 1) as usize, cfg)
    }

    fn live(&self) -> impl Iterator<Item = &Replica<D::B>> {
        self.replicas.iter().flatten()
    }

    fn leader(&mut self) -> Option<&mut Replica<D::B>> {
        self.replicas.iter_mut().flatten().find(|r| r.is_leader())
    }

    fn stalled(&self, id: u64) -> bool {
        self.stalled_until[(id - 1) as usize] > self.now
    }

    /// Replica `i` goes down: its unsent messages are lost, its clients never hear back, and
    /// with `power_loss` its disk loses what was not synced.
    fn crash(&mut self, i: usize, power_loss: bool) {
        let id = (i + 1) as u64;
        self.replicas[i] = None;
        self.stalled_until[i] = 0;
        // Its outgoing messages die with it; messages to it are lost on delivery.
        self.net.retain(|m| m.from != id);
        // Its clients never hear back: a release it was carrying may still commit.
        let lost: Vec<(u64, Ticket)> = self.pending.keys().filter(|(r, _)| *r == id).copied().collect();
        for k in lost {
            match self.pending.remove(&k) {
                Some(Ask::Release(job)) => {
                    self.acknowledged.remove(&job);
                }
                // It may still commit: its victims' placements are no longer the client's to insist on.
                Some(Ask::Preempt(_, victims)) => victims.iter().for_each(|v| {
                    self.acknowledged.remove(v);
                }),
                _ => {}
            }
        }
        self.stats.unsynced_lost += self.disks.crash(i, power_loss, &mut self.rng);
        self.stats.power_losses += u64::from(power_loss);
        self.stats.crashes += 1;
    }

    fn cut(&self, a: u64, b: u64) -> bool {
        self.isolated.is_some_and(|i| (a == i) != (b == i))
    }

    /// One step of the world: ticks, deliveries, readies, outcomes.
    fn step(&mut self, faults: bool) -> Result<(), String> {
        self.now += 1;
        for (i, r) in self.replicas.iter_mut().enumerate() {
            if let Some(r) = r
                && self.now.is_multiple_of(2)
                && self.stalled_until[i] <= self.now
            {
                r.tick();
            }
        }
        // Deliver due messages (in random order among the due ones: reordering).
        let mut due: Vec<InFlight> = Vec::new();
        let mut i = 0;
        while i < self.net.len() {
            // A replica in a slow fsync reads nothing: its messages wait.
            if self.net[i].deliver_at <= self.now && !self.stalled(self.net[i].to) {
                due.push(self.net.swap_remove(i));
            } else {
                i += 1;
            }
        }
        for k in (1..due.len()).rev() {
            due.swap(k, self.rng.random_range(0..=k));
        }
        for m in due {
            let lost = self.cut(m.from, m.to)
                || (faults && self.rng.random_bool(self.drop_p))
                || self.replicas[(m.to - 1) as usize].is_none();
            if !lost && let Some(r) = self.replicas[(m.to - 1) as usize].as_mut() {
                r.step_bytes(&m.bytes).map_err(|e| format!("step: {e}"))?;
            }
            // The transport tells the sender how a snapshot went, as a real one would.
            if m.snapshot
                && let Some(s) = self.replicas[(m.from - 1) as usize].as_mut()
            {
                s.report_snapshot(m.to, !lost);
            }
        }
        // Readies.
        for idx in 0..self.replicas.len() {
            if self.stalled_until[idx] > self.now {
                continue;
            }
            let Some(r) = self.replicas[idx].as_mut() else { continue };
            let from = r.id();
            let msgs = match r.on_ready() {
                Ok(msgs) => msgs,
                Err(e) => match self.disks.struck(idx) {
                    // The disk failed under it: the replica stops, and restarts from its disk.
                    Some(fault) => {
                        if fault == DiskFault::Tear {
                            self.stats.torn_writes += 1;
                        } else {
                            self.stats.failed_writes += 1;
                        }
                        self.crash(idx, fault == DiskFault::Tear);
                        continue;
                    }
                    None => return Err(format!("replica {from} ready: {e}")),
                },
            };
            let outcomes = r.take_outcomes();
            // A slow fsync holds the replica, and what it sends after the write, that long.
            let stall = self.disks.take_stall(idx);
            if stall > 0 {
                self.stats.slow_syncs += 1;
                self.stalled_until[idx] = self.now + stall;
            }
            for m in msgs {
                let delay = stall + if faults { self.rng.random_range(1..6) } else { 1 };
                let bytes = protobuf::Message::write_to_bytes(&m).map_err(|e| e.to_string())?;
                let snapshot = m.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot;
                self.net.push(InFlight { deliver_at: self.now + delay, from, to: m.to, snapshot, bytes });
            }
            for (t, a) in outcomes {
                self.answer(from, t, a)?;
            }
        }
        self.check()
    }

    fn answer(&mut self, replica: u64, t: Ticket, a: Answer) -> Result<(), String> {
        if std::env::var_os("SIM_DEBUG").is_some() {
            eprintln!("t={} replica {replica} ticket {t}: {a:?}", self.now);
        }
        let Some(ask) = self.pending.remove(&(replica, t)) else {
            return Err(format!("replica {replica} answered unknown ticket {t}"));
        };
        match (ask, a) {
            (Ask::Submit, Answer::Applied(Outcome::Submitted(Ok(job)))) => self.jobs.push(job),
            (Ask::Gang(p), Answer::Applied(Outcome::Decided(ds))) => match ds.as_slice() {
                [Decision::Accepted { job, proposal, .. }] => {
                    self.stats.accepted += 1;
                    if let Some(old) = self.acknowledged.insert(*job, *proposal) {
                        return Err(format!("{job} acknowledged twice: {old} and {proposal}"));
                    }
                }
                [Decision::AlreadyApplied { job, proposal, .. }] => {
                    self.acknowledged.insert(*job, *proposal);
                }
                [Decision::Rejected { .. }] => self.stats.rejected += 1,
                other => return Err(format!("proposal {} decided as {other:?}", p.id)),
            },
            (Ask::Gang(_), Answer::Immediate(d)) => {
                if let Decision::AlreadyApplied { job, proposal, .. } = d {
                    self.acknowledged.insert(job, proposal);
                } else {
                    self.stats.rejected += 1;
                }
            }
            (Ask::Release(job), Answer::Applied(Outcome::Ended(Ok(())))) => {
                self.acknowledged.remove(&job);
            }
            (Ask::Preempt(p, victims), Answer::Applied(Outcome::Decided(ds))) => match ds.as_slice() {
                [Decision::Accepted { job, proposal, .. } | Decision::AlreadyApplied { job, proposal, .. }] => {
                    self.stats.preempted += 1;
                    for v in &victims {
                        self.acknowledged.remove(v);
                    }
                    self.acknowledged.insert(*job, *proposal);
                }
                [Decision::Rejected { .. }] => self.stats.rejected += 1,
                other => return Err(format!("preemption {} decided as {other:?}", p.id)),
            },
            (Ask::Preempt(..), Answer::Immediate(_)) => self.stats.rejected += 1,
            (Ask::Preempt(_, victims), Answer::Dropped) => {
                for v in &victims {
                    self.acknowledged.remove(v);
                }
                self.stats.dropped += 1;
            }
            (Ask::Release(job), Answer::Dropped) => {
                // The release may or may not have committed: the placement is no longer one
                // the client can insist on.
                self.acknowledged.remove(&job);
                self.stats.dropped += 1;
            }
            (_, Answer::Dropped) => self.stats.dropped += 1,
            (_, _) => {}
        }
        Ok(())
    }

    /// Client activity: a few requests to the leader, planned on a random replica's view.
    fn clients(&mut self) {
        let roll: f64 = self.rng.random();
        let planner = self.rng.random_range(0..REPLICAS as usize);
        if roll < 0.3 {
            let mut spec = JobSpec::simple("sim", 1, [1, 2, 4, 8][self.rng.random_range(0..4)]);
            if self.rng.random_bool(0.2) {
                spec = JobSpec::simple("gang", 2, 8);
            }
            if self.rng.random_bool(0.2) {
                spec.priority = 5;
            }
            if let Some(l) = self.leader() {
                let id = l.id();
                if let Ok(t) = l.propose(Command::submit(spec)) {
                    self.pending.insert((id, t), Ask::Submit);
                }
            }
        } else if roll < 0.8 {
            // Plan a gang for a pending job on some replica's (possibly stale) view.
            let Some(view) = self.replicas[planner].as_ref().map(|r| r.view().clone()) else { return };
            let pending: Vec<JobId> = self
                .jobs
                .iter()
                .copied()
                .filter(|j| view.job(*j).is_some_and(|x| x.state == tessera_view::JobState::Pending))
                .collect();
            if pending.is_empty() {
                return;
            }
            let job = pending[self.rng.random_range(0..pending.len())];
            let spec = view.job(job).map(|j| j.spec.clone()).expect("job");
            let local = LocalView::of_view(&view);
            let salt = self.rng.random();
            if spec.priority > 0 && self.rng.random_bool(0.5) {
                self.preempt(&view, &local, job, &spec, salt);
                return;
            }
            let Ok(found) = find_placement(&local, &Overlay::default(), &spec, spec.tolerate, FitMode::Pack, salt)
            else {
                return;
            };
            let p =
                Proposal { id: ProposalId(self.next_proposal), job, members: found.members, based_on: view.version() };
            self.next_proposal += 1;
            // Sometimes send it twice (a client retry): at most one placement may result.
            let copies = if self.rng.random_bool(0.2) { 2 } else { 1 };
            for _ in 0..copies {
                if let Some(l) = self.leader() {
                    let id = l.id();
                    if let Ok(t) = l.propose_gang(p.clone()) {
                        self.pending.insert((id, t), Ask::Gang(p.clone()));
                    }
                }
            }
        } else if let Some((&job, _)) =
            self.acknowledged.iter().nth(self.rng.random_range(0..self.acknowledged.len().max(1)))
            && let Some(l) = self.leader()
        {
            let id = l.id();
            if let Ok(t) = l.propose(Command::Release { job, failed: false }) {
                self.pending.insert((id, t), Ask::Release(job));
            }
        }
    }

    /// Preempts lower-priority gangs for `job`, victims chosen on the planner's (possibly stale)
    /// view by the real victim choice.
    fn preempt(&mut self, view: &ClusterView, local: &LocalView, job: JobId, spec: &JobSpec, salt: u64) {
        let me = view.job(job).expect("job");
        let candidates: Vec<Candidate> =
            view.jobs().into_iter().filter(|v| me.outranks(v)).filter_map(Candidate::of).collect();
        let Some(choice) = choose_victims(local, spec, spec.tolerate, FitMode::Pack, salt, &candidates) else { return };
        let p = Proposal { id: ProposalId(self.next_proposal), job, members: choice.members, based_on: view.version() };
        self.next_proposal += 1;
        let pre = Preemption { proposal: p.clone(), victims: choice.victims.clone(), reason: "sim".into() };
        if let Some(l) = self.leader() {
            let id = l.id();
            if let Ok(t) = l.propose(Command::Preempt(pre)) {
                self.pending.insert((id, t), Ask::Preempt(p, choice.victims));
            }
        }
    }

    fn faults(&mut self) {
        let roll: f64 = self.rng.random();
        if roll < 0.01 {
            // Crash a replica (a process crash or a power loss), or restart a crashed one.
            let i = self.rng.random_range(0..REPLICAS as usize);
            if self.replicas[i].is_some() && self.replicas.iter().flatten().count() == REPLICAS as usize {
                // RocksDB directories outlive the process: a crash there is a process crash.
                let power_loss = D::SYNC && self.rng.random_bool(0.5);
                self.crash(i, power_loss);
            }
        } else if roll < 0.03 {
            for i in 0..REPLICAS as usize {
                if self.replicas[i].is_none() {
                    self.replicas[i] = Some(self.open((i + 1) as u64));
                }
            }
        } else if roll < 0.04 {
            self.isolated = if self.isolated.is_some() { None } else { Some(self.rng.random_range(1..=REPLICAS)) };
        } else if roll < 0.05 {
            self.drop_p = [0.0, 0.05, 0.2][self.rng.random_range(0..3)];
        } else if roll < 0.06 {
            // Arm a disk fault for a live replica's next synced write.
            let i = self.rng.random_range(0..REPLICAS as usize);
            let fault = match self.rng.random_range(0..3) {
                0 => DiskFault::Fail,
                1 => DiskFault::Tear,
                _ => DiskFault::Slow(self.rng.random_range(1..30)),
            };
            if self.replicas[i].is_some() {
                self.disks.arm(i, fault);
            }
        }
    }

    fn check(&self) -> Result<(), String> {
        let mut by_index: HashMap<u64, (u64, u64)> = HashMap::new();
        for r in self.live() {
            let rep = tessera_view::invariants::check(r.view());
            if !rep.is_clean() {
                return Err(format!("replica {} at {}: {:?}", r.id(), r.applied_index(), rep.violations));
            }
            let h = r.view().state_hash();
            if let Some(&(other, oh)) = by_index.get(&r.applied_index())
                && oh != h
            {
                return Err(format!(
                    "replicas {other} and {} applied index {} with different state",
                    r.id(),
                    r.applied_index()
                ));
            }
            by_index.insert(r.applied_index(), (r.id(), h));
        }
        Ok(())
    }

    fn heal(&mut self) {
        self.isolated = None;
        self.drop_p = 0.0;
        for i in 0..REPLICAS as usize {
            self.disks.disarm(i);
            if self.replicas[i].is_none() {
                self.replicas[i] = Some(self.open((i + 1) as u64));
            }
        }
    }
}

fn run<D: Disks>(seed: u64) -> Result<Stats, String> {
    let mut sim = Sim::<D>::new(seed);
    // Let a leader emerge.
    for _ in 0..200 {
        sim.step(false)?;
        if sim.leader().is_some() {
            break;
        }
    }
    for _ in 0..1_500 {
        sim.faults();
        sim.clients();
        sim.step(true)?;
    }
    // Faults stop: progress must resume and replicas converge.
    sim.heal();
    let mut converged = false;
    for _ in 0..2_000 {
        sim.step(false)?;
        let idx: Vec<u64> = sim.live().map(|r| r.applied_index()).collect();
        if sim.leader().is_some()
            && sim.pending.is_empty()
            && idx.windows(2).all(|w| w[0] == w[1])
            && sim.net.is_empty()
        {
            converged = true;
            break;
        }
    }
    if !converged {
        let idx: Vec<u64> = sim.live().map(|r| r.applied_index()).collect();
        let who: Vec<(u64, Ticket)> = sim.pending.keys().copied().collect();
        let unsettled: Vec<String> = sim
            .live()
            .map(|r| {
                format!(
                    "replica {} leader={} term {} unsettled {:?} batch+proposed {}",
                    r.id(),
                    r.is_leader(),
                    r.term(),
                    r.unsettled(),
                    r.proposed_unsettled()
                )
            })
            .collect();
        return Err(format!("no convergence after faults stopped: applied {idx:?}, pending {who:?}, {unsettled:?}"));
    }
    // A new write commits.
    let before = sim.leader().map(|l| l.applied_index()).unwrap_or(0);
    let (id, t) = {
        let l = sim.leader().ok_or("no leader")?;
        (l.id(), l.propose(Command::submit(JobSpec::simple("after", 1, 1))).map_err(|e| e.to_string())?)
    };
    sim.pending.insert((id, t), Ask::Submit);
    for _ in 0..200 {
        sim.step(false)?;
        if !sim.pending.contains_key(&(id, t)) {
            break;
        }
    }
    if sim.pending.contains_key(&(id, t)) || sim.leader().map(|l| l.applied_index()).unwrap_or(0) <= before {
        return Err("no progress after faults stopped".into());
    }
    for _ in 0..50 {
        sim.step(false)?;
    }
    // Every acknowledged placement is on every replica.
    for r in sim.live() {
        for (job, proposal) in &sim.acknowledged {
            let j = r.view().job(*job).ok_or(format!("replica {} lost acknowledged {job}", r.id()))?;
            if std::env::var_os("SIM_DEBUG").is_some() {
                eprintln!(
                    "replica {} {job}: {:?} {:?} {:?}",
                    r.id(),
                    j.state,
                    j.placement.as_ref().map(|p| p.proposal),
                    j.proposals
                );
            }
            let held = j.placement.as_ref().map(|p| p.proposal);
            if held != Some(*proposal) {
                return Err(format!("replica {}: acknowledged {job} via {proposal} but holds {held:?}", r.id()));
            }
        }
    }
    let hashes: Vec<u64> = sim.live().map(|r| r.view().state_hash()).collect();
    if hashes.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!("replicas differ after convergence: {hashes:?}"));
    }
    sim.stats.elections_seen = sim.live().map(|r| r.term()).max().unwrap_or(0);
    Ok(sim.stats)
}

/// The seeds to run: `SIM_SEED=S` alone, else `SIM_SEEDS` (default `default`) from 0.
fn seeds(default: u64) -> Vec<u64> {
    match std::env::var("SIM_SEED") {
        Ok(s) => vec![s.parse().expect("SIM_SEED is a number")],
        Err(_) => (0..std::env::var("SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)).collect(),
    }
}

/// Runs `seeds` on disks `D`, spread over the machine's cores (each seed replays alone, the
/// same on any number of threads), and returns the totals. A failing seed panics with it.
fn run_all<D: Disks>(seeds: Vec<u64>, test: &str) -> Stats {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(seeds.len().max(1));
    let results: Vec<Result<Stats, (u64, String)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<u64> = seeds.iter().copied().skip(t).step_by(threads).collect();
                s.spawn(move || {
                    let mut total = Stats::default();
                    for seed in mine {
                        total.add(&run::<D>(seed).map_err(|e| (seed, e))?);
                    }
                    Ok(total)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("a sim thread panicked")).collect()
    });
    let mut total = Stats::default();
    for r in results {
        match r {
            Ok(s) => total.add(&s),
            Err((seed, e)) => panic!(
                "seed {seed} failed: {e}\nreplay with SIM_SEED={seed} cargo test -p tessera-replica --test sim {test}"
            ),
        }
    }
    total
}

#[test]
fn seeded_fault_schedules_keep_every_invariant_on_simulated_disks() {
    let seeds = seeds(1_000);
    let n = seeds.len();
    let t = std::time::Instant::now();
    let total = run_all::<MemDisks>(seeds, "on_simulated_disks");
    eprintln!("sim (simulated disks, {n} seeds, {:.1} s): {total:?}", t.elapsed().as_secs_f64());
    if n >= 100 {
        // Coverage: the generator reaches every fault it claims to test.
        assert!(
            total.accepted > 0
                && total.preempted > 0
                && total.crashes > 0
                && total.power_losses > 0
                && total.failed_writes > 0
                && total.torn_writes > 0
                && total.slow_syncs > 0,
            "the schedules must exercise placements, preemptions, crashes, power losses, failed and torn \
             writes and slow fsyncs: {total:?}"
        );
    }
}

#[test]
fn seeded_fault_schedules_keep_every_invariant_on_rocksdb() {
    let seeds = seeds(300);
    let n = seeds.len();
    let t = std::time::Instant::now();
    let total = run_all::<RocksDisks>(seeds, "on_rocksdb");
    eprintln!("sim (RocksDB, {n} seeds, {:.1} s): {total:?}", t.elapsed().as_secs_f64());
    if n >= 100 {
        assert!(
            total.accepted > 0 && total.crashes > 0,
            "the schedules must exercise placements and crashes: {total:?}"
        );
    }
}

#[test]
fn a_data_dir_from_another_cluster_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = ReplicaConfig::new(1, vec![1, 2, 3], "alpha");
    drop(Replica::open(cfg, dir.path(), initial).expect("first open"));
    let e = Replica::open(ReplicaConfig::new(1, vec![1, 2, 3], "beta"), dir.path(), initial).expect_err("refused");
    let msg = e.to_string();
    assert!(msg.contains("alpha") && msg.contains("beta"), "{msg}");
    let e = Replica::open(ReplicaConfig::new(2, vec![1, 2, 3], "alpha"), dir.path(), initial).expect_err("refused");
    assert!(e.to_string().contains("replica 1"), "{e}");
}
