//! The pre-reviewer (PROTOCOL.md "Approval policy", "Pre-review"): the policy file's
//! `[review]` command or URL is shown each call about to need an approval and answers `allow`
//! (the call runs, `decided_by: "review"`), `deny` (`policy_denied`, `reviewed_by: "review"`)
//! or `ask` (the approval gate, as without a reviewer). Anything else is `ask`: an error, a
//! non-JSON answer, an unknown decision, a timeout, an egress refusal ([`ReviewError`], logged
//! with its chain). A broken reviewer never lets a call through.
//!
//! Where the contract is silent, this module chooses:
//!
//! - **When.** Rules first: a `deny` rule answers before the reviewer is asked, an `allow`
//!   rule never reaches it. A call the mode or an `ask` rule gates is reviewed before the gate,
//!   so before grants are looked up: the approval actor looks up grants and makes the approval
//!   in one step, and reviewing after it would make an approval nobody needs whenever the
//!   reviewer allows. A reviewer's `deny` thus wins over a grant, as a `deny` rule does; an
//!   `allow` spends no use of a grant.
//!   An `ask` rule's call is reviewed too, reviewers group and quorum or not: the contract
//!   names every call about to need an approval, and the reviewer is the operator's, never
//!   the caller's.
//! - **Not reviewed.** A call presenting an approval id (it redeems a decision already made),
//!   and a first call carrying an in-band rejection (`"approved": false`): a reviewer's
//!   `allow` never overrides the caller's own no, and the gate answers `approval_rejected`. A
//!   first call carrying `"approved": true` is reviewed: a `deny` refuses it, an `allow` runs
//!   it without an approval, an `ask` leaves the in-band decision to the gate.
//! - **What it sees.** `{"approval", "arguments"}`: `approval` has the members of an
//!   ApprovalRequest as far as they are known before one exists (`id`, `expires_at` and the
//!   `decided_*` members null, `status: "pending"`, the rule, revision, reviewers and quorum
//!   that would route it); `arguments` are the call's arguments in full (for a
//!   `tool_dispatcher` `call`, the inner tool's).
//! - **Command.** `sh -c <command>` in a process group of its own, the request on stdin (a
//!   reviewer that answers without reading it is fine), the answer on stdout read to its end
//!   (at most [`MAX_ANSWER_BYTES`]); a non-zero exit is `ask`, with the first
//!   [`MAX_STDERR_BYTES`] of stderr in the log. On a timeout or an over-long answer the group
//!   is killed, so a reviewer's own children do not outlive it.
//! - **URL.** A POST of `application/json` through the web egress policy
//!   (`TOOLMESH_WEB_ALLOWED_NETWORKS`; loopback and private addresses are refused unless it
//!   opens them); no redirect is followed (a 3xx is `ask`), only a 2xx answer counts.
//! - **Answers.** A JSON object whose `decision` is exactly `allow`, `deny` or `ask`; `reason`,
//!   when present, a string (or null), cut to [`MAX_REASON_CHARS`]; other members are ignored.
//!   `timeout_s` bounds the whole exchange.
//! - **On the record.** An allowed call's reply has `decided_by: "review"` and `review_reason`;
//!   its RunEvents `decided_by` (a refused one's `reviewed_by`), `review_reason` and
//!   `policy_revision`; its audit entries `decided_by` and `policy_revision` (an audit entry has
//!   no member for a reason). The actor never answers such a call directly, so the reply
//!   always carries them.

use std::io::ErrorKind;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

use toolmesh_kernel::canonical::{arguments_preview, arguments_sha256, shorten, PREVIEW_MAX_CHARS};
use toolmesh_kernel::egress::{Egress, EgressError};
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::policy::{Review, Reviewer};
use toolmesh_kernel::text::display_safe;
use toolmesh_kernel::tools::RegisteredTool;
use toolmesh_kernel::wire::{self, RiskLevel, ToolRequest};
use toolmesh_kernel::{ErrorCode, ToolError};

use super::Call;

/// Bytes of a reviewer's answer read at most; a longer one is `ask`.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Bytes of a reviewer command's stderr kept for the log.
pub const MAX_STDERR_BYTES: usize = 2 * 1024;
/// Characters of a reviewer's `reason` kept (in the reply, the RunEvents, the log).
pub const MAX_REASON_CHARS: usize = 1000;
/// `decided_by` of a call the reviewer let run, `reviewed_by` of one it refused.
pub const REVIEWED_BY: &str = "review";

