//! The contenders the simulator compares: a [`Contender`] is a [`Scheduler`] (any built-in, or
//! one a user wrote with the SDK), how it writes a trace's job as a job spec ([`SpecStyle`]),
//! and whether its host migrates jobs. [`SimPolicy`] names the presets `tessera sim` runs by
//! default; every other built-in scheduler is a contender by its name too.
//!
//! Every contender places through the same approver ([`tessera_view::ClusterView::propose`])
//! and builds members with the same fit code; the schedulers are the very types a live host
//! runs ([`crate::scheduler`]), so each policy exists once:
//!
//! | preset | scheduler | spec style | CPU | migration |
//! |---|---|---|---|---|
//! | `fifo-firstfit` | [`FifoFirstFit`]: one-GPU members on the first servers with free GPUs | [`SpecStyle::OneGpuMembers`] | share per GPU | no |
//! | `gandiva` | [`Gandiva`]: affinity to servers running same-size jobs, then empty ones | [`SpecStyle::Preferred`] | share per GPU | yes, single moves ([`SimPolicy::chains_moves`]) |
//! | `hived` | [`Hived`]: buddy cells, the tightest level whose group holds the job, never relaxed | [`SpecStyle::Cell`] | share per GPU | no |
//! | `tessera` | [`CpuAware`]: tightest level allowed now, a looser one when starting there now beats waiting ([`crate::locality_cost`]); load-adaptive spread/pack; θ cores where a server spares them | [`SpecStyle::Relaxing`] (one-GPU members for a job that loses nothing anywhere), CPU-aware | predicted: want θ, accept down to the proportional share | yes |
//! | `tessera-no-migration` | as `tessera` | | | no |
//! | `tessera-reserving` | as `tessera`, with bounded reservations ([`crate::reservation`]) | | | yes |
//! | `tessera-gpu-proportional-cpu` | as `tessera` | [`SpecStyle::Relaxing`] | share per GPU | yes |
//! | `tessera-las` | as `tessera`, in attained-service order ([`QueueOrder::AttainedService`]) with preemption when no move helps, at most [`LAS_MAX_PREEMPTIONS`] per job | as `tessera` | as `tessera` | yes |
//!
//! Every preset but `tessera-las` offers waiting jobs in arrival order and never preempts. The
//! `tessera-reserving` preset also makes bounded reservations for starved gangs of whole servers
//! ([`crate::reservation`], as a live host does with `--reservations`); the others make none.

use super::model::SpeedModel;
use super::trace_loader::SimJob;
use crate::error::SchedulerError;
use crate::scheduler::{self, CpuAware, FifoFirstFit, Gandiva, Hived, Scheduler};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use tessera_view::{CpuDemand, JobSpec, LocalityLevel, Predictor, Topology};

/// The attained-service queue thresholds of `tessera-las`, in GPU-seconds: one GPU-hour, then
/// every factor of ten up to 10,000 GPU-hours. Tiresias spaces its queues exponentially so that
/// a job's queue says how many orders of magnitude of GPU time it has had; starting at one
/// GPU-hour lets jobs of minutes finish in the first queue, and the decades go on through the
/// whole range a job can attain (a 64-GPU gang running a week is about 10,750 GPU-hours), so
/// that the long jobs, which hold most of the GPU time in a heavy-tailed mix, are still ordered
/// by what they attained instead of sharing one last queue in arrival order. Not fitted to any
/// trace (docs/EVALUATION.md: two thresholds before stop 40).
pub const LAS_THRESHOLDS_GPU_S: [u64; 5] = [3_600, 36_000, 360_000, 3_600_000, 36_000_000];

/// The starvation bound of `tessera-las`: one preemption per attained-service queue. In that
/// order a running job is outranked by newer jobs each time it falls a queue, so a job that
/// descends every queue may be owed a preemption in each; a bound below the number of queues
/// (the cluster default, 3, against six queues) makes the longest jobs unpreemptible half-way
/// down, and then the bound, not the queues, orders them. Sized by that rule, not fitted to a
/// trace (docs/EVALUATION.md, stop 41).
pub const LAS_MAX_PREEMPTIONS: u32 = LAS_THRESHOLDS_GPU_S.len() as u32 + 1;

