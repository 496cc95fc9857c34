//! The command line's arguments (clap): the commands and their options, and the parsing of
//! `--account` and `--args`.

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use serde_json::Value;

use toolmesh_kernel::config::DEFAULT_NATS_URL;
use toolmesh_kernel::Account;

/// The variable of `--nats-url`.
pub(super) const NATS_URL_VAR: &str = "TOOLMESH_NATS_URL";
/// How an error names `--nats-url` and its variable.
pub(super) const NATS_URL_ARG: &str = "--nats-url (TOOLMESH_NATS_URL)";

#[derive(Debug, Parser)]
#[command(
    name = "toolmesh",
    version,
    about = "A distributed tool and skill runtime for AI agents, over NATS"
)]
pub(super) struct Cli {
    /// NATS server(s) to connect to: one URL, or the servers of one cluster comma-separated.
    /// (`--help` never prints the variable's value: a URL may hold a password.)
    #[arg(
        long,
        global = true,
        env = NATS_URL_VAR,
        hide_env_values = true,
        default_value = DEFAULT_NATS_URL
    )]
    pub(super) nats_url: String,
    /// Reply inbox prefix of client commands (default `_INBOX`): a NATS user allowed to
    /// subscribe only to a private inbox, like the cluster's account users, names it here.
    #[arg(
        long,
        global = true,
        env = "TOOLMESH_NATS_INBOX_PREFIX",
        hide_env_values = true
    )]
    pub(super) inbox_prefix: Option<String>,
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Run a node with the given roles (configuration from TOOLMESH_* variables).
    Node {
        /// Comma-separated roles (gateway, approval, workspace, skills, sandbox, web, bridge, mcp,
        /// console) or `all`.
        #[arg(long, default_value = "all")]
        roles: String,
    },
    /// Serve a folder of skill folders over the Skill Service HTTP contract (PROTOCOL.md):
    /// each folder holding SKILL.md is zipped deterministically and hashed.
    SkillService {
        /// The folder of skill folders.
        #[arg(long)]
        dir: std::path::PathBuf,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8470")]
        listen: std::net::SocketAddr,
        /// The space id the skills are served under.
        #[arg(long, default_value = "local-service")]
        space: String,
        /// Require `Authorization: Bearer <token>` on every request.
        #[arg(long, env = "TOOLMESH_SKILL_SERVICE_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Base URL of download links (default: http:// + the request's Host).
        #[arg(long)]
        public_url: Option<String>,
    },
    /// Internal: the sandbox spawner, started by a sandbox worker inside each sandbox (its
    /// stdin is the worker's socket, or it listens at --listen for the worker to connect).
    #[command(hide = true)]
    SandboxSpawner {
        #[arg(long)]
        listen: Option<std::path::PathBuf>,
    },
    /// Call a tool and print its reply.
    Call {
        /// The tool to call, e.g. component_status.
        tool: String,
        #[arg(long)]
        account: String,
        #[arg(long)]
        session: Option<String>,
        /// The arguments: a JSON object, or @file holding one.
        #[arg(long, default_value = "{}")]
        args: String,
        /// Present an approval id (after it was approved).
        #[arg(long)]
        approval_id: Option<String>,
        /// Approve in band (as the seeds do: "approval": {"approved": true}).
        #[arg(long, conflicts_with = "reject")]
        approve: bool,
        /// Reject in band.
        #[arg(long)]
        reject: bool,
        /// Wait up to this many seconds for a person to approve (wait_for_approval_s).
        #[arg(long, default_value_t = 0)]
        wait: u64,
        #[arg(long)]
        invocation_id: Option<String>,
        #[arg(long)]
        user_id: Option<String>,
        #[arg(long)]
        agent_id: Option<String>,
        /// Seconds to wait for the reply (beyond --wait).
        #[arg(long, default_value_t = 150)]
        timeout: u64,
    },
    /// Speak MCP on standard input and output (for MCP clients that start a command): the
    /// mesh's tools for one account, through the gateway (PROTOCOL.md "MCP front").
    Mcp {
        #[arg(long)]
        account: String,
        /// The toolmesh session of every call (default: one made for this process).
        #[arg(long)]
        session: Option<String>,
        /// The tool profile listed: default, focused (core) or coding.
        #[arg(long, default_value = "default")]
        profile: String,
    },
    /// List, watch and decide approvals.
    Approvals {
        #[command(subcommand)]
        action: ApprovalsCommand,
    },
    /// List and revoke the grants of an account (decisions that remember themselves).
    Grants {
        #[command(subcommand)]
        action: GrantsCommand,
    },
    /// Read and verify an account's audit trail, and print its head to keep (through its
    /// query subject).
    Audit {
        #[command(subcommand)]
        action: crate::audit_cli::AuditCommand,
    },
    /// The cluster (or one node) as its nodes report it.
    Status {
        /// One node's status instead of the cluster's.
        #[arg(long)]
        node: Option<String>,
    },
    /// Print the RunEvents of an account (or one invocation): the kept ones first (where the
    /// server keeps `TOOLMESH_EVENTS`), then as they happen.
    Events {
        #[arg(long)]
        account: String,
        #[arg(long, alias = "invocation")]
        invocation_id: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum ApprovalsCommand {
    /// Pending approvals of an account.
    List {
        #[arg(long)]
        account: String,
    },
    /// One approval, whatever its status.
    Get {
        id: String,
        #[arg(long)]
        account: String,
    },
    /// Print approvals as they are requested and decided (one JSON line each).
    Watch {
        /// Only this account (default: every account your NATS user may see).
        #[arg(long)]
        account: Option<String>,
    },
    /// Approve a pending approval.
    Approve(ApproveArgs),
    /// Reject a pending approval.
    Reject(DecideArgs),
    /// Say which rule, reviewers, decisions or grant decided an approval, and why.
    Explain {
        id: String,
        #[arg(long)]
        account: String,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum GrantsCommand {
    /// Every grant of an account still kept (revoked, spent and expired ones too).
    List {
        #[arg(long)]
        account: String,
    },
    /// Revoke a grant: from now on it covers nothing, on every node.
    Revoke {
        id: String,
        #[arg(long)]
        account: String,
    },
}

/// `approve`: a decision, and optionally a grant that remembers it.
#[derive(Debug, Args)]
pub(super) struct ApproveArgs {
    #[command(flatten)]
    pub(super) decide: DecideArgs,
    /// Approve these arguments instead of the call's (a JSON object, or @file): the call runs
    /// with them once they pass the tool's schema.
    #[arg(long)]
    pub(super) arguments: Option<String>,
    /// Remember the approval as a grant for this session or the whole account.
    #[arg(long, value_parser = ["session", "account"])]
    pub(super) grant: Option<String>,
    /// The grant's tools (comma-separated globs; default: the approval's tool).
    #[arg(long, requires = "grant", value_delimiter = ',')]
    pub(super) grant_tools: Vec<String>,
    /// The grant's tests on the arguments, as JSON (`{"path": {"prefix": "notes/"}}`).
    #[arg(long, requires = "grant")]
    pub(super) grant_when: Option<String>,
    /// Seconds the grant lives (default: the approval TTL).
    #[arg(long, requires = "grant")]
    pub(super) grant_expires_in_s: Option<u64>,
    /// Calls the grant covers at most (default: no limit).
    #[arg(long, requires = "grant")]
    pub(super) grant_uses: Option<u64>,
}

// What `approve` and `reject` both take. (No doc comment: clap would show it as the about of
// both commands instead of theirs.)
#[derive(Debug, Args)]
pub(super) struct DecideArgs {
    pub(super) id: String,
    #[arg(long)]
    pub(super) account: String,
    #[arg(long, env = "USER")]
    pub(super) approver: Option<String>,
    /// Decide as this reviewer, on `…decide.<name>` (your NATS user must be theirs): an
    /// approval routed to reviewers is decided only this way.
    #[arg(long = "as")]
    pub(super) as_reviewer: Option<String>,
    #[arg(long)]
    pub(super) reason: Option<String>,
}

pub(crate) fn parse_account(account: &str) -> anyhow::Result<Account> {
    Account::parse(account).context("--account")
}

pub(super) fn parse_args(args: &str) -> anyhow::Result<Value> {
    let text = match args.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?
        }
        None => args.to_owned(),
    };
    let value: Value = serde_json::from_str(&text).context("not valid JSON")?;
    if !value.is_object() {
        bail!("not a JSON object; give one like '{{\"path\": \"notes.md\"}}'");
    }
    Ok(value)
}
