//! The console's HTTP side: the page, the JSON API behind it and the live stream.
//!
//! Every `/api/` request carries its console token (`Authorization: Bearer`): unknown → 401,
//! an account the token does not grant → 403, both with a contract error body. Nothing about a
//! signed-in browser is kept here, so any console node answers any request. Deciding and the
//! grants are in [`decisions`].
//!
//! The stream (`GET /api/stream`) subscribes to `…approvals.<a>.requested` and `…decided` of
//! each granted account (`…approvals.*.…` for `"*"`), flushes, and only then lists, so an
//! approval made meanwhile is in the snapshot or announced (the page keys approvals by id). A
//! `"*"` token's snapshot lists the accounts the page names: no subject lists every account.
//! Events of accounts the token does not grant are dropped before they reach the browser. A
//! browser too slow for 256 events loses its stream and reconnects to a fresh snapshot.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use toolmesh_kernel::tools::ToolRegistry;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{Stream, StreamExt as _};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use toolmesh_kernel::error::ErrorCode;
use toolmesh_kernel::policy::LivePolicy;
use toolmesh_kernel::subjects::public::{self, ApprovalVerb};
use toolmesh_kernel::Account;

use crate::mesh::{self, failure, is_ok};
use crate::{page, Accounts, ConsoleConfig, Grant};

mod decisions;

/// How many stream events wait for a slow browser before the stream is ended (the page then
/// reconnects and starts again from a fresh list).
const STREAM_BUFFER: usize = 256;

/// How often an idle stream says it is alive.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

struct Console {
    nats: async_nats::Client,
    /// The built-in tools: how an approver sees each one's arguments.
    tools: Arc<ToolRegistry>,
    tokens: Option<HashMap<String, Arc<Grant>>>,
    /// The reviewer groups (`TOOLMESH_POLICY_FILE`).
    policy: LivePolicy,
    stop: CancellationToken,
}

type Shared = State<Arc<Console>>;

/// The router: `/` (the page), `/console.js`, `/console.css` and `/api/…`.
pub fn router(
    nats: async_nats::Client,
    tools: Arc<ToolRegistry>,
    config: &ConsoleConfig,
    stop: CancellationToken,
) -> axum::Router {
    let state = Arc::new(Console {
        nats,
        tools,
        tokens: config.tokens.clone(),
        policy: config.policy.clone(),
        stop,
    });
    axum::Router::new()
        .route("/", get(index))
        .route("/console.js", get(|| async { page::script() }))
        .route("/console.css", get(|| async { page::style() }))
        .route("/api/me", get(me))
        .route("/api/stream", get(stream))
        .route("/api/approvals/{account}", get(list))
        .route("/api/approvals/{account}/{id}", get(one))
        .route(
            "/api/approvals/{account}/{id}/decide",
            post(decisions::decide),
        )
        .route("/api/grants/{account}", get(decisions::grants))
        .route("/api/grants/{account}/{id}/revoke", post(decisions::revoke))
        .fallback(|| async { reply(failure(ErrorCode::NotFound, "no such page or API route")) })
        .with_state(state)
}

async fn index(State(console): Shared) -> Response {
    match console.tokens {
        Some(_) => page::index(),
        None => page::unconfigured(),
    }
}

/// A contract reply as an HTTP response: the status follows the error code.
fn reply(body: Value) -> Response {
    let status = if is_ok(&body) {
        StatusCode::OK
    } else {
        match body.get("error").and_then(Value::as_str) {
            Some("invalid_request") => StatusCode::BAD_REQUEST,
            Some("forbidden" | "policy_denied") => StatusCode::FORBIDDEN,
            Some("not_found") => StatusCode::NOT_FOUND,
            Some("conflict") => StatusCode::CONFLICT,
            Some("approval_expired") => StatusCode::GONE,
            Some("invalid_arguments") => StatusCode::UNPROCESSABLE_ENTITY,
            Some("limit_exceeded") => StatusCode::TOO_MANY_REQUESTS,
            Some("unavailable") => StatusCode::SERVICE_UNAVAILABLE,
            Some("timeout") => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    };
    with_status(status, body)
}

fn with_status(status: StatusCode, body: Value) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body.to_string(),
    )
        .into_response()
}

