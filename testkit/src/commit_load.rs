//! The workload of `tessera bench commit`: concurrent schedulers proposing gangs through the
//! replicated view as fast as it approves them, and the check of what they were told.
//!
//! Each client owns a slice of the servers (server s belongs to client s mod clients) and keeps
//! its own record of what it placed there, so proposals are sound and conflicts mean a bug or a
//! retry; it submits jobs in batches, proposes gangs (`batch` per request) and releases the
//! oldest job when its slice is `fill` full. Latency is per Propose request, client-side.
//!
//! At the end every replica must reach the same applied index; then each replica's view is
//! rebuilt from its snapshot and checked: the independent invariant checker (devices or cores
//! held twice), the clients' acknowledged placements (each one still held, or its job ended,
//! on every replica), equal state hashes.

use crate::{KitError, ProcessCluster};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tessera_proto::backoff::{Backoff, seeded_rng};
use tessera_proto::v1;
use tessera_view::fit::{FitMode, member_request, plan_member};
use tessera_view::{
    ClusterView, CoreMask, JobId, JobSpec, LocalityLevel, MemberPlacement, Proposal, ProposalId, ServerId,
    ServerRecord, Topology, ViewSnapshot, ViewVersion, invariants,
};
use tessera_view_server::{ClientError, ViewClient};
use tokio::sync::Mutex;

fn call(what: &str) -> impl FnOnce(ClientError) -> KitError + '_ {
    move |source| KitError::Call { what: what.to_string(), source }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct CommitLoad {
    /// Concurrent clients (schedulers).
    pub clients: u32,
    /// How long the load lasts.
    pub duration: Duration,
    /// Gang proposals per Propose request (1..=1024).
    pub batch: usize,
    /// Target proposals per second over all clients (0: as fast as possible).
    pub rate: u64,
    /// Fraction of its slice's GPUs a client fills before releasing its oldest job.
    pub fill: f64,
    /// Jobs each client submits before the clock starts.
    pub preload: usize,
    /// Kill -9 the leader once after this long, restart it 2 s later (needs a process cluster).
    pub kill_leader_after: Option<Duration>,
}

/// What the load measured and what the check found.
#[derive(Clone, Debug, Serialize)]
pub struct CommitReport {
    /// Replicas checked.
    pub replicas: usize,
    /// Clients.
    pub clients: u32,
    /// Proposals per request.
    pub batch: usize,
    /// Servers in the cluster.
    pub servers: usize,
    /// Seconds of load.
    pub duration_s: f64,
    /// Gangs committed.
    pub committed: u64,
    /// Gangs committed per second.
    pub committed_per_s: f64,
    /// The offered rate (0: as fast as possible).
    pub offered_rate: u64,
    /// Propose requests.
    pub requests: u64,
    /// Request latency percentiles, milliseconds.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// See `p50_ms`.
    pub max_ms: f64,
    /// Proposals refused for a conflict.
    pub conflicts: u64,
    /// Proposals refused for another reason.
    pub rejected: u64,
    /// Refusals by reason code.
    pub rejections_by_code: BTreeMap<String, u64>,
    /// Proposals whose outcome was unknown (retried under the same id).
    pub unknown_outcomes: u64,
    /// Jobs submitted before the clock started.
    pub jobs_preloaded: u64,
    /// Jobs submitted during the run.
    pub jobs_submitted: u64,
    /// Jobs released.
    pub jobs_released: u64,
    /// Acknowledged placements still live at the end.
    pub acknowledged_live: usize,
    /// Acknowledged placements missing from a replica.
    pub lost_acknowledged: u64,
    /// Devices or cores held twice, by the clients' record or a replica's view.
    pub double_allocations: u64,
    /// Violations found by the invariant checker.
    pub invariant_violations: u64,
    /// Every replica ended with the same state hash.
    pub state_hashes_equal: bool,
    /// Replicas checked.
    pub replicas_checked: usize,
    /// Milliseconds from the end of the load until every replica had applied the same index.
    pub converged_ms: f64,
    /// The replica killed, if one was.
    pub killed_replica: Option<u64>,
    /// Milliseconds from the kill to the first approval by another replica.
    pub failover_ms: Option<f64>,
}

impl CommitReport {
    /// Nothing lost, nothing held twice, no invariant broken, replicas equal.
    pub fn is_clean(&self) -> bool {
        self.lost_acknowledged == 0
            && self.double_allocations == 0
            && self.invariant_violations == 0
            && self.state_hashes_equal
    }
}

