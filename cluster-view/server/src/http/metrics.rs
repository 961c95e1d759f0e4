//! `GET /metrics`: Prometheus text through the `metrics` crate and its Prometheus exporter
//! (the renderer only; actix serves the text, the exporter runs no listener of its own).
//!
//! Three sources, none installed as the global recorder (so several replicas in one process
//! keep their own): the long-lived [`HttpMetrics`] counts requests and their latency by route,
//! method and status; the long-lived [`ApprovalMetrics`] counts what the gRPC service answered to
//! proposals, migrations and preemptions (the leader's approvals) and how long each call took;
//! the view's state (raft role, term, applied index, jobs by state, GPUs by use, by type and
//! tenant, the queue by size) is recorded into a fresh recorder at each scrape, so a replica
//! that does not answer shows `tessera_replica_up 0` and no stale values.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tessera_replica_up` | gauge | `replica` |
//! | `tessera_replica_role` | gauge (1 for the current role) | `replica`, `role` |
//! | `tessera_replica_term`, `tessera_replica_applied_index`, `tessera_replica_leader`, `tessera_view_version` | gauge | `replica` |
//! | `tessera_jobs` | gauge | `state` |
//! | `tessera_gpus` | gauge | `use` (`total`, `used`, `free`, `unavailable`) |
//! | `tessera_gpus_allocated` | gauge | `type` (device type), `tenant` |
//! | `tessera_jobs_holding` | gauge | `level` (the locality level of the placement) |
//! | `tessera_queue_jobs`, `tessera_queue_wait_max_seconds` | gauge | `size` ([`SIZES`]) |
//! | `tessera_proposals_total` | counter | `call` (`propose`, `migrate`, `preempt`), `outcome` ([`OUTCOMES`]), `reason` (the rejection's code, or the failed call's gRPC code) |
//! | `tessera_placements_total` | counter | `level` (of each accepted proposal) |
//! | `tessera_approval_duration_seconds` | histogram | `call` (arrival to answer, commit included) |
//! | `tessera_http_requests_total` | counter | `route`, `method`, `status` |
//! | `tessera_http_request_duration_seconds` | histogram | `route` |

use super::Api;
use ::metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use actix_web::{HttpResponse, web};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::collections::BTreeMap;
use std::time::Duration;
use tessera_proto::api::{GpuCounts, ROLES, jobs_by_state};
use tessera_proto::prom::Metrics;
use tessera_proto::v1;
use tessera_view::ViewSnapshot;

const REQUESTS: &str = "tessera_http_requests_total";
const LATENCY: &str = "tessera_http_request_duration_seconds";

/// Request counts and latencies by route, for `/metrics`. Routes are the registered patterns
/// (or `unmatched`), methods a fixed list, so the label sets stay bounded.
#[derive(Debug)]
pub struct HttpMetrics {
    metrics: Metrics,
}

impl HttpMetrics {
    /// An empty set, with the latency buckets.
    pub fn new() -> HttpMetrics {
        let metrics = Metrics::new();
        metrics.record(|| {
            describe_counter!(REQUESTS, "HTTP API requests by route, method and status.");
            describe_histogram!(LATENCY, ::metrics::Unit::Seconds, "HTTP API request latency by route.");
        });
        HttpMetrics { metrics }
    }

    /// Counts one request and its latency.
    pub fn observe(&self, route: &str, method: &'static str, status: u16, elapsed: Duration) {
        self.metrics.record(|| {
            let route = route.to_string();
            counter!(REQUESTS, "route" => route.clone(), "method" => method, "status" => status.to_string())
                .increment(1);
            histogram!(LATENCY, "route" => route).record(elapsed.as_secs_f64());
        });
    }

    /// The Prometheus text of the requests so far.
    pub fn render(&self) -> String {
        self.metrics.render()
    }
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics::new()
    }
}

/// Outcomes of one proposal in `tessera_proposals_total`: committed, a retry of a committed
/// one, refused as planned on stale state (a conflict), refused otherwise, decided but not known
/// to the caller (a leader change mid-call), or the whole call failed.
pub const OUTCOMES: [&str; 6] = ["accepted", "already_applied", "conflict", "refused", "unknown", "failed"];
const PROPOSALS: &str = "tessera_proposals_total";
const PLACEMENTS: &str = "tessera_placements_total";
const APPROVAL: &str = "tessera_approval_duration_seconds";

