//! The closed list of error codes of PROTOCOL.md and the typed error every actor answers with.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// PROTOCOL.md's error codes, one to one. Callers match on these, never on message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidRequest,
    UnknownTool,
    InvalidArguments,
    PathOutsideWorkspace,
    NotFound,
    FileTooLarge,
    NotUtf8,
    FileNotRead,
    Conflict,
    SnippetNotFound,
    AmbiguousEdit,
    AlreadyExists,
    DirectoryNotEmpty,
    LintErrors,
    ApprovalRequired,
    ApprovalPending,
    ApprovalRejected,
    ApprovalExpired,
    ApprovalMismatch,
    Unavailable,
    Timeout,
    Cancelled,
    CommandFailed,
    SkillNotFound,
    InvalidSkill,
    HashMismatch,
    UnsafeArchive,
    SkillRuntimeDisabled,
    ProviderNotConfigured,
    BlockedUrl,
    FetchFailed,
    LimitExceeded,
    ProviderError,
    PolicyDenied,
    Forbidden,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::UnknownTool => "unknown_tool",
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::PathOutsideWorkspace => "path_outside_workspace",
            ErrorCode::NotFound => "not_found",
            ErrorCode::FileTooLarge => "file_too_large",
            ErrorCode::NotUtf8 => "not_utf8",
            ErrorCode::FileNotRead => "file_not_read",
            ErrorCode::Conflict => "conflict",
            ErrorCode::SnippetNotFound => "snippet_not_found",
            ErrorCode::AmbiguousEdit => "ambiguous_edit",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::DirectoryNotEmpty => "directory_not_empty",
            ErrorCode::LintErrors => "lint_errors",
            ErrorCode::ApprovalRequired => "approval_required",
            ErrorCode::ApprovalPending => "approval_pending",
            ErrorCode::ApprovalRejected => "approval_rejected",
            ErrorCode::ApprovalExpired => "approval_expired",
            ErrorCode::ApprovalMismatch => "approval_mismatch",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::CommandFailed => "command_failed",
            ErrorCode::SkillNotFound => "skill_not_found",
            ErrorCode::InvalidSkill => "invalid_skill",
            ErrorCode::HashMismatch => "hash_mismatch",
            ErrorCode::UnsafeArchive => "unsafe_archive",
            ErrorCode::SkillRuntimeDisabled => "skill_runtime_disabled",
            ErrorCode::ProviderNotConfigured => "provider_not_configured",
            ErrorCode::BlockedUrl => "blocked_url",
            ErrorCode::FetchFailed => "fetch_failed",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::ProviderError => "provider_error",
            ErrorCode::PolicyDenied => "policy_denied",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Characters of an `error_message` at most: a longer one keeps its two ends
/// ([`crate::text::shorten_middle`]).
pub const MAX_MESSAGE_CHARS: usize = 2000;

/// A refusal or failure that becomes the failure shape of a reply:
/// `{"ok": false, "error": code, "error_message": message, …details}`. Its `Display` (what a
/// log field `error = %e` writes) is display-safe: a message quoting a name cannot forge a
/// log line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {}", crate::text::DisplaySafe(&.message))]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
    /// Extra members beside `error` and `error_message` (`details`, `approval_request`, …).
    pub details: Map<String, Value>,
}

