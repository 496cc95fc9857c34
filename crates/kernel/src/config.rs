//! Configuration from the environment variables of PROTOCOL.md, validated once at startup: the
//! raw layer every config reads, and the part of it every node shares.
//!
//! `RawEnv` is the raw layer (a snapshot of `TOOLMESH_*`, so tests can build one), with the
//! parsing helpers and the [`ConfigError`] of every config. The typed `NodeConfig` holds only
//! what is shared whatever the node's roles: how to reach NATS (its URL, credentials included)
//! and Redis, the node's identity, the data dir, the limits of the wire (the reply text budget,
//! where replies may go, the RunEvents stream) and the drain bound.
//!
//! What belongs here is what more than one crate reads. A setting one actor alone reads belongs
//! to that actor's crate, in a `config.rs` of its own (`…Config::from_env(&RawEnv)`, its
//! defaults and checks) beside a `variables.rs` listing its variables: the gateway's policy,
//! the approval, sandbox, skills and web settings, the bridge's servers, the MCP front's and the
//! console's. The node builds each with its crate's constructor (`src/configs.rs`).
//!
//! A setting too large for a variable lives in a file the variable names (the bridge's servers,
//! the sandbox templates): [`ConfigFile::read`] reads it, and a [`FileError`] names the
//! variable, the file and the field at fault.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::policy::PolicyError;
use crate::replies::ReplyPrefixes;

mod variables;
/// The variables read here, in `audit`, `listener` and `metrics`, for the configuration
/// reference ([`crate::settings`]).
pub use variables::VARIABLES;

pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
/// Copies of each stream the nodes keep (`TOOLMESH_STREAM_REPLICAS`): one, for one server.
pub const DEFAULT_STREAM_REPLICAS: usize = 1;
/// The most copies JetStream keeps of a stream.
pub const MAX_STREAM_REPLICAS: usize = 5;
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const DEFAULT_DATA_DIR: &str = "./data";
pub const DEFAULT_RESULT_BUDGET_CHARS: usize = 20_000;
pub const DEFAULT_DRAIN_TIMEOUT_S: u64 = 30;
/// How long `TOOLMESH_EVENTS` keeps a RunEvent (`TOOLMESH_EVENTS_MAX_AGE_S`): a day.
pub const DEFAULT_EVENTS_MAX_AGE_S: u64 = 86_400;
/// Bytes `TOOLMESH_EVENTS` keeps at most (`TOOLMESH_EVENTS_MAX_BYTES`; 0: no limit): 1 GiB, the
/// oldest events go first.
pub const DEFAULT_EVENTS_MAX_BYTES: u64 = 1024 * 1024 * 1024;

/// A snapshot of the process environment (or a map in tests).
#[derive(Debug, Clone, Default)]
pub struct RawEnv(HashMap<String, String>);

/// A secret setting (a token, an API key): kept whole for its one use, never shown by `Debug`,
/// so a config or client printed in a log or a panic message carries no credential.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// For the tests of a variable table: sets each variable that has a literal default to that
/// literal, one at a time, and asserts that what `read` builds from that environment is what
/// it builds from an empty one. Returns how many variables have a literal default.
pub fn assert_literal_defaults_change_nothing(
    table: &'static [crate::settings::Variable],
    read: impl Fn(&RawEnv) -> String,
) -> usize {
    let unset = read(&RawEnv::default());
    let mut literals = 0;
    for var in table {
        let Some(literal) = var.literal_default() else {
            continue;
        };
        let set = read(&RawEnv::from_pairs([(var.name, literal)]));
        assert_eq!(set, unset, "{}={literal} is not the default", var.name);
        literals += 1;
    }
    literals
}

