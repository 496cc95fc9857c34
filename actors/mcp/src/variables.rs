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
        name: "TOOLMESH_MCP_PUBLIC_URL",
        component: Component::Mcp,
        default: "unset (`http://` and the address the front listens on)",
        description: "The URL clients reach the front's root at (`https://mcp.example.com`): \
                      the OAuth resource is it with `/mcp`, the metadata document it with \
                      `/.well-known/oauth-protected-resource`. Set it behind a proxy.",
    },
    Variable {
        name: "TOOLMESH_MCP_OAUTH_ISSUER",
        component: Component::Mcp,
        default: "unset (no OAuth: tokens of `TOOLMESH_MCP_TOKENS` only)",
        description: "The OAuth issuer whose JWT access tokens the HTTP front takes (their \
                      `iss`, exactly); needs `TOOLMESH_MCP_OAUTH_JWKS_URL`.",
    },
    Variable {
        name: "TOOLMESH_MCP_OAUTH_JWKS_URL",
        component: Component::Mcp,
        default: "unset",
        description: "The issuer's JWK Set (https, or http to a loopback host): RS256 keys of \
                      2048 bits or more and ES256 (P-256) keys, each with a `kid`.",
    },
    Variable {
        name: "TOOLMESH_MCP_OAUTH_AUDIENCE",
        component: Component::Mcp,
        default: "unset (the front's URL and `/mcp`)",
        description: "The audience an access token's `aud` must hold.",
    },
    Variable {
        name: "TOOLMESH_MCP_OAUTH_ACCOUNT_CLAIM",
        component: Component::Mcp,
        default: "`toolmesh_account`",
        description: "The access token claim naming the account (`[A-Za-z0-9_-]{1,64}`).",
    },
    Variable {
        name: "TOOLMESH_MCP_OAUTH_JWKS_REFRESH_S",
        component: Component::Mcp,
        default: "`30`",
        description: "The least time between two fetches of the key set (1–3600 s): a token \
                      naming an unknown `kid` fetches it at most this often.",
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

    use crate::oauth;

    #[test]
    fn defaults_are_the_documented_consts() {
        let var = |name| find(VARIABLES, name).unwrap();
        assert!(var("TOOLMESH_MCP_LISTEN").default_is(crate::DEFAULT_LISTEN));
        assert!(var("TOOLMESH_MCP_APPROVAL_WAIT_S").default_is(crate::DEFAULT_APPROVAL_WAIT_S));
        assert!(var("TOOLMESH_MCP_OAUTH_ACCOUNT_CLAIM").default_is(oauth::DEFAULT_ACCOUNT_CLAIM));
        assert!(var("TOOLMESH_MCP_OAUTH_JWKS_REFRESH_S").default_is(oauth::DEFAULT_JWKS_REFRESH_S));
        let config = crate::McpConfig::from_env(&RawEnv::default()).unwrap();
        assert_eq!(config.allowed_origins, crate::AllowedOrigins::default());
        assert_eq!(config.oauth, None);
        // With OAuth on, the literal defaults are what an unset variable means.
        let on = RawEnv::from_pairs([
            (oauth::ISSUER_VAR, "https://kc.example/realms/r"),
            (
                oauth::JWKS_URL_VAR,
                "https://kc.example/realms/r/protocol/openid-connect/certs",
            ),
        ]);
        let unset = oauth::OAuthConfig::from_env(&on).unwrap().unwrap();
        for name in [
            "TOOLMESH_MCP_OAUTH_ACCOUNT_CLAIM",
            "TOOLMESH_MCP_OAUTH_JWKS_REFRESH_S",
        ] {
            let literal = var(name).literal_default().unwrap();
            let set = oauth::OAuthConfig::from_env(&on.clone().with(name, literal));
            assert_eq!(set.unwrap().unwrap(), unset, "{name}");
        }
    }
}
