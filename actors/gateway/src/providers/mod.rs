//! Tool providers (PROTOCOL.md "Tool providers"): NATS micro services whose endpoints carry
//! `toolmesh.tool` metadata. Each gateway discovers them on its own (no shared state): it
//! asks `$SRV.INFO` every [`POLL_INTERVAL`] and at once when something is published on
//! `toolmesh.v1.providers.announce`, keeps a [`catalog::Catalog`] of what answered, and swaps
//! its live registry ([`LiveTools`]: the built-in tools plus the current provider tools)
//! whole when that changes. Calls read the registry lock-free.
//!
//! `reply.rs` turns a provider's answer into a ToolReply; `call.rs` (the gateway's call path)
//! routes to the endpoint subject.

pub mod catalog;
pub mod metadata;
pub mod reply;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_nats::service::Info;
use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use toolmesh_kernel::subjects::srv;
use toolmesh_kernel::tools::ToolRegistry;

use catalog::{Catalog, ProviderStatus, Seen};

/// How often a gateway asks `$SRV.INFO`: a new provider is found within this plus one
/// [`GATHER_MAX`] (PROTOCOL.md: within 5 s).
pub const POLL_INTERVAL: Duration = Duration::from_millis(2500);
/// A round of `$SRV.INFO` ends this long after the last reply came...
pub const GATHER_QUIET: Duration = Duration::from_millis(300);
/// ...or this long after it began, whichever is first.
pub const GATHER_MAX: Duration = Duration::from_secs(2);
/// How often a call waiting for a provider checks that an instance that may run it is alive.
pub const LIVENESS_INTERVAL: Duration = Duration::from_secs(1);

/// The gateway's live registry and what `component_status` shows of its providers.
#[derive(Debug)]
pub struct LiveTools {
    builtin: Arc<ToolRegistry>,
    registry: ArcSwap<ToolRegistry>,
    status: ArcSwap<Vec<ProviderStatus>>,
    catalog: Mutex<Catalog>,
}

impl LiveTools {
    pub fn new(builtin: Arc<ToolRegistry>) -> Self {
        Self {
            registry: ArcSwap::new(builtin.clone()),
            builtin,
            status: ArcSwap::from_pointee(Vec::new()),
            catalog: Mutex::default(),
        }
    }

    /// The registry as it is now: built-in tools, then provider tools.
    pub fn snapshot(&self) -> Arc<ToolRegistry> {
        self.registry.load_full()
    }

    /// Every provider this gateway knows, by service name.
    pub fn providers(&self) -> Arc<Vec<ProviderStatus>> {
        self.status.load_full()
    }

    /// The instance ids of a provider this gateway knows.
    pub fn instances_of(&self, service: &str) -> Vec<String> {
        self.catalog
            .lock()
            .expect("catalog lock")
            .instances_of(service)
    }

    /// Takes one round's replies, expires what is gone, and swaps the registry when the set
    /// of provider tools changed.
    fn update(&self, seen: Vec<Seen>) {
        let now = Instant::now();
        let built = {
            let mut catalog = self.catalog.lock().expect("catalog lock");
            catalog.observe(seen, now, toolmesh_kernel::time::now_ms());
            catalog.expire(now);
            catalog.build(&self.builtin)
        };
        let current = self.registry.load();
        let unchanged = {
            let mut old = current.iter().skip(self.builtin.iter().count());
            built.tools.len() == current.iter().count() - self.builtin.iter().count()
                && built.tools.iter().all(|new| {
                    old.next()
                        .is_some_and(|old| std::ptr::eq(old, Arc::as_ptr(new)))
                })
        };
        if !unchanged {
            let names: Vec<&str> = built.tools.iter().map(|t| t.spec.name.as_ref()).collect();
            tracing::info!(tools = ?names, "provider tools changed");
            self.registry
                .store(Arc::new(self.builtin.with_tools(built.tools)));
        }
        for provider in built.status.iter() {
            for refused in &provider.refused {
                let known = self
                    .status
                    .load()
                    .iter()
                    .any(|p| p.name == provider.name && p.refused.contains(refused));
                if !known {
                    tracing::warn!(provider = %provider.name, tool = %refused.tool, reason = %refused.reason, "provider tool refused");
                }
            }
        }
        self.status.store(Arc::new(built.status));
    }
}

