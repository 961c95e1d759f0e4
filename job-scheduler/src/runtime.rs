//! The propose/retry loop that runs one job's [`Scheduler`] against the live view.
//!
//! [`place_job`] asks the scheduler for a gang on the current copy of the view and proposes it.
//! What happens next:
//!
//! - **Accepted** (or `AlreadyApplied`, a retry of a committed proposal): done.
//! - **Conflict**: the rejection carries fresh records of the servers that changed; they go
//!   into the scheduler's [`Overlay`] at once, so the next attempt (after a short jittered
//!   backoff) sees them without waiting for the watch stream.
//! - **Outcome unknown** (the leader changed, a timeout): the same proposal id is sent again;
//!   the approver applies an id at most once.
//! - **Wait**: sleep until the view changes, the job's tolerance relaxes (`relax_after_s`), or
//!   the backoff cap passes.
//! - **Give up**: the scheduler says the job can never fit; the job is cancelled with the
//!   reason, which `tessera status` shows.
//! - The job stopped being pending (cancelled, placed by someone else): stop quietly.
//!
//! Every loop is bounded: attempts back off exponentially with jitter up to
//! [`RuntimeOptions::max_backoff`], and nothing is retried without a wait.

use crate::cache::ViewCache;
use crate::local_view::Overlay;
use crate::scheduler::{Attempt, Scheduler, Verdict};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use tessera_proto::client::{ClientError, ViewClient};
use tessera_proto::{RemoteDecision, v1};
use tessera_view::{Decision, JobId, JobState, LocalityLevel, Proposal, ProposalId};

/// How the runtime retries.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// First backoff after a conflict or a failed call.
    pub min_backoff: Duration,
    /// Longest wait between attempts (also how often a waiting job looks again when nothing
    /// wakes it).
    pub max_backoff: Duration,
    /// Distinguishes this process's schedulers from others reading the same view.
    pub salt: u64,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions { min_backoff: Duration::from_millis(20), max_backoff: Duration::from_secs(2), salt: 0 }
    }
}

/// How one job's scheduling ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Placed {
    /// Committed at this level.
    Placed {
        /// The proposal that placed it.
        proposal: ProposalId,
        /// Locality achieved.
        level: LocalityLevel,
        /// Proposals the approver refused on the way.
        conflicts: u32,
    },
    /// The job is no longer pending (cancelled, ended or placed by another scheduler).
    NotPending(JobState),
    /// The scheduler gave up; the job was cancelled with this reason.
    GaveUp(String),
}

/// Why the runtime stopped without an outcome.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The view refused a call for good.
    #[error("the view refused: {0}")]
    Client(#[from] ClientError),
    /// The job is not in the view.
    #[error("job {0} is not in the view")]
    UnknownJob(JobId),
}

/// A proposal id no other scheduler will pick: 64 random bits (the approver refuses an id
/// already used by another job, so a collision costs one retry, never a wrong placement).
fn fresh_id(rng: &mut impl Rng) -> ProposalId {
    ProposalId(rng.random::<u64>() | 1)
}

fn jitter(rng: &mut impl Rng, d: Duration) -> Duration {
    d.mul_f64(rng.random_range(0.5..1.5))
}

