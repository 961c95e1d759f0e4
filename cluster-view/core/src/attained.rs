//! Attained-service queues kept by the view itself (see [`crate::priority`]): when the
//! cluster's [`Priorities::attained_service_gpu_s`](crate::Priorities::attained_service_gpu_s)
//! names thresholds, a placed job moves down a queue as soon as the GPU time it has held, over
//! all its placements, reaches the next one.
//!
//! Everything here is a function of replicated state and the view's clock, so every replica
//! moves the same jobs at the same log entry. For each placed job the view keeps a *mark*: the
//! clock time at which its GPU time reaches the next threshold,
//! `placed_ms + ⌈(threshold − held before this placement) / GPUs⌉`. Marks are derived (rebuilt
//! from a snapshot, never sent); [`ClusterView::next_deadline_ms`] includes the earliest, so
//! the leader writes a clock entry when one passes on an idle log, as it does for time limits.
//! As the clock passes a mark the job's queue is set and its next mark taken; a released
//! placement's mark is dropped. A job's queue never goes down: what it attained stays attained,
//! and a job placed again continues from it.
//!
//! The same service orders the waiting jobs within a queue ([`ClusterView::queue_key`]): the
//! queues are coarse so that jobs of about the same service do not preempt each other back and
//! forth, but offering a waiting job costs no preemption, so among the waiting jobs of one
//! queue the one that attained the least GPU time comes first, as in undiscretized
//! least-attained-service.

use crate::ids::JobId;
use crate::job::Job;
use crate::view::ClusterView;
use std::cmp::Reverse;
use std::collections::BTreeSet;

/// Where a job stands in the order a host offers waiting jobs in ([`ClusterView::queue_key`]):
/// lower first.
pub type QueueKey = (Reverse<i32>, u8, u64, JobId);

/// [`ClusterView::queue_key`] of `job` on a cluster that has attained-service queues or not
/// (`queues`), at `now_ms` on the view's clock. A copy of the view kept by a host, which
/// orders its waiting jobs as the view offers them, calls it directly: for a waiting job the
/// clock does not matter (it holds no placement, so what it attained is its earlier runs').
pub fn queue_key(job: &Job, queues: bool, now_ms: u64) -> QueueKey {
    let attained = if queues { job.attained_gpu_ms(now_ms) } else { 0 };
    (Reverse(job.spec.priority), job.service_queue, attained, job.id)
}

impl Job {
    /// GPU-milliseconds it has held over every placement, the current one up to `now_ms`.
    pub fn attained_gpu_ms(&self, now_ms: u64) -> u64 {
        self.usage_within(0, u64::MAX, now_ms).gpu_ms
    }
}

impl ClusterView {
    /// The order in which waiting jobs are offered (adopted by hosts, placed by them, and
    /// explained by `tessera why`): a higher priority first, then a lower attained-service
    /// queue, then, on a cluster with queues, the less GPU time attained over earlier runs,
    /// then the earlier admitted. Without queues the attained service is left out, so a job
    /// re-queued after a failure or a priority preemption keeps its place in arrival order.
    pub fn queue_key(&self, job: &Job) -> QueueKey {
        queue_key(job, !self.priorities.attained_service_gpu_s.is_empty(), self.now_ms)
    }

    /// When `job`'s current placement brings it to its next threshold (Unix ms on the view's
    /// clock): none without thresholds left, a placement, or a placement time.
    fn service_mark(&self, job: &Job) -> Option<u64> {
        let span = job.holding_span(self.now_ms)?;
        let gpus = u64::from(span.gpus);
        if gpus == 0 {
            return None;
        }
        let now = job.attained_gpu_ms(self.now_ms);
        let next = self.priorities.next_service_threshold_ms(now)?;
        let before = now - gpus * (span.to_ms - span.from_ms);
        Some(span.from_ms.saturating_add((next - before).div_ceil(gpus)))
    }

    /// Every placed job's mark, for a view rebuilt from a snapshot.
    pub(crate) fn derive_service_marks(&self) -> BTreeSet<(u64, JobId)> {
        if self.priorities.attained_service_gpu_s.is_empty() {
            return BTreeSet::new();
        }
        self.jobs.values().filter_map(|j| self.service_mark(j).map(|m| (m, j.id))).collect()
    }

    /// Takes `job`'s mark after it was placed.
    pub(crate) fn mark_service(&mut self, job: JobId) {
        // The approver's hot path: nothing to compute on a cluster without queues.
        if self.priorities.attained_service_gpu_s.is_empty() {
            return;
        }
        if let Some(m) = self.jobs.get(&job).and_then(|j| self.service_mark(j)) {
            self.service_marks.insert((m, job));
        }
    }

    /// Drops `job`'s mark before its placement is released. Its queue needs no settling: the
    /// clock reaches every mark before it moves past it, so up to now the job has attained no
    /// threshold its queue does not show.
    pub(crate) fn unmark_service(&mut self, job: JobId) {
        if !self.service_marks.is_empty() {
            self.service_marks.retain(|(_, j)| *j != job);
        }
    }

