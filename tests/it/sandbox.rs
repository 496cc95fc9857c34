//! The sandbox pool end to end: gateway → sandbox worker(s) → real Docker containers (and
//! bubblewrap for the process backend), with the workspace actor syncing files over NATS.
//!
//! Every test names its nodes uniquely and removes the containers they labelled when it ends,
//! so tests can run in parallel on one Docker engine.

use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use crate::support::{
    assert_error, assert_holds, assert_unavailable_within, node_failure, ok, strings, write_skill,
    Cluster,
};

const IMAGE: &str = "toolmesh/sandbox:latest";

/// A cluster whose sandbox containers are removed on drop, whatever happened.
pub(crate) struct SandboxCluster {
    pub(crate) c: Cluster,
}

impl std::ops::Deref for SandboxCluster {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.c
    }
}

impl std::ops::DerefMut for SandboxCluster {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.c
    }
}

impl Drop for SandboxCluster {
    fn drop(&mut self) {
        for node in &mut self.c.nodes {
            node.kill();
        }
        for id in containers_of(&self.c.node_prefix) {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v", &id])
                .output();
        }
    }
}

/// Containers labelled by nodes whose id starts with `prefix`.
fn containers_of(prefix: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=io.toolmesh.managed=1",
            "--format",
            "{{.ID}} {{.Label \"io.toolmesh.node\"}}",
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, node)| node.starts_with(prefix))
        .map(|(id, _)| id.to_owned())
        .collect()
}

pub(crate) fn unique_prefix() -> String {
    format!("sbxt{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// Servers only, the ids of their nodes of a [`unique_prefix`].
pub(crate) async fn unique_servers() -> Cluster {
    let mut c = Cluster::servers().await;
    c.node_prefix = unique_prefix();
    c
}

/// A node of gateway, approval and workspace and a sandbox worker of its own (node 1), both
/// with `env`.
async fn split_cluster(env: &[(&str, &str)]) -> SandboxCluster {
    let mut c = unique_servers().await;
    c.start_node("gateway,approval,workspace", env).await;
    c.start_node("sandbox", env).await;
    SandboxCluster { c }
}

pub(crate) const BASE_ENV: [(&str, &str); 3] = [
    ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
    ("TOOLMESH_SANDBOX_WARM", "1"),
    ("TOOLMESH_SANDBOX_MEMORY_MB", "256"),
];

/// One node with every role this test needs, Docker backend.
pub(crate) async fn cluster_with(extra: &[(&str, &str)]) -> SandboxCluster {
    let mut c = unique_servers().await;
    let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
    env.extend_from_slice(extra);
    c.start_node("gateway,approval,workspace,sandbox", &env)
        .await;
    SandboxCluster { c }
}

async fn cluster() -> SandboxCluster {
    cluster_with(&[]).await
}

pub(crate) async fn tool(c: &Cluster, session: &str, name: &str, args: Value) -> Value {
    c.session_call("acme", session, name, args).await
}

/// `run_command` of `command` (and no other argument) in `session` of acme.
pub(crate) async fn run(c: &Cluster, session: &str, command: &str) -> Value {
    tool(c, session, "run_command", json!({"command": command})).await
}

/// `run_command` of `command`, its stdout asserted to be `expected`: the reply.
async fn stdout_is(c: &Cluster, session: &str, command: &str, expected: &str) -> Value {
    let r = run(c, session, command).await;
    assert_eq!(r["stdout"], expected, "{command}: {r}");
    r
}

/// `run_command` of `command` with the other arguments `args`.
async fn run_with(c: &Cluster, session: &str, command: &str, mut args: Value) -> Value {
    args["command"] = command.into();
    tool(c, session, "run_command", args).await
}

/// `run_command` of `command` as a background task (its reply: the task's id).
async fn background(c: &Cluster, session: &str, command: &str) -> Value {
    run_with(c, session, command, json!({"background": true})).await
}

/// `command` started as a background task of session s1, asserted ok: the reply and the
/// task's id.
async fn task_started(c: &Cluster, command: &str) -> (Value, String) {
    let r = ok(background(c, "s1", command).await);
    let task = r["task_id"].as_str().unwrap().to_owned();
    (r, task)
}

/// `run_command` of `command` in a sandbox of `template`.
pub(crate) async fn run_template(c: &Cluster, session: &str, command: &str, id: &str) -> Value {
    run_with(c, session, command, json!({"template": id})).await
}

/// `run_command` of `command` with a `timeout` of `seconds`.
async fn run_timed(c: &Cluster, session: &str, command: &str, seconds: u64) -> Value {
    run_with(c, session, command, json!({"timeout": seconds})).await
}

pub(crate) async fn write_file(c: &Cluster, session: &str, path: &str, content: &str) -> Value {
    let args = json!({"path": path, "content": content});
    tool(c, session, "write_workspace_file", args).await
}

pub(crate) async fn read_file(c: &Cluster, session: &str, path: &str) -> Value {
    tool(c, session, "read_workspace_file", json!({"path": path})).await
}

pub(crate) async fn sandbox_status(c: &Cluster, session: &str) -> Value {
    tool(c, session, "sandbox_status", json!({})).await
}

async fn task_input(c: &Cluster, session: &str, task: &str, input: &str) -> Value {
    let args = json!({"task_id": task, "input": input});
    tool(c, session, "task_input", args).await
}

/// `execute_skills` of `skills` (a list, or anything else to see it refused).
pub(crate) async fn execute_skills(
    c: &Cluster,
    session: &str,
    prompt: &str,
    skills: Value,
) -> Value {
    let args = json!({"workflow_prompt": prompt, "skill_names": skills});
    tool(c, session, "execute_skills", args).await
}

/// `task_output` of `task` waiting (at most 20 s) for `pattern`.
async fn wait_output(c: &Cluster, session: &str, task: &str, pattern: &str) -> Value {
    wait_output_for(c, session, task, pattern, 20).await
}

/// `task_output` of `task` waiting at most `seconds` for `pattern`.
async fn wait_output_for(
    c: &Cluster,
    session: &str,
    task: &str,
    pattern: &str,
    seconds: u64,
) -> Value {
    let args = json!({"task_id": task, "wait_for_pattern": pattern, "timeout": seconds});
    tool(c, session, "task_output", args).await
}

pub(crate) fn docker_inspect(sandbox_id: &str) -> Value {
    let out = Command::new("docker")
        .args(["inspect", &format!("toolmesh-{sandbox_id}")])
        .output()
        .expect("docker inspect");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
    v[0].clone()
}

#[tokio::test]
async fn run_command_reports_every_field_of_the_seed() {
    let c = cluster().await;
    let r = ok(run(&c, "s1", "echo out; echo err >&2; exit 3").await);
    assert_eq!(r["backend"], "sandbox/docker");
    assert!(r["sandbox_id"].as_str().unwrap().starts_with("sbx-"), "{r}");
    assert_eq!(r["command"], "echo out; echo err >&2; exit 3");
    assert_eq!(r["stdout"], "out\n");
    assert_eq!(r["stderr"], "err\n");
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["stdout_truncated"], false);
    assert_eq!(r["stdout_original_chars"], 4);
    assert_eq!(r["stdout_preview_chars"], 4);
    assert_eq!(r["stderr_truncated"], false);
    assert_eq!(r["cwd"], "/workspace");
}

#[tokio::test]
async fn cwd_env_and_a_non_root_user() {
    let c = cluster().await;
    ok(write_file(&c, "s1", "sub/keep.txt", "x").await);
    let r = ok(tool(
        &c,
        "s1",
        "run_command",
        json!({"command": "pwd; echo $GREETING; id -u", "cwd": "sub", "env": {"GREETING": "hi"}}),
    )
    .await);
    assert_eq!(r["stdout"], "/workspace/sub\nhi\n1000\n");
    assert_eq!(r["cwd"], "/workspace/sub");
}

#[tokio::test]
async fn sessions_reuse_their_sandbox_and_are_separated() {
    let c = cluster().await;
    let a = ok(run(&c, "s1", "echo one > /tmp/state").await);
    let b = stdout_is(&c, "s1", "cat /tmp/state", "one\n").await;
    assert_eq!(a["sandbox_id"], b["sandbox_id"]);

    let other = stdout_is(&c, "s2", "cat /tmp/state || echo none", "none\n").await;
    assert_ne!(other["sandbox_id"], a["sandbox_id"]);
    let other_account = c
        .session_call(
            "globex",
            "s1",
            "run_command",
            json!({"command": "cat /tmp/state || echo none"}),
        )
        .await;
    assert_eq!(other_account["stdout"], "none\n", "{other_account}");
    assert_ne!(other_account["sandbox_id"], a["sandbox_id"]);

    let status = ok(sandbox_status(&c, "s1").await);
    assert_eq!(status["sandbox_id"], a["sandbox_id"]);
    for field in [
        "backend",
        "enabled",
        "isolated",
        "template_bound",
        "template_id",
        "timeout_seconds",
        "ttl_seconds",
        "idle_ttl_seconds",
        "max_sessions",
        "created_at",
        "last_used_at",
        "expires_at",
        "idle_seconds",
        "boundary",
    ] {
        assert!(
            status.get(field).is_some(),
            "sandbox_status lacks {field}: {status}"
        );
    }
    // PROTOCOL.md "Sandbox templates": the template's name, and its image beside it.
    assert_eq!(status["template_id"], "default");
    assert_eq!(status["template_bound"], true);
    assert_eq!(status["image"], IMAGE);
    let fresh = ok(sandbox_status(&c, "s9").await);
    assert_eq!(
        fresh["sandbox_id"],
        Value::Null,
        "status creates no sandbox"
    );
}

#[tokio::test]
async fn the_workspace_is_synced_in_and_changes_come_back() {
    let c = cluster().await;
    ok(write_file(&c, "s1", "data/in.txt", "from the workspace\n").await);
    let r = ok(run(&c, "s1", "cat data/in.txt && echo made > data/out.txt && rm data/in.txt && mkdir -p node_modules && echo x > node_modules/skip.js")
    .await);
    assert_eq!(r["stdout"], "from the workspace\n");
    let read = ok(read_file(&c, "s1", "data/out.txt").await);
    assert_eq!(read["content"], "     1\tmade\n");
    let gone = read_file(&c, "s1", "data/in.txt").await;
    assert_eq!(
        gone["error"], "not_found",
        "a file deleted in the sandbox is deleted: {gone}"
    );
    let skipped = read_file(&c, "s1", "node_modules/skip.js").await;
    assert_eq!(
        skipped["error"], "not_found",
        "node_modules is not synced: {skipped}"
    );
    // A change made through the workspace reaches the sandbox on the next command.
    write_file(&c, "s1", "data/out.txt", "again\n").await;
    stdout_is(&c, "s1", "cat data/out.txt", "again\n").await;
}

#[tokio::test]
async fn a_timeout_kills_the_command_and_says_so() {
    let c = cluster().await;
    let started = Instant::now();
    let r = run_timed(&c, "s1", "echo before; sleep 30 & sleep 30", 2).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"], "timeout");
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["stdout"], "before\n");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let ps = run(&c, "s1", "ps -eo args | grep -c '^sleep 30' || true").await;
    assert_eq!(
        ps["stdout"], "0\n",
        "the timed-out processes are gone: {ps}"
    );
}

