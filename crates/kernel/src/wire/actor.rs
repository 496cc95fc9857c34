//! Gateway ↔ actor: a routed call ([`ActorCall`]), its claim header, a direct reply in the
//! gateway's place, the actor's reply, and a cancel's acknowledgement.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{ErrorCode, ToolError};
use crate::wire::request::InvocationContext;

/// The NATS header of a *claim*: for a long-running role ([`Role::is_long_running`]) the worker
/// that takes an [`ActorCall`] first publishes, to the call's reply subject, an empty message
/// with this header set to its node id ([`crate::host::publish_claim`]). A worker that hands the
/// call on lets the next one claim it too: the latest claim wins. The gateway watches the
/// claimant in its cluster view and answers `unavailable` when it drops out. The message
/// without this header is the [`ActorReply`].
///
/// [`Role::is_long_running`]: crate::role::Role::is_long_running
pub const CLAIMED_BY_HEADER: &str = "Toolmesh-Claimed-By";

/// Gateway → actor: run this tool for this invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorCall {
    pub invocation: InvocationContext,
    pub tool: String,
    pub arguments: Value,
    /// The next RunEvent `seq` the actor may use (events stay gap-free across actors).
    pub event_seq: u64,
    /// Set when the actor answers the caller itself ([`DirectReply`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<DirectReply>,
}

impl ActorCall {
    /// Reads a routed call; a malformed one is `invalid_request`, answered to the gateway.
    pub fn parse(payload: &[u8]) -> Result<Self, ToolError> {
        serde_json::from_slice(payload)
            .map_err(|e| ToolError::invalid_request(format!("malformed routed call: {e}")))
    }

    /// What answering this call directly needs once the tool ran; `None` when the gateway
    /// answers it.
    pub fn direct_finish(&self) -> Option<DirectFinish> {
        Some(DirectFinish {
            invocation: self.invocation.clone(),
            event_seq: self.event_seq,
            direct: self.direct.clone()?,
        })
    }
}

/// The part of an [`ActorCall`] with a [`DirectReply`] that finishing it needs (not the
/// arguments, which the tool consumed).
#[derive(Debug, Clone, PartialEq)]
pub struct DirectFinish {
    pub invocation: InvocationContext,
    /// The call's first event `seq` ([`ActorCall::event_seq`]).
    pub event_seq: u64,
    pub direct: DirectReply,
}

/// What an actor needs to finish a call in the gateway's place: publish `finished`, send the
/// public reply to the caller, then tell the gateway it did ([`ActorReply::delivered`]). This
/// spares the reply one hop through the gateway. The gateway asks for it only for calls that
/// used no approval (so no outcome makes it give one back) and whose caller's reply subject is
/// under `_INBOX.` (nodes may publish there; see docs/operations.md, "The account boundary is
/// the broker's"). Timeouts, lost workers and no responders are still answered by the gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirectReply {
    /// The caller's reply subject.
    pub reply_to: String,
    /// The tool the call's RunEvents name (`tool_dispatcher` for a dispatched call).
    pub event_tool: String,
    /// The inner tool of a `tool_dispatcher` call: in the reply and in `finished`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatched_tool_name: Option<String>,
    /// Milliseconds since the gateway published `started`, for `finished`'s `duration_ms`.
    pub elapsed_ms: u64,
    /// Members `finished` adds besides its own: the `rule_id` and `policy_revision` of a call
    /// a policy rule decided.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub event_extra: Map<String, Value>,
}
/// Actor → gateway: the tool's reply fields and how many events the actor published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorReply {
    pub reply: Map<String, Value>,
    #[serde(default)]
    pub events_emitted: u64,
    /// The actor refused before running anything (a failure only): an approval the call
    /// used is given back, as when no actor received it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_run: bool,
    /// The actor answered the caller itself ([`DirectReply`]); `reply` is empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delivered: bool,
    /// With `delivered`: the error code of the reply the caller got (none: it succeeded), so
    /// the gateway counts the call's outcome (`toolmesh_calls_total`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_error: Option<ErrorCode>,
}

impl ActorReply {
    pub fn ok(fields: Map<String, Value>) -> Self {
        let mut reply = Map::with_capacity(fields.len() + 1);
        reply.insert("ok".into(), Value::Bool(true));
        reply.extend(fields);
        Self {
            reply,
            events_emitted: 0,
            not_run: false,
            delivered: false,
            delivered_error: None,
        }
    }
    pub fn error(error: ToolError) -> Self {
        Self {
            reply: error.into_fields(),
            events_emitted: 0,
            not_run: false,
            delivered: false,
            delivered_error: None,
        }
    }
    /// The gateway's notice that the caller has its reply ([`DirectReply`]), failed with
    /// `error` or not.
    pub fn delivered(events_emitted: u64, error: Option<ErrorCode>) -> Self {
        Self {
            reply: Map::new(),
            events_emitted,
            not_run: false,
            delivered: true,
            delivered_error: error,
        }
    }
    /// A refusal before anything ran (see [`ActorReply::not_run`]).
    pub fn refused(error: ToolError) -> Self {
        Self {
            not_run: true,
            ..Self::error(error)
        }
    }
}
/// `…cancel` reply from an actor holding the invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelAck {
    pub cancelled: bool,
}
