//! The node's metrics: one registry per node and the series families every actor records into
//! (PROTOCOL.md "Durable events, audit, metrics, console"; docs/metrics-and-traces.md).
//!
//! The families are defined here by meaning (calls, approvals, sandboxes, providers, egress),
//! not by actor: an actor gets the node's [`Metrics`] handle through its spawn and records what
//! it sees, knowing nothing of the others. The node serves [`Metrics::render`] at `/metrics`
//! when `TOOLMESH_METRICS_LISTEN` is set ([`MetricsConfig`]).
//!
//! Architecture invariant: every label value comes from a closed or configured set (tool names
//! of the registry, error codes, roles, approval outcomes, template names, provider services,
//! accounts with pending approvals): never an invocation id, never a caller's free text, and
//! no account on a histogram. A tool name the registry does not know is recorded as
//! [`UNKNOWN_TOOL`].
//!
//! Cost on the call path: a counter and a histogram lookup in their family (a read lock of
//! the family's map), then atomic adds; gauges that mirror state elsewhere (sandboxes,
//! approvals pending, provider instances, in-flight work) are set on scrape by refreshers
//! ([`Metrics::on_scrape`]), so the call path never touches them.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::config::{ConfigError, RawEnv};
use crate::error::ErrorCode;
use crate::role::Role;

/// The variable naming where a node serves `/metrics` (`host:port`); unset: no listener.
pub const METRICS_LISTEN_VAR: &str = "TOOLMESH_METRICS_LISTEN";

/// The `tool` label of a call whose tool the registry does not know (or that could not be
/// read): keeps callers' free text out of the label set.
pub const UNKNOWN_TOOL: &str = "(unknown)";

/// The `outcome` label of a call that succeeded; a failed one carries its error code.
pub const OK_OUTCOME: &str = "ok";

/// Upper bounds of `toolmesh_call_duration_seconds`, from 1 ms to 10 min.
pub const CALL_DURATION_BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// Every family a node registers, with its OpenMetrics type (a unit test holds this list to
/// the registry's own `# TYPE` lines).
pub const FAMILIES: [(&str, &str); 9] = [
    ("toolmesh_calls", "counter"),
    ("toolmesh_call_duration_seconds", "histogram"),
    ("toolmesh_in_flight", "gauge"),
    ("toolmesh_approvals_pending", "gauge"),
    ("toolmesh_approvals_decided", "counter"),
    ("toolmesh_sandboxes", "gauge"),
    ("toolmesh_sandbox_capacity", "gauge"),
    ("toolmesh_provider_instances", "gauge"),
    ("toolmesh_egress_decisions", "counter"),
];

/// How long a scrape waits for the refreshers ([`Metrics::on_scrape`]); past it, the gauges a
/// slow refresher sets keep their last values and the scrape answers anyway.
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(2);

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `TOOLMESH_METRICS_LISTEN` and `TOOLMESH_HTTP_*`, validated.
#[derive(Debug, Clone, Default)]
pub struct MetricsConfig {
    /// Where `/metrics` is served; `None`: nowhere.
    pub listen: Option<SocketAddr>,
    /// The listener's header timeout and connection cap.
    pub http: crate::listener::HttpLimits,
}