/// For the tests of a variable reader: sets each `(variable, value)` alone and asserts that
/// `read` refuses that environment with an error naming the variable.
#[track_caller]
pub fn assert_bad_values_named<T, E: std::fmt::Display>(
    cases: &[(&str, &str)],
    read: impl Fn(&RawEnv) -> Result<T, E>,
) {
    for &(key, value) in cases {
        match read(&RawEnv::from_pairs([(key, value)])) {
            Ok(_) => panic!("{key}={value} was accepted"),
            Err(e) => assert!(e.to_string().contains(key), "{e}"),
        }
    }
}

/// For the tests of a settings file's parser: asserts that `parsed`, what became of `text`, is
/// refused naming `field`, with a reason containing `why`.
#[track_caller]
pub fn assert_refused_at<T: std::fmt::Debug>(
    parsed: Result<T, Unplaced>,
    text: &str,
    field: &str,
    why: &str,
) {
    match parsed {
        Err(Unplaced::Field { field: got, reason }) => {
            assert_eq!(got, field, "{text}: {reason}");
            assert!(reason.contains(why), "{text}: {reason}");
        }
        other => panic!("{text}: expected a field error, got {other:?}"),
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(redacted)")
    }
}

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

    /// This environment with `key` set to `value`: a command-line flag that overrides its
    /// variable.
    pub fn with(mut self, key: &str, value: &str) -> Self {
        self.0.insert(key.to_owned(), value.to_owned());
        self
    }

    /// The value, with empty strings treated as unset.
    /// A secret setting ([`Secret`]), unset when empty.
    pub fn secret(&self, key: &str) -> Option<Secret> {
        self.get(key).map(Secret::new)
    }

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

    /// A number as [`Self::parse`] reads it, which may not be 0: `zero` says why.
    pub fn parse_nonzero<T>(
        &self,
        key: &'static str,
        default: T,
        zero: &str,
    ) -> Result<T, ConfigError>
    where
        T: std::str::FromStr + From<u8> + PartialEq,
        T::Err: std::fmt::Display,
    {
        let value = self.parse(key, default)?;
        if value == T::from(0) {
            return Err(ConfigError::Invalid {
                key,
                value: "0".into(),
                reason: zero.into(),
            });
        }
        Ok(value)
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

/// What `parse` makes of the text of the file at `path`; the error says why, without the path.
pub fn parse_file<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    parse(&text)
}

/// A file of settings named by a variable: the variable and the file's format, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigFile {
    /// The variable naming the file.
    pub var: &'static str,
    /// The file's format as a message names it (`JSON`, `TOML`).
    pub format: &'static str,
}

impl ConfigFile {
    /// Reads the file at `path` and parses its text with `parse`; an error names the variable
    /// and the file.
    pub fn read<T>(
        self,
        path: &Path,
        parse: impl FnOnce(&str) -> Result<T, Unplaced>,
    ) -> Result<T, FileError> {
        let text = std::fs::read_to_string(path).map_err(|e| FileError::Read {
            var: self.var,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        parse(&text).map_err(|e| e.at(self, path))
    }
}

/// A settings file the node cannot use, naming where in the file; the node does not start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FileError {
    #[error("{var}: cannot read {path}: {reason}")]
    Read {
        var: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{var} ({path}): not {format}: {reason}")]
    Syntax {
        var: &'static str,
        format: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{var} ({path}): {field}: {reason}")]
    Field {
        var: &'static str,
        path: PathBuf,
        field: String,
        reason: String,
    },
}

/// What is wrong with a settings file's text, before the file's path is known.
#[derive(Debug, Clone, PartialEq)]
pub enum Unplaced {
    /// Not in the file's format: the parser's reason.
    Syntax(String),
    /// A field the file holds, or lacks, and why it cannot be used.
    Field { field: String, reason: String },
}

impl Unplaced {
    pub fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Unplaced::Field {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// This error, placed in the file at `path`.
    pub fn at(self, file: ConfigFile, path: &Path) -> FileError {
        let (var, path) = (file.var, path.to_owned());
        match self {
            Unplaced::Syntax(reason) => FileError::Syntax {
                var,
                format: file.format,
                path,
                reason,
            },
            Unplaced::Field { field, reason } => FileError::Field {
                var,
                path,
                field,
                reason,
            },
        }
    }
}

/// What every node reads from its environment, whatever its roles.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: Option<String>,
    /// `TOOLMESH_NATS_URL`: one server, or several of one cluster.
    pub nats_url: crate::nats_url::NatsUrl,
    /// Redis: one server or the primary of a set of sentinels, and what a write acknowledged
    /// to a caller waits for.
    pub redis: crate::redis_link::RedisConfig,
    pub data_dir: PathBuf,
    pub result_budget_chars: usize,
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
            nats_url: nats_url(env.get("TOOLMESH_NATS_URL"), "TOOLMESH_NATS_URL")?,
            redis: crate::redis_link::RedisConfig::from_env(env)?,
            data_dir,
            result_budget_chars: env
                .parse("TOOLMESH_RESULT_BUDGET_CHARS", DEFAULT_RESULT_BUDGET_CHARS)?,
            drain_timeout: Duration::from_secs(
                env.parse("TOOLMESH_DRAIN_TIMEOUT_S", DEFAULT_DRAIN_TIMEOUT_S)?,
            ),
            events: events_config(env)?,
            reply_prefixes: reply_prefixes(env)?,
        })
    }
}

