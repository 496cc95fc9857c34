//! A toolmesh node: starts the actors of its roles, answers status, heartbeats, and drains on
//! shutdown.
//!
//! Readiness: `toolmesh.v1.status.<node_id>` is subscribed only after every actor of the node
//! has its subscriptions live on the server, so an answer there means the node is ready.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use toolmesh_kernel::budget;
use toolmesh_kernel::cluster::{ClusterView, HEARTBEAT_INTERVAL};
use toolmesh_kernel::config::{NodeConfig, RawEnv};
use toolmesh_kernel::host::{connect_node, respond, ActorHandle, InFlight, Lifecycle};
use toolmesh_kernel::metrics::{Metrics, MetricsConfig, SandboxState, METRICS_LISTEN_VAR};
use toolmesh_kernel::policy::LivePolicy;
use toolmesh_kernel::subjects::{internal, public, queue};
use toolmesh_kernel::wire::{self, Heartbeat, NodeStatus};
use toolmesh_kernel::{NodeId, Role, VERSION};

/// Roles this build can run: every role has its actor in this build (a role without one would
/// be left out here).
pub const AVAILABLE_ROLES: [Role; 9] = Role::ALL;

/// Extra time after the drain deadline for actors to answer what they cancelled.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// After the actors: how long the last heartbeat ("leaving") and the flush may take. NATS may be
/// down; the drain bound must hold anyway.
const FAREWELL_TIMEOUT: Duration = Duration::from_secs(2);

/// A node told to stop exits by `drain timeout + STOP_GRACE + EXIT_MARGIN`, whatever the bus,
/// the actors or a blocked thread do: a watchdog thread outside the runtime makes sure of it.
const EXIT_MARGIN: Duration = Duration::from_secs(3);

/// Resolves the `--roles` list: `all` means every role this build has; naming a role this
/// build lacks is an error.
pub fn resolve_roles(list: &str) -> Result<Vec<Role>, String> {
    let asked_all = list.split(',').any(|s| s.trim() == "all");
    let roles = Role::parse_list(list)?;
    let mut out = Vec::new();
    for role in roles {
        if AVAILABLE_ROLES.contains(&role) {
            out.push(role);
        } else if !asked_all {
            return Err(format!(
                "role {role} is not available in this build of toolmesh {VERSION} (available: {})",
                AVAILABLE_ROLES.map(|r| r.as_str()).join(", ")
            ));
        }
    }
    Ok(out)
}

pub(crate) fn node_id(config: &NodeConfig) -> anyhow::Result<NodeId> {
    match &config.node_id {
        Some(id) => NodeId::parse(id.as_str()).context("TOOLMESH_NODE_ID"),
        None => {
            let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
            Ok(NodeId::generate(host.trim()))
        }
    }
}

struct NodeState {
    id: NodeId,
    roles: Vec<Role>,
    started: Instant,
    in_flight: InFlight,
    /// Set once the sandbox actor runs on this node.
    sandbox: std::sync::OnceLock<toolmesh_sandbox::CapacityProbe>,
    /// Set once the bridge runs on this node.
    bridge: std::sync::OnceLock<toolmesh_bridge::BridgeProbe>,
    /// The policy of a gateway node, for its `policy_revision`.
    policy: Option<LivePolicy>,
}

impl NodeState {
    fn status(&self) -> NodeStatus {
        NodeStatus {
            node_id: self.id.clone(),
            roles: self.roles.clone(),
            version: VERSION.to_owned(),
            uptime_s: self.started.elapsed().as_secs(),
            in_flight: self.in_flight.get(),
            sandbox: self.sandbox.get().map(|probe| probe.capacity()),
            bridge: self.bridge.get().map(|probe| probe.status()),
            policy_revision: self
                .policy
                .as_ref()
                .and_then(|p| p.current().revision().map(str::to_owned)),
        }
    }

    fn heartbeat(&self, leaving: bool) -> Bytes {
        let beat = Heartbeat {
            status: self.status(),
            leaving,
        };
        Bytes::from(serde_json::to_vec(&beat).expect("heartbeat serializes"))
    }
}

