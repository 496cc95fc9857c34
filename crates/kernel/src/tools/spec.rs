//! What a tool is, for the registry: its group ([`ToolGroup`], a built-in's [`BuiltinGroup`]),
//! where it runs ([`Runs`]), its description ([`ToolSpec`]) and a built-in's definition
//! ([`ToolDef`], with how an approver sees its arguments, [`Review`]).

use std::borrow::Cow;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Serialize, Serializer};
use serde_json::Value;

use super::args::Profile;
use crate::role::Role;
use crate::wire::{RiskLevel, SideEffect};

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

/// The group of a built-in tool (PROTOCOL.md's tool table), as its [`ToolDef`] names it; the
/// registry names it as a [`ToolGroup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinGroup {
    Platform,
    Dispatcher,
    Workspace,
    Skills,
    Sandbox,
    Web,
}

impl From<BuiltinGroup> for ToolGroup {
    fn from(group: BuiltinGroup) -> Self {
        match group {
            BuiltinGroup::Platform => ToolGroup::Platform,
            BuiltinGroup::Dispatcher => ToolGroup::Dispatcher,
            BuiltinGroup::Workspace => ToolGroup::Workspace,
            BuiltinGroup::Skills => ToolGroup::Skills,
            BuiltinGroup::Sandbox => ToolGroup::Sandbox,
            BuiltinGroup::Web => ToolGroup::Web,
        }
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
            Runs::Actor(Role::Bridge) => Cow::Borrowed("bridge"),
            Runs::Actor(Role::Mcp) => Cow::Borrowed("mcp_front"),
            Runs::Actor(Role::Console) => Cow::Borrowed("console"),
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
    /// The named profiles it belongs to besides `default` (none for a provider's tool).
    pub profiles: &'static [Profile],
    /// How an approver sees its arguments.
    pub review: Review,
}

impl ToolSpec {
    /// How it runs, for `tool_search` and `describe`.
    pub fn execution(&self) -> Cow<'static, str> {
        self.runs.execution()
    }

    /// Whether this is `tool_dispatcher`, which the gateway's call path runs (a `call` goes
    /// on as the tool it names) and no profile or group selection includes.
    pub fn is_dispatcher(&self) -> bool {
        self.runs == Runs::Gateway && self.name == TOOL_DISPATCHER
    }
}

/// How an approver sees a call's arguments (the console shows them; a diff besides when the
/// tool says how to make one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Review {
    /// The arguments as they are.
    Arguments,
    /// The arguments and the unified diff of the change they make: for the arguments
    /// themselves, or for each item of the array member `each`, the file named by the string
    /// member `path` (of the item, else of the arguments) goes from member `old` (an empty file
    /// when `None`) to member `new`.
    Diff {
        each: Option<&'static str>,
        path: &'static str,
        old: Option<&'static str>,
        new: &'static str,
    },
}

impl Review {
    /// The diff of the file named by member `path`, from member `old` (empty when `None`) to
    /// member `new`.
    pub const fn diff(path: &'static str, old: Option<&'static str>, new: &'static str) -> Self {
        Review::Diff {
            each: None,
            path,
            old,
            new,
        }
    }

    /// [`Review::diff`] of each item of the array member `each`.
    pub const fn diff_each(
        each: &'static str,
        path: &'static str,
        old: Option<&'static str>,
        new: &'static str,
    ) -> Self {
        Review::Diff {
            each: Some(each),
            path,
            old,
            new,
        }
    }
}

/// A built-in tool's definition: [`super::Tool::DEF`] of the tool's type, in the file of the
/// actor that runs it. Its boundary follows from its group and side effects, where it runs from
/// its role, its schema and description from its type (the description is the type's doc
/// comment).
#[derive(Debug, Clone)]
pub struct ToolDef {
    pub name: &'static str,
    pub group: BuiltinGroup,
    pub risk_level: RiskLevel,
    pub side_effects: &'static [SideEffect],
    /// Whether a call needs a `session_id`.
    pub needs_session: bool,
    /// The actor that runs it.
    pub role: Role,
    /// The named profiles it belongs to besides `default` (which has every tool).
    pub profiles: &'static [Profile],
    /// How an approver sees its arguments.
    pub review: Review,
}

