//! toolmesh-sandbox: the sandbox pool actor. It runs on worker nodes (`--roles sandbox`), keeps
//! one sandbox per `(account, session)` pinned to the worker that holds it, and serves the
//! sandbox tools of PROTOCOL.md over `toolmesh.internal.v1.run.sandbox`.
//!
//! Layers, bottom up: [`backend`] starts, runs in and removes sandboxes (Docker through
//! bollard, or bubblewrap processes) and knows nothing of sessions or NATS; [`mirror`] keeps a
//! sandbox's `/workspace` in step with the session's workspace over NATS; [`pool`] holds the
//! sessions of one worker (warm sandboxes, idle reclaim, the concurrency cap) with
//! [`registry`] saying which worker holds which session and [`admission`] which account gets a
//! new one; [`tools`] are the tools; the
//! `worker` actor places each call on the worker holding its session.

pub mod admission;
pub mod backend;
pub mod config;
pub mod disk;
pub mod egress;
pub mod exec;
pub mod mirror;
pub mod network;
pub mod output;
pub mod pool;
pub mod registry;
pub mod remove;
pub mod service;
pub mod skills;
pub mod tasks;
pub mod templates;
pub mod tools;
pub mod variables;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use toolmesh_kernel::cluster::{ClusterView, HEARTBEAT_EXPIRY};
use toolmesh_kernel::host::{drainable, listen, ActorHandle, InFlight, Lifecycle, Listen};
use toolmesh_kernel::outputs::Keeper;
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::wire::{SandboxCapacity, SandboxTemplateStatus};
use toolmesh_kernel::{NodeId, Role};

use crate::backend::spawner::Spawner;
use crate::backend::Backend;
use crate::config::{DockerCommands, SandboxBackend, SandboxConfig};
use crate::mirror::SyncLimits;
use crate::pool::{Pool, PoolSettings};
use crate::templates::Templates;

