//! [`Producer`]: sends messages (sync, async, oneway, batch) with queue selection and
//! retries, on top of a [`Client`].
//!
//! Queue choice, per send: a custom [`QueueSelector`] if one is set; else the message's
//! sharding key, hashed (same key, same queue: per-key order); else round-robin. The
//! producer learns a topic's queue count from `DescribeTopic` and caches it, refreshing it
//! in the background every `route_refresh_ms` and at once after a queue or topic error.
//! For a topic the broker does not know yet, it sends with `QUEUE_ID_ANY` so a broker that
//! auto-creates topics picks the queue, and describes the topic again on the next send.
//!
//! Retries: up to `retries` more attempts on retriable errors (timeouts, broken
//! connections, retriable broker codes), each after a pause when the error came without
//! waiting (5 ms, doubling up to 200 ms; none after a timeout, which waited already, nor
//! after a stale route, looked up again); round-robin moves to the next queue on each
//! attempt, keyed and selected sends stay on their queue (order holds for sends of one key
//! made one after another, each awaited before the next, or made concurrently with
//! `ProducerOptions::coalesce`, whose one request in flight per shard keeps them in order;
//! concurrent keyed sends without it can be stored out of order when one is retried). A
//! retried send
//! whose earlier attempt's outcome is unknown may be stored twice: delivery is at least
//! once. Those are an attempt that got no answer in time (`Timeout`), one that failed with
//! a `Connection` error (broken with it in flight; also, counted unknown to be safe, a
//! refused connect or a reconnect's backoff), whose answer could not be read (`Protocol`),
//! or that the broker answered `Timeout` (its
//! call to the queue's shard) or `StoreUnsure` (appended, then the write or fdatasync
//! failed). Such a send that fails in the end fails with that attempt's error, never with
//! a later refusal that says nothing was stored.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::protocol::{
    BatchItem, ErrorCode, Kind, ProtocolError, Response, SendBatch, SendMessage, QUEUE_ID_ANY,
};

pub use crate::protocol::{SendBatchResult, SendResult};

/// First pause after a `BrokerBusy` answer; it doubles on each one after, up to the max.
const BUSY_PAUSE_MS_MIN: u64 = 5;
const BUSY_PAUSE_MS_MAX: u64 = 200;

/// The pause before attempt `attempt` (1: the first retry) after a busy answer, or after a
/// retriable error that came at once (an unreachable broker answers every attempt at once
/// until its reconnect backoff ends: `retries: u32::MAX` spun meanwhile).
fn retry_pause(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(6);
    Duration::from_millis((BUSY_PAUSE_MS_MIN << doublings).min(BUSY_PAUSE_MS_MAX))
}

/// Pauses before retry `attempt` after `e`, unless `e` is a timeout (which waited already)
/// or no retry follows.
async fn pause_before_retry(e: &ClientError, attempt: u32, retries: u32) {
    let timed_out =
        matches!(e, ClientError::Timeout { .. }) || e.code() == Some(ErrorCode::Timeout);
    if !timed_out && attempt <= retries {
        tokio::time::sleep(retry_pause(attempt)).await;
    }
}

use super::config::ClientConfig;
use super::error::{ClientError, Result};
use super::message::{check_topic, OutgoingMessage};
use super::route::queue_for_key;
use super::session::{Client, Route};

mod coalesce;
use coalesce::SharedCoalescer;

pub const SEND_RETRIES_DEFAULT: u32 = 2;
pub const ROUTE_REFRESH_MS_DEFAULT: u64 = 30_000;

/// Most topics a producer keeps a queue count (and coalescers) for: past it, those not
/// used lately are forgotten (a producer sending to ever new topics does not grow for ever;
/// a topic forgotten is looked up again at its next send).
pub const TOPICS_KEPT_MAX: usize = 65_536;
/// Most messages in one batch (the broker's limit too).
pub const BATCH_MESSAGES_MAX: usize = 4096;

