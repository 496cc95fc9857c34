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
use crate::output::{Captured, Spool, SpoolSettings, Utf8Decoder};

/// Background tasks running at once in one session.
pub const MAX_RUNNING_TASKS: usize = 16;
/// A pattern scan reads the unread text in pieces of this size.
const SCAN_PIECE: usize = 1024 * 1024;
/// A line longer than this is matched on its last [`LONG_LINE_KEEP`] bytes only.
const MAX_LINE: usize = 1024 * 1024;
const LONG_LINE_KEEP: usize = 64 * 1024;

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

/// Output not read yet: one spool per stream (text in memory up to the preview, then on the
/// worker's disk up to the cap). A read takes both and leaves fresh ones.
#[derive(Debug)]
struct Unread {
    stdout: Spool,
    stderr: Spool,
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
    /// One read at a time: a pattern scan's offsets stay valid until its read takes the text.
    reads: tokio::sync::Mutex<()>,
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
    pub stdout: Captured,
    pub stderr: Captured,
    pub status: TaskStatus,
    pub exit_code: Option<i64>,
    pub matched: Option<bool>,
}

impl TaskRead {
    /// Bytes of text the task wrote since the last read that this read cannot hand back (past
    /// the cap of unread output).
    pub fn dropped_bytes(&self) -> u64 {
        self.stdout.dropped_bytes() + self.stderr.dropped_bytes()
    }
}

/// `wait_for_pattern` over one stream, line by line: the pattern is matched against each line
/// on its own (without its `\n` or `\r\n`), so `^` and `$` are the line's start and end; the
/// line still being written counts as a line too (a prompt has no newline).
struct LineScan<'a> {
    pattern: &'a regex::Regex,
    /// Bytes of the spool scanned so far.
    offset: u64,
    /// The line not ended yet.
    line: String,
}

impl<'a> LineScan<'a> {
    fn new(pattern: &'a regex::Regex) -> Self {
        Self {
            pattern,
            offset: 0,
            line: String::new(),
        }
    }

    fn matches(&self, line: &str) -> bool {
        self.pattern
            .is_match(line.strip_suffix('\r').unwrap_or(line))
    }

    /// Feeds the next text; true once a line matched.
    fn feed(&mut self, text: &str) -> bool {
        self.offset += text.len() as u64;
        let mut rest = text;
        while let Some(end) = rest.find('\n') {
            self.line.push_str(&rest[..end]);
            if self.matches(&self.line) {
                return true;
            }
            self.line.clear();
            rest = &rest[end + 1..];
        }
        self.line.push_str(rest);
        if self.line.len() > MAX_LINE {
            let mut cut = self.line.len() - LONG_LINE_KEEP;
            while !self.line.is_char_boundary(cut) {
                cut += 1;
            }
            if self.matches(&self.line) {
                return true;
            }
            self.line.drain(..cut);
        }
        !self.line.is_empty() && self.matches(&self.line)
    }

    /// Scans what `spool` gained since the last call; true once a line matched.
    fn scan(&mut self, spool: &Spool) -> bool {
        loop {
            match spool.read_from(self.offset, SCAN_PIECE) {
                Ok(text) if text.is_empty() => return false,
                Ok(text) => {
                    if self.feed(&text) {
                        return true;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read a task's spooled output for a pattern");
                    return false;
                }
            }
        }
    }
}

impl Task {
    pub fn status(&self) -> (TaskStatus, Option<i64>) {
        let state = self.state.lock().expect("task state");
        (state.status, state.exit_code)
    }

    /// Takes the unread output, leaving fresh spools for what comes next.
    fn take_unread(&self, matched: Option<bool>) -> TaskRead {
        let mut state = self.state.lock().expect("task state");
        let fresh = Unread {
            stdout: state.unread.stdout.fresh(),
            stderr: state.unread.stderr.fresh(),
        };
        let unread = std::mem::replace(&mut state.unread, fresh);
        TaskRead {
            stdout: unread.stdout.finish(),
            stderr: unread.stderr.finish(),
            status: state.status,
            exit_code: state.exit_code,
            matched,
        }
    }

