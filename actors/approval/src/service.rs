//! `ApprovalService`: what a request handler needs (NATS, the store, the config), cheap to clone
//! into the task that answers one request; plus the events and the expiry sweep.

use async_nats::Client;
use bytes::Bytes;
use toolmesh_kernel::audit::{AuditEntry, AuditTrail};
use toolmesh_kernel::error::{ErrorCode, ToolError};
use toolmesh_kernel::metrics::{ApprovalOutcome, Metrics};
use toolmesh_kernel::subjects::public::{approvals, ApprovalVerb};
use toolmesh_kernel::wire::{ApprovalRequest, InvocationContext};

use crate::config::ApprovalConfig;
use crate::store::{ApprovalStore, Lapsed, StoreError, SWEEP_BATCH};

#[derive(Clone)]
pub(crate) struct ApprovalService {
    pub nats: Client,
    pub store: ApprovalStore,
    pub config: ApprovalConfig,
    pub metrics: Metrics,
    pub audit: AuditTrail,
}

impl ApprovalService {
    /// Appends the change `status` of `approval` to its account's audit trail, made for the
    /// call `ctx` when a call made it. Awaited before the answer, so the trail has the change
    /// before anything that follows from it; a failure is logged and counted by the trail.
    pub async fn record(
        &self,
        approval: &ApprovalRequest,
        status: &str,
        ctx: Option<&InvocationContext>,
    ) {
        let _ = self
            .audit
            .append(AuditEntry::approval(approval, status, ctx))
            .await;
    }

    /// Announces a new pending approval on `…requested`.
    pub async fn announce_requested(&self, approval: &ApprovalRequest) {
        self.announce(ApprovalVerb::Requested, approval).await;
    }

    /// Announces a change (approved, rejected, used, expired) on `…decided`.
    pub async fn announce_decided(&self, approval: &ApprovalRequest) {
        self.announce(ApprovalVerb::Decided, approval).await;
    }

    async fn announce(&self, verb: ApprovalVerb, approval: &ApprovalRequest) {
        let subject = approvals(&approval.account, verb);
        let body = match serde_json::to_vec(approval) {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(error = %e, id = %approval.id, "an approval does not serialize");
                return;
            }
        };
        // NATS core is at-most-once: a lost event is a missed notification, never lost state
        // (the approval is in Redis and `get` answers it).
        if let Err(e) = self.nats.publish(subject, Bytes::from(body)).await {
            tracing::warn!(error = %e, id = %approval.id, verb = verb.as_str(), "could not publish an approval event");
        }
    }

    /// One sweep round: expires every due approval this node wins, and announces each.
    pub async fn sweep(&self) {
        let due = match self.store.due(SWEEP_BATCH).await {
            Ok(due) => due,
            Err(StoreError::Unavailable) => return,
            Err(e) => {
                tracing::error!(error = %e, "approval sweep failed");
                return;
            }
        };
        for member in due {
            match self.store.expire(&member).await {
                Ok(Some(Lapsed::Expired(approval))) => {
                    tracing::info!(id = %approval.id, account = %approval.account, "approval expired");
                    self.metrics.approval_decided(ApprovalOutcome::Expired);
                    self.record(&approval, "expired", None).await;
                    self.announce_decided(&approval).await;
                }
                Ok(Some(Lapsed::Escalated(approval))) => {
                    tracing::info!(id = %approval.id, account = %approval.account, reviewers = approval.reviewers.as_deref(), "approval escalated");
                    self.record(&approval, "escalated", None).await;
                    self.announce_requested(&approval).await;
                }
                Ok(None) => {}
                Err(StoreError::Unavailable) => return,
                Err(e) => tracing::error!(error = %e, member, "could not expire an approval"),
            }
        }
    }
}

/// A store failure as the reply error: `unavailable` (retry) or `internal` (look at the logs).
pub(crate) fn store_error(e: StoreError) -> ToolError {
    match e {
        StoreError::Unavailable => ToolError::new(
            ErrorCode::Unavailable,
            "approval store (Redis) is not reachable; retry in a moment",
        ),
        StoreError::TooManyPending(max) => ToolError::new(
            ErrorCode::LimitExceeded,
            format!(
                "this account has {max} approvals pending, the most it may have (TOOLMESH_APPROVAL_MAX_PENDING); decide or let some expire, then call again"
            ),
        )
        .with("max_pending", max),
        StoreError::Unconfirmed { acked, wanted } => ToolError::new(
            ErrorCode::Unavailable,
            format!(
                "the approval store (Redis) has not copied this change to enough replicas yet ({acked} of {wanted} confirmed in time), so a failover could still lose it and it is not acknowledged; retry in a moment"
            ),
        ),
        StoreError::Failed(detail) => {
            tracing::error!(error = %detail, "approval store failed");
            ToolError::internal(
                "the approval store failed on this request; look for \"approval store failed\" in the approval node's logs",
            )
        }
    }
}
