//! Over-budget text kept whole (PROTOCOL.md "Large data"): a text field over the result budget
//! is cut to a preview ([`crate::budget`]), and its whole text goes to the call's session's
//! workspace as `.toolmesh/outputs/<invocation_id>-<field>.txt`, named in the reply.
//!
//! This is one step for every actor. The generic host holds a [`Keeper`] (the node's budget
//! and the actor's [`Store`]) and hands each call its [`Outputs`]
//! ([`crate::tools::ToolCall::outputs`]); the gateway makes one for a provider's reply. The
//! workspace actor stores in its own files; every other actor sends the text to the workspace
//! over NATS ([`WorkspaceSync`]). What a tool names in its reply is its own: the generic
//! `persisted_outputs[<field>]` ([`Outputs::persist_named`], after [`budget::insert_over`]), a
//! command's entry with its parts, or `web_fetch`'s seed field `persisted`.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};

use crate::budget;
use crate::error::ToolError;
use crate::ids::{Account, SessionId};
use crate::sync::{output_path, WorkspaceSync};
use crate::wire::InvocationContext;

/// The whole text of an output field.
#[derive(Debug, Clone)]
pub enum Whole {
    /// In memory.
    Text(Bytes),
    /// The first `bytes` bytes of a file on this node (a command's spooled stream), read in
    /// parts off the async threads.
    File {
        bytes: u64,
        file: Arc<std::fs::File>,
    },
}

/// Where an output file goes: a path in a session's workspace.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub account: &'a Account,
    pub session: &'a SessionId,
    /// Workspace-relative.
    pub path: &'a str,
}

/// Where a node puts the whole text of its calls' outputs: the session's workspace.
pub trait Store: Send + Sync {
    /// Writes `whole` at `to`.
    fn put<'a>(&'a self, to: Target<'a>, whole: Whole) -> BoxFuture<'a, Result<(), ToolError>>;
}

/// An actor away from the workspace sends the text over the workspace sync subjects.
impl Store for WorkspaceSync {
    fn put<'a>(&'a self, to: Target<'a>, whole: Whole) -> BoxFuture<'a, Result<(), ToolError>> {
        Box::pin(async move {
            match whole {
                Whole::Text(text) => self.put_file(to.account, to.session, to.path, text).await,
                Whole::File { bytes, file } => {
                    self.put_from(to.account, to.session, to.path, bytes, file)
                        .await
                }
            }
        })
    }
}

/// A host's part in keeping outputs: the node's result budget and the actor's store.
#[derive(Clone)]
pub struct Keeper {
    /// Characters a text field keeps in a reply (`TOOLMESH_RESULT_BUDGET_CHARS`), unless its
    /// tool documents its own.
    pub budget_chars: usize,
    store: Arc<dyn Store>,
}

impl Keeper {
    pub fn new(budget_chars: usize, store: Arc<dyn Store>) -> Self {
        Keeper {
            budget_chars,
            store,
        }
    }

    /// A keeper that sends the text to the workspace actor over `client`.
    pub fn remote(budget_chars: usize, client: async_nats::Client) -> Self {
        Self::new(budget_chars, Arc::new(WorkspaceSync::new(client)))
    }

    /// What the call of `ctx` keeps with this keeper.
    pub fn of<'a>(&'a self, ctx: &'a InvocationContext) -> Outputs<'a> {
        Outputs {
            budget_chars: self.budget_chars,
            store: &*self.store,
            ctx,
        }
    }
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("budget_chars", &self.budget_chars)
            .finish_non_exhaustive()
    }
}

/// What one call keeps: its budget and where its outputs go.
#[derive(Clone, Copy)]
pub struct Outputs<'a> {
    /// Characters a text field keeps in the reply, unless the tool documents its own.
    pub budget_chars: usize,
    store: &'a dyn Store,
    ctx: &'a InvocationContext,
}

