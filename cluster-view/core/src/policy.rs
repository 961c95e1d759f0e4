//! Cluster policy changed on a running cluster: tenants' GPU quotas and priority classes, as
//! replicated commands ([`crate::Command::SetQuota`], [`crate::Command::SetPriorityClass`]) an
//! admin sends, applied alike on every replica.
//!
//! A tenant's quota bounds the GPUs its placed gangs hold. A *class quota* bounds the GPUs it
//! holds at a priority class's priority and above: `vision` at `production` ≤ 8 lets it hold 8
//! GPUs at priority 100 or more, whatever else its plain quota allows. Counting from the class
//! up, by priority rather than by the name a job gave, is what makes the bound hold: a job that
//! names no class but the same number is counted, and a higher class cannot be used to go
//! around a lower one's bound. It bounds what a tenant can displace, since a job preempts only
//! jobs it outranks. A class quota binds new placements as a quota does, reads the class's
//! priority in force, and goes with the class when the class is removed.
//!
//! The cluster spec gives the starting values; these commands change them afterwards. What a
//! change does to jobs already in the view:
//! - a quota binds new placements only: jobs holding GPUs keep them (no eviction), and a tenant
//!   above a lowered quota places nothing until its jobs end. Submissions are checked against
//!   the quota in force when they arrive (the never-fits memo is dropped on every change);
//! - a class's priority is resolved when a job is admitted, so a change applies to jobs
//!   submitted afterwards; admitted jobs keep theirs.
//!
//! Neither travels in deltas, so a change resets the change log, as a layout change does: every
//! watcher behind it reads a snapshot with the new policy.

use crate::error::ViewError;
use crate::priority::MAX_CLASSES;
use crate::view::ClusterView;
use std::collections::BTreeMap;

/// Most tenants with a quota.
pub const MAX_QUOTAS: usize = 4096;

/// Most class quotas, over every tenant.
pub const MAX_CLASS_QUOTAS: usize = 4096;

/// Longest tenant or class name, in characters (at most 256 bytes).
pub const MAX_POLICY_NAME: usize = 64;

/// Largest GPU quota a request may set (a million GPUs: beyond any cluster; remove the quota
/// for no bound). Checked at the edges.
pub const MAX_QUOTA_GPUS: u32 = 1 << 20;

/// A tenant or class name a policy command may name: 1 to [`MAX_POLICY_NAME`] characters, no
/// whitespace or control characters (`what` names it in the refusal). The view checks it at
/// apply; the edges check it first, to answer a malformed request as such.
pub fn check_name(what: &str, name: &str) -> Result<(), ViewError> {
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_POLICY_NAME || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ViewError::Policy(format!(
            "{what} `{name}`: 1 to {MAX_POLICY_NAME} characters without spaces or control characters"
        )));
    }
    Ok(())
}

impl ClusterView {
    /// Sets tenant `tenant`'s quota to `gpus` GPUs, or removes it (`None`: no bound).
    pub fn set_quota(&mut self, tenant: &str, gpus: Option<u32>) -> Result<(), ViewError> {
        check_name("tenant", tenant)?;
        match gpus {
            Some(g) => {
                if !self.quotas.contains_key(tenant) && self.quotas.len() >= MAX_QUOTAS {
                    return Err(ViewError::Policy(format!("at most {MAX_QUOTAS} tenants have quotas")));
                }
                if self.quotas.get(tenant) == Some(&g) {
                    return Ok(());
                }
                self.bump();
                self.quotas.insert(tenant.to_string(), g);
            }
            None => {
                if self.quotas.remove(tenant).is_none() {
                    return Ok(());
                }
                self.bump();
            }
        }
        self.readers_take_snapshots();
        Ok(())
    }