/// Servers a client probes per planning attempt.
const PROBE: usize = 32;

/// A job shape of the workload: (members, GPUs per member, weight).
const SHAPES: &[(u32, u32, u32)] = &[(1, 1, 40), (1, 2, 25), (1, 4, 20), (1, 8, 5), (2, 4, 10)];

#[derive(Default)]
struct ClientStats {
    committed: u64,
    conflicts: u64,
    rejected: u64,
    unknown: u64,
    submitted: u64,
    released: u64,
    requests: u64,
    latencies_us: Vec<u64>,
    /// First commit answered by a replica other than the killed one, after the kill.
    first_after_kill: Option<Instant>,
    reasons: BTreeMap<String, u64>,
}

/// What the clients acknowledged: job → (proposal, members); released jobs are removed.
type AckLog = BTreeMap<u64, (u64, Vec<MemberPlacement>)>;

struct Shared {
    stop: AtomicBool,
    killed: Mutex<Option<(Instant, String)>>,
    rate_per_client: f64,
    clients: u32,
}

struct Client {
    c: ViewClient,
    id: u32,
    shapes: Vec<(u32, u32)>,
    next_shape: usize,
    servers: Vec<ServerId>,
    records: HashMap<ServerId, ServerRecord>,
    topo: Topology,
    capacity: u64,
    used: u64,
    pending: VecDeque<(u64, JobSpec)>,
    running: VecDeque<(u64, Vec<MemberPlacement>)>,
    retry: Vec<(Proposal, JobSpec)>,
    next_proposal: u64,
    cursor: usize,
    /// Servers probed without a fit since the last one.
    misses: usize,
    stats: ClientStats,
    acks: AckLog,
    version: ViewVersion,
}

impl Client {
    fn plan(&mut self, job: u64, spec: &JobSpec) -> Option<Proposal> {
        let req = member_request(spec, &self.topo);
        let mut members: Vec<MemberPlacement> = Vec::new();
        let n = self.servers.len();
        // Next fit from the cursor over a bounded window, so planning stays cheap on big slices;
        // a miss moves the window on.
        let window = n.min(PROBE);
        for k in 0..window {
            if members.len() == spec.members as usize {
                break;
            }
            let s = self.servers[(self.cursor + k) % n];
            if members.iter().any(|m| m.server == s) {
                continue;
            }
            let rec = self.records.get(&s)?;
            if let Some((m, _)) = plan_member(&self.topo, rec, s, &req, LocalityLevel::Server, FitMode::Pack) {
                members.push(m);
            }
        }
        if members.len() != spec.members as usize {
            self.cursor = (self.cursor + window) % n.max(1);
            self.misses += window;
            return None;
        }
        self.misses = 0;
        while self.records.get(&self.servers[self.cursor]).is_some_and(|r| r.free_gpus == 0) {
            self.cursor = (self.cursor + 1) % n;
            self.misses += 1;
            if self.misses > n {
                break;
            }
        }
        self.next_proposal += 1;
        Some(Proposal {
            id: ProposalId(((self.id as u64 + 1) << 40) | self.next_proposal),
            job: JobId(job),
            members,
            based_on: self.version,
        })
    }

    fn debit(&mut self, members: &[MemberPlacement]) {
        for m in members {
            if let Some(r) = self.records.get_mut(&m.server) {
                r.free_gpus &= !m.gpus;
                r.free_cores = r.free_cores.without(m.cores);
                r.free_memory_mib -= m.memory_mib;
            }
            self.used += m.gpus.count_ones() as u64;
        }
    }

    fn credit(&mut self, members: &[MemberPlacement]) {
        for m in members {
            if let Some(r) = self.records.get_mut(&m.server) {
                r.free_gpus |= m.gpus;
                r.free_cores = r.free_cores.or(m.cores);
                r.free_memory_mib += m.memory_mib;
            }
            self.used -= m.gpus.count_ones() as u64;
        }
    }

    fn shape(&mut self) -> JobSpec {
        let (m, g) = self.shapes[self.next_shape % self.shapes.len()];
        self.next_shape += 1;
        let mut s = JobSpec::simple("bench", m, g);
        s.tolerate = LocalityLevel::Any;
        s
    }

