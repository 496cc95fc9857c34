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
pub const DEFAULT_SKILLS_DIR: &str = "./skills";
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

/// Skill settings.
#[derive(Debug, Clone)]
pub struct SkillsConfig {
    pub dir: PathBuf,
    pub service_url: Option<String>,
    pub space_ids: Vec<String>,
    pub service_token: Option<String>,
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
            skills: SkillsConfig {
                dir: PathBuf::from(env.get("TOOLMESH_SKILLS_DIR").unwrap_or(DEFAULT_SKILLS_DIR)),
                service_url: env.get("TOOLMESH_SKILL_SERVICE_URL").map(str::to_owned),
                space_ids: env.list("TOOLMESH_SKILL_SPACE_IDS"),
                service_token: env.get("TOOLMESH_SKILL_SERVICE_TOKEN").map(str::to_owned),
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
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (key, value) in [
            ("TOOLMESH_DRAIN_TIMEOUT_S", "-3"),
            ("TOOLMESH_RESULT_BUDGET_CHARS", "lots"),
            ("TOOLMESH_EVENTS_MAX_AGE_S", "0"),
        ] {
            let err = NodeConfig::from_env(&RawEnv::from_pairs([(key, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
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
