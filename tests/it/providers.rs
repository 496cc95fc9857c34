//! Tool providers (PROTOCOL.md "Tool providers"): the Python provider of
//! `tests/python/provider_fixture.py` (nats-py's `nats.micro`) behind real nodes, found by
//! `$SRV.INFO`, validated, gated, routed, normalised, cancelled and dropped when it goes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use toolmesh_testkit::{request_json, request_json_within, venv_bin, wait_until};

use crate::support::{assert_error, assert_unavailable_within, ok, policy_file, strings, Cluster};

/// PROTOCOL.md: a provider is found within 5 s of its start.
const FOUND_WITHIN: Duration = Duration::from_secs(5);
/// PROTOCOL.md: its tools go within 15 s of its last instance going away.
const GONE_WITHIN: Duration = Duration::from_secs(15);

/// One `tests/python/provider_fixture.py` process, killed on drop.
pub(crate) struct Provider {
    child: tokio::process::Child,
    /// The micro service's instance id.
    id: String,
    /// What it received, one JSON line per request or cancel.
    record: PathBuf,
    _dir: tempfile::TempDir,
}

impl Provider {
    /// Starts the provider and waits until its endpoints are registered (it prints `ready`).
    pub(crate) async fn start(cluster: &Cluster, name: &str, args: &[&str]) -> Provider {
        Self::start_on(&cluster.nats.url(), name, args).await
    }

    /// A provider without the ticket tools that serves an echo tool of each of `tools`.
    async fn echoing(cluster: &Cluster, name: &str, tools: &[&str]) -> Provider {
        let mut args = vec!["--no-ticket"];
        for tool in tools {
            args.extend(["--echo", tool]);
        }
        Self::start(cluster, name, &args).await
    }

    /// [`Provider::start`] on the NATS server at `url` (which may name a user).
    pub(crate) async fn start_on(url: &str, name: &str, args: &[&str]) -> Provider {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("record.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/provider_fixture.py");
        let mut child = tokio::process::Command::new(venv_bin("python"))
            .arg(script)
            .args(["--nats", url, "--name", name])
            .args(["--record", &record.display().to_string()])
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start tests/python/provider_fixture.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the provider says ready within 30 s")
            .unwrap()
            .expect("the provider printed a line");
        let id = line
            .strip_prefix(&format!("ready {name} "))
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Provider {
            child,
            id,
            record,
            _dir: dir,
        }
    }

    /// Every entry of the record file.
    fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn requests(&self) -> Vec<Value> {
        self.received()
            .into_iter()
            .filter(|e| e["kind"] == "request")
            .map(|e| e["body"].clone())
            .collect()
    }

    pub(crate) async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }
}

async fn describe(cluster: &Cluster, tool: &str) -> Value {
    cluster
        .tool_call(
            "acme",
            "tool_dispatcher",
            json!({"action": "describe", "tool_name": tool}),
        )
        .await
}

/// Waits until `tool` is known to the gateway (or not), at most `within`.
async fn wait_known(cluster: &Cluster, tool: &str, known: bool, within: Duration) -> bool {
    wait_until(within, || async {
        (describe(cluster, tool).await["ok"] == true) == known
    })
    .await
}

/// A gateway (approvals off) and the `tests` provider of the test tools, `tool` known.
async fn test_tools(tool: &str) -> (Cluster, Provider) {
    let cluster = Cluster::ungated("gateway,approval").await;
    let provider = Provider::start(&cluster, "tests", &["--test-tools", "--no-ticket"]).await;
    assert!(wait_known(&cluster, tool, true, FOUND_WITHIN).await);
    (cluster, provider)
}

/// The call `body` in a task of its own, answered within 30 s.
fn slow_call(cluster: &Cluster, body: Value) -> tokio::task::JoinHandle<Value> {
    let client = cluster.client.clone();
    tokio::spawn(async move {
        request_json_within(
            &client,
            "toolmesh.v1.call.acme",
            body,
            Duration::from_secs(30),
        )
        .await
    })
}

/// Waits (at most 10 s) until `provider` has received a call.
async fn until_requested(provider: &Provider) {
    assert!(
        wait_until(Duration::from_secs(10), || async {
            !provider.requests().is_empty()
        })
        .await
    );
}