    /// Returns the output since the last read. With a pattern, first waits (up to `wait`) until
    /// a line of the unread output matches it (line by line, see `LineScan`) or the task ends.
    pub async fn read(&self, pattern: Option<&regex::Regex>, wait: Duration) -> TaskRead {
        let _one_read = self.reads.lock().await;
        let Some(pattern) = pattern else {
            return self.take_unread(None);
        };
        let deadline = tokio::time::Instant::now() + wait;
        let mut out = LineScan::new(pattern);
        let mut err = LineScan::new(pattern);
        loop {
            // Register interest before checking, so a change in between is not missed.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.state.lock().expect("task state");
                if out.scan(&state.unread.stdout) || err.scan(&state.unread.stderr) {
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

    /// Registers a started execution as a task and pumps its output in the background, into
    /// spools made with `spool`.
    pub fn start(
        &self,
        task_id: String,
        command: String,
        execution: Execution,
        spool: SpoolSettings,
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
                unread: Unread {
                    stdout: Spool::new(spool.clone(), &format!("{task_id}-stdout")),
                    stderr: Spool::new(spool, &format!("{task_id}-stderr")),
                },
                status: TaskStatus::Running,
                exit_code: None,
                kill_requested: false,
            }),
            changed: Notify::new(),
            reads: tokio::sync::Mutex::new(()),
            stdin: tokio::sync::Mutex::new(stdin),
            kill,
        });
        self.tasks
            .lock()
            .expect("tasks lock")
            .insert(task_id, task.clone());
        let pumped = task.clone();
        tokio::spawn(async move {
            let mut out = Utf8Decoder::default();
            let mut err = Utf8Decoder::default();
            while let Some(chunk) = output.recv().await {
                {
                    let mut state = pumped.state.lock().expect("task state");
                    let unread = &mut state.unread;
                    match chunk {
                        Output::Stdout(b) => unread.stdout.push(&out.decode(&b)),
                        Output::Stderr(b) => unread.stderr.push(&err.decode(&b)),
                    }
                }
                pumped.changed.notify_waiters();
            }
            {
                // No more bytes: a character cut short at the end goes out as it is.
                let mut state = pumped.state.lock().expect("task state");
                state.unread.stdout.push(&out.finish());
                state.unread.stderr.push(&err.finish());
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
    use super::*;

    fn scan(pattern: &str, pieces: &[&str]) -> bool {
        let pattern = regex::Regex::new(pattern).unwrap();
        let mut scan = LineScan::new(&pattern);
        pieces.iter().any(|piece| scan.feed(piece))
    }

    #[test]
    fn patterns_match_line_by_line() {
        // Anchors are a line's start and end (issue 15: these never matched).
        assert!(scan("line-[3-9]$", &["line-1\nline-2\n", "line-3\n"]));
        assert!(scan("^READY now$", &["starting\nREADY now\nserving\n"]));
        assert!(scan("^READY now$", &["starting\r\nREADY now\r\n"]));
        // A line split between pieces is still one line.
        assert!(scan("^READY now$", &["boot\nREA", "DY n", "ow\n"]));
        // The line being written counts too: a prompt has no newline.
        assert!(scan(r"^>>> $", &["Python\n>>> "]));
        assert!(!scan("^READY now$", &["READY now!\n", "not READY now\n"]));
        assert!(!scan("line-[3-9]$", &["line-2\n", "line-30\n"]));
        // A match never spans lines.
        assert!(!scan("a\nb", &["a\nb\n"]));
    }

    #[test]
    fn a_long_line_is_matched_on_its_end_in_bounded_memory() {
        let pattern = regex::Regex::new("END$").unwrap();
        let mut scan = LineScan::new(&pattern);
        let piece = "x".repeat(100_000);
        for _ in 0..50 {
            assert!(!scan.feed(&piece));
            assert!(scan.line.len() <= MAX_LINE + piece.len());
        }
        assert!(scan.feed("END"));
    }
}
