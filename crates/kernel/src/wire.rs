//! Serde types of PROTOCOL.md (public) and of the internal messages between actors.
//!
//! These are wire types only. An actor's actix messages carry the raw NATS message
//! (`toolmesh-actix-host`, the gateway's `actor.rs`); the task that handles one parses its body
//! into these types (`ToolRequest::parse`, `ActorCall::parse` in the actors' tool host).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{ErrorCode, ToolError};
use crate::ids::{Account, InvocationId, NodeId, SessionId};
use crate::role::Role;

/// Longest `wait_for_approval_s` a call may ask for.
pub const MAX_WAIT_FOR_APPROVAL_S: u64 = 3600;
/// Longest `user_id` / `agent_id` copied into events.
pub const MAX_PRINCIPAL_LEN: usize = 256;

/// How bad a tool can be if misused; decides approval with the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskLevel {
    Low,
    Medium,
    High,
    Critical,
}

impl RiskLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            RiskLevel::Low => "low",
            RiskLevel::Medium => "medium",
            RiskLevel::High => "high",
            RiskLevel::Critical => "critical",
        }
    }
}

/// What a tool may change outside its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SideEffect {
    WorkspaceWrite,
    WorkspaceDelete,
    IsolatedRuntimeExecution,
    ProcessControl,
    NetworkEgress,
}

/// The `approval` member of a ToolRequest.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ApprovalGrant {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
    /// Which client made an in-band decision: `mcp` or `mcp:<token name>` (the MCP front
    /// sends its client's answer this way). Recorded as `decided_by` in place of `in-band`;
    /// it labels an in-band decision and never makes one count where in-band decisions do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
}

impl ApprovalGrant {
    /// What an in-band decision records as `decided_by`.
    pub fn decider(&self) -> &str {
        self.decided_by.as_deref().unwrap_or(IN_BAND_DECIDER)
    }
}

/// `decided_by` of an in-band decision that names no client.
pub const IN_BAND_DECIDER: &str = "in-band";

/// Why an in-band `approved` changed nothing: this cluster takes decisions out of band only.
/// Appended to the refusal's message.
pub fn in_band_off_note(account: &Account) -> String {
    format!(
        "; in-band decisions are off here (TOOLMESH_APPROVAL_IN_BAND=0), so \"approved\" in the call counts for nothing: a person allowed to decide for {account} must decide on {}",
        crate::subjects::public::approvals(account, crate::subjects::public::ApprovalVerb::Decide)
    )
}

/// Whether `label` may name the client of an in-band decision: `mcp`, or `mcp:` and a
/// [`is_client_name`].
pub fn is_in_band_decider(label: &str) -> bool {
    match label.strip_prefix("mcp") {
        Some("") => true,
        Some(rest) => rest.strip_prefix(':').is_some_and(is_client_name),
        None => false,
    }
}

/// The longest [`is_client_name`].
pub const MAX_CLIENT_NAME: usize = 64;

/// Whether `name` may name a client (an MCP token's `"name"`): 1 to [`MAX_CLIENT_NAME`]
/// characters from `[A-Za-z0-9_.@-]`, plain enough for `decided_by` and a log line.
pub fn is_client_name(name: &str) -> bool {
    (1..=MAX_CLIENT_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-'))
}

/// Who, on whose behalf, in which session: copied into every event and internal message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvocationContext {
    pub account: Account,
    pub invocation_id: InvocationId,
    #[serde(default)]
    pub session_id: Option<SessionId>,
    #[serde(default)]
    pub user_id: Option<String>,
    #[serde(default)]
    pub agent_id: Option<String>,
}

/// A parsed `toolmesh.v1.call.<account>` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tool: String,
    /// Always an object.
    pub arguments: Value,
    pub invocation_id: InvocationId,
    pub session_id: Option<SessionId>,
    pub user_id: Option<String>,
    pub agent_id: Option<String>,
    pub approval: Option<ApprovalGrant>,
    pub wait_for_approval_s: u64,
}

/// A body refused before it named a tool; it still gets a reply with this invocation id.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRefused {
    pub invocation_id: InvocationId,
    pub error: ToolError,
}

