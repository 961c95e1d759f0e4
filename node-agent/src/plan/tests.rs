//! The plan's rules, checked exhaustively for one task against every other fact of a round, and
//! by property for rounds of many tasks.
//!
//! `every_combination_of_one_task` enumerates the focal task's desired state × its local state
//! (running, task directory, queued start report, stopping, no process, failed start) × its
//! job's migration × another task that is being stopped, or is to be stopped this round, with a
//! grant that overlaps, does not overlap or is unknown; the expected actions come from the rule
//! table of the module documentation, written out again here, and a coverage check proves the
//! enumeration reaches every kind of action.

use super::*;
use proptest::prelude::*;
use tessera_view::placement::GangPlacement;
use tessera_view::{JobId, JobSpec, LocalityLevel, ProposalId, ViewVersion};

const SERVER: &str = "s";

fn model() -> Topology {
    Topology::preset("seed-8gpu").expect("preset")
}

fn grant(gpus: u64, core: u32) -> Grant {
    Grant { gpus, cores: CoreMask::range(core, 1) }
}

fn want(g: Grant, has_command: bool, view_state: Option<TaskState>) -> Want {
    Want {
        member: MemberPlacement { server: ServerId(0), gpus: g.gpus, cores: g.cores, memory_mib: 1 },
        has_command,
        view_state,
    }
}

/// The owned facts of a round, borrowed by [`Round`].
#[derive(Clone, Debug, Default)]
struct Facts {
    desired: BTreeMap<TaskId, Want>,
    running: BTreeSet<TaskId>,
    ran: HashSet<TaskId>,
    start_queued: HashSet<TaskId>,
    migrating: HashMap<u64, Option<u64>>,
    memory: Memory,
}

impl Facts {
    fn plan(&self, model: &Topology) -> Vec<Action> {
        plan(&Round {
            desired: &self.desired,
            running: &self.running,
            ran: &self.ran,
            start_queued: &self.start_queued,
            migrating: &self.migrating,
            memory: &self.memory,
            model,
            server: SERVER,
        })
    }
}

/// The focal task's desired state.
#[derive(Clone, Copy, Debug)]
enum Desired {
    Absent,
    Wanted { view_state: Option<TaskState>, has_command: bool, fits: bool },
}

/// The other task, and how its grant relates to the focal task's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Other {
    None,
    /// Being stopped since an earlier round.
    Stopping(Relation),
    /// Running with its placement gone: stopped this round.
    Unwanted(Relation),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Relation {
    Overlaps,
    Disjoint,
    Unknown,
}

#[derive(Clone, Copy, Debug)]
enum Migrating {
    No,
    /// To the focal task's own placement.
    Here,
    /// To another placement.
    Away,
    /// Back to pending (preempted).
    Requeued,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    desired: Desired,
    running: bool,
    ran: bool,
    start_queued: bool,
    stopping: bool,
    no_process: bool,
    failed_start: bool,
    migrating: Migrating,
    other: Other,
}

const T: TaskId = TaskId { job: 1, proposal: 0x10, member: 0 };
const O: TaskId = TaskId { job: 2, proposal: 0x30, member: 1 };

fn facts(c: &Case) -> Facts {
    let mut f = Facts::default();
    if let Desired::Wanted { view_state, has_command, fits } = c.desired {
        // Device 40 does not exist on seed-8gpu.
        let gpus = if fits { 1 } else { 1 | 1 << 40 };
        f.desired.insert(T, want(grant(gpus, 0), has_command, view_state));
    }
    mark(&mut f, T, [c.running, c.ran, c.start_queued, c.stopping, c.no_process, c.failed_start]);
    match c.migrating {
        Migrating::No => {}
        Migrating::Here => {
            f.migrating.insert(T.job, Some(T.proposal));
        }
        Migrating::Away => {
            f.migrating.insert(T.job, Some(0x99));
        }
        Migrating::Requeued => {
            f.migrating.insert(T.job, None);
        }
    }
    let relation = match c.other {
        Other::None => None,
        Other::Stopping(r) => {
            f.memory.stopping.insert(O);
            Some(r)
        }
        Other::Unwanted(r) => Some(r),
    };
    if let Some(r) = relation {
        f.running.insert(O);
        match r {
            Relation::Overlaps => {
                f.memory.grants.insert(O, grant(1, 5));
            }
            Relation::Disjoint => {
                f.memory.grants.insert(O, grant(0b10, 5));
            }
            Relation::Unknown => {}
        }
    }
    f
}

