//! The web actor's configuration ([`WebConfig`]): the networks `web_fetch` may reach beyond the
//! public ones, how much of a body it reads, and the search provider of `web_search`. Read from
//! `TOOLMESH_WEB_*` once at start.

use toolmesh_kernel::config::{ConfigError, RawEnv, Secret};

pub const DEFAULT_WEB_MAX_BYTES: u64 = 10 * 1024 * 1024;

/// Web settings.
#[derive(Debug, Clone)]
pub struct WebConfig {
    pub search_provider: Option<String>,
    pub allowed_networks: Vec<String>,
    pub max_bytes: u64,
    /// `TOOLMESH_WEB_SEARCH_URL`: the endpoint of the `http` search provider.
    pub search_url: Option<String>,
    /// `TOOLMESH_WEB_SEARCH_API_KEY`: sent as `Authorization: Bearer …` to that endpoint.
    pub search_api_key: Option<Secret>,
}

impl WebConfig {
    pub fn from_env(env: &RawEnv) -> Result<WebConfig, ConfigError> {
        Ok(WebConfig {
            search_provider: env.get("TOOLMESH_WEB_SEARCH_PROVIDER").map(str::to_owned),
            allowed_networks: env.list("TOOLMESH_WEB_ALLOWED_NETWORKS"),
            max_bytes: env.parse("TOOLMESH_WEB_MAX_BYTES", DEFAULT_WEB_MAX_BYTES)?,
            search_url: env.get("TOOLMESH_WEB_SEARCH_URL").map(str::to_owned),
            search_api_key: env.secret("TOOLMESH_WEB_SEARCH_API_KEY"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_comma_separated_and_bad_sizes_name_the_variable() {
        let env = RawEnv::from_pairs([("TOOLMESH_WEB_ALLOWED_NETWORKS", " 10.0.0.0/8, ,::1/128")]);
        let config = WebConfig::from_env(&env).unwrap();
        assert_eq!(config.allowed_networks, ["10.0.0.0/8", "::1/128"]);
        assert_eq!(config.max_bytes, DEFAULT_WEB_MAX_BYTES);
        let env = RawEnv::from_pairs([("TOOLMESH_WEB_MAX_BYTES", "lots")]);
        let err = WebConfig::from_env(&env).unwrap_err();
        assert!(err.to_string().contains("TOOLMESH_WEB_MAX_BYTES"), "{err}");
    }

    /// A config printed in a log or a panic message must not carry the search API key.
    #[test]
    fn debug_output_never_shows_the_api_key() {
        let env = RawEnv::from_pairs([("TOOLMESH_WEB_SEARCH_API_KEY", "sk-very-secret-4711")]);
        let config = WebConfig::from_env(&env).unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("sk-very-secret-4711"), "{shown}");
        let key = config.search_api_key.as_ref().map(Secret::expose);
        assert_eq!(key, Some("sk-very-secret-4711"));
    }
}
