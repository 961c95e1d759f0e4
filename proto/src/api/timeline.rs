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
    /// `started`, `released` (a placement given back: preempted, migrated, failed and
    /// restarted), `restart` (not placed again before this time) or `ended`.
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
    for h in &j.held {
        step(h.from_ms, "placed", "scheduler", format!("{} GPUs, {} cores", h.gpus, h.cores));
        step(h.to_ms, "released", "view", "placement given back".into());
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
