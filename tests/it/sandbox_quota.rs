//! PROTOCOL.md "Tenancy and trust", sandboxes: one account holds at most
//! `TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT` sessions of a worker (at its quota, a new
//! session recycles the account's own idle one), and a full worker makes room from the
//! caller's own idle sessions first, never from a session running a background
//! task nor from an account holding no more sessions than the caller. A real node with the
//! process backend (bubblewrap), driven through the gateway.

use serde_json::{json, Value};

use crate::sandbox::{cluster_with, SandboxCluster};
use crate::support::assert_error;

const PER_ACCOUNT_VAR: &str = "TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT";

/// A node whose worker holds `max` sessions, `per_account` of them per account (`None`: the
/// default, half of `max`).
async fn worker(max: &str, per_account: Option<&str>) -> SandboxCluster {
    let mut env = vec![
        ("TOOLMESH_SANDBOX_BACKEND", "process"),
        ("TOOLMESH_SANDBOX_DISK_MB", "0"),
        ("TOOLMESH_SANDBOX_MAX_SESSIONS", max),
    ];
    if let Some(n) = per_account {
        env.push((PER_ACCOUNT_VAR, n));
    }
    cluster_with(&env).await
}

async fn call(c: &SandboxCluster, account: &str, session: &str, tool: &str, args: Value) -> Value {
    c.call(
        account,
        json!({"tool": tool, "session_id": session, "arguments": args}),
    )
    .await
}

/// Runs `command` in the session (its sandbox made for it when it has none): the reply.
async fn run(c: &SandboxCluster, account: &str, session: &str, command: &str) -> Value {
    call(
        c,
        account,
        session,
        "run_command",
        json!({"command": command}),
    )
    .await
}

/// Opens the session with a command that ends at once: its sandbox id.
async fn open(c: &SandboxCluster, account: &str, session: &str) -> String {
    let r = run(c, account, session, "true").await;
    assert_eq!(r["ok"], true, "{account}/{session}: {r}");
    r["sandbox_id"].as_str().unwrap().to_owned()
}

/// Starts `sleep 300` as a background task of the session: its task id.
async fn background_sleep(c: &SandboxCluster, account: &str, session: &str) -> String {
    let r = call(
        c,
        account,
        session,
        "run_command",
        json!({"command": "sleep 300", "background": true}),
    )
    .await;
    assert_eq!(r["ok"], true, "{account}/{session}: {r}");
    r["task_id"].as_str().unwrap().to_owned()
}

/// The sandbox the worker holds for the session, if any (`sandbox_status` creates none).
async fn held(c: &SandboxCluster, account: &str, session: &str) -> Option<String> {
    let status = call(c, account, session, "sandbox_status", json!({})).await;
    assert_eq!(status["ok"], true, "{account}/{session}: {status}");
    status["sandbox_id"].as_str().map(str::to_owned)
}

/// The status of the session's task `task_id` (`list_tasks` creates no sandbox).
async fn task_status(c: &SandboxCluster, account: &str, session: &str, task_id: &str) -> Value {
    let list = call(c, account, session, "list_tasks", json!({})).await;
    assert_eq!(list["ok"], true, "{account}/{session}: {list}");
    list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task_id"] == task_id)
        .map_or(Value::Null, |t| t["status"].clone())
}

fn assert_quota_refusal(r: &Value, quota: usize) {
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"], "limit_exceeded", "{r}");
    let message = r["error_message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{PER_ACCOUNT_VAR}={quota}")),
        "the refusal names the quota and its variable: {r}"
    );
}

