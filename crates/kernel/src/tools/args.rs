//! Argument types more than one tool shares: [`NoArgs`], the dispatcher's [`Profile`] (the
//! registry chooses by it) and [`OneOrMany`].
//!
//! Each tool's type is its argument type and lives in its file in the actor that runs it.
//! Every such type derives `JsonSchema` and refuses unknown members (`deny_unknown_fields`, so
//! the schema says `additionalProperties: false`): the gateway validates calls against the
//! schema derived from it and the actor deserializes the same type, so schema and code cannot
//! drift apart, and a misspelt argument is an error, not a silently ignored option.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// No arguments.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// A tool profile: a named set of tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// The focused set of the seed plus `read_workspace_file`.
    Focused,
    /// Alias of `focused`.
    Core,
    /// Every built-in tool.
    #[default]
    Default,
    /// Workspace, sandbox and skills tools plus `tool_search`.
    Coding,
}

/// One name or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => s
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            OneOrMany::Many(v) => v,
        }
    }
}
