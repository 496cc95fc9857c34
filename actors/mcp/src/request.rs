//! What the MCP front sends and shows: who calls ([`Caller`]), the ToolRequest it makes of a
//! `tools/call`, the approval question it puts to a client, and the shapes MCP lists tools and
//! results in.

use serde_json::{json, Map, Value};

use rmcp::model::CallToolResult;
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::tools::TOOL_DISPATCHER;
use toolmesh_kernel::Account;

/// Who calls: the account (from the bearer token or `--account`), the profile and the session.
#[derive(Debug, Clone)]
pub struct Caller {
    pub account: Account,
    pub profile: String,
    pub session: Option<String>,
    /// The bearer token's name over HTTP (its `"name"`, else the first 8 hex digits of its
    /// sha256; `oauth.<sub>` for an OAuth access token, [`crate::oauth`]): an in-band decision
    /// records `decided_by: "mcp:<name>"`. `None` over stdio.
    pub name: Option<String>,
    /// The ToolRequest's `user_id`: an OAuth access token's `sub`. `None` otherwise.
    pub user_id: Option<String>,
}

impl Caller {
    /// `request` (a call of this caller's) with the caller's `user_id`, when it has one.
    pub(crate) fn stamp(&self, mut request: Value) -> Value {
        if let Some(user) = &self.user_id {
            request["user_id"] = json!(user);
        }
        request
    }

    /// What an in-band decision of this caller records as `decided_by`: `mcp:<token name>`
    /// over HTTP, `mcp` over stdio.
    fn decided_by(&self) -> String {
        match &self.name {
            Some(name) => format!("mcp:{name}"),
            None => "mcp".to_owned(),
        }
    }
}

