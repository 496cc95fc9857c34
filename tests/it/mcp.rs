//! The MCP front (PROTOCOL.md "MCP front"): the official Python MCP client
//! (`tests/python/mcp_client.py`) against a real `toolmesh node --roles …,mcp` over
//! streamable HTTP and against `toolmesh mcp` over stdio.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_testkit::{venv_bin, Listener};

use crate::support::{mcp_front_env, ok, tokens_file, Cluster, BIN};

/// How long one client script may run (Python start-up on a busy machine included).
const CLIENT_WITHIN: Duration = Duration::from_secs(120);

/// A cluster with one node running the MCP front on a port it picks, and its tokens file:
/// `tok-a` → acme (profile default), `tok-c` → acme (profile coding, named `coder`), `tok-s`
/// → acme with its own session `s1`.
struct Front {
    c: Cluster,
    url: String,
    _dir: tempfile::TempDir,
}

impl Front {
    async fn start(roles: &str, env: &[(&str, &str)]) -> Front {
        let (dir, tokens) = tokens_file(&json!({"tok-a": {"account": "acme"},
                   "tok-c": {"account": "acme", "profile": "coding", "name": "coder"},
                   "tok-s": {"account": "acme", "session": "s1"}}));
        let mut c = Cluster::servers().await;
        let node = c.start_node(roles, &mcp_front_env(&tokens, env)).await;
        // Without the role `mcp` the node serves no HTTP: its clients are stdio ones.
        let url = if roles.split(',').any(|r| r == "mcp") {
            format!("http://{}/mcp", c.nodes[node].addr(Listener::Mcp))
        } else {
            String::new()
        };
        Front { c, url, _dir: dir }
    }

    fn http(&self, token: &str, session: &str) -> Value {
        json!({"http": self.url, "token": token, "session": session})
    }

    /// Another node with only the role `mcp` (same tokens); its URL.
    async fn another_front(&mut self) -> String {
        let tokens = self._dir.path().join("tokens.json");
        let wait = [("TOOLMESH_MCP_APPROVAL_WAIT_S", "1")];
        self.c.start_mcp_front("mcp", &tokens, &wait).await
    }

    fn stdio(&self, session: &str, profile: &str, env: Value) -> Value {
        json!({
            "stdio": [BIN, "--nats-url", self.c.nats.url(), "mcp", "--account", "acme",
                      "--session", session, "--profile", profile],
            "env": env,
        })
    }

    fn workspace_file(&self, session: &str, path: &str) -> std::path::PathBuf {
        self.c
            .data_dir
            .path()
            .join(format!("accounts/acme/sessions/{session}/workspace/{path}"))
    }
}

/// Runs the client script with `spec` (plus `extra` members); its output lines.
pub(crate) async fn client(spec: Value, extra: Value) -> Vec<Value> {
    LiveClient::start(spec, extra).finish().await
}

/// The MCP client running, its lines read as it prints them: for a test that acts on what the
/// client has seen so far.
struct LiveClient {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<Value>,
    seen: Vec<Value>,
}