/// A loop that leaves its process group and session and starts without `TOOLMESH_EXEC_ID`
/// (in its `/proc/<pid>/environ` too), double forked so that it is nobody's child, appending to `/workspace/<name>` 5 times a second.
fn escapee(name: &str) -> String {
    format!(
        "(unset TOOLMESH_EXEC_ID; setsid sh -c 'while :; do date >> /workspace/{name}; sleep 0.2; done' \
         </dev/null >/dev/null 2>&1 &)"
    )
}

/// In a later command of session s1: whether `/workspace/<name>` grows within a second, and
/// how many processes of its loop are left.
async fn still_ticking(c: &Cluster, name: &str) -> (bool, String) {
    let check = format!(
        "a=$(wc -c < /workspace/{name}); sleep 1; b=$(wc -c < /workspace/{name}); \
         [ \"$a\" = \"$b\" ] && echo still || echo grows; \
         ps -eo args | grep -c '^sh -c [w]hile :; do date >> /workspace/{name};' || true"
    );
    let r = ok(tool(c, "s1", "run_command", json!({"command": check})).await);
    let out = r["stdout"].as_str().unwrap_or_default().to_owned();
    let (grows, left) = out.split_once('\n').unwrap_or(("", ""));
    (grows == "grows", left.trim().to_owned())
}

/// Processes that left their command's group, session and marker end with it: at a timeout
/// (once `timeout` is answered), when it ends by itself, and when its background task is
/// killed — but a background task's escaped children run while it does.
async fn check_escapees_end_with_their_command(c: &Cluster) {
    let r = tool(
        c,
        "s1",
        "run_command",
        json!({"command": format!("{}; sleep 30", escapee("timed")), "timeout": 2}),
    )
    .await;
    assert_eq!(r["error"], "timeout", "{r}");
    assert_eq!(still_ticking(c, "timed").await, (false, "0".to_owned()));

    let r = tool(
        c,
        "s1",
        "run_command",
        json!({"command": format!("{}; until [ -s /workspace/ended ]; do sleep 0.05; done", escapee("ended"))}),
    )
    .await;
    assert_eq!(
        (&r["ok"], &r["exit_code"]),
        (&json!(true), &json!(0)),
        "{r}"
    );
    assert_eq!(still_ticking(c, "ended").await, (false, "0".to_owned()));

    let r = tool(
        c,
        "s1",
        "run_command",
        json!({"command": format!("{}; echo started; sleep 300", escapee("task")), "background": true}),
    )
    .await;
    let task = r["task_id"].as_str().expect("a task").to_owned();
    let out = wait_output(c, "s1", &task, "started").await;
    assert_eq!(out["matched"], true, "{out}");
    assert_eq!(
        still_ticking(c, "task").await,
        (true, "1".to_owned()),
        "a running task's children run"
    );
    let killed = tool(c, "s1", "kill_task", json!({"task_id": task})).await;
    assert_eq!(killed["status"], "killed", "{killed}");
    assert_eq!(still_ticking(c, "task").await, (false, "0".to_owned()));
}

#[tokio::test]
async fn escaped_processes_end_with_their_command() {
    let c = cluster().await;
    check_escapees_end_with_their_command(&c).await;
}

#[tokio::test]
async fn escaped_processes_end_with_their_command_in_exec_mode() {
    let c = cluster_with(&[("TOOLMESH_SANDBOX_DOCKER_COMMANDS", "exec")]).await;
    check_escapees_end_with_their_command(&c).await;
}

#[tokio::test]
async fn escaped_processes_end_with_their_command_in_bubblewrap() {
    let c = cluster_with(&[("TOOLMESH_SANDBOX_BACKEND", "process")]).await;
    check_escapees_end_with_their_command(&c).await;
}

/// `run_command` of `command` in session s1 of acme as `invocation`: the reply and the
/// RunEvents published for it, up to `finished`.
/// Waits (at most 60 s) for a `stdout` RunEvent of `events` that carries `text`.
async fn wait_for_stdout(events: &mut async_nats::Subscriber, text: &str) {
    let seen = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(msg) = events.next().await {
            let event: Value = serde_json::from_slice(&msg.payload).expect("event is JSON");
            if event["kind"] == "stdout" && event["data"].as_str().unwrap_or("").contains(text) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(seen, Ok(true), "no stdout event with {text:?}");
}

async fn run_with_events(c: &Cluster, invocation: &str, command: &str) -> (Value, Vec<Value>) {
    let mut events = c
        .watch(format!("toolmesh.v1.events.acme.{invocation}"))
        .await;
    let reply = c
        .call(
            "acme",
            json!({"tool": "run_command", "session_id": "s1", "invocation_id": invocation,
                   "arguments": {"command": command}}),
        )
        .await;
    let seen = crate::support::events_until_finished(&mut events, Duration::from_secs(2)).await;
    (reply, seen)
}

#[tokio::test]
async fn output_streams_as_events_before_the_reply() {
    let c = cluster().await;
    let (r, seen) =
        run_with_events(&c, "inv_stream_1", "echo first; sleep 0.5; echo second >&2").await;
    assert_eq!(r["ok"], true, "{r}");
    let kinds: Vec<&str> = seen.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["started", "stdout", "stderr", "finished"],
        "{seen:?}"
    );
    let seqs: Vec<u64> = seen.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    assert_eq!(seen[1]["data"], "first\n");
    assert_eq!(seen[2]["data"], "second\n");
}

#[tokio::test]
async fn a_character_split_between_writes_stays_whole_in_events_and_task_reads() {
    let c = cluster().await;
    // "€" is e2 82 ac; the command writes its first two bytes, waits past an event flush
    // (50 ms) and writes the third.
    let split_euro = r"printf '\342\202'; sleep 0.4; printf '\254\n'";
    let (r, seen) = run_with_events(&c, "inv_utf8_1", split_euro).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["stdout"], "€\n");
    let streamed: String = seen
        .iter()
        .filter(|e| e["kind"] == "stdout")
        .map(|e| e["data"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, "€\n", "no event may carry half a character");

    // Once the first two bytes are out, the command says so on stderr, and the read that
    // waits for that finds stdout still empty.
    let (_, task) = task_started(
        &c,
        r"printf '\342\202'; echo half >&2; sleep 2; printf '\254\n'; echo done",
    )
    .await;
    let early = wait_output(&c, "s1", &task, "half").await;
    assert_eq!(early["matched"], true, "{early}");
    assert_eq!(
        early["stdout"], "",
        "half a character stays for the next read: {early}"
    );
    let rest = wait_output(&c, "s1", &task, "done").await;
    assert_eq!(rest["stdout"], "€\ndone\n", "{rest}");
}

