//! The tool registry: name, group, description, JSON Schema, risk, side effects, boundary and
//! where each tool runs ([`Runs`]), plus the dispatcher's profiles. Built-in tools and
//! provider tools (PROTOCOL.md "Tool providers") are the same kind of value; only where they
//! run differs.

pub mod args;

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Serialize, Serializer};
use serde_json::{json, Value};

use crate::error::{ErrorCode, ToolError};
use crate::role::Role;
use crate::wire::{RiskLevel, SideEffect};
use args::*;

/// The groups of PROTOCOL.md's tool table, `external` and `mcp` for provider tools, and any
/// other group a provider names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ToolGroup {
    Platform,
    Dispatcher,
    Workspace,
    Skills,
    Sandbox,
    Web,
    /// A provider's tool that names no group.
    External,
    /// A tool an MCP server serves through the bridge.
    Mcp,
    /// A group a provider named that is none of the above.
    Named(Arc<str>),
}

impl ToolGroup {
    /// The groups with a fixed name.
    pub const ALL: [ToolGroup; 8] = [
        ToolGroup::Platform,
        ToolGroup::Dispatcher,
        ToolGroup::Workspace,
        ToolGroup::Skills,
        ToolGroup::Sandbox,
        ToolGroup::Web,
        ToolGroup::External,
        ToolGroup::Mcp,
    ];

    /// The groups of the built-in tools, which no provider may claim.
    pub const BUILTIN: [ToolGroup; 6] = [
        ToolGroup::Platform,
        ToolGroup::Dispatcher,
        ToolGroup::Workspace,
        ToolGroup::Skills,
        ToolGroup::Sandbox,
        ToolGroup::Web,
    ];

    pub fn as_str(&self) -> &str {
        match self {
            ToolGroup::Platform => "platform",
            ToolGroup::Dispatcher => "dispatcher",
            ToolGroup::Workspace => "workspace",
            ToolGroup::Skills => "skills",
            ToolGroup::Sandbox => "sandbox",
            ToolGroup::Web => "web",
            ToolGroup::External => "external",
            ToolGroup::Mcp => "mcp",
            ToolGroup::Named(name) => name,
        }
    }

    /// The group of that name: a fixed one when it is one, else [`ToolGroup::Named`].
    pub fn parse(name: &str) -> ToolGroup {
        ToolGroup::ALL
            .into_iter()
            .find(|g| g.as_str() == name)
            .unwrap_or_else(|| ToolGroup::Named(name.into()))
    }

    /// Whether built-in tools live in this group.
    pub fn is_builtin(&self) -> bool {
        ToolGroup::BUILTIN.contains(self)
    }
}

impl Serialize for ToolGroup {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Where a tool runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runs {
    /// Answered by the gateway itself.
    Gateway,
    /// Routed to the actor of a role over `toolmesh.internal.v1.run.<role>`.
    Actor(Role),
    /// Requested on a provider's endpoint subject (PROTOCOL.md "Tool providers").
    Provider(ProviderRoute),
}

/// Where a provider tool's calls go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderRoute {
    /// The micro service's name (`$SRV.INFO`'s `name`).
    pub service: Arc<str>,
    /// The endpoint's subject; every instance of the service shares it as a queue group.
    pub subject: Arc<str>,
}

impl Runs {
    /// What `tool_search` and `describe` say as `execution`.
    pub fn execution(&self) -> Cow<'static, str> {
        match self {
            Runs::Gateway => Cow::Borrowed("gateway"),
            Runs::Actor(Role::Workspace) => Cow::Borrowed("workspace_actor"),
            Runs::Actor(Role::Sandbox) => Cow::Borrowed("sandbox_worker"),
            Runs::Actor(Role::Skills) => Cow::Borrowed("skill_loader"),
            Runs::Actor(Role::Web) => Cow::Borrowed("web_actor"),
            Runs::Actor(Role::Approval) => Cow::Borrowed("approval_actor"),
            Runs::Actor(Role::Gateway) => Cow::Borrowed("gateway"),
            Runs::Provider(route) => Cow::Owned(format!("provider:{}", route.service)),
        }
    }

    /// The role a live node must run for the tool to be served; `None` for a provider tool
    /// (in the registry only while its provider is).
    pub fn role(&self) -> Option<Role> {
        match self {
            Runs::Gateway => Some(Role::Gateway),
            Runs::Actor(role) => Some(*role),
            Runs::Provider(_) => None,
        }
    }
}

