//! The toolmesh MCP front door (PROTOCOL.md "MCP front"): any MCP client uses the mesh.
//!
//! [`serve_stdio`] speaks MCP on standard input and output for one account (`toolmesh mcp`);
//! the role `mcp` ([`spawn`]) serves streamable HTTP at `/mcp`, with bearer tokens mapped to
//! accounts. Either way the front is a client of the mesh: `tools/list` and `tools/call` are
//! requests on the gateway's call subject, like the command line's.
//!
//! Several HTTP front nodes may run at once. The HTTP side is stateless (rmcp's stateless
//! mode: no `Mcp-Session-Id`, each POST served on its own); a call's progress travels on that
//! call's own response stream, and an approval question is an MCP `InputRequiredResult` whose
//! `requestState` names the approval, so the client's retry may reach any node.

mod front;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt as _;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use toolmesh_kernel::config::RawEnv;
use toolmesh_kernel::host::{ActorHandle, Lifecycle};
use toolmesh_kernel::{Account, Role};

pub use front::{mcp_tool, reply_result, Caller, Front, FrontSettings};

/// `TOOLMESH_MCP_LISTEN`'s default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8931";
/// `TOOLMESH_MCP_APPROVAL_WAIT_S`'s default.
pub const DEFAULT_APPROVAL_WAIT_S: u64 = 120;
/// The profiles a token or `--profile` may name.
pub const PROFILES: [&str; 4] = ["default", "focused", "core", "coding"];
/// The header naming the toolmesh session of an HTTP request.
pub const SESSION_HEADER: &str = "x-toolmesh-session";

#[derive(Debug, thiserror::Error)]
pub enum McpConfigError {
    #[error("{key}={value:?} is not valid: {reason}")]
    Invalid {
        key: &'static str,
        value: String,
        reason: String,
    },
    #[error("the MCP tokens file {path}: {reason}")]
    Tokens { path: PathBuf, reason: String },
}

/// The role's settings, from `TOOLMESH_MCP_*` (and `TOOLMESH_APPROVAL_IN_BAND`).
#[derive(Debug, Clone)]
pub struct McpConfig {
    pub listen: SocketAddr,
    /// Bearer token → caller (session unset: the request's header names it).
    pub tokens: HashMap<String, Arc<Caller>>,
    pub front: FrontSettings,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    account: String,
    #[serde(default)]
    profile: Option<String>,
}

impl McpConfig {
    pub fn from_env(env: &RawEnv) -> Result<McpConfig, McpConfigError> {
        let listen_raw = env.get("TOOLMESH_MCP_LISTEN").unwrap_or(DEFAULT_LISTEN);
        let listen = listen_raw
            .trim()
            .parse()
            .map_err(|e: std::net::AddrParseError| McpConfigError::Invalid {
                key: "TOOLMESH_MCP_LISTEN",
                value: listen_raw.to_owned(),
                reason: e.to_string(),
            })?;
        let tokens = match env.get("TOOLMESH_MCP_TOKENS") {
            Some(path) => read_tokens(Path::new(path.trim()))?,
            None => HashMap::new(),
        };
        Ok(McpConfig {
            listen,
            tokens,
            front: front_settings(env)?,
        })
    }
}

/// The settings the stdio and the HTTP front share.
pub fn front_settings(env: &RawEnv) -> Result<FrontSettings, McpConfigError> {
    let wait_raw = env.get("TOOLMESH_MCP_APPROVAL_WAIT_S");
    let approval_wait_s = match wait_raw {
        None => DEFAULT_APPROVAL_WAIT_S,
        Some(raw) => raw
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|s| *s <= toolmesh_kernel::wire::MAX_WAIT_FOR_APPROVAL_S)
            .ok_or_else(|| McpConfigError::Invalid {
                key: "TOOLMESH_MCP_APPROVAL_WAIT_S",
                value: raw.to_owned(),
                reason: format!(
                    "use whole seconds from 0 to {}",
                    toolmesh_kernel::wire::MAX_WAIT_FOR_APPROVAL_S
                ),
            })?,
    };
    let in_band = match env.get("TOOLMESH_APPROVAL_IN_BAND").map(str::trim) {
        None | Some("1" | "true" | "yes" | "on") => true,
        Some("0" | "false" | "no" | "off") => false,
        Some(other) => {
            return Err(McpConfigError::Invalid {
                key: "TOOLMESH_APPROVAL_IN_BAND",
                value: other.to_owned(),
                reason: "use 1 or 0".into(),
            })
        }
    };
    Ok(FrontSettings {
        in_band,
        approval_wait_s,
    })
}

