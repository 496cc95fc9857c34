//! `notifications/tools/list_changed` when the profile's tool names change (providers coming
//! and going). A stdio client hears it as an ordinary notification; a client of the
//! 2026-07-28 revision asks for it with `subscriptions/listen` (over stdio or HTTP), and hears
//! it on that request's own stream until it cancels it. Either way the front keeps no state
//! another node needs: the stream is one request, and its watcher ends with it.

use std::time::Duration;

use futures::StreamExt as _;
use rmcp::service::{SubscriptionSendError, SubscriptionSink};
use tokio_util::sync::CancellationToken;

use crate::{Caller, Front};

/// How often a front checks its tool names when nothing was announced (a provider's tools go
/// about 12.5 s after its last instance, without an announce).
const LIST_CHECK_INTERVAL: Duration = Duration::from_secs(15);

/// Where a change is said.
pub enum ListSink {
    /// The connection's peer (stdio): an unsolicited notification.
    Peer(rmcp::Peer<rmcp::RoleServer>),
    /// One `subscriptions/listen` request.
    Listen(SubscriptionSink),
}

impl ListSink {
    /// Says the list changed; `false` when the sink is gone for good.
    async fn changed(&self) -> bool {
        match self {
            ListSink::Peer(peer) => {
                if peer.notify_tool_list_changed().await.is_err() {
                    tracing::debug!("the client takes no list_changed notification");
                }
                true
            }
            ListSink::Listen(sink) => match sink.notify_tool_list_changed().await {
                Ok(()) => true,
                Err(SubscriptionSendError::SubscriptionClosed) => false,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot say list_changed on the subscription");
                    false
                }
            },
        }
    }
}

/// Watches the profile's tool names until `stop` (or the sink closes): checked at once, 1 s
/// and 3 s after each `toolmesh.v1.providers.announce` (the gateways discover at once after
/// one) and every [`LIST_CHECK_INTERVAL`]. A check is one dispatcher `list`.
pub async fn watch_tools(front: Front, caller: Caller, sink: ListSink, stop: CancellationToken) {
    let mut announces = match front
        .nats()
        .subscribe(toolmesh_kernel::subjects::public::PROVIDERS_ANNOUNCE)
        .await
    {
        Ok(sub) => Some(sub),
        Err(e) => {
            tracing::warn!(error = %e, "cannot hear provider announces; checking the tool list on a timer only");
            None
        }
    };
    let mut last: Option<Vec<String>> = None;
    let mut tick = tokio::time::interval(LIST_CHECK_INTERVAL);
    let mut soon: Vec<tokio::time::Instant> = Vec::new();
    loop {
        let next_soon = soon.iter().min().copied();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            Some(_) = async {
                match announces.as_mut() {
                    Some(sub) => sub.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let now = tokio::time::Instant::now();
                soon.push(now + Duration::from_secs(1));
                soon.push(now + Duration::from_secs(3));
                continue;
            }
            _ = async {
                match next_soon {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = tokio::time::Instant::now();
                soon.retain(|at| *at > now);
            }
        }
        let Ok(mut names) = front.tool_names(&caller).await else {
            continue;
        };
        names.sort();
        if last.as_ref().is_some_and(|l| *l != names) && !sink.changed().await {
            return;
        }
        last = Some(names);
    }
}
