//! Reviewers, grants and edits through the console (PROTOCOL.md "Approval policy"): a routed
//! approval is decided as the token's approver on `…decide.<approver>`, an approval may be
//! remembered as a grant the console lists and revokes, and edited arguments are checked before
//! the parked call runs them. The API with reqwest, then the page in headless Chromium
//! (`tests/python/console_review_browser.py`).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

use super::{assert_refusal, browser_done, next_line, Console};
use crate::policies::{policy, ONE_MEMBER_GROUPS};
use crate::support::{assert_holds, ok, policy_file};

/// `write_workspace_file` goes to `ops` (alice), `component_status` to `legal` (carol);
/// `delete_workspace_file` (high risk) needs an approval anyone of the account may decide.
fn policy_text() -> String {
    let rules = r#"
[[rules]]
id = "ops-writes"
tools = ["write_workspace_file"]
decision = "ask"
reviewers = "ops"

[[rules]]
id = "legal-status"
tools = ["component_status"]
decision = "ask"
reviewers = "legal"
"#;
    policy("strict", &[ONE_MEMBER_GROUPS, rules])
}

/// The console with [`policy_text`] and its tokens: `tok-alice` (alice, a member of ops),
/// `tok-bob` (bob, a member of nothing), `tok-named` (a name no subject can carry) for acme,
/// and `tok-globex` (alice for globex only).
async fn reviewed() -> (Console, tempfile::TempDir) {
    let (dir, path) = policy_file(&policy_text());
    let con = Console::start_with(
        &json!({
            "tok-alice": {"approver": "alice", "accounts": ["acme"]},
            "tok-bob": {"approver": "bob", "accounts": ["acme"]},
            "tok-named": {"approver": "Alice Approver", "accounts": ["acme"]},
            "tok-globex": {"approver": "alice", "accounts": ["globex"]},
        }),
        &[("TOOLMESH_POLICY_FILE", path.as_str())],
    )
    .await;
    (con, dir)
}

impl Console {
    /// A decision of approval `id` of acme with `body`, as `token`.
    async fn decide_as(&self, token: &str, id: &str, body: Value) -> (u16, Value) {
        let path = format!("/api/approvals/acme/{id}/decide");
        self.api("POST", &path, Some(token), Some(&body.to_string()))
            .await
    }

    /// A write of `content` to `path` in session `s1` of acme (no approval given).
    async fn write_in_s1(&self, path: &str, content: &str) -> Value {
        self.c
            .write_workspace_file("acme", "s1", path, content)
            .await
    }

    /// A decision of approval `id` of acme with `body`, as `token`, that must be taken: the
    /// reply's body.
    async fn decided_as(&self, token: &str, id: &str, body: Value) -> Value {
        let (status, decided) = self.decide_as(token, id, body).await;
        assert_eq!(status, 200, "{decided}");
        decided
    }

    /// Asserts that a decision of approval `id` with `body` as `token` is refused with the
    /// HTTP status and error `refusal`, and that the approval is still pending.
    async fn assert_undecided(&self, token: &str, id: &str, body: Value, refusal: (u16, &str)) {
        let refused = self.decide_as(token, id, body).await;
        assert_refusal(&refused, refusal.0, refusal.1);
        assert_eq!(self.status_of(id).await, "pending");
    }

    async fn status_of(&self, id: &str) -> Value {
        let got = ok(self.c.approvals("acme", "get", json!({"id": id})).await);
        got["approval"]["status"].clone()
    }
}

