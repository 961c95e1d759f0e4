//! The agent's decisions, without I/O: which tasks to start, stop, checkpoint or report, given
//! what the view wants on this server and what runs here.
//!
//! This is the reconciler's core, in the shape of `Scheduler::schedule`: state in, actions out.
//! [`desired`] turns the agent's copy of the view into the members it wants here; [`plan`]
//! compares them with the local tasks (a [`Round`]: what runs, what is being stopped, what each
//! started task was granted, what has a task directory, which start reports are queued) and
//! answers the [`Action`]s of one round. The async shell in `agent.rs` gathers those facts (the
//! runner, the task directories, the outbox), executes the actions in order (signals, shim
//! starts, reports) and records their outcomes in its [`Memory`]. Nothing here reads a clock, a
//! file or the network, so every decision is unit-tested by the actions it emits.
//!
//! The rules of a round, for each task id (actions come in this order):
//!
//! | action | when |
//! |---|---|
//! | [`Action::Forget`] | it had no process or could not start, and is no longer wanted |
//! | [`Action::ReportStarted`] | it runs, is wanted, the view still sees it starting, and no start report is queued |
//! | [`Action::Checkpoint`] | it runs, is not wanted, is not being stopped, and its job is migrating to another placement or was re-queued (preempted) to run again later |
//! | [`Action::Stop`] | the same, but its job is neither migrating away from it nor re-queued |
//! | [`Action::Wait`] | it is wanted and never ran here, and a task being stopped (this round or before) holds, or may hold, some of its devices or cores |
//! | [`Action::Refuse`] | otherwise, when its grant names devices or cores the server's model lacks |
//! | [`Action::NoProcess`] | otherwise, when its job has no command |
//! | [`Action::Start`] | otherwise |
//!
//! "Never ran here" means: not running, no task directory, not remembered as having no process
//! or as having failed to start. A task directory is kept until the member's placement is gone,
//! so a member that ran (and ended) is never started twice.

use crate::error::AgentError;
use crate::task::{TaskExit, TaskId};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use tessera_view::{CoreMask, Job, JobState, MemberPlacement, ServerId, TaskState, Topology};

/// The devices and view cores a task was granted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Grant {
    /// Devices (bit `i` = device `i`).
    pub gpus: u64,
    /// View cores.
    pub cores: CoreMask,
}

impl Grant {
    /// Whether the two grants share a device or a core.
    pub fn overlaps(self, other: Grant) -> bool {
        self.gpus & other.gpus != 0 || self.cores.intersects(other.cores)
    }
}

impl From<&MemberPlacement> for Grant {
    fn from(m: &MemberPlacement) -> Grant {
        Grant { gpus: m.gpus, cores: m.cores }
    }
}

/// A member placed on this server that the view wants run (it has not succeeded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    /// Its grant here.
    pub member: MemberPlacement,
    /// Whether its job has a command (a simulated job has none: nothing runs).
    pub has_command: bool,
    /// The view's state of its task (`None`: the view tracks none yet).
    pub view_state: Option<TaskState>,
}

/// The members the placements want on `server`: those of placed, running or migrating jobs
/// (a migrating job's new members start like a placed job's) that have not succeeded.
pub fn desired<'a>(jobs: impl IntoIterator<Item = &'a Job>, server: ServerId) -> BTreeMap<TaskId, Want> {
    let mut want = BTreeMap::new();
    for j in jobs {
        if !matches!(j.state, JobState::Placed | JobState::Running | JobState::Migrating) {
            continue;
        }
        let Some(p) = &j.placement else { continue };
        for (k, m) in p.members.iter().enumerate() {
            let view_state = j.tasks.get(k).copied();
            if m.server != server || view_state == Some(TaskState::Succeeded) {
                continue;
            }
            let Ok(member) = u32::try_from(k) else { continue };
            want.insert(
                TaskId { job: j.id.0, proposal: p.proposal.0, member },
                Want { member: *m, has_command: !j.spec.command.is_empty(), view_state },
            );
        }
    }
    want
}

/// What the agent remembers between rounds about the tasks it handled; the shell updates it
/// from the actions it executed and their outcomes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Tasks this agent signalled to stop (or checkpoint); their exits are not reported.
    pub stopping: BTreeSet<TaskId>,
    /// The grants of the tasks this agent started (re-adopted tasks have none known): a new task
    /// does not start on what a stopping task still holds.
    pub grants: HashMap<TaskId, Grant>,
    /// Members placed with no command (simulated jobs): reported started, nothing runs.
    pub no_process: HashSet<TaskId>,
    /// Members that could not start here (already reported failed).
    pub failed_start: HashSet<TaskId>,
}