impl ToolRequest {
    /// Parses and checks a call body. The invocation id is echoed when it is well formed,
    /// even if something else is wrong.
    pub fn parse(body: &[u8]) -> Result<ToolRequest, Box<RequestRefused>> {
        let generated = InvocationId::generate;
        let refuse = |invocation_id, message: String| {
            Box::new(RequestRefused {
                invocation_id,
                error: ToolError::invalid_request(message),
            })
        };
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(refuse(
                generated(),
                "the request body is empty; send a JSON object with at least \"tool\"".into(),
            ));
        }
        let value: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return Err(refuse(
                    generated(),
                    format!("the request body is not valid JSON ({e})"),
                ))
            }
        };
        let Value::Object(mut map) = value else {
            return Err(refuse(
                generated(),
                format!(
                    "the request body must be a JSON object, got {}",
                    json_kind(&value)
                ),
            ));
        };
        let invocation_id = match map.remove("invocation_id") {
            None | Some(Value::Null) => generated(),
            Some(Value::String(s)) => match InvocationId::parse(s) {
                Ok(id) => id,
                Err(e) => return Err(refuse(generated(), e.to_string())),
            },
            Some(other) => {
                return Err(refuse(
                    generated(),
                    format!("invocation_id must be a string, got {}", json_kind(&other)),
                ))
            }
        };
        let fail = |message: String| {
            Box::new(RequestRefused {
                invocation_id: invocation_id.clone(),
                error: ToolError::invalid_request(message),
            })
        };
        let tool = match map.remove("tool") {
            Some(Value::String(s)) if !s.is_empty() => s,
            Some(Value::String(_)) => return Err(fail("tool must not be empty".into())),
            None | Some(Value::Null) => {
                return Err(fail(
                    "the request has no \"tool\"; name the tool to run".into(),
                ))
            }
            Some(other) => {
                return Err(fail(format!(
                    "tool must be a string, got {}",
                    json_kind(&other)
                )))
            }
        };
        let arguments = match map.remove("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(v @ Value::Object(_)) => v,
            Some(other) => {
                return Err(fail(format!(
                    "arguments must be a JSON object, got {}",
                    json_kind(&other)
                )))
            }
        };
        let session_id = match map.remove("session_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(SessionId::parse(s).map_err(|e| fail(e.to_string()))?),
            Some(other) => {
                return Err(fail(format!(
                    "session_id must be a string, got {}",
                    json_kind(&other)
                )))
            }
        };
        let principal = |map: &mut Map<String, Value>, field: &str| match map.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.len() <= MAX_PRINCIPAL_LEN => Ok(Some(s)),
            Some(Value::String(_)) => {
                Err(format!("{field} must be at most {MAX_PRINCIPAL_LEN} bytes"))
            }
            Some(other) => Err(format!(
                "{field} must be a string, got {}",
                json_kind(&other)
            )),
        };
        let user_id = principal(&mut map, "user_id").map_err(fail)?;
        let agent_id = principal(&mut map, "agent_id").map_err(fail)?;
        let approval = match map.remove("approval") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_grant(v).map_err(fail)?),
        };
        let wait_for_approval_s = match map.remove("wait_for_approval_s") {
            None | Some(Value::Null) => 0,
            Some(v) => match v.as_u64() {
                Some(n) if n <= MAX_WAIT_FOR_APPROVAL_S => n,
                _ => {
                    return Err(fail(format!(
                        "wait_for_approval_s must be a whole number of seconds from 0 to {MAX_WAIT_FOR_APPROVAL_S}, got {v}"
                    )))
                }
            },
        };
        Ok(ToolRequest {
            tool,
            arguments,
            invocation_id,
            session_id,
            user_id,
            agent_id,
            approval,
            wait_for_approval_s,
        })
    }

    pub fn context(&self, account: Account) -> InvocationContext {
        InvocationContext {
            account,
            invocation_id: self.invocation_id.clone(),
            session_id: self.session_id.clone(),
            user_id: self.user_id.clone(),
            agent_id: self.agent_id.clone(),
        }
    }
}

