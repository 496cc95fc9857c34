//! The approvals console (role `console`): its HTTP API with reqwest, its live stream, and the
//! page in a real headless Chromium driven by Selenium (`tests/python/console_browser.py`).
//! Reviewers, grants and edits through the console are in [`review`].

mod review;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt as _;
use toolmesh_testkit::{request_json_within, Listener};

use crate::support::{assert_holds, ok, temp_file, tokens_file, Cluster};

/// The approver name `tok-acme` records as `decided_by`.
const ALICE: &str = "Alice Approver";

/// How long the browser script may run (Chromium start-up on a busy machine included).
const BROWSER_WITHIN: Duration = Duration::from_secs(180);

/// A cluster with one node running gateway, approval, workspace and console (strict mode) and
/// its tokens file: `tok-acme` → Alice for acme, `tok-root` → root for every account.
struct Console {
    c: Cluster,
    url: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Console {
    async fn start() -> Console {
        Console::start_with(
            &json!({
                "tok-acme": {"approver": ALICE, "accounts": ["acme"]},
                "tok-root": {"approver": "root", "accounts": "*"},
            }),
            &[],
        )
        .await
    }

    /// The node with the tokens file `tokens` and `env` on top.
    async fn start_with(tokens: &Value, env: &[(&str, &str)]) -> Console {
        let (dir, tokens) = tokens_file(tokens);
        let mut c = Cluster::servers().await;
        let mut all = vec![
            ("TOOLMESH_TOOL_APPROVAL_MODE", "strict"),
            ("TOOLMESH_CONSOLE_LISTEN", "127.0.0.1:0"),
            ("TOOLMESH_CONSOLE_TOKENS", tokens.to_str().unwrap()),
        ];
        all.extend_from_slice(env);
        let listen = c
            .start_listening(
                "gateway,approval,workspace,console",
                &all,
                Listener::Console,
            )
            .await;
        Console {
            c,
            url: format!("http://{listen}"),
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    /// A request to the console's API; the status and the JSON body.
    async fn api(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let response = request.send().await.expect("the console answers");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or_else(|_| json!({"unparsed": text}));
        (status, body)
    }

    /// A decision of approval `id` of `account` with `body`, as `tok-acme`.
    async fn decide(&self, account: &str, id: &str, body: &str) -> (u16, Value) {
        let path = format!("/api/approvals/{account}/{id}/decide");
        self.api("POST", &path, Some("tok-acme"), Some(body)).await
    }

    /// A GET of the console's API.
    async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.api("GET", path, token, None).await
    }

    /// A strict-mode write in `account` without approval: its approval request.
    async fn gated_write(&self, account: &str, path: &str, content: &str) -> Value {
        let reply = self
            .c
            .call(
                account,
                json!({"tool": "write_workspace_file", "session_id": "s1",
                       "user_id": "user-7", "agent_id": "agent-3",
                       "arguments": {"path": path, "content": content}}),
            )
            .await;
        assert_eq!(reply["error"], "approval_required", "{reply}");
        reply["approval_request"].clone()
    }
}

/// Asserts that a console API reply is refused with HTTP `status` and error `code`.
#[track_caller]
fn assert_refusal((got, body): &(u16, Value), status: u16, code: &str) {
    assert_eq!(
        (*got, body["error"].as_str()),
        (status, Some(code)),
        "{body}"
    );
}

#[tokio::test]
async fn the_api_needs_a_known_token_and_a_granted_account() {
    let con = Console::start().await;
    let (status, body) = con.get("/api/me", None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"], "invalid_request", "{body}");
    assert_eq!(con.get("/api/me", Some("nope")).await.0, 401);
    assert_eq!(con.get("/api/approvals/acme", Some("nope")).await.0, 401);
    assert_eq!(con.get("/api/stream", None).await.0, 401);

    let (status, me) = con.get("/api/me", Some("tok-acme")).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["approver"], ALICE);
    assert_eq!(me["accounts"], json!(["acme"]));
    assert_eq!(
        con.get("/api/me", Some("tok-root")).await.1["accounts"],
        "*"
    );

    // Another account's approvals: neither listed, read, decided nor streamed.
    let globex = con.gated_write("globex", "g.txt", "globex data\n").await;
    let gid = globex["id"].as_str().unwrap();
    let (status, body) = con.get("/api/approvals/globex", Some("tok-acme")).await;
    assert_eq!(status, 403, "{body}");
    assert_holds(&body, "error_message", "globex");
    let (status, _) = con
        .get(&format!("/api/approvals/globex/{gid}"), Some("tok-acme"))
        .await;
    assert_eq!(status, 403);
    let (status, _) = con
        .decide("globex", gid, r#"{"approved": true, "reason": "not mine"}"#)
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        con.get("/api/stream?accounts=globex", Some("tok-acme"))
            .await
            .0,
        403
    );
    let still = con.c.approvals("globex", "get", json!({"id": gid})).await;
    assert_eq!(still["approval"]["status"], "pending", "{still}");
    for (path, refusal) in [
        // The id of a globex approval is not found in acme either.
        (
            format!("/api/approvals/acme/{gid}"),
            (404, Some("not_found")),
        ),
        // A malformed account is a bad request, not a crash.
        (
            "/api/approvals/a.b".to_owned(),
            (400, Some("invalid_request")),
        ),
    ] {
        let (status, body) = con.get(&path, Some("tok-acme")).await;
        assert_eq!((status, body["error"].as_str()), refusal, "{path}: {body}");
    }
    // The every-account token sees globex.
    let (status, body) = con.get("/api/approvals/globex", Some("tok-root")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["approvals"][0]["approval"]["id"], gid, "{body}");
}

#[tokio::test]
async fn list_and_decide_record_the_approver() {
    let con = Console::start().await;
    let a = con
        .gated_write("acme", "notes/hello.txt", "<b>hello</b>\n")
        .await;
    let id = a["id"].as_str().unwrap();

    let (status, listed) = con.get("/api/approvals/acme", Some("tok-acme")).await;
    assert_eq!(status, 200, "{listed}");
    let item = &listed["approvals"][0];
    assert_eq!(item["approval"]["id"], id, "{listed}");
    assert_eq!(item["approval"]["tool_name"], "write_workspace_file");
    assert_eq!(item["approval"]["risk_level"], a["risk_level"]);
    assert_eq!(item["approval"]["session_id"], "s1");
    assert_eq!(item["user_id"], "user-7", "{item}");
    assert_eq!(item["agent_id"], "agent-3", "{item}");
    assert_eq!(item["arguments"]["content"], "<b>hello</b>\n", "{item}");
    assert_eq!(
        item["diff"], "--- /dev/null\n+++ b/notes/hello.txt\n@@ -0,0 +1 @@\n+<b>hello</b>\n",
        "{item}"
    );

    // Bad bodies are refused with the contract's code, nothing decided.
    for bad in [
        "",
        "{}",
        r#"{"approved": "yes"}"#,
        r#"{"approved": true, "approver": "mallory"}"#,
    ] {
        let (status, body) = con.decide("acme", id, bad).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_request")),
            "{bad}: {body}"
        );
    }

    let (status, decided) = con
        .decide("acme", id, r#"{"approved": true, "reason": "looks right"}"#)
        .await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["approval"]["status"], "approved");
    assert_eq!(decided["approval"]["decided_by"], ALICE);
    assert_eq!(decided["approval"]["reason"], "looks right");
    // The contrary decision is a conflict the page shows.
    let body = con
        .decide(
            "acme",
            id,
            r#"{"approved": false, "reason": "changed my mind"}"#,
        )
        .await;
    assert_refusal(&body, 409, "conflict");
    let (_, listed) = con.get("/api/approvals/acme", Some("tok-acme")).await;
    assert_eq!(listed["approvals"], json!([]), "{listed}");

    // The approved call runs.
    ok(con
        .c
        .call(
            "acme",
            json!({"tool": "write_workspace_file", "session_id": "s1", "approval": {"id": id},
                   "arguments": {"path": "notes/hello.txt", "content": "<b>hello</b>\n"}}),
        )
        .await);
}

/// Reads the SSE body until an event named `name` arrives; its data.
async fn next_event(response: &mut reqwest::Response, buffer: &mut String, name: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        while let Some(cut) = buffer.find("\n\n") {
            let block: String = buffer.drain(..cut + 2).collect();
            let event = block.lines().find_map(|l| l.strip_prefix("event: "));
            let data: String = block
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect::<Vec<_>>()
                .join("\n");
            if event == Some(name) {
                return serde_json::from_str(&data).unwrap();
            }
            assert!(
                event != Some("requested") || name == "requested",
                "unexpected event before {name}: {block}"
            );
        }
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .unwrap_or_else(|_| panic!("no {name} event in time; got {buffer:?}"))
            .unwrap()
            .expect("the stream stays open");
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test]
async fn the_stream_lists_then_announces_only_granted_accounts() {
    let con = Console::start().await;
    let first = con.gated_write("acme", "one.txt", "1\n").await;
    let mut response = con
        .http
        .get(format!("{}/api/stream", con.url))
        .bearer_auth("tok-acme")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut buffer = String::new();
    let snapshot = next_event(&mut response, &mut buffer, "snapshot").await;
    assert_eq!(
        snapshot["approvals"][0]["approval"]["id"], first["id"],
        "{snapshot}"
    );
    assert_eq!(snapshot["errors"], json!([]));

    // A globex approval is not announced to an acme token; the acme one after it is.
    con.gated_write("globex", "g.txt", "g\n").await;
    let second = con.gated_write("acme", "two.txt", "2\n").await;
    let requested = next_event(&mut response, &mut buffer, "requested").await;
    assert_eq!(requested["approval"]["id"], second["id"], "{requested}");
    assert_eq!(requested["approval"]["account"], "acme");
    assert_eq!(requested["arguments"]["path"], "two.txt", "{requested}");
    assert_eq!(requested["user_id"], "user-7");

    con.c
        .decide("acme", first["id"].as_str().unwrap(), false)
        .await;
    let decided = next_event(&mut response, &mut buffer, "decided").await;
    assert_eq!(decided["approval"]["id"], first["id"], "{decided}");
    assert_eq!(decided["approval"]["status"], "rejected");
    assert_eq!(decided["approval"]["decided_by"], "alice");
}

#[tokio::test]
async fn a_bad_tokens_file_stops_the_node_naming_it() {
    let (_dir, tokens) = temp_file(
        "tokens.json",
        r#"{"t": {"approver": "a", "accounts": ["no.dots"]}}"#,
    );
    let stderr = crate::support::node_refusal(
        "console",
        &[("TOOLMESH_CONSOLE_TOKENS", tokens.to_str().unwrap())],
    );
    assert!(stderr.contains("TOOLMESH_CONSOLE_TOKENS"), "{stderr}");
    assert!(stderr.contains("no.dots"), "{stderr}");
}

/// The browser script's last line is `done`, it exits 0, and it left its screenshot.
async fn browser_done(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    child: &mut tokio::process::Child,
    screenshot: &Path,
) {
    let done = next_line(lines).await;
    assert_eq!(done["step"], "done", "{done}");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        screenshot.metadata().unwrap().len() > 1000,
        "no screenshot at {}",
        screenshot.display()
    );
}

