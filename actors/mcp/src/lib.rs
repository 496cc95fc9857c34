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
mod listing;

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
    /// Bearer token → caller (its session, when the file names one, is what a request without
    /// the `X-Toolmesh-Session` header uses).
    pub tokens: HashMap<String, Arc<Caller>>,
    pub front: FrontSettings,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    account: String,
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    session: Option<String>,
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

/// Reads `{"<token>": {"account", "profile"?, "session"?}}`.
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
        let session = entry
            .session
            .map(|s| {
                toolmesh_kernel::SessionId::parse(s.clone())
                    .map(|_| s.clone())
                    .map_err(|e| fail(format!("session {s:?}: {e}")))
            })
            .transpose()?;
        tokens.insert(
            token,
            Arc::new(Caller {
                account,
                profile,
                session,
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
    let watcher = tokio::spawn(listing::watch_tools(
        watcher_front,
        profile_caller,
        listing::ListSink::Peer(peer),
        stop.clone(),
    ));
    let result = service.waiting().await;
    stop.cancel();
    let _ = watcher.await;
    result.map_err(|e| format!("the MCP connection ended: {e}"))?;
    Ok(())
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

/// 401 without a known bearer token; otherwise the caller goes with the request, its session
/// the `X-Toolmesh-Session` header's or else the token's own.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Result<HashMap<String, Arc<Caller>>, McpConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        std::fs::write(&path, text).unwrap();
        read_tokens(&path)
    }

    #[test]
    fn a_token_may_name_its_own_session() {
        let read =
            tokens(r#"{"t1": {"account": "acme", "session": "s1"}, "t2": {"account": "acme"}}"#)
                .unwrap();
        assert_eq!(read["t1"].session.as_deref(), Some("s1"));
        assert_eq!(read["t2"].session, None);
        assert_eq!(read["t2"].profile, "default");
    }

    #[test]
    fn bad_token_entries_are_refused_naming_the_problem() {
        for (text, names) in [
            (
                r#"{"t1": {"account": "acme", "session": "bad id"}}"#,
                "session \"bad id\"",
            ),
            (r#"{"t1": {"account": "Not An Account"}}"#, "account"),
            (
                r#"{"t1": {"account": "acme", "profile": "nope"}}"#,
                "unknown profile",
            ),
            (
                r#"{"t1": {"account": "acme", "sesion": "s1"}}"#,
                "unknown field",
            ),
            (r#"{"": {"account": "acme"}}"#, "empty"),
        ] {
            let err = tokens(text).unwrap_err().to_string();
            assert!(err.contains(names), "{text}: {err}");
        }
    }
}
