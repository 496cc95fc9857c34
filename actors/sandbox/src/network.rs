//! The one place where a sandbox gets its network from its template: the Docker network mode
//! and the variables its commands see (PROTOCOL.md "Sandbox templates").
//!
//! `network = "none"` is Docker's `none`; the default template may name a Docker network the
//! operator opened (`TOOLMESH_SANDBOX_NETWORK`). `network = "allow"` is the seam for the
//! worker's egress proxy: its sandbox's only route is the proxy, named in `HTTP_PROXY`,
//! `HTTPS_PROXY` and their lower-case forms. This build has no proxy yet, so a template with
//! `network = "allow"` stops the sandbox role at start ([`check`]).

use crate::templates::{Network, Template};

/// A sandbox's network: what the backend gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNetwork {
    /// The Docker network mode (`none` or a network's name).
    pub mode: String,
    /// Variables every command of the sandbox sees.
    pub env: Vec<(String, String)>,
}

/// Why a template's network cannot be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox template {template:?}: {reason}")]
pub struct NetworkRefused {
    pub template: String,
    pub reason: String,
}

/// Whether this worker can give `template` its network; called for every template at start.
pub fn check(template: &Template) -> Result<(), NetworkRefused> {
    network_of(template).map(drop)
}

/// The network of a new sandbox of `template`.
pub fn network_of(template: &Template) -> Result<SandboxNetwork, NetworkRefused> {
    match &template.network {
        Network::None => Ok(SandboxNetwork {
            mode: "none".to_owned(),
            env: Vec::new(),
        }),
        Network::Docker(name) => Ok(SandboxNetwork {
            mode: name.clone(),
            env: Vec::new(),
        }),
        Network::Allow(_) => Err(NetworkRefused {
            template: template.name.clone(),
            reason: "network = \"allow\" needs the worker's egress proxy, which this build does \
                     not have yet; use network = \"none\""
                .to_owned(),
        }),
    }
}
