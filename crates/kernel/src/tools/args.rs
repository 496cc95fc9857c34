//! The arguments of every built-in tool: one struct each, after the seed's signatures.
//!
//! The gateway validates calls against the JSON Schema derived from these types; the actor that
//! owns a tool deserializes the same type, so schema and code cannot drift apart. Unknown members
//! are refused (`additionalProperties: false`) so that a misspelt argument is an error, not a
//! silently ignored option.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn dot() -> String {
    ".".into()
}
fn yes() -> bool {
    true
}
fn one() -> u64 {
    1
}

/// No arguments.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

// ---------------------------------------------------------------- dispatcher

/// What `tool_dispatcher` should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DispatcherAction {
    List,
    Describe,
    Call,
}

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

/// List, describe and call built-in tools by name (progressive disclosure).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolDispatcherArgs {
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

/// Scored search over tool names, descriptions and groups.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolSearchArgs {
    /// Words to look for.
    #[schemars(length(min = 1))]
    pub query: String,
    #[serde(default = "coding")]
    pub profile: Profile,
    #[serde(default = "eight")]
    #[schemars(range(min = 1, max = 100))]
    pub max_results: u64,
    /// Also return tools whose actor is not running anywhere in the cluster.
    #[serde(default)]
    pub include_disabled: bool,
}
fn coding() -> Profile {
    Profile::Coding
}
fn eight() -> u64 {
    8
}

// ---------------------------------------------------------------- workspace

/// How `list_workspace_files` orders entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortBy {
    /// Ascending by path.
    #[default]
    Name,
    /// Newest first.
    Mtime,
    /// Largest first.
    Size,
}

/// List files and directories.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListWorkspaceFilesArgs {
    #[serde(default = "dot")]
    pub path: String,
    /// Matched against the path relative to `path`; `**` crosses directories.
    #[serde(default)]
    pub glob: Option<String>,
    #[serde(default)]
    pub recursive: bool,
    #[serde(default = "yes")]
    pub include_dirs: bool,
    /// Clamped to 5000.
    #[serde(default = "five_hundred")]
    #[schemars(range(min = 1))]
    pub max_results: u64,
    #[serde(default)]
    pub sort_by: SortBy,
}
fn five_hundred() -> u64 {
    500
}

/// Read a UTF-8 text file, optionally a line range.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadWorkspaceFileArgs {
    pub path: String,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub start_line: Option<u64>,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub end_line: Option<u64>,
    /// Character budget of this read, clamped to 1000–100000.
    #[serde(default)]
    pub max_chars: Option<u64>,
    #[serde(default = "yes")]
    pub include_line_numbers: bool,
}

/// Write a whole file (creating parent directories).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteWorkspaceFileArgs {
    pub path: String,
    pub content: String,
    #[serde(default = "yes")]
    pub overwrite: bool,
}

/// One file of a batch write.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileContent {
    pub path: String,
    pub content: String,
}

/// Write several whole files; past 100, the rest are ignored and `truncated` is set.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteWorkspaceFilesArgs {
    pub files: Vec<FileContent>,
    #[serde(default = "yes")]
    pub overwrite: bool,
}

/// Replace an exact snippet (a prior read of the file is required).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditWorkspaceFileArgs {
    pub path: String,
    pub old_text: String,
    pub new_text: String,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub expected_replacements: u64,
    #[serde(default)]
    pub replace_all: bool,
}

/// One edit of `multi_edit_workspace_file`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnippetEdit {
    pub old_text: String,
    pub new_text: String,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub expected_replacements: Option<u64>,
    #[serde(default)]
    pub replace_all: Option<bool>,
}

/// Apply several edits to one file, all or nothing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MultiEditWorkspaceFileArgs {
    pub path: String,
    #[schemars(length(min = 1))]
    pub edits: Vec<SnippetEdit>,
    #[serde(default)]
    pub replace_all: bool,
}

/// The language `lint_workspace_file` checks as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LintLanguage {
    #[default]
    Auto,
    Python,
    Json,
    Markdown,
    Text,
}

/// Lightweight built-in checks of one file.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LintWorkspaceFileArgs {
    pub path: String,
    #[serde(default)]
    pub language: LintLanguage,
}

/// Search file contents (ripgrep-class engine, `.gitignore` respected).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchWorkspaceFilesArgs {
    #[schemars(length(min = 1))]
    pub query: String,
    #[serde(default = "dot")]
    pub path: String,
    #[serde(default)]
    pub is_regex: bool,
    #[serde(default)]
    pub glob: Option<String>,
    #[serde(default)]
    pub case_sensitive: bool,
    /// Capped at 20.
    #[serde(default)]
    pub context_lines: u64,
    /// Capped at 5000.
    #[serde(default = "one_hundred")]
    #[schemars(range(min = 1))]
    pub max_results: u64,
}
fn one_hundred() -> u64 {
    100
}

/// Delete a file, a symlink (not its target) or an empty directory.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    pub path: String,
}

// ---------------------------------------------------------------- skills

/// Fuzzy search over skills.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchSkillsArgs {
    #[schemars(length(min = 1))]
    pub query: String,
    #[serde(default = "ten")]
    #[schemars(range(min = 1, max = 100))]
    pub max_results: u64,
}
fn ten() -> u64 {
    10
}

/// Load a skill's instructions.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadSkillArgs {
    #[schemars(length(min = 1))]
    pub skill_name: String,
}

/// Run a workflow prompt in the session's sandbox with skills mounted.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteSkillsArgs {
    #[schemars(length(min = 1))]
    pub workflow_prompt: String,
    #[serde(default)]
    pub skill_names: Option<OneOrMany>,
    /// Seconds.
    #[serde(default)]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout: Option<u64>,
}

// ---------------------------------------------------------------- sandbox

/// Run a shell command in the session's sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    #[schemars(length(min = 1))]
    pub command: String,
    /// Relative to `/workspace` unless absolute.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Seconds.
    #[serde(default)]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Return a `task_id` at once and keep running.
    #[serde(default)]
    pub background: bool,
}

/// Interpreters of `run_code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CodeLanguage {
    #[default]
    Python,
    Javascript,
    Bash,
}

/// Run a code snippet through an interpreter in the session's sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    pub code: String,
    #[serde(default)]
    pub language: CodeLanguage,
    /// Seconds.
    #[serde(default)]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
}

/// Read a background task's new output, optionally waiting for a pattern.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskOutputArgs {
    pub task_id: String,
    /// A regex to wait for in the output.
    #[serde(default)]
    pub wait_for_pattern: Option<String>,
    /// Seconds to wait, at most 300.
    #[serde(default)]
    #[schemars(range(min = 0, max = 300))]
    pub timeout: Option<u64>,
}

/// Feed a background task's standard input.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskInputArgs {
    pub task_id: String,
    pub input: String,
}

/// Name a background task.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskIdArgs {
    pub task_id: String,
}

// ---------------------------------------------------------------- web

/// Fetch a public URL as text (SSRF-safe).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebFetchArgs {
    #[schemars(length(min = 1))]
    pub url: String,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_chars: Option<u64>,
    /// Seconds.
    #[serde(default = "thirty")]
    #[schemars(range(min = 1, max = 300))]
    pub timeout: u64,
}
fn thirty() -> u64 {
    30
}

/// Search the web through the configured provider.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSearchArgs {
    #[schemars(length(min = 1))]
    pub query: String,
    #[serde(default = "five")]
    #[schemars(range(min = 1, max = 50))]
    pub max_results: u64,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub recency_days: Option<u64>,
}
fn five() -> u64 {
    5
}
