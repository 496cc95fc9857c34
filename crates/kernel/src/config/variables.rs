//! The variables the kernel's config modules read ([`NodeConfig`](super::NodeConfig) with its
//! [`RedisConfig`](crate::redis_link::RedisConfig),
//! [`AuditConfig`](crate::audit::AuditConfig), [`HttpLimits`](crate::listener::HttpLimits),
//! [`MetricsConfig`](crate::metrics::MetricsConfig)), for the configuration reference
//! ([`crate::settings`]).

use crate::settings::{Component, Variable};

use Component::*;

const fn var(
    name: &'static str,
    component: Component,
    default: &'static str,
    description: &'static str,
) -> Variable {
    Variable {
        name,
        component,
        default,
        description,
    }
}

/// The kernel's variables, by section.
pub const VARIABLES: &[Variable] = &[
    var(
        "TOOLMESH_NATS_URL",
        Node,
        "`nats://127.0.0.1:4222`",
        "NATS server(s) of the node and of every client command: one URL, or the servers of \
         one cluster comma-separated (a lost server is replaced by another of the list within \
         a few seconds). A URL may hold a user and password, the same for every URL that names \
         one: `toolmesh --help` never prints it.",
    ),
    var(
        "TOOLMESH_REDIS_URL",
        Node,
        "`redis://127.0.0.1:6379`",
        "Redis, where approvals, workspace read state and the sandbox registry (unless \
         `TOOLMESH_SANDBOX_REGISTRY=jetstream`) live. With `TOOLMESH_REDIS_SENTINELS`, only its \
         user, password and database are used.",
    ),
    var(
        "TOOLMESH_REDIS_SENTINELS",
        Node,
        "unset (Redis at `TOOLMESH_REDIS_URL`)",
        "Redis Sentinels, comma-separated `host:port` (a `redis://` URL for one that needs a \
         password). Redis is then the primary they name, found again after a failover.",
    ),
    var(
        "TOOLMESH_REDIS_MASTER_NAME",
        Node,
        "`toolmesh`",
        "The primary's name in the sentinels' configuration (with `TOOLMESH_REDIS_SENTINELS`).",
    ),
    var(
        "TOOLMESH_REDIS_WAIT_REPLICAS",
        Node,
        "`0`; `1` with `TOOLMESH_REDIS_SENTINELS`",
        "Replicas that must have a new approval, a decision, a use, a release or a grant \
         change (`WAIT`) before it is acknowledged; fewer within `TOOLMESH_REDIS_WAIT_MS` \
         answer `unavailable`. `0`: no wait.",
    ),
    var(
        "TOOLMESH_REDIS_WAIT_MS",
        Node,
        "`1000`",
        "How long such a write waits for its replicas (at least 1).",
    ),
    var(
        "TOOLMESH_NODE_ID",
        Node,
        "hostname + random suffix",
        "This node's id (`[A-Za-z0-9_-]{1,64}`) in the cluster view, heartbeats, logs and \
         traces.",
    ),
    var(
        "TOOLMESH_DATA_DIR",
        Node,
        "`./data`",
        "Workspaces (`accounts/<account>/sessions/<session>/workspace`) and the skill cache.",
    ),
    var(
        "TOOLMESH_RESULT_BUDGET_CHARS",
        Node,
        "`20000`",
        "Text budget per reply field; more is persisted in the workspace under \
         `.toolmesh/outputs/` and the reply points to it.",
    ),
    var(
        "TOOLMESH_REPLY_PREFIXES",
        Node,
        "`_INBOX.`",
        "Reply subjects the node answers on (comma-separated prefixes). A request with any \
         other reply subject is dropped unread.",
    ),
    var(
        "TOOLMESH_DRAIN_TIMEOUT_S",
        Node,
        "`30`",
        "How long a draining node (SIGTERM) lets calls in flight finish; the rest get \
         `cancelled`.",
    ),
    var(
        "TOOLMESH_HTTP_HEADER_TIMEOUT_S",
        Http,
        "`10`",
        "Seconds a client has to send each request head (1–86400); a connection that does not \
         is closed.",
    ),
    var(
        "TOOLMESH_HTTP_MAX_CONNECTIONS",
        Http,
        "`1024`",
        "Connections each listener keeps open at once; past it, new clients wait for one to \
         close.",
    ),
    var(
        "TOOLMESH_EVENTS_MAX_AGE_S",
        Events,
        "`86400` (a day)",
        "How long `TOOLMESH_EVENTS` keeps a RunEvent (at least 1).",
    ),
    var(
        "TOOLMESH_EVENTS_MAX_BYTES",
        Events,
        "`1073741824` (1 GiB)",
        "Bytes `TOOLMESH_EVENTS` keeps at most, the oldest events dropped first; `0`: no limit.",
    ),
    var(
        "TOOLMESH_STREAM_REPLICAS",
        Events,
        "`1`",
        "Servers of a NATS cluster that keep a copy of `TOOLMESH_EVENTS` and `TOOLMESH_AUDIT` \
         (1–5; 3 on a three-server cluster). A node raises a stream kept on fewer servers, and \
         leaves one kept on more as it is (logged).",
    ),
    var(
        "TOOLMESH_JETSTREAM_DOMAIN",
        Events,
        "unset (the connected server's JetStream)",
        "The JetStream domain of the cluster's servers (`jetstream { domain }`), for a node at a \
         worker site that reaches them through a NATS leaf node: its RunEvents stream and the \
         sandbox registry bucket are found there.",
    ),
    var(
        "TOOLMESH_AUDIT_MAX_AGE_S",
        Events,
        "`7776000` (90 days)",
        "How long the audit trail keeps an entry (at least 1). A node only ever raises the \
         stream's limit, never lowers it.",
    ),
    var(
        "TOOLMESH_METRICS_LISTEN",
        Telemetry,
        "unset (no listener)",
        "Where the node serves Prometheus metrics at `/metrics` (`host:port`), whatever its \
         roles.",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::*;

    /// Each default written as a literal is the `const` the code uses.
    #[test]
    fn defaults_are_the_documented_consts() {
        crate::settings::assert_defaults(
            VARIABLES,
            &[
                ("TOOLMESH_NATS_URL", &DEFAULT_NATS_URL),
                ("TOOLMESH_REDIS_URL", &DEFAULT_REDIS_URL),
                (
                    "TOOLMESH_REDIS_MASTER_NAME",
                    &crate::redis_link::DEFAULT_MASTER_NAME,
                ),
                (
                    "TOOLMESH_REDIS_WAIT_MS",
                    &crate::redis_link::DEFAULT_WAIT_MS,
                ),
                ("TOOLMESH_DATA_DIR", &DEFAULT_DATA_DIR),
                ("TOOLMESH_RESULT_BUDGET_CHARS", &DEFAULT_RESULT_BUDGET_CHARS),
                (
                    "TOOLMESH_REPLY_PREFIXES",
                    &crate::replies::DEFAULT_REPLY_PREFIX,
                ),
                ("TOOLMESH_DRAIN_TIMEOUT_S", &DEFAULT_DRAIN_TIMEOUT_S),
                (
                    "TOOLMESH_HTTP_HEADER_TIMEOUT_S",
                    &crate::listener::DEFAULT_HEADER_TIMEOUT_S,
                ),
                (
                    "TOOLMESH_HTTP_MAX_CONNECTIONS",
                    &crate::listener::DEFAULT_MAX_CONNECTIONS,
                ),
                ("TOOLMESH_EVENTS_MAX_AGE_S", &DEFAULT_EVENTS_MAX_AGE_S),
                ("TOOLMESH_EVENTS_MAX_BYTES", &DEFAULT_EVENTS_MAX_BYTES),
                ("TOOLMESH_STREAM_REPLICAS", &DEFAULT_STREAM_REPLICAS),
                ("TOOLMESH_AUDIT_MAX_AGE_S", &crate::audit::DEFAULT_MAX_AGE_S),
            ],
        );
    }

    /// Setting a variable to its default's literal changes nothing: this holds the defaults
    /// that are no `const` (`strict`, `docker`, `none`, …) to the code too.
    #[test]
    fn a_default_set_explicitly_changes_nothing() {
        let read = |env: &RawEnv| {
            format!(
                "{:?}",
                (
                    NodeConfig::from_env(env).unwrap(),
                    crate::audit::AuditConfig::from_env(env).unwrap(),
                    crate::listener::HttpLimits::from_env(env).unwrap(),
                    crate::metrics::MetricsConfig::from_env(env).unwrap(),
                )
            )
        };
        let literals = crate::config::assert_literal_defaults_change_nothing(VARIABLES, read);
        assert!(literals > 10, "{literals} defaults are literals");
    }
}