    /// Moves the jobs whose marks the clock (now at `at_ms`) passed to their queues, each a
    /// change of the view, and takes their next marks.
    pub(crate) fn advance_service_queues(&mut self, at_ms: u64) {
        while let Some(&(mark, job)) = self.service_marks.first()
            && mark <= at_ms
        {
            self.service_marks.remove(&(mark, job));
            let Some(j) = self.jobs.get(&job) else { continue };
            let queue = self.priorities.service_queue(j.attained_gpu_ms(at_ms));
            if queue > j.service_queue {
                // A placed job is not ended: this cannot be refused.
                let _ = self.set_service_queue(job, queue);
            }
            self.mark_service(job);
        }
    }

    /// The earliest mark, if any.
    pub(crate) fn next_service_mark(&self) -> Option<u64> {
        self.service_marks.first().map(|(m, _)| *m)
    }
}

#[cfg(test)]
mod tests {
    use crate::cluster_spec::ClusterSpec;
    use crate::ids::{JobId, ProposalId};
    use crate::invariants;
    use crate::job::JobSpec;
    use crate::placement::{MemberPlacement, Proposal};
    use crate::topology::Topology;
    use crate::view::{ClusterView, Command};

    const T0: u64 = 1_800_000_000_000;

    /// One seed-8gpu server; queues after 10 and 100 GPU-seconds.
    fn view() -> ClusterView {
        let mut spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
        spec.priorities.attained_service_gpu_s = vec![10, 100];
        let mut v = ClusterView::from_spec(&spec);
        v.advance_clock(T0);
        v
    }

    /// `gpus` GPUs from device `first`, with their shares of cores and memory.
    fn place(v: &mut ClusterView, job: JobId, id: u64, first: u32, gpus: u32) {
        let m = MemberPlacement::seed_8gpu(first, gpus);
        let p = Proposal { id: ProposalId(id), job, members: vec![m], based_on: v.version() };
        assert!(v.propose(&p).is_placed());
    }

    fn queue(v: &ClusterView, job: JobId) -> u8 {
        v.job(job).expect("job").service_queue
    }

    #[test]
    fn a_running_job_moves_down_a_queue_exactly_when_its_gpu_time_reaches_each_threshold() {
        let mut v = view();
        let job = v.submit(JobSpec::simple("long", 1, 2)).expect("admitted");
        place(&mut v, job, 1, 0, 2);
        // 2 GPUs: 10 GPU-s after 5 s, 100 GPU-s after 50 s.
        assert_eq!(v.next_deadline_ms(), Some(T0 + 5_000), "the leader writes the clock then");
        v.apply(&Command::Clock { at_ms: T0 + 4_999 });
        assert_eq!(queue(&v, job), 0);
        let before = v.version();
        v.apply(&Command::Clock { at_ms: T0 + 5_000 });
        assert_eq!(queue(&v, job), 1);
        assert!(v.version() > before, "a queue change is a change of the view");
        assert_eq!(v.next_deadline_ms(), Some(T0 + 50_000));
        // A clock that jumps past both thresholds moves it to the last queue at once.
        v.apply(&Command::Clock { at_ms: T0 + 3_600_000 });
        assert_eq!(queue(&v, job), 2);
        assert_eq!(v.next_deadline_ms(), None, "no threshold left");
        let rep = invariants::check(&v);
        assert!(rep.is_clean(), "{:?}", rep.violations);
    }

    #[test]
    fn attained_service_adds_up_over_placements_and_a_released_job_keeps_its_queue() {
        let mut v = view();
        let job = v.submit(JobSpec::simple("j", 1, 2)).expect("admitted");
        place(&mut v, job, 1, 0, 2);
        // Preempted after 8 GPU-s (no clock entry at the 10 GPU-s mark: it is not reached).
        v.advance_clock(T0 + 4_000);
        v.requeue(job, "preempted".into());
        assert_eq!((queue(&v, job), v.next_deadline_ms()), (0, None));
        // Placed again: 2 more GPU-s (1 s) reach the first threshold.
        v.advance_clock(T0 + 20_000);
        place(&mut v, job, 2, 0, 2);
        assert_eq!(v.next_deadline_ms(), Some(T0 + 21_000));
        // Any clock entry past the mark moves it (here one 9 s later).
        v.advance_clock(T0 + 30_000);
        assert_eq!(queue(&v, job), 1, "8 + 2 GPU-s reached the first threshold");
        assert_eq!(v.next_deadline_ms(), Some(T0 + 66_000), "100 GPU-s: 8 before, then 46 s on 2 GPUs");
        v.requeue(job, "moved".into());
        assert_eq!((queue(&v, job), v.next_deadline_ms()), (1, None), "released: its queue stays, its mark goes");
        assert_eq!(v.job(job).expect("job").attained_gpu_ms(T0 + 99_000), 28_000);
        let rep = invariants::check(&v);
        assert!(rep.is_clean(), "{:?}", rep.violations);
    }

