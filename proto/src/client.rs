//! [`ViewClient`]: a gRPC client of the view that finds and follows the leader.
//!
//! Writes go to the replica believed to lead. A follower's answer carries the leader's address
//! (metadata `tessera-leader`) and the client retries there; an unreachable replica or one
//! that knows no leader makes it try the next address after a short, growing, jittered
//! [`Backoff`] (10 ms doubling to 200 ms). Every call is bounded by the client's deadline.
//!
//! Retrying is safe for every call: proposals (the approver is idempotent on the proposal id),
//! submissions (each carries a request id, and the view admits a job at most once per id),
//! releases and cancels (a second one is refused as the job is no longer live) and reads.

use crate::LEADER_KEY;
use crate::backoff::{Backoff, seeded_rng};
use crate::tls::{CallerAuth, Security};
use crate::v1;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use thiserror::Error;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// The generated client over one replica's connection, every call carrying the caller's
/// token (when it has one).
pub type Grpc = v1::view_client::ViewClient<InterceptedService<Channel, CallerAuth>>;

/// Why a call failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// No address given.
    #[error("no view address given (use --view or TESSERA_VIEW)")]
    NoAddress,
    /// An address is malformed.
    #[error("bad view address `{0}`: {1}")]
    BadAddress(String, String),
    /// The replica answered with an error that retrying will not fix.
    #[error("{addr}: {} ({:?})", .status.message(), .status.code())]
    Status {
        /// The replica.
        addr: String,
        /// Its answer.
        status: Box<Status>,
    },
    /// No replica answered usefully before the deadline.
    #[error("no view replica answered within {waited_ms} ms (tried {tried}); last error: {last}")]
    Unavailable {
        /// Addresses tried.
        tried: String,
        /// How long.
        waited_ms: u64,
        /// The last error seen.
        last: String,
    },
}

impl ClientError {
    /// The gRPC status, when a replica answered.
    pub fn status(&self) -> Option<&Status> {
        match self {
            ClientError::Status { status, .. } => Some(status),
            _ => None,
        }
    }
}

/// A leader-following client.
#[derive(Clone, Debug)]
pub struct ViewClient {
    addrs: Vec<String>,
    current: String,
    channels: HashMap<String, Channel>,
    deadline: Duration,
    max_message: usize,
    security: Security,
    auth: CallerAuth,
    /// The TLS files' generation the cached channels were made with.
    generation: u64,
}

/// How long a call rules out an address that failed without naming a leader.
const UNREACHABLE_FOR: Duration = Duration::from_secs(1);

impl ViewClient {
    /// A client of the replicas at `addrs` (host:port, tried in order).
    pub fn new(addrs: Vec<String>) -> Result<ViewClient, ClientError> {
        let addrs: Vec<String> = addrs
            .into_iter()
            .map(|a| a.trim().trim_start_matches("http://").trim_start_matches("https://").to_string())
            .filter(|a| !a.is_empty())
            .collect();
        let current = addrs.first().cloned().ok_or(ClientError::NoAddress)?;
        for a in &addrs {
            Endpoint::from_shared(format!("https://{a}"))
                .map_err(|e| ClientError::BadAddress(a.clone(), e.to_string()))?;
        }
        Ok(ViewClient {
            addrs,
            current,
            channels: HashMap::new(),
            deadline: Duration::from_secs(10),
            max_message: 1 << 30,
            security: Security::Insecure,
            auth: CallerAuth::default(),
            generation: 0,
        })
    }

    /// Connects with `security` (TLS with a directory's certificate, or plaintext); a new
    /// client is plaintext until told otherwise.
    pub fn with_security(mut self, security: Security) -> ViewClient {
        self.security = security;
        self.channels.clear();
        self
    }

    /// Sends `auth` (a bearer token, an identity acted for) with every call.
    pub fn with_auth(mut self, auth: CallerAuth) -> ViewClient {
        self.auth = auth;
        self
    }

    /// How this client connects.
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// Parses a comma-separated address list.
    pub fn from_list(list: &str) -> Result<ViewClient, ClientError> {
        ViewClient::new(list.split(',').map(str::to_string).collect())
    }

    /// Sets how long one call may take, retries included.
    pub fn with_deadline(mut self, d: Duration) -> ViewClient {
        self.deadline = d;
        self
    }

