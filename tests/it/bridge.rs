//! The bridge role: MCP servers (real ones from PyPI, and a fixture written with the Python
//! SDK) served as NATS micro-service providers by a real `toolmesh node --roles bridge`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::service::Info;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_testkit::{request_json_within, venv_bin, wait_until, ClosedPort};

use crate::support::{assert_error, assert_holds, node_refusal, ok, temp_file, Cluster};

/// How long a server may take to start and list its tools (Python start-up on a busy machine).
const SERVE_WITHIN: Duration = Duration::from_secs(60);

fn fixture() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python/mcp_fixture.py")
        .display()
        .to_string()
}

/// A stdio fixture server entry, recording its state in `state`.
fn fixture_server(state: &Path) -> Value {
    json!({
        "command": venv_bin("python").display().to_string(),
        "args": [fixture()],
        "env": {"FIXTURE_STATE_DIR": state.display().to_string()},
    })
}

/// A cluster with one bridge node serving `servers` (the `mcpServers` object).
struct Bridge {
    cluster: Cluster,
    /// Holds the servers file while the node runs.
    _dir: tempfile::TempDir,
}

impl Bridge {
    async fn start(servers: Value) -> Bridge {
        Self::start_with(servers, "bridge", &[]).await
    }

    /// One node of `roles` (which include `bridge`) serving `servers`, with `env` too.
    async fn start_with(servers: Value, roles: &str, env: &[(&str, &str)]) -> Bridge {
        let servers = json!({ "mcpServers": servers }).to_string();
        let (dir, file) = temp_file("mcp-servers.json", servers);
        let mut cluster = Cluster::servers().await;
        let file = file.display().to_string();
        let mut env = env.to_vec();
        env.push(("TOOLMESH_MCP_SERVERS", &file));
        cluster.start_node(roles, &env).await;
        Bridge { cluster, _dir: dir }
    }

    fn client(&self) -> &async_nats::Client {
        &self.cluster.client
    }

