//! One `tessera sim` experiment as a value: which trace, cluster, speed model and load
//! ([`ExperimentSpec`]), loaded into the inputs every policy replays ([`Experiment`]), and the
//! policies run side by side on a bounded thread pool ([`Experiment::run`]). The command line
//! only parses flags into an [`ExperimentSpec`] and prints what comes back, so tests and other
//! tools run the same experiments.

use crate::error::SchedulerError;
use crate::sim::synthetic::{SyntheticSpec, generate};
use crate::sim::trace_loader::{load_alibaba_nodes, load_alibaba_pods, load_philly};
use crate::sim::{Contender, PolicyReport, SimConfig, SpeedModel, Trace};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tessera_view::{ClusterSpec, Topology};

/// Offered load (the trace's average GPU demand over the cluster's GPUs, at full speed) the
/// default Philly cluster is sized for. With the speed model's CPU and locality losses, jobs
/// run at roughly half speed, so queues form and last (docs/EVALUATION.md).
pub const DEFAULT_OFFERED_LOAD: f64 = 0.35;
/// Server model of the default Philly cluster.
pub const DEFAULT_TOPOLOGY: &str = "seed-8gpu";
/// Default arrival-rate multiplier for the Alibaba pods: the real cluster has about as many
/// GPUs as the trace has pods, so arrivals are compressed to make them meet.
pub const ALIBABA_LOAD_SCALE: f64 = 300.0;
/// The Philly trace's file name in the traces folder.
pub const PHILLY_FILE: &str = "philly-vc-jobs.csv";
/// The Alibaba pods' file name in the traces folder.
pub const ALIBABA_PODS_FILE: &str = "alibaba-v2023-gpu-pods.csv";
/// The Alibaba node list's file name in the traces folder.
pub const ALIBABA_NODES_FILE: &str = "alibaba-v2023-gpu-nodes.csv";

/// Which trace to replay.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceSource {
    /// The Philly-derived per-VC jobs in the traces folder.
    Philly,
    /// The Alibaba PAI v2023 pods in the traces folder.
    Alibaba,
    /// A CSV with the columns of either (told apart by its header).
    File(PathBuf),
    /// A generated trace ([`crate::sim::synthetic`]).
    Synthetic(SyntheticSpec),
}

/// Which speed model to use.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelChoice {
    /// The compiled-in `deploy/sim/speed-model.toml`.
    Builtin,
    /// No locality, interference or CPU effects.
    Ideal,
    /// A speed-model file.
    File(PathBuf),
}

/// What an experiment replays, before anything is loaded.
#[derive(Clone, Debug)]
pub struct ExperimentSpec {
    /// The folder holding the named traces.
    pub traces_dir: PathBuf,
    /// The trace.
    pub trace: TraceSource,
    /// A Philly virtual cluster to replay alone (`None`: every VC on one clock).
    pub vc: Option<String>,
    /// A cluster spec file; by default Philly runs on [`DEFAULT_TOPOLOGY`] servers sized for
    /// `offered_load`, Alibaba on its real node list.
    pub cluster: Option<PathBuf>,
    /// Offered load the default Philly cluster is sized for.
    pub offered_load: f64,
    /// Arrival-rate multiplier (arrival times are divided by it); by default 1 for Philly and
    /// [`ALIBABA_LOAD_SCALE`] for Alibaba.
    pub load_scale: Option<f64>,
    /// Seed of the searches' probe order (the only randomness).
    pub seed: u64,
    /// The speed model.
    pub model: ModelChoice,
    /// Replay only the first N jobs by arrival.
    pub max_jobs: Option<usize>,
}

impl ExperimentSpec {
    /// The default experiment on `trace`, with the named traces in `traces_dir`.
    pub fn new(traces_dir: &Path, trace: TraceSource) -> ExperimentSpec {
        ExperimentSpec {
            traces_dir: traces_dir.to_path_buf(),
            trace,
            vc: None,
            cluster: None,
            offered_load: DEFAULT_OFFERED_LOAD,
            load_scale: None,
            seed: 1,
            model: ModelChoice::Builtin,
            max_jobs: None,
        }
    }

