//! The chaos suite's load: two streams of jobs whose tasks really run in the agents' containers.
//!
//! - *Hosted*: jobs of 1 to 16 GPUs (gangs of up to 4 members) submitted for the scheduler
//!   hosts to adopt and place.
//! - *Direct*: small jobs (1 or 2 GPUs, or a gang of two 1-GPU members) submitted and at once
//!   proposed from a replica's copy of the view, as a scheduler of one's own would, racing the
//!   hosts that may adopt the same job. Whichever proposal the approver takes places the job;
//!   the other is refused.
//!
//! Every write is retried under the same id (the submission's request id, the proposal's id)
//! until it is answered, so a write whose answer a fault swallowed is never applied twice. The
//! [`Ledger`] records what was acknowledged and when each acknowledged write was sent and
//! answered, which gives each fault's unavailability.

use super::ChaosConfig;
use crate::KitError;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_view::fit::{FitMode, member_request, plan_member};
use tessera_view::{
    ClusterView, Decision, JobId, JobSpec, LocalityLevel, MemberPlacement, Proposal, ProposalId, ServerId, ViewSnapshot,
};
use tessera_view_server::ViewClient;
use tokio::sync::watch;

/// What the load was told.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Jobs whose submission was acknowledged.
    pub submitted: Vec<u64>,
    /// Direct proposals acknowledged as committed: (proposal id, job).
    pub direct_acks: Vec<(u64, u64)>,
    /// Direct proposals refused.
    pub direct_refused: u64,
    /// Acknowledged writes: (sent, answered).
    writes: Vec<(Instant, Instant)>,
}

impl Ledger {
    /// When the first write sent at or after `at` was acknowledged.
    pub fn first_ack_after(&self, at: Instant) -> Option<Instant> {
        self.writes.iter().filter(|(s, _)| *s >= at).map(|(_, a)| *a).min()
    }
}

