//! The sandbox egress proxy against real parts: a real proxy on a real Docker `internal`
//! network, real sandbox containers (`toolmesh/sandbox:latest`, built by
//! `scripts/build-images sandbox`) running python3, and an HTTP server this test runs on the
//! host. Until templates pass an allow-list, the tests drive egress directly: they start
//! [`SandboxEgress`], register a sandbox, and create its container with the Docker backend on
//! the registration's network and with its environment. The worker runs as a host process
//! here (root, with iptables), as in every test.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use toolmesh_sandbox::backend::docker::{container_name, DockerBackend};
use toolmesh_sandbox::backend::{
    Backend, ExecSpec, Output, SandboxLimits, SandboxRef, SandboxSpec, StartGate,
};
use toolmesh_sandbox::egress::{
    AllowList, Decision, OnDecision, Placement, Proxy, ProxyLimits, SandboxEgress,
};
use toolmesh_testkit::EGRESS_PROBE;

mod support;
use support::{image, limits, unique};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The text a probe answered (its body, or how it failed).
fn text_of(got: &[serde_json::Value], probe: usize) -> &str {
    got[probe][1].as_str().unwrap()
}

fn recorder() -> (OnDecision, Arc<Mutex<Vec<Decision>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let on: OnDecision = Arc::new(move |d| sink.lock().unwrap().push(d));
    (on, seen)
}

fn decided(seen: &Mutex<Vec<Decision>>) -> Vec<(String, u16, bool)> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|d| (d.host.clone(), d.port, d.allowed))
        .collect()
}

/// Removes the container (and what the network left, should a test panic) on drop.
struct Cleanup {
    container: String,
    network: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", "-v", &self.container])
            .output();
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
    }
}

/// One egress sandbox: a worker's egress, one registered sandbox container.
struct Rig {
    egress: Option<SandboxEgress>,
    backend: DockerBackend,
    sandbox: SandboxRef,
    env: BTreeMap<String, String>,
    decisions: Arc<Mutex<Vec<Decision>>>,
    _workspace: tempfile::TempDir,
    _cleanup: Cleanup,
}

impl Rig {
    async fn start(allow: &[String]) -> Self {
        Self::start_in(allow, Placement::Host).await
    }

    async fn start_in(allow: &[String], placement: Placement) -> Self {
        let docker = bollard::Docker::connect_with_local_defaults().expect("docker");
        let node = unique("egress-node");
        let workspace = tempfile::tempdir().expect("tempdir");
        let scope = workspace.path().display().to_string();
        let egress = SandboxEgress::start(
            &docker,
            &node,
            (&scope, None),
            placement,
            ProxyLimits::default(),
        )
        .await
        .expect("egress starts (root and iptables)");
        let sandbox_id = unique("sbx-egress");
        let (on, decisions) = recorder();
        let registration = egress.register(
            &sandbox_id,
            AllowList::parse(allow).expect("allow-list"),
            on,
        );
        let cleanup = Cleanup {
            container: container_name(&sandbox_id),
            network: registration.network.clone(),
        };
        let backend = DockerBackend::new(image(), vec![image()]).expect("docker backend");
        backend
            .check()
            .await
            .expect("docker usable (scripts/build-images sandbox)");
        let spec = SandboxSpec {
            sandbox_id,
            node_id: node,
            scope,
            workspace_dir: workspace.path().join("ws"),
            limits: SandboxLimits {
                network: registration.network.clone(),
                ..limits()
            },
            image: None,
            env: Vec::new(),
        };
        let sandbox = backend.create(&spec).await.expect("create sandbox");
        Self {
            egress: Some(egress),
            backend,
            sandbox,
            env: registration.env,
            decisions,
            _workspace: workspace,
            _cleanup: cleanup,
        }
    }

    fn proxy(&self) -> SocketAddr {
        self.egress.as_ref().unwrap().proxy_addr()
    }

