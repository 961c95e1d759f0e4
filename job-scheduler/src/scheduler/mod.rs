//! The [`Scheduler`] trait and the built-in schedulers.
//!
//! A scheduler is the policy of one job: given the job, the current copy of the view and how
//! long the job has waited, it proposes a whole gang, asks to wait, or gives up. The
//! [`runtime`](crate::runtime) does everything else (proposing, learning from rejections,
//! retrying with backoff, relaxing locality over time), so a scheduler is a pure function of
//! what it is shown and is tested without a cluster.
//!
//! Built in:
//!
//! | name | [`Scheduler`] | what it does |
//! |---|---|---|
//! | `locality-tolerant` | [`LocalityTolerant`] | tightest locality within the job's current tolerance; spreads small jobs under light load, packs otherwise ([`Policy`]); grants a fixed share of cores per GPU |
//! | `cpu-aware` | [`CpuAware`] | as `locality-tolerant`, but sizes cores per GPU from the job's predictor: the sweet point θ where a server has it, fewer (down to the job's minimum) only where none has |
//! | `optimus` | [`Optimus`] | parameter-server/worker jobs: the fewest servers, the same number of members on each |
//!
//! `default`, the name `locality-tolerant` had before, is still accepted wherever a scheduler
//! is named (job files, `--default-scheduler`): see [`ALIASES`].

use crate::local_view::{LocalView, Overlay};
use crate::placement_policy::Policy;
use crate::search::{find_placement, plan_on_server};
use std::collections::HashMap;
use tessera_view::fit::{FitMode, member_request};
use tessera_view::{CpuDemand, Job, JobSpec, LocalityLevel, MemberPlacement, ServerId};

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
}

