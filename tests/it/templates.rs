//! Sandbox templates end to end (PROTOCOL.md "Sandbox templates"): the templates file checked at
//! start, limits and runtime on real containers, a session bound to its first template, skills
//! that name a template, warm pools per template, `network = "allow"` through the worker's
//! egress proxy, and gVisor (`runtime = "runsc"`) in both
//! command paths with the hardening of the `sandbox::` tests.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use toolmesh_testkit::wait_until;

use crate::sandbox::{
    cluster_with, docker_inspect, execute_skills, read_file, run, run_template, sandbox_status,
    tool, unique_servers, SandboxCluster, BASE_ENV,
};
use crate::support::{
    assert_holds, events_until_finished, node_failure, node_refusal, ok, temp_file, Cluster,
};

/// A templates file in a folder of its own (kept while the test runs).
fn templates_file(text: &str) -> (tempfile::TempDir, String) {
    let (dir, file) = temp_file("templates.toml", text);
    (dir, file.display().to_string())
}

const TEMPLATES: &str = r#"
[templates.small]
memory_mb = 300
cpus = 0.5
pids = 100
idle_ttl_s = 120

[templates.eager]
warm = 1
memory_mb = 200
"#;

#[tokio::test]
async fn a_bad_templates_file_stops_the_node_naming_the_template_and_field() {
    let (_dir, file) =
        templates_file("[templates.py]\nimage = \"toolmesh/sandbox:latest\"\ncpus = \"two\"\n");
    let stderr = node_refusal("sandbox", &[("TOOLMESH_SANDBOX_TEMPLATES", &file)]);
    assert!(stderr.contains("templates.py.cpus"), "{stderr}");
    assert!(stderr.contains("must be a number"), "{stderr}");

    // An image outside the allow-list is refused the same way.
    let (_dir, file) = templates_file("[templates.evil]\nimage = \"evil/miner:latest\"\n");
    let stderr = node_refusal("sandbox", &[("TOOLMESH_SANDBOX_TEMPLATES", &file)]);
    assert!(stderr.contains("templates.evil.image"), "{stderr}");
    assert!(stderr.contains("TOOLMESH_SANDBOX_IMAGES"), "{stderr}");
}

#[tokio::test]
async fn an_allow_list_without_the_docker_backend_stops_the_node() {
    let (_dir, file) = templates_file(
        "[templates.net]\nnetwork = \"allow\"\nallow = [\"pypi.org\", \"*.pythonhosted.org\"]\n",
    );
    let mut c = Cluster::servers().await;
    let spec = c.spec(
        "sandbox",
        &[
            ("TOOLMESH_SANDBOX_TEMPLATES", file.as_str()),
            ("TOOLMESH_SANDBOX_BACKEND", "process"),
            ("RUST_LOG", "warn"),
        ],
    );
    let stderr = node_failure(&spec, &[], Duration::from_secs(60)).await;
    assert!(stderr.contains("\"net\""), "{stderr}");
    assert!(stderr.contains("network = \"allow\""), "{stderr}");
    assert!(stderr.contains("docker backend"), "{stderr}");
}

/// Removes the egress network (and its host rules) of `node` in `scope` on drop, after the
/// cluster's containers went: a failed test's killed node cannot.
#[derive(Default)]
struct ReapEgress {
    scope: String,
    node: String,
}

impl ReapEgress {
    /// Reaps, on drop, what the first node of `c` leaves.
    fn first_node_of(&mut self, c: &Cluster) {
        self.scope = c.data_dir.path().join("sandboxes").display().to_string();
        self.node = c.nodes[0].node_id.clone();
    }
}

impl Drop for ReapEgress {
    fn drop(&mut self) {
        let (scope, node) = (self.scope.clone(), self.node.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let docker = bollard::Docker::connect_with_local_defaults().unwrap();
                toolmesh_sandbox::egress::reap_orphans(&docker, &scope, &node, None).await
            })
        })
        .join();
    }
}

