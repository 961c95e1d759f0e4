//! Priority classes and the preemption bound: the cluster-wide rules that decide who may take
//! whose GPUs.
//!
//! A job names a class (`priority = "production"` in its file) or a number. The class is
//! resolved to its number when the view admits the job ([`Priorities::resolve`]), on every
//! replica alike, so a job's priority never changes once admitted. A preemption
//! ([`crate::preemption`]) may take the GPUs of jobs of strictly lower priority only, and never
//! of a job already preempted [`Priorities::max_preemptions`] times (a starvation bound).
//!
//! Within one priority, a cluster may order jobs by the service they attained instead of by
//! arrival: Tiresias' discretized two-dimensional least-attained-service, which needs no job
//! durations. [`Priorities::attained_service_gpu_s`] lists the thresholds; a job that has held
//! GPUs for at least the `k`-th one (GPU-seconds over all its runs) is in queue `k`, and a job
//! of a lower queue ranks above it ([`crate::Job::rank`]): it is offered first and may preempt
//! it. Within a queue, waiting jobs are offered least GPU time attained first, and only a lower
//! queue preempts ([`crate::ClusterView::queue_key`]). The view moves running jobs down the
//! queues itself as its clock passes each threshold (see [`crate::attained`]), on every replica
//! alike. Without thresholds (the default) every job stays in queue 0: arrival order within a
//! priority.
//!
//! ```toml
//! [priorities]                   # in the cluster spec; optional, these are the defaults
//! classes = { production = 100, batch = 50, best-effort = 0 }
//! max_preemptions = 3
//! attained_service_gpu_s = []    # e.g. [3600, 36000]: queues after 1 and 10 GPU-hours
//! ```

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The default starvation bound: a job preempted this many times is not preempted again.
pub const DEFAULT_MAX_PREEMPTIONS: u32 = 3;
/// The most priority classes a cluster may name.
pub const MAX_CLASSES: usize = 64;
/// The most attained-service thresholds (queues: one more).
pub const MAX_SERVICE_THRESHOLDS: usize = 8;

/// A cluster's priority classes and preemption bound. Part of the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Priorities {
    /// Class name → priority (higher runs first and may preempt lower).
    pub classes: BTreeMap<String, i32>,
    /// A job preempted this many times is not preempted again (0 turns preemption off).
    pub max_preemptions: u32,
    /// Attained-service thresholds, GPU-seconds, strictly ascending: a job that has held GPUs
    /// for at least the `k`-th is in queue `k` (empty: every job in queue 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attained_service_gpu_s: Vec<u64>,
}

impl Default for Priorities {
    /// `production` 100 > `batch` 50 > `best-effort` 0, at most 3 preemptions per job.
    fn default() -> Self {
        let classes = [("production", 100), ("batch", 50), ("best-effort", 0)];
        Priorities {
            classes: classes.into_iter().map(|(n, p)| (n.to_string(), p)).collect(),
            max_preemptions: DEFAULT_MAX_PREEMPTIONS,
            attained_service_gpu_s: Vec::new(),
        }
    }
}

impl Priorities {
    /// The priority of `class`, or the classes there are (for the error) when it is unknown.
    pub fn resolve(&self, class: &str) -> Result<i32, String> {
        self.classes.get(class).copied().ok_or_else(|| {
            let known: Vec<String> = self.classes.iter().map(|(n, p)| format!("{n} ({p})")).collect();
            format!("unknown priority class `{class}`; this cluster has: {}", known.join(", "))
        })
    }

    /// The attained-service queue of a job that has held `gpu_ms` GPU-milliseconds: how many
    /// thresholds it reached.
    pub fn service_queue(&self, gpu_ms: u64) -> u8 {
        let reached = self.attained_service_gpu_s.iter().take_while(|&&t| gpu_ms >= t.saturating_mul(1000)).count();
        u8::try_from(reached).unwrap_or(u8::MAX)
    }

    /// The first threshold above `gpu_ms`, in GPU-milliseconds (none past the last).
    pub fn next_service_threshold_ms(&self, gpu_ms: u64) -> Option<u64> {
        self.attained_service_gpu_s.iter().map(|t| t.saturating_mul(1000)).find(|&t| t > gpu_ms)
    }

    /// Checks the table: 1..=[`MAX_CLASSES`] classes, names non-empty and free of spaces; at
    /// most [`MAX_SERVICE_THRESHOLDS`] attained-service thresholds, positive and strictly
    /// ascending. Errors name the offending key, as `classes.NAME`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let t = &self.attained_service_gpu_s;
        if t.len() > MAX_SERVICE_THRESHOLDS {
            return Err((
                "attained_service_gpu_s".into(),
                format!("at most {MAX_SERVICE_THRESHOLDS} thresholds, got {}", t.len()),
            ));
        }
        if t.first().is_some_and(|&f| f == 0) || t.windows(2).any(|w| w[0] >= w[1]) {
            return Err((
                "attained_service_gpu_s".into(),
                "thresholds are GPU-seconds above 0, strictly ascending".into(),
            ));
        }
        if self.classes.is_empty() {
            return Err(("classes".into(), "at least one class is required".into()));
        }
        if self.classes.len() > MAX_CLASSES {
            return Err(("classes".into(), format!("at most {MAX_CLASSES} classes, got {}", self.classes.len())));
        }
        for name in self.classes.keys() {
            if name.trim().is_empty() || name.chars().any(char::is_whitespace) {
                return Err((format!("classes.{name}"), "a class name must be non-empty, without spaces".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_resolve_and_unknown_ones_list_the_known() {
        let p = Priorities::default();
        assert_eq!(p.resolve("production"), Ok(100));
        assert_eq!(p.resolve("best-effort"), Ok(0));
        let e = p.resolve("urgent").expect_err("unknown");
        assert!(e.contains("`urgent`") && e.contains("batch (50)"), "{e}");
        assert!(p.validate().is_ok());
        let bad = Priorities { classes: BTreeMap::from([("a b".to_string(), 1)]), ..Priorities::default() };
        assert_eq!(bad.validate().expect_err("space").0, "classes.a b");
        assert!(Priorities { classes: BTreeMap::new(), ..Priorities::default() }.validate().is_err());
    }

    #[test]
    fn attained_service_thresholds_make_queues() {
        let p = Priorities { attained_service_gpu_s: vec![10, 100], ..Priorities::default() };
        assert!(p.validate().is_ok());
        for (gpu_ms, queue, next) in [
            (0, 0, Some(10_000)),
            (9_999, 0, Some(10_000)),
            (10_000, 1, Some(100_000)),
            (99_999, 1, Some(100_000)),
            (100_000, 2, None),
            (u64::MAX, 2, None),
        ] {
            assert_eq!((p.service_queue(gpu_ms), p.next_service_threshold_ms(gpu_ms)), (queue, next), "{gpu_ms}");
        }
        // Without thresholds every job is in queue 0 and never moves.
        let fifo = Priorities::default();
        assert_eq!((fifo.service_queue(u64::MAX), fifo.next_service_threshold_ms(0)), (0, None));
        for bad in [vec![0], vec![10, 10], vec![100, 10], (1..=9).collect()] {
            let p = Priorities { attained_service_gpu_s: bad.clone(), ..Priorities::default() };
            assert_eq!(p.validate().expect_err("refused").0, "attained_service_gpu_s", "{bad:?}");
        }
    }
}
