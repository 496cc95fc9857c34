//! The sandbox worker's configuration ([`SandboxConfig`]): its backend, the default image and
//! limits of a sandbox (the template `default`), its sessions, disk, sync and output bounds, and
//! what `execute_skills` runs. Read from `TOOLMESH_SANDBOX_*` (and
//! `TOOLMESH_SKILL_RUNNER_COMMAND`) once at start; the templates file is [`crate::templates`]'s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use toolmesh_kernel::config::{ConfigError, RawEnv};

pub const DEFAULT_SANDBOX_IMAGE: &str = "toolmesh/sandbox:latest";
pub const DEFAULT_SANDBOX_MEMORY_MB: u64 = 1024;
pub const DEFAULT_SANDBOX_PIDS: u64 = 256;
pub const DEFAULT_SANDBOX_CPUS: f64 = 1.0;
pub const DEFAULT_SANDBOX_MAX_SESSIONS: usize = 32;
pub const DEFAULT_SANDBOX_IDLE_TTL_S: u64 = 900;
pub const DEFAULT_SANDBOX_WARM: usize = 2;
pub const DEFAULT_SANDBOX_TMPFS_MB: u64 = 256;
/// Each sandbox's disk (`TOOLMESH_SANDBOX_DISK_MB`): its workspace copy, skills and spooled
/// output live in an image of this size. 4 GiB: sixty times what the sync carries at most by
/// default (64 MiB), room for a build's dependencies and outputs, while one worker's sandboxes
/// take at most `(max_sessions + warm) × 4 GiB` of the host's disk.
pub const DEFAULT_SANDBOX_DISK_MB: u64 = 4096;
pub const DEFAULT_SANDBOX_TIMEOUT_S: u64 = 60;
pub const DEFAULT_SYNC_MAX_FILES: usize = 2000;
pub const DEFAULT_SYNC_MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;
pub const DEFAULT_SYNC_MAX_TOTAL_BYTES: u64 = 64 * 1024 * 1024;
/// Entries of every kind (files, directories, links, skipped names) a sync walk of a sandbox
/// reads at most.
pub const DEFAULT_SYNC_MAX_ENTRIES: usize = 10_000;
/// Levels below `/workspace` a sync walk of a sandbox goes at most.
pub const DEFAULT_SYNC_MAX_DEPTH: usize = 64;
/// Text of one command output stream a worker spools and persists at most (PROTOCOL.md
/// "Large data": at least 256 MiB).
pub const DEFAULT_SANDBOX_OUTPUT_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Unread background-task output one session keeps on its worker's disk: two tasks' worth of
/// full streams (docs/configuration.md).
pub const DEFAULT_SANDBOX_SESSION_OUTPUT_MAX_BYTES: u64 = 1024 * 1024 * 1024;
/// Unread background-task output one worker keeps on its disk, all sessions together.
pub const DEFAULT_SANDBOX_WORKER_OUTPUT_MAX_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// `FromStr` for a setting naming one of two choices; anything else is refused, naming
/// `what` is chosen and both names.
macro_rules! two_choices {
    ($type:ident, $what:literal: $a:literal => $x:ident, $b:literal => $y:ident) => {
        impl std::str::FromStr for $type {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $a => Ok(Self::$x),
                    $b => Ok(Self::$y),
                    other => Err(format!(
                        concat!("unknown ", $what, " {:?}; use ", $a, " or ", $b),
                        other
                    )),
                }
            }
        }
    };
}

/// The sandbox backends of PROTOCOL.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxBackend {
    Docker,
    Process,
}

impl SandboxBackend {
    /// The `backend` value replies and NodeStatus carry.
    pub fn wire_name(self) -> &'static str {
        match self {
            SandboxBackend::Docker => "sandbox/docker",
            SandboxBackend::Process => "sandbox/process",
        }
    }
}

two_choices!(SandboxBackend, "sandbox backend": "docker" => Docker, "process" => Process);

/// How the Docker backend runs a command in a session's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DockerCommands {
    /// A spawner started as the container's command forks each one (about a millisecond):
    /// the default; the image must run the worker's own binary (glibc).
    Spawner,
    /// `docker exec` each one (tens of milliseconds): for images that cannot run the spawner.
    Exec,
}

two_choices!(DockerCommands, "way to run Docker commands": "spawner" => Spawner, "exec" => Exec);

