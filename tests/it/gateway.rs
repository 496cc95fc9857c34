//! The call path: bad input, tools and schemas, routing, events, built-in tools.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use toolmesh_testkit::request_raw;

use crate::support::{assert_error, assert_holds, collect, ok, strings, Cluster};

#[tokio::test]
async fn garbage_bodies_get_invalid_request_and_the_node_survives() {
    let c = Cluster::start().await;
    let huge = format!(
        "{{\"tool\":\"component_status\",\"pad\":\"{}\"}}",
        "x".repeat(900_000)
    );
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"not json".to_vec(),
        b"[1,2]".to_vec(),
        b"\"str\"".to_vec(),
        b"null".to_vec(),
        b"{\"tool\":".to_vec(),
        vec![0xff, 0xfe, 0x00],
        b"{}".to_vec(),
        b"{\"tool\":42}".to_vec(),
        b"{\"tool\":\"component_status\",\"arguments\":[]}".to_vec(),
        b"{\"tool\":\"component_status\",\"wait_for_approval_s\":99999}".to_vec(),
        format!("[{}]", "[".repeat(10_000)).into_bytes(),
    ];
    for body in bodies {
        let shown = String::from_utf8_lossy(&body[..body.len().min(40)]).into_owned();
        let reply = request_raw(&c.client, "toolmesh.v1.call.acme", body).await;
        assert_eq!(reply["ok"], false, "{shown}");
        assert_eq!(reply["error"], "invalid_request", "{shown}: {reply}");
        assert!(reply["error_message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert!(reply["invocation_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("inv_")));
    }
    // A huge but valid body is parsed and answered (the unknown top-level member is ignored).
    ok(request_raw(&c.client, "toolmesh.v1.call.acme", huge.into_bytes()).await);
    let status = request_raw(&c.client, "toolmesh.v1.status", b"{}".to_vec()).await;
    assert_eq!(status["ok"], true);
}

#[tokio::test]
async fn malformed_accounts_in_the_subject_are_refused() {
    let c = Cluster::start().await;
    for subject in ["toolmesh.v1.call.a.b", "toolmesh.v1.call.bad$acct"] {
        let reply = request_raw(
            &c.client,
            subject,
            br#"{"tool":"component_status"}"#.to_vec(),
        )
        .await;
        assert_eq!(reply["error"], "invalid_request", "{subject}: {reply}");
    }
    // An `account` member in the body never changes the account.
    let reply = c
        .call(
            "acme",
            json!({"tool": "component_status", "account": "other", "session_id": "s1"}),
        )
        .await;
    let root = reply["workspace"]["root"].as_str().unwrap();
    assert!(
        root.contains("/accounts/acme/sessions/s1/workspace"),
        "{root}"
    );
}

/// A call of `tool` (no arguments) as invocation `id`.
async fn call_as(c: &Cluster, tool: &str, id: &str) -> Value {
    c.call("acme", json!({"tool": tool, "invocation_id": id}))
        .await
}

#[tokio::test]
async fn invocation_ids_are_echoed_or_generated() {
    let c = Cluster::start().await;
    let reply = call_as(&c, "component_status", "inv-42").await;
    assert_eq!(reply["invocation_id"], "inv-42");
    let reply = call_as(&c, "nope", "inv-43").await;
    assert_eq!(reply["invocation_id"], "inv-43");
    assert_eq!(reply["error"], "unknown_tool");
    let reply = c.call("acme", json!({"tool": "component_status"})).await;
    assert!(reply["invocation_id"].as_str().unwrap().starts_with("inv_"));
    let reply = call_as(&c, "component_status", "a.b").await;
    assert_eq!(reply["error"], "invalid_request");
}

#[tokio::test]
async fn arguments_are_checked_against_the_schema_with_pointers() {
    let c = Cluster::start().await;
    let cases = [
        ("read_workspace_file", json!({}), "/path"),
        ("read_workspace_file", json!({"path": 3}), "/path"),
        (
            "read_workspace_file",
            json!({"path": "a", "bogus": true}),
            "/bogus",
        ),
        (
            "run_command",
            json!({"command": "ls", "timeout": 0}),
            "/timeout",
        ),
        (
            "task_output",
            json!({"task_id": "t", "timeout": 301}),
            "/timeout",
        ),
        ("component_status", json!({"x": 1}), "/x"),
    ];
    for (tool, args, pointer) in cases {
        let reply = c
            .call(
                "acme",
                json!({"tool": tool, "arguments": args, "session_id": "s1"}),
            )
            .await;
        assert_eq!(
            reply["error"], "invalid_arguments",
            "{tool} {args}: {reply}"
        );
        let paths = strings(&reply, "details", "path");
        assert!(paths.iter().any(|p| p == pointer), "{tool}: {paths:?}");
    }
}