/// What the leader answered to proposals, migrations and preemptions, and how long each call
/// took from its arrival to its answer (the raft commit included). Counted by the gRPC service,
/// rendered by `/metrics`. Labels are fixed lists, rejection codes and gRPC codes: bounded.
#[derive(Debug)]
pub struct ApprovalMetrics {
    metrics: Metrics,
}

impl ApprovalMetrics {
    /// None counted yet.
    pub fn new() -> ApprovalMetrics {
        let metrics = Metrics::new();
        metrics.record(|| {
            describe_counter!(PROPOSALS, "Proposals this replica answered, by call, outcome and reason.");
            describe_counter!(PLACEMENTS, "Proposals this replica committed, by the locality level achieved.");
            describe_histogram!(
                APPROVAL,
                ::metrics::Unit::Seconds,
                "Propose, Migrate and Preempt calls, arrival to answer."
            );
            // Every series a dashboard reads exists from the start (at 0), on followers too.
            for call in ["propose", "migrate", "preempt"] {
                counter!(PROPOSALS, "call" => call, "outcome" => "accepted", "reason" => "").increment(0);
                let _ = histogram!(APPROVAL, "call" => call);
            }
            for level in tessera_view::LocalityLevel::ALL {
                counter!(PLACEMENTS, "level" => level.as_str()).increment(0);
            }
        });
        ApprovalMetrics { metrics }
    }

    /// Counts one call: `call` names it, `answer` is what it returned, `elapsed` how long it took.
    pub fn observe(
        &self,
        call: &'static str,
        answer: &Result<tonic::Response<v1::ProposeResponse>, tonic::Status>,
        elapsed: Duration,
    ) {
        self.metrics.record(|| {
            histogram!(APPROVAL, "call" => call).record(elapsed.as_secs_f64());
            let results = match answer {
                Ok(r) => &r.get_ref().results,
                Err(status) => {
                    let code = format!("{:?}", status.code());
                    counter!(PROPOSALS, "call" => call, "outcome" => "failed", "reason" => code).increment(1);
                    return;
                }
            };
            for r in results {
                let (outcome, reason) = outcome_of(r);
                counter!(PROPOSALS, "call" => call, "outcome" => outcome, "reason" => reason).increment(1);
                if let Some(v1::decision::Outcome::Accepted(a)) = r.decision.as_ref().and_then(|d| d.outcome.as_ref()) {
                    let level =
                        tessera_view::LocalityLevel::try_from(v1::LocalityLevel::try_from(a.level).unwrap_or_default())
                            .map_or("unknown", |l| l.as_str());
                    counter!(PLACEMENTS, "level" => level).increment(1);
                }
            }
        });
    }

    /// The Prometheus text of the calls so far.
    pub fn render(&self) -> String {
        self.metrics.render()
    }
}

impl Default for ApprovalMetrics {
    fn default() -> Self {
        ApprovalMetrics::new()
    }
}

/// The outcome and reason labels of one answered proposal.
pub(crate) fn outcome_of(r: &v1::ProposeResult) -> (&'static str, String) {
    use v1::decision::Outcome;
    match r.decision.as_ref().and_then(|d| d.outcome.as_ref()) {
        Some(Outcome::Accepted(_)) => ("accepted", String::new()),
        Some(Outcome::AlreadyApplied(_)) => ("already_applied", String::new()),
        Some(Outcome::Rejected(rej)) => {
            let reason = rej.reason.as_ref();
            let code = reason.map_or_else(String::new, |x| x.code.clone());
            (if reason.is_some_and(|x| x.conflict) { "conflict" } else { "refused" }, code)
        }
        None => ("unknown", String::new()),
    }
}

/// Size labels of the queue gauges, in GPUs.
pub const SIZES: [&str; 5] = ["1", "2-4", "5-8", "9-32", ">32"];

/// The size label of a job of `gpus` GPUs.
fn size_label(gpus: u32) -> &'static str {
    match gpus {
        0 | 1 => SIZES[0],
        2..=4 => SIZES[1],
        5..=8 => SIZES[2],
        9..=32 => SIZES[3],
        _ => SIZES[4],
    }
}