/// Sandbox settings.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub backend: SandboxBackend,
    /// How the Docker backend runs commands (`TOOLMESH_SANDBOX_DOCKER_COMMANDS`).
    pub docker_commands: DockerCommands,
    pub image: String,
    pub memory_mb: u64,
    pub pids: u64,
    pub cpus: f64,
    pub network: String,
    /// The container this worker runs in, when it does (`TOOLMESH_SANDBOX_EGRESS_JOIN`, a
    /// container's name or id): the egress network of `network = "allow"` templates joins it.
    /// `None`: the worker runs on the host.
    pub egress_join: Option<String>,
    /// Images a worker may run (`TOOLMESH_SANDBOX_IMAGES`); always includes `image`.
    pub allowed_images: Vec<String>,
    /// Where a worker keeps each sandbox's copy of the workspace (`TOOLMESH_SANDBOX_DIR`,
    /// default `$TOOLMESH_DATA_DIR/sandboxes`). With the Docker backend this path is
    /// bind-mounted by the Docker daemon, so a worker in a container must see it at the same
    /// path as the host does.
    pub dir: PathBuf,
    /// Sandboxes one worker holds at most (`TOOLMESH_SANDBOX_MAX_SESSIONS`).
    pub max_sessions: usize,
    /// Sandboxes one worker holds at most for one account
    /// (`TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT`; default half of `max_sessions`, at least
    /// 1; never above `max_sessions`).
    pub max_sessions_per_account: usize,
    /// A session's sandbox is removed after this long unused (`TOOLMESH_SANDBOX_IDLE_TTL_S`).
    pub idle_ttl: Duration,
    /// Started, unassigned sandboxes a worker keeps ready (`TOOLMESH_SANDBOX_WARM`).
    pub warm: usize,
    /// Commands one worker runs at once; more wait in order (`TOOLMESH_SANDBOX_CONCURRENCY`,
    /// default twice the cores).
    pub concurrency: usize,
    /// Size of the sandbox's `/tmp` and home tmpfs (`TOOLMESH_SANDBOX_TMPFS_MB`).
    pub tmpfs_mb: u64,
    /// Size of each sandbox's own disk, MiB (`TOOLMESH_SANDBOX_DISK_MB`); 0: no disk of its
    /// own, its folder is a plain one on the host's disk.
    pub disk_mb: u64,
    /// Whether a disk quota that cannot be kept stops the role (`TOOLMESH_SANDBOX_DISK_REQUIRED`,
    /// default on). Off, the worker runs without one, saying so in its log and in
    /// `sandbox_status` (compose's default: a host whose sandbox folder is not on a shared mount
    /// cannot have one).
    pub disk_required: bool,
    /// A command's timeout when the call names none (`TOOLMESH_SANDBOX_TIMEOUT_S`).
    pub default_timeout: Duration,
    /// Workspace sync bounds (`TOOLMESH_SANDBOX_SYNC_MAX_FILES`, `…_MAX_FILE_BYTES`,
    /// `…_MAX_TOTAL_BYTES`).
    pub sync_max_files: usize,
    pub sync_max_file_bytes: u64,
    pub sync_max_total_bytes: u64,
    /// Bounds of the walk of a sandbox's workspace (`TOOLMESH_SANDBOX_SYNC_MAX_ENTRIES`,
    /// `…_MAX_DEPTH`).
    pub sync_max_entries: usize,
    pub sync_max_depth: usize,
    /// Text of one output stream a worker spools and persists at most; past it the stream is
    /// counted, not kept (`TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES`).
    pub output_max_bytes: u64,
    /// Unread background-task output one session keeps (`TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES`).
    pub session_output_max_bytes: u64,
    /// Unread background-task output one worker keeps (`TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES`).
    pub worker_output_max_bytes: u64,
    /// What `execute_skills` runs (`sh -c`), if anything (`TOOLMESH_SKILL_RUNNER_COMMAND`).
    pub skill_runner: Option<String>,
    /// Where the session registry lives (`TOOLMESH_SANDBOX_REGISTRY`).
    pub registry: crate::registry::RegistryStore,
    /// Copies of the registry bucket a NATS cluster keeps (`TOOLMESH_STREAM_REPLICAS`).
    pub registry_replicas: usize,
    /// The JetStream domain of the registry bucket (`TOOLMESH_JETSTREAM_DOMAIN`).
    pub registry_domain: Option<String>,
}

