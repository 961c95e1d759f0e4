//! `tessera`: one binary, one subcommand per role.
//!
//! The binary is thin: it parses flags, reads files, calls the libraries and prints. Logic lives
//! in `tessera-view` (cluster-view/core) and `tessera-scheduler` (job-scheduler).

mod bench;
mod check;
mod place;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "tessera", version, about = "Decentralized two-level scheduler for deep-learning GPU clusters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Validate topology, cluster spec or job files and summarize them.
    Check(check::CheckArgs),
    /// Place job files on a fresh cluster built from a spec, through the real search and
    /// approver, and show the decisions and the resulting view.
    Place(place::PlaceArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(b) => bench::run(b),
        Command::Check(c) => check::run(c),
        Command::Place(p) => place::run(p),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
