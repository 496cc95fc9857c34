//! Why [`WorkspaceSync`](crate::sync::WorkspaceSync) could not use what the workspace actor
//! answered, or could not read what it was to put ([`SyncClientError`]).

use crate::error::ToolError;
use crate::sync::messages::ChangeOutcome;

/// A sync reply this client cannot use (a bug on one side, or peers of versions that do not
/// fit), or a worker-side file that failed while a put read it. Every one is `internal`: the
/// caller can fix none of them. Refusals the workspace sends in the failure shape are not
/// these; they keep their own code.
#[derive(Debug, thiserror::Error)]
pub enum SyncClientError {
    /// A reply body that is not JSON.
    #[error("the workspace answered a {what} that is not JSON: {source}")]
    NotJson {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A success reply whose members are not the reply's type.
    #[error("the workspace answered an unreadable sync reply: {0}")]
    Unreadable(#[source] serde_json::Error),
    /// A failure reply that is not the failure shape.
    #[error("the workspace answered an unreadable error")]
    UnreadableError,
    /// A reply with no `ok` member.
    #[error("the workspace answered a sync reply without `ok`")]
    NoOk,
    /// A fetch reply with neither the file asked for nor its failure.
    #[error("the workspace answered a fetch without the file")]
    FetchWithoutFile,
    /// A fetch chunk with no content that is not the end of the file.
    #[error("the workspace answered an empty chunk before the end")]
    EmptyChunk,
    /// An apply reply whose outcomes do not pair with the changes sent.
    #[error("the workspace answered {got} outcomes for {sent} changes")]
    OutcomeCount { got: usize, sent: usize },
    /// An outcome an unconditional put cannot have.
    #[error("unexpected outcome of an unconditional put of '{path}': {outcome:?}")]
    UnexpectedOutcome {
        path: String,
        outcome: Box<ChangeOutcome>,
    },
    /// The worker's own file could not be read for a put.
    #[error("cannot read what to put into '{path}': {source}")]
    ReadPart {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// `internal` with the sentence of the error; the log line keeps its cause.
impl From<SyncClientError> for ToolError {
    fn from(e: SyncClientError) -> Self {
        ToolError::internal_logged(&e, "workspace sync client failed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_stays_in_the_chain_and_the_sentence() {
        let source = serde_json::from_slice::<serde_json::Value>(b"{").unwrap_err();
        let shown = source.to_string();
        let e = SyncClientError::NotJson {
            what: "manifest",
            source,
        };
        assert!(std::error::Error::source(&e).is_some());
        let error = ToolError::from(e);
        assert_eq!(error.code, crate::ErrorCode::Internal);
        assert_eq!(
            error.message,
            format!("the workspace answered a manifest that is not JSON: {shown}")
        );
    }
}
