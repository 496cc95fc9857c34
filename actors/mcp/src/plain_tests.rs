//! Which requests take the plain path, and the answers it shapes as rmcp does.

use super::*;
use rmcp::model::{InputRequiredResult, ResultType};
use serde_json::{json, Value};

const LIMIT: usize = 4096;

/// A request's headers, in order.
type Headers = Vec<(&'static str, String)>;

fn caller() -> Arc<Caller> {
    Arc::new(Caller {
        account: toolmesh_kernel::Account::parse("acme".to_owned()).unwrap(),
        profile: "default".to_owned(),
        session: None,
        name: Some("t".to_owned()),
        user_id: None,
    })
}

/// A plain call of protocol 2025-11-25 (as rmcp's client sends it).
fn legacy() -> (Headers, Value) {
    let headers = vec![
        ("host", "127.0.0.1:8931".to_owned()),
        ("content-type", "application/json".to_owned()),
        ("accept", "application/json, text/event-stream".to_owned()),
        ("mcp-protocol-version", "2025-11-25".to_owned()),
    ];
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "read_workspace_file", "arguments": {"path": "a.md"}}});
    (headers, body)
}

/// A plain call of protocol 2026-07-28 (as the Python SDK sends it).
fn modern() -> (Headers, Value) {
    let headers = vec![
        ("host", "127.0.0.1:8931".to_owned()),
        ("content-type", "application/json".to_owned()),
        ("accept", "application/json, text/event-stream".to_owned()),
        ("mcp-protocol-version", "2026-07-28".to_owned()),
        ("mcp-method", "tools/call".to_owned()),
        ("mcp-name", "read_workspace_file".to_owned()),
    ];
    let body = json!({"jsonrpc": "2.0", "id": "a", "method": "tools/call",
        "params": {"name": "read_workspace_file", "arguments": {"path": "a.md"},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "c", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}}});
    (headers, body)
}

/// The protocol version a request is served with on the plain path; `None`: rmcp's.
fn plain(headers: &[(&str, String)], body: &Value, with_caller: bool) -> Option<String> {
    let body = Bytes::from(body.to_string());
    let mut request = http::Request::builder().method(Method::POST).uri("/");
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    if !headers.iter().any(|(name, _)| *name == "content-length") {
        request = request.header("content-length", body.len());
    }
    let (mut parts, ()) = request.body(()).unwrap().into_parts();
    if with_caller {
        parts.extensions.insert(caller());
    }
    let version = plain_head(&parts, LIMIT)?;
    let (_, _, version, _) = plain_body(
        &parts.headers,
        &body,
        version,
        ProtocolVersion::KNOWN_VERSIONS,
    )?;
    Some(version.to_string())
}

fn check(
    name: &str,
    base: fn() -> (Headers, Value),
    change: impl Fn(&mut Headers, &mut Value),
    expect: Option<&str>,
) {
    let (mut headers, mut body) = base();
    change(&mut headers, &mut body);
    assert_eq!(plain(&headers, &body, true).as_deref(), expect, "{name}");
}

fn set(headers: &mut Headers, name: &'static str, value: &str) {
    headers.retain(|(n, _)| *n != name);
    headers.push((name, value.to_owned()));
}

fn drop_header(headers: &mut Headers, name: &str) {
    headers.retain(|(n, _)| *n != name);
}

#[test]
fn plain_calls_of_either_revision_are_served_here() {
    check("legacy", legacy, |_, _| {}, Some("2025-11-25"));
    check("modern", modern, |_, _| {}, Some("2026-07-28"));
    check(
        "2025-06-18",
        legacy,
        |h, _| set(h, "mcp-protocol-version", "2025-06-18"),
        Some("2025-06-18"),
    );
    check(
        "content type with a charset",
        legacy,
        |h, _| set(h, "content-type", "application/json; charset=utf-8"),
        Some("2025-11-25"),
    );
    check(
        "accept in two headers",
        legacy,
        |h, _| {
            set(h, "accept", "application/json");
            h.push(("accept", "text/event-stream".to_owned()));
        },
        Some("2025-11-25"),
    );
    check(
        "a string id and no arguments",
        legacy,
        |_, b| {
            b["id"] = json!("x");
            b["params"].as_object_mut().unwrap().remove("arguments");
        },
        Some("2025-11-25"),
    );
    // Without a caller (the token check did not pass it) nothing is served here.
    let (headers, body) = legacy();
    assert_eq!(plain(&headers, &body, false), None);
}