impl SandboxConfig {
    /// Reads the sandbox variables; the sandbox folder is under `data_dir`
    /// (`TOOLMESH_DATA_DIR`) unless `TOOLMESH_SANDBOX_DIR` says otherwise.
    pub fn from_env(env: &RawEnv, data_dir: &Path) -> Result<SandboxConfig, ConfigError> {
        let image = env
            .get("TOOLMESH_SANDBOX_IMAGE")
            .unwrap_or(DEFAULT_SANDBOX_IMAGE)
            .to_owned();
        let mut allowed_images = env.list("TOOLMESH_SANDBOX_IMAGES");
        if !allowed_images.contains(&image) {
            allowed_images.push(image.clone());
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let sandbox_dir = env
            .get("TOOLMESH_SANDBOX_DIR")
            .map_or_else(|| data_dir.join("sandboxes"), PathBuf::from);
        Ok(SandboxConfig {
            backend: env.parse("TOOLMESH_SANDBOX_BACKEND", SandboxBackend::Docker)?,
            docker_commands: env
                .parse("TOOLMESH_SANDBOX_DOCKER_COMMANDS", DockerCommands::Spawner)?,
            image,
            memory_mb: env.parse("TOOLMESH_SANDBOX_MEMORY_MB", DEFAULT_SANDBOX_MEMORY_MB)?,
            pids: env.parse("TOOLMESH_SANDBOX_PIDS", DEFAULT_SANDBOX_PIDS)?,
            cpus: env.parse("TOOLMESH_SANDBOX_CPUS", DEFAULT_SANDBOX_CPUS)?,
            network: env
                .get("TOOLMESH_SANDBOX_NETWORK")
                .unwrap_or("none")
                .to_owned(),
            egress_join: env
                .get("TOOLMESH_SANDBOX_EGRESS_JOIN")
                .filter(|v| !v.is_empty())
                .map(str::to_owned),
            allowed_images,
            dir: sandbox_dir,
            max_sessions: env.parse(
                "TOOLMESH_SANDBOX_MAX_SESSIONS",
                DEFAULT_SANDBOX_MAX_SESSIONS,
            )?,
            max_sessions_per_account: sessions_per_account(env)?,
            idle_ttl: Duration::from_secs(
                env.parse("TOOLMESH_SANDBOX_IDLE_TTL_S", DEFAULT_SANDBOX_IDLE_TTL_S)?,
            ),
            warm: env.parse("TOOLMESH_SANDBOX_WARM", DEFAULT_SANDBOX_WARM)?,
            concurrency: env.parse("TOOLMESH_SANDBOX_CONCURRENCY", 2 * cores)?.max(1),
            tmpfs_mb: env.parse("TOOLMESH_SANDBOX_TMPFS_MB", DEFAULT_SANDBOX_TMPFS_MB)?,
            disk_mb: env.parse("TOOLMESH_SANDBOX_DISK_MB", DEFAULT_SANDBOX_DISK_MB)?,
            disk_required: env.flag("TOOLMESH_SANDBOX_DISK_REQUIRED", true)?,
            default_timeout: Duration::from_secs(
                env.parse("TOOLMESH_SANDBOX_TIMEOUT_S", DEFAULT_SANDBOX_TIMEOUT_S)?,
            ),
            sync_max_files: env.parse("TOOLMESH_SANDBOX_SYNC_MAX_FILES", DEFAULT_SYNC_MAX_FILES)?,
            sync_max_file_bytes: env.parse(
                "TOOLMESH_SANDBOX_SYNC_MAX_FILE_BYTES",
                DEFAULT_SYNC_MAX_FILE_BYTES,
            )?,
            sync_max_total_bytes: env.parse(
                "TOOLMESH_SANDBOX_SYNC_MAX_TOTAL_BYTES",
                DEFAULT_SYNC_MAX_TOTAL_BYTES,
            )?,
            sync_max_entries: env.parse(
                "TOOLMESH_SANDBOX_SYNC_MAX_ENTRIES",
                DEFAULT_SYNC_MAX_ENTRIES,
            )?,
            sync_max_depth: env.parse("TOOLMESH_SANDBOX_SYNC_MAX_DEPTH", DEFAULT_SYNC_MAX_DEPTH)?,
            output_max_bytes: env.parse(
                "TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES",
                DEFAULT_SANDBOX_OUTPUT_MAX_BYTES,
            )?,
            session_output_max_bytes: env.parse(
                "TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES",
                DEFAULT_SANDBOX_SESSION_OUTPUT_MAX_BYTES,
            )?,
            worker_output_max_bytes: env.parse(
                "TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES",
                DEFAULT_SANDBOX_WORKER_OUTPUT_MAX_BYTES,
            )?,
            skill_runner: env.get("TOOLMESH_SKILL_RUNNER_COMMAND").map(str::to_owned),
            registry: env.parse(
                "TOOLMESH_SANDBOX_REGISTRY",
                crate::registry::RegistryStore::Redis,
            )?,
            registry_replicas: toolmesh_kernel::config::stream_replicas(env)?,
            registry_domain: toolmesh_kernel::config::jetstream_domain(env)?,
        })
    }
}

/// `TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT`: a positive number; unset, half of
/// `TOOLMESH_SANDBOX_MAX_SESSIONS` (at least 1). A value above `TOOLMESH_SANDBOX_MAX_SESSIONS`
/// counts as that: one account may then fill the worker (a deployment of one account sets it
/// as high as it likes).
fn sessions_per_account(env: &RawEnv) -> Result<usize, ConfigError> {
    const KEY: &str = "TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT";
    let max: usize = env.parse(
        "TOOLMESH_SANDBOX_MAX_SESSIONS",
        DEFAULT_SANDBOX_MAX_SESSIONS,
    )?;
    let quota: usize = env.parse_nonzero(
        KEY,
        (max / 2).max(1),
        "an account must be allowed at least one session",
    )?;
    Ok(quota.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmesh_kernel::config::assert_bad_values_named;

    fn config(pairs: &[(&str, &str)]) -> Result<SandboxConfig, ConfigError> {
        SandboxConfig::from_env(
            &RawEnv::from_pairs(pairs.iter().copied()),
            Path::new("./data"),
        )
    }

    #[test]
    fn defaults_work_for_one_machine() {
        let config = config(&[]).unwrap();
        assert_eq!(config.backend, SandboxBackend::Docker);
        assert_eq!(config.docker_commands, DockerCommands::Spawner);
        assert_eq!(config.allowed_images, [DEFAULT_SANDBOX_IMAGE]);
        assert_eq!(config.dir, Path::new("./data/sandboxes"));
        assert!(config.concurrency >= 1);
        assert_eq!(config.skill_runner, None);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases = [
            ("TOOLMESH_SANDBOX_BACKEND", "vm"),
            ("TOOLMESH_SANDBOX_DOCKER_COMMANDS", "ssh"),
            ("TOOLMESH_SANDBOX_DISK_REQUIRED", "maybe"),
            ("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "0"),
            ("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "half"),
            ("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "-1"),
        ];
        assert_bad_values_named(&cases, |env| {
            SandboxConfig::from_env(env, Path::new("./data"))
        });
    }

    #[test]
    fn an_account_gets_half_a_worker_unless_told_otherwise() {
        let quota = |pairs: &[(&str, &str)]| config(pairs).unwrap().max_sessions_per_account;
        assert_eq!(quota(&[]), DEFAULT_SANDBOX_MAX_SESSIONS / 2);
        assert_eq!(quota(&[("TOOLMESH_SANDBOX_MAX_SESSIONS", "9")]), 4);
        assert_eq!(quota(&[("TOOLMESH_SANDBOX_MAX_SESSIONS", "1")]), 1);
        let set = ("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "3");
        assert_eq!(quota(&[set, ("TOOLMESH_SANDBOX_MAX_SESSIONS", "8")]), 3);
        // Above the worker's cap: the worker's cap.
        let high = ("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "100");
        assert_eq!(quota(&[high, ("TOOLMESH_SANDBOX_MAX_SESSIONS", "8")]), 8);
    }

    #[test]
    fn the_image_is_always_allowed_and_the_folder_may_be_elsewhere() {
        let config = config(&[
            ("TOOLMESH_SANDBOX_IMAGE", "py:1"),
            ("TOOLMESH_SANDBOX_IMAGES", "node:2, py:1"),
            ("TOOLMESH_SANDBOX_DIR", "/srv/sandboxes"),
        ])
        .unwrap();
        assert_eq!(config.allowed_images, ["node:2", "py:1"]);
        assert_eq!(config.dir, Path::new("/srv/sandboxes"));
    }
}