#[tokio::test]
async fn a_cancel_kills_the_running_command() {
    let c = cluster().await;
    let invocation = "inv_cancel_1";
    let mut events = c
        .watch(format!("toolmesh.v1.events.acme.{invocation}"))
        .await;
    let client = c.client.clone();
    let call = tokio::spawn(async move {
        toolmesh_testkit::request_json(
            &client,
            "toolmesh.v1.call.acme".to_owned(),
            json!({"tool": "run_command", "session_id": "s1", "invocation_id": invocation,
                   "arguments": {"command": "echo started; sleep 60"}}),
        )
        .await
    });
    // Wait until it runs (its first line is an event), then cancel.
    let started = Instant::now();
    wait_for_stdout(&mut events, "started").await;
    ok(c.cancel("acme", json!({"invocation_id": invocation})).await);
    let r = call.await.unwrap();
    assert_eq!(r["error"], "cancelled", "{r}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn run_code_runs_python_javascript_and_bash_snippets() {
    let c = cluster().await;
    for (language, code, expected) in [
        ("python", "import math\nprint(math.sqrt(16))", "4.0\n"),
        ("javascript", "console.log(1 + 1)", "2\n"),
        ("bash", "echo $((6 * 7))", "42\n"),
    ] {
        let r = tool(
            &c,
            "s1",
            "run_code",
            json!({"code": code, "language": language}),
        )
        .await;
        assert_eq!(r["ok"], true, "{language}: {r}");
        assert_eq!(r["stdout"], expected, "{language}: {r}");
        assert_eq!(r["execution_model"], "snippet_runner");
        assert_eq!(r["language"], language);
        assert!(
            r["path"]
                .as_str()
                .unwrap()
                .starts_with("/tmp/toolmesh-run-code-"),
            "{r}"
        );
        assert_eq!(r["exit_code"], 0);
        assert!(r["boundary"].as_str().is_some());
    }
    let r = tool(&c, "s1", "run_code", json!({"code": "raise SystemExit(4)"})).await;
    assert_eq!(r["ok"], true, "a non-zero exit is still ok: {r}");
    assert_eq!(r["exit_code"], 4);
}

#[tokio::test]
async fn background_tasks_poll_wait_feed_and_kill() {
    let c = cluster().await;
    let (r, task) = task_started(
        &c,
        "echo ready; read line; echo got:$line; sleep 0.2; echo done",
    )
    .await;
    assert_eq!(r["status"], "running");

    let out = ok(wait_output(&c, "s1", &task, "ready").await);
    assert_eq!(out["matched"], true);
    assert_eq!(out["stdout"], "ready\n");
    assert_eq!(out["status"], "running");

    ok(task_input(&c, "s1", &task, "hello\n").await);
    let out = wait_output(&c, "s1", &task, "done").await;
    assert_eq!(out["matched"], true, "{out}");
    assert_eq!(
        out["stdout"], "got:hello\ndone\n",
        "only output since the last read"
    );
    // The task ends by itself.
    let mut status = Value::Null;
    for _ in 0..50 {
        status = tool(&c, "s1", "task_output", json!({"task_id": task})).await;
        if status["status"] == "exited" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status["status"], "exited", "{status}");
    assert_eq!(status["exit_code"], 0);

    let wait = wait_output_for(&c, "s1", &task, "never", 1).await;
    assert_eq!(wait["ok"], true);
    assert_eq!(wait["matched"], false, "{wait}");

    let sleeper = background(&c, "s1", "sleep 300").await;
    let sleeper = sleeper["task_id"].as_str().unwrap().to_owned();
    let list = tool(&c, "s1", "list_tasks", json!({})).await;
    let tasks = list["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{list}");
    for t in tasks {
        for field in ["task_id", "command", "status", "started_at"] {
            assert!(t.get(field).is_some(), "{t}");
        }
    }
    let killed = ok(tool(&c, "s1", "kill_task", json!({"task_id": sleeper})).await);
    assert_eq!(killed["status"], "killed");

    // Another session, another account: not found.
    let other = tool(&c, "s2", "task_output", json!({"task_id": task})).await;
    assert_eq!(other["error"], "not_found", "{other}");
    let other = c
        .session_call("globex", "s1", "kill_task", json!({"task_id": task}))
        .await;
    assert_eq!(other["error"], "not_found", "{other}");
    let bad = wait_output_for(&c, "s1", &task, "(", 1).await;
    assert_eq!(bad["error"], "invalid_arguments", "{bad}");
}

#[tokio::test]
async fn containers_are_hardened() {
    let c = cluster().await;
    let r = ok(run(&c, "s1", "true").await);
    let inspect = docker_inspect(r["sandbox_id"].as_str().unwrap());
    let host = &inspect["HostConfig"];
    assert_eq!(host["NetworkMode"], "none", "{host}");
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert!(
        host["SecurityOpt"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s.as_str().unwrap().starts_with("no-new-privileges")),
        "{host}"
    );
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["Memory"], 256 * 1024 * 1024);
    assert_eq!(host["PidsLimit"], 256);
    assert_eq!(host["NanoCpus"], 1_000_000_000u64);
    assert!(host["Tmpfs"].get("/tmp").is_some(), "{host}");
    assert_eq!(inspect["Config"]["User"], "1000:1000");
    assert_eq!(inspect["Config"]["Labels"]["io.toolmesh.managed"], "1");
    let mounts = serde_json::to_string(&inspect["Mounts"]).unwrap();
    assert!(!mounts.contains("docker.sock"), "{mounts}");
    // And from inside: no network but loopback, no writes outside /workspace and /tmp.
    stdout_is(
        &c,
        "s1",
        "ls /sys/class/net; touch /etc/x 2>/dev/null && echo wrote || echo read-only",
        "lo\nread-only\n",
    )
    .await;
}

#[tokio::test]
async fn floods_and_bombs_stay_inside_the_sandbox() {
    let c = cluster_with(&[("TOOLMESH_SANDBOX_PIDS", "64")]).await;
    // The flood's 30 MB are persisted whole before the reply: on a loaded machine that takes
    // longer than the harness's default 10 s, so wait as long as the command's own timeout.
    let flood = toolmesh_testkit::request_json_within(
        &c.client,
        "toolmesh.v1.call.acme",
        json!({"tool": "run_command", "session_id": "s1", "arguments":
            {"command": "head -c 30000000 /dev/zero | tr '\\0' 'a'", "timeout": 60}}),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        flood["ok"],
        true,
        "{}",
        flood.to_string().chars().take(500).collect::<String>()
    );
    assert_eq!(flood["stdout_truncated"], true);
    assert!(flood["persisted_outputs"]["stdout"]["path"]
        .as_str()
        .unwrap()
        .starts_with(".toolmesh/outputs/"));
    let bomb = run_timed(
        &c,
        "s1",
        "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived",
        10,
    )
    .await;
    assert!(bomb["ok"] == true || bomb["error"] == "timeout", "{bomb}");
    let hog = ok(tool(
        &c,
        "s1",
        "run_code",
        json!({"code": "x = bytearray(1024 * 1024 * 1024)\nprint('allocated')", "timeout": 30}),
    )
    .await);
    assert_ne!(
        hog["exit_code"], 0,
        "a 1 GiB allocation in a 256 MiB sandbox fails: {hog}"
    );
    // The worker still answers, and the session still works.
    stdout_is(&c, "s2", "echo alive", "alive\n").await;
}

#[tokio::test]
async fn a_missing_image_is_unavailable_naming_the_fix() {
    let c = cluster_with(&[("TOOLMESH_SANDBOX_IMAGE", "toolmesh/no-such-image:latest")]).await;
    let r = run(&c, "s1", "true").await;
    assert_error(&r, "unavailable", "scripts/build-images");
}

#[tokio::test]
async fn a_burst_is_queued_not_failed() {
    let c = cluster_with(&[("TOOLMESH_SANDBOX_CONCURRENCY", "2")]).await;
    let calls = (0..12).map(|i| {
        let client = c.client.clone();
        async move {
            toolmesh_testkit::request_json(
                &client,
                "toolmesh.v1.call.acme".to_owned(),
                json!({"tool": "run_command", "session_id": format!("s{}", i % 3),
                       "arguments": {"command": format!("sleep 0.3; echo {i}")}}),
            )
            .await
        }
    });
    let replies = futures::future::join_all(calls).await;
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["stdout"], format!("{i}\n"));
    }
}

