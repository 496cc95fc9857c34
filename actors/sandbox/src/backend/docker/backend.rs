//! [`DockerBackend`]: its Docker client, the images and runtimes it needs, and the sandbox
//! lifecycle of [`Backend`] (create, exec, destroy, reap).

use std::collections::HashMap;
use std::sync::Arc;

use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions, StartContainerOptions,
};
use bollard::Docker;
use tokio::sync::OnceCell;

use crate::backend::docker::common::{
    container_name, container_ref, runs_spawner, status, NO_DOCKER_HINT,
};
use crate::backend::docker::connect::{connect_spawner, SPAWNED};
use crate::backend::docker::container::{
    container_body, open_run_dir, prepare_workspace, run_dir_of,
};
use crate::backend::docker::exec;
use crate::backend::exits::ExecExits;
use crate::backend::link::{lock, Link};
use crate::backend::spawner::Spawner;
use crate::backend::{
    make_private, skills_dir_of, Backend, BackendError, ExecSpec, Execution, SandboxRef,
    SandboxSpec, StartGate, LABEL_MANAGED, LABEL_NODE, LABEL_SCOPE,
};

/// Runs sandboxes as Docker containers of one image, or of the image a sandbox's template
/// names.
pub struct DockerBackend {
    docker: Docker,
    image: String,
    /// Every image and runtime the worker's templates name, checked by [`Backend::check`].
    needs: Vec<(String, Option<String>)>,
    /// The API version is negotiated once (the daemon may be older than bollard's default).
    negotiated: OnceCell<()>,
    /// Exit codes announced by the daemon; watched from the first exec on.
    exits: std::sync::OnceLock<Arc<ExecExits>>,
    /// Run commands through a spawner in each container (see the module docs): its program,
    /// a path the Docker daemon can bind.
    spawner: Option<Spawner>,
    /// The spawner links of the containers this backend created, by sandbox id.
    links: std::sync::Mutex<HashMap<String, Arc<Link>>>,
    /// Sandboxes whose commands are `docker exec`s although a spawner is configured: their
    /// runtime cannot run it ([`runs_spawner`]).
    by_exec: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The compose project every container is labelled with
    /// ([`LABEL_PROJECT`](crate::backend::LABEL_PROJECT)).
    project: Option<String>,
}

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("image", &self.image)
            .finish()
    }
}

impl DockerBackend {
    /// Connects (lazily) to the local Docker daemon; `image` must be in `allowed_images`.
    pub fn new(image: String, allowed_images: Vec<String>) -> Result<Self, BackendError> {
        if !allowed_images.iter().any(|allowed| allowed == &image) {
            return Err(BackendError::Unavailable(format!(
                "the sandbox image {image} is not in the allowed images ({}): set \
                 TOOLMESH_SANDBOX_IMAGE to one of them",
                if allowed_images.is_empty() {
                    "none".to_owned()
                } else {
                    allowed_images.join(", ")
                }
            )));
        }
        let docker = Docker::connect_with_local_defaults().map_err(|e| {
            BackendError::Unavailable(format!("cannot connect to Docker: {e}: {NO_DOCKER_HINT}"))
        })?;
        Ok(Self {
            docker,
            needs: vec![(image.clone(), None)],
            image,
            negotiated: OnceCell::new(),
            exits: std::sync::OnceLock::new(),
            spawner: None,
            links: std::sync::Mutex::new(HashMap::new()),
            by_exec: std::sync::Mutex::new(Default::default()),
            project: None,
        })
    }

    /// Labels every container with the worker's compose project
    /// ([`LABEL_PROJECT`](crate::backend::LABEL_PROJECT)).
    pub fn with_project(mut self, project: Option<String>) -> Self {
        self.project = project;
        self
    }

    /// The same backend running commands through `spawner` in each container (see the module
    /// docs); its program must be a path on the Docker daemon's host.
    pub fn with_spawner(mut self, spawner: Spawner) -> Self {
        self.spawner = Some(spawner);
        self
    }

    /// The images and runtimes (besides the default image) the worker's templates name:
    /// [`Backend::check`] finds each present, or says which is missing.
    pub fn with_needs(mut self, needs: impl IntoIterator<Item = (String, Option<String>)>) -> Self {
        for need in needs {
            if !self.needs.contains(&need) {
                self.needs.push(need);
            }
        }
        self
    }

    /// The image sandboxes are created from.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The Docker client, after the one-time version negotiation.
    async fn client(&self) -> Result<&Docker, BackendError> {
        self.negotiated
            .get_or_try_init(|| async {
                // `negotiate_version` stores the version in state shared with `self.docker`.
                self.docker
                    .clone()
                    .negotiate_version()
                    .await
                    .map(drop)
                    .map_err(|e| {
                        BackendError::Unavailable(format!(
                            "Docker is not reachable: {e}: {NO_DOCKER_HINT}"
                        ))
                    })
            })
            .await?;
        Ok(&self.docker)
    }