#[test]
fn anything_rmcp_would_refuse_or_read_otherwise_goes_to_rmcp() {
    type Change = fn(&mut Headers, &mut Value);
    let legacy_cases: [(&str, Change); 17] = [
        ("another method", |_, b| b["method"] = json!("tools/list")),
        ("a notification", |_, b| {
            b.as_object_mut().unwrap().remove("id");
        }),
        ("a member more", |_, b| b["extra"] = json!(1)),
        ("jsonrpc 1.0", |_, b| b["jsonrpc"] = json!("1.0")),
        ("a batch", |_, b| *b = json!([b.clone()])),
        ("a progress token", |_, b| {
            b["params"]["_meta"] = json!({"progressToken": 1})
        }),
        (
            "a per-request version",
            |_, b| {
                b["params"]["_meta"] =
                    json!({"io.modelcontextprotocol/protocolVersion": "2025-11-25"})
            },
        ),
        ("no protocol version", |h, _| {
            drop_header(h, "mcp-protocol-version")
        }),
        ("an unknown protocol version", |h, _| {
            set(h, "mcp-protocol-version", "2024-01-01")
        }),
        ("two protocol versions", |h, _| {
            h.push(("mcp-protocol-version", "2025-11-25".to_owned()))
        }),
        ("text", |h, _| set(h, "content-type", "text/plain")),
        ("json only", |h, _| set(h, "accept", "application/json")),
        ("weighted", |h, _| {
            set(h, "accept", "application/json, text/event-stream;q=0")
        }),
        ("no host", |h, _| drop_header(h, "host")),
        ("a bad host", |h, _| set(h, "host", "a b")),
        ("over the limit", |h, _| {
            set(h, "content-length", &(LIMIT + 1).to_string())
        }),
        ("a modern header without _meta", |h, _| {
            set(h, "mcp-protocol-version", "2026-07-28")
        }),
    ];
    for (name, change) in legacy_cases {
        check(name, legacy, change, None);
    }
    let modern_cases: [(&str, Change); 8] = [
        ("no Mcp-Method", |h, _| drop_header(h, "mcp-method")),
        ("another Mcp-Method", |h, _| {
            set(h, "mcp-method", "tools/list")
        }),
        ("no Mcp-Name", |h, _| drop_header(h, "mcp-name")),
        ("another Mcp-Name", |h, _| set(h, "mcp-name", "other")),
        ("a base64 Mcp-Name", |h, _| {
            set(h, "mcp-name", "=?base64?cmVhZF93b3Jrc3BhY2VfZmlsZQ==?=")
        }),
        ("_meta names another version", |_, b| {
            b["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2025-11-25")
        }),
        ("_meta without capabilities", |_, b| {
            b["params"]["_meta"]
                .as_object_mut()
                .unwrap()
                .remove("io.modelcontextprotocol/clientCapabilities");
        }),
        ("a progress token", |_, b| {
            b["params"]["_meta"]["progressToken"] = json!("p")
        }),
    ];
    for (name, change) in modern_cases {
        check(name, modern, change, None);
    }
}

#[test]
fn a_modern_call_carries_the_capabilities_of_its_meta() {
    let (headers, body) = modern();
    let body = Bytes::from(body.to_string());
    let mut parts = http::Request::builder()
        .uri("/")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    for (name, value) in headers {
        parts
            .headers
            .append(name, http::HeaderValue::from_str(&value).unwrap());
    }
    let version = ProtocolVersion::V_2026_07_28;
    let (id, params, _, capabilities) = plain_body(
        &parts.headers,
        &body,
        version,
        ProtocolVersion::KNOWN_VERSIONS,
    )
    .unwrap();
    assert_eq!(id, RequestId::String("a".into()));
    assert_eq!(params.name, "read_workspace_file");
    assert!(params.meta.is_none(), "the _meta is read, not passed on");
    assert!(capabilities.elicitation.is_some());
    assert!(!capabilities.supports_tasks());
}

/// The answer's JSON.
fn answered(result: Result<CallToolResponse, McpError>, version: ProtocolVersion) -> Value {
    serde_json::to_value(answer(result, RequestId::Number(3), &version, false)).unwrap()
}

#[test]
fn answers_are_shaped_for_the_request_s_revision() {
    let reply = || Ok(crate::reply_result(json!({"ok": true, "content": "hi"})).into());
    let old = answered(reply(), ProtocolVersion::V_2025_11_25);
    assert_eq!(old["id"], 3);
    assert_eq!(old["result"]["isError"], false);
    assert_eq!(old["result"]["structuredContent"]["content"], "hi");
    assert!(old["result"].get("resultType").is_none(), "{old}");
    let new = answered(reply(), ProtocolVersion::V_2026_07_28);
    assert_eq!(
        new["result"]["resultType"],
        serde_json::to_value(ResultType::COMPLETE).unwrap()
    );

    // A question for the client exists from 2026-07-28 only.
    let question = || Ok(InputRequiredResult::new(None, Some("approval:x".to_owned())).into());
    let old = answered(question(), ProtocolVersion::V_2025_11_25);
    assert_eq!(old["error"]["code"], ErrorCode::INVALID_REQUEST.0, "{old}");
    let new = answered(question(), ProtocolVersion::V_2026_07_28);
    assert_eq!(new["result"]["requestState"], "approval:x", "{new}");

    // Not found is invalid params from 2026-07-28.
    let missing = || Err(McpError::resource_not_found("gone", None));
    let old = answered(missing(), ProtocolVersion::V_2025_11_25);
    assert_eq!(old["error"]["code"], ErrorCode::RESOURCE_NOT_FOUND.0);
    let new = answered(missing(), ProtocolVersion::V_2026_07_28);
    assert_eq!(new["error"]["code"], ErrorCode::INVALID_PARAMS.0);
    assert_eq!(new["id"], 3);
}
