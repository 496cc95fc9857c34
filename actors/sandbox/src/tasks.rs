//! Background tasks of one session (PROTOCOL.md "Sandbox", after seed 004's interactive
//! sessions): a command started with `background: true` keeps running in the session's
//! sandbox; its output is kept until read (`task_output`), its stdin can be fed
//! (`task_input`), and it can be killed (`kill_task`).
//!
//! A session runs at most [`MAX_RUNNING_TASKS`] at once and keeps its [`MAX_ENDED_TASKS`] most
//! recently ended ones: when one more ends, the one that ended first is dropped with its spool
//! files, and the last 1024 dropped ids are remembered, so `task_output` of one says it was
//! dropped (`not_found`). A worker's memory for tasks is so bounded by sessions × 48 tasks ×
//! (two previews + one write batch while running). An ended task with spooled text waits for
//! its session's or worker's quota to be pressed (`hand_over_ended`, holding the task weakly)
//! and then hands its text to the workspace, so ended tasks never hold a cap running ones need.
//!
//! `wait_for_pattern` is matched line by line (`LineScan`): `^` and `$` are a line's start and
//! end, the line still being written counts, a match never spans lines, and a line past 1 MiB
//! is matched on its last 64 KiB. Only kept text is scanned, off the async threads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::backend::{Execution, KillSwitch, Output, StdinWriter};
use crate::output::{Cap, Captured, Kept, Quota, Spool, SpoolSettings, Utf8Decoder};

/// Background tasks running at once in one session.
pub const MAX_RUNNING_TASKS: usize = 16;
/// Ended (exited or killed) tasks one session keeps; when one more ends, the one that ended
/// first is dropped with its unread output (PROTOCOL.md "Sandbox").
pub const MAX_ENDED_TASKS: usize = 32;
/// Dropped task ids a session remembers, to say why `task_output` finds no such task.
const REMEMBERED_DROPPED: usize = 1024;
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
/// worker's disk up to the caps). A read takes both and leaves fresh ones.
#[derive(Debug)]
struct Unread {
    stdout: Spool,
    stderr: Spool,
}

#[derive(Debug)]
struct TaskState {
    status: TaskStatus,
    exit_code: Option<i64>,
    kill_requested: bool,
}

pub struct Task {
    pub task_id: String,
    pub command: String,
    pub started_at: String,
    state: Mutex<TaskState>,
    /// Held by the pump while it pushes (a write to the spool file may wait for the disk).
    unread: tokio::sync::Mutex<Unread>,
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
    /// a cap of unread output).
    pub fn dropped_bytes(&self) -> u64 {
        self.stdout.dropped_bytes() + self.stderr.dropped_bytes()
    }

    /// The cap that dropped text, stdout's first.
    pub fn dropped_cap(&self) -> Option<Cap> {
        self.stdout.cap.or(self.stderr.cap)
    }

    /// Why the workspace did not take a part of the output, stdout's first.
    pub fn persist_error(&self) -> Option<&ToolError> {
        self.stdout
            .persist_error
            .as_ref()
            .or(self.stderr.persist_error.as_ref())
    }
}

/// `wait_for_pattern` over one stream, line by line: the pattern is matched against each line
/// on its own (without its `\n` or `\r\n`), so `^` and `$` are the line's start and end; the
/// line still being written counts as a line too (a prompt has no newline).
struct LineScan {
    pattern: regex::Regex,
    /// Bytes of the spool scanned so far.
    offset: u64,
    /// The line not ended yet.
    line: String,
}

