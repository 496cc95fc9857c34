//! The MCP server: an rmcp `ServerHandler` that answers `tools/list` from the gateway's
//! dispatcher and sends each `tools/call` to the gateway as an ordinary ToolRequest.
//!
//! It holds no call state between requests: an approval waiting for the client's answer is an
//! approval in the approval actor, named in the `requestState` the client echoes, so the retry
//! may reach any front node.
//!
//! A client that declares the tasks extension gets a task for a call parked for approval
//! instead of a held-open request ([`crate::tasks`]); only that state lives on the node.
//!
//! It never decides an approval itself (PROTOCOL.md "Tenancy and trust"): the client's answer
//! travels as the retried call's in-band `approval` through a gateway, which checks that the
//! approval is for this account, session, tool and arguments, and counts it only where the
//! approval role takes in-band decisions. A `requestState` naming someone else's approval is
//! then just a call that does not match it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use rmcp::model::SubscriptionFilter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CreateTaskResult,
    ElicitRequestParams, ElicitResult, ElicitationAction, GetTaskParams, GetTaskResult,
    Implementation, InputRequest, InputRequests, InputRequiredResult, JsonObject, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig, TaskPayload, Tool, UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use toolmesh_kernel::permissions::Refusals;
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::tools::TOOL_DISPATCHER;
use toolmesh_kernel::trace;
use toolmesh_kernel::VERSION;

use crate::request::{
    approval_event_id, approval_required, elicitation, failure, mcp_tool, reply_result,
    session_hint, tool_request, waiting_message, Caller, Grant,
};
use crate::tasks::{Owner, Tasks, TASK_KEEP};

/// The key of the approval question in an `InputRequiredResult`'s `inputRequests`.
const APPROVAL_INPUT: &str = "approval";

/// How often a call waiting for an out-of-band decision says so (a progress notification).
const WAIT_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// How long a call's reply may take beyond its approval wait.
const CALL_TIMEOUT: Duration = Duration::from_secs(900);

/// After an MCP cancellation: how long the gateway's `cancelled` reply may take.
const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// Settings every front shares.
#[derive(Debug, Clone)]
pub struct FrontSettings {
    /// `TOOLMESH_MCP_APPROVAL_WAIT_S`: how long a call waits for an out-of-band decision.
    pub approval_wait_s: u64,
}

/// The handler. Over stdio it serves one fixed caller; over HTTP the caller comes with each
/// request (the bearer token's account, put in the request's extensions by the HTTP layer).
#[derive(Clone)]
pub struct Front {
    nats: async_nats::Client,
    /// What the server refused the connection: a request it refused ends at once.
    refusals: Refusals,
    settings: Arc<FrontSettings>,
    fixed: Option<Arc<Caller>>,
    /// Over HTTP, server-to-client requests of a legacy (handshake) client cannot be answered:
    /// each POST is served on its own, so no node waits for the answer's POST.
    http: bool,
    /// Calls in flight. A stdio client may cancel a call and close the pipe at once: the
    /// process waits for them ([`Front::finish_calls`]) so the cancel reaches the mesh.
    calls: tokio_util::task::TaskTracker,
    /// The client is gone (stdio: its end of the pipe closed): every call in flight is
    /// cancelled at once, as an MCP cancellation would, rather than when rmcp's drain gives up
    /// on it (5 s, past the 2 s a client such as the Python SDK waits before killing us).
    gone: CancellationToken,
    /// The tasks of this front node (over HTTP, shared by every request's handler).
    tasks: Tasks,
}

impl Front {
    pub fn stdio(
        nats: async_nats::Client,
        refusals: Refusals,
        settings: FrontSettings,
        caller: Caller,
    ) -> Front {
        Front {
            nats,
            refusals,
            settings: Arc::new(settings),
            fixed: Some(Arc::new(caller)),
            http: false,
            calls: Default::default(),
            gone: CancellationToken::new(),
            tasks: Tasks::default(),
        }
    }

    /// The client went away: cancels every call in flight ([`Front::finish_calls`] then waits
    /// for their cancels to be answered).
    pub fn client_gone(&self) {
        self.gone.cancel();
    }

