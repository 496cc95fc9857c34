//! The console's requests to the mesh: the approvals and grants subjects, each answered as the
//! contract's reply object (a delivery failure becomes `unavailable` or `timeout`, never a hang).

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::{json, Map, Value};

use toolmesh_kernel::error::{ErrorCode, ToolError};
use toolmesh_kernel::subjects::public::{self, ApprovalVerb};
use toolmesh_kernel::tools::ToolRegistry;
use toolmesh_kernel::Account;

/// How long one approvals request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How many `get`s run at once while a list is filled in.
const GET_CONCURRENCY: usize = 8;

/// A request on `toolmesh.v1.approvals.<account>.<verb>`; the reply object.
pub async fn approvals(
    nats: &async_nats::Client,
    account: &Account,
    verb: ApprovalVerb,
    body: Value,
) -> Value {
    request(nats, public::approvals(account, verb), body).await
}

/// A request on `toolmesh.v1.grants.<account>.<verb>` (`list`, `revoke`); the reply object.
pub async fn grants(
    nats: &async_nats::Client,
    account: &Account,
    verb: GrantVerb,
    body: Value,
) -> Value {
    request(nats, public::grants(account, verb.as_str()), body).await
}

/// What the console asks of the grants subjects.
#[derive(Debug, Clone, Copy)]
pub enum GrantVerb {
    List,
    Revoke,
}

impl GrantVerb {
    fn as_str(self) -> &'static str {
        match self {
            GrantVerb::List => "list",
            GrantVerb::Revoke => "revoke",
        }
    }
}

/// A request to the approval actor on `subject` (an approvals or grants subject); the reply
/// object, a delivery failure as `unavailable` or `timeout`.
pub async fn request(nats: &async_nats::Client, subject: String, body: Value) -> Value {
    let payload = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    let request = async_nats::Request::new()
        .payload(payload)
        .timeout(Some(REQUEST_TIMEOUT));
    match nats.send_request(subject, request).await {
        Ok(reply) => serde_json::from_slice(&reply.payload).unwrap_or_else(|_| {
            failure(
                ErrorCode::Internal,
                "the approval actor's reply is not JSON; see its log",
            )
        }),
        Err(e) => match e.kind() {
            async_nats::RequestErrorKind::NoResponders => failure(
                ErrorCode::Unavailable,
                "no approval actor answers; is a node with the role approval running?",
            ),
            async_nats::RequestErrorKind::TimedOut => failure(
                ErrorCode::Timeout,
                "the approval actor did not answer in time",
            ),
            _ => failure(
                ErrorCode::Unavailable,
                &format!("the request to the approval actor failed: {e}"),
            ),
        },
    }
}

/// A contract failure reply.
pub fn failure(code: ErrorCode, message: &str) -> Value {
    let mut fields = Map::new();
    fields.insert("ok".into(), Value::Bool(false));
    fields.extend(ToolError::new(code, message).into_fields());
    Value::Object(fields)
}

pub fn is_ok(reply: &Value) -> bool {
    reply.get("ok") == Some(&Value::Bool(true))
}

/// What the page shows of one approval: the ApprovalRequest (`approval`) and, from `get`,
/// `arguments` (null when truncated), `user_id`, `agent_id` and the edit's `diff`. When `get`
/// fails the approval is still shown, with `detail_error` saying why the rest is missing.
pub async fn detailed(nats: &async_nats::Client, tools: &ToolRegistry, approval: Value) -> Value {
    let account = approval
        .get("account")
        .and_then(Value::as_str)
        .and_then(|a| Account::parse(a).ok());
    let id = approval
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let (Some(account), Some(id)) = (account, id) else {
        return json!({"approval": approval, "detail_error": "the approval names no account or id"});
    };
    let got = approvals(nats, &account, ApprovalVerb::Get, json!({"id": id})).await;
    if !is_ok(&got) {
        return json!({"approval": approval, "detail_error": got.get("error_message").cloned().unwrap_or(Value::Null)});
    }
    from_get(got, tools)
}

/// A `get` reply as the page shows it.
pub fn from_get(got: Value, tools: &ToolRegistry) -> Value {
    let approval = got.get("approval").cloned().unwrap_or(Value::Null);
    let tool = approval
        .get("tool_name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let arguments = got.get("arguments").cloned().unwrap_or(Value::Null);
    // Built-in tools say how an approver sees their arguments; a provider's are shown as
    // they are.
    let diff = tools
        .get(tool)
        .and_then(|t| crate::diff::of_review(t.spec.review, &arguments));
    json!({
        "approval": approval,
        "arguments": arguments,
        "arguments_truncated": got.get("arguments_truncated").cloned().unwrap_or(Value::Bool(false)),
        "user_id": got.get("user_id").cloned().unwrap_or(Value::Null),
        "agent_id": got.get("agent_id").cloned().unwrap_or(Value::Null),
        "diff": diff,
    })
}

/// The pending approvals of one account, each detailed; the failed `list` reply otherwise.
pub async fn pending(
    nats: &async_nats::Client,
    tools: &ToolRegistry,
    account: &Account,
) -> Result<Vec<Value>, Value> {
    let listed = approvals(nats, account, ApprovalVerb::List, json!({})).await;
    if !is_ok(&listed) {
        return Err(listed);
    }
    let items = listed
        .get("approvals")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Ok(futures::stream::iter(items)
        .map(|a| detailed(nats, tools, a))
        .buffered(GET_CONCURRENCY)
        .collect()
        .await)
}