/// A NATS URL list ([`NatsUrl`](crate::nats_url::NatsUrl)) from `key` (a variable, or a flag
/// and its variable), [`DEFAULT_NATS_URL`] when unset. The value in an error is shown with
/// its credentials hidden.
pub fn nats_url(
    raw: Option<&str>,
    key: &'static str,
) -> Result<crate::nats_url::NatsUrl, ConfigError> {
    let raw = raw.unwrap_or(DEFAULT_NATS_URL);
    crate::nats_url::NatsUrl::parse(raw).map_err(|e| ConfigError::Invalid {
        key,
        value: raw
            .split(',')
            .map(|u| crate::nats_url::redact(u.trim()))
            .collect::<Vec<_>>()
            .join(","),
        reason: e.to_string(),
    })
}

/// `TOOLMESH_STREAM_REPLICAS`: how many servers of a NATS cluster keep a copy of
/// `TOOLMESH_EVENTS` and `TOOLMESH_AUDIT`, 1 to [`MAX_STREAM_REPLICAS`].
pub fn stream_replicas(env: &RawEnv) -> Result<usize, ConfigError> {
    const KEY: &str = "TOOLMESH_STREAM_REPLICAS";
    let replicas: usize = env.parse(KEY, DEFAULT_STREAM_REPLICAS)?;
    if !(1..=MAX_STREAM_REPLICAS).contains(&replicas) {
        return Err(ConfigError::Invalid {
            key: KEY,
            value: replicas.to_string(),
            reason: format!("JetStream keeps 1 to {MAX_STREAM_REPLICAS} copies of a stream"),
        });
    }
    Ok(replicas)
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
    let max_age_s: u64 = env.parse_nonzero(
        "TOOLMESH_EVENTS_MAX_AGE_S",
        DEFAULT_EVENTS_MAX_AGE_S,
        "an event must be kept at least one second",
    )?;
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
        replicas: stream_replicas(env)?,
        domain: jetstream_domain(env)?,
        durability: Default::default(),
    })
}