/// Discovers providers until `stop`: a round now, then every [`POLL_INTERVAL`] or when an
/// announce arrives, whichever is first.
pub async fn discover(
    client: Client,
    live: Arc<LiveTools>,
    mut announces: async_nats::Subscriber,
    stop: CancellationToken,
) {
    loop {
        let seen = tokio::select! {
            seen = gather(&client) => seen,
            _ = stop.cancelled() => return,
        };
        live.update(seen);
        tokio::select! {
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            msg = announces.next() => {
                if msg.is_none() {
                    return;
                }
                tracing::debug!("a provider announced itself; discovering now");
            }
            _ = stop.cancelled() => return,
        }
    }
}

/// One `$SRV.INFO` round: every reply until [`GATHER_QUIET`] passed without one, or
/// [`GATHER_MAX`] since the start. A reply that is not an info response is skipped.
async fn gather(client: &Client) -> Vec<Seen> {
    let inbox = client.new_inbox();
    let mut sub = match client.subscribe(inbox.clone()).await {
        Ok(sub) => sub,
        Err(e) => {
            tracing::warn!(error = %e, "cannot subscribe for $SRV.INFO replies");
            return Vec::new();
        }
    };
    let started = Instant::now();
    if let Err(e) = client
        .publish_with_reply(srv::INFO_ALL, inbox, Bytes::new())
        .await
    {
        tracing::warn!(error = %e, "cannot ask $SRV.INFO");
        return Vec::new();
    }
    let end = tokio::time::Instant::from_std(started + GATHER_MAX);
    let mut seen = Vec::new();
    loop {
        let quiet = tokio::time::Instant::now() + GATHER_QUIET;
        let Ok(Some(msg)) = tokio::time::timeout_at(quiet.min(end), sub.next()).await else {
            break;
        };
        if msg.status.is_some() {
            continue; // "no responders": nobody serves anything
        }
        match serde_json::from_slice::<Info>(&msg.payload) {
            Ok(info) => seen.push(Seen {
                info,
                latency: started.elapsed(),
            }),
            Err(e) => {
                tracing::debug!(error = %e, "ignoring a $SRV.INFO reply that is not an info response")
            }
        }
    }
    let _ = sub.unsubscribe().await;
    seen
}

/// Resolves once no instance of `service` that may run a call answers its ping ("no
/// responders" on `$SRV.PING.<service>.<id>`): checked every [`LIVENESS_INTERVAL`], over the
/// instances known at the start and any the catalog learns of meanwhile. Never resolves
/// while one of them is alive (the gateway cannot tell which instance took the call).
pub async fn all_instances_gone(client: &Client, live: &LiveTools, service: &str) {
    let mut watched: Vec<String> = live.instances_of(service);
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + LIVENESS_INTERVAL,
        LIVENESS_INTERVAL,
    );
    loop {
        tick.tick().await;
        for id in live.instances_of(service) {
            if !watched.contains(&id) {
                watched.push(id);
            }
        }
        if watched.is_empty() {
            continue;
        }
        let pings = watched.iter().map(|id| async move {
            let request = async_nats::Request::new().timeout(Some(LIVENESS_INTERVAL));
            let reply = client
                .send_request(srv::ping_instance(service, id), request)
                .await;
            let gone =
                matches!(&reply, Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders);
            (id.clone(), gone)
        });
        let answers = futures::future::join_all(pings).await;
        watched.retain(|id| !answers.iter().any(|(gone_id, gone)| *gone && gone_id == id));
        if watched.is_empty() {
            return;
        }
    }
}
