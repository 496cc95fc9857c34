//! The client commands: `call`, `mcp`, `approvals`, `audit`, `status` and `events`, each over
//! one NATS connection.

use anyhow::{bail, Context as _};
use std::process::ExitCode;

use serde_json::{json, Value};

use toolmesh_kernel::config::RawEnv;
use toolmesh_kernel::host::connect_client_with_inbox;
use toolmesh_kernel::subjects::public::{self, ApprovalVerb};
use toolmesh_kernel::{InvocationId, NodeId};

use crate::cli::args::{
    parse_account, parse_args, ApprovalsCommand, ApproveArgs, Command, DecideArgs, GrantsCommand,
    NATS_URL_ARG,
};
use crate::cli::events::{print_streams, replay_events};
use crate::cli::mesh::{request, Mesh};
use crate::cli::output::{exit_for, hint, print_json};
use crate::cli::waiting::{approval_hint, wait_telling};

pub(super) async fn run_client(
    nats_url: &str,
    inbox_prefix: Option<&str>,
    command: Command,
) -> anyhow::Result<ExitCode> {
    let servers = toolmesh_kernel::config::nats_url(Some(nats_url), NATS_URL_ARG)?;
    let (nats, refusals) = connect_client_with_inbox(&servers, "toolmesh-cli", inbox_prefix)
        .await
        .map_err(|e| {
            let url = &servers;
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
            let arguments = parse_args(&args).context("--args")?;
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
                user_id: None,
            };
            let settings = toolmesh_mcp::front_settings(&RawEnv::from_process())?;
            toolmesh_mcp::serve_stdio(mesh.client, mesh.refusals, settings, caller)
                .await
                .map_err(anyhow::Error::msg)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Approvals { action } => approvals(&mesh, action).await,
        Command::Grants { action } => {
            let (subject, body) = match action {
                GrantsCommand::List { account } => {
                    (public::grants(&parse_account(&account)?, "list"), json!({}))
                }
                GrantsCommand::Revoke { id, account } => (
                    public::grants(&parse_account(&account)?, "revoke"),
                    json!({ "id": id }),
                ),
            };
            let reply = request(&mesh, subject, &body, 10).await?;
            print_json(&reply)?;
            Ok(exit_for(&reply))
        }
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
        ApprovalsCommand::Approve(approve) => approval(approve)?,
        ApprovalsCommand::Reject(decide) => decision(decide, false)?,
        ApprovalsCommand::Explain { id, account } => {
            let subject = public::approvals(&parse_account(&account)?, ApprovalVerb::Get);
            let reply = request(mesh, subject, &json!({ "id": id }), 10).await?;
            if reply["ok"] != true {
                print_json(&reply)?;
                return Ok(exit_for(&reply));
            }
            for line in crate::cli::explain::explain(&reply["approval"]) {
                crate::cli::output::emit(&line)?;
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    let reply = request(mesh, subject, &body, 10).await?;
    print_json(&reply)?;
    if let Some(note) = arguments_check(&reply) {
        hint(&note);
    }
    Ok(exit_for(&reply))
}

/// The subject and body of `approve`, with the grant it asks for.
fn approval(args: ApproveArgs) -> anyhow::Result<(String, Value)> {
    let (subject, mut body) = decision(args.decide, true)?;
    if let Some(arguments) = args.arguments {
        body["arguments"] = parse_args(&arguments).context("--arguments")?;
    }
    if let Some(scope) = args.grant {
        let mut grant = json!({ "scope": scope });
        if !args.grant_tools.is_empty() {
            grant["tools"] = json!(args.grant_tools);
        }
        if let Some(when) = args.grant_when {
            grant["when"] = serde_json::from_str(&when).context("--grant-when is not JSON")?;
        }
        if let Some(seconds) = args.grant_expires_in_s {
            grant["expires_in_s"] = json!(seconds);
        }
        if let Some(uses) = args.grant_uses {
            grant["uses"] = json!(uses);
        }
        body["grant"] = grant;
    }
    Ok((subject, body))
}

/// The subject and body of `approve` (`approved`) or `reject`: on `…decide.<name>` with
/// `--as`, else on `…decide` naming `--approver`.
fn decision(args: DecideArgs, approved: bool) -> anyhow::Result<(String, Value)> {
    let DecideArgs {
        id,
        account,
        approver,
        as_reviewer,
        reason,
    } = args;
    let account = parse_account(&account)?;
    let subject = match &as_reviewer {
        Some(name) if toolmesh_kernel::policy::is_reviewer_name(name) => {
            public::approvals_decide_as(&account, name)
        }
        Some(name) => bail!("--as {name:?}: a reviewer's name is [A-Za-z0-9_-]{{1,64}}"),
        None => public::approvals(&account, ApprovalVerb::Decide),
    };
    Ok((
        subject,
        json!({ "id": id, "approved": approved, "approver": approver, "reason": reason }),
    ))
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
