//! Edit before approving (PROTOCOL.md "Approval policy"): a reviewer approves other arguments
//! than the call's. The approval actor knows no tool, so a gateway checks them
//! (`toolmesh.internal.v1.gateway.check`: the tool's schema and the policy's `deny` rules, as a
//! call with them would meet) before decide.lua binds the approval to them. The gateway checks
//! them once more when the call runs.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Map, Value};

use toolmesh_kernel::budget;
use toolmesh_kernel::canonical::{arguments_preview, arguments_sha256, bindable};
use toolmesh_kernel::error::{ErrorCode, ToolError};
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::wire::{ApprovalRequest, ApprovalStatus, ArgumentsCheck};

use crate::gate::MAX_PREVIEW_CHARS;
use crate::service::ApprovalService;
use crate::store::Edit;

/// How long a gateway may take to check edited arguments.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Why edited arguments could not be checked (not: why they are wrong).
#[derive(Debug, thiserror::Error)]
enum CheckError {
    #[error("the check request does not serialize: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("no gateway answered the check of edited arguments: {0}")]
    Request(#[source] async_nats::RequestError),
    #[error("a gateway answered the check of edited arguments with something else: {0}")]
    Malformed(String),
}

impl From<CheckError> for ToolError {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Request(_) => ToolError::new(
                ErrorCode::Unavailable,
                format!("{e}; the approval is unchanged, retry once a gateway runs"),
            ),
            other => ToolError::internal_logged(&other, "cannot check edited arguments"),
        }
    }
}

impl ApprovalService {
    /// Checks a reviewer's `arguments` for `approval` and makes them what decide.lua keeps.
    /// Any failure leaves the approval as it is.
    pub(crate) async fn check_edit(
        &self,
        approval: &ApprovalRequest,
        arguments: Value,
    ) -> Result<Edit, ToolError> {
        if approval.status != ApprovalStatus::Pending {
            return Err(ToolError::new(
                ErrorCode::Conflict,
                format!(
                    "approval {} is {}: only a pending approval takes edited arguments",
                    approval.id,
                    approval.status.as_str()
                ),
            ));
        }
        if approval.quorum > 1 {
            return Err(needs_one(approval));
        }
        bindable(&arguments)?;
        let text = serde_json::to_string(&arguments).map_err(CheckError::Encode)?;
        let limit = budget::reply_limit(self.nats.max_payload());
        if text.len() + budget::APPROVAL_ROOM > limit {
            return Err(ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "the edited arguments ({} bytes) leave too little room under the {limit} bytes a reply may carry here for the call to get them back",
                    text.len()
                ),
            ));
        }
        self.gateway_check(approval, &arguments).await?;
        Ok(Edit {
            arguments_sha256: arguments_sha256(&arguments),
            preview: arguments_preview(&arguments, MAX_PREVIEW_CHARS),
            text,
        })
    }

    /// Asks any gateway whether a call of the approval's tool with `arguments` passes.
    async fn gateway_check(
        &self,
        approval: &ApprovalRequest,
        arguments: &Value,
    ) -> Result<(), ToolError> {
        let check = ArgumentsCheck {
            account: approval.account.clone(),
            session_id: approval.session_id.clone(),
            tool_name: approval.tool_name.clone(),
            arguments: arguments.clone(),
        };
        let body = serde_json::to_vec(&check).map_err(CheckError::Encode)?;
        let request = async_nats::Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(CHECK_TIMEOUT));
        let reply = self
            .nats
            .send_request(internal::GATEWAY_CHECK, request)
            .await
            .map_err(CheckError::Request)?;
        let fields: Map<String, Value> = serde_json::from_slice(&reply.payload)
            .map_err(|e| CheckError::Malformed(e.to_string()))?;
        match fields.get("ok") {
            Some(Value::Bool(true)) => Ok(()),
            _ => Err(ToolError::from_fields(&fields).ok_or_else(|| {
                CheckError::Malformed("an error reply without an error code".into())
            })?),
        }
    }
}

/// An approval that needs several approvals takes no edit: each member approves what they saw.
pub(crate) fn needs_one(approval: &ApprovalRequest) -> ToolError {
    ToolError::new(
        ErrorCode::InvalidRequest,
        format!(
            "approval {} needs {} approvals, and its members approve the arguments they saw: reject it with a reason instead of editing it",
            approval.id, approval.quorum
        ),
    )
}
