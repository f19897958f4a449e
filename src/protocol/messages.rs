//! Request and response types, and the [`Request`] / [`Response`] enums a server dispatches
//! on and a client matches on.
//!
//! Every type here is the rkyv meta part of frames of one [`Kind`]. Two responses,
//! [`PullResult`] and [`Records`], are followed in the payload by a raw tail: stored records,
//! byte for byte as the log holds them, which the client reads in place with
//! [`RecordIter`].
//!
//! Compatibility: kind numbers are never reused (see `kind`), and enum variants (e.g.
//! [`PullStatus`]) are only ever appended, with explicit discriminants. A type's layout
//! changes only with a new [`PROTOCOL_VERSION`], which every frame carries: a peer of
//! another version is refused at its first frame (`UnsupportedVersion`), never misread.

use super::error::{ErrorCode, ProtocolError};
use super::frame::{encode_frame, Flags, Frame, FrameHeader, META_ALIGN, PROTOCOL_VERSION};
use super::record::RecordIter;
pub use super::registry::{encode_response, Handlers, Request, Response};

/// Messages a pull asks for when the consumer does not say.
pub const PULL_BATCH_DEFAULT: u32 = 32;
/// How long the broker holds a pull that finds nothing (long polling), by default.
pub const PULL_WAIT_MS_DEFAULT: u32 = 15_000;
/// `queue_id` of a send that lets the broker choose the queue.
pub const QUEUE_ID_ANY: i32 = -1;
/// [`SendResult::queue_offset`] of a message held in the broker's schedule: it gets its
/// queue offset when it is delivered.
pub const QUEUE_OFFSET_SCHEDULED: u64 = u64::MAX;

