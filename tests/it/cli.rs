//! The command line as a person meets it: a closed pipe, `--help`, the approval hint.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{ok, policy_file, toolmesh_cli, Cluster, BIN, GATED_STATUS};

/// `toolmesh status | head -c 1`: the reader leaves before the reply is written. The command
/// stops quietly instead of panicking on the broken pipe.
#[tokio::test]
async fn a_reader_that_leaves_early_is_no_panic() {
    let c = Cluster::start().await;
    let mut child = Command::new(BIN)
        .args(["status"])
        .env("TOOLMESH_NATS_URL", c.nats.url())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolmesh runs");
    // Close the read end before the CLI has its reply: every write it makes gets EPIPE.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// `--help` shows which variable sets an option, never its value: a NATS URL holds a
/// password, a skill service token is a secret.
#[test]
fn help_never_prints_secrets_from_the_environment() {
    for args in [
        &["--help"][..],
        &["skill-service", "--help"],
        &["call", "--help"],
    ] {
        let out = Command::new(BIN)
            .args(args)
            .env("TOOLMESH_NATS_URL", "nats://acme:hunter2-pw@example:4222")
            .env("TOOLMESH_SKILL_SERVICE_TOKEN", "tok-hunter3")
            .output()
            .expect("toolmesh runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(text.contains("TOOLMESH_NATS_URL"), "{args:?}: {text}");
        assert!(!text.contains("hunter2"), "{args:?}: {text}");
        assert!(!text.contains("hunter3"), "{args:?}: {text}");
    }
}

/// A caller whose `--approve` is ignored (in-band off) and who connects as an account user
/// hears both: why its approval did nothing, and that another user must decide.
#[tokio::test]
async fn the_approval_hint_says_who_decides_and_why_approve_did_nothing() {
    let (_dir, path) = policy_file(GATED_STATUS);
    let c = Cluster::with_env(&[
        ("TOOLMESH_POLICY_FILE", path.as_str()),
        ("TOOLMESH_APPROVAL_IN_BAND", "0"),
    ])
    .await;
    // A user in the URL (the test server ignores it), as on the compose cluster.
    let url = c.nats.url().replace("nats://", "nats://acme:pw@");
    let out = toolmesh_cli(&url)
        .args(call_args("component_status", &["--approve"]))
        .env_remove("RUST_LOG")
        .output()
        .expect("toolmesh runs");
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON reply");
    assert_eq!(reply["error"], "approval_required", "{reply}");
    let hint = String::from_utf8_lossy(&out.stderr);
    assert!(hint.contains("TOOLMESH_APPROVAL_IN_BAND=0"), "{hint}");
    assert!(
        hint.contains("allowed to publish on toolmesh.v1.approvals.acme.decide"),
        "{hint}"
    );
    assert!(hint.contains("approver"), "{hint}");
    assert_eq!(out.status.code(), Some(1));
}

/// Runs `toolmesh <args>` against the cluster; its stdout as text.
/// `toolmesh call <tool>` in session s1 of acme, `extra` after it.
fn call_args<'a>(tool: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["call", tool, "--account", "acme", "--session", "s1"];
    args.extend_from_slice(extra);
    args
}

fn cli(c: &Cluster, args: &[&str]) -> String {
    let out = toolmesh_cli(&c.nats.url())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("toolmesh runs");
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Issue 16: a file name with a bidirectional character (`rtl\u202etxt.exe`, which a terminal
/// shows as `rtlexe.txt`) listed unescaped. Results keep the exact name (a tool can pass it
/// back); what a person reads — the command line's output, an error message, the approval
/// preview — shows it escaped.
#[tokio::test]
async fn names_are_exact_in_results_and_escaped_where_a_person_reads_them() {
    let c = Cluster::ungated("gateway,approval,workspace").await;
    let name = "rtl\u{202e}txt.exe";
    ok(c.write_workspace_file("acme", "s1", name, "hi").await);
    // On the wire the result is exact.
    let listed = c
        .session_call("acme", "s1", "list_workspace_files", json!({}))
        .await;
    assert!(listed.to_string().contains(name), "{listed}");

    let text = cli(&c, &call_args("list_workspace_files", &[]));
    assert!(!text.contains('\u{202e}'), "{text}");
    assert!(text.contains("rtl\\u202etxt.exe"), "{text}");
    // The escaped output is JSON of the same reply.
    let printed: Value = serde_json::from_str(&text).expect("the CLI prints JSON");
    assert_eq!(printed["entries"], listed["entries"], "{text}");

    // An error message quoting the name escapes it.
    let missing = c
        .session_call(
            "acme",
            "s1",
            "read_workspace_file",
            json!({"path": "gone\u{202e}\u{1b}[2K.txt"}),
        )
        .await;
    let message = missing["error_message"].as_str().unwrap();
    assert_eq!(missing["error"], "not_found", "{missing}");
    assert!(
        !message.chars().any(toolmesh_kernel::text::is_hidden_char),
        "{message:?}"
    );
}

/// `toolmesh approvals get` prints the exact arguments and says whether they hash to
/// `arguments_sha256`, so a person knows that what they read is what they approve.
#[tokio::test]
async fn approvals_get_shows_the_arguments_and_checks_their_hash() {
    let c = Cluster::start().await; // strict: writes need approval
    let reply = c
        .write_workspace_file("acme", "s1", "a\u{202e}.txt", "hi")
        .await;
    let id = reply["approval_request"]["id"].as_str().unwrap();
    let out = toolmesh_cli(&c.nats.url())
        .args(["approvals", "get", id, "--account", "acme"])
        .env_remove("RUST_LOG")
        .output()
        .expect("toolmesh runs");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains('\u{202e}'), "{text}");
    let printed: Value = serde_json::from_str(&text).expect("the CLI prints JSON");
    assert_eq!(
        printed["arguments"],
        json!({"path": "a\u{202e}.txt", "content": "hi"})
    );
    let hint = String::from_utf8_lossy(&out.stderr);
    assert!(hint.contains("arguments match arguments_sha256"), "{hint}");
}

/// A refused password is said once, in one line: the error names its cause once, and the NATS
/// client's own log of the same failure stays out of the person's way (issue 29, item 8).
#[test]
fn a_refused_password_is_said_once() {
    let nats = toolmesh_testkit::AuthNats::start();
    let url = nats.url("acme").replace("acme-pw", "wrong");
    let out = Command::new(BIN)
        .args(["--nats-url", &url, "status"])
        .env_remove("RUST_LOG")
        .output()
        .expect("toolmesh runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert_eq!(
        stderr.matches("authorization violation").count(),
        1,
        "the cause once: {stderr}"
    );
    assert!(!stderr.contains("wrong"), "no password: {stderr}");
}

/// `call --wait` says at once, on stderr, what it waits for: the approval, its tool and risk,
/// the subject that decides it and the command to run (issue 29, item 4). The command as
/// printed decides it, and the call goes on.
#[tokio::test]
async fn call_wait_says_at_once_which_approval_it_waits_for_and_who_decides() {
    use tokio::io::AsyncBufReadExt as _;
    let (_dir, path) = policy_file(GATED_STATUS);
    let c = Cluster::with_env(&[("TOOLMESH_POLICY_FILE", path.as_str())]).await;
    let mut child = tokio::process::Command::new(BIN)
        .args(call_args("component_status", &["--wait", "120"]))
        .env("TOOLMESH_NATS_URL", c.nats.url())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("toolmesh runs");
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(
        stderr: &mut tokio::io::Lines<R>,
    ) -> String {
        tokio::time::timeout(Duration::from_secs(30), stderr.next_line())
            .await
            .expect("a line on stderr while the call waits")
            .unwrap()
            .expect("stderr is open")
    }
    // The first line, while the call is parked.
    let first = match tokio::time::timeout(Duration::from_secs(30), stderr.next_line()).await {
        Ok(Ok(Some(line))) => line,
        other => {
            let out = child.wait_with_output().await.unwrap();
            panic!(
                "no approval line ({other:?}): {:?} {}",
                out.status,
                String::from_utf8_lossy(&out.stdout)
            )
        }
    };
    assert!(first.starts_with("approval required: appr_"), "{first}");
    assert!(first.contains("(component_status, risk high)"), "{first}");
    assert!(
        first.contains("decision on toolmesh.v1.approvals.acme.decide"),
        "{first}"
    );
    let id = first
        .split_whitespace()
        .nth(2)
        .expect("the approval id")
        .to_owned();
    // Then the command that decides it, which works as printed.
    let mut command = None;
    while command.is_none() {
        let line = next_line(&mut stderr).await;
        command = line
            .trim()
            .strip_prefix("toolmesh ")
            .map(|rest| rest.split("    (").next().unwrap().to_owned());
    }
    let command = command.unwrap();
    assert_eq!(
        command,
        format!("approvals approve {id} --account acme"),
        "{command}"
    );
    let decided = toolmesh_cli(&c.nats.url())
        .args(command.split_whitespace())
        .env_remove("RUST_LOG")
        .output()
        .expect("toolmesh runs");
    assert!(decided.status.success(), "{decided:?}");

    let said = next_line(&mut stderr).await;
    assert!(said.starts_with(&format!("{id} approved")), "{said}");
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the call ends once approved")
        .unwrap();
    ok(serde_json::from_slice(&out.stdout).expect("a JSON reply"));
    assert_eq!(out.status.code(), Some(0));
}

/// Issue 31: a reviewer approves as themselves and remembers the decision as a grant; `grants
/// list` shows it, `approvals explain` says who decided under which rule.
#[tokio::test]
async fn a_reviewer_approves_as_themselves_with_a_grant_and_explain_says_why() {
    let policy = "mode = \"off\"\n[reviewers.ops]\nmembers = [\"alice\"]\n\
        [[rules]]\nid = \"ops\"\ntools = [\"component_status\"]\ndecision = \"ask\"\nreviewers = \"ops\"\n";
    let (_dir, path) = crate::support::policy_file(policy);
    let c = Cluster::with_env(&[("TOOLMESH_POLICY_FILE", path.as_str())]).await;
    let body = json!({"tool": "component_status", "session_id": "s1"});
    let first = c.call("acme", body.clone()).await;
    let id = first["approval_request"]["id"].as_str().unwrap().to_owned();
    let approve = [
        "approvals",
        "approve",
        &id,
        "--account",
        "acme",
        "--as",
        "alice",
    ];
    let args: Vec<&str> = approve
        .iter()
        .copied()
        .chain(["--grant", "session", "--grant-uses", "1"])
        .collect();
    let decided: Value = serde_json::from_str(&cli(&c, &args)).unwrap();
    assert_eq!(decided["approval"]["decided_by"], "alice", "{decided}");
    assert_eq!(decided["grant"]["uses_left"], 1, "{decided}");
    let grants: Value =
        serde_json::from_str(&cli(&c, &["grants", "list", "--account", "acme"])).unwrap();
    assert_eq!(
        grants["grants"][0]["id"], decided["grant"]["id"],
        "{grants}"
    );
    let explained = cli(&c, &["approvals", "explain", &id, "--account", "acme"]);
    for part in [
        "policy rule ops",
        "reviewer group ops",
        "alice approved",
        "decided by alice",
    ] {
        assert!(explained.contains(part), "{part:?} in:\n{explained}");
    }
    // The grant's one use runs the next call of the session; revoked, it would cover nothing.
    let ran = ok(c.call("acme", body).await);
    assert_eq!(ran["grant_id"], decided["grant"]["id"], "{ran}");
    let grant_id = decided["grant"]["id"].as_str().unwrap();
    let revoked: Value = serde_json::from_str(&cli(
        &c,
        &["grants", "revoke", grant_id, "--account", "acme"],
    ))
    .unwrap();
    assert!(revoked["grant"]["revoked_at"].is_string(), "{revoked}");
}

/// Issue 31: `approve --arguments` approves edited arguments; the repeated call runs them and
/// `explain` says the arguments were edited.
#[tokio::test]
async fn approve_with_arguments_runs_the_edited_call() {
    let c = Cluster::with_node("gateway,approval,workspace", &[]).await;
    let original = json!({"path": "plan.txt", "content": "drop table\n"});
    let body = json!({"tool": "write_workspace_file", "session_id": "s1", "arguments": original});
    let first = c.call("acme", body.clone()).await;
    assert_eq!(first["error"], "approval_required", "{first}");
    let id = first["approval_request"]["id"].as_str().unwrap().to_owned();
    let edited = r#"{"path": "plan.txt", "content": "select 1\n"}"#;
    let decided: Value = serde_json::from_str(&cli(
        &c,
        &[
            "approvals",
            "approve",
            &id,
            "--account",
            "acme",
            "--arguments",
            edited,
        ],
    ))
    .unwrap();
    assert_eq!(decided["approval"]["edited"], true, "{decided}");
    let mut repeat = body;
    repeat["approval"] = json!({ "id": id });
    let ran = ok(c.call("acme", repeat).await);
    assert_eq!(ran["approval_edited"], true, "{ran}");
    let read = json!({"path": "plan.txt", "include_line_numbers": false});
    let content = ok(c
        .session_call("acme", "s1", "read_workspace_file", read)
        .await);
    assert_eq!(content["content"], "select 1\n", "{content}");
    let explained = cli(&c, &["approvals", "explain", &id, "--account", "acme"]);
    assert!(
        explained.contains("edited the arguments before approving"),
        "{explained}"
    );
}