impl LiveClient {
    /// Runs `mcp_client.py` with `spec` and `extra`'s fields (its steps, its mode).
    fn start(mut spec: Value, extra: Value) -> LiveClient {
        use tokio::io::AsyncBufReadExt as _;
        if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
            spec.extend(extra);
        }
        let mut child = crate::support::python_script("mcp_client.py", &spec);
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(l)) = reader.next_line().await {
                let line = serde_json::from_str(&l).unwrap_or_else(|_| json!({"unparsed": l}));
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        LiveClient {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line that passes `wanted` (seen already, or to come); that line. Panics
    /// when the client ends or [`CLIENT_WITHIN`] passes first.
    async fn line(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
        if let Some(line) = self.seen.iter().find(|l| wanted(l)) {
            return line.clone();
        }
        let found = tokio::time::timeout(CLIENT_WITHIN, async {
            while let Some(line) = self.lines.recv().await {
                self.seen.push(line.clone());
                if wanted(&line) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!(
                "the client did not print the line waited for: {:#?}",
                self.seen
            ),
        }
    }

    /// Waits for the client to finish; every line it printed.
    async fn finish(mut self) -> Vec<Value> {
        let ended = tokio::time::timeout(CLIENT_WITHIN, async {
            while let Some(line) = self.lines.recv().await {
                self.seen.push(line);
            }
            self.child.wait().await
        })
        .await;
        ended.expect("the MCP client finishes in time").unwrap();
        let lines = self.seen;
        assert!(
            !lines.iter().any(|l| l.get("fatal").is_some()),
            "the client failed: {lines:#?}"
        );
        lines
    }
}

/// The line of step `i`.
fn step(lines: &[Value], i: usize) -> &Value {
    lines
        .iter()
        .find(|l| l["step"] == i)
        .unwrap_or_else(|| panic!("no line for step {i}: {lines:#?}"))
}

/// The ToolReply a call step got (its structured content), checked against its text content
/// and `isError`.
pub(crate) fn reply(lines: &[Value], i: usize) -> Value {
    let line = step(lines, i);
    let result = &line["result"];
    assert!(result.is_object(), "step {i} has no result: {line:#}");
    let structured = result["structuredContent"].clone();
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, structured, "the text content is the reply's JSON");
    assert_eq!(
        result["isError"].as_bool().unwrap_or(false),
        structured["ok"] != true,
        "isError is !ok: {result:#}"
    );
    structured
}

fn tool<'a>(tools: &'a [Value], name: &str) -> Option<&'a Value> {
    tools.iter().find(|t| t["name"] == name)
}

/// The approval id an elicitation named (its schema's description says it).
/// The `finished` event of a `run_command` among `events`, waited for at most 30 s (`Null` when
/// the subscription ends first).
async fn run_command_finished(events: &mut async_nats::Subscriber) -> Option<Value> {
    let finished = async {
        while let Some(msg) = events.next().await {
            let event: Value = serde_json::from_slice(&msg.payload).unwrap();
            if event["kind"] == "finished" && event["dispatched_tool_name"] == "run_command" {
                return event;
            }
        }
        Value::Null
    };
    tokio::time::timeout(Duration::from_secs(30), finished)
        .await
        .ok()
}

/// `write_workspace_file` of `path` in `session` of acme, straight on NATS, with `approval`
/// unless it is null.
async fn write_on_nats(
    c: &Cluster,
    session: &str,
    path: &str,
    content: &str,
    approval: Value,
) -> Value {
    let mut body = json!({"tool": "write_workspace_file", "session_id": session,
                          "arguments": {"path": path, "content": content}});
    if !approval.is_null() {
        body["approval"] = approval;
    }
    c.call("acme", body).await
}

fn asked_approval(line: &Value) -> String {
    let text = line["asked"][0]["requestedSchema"]["properties"]["approve"]["description"]
        .as_str()
        .unwrap_or_else(|| panic!("no elicitation: {line:#}"));
    let at = text.find("appr_").expect("the question names the approval");
    text[at..].trim_end_matches(')').to_owned()
}

