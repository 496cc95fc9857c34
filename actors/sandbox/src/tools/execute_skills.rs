//! `execute_skills`: a workflow prompt run by the skill runner in the session's sandbox, with
//! the named skills under `/skills`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::skills::SkillBundles;
use toolmesh_kernel::tools::args::OneOrMany;
use toolmesh_kernel::tools::{parse_args, BuiltinGroup, Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::backend::ExecSpec;
use crate::service::{
    short_id, Placed, Placement, SandboxService, SandboxTool, SANDBOX, WORKSPACE_MOUNT,
};
use crate::templates::Template;

impl Tool<Placed> for ExecuteSkills {
    const DEF: &'static ToolDef = &SANDBOX
        .named("execute_skills")
        .in_group(BuiltinGroup::Skills)
        .risk(RiskLevel::High, &[SideEffect::IsolatedRuntimeExecution]);

    async fn run(self, placed: &Placed, call: &ToolCall<'_>) -> ToolResult {
        let (service, session) = (&placed.service, placed.sandbox()?);
        // The skills are installed into the sandbox before its command, so after its claim.
        session.claimed().await?;
        let runner = service.skill_runner.clone().ok_or_else(|| {
            ToolError::internal("execute_skills reached a worker without a runner")
        })?;
        let names = self
            .skill_names
            .map(OneOrMany::into_vec)
            .unwrap_or_default();
        let timeout = service.timeout(self.timeout);
        if !names.is_empty() {
            let bundles = SkillBundles::fetch(&service.client, &names).await?;
            let dir = crate::backend::skills_dir_of(&session.sandbox.workspace_dir);
            tokio::task::spawn_blocking(move || crate::skills::install(&dir, &bundles))
                .await
                .map_err(crate::skills::InstallError::Task)??;
        }
        let mut env = BTreeMap::new();
        // The environment cannot carry an unbounded prompt (execve caps one string at 128
        // KiB); stdin always has the whole of it.
        if self.workflow_prompt.len() <= MAX_PROMPT_IN_ENV {
            env.insert(
                "TOOLMESH_WORKFLOW_PROMPT".to_owned(),
                self.workflow_prompt.clone(),
            );
        }
        env.insert("TOOLMESH_SKILL_NAMES".to_owned(), names.join(","));
        env.insert(
            "TOOLMESH_SKILLS_DIR".to_owned(),
            crate::backend::SKILLS_MOUNT.to_owned(),
        );
        let spec = ExecSpec {
            argv: vec!["sh".into(), "-c".into(), runner.clone()],
            cwd: WORKSPACE_MOUNT.to_owned(),
            env,
            stdin: true,
            exec_id: format!("exec-{}", short_id()),
        };
        let (outcome, sync) = service
            .run_foreground(
                call,
                session,
                spec,
                Some(Bytes::from(self.workflow_prompt)),
                timeout,
            )
            .await?;
        let output_files = sync.get("changed").cloned().unwrap_or_else(|| json!([]));
        let exit_code = outcome.exit_code;
        let mut fields = service.base_fields(session, &runner);
        fields.insert(
            "execution_context".into(),
            format!("skill-runtime/{}", service.backend_name()).into(),
        );
        fields.insert("skill_names".into(), json!(names));
        fields.insert("output_files".into(), output_files);
        service
            .finish(call, fields, outcome, sync, timeout)
            .await
            .and_then(|fields| match exit_code {
                Some(0) => Ok(fields),
                code => Err(ToolError::new(
                    ErrorCode::CommandFailed,
                    format!(
                        "the skill runner exited with {}; its output is in stdout/stderr",
                        code.map_or("no exit code".to_owned(), |c| format!("code {c}"))
                    ),
                )
                .with_details(fields)),
            })
    }
}

impl SandboxTool for ExecuteSkills {
    const PLACEMENT: &'static Placement = &Placement {
        creates_sandbox: true,
        template: template_of,
        precheck: Some(precheck),
    };
}

/// Refused on a worker without a skill runner, before a sandbox is made for the session.
fn precheck(service: &SandboxService) -> Result<(), ToolError> {
    if service.skill_runner.is_none() {
        return Err(ToolError::new(
            ErrorCode::SkillRuntimeDisabled,
            "no skill runner is configured on the sandbox workers",
        )
        .with(
            "hint",
            "set TOOLMESH_SKILL_RUNNER_COMMAND on the sandbox workers to the command that runs a workflow (it gets the prompt on stdin and in TOOLMESH_WORKFLOW_PROMPT, the skill names in TOOLMESH_SKILL_NAMES, the skills under /skills); meanwhile load_skill returns a skill's instructions",
        ));
    }
    Ok(())
}

/// The template the named skills' `requires_sandbox` names; `None` when none names one. Two
/// skills naming different templates, or one naming a template the workers do not have, are
/// `invalid_arguments`.
fn template_of<'a>(
    service: &'a SandboxService,
    arguments: &'a serde_json::Value,
) -> BoxFuture<'a, Result<Option<Arc<Template>>, ToolError>> {
    Box::pin(skills_template(service, arguments))
}

async fn skills_template(
    service: &SandboxService,
    arguments: &serde_json::Value,
) -> Result<Option<Arc<Template>>, ToolError> {
    let a: ExecuteSkills = parse_args(arguments)?;
    let names = a.skill_names.map(OneOrMany::into_vec).unwrap_or_default();
    if names.is_empty() {
        return Ok(None);
    }
    let heads = SkillBundles::heads(&service.client, &names).await?;
    let mut chosen: Option<(String, String)> = None;
    for head in heads {
        let Some(wanted) = head.sandbox_template else {
            continue;
        };
        match &chosen {
            Some((template, skill)) if *template != wanted => {
                return Err(ToolError::invalid_argument(
                    "/skill_names",
                    format!(
                        "skill {skill:?} needs the sandbox template {template:?} and skill {:?} needs {wanted:?}; run them in separate calls",
                        head.name
                    ),
                ))
            }
            Some(_) => {}
            None => chosen = Some((wanted, head.name)),
        }
    }
    let Some((template, skill)) = chosen else {
        return Ok(None);
    };
    let templates = &service.pool.settings.templates;
    match templates.get(&template) {
        Some(found) => Ok(Some(found.clone())),
        None => Err(ToolError::invalid_argument(
            "/skill_names",
            format!(
                "skill {skill:?} requires the sandbox template {template:?}, which the sandbox workers do not have ({})",
                templates.names().join(", ")
            ),
        )
        .with("available_templates", templates.names())),
    }
}

/// The workflow prompt goes into the environment only up to this size (stdin always has it).
const MAX_PROMPT_IN_ENV: usize = 100 * 1024;

/// Run a workflow prompt with the named skills inside the session's sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteSkills {
    #[schemars(length(min = 1))]
    pub workflow_prompt: String,
    #[serde(default)]
    pub skill_names: Option<OneOrMany>,
    /// Seconds.
    #[serde(default)]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout: Option<u64>,
}
