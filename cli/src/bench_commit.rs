//! `tessera bench commit`: gang placements committed per second through the replicated view.
//!
//! Starts a cluster of `tessera view serve` processes on loopback in a temporary directory
//! (`tessera_testkit::ProcessCluster`), or targets a running one with `--view`, and runs the
//! load of `tessera_testkit::commit_load` against it: `--clients` concurrent schedulers, each
//! on its own slice of the servers, proposing gangs and releasing the oldest when full. Then
//! every replica's view is checked against what the clients were told. This file holds the
//! arguments and the printing only.

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tessera_testkit::commit_load::{self, CommitLoad};
use tessera_testkit::{LocalCluster, ProcessCluster};
use tessera_view::{ClusterSpec, Topology};
use tessera_view_server::Tuning;

#[derive(Args)]
pub struct CommitArgs {
    /// Start a cluster of this many replica processes on loopback (ignored with --view).
    #[arg(long, default_value_t = 3)]
    local_cluster: u32,
    /// Target a running cluster instead: replica addresses, comma-separated. Its cluster must
    /// be fresh (every server free).
    #[arg(long)]
    view: Option<String>,
    /// With --view: how to connect (`--tls DIR` of an admin certificate, or `--insecure`);
    /// with a local cluster, `--insecure` runs it in plaintext.
    #[command(flatten)]
    security: crate::tls::SecurityArgs,
    /// Concurrent clients (schedulers).
    #[arg(long, default_value_t = 64)]
    clients: u32,
    /// Seconds of load.
    #[arg(long, default_value_t = 20)]
    duration_s: u64,
    /// Gang proposals per Propose request.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Target proposals per second over all clients (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Servers (seed-8gpu) in the local cluster, 32 per rack.
    #[arg(long, default_value_t = 131_072)]
    servers: u32,
    /// Fraction of its slice's GPUs a client fills before releasing its oldest job.
    #[arg(long, default_value_t = 1.0)]
    fill: f64,
    /// Jobs each client submits before the clock starts (the rest are submitted during the
    /// run, 256 per request, as its queue runs low).
    #[arg(long, default_value_t = 8192)]
    preload: usize,
    /// Kill -9 the leader once after this many seconds, restart it 2 s later, and report
    /// failover_ms (kill to the first approval by a new leader).
    #[arg(long)]
    kill_leader_after_s: Option<u64>,
    /// fsync raft writes (on unless --no-sync, which only a throw-away run should use).
    #[arg(long)]
    no_sync: bool,
    /// Milliseconds per raft tick in the local cluster.
    #[arg(long, default_value_t = 50)]
    tick_ms: u64,
    /// Election timeout in ticks in the local cluster.
    #[arg(long, default_value_t = 10)]
    election_tick: usize,
    /// Keep the local cluster's directory (configs, data, logs) here instead of a temporary one.
    #[arg(long)]
    keep_dir: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

impl CommitArgs {
    fn load(&self) -> CommitLoad {
        CommitLoad {
            clients: self.clients,
            duration: Duration::from_secs(self.duration_s),
            batch: self.batch,
            rate: self.rate,
            fill: self.fill,
            preload: self.preload,
            kill_leader_after: self.kill_leader_after_s.map(Duration::from_secs),
        }
    }

    /// The local cluster: `--servers` seed-8gpu servers, 32 to a rack, 16 racks to an
    /// InfiniBand domain, as replica processes of this binary.
    fn start_cluster(&self) -> Result<ProcessCluster> {
        let topo = Topology::preset("seed-8gpu").context("the seed-8gpu preset")?;
        let mut spec = ClusterSpec::uniform(topo, self.servers, 32, 16);
        spec.name = "bench".into();
        let tuning = Tuning {
            tick_ms: self.tick_ms,
            election_tick: self.election_tick,
            sync: !self.no_sync,
            snapshot_every: 100_000,
            ..Tuning::default()
        };
        let mut b = LocalCluster::builder(spec)
            .name("bench")
            .replicas(self.local_cluster.max(1) as usize)
            .tuning(tuning)
            // Mutual TLS like any cluster, unless --insecure asks for plaintext (to measure
            // what TLS costs).
            .tls(!self.security.insecure)
            .log_filter(&std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
        if let Some(d) = &self.keep_dir {
            b = b.data_dir(d);
        }
        let exe = std::env::current_exe().context("locating the tessera binary")?;
        Ok(b.start_processes(&exe)?)
    }
}

pub fn run(args: CommitArgs) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run_async(args))
}

async fn run_async(args: CommitArgs) -> Result<ExitCode> {
    let mut local = match &args.view {
        Some(_) => None,
        None => Some(args.start_cluster()?),
    };
    let addrs: Vec<String> = match (&args.view, &local) {
        (Some(v), _) => v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        (None, Some(l)) => l.addrs(),
        (None, None) => anyhow::bail!("no cluster"),
    };
    let security = match &local {
        Some(l) => l.security(),
        None => args.security.security("the commit benchmark")?,
    };
    let report = commit_load::run(&addrs, &security, local.as_mut(), &args.load()).await?;
    let mut out = serde_json::to_value(&report)?;
    out["fsync"] = serde_json::Value::Bool(!args.no_sync);
    if args.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    if let Some(l) = &local
        && args.keep_dir.is_some()
    {
        eprintln!("bench: cluster directory kept at {}", l.dir().display());
    }
    drop(local);
    Ok(if report.is_clean() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