fn parse_grant(value: Value) -> Result<ApprovalGrant, String> {
    let Value::Object(map) = value else {
        return Err(format!(
            "approval must be an object like {{\"id\": \"appr_…\", \"approved\": true}}, got {}",
            json_kind(&value)
        ));
    };
    let mut grant = ApprovalGrant::default();
    for (key, value) in map {
        match (key.as_str(), value) {
            ("id", Value::Null) | ("approved", Value::Null) => {}
            ("id", Value::String(s)) => {
                if !is_approval_id(&s) {
                    return Err(format!("approval.id {s:?} is not an approval id"));
                }
                grant.id = Some(s);
            }
            ("approved", Value::Bool(b)) => grant.approved = Some(b),
            ("decided_by", Value::String(s)) if is_in_band_decider(&s) => {
                grant.decided_by = Some(s)
            }
            ("decided_by", other) => {
                let got = match &other {
                    Value::String(s) => format!("{:?}", s.chars().take(70).collect::<String>()),
                    other => json_kind(other).to_owned(),
                };
                return Err(format!(
                    "approval.decided_by names the client of an in-band decision, \"mcp\" or \"mcp:<token name>\"; got {got}"
                ));
            }
            ("id", other) => {
                return Err(format!(
                    "approval.id must be a string, got {}",
                    json_kind(&other)
                ))
            }
            ("approved", other) => {
                return Err(format!(
                    "approval.approved must be true or false, got {}",
                    json_kind(&other)
                ))
            }
            _ => {} // unknown members are ignored, as at the top level
        }
    }
    Ok(grant)
}

/// Approval ids are subject-safe tokens (we generate `appr_<hex>`).
pub fn is_approval_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// "an object", "a string", … for error messages.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Writes a reply body member by member, without building an intermediate map (replies are
/// the gateway's hot path): `{"ok":…,"invocation_id":…,…members}`.
#[derive(Debug)]
pub struct ReplyWriter {
    buf: Vec<u8>,
}

impl ReplyWriter {
    pub fn new(ok: bool, invocation_id: Option<&InvocationId>) -> Self {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(if ok {
            b"{\"ok\":true"
        } else {
            b"{\"ok\":false"
        });
        let mut writer = Self { buf };
        if let Some(id) = invocation_id {
            writer.member("invocation_id", id.as_str());
        }
        writer
    }

    /// `,"key":value`
    pub fn member<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> &mut Self {
        self.buf.push(b',');
        serde_json::to_writer(&mut self.buf, key).expect("a str serializes");
        self.buf.push(b':');
        serde_json::to_writer(&mut self.buf, value).expect("wire values serialize");
        self
    }

    /// Every member of `fields` but `ok` and `invocation_id` (those are written first).
    pub fn members(&mut self, fields: &Map<String, Value>) -> &mut Self {
        for (key, value) in fields {
            if key != "ok" && key != "invocation_id" {
                self.member(key, value);
            }
        }
        self
    }

    /// Members already serialized as `"k":v,"k2":v2` (no braces, no leading comma).
    pub fn raw_members(&mut self, members: &[u8]) -> &mut Self {
        if !members.is_empty() {
            self.buf.push(b',');
            self.buf.extend_from_slice(members);
        }
        self
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.buf.push(b'}');
        self.buf
    }
}

/// Builds the reply body: `{"ok": …, "invocation_id": …, …fields}`.
pub fn reply_body(invocation_id: &InvocationId, fields: Map<String, Value>) -> Vec<u8> {
    let ok = fields.get("ok") != Some(&Value::Bool(false));
    let mut writer = ReplyWriter::new(ok, Some(invocation_id));
    writer.members(&fields);
    writer.finish()
}

/// Failure shape without `invocation_id` (for subjects other than the call subject).
pub fn error_body(error: ToolError) -> Vec<u8> {
    let mut writer = ReplyWriter::new(false, None);
    writer.members(&error.into_fields());
    writer.finish()
}

/// Success shape without `invocation_id`.
pub fn ok_body(fields: Map<String, Value>) -> Vec<u8> {
    let mut writer = ReplyWriter::new(true, None);
    writer.members(&fields);
    writer.finish()
}

