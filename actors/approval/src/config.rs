//! The approval actor's configuration ([`ApprovalConfig`]): whether a caller may decide its own
//! call in band, how long an approval lives and stays readable, and how many one account may
//! have pending. Read from `TOOLMESH_APPROVAL_*` once at start.
//!
//! Its notifier's ([`NotifyConfig`]): the policy file's `[[notify]]` webhooks, the console's
//! address for links, and the web egress policy the posts go through. Read for the role only,
//! since it reads a file (as the bridge's, the MCP front's and the console's are).

use std::path::PathBuf;
use std::time::Duration;

use toolmesh_kernel::config::{ConfigError, RawEnv};
use toolmesh_kernel::egress::Egress;
use toolmesh_kernel::policy::{ApprovalMode, LivePolicy};
use url::Url;

pub const DEFAULT_APPROVAL_TTL_S: u64 = 3600;
/// Pending approvals per account (PROTOCOL.md "Tenancy and trust", "Bounded waiting rooms").
pub const DEFAULT_APPROVAL_MAX_PENDING: u64 = 1000;
/// How long decided/used/expired approvals stay readable through `get` (the audit window).
pub const DEFAULT_APPROVAL_RETENTION_S: u64 = 7 * 24 * 3600;

/// Approval settings.
#[derive(Debug, Clone)]
pub struct ApprovalConfig {
    /// `TOOLMESH_APPROVAL_IN_BAND`: whether a caller's own in-band decision counts.
    pub in_band: bool,
    pub ttl: Duration,
    pub retention: Duration,
    /// `TOOLMESH_APPROVAL_MAX_PENDING`: pending approvals one account may have at once.
    pub max_pending: u64,
}

impl ApprovalConfig {
    pub fn from_env(env: &RawEnv) -> Result<ApprovalConfig, ConfigError> {
        let ttl_s: u64 = env.parse_nonzero(
            "TOOLMESH_APPROVAL_TTL_S",
            DEFAULT_APPROVAL_TTL_S,
            "an approval must live at least one second",
        )?;
        Ok(ApprovalConfig {
            in_band: env.flag("TOOLMESH_APPROVAL_IN_BAND", true)?,
            ttl: Duration::from_secs(ttl_s),
            retention: Duration::from_secs(env.parse(
                "TOOLMESH_APPROVAL_RETENTION_S",
                DEFAULT_APPROVAL_RETENTION_S,
            )?),
            max_pending: max_pending(env)?,
        })
    }
}

/// What the notifier reads, validated once at start.
#[derive(Debug, Clone)]
pub struct NotifyConfig {
    /// `TOOLMESH_POLICY_FILE`, for its `[[notify]]` (read again on `SIGHUP`). The notifier
    /// needs no mode, so the mode is the default's; the gateway reads the same file for its own.
    pub policy: LivePolicy,
    /// `TOOLMESH_CONSOLE_URL`: the approvals console as people open it, for Slack's link.
    pub console_url: Option<Url>,
    /// `TOOLMESH_WEB_ALLOWED_NETWORKS` opening non-public addresses: the web egress policy.
    pub egress: Egress,
}

impl NotifyConfig {
    /// A bad policy file is refused with the gateway's message (both read it the same way).
    pub fn from_env(env: &RawEnv) -> Result<NotifyConfig, ConfigError> {
        let file = env.get("TOOLMESH_POLICY_FILE").map(PathBuf::from);
        let policy = LivePolicy::load(ApprovalMode::default(), file)?;
        let console_url = match env.get("TOOLMESH_CONSOLE_URL") {
            None => None,
            Some(raw) => Some(
                console_url(raw.trim()).map_err(|reason| ConfigError::Invalid {
                    key: "TOOLMESH_CONSOLE_URL",
                    value: raw.to_owned(),
                    reason,
                })?,
            ),
        };
        let networks = env.list("TOOLMESH_WEB_ALLOWED_NETWORKS");
        let egress = Egress::new(&networks).map_err(|reason| ConfigError::Invalid {
            key: "TOOLMESH_WEB_ALLOWED_NETWORKS",
            value: networks.join(","),
            reason,
        })?;
        Ok(NotifyConfig {
            policy,
            console_url,
            egress,
        })
    }
}

/// An `http` or `https` URL with a host and no credentials: it is shown to everyone a
/// notification reaches.
fn console_url(raw: &str) -> Result<Url, String> {
    let url = Url::parse(raw).map_err(|e| format!("not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err("not an http or https URL with a host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a link shown to people carries no credentials".into());
    }
    Ok(url)
}

/// `TOOLMESH_APPROVAL_MAX_PENDING`, at least 1.
fn max_pending(env: &RawEnv) -> Result<u64, ConfigError> {
    env.parse_nonzero(
        "TOOLMESH_APPROVAL_MAX_PENDING",
        DEFAULT_APPROVAL_MAX_PENDING,
        "an account must be able to ask for at least one approval",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmesh_kernel::config::assert_bad_values_named;

    #[test]
    fn defaults_work_for_one_machine() {
        let config = ApprovalConfig::from_env(&RawEnv::default()).unwrap();
        assert!(config.in_band);
        assert_eq!(config.ttl, Duration::from_secs(3600));
        assert_eq!(config.max_pending, DEFAULT_APPROVAL_MAX_PENDING);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases = [
            ("TOOLMESH_APPROVAL_IN_BAND", "maybe"),
            ("TOOLMESH_APPROVAL_TTL_S", "0"),
            ("TOOLMESH_APPROVAL_RETENTION_S", "a week"),
            ("TOOLMESH_APPROVAL_MAX_PENDING", "0"),
        ];
        assert_bad_values_named(&cases, ApprovalConfig::from_env);
    }

    #[test]
    fn the_notifier_reads_the_console_link_and_the_web_egress_policy() {
        let config = NotifyConfig::from_env(&RawEnv::default()).unwrap();
        assert!(config.console_url.is_none() && config.policy.current().notify().is_empty());
        let env = RawEnv::from_pairs([
            ("TOOLMESH_CONSOLE_URL", "https://approvals.example/"),
            ("TOOLMESH_WEB_ALLOWED_NETWORKS", "127.0.0.0/8"),
        ]);
        let config = NotifyConfig::from_env(&env).unwrap();
        assert_eq!(
            config.console_url.unwrap().as_str(),
            "https://approvals.example/"
        );
        assert!(config
            .egress
            .check_ip(std::net::Ipv4Addr::LOCALHOST.into())
            .is_ok());
        for (key, value) in [
            ("TOOLMESH_CONSOLE_URL", "approvals.example"),
            ("TOOLMESH_CONSOLE_URL", "ftp://approvals.example/"),
            ("TOOLMESH_CONSOLE_URL", "https://me:pw@approvals.example/"),
            ("TOOLMESH_WEB_ALLOWED_NETWORKS", "10.0.0.0/99"),
            ("TOOLMESH_POLICY_FILE", "/nonexistent/policy.toml"),
        ] {
            let err = NotifyConfig::from_env(&RawEnv::from_pairs([(key, value)])).unwrap_err();
            let named = if key == "TOOLMESH_POLICY_FILE" {
                value
            } else {
                key
            };
            assert!(err.to_string().contains(named), "{err}");
        }
    }
}
