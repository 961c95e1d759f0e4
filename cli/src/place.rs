//! `tessera place`: place job files on a fresh cluster through the real search and approver.

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use tessera_scheduler::{LocalView, Overlay, Policy, find_placement};
use tessera_view::mask::format_indices;
use tessera_view::{ClusterSpec, ClusterView, Decision, JobSpec, Proposal, ProposalId};

#[derive(Args)]
pub struct PlaceArgs {
    /// Cluster spec file.
    #[arg(long)]
    cluster: PathBuf,
    /// Job files, placed in order.
    #[arg(required = true)]
    jobs: Vec<PathBuf>,
    /// Placement policy: adaptive, pack or spread.
    #[arg(long, default_value = "adaptive", value_parser = Policy::parse)]
    policy: Policy,
    /// Print the final view as JSON (servers and placements) instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(args: PlaceArgs) -> Result<ExitCode> {
    let spec = ClusterSpec::from_file(&args.cluster)?;
    let mut view = ClusterView::from_spec(&spec);
    let mut unplaced = 0;
    let mut lines = Vec::new();
    for (i, f) in args.jobs.iter().enumerate() {
        let job_spec = JobSpec::from_file(f)?;
        let name = job_spec.name.clone();
        let job = match view.submit(job_spec) {
            Ok(j) => j,
            Err(e) => {
                unplaced += 1;
                lines.push(format!("{:<24} refused: {e}", name));
                continue;
            }
        };
        let local = LocalView::of_view(&view);
        let js = &view.job(job).context("job vanished")?.spec;
        let mode = args.policy.mode(&local, js);
        match find_placement(&local, &Overlay::default(), js, js.allowed_level(0), mode, i as u64) {
            Ok(found) => {
                let p =
                    Proposal { id: ProposalId(i as u64 + 1), job, members: found.members, based_on: view.version() };
                match view.propose(&p) {
                    Decision::Accepted { level, .. } => {
                        let members: Vec<String> = p
                            .members
                            .iter()
                            .map(|m| {
                                format!(
                                    "{}:gpus[{}] cores[{}]",
                                    view.server_name(m.server).unwrap_or("?"),
                                    format_indices(m.gpus),
                                    m.cores.format()
                                )
                            })
                            .collect();
                        lines.push(format!("{:<24} {job} placed at {level} ({mode:?}): {}", name, members.join("  ")));
                    }
                    other => {
                        unplaced += 1;
                        lines.push(format!("{:<24} {job} rejected: {other:?}", name));
                    }
                }
            }
            Err(e) => {
                unplaced += 1;
                lines.push(format!("{:<24} {job} not placed: {e}", name));
            }
        }
    }
    let check = tessera_view::invariants::check(&view);
    if args.json {
        let servers: Vec<serde_json::Value> = view
            .servers()
            .iter()
            .enumerate()
            .map(|(i, r)| {
                serde_json::json!({
                    "name": view.server_names_at(i),
                    "free_gpus": format_indices(r.free_gpus),
                    "free_cores": r.free_cores.format(),
                    "free_memory_mib": r.free_memory_mib,
                    "health": r.health.as_str(),
                })
            })
            .collect();
        let jobs: Vec<_> = view.jobs().into_iter().cloned().collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "version": view.version().0, "servers": servers, "jobs": jobs,
                "invariant_violations": check.violations,
            }))?
        );
    } else {
        for l in &lines {
            println!("{l}");
        }
        println!();
        println!("{:<16} {:<22} {:>10}  {:<10} {:>6}", "SERVER", "CONFIG SET", "GPUS", "FREE CORES", "HEALTH");
        for (i, r) in view.servers().iter().enumerate() {
            let topo = view.topology_of(r.config_set);
            let bitmap: String = (0..topo.devices).map(|d| if r.free_gpus >> d & 1 == 1 { '.' } else { '#' }).collect();
            println!(
                "{:<16} {:<22} {:>10}  {:<10} {:>6}",
                view.server_names_at(i),
                view.config_sets()[r.config_set.index()].name,
                bitmap,
                r.free_cores.count(),
                r.health.as_str()
            );
        }
        println!(
            "\n(# = allocated GPU, . = free)  version {}  invariants: {}",
            view.version(),
            if check.is_clean() { "ok" } else { "VIOLATED" }
        );
    }
    Ok(if unplaced == 0 && check.is_clean() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

trait NameAt {
    fn server_names_at(&self, i: usize) -> &str;
}

impl NameAt for ClusterView {
    fn server_names_at(&self, i: usize) -> &str {
        self.server_name(tessera_view::ServerId(i as u32)).unwrap_or("?")
    }
}
