//! The task runner: starts each task under its own small supervisor process, the *shim*
//! (the containerd-shim / conmon pattern), so that tasks outlive an agent crash and a restarted
//! agent re-adopts them instead of leaving orphans.
//!
//! Every task has a directory `<state dir>/tasks/<task id>/`:
//!
//! | file         | written by | holds                                                           |
//! |--------------|------------|-----------------------------------------------------------------|
//! | `spec.json`  | runner     | the [`TaskSpec`]                                                |
//! | `shim.pid`   | both       | the shim's pid                                                  |
//! | `task.pid`   | shim       | the task's pid, then its start time (`/proc/<pid>/stat` field 22) |
//! | `stdout.log` | task       | the task's standard output (appended)                           |
//! | `stderr.log` | task       | the task's standard error (appended)                            |
//! | `notes.txt`  | shim       | warnings, e.g. why a memory limit was not applied               |
//! | `exit.json`  | shim       | how the task ended, written atomically when it has ended        |
//!
//! The shim ([`shim_main`], run by the agent binary as `tessera agent shim`) lives in its own
//! process group and runs the task in another one, so the agent signals the task's group and
//! never the shim. A task's directory stays until its exit has been taken and
//! [`Runner::forget`] is called, so an exit is delivered at least once even across restarts.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::error::{AgentError, chain};
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;

mod shim;
pub use shim::shim_main;

/// The environment variable that tells the shim its task directory.
pub const SHIM_DIR_ENV: &str = "TESSERA_SHIM_DIR";

const SPEC: &str = "spec.json";
const STDOUT: &str = "stdout.log";
const STDERR: &str = "stderr.log";
const SHIM_PID: &str = "shim.pid";
const TASK_PID: &str = "task.pid";
const EXIT: &str = "exit.json";
/// The file in a task directory where the shim records warnings, one per line.
pub const NOTES: &str = "notes.txt";
/// The message of the exit reported for a task whose shim died without recording one.
pub const LOST: &str = "lost: its shim died";

/// How often an adopted shim (not our child, so not awaitable) is checked for liveness.
const ADOPTED_POLL: Duration = Duration::from_millis(100);
/// How long [`Runner::start`] waits for the shim to report the task's pid.
const START_WAIT: Duration = Duration::from_secs(10);
/// How long [`Runner::shutdown_all`] waits past the grace period before giving up.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(10);

/// Identifies a task: one member of a gang placed by one proposal of a job.
///
/// Displayed (and parsed) as `j<job>-p<proposal in hex>-m<member>`, the name of its directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskId {
    /// The job.
    pub job: u64,
    /// The proposal that placed the gang.
    pub proposal: u64,
    /// The member of the gang.
    pub member: u32,
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "j{}-p{:x}-m{}", self.job, self.proposal, self.member)
    }
}

impl FromStr for TaskId {
    type Err = AgentError;

    /// Parses the canonical form only (what [`fmt::Display`] writes), so one id has one name.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || AgentError::BadTaskId(s.to_string());
        let rest = s.strip_prefix('j').ok_or_else(bad)?;
        let (job, rest) = rest.split_once("-p").ok_or_else(bad)?;
        let (proposal, member) = rest.split_once("-m").ok_or_else(bad)?;
        let id = TaskId {
            job: job.parse().map_err(|_| bad())?,
            proposal: u64::from_str_radix(proposal, 16).map_err(|_| bad())?,
            member: member.parse().map_err(|_| bad())?,
        };
        if id.to_string() == s { Ok(id) } else { Err(bad()) }
    }
}

/// What to run for a task, and how to confine it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The task's id.
    pub id: TaskId,
    /// The program and its arguments (the program is looked up in `PATH`).
    pub command: Vec<String>,
    /// Variables added to the agent's environment (e.g. `CUDA_VISIBLE_DEVICES`).
    pub env: Vec<(String, String)>,
    /// The OS cpu ids the task is pinned to; empty means no pinning.
    pub cpus: Vec<u32>,
    /// A memory limit, applied with a cgroup v2 when one is writable (else noted in `notes.txt`).
    pub memory_limit_mib: Option<u64>,
    /// The directory the task starts in (the agent's own when `None`); one that does not
    /// exist fails the task, saying so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<std::path::PathBuf>,
}