/// The order in which a host offers its waiting jobs to the scheduler.
#[derive(Clone, Debug, PartialEq)]
pub enum QueueOrder {
    /// The simulated cluster's order: arrival (FIFO with backfill: a job that does not fit is
    /// skipped), or attained service where its cluster spec names thresholds, as a live host
    /// offers them.
    Fifo,
    /// Priority, then the attained-service queue (GPU-seconds run so far against `thresholds`,
    /// ascending: queue `k` holds jobs that attained at least `thresholds[k-1]`), then the GPU
    /// time attained in earlier runs (waiting jobs only: no preemption within a queue), then arrival:
    /// Tiresias' discretized two-dimensional least-attained-service, which needs no duration
    /// estimate. The thresholds become the simulated cluster's
    /// ([`tessera_view::Priorities::attained_service_gpu_s`]), so the view moves a running job
    /// down a queue as its clock passes the job's mark ([`tessera_view::attained`]), exactly as
    /// on a live cluster, and waiting jobs of lower queues may preempt it.
    AttainedService {
        /// Queue thresholds in GPU-seconds, ascending (at most 8, above 0).
        thresholds_gpu_s: Vec<u64>,
        /// The starvation bound the cluster sets with these queues
        /// ([`tessera_view::Priorities::max_preemptions`]); none: the cluster spec's.
        max_preemptions: Option<u32>,
    },
}

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
    /// Tessera with bounded reservations for starved gangs of whole servers.
    TesseraReserving,
    /// Tessera with the GPU-proportional CPU share instead of CPU-aware grants.
    TesseraGpuProportionalCpu,
    /// Tessera in attained-service order, with preemption (Tiresias' 2D-LAS).
    TesseraLas,
}

impl SimPolicy {
    /// Every policy, in report order.
    pub const ALL: [SimPolicy; 8] = [
        SimPolicy::FifoFirstFit,
        SimPolicy::Gandiva,
        SimPolicy::Hived,
        SimPolicy::Tessera,
        SimPolicy::TesseraNoMigration,
        SimPolicy::TesseraReserving,
        SimPolicy::TesseraGpuProportionalCpu,
        SimPolicy::TesseraLas,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            SimPolicy::FifoFirstFit => "fifo-firstfit",
            SimPolicy::Gandiva => "gandiva",
            SimPolicy::Hived => "hived",
            SimPolicy::Tessera => "tessera",
            SimPolicy::TesseraNoMigration => "tessera-no-migration",
            SimPolicy::TesseraReserving => "tessera-reserving",
            SimPolicy::TesseraGpuProportionalCpu => "tessera-gpu-proportional-cpu",
            SimPolicy::TesseraLas => "tessera-las",
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
        matches!(
            self,
            SimPolicy::Gandiva
                | SimPolicy::Tessera
                | SimPolicy::TesseraReserving
                | SimPolicy::TesseraGpuProportionalCpu
                | SimPolicy::TesseraLas
        )
    }

    /// Whether its moves may chain ([`Contender::chained_moves`]): every preset that migrates
    /// but `gandiva`. Gandiva (OSDI 2018) migrates a job to where GPUs are free, to pack or to
    /// de-fragment; making room for a moved job by moving another is the Tessera planner's, so
    /// the baseline keeps single moves, as it was measured before chains existed.
    pub fn chains_moves(self) -> bool {
        self.migrates() && self != SimPolicy::Gandiva
    }

    /// The scheduler it runs.
    pub fn scheduler(self) -> Arc<dyn Scheduler> {
        match self {
            SimPolicy::FifoFirstFit => Arc::new(FifoFirstFit),
            SimPolicy::Gandiva => Arc::new(Gandiva),
            SimPolicy::Hived => Arc::new(Hived),
            SimPolicy::Tessera
            | SimPolicy::TesseraNoMigration
            | SimPolicy::TesseraReserving
            | SimPolicy::TesseraGpuProportionalCpu
            | SimPolicy::TesseraLas => Arc::new(CpuAware::default()),
        }
    }

    /// Whether its host makes bounded reservations for starved gangs of whole servers
    /// ([`crate::reservation`]): only `tessera-reserving`. They are off by default on a live
    /// host too: on the robustness matrix they cost more average completion time than they
    /// save (docs/EVALUATION.md). The baselines model systems that backfill without one
    /// (fifo-firstfit), or keep room by their own means (gandiva's packing, hived's cells).
    pub fn reserves(self) -> bool {
        self == SimPolicy::TesseraReserving
    }

