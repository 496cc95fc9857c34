//! No reply is larger than the server's `max_payload` (PROTOCOL.md "Large data"): list results
//! are cut by their tool to fit (`truncated: true`), and a reply nothing can cut becomes
//! `limit_exceeded` in the reply path — never silence. NATS runs with a small `max_payload`
//! here so the data stays small; every reply is read on both paths: straight from the actor
//! (a caller under `_INBOX.`) and through the gateway (any other reply subject).

use std::time::{Duration, Instant};

use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use toolmesh_kernel::host::{answer, confirm_subscriptions};
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::wire::{ActorCall, ActorReply};

use crate::support::{assert_holds, collect, fake_workspace, ok, Cluster};

/// The NATS `max_payload` of these tests.
const MAX_PAYLOAD: usize = 64 * 1024;

/// The gateway path's callers reply on `callers.…`, a prefix the nodes answer on only when
/// named (PROTOCOL.md "Tenancy and trust"); actors never answer there directly.
const GATEWAY_PATH: (&str, &str) = ("TOOLMESH_REPLY_PREFIXES", "_INBOX.,callers.");

/// Servers with the small `max_payload`, and a node with the given roles, approval off.
async fn cluster(roles: &str) -> Cluster {
    let mut c = Cluster::servers_with_max_payload(MAX_PAYLOAD).await;
    assert_eq!(c.client.server_info().max_payload, MAX_PAYLOAD);
    c.start_node(
        roles,
        &[("TOOLMESH_TOOL_APPROVAL_MODE", "off"), GATEWAY_PATH],
    )
    .await;
    c
}

/// Where a call's reply travels.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// The caller's reply subject is under `_INBOX.`: the actor answers it itself.
    Direct,
    /// Any other reply subject: the gateway answers.
    Gateway,
}

const PATHS: [Path; 2] = [Path::Direct, Path::Gateway];

/// Sends a call on the given path and returns the reply's size in bytes and its JSON: a reply
/// that never comes fails the test.
async fn call(client: &Client, path: Path, body: Value) -> (usize, Value) {
    let reply_to = match path {
        Path::Direct => client.new_inbox(),
        Path::Gateway => format!("callers.acme.{}", uuid::Uuid::new_v4().simple()),
    };
    let mut replies = client.subscribe(reply_to.clone()).await.unwrap();
    confirm_subscriptions(client).await.unwrap();
    client
        .publish_with_reply(
            "toolmesh.v1.call.acme",
            reply_to,
            Bytes::from(serde_json::to_vec(&body).unwrap()),
        )
        .await
        .unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(10), replies.next())
        .await
        .unwrap_or_else(|_| panic!("no reply within 10 s on the {path:?} path: {body}"))
        .expect("the reply subscription is open");
    let value = serde_json::from_slice(&msg.payload).expect("the reply is JSON");
    (msg.payload.len(), value)
}

/// `body` on each path: asserts that each reply fits in a message, is ok and is truncated, and
/// answers the replies with their paths.
async fn cut_to_fit(c: &Cluster, body: Value) -> Vec<(Path, Value)> {
    let mut replies = Vec::new();
    for path in PATHS {
        let (size, reply) = call(&c.client, path, body.clone()).await;
        assert!(size <= MAX_PAYLOAD, "{path:?}: {size} bytes");
        assert_eq!(reply["ok"], true, "{path:?}: {reply}");
        assert_eq!(reply["truncated"], true, "{path:?}");
        replies.push((path, reply));
    }
    replies
}

/// [`cut_to_fit`] of `body`, whose replies hold the array `list` and its length as `count`:
/// asserts that each list has more than `more_than` and fewer than `fewer_than` members, and
/// answers the lists with their paths.
async fn lists_cut_to_fit(
    c: &Cluster,
    body: Value,
    (list, count): (&str, &str),
    (more_than, fewer_than): (usize, usize),
) -> Vec<(Path, Vec<Value>)> {
    let mut lists = Vec::new();
    for (path, reply) in cut_to_fit(c, body).await {
        let members = reply[list].as_array().unwrap().clone();
        let n = members.len();
        assert!(n > more_than && n < fewer_than, "{path:?}: {n} {list}");
        assert_eq!(reply[count], n, "{path:?}");
        lists.push((path, members));
    }
    lists
}

fn workspace_call(tool: &str, arguments: Value) -> Value {
    json!({"tool": tool, "session_id": "s1", "arguments": arguments})
}

fn workspace_root(c: &Cluster) -> std::path::PathBuf {
    c.data_dir
        .path()
        .join("accounts/acme/sessions/s1/workspace")
}

