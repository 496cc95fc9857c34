//! `redis-server` for tests ([`RedisServer`]): on a candidate port, retried when taken,
//! persisting into its own temp dir across restarts.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use crate::logs::LogTap;
use crate::process::{find_binary, temp_dir, SERVER_START};

/// A `redis-server` on a port of its own, persisting (AOF) into its own temp dir so that a
/// restart on the same dir keeps the data.
///
/// redis-server cannot pick its port (`--port 0` means no TCP at all), so it starts on a
/// random candidate below the range the kernel hands out for port 0 and, when that port is
/// taken (its log says "Address already in use" and it exits), again on another: the port is
/// never bound and released before the server takes it.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    /// Arguments past the usual ones, kept for [`RedisServer::restart`].
    args: Vec<String>,
}

/// How many taken candidate ports [`on_a_candidate_port`] tries past.
const REDIS_TRIES: usize = 50;

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// [`RedisServer::start`] with more arguments (`--replicaof 127.0.0.1 <port>`), kept for
    /// restarts.
    pub fn start_with(args: &[String]) -> RedisServer {
        let dir = temp_dir();
        let (child, port) =
            on_a_candidate_port("redis-server", |port| Self::spawn(port, &dir, args));
        RedisServer {
            child,
            port,
            dir,
            args: args.to_vec(),
        }
    }

    /// Starts redis-server on `port`: `Err` when the port is taken; a panic with its log when
    /// it stops for another reason.
    fn spawn(
        port: u16,
        dir: &tempfile::TempDir,
        args: &[String],
    ) -> Result<(Child, u16), PortTaken> {
        let mut command = Command::new(find_binary("redis-server", "redis-server"));
        command
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
            ])
            .arg(dir.path())
            .args(args);
        // "Ready" comes once it listens and has loaded its AOF.
        let ready = "Ready to accept connections";
        let (child, _log) = spawn_until(command, "redis-server", port, ready)?;
        Ok((child, port))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server (SIGKILL); `restart` brings it back with its data, on its port.
    pub fn kill(&mut self) {
        crate::process::stop(&mut self.child);
    }

    /// Kills the server (SIGKILL) if it runs and starts it again on the same port and data
    /// directory (clients expect it there: a port taken meanwhile is a panic).
    pub fn restart(&mut self) {
        self.kill();
        let (child, _) =
            Self::spawn(self.port, &self.dir, &self.args).unwrap_or_else(|PortTaken| {
                panic!("port {} was taken while redis-server was down", self.port)
            });
        self.child = child;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// redis-server reported its port in use.
#[derive(Debug)]
pub(crate) struct PortTaken;

/// What `spawn` started on the first random [`candidate_port`] that was not taken; `what` names
/// the server in the panic when [`REDIS_TRIES`] ports in a row were.
pub(crate) fn on_a_candidate_port<T>(
    what: &str,
    mut spawn: impl FnMut(u16) -> Result<T, PortTaken>,
) -> T {
    for _ in 0..REDIS_TRIES {
        match spawn(candidate_port()) {
            Ok(started) => return started,
            Err(PortTaken) => continue,
        }
    }
    panic!("{what} found no free port in {REDIS_TRIES} tries");
}

/// Starts `command`, a redis-server (`what`) on `port` that logs to stdout, and waits for a
/// line holding `ready`: the child and its log. `Err` when the port is taken; a panic with its
/// log when it stops for another reason.
pub(crate) fn spawn_until(
    mut command: Command,
    what: &str,
    port: u16,
    ready: &str,
) -> Result<(Child, LogTap), PortTaken> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    let log = LogTap::start(child.stdout.take().expect("stdout"), |_| {});
    if log
        .find(SERVER_START, |l| l.contains(ready).then_some(()))
        .is_some()
    {
        return Ok((child, log));
    }
    crate::process::stop(&mut child);
    let text = log.text();
    if text.contains("Address already in use") {
        return Err(PortTaken);
    }
    panic!("{what} did not start on port {port}:\n{text}");
}

/// A random port below the kernel's ephemeral range (`ip_local_port_range`), where no port-0
/// listener or outgoing connection of this machine lands; anything else there is a retry.
pub(crate) fn candidate_port() -> u16 {
    use std::hash::BuildHasher as _;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(32_768);
    let (from, to) = if low > 11_000 {
        (10_000, low)
    } else {
        (10_000, 65_536)
    };
    let random = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    u16::try_from(from + random % (to - from)).expect("a port number")
}

#[cfg(test)]
mod tests {
    use crate::process::temp_dir;
    use crate::redis::{PortTaken, RedisServer};

    #[tokio::test]
    async fn two_redis_servers_get_two_ports_and_one_comes_back_on_its_own() {
        let first = RedisServer::start();
        let mut second = RedisServer::start();
        assert_ne!(first.port(), second.port());
        let port = second.port();
        second.restart();
        assert_eq!(second.port(), port);
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("redis-server listens again");
    }

    #[test]
    fn a_taken_candidate_port_is_retried() {
        let dir = temp_dir();
        let first = RedisServer::start();
        assert!(matches!(
            RedisServer::spawn(first.port(), &dir, &[]),
            Err(PortTaken)
        ));
    }
}
