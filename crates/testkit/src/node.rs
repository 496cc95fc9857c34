//! A `toolmesh node` process for tests ([`NodeSpec`] starts one, [`Node`] holds it), and the
//! addresses its listeners log ([`Listener`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::logs::LogTap;

/// A `toolmesh node` process (the real binary), stopped on drop. Its log (stderr) goes on to
/// this process's stderr as before, and is read for the addresses its listeners bound: give a
/// listener port 0 (`TOOLMESH_MCP_LISTEN=127.0.0.1:0`) and ask [`Node::addr`].
#[derive(Debug)]
pub struct Node {
    child: Child,
    pub node_id: String,
    log: LogTap,
}

/// A listener of a node, which logs the address it bound at `info` (the node's log
/// level is raised to `info` for these lines only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// `TOOLMESH_MCP_LISTEN` (role `mcp`).
    Mcp,
    /// `TOOLMESH_CONSOLE_LISTEN` (role `console`).
    Console,
    /// `TOOLMESH_METRICS_LISTEN`.
    Metrics,
}

impl Listener {
    const ALL: [Listener; 3] = [Listener::Mcp, Listener::Console, Listener::Metrics];

    /// The log target and the start of the message of the line that names the address.
    fn line(self) -> (&'static str, &'static str) {
        match self {
            Listener::Mcp => ("toolmesh_mcp", "MCP over streamable HTTP at /mcp"),
            Listener::Console => ("toolmesh_console", "approvals console at "),
            Listener::Metrics => ("toolmesh::metrics", "serving metrics at /metrics"),
        }
    }

    /// The address in `line` when it is this listener's line, in the text or the JSON format.
    fn addr_in(self, line: &str) -> Option<std::net::SocketAddr> {
        let (target, message) = self.line();
        if let Ok(json) = serde_json::from_str::<serde_json::Value>(line) {
            let fields = &json["fields"];
            if json["target"] != target || !fields["message"].as_str()?.starts_with(message) {
                return None;
            }
            return fields["addr"].as_str()?.parse().ok();
        }
        let (_, rest) = line.split_once(&format!(" {target}: {message}"))?;
        let (_, addr) = rest.split_once(" addr=")?;
        addr.split_whitespace().next()?.parse().ok()
    }

    /// Whether `line` is an `info` line of this listener's target (shown only because the
    /// level was raised for it).
    fn is_info_of(self, line: &str) -> bool {
        let (target, _) = self.line();
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(json) => json["level"] == "INFO" && json["target"] == target,
            Err(_) => line.contains(&format!(" INFO {target}: ")),
        }
    }
}

/// How to start a node.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub binary: PathBuf,
    pub roles: String,
    pub node_id: String,
    pub env: Vec<(String, String)>,
}

impl NodeSpec {
    pub fn new(binary: impl Into<PathBuf>, roles: &str, node_id: &str) -> NodeSpec {
        NodeSpec {
            binary: binary.into(),
            roles: roles.into(),
            node_id: node_id.into(),
            env: Vec::new(),
        }
    }

    pub fn env(mut self, key: &str, value: impl Into<String>) -> NodeSpec {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts the node and waits until it answers `toolmesh.v1.status.<node_id>`.
    pub async fn start(&self, nats: &async_nats::Client) -> Node {
        let chosen = self
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "RUST_LOG")
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var("RUST_LOG").ok());
        // The listeners' address lines at `info` first, so that a level the caller sets for
        // one of their targets wins.
        let raised: Vec<String> = Listener::ALL
            .iter()
            .map(|l| format!("{}=info", l.line().0))
            .collect();
        let filter = format!(
            "{},{}",
            raised.join(","),
            chosen.as_deref().unwrap_or("warn")
        );
        let mut cmd = Command::new(&self.binary);
        cmd.args(["node", "--roles", &self.roles])
            .env("TOOLMESH_NODE_ID", &self.node_id)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.env("RUST_LOG", filter);
        let mut child = cmd.spawn().expect("toolmesh node starts");
        // Passed on as an inherited stderr would show it (past the test harness's capture),
        // without the lines only the raised level let through.
        let hide_raised = chosen.is_none();
        let log = LogTap::start(child.stderr.take().expect("stderr"), move |line| {
            if hide_raised && Listener::ALL.iter().any(|l| l.is_info_of(line)) {
                return;
            }
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        });
        let subject = format!("toolmesh.v1.status.{}", self.node_id);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("node {} exited during startup: {status}", self.node_id);
            }
            let ask = nats.request(subject.clone(), "{}".into());
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), ask).await {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {} did not answer status within 15 s",
                self.node_id
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Node {
            child,
            node_id: self.node_id.clone(),
            log,
        }
    }
}

