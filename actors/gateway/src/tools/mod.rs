//! The tools the gateway answers itself, one file each (definition, arguments, answer), listed
//! in [`TOOLS`]; `tool_dispatcher`, which the call path runs, besides them. Their bodies share
//! the registry and the cluster view (`builtin.rs`).

mod component_status;
mod tool;
pub mod tool_dispatcher;
pub mod tool_search;

use toolmesh_kernel::tools::Listed;
use toolmesh_kernel::tools::{BuiltinGroup, ToolDef};
use toolmesh_kernel::Role;

pub use tool::{Answering, Builtin};

/// What a gateway tool's definition says unless it says otherwise: the dispatcher group, run by
/// the gateway, low risk, no side effect, no session, no named profile.
pub(crate) const GATEWAY: ToolDef = ToolDef::of(BuiltinGroup::Dispatcher, Role::Gateway);

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
