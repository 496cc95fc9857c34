//! The command line: `toolmesh node`, `skill-service`, `call`, `mcp`, `approvals`, `grants`,
//! `status`, `events`.
//!
//! Client commands print JSON replies on stdout (one document, or one line per event) and
//! hints for a person on stderr; the exit code is 0 for `ok: true`, 1 for `ok: false`, 2 when
//! the command itself could not run. Everything printed is display-safe
//! (`toolmesh_kernel::text`): a control or bidirectional character in a name or value is
//! written as its JSON escape (`\u202e`), which reads back as the same JSON.
//!
//! The parts: the arguments (`args`), `main` and the node's start (`run`), the client commands
//! (`commands`), a command's NATS connection (`mesh`), what it prints (`output`), events and
//! watches (`events`), what `call` tells a person about an approval (`waiting`), and
//! `approvals explain` (`explain`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod commands;
mod events;
mod explain;
mod mesh;
mod output;
mod run;
mod waiting;

pub(crate) use args::parse_account;
pub(crate) use mesh::{request, Mesh};
pub(crate) use output::{emit, print_json};
pub use run::main;