/// A request to a running task; signals go to the task's whole process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// SIGTERM (and SIGCONT, so a suspended task sees it), then SIGKILL after `grace` if it is
    /// still alive.
    Stop {
        /// How long the task has to end after SIGTERM.
        grace: Duration,
    },
    /// SIGSTOP.
    Suspend,
    /// SIGCONT.
    Resume,
    /// SIGUSR1 (the task should save its state and exit), then after `grace` a
    /// [`Control::Stop`] with the same grace if it is still alive.
    Checkpoint {
        /// How long the task has to checkpoint, and then to end after SIGTERM.
        grace: Duration,
    },
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskExit {
    /// The task.
    pub id: TaskId,
    /// Its exit code, if it exited (127: program not found; 126: not executable).
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// A description for people, e.g. "exited with code 3" or [`LOST`].
    pub message: String,
}

impl TaskExit {
    /// Whether the task exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// The content of `exit.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ExitRecord {
    code: Option<i32>,
    signal: Option<i32>,
    message: String,
}

/// Runs tasks under shims and reports how they end; share it by reference (all methods take
/// `&self`).
///
/// Dropping the runner leaves the tasks running: their shims live on and the next
/// [`Runner::open`] on the same state directory re-adopts them.
#[derive(Debug)]
pub struct Runner {
    inner: Arc<Inner>,
    exits: tokio::sync::Mutex<mpsc::UnboundedReceiver<TaskExit>>,
    /// Watchers and stop escalations; dropped (aborted) with the runner.
    background: Mutex<JoinSet<()>>,
    runtime: tokio::runtime::Handle,
}

#[derive(Debug)]
struct Inner {
    tasks_dir: PathBuf,
    shim: Vec<String>,
    running: Mutex<HashMap<TaskId, Running>>,
    exits: mpsc::UnboundedSender<TaskExit>,
    finished: Notify,
}

#[derive(Debug, Default)]
struct Running {
    /// The task's process, once the shim has reported it.
    task: Option<TaskProc>,
}

/// A task's process (the leader of its process group), with its start time against pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TaskProc {
    pid: i32,
    start: u64,
}

impl Runner {
    /// Opens (creating it if needed) the state directory and takes over its tasks: a task whose
    /// shim still runs is re-adopted (see [`Runner::running`]); a task that ended while no runner
    /// watched has its recorded exit delivered through [`Runner::next_exit`]; a task whose shim
    /// died without recording an exit has its process group killed and is reported with the
    /// message [`LOST`].
    ///
    /// `shim` is the command prefix that runs [`shim_main`]; it is started with
    /// [`SHIM_DIR_ENV`] set to the task directory.
    pub async fn open(state_dir: &Path, shim: Vec<String>) -> Result<Runner, AgentError> {
        if shim.first().is_none_or(|p| p.is_empty()) {
            return Err(AgentError::EmptyShim);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| AgentError::NoRuntime)?;
        let tasks_dir = state_dir.join("tasks");
        tokio::fs::create_dir_all(&tasks_dir).await.map_err(io_err("create the tasks directory", &tasks_dir))?;
        // The shim's environment names its directory: it must be spelled the same way by every
        // runner, or a live shim would look dead.
        let tasks_dir =
            tokio::fs::canonicalize(&tasks_dir).await.map_err(io_err("resolve the tasks directory", &tasks_dir))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Inner { tasks_dir, shim, running: Mutex::default(), exits: tx, finished: Notify::new() };
        let runner = Runner {
            inner: Arc::new(inner),
            exits: tokio::sync::Mutex::new(rx),
            background: Mutex::default(),
            runtime,
        };
        let dir = &runner.inner.tasks_dir;
        let mut entries = tokio::fs::read_dir(dir).await.map_err(io_err("list", dir))?;
        while let Some(entry) = entries.next_entry().await.map_err(io_err("list", dir))? {
            match entry.file_name().to_str().map(TaskId::from_str) {
                Some(Ok(id)) => runner.recover(id),
                _ => tracing::warn!(path = %entry.path().display(), "not a task directory; ignored"),
            }
        }
        Ok(runner)
    }

    fn recover(&self, id: TaskId) {
        let dir = self.inner.dir(&id);
        let shim_pid = read_first_number(&dir.join(SHIM_PID)).and_then(|p| u32::try_from(p).ok());
        match shim_pid {
            Some(pid) if !dir.join(EXIT).exists() && shim_alive(pid, &dir) => {
                tracing::info!(task = %id, shim = pid, "re-adopting a running task");
                lock(&self.inner.running).insert(id, Running { task: read_task_proc(&dir) });
                self.spawn(watch_adopted(self.inner.clone(), id, pid));
            }
            _ => self.inner.finish(id),
        }
    }

