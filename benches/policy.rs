//! What policy rules and grants cost the gateway: a gated call that a rule or a grant lets
//! through, against the same call in mode `off` (no gate at all), measured in one run.
//!
//! `cargo bench --bench policy` starts two nats-servers: one with a
//! `toolmesh node --roles gateway` in mode `off` without a policy file, the other with a
//! `toolmesh node --roles gateway,approval` in mode `strict`, `component_status` and
//! `tool_search` raised to risk `high` (so the mode would gate them) and 100 rules: 99 `deny`
//! rules that every call is a candidate for (`tools = ["*"]`) whose argument test fails — a
//! test on a missing member, or a regex searched in `query` — and last an `allow` rule for
//! `component_status`. So `component_status` is decided by the rule engine after it tried
//! every rule; `tool_search` then goes to the gate, where an account grant (made once, no use
//! limit) covers it: the approval actor's grant lookup and use in Redis. Each pair runs in
//! alternating rounds (p50, p99, calls/s, and the ratio policy / off).
#![allow(clippy::print_stdout)]

use std::fmt::Write as _;

use bytes::Bytes;
use toolmesh_testkit::{NatsServer, RedisServer};

mod support;
use support::{compare_alternating, node_on, Pace, Side, TOOLMESH};

const PACE: Pace = support::GATEWAY_PACE;
const CALL: &str = "toolmesh.v1.call.bench";

/// The policy of the ruled side: strict, the two tools at risk `high`, 99 rules that fail on
/// their arguments, then the `allow` rule.
fn policy() -> String {
    let mut text = String::from(
        "mode = \"strict\"\n[tools.component_status]\nrisk_level = \"high\"\n\
         [tools.tool_search]\nrisk_level = \"high\"\n",
    );
    for i in 0..99 {
        let test = if i % 2 == 0 {
            format!("\"/path/{i}\" = {{ glob = \"secrets-{i}/**\" }}")
        } else {
            format!("query = {{ regex = \"^(rm|curl|wget)-{i}\\\\b\" }}")
        };
        let _ = write!(
            text,
            "\n[[rules]]\nid = \"deny-{i}\"\ntools = [\"*\"]\ndecision = \"deny\"\nwhen = {{ {test} }}\n"
        );
    }
    text.push_str(
        "\n[[rules]]\nid = \"allow-status\"\ntools = [\"component_status\"]\ndecision = \"allow\"\n",
    );
    text
}

/// Checks that both sides answer `body` alike (ok; the ruled side by its rule or grant), then
/// compares.
async fn compare(
    off: &async_nats::Client,
    ruled: &async_nats::Client,
    name: &str,
    label: &str,
    body: Bytes,
) {
    for (client, side) in [(off, "off"), (ruled, "ruled")] {
        let reply = client.request(CALL, body.clone()).await.expect("answers");
        let parsed: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
        assert_eq!(parsed["ok"], true, "{side}: {parsed}");
    }
    println!("\n{name}; {}", PACE.describe());
    let base = Side::new("mode off, no rules", CALL, &body).through(off);
    let tested = Side::new(label, CALL, &body).through(ruled);
    compare_alternating(off, &PACE, base, tested, "ratio policy / off").await;
}

/// Asks for an approval of `body` and approves it with an account grant of no use limit.
async fn grant_once(client: &async_nats::Client, body: &Bytes) {
    let reply = client.request(CALL, body.clone()).await.expect("answers");
    let reply: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(reply["error"], "approval_required", "{reply}");
    let decide = serde_json::json!({
        "id": reply["approval_request"]["id"], "approved": true, "approver": "bench",
        "grant": {"scope": "account", "expires_in_s": 3600}
    });
    let decided = client
        .request(
            "toolmesh.v1.approvals.bench.decide",
            decide.to_string().into(),
        )
        .await
        .expect("decided");
    let decided: serde_json::Value = serde_json::from_slice(&decided.payload).expect("JSON");
    assert!(decided["grant"]["id"].is_string(), "{decided}");
}

fn main() {
    support::block_on(async {
        let (nats_off, nats_ruled) = (NatsServer::start(), NatsServer::start());
        let redis = RedisServer::start();
        let data = tempfile::tempdir().expect("temp dir");
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("policy.toml");
        std::fs::write(&file, policy()).expect("the policy file");
        let off = nats_off.client().await;
        let ruled = nats_ruled.client().await;
        let _off_node = node_on(
            TOOLMESH,
            "gateway",
            "bench-off",
            &nats_off,
            &redis,
            data.path(),
        )
        .env("TOOLMESH_TOOL_APPROVAL_MODE", "off")
        .start(&off)
        .await;
        let _ruled_node = node_on(
            TOOLMESH,
            "gateway,approval",
            "bench-ruled",
            &nats_ruled,
            &redis,
            data.path(),
        )
        .env("TOOLMESH_POLICY_FILE", file.display().to_string())
        .start(&ruled)
        .await;
        println!("toolmesh policy bench: 100 rules (99 candidates that fail, then allow)");
        compare(
            &off,
            &ruled,
            "component_status (tests on a missing member)",
            "strict, allowed by rule 100",
            Bytes::from_static(br#"{"tool":"component_status"}"#),
        )
        .await;
        let search =
            Bytes::from_static(br#"{"tool":"tool_search","arguments":{"query":"read a file"}}"#);
        grant_once(&ruled, &search).await;
        compare(
            &off,
            &ruled,
            "tool_search (regexes searched in the query, then a grant)",
            "strict, 100 rules, covered by a grant",
            search,
        )
        .await;
    });
}
