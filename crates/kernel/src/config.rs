//! Configuration from the environment variables of PROTOCOL.md, validated once at startup.
//!
//! `RawEnv` is the raw layer (a snapshot of `TOOLMESH_*`, so tests can build one); the typed
//! `NodeConfig` holds durations, URLs and limits, and each actor takes the part it needs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::policy::PolicyError;
use crate::replies::ReplyPrefixes;

mod variables;
/// The variables read here, in `audit`, `listener` and `metrics`, for the configuration
/// reference ([`crate::settings`]).
pub use variables::VARIABLES;

pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const DEFAULT_DATA_DIR: &str = "./data";
pub const DEFAULT_RESULT_BUDGET_CHARS: usize = 20_000;
pub const DEFAULT_SANDBOX_IMAGE: &str = "toolmesh/sandbox:latest";
pub const DEFAULT_SKILLS_DIR: &str = "./skills";
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
pub const DEFAULT_SKILL_MAX_BYTES: u64 = 256 * 1024 * 1024;
pub const DEFAULT_SKILL_MAX_ENTRIES: u64 = 10_000;
/// How long one Skill Service request or archive download may take.
pub const DEFAULT_SKILL_DOWNLOAD_TIMEOUT_S: u64 = 120;
pub const DEFAULT_DRAIN_TIMEOUT_S: u64 = 30;
/// How long `TOOLMESH_EVENTS` keeps a RunEvent (`TOOLMESH_EVENTS_MAX_AGE_S`): a day.
pub const DEFAULT_EVENTS_MAX_AGE_S: u64 = 86_400;
/// Bytes `TOOLMESH_EVENTS` keeps at most (`TOOLMESH_EVENTS_MAX_BYTES`; 0: no limit): 1 GiB, the
/// oldest events go first.
pub const DEFAULT_EVENTS_MAX_BYTES: u64 = 1024 * 1024 * 1024;

/// A snapshot of the process environment (or a map in tests).
#[derive(Debug, Clone, Default)]
pub struct RawEnv(HashMap<String, String>);

impl RawEnv {
    pub fn from_process() -> Self {
        Self(
            std::env::vars()
                .filter(|(k, _)| k.starts_with("TOOLMESH_"))
                .collect(),
        )
    }

    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The value, with empty strings treated as unset.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    pub fn parse<T: std::str::FromStr>(
        &self,
        key: &'static str,
        default: T,
    ) -> Result<T, ConfigError>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(key) {
            None => Ok(default),
            Some(raw) => raw
                .trim()
                .parse()
                .map_err(|e: T::Err| ConfigError::Invalid {
                    key,
                    value: raw.to_owned(),
                    reason: e.to_string(),
                }),
        }
    }

    /// A switch: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`.
    pub fn flag(&self, key: &'static str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key).map(str::trim) {
            None => Ok(default),
            Some("1" | "true" | "yes" | "on") => Ok(true),
            Some("0" | "false" | "no" | "off") => Ok(false),
            Some(other) => Err(ConfigError::Invalid {
                key,
                value: other.to_owned(),
                reason: "use 1 or 0".into(),
            }),
        }
    }

    /// A comma-separated list, blanks dropped.
    pub fn list(&self, key: &str) -> Vec<String> {
        self.get(key)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{key}={value:?} is not valid: {reason}")]
    Invalid {
        key: &'static str,
        value: String,
        reason: String,
    },
    #[error(transparent)]
    Policy(#[from] PolicyError),
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

impl std::str::FromStr for SandboxBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "docker" => Ok(SandboxBackend::Docker),
            "process" => Ok(SandboxBackend::Process),
            other => Err(format!(
                "unknown sandbox backend {other:?}; use docker or process"
            )),
        }
    }
}

/// How the Docker backend runs a command in a session's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DockerCommands {
    /// A spawner started as the container's command forks each one (about a millisecond):
    /// the default; the image must run the worker's own binary (glibc).
    Spawner,
    /// `docker exec` each one (tens of milliseconds): for images that cannot run the spawner.
    Exec,
}

impl std::str::FromStr for DockerCommands {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "spawner" => Ok(DockerCommands::Spawner),
            "exec" => Ok(DockerCommands::Exec),
            other => Err(format!(
                "unknown way to run Docker commands {other:?}; use spawner or exec"
            )),
        }
    }
}

/// Sandbox settings that other actors also report (component_status).
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
}

