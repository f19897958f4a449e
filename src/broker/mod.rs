//! Broker services of one shard: request handling (decode, route, dispatch to one handler
//! per request kind), the topic table, committed offsets, long polling, consumer groups and
//! the messages shards exchange. Runtime-agnostic: the shard runtime (`src/shard/`) gives it
//! a [`Peers`] to reach other shards and feeds it frames; everything here runs on the shard's
//! own thread.
//!
//! The map: `mesh` (shard-to-shard calls), `topics` (the table and its administration),
//! `produce` (sends), `consume` (pulls, long polling), `forward` (requests passed on to the
//! shard that handles them), `query` (committed offsets, lookups),
//! `group_service` + `groups/` (membership, rebalance, locks), `offsets` (the offsets file).
//! This file keeps [`ShardCtx`], [`ShardCtx::handle_frame`] and the [`Handlers`] table that
//! maps each request kind to its service.
//!
//! Architecture invariant: no sockets and no glommio here; handlers never block the thread
//! (file syncs go through `crate::io::blocking`); nothing is shared with other shards except
//! by messages.

pub mod answer;
mod consume;
mod forward;
mod group_service;
pub mod groups;
mod mesh;
pub mod metrics;
pub mod offsets;
mod produce;
mod query;
mod retry;
pub mod schedule;
mod store_errors;
pub mod topics;
pub mod transaction;
mod turns;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;

use tokio::sync::{oneshot, Notify};

use crate::log::FlushMode;
use crate::protocol::route::owner;
use crate::protocol::*;
use crate::store::MessageStore;
use answer::{within_frame, Answer, AnswerBudgets, HeldRequests};
use forward::Forward;
pub use forward::PollStep;
use group_service::{GroupExtra, CONN_SHARD_SHIFT};
use groups::{GroupState, LockTable};
use mesh::MESH_CALL_TIMEOUT_MS;
use offsets::OffsetStore;
pub(crate) use store_errors::{store_error, unsure_error};
use topics::TopicTable;

pub use consume::{PULL_MESSAGES_MAX, PULL_WAIT_MS_MAX};
pub use mesh::{MeshMsg, MeshReply, MeshRequest, Peers};
pub use produce::{BATCH_MESSAGES_MAX, SEND_BACKLOG_BYTES_MAX_DEFAULT, SEND_WAIT_MAX_MS_DEFAULT};

/// Key lookups a shard runs at once.
const KEY_LOOKUPS_AT_ONCE: usize = 4;

pub type LocalBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Writes a pushed frame to one client connection without waiting; false when it was
/// dropped (the connection holds too many bytes not yet written).
pub type PushFn = Rc<dyn Fn(Vec<u8>) -> bool>;

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
    /// Delay levels and the longest delay.
    pub delay: crate::protocol::delay::DelayRule,
    /// Most messages one shard's schedule holds (retry copies: a quarter more).
    pub schedule_pending_max: usize,
    /// How long a delayed message waits for a missing target before `%UNDELIVERABLE%`.
    pub schedule_park_max_ms: u64,
    /// How often retention runs (the schedule moves held messages forward as often).
    pub retention_check_interval_ms: u64,
    /// Most topics the broker holds.
    pub topics_max: usize,
    /// Most topics sends may create (auto-create).
    pub auto_create_topics_max: usize,
    /// Most groups coordinated, and most groups with offsets kept, per shard.
    pub groups_max: usize,
    /// Most committed offsets (group, topic, queue) kept per shard.
    pub offsets_max: usize,
    /// Most long polls waiting on one shard's queues at a time.
    pub long_polls_max: usize,
    /// Most bytes of parsed SQL92 filters alive on one shard (`consume::LiveFilter`).
    pub sql_filters_bytes_max: usize,
    /// Most bytes of group members (ids, subscriptions, strategies) a coordinator holds.
    pub group_members_bytes_max: usize,
    /// Most queues of all topics together.
    pub queues_max: usize,
    /// A half message this old without an outcome is asked about.
    pub transaction_timeout_ms: u64,
    /// How often an unresolved half message is asked about.
    pub transaction_check_interval_ms: u64,
    /// Checks answered "unknown" before a half message is discarded.
    pub transaction_check_max: u32,
    /// Most unresolved half messages one shard holds.
    pub transaction_pending_max: usize,
    /// Most unresolved half messages of one producer group on one shard.
    pub transaction_group_pending_max: usize,
    /// Flow control: sends are refused with `BrokerBusy` while the oldest acknowledgement
    /// this shard owes has waited longer than this for the disk.
    pub send_wait_max_ms: u64,
    /// Flow control: sends are refused with `BrokerBusy` while more than this many bytes
    /// appended on this shard wait for the disk.
    pub send_backlog_bytes_max: u64,
    /// Testing: the shard asked to create a topic of this name panics (to test what a
    /// shard's death does to the broker).
    pub testing_panic_topic: Option<String>,
    /// Testing: the shards other than 0 mishandle the changes to this topic this way.
    pub testing_topic_change_fault: Option<(String, topics::TopicChangeFault)>,
    /// Testing: a shard whose fence refused a commit waits this long (ms) before it tells
    /// the group's coordinator (as if its `FenceSeen` were overtaken on the way).
    pub testing_fence_tell_delay_ms: u64,
}