#[tokio::test]
async fn an_allow_list_template_reaches_its_targets_through_the_proxy_only() {
    check_egress(&[]).await;
}

#[tokio::test]
async fn an_allow_list_template_reaches_its_targets_in_exec_mode_too() {
    check_egress(&[("TOOLMESH_SANDBOX_DOCKER_COMMANDS", "exec")]).await;
}

async fn check_egress(extra: &[(&str, &str)]) {
    let (port, other) = (
        toolmesh_testkit::http_target().await,
        toolmesh_testkit::http_target().await,
    );
    let (_dir, file) = templates_file(&format!(
        "[templates.net]\nnetwork = \"allow\"\nallow = [\"127.0.0.1/32:{port}\"]\n"
    ));
    let mut reap = ReapEgress::default();
    let mut env = vec![
        ("TOOLMESH_SANDBOX_TEMPLATES", file.as_str()),
        ("TOOLMESH_METRICS_LISTEN", crate::metrics::LISTEN),
    ];
    env.extend_from_slice(extra);
    let mut c = cluster_with(&env).await;
    let metrics_port = crate::metrics::port(&c.nodes[0]);
    reap.first_node_of(&c);
    let invocation = "inv_egress_1";
    let mut events = c
        .watch(format!("toolmesh.v1.events.acme.{invocation}"))
        .await;
    // `/hello` through the proxy on the allowed port and on another one, then the allowed port
    // directly at the proxy's address.
    let command = toolmesh_testkit::egress_probe_command(&json!([
        ["get", format!("http://127.0.0.1:{port}/hello")],
        ["get", format!("http://127.0.0.1:{other}/hello")],
        ["direct_to_proxy", port],
    ]));
    let r = ok(c
        .call(
            "acme",
            json!({"tool": "run_command", "session_id": "s1", "invocation_id": invocation,
                   "arguments": {"command": command, "template": "net"}}),
        )
        .await);
    assert_eq!(r["exit_code"], 0, "{r}");
    let got: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim()).expect("{r}");
    assert_eq!(got[0], json!([200, "hello from /hello"]), "{got}");
    assert_eq!(got[1][0], 403, "a port not listed: {got}");
    assert_ne!(got[2], "connected", "a direct connection: {got}");
    let network = docker_inspect(r["sandbox_id"].as_str().unwrap())["HostConfig"]["NetworkMode"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(network.starts_with("toolmesh-egress-"), "{network}");

    let seen = events_until_finished(&mut events, Duration::from_secs(5)).await;
    let seqs: Vec<u64> = seen.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..seen.len() as u64).collect::<Vec<_>>(), "{seen:?}");
    let egress: Vec<Value> = seen
        .iter()
        .filter(|e| e["kind"] == "egress")
        .map(|e| json!({"host": e["host"], "port": e["port"], "allowed": e["allowed"]}))
        .collect();
    assert_eq!(
        egress,
        vec![
            json!({"host": "127.0.0.1", "port": port, "allowed": true}),
            json!({"host": "127.0.0.1", "port": other, "allowed": false}),
        ],
        "{seen:?}"
    );
    // The same decisions, counted (`toolmesh_egress_decisions_total`).
    let scraped = crate::metrics::scrape(metrics_port).await;
    for (allowed, n) in [("true", 1.0), ("false", 1.0)] {
        let labels = [("source", "sandbox"), ("allowed", allowed)];
        let counted = crate::metrics::value(&scraped, "toolmesh_egress_decisions_total", &labels);
        assert_eq!(counted, n, "allowed={allowed}");
    }

    // A drained worker takes its egress network along.
    let node = &mut c.nodes[0];
    assert!(
        node.stop_blocking(Duration::from_secs(60)),
        "the node drains"
    );
    let left = Command::new("docker")
        .args(["network", "inspect", &network])
        .output()
        .unwrap();
    assert!(!left.status.success(), "{network} is left after the drain");
}

