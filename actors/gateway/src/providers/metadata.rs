//! One endpoint's `toolmesh.tool` metadata checked and turned into a [`RegisteredTool`], or
//! refused with the reason `component_status` shows.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::tools::{ProviderRoute, RegisteredTool, Runs, ToolGroup, ToolSpec};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};

/// The metadata key that makes an endpoint a tool.
pub const TOOL_KEY: &str = "toolmesh.tool";

/// Profile names, which a group may not take (`include` resolves groups first).
const PROFILE_NAMES: [&str; 4] = ["focused", "core", "default", "coding"];

/// `metadata["toolmesh.tool"]`, PROTOCOL.md "Tool providers".
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolMetadata {
    description: String,
    input_schema: Value,
    risk_level: String,
    #[serde(default)]
    side_effects: Vec<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    needs_session: bool,
}

/// `[A-Za-z0-9_-]{1,max}`.
pub fn is_token(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks one endpoint of `service` and builds its tool.
pub fn tool_of(
    service: &str,
    name: &str,
    subject: &str,
    metadata: &str,
) -> Result<RegisteredTool, String> {
    if !is_token(name, 64) {
        return Err(format!(
            "the endpoint name {:?} is not a tool name ([A-Za-z0-9_-]{{1,64}})",
            shown(name)
        ));
    }
    check_subject(service, name, subject)?;
    let meta: ToolMetadata = serde_json::from_str(metadata)
        .map_err(|e| format!("{TOOL_KEY} is not the documented JSON object: {e}"))?;
    let risk_level: RiskLevel = serde_json::from_value(Value::from(meta.risk_level.as_str()))
        .map_err(|_| {
            format!(
                "risk_level {:?} is not one of low, medium, high, critical",
                shown(&meta.risk_level)
            )
        })?;
    let mut side_effects = Vec::new();
    for word in &meta.side_effects {
        let effect: SideEffect = serde_json::from_value(Value::from(word.as_str())).map_err(|_| {
            format!(
                "side effect {:?} is not one of workspace_write, workspace_delete, isolated_runtime_execution, process_control, network_egress",
                shown(word)
            )
        })?;
        side_effects.push(effect);
    }
    let group = match meta.group.as_deref() {
        None => ToolGroup::External,
        Some(group) => {
            if !is_token(group, 64) {
                return Err(format!(
                    "group {:?} is not [A-Za-z0-9_-]{{1,64}}",
                    shown(group)
                ));
            }
            let parsed = ToolGroup::parse(group);
            if parsed.is_builtin() || PROFILE_NAMES.contains(&group) {
                return Err(format!(
                    "group {group:?} belongs to the built-in tools or the profiles; name another (default external)"
                ));
            }
            parsed
        }
    };
    let spec = ToolSpec {
        name: Cow::Owned(name.to_owned()),
        group,
        description: Cow::Owned(meta.description),
        risk_level,
        side_effects: Cow::Owned(side_effects),
        boundary: Cow::Owned(format!(
            "runs in the provider {service}, outside the toolmesh nodes; the gateway checked its arguments against this schema before it was sent"
        )),
        runs: Runs::Provider(ProviderRoute {
            service: Arc::from(service),
            subject: Arc::from(subject),
        }),
        needs_session: meta.needs_session,
        profiles: &[],
        review: toolmesh_kernel::tools::Review::Arguments,
    };
    RegisteredTool::from_schema(spec, meta.input_schema)
        .map_err(|e| format!("input_schema is not a usable JSON Schema: {e}"))
}

/// Calls are published on the subject: it must be one literal subject, and none of toolmesh's
/// own or the server's (a provider naming `toolmesh.v1.call.<account>` would make the
/// gateway send calls into another account). One exception: the bridge's service
/// `mcp-<server>` serves each tool on `toolmesh.internal.v1.mcp.<server>.<tool>`
/// (`kernel::subjects::internal::mcp_tool`), where callers cannot publish; that exact subject,
/// for that service and tool name, is accepted.
fn check_subject(service: &str, name: &str, subject: &str) -> Result<(), String> {
    let literal = !subject.is_empty()
        && subject
            .split('.')
            .all(|t| !t.is_empty() && t != "*" && t != ">")
        && !subject.contains(char::is_whitespace);
    if !literal {
        return Err(format!(
            "the endpoint subject {:?} is not one literal subject",
            shown(subject)
        ));
    }
    let bridged = service
        .strip_prefix("mcp-")
        .is_some_and(|server| subject == internal::mcp_tool(server, name));
    if bridged {
        return Ok(());
    }
    for reserved in ["toolmesh.", "_INBOX.", "$"] {
        if subject.starts_with(reserved) || subject == reserved.trim_end_matches('.') {
            return Err(format!(
                "the endpoint subject {:?} is under {reserved}, which toolmesh or the NATS server owns",
                shown(subject)
            ));
        }
    }
    Ok(())
}

/// At most 80 characters of a provider's text in a reason.
fn shown(text: &str) -> String {
    toolmesh_kernel::text::display_safe(&toolmesh_kernel::text::shorten_middle(text, 80))
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(value: Value) -> String {
        value.to_string()
    }

    fn good() -> Value {
        json!({
            "description": "Create a ticket.",
            "input_schema": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
            "risk_level": "medium",
            "side_effects": ["network_egress"],
        })
    }

    fn check(name: &str, subject: &str, metadata: &str, expect_err: Option<&str>) {
        let got = tool_of("tickets", name, subject, metadata);
        match (got, expect_err) {
            (Ok(tool), None) => {
                assert_eq!(tool.spec.name, name);
                assert_eq!(tool.spec.execution(), "provider:tickets");
            }
            (Err(reason), Some(part)) => assert!(reason.contains(part), "{reason}"),
            (Ok(_), Some(part)) => panic!("{name} {subject} {metadata}: accepted, expected {part}"),
            (Err(reason), None) => panic!("{name} {subject} {metadata}: refused: {reason}"),
        }
    }

    #[test]
    fn the_bridge_s_own_subject_is_accepted_for_its_service_and_tool_only() {
        let m = meta(good());
        let subject = "toolmesh.internal.v1.mcp.git.git_status";
        assert!(tool_of("mcp-git", "git_status", subject, &m).is_ok());
        for (service, name) in [
            ("mcp-git", "git_add"),
            ("mcp-time", "git_status"),
            ("git", "git_status"),
        ] {
            let refused = tool_of(service, name, subject, &m).unwrap_err();
            assert!(
                refused.contains("under toolmesh."),
                "{service} {name}: {refused}"
            );
        }
        let other = "toolmesh.internal.v1.approval.release";
        assert!(tool_of("mcp-git", "git_status", other, &m).is_err());
    }

    #[test]
    fn good_metadata_makes_a_tool_and_bad_metadata_says_why() {
        let with = |key: &str, value: Value| {
            let mut m = good();
            m[key] = value;
            meta(m)
        };
        check("ticket_create", "tickets.create", &meta(good()), None);
        check(
            "ticket create",
            "tickets.create",
            &meta(good()),
            Some("not a tool name"),
        );
        check(
            &"x".repeat(65),
            "t.c",
            &meta(good()),
            Some("not a tool name"),
        );
        check("t", "tickets.*", &meta(good()), Some("literal"));
        check(
            "t",
            "toolmesh.v1.call.acme",
            &meta(good()),
            Some("under toolmesh."),
        );
        check("t", "$SRV.PING", &meta(good()), Some("under $"));
        check("t", "t.c", "not json", Some("not the documented JSON"));
        check(
            "t",
            "t.c",
            &with("risk_level", json!("huge")),
            Some("risk_level \"huge\""),
        );
        check(
            "t",
            "t.c",
            &with("side_effects", json!(["fly"])),
            Some("side effect \"fly\""),
        );
        check(
            "t",
            "t.c",
            &with("group", json!("workspace")),
            Some("built-in"),
        );
        check(
            "t",
            "t.c",
            &with("group", json!("default")),
            Some("profiles"),
        );
        check(
            "t",
            "t.c",
            &with("input_schema", json!("string")),
            Some("JSON object"),
        );
        check(
            "t",
            "t.c",
            &with("input_schema", json!({"type": "nope"})),
            Some("not a usable JSON Schema"),
        );
        check("t", "t.c", &with("extra", json!(1)), Some("unknown field"));
        let mcp = tool_of(
            "bridge",
            "git_status",
            "b.git",
            &with("group", json!("mcp")),
        )
        .unwrap();
        assert_eq!(mcp.spec.group, ToolGroup::Mcp);
        let plain = tool_of("tickets", "t", "t.c", &meta(good())).unwrap();
        assert_eq!(plain.spec.group, ToolGroup::External);
    }
}
