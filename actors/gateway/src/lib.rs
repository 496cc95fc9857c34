//! toolmesh-gateway: the actor every tool call goes through.
//!
//! It takes the account from the subject, checks the body, the tool and its arguments (JSON
//! Schema), asks the approval actor when the risk policy says so, and then answers the call
//! itself (`component_status`, `tool_search`, `tool_dispatcher`) or routes it to the actor that
//! owns the tool over `toolmesh.internal.v1.run.<role>`. RunEvents `started`, the approval ones
//! and `finished` are published here, with gap-free `seq`.
//!
//! It also discovers tool providers (NATS micro services, PROTOCOL.md "Tool providers") and
//! routes their tools' calls to the providers' endpoint subjects: [`providers`].
//!
//! Redis is never on this path: calls that need no approval touch only NATS.

mod actor;
mod audit;
mod builtin;
mod call;
mod cancel;
pub mod config;
mod core;
pub mod providers;
mod splice;
pub mod tools;
pub mod variables;

use std::sync::Arc;

use actix::prelude::*;
use futures::StreamExt;
use tokio::sync::broadcast;

use toolmesh_kernel::cluster::ClusterView;
use toolmesh_kernel::host::{
    confirm_subscriptions, drainable, ActorHandle, InFlight, Lifecycle, ReplyInbox,
};
use toolmesh_kernel::metrics::Metrics;
use toolmesh_kernel::subjects::{internal, public, queue};
use toolmesh_kernel::tools::ToolRegistry;
use toolmesh_kernel::Role;

pub use call::gate::GATE_TIMEOUT;
pub use call::route::DEFAULT_ROUTE_TIMEOUT;
pub use config::{GatewayConfig, Reported};

use actor::{
    ApprovalDecided, ArgumentsChecked, AuditQueried, CallReceived, CancelReceived, Gateway,
};

#[derive(Debug, thiserror::Error)]
pub enum GatewayStartError {
    #[error("cannot subscribe to {subject}: {source}")]
    Subscribe {
        subject: &'static str,
        source: async_nats::SubscribeError,
    },
    #[error("cannot subscribe the reply inbox of long-running calls: {0}")]
    ReplyInbox(#[source] async_nats::SubscribeError),
    #[error("the NATS server did not confirm the subscriptions: {0}")]
    Confirm(#[from] toolmesh_kernel::host::ConfirmError),
}

/// What the gateway accounts to, shared with the rest of the node: the in-flight count, the
/// node's metrics and its audit trail.
#[derive(Clone)]
pub struct Accounting {
    pub in_flight: InFlight,
    pub metrics: Metrics,
    pub audit: toolmesh_kernel::audit::AuditTrail,
    /// What the NATS server refuses the node's connection: a call whose request it refuses
    /// ends at once instead of waiting out its timeout.
    pub refusals: toolmesh_kernel::permissions::Refusals,
}

/// Starts the gateway actor (inside an actix `System`) and returns once its subscriptions are
/// live on the server.
pub async fn spawn(
    client: async_nats::Client,
    config: Arc<GatewayConfig>,
    registry: Arc<ToolRegistry>,
    cluster: Arc<ClusterView>,
    lifecycle: Lifecycle,
    accounting: Accounting,
) -> Result<ActorHandle, GatewayStartError> {
    let Accounting {
        in_flight,
        metrics,
        audit,
        refusals,
    } = accounting;
    let group = queue::of(Role::Gateway);
    let subscribe = |subject: &'static str, queued: bool| {
        let client = client.clone();
        let group = group.clone();
        async move {
            let result = if queued {
                client.queue_subscribe(subject, group).await
            } else {
                client.subscribe(subject).await
            };
            result.map_err(|source| GatewayStartError::Subscribe { subject, source })
        }
    };
    let calls = subscribe(public::CALL_ANY, true).await?;
    let cancels = subscribe(public::CANCEL_ANY, true).await?;
    // Every gateway hears every decision: a parked call may be on any of them.
    let decided = subscribe(public::APPROVALS_DECIDED_ANY, false).await?;
    // Any one gateway answers an account's audit query.
    let queries = subscribe(public::AUDIT_QUERY_ANY, true).await?;
    // Any one gateway checks a reviewer's edited arguments for the approval actor.
    let checks = subscribe(internal::GATEWAY_CHECK, true).await?;
    // Every gateway discovers providers on its own.
    let announces = subscribe(public::PROVIDERS_ANNOUNCE, false).await?;
    // Claims and replies of calls to long-running roles (sandbox, skills).
    let replies = ReplyInbox::start(&client)
        .await
        .map_err(GatewayStartError::ReplyInbox)?;
    confirm_subscriptions(&client).await?;

    let (decided_tx, _) = broadcast::channel(1024);
    let tools = Arc::new(providers::LiveTools::new(registry));
    // `toolmesh_provider_instances`, read from the catalog on each scrape.
    metrics.on_scrape({
        let tools = tools.clone();
        let metrics = metrics.clone();
        move || {
            let providers = tools.providers();
            metrics.set_provider_instances(
                providers
                    .iter()
                    .map(|p| (p.name.as_str(), p.instances as u64)),
            );
            Box::pin(std::future::ready(()))
        }
    });
    tokio::spawn(providers::discover(
        client.clone(),
        tools.clone(),
        announces,
        lifecycle.drain.clone(),
    ));
    let core = Arc::new(crate::core::GatewayCore {
        client,
        tools,
        config,
        cluster,
        decided: decided_tx,
        lifecycle: lifecycle.clone(),
        in_flight,
        metrics,
        status_cache: Default::default(),
        replies,
        audit,
        refusals,
    });
    let (handle, stop_notice) = ActorHandle::new(Role::Gateway);
    let drain = lifecycle.drain.clone();
    // Public requests that ask for a reply anywhere but an inbox are dropped unread.
    let replies = core.config.node.reply_prefixes.clone();
    Gateway::create(move |ctx| {
        ctx.add_stream(
            replies
                .screen(drainable(calls, drain.clone()))
                .map(CallReceived),
        );
        ctx.add_stream(
            replies
                .screen(drainable(cancels, drain.clone()))
                .map(CancelReceived),
        );
        ctx.add_stream(drainable(decided, drain.clone()).map(ApprovalDecided));
        ctx.add_stream(
            replies
                .screen(drainable(queries, drain.clone()))
                .map(AuditQueried),
        );
        ctx.add_stream(drainable(checks, drain).map(ArgumentsChecked));
        Gateway::new(core, 5, stop_notice)
    });
    Ok(handle)
}
