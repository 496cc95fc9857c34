//! The command line: `toolmesh node`, `skill-service`, `call`, `mcp`, `approvals`, `status`,
//! `events`.
//!
//! Client commands print JSON replies on stdout (one document, or one line per event) and
//! hints for a person on stderr; the exit code is 0 for `ok: true`, 1 for `ok: false`, 2 when
//! the command itself could not run. Everything printed is display-safe
//! (`toolmesh_kernel::text`): a control or bidirectional character in a name or value is
//! written as its JSON escape (`\u202e`), which reads back as the same JSON.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use futures::StreamExt;
use serde_json::{json, Value};

use toolmesh_kernel::config::{NodeConfig, RawEnv, DEFAULT_NATS_URL};
use toolmesh_kernel::host::connect_client_with_inbox;
use toolmesh_kernel::permissions::Refusals;
use toolmesh_kernel::subjects::public::{self, ApprovalVerb};
use toolmesh_kernel::text::{display_json, display_json_pretty, DisplaySafe};
use toolmesh_kernel::{Account, InvocationId, NodeId};

#[derive(Debug, Parser)]
#[command(
    name = "toolmesh",
    version,
    about = "A distributed tool and skill runtime for AI agents, over NATS"
)]
struct Cli {
    /// NATS server(s) to connect to.
    /// (`--help` never prints the variable's value: a URL may hold a password.)
    #[arg(
        long,
        global = true,
        env = "TOOLMESH_NATS_URL",
        hide_env_values = true,
        default_value = DEFAULT_NATS_URL
    )]
    nats_url: String,
    /// Reply inbox prefix of client commands (default `_INBOX`): a NATS user allowed to
    /// subscribe only to a private inbox, like the cluster's account users, names it here.
    #[arg(
        long,
        global = true,
        env = "TOOLMESH_NATS_INBOX_PREFIX",
        hide_env_values = true
    )]
    inbox_prefix: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
enum ApprovalsCommand {
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
    Approve {
        id: String,
        #[arg(long)]
        account: String,
        #[arg(long, env = "USER")]
        approver: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reject a pending approval.
    Reject {
        id: String,
        #[arg(long)]
        account: String,
        #[arg(long, env = "USER")]
        approver: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::SandboxSpawner { listen } = &cli.command {
        // Before anything else: no runtime, no logging; it speaks only on its socket.
        return toolmesh_sandbox::backend::spawner::serve(listen.as_deref());
    }
    // A node logs what it does (its tracing starts once its id is known, for its traces); a
    // client command keeps stdout/stderr for the person.
    match cli.command {
        Command::Node { .. } => {}
        Command::SkillService { .. } => init_tracing("info", None),
        // The client's own error line says what went wrong; async-nats's log of the same
        // failure would only say it twice.
        _ => init_tracing("warn,async_nats=off", None),
    }
    let result = match cli.command {
        Command::Node { roles } => run_node(&cli.nats_url, &roles),
        Command::SkillService {
            dir,
            listen,
            space,
            token,
            public_url,
        } => client_runtime().and_then(|rt| {
            rt.block_on(toolmesh_skills::service::run_from_dir(
                &dir,
                listen,
                &space,
                toolmesh_skills::service::ServiceOptions { token, public_url },
                toolmesh_kernel::host::shutdown_signal(),
            ))
            .map_err(anyhow::Error::msg)?;
            Ok(ExitCode::SUCCESS)
        }),
        command => client_runtime().and_then(|rt| {
            rt.block_on(run_client(
                &cli.nats_url,
                cli.inbox_prefix.as_deref(),
                command,
            ))
        }),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`toolmesh status | head`): nothing more to say, and nobody to
        // say it to, so stop quietly, as ripgrep does.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            hint(&format!("toolmesh: {}", error_text(&e)));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes, `: `-separated, each cause once: many errors (async-nats's among
/// them) already print their source, which `{:#}` would print again.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// One line on stdout; fails (instead of panicking, as `println!` does) when the reader left.
pub(crate) fn emit(line: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// A line for the person on stderr; a closed stderr is not worth failing for.
fn hint(text: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// The node's runtime (`TOOLMESH_WORKER_THREADS`): 0, one thread; n, a multi-thread runtime of
/// n workers. Not a number stops the node naming the variable.
fn worker_threads() -> anyhow::Result<usize> {
    match std::env::var("TOOLMESH_WORKER_THREADS") {
        Err(_) => Ok(0),
        Ok(v) => v.trim().parse().map_err(|_| {
            anyhow::anyhow!(
                "TOOLMESH_WORKER_THREADS={v:?}: use 0 (one thread) or a number of workers"
            )
        }),
    }
}

/// Whether the log is JSON lines (`TOOLMESH_LOG_FORMAT`: `json`, or `text`, the default); another
/// value stops a node naming the variable.
fn log_format() -> anyhow::Result<bool> {
    match std::env::var("TOOLMESH_LOG_FORMAT").as_deref() {
        Err(_) | Ok("" | "text") => Ok(false),
        Ok("json") => Ok(true),
        Ok(other) => bail!("TOOLMESH_LOG_FORMAT={other:?}: use json or text"),
    }
}

/// The log on stderr (`RUST_LOG`, else `default_level`; `TOOLMESH_LOG_FORMAT=json`), and the
/// spans of toolmesh's crates to `exporter` when there is one (`crate::otel`).
fn init_tracing(default_level: &str, exporter: Option<&crate::otel::Exporter>) {
    use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let json = log_format().unwrap_or(false);
    // Colours for a person at a terminal only: a pipe, a file or `docker logs` gets plain
    // text, and so does anyone who sets NO_COLOR (no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let text = (!json).then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(colour)
            .with_writer(std::io::stderr)
            .with_filter(filter.clone())
    });
    let json = json.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter)
    });
    // Its own filter: a quieter log does not thin the traces, and no other crate's spans
    // (the exporter's HTTP client's among them) reach them.
    let otel = exporter.map(|exporter| {
        tracing_opentelemetry::layer()
            .with_tracer(exporter.tracer())
            .with_filter(Targets::new().with_target("toolmesh", LevelFilter::INFO))
    });
    tracing_subscriber::registry()
        .with(text)
        .with(json)
        .with(otel)
        .init();
}

fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn run_node(nats_url: &str, roles: &str) -> anyhow::Result<ExitCode> {
    let mut config = NodeConfig::from_env(&RawEnv::from_process())?;
    config.nats_url = nats_url.to_owned();
    // Resolved here, once: the traces name the node as its heartbeats do.
    let node_id = crate::node::node_id(&config)?;
    config.node_id = Some(node_id.to_string());
    // Dropped last, after the node stopped: its last spans leave then.
    let exporter = crate::otel::from_env(node_id.as_str())?;
    let threads = worker_threads()?;
    log_format()?;
    init_tracing("info", exporter.as_ref());
    let resolved = crate::node::resolve_roles(roles).map_err(anyhow::Error::msg)?;
    if resolved.is_empty() {
        bail!("no role to run");
    }
    let skipped: Vec<&str> = toolmesh_kernel::Role::ALL
        .iter()
        .filter(|r| !resolved.contains(r))
        .map(|r| r.as_str())
        .collect();
    if roles.split(',').any(|r| r.trim() == "all") && !skipped.is_empty() {
        tracing::info!(
            "roles not in this build are not started: {}",
            skipped.join(", ")
        );
    }
    let system = if threads == 0 {
        actix_rt::System::new()
    } else {
        actix_rt::System::with_tokio_rt(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()
                .expect("tokio runtime builds")
        })
    };
    system.block_on(crate::node::run(
        config,
        resolved,
        toolmesh_kernel::host::shutdown_signal(),
    ))?;
    drop(exporter);
    Ok(ExitCode::SUCCESS)
}

