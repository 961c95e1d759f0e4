//! The `View` gRPC service: converts and checks requests, asks the driver, converts answers.
//!
//! Every request is checked before it reaches the replica: counts bounded, wire values
//! converted with the validating `TryFrom`s of tessera-proto (a malformed message is
//! `INVALID_ARGUMENT` naming the field). Semantic refusals (an unknown job, server or device in a
//! proposal) come back as decisions with a reason, from the approver itself.

use crate::error::NodeError;
use crate::node::{NodeHandle, NodeRequest, ReadOut, ReadTarget, WatchStep};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tessera_proto::v1;
use tessera_replica::Answer;
use tessera_view::{
    Command, JobId, JobSpec, Outcome, Proposal, ProposalId, RequestId, ServerId, TaskEvent, Topology, ViewError,
};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Most proposals or job specs in one request.
pub const MAX_ITEMS: usize = 1024;

/// The service.
#[derive(Debug)]
pub struct ViewService {
    /// The driver.
    pub node: NodeHandle,
    /// Cluster identity, for Status.
    pub cluster: String,
    /// Watch streams open now.
    pub watchers: Arc<AtomicUsize>,
    /// Most watch streams.
    pub max_watchers: usize,
}

fn count(what: &str, n: usize) -> Result<(), Status> {
    if n == 0 {
        return Err(Status::invalid_argument(format!("no {what} in the request")));
    }
    if n > MAX_ITEMS {
        return Err(Status::invalid_argument(format!("{n} {what} in one request; at most {MAX_ITEMS}")));
    }
    Ok(())
}

/// Longest task exit message accepted (bytes); the view keeps it as the job's error.
const MAX_TASK_MESSAGE: usize = 4096;

fn unknown_outcome(e: &NodeError) -> String {
    format!("outcome unknown: {e}; retrying the same proposal id is safe")
}

fn view_error(e: ViewError) -> Status {
    let msg = e.to_string();
    match e {
        ViewError::UnknownJob(_) | ViewError::UnknownServer(_) => Status::not_found(msg),
        ViewError::InvalidSpec(_) | ViewError::NeverFits(_) | ViewError::BadRequestId(_) => {
            Status::invalid_argument(msg)
        }
        _ => Status::failed_precondition(msg),
    }
}

