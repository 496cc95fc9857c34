//! Permission violations the NATS server reports on a connection, so that a request it refused
//! fails at once instead of waiting out its timeout.
//!
//! A NATS server that refuses a publish or a subscription drops it and says so only on the
//! connection (`-ERR 'Permissions Violation for Publish to "<subject>"'`); async-nats hands
//! that to the connection's event callback as a server error, and the request itself waits
//! until its timeout. [`Refusals`] keeps what the server refused so far (the callback records
//! it through a [`RefusalSink`]); a request races [`Refusals::of_request`] and ends with a
//! [`Refused`] that says which permission, on which subject, for which user, and for a refused
//! reply inbox which prefix to set.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::{broadcast, watch};

/// What the server refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Publishing to a subject.
    Publish,
    /// Subscribing to a subject.
    Subscribe,
    /// Publishing with a reply subject the user may not use.
    Reply,
}

/// One permission violation, as the server reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub permission: Permission,
    pub subject: String,
}

impl Violation {
    /// Reads a server error's text (async-nats's `ServerError::Other`, quotes trimmed, or the
    /// whole `-ERR '…'` line): `Permissions Violation for Publish to "<subject>"`,
    /// `… for Subscription to "<subject>"` (maybe `using queue "<queue>"`) or `… for Publish
    /// with Reply of "<subject>"`. Anything else is `None`.
    pub fn parse(text: &str) -> Option<Violation> {
        let lower = text.to_ascii_lowercase();
        let at = lower.find("permissions violation for ")?;
        let rest = &text[at + "permissions violation for ".len()..];
        let rest_lower = rest.to_ascii_lowercase();
        let (permission, rest) = if rest_lower.starts_with("publish with reply of ") {
            (Permission::Reply, &rest["publish with reply of ".len()..])
        } else if rest_lower.starts_with("publish to ") {
            (Permission::Publish, &rest["publish to ".len()..])
        } else if rest_lower.starts_with("subscription to ") {
            (Permission::Subscribe, &rest["subscription to ".len()..])
        } else {
            return None;
        };
        let subject = rest.trim_start().strip_prefix('"')?;
        let subject = &subject[..subject.find('"')?];
        if subject.is_empty() {
            return None;
        }
        Some(Violation {
            permission,
            subject: subject.to_owned(),
        })
    }
}

/// Who a connection is, for the messages: its NATS user (from the URL) and the prefix of its
/// reply inboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: Option<String>,
    pub inbox_prefix: String,
}

impl Identity {
    /// Whether `subject` is one of this connection's reply inboxes.
    fn is_inbox(&self, subject: &str) -> bool {
        subject
            .strip_prefix(self.inbox_prefix.as_str())
            .is_some_and(|rest| rest.starts_with('.'))
    }
}

/// A request, a subscription or a reply inbox the server refused: the error a caller gets at
/// once. Its text names the permission, the subject, the user and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub violation: Violation,
    pub identity: Identity,
}

