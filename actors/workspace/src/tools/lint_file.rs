//! `lint_workspace_file`: lightweight built-in checks of one file ([`crate::lint`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::{budget, ErrorCode, ToolError};

use crate::confine::{self, WorkspacePath};
use crate::lint;
use crate::service::{object, WorkspaceService, EDIT_MAX_BYTES};

impl Tool<WorkspaceService> for LintFile {
    const DEF: &'static ToolDef = &crate::service::FOCUSED.named("lint_workspace_file");

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let fields_limit = call.fields_limit;
        let path = WorkspacePath::parse(&self.path, "path")?;
        service
            .blocking(call, move |ws| {
                let bytes = confine::read(ws, &path, EDIT_MAX_BYTES)?;
                let report = lint::lint(&path.display(), &bytes, self.language.into());
                let failed = lint::has_errors(&report);
                let mut fields = object(json!({
                    "path": path.display(),
                    "language": report.language,
                    "issues": report.issues,
                    "lint_model": lint::LINT_MODEL,
                }));
                // An error's envelope (code, message) takes a little more: leave it room.
                budget::fit_list(&mut fields, "issues", fields_limit.saturating_sub(512));
                if failed {
                    let errors = report
                        .issues
                        .iter()
                        .filter(|i| i.level == lint::LintLevel::Error)
                        .count();
                    return Err(ToolError::new(
                        ErrorCode::LintErrors,
                        format!(
                            "{} has {errors} error-level issue(s); see issues",
                            path.display()
                        ),
                    )
                    .with_details(fields));
                }
                Ok(fields)
            })
            .await
    }
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

impl From<LintLanguage> for lint::Language {
    fn from(language: LintLanguage) -> Self {
        match language {
            LintLanguage::Auto => lint::Language::Auto,
            LintLanguage::Python => lint::Language::Python,
            LintLanguage::Json => lint::Language::Json,
            LintLanguage::Markdown => lint::Language::Markdown,
            LintLanguage::Text => lint::Language::Text,
        }
    }
}

/// Lightweight built-in checks of one file: Python syntax, JSON syntax, NUL bytes and trailing
/// whitespace.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LintFile {
    pub path: String,
    #[serde(default)]
    pub language: LintLanguage,
}
