//! MCP tasks (`actors/mcp/src/tasks.rs`): a client that declares the tasks extension
//! (`io.modelcontextprotocol/tasks`, SEP-2663, MCP 2026-07-28) gets a task for a call parked
//! for approval. The client is raw JSON-RPC over streamable HTTP (reqwest), as the spec writes
//! it: the Python SDK in the venv has no tasks client, and the Rust one is the server's own
//! SDK, which would hide a wire mistake both sides share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use toolmesh_testkit::{wait_until, Listener};

use crate::support::{mcp_body, mcp_front_env, ok, tokens_file, Cluster};

const PROTOCOL: &str = "2026-07-28";
const TASKS: &str = "io.modelcontextprotocol/tasks";
/// How long a task may take to reach the status waited for.
const WITHIN: Duration = Duration::from_secs(30);

/// A node serving the MCP front in strict mode (writes need approval), with `tok-a` and
/// `tok-b`, both of acme and free to name any session.
struct Front {
    c: Cluster,
    url: String,
    _dir: tempfile::TempDir,
}

impl Front {
    async fn start() -> Front {
        let (dir, tokens) = tokens_file(&json!({
            "tok-a": {"account": "acme", "name": "alpha"},
            "tok-b": {"account": "acme", "name": "beta"},
        }));
        let mut c = Cluster::servers().await;
        let env = mcp_front_env(&tokens, &[("TOOLMESH_TOOL_APPROVAL_MODE", "strict")]);
        let node = c.start_node("gateway,approval,workspace,mcp", &env).await;
        let url = format!("http://{}/mcp", c.nodes[node].addr(Listener::Mcp));
        Front { c, url, _dir: dir }
    }

    fn client(&self, token: &str, session: &str, tasks: bool) -> Client {
        Client {
            http: reqwest::Client::new(),
            url: self.url.clone(),
            token: token.to_owned(),
            session: session.to_owned(),
            tasks,
            next: AtomicU64::new(1),
        }
    }

    fn workspace_file(&self, session: &str, path: &str) -> std::path::PathBuf {
        self.c
            .data_dir
            .path()
            .join(format!("accounts/acme/sessions/{session}/workspace/{path}"))
    }
}

/// A stateless 2026-07-28 client: every request carries its protocol version, client info and
/// capabilities in `_meta`, and the routing headers (`Mcp-Method`, `Mcp-Name`).
struct Client {
    http: reqwest::Client,
    url: String,
    token: String,
    session: String,
    /// Whether it declares the tasks extension.
    tasks: bool,
    next: AtomicU64,
}

