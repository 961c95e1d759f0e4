//! The task runner on real processes.
//!
//! The runner starts every task under a shim process; in production the shim is
//! `tessera agent shim`. Here it is this package's `tessera-shim` program (`src/bin/`), which
//! runs the same `shim_main`.
//!
//! Waits are bounded: `next_exit` under a 20 s timeout, process states polled with a deadline.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tessera_agent::AgentError;
use tessera_agent::task::{Control, LOST, NOTES, Runner, TaskExit, TaskId, TaskSpec};

fn shim() -> Vec<String> {
    vec![env!("CARGO_BIN_EXE_tessera-shim").to_string()]
}

fn id(member: u32) -> TaskId {
    TaskId { job: 7, proposal: 0xab, member }
}

fn spec(member: u32, command: &[&str]) -> TaskSpec {
    TaskSpec {
        id: id(member),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        cpus: Vec::new(),
        memory_limit_mib: None,
        workdir: None,
    }
}

async fn next_exit(runner: &Runner) -> TaskExit {
    tokio::time::timeout(Duration::from_secs(20), runner.next_exit()).await.expect("a task exit within 20 s")
}

/// Polls `done` every 10 ms for up to 10 s.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// (state, process group) from /proc/<pid>/stat.
fn stat(pid: i32) -> Option<(char, i32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields[0].chars().next()?, fields[2].parse().ok()?))
}

/// Alive: exists and is not a zombie (this container's pid 1 may not reap orphans).
fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

fn live_group_members(pgid: i32) -> Vec<i32> {
    fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|(state, pgrp)| pgrp == pgid && state != 'Z' && state != 'X'))
        .collect()
}

fn task_pid(runner: &Runner, id: &TaskId) -> i32 {
    let text = fs::read_to_string(runner.task_dir(id).join("task.pid")).expect("task.pid");
    text.split_whitespace().next().and_then(|p| p.parse().ok()).expect("a pid in task.pid")
}

fn shim_pid(runner: &Runner, id: &TaskId) -> i32 {
    fs::read_to_string(runner.task_dir(id).join("shim.pid")).expect("shim.pid").trim().parse().expect("a pid")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

fn stdout_of(runner: &Runner, id: &TaskId) -> PathBuf {
    runner.log_paths(id).0
}

#[test]
fn the_runner_can_be_shared_between_tasks() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<Runner>();
    shareable::<AgentError>();
}

#[test]
fn task_ids_display_and_parse_canonically() {
    let id = TaskId { job: 42, proposal: 0x1f3, member: 2 };
    assert_eq!(id.to_string(), "j42-p1f3-m2");
    assert_eq!("j42-p1f3-m2".parse::<TaskId>().expect("parses"), id);
    for bad in ["", "j42", "j42-p1f3", "j42-p1f3-m", "x42-p1-m2", "j042-p1f3-m2", "j42-p1F3-m2", "j42-p1f3-m2/"] {
        assert!(matches!(bad.parse::<TaskId>(), Err(AgentError::BadTaskId(_))), "{bad:?} must not parse");
    }
}

#[tokio::test]
async fn env_logs_and_cpu_pinning_reach_the_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runner = Runner::open(dir.path(), shim()).await.expect("open");
    let allowed = nix::sched::sched_getaffinity(Pid::from_raw(0)).expect("affinity");
    let last = (0..nix::sched::CpuSet::count()).rev().find(|&c| allowed.is_set(c).unwrap_or(false)).expect("a cpu");
    let mut task =
        spec(1, &["sh", "-c", "grep Cpus_allowed_list /proc/self/status; echo $CUDA_VISIBLE_DEVICES; echo oops >&2"]);
    task.env = vec![("CUDA_VISIBLE_DEVICES".into(), "2,3".into())];
    task.cpus = vec![last as u32];
    runner.start(task).await.expect("start");

    let exit = next_exit(&runner).await;
    assert_eq!(exit.id, id(1));
    assert!(exit.success(), "{exit:?}");
    assert_eq!((exit.code, exit.signal), (Some(0), None));
    assert!(runner.running().is_empty());
    let (out, err) = runner.log_paths(&id(1));
    let out = read(&out);
    let mut lines = out.lines();
    assert_eq!(
        lines.next().and_then(|l| l.strip_prefix("Cpus_allowed_list:")).map(str::trim),
        Some(&*last.to_string())
    );
    assert_eq!(lines.next(), Some("2,3"), "{out}");
    assert_eq!(read(&err), "oops\n");
    assert!(!runner.task_dir(&id(1)).join(NOTES).exists(), "no warnings expected");

    runner.forget(&id(1)).expect("forget");
    assert!(!runner.task_dir(&id(1)).exists());
}

