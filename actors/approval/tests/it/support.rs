//! The rig every test uses: a real nats-server and redis-server, approval desks started in the
//! test's actix System, and helpers that speak only NATS (the public approvals subjects and the
//! internal gate subject).

use std::time::Duration;

use async_nats::{Client, Subscriber};
use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_approval::ApprovalConfig;
use toolmesh_approval::{spawn, ApprovalSettings};
use toolmesh_kernel::host::ActorHandle;
use toolmesh_kernel::host::{InFlight, Lifecycle};
use toolmesh_kernel::subjects::{internal, public};
use toolmesh_kernel::wire::{ApprovalRequest, ApprovalStatus, GateOutcome};
use toolmesh_kernel::Account;
use toolmesh_testkit::{request_json, request_raw, wait_until, NatsServer, RedisServer};

/// Events and replies arrive in milliseconds; this only bounds a failing test.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub fn config(ttl_s: u64, in_band: bool) -> ApprovalConfig {
    ApprovalConfig {
        in_band,
        ttl: Duration::from_secs(ttl_s),
        retention: Duration::from_secs(3600),
        max_pending: 1000,
    }
}

/// One running approval actor, as a node would run it.
pub struct Desk {
    pub lifecycle: Lifecycle,
    pub in_flight: InFlight,
    handle: ActorHandle,
}

impl Desk {
    pub async fn start(nats_url: &str, redis_url: &str, config: ApprovalConfig) -> Desk {
        let nats = toolmesh_kernel::host::connect_client(nats_url, "approval-test-node")
            .await
            .expect("desk connects to NATS");
        let lifecycle = Lifecycle::new();
        let in_flight = InFlight::default();
        let settings = ApprovalSettings {
            redis: toolmesh_kernel::redis_link::RedisConfig::url(redis_url),
            config,
            metrics: Default::default(),
            audit: toolmesh_kernel::audit::AuditTrail::off("test", "approval tests keep no trail"),
            replies: Default::default(),
        };
        let handle = spawn(nats, settings, lifecycle.clone(), in_flight.clone())
            .await
            .expect("approval actor starts");
        Desk {
            lifecycle,
            in_flight,
            handle,
        }
    }

    /// Drains the desk as a node's SIGTERM would and waits until it has stopped.
    pub async fn stop(self) {
        self.lifecycle.drain.cancel();
        tokio::time::timeout(PATIENCE, self.handle.stopped())
            .await
            .expect("the desk stops after drain");
    }
}

/// Servers, one client and one desk.
pub struct Rig {
    pub nats_server: NatsServer,
    pub redis: RedisServer,
    pub client: Client,
    pub desk: Option<Desk>,
    pub config: ApprovalConfig,
}

impl Rig {
    pub async fn start() -> Rig {
        Rig::with_config(config(3600, true)).await
    }

    pub async fn with_config(config: ApprovalConfig) -> Rig {
        Rig::on(NatsServer::start(), config).await
    }

    /// A rig whose NATS server allows bodies of at most `bytes`.
    pub async fn with_max_payload(bytes: usize) -> Rig {
        Rig::on(
            NatsServer::start_with_max_payload(bytes),
            config(3600, true),
        )
        .await
    }

    async fn on(nats_server: NatsServer, config: ApprovalConfig) -> Rig {
        let redis = RedisServer::start();
        let desk = Desk::start(&nats_server.url(), &redis.url(), config.clone()).await;
        let client = nats_server.client().await;
        Rig {
            nats_server,
            redis,
            client,
            desk: Some(desk),
            config,
        }
    }

    /// Another desk on the same NATS and Redis (a second approval node).
    pub async fn another_desk(&self) -> Desk {
        Desk::start(
            &self.nats_server.url(),
            &self.redis.url(),
            self.config.clone(),
        )
        .await
    }

    /// Stops the desk and starts a fresh one on the same servers.
    pub async fn restart_desk(&mut self) {
        if let Some(desk) = self.desk.take() {
            desk.stop().await;
        }
        self.desk = Some(self.another_desk().await);
    }

    pub async fn gate(&self, call: &Call) -> GateOutcome {
        gate_outcome(request_json(&self.client, internal::APPROVAL_GATE, call.body()).await)
    }

    /// All of `calls` at the gate at once; their outcomes in order.
    pub async fn gate_all(&self, calls: impl IntoIterator<Item = Call>) -> Vec<GateOutcome> {
        let calls: Vec<Call> = calls.into_iter().collect();
        futures::future::join_all(calls.iter().map(|call| self.gate(call))).await
    }

    pub async fn gate_raw(&self, body: &[u8]) -> GateOutcome {
        gate_outcome(request_raw(&self.client, internal::APPROVAL_GATE, body.to_vec()).await)
    }

    /// The error code with which the gate refuses `call`; panics if it does not refuse.
    pub async fn refused(&self, call: &Call) -> String {
        refusal(self.gate(call).await).0
    }