    /// How long one attempt of a call waits for an answer before the call tries another
    /// replica: a third of the deadline, within 300 ms..=2 s. A leader answers a write once it
    /// commits (milliseconds; the replica's own request timeout bounds a slow commit), and
    /// every write is safe to send again, so an attempt cut short costs a retry, not a
    /// duplicate.
    pub fn attempt_timeout(&self) -> Duration {
        (self.deadline / 3).clamp(Duration::from_millis(300), Duration::from_secs(2))
    }

    /// The replica the last call went to (the leader, after a successful write).
    pub fn current(&self) -> &str {
        &self.current
    }

    /// An endpoint at `addr` with this client's transport security.
    fn endpoint(&self, addr: &str) -> Result<Endpoint, ClientError> {
        let bad = |e: tonic::transport::Error| ClientError::BadAddress(addr.to_string(), e.to_string());
        self.security.endpoint(addr).map_err(bad)
    }

    fn grpc(&mut self, addr: &str) -> Result<Grpc, ClientError> {
        // Renewed TLS files: connections made from now on present the new certificate.
        let generation = self.security.generation();
        if generation != self.generation {
            self.channels.clear();
            self.generation = generation;
        }
        let ch = match self.channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let ep = self
                    .endpoint(addr)?
                    .connect_timeout(Duration::from_millis(500))
                    .timeout(self.deadline)
                    // A watch on a replica whose host died silently ends in seconds.
                    .http2_keep_alive_interval(Duration::from_secs(2))
                    .keep_alive_timeout(Duration::from_secs(4))
                    .keep_alive_while_idle(true)
                    .tcp_nodelay(true);
                let c = ep.connect_lazy();
                self.channels.insert(addr.to_string(), c.clone());
                c
            }
        };
        Ok(v1::view_client::ViewClient::with_interceptor(ch, self.auth.clone())
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(self.max_message))
    }

    /// Picks the address to try after a call to `addr` failed: the leader it named (`hint`),
    /// unless that failed in this call without naming one; else the next address in order that
    /// has not (all of them again once none is left). True when it
    /// follows a hint (tried at once, without a backoff).
    fn after_failure(&mut self, addr: &str, hint: Option<String>, unreachable: &mut Vec<String>) -> bool {
        match hint {
            Some(h) if h != addr && !unreachable.contains(&h) => {
                if !self.addrs.contains(&h) {
                    self.addrs.push(h.clone());
                }
                self.current = h;
                true
            }
            hint => {
                if hint.is_none() && !unreachable.iter().any(|a| a == addr) {
                    unreachable.push(addr.to_string());
                }
                if self.addrs.iter().all(|a| unreachable.contains(a)) {
                    unreachable.clear();
                }
                self.current = addr.to_string();
                self.next_addr();
                while unreachable.contains(&self.current) {
                    self.next_addr();
                }
                false
            }
        }
    }

    fn next_addr(&mut self) {
        let i = self.addrs.iter().position(|a| *a == self.current).map_or(0, |i| (i + 1) % self.addrs.len());
        self.current = self.addrs[i].clone();
    }

    /// Runs `call` against the leader, following hints and retrying unavailability (and calls
    /// cut off by a closed connection; every write of the API is safe to retry) until the
    /// deadline.
    pub async fn call<T, F, Fut>(&mut self, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(Grpc) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = Instant::now();
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
        let mut rng = None;
        let mut tried: Vec<String> = Vec::new();
        // Addresses that failed during this call without naming a leader: down, or not
        // reachable from here (a leader hint may name an address advertised inside a private
        // network, which this client cannot reach).
        let mut unreachable: Vec<String> = Vec::new();
        // ... for a while: a replica that was down may be back (and leading) a second later,
        // and a hint to an address ruled out is never followed. Forgotten each second.
        let mut ruled_out_since = Instant::now();
        loop {
            if ruled_out_since.elapsed() >= UNREACHABLE_FOR {
                unreachable.clear();
                ruled_out_since = Instant::now();
            }
            let addr = self.current.clone();
            if !tried.contains(&addr) {
                tried.push(addr.clone());
            }
            let g = self.grpc(&addr)?;
            // A replica that accepts the connection and never answers (a frozen process: a
            // stopped VM, `docker pause`, SIGSTOP) holds one attempt, not the whole call: its
            // peers elect another leader meanwhile, and the call goes on to them.
            let attempt = self.attempt_timeout();
            let (status, timed_out) = match tokio::time::timeout(attempt, call(g)).await {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(s)) => (s, false),
                Err(_) => (Status::unavailable(format!("no answer within {} ms", attempt.as_millis())), true),
            };
            let hint = status.metadata().get(LEADER_KEY).and_then(|v| v.to_str().ok()).map(str::to_string);
            // Cancelled: the connection closed under the call (a replica died mid-request).
            let retry =
                matches!(status.code(), Code::Unavailable | Code::Unknown | Code::ResourceExhausted | Code::Cancelled);
            if !retry {
                return Err(ClientError::Status { addr, status: Box::new(status) });
            }
            // Moved on before the deadline check, so that the next call does not begin where
            // this one failed.
            let follow = if status.code() == Code::ResourceExhausted {
                // Busy (its request queue, its proposals in flight, or this caller's rate is
                // full), not gone: the same replica again after the backoff. Ruling it out
                // would ignore every hint to it for the rest of the call — a leader swamped
                // just after a failover was then never tried again until the deadline.
                self.current = addr.clone();
                false
            } else if timed_out {
                // Slow or frozen, not gone: the call goes on to the next replica now, but the
                // address is not ruled out for the rest of the call. A replica that names it as
                // the leader sends the call back to it: a slow commit ends, and a frozen
                // leader is replaced by an election, after which the hints name another.
                self.current = addr.clone();
                self.next_addr();
                false
            } else {
                self.after_failure(&addr, hint, &mut unreachable)
            };
            if start.elapsed() >= self.deadline {
                return Err(ClientError::Unavailable {
                    tried: tried.join(", "),
                    waited_ms: start.elapsed().as_millis() as u64,
                    last: format!("{addr}: {}", status.message()),
                });
            }
            if follow {
                continue;
            }
            let rng = rng.get_or_insert_with(|| seeded_rng(self.deadline.as_nanos() as u64));
            tokio::time::sleep(backoff.next_delay(rng)).await;
        }
    }

    /// The status of the replica at `addr` (no retries elsewhere).
    pub async fn status_of(&mut self, addr: &str) -> Result<v1::StatusResponse, ClientError> {
        let mut g = self.grpc(addr)?;
        g.status(v1::StatusRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|s| ClientError::Status { addr: addr.to_string(), status: Box::new(s) })
    }

    /// The status of the first replica that answers.
    pub async fn status(&mut self) -> Result<v1::StatusResponse, ClientError> {
        self.call(|mut g| async move { g.status(v1::StatusRequest {}).await }).await
    }

    /// Waits (up to the deadline) until some replica reports a leader; returns its status.
    pub async fn wait_for_leader(&mut self) -> Result<v1::StatusResponse, ClientError> {
        let start = Instant::now();
        let mut last = String::from("no answer");
        // An election takes a few ticks: look again soon, then less often.
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
        let mut rng = seeded_rng(self.addrs.len() as u64);
        while start.elapsed() < self.deadline {
            for a in self.addrs.clone() {
                match self.status_of(&a).await {
                    Ok(s) if s.leader != 0 && !s.leader_addr.is_empty() => {
                        self.current = s.leader_addr.clone();
                        return Ok(s);
                    }
                    Ok(_) => last = format!("{a}: no leader yet"),
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(backoff.next_delay(&mut rng).min(self.deadline.saturating_sub(start.elapsed()))).await;
        }
        Err(ClientError::Unavailable {
            tried: self.addrs.join(", "),
            waited_ms: start.elapsed().as_millis() as u64,
            last,
        })
    }

    /// Gang proposals, one result each.
    pub async fn propose(&mut self, proposals: Vec<v1::Proposal>) -> Result<Vec<v1::ProposeResult>, ClientError> {
        let req = v1::ProposeRequest { proposals, for_job: None, target: Vec::new() };
        let r = self.call(|mut g| {
            let req = req.clone();
            async move { g.propose(req).await }
        });
        Ok(r.await?.results)
    }

    /// Moves of the migration module, one result each: every proposal is a whole new
    /// placement for a placed or running job, decided atomically on its own. Retrying a move
    /// with the same proposal id is safe (a committed one answers `AlreadyApplied`). `for_job`
    /// is the pending job the moves make room for and `target` its placement once they are
    /// applied: a scheduler host must name a job it holds, and moves that help it get there.
    pub async fn migrate(
        &mut self,
        for_job: Option<u64>,
        target: Vec<v1::MemberPlacement>,
        moves: Vec<v1::Proposal>,
    ) -> Result<Vec<v1::ProposeResult>, ClientError> {
        let req = v1::ProposeRequest { proposals: moves, for_job, target };
        let r = self.call(|mut g| {
            let req = req.clone();
            async move { g.migrate(req).await }
        });
        Ok(r.await?.results)
    }

    /// A preemption: the victims' gangs released whole and re-queued and the preemptor placed,
    /// atomically, or nothing changes; one result. Retrying with the same proposal id is safe
    /// (a committed one answers `AlreadyApplied`).
    pub async fn preempt(&mut self, preemption: v1::Preemption) -> Result<Vec<v1::ProposeResult>, ClientError> {
        let req = v1::PreemptRequest { preemption: Some(preemption) };
        let r = self.call(|mut g| {
            let req = req.clone();
            async move { g.preempt(req).await }
        });
        Ok(r.await?.results)
    }

    /// Submits jobs; one result each. The request carries a fresh random request id, so the
    /// retries of this call admit each job at most once.
    pub async fn submit(&mut self, specs: Vec<v1::JobSpec>) -> Result<Vec<v1::SubmitResult>, ClientError> {
        self.submit_as(&new_request_id(), specs).await
    }

    /// Submits jobs under the caller's request id (see [`v1::SubmitJobRequest::request_id`]):
    /// a caller that lost an answer and calls again with the same id and specs gets the jobs
    /// admitted the first time.
    pub async fn submit_as(
        &mut self,
        request_id: &str,
        specs: Vec<v1::JobSpec>,
    ) -> Result<Vec<v1::SubmitResult>, ClientError> {
        let req = v1::SubmitJobRequest { specs, request_id: request_id.to_string() };
        let r = self.call(|mut g| {
            let req = req.clone();
            async move { g.submit_job(req).await }
        });
        Ok(r.await?.results)
    }

    /// Releases a job's resources.
    pub async fn release(&mut self, job: u64, failed: bool) -> Result<u64, ClientError> {
        let r = self.call(|mut g| async move { g.release(v1::ReleaseRequest { job, failed }).await });
        Ok(r.await?.version)
    }

    /// Registers a server (node agents): its name in the cluster spec and its discovered
    /// topology. Answers the server's id and lease.
    pub async fn register_server(
        &mut self,
        name: &str,
        topology: v1::Topology,
        agent_addr: &str,
    ) -> Result<v1::LeaseResponse, ClientError> {
        let req = v1::RegisterServerRequest {
            name: name.to_string(),
            topology: Some(topology),
            agent_addr: agent_addr.to_string(),
        };
        self.call(|mut g| {
            let req = req.clone();
            async move { g.register_server(req).await }
        })
        .await
    }

    /// Renews a server's lease, reporting its unhealthy devices when given, and where its agent
    /// serves (empty: nowhere).
    pub async fn heartbeat(
        &mut self,
        server: u32,
        unhealthy: Option<u64>,
        health_reasons: Vec<String>,
        agent_addr: &str,
    ) -> Result<v1::LeaseResponse, ClientError> {
        let req = v1::HeartbeatRequest { server, unhealthy, health_reasons, agent_addr: agent_addr.to_string() };
        self.call(|mut g| {
            let req = req.clone();
            async move { g.heartbeat(req).await }
        })
        .await
    }

    /// Opens a watch: the changes after version `from` (a snapshot first when the replica no
    /// longer holds them), from the replica calls currently go to.
    pub async fn watch(&mut self, from: u64) -> Result<tonic::Streaming<v1::WatchEvent>, ClientError> {
        self.call(|mut g| async move { g.watch(v1::WatchRequest { from_version: from }).await }).await
    }

    /// The whole view from the replica calls currently go to.
    pub async fn snapshot(&mut self, linearizable: bool) -> Result<v1::SnapshotResponse, ClientError> {
        self.call(|mut g| async move { g.snapshot(v1::ReadRequest { linearizable }).await }).await
    }

    /// Reports a task of a placement (node agents).
    pub async fn report_task(&mut self, req: v1::ReportTaskRequest) -> Result<v1::ReportTaskResponse, ClientError> {
        self.call(|mut g| {
            let req = req.clone();
            async move { g.report_task(req).await }
        })
        .await
    }

    /// Cancels a job.
    pub async fn cancel(&mut self, job: u64) -> Result<u64, ClientError> {
        self.cancel_because(job, "").await
    }

    /// GPU and CPU-core time used over a range (see `UsageRequest`), read from any replica.
    pub async fn usage(&mut self, req: v1::UsageRequest) -> Result<v1::UsageResponse, ClientError> {
        self.call(|mut g| {
            let req = req.clone();
            async move { g.usage(req).await }
        })
        .await
    }

    /// A page of the history of ended jobs the view forgot (see `HistoryRequest`), read from
    /// any replica.
    pub async fn history(&mut self, req: v1::HistoryRequest) -> Result<v1::HistoryResponse, ClientError> {
        self.call(|mut g| {
            let req = req.clone();
            async move { g.history(req).await }
        })
        .await
    }

    /// Cancels a job, recording `reason` as its error (empty: "cancelled").
    pub async fn cancel_because(&mut self, job: u64, reason: &str) -> Result<u64, ClientError> {
        self.cancel_with(job, reason, None).await
    }

    /// [`ViewClient::cancel_because`], giving its tasks `grace_s` seconds between SIGTERM and
    /// SIGKILL (over its spec's `stop_grace_s`).
    pub async fn cancel_with(&mut self, job: u64, reason: &str, grace_s: Option<u64>) -> Result<u64, ClientError> {
        let req = v1::CancelJobRequest { job, reason: reason.to_string(), grace_s };
        let r = self.call(|mut g| {
            let req = req.clone();
            async move { g.cancel_job(req).await }
        });
        Ok(r.await?.version)
    }

    /// An operator's cordon, drain (gangs still on the server after `drain_timeout_s` are
    /// re-queued) or uncordon of server `server`; returns the view version after it. Safe to
    /// retry: a repeated cordon or drain restarts its clock, a repeated uncordon changes nothing.
    pub async fn cordon_server(
        &mut self,
        server: u32,
        action: v1::CordonAction,
        reason: &str,
        drain_timeout_s: u64,
    ) -> Result<u64, ClientError> {
        let req =
            v1::CordonServerRequest { server, action: action.into(), reason: reason.to_string(), drain_timeout_s };
        let r = self.call(|mut g| {
            let req = req.clone();
            async move { g.cordon_server(req).await }
        });
        Ok(r.await?.version)
    }

    /// An operator's change to the cluster's layout (admins only): a configuration set or
    /// servers added, a server or configuration set removed. Safe to retry: an add applied
    /// once is refused the second time (its names exist), a removal applied once is refused as
    /// already done; the error then says so.
    pub async fn change_layout(
        &mut self,
        change: v1::layout_request::Change,
    ) -> Result<v1::LayoutResponse, ClientError> {
        let req = v1::LayoutRequest { change: Some(change) };
        self.call(|mut g| {
            let req = req.clone();
            async move { g.change_layout(req).await }
        })
        .await
    }

    /// Admins: sets or removes a tenant's quota or a priority class; answers the view version.
    pub async fn set_policy(&mut self, change: v1::policy_request::Change) -> Result<u64, ClientError> {
        let req = v1::PolicyRequest { change: Some(change) };
        let r = self
            .call(|mut g| {
                let req = req.clone();
                async move { g.set_policy(req).await }
            })
            .await?;
        Ok(r.version)
    }

    /// Admins: a bearer token for `role` `name` (a user's `tenants`), valid `ttl_s` seconds,
    /// signed by the replica that answers.
    pub async fn issue_token(
        &mut self,
        role: &str,
        name: &str,
        tenants: &[String],
        ttl_s: u64,
    ) -> Result<v1::IssueTokenResponse, ClientError> {
        let req = v1::IssueTokenRequest { role: role.into(), name: name.into(), tenants: tenants.to_vec(), ttl_s };
        self.call(|mut g| {
            let req = req.clone();
            async move { g.issue_token(req).await }
        })
        .await
    }

    /// Scheduler hosts: renews the hold on `held` and asks for up to `want` more pending jobs.
    pub async fn adopt_jobs(
        &mut self,
        host: &str,
        held: Vec<u64>,
        want: u32,
    ) -> Result<v1::AdoptJobsResponse, ClientError> {
        let req = v1::AdoptJobsRequest { host: host.to_string(), held, want };
        self.call(|mut g| {
            let req = req.clone();
            async move { g.adopt_jobs(req).await }
        })
        .await
    }

    /// The node agents the leader knows, with their Agent service addresses.
    pub async fn agents(&mut self) -> Result<Vec<v1::AgentInfo>, ClientError> {
        let r = self.call(|mut g| async move { g.agents(v1::AgentsRequest {}).await });
        Ok(r.await?.agents)
    }

    /// The tail of one task's log, from the agent of the server running (or that ran) the
    /// member: the leader says where each agent serves.
    pub async fn logs(&mut self, server: u32, req: v1::LogsRequest) -> Result<v1::LogsResponse, ClientError> {
        let agents = self.agents().await?;
        let Some(a) = agents.iter().find(|a| a.server == server) else {
            return Err(ClientError::Unavailable {
                tried: self.current.clone(),
                waited_ms: 0,
                last: format!("the leader knows no agent address for server {server} (no agent registered with one)"),
            });
        };
        self.logs_at(&a.addr, req).await
    }

    /// The tail of one task's log from the agent serving at `addr` (see [`ViewClient::agents`]).
    pub async fn logs_at(&self, addr: &str, req: v1::LogsRequest) -> Result<v1::LogsResponse, ClientError> {
        let ep = self.endpoint(addr)?.connect_timeout(Duration::from_secs(2)).timeout(self.deadline);
        let ch = ep.connect().await.map_err(|e| ClientError::Unavailable {
            tried: addr.to_string(),
            waited_ms: 0,
            last: format!("agent at {addr}: {e}"),
        })?;
        crate::v1::agent_client::AgentClient::with_interceptor(ch, self.auth.clone())
            .max_decoding_message_size(8 << 20)
            .logs(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|status| ClientError::Status { addr: addr.to_string(), status: Box::new(status) })
    }

    /// One job.
    pub async fn job(&mut self, job: u64, linearizable: bool) -> Result<v1::GetJobResponse, ClientError> {
        self.call(|mut g| async move { g.get_job(v1::GetJobRequest { job, linearizable }).await }).await
    }

    /// The whole view from the replica at `addr`.
    pub async fn snapshot_of(&mut self, addr: &str, linearizable: bool) -> Result<v1::SnapshotResponse, ClientError> {
        let mut g = self.grpc(addr)?;
        g.snapshot(v1::ReadRequest { linearizable })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| ClientError::Status { addr: addr.to_string(), status: Box::new(s) })
    }

    /// Adds a replica (`raft_addr` empty when raft shares its client port).
    pub async fn add_replica(&mut self, id: u64, addr: &str, raft_addr: &str) -> Result<Vec<u64>, ClientError> {
        let req = v1::AddReplicaRequest { id, addr: addr.to_string(), raft_addr: raft_addr.to_string() };
        let r = self.call(|mut g| {
            let req = req.clone();
            async move { g.add_replica(req).await }
        });
        Ok(r.await?.voters)
    }

    /// Removes a replica.
    pub async fn remove_replica(&mut self, id: u64) -> Result<Vec<u64>, ClientError> {
        let r = self.call(|mut g| async move { g.remove_replica(v1::RemoveReplicaRequest { id }).await });
        Ok(r.await?.voters)
    }
}

