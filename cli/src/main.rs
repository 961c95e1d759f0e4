//! `tessera`: one binary, one subcommand per role.
//!
//! The binary is thin: it parses flags, reads files, calls the libraries and prints. Logic lives
//! in `tessera-view` (cluster-view/core), `tessera-view-server` (cluster-view/server),
//! `tessera-agent` (node-agent) and `tessera-scheduler` (job-scheduler).

mod agent;
mod bench;
mod bench_agent;
mod bench_commit;
mod chaos;
mod check;
mod dev;
mod jobs;
mod layout;
mod place;
mod policy;
mod scheduler;
mod servers;
mod sim;
mod telemetry;
mod tls;
mod usage;
mod view;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "tessera", version, about = "Decentralized two-level scheduler for deep-learning GPU clusters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Export jobs' traces (submission, placement, approval, task starts) as OpenTelemetry
    /// spans to this OTLP/gRPC endpoint, e.g. http://127.0.0.1:4317. Without it no span leaves
    /// the process, but trace ids still travel with every call and job.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// The node agent: discover GPUs and topology, register, run tasks.
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The chaos suite: faults injected into a compose cluster's containers under load, and
    /// the check of what the cluster acknowledged.
    #[command(subcommand)]
    Chaos(chaos::ChaosCommand),
    /// Validate topology, cluster spec or job files and summarize them.
    Check(check::CheckArgs),
    /// Place job files on a fresh cluster built from a spec, through the real search and
    /// approver, and show the decisions and the resulting view.
    Place(place::PlaceArgs),
    /// The replicated cluster view: run a replica, show status, change membership.
    #[command(subcommand)]
    View(view::ViewCommand),
    /// A whole cluster in one process (3 view replicas, fake-GPU agents, a scheduler host,
    /// the HTTP API), for a first try.
    Dev(dev::DevArgs),
    /// Scheduler hosts: run the per-job schedulers of pending jobs.
    #[command(subcommand)]
    Scheduler(scheduler::SchedulerCommand),
    /// Submit job files; --wait follows them to the end.
    Submit(jobs::SubmitArgs),
    /// The cluster in brief, or one job in detail.
    Status(jobs::StatusArgs),
    /// Every job: id, state, GPUs, placement.
    Jobs(jobs::JobsArgs),
    /// Every server: health and GPU bitmap; `show`, `cordon`, `drain`, `uncordon`, `add`,
    /// `remove` one.
    Servers(servers::ServersArgs),
    /// The configuration sets (servers of one topology in one rack); `add`, `remove` one.
    ConfigSets(layout::ConfigSetsArgs),
    /// Tenants' GPU quotas, priority classes and revoked credentials; `quota`, `class`,
    /// `revoke`, `unrevoke` change one (admins).
    Policy(policy::PolicyArgs),
    /// Cancel a job.
    Cancel(jobs::CancelArgs),
    /// GPU-hours and CPU-core-hours per tenant, user or job over a time range.
    Usage(usage::UsageArgs),
    /// The tail of a job member's stdout or stderr.
    Logs(jobs::LogsArgs),
    /// Replay a job trace (Philly, Alibaba) on a simulated cluster under several placement
    /// policies through the real search, approver and migration code; table, JSON, CSVs, SVG plots.
    Sim(sim::SimArgs),
    /// The cluster CA and its certificates (mutual TLS between every component).
    #[command(subcommand)]
    Tls(tls::TlsCommand),
    /// Bearer tokens for callers without a certificate (CLI, SDK, HTTP API).
    #[command(subcommand)]
    Token(tls::TokenCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `tessera dev` runs every agent in this process: their start-up warnings about fake-GPU
    // mode (repeated once per server) would bury the output a newcomer reads. RUST_LOG wins.
    let default = if matches!(cli.command, Command::Dev(_)) { "warn,tessera_agent=error" } else { "warn" };
    // The service a trace back end shows each span under.
    let service = match cli.command {
        Command::Agent(_) => "tessera-agent",
        Command::View(_) => "tessera-view",
        Command::Scheduler(_) => "tessera-scheduler",
        Command::Dev(_) => "tessera-dev",
        _ => "tessera-cli",
    };
    let otlp = cli.otlp_endpoint.as_deref().filter(|e| !e.is_empty());
    let telemetry = match telemetry::Telemetry::init(service, default, otlp) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Agent(args) => agent::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Chaos(args) => chaos::run(args),
        Command::Check(args) => check::run(args),
        Command::Place(args) => place::run(args),
        Command::View(args) => view::run(args),
        Command::Dev(args) => dev::run(args),
        Command::Scheduler(args) => scheduler::run(args),
        Command::Submit(args) => jobs::submit(args),
        Command::Status(args) => jobs::status(args),
        Command::Jobs(args) => jobs::jobs(args),
        Command::Servers(args) => servers::run(args),
        Command::ConfigSets(args) => layout::config_sets(args),
        Command::Policy(args) => policy::run(args),
        Command::Cancel(args) => jobs::cancel(args),
        Command::Usage(args) => usage::run(args),
        Command::Logs(args) => jobs::logs(args),
        Command::Sim(args) => sim::run(args),
        Command::Tls(args) => tls::run(args),
        Command::Token(args) => tls::token(args),
    };
    telemetry.shutdown();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
