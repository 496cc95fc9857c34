//! Serde types of PROTOCOL.md (public) and of the internal messages between actors.
//!
//! These are wire types only. An actor's actix messages carry the raw NATS message
//! (`toolmesh-actix-host`, the gateway's `actor.rs`); the task that handles one parses its body
//! into these types (`ToolRequest::parse`, `ActorCall::parse` in the actors' tool host).

//!
//! The parts: calls (`request`), replies (`reply`), RunEvents (`run_event`), approvals
//! (`approval`), gateway ↔ actor messages (`actor`), gateway ↔ approval actor messages
//! (`gate`), and cluster status (`status`).

mod actor;
mod approval;
mod gate;
mod reply;
mod request;
mod run_event;
mod status;

pub use actor::{ActorCall, ActorReply, CancelAck, DirectFinish, DirectReply, CLAIMED_BY_HEADER};
pub use approval::{
    in_band_off_note, is_client_name, is_in_band_decider, ApprovalDecision, ApprovalGrant,
    ApprovalRequest, ApprovalRoute, ApprovalStatus, Grant, MemberDecision, RiskLevel, SideEffect,
    IN_BAND_DECIDER, MAX_CLIENT_NAME,
};
pub use gate::{
    ApprovalRelease, ApprovalWithdraw, ArgumentsCheck, CallApproval, GateOutcome, GateRequest,
    ReleaseAck, WithdrawAck,
};
pub use reply::{error_body, ok_body, public_reply, reply_body, ReplyWriter};
pub use request::{
    is_approval_id, json_kind, InvocationContext, RequestRefused, ToolRequest, MAX_PRINCIPAL_LEN,
    MAX_WAIT_FOR_APPROVAL_S,
};
pub use run_event::{finished_extra, run_event, RunEventKind};
pub use status::{
    BridgeStatus, ClusterStatus, Heartbeat, McpServerState, McpServerStatus, NodeStatus,
    SandboxCapacity, SandboxTemplateStatus, SkippedTool,
};

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