    /// How it writes a trace's job as a spec.
    pub fn style(self) -> SpecStyle {
        match self {
            SimPolicy::FifoFirstFit => SpecStyle::OneGpuMembers,
            SimPolicy::Gandiva => SpecStyle::Preferred,
            SimPolicy::Hived => SpecStyle::Cell,
            SimPolicy::Tessera
            | SimPolicy::TesseraNoMigration
            | SimPolicy::TesseraReserving
            | SimPolicy::TesseraLas => SpecStyle::Relaxing { cpu_aware: true },
            SimPolicy::TesseraGpuProportionalCpu => SpecStyle::Relaxing { cpu_aware: false },
        }
    }
}

/// How a contender writes a trace's job as a job spec: the gang shape, locality and CPU demand
/// a user of that system would write (a HiveD user asks for a cell, a GPU-count user for N
/// GPUs), which is not placement and so not the scheduler's to decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecStyle {
    /// N one-GPU members, any locality (a GPU-count scheduler's request).
    OneGpuMembers,
    /// One member per server-sized piece; prefer and tolerate the tightest level whose group
    /// holds the job (HiveD's cell).
    Cell,
    /// One member per server-sized piece; prefer that level, tolerate any.
    Preferred,
    /// One member per server-sized piece; prefer that level, declare the job's loss at each
    /// looser one (its speed class's `slowdown`) and no timer: levels it loses nothing at are
    /// taken at once, lossy ones when starting there now is expected to finish sooner than
    /// waiting ([`crate::locality_cost`]). A job that loses nothing at any level, spread over
    /// servers included ([`loses_nothing_anywhere`]: every job under `ideal`), is written as
    /// one-GPU members instead: one process per server would only keep it waiting for a whole
    /// group it gains nothing from. With `cpu_aware`, the job's predicted CPU demand (want θ
    /// cores per GPU, accept down to the proportional share) and its memory.
    Relaxing {
        /// Whether the spec carries the predicted CPU demand and memory.
        cpu_aware: bool,
    },
}

impl SpecStyle {
    /// The job spec for a trace job. `theta` is the job's CPU sweet point and `slowdown` its loss
    /// per level, as a Tessera user declares them ([`SpeedModel::declared_theta`],
    /// [`SpeedModel::slowdown_of`]: nothing to gain from cores or locality under `ideal`).
    pub fn spec(
        self,
        job: &SimJob,
        theta: f64,
        slowdown: &BTreeMap<LocalityLevel, f64>,
        topologies: &[Topology],
    ) -> JobSpec {
        let max_devices = topologies.iter().map(|t| t.devices).max().unwrap_or(1);
        let g = job.gpus;
        // A job that loses nothing anywhere, spread over servers included, gains nothing from
        // keeping its GPUs in one process per server: its user runs one process per GPU (as
        // data-parallel trainers do anyway), and it starts wherever that many GPUs are free.
        let spreads_freely = matches!(self, SpecStyle::Relaxing { .. }) && loses_nothing_anywhere(slowdown);
        let (members, per) = if self == SpecStyle::OneGpuMembers || spreads_freely {
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
            SpecStyle::OneGpuMembers => spec.prefer = LocalityLevel::Any,
            SpecStyle::Cell => (spec.prefer, spec.tolerate) = (cell, cell),
            SpecStyle::Preferred => spec.prefer = cell,
            SpecStyle::Relaxing { .. } => {
                spec.prefer = cell;
                // The job's own losses per level (none under `ideal`): what the host weighs a
                // looser level by, instead of a timer.
                spec.slowdown = slowdown.clone();
            }
        }
        if self == (SpecStyle::Relaxing { cpu_aware: true }) {
            let theta = theta.max(1.0);
            let predictor = Predictor { p0: 1.0, p1: 1.0, p2: 1.0, theta };
            // Accept down to the proportional share (never above θ): the fit keeps the share of
            // cores beside every GPU free at placement, so a job that accepts it can use any GPU
            // free then; where a server has spare cores the job still gets up to θ. Spare cores
            // include those a job below its share left, so when that job ends its GPU may come
            // back short of cores (docs/EVALUATION.md, "Stop 43": GPUs idle for want of cores).
            let share = topologies.iter().map(|t| t.cores() / t.devices.max(1)).min().unwrap_or(1);
            let min_cores_per_gpu = share.min(theta.ceil() as u32).max(1);
            spec.cpu = CpuDemand::Predicted { predictor, min_cores_per_gpu };
            spec.memory_mib_per_gpu = job.memory_mib_per_gpu;
        }
        spec
    }
}