pub const TOOL_DISPATCHER: &str = "tool_dispatcher";
pub const TOOL_DISPATCHER_ALIAS: &str = "agentengine_tool_dispatcher";
pub const TOOL_SEARCH: &str = "tool_search";
pub const COMPONENT_STATUS: &str = "component_status";

const BOUNDARY_GATEWAY: &str =
    "answered by the gateway from the cluster view and tool registry; reads no files and runs nothing";
const BOUNDARY_WORKSPACE_READ: &str =
    "reads only inside the workspace of this account and session; paths that resolve outside are refused";
const BOUNDARY_WORKSPACE_WRITE: &str =
    "writes only inside the workspace of this account and session, atomically; paths that resolve outside are refused";
const BOUNDARY_SANDBOX: &str =
    "executes only through the sandbox backend on a sandbox worker; never exposes the host shell";
const BOUNDARY_SKILLS_READ: &str =
    "reads skill manifests and the verified skill cache; runs nothing";
const BOUNDARY_SKILLS_RUN: &str =
    "runs the skill runner inside the session's sandbox with skills mounted read-only";
const BOUNDARY_WEB: &str =
    "egress to public http(s) addresses only; private, loopback and metadata addresses are refused";

/// The description of one tool, built in or from a provider.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: Cow<'static, str>,
    pub group: ToolGroup,
    pub description: Cow<'static, str>,
    /// The tool's own risk; `Policy::risk_for` applies the operator's overrides and floors.
    pub risk_level: RiskLevel,
    pub side_effects: Cow<'static, [SideEffect]>,
    pub boundary: Cow<'static, str>,
    pub runs: Runs,
    /// Workspace, sandbox and `execute_skills` tools need a `session_id`.
    pub needs_session: bool,
}

impl ToolSpec {
    /// How it runs, for `tool_search` and `describe`.
    pub fn execution(&self) -> Cow<'static, str> {
        self.runs.execution()
    }
}

/// A tool with its compiled schema.
pub struct RegisteredTool {
    pub spec: ToolSpec,
    pub input_schema: Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredTool")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl RegisteredTool {
    fn new<A: JsonSchema>(spec: ToolSpec) -> Self {
        let schema = schemars::schema_for!(A).to_value();
        let name = spec.name.clone();
        Self::from_schema(spec, schema)
            .unwrap_or_else(|e| panic!("schema of {name} does not compile: {e}"))
    }

    /// A tool whose input schema is a JSON value (a provider's): the schema gets the tool's
    /// name as `title` (and its description when it has none), and must compile. `Err` says
    /// why it does not.
    pub fn from_schema(spec: ToolSpec, mut input_schema: Value) -> Result<Self, String> {
        let Value::Object(map) = &mut input_schema else {
            return Err(format!(
                "the input schema must be a JSON object, not {}",
                crate::wire::json_kind(&input_schema)
            ));
        };
        map.insert("title".into(), Value::from(spec.name.as_ref()));
        if matches!(spec.runs, Runs::Provider(_)) {
            map.entry("description")
                .or_insert_with(|| Value::from(spec.description.as_ref()));
        } else {
            map.insert("description".into(), Value::from(spec.description.as_ref()));
        }
        // An empty `properties` keeps `additionalProperties: false` reporting the unknown
        // member by name for tools without arguments.
        map.entry("properties").or_insert_with(|| json!({}));
        let validator = jsonschema::validator_for(&input_schema).map_err(|e| e.to_string())?;
        Ok(Self {
            spec,
            input_schema,
            validator,
        })
    }

