//! Traces: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, every node sends its spans of a call over
//! OTLP/HTTP, and the spans of one call form one trace across nodes (the context travels in
//! NATS headers). The collector is a real OTLP/HTTP endpoint run by the test: it decodes each
//! export with the OpenTelemetry protobuf definitions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use serde_json::json;

use toolmesh_testkit::wait_until;

use crate::support::{node_refusal, ok, tokens_file, Cluster, Recorder};

/// How long the collector waits for spans to come.
const WITHIN: Duration = Duration::from_secs(10);

/// One span as the collector received it, with its resource's attributes.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    trace_id: String,
    span_id: String,
    /// Empty for a root span.
    parent_span_id: String,
    kind: i32,
    /// The status code: 0 unset, 1 ok, 2 error.
    status: i32,
    /// How the export that carried it was encoded.
    content_type: &'static str,
    attributes: HashMap<String, String>,
    resource: HashMap<String, String>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    fn node(&self) -> &str {
        self.resource
            .get("service.instance.id")
            .map_or("", String::as_str)
    }
}

/// An OTLP/HTTP trace collector on loopback: `POST /v1/traces`, protobuf.
type Collector = Recorder<Received>;

impl Collector {
    async fn start() -> Collector {
        Recorder::serve(|spans| {
            axum::Router::new()
                .route("/v1/traces", axum::routing::post(export))
                .with_state(spans)
        })
        .await
    }

    fn spans_of(&self, trace_id: &str) -> Vec<Received> {
        let spans = self.records().into_iter();
        spans.filter(|s| s.trace_id == trace_id).collect()
    }

    /// The gateway's `call` span of `invocation_id`, if it came.
    fn call_of(&self, invocation_id: &str) -> Option<Received> {
        let mut spans = self.records().into_iter();
        spans.find(|s| s.name == "call" && s.attribute("invocation_id") == Some(invocation_id))
    }

    /// The spans of `trace_id` once every name in `names` is among them (10 s at most).
    async fn wait_for(&self, trace_id: &str, names: &[&str]) -> Vec<Received> {
        let complete = || {
            let spans = self.spans_of(trace_id);
            names.iter().all(|n| spans.iter().any(|s| s.name == *n))
        };
        let came = wait_until(WITHIN, || async { complete() }).await;
        assert!(
            came,
            "spans {names:?} of trace {trace_id} never came; received: {:#?}",
            self.records()
        );
        self.spans_of(trace_id)
    }

    /// The gateway's `call` span of `invocation_id` once it came (10 s at most).
    async fn call_span(&self, invocation_id: &str) -> Received {
        let came = wait_until(WITHIN, || async { self.call_of(invocation_id).is_some() }).await;
        assert!(came, "the call span of {invocation_id} never came");
        self.call_of(invocation_id).unwrap()
    }

    /// The environment that sends a node's spans here, in batches of at most `delay_ms`,
    /// encoded as `protocol` (`http/protobuf` or `http/json`).
    fn env(&self, delay_ms: &str, protocol: &str) -> Vec<(&str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.base.clone()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY", delay_ms.to_owned()),
        ]
    }
}

async fn export(
    State(spans): State<Arc<Mutex<Vec<Received>>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    let json = [(header::CONTENT_TYPE, "application/json")];
    let (request, reply_type) = match headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        Some("application/x-protobuf") => (
            ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string()),
            protobuf,
        ),
        Some("application/json") => (
            serde_json::from_slice::<ExportTraceServiceRequest>(&body).map_err(|e| e.to_string()),
            json,
        ),
        _ => return (StatusCode::UNSUPPORTED_MEDIA_TYPE, protobuf, Vec::new()),
    };
    let Ok(request) = request else {
        return (StatusCode::BAD_REQUEST, reply_type, Vec::new());
    };
    let mut received = spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let resource = attributes(
            &resource_spans
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default(),
        );
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(Received {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    status: span.status.map_or(0, |s| s.code),
                    content_type: reply_type[0].1,
                    attributes: attributes(&span.attributes),
                    resource: resource.clone(),
                });
            }
        }
    }
    let reply = if reply_type[0].1 == "application/json" {
        b"{}".to_vec()
    } else {
        ExportTraceServiceResponse::default().encode_to_vec()
    };
    (StatusCode::OK, reply_type, reply)
}

fn attributes(list: &[KeyValue]) -> HashMap<String, String> {
    list.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Asserts that `span` carries each of `expected`'s attributes with its value.
fn assert_attributes(span: &Received, expected: &[(&str, &str)]) {
    for (key, value) in expected {
        assert_eq!(span.attribute(key), Some(*value), "{key} of {span:#?}");
    }
}

fn one<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    let found: Vec<&Received> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one {name} span: {spans:#?}");
    found[0]
}

/// Starts a node with the collector's environment plus `extra`.
async fn start_traced(c: &mut Cluster, roles: &str, env: &[(&str, String)]) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    c.start_node(roles, &env).await;
}

