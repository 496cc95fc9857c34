//! Exit codes of Docker execs as the daemon announces them (`exec_die` events), so that a
//! finished command's exit code needs no `inspect_exec` round trip after its output ended
//! (about 0.7 ms on a busy 2-core host right after an exec, measured by benches/sandbox.rs).
//!
//! One events stream per backend, filtered to `exec_die` of toolmesh's containers. An exec is
//! registered right before it starts; the daemon records the exit code, closes the exec's
//! streams and only then sends `exec_die`, so the event arrives about when the output ends.
//! The stream is (re)opened with `since` a moment before it was last known to be open, so an
//! exec that ended while it was being opened is replayed, not missed.
//!
//! This is only a shortcut: [`ExitNotice::wait`] gives up after [`EVENT_WAIT`] (the stream is
//! down, the daemon dropped the event) and the caller asks `inspect_exec` as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::models::EventMessage;
use bollard::query_parameters::EventsOptions;
use bollard::Docker;
use futures::StreamExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::LABEL_MANAGED;

/// How long an ended exec waits for its event before asking `inspect_exec`.
pub const EVENT_WAIT: Duration = Duration::from_millis(50);
/// Replayed history on (re)connecting: events since this long before the last open stream.
const REPLAY_MARGIN: Duration = Duration::from_secs(2);
/// Pause before reconnecting a failed stream.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// The exit codes of registered execs, fed by one `exec_die` events stream.
pub struct ExecExits {
    waiting: Mutex<HashMap<String, oneshot::Sender<i64>>>,
    /// False while the stream is being re-opened after a failure: waits are not worth it then.
    live: AtomicBool,
    watcher: OnceLock<JoinHandle<()>>,
}

impl std::fmt::Debug for ExecExits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecExits")
            .field("live", &self.live.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A registered exec's exit code, once announced.
#[derive(Debug)]
pub struct ExitNotice {
    exits: Weak<ExecExits>,
    exec_id: String,
    code: oneshot::Receiver<i64>,
}

impl ExecExits {
    /// Starts watching `docker`'s events (needs a Tokio runtime). The watcher ends when the
    /// returned value is dropped.
    pub fn watch(docker: Docker) -> Arc<Self> {
        let exits = Arc::new(Self {
            waiting: Mutex::new(HashMap::new()),
            live: AtomicBool::new(true),
            watcher: OnceLock::new(),
        });
        // Spawned once the Arc exists: the task holds a Weak that must upgrade.
        let task = tokio::spawn(run(docker, Arc::downgrade(&exits)));
        let _ = exits.watcher.set(task);
        exits
    }

    /// Registers `exec_id` (before it starts) for its exit code.
    pub fn register(self: &Arc<Self>, exec_id: &str) -> ExitNotice {
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .expect("exits lock")
            .insert(exec_id.to_owned(), tx);
        ExitNotice {
            exits: Arc::downgrade(self),
            exec_id: exec_id.to_owned(),
            code: rx,
        }
    }

    /// Whether the stream is believed open: waiting for an event is worth it.
    pub fn is_live(&self) -> bool {
        let watching = self.watcher.get().is_some_and(|task| !task.is_finished());
        watching && self.live.load(Ordering::Relaxed)
    }

    fn announce(&self, exec_id: &str, code: i64) {
        let sender = self.waiting.lock().expect("exits lock").remove(exec_id);
        if let Some(sender) = sender {
            let _ = sender.send(code);
        }
    }
}

impl Drop for ExecExits {
    fn drop(&mut self) {
        if let Some(task) = self.watcher.take() {
            task.abort();
        }
    }
}

impl ExitNotice {
    /// The exit code, if the daemon announces it within `bound` (call once the exec's output
    /// ended; [`EVENT_WAIT`] in the backend); `None` at once while the stream is down. `None`:
    /// ask `inspect_exec`.
    pub async fn wait(mut self, bound: Duration) -> Option<i64> {
        if let Ok(code) = self.code.try_recv() {
            return Some(code);
        }
        if !self.exits.upgrade().is_some_and(|e| e.is_live()) {
            return None;
        }
        tokio::time::timeout(bound, &mut self.code)
            .await
            .ok()
            .and_then(Result::ok)
    }
}

impl Drop for ExitNotice {
    fn drop(&mut self) {
        if let Some(exits) = self.exits.upgrade() {
            exits
                .waiting
                .lock()
                .expect("exits lock")
                .remove(&self.exec_id);
        }
    }
}

/// The exec id and exit code an `exec_die` event carries.
fn exit_of(event: &EventMessage) -> Option<(&str, i64)> {
    let attributes = event.actor.as_ref()?.attributes.as_ref()?;
    let exec_id = attributes.get("execID")?;
    let code = attributes.get("exitCode")?.parse().ok()?;
    Some((exec_id.as_str(), code))
}

fn unix_seconds(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:09}", since.as_secs(), since.subsec_nanos())
}

