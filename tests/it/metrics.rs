//! `/metrics` on `TOOLMESH_METRICS_LISTEN`: the series move with what the nodes do (calls,
//! approvals, sandboxes), read back with a Prometheus text parser; a bad address stops the node;
//! the Grafana dashboard graphs only series a node exports.

use std::time::Duration;

use serde_json::{json, Value};
use toolmesh_testkit::{Listener, Node};

use crate::support::{node_refusal, ok, policy_file, Cluster, GATED_STATUS};

/// Starts a node of `roles` with `env` and its metrics on loopback: the port they are on.
async fn metered(c: &mut Cluster, roles: &str, env: &[(&str, &str)]) -> u16 {
    let mut env = env.to_vec();
    env.push(("TOOLMESH_METRICS_LISTEN", LISTEN));
    let node = c.start_node(roles, &env).await;
    port(&c.nodes[node])
}

/// Servers and one node of `roles` with approval off, `env` and its metrics on loopback: the
/// cluster and the port of its metrics.
async fn metered_cluster(roles: &str, env: &[(&str, &str)]) -> (Cluster, u16) {
    let mut c = Cluster::servers().await;
    let mut all = vec![("TOOLMESH_TOOL_APPROVAL_MODE", "off")];
    all.extend_from_slice(env);
    let port = metered(&mut c, roles, &all).await;
    (c, port)
}

/// `TOOLMESH_METRICS_LISTEN` on loopback, on a port the node picks: read it with [`port`].
pub(crate) const LISTEN: &str = "127.0.0.1:0";

/// The port `node`'s `/metrics` listens on.
pub(crate) fn port(node: &Node) -> u16 {
    node.addr(Listener::Metrics).port()
}

/// One scrape of `/metrics`, parsed.
pub(crate) async fn scrape(port: u16) -> prometheus_parse::Scrape {
    let response = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("the node serves /metrics");
    assert!(response.status().is_success(), "{}", response.status());
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = response.text().await.expect("a text body");
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses")
}

/// The value of the sample `metric` whose labels include `labels` (0 when there is none).
pub(crate) fn value(
    scrape: &prometheus_parse::Scrape,
    metric: &str,
    labels: &[(&str, &str)],
) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            other => panic!("{metric} is not a plain sample: {other:?}"),
        })
        .sum()
}

/// Polls until `done` holds for a scrape (counts land just after a reply), then answers it.
async fn scrape_until(
    port: u16,
    what: &str,
    mut done: impl FnMut(&prometheus_parse::Scrape) -> bool,
) -> prometheus_parse::Scrape {
    let mut last = None;
    // About 20 s: a warm sandbox takes a few seconds to start.
    for _ in 0..400 {
        let now = scrape(port).await;
        if done(&now) {
            return now;
        }
        last = Some(now);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{what} never held; last scrape: {:?}",
        last.map(|s| s.samples)
    );
}

#[tokio::test]
async fn calls_move_the_counters_and_the_histogram() {
    let (c, port) = metered_cluster("gateway,approval,workspace", &[]).await;
    let calls = "toolmesh_calls_total";
    let count = "toolmesh_call_duration_seconds_count";
    let before = scrape(port).await;

    // Answered by the gateway itself.
    for _ in 0..3 {
        ok(c.call("acme", json!({"tool": "component_status"})).await);
    }
    // Answered by the workspace actor straight to the caller (direct replies): the gateway
    // learns the outcome from the actor's notice.
    for i in 0..2 {
        ok(
            c.write_workspace_file("acme", "s1", &format!("f{i}.txt"), "x")
                .await,
        );
    }
    let missing = c.read_workspace_file("acme", "s1", "missing.txt").await;
    assert_eq!(missing["error"], "not_found", "{missing}");
    let bad = c
        .tool_call("acme", "component_status", json!({"x": 1}))
        .await;
    assert_eq!(bad["error"], "invalid_arguments", "{bad}");
    // A name no registry knows is not a label value.
    let unknown = c.call("acme", json!({"tool": "no_such_tool_4711"})).await;
    assert_eq!(unknown["error"], "unknown_tool", "{unknown}");

    let expected: [(&str, &str, f64); 5] = [
        ("component_status", "ok", 3.0),
        ("write_workspace_file", "ok", 2.0),
        ("read_workspace_file", "not_found", 1.0),
        ("component_status", "invalid_arguments", 1.0),
        ("(unknown)", "unknown_tool", 1.0),
    ];
    let delta = |s: &prometheus_parse::Scrape, tool: &str, outcome: &str| {
        let labels = [("tool", tool), ("outcome", outcome)];
        value(s, calls, &labels) - value(&before, calls, &labels)
    };
    let after = scrape_until(port, "every call counted", |s| {
        expected
            .iter()
            .all(|(tool, outcome, n)| delta(s, tool, outcome) >= *n)
    })
    .await;
    for (tool, outcome, n) in expected {
        assert_eq!(delta(&after, tool, outcome), n, "{tool} {outcome}");
    }
    let total = value(&after, calls, &[]) - value(&before, calls, &[]);
    assert_eq!(total, 8.0, "no call counted twice");
    assert!(
        !after
            .samples
            .iter()
            .any(|s| s.labels.get("tool") == Some("no_such_tool_4711")),
        "a caller's tool name never becomes a label"
    );
    // The histogram counts every call of a tool, ok or not; its buckets run 1 ms .. 10 min.
    let tool_count = |s: &prometheus_parse::Scrape, tool: &str| {
        value(s, count, &[("tool", tool)]) - value(&before, count, &[("tool", tool)])
    };
    assert_eq!(tool_count(&after, "component_status"), 4.0);
    assert_eq!(tool_count(&after, "write_workspace_file"), 2.0);
    let buckets = after
        .samples
        .iter()
        .find(|s| {
            s.metric == "toolmesh_call_duration_seconds"
                && s.labels.get("tool") == Some("component_status")
        })
        .map(|s| match &s.value {
            prometheus_parse::Value::Histogram(b) => b.clone(),
            other => panic!("not a histogram: {other:?}"),
        })
        .expect("a histogram for component_status");
    assert_eq!(buckets.first().map(|b| b.less_than), Some(0.001));
    let inf = buckets.last().expect("an +Inf bucket");
    assert!(
        inf.less_than.is_infinite() && inf.count >= 4.0,
        "{buckets:?}"
    );
    assert!(buckets.iter().any(|b| b.less_than == 600.0));
    // Every role of the node reports its in-flight work; nothing is held now.
    for role in ["gateway", "approval", "workspace"] {
        let held = after
            .samples
            .iter()
            .find(|s| s.metric == "toolmesh_in_flight" && s.labels.get("role") == Some(role))
            .unwrap_or_else(|| panic!("no toolmesh_in_flight for {role}"));
        assert!(
            matches!(held.value, prometheus_parse::Value::Gauge(v) if v == 0.0),
            "{held:?}"
        );
    }
}

