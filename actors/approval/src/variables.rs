//! The variables only the approval actor reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]).

use toolmesh_kernel::settings::{Component, Variable};

/// The approval actor's variables.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TOOLMESH_APPROVAL_IN_BAND",
        component: Component::Approval,
        default: "`1`",
        description: "`1`: a caller may decide its own call in band (`\"approval\": \
                      {\"approved\": true}`); `0`: only an out-of-band decision counts.",
    },
    Variable {
        name: "TOOLMESH_APPROVAL_TTL_S",
        component: Component::Approval,
        default: "`3600`",
        description: "Seconds an approval lives (at least 1).",
    },
    Variable {
        name: "TOOLMESH_APPROVAL_MAX_PENDING",
        component: Component::Approval,
        default: "`1000`",
        description: "Pending approvals one account may have at once (at least 1); past it a \
                      gated call is `limit_exceeded`.",
    },
    Variable {
        name: "TOOLMESH_APPROVAL_RETENTION_S",
        component: Component::Approval,
        default: "`604800` (7 days)",
        description: "How long decided, used and expired approvals stay readable through `get`.",
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::*;
    use toolmesh_kernel::config::RawEnv;

    /// Each default written as a literal is the `const` the code uses.
    #[test]
    fn defaults_are_the_documented_consts() {
        toolmesh_kernel::settings::assert_defaults(
            VARIABLES,
            &[
                ("TOOLMESH_APPROVAL_TTL_S", &DEFAULT_APPROVAL_TTL_S),
                (
                    "TOOLMESH_APPROVAL_MAX_PENDING",
                    &DEFAULT_APPROVAL_MAX_PENDING,
                ),
                (
                    "TOOLMESH_APPROVAL_RETENTION_S",
                    &DEFAULT_APPROVAL_RETENTION_S,
                ),
            ],
        );
    }

    /// Setting a variable to its default's literal changes nothing.
    #[test]
    fn a_default_set_explicitly_changes_nothing() {
        let read = |env: &RawEnv| format!("{:?}", ApprovalConfig::from_env(env).unwrap());
        let literals =
            toolmesh_kernel::config::assert_literal_defaults_change_nothing(VARIABLES, read);
        assert_eq!(
            literals,
            VARIABLES.len(),
            "{literals} defaults are literals"
        );
    }
}