/// The lifecycle of an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Rejected,
    Expired,
    Used,
}

impl ApprovalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Used => "used",
        }
    }
}

/// PROTOCOL.md's ApprovalRequest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub id: String,
    pub account: Account,
    pub session_id: Option<SessionId>,
    pub invocation_id: InvocationId,
    pub tool_name: String,
    pub risk_level: RiskLevel,
    pub side_effects: Vec<SideEffect>,
    pub arguments_sha256: String,
    pub arguments_preview: String,
    pub status: ApprovalStatus,
    pub created_at: String,
    pub expires_at: String,
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
    pub reason: Option<String>,
}

/// What `…decide` carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    pub id: String,
    pub approved: bool,
    #[serde(default)]
    pub approver: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// The kinds of RunEvent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunEventKind {
    Started,
    ApprovalRequired,
    Approved,
    Rejected,
    Stdout,
    Stderr,
    /// A sandbox's request through its egress proxy (`host`, `port`, `allowed`).
    Egress,
    Finished,
}

/// A RunEvent as it goes on the wire (serialized straight from borrowed parts).
#[derive(Serialize)]
struct RunEventBody<'a> {
    invocation_id: &'a str,
    seq: u64,
    kind: RunEventKind,
    at: String,
    session_id: Option<&'a str>,
    user_id: Option<&'a str>,
    agent_id: Option<&'a str>,
    tool: &'a str,
    account: &'a str,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

/// Builds the RunEvent body for one invocation.
pub fn run_event(
    ctx: &InvocationContext,
    tool: &str,
    seq: u64,
    kind: RunEventKind,
    extra: &Map<String, Value>,
) -> Vec<u8> {
    let body = RunEventBody {
        invocation_id: ctx.invocation_id.as_str(),
        seq,
        kind,
        at: crate::time::now_rfc3339(),
        session_id: ctx.session_id.as_ref().map(|s| s.as_str()),
        user_id: ctx.user_id.as_deref(),
        agent_id: ctx.agent_id.as_deref(),
        tool,
        account: ctx.account.as_str(),
        extra,
    };
    serde_json::to_vec(&body).expect("a run event serializes")
}

/// A sandbox worker's capacity, in NodeStatus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxCapacity {
    pub backend: String,
    pub capacity: u64,
    pub in_use: u64,
    /// The worker's sandbox templates (PROTOCOL.md "Sandbox templates").
    #[serde(default)]
    pub templates: Vec<SandboxTemplateStatus>,
}

/// One sandbox template of a worker, in NodeStatus and `component_status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxTemplateStatus {
    pub name: String,
    pub image: String,
    /// `runc` or `runsc`.
    pub runtime: String,
    /// `none`, `allow`, or a Docker network's name.
    pub network: String,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
    /// Started sandboxes ready for new sessions now.
    pub warm: u64,
    /// Sessions whose sandbox is of this template.
    pub in_use: u64,
}

/// The MCP servers a bridge node serves, in NodeStatus (only on nodes with the `bridge` role).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BridgeStatus {
    pub servers: Vec<McpServerStatus>,
}

/// One MCP server of a bridge (PROTOCOL.md "MCP servers as providers").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpServerStatus {
    /// Its key in the `mcpServers` file.
    pub name: String,
    /// The micro service its tools are served as (`mcp-<name>`).
    pub service: String,
    /// `stdio` (a child process) or `http` (streamable HTTP).
    pub transport: String,
    pub state: McpServerState,
    /// Times the server was started again after it exited or its connection closed.
    pub restarts: u64,
    /// Tools served now (endpoints of its service).
    pub tools: usize,
    /// MCP tools not served, each with why (a name too long, or two names that read the same).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_tools: Vec<SkippedTool>,
    /// The server's process id, while a stdio server runs.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Why the last start failed or the server last stopped (display-safe).
    #[serde(default)]
    pub last_error: Option<String>,
}

/// A tool an MCP server lists that the bridge does not serve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkippedTool {
    pub tool: String,
    pub reason: String,
}

