//! The `SkillLoader`: serves the requests on `toolmesh.internal.v1.run.skills` and
//! [`toolmesh_kernel::skills::BUNDLE_SUBJECT`], each as a task of its own (hosted by
//! [`toolmesh_actix_host`]).

use std::sync::Arc;

use async_nats::{Client, Message};
use toolmesh_actix_host::{Handler, ToolServer};
use toolmesh_kernel::host::respond;
use toolmesh_kernel::skills as bundles;
use tracing::Instrument;

use crate::library::SkillsService;

/// A request for the skills actor.
pub enum SkillRequested {
    /// A routed tool call (`ActorCall`).
    Run(Message),
    /// A bundle page request from a sandbox worker.
    Bundle(Message),
}

pub struct SkillLoader {
    pub client: Client,
    pub server: ToolServer<SkillsService>,
    pub service: Arc<SkillsService>,
}

impl Handler for SkillLoader {
    type Request = SkillRequested;

    async fn handle(&self, request: SkillRequested) {
        match request {
            SkillRequested::Run(msg) => self.run(msg).await,
            SkillRequested::Bundle(msg) => self.bundle(msg).await,
        }
    }
}

impl SkillLoader {
    async fn run(&self, msg: Message) {
        self.server.answer(&self.service, msg).await;
    }

    async fn bundle(&self, msg: Message) {
        let body = match bundles::parse_request(&msg.payload) {
            Err(error) => bundles::encode_error(error),
            Ok(request) => {
                let span = tracing::info_span!("skill_bundle", names = ?request.names);
                match self.service.bundle(request).instrument(span).await {
                    Ok(page) => bundles::encode_page(&page),
                    Err(error) => bundles::encode_error(error),
                }
            }
        };
        respond(&self.client, msg.reply.as_ref(), body).await;
    }
}
