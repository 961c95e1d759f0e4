//! The robustness matrix behind `tessera sim --matrix`: every contender on many cells (trace ×
//! offered load × cluster size × speed model), so that a policy is judged on workloads and
//! clusters it was not tuned on, with the targets of docs/EVALUATION.md checked per cell.
//!
//! Cells: the shared Philly trace at offered loads 0.35, 0.6, 0.9 and 1.5, and three synthetic
//! traces with multi-server jobs ([`super::synthetic`]) at 0.9 and 1.5; each on 8 and 32
//! `seed-8gpu` servers and on a cluster sized for the load; each under the built-in and the
//! `ideal` speed model. `--quick` (CI) keeps the 8-server cells of a 2,000-job Philly slice and
//! one 1,000-job synthetic trace. Other synthetic traces can take the place of seeds 1–3
//! ([`cells_with`]; `--trace-seeds`, `--synthetic`), so that a rule can be checked on traces it
//! was never measured on.
//!
//! On a fixed cluster the offered load is set through the arrival-rate multiplier
//! ([`load_scale_for`]); jobs larger than the cluster are left out and counted.

use super::experiment::{DEFAULT_TOPOLOGY, Experiment, PHILLY_FILE};
use super::synthetic::{SyntheticSpec, generate};
use super::trace_loader::load_philly;
use super::{Contender, PolicyReport, SimPolicy, SpeedModel, Trace, servers_for_load, uniform_cluster};
use crate::SchedulerError;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;
use tessera_view::Topology;

/// Avg JCT the default `tessera` may reach, over the best of the baselines (a 2% margin).
pub const JCT_MARGIN: f64 = 1.02;
/// GPU-utilization points (0..1) `tessera` may lose against `fifo-firstfit` while jobs wait.
pub const UTIL_MARGIN: f64 = 0.03;
/// Share of the ≥ 5-GPU jobs' fragmentation-blocked waiting migration must leave (a 3× cut).
pub const MIGRATION_TARGET: f64 = 1.0 / 3.0;
/// Avg JCT `tessera-las` (attained-service order with preemption) may reach on the overloaded
/// 8-server cells under `ideal`, over `fifo-firstfit`'s.
pub const LAS_TARGET: f64 = 0.5;
/// The baselines `tessera` is held against.
pub const BASELINES: [&str; 3] = ["fifo-firstfit", "gandiva", "hived"];

/// Which trace a cell replays.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatrixTrace {
    /// The shared Philly trace (its first `max_jobs` jobs by arrival, when set).
    Philly {
        /// A slice, for the quick matrix.
        max_jobs: Option<usize>,
    },
    /// A synthetic trace: the generator's settings.
    Synthetic(SyntheticSpec),
}

/// The cluster of a cell.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterSize {
    /// This many `seed-8gpu` servers, the load set by the arrival rate.
    Servers(u32),
    /// As many `seed-8gpu` servers as the load asks for at the trace's arrival rate.
    SizedForLoad,
}

/// One cell of the matrix.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    /// The trace.
    pub trace: MatrixTrace,
    /// Offered load: the trace's GPU demand at full speed over the cluster's GPUs.
    pub load: f64,
    /// The cluster.
    pub cluster: ClusterSize,
    /// Whether the `ideal` speed model is used (no locality, interference or CPU effects).
    pub ideal: bool,
}

impl Cell {
    /// A short label: `philly load=0.9 8x8 ideal`.
    pub fn label(&self) -> String {
        let trace = match &self.trace {
            MatrixTrace::Philly { max_jobs: None } => "philly".to_string(),
            MatrixTrace::Philly { max_jobs: Some(n) } => format!("philly[{n}]"),
            MatrixTrace::Synthetic(spec) => synthetic_label(spec),
        };
        let cluster = match self.cluster {
            ClusterSize::Servers(n) => format!("{n}x8"),
            ClusterSize::SizedForLoad => "sized".to_string(),
        };
        format!("{trace} load={} {cluster} {}", self.load, if self.ideal { "ideal" } else { "default" })
    }
}