/// Derives shared by every wire type. `PartialEq` is for tests and for clients comparing
/// answers; nothing on the data path compares messages.
macro_rules! wire_type {
    ($(#[$meta:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
        pub struct $name { $($body)* }
    };
}

// ---- Session ----

wire_type! {
    /// First request on a connection.
    pub struct Handshake {
        /// The client's [`PROTOCOL_VERSION`].
        pub protocol_version: u32,
        pub client_id: String,
    }
}

wire_type! {
    /// Answer to [`Handshake`]: how to reach every shard directly.
    pub struct HandshakeOk {
        pub protocol_version: u32,
        pub shard_count: u32,
        /// The shard that answered.
        pub shard_id: u32,
        /// `host:port` of each shard; index = shard id.
        pub shard_addrs: Vec<String>,
        pub broker_id: u32,
    }
}

wire_type! {
    /// First request on a connection, telling the broker the client's frame limit (answers
    /// to this connection stay within it). Answered by [`HandshakeOk2`].
    pub struct Handshake2 {
        /// The client's [`PROTOCOL_VERSION`].
        pub protocol_version: u32,
        pub client_id: String,
        /// The largest frame the client accepts.
        pub frame_bytes_max: u32,
    }
}

/// The least session timeout a broker takes (`--session-timeout-ms`), and so announces in
/// [`BrokerLimits`].
pub const SESSION_TIMEOUT_MS_MIN: u64 = 1_000;

wire_type! {
    /// The limits and timings a client must know to behave.
    pub struct BrokerLimits {
        /// The largest frame the broker accepts (and sends).
        pub frame_bytes_max: u32,
        /// A group member that sends no heartbeat for this long leaves its group.
        pub session_timeout_ms: u64,
        /// A queue lock not renewed for this long is free.
        pub lock_expiry_ms: u64,
    }
}

wire_type! {
    /// Answer to [`Handshake2`]: the topology and the broker's limits.
    pub struct HandshakeOk2 {
        pub ok: HandshakeOk,
        pub limits: BrokerLimits,
    }
}

wire_type! {
    /// Keeps the client's session (and group memberships) alive. Answered by [`Empty`].
    pub struct Heartbeat {
        pub client_id: String,
    }
}

// ---- Produce ----

wire_type! {
    /// Stores one message. Answered by [`SendResult`].
    pub struct SendMessage {
        pub topic: String,
        /// [`QUEUE_ID_ANY`] lets the broker choose.
        pub queue_id: i32,
        pub flag: i32,
        /// Property block as built by `crate::protocol::record::PropertiesBuilder`.
        pub properties: Vec<u8>,
        pub body: Vec<u8>,
        pub born_timestamp_ms: i64,
        /// Answer only once the message is durable (sync flush for this message).
        pub wait_durable: bool,
    }
}

wire_type! {
    /// Where a sent message was stored.
    pub struct SendResult {
        pub msg_id: String,
        pub queue_id: u32,
        /// [`QUEUE_OFFSET_SCHEDULED`] for a delayed message, [`QUEUE_OFFSET_HALF`] for a
        /// transaction's half message.
        pub queue_offset: u64,
        pub physical_offset: u64,
        /// For a half message: the id of its transaction (what [`EndTransaction`] names);
        /// 0 otherwise.
        pub transaction_id: u64,
    }
}

/// [`SendResult::queue_offset`] of a half message: it is in no queue until committed.
pub const QUEUE_OFFSET_HALF: u64 = u64::MAX - 1;

// ---- Transactions ----

wire_type! {
    /// A producer of `group` is alive on this connection: the broker may ask it about the
    /// group's transactions ([`CheckTransaction`]). Dropped when the connection closes.
    pub struct ProducerHeartbeat {
        pub group: String,
        pub client_id: String,
    }
}

/// [`EndTransaction::outcome`]: make the message visible.
pub const TRANSACTION_COMMIT: u8 = 1;
/// [`EndTransaction::outcome`]: discard the message.
pub const TRANSACTION_ROLLBACK: u8 = 2;
/// [`EndTransaction::outcome`]: not decided yet; the broker asks again later.
pub const TRANSACTION_UNKNOWN: u8 = 0;

wire_type! {
    /// The outcome of a transaction, sent by its producer after the local transaction or
    /// in answer to a [`CheckTransaction`]. Routed to the queue the message is bound for
    /// (its owner holds the half message).
    pub struct EndTransaction {
        pub topic: String,
        pub queue_id: u32,
        pub transaction_id: u64,
        pub producer_group: String,
        /// [`TRANSACTION_COMMIT`], [`TRANSACTION_ROLLBACK`] or [`TRANSACTION_UNKNOWN`].
        pub outcome: u8,
        /// Sent in answer to a check.
        pub from_check: bool,
    }
}

wire_type! {
    /// Lists the half messages without an outcome, on every shard.
    pub struct ListTransactions {}
}

wire_type! {
    /// One unresolved half message.
    pub struct HalfMessageInfo {
        pub shard: u32,
        pub transaction_id: u64,
        pub topic: String,
        pub queue_id: u32,
        pub producer_group: String,
        pub msg_id: String,
        pub age_ms: u64,
        /// Checks its producers answered "unknown" (what `--transaction-check-max` counts).
        pub checks: u32,
    }
}

wire_type! {
    /// Answer to [`ListTransactions`].
    pub struct TransactionList {
        /// The oldest unresolved half messages, at most 1,000 (of `unresolved`).
        pub halves: Vec<HalfMessageInfo>,
        /// Every unresolved half message, listed or not.
        pub unresolved: u64,
        /// Half messages discarded after their last check, since each shard started
        /// (kept in the `%SYS_TXN_DISCARDED%` topic).
        pub discarded: u64,
        /// The latest of those (up to 100 per shard); `msg_id` is the kept copy's id.
        pub recently_discarded: Vec<HalfMessageInfo>,
    }
}

wire_type! {
    /// One message of a [`SendBatch`].
    pub struct BatchItem {
        pub flag: i32,
        pub properties: Vec<u8>,
        /// Archived as a `Vec<u8>`; a client's encoder writes it from the caller's buffer,
        /// without copying it into the frame ([`FrameParts`](super::FrameParts)).
        #[rkyv(with = super::frame::SharedBytes)]
        pub body: bytes::Bytes,
        pub born_timestamp_ms: i64,
    }
}

wire_type! {
    /// Stores many messages of one topic in one queue, in order. Answered by
    /// [`SendBatchResult`].
    pub struct SendBatch {
        pub topic: String,
        /// [`QUEUE_ID_ANY`] lets the broker choose.
        pub queue_id: i32,
        pub messages: Vec<BatchItem>,
        pub wait_durable: bool,
    }
}

wire_type! {
    /// Single sends to several queues of one topic, packed together by a producer
    /// (`ProducerOptions::coalesce`): message `i` goes to queue `queue_ids[i]`. Every queue
    /// belongs to one shard (the one the request goes to); each queue's messages are stored
    /// in the order they come. All or nothing, as a batch. Delayed and transactional
    /// messages are refused (sent alone). Answered by [`SendMultiResult`].
    pub struct SendMulti {
        pub topic: String,
        pub queue_ids: Vec<u32>,
        pub messages: Vec<BatchItem>,
        pub wait_durable: bool,
    }
}

wire_type! {
    /// Where each message of a [`SendMulti`] was stored, in the request's order.
    pub struct SendMultiResult {
        /// The broker and the store (shard) that hold the messages: with a message's
        /// physical offset, its message id ([`SendMultiResult::msg_id`]).
        pub broker_id: u32,
        pub store_id: u32,
        pub queue_offsets: Vec<u64>,
        pub physical_offsets: Vec<u64>,
    }
}

impl SendMultiResult {
    /// The message id of the `i`-th message.
    pub fn msg_id(&self, i: usize) -> Option<String> {
        nth_msg_id(self.broker_id, self.store_id, &self.physical_offsets, i)
    }
}

/// The id of the message stored `i`-th of `physical_offsets` by `store_id` of `broker_id`.
fn nth_msg_id(broker_id: u32, store_id: u32, physical_offsets: &[u64], i: usize) -> Option<String> {
    physical_offsets.get(i).map(|&physical_offset| {
        // Not `to_string`: that formats the encoded string into a second one.
        super::MessageId {
            broker_id,
            store_id,
            physical_offset,
        }
        .encode()
    })
}

wire_type! {
    /// Where a batch was stored: consecutive queue offsets from `first_queue_offset`.
    pub struct SendBatchResult {
        pub queue_id: u32,
        pub first_queue_offset: u64,
        pub count: u32,
        /// The broker and the store (shard) that hold the messages: with a message's
        /// physical offset, its message id ([`SendBatchResult::msg_id`]).
        pub broker_id: u32,
        pub store_id: u32,
        /// Where each message was stored in the log, in order (ids are made from these on
        /// demand, not sent as strings).
        pub physical_offsets: Vec<u64>,
    }
}

impl SendBatchResult {
    /// The message id of the `i`-th message of the batch.
    pub fn msg_id(&self, i: usize) -> Option<String> {
        nth_msg_id(self.broker_id, self.store_id, &self.physical_offsets, i)
    }

    /// The message ids of the batch, in order.
    pub fn msg_ids(&self) -> Vec<String> {
        (0..self.physical_offsets.len())
            .filter_map(|i| self.msg_id(i))
            .collect()
    }
}

// ---- Consume ----

wire_type! {
    /// Reads messages of one queue from `offset`; held up to `max_wait_ms` when there are
    /// none yet (long polling). Answered by [`PullResult`] and the records as a raw tail.
    pub struct Pull {
        pub topic: String,
        pub queue_id: u32,
        pub offset: u64,
        pub max_messages: u32,
        pub max_wait_ms: u32,
        /// Tag hashes to keep; empty keeps every message.
        pub tag_hashes: Vec<u64>,
        /// An SQL92 filter over the messages' properties (`protocol::sql`); empty for none.
        /// The broker evaluates it on the records it reads: a pull whose whole window is
        /// filtered out answers `NoMatchedMessage` with the offset past the window.
        pub sql: String,
        /// The [`PullResult::incarnation`] of the last answer about this queue the puller
        /// read (0: none). From an earlier incarnation, a position past where the queue
        /// ended when the broker started is answered `OffsetTooBig` with that end: a crash
        /// lost the records the puller read there, and the offsets hold other messages now.
        pub incarnation: u64,
    }
}

impl Pull {
    /// A pull of all tags with the default batch and wait.
    pub fn new(topic: impl Into<String>, queue_id: u32, offset: u64) -> Pull {
        Pull {
            topic: topic.into(),
            queue_id,
            offset,
            max_messages: PULL_BATCH_DEFAULT,
            max_wait_ms: PULL_WAIT_MS_DEFAULT,
            tag_hashes: Vec::new(),
            sql: String::new(),
            incarnation: 0,
        }
    }
}

/// Outcome of a pull. Variants are only ever appended (the discriminant is the wire value).
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash,
)]
#[repr(u8)]
pub enum PullStatus {
    /// Records follow; `next_offset` is the one after the last record scanned.
    Found = 0,
    /// The offset is the queue's end and nothing arrived before the wait ran out.
    NoNewMessage = 1,
    /// Messages were scanned but none matched the tag filter; continue from `next_offset`.
    NoMatchedMessage = 2,
    /// The offset is below the queue's first kept message (retention); `next_offset` is it.
    OffsetTooSmall = 3,
    /// The offset is past the queue's end; `next_offset` is the end, or the queue's start
    /// (0) for a position named by the answering run in a queue retention has not
    /// touched (it came from another queue of that name: a topic deleted and created
    /// again), or, for a position read under an earlier run, where the queue ended when a
    /// later run started.
    OffsetTooBig = 4,
}

