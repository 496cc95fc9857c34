//! Risk policy: which calls need approval, from the mode and `TOOLMESH_POLICY_FILE`, and the
//! file's rules ([`rules`]) and reviewer groups (PROTOCOL.md "Approval policy").
//!
//! A tool's effective risk ([`Policy::risk_for`]) is the operator's `[tools.<name>]
//! risk_level` when the file sets one; otherwise the tool's own, which for a provider tool is
//! raised to its provider's `[providers.<service>] min_risk_level`. A provider's claim is only
//! ever an input below the operator's word: it cannot lower an override (the override
//! replaces it) or go under a floor (the higher of the two wins). A provider is code the
//! operator did not write, and its metadata is what it says about itself.

pub mod hooks;
pub mod rules;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use arc_swap::ArcSwap;

use serde::{Deserialize, Serialize};

pub use hooks::{Notify, NotifyEvent, NotifyFormat, Review, Reviewer};
pub use rules::{Conditions, Decision, Facts, Globs, OnTimeout, Rule, Rules};

use crate::ids::Account;
use crate::tools::{Runs, ToolSpec};
use crate::wire::RiskLevel;

/// `[A-Za-z0-9_-]{1,max}`.
fn is_token(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A reviewer's name, as a group lists it and `…decide.<approver>` carries it:
/// `[A-Za-z0-9_-]{1,64}`.
pub fn is_reviewer_name(name: &str) -> bool {
    is_token(name, 64)
}

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
    #[serde(default)]
    providers: HashMap<String, ProviderPolicy>,
    /// Checked by [`Rules::parse`], each naming its own faults.
    #[serde(default)]
    rules: Vec<toml::Value>,
    #[serde(default)]
    reviewers: BTreeMap<String, ReviewerGroup>,
    review: Option<hooks::ReviewFile>,
    #[serde(default)]
    notify: Vec<hooks::NotifyFile>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewerGroup {
    members: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderPolicy {
    min_risk_level: Option<RiskLevel>,
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
    provider_floors: HashMap<String, RiskLevel>,
    rules: Rules,
    /// `[reviewers.<group>] members`.
    groups: BTreeMap<String, Vec<String>>,
    /// `[review]`: the pre-reviewer.
    review: Option<Review>,
    /// `[[notify]]`: the webhooks of approval events.
    notify: Vec<Notify>,
    /// The sha256 of the file's bytes; `None` without a file.
    revision: Option<String>,
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
        for tool in file.tools.keys() {
            if !is_token(tool, 64) {
                return Err(format!(
                    "[tools.{tool}]: a tool name is [A-Za-z0-9_-]{{1,64}}"
                ));
            }
        }
        let mut groups = BTreeMap::new();
        for (group, members) in file.reviewers {
            if !is_token(&group, 64) {
                return Err(format!(
                    "[reviewers.{group}]: a group name is [A-Za-z0-9_-]{{1,64}}"
                ));
            }
            if let Some(bad) = members.members.iter().find(|m| !is_token(m, 64)) {
                return Err(format!(
                    "[reviewers.{group}] members: {bad:?} is not a reviewer name ([A-Za-z0-9_-]{{1,64}}, as in …decide.<approver>)"
                ));
            }
            if members.members.is_empty() {
                return Err(format!("[reviewers.{group}] members: name at least one"));
            }
            groups.insert(group, members.members);
        }
        let rules = Rules::parse(file.rules, &groups)?;
        let review = file.review.map(hooks::ReviewFile::check).transpose()?;
        let notify = file
            .notify
            .into_iter()
            .enumerate()
            .map(|(i, n)| n.check(i))
            .collect::<Result<Vec<_>, _>>()?;
        for service in file.providers.keys() {
            if !is_token(service, 256) {
                return Err(format!(
                    "[providers.{service}]: a provider (NATS micro service) name is [A-Za-z0-9_-]+"
                ));
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
            provider_floors: file
                .providers
                .into_iter()
                .filter_map(|(service, p)| p.min_risk_level.map(|r| (service, r)))
                .collect(),
            rules,
            groups,
            review,
            notify,
            revision: Some(crate::canonical::sha256_hex(text.as_bytes())),
        })
    }

    /// The file's rules (empty without a file).
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// `[review]`, the pre-reviewer; `None` when the file names none.
    pub fn review(&self) -> Option<&Review> {
        self.review.as_ref()
    }

    /// `[[notify]]`, the webhooks of approval events.
    pub fn notify(&self) -> &[Notify] {
        &self.notify
    }

    /// The members of reviewer group `group`.
    pub fn group(&self, group: &str) -> Option<&[String]> {
        self.groups.get(group).map(Vec::as_slice)
    }

    /// `policy_revision`: the sha256 (hex) of the policy file's bytes; `None` without a file.
    pub fn revision(&self) -> Option<&str> {
        self.revision.as_deref()
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

    /// The effective risk of a tool (see the module docs): the override, else its own risk,
    /// raised to its provider's floor.
    pub fn risk_for(&self, tool: &ToolSpec) -> RiskLevel {
        if let Some(risk) = self.risk_overrides.get(tool.name.as_ref()) {
            return *risk;
        }
        match &tool.runs {
            Runs::Provider(route) => self
                .provider_floor(&route.service)
                .map_or(tool.risk_level, |floor| floor.max(tool.risk_level)),
            _ => tool.risk_level,
        }
    }

    /// `[providers.<service>] min_risk_level`.
    pub fn provider_floor(&self, service: &str) -> Option<RiskLevel> {
        self.provider_floors.get(service).copied()
    }

    /// Tool names the file overrides (checked against the registry at startup).
    pub fn overridden_tools(&self) -> impl Iterator<Item = &str> {
        self.risk_overrides.keys().map(String::as_str)
    }
}

/// The policy a node holds: read at start, replaced whole when the file is read again
/// (`SIGHUP`, [`LivePolicy::reload`]); a call takes the [`LivePolicy::current`] one and keeps
/// it to its end.
#[derive(Debug, Clone)]
pub struct LivePolicy {
    current: Arc<ArcSwap<Policy>>,
    env_mode: ApprovalMode,
    file: Option<PathBuf>,
}

impl LivePolicy {
    /// The mode from the environment with the file (if any) on top, as [`Policy::load`].
    pub fn load(env_mode: ApprovalMode, file: Option<PathBuf>) -> Result<Self, PolicyError> {
        let policy = Policy::load(env_mode, file.as_deref())?;
        Ok(LivePolicy {
            current: Arc::new(ArcSwap::from_pointee(policy)),
            env_mode,
            file,
        })
    }

    /// A policy that no file backs (tests, `reload` keeps it).
    pub fn fixed(policy: Policy) -> Self {
        LivePolicy {
            current: Arc::new(ArcSwap::from_pointee(policy)),
            env_mode: ApprovalMode::default(),
            file: None,
        }
    }

    pub fn current(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// Reads the file again: a good one replaces the policy on this node and is returned; a
    /// bad one is refused and the old one stays. Without a file there is nothing to read.
    pub fn reload(&self) -> Result<Option<Arc<Policy>>, PolicyError> {
        let Some(file) = &self.file else {
            return Ok(None);
        };
        let policy = Arc::new(Policy::load(self.env_mode, Some(file))?);
        self.current.store(policy.clone());
        Ok(Some(policy))
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

    fn provider_tool(risk: RiskLevel) -> ToolSpec {
        use std::borrow::Cow;
        ToolSpec {
            name: Cow::Borrowed("ticket_create"),
            group: crate::tools::ToolGroup::External,
            description: Cow::Borrowed(""),
            risk_level: risk,
            side_effects: Cow::Borrowed(&[]),
            boundary: Cow::Borrowed(""),
            runs: Runs::Provider(crate::tools::ProviderRoute {
                service: "tickets".into(),
                subject: "tickets.create".into(),
            }),
            needs_session: false,
            profiles: &[],
            review: crate::tools::Review::Arguments,
        }
    }

    #[test]
    fn a_provider_cannot_lower_what_the_operator_set() {
        use RiskLevel::*;
        let floor = Policy::from_toml(
            ApprovalMode::Strict,
            "[providers.tickets]\nmin_risk_level = \"high\"\n",
        )
        .unwrap();
        let check = |policy: &Policy, claim, expect| {
            assert_eq!(policy.risk_for(&provider_tool(claim)), expect, "{claim:?}");
        };
        // The floor raises a lower claim and leaves a higher one.
        check(&floor, Low, High);
        check(&floor, Critical, Critical);
        // An override is the operator's word on that tool, whatever the claim.
        let both = Policy::from_toml(
            ApprovalMode::Strict,
            "[providers.tickets]\nmin_risk_level = \"high\"\n[tools.ticket_create]\nrisk_level = \"medium\"\n",
        )
        .unwrap();
        check(&both, Critical, Medium);
        check(&both, Low, Medium);
        check(&Policy::default(), Medium, Medium);
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        assert!(
            Policy::from_toml(ApprovalMode::Strict, "[tools.\"a.b\"]\nrisk_level=\"low\"").is_err()
        );
        assert!(Policy::from_toml(
            ApprovalMode::Strict,
            "[providers.\"a b\"]\nmin_risk_level=\"low\""
        )
        .is_err());
        assert!(Policy::from_toml(ApprovalMode::Strict, "[providers.x]\nmax=\"low\"").is_err());
        assert!(Policy::from_toml(ApprovalMode::Strict, "mode = \"lax\"").is_err());
        assert!(
            Policy::from_toml(ApprovalMode::Strict, "[accounts.\"a.b\"]\nmode=\"off\"").is_err()
        );
        assert!(Policy::from_toml(ApprovalMode::Strict, "[tools.x]\nrisk_level=\"huge\"").is_err());
    }
}
