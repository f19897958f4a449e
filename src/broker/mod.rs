//! Broker services of one shard: request handlers (one per request kind), the topic table,
//! committed offsets, long polling, and the messages shards exchange. Runtime-agnostic: the
//! shard runtime (`src/shard/`) gives it a [`Peers`] to reach other shards and feeds it
//! frames; everything here runs on the shard's own thread.
//!
//! Architecture invariant: no sockets and no glommio here; handlers never block the thread
//! (file syncs go through `crate::io::blocking`); nothing is shared with other shards except
//! by messages.

mod group_service;
pub mod groups;
pub mod offsets;
pub mod topics;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use crate::log::record::{Properties, RecordDraft, RecordView, BODY_BYTES_MAX};
use crate::log::{FlushMode, LogError};
use crate::protocol::route::owner;
use crate::protocol::{
    encode_error, encode_frame, encode_frame_head, encode_response, ErrorBody, ErrorCode, Flags,
    FrameDecoder, FrameLimits, HandshakeOk, MessageId, Offset, PullResult, PullStatus, QueueInfo,
    Records, Request, Response, SendBatchResult, SendResult, TopicInfo, TopicList,
    PROTOCOL_VERSION,
};
use crate::store::{validate_topic, MessageStore, PutResult, StoreError};
use group_service::{answer, GroupExtra, LockOp, CONN_SHARD_SHIFT};
use groups::{GroupState, LockTable};
use offsets::OffsetStore;
use topics::{TopicTable, QUEUES_PER_TOPIC_MAX};

pub type LocalBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Writes a pushed frame to one client connection without waiting.
pub type PushFn = Rc<dyn Fn(Vec<u8>)>;

/// Longest a pull may be held.
pub const PULL_WAIT_MS_MAX: u32 = 60_000;
/// Most messages one pull may ask for.
pub const PULL_MESSAGES_MAX: u32 = 1024;
/// Most messages in one batch send.
pub const BATCH_MESSAGES_MAX: usize = 4096;
/// How long a shard waits for another shard's answer.
const MESH_CALL_TIMEOUT_MS: u64 = 30_000;
/// Requests queued for one peer shard before `call` waits.
const OUTBOX_CAPACITY: usize = 1024;

/// What one shard asks another.
#[derive(Debug)]
pub enum MeshRequest {
    /// A client's request frame, to handle as if it had arrived on this shard.
    Frame {
        bytes: Vec<u8>,
        peer: SocketAddr,
        conn: u64,
    },
    /// Shard 0 tells the others of a topic change (None: deleted).
    TopicChanged { topic: String, queues: Option<u32> },
    /// Ask shard 0 to create a topic if it does not exist (auto-create).
    EnsureTopic { topic: String, queues: u32 },
    /// (queue, min, max) of the topic's queues this shard owns.
    QueueRanges { topic: String },
    /// Records with this key on this shard.
    ByKey {
        topic: String,
        key: String,
        begin_ms: i64,
        end_ms: i64,
        max: u32,
    },
    /// Write a pushed frame to a client connection of this shard.
    Push { conn: u64, frame: Vec<u8> },
    /// A member left: drop its locks here.
    ReleaseClient { group: String, client_id: String },
    /// (to a coordinator) a connection carrying members of the group closed.
    ConnectionClosed { group: String, conn: u64 },
    /// Lock or unlock queues this shard owns.
    Locks {
        op: LockOp,
        group: String,
        client_id: String,
        topic: String,
        queues: Vec<u32>,
    },
    /// Reset the group's offsets of this shard's queues of the topic.
    ResetOffsets {
        group: String,
        topic: String,
        timestamp_ms: i64,
    },
    /// (to a coordinator) the group's offsets were reset: members must re-read them.
    OffsetsReset { group: String },
    /// The group's progress on this shard's queues of the topic.
    Progress { group: String, topic: String },
}

#[derive(Debug)]
pub enum MeshReply {
    Frame(Vec<u8>),
    Ack,
    Ranges(Vec<(u32, u64, u64)>),
    Records(Vec<Vec<u8>>),
    Queues(Vec<u32>),
    Progress(Vec<crate::protocol::QueueProgress>),
    Failed(ErrorCode, String),
}

#[derive(Debug)]
pub enum MeshMsg {
    Request {
        from: u32,
        corr: u64,
        body: MeshRequest,
    },
    Reply {
        corr: u64,
        body: MeshReply,
    },
}

/// How a shard reaches the others (implemented by the shard runtime over bounded channels).
pub trait Peers {
    /// Sends a message to shard `to`; waits while its channel is full; fails if the
    /// channel is closed (that shard stopped).
    fn send(&self, to: u32, msg: MeshMsg) -> LocalBoxFuture<'_, Result<(), String>>;
}

/// Settings of the broker that the services need.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub broker_id: u32,
    pub data_dir: PathBuf,
    pub flush: FlushMode,
    pub flush_interval_ms: u64,
    pub auto_create_topics: bool,
    pub default_queues: u32,
    pub frame_limits: FrameLimits,
    /// A group member that sends no heartbeat for this long leaves.
    pub session_timeout_ms: u64,
    /// A queue lock not renewed for this long is free.
    pub lock_expiry_ms: u64,
}

/// Everything one shard owns.
pub struct ShardCtx {
    pub id: u32,
    pub shard_count: u32,
    pub cfg: ServiceConfig,
    pub store: MessageStore,
    topics: RefCell<TopicTable>,
    offsets: RefCell<OffsetStore>,
    shard_addrs: RefCell<Vec<String>>,
    peers: Box<dyn Peers>,
    polls: RefCell<HashMap<(String, u32), Rc<Notify>>>,
    pending: RefCell<HashMap<u64, oneshot::Sender<MeshReply>>>,
    next_corr: Cell<u64>,
    round_robin: Cell<u32>,
    stopping: Cell<bool>,
    stop_notify: Rc<Notify>,
    in_flight: Cell<u64>,
    /// Groups this shard coordinates.
    groups: RefCell<HashMap<String, (GroupState, GroupExtra)>>,
    /// Locks of the queues this shard owns.
    locks: RefCell<LockTable>,
    /// Client connections of this shard, to push frames to.
    conns: RefCell<HashMap<u64, PushFn>>,
    /// Groups whose members heartbeat through each connection.
    conn_groups: RefCell<HashMap<u64, HashSet<String>>>,
    next_conn: Cell<u64>,
    /// Serializes topic table changes on shard 0.
    topic_changes: tokio::sync::Mutex<()>,
    /// Per-peer FIFO of outgoing requests.
    outboxes: RefCell<HashMap<u32, tokio::sync::mpsc::Sender<MeshMsg>>>,
}