    /// Runs the probe script with `ops`; one JSON answer per op.
    async fn probe(&self, ops: serde_json::Value) -> Vec<serde_json::Value> {
        let spec = ExecSpec {
            argv: vec![
                "python3".into(),
                "-c".into(),
                EGRESS_PROBE.into(),
                ops.to_string(),
            ],
            cwd: "/workspace".into(),
            env: self.env.clone(),
            stdin: false,
            exec_id: unique("exec"),
        };
        let mut exec = self
            .backend
            .exec(&self.sandbox, spec, StartGate::open())
            .await
            .expect("exec");
        let (mut out, mut err) = (String::new(), String::new());
        tokio::time::timeout(TIMEOUT, async {
            while let Some(chunk) = exec.output.recv().await {
                match chunk {
                    Output::Stdout(b) => out.push_str(&String::from_utf8_lossy(&b)),
                    Output::Stderr(b) => err.push_str(&String::from_utf8_lossy(&b)),
                }
            }
        })
        .await
        .expect("probe ends");
        let code = exec.exit.await.expect("exit").expect("status").code;
        assert_eq!(code, 0, "probe failed: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"))
    }

    async fn stop(mut self) {
        let _ = self.backend.destroy(&self.sandbox).await;
        self.egress.take().unwrap().shutdown().await;
    }
}

#[tokio::test]
async fn allow_listed_targets_are_reached_over_http_and_connect_and_the_rest_is_refused() {
    let port = toolmesh_testkit::http_target().await;
    let other = toolmesh_testkit::http_target().await;
    let rig = Rig::start(&[format!("127.0.0.1/32:{port}"), "pypi.org".into()]).await;
    let proxy = rig.proxy();
    assert_eq!(rig.env["HTTP_PROXY"], rig.env["https_proxy"]);
    assert_eq!(rig.env["NO_PROXY"], "");
    let got = rig
        .probe(serde_json::json!([
            ["get", format!("http://127.0.0.1:{port}/hello?x=1")],
            ["tunnel", "127.0.0.1", port, "/tunnelled"],
            ["get", "http://not-listed.example/"],
            ["tunnel", "not-listed.example", 443, "/"],
            ["get", format!("http://127.0.0.1:{other}/hello")],
            ["tunnel", "pypi.org", 22, "/"],
            ["raw_get", format!("http://127.0.0.1:{port}/hello")],
        ]))
        .await;
    assert_eq!(got[0], serde_json::json!([200, "hello from /hello?x=1"]));
    assert_eq!(got[1], serde_json::json!([200, "hello from /tunnelled"]));
    assert_eq!(got[2][0], 403, "{got:?}");
    assert!(
        text_of(&got, 2).contains("not-listed.example is not in the allow-list"),
        "{got:?}"
    );
    assert!(text_of(&got, 3).contains("403"), "CONNECT refused: {got:?}");
    assert_eq!(got[4][0], 403, "a port not listed: {got:?}");
    assert!(
        text_of(&got, 4).contains(&format!("127.0.0.1:{other} is not in the allow-list")),
        "{got:?}"
    );
    assert!(text_of(&got, 5).contains("403"), "{got:?}");
    assert_eq!(got[6][0], 407, "no credential, no egress: {got:?}");
    assert_eq!(
        decided(&rig.decisions),
        vec![
            ("127.0.0.1".to_owned(), port, true),
            ("127.0.0.1".to_owned(), port, true),
            ("not-listed.example".to_owned(), 80, false),
            ("not-listed.example".to_owned(), 443, false),
            ("127.0.0.1".to_owned(), other, false),
            ("pypi.org".to_owned(), 22, false),
        ]
    );
    assert_eq!(
        rig.decisions.lock().unwrap()[0].event(),
        serde_json::json!({"host": "127.0.0.1", "port": port, "allowed": true})
    );
    // Direct connections fail: the host's address on the network (the target listens on every
    // host address), the host's docker0 address, and the outside.
    let gateway = proxy.ip().to_string();
    let got = rig
        .probe(serde_json::json!([
            ["direct", gateway, port],
            ["direct", "172.17.0.1", port],
            ["direct", "1.1.1.1", 80],
            ["direct", "127.0.0.1", port],
        ]))
        .await;
    for (i, result) in got.iter().enumerate() {
        assert_ne!(
            result, "connected",
            "direct connection {i} succeeded: {got:?}"
        );
    }
    rig.stop().await;
}

