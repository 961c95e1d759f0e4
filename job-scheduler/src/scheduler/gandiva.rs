//! [`Gandiva`]: Gandiva's affinity packing (Xiao et al., OSDI 2018) as a scheduler.

use super::{Attempt, Scheduler, Verdict, no_fit, no_such_type};
use crate::search::{find_placement, plan_on_server};
use tessera_view::fit::{self, FitMode};
use tessera_view::{LocalityLevel, MemberPlacement, ServerId};

/// Affinity: a one-server job goes first to servers that run only jobs of its own size, then to
/// empty servers, then to any; within a class the tightest level, then the fullest server (so
/// same-size jobs share servers and large jobs find whole servers free). A job larger than a
/// server takes the tightest group within its tolerance, packed. Migration, Gandiva's other
/// half, is the host's ([`crate::MigrationConfig`]; the simulator's `gandiva` preset turns it on).
///
/// Needs the jobs running per server ([`super::Context::running`]); with none known every
/// server counts as empty.
#[derive(Clone, Debug, Default)]
pub struct Gandiva;

/// What a server runs, for the affinity classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affinity {
    /// No job.
    Empty,
    /// Only jobs of this many GPUs.
    Size(u32),
    /// Jobs of several sizes.
    Mixed,
}

impl Affinity {
    /// The affinity of server `s` in `a`'s context.
    pub fn of(a: &Attempt<'_>, s: ServerId) -> Affinity {
        let on = a.ctx.running.on(s);
        match on.first() {
            None => Affinity::Empty,
            Some(f) if on.iter().all(|r| r.gpus == f.gpus) => Affinity::Size(f.gpus),
            Some(_) => Affinity::Mixed,
        }
    }
}

impl Scheduler for Gandiva {
    fn name(&self) -> &str {
        "gandiva"
    }

    fn decides_by_shape(&self) -> bool {
        true
    }

    fn schedule(&self, a: &Attempt<'_>) -> Verdict {
        let spec = &a.job.spec;
        if spec.members != 1 {
            return match find_placement(a.view, a.overlay, spec, spec.tolerate, FitMode::Pack, a.salt) {
                Ok(f) => Verdict::Propose(f.members),
                Err(e) => no_fit(a, e),
            };
        }
        if let Some(v) = no_such_type(a) {
            return v;
        }
        match by_affinity(a) {
            Some(members) => Verdict::Propose(members),
            None => Verdict::Wait(format!("no server has {} free GPUs together now", spec.total_gpus())),
        }
    }
}

/// The best server by (affinity class, level, free GPUs), planned as one member.
fn by_affinity(a: &Attempt<'_>) -> Option<Vec<MemberPlacement>> {
    let spec = &a.job.spec;
    let g = spec.total_gpus();
    let mut best: Option<((u8, LocalityLevel, u32), Vec<MemberPlacement>)> = None;
    for (i, rec) in a.view.servers().iter().enumerate() {
        let s = ServerId(i as u32);
        let rec = a.overlay.get(s).unwrap_or(rec);
        let free = rec.free_gpus.count_ones();
        if free < g {
            continue;
        }
        let class = match Affinity::of(a, s) {
            Affinity::Size(n) if n == g => 0,
            Affinity::Empty => 1,
            _ => 2,
        };
        if best.as_ref().is_some_and(|(k, _)| k.0 < class) {
            continue;
        }
        let topo = a.view.topology_of(rec.config_set);
        if spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type) {
            continue;
        }
        let req = fit::member_request(spec, topo);
        let Some(ms) = plan_on_server(topo, rec, s, &req, 1, LocalityLevel::Server, FitMode::Pack) else { continue };
        let key = (class, topo.level_of(ms.iter().fold(0, |acc, m| acc | m.gpus)), free);
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((key, ms));
        }
    }
    best.map(|(_, ms)| ms)
}