/// docs/templates.md's example: `pip install` from PyPI through an allow-list of `pypi.org` and
/// `*.pythonhosted.org` (PyPI is reachable from this machine's host), and an index on another
/// host refused. The proxy's decisions are the command's `egress` events.
#[tokio::test]
async fn pip_installs_from_pypi_through_the_allow_list_and_nothing_else() {
    // Where this machine reaches PyPI through an intercepting mirror (a non-public address
    // and a CA of its own), the allow-list names the mirror's addresses and pip gets its CA:
    // what a user behind such a mirror does too (docs/templates.md).
    let mut allow = vec![
        "\"pypi.org\"".to_owned(),
        "\"*.pythonhosted.org\"".to_owned(),
    ];
    for host in ["pypi.org:443", "files.pythonhosted.org:443"] {
        for addr in tokio::net::lookup_host(host).await.expect("PyPI resolves") {
            if addr.is_ipv4() {
                allow.push(format!("\"{}/32:443\"", addr.ip()));
            }
        }
    }
    let extra_ca: String = std::fs::read_dir("/usr/local/share/ca-certificates")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "crt"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    let (_dir, file) = templates_file(&format!(
        "[templates.py-net]\nnetwork = \"allow\"\nallow = [{}]\n",
        allow.join(", ")
    ));
    let mut reap = ReapEgress::default();
    let c = cluster_with(&[("TOOLMESH_SANDBOX_TEMPLATES", file.as_str())]).await;
    reap.first_node_of(&c);
    let invocation = "inv_pip_1";
    let mut events = c
        .watch(format!("toolmesh.v1.events.acme.{invocation}"))
        .await;
    let pip = "{ cat /etc/ssl/certs/ca-certificates.crt; printf '%s\\n' \"$EXTRA_CA\"; } > /workspace/ca.crt \
        && export PIP_CERT=/workspace/ca.crt \
        && python3 -m venv /workspace/.venv && P=/workspace/.venv/bin/pip \
        && $P install -q --disable-pip-version-check --no-cache-dir six \
        && /workspace/.venv/bin/python -c 'import six; print(\"six\", six.__version__)' \
        && ! $P download -q --no-cache-dir --retries 0 --timeout 10 -d /workspace/dl \
             --index-url https://example.com/simple six 2>/workspace/refused.txt \
        && echo refused";
    let r = ok(toolmesh_testkit::request_json_within(
        &c.client,
        "toolmesh.v1.call.acme",
        json!({"tool": "run_command", "session_id": "pip", "invocation_id": invocation,
               "arguments": {"command": pip, "template": "py-net", "timeout": 300,
                             "env": {"EXTRA_CA": extra_ca}}}),
        Duration::from_secs(320),
    )
    .await);
    assert_eq!(r["exit_code"], 0, "{r}");
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("six 1."), "{r}");
    assert!(stdout.trim_end().ends_with("refused"), "{r}");

    let decisions: Vec<(String, u64, bool)> =
        events_until_finished(&mut events, Duration::from_secs(10))
            .await
            .iter()
            .filter(|e| e["kind"] == "egress")
            .map(|e| {
                (
                    e["host"].as_str().unwrap().to_owned(),
                    e["port"].as_u64().unwrap(),
                    e["allowed"].as_bool().unwrap(),
                )
            })
            .collect();
    // A decision on port 443 for each host (`*.` any of its subdomains), allowed or not.
    for (host, allowed) in [
        ("pypi.org", true),
        ("*.pythonhosted.org", true),
        ("example.com", false),
    ] {
        let matches = |seen: &str| match host.strip_prefix('*') {
            Some(suffix) => seen.ends_with(suffix),
            None => seen == host,
        };
        assert!(
            decisions
                .iter()
                .any(|(seen, port, a)| matches(seen) && *port == 443 && *a == allowed),
            "{host} allowed={allowed}: {decisions:?}"
        );
    }
    assert!(
        decisions
            .iter()
            .all(|(host, _, allowed)| *allowed != (host == "example.com")),
        "{decisions:?}"
    );
}