impl MetricsConfig {
    /// Reads `TOOLMESH_METRICS_LISTEN`: an IP and port (`0.0.0.0:9464`) or a host name that
    /// resolves and a port (`localhost:9464`). Anything else is an error naming the variable.
    /// With a listener, `TOOLMESH_HTTP_*` ([`crate::listener::HttpLimits`]) too.
    pub fn from_env(env: &RawEnv) -> Result<MetricsConfig, ConfigError> {
        let Some(raw) = env.get(METRICS_LISTEN_VAR) else {
            return Ok(MetricsConfig::default());
        };
        let invalid = |reason: String| ConfigError::Invalid {
            key: METRICS_LISTEN_VAR,
            value: raw.to_owned(),
            reason,
        };
        let text = raw.trim();
        let listen = match text.parse::<SocketAddr>() {
            Ok(addr) => addr,
            Err(_) => {
                if !text.contains(':') {
                    return Err(invalid("use host:port, e.g. 0.0.0.0:9464".into()));
                }
                text.to_socket_addrs()
                    .map_err(|e| invalid(format!("use host:port, e.g. 0.0.0.0:9464 ({e})")))?
                    .next()
                    .ok_or_else(|| invalid("the host resolves to no address".into()))?
            }
        };
        Ok(MetricsConfig {
            listen: Some(listen),
            http: crate::listener::HttpLimits::from_env(env)?,
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountLabels {
    account: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SandboxLabels {
    template: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EgressLabels {
    source: &'static str,
    allowed: &'static str,
}

/// Where an outbound request was decided on (`toolmesh_egress_decisions_total{source}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressSource {
    /// A sandbox's egress proxy (templates with `network = "allow"`).
    Sandbox,
    /// `web_fetch`'s egress policy.
    Web,
}

impl EgressSource {
    fn as_str(self) -> &'static str {
        match self {
            EgressSource::Sandbox => "sandbox",
            EgressSource::Web => "web",
        }
    }
}

/// How an approval was settled (`toolmesh_approvals_decided_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalOutcome {
    Approved,
    Rejected,
    Expired,
}

impl ApprovalOutcome {
    fn as_str(self) -> &'static str {
        match self {
            ApprovalOutcome::Approved => "approved",
            ApprovalOutcome::Rejected => "rejected",
            ApprovalOutcome::Expired => "expired",
        }
    }
}

/// The state of a sandbox in `toolmesh_sandboxes{state}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    /// Started and ready for a new session.
    Warm,
    /// Held by a session.
    InUse,
}

impl SandboxState {
    fn as_str(self) -> &'static str {
        match self {
            SandboxState::Warm => "warm",
            SandboxState::InUse => "in_use",
        }
    }
}

/// Registers each family `field` of `families` under its field's name, with its help text and,
/// when given, its unit.
macro_rules! register {
    ($registry:ident, $families:ident; $($field:ident $(($unit:expr))?: $help:literal,)+) => {
        $(register!(@one $registry, $families.$field, $help $(, $unit)?);)+
    };
    (@one $registry:ident, $families:ident.$field:ident, $help:literal) => {
        $registry.register(stringify!($field), $help, $families.$field.clone())
    };
    (@one $registry:ident, $families:ident.$field:ident, $help:literal, $unit:expr) => {
        $registry.register_with_unit(stringify!($field), $help, $unit, $families.$field.clone())
    };
}

type HistogramFamily = Family<ToolLabels, Histogram, fn() -> Histogram>;
type Refresher = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

fn call_histogram() -> Histogram {
    Histogram::new(CALL_DURATION_BUCKETS)
}

struct Families {
    calls: Family<CallLabels, Counter>,
    call_duration: HistogramFamily,
    in_flight: Family<RoleLabels, Gauge>,
    approvals_pending: Family<AccountLabels, Gauge>,
    approvals_decided: Family<OutcomeLabels, Counter>,
    sandboxes: Family<SandboxLabels, Gauge>,
    /// A family without labels, so that a node without the sandbox role exports none.
    sandbox_capacity: Family<Vec<(String, String)>, Gauge>,
    provider_instances: Family<ServiceLabels, Gauge>,
    egress_decisions: Family<EgressLabels, Counter>,
}

struct Inner {
    registry: Registry,
    families: Families,
    refreshers: Mutex<Vec<Refresher>>,
    /// Label values gauged so far, kept to zero the ones that drop out ([`set_all`]).
    pending_accounts: Mutex<HashSet<String>>,
    provider_services: Mutex<HashSet<String>>,
}