/// Reads the policy file again on every `SIGHUP`, for each role of the node that keeps it (the
/// gateway's rules, the approval notifier's webhooks): a good file replaces that role's policy,
/// a bad one is refused (logged, naming the rule and field) and the old one stays. A node with
/// neither role says so and goes on.
async fn reload_on_hangup(
    mut hangups: tokio::signal::unix::Signal,
    policies: Vec<(Role, LivePolicy)>,
) {
    while hangups.recv().await.is_some() {
        if policies.is_empty() {
            tracing::info!(
                "SIGHUP: this node runs no gateway or approval, so it has no policy to read again"
            );
            continue;
        }
        for (role, policy) in &policies {
            match policy.reload() {
                Ok(Some(now)) => tracing::info!(
                    role = %role,
                    policy_revision = now.revision(),
                    rules = now.rules().len(),
                    webhooks = now.notify().len(),
                    "the policy file was read again and applies from now on"
                ),
                Ok(None) => {
                    tracing::info!(role = %role, "SIGHUP: no policy file (TOOLMESH_POLICY_FILE) to read again")
                }
                Err(e) => {
                    tracing::error!(role = %role, error = %e, "the policy file was not taken; the policy read before stays")
                }
            }
        }
    }
}

/// Runs a node until `shutdown` resolves, then drains and returns. Must run inside an actix
/// `System` (the actors live on its arbiter).
pub async fn run(
    config: NodeConfig,
    roles: Vec<Role>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Each actor's config, read by its own crate before anything starts.
    let config = Arc::new(config);
    let env = RawEnv::from_process();
    let actors = crate::configs::ActorConfigs::from_env(&env, &config)?;
    // Watched from the first instant, so that the signal handlers it installs
    // (`host::shutdown_signal`) are in place before the actors start: a SIGTERM during the start
    // (a sandbox worker making its warm sandboxes) drains the node once it is up, instead of
    // killing it (or, as PID 1 in a container, being ignored) and leaving what it made. The
    // drain bound's watchdog starts with the request, so a start that cannot finish (no NATS)
    // still ends by the bound.
    let stop_requested = CancellationToken::new();
    let exit_bound = config.drain_timeout + STOP_GRACE + FAREWELL_TIMEOUT + EXIT_MARGIN;
    tokio::spawn({
        let stop_requested = stop_requested.clone();
        async move {
            shutdown.await;
            exit_by(exit_bound);
            stop_requested.cancel();
        }
    });
    // Let the watcher run once now, so the handlers exist before anything else happens.
    tokio::task::yield_now().await;
    let id = node_id(&config)?;
    let registry = Arc::new(crate::tools::registry().context("the built-in tools")?);
    // A `[tools.<name>]` entry that names no built-in tool is for a provider tool of that
    // name (the policy file checked that it is a tool name): kept, and said once here, since
    // a misspelt built-in name would otherwise change nothing unnoticed.
    for tool in actors.gateway.policy.current().overridden_tools() {
        if registry.get(tool).is_none() {
            tracing::info!(tool, "the policy file sets a risk level for a tool that is not built in; it applies to a provider tool of that name");
        }
    }
    // Installed before the actors start, on every node: SIGHUP's default would end the
    // process (a `kill -HUP` sent to every node of a cluster must stop none).
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("listening for SIGHUP (policy reload)")?;
    // The approval notifier's webhooks (the policy file's `[[notify]]`), read before anything
    // connects.
    let mut notify_config = if roles.contains(&Role::Approval) {
        Some(toolmesh_approval::NotifyConfig::from_env(&env)?)
    } else {
        None
    };
    let mut policies = Vec::new();
    if roles.contains(&Role::Gateway) {
        policies.push((Role::Gateway, actors.gateway.policy.clone()));
    }
    if let Some(notify) = &notify_config {
        policies.push((Role::Approval, notify.policy.clone()));
    }
    // The bridge's MCP servers file, validated before anything connects: a bad file stops the
    // node with the server and field it names.
    let mut bridge_config = if roles.contains(&Role::Bridge) {
        Some(toolmesh_bridge::BridgeConfig::from_env(&env)?)
    } else {
        None
    };
    // The MCP front's settings and tokens file, read before anything connects.
    let mut mcp_config = if roles.contains(&Role::Mcp) {
        Some(toolmesh_mcp::McpConfig::from_env(&env)?)
    } else {
        None
    };
    // The console's listen address and tokens file, read before anything connects.
    let mut console_config = if roles.contains(&Role::Console) {
        Some(toolmesh_console::ConsoleConfig::from_env(&env)?)
    } else {
        None
    };
    if let Some(console) = &console_config {
        policies.push((Role::Console, console.policy.clone()));
    }
    tokio::spawn(reload_on_hangup(hangups, policies));
    // The sandbox templates, validated before anything connects the same way.
    let templates = if roles.contains(&Role::Sandbox) {
        Some(toolmesh_sandbox::templates::Templates::from_env(
            &env,
            &actors.sandbox,
        )?)
    } else {
        None
    };
    // The metrics listener, bound before anything connects: a bad or taken address stops the
    // node naming the variable.
    let metrics = Metrics::new();
    let node_stop = CancellationToken::new();
    let metrics_config = MetricsConfig::from_env(&env)?;
    if let Some(listen) = metrics_config.listen {
        crate::metrics::serve(
            listen,
            metrics_config.http,
            metrics.clone(),
            node_stop.clone(),
        )
        .await
        .with_context(|| format!("cannot serve metrics on {listen} ({METRICS_LISTEN_VAR})"))?;
    }
    let audit_config = toolmesh_kernel::audit::AuditConfig::from_env(&env)?;
    let (nats, refusals) = connect_node(&config.nats_url, &format!("toolmesh-{id}"))
        .await
        .with_context(|| format!("cannot connect to NATS at {}", config.nats_url))?;
    // RunEvents kept in `TOOLMESH_EVENTS` where the server has JetStream; said once otherwise.
    match toolmesh_kernel::streams::ensure_events(&nats, &config.events).await? {
        toolmesh_kernel::streams::Durability::Durable { stream } => {
            tracing::info!(stream, "RunEvents are kept in a JetStream stream");
        }
        toolmesh_kernel::streams::Durability::Live { reason } => {
            tracing::warn!(
                reason,
                "RunEvents are live only: the NATS server has no JetStream"
            );
        }
    }
    let state = Arc::new(NodeState {
        id: id.clone(),
        roles: roles.clone(),
        started: Instant::now(),
        in_flight: InFlight::default(),
        sandbox: std::sync::OnceLock::new(),
        bridge: std::sync::OnceLock::new(),
        policy: roles
            .contains(&Role::Gateway)
            .then(|| actors.gateway.policy.clone()),
    });
    let cluster = Arc::new(ClusterView::new());
    let lifecycle = Lifecycle::new();

    // The audit trail's stream, made or updated once per node before its actors start
    // (off, and said once, without JetStream).
    let audit = if roles.contains(&Role::Gateway) || roles.contains(&Role::Approval) {
        toolmesh_kernel::audit::AuditTrail::start(&nats, id.as_str(), &audit_config).await
    } else {
        toolmesh_kernel::audit::AuditTrail::off(id.as_str(), "no gateway or approval role")
    };

    // Heartbeats first, so the cluster view fills while the actors start.
    let beats = nats.subscribe(internal::HEARTBEAT).await?;
    tokio::spawn(listen_heartbeats(
        nats.clone(),
        beats,
        state.clone(),
        cluster.clone(),
    ));

    let mut handles = Vec::new();
    for role in &roles {
        // Each role counts its own work (`toolmesh_in_flight{role}`) into the node's; the MCP
        // front holds none of its own (its calls are the gateway's).
        let in_flight = state.in_flight.part();
        if *role != Role::Mcp {
            metrics.on_scrape({
                let (metrics, in_flight, role) = (metrics.clone(), in_flight.clone(), *role);
                move || {
                    metrics.set_in_flight(role, in_flight.get());
                    Box::pin(std::future::ready(()))
                }
            });
        }
        let handle = match role {
            Role::Gateway => {
                toolmesh_gateway::spawn(
                    nats.clone(),
                    actors.gateway.clone(),
                    registry.clone(),
                    cluster.clone(),
                    lifecycle.clone(),
                    toolmesh_gateway::Accounting {
                        in_flight: in_flight.clone(),
                        metrics: metrics.clone(),
                        audit: audit.clone(),
                        refusals: refusals.clone(),
                    },
                )
                .await?
            }
            Role::Approval => {
                let notifier = toolmesh_approval::spawn_notifier(
                    nats.clone(),
                    notify_config.take().expect("read above"),
                    lifecycle.clone(),
                )
                .await?;
                handles.push(notifier);
                toolmesh_approval::spawn(
                    nats.clone(),
                    toolmesh_approval::ApprovalSettings {
                        redis: config.redis.clone(),
                        config: actors.approval.clone(),
                        metrics: metrics.clone(),
                        audit: audit.clone(),
                        replies: config.reply_prefixes.clone(),
                    },
                    lifecycle.clone(),
                    in_flight.clone(),
                )
                .await?
            }
            Role::Workspace => {
                toolmesh_workspace::spawn(
                    nats.clone(),
                    toolmesh_workspace::WorkspaceSettings {
                        data_dir: config.data_dir.clone(),
                        redis: config.redis.clone(),
                        budget_chars: config.result_budget_chars,
                    },
                    lifecycle.clone(),
                    in_flight.clone(),
                )
                .await?
            }
            Role::Skills => {
                toolmesh_skills::spawn(
                    nats.clone(),
                    toolmesh_skills::SkillsSettings {
                        node: id.clone(),
                        data_dir: config.data_dir.clone(),
                        config: actors.skills.clone(),
                        budget_chars: config.result_budget_chars,
                    },
                    lifecycle.clone(),
                    in_flight.clone(),
                )
                .await?
            }
            Role::Sandbox => {
                let (handle, probe) = toolmesh_sandbox::spawn(
                    nats.clone(),
                    toolmesh_sandbox::SandboxSettings {
                        node: id.clone(),
                        config: actors.sandbox.clone(),
                        redis: config.redis.clone(),
                        budget_chars: config.result_budget_chars,
                        templates: templates.clone().unwrap_or_else(|| {
                            toolmesh_sandbox::templates::Templates::only_default(&actors.sandbox)
                        }),
                        metrics: metrics.clone(),
                    },
                    cluster.clone(),
                    lifecycle.clone(),
                    in_flight.clone(),
                )
                .await?;
                let _ = state.sandbox.set(probe);
                // `toolmesh_sandboxes{template,state}` from the pool, on each scrape.
                metrics.on_scrape({
                    let (metrics, state) = (metrics.clone(), state.clone());
                    move || {
                        if let Some(capacity) = state.sandbox.get().map(|p| p.capacity()) {
                            gauge_sandboxes(&metrics, &capacity);
                        }
                        Box::pin(std::future::ready(()))
                    }
                });
                handle
            }
            Role::Bridge => {
                let (handle, probe) = toolmesh_bridge::spawn(
                    nats.clone(),
                    toolmesh_bridge::BridgeSettings {
                        node: id.clone(),
                        config: bridge_config.take().unwrap_or_default(),
                    },
                    lifecycle.clone(),
                    in_flight.clone(),
                )
                .await?;
                let _ = state.bridge.set(probe);
                handle
            }
            Role::Mcp => {
                let config = mcp_config.take().expect("read above");
                let listen = config.listen;
                let (handle, _addr) = toolmesh_mcp::spawn(nats.clone(), config, lifecycle.clone())
                    .await
                    .with_context(|| {
                        format!("cannot serve MCP on {listen} (TOOLMESH_MCP_LISTEN)")
                    })?;
                handle
            }
            Role::Console => {
                let config = console_config.take().expect("read above");
                let listen = config.listen;
                let (handle, _addr) = toolmesh_console::spawn(
                    nats.clone(),
                    config,
                    registry.clone(),
                    lifecycle.clone(),
                )
                .await
                .with_context(|| {
                    format!(
                        "cannot serve the approvals console on {listen} (TOOLMESH_CONSOLE_LISTEN)"
                    )
                })?;
                handle
            }
            Role::Web => {
                toolmesh_web::spawn(
                    nats.clone(),
                    toolmesh_web::WebSettings {
                        config: actors.web.clone(),
                        budget_chars: config.result_budget_chars,
                        metrics: metrics.clone(),
                    },
                    lifecycle.clone(),
                    in_flight.clone(),
                )
                .await?
            }
        };
        tracing::info!(role = %role, "actor started");
        handles.push(handle);
    }

    // NATS micro-service discovery ($SRV PING/INFO/STATS) for this node's actors.
    let status_now = {
        let state = state.clone();
        move || state.status()
    };
    let micro_task = crate::micro::start(&nats, &id, &roles, status_now, node_stop.clone()).await?;
    // Readiness: status subjects last.
    let cluster_status = nats
        .queue_subscribe(public::STATUS, queue::STATUS.to_owned())
        .await?;
    let own_status = nats.subscribe(public::node_status(&id)).await?;
    toolmesh_kernel::host::confirm_subscriptions(&nats).await?;
    cluster.record(Heartbeat {
        status: state.status(),
        leaving: false,
    });
    let _ = nats
        .publish(internal::HEARTBEAT, state.heartbeat(false))
        .await;
    let status_task = tokio::spawn(answer_status(
        nats.clone(),
        (cluster_status, own_status),
        config.reply_prefixes.clone(),
        state.clone(),
        cluster.clone(),
        node_stop.clone(),
    ));
    let beat_task = tokio::spawn(send_heartbeats(
        nats.clone(),
        state.clone(),
        node_stop.clone(),
    ));
    let role_names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
    tracing::info!(node_id = %id, roles = %role_names.join(","), "node ready");

    stop_requested.cancelled().await;
    tracing::info!(timeout_s = config.drain_timeout.as_secs(), "draining");
    lifecycle.drain.cancel();
    let stop = lifecycle.stop.clone();
    let drain_timeout = config.drain_timeout;
    tokio::spawn(async move {
        tokio::time::sleep(drain_timeout).await;
        tracing::warn!("drain timeout reached; cancelling what is still running");
        stop.cancel();
    });
    let all_stopped = futures::future::join_all(handles.into_iter().map(ActorHandle::stopped));
    if tokio::time::timeout(drain_timeout + STOP_GRACE, all_stopped)
        .await
        .is_err()
    {
        tracing::error!("actors did not stop within the drain timeout and grace; exiting anyway");
    }
    node_stop.cancel();
    // Each of these may wait on NATS (a publish queued behind a lost connection, the flush's
    // PONG): bounded, so an outage cannot hold the exit.
    let farewell = async {
        let _ = beat_task.await;
        let _ = status_task.await;
        let _ = micro_task.await;
        let _ = nats
            .publish(internal::HEARTBEAT, state.heartbeat(true))
            .await;
        let _ = nats.flush().await;
    };
    if tokio::time::timeout(FAREWELL_TIMEOUT, farewell)
        .await
        .is_err()
    {
        tracing::warn!("NATS did not take the leaving heartbeat in time; the cluster drops this node after its heartbeat expiry");
    }
    tracing::info!("node stopped");
    Ok(())
}