wire_type! {
    /// Answer to [`Pull`]; `count` records follow as the frame's raw tail.
    pub struct PullResult {
        pub status: PullStatus,
        /// Where the next pull of this queue starts.
        pub next_offset: u64,
        pub min_offset: u64,
        /// One past the last message of the queue.
        pub max_offset: u64,
        pub count: u32,
        /// The run of the queue's shard that answered (new at every start; never 0): see
        /// [`Pull::incarnation`].
        pub incarnation: u64,
    }
}

wire_type! {
    /// The first queue offset still kept. Answered by [`Offset`].
    pub struct GetMinOffset {
        pub topic: String,
        pub queue_id: u32,
    }
}

wire_type! {
    /// One past the last queue offset. Answered by [`Offset`].
    pub struct GetMaxOffset {
        pub topic: String,
        pub queue_id: u32,
    }
}

wire_type! {
    /// The first queue offset stored at or after `timestamp_ms`. Answered by [`Offset`].
    pub struct SearchOffsetByTimestamp {
        pub topic: String,
        pub queue_id: u32,
        pub timestamp_ms: i64,
    }
}

wire_type! {
    /// A queue offset.
    pub struct Offset {
        pub offset: u64,
        /// The run of the queue's shard the offset was read under, as
        /// [`PullResult::incarnation`]: a caller that starts pulling (or commits) from the
        /// offset names it, so that a crash in between that lost records below it sends
        /// it back to where the queue then ended rather than past what was stored there
        /// since.
        pub incarnation: u64,
    }
}

