//! The node agent as a real process against a real view replica, in fake-GPU mode (the
//! seed-8gpu preset stands in for NVML; every step after discovery is the agent's real code).
//!
//! - `tasks_run_pinned_and_report_their_exit`: a placed member runs with the launch environment
//!   and its granted core, logs to its task directory, and its exit finishes the job; a
//!   command that does not exist and a failing command fail the job with the reason.
//! - `restart_readopts_and_lease_expiry_leaves_no_orphans`: `kill -9` of the agent leaves the
//!   task running; a new agent re-adopts it (same process), leaves it alone in its first round
//!   on the view (the log line "following the view" marks that round), and stops it when the
//!   job is cancelled; a task that ends while no agent runs is reported by the next one; when the lease
//!   expires the gang is re-queued whole and the next agent stops the task whose placement is
//!   gone.
//! - `a_failed_member_restarts_its_gang_whole_and_the_second_try_finishes`: with a restart
//!   policy, a member's failure puts the job back to pending (restarted once), the member that
//!   had not failed is stopped (with the job's stop grace), and placed again the job finishes.
//! - `unhealthy_device_is_not_placed_on`: a device the agent reports unhealthy leaves the free
//!   mask (a proposal on it is refused as busy) and is placed on again once healthy.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_testkit::ProcessCluster;
use tessera_view::{
    CoreMask, CpuDemand, Decision, JobId, JobSpec, JobState, LocalityLevel, MemberPlacement, Proposal, ProposalId,
    ServerId, ViewVersion,
};
use tessera_view_server::{Tuning, ViewClient};

mod common;
use common::*;

/// One replica with leases, and agents for its servers.
struct Setup {
    dir: tempfile::TempDir,
    addr: String,
    view: Option<ProcessCluster>,
    agents: Vec<Option<Child>>,
}

impl Setup {
    fn start(lease_ms: u64) -> Setup {
        let dir = test_dir("tessera-agent-");
        let tuning = Tuning { server_lease_ms: lease_ms, ..tuning() };
        let view = cluster(1, common::spec(2), tuning, false, Some(&dir.path().join("view")));
        let addr = view.addrs()[0].clone();
        Setup { dir, addr, view: Some(view), agents: Vec::new() }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("agent-r0-s00")
    }

    /// Starts an agent for server `r0-s00` (the shared fake-GPU launcher: data in
    /// [`Setup::data_dir`], output appended to `r0-s00.log`); returns its index.
    fn agent(&mut self, extra: &[&str]) -> usize {
        let tls = tls(self.view.as_ref().expect("view"), Role::Agent, "r0-s00");
        let extra = with(extra, &tls);
        self.agents.push(Some(agent_with(self.dir.path(), &self.addr, "r0-s00", &extra)));
        self.agents.len() - 1
    }

    fn kill_agent(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].take() {
            c.kill().expect("kill -9");
            c.wait().expect("reap");
        }
    }

    fn agent_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("r0-s00.log")).unwrap_or_default()
    }

    /// Waits (bounded) until the agents' output from byte `from` on holds `line`; answers that
    /// part of it.
    async fn wait_log(&self, from: usize, line: &str) -> String {
        let t0 = Instant::now();
        loop {
            let log = self.agent_log();
            let since = log.get(from..).unwrap_or_default();
            if since.contains(line) {
                return since.to_string();
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no `{line}` in the agent's output\n{since}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for i in 0..self.agents.len() {
            self.kill_agent(i);
        }
        drop(self.view.take());
        // Tasks outlive agents by design; the tests stop theirs, this catches a failed test's.
        // Only a group whose leader is still the recorded task (same start time): pids are
        // recycled quickly here, and a stale one could name anybody's group.
        for (pid, start) in task_procs(&self.data_dir()) {
            if alive((pid, start)) {
                kill_group(u64::from(pid));
            }
        }
    }
}

/// Every task directory under an agent's data dir (`<data>/<cluster>/tasks/<task>`).
fn task_dirs(data: &Path) -> Vec<PathBuf> {
    let list = |p: PathBuf| std::fs::read_dir(p).into_iter().flatten().flatten().map(|e| e.path()).collect::<Vec<_>>();
    list(data.to_path_buf()).into_iter().flat_map(|cluster| list(cluster.join("tasks"))).collect()
}

/// `(pid, start time)` recorded by every task directory under an agent's data dir (`task.pid`:
/// the pid, then its start time from `/proc/<pid>/stat`).
fn task_procs(data: &Path) -> Vec<(u32, u64)> {
    task_dirs(data)
        .into_iter()
        .filter_map(|d| std::fs::read_to_string(d.join("task.pid")).ok())
        .filter_map(|p| {
            let mut l = p.lines().map(|l| l.trim().parse::<u64>().ok());
            Some((u32::try_from(l.next()??).ok()?, l.next()??))
        })
        .collect()
}