impl Node {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address `listener` bound, as the node logged it (before it answered status, so
    /// this waits only for the log's reader). Panics when the node has no such listener.
    pub fn addr(&self, listener: Listener) -> std::net::SocketAddr {
        self.log
            .find(Duration::from_secs(10), |line| listener.addr_in(line))
            .unwrap_or_else(|| {
                panic!(
                    "node {} logged no address of its {listener:?} listener:\n{}",
                    self.node_id,
                    self.log.text()
                )
            })
    }

    /// SIGKILL: the node dies without draining.
    pub fn kill(&mut self) {
        crate::process::stop(&mut self.child);
    }

    /// Sends SIGHUP (a gateway reads its policy file again).
    pub fn hangup(&self) {
        let _ = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status();
    }

    /// Whether the node writes a log line holding `needle` within `timeout` (lines written
    /// already count). Blocks the thread while it waits.
    pub fn logs(&self, needle: &str, timeout: Duration) -> bool {
        self.log
            .find(timeout, |line| line.contains(needle).then_some(()))
            .is_some()
    }

    /// Sends SIGTERM (the node drains).
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// SIGTERM, then waits (blocking the thread) up to `timeout` for the drained node to exit,
    /// then SIGKILL if it has not. True when it exited by itself (or was gone already). For
    /// `Drop`s that must clean up after a node.
    pub fn stop_blocking(&mut self, timeout: Duration) -> bool {
        if let Ok(Some(_)) = self.child.try_wait() {
            return true;
        }
        self.terminate();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// Waits for the process to exit; `None` if it is still running after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use crate::node::Listener;

    /// `line` is `listener`'s line naming `addr`, or no line of it (`None`).
    fn check(listener: Listener, line: &str, addr: Option<&str>) {
        let expected = addr.map(|a| a.parse().unwrap());
        assert_eq!(listener.addr_in(line), expected, "{listener:?} in {line}");
    }

    #[test]
    fn a_nodes_listener_lines_name_their_addresses() {
        let text = "2026-12-04T22:46:40.583768Z  INFO";
        check(
            Listener::Metrics,
            &format!("{text} toolmesh::metrics: serving metrics at /metrics addr=127.0.0.1:34447"),
            Some("127.0.0.1:34447"),
        );
        check(
            Listener::Mcp,
            &format!("{text} toolmesh_mcp: MCP over streamable HTTP at /mcp addr=127.0.0.1:37989"),
            Some("127.0.0.1:37989"),
        );
        check(
            Listener::Console,
            &format!("{text} toolmesh_console: approvals console at http://127.0.0.1:46327/ addr=127.0.0.1:46327"),
            Some("127.0.0.1:46327"),
        );
        check(
            Listener::Mcp,
            r#"{"timestamp":"2026-12-04T22:46:44.616294Z","level":"INFO","fields":{"message":"MCP over streamable HTTP at /mcp","addr":"127.0.0.1:43449"},"target":"toolmesh_mcp"}"#,
            Some("127.0.0.1:43449"),
        );
        // Another listener's line, another line of the target, another target.
        check(
            Listener::Console,
            &format!("{text} toolmesh_mcp: MCP over streamable HTTP at /mcp addr=127.0.0.1:1"),
            None,
        );
        check(
            Listener::Console,
            &format!("{text} toolmesh_console: TOOLMESH_CONSOLE_TOKENS is not set"),
            None,
        );
        check(
            Listener::Metrics,
            r#"{"level":"INFO","fields":{"message":"serving metrics at /metrics","addr":"127.0.0.1:2"},"target":"other"}"#,
            None,
        );
    }

    #[test]
    fn only_the_raised_info_lines_are_hidden() {
        let raised = |line: &str| Listener::ALL.iter().any(|l| l.is_info_of(line));
        assert!(raised(
            "2026-12-04T22:46:40Z  INFO toolmesh_mcp: MCP over streamable HTTP"
        ));
        assert!(raised(r#"{"level":"INFO","target":"toolmesh::metrics"}"#));
        assert!(!raised(
            "2026-12-04T22:46:40Z  WARN toolmesh_console: no tokens"
        ));
        assert!(!raised(
            "2026-12-04T22:46:40Z  INFO toolmesh::node: started"
        ));
    }
}