async fn provider_status(cluster: &Cluster, name: &str) -> Value {
    let status = cluster
        .call("acme", json!({"tool": "component_status"}))
        .await;
    status["providers"]
        .as_array()
        .unwrap_or_else(|| panic!("component_status has providers: {status}"))
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_provider_is_found_within_5_s_and_listed_like_a_built_in_tool() {
    let cluster = Cluster::ungated("gateway,approval").await;
    // No announce: found by polling $SRV.INFO alone.
    let provider = Provider::start(&cluster, "tickets", &["--no-announce"]).await;
    let started = Instant::now();
    assert!(
        wait_known(&cluster, "ticket_create", true, FOUND_WITHIN).await,
        "ticket_create was not found within {FOUND_WITHIN:?}"
    );
    assert!(started.elapsed() <= FOUND_WITHIN + Duration::from_secs(1));

    let described = describe(&cluster, "ticket_create").await;
    let tool = &described["tool"];
    assert_eq!(tool["group"], "external", "{described}");
    assert_eq!(tool["risk_level"], "medium");
    assert_eq!(tool["execution"], "provider:tickets");
    assert_eq!(tool["side_effects"], json!(["network_egress"]));
    assert_eq!(tool["input_schema"]["required"], json!(["title"]));

    let search = cluster
        .tool_call(
            "acme",
            "tool_search",
            json!({"query": "ticket", "profile": "default"}),
        )
        .await;
    assert_eq!(search["results"][0]["name"], "ticket_create", "{search}");
    assert_eq!(search["results"][0]["execution"], "provider:tickets");
    assert_eq!(search["results"][0]["enabled"], true);
    // A plain search finds them too (seed 000: built-in tools and registered ones), with or
    // without the disabled ones (finding 11 of issue 28).
    for arguments in [
        json!({"query": "ticket"}),
        json!({"query": "ticket", "include_disabled": true}),
    ] {
        let search = cluster.tool_call("acme", "tool_search", arguments).await;
        assert_eq!(search["results"][0]["name"], "ticket_create", "{search}");
    }

    let list = cluster
        .tool_call("acme", "tool_dispatcher", json!({"action": "list"}))
        .await;
    let names = strings(&list, "tools", "name");
    for name in ["ticket_create", "read_workspace_file"] {
        assert!(names.iter().any(|n| n == name), "{name}: {names:?}");
    }
    let external = cluster
        .tool_call(
            "acme",
            "tool_dispatcher",
            json!({"action": "list", "include": ["external"]}),
        )
        .await;
    assert_eq!(external["tools"].as_array().unwrap().len(), 1, "{external}");

    let status = provider_status(&cluster, "tickets").await;
    assert_eq!(status["instances"], 1, "{status}");
    assert_eq!(status["instance_ids"], json!([provider.id]));
    assert_eq!(status["tools"], json!(["ticket_create"]));
    assert_eq!(status["version"], "1.0.0");
    assert!(status["health"]["last_seen"].is_string() && status["health"]["ping_ms"].is_number());

    // A call through the dispatcher reaches it with the documented envelope.
    let reply = ok(cluster
        .call(
            "acme",
            json!({"tool": "tool_dispatcher", "session_id": "s1", "user_id": "u1", "agent_id": "a1",
                   "invocation_id": "inv-disp",
                   "arguments": {"action": "call", "tool_name": "ticket_create", "arguments": {"title": "hi"}}}),
        )
        .await);
    assert_eq!(reply["dispatched_tool_name"], "ticket_create");
    assert_eq!(reply["ticket"]["opened_by"], "u1");
    let requests = provider.requests();
    assert_eq!(
        requests,
        [
            json!({"tool": "ticket_create", "arguments": {"title": "hi"}, "invocation_id": "inv-disp",
                "account": "acme", "session_id": "s1", "user_id": "u1", "agent_id": "a1"})
        ]
    );
}

#[tokio::test]
async fn arguments_are_checked_before_the_provider_sees_them_and_strict_mode_gates_medium() {
    let cluster = Cluster::with_env(&[("TOOLMESH_TOOL_APPROVAL_MODE", "strict")]).await;
    let provider = Provider::start(&cluster, "tickets", &[]).await;
    assert!(wait_known(&cluster, "ticket_create", true, FOUND_WITHIN).await);

    for bad in [
        json!({}),
        json!({"title": ""}),
        json!({"title": "x", "owner": "me"}),
        json!({"title": 5}),
    ] {
        let reply = cluster
            .tool_call("acme", "ticket_create", bad.clone())
            .await;
        assert_eq!(reply["error"], "invalid_arguments", "{bad}: {reply}");
    }
    assert!(provider.requests().is_empty(), "{:?}", provider.requests());

    let call = json!({"tool": "ticket_create", "session_id": "s1", "arguments": {"title": "Printer on fire"}});
    let gated = cluster.call("acme", call.clone()).await;
    assert_eq!(gated["error"], "approval_required", "{gated}");
    assert_eq!(gated["approval_request"]["risk_level"], "medium");
    assert_eq!(
        gated["approval_request"]["side_effects"],
        json!(["network_egress"])
    );
    assert!(provider.requests().is_empty());
    let id = gated["approval_request"]["id"].as_str().unwrap();
    assert_eq!(cluster.decide("acme", id, true).await["ok"], true);
    let mut again = call.clone();
    again["approval"] = json!({"id": id});
    let reply = ok(cluster.call("acme", again).await);
    assert_eq!(reply["ticket"]["title"], "Printer on fire");
    assert_eq!(provider.requests().len(), 1);
}

#[tokio::test]
async fn provider_answers_are_normalised_and_events_are_published() {
    let (cluster, _provider) = test_tools("fail_foreign").await;

    let mut events = cluster.watch("toolmesh.v1.events.acme.inv-foreign").await;
    let foreign = cluster
        .call(
            "acme",
            json!({"tool": "fail_foreign", "invocation_id": "inv-foreign"}),
        )
        .await;
    assert_eq!(foreign["error"], "provider_error", "{foreign}");
    assert_eq!(foreign["error_message"], "the ticket database is down");
    assert_eq!(foreign["provider_code"], "db_down");
    let kinds: Vec<Value> = crate::support::collect(&mut events, 2, Duration::from_secs(5))
        .await
        .into_iter()
        .map(|e| json!([e["kind"], e["seq"], e["error"]]))
        .collect();
    assert_eq!(
        kinds,
        [
            json!(["started", 0, null]),
            json!(["finished", 1, "provider_error"])
        ]
    );

    let header = cluster.call("acme", json!({"tool": "fail_header"})).await;
    assert_error(&header, "provider_error", "ticket quota exhausted");
    assert_eq!(header["provider_code"], "503");

    let plain = ok(cluster.call("acme", json!({"tool": "plain"})).await);
    assert_eq!(plain["result"], "just a string");

    let garbage = cluster.call("acme", json!({"tool": "not_json"})).await;
    assert_eq!(garbage["error"], "provider_error", "{garbage}");
}

#[tokio::test]
async fn a_provider_killed_mid_call_is_unavailable_and_its_tools_go() {
    let (cluster, mut provider) = test_tools("slow").await;

    // The call's deadline is 120 s (no `timeout` argument); the answer must come long before.
    let pending = slow_call(
        &cluster,
        json!({"tool": "slow", "arguments": {"seconds": 100}}),
    );
    until_requested(&provider).await;
    provider.kill().await;
    let killed = Instant::now();
    let reply = pending.await.unwrap();
    // The health watch pings once a second: well before the 8 s expiry.
    assert_unavailable_within(&reply, killed, Duration::from_secs(4));

    assert!(
        wait_known(&cluster, "slow", false, GONE_WITHIN).await,
        "slow was still known {GONE_WITHIN:?} after its provider died"
    );
    assert_eq!(provider_status(&cluster, "tests").await, Value::Null);
    let gone = cluster.call("acme", json!({"tool": "slow"})).await;
    assert_eq!(gone["error"], "unknown_tool", "{gone}");
}

#[tokio::test]
async fn calls_in_flight_to_a_provider_share_one_health_watch() {
    let (cluster, provider) = test_tools("slow").await;
    const CALLS: usize = 12;
    let pending: Vec<_> = (0..CALLS)
        .map(|_| {
            cluster.call_in_background(
                "acme",
                json!({"tool": "slow", "arguments": {"seconds": 100}}),
            )
        })
        .collect();
    // The provider runs one call at a time (nats-py awaits each handler); the others wait
    // in its queue, and all are in flight at the gateway.
    until_requested(&provider).await;
    // Every call has reached the gateway (the node's status counts what it holds).
    let status = format!("toolmesh.v1.status.{}", cluster.nodes[0].node_id);
    assert!(
        wait_until(Duration::from_secs(10), || async {
            request_json(&cluster.client, status.as_str(), json!({})).await["in_flight"]
                .as_u64()
                .unwrap_or(0)
                >= CALLS as u64
        })
        .await,
        "the calls are not all in flight"
    );
    // The gateway pings the provider's instance once a second for all of them, not once
    // a second for each.
    let mut pings = cluster
        .watch(format!("$SRV.PING.tests.{}", provider.id))
        .await;
    let window = Duration::from_millis(3500);
    let end = tokio::time::Instant::now() + window;
    let mut count = 0;
    while let Ok(Some(_)) = tokio::time::timeout_at(end, pings.next()).await {
        count += 1;
    }
    assert!((2..=5).contains(&count), "{count} pings in {window:?}");
    for call in pending {
        call.abort();
    }
}

#[tokio::test]
async fn two_instances_of_a_provider_share_its_calls() {
    let cluster = Cluster::ungated("gateway,approval").await;
    let a = Provider::start(&cluster, "tests", &["--test-tools", "--no-ticket"]).await;
    let b = Provider::start(&cluster, "tests", &["--test-tools", "--no-ticket"]).await;
    assert!(
        wait_until(FOUND_WITHIN, || async {
            provider_status(&cluster, "tests").await["instances"] == 2
        })
        .await
    );
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let reply = cluster.call("acme", json!({"tool": "whoami"})).await;
        seen.insert(reply["instance"].as_str().unwrap().to_owned());
    }
    let both: std::collections::BTreeSet<String> = [a.id.clone(), b.id.clone()].into();
    assert_eq!(seen, both);
    assert_eq!(a.requests().len() + b.requests().len(), 40);
}

