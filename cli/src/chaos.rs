//! `tessera chaos …`: the chaos suite against a compose cluster (`run`), and the program its
//! jobs' tasks run in containers that have no shell (`task`). The load, the faults and the
//! checks live in `tessera_testkit::chaos`; `deploy/chaos/run.sh` starts a cluster for it.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tessera_testkit::chaos::inject::Compose;
use tessera_testkit::chaos::schedule::{FaultKind, Schedule};
use tessera_testkit::chaos::{ChaosConfig, run as run_chaos};

#[derive(Subcommand)]
pub enum ChaosCommand {
    /// Inject a seeded schedule of faults into a running compose cluster under load, check
    /// that nothing acknowledged was lost, nothing held twice, every replica converged and
    /// every job ended; print one JSON line; exit 1 on any violation.
    Run(Box<RunArgs>),
    /// Sleep, then exit with the given code: the task of the suite's jobs.
    Task(TaskArgs),
}

#[derive(Args)]
pub struct RunArgs {
    /// The compose project (`docker-compose -p`).
    #[arg(long)]
    project: String,
    /// The replicas' client addresses as this host reaches them, replica 1 first.
    #[arg(long)]
    view: String,
    /// Seed of the fault schedule (the same seed, the same faults).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Faults to inject, one after another (partners not counted).
    #[arg(long, default_value_t = 10)]
    faults: usize,
    /// Every Nth fault gets a partner: a second fault on another target, injected while the
    /// first holds (0: faults never overlap).
    #[arg(long, default_value_t = 3)]
    overlap_every: usize,
    /// Fault kinds to draw from, comma-separated (default: every kind; full-disk only with
    /// --data-root, clock-jump only with --clock-root).
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// Where each replica's data file system is mounted on this host (`DIR/view-N`), for the
    /// full-disk fault.
    #[arg(long)]
    data_root: Option<PathBuf>,
    /// Where each replica's clock offset file is on this host (`DIR/view-N/offset`, read by
    /// libfaketime in the replica's container), for the clock-jump fault.
    #[arg(long)]
    clock_root: Option<PathBuf>,
    /// The node agents' compose services, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "rack-a-s00,rack-a-s01,rack-b-s00,rack-b-s01")]
    agents: Vec<String>,
    /// The scheduler hosts' compose services, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "scheduler-1,scheduler-2")]
    schedulers: Vec<String>,
    /// The servers' lease on the replicas, milliseconds (the replicas' `server_lease_ms`).
    #[arg(long, default_value_t = 6_000)]
    agent_lease_ms: u64,
    /// The program the tasks run inside the agents' containers.
    #[arg(long, default_value = "/usr/local/bin/tessera")]
    task_program: String,
    /// Jobs per second submitted for the scheduler hosts.
    #[arg(long, default_value_t = 1.0)]
    hosted_per_s: f64,
    /// Milliseconds between directly proposed jobs.
    #[arg(long, default_value_t = 250)]
    direct_every_ms: u64,
    /// Seconds to wait, after the faults, for every job to end.
    #[arg(long, default_value_t = 180)]
    drain_timeout_s: u64,
    /// Seconds to wait for the cluster to recover after each fault.
    #[arg(long, default_value_t = 90)]
    recover_timeout_s: u64,
    /// Also print the schedule before running it (to standard error).
    #[arg(long)]
    show_schedule: bool,
    /// How to reach the replicas: `--tls DIR` of an admin certificate, or `--insecure`.
    #[command(flatten)]
    security: crate::tls::SecurityArgs,
}

#[derive(Args)]
pub struct TaskArgs {
    /// Milliseconds to sleep.
    #[arg(long, default_value_t = 1_000)]
    ms: u64,
    /// Exit code.
    #[arg(long, default_value_t = 0)]
    exit_code: u8,
}

pub fn run(cmd: ChaosCommand) -> Result<ExitCode> {
    match cmd {
        ChaosCommand::Task(a) => {
            std::thread::sleep(Duration::from_millis(a.ms));
            Ok(ExitCode::from(a.exit_code))
        }
        ChaosCommand::Run(a) => run_suite(*a),
    }
}

fn run_suite(a: RunArgs) -> Result<ExitCode> {
    let view: Vec<String> = a.view.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    if view.is_empty() {
        bail!("--view names no replica");
    }
    let mut kinds: Vec<FaultKind> = Vec::new();
    for k in &a.kinds {
        kinds.push(FaultKind::parse(k).with_context(|| {
            let all: Vec<&str> = FaultKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown fault kind `{k}` (expected one of {})", all.join(", "))
        })?);
    }
    if kinds.is_empty() {
        kinds = FaultKind::ALL.to_vec();
        if a.data_root.is_none() {
            kinds.retain(|k| *k != FaultKind::FullDisk);
            eprintln!("chaos: no --data-root, so no full-disk faults");
        }
        if a.clock_root.is_none() {
            kinds.retain(|k| *k != FaultKind::ClockJump);
            eprintln!("chaos: no --clock-root, so no clock-jump faults");
        }
    }
    if kinds.contains(&FaultKind::FullDisk) && a.data_root.is_none() {
        bail!("full-disk faults need --data-root (where the replicas' data file systems are mounted)");
    }
    if kinds.contains(&FaultKind::ClockJump) && a.clock_root.is_none() {
        bail!("clock-jump faults need --clock-root (where the replicas' libfaketime offset files are)");
    }
    if a.agents.is_empty() && kinds.contains(&FaultKind::AgentLost) {
        bail!("agent-lost faults need --agents");
    }
    if a.schedulers.is_empty() && kinds.contains(&FaultKind::KillScheduler) {
        bail!("kill-scheduler faults need --schedulers");
    }
    if !(a.hosted_per_s > 0.0 && a.hosted_per_s <= 50.0) {
        bail!("--hosted-per-s must be in (0, 50]");
    }
    if a.direct_every_ms < 20 {
        bail!("--direct-every-ms must be at least 20");
    }
    let agent_lease = Duration::from_millis(a.agent_lease_ms);
    let schedule = Schedule::seeded(a.seed, a.faults, &kinds, agent_lease, a.overlap_every);
    if a.show_schedule {
        eprintln!("{}", serde_json::to_string_pretty(&schedule)?);
    }
    let cfg = ChaosConfig {
        compose: Compose { project: a.project, data_root: a.data_root, clock_root: a.clock_root },
        view,
        security: a.security.security("the chaos suite")?,
        agents: a.agents,
        schedulers: a.schedulers,
        schedule,
        agent_lease,
        task_program: a.task_program,
        hosted_per_s: a.hosted_per_s,
        direct_every: Duration::from_millis(a.direct_every_ms),
        drain_timeout: Duration::from_secs(a.drain_timeout_s),
        recover_timeout: Duration::from_secs(a.recover_timeout_s),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = rt.block_on(run_chaos(&cfg)).context("the chaos run stopped")?;
    println!("{}", serde_json::to_string(&report)?);
    if report.is_clean() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("chaos: VIOLATIONS: {}", report.violations.join("; "));
        Ok(ExitCode::from(1))
    }
}
