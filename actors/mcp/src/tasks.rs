//! MCP tasks: a call parked for approval, as the tasks extension (`io.modelcontextprotocol/tasks`,
//! SEP-2663, MCP 2026-07-28) shows it to a client that declares the extension on its request.
//!
//! Instead of holding the `tools/call` open while an approver decides, the front answers with a
//! task (`resultType: "task"`, status `working`, a `statusMessage` naming the approval and how
//! to decide it) and keeps the gateway call running in the background. `tasks/get` reports the
//! task, with the call's `CallToolResult` inlined once it is `completed`; `tasks/cancel`
//! cancels the invocation (`toolmesh.v1.cancel.<account>`), whereupon the gateway withdraws the
//! approval the call made (rejected, reason `withdrawn`) and the task ends `cancelled`;
//! `tasks/update` is acknowledged and changes nothing (no task here ever asks for input).
//! SEP-2663 has no `tasks/result` and no `tasks/list`: both are `-32601` (method not found).
//!
//! Choices where the extension leaves it to the server: a task is made only for a call the
//! gateway parks (one invocation makes the approval and waits for it, so cancelling the task
//! withdraws exactly that approval), and only for a 2026-07-28 request declaring the extension
//! in its per-request capabilities (the 2025-11-25 `params.task` and `capabilities.tasks` are
//! ignored, as SEP-2663 says). Such a client is not asked in band: its approval is decided by
//! an approver (`…decide`, the CLI, the console). The call waits `TOOLMESH_MCP_APPROVAL_WAIT_S`
//! as a held-open one would; the task's `ttlMs` is that wait, plus the longest a call's reply
//! may take, plus [`TASK_KEEP`] to read the outcome.
//!
//! **Tasks live in the memory of the front node that made them** ([`Tasks`]): `tasks/get` on
//! another node answers "unknown task" (a load balancer routes by the `Mcp-Name` header, which
//! a client sets to the task id), and a restarted front has forgotten every task. The calls
//! behind them go on in the mesh: an approval stays pending until decided or expired, and a
//! parked call answers `approval_pending` when its wait runs out.
//!
//! **A task is its caller's**: the account, the bearer token's name and the session that made
//! it ([`Owner`]). Anyone else gets the same "unknown task" as for an id that never existed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rmcp::model::{DetailedTask, JsonObject, MetaObject, Task, TaskPayload, TaskStatus};
use rmcp::ErrorData as McpError;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::request::Caller;

/// The most tasks one front node keeps (finished ones included, until their time-to-live ends).
/// Past it a parked call is not made a task: the `tools/call` waits as for a client without
/// tasks.
pub const MAX_TASKS: usize = 1024;
/// The polling interval a task suggests (`pollIntervalMs`).
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long a task stays to be read after the longest its call may take.
pub const TASK_KEEP: Duration = Duration::from_secs(600);

/// The `_meta` key naming the approval a task waits for.
pub const APPROVAL_META: &str = "io.toolmesh/approval_id";
/// The `_meta` key naming the invocation behind a task (its RunEvents' subject).
pub const INVOCATION_META: &str = "io.toolmesh/invocation_id";

/// Who may see and cancel a task: the caller that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    account: String,
    /// The bearer token's name (HTTP); `None` over stdio, where the process has one client.
    token: Option<String>,
    session: Option<String>,
}

impl Owner {
    pub fn of(caller: &Caller) -> Owner {
        Owner {
            account: caller.account.to_string(),
            token: caller.name.clone(),
            session: caller.session.clone(),
        }
    }
}

struct Entry {
    owner: Owner,
    task: Task,
    /// Set once the task is terminal.
    outcome: Option<TaskPayload>,
    meta: JsonObject,
    /// Creation + time-to-live: past it the task is forgotten.
    expires: Instant,
    /// `tasks/cancel` (or the task's time running out) cancels the call behind it.
    cancel: CancellationToken,
}