/// Everything one shard owns.
pub struct ShardCtx {
    pub id: u32,
    pub shard_count: u32,
    /// This run of the shard: new at every start, never 0 (`PullResult::incarnation`).
    incarnation: u64,
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
    /// Connections whose close this shard heard of as a groups' coordinator, latest last
    /// (at most [`group_service::CLOSED_CONNS_KEPT`]): a heartbeat that waited meanwhile
    /// must not add a member on one.
    closed_conns: RefCell<std::collections::VecDeque<u64>>,
    /// Groups this shard, as their coordinator, is deleting: heartbeats are refused until
    /// every shard has forgotten the group's offsets.
    deleting_groups: RefCell<HashSet<String>>,
    /// Groups this shard, as their coordinator, deleted since, latest last (at most
    /// [`group_service::DELETED_GROUPS_KEPT`]): a shard's word of a fence it forgot in
    /// the deletion, arriving after it, must not make the group's entry again.
    deleted_groups: RefCell<std::collections::VecDeque<String>>,
    /// (group, epoch) of resets being told to their group's coordinator after a refused
    /// commit: one telling each, however many stale commits come meanwhile.
    telling_resets: RefCell<HashSet<(String, u64)>>,
    /// Long polls waiting on this shard's queues (at most `--long-polls-max`).
    long_polls: Cell<usize>,
    /// Bytes of the groups' kept assignments (`group_service::Assigned`).
    assigned_bytes: Rc<Cell<usize>>,
    next_conn: Cell<u64>,
    /// Serializes topic table changes on shard 0.
    topic_changes: tokio::sync::Mutex<()>,
    /// Shard 0: the last topic creation stamp given, or the latest shard's incarnation
    /// at the start, whichever is later (`topics::born`).
    last_stamp: Cell<u64>,
    /// Applies the topic changes shard 0 sends, one at a time in arrival order.
    topic_turns: Rc<turns::Turns>,
    /// Shard 0: (shard, topic) pairs being told a topic change again in the background.
    telling_again: RefCell<HashSet<(u32, String)>>,
    /// Another shard than 0: topics it is asking shard 0 about (`refresh_topic`), each
    /// woken when the answer is in. One ask per topic at a time, however many requests
    /// need it.
    asking: RefCell<HashMap<String, Rc<Notify>>>,
    /// Topics with a send deferred (learning the topic first) and the sends naming their
    /// queues that arrived after it, appended in arrival order (`produce::line`).
    send_lines: Rc<produce::SendLines>,
    /// Testing: changes to the faulted topic told so far.
    testing_changes_seen: Cell<u32>,
    /// Per-peer FIFO of outgoing requests.
    outboxes: RefCell<HashMap<u32, tokio::sync::mpsc::Sender<MeshMsg>>>,
    /// Delayed messages held for this shard's queues.
    schedule: RefCell<schedule::Schedule>,
    /// Wakes the schedule's delivery task (a new message may be due sooner).
    schedule_wake: Notify,
    /// The schedule logs nothing before this time (ms since the epoch): one line a minute.
    schedule_log_after: Cell<u64>,
    /// One schedule snapshot at a time.
    snapshotting: tokio::sync::Mutex<()>,
    /// One offsets write at a time (they must land in order).
    offsets_io: tokio::sync::Mutex<()>,
    /// Bytes of record-carrying answers, per connection and for the shard.
    answers: AnswerBudgets,
    /// Requests held copied while they wait for another shard or for their topic.
    held: Rc<HeldRequests>,
    /// Sends waiting for the disk, oldest first: the log offset their acknowledgement waits
    /// for, when they were appended, and the log's cut count then (flow control,
    /// `produce.rs`).
    waiting_sends: RefCell<std::collections::VecDeque<(u64, std::time::Instant, u64)>>,
    /// Sends refused by flow control since start.
    busy_refusals: Cell<u64>,
    /// Counters for the metrics endpoint (shard-local).
    stats: metrics::ShardStats,
    /// Half messages and outcomes of this shard.
    txn: RefCell<transaction::Transactions>,
    /// Live producers of the groups this shard coordinates.
    producers: RefCell<transaction::ProducerGroups>,
    /// SQL92 filters of pulls, parsed once per expression (bounded: see `consume.rs`).
    sql_filters: RefCell<HashMap<String, Rc<consume::LiveFilter>>>,
    /// Bytes of the parsed filters alive: cached, or held by waiting pulls.
    sql_filters_live: Rc<Cell<usize>>,
    /// Key lookups running at once (each may gather a frame's worth from every shard).
    key_lookups: tokio::sync::Semaphore,
    /// The schedule's moves to another shard in flight (`schedule/deliver.rs`).
    schedule_remote_moves: std::sync::Arc<tokio::sync::Semaphore>,
    /// The largest frame each connection of this shard takes (from its handshake).
    conn_frame_max: RefCell<HashMap<u64, u32>>,
}

