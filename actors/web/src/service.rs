//! What the web tools share: the [`WebService`] (the fetcher, the search provider) and the definitions' base (`WEB`). The tools themselves are
//! `tools/`, one file each.

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

/// `max_chars` above this is clamped: a reply must fit a NATS body.
pub const MAX_CHARS_CAP: u64 = 100_000;

/// What both web tools need.
#[derive(Debug)]
pub struct WebService {
    pub client: async_nats::Client,
    pub fetcher: Fetcher,
    pub search: Option<SearchProvider>,
    /// The node's metrics: `web_fetch`'s egress decisions.
    pub metrics: toolmesh_kernel::metrics::Metrics,
}
