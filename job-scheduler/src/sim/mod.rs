//! The trace-driven simulator behind `tessera sim`.
//!
//! A deterministic, seeded discrete-event simulation that replays a job trace on a simulated
//! cluster through the live system's own code: jobs are admitted by
//! [`tessera_view::ClusterView::submit`], placed by the same [`crate::Scheduler`]s a live host
//! runs (built-in or a user's own: a [`Contender`]) over a [`crate::LocalView`] kept current
//! from the view's change log, approved by
//! [`tessera_view::ClusterView::propose`], moved by [`tessera_view::migration_planner::plan`] and
//! `Command::Migrate`, started by task reports and ended by releases. No network, no Raft, no
//! wall clock: simulated time advances from event to event.
//!
//! | module | what it holds |
//! |---|---|
//! | [`trace_loader`] | loaders: Philly per-VC jobs, Alibaba v2023 pods and node list |
//! | [`model`] | the job-speed model (locality, interference, CPU) and the `ideal` model |
//! | [`compared_policies`] | [`Contender`]s: a scheduler, the spec style its users write, migration on or off; the [`SimPolicy`] presets |
//! | [`engine`] | the event loop and the metrics of one run |
//! | [`experiment`] | one experiment as a value (trace, cluster, model, load) and its policies run side by side |
//! | [`synthetic`] | the synthetic trace generator: Philly's sizes and durations, multi-server jobs, bursty arrivals, seeded |
//! | [`matrix`] | the robustness matrix (`tessera sim --matrix`): cells of trace × load × cluster × model, targets per cell |

pub mod compared_policies;
pub mod engine;
pub mod experiment;
pub mod matrix;
pub mod synthetic;
pub mod trace_loader;

pub use compared_policies::{Contender, SimPolicy, SpecStyle};
pub use engine::{JobRecord, PolicyReport, SimConfig, simulate};
pub use experiment::{Experiment, ExperimentSpec, ModelChoice, TraceSource};
/// The speed model lives in the core, where admission reads a model's locality losses.
pub use tessera_view::speed_model as model;
pub use tessera_view::speed_model::SpeedModel;
pub use trace_loader::{SimJob, Trace};

use tessera_view::{ClusterSpec, Topology};

/// Runs `contenders` over `trace` on `cluster` under `model` (arrivals as in the trace, seed 1),
/// at most `threads` at once, and returns each one's report by name, in order: the library
/// call behind `tessera sim`, for simulating a scheduler of one's own (see
/// `examples/simulate_my_scheduler.rs`). A contender that fails (a job no policy can admit)
/// fails the call.
pub fn run(
    trace: &Trace,
    cluster: &ClusterSpec,
    model: &SpeedModel,
    contenders: &[Contender],
    threads: usize,
) -> Result<Vec<(String, PolicyReport)>, crate::SchedulerError> {
    let e = Experiment::new(trace.clone(), cluster.clone(), model.clone());
    e.run(contenders, threads, &|_, _, _| {})?
        .into_iter()
        .map(|(name, r)| r.map(|(report, _)| (name, report)))
        .collect()
}

/// Size buckets of the queueing report: `1`, `2-4`, `8` (5 to 8 GPUs) and `>8`.
pub const SIZE_BUCKETS: [&str; 4] = ["1", "2-4", "8", ">8"];

/// The bucket of a job of `gpus` GPUs.
pub fn size_bucket(gpus: u32) -> usize {
    match gpus {
        0 | 1 => 0,
        2..=4 => 1,
        5..=8 => 2,
        _ => 3,
    }
}

/// A cluster of `servers` servers of `topology`, 16 to a rack and 4 racks to an InfiniBand
/// domain (the layout the placement benchmark uses).
pub fn uniform_cluster(topology: Topology, servers: u32) -> ClusterSpec {
    ClusterSpec::uniform(topology, servers.max(1), 16, 4)
}

/// Servers of `gpus_per_server` GPUs at which `trace` (arrivals divided by `load_scale`) offers
/// `load` × the cluster's GPU capacity on average over its arrival span, and at least enough for
/// its largest job. With `load` near 1, bursts exceed capacity and queues form.
pub fn servers_for_load(trace: &Trace, load_scale: f64, gpus_per_server: u32, load: f64) -> u32 {
    let span_s = trace.jobs.iter().map(|j| j.arrival_s).fold(0.0, f64::max) / load_scale.max(1e-9);
    let gpu_s: f64 = trace.jobs.iter().map(|j| f64::from(j.gpus) * j.duration_s).sum();
    let largest = trace.jobs.iter().map(|j| j.gpus).max().unwrap_or(1);
    let demand_gpus = if span_s > 0.0 { gpu_s / span_s } else { f64::from(largest) };
    let servers = (demand_gpus / load.max(1e-9) / f64::from(gpus_per_server.max(1))).ceil() as u32;
    servers.max(largest.div_ceil(gpus_per_server.max(1))).max(1)
}
