//! [`Client`]: a session with one broker. It owns the bootstrap connection and, when shard
//! aware, one lazily opened connection per shard; it routes every request and offers the
//! consumer, offset, query and admin calls. [`Producer`](super::Producer) is built on it.
//!
//! Routing: the bootstrap handshake tells the shard count, the broker id and each shard's
//! address. A queue-bound request (send, pull, offsets) goes to
//! [`owner`](super::route::owner)`(topic, queue, shard_count)`; a message id names its
//! shard (`store_id`); everything else (topic admin, lists, lookups by key) goes to the
//! bootstrap connection, and so does everything when `shard_aware` is off (the broker then
//! forwards).
//!
//! Reconnects: a broken connection is replaced on the next request that needs it. Failed
//! attempts on one address back off exponentially (`reconnect_backoff_min_ms` doubling up
//! to `reconnect_backoff_max_ms`); a request whose deadline falls before the next allowed
//! attempt fails at once with a retriable [`ClientError::Connection`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::{sleep_until, timeout_at, Instant};

use crate::protocol::record::{RecordError, RecordIter, RecordView};
use crate::protocol::ErrorCode;
use crate::protocol::{
    BrokerLimits, CommitOffset, CreateTopic, DeleteTopic, DescribeTopic, GetMaxOffset,
    GetMinOffset, Handshake2, HandshakeOk, HandshakeOk2, Heartbeat, Kind, ListTopics,
    Message as WireMessage, MessageById, MessageId, MessagesByKey, Offset, ProtocolError, Pull,
    PullStatus, QueryOffset, RecordCount, Response, SearchOffsetByTimestamp, TopicInfo,
    UpdateTopic, WithRecords, PROTOCOL_VERSION,
};

use super::config::ClientConfig;
use super::connection::{Connection, ConnectionLimits, PushFrame, Reply};
use super::error::{ClientError, Result};
use super::message::{check_topic, Message};
use super::route::{owner, tag_hash};

mod routing;

/// Most shards a handshake may announce; a larger number is a broken or hostile peer.
const SHARD_COUNT_MAX: u32 = 4096;
/// Largest long-polling wait a pull may ask for (the wire field is in ms, u32).
const PULL_WAIT_MS_MAX: u64 = u32::MAX as u64;

/// Where a request must go.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Route<'a> {
    /// The bootstrap connection (requests without a queue).
    Bootstrap,
    /// The shard that owns this queue.
    Queue { topic: &'a str, queue_id: u32 },
    /// This shard (a message id's store).
    Shard(u32),
}

/// The answer to a pull.
#[derive(Debug, Clone)]
pub struct PullResult {
    pub status: PullStatus,
    /// The messages, in queue order; all share the answer's one buffer. With a tag filter,
    /// only messages whose tag string matches (the broker filters by hash, the client
    /// re-checks the strings).
    pub messages: Vec<Message>,
    /// Where the next pull of this queue starts.
    pub next_offset: u64,
    pub min_offset: u64,
    /// One past the last message of the queue.
    pub max_offset: u64,
    /// The run of the queue's shard that answered (new at every broker start): a consumer
    /// passes the last it read with its next pull, so that a broker that lost the records
    /// it read in a crash sends it back to where the queue ended (`Pull::incarnation`).
    pub incarnation: u64,
}

/// What the bootstrap handshake said about the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub broker_id: u32,
    pub shard_count: u32,
    /// `host:port` of each shard as the client will dial it (an unspecified host such as
    /// `0.0.0.0` is replaced by the bootstrap address's host).
    pub shard_addrs: Vec<String>,
    /// The broker's frame limit (its answers to this client stay within the smaller of
    /// this and the client's own `frame_bytes_max`).
    pub frame_bytes_max: u32,
    /// A group member that sends no heartbeat for this long leaves its group.
    pub session_timeout_ms: u64,
    /// A queue lock not renewed for this long is free.
    pub lock_expiry_ms: u64,
}

/// A client session with one broker. Cheap to clone; clones share the connections.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("broker", &self.inner.config.broker)
            .field("client_id", &self.inner.config.client_id)
            .finish()
    }
}

struct Inner {
    config: ClientConfig,
    limits: ConnectionLimits,
    bootstrap: Arc<Slot>,
    /// Set by every bootstrap handshake; `None` only before the first one.
    topology: RwLock<Option<Arc<Topology>>>,
    pushes: broadcast::Sender<PushFrame>,
    /// Bootstrap connections opened so far; with the connection's liveness it tells a
    /// group member whether the broker still sees the session its locks were taken on.
    bootstrap_opens: AtomicU64,
}