    /// An out-of-band decision naming no approver: the approval's status after it, or the
    /// error code it is refused with.
    pub async fn decision(
        &self,
        account: &str,
        id: &str,
        approved: bool,
    ) -> Result<ApprovalStatus, String> {
        let reply = self.decide(account, id, approved, None).await;
        if reply["ok"] == true {
            Ok(status_of(&reply))
        } else {
            Err(error_of(&reply).to_owned())
        }
    }

    /// The error code an out-of-band approval of approval `id` of acme is refused with (it
    /// must be refused).
    pub async fn approving_refused(&self, id: &str) -> String {
        let decided = self.decision("acme", id, true).await;
        decided.expect_err("approving it is refused")
    }

    /// The status approval `id` of `account` shows.
    pub async fn status(&self, account: &str, id: &str) -> ApprovalStatus {
        status_of(&self.get(account, id).await)
    }

    /// Whether approval `id` of `account` shows expired within the patience.
    pub async fn shows_expired(&self, account: &str, id: &str) -> bool {
        wait_until(PATIENCE, || async {
            self.status(account, id).await == ApprovalStatus::Expired
        })
        .await
    }

    /// A new pending approval for `call` (which must carry no grant).
    pub async fn create(&self, call: &Call) -> ApprovalRequest {
        match self.gate(call).await {
            GateOutcome::Required { approval, .. } => approval,
            other => panic!("expected a new pending approval, got {other:?}"),
        }
    }

    /// An acme [`Call`] and the pending approval it asked for.
    pub async fn pending_call(&self) -> (Call, ApprovalRequest) {
        let call = Call::new("acme");
        let created = self.create(&call).await;
        (call, created)
    }

    /// An acme [`Call`] and its approval, decided out of band (see [`Rig::create_decided`]).
    pub async fn decided_call(&self, approved: bool) -> (Call, ApprovalRequest) {
        let call = Call::new("acme");
        let created = self.create_decided(&call, approved).await;
        (call, created)
    }

    /// A new approval for `call`, decided out of band (by no named approver); as created.
    pub async fn create_decided(&self, call: &Call, approved: bool) -> ApprovalRequest {
        let created = self.create(call).await;
        approval_of(
            &self
                .decide(&call.account, &created.id, approved, None)
                .await,
        );
        created
    }

    pub async fn list(&self, account: &str) -> Value {
        self.ask(account, public::ApprovalVerb::List, json!({}))
            .await
    }

    pub async fn get(&self, account: &str, id: &str) -> Value {
        self.ask(account, public::ApprovalVerb::Get, json!({ "id": id }))
            .await
    }

    pub async fn decide(
        &self,
        account: &str,
        id: &str,
        approved: bool,
        approver: Option<&str>,
    ) -> Value {
        let mut body = json!({ "id": id, "approved": approved });
        if let Some(approver) = approver {
            body["approver"] = approver.into();
        }
        self.ask(account, public::ApprovalVerb::Decide, body).await
    }

    pub async fn ask(&self, account: &str, verb: public::ApprovalVerb, body: Value) -> Value {
        let account = Account::parse(account).expect("test account");
        request_json(&self.client, public::approvals(&account, verb), body).await
    }

    /// A subscription to `…requested` and `…decided` of `account`, live on the server.
    /// An internal request on `subject` (release, withdraw) about approval `id` of `account`,
    /// made on behalf of the call `invocation`: the reply.
    pub async fn on_behalf(
        &self,
        subject: &str,
        account: &str,
        id: &str,
        invocation: &str,
    ) -> Value {
        let body = json!({"account": account, "approval_id": id, "invocation_id": invocation});
        request_json(&self.client, subject, body).await
    }

    /// Asserts that `approval` was just decided as it is: the next event on `events` announces
    /// it (`why` says to whom), `get` shows it, and its account has nothing pending.
    pub async fn assert_decided_as(
        &self,
        events: &mut Subscriber,
        approval: &ApprovalRequest,
        why: &str,
    ) {
        let announced = next_event(events).await;
        assert_eq!(announced, ("decided".into(), approval.clone()), "{why}");
        let account = approval.account.as_str();
        assert_eq!(
            approval_of(&self.get(account, &approval.id).await),
            *approval
        );
        let pending = ids_of(&self.list(account).await);
        assert!(pending.is_empty(), "decided, so not pending: {pending:?}");
    }

    pub async fn events(&self, account: &str) -> Subscriber {
        let account = Account::parse(account).expect("test account");
        let sub = self
            .client
            // Every verb of the account; `next_event` skips the requests.
            .subscribe(format!("toolmesh.v1.approvals.{account}.*"))
            .await
            .expect("subscribe to approval events");
        self.client.flush().await.expect("flush");
        sub
    }
}

