//! The simulator's preemption: the running jobs a waiting one may displace, victim choice by
//! [`preemption::choose_victims`] and one `Command::Preempt` through the approver, as a live
//! host sends it.

use super::*;
use tessera_view::Job;

/// A running job as a possible victim: what [`preemption::choose_victims`] needs, its rank
/// ([`tessera_view::Job::rank`]) and how often it was preempted.
pub(super) struct PoolEntry {
    candidate: Candidate,
    rank: (i32, Reverse<u8>),
    preemptions: u32,
}

impl Sim<'_> {
    /// The lowest rank among running jobs still under the preemption bound, if any.
    pub(super) fn lowest_preemptible(&mut self) -> Option<(i32, Reverse<u8>)> {
        if let Some(low) = self.lowest_victim {
            return low;
        }
        let max = self.view.priorities().max_preemptions;
        let low = self.victim_jobs().filter(|(_, v)| v.preemptions < max).map(|(_, v)| v.rank()).min();
        self.lowest_victim = Some(low);
        low
    }

    /// Forgets the victims known (the pool and the lowest rank): running jobs changed.
    pub(super) fn forget_victims(&mut self) {
        self.victim_pool = None;
        self.lowest_victim = None;
    }

    /// The running jobs that may be victims, with their view records: placed, not paused for a
    /// move; a job is listed once per server it is on.
    fn victim_jobs(&self) -> impl Iterator<Item = (usize, &Job)> + '_ {
        self.server_jobs
            .iter()
            .flatten()
            .filter(|&&j| !self.jobs[j].paused)
            .filter_map(|&j| self.view.job(self.jobs[j].view_id).filter(|v| v.placement.is_some()).map(|v| (j, v)))
    }

    /// Builds [`Sim::victim_pool`] unless it is current.
    pub(super) fn fill_victim_pool(&mut self, now: f64) {
        if self.victim_pool.is_none() {
            let mut pool = Vec::new();
            let mut seen = BTreeSet::new();
            for (j, v) in self.victim_jobs() {
                if !seen.insert(j) {
                    continue;
                }
                let Some(p) = v.placement.as_ref() else { continue };
                let c = Candidate {
                    job: v.id,
                    members: p.members.clone(),
                    priority: v.spec.priority,
                    service_queue: v.service_queue,
                    // Checkpointed when stopped: only the restart is lost, the same for every
                    // victim; prefer the ones that ran least since they last started.
                    lost_s: now - self.jobs[j].run_start_s,
                };
                pool.push(PoolEntry { candidate: c, rank: v.rank(), preemptions: v.preemptions });
            }
            self.victim_pool = Some(pool);
        }
    }

    /// Preempts lower-ranked gangs so that job `i` starts, if victims exist; true if it started.
    pub(super) fn try_preempt(&mut self, i: usize, allowed: LocalityLevel, salt: u64, now: f64) -> bool {
        let Some(me) = self.view.job(self.jobs[i].view_id).map(|j| j.rank()) else { return false };
        let max = self.view.priorities().max_preemptions;
        self.fill_victim_pool(now);
        // References into the pool: a pass offers many jobs, and copying every candidate's
        // members for each was most of this step's allocation.
        let candidates: Vec<&Candidate> = self
            .victim_pool
            .iter()
            .flatten()
            .filter(|e| me > e.rank && e.preemptions < max)
            .map(|e| &e.candidate)
            .collect();
        if !preemption::could_make_room(&candidates, self.total_gpus - self.busy_gpus, self.jobs[i].gpus) {
            return false;
        }
        let spec = &self.jobs[i].spec;
        let Some(choice) = preemption::choose_victims(&self.local, spec, allowed, FitMode::Pack, salt, &candidates)
        else {
            return false;
        };
        self.preempt(i, choice.members, choice.victims, "attained-service order", now)
    }

    /// Sends one `Command::Preempt` for job `i` (a host's choice, or its scheduler's
    /// [`Verdict::Preempt`]); on acceptance stops the victims and starts the job. True if it
    /// started.
    pub(super) fn preempt(
        &mut self,
        i: usize,
        members: Vec<MemberPlacement>,
        victims: Vec<JobId>,
        why: &str,
        now: f64,
    ) -> bool {
        let id = self.next_proposal();
        let proposal =
            Proposal { id, job: self.jobs[i].view_id, members: members.clone(), based_on: self.view.version() };
        let pre = Preemption { proposal, victims: victims.clone(), reason: why.into() };
        let Outcome::Decided(ds) = self.view.apply(&Command::Preempt(pre)) else { return false };
        let Some(Decision::Accepted { level, .. }) = ds.first().cloned() else {
            self.rep.rejected_proposals += 1;
            return false;
        };
        for v in &victims {
            if let Some(&j) = self.by_view.get(v) {
                self.stop_preempted(j, now);
            }
        }
        self.start(i, id, members, level, now);
        // The victims wait again, and what they held beyond the preemptor's gang is free: a
        // pass at this instant offers every waiting job, as a live host's waiting jobs all see
        // the view change (offering only the victims left those GPUs idle until a job ended).
        self.resources_freed = true;
        for v in &victims {
            if let Some(&j) = self.by_view.get(v) {
                self.push(now, Event::Requeued(j));
            }
        }
        true
    }

    /// A preempted gang: stopped whole (checkpointed on the stop signal), back to waiting, and
    /// paying a checkpoint-restart when it runs again.
    pub(super) fn stop_preempted(&mut self, j: usize, now: f64) {
        self.set_speed(j, now);
        let servers = self.vacate(j);
        let cost = self.cfg.migration.checkpoint_restart_s;
        let rt = &mut self.jobs[j];
        rt.work_left_s += cost;
        rt.speed = 0.0;
        rt.epoch += 1;
        rt.members.clear();
        let gpus = rt.gpus;
        self.observe(j, now);
        self.rep.preemptions += 1;
        self.rep.preemption_cost_gpu_s += f64::from(gpus) * cost;
        self.set_busy(now, self.busy_gpus - u64::from(gpus));
        self.pending.insert(j);
        self.respeed(&servers);
        self.forget_victims();
    }
}
