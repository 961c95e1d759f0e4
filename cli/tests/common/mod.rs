//! Harness shared by the process tests: a cluster spec, replica configs, `tessera` processes
//! on loopback, and small view helpers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use tessera_proto::v1;
use tessera_view::{
    ClusterView, CoreMask, Decision, Job, JobId, LocalityLevel, MemberPlacement, ServerId, ViewDelta, ViewSnapshot,
};
use tessera_view_server::ViewClient;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

pub fn write_spec(dir: &Path, servers: u32) {
    let mut spec = String::from("name = \"t\"\n");
    for r in 0..servers.div_ceil(4) {
        spec.push_str(&format!(
            "\n[[racks]]\nname = \"r{r}\"\nib_domain = \"ib0\"\ntopology = \"seed-8gpu\"\nservers = {}\n",
            (servers - r * 4).min(4)
        ));
    }
    std::fs::write(dir.join("cluster.toml"), spec).expect("spec");
}

pub fn config(id: usize, cluster: &str, listen: &str, peers: &[String], join: bool) -> String {
    let peers: Vec<String> = peers.iter().map(|p| format!("\"{p}\"")).collect();
    format!(
        "id = {id}\ncluster = \"{cluster}\"\ncluster_spec = \"cluster.toml\"\nlisten = \"{listen}\"\n\
         data_dir = \"data-{id}\"\npeers = [{}]\njoin = {join}\ntick_ms = 20\nelection_tick = 10\n\
         snapshot_every = 200\nkeep_entries = 20\n",
        peers.join(", ")
    )
}

pub fn spawn(dir: &Path, id: usize) -> Child {
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("replica-{id}.log"))).expect("log");
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["view", "serve", "--config"])
        .arg(dir.join(format!("replica-{id}.toml")))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn tessera view serve")
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

/// Holdings at every step of the view's history: (server, gpu) and (server, core) → job.
#[derive(Default)]
pub struct History {
    pub held: HashMap<JobId, Vec<(u32, u64, [u64; 2])>>,
    pub violations: Vec<String>,
    /// Every placement each job was seen with: (first member's server, level).
    pub placements: HashMap<JobId, Vec<(u32, LocalityLevel)>>,
    pub version: u64,
}

impl History {
    pub fn apply(&mut self, jobs: &[Job], version: u64) {
        for j in jobs {
            match &j.placement {
                Some(p) if j.state.holds_resources() => {
                    let members: Vec<(u32, u64, [u64; 2])> =
                        p.members.iter().map(|m| (m.server.0, m.gpus, m.cores.0)).collect();
                    if self.held.get(&j.id) != Some(&members) {
                        self.placements.entry(j.id).or_default().push((p.members[0].server.0, p.level));
                    }
                    self.held.insert(j.id, members);
                }
                _ => {
                    self.held.remove(&j.id);
                }
            }
        }
        // No device or core held twice.
        let mut gpus: HashMap<u32, (u64, [u64; 2])> = HashMap::new();
        for (job, members) in &self.held {
            for (s, g, c) in members {
                let e = gpus.entry(*s).or_insert((0, [0, 0]));
                if e.0 & g != 0 || e.1[0] & c[0] != 0 || e.1[1] & c[1] != 0 {
                    self.violations.push(format!("version {version}: job {job} overlaps on server {s}"));
                }
                e.0 |= g;
                e.1[0] |= c[0];
                e.1[1] |= c[1];
            }
        }
        self.version = self.version.max(version);
    }
}

/// Follows the view from version 0 to the end of the test, across leader changes.
pub async fn watch_history(mut c: ViewClient, h: Arc<Mutex<History>>, stop: tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow() {
        let from = h.lock().expect("history").version;
        let Ok(mut stream) = c.watch(from).await else { continue };
        loop {
            let mut stop = stop.clone();
            let ev = tokio::select! {
                ev = stream.message() => ev,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Ok(Some(ev)) = ev else { break };
            let mut h = h.lock().expect("history");
            match ev.event {
                Some(v1::watch_event::Event::Delta(d)) => {
                    let d = ViewDelta::try_from(d).expect("delta");
                    assert!(d.from.0 <= h.version, "a gap in the history: {} after {}", d.from.0, h.version);
                    h.apply(&d.jobs, d.to.0);
                }
                Some(v1::watch_event::Event::Snapshot(s)) => {
                    let s = ViewSnapshot::try_from(s).expect("snapshot");
                    let v = s.version.0;
                    h.apply(&s.jobs, v);
                }
                None => {}
            }
        }
    }
}
