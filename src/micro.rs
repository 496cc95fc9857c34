//! NATS micro-service discovery (`$SRV`): every node answers `PING`, `INFO` and `STATS` for
//! each actor it runs, and for itself, in the shapes of the NATS micro protocol (ADR-32,
//! `io.nats.micro.v1.*_response`), so `nats micro ls|info|stats` and any micro client see a
//! toolmesh cluster.
//!
//! The actors keep their own subscriptions (drainable, claimed, queue-grouped as
//! ARCHITECTURE.md describes); this module only describes them. Services are named
//! `toolmesh-<role>` (and `toolmesh-node` for the status subjects); a service's instance id is
//! the node id, so `$SRV.INFO.toolmesh-sandbox.<node_id>` asks one worker.
//!
//! STATS: the actors do not count requests per endpoint, so `num_requests`, `num_errors`,
//! `processing_time` and `average_processing_time` are 0 and `last_error` is empty; every
//! endpoint's `data` carries the node's live load instead (`in_flight`, and the `sandbox`
//! capacity of a worker), the same figures as `toolmesh.v1.status.<node_id>`.

use async_nats::{Client, Message};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use toolmesh_kernel::subjects::{internal, public, queue};
use toolmesh_kernel::wire::NodeStatus;
use toolmesh_kernel::{NodeId, Role, VERSION};

/// The `$SRV` subjects: the NATS micro protocol's namespace, not toolmesh's
/// (`$SRV.<VERB>`, `$SRV.<VERB>.<name>`, `$SRV.<VERB>.<name>.<id>`).
mod srv {
    pub const VERBS: [&str; 3] = ["PING", "INFO", "STATS"];

    /// Every verb at once for the node-wide form (`$SRV.*`), and per service and instance.
    pub fn subscriptions(names: &[String], id: &str) -> Vec<String> {
        let mut subjects = vec!["$SRV.*".to_owned()];
        for name in names {
            subjects.push(format!("$SRV.*.{name}"));
            subjects.push(format!("$SRV.*.{name}.{id}"));
        }
        subjects
    }

    /// `(verb, name, id)` of a `$SRV` subject.
    pub fn parse(subject: &str) -> Option<(&str, Option<&str>, Option<&str>)> {
        let mut tokens = subject.strip_prefix("$SRV.")?.split('.');
        let verb = tokens.next()?;
        VERBS.contains(&verb).then_some(())?;
        let name = tokens.next();
        let id = tokens.next();
        tokens.next().is_none().then_some((verb, name, id))
    }
}

/// One service of the node as `$SRV` describes it.
#[derive(Debug, Clone, PartialEq)]
struct Service {
    name: String,
    description: &'static str,
    endpoints: Vec<Endpoint>,
}

#[derive(Debug, Clone, PartialEq)]
struct Endpoint {
    name: &'static str,
    subject: String,
    /// Empty for a subject every instance hears by itself (no queue group).
    queue_group: String,
}

fn endpoint(name: &'static str, subject: impl Into<String>, queue_group: &str) -> Endpoint {
    Endpoint {
        name,
        subject: subject.into(),
        queue_group: queue_group.to_owned(),
    }
}

/// The services of a node with these roles: `toolmesh-node` (status), then one per role.
fn services(node: &NodeId, roles: &[Role]) -> Vec<Service> {
    let mut out = vec![Service {
        name: "toolmesh-node".into(),
        description: "a toolmesh node: cluster and node status (readiness)",
        endpoints: vec![
            endpoint("status", public::STATUS, queue::STATUS),
            endpoint("node_status", public::node_status(node), ""),
        ],
    }];
    for &role in roles {
        let group = queue::of(role);
        let (description, endpoints) = match role {
            Role::Gateway => (
                "toolmesh gateway: validates, gates and routes tool calls",
                vec![
                    endpoint("call", public::CALL_ANY, &group),
                    endpoint("cancel", public::CANCEL_ANY, &group),
                    endpoint("check", internal::GATEWAY_CHECK, &group),
                ],
            ),
            Role::Approval => (
                "toolmesh approvals: durable approval requests and decisions (Redis)",
                vec![
                    endpoint("approvals", public::APPROVALS_ANY, &group),
                    endpoint("gate", internal::APPROVAL_GATE, &group),
                    endpoint("release", internal::APPROVAL_RELEASE, &group),
                    endpoint("withdraw", internal::APPROVAL_WITHDRAW, &group),
                ],
            ),
            Role::Workspace => (
                "toolmesh workspace: confined file tools and the workspace sync",
                vec![
                    endpoint("run", internal::run(role), &group),
                    endpoint("manifest", internal::WORKSPACE_MANIFEST, &group),
                    endpoint("fetch", internal::WORKSPACE_FETCH, &group),
                    endpoint("apply", internal::WORKSPACE_APPLY, &group),
                ],
            ),
            Role::Sandbox => (
                "toolmesh sandbox worker: commands in per-session sandboxes",
                vec![
                    endpoint("run", internal::run(role), &group),
                    endpoint("run_on_node", internal::run_on(role, node), ""),
                ],
            ),
            Role::Skills => (
                "toolmesh skills: skill listing, loading and execution",
                vec![endpoint("run", internal::run(role), &group)],
            ),
            Role::Web => (
                "toolmesh web: web_fetch and web_search behind the egress policy",
                vec![endpoint("run", internal::run(role), &group)],
            ),
            // Its tools are services of their own (`mcp-<name>`, async-nats `service`); this
            // one describes the cancel subject every bridge hears.
            Role::Bridge => (
                "toolmesh bridge: MCP servers served as tool providers (services mcp-<name>)",
                vec![endpoint("cancel", public::PROVIDERS_CANCEL_ANY, "")],
            ),
            // A client of the mesh: it serves HTTP (TOOLMESH_MCP_LISTEN), no NATS subject.
            Role::Mcp => continue,
            // A client of the mesh too: it serves HTTP (TOOLMESH_CONSOLE_LISTEN).
            Role::Console => continue,
        };
        out.push(Service {
            name: format!("toolmesh-{role}"),
            description,
            endpoints,
        });
    }
    out
}

