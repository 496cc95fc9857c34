//! The gateway's part of the audit trail (`kernel::audit`): a `started` entry before a call
//! that may change something runs, a `finished` entry for every call before its reply, and
//! the answers on `toolmesh.v1.audit.<account>.query`.

use std::sync::Arc;

use async_nats::Message;
use serde_json::{Map, Value};

use toolmesh_kernel::audit::{AuditEntry, AuditTrail, DEFAULT_QUERY_LIMIT, MAX_QUERY_LIMIT};
use toolmesh_kernel::canonical::arguments_sha256;
use toolmesh_kernel::host::respond;
use toolmesh_kernel::policy::{Policy, Rule};
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::tools::ToolSpec;
use toolmesh_kernel::wire::{self, InvocationContext, RiskLevel};
use toolmesh_kernel::{Account, ErrorCode, ToolError};

use crate::core::GatewayCore;

/// What a call's entries share, set once its arguments were valid.
pub struct CallAudit {
    tool: String,
    arguments_sha256: String,
    /// The call may change something: it gets a `started` entry before it runs.
    changes: bool,
    /// The policy rule that decided the call, and the file's revision.
    rule_id: Option<String>,
    policy_revision: Option<String>,
    /// The grant that let the call run.
    grant_id: Option<String>,
    /// The call runs with arguments a reviewer edited before approving.
    edited: bool,
    /// Who decided the call without an approval: the pre-reviewer (`review`).
    decided_by: Option<String>,
}

impl CallAudit {
    /// `None` when the trail is off.
    pub fn begin(
        trail: &AuditTrail,
        spec: &ToolSpec,
        arguments: &Value,
        rule: Option<(&Rule, &Policy)>,
    ) -> Option<Box<Self>> {
        if !trail.is_on() {
            return None;
        }
        Some(Box::new(Self {
            tool: spec.name.to_string(),
            arguments_sha256: arguments_sha256(arguments),
            changes: !spec.side_effects.is_empty() || spec.risk_level > RiskLevel::Low,
            rule_id: rule.map(|(rule, _)| rule.id.clone()),
            policy_revision: rule.and_then(|(_, policy)| policy.revision().map(str::to_owned)),
            grant_id: None,
            edited: false,
            decided_by: None,
        }))
    }

    /// The call runs with `arguments`, which a reviewer edited before approving: its entries
    /// carry their hash, and `edited`.
    pub fn edited(&mut self, arguments: &Value) {
        self.arguments_sha256 = arguments_sha256(arguments);
        self.edited = true;
    }

    /// The pre-reviewer decided the call (`by`), under the policy file of `revision`.
    pub fn reviewed(&mut self, by: &str, revision: Option<&str>) {
        self.decided_by = Some(by.to_owned());
        if self.policy_revision.is_none() {
            self.policy_revision = revision.map(str::to_owned);
        }
    }

    /// The call runs under `grant` (its entries name it).
    pub fn granted(&mut self, grant: Option<&str>) {
        self.grant_id = grant.map(str::to_owned);
    }

    fn entry(&self, ctx: &InvocationContext, status: &str, approval: Option<String>) -> AuditEntry {
        let mut entry = AuditEntry::call(ctx, &self.tool, status);
        entry.arguments_sha256 = Some(self.arguments_sha256.clone());
        entry.approval_id = approval;
        entry.rule_id = self.rule_id.clone();
        entry.policy_revision = self.policy_revision.clone();
        entry.grant_id = self.grant_id.clone();
        entry.edited = self.edited.then_some(true);
        entry.decided_by = self.decided_by.clone();
        entry
    }

    /// The `started` entry of a call that may change something. A call whose entry cannot be
    /// written does not run: `unavailable`.
    pub async fn started(
        &mut self,
        trail: &AuditTrail,
        ctx: &InvocationContext,
        approval: Option<String>,
    ) -> Result<(), ToolError> {
        if !self.changes {
            return Ok(());
        }
        match trail.append(self.entry(ctx, "started", approval)).await {
            Ok(_) => Ok(()),
            Err(e) => Err(ToolError::new(
                ErrorCode::Unavailable,
                format!("the call was not run: its audit entry could not be written ({e}); retry"),
            )),
        }
    }

