//! The tools the gateway answers itself: `component_status`, `tool_search` and the `list` and
//! `describe` actions of `tool_dispatcher`. None of them touches Redis or another actor.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use toolmesh_kernel::cluster::ClusterView;
use toolmesh_kernel::policy::{ApprovalMode, Policy};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{RegisteredTool, ToolGroup, ToolRegistry};

use crate::config::GatewayConfig;
use crate::providers::catalog::ProviderStatus;
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::{ErrorCode, Role, ToolError};

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!("built from json!({{…}})"),
    }
}

fn names_of(registry: &ToolRegistry, group: ToolGroup) -> Vec<&str> {
    registry
        .iter()
        .filter(|t| t.spec.group == group)
        .map(|t| t.spec.name.as_ref())
        .collect()
}

/// How old a rendered `component_status` may be before it is built again from the cluster view.
pub const STATUS_MAX_AGE: Duration = Duration::from_millis(500);
/// Stands for the workspace root in a cached rendering; replaced per call.
const ROOT_SENTINEL: &str = "\u{1}workspace-root\u{1}";

/// `component_status` renderings per approval mode, rebuilt at most every [`STATUS_MAX_AGE`]:
/// building the status is many small allocations, and it is the same for every call but for
/// the session's workspace root and the account's mode.
#[derive(Debug, Default)]
pub struct StatusCache {
    renderings: Mutex<HashMap<ApprovalMode, Rendering>>,
}

