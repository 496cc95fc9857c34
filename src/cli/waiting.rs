//! What `call` tells a person about an approval: the hint when a call needs one, and what a
//! call that waits for a decision (`--wait`) says while it waits.

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use toolmesh_kernel::subjects::public::{self, ApprovalVerb};
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::Account;

use crate::cli::mesh::{url_has_user, Mesh};
use crate::cli::output::hint;

/// What a person does next about a call that waits for approval. Only a NATS user allowed to
/// publish on the account's `decide` subject can decide: on a cluster with authenticated
/// users (the compose cluster's `approver`) that is not the user who called, and with in-band
/// decisions off `--approve` changes nothing.
pub(super) fn approval_hint(
    id: &str,
    account: &Account,
    nats_url: &str,
    decided_in_band: bool,
) -> String {
    let decide = public::approvals(account, ApprovalVerb::Decide);
    let mut text = format!("\napproval required: {id} waits for a decision on {decide}.\n");
    if decided_in_band {
        text.push_str(
            "Your --approve/--reject did not decide it: in-band decisions are off on this cluster (TOOLMESH_APPROVAL_IN_BAND=0).\n",
        );
    }
    text.push_str(&who_decides(nats_url, &decide, "In another terminal"));
    text.push_str(&format!(
        "  toolmesh approvals approve {id} --account {account}\nthen repeat this command with --approval-id {id} (or add --wait 300 to wait for the decision here)."
    ));
    text
}

/// How often `call --wait` says it still waits.
const STILL_WAITING_EVERY: Duration = Duration::from_secs(30);

/// `call --wait`: the call, and on stderr what it waits for while it is parked on an approval
/// (its RunEvents on `events` say so, PROTOCOL.md "RunEvents"): at once the approval, its tool
/// and risk and who may decide it, then a line every [`STILL_WAITING_EVERY`], and the
/// decision when it comes. Without permission to hear the events the call just waits.
pub(super) async fn wait_telling(
    mesh: &Mesh,
    call: impl std::future::Future<Output = anyhow::Result<Value>>,
    events: String,
    account: &Account,
    nats_url: &str,
    wait_s: u64,
) -> anyhow::Result<Value> {
    let mut heard = match mesh.client.subscribe(events.clone()).await {
        Ok(sub) => Some(sub),
        Err(e) => {
            hint(&format!(
                "cannot watch {events} ({e}); waiting for the reply only"
            ));
            None
        }
    };
    let refused = mesh.refusals.of_subscription(&events);
    tokio::pin!(call, refused);
    let mut parked: Option<(String, tokio::time::Instant)> = None;
    let mut still = tokio::time::interval(STILL_WAITING_EVERY);
    still.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // The events first: the gateway sends the decision's event before the reply, so
            // it is here by the time the reply is, and said before it.
            biased;
            msg = async { heard.as_mut()?.next().await }, if heard.is_some() => {
                let Some(msg) = msg else {
                    heard = None;
                    continue;
                };
                let Ok(event) = serde_json::from_slice::<Value>(&msg.payload) else { continue };
                let approval = &event["approval_request"];
                let id = approval["id"]
                    .as_str()
                    .or_else(|| event["approval_id"].as_str())
                    .unwrap_or("appr_…")
                    .to_owned();
                match event["kind"].as_str() {
                    Some("approval_required") if parked.is_none() => {
                        hint(&parked_hint(&id, approval, account, nats_url, wait_s));
                        parked = Some((id, tokio::time::Instant::now()));
                        still.reset();
                    }
                    Some(kind @ ("approved" | "rejected")) => {
                        let by = approval["decided_by"]
                            .as_str()
                            .map(|by| format!(" by {}", DisplaySafe(by)))
                            .unwrap_or_default();
                        hint(&format!("{id} {kind}{by}"));
                        parked = None;
                    }
                    _ => {}
                }
            }
            _ = still.tick(), if parked.is_some() => {
                if let Some((id, since)) = &parked {
                    let waited = since.elapsed().as_secs();
                    hint(&format!("still waiting for {id} ({waited} s of {wait_s} s)"));
                }
            }
            refusal = &mut refused, if heard.is_some() => {
                hint(&format!("not told while waiting: {refusal}"));
                heard = None;
            }
            reply = &mut call => return reply,
        }
    }
}

/// What `call --wait` says at once when its call parks on approval `id`: the first line names
/// the approval, its tool and risk and the subject that decides it; then who decides it and
/// the command to run.
fn parked_hint(
    id: &str,
    approval: &Value,
    account: &Account,
    nats_url: &str,
    wait_s: u64,
) -> String {
    let decide = public::approvals(account, ApprovalVerb::Decide);
    let tool = DisplaySafe(approval["tool_name"].as_str().unwrap_or("?"));
    let risk = approval["risk_level"].as_str().unwrap_or("?");
    let mut text = format!(
        "approval required: {id} ({tool}, risk {risk}) waits for a decision on {decide}; waiting up to {wait_s} s.\n"
    );
    text.push_str(&who_decides(
        nats_url,
        &decide,
        "Decide it in another terminal",
    ));
    text.push_str(&format!(
        "  toolmesh approvals approve {id} --account {account}    (or: reject)"
    ));
    text
}

/// `lead`, then who may decide an approval on `decide`: where the caller names a NATS user (an
/// authenticated cluster), a user allowed to publish there, as the compose cluster's approver.
fn who_decides(nats_url: &str, decide: &impl std::fmt::Display, lead: &str) -> String {
    if url_has_user(nats_url) {
        format!(
            "{lead}, as a NATS user allowed to publish on {decide} (on the compose cluster: the approver user, TOOLMESH_NATS_URL=nats://approver:<password>@<host>:4222 TOOLMESH_NATS_INBOX_PREFIX=_INBOX.approver):\n"
        )
    } else {
        format!("{lead}:\n")
    }
}