#[tokio::test]
async fn sessions_stay_on_their_worker_and_move_when_it_dies() {
    let mut c = unique_servers().await;
    c.start_node("gateway,approval,workspace", &BASE_ENV).await;
    let w1 = c.start_node("sandbox", &BASE_ENV).await;
    let w2 = c.start_node("sandbox", &BASE_ENV).await;
    let mut c = SandboxCluster { c };
    let first = ok(run(&c, "s1", "echo hi > /tmp/mark").await);
    let sandbox = first["sandbox_id"].clone();
    // Whatever worker the queue group picks, the session's sandbox serves every call: the
    // other one claims the session for a warm sandbox of its own (creating the command's exec
    // there meanwhile), loses the claim and hands the call over, with nothing run in it.
    let mut holder = None;
    for _ in 0..8 {
        let s = run(&c, "s1", "cat /tmp/mark; echo ran >> /tmp/runs").await;
        assert_eq!(s["sandbox_id"], sandbox, "{s}");
        assert_eq!(s["stdout"], "hi\n");
        let st = sandbox_status(&c, "s1").await;
        holder = Some(st["node_id"].as_str().unwrap().to_owned());
    }
    let holder = holder.unwrap();
    let (victim, other) = if c.nodes[w1].node_id == holder {
        (w1, w2)
    } else {
        (w2, w1)
    };
    assert_eq!(c.nodes[victim].node_id, holder);
    let runs = run(&c, "s1", "wc -l < /tmp/runs").await;
    assert_eq!(
        runs["stdout"], "8\n",
        "each call ran once, in the session's sandbox"
    );
    let others = containers_of(&c.nodes[other].node_id);
    assert!(!others.is_empty(), "the other worker keeps a warm sandbox");
    for id in others {
        let out = Command::new("docker")
            .args(["exec", &id, "sh", "-c", "ls -A /tmp /workspace"])
            .output()
            .expect("docker exec");
        assert!(out.status.success(), "{out:?}");
        let listed = String::from_utf8_lossy(&out.stdout);
        assert!(
            !listed.contains("runs") && !listed.contains("mark"),
            "nothing ran in the other worker's sandbox {id}: {listed}"
        );
    }

    // Kill the holder mid-command (once its first line is an event): the caller hears of it
    // well before its 120 s deadline.
    let mut events = c.watch("toolmesh.v1.events.acme.inv_holder_killed").await;
    let client = c.client.clone();
    let running = tokio::spawn(async move {
        toolmesh_testkit::request_json(
            &client,
            "toolmesh.v1.call.acme".to_owned(),
            json!({"tool": "run_command", "session_id": "s1", "invocation_id": "inv_holder_killed",
                   "arguments": {"command": "echo running; sleep 100", "timeout": 90}}),
        )
        .await
    });
    wait_for_stdout(&mut events, "running").await;
    let killed_at = Instant::now();
    c.nodes[victim].kill();
    let r = running.await.unwrap();
    assert_unavailable_within(&r, killed_at, Duration::from_secs(15));
    // The next call of the session runs on the surviving worker, in a new sandbox.
    let next = ok(run(&c, "s1", "cat /tmp/mark 2>/dev/null || echo fresh").await);
    assert_eq!(next["stdout"], "fresh\n");
    assert_ne!(next["sandbox_id"], sandbox);
}

/// A worker killed (so it could not remove its containers) and started again under its node
/// id removes what its previous run left, and its sessions get new sandboxes.
#[tokio::test]
async fn a_restarted_worker_removes_what_its_previous_run_left() {
    let mut c = unique_servers().await;
    c.start_node("gateway,approval,workspace", &BASE_ENV).await;
    // No warm pool: nothing is being created in the background when the worker is killed.
    let spec = c.spec(
        "sandbox",
        &[
            ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
            ("TOOLMESH_SANDBOX_WARM", "0"),
        ],
    );
    let c = SandboxCluster { c };
    let mut first = spec.clone().start(&c.client).await;
    let r = ok(run(&c, "s1", "true").await);
    let left = containers_of(&spec.node_id);
    assert!(!left.is_empty(), "the session's sandbox exists");
    first.kill();
    assert_eq!(
        containers_of(&spec.node_id),
        left,
        "a killed worker removes nothing"
    );
    // Its sandbox's disk (TOOLMESH_SANDBOX_DISK_MB) is still mounted too.
    let folder = c
        .data_dir
        .path()
        .join("sandboxes")
        .join(&spec.node_id)
        .join(r["sandbox_id"].as_str().unwrap());
    let folder_text = folder.canonicalize().unwrap().display().to_string();
    assert_eq!(mounts_under(c.data_dir.path()), [folder_text]);

    let _second = spec.start(&c.client).await;
    // Reaped at the start, before anything new is made: unmounted, then removed.
    assert_eq!(mounts_under(c.data_dir.path()), Vec::<String>::new());
    assert!(!folder.exists(), "{} is gone", folder.display());
    let deadline = Instant::now() + Duration::from_secs(30);
    while left
        .iter()
        .any(|id| containers_of(&spec.node_id).contains(id))
    {
        assert!(
            Instant::now() < deadline,
            "the previous run's containers are still there: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let next = ok(run(&c, "s1", "true").await);
    assert_ne!(next["sandbox_id"], r["sandbox_id"]);
}

/// The process backend end to end, with the node's binary in a folder the sandbox user
/// cannot enter (a clone under a private `mktemp -d`, or `/root/.cargo/bin`): the worker
/// stages its spawner into the sandbox directory.
#[tokio::test]
async fn the_process_backend_runs_in_bubblewrap() {
    use std::os::unix::fs::PermissionsExt;
    let mut c = unique_servers().await;
    let private = tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .expect("temp dir");
    let binary = private.path().join("toolmesh");
    if std::fs::hard_link(crate::support::BIN, &binary).is_err() {
        std::fs::copy(crate::support::BIN, &binary).expect("copy the node binary");
    }
    let mut spec = c.spec(
        "gateway,approval,workspace,sandbox",
        &[
            ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
            ("TOOLMESH_SANDBOX_BACKEND", "process"),
        ],
    );
    spec.binary = binary;
    let node = spec.start(&c.client).await;
    c.nodes.push(node);
    let c = SandboxCluster { c };
    write_file(&c, "s1", "in.txt", "hello").await;
    let r = ok(run(&c, "s1", "cat in.txt; echo; id -u; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' \\n'; echo; echo out > made.txt; touch /usr/x 2>/dev/null && echo wrote || echo read-only")
    .await);
    assert_eq!(r["backend"], "sandbox/process");
    let lines: Vec<&str> = r["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines[0], "hello");
    assert_ne!(lines[1], "0", "not root inside: {r}");
    assert_eq!(lines[2].trim(), "lo", "no network but loopback: {r}");
    assert_eq!(lines[3], "read-only");
    let read = read_file(&c, "s1", "made.txt").await;
    assert_eq!(read["content"], "     1\tout\n", "{read}");
    let status = sandbox_status(&c, "s1").await;
    assert_eq!(status["backend"], "sandbox/process");
    assert!(status["boundary"].as_str().unwrap().len() > 20);

    // One sandbox per session, as with Docker: its /tmp outlives a command, and another
    // session does not see it.
    let keep = run(&c, "s1", "echo kept > /tmp/keep").await;
    assert_eq!(keep["exit_code"], 0, "{keep}");
    stdout_is(&c, "s1", "cat /tmp/keep", "kept\n").await;
    let other = run(&c, "s2", "cat /tmp/keep 2>&1 || true").await;
    assert_holds(&other, "stdout", "No such file");

    // A command may kill everything of its uid, the spawner included: the sandbox dies, the
    // next call says so, and the one after gets a new sandbox.
    let before = sandbox_status(&c, "s1").await;
    let _ = run(&c, "s1", "kill -9 -1").await;
    let gone = run(&c, "s1", "true").await;
    if gone["ok"] == false {
        assert_eq!(gone["error"], "unavailable", "{gone}");
    }
    let fresh = stdout_is(
        &c,
        "s1",
        "cat /tmp/keep 2>/dev/null || echo fresh",
        "fresh\n",
    )
    .await;
    assert_ne!(fresh["sandbox_id"], before["sandbox_id"], "{fresh}");
}

#[tokio::test]
async fn execute_skills_without_a_runner_says_how_to_enable_it() {
    let c = cluster().await;
    let r = execute_skills(&c, "s1", "draw a diagram", json!(["demo"])).await;
    assert_eq!(r["error"], "skill_runtime_disabled", "{r}");
    assert_holds(&r, "hint", "TOOLMESH_SKILL_RUNNER_COMMAND");
    let status = sandbox_status(&c, "s1").await;
    assert_eq!(
        status["sandbox_id"],
        Value::Null,
        "no sandbox was created for it: {status}"
    );
}

#[tokio::test]
async fn execute_skills_runs_the_runner_with_the_skills_mounted_read_only() {
    let skills = tempfile::tempdir().unwrap();
    write_skill(
        skills.path(),
        "demo",
        "---\nname: demo\ndescription: says hello\nversion: 1.0.0\n---\nRun scripts/hello.sh.\n",
        "echo hello from the skill\n",
    );
    let skills_dir = skills.path().display().to_string();
    let runner = "sh /skills/demo/scripts/hello.sh; echo \"names=$TOOLMESH_SKILL_NAMES\"; \
                  echo \"prompt=$(cat)\"; echo \"env=$TOOLMESH_WORKFLOW_PROMPT\"; \
                  echo result > report.txt; touch /skills/demo/x 2>/dev/null || echo read-only; \
                  [ \"$TOOLMESH_WORKFLOW_PROMPT\" != fail ] || exit 3";
    let mut c = unique_servers().await;
    let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
    env.extend_from_slice(&[
        ("TOOLMESH_SKILLS_DIR", skills_dir.as_str()),
        ("TOOLMESH_SKILL_RUNNER_COMMAND", runner),
    ]);
    c.start_node("gateway,approval,workspace,sandbox,skills", &env)
        .await;
    let c = SandboxCluster { c };
    let r = ok(execute_skills(&c, "s1", "greet the user", json!(["demo"])).await);
    assert_eq!(
        r["stdout"],
        "hello from the skill\nnames=demo\nprompt=greet the user\nenv=greet the user\nread-only\n"
    );
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["execution_context"], "skill-runtime/sandbox/docker");
    assert_eq!(r["output_files"], json!(["report.txt"]));
    assert!(r["duration_ms"].as_u64().is_some());
    let report = read_file(&c, "s1", "report.txt").await;
    assert_eq!(report["content"], "     1\tresult\n", "{report}");

    let missing = execute_skills(&c, "s1", "x", json!("nope")).await;
    assert_eq!(missing["error"], "skill_not_found", "{missing}");

    let failed = execute_skills(&c, "s1", "fail", json!(["demo"])).await;
    assert_eq!(failed["error"], "command_failed", "{failed}");
    assert_eq!(failed["exit_code"], 3);
    assert!(
        failed["stdout"]
            .as_str()
            .unwrap()
            .starts_with("hello from the skill\n"),
        "{failed}"
    );
}

#[tokio::test]
async fn a_redis_restart_does_not_fail_the_next_new_session() {
    let mut c = cluster().await;
    ok(run(&c, "s1", "echo one").await);
    c.c.redis.restart();
    // The worker's registry connection was dropped; the first claim after it must still work.
    let r = ok(run(&c, "s2", "echo two").await);
    assert_eq!(r["stdout"], "two\n");
}

#[tokio::test]
async fn an_approval_is_given_back_when_the_worker_cannot_run_the_call() {
    let c = cluster_with(&[
        ("TOOLMESH_TOOL_APPROVAL_MODE", "strict"),
        ("TOOLMESH_APPROVAL_IN_BAND", "0"),
        ("TOOLMESH_SANDBOX_IMAGE", "toolmesh/no-such-image:latest"),
    ])
    .await;
    let args = json!({"command": "true"});
    let first = tool(&c, "s1", "run_command", args.clone()).await;
    assert_eq!(first["error"], "approval_required", "{first}");
    let id = first["approval_request"]["id"].as_str().unwrap().to_owned();
    assert_eq!(c.decide("acme", &id, true).await["ok"], true);
    let call = json!({"tool": "run_command", "session_id": "s1", "arguments": args,
                      "approval": {"id": id}});
    let r = c.call("acme", call.clone()).await;
    assert_eq!(r["error"], "unavailable", "{r}");
    assert_eq!(
        r["approval_released"], true,
        "nothing ran, so the approval is back: {r}"
    );
    let again = c.call("acme", call).await;
    assert_eq!(
        again["error"], "unavailable",
        "the same approval still passes the gate: {again}"
    );
    assert_eq!(again["approval_released"], true, "{again}");
}

/// Removes the container of `session`'s sandbox behind its worker's back; the session's next
/// call is `unavailable` (that reply).
async fn remove_sandbox_container(c: &Cluster, session: &str, sandbox: &str) -> Value {
    let removed = Command::new("docker")
        .args(["rm", "-f", &format!("toolmesh-{sandbox}")])
        .output()
        .expect("docker rm");
    assert!(removed.status.success(), "{removed:?}");
    let gone = run(c, session, "true").await;
    assert_eq!(gone["error"], "unavailable", "{gone}");
    gone
}

#[tokio::test]
async fn a_removed_container_is_replaced_on_the_next_call() {
    let c = cluster().await;
    let first = ok(run(&c, "s1", "touch /tmp/mark").await);
    let sandbox = first["sandbox_id"].as_str().unwrap().to_owned();
    // The worker learns of it from Docker: that call says so, the next one gets a new sandbox.
    let gone = remove_sandbox_container(&c, "s1", &sandbox).await;
    assert_error(&gone, "unavailable", "is gone");
    let next = stdout_is(
        &c,
        "s1",
        "cat /tmp/mark 2>/dev/null || echo fresh",
        "fresh\n",
    )
    .await;
    assert_ne!(next["sandbox_id"], sandbox.as_str());
}

/// Whether process `pid` has a handler for SIGTERM (its `SigCgt` mask, /proc/PID/status).
fn handles_sigterm(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (15 - 1)) != 0)
}

