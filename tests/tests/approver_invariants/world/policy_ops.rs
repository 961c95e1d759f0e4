//! Policy changes in the world: an admin sets, lowers, raises and removes tenants' quotas and
//! class quotas and changes priority classes at random, on the world's own random stream (the
//! scenario's draws stay as they were). Checked against the rules of `tessera_view::policy`:
//! the new value is in force, a change to the value in force is no change, a class quota names
//! a class there is, and a tenant over a lowered quota (or a class quota whose class's priority
//! was lowered under jobs it holds) keeps what it holds but never grows until it is back under.
//! Credentials are revoked and taken off the list too (`tessera_view::revocation`): an entry is
//! in force until its credential expires, one already expired is refused, and entries past
//! their expiry leave the list at its next change.

use super::*;

impl World {
    pub(super) fn op_policy(&mut self) -> Result<()> {
        let r = &mut self.policy_rng;
        let cmd = if r.random_ratio(1, 6) {
            // Three credentials, so entries are replaced, removed and expire.
            let fingerprint = format!("sha256:{:064x}", r.random_range(1..=3u32));
            let now = self.view.now_ms();
            let revocation = (!r.random_ratio(1, 3)).then(|| tessera_view::Revocation {
                subject: "user/alice".into(),
                // Sometimes expired already (refused), often soon (expires under the clock).
                not_after_ms: (now + r.random_range(0..=20_000)).saturating_sub(2_000),
                note: ["", "stolen laptop"][r.random_range(0..2)].into(),
                at_ms: 0,
            });
            Command::SetRevocation { fingerprint, revocation }
        } else if r.random_ratio(1, 5) {
            let class = ["batch", "urgent"][r.random_range(0..2)];
            // Often among the jobs' own priorities (0 to 2), where class quotas bind.
            let priority = (!r.random_ratio(1, 4))
                .then(|| if r.random_bool(0.5) { r.random_range(0..=2) } else { r.random_range(-10..=200) });
            Command::SetPriorityClass { class: class.into(), priority }
        } else if r.random_ratio(1, 3) {
            let tenant = TENANTS[r.random_range(0..TENANTS.len())];
            let class = ["best-effort", "batch", "urgent", "production"][r.random_range(0..4)];
            let floor = self.view.priorities().classes.get(class).copied();
            let held = floor.map_or(0, |f| held_at_or_above(&self.view, tenant, f));
            let gpus = match r.random_range(0..5) {
                0 => None,
                1 => Some(held.saturating_sub(r.random_range(0..=2)).max(1)),
                _ => Some(r.random_range(1..=24)),
            };
            Command::SetQuota { tenant: tenant.into(), gpus, class: Some(class.into()) }
        } else {
            let tenant = TENANTS[r.random_range(0..TENANTS.len())];
            let held = tenant_held(&self.view, tenant);
            // Often at or under what the tenant holds: the case that must not evict.
            let gpus = match r.random_range(0..5) {
                0 => None,
                1 => Some(held.saturating_sub(r.random_range(0..=2))),
                _ => Some(r.random_range(1..=32)),
            };
            Command::SetQuota { tenant: tenant.into(), gpus, class: None }
        };
        // A quota lowered under what the tenant holds: it keeps that (checked after every
        // command from now on, this one included) and shrinks from there.
        if let Command::SetQuota { tenant, gpus: Some(q), class: None } = &cmd {
            let held = tenant_held(&self.view, tenant);
            if held > *q {
                self.quota_grace.insert(tenant.clone(), held);
                self.stats.quota_below_held += 1;
            }
        }
        let before = self.view.clone();
        // Class quotas the change may leave under what a tenant holds (a quota lowered, or a
        // class's priority moved under running jobs): the same grace, from before the change.
        self.grace_class_quotas(&cmd);
        let out = self.exec(cmd.clone())?;
        let Outcome::Policy(res) = out else { bail!("{cmd:?} answered {out:?}") };
        match (&cmd, res) {
            (Command::SetQuota { tenant, gpus, class: None }, Ok(())) => {
                ensure!(self.view.quotas().get(tenant) == gpus.as_ref(), "{cmd:?} left {:?}", self.view.quotas());
                let changed = before.quotas().get(tenant) != gpus.as_ref();
                ensure!((self.view.version() != before.version()) == changed, "{cmd:?}: version vs change");
                self.stats.policy_changes += changed as u64;
            }
            (Command::SetQuota { tenant, gpus, class: Some(class) }, Ok(())) => {
                let of = |v: &ClusterView| v.class_quotas().get(tenant).and_then(|c| c.get(class)).copied();
                ensure!(of(&self.view) == *gpus, "{cmd:?} left {:?}", self.view.class_quotas());
                ensure!(gpus.is_none() || before.priorities().classes.contains_key(class), "{cmd:?}: no such class");
                let changed = of(&before) != *gpus;
                ensure!((self.view.version() != before.version()) == changed, "{cmd:?}: version vs change");
                self.stats.class_quota_changes += changed as u64;
            }
            (Command::SetRevocation { fingerprint, revocation }, Ok(())) => {
                let now = self.view.now_ms();
                let changed = self.view.version() != before.version();
                match revocation {
                    Some(want) => {
                        let got = self.view.revocations().get(fingerprint);
                        ensure!(
                            got.is_some_and(|g| g.not_after_ms == want.not_after_ms && g.note == want.note),
                            "{cmd:?} left {got:?}"
                        );
                        ensure!(changed || before.revocations().get(fingerprint) == got, "{cmd:?}: version vs change");
                        ensure!(!changed || got.is_some_and(|g| g.at_ms == now), "{cmd:?}: stamped {got:?} at {now}");
                    }
                    None => ensure!(!self.view.revocations().contains_key(fingerprint), "{cmd:?} left it"),
                }
                if changed {
                    ensure!(self.view.revocations_changed() == self.view.version(), "{cmd:?}: change not marked");
                    // A change drops every entry whose credential expired.
                    ensure!(
                        self.view.revocations().values().all(|e| e.not_after_ms > now),
                        "{cmd:?} kept expired entries: {:?}",
                        self.view.revocations()
                    );
                    let pruned =
                        before.revocations().iter().filter(|(f, e)| e.not_after_ms <= now && f != &fingerprint);
                    self.stats.revocations_pruned += pruned.count() as u64;
                    self.stats.revocation_changes += 1;
                }
            }
            (Command::SetRevocation { revocation: Some(r), .. }, Err(e)) => {
                ensure!(
                    r.not_after_ms <= before.now_ms() && e.to_string().contains("refused without a revocation"),
                    "{cmd:?} refused: {e}"
                );
                ensure!(self.view.state_hash() == before.state_hash(), "a refused {cmd:?} changed the state");
                self.stats.revocations_expired += 1;
            }
            (Command::SetPriorityClass { class, priority }, Ok(())) => {
                ensure!(
                    self.view.priorities().classes.get(class) == priority.as_ref(),
                    "{cmd:?} left {:?}",
                    self.view.priorities().classes
                );
                // A removed class takes its class quotas with it.
                let left = self.view.class_quotas().values().any(|c| c.contains_key(class));
                ensure!(
                    priority.is_some() || !left,
                    "{cmd:?} left quotas of the class: {:?}",
                    self.view.class_quotas()
                );
                self.stats.policy_changes += (self.view.version() != before.version()) as u64;
            }
            (_, Err(e)) => {
                // The only refusals these draws can meet: removing the last class, and a class
                // quota for a class the cluster does not have.
                let unknown = matches!(&cmd, Command::SetQuota { class: Some(c), .. }
                    if !before.priorities().classes.contains_key(c));
                ensure!(
                    e.to_string().contains("last priority class")
                        || unknown && e.to_string().contains("unknown priority class"),
                    "{cmd:?} refused: {e}"
                );
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

    /// Before `cmd`: the class quotas it would leave under what their tenants hold get a grace
    /// of what those hold now (the quota binds new placements only).
    fn grace_class_quotas(&mut self, cmd: &Command) {
        let mut after = self.view.clone();
        if !matches!(after.apply(cmd), Outcome::Policy(Ok(()))) {
            return;
        }
        for (tenant, classes) in after.class_quotas() {
            for (class, &q) in classes {
                let Some(&floor) = after.priorities().classes.get(class) else { continue };
                let held = held_at_or_above(&after, tenant, floor);
                if held > q {
                    let g = self.class_grace.entry((tenant.clone(), class.clone())).or_default();
                    *g = (*g).max(held);
                    self.stats.class_quota_below_held += 1;
                }
            }
        }
    }
}
