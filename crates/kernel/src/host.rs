//! Host glue every actor uses: connecting to NATS, draining subscriptions, replying, counting
//! in-flight work, and the shutdown signal.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_nats::{Client, ConnectOptions, Message, Subscriber};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::budget;
use crate::error::ToolError;
use crate::events::EventSeq;
use crate::ids::{Account, InvocationId, NodeId};
use crate::nats_url::NatsUrl;
use crate::permissions::{Identity, Refusals};
use crate::role::Role;
use crate::subjects;
use crate::time::elapsed_ms;
use crate::wire::{
    error_body, finished_extra, public_reply, run_event, ActorReply, CancelAck, DirectFinish,
    RunEventKind, CLAIMED_BY_HEADER,
};

/// How often a connection pings its server when nothing else comes from it: a server that
/// dies without closing the connection (its host gone) is noticed after three silent
/// intervals, so a caller moves to another server of the list within about 3 s plus
/// [`reconnect_delay`].
pub const PING_INTERVAL: Duration = Duration::from_secs(1);

/// The longest pause between two connection attempts ([`reconnect_delay`]).
pub const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// How long one attempt to connect to one server may take (TCP, then the NATS handshake)
/// when the list names several: past it the next server is tried. With one server a node
/// waits longer ([`connect_node`]).
pub const CLUSTER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The pause before connection attempt `attempt` (1 for the first after a disconnect) to a
/// list of `servers`: none while the first round goes through the list (the next server is
/// likely up), then 100 ms doubling up to [`MAX_RECONNECT_DELAY`]. async-nats counts attempts
/// per server tried and starts over after each connection; it tries the servers in a random
/// order, those that failed least first.
pub fn reconnect_delay(attempt: usize, servers: usize) -> Duration {
    let past_first_round = attempt.saturating_sub(servers.max(1));
    if past_first_round == 0 {
        return Duration::ZERO;
    }
    let exponent = (past_first_round - 1).min(10) as u32;
    Duration::from_millis(100u64.saturating_mul(1 << exponent)).min(MAX_RECONNECT_DELAY)
}

/// What every connection of a node or a client command shares: the user and password of the
/// URL list, the ping interval, and attempts that move on to the next server within a moment.
fn options(url: &NatsUrl, name: &str) -> ConnectOptions {
    let servers = url.servers().len();
    let options = ConnectOptions::new()
        .name(name)
        .ping_interval(PING_INTERVAL)
        .reconnect_delay_callback(move |attempt| reconnect_delay(attempt, servers));
    match url.credentials() {
        Some((user, password)) => options.user_and_password(user.to_owned(), password.to_owned()),
        None => options,
    }
}

/// Connects a node to the servers of `url` (one, or several of one cluster): retries
/// forever, so a node started before its NATS server (as in compose) comes up once the server
/// does, and reconnects by itself after losing its server, to another of the list when there
/// are several. The [`Refusals`] are what the server refuses the node: a request that races
/// them ([`Refusals::guard_publish`]) ends when the server drops its publish.
pub async fn connect_node(
    url: &NatsUrl,
    name: &str,
) -> Result<(Client, Refusals), async_nats::ConnectError> {
    let (sink, refusals) = Refusals::new(Identity {
        user: url.user().map(str::to_owned),
        inbox_prefix: "_INBOX".to_owned(),
    });
    let timeout = if url.servers().len() > 1 {
        CLUSTER_CONNECT_TIMEOUT
    } else {
        Duration::from_secs(5)
    };
    let client = options(url, name)
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(timeout)
        .event_callback(move |event| {
            sink.record(&event);
            async move { log_connection_event(event) }
        })
        .connect(url.servers().to_vec())
        .await?;
    Ok((client, refusals))
}

