//! [`Hived`]: HiveD's buddy-cell allocation (Zhao et al., OSDI 2020) as a scheduler.

use super::{Attempt, Scheduler, Verdict, no_fit};
use crate::search::find_placement;
use tessera_view::fit::FitMode;

/// Buddy cells: the job gets a group of the level it tolerates (HiveD's cell for its size —
/// the simulator's `hived` preset writes `prefer = tolerate = ` that cell), best fit, and waits
/// rather than take a looser one. No relaxing over time: a cell is a guarantee, not a wish.
#[derive(Clone, Debug, Default)]
pub struct Hived;

impl Scheduler for Hived {
    fn name(&self) -> &str {
        "hived"
    }

    fn decides_by_shape(&self) -> bool {
        true
    }

    fn schedule(&self, a: &Attempt<'_>) -> Verdict {
        let spec = &a.job.spec;
        match find_placement(a.view, a.overlay, spec, spec.tolerate, FitMode::Pack, a.salt) {
            Ok(f) => Verdict::Propose(f.members),
            Err(e) => no_fit(a, e),
        }
    }
}