#[tokio::test]
async fn approvals_pending_follow_the_store_on_every_approval_node() {
    let (policy_dir, policy) = policy_file(GATED_STATUS);
    let _keep = policy_dir;
    let mut c = Cluster::servers().await;
    let port_a = metered(
        &mut c,
        "gateway,approval",
        &[("TOOLMESH_POLICY_FILE", policy.as_str())],
    )
    .await;
    // A second approval node on the same Redis reports the same counts.
    let port_b = metered(&mut c, "approval", &[]).await;
    let pending = "toolmesh_approvals_pending";
    let decided = "toolmesh_approvals_decided_total";
    let before = scrape(port_a).await;
    assert_eq!(value(&before, pending, &[("account", "acme")]), 0.0);

    let ask = |session: &str| json!({"tool": "component_status", "session_id": session});
    let mut ids = Vec::new();
    for session in ["s1", "s2"] {
        let r = c.call("acme", ask(session)).await;
        assert_eq!(r["error"], "approval_required", "{r}");
        ids.push(r["approval_request"]["id"].as_str().unwrap().to_owned());
    }
    let r = c.call("globex", ask("s1")).await;
    assert_eq!(r["error"], "approval_required", "{r}");
    for port in [port_a, port_b] {
        let s = scrape(port).await;
        assert_eq!(value(&s, pending, &[("account", "acme")]), 2.0, "{port}");
        assert_eq!(value(&s, pending, &[("account", "globex")]), 1.0, "{port}");
    }

    assert_eq!(c.decide("acme", &ids[0], true).await["ok"], true);
    assert_eq!(c.decide("acme", &ids[1], false).await["ok"], true);
    for port in [port_a, port_b] {
        let s = scrape(port).await;
        assert_eq!(value(&s, pending, &[("account", "acme")]), 0.0, "{port}");
        assert_eq!(value(&s, pending, &[("account", "globex")]), 1.0, "{port}");
    }
    // The decisions are counted once, by the node that made them (either one: a queue group).
    let (a, b) = (scrape(port_a).await, scrape(port_b).await);
    for outcome in ["approved", "rejected"] {
        let labels = [("outcome", outcome)];
        let settled = value(&a, decided, &labels) + value(&b, decided, &labels)
            - value(&before, decided, &labels);
        assert_eq!(settled, 1.0, "{outcome}");
    }
}

