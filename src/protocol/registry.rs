//! The registry: every frame kind of the native protocol, declared once.
//!
//! One line per kind gives its stable number and, for a request, the response it is answered
//! with, the name of its handler, how it is routed between shards and (when it names one)
//! its consumer group. From this table the [`registry!`] macro generates:
//! - the [`Kind`] enum with the wire numbers, [`Kind::ALL`], `from_u16`, `success_reply`
//!   and `carries_records`;
//! - the [`Message`] impl of every meta type (checked at compile time to be readable in
//!   place);
//! - the [`Request`] enum (encode, decode, [`Request::route`], [`Request::group`]) and the
//!   [`Handlers`] trait with one method per request, which [`Request::dispatch`] calls;
//! - the [`Response`] enum with its encoder and decoder;
//! - [`KIND_NUMBERS`], the (name, number) list the stability test compares with its frozen
//!   copy (`kind.rs`).
//!
//! Adding a request: its types in `messages.rs`, one line in `requests` below (a new number
//! in its group of tens, never a reused one), and its handler (the compiler asks for it in
//! every [`Handlers`] implementation).

use rkyv::rancor;

use super::error::ProtocolError;
use super::frame::{encode_frame, AlignedMeta, Flags, Frame, Message, MetaWriter, META_ALIGN};
use super::kind::KindClass;
use super::messages::*;
use super::route::Route;

