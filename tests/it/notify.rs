//! Approval notifications (PROTOCOL.md "Approval policy", "Notifications"): the policy file's
//! `[[notify]]` webhooks get each event once, from one approval node, signed, retried, through
//! the web egress policy. The webhooks are an HTTP server of the test's own on 127.0.0.1.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use toolmesh_testkit::wait_until;

use crate::support::{ok, policy_file, Cluster, Recorder, GATED_STATUS};

/// Deliveries take milliseconds, or a few seconds with retries; this only bounds a failing test.
const WITHIN: Duration = Duration::from_secs(20);
const SECRET: &str = "webhook-secret";
const LOOPBACK: (&str, &str) = ("TOOLMESH_WEB_ALLOWED_NETWORKS", "127.0.0.0/8");

/// One POST a webhook received, and what it answered.
#[derive(Debug, Clone)]
struct Post {
    path: String,
    headers: HeaderMap,
    raw: Bytes,
    answered: StatusCode,
}

impl Post {
    fn body(&self) -> Value {
        serde_json::from_slice(&self.raw).expect("a notification is JSON")
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts that `X-Toolmesh-Signature` is the HMAC-SHA256 of the body with [`SECRET`].
    #[track_caller]
    fn assert_signed(&self) {
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(&self.raw);
        let want = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        assert_eq!(self.header("x-toolmesh-signature"), Some(want.as_str()));
    }
}

#[derive(Clone)]
struct Receiver {
    posts: Arc<Mutex<Vec<Post>>>,
    /// How many POSTs are answered 500 before the others are answered 200.
    failures_left: Arc<AtomicUsize>,
}

/// Webhooks on 127.0.0.1, any path.
type Webhook = Recorder<Post>;

impl Webhook {
    async fn start(failures: usize) -> Webhook {
        Recorder::serve(|posts| {
            let receiver = Receiver {
                posts,
                failures_left: Arc::new(AtomicUsize::new(failures)),
            };
            axum::Router::new().fallback(receive).with_state(receiver)
        })
        .await
    }

    /// The posts to `path` answered 200.
    fn delivered(&self, path: &str) -> Vec<Post> {
        let posts = self.records().into_iter();
        posts
            .filter(|p| p.path == path && p.answered == StatusCode::OK)
            .collect()
    }

    /// The posts to `path` answered 200, once `done` says they are all there.
    async fn wait_for(&self, path: &str, done: impl Fn(&[Post]) -> bool) -> Vec<Post> {
        let came = wait_until(WITHIN, || async { done(&self.delivered(path)) }).await;
        assert!(came, "not delivered to {path}: {:#?}", self.records());
        self.delivered(path)
    }