impl Memory {
    /// A task ended: forgets its stop and grant; answers whether this agent had stopped it.
    pub fn ended(&mut self, id: TaskId) -> bool {
        self.grants.remove(&id);
        self.stopping.remove(&id)
    }

    /// A member is no longer wanted: forgets that it had no process or could not start.
    pub fn forget(&mut self, id: TaskId) {
        self.no_process.remove(&id);
        self.failed_start.remove(&id);
    }

    /// A start failed: the member is not tried again while its placement lives.
    pub fn start_failed(&mut self, id: TaskId) {
        self.grants.remove(&id);
        self.failed_start.insert(id);
    }
}

/// Everything one round decides on. The shell fills it; [`plan`] only reads it.
#[derive(Clone, Copy, Debug)]
pub struct Round<'a> {
    /// The members the view wants here ([`desired`]).
    pub desired: &'a BTreeMap<TaskId, Want>,
    /// The tasks running now (started or re-adopted, not yet ended).
    pub running: &'a BTreeSet<TaskId>,
    /// Wanted members that have a task directory (they run or ran here).
    pub ran: &'a HashSet<TaskId>,
    /// Tasks whose "started" report is queued, not yet acknowledged by the view.
    pub start_queued: &'a HashSet<TaskId>,
    /// Jobs leaving their tasks here to run again elsewhere or later, by id: the proposal of
    /// their new placement while they migrate, `None` once they are pending again (preempted or
    /// re-queued). Their tasks are checkpointed, not just stopped.
    pub migrating: &'a HashMap<u64, Option<u64>>,
    /// What the agent remembers from earlier rounds.
    pub memory: &'a Memory,
    /// This server's model, to check each grant against.
    pub model: &'a Topology,
    /// This server's name, for the reasons of refusals.
    pub server: &'a str,
}

/// One step the shell executes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stop remembering a member that had no process or could not start: its placement is gone.
    Forget(TaskId),
    /// Report a running task started (again): the view still sees it starting, e.g. because
    /// the report was lost with an earlier agent.
    ReportStarted(TaskId),
    /// Checkpoint a task of a migrating job's older placement, or of a job preempted back to
    /// pending (SIGUSR1, grace, then stop), so it can save its state before it ends.
    Checkpoint(TaskId),
    /// Stop a task whose placement is gone (SIGTERM, grace, SIGKILL): the job was cancelled,
    /// failed elsewhere, or was re-queued after a lease expiry.
    Stop(TaskId),
    /// Do not start a member yet: the task being stopped `behind` still holds (or, re-adopted
    /// with no grant known, may hold) some of its devices or cores. Its exit starts a new round.
    Wait {
        /// The member.
        id: TaskId,
        /// The stopping task in its way (the lowest id, when there are several).
        behind: TaskId,
    },
    /// Refuse a member whose grant names what this server lacks: report it ended with
    /// [`crate::agent::CANNOT_START`] and the reason, and do not try it again.
    Refuse {
        /// The member.
        id: TaskId,
        /// Why it cannot run here.
        why: String,
    },
    /// A member whose job has no command: report it started; nothing runs.
    NoProcess(TaskId),
    /// Start a member's task (the shell builds its spec from the job) and record its grant.
    Start {
        /// The member.
        id: TaskId,
        /// Its devices and view cores.
        grant: Grant,
    },
}