    /// Starts a task: writes its directory and starts its shim, then waits (a bounded time) until
    /// the shim has started the task's process or recorded why it could not. A program that
    /// cannot be run is not an error here: it is reported through [`Runner::next_exit`] with
    /// code 127 (not found) or 126. Refuses an id that is running or not yet forgotten.
    /// Dropping the future early is harmless: the task is watched once its shim runs.
    pub async fn start(&self, spec: TaskSpec) -> Result<(), AgentError> {
        let id = spec.id;
        if spec.command.first().is_none_or(|p| p.is_empty()) {
            return Err(AgentError::EmptyCommand(id));
        }
        let dir = self.inner.dir(&id);
        {
            let mut running = lock(&self.inner.running);
            if running.contains_key(&id) || dir.exists() {
                return Err(AgentError::Duplicate(id));
            }
            running.insert(id, Running::default());
        }
        // No await from the reservation above to the watcher below, so a dropped `start` future
        // leaves neither a stale reservation nor an unwatched shim.
        let child = match self.launch(&spec, &dir) {
            Ok(child) => child,
            Err(e) => {
                lock(&self.inner.running).remove(&id);
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(task = %id, error = %e, "could not remove the directory of a task that did not start");
                }
                return Err(e);
            }
        };
        self.spawn(watch_child(self.inner.clone(), id, child));
        let deadline = Instant::now() + START_WAIT;
        loop {
            if let Some(task) = read_task_proc(&dir) {
                if let Some(r) = lock(&self.inner.running).get_mut(&id) {
                    r.task = Some(task);
                }
                return Ok(());
            }
            if !lock(&self.inner.running).contains_key(&id) || dir.join(EXIT).exists() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                tracing::warn!(task = %id, waited_ms = START_WAIT.as_millis() as u64, "the shim has not reported the task's pid");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn launch(&self, spec: &TaskSpec, dir: &Path) -> Result<Child, AgentError> {
        std::fs::create_dir(dir).map_err(io_err("create the task directory", dir))?;
        let spec_path = dir.join(SPEC);
        let json = serde_json::to_vec_pretty(spec).map_err(|source| AgentError::Json {
            action: "encode",
            path: spec_path.clone(),
            source,
        })?;
        write_atomic(&spec_path, &json).map_err(io_err("write", &spec_path))?;
        let (program, args) = self.inner.shim.split_first().ok_or(AgentError::EmptyShim)?;
        let child = Command::new(program)
            .args(args)
            .env(SHIM_DIR_ENV, dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| AgentError::SpawnShim { id: spec.id, program: program.clone(), source })?;
        // The shim writes this too, but an agent crash right now must not lose track of it.
        if let Some(pid) = child.id() {
            let path = dir.join(SHIM_PID);
            if let Err(e) = write_atomic(&path, format!("{pid}\n").as_bytes()) {
                tracing::warn!(path = %path.display(), error = %e, "could not record the shim's pid");
            }
        }
        Ok(child)
    }

    /// The tasks running now (started or re-adopted, and not yet ended), in id order.
    pub fn running(&self) -> Vec<TaskId> {
        let mut ids: Vec<TaskId> = lock(&self.inner.running).keys().copied().collect();
        ids.sort();
        ids
    }

    /// Sends a control request to a running task. Escalations (SIGKILL after a grace period)
    /// run in the background and are skipped when the task has ended by then.
    pub fn control(&self, id: &TaskId, control: Control) -> Result<(), AgentError> {
        let id = *id;
        let task = self.task_proc(&id)?;
        match control {
            Control::Suspend => signal_group(id, task, Signal::SIGSTOP),
            Control::Resume => signal_group(id, task, Signal::SIGCONT),
            Control::Stop { grace } => {
                terminate(id, task)?;
                self.spawn(kill_after(self.inner.clone(), id, task, grace));
                Ok(())
            }
            Control::Checkpoint { grace } => {
                signal_group(id, task, Signal::SIGUSR1)?;
                let inner = self.inner.clone();
                self.spawn(async move {
                    tokio::time::sleep(grace).await;
                    if inner.still_running(id, task) {
                        tracing::info!(task = %id, "no exit after checkpoint; stopping it");
                        match terminate(id, task) {
                            Ok(()) => kill_after(inner, id, task, grace).await,
                            Err(e) => {
                                tracing::warn!(task = %id, error = %chain(&e), "cannot stop the task after its checkpoint")
                            }
                        }
                    }
                });
                Ok(())
            }
        }
    }

    fn task_proc(&self, id: &TaskId) -> Result<TaskProc, AgentError> {
        let mut running = lock(&self.inner.running);
        let entry = running.get_mut(id).ok_or(AgentError::NotRunning(*id))?;
        if entry.task.is_none() {
            entry.task = read_task_proc(&self.inner.dir(id));
        }
        entry.task.ok_or(AgentError::NotStarted(*id))
    }

    /// Waits for the next task to end and returns how it ended. Exits found by
    /// [`Runner::open`] come first. Cancel-safe: no exit is lost when the future is dropped.
    pub async fn next_exit(&self) -> TaskExit {
        let mut exits = self.exits.lock().await;
        match exits.recv().await {
            Some(exit) => exit,
            // The runner holds a sender, so the channel never closes while it exists.
            None => std::future::pending().await,
        }
    }

    /// The task's stdout and stderr log files.
    pub fn log_paths(&self, id: &TaskId) -> (PathBuf, PathBuf) {
        let dir = self.inner.dir(id);
        (dir.join(STDOUT), dir.join(STDERR))
    }

    /// The task's directory (see the module documentation for what it holds).
    pub fn task_dir(&self, id: &TaskId) -> PathBuf {
        self.inner.dir(id)
    }

    /// Removes the directory of a task that has ended (call it once its exit has been handled
    /// and its logs collected); until then a restarted runner reports the exit again.
    pub fn forget(&self, id: &TaskId) -> Result<(), AgentError> {
        if lock(&self.inner.running).contains_key(id) {
            return Err(AgentError::StillRunning(*id));
        }
        let dir = self.inner.dir(id);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", &dir)(e)),
            _ => Ok(()),
        }
    }