#[tokio::test]
async fn a_task_starts_in_its_working_directory_and_a_missing_one_fails_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let work = tempfile::tempdir().expect("workdir");
    let runner = Runner::open(dir.path(), shim()).await.expect("open");
    let mut task = spec(1, &["sh", "-c", "pwd"]);
    task.workdir = Some(work.path().to_path_buf());
    runner.start(task).await.expect("start");
    let exit = next_exit(&runner).await;
    assert!(exit.success(), "{exit:?}");
    let real = fs::canonicalize(work.path()).expect("canonical");
    assert_eq!(read(&stdout_of(&runner, &id(1))).trim(), real.display().to_string());

    let mut task = spec(2, &["true"]);
    task.workdir = Some(work.path().join("missing"));
    runner.start(task).await.expect("start");
    let exit = next_exit(&runner).await;
    assert_eq!(exit.code, Some(126), "{exit:?}");
    assert!(exit.message.contains("working directory") && exit.message.contains("missing"), "{exit:?}");
}

#[tokio::test]
async fn failures_report_their_exit_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runner = Runner::open(dir.path(), shim()).await.expect("open");
    assert!(matches!(runner.start(spec(1, &[])).await, Err(AgentError::EmptyCommand(_))));

    runner.start(spec(1, &["sh", "-c", "exit 3"])).await.expect("start");
    let exit = next_exit(&runner).await;
    assert_eq!((exit.code, exit.signal, exit.success()), (Some(3), None, false), "{exit:?}");
    // A finished task keeps its id until forgotten.
    assert!(matches!(runner.start(spec(1, &["true"])).await, Err(AgentError::Duplicate(_))));
    runner.forget(&id(1)).expect("forget");

    runner.start(spec(2, &["tessera-no-such-program", "x"])).await.expect("start");
    let exit = next_exit(&runner).await;
    assert_eq!(exit.code, Some(127), "{exit:?}");
    assert!(exit.message.contains("`tessera-no-such-program` not found"), "{exit:?}");

    let script = dir.path().join("not-executable");
    fs::write(&script, "#!/bin/sh\n").expect("write");
    runner.start(spec(3, &[script.to_str().expect("utf-8")])).await.expect("start");
    let exit = next_exit(&runner).await;
    assert_eq!(exit.code, Some(126), "{exit:?}");
    assert!(exit.message.contains("permission denied"), "{exit:?}");
}

#[tokio::test]
async fn stop_kills_a_task_that_ignores_sigterm_and_its_whole_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runner = Runner::open(dir.path(), shim()).await.expect("open");
    runner.start(spec(1, &["sh", "-c", "trap '' TERM; sleep 1000; echo never"])).await.expect("start");
    assert!(matches!(runner.start(spec(1, &["true"])).await, Err(AgentError::Duplicate(_))));
    let pid = task_pid(&runner, &id(1));
    // The trap is set before `sleep` starts: wait for the group to hold both.
    wait_until("sh and sleep run", || live_group_members(pid).len() == 2).await;
    let members = live_group_members(pid);

    let grace = Duration::from_millis(300);
    let stopped = Instant::now();
    runner.control(&id(1), Control::Stop { grace }).expect("stop");
    let exit = next_exit(&runner).await;
    assert!(stopped.elapsed() >= grace, "SIGTERM must not have ended it");
    assert_eq!((exit.code, exit.signal), (None, Some(9)), "{exit:?}");
    wait_until("the whole group is gone", || members.iter().all(|&p| !alive(p))).await;
    assert!(live_group_members(pid).is_empty());
    assert!(matches!(runner.control(&id(1), Control::Suspend), Err(AgentError::NotRunning(_))));
}