/// An agent's address is `host:port`, at most 256 bytes, or empty.
fn check_agent_addr(a: &str) -> Result<(), Status> {
    if a.is_empty() {
        return Ok(());
    }
    let ok = a.len() <= 256 && a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if ok { Ok(()) } else { Err(Status::invalid_argument(format!("agent_addr `{a}` is not host:port"))) }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<v1::WatchEvent, Status>> + Send>>;

impl ViewService {
    async fn command(&self, cmd: Command) -> Result<(Outcome, u64), Status> {
        let (a, version) = self.node.ask(|r| NodeRequest::Commands(vec![(cmd, r)])).await?;
        match a {
            Answer::Applied(o) => Ok((o, version)),
            other => Err(Status::unavailable(format!("outcome unknown ({other:?}); check the job's state"))),
        }
    }

    async fn write_ended(&self, cmd: Command) -> Result<Response<v1::WriteResponse>, Status> {
        match self.command(cmd).await? {
            (Outcome::Ended(Ok(())), version) => Ok(Response::new(v1::WriteResponse { version })),
            (Outcome::Ended(Err(e)), _) => Err(view_error(e)),
            (o, _) => Err(Status::internal(format!("unexpected outcome {o:?}"))),
        }
    }
}

#[tonic::async_trait]
impl v1::view_server::View for ViewService {
    async fn status(&self, _req: Request<v1::StatusRequest>) -> Result<Response<v1::StatusResponse>, Status> {
        let s = self.node.ask(NodeRequest::Status).await?;
        Ok(Response::new(v1::StatusResponse {
            replica: s.id,
            cluster: self.cluster.clone(),
            role: s.role,
            leader: s.leader,
            leader_addr: self.node.addr_of(s.leader).unwrap_or_default(),
            term: s.term,
            applied_index: s.applied,
            version: s.version,
            voters: s.voters,
            log_entries: s.log_entries,
            state_hash: s.state_hash,
            scheduler_hosts: s
                .scheduler_hosts
                .into_iter()
                .map(|(host, jobs)| v1::SchedulerHostInfo { host, jobs: jobs.into_iter().map(|j| j.0).collect() })
                .collect(),
        }))
    }

    async fn snapshot(&self, req: Request<v1::ReadRequest>) -> Result<Response<v1::SnapshotResponse>, Status> {
        let linearizable = req.into_inner().linearizable;
        match self.node.ask(|reply| NodeRequest::Read { linearizable, what: ReadTarget::Snapshot, reply }).await? {
            ReadOut::Snapshot(s, applied) => {
                Ok(Response::new(v1::SnapshotResponse { snapshot: Some(*s), applied_index: applied }))
            }
            ReadOut::Job(..) => Err(Status::internal("wrong read answer")),
        }
    }

    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<v1::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let mut from = req.into_inner().from_version;
        let n = self.watchers.fetch_add(1, Ordering::SeqCst);
        if n >= self.max_watchers {
            self.watchers.fetch_sub(1, Ordering::SeqCst);
            return Err(Status::resource_exhausted(format!("{n} watch streams open; at most {}", self.max_watchers)));
        }
        let (tx, rx) = mpsc::channel(16);
        let node = self.node.clone();
        let watchers = self.watchers.clone();
        tokio::spawn(async move {
            let mut version = node.version.clone();
            loop {
                if *version.borrow_and_update() != from {
                    let step = match node.ask(|r| NodeRequest::Delta(from, r)).await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = tx.send(Err(Status::from(e))).await;
                            break;
                        }
                    };
                    let ev = match step {
                        WatchStep::Delta(d) => {
                            from = d.to;
                            v1::watch_event::Event::Delta(d)
                        }
                        WatchStep::Snapshot(s) => {
                            from = s.version;
                            v1::watch_event::Event::Snapshot(*s)
                        }
                    };
                    // A slow reader blocks here; its next step covers everything since.
                    if tx.send(Ok(v1::WatchEvent { event: Some(ev) })).await.is_err() {
                        break;
                    }
                    continue;
                }
                tokio::select! {
                    changed = version.changed() => if changed.is_err() { break },
                    () = tx.closed() => break,
                }
            }
            watchers.fetch_sub(1, Ordering::SeqCst);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn propose(&self, req: Request<v1::ProposeRequest>) -> Result<Response<v1::ProposeResponse>, Status> {
        let wire = req.into_inner().proposals;
        count("proposals", wire.len())?;
        let mut items = Vec::with_capacity(wire.len());
        let mut waits = Vec::with_capacity(wire.len());
        for (i, p) in wire.into_iter().enumerate() {
            let p = Proposal::try_from(p).map_err(|e| Status::invalid_argument(format!("proposals[{i}]: {e}")))?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            items.push((p, tx));
            waits.push(rx);
        }
        self.node.send(NodeRequest::Propose(items))?;
        let mut results = Vec::with_capacity(waits.len());
        for rx in waits {
            let r = match self.node.wait(rx).await {
                Ok((Answer::Applied(Outcome::Decided(ds)), _)) if ds.len() == 1 => {
                    v1::ProposeResult { decision: Some(v1::Decision::from(&ds[0])), unknown: String::new() }
                }
                Ok((Answer::Immediate(d), _)) => {
                    v1::ProposeResult { decision: Some(v1::Decision::from(&d)), unknown: String::new() }
                }
                Ok((other, _)) => v1::ProposeResult {
                    decision: None,
                    unknown: unknown_outcome(&NodeError::Stopped(format!("{other:?}"))),
                },
                // Every proposal of one request meets the same leader: refuse the request.
                Err(e @ NodeError::NotLeader { .. }) => return Err(e.into()),
                Err(e) => v1::ProposeResult { decision: None, unknown: unknown_outcome(&e) },
            };
            results.push(r);
        }
        Ok(Response::new(v1::ProposeResponse { results }))
    }

    async fn migrate(&self, req: Request<v1::ProposeRequest>) -> Result<Response<v1::ProposeResponse>, Status> {
        let wire = req.into_inner().proposals;
        count("moves", wire.len())?;
        let mut moves = Vec::with_capacity(wire.len());
        for (i, p) in wire.into_iter().enumerate() {
            moves.push(Proposal::try_from(p).map_err(|e| Status::invalid_argument(format!("proposals[{i}]: {e}")))?);
        }
        let n = moves.len();
        // The moves travel as one command (one log entry) and are decided one by one when it
        // is applied; each is atomic on its own (see `ClusterView::migrate`).
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.node.send(NodeRequest::Commands(vec![(Command::Migrate(moves), tx)]))?;
        let unknown = |why: String| vec![v1::ProposeResult { decision: None, unknown: why }; n];
        let results = match self.node.wait(rx).await {
            Ok((Answer::Applied(Outcome::Decided(ds)), _)) if ds.len() == n => ds
                .iter()
                .map(|d| v1::ProposeResult { decision: Some(v1::Decision::from(d)), unknown: String::new() })
                .collect(),
            Ok((other, _)) => unknown(unknown_outcome(&NodeError::Stopped(format!("{other:?}")))),
            Err(e @ NodeError::NotLeader { .. }) => return Err(e.into()),
            Err(e) => unknown(unknown_outcome(&e)),
        };
        Ok(Response::new(v1::ProposeResponse { results }))
    }

    async fn release(&self, req: Request<v1::ReleaseRequest>) -> Result<Response<v1::WriteResponse>, Status> {
        let r = req.into_inner();
        self.write_ended(Command::Release { job: JobId(r.job), failed: r.failed }).await
    }

    async fn submit_job(&self, req: Request<v1::SubmitJobRequest>) -> Result<Response<v1::SubmitJobResponse>, Status> {
        let req = req.into_inner();
        count("job specs", req.specs.len())?;
        let request = if req.request_id.is_empty() {
            None
        } else {
            let id = RequestId::new(req.request_id)
                .map_err(|e| Status::invalid_argument(format!("SubmitJobRequest.request_id: {e}")))?;
            Some(id)
        };
        let mut items = Vec::with_capacity(req.specs.len());
        let mut waits = Vec::with_capacity(req.specs.len());
        for (i, s) in req.specs.into_iter().enumerate() {
            let spec = JobSpec::try_from(s).map_err(|e| Status::invalid_argument(format!("specs[{i}]: {e}")))?;
            let request = match &request {
                Some(r) => Some(r.item(i).map_err(|e| Status::invalid_argument(format!("request_id: {e}")))?),
                None => None,
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            items.push((Command::Submit { spec, request }, tx));
            waits.push(rx);
        }
        // One queue slot for all: either every spec reaches the driver or none does.
        self.node.send(NodeRequest::Commands(items))?;
        let mut results = Vec::with_capacity(waits.len());
        let mut version = 0;
        for rx in waits {
            let r = match self.node.wait(rx).await {
                Ok((Answer::Applied(Outcome::Submitted(Ok(job))), v)) => {
                    version = version.max(v);
                    v1::SubmitResult::admitted(job)
                }
                Ok((Answer::Applied(Outcome::Submitted(Err(e))), _)) => v1::SubmitResult::refused(&e),
                // With a request id the whole request is safe to send again: the client retries
                // it (Unavailable) and gets the jobs already admitted back, never a second copy.
                Ok((other, _)) if request.is_some() => {
                    return Err(Status::unavailable(format!(
                        "outcome of submission {} unknown ({other:?}); retry with the same request id",
                        results.len()
                    )));
                }
                Err(NodeError::Timeout(why)) if request.is_some() => {
                    return Err(Status::unavailable(format!("{why}; retry with the same request id")));
                }
                Err(e) if request.is_some() => return Err(e.into()),
                Ok((other, _)) => v1::SubmitResult::outcome_unknown(format!("outcome unknown ({other:?})")),
                Err(e @ NodeError::NotLeader { .. }) if results.is_empty() => return Err(e.into()),
                Err(e) => v1::SubmitResult::outcome_unknown(format!("outcome unknown: {e}")),
            };
            results.push(r);
        }
        Ok(Response::new(v1::SubmitJobResponse { results, version }))
    }

    async fn cancel_job(&self, req: Request<v1::CancelJobRequest>) -> Result<Response<v1::WriteResponse>, Status> {
        let req = req.into_inner();
        if req.reason.len() > MAX_TASK_MESSAGE {
            return Err(Status::invalid_argument(format!(
                "CancelJobRequest.reason: {} bytes; at most {MAX_TASK_MESSAGE}",
                req.reason.len()
            )));
        }
        let reason = (!req.reason.is_empty()).then_some(req.reason);
        self.write_ended(Command::Cancel { job: JobId(req.job), reason }).await
    }

    async fn get_job(&self, req: Request<v1::GetJobRequest>) -> Result<Response<v1::GetJobResponse>, Status> {
        let r = req.into_inner();
        let what = ReadTarget::Job(JobId(r.job));
        match self.node.ask(|reply| NodeRequest::Read { linearizable: r.linearizable, what, reply }).await? {
            ReadOut::Job(Some(job), version) => Ok(Response::new(v1::GetJobResponse { job: Some(*job), version })),
            ReadOut::Job(None, version) => Err(Status::not_found(format!(
                "no job {} at version {version} (never submitted, or ended long ago)",
                r.job
            ))),
            ReadOut::Snapshot(..) => Err(Status::internal("wrong read answer")),
        }
    }

    async fn register_server(
        &self,
        req: Request<v1::RegisterServerRequest>,
    ) -> Result<Response<v1::LeaseResponse>, Status> {
        let r = req.into_inner();
        if r.name.is_empty() {
            return Err(Status::invalid_argument("server name is empty"));
        }
        let wire = r.topology.ok_or_else(|| Status::invalid_argument("topology is missing"))?;
        let topo = Topology::try_from(wire).map_err(|e| Status::invalid_argument(e.to_string()))?;
        check_agent_addr(&r.agent_addr)?;
        let (server, lease_ms) =
            self.node.ask(|reply| NodeRequest::Register(r.name, topo, r.agent_addr, reply)).await?;
        Ok(Response::new(v1::LeaseResponse { server: server.0, lease_ms }))
    }

    async fn heartbeat(&self, req: Request<v1::HeartbeatRequest>) -> Result<Response<v1::LeaseResponse>, Status> {
        let r = req.into_inner();
        let server = r.server;
        if !r.health_reasons.is_empty() {
            tracing::debug!(server, reasons = ?r.health_reasons, "agent reports unhealthy devices");
        }
        check_agent_addr(&r.agent_addr)?;
        let lease_ms =
            self.node.ask(|reply| NodeRequest::Heartbeat(ServerId(server), r.unhealthy, r.agent_addr, reply)).await?;
        Ok(Response::new(v1::LeaseResponse { server, lease_ms }))
    }

    async fn report_task(
        &self,
        req: Request<v1::ReportTaskRequest>,
    ) -> Result<Response<v1::ReportTaskResponse>, Status> {
        let r = req.into_inner();
        let event = match r.event {
            Some(v1::report_task_request::Event::Started(_)) => TaskEvent::Started,
            Some(v1::report_task_request::Event::Exited(e)) => {
                if e.message.len() > MAX_TASK_MESSAGE {
                    return Err(Status::invalid_argument(format!(
                        "exit message of {} bytes; at most {MAX_TASK_MESSAGE}",
                        e.message.len()
                    )));
                }
                TaskEvent::Exited { code: e.code, message: e.message }
            }
            None => return Err(Status::invalid_argument("ReportTaskRequest.event is missing")),
        };
        let cmd = Command::Task {
            job: JobId(r.job),
            proposal: ProposalId(r.proposal),
            member: r.member,
            server: ServerId(r.server),
            event,
        };
        match self.command(cmd).await? {
            (Outcome::TaskReported(Ok(state)), version) => {
                Ok(Response::new(v1::ReportTaskResponse { state: v1::JobState::from(state).into(), version }))
            }
            (Outcome::TaskReported(Err(e)), _) => Err(view_error(e)),
            (o, _) => Err(Status::internal(format!("unexpected outcome {o:?}"))),
        }
    }

    async fn adopt_jobs(&self, req: Request<v1::AdoptJobsRequest>) -> Result<Response<v1::AdoptJobsResponse>, Status> {
        let r = req.into_inner();
        if r.host.is_empty() || r.host.len() > 128 {
            return Err(Status::invalid_argument("AdoptJobsRequest.host: 1 to 128 bytes"));
        }
        if r.held.len() > crate::adoption::MAX_ADOPT || r.want as usize > crate::adoption::MAX_ADOPT {
            return Err(Status::invalid_argument(format!(
                "AdoptJobsRequest: at most {} held and wanted jobs",
                crate::adoption::MAX_ADOPT
            )));
        }
        let held: Vec<JobId> = r.held.iter().map(|&j| JobId(j)).collect();
        let (got, lease_ms, version) =
            self.node.ask(|reply| NodeRequest::AdoptJobs(r.host, held, r.want as usize, reply)).await?;
        let ids = |v: Vec<JobId>| v.into_iter().map(|j| j.0).collect();
        Ok(Response::new(v1::AdoptJobsResponse {
            kept: ids(got.kept),
            adopted: ids(got.adopted),
            dropped: ids(got.dropped),
            lease_ms,
            version,
        }))
    }

    async fn agents(&self, _req: Request<v1::AgentsRequest>) -> Result<Response<v1::AgentsResponse>, Status> {
        let list = self.node.ask(NodeRequest::Agents).await?;
        Ok(Response::new(v1::AgentsResponse {
            agents: list.into_iter().map(|(server, name, addr)| v1::AgentInfo { server, name, addr }).collect(),
        }))
    }

    async fn add_replica(
        &self,
        req: Request<v1::AddReplicaRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let r = req.into_inner();
        if r.id == 0 {
            return Err(Status::invalid_argument("replica ids start at 1"));
        }
        for a in [&r.addr, &r.raft_addr] {
            if (a == &r.addr || !a.is_empty()) && (!a.contains(':') || a.contains(' ') || a.len() > 256) {
                return Err(Status::invalid_argument(format!("`{a}` is not host:port")));
            }
        }
        let record = if r.raft_addr.is_empty() { r.addr } else { format!("{} {}", r.addr, r.raft_addr) };
        let voters = self.node.ask(|reply| NodeRequest::Membership(true, r.id, record, reply)).await?;
        Ok(Response::new(v1::MembershipResponse { voters }))
    }

    async fn remove_replica(
        &self,
        req: Request<v1::RemoveReplicaRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let id = req.into_inner().id;
        let voters = self.node.ask(|reply| NodeRequest::Membership(false, id, String::new(), reply)).await?;
        Ok(Response::new(v1::MembershipResponse { voters }))
    }
}
