//! The Docker network of a worker's egress sandboxes: an `internal` bridge (no route out, no
//! DNS beyond the network's own names), on which the only thing a sandbox reaches is the
//! worker's egress proxy.
//!
//! Where the proxy listens depends on where the worker runs:
//!
//! * **a host process** ([`Placement::Host`], the tests): the bridge's gateway address is the
//!   host's own address on the network, and the proxy listens there. Inter-container traffic
//!   is off (`enable_icc=false`), so sandboxes do not reach each other. The host would answer
//!   on every address it has, so the worker puts two `iptables` rules before everything else
//!   in `INPUT` for the bridge: accept TCP to the proxy's address and port, drop the rest.
//!   The worker must be root with `iptables` at hand; without them the network is not made.
//! * **a container** ([`Placement::Join`], compose's `sandbox` service): the bridge gets no
//!   host address (`inhibit_ipv4`), so the host is not on it at all; the worker connects its
//!   own container to the network and the proxy listens on that container's address there.
//!   The same two `INPUT` rules, by the network's subnet, go into the worker container's own
//!   namespace (it needs `NET_ADMIN` and `iptables`), so sandboxes reach nothing else the
//!   worker serves. Inter-container traffic must stay on for sandboxes to reach the worker's
//!   container, so sandboxes of one worker can reach each other on this network.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use bollard::models::{EndpointSettings, NetworkConnectRequest, NetworkCreateRequest};
use bollard::Docker;

use crate::backend::{LABEL_MANAGED, LABEL_NODE, LABEL_PROJECT, LABEL_SCOPE};

/// Marks a network as a worker's egress network.
pub const LABEL_EGRESS: &str = "io.toolmesh.egress";

/// Where the worker (and so its proxy) runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// In the host's network namespace.
    Host,
    /// In this Docker container (its name or id), which joins the network.
    Join(String),
}

/// A created egress network.
#[derive(Debug)]
pub struct EgressNetwork {
    docker: Docker,
    /// The Docker network's name; sandboxes join it (`network_mode`).
    pub name: String,
    /// The address the proxy listens on, reachable from the network.
    pub proxy_ip: IpAddr,
    placement: Placement,
    bridge: String,
    /// The `INPUT` rules in place (host placement), as `iptables` arguments after `-I/-D INPUT`.
    rules: Vec<Vec<String>>,
}

/// Why the network could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the sandbox egress network {name}: {reason}")]
pub struct NetworkError {
    pub name: String,
    pub reason: String,
}

/// A short name for the bridge device (at most 15 characters).
fn bridge_name(name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    format!("tme-{:010x}", hasher.finish() & 0xff_ffff_ffff)
}

