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

use toolmesh_kernel::tools::Table;

use crate::service::WorkspaceService;

/// The workspace actor's tools, in the order of PROTOCOL.md's tool table.
pub const TOOLS: Table<WorkspaceService> = &[
    &status::Status,
    &list_files::ListFiles,
    &read_file::ReadFile,
    &search_files::SearchFiles,
    &lint_file::LintFile,
    &write_file::WriteFile,
    &write_files::WriteFiles,
    &edit_file::EditFile,
    &multi_edit_file::MultiEditFile,
    &delete_file::DeleteFile,
];