/// Reads `{"<token>": {"account", "profile"?}}`.
pub fn read_tokens(path: &Path) -> Result<HashMap<String, Arc<Caller>>, McpConfigError> {
    let fail = |reason: String| McpConfigError::Tokens {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let entries: HashMap<String, TokenEntry> =
        serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
    let mut tokens = HashMap::new();
    for (token, entry) in entries {
        if token.is_empty() {
            return Err(fail("a token is empty".into()));
        }
        let account = Account::parse(entry.account.clone())
            .map_err(|e| fail(format!("account {:?}: {e}", entry.account)))?;
        let profile = caller_profile(entry.profile.as_deref()).map_err(fail)?;
        tokens.insert(
            token,
            Arc::new(Caller {
                account,
                profile,
                session: None,
            }),
        );
    }
    Ok(tokens)
}

/// A profile name as callers give it (`None`: `default`).
pub fn caller_profile(profile: Option<&str>) -> Result<String, String> {
    let profile = profile.unwrap_or("default");
    if PROFILES.contains(&profile) {
        Ok(profile.to_owned())
    } else {
        Err(format!(
            "unknown profile {profile:?}; use one of {}",
            PROFILES.join(", ")
        ))
    }
}

/// Serves MCP over standard input and output for one caller until the client closes it.
pub async fn serve_stdio(
    nats: async_nats::Client,
    settings: FrontSettings,
    caller: Caller,
) -> Result<(), String> {
    serve_io(nats, settings, caller, rmcp::transport::stdio()).await
}

/// Serves MCP over any byte stream pair (stdio, or a pipe in a bench).
pub async fn serve_io<R, W>(
    nats: async_nats::Client,
    settings: FrontSettings,
    caller: Caller,
    io: (R, W),
) -> Result<(), String>
where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let profile_caller = caller.clone();
    let front = Front::stdio(nats.clone(), settings, caller);
    let watcher_front = front.clone();
    let service = front
        .serve(io)
        .await
        .map_err(|e| format!("the MCP handshake failed: {e}"))?;
    let peer = service.peer().clone();
    let stop = CancellationToken::new();
    let watcher = tokio::spawn(watch_tools(
        watcher_front,
        profile_caller,
        peer,
        stop.clone(),
    ));
    let result = service.waiting().await;
    stop.cancel();
    let _ = watcher.await;
    result.map_err(|e| format!("the MCP connection ended: {e}"))?;
    Ok(())
}

/// How often a stdio front checks its tool names when nothing was announced (a provider's
/// tools go about 12.5 s after its last instance, without an announce).
const LIST_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(15);

