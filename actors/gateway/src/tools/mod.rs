//! The tools the gateway answers itself, one file each (definition, arguments, answer), listed
//! in [`TOOLS`]. Their bodies share the registry and the cluster view (`builtin.rs`).

mod component_status;
mod tool;
pub mod tool_dispatcher;
pub mod tool_search;

pub use tool::Tool;

/// The gateway's own tools, in the order of PROTOCOL.md's tool table.
pub const TOOLS: &[Tool] = &[
    component_status::TOOL,
    tool_dispatcher::TOOL,
    tool_search::TOOL,
];
