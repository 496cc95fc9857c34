//! Grants on the approval actor (PROTOCOL.md "Approval policy", Grants): a decision that asks
//! for one makes it ([`ApprovalService::remember`]); the gate looks for one that covers a call
//! before it makes an approval ([`ApprovalService::covering_grant`]); and
//! `toolmesh.v1.grants.<account>.list|revoke` answer here.

use serde_json::{Map, Value};
use toolmesh_kernel::error::{ErrorCode, ToolError};
use toolmesh_kernel::policy::{Conditions, Globs};
use toolmesh_kernel::subjects::public::grants_parts;
use toolmesh_kernel::wire::{ApprovalRequest, GateRequest, Grant, RiskLevel};
use toolmesh_kernel::Account;

use crate::service::{store_error, ApprovalService};
use crate::store::{NewGrant, Use};

/// What a decide body's `grant` asks for, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GrantAsk {
    /// `session` scope: only the approval's session; `account`: every session.
    pub session_scope: bool,
    pub tools: Option<Vec<String>>,
    pub when: Map<String, Value>,
    pub expires_in_s: Option<u64>,
    pub uses: Option<u64>,
}

/// `grant` of a decide body: `{"scope", "tools"?, "when"?, "expires_in_s"?, "uses"?}`.
pub(crate) fn parse_ask(value: Value) -> Result<GrantAsk, ToolError> {
    let bad = |field: &str, why: &str| ToolError::invalid_request(format!("grant.{field}: {why}"));
    let Value::Object(mut map) = value else {
        return Err(ToolError::invalid_request(
            "grant must be an object: {\"scope\": \"session\" | \"account\", …}",
        ));
    };
    let session_scope = match map.remove("scope") {
        Some(Value::String(s)) if s == "session" => true,
        Some(Value::String(s)) if s == "account" => false,
        _ => return Err(bad("scope", "\"session\" or \"account\"")),
    };
    let tools = match map.remove("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let tools: Option<Vec<String>> = items
                .into_iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect();
            let tools = tools.filter(|t| !t.is_empty());
            let tools = tools.ok_or_else(|| bad("tools", "a non-empty list of globs"))?;
            Globs::parse(&tools).map_err(|e| bad("tools", &e))?;
            Some(tools)
        }
        Some(_) => return Err(bad("tools", "a non-empty list of globs")),
    };
    let when = match map.remove("when") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(when)) => {
            Conditions::parse(&when).map_err(|(field, why)| bad(&field, &why))?;
            when
        }
        Some(_) => return Err(bad("when", "an object of tests")),
    };
    let positive = |field: &str, value: Option<Value>| match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(bad(field, "a whole number of at least 1")),
        },
    };
    let expires_in_s = positive("expires_in_s", map.remove("expires_in_s"))?;
    let uses = positive("uses", map.remove("uses"))?;
    if let Some(other) = map.keys().next() {
        return Err(bad(other, "unknown member"));
    }
    Ok(GrantAsk {
        session_scope,
        tools,
        when,
        expires_in_s,
        uses,
    })
}

/// `forbidden` when `approval` may not remember itself: a critical tool, a rule with
/// `grantable = false`, or an approval that needs a quorum; `invalid_request` for session
/// scope without a session.
pub(crate) fn may_grant(approval: &ApprovalRequest, ask: &GrantAsk) -> Result<(), ToolError> {
    let forbidden = |why: &str| {
        ToolError::new(
            ErrorCode::Forbidden,
            format!(
                "approval {} may not be remembered as a grant: {why}",
                approval.id
            ),
        )
    };
    if approval.risk_level == RiskLevel::Critical {
        return Err(forbidden("its tool is critical"));
    }
    if !approval.grantable {
        return Err(forbidden("its rule says grantable = false"));
    }
    if approval.quorum > 1 {
        return Err(forbidden("it needs a quorum of reviewers"));
    }
    if ask.session_scope && approval.session_id.is_none() {
        return Err(ToolError::invalid_request(
            "grant.scope: \"session\" needs an approval made in a session; use \"account\"",
        ));
    }
    Ok(())
}