#[tokio::test]
async fn http_lists_per_profile_calls_and_refuses_unknown_tokens() {
    let f = Front::start("gateway,approval,workspace,web,mcp", &[]).await;
    // A file to read, written in band on NATS.
    let approved = json!({"approved": true});
    let written = write_on_nats(&f.c, "s1", "notes.md", "hello mcp", approved).await;
    assert_eq!(written["ok"], true, "{written}");

    let lines = client(
        f.http("tok-a", "s1"),
        json!({"steps": [
            {"list": true},
            {"call": "read_workspace_file", "args": {"path": "notes.md"}},
            {"call": "read_workspace_file", "args": {"path": 7}},
        ]}),
    )
    .await;
    assert_eq!(lines[0]["protocol_version"], "2026-07-28", "{lines:#?}");
    let tools = step(&lines, 0)["tools"].as_array().unwrap().clone();
    let read = tool(&tools, "read_workspace_file").expect("read_workspace_file is listed");
    assert_eq!(read["inputSchema"]["properties"]["path"]["type"], "string");
    assert_eq!(read["annotations"]["readOnlyHint"], true);
    assert_eq!(read["annotations"]["destructiveHint"], false);
    let delete = tool(&tools, "delete_workspace_file").unwrap();
    assert_eq!(delete["annotations"]["destructiveHint"], true);
    assert_eq!(delete["annotations"]["readOnlyHint"], false);
    let write = tool(&tools, "write_workspace_file").unwrap();
    assert_eq!(write["annotations"]["readOnlyHint"], false);
    assert_eq!(write["annotations"]["destructiveHint"], false);
    let fetch = tool(&tools, "web_fetch").expect("the default profile has web_fetch");
    assert_eq!(fetch["annotations"]["openWorldHint"], true);
    assert!(tool(&tools, "tool_dispatcher").is_none());

    let read = reply(&lines, 1);
    assert_eq!(read["ok"], true, "{read:#}");
    assert!(read["content"].as_str().unwrap().contains("hello mcp"));
    let bad = reply(&lines, 2);
    assert_eq!(bad["error"], "invalid_arguments", "{bad:#}");
    assert_eq!(bad["details"][0]["path"], "/path");

    // The coding profile: workspace, sandbox and skills, no web.
    let lines = client(f.http("tok-c", "s1"), json!({"steps": [{"list": true}]})).await;
    let coding = step(&lines, 0)["tools"].as_array().unwrap().clone();
    assert!(tool(&coding, "read_workspace_file").is_some());
    assert!(tool(&coding, "run_command").is_some());
    assert!(tool(&coding, "web_fetch").is_none(), "{coding:#?}");
    assert!(tool(&coding, "component_status").is_none());

    // Without the session header: the token's own session, else `invalid_request`.
    let lines = client(
        f.http("tok-s", ""),
        json!({"steps": [{"call": "read_workspace_file", "args": {"path": "notes.md"}}]}),
    )
    .await;
    assert!(reply(&lines, 0)["content"]
        .as_str()
        .unwrap()
        .contains("hello mcp"));
    let lines = client(
        f.http("tok-a", ""),
        json!({"steps": [{"call": "read_workspace_file", "args": {"path": "notes.md"}}]}),
    )
    .await;
    assert_eq!(reply(&lines, 0)["error"], "invalid_request", "{lines:#?}");

    // A handshake-era client over HTTP works too.
    let lines = client(
        f.http("tok-a", "s1"),
        json!({"mode": "legacy", "steps": [{"call": "read_workspace_file", "args": {"path": "notes.md"}}]}),
    )
    .await;
    assert_eq!(lines[0]["protocol_version"], "2025-11-25");
    assert_eq!(reply(&lines, 0)["ok"], true);

    for token in [json!(null), json!("nope"), json!("tok-a")] {
        let lines = client(json!({"raw_post": f.url, "token": token}), json!({})).await;
        let expect = if token == "tok-a" { 200 } else { 401 };
        assert_eq!(lines[0]["status"], expect, "token {token}: {lines:?}");
    }
}

