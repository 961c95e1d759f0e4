//! [`LocalityTolerant`]: the host's default scheduler.

use super::{Attempt, Scheduler, Verdict, no_fit, proportional_share, sweet_cores, with_cores};
use crate::placement_policy::Policy;
use crate::search::find_placement;
use tessera_view::CpuDemand;

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

    fn decides_by_shape(&self) -> bool {
        true
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
