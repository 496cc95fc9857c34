//! A test cluster: one nats-server, one redis-server, and `toolmesh node` processes.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{Subject, Subscriber};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use toolmesh_kernel::wire::ActorCall;
use toolmesh_testkit::{
    request_json, wait_until, AuthNats, Listener, NatsServer, Node, NodeSpec, RedisServer,
};

pub const BIN: &str = env!("CARGO_BIN_EXE_toolmesh");

/// The command line `toolmesh`, against the NATS at `nats_url`: add the arguments and run it.
pub fn toolmesh_cli(nats_url: &str) -> std::process::Command {
    let mut command = std::process::Command::new(BIN);
    command.env("TOOLMESH_NATS_URL", nats_url);
    command
}

/// Runs `tests/python/<script>` with the venv's python and `spec` as its one argument: its
/// stdout piped for the test to read (a JSON line per step), its stderr the test's own.
pub fn python_script(script: &str, spec: &Value) -> tokio::process::Child {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    tokio::process::Command::new(toolmesh_testkit::venv_bin("python"))
        .arg(script)
        .arg(spec.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the venv's python starts")
}

pub struct Cluster {
    pub nats: NatsServer,
    pub redis: RedisServer,
    pub client: async_nats::Client,
    pub nodes: Vec<Node>,
    next_id: usize,
    /// Node ids are `<prefix>-<n>`.
    pub node_prefix: String,
    pub data_dir: tempfile::TempDir,
}

impl Cluster {
    /// Servers only; add nodes with [`Cluster::start_node`].
    pub async fn servers() -> Cluster {
        Self::servers_on(NatsServer::start()).await
    }

    /// Servers only, NATS with a `max_payload` of `bytes`.
    pub async fn servers_with_max_payload(bytes: usize) -> Cluster {
        Self::servers_on(NatsServer::start_with_max_payload(bytes)).await
    }

    /// Servers only, NATS with JetStream (durable events, the audit trail; its store kept
    /// across [`NatsServer::restart`]).
    pub async fn servers_with_jetstream() -> Cluster {
        Self::servers_on(NatsServer::start_jetstream()).await
    }

    async fn servers_on(nats: NatsServer) -> Cluster {
        let redis = RedisServer::start();
        let client = nats.client().await;
        Cluster {
            nats,
            redis,
            client,
            nodes: Vec::new(),
            next_id: 0,
            node_prefix: "test-node".to_owned(),
            data_dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// Servers and one node with gateway and approval roles and the given extra environment.
    pub async fn with_env(env: &[(&str, &str)]) -> Cluster {
        Self::with_node("gateway,approval", env).await
    }

    /// Servers and one node of `roles` with `env`.
    pub async fn with_node(roles: &str, env: &[(&str, &str)]) -> Cluster {
        let mut cluster = Cluster::servers().await;
        cluster.start_node(roles, env).await;
        cluster
    }

    /// Servers and one node of `roles` with approvals off (no call needs one).
    pub async fn ungated(roles: &str) -> Cluster {
        Self::with_node(roles, &[("TOOLMESH_TOOL_APPROVAL_MODE", "off")]).await
    }

    pub async fn start() -> Cluster {
        Self::with_env(&[]).await
    }

    pub fn spec(&mut self, roles: &str, env: &[(&str, &str)]) -> NodeSpec {
        self.next_id += 1;
        let mut spec = NodeSpec::new(
            BIN,
            roles,
            &format!("{}-{}", self.node_prefix, self.next_id),
        )
        .env("TOOLMESH_NATS_URL", self.nats.url())
        .env("TOOLMESH_REDIS_URL", self.redis.url())
        .env(
            "TOOLMESH_DATA_DIR",
            self.data_dir.path().display().to_string(),
        );
        for (k, v) in env {
            spec = spec.env(k, *v);
        }
        spec
    }

    pub async fn start_node(&mut self, roles: &str, env: &[(&str, &str)]) -> usize {
        let spec = self.spec(roles, env);
        let node = spec.start(&self.client).await;
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Starts a node of `roles` with `env`: the address its `listener` took.
    pub async fn start_listening(
        &mut self,
        roles: &str,
        env: &[(&str, &str)],
        listener: Listener,
    ) -> std::net::SocketAddr {
        let node = self.start_node(roles, env).await;
        self.nodes[node].addr(listener)
    }

    /// Starts a node of `roles` serving the MCP front ([`mcp_front_env`] of `tokens` and `env`):
    /// the front's URL.
    pub async fn start_mcp_front(
        &mut self,
        roles: &str,
        tokens: &std::path::Path,
        env: &[(&str, &str)],
    ) -> String {
        let env = mcp_front_env(tokens, env);
        let listen = self.start_listening(roles, &env, Listener::Mcp).await;
        format!("http://{listen}/mcp")
    }

    /// A tool call on `toolmesh.v1.call.<account>`.
    pub async fn call(&self, account: &str, body: Value) -> Value {
        request_json(&self.client, format!("toolmesh.v1.call.{account}"), body).await
    }

    /// A call of `tool` with `arguments` in `session` of `account` (and nothing else).
    pub async fn session_call(
        &self,
        account: &str,
        session: &str,
        tool: &str,
        arguments: Value,
    ) -> Value {
        let body = json!({"tool": tool, "session_id": session, "arguments": arguments});
        self.call(account, body).await
    }

    /// A call of `tool` with `arguments` in no session of `account` (and nothing else).
    pub async fn tool_call(&self, account: &str, tool: &str, arguments: Value) -> Value {
        let body = json!({"tool": tool, "arguments": arguments});
        self.call(account, body).await
    }

    /// `read_workspace_file` of `path` in `session` of `account`.
    pub async fn read_workspace_file(&self, account: &str, session: &str, path: &str) -> Value {
        let arguments = json!({ "path": path });
        self.session_call(account, session, "read_workspace_file", arguments)
            .await
    }

    /// `write_workspace_file` of `content` to `path` in `session` of `account`.
    pub async fn write_workspace_file(
        &self,
        account: &str,
        session: &str,
        path: &str,
        content: &str,
    ) -> Value {
        let arguments = json!({"path": path, "content": content});
        self.session_call(account, session, "write_workspace_file", arguments)
            .await
    }

    /// `path` in session `s1` of acme, read whole as a persisted output is: without
    /// line numbers, up to 100,000 characters.
    pub async fn read_persisted(&self, path: &str) -> Value {
        let arguments = json!({"path": path, "include_line_numbers": false, "max_chars": 100000});
        self.session_call("acme", "s1", "read_workspace_file", arguments)
            .await
    }

    /// A cancel request with `body` on `toolmesh.v1.cancel.<account>`.
    pub async fn cancel(&self, account: &str, body: Value) -> Value {
        request_json(&self.client, format!("toolmesh.v1.cancel.{account}"), body).await
    }

    /// A tool call that waits in a task of its own (a parked call): its reply when it ends.
    pub fn call_in_background(&self, account: &str, body: Value) -> JoinHandle<Value> {
        let client = self.client.clone();
        let subject = format!("toolmesh.v1.call.{account}");
        tokio::spawn(async move { request_json(&client, subject, body).await })
    }

    /// A subscription of the test's client to `subject`, flushed: whatever the client sends
    /// next (a call) reaches the server after it, so what that call publishes is seen.
    pub async fn watch(&self, subject: impl async_nats::subject::ToSubject) -> Subscriber {
        let sub = self.client.subscribe(subject).await.unwrap();
        self.client.flush().await.unwrap();
        sub
    }

    pub async fn approvals(&self, account: &str, verb: &str, body: Value) -> Value {
        request_json(
            &self.client,
            format!("toolmesh.v1.approvals.{account}.{verb}"),
            body,
        )
        .await
    }

    /// The status of approval `id` of `account` (`Null` when there is none).
    pub async fn approval_status(&self, account: &str, id: &str) -> Value {
        let got = self.approvals(account, "get", json!({"id": id})).await;
        got["approval"]["status"].clone()
    }

    /// Up to `limit` entries of `account`'s audit trail: the query's reply, which must be ok.
    pub async fn audit_trail(&self, account: &str, limit: u64) -> Value {
        let subject = format!("toolmesh.v1.audit.{account}.query");
        ok(request_json(&self.client, subject, json!({ "limit": limit })).await)
    }

    /// Request `verb` (`list`, `revoke`) of `account`'s grants with `body`: its reply, which
    /// must be ok.
    pub async fn grants(&self, account: &str, verb: &str, body: Value) -> Value {
        let subject = format!("toolmesh.v1.grants.{account}.{verb}");
        ok(request_json(&self.client, subject, body).await)
    }

    pub async fn decide(&self, account: &str, id: &str, approved: bool) -> Value {
        self.approvals(
            account,
            "decide",
            json!({"id": id, "approved": approved, "approver": "alice", "reason": "test"}),
        )
        .await
    }
}

impl Drop for Cluster {
    /// The nodes go first (killed), then the disks their sandboxes mounted under the data
    /// directory (`TOOLMESH_SANDBOX_DISK_MB`): a killed node cannot unmount them, and the
    /// temporary directory's removal would stop at each.
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        if let Err(e) = toolmesh_sandbox::disk::unmount_below(self.data_dir.path()) {
            eprintln!("cannot unmount the sandbox disks of a test cluster: {e}");
        }
    }
}

/// The servers of a deployment: NATS with its users (docker/nats.conf), Redis, and a data
/// directory for its nodes.
pub struct Deployed {
    pub nats: AuthNats,
    redis: RedisServer,
    data: tempfile::TempDir,
}

impl Deployed {
    pub fn start() -> Deployed {
        Self::on(AuthNats::start())
    }

    /// On `nats`, a server of the deployment's users (say, a hub taking leaf nodes).
    pub fn on(nats: AuthNats) -> Deployed {
        Deployed {
            nats,
            redis: RedisServer::start(),
            data: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// A node of `roles` named `node_id` that connects as the `node` user.
    pub fn spec(&self, roles: &str, node_id: &str) -> NodeSpec {
        NodeSpec::new(BIN, roles, node_id)
            .env("TOOLMESH_NATS_URL", self.nats.url("node"))
            .env("TOOLMESH_REDIS_URL", self.redis.url())
            .env("TOOLMESH_DATA_DIR", self.data.path().display().to_string())
    }

    /// [`Deployed::spec`], started.
    pub async fn start_node(&self, roles: &str, node_id: &str) -> Node {
        let client = self.nats.client("node").await;
        self.spec(roles, node_id).start(&client).await
    }
}

/// Asserts that `reply` is `unavailable` and came less than `within` after `killed` (when
/// what served its call was killed).
#[track_caller]
pub fn assert_unavailable_within(reply: &Value, killed: std::time::Instant, within: Duration) {
    assert_eq!(reply["error"], "unavailable", "{reply}");
    let took = killed.elapsed();
    assert!(took < within, "unavailable came {took:?} after the kill");
}

/// A task of a test's own server, aborted when dropped.
pub struct Aborting(pub JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A test's own HTTP server on loopback (a webhook, a reviewer URL, a trace collector), served
/// until dropped, and what its handlers recorded of the requests it was sent.
pub struct Recorder<T> {
    /// `http://127.0.0.1:<port>`, no trailing slash.
    pub base: String,
    records: Arc<Mutex<Vec<T>>>,
    _task: Aborting,
}

impl<T: Clone> Recorder<T> {
    /// Serves the app `app` makes of the records its handlers push to, on a free port.
    pub async fn serve(app: impl FnOnce(Arc<Mutex<Vec<T>>>) -> axum::Router) -> Recorder<T> {
        let records = Arc::default();
        let app = app(Arc::clone(&records));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Recorder {
            base,
            records,
            _task: Aborting(task),
        }
    }

    /// What was recorded so far, oldest first.
    pub fn records(&self) -> Vec<T> {
        self.records.lock().unwrap().clone()
    }
}

/// The JSON of an MCP HTTP response body: the body itself, or the last `data:` line of an
/// event stream.
pub fn mcp_body(text: &str) -> &str {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .rfind(|d| !d.trim().is_empty())
        .unwrap_or(text)
        .trim()
}

/// The entries of `trail`, an audit query's reply.
pub fn trail_entries(trail: &Value) -> &[Value] {
    trail["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries: {trail}"))
}

/// The first entry of `trail` (an audit query's reply) that `matches`; it must have one.
#[track_caller]
pub fn trail_entry(trail: &Value, matches: impl Fn(&Value) -> bool) -> &Value {
    let found = trail_entries(trail).iter().find(|e| matches(e));
    found.unwrap_or_else(|| panic!("no such entry: {trail}"))
}

/// The string `field` of each member of array `list` of `value` (which must have the array).
pub fn strings(value: &Value, list: &str, field: &str) -> Vec<String> {
    value[list]
        .as_array()
        .unwrap_or_else(|| panic!("{value}"))
        .iter()
        .map(|member| member[field].as_str().unwrap().to_owned())
        .collect()
}

/// Asserts that a reply says `ok` (printing it when not, at the caller's line) and answers it.
#[track_caller]
pub fn ok(reply: Value) -> Value {
    assert_eq!(reply["ok"], true, "{reply}");
    reply
}

/// Asserts that the string `field` of `value` holds `words` (printing `value` when not, at the
/// caller's line).
#[track_caller]
pub fn assert_holds(value: &Value, field: &str, words: &str) {
    let text = value[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a string: {value}"));
    assert!(text.contains(words), "{value}");
}

/// Asserts that a reply is the error `code` and that its message says `says` (printing the
/// reply when not, at the caller's line).
#[track_caller]
pub fn assert_error(reply: &Value, code: &str, says: &str) {
    assert_eq!(reply["error"], code, "{reply}");
    let message = reply["error_message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{reply}");
}

/// Asserts that a reply is `policy_denied`, its message saying `says`, for `reason` under
/// policy `revision` (printing the reply when not, at the caller's line).
#[track_caller]
pub fn assert_policy_denied(reply: &Value, says: &str, reason: &str, revision: &str) {
    assert_error(reply, "policy_denied", says);
    assert_eq!(reply["reason"], reason, "{reply}");
    assert_eq!(reply["policy_revision"], revision, "{reply}");
}

/// Collects messages of a subscription until `count` arrived or `timeout` passed.
pub async fn collect(
    sub: &mut async_nats::Subscriber,
    count: usize,
    timeout: Duration,
) -> Vec<Value> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while out.len() < count {
        match tokio::time::timeout_at(deadline, sub.next()).await {
            Ok(Some(msg)) => out.push(serde_json::from_slice(&msg.payload).expect("event is JSON")),
            _ => break,
        }
    }
    out
}

/// The RunEvents of a subscription up to and including `finished`, each waited for at most
/// `idle` (what came before a longer silence, when none says `finished`).
pub async fn events_until_finished(sub: &mut async_nats::Subscriber, idle: Duration) -> Vec<Value> {
    let mut seen = Vec::new();
    while let Ok(Some(msg)) = tokio::time::timeout(idle, sub.next()).await {
        let e: Value = serde_json::from_slice(&msg.payload).expect("event is JSON");
        let done = e["kind"] == "finished";
        seen.push(e);
        if done {
            break;
        }
    }
    seen
}

/// Writes skill `name` under `dir`: its `SKILL.md` and a `scripts/hello.sh`. Answers its folder.
pub fn write_skill(
    dir: &std::path::Path,
    name: &str,
    skill_md: &str,
    hello_sh: &str,
) -> std::path::PathBuf {
    let skill = dir.join(name);
    std::fs::create_dir_all(skill.join("scripts")).unwrap();
    std::fs::write(skill.join("SKILL.md"), skill_md).unwrap();
    std::fs::write(skill.join("scripts/hello.sh"), hello_sh).unwrap();
    skill
}

/// A file `name` of `text` in a temp dir of its own: the dir (keep it while the file is
/// needed) and the file's path.
pub fn temp_file(name: &str, text: impl AsRef<[u8]>) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {name}: {e}"));
    (dir, path)
}

/// A tokens file (MCP or console) of `tokens` in a temp dir: the dir (keep it while the node
/// runs) and the file's path.
pub fn tokens_file(tokens: &Value) -> (tempfile::TempDir, std::path::PathBuf) {
    temp_file("tokens.json", tokens.to_string())
}

/// The environment of a node whose MCP front listens on a loopback port it picks and takes the
/// tokens of the file `tokens`, then `env`.
pub fn mcp_front_env<'a>(
    tokens: &'a std::path::Path,
    env: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut all = vec![
        ("TOOLMESH_MCP_LISTEN", "127.0.0.1:0"),
        ("TOOLMESH_MCP_TOKENS", tokens.to_str().unwrap()),
    ];
    all.extend_from_slice(env);
    all
}

/// A policy file in a temp dir; keep the returned dir alive while the node runs.
pub fn policy_file(text: &str) -> (tempfile::TempDir, String) {
    let (dir, path) = temp_file("policy.toml", text);
    (dir, path.display().to_string())
}

/// A policy that makes `component_status` (answered by the gateway itself) need approval, so
/// approval paths can be driven end to end with a tool that really runs.
pub const GATED_STATUS: &str = "[tools.component_status]\nrisk_level = \"high\"\n";

/// A fake workspace actor in the role's queue group, its subscription confirmed: the calls the
/// gateway routes to the workspace come to the test.
pub async fn fake_workspace(client: &async_nats::Client) -> async_nats::Subscriber {
    use toolmesh_kernel::subjects::{internal, queue};
    use toolmesh_kernel::Role;
    let sub = client
        .queue_subscribe(internal::run(Role::Workspace), queue::of(Role::Workspace))
        .await
        .unwrap();
    toolmesh_kernel::host::confirm_subscriptions(client)
        .await
        .unwrap();
    sub
}

/// Runs `toolmesh node --roles <roles>` with `env` and a NATS URL where nothing listens, for a
/// setting the node must refuse before it connects: asserts that it fails, answers its stderr.
pub fn node_refusal(roles: &str, env: &[(&str, &str)]) -> String {
    let nowhere = toolmesh_testkit::ClosedPort::new();
    let output = std::process::Command::new(BIN)
        .args(["node", "--roles", roles])
        .envs(env.iter().copied())
        .env(
            "TOOLMESH_NATS_URL",
            format!("nats://127.0.0.1:{}", nowhere.port()),
        )
        .env("RUST_LOG", "warn")
        .output()
        .expect("the node runs");
    assert!(!output.status.success(), "{:?}", output.status);
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `spec`'s node behind `wrapper` (a program and its arguments, the node's command line
/// after them; none: the node alone) until it stops by itself, within `within`: asserts that it
/// failed, answers its stderr.
pub async fn node_failure(spec: &NodeSpec, wrapper: &[&str], within: Duration) -> String {
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = tokio::process::Command::new(program);
            command.args(args).arg(&spec.binary);
            command
        }
        None => tokio::process::Command::new(&spec.binary),
    };
    command
        .args(["node", "--roles", &spec.roles])
        .env("TOOLMESH_NODE_ID", &spec.node_id)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .kill_on_drop(true);
    let output = tokio::time::timeout(within, command.output())
        .await
        .unwrap_or_else(|_| panic!("the node did not stop by itself within {within:?}"))
        .expect("the node runs");
    assert!(!output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The next call a fake actor's subscription receives (within 10 s), with its reply subject.
pub async fn take_call(actor: &mut Subscriber) -> (ActorCall, Subject) {
    let msg = tokio::time::timeout(Duration::from_secs(10), actor.next())
        .await
        .expect("the gateway routes the call")
        .expect("subscription open");
    let call: ActorCall = serde_json::from_slice(&msg.payload).expect("an ActorCall");
    (call, msg.reply.expect("the call has a reply subject"))
}

/// A node whose log (stderr, `warn` and up unless the spec sets `RUST_LOG`) the test reads,
/// written as a node writes it by default (`NO_COLOR` unset).
pub struct LoggedNode {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl LoggedNode {
    /// Starts `spec` and waits until it answers its status subject.
    pub async fn start(spec: &NodeSpec, nats: &async_nats::Client) -> LoggedNode {
        let mut child = std::process::Command::new(&spec.binary)
            .args(["node", "--roles", &spec.roles])
            .env("TOOLMESH_NODE_ID", &spec.node_id)
            .env("RUST_LOG", "warn")
            .env_remove("NO_COLOR")
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("toolmesh node starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        std::thread::spawn({
            let log = log.clone();
            move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    eprintln!("{line}");
                    log.lock().unwrap().push_str(&format!("{line}\n"));
                }
            }
        });
        let subject = format!("toolmesh.v1.status.{}", spec.node_id);
        let answers = wait_until(Duration::from_secs(15), || {
            let ask = nats.request(subject.clone(), "{}".into());
            async move {
                matches!(
                    tokio::time::timeout(Duration::from_millis(500), ask).await,
                    Ok(Ok(_))
                )
            }
        })
        .await;
        assert!(answers, "node {} did not start", spec.node_id);
        LoggedNode { child, log }
    }

    /// What the node has written to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Asserts that within 5 s the node's log holds every one of `words`.
    pub async fn logs(&self, words: &[&str]) {
        let logged = wait_until(Duration::from_secs(5), || {
            let log = self.log();
            async move { words.iter().all(|word| log.contains(word)) }
        })
        .await;
        assert!(logged, "{words:?} not in the log:\n{}", self.log());
    }
}

impl Drop for LoggedNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