    fn missing_image(image: &str) -> BackendError {
        BackendError::Unavailable(format!(
            "the sandbox image {image} is missing on this worker: run scripts/build-images (or \
             docker build -f docker/sandbox.Dockerfile -t {image} docker/)"
        ))
    }

    /// Whether the engine has the runtime `name` (it learns runtimes from its daemon.json).
    async fn check_runtime(docker: &Docker, name: &str) -> Result<(), BackendError> {
        let info = docker.info().await.map_err(|e| {
            BackendError::Unavailable(format!("cannot ask Docker for its runtimes: {e}"))
        })?;
        let known = info.runtimes.unwrap_or_default();
        if known.contains_key(name) {
            return Ok(());
        }
        let mut names: Vec<&String> = known.keys().collect();
        names.sort();
        Err(BackendError::Unavailable(format!(
            "a sandbox template names the runtime {name:?}, which the Docker engine does not have \
             (it has {names:?}): run scripts/gvisor to register gVisor's runsc (it reloads the \
             engine with SIGHUP)"
        )))
    }

    async fn remove(&self, container: &str) -> Result<bool, BackendError> {
        let docker = self.client().await?;
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match docker.remove_container(container, Some(options)).await {
            Ok(()) => Ok(true),
            Err(e) if matches!(status(&e), Some(404)) => Ok(false),
            // "removal of container … is already in progress"
            Err(e) if matches!(status(&e), Some(409)) => Ok(false),
            Err(e) => Err(BackendError::Failed(format!(
                "removing container {container}: {e}"
            ))),
        }
    }
}