/// The tasks recorded under an agent's data dir that are still the recorded process.
fn task_pids(data: &Path) -> Vec<(u32, u64)> {
    task_procs(data).into_iter().filter(|t| alive(*t)).collect()
}

/// A live (not zombie) process's start time (`/proc/<pid>/stat` field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    (fields.first() != Some(&"Z")).then(|| fields.get(19)?.parse().ok())?
}

/// Whether the process `(pid, start time)` still runs (a recycled pid does not count).
fn alive((pid, start): (u32, u64)) -> bool {
    start_time(pid) == Some(start)
}

fn spec(name: &str, command: &[&str]) -> v1::JobSpec {
    let mut s = JobSpec::simple(name, 1, 1);
    s.tolerate = LocalityLevel::Any;
    s.memory_mib_per_gpu = Some(1024);
    s.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
    s.command = command.iter().map(|c| c.to_string()).collect();
    v1::JobSpec::from(&s)
}

/// Submits one job and places it on server 0, device `gpu`, view core `core`.
async fn place(c: &mut ViewClient, name: &str, command: &[&str], gpu: u32, core: u32, id: u64) -> JobId {
    let r = c.submit(vec![spec(name, command)]).await.expect("submit");
    assert!(r[0].error.is_empty(), "{}", r[0].error);
    let job = JobId(r[0].job);
    let p = Proposal {
        id: ProposalId(id),
        job,
        members: vec![MemberPlacement {
            server: ServerId(0),
            gpus: 1 << gpu,
            cores: CoreMask::range(core, 1),
            memory_mib: 1024,
        }],
        based_on: ViewVersion(0),
    };
    let d = c.propose(vec![v1::Proposal::from(&p)]).await.expect("propose");
    assert!(matches!(decision(&d[0]), Some(Decision::Accepted { .. })), "{d:?}");
    job
}

