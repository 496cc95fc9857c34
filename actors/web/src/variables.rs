//! The variables only the web actor reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]).

use toolmesh_kernel::settings::{Component, Variable};

/// The web actor's variables.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TOOLMESH_WEB_ALLOWED_NETWORKS",
        component: Component::Web,
        default: "unset",
        description: "CIDRs the web egress policy opens although they are not public (an \
                      intranet, tests): for `web_fetch`, the pre-reviewer's URL (gateways) \
                      and webhooks (approval nodes).",
    },
    Variable {
        name: "TOOLMESH_WEB_MAX_BYTES",
        component: Component::Web,
        default: "`10485760` (10 MiB)",
        description: "Decoded body bytes `web_fetch` reads at most.",
    },
    Variable {
        name: "TOOLMESH_WEB_SEARCH_PROVIDER",
        component: Component::Web,
        default: "unset (`web_search` answers `provider_not_configured`)",
        description: "`http` (the endpoint of `TOOLMESH_WEB_SEARCH_URL`) or `fake` (canned \
                      results, for tests).",
    },
    Variable {
        name: "TOOLMESH_WEB_SEARCH_URL",
        component: Component::Web,
        default: "unset",
        description: "The `http` provider's endpoint: `GET <url>?q=&count=[&recency_days=]`, \
                      answering `{\"results\": [{\"title\", \"url\", \"snippet\", \"date\"?}]}`.",
    },
    Variable {
        name: "TOOLMESH_WEB_SEARCH_API_KEY",
        component: Component::Web,
        default: "unset",
        description: "Sent to that endpoint as `Authorization: Bearer <key>`.",
    },
];