#[derive(Debug)]
struct Rendering {
    built: Instant,
    /// Serialized members up to the workspace root's value, and after it.
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl StatusCache {
    /// The reply members (`"summary":…,…`) of `component_status` for this call.
    pub fn render(
        &self,
        registry: &ToolRegistry,
        providers: &[ProviderStatus],
        cluster: &ClusterView,
        config: &GatewayConfig,
        ctx: &InvocationContext,
    ) -> Vec<u8> {
        let mode = config.policy.current().mode_for(&ctx.account);
        let root = workspace_root(config, ctx);
        let mut renderings = self.renderings.lock().expect("status cache lock");
        let fresh = renderings
            .get(&mode)
            .is_some_and(|r| r.built.elapsed() < STATUS_MAX_AGE);
        if !fresh {
            let fields = component_status(
                registry,
                providers,
                cluster,
                config,
                mode,
                Some(ROOT_SENTINEL.into()),
            );
            let bytes = serde_json::to_vec(&fields).expect("status serializes");
            let members = &bytes[1..bytes.len() - 1];
            let sentinel = serde_json::to_vec(ROOT_SENTINEL).expect("str serializes");
            let at = members
                .windows(sentinel.len())
                .position(|w| w == sentinel.as_slice())
                .expect("the sentinel is in the rendering");
            renderings.insert(
                mode,
                Rendering {
                    built: Instant::now(),
                    head: members[..at].to_vec(),
                    tail: members[at + sentinel.len()..].to_vec(),
                },
            );
        }
        let rendering = &renderings[&mode];
        let mut out = Vec::with_capacity(rendering.head.len() + rendering.tail.len() + 128);
        out.extend_from_slice(&rendering.head);
        serde_json::to_writer(&mut out, &root).expect("root serializes");
        out.extend_from_slice(&rendering.tail);
        out
    }
}

fn workspace_root(config: &GatewayConfig, ctx: &InvocationContext) -> Option<String> {
    ctx.session_id.as_ref().map(|s| {
        config
            .node
            .data_dir
            .join("accounts")
            .join(ctx.account.as_str())
            .join("sessions")
            .join(s.as_str())
            .join("workspace")
            .display()
            .to_string()
    })
}

/// `component_status`: what is bound and running in the cluster right now, in the seed's
/// shape, from this gateway's cluster view (heartbeats) and configuration.
pub fn component_status(
    registry: &ToolRegistry,
    providers: &[ProviderStatus],
    cluster: &ClusterView,
    config: &GatewayConfig,
    mode: ApprovalMode,
    workspace_root: Option<String>,
) -> Map<String, Value> {
    let live = cluster.live();
    let policy = config.policy.current();
    let mut roles: BTreeMap<&'static str, usize> = BTreeMap::new();
    for node in &live {
        for role in &node.roles {
            *roles.entry(role.as_str()).or_default() += 1;
        }
    }
    let running = |role: Role| roles.get(role.as_str()).copied().unwrap_or(0) > 0;
    let workers: Vec<_> = live.iter().filter_map(|n| n.sandbox.as_ref()).collect();
    let sandbox_backend = workers
        .first()
        .map(|s| s.backend.clone())
        .unwrap_or_else(|| config.reported.sandbox_backend.clone());
    let sandbox_enabled = running(Role::Sandbox);
    let enabled = |on: bool| if on { "enabled" } else { "disabled" };
    let reported = &config.reported;
    object(json!({
        "summary": {
            // toolmesh binds no model, knowledge base or memory: the agent runtime does.
            "model": null,
            "knowledge_base_bound": false,
            "long_term_memory_bound": false,
            "skill_space_bound": !reported.skill_space_ids.is_empty() && reported.skill_service_configured,
            "isolated_execution": enabled(sandbox_enabled),
            "sandbox_direct_tools": enabled(sandbox_enabled),
        },
        "skill_space": {
            "space_ids": reported.skill_space_ids,
            "service_configured": reported.skill_service_configured,
            "enabled": running(Role::Skills),
            "tools": names_of(registry, ToolGroup::Skills),
        },
        "skill_runtime": {
            "backend": sandbox_backend,
            "enabled": reported.skill_runner_configured && running(Role::Skills) && sandbox_enabled,
            "runner_configured": reported.skill_runner_configured,
            "template_bound": sandbox_enabled,
        },
        "sandbox": {
            "backend": sandbox_backend,
            "enabled": sandbox_enabled,
            "image": reported.sandbox_image,
            "workers": workers.len(),
            "capacity": workers.iter().map(|s| s.capacity).sum::<u64>(),
            "in_use": workers.iter().map(|s| s.in_use).sum::<u64>(),
            "templates": templates_of(&workers),
            "tools": names_of(registry, ToolGroup::Sandbox),
        },
        "workspace": {
            "root": workspace_root,
            "enabled": running(Role::Workspace),
            "tools": names_of(registry, ToolGroup::Workspace),
        },
        "web": {
            "enabled": running(Role::Web),
            "search_provider": reported.web_search_provider,
            "tools": names_of(registry, ToolGroup::Web),
        },
        "approval": {
            "mode": mode,
            "in_band": reported.approval_in_band,
            "enabled": running(Role::Approval),
            // PROTOCOL.md "Approval policy": the policy file this gateway applies.
            "policy_revision": policy.revision(),
            "rules": policy.rules().len(),
        },
        "cluster": {
            "nodes": live.len(),
            "roles": roles,
        },
        // Tool providers this gateway discovered (PROTOCOL.md "Tool providers").
        "providers": providers,
        // Whether RunEvents are replayable (PROTOCOL.md "Durable events, audit, metrics").
        "events": config.node.events.status(),
    }))
}

/// The sandbox templates of the live workers, by name (the first worker's settings of each),
/// with their warm sandboxes and sessions summed and how many workers have each.
fn templates_of(workers: &[&toolmesh_kernel::wire::SandboxCapacity]) -> Vec<Value> {
    let mut by_name: BTreeMap<&str, (Value, u64, u64, u64)> = BTreeMap::new();
    for template in workers.iter().flat_map(|w| &w.templates) {
        let entry = by_name.entry(template.name.as_str()).or_insert_with(|| {
            (
                json!({
                    "name": template.name,
                    "image": template.image,
                    "runtime": template.runtime,
                    "network": template.network,
                    "memory_mb": template.memory_mb,
                    "cpus": template.cpus,
                    "pids": template.pids,
                }),
                0,
                0,
                0,
            )
        });
        entry.1 += template.warm;
        entry.2 += template.in_use;
        entry.3 += 1;
    }
    by_name
        .into_values()
        .map(|(mut value, warm, in_use, workers)| {
            value["warm"] = warm.into();
            value["in_use"] = in_use.into();
            value["workers"] = workers.into();
            value
        })
        .collect()
}

/// Whether some live node runs the actor of this tool; a provider tool is in the registry
/// only while its provider answers.
fn is_served(tool: &RegisteredTool, cluster_roles: &BTreeSet<Role>) -> bool {
    tool.spec
        .runs
        .role()
        .is_none_or(|role| cluster_roles.contains(&role))
}

pub fn live_roles(cluster: &ClusterView) -> BTreeSet<Role> {
    cluster
        .live()
        .into_iter()
        .flat_map(|n| n.roles.into_iter())
        .collect()
}

/// What [`tool_search`] looks for; the tool's file turns its arguments into it.
#[derive(Debug)]
pub struct Search {
    pub query: String,
    pub profile: Profile,
    pub max_results: u64,
    pub include_disabled: bool,
}

/// `tool_search`: scored matches over names, descriptions and groups; runs nothing.
pub fn tool_search(
    registry: &ToolRegistry,
    policy: &Policy,
    cluster: &ClusterView,
    args: Search,
) -> Map<String, Value> {
    let terms: Vec<String> = args
        .query
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    let query_as_name = args.query.trim().to_lowercase().replace([' ', '-'], "_");
    let candidates = registry.profile(args.profile);
    let roles = live_roles(cluster);
    let mut hits: Vec<(f64, &RegisteredTool, bool)> = registry
        .iter()
        .filter(|t| candidates.contains(t.spec.name.as_ref()))
        .filter_map(|tool| {
            let served = is_served(tool, &roles);
            if !served && !args.include_disabled {
                return None;
            }
            let score = score(tool, &terms, &query_as_name);
            (score > 0.0).then_some((score, tool, served))
        })
        .collect();
    hits.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.spec.name.cmp(&b.1.spec.name)));
    hits.truncate(args.max_results as usize);
    let results: Vec<Value> = hits
        .iter()
        .map(|(score, tool, served)| {
            json!({
                "name": tool.spec.name,
                "score": (score * 100.0).round() / 100.0,
                "description": tool.spec.description,
                "group": tool.spec.group,
                "risk_level": policy.risk_for(&tool.spec),
                "boundary": tool.spec.boundary,
                "execution": tool.spec.execution(),
                "enabled": served,
            })
        })
        .collect();
    let deferred: Vec<&str> = hits.iter().map(|(_, t, _)| t.spec.name.as_ref()).collect();
    object(json!({
        "query": args.query,
        "profile": args.profile,
        "results": results,
        "deferred_tool_names": deferred,
    }))
}

