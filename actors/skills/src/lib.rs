//! toolmesh-skills: the skill loader actor and the Skill Service.
//!
//! The `SkillLoader` actor answers `list_skills`, `search_skills` and `load_skill` on
//! `toolmesh.internal.v1.run.skills`, and hands the files of skills to sandbox workers on
//! [`toolmesh_kernel::skills::BUNDLE_SUBJECT`] (for `execute_skills`, which the sandbox role
//! runs). Local skills come from `TOOLMESH_SKILLS_DIR`, remote ones from the Skill Service
//! ([`catalog`]); remote archives are verified and unpacked by [`archive`] into the cache
//! ([`cache`]). [`mod@service`] is a small Skill Service (`toolmesh skill-service`).
//!
//! Architecture invariant: an untrusted archive becomes files only through
//! [`archive::unpack`], into a fresh staging folder that is renamed into the cache only when the
//! whole archive passed every check.

pub mod archive;
pub mod cache;
pub mod catalog;
pub mod config;
pub mod frontmatter;
pub mod library;
mod loader;
pub mod search;
pub mod service;
pub mod tools;
pub mod variables;

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use toolmesh_kernel::host::{drainable, listen, ActorHandle, InFlight, Lifecycle, Listen};
use toolmesh_kernel::outputs::Keeper;
use toolmesh_kernel::skills::BUNDLE_SUBJECT;
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::{NodeId, Role};

pub use config::SkillsConfig;

/// What the skills actor needs besides NATS.
#[derive(Debug, Clone)]
pub struct SkillsSettings {
    pub node: NodeId,
    /// `TOOLMESH_DATA_DIR`: the cache is `skills-cache/` under it.
    pub data_dir: PathBuf,
    pub config: SkillsConfig,
    /// `TOOLMESH_RESULT_BUDGET_CHARS`.
    pub budget_chars: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum SkillsStartError {
    #[error("skills configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Listen(#[from] toolmesh_kernel::host::ListenError),
}

/// Builds the service the actor runs (also for tests that call it directly).
pub fn service(settings: &SkillsSettings) -> Result<library::SkillsService, SkillsStartError> {
    let client = catalog::ServiceClient::new(&settings.config).map_err(SkillsStartError::Config)?;
    let caps = archive::Caps {
        max_bytes: settings.config.max_bytes,
        max_entries: settings.config.max_entries,
    };
    Ok(library::SkillsService {
        skills_dir: settings.config.dir.clone(),
        loader: cache::Loader::new(
            &settings.data_dir,
            client,
            settings.config.allow_hash_mismatch,
            caps,
        ),
    })
}

/// Starts the skills actor (inside an actix `System`); returns once it is subscribed.
pub async fn spawn(
    client: async_nats::Client,
    settings: SkillsSettings,
    lifecycle: Lifecycle,
    in_flight: InFlight,
) -> Result<ActorHandle, SkillsStartError> {
    let service = Arc::new(service(&settings)?);
    let [calls, bundles] = listen(
        &client,
        [
            Listen::shared(internal::run(Role::Skills), Role::Skills),
            Listen::shared(BUNDLE_SUBJECT, Role::Skills),
        ],
    )
    .await?;
    let drain = lifecycle.drain;
    let requests = futures::stream::select(
        drainable(calls, drain.clone()).map(loader::SkillRequested::Run),
        drainable(bundles, drain).map(loader::SkillRequested::Bundle),
    );
    let loader = loader::SkillLoader {
        server: toolmesh_actix_host::ToolServer::new(
            client.clone(),
            Role::Skills,
            tools::TOOLS,
            Keeper::remote(settings.budget_chars, client.clone()),
        )
        .claiming_as(settings.node),
        client,
        service,
    };
    let handle = toolmesh_actix_host::start(Role::Skills, "skills", loader, requests, in_flight);
    Ok(handle)
}