/// The actions of one round, in the order of the rules in the module documentation (and within
/// a rule, in task id order).
pub fn plan(r: &Round<'_>) -> Vec<Action> {
    let mut actions = Vec::new();
    let m = r.memory;
    let remembered = m.no_process.iter().chain(&m.failed_start).filter(|id| !r.desired.contains_key(*id));
    let mut forget: Vec<TaskId> = remembered.copied().collect();
    forget.sort_unstable();
    forget.dedup();
    actions.extend(forget.into_iter().map(Action::Forget));

    for (id, w) in r.desired {
        let view_starting = w.view_state.is_none_or(|s| s == TaskState::Starting);
        if r.running.contains(id) && view_starting && !r.start_queued.contains(id) {
            actions.push(Action::ReportStarted(*id));
        }
    }

    // Stopped this round or before: a start must not take what these still hold.
    let mut stopping = m.stopping.clone();
    for id in r.running.iter().filter(|id| !r.desired.contains_key(*id) && !m.stopping.contains(*id)) {
        // A moved job holds its new placement from the moment the move commits; the task of
        // its old placement gets the chance to save its state first.
        let moved_away = r.migrating.get(&id.job).is_some_and(|new| *new != Some(id.proposal));
        actions.push(if moved_away { Action::Checkpoint(*id) } else { Action::Stop(*id) });
        stopping.insert(*id);
    }

    for (id, w) in r.desired {
        let ran =
            r.running.contains(id) || r.ran.contains(id) || m.no_process.contains(id) || m.failed_start.contains(id);
        if ran {
            continue;
        }
        let grant = Grant::from(&w.member);
        // A stopping task with no grant known (re-adopted) may hold anything.
        let behind = stopping.iter().find(|s| m.grants.get(*s).is_none_or(|g| g.overlaps(grant)));
        if let Some(behind) = behind {
            actions.push(Action::Wait { id: *id, behind: *behind });
        } else if let Err(why) = check_member(r.model, r.server, &w.member) {
            actions.push(Action::Refuse { id: *id, why: why.to_string() });
        } else if !w.has_command {
            actions.push(Action::NoProcess(*id));
        } else {
            actions.push(Action::Start { id: *id, grant });
        }
    }
    actions
}

/// Whether a member's grant exists on this server's model; the reason when it does not.
pub fn check_member(t: &Topology, server: &str, m: &MemberPlacement) -> Result<(), AgentError> {
    let missing = m.gpus & !t.all_devices();
    if missing != 0 {
        return Err(AgentError::MissingDevices { server: server.to_string(), missing, has: t.all_devices() });
    }
    if !m.cores.is_subset_of(t.all_cores()) {
        let missing = m.cores.without(t.all_cores());
        return Err(AgentError::MissingCores { server: server.to_string(), missing, has: t.cores() });
    }
    Ok(())
}

/// What to tell the view about a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// Its process runs (or, with no command, it has nothing to run).
    Started,
    /// It ended.
    Exited {
        /// Its exit code (`-signal` when a signal killed it).
        code: i32,
        /// Why, for people; empty for code 0.
        message: String,
    },
}

/// What to do about a task that ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitDecision {
    /// This agent stopped it (its placement is gone): nothing to report.
    StoppedHere,
    /// The view acknowledged a report of this exit before (the runner delivers every kept exit
    /// again after a restart): nothing to report.
    ReportedBefore,
    /// Report it.
    Report(Report),
}

/// Decides on a task's exit: `stopped_here` is what [`Memory::ended`] answered,
/// `reported_before` whether its task directory records an acknowledged report.
pub fn on_exit(exit: &TaskExit, stopped_here: bool, reported_before: bool) -> ExitDecision {
    if stopped_here {
        return ExitDecision::StoppedHere;
    }
    if reported_before {
        return ExitDecision::ReportedBefore;
    }
    let code = match (exit.code, exit.signal) {
        (Some(c), _) => c,
        (None, Some(s)) => -s,
        // The shim died without recording how (lost): a failure.
        (None, None) => 1,
    };
    let message = if code == 0 { String::new() } else { exit.message.clone() };
    ExitDecision::Report(Report::Exited { code, message })
}

/// Records a finished task in `finished` (oldest first) and answers the oldest ones to forget
/// (remove their directories) so that at most `keep` stay, skipping those whose placement
/// still `lives`: a directory is what tells [`plan`] that a member already ran.
pub fn prune_finished(
    finished: &mut VecDeque<TaskId>,
    id: TaskId,
    keep: usize,
    lives: impl Fn(&TaskId) -> bool,
) -> Vec<TaskId> {
    finished.push_back(id);
    let mut kept = VecDeque::new();
    let mut forget = Vec::new();
    while finished.len() + kept.len() > keep {
        let Some(old) = finished.pop_front() else { break };
        if lives(&old) {
            kept.push_back(old);
        } else {
            forget.push(old);
        }
    }
    while let Some(k) = kept.pop_back() {
        finished.push_front(k);
    }
    forget
}

#[cfg(test)]
mod tests;
