//! A permission the NATS server refuses ends a client command at once, saying which
//! permission, on which subject, for which user, and for the reply inbox which prefix to set
//! (issue 29, item 3): the deployment's users (docker/nats.conf) and a real node.

use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::ServiceExt as _;
use tokio::io::AsyncBufReadExt as _;
use toolmesh_testkit::{NatsServer, Node, NodeSpec, RedisServer};

use crate::support::{assert_holds, Deployed, BIN};

/// Well under the shortest timeout that used to end these commands (5 s for `status`); a
/// refusal comes back from the server within milliseconds.
const AT_ONCE: Duration = Duration::from_secs(4);

/// One node (gateway and approval) on the deployment's NATS, as the node user.
struct Deployment {
    servers: Deployed,
    _node: Node,
}

impl Deployment {
    async fn start() -> Deployment {
        let servers = Deployed::start();
        let node = servers.start_node("gateway,approval", "perm-1").await;
        Deployment {
            servers,
            _node: node,
        }
    }

    /// `toolmesh <args>` as `user`, with `inbox` as its inbox prefix (none: the variable
    /// unset): exit code, stderr and how long it took. Killed after 30 s.
    async fn cli(&self, user: &str, inbox: Option<&str>, args: &[&str]) -> (i32, String, Duration) {
        let mut command = tokio::process::Command::new(BIN);
        command
            .args(args)
            .env("TOOLMESH_NATS_URL", self.servers.nats.url(user))
            .env_remove("TOOLMESH_NATS_INBOX_PREFIX")
            .env_remove("RUST_LOG")
            .kill_on_drop(true);
        if let Some(prefix) = inbox {
            command.env("TOOLMESH_NATS_INBOX_PREFIX", prefix);
        }
        let started = Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(30), command.output())
            .await
            .unwrap_or_else(|_| panic!("toolmesh {args:?} still runs after 30 s"))
            .expect("toolmesh runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), stderr, started.elapsed())
    }

    /// [`Deployment::cli`] refused at once: asserts that it exits 2 within [`AT_ONCE`],
    /// answers its stderr.
    async fn refused(&self, user: &str, inbox: Option<&str>, args: &[&str]) -> String {
        let (code, stderr, took) = self.cli(user, inbox, args).await;
        assert_eq!(code, 2, "{stderr}");
        assert!(took < AT_ONCE, "took {took:?}: {stderr}");
        stderr
    }
}

/// A command the deployment refuses: what it does, its inbox prefix, its arguments, whether its
/// stderr is one line, and what that says.
type Refused = (
    &'static str,
    Option<&'static str>,
    &'static [&'static str],
    bool,
    &'static [&'static str],
);

#[tokio::test]
async fn a_refused_publish_or_inbox_ends_a_command_at_once_and_says_why() {
    let d = Deployment::start().await;
    let acme_inbox = Some("_INBOX.acme");

    // The right user and prefix: the cluster answers (what follows is not a dead cluster).
    let (code, stderr, _) = d.cli("acme", acme_inbox, &["status"]).await;
    assert_eq!(code, 0, "{stderr}");

    // None of the refused commands gives the password away.
    let cases: [Refused; 4] = [
        (
            // It used to wait 150 s for `no reply`.
            "a call on another account's subject",
            acme_inbox,
            &["call", "component_status", "--account", "globex"],
            true,
            &[
                "user \"acme\"",
                "permission to publish to toolmesh.v1.call.globex",
            ],
        ),
        (
            // It used to wait 10 s.
            "deciding as an account user",
            acme_inbox,
            &[
                "approvals",
                "approve",
                "appr_0123456789abcdef",
                "--account",
                "acme",
            ],
            false,
            &["publish to toolmesh.v1.approvals.acme.decide"],
        ),
        (
            // The replies' inbox is refused (it used to wait 5 s for `no reply`).
            "no inbox prefix",
            None,
            &["status"],
            true,
            &[
                "user \"acme\"",
                "subscribe to _INBOX.",
                "TOOLMESH_NATS_INBOX_PREFIX=_INBOX.acme",
                "--inbox-prefix _INBOX.acme",
            ],
        ),
        (
            // It ends too, instead of printing nothing forever.
            "watching what the user may not see",
            acme_inbox,
            &["approvals", "watch", "--account", "globex"],
            false,
            &["subscribe to toolmesh.v1.approvals.globex.requested"],
        ),
    ];
    for (what, inbox, args, one_line, says) in cases {
        let stderr = d.refused("acme", inbox, args).await;
        if one_line {
            assert_eq!(stderr.lines().count(), 1, "{what}: one line: {stderr}");
        }
        for words in says {
            assert!(stderr.contains(words), "{what}: {words:?}: {stderr}");
        }
        assert!(!stderr.contains("acme-pw"), "{what}: no password: {stderr}");
    }
}

