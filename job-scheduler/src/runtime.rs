//! The propose/retry loop that runs one job's [`Scheduler`] against the live view: a pure
//! state machine, [`PlaceMachine`], under a thin async shell, [`place_job`].
//!
//! The machine asks the scheduler for a gang on the copy of the view it is shown and proposes
//! it. What happens next:
//!
//! - **Accepted** (or `AlreadyApplied`, a resend of a committed proposal): done.
//! - **Conflict**: the rejection carries fresh records of the servers that changed; they go
//!   into the scheduler's [`Overlay`] at once (and the shell puts them in the [`ViewCache`]),
//!   so the next attempt (after a jittered backoff) sees them without waiting for the watch
//!   stream.
//! - **Outcome unknown** (the leader changed, a timeout, an undecodable decision): the same
//!   proposal id is sent again after a backoff; the approver applies an id at most once.
//! - **Locality as a cost**: a job its scheduler cannot place at its floor, that declares its
//!   loss per level, is asked again at a looser level when starting there now is expected to
//!   finish sooner than waiting ([`crate::locality_cost::decide`]).
//! - **Wait**: sleep until the view changes, the job's tolerance relaxes (the next
//!   `relax_after_s` step), waiting for a tighter level stops paying (the cost rule's bound),
//!   or [`RuntimeOptions::max_backoff`] passes.
//! - **Give up**: the scheduler says the job can never fit; the job is cancelled with the
//!   reason, which `tessera status` shows.
//! - The job stopped being pending (cancelled, placed by someone else): stop quietly.
//!
//! Every loop is bounded: attempts back off exponentially with jitter
//! ([`tessera_proto::Backoff`], [`RuntimeOptions::min_backoff`] doubling to
//! [`RuntimeOptions::max_backoff`], each delay ×[0.5, 1.5)), and nothing is retried without a
//! wait.
//!
//! ## Machine and shell
//!
//! [`PlaceMachine`] does no I/O and reads no clock. Time is a [`Duration`] on the caller's
//! clock (for [`place_job`]: since the job started waiting; for a simulator: virtual time),
//! passed with every [`Event`]. Each [`PlaceMachine::step`] answers one [`Action`]: propose,
//! sleep until a time, wait for the view to change (or a time), read the job's state, cancel
//! the job (give up), or finish. [`place_job`] carries actions out over a [`ViewClient`],
//! a [`ViewCache`] and tokio's clock, and after every wait shows the machine the copy of the
//! view again ([`Event::View`]). Its unit tests run the machine on virtual time.

use crate::SchedulerError;
use crate::cache::ViewCache;
use crate::local_view::{LocalView, Overlay};
use crate::scheduler::{Attempt, Context, Scheduler, Verdict};
use crate::{locality_cost, preemption};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use tessera_proto::backoff::Backoff;
use tessera_proto::client::{ClientError, ViewClient};
use tessera_proto::{RemoteDecision, trace, v1};
use tessera_view::{
    Decision, Job, JobId, JobState, LocalityLevel, Preemption, Proposal, ProposalId, ServerId, ServerRecord,
    ViewVersion,
};
use tracing::Instrument;
use tracing::field::Empty;

/// Longest sleep of a job waiting out its restart backoff before it looks at the view again.
const RESTART_LOOK: Duration = Duration::from_secs(30);

/// Shortest wait for a relaxation step, so a step that is due now cannot spin.
const MIN_RELAX_WAIT: Duration = Duration::from_millis(10);

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
    /// Where [`place_job`] counts its proposals and their round trips (a host's; none: not
    /// counted).
    pub metrics: Option<crate::metrics::HostMetrics>,
    /// Whether the host's bounded reservations for starved gangs of whole servers
    /// ([`crate::reservation`]) hold its other jobs back (off by default: on the robustness
    /// matrix they cost more average completion time than they save).
    pub reserve: bool,
}

/// What a host that makes no reservations shows its jobs.
static NO_RESERVATION: crate::reservation::Reservations = crate::reservation::Reservations::new();

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            min_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(2),
            salt: 0,
            metrics: None,
            reserve: false,
        }
    }
}

impl RuntimeOptions {
    /// The backoff between attempts: `min_backoff` doubling to `max_backoff`, ±50 % jitter.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.min_backoff, self.max_backoff)
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

/// What the shell tells the machine, each with the time now on the machine's clock.
#[derive(Debug)]
pub enum Event<'a> {
    /// The copy of the view as it is now: at the start and after every wait (a timer that
    /// fired, a view that changed). `job` is the job as the copy holds it (`None` when the
    /// copy has not caught up with its submission yet); `version` is the version the copy
    /// reflects.
    View {
        /// The job in the copy.
        job: Option<&'a Job>,
        /// The server records.
        view: &'a LocalView,
        /// The copy's version.
        version: ViewVersion,
        /// What the host knows beyond the server records (the jobs running on each server).
        ctx: Context<'a>,
    },
    /// The answer to the proposal of the last [`Action::Propose`].
    Answer(Answer),
    /// The job's state as the view itself holds it, after [`Action::ReadJob`] (`None`: the
    /// read failed or named no job).
    JobState(Option<JobState>),
    /// How the cancel of [`Action::GiveUp`] went.
    Cancelled(Result<(), ClientError>),
}

/// The approver's answer to one proposal, as the shell learned it.
#[derive(Debug)]
pub enum Answer {
    /// Committed at this level.
    Accepted {
        /// Locality achieved.
        level: LocalityLevel,
    },
    /// The id was committed before (a resend); `level` is the job's as the shell's copy holds
    /// it, if it does yet.
    AlreadyApplied {
        /// Locality achieved, if known.
        level: Option<LocalityLevel>,
    },
    /// Refused because the view changed: the current records of the servers concerned.
    Conflict {
        /// Fresh server records.
        fresh: Vec<(ServerId, ServerRecord)>,
        /// The approver's words.
        message: String,
    },
    /// Refused for another reason (the job is not pending, or the proposal's shape).
    Refused {
        /// The reason code.
        code: String,
        /// The approver's words.
        message: String,
    },
    /// No decision came back: the leader changed, a timeout, an undecodable decision.
    Unknown(String),
    /// The call failed. An error status is final; unavailability leaves the outcome unknown.
    Failed(ClientError),
}

impl Answer {
    /// The answer of an approver in this process (the simulator's view) to a proposal or a
    /// preemption: what a live host learns from the leader's decision.
    pub fn decided(d: Decision) -> Answer {
        match d {
            Decision::Accepted { level, .. } => Answer::Accepted { level },
            Decision::AlreadyApplied { .. } => Answer::AlreadyApplied { level: None },
            Decision::Rejected { reason, fresh, .. } if reason.is_conflict() => {
                Answer::Conflict { fresh, message: reason.to_string() }
            }
            Decision::Rejected { reason, .. } => {
                Answer::Refused { code: reason.code().to_string(), message: reason.to_string() }
            }
        }
    }