#[tokio::test]
async fn name_clashes_are_refused_and_shown_in_component_status() {
    let cluster = Cluster::ungated("gateway,approval").await;
    // b-first comes first; a-second sorts first but comes later: b-first keeps the name.
    let first = Provider::echoing(&cluster, "b-first", &["shared_echo"]).await;
    assert!(wait_known(&cluster, "shared_echo", true, FOUND_WITHIN).await);
    let _second = Provider::echoing(
        &cluster,
        "a-second",
        &["shared_echo", "run_command", "own_echo"],
    )
    .await;
    assert!(wait_known(&cluster, "own_echo", true, FOUND_WITHIN).await);

    let second = provider_status(&cluster, "a-second").await;
    assert_eq!(second["tools"], json!(["own_echo"]), "{second}");
    let refused: Vec<(String, String)> = second["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["tool"].as_str().unwrap().to_owned(),
                r["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused
            .iter()
            .any(|(t, r)| t == "shared_echo" && r.contains("b-first")),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|(t, r)| t == "run_command" && r.contains("built-in")),
        "{refused:?}"
    );
    assert_eq!(
        provider_status(&cluster, "b-first").await["tools"],
        json!(["shared_echo"])
    );

    let reply = cluster
        .tool_call("acme", "shared_echo", json!({"n": 1}))
        .await;
    assert_eq!(reply["echo"], json!({"n": 1}), "{reply}");
    assert_eq!(first.requests().len(), 1, "the holder got the call");
    let builtin = describe(&cluster, "run_command").await;
    assert_eq!(builtin["tool"]["execution"], "sandbox_worker", "{builtin}");
}