/// A worker told to stop while it is still starting handles the signal from its start,
/// drains once up, while its warm-up creates sandboxes, and exits 0 leaving no container and
/// no folder (a SIGTERM before its handler existed killed it, or was ignored by a worker that
/// is PID 1 in a container, leaving what its warm-up made).
#[tokio::test]
async fn a_worker_stopped_during_its_start_drains_and_leaves_nothing() {
    let redis = toolmesh_testkit::RedisServer::start();
    let nats = toolmesh_testkit::NatsServer::start();
    let port = nats.port();
    let data = tempfile::tempdir().expect("temp dir");
    let node_id = format!("{}-1", unique_prefix());
    let mut child = Command::new(crate::support::BIN)
        .args(["node", "--roles", "sandbox"])
        .env("TOOLMESH_NODE_ID", &node_id)
        .env("TOOLMESH_NATS_URL", format!("nats://127.0.0.1:{port}"))
        .env("TOOLMESH_REDIS_URL", redis.url())
        .env("TOOLMESH_DATA_DIR", data.path())
        .env("TOOLMESH_SANDBOX_WARM", "2")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("toolmesh node starts");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !handles_sigterm(child.id()) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the node exited during its start"
        );
        assert!(
            Instant::now() < deadline,
            "the node does not handle SIGTERM while it starts"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The signal lands while the actors start (NATS answers at once): the warm-up is making
    // containers, and the node must drain them rather than die and leave them.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the node did not drain and exit within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let left = containers_of(&node_id);
    for id in &left {
        let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
    }
    assert!(status.success(), "drained, not killed: {status}");
    assert_eq!(left, Vec::<String>::new(), "no container is left");
    let folder = data.path().join("sandboxes").join(&node_id);
    assert!(!folder.exists(), "{} is removed", folder.display());
}

/// The peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    memory(pid, "VmHWM")
}

/// The size in kB of `field` of `/proc/<pid>/status`, in bytes.
fn memory(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc status"));
    kb * 1024
}

/// A file of acme's session `session` in the workspace, as the workspace actor keeps it.
fn workspace_file(c: &Cluster, session: &str, path: &str) -> std::path::PathBuf {
    c.data_dir
        .path()
        .join("accounts/acme/sessions")
        .join(session)
        .join("workspace")
        .join(path)
}

#[tokio::test]
async fn output_past_8_mib_is_counted_and_persisted_whole_in_flat_memory() {
    let c = split_cluster(&BASE_ENV).await;
    ok(run(&c, "s1", "echo warm").await);
    let worker = c.nodes[1].pid();
    let before = peak_rss(worker);

    // 4,000,000 lines of 12 characters in 14 bytes: 56 MB.
    let line = "héllo wörld\n";
    let lines = 4_000_000;
    let r = tool(
        &c,
        "s1",
        "run_command",
        json!({"command": format!("yes 'héllo wörld' | head -n {lines}"), "timeout": 60}),
    )
    .await;
    let head: String = r.to_string().chars().take(600).collect();
    assert_eq!(r["ok"], true, "{head}");
    assert_eq!(r["stdout_truncated"], true, "{head}");
    assert_eq!(
        r["stdout_original_chars"],
        12 * lines,
        "every character counted: {head}"
    );
    assert_eq!(r["stdout_preview_chars"], 20000);
    let persisted = &r["persisted_outputs"]["stdout"];
    assert_eq!(persisted["bytes"], 14 * lines, "{persisted}");
    assert!(persisted.get("truncated").is_none(), "{persisted}");
    let path = workspace_file(&c, "s1", persisted["path"].as_str().unwrap());
    let text = std::fs::read(&path).expect("the persisted output");
    assert_eq!(text.len(), 14 * lines as usize);
    assert!(
        text == line.repeat(lines as usize).as_bytes(),
        "the persisted output is the whole stream"
    );

    // Holding the stream would take its 56 MB; what a flat pipe-to-spool path takes varies with
    // the load beside it (the blocking pool's threads and their allocator arenas): 10 MB alone,
    // up to 19 MB amid the whole suite on two cores.
    let growth = peak_rss(worker).saturating_sub(before);
    assert!(
        growth < 28 * 1024 * 1024,
        "the worker's peak memory grew by {growth} bytes for 56 MB of output"
    );
    // The spool files on the worker are gone once persisted.
    let spooled: Vec<_> = walk_files(&c.data_dir.path().join("sandboxes"))
        .into_iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "outputs"))
        .collect();
    assert!(spooled.is_empty(), "{spooled:?}");
}

/// Every file under `dir`, recursively.
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk_files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test]
async fn output_past_the_cap_is_counted_and_the_reply_says_it_was_cut() {
    let c = cluster_with(&[("TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES", "1048576")]).await;
    let r = run_timed(
        &c,
        "s1",
        "head -c 3000000 /dev/zero | tr '\\0' 'a'; echo err >&2",
        60,
    )
    .await;
    let head: String = r.to_string().chars().take(600).collect();
    assert_eq!(r["ok"], true, "{head}");
    assert_eq!(r["stdout_original_chars"], 3_000_000, "{head}");
    let persisted = &r["persisted_outputs"]["stdout"];
    assert_eq!(persisted["truncated"], true, "{persisted}");
    assert_eq!(persisted["max_bytes"], 1_048_576);
    assert_eq!(persisted["bytes"], 1_048_576);
    let path = workspace_file(&c, "s1", persisted["path"].as_str().unwrap());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1_048_576);
    assert_eq!(r["stderr"], "err\n");

    // A background task's unread output is kept up to the same cap; a read says what it lost.
    let (_, task) = task_started(
        &c,
        "head -c 3000000 /dev/zero | tr '\\0' 'b'; echo; echo finished",
    )
    .await;
    let (out, head) = output_once_exited(&c, &task).await;
    assert_eq!(out["stdout_original_chars"], 3_000_000 + 10, "{head}");
    assert_eq!(
        out["persisted_outputs"]["stdout"]["truncated"], true,
        "{head}"
    );
    assert_eq!(out["persisted_outputs"]["stdout"]["bytes"], 1_048_576);
    assert_eq!(out["dropped_bytes"], 3_000_010 - 1_048_576, "{head}");
}

