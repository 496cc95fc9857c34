//! The tool registry's types: a built-in tool's definition ([`ToolDef`]), its description with
//! a compiled JSON Schema ([`RegisteredTool`]), the registry built from definitions
//! ([`ToolRegistry`]), argument validation and the dispatcher's profiles.
//!
//! The definitions themselves live with the actors that run them, one table per actor; the
//! node assembles the registry from every table. This module knows no tool but the gateway's
//! own names the profiles need.

pub mod args;

use std::collections::{BTreeSet, HashMap};

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{json, Value};

use crate::error::{ErrorCode, ToolError};
use crate::role::Role;
use crate::wire::{RiskLevel, SideEffect};
use args::Profile;

/// The groups of PROTOCOL.md's tool table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolGroup {
    Platform,
    Dispatcher,
    Workspace,
    Skills,
    Sandbox,
    Web,
}

impl ToolGroup {
    pub const ALL: [ToolGroup; 6] = [
        ToolGroup::Platform,
        ToolGroup::Dispatcher,
        ToolGroup::Workspace,
        ToolGroup::Skills,
        ToolGroup::Sandbox,
        ToolGroup::Web,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            ToolGroup::Platform => "platform",
            ToolGroup::Dispatcher => "dispatcher",
            ToolGroup::Workspace => "workspace",
            ToolGroup::Skills => "skills",
            ToolGroup::Sandbox => "sandbox",
            ToolGroup::Web => "web",
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

/// The static description of one tool.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: &'static str,
    pub group: ToolGroup,
    pub description: &'static str,
    pub risk_level: RiskLevel,
    pub side_effects: &'static [SideEffect],
    pub boundary: &'static str,
    /// The actor that runs it.
    pub role: Role,
    /// Workspace, sandbox and `execute_skills` tools need a `session_id`.
    pub needs_session: bool,
    /// How it runs, for `tool_search`.
    pub execution: &'static str,
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
    /// A tool of `spec` whose arguments `input_schema` describes; the schema gets the tool's
    /// name as `title` and its description. `Err` when the schema does not compile.
    pub fn new(spec: ToolSpec, mut input_schema: Value) -> Result<Self, RegistryError> {
        if let Value::Object(map) = &mut input_schema {
            map.insert("title".into(), Value::from(spec.name));
            map.insert("description".into(), Value::from(spec.description));
            // An empty `properties` keeps `additionalProperties: false` reporting the unknown
            // member by name for tools without arguments.
            map.entry("properties").or_insert_with(|| json!({}));
        }
        let validator =
            jsonschema::validator_for(&input_schema).map_err(|e| RegistryError::Schema {
                tool: spec.name,
                message: e.to_string(),
            })?;
        Ok(Self {
            spec,
            input_schema,
            validator,
        })
    }

    /// A built-in tool from its definition.
    pub fn from_def(def: &ToolDef) -> Result<Self, RegistryError> {
        Self::new(def.spec(), (def.schema)())
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

/// A built-in tool's definition: a `const` in the file of the actor that implements it, listed
/// in that actor's table. The boundary and how it runs (`tool_search`) follow from its group
/// and side effects.
#[derive(Debug, Clone, Copy)]
pub struct ToolDef {
    pub name: &'static str,
    pub group: ToolGroup,
    pub description: &'static str,
    pub risk_level: RiskLevel,
    pub side_effects: &'static [SideEffect],
    /// Whether a call needs a `session_id`.
    pub needs_session: bool,
    /// The actor that runs it.
    pub role: Role,
    /// The JSON Schema of its arguments: [`schema_of`] its argument type.
    pub schema: fn() -> Value,
}

impl ToolDef {
    /// Its description in the registry.
    pub fn spec(&self) -> ToolSpec {
        let (boundary, execution) = match (self.group, self.side_effects) {
            (ToolGroup::Platform | ToolGroup::Dispatcher, _) => (BOUNDARY_GATEWAY, "gateway"),
            (ToolGroup::Workspace, []) => (BOUNDARY_WORKSPACE_READ, "workspace_actor"),
            (ToolGroup::Workspace, _) => (BOUNDARY_WORKSPACE_WRITE, "workspace_actor"),
            (ToolGroup::Sandbox, _) => (BOUNDARY_SANDBOX, "sandbox_worker"),
            (ToolGroup::Skills, []) => (BOUNDARY_SKILLS_READ, "skill_loader"),
            (ToolGroup::Skills, _) => (BOUNDARY_SKILLS_RUN, "sandbox_worker"),
            (ToolGroup::Web, _) => (BOUNDARY_WEB, "web_actor"),
        };
        ToolSpec {
            name: self.name,
            group: self.group,
            description: self.description,
            risk_level: self.risk_level,
            side_effects: self.side_effects,
            boundary,
            role: self.role,
            needs_session: self.needs_session,
            execution,
        }
    }
}

/// The JSON Schema of an argument type, for [`ToolDef::schema`].
pub fn schema_of<A: JsonSchema>() -> Value {
    schemars::schema_for!(A).to_value()
}

/// Why a registry cannot be built from its definitions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("two tools are named {0:?}")]
    Duplicate(&'static str),
    #[error("the schema of {tool} does not compile: {message}")]
    Schema { tool: &'static str, message: String },
}

/// The tools a gateway knows, by name.
#[derive(Debug)]
pub struct ToolRegistry {
    tools: Vec<RegisteredTool>,
    by_name: HashMap<&'static str, usize>,
}

impl ToolRegistry {
    /// The registry of `defs`, in their order; `Err` when two share a name or a schema does
    /// not compile.
    pub fn new<'a>(
        defs: impl IntoIterator<Item = &'a ToolDef>,
    ) -> Result<ToolRegistry, RegistryError> {
        let mut tools = Vec::new();
        let mut by_name = HashMap::new();
        for def in defs {
            if by_name.insert(def.name, tools.len()).is_some() {
                return Err(RegistryError::Duplicate(def.name));
            }
            tools.push(RegisteredTool::from_def(def)?);
        }
        Ok(ToolRegistry { tools, by_name })
    }

    /// A tool by name; the dispatcher's alias resolves to `tool_dispatcher`.
    pub fn get(&self, name: &str) -> Option<&RegisteredTool> {
        let name = if name == TOOL_DISPATCHER_ALIAS {
            TOOL_DISPATCHER
        } else {
            name
        };
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    pub fn iter(&self) -> impl Iterator<Item = &RegisteredTool> {
        self.tools.iter()
    }

    /// The tools of a profile (never the dispatcher itself).
    pub fn profile(&self, profile: Profile) -> BTreeSet<&'static str> {
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
        let dispatchable = self.tools.iter().filter(|t| t.spec.name != TOOL_DISPATCHER);
        match profile {
            Profile::Focused | Profile::Core => FOCUSED
                .into_iter()
                .filter(|name| self.by_name.contains_key(name))
                .collect(),
            Profile::Default => dispatchable.map(|t| t.spec.name).collect(),
            Profile::Coding => dispatchable
                .filter(|t| {
                    matches!(
                        t.spec.group,
                        ToolGroup::Workspace | ToolGroup::Sandbox | ToolGroup::Skills
                    ) || t.spec.name == TOOL_SEARCH
                })
                .map(|t| t.spec.name)
                .collect(),
        }
    }

    /// The union of `include` entries (groups, profiles, tool names), without the dispatcher.
    pub fn select(&self, include: &[String]) -> Result<BTreeSet<&'static str>, ToolError> {
        let mut out = BTreeSet::new();
        for item in include {
            let item = item.as_str();
            if let Some(group) = ToolGroup::ALL.into_iter().find(|g| g.as_str() == item) {
                out.extend(
                    self.tools
                        .iter()
                        .filter(|t| t.spec.group == group && t.spec.name != TOOL_DISPATCHER)
                        .map(|t| t.spec.name),
                );
            } else if let Ok(profile) = serde_json::from_value::<Profile>(Value::from(item)) {
                out.extend(self.profile(profile));
            } else if let Some(tool) = self.get(item) {
                if tool.spec.name != TOOL_DISPATCHER {
                    out.insert(tool.spec.name);
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
    use args::NoArgs;

    fn def(name: &'static str, group: ToolGroup, schema: fn() -> Value) -> ToolDef {
        ToolDef {
            name,
            group,
            description: "a tool of the tests",
            risk_level: RiskLevel::Low,
            side_effects: &[],
            needs_session: false,
            role: Role::Web,
            schema,
        }
    }

    #[test]
    fn a_registry_holds_its_definitions_and_nothing_else() {
        let defs = [
            def("a_tool", ToolGroup::Web, schema_of::<NoArgs>),
            def(TOOL_DISPATCHER, ToolGroup::Dispatcher, schema_of::<NoArgs>),
        ];
        let reg = ToolRegistry::new(&defs).unwrap();
        assert_eq!(reg.iter().count(), 2);
        assert_eq!(reg.get("a_tool").unwrap().spec.execution, "web_actor");
        assert_eq!(
            reg.get(TOOL_DISPATCHER_ALIAS).unwrap().spec.name,
            TOOL_DISPATCHER
        );
        assert!(reg.get("read_workspace_file").is_none());
        // A profile names only tools the registry has.
        assert!(reg.profile(Profile::Focused).is_empty());
        assert!(reg.select(&["read_workspace_file".into()]).is_err());
    }

    #[test]
    fn two_tools_of_one_name_are_refused() {
        let defs = [
            def("twice", ToolGroup::Web, schema_of::<NoArgs>),
            def("twice", ToolGroup::Skills, schema_of::<NoArgs>),
        ];
        assert_eq!(
            ToolRegistry::new(&defs).unwrap_err(),
            RegistryError::Duplicate("twice")
        );
    }

    #[test]
    fn a_schema_that_does_not_compile_is_refused() {
        let defs = [def("broken", ToolGroup::Web, || json!({"type": "nope"}))];
        let error = ToolRegistry::new(&defs).unwrap_err();
        assert!(
            matches!(error, RegistryError::Schema { tool: "broken", .. }),
            "{error:?}"
        );
    }
}