/// Name words weigh most, then the group, then description words.
fn score(tool: &RegisteredTool, terms: &[String], query_as_name: &str) -> f64 {
    let name = tool.spec.name.as_ref();
    let name_words: Vec<&str> = name.split('_').collect();
    let description = tool.spec.description.to_lowercase();
    let description_words: BTreeSet<&str> = description
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let mut score = if name == query_as_name { 5.0 } else { 0.0 };
    for term in terms {
        let term = term.as_str();
        let stem = term.trim_end_matches('s');
        if name_words
            .iter()
            .any(|w| *w == term || (stem.len() >= 3 && w.trim_end_matches('s') == stem))
        {
            score += 3.0;
        } else if term.len() >= 3 && name.contains(term) {
            score += 2.0;
        }
        if tool.spec.group.as_str() == term {
            score += 1.5;
        }
        if description_words.contains(term)
            || (stem.len() >= 3
                && description_words
                    .iter()
                    .any(|w| w.trim_end_matches('s') == stem))
        {
            score += 1.0;
        }
    }
    score
}

/// The tool set a dispatcher call chooses from.
pub fn dispatcher_selection(
    registry: &ToolRegistry,
    include: Option<Vec<String>>,
    profile: Profile,
) -> Result<BTreeSet<&str>, ToolError> {
    match include {
        Some(items) if !items.is_empty() => registry.select(&items),
        _ => Ok(registry.profile(profile)),
    }
}

/// `tool_dispatcher` `list`.
pub fn dispatcher_list(
    registry: &ToolRegistry,
    policy: &Policy,
    selection: &BTreeSet<&str>,
) -> Map<String, Value> {
    let tools: Vec<Value> = registry
        .iter()
        .filter(|t| selection.contains(t.spec.name.as_ref()))
        .map(|t| {
            json!({
                "name": t.spec.name,
                "description": t.spec.description,
                "group": t.spec.group,
                "risk_level": policy.risk_for(&t.spec),
            })
        })
        .collect();
    object(json!({ "tools": tools }))
}

