//! Load-adaptive placement policy.
//!
//! Under light load, small jobs are spread (the least-loaded PCIe switch, socket and server),
//! because co-located jobs slow each other 12-40% under one PCIe switch. Under heavy load every
//! job is packed (best fit), to keep whole groups free for large, locality-sensitive jobs.
//! Large jobs are always packed.
//!
//! "Light" needs two conditions: utilization below a threshold, and enough servers still wholly
//! free. Utilization alone is not enough: spreading 1-GPU jobs over an idle cluster puts one on
//! every server at a few percent utilization and leaves no whole server for an 8-GPU job (the
//! placement benchmark showed exactly that before the reserve was added).

use crate::error::SchedulerError;
use crate::local_view::LocalView;
use tessera_view::JobSpec;
use tessera_view::fit::FitMode;

/// How to choose between spreading and packing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// Spread small jobs while utilization (of the job's GPU type) is below `spread_below` and
    /// more than `whole_free_reserve` of the servers are wholly free; pack otherwise, and always
    /// for jobs of more than `small_job_max_gpus` GPUs.
    Adaptive {
        /// Utilization (0..1) under which small jobs are spread.
        spread_below: f64,
        /// Fraction of wholly free servers kept for large jobs; spreading stops at it.
        whole_free_reserve: f64,
        /// Largest job (total GPUs) that counts as small.
        small_job_max_gpus: u32,
    },
    /// Always best fit.
    Pack,
    /// Always least loaded.
    Spread,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::Adaptive { spread_below: 0.5, whole_free_reserve: 0.5, small_job_max_gpus: 4 }
    }
}

impl Policy {
    /// The fit mode for `spec` on `view` now.
    pub fn mode(&self, view: &LocalView, spec: &JobSpec) -> FitMode {
        match *self {
            Policy::Pack => FitMode::Pack,
            Policy::Spread => FitMode::Spread,
            Policy::Adaptive { spread_below, whole_free_reserve, small_job_max_gpus } => {
                let ty = spec.gpu_type.as_deref();
                if spec.members == 1
                    && spec.total_gpus() <= small_job_max_gpus
                    && view.utilization_of_type(ty) < spread_below
                    && view.whole_free_fraction(ty) > whole_free_reserve
                {
                    FitMode::Spread
                } else {
                    FitMode::Pack
                }
            }
        }
    }

    /// Parses `adaptive`, `pack` or `spread`.
    pub fn parse(s: &str) -> Result<Policy, SchedulerError> {
        match s {
            "adaptive" => Ok(Policy::default()),
            "pack" => Ok(Policy::Pack),
            "spread" => Ok(Policy::Spread),
            _ => Err(SchedulerError::UnknownName {
                what: "policy",
                name: s.to_string(),
                expected: "adaptive, pack or spread".into(),
            }),
        }
    }
}