/// Skill settings.
#[derive(Debug, Clone)]
pub struct SkillsConfig {
    pub dir: PathBuf,
    pub service_url: Option<String>,
    pub space_ids: Vec<String>,
    pub service_token: Option<String>,
    pub runner_command: Option<String>,
    pub allow_hash_mismatch: bool,
    pub max_bytes: u64,
    pub max_entries: u64,
    /// Public spaces that expose only some of their skills
    /// (`TOOLMESH_SKILL_SPACE_ALLOWLISTS=space=skill-a|skill-b,other=skill-c`): a space named
    /// here lists only the skills named for it; other spaces list all their active skills.
    pub space_allowlists: Vec<(String, Vec<String>)>,
    /// `TOOLMESH_SKILL_DOWNLOAD_TIMEOUT_S`: one Skill Service request or archive download.
    pub download_timeout: Duration,
    /// `TOOLMESH_SKILL_ALLOWED_NETWORKS`: networks an archive URL (or a redirect) may reach
    /// although they are not public; the Skill Service's own origin is always reachable.
    pub allowed_networks: Vec<String>,
}

/// Everything a node reads from its environment.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: Option<String>,
    pub nats_url: String,
    pub redis_url: String,
    pub data_dir: PathBuf,
    pub result_budget_chars: usize,
    pub sandbox: SandboxConfig,
    pub skills: SkillsConfig,
    pub drain_timeout: Duration,
    /// The limits of the RunEvents stream and what the node found at start.
    pub events: crate::streams::EventsConfig,
    /// Where the node answers requests (PROTOCOL.md "Tenancy and trust").
    pub reply_prefixes: ReplyPrefixes,
}

impl NodeConfig {
    pub fn from_env(env: &RawEnv) -> Result<NodeConfig, ConfigError> {
        let data_dir = PathBuf::from(env.get("TOOLMESH_DATA_DIR").unwrap_or(DEFAULT_DATA_DIR));
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
        Ok(NodeConfig {
            node_id: env.get("TOOLMESH_NODE_ID").map(str::to_owned),
            nats_url: env
                .get("TOOLMESH_NATS_URL")
                .unwrap_or(DEFAULT_NATS_URL)
                .to_owned(),
            redis_url: env
                .get("TOOLMESH_REDIS_URL")
                .unwrap_or(DEFAULT_REDIS_URL)
                .to_owned(),
            data_dir,
            result_budget_chars: env
                .parse("TOOLMESH_RESULT_BUDGET_CHARS", DEFAULT_RESULT_BUDGET_CHARS)?,
            sandbox: SandboxConfig {
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
                sync_max_files: env
                    .parse("TOOLMESH_SANDBOX_SYNC_MAX_FILES", DEFAULT_SYNC_MAX_FILES)?,
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
                sync_max_depth: env
                    .parse("TOOLMESH_SANDBOX_SYNC_MAX_DEPTH", DEFAULT_SYNC_MAX_DEPTH)?,
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
            },
            skills: SkillsConfig {
                dir: PathBuf::from(env.get("TOOLMESH_SKILLS_DIR").unwrap_or(DEFAULT_SKILLS_DIR)),
                service_url: env.get("TOOLMESH_SKILL_SERVICE_URL").map(str::to_owned),
                space_ids: env.list("TOOLMESH_SKILL_SPACE_IDS"),
                service_token: env.get("TOOLMESH_SKILL_SERVICE_TOKEN").map(str::to_owned),
                runner_command: env.get("TOOLMESH_SKILL_RUNNER_COMMAND").map(str::to_owned),
                allow_hash_mismatch: env.flag("TOOLMESH_SKILL_ALLOW_HASH_MISMATCH", false)?,
                max_bytes: env.parse("TOOLMESH_SKILL_MAX_BYTES", DEFAULT_SKILL_MAX_BYTES)?,
                max_entries: env.parse("TOOLMESH_SKILL_MAX_ENTRIES", DEFAULT_SKILL_MAX_ENTRIES)?,
                space_allowlists: skill_allowlists(env)?,
                download_timeout: Duration::from_secs(env.parse(
                    "TOOLMESH_SKILL_DOWNLOAD_TIMEOUT_S",
                    DEFAULT_SKILL_DOWNLOAD_TIMEOUT_S,
                )?),
                allowed_networks: env.list("TOOLMESH_SKILL_ALLOWED_NETWORKS"),
            },
            drain_timeout: Duration::from_secs(
                env.parse("TOOLMESH_DRAIN_TIMEOUT_S", DEFAULT_DRAIN_TIMEOUT_S)?,
            ),
            events: events_config(env)?,
            reply_prefixes: reply_prefixes(env)?,
        })
    }
}

