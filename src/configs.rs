//! Every actor's own config, each read from the environment by its crate's constructor, for
//! [`crate::node::run`]. They are read at start whatever the node's roles, as one node config
//! was before: a bad value stops any node naming its variable, and the gateway reports the
//! settings of roles it does not run.
//!
//! The bridge, the MCP front, the console and the sandbox templates read files and are read only
//! for their roles, in `node::run`.

use std::sync::Arc;

use toolmesh_approval::ApprovalConfig;
use toolmesh_gateway::{GatewayConfig, Reported};
use toolmesh_kernel::config::{ConfigError, NodeConfig, RawEnv};
use toolmesh_sandbox::config::SandboxConfig;
use toolmesh_web::WebConfig;

/// The configs of the actors every node reads.
#[derive(Debug)]
pub struct ActorConfigs {
    pub gateway: Arc<GatewayConfig>,
    pub approval: ApprovalConfig,
    pub sandbox: SandboxConfig,
    pub web: WebConfig,
}

impl ActorConfigs {
    pub fn from_env(env: &RawEnv, node: &Arc<NodeConfig>) -> Result<ActorConfigs, ConfigError> {
        let approval = ApprovalConfig::from_env(env)?;
        let sandbox = SandboxConfig::from_env(env, &node.data_dir)?;
        let web = WebConfig::from_env(env)?;
        let reported = Reported {
            sandbox_backend: sandbox.backend.wire_name().to_owned(),
            sandbox_image: sandbox.image.clone(),
            skill_space_ids: node.skills.space_ids.clone(),
            skill_service_configured: node.skills.service_url.is_some(),
            skill_runner_configured: sandbox.skill_runner.is_some(),
            web_search_provider: web.search_provider.clone(),
            approval_in_band: approval.in_band,
        };
        let gateway = Arc::new(GatewayConfig::from_env(env, node.clone(), reported)?);
        Ok(ActorConfigs {
            gateway,
            approval,
            sandbox,
            web,
        })
    }
}
