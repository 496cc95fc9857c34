//! A sandbox container's settings (user, limits, mounts, labels) and the folders it binds: its
//! workspace and the spawner's `run` directory.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use bollard::models::{ContainerCreateBody, HostConfig, RestartPolicy, RestartPolicyNameEnum};

use crate::backend::docker::common::{
    CONTROL_SOCKET, HOME, RUN_MOUNT, SANDBOX_GID, SANDBOX_UID, SANDBOX_USER, WORKSPACE,
};
use crate::backend::spawner::{Spawner, SPAWNER_MOUNT};
use crate::backend::{
    skills_dir_of, BackendError, SandboxSpec, LABEL_MANAGED, LABEL_NODE, LABEL_PROJECT,
    LABEL_SANDBOX, LABEL_SCOPE, SKILLS_MOUNT,
};

/// The container of a sandbox of `spec`: of `spec`'s image, else `image`; labelled with the
/// compose `project`; running `spawner` when it has a `run_dir`, else `sleep infinity`.
pub(super) fn container_body(
    image: &str,
    project: Option<&str>,
    spawner: Option<&Spawner>,
    spec: &SandboxSpec,
    workspace: &Path,
    run_dir: Option<&Path>,
) -> ContainerCreateBody {
    let limits = &spec.limits;
    let network = match limits.network.as_str() {
        "" | "none" => "none".to_owned(),
        other => other.to_owned(),
    };
    let memory = i64::try_from(limits.memory_mb.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX);
    let tmpfs_opts = |extra: &str| {
        format!(
            "rw,exec,nosuid,nodev,size={}m{extra}",
            limits.tmpfs_mb.max(1)
        )
    };
    let mut labels = HashMap::from([
        (LABEL_MANAGED.to_owned(), "1".to_owned()),
        (LABEL_NODE.to_owned(), spec.node_id.clone()),
        (LABEL_SANDBOX.to_owned(), spec.sandbox_id.clone()),
        (LABEL_SCOPE.to_owned(), spec.scope.clone()),
    ]);
    if let Some(project) = project {
        labels.insert(LABEL_PROJECT.to_owned(), project.to_owned());
    }
    let mut binds = vec![
        format!("{}:{WORKSPACE}:rw", workspace.display()),
        format!("{}:{SKILLS_MOUNT}:ro", skills_dir_of(workspace).display()),
    ];
    let cmd = match (spawner, run_dir) {
        (Some(spawner), Some(run_dir)) => {
            binds.push(format!("{}:{SPAWNER_MOUNT}:ro", spawner.program.display()));
            binds.push(format!("{}:{RUN_MOUNT}:rw", run_dir.display()));
            let mut cmd = vec![SPAWNER_MOUNT.to_owned()];
            cmd.extend(spawner.args.iter().cloned());
            cmd.extend([
                "--listen".to_owned(),
                format!("{RUN_MOUNT}/{CONTROL_SOCKET}"),
            ]);
            cmd
        }
        _ => vec!["sleep".to_owned(), "infinity".to_owned()],
    };
    let mut env = vec![format!("HOME={HOME}")];
    env.extend(
        spec.env
            .iter()
            .map(|(name, value)| format!("{name}={value}")),
    );
    ContainerCreateBody {
        image: Some(spec.image.clone().unwrap_or_else(|| image.to_owned())),
        user: Some(SANDBOX_USER.to_owned()),
        cmd: Some(cmd),
        env: Some(env),
        working_dir: Some(WORKSPACE.to_owned()),
        hostname: Some("sandbox".to_owned()),
        labels: Some(labels),
        attach_stdin: Some(false),
        attach_stdout: Some(false),
        attach_stderr: Some(false),
        open_stdin: Some(false),
        tty: Some(false),
        host_config: Some(HostConfig {
            binds: Some(binds),
            network_mode: Some(network),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([
                ("/tmp".to_owned(), tmpfs_opts(",mode=1777")),
                (HOME.to_owned(), tmpfs_opts(",mode=0700,uid=1000,gid=1000")),
            ])),
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some((limits.cpus * 1e9).round() as i64),
            pids_limit: Some(i64::try_from(limits.pids).unwrap_or(i64::MAX)),
            init: Some(true),
            runtime: limits.runtime.clone(),
            ipc_mode: Some("private".to_owned()),
            auto_remove: Some(false),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates `dir` if missing and makes it writable by the sandbox user (uid 1000): as root,
/// `dir` and everything in it is chowned to 1000:1000 (symlinks themselves, never followed);
/// otherwise `dir` is made mode 0777. Returns the canonical path.
pub fn prepare_workspace(dir: &Path) -> Result<PathBuf, BackendError> {
    let fail = |what: &str, path: &Path, e: io::Error| {
        BackendError::Failed(format!("{what} {}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| fail("creating workspace", dir, e))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| fail("resolving workspace", dir, e))?;
    if rustix::process::geteuid().is_root() {
        let mut stack = vec![dir.clone()];
        while let Some(path) = stack.pop() {
            std::os::unix::fs::lchown(&path, Some(SANDBOX_UID), Some(SANDBOX_GID))
                .map_err(|e| fail("chowning", &path, e))?;
            let meta = std::fs::symlink_metadata(&path).map_err(|e| fail("reading", &path, e))?;
            if meta.is_dir() {
                for entry in std::fs::read_dir(&path).map_err(|e| fail("listing", &path, e))? {
                    stack.push(entry.map_err(|e| fail("listing", &path, e))?.path());
                }
            }
        }
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| fail("chmod 0777", &dir, e))?;
    }
    Ok(dir)
}

/// A sandbox's `run` directory (the spawner's socket), beside its workspace.
pub(super) fn run_dir_of(workspace: &Path) -> PathBuf {
    workspace.with_file_name("run")
}

/// Creates `dir` (owned by this worker) with mode 0777, so that the spawner, the sandbox user,
/// can create its socket there; the worker closes it once connected. Its parent, the sandbox's
/// folder, is private to this worker ([`make_private`]): nobody else on the host reaches the
/// socket meanwhile.
pub(super) fn open_run_dir(dir: &Path) -> Result<PathBuf, BackendError> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |e: io::Error| BackendError::Failed(format!("preparing {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).map_err(fail)?;
    dir.canonicalize().map_err(fail)
}
