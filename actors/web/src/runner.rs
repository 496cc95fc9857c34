//! The `WebRunner`: serves the calls on `toolmesh.internal.v1.run.web`, each as a task of its
//! own (hosted by [`toolmesh_actix_host`]).

use std::sync::Arc;

use async_nats::{Client, Message};
use toolmesh_actix_host::{answer_call, Handler};
use toolmesh_kernel::Role;

use crate::tools::WebService;

pub struct WebRunner {
    pub client: Client,
    pub service: Arc<WebService>,
}

impl Handler for WebRunner {
    type Request = Message;

    async fn handle(&self, msg: Message) {
        answer_call(&self.client, Role::Web, msg, |call| async move {
            self.service.run(&call).await
        })
        .await;
    }
}