// ---- Committed offsets ----

wire_type! {
    /// Stores a consumer group's progress in a queue. Answered by [`Empty`].
    pub struct CommitOffset {
        pub group: String,
        pub topic: String,
        pub queue_id: u32,
        pub offset: u64,
        /// As [`Pull::incarnation`]: the broker run the committer's position comes from (0:
        /// unknown). From an earlier run, an offset past the queue's end at this run's start
        /// is stored as that end (what the committer read past it, a crash lost).
        pub incarnation: u64,
        /// A group member's commit: the group's offsets epoch ([`Assignment::offsets_epoch`])
        /// its position was read under. Refused with [`ErrorCode::OffsetsReset`] when the
        /// group's offsets of the topic were reset on the queue's shard at a later epoch:
        /// the position predates the reset and would undo it. `None` (an admin's commit):
        /// not checked.
        pub offsets_epoch: Option<u64>,
        /// Stored only if the group has no offset of the queue yet: a member's start taken
        /// from its `consume_from`. The first member to start a queue sets where the group
        /// starts, and one that read another start meanwhile reads that one back.
        pub if_absent: bool,
    }
}

wire_type! {
    /// Reads a consumer group's progress. Answered by [`Offset`], or by the error
    /// [`ErrorCode::OffsetNotFound`] when the group never committed one.
    pub struct QueryOffset {
        pub group: String,
        pub topic: String,
        pub queue_id: u32,
    }
}

// ---- Topic admin ----

wire_type! {
    /// Answered by [`Empty`].
    pub struct CreateTopic {
        pub topic: String,
        pub queue_count: u32,
    }
}

wire_type! {
    /// Changes the queue count. Answered by [`Empty`].
    pub struct UpdateTopic {
        pub topic: String,
        pub queue_count: u32,
    }
}

wire_type! {
    /// Answered by [`Empty`].
    pub struct DeleteTopic {
        pub topic: String,
    }
}