/// `synthetic-3`, with the settings that differ from the generator's defaults after it
/// (`synthetic-4[multi=0.1,burst=8]`); the number of jobs is a column of its own.
fn synthetic_label(spec: &SyntheticSpec) -> String {
    let d = SyntheticSpec::new(spec.seed);
    let settings: Vec<String> = [
        ("multi", spec.multi_server_share, d.multi_server_share),
        ("burst", spec.burst, d.burst),
        ("burst_s", spec.burst_mean_s, d.burst_mean_s),
        ("calm_s", spec.calm_mean_s, d.calm_mean_s),
    ]
    .into_iter()
    .filter(|(_, v, d)| v != d)
    .map(|(k, v, _)| format!("{k}={v}"))
    .collect();
    if settings.is_empty() {
        format!("synthetic-{}", spec.seed)
    } else {
        format!("synthetic-{}[{}]", spec.seed, settings.join(","))
    }
}

/// A synthetic trace of the matrix: the generator's defaults with `seed`, 3,000 jobs (1,000 in
/// the quick matrix).
pub fn synthetic_spec(seed: u64, quick: bool) -> SyntheticSpec {
    SyntheticSpec { jobs: if quick { 1000 } else { 3000 }, ..SyntheticSpec::new(seed) }
}

/// The matrix's synthetic traces: seeds 1, 2 and 3 (seed 1 in the quick matrix).
pub fn synthetic_traces(quick: bool) -> Vec<SyntheticSpec> {
    let seeds = if quick { 1..=1 } else { 1..=3 };
    seeds.map(|seed| synthetic_spec(seed, quick)).collect()
}

/// The cells of the full matrix, or of the quick one.
pub fn cells(quick: bool) -> Vec<Cell> {
    cells_with(quick, &synthetic_traces(quick))
}

/// The cells of the full matrix, or of the quick one, with `synthetic` for its synthetic traces
/// (`tessera sim --matrix --trace-seeds 4,5,6`: traces no rule was tuned on).
pub fn cells_with(quick: bool, synthetic: &[SyntheticSpec]) -> Vec<Cell> {
    let synthetic: Vec<MatrixTrace> = synthetic.iter().cloned().map(MatrixTrace::Synthetic).collect();
    let (philly, clusters) = if quick {
        (MatrixTrace::Philly { max_jobs: Some(2000) }, vec![ClusterSize::Servers(8)])
    } else {
        (
            MatrixTrace::Philly { max_jobs: None },
            vec![ClusterSize::Servers(8), ClusterSize::Servers(32), ClusterSize::SizedForLoad],
        )
    };
    let philly_loads: &[f64] = if quick { &[0.9, 1.5] } else { &[0.35, 0.6, 0.9, 1.5] };
    let mut out = Vec::new();
    for ideal in [false, true] {
        for &cluster in &clusters {
            for &load in philly_loads {
                out.push(Cell { trace: philly.clone(), load, cluster, ideal });
            }
            for t in &synthetic {
                for load in [0.9, 1.5] {
                    out.push(Cell { trace: t.clone(), load, cluster, ideal });
                }
            }
        }
    }
    out
}

/// The arrival-rate multiplier at which `trace` offers `load` of `gpus` GPUs: the inverse of
/// [`servers_for_load`] for a cluster of fixed size.
pub fn load_scale_for(trace: &Trace, gpus: u32, load: f64) -> f64 {
    let span_s = trace.jobs.iter().map(|j| j.arrival_s).fold(0.0, f64::max);
    let gpu_s: f64 = trace.jobs.iter().map(|j| f64::from(j.gpus) * j.duration_s).sum();
    if span_s <= 0.0 || gpu_s <= 0.0 {
        return 1.0;
    }
    load * f64::from(gpus) * span_s / gpu_s
}

/// One contender's figures in a cell.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    /// Avg JCT over `fifo-firstfit`'s in the same cell (`None` without fifo).
    pub jct_ratio: Option<f64>,
    /// Mean share of GPUs busy while jobs waited (1 − `fragmentation`).
    pub util_waiting: f64,
    /// Mean seconds a job of 5 GPUs or more waited blocked by fragmentation
    /// ([`PolicyReport::frag_blocked_s_by_size`]).
    pub frag_blocked_large_s: f64,
    /// The full report.
    pub report: PolicyReport,
}

