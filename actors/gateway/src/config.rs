//! The gateway's configuration ([`GatewayConfig`]): its risk policy
//! (`TOOLMESH_TOOL_APPROVAL_MODE`, `TOOLMESH_POLICY_FILE`), the web egress policy its
//! pre-reviewer's POSTs go through (`TOOLMESH_WEB_ALLOWED_NETWORKS`), what `component_status`
//! reports of the settings of the other roles ([`Reported`]), and the node's shared config.
//!
//! `TOOLMESH_WEB_ALLOWED_NETWORKS` is the web actor's variable, listed once in its table
//! (`toolmesh_web::variables`): the gateway reads the same policy, it does not own it.
//!
//! The gateway depends on no actor crate: the node reads the other roles' configs with their
//! own crates and hands the gateway the few values it reports.

use std::path::PathBuf;
use std::sync::Arc;

use toolmesh_kernel::config::{ConfigError, NodeConfig, RawEnv};
use toolmesh_kernel::policy::{ApprovalMode, LivePolicy};

use crate::call::review::ReviewHttp;

/// The web egress policy's allowed networks, which the pre-reviewer's POSTs go through too.
const ALLOWED_NETWORKS: &str = "TOOLMESH_WEB_ALLOWED_NETWORKS";

/// Everything the gateway reads, validated once at start.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Which calls need an approval: `TOOLMESH_TOOL_APPROVAL_MODE`, overridden by
    /// `TOOLMESH_POLICY_FILE` (read again on `SIGHUP`).
    pub policy: LivePolicy,
    /// What `component_status` says of the settings of the other roles.
    pub reported: Reported,
    /// The client a `[review] url` is POSTed with, under the web egress policy
    /// (`TOOLMESH_WEB_ALLOWED_NETWORKS`).
    pub(crate) review_http: ReviewHttp,
    /// What every node reads: the data dir (workspace roots), reply prefixes, the result
    /// budget and the RunEvents stream.
    pub node: Arc<NodeConfig>,
}

/// The settings of other roles `component_status` reports, as this node's environment sets
/// them (a gateway reports them whether or not it runs those roles).
#[derive(Debug, Clone, PartialEq)]
pub struct Reported {
    /// The sandbox backend's wire name (`sandbox/docker`), for when no worker is live.
    pub sandbox_backend: String,
    /// `TOOLMESH_SANDBOX_IMAGE`.
    pub sandbox_image: String,
    /// `TOOLMESH_SKILL_SPACE_IDS`.
    pub skill_space_ids: Vec<String>,
    /// Whether `TOOLMESH_SKILL_SERVICE_URL` is set.
    pub skill_service_configured: bool,
    /// Whether `TOOLMESH_SKILL_RUNNER_COMMAND` is set.
    pub skill_runner_configured: bool,
    /// `TOOLMESH_WEB_SEARCH_PROVIDER`.
    pub web_search_provider: Option<String>,
    /// `TOOLMESH_APPROVAL_IN_BAND`.
    pub approval_in_band: bool,
}

impl GatewayConfig {
    /// Reads the gateway's own variables; `node` is the node's shared config and `reported`
    /// what the other roles' configs say.
    pub fn from_env(
        env: &RawEnv,
        node: Arc<NodeConfig>,
        reported: Reported,
    ) -> Result<GatewayConfig, ConfigError> {
        let mode: ApprovalMode = env.parse("TOOLMESH_TOOL_APPROVAL_MODE", ApprovalMode::Strict)?;
        let policy_file = env.get("TOOLMESH_POLICY_FILE").map(PathBuf::from);
        let policy = LivePolicy::load(mode, policy_file)?;
        let allowed = env.list(ALLOWED_NETWORKS);
        let review_http = ReviewHttp::new(&allowed).map_err(|reason| ConfigError::Invalid {
            key: ALLOWED_NETWORKS,
            value: allowed.join(","),
            reason,
        })?;
        Ok(GatewayConfig {
            policy,
            reported,
            review_http,
            node,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What a node of defaults reports.
    pub(crate) fn reported() -> Reported {
        Reported {
            sandbox_backend: "sandbox/docker".into(),
            sandbox_image: "toolmesh/sandbox:latest".into(),
            skill_space_ids: Vec::new(),
            skill_service_configured: false,
            skill_runner_configured: false,
            web_search_provider: None,
            approval_in_band: true,
        }
    }

    pub(crate) fn config(env: &RawEnv) -> Result<GatewayConfig, ConfigError> {
        let node = Arc::new(NodeConfig::from_env(env)?);
        GatewayConfig::from_env(env, node, reported())
    }

    #[test]
    fn the_mode_is_strict_unless_told_otherwise_and_a_bad_one_names_the_variable() {
        let strict = config(&RawEnv::default()).unwrap();
        assert_eq!(
            strict
                .policy
                .current()
                .mode_for(&toolmesh_kernel::Account::parse("acme").unwrap()),
            ApprovalMode::Strict
        );
        let env = RawEnv::from_pairs([("TOOLMESH_TOOL_APPROVAL_MODE", "lax")]);
        let err = config(&env).unwrap_err();
        assert!(
            err.to_string().contains("TOOLMESH_TOOL_APPROVAL_MODE"),
            "{err}"
        );
    }

    #[test]
    fn the_web_egress_policy_is_read_and_a_bad_network_names_the_variable() {
        let env = RawEnv::from_pairs([("TOOLMESH_WEB_ALLOWED_NETWORKS", "127.0.0.0/8, ::1")]);
        config(&env).unwrap();
        let env = RawEnv::from_pairs([("TOOLMESH_WEB_ALLOWED_NETWORKS", "10.0.0.0/33")]);
        let err = config(&env).unwrap_err();
        assert!(
            err.to_string().contains("TOOLMESH_WEB_ALLOWED_NETWORKS"),
            "{err}"
        );
    }
}