impl ApprovalService {
    /// Makes the grant `ask` describes, remembering `approval` as decided by `by`.
    /// `id` is the one the decision recorded on the approval.
    pub(crate) async fn remember(
        &self,
        id: String,
        approval: &ApprovalRequest,
        ask: GrantAsk,
        by: &str,
    ) -> Result<Grant, ToolError> {
        let new = NewGrant {
            id,
            account: approval.account.clone(),
            session_id: approval.session_id.clone().filter(|_| ask.session_scope),
            tools: ask
                .tools
                .unwrap_or_else(|| vec![approval.tool_name.clone()]),
            when: ask.when,
            created_by: by.to_owned(),
            ttl_ms: ask
                .expires_in_s
                .map_or(self.config.ttl.as_millis() as u64, |s| {
                    s.saturating_mul(1000)
                }),
            uses: ask.uses,
            approval_id: approval.id.clone(),
        };
        let grant = self.store.create_grant(&new).await.map_err(store_error)?;
        tracing::info!(grant = %grant.id, account = %grant.account, approval = %approval.id, "grant made");
        Ok(grant)
    }

    /// The grant that covers the call `request` describes, with one of its uses spent; `None`
    /// when none does (or the call may not be covered: a critical tool, a rule with
    /// `grantable = false`, no arguments to test).
    pub(crate) async fn covering_grant(&self, request: &GateRequest) -> Option<Grant> {
        if request.risk_level == RiskLevel::Critical
            || request.route.as_ref().is_some_and(|r| !r.grantable)
        {
            return None;
        }
        let arguments = request.arguments.as_ref()?;
        let ctx = &request.invocation;
        let grants = match self.store.list_grants(&ctx.account).await {
            Ok(grants) => grants,
            Err(e) => {
                tracing::warn!(error = %e, "grants not read; the call asks for an approval");
                return None;
            }
        };
        for (grant, live) in grants {
            let session_fits = grant.session_id.is_none() || grant.session_id == ctx.session_id;
            if !live || !session_fits || !covers(&grant, &request.tool_name, arguments) {
                continue;
            }
            match self.store.use_grant(&ctx.account, &grant.id).await {
                Ok(Use::Used(grant)) => return Some(*grant),
                Ok(Use::Lapsed) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, grant = %grant.id, "a grant could not be used");
                    return None;
                }
            }
        }
        None
    }

    /// `toolmesh.v1.grants.<account>.list` `{}` and `.revoke` `{"id"}`.
    pub(crate) async fn answer_grants(
        &self,
        subject: &str,
        body: &[u8],
    ) -> Result<Map<String, Value>, ToolError> {
        let (account, verb) = grants_parts(subject).map_err(|rest| {
            ToolError::invalid_request(format!(
                "{:?} is not a grants subject; use toolmesh.v1.grants.<account>.list or .revoke",
                rest.chars().take(80).collect::<String>()
            ))
        })?;
        let account =
            Account::parse(account).map_err(|e| ToolError::invalid_request(e.to_string()))?;
        let map = match serde_json::from_slice(body) {
            Ok(Value::Object(map)) => map,
            _ => {
                return Err(ToolError::invalid_request(
                    "the request body must be a JSON object",
                ))
            }
        };
        let mut fields = Map::new();
        if verb == "list" {
            let grants = self
                .store
                .list_grants(&account)
                .await
                .map_err(store_error)?;
            let grants: Vec<Value> = grants
                .into_iter()
                .filter_map(|(grant, _)| serde_json::to_value(grant).ok())
                .collect();
            fields.insert("grants".into(), Value::Array(grants));
            let limit = toolmesh_kernel::budget::listing_limit(self.nats.max_payload());
            toolmesh_kernel::budget::fit_list(&mut fields, "grants", limit);
            return Ok(fields);
        }
        let id = match map.get("id") {
            Some(Value::String(id)) if toolmesh_kernel::ids::is_grant_id(id) => id,
            _ => {
                return Err(ToolError::invalid_request(
                    "revoke needs \"id\": a grant id (grant_…)",
                ))
            }
        };
        let revoked = self
            .store
            .revoke_grant(&account, id)
            .await
            .map_err(store_error)?;
        let Some(grant) = revoked else {
            return Err(ToolError::new(
                ErrorCode::NotFound,
                format!("no grant {id} in account {account}"),
            ));
        };
        tracing::info!(grant = %grant.id, account = %account, "grant revoked");
        fields.insert(
            "grant".into(),
            serde_json::to_value(grant).unwrap_or(Value::Null),
        );
        Ok(fields)
    }
}

/// Whether `grant`'s tools and tests cover a call of `tool` with `arguments`.
fn covers(grant: &Grant, tool: &str, arguments: &Value) -> bool {
    let tools = Globs::parse(&grant.tools);
    let when = Conditions::parse(&grant.when);
    match (tools, when) {
        (Ok(tools), Ok(when)) => tools.is_match(tool) && when.hold(arguments),
        _ => false,
    }
}
