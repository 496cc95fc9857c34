//! The approval gate (`toolmesh.internal.v1.approval.gate`): a `GateRequest` from the gateway
//! becomes a `GateOutcome` — create a pending approval, decide in band, or use one.

use toolmesh_kernel::error::{ErrorCode, ToolError};
use toolmesh_kernel::metrics::ApprovalOutcome;
use toolmesh_kernel::subjects::public::{approvals, ApprovalVerb};
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::wire::{
    in_band_off_note, is_approval_id, ApprovalRequest, GateOutcome, GateRequest, IN_BAND_DECIDER,
};

use crate::service::{store_error, ApprovalService};
use crate::store::{Birth, NewApproval, Redeemed, Redemption};

/// Longest `tool_name` accepted (tool names are short identifiers).
const MAX_TOOL_NAME_LEN: usize = 128;
/// `arguments_preview` is at most this many characters when it is stored: it is for a person
/// deciding, and every list and event carries it.
pub const MAX_PREVIEW_CHARS: usize = toolmesh_kernel::canonical::PREVIEW_MAX_CHARS;

impl ApprovalService {
    /// Answers one gate request. Never fails: every problem is a `Refused`.
    #[tracing::instrument(skip_all, fields(invocation_id, account, tool))]
    pub async fn pass_gate(&self, body: &[u8]) -> GateOutcome {
        let request = match parse(body) {
            Ok(request) => request,
            Err(e) => return refused(e, None),
        };
        let span = tracing::Span::current();
        span.record("invocation_id", request.invocation.invocation_id.as_str())
            .record("account", request.invocation.account.as_str())
            .record(
                "tool",
                tracing::field::display(DisplaySafe(&request.tool_name)),
            );
        tracing::debug!("gate");
        let grant = request.grant.clone().unwrap_or_default();
        let ignored = grant.approved.is_some() && !self.config.in_band;
        // With in-band decisions off, `approved` counts for nothing (PROTOCOL.md).
        let decision = grant
            .approved
            .filter(|_| self.config.in_band)
            .map(|approved| InBand {
                approved,
                decided_by: grant.decider().to_owned(),
            });
        let mut outcome = match &grant.id {
            None => self.first_call(&request, decision).await,
            Some(id) => self.redeem(&request, id, decision).await,
        };
        // The caller hears why its decision did nothing (a new approval says `in_band`).
        if let GateOutcome::Refused {
            error: ErrorCode::ApprovalPending,
            error_message,
            ..
        } = &mut outcome
        {
            if ignored {
                error_message.push_str(&in_band_off_note(&request.invocation.account));
            }
        }
        outcome
    }

    /// A call without an approval id: a new approval, pending or decided in band at once.
    async fn first_call(&self, request: &GateRequest, decision: Option<InBand>) -> GateOutcome {
        if let Some(grant) = self.covering_grant(request).await {
            tracing::info!(grant = %grant.id, account = %request.invocation.account, tool = %DisplaySafe(&request.tool_name), "a grant covers the call");
            return GateOutcome::Granted { grant };
        }
        // An approval routed to reviewers is theirs to decide: the caller's own decision
        // does not count.
        let routed = request
            .route
            .as_ref()
            .is_some_and(|r| r.reviewers.is_some());
        let decision = decision.filter(|_| !routed);
        let birth = match &decision {
            None => Birth::Pending,
            Some(InBand { approved: true, .. }) => Birth::ApprovedAndUsed,
            Some(InBand {
                approved: false, ..
            }) => Birth::Rejected,
        };
        let ctx = &request.invocation;
        let (arguments, arguments_preview) = match stored_arguments(request) {
            Ok(stored) => stored,
            Err(e) => return refused(e.into(), None),
        };
        let new = NewApproval {
            account: ctx.account.clone(),
            session_id: ctx.session_id.clone(),
            invocation_id: ctx.invocation_id.clone(),
            user_id: ctx.user_id.clone(),
            agent_id: ctx.agent_id.clone(),
            tool_name: request.tool_name.clone(),
            risk_level: request.risk_level,
            side_effects: request.side_effects.clone(),
            arguments_sha256: request.arguments_sha256.clone(),
            arguments_preview,
            arguments,
            decided_by: decision.map(|d| d.decided_by),
            route: request.route.clone(),
        };
        let approval = match self.store.create(&new, birth).await {
            Ok(approval) => approval,
            Err(e) => return refused(store_error(e), None),
        };
        tracing::info!(id = %approval.id, account = %approval.account, tool = %DisplaySafe(&approval.tool_name), ?birth, "approval created");
        match birth {
            Birth::Pending => {
                self.record(&approval, "requested", Some(ctx)).await;
                self.announce_requested(&approval).await;
                GateOutcome::Required {
                    approval,
                    in_band: self.config.in_band && !routed,
                }
            }
            Birth::ApprovedAndUsed => {
                self.metrics.approval_decided(ApprovalOutcome::Approved);
                self.record(&approval, "approved", Some(ctx)).await;
                self.record(&approval, "used", Some(ctx)).await;
                self.announce_decided(&approval).await;
                GateOutcome::Proceed {
                    approval,
                    arguments: None,
                }
            }
            Birth::Rejected => {
                self.metrics.approval_decided(ApprovalOutcome::Rejected);
                self.record(&approval, "rejected", Some(ctx)).await;
                self.announce_decided(&approval).await;
                rejected(approval)
            }
        }
    }