/// The output of `task`, the first task of session s1, once it has exited (waited for at most
/// 30 s), asserted ok: the reply and its first 600 characters (a reply's head for messages).
async fn output_once_exited(c: &Cluster, task: &str) -> (Value, String) {
    let exited = toolmesh_testkit::wait_until(Duration::from_secs(30), || async move {
        let list = tool(c, "s1", "list_tasks", json!({})).await;
        list["tasks"][0]["status"] == "exited"
    })
    .await;
    assert!(exited, "the task did not end");
    let out = tool(c, "s1", "task_output", json!({"task_id": task})).await;
    let head: String = out.to_string().chars().take(600).collect();
    assert_eq!(out["ok"], true, "{head}");
    (out, head)
}

/// The resident memory of process `pid` now (VmRSS), in bytes.
fn rss(pid: u32) -> u64 {
    memory(pid, "VmRSS")
}

/// Bytes of the spool files on the worker (every `outputs` folder under the sandboxes).
fn spooled_bytes(c: &Cluster) -> u64 {
    walk_files(&c.data_dir.path().join("sandboxes"))
        .into_iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "outputs"))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

#[tokio::test]
async fn ended_tasks_past_the_kept_count_are_dropped_and_unread_output_goes_to_the_workspace() {
    // 36 tasks of 3 MB unread output each: without the caps the worker would keep 108 MB; with
    // them it keeps at most the session's cap and hands the rest to the workspace.
    let session_cap: u64 = 16 * 1024 * 1024;
    let cap = session_cap.to_string();
    // The worker is a node of its own, so its memory is the sandbox role's alone: the
    // workspace, which takes in the ~90 MB handed to it, runs in the other node.
    let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
    env.push(("TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES", &cap));
    let c = split_cluster(&env).await;
    ok(run(&c, "s1", "echo warm").await);
    let worker = c.nodes[1].pid();
    let before = rss(worker);
    let kept = 32; // tasks::MAX_ENDED_TASKS
    let mut ids = Vec::new();
    for _batch in 0..3 {
        for _ in 0..12 {
            let r = ok(background(&c, "s1", "head -c 3000000 /dev/zero | tr '\\0' 'x'").await);
            ids.push(r["task_id"].as_str().unwrap().to_owned());
        }
        // Wait until this batch has ended (at most 16 run at once).
        let cluster: &Cluster = &c;
        let ended = toolmesh_testkit::wait_until(Duration::from_secs(60), || async move {
            let list = tool(cluster, "s1", "list_tasks", json!({})).await;
            list["tasks"]
                .as_array()
                .is_some_and(|t| t.iter().all(|t| t["status"] == "exited"))
        })
        .await;
        assert!(ended, "a batch of tasks did not end");
    }
    let list = tool(&c, "s1", "list_tasks", json!({})).await;
    let listed = strings(&list, "tasks", "task_id");
    assert_eq!(listed.len(), kept, "{list}");
    // The first to end went first: four of the first batch (its tasks end in any order).
    let dropped: Vec<&String> = ids.iter().filter(|id| !listed.contains(id)).collect();
    assert_eq!(dropped.len(), ids.len() - kept, "{list}");
    for id in dropped {
        assert!(ids[..12].contains(id), "{id} of a later batch was dropped");
        let out = tool(&c, "s1", "task_output", json!({"task_id": id})).await;
        assert_error(&out, "not_found", "dropped");
    }

    let spooled = spooled_bytes(&c);
    assert!(
        spooled <= session_cap,
        "{spooled} bytes of unread output spooled, over the session's cap of {session_cap}"
    );
    // Without the spool and the caps the worker would hold all 108 MB. Right after the burst
    // it also holds the allocator's caches of the blocking-pool threads that spooled: about
    // 10 MB alone, 50 MB beside other heavy work, hence the bound.
    let growth = rss(worker).saturating_sub(before);
    assert!(
        growth < 96 * 1024 * 1024,
        "the worker's memory grew by {growth} bytes"
    );
    // Every kept task's unread output was counted whole, each of its parts in the workspace
    // is what it says, and what the cap dropped (a producer faster than the workspace) is
    // said; far more than the session's cap went to the workspace.
    let mut persisted = 0;
    for id in &listed {
        let out = tool(&c, "s1", "task_output", json!({"task_id": id})).await;
        let head: String = out.to_string().chars().take(600).collect();
        assert_eq!(out["ok"], true, "{head}");
        assert_eq!(out["stdout_original_chars"], 3_000_000, "{head}");
        let entry = &out["persisted_outputs"]["stdout"];
        let parts = match entry["parts"].as_array() {
            Some(parts) => parts.clone(),
            None if entry.is_object() => vec![entry.clone()],
            None => Vec::new(),
        };
        let mut bytes = 0;
        for part in &parts {
            let path = workspace_file(&c, "s1", part["path"].as_str().unwrap());
            let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(text.iter().all(|&b| b == b'x'), "{part}");
            assert_eq!(part["bytes"], text.len(), "{part}");
            bytes += text.len() as u64;
        }
        let dropped = out["dropped_bytes"].as_u64().unwrap_or(0);
        if dropped > 0 {
            assert_eq!(out["dropped_by"], "session", "{head}");
        }
        if !parts.is_empty() {
            assert_eq!(bytes + dropped, 3_000_000, "{head}");
        }
        persisted += bytes;
    }
    // The worker keeps at most the cap, so what went past it went to the workspace: before
    // the hand-over, reads could find at most the cap.
    assert!(
        persisted > session_cap,
        "{persisted} bytes went to the workspace; the session's cap is {session_cap}"
    );
}

/// Bytes of the parts of `task`'s output handed to the workspace of session `session`.
fn handed_over_bytes(c: &Cluster, session: &str, task: &str) -> u64 {
    let dir = workspace_file(c, session, ".toolmesh/outputs");
    walk_files(&dir)
        .into_iter()
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with(task) && name.contains("-part-")
        })
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// `seq 1 n` as text.
fn seq_text(n: u64) -> String {
    (1..=n).map(|i| format!("{i}\n")).collect()
}

/// A task writes 15 MB, in 20 pieces the test asks for, past a shared cap of 4 MiB set by
/// `variable`: the worker never spools more than the cap, and the whole output is in the
/// workspace files `persisted_outputs.stdout.parts` names. Each piece is asked for once the
/// one before is on the worker's disk or in the workspace and no part is on its way, so
/// nothing depends on how fast the workspace is.
async fn task_output_past_a_shared_cap_goes_whole_to_the_workspace(variable: &str) {
    let cap: u64 = 4 * 1024 * 1024;
    let c = cluster_with(&[(variable, &cap.to_string())]).await;
    let started = ok(tool(
        &c,
        "s1",
        "run_command",
        json!({
            "command": "i=0; while read n && [ \"$n\" != end ]; do seq $((i+1)) $((i+n)); i=$((i+n)); done",
            "background": true,
        }),
    )
    .await);
    let task = started["task_id"].as_str().unwrap().to_owned();
    let piece: u64 = 100_000; // lines: at most 800 KB, under a quarter of the cap
    for k in 1..=20u64 {
        ok(tool(
            &c,
            "s1",
            "task_input",
            json!({"task_id": task, "input": format!("{piece}\n")}),
        )
        .await);
        let expected = seq_text(k * piece).len() as u64;
        let (cluster, task): (&Cluster, &str) = (&c, &task);
        let arrived = toolmesh_testkit::wait_until(Duration::from_secs(60), || async move {
            let spooled = spooled_bytes(cluster);
            assert!(
                spooled <= cap,
                "{spooled} bytes spooled, over the cap of {cap}"
            );
            // All but the last write batch (64 KiB, in memory) on disk here or there, and
            // no part on its way (one holds more than half the cap).
            let handed = handed_over_bytes(cluster, "s1", task);
            spooled + handed + 64 * 1024 >= expected && spooled <= cap / 2
        })
        .await;
        assert!(
            arrived,
            "piece {k}: {} bytes spooled, {} in the workspace, of {expected}",
            spooled_bytes(&c),
            handed_over_bytes(&c, "s1", task)
        );
    }
    ok(task_input(&c, "s1", &task, "end\n").await);

    let (out, head) = output_once_exited(&c, &task).await;
    let expected = seq_text(20 * piece);
    assert_eq!(out["stdout_original_chars"], expected.len(), "{head}");
    assert!(out.get("dropped_bytes").is_none(), "{head}");
    let persisted = &out["persisted_outputs"]["stdout"];
    let parts = persisted["parts"].as_array().expect("parts");
    assert!(parts.len() >= 3, "{persisted}");
    assert_eq!(
        persisted["path"],
        parts.last().unwrap()["path"],
        "{persisted}"
    );
    let mut text = Vec::new();
    for part in parts {
        let path = workspace_file(&c, "s1", part["path"].as_str().unwrap());
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(part["bytes"], bytes.len(), "{part}");
        text.extend_from_slice(&bytes);
    }
    assert!(
        text == expected.as_bytes(),
        "the parts are the whole output, in order"
    );
    // What the worker spooled goes once it is read.
    let cluster: &Cluster = &c;
    let freed = toolmesh_testkit::wait_until(Duration::from_secs(10), || async move {
        spooled_bytes(cluster) == 0
    })
    .await;
    assert!(freed, "{} bytes still spooled", spooled_bytes(&c));
}