impl Client {
    /// One request; the JSON-RPC response (`result` or `error`).
    async fn rpc(&self, method: &str, mut params: Value) -> Value {
        let extensions = if self.tasks {
            json!({ TASKS: {} })
        } else {
            json!({})
        };
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientInfo": {"name": "tasks-test", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
        });
        let name = params["name"].as_str().or(params["taskId"].as_str());
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut request = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("x-toolmesh-session", &self.session)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", PROTOCOL)
            .header("mcp-method", method);
        if let Some(name) = name {
            request = request.header("mcp-name", name);
        }
        let response = request
            .body(body.to_string())
            .send()
            .await
            .expect("the front answers");
        let status = response.status();
        let text = response.text().await.unwrap();
        let reply: Value = serde_json::from_str(mcp_body(&text))
            .unwrap_or_else(|e| panic!("{method}: HTTP {status}, not JSON ({e}): {text}"));
        assert_eq!(reply["id"], id, "{method}: {reply:#}");
        reply
    }

    /// A request that must succeed: its `result`.
    async fn result(&self, method: &str, params: Value) -> Value {
        let reply = self.rpc(method, params).await;
        assert!(reply["error"].is_null(), "{method}: {reply:#}");
        reply["result"].clone()
    }

    /// A request that must fail: its error code.
    async fn error(&self, method: &str, params: Value) -> i64 {
        let reply = self.rpc(method, params).await;
        reply["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("{method} should fail: {reply:#}"))
    }

    async fn write(&self, path: &str, content: &str) -> Value {
        let arguments = json!({"path": path, "content": content});
        self.result(
            "tools/call",
            json!({"name": "write_workspace_file", "arguments": arguments}),
        )
        .await
    }

    async fn get(&self, task: &str) -> Value {
        self.result("tasks/get", json!({ "taskId": task })).await
    }

    /// Polls `tasks/get` until the task is `status`; the task then.
    async fn until(&self, task: &str, status: &str) -> Value {
        let last = std::cell::RefCell::new(Value::Null);
        let reached = wait_until(WITHIN, || async {
            let got = self.get(task).await;
            let reached = got["status"] == status;
            *last.borrow_mut() = got;
            reached
        })
        .await;
        let last = last.into_inner();
        assert!(reached, "task {task} is not {status}: {last:#}");
        last
    }
}

/// The approval a new task waits for: named in its `_meta` and in its status message, and
/// pending in the account.
async fn waited_for(f: &Front, task: &Value) -> String {
    let id = task["_meta"]["io.toolmesh/approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("the task names its approval: {task:#}"))
        .to_owned();
    let message = task["statusMessage"].as_str().unwrap_or_default();
    assert!(
        message.contains(&id) && message.contains("toolmesh.v1.approvals.acme.decide"),
        "the status message names the approval and where to decide it: {task:#}"
    );
    assert_eq!(f.c.approval_status("acme", &id).await, "pending");
    id
}

#[tokio::test]
async fn a_parked_call_is_a_task_decided_out_of_band_or_withdrawn_by_tasks_cancel() {
    let f = Front::start().await;
    let a = f.client("tok-a", "t1", true);

    // A call that needs no approval is answered as ever, not as a task.
    let listed = a
        .result(
            "tools/call",
            json!({"name": "list_workspace_files", "arguments": {}}),
        )
        .await;
    assert_eq!(listed["resultType"], "complete", "{listed:#}");
    assert_eq!(listed["structuredContent"]["ok"], true, "{listed:#}");

    // A gated write: a task, at once.
    let created = a.write("a.txt", "approved").await;
    assert_eq!(created["resultType"], "task", "{created:#}");
    assert_eq!(created["status"], "working", "{created:#}");
    let task = created["taskId"].as_str().unwrap().to_owned();
    for field in ["createdAt", "lastUpdatedAt"] {
        assert!(created[field].is_string(), "{field}: {created:#}");
    }
    assert!(created["ttlMs"].as_u64().unwrap() > 120_000, "{created:#}");
    assert_eq!(created["pollIntervalMs"], 1000, "{created:#}");
    let approval = waited_for(&f, &created).await;

    // tasks/get: still waiting for that approval.
    let got = a.get(&task).await;
    assert_eq!(
        (&got["resultType"], &got["status"], &got["taskId"]),
        (&json!("complete"), &json!("working"), &json!(task)),
        "{got:#}"
    );
    assert!(got["statusMessage"].as_str().unwrap().contains(&approval));
    assert!(!f.workspace_file("t1", "a.txt").exists());

    // SEP-2663 has neither tasks/result nor tasks/list.
    assert_eq!(
        a.error("tasks/result", json!({ "taskId": task })).await,
        -32601
    );
    assert_eq!(a.error("tasks/list", json!({})).await, -32601);
    // tasks/update is acknowledged (no task here asks for input).
    let ack = a
        .result(
            "tasks/update",
            json!({"taskId": task, "inputResponses": {}}),
        )
        .await;
    assert_eq!(ack["resultType"], "complete", "{ack:#}");

    // The approver decides on NATS: the call runs and the task completes with its result.
    ok(f.c.decide("acme", &approval, true).await);
    let done = a.until(&task, "completed").await;
    let result = &done["result"];
    assert_eq!(result["isError"], false, "{done:#}");
    assert_eq!(result["structuredContent"]["ok"], true, "{done:#}");
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, result["structuredContent"]);
    assert_eq!(
        std::fs::read_to_string(f.workspace_file("t1", "a.txt")).unwrap(),
        "approved"
    );

    // A second task, withdrawn by tasks/cancel: cancelled, its approval rejected as
    // withdrawn, nothing written.
    let created = a.write("b.txt", "never").await;
    assert_eq!(created["resultType"], "task", "{created:#}");
    let task = created["taskId"].as_str().unwrap().to_owned();
    let approval = waited_for(&f, &created).await;
    let ack = a.result("tasks/cancel", json!({ "taskId": task })).await;
    assert_eq!(ack["resultType"], "complete", "{ack:#}");
    let cancelled = a.until(&task, "cancelled").await;
    assert!(
        cancelled["result"].is_null() && cancelled["error"].is_null(),
        "{cancelled:#}"
    );
    let got =
        f.c.approvals("acme", "get", json!({ "id": approval }))
            .await;
    assert_eq!(got["approval"]["status"], "rejected", "{got:#}");
    assert_eq!(got["approval"]["reason"], "withdrawn", "{got:#}");
    assert_eq!(got["approval"]["decided_by"], "caller", "{got:#}");
    assert!(!f.workspace_file("t1", "b.txt").exists());
    // Cancelling a finished task changes nothing.
    a.result("tasks/cancel", json!({ "taskId": task })).await;
    assert_eq!(a.get(&task).await["status"], "cancelled");
}

#[tokio::test]
async fn another_client_can_neither_see_nor_cancel_a_task() {
    let f = Front::start().await;
    let a = f.client("tok-a", "t1", true);
    let created = a.write("c.txt", "mine").await;
    assert_eq!(created["resultType"], "task", "{created:#}");
    let task = created["taskId"].as_str().unwrap().to_owned();
    let approval = waited_for(&f, &created).await;

    // Another token in the same session, or the same token in another session: the task is
    // unknown to them, exactly as an id that never existed.
    for other in [f.client("tok-b", "t1", true), f.client("tok-a", "t2", true)] {
        for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
            let params = json!({"taskId": task, "inputResponses": {}});
            assert_eq!(other.error(method, params).await, -32602, "{method}");
        }
        let never = json!({"taskId": "00000000-0000-4000-8000-000000000000"});
        assert_eq!(other.error("tasks/get", never).await, -32602);
    }
    // A client that does not declare the extension may not use tasks/* at all.
    let plain = f.client("tok-a", "t1", false);
    assert_eq!(
        plain.error("tasks/cancel", json!({ "taskId": task })).await,
        -32021
    );

    // Nothing of that reached the call: it still waits, and its approval is pending.
    assert_eq!(a.get(&task).await["status"], "working");
    assert_eq!(f.c.approval_status("acme", &approval).await, "pending");
    ok(f.c.decide("acme", &approval, true).await);
    let done = a.until(&task, "completed").await;
    assert_eq!(done["result"]["structuredContent"]["ok"], true, "{done:#}");
}
