//! `tessera dev`: a whole cluster in one process, for a first try.
//!
//! Three view replicas (raft on RocksDB, fsync on, each with its gRPC API and the first with
//! the HTTP API), fake-GPU node agents that run real processes, and a scheduler host — the
//! same code as the separate processes of a real deployment, wired on loopback. With
//! `--submit`, it submits job files once the cluster is up and follows them.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tessera_agent::agent::{AgentConfig, run as run_agent};
use tessera_proto::backoff::{Backoff, seeded_rng};
use tessera_proto::tls::Role;
use tessera_proto::v1;
use tessera_scheduler::{HostConfig, Registry, RuntimeOptions, run_host};
use tessera_testkit::LocalCluster;
use tessera_view::cluster_spec::RackGroup;
use tessera_view::{ClusterSpec, ClusterView, JobSpec, Topology};
use tessera_view_server::{ListenAddrs, Tuning, ViewClient};
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
    /// Port of the agents' and scheduler hosts' Prometheus metrics (one endpoint for all of
    /// them, each series labelled with its server or host); 0 picks a free one.
    #[arg(long, default_value_t = 8090)]
    metrics_port: u16,
    /// Scheduler hosts to run.
    #[arg(long, default_value_t = 1)]
    scheduler_hosts: u32,
    /// Job files to submit once the cluster is up.
    #[arg(long, num_args = 1..)]
    submit: Vec<PathBuf>,
    /// With --submit: stop once every submitted job has ended (exit 1 if one failed).
    #[arg(long)]
    exit_when_done: bool,
    /// Plaintext, nothing authenticated (default: mutual TLS, with a CA and certificates made
    /// in the data directory's `tls/`).
    #[arg(long)]
    insecure: bool,
}

/// Where replica `i` listens: fixed ports from the flags, or fresh ones (port 0).
fn listen_addrs(args: &DevArgs, i: u16) -> ListenAddrs {
    let at = |base: u16, offset: u16| {
        let port = if base == 0 { 0 } else { base.saturating_add(offset) };
        SocketAddr::from(([127, 0, 0, 1], port))
    };
    ListenAddrs {
        client: at(args.view_port, i),
        raft: Some(at(args.view_port, 100 + i)),
        http: (i == 0).then(|| at(args.http_port, 0)),
    }
}

/// The dev cluster spec: `servers` of `topology` spread over `racks` racks, one InfiniBand
/// domain.
fn dev_spec(args: &DevArgs) -> Result<ClusterSpec> {
    let topology = match Topology::preset(&args.topology) {
        Some(t) => t,
        None => {
            Topology::from_file(Path::new(&args.topology)).with_context(|| format!("--topology {}", args.topology))?
        }
    };
    if args.servers == 0 || args.racks == 0 || args.racks > args.servers {
        bail!("need 1 <= --racks <= --servers");
    }
    let groups = (0..args.racks)
        .map(|r| RackGroup {
            rack: format!("rack-{}", (b'a' + (r % 26) as u8) as char),
            ib_domain: "ib-0".to_string(),
            topology: 0,
            servers: args.servers / args.racks + u32::from(r < args.servers % args.racks),
        })
        .collect();
    Ok(ClusterSpec {
        name: "dev".to_string(),
        topologies: vec![topology],
        groups,
        quotas: Default::default(),
        class_quotas: Default::default(),
        priorities: Default::default(),
        accounting: Default::default(),
    })
}

pub fn run(args: DevArgs) -> Result<ExitCode> {
    crate::view::runtime()?.block_on(run_async(args))
}

