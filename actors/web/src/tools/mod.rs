//! The web tools of PROTOCOL.md: `web_fetch` and `web_search`, one file each (definition,
//! arguments, handler), listed in [`TOOLS`].
//!
//! `web_fetch` budgets `text` with the seed's field names: `truncated`, `original_chars`,
//! `preview_chars`, and `persisted: {"path", "mime_type"}` when the whole text was written to
//! the session's workspace (`.toolmesh/outputs/<invocation_id>-text.txt`, through the
//! workspace actor's sync subjects). Without a session the text is cut and nothing persisted.
//! `body_truncated` says the body itself passed `TOOLMESH_WEB_MAX_BYTES` and was cut there
//! (then `truncated` is true as well, and nothing beyond the cap exists to persist).

mod web_fetch;
mod web_search;

use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::tools::Table;
use toolmesh_kernel::tools::{BuiltinGroup, ToolDef};
use toolmesh_kernel::wire::SideEffect;
use toolmesh_kernel::Role;

use crate::fetch::Fetcher;
use crate::search::SearchProvider;

/// What a web tool's definition says unless it says otherwise: the web group and role, low risk,
/// network egress, no session, no named profile.
pub(crate) const WEB: ToolDef = ToolDef {
    side_effects: &[SideEffect::NetworkEgress],
    ..ToolDef::of(BuiltinGroup::Web, Role::Web)
};

/// The web actor's tools.
pub const TOOLS: Table<WebService> = &[&web_fetch::WebFetch, &web_search::WebSearch];

/// `max_chars` above this is clamped: a reply must fit a NATS body.
pub const MAX_CHARS_CAP: u64 = 100_000;

/// What both web tools need.
#[derive(Debug)]
pub struct WebService {
    pub client: async_nats::Client,
    pub fetcher: Fetcher,
    pub search: Option<SearchProvider>,
    pub sync: WorkspaceSync,
    /// `TOOLMESH_RESULT_BUDGET_CHARS`: the budget of `text` when the call names none.
    pub budget_chars: usize,
    /// The node's metrics: `web_fetch`'s egress decisions.
    pub metrics: toolmesh_kernel::metrics::Metrics,
}
