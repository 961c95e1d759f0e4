//! Cluster policy changed on a running cluster: tenants' GPU quotas and priority classes, as
//! replicated commands ([`crate::Command::SetQuota`], [`crate::Command::SetPriorityClass`]) an
//! admin sends, applied alike on every replica.
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

/// Most tenants with a quota.
pub const MAX_QUOTAS: usize = 4096;

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

    /// Sets priority class `class` to `priority`, adding it if new, or removes it (`None`; the
    /// last class cannot be removed). Jobs admitted afterwards resolve the class anew.
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
            }
        }
        self.readers_take_snapshots();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
