//! The variables only the web actor reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]).

use toolmesh_kernel::settings::{Component, Variable};

/// The web actor's variables.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TOOLMESH_WEB_ALLOWED_NETWORKS",
        component: Component::Web,
        default: "unset",
        description: "CIDRs `web_fetch` may reach although they are not public (an intranet, \
                      tests).",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::*;
    use toolmesh_kernel::config::RawEnv;
    use toolmesh_kernel::settings::find;

    #[test]
    fn defaults_are_the_documented_consts() {
        let var = find(VARIABLES, "TOOLMESH_WEB_MAX_BYTES").unwrap();
        assert!(var.default_is(DEFAULT_WEB_MAX_BYTES), "{}", var.default);
    }

    /// Setting a variable to its default's literal changes nothing.
    #[test]
    fn a_default_set_explicitly_changes_nothing() {
        let read = |env: &RawEnv| format!("{:?}", WebConfig::from_env(env).unwrap());
        let literals =
            toolmesh_kernel::config::assert_literal_defaults_change_nothing(VARIABLES, read);
        assert_eq!(literals, 1, "{literals} defaults are literals");
    }
}
