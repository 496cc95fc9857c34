//! What the sandbox worker's tools share: the [`SandboxService`], how a call is placed
//! ([`Placement`], [`Placed`], [`SandboxTool`]), the definitions' base (`SANDBOX`) and the
//! steps of a command (pull, exec, push, output). The tools themselves are `tools/`, one file
//! each.

use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{BuiltinGroup, ToolDef};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};
use toolmesh_kernel::Role;

use async_nats::Client;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use toolmesh_kernel::budget;
use toolmesh_kernel::host::CancelWatch;
use toolmesh_kernel::outputs::Whole;
use toolmesh_kernel::tools::{Entry, Listed, RunFn, Runnable, Tool, ToolCall, ToolResult};
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::backend::{BackendError, ExecSpec, Execution, StartGate};
use crate::exec::{run_to_end, CommandOutcome};
use crate::output::{
    persisted_entry, spool_dir_of, Cap, Captured, Handover, Part, Quota, SpoolSettings,
};
use crate::pool::{backend_error, Pool, Session, SessionUse};
use crate::tasks::Task;
use crate::templates::Template;

/// What a sandbox worker's tool definition says unless it says otherwise: the sandbox group and
/// role, low risk, no side effect, a session, the `coding` profile.
pub(crate) const SANDBOX: ToolDef = ToolDef {
    needs_session: true,
    profiles: &[Profile::Coding],
    ..ToolDef::of(BuiltinGroup::Sandbox, Role::Sandbox)
};

/// [`SANDBOX`] for a tool that runs code of the caller's in the sandbox: high risk, isolated
/// execution.
pub(crate) const EXECUTING: ToolDef =
    SANDBOX.risk(RiskLevel::High, &[SideEffect::IsolatedRuntimeExecution]);

/// A tool of the sandbox worker: a [`Tool`] run with the call's placement, and how its calls
/// are placed (`QUICK` unless it says otherwise).
pub trait SandboxTool: Tool<Placed> {
    const PLACEMENT: &'static Placement = &QUICK;
}

/// An entry of the worker's table (`tools::TOOLS`): a tool's entry and how its calls are
/// placed.
pub struct SandboxEntry {
    pub tool: Entry<RunFn<Placed>>,
    pub placement: &'static Placement,
}

impl SandboxEntry {
    /// The table entry of tool `T`.
    pub const fn of<T: SandboxTool>() -> Self {
        SandboxEntry {
            tool: Entry::of::<T>(),
            placement: T::PLACEMENT,
        }
    }
}

impl Listed for SandboxEntry {
    fn def(&self) -> &'static ToolDef {
        self.tool.def
    }

    fn schema(&self) -> Value {
        (self.tool.schema)()
    }
}

impl Runnable<Placed> for SandboxEntry {
    fn run_value<'a>(
        &'a self,
        host: &'a Placed,
        call: &'a ToolCall<'a>,
    ) -> BoxFuture<'a, ToolResult> {
        self.tool.run_value(host, call)
    }
}

/// How a sandbox tool's calls are placed (`worker.rs`).
pub struct Placement {
    /// A call creates the session's sandbox when it has none yet (and runs in it); otherwise
    /// it runs with the session's sandbox when this worker holds one, and publishes no events.
    pub creates_sandbox: bool,
    /// Where a call names its sandbox template.
    pub template: TemplateOf,
    /// Refusals that need no sandbox (checked before one is created for the session).
    pub precheck: Option<Precheck>,
}

/// A tool that runs without creating a sandbox, with the session's when this worker holds
/// one; its `template` argument names the template.
pub(crate) const QUICK: Placement = Placement {
    creates_sandbox: false,
    template: template_argument,
    precheck: None,
};

/// A tool that runs a command in the session's sandbox, created for it when the session has
/// none; its `template` argument names the template.
pub(crate) const IN_SANDBOX: Placement = Placement {
    creates_sandbox: true,
    ..QUICK
};

/// The template of a call's optional `template` argument.
pub(crate) fn template_argument<'a>(
    service: &'a SandboxService,
    arguments: &'a Value,
) -> BoxFuture<'a, Result<Option<Arc<Template>>, ToolError>> {
    let named = match arguments.get("template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) => service
            .pool
            .settings
            .templates
            .resolve(name, "/template")
            .map(|t| Some(t.clone())),
        Some(_) => Err(ToolError::invalid_argument(
            "/template",
            "must be the name of a sandbox template",
        )),
    };
    Box::pin(std::future::ready(named))
}

/// A refusal that needs no sandbox.
pub type Precheck = fn(&SandboxService) -> Result<(), ToolError>;