/// `TOOLMESH_JETSTREAM_DOMAIN`: the JetStream domain of the cluster's servers, for a node that
/// reaches them through a leaf node (a worker site); unset, the JetStream of the server the
/// node is connected to. Letters, digits, `-` and `_`.
pub fn jetstream_domain(env: &RawEnv) -> Result<Option<String>, ConfigError> {
    const KEY: &str = "TOOLMESH_JETSTREAM_DOMAIN";
    let Some(domain) = env.get(KEY) else {
        return Ok(None);
    };
    if !domain
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ConfigError::Invalid {
            key: KEY,
            value: domain.to_owned(),
            reason: "a JetStream domain is letters, digits, '-' and '_'".to_owned(),
        });
    }
    Ok(Some(domain.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_errors_name_the_variable_the_file_and_the_field() {
        let file = ConfigFile {
            var: "X_FILE",
            format: "JSON",
        };
        let path = Path::new("/nonexistent/x.json");
        let read = file.read(path, |_| Ok(())).unwrap_err();
        assert!(
            read.to_string()
                .starts_with("X_FILE: cannot read /nonexistent/x.json: "),
            "{read}"
        );
        let syntax = Unplaced::Syntax("eof".into()).at(file, path);
        assert_eq!(
            syntax.to_string(),
            "X_FILE (/nonexistent/x.json): not JSON: eof"
        );
        let field = Unplaced::field("a.b", "must be a string").at(file, path);
        assert_eq!(
            field.to_string(),
            "X_FILE (/nonexistent/x.json): a.b: must be a string"
        );
    }

    #[test]
    fn defaults_work_for_one_machine() {
        let config = NodeConfig::from_env(&RawEnv::default()).unwrap();
        assert_eq!(config.nats_url.to_string(), DEFAULT_NATS_URL);
        assert_eq!(config.drain_timeout, Duration::from_secs(30));
        assert_eq!(config.events.replicas, 1);
    }

    #[test]
    fn lists_are_comma_separated_and_flags_are_words() {
        let env = RawEnv::from_pairs([("LIST", " a, b,,c "), ("ON", "yes"), ("BAD", "maybe")]);
        assert_eq!(env.list("LIST"), ["a", "b", "c"]);
        assert!(env.list("UNSET").is_empty());
        assert!(env.flag("ON", false).unwrap());
        assert!(!env.flag("UNSET", false).unwrap());
        let err = env.flag("BAD", true).unwrap_err();
        assert!(err.to_string().contains("BAD"), "{err}");
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases = [
            ("TOOLMESH_DRAIN_TIMEOUT_S", "-3"),
            ("TOOLMESH_RESULT_BUDGET_CHARS", "lots"),
            ("TOOLMESH_EVENTS_MAX_AGE_S", "0"),
            ("TOOLMESH_STREAM_REPLICAS", "0"),
            ("TOOLMESH_STREAM_REPLICAS", "6"),
            ("TOOLMESH_STREAM_REPLICAS", "three"),
            ("TOOLMESH_JETSTREAM_DOMAIN", "hub.site"),
            ("TOOLMESH_NATS_URL", "nats://a:4222,"),
            ("TOOLMESH_NATS_URL", "http://a:80"),
        ];
        assert_bad_values_named(&cases, NodeConfig::from_env);
    }

    #[test]
    fn a_nats_url_list_names_every_server_and_hides_its_password() {
        let env = RawEnv::from_pairs([
            (
                "TOOLMESH_NATS_URL",
                "nats://toolmesh:s3cret@nats-1:4222, nats://nats-2:4222,nats://nats-3:4222",
            ),
            ("TOOLMESH_STREAM_REPLICAS", "3"),
        ]);
        let config = NodeConfig::from_env(&env).unwrap();
        assert_eq!(config.nats_url.servers().len(), 3);
        assert_eq!(config.nats_url.credentials(), Some(("toolmesh", "s3cret")));
        assert_eq!(config.events.replicas, 3);
        assert!(!format!("{config:?}").contains("s3cret"));
        let bad = RawEnv::from_pairs([(
            "TOOLMESH_NATS_URL",
            "nats://toolmesh:s3cret@nats-1:4222,,nats://nats-3:4222",
        )]);
        let err = NodeConfig::from_env(&bad).unwrap_err().to_string();
        assert!(err.contains("TOOLMESH_NATS_URL"), "{err}");
        assert!(err.contains("server 2 of the list is empty"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }
}
