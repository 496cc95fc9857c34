//! Validated identifiers that appear in subjects and bodies: accounts, sessions, invocations, nodes.
//!
//! Each one is a NATS subject token, so the syntax check is also what keeps a caller from
//! widening a subject with `.`, `*` or `>`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why an identifier was refused; the caller turns it into `invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must match [A-Za-z0-9_-]{{1,{max}}}, got {shown}")]
pub struct InvalidId {
    pub field: &'static str,
    pub max: usize,
    shown: String,
}

fn check(field: &'static str, max: usize, value: &str) -> Result<(), InvalidId> {
    let ok = !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        // Quote a short, escaped prefix so a hostile value cannot flood a log line or reply.
        let mut shown: String = value.chars().take(40).collect();
        if value.chars().count() > 40 {
            shown.push('…');
        }
        Err(InvalidId {
            field,
            max,
            shown: format!("{shown:?}"),
        })
    }
}

macro_rules! token_id {
    ($(#[$doc:meta])* $name:ident, $field:literal, $max:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub const FIELD: &'static str = $field;
            pub const MAX_LEN: usize = $max;

            pub fn parse(value: impl Into<String>) -> Result<Self, InvalidId> {
                let value = value.into();
                check($field, $max, &value)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidId;
            fn try_from(value: String) -> Result<Self, InvalidId> {
                Self::parse(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

token_id!(
    /// The account boundary, taken from the subject only (`[A-Za-z0-9_-]{1,64}`).
    Account, "account", 64
);
token_id!(
    /// A session of an account: the unit of workspaces and sandboxes.
    SessionId, "session_id", 64
);
token_id!(
    /// One run of one tool, carried through every event, trace and internal message.
    InvocationId, "invocation_id", 128
);
token_id!(
    /// A toolmesh node in the cluster view.
    NodeId, "node_id", 64
);

impl InvocationId {
    /// A fresh id for a request that carried none (or carried one that could not be used):
    /// `inv_` and 128 random bits in hex. An id is what a cancel names, so it must not be
    /// guessable from the ids a caller has seen (PROTOCOL.md "Tenancy and trust"): a NUID's
    /// sequential tail was. The bits come from the thread's ChaCha generator, seeded by the
    /// OS and reseeded by `rand`, so there is no syscall per id.
    pub fn generate() -> Self {
        Self(format!("inv_{:032x}", rand::random::<u128>()))
    }
}

impl NodeId {
    /// `<prefix>-<8 hex>`; the prefix is cleaned down to the allowed characters.
    pub fn generate(prefix: &str) -> Self {
        let mut clean: String = prefix
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .take(40)
            .collect();
        if clean.is_empty() {
            clean.push_str("node");
        }
        let tail = uuid::Uuid::new_v4().simple().to_string();
        Self(format!("{clean}-{}", &tail[..8]))
    }
}

/// A new approval id: `appr_` and 32 hex digits of randomness.
pub fn generate_approval_id() -> String {
    format!("appr_{}", uuid::Uuid::new_v4().simple())
}

/// A fresh grant id: `grant_` and 32 hex digits.
pub fn generate_grant_id() -> String {
    format!("grant_{}", uuid::Uuid::new_v4().simple())
}

/// Whether `id` has the shape of a grant id (`grant_` and 1 to 64 of `[A-Za-z0-9]`).
pub fn is_grant_id(id: &str) -> bool {
    id.strip_prefix("grant_").is_some_and(|rest| {
        !rest.is_empty() && rest.len() <= 64 && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_account(input: &str, valid: bool) {
        assert_eq!(Account::parse(input).is_ok(), valid, "account {input:?}");
    }

    #[test]
    fn account_syntax() {
        check_account("acme", true);
        check_account("a-b_C9", true);
        check_account(&"x".repeat(64), true);
        check_account(&"x".repeat(65), false);
        check_account("", false);
        check_account("a.b", false);
        check_account("a*", false);
        check_account(">", false);
        check_account("a b", false);
        check_account("é", false);
    }

    #[test]
    fn invocation_ids_allow_128_and_generated_ones_parse() {
        assert!(InvocationId::parse("i".repeat(128)).is_ok());
        assert!(InvocationId::parse("i".repeat(129)).is_err());
        let generated = InvocationId::generate();
        assert!(InvocationId::parse(generated.as_str()).is_ok());
        assert!(NodeId::parse(NodeId::generate("host.name!").as_str()).is_ok());
    }

    /// An id names what a cancel stops: one caller's ids must not lead to another's
    /// (PROTOCOL.md "Tenancy and trust": at least 96 random bits, no shared structure).
    #[test]
    fn generated_invocation_ids_share_nothing_but_their_prefix() {
        let ids: Vec<String> = (0..1000)
            .map(|_| InvocationId::generate().as_str().to_owned())
            .collect();
        for pair in ids.windows(2) {
            let (a, b) = (&pair[0]["inv_".len()..], &pair[1]["inv_".len()..]);
            assert!(a.len() >= 24, "{a} carries under 96 bits");
            let shared = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
            // Random tails share 8 leading hex digits once in 4 billion pairs.
            assert!(shared < 8, "{a} and {b} share a prefix of {shared}");
        }
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
    }

    #[test]
    fn error_names_the_field() {
        let err = SessionId::parse("bad id").unwrap_err();
        assert!(
            err.to_string().starts_with("session_id must match"),
            "{err}"
        );
    }
}