impl LineScan {
    fn new(pattern: &regex::Regex) -> Self {
        Self {
            pattern: pattern.clone(),
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

    /// Scans the kept text from where the last call stopped; true once a line matched.
    /// Text handed to the workspace before the scan reached it is skipped (a line cut so
    /// starts afresh). Blocking when the text is on disk ([`Kept::on_disk`]).
    fn scan(&mut self, kept: &Kept) -> bool {
        if self.offset < kept.start() {
            self.offset = kept.start();
            self.line.clear();
        }
        loop {
            match kept.read(self.offset, SCAN_PIECE) {
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

/// Scans both streams' kept text on the blocking pool (some of it is on disk).
async fn scan_on_disk(
    mut out: LineScan,
    mut err: LineScan,
    kept: (Kept, Kept),
) -> Option<(LineScan, LineScan, bool)> {
    let scanned = tokio::task::spawn_blocking(move || {
        let matched = out.scan(&kept.0) || err.scan(&kept.1);
        (out, err, matched)
    })
    .await;
    scanned
        .inspect_err(|e| tracing::warn!(error = %e, "a pattern scan of a task's output failed"))
        .ok()
}

impl Task {
    pub fn status(&self) -> (TaskStatus, Option<i64>) {
        let state = self.state.lock().expect("task state");
        (state.status, state.exit_code)
    }

    /// Takes the unread output, leaving fresh spools for what comes next.
    async fn take_unread(&self, matched: Option<bool>) -> TaskRead {
        // The status first: when it says the task ended, every byte it wrote was pushed.
        let (status, exit_code) = self.status();
        let unread = {
            let mut unread = self.unread.lock().await;
            let fresh = Unread {
                stdout: unread.stdout.fresh(),
                stderr: unread.stderr.fresh(),
            };
            std::mem::replace(&mut *unread, fresh)
        };
        TaskRead {
            stdout: unread.stdout.finish().await,
            stderr: unread.stderr.finish().await,
            status,
            exit_code,
            matched,
        }
    }

    /// Returns the output since the last read. With a pattern, first waits (up to `wait`) until
    /// a line of the unread output matches it (line by line, see `LineScan`) or the task ends.
    pub async fn read(&self, pattern: Option<&regex::Regex>, wait: Duration) -> TaskRead {
        let _one_read = self.reads.lock().await;
        let Some(pattern) = pattern else {
            return self.take_unread(None).await;
        };
        let deadline = tokio::time::Instant::now() + wait;
        let mut out = LineScan::new(pattern);
        let mut err = LineScan::new(pattern);
        loop {
            // Register interest before checking, so a change in between is not missed.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The status before the text: an ended task's text is all there.
            let status = self.status().0;
            let kept = {
                let unread = self.unread.lock().await;
                (
                    unread.stdout.kept_from(out.offset),
                    unread.stderr.kept_from(err.offset),
                )
            };
            let on_disk = kept.0.on_disk(out.offset) || kept.1.on_disk(err.offset);
            let matched;
            (out, err, matched) = if on_disk {
                match scan_on_disk(out, err, kept).await {
                    Some(scanned) => scanned,
                    None => return self.take_unread(Some(false)).await,
                }
            } else {
                // Text still in memory (at most the preview or one write batch) in place.
                let matched = out.scan(&kept.0) || err.scan(&kept.1);
                (out, err, matched)
            };
            if matched {
                return self.take_unread(Some(true)).await;
            }
            if status != TaskStatus::Running {
                return self.take_unread(Some(false)).await;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.take_unread(Some(false)).await;
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

/// Hands an ended task's unread spooled text to the workspace whenever a shared cap is more
/// than half taken, now or later, one stream after the other (a task's parts go one at a
/// time): an ended task then keeps only its previews on the worker. Ends once the task holds
/// no spooled text (read, handed over) or is gone; the task's slot is awaited without
/// holding its unread output or the task itself.
async fn hand_over_ended(task: Weak<Task>, settings: SpoolSettings) {
    let Some(handover) = settings.handover.clone() else {
        return;
    };
    loop {
        // Interest first, so a take between the check and the wait is not missed.
        let pressed = settings.pressed();
        tokio::pin!(pressed);
        let fired = futures::FutureExt::now_or_never(pressed.as_mut()).is_some();
        let Some(strong) = task.upgrade() else {
            return;
        };
        let mut spooled = false;
        for stdout in [true, false] {
            let wants = {
                let mut unread = strong.unread.lock().await;
                let spool = if stdout {
                    &mut unread.stdout
                } else {
                    &mut unread.stderr
                };
                spooled |= spool.holds_spooled();
                spool.wants_hand_over(true)
            };
            if !wants {
                continue;
            }
            let Some(permit) = handover.slot().await else {
                return;
            };
            let mut unread = strong.unread.lock().await;
            let spool = if stdout {
                &mut unread.stdout
            } else {
                &mut unread.stderr
            };
            if spool.wants_hand_over(true) {
                spool.hand_over(permit).await;
            }
        }
        drop(strong);
        if !spooled {
            return;
        }
        if !fired {
            pressed.await;
        }
    }
}

/// The tasks of one session, with the ids of the ended ones in the order they ended.
#[derive(Debug, Default)]
struct Tasks {
    by_id: HashMap<String, Arc<Task>>,
    ended: VecDeque<String>,
    dropped: VecDeque<String>,
}

impl Tasks {
    /// Records that `task_id` ended; drops the tasks that ended first past
    /// [`MAX_ENDED_TASKS`] and hands them back (to be let go outside the lock).
    fn ended(&mut self, task_id: &str) -> Vec<Arc<Task>> {
        if !self.by_id.contains_key(task_id) {
            return Vec::new();
        }
        self.ended.push_back(task_id.to_owned());
        let mut gone = Vec::new();
        while self.ended.len() > MAX_ENDED_TASKS {
            let Some(oldest) = self.ended.pop_front() else {
                break;
            };
            if let Some(task) = self.by_id.remove(&oldest) {
                gone.push(task);
            }
            self.dropped.push_back(oldest);
            if self.dropped.len() > REMEMBERED_DROPPED {
                self.dropped.pop_front();
            }
        }
        gone
    }
}

/// The tasks of one session.
#[derive(Debug, Default)]
pub struct TaskTable {
    tasks: Arc<Mutex<Tasks>>,
    /// Unread output this session's tasks keep on the worker's disk.
    quota: OnceLock<Arc<Quota>>,
}

impl TaskTable {
    /// The session's quota of kept task output (made with `limit` on first use).
    pub fn quota(&self, limit: u64) -> Arc<Quota> {
        self.quota
            .get_or_init(|| Quota::new(Cap::Session, limit))
            .clone()
    }

    pub fn running(&self) -> usize {
        self.tasks
            .lock()
            .expect("tasks lock")
            .by_id
            .values()
            .filter(|t| t.status().0 == TaskStatus::Running)
            .count()
    }

    pub fn get(&self, task_id: &str) -> Result<Arc<Task>, ToolError> {
        let tasks = self.tasks.lock().expect("tasks lock");
        if let Some(task) = tasks.by_id.get(task_id) {
            return Ok(task.clone());
        }
        if tasks.dropped.iter().any(|id| id == task_id) {
            return Err(ToolError::new(
                ErrorCode::NotFound,
                format!(
                    "task {task_id:?} ended and was dropped with its unread output: a session keeps its {MAX_ENDED_TASKS} most recently ended tasks"
                ),
            )
            .with("dropped", true));
        }
        Err(ToolError::new(
            ErrorCode::NotFound,
            format!("no task {task_id:?} in this session; list_tasks names them"),
        ))
    }

    /// Every task, oldest first.
    pub fn list(&self) -> Vec<Arc<Task>> {
        let mut tasks: Vec<Arc<Task>> = self
            .tasks
            .lock()
            .expect("tasks lock")
            .by_id
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
        let ended = spool.clone();
        let task = Arc::new(Task {
            task_id: task_id.clone(),
            command,
            started_at: toolmesh_kernel::time::now_rfc3339(),
            state: Mutex::new(TaskState {
                status: TaskStatus::Running,
                exit_code: None,
                kill_requested: false,
            }),
            unread: tokio::sync::Mutex::new(Unread {
                stdout: Spool::new(spool.clone(), &format!("{task_id}-stdout")),
                stderr: Spool::new(spool, &format!("{task_id}-stderr")),
            }),
            changed: Notify::new(),
            reads: tokio::sync::Mutex::new(()),
            stdin: tokio::sync::Mutex::new(stdin),
            kill,
        });
        self.tasks
            .lock()
            .expect("tasks lock")
            .by_id
            .insert(task_id, task.clone());
        let pumped = task.clone();
        let table: Weak<Mutex<Tasks>> = Arc::downgrade(&self.tasks);
        tokio::spawn(async move {
            let mut out = Utf8Decoder::default();
            let mut err = Utf8Decoder::default();
            while let Some(chunk) = output.recv().await {
                {
                    let mut unread = pumped.unread.lock().await;
                    match chunk {
                        Output::Stdout(b) => unread.stdout.push(&out.decode(&b)).await,
                        Output::Stderr(b) => unread.stderr.push(&err.decode(&b)).await,
                    }
                }
                pumped.changed.notify_waiters();
            }
            {
                // No more bytes: a character cut short at the end goes out as it is.
                let mut unread = pumped.unread.lock().await;
                unread.stdout.push(&out.finish()).await;
                unread.stderr.push(&err.finish()).await;
                unread.stdout.settle().await;
                unread.stderr.settle().await;
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
            if let Some(table) = table.upgrade() {
                let gone = table.lock().expect("tasks lock").ended(&pumped.task_id);
                drop(gone); // their spool files go off the async threads
            }
            // After the table's record: whoever the end wakes finds it recorded there too.
            pumped.changed.notify_waiters();
            let task = Arc::downgrade(&pumped);
            drop(pumped);
            hand_over_ended(task, ended).await;
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
    use crate::output::Handover;

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

    /// An execution that writes `stdout` and exits with 0.
    fn finished(stdout: &'static str) -> Execution {
        let (tx, output) = tokio::sync::mpsc::channel(4);
        let (done, exit) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _ = tx.send(Output::Stdout(bytes::Bytes::from(stdout))).await;
            drop(tx);
            let _ = done.send(Ok(crate::backend::ExitStatus { code: 0 }));
        });
        Execution {
            output,
            stdin: None,
            exit,
            kill: KillSwitch(Arc::new(|| Box::pin(async {}))),
        }
    }

    /// Waits until `done` holds, rechecked at each change notice of `task` (no sleep).
    async fn until(task: &Task, done: impl Fn() -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let notified = task.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if done() {
                    return;
                }
                notified.await;
            }
        });
        if waited.await.is_err() {
            panic!("task {} never got there", task.task_id);
        }
    }

    async fn until_ended(task: &Task) {
        until(task, || task.status().0 != TaskStatus::Running).await;
    }

    fn spool_in(dir: &std::path::Path, quotas: Vec<Arc<Quota>>) -> SpoolSettings {
        SpoolSettings {
            dir: dir.to_owned(),
            preview_chars: 4,
            max_bytes: 1 << 20,
            quotas,
            handover: None,
        }
    }

    fn files_in(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |d| d.count())
    }

    #[tokio::test]
    async fn ended_tasks_past_the_kept_count_are_dropped_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let table = TaskTable::default();
        let quota = table.quota(1 << 30);
        let total = MAX_ENDED_TASKS + 3;
        for i in 0..total {
            let task = table
                .start(
                    format!("task-{i:02}"),
                    "echo".into(),
                    finished("unread output, longer than the preview\n"),
                    spool_in(dir.path(), vec![quota.clone()]),
                )
                .unwrap();
            // The table has recorded the end (the pump's last step) before the next one ends.
            until(&task, || {
                table.tasks.lock().unwrap().ended.back() == Some(&task.task_id)
            })
            .await;
        }
        let listed: Vec<String> = table.list().iter().map(|t| t.task_id.clone()).collect();
        assert_eq!(listed.len(), MAX_ENDED_TASKS);
        assert_eq!(listed[0], "task-03", "the first ended go first");
        for gone in ["task-00", "task-01", "task-02"] {
            let e = table.get(gone).unwrap_err();
            assert_eq!(e.code, ErrorCode::NotFound);
            assert!(e.message.contains("dropped"), "{}", e.message);
        }
        let e = table.get("task-never").unwrap_err();
        assert!(!e.message.contains("dropped"), "{}", e.message);
        // The dropped tasks' spool files are gone and their bytes given back.
        let kept = table.get("task-03").unwrap();
        // Their removal runs on the blocking pool, which gives no notice to wait on.
        for _ in 0..500 {
            if files_in(dir.path()) == MAX_ENDED_TASKS {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(files_in(dir.path()), MAX_ENDED_TASKS);
        let per_task = "unread output, longer than the preview\n".len() as u64;
        assert_eq!(quota.used(), per_task * MAX_ENDED_TASKS as u64);
        // A kept task still reads its output whole.
        let read = kept.read(None, Duration::ZERO).await;
        assert_eq!(read.stdout.file.as_ref().unwrap().bytes, per_task);
        assert_eq!(read.status, TaskStatus::Exited);
    }

    #[tokio::test]
    async fn a_session_cap_drops_unread_output_and_says_which_cap() {
        let dir = tempfile::tempdir().unwrap();
        let table = TaskTable::default();
        let session = table.quota(50);
        let worker = Quota::new(Cap::Worker, 1 << 30);
        let text = "0123456789012345678901234567890123456789\n"; // 41 bytes
        let mut reads = Vec::new();
        for i in 0..2 {
            let task = table
                .start(
                    format!("task-{i}"),
                    "echo".into(),
                    finished(text),
                    spool_in(dir.path(), vec![session.clone(), worker.clone()]),
                )
                .unwrap();
            until_ended(&task).await;
            reads.push(task);
        }
        let first = reads[0].read(None, Duration::ZERO).await;
        assert_eq!((first.dropped_bytes(), first.dropped_cap()), (0, None));
        let second = reads[1].read(None, Duration::ZERO).await;
        assert_eq!(second.stdout.chars, 41, "counted whole");
        assert_eq!(second.stdout.file.as_ref().unwrap().bytes, 50 - 41);
        assert_eq!(second.dropped_bytes(), 41 - 9);
        assert_eq!(second.dropped_cap(), Some(Cap::Session));
        assert_eq!(worker.used(), 50);
        drop((first, second));
        assert_eq!((session.used(), worker.used()), (0, 0));
    }

    #[tokio::test]
    async fn a_pattern_is_found_in_output_on_disk_and_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let table = TaskTable::default();
        let big: &'static str = Box::leak(
            format!("{}READY on disk\ntail in memory\n", "x\n".repeat(100_000)).into_boxed_str(),
        );
        let task = table
            .start(
                "task-p".into(),
                "echo".into(),
                finished(big),
                spool_in(dir.path(), Vec::new()),
            )
            .unwrap();
        until_ended(&task).await;
        let on_disk = regex::Regex::new("^READY on disk$").unwrap();
        let read = task.read(Some(&on_disk), Duration::from_secs(5)).await;
        assert_eq!(read.matched, Some(true));
        assert_eq!(read.stdout.bytes, big.len() as u64);
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

    /// Puts into a map, at once.
    fn handover_to_map(files: &Arc<Mutex<std::collections::BTreeMap<String, String>>>) -> Handover {
        let files = files.clone();
        Handover::new(Arc::new(move |path, bytes, file| {
            use std::os::unix::fs::FileExt;
            let mut text = vec![0u8; bytes as usize];
            file.read_exact_at(&mut text, 0).unwrap();
            let text = String::from_utf8(text).unwrap();
            files.lock().unwrap().insert(path, text);
            Box::pin(std::future::ready(Ok(())))
        }))
    }

    #[tokio::test]
    async fn an_ended_task_hands_its_output_over_once_its_session_s_cap_is_pressed() {
        let dir = tempfile::tempdir().unwrap();
        let table = TaskTable::default();
        let session = table.quota(1000);
        let files = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
        // A task ends with 330 bytes unread, a third of the session's cap: it keeps them …
        let text = "0123456789\n".repeat(30);
        let task = table
            .start(
                "task-t".into(),
                "echo".into(),
                finished(Box::leak(text.clone().into_boxed_str())),
                SpoolSettings {
                    handover: Some(handover_to_map(&files)),
                    ..spool_in(dir.path(), vec![session.clone()])
                },
            )
            .unwrap();
        until_ended(&task).await;
        assert_eq!(session.used(), 330);
        // … until another task's output takes the session past half its cap: then the ended
        // task hands its text to the workspace and keeps only its preview.
        let hog = table
            .start(
                "task-hog".into(),
                "echo".into(),
                finished(Box::leak("h".repeat(600).into_boxed_str())),
                spool_in(dir.path(), vec![session.clone()]),
            )
            .unwrap();
        until_ended(&hog).await;
        for _ in 0..500 {
            if session.used() == 600 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(
            session.used(),
            600,
            "the ended task holds nothing of the cap"
        );
        let read = task.read(None, Duration::ZERO).await;
        assert_eq!(read.stdout.parts.len(), 1);
        assert_eq!(
            read.stdout.parts[0].path,
            ".toolmesh/outputs/task-t-stdout-part-0.txt"
        );
        assert_eq!(files.lock().unwrap()[&read.stdout.parts[0].path], text);
        assert_eq!(read.stdout.file.as_ref().map(|f| f.bytes), Some(0));
        assert_eq!((read.dropped_bytes(), read.dropped_cap()), (0, None));
        assert_eq!(read.stdout.preview, "0123");
    }
}