#[tokio::test]
async fn template_limits_are_what_docker_inspect_shows() {
    let (_dir, file) = templates_file(TEMPLATES);
    let c = cluster_with(&[("TOOLMESH_SANDBOX_TEMPLATES", file.as_str())]).await;
    let r = ok(run_template(&c, "s1", "true", "small").await);
    let host = docker_inspect(r["sandbox_id"].as_str().unwrap())["HostConfig"].clone();
    assert_eq!(host["Memory"], 300 * 1024 * 1024, "{host}");
    assert_eq!(host["NanoCpus"], 500_000_000u64, "{host}");
    assert_eq!(host["PidsLimit"], 100, "{host}");
    assert_eq!(host["NetworkMode"], "none", "{host}");

    // The default template keeps today's variables.
    let r = ok(run(&c, "s2", "true").await);
    let host = docker_inspect(r["sandbox_id"].as_str().unwrap())["HostConfig"].clone();
    assert_eq!(host["Memory"], 256 * 1024 * 1024, "{host}");
    assert_eq!(host["PidsLimit"], 256, "{host}");
}

#[tokio::test]
async fn a_session_is_bound_to_its_first_template() {
    let (_dir, file) = templates_file(TEMPLATES);
    let c = cluster_with(&[("TOOLMESH_SANDBOX_TEMPLATES", file.as_str())]).await;
    let before = tool(&c, "s1", "sandbox_status", json!({"template": "small"})).await;
    assert_eq!(before["template_id"], "small", "{before}");
    assert_eq!(before["sandbox_id"], Value::Null, "{before}");

    let first = ok(run_template(&c, "s1", "echo one", "small").await);
    // No template named: the session's.
    let again = ok(run(&c, "s1", "echo two").await);
    assert_eq!(again["sandbox_id"], first["sandbox_id"]);
    // Another template: conflict, nothing run.
    let other = run_template(&c, "s1", "echo three", "default").await;
    assert_eq!(other["error"], "conflict", "{other}");
    assert_eq!(other["template_id"], "small", "{other}");
    let other = tool(
        &c,
        "s1",
        "run_code",
        json!({"code": "print(1)", "template": "eager"}),
    )
    .await;
    assert_eq!(other["error"], "conflict", "{other}");
    let other = tool(&c, "s1", "list_tasks", json!({"template": "eager"})).await;
    assert_eq!(other["error"], "conflict", "{other}");
    // A name no template has.
    let unknown = run_template(&c, "s2", "true", "nope").await;
    assert_eq!(unknown["error"], "invalid_arguments", "{unknown}");
    assert_eq!(
        unknown["available_templates"],
        json!(["default", "eager", "small"]),
        "{unknown}"
    );

    let status = ok(sandbox_status(&c, "s1").await);
    assert_eq!(status["template_id"], "small", "{status}");
    assert_eq!(status["template_bound"], true);
    assert_eq!(status["runtime"], "runc");
    assert_eq!(status["commands"], "spawner");
    assert_eq!(status["network"], "none");
    assert_eq!(status["limits"]["memory_mb"], 300);
    assert_eq!(status["idle_ttl_seconds"], 120);
    assert_eq!(status["sandbox_id"], first["sandbox_id"]);

    // component_status reads the workers' heartbeats: the session shows within a beat or two.
    let templates = || async {
        let components = tool(&c, "s1", "component_status", json!({})).await;
        components["sandbox"]["templates"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let shown = wait_until(Duration::from_secs(20), || async {
        templates().await.get(2).is_some_and(|t| t["in_use"] == 1)
    })
    .await;
    let templates = templates().await;
    assert!(shown, "{templates:?}");
    let names: Vec<&str> = templates
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["default", "eager", "small"]);
    let small = &templates[2];
    assert_eq!(small["memory_mb"], 300, "{small}");
    assert_eq!(small["workers"], 1, "{small}");
    assert_eq!(small["runtime"], "runc", "{small}");
}

/// Warm sandboxes of `template` on the cluster's workers, from `component_status`.
async fn warm_of(c: &Cluster, template: &str) -> u64 {
    let r = tool(c, "status", "component_status", json!({})).await;
    r["sandbox"]["templates"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == template)
        .and_then(|t| t["warm"].as_u64())
        .unwrap_or(0)
}

#[tokio::test]
async fn warm_pools_are_kept_for_templates_used_or_declaring_warm() {
    let (_dir, file) = templates_file(TEMPLATES);
    let c = cluster_with(&[("TOOLMESH_SANDBOX_TEMPLATES", file.as_str())]).await;
    let within = Duration::from_secs(60);
    // `eager` declares one, `default` has TOOLMESH_SANDBOX_WARM=1; `small` none before use.
    assert!(wait_until(within, || async { warm_of(&c, "eager").await == 1 }).await);
    assert!(wait_until(within, || async { warm_of(&c, "default").await == 1 }).await);
    assert_eq!(warm_of(&c, "small").await, 0);
    ok(run_template(&c, "s1", "true", "small").await);
    // Used once: one is kept ready for its next session, which gets it.
    assert!(wait_until(within, || async { warm_of(&c, "small").await == 1 }).await);
    let host = {
        let r = ok(run_template(&c, "s2", "true", "small").await);
        docker_inspect(r["sandbox_id"].as_str().unwrap())["HostConfig"].clone()
    };
    assert_eq!(
        host["Memory"],
        300 * 1024 * 1024,
        "a warm sandbox of its own template"
    );
    // The eager template's warm sandbox went to nobody else.
    assert_eq!(warm_of(&c, "eager").await, 1);
}

#[tokio::test]
async fn a_skill_whose_requires_sandbox_names_a_template_runs_there() {
    let skills = tempfile::tempdir().unwrap();
    for (name, front) in [
        ("big", "requires_sandbox: small"),
        ("plain", "requires_sandbox: true"),
        ("other", "requires_sandbox: eager"),
    ] {
        let dir = skills.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: {name}\ndescription: the {name} skill\n{front}\n---\nDo it.\n"),
        )
        .unwrap();
    }
    let skills_dir = skills.path().display().to_string();
    let (_dir, file) = templates_file(TEMPLATES);
    let mut c = unique_servers().await;
    let mut env: Vec<(&str, &str)> = BASE_ENV.to_vec();
    env.extend_from_slice(&[
        ("TOOLMESH_SKILLS_DIR", skills_dir.as_str()),
        ("TOOLMESH_SKILL_RUNNER_COMMAND", "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"),
        ("TOOLMESH_SANDBOX_TEMPLATES", file.as_str()),
    ]);
    c.start_node("gateway,approval,workspace,sandbox,skills", &env)
        .await;
    let c = SandboxCluster { c };
    let r = ok(execute_skills(&c, "s1", "go", json!(["big", "plain"])).await);
    assert_eq!(r["stdout"], format!("{}\n", 300 * 1024 * 1024), "{r}");
    let status = sandbox_status(&c, "s1").await;
    assert_eq!(status["template_id"], "small", "{status}");
    assert_eq!(
        docker_inspect(r["sandbox_id"].as_str().unwrap())["HostConfig"]["Memory"],
        300 * 1024 * 1024
    );
    // A skill needing another template in the same session: conflict.
    let r = execute_skills(&c, "s1", "go", json!(["other"])).await;
    assert_eq!(r["error"], "conflict", "{r}");
    // Two skills needing different templates in one call.
    let r = execute_skills(&c, "s2", "go", json!(["big", "other"])).await;
    assert_eq!(r["error"], "invalid_arguments", "{r}");
}

