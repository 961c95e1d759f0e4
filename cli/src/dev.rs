//! `tessera dev`: a whole cluster in one process, for a first try.
//!
//! Three view replicas (raft on RocksDB, fsync on, each with its gRPC API and the first with
//! the HTTP API), fake-GPU node agents that run real processes, and a scheduler host — the
//! same code as the separate processes of a real deployment, wired on loopback. With
//! `--submit`, it submits job files once the cluster is up and follows them.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tessera_agent::agent::{AgentConfig, run as run_agent};
use tessera_proto::backoff::{Backoff, seeded_rng};
use tessera_proto::v1;
use tessera_scheduler::{HostConfig, Registry, RuntimeOptions, run_host};
use tessera_view::{ClusterSpec, ClusterView, JobSpec, Topology};
use tessera_view_server::{ServeConfig, ViewClient};
use tokio::sync::watch;

#[derive(Args)]
pub struct DevArgs {
    /// Keep the replicas' data and the agents' task directories here (default: a temporary
    /// directory, removed at exit).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Fake-GPU servers.
    #[arg(long, default_value_t = 4)]
    servers: u32,
    /// Their model: a topology preset name or file.
    #[arg(long, default_value = "seed-8gpu")]
    topology: String,
    /// Racks the servers are spread over (one InfiniBand domain).
    #[arg(long, default_value_t = 2)]
    racks: u32,
    /// First gRPC port of the replicas (three in a row; raft uses the next hundred); 0 picks
    /// free ports.
    #[arg(long, default_value_t = 7101)]
    view_port: u16,
    /// HTTP API port (replica 1); 0 picks a free one.
    #[arg(long, default_value_t = 8080)]
    http_port: u16,
    /// Scheduler hosts to run.
    #[arg(long, default_value_t = 1)]
    scheduler_hosts: u32,
    /// Job files to submit once the cluster is up.
    #[arg(long, num_args = 1..)]
    submit: Vec<PathBuf>,
    /// With --submit: stop once every submitted job has ended (exit 1 if one failed).
    #[arg(long)]
    exit_when_done: bool,
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn ports(base: u16, n: u16) -> Result<Vec<u16>> {
    if base == 0 {
        return (0..n).map(|_| free_port()).collect();
    }
    let ports: Vec<u16> = (0..n).map(|i| base.saturating_add(i)).collect();
    for p in &ports {
        if TcpListener::bind(("127.0.0.1", *p)).is_err() {
            bail!(
                "port {p} is in use (another `tessera dev` or deploy/local cluster?); pass --view-port/--http-port, or 0 for free ports"
            );
        }
    }
    Ok(ports)
}

/// The dev cluster spec: `servers` of `topology` spread over `racks` racks.
fn cluster_toml(a: &DevArgs) -> Result<String> {
    let topo = match Topology::preset(&a.topology) {
        Some(_) => format!("\"{}\"", a.topology),
        None => {
            let p = Path::new(&a.topology).canonicalize().with_context(|| format!("--topology {}", a.topology))?;
            Topology::from_file(&p)?;
            format!("{:?}", p.display().to_string())
        }
    };
    if a.servers == 0 || a.racks == 0 || a.racks > a.servers {
        bail!("need 1 <= --racks <= --servers");
    }
    let mut s = String::from("name = \"dev\"\n");
    for r in 0..a.racks {
        let n = a.servers / a.racks + u32::from(r < a.servers % a.racks);
        s += &format!(
            "\n[[racks]]\nname = \"rack-{}\"\nib_domain = \"ib-0\"\ntopology = {topo}\nservers = {n}\n",
            (b'a' + (r % 26) as u8) as char
        );
    }
    Ok(s)
}

pub fn run(a: DevArgs) -> Result<ExitCode> {
    crate::view::runtime()?.block_on(run_async(a))
}

async fn run_async(a: DevArgs) -> Result<ExitCode> {
    // Job files are checked before anything starts: a typo costs no cluster start-up.
    let mut specs = Vec::new();
    for f in &a.submit {
        specs.push(JobSpec::from_file(f)?);
    }
    let tmp = tempfile::Builder::new().prefix("tessera-dev-").tempdir()?;
    let dir = a.data_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    let spec_text = cluster_toml(&a)?;
    std::fs::write(dir.join("cluster.toml"), &spec_text)?;
    let spec = ClusterSpec::from_file(&dir.join("cluster.toml"))?;
    let names = ClusterView::from_spec(&spec).snapshot().server_names;

    let client_ports = ports(a.view_port, 3)?;
    let raft_ports = ports(if a.view_port == 0 { 0 } else { a.view_port.saturating_add(100) }, 3)?;
    let http_port = ports(a.http_port, 1)?[0];
    let addrs: Vec<String> = client_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let peers: Vec<String> = addrs.iter().enumerate().map(|(i, a)| format!("\"{}={a}\"", i + 1)).collect();
    let raft_peers: Vec<String> =
        raft_ports.iter().enumerate().map(|(i, p)| format!("\"{}=127.0.0.1:{p}\"", i + 1)).collect();
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut replicas = Vec::new();
    for i in 0..3 {
        let http = if i == 0 { format!("http_listen = \"127.0.0.1:{http_port}\"\n") } else { String::new() };
        let file = dir.join(format!("replica-{}.toml", i + 1));
        std::fs::write(
            &file,
            format!(
                "id = {}\ncluster = \"dev\"\ncluster_spec = \"cluster.toml\"\nlisten = \"{}\"\n\
                 raft_listen = \"127.0.0.1:{}\"\ndata_dir = \"replica-{}\"\npeers = [{}]\nraft_peers = [{}]\n\
                 tick_ms = 20\nserver_lease_ms = 3000\nscheduler_lease_ms = 2000\n{http}",
                i + 1,
                addrs[i],
                raft_ports[i],
                i + 1,
                peers.join(", "),
                raft_peers.join(", ")
            ),
        )?;
        let cfg = ServeConfig::from_file(&file)?;
        replicas.push(tokio::spawn(tessera_view_server::serve(cfg, stopped(stop_rx.clone()))));
    }
    let mut c = ViewClient::new(addrs.clone())?.with_deadline(Duration::from_secs(20));
    let leader = c.wait_for_leader().await.context("the dev view elected no leader")?;

    let exe = std::env::current_exe()?.display().to_string();
    let mut agents = Vec::new();
    for name in &names {
        let cfg = AgentConfig {
            view: addrs.clone(),
            name: name.clone(),
            data_dir: dir.join("agents").join(name),
            topology: Some(a.topology.clone()),
            shim: vec![exe.clone(), "agent".into(), "shim".into()],
            stop_grace: Duration::from_secs(3),
            peers_on_loopback: true,
            fake_health_file: None,
            listen: Some("127.0.0.1:0".into()),
        };
        agents.push(tokio::spawn(run_agent(cfg, stopped(stop_rx.clone()))));
    }
    let mut hosts = Vec::new();
    for h in 0..a.scheduler_hosts.max(1) {
        let cfg = HostConfig {
            view: addrs.clone(),
            name: format!("dev-host-{h}"),
            max_jobs: 256,
            runtime: RuntimeOptions { salt: u64::from(h), ..RuntimeOptions::default() },
            migration: tessera_scheduler::MigrationConfig::default(),
        };
        hosts.push(tokio::spawn(run_host(cfg, Registry::default(), stopped(stop_rx.clone()))));
    }

    let gpus: u64 = spec.groups.iter().map(|g| g.servers as u64 * spec.topologies[g.topology].devices as u64).sum();
    println!("tessera dev: {} servers of {} in {} racks ({gpus} GPUs)", names.len(), a.topology, a.racks);
    println!("  view (gRPC)  {}   leader: replica {}", addrs.join(","), leader.leader);
    println!("  HTTP API     http://127.0.0.1:{http_port}/v1/jobs   (OpenAPI: /v1/openapi.json, metrics: /metrics)");
    println!("  data         {}", dir.display());
    println!("  try:  export TESSERA_VIEW={}", addrs.join(","));
    println!("        tessera submit examples/jobs/hello-1gpu.toml --wait; tessera jobs; tessera servers");

    let code = if specs.is_empty() {
        println!("  Ctrl-C stops the cluster.");
        crate::view::terminated().await;
        ExitCode::SUCCESS
    } else {
        let ids = crate::jobs::submit_files(&mut c, &specs, &a.submit).await?;
        let failed = tokio::select! {
            r = crate::jobs::wait_for(&c, &ids, Duration::from_secs(3600)) => Some(r?),
            _ = crate::view::terminated() => None,
        };
        if failed.is_some() && !a.exit_when_done {
            println!("All submitted jobs ended. Each job's output: tessera logs JOB [--member N].");
            println!("Ctrl-C stops the cluster.");
            crate::view::terminated().await;
        }
        if failed.unwrap_or(0) > 0 || ids.len() < specs.len() { ExitCode::FAILURE } else { ExitCode::SUCCESS }
    };

    // Tasks outlive their agents by design; a dev cluster going away cancels its live jobs
    // first so their processes stop with it.
    let snap = c.snapshot(true).await?.snapshot.context("no snapshot")?;
    let live: Vec<u64> = snap
        .jobs
        .iter()
        .filter(|j| !matches!(v1::JobState::try_from(j.state), Ok(v1::JobState::Finished | v1::JobState::Failed)))
        .map(|j| j.id)
        .collect();
    for j in &live {
        let _ = c.cancel_because(*j, "the dev cluster stopped").await;
    }
    if !live.is_empty() {
        // Agents stop the tasks of cancelled jobs on their next reconcile; each task's shim
        // writes exit.json once it has ended.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
        let mut rng = seeded_rng(live.len() as u64);
        while running_tasks(&dir.join("agents")) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(backoff.next_delay(&mut rng)).await;
        }
    }
    let _ = stop_tx.send(true);
    for h in hosts {
        let _ = h.await;
    }
    for ag in agents {
        let _ = ag.await;
    }
    for r in replicas {
        r.await?.context("a dev replica failed")?;
    }
    Ok(code)
}

/// Task directories (`agents/<server>/<cluster>/tasks/<task>`) whose task has not ended.
fn running_tasks(agents: &Path) -> usize {
    let dirs = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p).map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default()
    };
    let mut n = 0;
    for server in dirs(agents) {
        for cluster in dirs(&server) {
            n += dirs(&cluster.join("tasks")).iter().filter(|t| !t.join("exit.json").exists()).count();
        }
    }
    n
}
