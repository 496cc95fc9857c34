//! The variables only the gateway reads (its risk policy), for the configuration reference
//! ([`toolmesh_kernel::settings`]). Its pre-reviewer (`[review] url`) also reads
//! `TOOLMESH_WEB_ALLOWED_NETWORKS`, the web egress policy, listed once by the web actor.

use toolmesh_kernel::settings::{Component, Variable};

/// The gateway's variables.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TOOLMESH_TOOL_APPROVAL_MODE",
        component: Component::Approval,
        default: "`strict`",
        description: "Which calls need an approval: `off` (none), `standard` (high and critical \
                      risk) or `strict` (medium risk and above).",
    },
    Variable {
        name: "TOOLMESH_POLICY_FILE",
        component: Component::Approval,
        default: "unset",
        description: "A TOML policy: `mode` (overrides `TOOLMESH_TOOL_APPROVAL_MODE`), \
                      `[accounts.<account>] mode`, `[tools.<tool>] risk_level`, \
                      `[providers.<service>] min_risk_level`, `[[rules]]`, \
                      `[reviewers.<group>]`, `[review]` (the pre-reviewer, run by gateways) \
                      and `[[notify]]` (webhooks, posted by approval nodes) (PROTOCOL.md \
                      \"Approval policy\"). `SIGHUP` reads it again; a bad file is refused \
                      and the old one kept.",
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use toolmesh_kernel::config::RawEnv;

    /// Setting a variable to its default's literal changes nothing.
    #[test]
    fn a_default_set_explicitly_changes_nothing() {
        let read = |env: &RawEnv| format!("{:?}", crate::config::tests::config(env).unwrap());
        let literals =
            toolmesh_kernel::config::assert_literal_defaults_change_nothing(VARIABLES, read);
        assert_eq!(literals, 1, "{literals} defaults are literals");
    }
}
