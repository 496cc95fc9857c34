//! Tool providers (PROTOCOL.md "Tool providers"): NATS micro services whose endpoints carry
//! `toolmesh.tool` metadata. Each gateway discovers them on its own (no shared state): it
//! asks `$SRV.INFO` every [`POLL_INTERVAL`] and at once when something is published on
//! `toolmesh.v1.providers.announce`, keeps a [`catalog::Catalog`] of what answered, and swaps
//! its live registry ([`LiveTools`]: the built-in tools plus the current provider tools)
//! whole when that changes. Calls read the registry lock-free.
//!
//! `reply.rs` turns a provider's answer into a ToolReply; `call.rs` (the gateway's call path)
//! routes to the endpoint subject.
//!
//! Provider health is one watch per provider, not a loop per call. [`LiveTools`] keeps a
//! `tokio::sync::watch` per provider with calls in flight, and each call holds a receiver. The
//! first call starts the provider's `watch_instances` loop: once a second it pings every
//! instance the catalog has (`$SRV.PING.<service>.<id>`) and has the catalog forget those with
//! no responders. Every rebuild of the registry sets the watch of each provider the catalog no
//! longer has, which wakes its calls with `unavailable`. The loop ends at its first tick
//! without a receiver.
//!
//! One of several instances dying mid-call: NATS core cannot tell which instance of the queue
//! group got a request. The provider still has a live instance, so its watch stays unset, and
//! the call answers `timeout` at its deadline (the gateway publishes the cancel). It may have
//! run in part; the caller decides whether to repeat it.

pub mod catalog;
pub mod metadata;
pub mod reply;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_nats::service::Info;
use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;
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
/// How often a provider with calls in flight has its instances pinged.
pub const LIVENESS_INTERVAL: Duration = Duration::from_secs(1);

/// The gateway's live registry and what `component_status` shows of its providers.
#[derive(Debug)]
pub struct LiveTools {
    builtin: Arc<ToolRegistry>,
    registry: ArcSwap<ToolRegistry>,
    status: ArcSwap<Vec<ProviderStatus>>,
    catalog: Mutex<Catalog>,
    /// One watch per provider with calls in flight: `true` once its last instance is gone.
    /// Its sender lives here and in the provider's `watch_instances` loop; the calls hold
    /// receivers. Locked after `catalog` when both are.
    gone: Mutex<HashMap<String, watch::Sender<bool>>>,
}