/// The `approval` member of a ToolRequest the front sends.
pub(crate) enum Grant<'a> {
    /// Use approval `id` (decided elsewhere, or to be waited for).
    Use(&'a str),
    /// The client's in-band answer on approval `id`.
    Answer { id: &'a str, approved: bool },
}

/// A ToolRequest of `caller` for `tool` (through the dispatcher outside the default profile)
/// under a new invocation id; the request and the id.
pub(crate) fn tool_request(
    caller: &Caller,
    tool: &str,
    arguments: &Value,
    approval: Option<Grant<'_>>,
    wait_s: u64,
) -> (Value, String) {
    let invocation = format!("mcp-{}", uuid::Uuid::new_v4().simple());
    let mut request = if caller.profile == "default" {
        json!({"tool": tool, "arguments": arguments})
    } else {
        // The dispatcher keeps the call inside the profile.
        json!({"tool": TOOL_DISPATCHER, "arguments": {
            "action": "call", "tool_name": tool, "arguments": arguments,
            "profile": caller.profile,
        }})
    };
    request["invocation_id"] = json!(invocation);
    if let Some(session) = &caller.session {
        request["session_id"] = json!(session);
    }
    let mut request = caller.stamp(request);
    match approval {
        None => {}
        Some(Grant::Use(id)) => request["approval"] = json!({"id": id}),
        Some(Grant::Answer { id, approved }) => {
            request["approval"] =
                json!({"id": id, "approved": approved, "decided_by": caller.decided_by()})
        }
    }
    request["wait_for_approval_s"] = json!(wait_s);
    (request, invocation)
}

/// The approval an `approval_required` (or `approved`, `rejected`) RunEvent names.
pub(crate) fn approval_event_id(event: &Value) -> String {
    event["approval_request"]["id"]
        .as_str()
        .or_else(|| event["approval_id"].as_str())
        .unwrap_or("?")
        .to_owned()
}

/// A task's status while its call waits: the approval, how to decide it, how to withdraw.
pub(crate) fn waiting_message(account: &Account, approval: &str) -> String {
    format!(
        "waiting for approval {approval}: an approver decides it on {} (or `toolmesh approvals approve {approval} --account {account}`, or the approvals console); tasks/cancel withdraws the call and rejects the approval",
        public::approvals(account, public::ApprovalVerb::Decide)
    )
}

/// A call refused for want of a session says how an MCP client names one: the gateway's
/// message speaks of the request's `session_id`, which an MCP client never writes.
pub(crate) fn session_hint(mut reply: Value, caller: &Caller, tool: &str) -> Value {
    if caller.session.is_none()
        && reply["error"] == "invalid_request"
        && reply["needs_session"] == true
    {
        reply["error_message"] = Value::from(format!(
            "{} works in a session: send the X-Toolmesh-Session header (a session id, [A-Za-z0-9_-]{{1,64}}) with each MCP request, or give this bearer token a \"session\" in the MCP tokens file (TOOLMESH_MCP_TOKENS)",
            toolmesh_kernel::text::display_safe(tool)
        ));
    }
    reply
}

/// A reply of the call subject's failure shape made here.
pub(crate) fn failure(code: &str, message: &str) -> Value {
    json!({"ok": false, "error": code, "error_message": message})
}

pub(crate) struct Pending {
    pub(crate) id: String,
    pub(crate) request: Value,
    /// Whether an in-band answer on it would count (the approval role says).
    pub(crate) in_band: bool,
}

pub(crate) fn approval_required(reply: &Value) -> Option<Pending> {
    if reply["error"].as_str() != Some("approval_required") {
        return None;
    }
    let request = reply["approval_request"].clone();
    let id = request["id"].as_str()?.to_owned();
    // A gateway that does not say asks anyway: an answer that counts for nothing ends in a
    // wait for an approver ([`Front::answer`]).
    let in_band = reply["in_band"].as_bool().unwrap_or(true);
    Some(Pending {
        id,
        request,
        in_band,
    })
}

/// The form asking the person at the client: the tool, its risk and its arguments, and one
/// boolean `approve`.
pub(crate) fn elicitation(approval: &Pending) -> Value {
    let r = &approval.request;
    let message = format!(
        "Approve {} (risk {}{})? Arguments: {}",
        r["tool_name"].as_str().unwrap_or("?"),
        r["risk_level"].as_str().unwrap_or("?"),
        match r["side_effects"].as_array() {
            Some(s) if !s.is_empty() => format!(
                ", {}",
                s.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => String::new(),
        },
        r["arguments_preview"].as_str().unwrap_or("{}"),
    );
    json!({
        "mode": "form",
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "approve": {
                    "type": "boolean",
                    "title": "Approve",
                    "description": format!("Run this call (approval {})", approval.id),
                },
            },
            "required": ["approve"],
        },
    })
}

/// A ToolReply as an MCP tool result: the reply as structured content and as JSON text,
/// `isError` for `ok: false`.
pub fn reply_result(reply: Value) -> CallToolResult {
    let ok = reply.get("ok") == Some(&Value::Bool(true));
    let text = serde_json::to_string(&reply).unwrap_or_default();
    serde_json::from_value(json!({
        "resultType": "complete",
        "content": [{"type": "text", "text": text}],
        "structuredContent": reply,
        "isError": !ok,
    }))
    .expect("a CallToolResult of this shape parses")
}

/// A described tool as MCP lists it. Annotations from the policy (PROTOCOL.md "MCP front").
pub fn mcp_tool(described: &Value) -> Value {
    let risk = described["risk_level"].as_str().unwrap_or("high");
    let effects: Vec<&str> = described["side_effects"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let read_only = risk == "low" && effects.is_empty();
    let destructive = matches!(risk, "high" | "critical") || effects.contains(&"workspace_delete");
    let open_world = effects.contains(&"network_egress");
    let mut schema = match &described["input_schema"] {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    schema
        .entry("type")
        .or_insert_with(|| Value::String("object".into()));
    json!({
        "name": described["name"],
        "description": described["description"],
        "inputSchema": schema,
        "annotations": {
            "readOnlyHint": read_only,
            "destructiveHint": destructive,
            "idempotentHint": read_only,
            "openWorldHint": open_world,
        },
        "_meta": {"io.toolmesh/risk_level": risk, "io.toolmesh/group": described["group"]},
    })
}
