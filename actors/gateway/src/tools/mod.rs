//! The tools the gateway answers itself, one file each (definition, arguments, answer), listed
//! in [`TOOLS`]; `tool_dispatcher`, which the call path runs, besides them. Their bodies share
//! the registry and the cluster view (`builtin.rs`).

mod component_status;
mod tool;
pub mod tool_dispatcher;
pub mod tool_search;

use toolmesh_kernel::tools::{Entry, Listed};

pub use tool::{builtin, AnswerFn, Builtin};

const COMPONENT_STATUS: Entry<AnswerFn> = builtin::<component_status::ComponentStatus>();
const TOOL_SEARCH: Entry<AnswerFn> = builtin::<tool_search::ToolSearch>();

/// The tools the gateway answers.
pub const TOOLS: &[Entry<AnswerFn>] = &[COMPONENT_STATUS, TOOL_SEARCH];

/// Every tool of the gateway, in the order of PROTOCOL.md's tool table: those of [`TOOLS`]
/// and the dispatcher.
pub const LISTED: &[&dyn Listed] = &[&COMPONENT_STATUS, &tool_dispatcher::LISTED, &TOOL_SEARCH];