async fn run(docker: Docker, exits: Weak<ExecExits>) {
    let mut open_since = SystemTime::now();
    loop {
        let options = EventsOptions {
            since: Some(unix_seconds(open_since - REPLAY_MARGIN)),
            until: None,
            filters: Some(HashMap::from([
                ("type".to_owned(), vec!["container".to_owned()]),
                ("event".to_owned(), vec!["exec_die".to_owned()]),
                ("label".to_owned(), vec![format!("{LABEL_MANAGED}=1")]),
            ])),
        };
        let mut events = docker.events(Some(options));
        let failure = loop {
            match events.next().await {
                Some(Ok(event)) => {
                    let Some(exits) = exits.upgrade() else { return };
                    exits.live.store(true, Ordering::Relaxed);
                    open_since = SystemTime::now();
                    if let Some((exec_id, code)) = exit_of(&event) {
                        exits.announce(exec_id, code);
                    }
                }
                Some(Err(e)) => break e.to_string(),
                None => break "the stream ended".to_owned(),
            }
        };
        let Some(exits) = exits.upgrade() else { return };
        exits.live.store(false, Ordering::Relaxed);
        drop(exits);
        tracing::debug!(error = %failure, "docker events stream closed; exit codes come from inspect_exec until it is back");
        tokio::time::sleep(RECONNECT_DELAY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::EventActor;

    fn event(attributes: &[(&str, &str)]) -> EventMessage {
        EventMessage {
            actor: Some(EventActor {
                id: Some("c".into()),
                attributes: Some(
                    attributes
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
            }),
            ..Default::default()
        }
    }

    /// With no daemon behind the stream, execs go straight to `inspect_exec` (no wait).
    #[tokio::test]
    async fn a_dead_stream_sends_execs_to_inspect_at_once() {
        // A path that exists but where no daemon listens: every request fails.
        let not_a_socket = tempfile::NamedTempFile::new().expect("temp file");
        let path = not_a_socket.path().to_str().expect("utf-8 path");
        let docker = Docker::connect_with_unix(path, 5, bollard::API_DEFAULT_VERSION)
            .expect("a client (it connects lazily)");
        let exits = ExecExits::watch(docker);
        tokio::time::timeout(Duration::from_secs(10), async {
            while exits.is_live() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the failed stream is noticed");
        let notice = exits.register("exec-1");
        let started = std::time::Instant::now();
        assert_eq!(notice.wait(Duration::from_secs(30)).await, None);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(exits.waiting.lock().unwrap().is_empty(), "unregistered");
    }

    #[test]
    fn an_exec_die_event_gives_its_exec_and_code() {
        let e = event(&[("execID", "abc"), ("exitCode", "3"), ("name", "x")]);
        assert_eq!(exit_of(&e), Some(("abc", 3)));
        assert_eq!(exit_of(&event(&[("execID", "abc")])), None);
        assert_eq!(
            exit_of(&event(&[("execID", "abc"), ("exitCode", "x")])),
            None
        );
    }
}