/// Puts `id` in the sets its flags name: running, ran, start queued, stopping, no process,
/// failed start.
fn mark(f: &mut Facts, id: TaskId, [running, ran, queued, stopping, no_process, failed]: [bool; 6]) {
    if running {
        f.running.insert(id);
    }
    if ran {
        f.ran.insert(id);
    }
    if queued {
        f.start_queued.insert(id);
    }
    if stopping {
        f.memory.stopping.insert(id);
    }
    if no_process {
        f.memory.no_process.insert(id);
    }
    if failed {
        f.memory.failed_start.insert(id);
    }
}

/// The rule table of the module documentation, for the focal task and the other one.
fn expected(c: &Case) -> Vec<Action> {
    let wanted = matches!(c.desired, Desired::Wanted { .. });
    let mut actions = Vec::new();
    if !wanted && (c.no_process || c.failed_start) {
        actions.push(Action::Forget(T));
    }
    if let Desired::Wanted { view_state, .. } = c.desired
        && c.running
        && matches!(view_state, None | Some(TaskState::Starting))
        && !c.start_queued
    {
        actions.push(Action::ReportStarted(T));
    }
    let t_stopped_now = c.running && !wanted && !c.stopping;
    if t_stopped_now {
        let leaving = matches!(c.migrating, Migrating::Away | Migrating::Requeued);
        actions.push(if leaving { Action::Checkpoint(T) } else { Action::Stop(T) });
    }
    if matches!(c.other, Other::Unwanted(_)) {
        // The other task's job is not migrating.
        actions.push(Action::Stop(O));
    }
    if let Desired::Wanted { has_command, fits, .. } = c.desired
        && !(c.running || c.ran || c.no_process || c.failed_start)
    {
        // The focal task itself, stopping with no grant known, is in its own way (and comes first).
        let other_blocks = matches!(c.other, Other::Stopping(r) | Other::Unwanted(r) if r != Relation::Disjoint);
        actions.push(if c.stopping {
            Action::Wait { id: T, behind: T }
        } else if other_blocks {
            Action::Wait { id: T, behind: O }
        } else if !fits {
            Action::Refuse { id: T, why: "placement names devices 40 but server s has devices 0-7".into() }
        } else if !has_command {
            Action::NoProcess(T)
        } else {
            Action::Start { id: T, grant: grant(1, 0) }
        });
    }
    actions
}

fn kind(a: &Action) -> &'static str {
    match a {
        Action::Forget(_) => "forget",
        Action::ReportStarted(_) => "report-started",
        Action::Checkpoint(_) => "checkpoint",
        Action::Stop(_) => "stop",
        Action::Wait { .. } => "wait",
        Action::Refuse { .. } => "refuse",
        Action::NoProcess(_) => "no-process",
        Action::Start { .. } => "start",
    }
}