/// Mirrors a worker's pool into `toolmesh_sandboxes` and `toolmesh_sandbox_capacity`.
fn gauge_sandboxes(metrics: &Metrics, capacity: &wire::SandboxCapacity) {
    metrics.set_sandbox_capacity(capacity.capacity);
    for template in &capacity.templates {
        metrics.set_sandboxes(&template.name, SandboxState::Warm, template.warm);
        metrics.set_sandboxes(&template.name, SandboxState::InUse, template.in_use);
    }
}

/// The drain bound is a promise: a thread of its own (not a task, which a blocked runtime
/// would never poll) ends the process once `within` has passed since the drain began, with
/// the exit code a drain has (0). Normally the node is gone long before.
fn exit_by(within: Duration) {
    let spawned = std::thread::Builder::new()
        .name("toolmesh-exit-watchdog".into())
        .spawn(move || {
            std::thread::sleep(within);
            tracing::error!(
                after_s = within.as_secs(),
                "the node did not finish stopping within its drain bound; exiting now"
            );
            std::process::exit(0);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no watchdog thread for the drain bound");
    }
}

async fn listen_heartbeats(
    nats: Client,
    mut beats: async_nats::Subscriber,
    state: Arc<NodeState>,
    cluster: Arc<ClusterView>,
) {
    while let Some(msg) = beats.next().await {
        let Ok(beat) = serde_json::from_slice::<Heartbeat>(&msg.payload) else {
            tracing::debug!("ignoring a malformed heartbeat");
            continue;
        };
        let from_other = beat.status.node_id != state.id;
        if cluster.record(beat) && from_other {
            // A newcomer: tell it about us now rather than in up to 2 s.
            let _ = nats
                .publish(internal::HEARTBEAT, state.heartbeat(false))
                .await;
        }
    }
}

async fn send_heartbeats(nats: Client, state: Arc<NodeState>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                if let Err(e) = nats.publish(internal::HEARTBEAT, state.heartbeat(false)).await {
                    tracing::warn!(error = %e, "could not publish a heartbeat");
                }
            }
        }
    }
}

