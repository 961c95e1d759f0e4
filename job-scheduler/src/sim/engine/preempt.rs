//! The simulator's preemption: a machine's `Command::Preempt` (victims chosen by
//! [`crate::preemption::displace`] over the running jobs the host indexes, or the scheduler's own
//! [`crate::scheduler::Verdict::Preempt`]) through the approver, and the victims stopped.

use super::*;
use tessera_view::Preemption;

impl Sim<'_> {
    /// The lowest rank among running jobs still under the preemption bound, if any (kept until
    /// a job starts or stops, or the view moves jobs down their queues).
    pub(super) fn lowest_preemptible(&mut self) -> Option<(i32, Reverse<u8>)> {
        if let Some(low) = self.lowest_victim {
            return low;
        }
        let low = self.running.lowest_preemptible();
        self.lowest_victim = Some(low);
        low
    }

    /// Sends job `i`'s preemption to the approver, as a live host's `Preempt` call does; on
    /// acceptance stops the victims and starts the job.
    pub(super) fn preempt(&mut self, i: usize, pre: Preemption, now: f64) -> Answer {
        let d = match self.view.apply(&Command::Preempt(pre.clone())) {
            Outcome::Decided(mut ds) if ds.len() == 1 => ds.remove(0),
            other => return Answer::Unknown(format!("the view did not decide the preemption: {other:?}")),
        };
        let Decision::Accepted { level, .. } = d else {
            self.rep.rejected_proposals += 1;
            return Answer::decided(d);
        };
        for v in &pre.victims {
            if let Some(&j) = self.by_view.get(v) {
                self.stop_preempted(j, now);
            }
        }
        self.start(i, pre.proposal.id, pre.proposal.members, level, now);
        // The victims wait again, and what they held beyond the preemptor's gang is free: a
        // pass at this instant offers every waiting job, as a live host's waiting jobs all see
        // the view change (offering only the victims left those GPUs idle until a job ended).
        self.resources_freed = true;
        for v in &pre.victims {
            if let Some(&j) = self.by_view.get(v) {
                self.push(now, Event::Requeued(j));
            }
        }
        Answer::decided(d)
    }

    /// A preempted gang: stopped whole (checkpointed on the stop signal), back to waiting, and
    /// paying a checkpoint-restart when it runs again. A gang stopped during a move's pause
    /// does not resume from it.
    pub(super) fn stop_preempted(&mut self, j: usize, now: f64) {
        self.set_speed(j, now);
        let servers = self.vacate(j);
        let cost = self.cfg.migration.checkpoint_restart_s;
        let rt = &mut self.jobs[j];
        rt.work_left_s += cost;
        rt.speed = 0.0;
        rt.epoch += 1;
        rt.members.clear();
        // A move's pending resume no longer applies (it resumes only a paused job).
        rt.paused = false;
        let gpus = rt.gpus;
        self.observe(j, now);
        self.rep.preemptions += 1;
        self.rep.preemption_cost_gpu_s += f64::from(gpus) * cost;
        self.set_busy(now, self.busy_gpus - u64::from(gpus));
        self.pending.insert(j);
        self.respeed(&servers);
        self.lowest_victim = None;
    }
}
