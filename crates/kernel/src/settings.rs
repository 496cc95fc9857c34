//! The configuration reference as data: each environment variable a node or the command line
//! reads is a [`Variable`] in a `const` table (rust-analyzer's sourcegen shape).
//!
//! Each owner declares what it reads in a `variables.rs` of its own: the kernel
//! ([`crate::config::VARIABLES`]) for what its config modules read, an actor crate for what only
//! that actor reads, the binary for the command line, logs and traces. The binary gathers the
//! tables and renders `docs/configuration.md` from them; its tests hold that file to the tables
//! and the tables to the `"TOOLMESH_…"` names the sources read.

use std::fmt;

/// One environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    pub name: &'static str,
    /// The section of the reference it belongs to.
    pub component: Component,
    /// The value when it is unset, as Markdown: `` `1024` `` (a literal, first), or words
    /// (`unset (no listener)`). Tests hold a literal to the documented `const` behind it
    /// ([`Variable::default_is`]).
    pub default: &'static str,
    /// What it sets: one or two sentences of Markdown.
    pub description: &'static str,
}

impl Variable {
    /// The default's literal: the code span it begins with, if it begins with one.
    pub fn literal_default(&self) -> Option<&'static str> {
        let rest = self.default.strip_prefix('`')?;
        rest.split_once('`').map(|(literal, _)| literal)
    }

    /// Whether the default's literal is `value`.
    pub fn default_is(&self, value: impl fmt::Display) -> bool {
        self.literal_default() == Some(value.to_string().as_str())
    }
}

/// The entry of `name` in `table`.
pub fn find(table: &'static [Variable], name: &str) -> Option<&'static Variable> {
    table.iter().find(|v| v.name == name)
}

/// For the tests of a table: each name is listed, with its value (the `const` the code uses)
/// as its literal default.
pub fn assert_defaults(table: &'static [Variable], defaults: &[(&str, &dyn fmt::Display)]) {
    for (name, value) in defaults {
        let var = find(table, name).unwrap_or_else(|| panic!("{name} is not listed"));
        assert!(
            var.default_is(value),
            "{name}: {} is not `{value}`",
            var.default
        );
    }
}

/// The sections of the reference, in the order it lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    Node,
    Http,
    Approval,
    Events,
    Sandbox,
    Skills,
    Web,
    Bridge,
    Mcp,
    Console,
    Telemetry,
    Cli,
}

impl Component {
    /// Every section, in order.
    pub const ALL: [Component; 12] = [
        Component::Node,
        Component::Http,
        Component::Approval,
        Component::Events,
        Component::Sandbox,
        Component::Skills,
        Component::Web,
        Component::Bridge,
        Component::Mcp,
        Component::Console,
        Component::Telemetry,
        Component::Cli,
    ];

    /// The section's heading.
    pub fn title(self) -> &'static str {
        match self {
            Component::Node => "Every node",
            Component::Http => "HTTP listeners",
            Component::Approval => "Approvals",
            Component::Events => "Events and audit",
            Component::Sandbox => "Sandbox workers",
            Component::Skills => "Skills",
            Component::Web => "Web",
            Component::Bridge => "MCP servers",
            Component::Mcp => "MCP front",
            Component::Console => "Approvals console",
            Component::Telemetry => "Logs, metrics and traces",
            Component::Cli => "Command line",
        }
    }

    /// Who reads the section's variables: a sentence or two of Markdown under the heading.
    pub fn about(self) -> &'static str {
        match self {
            Component::Node => "Read by `toolmesh node`, whatever its roles.",
            Component::Http => {
                "The MCP front (role `mcp`), the approvals console (role `console`) and \
                 `/metrics` each apply these to their own listener."
            }
            Component::Approval => "The approval gate: read by the roles `gateway` and `approval`.",
            Component::Events => {
                "The JetStream streams of RunEvents (`TOOLMESH_EVENTS`) and of the audit trail \
                 (`TOOLMESH_AUDIT`), as a node creates or updates them at start."
            }
            Component::Sandbox => {
                "Read by the role `sandbox`; `component_status` and `sandbox_status` report \
                 some of them."
            }
            Component::Skills => {
                "Read by the role `skills`; `execute_skills` runs on the role `sandbox`."
            }
            Component::Web => "Read by the role `web` (`web_fetch`, `web_search`).",
            Component::Bridge => {
                "Read by the role `bridge`, which serves the tools of MCP servers as tool \
                 providers."
            }
            Component::Mcp => {
                "Read by the role `mcp` (streamable HTTP at `/mcp`) and, where said, by \
                 `toolmesh mcp` (stdio)."
            }
            Component::Console => "Read by the role `console`.",
            Component::Telemetry => {
                "Read by every node; the command line reads the log settings too. The \
                 OpenTelemetry exporter and SDK read the other standard variables themselves \
                 (`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`, \
                 `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`, `OTEL_BSP_*`, \
                 `OTEL_RESOURCE_ATTRIBUTES`)."
            }
            Component::Cli => {
                "Read by the client commands (`toolmesh call`, `status`, `approvals`, \
                 `approve`, `reject`, `events`, `mcp`); `TOOLMESH_NATS_URL` applies to them \
                 too."
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_begins_with_its_literal() {
        let check = |default, value: &str, expect: bool| {
            let v = Variable {
                name: "X",
                component: Component::Node,
                default,
                description: "",
            };
            assert_eq!(v.default_is(value), expect, "{default} vs {value}");
        };
        check("`1024`", "1024", true);
        check("`268435456` (256 MiB)", "268435456", true);
        check("`10240`", "1024", false);
        check("unset", "", false);
        check("2 × cores", "2", false);
        check("half of `X`", "X", false);
    }

    #[test]
    fn every_section_is_listed_once_in_order() {
        assert!(Component::ALL.windows(2).all(|w| w[0] < w[1]));
    }
}