impl Entry {
    fn detailed(&self) -> DetailedTask {
        let payload = self.outcome.clone().unwrap_or(TaskPayload::Working);
        DetailedTask::new(self.task.clone(), payload)
    }
}

/// The tasks of one front node. Cheap to clone; clones share the tasks.
#[derive(Clone, Default)]
pub struct Tasks {
    inner: Arc<Mutex<HashMap<String, Entry>>>,
}

/// A new task: its seed state and `_meta` for the `CreateTaskResult`, and what cancels its call.
pub struct Created {
    pub task: Task,
    pub meta: MetaObject,
    pub cancel: CancellationToken,
}

impl Tasks {
    /// A `working` task of `owner` for the call `invocation` waiting for approval `approval_id`,
    /// kept for `ttl`; `None` when the node keeps [`MAX_TASKS`] already.
    pub fn create(
        &self,
        owner: Owner,
        ttl: Duration,
        invocation: &str,
        approval_id: &str,
        message: String,
    ) -> Option<Created> {
        let mut tasks = self.lock();
        if tasks.len() >= MAX_TASKS {
            return None;
        }
        let id = uuid::Uuid::new_v4().to_string();
        let now = rmcp::task_manager::current_timestamp();
        let task = Task::new(id.clone(), TaskStatus::Working, now.clone(), now)
            .with_status_message(message)
            .with_ttl_ms(ttl.as_millis() as u64)
            .with_poll_interval_ms(POLL_INTERVAL.as_millis() as u64);
        let mut meta = JsonObject::new();
        meta.insert(APPROVAL_META.into(), Value::from(approval_id));
        meta.insert(INVOCATION_META.into(), Value::from(invocation));
        let cancel = CancellationToken::new();
        tasks.insert(
            id,
            Entry {
                owner,
                task: task.clone(),
                outcome: None,
                meta: meta.clone(),
                expires: Instant::now() + ttl,
                cancel: cancel.clone(),
            },
        );
        Some(Created {
            task,
            meta: MetaObject(meta),
            cancel,
        })
    }

    /// `tasks/get`: the task as it is now, and its `_meta`.
    pub fn get(&self, owner: &Owner, id: &str) -> Result<(DetailedTask, MetaObject), McpError> {
        let tasks = self.lock();
        let entry = owned(&tasks, owner, id)?;
        Ok((entry.detailed(), MetaObject(entry.meta.clone())))
    }

    /// `tasks/update`: a known task of `owner` (nothing to deliver: no task asks for input).
    pub fn known(&self, owner: &Owner, id: &str) -> Result<(), McpError> {
        owned(&self.lock(), owner, id).map(|_| ())
    }

    /// `tasks/cancel`: asks the call behind a task to stop; a finished task stays as it is.
    pub fn cancel(&self, owner: &Owner, id: &str) -> Result<(), McpError> {
        let tasks = self.lock();
        let entry = owned(&tasks, owner, id)?;
        if entry.outcome.is_none() {
            entry.cancel.cancel();
        }
        Ok(())
    }

    /// A new status message for a running task.
    pub fn say(&self, id: &str, message: String) {
        if let Some(entry) = self.lock().get_mut(id) {
            if entry.outcome.is_none() {
                entry.task.status_message = Some(message);
                entry.task.last_updated_at = rmcp::task_manager::current_timestamp();
            }
        }
    }

    /// The task's end: `completed` (with the result), `cancelled` or `failed`.
    pub fn finish(&self, id: &str, outcome: TaskPayload, message: Option<String>) {
        if let Some(entry) = self.lock().get_mut(id) {
            entry.task.status = outcome.status();
            entry.task.status_message = message;
            entry.task.last_updated_at = rmcp::task_manager::current_timestamp();
            entry.outcome = Some(outcome);
        }
    }