pub(crate) fn err(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(code, message)
}

pub(crate) fn error_frame(request_id: u64, e: &ErrorBody) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + e.message.len());
    let code = e.error_code().unwrap_or(ErrorCode::Internal);
    if encode_error(request_id, code, e.message.clone(), &mut out).is_err() {
        out.clear();
    }
    out
}

pub(crate) fn response_frame(request_id: u64, r: &Response<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    match encode_response(r, request_id, &mut out) {
        Ok(_) => out,
        Err(e) => error_frame(
            request_id,
            &err(ErrorCode::Internal, format!("encode: {e}")),
        ),
    }
}

/// Group names are stored (offsets file), hashed to a coordinator and part of the group's
/// retry and dead-letter topic names: keep them to the topic alphabet.
fn validate_group(group: &str) -> Result<(), ErrorBody> {
    crate::protocol::names::check_group_name(group).map_err(|e| err(ErrorCode::InvalidMessage, e))
}

/// What handling a frame gives.
pub enum Handled {
    /// The response frame, ready now.
    Now(Option<Answer>),
    /// The response frame, later (None: a oneway request).
    Later(LocalBoxFuture<'static, Option<Answer>>),
}

impl Handled {
    /// A frame ready now.
    pub fn now(frame: Vec<u8>) -> Handled {
        Handled::Now(Some(Answer::from(frame)))
    }

    /// A frame that comes later (None: nothing to answer).
    pub fn later(f: impl Future<Output = Option<Vec<u8>>> + 'static) -> Handled {
        Handled::Later(Box::pin(async move { f.await.map(Answer::from) }))
    }
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
        schedule: schedule::Schedule,
        peers: Box<dyn Peers>,
    ) -> Rc<ShardCtx> {
        let cfg_lock_expiry_ms = cfg.lock_expiry_ms;
        let cfg_frame_bytes_max = cfg.frame_limits.frame_bytes_max() as usize;
        let incarnation = store.incarnation();
        Rc::new(ShardCtx {
            id,
            shard_count,
            incarnation,
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
            closed_conns: RefCell::new(std::collections::VecDeque::new()),
            deleting_groups: RefCell::new(HashSet::new()),
            deleted_groups: RefCell::new(std::collections::VecDeque::new()),
            telling_resets: RefCell::new(HashSet::new()),
            long_polls: Cell::new(0),
            assigned_bytes: Rc::new(Cell::new(0)),
            next_conn: Cell::new(1),
            topic_changes: tokio::sync::Mutex::new(()),
            last_stamp: Cell::new(0),
            topic_turns: Rc::default(),
            telling_again: RefCell::new(HashSet::new()),
            asking: RefCell::new(HashMap::new()),
            send_lines: Rc::default(),
            testing_changes_seen: Cell::new(0),
            outboxes: RefCell::new(HashMap::new()),
            schedule: RefCell::new(schedule),
            schedule_wake: Notify::new(),
            schedule_log_after: Cell::new(0),
            snapshotting: tokio::sync::Mutex::new(()),
            offsets_io: tokio::sync::Mutex::new(()),
            answers: AnswerBudgets::new(cfg_frame_bytes_max),
            held: HeldRequests::new(cfg_frame_bytes_max),
            sql_filters: RefCell::new(HashMap::new()),
            sql_filters_live: Rc::new(Cell::new(0)),
            txn: RefCell::new(transaction::Transactions::default()),
            waiting_sends: RefCell::new(std::collections::VecDeque::new()),
            busy_refusals: Cell::new(0),
            stats: metrics::ShardStats::default(),
            producers: RefCell::new(transaction::ProducerGroups::default()),
            key_lookups: tokio::sync::Semaphore::new(KEY_LOOKUPS_AT_ONCE),
            schedule_remote_moves: std::sync::Arc::new(tokio::sync::Semaphore::new(
                schedule::REMOTE_MOVES_MAX,
            )),
            conn_frame_max: RefCell::new(HashMap::new()),
        })
    }

