//! A plain `tools/call` over HTTP, answered without rmcp's per-request service.
//!
//! rmcp's streamable HTTP service serves each stateless POST with a service of its own: its
//! typed parse of the JSON-RPC message, a serve loop, a task for the handler and channels
//! between them, for one request and one answer. Over HTTP that machinery cost more of the
//! node than the call itself (`benches/RESULTS.md`, "MCP front"). A `tools/call` that can send
//! nothing before its answer (no progress token) needs none of it: [`serve`] parses it here,
//! runs [`Front::call`] and answers with the JSON-RPC response rmcp would send, shaped for the
//! request's protocol version as rmcp shapes it.
//!
//! Only a request this module is sure of takes this path: every header rmcp checks is as rmcp
//! would accept it, and the body is one `tools/call` with nothing else in it. Anything else
//! (another method, a progress token, a header or `_meta` rmcp would refuse or read, a body
//! without a Content-Length) goes to rmcp unchanged, its body replayed when it was read, so
//! every refusal and every other answer stays rmcp's. The Origin, token and session checks
//! come before either path ([`crate::router`]).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{header, HeaderMap, Method, StatusCode};
use rmcp::model::{
    CallToolRequestMethod, CallToolRequestParams, CallToolResponse, ClientCapabilities, ErrorCode,
    JsonRpcVersion2_0, ProtocolVersion, RequestId, ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::common::http_header::{
    BASE64_HEADER_PREFIX, HEADER_MCP_METHOD, HEADER_MCP_NAME, HEADER_MCP_PROTOCOL_VERSION,
};
use rmcp::ErrorData as McpError;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::front::{call_span, CallContext};
use crate::{Caller, Front};

const JSON: &str = "application/json";
const EVENT_STREAM: &str = "text/event-stream";

/// One `tools/call` to answer here.
pub(crate) struct PlainCall {
    id: RequestId,
    params: CallToolRequestParams,
    caller: Arc<Caller>,
    /// The request's protocol version (its `_meta`'s, else its header's: they agree).
    version: ProtocolVersion,
    capabilities: ClientCapabilities,
    headers: HeaderMap,
}

/// What a request to `/mcp` is.
pub(crate) enum Taken {
    Plain(Box<PlainCall>),
    /// Anything else, for rmcp (its body whole again when it was read).
    Other(Request),
    /// The body could not be read: the answer, rmcp's to the same.
    Failed(Response),
}

/// The JSON-RPC request of a plain call: nothing but these members.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    #[allow(dead_code)]
    jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    #[allow(dead_code)]
    method: CallToolRequestMethod,
    params: CallToolRequestParams,
}

/// Looks at `request`: a plain call, or the request for rmcp. `served`: the protocol versions
/// the handler speaks; a body over `body_limit` bytes is rmcp's to refuse.
pub(crate) async fn take(request: Request, served: &[ProtocolVersion], body_limit: usize) -> Taken {
    let (parts, body) = request.into_parts();
    let Some(version) = plain_head(&parts, body_limit) else {
        return Taken::Other(Request::from_parts(parts, body));
    };
    let bytes = match axum::body::to_bytes(body, body_limit).await {
        Ok(bytes) => bytes,
        Err(e) => {
            return Taken::Failed(
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("Failed to read request body: {e}"),
                )
                    .into_response(),
            )
        }
    };
    match plain_body(&parts.headers, &bytes, version, served) {
        Some((id, params, version, capabilities)) => {
            let caller = parts
                .extensions
                .get::<Arc<Caller>>()
                .cloned()
                .expect("plain_head saw the caller");
            Taken::Plain(Box::new(PlainCall {
                id,
                params,
                caller,
                version,
                capabilities,
                headers: parts.headers,
            }))
        }
        None => Taken::Other(Request::from_parts(parts, Body::from(bytes))),
    }
}

/// The header's protocol version when the head is one rmcp serves statelessly as it is: a POST
/// of JSON with a Content-Length within `body_limit`, accepting JSON and event streams, naming
/// a known protocol version and a well-formed Host, from an authorized caller.
fn plain_head(parts: &http::request::Parts, body_limit: usize) -> Option<ProtocolVersion> {
    if parts.method != Method::POST || parts.extensions.get::<Arc<Caller>>().is_none() {
        return None;
    }
    let headers = &parts.headers;
    let content_type = one(headers, header::CONTENT_TYPE.as_str())?;
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case(JSON) {
        return None;
    }
    if !accepts_json_and_streams(headers) {
        return None;
    }
    let length: usize = one(headers, header::CONTENT_LENGTH.as_str())?
        .parse()
        .ok()?;
    if length > body_limit {
        return None;
    }
    http::uri::Authority::try_from(one(headers, header::HOST.as_str())?).ok()?;
    let version = one(headers, HEADER_MCP_PROTOCOL_VERSION)?;
    ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .find(|known| known.as_str() == version)
        .cloned()
}

