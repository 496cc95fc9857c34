//! The policy file's hooks to the world outside: `[review]`, the pre-reviewer every call about
//! to need an approval is shown to first, and `[[notify]]`, the webhooks approval events are
//! posted to (PROTOCOL.md "Approval policy": "Pre-review", "Notifications"). The kernel only
//! reads and checks them; the gateway runs the reviewer and the approval role delivers the
//! notifications.

use std::time::Duration;

use serde::Deserialize;
use url::Url;

/// `[review] timeout_s` when the file gives none.
pub const DEFAULT_REVIEW_TIMEOUT_S: u64 = 10;
/// Longest `[review] timeout_s`: a call waits for its pre-reviewer this long at most.
pub const MAX_REVIEW_TIMEOUT_S: u64 = 120;

/// Who answers `allow` / `deny` / `ask` before a person is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reviewer {
    /// Run with `sh -c`, the request on standard input, the answer on standard output.
    Command(String),
    /// POSTed to, through the web egress policy.
    Url(Url),
}

/// `[review]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    pub reviewer: Reviewer,
    /// How long an answer may take; past it the answer is `ask`.
    pub timeout: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReviewFile {
    command: Option<String>,
    url: Option<String>,
    timeout_s: Option<u64>,
}

impl ReviewFile {
    pub(super) fn check(self) -> Result<Review, String> {
        let reviewer = match (self.command, self.url) {
            (Some(command), None) if !command.trim().is_empty() => Reviewer::Command(command),
            (None, Some(url)) => {
                Reviewer::Url(http_url(&url).map_err(|e| format!("[review] url: {e}"))?)
            }
            (Some(_), None) => return Err("[review] command: empty".into()),
            (Some(_), Some(_)) => {
                return Err("[review]: give command or url, not both".into());
            }
            (None, None) => return Err("[review]: give command or url".into()),
        };
        let timeout_s = self.timeout_s.unwrap_or(DEFAULT_REVIEW_TIMEOUT_S);
        if !(1..=MAX_REVIEW_TIMEOUT_S).contains(&timeout_s) {
            return Err(format!(
                "[review] timeout_s: {timeout_s} is not within 1 to {MAX_REVIEW_TIMEOUT_S}"
            ));
        }
        Ok(Review {
            reviewer,
            timeout: Duration::from_secs(timeout_s),
        })
    }
}

/// An approval event a webhook may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyEvent {
    /// A new approval waits for a decision.
    Requested,
    /// Approved or rejected.
    Decided,
    /// Routed, once, to its rule's `escalate_to` group.
    Escalated,
    /// Its deadline passed undecided.
    Expired,
}

impl NotifyEvent {
    pub const ALL: [NotifyEvent; 4] = [
        NotifyEvent::Requested,
        NotifyEvent::Decided,
        NotifyEvent::Escalated,
        NotifyEvent::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::Requested => "requested",
            NotifyEvent::Decided => "decided",
            NotifyEvent::Escalated => "escalated",
            NotifyEvent::Expired => "expired",
        }
    }
}

/// How a notification's body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyFormat {
    /// The ApprovalRequest with `"event"`.
    #[default]
    Json,
    /// A Slack incoming-webhook message (`text` and `blocks`).
    Slack,
}

/// One `[[notify]]` webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notify {
    pub url: Url,
    /// The events posted; all four when the file names none.
    pub events: Vec<NotifyEvent>,
    pub format: NotifyFormat,
    /// The environment variable holding the HMAC-SHA256 secret that signs each body
    /// (`X-Toolmesh-Signature`); read by the node that delivers, never stored here.
    pub secret_env: Option<String>,
}

impl Notify {
    pub fn wants(&self, event: NotifyEvent) -> bool {
        self.events.contains(&event)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NotifyFile {
    url: String,
    events: Option<Vec<NotifyEvent>>,
    #[serde(default)]
    format: NotifyFormat,
    secret_env: Option<String>,
}

impl NotifyFile {
    pub(super) fn check(self, index: usize) -> Result<Notify, String> {
        let at = format!("[[notify]] #{}", index + 1);
        let url = http_url(&self.url).map_err(|e| format!("{at} url: {e}"))?;
        let events = match self.events {
            None => NotifyEvent::ALL.to_vec(),
            Some(events) if events.is_empty() => {
                return Err(format!(
                    "{at} events: name at least one, or leave it out for all"
                ))
            }
            Some(events) => events,
        };
        if let Some(var) = &self.secret_env {
            let valid = !var.is_empty()
                && var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !var.as_bytes()[0].is_ascii_digit();
            if !valid {
                return Err(format!(
                    "{at} secret_env: {var:?} is not an environment variable name"
                ));
            }
        }
        Ok(Notify {
            url,
            events,
            format: self.format,
            secret_env: self.secret_env,
        })
    }
}

/// An `http` or `https` URL with a host.
fn http_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("{text:?} is not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!("{text:?} is not an http or https URL with a host"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(text: &str) -> Result<Review, String> {
        toml::from_str::<ReviewFile>(text)
            .map_err(|e| e.to_string())?
            .check()
    }

    fn notify(text: &str) -> Result<Notify, String> {
        toml::from_str::<NotifyFile>(text)
            .map_err(|e| e.to_string())?
            .check(0)
    }

    #[test]
    fn a_review_is_a_command_or_a_url_with_a_bounded_timeout() {
        let r = review(r#"command = "./classify""#).unwrap();
        assert_eq!(r.reviewer, Reviewer::Command("./classify".into()));
        assert_eq!(r.timeout, Duration::from_secs(DEFAULT_REVIEW_TIMEOUT_S));
        let r = review("url = \"http://127.0.0.1:9/review\"\ntimeout_s = 3").unwrap();
        assert!(matches!(r.reviewer, Reviewer::Url(_)));
        assert_eq!(r.timeout, Duration::from_secs(3));
        for bad in [
            "",
            "command = \"x\"\nurl = \"http://a/\"",
            "command = \"  \"",
            "url = \"ftp://a/\"",
            "url = \"not a url\"",
            "command = \"x\"\ntimeout_s = 0",
            "command = \"x\"\ntimeout_s = 1000",
            "command = \"x\"\nretries = 2",
        ] {
            assert!(review(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_webhook_names_its_events_format_and_secret_variable() {
        let n = notify(r#"url = "https://hooks.example/x""#).unwrap();
        assert_eq!(n.events, NotifyEvent::ALL);
        assert_eq!(n.format, NotifyFormat::Json);
        let n = notify(
            "url = \"http://127.0.0.1:1/\"\nevents = [\"requested\"]\nformat = \"slack\"\nsecret_env = \"HOOK_SECRET\"",
        )
        .unwrap();
        assert!(n.wants(NotifyEvent::Requested) && !n.wants(NotifyEvent::Decided));
        assert_eq!(n.format, NotifyFormat::Slack);
        assert_eq!(n.secret_env.as_deref(), Some("HOOK_SECRET"));
        for bad in [
            "url = \"mailto:a@b\"",
            "url = \"http://a/\"\nevents = []",
            "url = \"http://a/\"\nevents = [\"created\"]",
            "url = \"http://a/\"\nformat = \"teams\"",
            "url = \"http://a/\"\nsecret_env = \"1X\"",
            "url = \"http://a/\"\nsecret_env = \"A-B\"",
        ] {
            let err = notify(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad}");
        }
    }
}
