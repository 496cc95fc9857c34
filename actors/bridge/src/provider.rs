//! One MCP server's tools as one NATS micro service (`mcp-<name>`, async-nats `service`): an
//! endpoint per tool on `toolmesh.internal.v1.mcp.<server>.<endpoint>` (the service's default
//! queue group, so several bridge nodes share the calls), and what an endpoint does with a
//! call: MCP `tools/call` on the server's current connection.
//!
//! A micro service cannot remove an endpoint, so a changed tool list means a new service: the
//! new one subscribes first, then the old one stops. The old endpoints' streams still yield
//! every request already delivered to them, and those calls run to their end. A request the
//! broker routes to an old subscription in the instant between its `UNSUB` leaving and the
//! server applying it is lost (the gateway answers `timeout`); tool lists change rarely.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::service::{Request, ServiceExt};
use async_nats::Client;
use futures::StreamExt;
use rmcp::model::{CallToolRequestParams, CallToolResponse};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolmesh_kernel::host::InFlight;
use toolmesh_kernel::subjects::{internal, public};
use toolmesh_kernel::trace;
use toolmesh_kernel::wire::{error_body, McpServerStatus};
use toolmesh_kernel::{ErrorCode, NodeId, ToolError, VERSION};
use tracing::Instrument as _;

use crate::connection::Connection;
use crate::reply;
use crate::tools::ToolEndpoint;

/// How long one MCP call may take before the bridge cancels it at the server and answers
/// `timeout` (a gateway's own deadline is normally shorter).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// What every call of one server shares.
#[derive(Debug)]
pub struct ServerContext {
    pub server: String,
    pub service: String,
    pub node: NodeId,
    pub nats: Client,
    /// The live connection; `None` while the server starts or restarts.
    pub connection: watch::Receiver<Option<Arc<Connection>>>,
    pub calls: Calls,
    pub status: Arc<Mutex<McpServerStatus>>,
    pub tracker: TaskTracker,
    pub in_flight: InFlight,
    /// Cancelled at the drain deadline: calls still running answer `unavailable`.
    pub stop: CancellationToken,
}

/// Calls in flight by invocation id, so that a cancel finds them.
#[derive(Debug, Default)]
pub struct Calls(Mutex<HashMap<String, (CancellationToken, usize)>>);

impl Calls {
    /// The token a cancel of `invocation` fires; held until the guard drops.
    fn enter(&self, invocation: &str) -> (CancellationToken, CallGuard<'_>) {
        let mut map = self.0.lock().expect("calls lock");
        let entry = map
            .entry(invocation.to_owned())
            .or_insert_with(|| (CancellationToken::new(), 0));
        entry.1 += 1;
        (
            entry.0.clone(),
            CallGuard {
                calls: self,
                invocation: invocation.to_owned(),
            },
        )
    }

    /// Cancels the calls of `invocation`; whether any was in flight.
    pub fn cancel(&self, invocation: &str) -> bool {
        match self.0.lock().expect("calls lock").get(invocation) {
            Some((token, _)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}

struct CallGuard<'a> {
    calls: &'a Calls,
    invocation: String,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.calls.0.lock().expect("calls lock");
        if let Some(entry) = map.get_mut(&self.invocation) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.invocation);
            }
        }
    }
}

/// A running service with the endpoints of one tool list.
#[derive(Debug)]
pub struct Provider {
    service: async_nats::service::Service,
    pub endpoints: Vec<ToolEndpoint>,
    loops: Vec<JoinHandle<()>>,
}

impl Provider {
    /// Starts the service of `endpoints` (not empty) and the loops that take their requests.
    pub async fn start(
        ctx: &Arc<ServerContext>,
        endpoints: Vec<ToolEndpoint>,
        transport: &str,
    ) -> Result<Provider, async_nats::Error> {
        let status = ctx.status.clone();
        let metadata = HashMap::from([
            ("toolmesh.bridge.server".to_owned(), ctx.server.clone()),
            ("toolmesh.bridge.transport".to_owned(), transport.to_owned()),
            ("node_id".to_owned(), ctx.node.to_string()),
        ]);
        let service = ctx
            .nats
            .service_builder()
            .description(format!(
                "MCP server {:?} through the toolmesh bridge",
                ctx.server
            ))
            .metadata(metadata)
            .stats_handler(move |_endpoint, _stats| {
                serde_json::to_value(&*status.lock().expect("status lock")).unwrap_or_default()
            })
            .start(&ctx.service, VERSION)
            .await?;
        let mut loops = Vec::with_capacity(endpoints.len());
        for endpoint in &endpoints {
            let mut requests = service
                .endpoint_builder()
                .name(&endpoint.name)
                .metadata(endpoint.metadata.clone())
                .add(internal::mcp_tool(&ctx.server, &endpoint.name))
                .await?;
            let ctx = ctx.clone();
            let mcp_name = endpoint.mcp_name.clone();
            loops.push(tokio::spawn(async move {
                while let Some(request) = requests.next().await {
                    let ctx2 = ctx.clone();
                    let mcp_name = mcp_name.clone();
                    ctx.tracker.spawn(async move {
                        answer(&ctx2, &mcp_name, request).await;
                    });
                }
            }));
        }
        Ok(Provider {
            service,
            endpoints,
            loops,
        })
    }

