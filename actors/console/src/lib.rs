//! The toolmesh approvals console (PROTOCOL.md "Durable events, audit, metrics, console"): the
//! role `console` serves a web page where an approver signs in with a console token, sees the
//! pending approvals of the token's accounts arrive live (those routed to the approver's
//! reviewer groups marked, PROTOCOL.md "Approval policy"), and approves or rejects each with a
//! reason — approving, if need be, edited arguments, or remembering the approval as a grant the
//! page lists and revokes.
//!
//! The console is a client of the mesh over NATS only: the approvals subjects (`list`, `get`,
//! `decide`, `requested`, `decided`) and the grants subjects (`list`, `revoke`), never Redis. It
//! keeps no session state: the browser sends its token as `Authorization: Bearer` on every API
//! request, so several console nodes may run behind one address.
//!
//! It reads the policy file (`TOOLMESH_POLICY_FILE`, listed by the gateway) for one thing: the
//! reviewer groups (`[reviewers.<group>]`) the token's approver belongs to, so the page can tell
//! which routed approvals are the approver's to decide. Who may decide is still the approval
//! actor's call: it answers `forbidden` to a non-member whatever the page shows.

mod api;
pub mod diff;
mod mesh;
mod page;
pub mod variables;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use toolmesh_kernel::config::{parse_file, ConfigError, RawEnv};
use toolmesh_kernel::host::{ActorHandle, Lifecycle};
use toolmesh_kernel::listener::{listen_addr, serve, HttpLimits};
use toolmesh_kernel::policy::{is_reviewer_name, ApprovalMode, LivePolicy, Policy};
use toolmesh_kernel::{Account, Role};

pub use api::router;

/// `TOOLMESH_CONSOLE_LISTEN`'s default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8932";

/// A bad console setting; the node stops naming it.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleConfigError {
    #[error("the console tokens file {path} (TOOLMESH_CONSOLE_TOKENS): {reason}")]
    Tokens { path: PathBuf, reason: String },
    /// A variable's value (the listen address, the HTTP limits, the policy file).
    #[error(transparent)]
    Setting(#[from] ConfigError),
}

/// Which accounts a console token may see and decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accounts {
    /// `"*"`: every account.
    All,
    /// The accounts named, at least one.
    Only(Vec<Account>),
}

impl Accounts {
    pub fn allows(&self, account: &Account) -> bool {
        match self {
            Accounts::All => true,
            Accounts::Only(list) => list.contains(account),
        }
    }
}

/// What a console token grants: the approver's name (`decided_by`) and the accounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub approver: String,
    pub accounts: Accounts,
}

impl Grant {
    /// Whether the approver's name is a reviewer's (`[A-Za-z0-9_-]{1,64}`): only such a name
    /// can be named by `…decide.<approver>`, so only it can decide a routed approval. Other
    /// names decide on the plain `…decide` (approvals without reviewers only).
    pub fn is_reviewer(&self) -> bool {
        is_reviewer_name(&self.approver)
    }

    /// The reviewer groups of `policy` the approver is a member of, in name order: those the
    /// rules route to (`reviewers`, `escalate_to`), since no approval goes to another.
    pub fn groups(&self, policy: &Policy) -> Vec<String> {
        if !self.is_reviewer() {
            return Vec::new();
        }
        let mut groups: Vec<String> = policy
            .rules()
            .iter()
            .flat_map(|rule| [rule.reviewers.as_deref(), rule.escalate_to.as_deref()])
            .flatten()
            .filter(|group| {
                policy
                    .group(group)
                    .is_some_and(|members| members.contains(&self.approver))
            })
            .map(str::to_owned)
            .collect();
        groups.sort();
        groups.dedup();
        groups
    }
}

/// The role's settings, from `TOOLMESH_CONSOLE_*` and `TOOLMESH_HTTP_*`.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    pub listen: SocketAddr,
    /// The listener's header timeout and connection cap.
    pub http: HttpLimits,
    /// Bearer token → grant; `None` when `TOOLMESH_CONSOLE_TOKENS` is not set (the console
    /// then serves only a page saying so, and every API request is 503).
    pub tokens: Option<HashMap<String, Arc<Grant>>>,
    /// `TOOLMESH_POLICY_FILE`, for its reviewer groups; a node reading the file again
    /// ([`LivePolicy::reload`]) updates the groups the page is told about. The mode plays no
    /// part here, so it is the default's.
    pub policy: LivePolicy,
}

