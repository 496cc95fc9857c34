//! The approval actor's configuration ([`ApprovalConfig`]): whether a caller may decide its own
//! call in band, how long an approval lives and stays readable, and how many one account may
//! have pending. Read from `TOOLMESH_APPROVAL_*` once at start.

use std::time::Duration;

use toolmesh_kernel::config::{ConfigError, RawEnv};

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

    #[test]
    fn defaults_work_for_one_machine() {
        let config = ApprovalConfig::from_env(&RawEnv::default()).unwrap();
        assert!(config.in_band);
        assert_eq!(config.ttl, Duration::from_secs(3600));
        assert_eq!(config.max_pending, DEFAULT_APPROVAL_MAX_PENDING);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (key, value) in [
            ("TOOLMESH_APPROVAL_IN_BAND", "maybe"),
            ("TOOLMESH_APPROVAL_TTL_S", "0"),
            ("TOOLMESH_APPROVAL_RETENTION_S", "a week"),
            ("TOOLMESH_APPROVAL_MAX_PENDING", "0"),
        ] {
            let err = ApprovalConfig::from_env(&RawEnv::from_pairs([(key, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }
}