    /// Loads the trace, cluster and model.
    pub fn load(&self) -> Result<Experiment, SchedulerError> {
        let (path, alibaba) = match &self.trace {
            TraceSource::Philly => (self.traces_dir.join(PHILLY_FILE), false),
            TraceSource::Alibaba => (self.traces_dir.join(ALIBABA_PODS_FILE), true),
            TraceSource::File(p) => (p.clone(), is_alibaba_pods(p)?),
            TraceSource::Synthetic(_) => (PathBuf::new(), false),
        };
        let synthetic = matches!(self.trace, TraceSource::Synthetic(_));
        if self.vc.is_some() && (alibaba || synthetic) {
            return Err(SchedulerError::Unsupported { setting: "--vc", why: "applies to Philly traces only" });
        }
        let mut trace = match &self.trace {
            TraceSource::Synthetic(s) => generate(s),
            _ if alibaba => load_alibaba_pods(&path)?,
            _ => load_philly(&path, self.vc.as_deref())?,
        };
        let mut notes = Vec::new();
        if let Some(n) = self.max_jobs {
            if n == 0 {
                return Err(SchedulerError::BadSetting {
                    setting: "--max-jobs",
                    expected: "at least 1".into(),
                    got: n.to_string(),
                });
            }
            if n < trace.jobs.len() {
                notes.push(format!("replaying the first {n} of {} usable jobs by arrival", trace.jobs.len()));
                trace.jobs.truncate(n);
            }
        }
        let load_scale = self.load_scale.unwrap_or(if alibaba { ALIBABA_LOAD_SCALE } else { 1.0 });
        if !(load_scale.is_finite() && load_scale > 0.0) {
            return Err(SchedulerError::BadSetting {
                setting: "--load-scale",
                expected: "a positive number".into(),
                got: load_scale.to_string(),
            });
        }
        let (cluster, cluster_note) = match (&self.cluster, alibaba) {
            (Some(p), _) => (ClusterSpec::from_file(p)?, p.display().to_string()),
            (None, false) => {
                if !(self.offered_load.is_finite() && self.offered_load > 0.0) {
                    return Err(SchedulerError::BadSetting {
                        setting: "--offered-load",
                        expected: "a positive number".into(),
                        got: self.offered_load.to_string(),
                    });
                }
                let topo = Topology::preset(DEFAULT_TOPOLOGY).ok_or(SchedulerError::MissingPreset(DEFAULT_TOPOLOGY))?;
                let n = crate::sim::servers_for_load(&trace, load_scale, topo.devices, self.offered_load);
                let note = format!("{n} × {DEFAULT_TOPOLOGY}, sized for offered load {}", self.offered_load);
                (crate::sim::uniform_cluster(topo, n), note)
            }
            (None, true) => {
                let nodes = self.traces_dir.join(ALIBABA_NODES_FILE);
                let c = load_alibaba_nodes(&nodes).map_err(|e| SchedulerError::NodeList(Box::new(e)))?;
                for (reason, n) in &c.skipped {
                    notes.push(format!("node list: left out {n} nodes — {reason}"));
                }
                (c.spec, format!("real node list {}", nodes.display()))
            }
        };
        let model = match &self.model {
            ModelChoice::Builtin => SpeedModel::builtin(),
            ModelChoice::Ideal => SpeedModel::ideal(),
            ModelChoice::File(f) => {
                let text = std::fs::read_to_string(f).map_err(SchedulerError::io(f))?;
                SpeedModel::from_toml(&f.display().to_string(), &text)?
            }
        };
        Ok(Experiment { trace, cluster, cluster_note, model, load_scale, seed: self.seed, notes })
    }
}

/// A trace file's format, from its header: Alibaba pods have `gpu_milli`.
fn is_alibaba_pods(path: &Path) -> Result<bool, SchedulerError> {
    use std::io::BufRead;
    let io = SchedulerError::io(path);
    let f = std::fs::File::open(path).map_err(&io)?;
    let mut header = String::new();
    std::io::BufReader::new(f).read_line(&mut header).map_err(io)?;
    Ok(header.split(',').any(|c| c.trim() == "gpu_milli"))
}