    /// The answer's kind, as a metrics label.
    pub fn outcome(&self) -> &'static str {
        match self {
            Answer::Accepted { .. } => "accepted",
            Answer::AlreadyApplied { .. } => "already_applied",
            Answer::Conflict { .. } => "conflict",
            Answer::Refused { .. } => "refused",
            Answer::Unknown(_) => "unknown",
            Answer::Failed(_) => "failed",
        }
    }
}

/// What the machine asks the shell to do next.
#[derive(Debug)]
pub enum Action {
    /// Send this proposal; answer with [`Event::Answer`]. A resend carries the same id.
    Propose(Proposal),
    /// Send this preemption (the scheduler's [`Verdict::Preempt`]); answer with
    /// [`Event::Answer`]. A resend carries the same id.
    Preempt(Preemption),
    /// Wait until `until` (on the machine's clock), then show the view ([`Event::View`]).
    Sleep {
        /// When to look again.
        until: Duration,
    },
    /// Wait until the copy moves past `seen` or `until` comes, whichever is first, then show
    /// the view ([`Event::View`]).
    WaitForView {
        /// The version already seen.
        seen: ViewVersion,
        /// When to look again at the latest.
        until: Duration,
    },
    /// Read the job's state from the view itself (the copy may lag); answer with
    /// [`Event::JobState`].
    ReadJob,
    /// Cancel the job with this reason; answer with [`Event::Cancelled`].
    GiveUp {
        /// Why, as `tessera status` shows it.
        reason: String,
    },
    /// Finished.
    Done(Placed),
    /// Stopped without an outcome.
    Fail(SchedulerError),
}

/// What the machine waits for.
#[derive(Debug)]
enum Phase {
    /// An [`Event::View`].
    Look,
    /// The answer to this proposal or preemption.
    Proposed(Sent),
    /// The job's state, after a refusal of a proposal based on this version.
    Reading(ViewVersion),
    /// The outcome of cancelling the job with this reason.
    GivingUp(String),
    /// Nothing: it finished.
    Over,
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Look => "a view",
            Phase::Proposed(_) => "an answer",
            Phase::Reading(_) => "the job's state",
            Phase::GivingUp(_) => "the outcome of the cancel",
            Phase::Over => "nothing (finished)",
        }
    }
}

impl Event<'_> {
    fn name(&self) -> &'static str {
        match self {
            Event::View { .. } => "a view",
            Event::Answer(_) => "an answer",
            Event::JobState(_) => "the job's state",
            Event::Cancelled(_) => "the outcome of the cancel",
        }
    }
}

/// What the machine sent and waits on: a gang proposal, or a preemption (a gang and its victims).
#[derive(Clone, Debug)]
pub enum Sent {
    /// A proposal.
    Gang(Proposal),
    /// A preemption.
    Preempt(Preemption),
}

impl Sent {
    /// The gang proposal inside.
    pub fn proposal(&self) -> &Proposal {
        match self {
            Sent::Gang(p) => p,
            Sent::Preempt(pre) => &pre.proposal,
        }
    }
}

/// One job's placement as a state machine over a clock: events and the time in, [`Action`]s
/// out, no I/O. See the [module docs](self).
#[derive(Debug)]
pub struct PlaceMachine<'s> {
    scheduler: &'s dyn Scheduler,
    job: JobId,
    salt: u64,
    /// When the job started waiting (for `relax_after_s`), on the machine's clock.
    waited_from: Duration,
    /// Longest wait for a view change.
    max_wait: Duration,
    backoff: Backoff,
    rng: rand::rngs::SmallRng,
    overlay: Overlay,
    conflicts: u32,
    attempt: u32,
    /// The level the job accepted at the last look.
    allowed: Option<LocalityLevel>,
    /// A proposal or preemption whose outcome is unknown: sent again as is.
    in_doubt: Option<Sent>,
    /// Since when the copy has not held the job.
    missing_since: Option<Duration>,
    /// Whether the last look chose to wait for a tighter level (see
    /// [`PlaceMachine::waits_by_choice`]).
    by_choice: bool,
    phase: Phase,
}

