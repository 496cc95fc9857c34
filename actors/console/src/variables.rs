//! The variables only the approvals console reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]). It also reads `TOOLMESH_POLICY_FILE` (listed by the
//! gateway) for its reviewer groups.

use toolmesh_kernel::settings::{Component, Variable};

/// The console's variables.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TOOLMESH_CONSOLE_LISTEN",
        component: Component::Console,
        default: "`127.0.0.1:8932`",
        description: "Where the role `console` serves the approvals console (`host:port`).",
    },
    Variable {
        name: "TOOLMESH_CONSOLE_TOKENS",
        component: Component::Console,
        default: "unset (the page says how to set it; every API request is 503)",
        description: "A JSON file of console tokens: `{\"<token>\": {\"approver\": \"<name>\", \
                      \"accounts\": [\"<account>\"…] | \"*\"}}`. The approver's name is recorded \
                      as `decided_by`.",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_consts() {
        let var = toolmesh_kernel::settings::find(VARIABLES, "TOOLMESH_CONSOLE_LISTEN").unwrap();
        assert!(var.default_is(crate::DEFAULT_LISTEN));
    }
}
