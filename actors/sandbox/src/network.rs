//! The one place where a sandbox gets its network from its template: the Docker network mode
//! and the variables its commands see (PROTOCOL.md "Sandbox templates").
//!
//! `network = "none"` is Docker's `none`; the default template may name a Docker network the
//! operator opened (`TOOLMESH_SANDBOX_NETWORK`). `network = "allow"` goes through the worker's
//! egress proxy ([`crate::egress::SandboxEgress`]): the sandbox joins the proxy's network, its
//! only route, and the proxy's URL is in `HTTP_PROXY`, `HTTPS_PROXY` and their lower-case
//! forms. A worker with such a template starts the proxy at start, or does not start.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use toolmesh_kernel::metrics::{EgressSource, Metrics};

use crate::egress::{AllowList, Decision, OnDecision, SandboxEgress};
use crate::templates::{AllowEntry, Network, Template};

/// A sandbox's network: what the backend gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNetwork {
    /// The Docker network mode (`none` or a network's name).
    pub mode: String,
    /// Variables every command of the sandbox sees.
    pub env: Vec<(String, String)>,
    /// Registered with the egress proxy under the sandbox's id: unregister it on removal.
    pub registered: bool,
}

/// Why a template's network cannot be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox template {template:?}: {reason}")]
pub struct NetworkRefused {
    pub template: String,
    pub reason: String,
}

/// The proxy's allow-list of `template`; `None` unless its network is `allow`.
pub fn allow_list(template: &Template) -> Result<Option<AllowList>, NetworkRefused> {
    let Network::Allow(entries) = &template.network else {
        return Ok(None);
    };
    let texts: Vec<String> = entries.iter().map(entry_text).collect();
    AllowList::parse(&texts)
        .map(Some)
        .map_err(|e| NetworkRefused {
            template: template.name.clone(),
            reason: e.to_string(),
        })
}

/// An entry as the `allow` field spells it.
fn entry_text(entry: &AllowEntry) -> String {
    let (target, port) = match entry {
        AllowEntry::Host { host, port } => (host.clone(), port),
        AllowEntry::Subdomains { domain, port } => (format!("*.{domain}"), port),
        AllowEntry::Network { net, port } => (net.to_string(), port),
    };
    match port {
        Some(port) => format!("{target}:{port}"),
        None => target,
    }
}

/// The network of a new sandbox `sandbox_id` of `template`. With `network = "allow"` it
/// registers the sandbox with `egress`, whose decisions go to `on_decision`.
pub fn network_of(
    template: &Template,
    egress: Option<&SandboxEgress>,
    sandbox_id: &str,
    on_decision: impl FnOnce() -> OnDecision,
) -> Result<SandboxNetwork, NetworkRefused> {
    match &template.network {
        Network::None => Ok(SandboxNetwork {
            mode: "none".to_owned(),
            env: Vec::new(),
            registered: false,
        }),
        Network::Docker(name) => Ok(SandboxNetwork {
            mode: name.clone(),
            env: Vec::new(),
            registered: false,
        }),
        Network::Allow(_) => {
            let allow = allow_list(template)?.unwrap_or_default();
            let Some(egress) = egress else {
                return Err(NetworkRefused {
                    template: template.name.clone(),
                    reason: "network = \"allow\" needs the worker's egress proxy, which is not \
                             running"
                        .to_owned(),
                });
            };
            let registration = egress.register(sandbox_id, allow, on_decision());
            Ok(SandboxNetwork {
                mode: registration.network,
                env: registration.env.into_iter().collect(),
                registered: true,
            })
        }
    }
}

/// Where the egress decisions of one sandbox go: to the command running in it while one
/// listens ([`DecisionTap::listen`]), else to the log.
pub struct DecisionTap {
    sandbox_id: String,
    metrics: Metrics,
    listener: Mutex<Option<(u64, mpsc::Sender<Decision>)>>,
    next: AtomicU64,
}

/// Decisions a command has not published yet; past it they go to the log.
const TAP_BACKLOG: usize = 1024;

impl DecisionTap {
    pub fn new(sandbox_id: &str, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            sandbox_id: sandbox_id.to_owned(),
            metrics,
            listener: Mutex::new(None),
            next: AtomicU64::new(0),
        })
    }

    /// What the proxy calls with each decision.
    pub fn on_decision(self: &Arc<Self>) -> OnDecision {
        let tap = self.clone();
        Arc::new(move |decision| tap.hear(decision))
    }

    fn hear(&self, decision: Decision) {
        self.metrics
            .egress_decision(EgressSource::Sandbox, decision.allowed);
        let unheard = match &*self.listener.lock().expect("tap lock") {
            Some((_, tx)) => tx.try_send(decision).err().map(|e| e.into_inner()),
            None => Some(decision),
        };
        if let Some(d) = unheard {
            self.hear_unheard(d);
        }
    }

    /// A decision no command hears: a log line.
    fn hear_unheard(&self, d: Decision) {
        tracing::info!(
            sandbox = %self.sandbox_id,
            host = %d.host,
            port = d.port,
            allowed = d.allowed,
            reason = d.reason.as_deref().unwrap_or(""),
            "sandbox egress"
        );
    }

    /// Sends the sandbox's decisions to the returned listener until it is dropped (a later
    /// listener takes them over).
    pub fn listen(self: &Arc<Self>) -> DecisionListener {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(TAP_BACKLOG);
        *self.listener.lock().expect("tap lock") = Some((id, tx));
        DecisionListener {
            tap: self.clone(),
            id,
            rx,
        }
    }
}

/// A command's share of its sandbox's decisions.
pub struct DecisionListener {
    tap: Arc<DecisionTap>,
    id: u64,
    pub rx: mpsc::Receiver<Decision>,
}

impl Drop for DecisionListener {
    fn drop(&mut self) {
        let mut listener = self.tap.listener.lock().expect("tap lock");
        if listener.as_ref().is_some_and(|(id, _)| *id == self.id) {
            *listener = None;
        }
        drop(listener);
        // What came in after the command's last look goes to the log.
        while let Ok(d) = self.rx.try_recv() {
            self.tap.hear_unheard(d);
        }
    }
}