#[tokio::test]
async fn a_listing_too_big_for_one_message_is_cut_to_fit() {
    let c = cluster("gateway,approval,workspace").await;
    let dir = workspace_root(&c).join("many");
    std::fs::create_dir_all(&dir).unwrap();
    // 2,000 names of 120 characters: some 400 KB of entries, six times the max_payload.
    for i in 0..2000 {
        std::fs::write(dir.join(format!("{i:05}-{}", "n".repeat(114))), "x").unwrap();
    }
    let body = workspace_call(
        "list_workspace_files",
        json!({"path": "many", "max_results": 5000}),
    );
    let cut = lists_cut_to_fit(&c, body, ("entries", "count"), (50, 2000)).await;
    for (path, entries) in cut {
        // Sorted by name, cut at the end.
        let first = entries[0]["name"].as_str().unwrap();
        assert!(first.starts_with("00000-"), "{path:?}: {first}");
    }
}

#[tokio::test]
async fn a_search_with_many_long_matching_lines_is_cut_to_fit() {
    let c = cluster("gateway,approval,workspace").await;
    let root = workspace_root(&c);
    std::fs::create_dir_all(&root).unwrap();
    let text: String = (0..3000)
        .map(|i| format!("needle {i:05} {}\n", "long line ".repeat(20)))
        .collect();
    std::fs::write(root.join("hay.txt"), text).unwrap();
    let body = workspace_call(
        "search_workspace_files",
        json!({"query": "needle", "max_results": 5000}),
    );
    lists_cut_to_fit(&c, body, ("results", "match_count"), (0, 3000)).await;
}

#[tokio::test]
async fn a_reply_no_tool_cuts_is_limit_exceeded_with_its_invocation_id() {
    let c = cluster("gateway,approval,workspace").await;
    let root = workspace_root(&c);
    std::fs::create_dir_all(&root).unwrap();
    // 90,000 characters asked for and read: over the 64 KiB a message may carry.
    std::fs::write(root.join("wide.txt"), "w".repeat(90_000)).unwrap();
    let mut events = c.watch("toolmesh.v1.events.acme.>").await;
    confirm_subscriptions(&c.client).await.unwrap();
    for (n, path) in PATHS.into_iter().enumerate() {
        let invocation = format!("inv-wide-{n}");
        let read = json!({"path": "wide.txt", "max_chars": 100000, "include_line_numbers": false});
        let (size, reply) = call(
            &c.client,
            path,
            json!({"tool": "tool_dispatcher", "session_id": "s1", "invocation_id": invocation,
                   "arguments": {"action": "call", "tool_name": "read_workspace_file",
                                 "arguments": read}}),
        )
        .await;
        assert!(size <= MAX_PAYLOAD, "{path:?}: {size} bytes");
        assert_eq!(reply["ok"], false, "{path:?}: {reply}");
        assert_eq!(reply["error"], "limit_exceeded", "{path:?}: {reply}");
        assert_eq!(reply["invocation_id"], invocation.as_str(), "{path:?}");
        assert_eq!(reply["dispatched_tool_name"], "read_workspace_file");
        assert_holds(&reply, "error_message", "max_payload");
        // `finished` says what the caller got.
        let finished = collect(&mut events, 2, Duration::from_secs(10))
            .await
            .into_iter()
            .find(|e| e["kind"] == "finished")
            .unwrap_or_else(|| panic!("{path:?}: no finished event"));
        assert_eq!(finished["invocation_id"], invocation.as_str());
        assert_eq!(finished["ok"], false, "{finished}");
        assert_eq!(finished["error"], "limit_exceeded", "{finished}");
    }
}

/// The kernel's reply path itself (`host::answer`, which every actor uses): an actor whose
/// tool returns a body over the `max_payload` has its reply replaced, on both paths.
#[tokio::test]
async fn the_reply_path_answers_limit_exceeded_for_any_oversized_result() {
    let mut c = Cluster::servers_with_max_payload(MAX_PAYLOAD).await;
    c.start_node(
        "gateway,approval",
        &[("TOOLMESH_TOOL_APPROVAL_MODE", "off"), GATEWAY_PATH],
    )
    .await;
    let actor_client = c.nats.client().await;
    let mut actor = fake_workspace(&actor_client).await;
    for path in PATHS {
        let caller = c.client.clone();
        let pending = tokio::spawn(async move {
            call(
                &caller,
                path,
                workspace_call("read_workspace_file", json!({"path": "a.txt"})),
            )
            .await
        });
        let msg = tokio::time::timeout(Duration::from_secs(10), actor.next())
            .await
            .expect("the gateway routes the call")
            .expect("subscription open");
        let routed: ActorCall = serde_json::from_slice(&msg.payload).unwrap();
        let mut fields = Map::new();
        fields.insert("content".into(), Value::from("c".repeat(MAX_PAYLOAD)));
        let finish = routed.direct_finish();
        answer(
            &actor_client,
            msg.reply.as_ref(),
            finish.as_ref(),
            ActorReply::ok(fields),
            Instant::now(),
        )
        .await;
        let (size, reply) = pending.await.unwrap();
        assert!(size <= MAX_PAYLOAD, "{path:?}: {size} bytes");
        assert_eq!(reply["error"], "limit_exceeded", "{path:?}: {reply}");
        assert_eq!(
            reply["invocation_id"],
            routed.invocation.invocation_id.as_str(),
            "{path:?}"
        );
    }
}

