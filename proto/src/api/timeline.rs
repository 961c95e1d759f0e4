//! A job's trace and timeline: the steps of its life on the view's clock, each with the
//! component that took it, as `tessera status JOB --trace` prints them and the dashboard's job
//! page shows them. Built from replicated state only (times, placements held, restarts), so
//! every replica answers the same, before and after a leader change; the spans themselves
//! (with each call's own timing) go to the OTLP back end under [`super::JobDetail::trace_id`].

use serde::{Deserialize, Serialize};
use tessera_view::{Job, JobState};
use utoipa::ToSchema;

/// One step of a job's life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TimelineStep {
    /// When, Unix ms on the view's clock.
    pub at_ms: u64,
    /// What happened: `submitted`, `ready` (the jobs it waited for ended), `placed`,
    /// `started`, `released` (a placement given back before the end: preempted, migrated,
    /// failed and restarted), `restart` (not placed again before this time) or `ended`.
    pub step: String,
    /// The component that took the step: `view` (the leader that admitted or released it),
    /// `scheduler` (a host's proposal, approved by the leader) or `agents`.
    pub by: String,
    /// What a person reads: GPUs held, level, state, the error.
    pub detail: String,
}

/// The steps of `j`'s life, oldest first.
pub fn timeline(j: &Job) -> Vec<TimelineStep> {
    let t = j.times;
    let mut out = Vec::new();
    let mut step = |at_ms: u64, step: &str, by: &str, detail: String| {
        if at_ms != 0 {
            out.push(TimelineStep { at_ms, step: step.into(), by: by.into(), detail });
        }
    };
    let who = if j.user.is_empty() { String::new() } else { format!(" by {}", j.user) };
    step(t.submitted_ms, "submitted", "view", format!("admitted for tenant {}{who}", j.spec.tenant));
    step(j.ready_ms, "ready", "view", "the jobs it waited for ended".into());
    // Placements given back, then the one it holds (its span is not in `held` until released).
    // A placement given back by the job's end is the end's step; one given back earlier (a
    // preemption, a failure before a restart, then a cancel while pending) is a release.
    for h in &j.held {
        step(h.from_ms, "placed", "scheduler", format!("{} GPUs, {} cores", h.gpus, h.cores));
        if h.to_ms != t.ended_ms {
            step(h.to_ms, "released", "view", "placement given back".into());
        }
    }
    if let Some(p) = &j.placement {
        let servers: std::collections::BTreeSet<_> = p.members.iter().map(|m| m.server).collect();
        let gpus: u32 = p.members.iter().map(|m| m.gpus.count_ones()).sum();
        let detail = format!(
            "{gpus} GPUs in {} members on {} servers at {} (proposal {:x})",
            p.members.len(),
            servers.len(),
            p.level,
            p.proposal.0
        );
        step(t.placed_ms, "placed", "scheduler", detail);
    }
    // Started and ended are about the current (or last) placement: after its placement.
    step(t.started_ms, "started", "agents", "every member running".into());
    if j.state == JobState::Pending && j.restarts > 0 {
        step(j.not_before_ms, "restart", "view", format!("restart {} of the job, after a failure", j.restarts));
    }
    // A job finishes when its agents report every member exited 0; it fails by a report, a
    // cancel, a time limit or a lost server, which the view records.
    match (j.state, &j.error) {
        (JobState::Finished, _) => step(t.ended_ms, "ended", "agents", "finished".into()),
        (JobState::Failed, Some(e)) => step(t.ended_ms, "ended", "view", format!("failed: {e}")),
        (JobState::Failed, None) => step(t.ended_ms, "ended", "view", "failed".into()),
        _ => {}
    }
    // Stable: steps at one time keep the order they were taken in.
    out.sort_by_key(|s| s.at_ms);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::{ClusterSpec, ClusterView, HeldSpan, JobSpec, JobTimes, Topology};

    fn steps(j: &Job) -> Vec<(u64, &'static str)> {
        let names = ["submitted", "ready", "placed", "released", "started", "restart", "ended"];
        timeline(j).iter().map(|s| (s.at_ms, *names.iter().find(|n| **n == s.step).expect("a known step"))).collect()
    }

    #[test]
    fn a_timeline_lists_each_placement_and_ends_with_the_end() {
        let mut v =
            ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1));
        let id = v.submit_as(&JobSpec::simple("t", 1, 2), None, Some("ana")).expect("admitted");
        let mut j = v.job(id).expect("the job").clone();
        let held = |from_ms, to_ms| HeldSpan { from_ms, to_ms, gpus: 2, cores: 8 };

        // Pending, never placed: its submission only (times not yet reached are left out).
        j.times = JobTimes { submitted_ms: 1_000, ..JobTimes::default() };
        assert_eq!(steps(&j), [(1_000, "submitted")]);
        assert_eq!(timeline(&j)[0].detail, "admitted for tenant default by ana");

        // Waited for another job, placed, failed and restarted: placed and released, then the
        // restart's earliest time.
        j.ready_ms = 1_500;
        j.held = vec![held(2_000, 5_000)];
        j.restarts = 1;
        j.not_before_ms = 6_000;
        j.times = JobTimes { submitted_ms: 1_000, placed_ms: 2_000, started_ms: 2_100, ended_ms: 0 };
        assert_eq!(
            steps(&j),
            [
                (1_000, "submitted"),
                (1_500, "ready"),
                (2_000, "placed"),
                (2_100, "started"),
                (5_000, "released"),
                (6_000, "restart")
            ]
        );

        // Placed again and finished: its last placement ends with the job, not a release.
        j.held.push(held(7_000, 9_000));
        j.state = JobState::Finished;
        j.times = JobTimes { submitted_ms: 1_000, placed_ms: 7_000, started_ms: 7_200, ended_ms: 9_000 };
        assert_eq!(
            steps(&j),
            [
                (1_000, "submitted"),
                (1_500, "ready"),
                (2_000, "placed"),
                (5_000, "released"),
                (7_000, "placed"),
                (7_200, "started"),
                (9_000, "ended"),
            ]
        );

        // A failure says why, and the view took it.
        j.state = JobState::Failed;
        j.error = Some("cancelled: by ana".into());
        let last = timeline(&j).pop().expect("a step");
        assert_eq!(
            (last.step.as_str(), last.by.as_str(), last.detail.as_str()),
            ("ended", "view", "failed: cancelled: by ana")
        );
    }

    #[test]
    fn a_release_before_a_cancel_while_pending_stays_a_step() {
        let mut v =
            ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1));
        let id = v.submit(JobSpec::simple("t", 1, 2)).expect("admitted");
        let mut j = v.job(id).expect("the job").clone();
        j.held = vec![HeldSpan { from_ms: 2_000, to_ms: 5_000, gpus: 2, cores: 8 }];
        j.state = JobState::Failed;
        j.error = Some("cancelled".into());
        j.times = JobTimes { submitted_ms: 1_000, placed_ms: 2_000, started_ms: 2_100, ended_ms: 5_500 };
        assert_eq!(
            steps(&j),
            [(1_000, "submitted"), (2_000, "placed"), (2_100, "started"), (5_000, "released"), (5_500, "ended")]
        );
    }
}