/// What a node's NATS connection reports: server errors loudly, with what to do about a
/// permission a direct reply lacked (the server drops such a publish and says so only here).
fn log_connection_event(event: async_nats::Event) {
    match event {
        async_nats::Event::ServerError(error) => {
            let text = error.to_string();
            if text
                .to_ascii_lowercase()
                .contains("permissions violation for publish to \"_inbox.")
            {
                tracing::error!(
                    error = %text,
                    "this node may not publish to a caller's inbox: give its NATS user publish rights on _INBOX.> (README, \"The account boundary is the broker's\"); the caller of that call gets no reply"
                );
            } else {
                tracing::error!(error = %text, "NATS server error");
            }
        }
        async_nats::Event::Disconnected => tracing::warn!("disconnected from NATS; reconnecting"),
        async_nats::Event::Connected => tracing::info!("connected to NATS"),
        other => tracing::warn!(event = %other, "NATS connection event"),
    }
}

/// Connects a short-lived client (tests): fails fast when no server of `url` is there. A URL
/// that does not parse ([`NatsUrl`]) is a `ServerParse` error.
pub async fn connect_client(url: &str, name: &str) -> Result<Client, async_nats::ConnectError> {
    let url = NatsUrl::parse(url).map_err(|e| {
        async_nats::ConnectError::with_source(async_nats::ConnectErrorKind::ServerParse, e)
    })?;
    Ok(connect_client_with_inbox(&url, name, None).await?.0)
}

/// Connects a client command (the CLI, the MCP front) to the servers of `url`: fails fast when
/// none is there, and reconnects to another of the list when it loses its server. Replies come
/// to `<inbox_prefix>.…` instead of `_INBOX.…`: a NATS user whose permissions allow subscribing
/// only to a private inbox prefix needs this.
/// The [`Refusals`] are what the server refuses this connection: a request raced against them
/// ([`Refusals::guard`]) ends at once when the server drops its publish or its reply inbox,
/// where it would otherwise wait out its timeout.
pub async fn connect_client_with_inbox(
    url: &NatsUrl,
    name: &str,
    inbox_prefix: Option<&str>,
) -> Result<(Client, Refusals), async_nats::ConnectError> {
    let (sink, refusals) = Refusals::new(Identity {
        user: url.user().map(str::to_owned),
        inbox_prefix: inbox_prefix.unwrap_or("_INBOX").to_owned(),
    });
    let timeout = if url.servers().len() > 1 {
        CLUSTER_CONNECT_TIMEOUT
    } else {
        Duration::from_secs(3)
    };
    let mut options = options(url, name)
        .connection_timeout(timeout)
        .event_callback(move |event| {
            let sink = sink.clone();
            async move {
                if let Some(violation) = sink.record(&event) {
                    tracing::debug!(?violation, "NATS refused a permission");
                }
            }
        });
    if let Some(prefix) = inbox_prefix {
        options = options.custom_inbox_prefix(prefix);
    }
    let client = options.connect(url.servers().to_vec()).await?;
    Ok((client, refusals))
}

/// Waits until the server has processed everything this connection sent so far, in particular
/// its subscriptions: a message published to a fresh inbox comes back only after the server
/// has handled the earlier protocol lines (one connection is processed in order).
/// `Client::flush` is not enough: it only writes the socket buffer.
pub async fn confirm_subscriptions(client: &Client) -> Result<(), ConfirmError> {
    let inbox = client.new_inbox();
    let mut echo = client.subscribe(inbox.clone()).await?;
    client.publish(inbox, Bytes::new()).await?;
    match tokio::time::timeout(Duration::from_secs(10), echo.next()).await {
        Ok(Some(_)) => Ok(()),
        _ => Err(ConfirmError::NoEcho),
    }
}

/// A subject an actor listens on from its start ([`listen`]): in its role's queue group (one
/// of the role's nodes takes each message), or alone.
#[derive(Debug, Clone)]
pub struct Listen {
    subject: String,
    queue: Option<String>,
}

