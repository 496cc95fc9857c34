//! `tool_dispatcher` (alias `agentengine_tool_dispatcher`): list, describe and call tools by
//! name. The call path runs it (`Call::dispatch` in `call.rs`): a `call` goes on as the
//! named tool, through the same validation and approval policy.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolmesh_kernel::tools::args::{OneOrMany, Profile};
use toolmesh_kernel::tools::{Entry, TOOL_DISPATCHER};

use super::tool::GATEWAY;

/// The dispatcher's entry in [`super::LISTED`]: listed, never run from a table.
pub const LISTED: Entry = Entry::new::<ToolDispatcher>(&GATEWAY.named(TOOL_DISPATCHER), ());

/// What `tool_dispatcher` should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DispatcherAction {
    List,
    Describe,
    Call,
}

/// List, describe and call built-in tools by name, so that only the tools needed are loaded into
/// context. Calls go through the same approval policy.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolDispatcher {
    /// `list`, `describe` or `call`.
    pub action: DispatcherAction,
    /// The tool to describe or call.
    #[serde(default)]
    pub tool_name: Option<String>,
    /// The called tool's arguments: an object, or a string holding a JSON object.
    #[serde(default)]
    pub arguments: Option<Value>,
    /// Groups, profiles and tool names to choose from (instead of `profile`).
    #[serde(default)]
    pub include: Option<OneOrMany>,
    /// The tool set to choose from when `include` is not given.
    #[serde(default)]
    pub profile: Profile,
}