/// A fresh request id: 128 random bits in hex, unique for every practical purpose.
pub fn new_request_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> ViewClient {
        ViewClient::new(vec!["a:1".into(), "b:1".into(), "c:1".into()]).expect("addresses")
    }

    #[test]
    fn a_leader_hint_this_client_cannot_reach_is_not_followed_twice() {
        let mut c = client();
        let mut unreachable = Vec::new();
        // `a` says the leader is at `view-2:7101`, an address only its own network resolves.
        assert!(c.after_failure("a:1", Some("view-2:7101".into()), &mut unreachable));
        assert_eq!(c.current(), "view-2:7101");
        // It does not answer: on to the address after the one that named it.
        assert!(!c.after_failure("view-2:7101", None, &mut unreachable));
        assert_eq!(c.current(), "a:1", "the next in order after the hint appended last");
        // `a` names it again: not followed; `b`, which may be the leader, is tried.
        assert!(!c.after_failure("a:1", Some("view-2:7101".into()), &mut unreachable));
        assert_eq!(c.current(), "b:1");
    }

    #[test]
    fn addresses_that_failed_are_skipped_until_every_one_has() {
        let mut c = client();
        let mut unreachable = Vec::new();
        assert!(!c.after_failure("a:1", None, &mut unreachable));
        assert_eq!(c.current(), "b:1");
        assert!(!c.after_failure("b:1", None, &mut unreachable));
        assert_eq!(c.current(), "c:1");
        // All three failed: start over rather than give up before the deadline.
        assert!(!c.after_failure("c:1", None, &mut unreachable));
        assert!(unreachable.is_empty());
        assert_eq!(c.current(), "a:1");
        // A reachable hint is followed at once.
        assert!(c.after_failure("a:1", Some("c:1".into()), &mut unreachable));
        assert_eq!(c.current(), "c:1");
    }
}