wire_type! {
    /// Answered by [`TopicList`].
    pub struct ListTopics {}
}

wire_type! {
    pub struct TopicList {
        pub topics: Vec<String>,
    }
}

wire_type! {
    /// Answered by [`TopicInfo`].
    pub struct DescribeTopic {
        pub topic: String,
        /// Create the topic first when it does not exist and the broker creates topics on
        /// first use (as a send to it would; refused as not found otherwise): a producer
        /// choosing a queue by key or selector needs the queue count before its first send.
        pub create: bool,
    }
}

wire_type! {
    pub struct QueueInfo {
        pub queue_id: u32,
        pub min_offset: u64,
        /// One past the last message.
        pub max_offset: u64,
    }
}

wire_type! {
    pub struct TopicInfo {
        pub topic: String,
        pub queues: Vec<QueueInfo>,
    }
}

// ---- Message queries ----

wire_type! {
    /// Answered by [`Records`] with the one record (or the error a bad id deserves).
    pub struct MessageById {
        pub msg_id: String,
    }
}

wire_type! {
    /// Messages of `topic` whose KEYS hold `key`, stored in `[begin_ms, end_ms]`. Answered by
    /// [`Records`].
    pub struct MessagesByKey {
        pub topic: String,
        pub key: String,
        pub begin_ms: i64,
        pub end_ms: i64,
        pub max_messages: u32,
    }
}

wire_type! {
    /// Answer to a message query; `count` records follow as the frame's raw tail.
    pub struct Records {
        pub count: u32,
    }
}

// ---- Generic answers ----

wire_type! {
    /// Success without data.
    pub struct Empty {}
}

wire_type! {
    /// An error answer (sent with the error flag). `code` is an [`ErrorCode`] number; it is
    /// kept raw so a client can carry a code from a newer broker.
    pub struct ErrorBody {
        pub code: u16,
        pub message: String,
    }
}

// ---- Consumer groups: `groups.rs` ----

mod groups;
pub use groups::*;

// ---- Queue locks ----

wire_type! {
    /// Locks (or renews) queues of a topic for an orderly member. Answered by [`Locked`]
    /// with the queues the member now holds.
    pub struct LockBatch {
        pub group: String,
        pub client_id: String,
        pub topic: String,
        pub queues: Vec<u32>,
    }
}

wire_type! {
    pub struct Locked {
        pub queues: Vec<u32>,
    }
}

wire_type! {
    /// Gives up queue locks. Answered by [`Empty`].
    pub struct UnlockBatch {
        pub group: String,
        pub client_id: String,
        pub topic: String,
        pub queues: Vec<u32>,
    }
}

// ---- Retried and delayed messages ----

wire_type! {
    /// A consumer's failed message goes back to the broker: stored on the group's retry
    /// topic with a growing delay, or, after `max_reconsume_times` retries (or when
    /// `delay_level` is negative), on the group's dead-letter topic. Routed to the shard that
    /// stored the message (named in its id). Answered by [`SendBackResult`].
    pub struct ConsumerSendBack {
        pub group: String,
        /// The id of the message as the consumer received it.
        pub msg_id: String,
        /// 0: the broker picks (`3 + reconsume times`, capped at its last level);
        /// negative: straight to the dead-letter topic.
        pub delay_level: i32,
        pub max_reconsume_times: u32,
        /// How many times the consumer itself consumed the message again before sending it
        /// back (orderly consumption retries in place), or 0. The broker counts the larger
        /// of this and the record's own reconsume count, so a dead-letter copy says how
        /// many attempts failed.
        pub reconsumed: u32,
        /// The CRC of the stored record as the consumer received it (its header's), or 0:
        /// the broker refuses the send-back (`OffsetNotFound`) when the record at the id has
        /// another, which happens when a crash lost the message and a later one took its
        /// place in the log.
        pub record_crc: u32,
        /// The record itself as the consumer received it, or empty. Given, the broker makes
        /// the copy from it (its CRC verified, and it must be the record the id and
        /// `record_crc` name) instead of reading the id: what a consumer sends after the
        /// refusal above, so that a message the broker lost still reaches the retry or
        /// dead-letter topic (RocketMQ's client publishes it itself then). The copy's
        /// `ORIGIN_MESSAGE_ID` is the id as sent, which may name another message by then.
        pub record: Vec<u8>,
    }
}