    /// Checks `arguments` against the schema; `invalid_arguments` names every bad member as a
    /// JSON pointer into the arguments (prefixed with `prefix`, e.g. `/arguments` for the
    /// dispatcher's inner call). A message never repeats the offending value whole: it quotes
    /// a display-safe rendering of at most [`DETAIL_VALUE_CHARS`] characters, each message is
    /// at most [`DETAIL_MESSAGE_CHARS`] and each path [`DETAIL_PATH_CHARS`] characters, with
    /// at most [`MAX_DETAILS`] details, so the reply stays small whatever was sent.
    pub fn validate(&self, arguments: &Value, prefix: &str) -> Result<(), ToolError> {
        use crate::text::{display_safe, preview_value, shorten_middle};
        let mut details = Vec::new();
        for error in self.validator.iter_errors(arguments) {
            let mut path = error.instance_path().to_string();
            match error.kind() {
                jsonschema::error::ValidationErrorKind::Required { property } => {
                    path.push('/');
                    path.push_str(property.as_str().unwrap_or_default());
                }
                jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } => {
                    if let Some(first) = unexpected.first() {
                        path.push('/');
                        path.push_str(first);
                    }
                }
                _ => {}
            }
            let value = preview_value(error.instance(), DETAIL_VALUE_CHARS, false);
            let message = error.masked_with(value).to_string();
            let message =
                display_safe(&shorten_middle(&message, DETAIL_MESSAGE_CHARS)).into_owned();
            let path = format!("{prefix}{path}");
            let path = display_safe(&shorten_middle(&path, DETAIL_PATH_CHARS)).into_owned();
            details.push(json!({"path": path, "message": message}));
            if details.len() == MAX_DETAILS {
                break;
            }
        }
        if details.is_empty() {
            return Ok(());
        }
        let first = &details[0];
        let message = format!(
            "arguments of {} are not valid: {} {}",
            self.spec.name,
            first["path"].as_str().unwrap_or_default(),
            first["message"].as_str().unwrap_or_default()
        );
        Err(ToolError::new(ErrorCode::InvalidArguments, message).with("details", details))
    }
}

/// Most `details` of one `invalid_arguments` from the schema.
pub const MAX_DETAILS: usize = 20;
/// Characters of the offending value a schema message quotes at most.
pub const DETAIL_VALUE_CHARS: usize = 80;
/// Characters of one schema message at most.
pub const DETAIL_MESSAGE_CHARS: usize = 300;
/// Characters of one detail's `path` at most: a longer pointer (a huge member name) keeps its
/// two ends around `…(N chars hidden)…` and is then no longer exact.
pub const DETAIL_PATH_CHARS: usize = 256;

fn spec(
    name: &'static str,
    group: ToolGroup,
    role: Role,
    risk_level: RiskLevel,
    side_effects: &'static [SideEffect],
    description: &'static str,
) -> ToolSpec {
    let (boundary, needs_session) = match (&group, side_effects) {
        (ToolGroup::Platform | ToolGroup::Dispatcher, _) => (BOUNDARY_GATEWAY, false),
        (ToolGroup::Workspace, []) => (BOUNDARY_WORKSPACE_READ, true),
        (ToolGroup::Workspace, _) => (BOUNDARY_WORKSPACE_WRITE, true),
        (ToolGroup::Sandbox, _) => (BOUNDARY_SANDBOX, true),
        (ToolGroup::Skills, []) => (BOUNDARY_SKILLS_READ, false),
        (ToolGroup::Skills, _) => (BOUNDARY_SKILLS_RUN, true),
        (ToolGroup::Web, _) => (BOUNDARY_WEB, false),
        (ToolGroup::External | ToolGroup::Mcp | ToolGroup::Named(_), _) => {
            unreachable!("built-in tools are in built-in groups")
        }
    };
    let runs = if role == Role::Gateway {
        Runs::Gateway
    } else {
        Runs::Actor(role)
    };
    ToolSpec {
        name: Cow::Borrowed(name),
        group,
        description: Cow::Borrowed(description),
        risk_level,
        side_effects: Cow::Borrowed(side_effects),
        boundary: Cow::Borrowed(boundary),
        runs,
        needs_session,
    }
}

/// The tools a gateway knows: the built-in ones, and (in the gateway's live registry) the
/// provider tools it discovered. Tools are shared (`Arc`), so a registry with other provider
/// tools is cheap to build.
#[derive(Debug, Clone)]
pub struct ToolRegistry {
    tools: Vec<Arc<RegisteredTool>>,
    by_name: HashMap<Cow<'static, str>, usize>,
}