#[tokio::test]
async fn the_policy_file_overrides_a_provider_s_risk_and_floors_it() {
    let (_dir, path) = policy_file(
        "[tools.ticket_create]\nrisk_level = \"low\"\n\n[providers.floored]\nmin_risk_level = \"high\"\n",
    );
    // A policy naming a provider tool that is not there yet does not stop the node.
    let cluster = Cluster::with_env(&[
        ("TOOLMESH_TOOL_APPROVAL_MODE", "standard"),
        ("TOOLMESH_POLICY_FILE", &path),
    ])
    .await;
    let tickets = Provider::start(&cluster, "tickets", &[]).await;
    let _floored = Provider::echoing(&cluster, "floored", &["floored_echo"]).await;
    assert!(wait_known(&cluster, "ticket_create", true, FOUND_WITHIN).await);
    assert!(wait_known(&cluster, "floored_echo", true, FOUND_WITHIN).await);

    // medium claimed, low set by the operator: runs in standard and would in strict too.
    assert_eq!(
        describe(&cluster, "ticket_create").await["tool"]["risk_level"],
        "low"
    );
    ok(cluster
        .tool_call("acme", "ticket_create", json!({"title": "t"}))
        .await);
    assert_eq!(tickets.requests().len(), 1);

    // low claimed, floored at high: gated in standard mode.
    assert_eq!(
        describe(&cluster, "floored_echo").await["tool"]["risk_level"],
        "high"
    );
    let gated = cluster.call("acme", json!({"tool": "floored_echo"})).await;
    assert_eq!(gated["error"], "approval_required", "{gated}");
    assert_eq!(gated["approval_request"]["risk_level"], "high");
}

