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
    Decision, Job, JobId, JobSpec, JobState, LocalityLevel, Preemption, Proposal, ProposalId, ServerId, ServerRecord,
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

    /// When a job of `spec` (this machine's) next relaxes its tolerance (the spec's
    /// `relax_after_s` step after `now`, on the machine's clock), if it still can: the latest a
    /// waiting job must look again whatever the view does.
    pub fn relax_wake(&self, now: Duration, spec: &JobSpec) -> Option<Duration> {
        let r = spec.relax_after_s.filter(|r| *r > 0)?;
        let waited_s = now.saturating_sub(self.waited_from).as_secs();
        if spec.allowed_level(waited_s) >= spec.tolerate {
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
                if let Some(step) = self.relax_wake(now, &j.spec) {
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
mod tests;
