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
    let toml = format!("name='t'\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology='seed-8gpu'\nservers={servers}\n");
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
    let spec = &f.view.job(f.job).expect("job").spec;
    assert_eq!(m.relax_wake(9 * S, spec), Some(15 * S));
    assert_eq!(m.relax_wake(15 * S, spec), Some(25 * S));
    assert_eq!(m.relax_wake(25 * S, spec), None, "at its tolerance: no step left");
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
        let ctx = Context { running: &running, releases: &releases, reservations: &reservations, ahead: 0, now_s: 0.0 };
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
            now = sleep_until(m.step(now, Event::Answer(Answer::Conflict { fresh: Vec::new(), message: "x".into() })));
            out.push((p.id, now));
        }
        out
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}