    async fn release_oldest(&mut self) -> Result<(), KitError> {
        let Some((job, members)) = self.running.pop_front() else { return Ok(()) };
        release(&mut self.c, job).await?;
        self.released(job, &members);
        Ok(())
    }

    /// Books a committed release: the slice gets the resources back, the job leaves the
    /// acknowledged set.
    fn released(&mut self, job: u64, members: &[MemberPlacement]) {
        self.credit(members);
        self.acks.remove(&job);
        self.stats.released += 1;
    }

    /// Submits `n` jobs (256 per request) into the pending queue.
    async fn submit(&mut self, n: usize) -> Result<(), KitError> {
        let mut left = n;
        while left > 0 {
            let k = left.min(256);
            left -= k;
            let specs: Vec<JobSpec> = (0..k).map(|_| self.shape()).collect();
            let wire: Vec<v1::JobSpec> = specs.iter().map(v1::JobSpec::from).collect();
            let results = self.c.submit(wire).await.map_err(call("submitting jobs"))?;
            for (r, s) in results.into_iter().zip(specs) {
                if r.error.is_empty() {
                    self.pending.push_back((r.job, s));
                    self.stats.submitted += 1;
                }
            }
        }
        Ok(())
    }

    async fn run(mut self, shared: Arc<Shared>, fill: f64, batch: usize) -> Result<Client, KitError> {
        let start = Instant::now();
        let mut sent: u64 = 0;
        while !shared.stop.load(Ordering::Relaxed) {
            if self.pending.len() < batch {
                self.submit(256).await?;
                continue;
            }
            // Release the oldest jobs while the slice is too full; the releases travel
            // together with the next proposals (concurrent requests on one connection).
            let mut releases: Vec<(u64, Vec<MemberPlacement>)> = Vec::new();
            let mut freeing = 0u64;
            while (self.used - freeing) as f64 > fill * self.capacity as f64 {
                let Some(r) = self.running.pop_front() else { break };
                freeing += r.1.iter().map(|m| m.gpus.count_ones() as u64).sum::<u64>();
                releases.push(r);
            }
            let mut props: Vec<(Proposal, JobSpec)> = std::mem::take(&mut self.retry);
            while props.len() < batch {
                let Some((job, spec)) = self.pending.pop_front() else { break };
                match self.plan(job, &spec) {
                    Some(p) => {
                        self.debit(&p.members);
                        props.push((p, spec));
                    }
                    None => {
                        self.pending.push_front((job, spec));
                        if self.misses < self.servers.len() {
                            // Not every server was probed since the last fit: look further.
                            continue;
                        }
                        self.misses = 0;
                        if releases.is_empty() && !self.running.is_empty() {
                            self.release_oldest().await?;
                            continue;
                        }
                        break;
                    }
                }
            }
            let release_all = {
                let c = self.c.clone();
                let jobs: Vec<u64> = releases.iter().map(|(j, _)| *j).collect();
                async move {
                    let mut set = tokio::task::JoinSet::new();
                    for job in jobs {
                        let mut c = c.clone();
                        set.spawn(async move { release(&mut c, job).await.map(|()| job) });
                    }
                    let mut out = Vec::new();
                    while let Some(r) = set.join_next().await {
                        out.push(r.map_err(|e| KitError::ClientTask(e.to_string())).and_then(|r| r));
                    }
                    out
                }
            };
            if props.is_empty() {
                for r in release_all.await {
                    r?;
                }
                for (job, members) in releases {
                    self.released(job, &members);
                }
                continue;
            }
            if shared.rate_per_client > 0.0 {
                // Clients are spread over one request interval (not all at once).
                let phase = self.id as f64 / shared.clients as f64 * batch as f64;
                let due = start + Duration::from_secs_f64((sent as f64 + phase) / shared.rate_per_client);
                tokio::time::sleep_until(due.into()).await;
            }
            sent += props.len() as u64;
            let wire: Vec<v1::Proposal> = props.iter().map(|(p, _)| v1::Proposal::from(p)).collect();
            let t0 = Instant::now();
            let propose = async {
                let r = self.c.propose(wire).await;
                (r, Instant::now())
            };
            let ((results, done), released) = tokio::join!(propose, release_all);
            let results = results.map_err(call("proposing"))?;
            for r in released {
                r?;
            }
            for (job, members) in releases {
                self.released(job, &members);
            }
            self.stats.requests += 1;
            self.stats.latencies_us.push(done.duration_since(t0).as_micros() as u64);
            let mut committed_now = false;
            for ((p, spec), r) in props.into_iter().zip(results) {
                let decision = match r.decision.map(tessera_proto::RemoteDecision::try_from) {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => return Err(KitError::Decode(format!("undecodable decision: {e}"))),
                    None => {
                        // Outcome unknown: retry the same id (idempotent).
                        self.stats.unknown += 1;
                        self.retry.push((p, spec));
                        continue;
                    }
                };
                self.version = decision.version();
                match decision {
                    tessera_view::Decision::Accepted { .. } | tessera_view::Decision::AlreadyApplied { .. } => {
                        self.stats.committed += 1;
                        committed_now = true;
                        self.acks.insert(p.job.0, (p.id.0, p.members.clone()));
                        self.running.push_back((p.job.0, p.members));
                    }
                    tessera_view::Decision::Rejected { reason, .. } => {
                        self.credit(&p.members);
                        if reason.conflict {
                            self.stats.conflicts += 1;
                        } else {
                            self.stats.rejected += 1;
                        }
                        *self.stats.reasons.entry(reason.code.clone()).or_default() += 1;
                        self.pending.push_back((p.job.0, spec));
                    }
                }
            }
            if committed_now && self.stats.first_after_kill.is_none() {
                let k = shared.killed.lock().await.clone();
                if let Some((at, addr)) = k
                    && t0 >= at
                    && self.c.current() != addr
                {
                    self.stats.first_after_kill = Some(done);
                }
            }
        }
        Ok(self)
    }
}

