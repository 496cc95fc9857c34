//! Deciding, and the grants a decision may leave behind: `POST …/decide`, `GET /api/grants/<a>`
//! and `POST /api/grants/<a>/<id>/revoke`.
//!
//! The console decides as its token's approver under the approval actor's rules (PROTOCOL.md
//! "Approval policy", "Reviewers"): an approver whose name a subject can carry
//! (`[A-Za-z0-9_-]{1,64}`) decides on `…decide.<approver>`, so routed approvals of the groups it
//! is in are its to decide and `decided_by` is that name for every approval; another name (a
//! tokens file may say `"Alice Approver"`) decides on the plain `…decide` with the name as
//! `approver`, which decides only approvals without reviewers. Whether a member may decide, a
//! grant may be made, or edited arguments pass the tool's schema and the deny rules is the
//! approval actor's (and a gateway's) to say; the console checks only the shape of what it
//! passes on, and answers with their reply.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use toolmesh_kernel::error::ErrorCode;
use toolmesh_kernel::subjects::public::{self, ApprovalVerb};

use super::{granted, reply, Shared};
use crate::mesh::{self, failure, is_ok, GrantVerb};

/// The longest `reason` the console sends on (the approval actor has its own limit too).
const MAX_REASON: usize = 2000;

/// What the page sends; `deny_unknown_fields`, so a body cannot name another `approver`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideBody {
    approved: bool,
    #[serde(default)]
    reason: Option<String>,
    /// `grant`: the approval remembers itself (PROTOCOL.md "Grants"); an object whose members
    /// the approval actor checks.
    #[serde(default)]
    grant: Option<Value>,
    /// `arguments`: approved in place of the call's (PROTOCOL.md "Edit before approving").
    #[serde(default)]
    arguments: Option<Value>,
}

const DECIDE_SHAPE: &str = "{\"approved\": true|false, \"reason\"?: \"…\", \"grant\"?: {…}, \
                            \"arguments\"?: {…}}";

/// `POST /api/approvals/<account>/<id>/decide` `{"approved", "reason"?, "grant"?,
/// "arguments"?}`: decides as the token's approver; the approval actor's reply (`forbidden`,
/// `invalid_arguments`, `policy_denied`, `conflict`, `approval_expired`, `not_found` … as they
/// come).
pub(super) async fn decide(
    State(console): Shared,
    headers: HeaderMap,
    Path((raw, id)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let (grant, account) = match granted(&console, &headers, &raw) {
        Ok(granted) => granted,
        Err(r) => return r.into_response(),
    };
    let body: DecideBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return reply(failure(
                ErrorCode::InvalidRequest,
                &format!("the body must be {DECIDE_SHAPE}: {e}"),
            ))
        }
    };
    for (name, value) in [("grant", &body.grant), ("arguments", &body.arguments)] {
        if value.as_ref().is_some_and(|v| !v.is_object()) {
            return reply(failure(
                ErrorCode::InvalidRequest,
                &format!("{name} must be a JSON object: the body is {DECIDE_SHAPE}"),
            ));
        }
    }
    let reason = body
        .reason
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty());
    if reason
        .as_ref()
        .is_some_and(|r| r.chars().count() > MAX_REASON)
    {
        return reply(failure(
            ErrorCode::InvalidRequest,
            &format!("the reason is longer than {MAX_REASON} characters"),
        ));
    }
    let subject = if grant.is_reviewer() {
        public::approvals_decide_as(&account, &grant.approver)
    } else {
        public::approvals(&account, ApprovalVerb::Decide)
    };
    let remember = body.grant.is_some();
    let edited = body.arguments.is_some();
    let mut request = json!({
        "id": id, "approved": body.approved, "approver": grant.approver, "reason": reason,
    });
    if let Some(ask) = body.grant {
        request["grant"] = ask;
    }
    if let Some(arguments) = body.arguments {
        request["arguments"] = arguments;
    }
    let decided = mesh::request(&console.nats, subject, request).await;
    let error = decided.get("error").and_then(Value::as_str).unwrap_or("");
    tracing::info!(
        %account,
        approval_id = %id,
        approved = body.approved,
        approver = %grant.approver,
        remember,
        edited,
        ok = is_ok(&decided),
        error,
        "console decision"
    );
    reply(decided)
}

/// `GET /api/grants/<account>`: every grant the approval actor keeps for the account (revoked,
/// spent and expired ones too).
pub(super) async fn grants(
    State(console): Shared,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Response {
    let (_, account) = match granted(&console, &headers, &raw) {
        Ok(granted) => granted,
        Err(r) => return r.into_response(),
    };
    reply(mesh::grants(&console.nats, &account, GrantVerb::List, json!({})).await)
}

/// `POST /api/grants/<account>/<id>/revoke` (no body): the revoked grant.
pub(super) async fn revoke(
    State(console): Shared,
    headers: HeaderMap,
    Path((raw, id)): Path<(String, String)>,
) -> Response {
    let (grant, account) = match granted(&console, &headers, &raw) {
        Ok(granted) => granted,
        Err(r) => return r.into_response(),
    };
    let revoked = mesh::grants(
        &console.nats,
        &account,
        GrantVerb::Revoke,
        json!({"id": id}),
    )
    .await;
    tracing::info!(
        %account,
        grant_id = %id,
        approver = %grant.approver,
        ok = is_ok(&revoked),
        "console grant revocation"
    );
    reply(revoked)
}