/// Sandbox family: `list_tasks` of tasks whose commands are long is cut to fit.
#[tokio::test]
async fn a_task_list_too_big_for_one_message_is_cut_to_fit() {
    let mut c = Cluster::servers_with_max_payload(MAX_PAYLOAD).await;
    c.start_node(
        "gateway,approval,workspace,sandbox",
        &[
            ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
            GATEWAY_PATH,
            ("TOOLMESH_SANDBOX_BACKEND", "process"),
            ("TOOLMESH_SANDBOX_WARM", "0"),
        ],
    )
    .await;
    // 16 tasks (a session's most) × a 5,000-character command: about 80 KB of list, over the
    // 64 KiB limit.
    let padding = "x".repeat(5000);
    for i in 0..16 {
        let command = format!("sleep 60 # {i} {padding}");
        let (_, r) = call(
            &c.client,
            Path::Direct,
            workspace_call(
                "run_command",
                json!({"command": command, "background": true}),
            ),
        )
        .await;
        assert_eq!(r["ok"], true, "{r}");
    }
    for (path, r) in cut_to_fit(&c, workspace_call("list_tasks", json!({}))).await {
        let listed = r["tasks"].as_array().unwrap().len();
        assert!((1..16).contains(&listed), "{path:?}: {listed} tasks listed");
    }
}

/// Skills family: `list_skills` of many skills with long descriptions is cut to fit.
#[tokio::test]
async fn a_skill_list_too_big_for_one_message_is_cut_to_fit() {
    let skills = tempfile::tempdir().unwrap();
    let description = "d".repeat(400);
    for i in 0..300 {
        let dir = skills.path().join(format!("skill-{i:03}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: skill-{i:03}\ndescription: {description}\n---\nDo thing {i}.\n"),
        )
        .unwrap();
    }
    let mut c = Cluster::servers_with_max_payload(MAX_PAYLOAD).await;
    let dir = skills.path().display().to_string();
    c.start_node(
        "gateway,approval,skills",
        &[
            ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
            GATEWAY_PATH,
            ("TOOLMESH_SKILLS_DIR", dir.as_str()),
        ],
    )
    .await;
    for (path, r) in cut_to_fit(&c, json!({"tool": "list_skills"})).await {
        let listed = r["skills"].as_array().unwrap().len();
        assert!(
            (1..300).contains(&listed),
            "{path:?}: {listed} skills listed"
        );
    }
}

/// Status: a cluster of a thousand nodes is listed in part, `truncated: true`.
#[tokio::test]
async fn the_status_of_a_cluster_too_big_for_one_message_is_cut_to_fit() {
    let c = cluster("gateway").await;
    for i in 0..1000 {
        let beat = json!({
            "status": {
                "node_id": format!("far-away-node-{i:04}"), "roles": ["sandbox"],
                "version": "0.1.0", "uptime_s": 1, "in_flight": 0,
                "sandbox": {"backend": "sandbox/docker", "capacity": 32, "in_use": 0}
            },
            "leaving": false
        });
        c.client
            .publish(internal::HEARTBEAT, Bytes::from(beat.to_string()))
            .await
            .unwrap();
    }
    c.client.flush().await.unwrap();
    // The node records them as they arrive; ask until the view is past one message.
    let started = Instant::now();
    let reply = ok(loop {
        let msg = c
            .client
            .request("toolmesh.v1.status", Bytes::from_static(b"{}"))
            .await
            .expect("status answers");
        let reply: Value = serde_json::from_slice(&msg.payload).unwrap();
        assert!(
            msg.payload.len() <= MAX_PAYLOAD,
            "{} bytes",
            msg.payload.len()
        );
        if reply["truncated"] == true || started.elapsed() > Duration::from_secs(4) {
            break reply;
        }
    });
    assert_eq!(
        reply["truncated"], true,
        "a thousand nodes do not fit in 64 KiB"
    );
    let listed = reply["nodes"].as_array().unwrap().len();
    assert!((1..1001).contains(&listed), "{listed} nodes listed");
}

/// Web family: `web_search` results that do not fit are cut, `truncated: true`.
#[tokio::test]
async fn search_results_too_big_for_one_message_are_cut_to_fit() {
    let mut c = Cluster::servers_with_max_payload(MAX_PAYLOAD).await;
    c.start_node(
        "gateway,approval,web",
        &[
            ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
            GATEWAY_PATH,
            ("TOOLMESH_WEB_SEARCH_PROVIDER", "fake"),
        ],
    )
    .await;
    // The fake provider repeats the query three times per result: 50 × 3 × 1,000 characters.
    let query = "q".repeat(1000);
    let body = json!({"tool": "web_search", "arguments": {"query": query, "max_results": 50}});
    for (path, r) in cut_to_fit(&c, body).await {
        let listed = r["results"].as_array().unwrap().len();
        assert!(
            (1..50).contains(&listed),
            "{path:?}: {listed} results listed"
        );
    }
}
