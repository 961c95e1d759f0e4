//! Simulating a scheduler of one's own against the built-in ones, before running it on a
//! cluster: `cargo run --release --example simulate_my_scheduler` (docs/SDK.md, "Simulate your
//! scheduler"). The simulator calls the very `schedule` a scheduler host would call.
//!
//! The scheduler here, `quiet-neighbours`, keeps one-server jobs away from servers that run
//! a large job (one of 4 GPUs or more: heavy PCIe and network traffic), and otherwise packs.
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use tessera_scheduler::search::{find_placement, plan_on_server};
use tessera_scheduler::sim::{self, Contender, PolicyReport, SimJob, SimPolicy, SpecStyle, SpeedModel, Trace};
use tessera_scheduler::{Attempt, Scheduler, Verdict};
use tessera_view::fit::{FitMode, member_request};
use tessera_view::{ClusterSpec, LocalityLevel, ServerId, Topology};

/// GPUs from which a running job counts as a noisy neighbour.
const LARGE_GPUS: u32 = 4;

#[derive(Debug)]
struct QuietNeighbours;

impl Scheduler for QuietNeighbours {
    fn name(&self) -> &str {
        "quiet-neighbours"
    }

    fn schedule(&self, a: &Attempt<'_>) -> Verdict {
        let spec = &a.job.spec;
        if spec.members == 1 && a.allowed >= LocalityLevel::Server {
            // The fullest quiet server that has room: packing among the quiet ones.
            let mut best: Option<(u32, Vec<_>)> = None;
            for (i, rec) in a.view.servers().iter().enumerate() {
                let s = ServerId(i as u32);
                let rec = a.overlay.get(s).unwrap_or(rec);
                let noisy = a.ctx.running.on(s).iter().any(|r| r.gpus >= LARGE_GPUS);
                let topo = a.view.topology_of(rec.config_set);
                if noisy || spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type) {
                    continue;
                }
                let req = member_request(spec, topo);
                let free = rec.free_gpus.count_ones();
                if let Some(m) = plan_on_server(topo, rec, s, &req, 1, a.allowed, FitMode::Pack)
                    && best.as_ref().is_none_or(|(f, _)| free < *f)
                {
                    best = Some((free, m));
                }
            }
            if let Some((_, members)) = best {
                return Verdict::Propose(members);
            }
        }
        match find_placement(a.view, a.overlay, spec, a.allowed, FitMode::Pack, a.salt) {
            Ok(f) => Verdict::Propose(f.members),
            Err(e) => Verdict::Wait(e.to_string()),
        }
    }
}

/// `jobs` jobs with Philly's sizes and durations, Poisson arrivals offering `load` of `gpus`.
fn synthetic_trace(jobs: usize, gpus: u32, load: f64, seed: u64) -> Trace {
    let sampler = tessera_scheduler::philly_sampler::PhillySampler::builtin();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mean_gap_s = sampler.mean_gpu_seconds() / (f64::from(gpus) * load);
    let mut t = 0.0;
    let jobs = (0..jobs)
        .map(|i| {
            let (g, duration_s) = sampler.sample(&mut rng);
            t += -mean_gap_s * (1.0 - rng.random::<f64>()).ln();
            SimJob {
                name: format!("job-{i}"),
                arrival_s: t,
                gpus: g.min(gpus),
                duration_s: f64::from(duration_s.max(60)),
                job_type: String::new(),
                cores_per_gpu: None,
                memory_mib_per_gpu: None,
                gpu_type: None,
            }
        })
        .collect();
    Trace { name: format!("synthetic, seed {seed}"), jobs, ..Trace::default() }
}

/// Ours against three built-ins on 8 servers of 8 GPUs.
fn compare(seed: u64) -> Vec<(String, PolicyReport)> {
    let topo = Topology::preset("seed-8gpu").expect("compiled-in preset");
    let cluster = ClusterSpec::uniform(topo, 8, 4, 2);
    let trace = synthetic_trace(300, 64, 0.8, seed);
    let ours = Contender::new("quiet-neighbours", Arc::new(QuietNeighbours), SpecStyle::Preferred);
    let contenders = [ours, SimPolicy::FifoFirstFit.into(), SimPolicy::Hived.into(), SimPolicy::Tessera.into()];
    sim::run(&trace, &cluster, &SpeedModel::builtin(), &contenders, 2).expect("every contender runs")
}

fn main() {
    let reports = compare(1);
    println!("{:<24} {:>12} {:>12} {:>8}", "policy", "avg JCT (s)", "p95 JCT (s)", "util");
    for (name, r) in &reports {
        println!("{name:<24} {:>12.0} {:>12.0} {:>8.2}", r.avg_jct_s, r.p95_jct_s, r.gpu_utilization);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contender_finishes_every_job_cleanly_and_the_run_is_deterministic() {
        let first = compare(7);
        assert_eq!(first[0].0, "quiet-neighbours");
        for (name, r) in &first {
            assert_eq!(r.finished, r.jobs, "{name}: every job finishes");
            assert_eq!(r.invariant_violations, 0, "{name}");
            assert_eq!(r.rejected_proposals, 0, "{name}: proposals made on a current view are accepted");
        }
        let again = compare(7);
        for ((a, ra), (b, rb)) in first.iter().zip(&again) {
            assert_eq!(a, b);
            assert_eq!(serde_json::to_string(ra).expect("json"), serde_json::to_string(rb).expect("json"), "{a}");
        }
    }
}
