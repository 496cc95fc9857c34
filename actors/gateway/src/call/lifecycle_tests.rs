//! The call path as a whole: what every call costs to spawn.

use std::sync::Arc;

use async_nats::Message;
use bytes::Bytes;
use tokio::sync::broadcast;
use toolmesh_kernel::host::ReplyInbox;
use toolmesh_kernel::tools::ToolRegistry;

use super::handle_call;
use crate::core::GatewayCore;
use crate::providers::LiveTools;
use crate::tools;

/// Every call is a spawned task, and spawning moves the future: rare, large states (gate,
/// park, routing) are boxed so the common one stays small.
#[tokio::test]
async fn a_call_future_stays_small() {
    fn size_of<F: std::future::Future>(_: &F) -> usize {
        std::mem::size_of::<F>()
    }
    // Never connects (nothing listens on port 1); enough to build the core.
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect("nats://127.0.0.1:1")
        .await
        .expect("lazy client");
    let core = Arc::new(GatewayCore {
        client: client.clone(),
        tools: Arc::new(LiveTools::new(Arc::new(
            ToolRegistry::new(tools::LISTED.iter().copied()).expect("the gateway's tools"),
        ))),
        config: Arc::new(crate::config::tests::config(&Default::default()).expect("defaults")),
        cluster: Default::default(),
        decided: broadcast::channel(1).0,
        lifecycle: Default::default(),
        in_flight: Default::default(),
        metrics: Default::default(),
        status_cache: Default::default(),
        replies: ReplyInbox::start(&client).await.expect("lazy inbox"),
        audit: toolmesh_kernel::audit::AuditTrail::off("n", "test"),
        refusals: toolmesh_kernel::permissions::Refusals::none(),
    });
    let msg = Message {
        subject: "toolmesh.v1.call.a".into(),
        reply: None,
        payload: Bytes::new(),
        headers: None,
        status: None,
        description: None,
        length: 0,
    };
    let size = size_of(&handle_call(core, msg));
    assert!(size <= 4096, "handle_call's future is {size} bytes");
}
