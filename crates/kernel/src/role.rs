//! The roles a node can take: one per actor kind.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A role names an actor kind; `toolmesh node --roles` starts one actor per role given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Gateway,
    Approval,
    Workspace,
    Skills,
    Sandbox,
    Web,
    Bridge,
    Mcp,
    Console,
}

impl Role {
    pub const ALL: [Role; 9] = [
        Role::Gateway,
        Role::Approval,
        Role::Workspace,
        Role::Skills,
        Role::Sandbox,
        Role::Web,
        Role::Bridge,
        Role::Mcp,
        Role::Console,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Gateway => "gateway",
            Role::Approval => "approval",
            Role::Workspace => "workspace",
            Role::Skills => "skills",
            Role::Sandbox => "sandbox",
            Role::Web => "web",
            Role::Bridge => "bridge",
            Role::Mcp => "mcp",
            Role::Console => "console",
        }
    }

    /// Roles whose calls may run for minutes on one worker (commands in a sandbox). The gateway
    /// routes their calls with the claim protocol: the worker that takes a call names itself
    /// ([`crate::host::publish_claim`]) and the gateway answers `unavailable` as soon as that
    /// worker drops out of the cluster view, instead of waiting for the call's deadline.
    pub fn is_long_running(self) -> bool {
        matches!(self, Role::Sandbox | Role::Skills)
    }

    /// Parses `gateway,approval` or `all` (with `all` expanded, duplicates removed, sorted).
    pub fn parse_list(list: &str) -> Result<Vec<Role>, String> {
        let mut roles = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if item == "all" {
                roles.extend(Role::ALL);
            } else {
                roles.push(item.parse()?);
            }
        }
        if roles.is_empty() {
            return Err("no role given; use a comma-separated list of roles or `all`".into());
        }
        roles.sort();
        roles.dedup();
        Ok(roles)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!("unknown role {s:?}; known roles: gateway, approval, workspace, skills, sandbox, web, bridge, mcp, console, all")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_list_expands_all_and_dedups() {
        assert_eq!(Role::parse_list("all").unwrap(), Role::ALL.to_vec());
        assert_eq!(
            Role::parse_list("approval, gateway,approval").unwrap(),
            vec![Role::Gateway, Role::Approval]
        );
        assert!(Role::parse_list("").is_err());
        let long: Vec<Role> = Role::ALL
            .into_iter()
            .filter(|r| r.is_long_running())
            .collect();
        assert_eq!(long, [Role::Skills, Role::Sandbox]);
        assert!(Role::parse_list("gateway,nope")
            .unwrap_err()
            .contains("nope"));
    }
}
