//! The `View` gRPC service: converts and checks requests, asks the driver, converts answers.
//!
//! Every request is checked before it reaches the replica: counts bounded, wire values
//! converted with the validating `TryFrom`s of tessera-proto (a malformed message is
//! `INVALID_ARGUMENT` naming the field). Semantic refusals (an unknown job, server or device in a
//! proposal) come back as decisions with a reason, from the approver itself. Every failure is a
//! [`ViewServerError`], which becomes a status in one place (`crate::error`).
//!
//! Each handler runs in a span named after its method, with the ids its request carries (job,
//! server, proposal, replica) as fields; the hot ones (proposals, heartbeats, task reports, reads)
//! at debug level, the rare ones (registration, membership) at info. A watch logs nothing per
//! event.

use crate::authz::{Action, AuditLog};
use crate::error::{ViewServerError, chain};
use crate::node::{NodeHandle, NodeRequest, ReadOut, ReadTarget, WatchStep};
use std::pin::Pin;
use std::sync::Arc;
use tessera_proto::tls::{Role, Security};
use tessera_proto::trace;
use tessera_proto::v1;
use tessera_replica::Answer;
use tessera_view::{
    Command, JobId, JobSpec, MemberPlacement, Outcome, Preemption, Proposal, ProposalId, RequestId, ServerId,
    TaskEvent, Topology,
};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::field::Empty;
use tracing::{Instrument, Span, instrument};

mod guard;
mod requests;

use guard::Scope;
use requests::check_agent_addr;
pub use requests::{MAX_DRAIN_TIMEOUT_S, cordon_command, layout_command, policy_command, user_name};

/// Most proposals or job specs in one request.
pub const MAX_ITEMS: usize = 1024;
// Every plan the migration planner makes fits one request.
const _: () = assert!(tessera_view::migration_planner::MAX_MOVES <= MAX_ITEMS);

/// The service.
#[derive(Debug)]
pub struct ViewService {
    /// The driver.
    pub node: NodeHandle,
    /// Cluster identity, for Status.
    pub cluster: String,
    /// Watch streams open now, bounded per replica and per caller.
    pub watchers: Arc<crate::watchers::Watchers>,
    /// How callers are authenticated.
    pub security: Security,
    /// Refusals and admin actions.
    pub audit: Arc<AuditLog>,
    /// Per-caller request rates.
    pub limiter: Arc<std::sync::Mutex<crate::authz::RateLimiter>>,
    /// What Propose, Migrate and Preempt answered, for `/metrics`.
    pub approvals: Arc<crate::http::metrics::ApprovalMetrics>,
}

fn count(what: &str, n: usize) -> Result<(), ViewServerError> {
    if n == 0 {
        return Err(ViewServerError::Invalid(format!("no {what} in the request")));
    }
    at_most(what, n)
}

/// At most [`MAX_ITEMS`] of `what` (none is fine).
fn at_most(what: &str, n: usize) -> Result<(), ViewServerError> {
    if n > MAX_ITEMS {
        return Err(ViewServerError::Invalid(format!("{n} {what} in one request; at most {MAX_ITEMS}")));
    }
    Ok(())
}

/// Longest task exit message accepted (bytes); the view keeps it as the job's error.
pub const MAX_TASK_MESSAGE: usize = 4096;

/// Runs an approval call (`Propose`, `Migrate`, `Preempt`) under a `view.approve` span that
/// continues the caller's trace (`caller`, from its metadata), when there is one (a scheduler
/// host sends the trace of the job it places); a call from outside any trace is not traced.
/// The span names the first proposal (`first`: job, proposal id) and records its outcome. It
/// times the call without being entered, so the handler's own span keeps its fields in logs.
async fn traced_approval(
    call: &'static str,
    caller: Option<trace::Context>,
    first: Option<(u64, u64)>,
    work: impl Future<Output = Result<Response<v1::ProposeResponse>, Status>>,
) -> Result<Response<v1::ProposeResponse>, Status> {
    let Some(cx) = caller else { return work.await };
    let span = tracing::info_span!(target: trace::TARGET, "view.approve", call, job_id = Empty, proposal = Empty, outcome = Empty);
    trace::set_parent(&span, cx);
    if let Some((job, proposal)) = first {
        span.record("job_id", job).record("proposal", proposal);
    }
    let answer = work.await;
    let outcome = match &answer {
        Ok(r) => r.get_ref().results.first().map_or("none", |r| crate::http::metrics::outcome_of(r).0),
        Err(_) => "failed",
    };
    span.record("outcome", outcome);
    answer
}

/// The job and id of a request's first proposal, for its span.
fn first_proposal(r: &v1::ProposeRequest) -> Option<(u64, u64)> {
    r.proposals.first().map(|p| (p.job, p.id))
}