impl ConsoleConfig {
    pub fn from_env(env: &RawEnv) -> Result<ConsoleConfig, ConsoleConfigError> {
        let listen = listen_addr(env, "TOOLMESH_CONSOLE_LISTEN", DEFAULT_LISTEN)?;
        let tokens = match env.get("TOOLMESH_CONSOLE_TOKENS").map(str::trim) {
            Some(path) if !path.is_empty() => Some(read_tokens(Path::new(path))?),
            _ => None,
        };
        let policy_file = env.get("TOOLMESH_POLICY_FILE").map(PathBuf::from);
        let policy =
            LivePolicy::load(ApprovalMode::default(), policy_file).map_err(ConfigError::from)?;
        Ok(ConsoleConfig {
            listen,
            http: HttpLimits::from_env(env)?,
            tokens,
            policy,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    approver: String,
    accounts: AccountsEntry,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum AccountsEntry {
    List(Vec<String>),
    Star(String),
}

/// The longest approver name: it is recorded as `decided_by`.
const MAX_APPROVER: usize = 128;

/// Reads `{"<token>": {"approver": "<name>", "accounts": ["<a>"…] | "*"}}`.
pub fn read_tokens(path: &Path) -> Result<HashMap<String, Arc<Grant>>, ConsoleConfigError> {
    parse_file(path, parse_tokens).map_err(|reason| ConsoleConfigError::Tokens {
        path: path.to_owned(),
        reason,
    })
}

/// The tokens file's text, validated: every token non-empty and visible ASCII, every approver
/// named, every account valid.
pub fn parse_tokens(text: &str) -> Result<HashMap<String, Arc<Grant>>, String> {
    let entries: HashMap<String, TokenEntry> =
        serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut tokens = HashMap::new();
    for (token, entry) in entries {
        let shown = token.chars().take(4).collect::<String>();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "the token starting {shown:?} must be non-empty visible ASCII (it travels in an Authorization header)"
            ));
        }
        let approver = entry.approver.trim();
        if approver.is_empty()
            || approver.chars().count() > MAX_APPROVER
            || approver.chars().any(char::is_control)
        {
            return Err(format!(
                "the approver of the token starting {shown:?} must be a name of 1 to {MAX_APPROVER} characters without control characters"
            ));
        }
        let accounts = match entry.accounts {
            AccountsEntry::Star(s) if s == "*" => Accounts::All,
            AccountsEntry::Star(s) => {
                return Err(format!(
                "accounts of approver {approver:?}: {s:?} is neither a list of accounts nor \"*\""
            ))
            }
            AccountsEntry::List(list) if list.is_empty() => {
                return Err(format!(
                "accounts of approver {approver:?}: the list is empty; name accounts or use \"*\""
            ))
            }
            AccountsEntry::List(list) => Accounts::Only(
                list.into_iter()
                    .map(|a| {
                        Account::parse(a.clone())
                            .map_err(|e| format!("account {a:?} of approver {approver:?}: {e}"))
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
        tokens.insert(
            token,
            Arc::new(Grant {
                approver: approver.to_owned(),
                accounts,
            }),
        );
    }
    Ok(tokens)
}

/// Starts the role `console`: the page and its API on `config.listen` until the node drains.
/// `tools` are the built-in tools, whose definitions say how an approver sees a call.
pub async fn spawn(
    nats: async_nats::Client,
    config: ConsoleConfig,
    tools: std::sync::Arc<toolmesh_kernel::tools::ToolRegistry>,
    lifecycle: Lifecycle,
) -> std::io::Result<(ActorHandle, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    match &config.tokens {
        None => tracing::warn!(
            "TOOLMESH_CONSOLE_TOKENS is not set: the console serves only a page saying so"
        ),
        Some(tokens) if tokens.is_empty() => {
            tracing::warn!("TOOLMESH_CONSOLE_TOKENS names no token: every sign-in fails")
        }
        Some(_) => {}
    }
    let stop = lifecycle.drain.child_token();
    let app = router(nats, tools, &config, stop.clone());
    let drained = stop.cancelled_owned();
    let handle = ActorHandle::spawn(Role::Console, serve(listener, app, config.http, drained));
    tracing::info!(%addr, "approvals console at http://{addr}/");
    Ok((handle, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token, its approver, and its accounts (`None`: every account).
    type Want<'a> = (&'a str, &'a str, Option<&'a [&'a str]>);

    fn check(text: &str, expect: Result<&[Want], &str>) {
        match (parse_tokens(text), expect) {
            (Ok(got), Ok(want)) => {
                assert_eq!(got.len(), want.len(), "{text}");
                for (token, approver, accounts) in want {
                    let grant = &got[*token];
                    assert_eq!(grant.approver, *approver);
                    let want = match accounts {
                        None => Accounts::All,
                        Some(list) => Accounts::Only(
                            list.iter().map(|a| Account::parse(*a).unwrap()).collect(),
                        ),
                    };
                    assert_eq!(grant.accounts, want);
                }
            }
            (Err(got), Err(want)) => assert!(got.contains(want), "{got:?} lacks {want:?}"),
            (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn tokens_files() {
        check(
            r#"{"t1": {"approver": "alice", "accounts": ["acme"]}, "t2": {"approver": "root", "accounts": "*"}}"#,
            Ok(&[("t1", "alice", Some(&["acme"])), ("t2", "root", None)]),
        );
        check(
            r#"{"t": {"approver": "a", "accounts": "acme"}}"#,
            Err("neither"),
        );
        check(r#"{"t": {"approver": "a", "accounts": []}}"#, Err("empty"));
        check(
            r#"{"t": {"approver": "", "accounts": "*"}}"#,
            Err("approver"),
        );
        check(
            r#"{"t": {"approver": "a", "accounts": ["a.b"]}}"#,
            Err("\"a.b\""),
        );
        check(
            r#"{"t x": {"approver": "a", "accounts": "*"}}"#,
            Err("ASCII"),
        );
        check(r#"{"t": {"approver": "a"}}"#, Err("accounts"));
        check(
            r#"{"t": {"approver": "a", "accounts": "*", "extra": 1}}"#,
            Err("extra"),
        );
        check("[]", Err("map"));
    }

    #[test]
    fn an_approver_is_in_the_groups_the_rules_route_to() {
        let policy = Policy::from_toml(
            ApprovalMode::Strict,
            r#"
[reviewers.ops]
members = ["alice", "bob"]
[reviewers.legal]
members = ["carol", "alice"]
[reviewers.idle]
members = ["alice"]

[[rules]]
id = "writes"
tools = ["write_*"]
decision = "ask"
reviewers = "ops"
expires_in_s = 60
on_timeout = "escalate"
escalate_to = "legal"

[[rules]]
id = "edits"
tools = ["edit_*"]
decision = "ask"
reviewers = "ops"
"#,
        )
        .unwrap();
        let groups = |approver: &str| {
            let grant = Grant {
                approver: approver.to_owned(),
                accounts: Accounts::All,
            };
            grant.groups(&policy)
        };
        // `idle` routes nothing, so it is no one's.
        assert_eq!(groups("alice"), ["legal", "ops"]);
        assert_eq!(groups("bob"), ["ops"]);
        assert_eq!(groups("carol"), ["legal"]);
        assert!(groups("dave").is_empty());
        // A name no subject can carry decides nothing routed.
        assert!(groups("Alice Approver").is_empty());
        assert!(groups("alice.x").is_empty());
    }

    #[test]
    fn a_grant_allows_its_accounts_only() {
        let acme = Account::parse("acme").unwrap();
        let globex = Account::parse("globex").unwrap();
        assert!(Accounts::All.allows(&globex));
        let only = Accounts::Only(vec![acme.clone()]);
        assert!(only.allows(&acme));
        assert!(!only.allows(&globex));
    }
}