    /// Registers a client connection; `push` writes a frame to it without waiting (a full
    /// connection drops the frame: pushed notifications are hints members re-check).
    pub fn register_connection(&self, push: PushFn) -> u64 {
        let n = self.next_conn.get();
        self.next_conn.set(n + 1);
        let id = ((self.id as u64) << CONN_SHARD_SHIFT) | n;
        self.conns.borrow_mut().insert(id, push);
        self.answers.open(id);
        id
    }

    /// `conn` is a connection of this shard (ids carry their shard; 0 is no connection's,
    /// as a forwarded send's).
    pub(crate) fn conn_is_ours(&self, conn: u64) -> bool {
        conn != 0 && conn >> CONN_SHARD_SHIFT == self.id as u64
    }

    /// `conn` has closed (a connection of this shard, or another's whose shard said so):
    /// what is still handled for it needs no answer.
    fn conn_closed(&self, conn: u64) -> bool {
        conn != 0 && self.answers.ended(conn, self.conn_is_ours(conn))
    }

    pub fn set_shard_addrs(&self, addrs: Vec<String>) {
        *self.shard_addrs.borrow_mut() = addrs;
    }

    /// Starts a clean stop: long polls answer at once, new requests are refused.
    pub fn begin_stop(&self) {
        self.stopping.set(true);
        self.stop_notify.notify_waiters();
        self.schedule_wake.notify_one();
        for n in self.polls.borrow().values() {
            n.notify_waiters();
        }
    }

