//! Trace context in NATS headers, and the spans of a call.
//!
//! A call's spans are `tracing` spans; where the node exports traces (the binary's OpenTelemetry
//! layer, `OTEL_EXPORTER_OTLP_ENDPOINT`), each becomes an OpenTelemetry span. A span's context
//! crosses nodes only in the headers of the NATS message that carries the work: the W3C
//! `traceparent` and `tracestate` headers, written and read by the OpenTelemetry
//! [`TraceContextPropagator`]. [`HeaderInjector`] and [`HeaderExtractor`] adapt an
//! [`async_nats::HeaderMap`] to the propagator.
//!
//! - The sender of work adds the current span's context to its message ([`current_headers`],
//!   [`request`]); without an exporter the current span has none, and no header is sent.
//! - The receiver makes that context the parent of its own span ([`follow`]); the actors'
//!   span is [`actor_span`].
//! - Every span of a call carries `invocation_id`, `account` and `tool`, and `session_id`,
//!   `user_id`, `agent_id` when the call has them (PROTOCOL.md "ToolRequest").

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::field;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::text::DisplaySafe;
use crate::wire::ActorCall;
use crate::Role;

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

/// Trace context given as text (an HTTP request's `traceparent` and `tracestate` headers, or
/// OpenTelemetry's environment carrier: the `TRACEPARENT` and `TRACESTATE` variables of a
/// process started inside a trace) as NATS headers, written anew from the parsed context;
/// `None` when `traceparent` names no valid span.
pub fn headers_from(traceparent: &str, tracestate: Option<&str>) -> Option<HeaderMap> {
    let mut carrier = std::collections::HashMap::new();
    carrier.insert(TRACEPARENT.to_owned(), traceparent.trim().to_owned());
    if let Some(state) = tracestate {
        carrier.insert(TRACESTATE.to_owned(), state.trim().to_owned());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut headers = HeaderMap::new();
    inject(&cx, &mut headers);
    Some(headers)
}

/// Makes the span context in `headers` (another node's, or a caller's `traceparent`) the
/// parent of `span`, which must not have been entered yet. Nothing happens when the headers
/// name no valid span or no exporter records spans.
pub fn follow(span: &tracing::Span, headers: Option<&HeaderMap>) {
    let Some(headers) = headers.filter(|h| h.get(TRACEPARENT).is_some()) else {
        return;
    };
    let parent = extract(headers);
    if parent.span().span_context().is_valid() {
        // Refused only when no exporter records spans: then there is no trace to join.
        let _ = span.set_parent(parent);
    }
}

/// The current span's context as NATS headers; `None` when no span is being recorded (no
/// exporter), so untraced nodes send no headers at all.
pub fn current_headers() -> Option<HeaderMap> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut headers = HeaderMap::new();
    inject(&cx, &mut headers);
    Some(headers)
}

/// `request` with the current span's context in its headers ([`current_headers`]).
pub fn request(request: async_nats::Request) -> async_nats::Request {
    match current_headers() {
        Some(headers) => request.headers(headers),
        None => request,
    }
}

/// The span of `role`'s actor running a routed call, a child of the span named in `headers`
/// (the gateway's call span). Its OpenTelemetry name is the role.
pub fn actor_span(role: Role, call: &ActorCall, headers: Option<&HeaderMap>) -> tracing::Span {
    let ctx = &call.invocation;
    let span = tracing::info_span!(
        "run",
        otel.name = role.as_str(),
        otel.kind = "server",
        role = role.as_str(),
        invocation_id = %ctx.invocation_id,
        account = %ctx.account,
        tool = %DisplaySafe(&call.tool),
        session_id = ctx.session_id.as_ref().map(|s| s.as_str()),
        user_id = ctx.user_id.as_deref().map(|u| field::display(DisplaySafe(u))),
        agent_id = ctx.agent_id.as_deref().map(|a| field::display(DisplaySafe(a))),
    );
    follow(&span, headers);
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

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

    /// A subscriber that records spans in memory, as the node's exporter would send them.
    fn recording() -> (
        opentelemetry_sdk::trace::InMemorySpanExporter,
        opentelemetry_sdk::trace::SdkTracerProvider,
        impl tracing::Subscriber + Send + Sync,
    ) {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        (
            exporter,
            provider,
            tracing_subscriber::registry().with(layer),
        )
    }

    fn call() -> ActorCall {
        ActorCall::parse(
            br#"{"invocation":{"account":"acme","invocation_id":"inv-1","session_id":"s-1","user_id":"u-1"},"tool":"read_workspace_file","arguments":{},"event_seq":1}"#,
        )
        .unwrap()
    }

    #[test]
    fn a_span_sent_in_headers_is_the_parent_on_the_other_side() {
        let (exporter, provider, subscriber) = recording();
        tracing::subscriber::with_default(subscriber, || {
            let sender = tracing::info_span!("call");
            let headers = sender
                .in_scope(current_headers)
                .expect("a recorded span sends headers");
            drop(sender);
            let receiver = actor_span(Role::Workspace, &call(), Some(&headers));
            receiver.in_scope(|| {});
        });
        provider.force_flush().unwrap();
        let spans = exporter.get_finished_spans().unwrap();
        let sender = spans
            .iter()
            .find(|s| s.name == "call")
            .expect("the sender's span");
        let receiver = spans
            .iter()
            .find(|s| s.name == "workspace")
            .expect("the actor's span");
        assert_eq!(
            receiver.span_context.trace_id(),
            sender.span_context.trace_id()
        );
        assert_eq!(receiver.parent_span_id, sender.span_context.span_id());
        assert_eq!(receiver.span_kind, opentelemetry::trace::SpanKind::Server);
        let attribute = |key: &str| {
            receiver
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(attribute("invocation_id").as_deref(), Some("inv-1"));
        assert_eq!(attribute("account").as_deref(), Some("acme"));
        assert_eq!(attribute("tool").as_deref(), Some("read_workspace_file"));
        assert_eq!(attribute("session_id").as_deref(), Some("s-1"));
        assert_eq!(attribute("user_id").as_deref(), Some("u-1"));
        assert_eq!(attribute("agent_id"), None);
    }

    #[test]
    fn without_an_exporter_no_header_is_sent() {
        let span = tracing::info_span!("call");
        assert!(span.in_scope(current_headers).is_none());
        let (_, _, subscriber) = recording();
        tracing::subscriber::with_default(subscriber, || {
            assert!(current_headers().is_none(), "no span is current");
        });
    }

    #[test]
    fn trace_context_from_text_is_checked_and_written_anew() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let headers = headers_from(&format!(" {parent}\n"), Some("k=v")).unwrap();
        assert_eq!(headers.get(TRACEPARENT).map(|v| v.as_str()), Some(parent));
        assert_eq!(headers.get(TRACESTATE).map(|v| v.as_str()), Some("k=v"));
        assert!(headers_from(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nX: y",
            None
        )
        .is_none());
        assert!(headers_from("garbage", Some("k=v")).is_none());
        assert!(headers_from("", None).is_none());
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
