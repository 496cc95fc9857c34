//! The variables only the sandbox worker reads, for the configuration reference
//! ([`toolmesh_kernel::settings`]): its own section, and the skill runner that
//! `execute_skills` runs in a sandbox.

use toolmesh_kernel::settings::{Component, Variable};

/// The sandbox worker's variables.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TOOLMESH_SANDBOX_BACKEND",
        component: Component::Sandbox,
        default: "`docker`",
        description: "`docker` (a container per session) or `process` (bubblewrap on the \
                      worker's host).",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_DOCKER_COMMANDS",
        component: Component::Sandbox,
        default: "`spawner`",
        description: "`spawner`: the worker's binary, bound read-only into each container, forks \
                      every command there (the image must run a glibc binary); `exec`: a `docker \
                      exec` per command (any image).",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_IMAGE",
        component: Component::Sandbox,
        default: "`toolmesh/sandbox:latest`",
        description: "The sandbox image, for every template that names none.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_IMAGES",
        component: Component::Sandbox,
        default: "unset (only `TOOLMESH_SANDBOX_IMAGE`)",
        description: "Other images a worker may run (comma-separated allow-list); a template \
                      naming an image not listed is refused.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_MEMORY_MB",
        component: Component::Sandbox,
        default: "`1024`",
        description: "Memory of one sandbox, MiB, for every template that names none.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_PIDS",
        component: Component::Sandbox,
        default: "`256`",
        description: "Processes one sandbox may hold at once, for every template that names \
                      none.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_CPUS",
        component: Component::Sandbox,
        default: "`1`",
        description: "CPUs one sandbox may use (a fraction is allowed), for every template that \
                      names none.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_NETWORK",
        component: Component::Sandbox,
        default: "`none`",
        description: "The Docker network of the template `default`: `none` keeps its sandboxes \
                      offline, any other name opens that network on purpose.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_EGRESS_JOIN",
        component: Component::Sandbox,
        default: "unset (the worker runs on the host)",
        description: "The container the worker runs in (name, id, or `self`: the one its \
                      hostname names). The egress network of `network = \"allow\"` templates \
                      joins it and the proxy listens there.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_DIR",
        component: Component::Sandbox,
        default: "the folder `sandboxes` in `TOOLMESH_DATA_DIR`",
        description: "The worker's copies of session workspaces and its staged spawner. Docker \
                      binds it into containers by its path, so a worker in a container must see \
                      it at the host's path.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_MAX_SESSIONS",
        component: Component::Sandbox,
        default: "`32`",
        description: "Sandboxes one worker holds; a full worker ends the caller's own idle \
                      session first, never one running a background task.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT",
        component: Component::Sandbox,
        default: "half of `TOOLMESH_SANDBOX_MAX_SESSIONS`, at least 1",
        description: "Sandboxes one worker holds for one account; at it a new session ends the \
                      account's own oldest idle one, or is `limit_exceeded` when none is idle.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_IDLE_TTL_S",
        component: Component::Sandbox,
        default: "`900`",
        description: "A session's sandbox is removed after this many seconds unused.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_REGISTRY",
        component: Component::Sandbox,
        default: "`redis`",
        description: "Where the workers keep which worker holds each session: `redis`, or \
                      `jetstream` (the key-value bucket `TOOLMESH_SANDBOX_SESSIONS`, so a worker \
                      needs only NATS, as at a site behind a leaf node). The same on every \
                      worker of a cluster.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_WARM",
        component: Component::Sandbox,
        default: "`2`",
        description: "Started sandboxes a worker keeps ready for new sessions.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_CONCURRENCY",
        component: Component::Sandbox,
        default: "2 × cores",
        description: "Commands one worker runs at once; more wait in order.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_TMPFS_MB",
        component: Component::Sandbox,
        default: "`256`",
        description: "Size of a sandbox's `/tmp` and home, MiB.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_DISK_MB",
        component: Component::Sandbox,
        default: "`4096`",
        description: "Each sandbox's own disk, MiB: a loop-mounted ext4 image over its folder, \
                      so writing past it fails with \"No space left on device\". Needs a root \
                      worker that shares mounts with the Docker daemon; `0`: a plain folder on \
                      the host's disk, no quota.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_DISK_REQUIRED",
        component: Component::Sandbox,
        default: "`1`",
        description: "`1`: a worker that cannot keep the disk quota of \
                      `TOOLMESH_SANDBOX_DISK_MB` does not start; `0`: it runs without one and \
                      says so in its log and in `sandbox_status`.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_TIMEOUT_S",
        component: Component::Sandbox,
        default: "`60`",
        description: "A command's timeout when the call gives none.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_SYNC_MAX_FILES",
        component: Component::Sandbox,
        default: "`2000`",
        description: "Files and directories a workspace sync into a sandbox carries at most.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_SYNC_MAX_FILE_BYTES",
        component: Component::Sandbox,
        default: "`10485760` (10 MiB)",
        description: "Size of one file a workspace sync carries at most.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_SYNC_MAX_TOTAL_BYTES",
        component: Component::Sandbox,
        default: "`67108864` (64 MiB)",
        description: "Bytes one workspace sync carries at most.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_SYNC_MAX_ENTRIES",
        component: Component::Sandbox,
        default: "`10000`",
        description: "Entries of every kind (links and skipped names too) the walk of a \
                      sandbox's `/workspace` after a command reads; past it the reply's \
                      `workspace_sync` says `truncated: true`.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_SYNC_MAX_DEPTH",
        component: Component::Sandbox,
        default: "`64`",
        description: "Levels below `/workspace` that walk goes at most; deeper, `workspace_sync` \
                      says `truncated: true`.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES",
        component: Component::Sandbox,
        default: "`268435456` (256 MiB)",
        description: "Text of one command output stream a worker spools and persists; past it \
                      the stream is counted, not kept, and `persisted_outputs` says `truncated: \
                      true`.",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES",
        component: Component::Sandbox,
        default: "`1073741824` (1 GiB)",
        description: "Unread background-task output one session keeps on the worker's disk. Text \
                      that finds no room is counted, not kept (`dropped_by: \"session\"`).",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES",
        component: Component::Sandbox,
        default: "`4294967296` (4 GiB)",
        description: "The same for all sessions of one worker (`dropped_by: \"worker\"`).",
    },
    Variable {
        name: "TOOLMESH_SANDBOX_TEMPLATES",
        component: Component::Sandbox,
        default: "unset (only the template `default`)",
        description: "A TOML file of sandbox templates (image, limits, network, warm sandboxes) a \
                      session may name (docs/PROTOCOL.md \"Sandbox templates\").",
    },
    Variable {
        name: "TOOLMESH_SKILL_RUNNER_COMMAND",
        component: Component::Skills,
        default: "unset (`execute_skills` answers `skill_runtime_disabled`)",
        description: "What `execute_skills` runs in the sandbox (`sh -c`): the prompt on stdin \
                      and in `TOOLMESH_WORKFLOW_PROMPT`, the skills' names in \
                      `TOOLMESH_SKILL_NAMES`, the skills under `/skills`.",
    },
];