/// `toolmesh mcp` as an account user without its inbox prefix: the client's first request
/// fails at once naming the prefix (it used to say "the gateway did not answer in time" after
/// 30 s), and so does the log on stderr, where an MCP client shows it.
#[tokio::test]
async fn toolmesh_mcp_without_the_inbox_prefix_says_which_to_set() {
    let d = Deployment::start().await;
    let mut child = tokio::process::Command::new(BIN)
        .args(["mcp", "--account", "acme", "--session", "s1"])
        .env("TOOLMESH_NATS_URL", d.servers.nats.url("acme"))
        .env_remove("TOOLMESH_NATS_INBOX_PREFIX")
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("toolmesh mcp starts");
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let mut log = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let client = ().serve(io).await.expect("the MCP handshake");

    let started = Instant::now();
    let listed = tokio::time::timeout(Duration::from_secs(20), client.list_tools(None))
        .await
        .expect("tools/list answers");
    let took = started.elapsed();
    let message = match listed {
        Err(rmcp::ServiceError::McpError(e)) => e.message.to_string(),
        other => panic!("tools/list should fail: {other:?}"),
    };
    assert!(took < AT_ONCE, "took {took:?}: {message}");
    assert!(
        message.contains("TOOLMESH_NATS_INBOX_PREFIX=_INBOX.acme"),
        "{message}"
    );
    assert!(message.contains("user \"acme\""), "{message}");

    let call = rmcp::model::CallToolRequestParams::new("component_status");
    let result = tokio::time::timeout(Duration::from_secs(20), client.call_tool(call))
        .await
        .expect("tools/call answers")
        .expect("a tool result");
    assert_eq!(result.is_error, Some(true));
    let reply = result.structured_content.expect("the reply");
    assert_holds(
        &reply,
        "error_message",
        "TOOLMESH_NATS_INBOX_PREFIX=_INBOX.acme",
    );

    let said = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = log.next_line().await.unwrap() {
            if line.contains("TOOLMESH_NATS_INBOX_PREFIX=_INBOX.acme") {
                return line;
            }
        }
        panic!("stderr ended without naming the prefix");
    })
    .await
    .expect("the log names the prefix");
    assert!(said.contains("subscribe to _INBOX."), "{said}");
    let _ = client.cancel().await;
}

/// A gateway whose own NATS user may not publish where it routes a call (here the workspace
/// role's run subject) answers at once, saying which subject, instead of the caller waiting
/// out the tool's timeout; the node's log names its user.
#[tokio::test]
async fn a_gateway_refused_a_publish_answers_at_once() {
    let server = NatsServer::start_with_config(
        r#"authorization { users = [
  { user: node, password: node-pw, permissions: {
      publish: { allow: [">"], deny: ["toolmesh.internal.v1.run.workspace"] }
      subscribe: { allow: [">"] } } }
  { user: admin, password: admin-pw }
] }
"#,
    );
    let port = server.port();
    let admin = async_nats::ConnectOptions::new()
        .user_and_password("admin".into(), "admin-pw".into())
        .connect(format!("127.0.0.1:{port}"))
        .await
        .expect("connect as admin");
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let _node = NodeSpec::new(BIN, "gateway,workspace", "perm-gw-1")
        .env(
            "TOOLMESH_NATS_URL",
            format!("nats://node:node-pw@127.0.0.1:{port}"),
        )
        .env("TOOLMESH_REDIS_URL", redis.url())
        .env("TOOLMESH_DATA_DIR", data.path().display().to_string())
        .env("TOOLMESH_TOOL_APPROVAL_MODE", "off")
        .start(&admin)
        .await;
    let started = Instant::now();
    let reply = toolmesh_testkit::request_json_within(
        &admin,
        "toolmesh.v1.call.acme",
        serde_json::json!({"tool": "list_workspace_files", "session_id": "s1", "arguments": {}}),
        Duration::from_secs(20),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(reply["error"], "unavailable", "{reply}");
    assert!(took < AT_ONCE, "took {took:?}: {reply}");
    let message = reply["error_message"].as_str().unwrap();
    assert!(
        message.contains("publish to toolmesh.internal.v1.run.workspace"),
        "{message}"
    );
    assert!(!message.contains("node-pw"), "{message}");
}