/// Where an MCP server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpServerState {
    /// The first start (process and handshake, then `tools/list`) is under way.
    Starting,
    /// Connected; its tools are served.
    Running,
    /// It was running and exited (or its connection closed); it starts again after a backoff.
    Restarting,
    /// Its last start failed (no process, no handshake, no tool list); it is tried again after
    /// a backoff.
    Failed,
}

impl McpServerState {
    pub fn as_str(self) -> &'static str {
        match self {
            McpServerState::Starting => "starting",
            McpServerState::Running => "running",
            McpServerState::Restarting => "restarting",
            McpServerState::Failed => "failed",
        }
    }
}

/// PROTOCOL.md's NodeStatus; also the body of a heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node_id: NodeId,
    pub roles: Vec<Role>,
    pub version: String,
    pub uptime_s: u64,
    pub in_flight: u64,
    pub sandbox: Option<SandboxCapacity>,
    /// A bridge node's MCP servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<BridgeStatus>,
}

/// PROTOCOL.md's ClusterStatus (without `ok`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub nodes: Vec<NodeStatus>,
}

/// A heartbeat on the internal subject: a node's status, or its goodbye when it drains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub status: NodeStatus,
    #[serde(default)]
    pub leaving: bool,
}

/// The NATS header of a *claim*: for a long-running role ([`Role::is_long_running`]) the worker
/// that takes an [`ActorCall`] first publishes, to the call's reply subject, an empty message
/// with this header set to its node id ([`crate::host::publish_claim`]). A worker that hands the
/// call on lets the next one claim it too: the latest claim wins. The gateway watches the
/// claimant in its cluster view and answers `unavailable` when it drops out. The message
/// without this header is the [`ActorReply`].
pub const CLAIMED_BY_HEADER: &str = "Toolmesh-Claimed-By";

/// Gateway → actor: run this tool for this invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorCall {
    pub invocation: InvocationContext,
    pub tool: String,
    pub arguments: Value,
    /// The next RunEvent `seq` the actor may use (events stay gap-free across actors).
    pub event_seq: u64,
    /// Set when the actor answers the caller itself ([`DirectReply`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<DirectReply>,
}

impl ActorCall {
    /// Reads a routed call; a malformed one is `invalid_request`, answered to the gateway.
    pub fn parse(payload: &[u8]) -> Result<Self, ToolError> {
        serde_json::from_slice(payload)
            .map_err(|e| ToolError::invalid_request(format!("malformed routed call: {e}")))
    }

    /// What answering this call directly needs once the tool ran; `None` when the gateway
    /// answers it.
    pub fn direct_finish(&self) -> Option<DirectFinish> {
        Some(DirectFinish {
            invocation: self.invocation.clone(),
            event_seq: self.event_seq,
            direct: self.direct.clone()?,
        })
    }
}

/// The part of an [`ActorCall`] with a [`DirectReply`] that finishing it needs (not the
/// arguments, which the tool consumed).
#[derive(Debug, Clone, PartialEq)]
pub struct DirectFinish {
    pub invocation: InvocationContext,
    /// The call's first event `seq` ([`ActorCall::event_seq`]).
    pub event_seq: u64,
    pub direct: DirectReply,
}

/// What an actor needs to finish a call in the gateway's place: publish `finished`, send the
/// public reply to the caller, then tell the gateway it did ([`ActorReply::delivered`]). This
/// spares the reply one hop through the gateway. The gateway asks for it only for calls that
/// used no approval (so no outcome makes it give one back) and whose caller's reply subject is
/// under `_INBOX.` (nodes may publish there; see docs/operations.md, "The account boundary is
/// the broker's"). Timeouts, lost workers and no responders are still answered by the gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirectReply {
    /// The caller's reply subject.
    pub reply_to: String,
    /// The tool the call's RunEvents name (`tool_dispatcher` for a dispatched call).
    pub event_tool: String,
    /// The inner tool of a `tool_dispatcher` call: in the reply and in `finished`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatched_tool_name: Option<String>,
    /// Milliseconds since the gateway published `started`, for `finished`'s `duration_ms`.
    pub elapsed_ms: u64,
}

