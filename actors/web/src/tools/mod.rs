//! The web tools of PROTOCOL.md: `web_fetch` and `web_search`, one file each (definition,
//! arguments, handler), listed in [`TOOLS`]; what they share is `crate::service`.
//!
//! `web_fetch` budgets `text` with the seed's field names: `truncated`, `original_chars`,
//! `preview_chars`, and `persisted: {"path", "mime_type"}` when the whole text was written to
//! the session's workspace (`.toolmesh/outputs/<invocation_id>-text.txt`, through the
//! workspace actor's sync subjects). Without a session the text is cut and nothing persisted.
//! `body_truncated` says the body itself passed `TOOLMESH_WEB_MAX_BYTES` and was cut there
//! (then `truncated` is true as well, and nothing beyond the cap exists to persist).

mod web_fetch;
mod web_search;

use toolmesh_kernel::tools::{Entry, Table};

use crate::service::WebService;

/// The web actor's tools.
pub const TOOLS: Table<WebService> = &[
    Entry::of::<web_fetch::WebFetch>(),
    Entry::of::<web_search::WebSearch>(),
];
