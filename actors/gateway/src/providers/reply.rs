//! A provider's answer as a ToolReply (PROTOCOL.md "Tool providers"): an object with a
//! boolean `ok` passes (a failure code outside the closed list, or one of the approval
//! gate's, becomes `provider_error`), any other JSON value `v` becomes `{"ok": true,
//! "result": v}`, and a body that is not JSON or carries the micro service error headers is
//! `provider_error`.

use async_nats::HeaderMap;
use serde_json::{Map, Value};

use toolmesh_kernel::budget;
use toolmesh_kernel::{ErrorCode, ToolError};

/// The micro protocol's error headers.
pub const SERVICE_ERROR: &str = "Nats-Service-Error";
pub const SERVICE_ERROR_CODE: &str = "Nats-Service-Error-Code";

/// Members the gateway writes itself; a provider's are dropped.
const ENVELOPE: [&str; 3] = ["ok", "invocation_id", "dispatched_tool_name"];

/// The result fields of a successful answer, or the error it stands for.
pub fn normalise(
    service: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Map<String, Value>, ToolError> {
    if let Some(headers) = headers {
        let text = headers.get(SERVICE_ERROR).map(|v| v.as_str().to_owned());
        let code = headers
            .get(SERVICE_ERROR_CODE)
            .map(|v| v.as_str().to_owned());
        if text.is_some() || code.is_some() {
            let text = text.unwrap_or_default();
            let code = code.unwrap_or_default();
            return Err(ToolError::new(
                ErrorCode::ProviderError,
                format!("the provider {service} answered a service error {code}: {text}"),
            )
            .with("provider_code", code));
        }
    }
    let value: Value = serde_json::from_slice(payload).map_err(|e| {
        ToolError::new(
            ErrorCode::ProviderError,
            format!("the provider {service} answered something that is not JSON ({e})"),
        )
    })?;
    let mut fields = match value {
        Value::Object(map) if map.get("ok").is_some_and(Value::is_boolean) => map,
        other => {
            let mut fields = Map::new();
            fields.insert("result".into(), other);
            return Ok(fields);
        }
    };
    if fields.get("ok") == Some(&Value::Bool(false)) {
        return Err(failure(service, fields));
    }
    for member in ENVELOPE {
        fields.shift_remove(member);
    }
    Ok(fields)
}

/// `{"ok": false, …}` from a provider: its code when the closed list has it and it is not
/// the approval gate's (those describe the gateway's own gate), else `provider_error` with
/// the provider's code in `provider_code`; its text as `error_message`.
fn failure(service: &str, mut fields: Map<String, Value>) -> ToolError {
    for member in ENVELOPE {
        fields.shift_remove(member);
    }
    let raw_code = fields.shift_remove("error");
    let message = match fields.shift_remove("error_message") {
        Some(Value::String(text)) => text,
        Some(other) => other.to_string(),
        None => format!("the provider {service} answered ok: false without an error_message"),
    };
    let code = raw_code
        .as_ref()
        .and_then(|c| serde_json::from_value::<ErrorCode>(c.clone()).ok())
        .filter(|c| {
            !matches!(
                c,
                ErrorCode::ApprovalRequired
                    | ErrorCode::ApprovalPending
                    | ErrorCode::ApprovalRejected
                    | ErrorCode::ApprovalExpired
                    | ErrorCode::ApprovalMismatch
            )
        });
    let mut error = match code {
        Some(code) => ToolError::new(code, message),
        None => {
            let shown = match &raw_code {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            fields.insert("provider_code".into(), Value::from(shown));
            ToolError::new(ErrorCode::ProviderError, message)
        }
    };
    error.details = fields;
    error
}

/// Top-level text fields over `budget_chars` characters, cut in place with their
/// `_truncated`, `_original_chars` and `_preview_chars` companions; returns each cut field
/// with its whole text, for persisting. A field that is not a tool-name-like token
/// (`[A-Za-z0-9_-]{1,64}`) is cut all the same but not returned (its name goes into a path).
pub fn cut_to_budget(
    fields: &mut Map<String, Value>,
    budget_chars: usize,
) -> Vec<(String, String)> {
    // Each text is counted once, and only those over the budget are copied (their preview).
    let cuts: Vec<(String, budget::Cut)> = fields
        .iter()
        .filter_map(|(field, v)| {
            Some((field.clone(), budget::cut_over(v.as_str()?, budget_chars)?))
        })
        .collect();
    let mut whole = Vec::new();
    for (field, cut) in cuts {
        let text = fields.get_mut(&field).map(Value::take);
        // In place: the preview takes the text's position, its companions come after.
        budget::insert_cut(fields, &field, cut);
        if let (Some(Value::String(text)), true) = (text, super::metadata::is_token(&field, 64)) {
            whole.push((field, text));
        }
    }
    whole
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(payload: &str, expect: Result<Value, (&str, &str)>) {
        let got = normalise("svc", None, payload.as_bytes());
        match (got, expect) {
            (Ok(fields), Ok(want)) => assert_eq!(Value::Object(fields), want, "{payload}"),
            (Err(e), Err((code, part))) => {
                assert_eq!(e.code.as_str(), code, "{payload}");
                assert!(e.message.contains(part), "{}", e.message);
            }
            (got, want) => panic!("{payload}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn answers_become_replies() {
        check(r#"{"ok":true,"n":1}"#, Ok(json!({"n": 1})));
        check(
            r#"{"ok":true,"invocation_id":"spoof","n":1}"#,
            Ok(json!({"n": 1})),
        );
        check("42", Ok(json!({"result": 42})));
        check(r#""hi""#, Ok(json!({"result": "hi"})));
        check(r#"{"n":1}"#, Ok(json!({"result": {"n": 1}})));
        check(r#"{"ok":"yes"}"#, Ok(json!({"result": {"ok": "yes"}})));
        check(
            r#"{"ok":false,"error":"not_found","error_message":"no ticket 7"}"#,
            Err(("not_found", "no ticket 7")),
        );
        check(
            r#"{"ok":false,"error":"db_down","error_message":"the database is down"}"#,
            Err(("provider_error", "the database is down")),
        );
        check(
            r#"{"ok":false,"error":"approval_required","error_message":"x"}"#,
            Err(("provider_error", "x")),
        );
        check("not json", Err(("provider_error", "not JSON")));
    }

    #[test]
    fn foreign_codes_are_kept_beside_provider_error() {
        let e = normalise(
            "svc",
            None,
            br#"{"ok":false,"error":"db_down","error_message":"m","retry":true}"#,
        )
        .unwrap_err();
        assert_eq!(e.details["provider_code"], "db_down");
        assert_eq!(e.details["retry"], true);
    }

    #[test]
    fn service_error_headers_are_provider_error() {
        let mut headers = HeaderMap::new();
        headers.insert(SERVICE_ERROR, "quota exhausted");
        headers.insert(SERVICE_ERROR_CODE, "429");
        let e = normalise("svc", Some(&headers), b"{\"ok\":true}").unwrap_err();
        assert_eq!(e.code, ErrorCode::ProviderError);
        assert!(e.message.contains("quota exhausted"), "{}", e.message);
        assert_eq!(e.details["provider_code"], "429");
    }

    #[test]
    fn text_over_the_budget_is_cut_with_its_companions() {
        let mut fields = Map::new();
        fields.insert("report".into(), Value::from("abcdef"));
        fields.insert("short".into(), Value::from("ab"));
        fields.insert("bad/name".into(), Value::from("abcdef"));
        let whole = cut_to_budget(&mut fields, 3);
        assert_eq!(whole, [("report".to_owned(), "abcdef".to_owned())]);
        assert_eq!(fields["report"], "abc");
        assert_eq!(fields["report_truncated"], true);
        assert_eq!(fields["report_original_chars"], 6);
        assert_eq!(fields["short"], "ab");
        assert!(!fields.contains_key("short_truncated"));
        assert_eq!(fields["bad/name"], "abc");
    }
}
