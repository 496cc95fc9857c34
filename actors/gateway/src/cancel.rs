//! `toolmesh.v1.cancel.<account>`: asks whoever holds the invocation (an actor, a parked
//! call, a provider call) to stop, and says whether anyone did.

use std::sync::Arc;
use std::time::Duration;

use async_nats::Message;
use bytes::Bytes;
use serde_json::{Map, Value};

use toolmesh_kernel::host::respond;
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::wire::{self, CancelAck};
use toolmesh_kernel::{Account, InvocationId, ToolError};

use crate::call::subject_account;
use crate::core::GatewayCore;

/// Handles one message on `toolmesh.v1.cancel.<account>`.
pub async fn handle_cancel(core: Arc<GatewayCore>, msg: Message) {
    let reply_to = msg.reply.clone();
    let body = match cancel_target(&msg) {
        Err(error) => wire::error_body(error),
        Ok((account, invocation)) => {
            let request = async_nats::Request::new()
                .payload(Bytes::from_static(b"{}"))
                .timeout(Some(Duration::from_secs(1)));
            let cancelled = match core
                .client
                .send_request(internal::cancel(&account, &invocation), request)
                .await
            {
                Ok(reply) => serde_json::from_slice::<CancelAck>(&reply.payload)
                    .map(|ack| ack.cancelled)
                    .unwrap_or(false),
                // Nobody runs that invocation (no responders) or its holder is gone.
                Err(_) => false,
            };
            let mut fields = Map::new();
            fields.insert("cancelled".into(), Value::Bool(cancelled));
            wire::ok_body(fields)
        }
    };
    respond(&core.client, reply_to.as_ref(), body).await;
}

/// The body of `toolmesh.v1.cancel.<account>`: the id and nothing else (PROTOCOL.md "Tenancy
/// and trust"), so that no other message's body (a reply, an event) reads as a cancel.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    invocation_id: String,
}

fn cancel_target(msg: &Message) -> Result<(Account, InvocationId), ToolError> {
    let account = subject_account(msg, "cancel")?;
    let body: CancelBody = serde_json::from_slice(&msg.payload).map_err(|e| {
        ToolError::invalid_request(format!(
            "the body must be exactly {{\"invocation_id\": \"…\"}}: {e}"
        ))
    })?;
    let invocation = InvocationId::parse(body.invocation_id)
        .map_err(|e| ToolError::invalid_request(e.to_string()))?;
    Ok((account, invocation))
}