/// Places `job` with `scheduler`, proposing through `client` and reading `cache`; returns once
/// the job is placed, stops being pending, or is given up. `waited_from` is when the job
/// started waiting (for `relax_after_s`).
pub async fn place_job(
    client: &mut ViewClient,
    cache: &ViewCache,
    scheduler: &dyn Scheduler,
    job: JobId,
    waited_from: Instant,
    opts: &RuntimeOptions,
) -> Result<Placed, RuntimeError> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(opts.salt ^ job.0.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut overlay = Overlay::default();
    let mut backoff = opts.min_backoff;
    let mut conflicts = 0u32;
    let mut attempt = 0u32;
    // A proposal whose outcome is unknown is sent again as is.
    let mut in_doubt: Option<Proposal> = None;
    loop {
        let Some(j) = cache.job(job) else {
            // The copy may not have caught up with a job submitted just now.
            if cache.wait_until(opts.max_backoff, |s| s.jobs.contains_key(&job)).await {
                continue;
            }
            return Err(RuntimeError::UnknownJob(job));
        };
        if j.state != JobState::Pending && in_doubt.is_none() {
            return Ok(Placed::NotPending(j.state));
        }
        let waited_s = waited_from.elapsed().as_secs();
        let allowed = j.spec.allowed_level(waited_s);
        let proposal = match in_doubt.take() {
            Some(p) => p,
            None => {
                let seen = cache.version();
                let verdict = cache.read(|s| {
                    scheduler.schedule(&Attempt {
                        job: &j,
                        view: &s.view,
                        overlay: &overlay,
                        allowed,
                        waited_s,
                        attempt,
                        salt: opts.salt.wrapping_add(job.0),
                    })
                });
                attempt += 1;
                match verdict {
                    Verdict::Propose(members) => Proposal { id: fresh_id(&mut rng), job, members, based_on: seen },
                    Verdict::Wait(why) => {
                        tracing::debug!(job_id = job.0, "waiting: {why}");
                        // Wake on a change of the view, or when the tolerance relaxes next.
                        let relax = j.spec.relax_after_s.filter(|_| allowed < j.spec.tolerate).map(|r| {
                            let next = (waited_s / r + 1) * r;
                            Duration::from_secs(next.saturating_sub(waited_s)).max(Duration::from_millis(10))
                        });
                        let wait = relax.map_or(opts.max_backoff, |r| r.min(opts.max_backoff));
                        cache.changed_since(seen, wait).await;
                        overlay.clear();
                        continue;
                    }
                    Verdict::GiveUp(why) => {
                        tracing::warn!(job_id = job.0, "giving up: {why}");
                        let reason = format!("scheduler `{}` gave up: {why}", scheduler.name());
                        return match client.cancel_because(job.0, &reason).await {
                            Ok(_) => Ok(Placed::GaveUp(reason)),
                            Err(ClientError::Status { status, .. })
                                if status.code() == tonic::Code::FailedPrecondition =>
                            {
                                Ok(Placed::NotPending(JobState::Failed))
                            }
                            Err(e) => Err(e.into()),
                        };
                    }
                }
            }
        };
        let results = match client.propose(vec![v1::Proposal::from(&proposal)]).await {
            Ok(r) => r,
            Err(e @ ClientError::Status { .. }) => return Err(e.into()),
            Err(e) => {
                tracing::debug!(job_id = job.0, "proposal outcome unknown ({e}); sending it again");
                in_doubt = Some(proposal);
                tokio::time::sleep(jitter(&mut rng, backoff)).await;
                backoff = (backoff * 2).min(opts.max_backoff);
                continue;
            }
        };
        let result = results.into_iter().next().unwrap_or_default();
        let decision = match result.decision.map(RemoteDecision::try_from) {
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                tracing::warn!(job_id = job.0, "malformed decision ({e}); sending the proposal again");
                in_doubt = Some(proposal);
                continue;
            }
            None => {
                tracing::debug!(job_id = job.0, "outcome unknown: {}", result.unknown);
                in_doubt = Some(proposal);
                tokio::time::sleep(jitter(&mut rng, backoff)).await;
                backoff = (backoff * 2).min(opts.max_backoff);
                continue;
            }
        };
        match decision {
            Decision::Accepted { level, .. } => {
                tracing::info!(job_id = job.0, %level, conflicts, "placed");
                return Ok(Placed::Placed { proposal: proposal.id, level, conflicts });
            }
            Decision::AlreadyApplied { .. } => {
                let level = cache.job(job).and_then(|j| j.placement.map(|p| p.level)).unwrap_or(allowed);
                return Ok(Placed::Placed { proposal: proposal.id, level, conflicts });
            }
            Decision::Rejected { reason, fresh, .. } if reason.conflict => {
                conflicts += 1;
                overlay.learn(&fresh);
                cache.learn(&fresh);
                tracing::debug!(job_id = job.0, conflicts, "conflict: {}", reason.message);
                tokio::time::sleep(jitter(&mut rng, backoff)).await;
                backoff = (backoff * 2).min(opts.max_backoff);
            }
            Decision::Rejected { reason, .. } => {
                // Not pending any more, or a proposal the approver refuses on its shape. A
                // refusal of a still-pending job is a bug in the scheduler: wait, do not spin.
                tracing::warn!(job_id = job.0, code = %reason.code, "proposal refused: {}", reason.message);
                if let Ok(r) = client.job(job.0, true).await
                    && let Some(j) = r.job
                    && j.state != v1::JobState::Pending as i32
                {
                    let state = v1::JobState::try_from(j.state)
                        .ok()
                        .and_then(|s| JobState::try_from(s).ok())
                        .unwrap_or(JobState::Failed);
                    return Ok(Placed::NotPending(state));
                }
                cache.changed_since(proposal.based_on, opts.max_backoff).await;
            }
        }
    }
}
