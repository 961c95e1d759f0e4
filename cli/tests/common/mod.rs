//! Harness shared by the process tests: replica processes (`tessera_testkit::ProcessCluster`),
//! other `tessera` processes on loopback, the history checker, and small view helpers.
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
pub use tessera_proto::tls::Role;
use tessera_proto::v1;
use tessera_testkit::{LocalCluster, ProcessCluster};
use tessera_view::{ClusterSpec, ClusterView, CoreMask, Decision, MemberPlacement, ServerId, Topology, ViewSnapshot};
use tessera_view_server::{Tuning, ViewClient};

/// `servers` seed-8gpu servers, 4 to a rack, racks named `rN` (so servers are `rN-sMM`).
pub fn spec(servers: u32) -> ClusterSpec {
    let mut s = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), servers, 4, 1);
    for (i, g) in s.groups.iter_mut().enumerate() {
        g.rack = format!("r{i}");
    }
    s
}

/// The process tests' replica tuning: fast ticks, frequent snapshots with a short log behind
/// them (so restarts and new replicas catch up through snapshots).
pub fn tuning() -> Tuning {
    Tuning { tick_ms: 20, election_tick: 10, snapshot_every: 200, keep_entries: 20, ..Tuning::default() }
}

/// `n` `tessera view serve` processes of cluster `t` over `spec`, in `dir` (a temporary one
/// when `None`); raft on its own ports with `raft_ports`.
pub fn cluster(n: usize, spec: ClusterSpec, tuning: Tuning, raft_ports: bool, dir: Option<&Path>) -> ProcessCluster {
    let mut b = LocalCluster::builder(spec).name("t").replicas(n).raft_ports(raft_ports).tuning(tuning);
    if let Some(d) = dir {
        b = b.data_dir(d);
    }
    b.start_processes(Path::new(env!("CARGO_BIN_EXE_tessera"))).expect("start the replica processes")
}