/// Where a call names the sandbox template it needs (PROTOCOL.md "Sandbox templates"): the
/// template it names, `None` when it names none (the session's, or `default` for a new
/// sandbox); a name no template has is `invalid_arguments`.
pub type TemplateOf = for<'a> fn(
    &'a SandboxService,
    &'a Value,
) -> BoxFuture<'a, Result<Option<Arc<Template>>, ToolError>>;

/// What a sandbox tool runs with: the worker's service and the session this worker holds for
/// the call, when it holds one (always, for a tool that creates it).
pub struct Placed {
    pub service: Arc<SandboxService>,
    pub session: Option<SessionUse>,
}

impl Placed {
    /// The session's sandbox, for a tool that creates it (placement made sure it is here).
    pub(crate) fn sandbox(&self) -> Result<&Session, ToolError> {
        self.session.as_deref().map(Arc::as_ref).ok_or_else(|| {
            ToolError::internal(
                "a command reached the sandbox tools without a session; this is a bug",
            )
        })
    }

    /// The session's background task `task_id`, with the session: `not_found` when the session
    /// has no such task (or no sandbox on this worker).
    pub(crate) fn task(&self, task_id: &str) -> Result<(&Session, Arc<Task>), ToolError> {
        let session = self.session.as_deref().ok_or_else(|| no_task(task_id))?;
        Ok((session, session.tasks.get(task_id)?))
    }
}

/// Where inside the sandbox the session's workspace is.
pub const WORKSPACE_MOUNT: &str = "/workspace";

pub struct SandboxService {
    pub pool: Arc<Pool>,
    pub client: Client,
    pub default_timeout: Duration,
    /// `TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES`: text of one output stream spooled and persisted.
    pub output_max_bytes: u64,
    /// `TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES`: unread task output one session keeps.
    pub session_output_max_bytes: u64,
    /// `TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES`: unread task output this worker keeps.
    pub worker_output: Arc<Quota>,
    /// Task output handed to workspaces at once on this worker (`Handover::worker_slots`).
    pub handovers: Arc<tokio::sync::Semaphore>,
    /// `TOOLMESH_SKILL_RUNNER_COMMAND`.
    pub skill_runner: Option<String>,
}

impl std::fmt::Debug for SandboxService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxService").finish_non_exhaustive()
    }
}

pub(crate) fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