/// Picks the queue of a message. Return a value below `queue_count` (larger values are
/// taken modulo `queue_count`). Called again on every retry, with `attempt` counting from 0.
pub trait QueueSelector: Send + Sync + 'static {
    fn select(&self, topic: &str, message: &OutgoingMessage, queue_count: u32, attempt: u32)
        -> u32;
}

/// How a producer sends.
#[derive(Clone)]
pub struct ProducerOptions {
    /// Extra attempts after a retriable failure.
    pub retries: u32,
    /// Ask the broker to answer only once the message is durable (sync flush for these
    /// messages, whatever the broker's flush mode).
    pub wait_durable: bool,
    /// Age after which a topic's cached queue count is refreshed in the background.
    pub route_refresh_ms: u64,
    /// Overrides the built-in choice (sharding key, then round-robin).
    pub selector: Option<Arc<dyn QueueSelector>>,
    /// Packs single sends to a topic made while a send of that topic to the same broker
    /// shard is in flight into one request (`SendMulti`: each message to its own queue,
    /// each queue's messages in send order once the topic's queue count is known: a
    /// topic's first sends, and those made after a refusal had the count forgotten, each
    /// look it up and go in the order their look-ups end; batches and oneway sends are
    /// not packed, so one can pass single sends made before it;
    /// per-message results as for single sends), sent
    /// as soon as that send is answered: no timer, so nothing waits when the pipe is idle.
    /// Delayed and transactional messages, and sends with a custom selector, are always
    /// sent alone. A packed request the broker refuses for one message or queue (a queue
    /// gone, a message only the broker checks) is sent again message by message. At most
    /// 64 MiB of sends wait behind requests in flight (a send past that waits for room, for
    /// its request timeout at most, then fails with `Timeout`; a send that goes at once
    /// takes no room); a waiting send whose future is dropped is not sent, and one still
    /// waiting when its request timeout has passed fails with `Timeout` then (not once the
    /// request ahead of it ends), unsent, its room given back. Off by
    /// default: at moderate rates a send made while another is in flight waits for that
    /// one's answer instead of going at once (one shard at 20,000 msg/s, three pairs: send
    /// p50 77-85 µs and p99 0.13-0.56 ms higher; perf/README.md), a price worth paying
    /// only for throughput.
    pub coalesce: bool,
}

impl Default for ProducerOptions {
    fn default() -> Self {
        ProducerOptions {
            retries: SEND_RETRIES_DEFAULT,
            wait_durable: false,
            route_refresh_ms: ROUTE_REFRESH_MS_DEFAULT,
            selector: None,
            coalesce: false,
        }
    }
}

impl std::fmt::Debug for ProducerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerOptions")
            .field("retries", &self.retries)
            .field("wait_durable", &self.wait_durable)
            .field("route_refresh_ms", &self.route_refresh_ms)
            .field("selector", &self.selector.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// Sends messages. Cheap to clone; clones share connections, caches and the round-robin
/// position, and every method takes `&self`, so one producer serves many tasks.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<ProducerInner>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("client", &self.inner.client)
            .field("options", &self.inner.options)
            .finish()
    }
}

struct ProducerInner {
    client: Client,
    /// Per topic, per shard: single sends waiting for the send in flight (`coalesce`).
    coalescers: Mutex<HashMap<String, Vec<Option<SharedCoalescer>>>>,
    /// Room for the bytes of those sends (`coalesce::COALESCE_WAITING_BYTES_MAX`).
    coalesce_room: Arc<tokio::sync::Semaphore>,
    /// `BrokerBusy` answers so far (flow control), each followed by a pause and a resend.
    busy_answers: AtomicU64,
    /// Requests that carried coalesced single sends, and the sends they carried.
    coalesced_batches: AtomicU64,
    coalesced_sends: AtomicU64,
    options: ProducerOptions,
    routes: Mutex<HashMap<String, TopicRoute>>,
    next_queue: AtomicU32,
}

#[derive(Debug, Clone, Copy)]
struct TopicRoute {
    queue_count: u32,
    fetched_at: Instant,
    refreshing: bool,
}

