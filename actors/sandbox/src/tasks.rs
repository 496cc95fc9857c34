//! Background tasks of one session (PROTOCOL.md "Sandbox", after seed 004's interactive
//! sessions): a command started with `background: true` keeps running in the session's
//! sandbox; its output is kept until read (`task_output`), its stdin can be fed
//! (`task_input`), and it can be killed (`kill_task`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::backend::{Execution, KillSwitch, Output, StdinWriter};
use crate::exec::take_whole_chars;

/// Unread output kept per stream; past it, the oldest unread output is dropped (and counted).
pub const UNREAD_CAP: usize = 8 * 1024 * 1024;
/// Background tasks running at once in one session.
pub const MAX_RUNNING_TASKS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    Running,
    Exited,
    Killed,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Running => "running",
            TaskStatus::Exited => "exited",
            TaskStatus::Killed => "killed",
        }
    }
}

#[derive(Debug, Default)]
struct Unread {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    dropped_bytes: u64,
}

#[derive(Debug)]
struct TaskState {
    unread: Unread,
    status: TaskStatus,
    exit_code: Option<i64>,
    kill_requested: bool,
}

pub struct Task {
    pub task_id: String,
    pub command: String,
    pub started_at: String,
    state: Mutex<TaskState>,
    changed: Notify,
    stdin: tokio::sync::Mutex<Option<StdinWriter>>,
    kill: KillSwitch,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("task_id", &self.task_id)
            .finish_non_exhaustive()
    }
}

/// What `task_output` hands back.
#[derive(Debug)]
pub struct TaskRead {
    pub stdout: String,
    pub stderr: String,
    pub status: TaskStatus,
    pub exit_code: Option<i64>,
    pub matched: Option<bool>,
    pub dropped_bytes: u64,
}

/// Takes `buffer` as text: all of it when the task has ended (`whole`), else up to the last
/// whole character; a character cut short stays for the next read.
fn take_text(buffer: &mut Vec<u8>, whole: bool) -> String {
    String::from_utf8_lossy(&take_whole_chars(buffer, whole)).into_owned()
}

fn append_capped(buffer: &mut Vec<u8>, data: &[u8], dropped: &mut u64) {
    buffer.extend_from_slice(data);
    if buffer.len() > UNREAD_CAP {
        let excess = buffer.len() - UNREAD_CAP;
        buffer.drain(..excess);
        *dropped += excess as u64;
    }
}

impl Task {
    pub fn status(&self) -> (TaskStatus, Option<i64>) {
        let state = self.state.lock().expect("task state");
        (state.status, state.exit_code)
    }

    fn take_unread(&self, matched: Option<bool>) -> TaskRead {
        let mut state = self.state.lock().expect("task state");
        let whole = state.status != TaskStatus::Running;
        TaskRead {
            stdout: take_text(&mut state.unread.stdout, whole),
            stderr: take_text(&mut state.unread.stderr, whole),
            status: state.status,
            exit_code: state.exit_code,
            matched,
            dropped_bytes: std::mem::take(&mut state.unread.dropped_bytes),
        }
    }

    /// Returns the output since the last read. With a pattern, first waits (up to `wait`) until
    /// the unread output matches it or the task ends.
    pub async fn read(&self, pattern: Option<&regex::Regex>, wait: Duration) -> TaskRead {
        let Some(pattern) = pattern else {
            return self.take_unread(None);
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Register interest before checking, so a change in between is not missed.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.state.lock().expect("task state");
                let found = pattern.is_match(&String::from_utf8_lossy(&state.unread.stdout))
                    || pattern.is_match(&String::from_utf8_lossy(&state.unread.stderr));
                if found {
                    drop(state);
                    return self.take_unread(Some(true));
                }
                if state.status != TaskStatus::Running {
                    drop(state);
                    return self.take_unread(Some(false));
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.take_unread(Some(false));
            }
        }
    }

    pub async fn write_input(&self, input: &str) -> Result<(), ToolError> {
        if self.status().0 != TaskStatus::Running {
            return Err(self.not_running());
        }
        let mut stdin = self.stdin.lock().await;
        let Some(writer) = stdin.as_mut() else {
            return Err(self.not_running());
        };
        let written = async {
            writer.write_all(input.as_bytes()).await?;
            writer.flush().await
        }
        .await;
        written.map_err(|e| {
            *stdin = None;
            ToolError::new(
                ErrorCode::Conflict,
                format!("task {} no longer reads its input: {e}", self.task_id),
            )
        })
    }

    fn not_running(&self) -> ToolError {
        let (status, _) = self.status();
        ToolError::new(
            ErrorCode::Conflict,
            format!(
                "task {} is {}; it takes no more input",
                self.task_id,
                status.as_str()
            ),
        )
        .with("status", status.as_str())
    }