/// The policy of one job. Implementations must be cheap to call: the runtime calls
/// [`Scheduler::schedule`] after every change of the view while the job waits.
pub trait Scheduler: Send + Sync + std::fmt::Debug {
    /// The name jobs ask for in their `scheduler` field.
    fn name(&self) -> &str;
    /// Proposes a gang for `a.job`, or says why not.
    fn schedule(&self, a: &Attempt<'_>) -> Verdict;
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

/// The host's default scheduler (`locality-tolerant`): the tightest locality the job accepts
/// now, spread or pack by load.
#[derive(Clone, Debug, Default)]
pub struct LocalityTolerant {
    /// Spread or pack.
    pub policy: Policy,
}

impl Scheduler for LocalityTolerant {
    fn name(&self) -> &str {
        "locality-tolerant"
    }

    fn schedule(&self, a: &Attempt<'_>) -> Verdict {
        let spec = &a.job.spec;
        // A predicted demand gets a fixed share, as a GPU-count scheduler would grant: the
        // server's cores divided among its GPUs, within what the job accepts.
        let spec = match spec.cpu {
            CpuDemand::Predicted { predictor, min_cores_per_gpu } => with_cores(
                spec,
                proportional_share(a.view, spec).clamp(min_cores_per_gpu, sweet_cores(predictor, min_cores_per_gpu)),
            ),
            _ => spec.clone(),
        };
        let mode = self.policy.mode(a.view, &spec);
        match find_placement(a.view, a.overlay, &spec, a.allowed, mode, a.salt) {
            Ok(f) => Verdict::Propose(f.members),
            Err(e) => no_fit(a, e),
        }
    }
}

/// CPU-aware: the job's predictor decides the cores, not a fixed share.
///
/// Input-bound models need up to 22 cores per GPU for full speed and others one, so a fixed
/// share starves some jobs and wastes cores on others. This scheduler first looks for a
/// placement that grants the predictor's sweet point θ per GPU; if no server can spare that
/// many cores next to free GPUs (after keeping the share of its other free GPUs), it takes
/// what the job accepts (down to `min_cores_per_gpu`) rather than wait. Jobs without a
/// predictor are placed as by [`LocalityTolerant`].
#[derive(Clone, Debug, Default)]
pub struct CpuAware {
    /// Spread or pack.
    pub policy: Policy,
}

impl Scheduler for CpuAware {
    fn name(&self) -> &str {
        "cpu-aware"
    }

    fn schedule(&self, a: &Attempt<'_>) -> Verdict {
        let spec = &a.job.spec;
        let mode = self.policy.mode(a.view, spec);
        if let CpuDemand::Predicted { predictor, min_cores_per_gpu } = spec.cpu {
            let theta = sweet_cores(predictor, min_cores_per_gpu);
            if let Ok(f) = find_placement(a.view, a.overlay, &with_cores(spec, theta), a.allowed, mode, a.salt)
                && f.members.iter().all(|m| spares(a, m))
            {
                return Verdict::Propose(f.members);
            }
        }
        match find_placement(a.view, a.overlay, spec, a.allowed, mode, a.salt) {
            Ok(f) => Verdict::Propose(f.members),
            Err(e) => no_fit(a, e),
        }
    }
}

/// Whether taking `m` leaves its server the proportional core share of each GPU that stays
/// free (the fit module's reserve rule, which a fixed grant of θ cores would bypass).
fn spares(a: &Attempt<'_>, m: &MemberPlacement) -> bool {
    let Some(rec) = a.overlay.get(m.server).or_else(|| a.view.servers().get(m.server.index())) else {
        return false;
    };
    let topo = a.view.topology_of(rec.config_set);
    let left = rec.free_cores.without(m.cores).count();
    left >= tessera_view::fit::core_reserve(topo, (rec.free_gpus & !m.gpus).count_ones())
}

/// Optimus-style placement of parameter-server/worker jobs (Peng et al., EuroSys 2018): each
/// member runs a worker and a parameter-server shard, and traffic between them is smallest
/// when the job spans the fewest servers with the same number of members on each. The
/// scheduler tries `k = 1, 2, …` servers (only counts that divide the members evenly) and
/// takes the first `k` for which `k` servers in one domain within the tolerance each have room
/// for `members / k` members. Members are numbered server by server, so ranks on one server
/// are consecutive.
#[derive(Clone, Debug, Default)]
pub struct Optimus;

impl Scheduler for Optimus {
    fn name(&self) -> &str {
        "optimus"
    }

    fn schedule(&self, a: &Attempt<'_>) -> Verdict {
        let spec = &a.job.spec;
        if spec.members == 1 {
            return LocalityTolerant { policy: Policy::Pack }.schedule(a);
        }
        let view = a.view;
        let typed = |cs: tessera_view::ConfigSetId| {
            spec.gpu_type.as_ref().is_none_or(|w| *w == view.topology_of(cs).device_type)
        };
        if !view.config_sets().iter().any(|cs| typed(cs.id)) {
            return Verdict::GiveUp(format!(
                "no server in the cluster has GPU type `{}`",
                spec.gpu_type.clone().unwrap_or_default()
            ));
        }
        for k in 1..=spec.members {
            if !spec.members.is_multiple_of(k) {
                continue;
            }
            let level = if k == 1 { LocalityLevel::Server } else { LocalityLevel::Rack };
            if k == 1 && a.allowed < LocalityLevel::Server {
                // One server is only acceptable within the tighter group the job wants.
                if let Ok(f) = find_placement(view, a.overlay, spec, a.allowed, FitMode::Pack, a.salt) {
                    return Verdict::Propose(f.members);
                }
                continue;
            }
            if level > a.allowed && k > 1 {
                break;
            }
            if let Some(m) = self.on_k_servers(a, k) {
                return Verdict::Propose(m);
            }
        }
        Verdict::Wait(format!(
            "no set of servers within {} has room for {} members of {} GPUs in equal shares",
            a.allowed, spec.members, spec.gpus_per_member
        ))
    }
}

/// A server that can take its share of a gang: its free GPUs now, and the members planned.
type Candidate = (u32, Vec<MemberPlacement>);

impl Optimus {
    /// `k` servers in one domain of the allowed level, each taking `members / k` members.
    fn on_k_servers(&self, a: &Attempt<'_>, k: u32) -> Option<Vec<MemberPlacement>> {
        let spec = &a.job.spec;
        let view = a.view;
        let per = spec.members / k;
        // Candidate servers (fullest first, to pack), grouped by the domain the level needs.
        let mut by_domain: HashMap<u32, Vec<Candidate>> = HashMap::new();
        for (i, rec) in view.servers().iter().enumerate() {
            let s = ServerId(i as u32);
            let rec = a.overlay.get(s).unwrap_or(rec);
            let cs = &view.config_sets()[rec.config_set.index()];
            let topo = view.topology_of(rec.config_set);
            if spec.gpu_type.as_ref().is_some_and(|w| *w != topo.device_type) {
                continue;
            }
            let req = member_request(spec, topo);
            let Some(m) = plan_on_server(topo, rec, s, &req, per, LocalityLevel::Server, FitMode::Pack) else {
                continue;
            };
            let domain = match a.allowed {
                l if l <= LocalityLevel::Rack => cs.rack,
                LocalityLevel::IbDomain => cs.ib_domain,
                _ => 0,
            };
            by_domain.entry(domain).or_default().push((rec.free_gpus.count_ones(), m));
        }
        let mut domains: Vec<(u32, Vec<Candidate>)> =
            by_domain.into_iter().filter(|(_, v)| v.len() >= k as usize).collect();
        // The domain with the fewest spare servers (best fit), ties by id for determinism.
        domains.sort_by_key(|(d, v)| (v.len(), *d));
        let (_, mut servers) = domains.into_iter().next()?;
        servers.sort_by_key(|(free, m)| (*free, m[0].server));
        Some(servers.into_iter().take(k as usize).flat_map(|(_, m)| m).collect())
    }
}

/// The built-in schedulers by name (an alias in [`ALIASES`] included).
pub fn builtin(name: &str) -> Option<Box<dyn Scheduler>> {
    match canonical_name(name) {
        "locality-tolerant" => Some(Box::new(LocalityTolerant::default())),
        "cpu-aware" => Some(Box::new(CpuAware::default())),
        "optimus" => Some(Box::new(Optimus)),
        _ => None,
    }
}

/// Names of the built-in schedulers.
pub const BUILTIN: [&str; 3] = ["locality-tolerant", "cpu-aware", "optimus"];

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