impl EgressNetwork {
    /// Creates the network `name` (removing a stale one of that name first) for the worker
    /// `node` of deployment `scope` (and compose `project`, a label).
    pub async fn create(
        docker: &Docker,
        name: &str,
        node: &str,
        (scope, project): (&str, Option<&str>),
        placement: Placement,
    ) -> Result<Self, NetworkError> {
        let error = |reason: String| NetworkError {
            name: name.to_owned(),
            reason,
        };
        let _ = docker.remove_network(name).await;
        let bridge = bridge_name(name);
        let mut options =
            HashMap::from([("com.docker.network.bridge.name".to_owned(), bridge.clone())]);
        match placement {
            Placement::Host => {
                options.insert(
                    "com.docker.network.bridge.enable_icc".to_owned(),
                    "false".to_owned(),
                );
            }
            Placement::Join(_) => {
                options.insert(
                    "com.docker.network.bridge.inhibit_ipv4".to_owned(),
                    "true".to_owned(),
                );
            }
        }
        let mut labels = HashMap::from([
            (LABEL_MANAGED.to_owned(), "1".to_owned()),
            (LABEL_EGRESS.to_owned(), "1".to_owned()),
            (LABEL_NODE.to_owned(), node.to_owned()),
            (LABEL_SCOPE.to_owned(), scope.to_owned()),
        ]);
        if let Some(project) = project {
            labels.insert(LABEL_PROJECT.to_owned(), project.to_owned());
        }
        docker
            .create_network(NetworkCreateRequest {
                name: name.to_owned(),
                driver: Some("bridge".to_owned()),
                internal: Some(true),
                attachable: Some(true),
                options: Some(options),
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map_err(|e| error(format!("creating it: {e}")))?;
        let mut network = Self {
            docker: docker.clone(),
            name: name.to_owned(),
            proxy_ip: IpAddr::from([0, 0, 0, 0]),
            placement: placement.clone(),
            bridge,
            rules: Vec::new(),
        };
        let found = match &placement {
            Placement::Host => network.gateway().await,
            Placement::Join(container) => network.join(container).await,
        };
        match found {
            Ok(ip) => network.proxy_ip = ip,
            Err(reason) => {
                network.remove().await;
                return Err(error(reason));
            }
        }
        Ok(network)
    }

    /// The IPAM configurations Docker gave the network (subnet, gateway).
    async fn ipam_configs(&self) -> Result<Vec<bollard::models::IpamConfig>, String> {
        let inspected = self
            .docker
            .inspect_network(
                &self.name,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
            .map_err(|e| format!("inspecting it: {e}"))?;
        Ok(inspected
            .ipam
            .and_then(|ipam| ipam.config)
            .unwrap_or_default())
    }

    async fn gateway(&self) -> Result<IpAddr, String> {
        self.ipam_configs()
            .await?
            .into_iter()
            .filter_map(|c| c.gateway)
            .find_map(|g| g.parse::<IpAddr>().ok().filter(IpAddr::is_ipv4))
            .ok_or_else(|| "it has no IPv4 gateway address".to_owned())
    }

    async fn join(&self, container: &str) -> Result<IpAddr, String> {
        self.docker
            .connect_network(
                &self.name,
                NetworkConnectRequest {
                    container: Some(container.to_owned()),
                    endpoint_config: Some(EndpointSettings::default()),
                },
            )
            .await
            .map_err(|e| format!("connecting this worker's container {container} to it: {e}"))?;
        let inspected = self
            .docker
            .inspect_container(
                container,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(|e| format!("inspecting this worker's container {container}: {e}"))?;
        inspected
            .network_settings
            .and_then(|s| s.networks)
            .and_then(|mut n| n.remove(&self.name))
            .and_then(|e| e.ip_address)
            .and_then(|ip| ip.parse::<IpAddr>().ok())
            .ok_or_else(|| format!("this worker's container {container} got no address on it"))
    }

    /// The network's IPv4 subnet (CIDR text).
    async fn subnet(&self) -> Result<String, String> {
        self.ipam_configs()
            .await?
            .into_iter()
            .filter_map(|c| c.subnet)
            .find(|s| s.parse::<ipnet::Ipv4Net>().is_ok())
            .ok_or_else(|| "it has no IPv4 subnet".to_owned())
    }

    /// Lets the network reach the worker only at `proxy` (TCP), nothing else, with two rules
    /// at the top of `INPUT` in the worker's network namespace: the host's, by the bridge
    /// device (host placement), or the worker container's own, by the network's subnet (a
    /// container, which then needs `NET_ADMIN` and `iptables`).
    pub async fn guard(&mut self, proxy: SocketAddr) -> Result<(), NetworkError> {
        let (from, needs): (Vec<String>, &str) = match self.placement {
            Placement::Host => (
                vec!["-i".into(), self.bridge.clone()],
                "a worker on the host needs root and iptables",
            ),
            Placement::Join(_) => {
                let subnet = self.subnet().await.map_err(|reason| NetworkError {
                    name: self.name.clone(),
                    reason,
                })?;
                (
                    vec!["-s".into(), subnet],
                    "a worker in a container needs NET_ADMIN and iptables in it",
                )
            }
        };
        let drop_rest = [from.clone(), vec!["-j".into(), "DROP".into()]].concat();
        let accept_proxy = [
            from,
            vec![
                "-p".into(),
                "tcp".into(),
                "-d".into(),
                proxy.ip().to_string(),
                "--dport".into(),
                proxy.port().to_string(),
                "-j".into(),
                "ACCEPT".into(),
            ],
        ]
        .concat();
        // Inserted at the top in this order: the ACCEPT ends up first.
        for rule in [drop_rest, accept_proxy] {
            if let Err(reason) = iptables("-I", &rule).await {
                return Err(NetworkError {
                    name: self.name.clone(),
                    reason: format!(
                        "{reason} ({needs} to keep sandboxes off the worker's other ports)"
                    ),
                });
            }
            self.rules.push(rule);
        }
        Ok(())
    }

    /// Removes the rules and the network (idempotent; errors are logged).
    pub async fn remove(&mut self) {
        for rule in std::mem::take(&mut self.rules).into_iter().rev() {
            if let Err(reason) = iptables("-D", &rule).await {
                tracing::warn!(network = %self.name, %reason, "egress network: removing a rule");
            }
        }
        if let Placement::Join(container) = &self.placement {
            let _ = self
                .docker
                .disconnect_network(
                    &self.name,
                    bollard::models::NetworkDisconnectRequest {
                        container: Some(container.clone()),
                        force: Some(true),
                    },
                )
                .await;
        }
        match self.docker.remove_network(&self.name).await {
            Ok(()) => {}
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => {
                tracing::warn!(network = %self.name, error = %e, "egress network: removing it")
            }
        }
    }
}

impl Drop for EgressNetwork {
    /// A network dropped without [`EgressNetwork::remove`] (a panic, a worker that stopped
    /// without draining) still takes its host rules along; the Docker network stays until the
    /// next start of the same node removes it.
    fn drop(&mut self) {
        for rule in std::mem::take(&mut self.rules).into_iter().rev() {
            let _ = std::process::Command::new("iptables")
                .args(["-w", "-D", "INPUT"])
                .args(&rule)
                .output();
        }
    }
}

/// Removes the egress networks of deployment `scope` that a previous run of `this_node` left
/// and, given `live_nodes`, those of every node not in it (workers that died without
/// draining), with their host rules. Containers still on such a network keep it (Docker
/// refuses); the container reaper removes them first. Returns how many went.
pub async fn reap_orphans(
    docker: &Docker,
    scope: &str,
    this_node: &str,
    live_nodes: Option<&[String]>,
) -> Result<usize, NetworkError> {
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![
            format!("{LABEL_EGRESS}=1"),
            format!("{LABEL_SCOPE}={scope}"),
        ],
    )]);
    let networks = docker
        .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
            filters: Some(filters),
        }))
        .await
        .map_err(|e| NetworkError {
            name: format!("of scope {scope}"),
            reason: format!("listing them: {e}"),
        })?;
    let mut removed = 0;
    for network in networks {
        let (Some(name), labels) = (network.name, network.labels.unwrap_or_default()) else {
            continue;
        };
        let node = labels.get(LABEL_NODE).map(String::as_str).unwrap_or("");
        let orphan =
            node == this_node || live_nodes.is_some_and(|live| !live.iter().any(|n| n == node));
        if !orphan {
            continue;
        }
        release_stopped_members(docker, &name).await;
        if docker.remove_network(&name).await.is_ok() {
            removed += 1;
            drop_bridge_rules(&bridge_name(&name)).await;
        }
    }
    Ok(removed)
}