/// `tool_dispatcher` `describe`.
pub fn dispatcher_describe(
    tool: &RegisteredTool,
    risk: toolmesh_kernel::wire::RiskLevel,
) -> Map<String, Value> {
    object(json!({
        "tool": {
            "name": tool.spec.name,
            "description": tool.spec.description,
            "group": tool.spec.group,
            "risk_level": risk,
            "side_effects": tool.spec.side_effects,
            "boundary": tool.spec.boundary,
            "execution": tool.spec.execution(),
            "needs_session": tool.spec.needs_session,
            "input_schema": tool.input_schema,
        }
    }))
}

/// `unknown_tool` with a hint where to look.
pub fn unknown_tool(name: &str) -> ToolError {
    let shown: String = name.chars().take(80).collect();
    ToolError::new(
        ErrorCode::UnknownTool,
        format!(
            "there is no tool named {shown:?}; tool_search or tool_dispatcher list shows the tools"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use toolmesh_kernel::tools::args::NoArgs;
    use toolmesh_kernel::tools::{schema_of, BuiltinGroup, RegisteredTool, ToolDef};
    use toolmesh_kernel::wire::{Heartbeat, NodeStatus};
    use toolmesh_kernel::NodeId;

    /// Stand-ins for some of the actors' tools (name, group, role, description): the gateway
    /// knows no actor, so its tests rank among these and its own tools.
    const NEIGHBOURS: [(&str, BuiltinGroup, Role, &str); 6] = [
        (
            "list_workspace_files",
            BuiltinGroup::Workspace,
            Role::Workspace,
            "List files and directories of the workspace with an optional glob, recursion and sorting.",
        ),
        (
            "read_workspace_file",
            BuiltinGroup::Workspace,
            Role::Workspace,
            "Read a UTF-8 text file of the workspace with line numbers, a line range and a character budget; allows later edits of the file.",
        ),
        (
            "write_workspace_file",
            BuiltinGroup::Workspace,
            Role::Workspace,
            "Write a whole file in the workspace, atomically, creating parent directories.",
        ),
        (
            "run_command",
            BuiltinGroup::Sandbox,
            Role::Sandbox,
            "Run a shell command in the session's sandbox, in the foreground or as a background task.",
        ),
        (
            "run_code",
            BuiltinGroup::Sandbox,
            Role::Sandbox,
            "Run a Python, JavaScript or Bash snippet in the session's sandbox.",
        ),
        (
            "web_fetch",
            BuiltinGroup::Web,
            Role::Web,
            "Fetch a public http(s) URL and return its text with scripts and styles removed.",
        ),
    ];

    fn registry() -> ToolRegistry {
        let neighbours = NEIGHBOURS.iter().map(|(name, group, role, description)| {
            let def = ToolDef::of(*group, *role).named(name);
            let spec = def.spec(description.to_string());
            Arc::new(RegisteredTool::from_schema(spec, schema_of::<NoArgs>()).unwrap())
        });
        ToolRegistry::new(crate::tools::LISTED.iter().copied())
            .unwrap()
            .with_tools(neighbours)
    }

    fn cluster(roles: &[Role]) -> ClusterView {
        let view = ClusterView::new();
        view.record(Heartbeat {
            status: NodeStatus::bare(NodeId::parse("n1").unwrap(), roles.to_vec()),
            leaving: false,
        });
        view
    }

    fn search(query: &str, include_disabled: bool, roles: &[Role]) -> Vec<String> {
        let reg = registry();
        let out = tool_search(
            &reg,
            &Policy::default(),
            &cluster(roles),
            Search {
                query: query.into(),
                profile: Profile::Default,
                max_results: 5,
                include_disabled,
            },
        );
        out["deferred_tool_names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn read_file_finds_read_workspace_file_first() {
        let names = search("read file", true, &[]);
        assert_eq!(
            names.first().map(String::as_str),
            Some("read_workspace_file")
        );
    }

    #[test]
    fn run_command_ranks_the_exact_name_first() {
        let names = search("run command", true, &[]);
        assert_eq!(names.first().map(String::as_str), Some("run_command"));
    }

    #[test]
    fn tools_without_a_running_actor_are_left_out_unless_asked() {
        assert!(search("read file", false, &[Role::Gateway]).is_empty());
        assert_eq!(
            search("read file", false, &[Role::Workspace])
                .first()
                .map(String::as_str),
            Some("read_workspace_file")
        );
    }

    #[test]
    fn nonsense_finds_nothing() {
        assert!(search("zzqqxx", true, &[]).is_empty());
    }
}