impl Refused {
    /// Whether the refused subject is the connection's reply inbox (no request can be
    /// answered then).
    pub fn is_inbox(&self) -> bool {
        match self.violation.permission {
            Permission::Publish => false,
            Permission::Subscribe | Permission::Reply => {
                self.identity.is_inbox(&self.violation.subject)
            }
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = match &self.identity.user {
            Some(user) => format!("user {user:?}"),
            None => "this connection (no user in the URL)".to_owned(),
        };
        let Violation {
            permission,
            subject,
        } = &self.violation;
        if self.is_inbox() {
            let (verb, what) = match permission {
                Permission::Reply => ("publish with the reply subject", "Publish with Reply"),
                _ => ("subscribe to", "Subscription"),
            };
            write!(
                f,
                "NATS refused {who} permission to {verb} {subject}, where replies come (Permissions Violation for {what}): "
            )?;
            return match &self.identity.user {
                Some(user) => write!(
                    f,
                    "set TOOLMESH_NATS_INBOX_PREFIX=_INBOX.{user} (or --inbox-prefix _INBOX.{user}), the reply inbox prefix this user may subscribe under (docker/nats.conf gives each client user _INBOX.<user>.>)"
                ),
                None => write!(
                    f,
                    "set TOOLMESH_NATS_INBOX_PREFIX (or --inbox-prefix) to the reply inbox prefix your NATS user may subscribe under (_INBOX.<user> on the compose cluster), and the user in TOOLMESH_NATS_URL"
                ),
            };
        }
        let (verb, what) = match permission {
            Permission::Subscribe => ("subscribe to", "Subscription"),
            Permission::Publish | Permission::Reply => ("publish to", "Publish"),
        };
        write!(
            f,
            "NATS refused {who} permission to {verb} {subject} (Permissions Violation for {what}): connect as a NATS user allowed to {verb} it (the user in TOOLMESH_NATS_URL or --nats-url)"
        )
    }
}

impl std::error::Error for Refused {}

/// Records what the server refused (from the connection's event callback).
#[derive(Debug, Clone)]
pub struct RefusalSink {
    seen: Arc<watch::Sender<Arc<Vec<Violation>>>>,
    each: broadcast::Sender<Violation>,
}

impl RefusalSink {
    /// Records `event` when it is a permission violation; the violation, if it was one.
    pub fn record(&self, event: &async_nats::Event) -> Option<Violation> {
        let async_nats::Event::ServerError(async_nats::ServerError::Other(text)) = event else {
            return None;
        };
        let violation = Violation::parse(text)?;
        let _ = self.each.send(violation.clone());
        self.seen.send_if_modified(|seen| {
            if seen.contains(&violation) {
                return false;
            }
            let mut more = (**seen).clone();
            more.push(violation.clone());
            *seen = Arc::new(more);
            true
        });
        Some(violation)
    }
}

/// What the server refused a connection so far, and a wait for the next refusal that matters
/// to a request or subscription. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Refusals {
    identity: Arc<Identity>,
    seen: watch::Receiver<Arc<Vec<Violation>>>,
    each: broadcast::Sender<Violation>,
}

impl Refusals {
    /// A new record for a connection of `identity`, and the sink its event callback feeds.
    pub fn new(identity: Identity) -> (RefusalSink, Refusals) {
        let (sender, seen) = watch::channel(Arc::new(Vec::new()));
        let (each, _) = broadcast::channel(64);
        (
            RefusalSink {
                seen: Arc::new(sender),
                each: each.clone(),
            },
            Refusals {
                identity: Arc::new(identity),
                seen,
                each,
            },
        )
    }