impl Outputs<'_> {
    /// Writes `whole` as the output file of `field` in the call's session's workspace, and
    /// returns its workspace-relative path; `Ok(None)` for a call without a session (it cuts
    /// without persisting).
    pub async fn persist(&self, field: &str, whole: Whole) -> Result<Option<String>, ToolError> {
        let Some(session) = &self.ctx.session_id else {
            return Ok(None);
        };
        let path = output_path(&self.ctx.invocation_id, field);
        let to = Target {
            account: &self.ctx.account,
            session,
            path: &path,
        };
        self.store.put(to, whole).await?;
        Ok(Some(path))
    }

    /// [`Outputs::persist`], then names the file in `fields`' `persisted_outputs[field]` as
    /// `{"path", "mime_type"}`.
    pub async fn persist_named(
        &self,
        fields: &mut Map<String, Value>,
        field: &str,
        whole: Whole,
    ) -> Result<(), ToolError> {
        if let Some(path) = self.persist(field, whole).await? {
            budget::insert_persisted(
                fields,
                field,
                json!({"path": path, "mime_type": "text/plain"}),
            );
        }
        Ok(())
    }
}

impl std::fmt::Debug for Outputs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outputs")
            .field("budget_chars", &self.budget_chars)
            .field("invocation_id", &self.ctx.invocation_id)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A store that keeps what it is given, or refuses.
    #[derive(Default)]
    struct Kept {
        files: Mutex<Vec<(String, String, Bytes)>>,
        refuse: bool,
    }

    impl Store for Kept {
        fn put<'a>(&'a self, to: Target<'a>, whole: Whole) -> BoxFuture<'a, Result<(), ToolError>> {
            Box::pin(async move {
                if self.refuse {
                    return Err(ToolError::new(
                        crate::ErrorCode::Unavailable,
                        "no workspace",
                    ));
                }
                let Whole::Text(text) = whole else {
                    panic!("a file where text was given");
                };
                self.files
                    .lock()
                    .unwrap()
                    .push((to.session.to_string(), to.path.to_owned(), text));
                Ok(())
            })
        }
    }

    fn ctx(session: Option<&str>) -> InvocationContext {
        serde_json::from_value(json!({
            "invocation_id": "inv-1",
            "account": "acme",
            "session_id": session,
        }))
        .unwrap()
    }

    /// `text` put as `field` within `budget` by a call in `session` keeping outputs in `store`,
    /// as the tools do: cut ([`budget::insert_over`]), then kept and named.
    async fn put(
        store: &Arc<Kept>,
        session: Option<&str>,
        field: &str,
        text: &str,
        budget: usize,
    ) -> (Result<bool, ToolError>, Map<String, Value>) {
        let keeper = Keeper::new(budget, store.clone());
        let ctx = ctx(session);
        let outputs = keeper.of(&ctx);
        let mut fields = Map::new();
        let cut = match budget::insert_over(&mut fields, field, text.into(), outputs.budget_chars) {
            None => Ok(false),
            Some(whole) => outputs
                .persist_named(&mut fields, field, Whole::Text(whole.into()))
                .await
                .map(|()| true),
        };
        (cut, fields)
    }

    #[tokio::test]
    async fn over_the_budget_the_whole_text_is_kept_and_named() {
        let store = Arc::new(Kept::default());
        let (cut, fields) = put(&store, Some("s1"), "content", "abcdefgh", 4).await;
        assert!(cut.unwrap());
        assert_eq!(fields["content"], "abcd");
        assert_eq!(fields["content_original_chars"], 8);
        let path = output_path(&ctx(None).invocation_id, "content");
        assert_eq!(
            fields["persisted_outputs"]["content"],
            json!({"path": path, "mime_type": "text/plain"})
        );
        let files = store.files.lock().unwrap();
        assert_eq!(*files, [("s1".into(), path, Bytes::from("abcdefgh"))]);
    }

    #[tokio::test]
    async fn within_the_budget_or_without_a_session_nothing_is_kept() {
        let store = Arc::new(Kept::default());
        let (cut, _) = put(&store, Some("s1"), "content", "abcd", 4).await;
        assert!(!cut.unwrap());
        let (cut, fields) = put(&store, None, "diff", "abcdefgh", 4).await;
        assert!(cut.unwrap(), "cut all the same");
        assert_eq!(fields["diff"], "abcd");
        assert!(fields.get("persisted_outputs").is_none());
        assert!(store.files.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_store_that_refuses_leaves_the_preview_and_names_nothing() {
        let store = Arc::new(Kept {
            refuse: true,
            ..Kept::default()
        });
        let (cut, fields) = put(&store, Some("s1"), "diff", "abcdef", 2).await;
        assert_eq!(cut.unwrap_err().code, crate::ErrorCode::Unavailable);
        assert_eq!(fields["diff"], "ab");
        assert!(fields.get("persisted_outputs").is_none());
    }
}
