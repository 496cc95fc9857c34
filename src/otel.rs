//! A node's traces: its `tracing` spans, exported as OpenTelemetry spans over OTLP/HTTP when the
//! standard OpenTelemetry variables ask for it (docs/metrics-and-traces.md).
//!
//! - On when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set; off
//!   when `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
//! - `OTEL_EXPORTER_OTLP_PROTOCOL` is `http/protobuf` (the default) or `http/json`; `grpc` stops
//!   the node with a message, as does any setting the exporter refuses.
//! - The exporter reads the rest of the standard variables itself (headers, timeout,
//!   compression), the SDK reads the sampler (`OTEL_TRACES_SAMPLER`) and the batch settings
//!   (`OTEL_BSP_*`).
//! - The resource is `service.name` (`OTEL_SERVICE_NAME`, else `toolmesh`), `service.version`,
//!   and `service.instance.id`, the node id.
//! - Spans of toolmesh's own crates at level INFO and above are exported, whatever `RUST_LOG`
//!   says of the log.
//! - [`Exporter`] flushes what is left when it is dropped, as the node stops.

use std::time::Duration;

use anyhow::{bail, Context as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

/// How long the node waits, as it stops, for its last spans to leave.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The variables that switch the exporter on; the first set one names the endpoint.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The protocol variables, the signal's own first.
const PROTOCOL_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

/// A running exporter; flushes and stops when dropped.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// The tracer that the node's OpenTelemetry layer records into.
    pub fn tracer(&self) -> opentelemetry_sdk::trace::Tracer {
        self.provider.tracer("toolmesh")
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
            eprintln!("toolmesh: traces not all exported at stop: {e}");
        }
    }
}

/// The exporter the environment asks for; `None` when traces are off.
pub fn from_env(node_id: &str) -> anyhow::Result<Option<Exporter>> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
    {
        return Ok(None);
    }
    let Some(endpoint) = ENDPOINT_VARS.iter().find_map(|name| var(name)) else {
        return Ok(None);
    };
    // Set here, not left to the exporter: its default follows its crate features, the
    // standard's is http/protobuf.
    let protocol = match PROTOCOL_VARS
        .iter()
        .find_map(|name| var(name).map(|v| (name, v)))
    {
        None => Protocol::HttpBinary,
        Some((_, v)) if v.trim() == "http/protobuf" => Protocol::HttpBinary,
        Some((_, v)) if v.trim() == "http/json" => Protocol::HttpJson,
        Some((name, v)) => bail!("{name}={v}: this node exports traces over OTLP/HTTP only; set it to http/protobuf or http/json (a collector's port 4318)"),
    };
    // The HTTP client (with TLS for an https endpoint) takes the process's TLS provider:
    // ring, as everywhere in toolmesh. It is needed to build the client at all.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .build()
        .with_context(|| format!("cannot export traces to {endpoint} (OTEL_EXPORTER_OTLP_*)"))?;
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("service.instance.id", node_id.to_owned()),
        KeyValue::new("service.version", toolmesh_kernel::VERSION),
    ]);
    let named = var("OTEL_SERVICE_NAME").is_some()
        || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|v| v.contains("service.name="));
    if !named {
        resource = resource.with_service_name("toolmesh");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    Ok(Some(Exporter { provider }))
}