wire_type! {
    /// Where a sent-back message went.
    pub struct SendBackResult {
        /// True: on `%DLQ%<group>`; false: on `%RETRY%<group>`, delayed.
        pub dead_lettered: bool,
        /// The id of the stored copy (on the retry topic, the id it has while it waits).
        pub msg_id: String,
        /// The reconsume count the copy carries.
        pub reconsume_times: u32,
    }
}

wire_type! {
    /// The state of every shard's schedule of delayed messages. Answered by
    /// [`ScheduleInfo`].
    pub struct ScheduleStats {}
}

wire_type! {
    pub struct ShardScheduleInfo {
        pub shard: u32,
        /// Messages waiting in the schedule (not yet due, or due and not yet delivered).
        pub pending: u64,
        /// Of those, being delivered right now.
        pub in_flight: u64,
        /// When the next one is due (ms since the epoch); -1: none.
        pub next_due_ms: i64,
        /// Of the pending ones, those whose time has come.
        pub overdue: u64,
        /// Delivered since the broker started.
        pub delivered_total: u64,
        /// Waiting for their target topic to exist again (retried every few seconds; after
        /// an hour they go to `%UNDELIVERABLE%`).
        pub parked: u64,
        /// Could not be delivered since the broker started: unreadable, or moved to
        /// `%UNDELIVERABLE%`.
        pub undeliverable_total: u64,
    }
}

wire_type! {
    pub struct ScheduleInfo {
        pub shards: Vec<ShardScheduleInfo>,
    }
}

// ---- Pushed notifications ----

wire_type! {
    /// Pushed to a live producer of the group: what became of this transaction? The
    /// producer answers with an [`EndTransaction`] (`from_check`).
    pub struct CheckTransaction {
        pub topic: String,
        pub queue_id: u32,
        pub transaction_id: u64,
        pub producer_group: String,
        /// The half message as stored (a record).
        pub record: Vec<u8>,
    }
}

wire_type! {
    /// Pushed to every member when the group's assignment changes: ask for it again.
    pub struct RebalanceNotify {
        pub group: String,
        pub generation: u64,
    }
}

impl Handshake {
    /// A handshake speaking this side's protocol version.
    pub fn new(client_id: impl Into<String>) -> Handshake {
        Handshake {
            protocol_version: PROTOCOL_VERSION as u32,
            client_id: client_id.into(),
        }
    }
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code: code.as_u16(),
            message: message.into(),
        }
    }
    /// The code, if this side knows it.
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::from_u16(self.code)
    }
    /// Unknown codes are not retried.
    pub fn is_retriable(&self) -> bool {
        self.error_code().is_some_and(ErrorCode::is_retriable)
    }
}

impl From<&ProtocolError> for ErrorBody {
    fn from(e: &ProtocolError) -> ErrorBody {
        ErrorBody::new(e.code(), e.to_string())
    }
}

impl std::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.error_code() {
            Some(code) => write!(f, "{code}: {}", self.message),
            None => write!(f, "error {}: {}", self.code, self.message),
        }
    }
}

/// Room for a message's fixed fields and rkyv's relative pointers and padding.
const ITEM_OVERHEAD_HINT: usize = 64;

pub(super) fn send_message_len_hint(m: &SendMessage) -> usize {
    m.topic.len() + m.properties.len() + m.body.len() + 2 * ITEM_OVERHEAD_HINT
}

/// Without the bodies: the client's encoder keeps them by reference ([`FrameParts`](super::FrameParts)).
pub(super) fn send_batch_len_hint(m: &SendBatch) -> usize {
    let items: usize = m
        .messages
        .iter()
        .map(|i| i.properties.len() + ITEM_OVERHEAD_HINT)
        .sum();
    m.topic.len() + items + ITEM_OVERHEAD_HINT
}

/// Without the bodies, as [`send_batch_len_hint`].
pub(super) fn send_multi_len_hint(m: &SendMulti) -> usize {
    let items: usize = m
        .messages
        .iter()
        .map(|i| i.properties.len() + 4 + ITEM_OVERHEAD_HINT)
        .sum();
    m.topic.len() + items + ITEM_OVERHEAD_HINT
}