async fn run_client(
    nats_url: &str,
    inbox_prefix: Option<&str>,
    command: Command,
) -> anyhow::Result<ExitCode> {
    let (nats, refusals) = connect_client_with_inbox(nats_url, "toolmesh-cli", inbox_prefix)
        .await
        .map_err(|e| {
            let url = redacted_url(nats_url);
            match e.kind() {
                // async-nats says "authorization violation" twice over; say what to change.
                async_nats::ConnectErrorKind::AuthorizationViolation => anyhow::anyhow!(
                    "NATS at {url} refused the user or password in the URL (authorization violation); set them in --nats-url or TOOLMESH_NATS_URL as nats://<user>:<password>@host:port"
                ),
                _ => anyhow::Error::new(e).context(format!(
                    "cannot connect to NATS at {url} (set --nats-url or TOOLMESH_NATS_URL)"
                )),
            }
        })?;
    let mesh = Mesh {
        client: nats,
        refusals,
    };
    match command {
        Command::Node { .. } | Command::SkillService { .. } | Command::SandboxSpawner { .. } => {
            unreachable!("handled before")
        }
        Command::Call {
            tool,
            account,
            session,
            args,
            approval_id,
            approve,
            reject,
            wait,
            invocation_id,
            user_id,
            agent_id,
            timeout,
        } => {
            let account = parse_account(&account)?;
            let arguments = parse_args(&args)?;
            let mut body = json!({ "tool": tool, "arguments": arguments });
            let extra = [
                ("session_id", session.map(Value::from)),
                ("invocation_id", invocation_id.map(Value::from)),
                ("user_id", user_id.map(Value::from)),
                ("agent_id", agent_id.map(Value::from)),
            ];
            for (key, value) in extra {
                if let Some(value) = value {
                    body[key] = value;
                }
            }
            if approval_id.is_some() || approve || reject {
                let mut grant = json!({});
                if let Some(id) = approval_id {
                    grant["id"] = Value::from(id);
                }
                if approve || reject {
                    grant["approved"] = Value::from(approve);
                }
                body["approval"] = grant;
            }
            let reply = if wait > 0 {
                body["wait_for_approval_s"] = Value::from(wait);
                // The call's own RunEvents say when it parks on an approval: its id is
                // needed to hear them.
                let invocation = match body["invocation_id"].as_str() {
                    Some(id) => id.to_owned(),
                    None => format!("cli-{}", uuid::Uuid::new_v4().simple()),
                };
                body["invocation_id"] = Value::from(invocation.clone());
                let events = public::events(&account, &InvocationId::parse(invocation)?);
                let call = request(&mesh, public::call(&account), &body, timeout + wait);
                wait_telling(&mesh, call, events, &account, nats_url, wait).await?
            } else {
                request(&mesh, public::call(&account), &body, timeout).await?
            };
            print_json(&reply)?;
            if reply["error"] == "approval_required" {
                let id = reply["approval_request"]["id"].as_str().unwrap_or("appr_…");
                hint(&approval_hint(id, &account, nats_url, approve || reject));
            }
            Ok(exit_for(&reply))
        }
        Command::Mcp {
            account,
            session,
            profile,
        } => {
            let caller = toolmesh_mcp::Caller {
                account: parse_account(&account)?,
                profile: toolmesh_mcp::caller_profile(Some(&profile))
                    .map_err(anyhow::Error::msg)?,
                session: Some(session.unwrap_or_else(|| {
                    format!("mcp-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
                })),
                name: None,
            };
            let settings = toolmesh_mcp::front_settings(&RawEnv::from_process())?;
            toolmesh_mcp::serve_stdio(mesh.client, mesh.refusals, settings, caller)
                .await
                .map_err(anyhow::Error::msg)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Approvals { action } => approvals(&mesh, action).await,
        Command::Audit { action } => crate::audit_cli::run(&mesh, action).await,
        Command::Status { node } => {
            let subject = match node {
                Some(node) => public::node_status(&NodeId::parse(node)?),
                None => public::STATUS.to_owned(),
            };
            let reply = request(&mesh, subject, &json!({}), 5).await?;
            print_json(&reply)?;
            Ok(exit_for(&reply))
        }
        Command::Events {
            account,
            invocation_id,
        } => {
            let account = parse_account(&account)?;
            let subject = match invocation_id {
                Some(id) => public::events(&account, &InvocationId::parse(id)?),
                None => public::events_of(&account),
            };
            replay_events(&mesh, subject).await
        }
    }
}

async fn approvals(mesh: &Mesh, action: ApprovalsCommand) -> anyhow::Result<ExitCode> {
    let (subject, body) = match action {
        ApprovalsCommand::List { account } => (
            public::approvals(&parse_account(&account)?, ApprovalVerb::List),
            json!({}),
        ),
        ApprovalsCommand::Get { id, account } => (
            public::approvals(&parse_account(&account)?, ApprovalVerb::Get),
            json!({ "id": id }),
        ),
        ApprovalsCommand::Watch { account } => {
            let account = account.map(|a| parse_account(&a)).transpose()?;
            let [requested, decided] = public::approvals_events(account.as_ref());
            return print_streams(mesh, &[requested, decided]).await;
        }
        ApprovalsCommand::Approve {
            id,
            account,
            approver,
            reason,
        } => (
            public::approvals(&parse_account(&account)?, ApprovalVerb::Decide),
            json!({ "id": id, "approved": true, "approver": approver, "reason": reason }),
        ),
        ApprovalsCommand::Reject {
            id,
            account,
            approver,
            reason,
        } => (
            public::approvals(&parse_account(&account)?, ApprovalVerb::Decide),
            json!({ "id": id, "approved": false, "approver": approver, "reason": reason }),
        ),
    };
    let reply = request(mesh, subject, &body, 10).await?;
    print_json(&reply)?;
    if let Some(note) = arguments_check(&reply) {
        hint(&note);
    }
    Ok(exit_for(&reply))
}

/// For a `get` reply: whether the arguments shown are the ones the approval is bound to (their
/// JCS sha256 is `arguments_sha256`), or that they could not be shown.
fn arguments_check(reply: &Value) -> Option<String> {
    let approval = reply.get("approval")?;
    let sha = approval.get("arguments_sha256")?.as_str()?;
    if reply.get("arguments_truncated") == Some(&Value::Bool(true)) {
        return Some(
            "the arguments are not shown in full (see arguments_preview); do not approve what you cannot see".to_owned(),
        );
    }
    let arguments = reply.get("arguments")?;
    if toolmesh_kernel::canonical::arguments_sha256(arguments) == sha {
        Some(
            "arguments match arguments_sha256: they are exactly what this approval lets run"
                .to_owned(),
        )
    } else {
        Some(
            "WARNING: the arguments shown do not hash to arguments_sha256; do not approve"
                .to_owned(),
        )
    }
}

pub(crate) fn parse_account(account: &str) -> anyhow::Result<Account> {
    Account::parse(account).context("--account")
}

fn parse_args(args: &str) -> anyhow::Result<Value> {
    let text = match args.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?
        }
        None => args.to_owned(),
    };
    let value: Value = serde_json::from_str(&text).context("--args is not valid JSON")?;
    if !value.is_object() {
        bail!("--args must be a JSON object, like '{{\"path\": \"notes.md\"}}'");
    }
    Ok(value)
}

