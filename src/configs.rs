//! Every actor's own config, each read from the environment by its crate's constructor, for
//! [`crate::node::run`]. They are read at start whatever the node's roles: a bad value stops any
//! node naming its variable, and the gateway reports the settings of roles it does not run
//! ([`Reported`]), which is how it knows them without depending on their crates.
//!
//! The bridge, the MCP front, the console and the sandbox templates read files and are read only
//! for their roles, in `node::run`.

use std::sync::Arc;

use toolmesh_approval::ApprovalConfig;
use toolmesh_gateway::{GatewayConfig, Reported};
use toolmesh_kernel::config::{ConfigError, NodeConfig, RawEnv};
use toolmesh_sandbox::config::SandboxConfig;
use toolmesh_skills::SkillsConfig;
use toolmesh_web::WebConfig;

/// The configs of the actors every node reads.
#[derive(Debug)]
pub struct ActorConfigs {
    pub gateway: Arc<GatewayConfig>,
    pub approval: ApprovalConfig,
    pub sandbox: SandboxConfig,
    pub skills: SkillsConfig,
    pub web: WebConfig,
}

impl ActorConfigs {
    pub fn from_env(env: &RawEnv, node: &Arc<NodeConfig>) -> Result<ActorConfigs, ConfigError> {
        let approval = ApprovalConfig::from_env(env)?;
        let sandbox = SandboxConfig::from_env(env, &node.data_dir)?;
        let skills = SkillsConfig::from_env(env)?;
        let web = WebConfig::from_env(env)?;
        let reported = Reported {
            sandbox_backend: sandbox.backend.wire_name().to_owned(),
            sandbox_image: sandbox.image.clone(),
            skill_space_ids: skills.space_ids.clone(),
            skill_service_configured: skills.service_url.is_some(),
            skill_runner_configured: sandbox.skill_runner.is_some(),
            web_search_provider: web.search_provider.clone(),
            approval_in_band: approval.in_band,
        };
        let gateway = Arc::new(GatewayConfig::from_env(env, node.clone(), reported)?);
        Ok(ActorConfigs {
            gateway,
            approval,
            sandbox,
            skills,
            web,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<ActorConfigs, ConfigError> {
        let env = RawEnv::from_pairs(pairs.iter().copied());
        let node = Arc::new(NodeConfig::from_env(&env)?);
        ActorConfigs::from_env(&env, &node)
    }

    #[test]
    fn the_gateway_reports_what_the_other_roles_read() {
        let configs = read(&[
            ("TOOLMESH_SANDBOX_BACKEND", "process"),
            ("TOOLMESH_SKILL_RUNNER_COMMAND", "run-skills"),
            ("TOOLMESH_WEB_SEARCH_PROVIDER", "fake"),
            ("TOOLMESH_APPROVAL_IN_BAND", "0"),
        ])
        .unwrap();
        let reported = &configs.gateway.reported;
        assert_eq!(reported.sandbox_backend, "sandbox/process");
        assert_eq!(reported.sandbox_image, configs.sandbox.image);
        assert!(reported.skill_runner_configured);
        assert!(!reported.skill_service_configured);
        assert_eq!(reported.web_search_provider.as_deref(), Some("fake"));
        assert!(!reported.approval_in_band);
    }

    #[test]
    fn a_bad_value_of_any_actor_names_its_variable() {
        for (key, value) in [
            ("TOOLMESH_TOOL_APPROVAL_MODE", "lax"),
            ("TOOLMESH_APPROVAL_TTL_S", "0"),
            ("TOOLMESH_SANDBOX_BACKEND", "vm"),
            ("TOOLMESH_SKILL_SPACE_ALLOWLISTS", "nope"),
            ("TOOLMESH_WEB_MAX_BYTES", "lots"),
        ] {
            let err = read(&[(key, value)]).map(|_| ()).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }
}
