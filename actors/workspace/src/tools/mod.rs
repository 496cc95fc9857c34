//! The workspace tools: one file each (its definition, argument type and handler), listed in
//! [`TOOLS`]; what they share is `crate::service`. Results are PROTOCOL.md's shapes. File work
//! runs on the blocking pool; read state and locks are in Redis (`crate::readstate`).

mod delete_file;
mod edit_file;
mod lint_file;
mod list_files;
mod multi_edit_file;
mod read_file;
mod search_files;
mod status;
mod write_file;
mod write_files;

use toolmesh_kernel::tools::{Entry, Table};

use crate::service::WorkspaceService;

/// The workspace actor's tools, in the order of PROTOCOL.md's tool table.
pub const TOOLS: Table<WorkspaceService> = &[
    Entry::of::<status::Status>(),
    Entry::of::<list_files::ListFiles>(),
    Entry::of::<read_file::ReadFile>(),
    Entry::of::<search_files::SearchFiles>(),
    Entry::of::<lint_file::LintFile>(),
    Entry::of::<write_file::WriteFile>(),
    Entry::of::<write_files::WriteFiles>(),
    Entry::of::<edit_file::EditFile>(),
    Entry::of::<multi_edit_file::MultiEditFile>(),
    Entry::of::<delete_file::DeleteFile>(),
];
