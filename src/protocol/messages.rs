//! Request and response types, and the [`Request`] / [`Response`] enums a server dispatches
//! on and a client matches on.
//!
//! Every type here is the rkyv meta part of frames of one [`Kind`]. Two responses,
//! [`PullResult`] and [`Records`], are followed in the payload by a raw tail: stored records,
//! byte for byte as the log holds them, which the client reads in place with
//! [`RecordIter`].
//!
//! Compatibility: a kind's layout is fixed once released. A new field or a new meaning is a
//! new kind with a new number (see `kind`); enum variants (e.g. [`PullStatus`]) are only ever
//! appended, with explicit discriminants.

use rkyv::rancor;

use crate::log::record::RecordIter;

use super::error::{ErrorCode, ProtocolError};
use super::frame::{
    encode_frame, AlignedMeta, Flags, Frame, FrameHeader, Message, MetaWriter, META_ALIGN,
    PROTOCOL_VERSION,
};
use super::kind::{Kind, KindClass};

/// Messages a pull asks for when the consumer does not say.
pub const PULL_BATCH_DEFAULT: u32 = 32;
/// How long the broker holds a pull that finds nothing (long polling), by default.
pub const PULL_WAIT_MS_DEFAULT: u32 = 15_000;
/// `queue_id` of a send that lets the broker choose the queue.
pub const QUEUE_ID_ANY: i32 = -1;

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
        /// Property block as built by `crate::log::record::PropertiesBuilder`.
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
        pub queue_offset: u64,
        pub physical_offset: u64,
    }
}