    /// The map, its expired tasks forgotten first (a running one is cancelled: nobody can see
    /// it any more).
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        let mut tasks = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        tasks.retain(|_, entry| {
            let keep = entry.expires > now;
            if !keep && entry.outcome.is_none() {
                entry.cancel.cancel();
            }
            keep
        });
        tasks
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The task `id` when `owner` made it; the same error whether it is someone else's or none.
fn owned<'a>(
    tasks: &'a HashMap<String, Entry>,
    owner: &Owner,
    id: &str,
) -> Result<&'a Entry, McpError> {
    tasks
        .get(id)
        .filter(|entry| entry.owner == *owner)
        .ok_or_else(|| {
            McpError::invalid_params(
                format!(
                    "unknown task {:?}: it never existed, has expired, is another caller's, or was made by another front node",
                    id.chars().take(64).collect::<String>()
                ),
                None,
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(token: &str, session: Option<&str>) -> Owner {
        Owner {
            account: "acme".into(),
            token: Some(token.into()),
            session: session.map(str::to_owned),
        }
    }

    fn create(tasks: &Tasks, owner: &Owner, ttl: Duration) -> Created {
        tasks
            .create(owner.clone(), ttl, "mcp-1", "appr_1", "waiting".into())
            .expect("room for a task")
    }

    #[test]
    fn a_task_is_seen_and_cancelled_by_its_owner_only() {
        let tasks = Tasks::default();
        let mine = owner("a", Some("s1"));
        let created = create(&tasks, &mine, Duration::from_secs(60));
        let id = created.task.task_id.clone();
        assert_eq!(created.task.status, TaskStatus::Working);
        assert_eq!(created.meta[APPROVAL_META], "appr_1");
        assert_eq!(created.task.ttl_ms, Some(60_000));
        for other in [
            owner("b", Some("s1")),
            owner("a", Some("s2")),
            owner("a", None),
        ] {
            let seen = tasks.get(&other, &id).unwrap_err();
            let never = tasks.get(&other, "nope").unwrap_err();
            assert_eq!(seen.code, never.code);
            assert!(tasks.cancel(&other, &id).is_err());
            assert!(tasks.known(&other, &id).is_err());
        }
        assert!(!created.cancel.is_cancelled());
        let (got, meta) = tasks.get(&mine, &id).unwrap();
        assert_eq!(got.status(), TaskStatus::Working);
        assert_eq!(meta[INVOCATION_META], "mcp-1");
        tasks.cancel(&mine, &id).unwrap();
        assert!(created.cancel.is_cancelled());
        tasks.finish(&id, TaskPayload::Cancelled, Some("withdrawn".into()));
        let (got, _) = tasks.get(&mine, &id).unwrap();
        assert_eq!(got.status(), TaskStatus::Cancelled);
        assert_eq!(got.task.status_message.as_deref(), Some("withdrawn"));
        // Finished: a message or a cancel changes nothing any more.
        tasks.say(&id, "late".into());
        tasks.cancel(&mine, &id).unwrap();
        assert_eq!(
            tasks
                .get(&mine, &id)
                .unwrap()
                .0
                .task
                .status_message
                .as_deref(),
            Some("withdrawn")
        );
    }

    #[test]
    fn expired_tasks_are_forgotten_and_their_calls_cancelled() {
        let tasks = Tasks::default();
        let mine = owner("a", None);
        let running = create(&tasks, &mine, Duration::ZERO);
        let done = create(&tasks, &mine, Duration::ZERO);
        tasks.finish(&done.task.task_id, TaskPayload::Cancelled, None);
        assert!(tasks.get(&mine, &running.task.task_id).is_err());
        assert_eq!(tasks.len(), 0);
        assert!(running.cancel.is_cancelled());
    }

    #[test]
    fn a_full_node_makes_no_task() {
        let tasks = Tasks::default();
        let mine = owner("a", None);
        for _ in 0..MAX_TASKS {
            create(&tasks, &mine, Duration::from_secs(60));
        }
        assert!(tasks
            .create(mine, Duration::from_secs(60), "mcp-2", "appr_2", "w".into())
            .is_none());
    }
}