/// A collector, and servers with a node of each of `roles` exporting to it.
async fn traced(delay_ms: &str, protocol: &str, roles: &[&str]) -> (Collector, Cluster) {
    let collector = Collector::start().await;
    let env = collector.env(delay_ms, protocol);
    let mut c = Cluster::servers().await;
    for roles in roles {
        start_traced(&mut c, roles, &env).await;
    }
    (collector, c)
}

#[tokio::test]
async fn a_call_is_one_trace_across_gateway_approval_and_workspace() {
    let (collector, c) = traced("50", "http/protobuf", &["gateway", "approval", "workspace"]).await;
    let (gateway, approval, workspace) = ("test-node-1", "test-node-2", "test-node-3");

    // The caller is in a trace of its own: its `traceparent` is the call's parent.
    let (trace_id, caller_span) = ("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174");
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        "traceparent",
        format!("00-{trace_id}-{caller_span}-01").as_str(),
    );
    let body = json!({
        "tool": "write_workspace_file", "session_id": "s1", "invocation_id": "inv-traced",
        "user_id": "ann", "agent_id": "bot-7", "approval": {"approved": true},
        "arguments": {"path": "a.txt", "content": "hello\n"},
    });
    let reply = c
        .client
        .send_request(
            "toolmesh.v1.call.acme",
            async_nats::Request::new()
                .headers(headers)
                .payload(serde_json::to_vec(&body).unwrap().into())
                .timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    ok(serde_json::from_slice(&reply.payload).unwrap());

    let spans = collector
        .wait_for(
            trace_id,
            &["call", "approval gate", "pass_gate", "workspace"],
        )
        .await;
    assert!(spans
        .iter()
        .all(|s| s.content_type == "application/x-protobuf"));
    let call = one(&spans, "call");
    assert_eq!(call.parent_span_id, caller_span);
    assert_eq!(call.node(), gateway);
    assert_eq!(call.kind, SpanKind::Server as i32);
    assert_eq!(call.resource.get("service.name").unwrap(), "toolmesh");
    // What every span of the call carries.
    let of_the_call = [
        ("invocation_id", "inv-traced"),
        ("account", "acme"),
        ("tool", "write_workspace_file"),
        ("session_id", "s1"),
        ("user_id", "ann"),
        ("agent_id", "bot-7"),
    ];
    assert_attributes(call, &of_the_call);
    assert_attributes(call, &[("outcome", "ok")]);

    let gate = one(&spans, "approval gate");
    assert_eq!(gate.parent_span_id, call.span_id, "{gate:#?}");
    assert_eq!(gate.node(), approval);
    let pass = one(&spans, "pass_gate");
    assert_eq!(pass.parent_span_id, gate.span_id);
    assert_eq!(pass.attribute("invocation_id"), Some("inv-traced"));
    assert_eq!(pass.attribute("tool"), Some("write_workspace_file"));

    let run = one(&spans, "workspace");
    assert_eq!(run.parent_span_id, call.span_id, "{run:#?}");
    assert_eq!(run.node(), workspace);
    assert_eq!(run.kind, SpanKind::Server as i32);
    assert_attributes(run, &of_the_call);
}

#[tokio::test]
async fn a_call_without_a_trace_starts_one_and_a_stopping_node_sends_its_last_spans_in_json() {
    // Batches leave every ten minutes: what arrives was sent when the node stopped. In JSON,
    // the other encoding of OTLP/HTTP.
    let (collector, mut c) =
        traced("600000", "http/json", &["gateway,approval", "workspace"]).await;
    ok(c.call(
        "acme",
        json!({"tool": "list_workspace_files", "session_id": "s1",
                   "invocation_id": "inv-root", "arguments": {"path": "."}}),
    )
    .await);
    let failed = c
        .call(
            "acme",
            json!({"tool": "no_such_tool", "invocation_id": "inv-bad"}),
        )
        .await;
    assert_eq!(failed["error"], "unknown_tool", "{failed}");
    // The test's subject: nothing arrives within a while (here 300 ms), not a wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        collector.records().is_empty(),
        "nothing is sent before a batch is due"
    );

    for node in c.nodes.iter_mut() {
        node.terminate();
        assert!(
            node.wait_exit(Duration::from_secs(20)).await.is_some(),
            "the node stops"
        );
    }
    let received = || format!("{:#?}", collector.records());
    let root = collector
        .call_of("inv-root")
        .unwrap_or_else(|| panic!("the listing's call span: {}", received()));
    assert_eq!(
        root.parent_span_id, "",
        "no caller trace: the call is the root"
    );
    let spans = collector.spans_of(&root.trace_id);
    assert!(spans.iter().all(|s| s.content_type == "application/json"));
    let run = one(&spans, "workspace");
    assert_eq!(run.parent_span_id, root.span_id);
    assert_eq!(run.node(), "test-node-2");

    let bad = collector
        .call_of("inv-bad")
        .unwrap_or_else(|| panic!("the failed call's span: {}", received()));
    assert_eq!(bad.attribute("outcome"), Some("unknown_tool"));
    assert_eq!(bad.status, 2, "an error status: {bad:#?}");
    assert_eq!(root.status, 0, "{root:#?}");
    assert_ne!(
        bad.trace_id, root.trace_id,
        "each call is a trace of its own"
    );
}

