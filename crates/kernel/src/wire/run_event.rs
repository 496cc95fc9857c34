//! RunEvents: their kinds, the body of one, and the extra members of `finished`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ErrorCode;
use crate::wire::request::InvocationContext;

/// The kinds of RunEvent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunEventKind {
    Started,
    ApprovalRequired,
    Approved,
    Rejected,
    Stdout,
    Stderr,
    /// A sandbox's request through its egress proxy (`host`, `port`, `allowed`).
    Egress,
    Finished,
}

/// A RunEvent as it goes on the wire (serialized straight from borrowed parts).
#[derive(Serialize)]
struct RunEventBody<'a> {
    invocation_id: &'a str,
    seq: u64,
    kind: RunEventKind,
    at: String,
    session_id: Option<&'a str>,
    user_id: Option<&'a str>,
    agent_id: Option<&'a str>,
    tool: &'a str,
    account: &'a str,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

/// Builds the RunEvent body for one invocation.
pub fn run_event(
    ctx: &InvocationContext,
    tool: &str,
    seq: u64,
    kind: RunEventKind,
    extra: &Map<String, Value>,
) -> Vec<u8> {
    let body = RunEventBody {
        invocation_id: ctx.invocation_id.as_str(),
        seq,
        kind,
        at: crate::time::now_rfc3339(),
        session_id: ctx.session_id.as_ref().map(|s| s.as_str()),
        user_id: ctx.user_id.as_deref(),
        agent_id: ctx.agent_id.as_deref(),
        tool,
        account: ctx.account.as_str(),
        extra,
    };
    serde_json::to_vec(&body).expect("a run event serializes")
}
/// The extra members of a `finished` RunEvent.
pub fn finished_extra(
    error: Option<ErrorCode>,
    duration_ms: u64,
    dispatched_tool_name: Option<&str>,
) -> Map<String, Value> {
    let mut extra = Map::with_capacity(4);
    extra.insert("ok".into(), Value::Bool(error.is_none()));
    extra.insert(
        "error".into(),
        error.map_or(Value::Null, |c| Value::from(c.as_str())),
    );
    extra.insert("duration_ms".into(), Value::from(duration_ms));
    if let Some(name) = dispatched_tool_name {
        extra.insert("dispatched_tool_name".into(), Value::from(name));
    }
    extra
}