    /// A call presenting an approval id, maybe with an in-band decision.
    async fn redeem(
        &self,
        request: &GateRequest,
        id: &str,
        decision: Option<InBand>,
    ) -> GateOutcome {
        let ctx = &request.invocation;
        let call = Redemption {
            session_id: ctx.session_id.clone(),
            tool_name: request.tool_name.clone(),
            arguments_sha256: request.arguments_sha256.clone(),
            invocation_id: ctx.invocation_id.clone(),
            decision: decision.as_ref().map(|d| d.approved),
            decided_by: decision
                .as_ref()
                .map_or(IN_BAND_DECIDER, |d| d.decided_by.as_str())
                .to_owned(),
        };
        let redeemed = match self.store.redeem(&ctx.account, id, &call).await {
            Ok(redeemed) => redeemed,
            Err(e) => return refused(store_error(e), None),
        };
        match redeemed {
            Redeemed::NotFound => refused(
                ToolError::new(
                    ErrorCode::NotFound,
                    format!("no approval {id} in account {}; call without an approval id to request one", ctx.account),
                ),
                None,
            ),
            Redeemed::Mismatch(approval) => {
                let what = mismatch(&approval, &call);
                let message = format!(
                    "approval {id} was granted for another {what}; repeat the call it was granted for, or call without it to request a new approval"
                );
                refused(ToolError::new(ErrorCode::ApprovalMismatch, message), Some(approval))
            }
            Redeemed::Expired(approval) => expired(approval),
            Redeemed::Forbidden(approval) => {
                let message = format!(
                    "approval {id} goes to the reviewers {}; only they decide it, never the call it is for",
                    approval.reviewers.as_deref().unwrap_or("of its rule")
                );
                refused(ToolError::new(ErrorCode::Forbidden, message), Some(approval))
            }
            Redeemed::Conflict(approval) => {
                let message = format!(
                    "approval {id} was already {} by {}; the first decision stands",
                    decided_word(&approval),
                    approval.decided_by.as_deref().unwrap_or("someone")
                );
                refused(ToolError::new(ErrorCode::Conflict, message), Some(approval))
            }
            Redeemed::Pending(approval) => {
                let message = format!(
                    "approval {id} is still pending; decide it on {} or wait",
                    approvals(&approval.account, ApprovalVerb::Decide)
                );
                refused(ToolError::new(ErrorCode::ApprovalPending, message), Some(approval))
            }
            Redeemed::Rejected { approval, changed } => {
                if changed {
                    tracing::info!(id, "approval rejected in band");
                    self.metrics.approval_decided(ApprovalOutcome::Rejected);
                    self.record(&approval, "rejected", Some(ctx)).await;
                    self.announce_decided(&approval).await;
                }
                rejected(approval)
            }
            Redeemed::Used(approval) => {
                let message = format!(
                    "approval {id} was already used by another call and runs at most one; call without it to request a new approval"
                );
                refused(ToolError::new(ErrorCode::ApprovalExpired, message), Some(approval))
            }
            Redeemed::Proceed(approval, edited) => {
                tracing::info!(id, invocation_id = %ctx.invocation_id, "approval used");
                // Approved in band by this very call (the store writes its decider), rather
                // than used after an earlier decision.
                if call.decision == Some(true)
                    && approval.decided_by.as_deref() == Some(call.decided_by.as_str())
                {
                    self.metrics.approval_decided(ApprovalOutcome::Approved);
                    self.record(&approval, "approved", Some(ctx)).await;
                }
                self.record(&approval, "used", Some(ctx)).await;
                self.announce_decided(&approval).await;
                // Stored by decide.lua from a value it checked; text that no longer parses
                // means a damaged record, and the call must not run with something else.
                let arguments = match edited.as_deref().map(serde_json::from_str).transpose() {
                    Ok(arguments) => arguments,
                    Err(e) => {
                        return refused(
                            ToolError::internal_logged(
                                &e,
                                "the edited arguments of an approval are not JSON",
                            ),
                            Some(approval),
                        )
                    }
                };
                GateOutcome::Proceed {
                    approval,
                    arguments,
                }
            }
        }
    }
}