/// The browser script's next line of JSON (a `fatal` line fails the test).
async fn next_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> Value {
    let line = tokio::time::timeout(BROWSER_WITHIN, lines.next_line())
        .await
        .expect("the browser script answers in time")
        .unwrap()
        .expect("the browser script prints a line");
    let value: Value = serde_json::from_str(&line).unwrap_or_else(|_| json!({"unparsed": line}));
    assert!(
        value.get("fatal").is_none(),
        "the browser script failed: {value}"
    );
    value
}

/// Sign in in a real browser, watch a parked call's approval appear without a reload, approve
/// it with a reason, and the call runs.
#[tokio::test]
async fn a_browser_sees_a_new_approval_live_and_approving_it_runs_the_parked_call() {
    let con = Console::start().await;
    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("console-approved.png");
    let _ = std::fs::remove_file(&screenshot);
    let spec = json!({
        "url": con.url, "token": "tok-acme", "reason": "reviewed in the browser",
        "screenshot": screenshot,
    });
    let mut child = crate::support::python_script("console_browser.py", &spec);
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // Signed in, the stream live, the no-reload marker set: only now is the approval made.
    let ready = next_line(&mut lines).await;
    assert_eq!(ready["step"], "ready", "{ready}");
    assert_eq!(ready["pending"], 0, "{ready}");

    let client = con.c.client.clone();
    let parked = tokio::spawn(async move {
        request_json_within(
            &client,
            "toolmesh.v1.call.acme",
            json!({"tool": "write_workspace_file", "session_id": "s1", "user_id": "user-7",
                   "wait_for_approval_s": 120,
                   "arguments": {"path": "from-browser.txt",
                                 "content": "approved live <b>not bold</b><img src=x>\n"}}),
            Duration::from_secs(150),
        )
        .await
    });

    let approved = next_line(&mut lines).await;
    assert_eq!(approved["step"], "approved", "{approved}");
    assert_eq!(approved["marker"], true, "the page reloaded: {approved}");
    assert_eq!(approved["navigations"], 1, "{approved}");
    assert_eq!(approved["tool"], "write_workspace_file", "{approved}");
    assert_holds(&approved, "diff", "+approved live");
    assert_eq!(approved["decided_by"], ALICE, "{approved}");
    assert_eq!(approved["reason"], "reviewed in the browser", "{approved}");
    assert_eq!(
        approved["stray"], "",
        "text outside the entry's parts: {approved}"
    );
    // Data is text on the page, never markup.
    assert_holds(&approved, "arguments", "<b>not bold</b><img src=x>");
    assert_eq!(approved["injected"], 0, "{approved}");
    assert_holds(&approved, "announced", "write_workspace_file");

    ok(tokio::time::timeout(Duration::from_secs(60), parked)
        .await
        .expect("the parked call ends once approved")
        .unwrap());
    let id = approved["id"].as_str().unwrap();
    let got = con.c.approvals("acme", "get", json!({"id": id})).await;
    assert_eq!(got["approval"]["decided_by"], ALICE, "{got}");
    assert_eq!(
        got["approval"]["reason"], "reviewed in the browser",
        "{got}"
    );
    assert_eq!(got["approval"]["status"], "used", "{got}");
    let read = ok(con
        .c
        .read_workspace_file("acme", "s1", "from-browser.txt")
        .await);
    assert!(read.to_string().contains("approved live"), "{read}");

    browser_done(&mut lines, &mut child, &screenshot).await;
}
