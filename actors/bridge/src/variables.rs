//! The variables only the bridge reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]).

use toolmesh_kernel::settings::{Component, Variable};

/// The bridge's variables.
pub const VARIABLES: &[Variable] = &[Variable {
    name: "TOOLMESH_MCP_SERVERS",
    component: Component::Bridge,
    default: "unset (no servers)",
    description: "A JSON file in the `mcpServers` format MCP clients use: each server's tools \
                  become tools of the mesh, named `<server>_<tool>`.",
}];