/// The node's registry and its families; cheap to clone, one per node.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every family of the node registered (empty until recorded into).
    pub fn new() -> Metrics {
        let families = Families {
            calls: Family::default(),
            call_duration: Family::new_with_constructor(call_histogram),
            in_flight: Family::default(),
            approvals_pending: Family::default(),
            approvals_decided: Family::default(),
            sandboxes: Family::default(),
            sandbox_capacity: Family::default(),
            provider_instances: Family::default(),
            egress_decisions: Family::default(),
        };
        let mut registry = Registry::with_prefix("toolmesh");
        let f = &families;
        // Each family is named after its field; `(unit)` when it has one.
        register!(registry, f;
            calls: "Tool calls answered by this node's gateway, by tool and outcome (ok or the error code)",
            call_duration (Unit::Seconds): "Time from the gateway receiving a call to its answer, by tool",
            in_flight: "Work this node holds right now (calls, requests), by role",
            approvals_pending: "Undecided, unexpired approvals in the approval store, by account (every approval node reports the same store: aggregate with max)",
            approvals_decided: "Approvals this node settled, by outcome (approved, rejected, expired)",
            sandboxes: "This worker's sandboxes, by template and state (warm: ready for a session; in_use: held by a session)",
            sandbox_capacity: "Sessions this worker holds at most (TOOLMESH_SANDBOX_MAX_SESSIONS)",
            provider_instances: "Live instances of each tool provider service this gateway routes to (0: the provider's tools answer unavailable)",
            egress_decisions: "Outbound requests decided on by an egress policy, by source (sandbox, web) and whether they were allowed",
        );
        Metrics(Arc::new(Inner {
            registry,
            families,
            refreshers: Mutex::new(Vec::new()),
            pending_accounts: Mutex::default(),
            provider_services: Mutex::default(),
        }))
    }

    fn families(&self) -> &Families {
        &self.0.families
    }

    /// One call answered: `tool` must be a name of the registry (or [`UNKNOWN_TOOL`]), `error`
    /// its error code when it failed, `elapsed` from its arrival to its answer.
    pub fn call_finished(&self, tool: &str, error: Option<ErrorCode>, elapsed: Duration) {
        let f = self.families();
        let outcome = error.map_or(OK_OUTCOME, ErrorCode::as_str);
        f.calls
            .get_or_create(&CallLabels {
                tool: tool.to_owned(),
                outcome,
            })
            .inc();
        f.call_duration
            .get_or_create(&ToolLabels {
                tool: tool.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// The work a role of this node holds now (`toolmesh_in_flight{role}`).
    pub fn set_in_flight(&self, role: Role, count: u64) {
        self.families()
            .in_flight
            .get_or_create(&RoleLabels {
                role: role.as_str(),
            })
            .set(saturating_i64(count));
    }

    /// Pending approvals per account as the store has them now. An account gauged before and
    /// missing from `counts` is set to 0 (its last approval was settled).
    pub fn set_approvals_pending<'a>(&self, counts: impl IntoIterator<Item = (&'a str, u64)>) {
        set_all(
            &self.families().approvals_pending,
            &self.0.pending_accounts,
            counts,
            |account| AccountLabels { account },
        );
    }

    /// One approval settled by this node.
    pub fn approval_decided(&self, outcome: ApprovalOutcome) {
        self.families()
            .approvals_decided
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Sandboxes of one template in one state on this worker now.
    pub fn set_sandboxes(&self, template: &str, state: SandboxState, count: u64) {
        self.families()
            .sandboxes
            .get_or_create(&SandboxLabels {
                template: template.to_owned(),
                state: state.as_str(),
            })
            .set(saturating_i64(count));
    }

    /// Sessions this worker holds at most.
    pub fn set_sandbox_capacity(&self, capacity: u64) {
        self.families()
            .sandbox_capacity
            .get_or_create(&Vec::new())
            .set(saturating_i64(capacity));
    }

    /// Live instances per provider service now; a service gauged before and missing from
    /// `instances` is set to 0 (every instance went away).
    pub fn set_provider_instances<'a>(&self, instances: impl IntoIterator<Item = (&'a str, u64)>) {
        set_all(
            &self.families().provider_instances,
            &self.0.provider_services,
            instances,
            |service| ServiceLabels { service },
        );
    }

    /// One outbound request decided on by an egress policy.
    pub fn egress_decision(&self, source: EgressSource, allowed: bool) {
        self.families()
            .egress_decisions
            .get_or_create(&EgressLabels {
                source: source.as_str(),
                allowed: if allowed { "true" } else { "false" },
            })
            .inc();
    }

    /// Runs `refresh` before every scrape (at most [`REFRESH_TIMEOUT`] for all of them): for
    /// gauges that mirror state kept elsewhere (a store, a pool, a catalog).
    pub fn on_scrape<F>(&self, refresh: F)
    where
        F: Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static,
    {
        self.0
            .refreshers
            .lock()
            .expect("metrics refreshers lock")
            .push(Arc::new(refresh));
    }

    /// Refreshes the gauges ([`Metrics::on_scrape`]), then encodes the registry as
    /// OpenMetrics text ([`CONTENT_TYPE`]).
    pub async fn render(&self) -> String {
        let refreshers: Vec<Refresher> = self
            .0
            .refreshers
            .lock()
            .expect("metrics refreshers lock")
            .clone();
        let all = futures::future::join_all(refreshers.iter().map(|refresh| refresh()));
        if tokio::time::timeout(REFRESH_TIMEOUT, all).await.is_err() {
            tracing::warn!(
                timeout_ms = REFRESH_TIMEOUT.as_millis() as u64,
                "a metrics refresher did not finish in time; its gauges keep their last values"
            );
        }
        self.encode()
    }

    /// The names of the samples a node exports, as a query names them: `<name>_total` for a
    /// counter, `<name>_bucket`, `_count` and `_sum` for a histogram, `<name>` for a gauge
    /// ([`FAMILIES`]).
    pub fn series_names() -> Vec<String> {
        let mut names = Vec::new();
        for (name, kind) in FAMILIES {
            match kind {
                "counter" => names.push(format!("{name}_total")),
                "histogram" => {
                    for suffix in ["_bucket", "_count", "_sum"] {
                        names.push(format!("{name}{suffix}"));
                    }
                }
                _ => names.push(name.to_owned()),
            }
        }
        names
    }

    /// The registry as OpenMetrics text, as it is now (no refresh).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.0.registry)
            .expect("writing to a String does not fail");
        text
    }
}

