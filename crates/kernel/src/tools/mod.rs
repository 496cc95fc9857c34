//! The tool registry's types: a built-in tool's definition ([`ToolDef`]), a tool with its
//! compiled JSON Schema ([`RegisteredTool`]) and where it runs ([`Runs`]), the registry
//! ([`ToolRegistry`]), argument validation and the dispatcher's profiles. Built-in tools and
//! provider tools (PROTOCOL.md "Tool providers") are the same kind of value; only where they
//! run differs.
//!
//! The built-in definitions live with the actors that run them ([`Tool`]), one
//! table per actor; the node assembles the registry from every table. This module knows no
//! tool but the dispatcher, which the gateway's call path runs.

pub mod args;
mod spec;
mod tool;

pub use spec::{
    schema_of, unwrap_doc, BuiltinGroup, ProviderRoute, Review, Runs, ToolDef, ToolGroup, ToolSpec,
    TOOL_DISPATCHER, TOOL_DISPATCHER_ALIAS,
};
pub use tool::{
    find, parse_args, ClaimTo, Entry, Listed, RunFn, Runnable, Table, Tool, ToolCall, ToolResult,
};

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::{ErrorCode, ToolError};
use args::Profile;

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
    /// A built-in tool from its table entry, described by its schema's description (its
    /// type's doc comment); `Err` when its schema does not compile.
    pub fn from_listed(tool: &dyn Listed) -> Result<Self, RegistryError> {
        let def = tool.def();
        let schema = tool.schema();
        let description = schema.get("description").and_then(Value::as_str);
        let spec = def.spec(description.map(unwrap_doc).unwrap_or_default());
        Self::from_schema(spec, schema).map_err(|message| RegistryError::Schema {
            tool: def.name,
            message,
        })
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

/// Why a registry cannot be built from its definitions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("two tools are named {0:?}")]
    Duplicate(&'static str),
    #[error("the schema of {tool} does not compile: {message}")]
    Schema { tool: &'static str, message: String },
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
    /// The registry of `tools`, in their order; `Err` when two share a name or a schema does
    /// not compile.
    pub fn new<'a>(
        tools: impl IntoIterator<Item = &'a dyn Listed>,
    ) -> Result<ToolRegistry, RegistryError> {
        let mut registry = ToolRegistry {
            tools: Vec::new(),
            by_name: HashMap::new(),
        };
        for tool in tools {
            let name = tool.def().name;
            if registry.by_name.contains_key(name) {
                return Err(RegistryError::Duplicate(name));
            }
            registry.extend([Arc::new(RegisteredTool::from_listed(tool)?)]);
        }
        Ok(registry)
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

    /// Whether this registry has a tool of `name` (or `name` is the dispatcher's alias and
    /// it has the dispatcher).
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
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

    /// The tools of a profile (never the dispatcher itself): every tool for `default`, else
    /// those whose definitions name the profile.
    pub fn profile(&self, profile: Profile) -> BTreeSet<&str> {
        let profile = match profile {
            Profile::Core => Profile::Focused,
            other => other,
        };
        self.iter()
            .filter(|t| !t.spec.is_dispatcher())
            .filter(|t| profile == Profile::Default || t.spec.profiles.contains(&profile))
            .map(|t| t.spec.name.as_ref())
            .collect()
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
                        .filter(|t| t.spec.group == group && !t.spec.is_dispatcher())
                        .map(|t| t.spec.name.as_ref()),
                );
            } else if let Ok(profile) = serde_json::from_value::<Profile>(Value::from(item)) {
                out.extend(self.profile(profile));
            } else if let Some(tool) = self.get(item) {
                if !tool.spec.is_dispatcher() {
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
    use crate::role::Role;
    use args::NoArgs;

    fn def(name: &'static str, group: BuiltinGroup, schema: fn() -> Value) -> Entry {
        let role = if group == BuiltinGroup::Dispatcher {
            Role::Gateway
        } else {
            Role::Web
        };
        let def = ToolDef::of(group, role)
            .named(name)
            .profiles(&[Profile::Coding]);
        Entry {
            def: Box::leak(Box::new(def)),
            schema,
            run: (),
        }
    }

    fn listed(entries: &[Entry]) -> impl Iterator<Item = &dyn Listed> {
        entries.iter().map(|e| e as &dyn Listed)
    }

    #[test]
    fn a_registry_holds_its_definitions_and_nothing_else() {
        let defs = [
            def("a_tool", BuiltinGroup::Web, schema_of::<NoArgs>),
            def(
                TOOL_DISPATCHER,
                BuiltinGroup::Dispatcher,
                schema_of::<NoArgs>,
            ),
        ];
        let reg = ToolRegistry::new(listed(&defs)).unwrap();
        assert_eq!(reg.iter().count(), 2);
        assert_eq!(reg.get("a_tool").unwrap().spec.execution(), "web_actor");
        assert_eq!(
            reg.get(TOOL_DISPATCHER_ALIAS).unwrap().spec.name,
            TOOL_DISPATCHER
        );
        assert!(reg.get("read_workspace_file").is_none());
        // A profile has the tools whose definitions name it, never the dispatcher.
        assert!(reg.profile(Profile::Focused).is_empty());
        assert_eq!(
            reg.profile(Profile::Coding).into_iter().collect::<Vec<_>>(),
            ["a_tool"]
        );
        assert!(reg.select(&["read_workspace_file".into()]).is_err());
    }

    /// A tool of the tests whose doc comment is its description, wrapped across lines the
    /// way rustfmt leaves a long one.
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Documented {}

    #[test]
    fn a_tool_is_described_by_its_doc_comment_unwrapped() {
        let defs = [def(
            "documented",
            BuiltinGroup::Web,
            schema_of::<Documented>,
        )];
        let reg = ToolRegistry::new(listed(&defs)).unwrap();
        let tool = reg.get("documented").unwrap();
        let expected = "A tool of the tests whose doc comment is its description, wrapped \
                        across lines the way rustfmt leaves a long one.";
        assert_eq!(tool.spec.description, expected);
        assert_eq!(tool.input_schema["description"], expected);
        assert_eq!(tool.input_schema["title"], "documented");
    }

    #[test]
    fn two_tools_of_one_name_are_refused() {
        let defs = [
            def("twice", BuiltinGroup::Web, schema_of::<NoArgs>),
            def("twice", BuiltinGroup::Skills, schema_of::<NoArgs>),
        ];
        assert_eq!(
            ToolRegistry::new(listed(&defs)).unwrap_err(),
            RegistryError::Duplicate("twice")
        );
    }

    #[test]
    fn a_schema_that_does_not_compile_is_refused() {
        let defs = [def("broken", BuiltinGroup::Web, || json!({"type": "nope"}))];
        let error = ToolRegistry::new(listed(&defs)).unwrap_err();
        assert!(
            matches!(error, RegistryError::Schema { tool: "broken", .. }),
            "{error:?}"
        );
    }
}
