//! [`CpuAware`]: cores per GPU sized from the job's predictor.

use super::{Attempt, Scheduler, Verdict, no_fit, sweet_cores, with_cores};
use crate::placement_policy::Policy;
use crate::search::find_placement;
use tessera_view::{CpuDemand, MemberPlacement};

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

    fn decides_by_shape(&self) -> bool {
        true
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