/// SIGKILL to process group `pgid` (a task's; tasks lead their own group). Never a group id
/// of 1 or less, which would mean this process's group or every process.
pub fn kill_group(pgid: u64) {
    if let Ok(p) = i32::try_from(pgid)
        && p > 1
    {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Every task directory under an agent's data dir (`<data>/<cluster>/tasks/<task>`).
pub fn task_dirs(data: &Path) -> Vec<PathBuf> {
    let list = |p: PathBuf| std::fs::read_dir(p).into_iter().flatten().flatten().map(|e| e.path()).collect::<Vec<_>>();
    list(data.to_path_buf()).into_iter().flat_map(|cluster| list(cluster.join("tasks"))).collect()
}

/// A live process's start time (`/proc/<pid>/stat` field 22), `None` for a zombie or none.
pub fn start_time(pid: u64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    (fields.first() != Some(&"Z")).then(|| fields.get(19)?.parse().ok())?
}

/// The task processes still alive that an agent with data dir `data` started (each leads its
/// own process group): only those whose recorded start time still matches, as pids are
/// recycled.
pub fn live_tasks(data: &Path) -> Vec<u64> {
    task_dirs(data)
        .iter()
        .filter_map(|dir| std::fs::read_to_string(dir.join("task.pid")).ok())
        .filter_map(|text| {
            let mut lines = text.lines().map(|l| l.trim().parse::<u64>().ok());
            match (lines.next(), lines.next()) {
                (Some(Some(pid)), Some(Some(start))) if start_time(pid) == Some(start) => Some(pid),
                _ => None,
            }
        })
        .collect()
}

/// Kills the process group of every task an agent with data dir `data` started that still
/// runs (tasks outlive their agents by design).
pub fn kill_tasks(data: &Path) {
    for pid in live_tasks(data) {
        kill_group(pid);
    }
}

/// One `tessera view serve` process over `spec(2)` with `tuning`, data in `dir/view`, and fake-GPU
/// agents for both servers (`r0-s00`, `r0-s01`): the cluster, its address, the processes.
pub fn two_agent_cluster(dir: &Path, tuning: Tuning) -> (ProcessCluster, String, Procs, [&'static str; 2]) {
    let servers = ["r0-s00", "r0-s01"];
    let (view, addr, procs) = agent_cluster(dir, tuning, &servers);
    (view, addr, procs, servers)
}

/// One `tessera view serve` process over `spec(servers.len())` with `tuning`, data in
/// `dir/view`, and a fake-GPU agent for each server named (`r0-s00`, `r0-s01`, … in the order
/// of the spec): the cluster, its address, the processes.
pub fn agent_cluster(dir: &Path, tuning: Tuning, servers: &[&str]) -> (ProcessCluster, String, Procs) {
    agent_cluster_of(dir, spec(servers.len() as u32), tuning, servers)
}

/// [`agent_cluster`] over the cluster spec `spec` (its servers those of `servers`).
pub fn agent_cluster_of(
    dir: &Path,
    spec: ClusterSpec,
    tuning: Tuning,
    servers: &[&str],
) -> (ProcessCluster, String, Procs) {
    let view = cluster(1, spec, tuning, false, Some(&dir.join("view")));
    let addr = view.addrs()[0].clone();
    let mut procs = Procs::default();
    for s in servers {
        procs.agent(dir, &addr, s, &tls(&view, Role::Agent, s));
    }
    (view, addr, procs)
}

/// The flags of a process acting as `role` `name` on `cluster`: `--tls DIR` with a certificate
/// issued for it, or `--insecure` on a plaintext cluster.
pub fn tls(cluster: &ProcessCluster, role: Role, name: &str) -> Vec<String> {
    match cluster.pki() {
        Some(p) => {
            let dir = p.issue(role, name, &[], &[]).expect("certificate");
            vec!["--tls".into(), dir.display().to_string()]
        }
        None => vec!["--insecure".into()],
    }
}

/// `args` followed by `extra`, as the `&str`s `Command` takes.
pub fn with<'a>(args: &[&'a str], extra: &'a [String]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend(extra.iter().map(String::as_str));
    v
}

/// A raw gRPC channel to `addr` as `role` `name` (requests the leader-following client would
/// not send).
pub async fn channel(cluster: &ProcessCluster, role: Role, name: &str, addr: &str) -> tonic::transport::Channel {
    let sec = match cluster.pki() {
        Some(p) => p.security(role, name, &[]).expect("certificate"),
        None => tessera_proto::tls::Security::Insecure,
    };
    sec.endpoint(addr).expect("endpoint").connect().await.expect("connect")
}

/// A client of `cluster` as its admin.
pub fn admin_client(cluster: &ProcessCluster, addrs: Vec<String>) -> ViewClient {
    ViewClient::new(addrs).expect("client").with_deadline(Duration::from_secs(20)).with_security(cluster.security())
}

/// A test's processes, by name: killed on drop, with the task groups their agents left.
#[derive(Default)]
pub struct Procs {
    pub children: Vec<(String, Child)>,
    pub data_dirs: Vec<PathBuf>,
}

impl Procs {
    /// Starts [`agent`] `name` and remembers its data dir.
    pub fn agent(&mut self, dir: &Path, view: &str, name: &str, tls: &[String]) {
        self.data_dirs.push(dir.join(format!("agent-{name}")));
        self.children.push((name.to_string(), agent(dir, view, name, tls)));
    }

    /// Remembers another process.
    pub fn push(&mut self, name: &str, child: Child) {
        self.children.push((name.to_string(), child));
    }

    /// Kills (SIGKILL) and reaps the processes named `name`.
    pub fn kill(&mut self, name: &str) {
        for (n, c) in &mut self.children {
            if n == name {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in &self.data_dirs {
            kill_tasks(d);
        }
    }
}

/// A `tessera` process with its output in `dir/log`.
pub fn tessera(dir: &Path, log: &str, args: &[&str]) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(log)).expect("log");
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn tessera")
}

/// A fake-GPU (seed-8gpu) agent for server `name`, data in `dir/agent-<name>`, logs served on a
/// free loopback port, output in `dir/<name>.log`.
pub fn agent(dir: &Path, view: &str, name: &str, tls: &[String]) -> Child {
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    agent_with(dir, view, name, &tls)
}

/// [`agent`] with more arguments (e.g. `--fake-health-file FILE`).
pub fn agent_with(dir: &Path, view: &str, name: &str, extra: &[&str]) -> Child {
    agent_process(dir, view, name, "seed-8gpu", &format!("agent-{name}"), &format!("{name}.log"), extra)
}

/// A fake-GPU agent of `topology` (a preset) for server `name`, data in
/// `dir/agent-<name>-<topology>`, output in `dir/<name>-<topology>.log`: two agents of one name
/// and different models keep apart.
pub fn agent_of(dir: &Path, view: &str, name: &str, topology: &str, extra: &[&str]) -> Child {
    let (data, log) = (format!("agent-{name}-{topology}"), format!("{name}-{topology}.log"));
    agent_process(dir, view, name, topology, &data, &log, extra)
}

fn agent_process(dir: &Path, view: &str, name: &str, topology: &str, data: &str, log: &str, extra: &[&str]) -> Child {
    let data = dir.join(data);
    let data = data.to_str().expect("utf-8 path");
    let mut args = vec![
        "agent",
        "run",
        "--view",
        view,
        "--name",
        name,
        "--topology",
        topology,
        "--data-dir",
        data,
        "--peers-on-loopback",
        "--stop-grace-ms",
        "2000",
        "--listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    tessera(dir, log, &args)
}

/// A temporary directory for one process test; `TESSERA_KEEP_TEST_DIR=1` keeps it (and the
/// processes' logs in it) for a post-mortem and prints where it is.
pub fn test_dir(prefix: &str) -> tempfile::TempDir {
    let keep = std::env::var_os("TESSERA_KEEP_TEST_DIR").is_some();
    let dir = tempfile::Builder::new().prefix(prefix).disable_cleanup(keep).tempdir().expect("tmp");
    if keep {
        eprintln!("test directory: {}", dir.path().display());
    }
    dir
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

pub async fn view_of(c: &mut ViewClient, addr: &str) -> ClusterView {
    let s = c.snapshot_of(addr, false).await.expect("snapshot");
    ClusterView::from_snapshot(ViewSnapshot::try_from(s.snapshot.expect("snapshot body")).expect("valid snapshot"))
}

/// One member of `gpus` GPUs on `server`, cores 4 per GPU from `core0`.
pub fn member(server: u32, gpus: u64, core0: u32) -> MemberPlacement {
    let n = gpus.count_ones();
    let cores = CoreMask::range(core0, 4 * n);
    MemberPlacement { server: ServerId(server), gpus, cores, memory_mib: 1024 * n }
}

pub fn decision(r: &v1::ProposeResult) -> Option<Decision<tessera_proto::RemoteRejection>> {
    r.decision.clone().map(|d| tessera_proto::RemoteDecision::try_from(d).expect("decision"))
}

pub async fn snapshot(c: &mut ViewClient) -> ViewSnapshot {
    let s = c.snapshot(true).await.expect("snapshot").snapshot.expect("snapshot body");
    ViewSnapshot::try_from(s).expect("valid snapshot")
}

/// Waits (bounded by `deadline`) until `pred` holds on a snapshot, waking on view changes.
pub async fn wait_view(c: &mut ViewClient, deadline: Instant, what: &str, mut pred: impl FnMut(&ViewSnapshot) -> bool) {
    loop {
        let s = snapshot(c).await;
        if pred(&s) {
            return;
        }
        let states: Vec<String> = s.jobs.iter().map(|j| format!("{}:{:?}", j.id, j.state)).collect();
        assert!(Instant::now() < deadline, "timed out waiting for {what}; jobs: {states:?}");
        let mut w = c.clone();
        let v = s.version.0;
        let _ = tokio::time::timeout(Duration::from_millis(500), async move {
            if let Ok(mut st) = w.watch(v).await {
                let _ = st.message().await;
            }
        })
        .await;
    }
}

pub use tessera_testkit::history::{Followed, History, follow};

/// A member on `server` holding the GPUs of mask `gpus` of a seed-8gpu server, with one core of
/// each GPU's four and 1 GiB per GPU: what the process tests' jobs ask for (1 core, 1 GiB per GPU).
pub fn one_core_per_gpu(server: u32, gpus: u64) -> MemberPlacement {
    let mut cores = CoreMask::default();
    (0..8).filter(|g| gpus >> g & 1 == 1).for_each(|g| cores.insert(4 * g));
    MemberPlacement { server: ServerId(server), gpus, cores, memory_mib: 1024 * gpus.count_ones() }
}

/// Places `job` as `member` directly (proposal `id`), as a scheduler would; asserts it was accepted.
pub async fn place(c: &mut ViewClient, job: tessera_view::JobId, member: MemberPlacement, id: u64) {
    let p = tessera_view::Proposal {
        id: tessera_view::ProposalId(id),
        job,
        members: vec![member],
        based_on: tessera_view::ViewVersion(0),
    };
    let d = c.propose(vec![v1::Proposal::from(&p)]).await.expect("propose");
    assert!(matches!(decision(&d[0]), Some(Decision::Accepted { .. })), "{d:?}");
}