pub(crate) fn check_env(env: &BTreeMap<String, String>) -> Result<(), ToolError> {
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

pub(crate) fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

impl SandboxService {
    /// A command's timeout: the seconds the call names, else the worker's default.
    pub(crate) fn timeout(&self, seconds: Option<u64>) -> Duration {
        seconds.map_or(self.default_timeout, Duration::from_secs)
    }

    pub fn backend_name(&self) -> &'static str {
        self.pool.backend.wire_name()
    }

    /// What a sandbox of `template` isolates, in a sentence: the backend's, with gVisor's
    /// kernel in place of the host's under `runsc`.
    pub fn boundary(&self, template: &Template) -> String {
        let boundary = self.pool.backend.boundary();
        if template.runtime_name() == "runsc" {
            boundary.replace(
                "shares the host kernel",
                "runs on gVisor's user-space kernel (runsc), not the host kernel",
            )
        } else {
            boundary.to_owned()
        }
    }

    /// The template a call names ([`TemplateOf`]): `None` when it names none.
    pub async fn template_of(
        &self,
        placement: &Placement,
        arguments: &Value,
    ) -> Result<Option<Arc<Template>>, ToolError> {
        (placement.template)(self, arguments).await
    }

    /// Pulls the workspace into the sandbox (before a command). The manifest changes nothing
    /// here, so it is asked for while a new session's claim is still on its way; the files
    /// are written only once the claim holds.
    pub(crate) async fn pull(&self, session: &Session) -> Result<(), ToolError> {
        let mut mirror = session.mirror.lock().await;
        let (claimed, manifest) = tokio::join!(session.claimed(), mirror.manifest());
        claimed?;
        mirror.pull_listed(manifest?).await.map(|_| ())
    }

    /// Pushes what the command changed back to the workspace; the reply's `workspace_sync`.
    pub(crate) async fn push(&self, session: &Session) -> Value {
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

    pub(crate) async fn push_quietly(&self, session: &Session) {
        let _ = self.push(session).await;
    }

    /// How a call's output streams are spooled on this worker: previews of the call's
    /// budget.
    pub(crate) fn spool_settings(&self, call: &ToolCall<'_>, session: &Session) -> SpoolSettings {
        SpoolSettings {
            dir: spool_dir_of(&session.sandbox.workspace_dir),
            preview_chars: call.outputs.budget_chars,
            max_bytes: self.output_max_bytes,
            quotas: Vec::new(),
            handover: None,
        }
    }

    /// How a session's background tasks spool their unread output: within the session's
    /// and the worker's caps too, handing it to the workspace when one of them fills up.
    pub(crate) fn task_spool_settings(
        &self,
        call: &ToolCall<'_>,
        session: &Session,
    ) -> SpoolSettings {
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
            ..self.spool_settings(call, session)
        }
    }

    /// Puts a stream's preview and its budget companions; over the budget the whole stream
    /// (its spool file) is persisted in the session's workspace and named in
    /// `persisted_outputs`, with `truncated: true` and `max_bytes` when it passed the cap.
    pub(crate) async fn put_output(
        &self,
        call: &ToolCall<'_>,
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
        // A task's first parts are already in the workspace; the text after them (all of it
        // when there are none) goes there now, unless that is nothing.
        let mut parts = output.parts;
        if let Some(file) = output.file.filter(|f| f.bytes > 0 || parts.is_empty()) {
            let whole = Whole::File {
                bytes: file.bytes,
                file: file.handle(),
            };
            match call.outputs.persist(field, whole).await {
                Ok(Some(path)) => parts.push(Part {
                    path,
                    bytes: file.bytes,
                }),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "cannot persist an over-budget output"),
            }
        }
        let max_bytes = stream_cap.then_some(self.output_max_bytes);
        if let Some(persisted) = persisted_entry(&parts, truncated, max_bytes) {
            budget::insert_persisted(fields, field, persisted);
        }
    }

    /// Starts `spec` once the session's claim holds and `before` succeeded, with the backend's
    /// own preparation (Docker creating the exec: about a millisecond) done meanwhile; nothing
    /// starts when either fails.
    pub(crate) async fn start_after<T>(
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
    /// cap), push; its output streams as the call's events. Returns the outcome and the sync
    /// report.
    pub(crate) async fn run_foreground(
        &self,
        call: &ToolCall<'_>,
        session: &Session,
        spec: ExecSpec,
        stdin: Option<Bytes>,
        timeout: Duration,
    ) -> Result<(CommandOutcome, Value), ToolError> {
        let before = async {
            self.pull(session).await?;
            let mut cancel =
                CancelWatch::listen(&self.client, &call.ctx.account, &call.ctx.invocation_id).await;
            // Wait for a slot in arrival order (a burst is queued, not failed).
            let permit = tokio::select! {
                permit = self.pool.permits.clone().acquire_owned() => permit.map_err(|_| ToolError::new(ErrorCode::Cancelled, "the sandbox worker is shutting down"))?,
                _ = cancel.requested() => return Err(ToolError::new(ErrorCode::Cancelled, "cancelled before the command started")),
            };
            Ok((cancel, permit))
        };
        let label = spec.exec_id.clone();
        // Listening before the command starts, so its first request is heard.
        let mut decisions = self.pool.decisions_of(&session.sandbox.sandbox_id);
        let ((mut cancel, permit), execution) = self.start_after(session, spec, before).await?;
        let spool = self.spool_settings(call, session);
        let outcome = run_to_end(
            execution,
            &spool,
            &label,
            stdin,
            timeout,
            &call.events,
            &mut cancel,
            decisions.as_mut().map(|d| &mut d.rx),
        )
        .await;
        drop(decisions);
        drop(permit);
        let sync = self.push(session).await;
        Ok((outcome, sync))
    }

    pub(crate) async fn finish(
        &self,
        call: &ToolCall<'_>,
        mut fields: Map<String, Value>,
        outcome: CommandOutcome,
        sync: Value,
        timeout: Duration,
    ) -> Result<Map<String, Value>, ToolError> {
        self.put_output(call, &mut fields, "stdout", outcome.stdout)
            .await;
        self.put_output(call, &mut fields, "stderr", outcome.stderr)
            .await;
        fields.insert("exit_code".into(), outcome.exit_code.into());
        fields.insert("timed_out".into(), outcome.timed_out.into());
        fields.insert("duration_ms".into(), outcome.duration_ms.into());
        fields.insert("workspace_sync".into(), sync);
        if outcome.cancelled {
            return Err(ToolError::new(
                ErrorCode::Cancelled,
                "the command was cancelled; its processes were killed",
            )
            .with_details(fields));
        }
        if outcome.timed_out {
            return Err(ToolError::new(
                ErrorCode::Timeout,
                format!(
                    "the command ran past its timeout of {} s and was killed; the output so far is in stdout/stderr",
                    timeout.as_secs()
                ),
            ).with_details(fields));
        }
        Ok(fields)
    }

    pub(crate) fn base_fields(&self, session: &Session, command: &str) -> Map<String, Value> {
        object(json!({
            "backend": self.backend_name(),
            "sandbox_id": session.sandbox.sandbox_id,
            "command": command,
        }))
    }
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