/// Waits (bounded) until the job is in `state`; returns its error text.
async fn wait_state(c: &mut ViewClient, job: JobId, state: JobState, log: impl Fn() -> String) -> String {
    let t0 = Instant::now();
    loop {
        let j = c.job(job.0, false).await.expect("job").job.expect("job body");
        let j = tessera_view::Job::try_from(j).expect("valid job");
        if j.state == state {
            return j.error.unwrap_or_default();
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{job} stuck in {} (want {state})\n{}", j.state, log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn wait_dead(task: (u32, u64)) {
    let t0 = Instant::now();
    while alive(task) {
        assert!(t0.elapsed() < Duration::from_secs(20), "task process {task:?} is still alive");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn client(addr: &str, security: &tessera_proto::tls::Security) -> ViewClient {
    ViewClient::new(vec![addr.to_string()])
        .expect("client")
        .with_deadline(Duration::from_secs(20))
        .with_security(security.clone())
}

#[test]
fn tasks_run_pinned_and_report_their_exit() {
    let mut s = Setup::start(3000);
    s.agent(&[]);
    let addr = s.addr.clone();
    let sec = s.view.as_ref().expect("view").security();
    rt().block_on(async {
        let mut c = client(&addr, &sec);
        c.wait_for_leader().await.expect("leader");
        let script = "echo rank=$RANK/$WORLD_SIZE local=$LOCAL_RANK gpus=$CUDA_VISIBLE_DEVICES job=$TESSERA_JOB_ID \
                      master=$MASTER_ADDR:$MASTER_PORT; grep Cpus_allowed_list /proc/self/status; echo oops >&2";
        // View core 3 folds onto host CPU 3 % 2 = 1 in fake-GPU mode on this 2-CPU machine.
        let job = place(&mut c, "hello", &["sh", "-c", script], 2, 3, 1).await;
        let err = wait_state(&mut c, job, JobState::Finished, || s.agent_log()).await;
        assert_eq!(err, "");
        let name = format!("j{}-p1-m0", job.0);
        let dir = task_dirs(&s.data_dir()).into_iter().find(|d| d.ends_with(&name)).expect("task dir");
        // Under the cluster's identity, `t@<hash>`.
        let cluster = dir.parent().and_then(Path::parent).and_then(Path::file_name).expect("cluster dir");
        assert!(cluster.to_string_lossy().starts_with("t_"), "{dir:?}");
        let out = std::fs::read_to_string(dir.join("stdout.log")).expect("stdout log");
        assert!(out.contains(&format!("rank=0/1 local=0 gpus=2 job={} master=127.0.0.1:", job.0)), "{out}");
        let pus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(out.contains(&format!("Cpus_allowed_list:\t{}", 3 % pus)), "{out}");
        let errs = std::fs::read_to_string(dir.join("stderr.log")).expect("stderr log");
        assert_eq!(errs.trim(), "oops");

        let job = place(&mut c, "typo", &["no-such-program-tessera"], 0, 0, 2).await;
        let err = wait_state(&mut c, job, JobState::Failed, || s.agent_log()).await;
        assert!(err.contains("no-such-program-tessera") && err.contains("not found"), "{err}");
        assert!(err.contains("r0-s00"), "{err}");

        let job = place(&mut c, "fails", &["sh", "-c", "exit 3"], 1, 1, 3).await;
        let err = wait_state(&mut c, job, JobState::Failed, || s.agent_log()).await;
        assert!(err.contains("code 3"), "{err}");
        // Every device is free again.
        let v = view_of(&mut c, &addr).await;
        assert_eq!(v.servers()[0].free_gpus, 0xff, "{:?}", v.servers()[0]);
    });
}

#[test]
fn a_failed_member_restarts_its_gang_whole_and_the_second_try_finishes() {
    let mut s = Setup::start(3000);
    s.agent(&[]);
    let addr = s.addr.clone();
    let sec = s.view.as_ref().expect("view").security();
    let marker = s.dir.path().join("first-try-failed");
    rt().block_on(async {
        let mut c = client(&addr, &sec);
        c.wait_for_leader().await.expect("leader");
        // The first time, rank 1 fails while rank 0 would run for a minute; the second time
        // both succeed. Each rank keeps its own marker: rank 0 reading rank 1's raced its
        // touch (rank 0 then exited at once and was never stopped).
        let script = format!(
            "if [ \"$RANK\" = 1 ]; then if [ -e {m} ]; then exit 0; fi; touch {m}; exit 7; fi; \
             if [ -e {m}-rank0 ]; then exit 0; fi; touch {m}-rank0; exec sleep 60",
            m = marker.display()
        );
        let mut spec = JobSpec::simple("flaky", 2, 1);
        spec.tolerate = LocalityLevel::Any;
        spec.memory_mib_per_gpu = Some(1024);
        spec.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
        spec.command = vec!["sh".into(), "-c".into(), script];
        spec.run.restart = Some(tessera_view::job::RestartPolicy { max: 2, backoff_s: 0 });
        spec.run.stop_grace_s = Some(1);
        let r = c.submit(vec![v1::JobSpec::from(&spec)]).await.expect("submit");
        assert!(r[0].error.is_empty(), "{}", r[0].error);
        let job = JobId(r[0].job);
        let propose = |id: u64| {
            let members = (0..2)
                .map(|k| MemberPlacement {
                    server: ServerId(0),
                    gpus: 1 << k,
                    cores: CoreMask::range(k, 1),
                    memory_mib: 1024,
                })
                .collect();
            v1::Proposal::from(&Proposal { id: ProposalId(id), job, members, based_on: ViewVersion(0) })
        };
        let d = c.propose(vec![propose(1)]).await.expect("propose");
        assert!(matches!(decision(&d[0]), Some(Decision::Accepted { .. })), "{d:?}");
        // Rank 1's exit puts the job back to pending, restarted once.
        let t0 = Instant::now();
        let j = loop {
            let j = c.job(job.0, false).await.expect("job").job.expect("body");
            let j = tessera_view::Job::try_from(j).expect("valid job");
            if j.restarts == 1 {
                break j;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no restart: {} {:?}\n{}", j.state, j.error, s.agent_log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!((j.state, j.placement.is_none()), (JobState::Pending, true));
        let err = j.error.unwrap_or_default();
        assert!(err.starts_with("restart 1 of 2") && err.contains("member 1") && err.contains("code 7"), "{err}");
        // The gang restarts whole: rank 0's process, which had not failed, is stopped.
        let first = task_procs(&s.data_dir());
        assert!(!first.is_empty(), "the first try's tasks left no records");
        for t in first {
            wait_dead(t);
        }
        // Placed again, both ranks succeed on the second try.
        let d = c.propose(vec![propose(2)]).await.expect("propose");
        assert!(matches!(decision(&d[0]), Some(Decision::Accepted { .. })), "{d:?}");
        wait_state(&mut c, job, JobState::Finished, || s.agent_log()).await;
        let j = c.job(job.0, false).await.expect("job").job.expect("body");
        assert_eq!(j.restarts, 1);
        assert!(s.agent_log().contains("grace_ms=1000"), "rank 0 was stopped with the job's grace\n{}", s.agent_log());
    });
}

#[test]
fn restart_readopts_and_lease_expiry_leaves_no_orphans() {
    let mut s = Setup::start(4000);
    let a = s.agent(&[]);
    let addr = s.addr.clone();
    let sec = s.view.as_ref().expect("view").security();
    rt().block_on(async {
        let mut c = client(&addr, &sec);
        c.wait_for_leader().await.expect("leader");
        let job = place(&mut c, "long", &["sleep", "600"], 0, 0, 1).await;
        wait_state(&mut c, job, JobState::Running, || s.agent_log()).await;
        let pids = task_pids(&s.data_dir());
        assert_eq!(pids.len(), 1, "{pids:?}");
        let pid = pids[0];
        // kill -9 of the agent: the task keeps running; a new agent re-adopts the same process.
        s.kill_agent(a);
        assert!(alive(pid));
        let mark = s.agent_log().len();
        s.agent(&[]);
        // The new agent registered (renewing the lease), re-adopted the task and made its first
        // round on the view; a stop or a second start would be logged before this line.
        let since = s.wait_log(mark, "following the view").await;
        assert!(since.contains("re-adopted tasks"), "{since}");
        assert!(
            !since.contains("stopping its task") && !since.contains("starting task"),
            "the first round must leave the re-adopted task alone\n{since}"
        );
        let j = c.job(job.0, false).await.expect("job").job.expect("body");
        assert_eq!(j.state, v1::JobState::Running as i32, "the re-adopted job keeps running\n{}", s.agent_log());
        assert!(alive(pid), "the re-adopted task must not be restarted or killed");
        assert_eq!(task_pids(&s.data_dir()), vec![pid]);
        // Cancelling the job stops the re-adopted task.
        c.cancel(job.0).await.expect("cancel");
        wait_dead(pid);

        // A task that ends while no agent runs is reported by the next agent.
        let job = place(&mut c, "short", &["sleep", "1"], 2, 2, 3).await;
        wait_state(&mut c, job, JobState::Running, || s.agent_log()).await;
        let pid = *task_pids(&s.data_dir()).first().expect("running task");
        s.kill_agent(1);
        wait_dead(pid);
        let next = s.agent(&[]);
        wait_state(&mut c, job, JobState::Finished, || s.agent_log()).await;

        // Lease expiry: the agent dies, the gang goes back to pending whole, the task is still
        // there; the next agent registers and stops it.
        let job = place(&mut c, "long2", &["sleep", "600"], 1, 1, 2).await;
        wait_state(&mut c, job, JobState::Running, || s.agent_log()).await;
        let pid = *task_pids(&s.data_dir()).first().expect("running task");
        s.kill_agent(next);
        let err = wait_state(&mut c, job, JobState::Pending, || s.agent_log()).await;
        assert!(err.contains("went down"), "{err}");
        assert!(alive(pid), "nothing stops a task while no agent runs");
        s.agent(&[]);
        wait_dead(pid);
        let v = view_of(&mut c, &addr).await;
        assert_eq!(v.servers()[0].health, tessera_view::Health::Up, "the new agent registered the server again");
    });
}

#[test]
fn unhealthy_device_is_not_placed_on() {
    let mut s = Setup::start(3000);
    let health = s.dir.path().join("health.txt");
    std::fs::write(&health, "3 xid 79: fell off the bus\n").expect("health file");
    let arg = health.display().to_string();
    s.agent(&["--fake-health-file", &arg]);
    let addr = s.addr.clone();
    let sec = s.view.as_ref().expect("view").security();
    rt().block_on(async {
        let mut c = client(&addr, &sec);
        c.wait_for_leader().await.expect("leader");
        let wait_free = |want: u64| {
            let addr = addr.clone();
            let sec = sec.clone();
            async move {
                let mut c = client(&addr, &sec);
                let t0 = Instant::now();
                loop {
                    let v = view_of(&mut c, &addr).await;
                    if v.servers()[0].free_gpus == want {
                        return;
                    }
                    assert!(
                        t0.elapsed() < Duration::from_secs(20),
                        "free {:#x}, want {want:#x}",
                        v.servers()[0].free_gpus
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        wait_free(0xff & !(1 << 3)).await;
        let r = c.submit(vec![spec("on-bad-gpu", &[])]).await.expect("submit");
        let p = Proposal {
            id: ProposalId(7),
            job: JobId(r[0].job),
            members: vec![MemberPlacement {
                server: ServerId(0),
                gpus: 1 << 3,
                cores: CoreMask::range(6, 1),
                memory_mib: 1024,
            }],
            based_on: ViewVersion(0),
        };
        let d = c.propose(vec![v1::Proposal::from(&p)]).await.expect("propose");
        assert!(
            matches!(decision(&d[0]), Some(Decision::Rejected { reason, .. }) if reason.code == "devices_busy"),
            "{d:?}"
        );
        std::fs::write(&health, "").expect("healthy again");
        wait_free(0xff).await;
        let p = Proposal { id: ProposalId(8), ..p };
        let d = c.propose(vec![v1::Proposal::from(&p)]).await.expect("propose");
        assert!(matches!(decision(&d[0]), Some(Decision::Accepted { .. })), "the healthy device is placed on: {d:?}");
    });
}