/// Makes room in a full route cache: the routes not refreshed within `refresh_after` (none
/// of their topics' sends needed them since), and the older half too if that leaves more
/// than 7/8 of the cache (so that the next new topics do not each walk it again).
fn forget_stale(routes: &mut HashMap<String, TopicRoute>, refresh_after: Duration) {
    routes.retain(|_, r| r.fetched_at.elapsed() < refresh_after);
    if routes.len() > TOPICS_KEPT_MAX / 8 * 7 {
        // Exactly half, by age (routes fetched at the same instant are ranked by name).
        let mut by_age: Vec<(Instant, String)> = (routes.iter())
            .map(|(topic, r)| (r.fetched_at, topic.clone()))
            .collect();
        let half = by_age.len() / 2;
        by_age.select_nth_unstable(half);
        for (_, topic) in &by_age[..half] {
            routes.remove(topic);
        }
    }
}

/// The queue of one attempt: a queue id, or [`QUEUE_ID_ANY`] for the broker to choose.
type QueueChoice = i32;

/// How a single send goes under `coalesce` ([`ProducerInner::coalesce_to`]).
enum Coalesce {
    /// Coalesced, to this queue.
    To(QueueChoice),
    /// Coalesced once the topic's queue count is looked up (not cached).
    LookUp,
    /// Alone: coalescing is off, or the message must go alone (delayed, a transaction's
    /// half, a selector's choice).
    No,
}

impl Producer {
    /// Connects with default [`ProducerOptions`].
    pub async fn connect(config: ClientConfig) -> Result<Producer> {
        Producer::connect_with(config, ProducerOptions::default()).await
    }

    pub async fn connect_with(config: ClientConfig, options: ProducerOptions) -> Result<Producer> {
        Ok(Producer::from_client(
            Client::connect(config).await?,
            options,
        ))
    }

    /// A producer sharing `client`'s connections.
    pub fn from_client(client: Client, options: ProducerOptions) -> Producer {
        Producer {
            inner: Arc::new(ProducerInner {
                client,
                options,
                routes: Mutex::new(HashMap::new()),
                coalescers: Mutex::new(HashMap::new()),
                coalesce_room: Arc::new(tokio::sync::Semaphore::new(
                    coalesce::COALESCE_WAITING_BYTES_MAX,
                )),
                busy_answers: AtomicU64::new(0),
                coalesced_batches: AtomicU64::new(0),
                coalesced_sends: AtomicU64::new(0),
                // Producers started together should not all hit queue 0 first.
                next_queue: AtomicU32::new(rand::random::<u32>()),
            }),
        }
    }

