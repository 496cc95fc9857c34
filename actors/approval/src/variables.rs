//! The variables only the approval actor reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]). Its notifier also reads `TOOLMESH_POLICY_FILE` (listed by
//! the gateway) and `TOOLMESH_WEB_ALLOWED_NETWORKS` (listed by the web actor).

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
    Variable {
        name: "TOOLMESH_CONSOLE_URL",
        component: Component::Approval,
        default: "unset (no link)",
        description: "The approvals console's address as people open it \
                      (`https://approvals.example/`), linked from Slack notifications \
                      (`[[notify]] format = \"slack\"`).",
    },
];
