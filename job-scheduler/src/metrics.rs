//! What a scheduler host counts for Prometheus, into a recorder its process owns
//! ([`tessera_proto::prom::Metrics`]; served by `tessera scheduler run --metrics-listen`, or by
//! `tessera dev` for all its hosts at once). Every series carries the `host` label.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tessera_host_jobs_adopted_total` | counter | `host` (jobs the leader handed this host) |
//! | `tessera_host_jobs_dropped_total` | counter | `host` (held jobs the leader took back: placed elsewhere, cancelled, lease missed) |
//! | `tessera_host_jobs_done_total` | counter | `host`, `outcome` (`placed`, `not_pending`, `gave_up`, `stopped`: its task failed) |
//! | `tessera_host_jobs_held` | gauge | `host` |
//! | `tessera_host_placements_total` | counter | `host`, `level` (the locality level each placed job got) |
//! | `tessera_host_proposals_total` | counter | `host`, `call` (`propose`, `preempt`), `outcome` (`accepted`, `already_applied`, `conflict`, `refused`, `unknown`, `failed`) |
//! | `tessera_host_proposal_duration_seconds` | histogram | `host`, `call`: the round trip to the leader's decision, as this host saw it |
//! | `tessera_host_migrations_total` | counter | `host`, `result` (`moved`, `refused`: moves of the host's plans) |
//! | `tessera_host_migration_plans_total` | counter | `host`, `result` (`moves`: a plan for a blocked job was sent; `none`: no moves within the planner's bounds free a group for it) |
//! | `tessera_host_adopt_calls_total` | counter | `host`, `result` (`ok`, `failed`) |
//! | `tessera_host_reservations_total` | counter | `host`, `result` (`made`, `given_up`: bounded reservations for starved gangs, `--reservations`) |
//! | `tessera_host_reservation_held_back_seconds_total` | counter | `host` (job-seconds its reservations held other jobs back, whole seconds) |
//! | `tessera_host_reservation_servers` | gauge | `host` (servers withheld now; 0 when it holds no reservation) |

use crate::reservation::ReservationStats;
use ::metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use std::sync::Arc;
use std::time::Duration;
use tessera_proto::prom::Metrics;
use tessera_view::LocalityLevel;

/// One host's view of its process's recorder.
#[derive(Clone, Debug)]
pub struct HostMetrics {
    metrics: Arc<Metrics>,
    host: String,
}

impl HostMetrics {
    /// Counts for host `host` into `metrics`.
    pub fn new(metrics: Arc<Metrics>, host: &str) -> HostMetrics {
        metrics.record(|| {
            describe_counter!("tessera_host_jobs_adopted_total", "Jobs the leader handed this host.");
            describe_counter!("tessera_host_jobs_dropped_total", "Held jobs the leader took back.");
            describe_counter!("tessera_host_jobs_done_total", "Jobs whose scheduling ended here, by outcome.");
            describe_gauge!("tessera_host_jobs_held", "Jobs this host schedules now.");
            describe_counter!("tessera_host_placements_total", "Jobs this host placed, by locality level.");
            describe_counter!("tessera_host_proposals_total", "Proposals and preemptions sent, by outcome.");
            describe_histogram!(
                "tessera_host_proposal_duration_seconds",
                ::metrics::Unit::Seconds,
                "Round trip of a proposal or preemption to the leader's decision."
            );
            describe_counter!("tessera_host_migrations_total", "Moves of this host's migration plans, by result.");
            describe_counter!(
                "tessera_host_migration_plans_total",
                "Plans for fragmentation-blocked jobs: sent (moves) or none within the planner's bounds."
            );
            describe_counter!("tessera_host_adopt_calls_total", "AdoptJobs calls (lease renewals), by result.");
            describe_counter!("tessera_host_reservations_total", "Bounded reservations for starved gangs, by result.");
            describe_counter!(
                "tessera_host_reservation_held_back_seconds_total",
                ::metrics::Unit::Seconds,
                "Job-seconds this host's reservations held other jobs back."
            );
            describe_gauge!("tessera_host_reservation_servers", "Servers withheld for a starved gang now.");
        });
        let m = HostMetrics { metrics, host: host.to_string() };
        // Every series a dashboard reads exists from the start (at 0).
        m.migrated(0, 0);
        m.planned(0, 0);
        m.adopted(0);
        m
    }

    /// `n` jobs adopted.
    pub fn adopted(&self, n: usize) {
        self.add("tessera_host_jobs_adopted_total", None, n as u64);
    }

    /// `n` held jobs taken back by the leader.
    pub fn dropped(&self, n: usize) {
        self.add("tessera_host_jobs_dropped_total", None, n as u64);
    }

    /// A job's scheduling ended with `outcome`.
    pub fn done(&self, outcome: &'static str) {
        self.add("tessera_host_jobs_done_total", Some(("outcome", outcome)), 1);
    }

    /// A job placed at `level`.
    pub fn placed(&self, level: LocalityLevel) {
        self.add("tessera_host_placements_total", Some(("level", level.as_str())), 1);
    }

