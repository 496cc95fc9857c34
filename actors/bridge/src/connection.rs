//! One connection to one MCP server, through the official SDK (`rmcp`): a child process
//! speaking MCP on its standard input and output (its standard error into the node's log), or
//! a server at a URL over streamable HTTP.
//!
//! The bridge spawns a stdio server itself (in a process group of its own, with only the
//! variables of [`crate::config::INHERITED_ENV`] and its `env`) and hands rmcp the pipes, so
//! it knows the moment the process exits: [`Connection::closed`] is cancelled then, and every
//! call in flight answers `unavailable` at once instead of waiting for the SDK to notice.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use process_wrap::tokio::{ChildWrapper, CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientRequest, Implementation, PaginatedRequestParams,
    ProtocolVersion, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, Peer};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;
use toolmesh_kernel::text::{display_safe, shorten_middle};

use crate::config::{ServerConfig, Transport, INHERITED_ENV};

/// How long a closed connection waits for its process's exit status, to say which ended.
const EXIT_GRACE: Duration = Duration::from_millis(500);

/// How long a start (process, `initialize` handshake) may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopping server has after its input closed before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// Bytes of one stderr line logged at most (longer lines are logged in pieces of this size).
const MAX_STDERR_LINE: usize = 8 * 1024;
/// Characters of one logged stderr line.
const MAX_LOGGED_CHARS: usize = 2000;
/// Pages of `tools/list` read at most (a server that never ends its cursor chain).
const MAX_LIST_PAGES: usize = 100;

/// What calls use: the server's peer, and whether the connection is still there.
#[derive(Debug)]
pub struct Connection {
    pub peer: Peer<RoleClient>,
    /// Cancelled once the connection is gone: the process exited, or the transport closed.
    pub closed: CancellationToken,
    /// The server's process id (stdio servers).
    pub pid: Option<u32>,
}

/// A started server, held by its keeper.
#[derive(Debug)]
pub struct Running {
    pub connection: Arc<Connection>,
    service: RunningService<RoleClient, Listener>,
    child: Option<Box<dyn ChildWrapper>>,
    stderr: Option<JoinHandle<()>>,
}

/// The client side's handler: wakes the keeper when the server's tool list changed.
#[derive(Debug)]
struct Listener {
    server: String,
    tools_changed: Arc<Notify>,
}

impl ClientHandler for Listener {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        tracing::info!(server = %self.server, "the MCP server's tool list changed");
        self.tools_changed.notify_one();
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        // The newest version with an `initialize` handshake: list changes come as plain
        // notifications, which `on_tool_list_changed` receives.
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolmesh-bridge", toolmesh_kernel::VERSION),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }
}

/// Starts `server` and completes the MCP handshake, within [`START_TIMEOUT`].
pub async fn start(server: &ServerConfig, tools_changed: Arc<Notify>) -> Result<Running, String> {
    let listener = Listener {
        server: server.name.clone(),
        tools_changed,
    };
    match &server.transport {
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut wrap = CommandWrap::with_new(command, |c| {
                c.args(args)
                    .env_clear()
                    .envs(
                        INHERITED_ENV
                            .iter()
                            .filter_map(|k| std::env::var_os(k).map(|v| (*k, v))),
                    )
                    .envs(env)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                if let Some(cwd) = cwd {
                    c.current_dir(cwd);
                }
            });
            wrap.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
            let mut child = wrap
                .spawn()
                .map_err(|e| format!("cannot start {command:?}: {e}"))?;
            let pid = child.id();
            let (Some(stdout), Some(stdin)) = (child.stdout().take(), child.stdin().take()) else {
                kill(&mut child).await;
                return Err("the child's pipes are missing".into());
            };
            let stderr = child
                .stderr()
                .take()
                .map(|stderr| tokio::spawn(log_stderr(server.name.clone(), stderr)));
            tracing::info!(server = %server.name, pid = ?pid, "MCP server process started");
            let handshake =
                tokio::time::timeout(START_TIMEOUT, rmcp::serve_client(listener, (stdout, stdin)));
            // The process may die during the handshake: its exit ends the wait at once.
            let outcome = tokio::select! {
                outcome = handshake => outcome,
                status = child.wait() => {
                    let why = match status {
                        Ok(status) => format!("it exited during the MCP handshake ({status})"),
                        Err(e) => format!("it could not be waited for: {e}"),
                    };
                    if let Some(task) = stderr { let _ = task.await; }
                    return Err(why);
                }
            };
            match handshake_outcome(outcome) {
                Ok(service) => Ok(Running::new(service, pid, Some(child), stderr)),
                Err(why) => {
                    kill(&mut child).await;
                    Err(why)
                }
            }
        }
        Transport::Http { url, headers } => {
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(headers.iter().cloned().collect());
            let transport = StreamableHttpClientTransport::from_config(config);
            let handshake =
                tokio::time::timeout(START_TIMEOUT, rmcp::serve_client(listener, transport));
            let service = handshake_outcome(handshake.await)?;
            Ok(Running::new(service, None, None, None))
        }
    }
}