/// The next event on `sub`: its verb (`requested` / `decided`) and approval. The wildcard also
/// matches requests (`…list`, `…decide`) sent by the test itself; those are skipped.
pub async fn next_event(sub: &mut Subscriber) -> (String, ApprovalRequest) {
    loop {
        let message = tokio::time::timeout(PATIENCE, sub.next())
            .await
            .expect("an approval event within the patience")
            .expect("the event subscription is open");
        let verb = message.subject.rsplit('.').next().unwrap_or_default();
        if verb != "requested" && verb != "decided" {
            continue;
        }
        let approval =
            serde_json::from_slice(&message.payload).expect("an event is an ApprovalRequest");
        return (verb.to_owned(), approval);
    }
}

fn gate_outcome(reply: Value) -> GateOutcome {
    wire(reply, serde_json::from_value)
}

/// `reply` as the wire type `T`, read by `parse` (`serde_json::from_value`); a panic showing
/// the reply when it is not one.
pub fn wire<T>(reply: Value, parse: impl FnOnce(Value) -> serde_json::Result<T>) -> T {
    let name = std::any::type_name::<T>();
    parse(reply.clone()).unwrap_or_else(|e| panic!("not a {name} ({e}): {reply}"))
}

/// The approval in an ok reply of get/decide.
pub fn approval_of(reply: &Value) -> ApprovalRequest {
    assert_eq!(reply["ok"], true, "{reply}");
    serde_json::from_value(reply["approval"].clone()).expect("an ApprovalRequest")
}

/// The error code of a failure reply.
pub fn error_of(reply: &Value) -> &str {
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(
        reply["error_message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{reply}"
    );
    reply["error"].as_str().expect("an error code")
}

/// The ids in a list reply.
pub fn ids_of(reply: &Value) -> Vec<String> {
    assert_eq!(reply["ok"], true, "{reply}");
    reply["approvals"]
        .as_array()
        .expect("approvals is an array")
        .iter()
        .map(|a| a["id"].as_str().expect("an id").to_owned())
        .collect()
}

/// The refusal parts of a gate outcome; panics on anything else.
pub fn refusal(outcome: GateOutcome) -> (String, String, Option<ApprovalRequest>) {
    match outcome {
        GateOutcome::Refused {
            error,
            error_message,
            approval,
        } => {
            assert!(!error_message.is_empty());
            (error.as_str().to_owned(), error_message, approval)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The code of a refusal and the status of the approval it names, if any.
pub fn refused_status(outcome: GateOutcome) -> (String, Option<ApprovalStatus>) {
    let (code, _, approval) = refusal(outcome);
    (code, approval.map(|a| a.status))
}

/// The approval of a `Proceed`; panics on anything else.
pub fn proceeded(outcome: GateOutcome) -> ApprovalRequest {
    match outcome {
        GateOutcome::Proceed { approval, .. } => approval,
        other => panic!("expected proceed, got {other:?}"),
    }
}

pub fn status_of(reply: &Value) -> ApprovalStatus {
    approval_of(reply).status
}

/// One call as the gateway describes it to the gate.
#[derive(Debug, Clone)]
pub struct Call {
    pub account: String,
    pub session_id: Option<String>,
    pub invocation_id: String,
    pub tool: String,
    pub sha: String,
    pub grant: Option<Value>,
}

static NEXT_INVOCATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Call {
    pub fn new(account: &str) -> Call {
        Call {
            account: account.into(),
            session_id: Some("s-1".into()),
            invocation_id: format!(
                "inv-{}",
                NEXT_INVOCATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
            tool: "run_command".into(),
            sha: "a".repeat(64),
            grant: None,
        }
    }

    /// The same call again (a new invocation), presenting `grant`.
    pub fn with_grant(&self, grant: Value) -> Call {
        Call {
            grant: Some(grant),
            ..Call::new(&self.account).like(self)
        }
    }

    /// The same call again presenting approval `id`.
    pub fn presenting(&self, id: &str) -> Call {
        self.with_grant(json!({ "id": id }))
    }

    /// The same call again presenting approval `id` and deciding it in band.
    pub fn deciding(&self, id: &str, approved: bool) -> Call {
        self.with_grant(json!({ "id": id, "approved": approved }))
    }

    fn like(mut self, other: &Call) -> Call {
        self.session_id = other.session_id.clone();
        self.tool = other.tool.clone();
        self.sha = other.sha.clone();
        self
    }

    pub fn body(&self) -> Value {
        json!({
            "invocation": {
                "account": self.account,
                "invocation_id": self.invocation_id,
                "session_id": self.session_id,
                "user_id": "u-1",
                "agent_id": "a-1",
            },
            "tool_name": self.tool,
            "risk_level": "high",
            "side_effects": ["isolated_runtime_execution"],
            "arguments_sha256": self.sha,
            "arguments_preview": "{\"command\":\"ls\"}",
            "grant": self.grant,
        })
    }
}
