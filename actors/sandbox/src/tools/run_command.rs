//! `run_command`: a shell command in the session's sandbox, in the foreground or as a
//! background task.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::ToolError;

use crate::backend::ExecSpec;
use crate::service::{
    check_env, short_id, Placed, Placement, SandboxTool, EXECUTING, IN_SANDBOX, WORKSPACE_MOUNT,
};
use crate::tasks::TaskStatus;

impl Tool<Placed> for RunCommand {
    const DEF: &'static ToolDef = &EXECUTING.named("run_command");

    async fn run(self, placed: &Placed, call: &ToolCall<'_>) -> ToolResult {
        let (service, session) = (&placed.service, placed.sandbox()?);
        let cwd = resolve_cwd(self.cwd.as_deref())?;
        let env = self.env.unwrap_or_default();
        check_env(&env)?;
        let timeout = service.timeout(self.timeout);
        let exec_id = format!("exec-{}", short_id());
        let spec = ExecSpec {
            argv: vec!["sh".into(), "-c".into(), self.command.clone()],
            cwd: cwd.clone(),
            env,
            stdin: self.background,
            exec_id: exec_id.clone(),
        };
        let mut fields = service.base_fields(session, &self.command);
        fields.insert("cwd".into(), cwd.into());
        if self.background {
            let ((), execution) = service
                .start_after(session, spec, service.pull(session))
                .await?;
            let task_id = format!("task-{}", short_id());
            let task = session
                .tasks
                .start(
                    task_id.clone(),
                    self.command.clone(),
                    execution,
                    service.task_spool_settings(call, session),
                )
                .map_err(|refused| {
                    let (error, execution) = *refused;
                    let kill = execution.kill.clone();
                    tokio::spawn(async move { kill.kill().await });
                    error
                })?;
            fields.insert("background".into(), true.into());
            fields.insert("task_id".into(), task_id.into());
            fields.insert("status".into(), TaskStatus::Running.as_str().into());
            fields.insert("started_at".into(), task.started_at.clone().into());
            return Ok(fields);
        }
        let (outcome, sync) = service
            .run_foreground(call, session, spec, None, timeout)
            .await?;
        service.finish(call, fields, outcome, sync, timeout).await
    }
}

impl SandboxTool for RunCommand {
    const PLACEMENT: &'static Placement = &IN_SANDBOX;
}

/// Run a shell command in the session's sandbox, in the foreground or as a background task.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
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
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}

/// `cwd` relative to `/workspace` unless absolute; no NUL, no climbing above `/workspace` when
/// relative (an absolute path elsewhere in the sandbox is the caller's choice).
fn resolve_cwd(cwd: Option<&str>) -> Result<String, ToolError> {
    let Some(cwd) = cwd.filter(|c| !c.is_empty()) else {
        return Ok(WORKSPACE_MOUNT.to_owned());
    };
    if cwd.contains('\0') {
        return Err(ToolError::invalid_argument(
            "/cwd",
            "cwd contains a NUL byte",
        ));
    }
    if cwd.starts_with('/') {
        return Ok(cwd.to_owned());
    }
    if cwd.split('/').any(|part| part == "..") {
        return Err(ToolError::invalid_argument(
            "/cwd",
            "a relative cwd may not climb with ..; give an absolute path instead",
        ));
    }
    Ok(format!("{WORKSPACE_MOUNT}/{}", cwd.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmesh_kernel::ErrorCode;

    #[test]
    fn cwd_is_relative_to_the_workspace_unless_absolute() {
        assert_eq!(resolve_cwd(None).unwrap(), "/workspace");
        assert_eq!(resolve_cwd(Some("src/")).unwrap(), "/workspace/src");
        assert_eq!(resolve_cwd(Some("/tmp")).unwrap(), "/tmp");
        assert_eq!(
            resolve_cwd(Some("../etc")).unwrap_err().code,
            ErrorCode::InvalidArguments
        );
        assert_eq!(
            resolve_cwd(Some("a\0b")).unwrap_err().code,
            ErrorCode::InvalidArguments
        );
    }
}
