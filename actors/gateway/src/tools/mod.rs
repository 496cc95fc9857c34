//! The tools the gateway answers itself, one file each (definition, arguments, answer), listed
//! in [`TOOLS`]; `tool_dispatcher`, which the call path runs, besides them. Their bodies share
//! the registry and the cluster view (`builtin.rs`).

mod component_status;
mod tool;
pub mod tool_dispatcher;
pub mod tool_search;

use toolmesh_kernel::tools::Listed;

pub use tool::{Answering, Builtin};

/// The tools the gateway answers.
pub const TOOLS: &[&dyn Answering] =
    &[&component_status::ComponentStatus, &tool_search::ToolSearch];

/// Every tool of the gateway, in the order of PROTOCOL.md's tool table: those of [`TOOLS`]
/// and the dispatcher.
pub const LISTED: &[&dyn Listed] = &[
    &component_status::ComponentStatus,
    &tool_dispatcher::ToolDispatcher,
    &tool_search::ToolSearch,
];
