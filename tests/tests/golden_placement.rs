//! Golden-file tests: the placement decisions for a fixed job sequence on every topology
//! preset, through the real search and approver, compared with `tests/golden/<preset>.txt`.
//!
//! A change in placement behaviour shows up as a readable diff of these files. After an
//! intended change, regenerate them with `UPDATE_GOLDEN=1 cargo test -p tessera-tests --test
//! golden_placement` and review the diff before committing.

use std::fmt::Write as _;
use std::path::PathBuf;
use tessera_scheduler::{LocalView, Overlay, find_placement};
use tessera_view::fit::FitMode;
use tessera_view::mask::format_indices;
use tessera_view::{
    ClusterSpec, ClusterView, CpuDemand, Decision, JobSpec, LocalityLevel, Predictor, Proposal, ProposalId, Topology,
};

/// The job sequence: (name, members, GPUs per member, prefer, tolerate, CPU, mode).
fn jobs(devices: u32) -> Vec<(JobSpec, FitMode)> {
    use LocalityLevel::*;
    let mk = |name: &str, m: u32, g: u32, prefer, tolerate, cpu| {
        let mut s = JobSpec::simple(name, m, g.min(devices));
        s.prefer = prefer;
        s.tolerate = tolerate;
        s.cpu = cpu;
        s
    };
    let p = CpuDemand::Proportional;
    vec![
        (mk("one-gpu-pack", 1, 1, PcieSwitch, Server, p), FitMode::Pack),
        (mk("two-gpu-pcie", 1, 2, PcieSwitch, PcieSwitch, p), FitMode::Pack),
        (mk("four-gpu-socket", 1, 4, Socket, Server, p), FitMode::Pack),
        (mk("one-gpu-spread", 1, 1, PcieSwitch, Server, p), FitMode::Spread),
        (mk("whole-server", 1, devices, Server, Server, p), FitMode::Pack),
        (mk("gang-2x2-server", 2, 2, Socket, Server, p), FitMode::Pack),
        (mk("gang-2xN-rack", 2, devices, Rack, Rack, p), FitMode::Pack),
        (mk("three-gpu-fixed-cpu", 1, 3, Socket, Server, CpuDemand::Fixed { cores_per_gpu: 6 }), FitMode::Pack),
        (
            mk(
                "one-gpu-predicted-cpu",
                1,
                1,
                PcieSwitch,
                Server,
                CpuDemand::Predicted {
                    predictor: Predictor { p0: 1.0, p1: 0.05, p2: 2.5, theta: 11.0 },
                    min_cores_per_gpu: 2,
                },
            ),
            FitMode::Pack,
        ),
        (mk("gang-3xN-any", 3, devices, Rack, Any, p), FitMode::Pack),
        (mk("too-big-for-pcie", 1, 4, PcieSwitch, PcieSwitch, p), FitMode::Pack),
    ]
}

fn render(preset: &str) -> String {
    let topo = Topology::preset(preset).expect("preset");
    let devices = topo.devices;
    // 2 racks of 2 servers, one InfiniBand domain.
    let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo, 4, 2, 2));
    let mut out = String::new();
    writeln!(out, "# preset {preset}: 2 racks x 2 servers; regenerate with UPDATE_GOLDEN=1").ok();
    for (i, (spec, mode)) in jobs(devices).into_iter().enumerate() {
        let name = spec.name.clone();
        let job = match view.submit(spec) {
            Ok(j) => j,
            Err(e) => {
                writeln!(out, "{name}: refused: {e}").ok();
                continue;
            }
        };
        let local = LocalView::of_view(&view);
        let spec = view.job(job).expect("job").spec.clone();
        match find_placement(&local, &Overlay::default(), &spec, spec.tolerate, mode, i as u64) {
            Err(e) => writeln!(out, "{name} ({mode:?}): no placement: {e}").ok(),
            Ok(f) => {
                let p = Proposal { id: ProposalId(i as u64 + 1), job, members: f.members, based_on: view.version() };
                match view.propose(&p) {
                    Decision::Accepted { level, .. } => {
                        writeln!(out, "{name} ({mode:?}): placed at {level}").ok();
                        for m in &p.members {
                            writeln!(
                                out,
                                "    {} gpus[{}] cores[{}] {} MiB",
                                view.server_name(m.server).expect("name"),
                                format_indices(m.gpus),
                                m.cores.format(),
                                m.memory_mib
                            )
                            .ok();
                        }
                        Some(())
                    }
                    other => writeln!(out, "{name}: approver refused: {other:?}").ok(),
                }
            }
        };
    }
    writeln!(out, "final:").ok();
    for (i, r) in view.servers().iter().enumerate() {
        writeln!(
            out,
            "    {} free gpus[{}] cores {} memory {} MiB",
            view.server_name(tessera_view::ServerId(i as u32)).expect("name"),
            format_indices(r.free_gpus),
            r.free_cores.count(),
            r.free_memory_mib
        )
        .ok();
    }
    let check = tessera_view::invariants::check(&view);
    assert!(check.is_clean(), "{preset}: {:?}", check.violations);
    out
}

#[test]
fn placements_match_golden_files() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut mismatched = Vec::new();
    for (preset, _) in tessera_view::topology::PRESETS {
        let got = render(preset);
        let path = dir.join(format!("{preset}.txt"));
        if update {
            std::fs::write(&path, &got).expect("write golden");
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if want != got {
            let first = want.lines().zip(got.lines()).position(|(a, b)| a != b).unwrap_or(0);
            mismatched.push(format!(
                "{}: first difference at line {}\n  want: {}\n  got:  {}",
                path.display(),
                first + 1,
                want.lines().nth(first).unwrap_or("<missing>"),
                got.lines().nth(first).unwrap_or("<missing>")
            ));
        }
    }
    assert!(
        mismatched.is_empty(),
        "placement decisions changed (UPDATE_GOLDEN=1 to accept):\n{}",
        mismatched.join("\n")
    );
}