impl<'s> PlaceMachine<'s> {
    /// A machine placing `job` with `scheduler`; the job started waiting at `waited_from` on
    /// the clock the caller passes to [`PlaceMachine::step`]. Its randomness (proposal ids,
    /// jitter) is seeded from `opts.salt` and the job, so a run is reproducible.
    pub fn new(scheduler: &'s dyn Scheduler, job: JobId, waited_from: Duration, opts: &RuntimeOptions) -> Self {
        PlaceMachine {
            scheduler,
            job,
            salt: opts.salt,
            waited_from,
            max_wait: opts.max_backoff,
            backoff: opts.backoff(),
            rng: rand::rngs::SmallRng::seed_from_u64(opts.salt ^ job.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            overlay: Overlay::default(),
            conflicts: 0,
            attempt: 0,
            allowed: None,
            in_doubt: None,
            missing_since: None,
            by_choice: false,
            phase: Phase::Look,
        }
    }

    /// Proposals the approver refused as conflicts so far.
    pub fn conflicts(&self) -> u32 {
        self.conflicts
    }

    /// Whether the last look waited by choice: the job could start now at a looser level, but
    /// waiting for a tighter one is expected to finish sooner ([`locality_cost::decide`]). A
    /// job that waits because nothing fits is one that moving others could help (a host's
    /// migration); one that waits by choice is not.
    pub fn waits_by_choice(&self) -> bool {
        self.by_choice
    }

    /// When `job`'s tolerance next relaxes (its spec's `relax_after_s` step after `now`, on the
    /// machine's clock), if it still can: the latest a waiting job must look again whatever the
    /// view does.
    pub fn relax_wake(&self, now: Duration, job: &Job) -> Option<Duration> {
        let r = job.spec.relax_after_s.filter(|r| *r > 0)?;
        let waited_s = now.saturating_sub(self.waited_from).as_secs();
        if job.spec.allowed_level(waited_s) >= job.spec.tolerate {
            return None;
        }
        let step = self.waited_from + Duration::from_secs((waited_s / r + 1) * r);
        Some(step.max(now + MIN_RELAX_WAIT))
    }

    /// Takes one event at time `now` and says what to do next.
    pub fn step(&mut self, now: Duration, event: Event<'_>) -> Action {
        match (std::mem::replace(&mut self.phase, Phase::Over), event) {
            (Phase::Look, Event::View { job, view, version, ctx }) => self.look(now, job, view, version, ctx),
            (Phase::Proposed(p), Event::Answer(a)) => self.answered(now, p, a),
            (Phase::Reading(based_on), Event::JobState(s)) => match s {
                Some(s) if s != JobState::Pending => Action::Done(Placed::NotPending(s)),
                _ => self.wait_for_view(based_on, now + self.max_wait),
            },
            (Phase::GivingUp(reason), Event::Cancelled(r)) => match r {
                Ok(()) => Action::Done(Placed::GaveUp(reason)),
                // Already over: someone cancelled it, or it failed, meanwhile.
                Err(ClientError::Status { status, .. }) if status.code() == tonic::Code::FailedPrecondition => {
                    Action::Done(Placed::NotPending(JobState::Failed))
                }
                Err(e) => Action::Fail(SchedulerError::Call { call: "CancelJob", source: e }),
            },
            (phase, event) => {
                Action::Fail(SchedulerError::OutOfOrder { job: self.job, expected: phase.name(), got: event.name() })
            }
        }
    }

    fn look(
        &mut self,
        now: Duration,
        job: Option<&Job>,
        view: &LocalView,
        version: ViewVersion,
        ctx: Context<'_>,
    ) -> Action {
        let Some(j) = job else {
            // The copy may not have caught up with a job submitted just now.
            let deadline = *self.missing_since.get_or_insert(now) + self.max_wait;
            if now >= deadline {
                return Action::Fail(SchedulerError::UnknownJob(self.job));
            }
            return self.wait_for_view(version, deadline);
        };
        self.missing_since = None;
        if j.state != JobState::Pending && self.in_doubt.is_none() {
            return Action::Done(Placed::NotPending(j.state));
        }
        let waited_s = now.saturating_sub(self.waited_from).as_secs();
        let allowed = j.spec.allowed_level(waited_s);
        self.allowed = Some(allowed);
        if let Some(sent) = self.in_doubt.take() {
            return self.send(sent);
        }
        let attempt = Attempt {
            job: j,
            view,
            overlay: &self.overlay,
            allowed,
            waited_s,
            attempt: self.attempt,
            salt: self.salt.wrapping_add(self.job.0),
            ctx,
        };
        // Nothing fits at the floor: a looser level if starting there now pays
        // (`locality_cost::decide`); else a job that outranks running ones displaces the
        // fewest of them (`preemption::displace`; none unless the cluster allows preemption).
        let decided = locality_cost::decide(self.scheduler, &attempt);
        let recheck = decided.recheck_waited_s;
        self.allowed = Some(decided.allowed);
        self.by_choice = decided.by_cost;
        let verdict = match decided.verdict {
            Verdict::Wait(why) if decided.by_cost => Verdict::Wait(why),
            Verdict::Wait(why) => match preemption::displace(&attempt) {
                Some(c) => {
                    tracing::debug!(job_id = self.job.0, reason = %why, "no fit without preempting");
                    Verdict::Preempt { members: c.members, victims: c.victims }
                }
                None => Verdict::Wait(why),
            },
            v => v,
        };
        self.attempt += 1;
        match verdict {
            Verdict::Propose(members) => {
                let id = self.unspent_id(j);
                self.send(Sent::Gang(Proposal { id, job: self.job, members, based_on: version }))
            }
            Verdict::Preempt { members, victims } => {
                let id = self.unspent_id(j);
                let proposal = Proposal { id, job: self.job, members, based_on: version };
                let reason = format!(
                    "preempted for job {} (priority {}) by scheduler `{}`",
                    self.job,
                    j.spec.priority,
                    self.scheduler.name()
                );
                tracing::info!(job_id = self.job.0, victims = victims.len(), "preempting");
                self.send(Sent::Preempt(Preemption { proposal, victims, reason }))
            }
            Verdict::Wait(why) => {
                tracing::debug!(job_id = self.job.0, reason = %why, "waiting");
                // The next attempt starts from the copy as it is then.
                self.overlay.clear();
                // Wake on a change of the view, or when the tolerance relaxes next.
                let mut until = now + self.max_wait;
                if let Some(step) = self.relax_wake(now, j) {
                    until = until.min(step);
                }
                // Or when waiting for a tighter level stops paying whatever the view does.
                if let Some(w) = recheck {
                    let bound = self.waited_from + Duration::from_secs(w);
                    until = until.min(bound.max(now + MIN_RELAX_WAIT));
                }
                self.wait_for_view(version, until)
            }
            Verdict::GiveUp(why) => {
                tracing::warn!(job_id = self.job.0, reason = %why, "giving up");
                let reason = format!("scheduler `{}` gave up: {why}", self.scheduler.name());
                self.phase = Phase::GivingUp(reason.clone());
                Action::GiveUp { reason }
            }
        }
    }

    fn answered(&mut self, now: Duration, sent: Sent, a: Answer) -> Action {
        let conflicts = self.conflicts;
        let p = sent.proposal();
        match a {
            Answer::Accepted { level } => {
                tracing::info!(job_id = self.job.0, %level, conflicts, "placed");
                Action::Done(Placed::Placed { proposal: p.id, level, conflicts })
            }
            Answer::AlreadyApplied { level } => {
                let level = level.or(self.allowed).unwrap_or(LocalityLevel::Any);
                tracing::info!(job_id = self.job.0, %level, conflicts, "placed (by a resend)");
                Action::Done(Placed::Placed { proposal: p.id, level, conflicts })
            }
            Answer::Conflict { fresh, message } => {
                self.conflicts += 1;
                self.overlay.learn(&fresh);
                tracing::debug!(job_id = self.job.0, conflicts = self.conflicts, reason = %message, "conflict");
                self.sleep(now)
            }
            Answer::Refused { code, message } => {
                // Not pending any more, or a proposal the approver refuses on its shape. A
                // refusal of a still-pending job is a bug in the scheduler: wait, do not spin.
                tracing::warn!(job_id = self.job.0, %code, reason = %message, "proposal refused");
                self.phase = Phase::Reading(p.based_on);
                Action::ReadJob
            }
            Answer::Failed(e @ ClientError::Status { .. }) => {
                let call = if matches!(sent, Sent::Preempt(_)) { "Preempt" } else { "Propose" };
                Action::Fail(SchedulerError::Call { call, source: e })
            }
            Answer::Failed(e) => self.in_doubt(now, sent, &e.to_string()),
            Answer::Unknown(why) => self.in_doubt(now, sent, &why),
        }
    }

    /// A fresh proposal id that `job` has not spent. A machine's ids are drawn from an rng
    /// seeded by the host's salt and the job, so the machine of a job placed again (preempted,
    /// or restarted after a failure) draws the ids its earlier machine drew; the approver
    /// refuses an id the job already spent, so those are skipped.
    fn unspent_id(&mut self, job: &Job) -> ProposalId {
        loop {
            let id = fresh_id(&mut self.rng);
            if !job.proposals.contains(&id) {
                return id;
            }
        }
    }

    fn in_doubt(&mut self, now: Duration, sent: Sent, why: &str) -> Action {
        let proposal = sent.proposal().id.0;
        tracing::debug!(job_id = self.job.0, proposal, reason = why, "outcome unknown; sending it again");
        self.in_doubt = Some(sent);
        self.sleep(now)
    }

    fn send(&mut self, sent: Sent) -> Action {
        self.phase = Phase::Proposed(sent.clone());
        match sent {
            Sent::Gang(p) => Action::Propose(p),
            Sent::Preempt(pre) => Action::Preempt(pre),
        }
    }

    fn sleep(&mut self, now: Duration) -> Action {
        self.phase = Phase::Look;
        Action::Sleep { until: now + self.backoff.next_delay(&mut self.rng) }
    }

    fn wait_for_view(&mut self, seen: ViewVersion, until: Duration) -> Action {
        self.phase = Phase::Look;
        Action::WaitForView { seen, until }
    }
}

/// A proposal id no other scheduler will pick: 64 random bits (the approver refuses an id
/// already used by another job, so a collision costs one retry, never a wrong placement).
fn fresh_id(rng: &mut impl Rng) -> ProposalId {
    ProposalId(rng.random::<u64>() | 1)
}

/// Places `job` with `scheduler`, proposing through `client` and reading `cache`; returns once
/// the job is placed, stops being pending, or is given up. `waited_from` is when the job
/// started waiting (for `relax_after_s`).
///
/// The shell of [`PlaceMachine`]: its clock is the time since `waited_from`.
///
/// Runs in a `host.place` span under the job's trace (see [`tessera_proto::trace`]), each call
/// to the leader in a `host.propose` or `host.preempt` span within it: the leader's approval
/// joins the trace.
pub async fn place_job(
    client: &mut ViewClient,
    cache: &ViewCache,
    scheduler: &dyn Scheduler,
    job: JobId,
    waited_from: Instant,
    opts: &RuntimeOptions,
) -> Result<Placed, SchedulerError> {
    let of_job = cache.read(|s| s.jobs.get(&job).and_then(|j| j.trace));
    let span = trace::on_job(
        tracing::info_span!(target: trace::TARGET, "host.place", job_id = job.0, outcome = Empty),
        of_job.as_ref(),
    );
    let placed = async {
        // A job that waits for other jobs is not placed before they end (the approver would refuse
        // it): wait for its record to change; its wait for a placement starts when they have.
        let waited_from = if waits_for_others(cache, job).await { Instant::now() } else { waited_from };
        let now = || waited_from.elapsed();
        let look = |m: &mut PlaceMachine<'_>| {
            let version = cache.version();
            cache.read(|s| {
                // A restarted job waits out its restart backoff (the view's clock, read on this
                // machine's wall clock; looked at again at least every RESTART_LOOK).
                if let Some(j) = s.jobs.get(&job).filter(|j| j.state == JobState::Pending) {
                    let hold = Duration::from_millis(j.not_before_ms.saturating_sub(crate::host::wall_ms()));
                    if !hold.is_zero() {
                        return Action::Sleep { until: now() + hold.min(RESTART_LOOK) };
                    }
                }
                let ahead = s.jobs.get(&job).map_or(0, |j| s.same_kind_ahead(j));
                // The host's reservation for a starved gang, unless this host makes none.
                let reservations = if opts.reserve { &s.reservations } else { &NO_RESERVATION };
                let ctx = Context { running: &s.running, releases: &s.releases, reservations, ahead, now_s: s.now_s() };
                m.step(now(), Event::View { job: s.jobs.get(&job), view: &s.view, version, ctx })
            })
        };
        let mut m = PlaceMachine::new(scheduler, job, Duration::ZERO, opts);
        let mut action = look(&mut m);
        loop {
            action = match action {
                Action::Propose(p) => {
                    let sent = Instant::now();
                    let call = tracing::info_span!(target: trace::TARGET, "host.propose", proposal = p.id.0);
                    let answer =
                        answer(client.propose(vec![v1::Proposal::from(&p)]).instrument(call).await, cache, job);
                    observe(opts, "propose", &answer, sent);
                    m.step(now(), Event::Answer(answer))
                }
                Action::Preempt(pre) => {
                    let sent = Instant::now();
                    let call = tracing::info_span!(
                        target: trace::TARGET,
                        "host.preempt",
                        proposal = pre.proposal.id.0,
                        victims = pre.victims.len()
                    );
                    let answer = answer(client.preempt(v1::Preemption::from(&pre)).instrument(call).await, cache, job);
                    observe(opts, "preempt", &answer, sent);
                    m.step(now(), Event::Answer(answer))
                }
                Action::Sleep { until } => {
                    tokio::time::sleep(until.saturating_sub(now())).await;
                    look(&mut m)
                }
                Action::WaitForView { seen, until } => {
                    cache.changed_since(seen, until.saturating_sub(now())).await;
                    look(&mut m)
                }
                Action::ReadJob => {
                    let state = match client.job(job.0, true).await {
                        Ok(r) => r.job.map(|j| job_state(j.state)),
                        Err(_) => None,
                    };
                    m.step(now(), Event::JobState(state))
                }
                Action::GiveUp { reason } => {
                    let r = client.cancel_because(job.0, &reason).await.map(|_| ());
                    m.step(now(), Event::Cancelled(r))
                }
                Action::Done(p) => return Ok(p),
                Action::Fail(e) => return Err(e),
            };
        }
    }
    .instrument(span.clone())
    .await;
    span.record("outcome", if placed.is_ok() { "done" } else { "failed" });
    placed
}

