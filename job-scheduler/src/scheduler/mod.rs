//! The [`Scheduler`] trait and the built-in schedulers.
//!
//! A scheduler is the policy of one job: given the job, the current copy of the view and how
//! long the job has waited, it proposes a whole gang, asks to wait, or gives up. The
//! [`runtime`](crate::runtime) does everything else (proposing, learning from rejections,
//! retrying with backoff, relaxing locality over time), so a scheduler is a pure function of
//! what it is shown and is tested without a cluster. The simulator ([`crate::sim`]) calls the
//! same schedulers, so what `tessera sim` measures is the code a host runs.
//!
//! Built in, one file each:
//!
//! | name | [`Scheduler`] | what it does |
//! |---|---|---|
//! | `locality-tolerant` | [`LocalityTolerant`] | tightest locality within the job's current tolerance; spreads small jobs under light load, packs otherwise ([`Policy`](crate::Policy)); grants a fixed share of cores per GPU |
//! | `cpu-aware` | [`CpuAware`] | as `locality-tolerant`, but sizes cores per GPU from the job's predictor: the sweet point θ where a server has it, fewer (down to the job's minimum) only where none has |
//! | `optimus` | [`Optimus`] | parameter-server/worker jobs: the fewest servers, the same number of members on each |
//! | `fifo-firstfit` | [`FifoFirstFit`] | a GPU-count scheduler's baseline: each member on the lowest-numbered server with room, no topology |
//! | `gandiva` | [`Gandiva`] | Gandiva's affinity: servers running jobs of the same size first, then empty ones (needs [`Context::running`]) |
//! | `hived` | [`Hived`] | HiveD's buddy cells: a group of the level the job tolerates, best fit, never looser |
//!
//! `default`, the name `locality-tolerant` had before, is still accepted wherever a scheduler
//! is named (job files, `--default-scheduler`): see [`ALIASES`].

mod context;
mod cpu_aware;
mod fifo_first_fit;
mod gandiva;
mod hived;
mod locality_tolerant;
mod optimus;

pub use context::{Context, Running, RunningIndex};
pub use cpu_aware::CpuAware;
pub use fifo_first_fit::FifoFirstFit;
pub use gandiva::{Affinity, Gandiva};
pub use hived::Hived;
pub use locality_tolerant::LocalityTolerant;
pub use optimus::Optimus;

use crate::local_view::{LocalView, Overlay};
use tessera_view::{CpuDemand, Job, JobSpec, LocalityLevel, MemberPlacement};

/// What a scheduler is shown for one attempt.
#[derive(Debug)]
pub struct Attempt<'a> {
    /// The job.
    pub job: &'a Job,
    /// The scheduler's copy of the view.
    pub view: &'a LocalView,
    /// Fresher server records learned from rejections, not yet in the copy.
    pub overlay: &'a Overlay,
    /// The loosest level the job accepts now (its `prefer`, relaxed by `relax_after_s` steps).
    pub allowed: LocalityLevel,
    /// Seconds the job has waited so far.
    pub waited_s: u64,
    /// Attempts made before this one.
    pub attempt: u32,
    /// Differs between schedulers reading the same view, so they choose different servers.
    pub salt: u64,
    /// What the host knows beyond the server records (the jobs running on each server).
    pub ctx: Context<'a>,
}

/// A scheduler's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Propose this gang (members in rank order).
    Propose(Vec<MemberPlacement>),
    /// Nothing suitable now; try again when the view changes or the tolerance relaxes.
    Wait(String),
    /// The job can never be placed; the runtime cancels it with this reason.
    GiveUp(String),
    /// Place this gang on resources the `victims` hold now: the runtime sends one
    /// [`tessera_view::Preemption`], which the approver applies whole (every victim re-queued,
    /// the gang placed) or refuses. Each victim must rank below the job and be needed by the gang
    /// ([`crate::preemption::choose_victims`] picks such a set).
    Preempt {
        /// The gang, members in rank order.
        members: Vec<MemberPlacement>,
        /// The jobs it displaces.
        victims: Vec<tessera_view::JobId>,
    },
}

