//! The variables the kernel's config modules read ([`NodeConfig`](super::NodeConfig),
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
        "NATS server(s) of the node and of every client command. A URL may hold a user and \
         password: `toolmesh --help` never prints it.",
    ),
    var(
        "TOOLMESH_REDIS_URL",
        Node,
        "`redis://127.0.0.1:6379`",
        "Redis, where approvals, workspace read state and the sandbox registry live.",
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
        "TOOLMESH_AUDIT_MAX_AGE_S",
        Events,
        "`7776000` (90 days)",
        "How long the audit trail keeps an entry (at least 1). A node only ever raises the \
         stream's limit, never lowers it.",
    ),
    var(
        "TOOLMESH_SANDBOX_BACKEND",
        Sandbox,
        "`docker`",
        "`docker` (a container per session) or `process` (bubblewrap on the worker's host).",
    ),
    var(
        "TOOLMESH_SANDBOX_DOCKER_COMMANDS",
        Sandbox,
        "`spawner`",
        "`spawner`: the worker's binary, bound read-only into each container, forks every \
         command there (the image must run a glibc binary); `exec`: a `docker exec` per \
         command (any image).",
    ),
    var(
        "TOOLMESH_SANDBOX_IMAGE",
        Sandbox,
        "`toolmesh/sandbox:latest`",
        "The sandbox image, for every template that names none.",
    ),
    var(
        "TOOLMESH_SANDBOX_IMAGES",
        Sandbox,
        "unset (only `TOOLMESH_SANDBOX_IMAGE`)",
        "Other images a worker may run (comma-separated allow-list); a template naming an image \
         not listed is refused.",
    ),
    var(
        "TOOLMESH_SANDBOX_MEMORY_MB",
        Sandbox,
        "`1024`",
        "Memory of one sandbox, MiB, for every template that names none.",
    ),
    var(
        "TOOLMESH_SANDBOX_PIDS",
        Sandbox,
        "`256`",
        "Processes one sandbox may hold at once, for every template that names none.",
    ),
    var(
        "TOOLMESH_SANDBOX_CPUS",
        Sandbox,
        "`1`",
        "CPUs one sandbox may use (a fraction is allowed), for every template that names none.",
    ),
    var(
        "TOOLMESH_SANDBOX_NETWORK",
        Sandbox,
        "`none`",
        "The Docker network of the template `default`: `none` keeps its sandboxes offline, any \
         other name opens that network on purpose.",
    ),
    var(
        "TOOLMESH_SANDBOX_EGRESS_JOIN",
        Sandbox,
        "unset (the worker runs on the host)",
        "The container the worker runs in (name, id, or `self`: the one its hostname names). \
         The egress network of `network = \"allow\"` templates joins it and the proxy listens \
         there.",
    ),
    var(
        "TOOLMESH_SANDBOX_DIR",
        Sandbox,
        "the folder `sandboxes` in `TOOLMESH_DATA_DIR`",
        "The worker's copies of session workspaces and its staged spawner. Docker binds it into \
         containers by its path, so a worker in a container must see it at the host's path.",
    ),
    var(
        "TOOLMESH_SANDBOX_MAX_SESSIONS",
        Sandbox,
        "`32`",
        "Sandboxes one worker holds; a full worker ends the caller's own idle session first, \
         never one running a background task.",
    ),
    var(
        "TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT",
        Sandbox,
        "half of `TOOLMESH_SANDBOX_MAX_SESSIONS`, at least 1",
        "Sandboxes one worker holds for one account; at it a new session ends the account's own \
         oldest idle one, or is `limit_exceeded` when none is idle.",
    ),
    var(
        "TOOLMESH_SANDBOX_IDLE_TTL_S",
        Sandbox,
        "`900`",
        "A session's sandbox is removed after this many seconds unused.",
    ),
    var(
        "TOOLMESH_SANDBOX_WARM",
        Sandbox,
        "`2`",
        "Started sandboxes a worker keeps ready for new sessions.",
    ),
    var(
        "TOOLMESH_SANDBOX_CONCURRENCY",
        Sandbox,
        "2 × cores",
        "Commands one worker runs at once; more wait in order.",
    ),
    var(
        "TOOLMESH_SANDBOX_TMPFS_MB",
        Sandbox,
        "`256`",
        "Size of a sandbox's `/tmp` and home, MiB.",
    ),
    var(
        "TOOLMESH_SANDBOX_DISK_MB",
        Sandbox,
        "`4096`",
        "Each sandbox's own disk, MiB: a loop-mounted ext4 image over its folder, so writing \
         past it fails with \"No space left on device\". Needs a root worker that shares mounts \
         with the Docker daemon; `0`: a plain folder on the host's disk, no quota.",
    ),
    var(
        "TOOLMESH_SANDBOX_DISK_REQUIRED",
        Sandbox,
        "`1`",
        "`1`: a worker that cannot keep the disk quota of `TOOLMESH_SANDBOX_DISK_MB` does not \
         start; `0`: it runs without one and says so in its log and in `sandbox_status`.",
    ),
    var(
        "TOOLMESH_SANDBOX_TIMEOUT_S",
        Sandbox,
        "`60`",
        "A command's timeout when the call gives none.",
    ),
    var(
        "TOOLMESH_SANDBOX_SYNC_MAX_FILES",
        Sandbox,
        "`2000`",
        "Files and directories a workspace sync into a sandbox carries at most.",
    ),
    var(
        "TOOLMESH_SANDBOX_SYNC_MAX_FILE_BYTES",
        Sandbox,
        "`10485760` (10 MiB)",
        "Size of one file a workspace sync carries at most.",
    ),
    var(
        "TOOLMESH_SANDBOX_SYNC_MAX_TOTAL_BYTES",
        Sandbox,
        "`67108864` (64 MiB)",
        "Bytes one workspace sync carries at most.",
    ),
    var(
        "TOOLMESH_SANDBOX_SYNC_MAX_ENTRIES",
        Sandbox,
        "`10000`",
        "Entries of every kind (links and skipped names too) the walk of a sandbox's \
         `/workspace` after a command reads; past it the reply's `workspace_sync` says \
         `truncated: true`.",
    ),
    var(
        "TOOLMESH_SANDBOX_SYNC_MAX_DEPTH",
        Sandbox,
        "`64`",
        "Levels below `/workspace` that walk goes at most; deeper, `workspace_sync` says \
         `truncated: true`.",
    ),
    var(
        "TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES",
        Sandbox,
        "`268435456` (256 MiB)",
        "Text of one command output stream a worker spools and persists; past it the stream is \
         counted, not kept, and `persisted_outputs` says `truncated: true`.",
    ),
    var(
        "TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES",
        Sandbox,
        "`1073741824` (1 GiB)",
        "Unread background-task output one session keeps on the worker's disk. Text that finds \
         no room is counted, not kept (`dropped_by: \"session\"`).",
    ),
    var(
        "TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES",
        Sandbox,
        "`4294967296` (4 GiB)",
        "The same for all sessions of one worker (`dropped_by: \"worker\"`).",
    ),
    var(
        "TOOLMESH_SKILLS_DIR",
        Skills,
        "`./skills`",
        "Local skills: folders holding a `SKILL.md`.",
    ),
    var(
        "TOOLMESH_SKILL_SERVICE_URL",
        Skills,
        "unset (local skills only)",
        "The Skill Service remote skills come from (docs/PROTOCOL.md \"Skill Service\").",
    ),
    var(
        "TOOLMESH_SKILL_SPACE_IDS",
        Skills,
        "unset",
        "The Skill Service's spaces to list, comma-separated, in order.",
    ),
    var(
        "TOOLMESH_SKILL_SERVICE_TOKEN",
        Skills,
        "unset",
        "The Skill Service's bearer token; `toolmesh skill-service` requires it of its clients \
         when set.",
    ),
    var(
        "TOOLMESH_SKILL_SPACE_ALLOWLISTS",
        Skills,
        "unset (every active skill)",
        "Spaces that expose only some skills: `space=a|b,other=c`. A space named here lists only \
         the skills named for it.",
    ),
    var(
        "TOOLMESH_SKILL_MAX_BYTES",
        Skills,
        "`268435456` (256 MiB)",
        "Inflated bytes of one skill archive at most.",
    ),
    var(
        "TOOLMESH_SKILL_MAX_ENTRIES",
        Skills,
        "`10000`",
        "Entries of one skill archive at most.",
    ),
    var(
        "TOOLMESH_SKILL_DOWNLOAD_TIMEOUT_S",
        Skills,
        "`120`",
        "How long one Skill Service request or archive download may take.",
    ),
    var(
        "TOOLMESH_SKILL_ALLOW_HASH_MISMATCH",
        Skills,
        "`0`",
        "`1`: load an archive whose hash does not match, with a warning.",
    ),
    var(
        "TOOLMESH_SKILL_RUNNER_COMMAND",
        Skills,
        "unset (`execute_skills` answers `skill_runtime_disabled`)",
        "What `execute_skills` runs in the sandbox (`sh -c`): the prompt on stdin and in \
         `TOOLMESH_WORKFLOW_PROMPT`, the skills' names in `TOOLMESH_SKILL_NAMES`, the skills \
         under `/skills`.",
    ),
    var(
        "TOOLMESH_SKILL_ALLOWED_NETWORKS",
        Skills,
        "unset",
        "CIDRs a skill archive URL or redirect may reach although they are not public; the \
         Skill Service's own origin is always reachable.",
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
    use crate::settings::find;

    /// Each default written as a literal is the `const` the code uses.
    #[test]
    fn defaults_are_the_documented_consts() {
        let check = |name: &str, value: &dyn std::fmt::Display| {
            let var = find(VARIABLES, name).unwrap_or_else(|| panic!("{name} is not listed"));
            assert!(
                var.default_is(value),
                "{name}: {} is not `{value}`",
                var.default
            );
        };
        check("TOOLMESH_NATS_URL", &DEFAULT_NATS_URL);
        check("TOOLMESH_REDIS_URL", &DEFAULT_REDIS_URL);
        check("TOOLMESH_DATA_DIR", &DEFAULT_DATA_DIR);
        check("TOOLMESH_RESULT_BUDGET_CHARS", &DEFAULT_RESULT_BUDGET_CHARS);
        check(
            "TOOLMESH_REPLY_PREFIXES",
            &crate::replies::DEFAULT_REPLY_PREFIX,
        );
        check("TOOLMESH_DRAIN_TIMEOUT_S", &DEFAULT_DRAIN_TIMEOUT_S);
        check(
            "TOOLMESH_HTTP_HEADER_TIMEOUT_S",
            &crate::listener::DEFAULT_HEADER_TIMEOUT_S,
        );
        check(
            "TOOLMESH_HTTP_MAX_CONNECTIONS",
            &crate::listener::DEFAULT_MAX_CONNECTIONS,
        );
        check("TOOLMESH_EVENTS_MAX_AGE_S", &DEFAULT_EVENTS_MAX_AGE_S);
        check("TOOLMESH_EVENTS_MAX_BYTES", &DEFAULT_EVENTS_MAX_BYTES);
        check("TOOLMESH_AUDIT_MAX_AGE_S", &crate::audit::DEFAULT_MAX_AGE_S);
        check("TOOLMESH_SANDBOX_IMAGE", &DEFAULT_SANDBOX_IMAGE);
        check("TOOLMESH_SANDBOX_MEMORY_MB", &DEFAULT_SANDBOX_MEMORY_MB);
        check("TOOLMESH_SANDBOX_PIDS", &DEFAULT_SANDBOX_PIDS);
        check("TOOLMESH_SANDBOX_CPUS", &DEFAULT_SANDBOX_CPUS);
        check(
            "TOOLMESH_SANDBOX_MAX_SESSIONS",
            &DEFAULT_SANDBOX_MAX_SESSIONS,
        );
        check("TOOLMESH_SANDBOX_IDLE_TTL_S", &DEFAULT_SANDBOX_IDLE_TTL_S);
        check("TOOLMESH_SANDBOX_WARM", &DEFAULT_SANDBOX_WARM);
        check("TOOLMESH_SANDBOX_TMPFS_MB", &DEFAULT_SANDBOX_TMPFS_MB);
        check("TOOLMESH_SANDBOX_DISK_MB", &DEFAULT_SANDBOX_DISK_MB);
        check("TOOLMESH_SANDBOX_TIMEOUT_S", &DEFAULT_SANDBOX_TIMEOUT_S);
        check("TOOLMESH_SANDBOX_SYNC_MAX_FILES", &DEFAULT_SYNC_MAX_FILES);
        check(
            "TOOLMESH_SANDBOX_SYNC_MAX_FILE_BYTES",
            &DEFAULT_SYNC_MAX_FILE_BYTES,
        );
        check(
            "TOOLMESH_SANDBOX_SYNC_MAX_TOTAL_BYTES",
            &DEFAULT_SYNC_MAX_TOTAL_BYTES,
        );
        check(
            "TOOLMESH_SANDBOX_SYNC_MAX_ENTRIES",
            &DEFAULT_SYNC_MAX_ENTRIES,
        );
        check("TOOLMESH_SANDBOX_SYNC_MAX_DEPTH", &DEFAULT_SYNC_MAX_DEPTH);
        check(
            "TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES",
            &DEFAULT_SANDBOX_OUTPUT_MAX_BYTES,
        );
        check(
            "TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES",
            &DEFAULT_SANDBOX_SESSION_OUTPUT_MAX_BYTES,
        );
        check(
            "TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES",
            &DEFAULT_SANDBOX_WORKER_OUTPUT_MAX_BYTES,
        );
        check("TOOLMESH_SKILLS_DIR", &DEFAULT_SKILLS_DIR);
        check("TOOLMESH_SKILL_MAX_BYTES", &DEFAULT_SKILL_MAX_BYTES);
        check("TOOLMESH_SKILL_MAX_ENTRIES", &DEFAULT_SKILL_MAX_ENTRIES);
        check(
            "TOOLMESH_SKILL_DOWNLOAD_TIMEOUT_S",
            &DEFAULT_SKILL_DOWNLOAD_TIMEOUT_S,
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
        let unset = read(&RawEnv::default());
        let mut literals = 0;
        for var in VARIABLES {
            let Some(literal) = var.literal_default() else {
                continue;
            };
            let set = read(&RawEnv::from_pairs([(var.name, literal)]));
            assert_eq!(set, unset, "{}={literal} is not the default", var.name);
            literals += 1;
        }
        assert!(literals > 10, "{literals} defaults are literals");
    }
}
