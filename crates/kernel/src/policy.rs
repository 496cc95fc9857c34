//! Risk policy: which calls need approval, from the mode and `TOOLMESH_POLICY_FILE`.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ids::Account;
use crate::wire::RiskLevel;

/// `TOOLMESH_TOOL_APPROVAL_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    Off,
    Standard,
    #[default]
    Strict,
}

impl ApprovalMode {
    pub fn needs_approval(self, risk: RiskLevel) -> bool {
        match self {
            ApprovalMode::Off => false,
            ApprovalMode::Standard => risk >= RiskLevel::High,
            ApprovalMode::Strict => risk >= RiskLevel::Medium,
        }
    }
}

impl FromStr for ApprovalMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(ApprovalMode::Off),
            "standard" => Ok(ApprovalMode::Standard),
            "strict" => Ok(ApprovalMode::Strict),
            other => Err(format!(
                "unknown approval mode {other:?}; use off, standard or strict"
            )),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    mode: Option<ApprovalMode>,
    #[serde(default)]
    accounts: HashMap<String, AccountPolicy>,
    #[serde(default)]
    tools: HashMap<String, ToolOverride>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AccountPolicy {
    mode: Option<ApprovalMode>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolOverride {
    risk_level: Option<RiskLevel>,
}

/// The effective policy of a deployment.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    mode: ApprovalMode,
    accounts: HashMap<String, ApprovalMode>,
    risk_overrides: HashMap<String, RiskLevel>,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("policy file {path} is not valid: {message}")]
    Invalid { path: String, message: String },
}

impl Policy {
    /// The mode from the environment, with the file (if any) on top.
    pub fn load(env_mode: ApprovalMode, file: Option<&Path>) -> Result<Policy, PolicyError> {
        let Some(path) = file else {
            return Ok(Policy::uniform(env_mode));
        };
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Policy::from_toml(env_mode, &text).map_err(|message| PolicyError::Invalid {
            path: path.display().to_string(),
            message,
        })
    }

    pub fn uniform(mode: ApprovalMode) -> Policy {
        Policy {
            mode,
            ..Policy::default()
        }
    }

    pub fn from_toml(env_mode: ApprovalMode, text: &str) -> Result<Policy, String> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut accounts = HashMap::new();
        for (name, policy) in file.accounts {
            Account::parse(name.as_str()).map_err(|e| format!("[accounts.{name}]: {e}"))?;
            if let Some(mode) = policy.mode {
                accounts.insert(name, mode);
            }
        }
        Ok(Policy {
            mode: file.mode.unwrap_or(env_mode),
            accounts,
            risk_overrides: file
                .tools
                .into_iter()
                .filter_map(|(tool, o)| o.risk_level.map(|r| (tool, r)))
                .collect(),
        })
    }

    pub fn mode_for(&self, account: &Account) -> ApprovalMode {
        self.accounts
            .get(account.as_str())
            .copied()
            .unwrap_or(self.mode)
    }

    /// The tool's risk with the file's override applied.
    pub fn risk_of(&self, tool: &str, default: RiskLevel) -> RiskLevel {
        self.risk_overrides.get(tool).copied().unwrap_or(default)
    }

    /// Tool names the file overrides (checked against the registry at startup).
    pub fn overridden_tools(&self) -> impl Iterator<Item = &str> {
        self.risk_overrides.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acct(s: &str) -> Account {
        Account::parse(s).unwrap()
    }

    #[test]
    fn modes_gate_the_documented_levels() {
        use RiskLevel::*;
        let check = |mode: ApprovalMode, expect: [bool; 4]| {
            let got = [Low, Medium, High, Critical].map(|r| mode.needs_approval(r));
            assert_eq!(got, expect, "{mode:?}");
        };
        check(ApprovalMode::Off, [false, false, false, false]);
        check(ApprovalMode::Standard, [false, false, true, true]);
        check(ApprovalMode::Strict, [false, true, true, true]);
    }

    #[test]
    fn file_overrides_mode_per_account_and_risk_per_tool() {
        let policy = Policy::from_toml(
            ApprovalMode::Off,
            r#"
mode = "strict"
[accounts.acme]
mode = "off"
[tools.run_command]
risk_level = "critical"
"#,
        )
        .unwrap();
        assert_eq!(policy.mode_for(&acct("acme")), ApprovalMode::Off);
        assert_eq!(policy.mode_for(&acct("other")), ApprovalMode::Strict);
        assert_eq!(
            policy.risk_of("run_command", RiskLevel::High),
            RiskLevel::Critical
        );
        assert_eq!(policy.risk_of("read", RiskLevel::Low), RiskLevel::Low);
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        assert!(Policy::from_toml(ApprovalMode::Strict, "mode = \"lax\"").is_err());
        assert!(
            Policy::from_toml(ApprovalMode::Strict, "[accounts.\"a.b\"]\nmode=\"off\"").is_err()
        );
        assert!(Policy::from_toml(ApprovalMode::Strict, "[tools.x]\nrisk_level=\"huge\"").is_err());
    }
}