/// Elicitation accepted (file written, `decided_by` the token's name over HTTP, `mcp` over
/// stdio) and declined (nothing written, `approval_rejected`), over HTTP (an
/// `InputRequiredResult`, 2026-07-28) and over stdio (an `elicitation/create` request,
/// 2025-11-25).
#[tokio::test]
async fn elicitation_approves_or_rejects_a_gated_call() {
    let f = Front::start("gateway,approval,workspace,mcp", &[]).await;
    let cases = [
        ("http", f.http("tok-c", "h1"), "h1", "mcp:coder"),
        (
            "stdio",
            {
                let mut s = f.stdio("i1", "coding", json!({}));
                s["mode"] = json!("legacy");
                s
            },
            "i1",
            "mcp",
        ),
    ];
    for (name, spec, session, decider) in cases {
        let write = |path: &str| json!({"call": "write_workspace_file", "args": {"path": path, "content": "yes"}});
        let mut accepted = spec.clone();
        accepted["elicit"] = json!("accept");
        accepted["steps"] = json!([write("yes.txt")]);
        let lines = client(accepted, json!({})).await;
        let ok = reply(&lines, 0);
        assert_eq!(ok["ok"], true, "{name}: {ok:#}");
        assert_eq!(
            std::fs::read_to_string(f.workspace_file(session, "yes.txt")).unwrap(),
            "yes"
        );
        let id = asked_approval(step(&lines, 0));
        let got = f.c.approvals("acme", "get", json!({"id": id})).await;
        assert_eq!(got["approval"]["decided_by"], decider, "{name}: {got:#}");
        assert_eq!(got["approval"]["status"], "used");

        let mut declined = spec.clone();
        declined["elicit"] = json!("decline");
        declined["steps"] = json!([write("no.txt")]);
        let lines = client(declined, json!({})).await;
        let no = reply(&lines, 0);
        assert_eq!(no["error"], "approval_rejected", "{name}: {no:#}");
        assert!(!f.workspace_file(session, "no.txt").exists());
        let id = asked_approval(step(&lines, 0));
        let got = f.c.approvals("acme", "get", json!({"id": id})).await;
        assert_eq!(got["approval"]["status"], "rejected");
        assert_eq!(got["approval"]["decided_by"], decider);
    }
}

/// Two front nodes: the approval question comes from one, the client's answer goes to the
/// other, and the call runs. No front node holds the call between the two requests.
#[tokio::test]
async fn the_answer_to_an_elicitation_may_reach_another_front_node() {
    let mut f = Front::start("gateway,approval,workspace,mcp", &[]).await;
    let other = f.another_front().await;
    let args = json!({"path": "two-nodes.txt", "content": "both"});
    let mut first = f.http("tok-c", "n1");
    first["elicit"] = json!("accept");
    let lines = client(
        first,
        json!({"steps": [{"call_once": "write_workspace_file", "args": args}]}),
    )
    .await;
    let once = &step(&lines, 0)["once"];
    assert_eq!(once["resultType"], "input_required", "{once:#}");
    let question = &once["inputRequests"]["approval"];
    assert_eq!(question["method"], "elicitation/create");
    assert_eq!(
        question["params"]["requestedSchema"]["properties"]["approve"]["type"],
        "boolean"
    );
    let state = once["requestState"].as_str().unwrap().to_owned();
    assert!(!f.workspace_file("n1", "two-nodes.txt").exists());

    let mut second = f.http("tok-c", "n1");
    second["http"] = json!(other);
    let lines = client(
        second,
        json!({"steps": [{"call": "write_workspace_file", "args": args,
            "input_responses": {"approval": {"action": "accept", "content": {"approve": true}}},
            "request_state": state}]}),
    )
    .await;
    let ok = reply(&lines, 0);
    assert_eq!(ok["ok"], true, "{ok:#}");
    assert_eq!(
        std::fs::read_to_string(f.workspace_file("n1", "two-nodes.txt")).unwrap(),
        "both"
    );
}