    /// The client underneath, for pulls, offsets and admin calls.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    pub fn options(&self) -> &ProducerOptions {
        &self.inner.options
    }

    /// `BrokerBusy` answers this producer got (the broker's flow control); each was
    /// followed by a pause and the same send again, so they are not failures unless the
    /// send's timeout ran out.
    pub fn busy_answers(&self) -> u64 {
        self.inner.busy_answers.load(Ordering::Relaxed)
    }

    /// Requests that carried single sends packed together (`coalesce`).
    pub fn coalesced_batches(&self) -> u64 {
        self.inner.coalesced_batches.load(Ordering::Relaxed)
    }

    /// Single sends those requests carried (`coalesce`); the others went alone.
    pub fn coalesced_sends(&self) -> u64 {
        self.inner.coalesced_sends.load(Ordering::Relaxed)
    }

    /// Sends one message and waits for the broker's answer: where it was stored.
    ///
    /// The message is checked, stamped and (with `coalesce`, once the topic's queue count
    /// is cached) given its queue when `send` is called; nothing is sent or queued until the
    /// future is polled, and a future dropped unpolled sends nothing. A future kept past a
    /// change of the topic's queues goes to the queue chosen then (one gone fails with
    /// `QueueNotFound`, as a send in flight during the change would).
    pub fn send<'a>(
        &'a self,
        topic: &'a str,
        message: OutgoingMessage,
    ) -> impl Future<Output = Result<SendResult>> + Send + 'a {
        // The inner send's future itself, not one wrapped around it: applications keep many
        // in flight, and each is moved whole into whatever holds it.
        self.inner.send(topic, message)
    }

    /// Like [`send`](Self::send), as a future that borrows nothing: spawn it, or keep many
    /// in flight.
    pub fn send_async(
        &self,
        topic: impl Into<String>,
        message: OutgoingMessage,
    ) -> impl Future<Output = Result<SendResult>> + Send + 'static {
        let inner = self.inner.clone();
        let topic = topic.into();
        async move { inner.send(&topic, message).await }
    }

    /// Sends one message flagged oneway: no answer is awaited (none comes, not even an
    /// error), no retry. Returns once the frame is queued on the connection.
    pub async fn send_oneway(&self, topic: &str, mut message: OutgoingMessage) -> Result<()> {
        let mut request = self.inner.prepare(topic, &mut message)?;
        let create = self.inner.picks_by_message(&message);
        let queue_count = self.inner.queue_count_creating(topic, create).await?;
        request.queue_id =
            self.inner
                .choose(topic, &mut message, &mut request.body, queue_count, 0);
        self.inner
            .client
            .call_oneway(route(topic, request.queue_id), &request)
            .await
    }

    /// Sends `messages` to one queue of `topic` in one request; they get consecutive queue
    /// offsets in order. The queue is chosen as for the first message.
    pub async fn send_batch(
        &self,
        topic: &str,
        messages: Vec<OutgoingMessage>,
    ) -> Result<SendBatchResult> {
        self.inner.send_batch(topic, messages).await
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn unexpected(expected: Kind, found: &Response<'_>) -> ClientError {
    ClientError::Protocol(ProtocolError::KindMismatch {
        expected,
        found: found.kind(),
    })
}

fn route(topic: &str, queue_id: QueueChoice) -> Route<'_> {
    match u32::try_from(queue_id) {
        Ok(queue_id) => Route::Queue { topic, queue_id },
        // The broker chooses the queue: any connection will do, it forwards.
        Err(_) => Route::Bootstrap,
    }
}

/// Runs `f` on `message` with `body` put back into it: the body travels in the request
/// (moved, not copied), and a selector may want to look at it.
fn with_body<R>(
    message: &mut OutgoingMessage,
    body: &mut Vec<u8>,
    f: impl FnOnce(&OutgoingMessage) -> R,
) -> R {
    std::mem::swap(&mut message.body, body);
    let r = f(message);
    std::mem::swap(&mut message.body, body);
    r
}

/// Errors after which the cached queue count may be wrong (queues removed, topic deleted
/// and recreated): refresh it and try again.
fn route_is_stale(e: &ClientError) -> bool {
    matches!(
        e.code(),
        Some(ErrorCode::QueueNotFound | ErrorCode::TopicNotFound)
    )
}

impl ProducerInner {
    /// Checks everything checkable before any I/O and builds the request, with the body
    /// moved out of `message`.
    fn prepare(&self, topic: &str, message: &mut OutgoingMessage) -> Result<SendMessage> {
        check_topic(topic)?;
        let properties = message.checked_properties()?;
        Ok(SendMessage {
            topic: topic.to_owned(),
            queue_id: QUEUE_ID_ANY,
            flag: message.flag,
            properties,
            body: std::mem::take(&mut message.body),
            born_timestamp_ms: now_ms(),
            wait_durable: self.options.wait_durable,
        })
    }

