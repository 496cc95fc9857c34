//! The toolmesh MCP front door (PROTOCOL.md "MCP front"): any MCP client uses the mesh.
//!
//! [`serve_stdio`] speaks MCP on standard input and output for one account (`toolmesh mcp`);
//! the role `mcp` ([`spawn`]) serves streamable HTTP at `/mcp`, with bearer tokens mapped to
//! accounts. Either way the front is a client of the mesh: `tools/list` and `tools/call` are
//! requests on the gateway's call subject, like the command line's.
//!
//! Over HTTP a request passes, in this order, the Origin check ([`origins`]: a browser origin
//! not in `TOOLMESH_MCP_ALLOWED_ORIGINS` is 403), the bearer token (401 without a known one:
//! a tokens-file token, or an OAuth access token when [`oauth`] is configured) and the token's
//! session binding (403 when the token names a session and the `X-Toolmesh-Session` header
//! another, unless the token has `"sessions": "any"`). The listener is the kernel's
//! ([`toolmesh_kernel::listener::serve`]), with its header timeout and connection cap.
//!
//! Several HTTP front nodes may run at once. The HTTP side is stateless (rmcp's stateless
//! mode: no `Mcp-Session-Id`, each POST served on its own); a call's progress travels on that
//! call's own response stream, and an approval question is an MCP `InputRequiredResult` whose
//! `requestState` names the approval, so the client's retry may reach any node. The one
//! exception is a task ([`tasks`]): a client that declares the tasks extension gets one for a
//! call parked for approval, and it lives on the node that made it (a restart forgets it).

mod front;
mod listing;
pub mod oauth;
pub mod origins;
mod request;
pub mod tasks;
pub mod variables;

use std::collections::{HashMap, HashSet};
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

use toolmesh_kernel::config::{parse_file, ConfigError, RawEnv};
use toolmesh_kernel::host::{ActorHandle, Lifecycle};
use toolmesh_kernel::listener::{listen_addr, serve, HttpLimits};
use toolmesh_kernel::permissions::Refusals;
use toolmesh_kernel::{Account, Role};

pub use front::{Front, FrontSettings};
pub use origins::{AllowedOrigins, ALLOWED_ORIGINS_VAR};
pub use request::{mcp_tool, reply_result, Caller};

/// `TOOLMESH_MCP_LISTEN`'s default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8931";
/// `TOOLMESH_MCP_APPROVAL_WAIT_S`'s default.
pub const DEFAULT_APPROVAL_WAIT_S: u64 = 120;
/// The profiles a token or `--profile` may name.
pub const PROFILES: [&str; 4] = ["default", "focused", "core", "coding"];
/// The header naming the toolmesh session of an HTTP request.
pub const SESSION_HEADER: &str = "x-toolmesh-session";
/// The longest token name (`"name"` in the tokens file): its `decided_by` is `mcp:<name>`.
pub const MAX_TOKEN_NAME: usize = toolmesh_kernel::wire::MAX_CLIENT_NAME;

