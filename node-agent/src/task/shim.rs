//! The per-task shim: pins itself to the task's cpus, tries the memory limit, runs the task in
//! its own process group with its output in the log files, waits for it and records its exit.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use nix::sched::{CpuSet, sched_setaffinity};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::{
    EXIT, ExitRecord, NOTES, SHIM_DIR_ENV, SHIM_PID, SPEC, STDERR, STDOUT, TASK_PID, TaskId, TaskSpec, proc_stat,
    write_atomic, write_json_atomic,
};
use crate::error::{AgentError, chain};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Runs the shim for the task directory `task_dir` (the agent binary calls it for
/// `tessera agent shim`, with the directory from [`SHIM_DIR_ENV`]) and returns the shim's exit
/// code: 0 once the task's exit is recorded in `exit.json`, 1 if even that failed.
///
/// Synchronous and single-threaded: cpu affinity is set on the calling thread, which is the one
/// that starts the task.
pub fn shim_main(task_dir: &Path) -> i32 {
    let pid_path = task_dir.join(SHIM_PID);
    if let Err(e) = write_atomic(&pid_path, format!("{}\n", std::process::id()).as_bytes()) {
        note(task_dir, &format!("could not record the shim's pid in {}: {e}", pid_path.display()));
    }
    let record = run(task_dir).unwrap_or_else(|e| ExitRecord {
        code: None,
        signal: None,
        message: format!("shim failed: {}", chain(&e)),
    });
    match write_json_atomic(&task_dir.join(EXIT), &record) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Runs the task to its end; `Err` when the shim itself failed.
fn run(dir: &Path) -> Result<ExitRecord, AgentError> {
    const READ_SPEC: &str = "read the task spec";
    let spec_path = dir.join(SPEC);
    let data =
        fs::read(&spec_path).map_err(|source| AgentError::Io { action: READ_SPEC, path: spec_path.clone(), source })?;
    let spec: TaskSpec = serde_json::from_slice(&data).map_err(|source| AgentError::Json {
        action: READ_SPEC,
        path: spec_path.clone(),
        source,
    })?;
    let (program, args) = spec.command.split_first().ok_or(AgentError::EmptyCommand(spec.id))?;

    if !spec.cpus.is_empty()
        && let Err(why) = pin(&spec.cpus)
    {
        note(dir, &format!("cpu pinning not applied: {}", chain(&why)));
    }
    let cgroup = spec.memory_limit_mib.and_then(|mib| {
        memory_cgroup(&spec.id, mib)
            .map_err(|why| note(dir, &format!("memory limit not applied: {}", chain(&why))))
            .ok()
    });

    let log = |name: &str| {
        let path = dir.join(name);
        OpenOptions::new().create(true).append(true).open(&path).map_err(|source| AgentError::Io {
            action: "open",
            path,
            source,
        })
    };
    if let Some(w) = &spec.workdir
        && !w.is_dir()
    {
        let message = format!("working directory `{}` does not exist on this server", w.display());
        return Ok(ExitRecord { code: Some(126), signal: None, message });
    }
    let mut command = Command::new(program);
    if let Some(w) = &spec.workdir {
        command.current_dir(w);
    }
    let spawned = command
        .args(args)
        .env_remove(SHIM_DIR_ENV)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log(STDOUT)?)
        .stderr(log(STDERR)?)
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return Ok(spawn_failure(program, &e)),
    };
    let pid = i32::try_from(child.id()).map_err(|_| AgentError::PidOutOfRange(child.id()))?;
    let kill_group = || {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    };
    // The task is our unreaped child, so its pid is still its own: take its start time now.
    let start = proc_stat(pid).map_or(0, |s| s.start);
    let pid_path = dir.join(TASK_PID);
    if let Err(source) = write_atomic(&pid_path, format!("{pid}\n{start}\n").as_bytes()) {
        kill_group();
        let _ = child.wait();
        return Err(AgentError::Io { action: "record the task's pid in", path: pid_path, source });
    }
    // Wait for the task to exit without reaping it: while it is a zombie its pid, and so its
    // group id, cannot be reused, so the group kill below cannot hit a stranger's group.
    let _ = nix::sys::wait::waitid(
        nix::sys::wait::Id::Pid(Pid::from_raw(pid)),
        nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT,
    );
    // Whatever the task left behind in its group ends with it.
    kill_group();
    let status = child.wait();
    if let Some(cgroup) = cgroup {
        cgroup.leave();
    }
    status.map(describe).map_err(|source| AgentError::Wait { pid, source })
}

