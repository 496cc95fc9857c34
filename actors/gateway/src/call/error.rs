//! Why the gateway could not hand a call to an actor, or read what it answered
//! ([`CallError`]), and what each failure is on the wire.

use async_nats::RequestErrorKind;
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::{ErrorCode, Role, ToolError};

/// Why a request of the gateway to an actor failed on the gateway's side.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// What the gateway was to send does not serialize (a bug).
    #[error("{what} does not serialize: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The actor's reply is not the reply of PROTOCOL.md. The caller is not shown the
    /// parser's words (they may quote the reply); the log line has them.
    #[error("the {role} actor sent a malformed reply; see the gateway log for 'malformed reply'")]
    MalformedReply {
        role: Role,
        #[source]
        source: serde_json::Error,
    },
    /// An internal request was not delivered, or not answered.
    #[error("a request to the {role} actor for {what} failed")]
    Request {
        role: Role,
        what: String,
        #[source]
        source: async_nats::RequestError,
    },
}

/// What kind of [`CallError`] it is: one PROTOCOL.md code each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallErrorKind {
    /// No actor took the request, or it could not be sent: `unavailable`, safe to retry.
    Unavailable,
    /// The actor did not answer in time: `timeout`.
    TimedOut,
    /// The request is over the NATS `max_payload`: `limit_exceeded`.
    TooBig,
    /// A bug on the gateway's side or the actor's: `internal`.
    Internal,
}

impl CallError {
    pub(crate) fn kind(&self) -> CallErrorKind {
        match self {
            CallError::Encode { .. } | CallError::MalformedReply { .. } => CallErrorKind::Internal,
            CallError::Request { source, .. } => match source.kind() {
                RequestErrorKind::NoResponders | RequestErrorKind::Other => {
                    CallErrorKind::Unavailable
                }
                RequestErrorKind::TimedOut => CallErrorKind::TimedOut,
                RequestErrorKind::MaxPayloadExceeded => CallErrorKind::TooBig,
                RequestErrorKind::InvalidSubject => CallErrorKind::Internal,
            },
        }
    }
}

/// PROTOCOL.md's code and sentence; an `internal` one logs its cause here.
impl From<CallError> for ToolError {
    fn from(e: CallError) -> Self {
        let kind = e.kind();
        if kind == CallErrorKind::Internal {
            match &e {
                CallError::MalformedReply { role, .. } => tracing::error!(
                    error = %DisplayChain(&e),
                    role = %role,
                    "malformed reply from an actor"
                ),
                _ => tracing::error!(error = %DisplayChain(&e), "a gateway request failed"),
            }
        }
        let CallError::Request { role, what, source } = &e else {
            return ToolError::internal(e.to_string());
        };
        let role = *role;
        match kind {
            CallErrorKind::Unavailable if source.kind() == RequestErrorKind::NoResponders => {
                ToolError::new(
                    ErrorCode::Unavailable,
                    format!("no {role} actor is running in the cluster to serve {what}; start a node with --roles {role} and retry"),
                )
            }
            CallErrorKind::Unavailable => ToolError::new(
                ErrorCode::Unavailable,
                format!("could not reach the {role} actor for {what} ({source}); retry"),
            ),
            CallErrorKind::TimedOut => timed_out(role, what),
            CallErrorKind::TooBig => ToolError::new(
                ErrorCode::LimitExceeded,
                format!("the call to {what} is over the NATS max_payload; send smaller arguments"),
            ),
            CallErrorKind::Internal => ToolError::new(
                ErrorCode::Internal,
                format!(
                    "an internal subject for {what} is invalid; this is a bug, see the gateway log"
                ),
            ),
        }
    }
}

/// `timeout`: the actor of `role` did not answer `what` in time.
pub(super) fn timed_out(role: Role, what: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Timeout,
        format!("the {role} actor did not answer {what} in time; it may be overloaded or gone"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(kind: RequestErrorKind) -> ToolError {
        CallError::Request {
            role: Role::Workspace,
            what: "read_file".into(),
            source: async_nats::RequestError::from(kind),
        }
        .into()
    }

    #[test]
    fn delivery_failures_keep_their_codes() {
        for (kind, code) in [
            (RequestErrorKind::NoResponders, ErrorCode::Unavailable),
            (RequestErrorKind::Other, ErrorCode::Unavailable),
            (RequestErrorKind::TimedOut, ErrorCode::Timeout),
            (
                RequestErrorKind::MaxPayloadExceeded,
                ErrorCode::LimitExceeded,
            ),
            (RequestErrorKind::InvalidSubject, ErrorCode::Internal),
        ] {
            assert_eq!(request(kind).code, code, "{kind:?}");
        }
        assert!(request(RequestErrorKind::NoResponders)
            .message
            .contains("--roles workspace"));
    }

    #[test]
    fn a_malformed_reply_keeps_the_parsers_words_for_the_log() {
        let source = serde_json::from_str::<serde_json::Value>("{\"secret").unwrap_err();
        let e = CallError::MalformedReply {
            role: Role::Web,
            source,
        };
        assert!(DisplayChain(&e).to_string().contains("EOF"));
        let error = ToolError::from(e);
        assert_eq!(error.code, ErrorCode::Internal);
        assert_eq!(
            error.message,
            "the web actor sent a malformed reply; see the gateway log for 'malformed reply'"
        );
    }
}
