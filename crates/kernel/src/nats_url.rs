//! Where a node or a client command reaches NATS: `TOOLMESH_NATS_URL` (or `--nats-url`), one
//! server's URL or several, comma-separated (the servers of one cluster). [`NatsUrl`] is the
//! list checked once: every entry a NATS URL, none empty, and at most one user and password
//! among them.
//!
//! Credentials: async-nats parses a URL's user and password but does not send them
//! (nats-io/nats.rs#1623), and it holds one user per connection whichever server it is on, so
//! [`crate::host`] sends the one pair the list names as the connection's. Each URL may carry
//! it (`nats://toolmesh:pw@nats-1:4222,nats://toolmesh:pw@nats-2:4222`), or only one of them;
//! URLs naming different users are refused: one connection cannot be two users.

use async_nats::ServerAddr;

/// A checked `TOOLMESH_NATS_URL`: the servers in the order given, and the connection's user
/// and password if a URL names them. `Display` shows it with credentials as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsUrl {
    servers: Vec<ServerAddr>,
    /// Percent-decoded.
    credentials: Option<(String, crate::config::Secret)>,
    /// The text given, credentials hidden, for messages.
    redacted: String,
}

/// Why a NATS URL (list) cannot be used; the caller names the variable or flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NatsUrlError {
    #[error("no server named")]
    Empty,
    #[error("server {position} of the list is empty (a stray comma?)")]
    EmptyEntry { position: usize },
    #[error("server {position} ({shown}) is not a NATS URL: {reason}")]
    Invalid {
        position: usize,
        shown: String,
        reason: String,
    },
    #[error(
        "servers {first} and {other} name different users or passwords: one connection is one \
         user, so give every URL the same (or only the first)"
    )]
    MixedCredentials { first: usize, other: usize },
}

impl NatsUrl {
    /// Parses `raw`: comma-separated URLs, each trimmed; `host:port` alone means
    /// `nats://host:port`.
    pub fn parse(raw: &str) -> Result<NatsUrl, NatsUrlError> {
        if raw.trim().is_empty() {
            return Err(NatsUrlError::Empty);
        }
        let mut servers = Vec::new();
        let mut credentials: Option<(usize, String, String)> = None;
        for (i, entry) in raw.split(',').enumerate() {
            let position = i + 1;
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(NatsUrlError::EmptyEntry { position });
            }
            let addr: ServerAddr =
                entry
                    .parse()
                    .map_err(|e: std::io::Error| NatsUrlError::Invalid {
                        position,
                        shown: redact(entry),
                        reason: e.to_string(),
                    })?;
            if addr.host().is_empty() {
                return Err(NatsUrlError::Invalid {
                    position,
                    shown: redact(entry),
                    reason: "it names no host".into(),
                });
            }
            if let (Some(user), Some(password)) = (addr.username(), addr.password()) {
                let pair = (percent_decode(user), percent_decode(password));
                match &credentials {
                    None => credentials = Some((position, pair.0, pair.1)),
                    Some((first, u, p)) if (u, p) != (&pair.0, &pair.1) => {
                        return Err(NatsUrlError::MixedCredentials {
                            first: *first,
                            other: position,
                        })
                    }
                    Some(_) => {}
                }
            }
            servers.push(addr);
        }
        Ok(NatsUrl {
            servers,
            credentials: credentials
                .map(|(_, user, password)| (user, crate::config::Secret::new(password))),
            redacted: raw
                .split(',')
                .map(|e| redact(e.trim()))
                .collect::<Vec<_>>()
                .join(","),
        })
    }

    /// The servers, in the order given (a client tries them in a random order).
    pub fn servers(&self) -> &[ServerAddr] {
        &self.servers
    }

    /// The user and password the connection sends, when a URL names them.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(user, password)| (user.as_str(), password.expose()))
    }

    /// The NATS user the URLs name (what a refusal's message names).
    pub fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|(user, _)| user.as_str())
    }
}

impl std::str::FromStr for NatsUrl {
    type Err = NatsUrlError;
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        NatsUrl::parse(raw)
    }
}

