//! Egress for sandboxes with `network = "allow"`: one proxy per worker and the network that
//! makes it a sandbox's only route (PROTOCOL.md "Sandbox templates").
//!
//! * [`allow`] parses a template's `allow` entries and checks a target against them and the
//!   kernel's egress policy ([`toolmesh_kernel::egress::Egress::check_host`], the one copy of
//!   the address checks that `web_fetch` and skill downloads use too).
//! * [`proxy`] is the HTTP proxy: absolute-form `http://` requests and `CONNECT` tunnels,
//!   each sandbox identified by its own credential, every target a [`Decision`].
//! * [`network`] is the Docker network: `internal`, the proxy the one thing on it a sandbox
//!   reaches.
//!
//! [`SandboxEgress`] puts them together: [`SandboxEgress::start`] once per worker,
//! [`SandboxEgress::register`] for each sandbox before it is created (the container joins
//! [`Registration::network`] and gets [`Registration::env`] in its environment),
//! [`SandboxEgress::unregister`] when it is removed.

pub mod allow;
pub mod network;
pub mod proxy;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use bollard::Docker;

pub use allow::{AllowError, AllowList, DEFAULT_PORTS};
pub use network::{reap_orphans, EgressNetwork, NetworkError, Placement};
pub use proxy::{Decision, OnDecision, Proxy, ProxyEnv, ProxyLimits};

/// What one sandbox needs to reach the outside through the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Its environment: `HTTP_PROXY`, `HTTPS_PROXY`, lower-case too, `NO_PROXY` empty.
    pub env: BTreeMap<String, String>,
    /// The Docker network it must join (and no other).
    pub network: String,
}

/// Why a worker's egress could not start.
#[derive(Debug, thiserror::Error)]
pub enum EgressStartError {
    #[error(transparent)]
    Network(#[from] NetworkError),
    #[error("the sandbox egress proxy cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A worker's egress: its proxy and its network.
#[derive(Debug)]
pub struct SandboxEgress {
    proxy: Proxy,
    network: EgressNetwork,
}

/// The Docker network name of `node`'s egress network.
pub fn network_name(node: &str) -> String {
    let node: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("toolmesh-egress-{node}")
}

impl SandboxEgress {
    /// Creates the network of worker `node` (deployment `scope` and compose project, labels as
    /// its containers carry), starts the proxy where the network reaches it (see [`network`])
    /// and, on the host, closes the host's other ports to the network.
    pub async fn start(
        docker: &Docker,
        node: &str,
        deployment: (&str, Option<&str>),
        placement: Placement,
        limits: ProxyLimits,
    ) -> Result<Self, EgressStartError> {
        let mut network =
            EgressNetwork::create(docker, &network_name(node), node, deployment, placement).await?;
        let addr = SocketAddr::new(network.proxy_ip, 0);
        let proxy = match Proxy::bind(addr, limits).await {
            Ok(proxy) => proxy,
            Err(source) => {
                network.remove().await;
                return Err(EgressStartError::Listen { addr, source });
            }
        };
        if let Err(error) = network.guard(proxy.local_addr()).await {
            network.remove().await;
            return Err(error.into());
        }
        Ok(Self { proxy, network })
    }

    /// The Docker network sandboxes join.
    pub fn network(&self) -> &str {
        &self.network.name
    }

    /// Where the proxy listens.
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy.local_addr()
    }

    /// Lets the sandbox `key` reach the targets of `allow`; `on_decision` hears every target
    /// it asks for.
    pub fn register(&self, key: &str, allow: AllowList, on_decision: OnDecision) -> Registration {
        let ProxyEnv { vars, .. } = self.proxy.register(key, allow, on_decision);
        Registration {
            env: vars,
            network: self.network.name.clone(),
        }
    }

    /// Ends the sandbox `key`'s use of the proxy (its open connections too).
    pub fn unregister(&self, key: &str) {
        self.proxy.unregister(key);
    }

    /// Stops the proxy, then removes the host rules and the network (once no container is
    /// left on it: remove the sandboxes first).
    pub async fn shutdown(self) {
        let Self { proxy, mut network } = self;
        proxy.shutdown().await;
        network.remove().await;
    }
}
