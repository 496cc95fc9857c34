//! Approvals on the wire: a tool's risk and side effects, the grant a call presents, in-band
//! deciders, and the approval record with its decision.

use serde::{Deserialize, Serialize};

use crate::ids::{Account, InvocationId, SessionId};

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
    /// The policy rule that made the approval (PROTOCOL.md "Approval policy"); null when the
    /// mode did.
    #[serde(default)]
    pub rule_id: Option<String>,
    /// The revision of the policy file that made it.
    #[serde(default)]
    pub policy_revision: Option<String>,
    /// The reviewer group that decides it; null: anyone who may decide in the account.
    #[serde(default)]
    pub reviewers: Option<String>,
    /// Approvals by distinct members it needs (1 unless its rule says more).
    #[serde(default = "one")]
    pub quorum: u32,
    /// Every member's decision on a routed approval, in order; null for one not routed.
    #[serde(default)]
    pub decisions: Option<Vec<MemberDecision>>,
    /// It passed its deadline undecided and went to its rule's `escalate_to` group.
    #[serde(default)]
    pub escalated: bool,
    /// A reviewer changed the arguments before approving: `arguments_sha256` and the preview
    /// are the edited arguments', `original_arguments_sha256` the call's.
    #[serde(default)]
    pub edited: bool,
    /// The hash of the arguments the call was made with, when a reviewer edited them.
    #[serde(default)]
    pub original_arguments_sha256: Option<String>,
    /// The grant its approval was remembered as.
    #[serde(default)]
    pub grant_id: Option<String>,
    /// Whether a decision on it may remember itself as a grant (its rule's `grantable`); the
    /// approval actor's own, never on the wire.
    #[serde(skip_serializing, default = "yes")]
    pub grantable: bool,
}

fn one() -> u32 {
    1
}

/// One reviewer's decision on a routed approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberDecision {
    pub approver: String,
    pub approved: bool,
    pub at: String,
    pub reason: Option<String>,
}

/// How the gateway routes the approval an `ask` rule makes: the rule and revision it records,
/// who decides it and by when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRoute {
    pub rule_id: String,
    pub policy_revision: Option<String>,
    /// The group and its members at the time the approval is made.
    #[serde(default)]
    pub reviewers: Option<String>,
    #[serde(default)]
    pub members: Vec<String>,
    pub quorum: u32,
    /// The rule's deadline in place of the approval TTL.
    #[serde(default)]
    pub expires_in_s: Option<u64>,
    /// `on_timeout = "escalate"`: the group (and its members) the approval goes to, once,
    /// when its deadline passes undecided.
    #[serde(default)]
    pub escalate_to: Option<String>,
    #[serde(default)]
    pub escalate_members: Vec<String>,
    /// Whether a decision on the approval may remember itself as a grant.
    #[serde(default = "yes")]
    pub grantable: bool,
}

fn yes() -> bool {
    true
}

/// PROTOCOL.md's Grant: a decision that remembers itself, covering later calls of its account
/// (and session, for `session` scope) that match its tools and tests, until it expires, runs
/// out of uses or is revoked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    pub id: String,
    pub account: Account,
    /// `None`: every session of the account (`account` scope).
    pub session_id: Option<SessionId>,
    pub tools: Vec<String>,
    pub when: serde_json::Map<String, serde_json::Value>,
    pub created_by: String,
    pub created_at: String,
    pub expires_at: String,
    /// `None`: no limit.
    pub uses_left: Option<u64>,
    pub revoked_at: Option<String>,
    pub approval_id: String,
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