impl LiveTools {
    pub fn new(builtin: Arc<ToolRegistry>) -> Self {
        Self {
            registry: ArcSwap::new(builtin.clone()),
            builtin,
            status: ArcSwap::from_pointee(Vec::new()),
            catalog: Mutex::default(),
            gone: Mutex::default(),
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

    /// Resolves once every instance of `service` is gone: the catalog dropped it (expired,
    /// or each instance's ping had no responders). Calls in flight to one provider share one
    /// watch and one `watch_instances` loop, started by the first of them; it ends at its
    /// first tick without a call waiting. Never resolves while an instance is alive (the
    /// gateway cannot tell which instance took the call).
    pub fn gone(self: &Arc<Self>, client: &Client, service: &str) -> impl Future<Output = ()> {
        let mut receiver = {
            let mut gone = self.gone.lock().expect("gone lock");
            match gone.get(service) {
                Some(sender) => sender.subscribe(),
                None => {
                    let (sender, receiver) = watch::channel(false);
                    gone.insert(service.to_owned(), sender.clone());
                    tokio::spawn(watch_instances(
                        client.clone(),
                        self.clone(),
                        service.to_owned(),
                        sender,
                    ));
                    receiver
                }
            }
        };
        async move {
            if receiver.wait_for(|gone| *gone).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Takes one round's replies, expires what is gone, and rebuilds.
    fn update(&self, seen: Vec<Seen>) {
        let now = Instant::now();
        let mut catalog = self.catalog.lock().expect("catalog lock");
        catalog.observe(seen, now, toolmesh_kernel::time::now_ms());
        catalog.expire(now);
        self.rebuild(&mut catalog);
    }

    /// Drops an instance whose ping had no responders, and rebuilds.
    fn forget(&self, service: &str, id: &str) {
        let mut catalog = self.catalog.lock().expect("catalog lock");
        catalog.forget(service, id, Instant::now());
        tracing::info!(
            provider = service,
            instance = id,
            "a provider instance is gone"
        );
        self.rebuild(&mut catalog);
    }

    /// Swaps the registry when the set of provider tools changed, stores the status, and
    /// wakes the calls waiting on a provider the catalog no longer has. Runs under the
    /// catalog lock, so two rebuilds never swap out of order.
    fn rebuild(&self, catalog: &mut Catalog) {
        let built = catalog.build(&self.builtin);
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
        self.gone
            .lock()
            .expect("gone lock")
            .retain(|service, sender| {
                let known = catalog.knows(service);
                if !known {
                    sender.send_replace(true);
                }
                known
            });
    }
}

/// The health watch of one provider while calls to it are in flight: every
/// [`LIVENESS_INTERVAL`] it pings each instance the catalog has (`$SRV.PING.<service>.<id>`)
/// and has the catalog forget those with no responders, so that a provider killed mid-call is
/// known gone within about a second rather than at its expiry. It ends when the provider is
/// gone (the catalog's rebuild wakes the calls) or at a tick with no call waiting.
async fn watch_instances(
    client: Client,
    live: Arc<LiveTools>,
    service: String,
    sender: watch::Sender<bool>,
) {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + LIVENESS_INTERVAL,
        LIVENESS_INTERVAL,
    );
    loop {
        tick.tick().await;
        {
            let mut gone = live.gone.lock().expect("gone lock");
            let current = gone.get(&service).is_some_and(|s| s.same_channel(&sender));
            if !current {
                return; // the provider went; the rebuild woke its calls
            }
            if sender.receiver_count() == 0 {
                gone.remove(&service);
                return;
            }
        }
        let ids = live.instances_of(&service);
        if ids.is_empty() {
            // Known to the registry the calls took, no longer to the catalog.
            live.rebuild(&mut live.catalog.lock().expect("catalog lock"));
            continue;
        }
        let pings = ids.iter().map(|id| {
            let request = async_nats::Request::new().timeout(Some(LIVENESS_INTERVAL));
            let subject = srv::ping_instance(&service, id);
            let client = &client;
            async move {
                let reply = client.send_request(subject, request).await;
                matches!(&reply, Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders)
            }
        });
        let answers = futures::future::join_all(pings).await;
        for (id, gone) in ids.iter().zip(answers) {
            if gone {
                live.forget(&service, id);
            }
        }
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
        match parse_info(&msg.payload) {
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

/// A `$SRV.INFO` reply. A service registered without a description (nats.py's default) says
/// `"description": null` or nothing: it counts as an empty one, not as a reply to ignore.
fn parse_info(payload: &[u8]) -> Result<Info, serde_json::Error> {
    let mut reply: serde_json::Value = serde_json::from_slice(payload)?;
    if let Some(fields) = reply.as_object_mut() {
        let description = fields
            .entry("description")
            .or_insert(serde_json::Value::Null);
        if description.is_null() {
            *description = serde_json::Value::String(String::new());
        }
    }
    serde_json::from_value(reply)
}

#[cfg(test)]
mod tests {
    use super::parse_info;

    #[test]
    fn a_service_without_a_description_is_still_a_service() {
        let reply = |description: &str| {
            format!(
                r#"{{"type":"io.nats.micro.v1.info_response","name":"calc","id":"x1",{description}"version":"1.0.0","metadata":{{}},"endpoints":[]}}"#
            )
        };
        for missing in ["", r#""description":null,"#] {
            let info = parse_info(reply(missing).as_bytes()).expect("an info reply");
            assert_eq!(
                (info.name.as_str(), info.description.as_str()),
                ("calc", "")
            );
        }
        let described = parse_info(reply(r#""description":"adds","#).as_bytes()).unwrap();
        assert_eq!(described.description, "adds");
        assert!(parse_info(br#"{"type":"io.nats.micro.v1.ping_response"}"#).is_err());
    }
}
