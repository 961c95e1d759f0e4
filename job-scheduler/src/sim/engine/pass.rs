//! The scheduling pass: the waiting jobs offered to the policy in the host's order, a shape
//! that failed not searched again in the pass, and migration or preemption for jobs that do
//! not fit.

use super::*;

/// What decides whether a search can succeed in one pass: gang shape, allowed level, CPU
/// sweet point (bits), memory and device type.
/// Whether servers were withheld from it ([`crate::reservation`]) is part of it too.
/// The device type is the run's own number for it ([`Rt::ty`]), so a key costs no allocation.
type ShapeKey = (u32, u32, LocalityLevel, u64, Option<u32>, Option<u32>, (i32, u8), bool);

/// [`locality_cost::slot_kind`], with the device type as the run's number for it.
type SlotKind = (u32, u32, LocalityLevel, Option<u32>);

fn slot_kind(rt: &Rt) -> SlotKind {
    let (members, per, prefer, _) = locality_cost::slot_kind(&rt.spec);
    (members, per, prefer, rt.ty)
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Sim<'_> {
    /// One scheduling pass at `now`.
    /// Returns whether a pass ran (anything could have changed what is free or allowed).
    pub(super) fn schedule(&mut self, now: f64) -> bool {
        let mut candidates: Vec<usize> = if self.resources_freed || self.woke {
            self.pending.iter().copied().collect()
        } else {
            self.fresh.iter().copied().filter(|i| self.pending.contains(i)).collect()
        };
        if self.ranked {
            // Priority, then the least attained service, then arrival (the index).
            candidates.sort_by_cached_key(|&i| self.rank_key(i));
        }
        self.fresh.clear();
        self.resources_freed = false;
        self.woke = false;
        self.forget_victims();
        if candidates.is_empty() {
            return false;
        }
        self.local.catch_up(&self.view);
        if self.cfg.contender.reserves {
            self.update_reservation(now);
        }
        let mut failed: BTreeSet<ShapeKey> = BTreeSet::new();
        // Pending jobs by the kind of slot they wait for, in arrival order, and how many of
        // each kind this pass placed (for `Context::ahead`); built when first needed.
        let mut kinds: Option<BTreeMap<SlotKind, Vec<usize>>> = None;
        let mut placed_kinds: BTreeMap<SlotKind, u32> = BTreeMap::new();
        // Migration as the live task plans it (`migration_task`): for up to
        // `CANDIDATES_PER_INTERVAL` blocked jobs a round, each with enough GPUs of its type free
        // in total, until one plan is carried out; a round that finds none waits
        // `MIGRATION_RETRY_S`.
        let (mut planned_for, mut moved) = (0, false);
        let preempts = self.cfg.contender.preempts;
        for i in candidates {
            let free = self.total_gpus - self.busy_gpus;
            if free == 0 && !preempts {
                break;
            }
            if free == 0 {
                // Nothing free: only a job that outranks some running job can start. Offered by
                // rank, no later job can once one cannot.
                let me = (self.jobs[i].spec.priority, Reverse(self.queue_of(i)));
                if self.lowest_preemptible().is_none_or(|low| me <= low) {
                    if self.ranked {
                        break;
                    }
                    continue;
                }
            }
            let rt = &self.jobs[i];
            if u64::from(rt.gpus) > free && !preempts {
                continue;
            }
            // Servers withheld for a starved gang look taken to the jobs they are withheld from
            // (`locality_cost::decide` masks them): what is free to such a job is less.
            let withheld = self.cfg.contender.reserves
                && self.reservations.withholds(self.view.job(rt.view_id).expect("a pending job is in the view"), now);
            if withheld && !preempts && u64::from(rt.gpus) > free - self.withheld_free() {
                continue;
            }
            let waited = now - rt.arrival_s;
            let allowed = rt.allowed(now);
            let key = (
                rt.spec.members,
                rt.spec.gpus_per_member,
                allowed,
                rt.theta.to_bits(),
                rt.spec.memory_mib_per_gpu,
                rt.ty,
                // What it may preempt depends on its rank.
                if preempts { (rt.spec.priority, self.queue_of(i)) } else { (0, 0) },
                withheld,
            );
            let by_shape = self.cfg.contender.scheduler.decides_by_shape();
            if by_shape && failed.contains(&key) {
                self.wake_later(i, now, allowed);
                continue;
            }
            let salt = splitmix(self.cfg.seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
            let decided = if u64::from(self.jobs[i].gpus) > free {
                // Only a preempting host gets here: no search can place it without victims.
                let verdict = Verdict::Wait("fewer GPUs free than it needs".into());
                Decided { verdict, allowed, recheck_waited_s: None, by_cost: false }
            } else {
                let rt = &self.jobs[i];
                let ahead = if rt.spec.slowdown.is_empty() || allowed >= rt.spec.tolerate {
                    0
                } else {
                    let kinds = kinds.get_or_insert_with(|| {
                        let mut m: BTreeMap<SlotKind, Vec<usize>> = BTreeMap::new();
                        for &p in &self.pending {
                            m.entry(slot_kind(&self.jobs[p])).or_default().push(p);
                        }
                        m
                    });
                    let kind = slot_kind(rt);
                    let earlier = kinds.get(&kind).map_or(0, |v| v.partition_point(|&p| p < i)) as u32;
                    earlier.saturating_sub(placed_kinds.get(&kind).copied().unwrap_or(0))
                };
                let job = self.view.job(rt.view_id).expect("a pending job is in the view");
                let attempt = Attempt {
                    job,
                    view: &self.local,
                    overlay: &Overlay::default(),
                    allowed,
                    waited_s: waited.max(0.0) as u64,
                    attempt: rt.attempts,
                    salt,
                    ctx: Context {
                        running: &self.running,
                        releases: &self.releases,
                        reservations: &self.reservations,
                        ahead,
                        now_s: now,
                    },
                };
                locality_cost::decide(self.cfg.contender.scheduler.as_ref(), &attempt)
            };
            self.jobs[i].attempts += 1;
            if let Some(w) = decided.recheck_waited_s {
                // Waiting for a tighter level by choice: decide again when that stops paying.
                // Another job of this shape may have waited longer and choose otherwise, so the
                // shape is not marked as failed. No moves are planned for it: it can start now.
                self.wake_at(i, self.jobs[i].arrival_s + w as f64);
                continue;
            }
            let found = match decided.verdict {
                Verdict::Propose(members) => Some(members),
                Verdict::Wait(_) => None,
                Verdict::GiveUp(reason) => {
                    self.give_up(i, reason);
                    continue;
                }
                Verdict::Preempt { members, victims } => {
                    let why = format!("scheduler `{}`", self.cfg.contender.scheduler.name());
                    if !self.preempt(i, members, victims, &why, now) {
                        failed.insert(key);
                        self.wake_later(i, now, allowed);
                    }
                    continue;
                }
            };
            match found {
                Some(members) => {
                    if self.propose(i, members, now) {
                        *placed_kinds.entry(slot_kind(&self.jobs[i])).or_default() += 1;
                    } else {
                        failed.insert(key);
                    }
                }
                None => {
                    // Moving jobs first (they keep running), preempting only when no move helps.
                    let gpus = self.jobs[i].gpus;
                    let plan_now = self.cfg.contender.migrates
                        && now >= self.next_plan_s
                        && !moved
                        && planned_for < CANDIDATES_PER_INTERVAL
                        && gpus > 1
                        && free_gpus(&self.local, self.jobs[i].spec.gpu_type.as_deref()) >= u64::from(gpus);
                    if plan_now {
                        planned_for += 1;
                        moved = self.try_migrate(i, allowed, now);
                    }
                    let started = (plan_now && moved) || (preempts && self.try_preempt(i, allowed, salt, now));
                    if !started {
                        failed.insert(key);
                        self.wake_later(i, now, allowed);
                    }
                }
            }
        }
        if planned_for > 0 && !moved {
            // Planned for, and none could be helped: the round is over.
            self.next_plan_s = now + MIGRATION_RETRY_S;
        }
        if self.cfg.contender.reserves {
            // What the pass took or freed on the withheld servers idles from now on.
            self.local.catch_up(&self.view);
            let waiting = self.pending.iter().filter_map(|&i| self.view.job(self.jobs[i].view_id));
            self.reservations.observe_free(&self.local, waiting, now);
        }
        true
    }

    /// GPUs free on the servers the host's reservation withholds.
    pub(super) fn withheld_free(&self) -> u64 {
        u64::from(self.reservations.free_on_withheld(self.view.servers()))
    }

    /// Where job `i` stands in attained-service order: priority, then the least attained
    /// service, then arrival (the index).
    pub(super) fn rank_key(&self, i: usize) -> (Reverse<i32>, u8, usize) {
        (Reverse(self.jobs[i].spec.priority), self.queue_of(i), i)
    }

    /// Brings the host's reservation up to `now` ([`Reservations::update`]) over the waiting
    /// jobs in the order the host offers them.
    pub(super) fn update_reservation(&mut self, now: f64) {
        let mut order: Vec<usize> = self.pending.iter().copied().collect();
        if self.ranked {
            order.sort_by_cached_key(|&i| self.rank_key(i));
        }
        let queue = order.iter().filter_map(|&i| {
            let rt = &self.jobs[i];
            self.view.job(rt.view_id).map(|j| (j, now - rt.arrival_s))
        });
        self.reservations.update(&self.local, queue, &self.releases, now);
    }
}
