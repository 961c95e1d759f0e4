//! The process's `tracing` subscriber: logs to stderr, and jobs' traces as OpenTelemetry spans,
//! exported over OTLP/gRPC when an endpoint is configured.
//!
//! Two layers, each with its own filter:
//! - the log layer prints events at `RUST_LOG`'s levels (default: warnings);
//! - the trace layer sees only the spans of target [`tessera_proto::trace::TARGET`] (a job's
//!   admission, placement, approval and task starts), whatever `RUST_LOG` says, and gives them
//!   OpenTelemetry ids. Without an endpoint it exports nothing, but the ids still travel: a
//!   job is admitted under its submitter's trace and its tasks get `TRACEPARENT`.
//!
//! With `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`), finished spans are batched and
//! sent by a small runtime of their own (the tonic exporter needs one), so a slow or absent
//! collector never holds up scheduling: the batch queue is bounded (2,048 spans by default;
//! more are dropped) and each export times out (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s). The
//! standard `OTEL_SERVICE_NAME` and `OTEL_BSP_*` variables apply.

use anyhow::{Context as _, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use std::time::Duration;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// The installed trace pipeline; [`Telemetry::shutdown`] exports what is left.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
    /// Runs the exporter's gRPC client; kept until the provider has shut down.
    runtime: Option<tokio::runtime::Runtime>,
}

/// The OTLP/gRPC exporter to `endpoint` (plaintext `http://`: a collector beside the process;
/// the exporter is built without TLS, so an `https://` endpoint is refused here) and the
/// runtime its client runs on.
fn exporter(endpoint: &str) -> Result<(tokio::runtime::Runtime, opentelemetry_otlp::SpanExporter)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .context("a runtime for the OTLP exporter")?;
    let exporter = rt
        .block_on(async { opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint).build() })
        .with_context(|| format!("the OTLP exporter to {endpoint}"))?;
    Ok((rt, exporter))
}

/// How long the last export may take when the process ends.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

impl Telemetry {
    /// Installs the subscriber for service `service`: logs at `RUST_LOG` (else `default_log`)
    /// and jobs' spans, exported to `otlp` (an `http://host:port` gRPC endpoint) when given.
    pub fn init(service: &str, default_log: &str, otlp: Option<&str>) -> Result<Telemetry> {
        let service = std::env::var("OTEL_SERVICE_NAME").ok().filter(|s| !s.is_empty()).unwrap_or(service.into());
        let resource = Resource::builder().with_service_name(service).build();
        // Every job's trace is recorded whole: a host or an agent acting on a job later cannot
        // know a caller's sampling decision, so the admission is always sampled too.
        let mut builder = SdkTracerProvider::builder().with_resource(resource).with_sampler(Sampler::AlwaysOn);
        let mut runtime = None;
        // An exporter that cannot be made costs the traces, never the process: it logs why.
        let mut unexported = None;
        if let Some(endpoint) = otlp {
            match exporter(endpoint) {
                Ok((rt, exporter)) => {
                    builder = builder.with_batch_exporter(exporter);
                    runtime = Some(rt);
                }
                Err(e) => unexported = Some(format!("{e:#}")),
            }
        }
        let provider = builder.build();
        let traces = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("tessera"))
            .with_filter(Targets::new().with_target(tessera_proto::trace::TARGET, tracing::Level::INFO));
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colour codes only on a terminal: journald, `docker logs` and log files get plain text.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| default_log.into()));
        Registry::default().with(logs).with(traces).try_init().context("installing the tracing subscriber")?;
        if let Some(why) = unexported {
            tracing::warn!(error = %why, "spans are not exported");
        }
        Ok(Telemetry { provider, runtime })
    }

    /// Exports the spans still queued (bounded by [`SHUTDOWN_WAIT`]) and stops the exporter.
    pub fn shutdown(mut self) {
        if let Some(rt) = self.runtime.take() {
            if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_WAIT) {
                tracing::warn!(error = %e, "the last spans were not exported");
            }
            rt.shutdown_timeout(SHUTDOWN_WAIT);
        }
    }
}