/// The HTTP client a `[review] url` is POSTed with, under the web egress policy.
#[derive(Clone)]
pub(crate) struct ReviewHttp {
    egress: Arc<Egress>,
    client: reqwest::Client,
}

impl std::fmt::Debug for ReviewHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReviewHttp")
            .field("egress", &self.egress)
            .finish_non_exhaustive()
    }
}

impl ReviewHttp {
    /// Under the egress policy that also allows `allowed_networks` (CIDRs or addresses).
    pub(crate) fn new(allowed_networks: &[String]) -> Result<Self, String> {
        let egress = Arc::new(Egress::new(allowed_networks)?);
        let client = egress
            .client_builder()
            .user_agent(concat!("toolmesh-review/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("the HTTP client cannot be built: {e}"))?;
        Ok(Self { egress, client })
    }
}

/// What the reviewer said.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// The call runs without an approval.
    Allow { reason: Option<String> },
    /// `policy_denied`; nothing runs.
    Deny { reason: Option<String> },
    /// People decide: the reviewer said so (`why` is `None`, with its `reason` if it gave
    /// one), or it gave no clear answer (`why`).
    Ask {
        reason: Option<String>,
        why: Option<ReviewError>,
    },
}

/// Why the reviewer gave no clear answer: each one is `ask`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReviewError {
    #[error("the review request does not serialize")]
    Encode(#[source] serde_json::Error),
    #[error("the reviewer command cannot start")]
    Spawn(#[source] std::io::Error),
    #[error("the request cannot be written to the reviewer command")]
    Stdin(#[source] std::io::Error),
    #[error("the reviewer command's output cannot be read")]
    Output(#[source] std::io::Error),
    #[error("the reviewer command exited with {status}{}", stderr_note(.stderr))]
    Exit { status: ExitStatus, stderr: String },
    #[error("the web egress policy refuses the reviewer's URL (TOOLMESH_WEB_ALLOWED_NETWORKS opens non-public networks)")]
    Refused(#[source] EgressError),
    #[error("the POST to the reviewer failed")]
    Send(#[source] reqwest::Error),
    #[error("the reviewer answered HTTP {0}")]
    Status(reqwest::StatusCode),
    #[error("the reviewer's answer is over {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("the answer is not JSON")]
    NotJson(#[source] serde_json::Error),
    #[error("the answer is {0}, not a JSON object")]
    NotAnObject(&'static str),
    #[error("the answer has no \"decision\"")]
    NoDecision,
    #[error("the decision {0} is none of \"allow\", \"deny\", \"ask\"")]
    UnknownDecision(String),
    #[error("the reason is {0}, not a string")]
    BadReason(&'static str),
}

fn stderr_note(stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() {
        String::new()
    } else {
        format!(" (stderr: {stderr})")
    }
}

/// A reviewer's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Allow,
    Deny,
    Ask,
}

/// Shows `request` (the encoded `{"approval", "arguments"}`) to `review`'s reviewer within its
/// timeout. Never fails: what is not a clear answer is [`Verdict::Ask`] with why.
pub(crate) async fn ask_reviewer(review: &Review, http: &ReviewHttp, request: Vec<u8>) -> Verdict {
    let answer = match &review.reviewer {
        Reviewer::Command(command) => run_command(command, request, review.timeout).await,
        Reviewer::Url(url) => tokio::time::timeout(review.timeout, post(http, url, request))
            .await
            .unwrap_or(Err(ReviewError::TimedOut(review.timeout))),
    };
    match answer.and_then(|body| parse_answer(&body)) {
        Ok((Decision::Allow, reason)) => Verdict::Allow { reason },
        Ok((Decision::Deny, reason)) => Verdict::Deny { reason },
        Ok((Decision::Ask, reason)) => Verdict::Ask { reason, why: None },
        Err(why) => Verdict::Ask {
            reason: None,
            why: Some(why),
        },
    }
}

/// `sh -c command`, `request` on stdin: its stdout once it exited 0.
async fn run_command(
    command: &str,
    request: Vec<u8>,
    timeout: Duration,
) -> Result<Vec<u8>, ReviewError> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(ReviewError::Spawn)?;
    let group = child.id();
    let answer = tokio::time::timeout(timeout, exchange(&mut child, request))
        .await
        .unwrap_or(Err(ReviewError::TimedOut(timeout)));
    if answer.is_err() {
        if let Some(group) = group {
            kill_group(group).await;
        }
    }
    answer
}

/// Writes the request, reads stdout (bounded) and stderr (the first bytes kept) together, so
/// that neither side waits on a full pipe, then waits for the exit.
async fn exchange(child: &mut Child, request: Vec<u8>) -> Result<Vec<u8>, ReviewError> {
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(ReviewError::Spawn(std::io::Error::other(
            "the reviewer command's pipes are missing",
        )));
    };
    let write = async move {
        match stdin.write_all(&request).await {
            // A reviewer may answer without reading the request.
            Err(e) if e.kind() != ErrorKind::BrokenPipe => Err(ReviewError::Stdin(e)),
            _ => Ok(()),
        }
        // `stdin` is dropped here: the reviewer reads its end.
    };
    let (_, answer, stderr) = tokio::try_join!(
        write,
        read_bounded(stdout, MAX_ANSWER_BYTES),
        read_head(stderr, MAX_STDERR_BYTES),
    )?;
    let status = child.wait().await.map_err(ReviewError::Output)?;
    if !status.success() {
        return Err(ReviewError::Exit {
            status,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        });
    }
    Ok(answer)
}

/// All of `reader`, or [`ReviewError::TooLarge`] past `max` bytes.
async fn read_bounded(reader: impl AsyncRead + Unpin, max: usize) -> Result<Vec<u8>, ReviewError> {
    let mut out = Vec::new();
    reader
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .await
        .map_err(ReviewError::Output)?;
    if out.len() > max {
        return Err(ReviewError::TooLarge);
    }
    Ok(out)
}

/// The first `max` bytes of `reader`, read to its end (the writer never blocks on us).
async fn read_head(mut reader: impl AsyncRead + Unpin, max: usize) -> Result<Vec<u8>, ReviewError> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = reader.read(&mut buf).await.map_err(ReviewError::Output)?;
        if n == 0 {
            return Ok(head);
        }
        let room = max.saturating_sub(head.len());
        head.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// Kills the reviewer's process group (`sh` and whatever it started), by `sh`'s own `kill`.
async fn kill_group(group: u32) {
    let killed = Command::new("sh")
        .arg("-c")
        .arg(format!("kill -KILL -{group} 2>/dev/null"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    if let Err(e) = killed {
        tracing::warn!(error = %e, group, "cannot kill the reviewer command's process group");
    }
}

/// POSTs `request` to `url`: the body of a 2xx answer.
async fn post(
    http: &ReviewHttp,
    url: &reqwest::Url,
    request: Vec<u8>,
) -> Result<Vec<u8>, ReviewError> {
    // An IP literal is checked here; a name, by the client's resolver as it connects.
    http.egress
        .check_url(url)
        .await
        .map_err(ReviewError::Refused)?;
    let mut response = http
        .client
        .post(url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(request)
        .send()
        .await
        .map_err(ReviewError::Send)?;
    if !response.status().is_success() {
        return Err(ReviewError::Status(response.status()));
    }
    if response
        .content_length()
        .is_some_and(|len| len > MAX_ANSWER_BYTES as u64)
    {
        return Err(ReviewError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReviewError::Send)? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_ANSWER_BYTES {
            return Err(ReviewError::TooLarge);
        }
    }
    Ok(body)
}

/// `{"decision": "allow"|"deny"|"ask", "reason"?}`.
fn parse_answer(body: &[u8]) -> Result<(Decision, Option<String>), ReviewError> {
    let value: Value = serde_json::from_slice(body).map_err(ReviewError::NotJson)?;
    let Value::Object(answer) = value else {
        return Err(ReviewError::NotAnObject(wire::json_kind(&value)));
    };
    let decision = match answer.get("decision") {
        None | Some(Value::Null) => return Err(ReviewError::NoDecision),
        Some(Value::String(d)) if d == "allow" => Decision::Allow,
        Some(Value::String(d)) if d == "deny" => Decision::Deny,
        Some(Value::String(d)) if d == "ask" => Decision::Ask,
        Some(other) => {
            let shown = display_safe(&shorten(&other.to_string(), 80)).into_owned();
            return Err(ReviewError::UnknownDecision(shown));
        }
    };
    let reason = match answer.get("reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) if r.trim().is_empty() => None,
        Some(Value::String(r)) => Some(shorten(r, MAX_REASON_CHARS)),
        Some(other) => return Err(ReviewError::BadReason(wire::json_kind(other))),
    };
    Ok((decision, reason))
}

/// What the reviewer decided for a call it let run or refused.
#[derive(Debug, Clone)]
pub(super) struct Reviewed {
    /// `allow`; otherwise `deny`.
    pub allowed: bool,
    pub reason: Option<String>,
}

/// Whether the call goes on to the approval gate after the review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterReview {
    /// The reviewer allowed it: it runs without an approval.
    Runs,
    /// People decide: the gate, as without a reviewer.
    Gate,
}

impl Call<'_> {
    /// Whether `request`, which the policy gates, is shown to the pre-reviewer: the policy
    /// names one and the call neither redeems an approval id nor rejects itself in band.
    pub(super) fn reviewed(&self, request: &ToolRequest) -> bool {
        self.policy.review().is_some()
            && request
                .approval
                .as_ref()
                .is_none_or(|a| a.id.is_none() && a.approved != Some(false))
    }

    /// Asks the pre-reviewer about a gated call: [`AfterReview::Runs`] (allow),
    /// [`AfterReview::Gate`] (ask, or no clear answer), or `policy_denied` (deny).
    pub(super) async fn pre_review(
        &mut self,
        target: &RegisteredTool,
        risk: RiskLevel,
        arguments: &Value,
    ) -> Result<AfterReview, ToolError> {
        let policy = self.policy.clone();
        let Some(review) = policy.review() else {
            return Ok(AfterReview::Gate);
        };
        let verdict = match self.review_request(target, risk, arguments) {
            Ok(request) => ask_reviewer(review, &self.core.config.review_http, request).await,
            Err(why) => Verdict::Ask {
                reason: None,
                why: Some(why),
            },
        };
        let reviewed = match verdict {
            Verdict::Ask { reason, why: None } => {
                tracing::info!(
                    reason = reason.as_deref(),
                    "the pre-reviewer asks people to decide"
                );
                return Ok(AfterReview::Gate);
            }
            Verdict::Ask { why: Some(why), .. } => {
                tracing::warn!(error = %DisplayChain(&why), "the pre-reviewer gave no clear answer: people decide");
                return Ok(AfterReview::Gate);
            }
            Verdict::Allow { reason } => Reviewed {
                allowed: true,
                reason,
            },
            Verdict::Deny { reason } => Reviewed {
                allowed: false,
                reason,
            },
        };
        tracing::info!(
            decision = if reviewed.allowed { "allow" } else { "deny" },
            reason = reviewed.reason.as_deref(),
            "the pre-reviewer decided"
        );
        if let Some(audit) = self.audit.as_mut() {
            audit.reviewed(REVIEWED_BY, policy.revision());
        }
        let allowed = reviewed.allowed;
        self.reviewed = Some(reviewed);
        if allowed {
            Ok(AfterReview::Runs)
        } else {
            Err(self.review_denied())
        }
    }

    /// `{"approval", "arguments"}`, encoded.
    fn review_request(
        &self,
        target: &RegisteredTool,
        risk: RiskLevel,
        arguments: &Value,
    ) -> Result<Vec<u8>, ReviewError> {
        let rule = self.rule.as_deref();
        let request = json!({
            "approval": {
                "id": null,
                "account": self.ctx.account,
                "session_id": self.ctx.session_id,
                "invocation_id": self.ctx.invocation_id,
                "tool_name": target.spec.name,
                "risk_level": risk,
                "side_effects": target.spec.side_effects,
                "arguments_sha256": arguments_sha256(arguments),
                "arguments_preview": arguments_preview(arguments, PREVIEW_MAX_CHARS),
                "status": "pending",
                "created_at": toolmesh_kernel::time::now_rfc3339(),
                "expires_at": null,
                "decided_by": null,
                "decided_at": null,
                "reason": null,
                "rule_id": rule.map(|r| r.id.as_str()),
                "policy_revision": self.policy.revision(),
                "reviewers": rule.and_then(|r| r.reviewers.as_deref()),
                "quorum": rule.map_or(1, |r| r.quorum),
            },
            "arguments": arguments,
        });
        serde_json::to_vec(&request).map_err(ReviewError::Encode)
    }

    /// `policy_denied` by the reviewer: its reason, the rule that gated the call (if one did)
    /// and the revision.
    fn review_denied(&self) -> ToolError {
        let reason = self.reviewed.as_ref().and_then(|r| r.reason.as_deref());
        let because = reason.map_or_else(String::new, |reason| format!(": {reason}"));
        let mut error = ToolError::new(
            ErrorCode::PolicyDenied,
            format!("the pre-reviewer denies this call{because}"),
        )
        .with("reviewed_by", REVIEWED_BY)
        .with("reason", reason);
        if let Some(rule) = &self.rule {
            error = error.with("rule_id", rule.id.as_str());
        }
        error.with("policy_revision", self.policy.revision())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, expect: Result<(Decision, Option<&str>), &str>) {
        match (parse_answer(body.as_bytes()), expect) {
            (Ok((decision, reason)), Ok((want, want_reason))) => {
                assert_eq!(decision, want, "{body}");
                assert_eq!(reason.as_deref(), want_reason, "{body}");
            }
            (Err(e), Err(fragment)) => {
                let text = DisplayChain(&e).to_string();
                assert!(text.contains(fragment), "{body}: {text}");
            }
            (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn answers_are_allow_deny_or_ask_and_anything_else_says_why() {
        check(r#"{"decision": "allow"}"#, Ok((Decision::Allow, None)));
        check(
            "{\"decision\": \"deny\", \"reason\": \"no prod\"}\n",
            Ok((Decision::Deny, Some("no prod"))),
        );
        check(
            r#"{"decision": "ask", "reason": null, "score": 0.4}"#,
            Ok((Decision::Ask, None)),
        );
        check(
            r#"{"decision": "allow", "reason": "  "}"#,
            Ok((Decision::Allow, None)),
        );
        check("", Err("not JSON"));
        check("allow", Err("not JSON"));
        check(r#"{"decision": "allow"} trailing"#, Err("not JSON"));
        check(r#"["allow"]"#, Err("an array, not a JSON object"));
        check(r#""allow""#, Err("a string, not a JSON object"));
        check("{}", Err("no \"decision\""));
        check(r#"{"decision": null}"#, Err("no \"decision\""));
        check(r#"{"decision": "Allow"}"#, Err("\"Allow\" is none of"));
        check(r#"{"decision": "yes"}"#, Err("\"yes\" is none of"));
        check(r#"{"decision": true}"#, Err("true is none of"));
        check(
            r#"{"decision": "allow", "reason": 5}"#,
            Err("reason is a number"),
        );
    }

    #[test]
    fn a_long_reason_is_cut() {
        let long = "x".repeat(MAX_REASON_CHARS * 2);
        let body = json!({"decision": "deny", "reason": long}).to_string();
        let (_, reason) = parse_answer(body.as_bytes()).unwrap();
        assert!(reason.unwrap().chars().count() <= MAX_REASON_CHARS + 1);
    }

    fn command(command: &str, timeout_s: u64) -> Review {
        Review {
            reviewer: Reviewer::Command(command.into()),
            timeout: Duration::from_secs(timeout_s),
        }
    }

    async fn verdict(review: &Review) -> Verdict {
        let http = ReviewHttp::new(&[]).unwrap();
        ask_reviewer(
            review,
            &http,
            br#"{"approval": {}, "arguments": {"x": 1}}"#.to_vec(),
        )
        .await
    }

    #[tokio::test]
    async fn a_command_reads_the_request_and_answers_on_stdout() {
        let echo = command(
            r#"grep -q '"x": 1' && echo '{"decision": "allow", "reason": "saw x"}'"#,
            10,
        );
        match verdict(&echo).await {
            Verdict::Allow { reason } => assert_eq!(reason.as_deref(), Some("saw x")),
            other => panic!("{other:?}"),
        }
        // It need not read the request.
        let blunt = command(r#"echo '{"decision": "deny"}'"#, 10);
        assert!(matches!(
            verdict(&blunt).await,
            Verdict::Deny { reason: None }
        ));
    }

    #[tokio::test]
    async fn a_failing_slow_or_chatty_command_is_ask_with_why() {
        let cases = [
            (
                command(
                    "echo '{\"decision\": \"allow\"}'; echo broken >&2; exit 3",
                    10,
                ),
                "exited with exit status: 3 (stderr: broken)",
            ),
            (command("sleep 5", 1), "no answer within 1s"),
            (
                command("sleep 5 & echo '{\"decision\": \"allow\"}'", 1),
                "no answer within 1s",
            ),
            (command("head -c 70000 /dev/zero", 10), "over 65536 bytes"),
            (command("exec 0<&-; echo not json", 10), "not JSON"),
        ];
        for (review, says) in cases {
            match verdict(&review).await {
                Verdict::Ask { why: Some(why), .. } => {
                    let text = DisplayChain(&why).to_string();
                    assert!(text.contains(says), "{review:?}: {text}");
                }
                other => panic!("{review:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_url_the_egress_policy_refuses_is_ask() {
        let review = Review {
            reviewer: Reviewer::Url("http://127.0.0.1:9/review".parse().unwrap()),
            timeout: Duration::from_secs(5),
        };
        match verdict(&review).await {
            Verdict::Ask {
                why: Some(ReviewError::Refused(e)),
                ..
            } => assert!(e.to_string().contains("loopback"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