fn lock(l: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The running load.
pub struct Workload {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Longest one call may take before it is retried (the client follows the leader within it).
const CALL_DEADLINE: Duration = Duration::from_secs(3);

/// Pause between retries of one write.
const RETRY: Duration = Duration::from_millis(100);

/// Hosted job shapes: (members, GPUs per member, weight).
const HOSTED: &[(u32, u32, u32)] = &[(1, 1, 30), (1, 2, 20), (1, 4, 15), (1, 8, 10), (2, 4, 15), (2, 8, 5), (4, 2, 5)];

/// Direct job shapes: (members, GPUs per member, weight).
const DIRECT: &[(u32, u32, u32)] = &[(1, 1, 50), (1, 2, 30), (2, 1, 20)];

/// Share of tasks that exit with code 3 (their jobs fail, with that reason).
const FAILING: f64 = 0.03;

impl Workload {
    /// Starts both streams.
    pub fn start(cfg: &ChaosConfig, ledger: Arc<Mutex<Ledger>>) -> Result<Workload, KitError> {
        let (stop, rx) = watch::channel(false);
        let client = || -> Result<ViewClient, KitError> {
            Ok(ViewClient::new(cfg.view.clone())?.with_deadline(CALL_DEADLINE).with_security(cfg.security.clone()))
        };
        let seed = cfg.schedule.seed;
        let hosted = Stream {
            c: client()?,
            ledger: ledger.clone(),
            stop: rx.clone(),
            rng: SmallRng::seed_from_u64(seed ^ 0x6a6f_6273),
            program: cfg.task_program.clone(),
            every: Duration::from_secs_f64(1.0 / cfg.hosted_per_s.max(0.01)),
            prefix: format!("chaos-{seed}-{}-h", std::process::id()),
        };
        let direct = Stream {
            c: client()?,
            ledger,
            stop: rx,
            rng: SmallRng::seed_from_u64(seed ^ 0x6469_7265),
            program: cfg.task_program.clone(),
            every: cfg.direct_every,
            prefix: format!("chaos-{seed}-{}-d", std::process::id()),
        };
        Ok(Workload { stop, tasks: vec![tokio::spawn(hosted.run(false)), tokio::spawn(direct.run(true))] })
    }

    /// Stops both streams (a write in flight is abandoned; its job, if admitted, still runs).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

struct Stream {
    c: ViewClient,
    ledger: Arc<Mutex<Ledger>>,
    stop: watch::Receiver<bool>,
    rng: SmallRng,
    program: String,
    every: Duration,
    prefix: String,
}

impl Stream {
    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Sleeps `d`, or less when told to stop. Answers whether to go on.
    async fn pause(&mut self, d: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => !self.stopped(),
            _ = self.stop.changed() => false,
        }
    }

    async fn run(mut self, direct: bool) {
        let mut n = 0u64;
        let mut next = Instant::now();
        loop {
            next = (next + self.every).max(Instant::now());
            if !self.pause(next.saturating_duration_since(Instant::now())).await {
                return;
            }
            n += 1;
            let spec = self.spec(if direct { DIRECT } else { HOSTED }, direct);
            let Some(job) = self.submit(&format!("{}{n}", self.prefix), &spec).await else { return };
            if direct && !self.propose(job, &spec).await {
                return;
            }
        }
    }

    fn spec(&mut self, shapes: &[(u32, u32, u32)], direct: bool) -> JobSpec {
        let total: u32 = shapes.iter().map(|s| s.2).sum();
        let mut x = self.rng.random_range(0..total);
        let &(members, gpus, _) = shapes
            .iter()
            .find(|s| {
                let hit = x < s.2;
                x = x.saturating_sub(s.2);
                hit
            })
            .unwrap_or(&shapes[0]);
        let ms = if direct { self.rng.random_range(300..=1_500) } else { self.rng.random_range(1_000..=5_000) };
        let code = if self.rng.random_bool(FAILING) { 3 } else { 0 };
        let mut s = JobSpec::simple(if direct { "chaos-direct" } else { "chaos-hosted" }, members, gpus);
        s.tolerate = LocalityLevel::Any;
        s.command = [self.program.as_str(), "chaos", "task", "--ms", &ms.to_string(), "--exit-code", &code.to_string()]
            .iter()
            .map(|a| (*a).to_string())
            .collect();
        s
    }

    /// Submits under `request` until answered; the job's id, or none when told to stop first.
    async fn submit(&mut self, request: &str, spec: &JobSpec) -> Option<u64> {
        let wire = v1::JobSpec::from(spec);
        loop {
            let sent = Instant::now();
            match self.c.submit_as(request, vec![wire.clone()]).await {
                Ok(r) => {
                    let r = r.into_iter().next()?;
                    if !r.error.is_empty() {
                        tracing::warn!(error = %r.error, "chaos: a job was refused");
                        return None;
                    }
                    let mut l = lock(&self.ledger);
                    l.submitted.push(r.job);
                    l.writes.push((sent, Instant::now()));
                    return Some(r.job);
                }
                Err(e) => {
                    tracing::debug!(error = %tessera_proto::error::chain(&e), "chaos: submission unanswered; retrying");
                    if !self.pause(RETRY).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Plans `job` on a replica's copy of the view and proposes it, retrying the same proposal
    /// until answered. Answers whether to go on.
    async fn propose(&mut self, job: u64, spec: &JobSpec) -> bool {
        let view = match self.c.snapshot(false).await {
            Ok(s) => match s.snapshot.map(ViewSnapshot::try_from) {
                Some(Ok(s)) => ClusterView::from_snapshot(s),
                _ => return !self.stopped(),
            },
            // No copy of the view now: the hosts will place this one.
            Err(_) => return !self.stopped(),
        };
        let start = self.rng.random_range(0..view.servers().len().max(1));
        let Some(members) = plan(&view, spec, start) else { return !self.stopped() };
        let p = Proposal {
            id: ProposalId(self.rng.random::<u64>() | 1),
            job: JobId(job),
            members,
            based_on: view.version(),
        };
        let wire = v1::Proposal::from(&p);
        loop {
            let sent = Instant::now();
            let answer = self.c.propose(vec![wire.clone()]).await;
            let decision = match answer {
                Ok(r) => r.into_iter().next().and_then(|r| r.decision).map(tessera_proto::RemoteDecision::try_from),
                Err(_) => None,
            };
            match decision {
                Some(Ok(Decision::Accepted { .. } | Decision::AlreadyApplied { .. })) => {
                    let mut l = lock(&self.ledger);
                    l.direct_acks.push((p.id.0, job));
                    l.writes.push((sent, Instant::now()));
                    return true;
                }
                Some(Ok(Decision::Rejected { .. })) => {
                    lock(&self.ledger).direct_refused += 1;
                    return true;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "chaos: an undecodable decision");
                    return true;
                }
                None => {
                    if !self.pause(RETRY).await {
                        return false;
                    }
                }
            }
        }
    }
}

/// Each member on its own server, first fit from server `start` on.
fn plan(view: &ClusterView, spec: &JobSpec, start: usize) -> Option<Vec<MemberPlacement>> {
    let n = view.servers().len();
    let mut members: Vec<MemberPlacement> = Vec::new();
    for k in 0..n {
        if members.len() == spec.members as usize {
            break;
        }
        let i = (start + k) % n;
        let rec = view.servers()[i];
        let topo = view.topology_of(rec.config_set);
        let req = member_request(spec, topo);
        if let Some((m, _)) = plan_member(topo, &rec, ServerId(i as u32), &req, LocalityLevel::Server, FitMode::Pack) {
            members.push(m);
        }
    }
    (members.len() == spec.members as usize).then_some(members)
}