#[test]
fn a_grpc_collector_is_refused_with_the_way_out() {
    let stderr = node_refusal(
        "gateway",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ],
    );
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc") && stderr.contains("http/protobuf"),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_mcp_clients_traceparent_reaches_through_the_front_to_the_actor() {
    let (collector, mut c) = traced("50", "http/protobuf", &["gateway,approval,workspace"]).await;
    let (_dir, tokens) = tokens_file(&json!({"tok-a": {"account": "acme"}}));
    let mut front = collector.env("50", "http/protobuf");
    front.push(("TOOLMESH_MCP_LISTEN", "127.0.0.1:0".to_owned()));
    front.push(("TOOLMESH_MCP_TOKENS", tokens.display().to_string()));
    start_traced(&mut c, "mcp", &front).await;
    let url = format!(
        "http://{}/mcp",
        c.nodes[1].addr(toolmesh_testkit::Listener::Mcp)
    );

    let (trace_id, caller_span) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let lines = crate::mcp::client(
        json!({"http": url, "token": "tok-a", "session": "s1",
               "headers": {"traceparent": format!("00-{trace_id}-{caller_span}-01")}}),
        json!({"steps": [{"call": "list_workspace_files", "args": {"path": "."}}]}),
    )
    .await;
    assert_eq!(crate::mcp::reply(&lines, 0)["ok"], true, "{lines:#?}");

    let spans = collector
        .wait_for(trace_id, &["mcp tools/call", "call", "workspace"])
        .await;
    let mcp = one(&spans, "mcp tools/call");
    assert_eq!(mcp.parent_span_id, caller_span);
    assert_eq!(mcp.node(), "test-node-2");
    assert_eq!(mcp.attribute("tool"), Some("list_workspace_files"));
    assert_eq!(mcp.attribute("session_id"), Some("s1"));
    let call = one(&spans, "call");
    assert_eq!(call.parent_span_id, mcp.span_id);
    assert_eq!(call.node(), "test-node-1");
    let run = one(&spans, "workspace");
    assert_eq!(run.parent_span_id, call.span_id);
}

#[tokio::test]
async fn a_sandbox_command_is_a_span_of_the_worker_that_ran_it() {
    use crate::sandbox::{unique_servers, SandboxCluster, BASE_ENV};
    let collector = Collector::start().await;
    let mut env = collector.env("50", "http/protobuf");
    env.extend(BASE_ENV.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let mut c = SandboxCluster {
        c: unique_servers().await,
    };
    start_traced(&mut c, "gateway,approval,workspace", &env).await;
    start_traced(&mut c, "sandbox", &env).await;
    let worker = format!("{}-2", c.node_prefix);

    let reply = c
        .call(
            "acme",
            json!({"tool": "run_command", "session_id": "s1", "invocation_id": "inv-sbx",
                   "arguments": {"command": "echo hi"}}),
        )
        .await;
    assert_eq!(reply["stdout"], "hi\n", "{reply}");
    let root = collector.call_span("inv-sbx").await;
    let spans = collector.wait_for(&root.trace_id, &["sandbox"]).await;
    let run = one(&spans, "sandbox");
    assert_eq!(run.parent_span_id, root.span_id);
    assert_eq!(run.node(), worker);
    assert_eq!(run.attribute("tool"), Some("run_command"));
    assert_eq!(run.attribute("session_id"), Some("s1"));
}

#[tokio::test]
async fn the_command_line_continues_the_trace_of_its_environment() {
    let (collector, c) = traced("50", "http/protobuf", &["gateway,approval"]).await;
    let (trace_id, script_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let out = tokio::process::Command::new(crate::support::BIN)
        .args(["call", "component_status", "--account", "acme"])
        .args(["--invocation-id", "inv-cli"])
        .env("TOOLMESH_NATS_URL", c.nats.url())
        .env("TRACEPARENT", format!("00-{trace_id}-{script_span}-01"))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let spans = collector.wait_for(trace_id, &["call"]).await;
    let call = one(&spans, "call");
    assert_eq!(call.parent_span_id, script_span);
    assert_eq!(call.attribute("invocation_id"), Some("inv-cli"));
}