    /// Counts an error answer for the metrics.
    fn count_error(&self, e: &ErrorBody) {
        match e.error_code() {
            Some(code) => self.stats.error(&format!("{code:?}")),
            None => self.stats.error(&e.code.to_string()),
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Requests being handled right now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.get()
    }

    /// Flushes committed offsets: writes what is pending and fdatasyncs (async flush
    /// mode's background sync, and shutdown).
    pub async fn sync_offsets(&self) -> std::io::Result<()> {
        self.flush_offsets(true).await
    }

    /// [`sync_offsets`](Self::sync_offsets) for a request's answer: every offset changed
    /// before the call is durable when it returns `Ok`.
    pub(super) async fn offsets_durable(&self) -> Result<(), ErrorBody> {
        (self.sync_offsets().await)
            .map_err(|e| err(ErrorCode::StoreIo, format!("syncing offsets: {e}")))
    }

    /// Writes the offsets store's pending changes (and, with `sync`, fdatasyncs them) off
    /// the shard's thread, one flush at a time so writes keep their order. A change made
    /// before the call is written (and with `sync` durable) when it returns `Ok`.
    pub(crate) async fn flush_offsets(&self, sync: bool) -> std::io::Result<()> {
        let _one = self.offsets_io.lock().await;
        let job = self.offsets.borrow_mut().take_io();
        if let Some((io, generation)) = job {
            match crate::io::blocking(move || io.run()).await {
                Ok(file) => self.offsets.borrow_mut().written(generation, file),
                Err(e) => {
                    self.offsets.borrow_mut().write_failed();
                    return Err(e);
                }
            }
        }
        if sync && self.offsets.borrow().needs_sync() {
            let (file, generation) = self.offsets.borrow().sync_handle();
            if let Err(e) = crate::io::blocking(move || file.sync_data()).await {
                self.offsets.borrow_mut().sync_failed();
                return Err(e);
            }
            self.offsets.borrow_mut().synced(generation);
        }
        Ok(())
    }

    /// The topology part of a handshake answer.
    fn handshake_ok(&self) -> HandshakeOk {
        HandshakeOk {
            protocol_version: PROTOCOL_VERSION as u32,
            shard_count: self.shard_count,
            shard_id: self.id,
            shard_addrs: self.shard_addrs.borrow().clone(),
            broker_id: self.cfg.broker_id,
        }
    }

    /// The largest frame an answer to `conn` may be: what a forwarding shard says, else
    /// what the connection said in its handshake, within this broker's limit.
    fn answer_frame_max(&self, conn: u64, given: Option<u32>) -> u32 {
        let ours = self.cfg.frame_limits.frame_bytes_max();
        given
            .or_else(|| self.conn_frame_max.borrow().get(&conn).copied())
            .unwrap_or(ours)
            .min(ours)
    }

    fn owner_of(&self, topic: &str, queue_id: u32) -> u32 {
        owner(topic, queue_id, self.shard_count)
    }

    /// Handles one request frame (already delimited; its header checked by the reader):
    /// decode, route (the registry says where each kind goes), then dispatch to its handler
    /// here or forward the frame to the shard that handles it. The synchronous part
    /// (decoding, routing, appending) runs now, in arrival order.
    /// `frame_max`: the largest frame the connection takes, when the request was forwarded
    /// (else it is looked up: a connection says it in its handshake). `poll`: the part of a
    /// pull to run ([`PollStep`]).
    pub fn handle_frame(
        self: &Rc<Self>,
        bytes: &[u8],
        peer: SocketAddr,
        conn: u64,
        frame_max: Option<u32>,
        poll: PollStep,
    ) -> Handled {
        let frame_max = self.answer_frame_max(conn, frame_max);
        let decoder = FrameDecoder::new(self.cfg.frame_limits);
        let frame = match decoder.decode(bytes) {
            Ok(Some(f)) => f,
            Ok(None) => {
                return Handled::now(error_frame(
                    0,
                    &err(ErrorCode::MalformedFrame, "truncated frame"),
                ))
            }
            Err(e) => return Handled::now(error_frame(0, &ErrorBody::from(&e))),
        };
        let request_id = frame.request_id();
        let oneway = frame.header().flags().is_oneway();
        let at = Arrival {
            bytes,
            request_id,
            oneway,
            peer,
            conn,
            frame_max,
        };
        if !self.stopping.get() {
            if let Some(handled) = self.send_in_place(&frame, &at) {
                return handled;
            }
        }
        let req = match frame.decode_request() {
            Ok(r) => r,
            Err(e) => return Handled::now(error_frame(request_id, &ErrorBody::from(&e))),
        };
        let refuse = |e: ErrorBody| {
            Handled::Now((!oneway).then(|| Answer::from(error_frame(request_id, &e))))
        };
        if self.stopping.get() {
            return refuse(err(
                ErrorCode::ShardUnavailable,
                "the broker is shutting down",
            ));
        }
        if let Some(Err(e)) = req.group().map(validate_group) {
            return refuse(e);
        }
        if let Some(Err(e)) = req.client_id().map(crate::protocol::names::check_client_id) {
            return refuse(err(ErrorCode::InvalidMessage, e));
        }
        let group_on_conn = match &req {
            Request::GroupHeartbeat(h) => Some(&h.group),
            Request::ProducerHeartbeat(h) => Some(&h.group),
            _ => None,
        };
        if let Some(group) = group_on_conn {
            // Only the shard that carries the connection hears of its close.
            if self.conn_is_ours(conn) {
                if let Err(e) = self.note_group_connection(group, conn) {
                    return refuse(e);
                }
            }
        }
        if let Some(to) = req.route().shard(self.shard_count) {
            if to != self.id {
                // A forwarded long poll may be held for its whole wait; an answer with
                // records is reserved for here first.
                let timeout_ms = match &req {
                    Request::Pull(p) => {
                        MESH_CALL_TIMEOUT_MS.max(p.max_wait_ms.min(PULL_WAIT_MS_MAX) as u64 + 5_000)
                    }
                    _ => MESH_CALL_TIMEOUT_MS,
                };
                let kind = match req {
                    Request::Pull(_) => Forward::LongPoll,
                    Request::MessageById(_) | Request::MessagesByKey(_) => Forward::Records,
                    // Answers without records that can be large.
                    Request::GroupMembers(_) | Request::QueryAssignment(_) => Forward::Records,
                    _ => Forward::Plain,
                };
                return self.forward(to, &at, timeout_ms, kind);
            }
        }
        // A forwarded pull's second step is the same request: counted once, at its wait.
        let counted = poll != PollStep::Read;
        self.run_request(req.kind(), oneway, counted, || {
            req.dispatch(&Req {
                ctx: self,
                request_id,
                peer,
                conn,
                frame_max,
                poll,
            })
        })
    }

    /// Handles a request of this shard: counted (unless not `counted`), and in flight
    /// until it is answered.
    fn run_request(
        self: &Rc<Self>,
        kind: crate::protocol::Kind,
        oneway: bool,
        counted: bool,
        handle: impl FnOnce() -> Handled,
    ) -> Handled {
        if counted {
            self.stats.request(kind.name());
        }
        self.in_flight.set(self.in_flight.get() + 1);
        let guard = InFlight(self.clone());
        let handled = handle();
        let finish = move |f: Option<Answer>| {
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
}

/// A request frame as it arrived, and where from.
pub(super) struct Arrival<'a> {
    pub bytes: &'a [u8],
    pub request_id: u64,
    pub oneway: bool,
    pub peer: SocketAddr,
    pub conn: u64,
    pub frame_max: u32,
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

/// The most bytes a topic's description or a group's progress in a topic takes as a frame:
/// 32 bytes per queue at most (`QueueProgress`), the names, the frame's header.
const TOPIC_ANSWER_BYTES_MAX: usize = topics::QUEUES_PER_TOPIC_MAX as usize * 32 + 4096;

/// One request being handled on its shard: the shard and what the frame said besides the
/// request itself.
struct Req<'a> {
    ctx: &'a Rc<ShardCtx>,
    request_id: u64,
    peer: SocketAddr,
    conn: u64,
    /// The largest frame the connection takes.
    frame_max: u32,
    poll: PollStep,
}

impl Req<'_> {
    /// The most record bytes one answer to this connection may carry.
    fn records_max(&self) -> usize {
        FrameLimits::new(self.frame_max)
            .unwrap_or(self.ctx.cfg.frame_limits)
            .records_bytes_max() as usize
    }
}

impl Req<'_> {
    /// An answer ready now.
    fn now<'r, R: Into<Response<'r>>>(&self, r: Result<R, ErrorBody>) -> Handled {
        let frame = r.and_then(|r| within_frame(self.request_id, &r.into(), self.frame_max));
        Handled::now(frame.unwrap_or_else(|e| {
            self.ctx.count_error(&e);
            error_frame(self.request_id, &e)
        }))
    }

