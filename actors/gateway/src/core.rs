//! What every call of this gateway shares ([`GatewayCore`]) and what a tool answers
//! ([`Answer`]). It imports none of the modules that use it.

use std::sync::Arc;

use async_nats::Client;
use serde_json::{Map, Value};
use tokio::sync::broadcast;

use toolmesh_kernel::cluster::ClusterView;
use toolmesh_kernel::host::{InFlight, Lifecycle, ReplyInbox};
use toolmesh_kernel::metrics::Metrics;
use toolmesh_kernel::wire::ApprovalRequest;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::builtin;
use crate::config::GatewayConfig;
use crate::providers::LiveTools;

/// What every call of this gateway shares.
#[derive(Debug)]
pub struct GatewayCore {
    pub client: Client,
    /// The built-in tools and the provider tools this gateway discovered, swapped whole.
    pub tools: Arc<LiveTools>,
    pub config: Arc<GatewayConfig>,
    pub cluster: Arc<ClusterView>,
    /// `…decided` events, fanned out to parked calls.
    pub decided: broadcast::Sender<Arc<ApprovalRequest>>,
    pub lifecycle: Lifecycle,
    pub in_flight: InFlight,
    /// The node's metrics: each call's outcome and duration.
    pub metrics: Metrics,
    pub status_cache: builtin::StatusCache,
    /// Reply subjects of calls to long-running roles (claims, then the reply).
    pub replies: ReplyInbox,
    /// The audit trail (off without JetStream).
    pub audit: toolmesh_kernel::audit::AuditTrail,
    /// What the NATS server refused this node's connection.
    pub refusals: toolmesh_kernel::permissions::Refusals,
}

impl GatewayCore {
    /// Refuses a call whose `body` the NATS server would not carry (over its `max_payload`);
    /// `sent` says how it travels (`routed`, `sent to the provider`).
    pub fn check_payload(&self, body: &[u8], sent: &str) -> Result<(), ToolError> {
        let max_payload = self.client.server_info().max_payload;
        if max_payload > 0 && body.len() > max_payload {
            return Err(ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "the call is {} bytes once {sent}, over the NATS max_payload of {max_payload}; send smaller arguments",
                    body.len()
                ),
            ));
        }
        Ok(())
    }
}

/// What a tool answered: members to serialize, members already serialized, or nothing more
/// to do (the actor answered the caller itself:
/// [`DirectReply`](toolmesh_kernel::wire::DirectReply)).
pub enum Answer {
    Fields(Map<String, Value>),
    Prepared(Vec<u8>),
    Delivered(Option<ErrorCode>),
}