/// The finding: account B opening session after session on a worker where account A runs a
/// background server and keeps an idle session. B holds its quota (half the worker) at most,
/// each new session recycling B's own oldest idle one; A's task runs on and A's idle session
/// keeps its sandbox. With both of B's sessions busy, B's next one is `limit_exceeded`.
#[tokio::test]
async fn one_account_opening_sessions_cannot_push_another_out() {
    let c = worker("4", None).await;
    let task = background_sleep(&c, "acme", "a1").await;
    let a2 = open(&c, "acme", "a2").await;

    for n in 1..=6 {
        open(&c, "globex", &format!("b{n}")).await;
    }
    assert_eq!(task_status(&c, "acme", "a1", &task).await, "running");
    assert_eq!(
        held(&c, "acme", "a2").await.as_deref(),
        Some(a2.as_str()),
        "acme's idle session keeps its sandbox"
    );
    for n in 1..=4 {
        let session = format!("b{n}");
        assert_eq!(
            held(&c, "globex", &session).await,
            None,
            "{session} made room"
        );
    }
    // Both of globex's sessions busy: nothing of its own can make room.
    background_sleep(&c, "globex", "b5").await;
    background_sleep(&c, "globex", "b6").await;
    assert_quota_refusal(&run(&c, "globex", "b7", "true").await, 2);
    assert_eq!(
        held(&c, "acme", "a2").await.as_deref(),
        Some(a2.as_str()),
        "acme's idle session still keeps its sandbox"
    );
    assert_eq!(task_status(&c, "acme", "a1", &task).await, "running");
}

/// A full worker makes room from the caller's own least recently used idle session, though
/// another account's is older; with none of its own idle it takes no room from an account
/// holding no more sessions than it (`unavailable`), while a newcomer gets the idle one of the
/// account holding the most. A session running a background task stays throughout.
#[tokio::test]
async fn a_full_worker_makes_room_from_the_callers_own_sessions_first() {
    let c = worker("4", Some("3")).await;
    let task = background_sleep(&c, "acme", "a1").await;
    let a2 = open(&c, "acme", "a2").await;
    let b1 = open(&c, "globex", "b1").await;
    open(&c, "globex", "b2").await;

    // Full: globex's third session takes the room of its own b1, not of acme's older a2.
    open(&c, "globex", "b3").await;
    assert_eq!(held(&c, "globex", "b1").await, None, "b1 ({b1}) made room");
    assert_eq!(
        held(&c, "acme", "a2").await.as_deref(),
        Some(a2.as_str()),
        "acme's idle session stays"
    );

    // Every globex session busy now: its next one would take room from acme, which holds no
    // more than globex does.
    let b2_task = background_sleep(&c, "globex", "b2").await;
    background_sleep(&c, "globex", "b3").await;
    let r = run(&c, "globex", "b4", "true").await;
    assert_error(&r, "unavailable", "TOOLMESH_SANDBOX_MAX_SESSIONS");
    assert_eq!(
        held(&c, "acme", "a2").await.as_deref(),
        Some(a2.as_str()),
        "acme's idle session stays"
    );

    // A newcomer holds fewer than both: the one idle session goes, of acme (globex's are all
    // running tasks). No session running a task went.
    open(&c, "initech", "c1").await;
    assert_eq!(held(&c, "acme", "a2").await, None);
    assert_eq!(task_status(&c, "acme", "a1", &task).await, "running");
    assert_eq!(task_status(&c, "globex", "b2", &b2_task).await, "running");
}

/// First calls of many sessions at once cannot pass the quota together: a session being
/// created counts from its admission on, and one running a command cannot make room.
#[tokio::test]
async fn concurrent_first_calls_cannot_pass_the_quota_together() {
    let c = worker("8", Some("2")).await;
    let calls: Vec<_> = (1..=6)
        .map(|n| {
            c.call_in_background(
                "globex",
                json!({"tool": "run_command", "session_id": format!("b{n}"), "arguments": {"command": "sleep 3"}}),
            )
        })
        .collect();
    let mut ok = 0;
    for call in calls {
        let r = call.await.unwrap();
        if r["ok"] == true {
            ok += 1;
        } else {
            assert_quota_refusal(&r, 2);
        }
    }
    assert_eq!(ok, 2, "two sessions of six opened at once");
}