/// The type a response variant holds: the meta part, or the meta part with stored records.
macro_rules! response_body {
    ($meta:ident records) => { WithRecords<'a, $meta> };
    ($meta:ident) => { $meta };
}

/// Whether a response kind carries stored records after its meta part.
macro_rules! is_records {
    (records) => {
        true
    };
    () => {
        false
    };
}

/// A response variant's parts for the encoder: (meta, raw tail).
macro_rules! response_parts {
    ($m:ident records) => {
        ($m.meta(), $m.raw_records())
    };
    ($m:ident) => {
        ($m, &[][..])
    };
}

/// A response variant's value decoded from a frame's meta part and tail.
macro_rules! response_decode {
    ($meta:ident, $tail:expr, records) => {
        WithRecords::new($meta.deserialize()?, $tail)
    };
    ($meta:ident, $tail:expr,) => {
        $meta.deserialize()?
    };
}

/// The group a request names, if its registry line says how to find it.
macro_rules! group_of {
    ($r:ident) => {{
        let _ = $r;
        None
    }};
    ($r:ident; $m:ident => $group:expr) => {{
        let $m = $r;
        Some::<&str>($group)
    }};
}

/// Implements [`Message`] with rkyv's checked API, and checks at compile time that the
/// archived form can be read in place at [`META_ALIGN`].
macro_rules! impl_message {
    ($ty:ident, $kind:ident $(, $hint:path)?) => {
        impl Message for $ty {
            const KIND: Kind = Kind::$kind;
            fn write_meta(&self, out: &mut Vec<u8>) -> Result<(), rancor::Error> {
                rkyv::api::high::to_bytes_in::<_, rancor::Error>(self, MetaWriter::new(out))
                    .map(|_| ())
            }
            fn write_meta_parts(
                &self,
                out: &mut Vec<u8>,
                shared: &mut Vec<(usize, bytes::Bytes)>,
            ) -> Result<(), rancor::Error> {
                rkyv::api::high::to_bytes_in::<_, rancor::Error>(
                    self,
                    MetaWriter::with_parts(out, shared),
                )
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
            fn explain_meta(bytes: &[u8]) -> String {
                match rkyv::access::<<Self as rkyv::Archive>::Archived, rancor::BoxedError>(bytes) {
                    Err(e) => e.to_string(),
                    Ok(_) => "the meta part does not deserialize".to_owned(),
                }
            }
        }
        const _: () =
            assert!(std::mem::align_of::<<$ty as rkyv::Archive>::Archived>() <= META_ALIGN);
    };
}

macro_rules! registry {
    (
        requests {$(
            $(#[$rdoc:meta])*
            $req:ident = $rnum:literal => $reply:ident, $method:ident,
                route($rm:ident) $route:expr
                $(, group($gm:ident) $group:expr)?
                $(, client($cm:ident) $client:expr)?
                $(, hint $hint:path)?
            ;
        )*}
        responses {$(
            $(#[$pdoc:meta])*
            $resp:ident = $pnum:literal => $variant:ident($meta:ident $($records:ident)?);
        )*}
        pushes {$(
            $(#[$udoc:meta])*
            $push:ident = $unum:literal;
        )*}
    ) => {
        /// Every frame kind, with its stable wire number.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum Kind {
            $($(#[$rdoc])* $req = $rnum,)*
            $($(#[$pdoc])* $resp = $pnum,)*
            $($(#[$udoc])* $push = $unum,)*
        }

        $(const _: () = assert!($rnum > 0 && $rnum < super::kind::KIND_RESPONSE_FIRST);)*
        $(const _: () = assert!(
            $pnum >= super::kind::KIND_RESPONSE_FIRST && $pnum < super::kind::KIND_PUSH_FIRST
        );)*
        $(const _: () = assert!(
            $unum >= super::kind::KIND_PUSH_FIRST && $unum < super::kind::KIND_PUSH_END
        );)*

        /// Number of kinds this side knows.
        const KIND_COUNT: usize = [$(stringify!($req),)* $(stringify!($resp),)* $(stringify!($push),)*].len();

        /// Every kind's name and number, in registry order: the stability test compares it
        /// with its frozen copy.
        pub const KIND_NUMBERS: [(&str, u16); KIND_COUNT] = [
            $((stringify!($req), $rnum),)*
            $((stringify!($resp), $pnum),)*
            $((stringify!($push), $unum),)*
        ];

        impl Kind {
            /// Every kind, in number order.
            pub const ALL: [Kind; KIND_COUNT] = [$(Kind::$req,)* $(Kind::$resp,)* $(Kind::$push,)*];

            /// The kind with this wire number, if it is one this side knows.
            pub fn from_u16(n: u16) -> Option<Kind> {
                match n {
                    $($rnum => Some(Kind::$req),)*
                    $($pnum => Some(Kind::$resp),)*
                    $($unum => Some(Kind::$push),)*
                    _ => None,
                }
            }

            /// The response kind a successful answer to this request has (an error answer
            /// is always [`Kind::Error`]). `None` for kinds that are not requests.
            pub fn success_reply(self) -> Option<Kind> {
                match self {
                    $(Kind::$req => Some(Kind::$reply),)*
                    _ => None,
                }
            }

            /// The kind's name, as in the registry.
            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$req => stringify!($req),)*
                    $(Kind::$resp => stringify!($resp),)*
                    $(Kind::$push => stringify!($push),)*
                }
            }

            /// Whether the payload may carry raw stored records after its meta part.
            pub fn carries_records(self) -> bool {
                match self {
                    $(Kind::$resp => is_records!($($records)?),)*
                    _ => false,
                }
            }
        }

        $(impl_message!($req, $req $(, $hint)?);)*
        $(impl_message!($meta, $resp);)*
        $(impl_message!($push, $push);)*

        /// Every request a client can send. The server dispatches on it.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Request {
            $($req($req),)*
        }

        $(impl From<$req> for Request {
            fn from(m: $req) -> Request {
                Request::$req(m)
            }
        })*

        /// One handler per request kind; [`Request::dispatch`] calls the one that fits.
        pub trait Handlers {
            /// What a handler gives back (for the broker: the answer, now or later).
            type Out;
            $(fn $method(&self, m: $req) -> Self::Out;)*
        }

        impl Request {
            pub fn kind(&self) -> Kind {
                match self {
                    $(Request::$req(_) => Kind::$req,)*
                }
            }

            /// Which shard handles this request (see [`Route`]).
            pub fn route(&self) -> Route<'_> {
                match self {
                    $(Request::$req($rm) => $route,)*
                }
            }

            /// The consumer or producer group this request names, for the checks every group
            /// name gets (before anything is kept of it).
            pub fn group(&self) -> Option<&str> {
                match self {
                    $(Request::$req(r) => group_of!(r $(; $gm => $group)?),)*
                }
            }

            /// The client id this request names, for the checks every client id gets.
            pub fn client_id(&self) -> Option<&str> {
                match self {
                    $(Request::$req(r) => group_of!(r $(; $cm => $client)?),)*
                }
            }

            /// Calls the handler of this request's kind.
            pub fn dispatch<H: Handlers + ?Sized>(self, h: &H) -> H::Out {
                match self {
                    $(Request::$req(m) => h.$method(m),)*
                }
            }

            pub(super) fn encode_with(
                &self,
                request_id: u64,
                flags: Flags,
                out: &mut Vec<u8>,
            ) -> Result<usize, ProtocolError> {
                match self {
                    $(Request::$req(m) => encode_frame(request_id, flags, m, &[], out),)*
                }
            }

            pub(super) fn decode_meta(meta: &AlignedMeta<'_>) -> Result<Request, ProtocolError> {
                match meta.kind() {
                    $(Kind::$req => meta.deserialize::<$req>().map(Request::$req),)*
                    found => Err(ProtocolError::UnexpectedKind {
                        expected: KindClass::Request,
                        found,
                    }),
                }
            }
        }

        /// Every response a broker can send. Record-carrying answers borrow their records
        /// from the frame they were decoded from (or, when encoding, from wherever the
        /// server holds them).
        #[derive(Debug, Clone, PartialEq)]
        pub enum Response<'a> {
            $($variant(response_body!($meta $($records)?)),)*
        }

        $(impl<'a> From<response_body!($meta $($records)?)> for Response<'a> {
            fn from(m: response_body!($meta $($records)?)) -> Response<'a> {
                Response::$variant(m)
            }
        })*

        impl Response<'_> {
            pub fn kind(&self) -> Kind {
                match self {
                    $(Response::$variant(_) => Kind::$resp,)*
                }
            }
        }

        /// Appends a response frame to `out` (records included); returns its length.
        pub fn encode_response(
            response: &Response<'_>,
            request_id: u64,
            out: &mut Vec<u8>,
        ) -> Result<usize, ProtocolError> {
            match response {
                $(Response::$variant(m) => {
                    let (meta, tail) = response_parts!(m $($records)?);
                    encode_frame(request_id, Flags::NONE, meta, tail, out)
                })*
            }
        }

        impl<'a> Frame<'a> {
            /// The response this frame carries; an error if it is not a response.
            pub fn decode_response(&self) -> Result<Response<'a>, ProtocolError> {
                let meta = self.aligned_meta();
                Ok(match self.kind() {
                    $(Kind::$resp => Response::$variant(
                        response_decode!(meta, self.tail(), $($records)?)
                    ),)*
                    found => {
                        return Err(ProtocolError::UnexpectedKind {
                            expected: KindClass::Response,
                            found,
                        })
                    }
                })
            }
        }
    };
}

registry! {
    requests {
        // Session.
        /// First request on a connection.
        Handshake = 1 => HandshakeOk, handshake, route(_m) Route::Local,
            client(m) &m.client_id;
        Heartbeat = 2 => Empty, heartbeat, route(_m) Route::Local, client(m) &m.client_id;
        /// First request on a connection (this version): answered with the broker's limits.
        Handshake2 = 3 => HandshakeOk2, handshake2, route(_m) Route::Local,
            client(m) &m.client_id;
        // Produce.
        SendMessage = 10 => SendResult, send_message,
            route(m) Route::queue_or_local(&m.topic, m.queue_id), hint send_message_len_hint;
        SendBatch = 11 => SendBatchResult, send_batch,
            route(m) Route::queue_or_local(&m.topic, m.queue_id), hint send_batch_len_hint;
        // Transactions.
        ProducerHeartbeat = 12 => Empty, producer_heartbeat,
            route(m) Route::Coordinator(&m.group), group(m) &m.group, client(m) &m.client_id;
        EndTransaction = 13 => Empty, end_transaction,
            route(m) Route::queue(&m.topic, m.queue_id);
        /// Single sends to several queues of one shard, packed by a producer.
        SendMulti = 14 => SendMultiResult, send_multi,
            route(m) Route::queue_or_local(&m.topic, send_multi_queue(m)),
            hint send_multi_len_hint;
        // Consume.
        Pull = 20 => PullResult, pull, route(m) Route::queue(&m.topic, m.queue_id);
        GetMinOffset = 21 => Offset, get_min_offset, route(m) Route::queue(&m.topic, m.queue_id);
        GetMaxOffset = 22 => Offset, get_max_offset, route(m) Route::queue(&m.topic, m.queue_id);
        SearchOffsetByTimestamp = 23 => Offset, search_offset_by_timestamp,
            route(m) Route::queue(&m.topic, m.queue_id);
        // Committed offsets of consumer groups.
        CommitOffset = 30 => Empty, commit_offset,
            route(m) Route::queue(&m.topic, m.queue_id), group(m) &m.group;
        QueryOffset = 31 => Offset, query_offset,
            route(m) Route::queue(&m.topic, m.queue_id), group(m) &m.group;
        // Topic admin.
        CreateTopic = 40 => Empty, create_topic, route(_m) Route::TopicKeeper;
        UpdateTopic = 41 => Empty, update_topic, route(_m) Route::TopicKeeper;
        DeleteTopic = 42 => Empty, delete_topic, route(_m) Route::TopicKeeper;
        ListTopics = 43 => TopicList, list_topics, route(_m) Route::Local;
        DescribeTopic = 44 => TopicInfo, describe_topic, route(_m) Route::Local;
        // Message queries.
        MessageById = 50 => Records, message_by_id, route(m) Route::MessageId(&m.msg_id);
        MessagesByKey = 51 => Records, messages_by_key, route(_m) Route::Local;
        // Consumer groups.
        GroupHeartbeat = 60 => Assignment, group_heartbeat,
            route(m) Route::Coordinator(&m.group), group(m) &m.group, client(m) &m.client_id;
        Unregister = 61 => Empty, unregister,
            route(m) Route::Coordinator(&m.group), group(m) &m.group, client(m) &m.client_id;
        QueryAssignment = 62 => Assignment, query_assignment,
            route(m) Route::Coordinator(&m.group), group(m) &m.group, client(m) &m.client_id;
        GroupMembers = 63 => GroupMembersInfo, group_members,
            route(m) Route::Coordinator(&m.group), group(m) &m.group;
        ResetOffset = 64 => Empty, reset_offset, route(_m) Route::Local, group(m) &m.group;
        ConsumerProgress = 65 => Progress, consumer_progress,
            route(_m) Route::Local, group(m) &m.group;
        DeleteGroup = 66 => Empty, delete_group,
            route(m) Route::Coordinator(&m.group), group(m) &m.group;
        // Queue locks (split by owning shard by the handler).
        LockBatch = 70 => Locked, lock_batch, route(_m) Route::Local, group(m) &m.group,
            client(m) &m.client_id;
        UnlockBatch = 71 => Empty, unlock_batch, route(_m) Route::Local, group(m) &m.group,
            client(m) &m.client_id;
        // Retried and delayed messages.
        ConsumerSendBack = 90 => SendBackResult, consumer_send_back,
            route(m) Route::MessageId(&m.msg_id), group(m) &m.group;
        ScheduleStats = 91 => ScheduleInfo, schedule_stats, route(_m) Route::Local;
        ListTransactions = 92 => TransactionList, list_transactions, route(_m) Route::Local;
    }
    responses {
        Error = 1000 => Error(ErrorBody);
        Empty = 1001 => Empty(Empty);
        HandshakeOk = 1002 => HandshakeOk(HandshakeOk);
        SendResult = 1003 => SendResult(SendResult);
        SendBatchResult = 1004 => SendBatchResult(SendBatchResult);
        PullResult = 1005 => Pull(PullResult records);
        Offset = 1006 => Offset(Offset);
        TopicList = 1007 => TopicList(TopicList);
        TopicInfo = 1008 => TopicInfo(TopicInfo);
        Records = 1009 => Records(Records records);
        Assignment = 1010 => Assignment(Assignment);
        GroupMembersInfo = 1011 => GroupMembersInfo(GroupMembersInfo);
        Progress = 1012 => Progress(Progress);
        Locked = 1013 => Locked(Locked);
        SendBackResult = 1014 => SendBackResult(SendBackResult);
        ScheduleInfo = 1015 => ScheduleInfo(ScheduleInfo);
        HandshakeOk2 = 1016 => HandshakeOk2(HandshakeOk2);
        TransactionList = 1017 => TransactionList(TransactionList);
        SendMultiResult = 1018 => SendMultiResult(SendMultiResult);
    }
    pushes {
        RebalanceNotify = 2000;
        CheckTransaction = 2001;
    }
}
