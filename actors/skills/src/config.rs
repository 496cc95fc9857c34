//! The skill loader's configuration ([`SkillsConfig`]): where local skills are, which Skill
//! Service and spaces remote ones come from, and the caps of a skill archive. Read from
//! `TOOLMESH_SKILLS_DIR` and `TOOLMESH_SKILL_*` once at start.
//!
//! `TOOLMESH_SKILL_RUNNER_COMMAND` is not here: `execute_skills` runs on the sandbox role, which
//! reads it.

use std::path::PathBuf;
use std::time::Duration;

use toolmesh_kernel::config::{ConfigError, RawEnv, Secret};

pub const DEFAULT_SKILLS_DIR: &str = "./skills";
pub const DEFAULT_SKILL_MAX_BYTES: u64 = 256 * 1024 * 1024;
pub const DEFAULT_SKILL_MAX_ENTRIES: u64 = 10_000;
/// How long one Skill Service request or archive download may take.
pub const DEFAULT_SKILL_DOWNLOAD_TIMEOUT_S: u64 = 120;

/// Skill settings.
#[derive(Debug, Clone)]
pub struct SkillsConfig {
    pub dir: PathBuf,
    pub service_url: Option<String>,
    pub space_ids: Vec<String>,
    pub service_token: Option<Secret>,
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

impl SkillsConfig {
    pub fn from_env(env: &RawEnv) -> Result<SkillsConfig, ConfigError> {
        Ok(SkillsConfig {
            dir: PathBuf::from(env.get("TOOLMESH_SKILLS_DIR").unwrap_or(DEFAULT_SKILLS_DIR)),
            service_url: env.get("TOOLMESH_SKILL_SERVICE_URL").map(str::to_owned),
            space_ids: env.list("TOOLMESH_SKILL_SPACE_IDS"),
            service_token: env.secret("TOOLMESH_SKILL_SERVICE_TOKEN"),
            allow_hash_mismatch: env.flag("TOOLMESH_SKILL_ALLOW_HASH_MISMATCH", false)?,
            max_bytes: env.parse("TOOLMESH_SKILL_MAX_BYTES", DEFAULT_SKILL_MAX_BYTES)?,
            max_entries: env.parse("TOOLMESH_SKILL_MAX_ENTRIES", DEFAULT_SKILL_MAX_ENTRIES)?,
            space_allowlists: space_allowlists(env)?,
            download_timeout: Duration::from_secs(env.parse(
                "TOOLMESH_SKILL_DOWNLOAD_TIMEOUT_S",
                DEFAULT_SKILL_DOWNLOAD_TIMEOUT_S,
            )?),
            allowed_networks: env.list("TOOLMESH_SKILL_ALLOWED_NETWORKS"),
        })
    }
}

/// `TOOLMESH_SKILL_SPACE_ALLOWLISTS`: `space=name|name,space2=name`.
fn space_allowlists(env: &RawEnv) -> Result<Vec<(String, Vec<String>)>, ConfigError> {
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
    use toolmesh_kernel::config::assert_bad_values_named;

    #[test]
    fn lists_are_comma_separated() {
        let env = RawEnv::from_pairs([("TOOLMESH_SKILL_SPACE_IDS", " a, b,,c ")]);
        let config = SkillsConfig::from_env(&env).unwrap();
        assert_eq!(config.space_ids, ["a", "b", "c"]);
    }

    #[test]
    fn skill_allowlists_name_skills_per_space() {
        let env = RawEnv::from_pairs([(
            "TOOLMESH_SKILL_SPACE_ALLOWLISTS",
            "public=a|b, other=c,public=d",
        )]);
        let config = SkillsConfig::from_env(&env).unwrap();
        assert_eq!(
            config.space_allowlists,
            [
                (
                    "public".to_owned(),
                    vec!["a".to_owned(), "b".into(), "d".into()]
                ),
                ("other".to_owned(), vec!["c".to_owned()])
            ]
        );
        let env = RawEnv::from_pairs([("TOOLMESH_SKILL_SPACE_ALLOWLISTS", "nope")]);
        assert!(SkillsConfig::from_env(&env).is_err());
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases = [
            ("TOOLMESH_SKILL_ALLOW_HASH_MISMATCH", "maybe"),
            ("TOOLMESH_SKILL_MAX_BYTES", "-1"),
            ("TOOLMESH_SKILL_DOWNLOAD_TIMEOUT_S", "soon"),
        ];
        assert_bad_values_named(&cases, SkillsConfig::from_env);
    }

    /// A config (or the client made from it) printed in a log must not carry the token.
    #[test]
    fn debug_output_never_shows_the_service_token() {
        let env = RawEnv::from_pairs([("TOOLMESH_SKILL_SERVICE_TOKEN", "tok-very-secret-4711")]);
        let config = SkillsConfig::from_env(&env).unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("tok-very-secret-4711"), "{shown}");
        let token = config.service_token.as_ref().map(Secret::expose);
        assert_eq!(token, Some("tok-very-secret-4711"));
    }
}