/// The extra members of a `finished` RunEvent.
pub fn finished_extra(
    error: Option<ErrorCode>,
    duration_ms: u64,
    dispatched_tool_name: Option<&str>,
) -> Map<String, Value> {
    let mut extra = Map::with_capacity(4);
    extra.insert("ok".into(), Value::Bool(error.is_none()));
    extra.insert(
        "error".into(),
        error.map_or(Value::Null, |c| Value::from(c.as_str())),
    );
    extra.insert("duration_ms".into(), Value::from(duration_ms));
    if let Some(name) = dispatched_tool_name {
        extra.insert("dispatched_tool_name".into(), Value::from(name));
    }
    extra
}

/// The public reply to a routed call from an actor's reply fields (`ok` first, then
/// `invocation_id`, the fields in order, and `dispatched_tool_name` for a dispatched call).
pub fn public_reply(
    invocation_id: &InvocationId,
    fields: &Map<String, Value>,
    dispatched_tool_name: Option<&str>,
) -> Vec<u8> {
    let ok = fields.get("ok") != Some(&Value::Bool(false));
    let mut writer = ReplyWriter::new(ok, Some(invocation_id));
    writer.members(fields);
    if let Some(name) = dispatched_tool_name {
        writer.member("dispatched_tool_name", name);
    }
    writer.finish()
}

/// Actor → gateway: the tool's reply fields and how many events the actor published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorReply {
    pub reply: Map<String, Value>,
    #[serde(default)]
    pub events_emitted: u64,
    /// The actor refused before running anything (a failure only): an approval the call
    /// used is given back, as when no actor received it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_run: bool,
    /// The actor answered the caller itself ([`DirectReply`]); `reply` is empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delivered: bool,
    /// With `delivered`: the error code of the reply the caller got (none: it succeeded), so
    /// the gateway counts the call's outcome (`toolmesh_calls_total`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_error: Option<ErrorCode>,
}

impl ActorReply {
    pub fn ok(fields: Map<String, Value>) -> Self {
        let mut reply = Map::with_capacity(fields.len() + 1);
        reply.insert("ok".into(), Value::Bool(true));
        reply.extend(fields);
        Self {
            reply,
            events_emitted: 0,
            not_run: false,
            delivered: false,
            delivered_error: None,
        }
    }
    pub fn error(error: ToolError) -> Self {
        Self {
            reply: error.into_fields(),
            events_emitted: 0,
            not_run: false,
            delivered: false,
            delivered_error: None,
        }
    }
    /// The gateway's notice that the caller has its reply ([`DirectReply`]), failed with
    /// `error` or not.
    pub fn delivered(events_emitted: u64, error: Option<ErrorCode>) -> Self {
        Self {
            reply: Map::new(),
            events_emitted,
            not_run: false,
            delivered: true,
            delivered_error: error,
        }
    }
    /// A refusal before anything ran (see [`ActorReply::not_run`]).
    pub fn refused(error: ToolError) -> Self {
        Self {
            not_run: true,
            ..Self::error(error)
        }
    }
}

/// Gateway → approval actor: this call needs approval; here is what it carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateRequest {
    pub invocation: InvocationContext,
    pub tool_name: String,
    pub risk_level: RiskLevel,
    pub side_effects: Vec<SideEffect>,
    pub arguments_sha256: String,
    /// A preview made by the sender. Gateways that predate `arguments` send it; a gateway
    /// that sends `arguments` does not, and the approval actor makes the preview from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_preview: Option<String>,
    pub grant: Option<ApprovalGrant>,
    /// The arguments as sent, whose JCS hash is `arguments_sha256`: the approval actor stores
    /// them for `approvals.<account>.get`. Sent only when the call may create an approval
    /// (no approval id presented).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
}

/// Approval actor → gateway: run the call, or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum GateOutcome {
    /// Approved and now used by this call.
    Proceed { approval: ApprovalRequest },
    /// A new pending approval was created for this call. `in_band`: whether an in-band
    /// decision on it would count (`TOOLMESH_APPROVAL_IN_BAND` of the approval role), so a
    /// front knows whether asking its client is any use.
    Required {
        approval: ApprovalRequest,
        #[serde(default)]
        in_band: bool,
    },
    /// The call may not run; `approval` is set when one exists (pending, rejected, …).
    Refused {
        error: ErrorCode,
        error_message: String,
        approval: Option<ApprovalRequest>,
    },
}