#[test]
fn every_combination_of_one_task() {
    let model = model();
    let mut desired = vec![Desired::Absent];
    for view_state in [None, Some(TaskState::Starting), Some(TaskState::Running)] {
        for has_command in [false, true] {
            for fits in [false, true] {
                desired.push(Desired::Wanted { view_state, has_command, fits });
            }
        }
    }
    let mut others = vec![Other::None];
    for r in [Relation::Overlaps, Relation::Disjoint, Relation::Unknown] {
        others.extend([Other::Stopping(r), Other::Unwanted(r)]);
    }
    let mut seen: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut cases = 0;
    for &desired in &desired {
        for bits in 0..64u32 {
            let bit = |i: u32| bits >> i & 1 == 1;
            for migrating in [Migrating::No, Migrating::Here, Migrating::Away, Migrating::Requeued] {
                for &other in &others {
                    let c = Case {
                        desired,
                        running: bit(0),
                        ran: bit(1),
                        start_queued: bit(2),
                        stopping: bit(3),
                        no_process: bit(4),
                        failed_start: bit(5),
                        migrating,
                        other,
                    };
                    let got = facts(&c).plan(&model);
                    assert_eq!(got, expected(&c), "{c:?}");
                    for a in got.iter().filter(|a| !matches!(a, Action::Stop(id) if *id == O)) {
                        *seen.entry(kind(a)).or_default() += 1;
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 13 * 64 * 4 * 7);
    // Coverage: the enumeration reaches every kind of action for the focal task.
    let kinds = ["forget", "report-started", "checkpoint", "stop", "wait", "refuse", "no-process", "start"];
    for k in kinds {
        assert!(seen.get(k).is_some_and(|n| *n > 0), "no case plans `{k}` for the focal task: {seen:?}");
    }
}

#[test]
fn a_stop_of_this_round_holds_back_a_start_on_its_devices_until_its_exit() {
    let model = model();
    let old = TaskId { job: 3, proposal: 1, member: 0 };
    let new = TaskId { job: 4, proposal: 2, member: 0 };
    let mut f = Facts::default();
    f.running.insert(old);
    f.memory.grants.insert(old, grant(0b11, 0));
    f.desired.insert(new, want(grant(0b10, 8), true, None));
    assert_eq!(f.plan(&model), vec![Action::Stop(old), Action::Wait { id: new, behind: old }]);
    // The stop took effect: the next round waits without stopping again.
    f.memory.stopping.insert(old);
    assert_eq!(f.plan(&model), vec![Action::Wait { id: new, behind: old }]);
    // Its exit is in: the member starts.
    f.running.remove(&old);
    assert!(f.memory.ended(old), "this agent stopped it");
    assert_eq!(f.plan(&model), vec![Action::Start { id: new, grant: grant(0b10, 8) }]);
}

#[test]
fn a_migrating_jobs_old_task_is_checkpointed_and_its_new_member_starts_beside_it() {
    let model = model();
    let old = TaskId { job: 5, proposal: 1, member: 0 };
    let new = TaskId { job: 5, proposal: 2, member: 0 };
    let mut f = Facts::default();
    f.running.insert(old);
    f.memory.grants.insert(old, grant(0b1, 0));
    f.migrating.insert(5, Some(2));
    f.desired.insert(new, want(grant(0b100, 16), true, None));
    assert_eq!(f.plan(&model), vec![Action::Checkpoint(old), Action::Start { id: new, grant: grant(0b100, 16) }]);
    // Once the job runs again (no longer migrating), a leftover task of the old placement is
    // stopped plainly.
    f.migrating.clear();
    assert_eq!(f.plan(&model)[0], Action::Stop(old));
    // A job preempted back to pending: its task saves its state before it stops.
    f.desired.clear();
    f.migrating.insert(5, None);
    assert_eq!(f.plan(&model), vec![Action::Checkpoint(old)]);
}

#[test]
fn the_members_wanted_here() {
    let server = ServerId(1);
    let member = |s: u32| MemberPlacement { server: ServerId(s), gpus: 1, cores: CoreMask::range(0, 1), memory_mib: 1 };
    let states = [
        JobState::Pending,
        JobState::Placed,
        JobState::Running,
        JobState::Migrating,
        JobState::Finished,
        JobState::Failed,
    ];
    for state in states {
        for task in [None, Some(TaskState::Starting), Some(TaskState::Running), Some(TaskState::Succeeded)] {
            for command in [false, true] {
                let mut spec = JobSpec::simple("j", 3, 1);
                if command {
                    spec.command = vec!["true".into()];
                }
                let job = Job {
                    id: JobId(9),
                    spec,
                    state,
                    placement: Some(GangPlacement {
                        proposal: ProposalId(0x77),
                        // Members 0 and 2 here, member 1 elsewhere.
                        members: vec![member(1), member(0), member(1)],
                        level: LocalityLevel::Any,
                        placed_at: ViewVersion(1),
                    }),
                    submitted_at: ViewVersion(0),
                    proposals: vec![ProposalId(0x77)],
                    // Member 0 has the state under test; member 2 none yet.
                    tasks: task.into_iter().collect(),
                    error: None,
                    request: None,
                    preemptions: 0,
                    service_queue: 0,
                    user: String::new(),
                    times: Default::default(),
                    held: Vec::new(),
                    restarts: 0,
                    not_before_ms: 0,
                    waiting_for: Vec::new(),
                    ready_ms: 0,
                    array_index: None,
                    cancel_grace_s: None,
                    trace: None,
                };
                let got = desired([&job], server);
                let holds = matches!(state, JobState::Placed | JobState::Running | JobState::Migrating);
                let mut want = BTreeMap::new();
                if holds {
                    let id = |m| TaskId { job: 9, proposal: 0x77, member: m };
                    if task != Some(TaskState::Succeeded) {
                        want.insert(id(0), Want { member: member(1), has_command: command, view_state: task });
                    }
                    want.insert(id(2), Want { member: member(1), has_command: command, view_state: None });
                }
                assert_eq!(got, want, "{state} {task:?} command {command}");
                let mut pending = job.clone();
                pending.placement = None;
                assert!(desired([&pending], server).is_empty(), "no placement, nothing wanted");
            }
        }
    }
}

#[test]
fn a_grant_naming_what_the_server_lacks_is_refused_with_the_reason() {
    let t = Topology::preset("pcie-4gpu").expect("preset");
    let m = |gpus: u64, cores: CoreMask| MemberPlacement { server: ServerId(0), gpus, cores, memory_mib: 1 };
    check_member(&t, "s", &m(0b1111, CoreMask::range(0, 48))).expect("the whole server fits");
    let e = check_member(&t, "s", &m(1 << 6, CoreMask::range(0, 1))).expect_err("device 6");
    assert!(
        matches!(&e, AgentError::MissingDevices { server, missing: 0b100_0000, has: 0b1111 } if server == "s"),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("devices 6") && e.contains("has devices 0-3"), "{e}");
    let e = check_member(&t, "s", &m(1, CoreMask::range(40, 10))).expect_err("cores 48, 49");
    assert!(matches!(&e, AgentError::MissingCores { has: 48, .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("cores 48-49") && e.contains("48 cores"), "{e}");
}

#[test]
fn what_an_exit_reports() {
    let exit = |code, signal, message: &str| TaskExit { id: T, code, signal, message: message.into() };
    let report = |code, message: &str| ExitDecision::Report(Report::Exited { code, message: message.into() });
    let cases = [
        (exit(Some(0), None, "exited with code 0"), report(0, "")),
        (exit(Some(3), None, "exited with code 3"), report(3, "exited with code 3")),
        (exit(None, Some(9), "killed by signal 9"), report(-9, "killed by signal 9")),
        (exit(None, None, crate::task::LOST), report(1, crate::task::LOST)),
    ];
    for (e, want) in cases {
        assert_eq!(on_exit(&e, false, false), want, "{e:?}");
        assert_eq!(on_exit(&e, true, false), ExitDecision::StoppedHere);
        assert_eq!(on_exit(&e, true, true), ExitDecision::StoppedHere);
        assert_eq!(on_exit(&e, false, true), ExitDecision::ReportedBefore);
    }
}

#[test]
fn memory_follows_the_outcomes() {
    let mut m = Memory::default();
    m.grants.insert(T, grant(1, 0));
    m.stopping.insert(T);
    assert!(m.ended(T));
    assert!(!m.ended(T), "a second exit of the same task was not stopped here");
    assert!(m.grants.is_empty());
    m.grants.insert(O, grant(1, 0));
    m.start_failed(O);
    assert_eq!((m.grants.len(), m.failed_start.len()), (0, 1));
}

#[test]
fn finished_directories_are_bounded_but_never_those_of_live_placements() {
    let id = |n: u64| TaskId { job: n, proposal: 1, member: 0 };
    let mut finished = VecDeque::new();
    // Jobs 0..3 still hold their placements; the rest are gone.
    let lives = |t: &TaskId| t.job < 3;
    let mut forgotten = Vec::new();
    for n in 0..10 {
        forgotten.extend(prune_finished(&mut finished, id(n), 5, lives));
        assert!(finished.len() <= 5, "{finished:?}");
    }
    assert_eq!(forgotten, (3..8).map(id).collect::<Vec<_>>());
    assert_eq!(finished, [0, 1, 2, 8, 9].map(id));
    // With more live ones than the bound, none of them is removed.
    let mut finished: VecDeque<TaskId> = (0..3).map(id).collect();
    assert_eq!(prune_finished(&mut finished, id(3), 2, lives), vec![id(3)]);
    assert_eq!(finished, [0, 1, 2].map(id));
}

/// A round of up to 12 tasks whose grants take one of 4 cores and any of devices 0..5 (device 4
/// is not on pcie-4gpu: some grants are refused).
fn arb_facts() -> impl Strategy<Value = Facts> {
    let task = (
        0u64..6,
        0u64..2,
        any::<[bool; 9]>(),
        0u64..32,
        0u32..4,
        prop::option::of(prop::sample::select(vec![TaskState::Starting, TaskState::Running])),
    );
    (prop::collection::vec(task, 0..12), prop::collection::hash_map(0u64..6, prop::option::of(0u64..2), 0..3)).prop_map(
        |(tasks, migrating)| {
            let mut f = Facts { migrating, ..Facts::default() };
            for (member, (job, proposal, b, gpus, core, view_state)) in tasks.into_iter().enumerate() {
                let id = TaskId { job, proposal, member: member as u32 };
                let g = grant(gpus, core);
                let [wanted, running, ran, queued, stopping, no_process, failed, known, command] = b;
                if wanted {
                    f.desired.insert(id, want(g, command, view_state));
                }
                mark(&mut f, id, [running, ran, queued, stopping, no_process, failed]);
                if known {
                    f.memory.grants.insert(id, g);
                }
            }
            f
        },
    )
}

/// Applies a round's actions as the shell would when every one succeeds.
fn execute(f: &mut Facts, actions: &[Action]) {
    for a in actions {
        match a {
            Action::Forget(id) => f.memory.forget(*id),
            Action::ReportStarted(id) => {
                f.start_queued.insert(*id);
            }
            Action::Checkpoint(id) | Action::Stop(id) => {
                f.memory.stopping.insert(*id);
            }
            Action::Wait { .. } => {}
            Action::Refuse { id, .. } => {
                f.memory.failed_start.insert(*id);
            }
            Action::NoProcess(id) => {
                f.memory.no_process.insert(*id);
                f.start_queued.insert(*id);
            }
            Action::Start { id, grant } => {
                f.memory.grants.insert(*id, *grant);
                f.running.insert(*id);
                f.ran.insert(*id);
                f.start_queued.insert(*id);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn rounds_of_many_tasks(f in arb_facts()) {
        let model = Topology::preset("pcie-4gpu").expect("preset");
        let actions = f.plan(&model);
        prop_assert_eq!(&actions, &f.plan(&model), "deterministic");
        // The phases come in order.
        let phase = |a: &Action| match a {
            Action::Forget(_) => 0,
            Action::ReportStarted(_) => 1,
            Action::Checkpoint(_) | Action::Stop(_) => 2,
            _ => 3,
        };
        prop_assert!(actions.windows(2).all(|w| phase(&w[0]) <= phase(&w[1])), "{:?}", actions);
        let mut stopping = f.memory.stopping.clone();
        let mut decided = HashSet::new();
        for a in &actions {
            match a {
                Action::Checkpoint(id) | Action::Stop(id) => {
                    prop_assert!(f.running.contains(id) && !f.desired.contains_key(id));
                    prop_assert!(stopping.insert(*id), "stopped twice or again: {:?}", id);
                }
                Action::Wait { id, .. } | Action::Refuse { id, .. } | Action::NoProcess(id) | Action::Start { id, .. } => {
                    prop_assert!(f.desired.contains_key(id));
                    let never_ran = !(f.running.contains(id) || f.ran.contains(id)
                        || f.memory.no_process.contains(id) || f.memory.failed_start.contains(id));
                    prop_assert!(never_ran, "decided on a member that ran: {:?}", a);
                    prop_assert!(decided.insert(*id), "two decisions for {:?}", id);
                }
                Action::ReportStarted(id) => {
                    prop_assert!(f.running.contains(id) && !f.start_queued.contains(id));
                }
                Action::Forget(id) => prop_assert!(!f.desired.contains_key(id)),
            }
        }
        // Every running task whose placement is gone is being stopped after the round.
        for id in f.running.iter().filter(|id| !f.desired.contains_key(*id)) {
            prop_assert!(stopping.contains(id));
        }
        // Every member that never ran got exactly one decision.
        for id in f.desired.keys() {
            let never_ran = !(f.running.contains(id) || f.ran.contains(id)
                || f.memory.no_process.contains(id) || f.memory.failed_start.contains(id));
            prop_assert_eq!(never_ran, decided.contains(id), "{:?}", id);
        }
        // No start takes anything a stopping task holds or may hold.
        for a in &actions {
            if let Action::Start { grant, .. } = a {
                for s in &stopping {
                    let held = f.memory.grants.get(s);
                    prop_assert!(held.is_some_and(|h| !h.overlaps(*grant)), "start on {:?} while {:?} stops", grant, s);
                }
            }
        }
        // Once the actions took effect, the next round repeats no stop, start or report.
        let mut after = f.clone();
        execute(&mut after, &actions);
        let again = after.plan(&model);
        prop_assert!(
            again.iter().all(|a| matches!(a, Action::Wait { .. })),
            "second round: {:?}", again
        );
    }
}