/// Releases a job. A release retried after an unknown outcome (a leader change) finds the job
/// already finished: that is the first attempt's success.
async fn release(c: &mut ViewClient, job: u64) -> Result<(), KitError> {
    match c.release(job, false).await {
        Ok(_) => Ok(()),
        Err(e)
            if e.status().is_some_and(|s| {
                s.code() == tonic::Code::FailedPrecondition && s.message().contains("is finished")
            }) =>
        {
            Ok(())
        }
        Err(source) => Err(KitError::Call { what: format!("releasing job {job}"), source }),
    }
}

/// The `p` quantile (0..=1) of `sorted` microseconds, in milliseconds.
pub fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Runs `load` against the replicas at `addrs` (a fresh cluster: every server free) and checks
/// the outcome. `cluster`, when given, is the process cluster behind `addrs`: the leader kill
/// needs it.
pub async fn run(
    addrs: &[String],
    security: &tessera_proto::tls::Security,
    cluster: Option<&mut ProcessCluster>,
    load: &CommitLoad,
) -> Result<CommitReport, KitError> {
    if load.clients == 0 || load.batch == 0 || load.batch > 1024 {
        return Err(KitError::BadLoad("clients must be at least 1 and batch in 1..=1024".into()));
    }
    if !(0.05..=1.0).contains(&load.fill) {
        return Err(KitError::BadLoad("fill must be in 0.05..=1".into()));
    }
    if load.kill_leader_after.is_some() && cluster.is_none() {
        return Err(KitError::BadLoad("killing the leader needs a local process cluster".into()));
    }
    let mut probe = ViewClient::new(addrs.to_vec())
        .map_err(call("client"))?
        .with_deadline(Duration::from_secs(30))
        .with_security(security.clone());
    let leader = probe.wait_for_leader().await.map_err(call("waiting for a leader"))?;
    tracing::info!(replica = leader.leader, addr = %leader.leader_addr, "bench: leader elected");
    let snap = probe.snapshot_of(&leader.leader_addr, true).await.map_err(call("reading the view"))?;
    let view = ClusterView::from_snapshot(
        ViewSnapshot::try_from(snap.snapshot.ok_or_else(|| KitError::Decode("empty snapshot".into()))?)
            .map_err(|e| KitError::Decode(format!("decoding the view: {e}")))?,
    );
    let servers = view.servers().len();
    if servers < load.clients as usize {
        return Err(KitError::ClusterUnfit(format!(
            "{servers} servers for {} clients: each client needs at least one",
            load.clients
        )));
    }
    let topo = view.topology_of(view.servers()[0].config_set).clone();
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        killed: Mutex::new(None),
        rate_per_client: load.rate as f64 / load.clients as f64,
        clients: load.clients,
    });
    let mut weighted = Vec::new();
    for &(m, g, w) in SHAPES {
        weighted.extend(std::iter::repeat_n((m, g), w as usize));
    }
    let mut clients_ready = Vec::new();
    for id in 0..load.clients {
        let mine: Vec<ServerId> = (0..servers as u32)
            .filter(|s| s % load.clients == id)
            .map(ServerId)
            .filter(|s| view.topology_of(view.servers()[s.index()].config_set) == &topo)
            .collect();
        let records: HashMap<ServerId, ServerRecord> = mine.iter().map(|s| (*s, view.servers()[s.index()])).collect();
        if records.values().any(|r| r.free_gpus != topo.all_devices() || r.free_cores != topo.all_cores()) {
            return Err(KitError::ClusterUnfit("the target cluster is not fresh (some servers are in use)".into()));
        }
        let mut shapes = weighted.clone();
        shapes.rotate_left((id as usize * 7) % weighted.len());
        clients_ready.push(Client {
            c: ViewClient::new(addrs.to_vec())
                .map_err(call("client"))?
                .with_deadline(Duration::from_secs(15))
                .with_security(security.clone()),
            id,
            shapes,
            next_shape: 0,
            capacity: mine.len() as u64 * topo.devices as u64,
            servers: mine,
            records,
            topo: topo.clone(),
            used: 0,
            pending: VecDeque::new(),
            running: VecDeque::new(),
            retry: Vec::new(),
            next_proposal: 0,
            cursor: 0,
            misses: 0,
            stats: ClientStats::default(),
            acks: AckLog::new(),
            version: view.version(),
        });
    }
    if load.preload > 0 {
        tracing::info!(jobs = load.preload, "bench: preloading jobs per client");
        let mut set = tokio::task::JoinSet::new();
        for mut client in clients_ready.drain(..) {
            let n = load.preload;
            set.spawn(async move { client.submit(n).await.map(|()| client) });
        }
        while let Some(c) = set.join_next().await {
            clients_ready.push(c.map_err(|e| KitError::ClientTask(e.to_string()))??);
        }
        clients_ready.sort_by_key(|c| c.id);
    }
    let preloaded: u64 = clients_ready.iter().map(|c| c.stats.submitted).sum();
    let mut tasks = Vec::new();
    for mut client in clients_ready {
        client.stats.submitted = 0;
        let (shared, fill, batch) = (shared.clone(), load.fill, load.batch);
        tasks.push(tokio::spawn(async move { client.run(shared, fill, batch).await }));
    }
    let start = Instant::now();
    let mut killed_replica = None;
    if let (Some(after), Some(l)) = (load.kill_leader_after, cluster) {
        tokio::time::sleep(after).await;
        let st = probe.wait_for_leader().await.map_err(call("waiting for a leader"))?;
        let id = l
            .id_of(&st.leader_addr)
            .ok_or_else(|| KitError::ClusterUnfit(format!("leader {} not in the local cluster", st.leader_addr)))?;
        *shared.killed.lock().await = Some((Instant::now(), st.leader_addr.clone()));
        l.kill(id)?;
        tracing::info!(replica = id, at_s = start.elapsed().as_secs_f64(), "bench: killed the leader (kill -9)");
        killed_replica = Some(id);
        tokio::time::sleep(Duration::from_secs(2)).await;
        l.restart(id)?;
        tracing::info!(replica = id, "bench: restarted the killed replica");
    }
    tokio::time::sleep(load.duration.saturating_sub(start.elapsed())).await;
    shared.stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let mut st = ClientStats::default();
    let mut acks = AckLog::new();
    let mut first_after_kill: Option<Instant> = None;
    for t in tasks {
        let c = t.await.map_err(|e| KitError::ClientTask(e.to_string()))??;
        st.committed += c.stats.committed;
        st.conflicts += c.stats.conflicts;
        st.rejected += c.stats.rejected;
        st.unknown += c.stats.unknown;
        st.submitted += c.stats.submitted;
        st.released += c.stats.released;
        st.requests += c.stats.requests;
        st.latencies_us.extend(&c.stats.latencies_us);
        for (k, v) in c.stats.reasons {
            *st.reasons.entry(k).or_default() += v;
        }
        if let Some(f) = c.stats.first_after_kill {
            first_after_kill = Some(first_after_kill.map_or(f, |x| x.min(f)));
        }
        acks.extend(c.acks);
    }
    st.latencies_us.sort_unstable();
    let (check, converged_ms) = verify(addrs, security, &acks).await?;
    let failover_ms = match (&*shared.killed.lock().await, first_after_kill) {
        (Some((at, _)), Some(f)) => Some(f.duration_since(*at).as_secs_f64() * 1000.0),
        _ => None,
    };
    Ok(CommitReport {
        replicas: addrs.len(),
        clients: load.clients,
        batch: load.batch,
        servers,
        duration_s: elapsed,
        committed: st.committed,
        committed_per_s: st.committed as f64 / elapsed,
        offered_rate: load.rate,
        requests: st.requests,
        p50_ms: percentile(&st.latencies_us, 0.50),
        p99_ms: percentile(&st.latencies_us, 0.99),
        max_ms: percentile(&st.latencies_us, 1.0),
        conflicts: st.conflicts,
        rejected: st.rejected,
        rejections_by_code: st.reasons,
        unknown_outcomes: st.unknown,
        jobs_preloaded: preloaded,
        jobs_submitted: st.submitted,
        jobs_released: st.released,
        acknowledged_live: acks.len(),
        lost_acknowledged: check.lost,
        double_allocations: check.double,
        invariant_violations: check.violations,
        state_hashes_equal: check.hashes_equal,
        replicas_checked: check.replicas,
        converged_ms,
        killed_replica,
        failover_ms,
    })
}

