//! What an endpoint answers: an MCP `tools/call` result mapped to the provider reply shape
//! (PROTOCOL.md "MCP servers as providers"), and the failures in the contract's codes.

use rmcp::model::CallToolResult;
use rmcp::service::ServiceError;
use serde_json::{Map, Value};
use toolmesh_kernel::budget;
use toolmesh_kernel::wire::{error_body, ok_body};
use toolmesh_kernel::{ErrorCode, ToolError};

/// `{"ok": true, "content": […], "text": <text parts joined>, "structured_content"?: …}`, or
/// `provider_error` with the result's text when the server flagged it `isError`.
pub fn from_result(result: CallToolResult) -> Vec<u8> {
    let content: Vec<Value> = result
        .content
        .iter()
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .collect();
    let text = text_of(&content);
    if result.is_error == Some(true) {
        let message = if text.is_empty() {
            "the MCP tool reported an error without text".to_owned()
        } else {
            text
        };
        return error_body(ToolError::new(ErrorCode::ProviderError, message));
    }
    let mut fields = Map::new();
    fields.insert("content".into(), Value::Array(content));
    fields.insert("text".into(), Value::String(text));
    if let Some(structured) = result.structured_content {
        fields.insert("structured_content".into(), structured);
    }
    ok_body(fields)
}

/// The text parts of MCP content, joined by newlines.
fn text_of(content: &[Value]) -> String {
    content
        .iter()
        .filter(|c| c.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|c| c.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A call that did not give a result: the server's own JSON-RPC error is `provider_error`
/// with its message; a connection that closed is `unavailable`.
pub fn from_service_error(server: &str, error: ServiceError) -> ToolError {
    match error {
        ServiceError::McpError(data) => ToolError::new(ErrorCode::ProviderError, data.message)
            .with("provider_error_code", data.code.0),
        ServiceError::TransportClosed => unavailable(server, "its connection closed"),
        ServiceError::Timeout { timeout } => ToolError::new(
            ErrorCode::Timeout,
            format!(
                "MCP server {server:?} did not answer within {} s",
                timeout.as_secs()
            ),
        ),
        other => unavailable(server, &format!("the call failed: {other}")),
    }
}

/// `unavailable`, naming the server and why (without the credentials of any URL in it).
pub fn unavailable(server: &str, why: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Unavailable,
        format!(
            "MCP server {server:?} is not available: {}",
            toolmesh_kernel::text::redact_urls(why)
        ),
    )
}

/// A body that fits a routed reply (the gateway adds its members around it); one that does not
/// becomes `limit_exceeded`.
pub fn fitted(body: Vec<u8>, max_payload: usize) -> Vec<u8> {
    let limit = budget::routed_limit(max_payload);
    if body.len() <= limit {
        return body;
    }
    tracing::warn!(
        bytes = body.len(),
        limit,
        "an MCP result is too large for a reply"
    );
    error_body(ToolError::new(
        ErrorCode::LimitExceeded,
        format!(
            "the MCP result is {} bytes; a reply carries at most {limit}",
            body.len()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(value: Value) -> CallToolResult {
        serde_json::from_value(value).expect("a CallToolResult")
    }

    fn body(bytes: Vec<u8>) -> Value {
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn results_map_to_the_reply_shape() {
        let r = body(from_result(result(json!({
            "content": [
                {"type": "text", "text": "one"},
                {"type": "image", "data": "AA==", "mimeType": "image/png"},
                {"type": "text", "text": "two"}
            ],
            "structuredContent": {"n": 2}
        }))));
        assert_eq!(r["ok"], true);
        assert_eq!(r["text"], "one\ntwo");
        assert_eq!(r["content"][1]["type"], "image");
        assert_eq!(r["structured_content"], json!({"n": 2}));

        let r = body(from_result(result(json!({"content": []}))));
        assert_eq!(r, json!({"ok": true, "content": [], "text": ""}));
    }

    #[test]
    fn is_error_is_provider_error_with_its_text() {
        let r = body(from_result(result(json!({
            "content": [{"type": "text", "text": "no such repo"}],
            "isError": true
        }))));
        assert_eq!(r["ok"], false);
        assert_eq!(r["error"], "provider_error");
        assert_eq!(r["error_message"], "no such repo");
    }

    #[test]
    fn oversized_bodies_are_limit_exceeded() {
        let big = vec![b'x'; 70_000];
        let r = body(fitted(big, 64 * 1024));
        assert_eq!(r["error"], "limit_exceeded");
        let small = b"{\"ok\":true}".to_vec();
        assert_eq!(fitted(small.clone(), 64 * 1024), small);
    }
}
