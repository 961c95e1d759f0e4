//! `tessera check …`: validate user files and summarize them.

use anyhow::Result;
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use tessera_view::mask::format_indices;
use tessera_view::{ClusterSpec, ClusterView, JobSpec, Topology};

#[derive(Clone, Copy, ValueEnum)]
pub enum Kind {
    /// A server topology preset file.
    Topology,
    /// A cluster spec file.
    Cluster,
    /// A job spec file.
    Job,
}

#[derive(Args)]
pub struct CheckArgs {
    /// What the files are.
    kind: Kind,
    /// Files to check.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// For job files: also check that the job could ever fit this cluster.
    #[arg(long)]
    cluster: Option<PathBuf>,
}

pub fn run(args: CheckArgs) -> Result<ExitCode> {
    let view = match &args.cluster {
        Some(p) => Some(ClusterView::from_spec(&ClusterSpec::from_file(p)?)),
        None => None,
    };
    let mut failed = 0;
    for f in &args.files {
        let r: Result<String, String> = match args.kind {
            Kind::Topology => Topology::from_file(f).map(|t| describe_topology(&t)).map_err(|e| e.to_string()),
            Kind::Cluster => ClusterSpec::from_file(f)
                .map(|s| {
                    let gpus: u64 =
                        s.groups.iter().map(|g| g.servers as u64 * s.topologies[g.topology].devices as u64).sum();
                    format!(
                        "cluster `{}`: {} servers, {} GPUs, {} configuration sets, topologies {}",
                        s.name,
                        s.server_count(),
                        gpus,
                        s.groups.len(),
                        s.topologies.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
                    )
                })
                .map_err(|e| e.to_string()),
            Kind::Job => JobSpec::from_file(f).map_err(|e| e.to_string()).and_then(|j| {
                if let Some(why) = view.as_ref().and_then(|v| v.never_fits(&j)) {
                    return Err(format!("{}: job can never fit the cluster: {why}", f.display()));
                }
                Ok(format!(
                    "job `{}`: {} x {} GPUs, prefer {}, tolerate {}{}",
                    j.name,
                    j.members,
                    j.gpus_per_member,
                    j.prefer,
                    j.tolerate,
                    j.relax_after_s.map(|s| format!(", relax every {s} s")).unwrap_or_default()
                ))
            }),
        };
        match r {
            Ok(summary) => println!("ok   {}: {summary}", f.display()),
            Err(e) => {
                failed += 1;
                eprintln!("FAIL {e}");
            }
        }
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn describe_topology(t: &Topology) -> String {
    let sockets: Vec<String> = t.sockets.iter().map(|m| format!("[{}]", format_indices(*m))).collect();
    let switches: Vec<String> = t.pcie_switches.iter().map(|m| format!("[{}]", format_indices(*m))).collect();
    let nv: Vec<String> = t.nvlink_groups.iter().map(|m| format!("[{}]", format_indices(*m))).collect();
    format!(
        "topology `{}`: {} x {}, sockets {}, PCIe switches {}, NVLink groups {}, {} cores, {} MiB",
        t.name,
        t.devices,
        t.device_type,
        sockets.join(" "),
        switches.join(" "),
        if nv.is_empty() { "none".to_string() } else { nv.join(" ") },
        t.cores(),
        t.memory_mib
    )
}