/// The gVisor checks in one command: the kernel is gVisor's, the hardening of
/// `sandbox::containers_are_hardened` holds, and the sandbox's own disk is its `/workspace`.
async fn check_gvisor(c: &Cluster, session: &str) {
    let r = ok(tool(
        c,
        session,
        "run_command",
        json!({"template": "gvisor", "command": "dmesg | head -1; id -u; grep CapEff /proc/self/status; \
               touch /etc/x 2>/dev/null && echo wrote || echo read-only; ls /sys/class/net; \
               echo on-disk > /workspace/f.txt && cat /workspace/f.txt"}),
    )
    .await);
    let out = r["stdout"].as_str().unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains("gVisor"), "{out}");
    assert_eq!(lines[1], "1000", "{out}");
    assert_eq!(lines[2], "CapEff:\t0000000000000000", "{out}");
    assert_eq!(lines[3], "read-only", "{out}");
    assert!(
        lines[4..lines.len() - 1].iter().all(|l| *l == "lo"),
        "no network but loopback: {out}"
    );
    assert_eq!(lines[lines.len() - 1], "on-disk", "{out}");
    let inspect = docker_inspect(r["sandbox_id"].as_str().unwrap());
    let host = &inspect["HostConfig"];
    assert_eq!(host["Runtime"], "runsc", "{host}");
    assert_eq!(host["NetworkMode"], "none", "{host}");
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["Memory"], 512 * 1024 * 1024, "{host}");
    let status = sandbox_status(c, session).await;
    assert_eq!(status["runtime"], "runsc", "{status}");
    // The spawner cannot run under gVisor: the status says its commands are docker execs.
    assert_eq!(status["commands"], "exec", "{status}");
    assert_holds(&status, "boundary", "gVisor");
    // The sandbox's own disk (TOOLMESH_SANDBOX_DISK_MB=64) holds under gVisor too.
    let r = run(c, session, "dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1 | grep -o 'No space left on device'; rm -f /workspace/big")
    .await;
    assert_eq!(r["stdout"], "No space left on device\n", "{r}");
    // The file written there came back to the workspace.
    let read = read_file(c, session, "f.txt").await;
    assert_eq!(read["content"], "     1\ton-disk\n", "{read}");
}