#[derive(Debug, thiserror::Error)]
pub enum McpConfigError {
    #[error("the MCP tokens file {path}: {reason}")]
    Tokens { path: PathBuf, reason: String },
    /// A variable's value (the listen address, the origins, the approval wait, the HTTP
    /// limits).
    #[error(transparent)]
    Setting(#[from] ConfigError),
}

/// The role's settings, from `TOOLMESH_MCP_*` and `TOOLMESH_HTTP_*`.
#[derive(Debug, Clone)]
pub struct McpConfig {
    pub listen: SocketAddr,
    /// Bearer token → what it grants.
    pub tokens: HashMap<String, Arc<Token>>,
    /// `TOOLMESH_MCP_PUBLIC_URL`: the front's own URL ([`oauth::Resource`]).
    pub public_url: Option<url::Url>,
    /// OAuth access tokens, when configured.
    pub oauth: Option<oauth::OAuthConfig>,
    /// `TOOLMESH_MCP_ALLOWED_ORIGINS`: the browser origins served.
    pub allowed_origins: AllowedOrigins,
    /// The listener's header timeout and connection cap.
    pub http: HttpLimits,
    pub front: FrontSettings,
}

/// What a bearer token grants: its caller, and whether a request may name another session.
#[derive(Debug, Clone)]
pub struct Token {
    /// The account, profile, name and session (when the file names one: what a request without
    /// the `X-Toolmesh-Session` header uses).
    pub caller: Caller,
    /// `"sessions": "any"`: the `X-Toolmesh-Session` header may name any session. Otherwise a
    /// token naming a session is bound to it and a header naming another is HTTP 403.
    pub any_session: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    account: String,
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    sessions: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

impl McpConfig {
    pub fn from_env(env: &RawEnv) -> Result<McpConfig, McpConfigError> {
        let listen = listen_addr(env, "TOOLMESH_MCP_LISTEN", DEFAULT_LISTEN)?;
        let tokens = match env.get("TOOLMESH_MCP_TOKENS") {
            Some(path) => read_tokens(Path::new(path.trim()))?,
            None => HashMap::new(),
        };
        let allowed_origins = match env.get(ALLOWED_ORIGINS_VAR) {
            Some(list) => AllowedOrigins::parse(list).map_err(|reason| ConfigError::Invalid {
                key: ALLOWED_ORIGINS_VAR,
                value: list.to_owned(),
                reason,
            })?,
            None => AllowedOrigins::default(),
        };
        Ok(McpConfig {
            listen,
            tokens,
            public_url: oauth::public_url(env)?,
            oauth: oauth::OAuthConfig::from_env(env)?,
            allowed_origins,
            http: HttpLimits::from_env(env)?,
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
            .ok_or_else(|| ConfigError::Invalid {
                key: "TOOLMESH_MCP_APPROVAL_WAIT_S",
                value: raw.to_owned(),
                reason: format!(
                    "use whole seconds from 0 to {}",
                    toolmesh_kernel::wire::MAX_WAIT_FOR_APPROVAL_S
                ),
            })?,
    };
    // No TOOLMESH_APPROVAL_IN_BAND here: whether a client's answer counts is the approval
    // role's to say (PROTOCOL.md "Tenancy and trust"); `approval_required` replies tell.
    Ok(FrontSettings { approval_wait_s })
}

/// Reads `{"<token>": {"account", "profile"?, "session"?, "sessions"?: "any", "name"?}}`.
pub fn read_tokens(path: &Path) -> Result<HashMap<String, Arc<Token>>, McpConfigError> {
    parse_file(path, parse_tokens).map_err(|reason| McpConfigError::Tokens {
        path: path.to_owned(),
        reason,
    })
}

/// The tokens file's text, validated; the error names the problem (never a token).
pub fn parse_tokens(text: &str) -> Result<HashMap<String, Arc<Token>>, String> {
    let entries: HashMap<String, TokenEntry> =
        serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut tokens = HashMap::new();
    let mut names = HashSet::new();
    for (token, entry) in entries {
        if token.is_empty() {
            return Err("a token is empty".into());
        }
        let account = Account::parse(entry.account.clone())
            .map_err(|e| format!("account {:?}: {e}", entry.account))?;
        let profile = caller_profile(entry.profile.as_deref())?;
        let session = entry
            .session
            .map(|s| {
                toolmesh_kernel::SessionId::parse(s.clone())
                    .map(|_| s.clone())
                    .map_err(|e| format!("session {s:?}: {e}"))
            })
            .transpose()?;
        let any_session = match entry.sessions.as_deref() {
            None => false,
            Some("any") => true,
            Some(other) => {
                return Err(format!(
                "sessions {other:?}: use \"any\" (the header may name any session) or leave it out"
            ))
            }
        };
        let name = match entry.name {
            Some(name) => {
                if !toolmesh_kernel::wire::is_client_name(&name) {
                    return Err(format!(
                        "name {name:?}: use 1 to {MAX_TOKEN_NAME} ASCII letters, digits, '.', '_', '-' or '@'"
                    ));
                }
                if name.starts_with(oauth::NAME_PREFIX) {
                    return Err(format!(
                        "name {name:?}: names beginning {:?} are OAuth access tokens'",
                        oauth::NAME_PREFIX
                    ));
                }
                name
            }
            None => toolmesh_kernel::canonical::sha256_hex(token.as_bytes())[..8].to_owned(),
        };
        if !names.insert(name.clone()) {
            return Err(format!(
                "two tokens are named {name:?} (a name is the token's \"name\", else the first 8 hex digits of its sha256); name them apart"
            ));
        }
        tokens.insert(
            token,
            Arc::new(Token {
                caller: Caller {
                    account,
                    profile,
                    session,
                    name: Some(name),
                    user_id: None,
                },
                any_session,
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
/// `refusals` are the connection's (`toolmesh_kernel::host::connect_client_with_inbox`): a call
/// the server refuses (its publish, or the reply inbox) answers at once with why, and the
/// first such refusal is logged on stderr, where an MCP client shows a server's log.
pub async fn serve_stdio(
    nats: async_nats::Client,
    refusals: Refusals,
    settings: FrontSettings,
    caller: Caller,
) -> Result<(), String> {
    serve_io(nats, refusals, settings, caller, rmcp::transport::stdio()).await
}

/// Serves MCP over any byte stream pair (stdio, or a pipe in a bench).
pub async fn serve_io<R, W>(
    nats: async_nats::Client,
    refusals: Refusals,
    settings: FrontSettings,
    caller: Caller,
    io: (R, W),
) -> Result<(), String>
where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let profile_caller = caller.clone();
    let call_subject = toolmesh_kernel::subjects::public::call(&caller.account);
    let refused = refusals.clone();
    let said = tokio::spawn(async move {
        let refused = refused.of_request(&call_subject).await;
        tracing::error!("{refused}");
    });
    let front = Front::stdio(nats.clone(), refusals, settings, caller);
    let watcher_front = front.clone();
    let finishing = front.clone();
    let (reader, writer) = io;
    let gone = front.clone();
    let reader = EndSignal {
        inner: reader,
        on_end: Some(Box::new(move || gone.client_gone())),
    };
    let service = front
        .serve((reader, writer))
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
    said.abort();
    stop.cancel();
    let _ = watcher.await;
    // A client that cancelled a call and closed the pipe: the cancel still goes out.
    finishing
        .finish_calls(std::time::Duration::from_secs(15))
        .await;
    result.map_err(|e| format!("the MCP connection ended: {e}"))?;
    Ok(())
}

/// A reader that calls `on_end` once when its stream ends (a read of no bytes into room for
/// some): the stdio client closed its end of the pipe.
struct EndSignal<R> {
    inner: R,
    on_end: Option<Box<dyn FnOnce() + Send>>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for EndSignal<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let room = buf.remaining();
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(())))
            && room > 0
            && buf.filled().len() == before
        {
            if let Some(on_end) = self.on_end.take() {
                on_end();
            }
        }
        polled
    }
}

/// The HTTP router: `/mcp` behind the Origin check, then the bearer-token check; with
/// `oauth`, also its metadata document (served to anyone: [`oauth::routes`]).
pub fn router(
    nats: async_nats::Client,
    config: &McpConfig,
    oauth: Option<Arc<oauth::Verifier>>,
    stop: CancellationToken,
) -> axum::Router {
    let settings = Arc::new(config.front.clone());
    let http_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        // The Host is not checked: every request needs a bearer token, and a browser's request
        // (as DNS rebinding makes) carries an Origin, checked before the token (`origins`).
        .disable_allowed_hosts()
        .with_cancellation_token(stop);
    // Every request's handler shares the node's tasks (`tasks`: they live on this node).
    let tasks = tasks::Tasks::default();
    let service = StreamableHttpService::new(
        move || Ok(Front::http(nats.clone(), settings.clone(), tasks.clone())),
        Arc::new(NeverSessionManager::default()),
        http_config,
    );
    let gate = Arc::new(Gate {
        tokens: config.tokens.clone(),
        oauth: oauth.clone(),
    });
    let origins = Arc::new(config.allowed_origins.clone());
    // The last layer runs first: the Origin is checked before the token is looked at.
    let mcp = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(gate, authorize))
        .layer(axum::middleware::from_fn_with_state(
            origins,
            origins::check_origin,
        ));
    match oauth {
        // Merged after the layers: they guard `/mcp` alone.
        Some(verifier) => mcp.merge(oauth::routes(&verifier)),
        None => mcp,
    }
}

/// What the HTTP front takes as a bearer token.
struct Gate {
    tokens: HashMap<String, Arc<Token>>,
    oauth: Option<Arc<oauth::Verifier>>,
}

impl Gate {
    /// The grant of a request's bearer `token`, or the 401 answering it.
    async fn grant(&self, token: Option<&str>) -> Result<Arc<Token>, Response> {
        if let Some(grant) = token.and_then(|t| self.tokens.get(t)) {
            return Ok(grant.clone());
        }
        let Some(verifier) = &self.oauth else {
            return Err(unauthorized(
                "Bearer".to_owned(),
                r#"{"error":"unauthorized","error_description":"a known bearer token is required (TOOLMESH_MCP_TOKENS)"}"#.to_owned(),
            ));
        };
        let Some(token) = token else {
            let body = serde_json::json!({"error": "unauthorized", "error_description":
                "a bearer token is required: one of TOOLMESH_MCP_TOKENS, or an OAuth access token (see resource_metadata)"});
            return Err(unauthorized(verifier.challenge(None), body.to_string()));
        };
        match verifier.verify(token).await {
            Ok(grant) => Ok(Arc::new(grant)),
            Err(e) => {
                tracing::debug!(error = %toolmesh_kernel::error::DisplayChain(&e), "refused an MCP bearer token");
                let body = serde_json::json!({"error": "invalid_token", "error_description": e.description()});
                Err(unauthorized(verifier.challenge(Some(&e)), body.to_string()))
            }
        }
    }
}

fn unauthorized(challenge: String, body: String) -> Response {
    (
        http::StatusCode::UNAUTHORIZED,
        [
            (http::header::WWW_AUTHENTICATE, challenge),
            (http::header::CONTENT_TYPE, "application/json".to_owned()),
        ],
        body,
    )
        .into_response()
}

/// 401 without a known bearer token or a valid access token; 403 when the token is bound to a
/// session and the `X-Toolmesh-Session` header names another. Otherwise the caller goes with
/// the request, its session the header's or else the token's own.
async fn authorize(State(gate): State<Arc<Gate>>, mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    let grant = match gate.grant(token.as_deref()).await {
        Ok(grant) => grant,
        Err(refused) => return refused,
    };
    let mut caller = grant.caller.clone();
    if let Some(session) = request.headers().get(SESSION_HEADER) {
        match session.to_str().map(str::trim) {
            Ok("") => {}
            Ok(s) => match &grant.caller.session {
                Some(own) if own != s && !grant.any_session => {
                    tracing::warn!(
                        token = caller.name.as_deref().unwrap_or_default(),
                        "refused an MCP request naming a session its token is not bound to"
                    );
                    return (
                        http::StatusCode::FORBIDDEN,
                        [(http::header::CONTENT_TYPE, "application/json")],
                        r#"{"error":"forbidden","error_description":"this token is bound to its own session; X-Toolmesh-Session names another"}"#,
                    )
                        .into_response();
                }
                _ => caller.session = Some(s.to_owned()),
            },
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
    let verifier = match &config.oauth {
        Some(settings) => {
            let resource = oauth::Resource::new(config.public_url.as_ref(), addr);
            let verifier =
                Arc::new(oauth::Verifier::new(settings, resource).map_err(std::io::Error::other)?);
            if config.public_url.is_none() && addr.ip().is_unspecified() {
                tracing::warn!(
                    resource = %verifier.resource().resource(),
                    "TOOLMESH_MCP_PUBLIC_URL is unset and the front listens on every address: \
                     the OAuth resource (and the default audience) names no address a client uses"
                );
            }
            tracing::info!(
                issuer = %verifier.issuer(),
                audience = %verifier.audience(),
                metadata = %verifier.resource().metadata_url(),
                "MCP takes OAuth access tokens"
            );
            let fetching = verifier.clone();
            tokio::spawn(async move { fetching.prefetch().await });
            Some(verifier)
        }
        None => None,
    };
    if config.tokens.is_empty() && verifier.is_none() {
        tracing::warn!("TOOLMESH_MCP_TOKENS names no token: every MCP request gets 401");
    }
    let stop = lifecycle.stop.child_token();
    let app = router(nats, &config, verifier, stop.clone());
    let drained = lifecycle.drain.clone().cancelled_owned();
    let handle = ActorHandle::spawn(Role::Mcp, serve(listener, app, config.http, drained));
    tracing::info!(%addr, "MCP over streamable HTTP at /mcp");
    Ok((handle, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Result<HashMap<String, Arc<Token>>, McpConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        std::fs::write(&path, text).unwrap();
        read_tokens(&path)
    }

    #[test]
    fn a_token_may_name_its_own_session() {
        let read = tokens(
            r#"{"t1": {"account": "acme", "session": "s1"}, "t2": {"account": "acme"},
                "t3": {"account": "acme", "session": "s3", "sessions": "any"}}"#,
        )
        .unwrap();
        assert_eq!(read["t1"].caller.session.as_deref(), Some("s1"));
        assert!(!read["t1"].any_session);
        assert_eq!(read["t2"].caller.session, None);
        assert_eq!(read["t2"].caller.profile, "default");
        assert_eq!(read["t3"].caller.session.as_deref(), Some("s3"));
        assert!(read["t3"].any_session);
    }

    #[test]
    fn a_token_is_named_by_its_entry_or_its_hash() {
        let read =
            tokens(r#"{"t1": {"account": "acme", "name": "laptop-1"}, "t2": {"account": "acme"}}"#)
                .unwrap();
        assert_eq!(read["t1"].caller.name.as_deref(), Some("laptop-1"));
        // Without a name: the first 8 hex digits of the token's sha256.
        let hash = toolmesh_kernel::canonical::sha256_hex(b"t2");
        assert_eq!(read["t2"].caller.name.as_deref(), Some(&hash[..8]));
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
            (
                r#"{"t1": {"account": "acme", "session": "s1", "sessions": "all"}}"#,
                "sessions \"all\"",
            ),
            (
                r#"{"t1": {"account": "acme", "sessions": true}}"#,
                "invalid type",
            ),
            (r#"{"t1": {"account": "acme", "name": ""}}"#, "name \"\""),
            (
                r#"{"t1": {"account": "acme", "name": "two words"}}"#,
                "name \"two words\"",
            ),
            (
                r#"{"t1": {"account": "acme", "name": "oauth.alice"}}"#,
                "name \"oauth.alice\": names beginning \"oauth.\"",
            ),
            (
                r#"{"t1": {"account": "acme", "name": "same"}, "t2": {"account": "acme", "name": "same"}}"#,
                "two tokens are named \"same\"",
            ),
        ] {
            let err = tokens(text).unwrap_err().to_string();
            assert!(err.contains(names), "{text}: {err}");
            assert!(!err.contains("t1") && !err.contains("t2"), "{text}: {err}");
        }
    }

    #[test]
    fn bad_http_settings_are_refused_naming_the_variable() {
        for (key, value) in [
            ("TOOLMESH_HTTP_HEADER_TIMEOUT_S", "0"),
            ("TOOLMESH_HTTP_MAX_CONNECTIONS", "lots"),
            (ALLOWED_ORIGINS_VAR, "https://app.example.com/path"),
        ] {
            let err = McpConfig::from_env(&RawEnv::from_pairs([(key, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{key}={value}: {err}");
        }
        let config = McpConfig::from_env(&RawEnv::from_pairs([(
            ALLOWED_ORIGINS_VAR,
            "https://app.example.com",
        )]))
        .unwrap();
        assert_eq!(config.http, HttpLimits::default());
        assert_eq!(
            config.allowed_origins,
            AllowedOrigins::parse("https://app.example.com").unwrap()
        );
    }
}