    /// The first post to `path` with `event` for approval `id`.
    async fn wait_event(&self, path: &str, event: &str, id: &str) -> Post {
        let is = |p: &Post| p.body()["event"] == event && p.body()["id"] == id;
        let posts = self.wait_for(path, |posts| posts.iter().any(is)).await;
        posts.into_iter().find(is).unwrap()
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> StatusCode {
    let fail = receiver
        .failures_left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    let answered = if fail {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    receiver.posts.lock().unwrap().push(Post {
        path: uri.path().to_owned(),
        headers,
        raw,
        answered,
    });
    answered
}

/// The environment of a node under the policy file `path` that may post to webhooks on
/// loopback, and `more`.
fn notifying<'a>(path: &'a str, more: (&'a str, &'a str)) -> [(&'a str, &'a str); 3] {
    [("TOOLMESH_POLICY_FILE", path), LOOPBACK, more]
}

/// A call of `component_status` in `session` that needs an approval: its id.
async fn required(c: &Cluster, session: &str) -> String {
    let reply = c
        .session_call("acme", session, "component_status", json!({}))
        .await;
    assert_eq!(reply["error"], "approval_required", "{reply}");
    reply["approval_request"]["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_posted_signed_after_two_failures_and_its_decision_follows() {
    let hook = Webhook::start(2).await;
    let base = &hook.base;
    let policy = format!(
        "{GATED_STATUS}
[[notify]]
url = \"{base}/flaky\"
events = [\"requested\", \"decided\"]
secret_env = \"NOTIFY_SECRET\"

[[notify]]
url = \"{base}/unsigned\"
secret_env = \"NOTIFY_SECRET_UNSET\"
"
    );
    let (_dir, path) = policy_file(&policy);
    let env = notifying(&path, ("NOTIFY_SECRET", SECRET));
    let c = Cluster::with_env(&env).await;
    let id = required(&c, "s1").await;

    // 500, 500, then 200: the third attempt delivers, 1 s and 2 s after the first failures.
    let requested = hook.wait_event("/flaky", "requested", &id).await;
    let attempts: Vec<Post> = hook
        .records()
        .into_iter()
        .filter(|p| p.path == "/flaky")
        .collect();
    let answers: Vec<u16> = attempts.iter().map(|p| p.answered.as_u16()).collect();
    assert_eq!(answers, [500, 500, 200]);
    let delivery = requested.header("x-toolmesh-delivery").unwrap();
    for attempt in &attempts {
        attempt.assert_signed();
        assert_eq!(attempt.header("x-toolmesh-delivery"), Some(delivery));
        assert_eq!(attempt.header("content-type"), Some("application/json"));
    }
    let body = requested.body();
    assert_eq!(
        (&body["status"], &body["tool_name"], &body["session_id"]),
        (&json!("pending"), &json!("component_status"), &json!("s1")),
        "{body}"
    );

    ok(c.decide("acme", &id, true).await);
    let decided = hook.wait_event("/flaky", "decided", &id).await;
    decided.assert_signed();
    assert_eq!(decided.body()["status"], "approved", "{}", decided.body());
    assert_ne!(decided.header("x-toolmesh-delivery"), Some(delivery));

    // A webhook whose secret is not there gets nothing unsigned: fails closed, logged.
    assert!(
        c.nodes[0].logs("NOTIFY_SECRET_UNSET", WITHIN),
        "the missing secret is logged"
    );
    let unsigned = hook.records().into_iter().filter(|p| p.path == "/unsigned");
    assert_eq!(unsigned.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_approval_nodes_post_each_event_once() {
    const APPROVALS: usize = 8;
    let hook = Webhook::start(0).await;
    let policy = format!("{GATED_STATUS}\n[[notify]]\nurl = \"{}/all\"\n", hook.base);
    let (_dir, path) = policy_file(&policy);
    let env = notifying(&path, ("RUST_LOG", "warn,toolmesh_approval::notify=info"));
    let mut c = Cluster::with_env(&env).await;
    c.start_node("approval", &env).await;
    for i in 0..APPROVALS {
        let id = required(&c, &format!("s{i}")).await;
        ok(c.decide("acme", &id, i % 2 == 0).await);
    }
    let count = |posts: &[Post]| {
        let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
        for post in posts {
            let body = post.body();
            let key = (body["id"].to_string(), body["event"].to_string());
            *seen.entry(key).or_default() += 1;
        }
        seen
    };
    hook.wait_for("/all", |posts| count(posts).len() == 2 * APPROVALS)
        .await;
    // The window closes on a later event: what was sent twice has come by then.
    let last = required(&c, "last").await;
    hook.wait_event("/all", "requested", &last).await;
    let seen = count(&hook.delivered("/all"));
    assert_eq!(seen.len(), 2 * APPROVALS + 1, "{seen:?}");
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    // Both nodes took their share of the queue group.
    for node in &c.nodes {
        assert!(
            node.logs("notification delivered", WITHIN),
            "{} delivered none",
            node.node_id
        );
    }
}

#[tokio::test]
async fn slack_and_json_hear_an_escalation_then_the_expiry_with_the_consoles_link() {
    let hook = Webhook::start(0).await;
    let base = &hook.base;
    let deadlines = crate::rules::deadlines();
    let policy = format!(
        "{deadlines}
[[notify]]
url = \"{base}/slack\"
format = \"slack\"
events = [\"escalated\", \"expired\"]

[[notify]]
url = \"{base}/json\"
events = [\"escalated\", \"expired\"]
"
    );
    let (_dir, path) = policy_file(&policy);
    let console = "https://approvals.example/console/";
    let env = notifying(&path, ("TOOLMESH_CONSOLE_URL", console));
    let c = Cluster::with_env(&env).await;
    let id = required(&c, "s1").await;

    // Escalated after one second, expired one second later; never `requested` (not asked for).
    let json_posts = hook.wait_for("/json", |posts| posts.len() == 2).await;
    let events: Vec<Value> = json_posts
        .iter()
        .map(|p| p.body()["event"].clone())
        .collect();
    assert_eq!(events, ["escalated", "expired"]);
    let escalated = json_posts[0].body();
    assert_eq!(
        (
            &escalated["id"],
            &escalated["escalated"],
            &escalated["reviewers"]
        ),
        (&json!(id), &json!(true), &json!("leads")),
        "{escalated}"
    );
    assert!(json_posts[0].header("x-toolmesh-signature").is_none());
    assert_eq!(json_posts[1].body()["status"], "expired");

    let slack = hook.wait_for("/slack", |posts| posts.len() == 2).await;
    let (escalated, expired) = (slack[0].body(), slack[1].body());
    let text = escalated["text"].as_str().unwrap();
    for words in [
        "escalated to leads",
        "component_status",
        "low risk",
        "acme",
        "s1",
        console,
    ] {
        assert!(text.contains(words), "{words}: {text}");
    }
    let blocks = escalated["blocks"].as_array().unwrap().clone();
    let all = Value::Array(blocks).to_string();
    for words in [id.as_str(), "leads", "Open the approvals console", console] {
        assert!(all.contains(words), "{words}: {all}");
    }
    let preview = &escalated["blocks"][2]["elements"][0]["elements"][0]["text"];
    assert!(preview.is_string(), "the preview: {escalated}");
    let text = expired["text"].as_str().unwrap();
    assert!(text.starts_with("Approval expired"), "{text}");
    assert_eq!(c.approval_status("acme", &id).await, "expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_the_egress_policy_refuses_gets_nothing() {
    let hook = Webhook::start(0).await;
    let policy = format!("{GATED_STATUS}\n[[notify]]\nurl = \"{}/hook\"\n", hook.base);
    let (_dir, path) = policy_file(&policy);
    let c = Cluster::with_env(&[("TOOLMESH_POLICY_FILE", path.as_str())]).await;
    let id = required(&c, "s1").await;
    assert!(
        c.nodes[0].logs("loopback address 127.0.0.1", WITHIN),
        "the refusal is logged"
    );
    // The refusal is final: nothing is retried, and the decision is refused the same way.
    ok(c.decide("acme", &id, false).await);
    assert!(
        c.nodes[0].logs("event=\"decided\"", WITHIN),
        "the decision's refusal is logged"
    );
    assert!(hook.records().is_empty(), "{:#?}", hook.records());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_added_by_sighup_gets_the_next_event() {
    let hook = Webhook::start(0).await;
    let (_dir, path) = policy_file(GATED_STATUS);
    let env = notifying(&path, ("RUST_LOG", "warn,toolmesh::node=info"));
    let c = Cluster::with_env(&env).await;
    let before = required(&c, "s1").await;
    let added = format!("{GATED_STATUS}\n[[notify]]\nurl = \"{}/late\"\n", hook.base);
    std::fs::write(&path, added).unwrap();
    c.nodes[0].hangup();
    assert!(
        c.nodes[0].logs("role=approval policy_revision", WITHIN),
        "the notifier read the file again"
    );
    let after = required(&c, "s2").await;
    hook.wait_event("/late", "requested", &after).await;
    let ids: Vec<Value> = hook
        .records()
        .iter()
        .map(|p| p.body()["id"].clone())
        .collect();
    assert!(!ids.contains(&json!(before)), "{ids:?}");
}

#[test]
fn a_bad_webhook_stops_an_approval_node_naming_it() {
    let (_dir, path) = policy_file("[[notify]]\nurl = \"mailto:ops@example.com\"\n");
    let stderr = crate::support::node_refusal("approval", &[("TOOLMESH_POLICY_FILE", &path)]);
    assert!(stderr.contains("[[notify]] #1 url"), "{stderr}");
}