    /// Sets tenant `tenant`'s quota at class `class` and above to `gpus` GPUs, or removes it
    /// (`None`). The class must exist.
    pub fn set_class_quota(&mut self, tenant: &str, class: &str, gpus: Option<u32>) -> Result<(), ViewError> {
        check_name("tenant", tenant)?;
        check_name("priority class", class)?;
        let current = self.class_quotas.get(tenant).and_then(|c| c.get(class)).copied();
        match gpus {
            Some(g) => {
                self.priorities.resolve(class).map_err(ViewError::Policy)?;
                let count: usize = self.class_quotas.values().map(BTreeMap::len).sum();
                if current.is_none() && count >= MAX_CLASS_QUOTAS {
                    return Err(ViewError::Policy(format!("at most {MAX_CLASS_QUOTAS} class quotas")));
                }
                if current == Some(g) {
                    return Ok(());
                }
                self.bump();
                self.class_quotas.entry(tenant.to_string()).or_default().insert(class.to_string(), g);
            }
            None => {
                if current.is_none() {
                    return Ok(());
                }
                self.bump();
                self.drop_class_quota(tenant, class);
            }
        }
        self.readers_take_snapshots();
        Ok(())
    }

    fn drop_class_quota(&mut self, tenant: &str, class: &str) {
        if let Some(classes) = self.class_quotas.get_mut(tenant) {
            classes.remove(class);
            if classes.is_empty() {
                self.class_quotas.remove(tenant);
            }
        }
    }

    /// Tenants' quotas at a class and above: tenant → class → GPUs.
    pub fn class_quotas(&self) -> &BTreeMap<String, BTreeMap<String, u32>> {
        &self.class_quotas
    }

    /// The class quotas of `tenant` that bind a job of priority `priority`: those of its class
    /// and of the classes below it, as (class, the class's priority, GPUs).
    pub fn class_limits(&self, tenant: &str, priority: i32) -> impl Iterator<Item = (&str, i32, u32)> + '_ {
        let classes = self.class_quotas.get(tenant).into_iter().flatten();
        classes
            .filter_map(|(c, &q)| self.priorities.classes.get(c).map(|&p| (c.as_str(), p, q)))
            .filter(move |&(_, p, _)| priority >= p)
    }

    /// GPUs `tenant`'s placed gangs hold at priority `floor` and above.
    pub fn held_at_or_above(&self, tenant: &str, floor: i32) -> u32 {
        self.rank_used.get(tenant).map_or(0, |by| by.range(floor..).map(|(_, g)| g).sum())
    }

    /// Counts `gpus` placed for `tenant` at `priority`.
    pub(crate) fn hold_rank(&mut self, tenant: &str, priority: i32, gpus: u32) {
        // The approver's hot path: a tenant's name is copied only the first time it holds GPUs.
        if !self.rank_used.contains_key(tenant) {
            self.rank_used.insert(tenant.to_string(), BTreeMap::new());
        }
        if let Some(by) = self.rank_used.get_mut(tenant) {
            *by.entry(priority).or_default() += gpus;
        }
    }

    /// Counts `gpus` of `tenant` at `priority` released.
    pub(crate) fn unhold_rank(&mut self, tenant: &str, priority: i32, gpus: u32) {
        let Some(by) = self.rank_used.get_mut(tenant) else { return };
        if let Some(g) = by.get_mut(&priority) {
            *g = g.saturating_sub(gpus);
            if *g == 0 {
                by.remove(&priority);
            }
        }
        if by.is_empty() {
            self.rank_used.remove(tenant);
        }
    }

    /// Sets priority class `class` to `priority`, adding it if new, or removes it (`None`; the
    /// last class cannot be removed, and its class quotas go with it). Jobs admitted afterwards
    /// resolve the class anew.
    pub fn set_priority_class(&mut self, class: &str, priority: Option<i32>) -> Result<(), ViewError> {
        check_name("priority class", class)?;
        let classes = &self.priorities.classes;
        match priority {
            Some(p) => {
                if !classes.contains_key(class) && classes.len() >= MAX_CLASSES {
                    return Err(ViewError::Policy(format!("at most {MAX_CLASSES} priority classes")));
                }
                if classes.get(class) == Some(&p) {
                    return Ok(());
                }
                self.bump();
                self.priorities.classes.insert(class.to_string(), p);
            }
            None => {
                if !classes.contains_key(class) {
                    return Ok(());
                }
                if classes.len() == 1 {
                    return Err(ViewError::Policy(format!("`{class}` is the last priority class; add another first")));
                }
                self.bump();
                self.priorities.classes.remove(class);
                let tenants: Vec<String> = self.class_quotas.keys().cloned().collect();
                for t in tenants {
                    self.drop_class_quota(&t, class);
                }
            }
        }
        self.readers_take_snapshots();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