/// What the sandbox actor needs besides NATS.
#[derive(Debug, Clone)]
pub struct SandboxSettings {
    pub node: NodeId,
    pub config: SandboxConfig,
    /// `TOOLMESH_REDIS_*`: the session registry, when it is in Redis.
    pub redis: toolmesh_kernel::redis_link::RedisConfig,
    /// `TOOLMESH_RESULT_BUDGET_CHARS`.
    pub budget_chars: usize,
    /// `TOOLMESH_SANDBOX_TEMPLATES` (read before the node connects), or only `default`.
    pub templates: Templates,
    /// The node's metrics: egress decisions of the sandboxes' proxy.
    pub metrics: toolmesh_kernel::metrics::Metrics,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxStartError {
    #[error("TOOLMESH_REDIS_URL is not a valid Redis URL: {0}")]
    RedisUrl(#[source] redis::RedisError),
    /// `TOOLMESH_SANDBOX_REGISTRY=jetstream` on a NATS without JetStream, or one that refused
    /// the bucket.
    #[error("the sandbox role cannot start: {0}")]
    Registry(#[source] registry::kv::KvStartError),
    #[error("the sandbox backend cannot start: {0}")]
    Backend(#[source] backend::BackendError),
    /// `TOOLMESH_SANDBOX_DISK_MB` asks for a disk per sandbox that this worker cannot make.
    #[error("the sandbox role cannot start: {0}")]
    Disk(String),
    /// A template this worker cannot make sandboxes of.
    #[error("the sandbox role cannot start: {0}")]
    Template(String),
    #[error(transparent)]
    Listen(#[from] toolmesh_kernel::host::ListenError),
}

/// Reads a worker's sandbox capacity for its NodeStatus.
#[derive(Debug, Clone)]
pub struct CapacityProbe(Arc<Pool>);

impl CapacityProbe {
    pub fn capacity(&self) -> SandboxCapacity {
        let pool = &self.0;
        let in_use = pool.in_use_by_template();
        SandboxCapacity {
            backend: pool.backend.wire_name().to_owned(),
            capacity: pool.settings.max_sessions as u64,
            in_use: pool.in_use() as u64,
            templates: pool
                .settings
                .templates
                .iter()
                .map(|t| SandboxTemplateStatus {
                    name: t.name.clone(),
                    image: t.image.clone(),
                    runtime: t.runtime_name().to_owned(),
                    network: t.network.wire_name().to_owned(),
                    memory_mb: t.limits.memory_mb,
                    cpus: t.limits.cpus,
                    pids: t.limits.pids,
                    warm: pool.warm_ready(&t.name) as u64,
                    in_use: in_use.get(&t.name).copied().unwrap_or(0) as u64,
                })
                .collect(),
        }
    }
}

async fn make_backend(
    config: &SandboxConfig,
    templates: &Templates,
    project: Option<String>,
) -> Result<Arc<dyn Backend>, SandboxStartError> {
    Ok(match config.backend {
        SandboxBackend::Docker => {
            let docker = backend::docker::DockerBackend::new(
                config.image.clone(),
                config.allowed_images.clone(),
            )
            .map_err(SandboxStartError::Backend)?
            .with_needs(
                templates
                    .iter()
                    .map(|t| (t.image.clone(), t.limits.runtime.clone())),
            )
            .with_project(project);
            Arc::new(match config.docker_commands {
                DockerCommands::Spawner => docker.with_spawner(stage_spawner(&config.dir).await?),
                DockerCommands::Exec => docker,
            })
        }
        SandboxBackend::Process => Arc::new(
            backend::process::ProcessBackend::new().with_spawner(stage_spawner(&config.dir).await?),
        ),
    })
}

/// The spawner a sandbox runs: this binary, staged into the sandbox directory
/// ([`backend::spawner::stage`]: once per binary, shared by every start and every worker of
/// the directory), where the Docker daemon and the sandbox user can bind it from. The copy
/// (or hard link) is made off the async threads.
pub async fn stage_spawner(dir: &std::path::Path) -> Result<Spawner, SandboxStartError> {
    let fail = |e: std::io::Error| {
        SandboxStartError::Backend(backend::BackendError::Unavailable(format!(
            "cannot put the sandbox spawner into {}: {e}",
            dir.join(backend::spawner::STAGED_DIR).display()
        )))
    };
    let this = std::env::current_exe().map_err(fail)?;
    let into = dir.to_owned();
    let staged = tokio::task::spawn_blocking(move || backend::spawner::stage(&this, &into))
        .await
        .map_err(|e| fail(std::io::Error::other(e)))?
        .map_err(fail)?;
    Ok(Spawner {
        program: staged,
        ..Spawner::this_binary()
    })
}

/// Starts the sandbox actor (inside an actix `System`); returns once it is subscribed. A
/// backend that cannot run here (image missing) does not stop the node: every call is answered
/// `unavailable` naming the fix until it can.
pub async fn spawn(
    client: async_nats::Client,
    settings: SandboxSettings,
    cluster: Arc<ClusterView>,
    lifecycle: Lifecycle,
    in_flight: InFlight,
) -> Result<(ActorHandle, CapacityProbe), SandboxStartError> {
    let mut settings = settings;
    // One Docker client for the compose project and the egress network (docker backend).
    let docker = docker_client(&settings.config);
    let project = match &docker {
        Some(docker) => compose_project(docker, &settings.config).await,
        None => None,
    };
    if let Some(project) = &project {
        // Two clusters on one host share the default sandbox directory: each project keeps
        // a folder of its own there, and so a deployment scope of its own.
        settings.config.dir = settings.config.dir.join(project);
        tracing::info!(%project, dir = %settings.config.dir.display(), "sandbox folders of this compose project");
    }
    let config = &settings.config;
    // No silent weakening: a quota asked for is a quota kept, or the role does not start —
    // unless the operator let it go (TOOLMESH_SANDBOX_DISK_REQUIRED=0), which is then said.
    let (dir, mb, required) = (config.dir.clone(), config.disk_mb, config.disk_required);
    let disk = tokio::task::spawn_blocking(move || disk::plan(&dir, mb, required))
        .await
        .map_err(|e| SandboxStartError::Disk(e.to_string()))?
        .map_err(SandboxStartError::Disk)?;
    if let Some(note) = &disk.note {
        tracing::warn!("{note}");
    }
    let templates = checked_templates(&settings)?;
    let backend = make_backend(config, &templates, project.clone()).await?;
    let registry = open_registry(&client, &settings).await?;
    let pool = Arc::new(Pool::new(
        backend.clone(),
        PoolSettings {
            node: settings.node.clone(),
            dir: config.dir.clone(),
            templates,
            max_sessions: config.max_sessions,
            max_sessions_per_account: config.max_sessions_per_account,
            idle_ttl: config.idle_ttl,
            concurrency: config.concurrency,
            sync_limits: SyncLimits {
                max_files: config.sync_max_files,
                max_file_bytes: config.sync_max_file_bytes,
                max_total_bytes: config.sync_max_total_bytes,
                max_entries: config.sync_max_entries,
                max_depth: config.sync_max_depth,
            },
            disk,
            metrics: settings.metrics.clone(),
        },
        registry,
        WorkspaceSync::new(client.clone()),
    ));
    let health = match backend.check().await {
        Ok(()) => None,
        Err(e) => {
            tracing::error!(error = %e, "the sandbox backend cannot run here; calls are answered unavailable until it can");
            Some(e.to_string())
        }
    };
    if health.is_none() {
        // A previous run of this node (killed, so it could not remove them) left these; before
        // this run creates any, every sandbox carrying this node's id is one of them.
        pool.reap_orphans(settings.node.as_str(), None).await;
    }
    if let Some(docker) = &docker {
        // Its egress network too, now that no sandbox is left on it.
        reap_egress(docker, &pool.scope(), settings.node.as_str(), None).await;
    }
    start_egress(&pool, docker.as_ref(), &settings, project.as_deref()).await?;
    let service = Arc::new(service::SandboxService {
        pool: pool.clone(),
        client: client.clone(),
        default_timeout: config.default_timeout,
        output_max_bytes: config.output_max_bytes,
        session_output_max_bytes: config.session_output_max_bytes,
        worker_output: crate::output::Quota::new(
            crate::output::Cap::Worker,
            config.worker_output_max_bytes,
        ),
        handovers: crate::output::Handover::worker_slots(),
        skill_runner: config.skill_runner.clone(),
    });
    let [shared, own] = listen(
        &client,
        [
            Listen::shared(internal::run(Role::Sandbox), Role::Sandbox),
            Listen::own(internal::run_on(Role::Sandbox, &settings.node)),
        ],
    )
    .await?;

    if health.is_none() {
        let warm = pool.clone();
        tokio::spawn(async move { warm.fill_warm().await });
    }
    tokio::spawn(housekeeping(
        pool.clone(),
        docker,
        cluster.clone(),
        lifecycle.drain.clone(),
    ));

    let drain = lifecycle.drain.clone();
    let calls = futures::stream::select(
        drainable(shared, drain.clone()).map(|msg| worker::RunRequested {
            msg,
            forwarded: false,
        }),
        drainable(own, drain).map(|msg| worker::RunRequested {
            msg,
            forwarded: true,
        }),
    );
    let worker = worker::SandboxWorker {
        server: toolmesh_actix_host::ToolServer::new(
            client.clone(),
            Role::Sandbox,
            tools::TOOLS,
            Keeper::new(settings.budget_chars, Arc::new(pool.sync().clone())),
        ),
        client,
        service,
        cluster,
        node: settings.node.clone(),
        health: tokio::sync::Mutex::new(health),
    };
    let handle = toolmesh_actix_host::start(Role::Sandbox, "sandbox", worker, calls, in_flight);
    Ok((handle, CapacityProbe(pool)))
}

/// The session registry in the store the worker's config names; its lease is twice the idle
/// TTL.
async fn open_registry(
    client: &async_nats::Client,
    settings: &SandboxSettings,
) -> Result<registry::SessionRegistry, SandboxStartError> {
    let (config, ttl) = (&settings.config, settings.config.idle_ttl * 2);
    Ok(match config.registry {
        registry::RegistryStore::Redis => registry::SessionRegistry::Redis(
            registry::RedisRegistry::new(&settings.redis, ttl)
                .map_err(SandboxStartError::RedisUrl)?,
        ),
        registry::RegistryStore::JetStream => {
            let js = toolmesh_kernel::streams::context(client, config.registry_domain.as_deref());
            registry::SessionRegistry::JetStream(
                registry::KvRegistry::start(&js, ttl, config.registry_replicas)
                    .await
                    .map_err(SandboxStartError::Registry)?
                    .into(),
            )
        }
    })
}

/// The worker's templates, checked against its backend: each one's network can be given
/// ([`network::allow_list`]; `allow` only by Docker), and only Docker runs a runtime of a template's choosing. The process
/// backend keeps no warm sandboxes.
fn checked_templates(settings: &SandboxSettings) -> Result<Templates, SandboxStartError> {
    let templates = settings.templates.clone();
    for template in templates.iter() {
        network::allow_list(template).map_err(|e| SandboxStartError::Template(e.to_string()))?;
        if settings.config.backend != SandboxBackend::Docker
            && matches!(template.network, templates::Network::Allow(_))
        {
            return Err(SandboxStartError::Template(format!(
                "sandbox template {:?} has network = \"allow\", which only the docker backend gives (TOOLMESH_SANDBOX_BACKEND=docker)",
                template.name
            )));
        }
        let runtime = template.limits.runtime.as_deref();
        if settings.config.docker_commands == DockerCommands::Spawner
            && !backend::docker::runs_spawner(runtime)
        {
            tracing::info!(
                template = %template.name,
                runtime = template.runtime_name(),
                "this runtime cannot run the sandbox spawner (no child subreaper); the template's sandboxes run commands by docker exec"
            );
        }
        if settings.config.backend != SandboxBackend::Docker && template.limits.runtime.is_some() {
            return Err(SandboxStartError::Template(format!(
                "sandbox template {:?} names the runtime {:?}, which only the docker backend runs (TOOLMESH_SANDBOX_BACKEND=docker)",
                template.name,
                template.runtime_name()
            )));
        }
    }
    Ok(match settings.config.backend {
        SandboxBackend::Docker => templates,
        SandboxBackend::Process => templates.without_warm(),
    })
}

/// This host's name (`/etc/hostname`): in a container, Docker finds the container by it (its
/// id, unless compose sets a hostname).
fn own_hostname() -> Option<String> {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
}

/// The compose project of the container this worker runs in (its `com.docker.compose.project`
/// label), with the docker backend; `None` outside compose or when Docker does not say.
async fn compose_project(docker: &bollard::Docker, config: &SandboxConfig) -> Option<String> {
    if !disk::in_container() {
        return None;
    }
    let container = match config.egress_join.as_deref() {
        Some(container) if container != "self" => container.to_owned(),
        _ => own_hostname()?,
    };
    let inspected = docker
        .inspect_container(
            &container,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .inspect_err(|e| tracing::debug!(error = %e, "cannot inspect this worker's container"))
        .ok()?;
    let project = inspected
        .config?
        .labels?
        .remove("com.docker.compose.project")?;
    project_folder(&project)
}

/// A compose project name as a folder name: compose allows `[a-z0-9_-]`; anything else (or a
/// name that is not one path component) is refused.
fn project_folder(project: &str) -> Option<String> {
    let fine = !project.is_empty()
        && !project.starts_with('.')
        && project
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    fine.then(|| project.to_owned())
}

/// A Docker client for the egress network, with the docker backend.
fn docker_client(config: &SandboxConfig) -> Option<bollard::Docker> {
    if config.backend != SandboxBackend::Docker {
        return None;
    }
    bollard::Docker::connect_with_local_defaults()
        .inspect_err(|e| tracing::warn!(error = %e, "cannot connect to Docker"))
        .ok()
}

/// [`egress::reap_orphans`] in `scope`, logged (a failure only delays it).
async fn reap_egress(
    docker: &bollard::Docker,
    scope: &str,
    this_node: &str,
    live: Option<&[String]>,
) {
    match egress::reap_orphans(docker, scope, this_node, live).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(removed = n, "removed orphaned sandbox egress networks"),
        Err(e) => tracing::warn!(error = %e, "cannot look for orphaned sandbox egress networks"),
    }
}

/// Starts the worker's egress proxy when a template has `network = "allow"`; a failure stops
/// the role, naming the template and the cause. `TOOLMESH_SANDBOX_EGRESS_JOIN` says the worker
/// runs in that container (`self`: the one whose hostname this is), which then joins the
/// egress network.
async fn start_egress(
    pool: &Pool,
    docker: Option<&bollard::Docker>,
    settings: &SandboxSettings,
    project: Option<&str>,
) -> Result<(), SandboxStartError> {
    let Some(template) = settings
        .templates
        .iter()
        .find(|t| matches!(t.network, templates::Network::Allow(_)))
    else {
        return Ok(());
    };
    let refused = |reason: String| {
        SandboxStartError::Template(format!(
            "sandbox template {:?} has network = \"allow\", but the worker's egress proxy cannot start: {reason}",
            template.name
        ))
    };
    let docker = docker.ok_or_else(|| refused("Docker is not reachable".to_owned()))?;
    let placement = match settings.config.egress_join.as_deref() {
        // This container: Docker finds it by its hostname, which is its id unless set.
        Some("self") => {
            let hostname = own_hostname().ok_or_else(|| {
                refused(
                    "TOOLMESH_SANDBOX_EGRESS_JOIN=self, but /etc/hostname names no container"
                        .to_owned(),
                )
            })?;
            egress::Placement::Join(hostname)
        }
        Some(container) => egress::Placement::Join(container.to_owned()),
        None => egress::Placement::Host,
    };
    let started = egress::SandboxEgress::start(
        docker,
        settings.node.as_str(),
        (&pool.scope(), project),
        placement,
        egress::ProxyLimits::default(),
    )
    .await
    .map_err(|e| refused(e.to_string()))?;
    tracing::info!(proxy = %started.proxy_addr(), network = started.network(), "sandbox egress proxy started");
    pool.set_egress(started);
    Ok(())
}

/// Reclaims idle sessions, keeps registry entries alive, and removes sandboxes (and egress
/// networks) that dead workers on this Docker host left behind.
async fn housekeeping(
    pool: Arc<Pool>,
    docker: Option<bollard::Docker>,
    cluster: Arc<ClusterView>,
    drain: tokio_util::sync::CancellationToken,
) {
    let shortest = pool
        .settings
        .templates
        .iter()
        .map(|t| t.idle_ttl)
        .min()
        .unwrap_or(pool.settings.idle_ttl);
    let sweep_every = (shortest / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    // Wait until the cluster view has heard every live node before judging orphans.
    let mut next_reap = tokio::time::Instant::now() + HEARTBEAT_EXPIRY + Duration::from_secs(2);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(sweep_every) => {}
            _ = drain.cancelled() => return,
        }
        pool.sweep().await;
        if tokio::time::Instant::now() >= next_reap {
            next_reap = tokio::time::Instant::now() + Duration::from_secs(60);
            let live: Vec<String> = cluster
                .live()
                .into_iter()
                .map(|n| n.node_id.as_str().to_owned())
                .collect();
            // Never this node's own: its live sandboxes carry its id. ("" names no node.)
            pool.reap_orphans("", Some(&live)).await;
            if let Some(docker) = &docker {
                reap_egress(docker, &pool.scope(), "", Some(&live)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::project_folder;

    #[test]
    fn a_compose_project_is_a_folder_only_when_it_is_one_plain_component() {
        assert_eq!(
            project_folder("toolmesh-ci").as_deref(),
            Some("toolmesh-ci")
        );
        for bad in ["", "..", ".hidden", "a/b", "a b", "x\0"] {
            assert_eq!(project_folder(bad), None, "{bad:?}");
        }
    }
}