impl Listen {
    /// `subject` in `role`'s queue group.
    pub fn shared(subject: impl Into<String>, role: Role) -> Listen {
        Listen {
            subject: subject.into(),
            queue: Some(crate::subjects::queue::of(role)),
        }
    }

    /// `subject` for this node alone.
    pub fn own(subject: impl Into<String>) -> Listen {
        Listen {
            subject: subject.into(),
            queue: None,
        }
    }
}

/// Subscribes to every subject of `subjects`, in order, and returns once the server has them
/// all ([`confirm_subscriptions`]): an actor is listening when its start returns.
pub async fn listen<const N: usize>(
    client: &Client,
    subjects: [Listen; N],
) -> Result<[Subscriber; N], ListenError> {
    let mut subscribers = Vec::with_capacity(N);
    for Listen { subject, queue } in subjects {
        let subscribed = match queue {
            Some(queue) => client.queue_subscribe(subject.clone(), queue).await,
            None => client.subscribe(subject.clone()).await,
        };
        subscribers.push(subscribed.map_err(|source| ListenError::Subscribe { subject, source })?);
    }
    confirm_subscriptions(client).await?;
    Ok(subscribers
        .try_into()
        .unwrap_or_else(|_| unreachable!("one subscriber per subject")))
}

/// Why [`listen`] failed: the actor does not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot subscribe to {subject}: {source}")]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    #[error("the NATS server did not confirm the subscriptions: {0}")]
    Confirm(#[from] ConfirmError),
}

/// Why [`confirm_subscriptions`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfirmError {
    #[error("cannot subscribe: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error("cannot publish: {0}")]
    Publish(#[from] async_nats::PublishError),
    #[error("the NATS server did not echo a message within 10 s")]
    NoEcho,
}

/// A subscription as a stream that can be drained: once `drain` is cancelled the server stops
/// sending to it, the messages already received are still yielded, then the stream ends.
/// Dropping a subscription instead would lose those buffered messages without a reply.
pub fn drainable(subscriber: Subscriber, drain: CancellationToken) -> DrainableSubscription {
    let stream = futures::stream::unfold(
        (subscriber, drain, false),
        |(mut sub, drain, mut draining)| async move {
            loop {
                if draining {
                    return sub.next().await.map(|m| (m, (sub, drain, true)));
                }
                tokio::select! {
                    biased;
                    msg = sub.next() => return msg.map(|m| (m, (sub, drain, false))),
                    _ = drain.cancelled() => {
                        if let Err(e) = sub.drain().await {
                            tracing::warn!(error = %e, "could not drain a subscription; it ends now");
                            return None;
                        }
                        draining = true;
                    }
                }
            }
        },
    );
    DrainableSubscription(Box::pin(stream))
}

/// See [`drainable`].
pub struct DrainableSubscription(Pin<Box<dyn Stream<Item = Message> + Send>>);

impl Stream for DrainableSubscription {
    type Item = Message;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        self.0.as_mut().poll_next(cx)
    }
}

/// Publishes a reply to a request; a message without a reply subject is dropped with a trace
/// (it was a publish, not a request, so nobody waits for an answer). A body over the server's
/// `max_payload` ([`budget::reply_limit`]) is never dropped: the reader gets the plain failure
/// shape with `limit_exceeded` instead ([`respond_or`] for other shapes).
pub async fn respond(client: &Client, request_reply: Option<&async_nats::Subject>, body: Vec<u8>) {
    respond_or(client, request_reply, body, error_body).await
}

/// [`respond`], with `oversize` building what goes out in place of a body over the limit
/// (from the `limit_exceeded` error), for replies whose failure shape is not the plain one.
pub async fn respond_or(
    client: &Client,
    request_reply: Option<&async_nats::Subject>,
    body: Vec<u8>,
    oversize: impl FnOnce(ToolError) -> Vec<u8>,
) {
    let Some(reply) = request_reply else {
        tracing::debug!("request without a reply subject; nothing to answer");
        return;
    };
    let limit = budget::reply_limit(client.max_payload());
    let body = match budget::over_limit(body.len(), limit) {
        None => body,
        Some(error) => oversize(error),
    };
    if let Err(e) = client.publish(reply.clone(), Bytes::from(body)).await {
        tracing::warn!(error = %e, "could not publish a reply");
    }
}

