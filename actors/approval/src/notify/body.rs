//! What a notification says: `json` (the ApprovalRequest with `"event"`) or `slack` (a Slack
//! incoming-webhook message, `text` and `blocks`).
//!
//! Everything in an approval but the console's address comes from a caller, so in Slack's
//! `mrkdwn` it is escaped (`&`, `<`, `>`: no link, mention or `<!channel>` can be made of it),
//! and the preview goes in a `rich_text_preformatted` element, which Slack shows as it is.

use serde_json::{json, Value};
use toolmesh_kernel::policy::NotifyEvent;
use toolmesh_kernel::text::shorten_middle;
use toolmesh_kernel::wire::ApprovalRequest;
use url::Url;

/// Characters of one field of a Slack message at most (Slack takes 2,000).
const SLACK_FIELD_CHARS: usize = 300;
/// Characters of the preview in a Slack message at most (Slack takes 3,000 per block); the
/// preview is bounded below that already, this only guards it.
const SLACK_PREVIEW_CHARS: usize = 2900;

/// The ApprovalRequest with `"event"`.
pub fn json_body(event: NotifyEvent, approval: &ApprovalRequest) -> Vec<u8> {
    let mut value = serde_json::to_value(approval).expect("an ApprovalRequest serializes");
    if let Value::Object(fields) = &mut value {
        fields.insert("event".into(), event.as_str().into());
    }
    serde_json::to_vec(&value).expect("JSON serializes")
}

/// A Slack incoming-webhook message naming tool, risk, account, session, reviewers, the
/// preview and, with `console`, the console's link.
pub fn slack_body(
    event: NotifyEvent,
    approval: &ApprovalRequest,
    console: Option<&Url>,
) -> Vec<u8> {
    let a = approval;
    let field = |text: &str| escape(&shorten_middle(text, SLACK_FIELD_CHARS));
    let session = a.session_id.as_ref().map_or("none", |s| s.as_str());
    let reviewers = a
        .reviewers
        .as_deref()
        .unwrap_or("anyone who decides in the account");
    let headline = match event {
        NotifyEvent::Requested => "Approval requested".to_owned(),
        NotifyEvent::Escalated => format!("Approval escalated to {}", field(reviewers)),
        NotifyEvent::Decided => format!(
            "Approval {} by {}",
            a.status.as_str(),
            field(a.decided_by.as_deref().unwrap_or("someone"))
        ),
        NotifyEvent::Expired => "Approval expired undecided".to_owned(),
    };
    let mut text = format!(
        "{headline}: {} ({} risk) in account {}, session {}, for {}",
        field(&a.tool_name),
        a.risk_level.as_str(),
        field(a.account.as_str()),
        field(session),
        field(reviewers),
    );
    if let Some(console) = console {
        text.push_str(&format!(" <{console}|Open the approvals console>"));
    }
    let mut fields = vec![
        ("Tool", field(&a.tool_name)),
        ("Risk", a.risk_level.as_str().to_owned()),
        ("Account", field(a.account.as_str())),
        ("Session", field(session)),
        ("Reviewers", field(reviewers)),
        ("Approval", field(&a.id)),
    ];
    if event == NotifyEvent::Decided {
        if let Some(reason) = &a.reason {
            fields.push(("Reason", field(reason)));
        }
    } else {
        fields.push(("Expires", field(&a.expires_at)));
    }
    let fields: Vec<Value> = fields
        .into_iter()
        .map(|(name, value)| json!({"type": "mrkdwn", "text": format!("*{name}*\n{value}")}))
        .collect();
    let preview = shorten_middle(&a.arguments_preview, SLACK_PREVIEW_CHARS);
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "mrkdwn", "text": format!("*{headline}*")}}),
        json!({"type": "section", "fields": fields}),
        json!({"type": "rich_text", "elements": [{"type": "rich_text_preformatted",
            "elements": [{"type": "text", "text": preview}]}]}),
    ];
    if let Some(console) = console {
        blocks.push(json!({"type": "actions", "elements": [{"type": "button",
            "text": {"type": "plain_text", "text": "Open the approvals console"},
            "url": console.as_str()}]}));
    }
    serde_json::to_vec(&json!({"text": text, "blocks": blocks})).expect("JSON serializes")
}

/// Text Slack shows as written in `mrkdwn`: its three control characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::tests::approval;

    fn parse(body: Vec<u8>) -> Value {
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn json_is_the_approval_request_with_its_event() {
        let body = parse(json_body(NotifyEvent::Escalated, &approval()));
        assert_eq!(body["event"], "escalated");
        assert_eq!(body["id"], "appr_1");
        assert_eq!(body["reviewers"], "ops");
        assert!(body.get("grantable").is_none(), "{body}");
    }

    #[test]
    fn slack_names_the_approval_links_the_console_and_makes_no_markup_of_its_data() {
        let mut a = approval();
        a.tool_name = "<!channel> & <https://evil.example|click>".into();
        let console = Url::parse("https://approvals.example/").unwrap();
        let body = parse(slack_body(NotifyEvent::Requested, &a, Some(&console)));
        let text = body["text"].as_str().unwrap();
        for words in ["Approval requested", "high risk", "acme", "s1", "ops"] {
            assert!(text.contains(words), "{words}: {text}");
        }
        assert!(text.contains("<https://approvals.example/|"), "{text}");
        let all = body.to_string();
        assert!(
            !all.contains("<!channel>") && !all.contains("<https://evil"),
            "{all}"
        );
        assert!(all.contains("&lt;!channel&gt; &amp; "), "{all}");
        let blocks = body["blocks"].as_array().unwrap();
        let preview = &blocks[2]["elements"][0]["elements"][0]["text"];
        assert_eq!(preview, "{\"command\": \"rm -rf /tmp/x\"}");
        assert_eq!(
            blocks.last().unwrap()["elements"][0]["url"],
            "https://approvals.example/"
        );

        a.status = toolmesh_kernel::wire::ApprovalStatus::Rejected;
        a.decided_by = Some("alice".into());
        let body = parse(slack_body(NotifyEvent::Decided, &a, None));
        assert!(body["text"]
            .as_str()
            .unwrap()
            .starts_with("Approval rejected by alice"));
        assert!(!body.to_string().contains("console"), "{body}");
    }
}