/// Gateway → approval actor: the call `invocation_id` consumed approval `approval_id` (a
/// `Proceed`), but provably never ran (NATS had no responder for it), so give the approval
/// back. The approval actor only does so while the approval is still `used` by exactly this
/// invocation in this account and has not expired; anything else is answered `released: false`
/// and changes nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRelease {
    pub account: Account,
    pub approval_id: String,
    pub invocation_id: InvocationId,
}

/// Approval actor → gateway, answering an [`ApprovalRelease`].
///
/// `released` is true when the approval is `approved` again (or this very release was retried
/// after a lost reply); `approval` is the record as it is now, when it exists in that account.
/// `error` is set only when the request could not be judged at all (malformed, store
/// unreachable): a plain "not yours to release" is `released: false` without an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseAck {
    pub released: bool,
    #[serde(default)]
    pub approval: Option<ApprovalRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

impl ReleaseAck {
    /// Judged and not released (or released, with `released: true`).
    pub fn judged(released: bool, approval: Option<ApprovalRequest>) -> Self {
        Self {
            released,
            approval,
            error: None,
            error_message: None,
        }
    }

    /// Not judged: nothing was released because of `error`.
    pub fn failed(error: ToolError) -> Self {
        Self {
            released: false,
            approval: None,
            error: Some(error.code),
            error_message: Some(error.message),
        }
    }
}

