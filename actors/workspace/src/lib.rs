//! toolmesh-workspace: the workspace actor. It owns the files of each `(account, session)`
//! under `$TOOLMESH_DATA_DIR/accounts/<account>/sessions/<session_id>/workspace/` and serves
//! the workspace tools of PROTOCOL.md over `toolmesh.internal.v1.run.workspace`, and workspace
//! sync for sandbox mirrors ([`sync`], `toolmesh.internal.v1.workspace.{manifest,fetch,apply}`).
//!
//! Architecture invariant: every file access goes through [`confine::Workspace`], which
//! resolves paths beneath the workspace root in the kernel (cap-std, openat2
//! `RESOLVE_BENEATH` on Linux), never by comparing strings.

pub mod confine;
pub mod edit;
pub mod lint;
pub mod listing;
pub mod readstate;
pub mod service;
pub mod sync;
pub mod tools;
pub mod writing;

use std::path::PathBuf;
use std::sync::Arc;

use toolmesh_kernel::outputs::Keeper;

use toolmesh_kernel::host::{drainable, listen, ActorHandle, InFlight, Lifecycle, Listen};
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::Role;

/// What the workspace actor needs besides NATS.
#[derive(Debug, Clone)]
pub struct WorkspaceSettings {
    /// `TOOLMESH_DATA_DIR`: workspaces live under `accounts/<a>/sessions/<s>/workspace`.
    pub data_dir: PathBuf,
    /// `TOOLMESH_REDIS_*`: the shared read state.
    pub redis: toolmesh_kernel::redis_link::RedisConfig,
    /// `TOOLMESH_RESULT_BUDGET_CHARS`.
    pub budget_chars: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceStartError {
    #[error("TOOLMESH_REDIS_URL is not a valid Redis URL: {0}")]
    RedisUrl(#[source] redis::RedisError),
    #[error(transparent)]
    Listen(#[from] toolmesh_kernel::host::ListenError),
}

/// Starts the workspace actor (inside an actix `System`); returns once it is subscribed.
pub async fn spawn(
    client: async_nats::Client,
    settings: WorkspaceSettings,
    lifecycle: Lifecycle,
    in_flight: InFlight,
) -> Result<ActorHandle, WorkspaceStartError> {
    let read_state =
        readstate::ReadState::new(&settings.redis).map_err(WorkspaceStartError::RedisUrl)?;
    let service = Arc::new(service::WorkspaceService {
        data_dir: settings.data_dir,
        read_state,
    });
    let own_files = service::OwnFiles {
        data_dir: service.data_dir.clone(),
    };
    let sync_service = Arc::new(sync::SyncService::new(service.data_dir.clone()));
    let shared = |subject: String| Listen::shared(subject, Role::Workspace);
    let [calls, manifest, fetch, apply] = listen(
        &client,
        [
            shared(internal::run(Role::Workspace)),
            shared(internal::WORKSPACE_MANIFEST.to_owned()),
            shared(internal::WORKSPACE_FETCH.to_owned()),
            shared(internal::WORKSPACE_APPLY.to_owned()),
        ],
    )
    .await?;
    let sync_subscriptions = [manifest, fetch, apply]
        .map(|subscription| drainable(subscription, lifecycle.drain.clone()));
    let drain = lifecycle.drain;
    let keeper = toolmesh_actix_host::start(
        Role::Workspace,
        "workspace",
        toolmesh_actix_host::Serving {
            server: toolmesh_actix_host::ToolServer::new(
                client.clone(),
                Role::Workspace,
                tools::TOOLS,
                Keeper::new(settings.budget_chars, Arc::new(own_files)),
            ),
            host: service,
        },
        drainable(calls, drain),
        in_flight.clone(),
    );
    let syncer = toolmesh_actix_host::start(
        Role::Workspace,
        "workspace sync",
        sync::WorkspaceSyncer {
            client,
            service: sync_service,
        },
        futures::stream::select_all(sync_subscriptions),
        in_flight,
    );
    // Two actors, one handle: the role has stopped once both have drained.
    Ok(ActorHandle::spawn(Role::Workspace, async move {
        keeper.stopped().await;
        syncer.stopped().await;
    }))
}
pub mod search;