    /// `answer` now when this shard's table lists the queue, else once shard 0 was asked
    /// about the topic ([`ShardCtx::learn_queue`]).
    fn on_known_queue<R: Into<Response<'static>>>(
        &self,
        topic: String,
        queue_id: u32,
        answer: impl FnOnce(&ShardCtx) -> Result<R, ErrorBody> + 'static,
    ) -> Handled {
        if self.ctx.known_queue(&topic, queue_id).is_ok() {
            return self.now(answer(self.ctx));
        }
        let ctx = self.ctx.clone();
        self.later(async move {
            ctx.learn_queue(&topic, queue_id).await?;
            answer(&ctx)
        })
    }

    /// An answer that needs waiting for.
    fn later<R: Into<Response<'static>>>(
        &self,
        f: impl Future<Output = Result<R, ErrorBody>> + 'static,
    ) -> Handled {
        let (request_id, frame_max) = (self.request_id, self.frame_max);
        self.later_frame(async move {
            let r = f.await?;
            within_frame(request_id, &r.into(), frame_max).map(Answer::from)
        })
    }

    /// An answer without records that can be large (a topic's description or a group's
    /// progress: up to 33 KB; the transactions listed: hundreds of KB) and needs waiting
    /// for: room for `bound` bytes (at most the largest frame) is reserved first, as for
    /// records, and given back down to the frame built. Before, every such request a
    /// connection had in flight (up to 1,024) was built and queued at once, outside every
    /// budget: 1,024 transaction listings of 1,000 halves held about 360 MB for one
    /// connection that did not read.
    fn later_large<R: Into<Response<'static>>>(
        &self,
        bound: usize,
        f: impl Future<Output = Result<R, ErrorBody>> + 'static,
    ) -> Handled {
        let (request_id, frame_max, conn) = (self.request_id, self.frame_max, self.conn);
        let ctx = self.ctx.clone();
        let bound = bound.min(frame_max as usize);
        self.later_frame(async move {
            let mut hold = ctx.reserve_answer(conn, bound).await?;
            let r = f.await?;
            let frame = within_frame(request_id, &r.into(), frame_max)?;
            if frame.len() > bound {
                // Past the bound (not expected): the rest is held too if both budgets have
                // room for all of it; else the answer goes out held at the bound.
                ctx.answers.try_grow(&mut hold, conn, frame.len() - bound);
            }
            hold.shrink_to(frame.len());
            Ok(Answer::held(frame, hold))
        })
    }

    /// An answer, built as a frame by the handler (record-carrying answers, with their
    /// reservation), that needs waiting for.
    fn later_frame(&self, f: impl Future<Output = Result<Answer, ErrorBody>> + 'static) -> Handled {
        let (request_id, conn) = (self.request_id, self.conn);
        let ctx = self.ctx.clone();
        Handled::Later(Box::pin(async move {
            Some(match f.await {
                Ok(answer) => answer,
                // Ended by its connection's close (a long poll): nobody to answer, and no
                // error of the broker's.
                Err(_) if ctx.conn_closed(conn) => return None,
                Err(e) => {
                    ctx.count_error(&e);
                    Answer::from(error_frame(request_id, &e))
                }
            })
        }))
    }
}