/// The loaded inputs every policy replays.
#[derive(Debug)]
pub struct Experiment {
    /// The trace.
    pub trace: Trace,
    /// The simulated cluster.
    pub cluster: ClusterSpec,
    /// How the cluster was chosen, in words.
    pub cluster_note: String,
    /// The speed model.
    pub model: SpeedModel,
    /// The arrival-rate multiplier.
    pub load_scale: f64,
    /// The search seed.
    pub seed: u64,
    /// What was trimmed or left out on the way, in words.
    pub notes: Vec<String>,
}

/// One policy's outcome and its wall time in seconds.
pub type PolicyRun = Result<(PolicyReport, f64), SchedulerError>;

impl Experiment {
    /// GPUs of the simulated cluster.
    pub fn cluster_gpus(&self) -> u64 {
        let c = &self.cluster;
        c.groups.iter().map(|g| u64::from(g.servers) * u64::from(c.topologies[g.topology].devices)).sum()
    }

    /// The inputs as given: `trace` replayed on `cluster` under `model`, arrivals as in the
    /// trace, seed 1 (what a library user simulating their own scheduler starts from).
    pub fn new(trace: Trace, cluster: ClusterSpec, model: SpeedModel) -> Experiment {
        Experiment { trace, cluster, cluster_note: "given".into(), model, load_scale: 1.0, seed: 1, notes: Vec::new() }
    }

    /// Runs every contender, at most `threads` at once (each run is deterministic on its own,
    /// so results do not depend on the thread count), calling `progress(k, done, total)` as
    /// contender `k` advances. Results come back in `contenders` order, each with its name.
    pub fn run(
        &self,
        contenders: &[Contender],
        threads: usize,
        progress: &(dyn Fn(usize, u64, u64) + Sync),
    ) -> Result<Vec<(String, PolicyRun)>, SchedulerError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.clamp(1, contenders.len().max(1)))
            .thread_name(|i| format!("sim-{i}"))
            .build()?;
        Ok(pool.install(|| {
            use rayon::prelude::*;
            contenders
                .par_iter()
                .enumerate()
                .map(|(k, contender)| {
                    let mut cfg = SimConfig::new(contender.clone());
                    cfg.seed = self.seed;
                    cfg.load_scale = self.load_scale;
                    let t0 = Instant::now();
                    let r = crate::sim::simulate(&self.cluster, &self.trace, &self.model, &cfg, &mut |done, total| {
                        progress(k, done, total)
                    });
                    (contender.name.clone(), r.map(|r| (r, t0.elapsed().as_secs_f64())))
                })
                .collect()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimPolicy;

    fn philly(dir: &Path, rows: &str) -> PathBuf {
        let p = dir.join("t.csv");
        let header = "job_id,vc,submit_time_s,num_gpus,duration_s_v100,job_type,total_steps";
        std::fs::write(&p, format!("{header}\n{rows}")).expect("write");
        p
    }

    #[test]
    fn settings_out_of_range_name_their_flag() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path();
        let p = philly(dir, "0,a,0,1,100,LM,1\n");
        let mut s = ExperimentSpec::new(dir, TraceSource::File(p));
        s.max_jobs = Some(0);
        assert!(s.load().expect_err("0 jobs").to_string().contains("--max-jobs"));
        s.max_jobs = None;
        s.load_scale = Some(-1.0);
        assert!(s.load().expect_err("negative").to_string().contains("--load-scale"));
        s.load_scale = None;
        s.offered_load = f64::NAN;
        assert!(s.load().expect_err("nan").to_string().contains("--offered-load"));
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path();
        let rows: String =
            (0..60).map(|i| format!("{i},a,{},{},{},LM,1\n", i * 30, 1 << (i % 4), 600 + i * 10)).collect();
        let p = philly(dir, &rows);
        let e = ExperimentSpec::new(dir, TraceSource::File(p)).load().expect("load");
        let policies = [SimPolicy::FifoFirstFit, SimPolicy::Tessera].map(Contender::from);
        let one = e.run(&policies, 1, &|_, _, _| {}).expect("run");
        let two = e.run(&policies, 2, &|_, _, _| {}).expect("run");
        for ((p1, a), (p2, b)) in one.iter().zip(&two) {
            assert_eq!(p1, p2);
            let (a, b) = (&a.as_ref().expect("ran").0, &b.as_ref().expect("ran").0);
            assert_eq!(serde_json::to_string(a).expect("json"), serde_json::to_string(b).expect("json"));
        }
    }
}
