//! The gateway's configuration ([`GatewayConfig`]): its risk policy
//! (`TOOLMESH_TOOL_APPROVAL_MODE`, `TOOLMESH_POLICY_FILE`), what `component_status` reports of
//! the settings of the other roles ([`Reported`]), and the node's shared config.
//!
//! The gateway depends on no actor crate: the node reads the other roles' configs with their
//! own crates and hands the gateway the few values it reports.

use std::path::PathBuf;
use std::sync::Arc;

use toolmesh_kernel::config::{ConfigError, NodeConfig, RawEnv};
use toolmesh_kernel::policy::{ApprovalMode, LivePolicy};

/// Everything the gateway reads, validated once at start.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Which calls need an approval: `TOOLMESH_TOOL_APPROVAL_MODE`, overridden by
    /// `TOOLMESH_POLICY_FILE` (read again on `SIGHUP`).
    pub policy: LivePolicy,
    /// What `component_status` says of the settings of the other roles.
    pub reported: Reported,
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
        Ok(GatewayConfig {
            policy,
            reported,
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
}
