//! Parts of the policy files several tests share (PROTOCOL.md "Approval policy"): one name is
//! one rule or one set of reviewer groups wherever a test uses it.

/// `no-secrets`: every workspace tool is denied under `secrets/`, saying why.
pub const NO_SECRETS: &str = r#"
[[rules]]
id = "no-secrets"
tools = ["*_workspace_*"]
decision = "deny"
reason = "secrets stay where they are"
when = { path = { glob = "secrets/**" } }
"#;

/// `notes`: writes under `notes/` run without an approval.
pub const NOTES: &str = r#"
[[rules]]
id = "notes"
tools = ["write_workspace_file"]
decision = "allow"
when = { path = { prefix = "notes/" } }
"#;

/// `ask-ops`: `component_status` needs two of `ops` (alice, bob and carol).
pub const TWO_OF_OPS: &str = r#"
[reviewers.ops]
members = ["alice", "bob", "carol"]

[[rules]]
id = "ask-ops"
tools = ["component_status"]
decision = "ask"
reviewers = "ops"
quorum = 2
"#;

/// Groups to route approvals to, one member each: `ops` (alice), `leads` (lee) and `legal`
/// (carol).
pub const ONE_MEMBER_GROUPS: &str = r#"
[reviewers.ops]
members = ["alice"]

[reviewers.leads]
members = ["lee"]

[reviewers.legal]
members = ["carol"]
"#;

/// A policy file: approval `mode` (`off`, `strict` …), then `parts` in order.
pub fn policy(mode: &str, parts: &[&str]) -> String {
    format!("mode = \"{mode}\"\n{}", parts.concat())
}