#[async_trait::async_trait]
impl Backend for DockerBackend {
    fn wire_name(&self) -> &'static str {
        "sandbox/docker"
    }

    fn boundary(&self) -> &'static str {
        "executes only through the sandbox backend (a Docker container per session: uid 1000, no \
         network, no capabilities, no-new-privileges, read-only system, only /workspace, /tmp and \
         the home directory writable, memory, CPU and process limits); never exposes the host \
         shell; shares the host kernel"
    }

    fn commands(&self, runtime: Option<&str>) -> &'static str {
        if self.spawner.is_some() && runs_spawner(runtime) {
            "spawner"
        } else {
            "exec"
        }
    }

    async fn check(&self) -> Result<(), BackendError> {
        let docker = self.client().await?;
        let mut runtimes_checked: Vec<&str> = Vec::new();
        for (image, runtime) in &self.needs {
            match docker.inspect_image(image).await {
                Ok(_) => {}
                Err(e) if matches!(status(&e), Some(404)) => {
                    return Err(Self::missing_image(image))
                }
                Err(e) => {
                    return Err(BackendError::Unavailable(format!(
                        "cannot inspect the sandbox image {image}: {e}: {NO_DOCKER_HINT}"
                    )))
                }
            }
            if let Some(runtime) = runtime.as_deref() {
                if !runtimes_checked.contains(&runtime) {
                    Self::check_runtime(docker, runtime).await?;
                    runtimes_checked.push(runtime);
                }
            }
        }
        Ok(())
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxRef, BackendError> {
        let dir = spec.workspace_dir.clone();
        let spawned = self.spawner.is_some() && runs_spawner(spec.limits.runtime.as_deref());
        let (workspace, run_dir) = tokio::task::spawn_blocking(move || {
            // The sandbox's folder (its workspace, skills and run directory) is the worker's
            // alone: the container reaches them through its bind mounts.
            if let Some(folder) = dir.parent() {
                make_private(folder, None).map_err(|e| {
                    BackendError::Failed(format!("preparing {}: {e}", folder.display()))
                })?;
            }
            let workspace = prepare_workspace(&dir)?;
            std::fs::create_dir_all(skills_dir_of(&workspace))
                .map_err(|e| BackendError::Failed(format!("creating the skills directory: {e}")))?;
            // The spawner's socket: beside the workspace, writable by the sandbox user until
            // the worker connected (see `connect_spawner`).
            let run_dir = match spawned {
                true => Some(open_run_dir(&run_dir_of(&workspace))?),
                false => None,
            };
            Ok::<_, BackendError>((workspace, run_dir))
        })
        .await
        .map_err(|e| BackendError::Failed(format!("preparing workspace: {e}")))??;
        let bound = [Some(workspace.as_path()), run_dir.as_deref()]
            .into_iter()
            .chain([self
                .spawner
                .as_ref()
                .filter(|_| spawned)
                .map(|s| s.program.as_path())])
            .flatten();
        for path in bound {
            if path.to_str().is_none_or(|p| p.contains([':', ','])) {
                return Err(BackendError::Failed(format!(
                    "path {} cannot be bound into a container (not UTF-8, or holds ':' or ',')",
                    path.display()
                )));
            }
        }
        let docker = self.client().await?;
        let name = container_name(&spec.sandbox_id);
        let body = container_body(
            &self.image,
            self.project.as_deref(),
            self.spawner.as_ref(),
            spec,
            &workspace,
            run_dir.as_deref(),
        );
        let options = || CreateContainerOptions {
            name: Some(name.clone()),
            platform: String::new(),
        };
        let created = match docker.create_container(Some(options()), body.clone()).await {
            Err(e) if matches!(status(&e), Some(409)) => {
                // A container of that name is left over (same sandbox id): replace it.
                self.remove(&name).await?;
                docker.create_container(Some(options()), body).await
            }
            other => other,
        };
        let created = created.map_err(|e| match status(&e) {
            Some(404) => Self::missing_image(spec.image.as_deref().unwrap_or(&self.image)),
            _ => BackendError::Failed(format!("creating container {name}: {e}")),
        })?;
        if let Err(e) = docker
            .start_container(&created.id, None::<StartContainerOptions>)
            .await
        {
            let _ = self.remove(&created.id).await;
            return Err(BackendError::Failed(format!(
                "starting container {name}: {e}"
            )));
        }
        if let Some(run_dir) = &run_dir {
            match connect_spawner(docker, &created.id, run_dir, &spec.sandbox_id).await {
                Ok(link) => {
                    lock(&self.links).insert(spec.sandbox_id.clone(), link);
                }
                Err(why) => {
                    let _ = self.remove(&created.id).await;
                    return Err(BackendError::Failed(format!(
                        "the sandbox spawner in container {name} did not start: {why} (an image \
                         that cannot run the worker's binary needs TOOLMESH_SANDBOX_DOCKER_COMMANDS=exec)"
                    )));
                }
            }
        }
        if self.spawner.is_some() && !spawned {
            lock(&self.by_exec).insert(spec.sandbox_id.clone());
        }
        tracing::debug!(container = %name, id = %created.id, "sandbox container started");
        Ok(SandboxRef {
            sandbox_id: spec.sandbox_id.clone(),
            container_id: created.id,
            workspace_dir: workspace,
        })
    }

    async fn destroy(&self, sandbox: &SandboxRef) -> Result<(), BackendError> {
        // The spawner exits when its socket closes; the removal kills whatever is left.
        lock(&self.links).remove(&sandbox.sandbox_id);
        lock(&self.by_exec).remove(&sandbox.sandbox_id);
        self.remove(&container_ref(sandbox)).await.map(drop)
    }

    async fn exec(
        &self,
        sandbox: &SandboxRef,
        spec: ExecSpec,
        gate: StartGate,
    ) -> Result<Execution, BackendError> {
        if spec.argv.is_empty() {
            return Err(BackendError::Failed("empty command".to_owned()));
        }
        if self.spawner.is_some() && !lock(&self.by_exec).contains(&sandbox.sandbox_id) {
            // Nothing to prepare: a spawn is all of it.
            gate.pass().await?;
            let link = lock(&self.links).get(&sandbox.sandbox_id).cloned();
            let link = link.ok_or_else(|| BackendError::Gone(sandbox.sandbox_id.clone()))?;
            return link.exec(spec, &SPAWNED).await;
        }
        let docker = self.client().await?.clone();

        exec::exec(docker, &self.exits, sandbox, spec, gate).await
    }

    async fn reap_orphans(
        &self,
        scope: &str,
        this_node: &str,
        live_nodes: Option<&[String]>,
    ) -> Result<usize, BackendError> {
        let docker = self.client().await?;
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![
                    format!("{LABEL_MANAGED}=1"),
                    format!("{LABEL_SCOPE}={scope}"),
                ],
            )])),
            ..Default::default()
        };
        let containers = docker
            .list_containers(Some(options))
            .await
            .map_err(|e| BackendError::Failed(format!("listing sandbox containers: {e}")))?;
        let mut removed = 0;
        for container in containers {
            let Some(id) = container.id else { continue };
            let node = container
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_NODE))
                .map(String::as_str);
            let orphan = match (node, live_nodes) {
                (Some(node), _) if node == this_node => true,
                (Some(node), Some(live)) => !live.iter().any(|l| l == node),
                (None, Some(_)) => true,
                (_, None) => false,
            };
            if orphan && self.remove(&id).await? {
                tracing::info!(container = %id, node = ?node, "removed orphaned sandbox container");
                removed += 1;
            }
        }
        Ok(removed)
    }
}