    /// The bridge node's status of server `name`.
    async fn server_status(&self, name: &str) -> Value {
        let node = &self.cluster.nodes[0].node_id;
        let status = toolmesh_testkit::request_json(
            self.client(),
            format!("toolmesh.v1.status.{node}"),
            json!({}),
        )
        .await;
        status["bridge"]["servers"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == name).cloned())
            .unwrap_or(Value::Null)
    }

    /// Waits until server `name` runs with a pid other than `not`; its status then.
    async fn running(&self, name: &str, not: Option<u64>) -> Value {
        let deadline = Instant::now() + SERVE_WITHIN;
        loop {
            let status = self.server_status(name).await;
            let other_pid = not.is_none_or(|old| status["pid"].as_u64() != Some(old));
            if status["state"] == "running" && other_pid {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "server {name} is not running: {status}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Every `$SRV.INFO.<service>` reply (one per instance), until none came for 300 ms.
async fn infos(client: &async_nats::Client, service: &str) -> Vec<Info> {
    let inbox = client.new_inbox();
    let mut sub = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply(format!("$SRV.INFO.{service}"), inbox, Bytes::new())
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
        if msg.status.is_none() {
            out.push(serde_json::from_slice(&msg.payload).expect("an info_response"));
        }
    }
    out
}

/// Waits until the one instance of `service` serves every tool of `names`; its INFO then.
async fn serving(client: &async_nats::Client, service: &str, names: &[&str]) -> Info {
    let deadline = Instant::now() + SERVE_WITHIN;
    loop {
        let mut found = infos(client, service).await;
        let serves = |info: &Info| {
            names
                .iter()
                .all(|n| info.endpoints.iter().any(|e| e.name == *n))
        };
        if found.len() == 1 && serves(&found[0]) {
            return found.remove(0);
        }
        assert!(
            Instant::now() < deadline,
            "{service} does not serve {names:?}: {found:?}"
        );
    }
}

/// The `toolmesh.tool` metadata of endpoint `name`, and its subject.
fn tool_of(info: &Info, name: &str) -> (Value, String) {
    let endpoint = info
        .endpoints
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no endpoint {name}"));
    let spec =
        serde_json::from_str(&endpoint.metadata["toolmesh.tool"]).expect("toolmesh.tool is JSON");
    (spec, endpoint.subject.clone())
}

/// A provider call (the envelope the gateway sends) straight to an endpoint subject.
async fn call(client: &async_nats::Client, subject: &str, tool: &str, arguments: Value) -> Value {
    call_within(
        client,
        subject,
        tool,
        "inv_test",
        arguments,
        Duration::from_secs(20),
    )
    .await
}

/// A provider call that fails: a `provider_error` that says `says`.
async fn provider_error(
    client: &async_nats::Client,
    subject: &str,
    tool: &str,
    arguments: Value,
    says: &str,
) {
    let r = call(client, subject, tool, arguments).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_error(&r, "provider_error", says);
}

/// `fixture_sleep` for 120 s as `invocation` (`tag` names its files under `state`) in a task of
/// its own, answered within 30 s; returned once the server has started it.
async fn sleeping(
    client: &async_nats::Client,
    subject: &str,
    invocation: &'static str,
    tag: &str,
    state: &Path,
) -> tokio::task::JoinHandle<Value> {
    let (client, subject) = (client.clone(), subject.to_owned());
    let arguments = json!({"seconds": 120, "tag": tag});
    let pending = tokio::spawn(async move {
        let within = Duration::from_secs(30);
        call_within(
            &client,
            &subject,
            "fixture_sleep",
            invocation,
            arguments,
            within,
        )
        .await
    });
    assert!(file_appears(&state.join(format!("{tag}.started"))).await);
    pending
}

async fn call_within(
    client: &async_nats::Client,
    subject: &str,
    tool: &str,
    invocation: &str,
    arguments: Value,
    wait: Duration,
) -> Value {
    request_json_within(
        client,
        subject.to_owned(),
        json!({
            "tool": tool, "arguments": arguments, "invocation_id": invocation,
            "account": "acme", "session_id": null, "user_id": "u", "agent_id": "a",
        }),
        wait,
    )
    .await
}

fn kill(pid: u64) {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

async fn file_appears(path: &Path) -> bool {
    wait_until(SERVE_WITHIN, || async { path.exists() }).await
}

fn git(repo: &Path, args: &[&str]) {
    git_output(repo, args);
}

/// What `git args` prints in `repo`; it must succeed.
fn git_output(repo: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(repo)
        .output()
        .expect("git runs");
    assert!(output.status.success(), "git {args:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// A repository with one commit (`a.txt`) and one untracked file (`new.txt`).
fn repo_with_an_untracked_file() -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    git(repo.path(), &["init", "-q"]);
    std::fs::write(repo.path().join("a.txt"), "a\n").unwrap();
    git(repo.path(), &["add", "a.txt"]);
    git(repo.path(), &["commit", "-q", "-m", "first"]);
    std::fs::write(repo.path().join("new.txt"), "new\n").unwrap();
    repo
}

#[tokio::test]
async fn pypi_servers_are_providers_with_their_schemas_risks_and_results() {
    let repo = repo_with_an_untracked_file();
    let b = Bridge::start(json!({
        "time": {"command": venv_bin("mcp-server-time").display().to_string(),
                 "args": ["--local-timezone", "UTC"]},
        "git": {"command": venv_bin("mcp-server-git").display().to_string()},
    }))
    .await;
    let client = b.client();

    let git_info = serving(client, "mcp-git", &["git_git_status", "git_git_add"]).await;
    assert_eq!(git_info.metadata["toolmesh.bridge.server"], "git");
    let (status_spec, status_subject) = tool_of(&git_info, "git_git_status");
    assert_eq!(
        status_subject,
        "toolmesh.internal.v1.mcp.git.git_git_status"
    );
    assert_eq!(status_spec["risk_level"], "low", "{status_spec}");
    assert_eq!(status_spec["group"], "mcp");
    assert_eq!(
        status_spec["input_schema"]["properties"]["repo_path"]["type"], "string",
        "the MCP tool's own schema: {status_spec}"
    );
    assert!(!status_spec["description"].as_str().unwrap().is_empty());
    let (add_spec, _) = tool_of(&git_info, "git_git_add");
    assert_ne!(add_spec["risk_level"], "low", "{add_spec}");

    let time_info = serving(client, "mcp-time", &["time_get_current_time"]).await;
    let (_, time_subject) = tool_of(&time_info, "time_get_current_time");
    let r = ok(call(
        client,
        &time_subject,
        "time_get_current_time",
        json!({"timezone": "UTC"}),
    )
    .await);
    assert_holds(&r, "text", "UTC");
    assert_eq!(r["content"][0]["type"], "text", "{r}");

    let repo_path = repo.path().display().to_string();
    let r = ok(call(
        client,
        &status_subject,
        "git_git_status",
        json!({"repo_path": repo_path}),
    )
    .await);
    assert_holds(&r, "text", "new.txt");

    // The server's own refusal of bad arguments is the provider's error.
    let bad_zone = json!({"timezone": "Not/AZone"});
    provider_error(
        client,
        &time_subject,
        "time_get_current_time",
        bad_zone,
        "Not/AZone",
    )
    .await;
    let r = call(client, &time_subject, "time_get_current_time", json!({})).await;
    assert_eq!(r["error"], "provider_error", "{r}");

    // Node status lists both servers with their tools.
    for (name, service) in [("time", "mcp-time"), ("git", "mcp-git")] {
        let s = b.running(name, None).await;
        assert_eq!(s["service"], service);
        assert_eq!(s["transport"], "stdio");
        assert!(s["tools"].as_u64().unwrap() >= 1, "{s}");
        assert_eq!(s["restarts"], 0);
    }
}

#[tokio::test]
async fn is_error_results_are_provider_errors_and_killed_servers_restart() {
    let state = tempfile::tempdir().unwrap();
    let b = Bridge::start(json!({"fixture": fixture_server(state.path())})).await;
    let client = b.client();
    let info = serving(client, "mcp-fixture", &["fixture_echo", "fixture_fail"]).await;
    let (_, echo) = tool_of(&info, "fixture_echo");
    let (_, fail) = tool_of(&info, "fixture_fail");

    let message = json!({"message": "no such thing"});
    provider_error(client, &fail, "fixture_fail", message, "no such thing").await;

    let first = b.running("fixture", None).await;
    let pid = first["pid"].as_u64().expect("a pid");
    kill(pid);
    let again = b.running("fixture", Some(pid)).await;
    assert_eq!(again["restarts"], 1, "{again}");
    assert_holds(&again, "last_error", "exited");
    let r = ok(call(client, &echo, "fixture_echo", json!({"text": "back"})).await);
    assert_eq!(r["text"], "back");
}

#[tokio::test]
async fn a_server_killed_mid_call_answers_its_caller_unavailable() {
    let state = tempfile::tempdir().unwrap();
    let b = Bridge::start(json!({"fixture": fixture_server(state.path())})).await;
    let client = b.client().clone();
    let info = serving(&client, "mcp-fixture", &["fixture_sleep"]).await;
    let (_, sleep) = tool_of(&info, "fixture_sleep");
    let pid = b.running("fixture", None).await["pid"].as_u64().unwrap();

    // The call sleeps 120 s at the server; the caller waits 30 s at most. Only the bridge
    // answering for the dead server can end it in time.
    let pending = sleeping(&client, &sleep, "inv_mid", "mid", state.path()).await;
    kill(pid);
    let r = pending.await.unwrap();
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"], "unavailable", "{r}");
}

#[tokio::test]
async fn a_cancel_reaches_the_mcp_server_and_list_changes_are_served() {
    let state = tempfile::tempdir().unwrap();
    let b = Bridge::start(json!({"fixture": fixture_server(state.path())})).await;
    let client = b.client().clone();
    let info = serving(
        &client,
        "mcp-fixture",
        &["fixture_sleep", "fixture_add_tool"],
    )
    .await;
    let (_, sleep) = tool_of(&info, "fixture_sleep");
    let (_, add) = tool_of(&info, "fixture_add_tool");

    let pending = sleeping(&client, &sleep, "inv_cancel_me", "c", state.path()).await;
    client
        .publish(
            "toolmesh.v1.providers.cancel.mcp-fixture",
            json!({"invocation_id": "inv_cancel_me"}).to_string().into(),
        )
        .await
        .unwrap();
    let r = pending.await.unwrap();
    assert_eq!(r["error"], "cancelled", "{r}");
    assert!(
        file_appears(&state.path().join("c.cancelled")).await,
        "the server saw notifications/cancelled"
    );

    // A tool added at run time: the server says its list changed; the bridge re-lists,
    // serves it and announces the change.
    let mut announces = client
        .subscribe("toolmesh.v1.providers.announce")
        .await
        .unwrap();
    client.flush().await.unwrap();
    ok(call(&client, &add, "fixture_add_tool", json!({"name": "late"})).await);
    let info = serving(&client, "mcp-fixture", &["fixture_late", "fixture_echo"]).await;
    let (_, late) = tool_of(&info, "fixture_late");
    let r = call(&client, &late, "fixture_late", json!({"text": "hi"})).await;
    assert_eq!(r["text"], "hi", "{r}");
    let announce = tokio::time::timeout(SERVE_WITHIN, announces.next())
        .await
        .expect("an announce")
        .unwrap();
    let announce: Value = serde_json::from_slice(&announce.payload).unwrap();
    assert_eq!(announce["service"], "mcp-fixture", "{announce}");
}

/// A tool call through the gateway (`toolmesh.v1.call.acme`).
async fn through_gateway(b: &Bridge, body: Value) -> Value {
    request_json_within(
        b.client(),
        "toolmesh.v1.call.acme",
        body,
        Duration::from_secs(30),
    )
    .await
}

/// Repeats `body` through the gateway until its reply passes `done` (at most
/// [`SERVE_WITHIN`]); that reply.
async fn gateway_until(b: &Bridge, body: &Value, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + SERVE_WITHIN;
    loop {
        let reply = through_gateway(b, body.clone()).await;
        if done(&reply) {
            return reply;
        }
        assert!(Instant::now() < deadline, "{body} still answers {reply}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn mcp_tools_run_through_the_gateway_gated_by_their_annotations_and_after_a_restart() {
    let repo = repo_with_an_untracked_file();
    let repo_path = repo.path().display().to_string();
    let b = Bridge::start_with(
        json!({"git": {"command": venv_bin("mcp-server-git").display().to_string()}}),
        "gateway,approval,bridge",
        &[("TOOLMESH_TOOL_APPROVAL_MODE", "strict")],
    )
    .await;
    let status_call = json!({"tool": "git_git_status", "arguments": {"repo_path": repo_path}});
    // Found by the gateway (the bridge announces its tools): the read-only tool runs at once.
    let first = ok(gateway_until(&b, &status_call, |r| r["error"] != "unknown_tool").await);
    assert_holds(&first, "text", "new.txt");

    // git_add (destructiveHint false: medium) is gated in strict mode.
    let add = json!({"tool": "git_git_add", "session_id": "s1",
                     "arguments": {"repo_path": repo_path, "files": ["new.txt"]}});
    let gated = through_gateway(&b, add.clone()).await;
    assert_eq!(gated["error"], "approval_required", "{gated}");
    assert_eq!(gated["approval_request"]["risk_level"], "medium", "{gated}");
    let id = gated["approval_request"]["id"].as_str().unwrap().to_owned();
    let mut with_id = add.clone();
    with_id["approval"] = json!({"id": id});
    let pending = through_gateway(&b, with_id.clone()).await;
    assert_eq!(pending["error"], "approval_pending", "{pending}");
    assert_eq!(
        git_output(repo.path(), &["diff", "--cached", "--name-only"]),
        ""
    );
    assert_eq!(b.cluster.decide("acme", &id, true).await["ok"], true);
    ok(through_gateway(&b, with_id).await);
    assert_eq!(
        git_output(repo.path(), &["diff", "--cached", "--name-only"]),
        "new.txt\n"
    );

    // The server killed: the bridge restarts it and the gateway's calls work again.
    let pid = b.running("git", None).await["pid"].as_u64().unwrap();
    kill(pid);
    b.running("git", Some(pid)).await;
    let again = gateway_until(&b, &status_call, |r| r["ok"] == true).await;
    assert_holds(&again, "text", "new.txt");
}

/// A streamable-HTTP fixture server, killed on drop.
struct HttpFixture(Child);

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn an_http_server_is_served_by_url() {
    let state = tempfile::tempdir().unwrap();
    let child = Command::new(venv_bin("python"))
        .args([fixture(), "--http".into(), "0".into()])
        .env("FIXTURE_STATE_DIR", state.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the fixture starts");
    let _server = HttpFixture(child);
    // The fixture listens before it writes the port it was given.
    let port_file = state.path().join("port");
    assert!(
        wait_until(SERVE_WITHIN, || async { port_file.exists() }).await,
        "the fixture did not listen"
    );
    let port = std::fs::read_to_string(&port_file).unwrap();
    let b = Bridge::start(json!({
        "web": {"type": "http", "url": format!("http://127.0.0.1:{port}/mcp")}
    }))
    .await;
    let info = serving(b.client(), "mcp-web", &["web_echo"]).await;
    assert_eq!(info.metadata["toolmesh.bridge.transport"], "http");
    let (spec, echo) = tool_of(&info, "web_echo");
    assert_eq!(spec["risk_level"], "low");
    let r = ok(call(b.client(), &echo, "web_echo", json!({"text": "over http"})).await);
    assert_eq!(r["text"], "over http");
    let s = b.running("web", None).await;
    assert_eq!(s["transport"], "http");
}

#[tokio::test]
async fn a_bad_servers_file_stops_the_node_naming_the_server_and_field() {
    let (_dir, file) = temp_file(
        "mcp-servers.json",
        r#"{"mcpServers": {"git": {"command": "mcp-server-git", "args": ["--repository", 7]}}}"#,
    );
    let file = file.display().to_string();
    let stderr = node_refusal("bridge", &[("TOOLMESH_MCP_SERVERS", &file)]);
    assert!(stderr.contains("mcpServers.git.args[1]"), "{stderr}");
    assert!(stderr.contains("must be a string"), "{stderr}");
}

/// Finding 5 of issue 28: every account may ask `toolmesh.v1.status`, and a bridge server's
/// `last_error` carried its URL with the `?api_key=…` query (and any `user:password@`).
#[tokio::test]
async fn a_servers_url_credentials_stay_out_of_status() {
    // Nothing listens there: connecting fails, and the error names the URL.
    let nowhere = ClosedPort::new();
    let url = format!(
        "http://admin:pa55word@127.0.0.1:{}/mcp?api_key=s3cret-key",
        nowhere.port()
    );
    let b = Bridge::start(json!({"remote": {"url": url}})).await;
    let failed = wait_until(SERVE_WITHIN, || async {
        b.server_status("remote").await["last_error"].is_string()
    })
    .await;
    assert!(
        failed,
        "the server never failed: {}",
        b.server_status("remote").await
    );
    let status = request_json_within(
        b.client(),
        format!("toolmesh.v1.status.{}", b.cluster.nodes[0].node_id),
        json!({}),
        Duration::from_secs(5),
    )
    .await
    .to_string();
    for secret in ["s3cret-key", "pa55word", "admin:"] {
        assert!(!status.contains(secret), "status shows {secret}: {status}");
    }
    assert!(
        status.contains("127.0.0.1"),
        "the error still names the host: {status}"
    );
}