const GVISOR: &str = "[templates.gvisor]\nruntime = \"runsc\"\nmemory_mb = 512\n";

/// Registers runsc with the engine when missing (`scripts/gvisor`, a reload).
fn gvisor_ready() {
    let status = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gvisor"))
        .status()
        .expect("scripts/gvisor runs");
    assert!(status.success(), "scripts/gvisor: {status}");
}

/// A sandbox node with the gVisor templates (gVisor installed first), disks of 64 MB and
/// `extra`; keep the folder of its templates file while it runs.
async fn gvisor_cluster(extra: &[(&str, &str)]) -> (tempfile::TempDir, SandboxCluster) {
    gvisor_ready();
    let (dir, file) = templates_file(GVISOR);
    let mut env = vec![
        ("TOOLMESH_SANDBOX_TEMPLATES", file.as_str()),
        ("TOOLMESH_SANDBOX_DISK_MB", "64"),
    ];
    env.extend_from_slice(extra);
    (dir, cluster_with(&env).await)
}

#[tokio::test]
async fn under_gvisor_the_kernel_is_gvisors_and_the_hardening_holds() {
    let (_dir, c) = gvisor_cluster(&[]).await;
    check_gvisor(&c, "s1").await;
    // The same command under runc shows the host's kernel.
    let r = ok(run(&c, "s2", "cat /proc/version").await);
    assert!(
        !r["stdout"]
            .as_str()
            .unwrap()
            .contains("4.4.0 #1 SMP Sun Jan 10"),
        "{r}"
    );
}

#[tokio::test]
async fn under_gvisor_exec_mode_works_too() {
    let (_dir, c) = gvisor_cluster(&[("TOOLMESH_SANDBOX_DOCKER_COMMANDS", "exec")]).await;
    check_gvisor(&c, "s1").await;
}