    /// A single send. A coalesced one whose topic's queue count is cached has its queue
    /// chosen before its future is made, and that future is the coalesced send's own (its
    /// shard's coalescer is found when first polled): many are kept in flight, and each is
    /// moved whole into what holds it. Every other send is boxed: coalesced ones whose
    /// topic's count is not cached (a topic's first sends, a count past `route_refresh_ms`
    /// until it is refreshed, a route dropped after an error) and those that go alone.
    fn send<'a>(
        self: &'a Arc<Self>,
        topic: &'a str,
        mut message: OutgoingMessage,
    ) -> impl Future<Output = Result<SendResult>> + Send + 'a {
        use futures_util::future::Either;
        let prepared = self.prepare(topic, &mut message).map(|mut request| {
            let coalesce = self.coalesce_to(topic, &mut message, &mut request);
            (request, coalesce)
        });
        match prepared {
            Ok((mut request, Coalesce::To(queue))) => {
                drop(message);
                request.queue_id = queue;
                Either::Left(self.send_coalesced(topic, request))
            }
            prepared => {
                let look_up = matches!(prepared, Ok((_, Coalesce::LookUp)));
                let request = prepared.map(|(request, _)| request);
                Either::Right(Box::pin(
                    self.send_looked_up(topic, message, request, look_up),
                ))
            }
        }
    }

    /// Whether `request` goes coalesced, and to which queue, as far as the cached queue
    /// count tells (the queue is chosen here, once, when it does).
    fn coalesce_to(
        &self,
        topic: &str,
        message: &mut OutgoingMessage,
        request: &mut SendMessage,
    ) -> Coalesce {
        if !self.options.coalesce || self.options.selector.is_some() {
            return Coalesce::No;
        }
        let props = crate::protocol::record::Properties::new(&request.properties);
        if crate::protocol::delay::asks_for_delay(&props)
            || props.get(crate::protocol::record::prop::TRAN_MSG).is_some()
        {
            return Coalesce::No;
        }
        match self.cached_queue_count(topic) {
            None => Coalesce::LookUp,
            Some(count) => match self.choose(topic, message, &mut request.body, Some(count), 0) {
                QUEUE_ID_ANY => Coalesce::No,
                queue => Coalesce::To(queue),
            },
        }
    }

    /// A single send not decided up front: `look_up`, a coalesced one whose topic's queue
    /// count is not cached (looked up here, then coalesced if the topic exists); else one
    /// sent alone (or its preparation's error).
    async fn send_looked_up(
        self: &Arc<Self>,
        topic: &str,
        mut message: OutgoingMessage,
        request: Result<SendMessage>,
        look_up: bool,
    ) -> Result<SendResult> {
        let mut request = request?;
        if look_up {
            let keyed = self.picks_by_message(&message);
            match self.queue_count_creating(topic, keyed).await {
                Ok(Some(count)) => {
                    let queue = self.choose(topic, &mut message, &mut request.body, Some(count), 0);
                    if queue != QUEUE_ID_ANY {
                        request.queue_id = queue;
                        return self.send_coalesced(topic, request).await;
                    }
                }
                // Sent alone, which looks the count up again with its retries.
                Ok(None) => {}
                Err(e) if e.is_retriable() => {}
                Err(e) => return Err(e),
            }
        }
        self.send_alone(topic, message, request).await
    }

    /// A single send as its own request, with retries.
    async fn send_alone(
        self: &Arc<Self>,
        topic: &str,
        mut message: OutgoingMessage,
        mut request: SendMessage,
    ) -> Result<SendResult> {
        let create = self.picks_by_message(&message);
        self.with_retries(
            topic,
            create,
            &mut request,
            |request, queue_count, attempt| {
                request.queue_id =
                    self.choose(topic, &mut message, &mut request.body, queue_count, attempt);
                request.queue_id
            },
            |response| match response {
                Response::SendResult(result) => Ok(result),
                other => Err(unexpected(Kind::SendResult, &other)),
            },
        )
        .await
    }

    /// A single send to a queue already chosen, with retries (boxed: the futures of the
    /// sends that call it stay small).
    async fn send_to_queue(
        self: &Arc<Self>,
        topic: &str,
        request: &mut SendMessage,
        queue: QueueChoice,
    ) -> Result<SendResult> {
        Box::pin(self.with_retries(
            topic,
            false,
            request,
            |_, _, _| queue,
            |response| match response {
                Response::SendResult(result) => Ok(result),
                other => Err(unexpected(Kind::SendResult, &other)),
            },
        ))
        .await
    }

    async fn send_batch(
        self: &Arc<Self>,
        topic: &str,
        mut messages: Vec<OutgoingMessage>,
    ) -> Result<SendBatchResult> {
        check_topic(topic)?;
        if messages.is_empty() || messages.len() > BATCH_MESSAGES_MAX {
            return Err(ClientError::InvalidArgument(format!(
                "a batch holds 1 to {BATCH_MESSAGES_MAX} messages, not {}",
                messages.len()
            )));
        }
        let born_timestamp_ms = now_ms();
        let mut items = Vec::with_capacity(messages.len());
        for message in &mut messages {
            items.push(BatchItem {
                flag: message.flag,
                properties: message.checked_properties()?,
                // Moved, not copied: the request frame is written from this buffer.
                body: std::mem::take(&mut message.body).into(),
                born_timestamp_ms,
            });
        }
        // A selector sees the first message whole: a copy of its body, made once.
        let mut first_body: Option<Vec<u8>> = None;
        let n = messages.len();
        let mut request = SendBatch {
            topic: topic.to_owned(),
            queue_id: QUEUE_ID_ANY,
            messages: items,
            wait_durable: self.options.wait_durable,
        };
        self.with_retries(
            topic,
            self.picks_by_message(&messages[0]),
            &mut request,
            |request, queue_count, attempt| {
                // Checked non-empty above: the first message decides the queue.
                if let (Some(first), Some(item)) =
                    (messages.first_mut(), request.messages.first_mut())
                {
                    let body = match &self.options.selector {
                        Some(_) => first_body.get_or_insert_with(|| item.body.to_vec()),
                        None => &mut Vec::new(),
                    };
                    request.queue_id = self.choose(topic, first, body, queue_count, attempt);
                }
                request.queue_id
            },
            |response| match response {
                // One place per message, or the ids the result makes would be wrong.
                Response::SendBatchResult(result)
                    if result.count as usize != n || result.physical_offsets.len() != n =>
                {
                    Err(ClientError::Protocol(ProtocolError::BadPayload {
                        kind: Kind::SendBatchResult,
                        reason: format!(
                            "{} messages at {} places for a batch of {}",
                            result.count,
                            result.physical_offsets.len(),
                            n
                        ),
                    }))
                }
                Response::SendBatchResult(result) => Ok(result),
                other => Err(unexpected(Kind::SendBatchResult, &other)),
            },
        )
        .await
    }

    /// Sends `request` up to `1 + retries` times. `choose` sets the request's queue for an
    /// attempt (given the topic's queue count, if known, and the attempt number) and
    /// returns it; `answer` takes the result out of a successful response. With
    /// `create` (its queue is picked by key or selector), a topic not known yet is created
    /// first if the broker creates topics on first use: sent to any queue instead (the
    /// broker's choice), the topic's first message with a key would land elsewhere than
    /// the later ones with that key, out of their order.
    async fn with_retries<M, T>(
        self: &Arc<Self>,
        topic: &str,
        create: bool,
        request: &mut M,
        mut choose: impl FnMut(&mut M, Option<u32>, u32) -> QueueChoice,
        answer: impl Fn(Response<'_>) -> Result<T>,
    ) -> Result<T>
    where
        M: crate::protocol::Message,
    {
        let mut last_error = None;
        // The first attempt whose outcome is unknown (no answer, or the connection broke
        // with it in flight): the message may be stored, so the send never ends with a
        // refusal that says nothing was (a later attempt's `BrokerBusy`, say), but with it.
        let mut maybe_stored: Option<ClientError> = None;
        // A busy broker (flow control) is waited out, backing off, for a request timeout
        // from its first such answer; those answers do not use up retries.
        let mut busy_until: Option<Instant> = None;
        let mut busy_answers = 0u32;
        let mut attempt = 0u32;
        while attempt <= self.options.retries {
            // A coalesced send's leader runs on a task of its own: once its caller gave up,
            // it writes nothing more (the caller may send the message again).
            if coalesce::caller_gone() {
                return Err(maybe_stored.or(last_error).unwrap_or_else(|| {
                    ClientError::Connection(format!("the send to {topic} was given up"))
                }));
            }
            let queue_count = match self.queue_count_creating(topic, create).await {
                Ok(count) => count,
                Err(e) if e.is_retriable() => {
                    attempt = attempt.saturating_add(1);
                    pause_before_retry(&e, attempt, self.options.retries).await;
                    last_error = Some(e);
                    continue;
                }
                // An earlier attempt's unknown outcome stands: a refusal of the look-up
                // says nothing of it.
                Err(e) => return Err(maybe_stored.unwrap_or(e)),
            };
            let queue_id = choose(request, queue_count, attempt);
            let outcome = match self.client.call(route(topic, queue_id), &*request).await {
                Ok(reply) => reply.response().and_then(&answer),
                Err(e) => Err(e),
            };
            if let Err(e) = &outcome {
                // No answer, the connection broke with it in flight, an answer that could
                // not be read (`Protocol`), the broker's own call to the queue's shard
                // timed out (`Timeout`), or its write failed after the append
                // (`StoreUnsure`): it may be stored.
                if matches!(
                    e,
                    ClientError::Timeout { .. }
                        | ClientError::Connection(_)
                        | ClientError::Protocol(_)
                ) || matches!(e.code(), Some(ErrorCode::Timeout | ErrorCode::StoreUnsure))
                {
                    maybe_stored.get_or_insert_with(|| e.clone());
                }
            }
            match outcome {
                Ok(result) => {
                    if queue_count.is_none() {
                        // The broker chose (and perhaps created the topic): learn its
                        // queues on the next send.
                        self.forget(topic);
                    }
                    return Ok(result);
                }
                Err(e) if e.code() == Some(ErrorCode::BrokerBusy) => {
                    self.busy_answers.fetch_add(1, Ordering::Relaxed);
                    let pause = retry_pause(busy_answers.saturating_add(1));
                    let now = Instant::now();
                    let until =
                        *busy_until.get_or_insert(now + self.client.config().request_timeout());
                    if now + pause >= until {
                        return Err(maybe_stored.unwrap_or(e));
                    }
                    busy_answers += 1;
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Err(e) if route_is_stale(&e) && queue_id != QUEUE_ID_ANY => {
                    self.forget(topic);
                    last_error = Some(e);
                }
                Err(e) if e.is_retriable() => {
                    // Saturating: `retries: u32::MAX` retries for as long as the sends fail.
                    attempt = attempt.saturating_add(1);
                    pause_before_retry(&e, attempt, self.options.retries).await;
                    last_error = Some(e);
                    continue;
                }
                Err(e) => return Err(maybe_stored.unwrap_or(e)),
            }
            // Saturating: `retries: u32::MAX` retries for as long as the sends fail.
            attempt = attempt.saturating_add(1);
        }
        Err(maybe_stored.or(last_error).unwrap_or_else(|| {
            ClientError::Connection(format!("send to {topic} failed without an error"))
        }))
    }

    /// Whether `message`'s queue is picked by what it is (a sharding key, or the selector):
    /// then the topic's queue count is needed before its first send.
    fn picks_by_message(&self, message: &OutgoingMessage) -> bool {
        self.options.selector.is_some() || message.sharding_key.is_some()
    }

    /// The queue of attempt number `attempt`.
    fn choose(
        &self,
        topic: &str,
        message: &mut OutgoingMessage,
        body: &mut Vec<u8>,
        queue_count: Option<u32>,
        attempt: u32,
    ) -> QueueChoice {
        let Some(count) = queue_count.filter(|c| *c > 0) else {
            return QUEUE_ID_ANY;
        };
        let queue = if let Some(selector) = &self.options.selector {
            with_body(message, body, |m| selector.select(topic, m, count, attempt)) % count
        } else if let Some(key) = &message.sharding_key {
            queue_for_key(key, count)
        } else {
            self.next_queue.fetch_add(1, Ordering::Relaxed) % count
        };
        // Queue counts are bounded far below i32::MAX by the broker; stay total anyway.
        i32::try_from(queue).unwrap_or(QUEUE_ID_ANY)
    }

    /// The topic's cached queue count, without refreshing it.
    fn cached_queue_count(&self, topic: &str) -> Option<u32> {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let route = routes.get(topic)?;
        let refresh_after = Duration::from_millis(self.options.route_refresh_ms);
        (route.fetched_at.elapsed() < refresh_after).then_some(route.queue_count)
    }

    /// The topic's queue count: cached, or described now. `None`: the broker does not
    /// know the topic (a send then lets the broker choose, which auto-creates it if the
    /// broker is set to). With `create`, a topic not known is created first if the broker
    /// creates topics on first use.
    async fn queue_count_creating(
        self: &Arc<Self>,
        topic: &str,
        create: bool,
    ) -> Result<Option<u32>> {
        let refresh_after = Duration::from_millis(self.options.route_refresh_ms);
        {
            let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(route) = routes.get_mut(topic) {
                if route.fetched_at.elapsed() >= refresh_after && !route.refreshing {
                    // Stale: keep sending with what we have while one task refreshes it.
                    route.refreshing = true;
                    let inner = self.clone();
                    let topic = topic.to_owned();
                    tokio::spawn(async move {
                        let _ = inner.describe(&topic, false).await;
                    });
                }
                return Ok(Some(route.queue_count));
            }
        }
        self.describe(topic, create).await
    }

    async fn describe(&self, topic: &str, create: bool) -> Result<Option<u32>> {
        match self.client.queue_count_creating(topic, create).await {
            Ok(Some(queue_count)) => {
                let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
                if queue_count == 0 {
                    routes.remove(topic);
                    return Ok(None);
                }
                if routes.len() >= TOPICS_KEPT_MAX && !routes.contains_key(topic) {
                    forget_stale(
                        &mut routes,
                        Duration::from_millis(self.options.route_refresh_ms),
                    );
                }
                routes.insert(
                    topic.to_owned(),
                    TopicRoute {
                        queue_count,
                        fetched_at: Instant::now(),
                        refreshing: false,
                    },
                );
                Ok(Some(queue_count))
            }
            Ok(None) => {
                self.forget(topic);
                Ok(None)
            }
            Err(e) => {
                // A failed background refresh must not block the next one.
                let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(route) = routes.get_mut(topic) {
                    route.refreshing = false;
                }
                Err(e)
            }
        }
    }

    fn forget(&self, topic: &str) {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(topic);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full route cache forgets the routes not refreshed lately, and the older half when
    /// that leaves it nearly full.
    #[test]
    fn a_full_route_cache_forgets_the_oldest() {
        let now = Instant::now();
        let route = |age_ms: u64| TopicRoute {
            queue_count: 8,
            fetched_at: now - Duration::from_millis(age_ms),
            refreshing: false,
        };
        // Few stale (the rest fetched at one instant): those, then exactly half of the rest.
        let mut routes: HashMap<String, TopicRoute> = (0..TOPICS_KEPT_MAX)
            .map(|i| (format!("t{i}"), route(if i < 10 { 60_000 } else { 10 })))
            .collect();
        forget_stale(&mut routes, Duration::from_secs(30));
        let fresh = TOPICS_KEPT_MAX - 10;
        assert_eq!(routes.len(), fresh - fresh / 2);
        assert!(!routes.contains_key("t3"));
        // Most stale: only those go.
        let mut routes: HashMap<String, TopicRoute> = (0..TOPICS_KEPT_MAX)
            .map(|i| (format!("t{i}"), route(if i < 10_000 { 60_000 } else { 10 })))
            .collect();
        forget_stale(&mut routes, Duration::from_secs(30));
        assert_eq!(routes.len(), TOPICS_KEPT_MAX - 10_000);
        assert!(!routes.contains_key("t3") && routes.contains_key("t10000"));
        // None stale: the older half goes.
        let mut routes: HashMap<String, TopicRoute> = (0..TOPICS_KEPT_MAX)
            .map(|i| (format!("t{i}"), route((TOPICS_KEPT_MAX - i) as u64)))
            .collect();
        forget_stale(&mut routes, Duration::from_secs(3600));
        assert_eq!(routes.len(), TOPICS_KEPT_MAX / 2);
        assert!(routes.contains_key(&format!("t{}", TOPICS_KEPT_MAX - 1)));
        assert!(!routes.contains_key("t0"));
    }
}
