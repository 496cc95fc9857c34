//! From an MCP server's tool list to provider endpoints (PROTOCOL.md "Tool providers"): the
//! endpoint name `<server>_<tool>`, the risk from the MCP annotations, and the `toolmesh.tool`
//! metadata the gateway reads.

use std::collections::{BTreeSet, HashMap};

use rmcp::model::Tool;
use serde_json::{json, Value};
use toolmesh_kernel::wire::{RiskLevel, SkippedTool};

/// The longest tool name the contract allows.
pub const MAX_TOOL_NAME: usize = 64;

/// The metadata key of an endpoint that is a tool.
pub const TOOL_METADATA_KEY: &str = "toolmesh.tool";
/// The metadata key holding the MCP tool's own name (the endpoint name is sanitized).
pub const MCP_TOOL_METADATA_KEY: &str = "toolmesh.mcp.tool";

/// One MCP tool served as one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolEndpoint {
    /// `<server>_<tool>`, characters outside `[A-Za-z0-9_-]` as `_`.
    pub name: String,
    /// The tool's name at the MCP server.
    pub mcp_name: String,
    pub risk: RiskLevel,
    /// The `toolmesh.tool` metadata (JSON text) and the MCP name, as the endpoint carries them.
    pub metadata: HashMap<String, String>,
}

/// `<server>_<tool>` with every character outside `[A-Za-z0-9_-]` as `_`.
pub fn endpoint_name(server: &str, tool: &str) -> String {
    format!("{server}_{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The risk PROTOCOL.md derives from the annotations: `readOnlyHint: true` → low; otherwise
/// `destructiveHint: false` → medium; otherwise high (the MCP defaults: a tool may write and
/// may destroy unless it says otherwise).
pub fn risk_of(tool: &Tool) -> RiskLevel {
    let hints = tool.annotations.as_ref();
    if hints.and_then(|a| a.read_only_hint) == Some(true) {
        RiskLevel::Low
    } else if hints.and_then(|a| a.destructive_hint) == Some(false) {
        RiskLevel::Medium
    } else {
        RiskLevel::High
    }
}

/// Side effects in toolmesh's words: `network_egress` for `openWorldHint: true`. What a tool
/// writes at its server has no word of its own; its risk says it.
fn side_effects(tool: &Tool) -> Vec<&'static str> {
    let open_world = tool.annotations.as_ref().and_then(|a| a.open_world_hint);
    if open_world == Some(true) {
        vec!["network_egress"]
    } else {
        Vec::new()
    }
}

/// The endpoints of a tool list, in the server's order, and the tools that cannot be served
/// (a name over 64 characters; a name another tool of the list already takes once sanitized).
pub fn endpoints(server: &str, tools: &[Tool]) -> (Vec<ToolEndpoint>, Vec<SkippedTool>) {
    let mut out = Vec::with_capacity(tools.len());
    let mut skipped = Vec::new();
    let mut taken = BTreeSet::new();
    for tool in tools {
        let name = endpoint_name(server, &tool.name);
        if name.len() > MAX_TOOL_NAME {
            skipped.push(SkippedTool {
                tool: tool.name.to_string(),
                reason: format!(
                    "{name:?} is longer than the {MAX_TOOL_NAME} characters of a tool name"
                ),
            });
            continue;
        }
        if !taken.insert(name.clone()) {
            skipped.push(SkippedTool {
                tool: tool.name.to_string(),
                reason: format!("another tool of this server is already served as {name:?}"),
            });
            continue;
        }
        let risk = risk_of(tool);
        let description = tool
            .description
            .as_deref()
            .or(tool.annotations.as_ref().and_then(|a| a.title.as_deref()))
            .or(tool.title.as_deref())
            .unwrap_or("");
        let spec = json!({
            "description": description,
            "input_schema": Value::Object((*tool.input_schema).clone()),
            "risk_level": risk.as_str(),
            "side_effects": side_effects(tool),
            "group": "mcp",
            "needs_session": false,
        });
        let mut metadata = HashMap::new();
        metadata.insert(TOOL_METADATA_KEY.to_owned(), spec.to_string());
        metadata.insert(MCP_TOOL_METADATA_KEY.to_owned(), tool.name.to_string());
        out.push(ToolEndpoint {
            name,
            mcp_name: tool.name.to_string(),
            risk,
            metadata,
        });
    }
    (out, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, annotations: Value) -> Tool {
        serde_json::from_value(json!({
            "name": name,
            "description": format!("the {name} tool"),
            "inputSchema": {"type": "object", "properties": {"repo_path": {"type": "string"}}},
            "annotations": annotations,
        }))
        .expect("a tool")
    }

    #[test]
    fn names_are_prefixed_and_sanitized() {
        let check = |server: &str, tool: &str, expect: &str| {
            assert_eq!(endpoint_name(server, tool), expect, "{server} {tool}");
        };
        check("git", "git_status", "git_git_status");
        check("time", "get_current_time", "time_get_current_time");
        check("x", "a.b c/d", "x_a_b_c_d");
        check("x", "é-ok", "x__-ok");
    }

    #[test]
    fn risk_follows_the_annotations() {
        let check = |annotations: Value, expect: RiskLevel| {
            assert_eq!(
                risk_of(&tool("t", annotations.clone())),
                expect,
                "{annotations}"
            );
        };
        check(json!({"readOnlyHint": true}), RiskLevel::Low);
        check(
            json!({"readOnlyHint": true, "destructiveHint": true}),
            RiskLevel::Low,
        );
        check(json!({"destructiveHint": false}), RiskLevel::Medium);
        check(
            json!({"readOnlyHint": false, "destructiveHint": false}),
            RiskLevel::Medium,
        );
        check(json!({"readOnlyHint": false}), RiskLevel::High);
        check(json!({}), RiskLevel::High);
        check(json!({"destructiveHint": true}), RiskLevel::High);
    }

    #[test]
    fn endpoints_carry_the_tool_metadata_and_skip_what_cannot_be_served() {
        let long = "x".repeat(70);
        let tools = [
            tool(
                "status",
                json!({"readOnlyHint": true, "openWorldHint": true}),
            ),
            tool("a.b", json!({})),
            tool("a_b", json!({})),
            tool(&long, json!({})),
        ];
        let (endpoints, skipped) = endpoints("git", &tools);
        let names: Vec<&str> = endpoints.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["git_status", "git_a_b"]);
        let spec: Value = serde_json::from_str(&endpoints[0].metadata[TOOL_METADATA_KEY]).unwrap();
        assert_eq!(spec["risk_level"], "low");
        assert_eq!(spec["group"], "mcp");
        assert_eq!(spec["side_effects"], json!(["network_egress"]));
        assert_eq!(
            spec["input_schema"]["properties"]["repo_path"]["type"],
            "string"
        );
        assert_eq!(spec["description"], "the status tool");
        assert_eq!(endpoints[1].metadata[MCP_TOOL_METADATA_KEY], "a.b");
        let skipped: Vec<&str> = skipped.iter().map(|s| s.tool.as_str()).collect();
        assert_eq!(skipped, ["a_b", long.as_str()]);
    }
}