    /// Jobs held now.
    pub fn held(&self, n: usize) {
        let host = self.host.clone();
        self.metrics.record(|| gauge!("tessera_host_jobs_held", "host" => host).set(n as f64));
    }

    /// One proposal (`call` `propose`) or preemption (`preempt`) answered with `outcome` after
    /// `elapsed`.
    pub fn proposal(&self, call: &'static str, outcome: &'static str, elapsed: Duration) {
        let host = self.host.clone();
        self.metrics.record(|| {
            counter!("tessera_host_proposals_total", "host" => host.clone(), "call" => call, "outcome" => outcome)
                .increment(1);
            histogram!("tessera_host_proposal_duration_seconds", "host" => host, "call" => call)
                .record(elapsed.as_secs_f64());
        });
    }

    /// A migration plan's moves: `moved` accepted, `refused` not.
    pub fn migrated(&self, moved: usize, refused: usize) {
        self.add("tessera_host_migrations_total", Some(("result", "moved")), moved as u64);
        self.add("tessera_host_migrations_total", Some(("result", "refused")), refused as u64);
    }

    /// One round's plans for blocked jobs: `sent` plans whose moves went to the leader, and
    /// `none` candidates for which no moves within the planner's bounds free a group (moves
    /// cannot help them: what frees their group is jobs ending).
    pub fn planned(&self, sent: usize, none: usize) {
        self.add("tessera_host_migration_plans_total", Some(("result", "moves")), sent as u64);
        self.add("tessera_host_migration_plans_total", Some(("result", "none")), none as u64);
    }

    /// An AdoptJobs call: `ok` or `failed`.
    pub fn adopt_call(&self, result: &'static str) {
        self.add("tessera_host_adopt_calls_total", Some(("result", result)), 1);
    }

    /// The host's reservations so far (`stats`, cumulative) and the servers withheld now. Only
    /// a host that makes reservations publishes them.
    pub fn reservations(&self, stats: ReservationStats, servers_now: usize) {
        let host = self.host.clone();
        self.metrics.record(|| {
            let made = counter!("tessera_host_reservations_total", "host" => host.clone(), "result" => "made");
            made.absolute(stats.made);
            let given_up = counter!("tessera_host_reservations_total", "host" => host.clone(), "result" => "given_up");
            given_up.absolute(stats.abandoned);
            counter!("tessera_host_reservation_held_back_seconds_total", "host" => host.clone())
                .absolute(stats.held_back_s as u64);
            gauge!("tessera_host_reservation_servers", "host" => host).set(servers_now as f64);
        });
    }

    fn add(&self, name: &'static str, label: Option<(&'static str, &'static str)>, n: u64) {
        let host = self.host.clone();
        self.metrics.record(|| match label {
            Some((k, v)) => counter!(name, "host" => host, k => v).increment(n),
            None => counter!(name, "host" => host).increment(n),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_figures_carry_its_name_and_latencies_fall_in_buckets() {
        let m = Arc::new(Metrics::new());
        let h = HostMetrics::new(m.clone(), "h0");
        h.adopted(3);
        h.placed(LocalityLevel::Server);
        h.done("placed");
        h.proposal("propose", "conflict", Duration::from_millis(2));
        h.proposal("propose", "accepted", Duration::from_millis(40));
        h.migrated(2, 1);
        h.planned(1, 3);
        h.held(2);
        let stats = ReservationStats { made: 3, abandoned: 1, held_back_s: 41.7, idled_gpu_s: 9.0 };
        h.reservations(stats, 2);
        // Cumulative figures are published as they stand, not added again.
        h.reservations(stats, 0);
        let text = m.render();
        assert!(text.contains("tessera_host_jobs_adopted_total{host=\"h0\"} 3"), "{text}");
        assert!(text.contains("tessera_host_placements_total{host=\"h0\",level=\"server\"} 1"), "{text}");
        assert!(
            text.contains("tessera_host_proposals_total{host=\"h0\",call=\"propose\",outcome=\"conflict\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "tessera_host_proposal_duration_seconds_bucket{host=\"h0\",call=\"propose\",le=\"0.0025\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("tessera_host_proposal_duration_seconds_count{host=\"h0\",call=\"propose\"} 2"),
            "{text}"
        );
        assert!(text.contains("tessera_host_migrations_total{host=\"h0\",result=\"refused\"} 1"), "{text}");
        assert!(text.contains("tessera_host_migration_plans_total{host=\"h0\",result=\"moves\"} 1"), "{text}");
        assert!(text.contains("tessera_host_migration_plans_total{host=\"h0\",result=\"none\"} 3"), "{text}");
        assert!(text.contains("tessera_host_jobs_held{host=\"h0\"} 2"), "{text}");
        assert!(text.contains("tessera_host_reservations_total{host=\"h0\",result=\"made\"} 3"), "{text}");
        assert!(text.contains("tessera_host_reservations_total{host=\"h0\",result=\"given_up\"} 1"), "{text}");
        assert!(text.contains("tessera_host_reservation_held_back_seconds_total{host=\"h0\"} 41"), "{text}");
        assert!(text.contains("tessera_host_reservation_servers{host=\"h0\"} 0"), "{text}");
    }
}
