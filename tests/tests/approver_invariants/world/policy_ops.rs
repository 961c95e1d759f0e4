//! Policy changes in the world: an admin sets, lowers, raises and removes tenants' quotas and
//! changes priority classes at random, on the world's own random stream (the scenario's draws
//! stay as they were). Checked against the rules of `tessera_view::policy`: the new value is in
//! force, a change to the value in force is no change, and a tenant over a lowered quota keeps
//! what it holds but never grows until it is back under.

use super::*;

impl World {
    pub(super) fn op_policy(&mut self) -> Result<()> {
        let r = &mut self.policy_rng;
        let cmd = if r.random_ratio(1, 5) {
            let class = ["batch", "urgent"][r.random_range(0..2)];
            let priority = (!r.random_ratio(1, 4)).then(|| r.random_range(-10..=200));
            Command::SetPriorityClass { class: class.into(), priority }
        } else {
            let tenant = TENANTS[r.random_range(0..TENANTS.len())];
            let held = tenant_held(&self.view, tenant);
            // Often at or under what the tenant holds: the case that must not evict.
            let gpus = match r.random_range(0..5) {
                0 => None,
                1 => Some(held.saturating_sub(r.random_range(0..=2))),
                _ => Some(r.random_range(1..=32)),
            };
            Command::SetQuota { tenant: tenant.into(), gpus }
        };
        // A quota lowered under what the tenant holds: it keeps that (checked after every
        // command from now on, this one included) and shrinks from there.
        if let Command::SetQuota { tenant, gpus: Some(q) } = &cmd {
            let held = tenant_held(&self.view, tenant);
            if held > *q {
                self.quota_grace.insert(tenant.clone(), held);
                self.stats.quota_below_held += 1;
            }
        }
        let before = self.view.clone();
        let out = self.exec(cmd.clone())?;
        let Outcome::Policy(res) = out else { bail!("{cmd:?} answered {out:?}") };
        match (&cmd, res) {
            (Command::SetQuota { tenant, gpus }, Ok(())) => {
                ensure!(self.view.quotas().get(tenant) == gpus.as_ref(), "{cmd:?} left {:?}", self.view.quotas());
                let changed = before.quotas().get(tenant) != gpus.as_ref();
                ensure!((self.view.version() != before.version()) == changed, "{cmd:?}: version vs change");
                self.stats.policy_changes += changed as u64;
            }
            (Command::SetPriorityClass { class, priority }, Ok(())) => {
                ensure!(
                    self.view.priorities().classes.get(class) == priority.as_ref(),
                    "{cmd:?} left {:?}",
                    self.view.priorities().classes
                );
                self.stats.policy_changes += (self.view.version() != before.version()) as u64;
            }
            (_, Err(e)) => {
                // The only refusal these draws can meet: removing the last class.
                ensure!(e.to_string().contains("last priority class"), "{cmd:?} refused: {e}");
                ensure!(self.view.state_hash() == before.state_hash(), "a refused {cmd:?} changed the state");
            }
            (other, _) => bail!("not a policy command: {other:?}"),
        }
        for j in before.jobs() {
            ensure!(self.view.job(j.id) == Some(j), "{} changed on {cmd:?}", j.id);
        }
        ensure!(self.view.servers() == before.servers(), "{cmd:?} changed servers");
        if self.view.version() != before.version() {
            // Deltas carry no policy: readers behind the change read a snapshot.
            self.last_layout = self.view.version();
        }
        Ok(())
    }
}
