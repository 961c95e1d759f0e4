//! The scheduling pass: the waiting jobs offered in the host's order, each job's
//! [`PlaceMachine`] shown the view and its actions carried out ([`Sim::look`]), a shape that
//! failed not searched again in the pass, and migration for jobs nothing fits.

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

/// How one look of a job's machine ended.
pub(super) enum Stepped {
    /// The job started: by a proposal, or (`proposed` false) by preempting others.
    Started {
        /// Whether a plain proposal placed it.
        proposed: bool,
    },
    /// It waits for a tighter level by choice ([`PlaceMachine::waits_by_choice`]).
    WaitsByChoice,
    /// It waits because nothing fits it now.
    NoFit,
    /// The approver refused what it sent; it waits out a backoff.
    Refused,
    /// It no longer waits (given up, or no longer pending).
    Over,
}

impl Sim<'_> {
    /// One scheduling pass at `now`, and another if migration then moved jobs: on a live host
    /// every job's machine sees the view the moves changed, not only the job they were for.
    /// Returns whether a pass ran (anything could have changed what is free or allowed).
    pub(super) fn schedule(&mut self, now: f64) -> Result<bool, SchedulerError> {
        let (ran, moved) = self.pass(now, true)?;
        if moved {
            self.resources_freed = true;
            self.pass(now, false)?;
        }
        Ok(ran)
    }

    /// A pass over the waiting jobs at `now`, then, if `may_migrate`, the migration task's
    /// round ([`Sim::migrate_for`]). Returns whether it ran, and whether jobs were moved.
    fn pass(&mut self, now: f64, may_migrate: bool) -> Result<(bool, bool), SchedulerError> {
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
        if candidates.is_empty() {
            return Ok((false, false));
        }
        self.local.catch_up(&self.view);
        if self.cfg.contender.reserves {
            self.update_reservation(now);
        }
        let mut failed: BTreeSet<ShapeKey> = BTreeSet::new();
        // Pending jobs by the kind of slot they wait for, in the pass's order, and how many of
        // each kind this pass placed (for `Context::ahead`); built when first needed.
        let mut kinds: Option<BTreeMap<SlotKind, Vec<usize>>> = None;
        let mut placed_kinds: BTreeMap<SlotKind, u32> = BTreeMap::new();
        // Jobs nothing fits, in the order offered: the migration task's candidates once the pass
        // is over ([`Sim::migrate_for`]).
        let mut blocked: Vec<usize> = Vec::new();
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
                // The same answer as the job before it of this shape: only its own relaxation
                // timer is its own.
                self.wake_on_relax(i, now);
                continue;
            }
            let ahead = if rt.spec.slowdown.is_empty() || allowed >= rt.spec.tolerate {
                0
            } else {
                // Ahead: before it in the order the pass offers jobs in, the live host's
                // (`CacheState::same_kind_ahead`: the view's queue order).
                let order = |p: usize| if self.ranked { self.rank_key(p) } else { (None, p) };
                let kinds = kinds.get_or_insert_with(|| {
                    let mut m: BTreeMap<SlotKind, Vec<usize>> = BTreeMap::new();
                    for &p in &self.pending {
                        m.entry(slot_kind(&self.jobs[p])).or_default().push(p);
                    }
                    if self.ranked {
                        m.values_mut().for_each(|v| v.sort_by_cached_key(|&p| order(p)));
                    }
                    m
                });
                let kind = slot_kind(rt);
                let me = order(i);
                let earlier = kinds.get(&kind).map_or(0, |v| v.partition_point(|&p| order(p) < me)) as u32;
                earlier.saturating_sub(placed_kinds.get(&kind).copied().unwrap_or(0))
            };
            let stepped = self.look(i, ahead, now)?;
            match stepped {
                Stepped::Started { proposed } => {
                    if proposed {
                        *placed_kinds.entry(slot_kind(&self.jobs[i])).or_default() += 1;
                    }
                }
                // Waiting for a tighter level by choice: another job of this shape may have
                // waited longer and choose otherwise, so the shape is not marked as failed. No
                // moves are planned for it: it can start now.
                Stepped::WaitsByChoice | Stepped::Over => {}
                Stepped::Refused => {
                    failed.insert(key);
                }
                Stepped::NoFit => {
                    failed.insert(key);
                    blocked.push(i);
                }
            }
        }
        let migrates = may_migrate && self.cfg.contender.migrates;
        let round_due = now >= self.next_plan_s;
        let moved = migrates && round_due && self.migrate_for(&mut blocked, now)?;
        if migrates && !round_due && self.round_wake_s < self.next_plan_s {
            // This interval's round is over: the task's next one, at the interval's end, sees
            // the jobs blocked now, even if nothing else happens meanwhile.
            let min_utilization = MigrationConfig::default().min_utilization;
            if blocked.iter().any(|&i| self.may_plan_for(i, min_utilization)) {
                self.round_wake_s = self.next_plan_s;
                self.push(self.next_plan_s, Event::Wake);
            }
        }
        if self.cfg.contender.reserves {
            // What the pass took or freed on the withheld servers idles from now on.
            self.local.catch_up(&self.view);
            let waiting = self.pending.iter().filter_map(|&i| self.view.job(self.jobs[i].view_id));
            self.reservations.observe_free(&self.local, waiting, now);
        }
        Ok((true, moved))
    }

    /// Migration as the live task plans it ([`crate::migration_task`]), which runs beside the
    /// jobs' own machines and so sees the view after they placed what they could: among
    /// `blocked` (jobs nothing fit in this pass), in the task's order
    /// ([`migration_task::plan_order`]), those still waiting, of more than one GPU, whose GPU
    /// type is busy and has enough GPUs free in total, and held for at least
    /// [`MigrationConfig::min_wait`] since the host adopted them (a pass is due when a younger
    /// one reaches it), up to `CANDIDATES_PER_INTERVAL` of them, until one plan is carried out;
    /// the job's own machine then looks at the view the moves changed. A round that planned for
    /// any job, helped or not, is the task's one round of its interval
    /// ([`MigrationConfig::interval`]): the next comes no sooner. Returns whether jobs were
    /// moved.
    fn migrate_for(&mut self, blocked: &mut [usize], now: f64) -> Result<bool, SchedulerError> {
        let live = MigrationConfig::default();
        let interval = live.interval.map_or(0.0, |d| d.as_secs_f64());
        let min_wait = live.min_wait.as_secs_f64();
        self.local.catch_up(&self.view);
        blocked.sort_by_cached_key(|&i| {
            migration_task::plan_order(self.view.job(self.jobs[i].view_id).expect("a blocked job is in the view"))
        });
        let mut planned_for = 0;
        for &i in blocked.iter() {
            if planned_for == CANDIDATES_PER_INTERVAL {
                break;
            }
            if !self.may_plan_for(i, live.min_utilization) {
                continue;
            }
            let rt = &self.jobs[i];
            let ripe_s = rt.adopted_s + min_wait;
            if now < ripe_s {
                // Held for less than the task's minimum wait: planned for once it has waited
                // that long, as the task's next round would.
                self.wake_at(i, ripe_s);
                continue;
            }
            // Planning for a job, helped or not, makes this the interval's round.
            planned_for += 1;
            self.next_plan_s = now + interval;
            let allowed = rt.allowed(now);
            if self.try_migrate(i, allowed, live.cooldown.as_secs_f64(), now) {
                self.look(i, 0, now)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether the migration task plans for job `i` when it has waited long enough: still
    /// waiting, and a candidate by the live task's own rule ([`migration_task::may_plan_for`],
    /// on the view as of the last catch-up).
    fn may_plan_for(&self, i: usize, min_utilization: f64) -> bool {
        self.pending.contains(&i)
            && self
                .view
                .job(self.jobs[i].view_id)
                .is_some_and(|j| migration_task::may_plan_for(&self.local, j, min_utilization))
    }

    /// Shows job `i`'s machine the view at `now` and carries out what it asks, as the live
    /// host's shell ([`crate::runtime::place_job`]) does, until it waits or is done. `ahead`:
    /// [`Context::ahead`].
    pub(super) fn look(&mut self, i: usize, ahead: u32, now: f64) -> Result<Stepped, SchedulerError> {
        let Some(mut m) = self.machines[i].take() else { return Ok(Stepped::Over) };
        let t = machine_time(now);
        let job = self.view.job(self.jobs[i].view_id);
        let ctx = Context {
            running: &self.running,
            releases: &self.releases,
            reservations: &self.reservations,
            ahead,
            now_s: now,
        };
        let mut action = m.step(t, Look::View { job, view: &self.local, version: self.view.version(), ctx });
        let (mut refused, mut proposed) = (false, true);
        loop {
            action = match action {
                Action::Propose(p) => {
                    let answer = self.propose(i, p, now);
                    refused |= !matches!(answer, Answer::Accepted { .. });
                    m.step(t, Look::Answer(answer))
                }
                Action::Preempt(pre) => {
                    proposed = false;
                    let answer = self.preempt(i, pre, now);
                    refused |= !matches!(answer, Answer::Accepted { .. });
                    m.step(t, Look::Answer(answer))
                }
                Action::Sleep { until } | Action::WaitForView { until, .. } => {
                    if until < t + NO_POLL {
                        self.wake_at(i, until.as_secs_f64());
                    }
                    let by_choice = m.waits_by_choice();
                    self.machines[i] = Some(m);
                    return Ok(if refused {
                        Stepped::Refused
                    } else if by_choice {
                        Stepped::WaitsByChoice
                    } else {
                        Stepped::NoFit
                    });
                }
                Action::ReadJob => {
                    let state = self.view.job(self.jobs[i].view_id).map(|j| j.state);
                    m.step(t, Look::JobState(state))
                }
                Action::GiveUp { reason } => {
                    self.give_up(i, reason);
                    m.step(t, Look::Cancelled(Ok(())))
                }
                Action::Done(Placed::Placed { .. }) => {
                    return Ok(Stepped::Started { proposed });
                }
                Action::Done(_) => return Ok(Stepped::Over),
                Action::Fail(e) => return Err(e),
            };
        }
    }

    /// Schedules a pass when job `i`'s tolerance next relaxes, if it still can
    /// ([`PlaceMachine::relax_wake`]).
    fn wake_on_relax(&mut self, i: usize, now: f64) {
        let Some(m) = &self.machines[i] else { return };
        if let Some(t) = m.relax_wake(machine_time(now), &self.jobs[i].spec) {
            self.wake_at(i, t.as_secs_f64());
        }
    }

    /// GPUs free on the servers the host's reservation withholds.
    pub(super) fn withheld_free(&self) -> u64 {
        u64::from(self.reservations.free_on_withheld(self.view.servers()))
    }

    /// Where job `i` stands in the order the host offers waiting jobs in: the view's
    /// ([`tessera_view::ClusterView::queue_key`]), then arrival (the index).
    pub(super) fn rank_key(&self, i: usize) -> (Option<QueueKey>, usize) {
        (self.view.job(self.jobs[i].view_id).map(|j| self.view.queue_key(j)), i)
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
