//! toolmesh-bridge: the bridge actor (role `bridge`). It serves the tools of MCP servers as
//! NATS micro-service tool providers (PROTOCOL.md "Tool providers", "MCP servers as
//! providers"): one service `mcp-<name>` per server of `TOOLMESH_MCP_SERVERS`, one endpoint
//! per MCP tool, named `<name>_<tool>`, whose `toolmesh.tool` metadata carries its description,
//! input schema and the risk its annotations give. Gateways find these services like any other
//! provider; the bridge knows nothing of gateways, and they nothing of MCP.
//!
//! Layers: [`config`] (the `mcpServers` file), [`connection`] (one rmcp client over a child's
//! stdio or streamable HTTP), [`tools`] (tool list → endpoints), [`provider`] (the micro
//! service and its calls), `keeper` (one server's life: start, list, restart, drain),
//! [`reply`] (MCP results → the reply shape), [`backoff`].
//!
//! Cancels: `toolmesh.v1.providers.cancel.<service>` with `{"invocation_id"}` cancels that
//! call; the bridge sends the server `notifications/cancelled` and answers `cancelled`.
//!
//! The bridge uses no actix: its requests arrive as async-nats service endpoint streams, and
//! each server's keeper is one task.

pub mod backoff;
pub mod config;
pub mod connection;
mod keeper;
pub mod provider;
pub mod reply;
pub mod tools;
pub mod variables;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;
use toolmesh_kernel::host::{
    confirm_subscriptions, respond, ActorHandle, ConfirmError, InFlight, Lifecycle,
};
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::wire::{ok_body, BridgeStatus, McpServerStatus};
use toolmesh_kernel::{NodeId, Role};

pub use config::BridgeConfig;

use crate::keeper::ServerKeeper;
use crate::provider::{Calls, ServerContext};

/// What the bridge needs besides NATS.
#[derive(Debug, Clone)]
pub struct BridgeSettings {
    pub node: NodeId,
    /// `TOOLMESH_MCP_SERVERS`, read and validated before the node connects.
    pub config: BridgeConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum BridgeStartError {
    #[error("cannot subscribe to the provider cancel subject: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error("the NATS server did not confirm the subscription: {0}")]
    Confirm(#[from] ConfirmError),
}

/// The live status of a bridge's servers (NodeStatus `bridge`).
#[derive(Debug, Clone)]
pub struct BridgeProbe {
    servers: Vec<Arc<Mutex<McpServerStatus>>>,
}

impl BridgeProbe {
    pub fn status(&self) -> BridgeStatus {
        BridgeStatus {
            servers: self
                .servers
                .iter()
                .map(|s| s.lock().expect("status lock").clone())
                .collect(),
        }
    }
}

/// Starts the bridge: one keeper per server, and the cancel listener. Returns once the
/// cancel subject is subscribed; the servers start in the background (each one's service
/// appears once its tools are listed).
pub async fn spawn(
    nats: async_nats::Client,
    settings: BridgeSettings,
    lifecycle: Lifecycle,
    in_flight: InFlight,
) -> Result<(ActorHandle, BridgeProbe), BridgeStartError> {
    // rmcp's HTTP client takes the process's TLS provider: ring, as everywhere in toolmesh.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if settings.config.servers.is_empty() {
        tracing::info!("the bridge has no MCP servers (set TOOLMESH_MCP_SERVERS)");
    }
    let mut cancels = nats.subscribe(public::PROVIDERS_CANCEL_ANY).await?;
    confirm_subscriptions(&nats).await?;

    let mut by_service: HashMap<String, Arc<ServerContext>> = HashMap::new();
    let mut statuses = Vec::new();
    let keepers = TaskTracker::new();
    for server in settings.config.servers {
        let status = Arc::new(Mutex::new(ServerKeeper::initial_status(&server)));
        let (connection, connection_rx) = watch::channel(None);
        let ctx = Arc::new(ServerContext {
            server: server.name.clone(),
            service: server.service_name(),
            node: settings.node.clone(),
            nats: nats.clone(),
            connection: connection_rx,
            calls: Calls::default(),
            status: status.clone(),
            tracker: TaskTracker::new(),
            in_flight: in_flight.clone(),
            stop: lifecycle.stop.clone(),
        });
        by_service.insert(ctx.service.clone(), ctx.clone());
        statuses.push(status);
        let keeper = ServerKeeper {
            config: server,
            ctx,
            connection,
        };
        keepers.spawn(keeper.run(lifecycle.clone()));
    }
    keepers.close();

    // Cancels keep working until the keepers drained their calls.
    let handle = ActorHandle::spawn(Role::Bridge, async move {
        loop {
            tokio::select! {
                msg = cancels.next() => match msg {
                    Some(msg) => cancel(&nats, &by_service, msg).await,
                    None => break,
                },
                _ = keepers.wait() => break,
            }
        }
    });
    Ok((handle, BridgeProbe { servers: statuses }))
}

/// One message on `toolmesh.v1.providers.cancel.<service>`: cancels the named invocation if
/// one of this node's servers runs it; answers `{"ok": true, "cancelled": bool}` when asked.
async fn cancel(
    nats: &async_nats::Client,
    by_service: &HashMap<String, Arc<ServerContext>>,
    msg: async_nats::Message,
) {
    let Some(ctx) = public::provider_cancel_service(msg.subject.as_str())
        .and_then(|service| by_service.get(service))
    else {
        return; // another provider's cancel
    };
    let invocation = serde_json::from_slice::<serde_json::Value>(&msg.payload)
        .ok()
        .and_then(|v| v.get("invocation_id")?.as_str().map(str::to_owned));
    let cancelled = match &invocation {
        Some(id) => ctx.calls.cancel(id),
        None => {
            tracing::debug!(service = %ctx.service, "a cancel without invocation_id");
            false
        }
    };
    if cancelled {
        tracing::info!(service = %ctx.service, invocation = ?invocation, "call cancelled");
    }
    if msg.reply.is_some() {
        let mut fields = serde_json::Map::new();
        fields.insert("cancelled".into(), cancelled.into());
        respond(nats, msg.reply.as_ref(), ok_body(fields)).await;
    }
}
