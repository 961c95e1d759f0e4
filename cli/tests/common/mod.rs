//! Harness shared by the process tests: replica processes (`tessera_testkit::ProcessCluster`),
//! other `tessera` processes on loopback, the history checker, and small view helpers.
#![allow(dead_code, unused_imports)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
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
pub fn agent(dir: &Path, view: &str, name: &str) -> Child {
    agent_with(dir, view, name, &[])
}

/// [`agent`] with more arguments (e.g. `--fake-health-file FILE`).
pub fn agent_with(dir: &Path, view: &str, name: &str, extra: &[&str]) -> Child {
    let data = dir.join(format!("agent-{name}"));
    let data = data.to_str().expect("utf-8 path");
    let mut args = vec![
        "agent",
        "run",
        "--view",
        view,
        "--name",
        name,
        "--topology",
        "seed-8gpu",
        "--data-dir",
        data,
        "--peers-on-loopback",
        "--stop-grace-ms",
        "2000",
        "--listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    tessera(dir, &format!("{name}.log"), &args)
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

pub use tessera_testkit::history::{History, follow};