#[tokio::test]
async fn suspend_and_resume_stop_and_continue_the_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runner = Runner::open(dir.path(), shim()).await.expect("open");
    runner.start(spec(1, &["sleep", "1000"])).await.expect("start");
    let pid = task_pid(&runner, &id(1));
    let state = || stat(pid).map(|(s, _)| s);

    runner.control(&id(1), Control::Suspend).expect("suspend");
    wait_until("the task is stopped", || state() == Some('T')).await;
    runner.control(&id(1), Control::Resume).expect("resume");
    wait_until("the task runs again", || state().is_some_and(|s| s != 'T')).await;
    assert_eq!(runner.running(), vec![id(1)]);
    assert!(matches!(runner.forget(&id(1)), Err(AgentError::StillRunning(_))));

    // A suspended task still ends on Stop (SIGCONT follows SIGTERM).
    runner.control(&id(1), Control::Suspend).expect("suspend");
    wait_until("the task is stopped", || state() == Some('T')).await;
    runner.control(&id(1), Control::Stop { grace: Duration::from_secs(10) }).expect("stop");
    let exit = next_exit(&runner).await;
    assert_eq!(exit.signal, Some(15), "{exit:?}");
}

#[tokio::test]
async fn checkpoint_lets_the_task_save_and_exit_before_the_grace_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runner = Runner::open(dir.path(), shim()).await.expect("open");
    let saved = dir.path().join("checkpoint");
    let mut task =
        spec(1, &["sh", "-c", r#"trap 'echo saved > "$CKPT"; exit 0' USR1; echo ready; while :; do sleep 0.05; done"#]);
    task.env = vec![("CKPT".into(), saved.to_string_lossy().into_owned())];
    runner.start(task).await.expect("start");
    let out = stdout_of(&runner, &id(1));
    wait_until("the trap is set", || read(&out) == "ready\n").await;

    let grace = Duration::from_secs(15);
    let sent = Instant::now();
    runner.control(&id(1), Control::Checkpoint { grace }).expect("checkpoint");
    let exit = next_exit(&runner).await;
    assert!(sent.elapsed() < grace);
    assert!(exit.success(), "{exit:?}");
    assert_eq!(read(&saved), "saved\n");
}

#[tokio::test]
async fn a_new_runner_adopts_running_tasks_and_reports_ended_and_lost_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let go = dir.path().join("go");
    let (long, short, lost) = (id(1), id(2), id(3));
    let a = Runner::open(dir.path(), shim()).await.expect("open a");
    a.start(spec(1, &["sleep", "1000"])).await.expect("start long");
    let mut task = spec(2, &["sh", "-c", r#"while [ ! -e "$GO" ]; do sleep 0.02; done; exit 7"#]);
    task.env = vec![("GO".into(), go.to_string_lossy().into_owned())];
    a.start(task).await.expect("start short");
    a.start(spec(3, &["sleep", "1000"])).await.expect("start lost");
    let pids = [long, short, lost].map(|t| task_pid(&a, &t));
    let shims = [long, short, lost].map(|t| shim_pid(&a, &t));
    let lost_shim = shims[2];
    // The agent "crashes": no stop, no shutdown.
    drop(a);

    // While no runner exists: `short` ends, and the shim of `lost` dies.
    fs::write(&go, "").expect("write go");
    let short_exit = dir.path().join("tasks").join(short.to_string()).join("exit.json");
    wait_until("the short task recorded its exit", || short_exit.exists()).await;
    kill(Pid::from_raw(lost_shim), Signal::SIGKILL).expect("kill the shim");
    wait_until("the shim is dead", || !alive(lost_shim)).await;
    assert!(alive(pids[2]), "the task outlives its shim");

    let b = Runner::open(dir.path(), shim()).await.expect("open b");
    assert_eq!(b.running(), vec![long]);
    let mut exits = vec![next_exit(&b).await, next_exit(&b).await];
    exits.sort_by_key(|e| e.id);
    assert_eq!((exits[0].id, exits[0].code), (short, Some(7)), "{exits:?}");
    assert_eq!((exits[1].id, exits[1].code, exits[1].message.as_str()), (lost, None, LOST), "{exits:?}");
    wait_until("the lost task is killed", || !alive(pids[2])).await;

    b.control(&long, Control::Stop { grace: Duration::from_secs(10) }).expect("stop the adopted task");
    let exit = next_exit(&b).await;
    assert_eq!((exit.id, exit.signal), (long, Some(15)), "{exit:?}");
    assert!(b.running().is_empty());
    wait_until("no task or shim process remains", || pids.iter().chain(&shims).all(|&p| !alive(p))).await;
    for t in [long, short, lost] {
        b.forget(&t).expect("forget");
        assert!(!b.task_dir(&t).exists());
    }
    drop(b);

    // Nothing is left to report to a third runner.
    let c = Runner::open(dir.path(), shim()).await.expect("open c");
    assert!(c.running().is_empty());
    assert!(tokio::time::timeout(Duration::from_millis(200), c.next_exit()).await.is_err());
}

#[tokio::test]
async fn shutdown_all_stops_every_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runner = Runner::open(dir.path(), shim()).await.expect("open");
    runner.start(spec(1, &["sleep", "1000"])).await.expect("start");
    runner.start(spec(2, &["sh", "-c", "trap '' TERM; echo ready; sleep 1000; echo never"])).await.expect("start");
    let out = stdout_of(&runner, &id(2));
    wait_until("the trap is set", || read(&out) == "ready\n").await;
    let pids = [id(1), id(2)].map(|t| task_pid(&runner, &t));

    runner.shutdown_all(Duration::from_millis(300)).await;
    assert!(runner.running().is_empty());
    let mut exits = vec![next_exit(&runner).await, next_exit(&runner).await];
    exits.sort_by_key(|e| e.id);
    assert_eq!(exits.iter().map(|e| e.signal).collect::<Vec<_>>(), [Some(15), Some(9)], "{exits:?}");
    wait_until("no task process remains", || pids.iter().all(|&p| live_group_members(p).is_empty())).await;
}

#[tokio::test]
async fn memory_limit_is_applied_or_the_reason_is_noted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runner = Runner::open(dir.path(), shim()).await.expect("open");
    let mut task = spec(1, &["sh", "-c", r#"cat /proc/self/cgroup; cat "/sys/fs/cgroup/tessera/$ID/memory.max""#]);
    task.env = vec![("ID".into(), id(1).to_string())];
    task.memory_limit_mib = Some(64);
    runner.start(task).await.expect("start");
    let exit = next_exit(&runner).await;

    let cgroup2 = read(Path::new("/proc/self/mounts"))
        .lines()
        .rfind(|l| l.split_whitespace().nth(1) == Some("/sys/fs/cgroup"))
        .is_some_and(|l| l.split_whitespace().nth(2) == Some("cgroup2"));
    let notes = read(&runner.task_dir(&id(1)).join(NOTES));
    let out = read(&stdout_of(&runner, &id(1)));
    if let Some(why) = notes.lines().find_map(|l| l.strip_prefix("memory limit not applied: ")) {
        assert!(!why.is_empty());
        eprintln!("memory limit not applied here: {why}");
    } else {
        assert!(cgroup2, "a limit can only be applied on cgroup v2 (notes: {notes:?})");
        assert!(exit.success(), "{exit:?}");
        assert!(out.contains(&format!("0::/tessera/{}", id(1))), "{out}");
        assert!(out.contains(&(64u64 << 20).to_string()), "{out}");
    }
}
