//! The variables only the MCP front reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]).

use toolmesh_kernel::settings::{Component, Variable};

/// The MCP front's variables.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TOOLMESH_MCP_LISTEN",
        component: Component::Mcp,
        default: "`127.0.0.1:8931`",
        description: "Where the role `mcp` serves streamable HTTP at `/mcp` (`host:port`).",
    },
    Variable {
        name: "TOOLMESH_MCP_TOKENS",
        component: Component::Mcp,
        default: "unset (every request is 401)",
        description: "A JSON file of bearer tokens: `{\"<token>\": {\"account\", \"profile\"?, \
                      \"session\"?, \"sessions\"?: \"any\", \"name\"?}}`.",
    },
    Variable {
        name: "TOOLMESH_MCP_ALLOWED_ORIGINS",
        component: Component::Mcp,
        default: "unset (every `Origin` refused; requests without one served)",
        description: "Browser origins the front serves (comma-separated `http(s)://host[:port]`); \
                      a request with any other `Origin` header is 403.",
    },
    Variable {
        name: "TOOLMESH_MCP_APPROVAL_WAIT_S",
        component: Component::Mcp,
        default: "`120`",
        description: "How long an MCP call waits for an out-of-band approval (0–3600), over \
                      HTTP and in `toolmesh mcp`.",
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use toolmesh_kernel::config::RawEnv;
    use toolmesh_kernel::settings::find;

    #[test]
    fn defaults_are_the_documented_consts() {
        let var = |name| find(VARIABLES, name).unwrap();
        assert!(var("TOOLMESH_MCP_LISTEN").default_is(crate::DEFAULT_LISTEN));
        assert!(var("TOOLMESH_MCP_APPROVAL_WAIT_S").default_is(crate::DEFAULT_APPROVAL_WAIT_S));
        let config = crate::McpConfig::from_env(&RawEnv::default()).unwrap();
        assert_eq!(config.allowed_origins, crate::AllowedOrigins::default());
    }
}