/// The request's id, params, protocol version and client capabilities when the body is one
/// `tools/call` rmcp would hand its handler as it is, with no progress token. `served`: the
/// protocol versions the handler speaks.
fn plain_body(
    headers: &HeaderMap,
    body: &Bytes,
    header_version: ProtocolVersion,
    served: &[ProtocolVersion],
) -> Option<(
    RequestId,
    CallToolRequestParams,
    ProtocolVersion,
    ClientCapabilities,
)> {
    let Envelope { id, mut params, .. } = serde_json::from_slice(body).ok()?;
    let meta = params.meta.take().unwrap_or_default();
    if meta.get_progress_token().is_some() {
        return None;
    }
    let version = match meta.protocol_version() {
        // A request of the handshake revisions, served as the header says.
        None if header_version.has_initialize() => header_version.clone(),
        None => return None,
        // A self-contained request (2026-07-28 and later): its `_meta` complete, naming the
        // header's version, one this server speaks, and its method and tool in the standard
        // headers.
        Some(version) => {
            let complete = meta
                .missing_required_keys(&ProtocolVersion::V_2026_07_28)
                .is_empty();
            if version != header_version || version.has_initialize() || !complete {
                return None;
            }
            if !served.contains(&version) {
                return None;
            }
            version
        }
    };
    // SEP-2243: from its revision on, the method and the tool ride in headers too.
    if header_version.as_str() >= ProtocolVersion::STANDARD_HEADERS.as_str() {
        let name = one(headers, HEADER_MCP_NAME)?;
        if one(headers, HEADER_MCP_METHOD)? != "tools/call"
            || name.starts_with(BASE64_HEADER_PREFIX)
            || name != params.name
        {
            return None;
        }
    }
    let capabilities = meta.client_capabilities().unwrap_or_default();
    Some((id, params, version, capabilities))
}

/// The one value of header `name`, as text; none when absent, repeated or not text.
fn one<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok()
}

/// Whether the Accept header plainly names both `application/json` and `text/event-stream`.
/// Weights and quoted parameters are rmcp's to read: such a request is not plain.
fn accepts_json_and_streams(headers: &HeaderMap) -> bool {
    let (mut json, mut stream) = (false, false);
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        if value.contains('"') || value.contains("q=") || value.contains("Q=") {
            return false;
        }
        for range in value.split(',') {
            let essence = range.split(';').next().unwrap_or_default().trim();
            json |= essence.eq_ignore_ascii_case(JSON);
            stream |= essence.eq_ignore_ascii_case(EVENT_STREAM);
        }
    }
    json && stream
}

/// Runs `call` and answers it. Its handler runs as a task of its own, as under rmcp, so that a
/// client gone before the answer (the answer dropped) or the node stopping cancels the call
/// rather than abandoning it.
pub(crate) async fn serve(front: &Front, call: PlainCall, stop: &CancellationToken) -> Response {
    let PlainCall {
        id,
        params,
        caller,
        version,
        capabilities,
        headers,
    } = call;
    let speaks_tasks = capabilities.supports_tasks();
    let cancel = CancellationToken::new();
    let cx = CallContext {
        ct: cancel.clone(),
        progress: None,
        peer: None,
        can_elicit: capabilities.elicitation.is_some(),
        modern: !version.has_initialize(),
        speaks_tasks,
    };
    let span = call_span(&caller, &params.name, Some(&headers));
    let handler = tokio::spawn({
        let front = front.clone();
        async move { front.call(&caller, params, cx).instrument(span).await }
    });
    let gone = cancel.drop_guard();
    let joined = tokio::select! {
        joined = handler => joined,
        // rmcp's answer when the node stops first; `gone` cancels the call.
        () = stop.cancelled() => return internal_error("empty response", "no response message received from handler"),
    };
    gone.disarm();
    let Ok(result) = joined else {
        return internal_error(
            "empty response",
            "no response message received from handler",
        );
    };
    let message = answer(result, id, &version, speaks_tasks);
    // Errors of requests that name their version in `_meta` carry their HTTP status.
    let status = match &message {
        ServerJsonRpcMessage::Error(error) if !version.has_initialize() => match error.error.code {
            ErrorCode::UNSUPPORTED_PROTOCOL_VERSION
            | ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
            | ErrorCode::HEADER_MISMATCH => StatusCode::BAD_REQUEST,
            ErrorCode::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
            _ => StatusCode::OK,
        },
        _ => StatusCode::OK,
    };
    match serde_json::to_vec(&message) {
        Ok(body) => (status, [(header::CONTENT_TYPE, JSON)], body).into_response(),
        Err(e) => internal_error("serialize json response", &e.to_string()),
    }
}

/// The JSON-RPC answer to request `id`, as rmcp's handler makes it for `version`: a task only
/// for a client that declared tasks, an `InputRequiredResult` only from 2026-07-28, the
/// legacy result shape before it.
fn answer(
    result: Result<CallToolResponse, McpError>,
    id: RequestId,
    version: &ProtocolVersion,
    speaks_tasks: bool,
) -> ServerJsonRpcMessage {
    let from_2026_07_28 = version.as_str() >= ProtocolVersion::V_2026_07_28.as_str();
    let result = result.and_then(|response| {
        if matches!(response, CallToolResponse::Task(_)) && !speaks_tasks {
            return Err(McpError::missing_required_client_capability(
                ClientCapabilities::builder().enable_tasks().build(),
            ));
        }
        let mut result = ServerResult::from(response);
        if matches!(result, ServerResult::InputRequiredResult(_)) && !from_2026_07_28 {
            return Err(McpError::invalid_request(
                "InputRequiredResult requires negotiated protocol version 2026-07-28 or newer",
                None,
            ));
        }
        if from_2026_07_28 {
            result.fill_missing_cache_hints();
        } else {
            result.strip_result_type_for_legacy_peer();
            result.strip_non_object_output_for_legacy_peer();
        }
        Ok(result)
    });
    match result {
        Ok(result) => ServerJsonRpcMessage::response(result, id),
        Err(mut error) => {
            if from_2026_07_28 && error.code == ErrorCode::RESOURCE_NOT_FOUND {
                error.code = ErrorCode::INVALID_PARAMS;
            }
            ServerJsonRpcMessage::error(error, Some(id))
        }
    }
}

/// rmcp's 500 answer, worded as rmcp words it.
fn internal_error(context: &str, error: &str) -> Response {
    tracing::error!("Internal server error when {context}: {error}");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("Encounter an error when {context}: {error}"),
    )
        .into_response()
}

#[cfg(test)]
#[path = "plain_tests.rs"]
mod tests;
