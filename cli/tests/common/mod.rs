//! Harness shared by the process tests: a cluster spec, replica configs, `tessera` processes
//! on loopback, and small view helpers.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use tessera_proto::v1;
use tessera_view::{ClusterView, CoreMask, Decision, MemberPlacement, ServerId, ViewSnapshot};
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