fn err(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(code, message)
}

fn store_error(e: StoreError) -> ErrorBody {
    match &e {
        StoreError::InvalidTopic(_) => err(ErrorCode::InvalidTopic, e.to_string()),
        StoreError::OffsetTooSmall { .. } => err(ErrorCode::OffsetTooSmall, e.to_string()),
        StoreError::OffsetTooBig { .. } => err(ErrorCode::OffsetTooBig, e.to_string()),
        StoreError::Log(LogError::Poisoned { .. }) => {
            err(ErrorCode::StoreUnavailable, e.to_string())
        }
        StoreError::Log(LogError::InvalidRecord(_))
        | StoreError::Log(LogError::RecordTooLarge { .. }) => {
            err(ErrorCode::InvalidMessage, e.to_string())
        }
        StoreError::Log(LogError::OffsetTooSmall { .. }) => {
            err(ErrorCode::OffsetTooSmall, e.to_string())
        }
        StoreError::Log(LogError::OffsetTooBig { .. }) => {
            err(ErrorCode::OffsetTooBig, e.to_string())
        }
        _ => err(ErrorCode::StoreIo, e.to_string()),
    }
}

fn error_frame(request_id: u64, e: &ErrorBody) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + e.message.len());
    let code = e.error_code().unwrap_or(ErrorCode::Internal);
    if encode_error(request_id, code, e.message.clone(), &mut out).is_err() {
        out.clear();
    }
    out
}

fn response_frame(request_id: u64, r: &Response<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    match encode_response(r, request_id, &mut out) {
        Ok(_) => out,
        Err(e) => error_frame(
            request_id,
            &err(ErrorCode::Internal, format!("encode: {e}")),
        ),
    }
}

/// Longest consumer group name.
pub const GROUP_BYTES_MAX: usize = 255;

/// Group names are stored (offsets file) and hashed to a coordinator: keep them bounded.
fn validate_group(group: &str) -> Result<(), ErrorBody> {
    if group.is_empty() || group.len() > GROUP_BYTES_MAX || group.chars().any(char::is_control) {
        return Err(err(
            ErrorCode::InvalidMessage,
            format!("invalid group name {group:?}: use 1 to {GROUP_BYTES_MAX} bytes without control characters"),
        ));
    }
    Ok(())
}

/// What handling a frame gives.
pub enum Handled {
    /// The response frame, ready now.
    Now(Option<Vec<u8>>),
    /// The response frame, later (None: a oneway request).
    Later(LocalBoxFuture<'static, Option<Vec<u8>>>),
}

impl ShardCtx {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u32,
        shard_count: u32,
        cfg: ServiceConfig,
        store: MessageStore,
        topics: TopicTable,
        offsets: OffsetStore,
        peers: Box<dyn Peers>,
    ) -> Rc<ShardCtx> {
        let cfg_lock_expiry_ms = cfg.lock_expiry_ms;
        Rc::new(ShardCtx {
            id,
            shard_count,
            cfg,
            store,
            topics: RefCell::new(topics),
            offsets: RefCell::new(offsets),
            shard_addrs: RefCell::new(Vec::new()),
            peers,
            polls: RefCell::new(HashMap::new()),
            pending: RefCell::new(HashMap::new()),
            next_corr: Cell::new(1),
            round_robin: Cell::new(0),
            stopping: Cell::new(false),
            stop_notify: Rc::new(Notify::new()),
            in_flight: Cell::new(0),
            groups: RefCell::new(HashMap::new()),
            locks: RefCell::new(LockTable::new(cfg_lock_expiry_ms)),
            conns: RefCell::new(HashMap::new()),
            conn_groups: RefCell::new(HashMap::new()),
            next_conn: Cell::new(1),
            topic_changes: tokio::sync::Mutex::new(()),
            outboxes: RefCell::new(HashMap::new()),
        })
    }

    /// Registers a client connection; `push` writes a frame to it without waiting (a full
    /// connection drops the frame: pushed notifications are hints members re-check).
    pub fn register_connection(&self, push: PushFn) -> u64 {
        let n = self.next_conn.get();
        self.next_conn.set(n + 1);
        let id = ((self.id as u64) << CONN_SHARD_SHIFT) | n;
        self.conns.borrow_mut().insert(id, push);
        id
    }

    pub fn set_shard_addrs(&self, addrs: Vec<String>) {
        *self.shard_addrs.borrow_mut() = addrs;
    }