/// The handler of every request kind: each one names the service that does the work.
impl Handlers for Req<'_> {
    type Out = Handled;

    fn handshake(&self, h: Handshake) -> Handled {
        if h.protocol_version != PROTOCOL_VERSION as u32 {
            return self.now::<Empty>(Err(err(
                ErrorCode::UnsupportedVersion,
                format!(
                    "protocol version {} is not supported (broker speaks {PROTOCOL_VERSION})",
                    h.protocol_version
                ),
            )));
        }
        self.now(Ok(self.ctx.handshake_ok()))
    }

    fn handshake2(&self, h: Handshake2) -> Handled {
        if h.protocol_version != PROTOCOL_VERSION as u32 {
            return self.handshake(Handshake::new(h.client_id));
        }
        // Answers to this connection stay within the smaller of both frame limits.
        if self.ctx.conn_is_ours(self.conn) {
            let ours = self.ctx.cfg.frame_limits.frame_bytes_max();
            let theirs = h.frame_bytes_max.clamp(FRAME_BYTES_MIN, ours);
            self.ctx
                .conn_frame_max
                .borrow_mut()
                .insert(self.conn, theirs);
        }
        self.now(Ok(HandshakeOk2 {
            ok: self.ctx.handshake_ok(),
            limits: BrokerLimits {
                frame_bytes_max: self.ctx.cfg.frame_limits.frame_bytes_max(),
                session_timeout_ms: self.ctx.cfg.session_timeout_ms,
                lock_expiry_ms: self.ctx.cfg.lock_expiry_ms,
            },
        }))
    }

    fn heartbeat(&self, _: Heartbeat) -> Handled {
        self.now(Ok(Empty {}))
    }

    fn send_message(&self, m: SendMessage) -> Handled {
        self.ctx.send_message(self.request_id, m, self.peer)
    }

    fn send_batch(&self, m: SendBatch) -> Handled {
        self.ctx.send_batch(self.request_id, m, self.peer)
    }

    fn send_multi(&self, m: SendMulti) -> Handled {
        self.ctx.send_multi(self.request_id, m, self.peer)
    }

    fn pull(&self, m: Pull) -> Handled {
        self.later_frame(self.ctx.clone().pull(
            self.request_id,
            self.conn,
            self.records_max(),
            self.poll,
            m,
        ))
    }

    fn get_min_offset(&self, m: GetMinOffset) -> Handled {
        self.on_known_queue(m.topic.clone(), m.queue_id, move |ctx| {
            ctx.queue_bound(&m.topic, m.queue_id, |min, _| min)
        })
    }

    fn get_max_offset(&self, m: GetMaxOffset) -> Handled {
        self.on_known_queue(m.topic.clone(), m.queue_id, move |ctx| {
            ctx.queue_bound(&m.topic, m.queue_id, |_, max| max)
        })
    }

    fn search_offset_by_timestamp(&self, m: SearchOffsetByTimestamp) -> Handled {
        self.later(self.ctx.clone().offset_by_time(m))
    }

    fn commit_offset(&self, m: CommitOffset) -> Handled {
        self.later(self.ctx.clone().commit_offset(m))
    }

    fn query_offset(&self, m: QueryOffset) -> Handled {
        let unsynced =
            (self.ctx.offsets.borrow()).is_unsynced_first(&m.group, &m.topic, m.queue_id);
        if unsynced {
            let ctx = self.ctx.clone();
            return self.later(async move {
                while (ctx.offsets.borrow()).is_unsynced_first(&m.group, &m.topic, m.queue_id) {
                    ctx.offsets_durable().await?;
                }
                ctx.query_offset(&m)
            });
        }
        self.on_known_queue(m.topic.clone(), m.queue_id, move |ctx| ctx.query_offset(&m))
    }

    fn create_topic(&self, m: CreateTopic) -> Handled {
        self.later(self.ctx.clone().create_topic(m))
    }

    fn update_topic(&self, m: UpdateTopic) -> Handled {
        self.later(self.ctx.clone().update_topic(m))
    }

    fn delete_topic(&self, m: DeleteTopic) -> Handled {
        self.later(self.ctx.clone().delete_topic(m))
    }

    fn list_topics(&self, _: ListTopics) -> Handled {
        let topics = self.ctx.topics.borrow().names();
        self.now(Ok(TopicList { topics }))
    }

    fn describe_topic(&self, m: DescribeTopic) -> Handled {
        self.later_large(
            TOPIC_ANSWER_BYTES_MAX,
            self.ctx.clone().describe_topic(m.topic, m.create),
        )
    }

    fn message_by_id(&self, m: MessageById) -> Handled {
        self.later_frame(
            self.ctx
                .clone()
                .message_by_id(self.request_id, self.conn, m),
        )
    }

    fn messages_by_key(&self, m: MessagesByKey) -> Handled {
        self.later_frame(self.ctx.clone().messages_by_key(
            self.request_id,
            self.conn,
            self.peer,
            self.records_max(),
            m,
        ))
    }

    fn group_heartbeat(&self, m: GroupHeartbeat) -> Handled {
        self.later(self.ctx.group_heartbeat(m, self.conn))
    }

    fn unregister(&self, m: Unregister) -> Handled {
        self.later(self.ctx.unregister(m, self.conn))
    }

    fn query_assignment(&self, m: QueryAssignment) -> Handled {
        self.now(self.ctx.query_assignment(&m))
    }

    fn group_members(&self, m: GroupMembers) -> Handled {
        self.now(self.ctx.group_members(&m))
    }

    fn reset_offset(&self, m: ResetOffset) -> Handled {
        self.later(self.ctx.reset_offset(m))
    }

    fn consumer_progress(&self, m: ConsumerProgress) -> Handled {
        self.later_large(TOPIC_ANSWER_BYTES_MAX, self.ctx.consumer_progress(m))
    }

    fn delete_group(&self, m: DeleteGroup) -> Handled {
        self.later(self.ctx.clone().delete_group(m))
    }

    fn lock_batch(&self, m: LockBatch) -> Handled {
        self.later(self.ctx.lock_batch(m, self.conn))
    }

    fn unlock_batch(&self, m: UnlockBatch) -> Handled {
        self.later(self.ctx.unlock_batch(m, self.conn))
    }

    fn consumer_send_back(&self, m: ConsumerSendBack) -> Handled {
        self.later(self.ctx.clone().send_back(m, self.peer))
    }

    fn schedule_stats(&self, _: ScheduleStats) -> Handled {
        self.later(self.ctx.clone().schedule_stats())
    }

    fn producer_heartbeat(&self, m: ProducerHeartbeat) -> Handled {
        self.now(self.ctx.producer_heartbeat(m, self.conn))
    }

    fn end_transaction(&self, m: EndTransaction) -> Handled {
        self.later(self.ctx.clone().end_transaction(m))
    }

    fn list_transactions(&self, _: ListTransactions) -> Handled {
        self.later_large(usize::MAX, self.ctx.clone().list_transactions())
    }
}