/// One contender of a simulation: a scheduler, the spec style its users write, and whether its
/// host migrates jobs (the simulator's migration step, [`tessera_view::migration_planner`]).
#[derive(Clone, Debug)]
pub struct Contender {
    /// Its name in reports.
    pub name: String,
    /// The scheduler every job of the run is placed with.
    pub scheduler: Arc<dyn Scheduler>,
    /// How trace jobs are written as specs.
    pub style: SpecStyle,
    /// Whether the host migrates jobs to let blocked ones start.
    pub migrates: bool,
    /// Whether its moves may chain, one job making room for a moved one
    /// ([`tessera_view::migration_planner::MigrationParams::chained_moves`], as a live host's
    /// planner does); off, every moved job needs a free home.
    pub chained_moves: bool,
    /// The order waiting jobs are offered in.
    pub order: QueueOrder,
    /// Whether a waiting job that does not fit may preempt jobs it outranks
    /// ([`crate::preemption::choose_victims`], [`tessera_view::Command::Preempt`]).
    pub preempts: bool,
    /// Whether the host withholds servers for a starved gang of whole servers, while that pays
    /// ([`crate::reservation`]).
    pub reserves: bool,
}

impl Contender {
    /// A contender named `name` that runs `scheduler` on specs written in `style`, without
    /// migration ([`Contender::migrating`] turns it on).
    pub fn new(name: impl Into<String>, scheduler: Arc<dyn Scheduler>, style: SpecStyle) -> Contender {
        Contender {
            name: name.into(),
            scheduler,
            style,
            migrates: false,
            chained_moves: true,
            order: QueueOrder::Fifo,
            preempts: false,
            reserves: false,
        }
    }

    /// The same contender with bounded reservations on or off.
    pub fn reserving(mut self, on: bool) -> Contender {
        self.reserves = on;
        self
    }

    /// The same contender offering jobs in `order`, preempting or not.
    pub fn ordered(mut self, order: QueueOrder, preempts: bool) -> Contender {
        self.order = order;
        self.preempts = preempts;
        self
    }

    /// The same contender with migration on or off.
    pub fn migrating(mut self, on: bool) -> Contender {
        self.migrates = on;
        self
    }

    /// The same contender with chained moves on or off ([`Contender::chained_moves`]).
    pub fn chaining(mut self, on: bool) -> Contender {
        self.chained_moves = on;
        self
    }

    /// A preset ([`SimPolicy`]) by name, or any built-in scheduler by its name (on specs written
    /// as [`SpecStyle::Relaxing`] with the CPU predicted, without migration).
    pub fn builtin(name: &str) -> Result<Contender, SchedulerError> {
        if let Some(p) = SimPolicy::ALL.into_iter().find(|p| p.name() == name) {
            return Ok(Contender::from(p));
        }
        let s = scheduler::builtin(name).ok_or_else(|| SchedulerError::UnknownName {
            what: "policy",
            name: name.to_string(),
            expected: format!("one of {}", Contender::names().join(", ")),
        })?;
        let name = s.name().to_string();
        Ok(Contender::new(name, Arc::from(s), SpecStyle::Relaxing { cpu_aware: true }))
    }

    /// Every name [`Contender::builtin`] accepts: the presets, then the other built-in schedulers.
    pub fn names() -> Vec<&'static str> {
        let mut v: Vec<&'static str> = SimPolicy::ALL.iter().map(|p| p.name()).collect();
        for n in scheduler::BUILTIN {
            if !v.contains(&n) {
                v.push(n);
            }
        }
        v
    }
}

impl From<SimPolicy> for Contender {
    fn from(p: SimPolicy) -> Contender {
        let c = Contender::new(p.name(), p.scheduler(), p.style())
            .migrating(p.migrates())
            .chaining(p.chains_moves())
            .reserving(p.reserves());
        match p {
            SimPolicy::TesseraLas => {
                let order = QueueOrder::AttainedService {
                    thresholds_gpu_s: LAS_THRESHOLDS_GPU_S.to_vec(),
                    max_preemptions: Some(LAS_MAX_PREEMPTIONS),
                };
                c.ordered(order, true)
            }
            _ => c,
        }
    }
}

