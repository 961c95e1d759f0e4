//! Who calls, and whether they may: authentication, the per-caller rate, and the rules of
//! [`crate::authz`] filled in with what they depend on from the replica's state (the host
//! holding a job, a server's name, a job's tenant).

use super::ViewService;
use crate::adoption::Holder;
use crate::authz::Action;
use crate::error::ViewServerError;
use crate::node::{NodeRequest, ReadOut, ReadTarget};
use tessera_proto::tls::{Identity, Role};
use tessera_view::{JobId, MemberPlacement, Proposal, ServerId};
use tonic::{Request, Status};

/// Which of a call's jobs a scheduler host must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scope {
    /// The pending ones: a proposal for a job no longer pending changes nothing (the approver
    /// refuses it, or answers a resend `AlreadyApplied`).
    Pending,
    /// Every one: a job no longer pending is held by no host, so no host may (a release).
    All,
}

impl ViewService {
    /// The caller of `req`, or `UNAUTHENTICATED` (audited); `RESOURCE_EXHAUSTED` when the
    /// caller is over its rate (clients retry that after a backoff).
    pub(super) fn caller<T>(&self, req: &Request<T>, method: &str) -> Result<Identity, Status> {
        let who = tessera_proto::tls::caller_of(&self.security, req).map_err(|e| {
            let why = e.to_string();
            self.audit.record(None, method, "", &Err(why.clone()));
            Status::from(ViewServerError::Unauthenticated(why))
        })?;
        let mut limiter = self.limiter.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        limiter.take(&who, std::time::Instant::now()).map_err(|why| {
            tracing::debug!(method, %who, "over its rate");
            Status::from(ViewServerError::Busy(why))
        })?;
        Ok(who)
    }

    /// Whether `who` may do `action`, else `PERMISSION_DENIED`; refusals and admins' changes
    /// are audited (`detail` says what was asked).
    pub(super) fn allow(
        &self,
        who: &Identity,
        method: &str,
        detail: impl FnOnce() -> String,
        action: Action<'_>,
    ) -> Result<(), Status> {
        let verdict = crate::authz::check(who, &action);
        if verdict.is_err() || (who.role == Role::Admin && action.is_admin_change()) {
            self.audit.record(Some(who), method, &detail(), &verdict);
        }
        verdict.map_err(|why| ViewServerError::PermissionDenied(why).into())
    }

    /// Authenticates and checks a request whose action needs no state.
    pub(super) fn admit<T>(&self, req: &Request<T>, method: &str, action: Action<'_>) -> Result<Identity, Status> {
        let who = self.caller(req, method)?;
        self.allow(&who, method, String::new, action)?;
        Ok(who)
    }

    /// For a scheduler host: its right to schedule `jobs`: it must hold each of them (with
    /// [`Scope::Pending`], each of those still pending). Other callers pass to the rules
    /// without a lookup.
    pub(super) async fn allow_schedule(
        &self,
        who: &Identity,
        method: &str,
        jobs: Vec<JobId>,
        scope: Scope,
    ) -> Result<(), Status> {
        if who.role != Role::Scheduler {
            return self.allow(who, method, String::new, Action::Schedule { holders: Vec::new() });
        }
        let detail = format!("jobs {:?}", jobs.iter().map(|j| j.0).collect::<Vec<_>>());
        let holders = self.node.ask(|reply| NodeRequest::Holders(who.name.clone(), jobs, reply)).await?;
        let holders = holders
            .iter()
            .filter_map(|h| match (h, scope) {
                (Holder::Host(h), _) => Some(Some(h.as_str())),
                (Holder::NotPending, Scope::Pending) => None,
                (Holder::NotPending, Scope::All) | (Holder::Nobody, _) => Some(None),
            })
            .collect();
        self.allow(who, method, || detail, Action::Schedule { holders })
    }

    /// For a scheduler host: moves it may make only when they help `job`, which it holds, to
    /// `target` (the leader's check, [`tessera_view::migration_check::moves_help`]); refused
    /// with the reason and audited otherwise. Other callers (an admin) are not checked.
    pub(super) async fn allow_moves(
        &self,
        who: &Identity,
        job: JobId,
        target: Vec<MemberPlacement>,
        moves: &[Proposal],
    ) -> Result<(), Status> {
        if who.role != Role::Scheduler {
            return Ok(());
        }
        let detail = || {
            let jobs: Vec<u64> = moves.iter().map(|p| p.job.0).collect();
            format!("moves of jobs {jobs:?} for job {job}")
        };
        let helps = self.node.ask(|reply| NodeRequest::MovesHelp(job, target, moves.to_vec(), reply)).await?;
        let verdict = helps.map_err(|why| format!("the moves do not help job {job}: {why}"));
        if let Err(why) = &verdict {
            self.audit.record(Some(who), "Migrate", &detail(), &Err(why.clone()));
        }
        verdict.map_err(|why| ViewServerError::PermissionDenied(why).into())
    }

    /// For an agent: its right to act for server `server`.
    pub(super) async fn allow_agent(&self, who: &Identity, method: &str, server: u32) -> Result<(), Status> {
        if who.role != Role::Agent {
            return self.allow(who, method, String::new, Action::Agent { server: "" });
        }
        let name = self.node.ask(|reply| NodeRequest::ServerName(ServerId(server), reply)).await?;
        let name = name.unwrap_or_else(|| format!("#{server} (unknown)"));
        self.allow(who, method, || format!("server {server}"), Action::Agent { server: &name })
    }

    /// A job's tenant, read from this replica (a job's tenant never changes).
    pub(super) async fn tenant_of(&self, job: u64) -> Result<Option<String>, Status> {
        let what = ReadTarget::Job(JobId(job));
        match self.node.ask(|reply| NodeRequest::Read { linearizable: false, what, reply }).await? {
            ReadOut::Job(j, _, _) => Ok(j.and_then(|j| j.spec.map(|s| s.tenant))),
            _ => Err(ViewServerError::Internal("wrong read answer".into()).into()),
        }
    }
}