#[tokio::test]
async fn a_name_resolving_to_a_private_address_needs_a_cidr_entry() {
    let port = toolmesh_testkit::http_target().await;
    let rig = Rig::start(&[format!("localhost:{port}")]).await;
    let got = rig
        .probe(serde_json::json!([
            ["get", format!("http://localhost:{port}/hello")],
            ["tunnel", "localhost", port, "/"],
        ]))
        .await;
    assert_eq!(got[0][0], 403, "{got:?}");
    assert!(
        text_of(&got, 0).contains("localhost resolves to loopback address"),
        "{got:?}"
    );
    assert!(text_of(&got, 1).contains("403"), "{got:?}");
    assert_eq!(
        decided(&rig.decisions),
        vec![
            ("localhost".to_owned(), port, false),
            ("localhost".to_owned(), port, false)
        ]
    );
    rig.stop().await;

    let rig = Rig::start(&[
        format!("localhost:{port}"),
        format!("127.0.0.0/8:{port}"),
        format!("::1/128:{port}"),
    ])
    .await;
    let got = rig
        .probe(serde_json::json!([
            ["get", format!("http://localhost:{port}/named")],
            ["tunnel", "localhost", port, "/named"],
        ]))
        .await;
    assert_eq!(got[0], serde_json::json!([200, "hello from /named"]));
    assert_eq!(got[1], serde_json::json!([200, "hello from /named"]));
    rig.stop().await;
}

/// The image the containerised worker of
/// [`a_worker_in_a_container_joins_the_network_and_keeps_the_host_off_it`] runs in: the
/// sandbox image plus `iptables`, as the node image has it (built once, then kept).
async fn worker_image() -> String {
    let tag = "toolmesh/egress-worker-test:latest".to_owned();
    let dockerfile = format!(
        "FROM {}\nUSER 0\nRUN apt-get update && apt-get install -y --no-install-recommends iptables \\\n    && rm -rf /var/lib/apt/lists/*\n",
        image()
    );
    // The recipe: the Dockerfile and the base image's id (a rebuilt sandbox image counts).
    let base = std::process::Command::new("docker")
        .args(["image", "inspect", "-f", "{{.Id}}", &image()])
        .output()
        .expect("docker image inspect");
    let label = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (dockerfile.as_str(), base.stdout.as_slice()).hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    };
    let have = std::process::Command::new("docker")
        .args([
            "image",
            "inspect",
            "-f",
            "{{index .Config.Labels \"recipe\"}}",
            &tag,
        ])
        .output()
        .expect("docker image inspect");
    if String::from_utf8_lossy(&have.stdout).trim() == label {
        return tag;
    }
    let mut build = tokio::process::Command::new("docker")
        .args([
            "build",
            "-q",
            "--label",
            &format!("recipe={label}"),
            "-t",
            &tag,
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("docker build");
    let mut stdin = build.stdin.take().expect("stdin");
    stdin
        .write_all(dockerfile.as_bytes())
        .await
        .expect("write the Dockerfile");
    drop(stdin);
    assert!(
        build.wait().await.expect("docker build").success(),
        "building {tag}"
    );
    tag
}

/// The worker in a container, as compose runs it: this test binary runs
/// [`in_a_container`] inside a container of the sandbox image (plus `iptables`, with
/// `NET_ADMIN`) with the Docker socket, its temporary folder bound at the same path (so the
/// daemon finds the sandbox's folders).
#[tokio::test]
async fn a_worker_in_a_container_joins_the_network_and_keeps_the_host_off_it() {
    let worker = worker_image().await;
    let exe = std::env::current_exe().expect("test binary");
    let shared = tempfile::tempdir().expect("tempdir");
    let dir = shared.path().display().to_string();
    let name = unique("egress-worker");
    let out = tokio::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            "--name",
            &name,
            "--user",
            "0",
            "--network",
            "bridge",
            "--cap-add",
            "NET_ADMIN",
        ])
        .args(["-v", "/var/run/docker.sock:/var/run/docker.sock"])
        .args(["-v", &format!("{}:/egress-test:ro", exe.display())])
        .args([
            "-v",
            &format!("{dir}:{dir}"),
            "-e",
            &format!("TMPDIR={dir}"),
        ])
        .args(["-e", &format!("TOOLMESH_SANDBOX_IMAGE={}", image())])
        .args(["--entrypoint", "/egress-test", &worker])
        .args(["--ignored", "--exact", "in_a_container", "--nocapture"])
        .output()
        .await
        .expect("docker run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // What a panic inside left: containers and networks of a scope below `dir`.
    for (ls, rm) in [
        (&["ps", "-a"][..], &["rm", "-f", "-v"][..]),
        (&["network", "ls"][..], &["network", "rm"][..]),
    ] {
        let listed = std::process::Command::new("docker")
            .args(ls)
            .args(["--filter", "label=io.toolmesh.managed=1"])
            .args(["--format", "{{.ID}} {{.Label \"io.toolmesh.scope\"}}"])
            .output()
            .expect("docker ls");
        for line in String::from_utf8_lossy(&listed.stdout).lines() {
            if let Some((id, scope)) = line.split_once(' ') {
                if scope.starts_with(&dir) {
                    let _ = std::process::Command::new("docker")
                        .args(rm)
                        .arg(id)
                        .output();
                }
            }
        }
    }
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{stderr}"
    );
}

