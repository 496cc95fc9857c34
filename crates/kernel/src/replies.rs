//! Where a node may answer (PROTOCOL.md "Tenancy and trust", "Replies go to inboxes only").
//!
//! A NATS request names its own reply subject, and a node's user may publish on every
//! `toolmesh.>` subject. Were a node to answer wherever a request asks, any account could make
//! it publish on another account's subjects: a status reply landing on `…cancel.<b>` cancels
//! b's call, one on `…events.<b>.…` forges b's RunEvents. So a node takes a request only when
//! its reply subject is under one of the [`ReplyPrefixes`] (`_INBOX.` unless
//! `TOOLMESH_REPLY_PREFIXES` names others): [`ReplyPrefixes::screen`] drops every other request
//! before anything reads its body, so nothing it asked for is done and nothing is published.
//!
//! Invariant: every subscription that takes requests from outside the node's own users (the
//! public subjects of PROTOCOL.md) is screened. A request without a reply subject passes: it
//! makes the node publish nothing of its own choosing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::Message;
use futures::{Stream, StreamExt};

use crate::text::DisplaySafe;

/// The reply prefix every NATS client uses unless told otherwise.
pub const DEFAULT_REPLY_PREFIX: &str = "_INBOX.";

/// How often one account's refused requests are logged, at most.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// A prefix that cannot be a reply prefix, with why.
#[derive(Debug, thiserror::Error)]
#[error("{prefix:?} cannot be a reply prefix: {reason}")]
pub struct BadReplyPrefix {
    pub prefix: String,
    pub reason: &'static str,
}

/// The subjects a node answers on: those under one of its prefixes. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ReplyPrefixes {
    prefixes: Arc<[String]>,
    /// When each account's refusal was last logged.
    logged: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Default for ReplyPrefixes {
    fn default() -> Self {
        Self::new([DEFAULT_REPLY_PREFIX]).expect("the default prefix is valid")
    }
}

impl ReplyPrefixes {
    /// The prefixes given, each ending in `.` (one is added where missing), so that `_INBOX`
    /// never admits `_INBOXES.x`. A prefix under `toolmesh.` or `$` would hand those subjects
    /// back to any caller, and a wildcard would match nothing literally: both are refused.
    pub fn new<S: AsRef<str>>(
        prefixes: impl IntoIterator<Item = S>,
    ) -> Result<ReplyPrefixes, BadReplyPrefix> {
        let mut clean = Vec::new();
        for prefix in prefixes {
            let prefix = prefix.as_ref().trim();
            let bad = |reason| BadReplyPrefix {
                prefix: prefix.to_owned(),
                reason,
            };
            if prefix.is_empty() || prefix == "." {
                return Err(bad("it is empty"));
            }
            if prefix.starts_with("toolmesh.") || prefix == "toolmesh" || prefix.starts_with('$') {
                return Err(bad(
                    "nodes would then answer on toolmesh's own or the server's subjects",
                ));
            }
            if prefix
                .chars()
                .any(|c| c == '*' || c == '>' || c.is_whitespace())
            {
                return Err(bad("it holds a wildcard or a space"));
            }
            let mut prefix = prefix.to_owned();
            if !prefix.ends_with('.') {
                prefix.push('.');
            }
            clean.push(prefix);
        }
        if clean.is_empty() {
            return Err(BadReplyPrefix {
                prefix: String::new(),
                reason: "no prefix is given",
            });
        }
        Ok(ReplyPrefixes {
            prefixes: clean.into(),
            logged: Default::default(),
        })
    }

    /// The prefixes, each ending in `.`.
    pub fn prefixes(&self) -> &[String] {
        &self.prefixes
    }

    /// Whether a node may publish a reply on `subject`.
    pub fn allows(&self, subject: &str) -> bool {
        self.prefixes
            .iter()
            .any(|p| subject.len() > p.len() && subject.starts_with(p.as_str()))
    }

    /// Whether `message` may be taken: it has no reply subject, or one this node answers on.
    /// A refusal is logged, at most once per [`REFUSAL_LOG_EVERY`] per account.
    pub fn admits(&self, message: &Message) -> bool {
        let Some(reply) = message.reply.as_deref() else {
            return true;
        };
        if self.allows(reply) {
            return true;
        }
        self.log_refusal(&message.subject, reply);
        false
    }

