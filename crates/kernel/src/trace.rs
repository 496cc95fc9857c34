//! Trace context in NATS headers.
//!
//! A span's context crosses nodes only in the headers of the NATS message that carries the
//! work: the W3C `traceparent` and `tracestate` headers, written and read by the OpenTelemetry
//! [`TraceContextPropagator`]. [`HeaderInjector`] and [`HeaderExtractor`] adapt an
//! [`async_nats::HeaderMap`] to the propagator.

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The W3C header that names the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header that carries vendor trace state.
pub const TRACESTATE: &str = "tracestate";

/// Writes trace context into NATS headers.
pub struct HeaderInjector<'a>(pub &'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

/// Reads trace context from NATS headers.
pub struct HeaderExtractor<'a>(pub &'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

/// Writes `cx`'s span context into `headers` (nothing when it has no valid span).
pub fn inject(cx: &Context, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// The context named by `headers`' `traceparent`/`tracestate`; an empty context when they
/// are absent or malformed.
pub fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };

    #[test]
    fn a_span_context_survives_the_headers() {
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let cx = Context::new().with_remote_span_context(sc.clone());
        let mut headers = HeaderMap::new();
        inject(&cx, &mut headers);
        assert_eq!(
            headers.get(TRACEPARENT).map(|v| v.as_str()),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        let back = extract(&headers);
        let got = back.span().span_context().clone();
        assert_eq!(got.trace_id(), sc.trace_id());
        assert_eq!(got.span_id(), sc.span_id());
        assert!(got.is_remote());
    }

    #[test]
    fn a_caller_traceparent_is_read() {
        let mut headers = HeaderMap::new();
        headers.insert(
            TRACEPARENT,
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
        let cx = extract(&headers);
        assert_eq!(
            cx.span().span_context().trace_id(),
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap()
        );
    }

    #[test]
    fn a_malformed_traceparent_gives_no_parent() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, "not-a-traceparent");
        assert!(!extract(&headers).span().span_context().is_valid());
        let mut none = HeaderMap::new();
        inject(&Context::new(), &mut none);
        assert!(none.get(TRACEPARENT).is_none());
    }
}