/// Subscribes the `$SRV` subjects of a node running `roles` and answers them until `stop`.
/// `status` gives the node's live status for STATS. Returns once the subscriptions are made
/// (confirm them with the node's other subscriptions).
pub async fn start(
    nats: &Client,
    node: &NodeId,
    roles: &[Role],
    status: impl Fn() -> NodeStatus + Send + 'static,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, async_nats::SubscribeError> {
    let services = services(node, roles);
    let names: Vec<String> = services.iter().map(|s| s.name.clone()).collect();
    let mut subscriptions = Vec::new();
    for subject in srv::subscriptions(&names, node.as_str()) {
        subscriptions.push(nats.subscribe(subject).await?);
    }
    let mut requests = futures::stream::select_all(subscriptions);
    let nats = nats.clone();
    let id = node.as_str().to_owned();
    let started = toolmesh_kernel::time::now_rfc3339();
    Ok(tokio::spawn(async move {
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                msg = requests.next() => match msg {
                    Some(msg) => msg,
                    None => return,
                },
            };
            for body in answers(&msg, &services, &id, &started, &status) {
                toolmesh_kernel::host::respond(&nats, msg.reply.as_ref(), body).await;
            }
        }
    }))
}

/// The replies to one `$SRV` request: one per service it names (all of them for `$SRV.<VERB>`).
fn answers(
    msg: &Message,
    services: &[Service],
    id: &str,
    started: &str,
    status: &impl Fn() -> NodeStatus,
) -> Vec<Vec<u8>> {
    let Some((verb, name, want_id)) = srv::parse(msg.subject.as_str()) else {
        return Vec::new();
    };
    if want_id.is_some_and(|want| want != id) {
        return Vec::new();
    }
    let load = (verb == "STATS").then(|| {
        let status = status();
        json!({ "in_flight": status.in_flight, "sandbox": status.sandbox })
    });
    services
        .iter()
        .filter(|s| name.is_none_or(|n| n == s.name))
        .map(|service| {
            let body = match verb {
                "PING" => ping(service, id),
                "INFO" => info(service, id),
                _ => stats(service, id, started, load.as_ref().unwrap_or(&Value::Null)),
            };
            serde_json::to_vec(&body).expect("a $SRV reply serializes")
        })
        .collect()
}

fn metadata(id: &str) -> Value {
    json!({ "node_id": id })
}

fn ping(service: &Service, id: &str) -> Value {
    json!({
        "type": "io.nats.micro.v1.ping_response",
        "name": service.name,
        "id": id,
        "version": VERSION,
        "metadata": metadata(id),
    })
}

fn info(service: &Service, id: &str) -> Value {
    let endpoints: Vec<Value> = service
        .endpoints
        .iter()
        .map(|e| {
            json!({
                "name": e.name,
                "subject": e.subject,
                "queue_group": e.queue_group,
                "metadata": {},
            })
        })
        .collect();
    json!({
        "type": "io.nats.micro.v1.info_response",
        "name": service.name,
        "id": id,
        "description": service.description,
        "version": VERSION,
        "metadata": metadata(id),
        "endpoints": endpoints,
    })
}

fn stats(service: &Service, id: &str, started: &str, load: &Value) -> Value {
    let endpoints: Vec<Value> = service
        .endpoints
        .iter()
        .map(|e| {
            json!({
                "name": e.name,
                "subject": e.subject,
                "queue_group": e.queue_group,
                "num_requests": 0,
                "num_errors": 0,
                "processing_time": 0,
                "average_processing_time": 0,
                "last_error": "",
                "data": load,
            })
        })
        .collect();
    json!({
        "type": "io.nats.micro.v1.stats_response",
        "name": service.name,
        "id": id,
        "version": VERSION,
        "started": started,
        "metadata": metadata(id),
        "endpoints": endpoints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srv_subjects_parse_into_verb_name_and_id() {
        let check = |subject: &str, expect: Option<(&str, Option<&str>, Option<&str>)>| {
            assert_eq!(srv::parse(subject), expect, "{subject}");
        };
        check("$SRV.PING", Some(("PING", None, None)));
        check(
            "$SRV.INFO.toolmesh-gateway",
            Some(("INFO", Some("toolmesh-gateway"), None)),
        );
        check(
            "$SRV.STATS.toolmesh-sandbox.n-1",
            Some(("STATS", Some("toolmesh-sandbox"), Some("n-1"))),
        );
        check("$SRV.FROB", None);
        check("$SRV.PING.a.b.c", None);
        check("toolmesh.v1.status", None);
    }

    #[test]
    fn every_role_is_a_service_with_its_subjects() {
        let node = NodeId::parse("n-1").unwrap();
        let all = services(&node, &Role::ALL);
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "toolmesh-node",
                "toolmesh-gateway",
                "toolmesh-approval",
                "toolmesh-workspace",
                "toolmesh-skills",
                "toolmesh-sandbox",
                "toolmesh-web",
                "toolmesh-bridge"
            ]
        );
        let sandbox = all.iter().find(|s| s.name == "toolmesh-sandbox").unwrap();
        assert_eq!(
            sandbox.endpoints[1],
            endpoint(
                "run_on_node",
                "toolmesh.internal.v1.node.n-1.run.sandbox",
                ""
            )
        );
        assert!(all.iter().all(|s| !s.endpoints.is_empty()));
    }
}
