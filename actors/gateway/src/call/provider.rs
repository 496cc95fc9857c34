//! Provider calls: the call on the provider's endpoint subject, watched for the provider
//! going away and for cancels, and over-budget text persisted into the session's workspace.

use bytes::Bytes;
use serde_json::{json, Value};

use toolmesh_kernel::host::CancelWatch;
use toolmesh_kernel::outputs::{Keeper, Whole};
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::tools::{ProviderRoute, RegisteredTool};
use toolmesh_kernel::trace;
use toolmesh_kernel::{ErrorCode, ToolError};

use super::route::{refused, route_timeout};
use super::Call;
use crate::core::Answer;
use crate::providers;

impl Call<'_> {
    /// Requests the call on the provider's endpoint subject (any instance: they share it as a
    /// queue group) and turns its answer into the reply. While it waits, the call watches
    /// the provider's health ([`LiveTools::gone`](crate::providers::LiveTools::gone), shared by
    /// its calls in flight): once every instance is gone, the caller gets `unavailable` instead
    /// of waiting for the deadline. A cancel (or the node stopping) is passed on to the provider
    /// on `toolmesh.v1.providers.cancel.<service>`.
    pub(super) async fn call_provider(
        &mut self,
        target: &RegisteredTool,
        route: &ProviderRoute,
        arguments: Value,
    ) -> Result<Answer, ToolError> {
        let core = self.core;
        let service = route.service.as_ref();
        let timeout = route_timeout(&arguments);
        let ctx = &self.ctx;
        let envelope = json!({
            "tool": target.spec.name,
            "arguments": arguments,
            "invocation_id": ctx.invocation_id,
            "account": ctx.account,
            "session_id": ctx.session_id,
            "user_id": ctx.user_id,
            "agent_id": ctx.agent_id,
        });
        let body = serde_json::to_vec(&envelope).map_err(|e| ToolError::internal(e.to_string()))?;
        core.check_payload(&body, "sent to the provider")?;
        let mut cancel = CancelWatch::listen(&core.client, &ctx.account, &ctx.invocation_id).await;
        let request = async_nats::Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(timeout));
        let subject = route.subject.to_string();
        let sent = core.refusals.guard_publish(
            &subject,
            core.client
                .send_request(subject.clone(), trace::request(request)),
        );
        let gone = core.tools.gone(&core.client, service);
        let reply = tokio::select! {
            reply = sent => reply.map_err(refused)?,
            () = gone => {
                return Err(ToolError::new(
                    ErrorCode::Unavailable,
                    format!("every instance of the provider {service} went away while the call ran; it may have run in part, repeat it once the provider is back"),
                ));
            }
            () = cancel.requested() => {
                self.cancel_provider(target, route).await;
                return Err(ToolError::new(ErrorCode::Cancelled, "the call was cancelled; the provider was told"));
            }
            _ = core.lifecycle.stop.cancelled() => {
                self.cancel_provider(target, route).await;
                return Err(ToolError::new(ErrorCode::Cancelled, "the gateway node shut down before the provider answered; repeat the call"));
            }
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                use async_nats::RequestErrorKind;
                let error = match e.kind() {
                    RequestErrorKind::NoResponders => {
                        let unavailable = ToolError::new(
                            ErrorCode::Unavailable,
                            format!("no instance of the provider {service} is running to serve {}; retry once it is back", target.spec.name),
                        );
                        return Err(match self.consumed_approval.take() {
                            Some(id) => self.give_back(&id, unavailable).await,
                            None => unavailable,
                        });
                    }
                    RequestErrorKind::TimedOut => {
                        self.cancel_provider(target, route).await;
                        ToolError::new(
                            ErrorCode::Timeout,
                            format!(
                                "the provider {service} did not answer {} within {} s",
                                target.spec.name,
                                timeout.as_secs()
                            ),
                        )
                    }
                    _ => ToolError::new(
                        ErrorCode::Unavailable,
                        format!("could not reach the provider {service} ({e}); retry"),
                    ),
                };
                return Err(error);
            }
        };
        let mut fields =
            providers::reply::normalise(service, reply.headers.as_ref(), &reply.payload)?;
        let budget_chars = core.config.node.result_budget_chars;
        let whole = providers::reply::cut_to_budget(&mut fields, budget_chars);
        if !whole.is_empty() {
            let keeper = Keeper::remote(budget_chars, core.client.clone());
            let outputs = keeper.of(&self.ctx);
            for (field, text) in whole {
                let text = Whole::Text(Bytes::from(text));
                if let Err(e) = outputs.persist_named(&mut fields, &field, text).await {
                    tracing::warn!(error = %e, field, "cannot persist a provider's over-budget text");
                }
            }
        }
        Ok(Answer::Fields(fields))
    }

    /// Tells every instance of the provider that this invocation is cancelled.
    async fn cancel_provider(&self, target: &RegisteredTool, route: &ProviderRoute) {
        let body = json!({
            "invocation_id": self.ctx.invocation_id,
            "account": self.ctx.account,
            "tool": target.spec.name,
        });
        let subject = public::provider_cancel(&route.service);
        if let Err(e) = self
            .core
            .client
            .publish(subject, Bytes::from(body.to_string()))
            .await
        {
            tracing::warn!(error = %e, "cannot pass a cancel on to a provider");
        }
    }
}