/// `…cancel` reply from an actor holding the invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelAck {
    pub cancelled: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str) -> (String, String) {
        let err = ToolRequest::parse(body.as_bytes()).unwrap_err();
        (err.error.code.to_string(), err.error.message)
    }

    #[test]
    fn bad_bodies_are_invalid_requests() {
        for body in [
            "",
            "  ",
            "nope",
            "[]",
            "42",
            "\"tool\"",
            "{}",
            r#"{"tool": 5}"#,
            r#"{"tool": ""}"#,
            r#"{"tool":"x","arguments":[1]}"#,
            r#"{"tool":"x","arguments":"{}"}"#,
            r#"{"tool":"x","session_id":"a b"}"#,
            r#"{"tool":"x","session_id":7}"#,
            r#"{"tool":"x","wait_for_approval_s":3601}"#,
            r#"{"tool":"x","wait_for_approval_s":-1}"#,
            r#"{"tool":"x","wait_for_approval_s":1.5}"#,
            r#"{"tool":"x","approval":true}"#,
            r#"{"tool":"x","approval":{"approved":"yes"}}"#,
            r#"{"tool":"x","approval":{"id":"a.b"}}"#,
            r#"{"tool":"x","approval":{"approved":true,"decided_by":"alice"}}"#,
            r#"{"tool":"x","approval":{"approved":true,"decided_by":"mcp:a b"}}"#,
            r#"{"tool":"x","approval":{"approved":true,"decided_by":7}}"#,
            r#"{"tool":"x","invocation_id":"has space"}"#,
        ] {
            let (code, message) = refused(body);
            assert_eq!(code, "invalid_request", "{body}: {message}");
            assert!(!message.is_empty());
        }
    }

    #[test]
    fn session_error_names_session_id() {
        let (_, message) = refused(r#"{"tool":"x","session_id":"a.b"}"#);
        assert!(message.contains("session_id"), "{message}");
    }

    #[test]
    fn invocation_id_is_echoed_even_when_the_rest_is_wrong() {
        let err = ToolRequest::parse(br#"{"tool":5,"invocation_id":"inv-1"}"#).unwrap_err();
        assert_eq!(err.invocation_id.as_str(), "inv-1");
    }

    #[test]
    fn a_good_request_parses_with_defaults() {
        let req = ToolRequest::parse(
            br#"{"tool":"t","account":"other","approval":{"id":"appr_1","approved":true}}"#,
        )
        .unwrap();
        assert_eq!(req.tool, "t");
        assert_eq!(req.arguments, serde_json::json!({}));
        assert_eq!(req.wait_for_approval_s, 0);
        assert_eq!(
            req.approval,
            Some(ApprovalGrant {
                id: Some("appr_1".into()),
                approved: Some(true),
                decided_by: None,
            })
        );
        assert!(req.invocation_id.as_str().starts_with("inv_"));
        let by_mcp = ToolRequest::parse(
            br#"{"tool":"t","approval":{"id":"appr_1","approved":true,"decided_by":"mcp:ci-bot"}}"#,
        )
        .unwrap();
        assert_eq!(by_mcp.approval.unwrap().decider(), "mcp:ci-bot");
    }

    #[test]
    fn replies_put_ok_and_the_invocation_id_first() {
        let id = InvocationId::parse("inv-1").unwrap();
        let mut fields = Map::new();
        fields.insert("b".into(), Value::from(1));
        fields.insert("ok".into(), Value::Bool(false));
        fields.insert("a".into(), Value::from("x"));
        let body = String::from_utf8(reply_body(&id, fields)).unwrap();
        assert_eq!(
            body,
            r#"{"ok":false,"invocation_id":"inv-1","b":1,"a":"x"}"#
        );
        let mut writer = ReplyWriter::new(true, None);
        writer.raw_members(br#""k":[1]"#).member("z", &2);
        assert_eq!(writer.finish(), br#"{"ok":true,"k":[1],"z":2}"#);
    }

    #[test]
    fn run_events_carry_the_context_and_extras() {
        let ctx = InvocationContext {
            account: Account::parse("acme").unwrap(),
            invocation_id: InvocationId::parse("inv-1").unwrap(),
            session_id: None,
            user_id: Some("u".into()),
            agent_id: None,
        };
        let mut extra = Map::new();
        extra.insert("ok".into(), Value::Bool(true));
        let event: Value =
            serde_json::from_slice(&run_event(&ctx, "t", 3, RunEventKind::Finished, &extra))
                .unwrap();
        assert_eq!(event["seq"], 3);
        assert_eq!(event["kind"], "finished");
        assert_eq!(event["session_id"], Value::Null);
        assert_eq!(event["user_id"], "u");
        assert_eq!(event["ok"], true);
    }

    #[test]
    fn gate_outcome_is_tagged() {
        let v = serde_json::to_value(GateOutcome::Refused {
            error: ErrorCode::ApprovalMismatch,
            error_message: "m".into(),
            approval: None,
        })
        .unwrap();
        assert_eq!(v["outcome"], "refused");
        assert_eq!(v["error"], "approval_mismatch");
    }

    #[test]
    fn release_messages_round_trip_and_errors_are_optional() {
        let release: ApprovalRelease = serde_json::from_str(
            r#"{"account":"acme","approval_id":"appr_1","invocation_id":"inv-1"}"#,
        )
        .unwrap();
        assert_eq!(release.account.as_str(), "acme");
        assert_eq!(release.invocation_id.as_str(), "inv-1");
        // The kernel's id types guard the account and the invocation id.
        for bad in [
            r#"{"account":"a.b","approval_id":"appr_1","invocation_id":"inv-1"}"#,
            r#"{"account":"acme","approval_id":"appr_1","invocation_id":"a b"}"#,
            r#"{"account":"acme","invocation_id":"inv-1"}"#,
        ] {
            assert!(
                serde_json::from_str::<ApprovalRelease>(bad).is_err(),
                "{bad}"
            );
        }

        let plain = serde_json::to_value(ReleaseAck::judged(false, None)).unwrap();
        assert_eq!(
            plain,
            serde_json::json!({"released": false, "approval": null})
        );
        let failed = ReleaseAck::failed(ToolError::new(ErrorCode::Unavailable, "down"));
        let v = serde_json::to_value(&failed).unwrap();
        assert_eq!(v["error"], "unavailable");
        assert_eq!(v["error_message"], "down");
        assert_eq!(serde_json::from_value::<ReleaseAck>(v).unwrap(), failed);
        let minimal: ReleaseAck = serde_json::from_str(r#"{"released":true}"#).unwrap();
        assert_eq!(minimal, ReleaseAck::judged(true, None));
    }
}