/// Answers a routed call: the [`ActorReply`] goes back to the gateway, or, for a call with a
/// [`DirectReply`](crate::wire::DirectReply) (`finish`, from [`ActorCall::direct_finish`](crate::wire::ActorCall::direct_finish)), the
/// actor finishes it in the gateway's place: `finished` on the call's events subject, the
/// public reply to the caller, then [`ActorReply::delivered`] to the gateway (in that order, on
/// one connection, so the caller's events come first). `started`: when this actor took the
/// call.
///
/// A reply over [`budget::routed_limit`] (on either path, so both answer alike) becomes
/// `limit_exceeded`, keeping its `events_emitted`: the caller hears why instead of nothing.
pub async fn answer(
    client: &Client,
    request_reply: Option<&async_nats::Subject>,
    finish: Option<&DirectFinish>,
    mut reply: ActorReply,
    started: Instant,
) {
    let limit = budget::routed_limit(client.max_payload());
    let Some(DirectFinish {
        invocation,
        event_seq,
        direct,
    }) = finish
    else {
        // Serialized once: the size checked is the body sent.
        let mut body = serde_json::to_vec(&reply).expect("a reply serializes");
        if let Some(error) = budget::over_limit(body.len(), limit) {
            let replaced = oversized(&reply, error);
            body = serde_json::to_vec(&replaced).expect("a reply serializes");
        }
        return respond(client, request_reply, body).await;
    };
    if let Some(error) = budget::over_limit(budget::json_len(&reply), limit) {
        reply = oversized(&reply, error);
    }
    let dispatched = direct.dispatched_tool_name.as_deref();
    let error = ToolError::from_fields(&reply.reply).map(|e| e.code);
    let duration_ms = direct.elapsed_ms.saturating_add(elapsed_ms(started));
    let mut extra = finished_extra(error, duration_ms, dispatched);
    extra.extend(
        direct
            .event_extra
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let event = run_event(
        invocation,
        &direct.event_tool,
        finished_seq(*event_seq, reply.events_emitted),
        RunEventKind::Finished,
        &extra,
    );
    let events = subjects::public::events(&invocation.account, &invocation.invocation_id);
    if let Err(e) = client.publish(events, Bytes::from(event)).await {
        tracing::warn!(error = %e, "could not publish a run event");
    }
    let body = public_reply(&invocation.invocation_id, &reply.reply, dispatched);
    let caller = async_nats::Subject::from(direct.reply_to.as_str());
    respond_or(client, Some(&caller), body, |error| {
        public_reply(&invocation.invocation_id, &error.into_fields(), dispatched)
    })
    .await;
    let ack = ActorReply::delivered(reply.events_emitted.saturating_add(1), error);
    let body = serde_json::to_vec(&ack).expect("a reply serializes");
    respond(client, request_reply, body).await;
}

/// The `seq` of the `finished` event an actor publishes in the gateway's place: after the
/// `emitted` events of its own, which ran on from `first` ([`EventSeq`]).
fn finished_seq(first: u64, emitted: u64) -> u64 {
    let mut seq = EventSeq::from(first);
    seq.handed_back(emitted);
    seq.hand_out()
}

/// What goes out in place of a reply over the limit: the error, with the reply's
/// `events_emitted` (the events it sent still count).
fn oversized(reply: &ActorReply, error: ToolError) -> ActorReply {
    ActorReply {
        events_emitted: reply.events_emitted,
        ..ActorReply::error(error)
    }
}

/// Claims a call of a long-running role: publishes an empty message with
/// [`CLAIMED_BY_HEADER`]` = node` to the call's reply subject, before the work starts. The
/// gateway then answers the caller `unavailable` as soon as `node` drops out of the cluster view
/// (no heartbeat for [`crate::cluster::HEARTBEAT_EXPIRY`]) instead of at the call's deadline. A
/// worker that hands the call to another lets that one claim it again (the latest claim wins).
pub async fn publish_claim(
    client: &Client,
    reply: &async_nats::Subject,
    node: &NodeId,
) -> Result<(), async_nats::PublishError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(CLAIMED_BY_HEADER, node.as_str());
    client
        .publish_with_headers(reply.clone(), headers, Bytes::new())
        .await
}