async fn answer_status(
    nats: Client,
    (cluster_status, own_status): (async_nats::Subscriber, async_nats::Subscriber),
    replies: toolmesh_kernel::replies::ReplyPrefixes,
    state: Arc<NodeState>,
    cluster: Arc<ClusterView>,
    stop: CancellationToken,
) {
    // Status is public: a request asking for a reply anywhere but an inbox is dropped unread.
    let mut cluster_status = std::pin::pin!(replies.screen(cluster_status));
    let mut own_status = std::pin::pin!(replies.screen(own_status));
    loop {
        let (msg, whole_cluster) = tokio::select! {
            _ = stop.cancelled() => return,
            Some(msg) = cluster_status.next() => (msg, true),
            Some(msg) = own_status.next() => (msg, false),
            else => return,
        };
        let body = if whole_cluster {
            // Our own entry is always fresh, even between heartbeats.
            cluster.record(Heartbeat {
                status: state.status(),
                leaving: false,
            });
            let nodes = serde_json::to_value(cluster.live()).unwrap_or_default();
            let mut fields = serde_json::Map::new();
            fields.insert("nodes".into(), nodes);
            // A cluster too big for one reply lists the nodes that fit, `truncated: true`.
            let limit = budget::listing_limit(nats.max_payload());
            budget::fit_list(&mut fields, "nodes", limit);
            wire::ok_body(fields)
        } else {
            match serde_json::to_value(state.status()) {
                Ok(serde_json::Value::Object(fields)) => wire::ok_body(fields),
                _ => continue,
            }
        };
        respond(&nats, msg.reply.as_ref(), body).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_means_every_available_role() {
        assert_eq!(resolve_roles("all").unwrap(), AVAILABLE_ROLES.to_vec());
        assert_eq!(resolve_roles("gateway").unwrap(), vec![Role::Gateway]);
        if let Some(missing) = Role::ALL.into_iter().find(|r| !AVAILABLE_ROLES.contains(r)) {
            let err = resolve_roles(&format!("gateway,{missing}")).unwrap_err();
            assert!(err.contains(missing.as_str()), "{err}");
        }
        assert!(resolve_roles("nope").is_err());
    }
}
