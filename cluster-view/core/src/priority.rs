//! Priority classes and the preemption bound: the cluster-wide rules that decide who may take
//! whose GPUs.
//!
//! A job names a class (`priority = "production"` in its file) or a number. The class is
//! resolved to its number when the view admits the job ([`Priorities::resolve`]), on every
//! replica alike, so a job's priority never changes once admitted. A preemption
//! ([`crate::preemption`]) may take the GPUs of jobs of strictly lower priority only, and never
//! of a job already preempted [`Priorities::max_preemptions`] times (a starvation bound).
//!
//! ```toml
//! [priorities]                   # in the cluster spec; optional, these are the defaults
//! classes = { production = 100, batch = 50, best-effort = 0 }
//! max_preemptions = 3
//! ```

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The default starvation bound: a job preempted this many times is not preempted again.
pub const DEFAULT_MAX_PREEMPTIONS: u32 = 3;
/// The most priority classes a cluster may name.
pub const MAX_CLASSES: usize = 64;

/// A cluster's priority classes and preemption bound. Part of the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Priorities {
    /// Class name → priority (higher runs first and may preempt lower).
    pub classes: BTreeMap<String, i32>,
    /// A job preempted this many times is not preempted again (0 turns preemption off).
    pub max_preemptions: u32,
}

impl Default for Priorities {
    /// `production` 100 > `batch` 50 > `best-effort` 0, at most 3 preemptions per job.
    fn default() -> Self {
        let classes = [("production", 100), ("batch", 50), ("best-effort", 0)];
        Priorities {
            classes: classes.into_iter().map(|(n, p)| (n.to_string(), p)).collect(),
            max_preemptions: DEFAULT_MAX_PREEMPTIONS,
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

    /// Checks the table: 1..=[`MAX_CLASSES`] classes, names non-empty and free of spaces.
    /// Errors name the offending key, as `classes.NAME`.
    pub fn validate(&self) -> Result<(), (String, String)> {
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
        let bad = Priorities { classes: BTreeMap::from([("a b".to_string(), 1)]), max_preemptions: 1 };
        assert_eq!(bad.validate().expect_err("space").0, "classes.a b");
        assert!(Priorities { classes: BTreeMap::new(), max_preemptions: 1 }.validate().is_err());
    }
}