/// An in-band decision that counts (in-band decisions are on): approve or reject, and the
/// client it came from.
struct InBand {
    approved: bool,
    decided_by: String,
}

/// Parses and checks a gate body; the kernel types already check account and ids.
fn parse(body: &[u8]) -> Result<GateRequest, ToolError> {
    let request: GateRequest = serde_json::from_slice(body).map_err(|e| {
        ToolError::invalid_request(format!("the gate request is not a GateRequest ({e})"))
    })?;
    if request.tool_name.is_empty() || request.tool_name.len() > MAX_TOOL_NAME_LEN {
        return Err(ToolError::invalid_request(format!(
            "tool_name must be 1 to {MAX_TOOL_NAME_LEN} bytes"
        )));
    }
    let sha = &request.arguments_sha256;
    if sha.len() != 64
        || !sha
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(ToolError::invalid_request(
            "arguments_sha256 must be 64 lowercase hex digits",
        ));
    }
    if let Some(id) = request.grant.as_ref().and_then(|g| g.id.as_deref()) {
        if !is_approval_id(id) {
            return Err(ToolError::invalid_request(format!(
                "approval.id {:?} is not an approval id",
                id.chars().take(70).collect::<String>()
            )));
        }
    }
    Ok(request)
}

/// The arguments as stored (compact JSON text) and the preview. With `arguments`, the preview
/// is made here, and only here, from them, and they must hash to `arguments_sha256` (what an
/// approver recomputes from what `get` shows). Without (a gateway that predates them), the
/// preview sent is made display-safe and cut at [`MAX_PREVIEW_CHARS`]; a request with neither
/// has nothing to show an approver and is refused.
fn stored_arguments(request: &GateRequest) -> Result<(Option<String>, String), ArgumentsError> {
    let Some(arguments) = &request.arguments else {
        return match &request.arguments_preview {
            Some(sent) => Ok((None, preview(sent))),
            None => Err(ArgumentsError::Missing),
        };
    };
    if toolmesh_kernel::canonical::arguments_sha256(arguments) != request.arguments_sha256 {
        return Err(ArgumentsError::HashMismatch);
    }
    let text = serde_json::to_string(arguments).map_err(ArgumentsError::Unserializable)?;
    let preview = toolmesh_kernel::canonical::arguments_preview(arguments, MAX_PREVIEW_CHARS);
    Ok((Some(text), preview))
}

/// Why a first call's arguments cannot be stored with its approval.
#[derive(Debug, thiserror::Error)]
enum ArgumentsError {
    #[error("a gate request without an approval id carries its arguments")]
    Missing,
    #[error("arguments_sha256 is not the sha256 of the JCS form of arguments")]
    HashMismatch,
    /// The arguments parsed, yet do not serialize again (a bug).
    #[error("arguments do not serialize: {0}")]
    Unserializable(#[source] serde_json::Error),
}

/// What kind of [`ArgumentsError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArgumentsErrorKind {
    /// The gateway sent a request it should not: `invalid_request`.
    Invalid,
    /// `internal`.
    Internal,
}

impl ArgumentsError {
    fn kind(&self) -> ArgumentsErrorKind {
        match self {
            ArgumentsError::Missing | ArgumentsError::HashMismatch => ArgumentsErrorKind::Invalid,
            ArgumentsError::Unserializable(_) => ArgumentsErrorKind::Internal,
        }
    }
}

/// PROTOCOL.md's code and sentence; an `internal` one logs its cause here.
impl From<ArgumentsError> for ToolError {
    fn from(e: ArgumentsError) -> Self {
        match e.kind() {
            ArgumentsErrorKind::Invalid => ToolError::invalid_request(e.to_string()),
            ArgumentsErrorKind::Internal => {
                ToolError::internal_logged(&e, "cannot store a gate request's arguments")
            }
        }
    }
}

/// A preview sent by the gateway as stored: display-safe, cut at [`MAX_PREVIEW_CHARS`].
fn preview(text: &str) -> String {
    let safe = toolmesh_kernel::text::display_safe(text);
    toolmesh_kernel::text::shorten_middle(&safe, MAX_PREVIEW_CHARS).into_owned()
}