/// `TOOLMESH_REPLY_PREFIXES`: where the node answers (comma-separated; `_INBOX.` when unset).
fn reply_prefixes(env: &RawEnv) -> Result<ReplyPrefixes, ConfigError> {
    match env.get("TOOLMESH_REPLY_PREFIXES") {
        None => Ok(ReplyPrefixes::default()),
        Some(raw) => ReplyPrefixes::new(raw.split(',')).map_err(|e| ConfigError::Invalid {
            key: "TOOLMESH_REPLY_PREFIXES",
            value: raw.to_owned(),
            reason: e.to_string(),
        }),
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
    let quota: usize = env.parse(KEY, (max / 2).max(1))?;
    if quota == 0 {
        return Err(ConfigError::Invalid {
            key: KEY,
            value: "0".into(),
            reason: "an account must be allowed at least one session".into(),
        });
    }
    Ok(quota.min(max))
}

/// `TOOLMESH_EVENTS_MAX_AGE_S` (at least 1) and `TOOLMESH_EVENTS_MAX_BYTES` (0: no limit).
fn events_config(env: &RawEnv) -> Result<crate::streams::EventsConfig, ConfigError> {
    let max_age_s: u64 = env.parse("TOOLMESH_EVENTS_MAX_AGE_S", DEFAULT_EVENTS_MAX_AGE_S)?;
    if max_age_s == 0 {
        return Err(ConfigError::Invalid {
            key: "TOOLMESH_EVENTS_MAX_AGE_S",
            value: "0".into(),
            reason: "an event must be kept at least one second".into(),
        });
    }
    let max_bytes: u64 = env.parse("TOOLMESH_EVENTS_MAX_BYTES", DEFAULT_EVENTS_MAX_BYTES)?;
    if i64::try_from(max_bytes).is_err() {
        return Err(ConfigError::Invalid {
            key: "TOOLMESH_EVENTS_MAX_BYTES",
            value: max_bytes.to_string(),
            reason: format!("at most {}", i64::MAX),
        });
    }
    Ok(crate::streams::EventsConfig {
        max_age: Duration::from_secs(max_age_s),
        max_bytes: (max_bytes > 0).then_some(max_bytes),
        durability: Default::default(),
    })
}

/// `TOOLMESH_SKILL_SPACE_ALLOWLISTS`: `space=name|name,space2=name`.
fn skill_allowlists(env: &RawEnv) -> Result<Vec<(String, Vec<String>)>, ConfigError> {
    const KEY: &str = "TOOLMESH_SKILL_SPACE_ALLOWLISTS";
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for item in env.list(KEY) {
        let Some((space, names)) = item.split_once('=') else {
            return Err(ConfigError::Invalid {
                key: KEY,
                value: item,
                reason: "use space=skill|skill,other-space=skill".into(),
            });
        };
        let names = names
            .split('|')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned);
        let space = space.trim();
        match out.iter_mut().find(|(s, _)| s == space) {
            Some((_, list)) => list.extend(names),
            None => out.push((space.to_owned(), names.collect())),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_work_for_one_machine() {
        let config = NodeConfig::from_env(&RawEnv::default()).unwrap();
        assert_eq!(config.nats_url, DEFAULT_NATS_URL);
        assert_eq!(config.drain_timeout, Duration::from_secs(30));
        assert_eq!(config.sandbox.backend, SandboxBackend::Docker);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (key, value) in [
            ("TOOLMESH_DRAIN_TIMEOUT_S", "-3"),
            ("TOOLMESH_SANDBOX_BACKEND", "vm"),
            ("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "0"),
            ("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "half"),
            ("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "-1"),
        ] {
            let err = NodeConfig::from_env(&RawEnv::from_pairs([(key, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn an_account_gets_half_a_worker_unless_told_otherwise() {
        let quota = |pairs: &[(&str, &str)]| {
            let env = RawEnv::from_pairs(pairs.iter().copied());
            NodeConfig::from_env(&env)
                .unwrap()
                .sandbox
                .max_sessions_per_account
        };
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
    fn lists_are_comma_separated() {
        let env = RawEnv::from_pairs([("TOOLMESH_SKILL_SPACE_IDS", " a, b,,c ")]);
        let config = NodeConfig::from_env(&env).unwrap();
        assert_eq!(config.skills.space_ids, ["a", "b", "c"]);
    }

    #[test]
    fn skill_allowlists_name_skills_per_space() {
        let env = RawEnv::from_pairs([(
            "TOOLMESH_SKILL_SPACE_ALLOWLISTS",
            "public=a|b, other=c,public=d",
        )]);
        let config = NodeConfig::from_env(&env).unwrap();
        assert_eq!(
            config.skills.space_allowlists,
            [
                (
                    "public".to_owned(),
                    vec!["a".to_owned(), "b".into(), "d".into()]
                ),
                ("other".to_owned(), vec!["c".to_owned()])
            ]
        );
        let env = RawEnv::from_pairs([("TOOLMESH_SKILL_SPACE_ALLOWLISTS", "nope")]);
        assert!(NodeConfig::from_env(&env).is_err());
    }
}