    /// The `finished` entry. A failure is logged and counted by the trail; the call's
    /// `started` entry (if any) then shows it as a gap.
    pub async fn finished(
        &self,
        trail: &AuditTrail,
        ctx: &InvocationContext,
        approval: Option<String>,
        error: Option<ErrorCode>,
        duration_ms: u64,
    ) {
        let mut entry = self.entry(ctx, "finished", approval);
        entry.ok = Some(error.is_none());
        entry.error = error.map(|c| c.as_str().to_owned());
        entry.duration_ms = Some(duration_ms);
        let _ = trail.append(entry).await;
    }
}

/// Answers one message on `toolmesh.v1.audit.<account>.query`.
pub async fn handle_query(core: Arc<GatewayCore>, msg: Message) {
    let body = match query(&core, &msg).await {
        Ok(fields) => wire::ok_body(fields),
        Err(error) => wire::error_body(error),
    };
    respond(&core.client, msg.reply.as_ref(), body).await;
}

async fn query(core: &GatewayCore, msg: &Message) -> Result<Map<String, Value>, ToolError> {
    let account = public::audit_query_account(&msg.subject)
        .map_err(|raw| format!("{raw:?} is not one account token"))
        .and_then(|raw| Account::parse(raw).map_err(|e| e.to_string()))
        .map_err(|reason| {
            ToolError::invalid_request(format!(
                "the subject's account is malformed: {reason}; use toolmesh.v1.audit.<account>.query"
            ))
        })?;
    let (since, limit) = parse_query(&msg.payload)?;
    let max_bytes = toolmesh_kernel::budget::listing_limit(core.client.max_payload());
    let page = core
        .audit
        .read(&account, since, limit, max_bytes)
        .await
        .map_err(|e| ToolError::new(ErrorCode::Unavailable, e.to_string()))?;
    let entries: Vec<Value> = page
        .entries
        .into_iter()
        .map(|stored| {
            let mut object = Map::new();
            object.insert("seq".into(), Value::from(stored.seq));
            match stored.entry {
                Value::Object(members) => object.extend(members),
                other => {
                    object.insert("raw".into(), other);
                }
            }
            Value::Object(object)
        })
        .collect();
    let mut fields = Map::new();
    fields.insert("entries".into(), Value::Array(entries));
    fields.insert("more".into(), Value::Bool(page.more));
    Ok(fields)
}

/// `{"since"?: <stream seq>, "limit"?: 1..=1000}`; an empty body is `{}`.
fn parse_query(body: &[u8]) -> Result<(u64, usize), ToolError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((0, DEFAULT_QUERY_LIMIT));
    }
    let map = match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => map,
        Ok(other) => {
            return Err(ToolError::invalid_request(format!(
                "the query must be a JSON object, got {}",
                wire::json_kind(&other)
            )))
        }
        Err(e) => {
            return Err(ToolError::invalid_request(format!(
                "the query is not valid JSON ({e})"
            )))
        }
    };
    let since = match map.get("since") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().ok_or_else(|| {
            ToolError::invalid_request("since must be a stream sequence (a whole number ≥ 0): entries after it are answered")
        })?,
    };
    let limit = match map.get("limit") {
        None | Some(Value::Null) => DEFAULT_QUERY_LIMIT,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_QUERY_LIMIT as u64).contains(&n) => n as usize,
            _ => {
                return Err(ToolError::invalid_request(format!(
                    "limit must be a whole number from 1 to {MAX_QUERY_LIMIT}"
                )))
            }
        },
    };
    Ok((since, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, expect: Result<(u64, usize), &str>) {
        match (parse_query(body.as_bytes()), expect) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{body}"),
            (Err(e), Err(fragment)) => {
                assert_eq!(e.code, ErrorCode::InvalidRequest);
                assert!(e.message.contains(fragment), "{body}: {}", e.message);
            }
            (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn query_bodies() {
        check("", Ok((0, DEFAULT_QUERY_LIMIT)));
        check("{}", Ok((0, DEFAULT_QUERY_LIMIT)));
        check(r#"{"since": 7, "limit": 3}"#, Ok((7, 3)));
        check(r#"{"since": null, "limit": 1000}"#, Ok((0, 1000)));
        check(r#"{"limit": 0}"#, Err("limit"));
        check(r#"{"limit": 1001}"#, Err("limit"));
        check(r#"{"since": -1}"#, Err("since"));
        check(r#"{"since": "yesterday"}"#, Err("since"));
        check("[]", Err("an array"));
        check("nope", Err("not valid JSON"));
    }
}