fn id_of(approval: &Value) -> String {
    approval["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_routed_approval_is_decided_as_the_tokens_reviewer_and_only_by_a_member() {
    let (con, _policy) = reviewed().await;
    let (status, me) = con.get("/api/me", Some("tok-alice")).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(
        (&me["approver"], &me["reviewer"], &me["groups"]),
        (&json!("alice"), &json!(true), &json!(["ops"])),
        "{me}"
    );
    let (_, bob) = con.get("/api/me", Some("tok-bob")).await;
    assert_eq!(bob["groups"], json!([]), "{bob}");
    let (_, named) = con.get("/api/me", Some("tok-named")).await;
    assert_eq!(
        (&named["reviewer"], &named["groups"]),
        (&json!(false), &json!([])),
        "{named}"
    );

    let routed = con.gated_write("acme", "routed.txt", "for ops\n").await;
    let id = id_of(&routed);
    let (_, listed) = con.get("/api/approvals/acme", Some("tok-alice")).await;
    let shown = &listed["approvals"][0]["approval"];
    assert_eq!(shown["id"], id.as_str(), "{listed}");
    assert_eq!(
        (&shown["reviewers"], &shown["quorum"]),
        (&json!("ops"), &json!(1)),
        "{shown}"
    );

    // Neither a non-member nor a name no subject can carry decides it.
    let refused = con
        .decide_as("tok-bob", &id, json!({"approved": true}))
        .await;
    assert_refusal(&refused, 403, "forbidden");
    assert_holds(&refused.1, "error_message", "bob");
    let named = json!({"approved": false});
    con.assert_undecided("tok-named", &id, named, (403, "forbidden"))
        .await;

    let decided = con
        .decided_as(
            "tok-alice",
            &id,
            json!({"approved": true, "reason": "ops looked"}),
        )
        .await;
    let approval = &decided["approval"];
    assert_eq!(
        (&approval["status"], &approval["decided_by"]),
        (&json!("approved"), &json!("alice")),
        "{decided}"
    );
    assert_eq!(approval["decisions"][0]["approver"], "alice", "{decided}");
    assert_eq!(
        approval["decisions"][0]["reason"], "ops looked",
        "{decided}"
    );

    // An approval without reviewers is decided on the same subject, recording the name.
    let open = con
        .c
        .call(
            "acme",
            json!({"tool": "delete_workspace_file", "session_id": "s1",
                   "arguments": {"path": "gone.txt"}}),
        )
        .await;
    let open_id = id_of(&open["approval_request"]);
    assert!(open["approval_request"]["reviewers"].is_null(), "{open}");
    let decided = con
        .decided_as("tok-bob", &open_id, json!({"approved": false}))
        .await;
    assert_eq!(decided["approval"]["decided_by"], "bob", "{decided}");
}

#[tokio::test]
async fn approve_and_remember_makes_a_grant_the_console_lists_and_revokes() {
    let (con, _policy) = reviewed().await;
    let requested = con.gated_write("acme", "one.txt", "1\n").await;
    let id = id_of(&requested);

    // The shapes the console passes on are checked before anything is sent.
    for bad in [
        json!({"approved": true, "grant": "session"}),
        json!({"approved": true, "grant": ["session"]}),
        json!({"approved": true, "arguments": [1]}),
        json!({"approved": true, "arguments": "{}"}),
    ] {
        let (status, body) = con.decide_as("tok-alice", &id, bad.clone()).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_request")),
            "{bad}: {body}"
        );
    }
    // A grant the approval actor refuses leaves the approval pending.
    let forever = json!({"approved": true, "grant": {"scope": "forever"}});
    con.assert_undecided("tok-alice", &id, forever, (400, "invalid_request"))
        .await;

    let decided = con
        .decided_as(
            "tok-alice",
            &id,
            json!({"approved": true, "reason": "fine for this session",
                   "grant": {"scope": "session", "expires_in_s": 600, "uses": 3}}),
        )
        .await;
    let grant = &decided["grant"];
    let grant_id = grant["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (
            &grant["session_id"],
            &grant["created_by"],
            &grant["uses_left"]
        ),
        (&json!("s1"), &json!("alice"), &json!(3)),
        "{grant}"
    );
    assert_eq!(grant["tools"], json!(["write_workspace_file"]), "{grant}");

    let (status, listed) = con.get("/api/grants/acme", Some("tok-alice")).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["grants"][0]["id"], grant_id.as_str(), "{listed}");
    assert_eq!(listed["grants"][0]["approval_id"], id.as_str(), "{listed}");
    // Another account's token sees nor revokes acme's grants.
    assert_eq!(con.get("/api/grants/acme", Some("tok-globex")).await.0, 403);
    let revoke = format!("/api/grants/acme/{grant_id}/revoke");
    assert_eq!(
        con.api("POST", &revoke, Some("tok-globex"), None).await.0,
        403
    );
    assert_eq!(con.get("/api/grants/acme", None).await.0, 401);

    // The grant covers a later write of the session.
    let covered = ok(con.write_in_s1("two.txt", "2\n").await);
    assert_eq!(covered["grant_id"], grant_id.as_str(), "{covered}");

    let (status, revoked) = con.api("POST", &revoke, Some("tok-alice"), None).await;
    assert_eq!(status, 200, "{revoked}");
    assert!(revoked["grant"]["revoked_at"].is_string(), "{revoked}");
    let unknown = con
        .api(
            "POST",
            "/api/grants/acme/grant_0000/revoke",
            Some("tok-alice"),
            None,
        )
        .await;
    assert_refusal(&unknown, 404, "not_found");
    let again = con.write_in_s1("three.txt", "3\n").await;
    assert_eq!(again["error"], "approval_required", "{again}");
    let (_, listed) = con.get("/api/grants/acme", Some("tok-alice")).await;
    assert_eq!(listed["grants"][0]["uses_left"], 2, "{listed}");
    assert!(listed["grants"][0]["revoked_at"].is_string(), "{listed}");
}