/// Waits while `job` is pending and waits for other jobs to end (its dependencies are only ever
/// crossed off, so the cache saying none are left agrees with the leader); returns whether it
/// waited. Looks again at least every [`RESTART_LOOK`] (a missed wake-up costs that much).
async fn waits_for_others(cache: &ViewCache, job: JobId) -> bool {
    let mut waited = false;
    loop {
        let version = cache.version();
        let blocked =
            cache.read(|s| s.jobs.get(&job).is_some_and(|j| j.state == JobState::Pending && !j.waiting_for.is_empty()));
        if !blocked {
            return waited;
        }
        waited = true;
        cache.changed_since(version, RESTART_LOOK).await;
    }
}

/// Counts one call's answer where the options say.
fn observe(opts: &RuntimeOptions, call: &'static str, answer: &Answer, sent: Instant) {
    if let Some(m) = &opts.metrics {
        m.proposal(call, answer.outcome(), sent.elapsed());
    }
}

/// A job state off the wire; one the client does not know counts as failed.
fn job_state(wire: i32) -> JobState {
    v1::JobState::try_from(wire).ok().and_then(|s| JobState::try_from(s).ok()).unwrap_or(JobState::Failed)
}

/// What a `Propose` or `Preempt` call answered, as the machine takes it. A conflict's fresh records also go
/// into `cache` here, so every scheduler of the process sees them at once.
fn answer(r: Result<Vec<v1::ProposeResult>, ClientError>, cache: &ViewCache, job: JobId) -> Answer {
    let result = match r {
        Ok(results) => results.into_iter().next().unwrap_or_default(),
        Err(e) => return Answer::Failed(e),
    };
    match result.decision.map(RemoteDecision::try_from) {
        None => Answer::Unknown(result.unknown),
        Some(Err(e)) => Answer::Unknown(format!("malformed decision: {e}")),
        Some(Ok(Decision::Accepted { level, .. })) => Answer::Accepted { level },
        Some(Ok(Decision::AlreadyApplied { .. })) => {
            Answer::AlreadyApplied { level: cache.job(job).and_then(|j| j.placement.map(|p| p.level)) }
        }
        Some(Ok(Decision::Rejected { reason, fresh, .. })) if reason.conflict => {
            cache.learn(&fresh);
            Answer::Conflict { fresh, message: reason.message }
        }
        Some(Ok(Decision::Rejected { reason, .. })) => Answer::Refused { code: reason.code, message: reason.message },
    }
}