/// Disconnects the stopped containers that still name network `name`: above all the killed
/// worker's own container (placement [`Placement::Join`]). Docker removes a network whose
/// members are all stopped, but a stopped container naming a removed network cannot start
/// again ("network … not found"), so `docker compose up` could not bring the worker back.
async fn release_stopped_members(docker: &Docker, name: &str) {
    let filters = HashMap::from([
        ("network".to_owned(), vec![name.to_owned()]),
        (
            "status".to_owned(),
            vec!["exited".to_owned(), "created".to_owned(), "dead".to_owned()],
        ),
    ]);
    let Ok(members) = docker
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
    else {
        return;
    };
    for id in members.into_iter().filter_map(|c| c.id) {
        let request = bollard::models::NetworkDisconnectRequest {
            container: Some(id.clone()),
            force: Some(true),
        };
        if let Err(e) = docker.disconnect_network(name, request).await {
            tracing::warn!(network = %name, container = %id, error = %e, "egress network: releasing a stopped member");
        }
    }
}

/// Deletes every `INPUT` rule that names `bridge` (rules a killed worker left).
async fn drop_bridge_rules(bridge: &str) {
    let Ok(out) = tokio::process::Command::new("iptables")
        .args(["-w", "-S", "INPUT"])
        .output()
        .await
    else {
        return;
    };
    let needle = format!("-i {bridge} ");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(rule) = line.strip_prefix("-A INPUT ") {
            if format!("{rule} ").contains(&needle) {
                let rule: Vec<String> = rule.split_whitespace().map(str::to_owned).collect();
                let _ = iptables("-D", &rule).await;
            }
        }
    }
}

async fn iptables(op: &str, rule: &[String]) -> Result<(), String> {
    let mut command = tokio::process::Command::new("iptables");
    command.args(["-w", op, "INPUT"]).args(rule);
    let out = command
        .output()
        .await
        .map_err(|e| format!("running iptables: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables {op} INPUT {}: {}",
            rule.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