    /// Stops every running task (see [`Control::Stop`]) and waits until all have ended, or
    /// until `grace` plus ten seconds have passed. Their exits stay queued for
    /// [`Runner::next_exit`].
    pub async fn shutdown_all(&self, grace: Duration) {
        for id in self.running() {
            if let Err(e) = self.control(&id, Control::Stop { grace }) {
                tracing::warn!(task = %id, error = %chain(&e), "cannot stop the task");
            }
        }
        let all_ended = async {
            loop {
                let ended = self.inner.finished.notified();
                tokio::pin!(ended);
                ended.as_mut().enable();
                if lock(&self.inner.running).is_empty() {
                    return;
                }
                ended.await;
            }
        };
        if tokio::time::timeout(grace + SHUTDOWN_SLACK, all_ended).await.is_err() {
            tracing::warn!(tasks = ?self.running(), "tasks still running after shutdown");
        }
    }

    fn spawn(&self, job: impl Future<Output = ()> + Send + 'static) {
        let mut background = lock(&self.background);
        while background.try_join_next().is_some() {}
        background.spawn_on(job, &self.runtime);
    }
}

impl Inner {
    fn dir(&self, id: &TaskId) -> PathBuf {
        self.tasks_dir.join(id.to_string())
    }

    fn still_running(&self, id: TaskId, task: TaskProc) -> bool {
        lock(&self.running).contains_key(&id) && group_alive(task)
    }

    /// Called once the task's shim is gone: reads its exit (or records it lost) and reports it.
    fn finish(&self, id: TaskId) {
        let dir = self.dir(&id);
        let record = match read_exit(&dir) {
            Some(record) => record,
            None => {
                let task = read_task_proc(&dir).or_else(|| lock(&self.running).get(&id).and_then(|r| r.task));
                if let Some(task) = task.filter(|t| group_alive(*t)) {
                    tracing::warn!(task = %id, pid = task.pid, "killing the process group of a task whose shim died");
                    let _ = killpg(Pid::from_raw(task.pid), Signal::SIGKILL);
                }
                let record = ExitRecord { code: None, signal: None, message: LOST.to_string() };
                if let Err(e) = write_json_atomic(&dir.join(EXIT), &record) {
                    tracing::warn!(task = %id, error = %e, "could not record the exit of a lost task");
                }
                record
            }
        };
        lock(&self.running).remove(&id);
        let _ = self.exits.send(TaskExit { id, code: record.code, signal: record.signal, message: record.message });
        self.finished.notify_waiters();
    }
}

async fn watch_child(inner: Arc<Inner>, id: TaskId, mut child: Child) {
    let pid = child.id();
    if let Err(e) = child.wait().await {
        tracing::warn!(task = %id, error = %e, "could not wait for the shim; polling it instead");
        if let Some(pid) = pid {
            poll_until_dead(pid, &inner.dir(&id)).await;
        }
    }
    inner.finish(id);
}