/// A client command's NATS connection, and what the server refused it: every request and
/// subscription of a command ends at once, saying why, when the server refuses it
/// (`toolmesh_kernel::permissions`).
pub(crate) struct Mesh {
    pub(crate) client: async_nats::Client,
    pub(crate) refusals: Refusals,
}

pub(crate) async fn request(
    mesh: &Mesh,
    subject: String,
    body: &Value,
    timeout_s: u64,
) -> anyhow::Result<Value> {
    let payload = Bytes::from(serde_json::to_vec(body)?);
    let mut request = async_nats::Request::new()
        .payload(payload)
        .timeout(Some(Duration::from_secs(timeout_s.max(1))));
    if let Some(headers) = environment_trace() {
        request = request.headers(headers);
    }
    let reply = mesh
        .refusals
        .guard(&subject, mesh.client.send_request(subject.clone(), request))
        .await?
        .map_err(|e| {
        use async_nats::RequestErrorKind::*;
        match e.kind() {
            NoResponders => anyhow::anyhow!("no toolmesh node answers on {subject}; is a node with the right role running (toolmesh node --roles all)?"),
            TimedOut => anyhow::anyhow!("no reply on {subject} within {timeout_s} s"),
            _ => anyhow::anyhow!("request on {subject} failed: {e}"),
        }
    })?;
    serde_json::from_slice(&reply.payload).context("the reply is not JSON")
}

