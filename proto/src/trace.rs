//! Trace context across gRPC and HTTP: a job's path from submission to approval to task start
//! as one distributed trace.
//!
//! The spans are ordinary `tracing` spans of target [`TARGET`]; the process's subscriber (the
//! `tessera` binary's `telemetry` module) gives them OpenTelemetry ids and exports them over
//! OTLP when an endpoint is configured. This module moves the context between processes:
//!
//! - every gRPC call of a [`crate::client::ViewClient`] carries the current span's context as a
//!   W3C `traceparent` (the [`crate::tls::CallerAuth`] interceptor calls [`inject`]);
//! - a server parents its span on the caller's ([`remote`], [`remote_from`], then [`set_parent`]);
//! - a job remembers the trace of its admission ([`tessera_view::JobTrace`], replicated), so a
//!   scheduler host or an agent acting on it later parents its spans on it ([`job_context`])
//!   and a task gets it as `TRACEPARENT` in its environment.
//!
//! Without a subscriber that records these spans (a library user's own, or none) nothing is
//! injected and admissions still get a trace ([`admission_trace`] makes fresh ids).

pub use opentelemetry::Context;
pub use opentelemetry::context::FutureExt;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tessera_view::JobTrace;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of the spans that make up jobs' traces (the subscriber exports these).
pub const TARGET: &str = "tessera::trace";

/// The W3C header that carries a trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The W3C header that carries vendors' trace state along with it.
pub const TRACESTATE: &str = "tracestate";

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value.as_str())) {
            self.0.insert(k, v);
        }
    }
}

/// The two trace-context headers of a request, copied out of it.
struct Headers {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Extractor for Headers {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.traceparent.as_deref(),
            TRACESTATE => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// Writes the current span's trace context into `md` as `traceparent` (and `tracestate`); when
/// no subscriber records the current span, the OpenTelemetry context the call runs in (see
/// [`FutureExt::with_context`]: a server passing its caller's on); nothing without either.
pub fn inject(md: &mut MetadataMap) {
    let mut cx = Span::current().context();
    if !cx.span().span_context().is_valid() {
        cx = Context::current();
    }
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(md));
    }
}

/// The caller's trace context, when its gRPC metadata carries a valid one.
pub fn remote(md: &MetadataMap) -> Option<Context> {
    remote_from(|k| md.get(k).and_then(|v| v.to_str().ok()))
}

/// The caller's trace context from headers read by `get` (an HTTP request's), when valid.
pub fn remote_from<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<Context> {
    if !get(TRACEPARENT).is_some_and(well_formed) {
        return None;
    }
    let headers =
        Headers { traceparent: get(TRACEPARENT).map(str::to_string), tracestate: get(TRACESTATE).map(str::to_string) };
    let cx = TraceContextPropagator::new().extract(&headers);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Whether `v` has the W3C shape: `version-traceid-parentid-flags` in lower-case hex of 2, 32,
/// 16 and 2 digits (version `ff` is invalid; version `00` has exactly these four fields). The
/// propagator alone takes shorter ids (`00-4bf9-00f0-01`), which the specification refuses.
fn well_formed(v: &str) -> bool {
    let parts: Vec<&str> = v.trim().split('-').collect();
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    parts.len() >= 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && (parts[0] != "00" || parts.len() == 4)
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
}

/// The context of `trace`: the job's admission span as a remote, sampled parent.
pub fn job_context(trace: &JobTrace) -> Context {
    let sc = SpanContext::new(
        TraceId::from(trace.trace_id),
        SpanId::from(trace.span_id),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    Context::new().with_remote_span_context(sc)
}

/// Parents `span` on `cx` (a span no subscriber records, or one already started, is left as
/// it is: tracing is never a reason to fail a call).
pub fn set_parent(span: &Span, cx: Context) {
    let _ = span.set_parent(cx);
}

/// `span` parented on a job's trace, when the job has one: how the scheduler host and the
/// agent record what they do for a job under the trace of its admission.
pub fn on_job(span: Span, trace: Option<&JobTrace>) -> Span {
    if let Some(t) = trace {
        set_parent(&span, job_context(t));
    }
    span
}

/// The trace `span` is recorded under, with `span` itself as the span; `None` when no
/// subscriber records it.
pub fn trace_of(span: &Span) -> Option<JobTrace> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    JobTrace::new(u128::from_be_bytes(sc.trace_id().to_bytes()), u64::from_be_bytes(sc.span_id().to_bytes()))
}

/// The trace to record a job's admission under: `span`'s own when a subscriber records it;
/// else the caller's trace (`remote`) with a fresh span id; else a fresh trace. Called by the
/// leader before it proposes the submission (the command carries the result, so every replica
/// holds the same).
pub fn admission_trace(span: &Span, remote: Option<&Context>) -> JobTrace {
    if let Some(t) = trace_of(span) {
        return t;
    }
    let fresh_span = || rand::random::<u64>() | 1;
    let trace_id = remote
        .map(|cx| u128::from_be_bytes(cx.span().span_context().trace_id().to_bytes()))
        .filter(|t| *t != 0)
        .unwrap_or_else(|| rand::random::<u128>() | 1);
    JobTrace { trace_id, span_id: fresh_span() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_from_metadata_and_headers_and_a_malformed_one_is_ignored() {
        let t = JobTrace::new(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736, 0x00f0_67aa_0ba9_02b7).expect("trace");
        let mut md = MetadataMap::new();
        md.insert(TRACEPARENT, t.traceparent().parse().expect("ascii"));
        let cx = remote(&md).expect("valid");
        let sc = cx.span().span_context().clone();
        assert_eq!(u128::from_be_bytes(sc.trace_id().to_bytes()), t.trace_id);
        assert_eq!(u64::from_be_bytes(sc.span_id().to_bytes()), t.span_id);
        assert!(sc.is_remote() && sc.is_sampled());
        // A job's context is the same parent.
        assert_eq!(job_context(&t).span().span_context(), &sc);

        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf9-00f0-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            let mut md = MetadataMap::new();
            md.insert(TRACEPARENT, bad.parse().expect("ascii"));
            assert!(remote(&md).is_none(), "{bad} accepted");
        }
        assert!(remote(&MetadataMap::new()).is_none());
        let header = t.traceparent();
        assert!(remote_from(|k| (k == TRACEPARENT).then_some(header.as_str())).is_some());
    }

    #[test]
    fn without_a_recording_subscriber_nothing_is_injected_and_an_admission_still_gets_a_trace() {
        let span = tracing::info_span!(target: TARGET, "view.submit");
        assert_eq!(trace_of(&span), None);
        let mut md = MetadataMap::new();
        span.in_scope(|| inject(&mut md));
        assert!(md.get(TRACEPARENT).is_none());

        // The caller's trace is continued under a fresh span; without one, a fresh trace.
        let caller = JobTrace::new(7, 9).expect("trace");
        let cx = job_context(&caller);
        let a = admission_trace(&span, Some(&cx));
        assert_eq!(a.trace_id, 7);
        assert_ne!(a.span_id, 0);
        let b = admission_trace(&span, None);
        assert!(b.trace_id != 0 && b.span_id != 0);
        assert_ne!(b.trace_id, admission_trace(&span, None).trace_id);
    }
}