async fn watch_adopted(inner: Arc<Inner>, id: TaskId, shim_pid: u32) {
    poll_until_dead(shim_pid, &inner.dir(&id)).await;
    inner.finish(id);
}

async fn poll_until_dead(shim_pid: u32, dir: &Path) {
    let mut tick = tokio::time::interval(ADOPTED_POLL);
    while shim_alive(shim_pid, dir) {
        tick.tick().await;
    }
}

async fn kill_after(inner: Arc<Inner>, id: TaskId, task: TaskProc, grace: Duration) {
    tokio::time::sleep(grace).await;
    if inner.still_running(id, task) {
        tracing::info!(task = %id, grace_ms = grace.as_millis() as u64, "still alive after the grace period; sending SIGKILL");
        if let Err(e) = signal_group(id, task, Signal::SIGKILL) {
            tracing::warn!(task = %id, error = %chain(&e), "cannot kill the task");
        }
    }
}

fn terminate(id: TaskId, task: TaskProc) -> Result<(), AgentError> {
    signal_group(id, task, Signal::SIGTERM)?;
    signal_group(id, task, Signal::SIGCONT)
}

fn signal_group(id: TaskId, task: TaskProc, signal: Signal) -> Result<(), AgentError> {
    match killpg(Pid::from_raw(task.pid), signal) {
        // ESRCH: the group has just ended; its exit is on its way.
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(source) => Err(AgentError::Signal { id, signal, source }),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> AgentError {
    let path = path.to_path_buf();
    move |source| AgentError::Io { action, path, source }
}

/// Writes a file so that readers see either the old content or the whole new one.
fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

fn write_json_atomic(path: &Path, record: &ExitRecord) -> io::Result<()> {
    write_atomic(path, &serde_json::to_vec(record).map_err(io::Error::other)?)
}

/// The recorded exit, if the shim wrote one (an unreadable one counts, with its error).
fn read_exit(dir: &Path) -> Option<ExitRecord> {
    let path = dir.join(EXIT);
    let data = std::fs::read(&path).ok()?;
    Some(serde_json::from_slice(&data).unwrap_or_else(|e| ExitRecord {
        code: None,
        signal: None,
        message: format!("the exit record {} is unreadable: {e}", path.display()),
    }))
}

fn read_numbers(path: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split_whitespace().map_while(|n| n.parse().ok()).collect()
}

fn read_first_number(path: &Path) -> Option<u64> {
    read_numbers(path).first().copied()
}

fn read_task_proc(dir: &Path) -> Option<TaskProc> {
    match read_numbers(&dir.join(TASK_PID))[..] {
        [pid, start] => Some(TaskProc { pid: i32::try_from(pid).ok().filter(|p| *p > 0)?, start }),
        _ => None,
    }
}

/// The fields of `/proc/<pid>/stat` the runner uses.
#[derive(Debug, Clone, Copy)]
struct ProcStat {
    state: char,
    pgrp: i32,
    start: u64,
}

impl ProcStat {
    fn alive(self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

fn proc_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// Whether a live process is left in the task's process group. The kernel does not reuse a pid
/// while any process still uses it as its group id, so: if a process holds the task's pid with
/// another start time, the pid was recycled and the group is gone; otherwise any live process
/// whose group is the task's pid (and that started no earlier than the task) belongs to it.
fn group_alive(task: TaskProc) -> bool {
    if let Some(leader) = proc_stat(task.pid) {
        if leader.start != task.start {
            return false;
        }
        if leader.pgrp == task.pid && leader.alive() {
            return true;
        }
    }
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_stat)
        .any(|s| s.pgrp == task.pid && s.start >= task.start && s.alive())
}

/// Whether `pid` is still the shim of `dir`: its environment names the directory, which guards
/// against pid reuse (a zombie's environment reads empty, so it counts as dead).
fn shim_alive(pid: u32, dir: &Path) -> bool {
    let mut marker = format!("{SHIM_DIR_ENV}=").into_bytes();
    marker.extend_from_slice(dir.as_os_str().as_encoded_bytes());
    match std::fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) => env.split(|b| *b == 0).any(|var| var == marker),
        // Another user's process: trust the pid rather than kill a live task.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            i32::try_from(pid).ok().and_then(proc_stat).is_some_and(ProcStat::alive)
        }
        Err(_) => false,
    }
}
