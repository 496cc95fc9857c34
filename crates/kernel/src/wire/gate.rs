//! Gateway ↔ approval actor: the approval gate of a call, the release of an approval a call
//! never used, and the withdrawal of an approval whose call its caller cancelled.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ErrorCode, ToolError};
use crate::ids::{Account, InvocationId, SessionId};
use crate::wire::approval::{
    ApprovalGrant, ApprovalRequest, ApprovalRoute, Grant, RiskLevel, SideEffect,
};
use crate::wire::request::InvocationContext;

/// Gateway → approval actor: this call needs approval; here is what it carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateRequest {
    pub invocation: InvocationContext,
    pub tool_name: String,
    pub risk_level: RiskLevel,
    pub side_effects: Vec<SideEffect>,
    pub arguments_sha256: String,
    /// A preview made by the sender. Gateways that predate `arguments` send it; a gateway
    /// that sends `arguments` does not, and the approval actor makes the preview from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_preview: Option<String>,
    pub grant: Option<ApprovalGrant>,
    /// The arguments as sent, whose JCS hash is `arguments_sha256`: the approval actor stores
    /// them for `approvals.<account>.get`. Sent only when the call may create an approval
    /// (no approval id presented).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// Set when an `ask` rule gates the call: the approval it makes records the rule and goes
    /// to the rule's reviewers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<ApprovalRoute>,
}

/// Approval actor → gateway: run the call, or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum GateOutcome {
    /// Approved and now used by this call. `arguments`: the arguments a reviewer edited the
    /// approval to (`approval.edited`), which the call runs with instead of its own.
    Proceed {
        approval: ApprovalRequest,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<Value>,
    },
    /// A new pending approval was created for this call. `in_band`: whether an in-band
    /// decision on it would count (`TOOLMESH_APPROVAL_IN_BAND` of the approval role), so a
    /// front knows whether asking its client is any use.
    Required {
        approval: ApprovalRequest,
        #[serde(default)]
        in_band: bool,
    },
    /// A grant covers the call: it runs without an approval, one use of the grant spent.
    Granted { grant: Grant },
    /// The call may not run; `approval` is set when one exists (pending, rejected, …).
    Refused {
        error: ErrorCode,
        error_message: String,
        approval: Option<ApprovalRequest>,
    },
}

/// Approval actor → gateway ([`crate::subjects::internal::GATEWAY_CHECK`]): would a call of
/// `tool_name` with these arguments, which a reviewer wrote, pass the gateway's checks (the
/// tool's schema, the policy's `deny` rules) in this account and session? Answered with
/// `{"ok": true}` or the error body such a call would get.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArgumentsCheck {
    pub account: Account,
    #[serde(default)]
    pub session_id: Option<SessionId>,
    pub tool_name: String,
    pub arguments: Value,
}

/// Gateway → approval actor: approval `approval_id` of `account` and the call
/// `invocation_id` it concerns ([`ApprovalRelease`], [`ApprovalWithdraw`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallApproval {
    pub account: Account,
    pub approval_id: String,
    pub invocation_id: InvocationId,
}

/// Gateway → approval actor: the call `invocation_id` consumed approval `approval_id` (a
/// `Proceed`), but provably never ran (NATS had no responder for it), so give the approval
/// back. The approval actor only does so while the approval is still `used` by exactly this
/// invocation in this account and has not expired; anything else is answered `released: false`
/// and changes nothing.
pub type ApprovalRelease = CallApproval;

/// Gateway → approval actor ([`crate::subjects::internal::APPROVAL_WITHDRAW`]): the caller
/// cancelled the call `invocation_id` while it waited for approval `approval_id`, which that
/// very call made, so the approval is withdrawn: rejected with the reason `withdrawn`. The
/// approval actor only does so while the approval is still pending and was made by exactly
/// this invocation in this account; anything else is answered `withdrawn: false` and changes
/// nothing.
pub type ApprovalWithdraw = CallApproval;

/// An answer of the approval actor to a [`CallApproval`], whose `$field` (`released`,
/// `withdrawn`) says whether it did what was asked; the two answers differ only by that name.
macro_rules! call_ack {
    ($(#[$doc:meta])* $name:ident { $field:ident }, $done:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub struct $name {
            pub $field: bool,
            #[serde(default)]
            pub approval: Option<ApprovalRequest>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub error: Option<ErrorCode>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub error_message: Option<String>,
        }

        impl $name {
            #[doc = concat!("Judged: ", $done, " or not.")]
            pub fn judged($field: bool, approval: Option<ApprovalRequest>) -> Self {
                Self {
                    $field,
                    approval,
                    error: None,
                    error_message: None,
                }
            }

            #[doc = concat!("Not judged: nothing was ", $done, " because of `error`.")]
            pub fn failed(error: ToolError) -> Self {
                Self {
                    $field: false,
                    approval: None,
                    error: Some(error.code),
                    error_message: Some(error.message),
                }
            }
        }
    };
}

call_ack! {
    /// Approval actor → gateway, answering an [`ApprovalWithdraw`]: `withdrawn` when the approval
    /// is now rejected by this withdrawal (or this very withdrawal was retried after a lost
    /// reply); `approval` is the record as it is now, when it exists in that account. `error` is
    /// set only when the request could not be judged at all (malformed, store unreachable).
    WithdrawAck { withdrawn },
    "withdrawn"
}

call_ack! {
    /// Approval actor → gateway, answering an [`ApprovalRelease`].
    ///
    /// `released` is true when the approval is `approved` again (or this very release was retried
    /// after a lost reply); `approval` is the record as it is now, when it exists in that account.
    /// `error` is set only when the request could not be judged at all (malformed, store
    /// unreachable): a plain "not yours to release" is `released: false` without an error.
    ReleaseAck { released },
    "released"
}
