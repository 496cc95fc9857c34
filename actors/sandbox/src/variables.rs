//! The variables only the sandbox worker reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]); the kernel's config reads the others of its section.

use toolmesh_kernel::settings::{Component, Variable};

/// The sandbox worker's own variables.
pub const VARIABLES: &[Variable] = &[Variable {
    name: "TOOLMESH_SANDBOX_TEMPLATES",
    component: Component::Sandbox,
    default: "unset (only the template `default`)",
    description: "A TOML file of sandbox templates (image, limits, network, warm sandboxes) a \
                  session may name (docs/PROTOCOL.md \"Sandbox templates\").",
}];
