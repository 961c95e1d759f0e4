//! The scheduling policies the simulator compares.
//!
//! Every policy places through the same approver ([`tessera_view::ClusterView::propose`]) and
//! builds members with the same fit code; they differ in how a job's spec is written (gang
//! shape, locality, CPU demand) and how servers are chosen:
//!
//! | policy | placement | locality | CPU | migration |
//! |---|---|---|---|---|
//! | `fifo-firstfit` | one-GPU members on the first servers with free GPUs, in server order | none | share per GPU | no |
//! | `gandiva` | servers already running jobs of the same size first (affinity), then empty, then any; best fit | tightest found, any accepted | share per GPU | yes |
//! | `hived` | buddy cells: the tightest level whose group holds the job, best fit, never relaxed | that level | share per GPU | no |
//! | `tessera` | [`find_placement`] at the tightest level the job allows now, relaxing one level per `relax_after_s`; load-adaptive spread/pack ([`Policy`]) | prefer → any | predicted: want θ, accept ⌈θ/2⌉ | yes |
//! | `tessera-no-migration` | as `tessera` | | | no |
//! | `tessera-gpu-proportional-cpu` | as `tessera` | | share per GPU | yes |

use super::model::SpeedModel;
use super::trace_loader::SimJob;
use crate::error::SchedulerError;
use crate::local_view::{LocalView, Overlay};
use crate::placement_policy::Policy;
use crate::search::{find_placement, plan_on_server};
use std::fmt;
use tessera_view::fit::{self, FitMode};
use tessera_view::{CpuDemand, JobSpec, LocalityLevel, MemberPlacement, Predictor, ServerId, Topology};

/// Seconds a `tessera` job waits at one locality level before accepting the next looser one.
pub const RELAX_AFTER_S: u64 = 1800;

/// A simulated policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimPolicy {
    /// GPU count only, first fit, no topology.
    FifoFirstFit,
    /// Affinity packing and migration (Gandiva-like).
    Gandiva,
    /// Buddy allocation of topology cells (HiveD-like).
    Hived,
    /// Tessera: locality-tolerant, load-adaptive, migration, CPU-aware.
    Tessera,
    /// Tessera without migration.
    TesseraNoMigration,
    /// Tessera with the GPU-proportional CPU share instead of CPU-aware grants.
    TesseraGpuProportionalCpu,
}

impl SimPolicy {
    /// Every policy, in report order.
    pub const ALL: [SimPolicy; 6] = [
        SimPolicy::FifoFirstFit,
        SimPolicy::Gandiva,
        SimPolicy::Hived,
        SimPolicy::Tessera,
        SimPolicy::TesseraNoMigration,
        SimPolicy::TesseraGpuProportionalCpu,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            SimPolicy::FifoFirstFit => "fifo-firstfit",
            SimPolicy::Gandiva => "gandiva",
            SimPolicy::Hived => "hived",
            SimPolicy::Tessera => "tessera",
            SimPolicy::TesseraNoMigration => "tessera-no-migration",
            SimPolicy::TesseraGpuProportionalCpu => "tessera-gpu-proportional-cpu",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Result<SimPolicy, SchedulerError> {
        SimPolicy::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = SimPolicy::ALL.iter().map(|p| p.name()).collect();
            SchedulerError::UnknownName {
                what: "policy",
                name: s.to_string(),
                expected: format!("one of {}", names.join(", ")),
            }
        })
    }

    /// Whether it migrates jobs to de-fragment.
    pub fn migrates(self) -> bool {
        matches!(self, SimPolicy::Gandiva | SimPolicy::Tessera | SimPolicy::TesseraGpuProportionalCpu)
    }

    fn cpu_aware(self) -> bool {
        matches!(self, SimPolicy::Tessera | SimPolicy::TesseraNoMigration)
    }

    fn is_tessera(self) -> bool {
        matches!(self, SimPolicy::Tessera | SimPolicy::TesseraNoMigration | SimPolicy::TesseraGpuProportionalCpu)
    }

    /// The job spec this policy submits for a trace job. `theta` is the job's CPU sweet point.
    pub fn spec(self, job: &SimJob, theta: f64, topologies: &[Topology]) -> JobSpec {
        let max_devices = topologies.iter().map(|t| t.devices).max().unwrap_or(1);
        let g = job.gpus;
        let (members, per) = if self == SimPolicy::FifoFirstFit {
            (g, 1)
        } else if g <= max_devices {
            (1, g)
        } else {
            // The largest member that divides the gang and fits a server.
            let per = (1..=max_devices).rev().find(|d| g.is_multiple_of(*d)).unwrap_or(1);
            (g / per, per)
        };
        let mut spec = JobSpec::simple(&job.name, members, per);
        spec.gpu_type = job.gpu_type.clone();
        let cell = preferred_level(g, topologies);
        match self {
            SimPolicy::FifoFirstFit => spec.prefer = LocalityLevel::Any,
            SimPolicy::Hived => (spec.prefer, spec.tolerate) = (cell, cell),
            SimPolicy::Gandiva => spec.prefer = cell,
            _ => {
                spec.prefer = cell;
                spec.relax_after_s = Some(RELAX_AFTER_S);
            }
        }
        if self.cpu_aware() {
            let theta = theta.max(1.0);
            let predictor = Predictor { p0: 1.0, p1: 1.0, p2: 1.0, theta };
            spec.cpu = CpuDemand::Predicted { predictor, min_cores_per_gpu: (theta / 2.0).ceil().max(1.0) as u32 };
            spec.memory_mib_per_gpu = job.memory_mib_per_gpu;
        }
        spec
    }

    /// Finds members for `spec` on `view` now (the job has waited `waited_s`), or `None`.
    pub fn place(
        self,
        view: &LocalView,
        spec: &JobSpec,
        waited_s: f64,
        salt: u64,
        affinity: &dyn Fn(ServerId) -> Affinity,
    ) -> Option<Vec<MemberPlacement>> {
        let overlay = Overlay::default();
        match self {
            SimPolicy::FifoFirstFit => first_fit(view, spec),
            SimPolicy::Hived => {
                find_placement(view, &overlay, spec, spec.tolerate, FitMode::Pack, salt).ok().map(|f| f.members)
            }
            SimPolicy::Gandiva if spec.members == 1 => gandiva(view, spec, affinity),
            SimPolicy::Gandiva => {
                find_placement(view, &overlay, spec, spec.tolerate, FitMode::Pack, salt).ok().map(|f| f.members)
            }
            _ => {
                debug_assert!(self.is_tessera());
                let allowed = spec.allowed_level(waited_s as u64);
                let mode = Policy::default().mode(view, spec);
                find_placement(view, &overlay, spec, allowed, mode, salt).ok().map(|f| f.members)
            }
        }
    }
}

