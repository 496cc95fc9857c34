//! Logs in tests: a child process's log read line by line as it comes ([`LogTap`]), and what
//! `tracing` writes while a closure runs ([`captured_logs`]).

use std::time::{Duration, Instant};

/// What `log` writes through `tracing` while it runs on this thread, every level, as a node
/// writes it (`src/cli/run.rs`: the text format, or JSON lines with `json`), ANSI colours off.
pub fn captured_logs(json: bool, log: impl FnOnce()) -> String {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone());
    if json {
        tracing::subscriber::with_default(builder.json().finish(), log);
    } else {
        tracing::subscriber::with_default(builder.finish(), log);
    }
    let bytes = buffer.0.lock().unwrap().clone();
    String::from_utf8(bytes).expect("logs are UTF-8")
}

/// The lines a child process writes to one of its pipes, read on a thread of their own as they
/// come (the pipe never fills), kept, and each handed to `forward` first: to read what a
/// server says (where it listens) while its log goes on.
#[derive(Debug, Clone)]
pub struct LogTap(std::sync::Arc<TapState>);

#[derive(Debug, Default)]
struct TapState {
    /// The lines so far, and whether the pipe has closed (the process ended).
    lines: std::sync::Mutex<(Vec<String>, bool)>,
    changed: std::sync::Condvar,
}

impl LogTap {
    pub fn start(
        stream: impl std::io::Read + Send + 'static,
        mut forward: impl FnMut(&str) + Send + 'static,
    ) -> LogTap {
        use std::io::BufRead as _;
        let tap = LogTap(Default::default());
        let state = tap.0.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                forward(&line);
                state.lines.lock().unwrap().0.push(line);
                state.changed.notify_all();
            }
            state.lines.lock().unwrap().1 = true;
            state.changed.notify_all();
        });
        tap
    }

    /// The first answer of `find` for a line, written already or to come; `None` when the pipe
    /// closes or `timeout` passes first.
    pub fn find<T>(&self, timeout: Duration, mut find: impl FnMut(&str) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut lines = self.0.lines.lock().unwrap();
        let mut next = 0;
        loop {
            while next < lines.0.len() {
                if let Some(found) = find(&lines.0[next]) {
                    return Some(found);
                }
                next += 1;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if lines.1 || left.is_zero() {
                return None;
            }
            lines = self.0.changed.wait_timeout(lines, left).unwrap().0;
        }
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        let lines = self.0.lines.lock().unwrap();
        lines.0.iter().map(|l| format!("{l}\n")).collect()
    }
}