/// The policy of one job. Implementations must be cheap to call: the runtime calls
/// [`Scheduler::schedule`] after every change of the view while the job waits.
pub trait Scheduler: Send + Sync + std::fmt::Debug {
    /// The name jobs ask for in their `scheduler` field.
    fn name(&self) -> &str;
    /// Proposes a gang for `a.job`, or says why not.
    fn schedule(&self, a: &Attempt<'_>) -> Verdict;
    /// Whether the verdict depends only on the job's shape (members, GPUs per member, allowed
    /// level, CPU and memory demand, GPU type) and the view, up to the probe order the salt
    /// picks. A host that asks many waiting jobs in one pass may then skip the jobs whose
    /// shape already had to wait in that pass (the simulator does). The default, `false`, is
    /// always safe: a scheduler that looks at the job's id, priority, tenant or waiting time
    /// must keep it.
    fn decides_by_shape(&self) -> bool {
        false
    }
}

/// Gives up when no server of the cluster has the job's GPU type (no search can succeed).
fn no_such_type(a: &Attempt<'_>) -> Option<Verdict> {
    let t = a.job.spec.gpu_type.as_ref()?;
    if a.view.topologies().iter().any(|topo| topo.device_type == *t) {
        return None;
    }
    Some(Verdict::GiveUp(format!("no server in the cluster has GPU type `{t}`")))
}

/// Why no search could ever succeed, from the search's own error.
fn no_fit(a: &Attempt<'_>, e: crate::NoPlacement) -> Verdict {
    match e {
        crate::NoPlacement::NoSuchType(t) => Verdict::GiveUp(format!("no server in the cluster has GPU type `{t}`")),
        crate::NoPlacement::NoFit { allowed } => Verdict::Wait(format!(
            "no free {} GPU{} within {allowed} now (waited {} s)",
            a.job.spec.total_gpus(),
            if a.job.spec.total_gpus() == 1 { "" } else { "s" },
            a.waited_s
        )),
    }
}

/// The fewest cores per GPU any server of the job's type would grant as its share.
fn proportional_share(view: &LocalView, spec: &JobSpec) -> u32 {
    view.topologies()
        .iter()
        .filter(|t| spec.gpu_type.as_ref().is_none_or(|w| *w == t.device_type))
        .map(|t| (t.cores() / t.devices.max(1)).max(1))
        .min()
        .unwrap_or(1)
}

/// Cores per GPU at the predictor's sweet point θ (never below the job's minimum): the most a
/// predicted job accepts, as `fit::member_request` counts it.
fn sweet_cores(p: tessera_view::Predictor, min_cores_per_gpu: u32) -> u32 {
    (p.theta.ceil() as u32).max(min_cores_per_gpu)
}

/// The job's spec with its CPU demand pinned to `cores_per_gpu` (within what it accepts).
fn with_cores(spec: &JobSpec, cores_per_gpu: u32) -> JobSpec {
    JobSpec { cpu: CpuDemand::Fixed { cores_per_gpu }, ..spec.clone() }
}

/// The built-in schedulers by name (an alias in [`ALIASES`] included).
pub fn builtin(name: &str) -> Option<Box<dyn Scheduler>> {
    match canonical_name(name) {
        "locality-tolerant" => Some(Box::new(LocalityTolerant::default())),
        "cpu-aware" => Some(Box::new(CpuAware::default())),
        "optimus" => Some(Box::new(Optimus)),
        "fifo-firstfit" => Some(Box::new(FifoFirstFit)),
        "gandiva" => Some(Box::new(Gandiva)),
        "hived" => Some(Box::new(Hived)),
        _ => None,
    }
}

/// Names of the built-in schedulers.
pub const BUILTIN: [&str; 6] = ["locality-tolerant", "cpu-aware", "optimus", "fifo-firstfit", "gandiva", "hived"];

/// Old names of built-in schedulers, still accepted so that job files and scripts written
/// before a rename keep working: (old, current). `default` was [`LocalityTolerant`]'s name; it
/// names that scheduler, not whichever one a host uses for jobs that name none.
pub const ALIASES: [(&str, &str); 1] = [("default", "locality-tolerant")];

/// The current name for `name`: itself, or what an old name in [`ALIASES`] is called now.
pub fn canonical_name(name: &str) -> &str {
    ALIASES.iter().find(|(old, _)| *old == name).map_or(name, |(_, new)| new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_found_by_its_own_name_and_every_alias_by_its_old_one() {
        for name in BUILTIN {
            assert_eq!(builtin(name).map(|s| s.name().to_string()).as_deref(), Some(name));
            assert_eq!(canonical_name(name), name);
        }
        for (old, new) in ALIASES {
            assert!(BUILTIN.contains(&new), "{old} → {new}");
            assert!(!BUILTIN.contains(&old), "an alias is no current name: {old}");
            assert_eq!(builtin(old).map(|s| s.name().to_string()).as_deref(), Some(new));
        }
        assert_eq!(LocalityTolerant::default().name(), "locality-tolerant");
        assert!(builtin("no-such").is_none());
    }
}