/// A cell's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct CellResult {
    /// The cell.
    pub cell: Cell,
    /// Its label.
    pub label: String,
    /// Jobs replayed.
    pub jobs: usize,
    /// Jobs left out for needing more GPUs than the cluster has.
    pub too_large: usize,
    /// GPUs of the cluster.
    pub gpus: u64,
    /// Arrival-rate multiplier used.
    pub load_scale: f64,
    /// Seed of the searches' probe order ([`Experiment::seed`]).
    pub seed: u64,
    /// Per contender, by name.
    pub entries: BTreeMap<String, Entry>,
    /// `tessera`'s [`Entry::frag_blocked_large_s`] over `tessera-no-migration`'s: what migration
    /// removes of the waiting it can fix (target ≤ [`MIGRATION_TARGET`]); `None` when either is
    /// missing or nothing waited blocked by fragmentation without migration.
    pub migration_ratio: Option<f64>,
    /// Targets missed in this cell, in words (empty: met, or not checkable without the
    /// contenders involved).
    pub misses: Vec<String>,
    /// Wall time of the cell, seconds.
    pub wall_s: f64,
}

/// Runs `contenders` on one cell, their searches' probe order seeded with `seed` (the only
/// randomness: another seed shows how much a cell's figures owe to it).
pub fn run_cell(
    cell: &Cell,
    traces_dir: &Path,
    contenders: &[Contender],
    threads: usize,
    seed: u64,
) -> Result<CellResult, SchedulerError> {
    let t0 = Instant::now();
    let mut trace = match &cell.trace {
        MatrixTrace::Philly { max_jobs } => {
            let mut t = load_philly(&traces_dir.join(PHILLY_FILE), None)?;
            if let Some(n) = max_jobs {
                t.jobs.truncate(*n);
            }
            t
        }
        MatrixTrace::Synthetic(spec) => generate(spec),
    };
    let topo = Topology::preset(DEFAULT_TOPOLOGY).ok_or(SchedulerError::MissingPreset(DEFAULT_TOPOLOGY))?;
    let (servers, load_scale) = match cell.cluster {
        ClusterSize::Servers(n) => (n, None),
        ClusterSize::SizedForLoad => (servers_for_load(&trace, 1.0, topo.devices, cell.load), Some(1.0)),
    };
    let gpus = servers * topo.devices;
    let before = trace.jobs.len();
    trace.jobs.retain(|j| j.gpus <= gpus);
    let too_large = before - trace.jobs.len();
    let load_scale = load_scale.unwrap_or_else(|| load_scale_for(&trace, gpus, cell.load));
    let model = if cell.ideal { SpeedModel::ideal() } else { SpeedModel::builtin() };
    let mut exp = Experiment::new(trace, uniform_cluster(topo, servers), model);
    exp.load_scale = load_scale;
    exp.seed = seed;
    let runs = exp.run(contenders, threads, &|_, _, _| {})?;
    let mut reports = Vec::with_capacity(runs.len());
    for (name, r) in runs {
        reports.push((name, r?.0));
    }
    let fifo = reports.iter().find(|(n, _)| n == "fifo-firstfit").map(|(_, r)| r.avg_jct_s);
    let entries: BTreeMap<String, Entry> = reports
        .into_iter()
        .map(|(n, r)| {
            let e = Entry {
                jct_ratio: fifo.filter(|f| *f > 0.0).map(|f| r.avg_jct_s / f),
                util_waiting: 1.0 - r.fragmentation,
                frag_blocked_large_s: frag_blocked_large(&r),
                report: r,
            };
            (n, e)
        })
        .collect();
    let misses = misses(cell, &entries);
    let migration_ratio = migration_ratio(&entries);
    Ok(CellResult {
        label: cell.label(),
        cell: cell.clone(),
        jobs: exp.trace.jobs.len(),
        too_large,
        gpus: u64::from(gpus),
        load_scale,
        seed,
        entries,
        migration_ratio,
        misses,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// `tessera`'s [`Entry::frag_blocked_large_s`] over `tessera-no-migration`'s
/// ([`CellResult::migration_ratio`]).
fn migration_ratio(entries: &BTreeMap<String, Entry>) -> Option<f64> {
    match (entries.get(SimPolicy::Tessera.name()), entries.get(SimPolicy::TesseraNoMigration.name())) {
        (Some(t), Some(n)) if n.frag_blocked_large_s > 0.0 => Some(t.frag_blocked_large_s / n.frag_blocked_large_s),
        _ => None,
    }
}

/// The targets of one cell, checked for the default `tessera`: avg JCT at most [`JCT_MARGIN`] ×
/// the best baseline's, utilization while jobs wait at least `fifo-firstfit`'s −
/// [`UTIL_MARGIN`], and, where jobs of 5 GPUs or more waited blocked by fragmentation without
/// migration, at most [`MIGRATION_TARGET`] of that waiting left with it (issue 13 §4); and on
/// the overloaded (load > 1) 8-server cells under `ideal`, `tessera-las`'s avg JCT at most
/// [`LAS_TARGET`] × `fifo-firstfit`'s.
pub fn misses(cell: &Cell, entries: &BTreeMap<String, Entry>) -> Vec<String> {
    let mut out = Vec::new();
    let overloaded_small = cell.ideal && cell.load > 1.0 && cell.cluster == ClusterSize::Servers(8);
    if overloaded_small
        && let (Some(las), Some(f)) = (entries.get(SimPolicy::TesseraLas.name()), entries.get("fifo-firstfit"))
        && las.report.avg_jct_s > LAS_TARGET * f.report.avg_jct_s
    {
        out.push(format!("tessera-las avg JCT {:.3}× fifo-firstfit's", las.report.avg_jct_s / f.report.avg_jct_s));
    }
    let Some(t) = entries.get(SimPolicy::Tessera.name()) else { return out };
    let best = BASELINES
        .iter()
        .filter_map(|b| entries.get(*b).map(|e| (*b, e.report.avg_jct_s)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((name, jct)) = best
        && t.report.avg_jct_s > JCT_MARGIN * jct
    {
        out.push(format!("avg JCT {:.3}× {name}'s", t.report.avg_jct_s / jct));
    }
    if let Some(f) = entries.get("fifo-firstfit")
        && t.util_waiting < f.util_waiting - UTIL_MARGIN
    {
        out.push(format!(
            "utilization while waiting {:.1} points below fifo-firstfit's",
            100.0 * (f.util_waiting - t.util_waiting)
        ));
    }
    if let Some(m) = migration_ratio(entries)
        && m > MIGRATION_TARGET
    {
        out.push(format!(
            "migration left {m:.3} of the >=5-GPU jobs' fragmentation-blocked wait (at most {MIGRATION_TARGET:.3})"
        ));
    }
    out
}

/// Mean fragmentation-blocked seconds over the jobs of 5 GPUs or more (the `8` and `>8` buckets).
fn frag_blocked_large(r: &PolicyReport) -> f64 {
    let (mut sum, mut n) = (0.0, 0u64);
    for b in ["8", ">8"] {
        let jobs = r.jobs_by_size.get(b).copied().unwrap_or(0);
        sum += r.frag_blocked_s_by_size.get(b).copied().unwrap_or(0.0) * jobs as f64;
        n += jobs;
    }
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// The contenders of the matrix: every preset.
pub fn default_contenders() -> Vec<Contender> {
    SimPolicy::ALL.into_iter().map(Contender::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_matrix_has_every_cell_the_evaluation_names() {
        let all = cells(false);
        // Philly: 4 loads; synthetic: 3 seeds × 2 loads; × 3 clusters × 2 models.
        assert_eq!(all.len(), (4 + 3 * 2) * 3 * 2);
        assert!(all.iter().any(|c| c.cluster == ClusterSize::Servers(8) && c.ideal && c.load == 1.5));
        let labels: std::collections::BTreeSet<String> = all.iter().map(Cell::label).collect();
        assert_eq!(labels.len(), all.len(), "labels are unique");
        assert!(cells(true).iter().all(|c| c.cluster == ClusterSize::Servers(8)));
    }

    #[test]
    fn other_synthetic_traces_replace_seeds_one_to_three_and_say_how_they_differ() {
        let held_out: Vec<SyntheticSpec> = (4..=5).map(|seed| synthetic_spec(seed, false)).collect();
        let other = cells_with(false, &held_out);
        // Philly's 4 loads and 2 seeds × 2 loads, × 3 clusters × 2 models.
        assert_eq!(other.len(), (4 + 2 * 2) * 3 * 2);
        let synthetic: Vec<&Cell> = other.iter().filter(|c| matches!(c.trace, MatrixTrace::Synthetic(_))).collect();
        assert!(
            synthetic.iter().all(|c| c.label().starts_with("synthetic-4 ") || c.label().starts_with("synthetic-5 "))
        );
        // The default matrix is the same call with seeds 1–3.
        assert_eq!(cells(false), cells_with(false, &synthetic_traces(false)));
        // Settings other than the generator's defaults are in the label, so cells stay apart.
        let bursty = SyntheticSpec { multi_server_share: 0.1, burst: 8.0, ..synthetic_spec(4, false) };
        let mixed = cells_with(true, &[synthetic_spec(4, true), bursty]);
        let labels: std::collections::BTreeSet<String> = mixed.iter().map(Cell::label).collect();
        assert_eq!(labels.len(), mixed.len(), "labels are unique: {labels:?}");
        assert!(labels.contains("synthetic-4[multi=0.1,burst=8] load=0.9 8x8 default"), "{labels:?}");
        assert!(labels.contains("synthetic-4 load=0.9 8x8 default"), "{labels:?}");
    }

    #[test]
    fn the_load_scale_offers_the_load_asked_for() {
        let t = generate(&SyntheticSpec { jobs: 500, ..SyntheticSpec::new(2) });
        let ls = load_scale_for(&t, 64, 0.9);
        // At that scale the cluster sized for 0.9 is the 8 servers asked for (up to rounding).
        let n = servers_for_load(&t, ls, 8, 0.9);
        assert!((8..=9).contains(&n), "{n} servers");
    }

    fn entry(jct: f64, frag: f64) -> Entry {
        Entry {
            jct_ratio: None,
            util_waiting: 1.0 - frag,
            frag_blocked_large_s: 0.0,
            report: PolicyReport { avg_jct_s: jct, fragmentation: frag, ..PolicyReport::default() },
        }
    }

    #[test]
    fn a_cell_misses_when_tessera_trails_the_best_baseline_or_idles_gpus() {
        let mut e: BTreeMap<String, Entry> = BTreeMap::new();
        e.insert("fifo-firstfit".into(), entry(100.0, 0.05));
        e.insert("hived".into(), entry(90.0, 0.10));
        e.insert("tessera".into(), entry(91.0, 0.07));
        let cell = Cell {
            trace: MatrixTrace::Philly { max_jobs: None },
            load: 1.5,
            cluster: ClusterSize::Servers(8),
            ideal: true,
        };
        let misses = |e: &BTreeMap<String, Entry>| misses(&cell, e);
        assert!(misses(&e).is_empty(), "within 2% of hived and 2 points of fifo: {:?}", misses(&e));
        e.insert("tessera".into(), entry(93.0, 0.07));
        assert_eq!(misses(&e).len(), 1, "{:?}", misses(&e));
        assert!(misses(&e)[0].contains("hived"));
        e.insert("tessera".into(), entry(80.0, 0.20));
        assert!(misses(&e)[0].contains("utilization"), "{:?}", misses(&e));
        e.insert("tessera".into(), entry(91.0, 0.07));
        e.insert("tessera-las".into(), entry(51.0, 0.07));
        assert!(misses(&e)[0].contains("tessera-las"), "{:?}", misses(&e));
        e.insert("tessera-las".into(), entry(49.0, 0.07));
        assert!(misses(&e).is_empty(), "{:?}", misses(&e));
        // Migration must leave at most a third of the fragmentation-blocked wait.
        let blocked = |s: f64| Entry { frag_blocked_large_s: s, ..entry(91.0, 0.07) };
        e.insert("tessera".into(), blocked(40.0));
        e.insert("tessera-no-migration".into(), blocked(100.0));
        assert_eq!(misses(&e).len(), 1, "{:?}", misses(&e));
        assert!(misses(&e)[0].contains("migration left 0.400"), "{:?}", misses(&e));
        e.insert("tessera".into(), blocked(30.0));
        assert!(misses(&e).is_empty(), "{:?}", misses(&e));
        e.insert("tessera-no-migration".into(), blocked(0.0));
        assert!(misses(&e).is_empty(), "nothing to cut: {:?}", misses(&e));
    }
}