/// The queue a [`SendMulti`] is routed by: its first message's (all are on one shard).
pub(super) fn send_multi_queue(m: &SendMulti) -> i32 {
    m.queue_ids
        .first()
        .and_then(|&q| i32::try_from(q).ok())
        .unwrap_or(QUEUE_ID_ANY)
}

// Types that are only ever nested inside a meta part.
const _: () = assert!(std::mem::align_of::<ArchivedBatchItem>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedQueueInfo>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedPullStatus>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedSubscriptionData>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedTopicAssignment>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedMemberAssignment>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedQueueProgress>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedShardScheduleInfo>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedBrokerLimits>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedHandshakeOk>() <= META_ALIGN);

/// A response meta part with stored records after it, read in place from the frame.
#[derive(Debug, Clone, PartialEq)]
pub struct WithRecords<'a, M> {
    meta: M,
    raw_records: &'a [u8],
}

/// Answer to [`Pull`].
pub type PullResponse<'a> = WithRecords<'a, PullResult>;
/// Answer to [`MessageById`] and [`MessagesByKey`].
pub type RecordsResponse<'a> = WithRecords<'a, Records>;

/// A meta part that says how many records its raw tail holds.
pub trait RecordCount {
    fn record_count(&self) -> u32;
}

impl RecordCount for PullResult {
    fn record_count(&self) -> u32 {
        self.count
    }
}

impl RecordCount for Records {
    fn record_count(&self) -> u32 {
        self.count
    }
}

impl<'a, M: RecordCount> WithRecords<'a, M> {
    /// `raw_records`: stored records, concatenated, exactly as the log holds them.
    pub fn new(meta: M, raw_records: &'a [u8]) -> WithRecords<'a, M> {
        WithRecords { meta, raw_records }
    }
    pub fn meta(&self) -> &M {
        &self.meta
    }
    pub fn raw_records(&self) -> &'a [u8] {
        self.raw_records
    }
    /// The records, read in place; each is checked (length, magic, CRC) as it is reached.
    pub fn records(&self) -> RecordIter<'a> {
        RecordIter::new(self.raw_records)
    }
    /// Checks every record and that their number is the meta part's count.
    pub fn check_records(&self) -> Result<(), ProtocolError> {
        let mut found: u32 = 0;
        for record in self.records() {
            record?;
            found = found.saturating_add(1);
        }
        let expected = self.meta.record_count();
        if found != expected {
            return Err(ProtocolError::RecordCount { expected, found });
        }
        Ok(())
    }
}

/// Appends a request frame to `out`; returns its length.
pub fn encode_request(
    request: &Request,
    request_id: u64,
    out: &mut Vec<u8>,
) -> Result<usize, ProtocolError> {
    request.encode_with(request_id, Flags::NONE, out)
}

/// Appends a request frame flagged oneway (the broker sends no answer, not even an error).
pub fn encode_oneway_request(
    request: &Request,
    request_id: u64,
    out: &mut Vec<u8>,
) -> Result<usize, ProtocolError> {
    request.encode_with(request_id, Flags::ONEWAY, out)
}

/// Decodes a request from a checked header and its payload.
pub fn decode_request(header: &FrameHeader, payload: &[u8]) -> Result<Request, ProtocolError> {
    Frame::new(*header, payload)?.decode_request()
}

/// Appends an error response to `out`; returns its length.
pub fn encode_error(
    request_id: u64,
    code: ErrorCode,
    message: impl Into<String>,
    out: &mut Vec<u8>,
) -> Result<usize, ProtocolError> {
    encode_frame(
        request_id,
        Flags::NONE,
        &ErrorBody::new(code, message),
        &[],
        out,
    )
}

/// Decodes a response from a checked header and its payload; records stay in `payload`.
pub fn decode_response<'a>(
    header: &FrameHeader,
    payload: &'a [u8],
) -> Result<Response<'a>, ProtocolError> {
    Frame::new(*header, payload)?.decode_response()
}

impl<'a> Frame<'a> {
    /// The request this frame carries; an error if it is not a request.
    pub fn decode_request(&self) -> Result<Request, ProtocolError> {
        Request::decode_meta(&self.aligned_meta())
    }
}

#[cfg(test)]
mod tests;