/// The claimant named by a claim message ([`publish_claim`]): `None` for any other message
/// (the reply itself), `Some(Err(raw))` for a claim whose node id is malformed.
pub fn claimant(msg: &Message) -> Option<Result<NodeId, String>> {
    let value = msg.headers.as_ref()?.get(CLAIMED_BY_HEADER)?;
    let raw = value.as_str();
    Some(NodeId::parse(raw).map_err(|_| raw.to_owned()))
}

/// One wildcard inbox subscription (`<inbox>.*`) shared by many requests that each take
/// *several* messages on their reply subject (claims, then the reply; see [`publish_claim`]),
/// demultiplexed by the last token, as async-nats does for `request` (which keeps only the
/// first message). Subscribing once keeps a SUB/UNSUB pair per call off the server; confirm the
/// subscription ([`confirm_subscriptions`]) before the first request.
///
/// No-responders still works: the server sends its status-503 message to the reply subject,
/// which arrives here like any other. If the subscription ends (the connection closed for
/// good), every waiter's [`ReplyWaiter::next`] returns `None`.
#[derive(Debug)]
pub struct ReplyInbox {
    /// `<inbox>.`, to which a token is appended.
    prefix: String,
    shared: Arc<std::sync::Mutex<InboxWaiters>>,
    next_token: AtomicU64,
    _stop: tokio_util::sync::DropGuard,
}

#[derive(Debug, Default)]
struct InboxWaiters {
    senders: std::collections::HashMap<u64, tokio::sync::mpsc::UnboundedSender<Message>>,
    closed: bool,
}

impl ReplyInbox {
    /// Subscribes `<new inbox>.*` and starts the task that hands each message to its waiter.
    /// The task (and the subscription) ends when the inbox is dropped.
    pub async fn start(client: &Client) -> Result<ReplyInbox, async_nats::SubscribeError> {
        let prefix = format!("{}.", client.new_inbox());
        let subscriber = client.subscribe(format!("{prefix}*")).await?;
        let shared = Arc::new(std::sync::Mutex::new(InboxWaiters::default()));
        let stop = CancellationToken::new();
        tokio::spawn(demultiplex(
            subscriber,
            prefix.clone(),
            shared.clone(),
            stop.clone(),
        ));
        Ok(ReplyInbox {
            prefix,
            shared,
            next_token: AtomicU64::new(0),
            _stop: stop.drop_guard(),
        })
    }

    /// A fresh reply subject and the receiver of what arrives on it, until the waiter drops.
    pub fn register(&self) -> ReplyWaiter<'_> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, messages) = tokio::sync::mpsc::unbounded_channel();
        let mut shared = self.shared.lock().expect("reply inbox lock");
        // A closed inbox drops the sender at once: the waiter sees `None`.
        if !shared.closed {
            shared.senders.insert(token, tx);
        }
        ReplyWaiter {
            inbox: self,
            token,
            subject: async_nats::Subject::from(format!("{}{token}", self.prefix)),
            messages,
        }
    }
}

/// One registration on a [`ReplyInbox`]; unregisters on drop.
#[derive(Debug)]
pub struct ReplyWaiter<'a> {
    inbox: &'a ReplyInbox,
    token: u64,
    subject: async_nats::Subject,
    messages: tokio::sync::mpsc::UnboundedReceiver<Message>,
}

