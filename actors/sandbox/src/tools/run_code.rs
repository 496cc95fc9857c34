//! `run_code`: a Python, JavaScript or Bash snippet in the session's sandbox.

use std::collections::BTreeMap;

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::ToolError;

use crate::backend::ExecSpec;
use crate::service::{
    check_env, short_id, Placed, Placement, SandboxTool, EXECUTING, IN_SANDBOX, WORKSPACE_MOUNT,
};

impl Tool<Placed> for RunCode {
    const DEF: &'static ToolDef = &EXECUTING.named("run_code");

    async fn run(self, placed: &Placed, call: &ToolCall<'_>) -> ToolResult {
        let (service, session) = (&placed.service, placed.sandbox()?);
        let env = self.env.unwrap_or_default();
        check_env(&env)?;
        let timeout = service.timeout(self.timeout);
        let (language, interpreter, ext) = match self.language {
            CodeLanguage::Python => ("python", "python3", "py"),
            CodeLanguage::Javascript => ("javascript", "node", "js"),
            CodeLanguage::Bash => ("bash", "bash", "sh"),
        };
        let path = format!("/tmp/toolmesh-run-code-{}.{ext}", short_id());
        // The snippet arrives on stdin, so its size is bounded by nothing but NATS; the
        // interpreter check gives a clear error instead of "sh: 1: node: not found".
        let script = format!(
            "command -v {interpreter} >/dev/null 2>&1 || {{ echo \"{MISSING_INTERPRETER} {interpreter}\" >&2; exit 127; }}; cat > \"$0\" && exec {interpreter} \"$0\""
        );
        let command = format!("{interpreter} {path}");
        let spec = ExecSpec {
            argv: vec!["sh".into(), "-c".into(), script, path.clone()],
            cwd: WORKSPACE_MOUNT.to_owned(),
            env,
            stdin: true,
            exec_id: format!("exec-{}", short_id()),
        };
        let (outcome, sync) = service
            .run_foreground(call, session, spec, Some(Bytes::from(self.code)), timeout)
            .await?;
        if outcome.exit_code == Some(127) && outcome.stderr.preview.contains(MISSING_INTERPRETER) {
            return Err(ToolError::invalid_argument(
                "/language",
                format!(
                    "the sandbox image has no {language} interpreter ({interpreter}); use another language or an image that has it (TOOLMESH_SANDBOX_IMAGE)"
                ),
            ));
        }
        let mut fields = service.base_fields(session, &command);
        fields.insert("execution_model".into(), "snippet_runner".into());
        fields.insert(
            "boundary".into(),
            service.boundary(&session.template).into(),
        );
        fields.insert("language".into(), language.into());
        fields.insert("path".into(), path.into());
        service.finish(call, fields, outcome, sync, timeout).await
    }
}

impl SandboxTool for RunCode {
    const PLACEMENT: &'static Placement = &IN_SANDBOX;
}

/// Marks the line a snippet runner prints when the image lacks the interpreter.
const MISSING_INTERPRETER: &str = "toolmesh: missing interpreter";

/// Interpreters of `run_code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CodeLanguage {
    #[default]
    Python,
    Javascript,
    Bash,
}

/// Run a Python, JavaScript or Bash snippet in the session's sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    pub code: String,
    #[serde(default)]
    pub language: CodeLanguage,
    /// Seconds.
    #[serde(default)]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}