#[tokio::test]
#[ignore = "runs inside a container, started by a_worker_in_a_container_joins_the_network_…"]
async fn in_a_container() {
    let port = toolmesh_testkit::http_target().await;
    let me = std::fs::read_to_string("/etc/hostname").expect("hostname");
    let rig = Rig::start_in(
        &[format!("127.0.0.1/32:{port}")],
        Placement::Join(me.trim().to_owned()),
    )
    .await;
    let proxy = rig.proxy();
    let got = rig
        .probe(serde_json::json!([
            ["get", format!("http://127.0.0.1:{port}/joined")],
            ["tunnel", "127.0.0.1", port, "/joined"],
            ["get", "http://not-listed.example/"],
            ["direct", "172.17.0.1", port],
            ["direct", "1.1.1.1", 80],
            ["direct", proxy.ip().to_string(), port],
        ]))
        .await;
    assert_eq!(got[0], serde_json::json!([200, "hello from /joined"]));
    assert_eq!(got[1], serde_json::json!([200, "hello from /joined"]));
    assert_eq!(got[2][0], 403, "{got:?}");
    assert_ne!(got[3], "connected", "the host is off the network: {got:?}");
    assert_ne!(got[4], "connected", "no route out: {got:?}");
    // The worker's container serves the target on every address, the egress network's
    // included; its INPUT rules keep sandboxes to the proxy's port.
    assert_ne!(got[5], "connected", "the worker's other ports: {got:?}");
    rig.stop().await;
}

fn bridge_of(network: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["network", "inspect", network, "--format"])
        .arg("{{index .Options \"com.docker.network.bridge.name\"}}")
        .output()
        .expect("docker network inspect");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn rules_of(bridge: &str) -> usize {
    let out = std::process::Command::new("iptables")
        .args(["-w", "-S", "INPUT"])
        .output()
        .expect("iptables -S");
    let needle = format!("-i {bridge} ");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| format!("{l} ").contains(&needle))
        .count()
}