/// Finding 2 of issue 28: the front decided whatever approval a `requestState` named. An MCP
/// client of session `attacker` answering "approve" (or nothing at all) on session `victim`'s
/// pending write now gets `approval_mismatch`, and the approval stays pending, undecided.
#[tokio::test]
async fn a_request_state_cannot_decide_another_sessions_approval() {
    let f = Front::start("gateway,approval,workspace,mcp", &[]).await;
    let victim = write_on_nats(
        &f.c,
        "victim",
        "owned.txt",
        "attacker was here",
        Value::Null,
    )
    .await;
    assert_eq!(victim["error"], "approval_required", "{victim}");
    let id = victim["approval_request"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let state = format!("approval:{id}");
    let accept = json!({"approval": {"action": "accept", "content": {"approve": true}}});
    let lines = client(
        f.http("tok-c", "attacker"),
        json!({"steps": [
            // The victim's very call, from the attacker's session, approving it.
            {"call": "write_workspace_file",
             "args": {"path": "owned.txt", "content": "attacker was here"},
             "input_responses": accept, "request_state": state},
            // Other arguments, approving.
            {"call": "write_workspace_file", "args": {"path": "mine.txt", "content": "x"},
             "input_responses": accept, "request_state": state},
            // A bare requestState (no answer: it used to reject the approval).
            {"call": "write_workspace_file", "args": {"path": "mine.txt", "content": "x"},
             "request_state": state},
        ]}),
    )
    .await;
    for i in 0..3 {
        let refused = reply(&lines, i);
        assert_eq!(
            refused["error"], "approval_mismatch",
            "step {i}: {refused:#}"
        );
    }
    let got = f.c.approvals("acme", "get", json!({"id": id})).await;
    assert_eq!(got["approval"]["status"], "pending", "{got:#}");
    assert_eq!(got["approval"]["decided_by"], Value::Null, "{got:#}");
    assert!(!f.workspace_file("victim", "owned.txt").exists());
}

/// Finding 2 of issue 28: with in-band decisions off at the approval role and the variable
/// unset on the MCP node, an MCP client approved its own call. Whether an answer counts is the
/// approval role's to say: the client is not asked, its answer on a retry counts for nothing,
/// and the call waits for an approver.
#[tokio::test]
async fn an_mcp_client_cannot_approve_its_own_call_where_in_band_is_off() {
    let mut f = Front::start(
        "gateway,approval,workspace",
        &[("TOOLMESH_APPROVAL_IN_BAND", "0")],
    )
    .await;
    let front = f.another_front().await;
    let args = json!({"path": "self.txt", "content": "self-approved"});
    let mut spec = f.http("tok-c", "self");
    spec["http"] = json!(front);
    spec["elicit"] = json!("accept");
    let lines = client(
        spec.clone(),
        json!({"steps": [{"call": "write_workspace_file", "args": args}]}),
    )
    .await;
    let waited = reply(&lines, 0);
    // TOOLMESH_MCP_APPROVAL_WAIT_S is 1 on that node: the wait runs out.
    assert_eq!(waited["error"], "approval_pending", "{waited:#}");
    assert!(
        step(&lines, 0)["asked"]
            .as_array()
            .is_none_or(|a| a.is_empty()),
        "the client was asked although its answer cannot count: {lines:#?}"
    );
    let id = waited["approval_request"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Answering anyway, as a retry naming the approval.
    let lines = client(
        spec,
        json!({"steps": [{"call": "write_workspace_file", "args": args,
            "input_responses": {"approval": {"action": "accept", "content": {"approve": true}}},
            "request_state": format!("approval:{id}")}]}),
    )
    .await;
    let waited = reply(&lines, 0);
    assert_eq!(waited["error"], "approval_pending", "{waited:#}");
    let got = f.c.approvals("acme", "get", json!({"id": id})).await;
    assert_eq!(got["approval"]["status"], "pending", "{got:#}");
    assert!(!f.workspace_file("self", "self.txt").exists());
}

/// A client without elicitation waits; a decision from another NATS client lets the call run,
/// and progress notifications said it was waiting.
#[tokio::test]
async fn a_client_without_elicitation_waits_for_an_out_of_band_decision() {
    let f = Front::start("gateway,approval,workspace,mcp", &[]).await;
    let mut requested = f.c.watch("toolmesh.v1.approvals.acme.requested").await;
    let spec = f.http("tok-c", "w1");
    let mut run = LiveClient::start(
        spec,
        json!({"steps": [{"call": "write_workspace_file", "progress": true,
                           "args": {"path": "later.txt", "content": "approved"}}]}),
    );
    let msg = tokio::time::timeout(Duration::from_secs(60), requested.next())
        .await
        .expect("an approval is requested")
        .unwrap();
    let approval: Value = serde_json::from_slice(&msg.payload).unwrap();
    let id = approval["id"].as_str().unwrap();
    // The client sees a progress notification naming the approval first.
    run.line(|l| l["progress_of"] == 0 && l["message"].as_str().unwrap_or_default().contains(id))
        .await;
    assert!(!f.workspace_file("w1", "later.txt").exists());
    ok(f.c.decide("acme", id, true).await);
    let lines = run.finish().await;
    let ok = reply(&lines, 0);
    assert_eq!(ok["ok"], true, "{ok:#}");
    assert_eq!(
        std::fs::read_to_string(f.workspace_file("w1", "later.txt")).unwrap(),
        "approved"
    );
    let progress = step(&lines, 0)["progress"].as_array().unwrap().clone();
    assert!(
        progress
            .iter()
            .any(|p| p.as_str().unwrap_or_default().contains(id)),
        "progress names the approval waited for: {progress:?}"
    );
}

/// A sandbox of the process backend, without a disk of its own, and approvals off.
const PROCESS_SANDBOX: [(&str, &str); 3] = [
    ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
    ("TOOLMESH_SANDBOX_BACKEND", "process"),
    ("TOOLMESH_SANDBOX_DISK_MB", "0"),
];

/// stdout of a long command arrives as progress; cancelling the request (stdio:
/// notifications/cancelled; HTTP: the stream closes) cancels the invocation.
#[tokio::test]
async fn progress_streams_and_cancellation_kills_the_command() {
    let f = Front::start("gateway,approval,workspace,sandbox,mcp", &PROCESS_SANDBOX).await;
    let lines = client(
        f.http("tok-c", "p1"),
        json!({"steps": [{"call": "run_command", "progress": true,
            "args": {"command": "for i in 1 2 3; do echo line$i; sleep 0.3; done"}}]}),
    )
    .await;
    let done = reply(&lines, 0);
    assert_eq!(done["ok"], true, "{done:#}");
    let progress: String = step(&lines, 0)["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for line in ["line1", "line2", "line3"] {
        assert!(progress.contains(line), "{line} in progress: {progress:?}");
    }

    for (name, spec) in [
        ("http", f.http("tok-c", "p2")),
        ("stdio", f.stdio("p3", "coding", json!({}))),
    ] {
        let mut finished = f.c.watch("toolmesh.v1.events.acme.>").await;
        let started = std::time::Instant::now();
        let lines = client(
            spec,
            json!({"steps": [{"call": "run_command", "progress": true, "cancel_after_progress": 1,
                "args": {"command": "echo started; sleep 60; echo never"}}]}),
        )
        .await;
        assert_eq!(step(&lines, 0)["cancelled"], true, "{name}: {lines:#?}");
        // The invocation ends cancelled, long before the command's 60 s.
        let end = run_command_finished(&mut finished)
            .await
            .unwrap_or_else(|| panic!("{name}: the cancelled command finishes; {lines:#?}"));
        assert_eq!(end["error"], "cancelled", "{name}: {end:#}");
        assert!(started.elapsed() < Duration::from_secs(45));
    }
}

/// A stdio client that goes away with a call in flight, without cancelling it first, takes
/// the call with it: the front cancels the invocation as soon as the pipe closes. The client
/// here does what the MCP Python SDK does when it leaves: close the server's stdin, give it
/// 2 s to exit, then kill it. (rmcp alone would cancel the call only after a 5 s drain.)
#[tokio::test]
async fn a_stdio_client_that_leaves_cancels_its_calls() {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let f = Front::start("gateway,approval,workspace,sandbox", &PROCESS_SANDBOX).await;
    let mut events = f.c.watch("toolmesh.v1.events.acme.>").await;
    let spec = f.stdio("leaves", "coding", json!({}));
    let argv: Vec<String> = serde_json::from_value(spec["stdio"].clone()).unwrap();
    let mut server = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("toolmesh mcp starts");
    let mut stdin = server.stdin.take().unwrap();
    let mut stdout = tokio::io::BufReader::new(server.stdout.take().unwrap()).lines();
    for message in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "leaver", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_command", "_meta": {"progressToken": "p"},
            "arguments": {"command": "echo started; sleep 60; echo never"}}}),
    ] {
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
    }
    // Running: its first output came back as progress.
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["method"] == "notifications/progress" {
                return;
            }
        }
        panic!("toolmesh mcp ended before the command's progress");
    })
    .await
    .expect("the command's first output as progress");
    drop(stdin);
    if tokio::time::timeout(Duration::from_secs(2), server.wait())
        .await
        .is_err()
    {
        server.kill().await.unwrap();
    }
    let end = run_command_finished(&mut events)
        .await
        .expect("the call ends long before its command's 60 s");
    assert_eq!(end["error"], "cancelled", "{end:#}");
}