/// Which part of the binding differs, for the error message.
fn mismatch(approval: &ApprovalRequest, call: &Redemption) -> String {
    let mut parts = Vec::new();
    if approval.tool_name != call.tool_name {
        parts.push(format!("tool ({})", approval.tool_name));
    }
    if approval.session_id != call.session_id {
        parts.push("session".to_owned());
    }
    if approval.arguments_sha256 != call.arguments_sha256 {
        parts.push("set of arguments".to_owned());
    }
    if parts.is_empty() {
        parts.push("call".to_owned());
    }
    parts.join(", ")
}

fn decided_word(approval: &ApprovalRequest) -> &'static str {
    use toolmesh_kernel::wire::ApprovalStatus;
    match approval.status {
        ApprovalStatus::Rejected => "rejected",
        _ => "approved",
    }
}

fn refused(error: ToolError, approval: Option<ApprovalRequest>) -> GateOutcome {
    GateOutcome::Refused {
        error: error.code,
        error_message: error.message,
        approval,
    }
}

fn rejected(approval: ApprovalRequest) -> GateOutcome {
    let message = format!(
        "approval {} was rejected by {}{}; call without it to request a new approval",
        approval.id,
        approval.decided_by.as_deref().unwrap_or("someone"),
        approval
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    refused(
        ToolError::new(ErrorCode::ApprovalRejected, message),
        Some(approval),
    )
}

fn expired(approval: ApprovalRequest) -> GateOutcome {
    let message = format!(
        "approval {} expired at {}; call without it to request a new approval",
        approval.id, approval.expires_at
    );
    refused(
        ToolError::new(ErrorCode::ApprovalExpired, message),
        Some(approval),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, valid: bool) {
        assert_eq!(parse(body.as_bytes()).is_ok(), valid, "{body}");
    }

    fn gate_body(tool: &str, sha: &str, grant: &str) -> String {
        format!(
            r#"{{"invocation":{{"account":"acme","invocation_id":"inv-1","session_id":"s-1"}},
               "tool_name":"{tool}","risk_level":"high","side_effects":["workspace_write"],
               "arguments_sha256":"{sha}","arguments_preview":"{{}}","grant":{grant}}}"#
        )
    }

    #[test]
    fn gate_bodies() {
        let sha = "a".repeat(64);
        check(&gate_body("t", &sha, "null"), true);
        check(
            &gate_body("t", &sha, r#"{"id":"appr_1","approved":true}"#),
            true,
        );
        check(&gate_body("t", &sha, r#"{"id":"appr.1"}"#), false);
        check(&gate_body("", &sha, "null"), false);
        check(&gate_body(&"t".repeat(129), &sha, "null"), false);
        check(&gate_body("t", "abc", "null"), false);
        check(&gate_body("t", &"A".repeat(64), "null"), false);
        check("", false);
        check("{}", false);
        check("[1]", false);
        check(
            r#"{"invocation":{"account":"a.b","invocation_id":"i"},"tool_name":"t","risk_level":"low","side_effects":[],"arguments_sha256":"","arguments_preview":""}"#,
            false,
        );
    }

    #[test]
    fn a_sent_preview_is_made_safe_and_cut() {
        assert_eq!(preview("short"), "short");
        assert_eq!(preview("a\u{202e}b"), "a\\u202eb");
        let long = "é".repeat(MAX_PREVIEW_CHARS + 5);
        let cut = preview(&long);
        assert!(cut.chars().count() <= MAX_PREVIEW_CHARS + 30, "{cut}");
        assert!(cut.contains("(5 chars hidden)"), "{cut}");
    }

    fn request_with(arguments: serde_json::Value, sha: String) -> GateRequest {
        let mut request = parse(gate_body("t", &sha, "null").as_bytes()).unwrap();
        request.arguments = Some(arguments);
        request
    }

    #[test]
    fn arguments_are_stored_only_with_their_hash() {
        let arguments = serde_json::json!({"command": "ls", "n\u{202e}": 1});
        let sha = toolmesh_kernel::canonical::arguments_sha256(&arguments);
        let (text, shown) = stored_arguments(&request_with(arguments.clone(), sha)).unwrap();
        let text = text.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            arguments
        );
        assert_eq!(shown, r#"{"command":"ls","n\u202e":1}"#);
        let wrong = stored_arguments(&request_with(arguments, "a".repeat(64))).unwrap_err();
        assert_eq!(wrong.kind(), ArgumentsErrorKind::Invalid);
        assert_eq!(ToolError::from(wrong).code, ErrorCode::InvalidRequest);
    }

    #[test]
    fn a_first_call_with_neither_arguments_nor_a_preview_is_refused() {
        let mut request = parse(gate_body("t", &"a".repeat(64), "null").as_bytes()).unwrap();
        request.arguments_preview = None;
        let refused = stored_arguments(&request).unwrap_err();
        assert_eq!(ToolError::from(refused).code, ErrorCode::InvalidRequest);
    }
}