/// Sets a gauge per key to its value, and to 0 every key gauged before and missing now: a
/// series that drops out reads 0 in a graph instead of its last value.
fn set_all<'a, L>(
    family: &Family<L, Gauge>,
    known: &Mutex<HashSet<String>>,
    values: impl IntoIterator<Item = (&'a str, u64)>,
    label: impl Fn(String) -> L,
) where
    L: Clone + std::hash::Hash + Eq,
{
    let values: HashMap<&str, u64> = values.into_iter().collect();
    let mut known = known.lock().expect("metrics label lock");
    for (key, value) in &values {
        family
            .get_or_create(&label((*key).to_owned()))
            .set(saturating_i64(*value));
        if !known.contains(*key) {
            known.insert((*key).to_owned());
        }
    }
    for key in known.iter() {
        if !values.contains_key(key.as_str()) {
            family.get_or_create(&label(key.clone())).set(0);
        }
    }
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_families_list_is_the_registry() {
        let metrics = Metrics::new();
        metrics.call_finished("t", None, Duration::ZERO);
        metrics.set_in_flight(Role::Gateway, 0);
        metrics.set_approvals_pending([("a", 1)]);
        metrics.approval_decided(ApprovalOutcome::Expired);
        metrics.set_sandboxes("default", SandboxState::Warm, 1);
        metrics.set_sandbox_capacity(1);
        metrics.set_provider_instances([("p", 1)]);
        metrics.egress_decision(EgressSource::Web, false);
        let text = metrics.encode();
        let mut typed: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(n, k)| (n.to_owned(), k.to_owned()))
            .collect();
        let mut listed: Vec<(String, String)> = FAMILIES
            .iter()
            .map(|(n, k)| ((*n).to_owned(), (*k).to_owned()))
            .collect();
        typed.sort();
        listed.sort();
        assert_eq!(typed, listed);
    }

    #[test]
    fn the_families_have_the_names_of_the_contract() {
        let names = Metrics::series_names();
        for name in [
            "toolmesh_calls_total",
            "toolmesh_call_duration_seconds_bucket",
            "toolmesh_call_duration_seconds_count",
            "toolmesh_approvals_pending",
            "toolmesh_approvals_decided_total",
            "toolmesh_sandboxes",
            "toolmesh_sandbox_capacity",
            "toolmesh_in_flight",
            "toolmesh_provider_instances",
            "toolmesh_egress_decisions_total",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
    }

    #[test]
    fn calls_count_by_tool_and_outcome() {
        let metrics = Metrics::new();
        metrics.call_finished("read_workspace_file", None, Duration::from_millis(3));
        metrics.call_finished(
            "read_workspace_file",
            Some(ErrorCode::NotFound),
            Duration::from_secs(700),
        );
        let text = metrics.encode();
        for line in [
            r#"toolmesh_calls_total{tool="read_workspace_file",outcome="ok"} 1"#,
            r#"toolmesh_calls_total{tool="read_workspace_file",outcome="not_found"} 1"#,
            r#"toolmesh_call_duration_seconds_bucket{le="0.005",tool="read_workspace_file"} 1"#,
            r#"toolmesh_call_duration_seconds_bucket{le="600.0",tool="read_workspace_file"} 1"#,
            r#"toolmesh_call_duration_seconds_bucket{le="+Inf",tool="read_workspace_file"} 2"#,
            r#"toolmesh_call_duration_seconds_count{tool="read_workspace_file"} 2"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn a_key_that_drops_out_reads_zero() {
        let metrics = Metrics::new();
        metrics.set_approvals_pending([("acme", 2), ("globex", 1)]);
        metrics.set_approvals_pending([("globex", 3)]);
        let text = metrics.encode();
        assert!(
            text.contains(r#"toolmesh_approvals_pending{account="acme"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"toolmesh_approvals_pending{account="globex"} 3"#),
            "{text}"
        );
    }

    #[test]
    fn bad_listen_addresses_name_the_variable() {
        let ok =
            MetricsConfig::from_env(&RawEnv::from_pairs([(METRICS_LISTEN_VAR, "0.0.0.0:9464")]))
                .unwrap();
        assert_eq!(ok.listen, Some("0.0.0.0:9464".parse().unwrap()));
        assert!(MetricsConfig::from_env(&RawEnv::default())
            .unwrap()
            .listen
            .is_none());
        for bad in ["nope", "1.2.3.4", "host:port", ":99999"] {
            let err = MetricsConfig::from_env(&RawEnv::from_pairs([(METRICS_LISTEN_VAR, bad)]))
                .unwrap_err();
            assert!(err.to_string().contains(METRICS_LISTEN_VAR), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn refreshers_run_before_each_render() {
        let metrics = Metrics::new();
        let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        metrics.on_scrape({
            let (metrics, ticks) = (metrics.clone(), ticks.clone());
            move || {
                let n = ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                metrics.set_in_flight(Role::Gateway, n);
                Box::pin(std::future::ready(()))
            }
        });
        assert!(metrics
            .render()
            .await
            .contains(r#"toolmesh_in_flight{role="gateway"} 1"#));
        assert!(metrics
            .render()
            .await
            .contains(r#"toolmesh_in_flight{role="gateway"} 2"#));
    }
}
