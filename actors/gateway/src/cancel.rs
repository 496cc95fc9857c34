//! `toolmesh.v1.cancel.<account>`: asks every node whether it holds the invocation (a call of
//! its gateway, a command of its sandbox, a fetch of its web actor) and, if one does, has it
//! stop; says whether one did.

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

/// How long a cancel waits for the nodes' answers: a node silent that long (gone, or not yet
/// answering as [`toolmesh_kernel::host::Cancels`] does) holds nothing that stops.
const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// Handles one message on `toolmesh.v1.cancel.<account>`.
pub async fn handle_cancel(core: Arc<GatewayCore>, msg: Message) {
    let reply_to = msg.reply.clone();
    let body = match cancel_target(&msg) {
        Err(error) => wire::error_body(error),
        Ok((account, invocation)) => {
            let cancelled = ask_nodes(&core, &account, &invocation).await;
            let mut fields = Map::new();
            fields.insert("cancelled".into(), Value::Bool(cancelled));
            wire::ok_body(fields)
        }
    };
    respond(&core.client, reply_to.as_ref(), body).await;
}

/// Asks `toolmesh.internal.v1.cancel.<account>.<invocation_id>`, where every node answers
/// whether it holds the invocation (and stops it): true at the first node that does; false
/// once every node of the cluster view said no, or after [`ANSWER_WAIT`].
async fn ask_nodes(core: &GatewayCore, account: &Account, invocation: &InvocationId) -> bool {
    let mut answers = core.replies.register();
    let subject = internal::cancel(account, invocation);
    let asked = core
        .client
        .publish_with_reply(
            subject,
            answers.subject().clone(),
            Bytes::from_static(b"{}"),
        )
        .await;
    if let Err(e) = asked {
        tracing::warn!(error = %e, "cannot ask the nodes to cancel an invocation");
        return false;
    }
    // This node is among them, so one answer is always due.
    let nodes = core.cluster.live().len().max(1);
    let mut said_no = 0;
    let wait = tokio::time::sleep(ANSWER_WAIT);
    tokio::pin!(wait);
    loop {
        let answer = tokio::select! {
            () = &mut wait => return false,
            answer = answers.next() => answer,
        };
        // No answer ever comes once the inbox ended; a status is the server's "no responders".
        let Some(answer) = answer.filter(|a| a.status.is_none()) else {
            return false;
        };
        match serde_json::from_slice::<CancelAck>(&answer.payload) {
            Ok(CancelAck { cancelled: true }) => return true,
            _ => said_no += 1,
        }
        if said_no >= nodes {
            return false;
        }
    }
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