impl fmt::Display for SimPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The tightest level at which a job of `gpus` GPUs fits on some server model of the cluster
/// (`rack` for jobs larger than any server): its preferred level, and HiveD's cell.
pub fn preferred_level(gpus: u32, topologies: &[Topology]) -> LocalityLevel {
    [LocalityLevel::PcieSwitch, LocalityLevel::Socket, LocalityLevel::Server]
        .into_iter()
        .find(|&l| topologies.iter().any(|t| t.max_group(l) >= gpus))
        .unwrap_or(LocalityLevel::Rack)
}

/// What a server runs, for Gandiva's affinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affinity {
    /// No job.
    Empty,
    /// Only jobs of this many GPUs.
    Size(u32),
    /// Jobs of several sizes.
    Mixed,
}

/// First fit by GPU count: members (one GPU each) go to the lowest-numbered servers with a free
/// GPU, in order, ignoring topology.
fn first_fit(view: &LocalView, spec: &JobSpec) -> Option<Vec<MemberPlacement>> {
    let mut members = Vec::with_capacity(spec.members as usize);
    for (i, rec) in view.servers().iter().enumerate() {
        let topo = view.topology_of(rec.config_set);
        if spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type) {
            continue;
        }
        let req = fit::member_request(spec, topo);
        let mut rec = *rec;
        while members.len() < spec.members as usize {
            let Some((m, _)) =
                fit::plan_member(topo, &rec, ServerId(i as u32), &req, LocalityLevel::Server, FitMode::Pack)
            else {
                break;
            };
            rec.free_gpus &= !m.gpus;
            rec.free_cores = rec.free_cores.without(m.cores);
            rec.free_memory_mib -= m.memory_mib;
            members.push(m);
        }
        if members.len() == spec.members as usize {
            return Some(members);
        }
    }
    None
}

/// Gandiva-like packing for a one-server job: servers running only jobs of the same size
/// first, then empty servers, then the rest; within a class the tightest level, then the
/// fullest server.
fn gandiva(view: &LocalView, spec: &JobSpec, affinity: &dyn Fn(ServerId) -> Affinity) -> Option<Vec<MemberPlacement>> {
    let g = spec.total_gpus();
    let mut best: Option<((u8, LocalityLevel, u32), Vec<MemberPlacement>)> = None;
    for (i, rec) in view.servers().iter().enumerate() {
        let free = rec.free_gpus.count_ones();
        if free < g {
            continue;
        }
        let s = ServerId(i as u32);
        let class = match affinity(s) {
            Affinity::Size(n) if n == g => 0,
            Affinity::Empty => 1,
            _ => 2,
        };
        if best.as_ref().is_some_and(|(k, _)| k.0 < class) {
            continue;
        }
        let topo = view.topology_of(rec.config_set);
        if spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type) {
            continue;
        }
        let req = fit::member_request(spec, topo);
        let Some(ms) = plan_on_server(topo, rec, s, &req, 1, LocalityLevel::Server, FitMode::Pack) else { continue };
        let key = (class, topo.level_of(ms.iter().fold(0, |a, m| a | m.gpus)), free);
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((key, ms));
        }
    }
    best.map(|(_, ms)| ms)
}

/// A job's CPU sweet point: the trace's own request when it gives one, else its class's θ.
pub fn theta_of(job: &SimJob, model: &SpeedModel, class: usize) -> f64 {
    job.cores_per_gpu.unwrap_or(model.class(class).theta)
}