    /// `messages` without those [`ReplyPrefixes::admits`] refuses.
    pub fn screen<S>(&self, messages: S) -> impl Stream<Item = Message> + Send + 'static
    where
        S: Stream<Item = Message> + Send + 'static,
    {
        let prefixes = self.clone();
        messages.filter(move |message| std::future::ready(prefixes.admits(message)))
    }

    fn log_refusal(&self, subject: &str, reply: &str) {
        // `toolmesh.v1.<kind>.<account>[.…]`: the fourth token; status requests have none.
        let account = subject.split('.').nth(3).unwrap_or("-");
        let now = Instant::now();
        {
            let mut logged = self.logged.lock().expect("reply refusal log lock");
            match logged.get(account) {
                Some(at) if now.duration_since(*at) < REFUSAL_LOG_EVERY => return,
                _ => {}
            }
            // Bounded: a flood of invented account names cannot grow this without end.
            if logged.len() >= 4096 {
                logged.retain(|_, at| now.duration_since(*at) < REFUSAL_LOG_EVERY);
            }
            logged.insert(account.to_owned(), now);
        }
        tracing::warn!(
            subject = %DisplaySafe(subject),
            reply = %DisplaySafe(reply),
            account = %DisplaySafe(account),
            prefixes = ?self.prefixes,
            "refused a request whose reply subject is not an inbox; nothing was done and nothing answered (logged once a minute per account; TOOLMESH_REPLY_PREFIXES names the prefixes)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(subject: &str, reply: Option<&str>) -> Message {
        Message {
            subject: subject.into(),
            reply: reply.map(Into::into),
            payload: Default::default(),
            headers: None,
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn only_subjects_under_an_inbox_prefix_are_answered() {
        let prefixes = ReplyPrefixes::default();
        assert!(prefixes.allows("_INBOX.abc.1"));
        assert!(prefixes.allows("_INBOX.acme.x"));
        for subject in [
            "toolmesh.v1.cancel.globex",
            "toolmesh.v1.events.globex.inv_1",
            "toolmesh.v1.providers.announce",
            "_INBOXES.x",
            "_INBOX.",
            "_INBOX",
            "",
        ] {
            assert!(!prefixes.allows(subject), "{subject:?}");
        }
    }

    #[test]
    fn more_prefixes_may_be_named_and_get_their_dot() {
        let prefixes = ReplyPrefixes::new(["_INBOX", "replies.acme"]).expect("valid");
        assert_eq!(prefixes.prefixes(), ["_INBOX.", "replies.acme."]);
        assert!(prefixes.allows("replies.acme.7"));
        assert!(!prefixes.allows("replies.acmex.7"));
    }

    #[test]
    fn prefixes_that_would_reopen_the_hole_are_refused() {
        for bad in [
            "toolmesh.v1",
            "toolmesh",
            "$JS.API",
            "_INBOX.*",
            "a >",
            "",
            ".",
        ] {
            let error = ReplyPrefixes::new([bad]).expect_err(bad);
            assert_eq!(error.prefix, bad.trim(), "{error}");
        }
        assert!(ReplyPrefixes::new(Vec::<String>::new()).is_err());
    }

    #[tokio::test]
    async fn the_screen_drops_requests_that_would_answer_elsewhere() {
        let prefixes = ReplyPrefixes::default();
        let messages = futures::stream::iter([
            message("toolmesh.v1.call.acme", Some("toolmesh.v1.cancel.globex")),
            message("toolmesh.v1.call.acme", Some("_INBOX.acme.1")),
            message("toolmesh.v1.approvals.acme.decided", None),
            message("toolmesh.v1.status", Some("toolmesh.v1.events.globex.inv")),
        ]);
        let kept: Vec<_> = prefixes
            .screen(messages)
            .map(|m| m.reply.map(|r| r.to_string()))
            .collect()
            .await;
        assert_eq!(kept, [Some("_INBOX.acme.1".to_owned()), None]);
    }
}