/// The result of one decided command (a proposal or a preemption): its decision, or why its
/// outcome is unknown; a follower's refusal is the request's error (retry at the leader).
fn one_decision(answer: Result<(Answer, u64), ViewServerError>) -> Result<v1::ProposeResult, Status> {
    let decided = |d: &tessera_view::Decision| v1::ProposeResult { decision: Some(d.into()), unknown: String::new() };
    Ok(match answer {
        Ok((Answer::Applied(Outcome::Decided(ds)), _)) if ds.len() == 1 => decided(&ds[0]),
        Ok((Answer::Immediate(d), _)) => decided(&d),
        Ok((other, _)) => v1::ProposeResult {
            decision: None,
            unknown: unknown_outcome(&ViewServerError::Stopped(format!("{other:?}"))),
        },
        Err(e @ ViewServerError::NotLeader { .. }) => return Err(e.into()),
        Err(e) => v1::ProposeResult { decision: None, unknown: unknown_outcome(&e) },
    })
}

fn unknown_outcome(e: &ViewServerError) -> String {
    format!("outcome unknown: {}; retrying the same proposal id is safe", chain(e))
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<v1::WatchEvent, Status>> + Send>>;

impl ViewService {
    async fn command(&self, cmd: Command) -> Result<(Outcome, u64), ViewServerError> {
        let (a, version) = self.node.ask(|r| NodeRequest::Commands(vec![(cmd, r)])).await?;
        match a {
            Answer::Applied(o) => Ok((o, version)),
            other => {
                Err(ViewServerError::OutcomeUnknown(format!("outcome unknown ({other:?}); check the job's state")))
            }
        }
    }

    async fn write_ended(&self, cmd: Command) -> Result<Response<v1::WriteResponse>, Status> {
        match self.command(cmd).await? {
            (Outcome::Ended(Ok(())), version) => Ok(Response::new(v1::WriteResponse { version })),
            (Outcome::Ended(Err(e)), _) => Err(ViewServerError::View(e).into()),
            (o, _) => Err(ViewServerError::Internal(format!("unexpected outcome {o:?}")).into()),
        }
    }

    /// `Propose`; the caller counts its answer.
    async fn propose_call(&self, req: Request<v1::ProposeRequest>) -> Result<Response<v1::ProposeResponse>, Status> {
        let who = self.caller(&req, "Propose")?;
        let wire = req.into_inner().proposals;
        count("proposals", wire.len())?;
        self.allow_schedule(&who, "Propose", wire.iter().map(|p| JobId(p.job)).collect(), Scope::Pending).await?;
        if let [p] = wire.as_slice() {
            Span::current().record("job_id", p.job).record("proposal", p.id);
        }
        let mut items = Vec::with_capacity(wire.len());
        let mut waits = Vec::with_capacity(wire.len());
        for (i, p) in wire.into_iter().enumerate() {
            let p = Proposal::try_from(p).map_err(|e| ViewServerError::Invalid(format!("proposals[{i}]: {e}")))?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            items.push((p, tx));
            waits.push(rx);
        }
        self.node.send(NodeRequest::Propose(items))?;
        let mut results = Vec::with_capacity(waits.len());
        for rx in waits {
            // Every proposal of one request meets the same leader: a follower refuses the request.
            results.push(one_decision(self.node.wait(rx).await)?);
        }
        Ok(Response::new(v1::ProposeResponse { results }))
    }

    /// `Migrate`; the caller counts its answer.
    async fn migrate_call(&self, req: Request<v1::ProposeRequest>) -> Result<Response<v1::ProposeResponse>, Status> {
        let who = self.caller(&req, "Migrate")?;
        let v1::ProposeRequest { proposals: wire, for_job, target } = req.into_inner();
        count("moves", wire.len())?;
        // The target is one gang's placement: as many members as a job may have.
        if target.len() > tessera_view::job::MAX_MEMBERS as usize {
            let max = tessera_view::job::MAX_MEMBERS;
            return Err(
                ViewServerError::Invalid(format!("{} target members; a gang has at most {max}", target.len())).into()
            );
        }
        // The moves are for the held pending job they make room for; naming none, a scheduler
        // host is refused by the moves' check (job 0 never exists). A job no longer pending is
        // no host's: the check then lets through only a resend of moves that were all applied,
        // which changes nothing (`AlreadyApplied`), as a resent proposal is let through.
        let for_job = JobId(for_job.unwrap_or(0));
        self.allow_schedule(&who, "Migrate", vec![for_job], Scope::Pending).await?;
        if let [p] = wire.as_slice() {
            Span::current().record("job_id", p.job).record("proposal", p.id);
        }
        let mut moves = Vec::with_capacity(wire.len());
        for (i, p) in wire.into_iter().enumerate() {
            moves.push(Proposal::try_from(p).map_err(|e| ViewServerError::Invalid(format!("proposals[{i}]: {e}")))?);
        }
        // And they must help that job to its target (see `tessera_view::migration_check`).
        let target: Vec<MemberPlacement> = target.into_iter().map(MemberPlacement::from).collect();
        self.allow_moves(&who, for_job, target, &moves).await?;
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
            Ok((other, _)) => unknown(unknown_outcome(&ViewServerError::Stopped(format!("{other:?}")))),
            Err(e @ ViewServerError::NotLeader { .. }) => return Err(e.into()),
            Err(e) => unknown(unknown_outcome(&e)),
        };
        Ok(Response::new(v1::ProposeResponse { results }))
    }

    /// `SubmitJob`, in the admission's `span`: the jobs are admitted under `admission`.
    async fn submit_job_call(
        &self,
        req: Request<v1::SubmitJobRequest>,
        admission: tessera_view::JobTrace,
        span: &Span,
    ) -> Result<Response<v1::SubmitJobResponse>, Status> {
        let who = self.caller(&req, "SubmitJob")?;
        let req = req.into_inner();
        count("job specs", req.specs.len())?;
        let request = if req.request_id.is_empty() {
            None
        } else {
            let id = RequestId::new(req.request_id)
                .map_err(|e| ViewServerError::Invalid(format!("SubmitJobRequest.request_id: {e}")))?;
            Some(id)
        };
        let mut items = Vec::with_capacity(req.specs.len());
        let mut waits = Vec::with_capacity(req.specs.len());
        let mut specs = Vec::with_capacity(req.specs.len());
        for (i, s) in req.specs.into_iter().enumerate() {
            let mut spec = JobSpec::try_from(s).map_err(|e| ViewServerError::Invalid(format!("specs[{i}]: {e}")))?;
            // Tenants come from the identity: a user of one tenant who names none submits for it.
            if let [only] = who.tenants.as_slice()
                && spec.tenant == tessera_view::DEFAULT_TENANT
            {
                spec.tenant = only.clone();
            }
            // A spec that names its model and declares no losses is admitted with the model's,
            // written into the entry: replicas never read the compiled-in table at apply.
            if let Some(slowdown) = tessera_view::SpeedModel::shipped().default_slowdown(&spec) {
                spec.slowdown = slowdown;
            }
            specs.push(spec);
        }
        let tenants = specs.iter().map(|s| s.tenant.as_str()).collect();
        let user = user_name(&who);
        self.allow(&who, "SubmitJob", String::new, Action::Submit { tenants })?;
        for (i, spec) in specs.into_iter().enumerate() {
            let request = match &request {
                Some(r) => Some(r.item(i).map_err(|e| ViewServerError::Invalid(format!("request_id: {e}")))?),
                None => None,
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            items.push((
                Command::Submit { spec: Box::new(spec), request, user: Some(user.clone()), trace: Some(admission) },
                tx,
            ));
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
                    return Err(ViewServerError::OutcomeUnknown(format!(
                        "outcome of submission {} unknown ({other:?}); retry with the same request id",
                        results.len()
                    ))
                    .into());
                }
                Err(e @ ViewServerError::Timeout { .. }) if request.is_some() => {
                    return Err(ViewServerError::OutcomeUnknown(format!("{e}; retry with the same request id")).into());
                }
                Err(e) if request.is_some() => return Err(e.into()),
                Ok((other, _)) => v1::SubmitResult::outcome_unknown(format!("outcome unknown ({other:?})")),
                Err(e @ ViewServerError::NotLeader { .. }) if results.is_empty() => return Err(e.into()),
                Err(e) => v1::SubmitResult::outcome_unknown(format!("outcome unknown: {}", chain(&e))),
            };
            results.push(r);
        }
        if let Some(first) = results.iter().find(|r| r.job != 0) {
            span.record("job_id", first.job);
        }
        Ok(Response::new(v1::SubmitJobResponse { results, version }))
    }

    /// `Preempt`; the caller counts its answer.
    async fn preempt_call(&self, req: Request<v1::PreemptRequest>) -> Result<Response<v1::ProposeResponse>, Status> {
        let who = self.caller(&req, "Preempt")?;
        let wire = req.into_inner().preemption.ok_or_else(|| ViewServerError::Invalid("preemption: missing".into()))?;
        let pre = Preemption::try_from(wire).map_err(|e| ViewServerError::Invalid(format!("preemption: {e}")))?;
        Span::current()
            .record("job_id", pre.proposal.job.0)
            .record("proposal", pre.proposal.id.0)
            .record("victims", pre.victims.len());
        self.allow_schedule(&who, "Preempt", vec![pre.proposal.job], Scope::Pending).await?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.node.send(NodeRequest::Commands(vec![(Command::Preempt(pre), tx)]))?;
        let result = one_decision(self.node.wait(rx).await)?;
        Ok(Response::new(v1::ProposeResponse { results: vec![result] }))
    }
}