/// A provider tool is listed once its provider starts (`tests/python/provider_fixture.py`, a
/// NATS micro service), and calls go to it; when it goes, a stdio client is told the list
/// changed.
#[tokio::test]
async fn a_provider_tool_appears_in_the_list() {
    let f = Front::start("gateway,approval,mcp", &[]).await;
    let lines = client(f.http("tok-a", "v1"), json!({"steps": [{"list": true}]})).await;
    let before = step(&lines, 0)["tools"].as_array().unwrap().clone();
    assert!(tool(&before, "mcp_echo").is_none(), "{before:#?}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/provider_fixture.py");
    let mut provider = tokio::process::Command::new(venv_bin("python"))
        .arg(script)
        .args([
            "--nats",
            &f.c.nats.url(),
            "--name",
            "mcpfront",
            "--no-ticket",
            "--echo",
            "mcp_echo",
        ])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start tests/python/provider_fixture.py");
    let lines = client(
        f.http("tok-a", "v1"),
        json!({"steps": [
            {"list": true},
            {"wait_list_has": "mcp_echo", "within": 60},
            {"call": "mcp_echo", "args": {"text": "hi"}},
        ]}),
    )
    .await;
    assert_eq!(step(&lines, 1)["found"], true, "{lines:#?}");
    let echoed = reply(&lines, 2);
    assert_eq!(echoed["ok"], true, "{echoed:#}");

    // A stdio client hears notifications/tools/list_changed when the provider goes.
    let mut stdio = LiveClient::start(
        f.stdio("v2", "default", json!({})),
        json!({"mode": "legacy", "steps": [{"list": true}, {"wait_list_changed": 60}]}),
    );
    // Clients of 2026-07-28, over HTTP and stdio, hear it on a subscriptions/listen stream.
    let mut listens = [f.http("tok-a", "v3"), f.stdio("v4", "default", json!({}))]
        .map(|spec| LiveClient::start(spec, json!({"steps": [{"listen_changed": 60}]})));
    // The provider goes only once each front watches the list with the provider's tool in
    // it: a connected client's front checked the list at once (the stdio client has listed
    // it), and a listen stream is open.
    let listed = stdio.line(|l| l["step"] == 0).await;
    let tools = listed["tools"].as_array().expect("a list");
    assert!(tool(tools, "mcp_echo").is_some(), "{listed:#}");
    for listen in &mut listens {
        listen.line(|l| l.get("listening").is_some()).await;
    }
    let _ = provider.kill().await;
    let lines = stdio.finish().await;
    assert_eq!(step(&lines, 1)["list_changed"], true, "{lines:#?}");
    for listen in listens {
        let lines = listen.finish().await;
        let heard = lines
            .iter()
            .find(|l| l.get("listen_changed").is_some())
            .unwrap_or_else(|| panic!("no listen result: {lines:#?}"));
        assert_eq!(lines[0]["protocol_version"], "2026-07-28", "{lines:#?}");
        assert_eq!(heard["honored"]["toolsListChanged"], true, "{lines:#?}");
        assert_eq!(heard["listen_changed"], true, "{lines:#?}");
    }
}