/// A request refused before it reached the mesh (401, 403, 400, 503): the response to send.
struct Refusal(Box<Response>);

impl From<Response> for Refusal {
    fn from(response: Response) -> Self {
        Refusal(Box::new(response))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// The token's grant; a 401 (or 503 when no tokens file is set) otherwise.
fn grant(console: &Console, headers: &HeaderMap) -> Result<Arc<Grant>, Refusal> {
    let Some(tokens) = &console.tokens else {
        return Err(Refusal::from(reply(failure(
            ErrorCode::Unavailable,
            "this console has no tokens file: set TOOLMESH_CONSOLE_TOKENS",
        ))));
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match token.and_then(|t| tokens.get(t)) {
        Some(grant) => Ok(grant.clone()),
        None => {
            let mut response = with_status(
                StatusCode::UNAUTHORIZED,
                failure(
                    ErrorCode::InvalidRequest,
                    "sign in with a console token (Authorization: Bearer <token>)",
                ),
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            Err(Refusal::from(response))
        }
    }
}

/// The path's account, when valid (400) and granted (403).
fn account(grant: &Grant, raw: &str) -> Result<Account, Refusal> {
    let account = Account::parse(raw).map_err(|e| {
        Refusal::from(reply(failure(
            ErrorCode::InvalidRequest,
            &format!("account {raw:?}: {e}"),
        )))
    })?;
    if !grant.accounts.allows(&account) {
        return Err(Refusal::from(with_status(
            StatusCode::FORBIDDEN,
            failure(
                ErrorCode::InvalidRequest,
                &format!("this console token does not grant the account {account}"),
            ),
        )));
    }
    Ok(account)
}

/// The token's grant ([`grant`]) and the path's account, when it grants it ([`account`]).
fn granted(
    console: &Console,
    headers: &HeaderMap,
    raw: &str,
) -> Result<(Arc<Grant>, Account), Refusal> {
    let grant = grant(console, headers)?;
    let account = account(&grant, raw)?;
    Ok((grant, account))
}

/// `GET /api/me`: the approver's name, accounts (`"*"` for every account), whether the name
/// can decide routed approvals (`reviewer`) and the reviewer groups it is a member of.
async fn me(State(console): Shared, headers: HeaderMap) -> Response {
    let grant = match grant(&console, &headers) {
        Ok(g) => g,
        Err(r) => return r.into_response(),
    };
    let accounts = match &grant.accounts {
        Accounts::All => json!("*"),
        Accounts::Only(list) => json!(list),
    };
    let groups = grant.groups(&console.policy.current());
    reply(json!({
        "ok": true,
        "approver": grant.approver,
        "accounts": accounts,
        "reviewer": grant.is_reviewer(),
        "groups": groups,
    }))
}

/// `GET /api/approvals/<account>`: the pending approvals, each with its details.
async fn list(State(console): Shared, headers: HeaderMap, Path(raw): Path<String>) -> Response {
    let (_, account) = match granted(&console, &headers, &raw) {
        Ok(granted) => granted,
        Err(r) => return r.into_response(),
    };
    match mesh::pending(&console.nats, &console.tools, &account).await {
        Ok(items) => reply(json!({"ok": true, "approvals": items})),
        Err(failed) => reply(failed),
    }
}

/// `GET /api/approvals/<account>/<id>`: one approval (any status) with its details.
async fn one(
    State(console): Shared,
    headers: HeaderMap,
    Path((raw, id)): Path<(String, String)>,
) -> Response {
    let (_, account) = match granted(&console, &headers, &raw) {
        Ok(granted) => granted,
        Err(r) => return r.into_response(),
    };
    let got = mesh::approvals(
        &console.nats,
        &account,
        ApprovalVerb::Get,
        json!({"id": id}),
    )
    .await;
    if !is_ok(&got) {
        return reply(got);
    }
    let mut shown = mesh::from_get(got, &console.tools);
    shown["ok"] = Value::Bool(true);
    reply(shown)
}

#[derive(Deserialize)]
struct StreamQuery {
    /// Comma-separated accounts to list at the start (a `"*"` token's page names them; other
    /// tokens list all of theirs when this is absent).
    #[serde(default)]
    accounts: Option<String>,
}

/// `GET /api/stream`: Server-Sent Events. First `snapshot` `{"approvals": […], "errors": […]}`
/// (the pending approvals of the listed accounts), then `requested` (one approval, detailed)
/// and `decided` (`{"approval"}`) as they are announced. The subscriptions are live before the
/// lists are asked for, so an approval made meanwhile is in the snapshot, or announced, or both
/// (the page keys them by id).
async fn stream(
    State(console): Shared,
    headers: HeaderMap,
    Query(query): Query<StreamQuery>,
) -> Response {
    let grant = match grant(&console, &headers) {
        Ok(g) => g,
        Err(r) => return r.into_response(),
    };
    let mut listed = Vec::new();
    for raw in query
        .accounts
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match account(&grant, raw) {
            Ok(a) if !listed.contains(&a) => listed.push(a),
            Ok(_) => {}
            Err(r) => return r.into_response(),
        }
    }
    if listed.is_empty() {
        if let Accounts::Only(all) = &grant.accounts {
            listed = all.clone();
        }
    }
    let subjects: Vec<String> = match &grant.accounts {
        Accounts::All => public::approvals_events(None).to_vec(),
        Accounts::Only(list) => list
            .iter()
            .flat_map(|a| public::approvals_events(Some(a)))
            .collect(),
    };
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(feed(console.clone(), grant, subjects, listed, tx));
    let events = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    let mut response = sse(events).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn sse(
    events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> impl IntoResponse {
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

fn event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// Feeds one stream until the browser goes, the node drains, or NATS ends the subscriptions.
async fn feed(
    console: Arc<Console>,
    grant: Arc<Grant>,
    subjects: Vec<String>,
    listed: Vec<Account>,
    tx: mpsc::Sender<Event>,
) {
    let mut subs = Vec::new();
    for subject in subjects {
        match console.nats.subscribe(subject).await {
            Ok(sub) => subs.push(sub),
            Err(e) => {
                let failed = failure(
                    ErrorCode::Unavailable,
                    &format!("cannot subscribe to the approval announcements: {e}"),
                );
                let _ = tx.send(event("failure", &failed)).await;
                return;
            }
        }
    }
    let _ = console.nats.flush().await;
    let mut announced = futures::stream::select_all(subs);
    let mut approvals = Vec::new();
    let mut errors = Vec::new();
    for account in &listed {
        match mesh::pending(&console.nats, &console.tools, account).await {
            Ok(items) => approvals.extend(items),
            Err(failed) => errors.push(json!({"account": account, "error": failed["error"], "error_message": failed["error_message"]})),
        }
    }
    let snapshot = json!({"approvals": approvals, "errors": errors});
    if tx.send(event("snapshot", &snapshot)).await.is_err() {
        return;
    }
    loop {
        let msg = tokio::select! {
            _ = console.stop.cancelled() => return,
            _ = tx.closed() => return,
            msg = announced.next() => match msg {
                Some(msg) => msg,
                None => return,
            },
        };
        let Ok(approval) = serde_json::from_slice::<Value>(&msg.payload) else {
            tracing::debug!(subject = %msg.subject, "ignoring an announcement that is not JSON");
            continue;
        };
        // A wildcard subscription hears every account; the grant decides what is shown.
        let granted = approval
            .get("account")
            .and_then(Value::as_str)
            .and_then(|a| Account::parse(a).ok())
            .is_some_and(|a| grant.accounts.allows(&a));
        if !granted {
            continue;
        }
        let sent = if msg.subject.ends_with(".requested") {
            let shown = mesh::detailed(&console.nats, &console.tools, approval).await;
            tx.send(event("requested", &shown)).await
        } else {
            tx.send(event("decided", &json!({"approval": approval})))
                .await
        };
        if sent.is_err() {
            return;
        }
    }
}