async fn run_async(args: DevArgs) -> Result<ExitCode> {
    // Job files are checked before anything starts: a typo costs no cluster start-up.
    let mut specs = Vec::new();
    for f in &args.submit {
        specs.push(JobSpec::from_file(f)?);
    }
    let tmp = tempfile::Builder::new().prefix("tessera-dev-").tempdir()?;
    let dir = args.data_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    let spec = dev_spec(&args)?;
    let names = ClusterView::from_spec(&spec).snapshot().server_names;
    let tuning = Tuning { tick_ms: 20, server_lease_ms: 3000, scheduler_lease_ms: 2000, ..Tuning::default() };
    let cluster = LocalCluster::builder(spec.clone())
        .name("dev")
        .listen((0..3).map(|i| listen_addrs(&args, i)).collect())
        .tuning(tuning)
        .data_dir(&dir)
        .tls(!args.insecure)
        .start()
        .await
        .context("cannot start the dev view (another `tessera dev` or deploy/local cluster on these ports? pass --view-port/--http-port, or 0 for free ports)")?;
    let addrs = cluster.addrs();
    let http_port = cluster.http_addr().map_or(0, |h| h.port());
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    if args.insecure {
        tracing::warn!("tessera dev --insecure: plaintext, nothing authenticated");
    }
    let mut c =
        ViewClient::new(addrs.clone())?.with_deadline(Duration::from_secs(20)).with_security(cluster.security());
    let leader = c.wait_for_leader().await.context("the dev view elected no leader")?;

    let exe = std::env::current_exe()?.display().to_string();
    // One recorder for every agent and host of the process, served on one port.
    let metrics = std::sync::Arc::new(tessera_proto::prom::Metrics::new());
    let mut agents = Vec::new();
    for name in &names {
        let cfg = AgentConfig {
            view: addrs.clone(),
            security: cluster.security_for(Role::Agent, name, &[])?,
            name: name.clone(),
            data_dir: dir.join("agents").join(name),
            topology: Some(args.topology.clone()),
            shim: vec![exe.clone(), "agent".into(), "shim".into()],
            stop_grace: Duration::from_secs(3),
            peers_on_loopback: true,
            fake_health_file: None,
            listen: Some("127.0.0.1:0".into()),
            metrics: metrics.clone(),
        };
        agents.push(tokio::spawn(run_agent(cfg, stopped(stop_rx.clone()))));
    }
    let mut hosts = Vec::new();
    let mut metrics_addr = None;
    for h in 0..args.scheduler_hosts.max(1) {
        let name = format!("dev-host-{h}");
        let security = cluster.security_for(Role::Scheduler, &name, &[])?;
        if metrics_addr.is_none() {
            // Served with the first host's certificate (it names 127.0.0.1, as every dev one).
            let at = format!("127.0.0.1:{}", args.metrics_port);
            metrics_addr = Some(crate::view::serve_metrics(&at, &security, metrics.clone()).await.with_context(|| {
                format!("cannot serve the agents' and hosts' metrics on {at} (pass --metrics-port, or 0 for a free port)")
            })?);
        }
        let cfg = HostConfig {
            view: addrs.clone(),
            security,
            name,
            max_jobs: 256,
            runtime: RuntimeOptions { salt: u64::from(h), ..RuntimeOptions::default() },
            migration: tessera_scheduler::MigrationConfig::default(),
            metrics: metrics.clone(),
        };
        hosts.push(tokio::spawn(run_host(cfg, Registry::default(), stopped(stop_rx.clone()))));
    }

    let gpus: u64 = spec.groups.iter().map(|g| g.servers as u64 * spec.topologies[g.topology].devices as u64).sum();
    println!("tessera dev: {} servers of {} in {} racks ({gpus} GPUs)", names.len(), args.topology, args.racks);
    println!("  view (gRPC)  {}   leader: replica {}", addrs.join(","), leader.leader);
    let scheme = cluster.security().scheme();
    println!(
        "  HTTP API     {scheme}://127.0.0.1:{http_port}/v1/jobs   (OpenAPI: /v1/openapi.json, metrics: /metrics)"
    );
    if let Some(m) = metrics_addr {
        println!("  metrics      {scheme}://{m}/metrics   (agents and scheduler hosts; the replicas' on the HTTP API)");
    }
    match dashboard_token(&cluster) {
        Ok(Some(token)) => println!(
            "  dashboard    {scheme}://127.0.0.1:{http_port}/ui#token={token}\n               (an admin's token for 12 h; the certificate is the dev CA's: your browser will ask)"
        ),
        Ok(None) => println!("  dashboard    {scheme}://127.0.0.1:{http_port}/ui"),
        Err(e) => println!("  dashboard    {scheme}://127.0.0.1:{http_port}/ui   (no token: {e:#})"),
    }
    println!("  data         {}", dir.display());
    println!("  try:  export TESSERA_VIEW={}", addrs.join(","));
    match cluster.security().tls() {
        Some(t) => {
            let admin = t.dir().display();
            println!(
                "        export TESSERA_TLS={admin}   # an admin's certificate (CA: {})",
                dir.join("tls/ca").display()
            );
            println!(
                "        curl --cacert {admin}/ca.pem --cert {admin}/cert.pem --key {admin}/key.pem {scheme}://127.0.0.1:{http_port}/v1/jobs"
            );
        }
        None => println!("        export TESSERA_INSECURE=1   # plaintext"),
    }
    println!("        tessera submit examples/jobs/hello-1gpu.toml --wait; tessera jobs; tessera servers");

    let code = if specs.is_empty() {
        println!("  Ctrl-C stops the cluster.");
        crate::view::terminated().await;
        ExitCode::SUCCESS
    } else {
        let (ids, refused) = crate::jobs::submit_files(&mut c, &specs, &args.submit).await?;
        let failed = tokio::select! {
            r = crate::jobs::wait_for(&c, &ids, Duration::from_secs(3600)) => Some(r?),
            _ = crate::view::terminated() => None,
        };
        if failed.is_some() && !args.exit_when_done {
            println!("All submitted jobs ended. Each job's output: tessera logs JOB [--member N].");
            println!("Ctrl-C stops the cluster.");
            crate::view::terminated().await;
        }
        if failed.unwrap_or(0) > 0 || refused > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
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
    cluster.stop().await.context("a dev replica failed")?;
    Ok(code)
}

/// How long the dashboard link's token lives.
const DASHBOARD_TOKEN_TTL_S: u64 = 12 * 3600;

/// An admin's bearer token for the dashboard link, signed by the dev cluster's CA (`None` in
/// plaintext, where the API needs none).
fn dashboard_token(cluster: &LocalCluster) -> Result<Option<String>> {
    let Some(pki) = cluster.pki() else { return Ok(None) };
    let key_file = pki.ca_dir().join(tessera_proto::tls::material::CA_KEY_FILE);
    let key = std::fs::read_to_string(&key_file).with_context(|| format!("{}", key_file.display()))?;
    let id = tessera_proto::tls::Identity::new(Role::Admin, "dashboard", &[])?;
    let now = tessera_proto::tls::unix_s();
    Ok(Some(tessera_proto::tls::token::create(&key, &id, now, DASHBOARD_TOKEN_TTL_S)?))
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
