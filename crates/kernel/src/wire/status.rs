//! Cluster status: a node's NodeStatus (sandbox capacity and templates, a bridge's MCP
//! servers), the ClusterStatus, and heartbeats.

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;
use crate::role::Role;

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
    /// A gateway's `policy_revision`: the sha256 of the policy file it applies (none without
    /// a file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_revision: Option<String>,
}

impl NodeStatus {
    /// The status of a node of `roles` that reports nothing else (no sandbox, bridge or
    /// policy; version `0`, just started): what tests of the cluster view start from.
    pub fn bare(node_id: NodeId, roles: Vec<Role>) -> NodeStatus {
        NodeStatus {
            node_id,
            roles,
            version: "0".into(),
            uptime_s: 0,
            in_flight: 0,
            sandbox: None,
            bridge: None,
            policy_revision: None,
        }
    }
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