/// Claude Code (the CLI the `claude-agent-sdk` wheel bundles) with the README's configuration:
/// `claude mcp add` for stdio and for HTTP, then `claude mcp list`, which connects to each
/// server and says whether it answered. A wrong token is named as refused (HTTP 401).
#[tokio::test]
async fn claude_code_connects_with_the_readme_configuration() {
    let f = Front::start("gateway,approval,workspace,mcp", &[]).await;
    let claude = claude_code();
    let home = tempfile::tempdir().unwrap();
    let project = home.path().join("project");
    std::fs::create_dir(&project).unwrap();
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let nats = f.c.nats.url();
    let run = |args: Vec<&str>| {
        let mut command = tokio::process::Command::new(&claude);
        command
            .args(args)
            .current_dir(&project)
            .env("HOME", home.path())
            .env("PATH", &path)
            .env("TOOLMESH_NATS_URL", &nats)
            .env("DISABLE_AUTOUPDATER", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env_remove("ANTHROPIC_API_KEY")
            .kill_on_drop(true);
        async move {
            let out = tokio::time::timeout(CLIENT_WITHIN, command.output())
                .await
                .expect("claude finishes in time")
                .expect("claude starts");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "claude failed: {text}");
            text
        }
    };
    run(vec![
        "mcp",
        "add",
        "toolmesh",
        "--",
        "toolmesh",
        "mcp",
        "--account",
        "acme",
        "--session",
        "my-project",
    ])
    .await;
    // The README's HTTP configuration, and one with a token the front does not know.
    let add_http = |name: &'static str, headers: &[&'static str]| {
        let mut args = vec!["mcp", "add", "--transport", "http", name, &f.url];
        for header in headers {
            args.extend(["--header", header]);
        }
        run(args)
    };
    let session = "X-Toolmesh-Session: my-project";
    add_http("toolmesh-http", &["Authorization: Bearer tok-a", session]).await;
    add_http("toolmesh-wrong-token", &["Authorization: Bearer nope"]).await;

    let listed = run(vec!["mcp", "list"]).await;
    let line = |name: &str| -> String {
        listed
            .lines()
            .find(|l| l.starts_with(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("claude lists {name}: {listed}"))
            .to_owned()
    };
    assert!(line("toolmesh").contains("Connected"), "{listed}");
    assert!(!line("toolmesh").contains("Failed"), "{listed}");
    assert!(line("toolmesh-http").contains("Connected"), "{listed}");
    assert!(!line("toolmesh-http").contains("Failed"), "{listed}");
    let wrong = line("toolmesh-wrong-token");
    assert!(
        wrong.contains("Failed") && wrong.contains("401"),
        "{listed}"
    );
}