/// The service of a handshake that completed within [`START_TIMEOUT`], or why it did not.
fn handshake_outcome<S, E: std::fmt::Display>(
    outcome: Result<Result<S, E>, tokio::time::error::Elapsed>,
) -> Result<S, String> {
    match outcome {
        Ok(Ok(service)) => Ok(service),
        Ok(Err(e)) => Err(format!("the MCP handshake failed: {e}")),
        Err(_) => Err(format!(
            "no MCP handshake within {} s",
            START_TIMEOUT.as_secs()
        )),
    }
}

impl Running {
    fn new(
        service: RunningService<RoleClient, Listener>,
        pid: Option<u32>,
        child: Option<Box<dyn ChildWrapper>>,
        stderr: Option<JoinHandle<()>>,
    ) -> Running {
        Running {
            connection: Arc::new(Connection {
                peer: service.peer().clone(),
                closed: CancellationToken::new(),
                pid,
            }),
            service,
            child,
            stderr,
        }
    }

    /// The server's whole tool list (every page), read fresh (no SDK cache).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, String> {
        let peer = &self.connection.peer;
        let mut tools = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_LIST_PAGES {
            let request = ClientRequest::ListToolsRequest(rmcp::model::ListToolsRequest {
                method: Default::default(),
                params: Some(PaginatedRequestParams::default().with_cursor(cursor)),
                extensions: Default::default(),
            });
            let page = tokio::select! {
                page = tokio::time::timeout(START_TIMEOUT, peer.send_request(request)) => page,
                _ = self.connection.closed.cancelled() => return Err("it stopped during tools/list".into()),
            };
            match page {
                Ok(Ok(ServerResult::ListToolsResult(page))) => {
                    tools.extend(page.tools);
                    cursor = page.next_cursor;
                    if cursor.is_none() {
                        return Ok(tools);
                    }
                }
                Ok(Ok(_)) => return Err("tools/list answered something else".into()),
                Ok(Err(e)) => return Err(format!("tools/list failed: {e}")),
                Err(_) => {
                    return Err(format!(
                        "tools/list gave no answer within {} s",
                        START_TIMEOUT.as_secs()
                    ))
                }
            }
        }
        Err(format!("tools/list has more than {MAX_LIST_PAGES} pages"))
    }

    /// Resolves when the connection is gone (the process exited, the transport closed), with
    /// why; [`Connection::closed`] is cancelled by then.
    pub async fn ended(&mut self) -> String {
        let why = {
            let service_ended = async {
                // The service loop ends when the transport does.
                while !self.service.is_closed() && !self.connection.peer.is_transport_closed() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            match self.child.as_mut() {
                Some(child) => {
                    let exited = tokio::select! {
                        status = child.wait() => Some(status),
                        _ = service_ended => None,
                    };
                    // A dying process closes its pipes first: a moment's wait tells an exit
                    // (the likelier story, and the one status should give) from a server that
                    // closed the connection and lives on.
                    let exited = match exited {
                        Some(status) => Some(status),
                        None => tokio::time::timeout(EXIT_GRACE, child.wait()).await.ok(),
                    };
                    match exited {
                        Some(Ok(status)) => format!("the process exited ({status})"),
                        Some(Err(e)) => format!("the process could not be waited for: {e}"),
                        None => "its MCP connection closed".to_owned(),
                    }
                }
                None => {
                    service_ended.await;
                    "its MCP connection closed".to_owned()
                }
            }
        };
        self.connection.closed.cancel();
        why
    }

    /// Stops the server: closes the connection (a stdio server's input), gives the process
    /// [`STOP_GRACE`] to exit, then kills its process group.
    pub async fn stop(mut self) {
        self.connection.closed.cancel();
        let _ = self.service.close_with_timeout(STOP_GRACE).await;
        if let Some(mut child) = self.child.take() {
            if tokio::time::timeout(STOP_GRACE, child.wait())
                .await
                .is_err()
            {
                kill(&mut child).await;
            } else {
                // The leader is gone; anything it left in its group goes with it.
                let _ = child.start_kill();
            }
        }
        if let Some(task) = self.stderr.take() {
            let _ = tokio::time::timeout(STOP_GRACE, task).await;
        }
    }
}

async fn kill(child: &mut Box<dyn ChildWrapper>) {
    let _ = child.start_kill();
    let _ = tokio::time::timeout(STOP_GRACE, child.wait()).await;
}

/// Logs a server's standard error line by line, display-safe, with its name.
async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(MAX_STDERR_LINE));
    while let Some(line) = lines.next().await {
        match line {
            Ok(line) => tracing::info!(
                server = %server,
                "mcp stderr: {}",
                display_safe(&shorten_middle(&line, MAX_LOGGED_CHARS))
            ),
            Err(LinesCodecError::MaxLineLengthExceeded) => tracing::info!(
                server = %server,
                "mcp stderr: (a line over {MAX_STDERR_LINE} bytes, not shown)"
            ),
            Err(LinesCodecError::Io(e)) => {
                tracing::debug!(server = %server, error = %e, "the server's stderr closed");
                return;
            }
        }
    }
}
