//! What an agent counts for Prometheus, into a recorder its process owns
//! ([`tessera_proto::prom::Metrics`]; served by `tessera agent run --metrics-listen`, or by
//! `tessera dev` for all its agents at once). Every series carries the `server` label, so the
//! agents sharing a recorder stay apart.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tessera_agent_task_starts_total` | counter | `server`, `outcome` (`started`, `failed`: the process did not start, `refused`: the placement cannot run here) |
//! | `tessera_agent_task_exits_total` | counter | `server`, `outcome` (`succeeded`, `failed`, `stopped`: by this agent, for a cancel, move or preemption) |
//! | `tessera_agent_tasks_adopted_total` | counter | `server` (tasks an earlier agent left running, taken over at start) |
//! | `tessera_agent_reports_total` | counter | `server`, `result` (`delivered`, `dropped`: refused for good, `retried`) |
//! | `tessera_agent_heartbeats_total` | counter | `server`, `result` (`ok`, `refused`: the server was marked down, `failed`) |
//! | `tessera_agent_tasks_running`, `tessera_agent_reports_queued`, `tessera_agent_view_version` | gauge | `server` |
//! | `tessera_agent_gpus` | gauge | `server`, `health` (`healthy`, `unhealthy`) |

use ::metrics::{counter, describe_counter, describe_gauge, gauge};
use std::sync::Arc;
use tessera_proto::prom::Metrics;

/// One agent's view of its process's recorder.
#[derive(Clone, Debug)]
pub struct AgentMetrics {
    metrics: Arc<Metrics>,
    server: String,
}

/// How a task start went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// The process runs.
    Started,
    /// The process could not be started.
    Failed,
    /// The placement cannot run here (a bad grant, no such device).
    Refused,
}

/// How a task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Exit code 0.
    Succeeded,
    /// Any other end the agent did not cause.
    Failed,
    /// This agent stopped it.
    Stopped,
}

impl AgentMetrics {
    /// Counts for agent `server` into `metrics`.
    pub fn new(metrics: Arc<Metrics>, server: &str) -> AgentMetrics {
        metrics.record(|| {
            describe_counter!("tessera_agent_task_starts_total", "Task starts by outcome.");
            describe_counter!("tessera_agent_task_exits_total", "Task ends by outcome.");
            describe_counter!("tessera_agent_tasks_adopted_total", "Tasks left by an earlier agent, taken over.");
            describe_counter!("tessera_agent_reports_total", "Task reports sent to the view, by result.");
            describe_counter!("tessera_agent_heartbeats_total", "Heartbeats sent to the view, by result.");
            describe_gauge!("tessera_agent_tasks_running", "Task processes running on this server.");
            describe_gauge!("tessera_agent_reports_queued", "Task reports waiting to be delivered.");
            describe_gauge!("tessera_agent_view_version", "The view version the agent's copy reflects.");
            describe_gauge!("tessera_agent_gpus", "This server's GPUs by health.");
        });
        AgentMetrics { metrics, server: server.to_string() }
    }

    /// A task start.
    pub fn start(&self, how: Start) {
        let outcome = match how {
            Start::Started => "started",
            Start::Failed => "failed",
            Start::Refused => "refused",
        };
        self.count("tessera_agent_task_starts_total", "outcome", outcome, 1);
    }

    /// A task end.
    pub fn exit(&self, how: Exit) {
        let outcome = match how {
            Exit::Succeeded => "succeeded",
            Exit::Failed => "failed",
            Exit::Stopped => "stopped",
        };
        self.count("tessera_agent_task_exits_total", "outcome", outcome, 1);
    }

    /// `n` tasks taken over at start.
    pub fn adopted(&self, n: usize) {
        let server = self.server.clone();
        self.metrics.record(|| counter!("tessera_agent_tasks_adopted_total", "server" => server).increment(n as u64));
    }

    /// A report's delivery: `delivered`, `dropped` or `retried`.
    pub fn report(&self, result: &'static str) {
        self.count("tessera_agent_reports_total", "result", result, 1);
    }

    /// A heartbeat: `ok`, `refused` or `failed`; `unhealthy` of `devices` GPUs are unhealthy.
    pub fn heartbeat(&self, result: &'static str, devices: u32, unhealthy: u32) {
        self.count("tessera_agent_heartbeats_total", "result", result, 1);
        let server = self.server.clone();
        self.metrics.record(|| {
            gauge!("tessera_agent_gpus", "server" => server.clone(), "health" => "healthy")
                .set(f64::from(devices.saturating_sub(unhealthy)));
            gauge!("tessera_agent_gpus", "server" => server, "health" => "unhealthy").set(f64::from(unhealthy));
        });
    }

    /// The state after a round of the loop.
    pub fn state(&self, running: usize, queued: usize, version: u64) {
        let server = self.server.clone();
        self.metrics.record(|| {
            gauge!("tessera_agent_tasks_running", "server" => server.clone()).set(running as f64);
            gauge!("tessera_agent_reports_queued", "server" => server.clone()).set(queued as f64);
            gauge!("tessera_agent_view_version", "server" => server).set(version as f64);
        });
    }

    fn count(&self, name: &'static str, label: &'static str, value: &'static str, n: u64) {
        let server = self.server.clone();
        self.metrics.record(|| counter!(name, "server" => server, label => value).increment(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_agents_sharing_a_recorder_count_apart() {
        let m = Arc::new(Metrics::new());
        let a = AgentMetrics::new(m.clone(), "a");
        let b = AgentMetrics::new(m.clone(), "b");
        a.start(Start::Started);
        a.start(Start::Started);
        b.start(Start::Refused);
        a.exit(Exit::Stopped);
        b.heartbeat("ok", 8, 1);
        a.state(2, 1, 17);
        let text = m.render();
        assert!(text.contains("tessera_agent_task_starts_total{server=\"a\",outcome=\"started\"} 2"), "{text}");
        assert!(text.contains("tessera_agent_task_starts_total{server=\"b\",outcome=\"refused\"} 1"), "{text}");
        assert!(text.contains("tessera_agent_task_exits_total{server=\"a\",outcome=\"stopped\"} 1"), "{text}");
        assert!(text.contains("tessera_agent_gpus{server=\"b\",health=\"healthy\"} 7"), "{text}");
        assert!(text.contains("tessera_agent_tasks_running{server=\"a\"} 2"), "{text}");
        assert!(text.contains("tessera_agent_view_version{server=\"a\"} 17"), "{text}");
        // Described once, however many agents share the recorder.
        assert_eq!(text.matches("# TYPE tessera_agent_task_starts_total counter").count(), 1, "{text}");
    }
}