    /// A record that never refuses anything (a connection nobody watches).
    pub fn none() -> Refusals {
        let (_sink, refusals) = Refusals::new(Identity {
            user: None,
            inbox_prefix: "_INBOX".to_owned(),
        });
        refusals
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The refusal that stops a request on `subject` already, if any: its publish, or the
    /// connection's reply inbox.
    pub fn request_refused(&self, subject: &str) -> Option<Refused> {
        self.find(|v| match v.permission {
            Permission::Publish => v.subject == subject,
            Permission::Subscribe | Permission::Reply => self.identity.is_inbox(&v.subject),
        })
    }

    /// Resolves once the server refused what a request on `subject` needs (at once when it
    /// did so earlier); pending forever otherwise.
    pub async fn of_request(&self, subject: &str) -> Refused {
        self.wait(|| self.request_refused(subject)).await
    }

    /// Resolves once the server refused a subscription to `subject`.
    pub async fn of_subscription(&self, subject: &str) -> Refused {
        self.wait(|| self.find(|v| v.permission == Permission::Subscribe && v.subject == subject))
            .await
    }

    /// Resolves once the server refused a publish to `subject`.
    pub async fn of_publish(&self, subject: &str) -> Refused {
        self.wait(|| self.find(|v| v.permission == Permission::Publish && v.subject == subject))
            .await
    }

    /// `request` (a request on `subject`), or the refusal that stops it, whichever comes
    /// first.
    pub async fn guard<T>(
        &self,
        subject: &str,
        request: impl Future<Output = T>,
    ) -> Result<T, Refused> {
        tokio::select! {
            done = request => Ok(done),
            refused = self.of_request(subject) => Err(refused),
        }
    }

    /// [`Refusals::guard`] for a long-lived connection (a node's): only a refusal of
    /// `subject` the server reports while `request` runs ends it, so a permission granted
    /// later (a server reload) is not held against later requests. The reply inbox is not
    /// watched: a node's is refused once, at its start, and said in its log then.
    pub async fn guard_publish<T>(
        &self,
        subject: &str,
        request: impl Future<Output = T>,
    ) -> Result<T, Refused> {
        let mut each = self.each.subscribe();
        let refused = async {
            loop {
                match each.recv().await {
                    Ok(v) if v.permission == Permission::Publish && v.subject == subject => {
                        return Refused {
                            violation: v,
                            identity: (*self.identity).clone(),
                        };
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                }
            }
        };
        tokio::select! {
            done = request => Ok(done),
            refused = refused => Err(refused),
        }
    }

    fn find(&self, matches: impl Fn(&Violation) -> bool) -> Option<Refused> {
        let seen = self.seen.borrow().clone();
        seen.iter().find(|v| matches(v)).map(|v| Refused {
            violation: v.clone(),
            identity: (*self.identity).clone(),
        })
    }

    async fn wait(&self, refused: impl Fn() -> Option<Refused>) -> Refused {
        let mut seen = self.seen.clone();
        seen.mark_unchanged();
        loop {
            if let Some(refused) = refused() {
                return refused;
            }
            if seen.changed().await.is_err() {
                // The connection is gone: nothing more will be refused.
                return std::future::pending().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(text: &str) -> async_nats::Event {
        async_nats::Event::ServerError(async_nats::ServerError::Other(text.to_owned()))
    }

    #[test]
    fn the_servers_words_are_read() {
        let read = |text: &str| Violation::parse(text);
        assert_eq!(
            read("Permissions Violation for Publish to \"toolmesh.v1.call.globex\""),
            Some(Violation {
                permission: Permission::Publish,
                subject: "toolmesh.v1.call.globex".into()
            })
        );
        assert_eq!(
            read("permissions violation for subscription to \"_INBOX.abc.*\" using queue \"q\""),
            Some(Violation {
                permission: Permission::Subscribe,
                subject: "_INBOX.abc.*".into()
            })
        );
        assert_eq!(
            read("Permissions Violation for Publish with Reply of \"_INBOX.x.y\""),
            Some(Violation {
                permission: Permission::Reply,
                subject: "_INBOX.x.y".into()
            })
        );
        assert_eq!(read("authorization violation"), None);
        assert_eq!(read("Permissions Violation for Publish to \"\""), None);
    }

    #[tokio::test]
    async fn a_request_ends_on_its_own_subject_or_its_inbox_only() {
        let identity = Identity {
            user: Some("acme".into()),
            inbox_prefix: "_INBOX".into(),
        };
        let (sink, refusals) = Refusals::new(identity);
        sink.record(&server_error(
            "Permissions Violation for Publish to \"toolmesh.v1.call.globex\"",
        ));
        sink.record(&server_error(
            "Permissions Violation for Subscription to \"toolmesh.v1.providers.announce\"",
        ));
        let refused = refusals.of_request("toolmesh.v1.call.globex").await;
        assert!(!refused.is_inbox());
        let text = refused.to_string();
        assert!(text.contains("user \"acme\""), "{text}");
        assert!(
            text.contains("publish to toolmesh.v1.call.globex"),
            "{text}"
        );
        // Another subject, and a refused subscription elsewhere, stop nothing.
        assert!(refusals.request_refused("toolmesh.v1.call.acme").is_none());
        let waiting = refusals.guard("toolmesh.v1.call.acme", std::future::pending::<()>());
        tokio::pin!(waiting);
        assert!(futures::poll!(&mut waiting).is_pending());
        // The reply inbox refused: every request ends, and the text names the prefix to set.
        sink.record(&server_error(
            "Permissions Violation for Subscription to \"_INBOX.Xy12.*\"",
        ));
        let refused = waiting.await.unwrap_err();
        assert!(refused.is_inbox());
        let text = refused.to_string();
        assert!(
            text.contains("TOOLMESH_NATS_INBOX_PREFIX=_INBOX.acme"),
            "{text}"
        );
        assert!(text.contains("subscribe to _INBOX.Xy12.*"), "{text}");
    }

    #[tokio::test]
    async fn a_long_lived_connection_holds_only_new_refusals_against_a_request() {
        let (sink, refusals) = Refusals::new(Identity {
            user: Some("toolmesh".into()),
            inbox_prefix: "_INBOX".into(),
        });
        let refusal = "Permissions Violation for Publish to \"providers.x.run\"";
        // Refused once, then granted (a reload): the next request is not failed for it.
        sink.record(&server_error(refusal));
        let waiting = refusals.guard_publish("providers.x.run", std::future::pending::<()>());
        tokio::pin!(waiting);
        assert!(futures::poll!(&mut waiting).is_pending());
        // Refused while it runs: it ends.
        sink.record(&server_error(refusal));
        let refused = waiting.await.unwrap_err();
        assert_eq!(refused.violation.subject, "providers.x.run");
        assert!(refused.to_string().contains("user \"toolmesh\""));
    }
}