impl ToolRegistry {
    pub fn builtin() -> ToolRegistry {
        use RiskLevel::*;
        use SideEffect::*;
        use ToolGroup as G;
        let t = |s| s;
        let tools = vec![
            RegisteredTool::new::<NoArgs>(t(spec(COMPONENT_STATUS, G::Platform, Role::Gateway, Low, &[],
                "What toolmesh has bound and running in the cluster right now: skill spaces, sandbox workers, workspace, skill runtime."))),
            RegisteredTool::new::<ToolDispatcherArgs>(spec(TOOL_DISPATCHER, G::Dispatcher, Role::Gateway, Low, &[],
                "List, describe and call built-in tools by name, so that only the tools needed are loaded into context. Calls go through the same approval policy.")),
            RegisteredTool::new::<ToolSearchArgs>(spec(TOOL_SEARCH, G::Dispatcher, Role::Gateway, Low, &[],
                "Search the built-in tools by name, description and group; returns scored matches and deferred_tool_names to call later. Runs nothing.")),
            RegisteredTool::new::<NoArgs>(spec("workspace_status", G::Workspace, Role::Workspace, Low, &[],
                "The session workspace root and a sample of up to 50 files.")),
            RegisteredTool::new::<ListWorkspaceFilesArgs>(spec("list_workspace_files", G::Workspace, Role::Workspace, Low, &[],
                "List files and directories of the workspace with an optional glob, recursion and sorting.")),
            RegisteredTool::new::<ReadWorkspaceFileArgs>(spec("read_workspace_file", G::Workspace, Role::Workspace, Low, &[],
                "Read a UTF-8 text file of the workspace with line numbers, a line range and a character budget; allows later edits of the file.")),
            RegisteredTool::new::<SearchWorkspaceFilesArgs>(spec("search_workspace_files", G::Workspace, Role::Workspace, Low, &[],
                "Search file contents of the workspace for text or a regex, with context lines; respects .gitignore.")),
            RegisteredTool::new::<LintWorkspaceFileArgs>(spec("lint_workspace_file", G::Workspace, Role::Workspace, Low, &[],
                "Lightweight built-in checks of one file: Python syntax, JSON syntax, NUL bytes and trailing whitespace.")),
            RegisteredTool::new::<WriteWorkspaceFileArgs>(spec("write_workspace_file", G::Workspace, Role::Workspace, Medium, &[WorkspaceWrite],
                "Write a whole file in the workspace, atomically, creating parent directories.")),
            RegisteredTool::new::<WriteWorkspaceFilesArgs>(spec("write_workspace_files", G::Workspace, Role::Workspace, Medium, &[WorkspaceWrite],
                "Write up to 100 whole files in the workspace in one call.")),
            RegisteredTool::new::<EditWorkspaceFileArgs>(spec("edit_workspace_file", G::Workspace, Role::Workspace, Medium, &[WorkspaceWrite],
                "Replace an exact snippet in a file read before; returns a unified diff.")),
            RegisteredTool::new::<MultiEditWorkspaceFileArgs>(spec("multi_edit_workspace_file", G::Workspace, Role::Workspace, Medium, &[WorkspaceWrite],
                "Apply several snippet edits to one file, all or nothing; returns a unified diff.")),
            RegisteredTool::new::<PathArgs>(spec("delete_workspace_file", G::Workspace, Role::Workspace, High, &[WorkspaceDelete],
                "Delete a file, a symlink (not its target) or an empty directory of the workspace.")),
            RegisteredTool::new::<NoArgs>(spec("list_skills", G::Skills, Role::Skills, Low, &[],
                "List the active skills: local ones and those of the configured skill spaces.")),
            RegisteredTool::new::<SearchSkillsArgs>(spec("search_skills", G::Skills, Role::Skills, Low, &[],
                "Fuzzy search over skill names, aliases, tags, descriptions and examples.")),
            RegisteredTool::new::<LoadSkillArgs>(spec("load_skill", G::Skills, Role::Skills, Low, &[],
                "Load a skill's SKILL.md instructions (downloading and verifying a remote skill); runs nothing.")),
            RegisteredTool::new::<ExecuteSkillsArgs>(spec("execute_skills", G::Skills, Role::Sandbox, High, &[IsolatedRuntimeExecution],
                "Run a workflow prompt with the named skills inside the session's sandbox.")),
            RegisteredTool::new::<NoArgs>(spec("sandbox_status", G::Sandbox, Role::Sandbox, Low, &[],
                "The session sandbox's backend, limits, lifetime and boundary; runs no command.")),
            RegisteredTool::new::<RunCommandArgs>(spec("run_command", G::Sandbox, Role::Sandbox, High, &[IsolatedRuntimeExecution],
                "Run a shell command in the session's sandbox, in the foreground or as a background task.")),
            RegisteredTool::new::<RunCodeArgs>(spec("run_code", G::Sandbox, Role::Sandbox, High, &[IsolatedRuntimeExecution],
                "Run a Python, JavaScript or Bash snippet in the session's sandbox.")),
            RegisteredTool::new::<NoArgs>(spec("list_tasks", G::Sandbox, Role::Sandbox, Low, &[],
                "List the background tasks of the session.")),
            RegisteredTool::new::<TaskOutputArgs>(spec("task_output", G::Sandbox, Role::Sandbox, Low, &[],
                "Read a background task's new output, optionally waiting for a regex to appear.")),
            RegisteredTool::new::<TaskInputArgs>(spec("task_input", G::Sandbox, Role::Sandbox, High, &[IsolatedRuntimeExecution],
                "Write to a background task's standard input.")),
            RegisteredTool::new::<TaskIdArgs>(spec("kill_task", G::Sandbox, Role::Sandbox, Medium, &[ProcessControl],
                "Stop a background task.")),
            RegisteredTool::new::<WebFetchArgs>(spec("web_fetch", G::Web, Role::Web, Low, &[NetworkEgress],
                "Fetch a public http(s) URL and return its text with scripts and styles removed.")),
            RegisteredTool::new::<WebSearchArgs>(spec("web_search", G::Web, Role::Web, Low, &[NetworkEgress],
                "Search the web through the configured provider; returns titles, URLs and snippets.")),
        ];
        let mut registry = ToolRegistry {
            tools: Vec::new(),
            by_name: HashMap::new(),
        };
        registry.extend(tools.into_iter().map(Arc::new));
        registry
    }

