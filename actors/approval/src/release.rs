//! Approval release (`toolmesh.internal.v1.approval.release`): an `ApprovalRelease` from the
//! gateway, whose call used an approval but never ran, becomes a `ReleaseAck`.

use toolmesh_kernel::error::ToolError;
use toolmesh_kernel::wire::{
    is_approval_id, ApprovalRelease, ApprovalRequest, CallApproval, InvocationContext, ReleaseAck,
};

use crate::service::{store_error, ApprovalService};
use crate::store::Released;

impl ApprovalService {
    /// Answers one release request. Never fails: every problem is a `released: false`.
    #[tracing::instrument(skip_all)]
    pub async fn release(&self, body: &[u8]) -> ReleaseAck {
        let request = match parse(body, "release request") {
            Ok(request) => request,
            Err(e) => return ReleaseAck::failed(e),
        };
        let ApprovalRelease {
            account,
            approval_id: id,
            invocation_id,
        } = &request;
        let released = match self.store.release(account, id, invocation_id).await {
            Ok(released) => released,
            Err(e) => return ReleaseAck::failed(store_error(e)),
        };
        let (why, approval) = match released {
            Released::GivenBack(approval) => {
                tracing::info!(id = %id, account = %account, invocation_id = %invocation_id, "approval released: its call never ran");
                let ctx = call_context(&request, &approval);
                self.record(&approval, "released", Some(&ctx)).await;
                // Parked calls and watchers learn that it is usable again.
                self.announce_decided(&approval).await;
                return ReleaseAck::judged(true, Some(approval));
            }
            Released::NotFound => ("no such approval in this account", None),
            Released::NotUsed(approval) => ("it is not used", Some(approval)),
            Released::OtherCall(approval) => ("another invocation used it", Some(approval)),
            Released::Expired(approval) => ("it has expired", Some(approval)),
        };
        // Every refusal is logged: only the gateway asks, and only after its own `Proceed`, so
        // a refusal means a race (expiry) or a bug worth seeing.
        tracing::warn!(id = %id, account = %account, invocation_id = %invocation_id, why, "approval not released");
        ReleaseAck::judged(false, approval)
    }
}

/// Parses and checks the body of a release or a withdrawal (`what`); the kernel types already
/// check account and invocation.
pub(crate) fn parse(body: &[u8], what: &str) -> Result<CallApproval, ToolError> {
    let request: CallApproval = serde_json::from_slice(body).map_err(|e| {
        ToolError::invalid_request(format!(
            "the {what} does not name an account, approval_id and invocation_id ({e})"
        ))
    })?;
    // The id becomes part of a Redis key: only our own id syntax gets that far.
    if !is_approval_id(&request.approval_id) {
        return Err(ToolError::invalid_request(format!(
            "approval_id {:?} is not an approval id",
            request.approval_id.chars().take(70).collect::<String>()
        )));
    }
    Ok(request)
}

/// The call a release or a withdrawal concerns, as its audit entry names it.
pub(crate) fn call_context(
    request: &CallApproval,
    approval: &ApprovalRequest,
) -> InvocationContext {
    InvocationContext {
        account: request.account.clone(),
        invocation_id: request.invocation_id.clone(),
        session_id: approval.session_id.clone(),
        user_id: None,
        agent_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Releases and withdrawals share their request and its parser.
    fn check(body: &str, valid: bool) {
        for what in ["release", "withdrawal"] {
            assert_eq!(
                parse(body.as_bytes(), what).is_ok(),
                valid,
                "{what}: {body}"
            );
        }
    }

    #[test]
    fn release_and_withdrawal_bodies() {
        check(
            r#"{"account":"acme","approval_id":"appr_1","invocation_id":"inv-1"}"#,
            true,
        );
        check(
            r#"{"account":"acme","approval_id":"appr:1","invocation_id":"inv-1"}"#,
            false,
        );
        check(
            r#"{"account":"acme","approval_id":"","invocation_id":"inv-1"}"#,
            false,
        );
        check(
            r#"{"account":"a.b","approval_id":"appr_1","invocation_id":"inv-1"}"#,
            false,
        );
        check(
            r#"{"account":"acme","approval_id":"appr_1","invocation_id":""}"#,
            false,
        );
        check(r#"{"account":"acme","approval_id":"appr_1"}"#, false);
        check(r#"{"account":"acme","invocation_id":"inv-1"}"#, false);
        check("", false);
        check("[]", false);
    }
}