#[tokio::test]
async fn an_edit_is_checked_before_it_is_approved_and_the_parked_call_runs_it() {
    let (con, _policy) = reviewed().await;
    let mut requested = con.c.watch("toolmesh.v1.approvals.acme.requested").await;
    let parked = con.c.call_in_background(
        "acme",
        json!({"tool": "write_workspace_file", "session_id": "s1", "wait_for_approval_s": 30,
               "arguments": {"path": "edited.txt", "content": "as asked\n"}}),
    );
    let msg = tokio::time::timeout(
        Duration::from_secs(10),
        futures::StreamExt::next(&mut requested),
    )
    .await
    .expect("the approval is announced")
    .unwrap();
    let approval: Value = serde_json::from_slice(&msg.payload).unwrap();
    let id = id_of(&approval);

    // Arguments the tool's schema refuses: the error, and nothing decided.
    let invalid = json!({"approved": true, "arguments": {"path": 7, "content": "x"}});
    con.assert_undecided("tok-alice", &id, invalid, (422, "invalid_arguments"))
        .await;

    let edited = json!({"path": "edited.txt", "content": "as the reviewer wrote\n"});
    let decided = con
        .decided_as(
            "tok-alice",
            &id,
            json!({"approved": true, "arguments": edited}),
        )
        .await;
    assert_eq!(decided["approval"]["edited"], true, "{decided}");
    assert_eq!(decided["approval"]["decided_by"], "alice", "{decided}");
    assert!(
        decided["approval"]["original_arguments_sha256"].is_string(),
        "{decided}"
    );
    let ran = tokio::time::timeout(Duration::from_secs(30), parked)
        .await
        .expect("the parked call ends once approved")
        .unwrap();
    let ran = ok(ran);
    assert_eq!(ran["approval_edited"], true, "{ran}");
    let read = ok(con.c.read_workspace_file("acme", "s1", "edited.txt").await);
    assert_holds(&read, "content", "as the reviewer wrote");
}