impl fmt::Display for SimPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a job that declares `slowdown` loses nothing at any level, the loosest (`any`, gangs
/// spread over servers and racks) included: the view's own rule for the levels a job accepts at
/// once ([`tessera_view::job::free_level`]) reaches `any` from the tightest. Under the `ideal`
/// speed model every job does ([`SpeedModel::slowdown_of`]); under the built-in one only a
/// class measured as insensitive to its placement would.
pub fn loses_nothing_anywhere(slowdown: &BTreeMap<LocalityLevel, f64>) -> bool {
    tessera_view::job::free_level(LocalityLevel::PcieSwitch, slowdown) == LocalityLevel::Any
}

/// The tightest level at which a job of `gpus` GPUs fits on some server model of the cluster
/// (`rack` for jobs larger than any server): its preferred level, and HiveD's cell.
pub fn preferred_level(gpus: u32, topologies: &[Topology]) -> LocalityLevel {
    [LocalityLevel::PcieSwitch, LocalityLevel::Socket, LocalityLevel::Server]
        .into_iter()
        .find(|&l| topologies.iter().any(|t| t.max_group(l) >= gpus))
        .unwrap_or(LocalityLevel::Rack)
}

/// A job's CPU sweet point: the trace's own request when it gives one, else its class's θ.
pub fn theta_of(job: &SimJob, model: &SpeedModel, class: usize) -> f64 {
    job.cores_per_gpu.unwrap_or(model.class(class).theta)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(gpus: u32) -> SimJob {
        SimJob {
            name: "j".into(),
            arrival_s: 0.0,
            gpus,
            duration_s: 60.0,
            job_type: String::new(),
            cores_per_gpu: None,
            memory_mib_per_gpu: None,
            gpu_type: None,
        }
    }

    #[test]
    fn a_job_that_loses_nothing_anywhere_is_written_as_one_gpu_members_and_a_lossy_one_per_server() {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let topos = std::slice::from_ref(&topo);
        let builtin = SpeedModel::builtin();
        let ideal = SpeedModel::ideal();
        let style = SpecStyle::Relaxing { cpu_aware: true };
        // The shipped model's classes (deploy/sim/speed-model.toml).
        let classes = ["cnn-imagenet", "cnn-small", "language", "default", "inception-like"];
        for (gpus, lossy_shape) in [(1, (1, 1)), (4, (1, 4)), (8, (1, 8)), (16, (2, 8)), (24, (3, 8))] {
            for class in classes.iter().map(|c| builtin.class_of_model(c)) {
                let slowdown = builtin.slowdown_of(class);
                let spec = style.spec(&job(gpus), 1.0, &slowdown, topos);
                let expected = if loses_nothing_anywhere(&slowdown) { (gpus, 1) } else { lossy_shape };
                assert_eq!((spec.members, spec.gpus_per_member), expected, "{gpus} GPUs, class {class}");
            }
            let spec = style.spec(&job(gpus), 1.0, &ideal.slowdown_of(0), topos);
            assert_eq!((spec.members, spec.gpus_per_member), (gpus, 1), "{gpus} GPUs under ideal");
            assert_eq!(spec.prefer, preferred_level(gpus, topos), "it still prefers its tightest group");
        }
        // The measured classes lose something across servers; only the insensitive one spreads.
        let lossless: Vec<&str> = classes
            .into_iter()
            .filter(|c| loses_nothing_anywhere(&builtin.slowdown_of(builtin.class_of_model(c))))
            .collect();
        assert_eq!(lossless, ["inception-like"]);
        // A spec that declares no losses at all says nothing about spreading: per server.
        assert!(!loses_nothing_anywhere(&BTreeMap::new()));
        let plain = style.spec(&job(8), 1.0, &BTreeMap::new(), topos);
        assert_eq!((plain.members, plain.gpus_per_member), (1, 8));
        // Other styles keep their shapes whatever the losses.
        let cell = SpecStyle::Cell.spec(&job(8), 1.0, &ideal.slowdown_of(0), topos);
        assert_eq!((cell.members, cell.gpus_per_member), (1, 8));
    }

    #[test]
    fn a_cpu_aware_spec_wants_theta_but_never_needs_more_than_the_share() {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let share = topo.cores() / topo.devices;
        let style = SpecStyle::Relaxing { cpu_aware: true };
        for (theta, min) in [(19.0, share), (11.0, share), (2.0, 2), (0.5, 1)] {
            let spec = style.spec(&job(2), theta, &BTreeMap::new(), std::slice::from_ref(&topo));
            let CpuDemand::Predicted { predictor, min_cores_per_gpu } = spec.cpu else { panic!("predicted") };
            assert_eq!(min_cores_per_gpu, min, "θ = {theta}");
            assert_eq!(predictor.theta, theta.max(1.0));
        }
        let plain =
            SpecStyle::Relaxing { cpu_aware: false }.spec(&job(2), 19.0, &BTreeMap::new(), std::slice::from_ref(&topo));
        assert!(!matches!(plain.cpu, CpuDemand::Predicted { .. }));
    }
}
