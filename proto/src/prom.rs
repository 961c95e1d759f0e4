//! Prometheus metrics of every Tessera process: a long-lived recorder, and [`serve`], the small
//! HTTP listener that agents and scheduler hosts answer scrapes on (replicas expose theirs on
//! their HTTP API).
//!
//! [`Metrics`] wraps a recorder of the `metrics` crate that is never installed globally, so
//! several components sharing a process (`tessera dev`, tests) keep their own figures; code
//! counts inside [`Metrics::record`] with the crate's macros. Histograms whose name ends in
//! `_seconds` get the latency buckets [`LATENCY_BUCKETS_S`].
//!
//! [`serve`] answers `GET /metrics` (Prometheus text format 0.0.4) and `GET /healthz` on a
//! bound socket, over TLS with the component's own certificate when the component runs with
//! TLS (a scraper needs no client certificate: the figures are counts, not job data).

use crate::tls::Security;
use actix_web::{App, HttpResponse, HttpServer, web};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of every latency histogram's buckets: from a loopback round trip
/// (1 ms) to a leader election (seconds).
pub const LATENCY_BUCKETS_S: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// Samples recorded between two folds of the histograms' raw samples into their buckets (the
/// exporter keeps raw samples until then; a render folds them too), so memory stays bounded
/// between scrapes.
const UPKEEP_EVERY: u64 = 256;

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A component's metrics: count into it with [`Metrics::record`], read with [`Metrics::render`].
#[derive(Debug)]
pub struct Metrics {
    recorder: PrometheusRecorder,
    recorded: AtomicU64,
}

impl Metrics {
    /// An empty set; `_seconds` histograms get [`LATENCY_BUCKETS_S`].
    pub fn new() -> Metrics {
        let builder = PrometheusBuilder::new();
        // Only fails for an empty bucket list, which LATENCY_BUCKETS_S is not.
        let builder = match builder.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS_S) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "latency buckets refused; latencies are summaries");
                PrometheusBuilder::new()
            }
        };
        Metrics { recorder: builder.build_recorder(), recorded: AtomicU64::new(0) }
    }

    /// Runs `f` with this set as the `metrics` crate's recorder: its `counter!`, `gauge!`,
    /// `histogram!` and `describe_*!` calls land here.
    pub fn record<R>(&self, f: impl FnOnce() -> R) -> R {
        let r = ::metrics::with_local_recorder(&self.recorder, f);
        if self.recorded.fetch_add(1, Ordering::Relaxed) % UPKEEP_EVERY == UPKEEP_EVERY - 1 {
            self.recorder.handle().run_upkeep();
        }
        r
    }

    /// The Prometheus text of everything recorded so far.
    pub fn render(&self) -> String {
        self.recorder.handle().render()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// What a scrape answers: the text of the component's metrics at that moment.
pub type Exposition = Arc<dyn Fn() -> String + Send + Sync>;

/// Why [`serve`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket could not be used.
    #[error("metrics listener on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The component's TLS settings could not make a server configuration.
    #[error("metrics listener: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// Binds `addr` (`host:port`, port 0 picks one) and answers scrapes there with `exposition`
/// until `stop` resolves; returns the bound address. Runs on the caller's tokio runtime with
/// one worker thread: a scrape renders a few kilobytes.
pub async fn serve(
    addr: &str,
    security: &Security,
    exposition: Exposition,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr, ServeError> {
    let listen = |source| ServeError::Listen { addr: addr.to_string(), source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(listen)?;
    let listener = listener.into_std().map_err(listen)?;
    let tls = match security.tls() {
        Some(t) => Some(crate::tls::server::server_config(t, &[b"http/1.1"])?),
        None => None,
    };
    let text = web::Data::new(exposition);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(text.clone())
            .route("/metrics", web::get().to(metrics))
            .route("/healthz", web::get().to(|| async { HttpResponse::Ok().body("ok\n") }))
    })
    .workers(1)
    .max_connections(64)
    .client_request_timeout(Duration::from_secs(5))
    .disable_signals()
    .shutdown_timeout(1)
    .shutdown_signal(stop);
    let server = match tls {
        Some(c) => server.listen_rustls_0_23(listener, (*c).clone()).map_err(listen)?,
        None => server.listen(listener).map_err(listen)?,
    };
    let bound = server.addrs().first().copied().ok_or_else(|| listen(std::io::ErrorKind::AddrNotAvailable.into()))?;
    let run = server.run();
    tokio::spawn(async move {
        if let Err(e) = run.await {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    Ok(bound)
}

async fn metrics(text: web::Data<Exposition>) -> HttpResponse {
    HttpResponse::Ok().content_type(CONTENT_TYPE).body((text.get_ref())())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::metrics::{counter, histogram};

    #[test]
    fn seconds_histograms_get_the_latency_buckets_and_counters_count() {
        let m = Metrics::new();
        m.record(|| {
            counter!("tessera_things_total", "kind" => "a").increment(2);
            histogram!("tessera_wait_seconds").record(0.004);
            histogram!("tessera_wait_seconds").record(3.0);
        });
        let text = m.render();
        assert!(text.contains("tessera_things_total{kind=\"a\"} 2"), "{text}");
        assert!(text.contains("# TYPE tessera_wait_seconds histogram"), "{text}");
        assert!(text.contains("tessera_wait_seconds_bucket{le=\"0.005\"} 1"), "{text}");
        assert!(text.contains("tessera_wait_seconds_bucket{le=\"+Inf\"} 2"), "{text}");
    }

    #[tokio::test]
    async fn a_scrape_reads_the_exposition_at_that_moment_and_stop_ends_the_listener() {
        let m = Arc::new(Metrics::new());
        let shown = m.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let addr = serve("127.0.0.1:0", &Security::Insecure, Arc::new(move || shown.render()), async move {
            let _ = rx.await;
        })
        .await
        .expect("serving");
        m.record(|| counter!("tessera_scraped_total").increment(1));
        let body = get(addr, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("text/plain; version=0.0.4"), "{body}");
        assert!(body.contains("tessera_scraped_total 1"), "{body}");
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/other").await.starts_with("HTTP/1.1 404"));
        tx.send(()).expect("listener waiting");
        // Bounded: the listener closes within its 1 s shutdown timeout.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            assert!(tokio::time::Instant::now() < deadline, "still listening after stop");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One HTTP/1.1 request, the whole answer as text.
    async fn get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }
}