    /// This registry and `extra` after it. A tool whose name is already taken is left out:
    /// the first of a name keeps it (the gateway's catalog refuses clashes before, with why).
    pub fn with_tools(&self, extra: impl IntoIterator<Item = Arc<RegisteredTool>>) -> ToolRegistry {
        let mut registry = self.clone();
        registry.extend(extra);
        registry
    }

    fn extend(&mut self, tools: impl IntoIterator<Item = Arc<RegisteredTool>>) {
        for tool in tools {
            if self.by_name.contains_key(tool.spec.name.as_ref()) {
                continue;
            }
            self.by_name
                .insert(tool.spec.name.clone(), self.tools.len());
            self.tools.push(tool);
        }
    }

    /// Whether `name` is a built-in tool's name (or the dispatcher's alias).
    pub fn is_builtin_name(name: &str) -> bool {
        static NAMES: std::sync::OnceLock<BTreeSet<&'static str>> = std::sync::OnceLock::new();
        name == TOOL_DISPATCHER_ALIAS
            || NAMES
                .get_or_init(|| {
                    ToolRegistry::builtin()
                        .iter()
                        .filter_map(|t| match &t.spec.name {
                            Cow::Borrowed(name) => Some(*name),
                            Cow::Owned(_) => None,
                        })
                        .collect()
                })
                .contains(name)
    }

    /// A tool by name; the dispatcher's alias resolves to `tool_dispatcher`.
    pub fn get(&self, name: &str) -> Option<&RegisteredTool> {
        let name = if name == TOOL_DISPATCHER_ALIAS {
            TOOL_DISPATCHER
        } else {
            name
        };
        self.by_name.get(name).map(|&i| &*self.tools[i])
    }

    /// A tool by name, shared.
    pub fn get_shared(&self, name: &str) -> Option<Arc<RegisteredTool>> {
        let name = if name == TOOL_DISPATCHER_ALIAS {
            TOOL_DISPATCHER
        } else {
            name
        };
        self.by_name.get(name).map(|&i| self.tools[i].clone())
    }

    pub fn iter(&self) -> impl Iterator<Item = &RegisteredTool> {
        self.tools.iter().map(|t| &**t)
    }