impl ReplyWaiter<'_> {
    /// The reply subject to send with the request.
    pub fn subject(&self) -> &async_nats::Subject {
        &self.subject
    }

    /// The next message on the reply subject; `None` once the inbox's subscription ended.
    pub async fn next(&mut self) -> Option<Message> {
        self.messages.recv().await
    }
}

impl Drop for ReplyWaiter<'_> {
    fn drop(&mut self) {
        if let Ok(mut shared) = self.inbox.shared.lock() {
            shared.senders.remove(&self.token);
        }
    }
}

async fn demultiplex(
    mut subscriber: Subscriber,
    prefix: String,
    shared: Arc<std::sync::Mutex<InboxWaiters>>,
    stop: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => break,
            msg = subscriber.next() => match msg {
                Some(msg) => msg,
                None => {
                    tracing::warn!("the reply inbox subscription ended; waiting calls fail");
                    break;
                }
            },
        };
        let token = msg
            .subject
            .strip_prefix(prefix.as_str())
            .and_then(|t| t.parse::<u64>().ok());
        let waiters = shared.lock().expect("reply inbox lock");
        match token.and_then(|t| waiters.senders.get(&t)) {
            // A receiver gone between lookup and send has stopped waiting; nothing to do.
            Some(tx) => {
                let _ = tx.send(msg);
            }
            None => {
                tracing::debug!(subject = %msg.subject, "a message for a request no longer waiting")
            }
        }
    }
    {
        let mut waiters = shared.lock().expect("reply inbox lock");
        waiters.closed = true;
        waiters.senders.clear();
    }
    let _ = subscriber.unsubscribe().await;
}

/// Makes one running invocation cancellable: listens on
/// `toolmesh.internal.v1.cancel.<account>.<invocation_id>` until dropped. Whoever runs an
/// invocation that can take a while (a parked call, a command in a sandbox) holds one; the
/// gateway's `toolmesh.v1.cancel.<account>` handler asks that subject, and "no responders"
/// there means nothing of that account runs under that id.
#[derive(Debug)]
pub struct CancelWatch {
    client: Client,
    subscription: Option<Subscriber>,
}

impl CancelWatch {
    /// Starts listening. If the subscription fails the invocation simply cannot be cancelled
    /// (logged), which is no reason to fail the invocation itself.
    pub async fn listen(client: &Client, account: &Account, invocation: &InvocationId) -> Self {
        let subject = subjects::internal::cancel(account, invocation);
        let subscription = match client.subscribe(subject).await {
            Ok(sub) => Some(sub),
            Err(e) => {
                tracing::warn!(error = %e, "invocation cannot be cancelled: subscribe failed");
                None
            }
        };
        Self {
            client: client.clone(),
            subscription,
        }
    }

    /// Resolves when a cancel request arrives, after answering it `{"cancelled": true}`.
    /// Never resolves when the subscription could not be made.
    pub async fn requested(&mut self) {
        let Some(sub) = self.subscription.as_mut() else {
            return futures::future::pending().await;
        };
        match sub.next().await {
            Some(msg) => {
                let ack =
                    serde_json::to_vec(&CancelAck { cancelled: true }).expect("an ack serializes");
                respond(&self.client, msg.reply.as_ref(), ack).await;
            }
            None => futures::future::pending().await,
        }
    }
}

/// Work a node is holding right now (NodeStatus `in_flight`). [`InFlight::part`] makes the
/// counter of one role, which counts into the node's as well (`toolmesh_in_flight{role}`).
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    own: Arc<AtomicU64>,
    /// The node's counter, for a role's part.
    whole: Option<Arc<AtomicU64>>,
}