#[cfg(test)]
mod tests {
    //! The machine on virtual time: no tokio, no network; the real default scheduler on real
    //! views.

    use super::*;
    use crate::LocalityTolerant;
    use crate::scheduler::RunningIndex;
    use tessera_view::fit::FitMode;
    use tessera_view::{ClusterSpec, ClusterView, JobSpec};

    const MS: Duration = Duration::from_millis(1);
    const S: Duration = Duration::from_secs(1);

    /// One rack of `servers` seed-8gpu servers (two sockets of four GPUs each).
    fn cluster(servers: u32) -> ClusterView {
        let toml =
            format!("name='t'\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology='seed-8gpu'\nservers={servers}\n");
        ClusterView::from_spec(&ClusterSpec::from_toml("c.toml", &toml, None).expect("spec"))
    }

    /// A one-member job of `gpus` GPUs.
    fn spec(gpus: u32, prefer: LocalityLevel, tolerate: LocalityLevel, relax_after_s: Option<u64>) -> JobSpec {
        let mut s = JobSpec::simple("j", 1, gpus);
        (s.prefer, s.tolerate, s.relax_after_s) = (prefer, tolerate, relax_after_s);
        s
    }

    /// A view with one pending job, and the machine for it.
    struct Fixture {
        view: ClusterView,
        job: JobId,
    }

    impl Fixture {
        fn new(servers: u32, spec: JobSpec) -> Fixture {
            let mut view = cluster(servers);
            let job = view.submit(spec).expect("admitted");
            Fixture { view, job }
        }

        /// Places an 8-GPU job on each of `servers` servers, so none has a free GPU.
        fn fill(&mut self, servers: u64) {
            self.fill_ranked(&vec![0; servers as usize]);
        }

        /// Places an 8-GPU job of each of `priorities` on a server of its own.
        fn fill_ranked(&mut self, priorities: &[i32]) {
            let sched = LocalityTolerant::default();
            for (n, &priority) in (0u64..).zip(priorities) {
                let s = JobSpec { priority, ..spec(8, LocalityLevel::Server, LocalityLevel::Server, None) };
                let id = self.view.submit(s).expect("admitted");
                let job = self.view.job(id).expect("job").clone();
                let local = LocalView::of_view(&self.view);
                let overlay = Overlay::default();
                let a = Attempt {
                    job: &job,
                    view: &local,
                    overlay: &overlay,
                    allowed: LocalityLevel::Server,
                    waited_s: 0,
                    attempt: 0,
                    salt: n,
                    ctx: Context::empty(),
                };
                let Verdict::Propose(members) = sched.schedule(&a) else { panic!("a server is free") };
                let p = Proposal { id: ProposalId(1001 + 2 * n), job: id, members, based_on: self.view.version() };
                assert!(self.view.propose(&p).is_placed());
            }
        }

        /// Shows `m` the view at `now`.
        fn look(&self, m: &mut PlaceMachine<'_>, now: Duration) -> Action {
            let local = LocalView::of_view(&self.view);
            let ctx = Context::empty();
            m.step(now, Event::View { job: self.view.job(self.job), view: &local, version: self.view.version(), ctx })
        }
    }

    impl Fixture {
        /// Shows `m` the view at `now` with the running jobs indexed as a live host indexes
        /// them, under the preemption bound `max_preemptions`.
        fn look_indexed(&self, m: &mut PlaceMachine<'_>, now: Duration, max_preemptions: u32) -> Action {
            let local = LocalView::of_view(&self.view);
            let running = RunningIndex::from_jobs(self.view.jobs()).with_preemption_bound(max_preemptions);
            let ctx = Context::of_running(&running);
            m.step(now, Event::View { job: self.view.job(self.job), view: &local, version: self.view.version(), ctx })
        }
    }