#[tokio::test]
async fn networks_of_dead_workers_are_reaped_with_their_host_rules() {
    use toolmesh_sandbox::egress::{network_name, reap_orphans};
    let docker = bollard::Docker::connect_with_local_defaults().expect("docker");
    let folder = tempfile::tempdir().expect("tempdir");
    let scope = folder.path().display().to_string();
    let (dead, live) = (unique("egress-dead"), unique("egress-live"));
    let _cleanup = [&dead, &live].map(|node| Cleanup {
        container: String::new(),
        network: network_name(node),
    });
    let start = |node: String| {
        let (docker, scope) = (docker.clone(), scope.clone());
        async move {
            SandboxEgress::start(
                &docker,
                &node,
                (&scope, None),
                Placement::Host,
                ProxyLimits::default(),
            )
            .await
            .expect("egress starts")
        }
    };
    let killed = start(dead.clone()).await;
    let running = start(live.clone()).await;
    let (dead_bridge, live_bridge) = (bridge_of(killed.network()), bridge_of(running.network()));
    assert_eq!((rules_of(&dead_bridge), rules_of(&live_bridge)), (2, 2));
    // Killed: nothing of it runs its cleanup.
    std::mem::forget(killed);
    let reaped = reap_orphans(
        &docker,
        &scope,
        "egress-new-node",
        Some(std::slice::from_ref(&live)),
    )
    .await
    .expect("reap");
    assert_eq!(reaped, 1);
    assert_eq!(
        bridge_of(&network_name(&dead)),
        "",
        "the dead worker's network is gone"
    );
    assert_eq!(rules_of(&dead_bridge), 0, "and its host rules");
    assert_eq!(
        bridge_of(running.network()),
        live_bridge,
        "the live one stays"
    );
    assert_eq!(rules_of(&live_bridge), 2);
    running.shutdown().await;
    assert_eq!(rules_of(&live_bridge), 0);
}