/// The browser script, its stdin kept to say when to go on.
fn browser(spec: &Value) -> tokio::process::Child {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/console_review_browser.py");
    tokio::process::Command::new(toolmesh_testkit::venv_bin("python"))
        .arg(script)
        .arg(spec.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the venv's python starts")
}

/// A reviewer in a real browser: sees the approval routed to their group under "for me" and
/// another group's as not theirs, edits the arguments in place (a text that is not JSON is
/// refused on the page, arguments the tool refuses are shown next to the edit), approves and
/// remembers for the session, and revokes the grant from the Grants panel.
#[tokio::test]
async fn a_reviewer_edits_approves_and_remembers_then_revokes_the_grant_in_the_browser() {
    let (con, _policy) = reviewed().await;
    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("console-review.png");
    let _ = std::fs::remove_file(&screenshot);
    let spec = json!({
        "url": con.url, "token": "tok-alice", "screenshot": screenshot,
        "edited": {"path": "browser.txt", "content": "edited in the browser\n"},
    });
    let mut child = browser(&spec);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = next_line(&mut lines).await;
    assert_eq!(ready["step"], "ready", "{ready}");
    assert_eq!(ready["groups"], "(reviewer in ops)", "{ready}");

    // Another group's approval, then a parked write routed to ops.
    let legal = con
        .c
        .call(
            "acme",
            json!({"tool": "component_status", "session_id": "s1"}),
        )
        .await;
    assert_eq!(legal["approval_request"]["reviewers"], "legal", "{legal}");
    let parked = con.c.call_in_background(
        "acme",
        json!({"tool": "write_workspace_file", "session_id": "s1", "wait_for_approval_s": 150,
               "arguments": {"path": "browser.txt", "content": "as the agent wrote\n"}}),
    );

    let remembered = next_line(&mut lines).await;
    assert_eq!(remembered["step"], "remembered", "{remembered}");
    assert_holds(&remembered, "mine_note", "For you");
    assert_holds(&remembered, "others_note", "Not yours");
    assert_eq!(remembered["others_hidden"], true, "{remembered}");
    assert_eq!(remembered["reviewers"], "ops", "{remembered}");
    assert_holds(&remembered, "quorum", "0 of 1");
    assert_holds(&remembered, "prefilled", "as the agent wrote");
    // Not JSON: refused on the page, nothing sent.
    assert_holds(&remembered, "not_json_error", "not JSON");
    assert_eq!(remembered["posts_after_not_json"], 0, "{remembered}");
    // JSON the tool's schema refuses: the gateway's error beside the edit, which stays.
    assert_holds(&remembered, "invalid_error", "invalid_arguments");
    assert_eq!(remembered["edit_kept"], true, "{remembered}");
    assert_eq!(remembered["decided_by"], "alice", "{remembered}");
    assert_holds(&remembered, "edited", "yes");
    assert_holds(&remembered, "grant_scope", "session s1");
    assert_eq!(remembered["grant_uses"], "2", "{remembered}");
    assert_eq!(remembered["grant_tools"], "write_workspace_file");

    let ran = tokio::time::timeout(Duration::from_secs(60), parked)
        .await
        .expect("the parked call ends once approved")
        .unwrap();
    assert_eq!(ok(ran)["approval_edited"], true);
    let read = ok(con.c.read_workspace_file("acme", "s1", "browser.txt").await);
    assert_holds(&read, "content", "edited in the browser");
    let grant_id = remembered["grant_id"].as_str().unwrap().to_owned();
    // The grant covers one more write of the session; the page then shows one use left.
    let covered = ok(con.write_in_s1("covered.txt", "covered\n").await);
    assert_eq!(covered["grant_id"], grant_id.as_str(), "{covered}");
    stdin.write_all(b"go\n").await.unwrap();
    stdin.flush().await.unwrap();

    let revoked = next_line(&mut lines).await;
    assert_eq!(revoked["step"], "revoked", "{revoked}");
    assert_eq!(revoked["uses_before"], "1", "{revoked}");
    assert_holds(&revoked, "status", "revoked at");
    let listed = con.c.grants("acme", "list", json!({})).await;
    assert_eq!(listed["grants"][0]["id"], grant_id.as_str(), "{listed}");
    assert!(listed["grants"][0]["revoked_at"].is_string(), "{listed}");
    let again = con.write_in_s1("again.txt", "again\n").await;
    assert_eq!(again["error"], "approval_required", "{again}");

    browser_done(&mut lines, &mut child, &screenshot).await;
}