    #[test]
    fn a_job_timed_out_by_a_late_clock_shows_what_it_attained_up_to_then() {
        let mut v = view();
        let mut spec = JobSpec::simple("limited", 1, 2);
        spec.run.time_limit_s = Some(10);
        let job = v.submit(spec).expect("admitted");
        place(&mut v, job, 1, 0, 2);
        // One clock entry past the first mark (5 s) and the time limit (10 s): the job held its
        // GPUs for 20 s, 40 GPU-s, when it is failed.
        let (_, expired) = v.advance_clock_expiring(T0 + 20_000);
        assert_eq!(expired, vec![job]);
        assert_eq!(queue(&v, job), 1);
        let rep = invariants::check(&v);
        assert!(rep.is_clean(), "{:?}", rep.violations);
    }

    #[test]
    fn marks_are_derived_so_a_view_rebuilt_from_its_snapshot_moves_the_same_jobs() {
        let mut v = view();
        let a = v.submit(JobSpec::simple("a", 1, 1)).expect("admitted");
        let b = v.submit(JobSpec::simple("b", 1, 4)).expect("admitted");
        place(&mut v, a, 1, 0, 1);
        v.advance_clock(T0 + 1_000);
        place(&mut v, b, 2, 4, 4);
        let mut copy = ClusterView::from_snapshot(v.snapshot());
        assert_eq!(copy.next_deadline_ms(), v.next_deadline_ms());
        for at in [T0 + 3_500, T0 + 11_000, T0 + 40_000, T0 + 200_000] {
            v.apply(&Command::Clock { at_ms: at });
            copy.apply(&Command::Clock { at_ms: at });
            assert_eq!((queue(&v, a), queue(&v, b)), (queue(&copy, a), queue(&copy, b)), "at {at}");
            assert_eq!(v.state_hash(), copy.state_hash(), "at {at}");
        }
        assert_eq!((queue(&v, a), queue(&v, b)), (2, 2));
    }

    #[test]
    fn waiting_jobs_of_one_queue_are_offered_least_attained_first_and_without_queues_oldest_first() {
        let mut v = view();
        let old = v.submit(JobSpec::simple("old", 1, 2)).expect("admitted");
        let young = v.submit(JobSpec::simple("young", 1, 2)).expect("admitted");
        let new = v.submit(JobSpec::simple("new", 1, 2)).expect("admitted");
        // `old` holds 2 GPUs for 40 s (80 GPU-s), `young` for 10 s (20 GPU-s): both in queue 1.
        place(&mut v, old, 1, 0, 2);
        v.advance_clock(T0 + 40_000);
        v.requeue(old, "preempted".into());
        place(&mut v, young, 2, 0, 2);
        v.advance_clock(T0 + 50_000);
        v.requeue(young, "preempted".into());
        assert_eq!((queue(&v, old), queue(&v, young), queue(&v, new)), (1, 1, 0));
        let order = |v: &ClusterView, jobs: [JobId; 3]| {
            let mut q: Vec<_> = jobs.iter().map(|&j| v.queue_key(v.job(j).expect("job"))).collect();
            q.sort();
            q.into_iter().map(|k| k.3).collect::<Vec<_>>()
        };
        assert_eq!(order(&v, [old, young, new]), vec![new, young, old], "queue 0 first; in queue 1 the less attained");
        assert_eq!(crate::Explainer::new(&v).queue().iter().map(|j| j.id).collect::<Vec<_>>(), vec![new, young, old]);
        // A higher priority still comes before every queue.
        let urgent = v.submit(JobSpec { priority: 10, ..JobSpec::simple("urgent", 1, 2) }).expect("admitted");
        assert_eq!(crate::Explainer::new(&v).queue()[0].id, urgent);
        // Without queues a job re-queued after running keeps its place in arrival order.
        let mut spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
        spec.priorities.attained_service_gpu_s.clear();
        let mut fifo = ClusterView::from_spec(&spec);
        fifo.advance_clock(T0);
        let (old, young, new) = (
            fifo.submit(JobSpec::simple("old", 1, 2)).expect("admitted"),
            fifo.submit(JobSpec::simple("young", 1, 2)).expect("admitted"),
            fifo.submit(JobSpec::simple("new", 1, 2)).expect("admitted"),
        );
        place(&mut fifo, old, 1, 0, 2);
        fifo.advance_clock(T0 + 40_000);
        fifo.requeue(old, "failed".into());
        assert_eq!(order(&fifo, [old, young, new]), vec![old, young, new]);
    }

    #[test]
    fn without_thresholds_nothing_moves_and_nothing_is_marked() {
        let mut spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
        spec.priorities.attained_service_gpu_s.clear();
        let mut v = ClusterView::from_spec(&spec);
        v.advance_clock(T0);
        let job = v.submit(JobSpec::simple("j", 1, 1)).expect("admitted");
        place(&mut v, job, 1, 0, 1);
        assert_eq!(v.next_deadline_ms(), None);
        v.apply(&Command::Clock { at_ms: T0 + 86_400_000 });
        v.requeue(job, "moved".into());
        assert_eq!(queue(&v, job), 0);
    }
}