impl ToolDef {
    /// A definition of a tool of `group` that `role` runs, with the usual defaults: low risk,
    /// no side effect, no session, no named profile, arguments shown as they are. An actor's
    /// tools start from one such base and name what differs: `BASE.named("a_tool")`, then
    /// [`ToolDef::risk`], [`ToolDef::profiles`], [`ToolDef::review`].
    pub const fn of(group: BuiltinGroup, role: Role) -> ToolDef {
        ToolDef {
            name: "",
            group,
            risk_level: RiskLevel::Low,
            side_effects: &[],
            needs_session: false,
            role,
            profiles: &[],
            review: Review::Arguments,
        }
    }

    /// This definition, for the tool `name`.
    pub const fn named(self, name: &'static str) -> ToolDef {
        ToolDef { name, ..self }
    }

    /// This definition in `group`.
    pub const fn in_group(self, group: BuiltinGroup) -> ToolDef {
        ToolDef { group, ..self }
    }

    /// This definition with its own risk and side effects.
    pub const fn risk(self, risk_level: RiskLevel, side_effects: &'static [SideEffect]) -> ToolDef {
        ToolDef {
            risk_level,
            side_effects,
            ..self
        }
    }

    /// This definition in the named `profiles` (besides `default`).
    pub const fn profiles(self, profiles: &'static [Profile]) -> ToolDef {
        ToolDef { profiles, ..self }
    }

    /// This definition with arguments an approver sees as `review` says.
    pub const fn review(self, review: Review) -> ToolDef {
        ToolDef { review, ..self }
    }

    /// Its description in the registry, with the `description` its type's doc comment gives.
    pub fn spec(&self, description: String) -> ToolSpec {
        let boundary = match (self.group, self.side_effects) {
            (BuiltinGroup::Platform | BuiltinGroup::Dispatcher, _) => BOUNDARY_GATEWAY,
            (BuiltinGroup::Workspace, []) => BOUNDARY_WORKSPACE_READ,
            (BuiltinGroup::Workspace, _) => BOUNDARY_WORKSPACE_WRITE,
            (BuiltinGroup::Sandbox, _) => BOUNDARY_SANDBOX,
            (BuiltinGroup::Skills, []) => BOUNDARY_SKILLS_READ,
            (BuiltinGroup::Skills, _) => BOUNDARY_SKILLS_RUN,
            (BuiltinGroup::Web, _) => BOUNDARY_WEB,
        };
        let runs = if self.role == Role::Gateway {
            Runs::Gateway
        } else {
            Runs::Actor(self.role)
        };
        ToolSpec {
            name: Cow::Borrowed(self.name),
            group: self.group.into(),
            description: Cow::Owned(description),
            risk_level: self.risk_level,
            side_effects: Cow::Borrowed(self.side_effects),
            boundary: Cow::Borrowed(boundary),
            runs,
            needs_session: self.needs_session,
            profiles: self.profiles,
            review: self.review,
        }
    }
}

/// The JSON Schema of an argument type ([`super::Listed::schema`]).
pub fn schema_of<A: JsonSchema>() -> Value {
    schemars::schema_for!(A).to_value()
}

/// A doc comment as one text: the lines of each paragraph joined by a space (schemars keeps
/// the source's line breaks), paragraphs apart by a blank line.
pub fn unwrap_doc(doc: &str) -> String {
    doc.split("\n\n")
        .map(|paragraph| {
            let lines: Vec<&str> = paragraph.lines().map(str::trim).collect();
            lines.join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::unwrap_doc;

    #[test]
    fn a_doc_comment_unwraps_into_paragraphs() {
        assert_eq!(unwrap_doc("One line."), "One line.");
        assert_eq!(
            unwrap_doc("Wrapped\nacross lines."),
            "Wrapped across lines."
        );
        assert_eq!(
            unwrap_doc("First\nparagraph.\n\nSecond."),
            "First paragraph.\n\nSecond."
        );
        assert_eq!(unwrap_doc(""), "");
    }
}
