//! `tessera scheduler run`: a scheduler host (job-scheduler/src/host.rs).

use anyhow::Result;
use clap::{Args, Subcommand};
use std::process::ExitCode;
use std::time::Duration;
use tessera_scheduler::{HostConfig, MigrationConfig, Registry, RuntimeOptions, run_host};

#[derive(Subcommand)]
pub enum SchedulerCommand {
    /// Run a scheduler host: adopt pending jobs under a lease, run each job's scheduler.
    Run(RunArgs),
}

#[derive(Args)]
pub struct RunArgs {
    /// View replica addresses, comma-separated `host:port`.
    #[arg(long, env = "TESSERA_VIEW", default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103")]
    view: String,
    #[command(flatten)]
    tls: crate::tls::ComponentTlsArgs,
    /// This host's name, unique among hosts (default: its certificate's name with TLS, else
    /// host name and process id).
    #[arg(long)]
    name: Option<String>,
    /// Most jobs scheduled at once.
    #[arg(long, default_value_t = 256)]
    max_jobs: usize,
    /// The scheduler for jobs that name none: locality-tolerant, cpu-aware or optimus
    /// (`default`, the old name of locality-tolerant, is still accepted).
    #[arg(long, default_value = "locality-tolerant")]
    default_scheduler: String,
    /// How often the host looks for held jobs that fragmentation blocks and moves small
    /// running jobs out of their way (live migration); 0 turns it off.
    #[arg(long, default_value_t = 5000)]
    migrate_every_ms: u64,
    /// Where the host serves its Prometheus metrics (`GET /metrics`: adoption, proposals and
    /// their round trips, placements by level, migrations), `host:port`; over HTTPS with the
    /// host's certificate when it runs with TLS. Not served when absent.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Make bounded reservations: withhold the servers a starved gang of whole servers would
    /// drain soonest from the jobs behind it, while the waiting that costs them stays below what
    /// the gang is expected to gain (docs/ARCHITECTURE.md, "Bounded reservations"). Off by
    /// default: on the robustness matrix they cost more average completion time than they save.
    #[arg(long)]
    reservations: bool,
}

pub fn run(cmd: SchedulerCommand) -> Result<ExitCode> {
    let SchedulerCommand::Run(args) = cmd;
    let (security, cert_name) = args.tls.security("the scheduler host")?;
    let name = match (args.name, cert_name) {
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => format!("{}-{}", crate::agent::hostname()?, std::process::id()),
    };
    let registry = Registry::default().with_default(&args.default_scheduler)?;
    let cfg = HostConfig {
        view: args.view.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        security,
        name,
        max_jobs: args.max_jobs.max(1),
        runtime: RuntimeOptions {
            salt: u64::from(std::process::id()),
            reserve: args.reservations,
            ..RuntimeOptions::default()
        },
        // A job waits one interval before moves are planned for it: its scheduler goes first.
        migration: MigrationConfig {
            interval: (args.migrate_every_ms > 0).then(|| Duration::from_millis(args.migrate_every_ms)),
            min_wait: Duration::from_millis(args.migrate_every_ms),
            ..MigrationConfig::default()
        },
        metrics: Default::default(),
    };
    let stats = crate::view::runtime()?.block_on(async move {
        if let Some(addr) = &args.metrics_listen {
            crate::view::serve_metrics(addr, &cfg.security, cfg.metrics.clone()).await?;
        }
        run_host(cfg, registry, crate::view::terminated()).await.map_err(anyhow::Error::from)
    })?;
    eprintln!(
        "scheduler host stopped: {} jobs adopted, {} placed, {} given up",
        stats.adopted, stats.placed, stats.gave_up
    );
    Ok(ExitCode::SUCCESS)
}