    /// The tools of a profile (never the dispatcher itself).
    pub fn profile(&self, profile: Profile) -> BTreeSet<&str> {
        const FOCUSED: [&str; 10] = [
            "list_skills",
            "search_skills",
            "load_skill",
            "workspace_status",
            "search_workspace_files",
            "edit_workspace_file",
            "lint_workspace_file",
            COMPONENT_STATUS,
            "sandbox_status",
            "read_workspace_file",
        ];
        let dispatchable = self.iter().filter(|t| t.spec.name != TOOL_DISPATCHER);
        match profile {
            Profile::Focused | Profile::Core => FOCUSED.into_iter().collect(),
            // Every built-in tool and every provider tool.
            Profile::Default => dispatchable.map(|t| t.spec.name.as_ref()).collect(),
            Profile::Coding => dispatchable
                .filter(|t| {
                    matches!(
                        t.spec.group,
                        ToolGroup::Workspace | ToolGroup::Sandbox | ToolGroup::Skills
                    ) || t.spec.name == TOOL_SEARCH
                })
                .map(|t| t.spec.name.as_ref())
                .collect(),
        }
    }

    /// The union of `include` entries (groups, profiles, tool names), without the dispatcher.
    /// A group is a fixed one (even when empty) or one a provider tool names.
    pub fn select(&self, include: &[String]) -> Result<BTreeSet<&str>, ToolError> {
        let mut out = BTreeSet::new();
        for item in include {
            let item = item.as_str();
            let group = ToolGroup::parse(item);
            let named = matches!(group, ToolGroup::Named(_));
            if !named || self.iter().any(|t| t.spec.group == group) {
                out.extend(
                    self.iter()
                        .filter(|t| t.spec.group == group && t.spec.name != TOOL_DISPATCHER)
                        .map(|t| t.spec.name.as_ref()),
                );
            } else if let Ok(profile) = serde_json::from_value::<Profile>(Value::from(item)) {
                out.extend(self.profile(profile));
            } else if let Some(tool) = self.get(item) {
                if tool.spec.name != TOOL_DISPATCHER {
                    out.insert(tool.spec.name.as_ref());
                }
            } else {
                return Err(ToolError::invalid_argument(
                    "/include",
                    format!("{item:?} is neither a group, a profile nor a tool name"),
                ));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_tool_is_registered_with_its_risk() {
        let reg = ToolRegistry::builtin();
        let expect = [
            ("component_status", "low"),
            ("tool_dispatcher", "low"),
            ("tool_search", "low"),
            ("workspace_status", "low"),
            ("list_workspace_files", "low"),
            ("read_workspace_file", "low"),
            ("search_workspace_files", "low"),
            ("lint_workspace_file", "low"),
            ("write_workspace_file", "medium"),
            ("write_workspace_files", "medium"),
            ("edit_workspace_file", "medium"),
            ("multi_edit_workspace_file", "medium"),
            ("delete_workspace_file", "high"),
            ("list_skills", "low"),
            ("search_skills", "low"),
            ("load_skill", "low"),
            ("execute_skills", "high"),
            ("sandbox_status", "low"),
            ("list_tasks", "low"),
            ("task_output", "low"),
            ("kill_task", "medium"),
            ("run_command", "high"),
            ("run_code", "high"),
            ("task_input", "high"),
            ("web_fetch", "low"),
            ("web_search", "low"),
        ];
        assert_eq!(reg.iter().count(), expect.len());
        for (name, risk) in expect {
            let tool = reg.get(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(tool.spec.risk_level.as_str(), risk, "{name}");
        }
        assert_eq!(
            reg.get(TOOL_DISPATCHER_ALIAS).unwrap().spec.name,
            TOOL_DISPATCHER
        );
    }

    fn check(tool: &str, args: Value, expect_paths: &[&str]) {
        let reg = ToolRegistry::builtin();
        let result = reg.get(tool).unwrap().validate(&args, "");
        let paths: Vec<String> = match result {
            Ok(()) => vec![],
            Err(e) => {
                assert_eq!(e.code, ErrorCode::InvalidArguments);
                e.details["details"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d["path"].as_str().unwrap().to_owned())
                    .collect()
            }
        };
        assert_eq!(paths, expect_paths, "{tool} {args}");
    }

    #[test]
    fn validation_names_the_field() {
        check("read_workspace_file", json!({"path": "a"}), &[]);
        check("read_workspace_file", json!({}), &["/path"]);
        check("read_workspace_file", json!({"path": 5}), &["/path"]);
        check(
            "read_workspace_file",
            json!({"path": "a", "nope": 1}),
            &["/nope"],
        );
        check(
            "read_workspace_file",
            json!({"path": "a", "start_line": 0}),
            &["/start_line"],
        );
        check(
            "run_command",
            json!({"command": "ls", "env": {"A": 1}}),
            &["/env/A"],
        );
        check(
            "task_output",
            json!({"task_id": "t", "timeout": 301}),
            &["/timeout"],
        );
        check("search_skills", json!({"query": ""}), &["/query"]);
        check("tool_dispatcher", json!({"action": "frob"}), &["/action"]);
        check(
            "write_workspace_files",
            json!({"files": [{"path": "a"}]}),
            &["/files/0/content"],
        );
        check("component_status", json!({"x": 1}), &["/x"]);
    }

    /// Issue 16: a schema message quoted the whole offending value, so a 600 KB value made a
    /// reply over `max_payload`.
    #[test]
    fn a_huge_invalid_value_gets_short_messages_that_name_the_path() {
        let reg = ToolRegistry::builtin();
        let huge = "x".repeat(600 * 1024);
        let cases = [
            ("list_workspace_files", json!({"sort_by": huge}), "/sort_by"),
            (
                "run_command",
                json!({"command": "ls", "env": {"A": {"v": huge}}}),
                "/env/A",
            ),
            (
                "run_command",
                json!({"command": "ls", "env": {"A": [huge, huge, huge]}}),
                "/env/A",
            ),
            (
                "read_workspace_file",
                json!({"path": "a", "start_line": huge}),
                "/start_line",
            ),
        ];
        for (tool, args, path) in cases {
            let e = reg.get(tool).unwrap().validate(&args, "").unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidArguments);
            let size = serde_json::to_vec(&e.clone().into_fields()).unwrap().len();
            assert!(size < 4096, "{tool}: {size} bytes");
            let details = e.details["details"].as_array().unwrap();
            assert_eq!(details[0]["path"], path, "{tool}");
            let message = details[0]["message"].as_str().unwrap();
            assert!(message.chars().count() <= DETAIL_MESSAGE_CHARS, "{message}");
            assert!(message.contains("chars hidden"), "{message}");
            assert!(e.message.contains(path), "{}", e.message);
        }
        // A huge unknown member name: the path keeps its ends, the reply stays small.
        let mut args = serde_json::Map::new();
        args.insert("path".into(), json!("a"));
        args.insert(format!("k{huge}\u{202e}"), json!(1));
        let e = reg
            .get("read_workspace_file")
            .unwrap()
            .validate(&Value::Object(args), "")
            .unwrap_err();
        let size = serde_json::to_vec(&e.clone().into_fields()).unwrap().len();
        assert!(size < 4096, "{size} bytes");
        let path = e.details["details"][0]["path"].as_str().unwrap();
        assert!(
            path.starts_with("/kxx") && path.ends_with("x\\u202e"),
            "{path}"
        );
    }

    #[test]
    fn profiles_never_hold_the_dispatcher() {
        let reg = ToolRegistry::builtin();
        for p in [Profile::Focused, Profile::Default, Profile::Coding] {
            assert!(!reg.profile(p).contains(TOOL_DISPATCHER), "{p:?}");
        }
        assert_eq!(reg.profile(Profile::Default).len(), reg.iter().count() - 1);
        let focused = reg.profile(Profile::Core);
        assert!(focused.contains("read_workspace_file"));
        assert!(!focused.contains("run_command"));
        let coding = reg.profile(Profile::Coding);
        assert!(coding.contains("run_command") && coding.contains(TOOL_SEARCH));
        assert!(!coding.contains("web_fetch") && !coding.contains(COMPONENT_STATUS));
    }

    #[test]
    fn select_mixes_groups_profiles_and_names() {
        let reg = ToolRegistry::builtin();
        let got = reg
            .select(&[
                "web".into(),
                "focused".into(),
                "run_code".into(),
                "tool_dispatcher".into(),
            ])
            .unwrap();
        assert!(
            got.contains("web_fetch") && got.contains("run_code") && got.contains("load_skill")
        );
        assert!(!got.contains(TOOL_DISPATCHER));
        assert!(reg.select(&["nope".into()]).is_err());
    }
}
