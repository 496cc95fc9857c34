//! The `WorkspaceKeeper`: serves the calls on `toolmesh.internal.v1.run.workspace`, each as a
//! task of its own (hosted by [`toolmesh_actix_host`]).
//!
//! File work runs on tokio's blocking pool, except `read_workspace_file` of a file of at most
//! 16 KiB whose result fits the budget: it is read inline, cheaper than two thread hand-offs.

use std::sync::Arc;

use async_nats::Message;
use toolmesh_actix_host::{Handler, ToolServer};

use crate::service::WorkspaceService;

pub struct WorkspaceKeeper {
    pub server: ToolServer<WorkspaceService>,
    pub service: Arc<WorkspaceService>,
}

impl Handler for WorkspaceKeeper {
    type Request = Message;

    async fn handle(&self, msg: Message) {
        self.server.answer(&self.service, msg).await;
    }
}