#[tokio::test]
async fn task_output_past_the_session_cap_goes_whole_to_the_workspace() {
    task_output_past_a_shared_cap_goes_whole_to_the_workspace(
        "TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES",
    )
    .await;
}

#[tokio::test]
async fn task_output_past_the_worker_cap_goes_whole_to_the_workspace() {
    task_output_past_a_shared_cap_goes_whole_to_the_workspace(
        "TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES",
    )
    .await;
}

#[tokio::test]
async fn wait_for_pattern_matches_line_by_line() {
    let c = cluster().await;
    for (command, pattern, expect) in [
        (
            "printf 'line-1\\nline-2\\nline-3\\n'; sleep 300",
            "line-[3-9]$",
            "line-3\n",
        ),
        (
            "echo starting; sleep 0.3; echo READY now; sleep 300",
            "^READY now$",
            "READY now\n",
        ),
    ] {
        let started = ok(tool(
            &c,
            "s1",
            "run_command",
            json!({"command": command, "background": true}),
        )
        .await);
        let task = started["task_id"].as_str().unwrap().to_owned();
        // Under the client's 10 s request timeout: a pattern that never matches answers
        // `matched: false` rather than no reply.
        let out = tool(
            &c,
            "s1",
            "task_output",
            json!({"task_id": task, "wait_for_pattern": pattern, "timeout": 5}),
        )
        .await;
        assert_eq!(out["matched"], true, "{pattern}: {out}");
        assert!(
            out["stdout"].as_str().unwrap().ends_with(expect),
            "{pattern}: {out}"
        );
        assert_eq!(out["status"], "running");
        ok(tool(&c, "s1", "kill_task", json!({"task_id": task})).await);
    }
}

/// The permission bits of a file on disk (links not followed).
fn mode_on_disk(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[tokio::test]
async fn exec_bits_and_empty_folders_travel_and_setuid_never_does() {
    let c = cluster().await;
    let ws = c
        .data_dir
        .path()
        .join("accounts/acme/sessions/s1/workspace");
    // Made in the sandbox: an executable script, a setuid file, an empty folder.
    let r = ok(run(&c, "s1", "printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod +x run.sh \
            && echo x > suid.sh && chmod 4755 suid.sh && mkdir -p empty/inner && stat -c %a suid.sh")
    .await);
    assert_eq!(r["stdout"], "4755\n", "the sandbox set the bit: {r}");
    let sandbox = r["sandbox_id"].as_str().unwrap().to_owned();
    assert_eq!(mode_on_disk(&ws.join("run.sh")) & 0o111, 0o111, "{r}");
    assert_eq!(
        mode_on_disk(&ws.join("suid.sh")),
        0o755,
        "setuid never reaches the workspace"
    );
    let listed = ok(tool(&c, "s1", "list_workspace_files", json!({"path": "empty"})).await);
    assert_eq!(listed["entries"][0]["path"], "empty/inner", "{listed}");
    assert_eq!(listed["entries"][0]["type"], "dir", "{listed}");

    // An empty folder in the workspace: a write, then a delete of its only file.
    for (name, args) in [
        (
            "write_workspace_file",
            json!({"path": "data/only.txt", "content": "x"}),
        ),
        ("delete_workspace_file", json!({"path": "data/only.txt"})),
    ] {
        let r = tool(&c, "s1", name, args).await;
        assert_eq!(r["ok"], true, "{name}: {r}");
    }

    // The sandbox is recreated: the new one gets it all from the workspace.
    remove_sandbox_container(&c, "s1", &sandbox).await;
    let r = run(&c, "s1", "./run.sh && stat -c %a suid.sh && test -d empty/inner && test -d data && ls -A data | wc -l")
    .await;
    assert_ne!(r["sandbox_id"], sandbox.as_str(), "{r}");
    assert_eq!(r["stdout"], "ran\n755\n0\n", "{r}");
}

/// Mount points under `dir` in this test process's mount namespace (the node's, and the
/// Docker daemon's, on this host).
fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|m| m.starts_with(&prefix))
        .collect()
}

/// A sandbox's folder on the host: `<data>/sandboxes/<node>/<sandbox_id>`.
fn sandbox_folder(c: &Cluster, sandbox_id: &str) -> std::path::PathBuf {
    c.data_dir
        .path()
        .join("sandboxes")
        .join(&c.nodes[0].node_id)
        .join(sandbox_id)
}

/// Size of the filesystem holding `path` (statvfs, through `stat -f`), bytes.
fn filesystem_bytes(path: &std::path::Path) -> u64 {
    let out = Command::new("stat")
        .args(["-f", "-c", "%b %S"])
        .arg(path)
        .output()
        .expect("stat -f");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    it.next().unwrap() * it.next().unwrap()
}

/// Issue 16 item 5, both backends: with `TOOLMESH_SANDBOX_DISK_MB=64` a command that writes
/// past 64 MiB gets "No space left on device" inside the sandbox, the sandbox's folder is a
/// filesystem of at most 64 MiB (an image inside that folder), the session goes on working,
/// and a drain leaves no mount and no folder behind.
async fn a_sandbox_writes_no_more_than_its_disk_quota(mut c: SandboxCluster) {
    let r = ok(run(
        &c,
        "s1",
        "fallocate -l 65M /workspace/big; echo rc=$?; \
            dd if=/dev/zero of=/workspace/fill bs=1M count=80 2>&1 | grep -c 'No space left'",
    )
    .await);
    let out = format!("{}{}", r["stdout"], r["stderr"]);
    assert!(out.contains("No space left on device"), "{r}");
    assert_holds(&r, "stdout", "rc=1");
    assert_eq!(
        r["stdout"].as_str().unwrap().lines().last(),
        Some("1"),
        "{r}"
    );
    let sandbox = r["sandbox_id"].as_str().unwrap().to_owned();
    let folder = sandbox_folder(&c, &sandbox);
    let folder_text = folder.canonicalize().unwrap().display().to_string();
    assert!(
        mounts_under(c.data_dir.path()).contains(&folder_text),
        "the sandbox's folder is a mount point: {:?}",
        mounts_under(c.data_dir.path())
    );
    let size = filesystem_bytes(&folder);
    assert!(size <= 64 * 1024 * 1024, "a disk of {size} bytes");

    // The session goes on once it made room.
    stdout_is(
        &c,
        "s1",
        "rm -f /workspace/big /workspace/fill && echo fine > ok.txt && cat ok.txt",
        "fine\n",
    )
    .await;
    ok(read_file(&c, "s1", "ok.txt").await);

    // A drain removes every sandbox: no mount, no folder, no image is left.
    c.nodes[0].terminate();
    assert!(
        c.nodes[0]
            .wait_exit(Duration::from_secs(40))
            .await
            .is_some(),
        "the node drains"
    );
    assert_eq!(mounts_under(c.data_dir.path()), Vec::<String>::new());
    assert!(!folder.exists(), "{} is gone", folder.display());
}

#[tokio::test]
async fn a_docker_sandbox_writes_no_more_than_its_disk_quota() {
    let c = cluster_with(&[("TOOLMESH_SANDBOX_DISK_MB", "64")]).await;
    a_sandbox_writes_no_more_than_its_disk_quota(c).await;
}

#[tokio::test]
async fn a_process_sandbox_writes_no_more_than_its_disk_quota() {
    let mut c = unique_servers().await;
    c.start_node(
        "gateway,approval,workspace,sandbox",
        &[
            ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
            ("TOOLMESH_SANDBOX_BACKEND", "process"),
            ("TOOLMESH_SANDBOX_DISK_MB", "64"),
        ],
    )
    .await;
    a_sandbox_writes_no_more_than_its_disk_quota(SandboxCluster { c }).await;
}

