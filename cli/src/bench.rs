//! `tessera bench …`

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tessera_scheduler::Policy;
use tessera_scheduler::bench::{PlacementBench, run as run_placement};
use tessera_scheduler::philly_sampler::PhillySampler;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Placement search + atomic approval throughput on one core, with stale schedulers.
    Placement(PlacementArgs),
    /// Gang placements committed per second through a replicated view (separate processes).
    Commit(crate::bench_commit::CommitArgs),
    /// The task path: placement committed → task started by a node agent → exit reported.
    Agent(crate::bench_agent::AgentArgs),
}

#[derive(Args)]
pub struct PlacementArgs {
    /// Servers in the simulated cluster.
    #[arg(long, default_value_t = 16_000)]
    servers: u32,
    /// GPUs per server (even, 2..=64; 8 uses the seed-8gpu preset).
    #[arg(long, default_value_t = 8)]
    gpus_per_server: u32,
    /// Jobs to submit.
    #[arg(long, default_value_t = 100_000)]
    jobs: u64,
    /// Logical schedulers proposing in turn.
    #[arg(long, default_value_t = 64)]
    schedulers: u32,
    /// Versions the schedulers' shared view may lag behind the approver (default: --schedulers).
    #[arg(long)]
    lag: Option<u64>,
    /// Offered load (arrival rate x mean GPU-seconds / GPU capacity).
    #[arg(long, default_value_t = 0.9)]
    load: f64,
    /// Placement policy: adaptive, pack or spread.
    #[arg(long, default_value = "adaptive", value_parser = Policy::parse)]
    policy: Policy,
    /// Philly duration/GPU trace (philly-duration-gpus.csv); default: ../shared/traces/ if
    /// present, else the built-in histogram of the same trace.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

fn default_trace() -> Option<PathBuf> {
    let candidates = [
        PathBuf::from("../shared/traces/philly-duration-gpus.csv"),
        PathBuf::from("shared/traces/philly-duration-gpus.csv"),
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/traces/philly-duration-gpus.csv")),
    ];
    candidates.into_iter().find(|p| p.is_file())
}

pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    match cmd {
        BenchCommand::Commit(args) => crate::bench_commit::run(args),
        BenchCommand::Agent(args) => crate::bench_agent::run(args),
        BenchCommand::Placement(args) => {
            let sampler = match args.trace.or_else(default_trace) {
                Some(p) => PhillySampler::from_csv(&p)?,
                None => PhillySampler::builtin(),
            };
            let cfg = PlacementBench {
                servers: args.servers,
                gpus_per_server: args.gpus_per_server,
                jobs: args.jobs,
                schedulers: args.schedulers,
                lag: args.lag.unwrap_or(args.schedulers as u64),
                load: args.load,
                max_retries: 8,
                policy: args.policy,
                seed: args.seed,
            };
            let r = run_placement(&cfg, &sampler).context("placement benchmark")?;
            if args.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{} servers, {} GPUs, {} jobs from {}\n\
                     placed {} ({} did not fit on arrival, {} gave up after conflicts), {} conflicts\n\
                     {:.3} s wall: {:.0} placements/s; search p50 {:.2} us p99 {:.2} us; approve p50 {:.2} us p99 {:.2} us\n\
                     {} bytes/server hot state; final utilization {:.1}%; {:.1}% at preferred locality\n\
                     independent check: {} double allocations, {} invariant violations",
                    r.servers,
                    r.gpus,
                    r.jobs,
                    r.trace,
                    r.placed,
                    r.no_fit,
                    r.retries_exhausted,
                    r.conflicts,
                    r.wall_s,
                    r.placements_per_s,
                    r.search_p50_us,
                    r.search_p99_us,
                    r.approve_p50_us,
                    r.approve_p99_us,
                    r.bytes_per_server,
                    r.final_utilization * 100.0,
                    r.at_preferred_share * 100.0,
                    r.double_allocations,
                    r.invariant_violations
                );
            }
            Ok(if r.double_allocations == 0 && r.invariant_violations == 0 && r.invalid_proposals == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