    /// Stops the service; requests its endpoints already took still run (and are tracked).
    pub async fn stop(self) {
        let _ = self.service.stop().await;
        for task in self.loops {
            let _ = task.await;
        }
    }
}

/// Tells gateways that `service`'s tool set changed (PROTOCOL.md: any body re-discovers).
pub async fn announce(ctx: &ServerContext, tools: usize) {
    let body = json!({
        "service": ctx.service,
        "node_id": ctx.node.as_str(),
        "tools": tools,
    });
    if let Err(e) = ctx
        .nats
        .publish(public::PROVIDERS_ANNOUNCE, body.to_string().into())
        .await
    {
        tracing::warn!(service = %ctx.service, error = %e, "could not announce the provider");
    }
}

/// The provider envelope (PROTOCOL.md "Tool providers"); only `arguments` and
/// `invocation_id` matter here.
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    invocation_id: Option<String>,
}

/// Answers one provider call in its span, a child of the gateway's call span.
async fn answer(ctx: &ServerContext, mcp_name: &str, request: Request) {
    let _counted = ctx.in_flight.enter();
    let span = tracing::info_span!(
        "bridge",
        otel.name = "bridge tools/call",
        otel.kind = "server",
        server = %ctx.server,
        tool = %mcp_name,
        invocation_id = tracing::field::Empty,
    );
    trace::follow(&span, request.message.headers.as_ref());
    async move {
        let body = run(ctx, mcp_name, &request.message.payload).await;
        let body = reply::fitted(body, ctx.nats.max_payload());
        if let Err(e) = request.respond(Ok(body.into())).await {
            tracing::warn!(error = %e, "could not answer a call");
        }
    }
    .instrument(span)
    .await
}

async fn run(ctx: &ServerContext, mcp_name: &str, payload: &[u8]) -> Vec<u8> {
    let envelope: Envelope = match serde_json::from_slice(payload) {
        Ok(envelope) => envelope,
        Err(e) => {
            return error_body(ToolError::invalid_request(format!(
                "the call is not a provider envelope: {e}"
            )))
        }
    };
    let arguments = match envelope.arguments {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return error_body(ToolError::new(
                ErrorCode::InvalidArguments,
                format!(
                    "arguments must be an object, not {}",
                    toolmesh_kernel::wire::json_kind(&other)
                ),
            ))
        }
    };
    let Some(connection) = ctx.connection.borrow().clone() else {
        let state = ctx.status.lock().expect("status lock").state;
        return error_body(reply::unavailable(
            &ctx.server,
            &format!("it is {}", state.as_str()),
        ));
    };
    if connection.closed.is_cancelled() {
        return error_body(reply::unavailable(&ctx.server, "it is restarting"));
    }
    let invocation = envelope.invocation_id.unwrap_or_default();
    tracing::Span::current().record(
        "invocation_id",
        tracing::field::display(toolmesh_kernel::text::DisplaySafe(&invocation)),
    );
    let (cancelled, _registered) = ctx.calls.enter(&invocation);
    let params = CallToolRequestParams::new(mcp_name.to_owned()).with_arguments(arguments);
    // Dropping the call future (on a cancel, a timeout or the drain deadline) sends the server
    // `notifications/cancelled` for the request (rmcp's abandoned-request guard).
    let call = connection.peer.call_tool_once(params);
    tokio::select! {
        outcome = call => match outcome {
            Ok(CallToolResponse::Complete(result)) => reply::from_result(result),
            Ok(_) => error_body(ToolError::new(
                ErrorCode::ProviderError,
                "the MCP server asked for more input or answered with a task; the bridge \
                 follows neither",
            )),
            Err(e) => {
                // The process may have died: say so rather than naming a transport error.
                if connection.closed.is_cancelled() {
                    error_body(reply::unavailable(&ctx.server, "it stopped during the call"))
                } else {
                    error_body(reply::from_service_error(&ctx.server, e))
                }
            }
        },
        _ = connection.closed.cancelled() => {
            error_body(reply::unavailable(&ctx.server, "it stopped during the call"))
        }
        _ = cancelled.cancelled(), if !invocation.is_empty() => {
            error_body(ToolError::new(ErrorCode::Cancelled, "the call was cancelled"))
        }
        _ = tokio::time::sleep(CALL_TIMEOUT) => error_body(ToolError::new(
            ErrorCode::Timeout,
            format!("MCP server {:?} did not answer within {} s", ctx.server, CALL_TIMEOUT.as_secs()),
        )),
        _ = ctx.stop.cancelled() => {
            error_body(reply::unavailable(&ctx.server, "the bridge is stopping"))
        }
    }
}