/// Issue 16 item 5: a workspace that does not fit into the sandbox's disk answers
/// `limit_exceeded` naming `TOOLMESH_SANDBOX_DISK_MB` (the command does not run on a partial
/// copy), and once the workspace is small enough again the session works.
#[tokio::test]
async fn a_workspace_bigger_than_the_disk_quota_is_limit_exceeded() {
    let c = cluster_with(&[("TOOLMESH_SANDBOX_DISK_MB", "16")]).await;
    ok(write_file(&c, "s1", "small.txt", "x").await);
    let ws = c
        .data_dir
        .path()
        .join("accounts/acme/sessions/s1/workspace");
    // 24 MiB in three files, each under the sync's file cap (10 MiB).
    for i in 0..3 {
        std::fs::write(ws.join(format!("big{i}.bin")), vec![7u8; 8 * 1024 * 1024]).unwrap();
    }
    let r = run(&c, "s1", "echo ran > ran.txt").await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"], "limit_exceeded", "{r}");
    let message = r["error_message"].as_str().unwrap();
    assert!(message.contains("TOOLMESH_SANDBOX_DISK_MB"), "{r}");
    assert!(message.contains("did not run"), "{r}");
    assert!(!ws.join("ran.txt").exists(), "the command did not run");

    for i in 0..3 {
        std::fs::remove_file(ws.join(format!("big{i}.bin"))).unwrap();
    }
    let r = ok(run(&c, "s1", "ls; echo ran > ran.txt").await);
    assert_eq!(r["stdout"], "small.txt\n", "{r}");
}

/// Issue 16 item 9: `/proc/self/mountinfo` in a sandbox names no host path of its folders
/// and not the node: the workspace, skills and run directory come from the sandbox's own disk
/// (their roots are `/workspace`, `/skills`, `/run`). What stays visible is Docker's own
/// (`/etc/hosts`… under the daemon's folder) and the staged spawner under
/// `$TOOLMESH_SANDBOX_DIR/.spawner/`.
#[tokio::test]
async fn mountinfo_in_a_sandbox_names_no_node_and_no_sandbox_folder() {
    let c = cluster().await;
    let r = ok(run(&c, "s1", "cat /proc/self/mountinfo").await);
    let table = r["stdout"].as_str().unwrap();
    let node = &c.nodes[0].node_id;
    assert!(!table.contains(node.as_str()), "{table}");
    for (mount, root) in [
        ("/workspace", "/workspace"),
        ("/skills", "/skills"),
        ("/run/toolmesh", "/run"),
    ] {
        let line = table
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(mount))
            .unwrap_or_else(|| panic!("{mount} in {table}"));
        assert_eq!(line.split(' ').nth(3), Some(root), "{line}");
    }
}

/// Issue 16 item 5: a worker asked for a disk quota that it cannot keep (no CAP_SYS_ADMIN)
/// does not start, and says which variable to set to 0.
#[tokio::test]
async fn a_worker_that_cannot_mount_refuses_to_start() {
    let mut c = unique_servers().await;
    let spec = c.spec(
        "sandbox",
        &[
            ("TOOLMESH_SANDBOX_DISK_MB", "64"),
            ("TOOLMESH_SANDBOX_BACKEND", "process"),
        ],
    );
    let setpriv = [
        "setpriv",
        "--bounding-set=-sys_admin",
        "--inh-caps=-sys_admin",
        "--",
    ];
    let stderr = node_failure(&spec, &setpriv, Duration::from_secs(30)).await;
    assert!(stderr.contains("TOOLMESH_SANDBOX_DISK_MB=64"), "{stderr}");
    assert!(stderr.contains("TOOLMESH_SANDBOX_DISK_MB=0"), "{stderr}");
    assert_eq!(
        mounts_under(c.data_dir.path()),
        Vec::<String>::new(),
        "nothing left mounted"
    );
}

/// Another account's `component_status`, called back to back until `stop`: the slowest answer.
async fn bystander(
    client: async_nats::Client,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Duration {
    let mut slowest = Duration::ZERO;
    while !*stop.borrow() {
        let started = Instant::now();
        ok(toolmesh_testkit::request_json_within(
            &client,
            "toolmesh.v1.call.bystander",
            json!({"tool": "component_status", "session_id": "b1"}),
            Duration::from_secs(60),
        )
        .await);
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    slowest
}

/// Removes a folder with the sandbox's own deleter when dropped.
struct LeftTree(std::path::PathBuf);

impl Drop for LeftTree {
    fn drop(&mut self) {
        let _ = toolmesh_sandbox::remove::remove_tree(&self.0);
    }
}

/// A command makes a 20,000-deep chain of 200-character folders (issue 16, items 1 and 2):
/// while the session syncs it, another account is answered promptly (the walk runs off the
/// async threads, bounded); the sync says it cut the walk; when the idle session is removed,
/// its folder goes from the host, and the node lives on.
#[tokio::test]
async fn a_deep_tree_neither_stalls_the_node_nor_outlives_its_sandbox() {
    let c = cluster_with(&[("TOOLMESH_SANDBOX_IDLE_TTL_S", "4")]).await;
    // Dropped before the cluster: a tree left by a failure goes without overflowing this
    // test's stack in the data dir's `remove_dir_all`.
    let _left = LeftTree(c.data_dir.path().join("sandboxes"));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(bystander(c.client.clone(), stopped));
    let deep = "python3 -c \"import os\nfor _ in range(20000):\n    os.mkdir('d' * 200)\n    os.chdir('d' * 200)\"";
    let made = ok(toolmesh_testkit::request_json_within(
        &c.client,
        "toolmesh.v1.call.acme",
        json!({"tool": "run_command", "session_id": "s1",
            "arguments": {"command": deep, "timeout": 120}}),
        Duration::from_secs(120),
    )
    .await);
    assert_eq!(made["exit_code"], 0, "{made}");
    assert_eq!(made["workspace_sync"]["truncated"], true, "{made}");
    let sandbox = made["sandbox_id"].as_str().unwrap().to_owned();
    // Every command's sync walks the tree again.
    for _ in 0..3 {
        let r = run(&c, "s1", "true").await;
        assert_eq!(r["workspace_sync"]["truncated"], true, "{r}");
    }
    stop.send(true).unwrap();
    let slowest = watcher.await.unwrap();
    assert!(
        slowest < Duration::from_secs(1),
        "another account waited {slowest:?} while a session synced a deep tree"
    );

    // Idle for its TTL, the session goes, and its folder with the whole tree.
    let folder = c
        .data_dir
        .path()
        .join("sandboxes")
        .join(format!("{}-1", c.node_prefix))
        .join(&sandbox);
    assert!(folder.join("workspace").join("d".repeat(200)).is_dir());
    let deadline = Instant::now() + Duration::from_secs(120);
    while folder.exists() {
        assert!(
            Instant::now() < deadline,
            "{} is still on the host",
            folder.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let r = run(&c, "s2", "echo alive").await;
    assert_eq!(r["stdout"], "alive\n", "the node lives on: {r}");
}

/// Sends `call` straight to `role`'s run subject, past the gateway, and returns the actor's
/// reply (a long-running role's claim skipped).
async fn call_actor(
    c: &Cluster,
    role: toolmesh_kernel::Role,
    call: &toolmesh_kernel::wire::ActorCall,
) -> toolmesh_kernel::wire::ActorReply {
    let inbox = c.client.new_inbox();
    let mut replies = c.client.subscribe(inbox.clone()).await.unwrap();
    toolmesh_kernel::host::confirm_subscriptions(&c.client)
        .await
        .unwrap();
    let subject = toolmesh_kernel::subjects::internal::run(role);
    let body = serde_json::to_vec(call).unwrap();
    c.client
        .publish_with_reply(subject, inbox, body.into())
        .await
        .unwrap();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), replies.next())
            .await
            .unwrap_or_else(|_| panic!("{role} answers {}", call.tool))
            .expect("subscription open");
        if toolmesh_kernel::host::claimant(&msg).is_none() {
            return serde_json::from_slice(&msg.payload).expect("an ActorReply");
        }
    }
}

/// One table per actor, and a name outside it reaches no code of another tool: sent straight
/// to an actor (as a gateway with another registry would), a name its table lacks is
/// `unknown_tool` before anything else about the call is looked at (here: a missing session),
/// and no sandbox is made for it.
#[tokio::test]
async fn an_actor_answers_a_name_outside_its_table_unknown_tool() {
    use toolmesh_kernel::wire::{ActorCall, InvocationContext};
    use toolmesh_kernel::{Account, InvocationId, Role, SessionId};

    let mut c = SandboxCluster {
        c: unique_servers().await,
    };
    let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
    env.push(("TOOLMESH_SANDBOX_WARM", "0"));
    c.start_node("workspace,sandbox,skills,web", &env).await;
    let cases = [
        (Role::Workspace, "run_code"),
        (Role::Workspace, "nope"),
        (Role::Sandbox, "read_workspace_file"),
        (Role::Sandbox, "nope"),
        (Role::Skills, "execute_skills"),
        (Role::Web, "tool_search"),
    ];
    for (role, tool) in cases {
        for session in [None, Some("s1")] {
            let call = ActorCall {
                invocation: InvocationContext {
                    account: Account::parse("acme").unwrap(),
                    invocation_id: InvocationId::parse("inv-unknown-tool").unwrap(),
                    session_id: session.map(|s| SessionId::parse(s).unwrap()),
                    user_id: None,
                    agent_id: None,
                },
                tool: tool.into(),
                arguments: json!({"command": "touch /workspace/ran", "code": "print(1)"}),
                event_seq: 1,
                direct: None,
            };
            let reply = call_actor(&c, role, &call).await;
            assert_eq!(
                reply.reply["error"], "unknown_tool",
                "{role} {tool} {session:?}: {:?}",
                reply.reply
            );
        }
    }
    assert!(
        containers_of(&c.node_prefix).is_empty(),
        "no sandbox is made for a tool the worker does not have"
    );
}