#[tokio::test]
async fn a_cancel_reaches_the_provider() {
    let (cluster, provider) = test_tools("slow").await;
    let pending = slow_call(
        &cluster,
        json!({"tool": "slow", "invocation_id": "inv-slow", "arguments": {"seconds": 100}}),
    );
    until_requested(&provider).await;
    let cancel = cluster
        .cancel("acme", json!({"invocation_id": "inv-slow"}))
        .await;
    assert_eq!(cancel["cancelled"], true, "{cancel}");
    let reply = pending.await.unwrap();
    assert_eq!(reply["error"], "cancelled", "{reply}");
    assert!(
        wait_until(Duration::from_secs(10), || async {
            provider
                .received()
                .iter()
                .any(|e| e["kind"] == "stopped" && e["invocation_id"] == "inv-slow")
        })
        .await,
        "the provider never stopped the call: {:?}",
        provider.received()
    );
    let told = provider
        .received()
        .into_iter()
        .find(|e| e["kind"] == "cancel")
        .unwrap();
    assert_eq!(
        told["body"],
        json!({"invocation_id": "inv-slow", "account": "acme", "tool": "slow"})
    );
}

#[tokio::test]
async fn text_over_the_budget_is_cut_and_persisted_in_the_session() {
    let mut cluster = Cluster::servers().await;
    let env = [
        ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
        ("TOOLMESH_RESULT_BUDGET_CHARS", "1000"),
    ];
    cluster.start_node("gateway,approval,workspace", &env).await;
    let _provider = Provider::start(&cluster, "tests", &["--test-tools", "--no-ticket"]).await;
    assert!(wait_known(&cluster, "big", true, FOUND_WITHIN).await);

    let reply = ok(cluster
        .call(
            "acme",
            json!({"tool": "big", "session_id": "s1", "invocation_id": "inv-big", "arguments": {"lines": 500}}),
        )
        .await);
    assert_eq!(reply["text_truncated"], true, "{reply}");
    assert_eq!(reply["text_preview_chars"], 1000);
    let whole: String = (0..500).map(|i| format!("line {i}\n")).collect();
    assert_eq!(reply["text_original_chars"], whole.chars().count());
    let path = reply["persisted_outputs"]["text"]["path"].as_str().unwrap();
    assert_eq!(path, ".toolmesh/outputs/inv-big-text.txt");
    let read = cluster.read_persisted(path).await;
    assert_eq!(read["content"], whole, "{read}");

    // Without a session the text is cut and nothing is persisted.
    let cut = cluster
        .tool_call("acme", "big", json!({"lines": 500}))
        .await;
    assert_eq!(cut["text_truncated"], true);
    assert!(cut.get("persisted_outputs").is_none(), "{cut}");
}