fn spawn_failure(program: &str, e: &io::Error) -> ExitRecord {
    let (code, message) = match e.kind() {
        io::ErrorKind::NotFound => (127, format!("command `{program}` not found")),
        io::ErrorKind::PermissionDenied => (126, format!("command `{program}` could not be run: permission denied")),
        _ => (126, format!("command `{program}` could not be started: {e}")),
    };
    ExitRecord { code: Some(code), signal: None, message }
}

fn describe(status: ExitStatus) -> ExitRecord {
    let message = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => {
            format!("killed by signal {sig} ({})", Signal::try_from(sig).map_or("unknown", Signal::as_str))
        }
        (None, None) => format!("ended with {status}"),
    };
    ExitRecord { code: status.code(), signal: status.signal(), message }
}

/// Pins the calling thread (and so the task it starts) to `cpus`.
fn pin(cpus: &[u32]) -> Result<(), AgentError> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu as usize).map_err(|source| AgentError::CpuOutOfRange { cpu, source })?;
    }
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|source| AgentError::Pin { cpus: cpus.to_vec(), source })
}

/// The task's memory cgroup, which the shim has joined.
struct Cgroup {
    dir: PathBuf,
    /// The cgroup the shim came from, to go back to before removing `dir`.
    home: Option<PathBuf>,
}

impl Cgroup {
    /// Best effort: the cgroup is empty once the task's group is dead and the shim has left.
    fn leave(self) {
        if let Some(home) = self.home {
            let _ = fs::write(home.join("cgroup.procs"), std::process::id().to_string());
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Creates `/sys/fs/cgroup/tessera/<task id>/` with `memory.max` set and moves the shim into it;
/// `Err` says why not.
fn memory_cgroup(id: &TaskId, mib: u64) -> Result<Cgroup, AgentError> {
    const MOUNTS: &str = "/proc/self/mounts";
    let root = Path::new(CGROUP_ROOT);
    let mounts =
        fs::read_to_string(MOUNTS).map_err(|source| AgentError::Io { action: "read", path: MOUNTS.into(), source })?;
    // The last mount on the path is the one visible.
    let fstype = mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(1) == Some(&CGROUP_ROOT)).then(|| fields.get(2).copied()).flatten()
        })
        .next_back();
    match fstype {
        Some("cgroup2") => {}
        Some(other) => return Err(AgentError::NotCgroupV2 { root: root.into(), fstype: other.to_string() }),
        None => return Err(AgentError::NoCgroupMount { root: root.into() }),
    }
    let bytes = mib.checked_mul(1 << 20).ok_or(AgentError::MemoryLimitTooLarge { mib })?;
    let home = fs::read_to_string("/proc/self/cgroup").ok().and_then(|text| {
        text.lines().find_map(|l| l.strip_prefix("0::").map(|p| root.join(p.trim_start_matches('/'))))
    });
    let parent = root.join("tessera");
    fs::create_dir_all(&parent).map_err(|source| AgentError::Io { action: "create", path: parent.clone(), source })?;
    enable_memory(&root.join("cgroup.subtree_control"), &parent.join("cgroup.controllers"))?;
    let control = parent.join("cgroup.subtree_control");
    enable_memory(&control, &control)?;
    let dir = parent.join(id.to_string());
    fs::create_dir_all(&dir).map_err(|source| AgentError::Io { action: "create", path: dir.clone(), source })?;
    write_cgroup_file(&dir.join("memory.max"), &bytes.to_string())?;
    write_cgroup_file(&dir.join("cgroup.procs"), &std::process::id().to_string())?;
    Ok(Cgroup { dir, home })
}

/// Writes `+memory` to `control` unless `check` (a controllers list) already names memory.
fn enable_memory(control: &Path, check: &Path) -> Result<(), AgentError> {
    let listed =
        fs::read_to_string(check).map_err(|source| AgentError::Io { action: "read", path: check.into(), source })?;
    if listed.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    write_cgroup_file(control, "+memory")
}

fn write_cgroup_file(path: &Path, value: &str) -> Result<(), AgentError> {
    fs::write(path, value).map_err(|source| AgentError::CgroupWrite { path: path.into(), value: value.into(), source })
}

/// Appends a warning to the task's notes file (best effort: the task runs anyway).
fn note(dir: &Path, message: &str) {
    let path = dir.join(NOTES);
    if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(file, "{message}");
    }
}