/// Says `notifications/tools/list_changed` when the profile's tool names change (providers
/// coming and going): checked 1 s and 3 s after each `toolmesh.v1.providers.announce` (the
/// gateways discover at once after one) and every [`LIST_CHECK_INTERVAL`]. A check is one
/// dispatcher `list`.
async fn watch_tools(
    front: Front,
    caller: Caller,
    peer: rmcp::Peer<rmcp::RoleServer>,
    stop: CancellationToken,
) {
    use futures::StreamExt as _;
    let mut announces = match front
        .nats()
        .subscribe(toolmesh_kernel::subjects::public::PROVIDERS_ANNOUNCE)
        .await
    {
        Ok(sub) => Some(sub),
        Err(e) => {
            tracing::warn!(error = %e, "cannot hear provider announces; checking the tool list on a timer only");
            None
        }
    };
    let mut last: Option<Vec<String>> = None;
    let mut tick = tokio::time::interval(LIST_CHECK_INTERVAL);
    let mut soon: Vec<tokio::time::Instant> = Vec::new();
    loop {
        let next_soon = soon.iter().min().copied();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            Some(_) = async {
                match announces.as_mut() {
                    Some(sub) => sub.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let now = tokio::time::Instant::now();
                soon.push(now + std::time::Duration::from_secs(1));
                soon.push(now + std::time::Duration::from_secs(3));
                continue;
            }
            _ = async {
                match next_soon {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = tokio::time::Instant::now();
                soon.retain(|at| *at > now);
            }
        }
        let Ok(mut names) = front.tool_names(&caller).await else {
            continue;
        };
        names.sort();
        if last.as_ref().is_some_and(|l| *l != names)
            && peer.notify_tool_list_changed().await.is_err()
        {
            tracing::debug!("the client takes no list_changed notification");
        }
        last = Some(names);
    }
}

/// The HTTP router: `/mcp` behind the bearer-token check.
pub fn router(
    nats: async_nats::Client,
    config: &McpConfig,
    stop: CancellationToken,
) -> axum::Router {
    let settings = Arc::new(config.front.clone());
    let http_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        // Every request needs a bearer token, which a DNS-rebinding page cannot send.
        .disable_allowed_hosts()
        .with_cancellation_token(stop);
    let service = StreamableHttpService::new(
        move || Ok(Front::http(nats.clone(), settings.clone())),
        Arc::new(NeverSessionManager::default()),
        http_config,
    );
    let tokens = Arc::new(config.tokens.clone());
    axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(tokens, authorize))
}

/// 401 without a known bearer token; otherwise the caller (with the `X-Toolmesh-Session`
/// header's session) goes with the request.
async fn authorize(
    State(tokens): State<Arc<HashMap<String, Arc<Caller>>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let Some(caller) = token.and_then(|t| tokens.get(t)) else {
        return (
            http::StatusCode::UNAUTHORIZED,
            [
                (http::header::WWW_AUTHENTICATE, "Bearer"),
                (http::header::CONTENT_TYPE, "application/json"),
            ],
            r#"{"error":"unauthorized","error_description":"a known bearer token is required (TOOLMESH_MCP_TOKENS)"}"#,
        )
            .into_response();
    };
    let mut caller = caller.as_ref().clone();
    if let Some(session) = request.headers().get(SESSION_HEADER) {
        match session.to_str() {
            Ok(s) if !s.trim().is_empty() => caller.session = Some(s.trim().to_owned()),
            Ok(_) => {}
            Err(_) => {
                return (
                    http::StatusCode::BAD_REQUEST,
                    "X-Toolmesh-Session must be visible ASCII",
                )
                    .into_response()
            }
        }
    }
    request.extensions_mut().insert(Arc::new(caller));
    next.run(request).await
}

/// Starts the role `mcp`: streamable HTTP on `config.listen` until the node stops.
pub async fn spawn(
    nats: async_nats::Client,
    config: McpConfig,
    lifecycle: Lifecycle,
) -> std::io::Result<(ActorHandle, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    if config.tokens.is_empty() {
        tracing::warn!("TOOLMESH_MCP_TOKENS names no token: every MCP request gets 401");
    }
    let stop = lifecycle.stop.child_token();
    let app = router(nats, &config, stop.clone());
    let (handle, mut notice) = ActorHandle::new(Role::Mcp);
    let drain = lifecycle.drain.clone();
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { drain.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the MCP listener failed");
        }
        notice.notify();
    });
    tracing::info!(%addr, "MCP over streamable HTTP at /mcp");
    Ok((handle, addr))
}