    /// Starts a clean stop: long polls answer at once, new requests are refused.
    pub fn begin_stop(&self) {
        self.stopping.set(true);
        self.stop_notify.notify_waiters();
        for n in self.polls.borrow().values() {
            n.notify_waiters();
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Requests being handled right now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.get()
    }

    /// Flushes committed offsets (async flush mode's background sync, and shutdown).
    pub async fn sync_offsets(&self) -> std::io::Result<()> {
        let (file, generation) = {
            let mut o = self.offsets.borrow_mut();
            if !o.is_dirty() {
                return Ok(());
            }
            o.sync_handle()?
        };
        crate::io::blocking(move || file.sync_data()).await?;
        self.offsets.borrow_mut().synced(generation);
        Ok(())
    }

    fn poll_notify(&self, topic: &str, queue_id: u32) -> Rc<Notify> {
        self.polls
            .borrow_mut()
            .entry((topic.to_owned(), queue_id))
            .or_insert_with(|| Rc::new(Notify::new()))
            .clone()
    }

    fn wake_pollers(&self, topic: &str, queue_id: u32) {
        if let Some(n) = self.polls.borrow().get(&(topic.to_owned(), queue_id)) {
            n.notify_waiters();
        }
    }

    fn owner_of(&self, topic: &str, queue_id: u32) -> u32 {
        owner(topic, queue_id, self.shard_count)
    }

    /// Sends a request to another shard and waits for its answer.
    pub async fn call(self: &Rc<Self>, to: u32, body: MeshRequest) -> Result<MeshReply, ErrorBody> {
        self.call_with_timeout(to, body, MESH_CALL_TIMEOUT_MS).await
    }

    /// The FIFO of requests to shard `to`. Requests leave in the order they were handed to
    /// `call` (one drain task per peer), so forwarded sends to one queue keep their order
    /// even when the mesh channel is full and its waiting senders would be woken in any order.
    fn outbox(self: &Rc<Self>, to: u32) -> tokio::sync::mpsc::Sender<MeshMsg> {
        if let Some(tx) = self.outboxes.borrow().get(&to) {
            return tx.clone();
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel::<MeshMsg>(OUTBOX_CAPACITY);
        self.outboxes.borrow_mut().insert(to, tx.clone());
        let ctx = self.clone();
        crate::io::spawn(async move {
            while let Some(msg) = rx.recv().await {
                if let Err(e) = ctx.peers.send(to, msg).await {
                    eprintln!("ringmq: shard {}: to shard {to}: {e}", ctx.id);
                }
            }
        });
        tx
    }

    /// [`call`](Self::call) with its own timeout (a forwarded long poll waits longer).
    pub async fn call_with_timeout(
        self: &Rc<Self>,
        to: u32,
        body: MeshRequest,
        timeout_ms: u64,
    ) -> Result<MeshReply, ErrorBody> {
        let corr = self.next_corr.get();
        self.next_corr.set(corr + 1);
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(corr, tx);
        let msg = MeshMsg::Request {
            from: self.id,
            corr,
            body,
        };
        if self.outbox(to).send(msg).await.is_err() {
            self.pending.borrow_mut().remove(&corr);
            return Err(err(
                ErrorCode::ShardUnavailable,
                format!("shard {to} is not reachable"),
            ));
        }
        let timeout = crate::io::sleep(Duration::from_millis(timeout_ms));
        let answer = futures_lite::future::or(async { rx.await.ok() }, async {
            timeout.await;
            None
        })
        .await;
        self.pending.borrow_mut().remove(&corr);
        match answer {
            Some(MeshReply::Failed(code, message)) => Err(err(code, message)),
            Some(reply) => Ok(reply),
            None => Err(err(
                ErrorCode::ShardUnavailable,
                format!("shard {to} did not answer"),
            )),
        }
    }

    /// Handles a message from another shard.
    pub fn on_mesh(self: &Rc<Self>, msg: MeshMsg) {
        match msg {
            MeshMsg::Reply { corr, body } => {
                if let Some(tx) = self.pending.borrow_mut().remove(&corr) {
                    let _ = tx.send(body);
                }
            }
            MeshMsg::Request { from, corr, body } => {
                let ctx = self.clone();
                // Frames are dispatched now, in arrival order, so that forwarded sends keep
                // the order they were sent in; only their completion is asynchronous.
                let fut: LocalBoxFuture<'static, MeshReply> = match body {
                    MeshRequest::Frame { bytes, peer, conn } => match ctx
                        .handle_frame(&bytes, peer, conn)
                    {
                        Handled::Now(f) => {
                            Box::pin(async move { MeshReply::Frame(f.unwrap_or_default()) })
                        }
                        Handled::Later(f) => {
                            Box::pin(async move { MeshReply::Frame(f.await.unwrap_or_default()) })
                        }
                    },
                    other => Box::pin(async move { ctx.mesh_request(other).await }),
                };
                let ctx = self.clone();
                crate::io::spawn(async move {
                    let body = fut.await;
                    let _ = ctx.peers.send(from, MeshMsg::Reply { corr, body }).await;
                });
            }
        }
    }

    async fn mesh_request(self: Rc<Self>, req: MeshRequest) -> MeshReply {
        match req {
            MeshRequest::Frame { .. } => {
                MeshReply::Failed(ErrorCode::Internal, "frame routed wrongly".into())
            }
            MeshRequest::TopicChanged { topic, queues } => {
                self.apply_topic_change(&topic, queues).await;
                MeshReply::Ack
            }
            MeshRequest::EnsureTopic { topic, queues } => {
                match self.set_topic(&topic, Some(queues), true).await {
                    Ok(_) => MeshReply::Ack,
                    Err(e) => {
                        MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                    }
                }
            }
            MeshRequest::QueueRanges { topic } => MeshReply::Ranges(self.local_ranges(&topic)),
            MeshRequest::Push { conn, frame } => {
                if let Some(push) = self.conns.borrow().get(&conn) {
                    push(frame);
                }
                MeshReply::Ack
            }
            MeshRequest::ReleaseClient { group, client_id } => {
                self.locks.borrow_mut().release_client(&group, &client_id);
                MeshReply::Ack
            }
            MeshRequest::ConnectionClosed { group, conn } => {
                self.on_connection_closed(&group, conn).await;
                MeshReply::Ack
            }
            MeshRequest::Locks {
                op,
                group,
                client_id,
                topic,
                queues,
            } => MeshReply::Queues(self.local_locks(op, &group, &client_id, &topic, &queues)),
            MeshRequest::ResetOffsets {
                group,
                topic,
                timestamp_ms,
            } => match self.local_reset(&group, &topic, timestamp_ms).await {
                Ok(()) => MeshReply::Ack,
                Err(e) => {
                    MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                }
            },
            MeshRequest::OffsetsReset { group } => {
                self.offsets_were_reset(&group).await;
                MeshReply::Ack
            }
            MeshRequest::Progress { group, topic } => {
                MeshReply::Progress(self.local_progress(&group, &topic))
            }
            MeshRequest::ByKey {
                topic,
                key,
                begin_ms,
                end_ms,
                max,
            } => {
                match self
                    .store
                    .messages_by_key(&topic, &key, begin_ms, end_ms, max as usize)
                    .await
                {
                    Ok(bufs) => MeshReply::Records(bufs.iter().map(|b| b.to_vec()).collect()),
                    Err(e) => {
                        let e = store_error(e);
                        MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                    }
                }
            }
        }
    }

    async fn apply_topic_change(self: &Rc<Self>, topic: &str, queues: Option<u32>) {
        self.topics.borrow_mut().set(topic, queues);
        self.topic_changed_for_groups(topic).await;
        if queues.is_none() {
            if let Err(e) = self.store.delete_topic(topic) {
                eprintln!("ringmq: shard {}: deleting topic {topic}: {e}", self.id);
            }
            if let Err(e) = self.offsets.borrow_mut().forget_topic(topic) {
                eprintln!(
                    "ringmq: shard {}: forgetting offsets of {topic}: {e}",
                    self.id
                );
            }
            // Replay after a crash must not bring the deleted queues back: the checkpoint
            // must cover every record of the topic, so make the log durable to its end
            // first (in async mode the durable end trails the written end).
            let end = self.store.log().write_offset();
            let synced = match self.store.log().wait_readable(end).await {
                Ok(()) => self.store.log().sync_all().await,
                Err(e) => Err(e),
            };
            if let Err(e) = synced {
                eprintln!(
                    "ringmq: shard {}: syncing the log after deleting {topic}: {e}",
                    self.id
                );
            }
            if let Err(e) = self.store.checkpoint().await {
                eprintln!(
                    "ringmq: shard {}: checkpoint after deleting {topic}: {e}",
                    self.id
                );
            }
        }
    }

    fn local_ranges(&self, topic: &str) -> Vec<(u32, u64, u64)> {
        let Some(count) = self.topics.borrow().get(topic) else {
            return Vec::new();
        };
        (0..count)
            .filter(|&q| self.owner_of(topic, q) == self.id)
            .map(|q| {
                let (min, max) = self.store.queue_range(topic, q);
                (q, min, max)
            })
            .collect()
    }

    /// Creates, grows or deletes a topic. Runs on shard 0 (the keeper of the table), which
    /// persists the table and tells every other shard before answering.
    async fn set_topic(
        self: &Rc<Self>,
        topic: &str,
        queues: Option<u32>,
        if_absent: bool,
    ) -> Result<bool, ErrorBody> {
        debug_assert_eq!(self.id, 0);
        // One change at a time: each copies the table, saves it and tells every shard, and
        // an "exists" answer must mean the creation has reached every shard.
        let _one_at_a_time = self.topic_changes.lock().await;
        validate_topic(topic).map_err(store_error)?;
        let current = self.topics.borrow().get(topic);
        if let Some(q) = queues {
            if q == 0 || q > QUEUES_PER_TOPIC_MAX {
                return Err(err(
                    ErrorCode::InvalidMessage,
                    format!("queue count {q} must be 1..={QUEUES_PER_TOPIC_MAX}"),
                ));
            }
        }
        match (current, queues) {
            (Some(_), Some(_)) if if_absent => return Ok(false),
            (Some(cur), Some(q)) if q < cur => {
                return Err(err(
                    ErrorCode::InvalidMessage,
                    format!("topic {topic} has {cur} queues; queue counts only grow"),
                ));
            }
            (None, None) => {
                return Err(err(
                    ErrorCode::TopicNotFound,
                    format!("topic {topic} does not exist"),
                ))
            }
            _ => {}
        }
        let mut table = self.topics.borrow().clone();
        table.set(topic, queues);
        let dir = self.cfg.data_dir.clone();
        let saved = table.clone();
        crate::io::blocking(move || saved.save(&dir))
            .await
            .map_err(|e| err(ErrorCode::StoreIo, format!("saving topics: {e}")))?;
        self.apply_topic_change(topic, queues).await;
        for to in 1..self.shard_count {
            self.call(
                to,
                MeshRequest::TopicChanged {
                    topic: topic.to_owned(),
                    queues,
                },
            )
            .await?;
        }
        Ok(true)
    }

    /// The topic's queue count, creating the topic if allowed.
    async fn ensure_topic(self: &Rc<Self>, topic: &str) -> Result<u32, ErrorBody> {
        if let Some(q) = self.topics.borrow().get(topic) {
            return Ok(q);
        }
        if !self.cfg.auto_create_topics {
            return Err(err(
                ErrorCode::TopicNotFound,
                format!("topic {topic} does not exist (auto-create is off)"),
            ));
        }
        validate_topic(topic).map_err(store_error)?;
        let queues = self.cfg.default_queues;
        if self.id == 0 {
            self.set_topic(topic, Some(queues), true).await?;
        } else {
            self.call(
                0,
                MeshRequest::EnsureTopic {
                    topic: topic.to_owned(),
                    queues,
                },
            )
            .await?;
        }
        self.topics.borrow().get(topic).ok_or_else(|| {
            err(
                ErrorCode::Internal,
                format!("topic {topic} was not created"),
            )
        })
    }

    fn known_queue(&self, topic: &str, queue_id: u32) -> Result<(), ErrorBody> {
        match self.topics.borrow().get(topic) {
            None => Err(err(
                ErrorCode::TopicNotFound,
                format!("topic {topic} does not exist"),
            )),
            Some(n) if queue_id >= n => Err(err(
                ErrorCode::QueueNotFound,
                format!("topic {topic} has {n} queues; no queue {queue_id}"),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Handles one request frame (already delimited; its header checked by the reader).
    /// The synchronous part (decoding, routing, appending) runs now, in arrival order.
    pub fn handle_frame(self: &Rc<Self>, bytes: &[u8], peer: SocketAddr, conn: u64) -> Handled {
        let decoder = FrameDecoder::new(self.cfg.frame_limits);
        let frame = match decoder.decode(bytes) {
            Ok(Some(f)) => f,
            Ok(None) => {
                return Handled::Now(Some(error_frame(
                    0,
                    &err(ErrorCode::MalformedFrame, "truncated frame"),
                )))
            }
            Err(e) => return Handled::Now(Some(error_frame(0, &ErrorBody::from(&e)))),
        };
        let request_id = frame.request_id();
        let oneway = frame.header().flags().is_oneway();
        let req = match frame.decode_request() {
            Ok(r) => r,
            Err(e) => return Handled::Now(Some(error_frame(request_id, &ErrorBody::from(&e)))),
        };
        if self.stopping.get() {
            let e = err(ErrorCode::ShardUnavailable, "the broker is shutting down");
            return Handled::Now((!oneway).then(|| error_frame(request_id, &e)));
        }
        // Requests bound to a queue go to its owner.
        let route = match &req {
            Request::SendMessage(m) if m.queue_id >= 0 => {
                Some((m.topic.as_str(), m.queue_id as u32))
            }
            Request::SendBatch(m) if m.queue_id >= 0 => Some((m.topic.as_str(), m.queue_id as u32)),
            Request::Pull(m) => Some((m.topic.as_str(), m.queue_id)),
            Request::GetMinOffset(m) => Some((m.topic.as_str(), m.queue_id)),
            Request::GetMaxOffset(m) => Some((m.topic.as_str(), m.queue_id)),
            Request::SearchOffsetByTimestamp(m) => Some((m.topic.as_str(), m.queue_id)),
            Request::CommitOffset(m) => Some((m.topic.as_str(), m.queue_id)),
            Request::QueryOffset(m) => Some((m.topic.as_str(), m.queue_id)),
            _ => None,
        };
        let group = match &req {
            Request::CommitOffset(m) => Some(m.group.as_str()),
            Request::QueryOffset(m) => Some(m.group.as_str()),
            Request::GroupHeartbeat(m) => Some(m.group.as_str()),
            Request::Unregister(m) => Some(m.group.as_str()),
            Request::QueryAssignment(m) => Some(m.group.as_str()),
            Request::GroupMembers(m) => Some(m.group.as_str()),
            Request::ResetOffset(m) => Some(m.group.as_str()),
            Request::ConsumerProgress(m) => Some(m.group.as_str()),
            Request::LockBatch(m) => Some(m.group.as_str()),
            Request::UnlockBatch(m) => Some(m.group.as_str()),
            _ => None,
        };
        if let Some(Err(e)) = group.map(validate_group) {
            return Handled::Now((!oneway).then(|| error_frame(request_id, &e)));
        }
        if let Request::GroupHeartbeat(h) = &req {
            // Only the shard that carries the connection hears of its close.
            if conn >> CONN_SHARD_SHIFT == self.id as u64 {
                self.note_group_connection(&h.group, conn);
            }
        }
        let target = match &req {
            Request::CreateTopic(_) | Request::UpdateTopic(_) | Request::DeleteTopic(_) => Some(0),
            Request::GroupHeartbeat(m) => Some(self.coordinator_of(&m.group)),
            Request::Unregister(m) => Some(self.coordinator_of(&m.group)),
            Request::QueryAssignment(m) => Some(self.coordinator_of(&m.group)),
            Request::GroupMembers(m) => Some(self.coordinator_of(&m.group)),
            Request::MessageById(m) => match MessageId::parse(&m.msg_id) {
                Ok(id) if id.store_id < self.shard_count => Some(id.store_id),
                Ok(_) | Err(_) => None,
            },
            _ => route.map(|(t, q)| self.owner_of(t, q)),
        };
        if let Some(to) = target.filter(|&to| to != self.id) {
            let ctx = self.clone();
            let frame_bytes = bytes.to_vec();
            // A forwarded long poll may be held for its whole wait.
            let timeout_ms = match &req {
                Request::Pull(p) => {
                    MESH_CALL_TIMEOUT_MS.max(p.max_wait_ms.min(PULL_WAIT_MS_MAX) as u64 + 5_000)
                }
                _ => MESH_CALL_TIMEOUT_MS,
            };
            return Handled::Later(Box::pin(async move {
                match ctx
                    .call_with_timeout(
                        to,
                        MeshRequest::Frame {
                            bytes: frame_bytes,
                            peer,
                            conn,
                        },
                        timeout_ms,
                    )
                    .await
                {
                    Ok(MeshReply::Frame(f)) if f.is_empty() => None,
                    Ok(MeshReply::Frame(f)) => Some(f),
                    Ok(other) => Some(error_frame(
                        request_id,
                        &err(ErrorCode::Internal, format!("unexpected reply {other:?}")),
                    )),
                    Err(e) => (!oneway).then(|| error_frame(request_id, &e)),
                }
            }));
        }
        self.in_flight.set(self.in_flight.get() + 1);
        let guard = InFlight(self.clone());
        let handled = self.handle_local(req, request_id, peer, conn);
        let finish = move |f: Option<Vec<u8>>| {
            drop(guard);
            if oneway {
                None
            } else {
                f
            }
        };
        match handled {
            Handled::Now(f) => Handled::Now(finish(f)),
            Handled::Later(fut) => Handled::Later(Box::pin(async move { finish(fut.await) })),
        }
    }

    fn handle_local(
        self: &Rc<Self>,
        req: Request,
        request_id: u64,
        peer: SocketAddr,
        conn: u64,
    ) -> Handled {
        let ctx = self.clone();
        let later = |f: LocalBoxFuture<'static, Result<Vec<u8>, ErrorBody>>| {
            Handled::Later(Box::pin(async move {
                Some(match f.await {
                    Ok(frame) => frame,
                    Err(e) => error_frame(request_id, &e),
                })
            }))
        };
        let now = |r: Result<Response<'static>, ErrorBody>| {
            Handled::Now(Some(match r {
                Ok(r) => response_frame(request_id, &r),
                Err(e) => error_frame(request_id, &e),
            }))
        };
        match req {
            Request::GroupHeartbeat(h) => answer(request_id, self.group_heartbeat(h, conn)),
            Request::Unregister(u) => answer(request_id, self.unregister(u)),
            Request::QueryAssignment(q) => now(self.query_assignment(&q)),
            Request::GroupMembers(g) => now(self.group_members(&g)),
            Request::ResetOffset(r) => answer(request_id, self.reset_offset(r)),
            Request::ConsumerProgress(p) => answer(request_id, self.consumer_progress(p)),
            Request::LockBatch(l) => answer(request_id, self.lock_batch(l)),
            Request::UnlockBatch(u) => answer(request_id, self.unlock_batch(u)),
            Request::Handshake(h) => {
                let ok = HandshakeOk {
                    protocol_version: PROTOCOL_VERSION as u32,
                    shard_count: self.shard_count,
                    shard_id: self.id,
                    shard_addrs: self.shard_addrs.borrow().clone(),
                    broker_id: self.cfg.broker_id,
                };
                if h.protocol_version != PROTOCOL_VERSION as u32 {
                    let e = err(
                        ErrorCode::UnsupportedVersion,
                        format!("protocol version {} is not supported (broker speaks {PROTOCOL_VERSION})", h.protocol_version),
                    );
                    return Handled::Now(Some(error_frame(request_id, &e)));
                }
                Handled::Now(Some(response_frame(request_id, &Response::HandshakeOk(ok))))
            }
            Request::Heartbeat(_) => Handled::Now(Some(response_frame(
                request_id,
                &Response::Empty(crate::protocol::Empty {}),
            ))),
            Request::SendMessage(m) => {
                let item = [(m.flag, m.properties, m.body, m.born_timestamp_ms)];
                self.send(
                    request_id,
                    m.topic,
                    m.queue_id,
                    &item,
                    m.wait_durable,
                    peer,
                    false,
                )
            }
            Request::SendBatch(b) => {
                if b.messages.is_empty() || b.messages.len() > BATCH_MESSAGES_MAX {
                    let e = err(
                        ErrorCode::InvalidMessage,
                        format!("a batch holds 1..={BATCH_MESSAGES_MAX} messages"),
                    );
                    return Handled::Now(Some(error_frame(request_id, &e)));
                }
                let items: Vec<_> = b
                    .messages
                    .into_iter()
                    .map(|i| (i.flag, i.properties, i.body, i.born_timestamp_ms))
                    .collect();
                self.send(
                    request_id,
                    b.topic,
                    b.queue_id,
                    &items,
                    b.wait_durable,
                    peer,
                    true,
                )
            }
            Request::Pull(p) => later(Box::pin(async move { ctx.pull(request_id, p).await })),
            Request::GetMinOffset(m) => Handled::Now(Some(self.offset_answer(
                request_id,
                &m.topic,
                m.queue_id,
                |min, _| min,
            ))),
            Request::GetMaxOffset(m) => Handled::Now(Some(self.offset_answer(
                request_id,
                &m.topic,
                m.queue_id,
                |_, max| max,
            ))),
            Request::SearchOffsetByTimestamp(m) => later(Box::pin(async move {
                ctx.known_queue(&m.topic, m.queue_id)?;
                let offset = ctx
                    .store
                    .offset_by_timestamp(&m.topic, m.queue_id, m.timestamp_ms)
                    .await
                    .map_err(store_error)?;
                Ok(response_frame(
                    request_id,
                    &Response::Offset(Offset { offset }),
                ))
            })),
            Request::CommitOffset(m) => later(Box::pin(async move {
                ctx.known_queue(&m.topic, m.queue_id)?;
                ctx.offsets
                    .borrow_mut()
                    .commit(&m.group, &m.topic, m.queue_id, m.offset)
                    .map_err(|e| err(ErrorCode::StoreIo, format!("committing offset: {e}")))?;
                if ctx.cfg.flush == FlushMode::Sync {
                    ctx.sync_offsets()
                        .await
                        .map_err(|e| err(ErrorCode::StoreIo, format!("syncing offsets: {e}")))?;
                }
                Ok(response_frame(
                    request_id,
                    &Response::Empty(crate::protocol::Empty {}),
                ))
            })),
            Request::QueryOffset(m) => {
                let answer = self.known_queue(&m.topic, m.queue_id).and_then(|_| {
                    self.offsets
                        .borrow()
                        .get(&m.group, &m.topic, m.queue_id)
                        .ok_or_else(|| {
                            err(
                                ErrorCode::OffsetNotFound,
                                format!(
                                    "group {} has no offset for {}:{}",
                                    m.group, m.topic, m.queue_id
                                ),
                            )
                        })
                });
                Handled::Now(Some(match answer {
                    Ok(offset) => response_frame(request_id, &Response::Offset(Offset { offset })),
                    Err(e) => error_frame(request_id, &e),
                }))
            }
            Request::CreateTopic(m) => later(Box::pin(async move {
                if !ctx.set_topic(&m.topic, Some(m.queue_count), true).await? {
                    return Err(err(
                        ErrorCode::TopicExists,
                        format!("topic {} exists", m.topic),
                    ));
                }
                Ok(response_frame(
                    request_id,
                    &Response::Empty(crate::protocol::Empty {}),
                ))
            })),
            Request::UpdateTopic(m) => later(Box::pin(async move {
                if ctx.topics.borrow().get(&m.topic).is_none() {
                    return Err(err(
                        ErrorCode::TopicNotFound,
                        format!("topic {} does not exist", m.topic),
                    ));
                }
                ctx.set_topic(&m.topic, Some(m.queue_count), false).await?;
                Ok(response_frame(
                    request_id,
                    &Response::Empty(crate::protocol::Empty {}),
                ))
            })),
            Request::DeleteTopic(m) => later(Box::pin(async move {
                ctx.set_topic(&m.topic, None, false).await?;
                Ok(response_frame(
                    request_id,
                    &Response::Empty(crate::protocol::Empty {}),
                ))
            })),
            Request::ListTopics(_) => {
                let topics = self.topics.borrow().names();
                Handled::Now(Some(response_frame(
                    request_id,
                    &Response::TopicList(TopicList { topics }),
                )))
            }
            Request::DescribeTopic(m) => later(Box::pin(async move {
                if ctx.topics.borrow().get(&m.topic).is_none() {
                    return Err(err(
                        ErrorCode::TopicNotFound,
                        format!("topic {} does not exist", m.topic),
                    ));
                }
                let mut ranges = ctx.local_ranges(&m.topic);
                for to in (0..ctx.shard_count).filter(|&s| s != ctx.id) {
                    if let MeshReply::Ranges(r) = ctx
                        .call(
                            to,
                            MeshRequest::QueueRanges {
                                topic: m.topic.clone(),
                            },
                        )
                        .await?
                    {
                        ranges.extend(r);
                    }
                }
                ranges.sort_unstable();
                let queues = ranges
                    .into_iter()
                    .map(|(queue_id, min_offset, max_offset)| QueueInfo {
                        queue_id,
                        min_offset,
                        max_offset,
                    })
                    .collect();
                Ok(response_frame(
                    request_id,
                    &Response::TopicInfo(TopicInfo {
                        topic: m.topic,
                        queues,
                    }),
                ))
            })),
            Request::MessageById(m) => later(Box::pin(async move {
                let id = MessageId::parse(&m.msg_id).map_err(|e| {
                    err(
                        ErrorCode::InvalidMessage,
                        format!("bad message id {:?}: {e}", m.msg_id),
                    )
                })?;
                if id.store_id != ctx.id || id.broker_id != ctx.cfg.broker_id {
                    return Err(err(
                        ErrorCode::OffsetNotFound,
                        format!("message id {} names another broker or shard", m.msg_id),
                    ));
                }
                let buf =
                    ctx.store
                        .read_physical(id.physical_offset)
                        .await
                        .map_err(|e| match e {
                            StoreError::Log(LogError::InvalidRecord(_)) => err(
                                ErrorCode::OffsetNotFound,
                                format!("no message with id {}", m.msg_id),
                            ),
                            other => store_error(other),
                        })?;
                Ok(records_frame(request_id, &[&buf[..]]))
            })),
            Request::MessagesByKey(m) => later(Box::pin(async move {
                let max = m.max_messages.clamp(1, 1024);
                let mut found: Vec<Vec<u8>> = ctx
                    .store
                    .messages_by_key(&m.topic, &m.key, m.begin_ms, m.end_ms, max as usize)
                    .await
                    .map_err(store_error)?
                    .iter()
                    .map(|b| b.to_vec())
                    .collect();
                for to in (0..ctx.shard_count).filter(|&s| s != ctx.id) {
                    let req = MeshRequest::ByKey {
                        topic: m.topic.clone(),
                        key: m.key.clone(),
                        begin_ms: m.begin_ms,
                        end_ms: m.end_ms,
                        max,
                    };
                    if let MeshReply::Records(r) = ctx.call(to, req).await? {
                        found.extend(r);
                    }
                }
                // Newest first, as one list.
                found.sort_by_key(|b| {
                    std::cmp::Reverse(
                        RecordView::parse_unchecked_crc(b)
                            .map(|v| v.store_timestamp_ms())
                            .unwrap_or(0),
                    )
                });
                found.truncate(max as usize);
                let parts: Vec<&[u8]> = found.iter().map(|b| &b[..]).collect();
                Ok(records_frame(request_id, &parts))
            })),
        }
    }

    fn offset_answer(
        &self,
        request_id: u64,
        topic: &str,
        queue_id: u32,
        pick: impl Fn(u64, u64) -> u64,
    ) -> Vec<u8> {
        match self.known_queue(topic, queue_id) {
            Ok(()) => {
                let (min, max) = self.store.queue_range(topic, queue_id);
                response_frame(
                    request_id,
                    &Response::Offset(Offset {
                        offset: pick(min, max),
                    }),
                )
            }
            Err(e) => error_frame(request_id, &e),
        }
    }

    fn msg_id(&self, physical_offset: u64) -> String {
        MessageId {
            broker_id: self.cfg.broker_id,
            store_id: self.id,
            physical_offset,
        }
        .to_string()
    }

    /// Validates and appends `items` now (so pipelined sends keep their order), then waits
    /// for the acknowledgement the flush mode (or `wait_durable`) asks for.
    #[allow(clippy::too_many_arguments)]
    fn send(
        self: &Rc<Self>,
        request_id: u64,
        topic: String,
        queue_id: i32,
        items: &[(i32, Vec<u8>, Vec<u8>, i64)],
        wait_durable: bool,
        peer: SocketAddr,
        batch: bool,
    ) -> Handled {
        for (_, props, body, _) in items {
            if body.len() > BODY_BYTES_MAX {
                let e = err(
                    ErrorCode::BodyTooLarge,
                    format!(
                        "message body of {} bytes exceeds the {} byte limit",
                        body.len(),
                        BODY_BYTES_MAX
                    ),
                );
                return Handled::Now(Some(error_frame(request_id, &e)));
            }
            if let Err(e) = Properties::new(props).validate() {
                return Handled::Now(Some(error_frame(
                    request_id,
                    &err(ErrorCode::InvalidMessage, e.to_string()),
                )));
            }
        }
        let known = self.topics.borrow().get(&topic);
        match known {
            Some(count) if queue_id >= 0 => {
                let q = queue_id as u32;
                if q >= count {
                    let e = err(
                        ErrorCode::QueueNotFound,
                        format!("topic {topic} has {count} queues; no queue {q}"),
                    );
                    return Handled::Now(Some(error_frame(request_id, &e)));
                }
                let appended = self.append_all(&topic, q, items, peer);
                let ctx = self.clone();
                Handled::Later(Box::pin(async move {
                    Some(match appended {
                        Ok(puts) => {
                            ctx.finish_send(request_id, &topic, q, puts, wait_durable, batch)
                                .await
                        }
                        Err(e) => error_frame(request_id, &e),
                    })
                }))
            }
            _ => {
                // Unknown topic (maybe auto-created) or a queue left to the broker.
                let ctx = self.clone();
                let items = items.to_vec();
                Handled::Later(Box::pin(async move {
                    let count = match ctx.ensure_topic(&topic).await {
                        Ok(c) => c,
                        Err(e) => return Some(error_frame(request_id, &e)),
                    };
                    let q = if queue_id >= 0 {
                        queue_id as u32
                    } else {
                        ctx.choose_queue(&topic, count)
                    };
                    if q >= count {
                        let e = err(
                            ErrorCode::QueueNotFound,
                            format!("topic {topic} has {count} queues; no queue {q}"),
                        );
                        return Some(error_frame(request_id, &e));
                    }
                    let to = ctx.owner_of(&topic, q);
                    if to != ctx.id {
                        // Re-encode with the chosen queue and let its owner handle it.
                        let frame =
                            reencode_send(request_id, &topic, q, &items, wait_durable, batch);
                        return match ctx
                            .call(
                                to,
                                MeshRequest::Frame {
                                    bytes: frame,
                                    peer,
                                    conn: 0,
                                },
                            )
                            .await
                        {
                            Ok(MeshReply::Frame(f)) => Some(f),
                            Ok(_) => Some(error_frame(
                                request_id,
                                &err(ErrorCode::Internal, "unexpected reply"),
                            )),
                            Err(e) => Some(error_frame(request_id, &e)),
                        };
                    }
                    match ctx.append_all(&topic, q, &items, peer) {
                        Ok(puts) => Some(
                            ctx.finish_send(request_id, &topic, q, puts, wait_durable, batch)
                                .await,
                        ),
                        Err(e) => Some(error_frame(request_id, &e)),
                    }
                }))
            }
        }
    }

    /// Picks a queue for a send that left the choice to the broker: round-robin over the
    /// queues this shard owns (no hop), or over all queues when it owns none.
    fn choose_queue(&self, topic: &str, count: u32) -> u32 {
        let n = self.round_robin.get();
        self.round_robin.set(n.wrapping_add(1));
        let local: Vec<u32> = (0..count)
            .filter(|&q| self.owner_of(topic, q) == self.id)
            .collect();
        if local.is_empty() {
            n % count
        } else {
            local[n as usize % local.len()]
        }
    }

    fn append_all(
        &self,
        topic: &str,
        queue_id: u32,
        items: &[(i32, Vec<u8>, Vec<u8>, i64)],
        peer: SocketAddr,
    ) -> Result<Vec<PutResult>, ErrorBody> {
        let mut puts = Vec::with_capacity(items.len());
        for (flag, props, body, born) in items {
            let draft = RecordDraft {
                topic,
                queue_id,
                flag: *flag,
                sys_flag: 0,
                born_timestamp_ms: *born,
                born_host: peer,
                reconsume_times: 0,
                transaction_offset: 0,
                properties: props,
                body,
            };
            puts.push(self.store.append(&draft).map_err(store_error)?);
        }
        Ok(puts)
    }

    async fn finish_send(
        &self,
        request_id: u64,
        topic: &str,
        queue_id: u32,
        puts: Vec<PutResult>,
        wait_durable: bool,
        batch: bool,
    ) -> Vec<u8> {
        let Some(last) = puts.last() else {
            return error_frame(
                request_id,
                &err(ErrorCode::InvalidMessage, "nothing to send"),
            );
        };
        let acked = if wait_durable {
            self.store.durable(last.end()).await
        } else {
            self.store.acked(last.end()).await
        };
        if let Err(e) = acked {
            return error_frame(request_id, &store_error(e));
        }
        self.wake_pollers(topic, queue_id);
        if batch {
            let r = SendBatchResult {
                queue_id,
                first_queue_offset: puts[0].queue_offset,
                count: puts.len() as u32,
                msg_ids: puts
                    .iter()
                    .map(|p| self.msg_id(p.physical_offset))
                    .collect(),
            };
            response_frame(request_id, &Response::SendBatchResult(r))
        } else {
            let r = SendResult {
                msg_id: self.msg_id(last.physical_offset),
                queue_id,
                queue_offset: last.queue_offset,
                physical_offset: last.physical_offset,
            };
            response_frame(request_id, &Response::SendResult(r))
        }
    }

    /// A pull with long polling: answered at once when records (or a definite status) are
    /// there, else held until a message lands in the queue or the wait runs out.
    async fn pull(
        self: Rc<Self>,
        request_id: u64,
        p: crate::protocol::Pull,
    ) -> Result<Vec<u8>, ErrorBody> {
        self.known_queue(&p.topic, p.queue_id)?;
        let max_messages = if p.max_messages == 0 {
            crate::protocol::PULL_BATCH_DEFAULT
        } else {
            p.max_messages.min(PULL_MESSAGES_MAX)
        };
        let deadline =
            Instant::now() + Duration::from_millis(p.max_wait_ms.min(PULL_WAIT_MS_MAX) as u64);
        let max_bytes = self.cfg.frame_limits.records_bytes_max() as usize;
        let notify = self.poll_notify(&p.topic, p.queue_id);
        loop {
            let notified = notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let status = |status, next_offset, min_offset, max_offset| {
                let r = PullResult {
                    status,
                    next_offset,
                    min_offset,
                    max_offset,
                    count: 0,
                };
                Ok(pull_frame(request_id, &r, &[]))
            };
            match self
                .store
                .read_queue(
                    &p.topic,
                    p.queue_id,
                    p.offset,
                    max_messages,
                    max_bytes,
                    &p.tag_hashes,
                )
                .await
            {
                Ok(r) if !r.is_empty() => {
                    let meta = PullResult {
                        status: PullStatus::Found,
                        next_offset: r.next_offset,
                        min_offset: r.min_offset,
                        max_offset: r.max_offset,
                        count: r.len() as u32,
                    };
                    let parts: Vec<&[u8]> = r.records().collect();
                    return Ok(pull_frame(request_id, &meta, &parts));
                }
                Ok(r) if r.next_offset > p.offset => {
                    return status(
                        PullStatus::NoMatchedMessage,
                        r.next_offset,
                        r.min_offset,
                        r.max_offset,
                    );
                }
                Ok(r) => {
                    let now = Instant::now();
                    if now >= deadline || self.stopping.get() {
                        return status(
                            PullStatus::NoNewMessage,
                            r.next_offset,
                            r.min_offset,
                            r.max_offset,
                        );
                    }
                    let wait = crate::io::sleep(deadline - now);
                    futures_lite::future::or(notified, wait).await;
                }
                Err(StoreError::OffsetTooSmall { min, .. }) => {
                    let (_, max) = self.store.queue_range(&p.topic, p.queue_id);
                    return status(PullStatus::OffsetTooSmall, min, min, max);
                }
                Err(StoreError::OffsetTooBig { max, .. }) => {
                    let (min, _) = self.store.queue_range(&p.topic, p.queue_id);
                    return status(PullStatus::OffsetTooBig, max, min, max);
                }
                Err(e) => return Err(store_error(e)),
            }
        }
    }
}

/// Counts a request in flight while it lives.
struct InFlight(Rc<ShardCtx>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .in_flight
            .set(self.0.in_flight.get().saturating_sub(1));
    }
}

/// An answer whose meta part is followed by stored records, copied straight from where
/// the store read them.
fn with_records_frame<M: crate::protocol::Message>(
    request_id: u64,
    meta: &M,
    parts: &[&[u8]],
) -> Vec<u8> {
    let tail: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(128 + tail);
    if let Err(e) = encode_frame_head(request_id, Flags::NONE, meta, tail, &mut out) {
        return error_frame(
            request_id,
            &err(ErrorCode::Internal, format!("encode: {e}")),
        );
    }
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

fn pull_frame(request_id: u64, meta: &PullResult, parts: &[&[u8]]) -> Vec<u8> {
    with_records_frame(request_id, meta, parts)
}

fn records_frame(request_id: u64, parts: &[&[u8]]) -> Vec<u8> {
    with_records_frame(
        request_id,
        &Records {
            count: parts.len() as u32,
        },
        parts,
    )
}

fn reencode_send(
    request_id: u64,
    topic: &str,
    queue_id: u32,
    items: &[(i32, Vec<u8>, Vec<u8>, i64)],
    wait_durable: bool,
    batch: bool,
) -> Vec<u8> {
    let mut out = Vec::new();
    let r = if batch {
        let m = crate::protocol::SendBatch {
            topic: topic.to_owned(),
            queue_id: queue_id as i32,
            messages: items
                .iter()
                .map(
                    |(flag, properties, body, born)| crate::protocol::BatchItem {
                        flag: *flag,
                        properties: properties.clone(),
                        body: body.clone(),
                        born_timestamp_ms: *born,
                    },
                )
                .collect(),
            wait_durable,
        };
        encode_frame(request_id, Flags::NONE, &m, &[], &mut out)
    } else {
        let (flag, properties, body, born) = &items[0];
        let m = crate::protocol::SendMessage {
            topic: topic.to_owned(),
            queue_id: queue_id as i32,
            flag: *flag,
            properties: properties.clone(),
            body: body.clone(),
            born_timestamp_ms: *born,
            wait_durable,
        };
        encode_frame(request_id, Flags::NONE, &m, &[], &mut out)
    };
    if r.is_err() {
        out.clear();
    }
    out
}
