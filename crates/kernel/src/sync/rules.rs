//! What a sync carries and skips: body limits, the workspace's reserved paths, the skip rules
//! and the modes a synced file is given.

use std::time::Duration;

/// Most content bytes one request or reply carries (NATS `max_payload` is 1 MiB by default;
/// the rest is room for the JSON head).
pub const BODY_CONTENT_BUDGET: usize = 512 * 1024;
/// A manifest reply stops listing (and says `truncated`) before its JSON passes this size.
pub const MANIFEST_REPLY_BUDGET: usize = 512 * 1024;
/// A put larger than this is refused (`limit_exceeded`).
pub const MAX_PUT_BYTES: u64 = 1 << 30;
/// How long a client waits for one sync reply.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Directories never synced, at any depth.
pub const SKIPPED_DIRS: [&str; 5] = [
    ".git",
    "__pycache__",
    ".venv",
    "node_modules",
    ".pytest_cache",
];
/// Top-level directory never synced: the workspace's own bookkeeping (outputs, staging).
pub const TOOLMESH_DIR: &str = ".toolmesh";
/// Where multi-part puts are staged, relative to the workspace root.
pub const STAGING_DIR: &str = ".toolmesh/sync";
/// Where over-budget outputs are persisted, relative to the workspace root.
pub const OUTPUTS_DIR: &str = ".toolmesh/outputs";

/// The workspace-relative file under [`OUTPUTS_DIR`] that holds the whole text of `field` of
/// the call `invocation_id` (PROTOCOL.md "Large data").
pub fn output_path(invocation_id: impl std::fmt::Display, field: &str) -> String {
    format!("{OUTPUTS_DIR}/{invocation_id}-{field}.txt")
}

/// The permission bits a put carries: read, write and execute for owner, group and others.
pub const MODE_PERMISSION_BITS: u32 = 0o777;

/// The mode a receiving side gives a synced file whose sender reported `mode` (see the module
/// docs): `(mode & 0o755) | 0o600`, so never setuid, setgid, sticky, or writable by others.
pub fn applied_mode(mode: u32) -> u32 {
    (mode & 0o755) | 0o600
}

/// Whether a directory called `name` is skipped; `top_level` when its parent is the root.
pub fn is_skipped_dir(name: &str, top_level: bool) -> bool {
    SKIPPED_DIRS.contains(&name) || (top_level && name == TOOLMESH_DIR)
}

/// Whether a relative, `/`-separated path lies under a skipped directory.
pub fn is_skipped_path(path: &str) -> bool {
    let mut parts = path.split('/').peekable();
    let mut top = true;
    while let Some(part) = parts.next() {
        if parts.peek().is_some() && is_skipped_dir(part, top) {
            return true;
        }
        top = false;
    }
    false
}