wire_type! {
    /// One message of a [`SendBatch`].
    pub struct BatchItem {
        pub flag: i32,
        pub properties: Vec<u8>,
        pub body: Vec<u8>,
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
    /// Where a batch was stored: consecutive queue offsets from `first_queue_offset`.
    pub struct SendBatchResult {
        pub queue_id: u32,
        pub first_queue_offset: u64,
        pub count: u32,
        /// One per message, in order.
        pub msg_ids: Vec<String>,
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
    /// The offset is past the queue's end; `next_offset` is the end.
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

// ---- Consumer groups ----

wire_type! {
    /// One subscription of a group member: a topic and a tag expression (`*` or `A || B`).
    pub struct SubscriptionData {
        pub topic: String,
        pub expression: String,
    }
}

/// [`GroupHeartbeat::consume_mode`]: one message of a queue at a time, in order, under the
/// queue's lock.
pub const CONSUME_MODE_ORDERLY: u8 = 1;
/// [`GroupHeartbeat::consume_mode`]: many messages of a queue at once.
pub const CONSUME_MODE_CONCURRENT: u8 = 0;
/// [`GroupHeartbeat::message_model`]: each message to one member.
pub const MESSAGE_MODEL_CLUSTERING: u8 = 0;
/// [`GroupHeartbeat::message_model`]: every message to every member.
pub const MESSAGE_MODEL_BROADCASTING: u8 = 1;

wire_type! {
    /// Joins a consumer group or keeps the membership alive. Answered by [`Assignment`].
    pub struct GroupHeartbeat {
        pub group: String,
        pub client_id: String,
        pub subscriptions: Vec<SubscriptionData>,
        pub consume_mode: u8,
        pub message_model: u8,
        /// Allocation strategy: averagely, circle, consistent-hash, config.
        pub strategy: String,
    }
}

wire_type! {
    /// Leaves a consumer group at once. Answered by [`Empty`].
    pub struct Unregister {
        pub group: String,
        pub client_id: String,
    }
}

wire_type! {
    /// The member's current queues. Answered by [`Assignment`].
    pub struct QueryAssignment {
        pub group: String,
        pub client_id: String,
    }
}

wire_type! {
    pub struct TopicAssignment {
        pub topic: String,
        pub queues: Vec<u32>,
    }
}

wire_type! {
    /// A member's queues. `generation` grows with every change of the group;
    /// `offsets_epoch` grows when an admin resets the group's offsets (members then re-read
    /// their committed offsets).
    pub struct Assignment {
        pub generation: u64,
        pub offsets_epoch: u64,
        pub topics: Vec<TopicAssignment>,
    }
}

wire_type! {
    /// The members of a group and their queues. Answered by [`GroupMembersInfo`].
    pub struct GroupMembers {
        pub group: String,
    }
}

wire_type! {
    pub struct MemberAssignment {
        pub client_id: String,
        pub topics: Vec<TopicAssignment>,
    }
}

wire_type! {
    pub struct GroupMembersInfo {
        pub group: String,
        pub generation: u64,
        pub members: Vec<MemberAssignment>,
    }
}

wire_type! {
    /// Sets the group's committed offset of every queue of `topic` to the first message
    /// stored at or after `timestamp_ms` (offsets may go backwards). Answered by [`Empty`].
    pub struct ResetOffset {
        pub group: String,
        pub topic: String,
        pub timestamp_ms: i64,
    }
}

wire_type! {
    /// Committed offset, max offset and lag per queue. Answered by [`Progress`].
    pub struct ConsumerProgress {
        pub group: String,
        pub topic: String,
    }
}

wire_type! {
    pub struct QueueProgress {
        pub queue_id: u32,
        /// -1 when the group has no committed offset for the queue.
        pub committed_offset: i64,
        pub max_offset: u64,
        pub lag: u64,
    }
}

wire_type! {
    pub struct Progress {
        pub group: String,
        pub topic: String,
        pub queues: Vec<QueueProgress>,
    }
}

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

// ---- Pushed notifications ----

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

/// Implements [`Message`] with rkyv's checked API, and checks at compile time that the
/// archived form can be read in place at [`META_ALIGN`].
macro_rules! impl_message {
    ($($ty:ident => $kind:ident $(| $hint:path)?),* $(,)?) => {$(
        impl Message for $ty {
            const KIND: Kind = Kind::$kind;
            fn write_meta(&self, out: &mut Vec<u8>) -> Result<(), rancor::Error> {
                rkyv::api::high::to_bytes_in::<_, rancor::Error>(self, MetaWriter::new(out))
                    .map(|_| ())
            }
            fn access_meta(bytes: &[u8]) -> Result<&Self::Archived, rancor::Error> {
                rkyv::access::<<Self as rkyv::Archive>::Archived, rancor::Error>(bytes)
            }
            fn read_meta(bytes: &[u8]) -> Result<Self, rancor::Error> {
                let archived = Self::access_meta(bytes)?;
                rkyv::deserialize::<Self, rancor::Error>(archived)
            }
            $(fn meta_len_hint(&self) -> usize {
                $hint(self)
            })?
        }
        const _: () =
            assert!(std::mem::align_of::<<$ty as rkyv::Archive>::Archived>() <= META_ALIGN);
    )*};
}

impl_message! {
    Handshake => Handshake,
    Heartbeat => Heartbeat,
    SendMessage => SendMessage | send_message_len_hint,
    SendBatch => SendBatch | send_batch_len_hint,
    Pull => Pull,
    GetMinOffset => GetMinOffset,
    GetMaxOffset => GetMaxOffset,
    SearchOffsetByTimestamp => SearchOffsetByTimestamp,
    CommitOffset => CommitOffset,
    QueryOffset => QueryOffset,
    CreateTopic => CreateTopic,
    UpdateTopic => UpdateTopic,
    DeleteTopic => DeleteTopic,
    ListTopics => ListTopics,
    DescribeTopic => DescribeTopic,
    MessageById => MessageById,
    MessagesByKey => MessagesByKey,
    GroupHeartbeat => GroupHeartbeat,
    Unregister => Unregister,
    QueryAssignment => QueryAssignment,
    GroupMembers => GroupMembers,
    ResetOffset => ResetOffset,
    ConsumerProgress => ConsumerProgress,
    LockBatch => LockBatch,
    UnlockBatch => UnlockBatch,
    Assignment => Assignment,
    GroupMembersInfo => GroupMembersInfo,
    Progress => Progress,
    Locked => Locked,
    RebalanceNotify => RebalanceNotify,
    ErrorBody => Error,
    Empty => Empty,
    HandshakeOk => HandshakeOk,
    SendResult => SendResult,
    SendBatchResult => SendBatchResult,
    PullResult => PullResult,
    Offset => Offset,
    TopicList => TopicList,
    TopicInfo => TopicInfo,
    Records => Records,
}

/// Room for a message's fixed fields and rkyv's relative pointers and padding.
const ITEM_OVERHEAD_HINT: usize = 64;

fn send_message_len_hint(m: &SendMessage) -> usize {
    m.topic.len() + m.properties.len() + m.body.len() + 2 * ITEM_OVERHEAD_HINT
}

fn send_batch_len_hint(m: &SendBatch) -> usize {
    let items: usize = m
        .messages
        .iter()
        .map(|i| i.properties.len() + i.body.len() + ITEM_OVERHEAD_HINT)
        .sum();
    m.topic.len() + items + ITEM_OVERHEAD_HINT
}

// Types that are only ever nested inside a meta part.
const _: () = assert!(std::mem::align_of::<ArchivedBatchItem>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedQueueInfo>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedPullStatus>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedSubscriptionData>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedTopicAssignment>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedMemberAssignment>() <= META_ALIGN);
const _: () = assert!(std::mem::align_of::<ArchivedQueueProgress>() <= META_ALIGN);

/// Defines [`Request`] with one variant per request type, named like the type and its kind.
macro_rules! requests {
    ($($name:ident),* $(,)?) => {
        /// Every request a client can send. The server dispatches on it.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Request {
            $($name($name),)*
        }

        impl Request {
            pub fn kind(&self) -> Kind {
                match self {
                    $(Request::$name(_) => Kind::$name,)*
                }
            }

            fn encode_with(
                &self,
                request_id: u64,
                flags: Flags,
                out: &mut Vec<u8>,
            ) -> Result<usize, ProtocolError> {
                match self {
                    $(Request::$name(m) => encode_frame(request_id, flags, m, &[], out),)*
                }
            }

            fn decode_meta(meta: &AlignedMeta<'_>) -> Result<Request, ProtocolError> {
                match meta.kind() {
                    $(Kind::$name => meta.deserialize::<$name>().map(Request::$name),)*
                    found => Err(ProtocolError::UnexpectedKind {
                        expected: KindClass::Request,
                        found,
                    }),
                }
            }
        }

        $(impl From<$name> for Request {
            fn from(m: $name) -> Request {
                Request::$name(m)
            }
        })*
    };
}

requests! {
    GroupHeartbeat,
    Unregister,
    QueryAssignment,
    GroupMembers,
    ResetOffset,
    ConsumerProgress,
    LockBatch,
    UnlockBatch,
    Handshake,
    Heartbeat,
    SendMessage,
    SendBatch,
    Pull,
    GetMinOffset,
    GetMaxOffset,
    SearchOffsetByTimestamp,
    CommitOffset,
    QueryOffset,
    CreateTopic,
    UpdateTopic,
    DeleteTopic,
    ListTopics,
    DescribeTopic,
    MessageById,
    MessagesByKey,
}

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

/// Every response a broker can send. Record-carrying answers borrow their records from the
/// frame they were decoded from (or, when encoding, from wherever the server holds them).
#[derive(Debug, Clone, PartialEq)]
pub enum Response<'a> {
    Error(ErrorBody),
    Empty(Empty),
    HandshakeOk(HandshakeOk),
    SendResult(SendResult),
    SendBatchResult(SendBatchResult),
    Pull(PullResponse<'a>),
    Offset(Offset),
    TopicList(TopicList),
    TopicInfo(TopicInfo),
    Records(RecordsResponse<'a>),
    Assignment(Assignment),
    GroupMembersInfo(GroupMembersInfo),
    Progress(Progress),
    Locked(Locked),
}

impl Response<'_> {
    pub fn kind(&self) -> Kind {
        match self {
            Response::Error(_) => Kind::Error,
            Response::Empty(_) => Kind::Empty,
            Response::HandshakeOk(_) => Kind::HandshakeOk,
            Response::SendResult(_) => Kind::SendResult,
            Response::SendBatchResult(_) => Kind::SendBatchResult,
            Response::Pull(_) => Kind::PullResult,
            Response::Offset(_) => Kind::Offset,
            Response::TopicList(_) => Kind::TopicList,
            Response::TopicInfo(_) => Kind::TopicInfo,
            Response::Records(_) => Kind::Records,
            Response::Assignment(_) => Kind::Assignment,
            Response::GroupMembersInfo(_) => Kind::GroupMembersInfo,
            Response::Progress(_) => Kind::Progress,
            Response::Locked(_) => Kind::Locked,
        }
    }
}

impl From<ErrorBody> for Response<'_> {
    fn from(e: ErrorBody) -> Self {
        Response::Error(e)
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

/// Appends a response frame to `out` (records included); returns its length.
pub fn encode_response(
    response: &Response<'_>,
    request_id: u64,
    out: &mut Vec<u8>,
) -> Result<usize, ProtocolError> {
    let f = Flags::NONE;
    match response {
        Response::Error(m) => encode_frame(request_id, f, m, &[], out),
        Response::Empty(m) => encode_frame(request_id, f, m, &[], out),
        Response::HandshakeOk(m) => encode_frame(request_id, f, m, &[], out),
        Response::SendResult(m) => encode_frame(request_id, f, m, &[], out),
        Response::SendBatchResult(m) => encode_frame(request_id, f, m, &[], out),
        Response::Pull(m) => encode_frame(request_id, f, m.meta(), m.raw_records(), out),
        Response::Offset(m) => encode_frame(request_id, f, m, &[], out),
        Response::TopicList(m) => encode_frame(request_id, f, m, &[], out),
        Response::TopicInfo(m) => encode_frame(request_id, f, m, &[], out),
        Response::Records(m) => encode_frame(request_id, f, m.meta(), m.raw_records(), out),
        Response::Assignment(m) => encode_frame(request_id, f, m, &[], out),
        Response::GroupMembersInfo(m) => encode_frame(request_id, f, m, &[], out),
        Response::Progress(m) => encode_frame(request_id, f, m, &[], out),
        Response::Locked(m) => encode_frame(request_id, f, m, &[], out),
    }
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

    /// The response this frame carries; an error if it is not a response.
    pub fn decode_response(&self) -> Result<Response<'a>, ProtocolError> {
        let meta = self.aligned_meta();
        Ok(match self.kind() {
            Kind::Error => Response::Error(meta.deserialize()?),
            Kind::Empty => Response::Empty(meta.deserialize()?),
            Kind::HandshakeOk => Response::HandshakeOk(meta.deserialize()?),
            Kind::SendResult => Response::SendResult(meta.deserialize()?),
            Kind::SendBatchResult => Response::SendBatchResult(meta.deserialize()?),
            Kind::PullResult => Response::Pull(WithRecords::new(meta.deserialize()?, self.tail())),
            Kind::Offset => Response::Offset(meta.deserialize()?),
            Kind::TopicList => Response::TopicList(meta.deserialize()?),
            Kind::TopicInfo => Response::TopicInfo(meta.deserialize()?),
            Kind::Records => Response::Records(WithRecords::new(meta.deserialize()?, self.tail())),
            Kind::Assignment => Response::Assignment(meta.deserialize()?),
            Kind::GroupMembersInfo => Response::GroupMembersInfo(meta.deserialize()?),
            Kind::Progress => Response::Progress(meta.deserialize()?),
            Kind::Locked => Response::Locked(meta.deserialize()?),
            found @ (Kind::Handshake
            | Kind::RebalanceNotify
            | Kind::GroupHeartbeat
            | Kind::Unregister
            | Kind::QueryAssignment
            | Kind::GroupMembers
            | Kind::ResetOffset
            | Kind::ConsumerProgress
            | Kind::LockBatch
            | Kind::UnlockBatch
            | Kind::Heartbeat
            | Kind::SendMessage
            | Kind::SendBatch
            | Kind::Pull
            | Kind::GetMinOffset
            | Kind::GetMaxOffset
            | Kind::SearchOffsetByTimestamp
            | Kind::CommitOffset
            | Kind::QueryOffset
            | Kind::CreateTopic
            | Kind::UpdateTopic
            | Kind::DeleteTopic
            | Kind::ListTopics
            | Kind::DescribeTopic
            | Kind::MessageById
            | Kind::MessagesByKey) => {
                return Err(ProtocolError::UnexpectedKind {
                    expected: KindClass::Response,
                    found,
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::record::{
        prop, Placement, PropertiesBuilder, RecordDraft, RecordError, BODY_BYTES_MAX,
        PROPERTIES_BYTES_MAX, TOPIC_BYTES_MAX,
    };
    use crate::protocol::frame::{
        encode_frame_head, FrameDecoder, FrameLimits, FRAME_BYTES_MAX_DEFAULT, FRAME_BYTES_MIN,
        FRAME_HEADER_BYTES, FRAME_MAGIC, META_BYTES_RESERVE,
    };
    use proptest::prelude::*;
    use rkyv::util::AlignedVec;

    /// `bytes` placed `shift` bytes after a 16-aligned address; read it at `[shift..]`.
    fn shifted(bytes: &[u8], shift: usize) -> AlignedVec<16> {
        let mut buf = AlignedVec::<16>::with_capacity(shift + bytes.len());
        buf.extend_from_slice(&vec![0u8; shift]);
        buf.extend_from_slice(bytes);
        buf
    }

    /// Encodes `request`, then decodes it from buffers at every misalignment.
    fn check_request(request: &Request) {
        let mut out = Vec::new();
        let len = encode_request(request, 42, &mut out).unwrap();
        assert_eq!(len, out.len());
        for shift in 0..16 {
            let buf = shifted(&out, shift);
            let frame = FrameDecoder::default()
                .decode(&buf[shift..])
                .unwrap()
                .unwrap();
            assert_eq!(frame.frame_len(), len);
            assert_eq!(frame.request_id(), 42);
            assert_eq!(frame.kind(), request.kind());
            assert!(frame.tail().is_empty());
            assert_eq!(&frame.decode_request().unwrap(), request);
            assert_eq!(
                &decode_request(frame.header(), frame.payload()).unwrap(),
                request
            );
            assert_eq!(
                frame.decode_response(),
                Err(ProtocolError::UnexpectedKind {
                    expected: KindClass::Response,
                    found: request.kind()
                })
            );
        }
    }

    /// Encodes `response`, then decodes it from buffers at every misalignment.
    fn check_response(response: &Response<'_>) {
        let mut out = Vec::new();
        let len = encode_response(response, 77, &mut out).unwrap();
        assert_eq!(len, out.len());
        for shift in 0..16 {
            let buf = shifted(&out, shift);
            let frame = FrameDecoder::default()
                .decode(&buf[shift..])
                .unwrap()
                .unwrap();
            assert_eq!(frame.request_id(), 77);
            assert_eq!(frame.kind(), response.kind());
            assert!(frame.header().flags().is_response());
            assert_eq!(
                frame.header().flags().is_error(),
                matches!(response, Response::Error(_))
            );
            assert_eq!(&frame.decode_response().unwrap(), response);
            assert_eq!(
                &decode_response(frame.header(), frame.payload()).unwrap(),
                response
            );
            assert_eq!(
                frame.decode_request(),
                Err(ProtocolError::UnexpectedKind {
                    expected: KindClass::Request,
                    found: response.kind()
                })
            );
        }
    }

    fn properties() -> Vec<u8> {
        let mut p = PropertiesBuilder::new();
        p.put(prop::TAGS, "TagA").unwrap();
        p.put(prop::KEYS, "order-1 order-2").unwrap();
        p.into_bytes()
    }

    /// Three stored records, concatenated as a pull answer carries them.
    fn stored_records() -> Vec<u8> {
        let props = properties();
        let mut out = Vec::new();
        for (i, body) in [&b"first"[..], b"", b"third body"].into_iter().enumerate() {
            let draft = RecordDraft {
                topic: "orders",
                queue_id: 2,
                flag: i as i32,
                sys_flag: 0,
                born_timestamp_ms: 1_700_000_000_000 + i as i64,
                born_host: "10.0.0.1:9000".parse().unwrap(),
                reconsume_times: 0,
                transaction_offset: 0,
                properties: &props,
                body,
            };
            out.extend_from_slice(&draft.encode(Placement {
                queue_offset: 10 + i as u64,
                physical_offset: 4096 * i as u64,
                store_timestamp_ms: 1_700_000_000_500,
            }));
        }
        out
    }

    fn sample_requests() -> Vec<Request> {
        vec![
            Handshake::new("client-a").into(),
            Heartbeat {
                client_id: "client-a".into(),
            }
            .into(),
            SendMessage {
                topic: "orders".into(),
                queue_id: QUEUE_ID_ANY,
                flag: -3,
                properties: properties(),
                body: b"hello".to_vec(),
                born_timestamp_ms: -1,
                wait_durable: true,
            }
            .into(),
            SendBatch {
                topic: "orders".into(),
                queue_id: 3,
                messages: vec![
                    BatchItem {
                        flag: 1,
                        properties: properties(),
                        body: b"a".to_vec(),
                        born_timestamp_ms: 5,
                    },
                    BatchItem {
                        flag: 2,
                        properties: Vec::new(),
                        body: Vec::new(),
                        born_timestamp_ms: 6,
                    },
                ],
                wait_durable: false,
            }
            .into(),
            Pull {
                tag_hashes: vec![1, u64::MAX],
                ..Pull::new("orders", 3, 100)
            }
            .into(),
            GetMinOffset {
                topic: "orders".into(),
                queue_id: 1,
            }
            .into(),
            GetMaxOffset {
                topic: "orders".into(),
                queue_id: 1,
            }
            .into(),
            SearchOffsetByTimestamp {
                topic: "orders".into(),
                queue_id: 1,
                timestamp_ms: 1_700_000_000_000,
            }
            .into(),
            CommitOffset {
                group: "g".into(),
                topic: "orders".into(),
                queue_id: 7,
                offset: u64::MAX,
            }
            .into(),
            QueryOffset {
                group: "g".into(),
                topic: "orders".into(),
                queue_id: 7,
            }
            .into(),
            CreateTopic {
                topic: "orders".into(),
                queue_count: 8,
            }
            .into(),
            UpdateTopic {
                topic: "orders".into(),
                queue_count: 16,
            }
            .into(),
            DeleteTopic {
                topic: "orders".into(),
            }
            .into(),
            ListTopics {}.into(),
            DescribeTopic {
                topic: "orders".into(),
            }
            .into(),
            MessageById {
                msg_id: "0000000100000002000000000000ABCD".into(),
            }
            .into(),
            MessagesByKey {
                topic: "orders".into(),
                key: "order-1".into(),
                begin_ms: 0,
                end_ms: i64::MAX,
                max_messages: 64,
            }
            .into(),
            GroupHeartbeat {
                group: "g".into(),
                client_id: "c1".into(),
                subscriptions: vec![SubscriptionData {
                    topic: "orders".into(),
                    expression: "A || B".into(),
                }],
                consume_mode: CONSUME_MODE_ORDERLY,
                message_model: MESSAGE_MODEL_CLUSTERING,
                strategy: "averagely".into(),
            }
            .into(),
            Unregister {
                group: "g".into(),
                client_id: "c1".into(),
            }
            .into(),
            QueryAssignment {
                group: "g".into(),
                client_id: "c1".into(),
            }
            .into(),
            GroupMembers { group: "g".into() }.into(),
            ResetOffset {
                group: "g".into(),
                topic: "orders".into(),
                timestamp_ms: 17,
            }
            .into(),
            ConsumerProgress {
                group: "g".into(),
                topic: "orders".into(),
            }
            .into(),
            LockBatch {
                group: "g".into(),
                client_id: "c1".into(),
                topic: "orders".into(),
                queues: vec![0, 3],
            }
            .into(),
            UnlockBatch {
                group: "g".into(),
                client_id: "c1".into(),
                topic: "orders".into(),
                queues: vec![3],
            }
            .into(),
        ]
    }

    fn sample_responses(raw: &[u8]) -> Vec<Response<'_>> {
        vec![
            ErrorBody::new(ErrorCode::TopicNotFound, "no topic \"x\"").into(),
            Response::Empty(Empty {}),
            Response::HandshakeOk(HandshakeOk {
                protocol_version: PROTOCOL_VERSION as u32,
                shard_count: 2,
                shard_id: 1,
                shard_addrs: vec!["127.0.0.1:7800".into(), "127.0.0.1:7801".into()],
                broker_id: 9,
            }),
            Response::SendResult(SendResult {
                msg_id: "0000000900000001000000000000F000".into(),
                queue_id: 3,
                queue_offset: 12,
                physical_offset: 0xF000,
            }),
            Response::SendBatchResult(SendBatchResult {
                queue_id: 3,
                first_queue_offset: 13,
                count: 2,
                msg_ids: vec!["A".into(), "B".into()],
            }),
            Response::Pull(PullResponse::new(
                PullResult {
                    status: PullStatus::Found,
                    next_offset: 13,
                    min_offset: 0,
                    max_offset: 20,
                    count: 3,
                },
                raw,
            )),
            Response::Pull(PullResponse::new(
                PullResult {
                    status: PullStatus::OffsetTooBig,
                    next_offset: 20,
                    min_offset: 0,
                    max_offset: 20,
                    count: 0,
                },
                &[],
            )),
            Response::Offset(Offset { offset: 5 }),
            Response::TopicList(TopicList {
                topics: vec!["a".into(), "orders".into()],
            }),
            Response::TopicInfo(TopicInfo {
                topic: "orders".into(),
                queues: vec![
                    QueueInfo {
                        queue_id: 0,
                        min_offset: 0,
                        max_offset: 10,
                    },
                    QueueInfo {
                        queue_id: 1,
                        min_offset: 3,
                        max_offset: 4,
                    },
                ],
            }),
            Response::Records(RecordsResponse::new(Records { count: 3 }, raw)),
            Response::Assignment(Assignment {
                generation: 4,
                offsets_epoch: 1,
                topics: vec![TopicAssignment {
                    topic: "orders".into(),
                    queues: vec![0, 2],
                }],
            }),
            Response::GroupMembersInfo(GroupMembersInfo {
                group: "g".into(),
                generation: 4,
                members: vec![MemberAssignment {
                    client_id: "c1".into(),
                    topics: vec![TopicAssignment {
                        topic: "orders".into(),
                        queues: vec![1],
                    }],
                }],
            }),
            Response::Progress(Progress {
                group: "g".into(),
                topic: "orders".into(),
                queues: vec![QueueProgress {
                    queue_id: 0,
                    committed_offset: -1,
                    max_offset: 9,
                    lag: 9,
                }],
            }),
            Response::Locked(Locked { queues: vec![0, 3] }),
        ]
    }

    #[test]
    fn every_request_kind_round_trips() {
        let samples = sample_requests();
        for request in &samples {
            check_request(request);
        }
        let mut covered: Vec<Kind> = samples.iter().map(Request::kind).collect();
        covered.dedup();
        let requests: Vec<Kind> = Kind::ALL
            .into_iter()
            .filter(|k| k.class() == KindClass::Request)
            .collect();
        assert_eq!(covered, requests);
    }

    #[test]
    fn every_response_kind_round_trips() {
        let raw = stored_records();
        let samples = sample_responses(&raw);
        for response in &samples {
            check_response(response);
        }
        let mut covered: Vec<Kind> = samples.iter().map(Response::kind).collect();
        covered.dedup();
        let responses: Vec<Kind> = Kind::ALL
            .into_iter()
            .filter(|k| k.class() == KindClass::Response)
            .collect();
        assert_eq!(covered, responses);
    }

    #[test]
    fn every_request_has_its_success_reply_kind() {
        // The pairs the server answers with, checked against the registry.
        let raw = stored_records();
        let replies = sample_responses(&raw);
        for request in sample_requests() {
            let reply = request.kind().success_reply().unwrap();
            assert!(replies.iter().any(|r| r.kind() == reply));
        }
    }

    #[test]
    fn pull_records_are_read_in_place() {
        let raw = stored_records();
        let response = Response::Pull(PullResponse::new(
            PullResult {
                status: PullStatus::Found,
                next_offset: 13,
                min_offset: 0,
                max_offset: 13,
                count: 3,
            },
            &raw,
        ));
        let mut out = Vec::new();
        encode_response(&response, 1, &mut out).unwrap();
        // Misaligned on purpose: records need no alignment.
        let buf = shifted(&out, 3);
        let frame = FrameDecoder::default().decode(&buf[3..]).unwrap().unwrap();
        assert_eq!(frame.tail(), &raw[..]);
        let Response::Pull(pull) = frame.decode_response().unwrap() else {
            panic!("not a pull answer")
        };
        pull.check_records().unwrap();
        let records: Vec<_> = pull.records().map(Result::unwrap).collect();
        assert_eq!(records.len(), 3);
        assert_eq!(
            records.iter().map(|r| r.queue_offset()).collect::<Vec<_>>(),
            vec![10, 11, 12]
        );
        assert_eq!(records[0].body(), b"first");
        assert_eq!(records[1].body(), b"");
        assert_eq!(records[2].body(), b"third body");
        assert_eq!(records[2].topic(), "orders");
        assert_eq!(records[2].tags(), Some("TagA"));
        assert_eq!(records[2].physical_offset(), 8192);
        // The records' bytes lie inside the received frame: nothing was copied.
        let frame_bytes = &buf[3..];
        let inside = frame_bytes.as_ptr_range();
        assert!(inside.contains(&records[0].as_bytes().as_ptr()));
    }

    #[test]
    fn message_by_id_answer_carries_one_record() {
        let raw = stored_records();
        let first_len = crate::log::record::RecordView::parse(&raw)
            .unwrap()
            .as_bytes()
            .len();
        let response = Response::Records(RecordsResponse::new(
            Records { count: 1 },
            &raw[..first_len],
        ));
        let mut out = Vec::new();
        encode_response(&response, 2, &mut out).unwrap();
        let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
        let Response::Records(found) = frame.decode_response().unwrap() else {
            panic!("not a records answer")
        };
        found.check_records().unwrap();
        let record = found.records().next().unwrap().unwrap();
        assert_eq!(record.body(), b"first");
        assert_eq!(
            record.keys().collect::<Vec<_>>(),
            vec!["order-1", "order-2"]
        );
    }

    #[test]
    fn check_records_catches_a_wrong_count_and_a_bad_crc() {
        let mut raw = stored_records();
        let wrong_count = PullResponse::new(
            PullResult {
                status: PullStatus::Found,
                next_offset: 0,
                min_offset: 0,
                max_offset: 0,
                count: 4,
            },
            &raw,
        );
        assert_eq!(
            wrong_count.check_records(),
            Err(ProtocolError::RecordCount {
                expected: 4,
                found: 3
            })
        );
        let last = raw.len() - 1;
        raw[last] ^= 0x20;
        let corrupt = RecordsResponse::new(Records { count: 3 }, &raw);
        let err = corrupt.check_records().unwrap_err();
        assert!(
            matches!(err, ProtocolError::BadRecord(RecordError::BadCrc { .. })),
            "{err}"
        );
    }

    #[test]
    fn oneway_requests_carry_the_flag() {
        let request: Request = Heartbeat {
            client_id: "c".into(),
        }
        .into();
        let mut out = Vec::new();
        encode_oneway_request(&request, 8, &mut out).unwrap();
        let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
        assert!(frame.header().flags().is_oneway());
        assert_eq!(frame.decode_request().unwrap(), request);
    }

    #[test]
    fn error_answers_keep_code_and_message() {
        let mut out = Vec::new();
        encode_error(5, ErrorCode::OffsetNotFound, "no offset for g", &mut out).unwrap();
        let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
        let Response::Error(e) = frame.decode_response().unwrap() else {
            panic!("not an error")
        };
        assert_eq!(e.error_code(), Some(ErrorCode::OffsetNotFound));
        assert!(!e.is_retriable());
        assert_eq!(e.to_string(), "OffsetNotFound(20): no offset for g");
        let from_newer_broker = ErrorBody {
            code: 4242,
            message: "?".into(),
        };
        assert_eq!(from_newer_broker.error_code(), None);
        assert!(!from_newer_broker.is_retriable());
        let e = ErrorBody::from(&ProtocolError::UnknownKind(777));
        assert_eq!(e.error_code(), Some(ErrorCode::UnknownKind));
        assert_eq!(e.message, "unknown frame kind 777");
    }

    #[test]
    fn garbage_meta_is_a_typed_error() {
        // A valid header around a payload that is not a Pull.
        let mut out = Vec::new();
        encode_request(&Pull::new("t", 0, 0).into(), 1, &mut out).unwrap();
        for b in &mut out[FRAME_HEADER_BYTES..] {
            *b = 0xFF;
        }
        let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
        let err = frame.decode_request().unwrap_err();
        assert!(
            matches!(
                err,
                ProtocolError::BadPayload {
                    kind: Kind::Pull,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.code(), ErrorCode::MalformedFrame);
    }

    #[test]
    fn largest_messages_fit_the_smallest_limit() {
        let body = vec![7u8; BODY_BYTES_MAX];
        let mut props = Vec::with_capacity(PROPERTIES_BYTES_MAX);
        // One property filling the block: name, 0x01, value, 0x02.
        props.extend_from_slice(b"P\x01");
        props.resize(PROPERTIES_BYTES_MAX - 1, b'v');
        props.push(0x02);
        let send = SendMessage {
            topic: "t".repeat(TOPIC_BYTES_MAX),
            queue_id: 0,
            flag: 0,
            properties: props,
            body,
            born_timestamp_ms: 0,
            wait_durable: false,
        };
        let mut out = Vec::new();
        let len = encode_request(&send.into(), 1, &mut out).unwrap();
        assert!(len <= FRAME_BYTES_MIN as usize, "{len}");
        let decoder = FrameDecoder::new(FrameLimits::new(FRAME_BYTES_MIN).unwrap());
        let frame = decoder.decode(&out).unwrap().unwrap();
        // The zero-copy path: the body is read where it lies.
        let meta = frame.aligned_meta();
        let archived = meta.access::<SendMessage>().unwrap();
        assert_eq!(archived.body.len(), BODY_BYTES_MAX);
    }

    #[test]
    fn record_answers_meta_fits_the_reserve() {
        let pull = PullResult {
            status: PullStatus::Found,
            next_offset: u64::MAX,
            min_offset: u64::MAX,
            max_offset: u64::MAX,
            count: u32::MAX,
        };
        let mut out = Vec::new();
        let len = encode_frame_head(1, Flags::NONE, &pull, 0, &mut out).unwrap();
        assert!(len - FRAME_HEADER_BYTES <= META_BYTES_RESERVE as usize);
        out.clear();
        let len = encode_frame_head(1, Flags::NONE, &Records { count: 1 }, 0, &mut out).unwrap();
        assert!(len - FRAME_HEADER_BYTES <= META_BYTES_RESERVE as usize);
    }

    // ---- Property tests ----

    fn arb_text() -> impl Strategy<Value = String> {
        "\\PC{0,24}"
    }

    fn arb_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..max)
    }

    prop_compose! {
        fn arb_send_message()(
            topic in arb_text(),
            queue_id: i32,
            flag: i32,
            properties in arb_bytes(64),
            body in arb_bytes(300),
            born_timestamp_ms: i64,
            wait_durable: bool,
        ) -> SendMessage {
            SendMessage { topic, queue_id, flag, properties, body, born_timestamp_ms, wait_durable }
        }
    }

    prop_compose! {
        fn arb_batch_item()(
            flag: i32,
            properties in arb_bytes(32),
            body in arb_bytes(64),
            born_timestamp_ms: i64,
        ) -> BatchItem {
            BatchItem { flag, properties, body, born_timestamp_ms }
        }
    }

    prop_compose! {
        fn arb_send_batch()(
            topic in arb_text(),
            queue_id: i32,
            messages in proptest::collection::vec(arb_batch_item(), 0..8),
            wait_durable: bool,
        ) -> SendBatch {
            SendBatch { topic, queue_id, messages, wait_durable }
        }
    }

    prop_compose! {
        fn arb_pull()(
            topic in arb_text(),
            queue_id: u32,
            offset: u64,
            max_messages: u32,
            max_wait_ms: u32,
            tag_hashes in proptest::collection::vec(any::<u64>(), 0..8),
        ) -> Pull {
            Pull { topic, queue_id, offset, max_messages, max_wait_ms, tag_hashes }
        }
    }

    prop_compose! {
        fn arb_commit_offset()(
            group in arb_text(),
            topic in arb_text(),
            queue_id: u32,
            offset: u64,
        ) -> CommitOffset {
            CommitOffset { group, topic, queue_id, offset }
        }
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        prop_oneof![
            arb_send_message().prop_map(Request::from),
            arb_send_batch().prop_map(Request::from),
            arb_pull().prop_map(Request::from),
            arb_commit_offset().prop_map(Request::from),
            (any::<u32>(), arb_text()).prop_map(|(protocol_version, client_id)| {
                Request::from(Handshake {
                    protocol_version,
                    client_id,
                })
            }),
        ]
    }

    prop_compose! {
        fn arb_handshake_ok()(
            protocol_version: u32,
            shard_count: u32,
            shard_id: u32,
            shard_addrs in proptest::collection::vec(arb_text(), 0..6),
            broker_id: u32,
        ) -> HandshakeOk {
            HandshakeOk { protocol_version, shard_count, shard_id, shard_addrs, broker_id }
        }
    }

    fn encoded(request: &Request) -> Vec<u8> {
        let mut out = Vec::new();
        encode_request(request, 1, &mut out).unwrap();
        out
    }

    /// Runs every decoding step on `bytes`; any outcome but a panic is fine.
    fn decode_everything(bytes: &[u8]) {
        let decoder = FrameDecoder::default();
        let _ = decoder.bytes_needed(bytes);
        if let Ok(Some(frame)) = decoder.decode(bytes) {
            let _ = frame.decode_request();
            if let Ok(Response::Pull(pull)) = frame.decode_response() {
                let _ = pull.check_records();
            }
        }
    }

    /// A header that passes the checks, for `kind`, followed by `payload`.
    fn header_for(kind: Kind, meta_len: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((FRAME_HEADER_BYTES + payload.len()) as u32).to_le_bytes());
        out.extend_from_slice(&[FRAME_MAGIC, PROTOCOL_VERSION]);
        out.extend_from_slice(&kind.as_u16().to_le_bytes());
        out.extend_from_slice(&7u64.to_le_bytes());
        out.extend_from_slice(&Flags::required_for(kind).bits().to_le_bytes());
        out.extend_from_slice(&meta_len.to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    proptest! {
        #[test]
        fn requests_round_trip(request in arb_request(), shift in 0usize..16) {
            let out = encoded(&request);
            let buf = shifted(&out, shift);
            let frame = FrameDecoder::default().decode(&buf[shift..]).unwrap().unwrap();
            prop_assert_eq!(frame.frame_len(), out.len());
            prop_assert_eq!(frame.decode_request().unwrap(), request);
        }

        #[test]
        fn handshake_ok_round_trips(ok in arb_handshake_ok(), request_id: u64) {
            let response = Response::HandshakeOk(ok);
            let mut out = Vec::new();
            encode_response(&response, request_id, &mut out).unwrap();
            let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
            prop_assert_eq!(frame.request_id(), request_id);
            prop_assert_eq!(frame.decode_response().unwrap(), response);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in arb_bytes(512)) {
            decode_everything(&bytes);
        }

        #[test]
        fn arbitrary_payload_behind_a_valid_header_never_panics(
            kind in proptest::sample::select(Kind::ALL.to_vec()),
            payload in arb_bytes(256),
            meta_len: u32,
            meta_fits: bool,
        ) {
            let meta_len = if meta_fits && !payload.is_empty() {
                meta_len % (payload.len() as u32 + 1)
            } else {
                meta_len
            };
            let bytes = header_for(kind, meta_len, &payload);
            decode_everything(&bytes);
            // Every outcome is typed: a decoded frame or an error naming the problem.
            if let Ok(Some(frame)) = FrameDecoder::default().decode(&bytes) {
                let outcome = match kind.class() {
                    KindClass::Request => frame.decode_request().map(|_| ()),
                    _ => frame.decode_response().map(|_| ()),
                };
                if let Err(e) = outcome {
                    prop_assert_eq!(e.code(), ErrorCode::MalformedFrame, "{}", e);
                }
            }
        }

        #[test]
        fn corrupting_one_byte_of_a_valid_frame_never_panics(
            request in arb_request(),
            at: proptest::sample::Index,
            value: u8,
        ) {
            let mut bytes = encoded(&request);
            let i = at.index(bytes.len());
            bytes[i] = value;
            decode_everything(&bytes);
        }

        #[test]
        fn every_truncation_needs_more(request in arb_request()) {
            let bytes = encoded(&request);
            let decoder = FrameDecoder::default();
            for cut in 0..bytes.len() {
                prop_assert_eq!(decoder.decode(&bytes[..cut]), Ok(None), "cut {}", cut);
                let needed = if cut < FRAME_HEADER_BYTES {
                    FRAME_HEADER_BYTES
                } else {
                    bytes.len()
                };
                prop_assert_eq!(decoder.bytes_needed(&bytes[..cut]), Ok(needed));
            }
            prop_assert!(decoder.decode(&bytes).unwrap().is_some());
        }

        #[test]
        fn huge_frame_len_is_rejected_from_the_header_alone(
            len in (FRAME_BYTES_MAX_DEFAULT + 1)..=u32::MAX,
            kind in proptest::sample::select(Kind::ALL.to_vec()),
        ) {
            let mut header = header_for(kind, 0, &[]);
            header[..4].copy_from_slice(&len.to_le_bytes());
            let expected = ProtocolError::FrameTooLarge {
                len: len as u64,
                max: FRAME_BYTES_MAX_DEFAULT,
            };
            prop_assert_eq!(FrameDecoder::default().decode(&header), Err(expected.clone()));
            prop_assert_eq!(
                FrameHeader::decode(&header, &FrameLimits::default()),
                Err(expected)
            );
        }

        #[test]
        fn pull_answers_round_trip_with_records(
            status in proptest::sample::select(vec![
                PullStatus::Found,
                PullStatus::NoNewMessage,
                PullStatus::NoMatchedMessage,
                PullStatus::OffsetTooSmall,
                PullStatus::OffsetTooBig,
            ]),
            next_offset: u64,
            take in 0usize..=3,
            shift in 0usize..16,
        ) {
            let all = stored_records();
            let mut end = 0;
            for record in crate::log::record::RecordIter::new(&all).take(take) {
                end += record.unwrap().as_bytes().len();
            }
            let response = Response::Pull(PullResponse::new(
                PullResult {
                    status,
                    next_offset,
                    min_offset: 0,
                    max_offset: 13,
                    count: take as u32,
                },
                &all[..end],
            ));
            let mut out = Vec::new();
            encode_response(&response, 3, &mut out).unwrap();
            let buf = shifted(&out, shift);
            let frame = FrameDecoder::default().decode(&buf[shift..]).unwrap().unwrap();
            let decoded = frame.decode_response().unwrap();
            prop_assert_eq!(&decoded, &response);
            let Response::Pull(pull) = decoded else { unreachable!() };
            prop_assert_eq!(pull.check_records(), Ok(()));
        }
    }
}