struct Topology {
    info: BrokerInfo,
    /// One slot per shard when shard aware; empty otherwise.
    shards: Vec<Arc<Slot>>,
}

/// One address and the connection to it, if any.
struct Slot {
    addr: String,
    live: Mutex<Option<Arc<Connection>>>,
    /// Held while connecting, so concurrent requests open one connection, not many.
    connecting: tokio::sync::Mutex<Backoff>,
}

#[derive(Default)]
struct Backoff {
    failures: u32,
    next_attempt: Option<Instant>,
    last_error: Option<ClientError>,
}

impl Backoff {
    /// Counts a failed attempt: the next waits the config's reconnect backoff for it.
    fn failed(&mut self, e: &ClientError, config: &ClientConfig) {
        self.failures = self.failures.saturating_add(1);
        self.next_attempt = Some(Instant::now() + config.reconnect_backoff(self.failures));
        self.last_error = Some(e.clone());
    }
}

impl Slot {
    fn new(addr: String) -> Slot {
        Slot {
            addr,
            live: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(Backoff::default()),
        }
    }

    fn live(&self) -> Option<Arc<Connection>> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.as_ref().filter(|c| !c.is_broken()).cloned()
    }
}

impl Client {
    /// Connects to the broker and performs the handshake; fails if the broker cannot be
    /// reached within `connect_timeout_ms`.
    pub async fn connect(config: ClientConfig) -> Result<Client> {
        let frames = config.validate()?;
        let (pushes, _) = broadcast::channel(config.push_buffer_max);
        let inner = Arc::new(Inner {
            limits: ConnectionLimits {
                frames,
                in_flight_max: config.in_flight_max,
            },
            bootstrap: Arc::new(Slot::new(config.broker.clone())),
            topology: RwLock::new(None),
            pushes,
            bootstrap_opens: AtomicU64::new(0),
            config,
        });
        let deadline = Instant::now() + inner.config.connect_timeout();
        inner.connection(&inner.bootstrap, None, deadline).await?;
        Ok(Client { inner })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The broker's shard count (1 before the first handshake, which `connect` makes).
    pub(crate) fn shard_count(&self) -> u32 {
        self.inner.ids().1
    }

    /// What the latest bootstrap handshake said.
    pub fn broker_info(&self) -> BrokerInfo {
        match self.inner.topology() {
            Some(t) => t.info.clone(),
            // `connect` returns only after a handshake; kept total for safety.
            None => BrokerInfo {
                broker_id: 0,
                shard_count: 1,
                shard_addrs: Vec::new(),
                frame_bytes_max: self.inner.config.frame_bytes_max,
                session_timeout_ms: crate::client::SESSION_TIMEOUT_MS_DEFAULT,
                lock_expiry_ms: crate::client::consumer::BROKER_LOCK_EXPIRY_MS_DEFAULT,
            },
        }
    }

    /// Frames the broker pushes (group rebalances, lock losses), from every connection of
    /// this client. A subscriber that falls more than `push_buffer_max` frames behind
    /// gets `RecvError::Lagged` with the number it missed: nothing is dropped silently, and
    /// a slow subscriber never stalls the connections.
    pub fn pushes(&self) -> broadcast::Receiver<PushFrame> {
        self.inner.pushes.subscribe()
    }

    /// Identifies the live bootstrap connection: the same number while that connection
    /// lasts, a new one after a reconnect, `None` while it is down. The broker drops a
    /// group member (and releases its queue locks) when the connection its heartbeats came
    /// on closes, so an ordered consumer stops using locks taken under another number.
    pub fn bootstrap_session(&self) -> Option<u64> {
        let live = self
            .inner
            .bootstrap
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match live.as_ref() {
            Some(c) if !c.is_broken() => Some(self.inner.bootstrap_opens.load(Ordering::SeqCst)),
            _ => None,
        }
    }

    /// Keeps this client's session alive on the broker.
    pub async fn heartbeat(&self) -> Result<()> {
        let request = Heartbeat {
            client_id: self.inner.config.client_id.clone(),
        };
        let reply = self.call(Route::Bootstrap, &request).await?;
        expect_empty(&reply)
    }

    /// Reads up to `max_messages` of queue `queue_id` from `offset`. When there are none
    /// yet, the broker holds the request up to `max_wait` (long polling). `tags` keeps only
    /// messages with one of these tags (empty or `"*"`: all). The request's timeout is
    /// `max_wait` plus `request_timeout_ms`.
    pub async fn pull(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_wait: Duration,
        tags: &[&str],
    ) -> Result<PullResult> {
        self.pull_with(topic, queue_id, offset, max_messages, max_wait, tags, "", 0)
            .await
    }

    /// Like [`pull`](Self::pull), keeping only messages whose properties match an SQL92
    /// filter (`region = 'eu' AND amount > 100`, evaluated by the broker). A bad expression
    /// is refused before anything is sent ([`ClientError::InvalidArgument`], with its
    /// column). When a whole window of messages is filtered out the answer is
    /// `NoMatchedMessage` with `next_offset` past it.
    pub async fn pull_sql(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_wait: Duration,
        sql: &str,
    ) -> Result<PullResult> {
        let selector = crate::client::MessageSelector::by_sql(sql)?;
        self.pull_selected(topic, queue_id, offset, max_messages, max_wait, &selector)
            .await
    }

    /// A pull with what a subscription keeps: tags or an SQL92 filter.
    pub async fn pull_selected(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_wait: Duration,
        selector: &crate::client::MessageSelector,
    ) -> Result<PullResult> {
        let tags: Vec<&str> = selector.tags().iter().map(String::as_str).collect();
        let sql = selector.sql();
        self.pull_with(
            topic,
            queue_id,
            offset,
            max_messages,
            max_wait,
            &tags,
            sql,
            0,
        )
        .await
    }

    /// A pull with a tag filter, an SQL92 filter (empty: none), or both; `incarnation`: the
    /// [`PullResult::incarnation`] of the last answer about this queue whose position the
    /// caller follows (0: none). A caller that keeps its own positions passes it, so that a
    /// broker that lost (in a crash) records the caller read sends it back to where the
    /// queue ended (`OffsetTooBig`) instead of serving other messages at those offsets, and
    /// a position past the end named by the answering run (a topic deleted and created
    /// again) goes back to the queue's start while retention has not touched it.
    #[allow(clippy::too_many_arguments)]
    pub async fn pull_with(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_wait: Duration,
        tags: &[&str],
        sql: &str,
        incarnation: u64,
    ) -> Result<PullResult> {
        check_topic(topic)?;
        let wait_ms = u64::try_from(max_wait.as_millis())
            .unwrap_or(u64::MAX)
            .min(PULL_WAIT_MS_MAX);
        let filter: Vec<&str> = if tags.contains(&"*") {
            Vec::new()
        } else {
            tags.to_vec()
        };
        let mut tag_hashes: Vec<u64> = filter.iter().map(|t| tag_hash(t)).collect();
        tag_hashes.sort_unstable();
        tag_hashes.dedup();
        let request = Pull {
            topic: topic.to_owned(),
            queue_id,
            offset,
            max_messages,
            max_wait_ms: wait_ms as u32,
            tag_hashes,
            sql: sql.to_owned(),
            incarnation,
        };
        let timeout = Duration::from_millis(wait_ms) + self.inner.config.request_timeout();
        let reply = self
            .call_with_timeout(Route::Queue { topic, queue_id }, &request, timeout)
            .await?;
        let (meta, mut messages) = match reply.response()? {
            Response::Pull(pull) => {
                let (messages, damaged) = self.messages_until_damaged(&reply, &pull, None)?;
                let mut meta = pull.meta().clone();
                // A damaged record: those before it are answered, and the next pull
                // starts at it (so fails there, naming it), never past it.
                match (damaged, messages.last()) {
                    (None, _) => {}
                    // Its own queue offset when its header still reads (the broker checked
                    // it against its index entry): a filter's answer starts past the pull's.
                    (Some((e, at)), None) => {
                        return Err(ClientError::DamagedRecord {
                            topic: topic.to_owned(),
                            queue_id,
                            offset: at.unwrap_or(offset),
                            reason: e.to_string(),
                        })
                    }
                    (Some(_), Some(last)) => {
                        meta.next_offset = last.queue_offset().saturating_add(1)
                    }
                }
                (meta, messages)
            }
            other => return Err(unexpected(Kind::PullResult, &other)),
        };
        // Records of another queue, below the pull's offset or out of order would move the
        // queue's position (and its commits) to their offsets: a broker's fault, refused
        // rather than followed.
        let mut last: Option<u64> = None;
        for m in &messages {
            let at = m.queue_offset();
            let ours = m.topic() == topic && m.queue_id() == queue_id;
            if !ours || at < offset || last.is_some_and(|l| at <= l) {
                return Err(ClientError::DamagedRecord {
                    topic: topic.to_owned(),
                    queue_id,
                    offset: at,
                    reason: format!(
                        "a pull at {offset} was answered with {}[{}] at {at}, after {last:?}",
                        m.topic(),
                        m.queue_id()
                    ),
                });
            }
            last = Some(at);
        }
        if !filter.is_empty() {
            messages.retain(|m| m.tags().is_some_and(|tag| filter.contains(&tag)));
        }
        Ok(PullResult {
            status: meta.status,
            messages,
            next_offset: meta.next_offset,
            min_offset: meta.min_offset,
            max_offset: meta.max_offset,
            incarnation: meta.incarnation,
        })
    }

    /// Stores a consumer group's progress in a queue.
    pub async fn commit_offset(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> Result<()> {
        self.commit_offset_from(group, topic, queue_id, offset, 0, None)
            .await
    }

    /// [`commit_offset`](Self::commit_offset) of a position that comes from broker run
    /// `incarnation` ([`PullResult::incarnation`]; 0: unknown): from an earlier run, an
    /// offset past where the queue ended at the broker's start is stored as that end.
    /// A group member names the offsets epoch its position was read under
    /// ([`Assignment::offsets_epoch`](crate::protocol::Assignment::offsets_epoch)): a reset
    /// of the group's offsets at a later epoch refuses it with
    /// [`ErrorCode::OffsetsReset`], so a position from before the reset never undoes it.
    pub async fn commit_offset_from(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
        incarnation: u64,
        offsets_epoch: Option<u64>,
    ) -> Result<()> {
        let request = CommitOffset {
            group: group.to_owned(),
            topic: topic.to_owned(),
            queue_id,
            offset,
            incarnation,
            offsets_epoch,
            if_absent: false,
        };
        self.commit_offset_request(&request).await
    }

    /// Sends a [`CommitOffset`] as it is.
    pub(crate) async fn commit_offset_request(&self, request: &CommitOffset) -> Result<()> {
        let (topic, queue_id) = (request.topic.as_str(), request.queue_id);
        check_topic(topic)?;
        let reply = self.call(Route::Queue { topic, queue_id }, request).await?;
        expect_empty(&reply)
    }

    /// A consumer group's committed offset; `None` when it never committed one.
    pub async fn query_offset(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<Option<u64>> {
        let read = self.query_offset_read(group, topic, queue_id).await?;
        Ok(read.map(|o| o.offset))
    }

    /// [`query_offset`](Self::query_offset) with the broker run it was read under.
    pub async fn query_offset_read(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<Option<Offset>> {
        check_topic(topic)?;
        let request = QueryOffset {
            group: group.to_owned(),
            topic: topic.to_owned(),
            queue_id,
        };
        let answer = self.call(Route::Queue { topic, queue_id }, &request).await;
        match answer.and_then(|reply| expect_offset(&reply)) {
            Ok(offset) => Ok(Some(offset)),
            Err(e) if e.code() == Some(ErrorCode::OffsetNotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The first queue offset still kept.
    pub async fn min_offset(&self, topic: &str, queue_id: u32) -> Result<u64> {
        Ok(self.min_offset_read(topic, queue_id).await?.offset)
    }

    /// [`min_offset`](Self::min_offset) with the broker run it was read under.
    pub async fn min_offset_read(&self, topic: &str, queue_id: u32) -> Result<Offset> {
        check_topic(topic)?;
        let request = GetMinOffset {
            topic: topic.to_owned(),
            queue_id,
        };
        expect_offset(
            &self
                .call(Route::Queue { topic, queue_id }, &request)
                .await?,
        )
    }

    /// One past the last queue offset.
    pub async fn max_offset(&self, topic: &str, queue_id: u32) -> Result<u64> {
        Ok(self.max_offset_read(topic, queue_id).await?.offset)
    }

    /// [`max_offset`](Self::max_offset) with the broker run it was read under.
    pub async fn max_offset_read(&self, topic: &str, queue_id: u32) -> Result<Offset> {
        check_topic(topic)?;
        let request = GetMaxOffset {
            topic: topic.to_owned(),
            queue_id,
        };
        expect_offset(
            &self
                .call(Route::Queue { topic, queue_id }, &request)
                .await?,
        )
    }

    /// The first queue offset stored at or after `timestamp_ms`.
    pub async fn offset_by_timestamp(
        &self,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> Result<u64> {
        let read = self.offset_by_timestamp_read(topic, queue_id, timestamp_ms);
        Ok(read.await?.offset)
    }

    /// [`offset_by_timestamp`](Self::offset_by_timestamp) with the broker run it was read
    /// under.
    pub async fn offset_by_timestamp_read(
        &self,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> Result<Offset> {
        check_topic(topic)?;
        let request = SearchOffsetByTimestamp {
            topic: topic.to_owned(),
            queue_id,
            timestamp_ms,
        };
        expect_offset(
            &self
                .call(Route::Queue { topic, queue_id }, &request)
                .await?,
        )
    }

    /// The message with this id (32 hex characters); `None` when the broker has none there.
    pub async fn message_by_id(&self, msg_id: &str) -> Result<Option<Message>> {
        let id = MessageId::parse(msg_id)
            .map_err(|e| ClientError::InvalidArgument(format!("message id {msg_id:?}: {e}")))?;
        let request = MessageById {
            msg_id: msg_id.to_owned(),
        };
        let reply = self.call(Route::Shard(id.store_id), &request).await?;
        let response = match reply.response() {
            Ok(response) => response,
            // The broker's answer for "no message at that id".
            Err(e) if e.code() == Some(ErrorCode::OffsetNotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut messages = match response {
            Response::Records(records) => self.messages(&reply, &records, Some(id.store_id))?,
            other => return Err(unexpected(Kind::Records, &other)),
        };
        Ok(if messages.is_empty() {
            None
        } else {
            Some(messages.swap_remove(0))
        })
    }

    /// Messages of `topic` whose keys include `key`, stored within `[begin_ms, end_ms]`, at
    /// most `max_messages`.
    pub async fn messages_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max_messages: u32,
    ) -> Result<Vec<Message>> {
        check_topic(topic)?;
        let request = MessagesByKey {
            topic: topic.to_owned(),
            key: key.to_owned(),
            begin_ms,
            end_ms,
            max_messages,
        };
        let reply = self.call(Route::Bootstrap, &request).await?;
        match reply.response()? {
            Response::Records(records) => self.messages(&reply, &records, None),
            other => Err(unexpected(Kind::Records, &other)),
        }
    }

    pub async fn create_topic(&self, topic: &str, queue_count: u32) -> Result<()> {
        check_topic(topic)?;
        let request = CreateTopic {
            topic: topic.to_owned(),
            queue_count,
        };
        expect_empty(&self.call(Route::Bootstrap, &request).await?)
    }

    /// Changes a topic's queue count.
    pub async fn update_topic(&self, topic: &str, queue_count: u32) -> Result<()> {
        check_topic(topic)?;
        let request = UpdateTopic {
            topic: topic.to_owned(),
            queue_count,
        };
        expect_empty(&self.call(Route::Bootstrap, &request).await?)
    }

    pub async fn delete_topic(&self, topic: &str) -> Result<()> {
        check_topic(topic)?;
        let request = DeleteTopic {
            topic: topic.to_owned(),
        };
        expect_empty(&self.call(Route::Bootstrap, &request).await?)
    }

    pub async fn list_topics(&self) -> Result<Vec<String>> {
        let reply = self.call(Route::Bootstrap, &ListTopics {}).await?;
        match reply.response()? {
            Response::TopicList(list) => Ok(list.topics),
            other => Err(unexpected(Kind::TopicList, &other)),
        }
    }

    /// How many queues the topic has; `None` when the broker does not know it.
    pub async fn queue_count(&self, topic: &str) -> Result<Option<u32>> {
        self.queue_count_creating(topic, false).await
    }

    /// [`queue_count`](Self::queue_count); with `create`, a topic that does not exist is
    /// created first if the broker creates topics on first use (as a send would).
    pub(crate) async fn queue_count_creating(
        &self,
        topic: &str,
        create: bool,
    ) -> Result<Option<u32>> {
        match self.describe(topic, create).await {
            Ok(info) => Ok(Some(u32::try_from(info.queues.len()).unwrap_or(u32::MAX))),
            Err(e) if e.code() == Some(ErrorCode::TopicNotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The topic's queues with their offset ranges.
    pub async fn describe_topic(&self, topic: &str) -> Result<TopicInfo> {
        self.describe(topic, false).await
    }

    async fn describe(&self, topic: &str, create: bool) -> Result<TopicInfo> {
        check_topic(topic)?;
        let request = DescribeTopic {
            topic: topic.to_owned(),
            create,
        };
        let reply = self.call(Route::Bootstrap, &request).await?;
        match reply.response()? {
            Response::TopicInfo(info) => Ok(info),
            other => Err(unexpected(Kind::TopicInfo, &other)),
        }
    }

    /// Sends `request` where `route` says, with the configured request timeout.
    pub(crate) async fn call<M: WireMessage>(
        &self,
        route: Route<'_>,
        request: &M,
    ) -> Result<Reply> {
        self.call_with_timeout(route, request, self.inner.config.request_timeout())
            .await
    }

    pub(crate) async fn call_with_timeout<M: WireMessage>(
        &self,
        route: Route<'_>,
        request: &M,
        timeout: Duration,
    ) -> Result<Reply> {
        let deadline = Instant::now() + timeout;
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let connection = self.inner.route(route, deadline).await?;
        connection.request(request, deadline, timeout_ms).await
    }

    /// Sends `request` flagged oneway where `route` says; returns once it is queued.
    pub(crate) async fn call_oneway<M: WireMessage>(
        &self,
        route: Route<'_>,
        request: &M,
    ) -> Result<()> {
        let timeout = self.inner.config.request_timeout();
        let deadline = Instant::now() + timeout;
        let connection = self.inner.route(route, deadline).await?;
        connection
            .send_oneway(request, deadline, self.inner.config.request_timeout_ms)
            .await
    }

    /// The records of a pull or query answer as messages sharing the reply's buffer.
    /// `store_id`: the shard that holds them when known (a message id names it); otherwise
    /// each record's owner shard, which is the shard whose log stores that queue.
    fn messages<M: RecordCount>(
        &self,
        reply: &Reply,
        answer: &WithRecords<'_, M>,
        store_id: Option<u32>,
    ) -> Result<Vec<Message>> {
        match self.messages_until_damaged(reply, answer, store_id)? {
            (messages, None) => Ok(messages),
            (_, Some((e, _))) => Err(ProtocolError::BadRecord(e).into()),
        }
    }

    /// [`Self::messages`], stopping at a damaged record: the messages before it, and its
    /// error with its queue offset if its header reads (the count the answer names is not
    /// checked then).
    fn messages_until_damaged<M: RecordCount>(
        &self,
        reply: &Reply,
        answer: &WithRecords<'_, M>,
        store_id: Option<u32>,
    ) -> Result<(Vec<Message>, Option<Damage>)> {
        // The ids only: the whole `BrokerInfo` clones a string per shard.
        let (broker_id, shard_count) = self.inner.ids();
        let expected = answer.meta().record_count();
        // Bounded by the frame: a count larger than the records present fails below.
        let mut messages = Vec::with_capacity((expected as usize).min(1024));
        let frame = reply.bytes();
        let mut at = reply.tail_start()?;
        // A pull's records share one queue: its owner is computed once.
        let mut last: Option<((&str, u32), u32)> = None;
        for record in RecordIter::new(answer.raw_records()) {
            let record = match record {
                Ok(record) => record,
                Err(e) => {
                    let at = RecordView::parse_unchecked_crc(&frame[at..]).ok();
                    return Ok((messages, Some((e, at.map(|v| v.queue_offset())))));
                }
            };
            let len = record.as_bytes().len();
            let store = store_id.unwrap_or_else(|| {
                let queue = (record.topic(), record.queue_id());
                match last {
                    Some((cached, store)) if cached == queue => store,
                    _ => {
                        let store = owner(queue.0, queue.1, shard_count);
                        last = Some((queue, store));
                        store
                    }
                }
            });
            messages.push(Message::new(frame.slice(at..at + len), broker_id, store));
            at += len;
        }
        if messages.len() as u64 != u64::from(expected) {
            return Err(ProtocolError::RecordCount {
                expected,
                found: messages.len() as u32,
            }
            .into());
        }
        Ok((messages, None))
    }
}

/// A damaged record met in an answer: why, and its queue offset if its header reads.
type Damage = (RecordError, Option<u64>);

pub(crate) fn unexpected(expected: Kind, found: &Response<'_>) -> ClientError {
    ClientError::Protocol(ProtocolError::KindMismatch {
        expected,
        found: found.kind(),
    })
}

pub(crate) fn expect_empty(reply: &Reply) -> Result<()> {
    match reply.response()? {
        Response::Empty(_) => Ok(()),
        other => Err(unexpected(Kind::Empty, &other)),
    }
}

fn expect_offset(reply: &Reply) -> Result<Offset> {
    match reply.response()? {
        Response::Offset(o) => Ok(o),
        other => Err(unexpected(Kind::Offset, &other)),
    }
}