    /// A machine with the default options for `f`'s job, which started waiting at 0.
    fn machine<'s>(sched: &'s dyn Scheduler, f: &Fixture) -> PlaceMachine<'s> {
        PlaceMachine::new(sched, f.job, Duration::ZERO, &RuntimeOptions::default())
    }

    fn proposal(a: Action) -> Proposal {
        match a {
            Action::Propose(p) => p,
            other => panic!("expected a proposal, got {other:?}"),
        }
    }

    fn sleep_until(a: Action) -> Duration {
        match a {
            Action::Sleep { until } => until,
            other => panic!("expected a sleep, got {other:?}"),
        }
    }

    fn wait_until(a: Action) -> (ViewVersion, Duration) {
        match a {
            Action::WaitForView { seen, until } => (seen, until),
            other => panic!("expected a wait for the view, got {other:?}"),
        }
    }

    fn unavailable() -> ClientError {
        ClientError::Unavailable { tried: "a:1".into(), waited_ms: 10, last: "connection refused".into() }
    }

    fn status(s: tonic::Status) -> ClientError {
        ClientError::Status { addr: "a:1".into(), status: Box::new(s) }
    }

    #[test]
    fn a_waiting_job_looks_again_at_each_relax_step_and_is_proposed_once_its_level_fits() {
        // 8 GPUs fit only a whole server; the job prefers a PCIe switch and loosens one level
        // every 10 s: socket at 10 s, server at 20 s after it started waiting (at 5 s).
        let f = Fixture::new(1, spec(8, LocalityLevel::PcieSwitch, LocalityLevel::Server, Some(10)));
        let opts = RuntimeOptions { max_backoff: Duration::from_secs(60), ..RuntimeOptions::default() };
        let sched = LocalityTolerant::default();
        let mut m = PlaceMachine::new(&sched, f.job, 5 * S, &opts);
        assert_eq!(wait_until(f.look(&mut m, 5 * S)), (f.view.version(), 15 * S));
        assert!(!m.waits_by_choice(), "nothing fits: not a choice");
        // The step a host that skips the look (another job of the shape failed) wakes it for.
        let job = f.view.job(f.job).expect("job");
        assert_eq!(m.relax_wake(9 * S, job), Some(15 * S));
        assert_eq!(m.relax_wake(15 * S, job), Some(25 * S));
        assert_eq!(m.relax_wake(25 * S, job), None, "at its tolerance: no step left");
        // A change of the view wakes it early; the wake-up for the step stays where it was.
        assert_eq!(wait_until(f.look(&mut m, 9 * S + 300 * MS)).1, 15 * S);
        assert_eq!(wait_until(f.look(&mut m, 15 * S)).1, 25 * S, "socket: still no fit, next step at 25 s");
        let p = proposal(f.look(&mut m, 25 * S));
        assert_eq!((p.job, p.members.len(), p.based_on), (f.job, 1, f.view.version()));
        assert_eq!(p.members[0].gpus.count_ones(), 8);
        // Accepted at the server level: done.
        match m.step(25 * S + 4 * MS, Event::Answer(Answer::Accepted { level: LocalityLevel::Server })) {
            Action::Done(Placed::Placed { proposal, level, conflicts }) => {
                assert_eq!((proposal, level, conflicts), (p.id, LocalityLevel::Server, 0));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_job_that_declares_its_loss_waits_for_its_level_while_that_pays_and_then_starts_looser() {
        // Two servers with 6 of 8 GPUs busy each; a 2 × 2-GPU job prefers one server and
        // loses 30% across two. Runs of 1,000 s: across servers costs 429 s more, and a slot
        // on one server is expected within seconds (a GPU released every second).
        let mut spec = JobSpec::simple("j", 2, 2);
        (spec.prefer, spec.tolerate) = (LocalityLevel::Server, LocalityLevel::Rack);
        spec.slowdown = [(LocalityLevel::Rack, 0.3)].into_iter().collect();
        let mut f = Fixture::new(2, spec);
        for n in 0..2u64 {
            let id = f.view.submit(JobSpec::simple("six", 1, 6)).expect("admitted");
            let s = f.view.job(id).expect("job").spec.clone();
            let local = LocalView::of_view(&f.view);
            let found = crate::find_placement(&local, &Overlay::default(), &s, LocalityLevel::Server, FitMode::Pack, n);
            let p = Proposal {
                id: ProposalId(501 + n),
                job: id,
                members: found.expect("free").members,
                based_on: f.view.version(),
            };
            assert!(f.view.propose(&p).is_placed());
        }
        let mut releases = crate::locality_cost::ReleaseStats::new();
        for i in 0..50 {
            releases.record_release(f64::from(i), 1);
            releases.record_run(1_000.0);
        }
        let look = |m: &mut PlaceMachine<'_>, now: Duration| {
            let local = LocalView::of_view(&f.view);
            let running = RunningIndex::from_jobs(f.view.jobs());
            let reservations = crate::reservation::Reservations::new();
            let ctx =
                Context { running: &running, releases: &releases, reservations: &reservations, ahead: 0, now_s: 0.0 };
            m.step(now, Event::View { job: f.view.job(f.job), view: &local, version: f.view.version(), ctx })
        };
        let opts = RuntimeOptions { max_backoff: Duration::from_secs(3_600), ..RuntimeOptions::default() };
        let sched = LocalityTolerant::default();
        let mut m = PlaceMachine::new(&sched, f.job, Duration::ZERO, &opts);
        // Waiting pays: it waits, and looks again by the bound (429 s waited) at the latest.
        assert_eq!(wait_until(look(&mut m, Duration::ZERO)).1, 429 * S);
        assert!(m.waits_by_choice(), "a looser placement exists: waiting is a choice");
        assert_eq!(wait_until(look(&mut m, 100 * S)).1, 429 * S);
        // Waited as long as the tighter level could save: it starts across the two servers.
        let p = proposal(look(&mut m, 429 * S));
        assert_eq!(p.members.len(), 2);
        assert_ne!(p.members[0].server, p.members[1].server);
    }

    #[test]
    fn a_wait_never_exceeds_the_backoff_cap_and_a_job_at_its_tolerance_waits_for_the_cap() {
        let f = Fixture::new(1, spec(8, LocalityLevel::PcieSwitch, LocalityLevel::Server, Some(10)));
        let sched = LocalityTolerant::default();
        let mut m = machine(&sched, &f);
        // The step is 10 s away, the cap 2 s.
        assert_eq!(wait_until(f.look(&mut m, Duration::ZERO)).1, 2 * S);
        // No relax step left (its tolerance reached, the only server full): the cap.
        let mut f = Fixture::new(1, spec(8, LocalityLevel::Server, LocalityLevel::Server, Some(10)));
        f.fill(1);
        let mut m = machine(&sched, &f);
        assert_eq!(wait_until(f.look(&mut m, 3 * S)).1, 5 * S);
    }

    #[test]
    fn a_job_placed_again_is_never_proposed_under_an_id_it_spent() {
        // The same host (salt) and job: a new machine draws the ids the first one drew.
        let f = Fixture::new(1, spec(8, LocalityLevel::Server, LocalityLevel::Server, None));
        let sched = LocalityTolerant::default();
        let first = proposal(f.look(&mut machine(&sched, &f), Duration::ZERO));
        let local = LocalView::of_view(&f.view);
        let mut requeued = f.view.job(f.job).expect("job").clone();
        requeued.proposals.push(first.id);
        let mut m = machine(&sched, &f);
        let view = Event::View { job: Some(&requeued), view: &local, version: f.view.version(), ctx: Context::empty() };
        let again = proposal(m.step(Duration::ZERO, view));
        assert_ne!(again.id, first.id, "the approver would refuse a spent id");
        assert_eq!(again.members, first.members);
    }

    #[test]
    fn an_in_process_approvers_decisions_are_answered_as_a_leaders_are() {
        let mut f = Fixture::new(1, spec(8, LocalityLevel::Server, LocalityLevel::Server, None));
        let sched = LocalityTolerant::default();
        let mut m = machine(&sched, &f);
        let p = proposal(f.look(&mut m, Duration::ZERO));
        f.fill(1);
        // The server was taken meanwhile: a conflict with its fresh record.
        match Answer::decided(f.view.propose(&p)) {
            Answer::Conflict { fresh, .. } => assert_eq!(fresh[0].1.free_gpus, 0),
            other => panic!("expected a conflict, got {other:?}"),
        }
        // A proposal for a job that is not waiting: refused with the approver's code.
        let running = f.view.jobs().into_iter().find(|j| j.id != f.job).expect("a running job").id;
        let again = Proposal { id: ProposalId(77), job: running, ..p.clone() };
        match Answer::decided(f.view.propose(&again)) {
            Answer::Refused { code, .. } => assert!(!code.is_empty()),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let mut g = Fixture::new(1, spec(8, LocalityLevel::Server, LocalityLevel::Server, None));
        let mut m = machine(&sched, &g);
        let p = proposal(g.look(&mut m, Duration::ZERO));
        assert!(matches!(Answer::decided(g.view.propose(&p)), Answer::Accepted { level: LocalityLevel::Server }));
        assert!(matches!(Answer::decided(g.view.propose(&p)), Answer::AlreadyApplied { .. }), "a resend");
    }

    #[test]
    fn a_conflict_teaches_the_overlay_and_the_next_proposal_avoids_the_taken_server() {
        let f = Fixture::new(2, spec(8, LocalityLevel::Server, LocalityLevel::Server, None));
        let sched = LocalityTolerant::default();
        let mut m = machine(&sched, &f);
        let first = proposal(f.look(&mut m, Duration::ZERO));
        let taken = first.members[0].server;
        let mut busy = *f.view.server(taken).expect("server");
        busy.free_gpus = 0;
        let fresh = vec![(taken, busy)];
        let until = sleep_until(m.step(S, Event::Answer(Answer::Conflict { fresh, message: "taken".into() })));
        assert!(until >= S + 10 * MS && until < S + 30 * MS, "first backoff: 20 ms ±50 %, got {until:?}");
        assert_eq!(m.conflicts(), 1);
        let second = proposal(f.look(&mut m, until));
        assert_ne!(second.members[0].server, taken, "the overlay holds the fresh record");
        assert_ne!(second.id, first.id, "a new proposal gets a new id");
    }

    #[test]
    fn conflicts_back_off_doubling_with_jitter_up_to_the_cap() {
        let f = Fixture::new(1, spec(1, LocalityLevel::Server, LocalityLevel::Server, None));
        let sched = LocalityTolerant::default();
        let opts = RuntimeOptions::default();
        let mut m = PlaceMachine::new(&sched, f.job, Duration::ZERO, &opts);
        let mut now = Duration::ZERO;
        let mut ids = std::collections::HashSet::new();
        let mut delays = Vec::new();
        for _ in 0..12 {
            let p = proposal(f.look(&mut m, now));
            assert!(ids.insert(p.id), "ids are fresh");
            let answer = Answer::Conflict { fresh: Vec::new(), message: "raced".into() };
            let until = sleep_until(m.step(now, Event::Answer(answer)));
            delays.push(until - now);
            now = until;
        }
        for (k, d) in delays.iter().enumerate() {
            let base = (opts.min_backoff * 2u32.pow(k as u32)).min(opts.max_backoff);
            assert!(*d >= base.mul_f64(0.5) && *d < base.mul_f64(1.5), "delay {k}: {d:?} around {base:?}");
        }
        assert!(delays.iter().all(|d| *d < 3 * S), "never more than the cap ×1.5");
        assert_eq!(m.conflicts(), 12);
    }

    #[test]
    fn an_unknown_outcome_resends_the_same_proposal_even_when_the_copy_shows_the_job_placed() {
        let mut f = Fixture::new(1, spec(4, LocalityLevel::Socket, LocalityLevel::Socket, None));
        let sched = LocalityTolerant::default();
        let mut m = machine(&sched, &f);
        let p = proposal(f.look(&mut m, Duration::ZERO));
        let t1 = sleep_until(m.step(S, Event::Answer(Answer::Unknown("leader changed".into()))));
        assert_eq!(proposal(f.look(&mut m, t1)), p, "the same id, members and base");
        // The call itself failed (no replica answered): also unknown, and the backoff grew.
        let t2 = sleep_until(m.step(t1, Event::Answer(Answer::Failed(unavailable()))));
        assert!(t2 - t1 >= 20 * MS, "the second backoff is 40 ms ±50 %: {:?}", t2 - t1);
        // Meanwhile the first send committed: the copy shows the job placed. The proposal is
        // still in doubt, so it goes again (the approver answers AlreadyApplied).
        assert!(f.view.propose(&p).is_placed());
        assert_eq!(proposal(f.look(&mut m, t2)), p);
        match m.step(t2, Event::Answer(Answer::AlreadyApplied { level: None })) {
            Action::Done(Placed::Placed { proposal, level, .. }) => {
                assert_eq!((proposal, level), (p.id, LocalityLevel::Socket), "the level allowed when sent");
            }
            other => panic!("{other:?}"),
        }
    }

    /// A scheduler that always preempts with the gang and victims it was built with.
    #[derive(Debug)]
    struct Displacer(Vec<tessera_view::MemberPlacement>, Vec<JobId>);

    impl Scheduler for Displacer {
        fn name(&self) -> &str {
            "displacer"
        }
        fn schedule(&self, _: &Attempt<'_>) -> Verdict {
            Verdict::Preempt { members: self.0.clone(), victims: self.1.clone() }
        }
    }

    #[test]
    fn a_preempt_verdict_is_sent_as_one_preemption_and_resent_as_is_when_its_outcome_is_unknown() {
        let mut f =
            Fixture::new(1, JobSpec { priority: 10, ..spec(8, LocalityLevel::Server, LocalityLevel::Server, None) });
        f.fill(1);
        let victim = JobId(f.job.0 + 1);
        // The gang, planned as if the victim were gone.
        let mut without = f.view.clone();
        without.release(victim, false).expect("placed");
        let spec = f.view.job(f.job).expect("job").spec.clone();
        let found = crate::find_placement(
            &LocalView::of_view(&without),
            &Overlay::default(),
            &spec,
            LocalityLevel::Server,
            tessera_view::fit::FitMode::Pack,
            0,
        )
        .expect("the server, once free");
        let sched = Displacer(found.members.clone(), vec![victim]);
        let mut m = machine(&sched, &f);
        let Action::Preempt(pre) = f.look(&mut m, S) else { panic!("expected a preemption") };
        assert_eq!((pre.proposal.job, &pre.proposal.members, &pre.victims), (f.job, &found.members, &vec![victim]));
        assert!(pre.reason.contains("displacer"), "{}", pre.reason);
        // The outcome is lost: the same preemption goes again, under the same id.
        assert!(sleep_until(m.step(S, Event::Answer(Answer::Unknown("leader changed".into())))) > S);
        let Action::Preempt(again) = f.look(&mut m, 2 * S) else { panic!("expected the preemption again") };
        assert_eq!(again, pre);
        // The approver takes it: the victim waits again, the job is placed.
        assert!(f.view.preempt(&again).is_placed());
        assert_eq!(f.view.job(victim).expect("victim").state, JobState::Pending);
        match m.step(2 * S, Event::Answer(Answer::Accepted { level: LocalityLevel::Server })) {
            Action::Done(Placed::Placed { proposal, .. }) => assert_eq!(proposal, pre.proposal.id),
            other => panic!("expected placed, got {other:?}"),
        }
    }

    #[test]
    fn a_job_that_fits_nowhere_displaces_a_job_it_outranks_and_only_such_a_job() {
        // Two full servers, held by jobs of priority 0 and 10; the job of priority 10 needs a
        // whole server.
        let mut f =
            Fixture::new(2, JobSpec { priority: 10, ..spec(8, LocalityLevel::Server, LocalityLevel::Server, None) });
        f.fill_ranked(&[0, 10]);
        let low = JobId(f.job.0 + 1);
        let sched = LocalityTolerant::default();
        // Preemption off (the cluster's bound 0): the job waits.
        let mut m = machine(&sched, &f);
        wait_until(f.look_indexed(&mut m, S, 0));
        // On: it displaces the job it outranks, not its equal.
        let mut m = machine(&sched, &f);
        let Action::Preempt(pre) = f.look_indexed(&mut m, S, 3) else { panic!("expected a preemption") };
        assert_eq!(pre.victims, vec![low], "only the job it outranks");
        let low_server = f.view.job(low).and_then(|j| j.placement.as_ref()).expect("placed").members[0].server;
        assert!(pre.proposal.members.iter().all(|p| p.server == low_server), "{pre:?}");
        assert!(pre.reason.contains("priority 10"), "{}", pre.reason);
        assert!(f.view.preempt(&pre).is_placed(), "the approver takes the host's choice");
        assert_eq!(f.view.job(low).expect("victim").state, JobState::Pending);
        // A job outranking nobody waits.
        let mut f = Fixture::new(1, spec(8, LocalityLevel::Server, LocalityLevel::Server, None));
        f.fill(1);
        let mut m = machine(&sched, &f);
        wait_until(f.look_indexed(&mut m, S, 3));
    }

    #[test]
    fn an_error_status_is_final() {
        let f = Fixture::new(1, spec(1, LocalityLevel::Server, LocalityLevel::Server, None));
        let sched = LocalityTolerant::default();
        let mut m = machine(&sched, &f);
        proposal(f.look(&mut m, Duration::ZERO));
        let a = m.step(S, Event::Answer(Answer::Failed(status(tonic::Status::invalid_argument("bad")))));
        assert!(matches!(a, Action::Fail(SchedulerError::Call { .. })), "{a:?}");
    }

    /// A scheduler that never places anything.
    #[derive(Debug)]
    struct Quits;

    impl Scheduler for Quits {
        fn name(&self) -> &str {
            "quits"
        }
        fn schedule(&self, a: &Attempt<'_>) -> Verdict {
            Verdict::GiveUp(format!("{} GPUs are too many", a.job.spec.total_gpus()))
        }
    }

    #[test]
    fn giving_up_cancels_the_job_with_the_reason() {
        let f = Fixture::new(1, spec(2, LocalityLevel::Server, LocalityLevel::Server, None));
        let sched = Quits;
        let start = |m: &mut PlaceMachine<'_>| match f.look(m, Duration::ZERO) {
            Action::GiveUp { reason } => reason,
            other => panic!("expected to give up, got {other:?}"),
        };
        let mut m = machine(&sched, &f);
        let reason = start(&mut m);
        assert_eq!(reason, "scheduler `quits` gave up: 2 GPUs are too many");
        match m.step(S, Event::Cancelled(Ok(()))) {
            Action::Done(Placed::GaveUp(r)) => assert_eq!(r, reason),
            other => panic!("{other:?}"),
        }
        // Someone ended the job first: it is no longer pending.
        let mut m = machine(&sched, &f);
        start(&mut m);
        let over = status(tonic::Status::failed_precondition("job is over"));
        assert!(matches!(m.step(S, Event::Cancelled(Err(over))), Action::Done(Placed::NotPending(JobState::Failed))));
        // The cancel could not be sent: an error.
        let mut m = machine(&sched, &f);
        start(&mut m);
        assert!(matches!(m.step(S, Event::Cancelled(Err(unavailable()))), Action::Fail(SchedulerError::Call { .. })));
    }

    #[test]
    fn a_refusal_reads_the_job_and_stops_if_it_is_over_or_waits_for_the_view_if_not() {
        let f = Fixture::new(1, spec(1, LocalityLevel::Server, LocalityLevel::Server, None));
        let sched = LocalityTolerant::default();
        let mut m = machine(&sched, &f);
        let p = proposal(f.look(&mut m, Duration::ZERO));
        let refused = || Answer::Refused { code: "bad_shape".into(), message: "no".into() };
        assert!(matches!(m.step(S, Event::Answer(refused())), Action::ReadJob));
        // Still pending (or the read failed): wait for the view past the proposal's base.
        assert_eq!(wait_until(m.step(S, Event::JobState(Some(JobState::Pending)))), (p.based_on, 3 * S));
        let q = proposal(f.look(&mut m, 2 * S));
        assert_ne!(q.id, p.id, "not in doubt: a new proposal");
        assert!(matches!(m.step(2 * S, Event::Answer(refused())), Action::ReadJob));
        assert!(matches!(m.step(2 * S, Event::JobState(None)), Action::WaitForView { .. }));
        proposal(f.look(&mut m, 3 * S));
        assert!(matches!(m.step(3 * S, Event::Answer(refused())), Action::ReadJob));
        let a = m.step(3 * S, Event::JobState(Some(JobState::Failed)));
        assert!(matches!(a, Action::Done(Placed::NotPending(JobState::Failed))), "{a:?}");
    }

    #[test]
    fn a_job_missing_from_the_copy_is_waited_for_up_to_the_cap_then_unknown() {
        let f = Fixture::new(1, spec(1, LocalityLevel::Server, LocalityLevel::Server, None));
        let empty = LocalView::of_view(&f.view);
        let missing = |m: &mut PlaceMachine<'_>, now| {
            m.step(now, Event::View { job: None, view: &empty, version: f.view.version(), ctx: Context::empty() })
        };
        let sched = LocalityTolerant::default();
        let mut m = machine(&sched, &f);
        assert_eq!(wait_until(missing(&mut m, S)).1, 3 * S);
        assert_eq!(wait_until(missing(&mut m, 2 * S)).1, 3 * S, "one deadline for the whole absence");
        let a = missing(&mut m, 3 * S);
        assert!(matches!(a, Action::Fail(SchedulerError::UnknownJob(j)) if j == f.job), "{a:?}");
        // A job that turns up in time is scheduled, and a later absence gets a new deadline.
        let mut m = machine(&sched, &f);
        wait_until(missing(&mut m, S));
        proposal(f.look(&mut m, 2 * S));
        sleep_until(m.step(2 * S, Event::Answer(Answer::Conflict { fresh: Vec::new(), message: "x".into() })));
        assert_eq!(wait_until(missing(&mut m, 10 * S)).1, 12 * S);
    }

    #[test]
    fn a_job_no_longer_pending_ends_the_machine_quietly() {
        let mut f = Fixture::new(1, spec(1, LocalityLevel::Server, LocalityLevel::Server, None));
        f.view.cancel(f.job).expect("cancel");
        let sched = LocalityTolerant::default();
        let mut m = machine(&sched, &f);
        assert!(matches!(f.look(&mut m, Duration::ZERO), Action::Done(Placed::NotPending(JobState::Failed))));
    }

    #[test]
    fn events_out_of_order_are_refused() {
        let f = Fixture::new(1, spec(1, LocalityLevel::Server, LocalityLevel::Server, None));
        let sched = LocalityTolerant::default();
        let mut m = machine(&sched, &f);
        let a = m.step(Duration::ZERO, Event::Answer(Answer::Unknown("?".into())));
        assert!(matches!(a, Action::Fail(SchedulerError::OutOfOrder { expected: "a view", got: "an answer", .. })));
        let mut m = machine(&sched, &f);
        proposal(f.look(&mut m, Duration::ZERO));
        assert!(matches!(f.look(&mut m, S), Action::Fail(SchedulerError::OutOfOrder { .. })));
    }

    #[test]
    fn the_same_salt_gives_the_same_run() {
        let f = Fixture::new(2, spec(1, LocalityLevel::Server, LocalityLevel::Server, None));
        let sched = LocalityTolerant::default();
        let run = |salt| {
            let opts = RuntimeOptions { salt, ..RuntimeOptions::default() };
            let mut m = PlaceMachine::new(&sched, f.job, Duration::ZERO, &opts);
            let mut now = Duration::ZERO;
            let mut out = Vec::new();
            for _ in 0..4 {
                let p = proposal(f.look(&mut m, now));
                now = sleep_until(
                    m.step(now, Event::Answer(Answer::Conflict { fresh: Vec::new(), message: "x".into() })),
                );
                out.push((p.id, now));
            }
            out
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }
}
