//! Replays a trace through the simulator and prints one JSON line per policy (stand-in for
//! `tessera sim` until the CLI subcommand lands; docs/EVALUATION.md uses it).
//!
//! `cargo run --release -p tessera-scheduler --example sim_replay -- TRACE LOAD SCALE [POLICIES] [ideal]`
//! with TRACE `philly` (seed-8gpu servers sized so the trace offers LOAD of their capacity) or
//! `alibaba` (the real node list), SCALE the arrival-rate multiplier, POLICIES comma-separated.
//! Traces are read from `../shared/traces/` (or `$TESSERA_TRACES`).
use tessera_scheduler::sim::{self, SimConfig, SimPolicy, SpeedModel};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map(String::as_str).unwrap_or("philly");
    let load: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let scale: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let pols: Vec<SimPolicy> = args
        .get(4)
        .map(|s| s.split(',').map(|p| SimPolicy::parse(p).expect("p")).collect())
        .unwrap_or(SimPolicy::ALL.to_vec());
    let ideal = args.get(5).is_some_and(|s| s == "ideal");
    let traces =
        std::path::PathBuf::from(std::env::var("TESSERA_TRACES").unwrap_or_else(|_| "../shared/traces".into()));
    let (trace, cluster) = if which == "philly" {
        let t = sim::trace::load_philly(&traces.join("philly-vc-jobs.csv"), None).expect("t");
        let n = sim::servers_for_load(&t, scale, 8, load);
        eprintln!("servers {n} skipped {:?}", t.skipped);
        let topo = tessera_view::Topology::preset("seed-8gpu").expect("p");
        (t, sim::uniform_cluster(topo, n))
    } else {
        let t = sim::trace::load_alibaba_pods(&traces.join("alibaba-v2023-gpu-pods.csv")).expect("t");
        let c = sim::trace::load_alibaba_nodes(&traces.join("alibaba-v2023-gpu-nodes.csv")).expect("c");
        eprintln!("skipped {:?} approx {:?}", t.skipped, t.approximated);
        (t, c.spec)
    };
    let model = if ideal { SpeedModel::ideal() } else { SpeedModel::builtin() };
    for p in pols {
        let mut cfg = SimConfig::new(p);
        cfg.load_scale = scale;
        let t0 = std::time::Instant::now();
        let r = sim::simulate(&cluster, &trace, &model, &cfg, &mut |_, _| {}).expect("sim");
        eprintln!("{:<30} {:.1}s {}", p.name(), t0.elapsed().as_secs_f64(), serde_json::to_string(&r).expect("j"));
    }
}