#[tokio::test]
async fn sandboxes_are_gauged_by_template_and_state() {
    let c = crate::sandbox::cluster_with(&[("TOOLMESH_METRICS_LISTEN", LISTEN)]).await;
    let port = port(&c.nodes[0]);
    let sandboxes = "toolmesh_sandboxes";
    let warm = [("template", "default"), ("state", "warm")];
    let in_use = [("template", "default"), ("state", "in_use")];
    // TOOLMESH_SANDBOX_WARM=1: one warm sandbox, no session yet.
    let s = scrape_until(port, "one warm sandbox", |s| {
        value(s, sandboxes, &warm) == 1.0
    })
    .await;
    assert_eq!(value(&s, sandboxes, &in_use), 0.0);
    assert_eq!(
        value(&s, "toolmesh_sandbox_capacity", &[]),
        toolmesh_sandbox::config::DEFAULT_SANDBOX_MAX_SESSIONS as f64
    );

    ok(crate::sandbox::run(&c, "s1", "true").await);
    scrape_until(port, "the session holds a sandbox", |s| {
        value(s, sandboxes, &in_use) == 1.0
    })
    .await;
    // The warm pool refills behind the session.
    scrape_until(port, "the warm pool refilled", |s| {
        value(s, sandboxes, &warm) == 1.0 && value(s, sandboxes, &in_use) == 1.0
    })
    .await;
}

#[tokio::test]
async fn web_fetch_egress_decisions_are_counted() {
    let target = toolmesh_testkit::http_target().await;
    let (c, port) = metered_cluster(
        "gateway,approval,web",
        &[("TOOLMESH_WEB_ALLOWED_NETWORKS", "127.0.0.2/32")],
    )
    .await;
    let fetch = |host: &str| json!({"tool": "web_fetch", "arguments": {"url": format!("http://{host}:{target}/")}});
    ok(c.call("acme", fetch("127.0.0.2")).await);
    for _ in 0..2 {
        let refused = c.call("acme", fetch("127.0.0.1")).await;
        assert_eq!(refused["error"], "blocked_url", "{refused}");
    }
    let s = scrape_until(port, "the web decisions counted", |s| {
        value(s, "toolmesh_calls_total", &[("tool", "web_fetch")]) == 3.0
    })
    .await;
    let egress = "toolmesh_egress_decisions_total";
    assert_eq!(
        value(&s, egress, &[("source", "web"), ("allowed", "true")]),
        1.0
    );
    assert_eq!(
        value(&s, egress, &[("source", "web"), ("allowed", "false")]),
        2.0
    );
}

#[tokio::test]
async fn provider_instances_follow_the_catalog() {
    use crate::providers::Provider;
    let (c, port) = metered_cluster("gateway,approval", &[]).await;
    let instances = [("service", "tests")];
    let mut a = Provider::start(&c, "tests", &["--test-tools", "--no-ticket"]).await;
    let _b = Provider::start(&c, "tests", &["--test-tools", "--no-ticket"]).await;
    scrape_until(port, "two instances up", |s| {
        value(s, "toolmesh_provider_instances", &instances) == 2.0
    })
    .await;
    a.kill().await;
    scrape_until(port, "one instance left", |s| {
        value(s, "toolmesh_provider_instances", &instances) == 1.0
    })
    .await;
}

#[tokio::test]
async fn a_bad_metrics_address_stops_the_node_naming_the_variable() {
    for bad in ["nope", "127.0.0.1", "127.0.0.1:notaport", "999.1.1.1:80"] {
        let stderr = node_refusal("gateway", &[("TOOLMESH_METRICS_LISTEN", bad)]);
        assert!(
            stderr.contains("TOOLMESH_METRICS_LISTEN"),
            "{bad}: {stderr}"
        );
    }
    // A taken port: the node cannot serve metrics there, and says where and why.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let stderr = node_refusal("gateway", &[("TOOLMESH_METRICS_LISTEN", addr.as_str())]);
    assert!(
        stderr.contains("TOOLMESH_METRICS_LISTEN") && stderr.contains(&addr),
        "{stderr}"
    );
}

/// Every series a panel of `docker/grafana/toolmesh-dashboard.json` graphs is one a node
/// exports (a family of `kernel::metrics`, with its `_total`/`_bucket` form).
#[test]
fn the_dashboard_graphs_only_exported_series() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docker/grafana/toolmesh-dashboard.json"
    );
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the dashboard exists"))
            .expect("the dashboard is valid JSON");
    let exported = toolmesh_kernel::metrics::Metrics::series_names();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 7, "{}", panels.len());
    let mut graphed = std::collections::BTreeSet::new();
    for panel in panels {
        let targets = panel["targets"].as_array().expect("each panel has targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().expect("each target has an expr");
            let names = series_in(expr);
            assert!(!names.is_empty(), "{expr} names no toolmesh series");
            for name in names {
                assert!(
                    exported.contains(&name),
                    "{}: {name} is not exported (exported: {exported:?})",
                    panel["title"]
                );
                graphed.insert(name);
            }
        }
    }
    for wanted in [
        "toolmesh_calls_total",
        "toolmesh_call_duration_seconds_bucket",
        "toolmesh_in_flight",
        "toolmesh_approvals_pending",
        "toolmesh_sandboxes",
        "toolmesh_egress_decisions_total",
        "toolmesh_provider_instances",
    ] {
        assert!(graphed.contains(wanted), "no panel graphs {wanted}");
    }
}

/// The `toolmesh_*` identifiers of a PromQL expression.
fn series_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("toolmesh_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}
