//! The sandbox tools of PROTOCOL.md on one worker: `sandbox_status`, `run_command`,
//! `run_code`, `list_tasks`, `task_output`, `task_input`, `kill_task`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use toolmesh_kernel::budget;
use toolmesh_kernel::host::CancelWatch;
use toolmesh_kernel::skills::SkillBundles;
use toolmesh_kernel::tools::args::{
    CodeLanguage, ExecuteSkillsArgs, OneOrMany, RunCodeArgs, RunCommandArgs, TaskIdArgs,
    TaskInputArgs, TaskOutputArgs,
};
use toolmesh_kernel::wire::ActorCall;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::backend::{BackendError, ExecSpec, Execution, StartGate};
use crate::exec::{run_to_end, CommandOutcome, EventSink};
use crate::output::{
    persisted_entry, spool_dir_of, Cap, Captured, Handover, Part, Quota, SpoolSettings,
};
use crate::pool::{backend_error, Pool, Session, SessionUse};
use crate::tasks::TaskStatus;

/// Where inside the sandbox the session's workspace is.
pub const WORKSPACE_MOUNT: &str = "/workspace";
/// Where results over the budget are persisted, inside the workspace.
pub const OUTPUTS_DIR: &str = ".toolmesh/outputs";
/// `task_output` waits this long for a pattern when the call names no timeout.
const DEFAULT_PATTERN_WAIT: Duration = Duration::from_secs(30);
/// The workflow prompt goes into the environment only up to this size (stdin always has it).
const MAX_PROMPT_IN_ENV: usize = 100 * 1024;
/// Marks the line a snippet runner prints when the image lacks the interpreter.
const MISSING_INTERPRETER: &str = "toolmesh: missing interpreter";

pub struct SandboxService {
    pub pool: Arc<Pool>,
    pub client: Client,
    pub budget_chars: usize,
    pub default_timeout: Duration,
    /// `TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES`: text of one output stream spooled and persisted.
    pub output_max_bytes: u64,
    /// `TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES`: unread task output one session keeps.
    pub session_output_max_bytes: u64,
    /// `TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES`: unread task output this worker keeps.
    pub worker_output: Arc<Quota>,
    /// Task output handed to workspaces at once on this worker (`Handover::worker_slots`).
    pub handovers: Arc<tokio::sync::Semaphore>,
    /// The image (`template_id` in `sandbox_status`).
    pub image: String,
    /// `TOOLMESH_SKILL_RUNNER_COMMAND`.
    pub skill_runner: Option<String>,
}

impl std::fmt::Debug for SandboxService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxService").finish_non_exhaustive()
    }
}

/// A tool's reply (fields or error) and how many events it published.
#[derive(Debug)]
pub struct Answer {
    pub result: Result<Map<String, Value>, ToolError>,
    pub events: u64,
}

impl Answer {
    /// A failure before the tool produced an answer of its own.
    pub fn failed(error: ToolError) -> Self {
        Answer {
            result: Err(error),
            events: 0,
        }
    }
}

impl From<Result<Answer, ToolError>> for Answer {
    fn from(result: Result<Answer, ToolError>) -> Self {
        result.unwrap_or_else(Answer::failed)
    }
}

impl From<Result<Map<String, Value>, ToolError>> for Answer {
    fn from(result: Result<Map<String, Value>, ToolError>) -> Self {
        Answer { result, events: 0 }
    }
}

/// Tools that create the session's sandbox when it has none yet.
pub fn creates_sandbox(tool: &str) -> bool {
    matches!(tool, "run_command" | "run_code" | "execute_skills")
}

fn args<T: DeserializeOwned>(call: &ActorCall) -> Result<T, ToolError> {
    serde_json::from_value(call.arguments.clone())
        .map_err(|e| ToolError::new(ErrorCode::InvalidArguments, e.to_string()))
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
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

fn check_env(env: &BTreeMap<String, String>) -> Result<(), ToolError> {
    for (name, value) in env {
        let valid = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(ToolError::invalid_argument(
                &format!("/env/{name}"),
                "an environment variable name is letters, digits and _, not starting with a digit",
            ));
        }
        if value.contains('\0') {
            return Err(ToolError::invalid_argument(
                &format!("/env/{name}"),
                "an environment value may not contain a NUL byte",
            ));
        }
        if name.starts_with("TOOLMESH_EXEC_") {
            return Err(ToolError::invalid_argument(
                &format!("/env/{name}"),
                "TOOLMESH_EXEC_* names are reserved",
            ));
        }
    }
    Ok(())
}

fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

impl SandboxService {
    pub fn backend_name(&self) -> &'static str {
        self.pool.backend.wire_name()
    }

    /// Refusals that need no sandbox (checked before one is created for the session).
    pub fn precheck(&self, call: &ActorCall) -> Result<(), ToolError> {
        if call.tool == "execute_skills" && self.skill_runner.is_none() {
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

    pub async fn run(&self, call: &ActorCall, session: Option<SessionUse>) -> Answer {
        if !creates_sandbox(&call.tool) {
            return self.run_quick(call, session).await.into();
        }
        let Some(session) = session else {
            return Answer::failed(no_session());
        };
        let answer = async {
            match call.tool.as_str() {
                "execute_skills" => self.execute_skills(call, &session, args(call)?).await,
                "run_command" => self.run_command(call, &session, args(call)?).await,
                _ => self.run_code(call, &session, args(call)?).await,
            }
        };
        answer.await.into()
    }

    /// The tools that publish no events.
    async fn run_quick(
        &self,
        call: &ActorCall,
        session: Option<SessionUse>,
    ) -> Result<Map<String, Value>, ToolError> {
        match call.tool.as_str() {
            "sandbox_status" => Ok(self.status(session.as_deref().map(Arc::as_ref))),
            "list_tasks" => Ok(self.list_tasks(session.as_deref().map(Arc::as_ref))),
            "task_output" => {
                let a: TaskOutputArgs = args(call)?;
                let session = session.ok_or_else(|| no_task(&a.task_id))?;
                self.task_output(call, &session, a).await
            }
            "task_input" => {
                let a: TaskInputArgs = args(call)?;
                let session = session.ok_or_else(|| no_task(&a.task_id))?;
                let task = session.tasks.get(&a.task_id)?;
                task.write_input(&a.input).await?;
                Ok(object(json!({
                    "task_id": a.task_id,
                    "bytes_written": a.input.len(),
                    "status": task.status().0.as_str(),
                })))
            }
            "kill_task" => {
                let a: TaskIdArgs = args(call)?;
                let session = session.ok_or_else(|| no_task(&a.task_id))?;
                let task = session.tasks.get(&a.task_id)?;
                let killed = task.kill().await;
                self.push_quietly(&session).await;
                let (status, exit_code) = task.status();
                Ok(object(json!({
                    "task_id": a.task_id,
                    "killed": killed,
                    "status": status.as_str(),
                    "exit_code": exit_code,
                })))
            }
            other => Err(ToolError::new(
                ErrorCode::UnknownTool,
                format!("the sandbox actor has no tool {other:?}"),
            )),
        }
    }

    fn status(&self, session: Option<&Session>) -> Map<String, Value> {
        let settings = &self.pool.settings;
        let idle_ttl = settings.idle_ttl.as_secs();
        let mut fields = object(json!({
            "backend": self.backend_name(),
            "enabled": true,
            "isolated": true,
            "template_bound": false,
            "template_id": self.image,
            "timeout_seconds": self.default_timeout.as_secs(),
            "ttl_seconds": Value::Null,
            "idle_ttl_seconds": idle_ttl,
            "max_sessions": settings.max_sessions,
            "sandbox_id": Value::Null,
            "created_at": Value::Null,
            "last_used_at": Value::Null,
            "expires_at": Value::Null,
            "idle_seconds": Value::Null,
            "boundary": self.pool.backend.boundary(),
            "node_id": settings.node.as_str(),
            "limits": {
                "memory_mb": settings.limits.memory_mb,
                "pids": settings.limits.pids,
                "cpus": settings.limits.cpus,
                "network": settings.limits.network,
            },
        }));
        if let Some(session) = session {
            let (last_used, last_used_ms) = session.last_used();
            let idle = last_used.elapsed().as_secs();
            let ms = toolmesh_kernel::time::ms_to_rfc3339;
            fields.insert(
                "sandbox_id".into(),
                session.sandbox.sandbox_id.clone().into(),
            );
            fields.insert("created_at".into(), ms(session.created_at_ms).into());
            fields.insert("last_used_at".into(), ms(last_used_ms).into());
            fields.insert(
                "expires_at".into(),
                ms(last_used_ms + idle_ttl * 1000).into(),
            );
            fields.insert("idle_seconds".into(), idle.into());
        }
        fields
    }

    /// Pulls the workspace into the sandbox (before a command). The manifest changes nothing
    /// here, so it is asked for while a new session's claim is still on its way; the files
    /// are written only once the claim holds.
    async fn pull(&self, session: &Session) -> Result<(), ToolError> {
        let mut mirror = session.mirror.lock().await;
        let (claimed, manifest) = tokio::join!(session.claimed(), mirror.manifest());
        claimed?;
        mirror.pull_listed(manifest?).await.map(|_| ())
    }

    /// Pushes what the command changed back to the workspace; the reply's `workspace_sync`.
    async fn push(&self, session: &Session) -> Value {
        match session.mirror.lock().await.push().await {
            Ok(report) => {
                let cap = |v: Vec<String>| v.into_iter().take(100).collect::<Vec<_>>();
                json!({
                    "changed": cap(report.changed),
                    "deleted": cap(report.deleted),
                    "conflicts": cap(report.conflicts),
                    "skipped": report.skipped,
                    "truncated": report.truncated,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot sync the sandbox back to the workspace");
                e.brief()
            }
        }
    }

    async fn push_quietly(&self, session: &Session) {
        let _ = self.push(session).await;
    }

    /// How a session's output streams are spooled on this worker.
    fn spool_settings(&self, session: &Session) -> SpoolSettings {
        SpoolSettings {
            dir: spool_dir_of(&session.sandbox.workspace_dir),
            preview_chars: self.budget_chars,
            max_bytes: self.output_max_bytes,
            quotas: Vec::new(),
            handover: None,
        }
    }

    /// How a session's background tasks spool their unread output: within the session's
    /// and the worker's caps too, handing it to the workspace when one of them fills up.
    fn task_spool_settings(&self, session: &Session) -> SpoolSettings {
        SpoolSettings {
            quotas: vec![
                session.tasks.quota(self.session_output_max_bytes),
                self.worker_output.clone(),
            ],
            handover: Some(Handover::to_workspace(
                self.pool.sync().clone(),
                session.account.clone(),
                session.session_id.clone(),
                self.handovers.clone(),
            )),
            ..self.spool_settings(session)
        }
    }

    /// Puts a stream's preview and its budget companions; over the budget the whole stream
    /// (its spool file) is persisted in the session's workspace and named in
    /// `persisted_outputs`, with `truncated: true` and `max_bytes` when it passed the cap.
    async fn put_output(
        &self,
        call: &ActorCall,
        session: &Session,
        fields: &mut Map<String, Value>,
        field: &str,
        output: Captured,
    ) {
        let stream_cap = output.cap == Some(Cap::Stream);
        let truncated = output.dropped_bytes() > 0;
        let cut = budget::Cut {
            preview: output.preview,
            original_chars: usize::try_from(output.chars).unwrap_or(usize::MAX),
            truncated: output.truncated,
        };
        if !budget::insert_cut(fields, field, cut) {
            return;
        }
        let mut parts = output.parts; // a task's first parts, already in the workspace
                                      // The text after the parts (all of it when there are none), unless that is nothing.
        if let Some(file) = output.file.filter(|f| f.bytes > 0 || parts.is_empty()) {
            let path = format!(
                "{OUTPUTS_DIR}/{}-{field}.txt",
                call.invocation.invocation_id
            );
            let persisted = self
                .pool
                .sync()
                .put_from(
                    &session.account,
                    &session.session_id,
                    &path,
                    file.bytes,
                    file.handle(),
                )
                .await;
            match persisted {
                Ok(()) => parts.push(Part {
                    path,
                    bytes: file.bytes,
                }),
                Err(e) => tracing::warn!(error = %e, "cannot persist an over-budget output"),
            }
        }
        let max_bytes = stream_cap.then_some(self.output_max_bytes);
        if let Some(persisted) = persisted_entry(&parts, truncated, max_bytes) {
            let entry = fields
                .entry("persisted_outputs")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(map) = entry {
                map.insert(field.to_owned(), persisted);
            }
        }
    }

    /// Starts `spec` once the session's claim holds and `before` succeeded, with the backend's
    /// own preparation (Docker creating the exec: about a millisecond) done meanwhile; nothing
    /// starts when either fails.
    async fn start_after<T>(
        &self,
        session: &Session,
        spec: ExecSpec,
        before: impl std::future::Future<Output = Result<T, ToolError>>,
    ) -> Result<(T, Execution), ToolError> {
        let (opener, gate) = StartGate::closed();
        let before = async move {
            let done = before.await;
            // Whatever `before` is, the command starts only in a session this worker holds.
            session.claimed().await?;
            if done.is_ok() {
                opener.open();
            }
            done
        };
        let exec = self.pool.backend.exec(&session.sandbox, spec, gate);
        let (done, execution) = tokio::join!(before, exec);
        let done = done?;
        match execution {
            Ok(execution) => Ok((done, execution)),
            Err(e) => {
                if matches!(e, BackendError::Gone(_)) {
                    self.pool.remove_gone(session).await;
                }
                Err(backend_error(e))
            }
        }
    }

    /// Runs one foreground process to its end: pull, exec (under the worker's concurrency
    /// cap), push. Returns the outcome, the sync report and the events it published.
    async fn run_foreground(
        &self,
        call: &ActorCall,
        session: &Session,
        spec: ExecSpec,
        stdin: Option<Bytes>,
        timeout: Duration,
    ) -> Result<(CommandOutcome, Value, u64), ToolError> {
        let before = async {
            self.pull(session).await?;
            let mut cancel = CancelWatch::listen(
                &self.client,
                &call.invocation.account,
                &call.invocation.invocation_id,
            )
            .await;
            // Wait for a slot in arrival order (a burst is queued, not failed).
            let permit = tokio::select! {
                permit = self.pool.permits.clone().acquire_owned() => permit.map_err(|_| ToolError::new(ErrorCode::Cancelled, "the sandbox worker is shutting down"))?,
                _ = cancel.requested() => return Err(ToolError::new(ErrorCode::Cancelled, "cancelled before the command started")),
            };
            Ok((cancel, permit))
        };
        let label = spec.exec_id.clone();
        let ((mut cancel, permit), execution) = self.start_after(session, spec, before).await?;
        let mut events = EventSink::new(&self.client, &call.invocation, &call.tool, call.event_seq);
        let spool = self.spool_settings(session);
        let outcome = run_to_end(
            execution,
            &spool,
            &label,
            stdin,
            timeout,
            &mut events,
            &mut cancel,
        )
        .await;
        drop(permit);
        let sync = self.push(session).await;
        Ok((outcome, sync, events.emitted))
    }

    async fn finish(
        &self,
        call: &ActorCall,
        session: &Session,
        mut fields: Map<String, Value>,
        outcome: CommandOutcome,
        sync: Value,
        timeout: Duration,
    ) -> Result<Map<String, Value>, ToolError> {
        self.put_output(call, session, &mut fields, "stdout", outcome.stdout)
            .await;
        self.put_output(call, session, &mut fields, "stderr", outcome.stderr)
            .await;
        fields.insert("exit_code".into(), outcome.exit_code.into());
        fields.insert("timed_out".into(), outcome.timed_out.into());
        fields.insert("duration_ms".into(), outcome.duration_ms.into());
        fields.insert("workspace_sync".into(), sync);
        if outcome.cancelled {
            let mut error = ToolError::new(
                ErrorCode::Cancelled,
                "the command was cancelled; its processes were killed",
            );
            error.details = fields;
            return Err(error);
        }
        if outcome.timed_out {
            let mut error = ToolError::new(
                ErrorCode::Timeout,
                format!(
                    "the command ran past its timeout of {} s and was killed; the output so far is in stdout/stderr",
                    timeout.as_secs()
                ),
            );
            error.details = fields;
            return Err(error);
        }
        Ok(fields)
    }

    fn base_fields(&self, session: &Session, command: &str) -> Map<String, Value> {
        object(json!({
            "backend": self.backend_name(),
            "sandbox_id": session.sandbox.sandbox_id,
            "command": command,
        }))
    }

    async fn run_command(
        &self,
        call: &ActorCall,
        session: &Session,
        a: RunCommandArgs,
    ) -> Result<Answer, ToolError> {
        let cwd = resolve_cwd(a.cwd.as_deref())?;
        let env = a.env.unwrap_or_default();
        check_env(&env)?;
        let timeout = a
            .timeout
            .map(Duration::from_secs)
            .unwrap_or(self.default_timeout);
        let exec_id = format!("exec-{}", short_id());
        let spec = ExecSpec {
            argv: vec!["sh".into(), "-c".into(), a.command.clone()],
            cwd: cwd.clone(),
            env,
            stdin: a.background,
            exec_id: exec_id.clone(),
        };
        let mut fields = self.base_fields(session, &a.command);
        fields.insert("cwd".into(), cwd.into());
        if a.background {
            let ((), execution) = self.start_after(session, spec, self.pull(session)).await?;
            let task_id = format!("task-{}", short_id());
            let task = session
                .tasks
                .start(
                    task_id.clone(),
                    a.command.clone(),
                    execution,
                    self.task_spool_settings(session),
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
            return Ok(Ok(fields).into());
        }
        let (outcome, sync, events) = self
            .run_foreground(call, session, spec, None, timeout)
            .await?;
        let result = self
            .finish(call, session, fields, outcome, sync, timeout)
            .await;
        Ok(Answer { result, events })
    }

    async fn run_code(
        &self,
        call: &ActorCall,
        session: &Session,
        a: RunCodeArgs,
    ) -> Result<Answer, ToolError> {
        let env = a.env.unwrap_or_default();
        check_env(&env)?;
        let timeout = a
            .timeout
            .map(Duration::from_secs)
            .unwrap_or(self.default_timeout);
        let (language, interpreter, ext) = match a.language {
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
        let (outcome, sync, events) = self
            .run_foreground(call, session, spec, Some(Bytes::from(a.code)), timeout)
            .await?;
        if outcome.exit_code == Some(127) && outcome.stderr.preview.contains(MISSING_INTERPRETER) {
            let result = Err(ToolError::invalid_argument(
                "/language",
                format!(
                    "the sandbox image has no {language} interpreter ({interpreter}); use another language or an image that has it (TOOLMESH_SANDBOX_IMAGE)"
                ),
            ));
            return Ok(Answer { result, events });
        }
        let mut fields = self.base_fields(session, &command);
        fields.insert("execution_model".into(), "snippet_runner".into());
        fields.insert("boundary".into(), self.pool.backend.boundary().into());
        fields.insert("language".into(), language.into());
        fields.insert("path".into(), path.into());
        let result = self
            .finish(call, session, fields, outcome, sync, timeout)
            .await;
        Ok(Answer { result, events })
    }

    /// Runs the skill runner in the session's sandbox with the named skills under `/skills`.
    /// `ok` only when it exits 0 in time; a non-zero exit is `command_failed` with the same
    /// fields (seed 001's SkillRuntimeResult).
    async fn execute_skills(
        &self,
        call: &ActorCall,
        session: &Session,
        a: ExecuteSkillsArgs,
    ) -> Result<Answer, ToolError> {
        // The skills are installed into the sandbox before its command, so after its claim.
        session.claimed().await?;
        let runner = self.skill_runner.clone().ok_or_else(|| {
            ToolError::internal("execute_skills reached a worker without a runner")
        })?;
        let names = a.skill_names.map(OneOrMany::into_vec).unwrap_or_default();
        let timeout = a
            .timeout
            .map(Duration::from_secs)
            .unwrap_or(self.default_timeout);
        if !names.is_empty() {
            let bundles = SkillBundles::fetch(&self.client, &names).await?;
            let dir = crate::backend::skills_dir_of(&session.sandbox.workspace_dir);
            tokio::task::spawn_blocking(move || crate::skills::install(&dir, &bundles))
                .await
                .map_err(|e| ToolError::internal(format!("installing skills: {e}")))??;
        }
        let mut env = BTreeMap::new();
        // The environment cannot carry an unbounded prompt (execve caps one string at 128
        // KiB); stdin always has the whole of it.
        if a.workflow_prompt.len() <= MAX_PROMPT_IN_ENV {
            env.insert(
                "TOOLMESH_WORKFLOW_PROMPT".to_owned(),
                a.workflow_prompt.clone(),
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
        let (outcome, sync, events) = self
            .run_foreground(
                call,
                session,
                spec,
                Some(Bytes::from(a.workflow_prompt)),
                timeout,
            )
            .await?;
        let output_files = sync.get("changed").cloned().unwrap_or_else(|| json!([]));
        let exit_code = outcome.exit_code;
        let mut fields = self.base_fields(session, &runner);
        fields.insert(
            "execution_context".into(),
            format!("skill-runtime/{}", self.backend_name()).into(),
        );
        fields.insert("skill_names".into(), json!(names));
        fields.insert("output_files".into(), output_files);
        let result = self
            .finish(call, session, fields, outcome, sync, timeout)
            .await
            .and_then(|fields| match exit_code {
                Some(0) => Ok(fields),
                code => {
                    let mut error = ToolError::new(
                        ErrorCode::CommandFailed,
                        format!(
                            "the skill runner exited with {}; its output is in stdout/stderr",
                            code.map_or("no exit code".to_owned(), |c| format!("code {c}"))
                        ),
                    );
                    error.details = fields;
                    Err(error)
                }
            });
        Ok(Answer { result, events })
    }

    fn list_tasks(&self, session: Option<&Session>) -> Map<String, Value> {
        let tasks: Vec<Value> = session
            .map(|s| s.tasks.list())
            .unwrap_or_default()
            .iter()
            .map(|t| {
                let (status, exit_code) = t.status();
                json!({
                    "task_id": t.task_id,
                    "command": t.command,
                    "status": status.as_str(),
                    "started_at": t.started_at,
                    "exit_code": exit_code,
                })
            })
            .collect();
        let mut fields = object(json!({ "tasks": tasks }));
        budget::fit_list(
            &mut fields,
            "tasks",
            budget::fields_limit(self.client.max_payload()),
        );
        fields
    }

    async fn task_output(
        &self,
        call: &ActorCall,
        session: &Session,
        a: TaskOutputArgs,
    ) -> Result<Map<String, Value>, ToolError> {
        let task = session.tasks.get(&a.task_id)?;
        if a.timeout.is_some_and(|t| t > 300) {
            return Err(ToolError::invalid_argument(
                "/timeout",
                "timeout is at most 300 seconds",
            ));
        }
        let pattern = match a.wait_for_pattern.as_deref() {
            None => None,
            Some(p) => Some(regex::Regex::new(p).map_err(|e| {
                ToolError::invalid_argument("/wait_for_pattern", format!("not a valid regex: {e}"))
            })?),
        };
        let wait = a
            .timeout
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_PATTERN_WAIT);
        let read = task.read(pattern.as_ref(), wait).await;
        self.push_quietly(session).await;
        let mut fields = object(json!({"task_id": a.task_id}));
        let dropped_bytes = read.dropped_bytes();
        let dropped_cap = read.dropped_cap();
        let persist_error = read.persist_error().map(ToolError::brief);
        self.put_output(call, session, &mut fields, "stdout", read.stdout)
            .await;
        self.put_output(call, session, &mut fields, "stderr", read.stderr)
            .await;
        fields.insert("status".into(), read.status.as_str().into());
        fields.insert("exit_code".into(), read.exit_code.into());
        if let Some(matched) = read.matched {
            fields.insert("matched".into(), matched.into());
        }
        if dropped_bytes > 0 {
            // Unread output past the cap was counted (`_original_chars`), not kept.
            fields.insert("dropped_bytes".into(), dropped_bytes.into());
            if let Some(cap) = dropped_cap {
                // Which cap: the stream's, the session's or the worker's; or the workspace
                // that did not take a part of it (`persist_error` says why).
                fields.insert("dropped_by".into(), cap.as_str().into());
            }
            if let Some(error) = persist_error {
                fields.insert("persist_error".into(), error);
            }
        }
        Ok(fields)
    }
}

fn no_session() -> ToolError {
    ToolError::internal("a command reached the sandbox tools without a session; this is a bug")
}

fn no_task(task_id: &str) -> ToolError {
    ToolError::new(
        ErrorCode::NotFound,
        format!("no task {task_id:?} in this session; list_tasks names them"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn env_names_are_checked() {
        let ok: BTreeMap<String, String> = [("A_1".to_owned(), "x".to_owned())].into();
        assert!(check_env(&ok).is_ok());
        for bad in ["1A", "A-B", "", "TOOLMESH_EXEC_ID"] {
            let env: BTreeMap<String, String> = [(bad.to_owned(), "x".to_owned())].into();
            assert_eq!(
                check_env(&env).unwrap_err().code,
                ErrorCode::InvalidArguments,
                "{bad}"
            );
        }
    }
}
