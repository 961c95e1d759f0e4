//! `GET /metrics`: Prometheus text through the `metrics` crate and its Prometheus exporter
//! (the renderer only; actix serves the text, the exporter runs no listener of its own).
//!
//! Two recorders, neither installed globally (so several replicas in one process keep their
//! own): the long-lived [`HttpMetrics`] counts requests and their latency by route, method and
//! status; the view's state (raft role, term, applied index, jobs by state, GPUs by use) is
//! recorded into a fresh one at each scrape, so a replica that does not answer shows
//! `tessera_replica_up 0` and no stale values.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tessera_replica_up` | gauge | `replica` |
//! | `tessera_replica_role` | gauge (1 for the current role) | `replica`, `role` |
//! | `tessera_replica_term`, `tessera_replica_applied_index`, `tessera_replica_leader`, `tessera_view_version` | gauge | `replica` |
//! | `tessera_jobs` | gauge | `state` |
//! | `tessera_gpus` | gauge | `use` (`total`, `used`, `free`, `unavailable`) |
//! | `tessera_http_requests_total` | counter | `route`, `method`, `status` |
//! | `tessera_http_request_duration_seconds` | histogram | `route` |

use super::Api;
use ::metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use actix_web::{HttpResponse, web};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tessera_proto::api::{GpuCounts, ROLES, jobs_by_state};
use tessera_proto::v1;
use tessera_view::ViewSnapshot;

/// Upper bounds (seconds) of the request latency histogram's buckets.
const LATENCY_BUCKETS_S: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
/// Requests observed between two folds of the latency samples into their buckets (the
/// exporter keeps raw samples until then; a scrape folds them too).
const UPKEEP_EVERY: u64 = 256;
const REQUESTS: &str = "tessera_http_requests_total";
const LATENCY: &str = "tessera_http_request_duration_seconds";

/// Request counts and latencies by route, for `/metrics`. Routes are the registered patterns
/// (or `unmatched`), methods a fixed list, so the label sets stay bounded.
#[derive(Debug)]
pub struct HttpMetrics {
    recorder: PrometheusRecorder,
    observed: AtomicU64,
}

impl HttpMetrics {
    /// An empty set, with the latency buckets.
    pub fn new() -> HttpMetrics {
        let builder = PrometheusBuilder::new();
        // Only fails for an empty bucket list, which LATENCY_BUCKETS_S is not.
        let builder = match builder.set_buckets_for_metric(Matcher::Full(LATENCY.to_string()), &LATENCY_BUCKETS_S) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "latency buckets refused; latency is a summary");
                PrometheusBuilder::new()
            }
        };
        let recorder = builder.build_recorder();
        ::metrics::with_local_recorder(&recorder, || {
            describe_counter!(REQUESTS, "HTTP API requests by route, method and status.");
            describe_histogram!(LATENCY, ::metrics::Unit::Seconds, "HTTP API request latency by route.");
        });
        HttpMetrics { recorder, observed: AtomicU64::new(0) }
    }

    /// Counts one request and its latency.
    pub fn observe(&self, route: &str, method: &'static str, status: u16, elapsed: Duration) {
        ::metrics::with_local_recorder(&self.recorder, || {
            let route = route.to_string();
            counter!(REQUESTS, "route" => route.clone(), "method" => method, "status" => status.to_string())
                .increment(1);
            histogram!(LATENCY, "route" => route).record(elapsed.as_secs_f64());
        });
        if self.observed.fetch_add(1, Ordering::Relaxed) % UPKEEP_EVERY == UPKEEP_EVERY - 1 {
            self.recorder.handle().run_upkeep();
        }
    }

    /// The Prometheus text of the requests so far.
    pub fn render(&self) -> String {
        self.recorder.handle().render()
    }
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics::new()
    }
}

