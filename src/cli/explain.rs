//! `toolmesh approvals explain`: which rule made an approval, who may decide it, who did and
//! why, in lines for a person (PROTOCOL.md "Approval policy", "Why, on the record").

use serde_json::Value;

use toolmesh_kernel::text::DisplaySafe;

/// The explanation of `approval` (an ApprovalRequest as `get` answers it), line by line.
pub(super) fn explain(approval: &Value) -> Vec<String> {
    let text = |name: &str| approval[name].as_str().map(|s| DisplaySafe(s).to_string());
    let mut lines = vec![format!(
        "approval {} of account {}: {} ({} risk), {}",
        text("id").unwrap_or_default(),
        text("account").unwrap_or_default(),
        text("tool_name").unwrap_or_default(),
        text("risk_level").unwrap_or_default(),
        text("status").unwrap_or_default(),
    )];
    lines.push(match (text("rule_id"), text("policy_revision")) {
        (Some(rule), Some(revision)) => format!(
            "asked for by policy rule {rule} (policy revision {})",
            short(Some(revision))
        ),
        (Some(rule), None) => format!("asked for by policy rule {rule}"),
        _ => "asked for by the approval mode and the tool's risk level (no rule matched)".into(),
    });
    match text("reviewers") {
        Some(group) => {
            let quorum = approval["quorum"].as_u64().unwrap_or(1);
            let escalated = if approval["escalated"] == true {
                ", after its first deadline passed (escalated)"
            } else {
                ""
            };
            lines.push(format!(
                "routed to reviewer group {group}; {quorum} approval(s) by distinct members needed{escalated}"
            ));
        }
        None => lines.push("decided by anyone who may decide in the account".into()),
    }
    for decision in approval["decisions"].as_array().into_iter().flatten() {
        let who = decision["approver"].as_str().unwrap_or("?");
        let what = if decision["approved"] == true {
            "approved"
        } else {
            "rejected"
        };
        let reason = decision["reason"]
            .as_str()
            .map(|r| format!(": {}", DisplaySafe(r)))
            .unwrap_or_default();
        lines.push(format!(
            "  {} {what} at {}{reason}",
            DisplaySafe(who),
            decision["at"].as_str().unwrap_or("?")
        ));
    }
    if let Some(by) = text("decided_by") {
        let reason = text("reason")
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        lines.push(format!(
            "decided by {by} at {}{reason}",
            text("decided_at").unwrap_or_default()
        ));
    }
    if approval["edited"] == true {
        lines.push(format!(
            "the reviewer edited the arguments before approving: the call runs arguments {}, not the {} it was made with",
            short(text("arguments_sha256")),
            short(text("original_arguments_sha256"))
        ));
    }
    lines
}

/// The first 12 digits of a hash, for a person.
fn short(sha: Option<String>) -> String {
    sha.unwrap_or_default().chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_explanation_names_rule_reviewers_decisions_and_decider() {
        let approval = json!({
            "id": "appr_1", "account": "acme", "tool_name": "run_command", "risk_level": "high",
            "status": "approved", "rule_id": "ops-commands", "policy_revision": "0123456789abcdef",
            "reviewers": "ops", "quorum": 2, "escalated": false,
            "decisions": [
                {"approver": "alice", "approved": true, "at": "t1", "reason": "looks fine"},
                {"approver": "bob", "approved": true, "at": "t2", "reason": null}
            ],
            "decided_by": "bob", "decided_at": "t2", "reason": null, "edited": true,
            "arguments_sha256": "aaaaaaaaaaaaaaaa", "original_arguments_sha256": "bbbbbbbbbbbbbbbb"
        });
        let lines = explain(&approval);
        let text = lines.join("\n");
        for part in [
            "approval appr_1 of account acme: run_command (high risk), approved",
            "policy rule ops-commands (policy revision 0123456789ab)",
            "reviewer group ops; 2 approval(s)",
            "alice approved at t1: looks fine",
            "bob approved at t2",
            "decided by bob at t2",
            "edited the arguments before approving: the call runs arguments aaaaaaaaaaaa, not the bbbbbbbbbbbb",
        ] {
            assert!(text.contains(part), "{part:?} in\n{text}");
        }
        let by_mode = explain(&json!({"id": "appr_2", "status": "pending"})).join("\n");
        assert!(by_mode.contains("no rule matched"), "{by_mode}");
        assert!(by_mode.contains("anyone who may decide"), "{by_mode}");
        assert!(!by_mode.contains("edited"), "{by_mode}");
    }
}