/// The `claude` executable of the `claude-agent-sdk` package in the tests' venv.
fn claude_code() -> std::path::PathBuf {
    let out = std::process::Command::new(venv_bin("python"))
        .args([
            "-c",
            "import claude_agent_sdk, os; print(os.path.dirname(claude_agent_sdk.__file__))",
        ])
        .output()
        .expect("the venv's python starts");
    assert!(out.status.success(), "claude-agent-sdk is in the venv");
    let dir = String::from_utf8(out.stdout).unwrap();
    let claude = Path::new(dir.trim()).join("_bundled/claude");
    assert!(claude.is_file(), "{} is missing", claude.display());
    claude
}

/// An MCP client that calls a session tool without naming a session hears how to name one in
/// MCP: the `X-Toolmesh-Session` header or the token's `session`, not the request's
/// `session_id`, which it never writes (issue 29, item 5).
#[tokio::test]
async fn a_call_without_a_session_says_how_an_mcp_client_names_one() {
    use rmcp::ServiceExt as _;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let f = Front::start(
        "gateway,workspace,mcp",
        &[("TOOLMESH_TOOL_APPROVAL_MODE", "off")],
    )
    .await;
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            f.url.as_str(),
        )
        .auth_header("tok-a");
    let client = ()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_config(
            config,
        ))
        .await
        .expect("the HTTP front answers the handshake");
    let call = rmcp::model::CallToolRequestParams::new("read_workspace_file")
        .with_arguments(json!({"path": "notes.md"}).as_object().unwrap().clone());
    let result = tokio::time::timeout(CLIENT_WITHIN, client.call_tool(call))
        .await
        .expect("tools/call answers")
        .expect("a tool result");
    let reply = result.structured_content.expect("the reply");
    assert_eq!(reply["error"], "invalid_request", "{reply}");
    let message = reply["error_message"].as_str().unwrap();
    assert!(message.contains("X-Toolmesh-Session header"), "{message}");
    assert!(message.contains("\"session\""), "{message}");
    assert!(message.contains("TOOLMESH_MCP_TOKENS"), "{message}");
    assert!(!message.contains("session_id"), "{message}");
    let _ = client.cancel().await;
}