/// GPUs held by jobs, by the device type of their servers and the job's tenant.
fn allocated(s: &ViewSnapshot) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for j in s.jobs.iter().filter(|j| j.state.holds_resources()) {
        for m in j.placement.iter().flat_map(|p| &p.members) {
            let ty = s
                .servers
                .get(m.server.index())
                .and_then(|r| s.config_sets.get(r.config_set.index()))
                .and_then(|cs| s.topologies.get(usize::from(cs.topology)))
                .map_or_else(|| "unknown".to_string(), |t| t.device_type.clone());
            *out.entry((ty, j.spec.tenant.clone())).or_insert(0) += u64::from(m.gpus.count_ones());
        }
    }
    out
}

/// Pending jobs by size label: how many, and the longest wait (seconds) at `now_ms` (Unix ms)
/// since submission.
fn queue_by_size(s: &ViewSnapshot, now_ms: u64) -> BTreeMap<&'static str, (u64, f64)> {
    let mut out: BTreeMap<&'static str, (u64, f64)> = SIZES.iter().map(|z| (*z, (0, 0.0))).collect();
    for j in s.jobs.iter().filter(|j| j.state == tessera_view::JobState::Pending) {
        let e = out.entry(size_label(j.spec.total_gpus())).or_insert((0, 0.0));
        e.0 += 1;
        let waited = now_ms.saturating_sub(j.times.submitted_ms) as f64 / 1000.0;
        if j.times.submitted_ms > 0 && waited > e.1 {
            e.1 = waited;
        }
    }
    out
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
/// did not answer; `now_ms` (Unix ms) is the clock queue waits are counted to.
pub fn render_view_state(replica: u64, state: Option<(&v1::StatusResponse, &ViewSnapshot)>, now_ms: u64) -> String {
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
        describe_gauge!("tessera_gpus_allocated", "GPUs held by jobs, by device type and tenant.");
        for ((ty, tenant), n) in allocated(snap) {
            gauge!("tessera_gpus_allocated", "type" => ty, "tenant" => tenant).set(n as f64);
        }
        describe_gauge!("tessera_jobs_holding", "Jobs holding resources, by the locality level of their placement.");
        for level in tessera_view::LocalityLevel::ALL {
            let n = snap
                .jobs
                .iter()
                .filter(|j| j.state.holds_resources() && j.placement.as_ref().is_some_and(|p| p.level == level))
                .count();
            gauge!("tessera_jobs_holding", "level" => level.as_str()).set(n as f64);
        }
        describe_gauge!("tessera_queue_jobs", "Pending jobs, by size in GPUs.");
        describe_gauge!(
            "tessera_queue_wait_max_seconds",
            "The longest wait since submission of a pending job, by size."
        );
        for (size, (n, waited)) in queue_by_size(snap, now_ms) {
            gauge!("tessera_queue_jobs", "size" => size).set(n as f64);
            gauge!("tessera_queue_wait_max_seconds", "size" => size).set(waited);
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
        Ok((st, snap)) => render_view_state(api.replica, Some((&st, &snap)), crate::node::unix_ms()),
        Err(e) => {
            tracing::debug!(error = %e, "metrics: the replica did not answer");
            render_view_state(api.replica, None, 0)
        }
    };
    out.push_str(&api.approvals.render());
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
    fn approval_series_exist_at_zero_before_any_call() {
        let text = ApprovalMetrics::new().render();
        assert!(text.contains("tessera_placements_total{level=\"rack\"} 0"), "{text}");
        assert!(
            text.contains("tessera_proposals_total{call=\"migrate\",outcome=\"accepted\",reason=\"\"} 0"),
            "{text}"
        );
        assert!(text.contains("tessera_approval_duration_seconds_count{call=\"preempt\"} 0"), "{text}");
    }

    #[test]
    fn a_silent_replica_shows_down_and_nothing_else() {
        let text = render_view_state(3, None, 0);
        assert!(text.contains("tessera_replica_up{replica=\"3\"} 0"), "{text}");
        assert!(!text.contains("tessera_jobs"), "{text}");
    }
}