#[tokio::test]
async fn session_tools_need_a_session_and_unserved_roles_are_unavailable_fast() {
    let c = Cluster::start().await;
    let reply = c
        .tool_call("acme", "read_workspace_file", json!({"path": "a"}))
        .await;
    assert_error(&reply, "invalid_request", "session_id");

    // No workspace actor runs in this cluster: the answer comes at once, not after a timeout.
    let started = Instant::now();
    let reply = c
        .call(
            "acme",
            json!({"tool": "read_workspace_file", "arguments": {"path": "a"}, "session_id": "s1"}),
        )
        .await;
    assert_error(&reply, "unavailable", "workspace");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn events_are_started_then_finished_with_gap_free_seq() {
    let c = Cluster::start().await;
    let mut events = c.watch("toolmesh.v1.events.acme.inv-ev1").await;
    let reply = c
        .call(
            "acme",
            json!({"tool": "component_status", "invocation_id": "inv-ev1", "session_id": "s1",
                   "user_id": "u-1", "agent_id": "a-1"}),
        )
        .await;
    assert_eq!(reply["ok"], true);
    let got = collect(&mut events, 2, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 2, "{got:?}");
    let kinds: Vec<&str> = got.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["started", "finished"]);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e["seq"], i as u64);
        assert_eq!(e["invocation_id"], "inv-ev1");
        assert_eq!(e["session_id"], "s1");
        assert_eq!(e["user_id"], "u-1");
        assert_eq!(e["agent_id"], "a-1");
        assert_eq!(e["tool"], "component_status");
        assert!(e["at"].as_str().unwrap().ends_with('Z'));
    }
    assert_eq!(got[1]["ok"], true);
    assert!(got[1]["duration_ms"].is_u64());

    // A call refused before validation publishes nothing; an invalid one neither.
    let mut none = c.watch("toolmesh.v1.events.acme.inv-ev2").await;
    let reply = c
        .call(
            "acme",
            json!({"tool": "component_status", "invocation_id": "inv-ev2", "arguments": {"x": 1}}),
        )
        .await;
    assert_eq!(reply["error"], "invalid_arguments");
    assert!(collect(&mut none, 1, Duration::from_millis(300))
        .await
        .is_empty());
}

