//! Approval withdrawal (`toolmesh.internal.v1.approval.withdraw`): an `ApprovalWithdraw` from
//! the gateway, whose caller cancelled a call parked on the approval that call made, becomes a
//! `WithdrawAck`. A withdrawn approval is rejected by [`WITHDRAWN_BY`] with the reason
//! [`WITHDRAWN_REASON`], announced on `…decided` and audited like any rejection, so an approver
//! no longer sees a request nobody waits for.

use toolmesh_kernel::metrics::ApprovalOutcome;
use toolmesh_kernel::wire::{ApprovalWithdraw, WithdrawAck};

use crate::release::{call_context, parse};
use crate::service::{store_error, ApprovalService};
use crate::store::Withdrawn;

/// The `decided_by` of a withdrawn approval: the caller itself, whose own call made it.
pub const WITHDRAWN_BY: &str = "caller";
/// The `reason` of a withdrawn approval.
pub const WITHDRAWN_REASON: &str = "withdrawn";

impl ApprovalService {
    /// Answers one withdrawal. Never fails: every problem is a `withdrawn: false`.
    #[tracing::instrument(skip_all)]
    pub async fn withdraw(&self, body: &[u8]) -> WithdrawAck {
        let request = match parse(body, "withdrawal request") {
            Ok(request) => request,
            Err(e) => return WithdrawAck::failed(e),
        };
        let ApprovalWithdraw {
            account,
            approval_id: id,
            invocation_id,
        } = &request;
        let withdrawn = match self
            .store
            .withdraw(account, id, invocation_id, WITHDRAWN_BY)
            .await
        {
            Ok(withdrawn) => withdrawn,
            Err(e) => return WithdrawAck::failed(store_error(e)),
        };
        let (why, approval) = match withdrawn {
            Withdrawn::Rejected(approval) => {
                tracing::info!(id = %id, account = %account, invocation_id = %invocation_id, "approval withdrawn: its caller cancelled the call waiting for it");
                self.metrics.approval_decided(ApprovalOutcome::Rejected);
                let ctx = call_context(&request, &approval);
                self.record(&approval, "rejected", Some(&ctx)).await;
                self.announce_decided(&approval).await;
                return WithdrawAck::judged(true, Some(approval));
            }
            Withdrawn::NotFound => ("no such approval in this account", None),
            Withdrawn::OtherCall(approval) => ("another invocation made it", Some(approval)),
            Withdrawn::NotPending(approval) => ("it is no longer pending", Some(approval)),
        };
        // A decision that came first is no bug (the cancel raced it): logged at info.
        tracing::info!(id = %id, account = %account, invocation_id = %invocation_id, why, "approval not withdrawn");
        WithdrawAck::judged(false, approval)
    }
}
