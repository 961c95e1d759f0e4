//! `tessera agent …`: the node agent (discovery, registration and leases, the task runner).

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tessera_agent::agent::{AgentConfig, run as run_agent};
use tessera_agent::discover::{DiscoverOptions, discover};

#[derive(Subcommand)]
pub enum AgentCommand {
    /// Show what this machine offers: GPUs (NVML), host topology (hwloc), the server model
    /// built from them and the configuration-set preset it matches.
    Discover(DiscoverArgs),
    /// Register this server with the view, heartbeat under its lease and run the tasks of the
    /// placements on it.
    Run(RunArgs),
    /// Internal: the per-task shim the agent starts (reads `TESSERA_SHIM_DIR`).
    #[command(hide = true)]
    Shim,
}

#[derive(Args)]
pub struct DiscoverArgs {
    /// Print JSON instead of a report.
    #[arg(long)]
    json: bool,
    /// Fake-GPU mode: take the devices from a topology preset name or file instead of NVML.
    #[arg(long)]
    topology: Option<String>,
    /// Print the discovered server model as a topology preset file, to start a new
    /// configuration set in the cluster spec.
    #[arg(long, conflicts_with = "json")]
    preset: bool,
}

#[derive(Args)]
pub struct RunArgs {
    /// View replica addresses, comma-separated `host:port`.
    #[arg(long, env = "TESSERA_VIEW", value_delimiter = ',', required = true)]
    view: Vec<String>,
    /// This server's name in the cluster spec (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// Directory for task specs, logs and exit records (kept across restarts: a new agent
    /// re-adopts the tasks it finds there).
    #[arg(long)]
    data_dir: PathBuf,
    /// Fake-GPU mode: a topology preset name or file instead of NVML.
    #[arg(long)]
    topology: Option<String>,
    /// Milliseconds a stopped task has between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 10_000)]
    stop_grace_ms: u64,
    /// Give tasks MASTER_ADDR=127.0.0.1 (every server runs on this machine).
    #[arg(long)]
    peers_on_loopback: bool,
    /// Fake-GPU mode: a file of unhealthy device indices, one per line (stands in for NVML's
    /// health counters).
    #[arg(long)]
    fake_health_file: Option<PathBuf>,
    /// Where the agent serves task logs (gRPC `tessera.v1.Agent`), `host:port`; port 0 picks a
    /// free one. The address is announced to the view, so `tessera logs` can find it (a
    /// wildcard host is announced as the server's name, or 127.0.0.1 with --peers-on-loopback).
    #[arg(long, default_value = "0.0.0.0:0")]
    listen: String,
    /// Where the agent serves its Prometheus metrics (`GET /metrics`: task starts and exits,
    /// adoption, reports, heartbeats), `host:port`; over HTTPS with the agent's certificate
    /// when it runs with TLS. Not served when absent.
    #[arg(long)]
    metrics_listen: Option<String>,
    #[command(flatten)]
    tls: crate::tls::ComponentTlsArgs,
}

pub fn run(cmd: AgentCommand) -> Result<ExitCode> {
    match cmd {
        AgentCommand::Discover(args) => {
            let d = discover(&DiscoverOptions { topology: args.topology }).context("discovery failed")?;
            if args.preset {
                let Some(t) = &d.topology else {
                    bail!(
                        "no server model to write: {}",
                        d.render().lines().find(|l| l.contains("NVML")).unwrap_or("no GPUs")
                    );
                };
                print!("{}", tessera_agent::discover::preset_toml(t));
            } else if args.json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                print!("{}", d.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        AgentCommand::Run(args) => {
            let (security, cert_name) = args.tls.security("the node agent")?;
            // With TLS the certificate names the server (the view accepts no other name from it).
            let name = match (args.name, cert_name) {
                (Some(n), _) | (None, Some(n)) => n,
                (None, None) => hostname()?,
            };
            let exe = std::env::current_exe().context("cannot find this program's path for the task shim")?;
            let cfg = AgentConfig {
                view: args.view,
                name,
                data_dir: args.data_dir,
                topology: args.topology,
                shim: vec![exe.display().to_string(), "agent".into(), "shim".into()],
                stop_grace: Duration::from_millis(args.stop_grace_ms),
                peers_on_loopback: args.peers_on_loopback,
                fake_health_file: args.fake_health_file,
                listen: Some(args.listen),
                security,
                metrics: Default::default(),
            };
            let rt = crate::view::runtime()?;
            rt.block_on(async move {
                if let Some(addr) = &args.metrics_listen {
                    crate::view::serve_metrics(addr, &cfg.security, cfg.metrics.clone()).await?;
                }
                run_agent(cfg, crate::view::terminated()).await.map_err(anyhow::Error::from)
            })?;
            Ok(ExitCode::SUCCESS)
        }
        AgentCommand::Shim => {
            let Some(dir) = std::env::var_os("TESSERA_SHIM_DIR") else {
                bail!("`tessera agent shim` is started by the agent, with TESSERA_SHIM_DIR set");
            };
            let code = tessera_agent::task::shim_main(std::path::Path::new(&dir));
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
    }
}

pub(crate) fn hostname() -> Result<String> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").context("cannot read the host name; pass --name")?;
    Ok(h.trim().to_string())
}