#[tonic::async_trait]
impl v1::view_server::View for ViewService {
    #[instrument(level = "debug", skip_all)]
    async fn status(&self, req: Request<v1::StatusRequest>) -> Result<Response<v1::StatusResponse>, Status> {
        self.admit(&req, "Status", Action::Status)?;
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

    #[instrument(level = "debug", skip_all, fields(linearizable = req.get_ref().linearizable))]
    async fn snapshot(&self, req: Request<v1::ReadRequest>) -> Result<Response<v1::SnapshotResponse>, Status> {
        self.admit(&req, "Snapshot", Action::ReadView)?;
        let linearizable = req.into_inner().linearizable;
        match self.node.ask(|reply| NodeRequest::Read { linearizable, what: ReadTarget::Snapshot, reply }).await? {
            ReadOut::Snapshot(s, applied) => {
                Ok(Response::new(v1::SnapshotResponse { snapshot: Some(*s), applied_index: applied }))
            }
            _ => Err(ViewServerError::Internal("wrong read answer".into()).into()),
        }
    }

    type WatchStream = WatchStream;

    /// The span covers opening the stream; the stream's task logs nothing per event.
    ///
    /// A replica that knows no leader refuses a new watch, and ends its streams once it has
    /// known none for [`NodeHandle::leaderless_grace`](crate::node::NodeHandle): cut off from
    /// the others, it would keep its watchers on a view that no longer moves (an agent would
    /// never see the placements it must start). `UNAVAILABLE` sends the client to another
    /// replica.
    #[instrument(level = "debug", skip_all, fields(from_version = req.get_ref().from_version))]
    async fn watch(&self, req: Request<v1::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let who = self.admit(&req, "Watch", Action::ReadView)?;
        let mut from = req.into_inner().from_version;
        if *self.node.leader.borrow() == 0 {
            return Err(Status::unavailable(
                "this replica knows no leader (an election, or cut off from the others): watch another",
            ));
        }
        let slot = self.watchers.open(&who).map_err(|why| {
            tracing::debug!(%who, %why, "watch refused");
            Status::from(ViewServerError::Busy(why))
        })?;
        let (tx, rx) = mpsc::channel(16);
        let node = self.node.clone();
        tokio::spawn(async move {
            // Held while the stream runs; given back when this task ends.
            let _slot = slot;
            let mut version = node.version.clone();
            let mut leader = node.leader.clone();
            // Since when this replica has known no leader, while it knows none.
            let mut leaderless: Option<tokio::time::Instant> = None;
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
                            v1::watch_event::Event::Snapshot(Arc::unwrap_or_clone(s))
                        }
                    };
                    // A slow reader blocks here; its next step covers everything since.
                    if tx.send(Ok(v1::WatchEvent { event: Some(ev) })).await.is_err() {
                        break;
                    }
                    continue;
                }
                let deadline = leaderless.map(|t| t + node.leaderless_grace);
                tokio::select! {
                    changed = version.changed() => if changed.is_err() { break },
                    changed = leader.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let known = *leader.borrow_and_update() != 0;
                        leaderless = match (known, leaderless) {
                            (true, _) => None,
                            (false, None) => Some(tokio::time::Instant::now()),
                            (false, since) => since,
                        };
                    }
                    () = async { tokio::time::sleep_until(deadline.expect("armed")).await }, if deadline.is_some() => {
                        let why = format!(
                            "this replica has known no leader for {} ms (cut off from the others?): watch another",
                            node.leaderless_grace.as_millis()
                        );
                        let _ = tx.send(Err(Status::unavailable(why))).await;
                        break;
                    }
                    () = tx.closed() => break,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    /// A request of one proposal names its job and proposal in the span; a batch, its size.
    #[instrument(
        level = "debug",
        skip_all,
        fields(proposals = req.get_ref().proposals.len(), job_id = Empty, proposal = Empty)
    )]
    async fn propose(&self, req: Request<v1::ProposeRequest>) -> Result<Response<v1::ProposeResponse>, Status> {
        let start = std::time::Instant::now();
        let answer = traced_approval(
            "Propose",
            trace::remote(req.metadata()),
            first_proposal(req.get_ref()),
            self.propose_call(req),
        )
        .await;
        self.approvals.observe("propose", &answer, start.elapsed());
        answer
    }

    #[instrument(
        level = "debug",
        skip_all,
        fields(moves = req.get_ref().proposals.len(), job_id = Empty, proposal = Empty)
    )]
    async fn migrate(&self, req: Request<v1::ProposeRequest>) -> Result<Response<v1::ProposeResponse>, Status> {
        let start = std::time::Instant::now();
        let answer = traced_approval(
            "Migrate",
            trace::remote(req.metadata()),
            first_proposal(req.get_ref()),
            self.migrate_call(req),
        )
        .await;
        self.approvals.observe("migrate", &answer, start.elapsed());
        answer
    }

    /// The span names the preemptor, its proposal and how many victims it displaces.
    #[instrument(level = "debug", skip_all, fields(job_id = Empty, proposal = Empty, victims = Empty))]
    async fn preempt(&self, req: Request<v1::PreemptRequest>) -> Result<Response<v1::ProposeResponse>, Status> {
        let start = std::time::Instant::now();
        let answer = traced_approval(
            "Preempt",
            trace::remote(req.metadata()),
            req.get_ref().preemption.as_ref().and_then(|p| p.proposal.as_ref()).map(|p| (p.job, p.id)),
            self.preempt_call(req),
        )
        .await;
        self.approvals.observe("preempt", &answer, start.elapsed());
        answer
    }

    #[instrument(level = "debug", skip_all, fields(job_id = req.get_ref().job, failed = req.get_ref().failed))]
    async fn release(&self, req: Request<v1::ReleaseRequest>) -> Result<Response<v1::WriteResponse>, Status> {
        let who = self.caller(&req, "Release")?;
        let r = req.into_inner();
        self.allow_schedule(&who, "Release", vec![JobId(r.job)], Scope::All).await?;
        self.write_ended(Command::Release { job: JobId(r.job), failed: r.failed }).await
    }

    /// The span names the request id (the Idempotency-Key) and how many specs it submits.
    #[instrument(
        level = "debug",
        skip_all,
        fields(specs = req.get_ref().specs.len(), request_id = %req.get_ref().request_id)
    )]
    async fn submit_job(&self, req: Request<v1::SubmitJobRequest>) -> Result<Response<v1::SubmitJobResponse>, Status> {
        // The admission's span continues the caller's trace; the jobs remember it, so what is
        // done for them later (placement, approval, task starts) joins the same trace.
        let span = tracing::info_span!(target: trace::TARGET, "view.submit", specs = req.get_ref().specs.len(), job_id = Empty);
        let remote = trace::remote(req.metadata());
        if let Some(cx) = remote.clone() {
            trace::set_parent(&span, cx);
        }
        let admission = trace::admission_trace(&span, remote.as_ref());
        self.submit_job_call(req, admission, &span).instrument(span.clone()).await
    }

    #[instrument(level = "debug", skip_all, fields(job_id = req.get_ref().job))]
    async fn cancel_job(&self, req: Request<v1::CancelJobRequest>) -> Result<Response<v1::WriteResponse>, Status> {
        let who = self.caller(&req, "CancelJob")?;
        let req = req.into_inner();
        if who.role == Role::User {
            // An unknown job is the view's refusal (NOT_FOUND) for everyone alike.
            if let Some(tenant) = self.tenant_of(req.job).await? {
                self.allow(&who, "CancelJob", || format!("job {}", req.job), Action::Cancel { tenant: &tenant })?;
            }
        } else {
            self.allow(&who, "CancelJob", String::new, Action::Cancel { tenant: "" })?;
        }
        if req.reason.len() > MAX_TASK_MESSAGE {
            return Err(ViewServerError::Invalid(format!(
                "CancelJobRequest.reason: {} bytes; at most {MAX_TASK_MESSAGE}",
                req.reason.len()
            ))
            .into());
        }
        if let Some(g) = req.grace_s
            && g > tessera_view::job::MAX_STOP_GRACE_S
        {
            return Err(ViewServerError::Invalid(format!(
                "CancelJobRequest.grace_s: {g} s; at most {}",
                tessera_view::job::MAX_STOP_GRACE_S
            ))
            .into());
        }
        let reason = (!req.reason.is_empty()).then_some(req.reason);
        self.write_ended(Command::Cancel { job: JobId(req.job), reason, grace_s: req.grace_s }).await
    }

    /// An operator's command: logged at info with the server, the action and the reason.
    #[instrument(level = "info", skip_all, fields(server = req.get_ref().server, action = Empty))]
    async fn cordon_server(
        &self,
        req: Request<v1::CordonServerRequest>,
    ) -> Result<Response<v1::WriteResponse>, Status> {
        let who = self.caller(&req, "CordonServer")?;
        let r = req.into_inner();
        let detail = || format!("server {} action {} reason {:?}", r.server, r.action, r.reason);
        self.allow(&who, "CordonServer", detail, Action::Cordon)?;
        let cmd = cordon_command(&r, crate::node::unix_ms())?;
        Span::current().record("action", v1::CordonAction::try_from(r.action).map_or("?", |a| a.as_str_name()));
        tracing::info!(reason = %r.reason, drain_timeout_s = r.drain_timeout_s, "server cordon change");
        match self.command(cmd).await? {
            (Outcome::HealthSet(Ok(_)), version) => Ok(Response::new(v1::WriteResponse { version })),
            (Outcome::HealthSet(Err(e)), _) => Err(ViewServerError::View(e).into()),
            (o, _) => Err(ViewServerError::Internal(format!("unexpected outcome {o:?}")).into()),
        }
    }

    /// An operator's layout change: logged at info with what it did.
    #[instrument(level = "info", skip_all)]
    async fn change_layout(&self, req: Request<v1::LayoutRequest>) -> Result<Response<v1::LayoutResponse>, Status> {
        let who = self.caller(&req, "ChangeLayout")?;
        let r = req.into_inner();
        let detail = || format!("{:?}", r.change);
        self.allow(&who, "ChangeLayout", detail, Action::Layout)?;
        let cmd = layout_command(&r, crate::node::unix_ms())?;
        match self.command(cmd).await? {
            (Outcome::Layout(Ok(c)), version) => {
                tracing::info!(version, config_set = ?c.config_set, servers = ?c.names, "layout changed");
                Ok(Response::new(v1::LayoutResponse {
                    version,
                    config_set: c.config_set.map(|cs| u32::from(cs.0)),
                    servers: c.servers.iter().map(|s| s.0).collect(),
                    names: c.names,
                }))
            }
            (Outcome::Layout(Err(e)), _) => Err(ViewServerError::View(e).into()),
            (o, _) => Err(ViewServerError::Internal(format!("unexpected outcome {o:?}")).into()),
        }
    }

    async fn set_policy(&self, req: Request<v1::PolicyRequest>) -> Result<Response<v1::WriteResponse>, Status> {
        let who = self.caller(&req, "SetPolicy")?;
        let r = req.into_inner();
        let detail = || format!("{:?}", r.change);
        self.allow(&who, "SetPolicy", detail, Action::Policy)?;
        let cmd = policy_command(&r)?;
        match self.command(cmd.clone()).await? {
            (Outcome::Policy(Ok(())), version) => {
                tracing::info!(version, change = ?cmd, "policy changed");
                Ok(Response::new(v1::WriteResponse { version }))
            }
            (Outcome::Policy(Err(e)), _) => Err(ViewServerError::View(e).into()),
            (o, _) => Err(ViewServerError::Internal(format!("unexpected outcome {o:?}")).into()),
        }
    }

    #[instrument(level = "info", skip_all, fields(role = %req.get_ref().role, name = %req.get_ref().name))]
    async fn issue_token(
        &self,
        req: Request<v1::IssueTokenRequest>,
    ) -> Result<Response<v1::IssueTokenResponse>, Status> {
        let who = self.caller(&req, "IssueToken")?;
        let r = req.into_inner();
        let detail = || format!("a token for {} `{}` (tenants {:?}), {} s", r.role, r.name, r.tenants, r.ttl_s);
        self.allow(&who, "IssueToken", detail, Action::IssueToken)?;
        let bad = |e: String| ViewServerError::Invalid(format!("IssueTokenRequest: {e}"));
        let role = Role::parse(&r.role).map_err(|e| bad(e.to_string()))?;
        let id = tessera_proto::tls::Identity::new(role, &r.name, &r.tenants).map_err(|e| bad(e.to_string()))?;
        let m = match self.security.tls() {
            Some(tls) => tls.current(),
            None => {
                return Err(ViewServerError::Precondition(
                    "this replica runs --insecure: it has no key to sign tokens with".into(),
                )
                .into());
            }
        };
        let (Some(cert), Some(key)) = (&m.cert_pem, &m.key_pem) else {
            return Err(
                ViewServerError::Precondition("this replica has no certificate to sign tokens with".into()).into()
            );
        };
        let now = tessera_proto::tls::unix_s();
        let token = tessera_proto::tls::token::issue(cert, key, &id, now, r.ttl_s).map_err(|e| bad(e.to_string()))?;
        let signer = m.identity.as_ref().map(|i| i.name.clone()).unwrap_or_default();
        tracing::info!(caller = %who, identity = %id, ttl_s = r.ttl_s, signer, "token issued");
        Ok(Response::new(v1::IssueTokenResponse { token, expires_s: now + r.ttl_s, signer }))
    }

    #[instrument(level = "debug", skip_all, fields(job_id = req.get_ref().job))]
    async fn get_job(&self, req: Request<v1::GetJobRequest>) -> Result<Response<v1::GetJobResponse>, Status> {
        let who = self.caller(&req, "GetJob")?;
        let r = req.into_inner();
        let what = ReadTarget::JobExplained(JobId(r.job));
        match self.node.ask(|reply| NodeRequest::Read { linearizable: r.linearizable, what, reply }).await? {
            ReadOut::Job(Some(job), waiting, version) => {
                let tenant = job.spec.as_ref().map_or("", |s| s.tenant.as_str());
                self.allow(&who, "GetJob", || format!("job {}", r.job), Action::ReadJob { tenant })?;
                Ok(Response::new(v1::GetJobResponse { job: Some(*job), version, waiting }))
            }
            ReadOut::Job(None, _, version) => Err(ViewServerError::NotFound(format!(
                "no job {} at version {version} (never submitted, or ended long ago)",
                r.job
            ))
            .into()),
            _ => Err(ViewServerError::Internal("wrong read answer".into()).into()),
        }
    }

    /// The span names the server by name, and by id once the view has answered.
    #[instrument(level = "info", skip_all, fields(name = %req.get_ref().name, server = Empty))]
    async fn register_server(
        &self,
        req: Request<v1::RegisterServerRequest>,
    ) -> Result<Response<v1::LeaseResponse>, Status> {
        let who = self.caller(&req, "RegisterServer")?;
        let r = req.into_inner();
        self.allow(&who, "RegisterServer", || format!("server `{}`", r.name), Action::Agent { server: &r.name })?;
        if r.name.is_empty() {
            return Err(ViewServerError::Invalid("server name is empty".into()).into());
        }
        let wire = r.topology.ok_or_else(|| ViewServerError::Invalid("topology is missing".into()))?;
        let topo = Topology::try_from(wire).map_err(|e| ViewServerError::Invalid(e.to_string()))?;
        check_agent_addr(&r.agent_addr)?;
        let (server, lease_ms) =
            self.node.ask(|reply| NodeRequest::Register(r.name, topo, r.agent_addr, reply)).await?;
        Span::current().record("server", server.0);
        Ok(Response::new(v1::LeaseResponse { server: server.0, lease_ms }))
    }

    #[instrument(level = "debug", skip_all, fields(server = req.get_ref().server))]
    async fn heartbeat(&self, req: Request<v1::HeartbeatRequest>) -> Result<Response<v1::LeaseResponse>, Status> {
        let who = self.caller(&req, "Heartbeat")?;
        let r = req.into_inner();
        self.allow_agent(&who, "Heartbeat", r.server).await?;
        let server = r.server;
        if !r.health_reasons.is_empty() {
            tracing::debug!(reasons = ?r.health_reasons, "agent reports unhealthy devices");
        }
        check_agent_addr(&r.agent_addr)?;
        let lease_ms =
            self.node.ask(|reply| NodeRequest::Heartbeat(ServerId(server), r.unhealthy, r.agent_addr, reply)).await?;
        Ok(Response::new(v1::LeaseResponse { server, lease_ms }))
    }

    #[instrument(
        level = "debug",
        skip_all,
        fields(
            job_id = req.get_ref().job,
            proposal = req.get_ref().proposal,
            member = req.get_ref().member,
            server = req.get_ref().server
        )
    )]
    async fn report_task(
        &self,
        req: Request<v1::ReportTaskRequest>,
    ) -> Result<Response<v1::ReportTaskResponse>, Status> {
        let who = self.caller(&req, "ReportTask")?;
        let r = req.into_inner();
        self.allow_agent(&who, "ReportTask", r.server).await?;
        let event = match r.event {
            Some(v1::report_task_request::Event::Started(_)) => TaskEvent::Started,
            Some(v1::report_task_request::Event::Exited(e)) => {
                if e.message.len() > MAX_TASK_MESSAGE {
                    return Err(ViewServerError::Invalid(format!(
                        "exit message of {} bytes; at most {MAX_TASK_MESSAGE}",
                        e.message.len()
                    ))
                    .into());
                }
                TaskEvent::Exited { code: e.code, message: e.message }
            }
            None => return Err(ViewServerError::Invalid("ReportTaskRequest.event is missing".into()).into()),
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
            (Outcome::TaskReported(Err(e)), _) => Err(ViewServerError::View(e).into()),
            (o, _) => Err(ViewServerError::Internal(format!("unexpected outcome {o:?}")).into()),
        }
    }

    #[instrument(
        level = "debug",
        skip_all,
        fields(host = %req.get_ref().host, held = req.get_ref().held.len(), want = req.get_ref().want)
    )]
    async fn adopt_jobs(&self, req: Request<v1::AdoptJobsRequest>) -> Result<Response<v1::AdoptJobsResponse>, Status> {
        let who = self.caller(&req, "AdoptJobs")?;
        let r = req.into_inner();
        self.allow(&who, "AdoptJobs", || format!("host `{}`", r.host), Action::Adopt { host: &r.host })?;
        if r.host.is_empty() || r.host.len() > 128 {
            return Err(ViewServerError::Invalid("AdoptJobsRequest.host: 1 to 128 bytes".into()).into());
        }
        if r.held.len() > crate::adoption::MAX_ADOPT || r.want as usize > crate::adoption::MAX_ADOPT {
            return Err(ViewServerError::Invalid(format!(
                "AdoptJobsRequest: at most {} held and wanted jobs",
                crate::adoption::MAX_ADOPT
            ))
            .into());
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

    #[instrument(level = "debug", skip_all)]
    #[instrument(level = "debug", skip_all, fields(by = %req.get_ref().by))]
    async fn usage(&self, req: Request<v1::UsageRequest>) -> Result<Response<v1::UsageResponse>, Status> {
        let who = self.caller(&req, "Usage")?;
        let r = req.into_inner();
        let linearizable = r.linearizable;
        let query = crate::usage::UsageQuery::new(&who, r, crate::node::unix_ms())?;
        let tenants: Vec<&str> = query.tenants.iter().flatten().map(String::as_str).collect();
        self.allow(&who, "Usage", || format!("tenants {tenants:?}"), Action::ReadUsage { tenants: tenants.clone() })?;
        let what = ReadTarget::Usage(Box::new(query.clone()));
        match self.node.ask(|reply| NodeRequest::Read { linearizable, what, reply }).await? {
            ReadOut::Usage(r) => Ok(Response::new(*r)),
            _ => Err(ViewServerError::Internal("wrong read answer".into()).into()),
        }
    }

    async fn history(&self, req: Request<v1::HistoryRequest>) -> Result<Response<v1::HistoryResponse>, Status> {
        let who = self.caller(&req, "History")?;
        let query = crate::history::query(&who, req.into_inner())?;
        let tenants: Vec<&str> = query.tenants.iter().flatten().map(String::as_str).collect();
        self.allow(&who, "History", || format!("tenants {tenants:?}"), Action::ReadUsage { tenants: tenants.clone() })?;
        let what = ReadTarget::History(Box::new(query.clone()));
        match self.node.ask(|reply| NodeRequest::Read { linearizable: false, what, reply }).await? {
            ReadOut::History(Ok(r)) => Ok(Response::new(*r)),
            ReadOut::History(Err(e)) => {
                Err(ViewServerError::Internal(format!("the history of ended jobs: {e}")).into())
            }
            _ => Err(ViewServerError::Internal("wrong read answer".into()).into()),
        }
    }

    async fn agents(&self, req: Request<v1::AgentsRequest>) -> Result<Response<v1::AgentsResponse>, Status> {
        self.admit(&req, "Agents", Action::ReadView)?;
        let list = self.node.ask(NodeRequest::Agents).await?;
        Ok(Response::new(v1::AgentsResponse {
            agents: list.into_iter().map(|(server, name, addr)| v1::AgentInfo { server, name, addr }).collect(),
        }))
    }

    #[instrument(level = "info", skip_all, fields(replica = req.get_ref().id, addr = %req.get_ref().addr))]
    async fn add_replica(
        &self,
        req: Request<v1::AddReplicaRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let who = self.caller(&req, "AddReplica")?;
        let r = req.into_inner();
        self.allow(
            &who,
            "AddReplica",
            || format!("replica {} at {} {}", r.id, r.addr, r.raft_addr),
            Action::Membership,
        )?;
        if r.id == 0 {
            return Err(ViewServerError::Invalid("replica ids start at 1".into()).into());
        }
        for a in [&r.addr, &r.raft_addr] {
            if (a == &r.addr || !a.is_empty()) && (!a.contains(':') || a.contains(' ') || a.len() > 256) {
                return Err(ViewServerError::Invalid(format!("`{a}` is not host:port")).into());
            }
        }
        let record = if r.raft_addr.is_empty() { r.addr } else { format!("{} {}", r.addr, r.raft_addr) };
        let voters = self.node.ask(|reply| NodeRequest::Membership(true, r.id, record, reply)).await?;
        Ok(Response::new(v1::MembershipResponse { voters }))
    }

    #[instrument(level = "info", skip_all, fields(replica = req.get_ref().id))]
    async fn remove_replica(
        &self,
        req: Request<v1::RemoveReplicaRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let who = self.caller(&req, "RemoveReplica")?;
        let id = req.into_inner().id;
        self.allow(&who, "RemoveReplica", || format!("replica {id}"), Action::Membership)?;
        let voters = self.node.ask(|reply| NodeRequest::Membership(false, id, String::new(), reply)).await?;
        Ok(Response::new(v1::MembershipResponse { voters }))
    }
}