    /// Waits, at most `within`, for the calls in flight to end (a cancelled one ends once
    /// its cancel is answered).
    pub async fn finish_calls(&self, within: Duration) {
        self.calls.close();
        if tokio::time::timeout(within, self.calls.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                calls = self.calls.len(),
                "MCP calls still in flight at exit; their invocations go on"
            );
        }
    }

    /// The handler of one HTTP request; `tasks` are the node's.
    pub fn http(nats: async_nats::Client, settings: Arc<FrontSettings>, tasks: Tasks) -> Front {
        Front {
            nats,
            refusals: Refusals::none(),
            settings,
            fixed: None,
            http: true,
            calls: Default::default(),
            gone: CancellationToken::new(),
            tasks,
        }
    }

    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Arc<Caller>, McpError> {
        if let Some(caller) = &self.fixed {
            return Ok(caller.clone());
        }
        ctx.extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Arc<Caller>>())
            .cloned()
            .ok_or_else(|| McpError::internal_error("the request carries no caller", None))
    }

    async fn request(&self, subject: String, body: Value, timeout: Duration) -> Value {
        let payload = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        let request = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(timeout));
        let reply = self.refusals.guard(
            &subject,
            self.nats
                .send_request(subject.clone(), trace::request(request)),
        );
        let reply = match reply.await {
            Ok(reply) => reply,
            // The server dropped the request or its reply inbox: no answer is coming.
            Err(refused) => return failure("unavailable", &refused.to_string()),
        };
        match reply {
            Ok(reply) => serde_json::from_slice(&reply.payload).unwrap_or_else(|_| {
                failure("internal", "the gateway's reply is not JSON; see its log")
            }),
            Err(e) => match e.kind() {
                async_nats::RequestErrorKind::NoResponders => failure(
                    "unavailable",
                    "no gateway answers; is a node with the role gateway running?",
                ),
                async_nats::RequestErrorKind::TimedOut => {
                    failure("timeout", "the gateway did not answer in time")
                }
                _ => failure(
                    "unavailable",
                    &format!("the request to the gateway failed: {e}"),
                ),
            },
        }
    }

    pub fn nats(&self) -> &async_nats::Client {
        &self.nats
    }

    /// The names of the profile's tools (one dispatcher `list`).
    pub async fn tool_names(&self, caller: &Caller) -> Result<Vec<String>, Value> {
        let list = self
            .request(
                public::call(&caller.account),
                caller.stamp(json!({"tool": TOOL_DISPATCHER, "arguments": {"action": "list", "profile": caller.profile}})),
                Duration::from_secs(30),
            )
            .await;
        if list.get("ok") != Some(&Value::Bool(true)) {
            return Err(list);
        }
        Ok(list["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The profile's tools, each with its schema and annotations.
    pub async fn tools(&self, caller: &Caller) -> Result<Vec<Value>, Value> {
        let subject = public::call(&caller.account);
        let names = self.tool_names(caller).await?;
        let described = futures::future::join_all(names.iter().map(|name| {
            self.request(
                subject.clone(),
                caller.stamp(json!({"tool": TOOL_DISPATCHER, "arguments": {"action": "describe", "tool_name": name, "profile": caller.profile}})),
                Duration::from_secs(30),
            )
        }))
        .await;
        // A tool that went between list and describe is left out.
        Ok(described
            .into_iter()
            .filter(|d| d.get("ok") == Some(&Value::Bool(true)))
            .map(|d| mcp_tool(&d["tool"]))
            .collect())
    }

    async fn call(
        &self,
        caller: &Caller,
        params: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let arguments = Value::Object(params.arguments.clone().unwrap_or_default());
        let tool = params.name.to_string();
        // A retry after the approval question: the answer rides on the call itself.
        if let Some(state) = params.request_state.as_deref() {
            let Some(id) = state
                .strip_prefix("approval:")
                .filter(|id| toolmesh_kernel::wire::is_approval_id(id))
            else {
                return Err(McpError::invalid_params(
                    "requestState is not one this server made",
                    None,
                ));
            };
            let answer = params
                .input_responses
                .as_ref()
                .and_then(|r| r.get(APPROVAL_INPUT))
                .and_then(|v| serde_json::from_value::<ElicitResult>(v.clone()).ok());
            let reply = self
                .answer(caller, &tool, &arguments, id, answer.as_ref(), &ctx)
                .await;
            return Ok(reply_result(reply).into());
        }
        let capabilities = ctx.client_capabilities();
        let can_elicit = capabilities
            .as_ref()
            .is_some_and(|c| c.elicitation.is_some());
        let modern = ctx.protocol_version().is_some_and(|v| !v.has_initialize());
        let speaks_tasks = capabilities.as_ref().is_some_and(|c| c.supports_tasks());
        if speaks_tasks && modern && self.settings.approval_wait_s > 0 {
            return self.call_as_task(caller, &tool, &arguments, &ctx).await;
        }
        if can_elicit && (modern || !self.http) {
            let reply = self.run(caller, &tool, &arguments, None, 0, &ctx).await;
            let Some(approval) = approval_required(&reply) else {
                return Ok(reply_result(reply).into());
            };
            if !approval.in_band {
                // The client's answer would count for nothing: wait for an approver.
                let reply = self
                    .wait_for_decision(caller, &tool, &arguments, &approval.id, &ctx)
                    .await;
                return Ok(reply_result(reply).into());
            }
            let question = elicitation(&approval);
            if modern {
                let mut requests = InputRequests::new();
                let request: InputRequest = serde_json::from_value(json!({
                    "method": "elicitation/create",
                    "params": question,
                }))
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                requests.insert(APPROVAL_INPUT.to_owned(), request);
                return Ok(InputRequiredResult::new(
                    Some(requests),
                    Some(format!("approval:{}", approval.id)),
                )
                .into());
            }
            let params: ElicitRequestParams = serde_json::from_value(question)
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            let answer = ctx.peer.create_elicitation(params).await;
            if let Err(e) = &answer {
                tracing::info!(error = %e, "the elicitation failed; the call counts as rejected");
            }
            let reply = self
                .answer(
                    caller,
                    &tool,
                    &arguments,
                    &approval.id,
                    answer.as_ref().ok(),
                    &ctx,
                )
                .await;
            return Ok(reply_result(reply).into());
        }
        let reply = self
            .run(
                caller,
                &tool,
                &arguments,
                None,
                self.settings.approval_wait_s,
                &ctx,
            )
            .await;
        Ok(reply_result(reply).into())
    }

    /// The call again, carrying the client's answer on approval `id` in band: `accept` with
    /// `approve: true` approves, anything else (also a failed elicitation) rejects. Where the
    /// answer counts for nothing (in-band decisions are off), the call waits for an approver.
    async fn answer(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &Value,
        id: &str,
        answer: Option<&ElicitResult>,
        ctx: &RequestContext<RoleServer>,
    ) -> Value {
        let approved = answer.is_some_and(|a| {
            a.action == ElicitationAction::Accept
                && a.content
                    .as_ref()
                    .and_then(|c| c.get("approve"))
                    .and_then(Value::as_bool)
                    == Some(true)
        });
        let reply = self
            .run(
                caller,
                tool,
                arguments,
                Some(Grant::Answer { id, approved }),
                0,
                ctx,
            )
            .await;
        if reply["error"].as_str() != Some("approval_pending") {
            return reply;
        }
        self.wait_for_decision(caller, tool, arguments, id, ctx)
            .await
    }

    /// The call again with approval `id`, waiting up to `TOOLMESH_MCP_APPROVAL_WAIT_S` for a
    /// decision from any client.
    async fn wait_for_decision(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &Value,
        id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Value {
        self.run(
            caller,
            tool,
            arguments,
            Some(Grant::Use(id)),
            self.settings.approval_wait_s,
            ctx,
        )
        .await
    }

    /// One ToolRequest to the gateway. RunEvents `stdout`/`stderr` become progress
    /// notifications (when the request has a progress token), and so does waiting for an
    /// approval; an MCP cancellation cancels the invocation.
    async fn run(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &Value,
        approval: Option<Grant<'_>>,
        wait_s: u64,
        ctx: &RequestContext<RoleServer>,
    ) -> Value {
        let _in_flight = self.calls.token();
        let (request, invocation) = tool_request(caller, tool, arguments, approval, wait_s);
        let reply = self.ask(caller, request, &invocation, wait_s, ctx).await;
        session_hint(reply, caller, tool)
    }

    /// Cancels `invocation` of `caller` on the gateway's cancel subject (an MCP cancellation,
    /// the client gone, or `tasks/cancel`); its reply then says `cancelled`.
    async fn cancel_invocation(&self, caller: &Caller, invocation: &str) {
        let cancel = self.request(
            public::cancel(&caller.account),
            json!({"invocation_id": invocation}),
            Duration::from_secs(10),
        );
        let _ = cancel.await;
    }

    /// A call of a client that declares the tasks extension: the call runs as any other until
    /// the gateway parks it for approval (its `approval_required` RunEvent); then the answer is
    /// a task, and the call goes on in the background ([`Front::drive_task`]) with the task's
    /// state kept here ([`crate::tasks`]). One invocation makes the approval and waits for it,
    /// so cancelling the task withdraws that approval.
    async fn call_as_task(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &Value,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let in_flight = self.calls.token();
        let wait_s = self.settings.approval_wait_s;
        let (request, invocation) = tool_request(caller, tool, arguments, None, wait_s);
        let invocation_id = toolmesh_kernel::InvocationId::parse(invocation.clone())
            .expect("a generated invocation id is valid");
        // Without the events the call cannot be seen parking: it waits as without tasks.
        let mut events = self
            .nats
            .subscribe(public::events(&caller.account, &invocation_id))
            .await
            .ok();
        let timeout = CALL_TIMEOUT + Duration::from_secs(wait_s);
        let mut reply = tokio::spawn({
            let front = self.clone();
            let subject = public::call(&caller.account);
            async move { front.request(subject, request, timeout).await }
        });
        let token = ctx.meta.get_progress_token();
        let mut progress = 0.0_f64;
        loop {
            tokio::select! {
                joined = &mut reply => {
                    let reply = joined.unwrap_or_else(|e| failure("internal", &format!("the call failed: {e}")));
                    return Ok(reply_result(session_hint(reply, caller, tool)).into());
                }
                _ = cancelled(&ctx.ct, &self.gone) => {
                    self.cancel_invocation(caller, &invocation).await;
                    let reply = match tokio::time::timeout(CANCEL_GRACE, &mut reply).await {
                        Ok(Ok(reply)) => reply,
                        _ => failure("cancelled", "the call was cancelled"),
                    };
                    return Ok(reply_result(reply).into());
                }
                event = next_event(&mut events) => {
                    let Some(event) = event else {
                        events = None;
                        continue;
                    };
                    match event["kind"].as_str().unwrap_or_default() {
                        "approval_required" => {
                            let approval = approval_event_id(&event);
                            let ttl = Duration::from_secs(wait_s) + CALL_TIMEOUT + TASK_KEEP;
                            let Some(created) = self.tasks.create(
                                Owner::of(caller),
                                ttl,
                                &invocation,
                                &approval,
                                waiting_message(&caller.account, &approval),
                            ) else {
                                tracing::warn!("this front node keeps as many MCP tasks as it may; a parked call waits in its request instead");
                                continue;
                            };
                            tracing::info!(task_id = %created.task.task_id, approval_id = %approval, invocation_id = %invocation, "MCP task made for a call parked for approval");
                            let parked = Parked {
                                task_id: created.task.task_id.clone(),
                                caller: caller.clone(),
                                tool: tool.to_owned(),
                                invocation,
                                reply,
                                events,
                                cancel: created.cancel,
                            };
                            let front = self.clone();
                            tokio::spawn(async move {
                                let _in_flight = in_flight;
                                front.drive_task(parked).await;
                            });
                            return Ok(CreateTaskResult::new(created.task).with_meta(created.meta).into());
                        }
                        "stdout" | "stderr" => {
                            if let (Some(data), Some(token)) = (event["data"].as_str(), &token) {
                                progress += 1.0;
                                self.progress(ctx, token, progress, data.to_owned()).await;
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// The background of a task: its call's reply completes it; `tasks/cancel` (or a stdio
    /// client gone) cancels the invocation, which withdraws the approval it waits for.
    async fn drive_task(&self, parked: Parked) {
        let Parked {
            task_id,
            caller,
            tool,
            invocation,
            mut reply,
            mut events,
            cancel,
        } = parked;
        let (task_id, caller, tool) = (task_id.as_str(), &caller, tool.as_str());
        let joined = loop {
            tokio::select! {
                joined = &mut reply => break joined.map_err(|e| e.to_string()),
                _ = cancelled(&cancel, &self.gone) => {
                    self.cancel_invocation(caller, &invocation).await;
                    let reply = match tokio::time::timeout(CANCEL_GRACE, &mut reply).await {
                        Ok(joined) => joined.map_err(|e| e.to_string()),
                        Err(_) => Ok(failure("cancelled", "the call was cancelled")),
                    };
                    match reply {
                        Ok(reply) if reply["error"] == "cancelled" => {
                            let message = if reply["approval_withdrawn"] == true {
                                "cancelled: the call was withdrawn and its approval rejected (reason withdrawn)"
                            } else {
                                "cancelled: the call was withdrawn"
                            };
                            self.tasks.finish(task_id, TaskPayload::Cancelled, Some(message.to_owned()));
                            return;
                        }
                        // It finished before the cancel took: the task completes with it.
                        other => break other,
                    }
                }
                event = next_event(&mut events) => {
                    let Some(event) = event else {
                        events = None;
                        continue;
                    };
                    let id = approval_event_id(&event);
                    match event["kind"].as_str().unwrap_or_default() {
                        "approved" => self.tasks.say(task_id, format!("approval {id} approved; the call runs")),
                        "rejected" => self.tasks.say(task_id, format!("approval {id} rejected")),
                        _ => {}
                    }
                }
            }
        };
        match joined {
            Ok(reply) => {
                let reply = session_hint(reply, caller, tool);
                let message = match reply["ok"] == true {
                    true => "the call finished".to_owned(),
                    false => format!(
                        "the call ended with {}: {}",
                        reply["error"].as_str().unwrap_or("an error"),
                        reply["error_message"].as_str().unwrap_or_default()
                    ),
                };
                let result = match serde_json::to_value(reply_result(reply)) {
                    Ok(Value::Object(result)) => result,
                    _ => JsonObject::new(),
                };
                self.tasks
                    .finish(task_id, TaskPayload::Completed { result }, Some(message));
            }
            Err(e) => {
                tracing::error!(error = %e, task_id, "the call behind an MCP task failed");
                let error = McpError::internal_error(format!("the call failed: {e}"), None);
                let error = match serde_json::to_value(error) {
                    Ok(Value::Object(error)) => error,
                    _ => JsonObject::new(),
                };
                self.tasks.finish(
                    task_id,
                    TaskPayload::Failed { error },
                    Some("the call failed inside the front; see its log".to_owned()),
                );
            }
        }
    }

    /// [`Front::run`]'s request, with its progress and cancellation.
    async fn ask(
        &self,
        caller: &Caller,
        request: Value,
        invocation: &str,
        wait_s: u64,
        ctx: &RequestContext<RoleServer>,
    ) -> Value {
        let token = ctx.meta.get_progress_token();
        let mut events = match token {
            Some(_) => self
                .nats
                .subscribe(public::events(
                    &caller.account,
                    &toolmesh_kernel::InvocationId::parse(invocation.to_owned())
                        .expect("a generated invocation id is valid"),
                ))
                .await
                .ok(),
            None => None,
        };
        let timeout = CALL_TIMEOUT + Duration::from_secs(wait_s);
        let subject = public::call(&caller.account);
        let reply = self.request(subject, request, timeout);
        tokio::pin!(reply);
        let mut progress = 0.0_f64;
        let mut waiting: Option<String> = None;
        let mut ticker = tokio::time::interval(WAIT_PROGRESS_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                reply = &mut reply => return reply,
                _ = cancelled(&ctx.ct, &self.gone) => {
                    self.cancel_invocation(caller, invocation).await;
                    return tokio::time::timeout(CANCEL_GRACE, &mut reply)
                        .await
                        .unwrap_or_else(|_| failure("cancelled", "the call was cancelled"));
                }
                event = next_event(&mut events) => {
                    let Some(event) = event else {
                        events = None;
                        continue;
                    };
                    let kind = event["kind"].as_str().unwrap_or_default();
                    let message = match kind {
                        "stdout" | "stderr" => event["data"].as_str().map(str::to_owned),
                        "approval_required" => {
                            let id = approval_event_id(&event);
                            let text = format!("waiting for approval {id}");
                            waiting = Some(text.clone());
                            Some(text)
                        }
                        "approved" | "rejected" => {
                            waiting = None;
                            None
                        }
                        _ => None,
                    };
                    if let (Some(message), Some(token)) = (message, &token) {
                        progress += 1.0;
                        self.progress(ctx, token, progress, message).await;
                    }
                }
                _ = ticker.tick(), if waiting.is_some() && token.is_some() => {
                    if let (Some(message), Some(token)) = (&waiting, &token) {
                        progress += 1.0;
                        self.progress(ctx, token, progress, message.clone()).await;
                    }
                }
            }
        }
    }

    async fn progress(
        &self,
        ctx: &RequestContext<RoleServer>,
        token: &ProgressToken,
        progress: f64,
        message: String,
    ) {
        let param: Result<ProgressNotificationParam, _> = serde_json::from_value(json!({
            "progressToken": token,
            "progress": progress,
            "message": message,
        }));
        if let Ok(param) = param {
            // The send waits for the transport's word, which never comes once the client is
            // gone: a cancellation must not wait behind it.
            tokio::select! {
                _ = ctx.peer.notify_progress(param) => {}
                _ = cancelled(&ctx.ct, &self.gone) => {}
            }
        }
    }
}

/// A call parked for approval behind task `task_id`, handed to [`Front::drive_task`].
struct Parked {
    task_id: String,
    caller: Caller,
    tool: String,
    invocation: String,
    /// The gateway's reply to come.
    reply: tokio::task::JoinHandle<Value>,
    /// The invocation's RunEvents (`approved`, `rejected` become status messages).
    events: Option<async_nats::Subscriber>,
    /// `tasks/cancel`.
    cancel: CancellationToken,
}

async fn next_event(events: &mut Option<async_nats::Subscriber>) -> Option<Value> {
    match events {
        Some(sub) => loop {
            let msg = sub.next().await?;
            if let Ok(v) = serde_json::from_slice::<Value>(&msg.payload) {
                return Some(v);
            }
        },
        None => std::future::pending().await,
    }
}

/// An MCP cancellation of the request, or the client gone.
async fn cancelled(request: &CancellationToken, gone: &CancellationToken) {
    tokio::select! {
        _ = request.cancelled() => {}
        _ = gone.cancelled() => {}
    }
}

impl ServerHandler for Front {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_tasks()
            .build();
        let mut info = Implementation::from_build_env();
        info.name = "toolmesh".into();
        info.version = VERSION.into();
        ServerConfig::new(capabilities)
            .with_server_info(info)
            .with_instructions(
                "toolmesh: workspace, sandbox, skills, web and provider tools behind the mesh's approvals",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let caller = self.caller(&ctx)?;
        let tools = self.tools(&caller).await.map_err(|reply| {
            McpError::internal_error(
                format!(
                    "the gateway did not list the tools: {}",
                    reply["error_message"].as_str().unwrap_or("no reason given")
                ),
                Some(reply),
            )
        })?;
        let tools: Vec<Tool> = tools
            .into_iter()
            .filter_map(|t| serde_json::from_value(t).ok())
            .collect();
        serde_json::from_value(json!({ "resultType": "complete", "tools": tools }))
            .map_err(|e| McpError::internal_error(e.to_string(), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = self.caller(&ctx)?;
        let span = tracing::info_span!(
            "mcp_call",
            otel.name = "mcp tools/call",
            otel.kind = "server",
            account = %caller.account,
            tool = %toolmesh_kernel::text::DisplaySafe(&request.name),
            session_id = caller.session.as_deref(),
        );
        // An HTTP client's `traceparent` makes the call part of its trace.
        let traced = ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| {
                let text = |name| parts.headers.get(name).and_then(|v| v.to_str().ok());
                trace::headers_from(text(trace::TRACEPARENT)?, text(trace::TRACESTATE))
            });
        trace::follow(&span, traced.as_ref());
        self.call(&caller, request, ctx).instrument(span).await
    }

    /// `tasks/get`: a task of this caller made on this node.
    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let caller = self.caller(&ctx)?;
        let (task, meta) = self.tasks.get(&Owner::of(&caller), &request.task_id)?;
        let mut result = GetTaskResult::new(task);
        result.meta = Some(meta);
        Ok(result)
    }

    /// `tasks/update`: no task here asks for input, so there is nothing to deliver (SEP-2663:
    /// responses for keys not outstanding are ignored).
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&ctx)?;
        self.tasks.known(&Owner::of(&caller), &request.task_id)
    }

    /// `tasks/cancel`: withdraws the call (its approval is rejected, reason `withdrawn`); the
    /// task turns `cancelled` once the gateway has answered.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&ctx)?;
        self.tasks.cancel(&Owner::of(&caller), &request.task_id)
    }

    /// `subscriptions/listen` (2026-07-28): the tool list's changes only.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let caller = self.caller(context.request_context())?;
        if context.accepted().tools_list_changed == Some(true) {
            let sink = crate::listing::ListSink::Listen(context.sink().clone());
            let stop = CancellationToken::new();
            let watch =
                crate::listing::watch_tools(self.clone(), (*caller).clone(), sink, stop.clone());
            tokio::select! {
                _ = context.cancelled() => {}
                _ = watch => {}
            }
        } else {
            context.cancelled().await;
        }
        Ok(())
    }
}
