//! The variables only the skill loader reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]). `toolmesh skill-service` reads `TOOLMESH_SKILL_SERVICE_TOKEN`
//! too; the sandbox worker's table holds `TOOLMESH_SKILL_RUNNER_COMMAND`.

use toolmesh_kernel::settings::{Component, Variable};

/// The skill loader's variables.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TOOLMESH_SKILLS_DIR",
        component: Component::Skills,
        default: "`./skills`",
        description: "Local skills: folders holding a `SKILL.md`.",
    },
    Variable {
        name: "TOOLMESH_SKILL_SERVICE_URL",
        component: Component::Skills,
        default: "unset (local skills only)",
        description: "The Skill Service remote skills come from (docs/PROTOCOL.md \"Skill \
                      Service\").",
    },
    Variable {
        name: "TOOLMESH_SKILL_SPACE_IDS",
        component: Component::Skills,
        default: "unset",
        description: "The Skill Service's spaces to list, comma-separated, in order.",
    },
    Variable {
        name: "TOOLMESH_SKILL_SERVICE_TOKEN",
        component: Component::Skills,
        default: "unset",
        description: "The Skill Service's bearer token; `toolmesh skill-service` requires it of \
                      its clients when set.",
    },
    Variable {
        name: "TOOLMESH_SKILL_SPACE_ALLOWLISTS",
        component: Component::Skills,
        default: "unset (every active skill)",
        description: "Spaces that expose only some skills: `space=a|b,other=c`. A space named \
                      here lists only the skills named for it.",
    },
    Variable {
        name: "TOOLMESH_SKILL_MAX_BYTES",
        component: Component::Skills,
        default: "`268435456` (256 MiB)",
        description: "Inflated bytes of one skill archive at most.",
    },
    Variable {
        name: "TOOLMESH_SKILL_MAX_ENTRIES",
        component: Component::Skills,
        default: "`10000`",
        description: "Entries of one skill archive at most.",
    },
    Variable {
        name: "TOOLMESH_SKILL_DOWNLOAD_TIMEOUT_S",
        component: Component::Skills,
        default: "`120`",
        description: "How long one Skill Service request or archive download may take.",
    },
    Variable {
        name: "TOOLMESH_SKILL_ALLOW_HASH_MISMATCH",
        component: Component::Skills,
        default: "`0`",
        description: "`1`: load an archive whose hash does not match, with a warning.",
    },
    Variable {
        name: "TOOLMESH_SKILL_ALLOWED_NETWORKS",
        component: Component::Skills,
        default: "unset",
        description: "CIDRs a skill archive URL or redirect may reach although they are not \
                      public; the Skill Service's own origin is always reachable.",
    },
];