/// A killed worker's container still names its egress network. Reaping the network must
/// leave that container able to start again (compose brings a killed worker back by starting
/// its container: `up -d --scale sandbox=3`), which Docker refuses for a container naming a
/// network that is gone.
#[tokio::test]
async fn a_killed_worker_s_container_starts_again_after_its_network_is_reaped() {
    use toolmesh_sandbox::egress::{network_name, reap_orphans};
    let docker = bollard::Docker::connect_with_local_defaults().expect("docker");
    let folder = tempfile::tempdir().expect("tempdir");
    let scope = folder.path().display().to_string();
    let dead = unique("egress-killed");
    let worker = unique("toolmesh-killed-worker");
    let _cleanup = Cleanup {
        container: worker.clone(),
        network: network_name(&dead),
    };
    let killed = SandboxEgress::start(
        &docker,
        &dead,
        (&scope, None),
        Placement::Host,
        Default::default(),
    )
    .await
    .expect("egress starts");
    // The worker's container, stopped, still naming the network (as a killed one does).
    let docker_cli = |args: &[&str]| {
        let out = std::process::Command::new("docker")
            .args(args)
            .output()
            .expect("docker");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let image = image();
    let (made, why) = docker_cli(&[
        "create",
        "--name",
        &worker,
        "--network",
        killed.network(),
        &image,
        "true",
    ]);
    assert!(made, "creating the worker's container: {why}");
    std::mem::forget(killed);
    let reaped = reap_orphans(&docker, &scope, "egress-new-node", Some(&[]))
        .await
        .expect("reap");
    assert_eq!(reaped, 1, "the killed worker's network is reaped");
    let (started, why) = docker_cli(&["start", &worker]);
    assert!(started, "the killed worker's container starts again: {why}");
}

// The proxy alone, from the host: credentials and bounds.

async fn ask(proxy: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(proxy).await.expect("connect proxy");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut reply = String::new();
    tokio::time::timeout(TIMEOUT, stream.read_to_string(&mut reply))
        .await
        .expect("reply in time")
        .expect("read");
    reply
}

fn basic(url: &str) -> String {
    use base64::Engine as _;
    let userinfo = url
        .strip_prefix("http://")
        .and_then(|u| u.split_once('@'))
        .map(|(userinfo, _)| userinfo)
        .expect("credential in the proxy URL");
    base64::engine::general_purpose::STANDARD.encode(userinfo)
}

#[tokio::test]
async fn a_sandbox_cannot_use_another_sandbox_s_allow_list() {
    let port = toolmesh_testkit::http_target().await;
    let proxy = Proxy::bind("127.0.0.1:0".parse().unwrap(), ProxyLimits::default())
        .await
        .unwrap();
    let (on_a, seen_a) = recorder();
    let (on_b, seen_b) = recorder();
    let a = proxy.register(
        "a",
        AllowList::parse(&[format!("127.0.0.1:{port}")]).unwrap(),
        on_a,
    );
    let b = proxy.register("b", AllowList::default(), on_b);
    let get = |auth: String| {
        format!(
            "GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Proxy-Authorization: Basic {auth}\r\n\r\n"
        )
    };
    let addr = proxy.local_addr();
    assert!(ask(addr, &get(basic(&a.url)))
        .await
        .starts_with("HTTP/1.1 200"));
    assert!(ask(addr, &get(basic(&b.url)))
        .await
        .starts_with("HTTP/1.1 403"));
    // b's user with a guessed secret, a's user with b's secret, none at all: 407.
    use base64::Engine as _;
    let user_of = |url: &str| url[7..].split(':').next().unwrap().to_owned();
    let secret_of = |url: &str| url[7..].split(['@', ':']).nth(1).unwrap().to_owned();
    let forged = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        user_of(&a.url),
        secret_of(&b.url)
    ));
    for auth in [forged, "bm90aGluZw==".to_owned()] {
        let reply = ask(addr, &get(auth)).await;
        assert!(reply.starts_with("HTTP/1.1 407"), "{reply}");
    }
    let reply = ask(
        addr,
        &format!("GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: x\r\n\r\n"),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 407"), "{reply}");
    assert_eq!(seen_a.lock().unwrap().len(), 1);
    assert_eq!(seen_b.lock().unwrap().len(), 1);
    // Unregistered: a's credential stops working.
    proxy.unregister("a");
    assert!(ask(addr, &get(basic(&a.url)))
        .await
        .starts_with("HTTP/1.1 407"));
    proxy.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_an_answer_and_the_proxy_stays_up() {
    let port = toolmesh_testkit::http_target().await;
    let limits = ProxyLimits {
        head_timeout: Duration::from_millis(300),
        max_head: 1024,
        per_sandbox: 2,
        ..ProxyLimits::default()
    };
    let proxy = Proxy::bind("127.0.0.1:0".parse().unwrap(), limits)
        .await
        .unwrap();
    let (on, _) = recorder();
    let env = proxy.register(
        "a",
        AllowList::parse(&[format!("127.0.0.1:{port}")]).unwrap(),
        on,
    );
    let auth = basic(&env.url);
    let addr = proxy.local_addr();
    let big = format!(
        "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "y".repeat(2000)
    );
    assert!(ask(addr, &big).await.starts_with("HTTP/1.1 431"));
    assert!(ask(addr, "\x16\x03\x01garbage\r\n\r\n")
        .await
        .starts_with("HTTP/1.1 400"));
    // A head that never ends: 408 once the head timeout passed.
    assert!(ask(addr, "GET http://x/ HTTP/1.1\r\n")
        .await
        .starts_with("HTTP/1.1 408"));
    let origin_form =
        format!("GET /x HTTP/1.1\r\nHost: a\r\nProxy-Authorization: Basic {auth}\r\n\r\n");
    assert!(ask(addr, &origin_form).await.starts_with("HTTP/1.1 400"));
    let https = format!(
        "GET https://127.0.0.1:{port}/ HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    );
    assert!(ask(addr, &https).await.starts_with("HTTP/1.1 400"));
    // Past the per-sandbox limit: two tunnels open, the third is 503.
    let connect =
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n");
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(connect.as_bytes()).await.unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        open.push(s);
    }
    assert!(ask(addr, &connect).await.starts_with("HTTP/1.1 503"));
    drop(open);
    // Served again once the proxy has seen the tunnels close (503 until then).
    let get = format!(
        "GET http://127.0.0.1:{port}/ok HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    );
    toolmesh_testkit::wait_until(Duration::from_secs(10), || async {
        !ask(addr, &get).await.starts_with("HTTP/1.1 503")
    })
    .await;
    let reply = ask(addr, &get).await;
    assert!(reply.ends_with("hello from /ok"), "{reply}");
    proxy.shutdown().await;
}
