//! The `ServerKeeper`: one per configured MCP server. It starts the server, lists its tools,
//! keeps the server's provider service in step with the list, restarts the server with
//! backoff when it exits, and stops it all on drain.
//!
//! Runtime semantics:
//! * the service exists from the first successful `tools/list` on and keeps its endpoints
//!   while the server restarts, so the tool set does not flap; a call meanwhile answers
//!   `unavailable` at once;
//! * the moment a connection ends (the process exits, the transport closes), every call in
//!   flight on it answers `unavailable`;
//! * `notifications/tools/list_changed` re-lists; a different list replaces the service
//!   ([`crate::provider`]) and is announced on `toolmesh.v1.providers.announce`;
//! * on drain the service stops first (no new calls), calls in flight run until they end or
//!   the drain deadline cancels them (`unavailable`), then the server stops.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use toolmesh_kernel::host::Lifecycle;
use toolmesh_kernel::text::{display_safe, redact_urls, shorten_middle};
use toolmesh_kernel::wire::{McpServerState, McpServerStatus};

use crate::backoff::Backoff;
use crate::config::ServerConfig;
use crate::connection::{self, Connection, Running};
use crate::provider::{announce, Provider, ServerContext};
use crate::tools;

/// Characters of a `last_error` in status.
const MAX_ERROR_CHARS: usize = 500;

pub struct ServerKeeper {
    pub config: ServerConfig,
    pub ctx: Arc<ServerContext>,
    pub connection: watch::Sender<Option<Arc<Connection>>>,
}

/// What ended a running server's watch.
enum Watch {
    Ended(String),
    ToolsChanged,
    Drain,
}

impl ServerKeeper {
    /// The status a server starts with.
    pub fn initial_status(config: &ServerConfig) -> McpServerStatus {
        McpServerStatus {
            name: config.name.clone(),
            service: config.service_name(),
            transport: config.transport.kind().to_owned(),
            state: McpServerState::Starting,
            restarts: 0,
            tools: 0,
            skipped_tools: Vec::new(),
            pid: None,
            last_error: None,
        }
    }

    fn set(&self, update: impl FnOnce(&mut McpServerStatus)) {
        update(&mut self.ctx.status.lock().expect("status lock"));
    }

    fn failed(&self, state: McpServerState, why: &str) {
        // Every account may read status: no credential of the server's URL goes there.
        let why = redact_urls(why);
        let why = display_safe(&shorten_middle(&why, MAX_ERROR_CHARS)).into_owned();
        tracing::warn!(server = %self.config.name, state = state.as_str(), "MCP server: {why}");
        self.set(|s| {
            s.state = state;
            s.pid = None;
            s.last_error = Some(why);
        });
    }

    /// Runs until `lifecycle.drain`, then drains as the module says.
    pub async fn run(self, lifecycle: Lifecycle) {
        let drain = lifecycle.drain.clone();
        let tools_changed = Arc::new(Notify::new());
        let mut backoff = Backoff::default();
        let mut provider: Option<Provider> = None;
        let mut first = true;
        loop {
            if !first {
                self.set(|s| s.restarts += 1);
            }
            first = false;
            let started = Instant::now();
            let attempt = tokio::select! {
                attempt = connection::start(&self.config, tools_changed.clone()) => attempt,
                _ = drain.cancelled() => break,
            };
            match attempt {
                Err(why) => self.failed(McpServerState::Failed, &why),
                Ok(mut running) => match running.list_tools().await {
                    Err(why) => {
                        self.failed(McpServerState::Failed, &why);
                        running.stop().await;
                    }
                    Ok(list) => {
                        provider = self.serve(provider, &list).await;
                        let _ = self.connection.send(Some(running.connection.clone()));
                        let pid = running.connection.pid;
                        self.set(|s| {
                            s.state = McpServerState::Running;
                            s.pid = pid;
                        });
                        tracing::info!(server = %self.config.name, tools = list.len(), "MCP server running");
                        let ended = self
                            .watch(&mut running, &mut provider, &tools_changed, &drain)
                            .await;
                        let _ = self.connection.send(None);
                        match ended {
                            None => {
                                self.stop(provider, running).await;
                                return;
                            }
                            Some(why) => {
                                self.failed(McpServerState::Restarting, &why);
                                running.stop().await;
                            }
                        }
                    }
                },
            }
            let delay = backoff.next_delay(started.elapsed());
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = drain.cancelled() => break,
            }
        }
        self.stop_provider(provider).await;
        self.ctx.tracker.close();
        self.ctx.tracker.wait().await;
    }

    /// Watches a running server until it ends (`Some(why)`) or the drain begins (`None`),
    /// re-listing its tools whenever it says they changed.
    async fn watch(
        &self,
        running: &mut Running,
        provider: &mut Option<Provider>,
        tools_changed: &Notify,
        drain: &CancellationToken,
    ) -> Option<String> {
        loop {
            let event = tokio::select! {
                why = running.ended() => Watch::Ended(why),
                _ = tools_changed.notified() => Watch::ToolsChanged,
                _ = drain.cancelled() => Watch::Drain,
            };
            match event {
                Watch::Ended(why) => return Some(why),
                Watch::Drain => return None,
                Watch::ToolsChanged => match running.list_tools().await {
                    Ok(list) => *provider = self.serve(provider.take(), &list).await,
                    Err(why) => tracing::warn!(
                        server = %self.config.name,
                        "cannot list the changed tools: {}",
                        display_safe(&redact_urls(&why))
                    ),
                },
            }
        }
    }

    /// Makes the provider serve `list`: the same service when nothing changed, else a new one
    /// (started before the old one stops), or none for an empty list.
    async fn serve(
        &self,
        current: Option<Provider>,
        list: &[rmcp::model::Tool],
    ) -> Option<Provider> {
        let (endpoints, skipped) = tools::endpoints(&self.config.name, list);
        for s in &skipped {
            tracing::warn!(server = %self.config.name, tool = %display_safe(&s.tool), "tool not served: {}", s.reason);
        }
        self.set(|s| s.skipped_tools = skipped);
        if current.as_ref().map(|p| &p.endpoints) == Some(&endpoints) {
            return current;
        }
        let count = endpoints.len();
        let next = if endpoints.is_empty() {
            None
        } else {
            match Provider::start(&self.ctx, endpoints, self.config.transport.kind()).await {
                Ok(provider) => Some(provider),
                Err(e) => {
                    tracing::error!(server = %self.config.name, error = %e, "cannot start the provider service");
                    return current;
                }
            }
        };
        if let Some(old) = current {
            old.stop().await;
        }
        self.set(|s| s.tools = count);
        announce(&self.ctx, count).await;
        next
    }

    async fn stop_provider(&self, provider: Option<Provider>) {
        if let Some(provider) = provider {
            provider.stop().await;
            self.set(|s| s.tools = 0);
            announce(&self.ctx, 0).await;
        }
    }

    /// Drain with the server running: no new calls, the calls in flight end (or the deadline
    /// cancels them), then the server stops.
    async fn stop(&self, provider: Option<Provider>, running: Running) {
        self.stop_provider(provider).await;
        self.ctx.tracker.close();
        self.ctx.tracker.wait().await;
        running.stop().await;
        self.set(|s| {
            s.pid = None;
        });
        tracing::info!(server = %self.config.name, "MCP server stopped");
    }
}