impl ToolError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: Map::new(),
        }
    }

    /// Adds one member beside `error`/`error_message`.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    /// `internal` with the sentence of `error`, logged here with its whole chain under
    /// `what`: an actor's edge for a failure the caller can do nothing about.
    pub fn internal_logged(error: &(dyn std::error::Error + 'static), what: &str) -> Self {
        tracing::error!(error = %DisplayChain(error), "{what}");
        ToolError::internal(error.to_string())
    }

    /// Puts `details` beside `error`/`error_message` (a failed command's output fields).
    pub fn with_details(mut self, details: Map<String, Value>) -> Self {
        self.details = details;
        self
    }

    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// `invalid_arguments` with one `{"path","message"}` detail.
    pub fn invalid_argument(pointer: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self::new(
            ErrorCode::InvalidArguments,
            format!("argument {pointer}: {message}"),
        )
        .with(
            "details",
            serde_json::json!([{ "path": pointer, "message": message }]),
        )
    }

    /// The members of the failure shape, without `invocation_id`. `error_message` is for a
    /// person: display-safe ([`crate::text::display_safe`]: a name quoted in it cannot carry
    /// a control or bidirectional character) and at most [`MAX_MESSAGE_CHARS`] characters.
    pub fn into_fields(self) -> Map<String, Value> {
        let mut fields = Map::with_capacity(3 + self.details.len());
        fields.insert("ok".into(), Value::Bool(false));
        fields.insert("error".into(), Value::from(self.code.as_str()));
        fields.insert(
            "error_message".into(),
            Value::from(display_message(self.message)),
        );
        for (key, value) in self.details {
            fields.entry(key).or_insert(value);
        }
        fields
    }

    /// `{"error", "error_message"}` alone, the message as [`ToolError::into_fields`] writes
    /// it: for a failure reported inside a result (a part that could not be done).
    pub fn brief(&self) -> Value {
        serde_json::json!({
            "error": self.code.as_str(),
            "error_message": display_message(self.message.clone()),
        })
    }

    /// Reads the failure shape back (for replies that crossed NATS from another actor).
    pub fn from_fields(fields: &Map<String, Value>) -> Option<Self> {
        if fields.get("ok") != Some(&Value::Bool(false)) {
            return None;
        }
        let code: ErrorCode = serde_json::from_value(fields.get("error")?.clone()).ok()?;
        let message = fields
            .get("error_message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let details = fields
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "ok" | "error" | "error_message"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Some(Self {
            code,
            message,
            details,
        })
    }
}

/// An error and its sources, `error: cause: cause`, as a log field at an actor's edge, where a
/// domain error becomes a [`ToolError`]: `tracing::warn!(error = %DisplayChain(&e), "…")`
/// keeps the whole chain that the one-sentence `error_message` does not carry. A cause whose
/// text the line already holds is not written twice. Display-safe like
/// [`crate::text::DisplaySafe`]: a path inside an error cannot forge a log line.
#[derive(Clone, Copy)]
pub struct DisplayChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let shown = cause.to_string();
            if !text.contains(&shown) {
                text.push_str(": ");
                text.push_str(&shown);
            }
            source = cause.source();
        }
        f.write_str(&crate::text::display_safe(&text))
    }
}

/// `message` as `error_message` carries it: shortened, then display-safe.
fn display_message(message: String) -> String {
    use crate::text::{display_safe, shorten_middle};
    let short = shorten_middle(&message, MAX_MESSAGE_CHARS);
    match display_safe(&short) {
        std::borrow::Cow::Borrowed(_) if short.len() == message.len() => message,
        safe => safe.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_internal_logged_error_answers_its_own_sentence() {
        let outer = std::io::Error::other("the disk said no");
        let error = ToolError::internal_logged(&outer, "a test failure");
        assert_eq!(error.code, ErrorCode::Internal);
        assert_eq!(error.message, "the disk said no");
        assert!(error.details.is_empty());
    }

    #[test]
    fn codes_serialize_as_protocol_names() {
        for code in [
            ErrorCode::InvalidRequest,
            ErrorCode::PathOutsideWorkspace,
            ErrorCode::SkillRuntimeDisabled,
            ErrorCode::Internal,
        ] {
            assert_eq!(
                serde_json::to_value(code).unwrap(),
                Value::from(code.as_str())
            );
        }
    }

    #[test]
    fn failure_shape_round_trips() {
        let err = ToolError::invalid_argument("/path", "is required");
        let fields = err.clone().into_fields();
        assert_eq!(fields["ok"], false);
        assert_eq!(fields["error"], "invalid_arguments");
        assert_eq!(fields["details"][0]["path"], "/path");
        assert_eq!(ToolError::from_fields(&fields), Some(err));
    }

    #[test]
    fn a_chain_shows_every_cause_once_and_display_safe() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read '{0}'")]
        struct Outer(String, #[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read: {0}")]
        struct Quoting(#[source] std::io::Error);
        let io = || std::io::Error::other("disk on fire");
        let outer = Outer("a\nb".into(), io());
        assert_eq!(
            DisplayChain(&outer).to_string(),
            "cannot read 'a\\u000ab': disk on fire"
        );
        let quoting = Quoting(io());
        assert_eq!(
            DisplayChain(&quoting).to_string(),
            "cannot read: disk on fire"
        );
    }

    #[test]
    fn error_messages_are_display_safe_and_bounded() {
        let err = ToolError::new(
            ErrorCode::NotFound,
            "no file \"rtl\u{202e}txt.exe\"\u{1b}[2K",
        );
        assert_eq!(
            err.into_fields()["error_message"],
            "no file \"rtl\\u202etxt.exe\"\\u001b[2K"
        );
        let long = format!("start {} end", "x".repeat(100_000));
        let shown = ToolError::internal(long).into_fields()["error_message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            shown.chars().count() < MAX_MESSAGE_CHARS + 40,
            "{}",
            shown.len()
        );
        assert!(
            shown.starts_with("start ")
                && shown.ends_with(" end")
                && shown.contains("chars hidden")
        );
    }
}