impl InFlight {
    pub fn get(&self) -> u64 {
        self.own.load(Ordering::Relaxed)
    }
    /// A counter of its own whose work also counts here.
    pub fn part(&self) -> InFlight {
        InFlight {
            own: Arc::default(),
            whole: Some(self.own.clone()),
        }
    }
    /// Counts one piece of work until the guard drops.
    pub fn enter(&self) -> InFlightGuard {
        self.own.fetch_add(1, Ordering::Relaxed);
        if let Some(whole) = &self.whole {
            whole.fetch_add(1, Ordering::Relaxed);
        }
        InFlightGuard(self.clone())
    }
}

/// See [`InFlight::enter`].
#[derive(Debug)]
pub struct InFlightGuard(InFlight);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.own.fetch_sub(1, Ordering::Relaxed);
        if let Some(whole) = &self.0.whole {
            whole.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What an actor's `spawn` returns: resolves once the actor has drained and stopped.
#[derive(Debug)]
pub struct ActorHandle {
    pub role: Role,
    stopped: tokio::sync::oneshot::Receiver<()>,
}

/// Held by the actor; [`StopNotice::notify`] (or dropping it) resolves its [`ActorHandle`].
#[derive(Debug)]
pub struct StopNotice(Option<tokio::sync::oneshot::Sender<()>>);

impl ActorHandle {
    pub fn new(role: Role) -> (ActorHandle, StopNotice) {
        let (tx, stopped) = tokio::sync::oneshot::channel();
        (ActorHandle { role, stopped }, StopNotice(Some(tx)))
    }

    /// Runs `actor` (an HTTP listener's [`crate::listener::serve`], a loop of the role's own) as
    /// a task of its own; the handle resolves once it has returned.
    pub fn spawn(role: Role, actor: impl Future<Output = ()> + Send + 'static) -> ActorHandle {
        let (handle, mut notice) = ActorHandle::new(role);
        tokio::spawn(async move {
            actor.await;
            notice.notify();
        });
        handle
    }

    /// Resolves once the actor stopped (a vanished actor counts as stopped).
    pub async fn stopped(self) {
        let _ = self.stopped.await;
    }
}

impl StopNotice {
    pub fn notify(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// How a node tells a running role to stop: first `drain` (stop taking work, answer parked
/// calls, let in-flight work finish), then, at the drain deadline, `stop` (cancel the rest).
#[derive(Debug, Clone, Default)]
pub struct Lifecycle {
    pub drain: CancellationToken,
    pub stop: CancellationToken,
}

impl Lifecycle {
    pub fn new() -> Self {
        Self::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{reconnect_delay, InFlight, MAX_RECONNECT_DELAY};

    #[test]
    fn a_part_counts_into_the_whole() {
        let node = InFlight::default();
        let role = node.part();
        let outer = node.enter();
        let inner = role.enter();
        assert_eq!((node.get(), role.get()), (2, 1));
        drop(inner);
        assert_eq!((node.get(), role.get()), (1, 0));
        drop(outer);
        assert_eq!(node.get(), 0);
    }

    #[test]
    fn reconnects_try_every_server_at_once_then_back_off_to_a_second() {
        let ms = |attempt, servers| reconnect_delay(attempt, servers).as_millis();
        // Three servers: the first round goes through all of them without a pause.
        assert_eq!([ms(1, 3), ms(2, 3), ms(3, 3)], [0, 0, 0]);
        assert_eq!(
            [ms(4, 3), ms(5, 3), ms(6, 3), ms(7, 3)],
            [100, 200, 400, 800]
        );
        // One server: retried at once, then backing off.
        assert_eq!([ms(1, 1), ms(2, 1), ms(3, 1)], [0, 100, 200]);
        for attempt in 0..10_000 {
            assert!(reconnect_delay(attempt, 3) <= MAX_RECONNECT_DELAY);
        }
        assert_eq!(reconnect_delay(usize::MAX, 1), Duration::from_secs(1));
        assert_eq!(ms(0, 0), 0);
    }
}