struct Check {
    lost: u64,
    double: u64,
    violations: u64,
    hashes_equal: bool,
    replicas: usize,
}

/// Waits for every replica to reach the same applied index, then checks each one's view.
async fn verify(
    addrs: &[String],
    security: &tessera_proto::tls::Security,
    acks: &AckLog,
) -> Result<(Check, f64), KitError> {
    let mut c = ViewClient::new(addrs.to_vec())
        .map_err(call("client"))?
        .with_deadline(Duration::from_secs(5))
        .with_security(security.clone());
    let t0 = Instant::now();
    let mut applied: Vec<u64> = Vec::new();
    // `converged_ms` is reported: polls stay at most 60 ms apart.
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(50)).with_jitter(0.2);
    let mut rng = seeded_rng(addrs.len() as u64);
    while t0.elapsed() < Duration::from_secs(60) {
        applied.clear();
        for a in addrs {
            applied.push(c.status_of(a).await.map(|s| s.applied_index).unwrap_or(0));
        }
        if applied.iter().all(|x| *x == applied[0] && *x > 0) {
            break;
        }
        tokio::time::sleep(backoff.next_delay(&mut rng)).await;
    }
    let converged_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if !applied.iter().all(|x| *x == applied[0]) {
        return Err(KitError::ClusterUnfit(format!(
            "replicas did not converge within 60 s: applied indexes {applied:?}"
        )));
    }
    // Independent check of the clients' own record: no device in two live acknowledged gangs.
    let mut held: HashMap<ServerId, (u64, CoreMask)> = HashMap::new();
    let mut double = 0u64;
    for (_, members) in acks.values() {
        for m in members {
            let h = held.entry(m.server).or_insert((0, CoreMask::EMPTY));
            double += (h.0 & m.gpus).count_ones() as u64 + h.1.and(m.cores).count() as u64;
            h.0 |= m.gpus;
            h.1 = h.1.or(m.cores);
        }
    }
    let mut lost = 0u64;
    let mut violations = 0u64;
    let mut hashes = Vec::new();
    for a in addrs {
        let s = c.snapshot_of(a, false).await.map_err(call("reading a replica's view"))?;
        let snap = ViewSnapshot::try_from(s.snapshot.ok_or_else(|| KitError::Decode("empty snapshot".into()))?)
            .map_err(|e| KitError::Decode(format!("decoding a replica's view: {e}")))?;
        let view = ClusterView::from_snapshot(snap);
        hashes.push(view.state_hash());
        let rep = invariants::check(&view);
        double += rep.double_allocations();
        violations += rep.violations.len() as u64;
        for (job, (proposal, _)) in acks {
            // Only its owner releases a job, and released jobs left the log: an acknowledged
            // placement must still be held, under the acknowledged proposal.
            let ok = view
                .job(JobId(*job))
                .and_then(|j| j.placement.as_ref())
                .is_some_and(|p| p.proposal == ProposalId(*proposal));
            if !ok {
                lost += 1;
            }
        }
    }
    let hashes_equal = hashes.windows(2).all(|w| w[0] == w[1]);
    Ok((Check { lost, double, violations, hashes_equal, replicas: addrs.len() }, converged_ms))
}