    /// Kills the task; true when it was still running.
    pub async fn kill(&self) -> bool {
        {
            let mut state = self.state.lock().expect("task state");
            if state.status != TaskStatus::Running {
                return false;
            }
            state.kill_requested = true;
        }
        self.kill.kill().await;
        // The pump records the end; wait for it briefly so the caller sees `killed`.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let notified = self.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.status().0 != TaskStatus::Running {
                    return;
                }
                notified.await;
            }
        })
        .await;
        true
    }
}

/// The tasks of one session.
#[derive(Debug, Default)]
pub struct TaskTable {
    tasks: Mutex<HashMap<String, Arc<Task>>>,
}

impl TaskTable {
    pub fn running(&self) -> usize {
        self.tasks
            .lock()
            .expect("tasks lock")
            .values()
            .filter(|t| t.status().0 == TaskStatus::Running)
            .count()
    }

    pub fn get(&self, task_id: &str) -> Result<Arc<Task>, ToolError> {
        self.tasks
            .lock()
            .expect("tasks lock")
            .get(task_id)
            .cloned()
            .ok_or_else(|| {
                ToolError::new(
                    ErrorCode::NotFound,
                    format!("no task {task_id:?} in this session; list_tasks names them"),
                )
            })
    }

    /// Every task, oldest first.
    pub fn list(&self) -> Vec<Arc<Task>> {
        let mut tasks: Vec<Arc<Task>> = self
            .tasks
            .lock()
            .expect("tasks lock")
            .values()
            .cloned()
            .collect();
        tasks.sort_by(|a, b| {
            a.started_at
                .cmp(&b.started_at)
                .then(a.task_id.cmp(&b.task_id))
        });
        tasks
    }

    /// Registers a started execution as a task and pumps its output in the background.
    pub fn start(
        &self,
        task_id: String,
        command: String,
        execution: Execution,
    ) -> Result<Arc<Task>, Box<(ToolError, Execution)>> {
        if self.running() >= MAX_RUNNING_TASKS {
            return Err(Box::new((
                ToolError::new(
                    ErrorCode::InvalidArguments,
                    format!("this session already runs {MAX_RUNNING_TASKS} background tasks; kill_task one first"),
                ),
                execution,
            )));
        }
        let Execution {
            mut output,
            stdin,
            exit,
            kill,
        } = execution;
        let task = Arc::new(Task {
            task_id: task_id.clone(),
            command,
            started_at: toolmesh_kernel::time::now_rfc3339(),
            state: Mutex::new(TaskState {
                unread: Unread::default(),
                status: TaskStatus::Running,
                exit_code: None,
                kill_requested: false,
            }),
            changed: Notify::new(),
            stdin: tokio::sync::Mutex::new(stdin),
            kill,
        });
        self.tasks
            .lock()
            .expect("tasks lock")
            .insert(task_id, task.clone());
        let pumped = task.clone();
        tokio::spawn(async move {
            while let Some(chunk) = output.recv().await {
                {
                    let mut state = pumped.state.lock().expect("task state");
                    let TaskState { unread, .. } = &mut *state;
                    match chunk {
                        Output::Stdout(b) => {
                            append_capped(&mut unread.stdout, &b, &mut unread.dropped_bytes)
                        }
                        Output::Stderr(b) => {
                            append_capped(&mut unread.stderr, &b, &mut unread.dropped_bytes)
                        }
                    }
                }
                pumped.changed.notify_waiters();
            }
            let code = match exit.await {
                Ok(Ok(status)) => Some(status.code),
                _ => None,
            };
            {
                let mut state = pumped.state.lock().expect("task state");
                state.exit_code = code;
                state.status = if state.kill_requested {
                    TaskStatus::Killed
                } else {
                    TaskStatus::Exited
                };
            }
            *pumped.stdin.lock().await = None;
            pumped.changed.notify_waiters();
        });
        Ok(task)
    }

    pub async fn kill_all(&self) {
        for task in self.list() {
            task.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::take_text;

    #[test]
    fn a_running_task_keeps_a_character_cut_short_for_the_next_read() {
        let euro = "€".as_bytes();
        let mut unread = vec![b'a', euro[0], euro[1]];
        assert_eq!(take_text(&mut unread, false), "a");
        unread.push(euro[2]);
        assert_eq!(take_text(&mut unread, false), "€");
        assert!(unread.is_empty());
        // Once the task has ended nothing more can complete it: all of it goes out.
        let mut unread = vec![b'b', euro[0]];
        assert_eq!(take_text(&mut unread, true), "b\u{FFFD}");
    }
}