/// The method as a label from a fixed list.
pub fn method_label(m: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The Prometheus text of a replica's state: `state` is its status and view, `None` when it
/// did not answer.
pub fn render_view_state(replica: u64, state: Option<(&v1::StatusResponse, &ViewSnapshot)>) -> String {
    let recorder = PrometheusBuilder::new().build_recorder();
    let r = replica.to_string();
    ::metrics::with_local_recorder(&recorder, || {
        describe_gauge!("tessera_replica_up", "Whether this replica answered the scrape.");
        let Some((st, snap)) = state else {
            gauge!("tessera_replica_up", "replica" => r).set(0.0);
            return;
        };
        gauge!("tessera_replica_up", "replica" => r.clone()).set(1.0);
        describe_gauge!("tessera_replica_role", "The replica's raft role (1 for the current one).");
        for role in ROLES {
            gauge!("tessera_replica_role", "replica" => r.clone(), "role" => role)
                .set(f64::from(u8::from(st.role == role)));
        }
        describe_gauge!("tessera_replica_term", "The raft term.");
        gauge!("tessera_replica_term", "replica" => r.clone()).set(st.term as f64);
        describe_gauge!("tessera_replica_applied_index", "The raft index the view reflects.");
        gauge!("tessera_replica_applied_index", "replica" => r.clone()).set(st.applied_index as f64);
        describe_gauge!("tessera_replica_leader", "The leader's replica id (0: none known).");
        gauge!("tessera_replica_leader", "replica" => r.clone()).set(st.leader as f64);
        describe_gauge!("tessera_view_version", "The view version.");
        gauge!("tessera_view_version", "replica" => r).set(st.version as f64);
        describe_gauge!("tessera_jobs", "Jobs the view holds, by state.");
        for (state, n) in jobs_by_state(snap) {
            gauge!("tessera_jobs", "state" => state).set(n as f64);
        }
        describe_gauge!("tessera_gpus", "GPUs of the cluster by use (free: up, healthy, not held).");
        let c = GpuCounts::of(snap);
        for (what, n) in [("total", c.total), ("used", c.used), ("free", c.free), ("unavailable", c.unavailable)] {
            gauge!("tessera_gpus", "use" => what).set(n as f64);
        }
    });
    recorder.handle().render()
}

/// Prometheus text format: replica role, term, applied index; jobs by state; GPUs by use;
/// HTTP requests and latency.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"))
)]
pub(super) async fn metrics(api: web::Data<Api>) -> HttpResponse {
    let mut out = match api.own_state().await {
        Ok((st, snap)) => render_view_state(api.replica, Some((&st, &snap))),
        Err(e) => {
            tracing::debug!(error = %e, "metrics: the replica did not answer");
            render_view_state(api.replica, None)
        }
    };
    out.push_str(&api.metrics.render());
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_render_as_counter_and_histogram() {
        let m = HttpMetrics::new();
        m.observe("/v1/jobs", "POST", 201, Duration::from_millis(3));
        m.observe("/v1/jobs", "POST", 201, Duration::from_millis(30));
        let text = m.render();
        assert!(text.contains("# TYPE tessera_http_requests_total counter"), "{text}");
        assert!(
            text.contains("tessera_http_requests_total{route=\"/v1/jobs\",method=\"POST\",status=\"201\"} 2"),
            "{text}"
        );
        assert!(text.contains("# TYPE tessera_http_request_duration_seconds histogram"), "{text}");
        assert!(
            text.contains("tessera_http_request_duration_seconds_bucket{route=\"/v1/jobs\",le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tessera_http_request_duration_seconds_bucket{route=\"/v1/jobs\",le=\"+Inf\"} 2"),
            "{text}"
        );
        assert!(text.contains("tessera_http_request_duration_seconds_count{route=\"/v1/jobs\"} 2"), "{text}");
    }

    #[test]
    fn a_silent_replica_shows_down_and_nothing_else() {
        let text = render_view_state(3, None);
        assert!(text.contains("tessera_replica_up{replica=\"3\"} 0"), "{text}");
        assert!(!text.contains("tessera_jobs"), "{text}");
    }
}
