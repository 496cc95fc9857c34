//! The `WebRunner`: serves the calls on `toolmesh.internal.v1.run.web`, each as a task of its
//! own (hosted by [`toolmesh_actix_host`]).

use std::sync::Arc;

use async_nats::Message;
use toolmesh_actix_host::{Handler, ToolServer};

use crate::service::WebService;

pub struct WebRunner {
    pub server: ToolServer<WebService>,
    pub service: Arc<WebService>,
}

impl Handler for WebRunner {
    type Request = Message;

    async fn handle(&self, msg: Message) {
        self.server.answer(&self.service, msg).await;
    }
}