#[tokio::test]
async fn component_status_reports_the_cluster() {
    let c = Cluster::start().await;
    let reply = ok(c
        .call(
            "acme",
            json!({"tool": "component_status", "session_id": "s9"}),
        )
        .await);
    assert_eq!(reply["summary"]["isolated_execution"], "disabled");
    assert_eq!(reply["summary"]["knowledge_base_bound"], false);
    assert_eq!(reply["sandbox"]["enabled"], false);
    assert_eq!(reply["approval"]["enabled"], true);
    assert_eq!(reply["approval"]["mode"], "strict");
    assert_eq!(reply["cluster"]["nodes"], 1);
    assert_eq!(reply["cluster"]["roles"]["gateway"], 1);
    let tools: Vec<&str> = reply["sandbox"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(tools.contains(&"run_command"));
}

#[tokio::test]
async fn tool_search_scores_and_defers() {
    let c = Cluster::start().await;
    let reply = ok(c
        .tool_call(
            "acme",
            "tool_search",
            json!({"query": "read file", "include_disabled": true}),
        )
        .await);
    assert_eq!(reply["results"][0]["name"], "read_workspace_file");
    assert!(reply["results"][0]["score"].as_f64().unwrap() > 0.0);
    for key in ["group", "risk_level", "boundary", "execution"] {
        assert!(reply["results"][0].get(key).is_some(), "{key}");
    }
    assert_eq!(reply["deferred_tool_names"][0], "read_workspace_file");
    // Without include_disabled, tools no node serves are left out.
    let reply = search(&c, "read file").await;
    assert_eq!(reply["results"], json!([]));
    let reply = search(&c, "").await;
    assert_eq!(reply["error"], "invalid_arguments");
}

/// `tool_search` for `query`.
async fn search(c: &Cluster, query: &str) -> Value {
    let args = json!({"query": query});
    c.tool_call("acme", "tool_search", args).await
}

fn names(reply: &Value) -> Vec<String> {
    strings(reply, "tools", "name")
}

/// `tool_dispatcher` with `arguments`, in no session of acme.
async fn dispatch(c: &Cluster, arguments: Value) -> Value {
    c.tool_call("acme", "tool_dispatcher", arguments).await
}

/// `tool_dispatcher`'s `call` of `tool` with `arguments`, in session `s1` of acme.
async fn dispatch_call(c: &Cluster, tool: &str, arguments: Value) -> Value {
    let dispatched = json!({"action": "call", "tool_name": tool, "arguments": arguments});
    c.session_call("acme", "s1", "tool_dispatcher", dispatched)
        .await
}

#[tokio::test]
async fn dispatcher_lists_describes_and_calls() {
    let c = Cluster::start().await;
    for alias in ["tool_dispatcher", "agentengine_tool_dispatcher"] {
        let reply = c
            .call(
                "acme",
                json!({"tool": alias, "arguments": {"action": "list"}}),
            )
            .await;
        let all = names(&reply);
        assert_eq!(all.len(), 25, "{all:?}");
        assert!(!all.iter().any(|n| n.contains("dispatcher")));
    }
    let focused = names(&dispatch(&c, json!({"action": "list", "profile": "core"})).await);
    assert!(focused.contains(&"read_workspace_file".to_owned()));
    assert!(!focused.contains(&"run_command".to_owned()));
    let coding = names(&dispatch(&c, json!({"action": "list", "profile": "coding"})).await);
    assert!(
        coding.contains(&"run_command".to_owned()) && coding.contains(&"tool_search".to_owned())
    );
    assert!(!coding.contains(&"web_fetch".to_owned()));

    let reply = dispatch(
        &c,
        json!({"action": "describe", "tool_name": "run_command"}),
    )
    .await;
    assert_eq!(reply["tool"]["risk_level"], "high");
    assert_eq!(
        reply["tool"]["side_effects"],
        json!(["isolated_runtime_execution"])
    );
    assert_eq!(
        reply["tool"]["input_schema"]["required"],
        json!(["command"])
    );
    assert!(reply["tool"]["boundary"]
        .as_str()
        .unwrap()
        .contains("sandbox"));

    let reply = ok(c
        .session_call(
            "acme",
            "s1",
            "tool_dispatcher",
            json!({"action": "call", "tool_name": "component_status"}),
        )
        .await);
    assert_eq!(reply["dispatched_tool_name"], "component_status");
    assert!(reply["summary"].is_object());

    for (args, code) in [
        (
            json!({"action": "call", "tool_name": "tool_dispatcher"}),
            "unknown_tool",
        ),
        (
            json!({"action": "describe", "tool_name": "agentengine_tool_dispatcher"}),
            "unknown_tool",
        ),
        (
            json!({"action": "call", "tool_name": "nope"}),
            "unknown_tool",
        ),
        (json!({"action": "frobnicate"}), "invalid_arguments"),
        (json!({"action": "call"}), "invalid_arguments"),
        (
            json!({"action": "call", "tool_name": "component_status", "arguments": {"x": 1}}),
            "invalid_arguments",
        ),
    ] {
        let reply = dispatch(&c, args.clone()).await;
        assert_eq!(reply["error"], code, "{args}: {reply}");
    }
    // Inner argument errors point into the dispatcher's arguments.
    let reply = dispatch_call(&c, "read_workspace_file", json!({})).await;
    assert_eq!(reply["details"][0]["path"], "/arguments/path", "{reply}");
    assert_eq!(reply["dispatched_tool_name"], "read_workspace_file");
}

#[tokio::test]
async fn dispatcher_call_goes_through_the_approval_policy() {
    let c = Cluster::start().await;
    let reply = dispatch_call(&c, "run_command", json!({"command": "ls"})).await;
    assert_eq!(reply["error"], "approval_required", "{reply}");
    assert_eq!(reply["dispatched_tool_name"], "run_command");
    assert_eq!(reply["approval_request"]["tool_name"], "run_command");
    assert_eq!(reply["approval_request"]["risk_level"], "high");
}

/// Issue 16: a schema message repeated the offending value, so a 600 KB `env` value or
/// `sort_by` made a reply over `max_payload` and the caller waited for nothing. The reply
/// comes, `invalid_arguments`, with short messages that still name the path.
#[tokio::test]
async fn a_huge_invalid_value_gets_a_short_invalid_arguments_reply() {
    let c = Cluster::start().await;
    let huge = "x".repeat(600 * 1024);
    let cases = [
        (
            json!({"tool": "list_workspace_files", "session_id": "s1", "arguments": {"sort_by": huge}}),
            "/sort_by",
        ),
        (
            json!({"tool": "run_command", "session_id": "s1", "arguments": {"command": "ls", "env": {"A": {"v": huge}}}}),
            "/env/A",
        ),
        (
            json!({"tool": "tool_dispatcher", "session_id": "s1", "arguments": {"action": "call", "tool_name": "list_workspace_files", "arguments": {"sort_by": huge}}}),
            "/arguments/sort_by",
        ),
    ];
    for (body, path) in cases {
        let body = serde_json::to_vec(&body).unwrap();
        let started = Instant::now();
        let reply = request_raw(&c.client, "toolmesh.v1.call.acme", body).await;
        assert!(started.elapsed() < Duration::from_secs(5), "{path}");
        assert_eq!(reply["error"], "invalid_arguments", "{path}: {reply}");
        let size = serde_json::to_vec(&reply).unwrap().len();
        assert!(size < 4096, "{path}: a reply of {size} bytes");
        assert_eq!(reply["details"][0]["path"], path, "{reply}");
        let message = reply["details"][0]["message"].as_str().unwrap();
        assert!(message.contains("chars hidden"), "{message}");
        assert_holds(&reply, "error_message", path);
    }
}
