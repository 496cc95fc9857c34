//! A call: the parsed `toolmesh.v1.call.<account>` body ([`ToolRequest`]), its checks, and
//! the context ([`InvocationContext`]) every event and internal message carries.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ToolError;
use crate::ids::{Account, InvocationId, SessionId};
use crate::wire::approval::{is_in_band_decider, ApprovalGrant};

/// Longest `wait_for_approval_s` a call may ask for.
pub const MAX_WAIT_FOR_APPROVAL_S: u64 = 3600;
/// Longest `user_id` / `agent_id` copied into events.
pub const MAX_PRINCIPAL_LEN: usize = 256;
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