/// `TRACEPARENT` and `TRACESTATE` of the environment (OpenTelemetry's environment carrier) as
/// NATS headers: a script running inside a trace makes its requests part of it (README
/// "Traces"). A value that names no valid span is ignored.
fn environment_trace() -> Option<async_nats::HeaderMap> {
    let parent = std::env::var("TRACEPARENT").ok()?;
    let state = std::env::var("TRACESTATE").ok();
    toolmesh_kernel::trace::headers_from(&parent, state.as_deref())
}

/// How long one pull of `toolmesh events` waits on the server: a lost consumer is noticed
/// after two missed heartbeats of half of it.
const EVENTS_PULL_EXPIRY: Duration = Duration::from_secs(4);

/// `toolmesh events`: replays the kept RunEvents of `subject` from `TOOLMESH_EVENTS` with an
/// ordered consumer (deliver all), then follows. The ordered consumer goes on from the last
/// stream sequence it delivered when it must be made again (a NATS restart), so nothing is
/// printed twice or skipped. Without JetStream it falls back to live events and says so.
async fn replay_events(mesh: &Mesh, subject: String) -> anyhow::Result<ExitCode> {
    let nats = &mesh.client;
    use async_nats::jetstream::consumer::{pull, DeliverPolicy};
    use toolmesh_kernel::streams::EVENTS_STREAM;
    let mut js = async_nats::jetstream::new(nats.clone());
    // A refused request goes unanswered: give up on it well before the caller does.
    js.set_timeout(Duration::from_secs(5));
    // A named consumer: its create request carries the filter in its subject
    // (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`), which account users are allowed.
    let name = format!("events_{}", uuid::Uuid::new_v4().simple());
    let create = format!("$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.{name}.{subject}");
    let config = pull::OrderedConfig {
        name: Some(name),
        filter_subject: subject.clone(),
        deliver_policy: DeliverPolicy::All,
        // Short pulls: their heartbeats are what tells a lost consumer (a NATS restart) within
        // seconds, and the ordered consumer is made again from the last sequence it delivered.
        max_expires: EVENTS_PULL_EXPIRY,
        ..Default::default()
    };
    let created = mesh
        .refusals
        .guard(&create, js.create_consumer_on_stream(config, EVENTS_STREAM))
        .await;
    let created = match created {
        Ok(created) => created,
        // Refused at once (the server says so): this user may not read these events.
        Err(refused) => {
            hint(&format!("no replay of {subject}: {refused}"));
            return Ok(ExitCode::FAILURE);
        }
    };
    let consumer = match created {
        Ok(consumer) => consumer,
        // The server has JetStream but made no consumer: most likely this user may not read
        // these events (a permissions violation leaves the request unanswered). Live events
        // would be refused the same way, so say so and stop.
        Err(err) if nats.server_info().jetstream => {
            hint(&format!(
                "no replay of {subject} ({err}): the server refused or did not answer; \
                 may this user read these events?"
            ));
            return Ok(ExitCode::FAILURE);
        }
        Err(err) => {
            hint(&format!(
                "no replay ({err}): the server keeps no {EVENTS_STREAM}; showing live events only"
            ));
            return print_streams(mesh, &[subject]).await;
        }
    };
    let mut messages = consumer.messages().await?;
    hint(&format!(
        "replaying and watching {subject} (Ctrl-C to stop)"
    ));
    loop {
        tokio::select! {
            msg = messages.next() => {
                match msg {
                    None => break,
                    Some(Ok(msg)) => {
                        let body: Value = serde_json::from_slice(&msg.payload).unwrap_or_else(|_| {
                            Value::from(String::from_utf8_lossy(&msg.payload).into_owned())
                        });
                        emit(&display_json(&json!({ "subject": msg.subject.as_str(), "body": body })))?;
                    }
                    // The ordered consumer recreates itself after such errors (missed
                    // heartbeats, a reconnect); it goes on from the last sequence delivered.
                    Some(Err(err)) => tracing::debug!(%err, "events consumer"),
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn print_streams(mesh: &Mesh, subjects: &[String]) -> anyhow::Result<ExitCode> {
    let mut subs = Vec::new();
    for subject in subjects {
        subs.push(mesh.client.subscribe(subject.clone()).await?);
    }
    // A subscription the server refuses is silence, not an error: end on its refusal.
    let refused = futures::future::select_all(
        subjects
            .iter()
            .map(|subject| Box::pin(mesh.refusals.of_subscription(subject))),
    );
    tokio::pin!(refused);
    let mut sub = futures::stream::select_all(subs);
    hint(&format!(
        "watching {} (Ctrl-C to stop)",
        subjects.join(", ")
    ));
    loop {
        tokio::select! {
            msg = sub.next() => {
                let Some(msg) = msg else { break };
                let body: Value = serde_json::from_slice(&msg.payload).unwrap_or_else(|_| {
                    Value::from(String::from_utf8_lossy(&msg.payload).into_owned())
                });
                emit(&display_json(&json!({ "subject": msg.subject.as_str(), "body": body })))?;
            }
            (refused, _, _) = &mut refused => return Err(refused.into()),
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn print_json(value: &Value) -> anyhow::Result<()> {
    emit(&display_json_pretty(value))
}

/// What a person does next about a call that waits for approval. Only a NATS user allowed to
/// publish on the account's `decide` subject can decide: on a cluster with authenticated
/// users (the compose cluster's `approver`) that is not the user who called, and with in-band
/// decisions off `--approve` changes nothing.
fn approval_hint(id: &str, account: &Account, nats_url: &str, decided_in_band: bool) -> String {
    let decide = public::approvals(account, ApprovalVerb::Decide);
    let mut text = format!("\napproval required: {id} waits for a decision on {decide}.\n");
    if decided_in_band {
        text.push_str(
            "Your --approve/--reject did not decide it: in-band decisions are off on this cluster (TOOLMESH_APPROVAL_IN_BAND=0).\n",
        );
    }
    text.push_str(&who_decides(nats_url, &decide, "In another terminal"));
    text.push_str(&format!(
        "  toolmesh approvals approve {id} --account {account}\nthen repeat this command with --approval-id {id} (or add --wait 300 to wait for the decision here)."
    ));
    text
}

/// How often `call --wait` says it still waits.
const STILL_WAITING_EVERY: Duration = Duration::from_secs(30);

/// `call --wait`: the call, and on stderr what it waits for while it is parked on an approval
/// (its RunEvents on `events` say so, PROTOCOL.md "RunEvents"): at once the approval, its tool
/// and risk and who may decide it, then a line every [`STILL_WAITING_EVERY`], and the
/// decision when it comes. Without permission to hear the events the call just waits.
async fn wait_telling(
    mesh: &Mesh,
    call: impl std::future::Future<Output = anyhow::Result<Value>>,
    events: String,
    account: &Account,
    nats_url: &str,
    wait_s: u64,
) -> anyhow::Result<Value> {
    let mut heard = match mesh.client.subscribe(events.clone()).await {
        Ok(sub) => Some(sub),
        Err(e) => {
            hint(&format!(
                "cannot watch {events} ({e}); waiting for the reply only"
            ));
            None
        }
    };
    let refused = mesh.refusals.of_subscription(&events);
    tokio::pin!(call, refused);
    let mut parked: Option<(String, tokio::time::Instant)> = None;
    let mut still = tokio::time::interval(STILL_WAITING_EVERY);
    still.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // The events first: the gateway sends the decision's event before the reply, so
            // it is here by the time the reply is, and said before it.
            biased;
            msg = async { heard.as_mut()?.next().await }, if heard.is_some() => {
                let Some(msg) = msg else {
                    heard = None;
                    continue;
                };
                let Ok(event) = serde_json::from_slice::<Value>(&msg.payload) else { continue };
                let approval = &event["approval_request"];
                let id = approval["id"]
                    .as_str()
                    .or_else(|| event["approval_id"].as_str())
                    .unwrap_or("appr_…")
                    .to_owned();
                match event["kind"].as_str() {
                    Some("approval_required") if parked.is_none() => {
                        hint(&parked_hint(&id, approval, account, nats_url, wait_s));
                        parked = Some((id, tokio::time::Instant::now()));
                        still.reset();
                    }
                    Some(kind @ ("approved" | "rejected")) => {
                        let by = approval["decided_by"]
                            .as_str()
                            .map(|by| format!(" by {}", DisplaySafe(by)))
                            .unwrap_or_default();
                        hint(&format!("{id} {kind}{by}"));
                        parked = None;
                    }
                    _ => {}
                }
            }
            _ = still.tick(), if parked.is_some() => {
                if let Some((id, since)) = &parked {
                    let waited = since.elapsed().as_secs();
                    hint(&format!("still waiting for {id} ({waited} s of {wait_s} s)"));
                }
            }
            refusal = &mut refused, if heard.is_some() => {
                hint(&format!("not told while waiting: {refusal}"));
                heard = None;
            }
            reply = &mut call => return reply,
        }
    }
}

/// What `call --wait` says at once when its call parks on approval `id`: the first line names
/// the approval, its tool and risk and the subject that decides it; then who decides it and
/// the command to run.
fn parked_hint(
    id: &str,
    approval: &Value,
    account: &Account,
    nats_url: &str,
    wait_s: u64,
) -> String {
    let decide = public::approvals(account, ApprovalVerb::Decide);
    let tool = DisplaySafe(approval["tool_name"].as_str().unwrap_or("?"));
    let risk = approval["risk_level"].as_str().unwrap_or("?");
    let mut text = format!(
        "approval required: {id} ({tool}, risk {risk}) waits for a decision on {decide}; waiting up to {wait_s} s.\n"
    );
    text.push_str(&who_decides(
        nats_url,
        &decide,
        "Decide it in another terminal",
    ));
    text.push_str(&format!(
        "  toolmesh approvals approve {id} --account {account}    (or: reject)"
    ));
    text
}

/// A NATS URL (comma-separated servers) fit for logs and messages: credentials become `***`.
pub fn redacted_url(nats_url: &str) -> String {
    nats_url
        .split(',')
        .map(|url| {
            let (scheme, rest) = url.split_once("://").map_or(("", url), |(s, r)| (s, r));
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let shown = match rest[..authority_end].rsplit_once('@') {
                Some((_, host)) => format!("***@{host}{}", &rest[authority_end..]),
                None => rest.to_owned(),
            };
            if scheme.is_empty() {
                shown
            } else {
                format!("{scheme}://{shown}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `lead`, then who may decide an approval on `decide`: where the caller names a NATS user (an
/// authenticated cluster), a user allowed to publish there, as the compose cluster's approver.
fn who_decides(nats_url: &str, decide: &impl std::fmt::Display, lead: &str) -> String {
    if url_has_user(nats_url) {
        format!(
            "{lead}, as a NATS user allowed to publish on {decide} (on the compose cluster: the approver user, TOOLMESH_NATS_URL=nats://approver:<password>@<host>:4222 TOOLMESH_NATS_INBOX_PREFIX=_INBOX.approver):\n"
        )
    } else {
        format!("{lead}:\n")
    }
}

/// Whether any server of a (comma-separated) NATS URL names a user.
fn url_has_user(nats_url: &str) -> bool {
    nats_url.split(',').any(|url| {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        rest.split('/').next().unwrap_or_default().contains('@')
    })
}

fn exit_for(reply: &Value) -> ExitCode {
    if reply["ok"] == true {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_each_cause_once() {
        /// An error that prints its source itself, as many do.
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "connection failed: {}", self.0)
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let inner = std::io::Error::other("timed out");
        let e = anyhow::Error::new(Outer(inner)).context("cannot connect to NATS");
        assert_eq!(
            error_text(&e),
            "cannot connect to NATS: connection failed: timed out"
        );
        let plain = anyhow::anyhow!("a").context("b");
        assert_eq!(error_text(&plain), "b: a");
    }

    #[test]
    fn urls_lose_their_credentials_and_keep_the_rest() {
        let check = |url: &str, shown: &str| assert_eq!(redacted_url(url), shown, "{url}");
        check("nats://127.0.0.1:4222", "nats://127.0.0.1:4222");
        check("nats://acme:s3cret@host:4222", "nats://***@host:4222");
        check("tls://tok@host", "tls://***@host");
        check(
            "nats://a:b@one:4222,nats://two:4222",
            "nats://***@one:4222,nats://two:4222",
        );
        check("user:pw@host:4222", "***@host:4222");
        assert!(url_has_user("nats://acme:x@h:4222"));
        assert!(!url_has_user("nats://h:4222,nats://i:4222"));
    }
}