impl std::fmt::Display for NatsUrl {
    /// The URLs as given, credentials as `***`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl std::fmt::Debug for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("NatsUrl").field(&self.redacted).finish()
    }
}

/// One URL fit for logs and messages: what sits before `@` in its authority becomes `***`.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").map_or(("", url), |(s, r)| (s, r));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let shown = match rest[..authority_end].rsplit_once('@') {
        Some((_, host)) => format!("***@{host}{}", &rest[authority_end..]),
        None => rest.to_owned(),
    };
    if scheme.is_empty() {
        shown
    } else {
        format!("{scheme}://{shown}")
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a list parses to: its servers (as `host:port`), user and password, and how it is
    /// shown.
    type Parsed<'a> = (&'a [&'a str], Option<(&'a str, &'a str)>, &'a str);

    /// `raw` parses to `Ok(parsed)`, or fails saying `Err(words)`.
    fn check(raw: &str, expect: Result<Parsed<'_>, &str>) {
        match (NatsUrl::parse(raw), expect) {
            (Ok(url), Ok((servers, credentials, shown))) => {
                let got: Vec<String> = url
                    .servers()
                    .iter()
                    .map(|s| format!("{}:{}", s.host(), s.port()))
                    .collect();
                assert_eq!(got, servers, "{raw}");
                assert_eq!(url.credentials(), credentials, "{raw}");
                assert_eq!(url.to_string(), shown, "{raw}");
                assert_eq!(format!("{url:?}"), format!("NatsUrl({shown:?})"), "{raw}");
            }
            (Err(e), Err(words)) => {
                let text = e.to_string();
                assert!(text.contains(words), "{raw}: {text}");
                assert!(!text.contains("s3cret"), "{raw}: {text}");
            }
            (got, want) => panic!("{raw}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn a_list_of_servers_parses_with_one_user() {
        check(
            "nats://127.0.0.1:4222",
            Ok((&["127.0.0.1:4222"], None, "nats://127.0.0.1:4222")),
        );
        check(
            " nats://a:4222 , nats://b:4223,c ",
            Ok((
                &["a:4222", "b:4223", "c:4222"],
                None,
                "nats://a:4222,nats://b:4223,c",
            )),
        );
        check(
            "nats://acme:s3cr%40t@a:4222,nats://b:4222",
            Ok((
                &["a:4222", "b:4222"],
                Some(("acme", "s3cr@t")),
                "nats://***@a:4222,nats://b:4222",
            )),
        );
        check(
            "nats://acme:s3cret@a:4222,nats://acme:s3cret@b:4222",
            Ok((
                &["a:4222", "b:4222"],
                Some(("acme", "s3cret")),
                "nats://***@a:4222,nats://***@b:4222",
            )),
        );
        check(
            "tls://tok@a:4222",
            Ok((&["a:4222"], None, "tls://***@a:4222")),
        );
    }

    #[test]
    fn bad_lists_say_which_server_and_never_the_password() {
        check("", Err("no server named"));
        check("  ", Err("no server named"));
        check("nats://a:4222,", Err("server 2 of the list is empty"));
        check(
            "nats://a:4222,,nats://b:4222",
            Err("server 2 of the list is empty"),
        );
        check(
            "nats://a:4222,http://u:s3cret@b:80",
            Err("server 2 (http://***@b:80) is not a NATS URL"),
        );
        check(
            "nats://a:99999",
            Err("server 1 (nats://a:99999) is not a NATS URL"),
        );
        check(
            "nats://a:s3cret@x:4222,nats://b:s3cret@y:4222",
            Err("servers 1 and 2 name different users"),
        );
        check(
            "nats://a:s3cret@x:4222,nats://a:other@y:4222",
            Err("servers 1 and 2 name different users or passwords"),
        );
    }

    #[test]
    fn credentials_are_percent_decoded() {
        assert_eq!(percent_decode("s3cr%40t%2Fx"), "s3cr@t/x");
        assert_eq!(percent_decode("plain"), "plain");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
