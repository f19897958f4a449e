//! Errors of the wire protocol: [`ErrorCode`], the stable numbers a client sees in an error
//! response, and [`ProtocolError`], why bytes from the other side do not decode.

use crate::protocol::record::RecordError;

use super::kind::{Kind, KindClass};

/// The stable numeric error codes carried by an error response.
///
/// A code's number is part of the wire format: numbers are never changed, and a retired code
/// keeps its number reserved forever. Codes are grouped by tens: frames `1..`, topics and
/// messages `10..`, offsets `20..`, storage `30..`, availability `40..`, filters `50..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum ErrorCode {
    /// The frame does not decode (bad header, flags or payload).
    MalformedFrame = 1,
    /// The frame is larger than the receiver's limit.
    FrameTooLarge = 2,
    /// The frame's kind is unknown to the receiver.
    UnknownKind = 3,
    /// The frame's protocol version is not one the receiver speaks.
    UnsupportedVersion = 4,
    TopicNotFound = 10,
    TopicExists = 11,
    /// Empty, too long, or with characters a topic name may not have.
    InvalidTopic = 12,
    /// The body is larger than the 4 MiB limit.
    BodyTooLarge = 13,
    /// Malformed properties, or a message that breaks another record limit.
    InvalidMessage = 14,
    QueueNotFound = 15,
    /// A delay level, delay or delivery time the broker does not accept (no such level,
    /// beyond the longest delay, not a number, in a batch).
    InvalidDelay = 16,
    /// No committed offset for that (group, topic, queue).
    OffsetNotFound = 20,
    OffsetTooSmall = 21,
    OffsetTooBig = 22,
    /// The group's offsets were reset after the committer read its position (the commit
    /// names an earlier offsets epoch than the reset's): not stored. The member re-reads
    /// its committed offsets when it learns the new epoch.
    OffsetsReset = 23,
    /// The log refuses writes after an I/O error until it is reopened.
    StoreUnavailable = 30,
    /// An I/O error while serving this request.
    StoreIo = 31,
    /// Stored data read back is damaged (the message names the file and the offset).
    StoreCorrupt = 32,
    /// The data directory's disk is full (or below the broker's free-space floor): nothing
    /// of the request was stored. Sends succeed again once space is freed, without a
    /// restart.
    DiskFull = 33,
    /// The request's records were appended, then their write or fdatasync failed (or its
    /// outcome was lost): they may be stored, and read by consumers, or not. A send retried
    /// after this may be stored twice (at least once).
    StoreUnsure = 34,
    Timeout = 40,
    /// The shard that owns the queue does not answer (stopping, overloaded).
    ShardUnavailable = 41,
    /// The shard's schedule of delayed messages is full; try again later.
    ScheduleFull = 42,
    /// The broker serves as many connections as it may (`--connections-max`).
    TooManyConnections = 43,
    /// A concurrent change (a topic deleted while it was auto-created) made the request
    /// fail; the same request may succeed again.
    Conflict = 44,
    /// A configured limit of the broker is reached (topics, auto-created topics, groups,
    /// committed offsets); the message names it.
    LimitReached = 45,
    /// The shard's sends wait too long for the disk (flow control): nothing of the request
    /// was stored; the producer backs off and sends again.
    BrokerBusy = 46,
    BadFilterExpression = 50,
    /// The consumer group has no such member (it never joined, or its session expired).
    GroupNotFound = 60,
    /// Another live connection is a member of the group under the same client id.
    ClientIdInUse = 61,
    /// No transaction with that id waits for an outcome on the queue's shard (never
    /// existed, or resolved too long ago to be remembered).
    TransactionNotFound = 70,
    /// The transaction already has the other outcome (a commit after a rollback, or the
    /// reverse); the same outcome again is accepted.
    TransactionResolved = 71,
    /// A bug on the broker side.
    Internal = 99,
}

impl ErrorCode {
    /// Every code, in number order.
    pub const ALL: [ErrorCode; 33] = [
        ErrorCode::MalformedFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::UnknownKind,
        ErrorCode::UnsupportedVersion,
        ErrorCode::TopicNotFound,
        ErrorCode::TopicExists,
        ErrorCode::InvalidTopic,
        ErrorCode::BodyTooLarge,
        ErrorCode::InvalidMessage,
        ErrorCode::QueueNotFound,
        ErrorCode::InvalidDelay,
        ErrorCode::OffsetNotFound,
        ErrorCode::OffsetTooSmall,
        ErrorCode::OffsetTooBig,
        ErrorCode::OffsetsReset,
        ErrorCode::StoreUnavailable,
        ErrorCode::StoreIo,
        ErrorCode::StoreCorrupt,
        ErrorCode::DiskFull,
        ErrorCode::StoreUnsure,
        ErrorCode::Timeout,
        ErrorCode::ShardUnavailable,
        ErrorCode::ScheduleFull,
        ErrorCode::TooManyConnections,
        ErrorCode::Conflict,
        ErrorCode::LimitReached,
        ErrorCode::BrokerBusy,
        ErrorCode::BadFilterExpression,
        ErrorCode::GroupNotFound,
        ErrorCode::ClientIdInUse,
        ErrorCode::TransactionNotFound,
        ErrorCode::TransactionResolved,
        ErrorCode::Internal,
    ];

    /// The code with this number, if this side knows it. A client that meets a code from a
    /// newer broker keeps the number and the message text.
    pub fn from_u16(n: u16) -> Option<ErrorCode> {
        Some(match n {
            1 => ErrorCode::MalformedFrame,
            2 => ErrorCode::FrameTooLarge,
            3 => ErrorCode::UnknownKind,
            4 => ErrorCode::UnsupportedVersion,
            10 => ErrorCode::TopicNotFound,
            11 => ErrorCode::TopicExists,
            12 => ErrorCode::InvalidTopic,
            13 => ErrorCode::BodyTooLarge,
            14 => ErrorCode::InvalidMessage,
            15 => ErrorCode::QueueNotFound,
            16 => ErrorCode::InvalidDelay,
            20 => ErrorCode::OffsetNotFound,
            21 => ErrorCode::OffsetTooSmall,
            22 => ErrorCode::OffsetTooBig,
            23 => ErrorCode::OffsetsReset,
            30 => ErrorCode::StoreUnavailable,
            31 => ErrorCode::StoreIo,
            32 => ErrorCode::StoreCorrupt,
            33 => ErrorCode::DiskFull,
            34 => ErrorCode::StoreUnsure,
            40 => ErrorCode::Timeout,
            41 => ErrorCode::ShardUnavailable,
            42 => ErrorCode::ScheduleFull,
            43 => ErrorCode::TooManyConnections,
            44 => ErrorCode::Conflict,
            45 => ErrorCode::LimitReached,
            46 => ErrorCode::BrokerBusy,
            50 => ErrorCode::BadFilterExpression,
            60 => ErrorCode::GroupNotFound,
            61 => ErrorCode::ClientIdInUse,
            70 => ErrorCode::TransactionNotFound,
            71 => ErrorCode::TransactionResolved,
            99 => ErrorCode::Internal,
            _ => return None,
        })
    }

    /// The wire number.
    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// Whether sending the same request again (possibly to another queue or broker, after a
    /// pause) may succeed: the request itself was not at fault. A producer retries these; it
    /// gives up at once on the others.
    pub fn is_retriable(self) -> bool {
        match self {
            ErrorCode::StoreUnavailable
            | ErrorCode::StoreIo
            | ErrorCode::DiskFull
            | ErrorCode::StoreUnsure
            | ErrorCode::Timeout
            | ErrorCode::ShardUnavailable
            | ErrorCode::ScheduleFull
            | ErrorCode::TooManyConnections
            | ErrorCode::BrokerBusy
            | ErrorCode::Conflict => true,
            ErrorCode::GroupNotFound
            | ErrorCode::ClientIdInUse
            | ErrorCode::TransactionNotFound
            | ErrorCode::TransactionResolved
            | ErrorCode::StoreCorrupt
            | ErrorCode::LimitReached
            | ErrorCode::MalformedFrame
            | ErrorCode::FrameTooLarge
            | ErrorCode::UnknownKind
            | ErrorCode::UnsupportedVersion
            | ErrorCode::TopicNotFound
            | ErrorCode::TopicExists
            | ErrorCode::InvalidTopic
            | ErrorCode::BodyTooLarge
            | ErrorCode::InvalidMessage
            | ErrorCode::QueueNotFound
            | ErrorCode::InvalidDelay
            | ErrorCode::OffsetNotFound
            | ErrorCode::OffsetTooSmall
            | ErrorCode::OffsetTooBig
            | ErrorCode::OffsetsReset
            | ErrorCode::BadFilterExpression
            | ErrorCode::Internal => false,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}({})", self, *self as u16)
    }
}

/// Why bytes received from the other side are not a valid frame, or why a frame cannot be
/// encoded. Each variant says what was expected and what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("frame truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("bad frame magic {found:#04x}, expected {expected:#04x}")]
    BadMagic { found: u8, expected: u8 },
    #[error("unsupported protocol version {found}, this side speaks version {supported}")]
    UnsupportedVersion { found: u8, supported: u8 },
    #[error("frame of {len} bytes is larger than the limit of {max} bytes")]
    FrameTooLarge { len: u64, max: u32 },
    #[error("frame length {len} is smaller than the {min}-byte header")]
    FrameTooSmall { len: u32, min: u32 },
    #[error("meta part of {meta_len} bytes exceeds the payload of {payload_len} bytes")]
    MetaTooLong { meta_len: u32, payload_len: u32 },
    #[error("unknown frame kind {0}")]
    UnknownKind(u16),
    #[error("flags {flags:#x} are invalid for a {kind} frame: {reason}")]
    BadFlags {
        kind: Kind,
        flags: u32,
        reason: &'static str,
    },
    #[error("expected a {expected:?} frame, found {found}")]
    UnexpectedKind { expected: KindClass, found: Kind },
    #[error("expected a {expected} frame, found {found}")]
    KindMismatch { expected: Kind, found: Kind },
    #[error("{kind} frame carries {tail_len} raw bytes after its meta part, expected none")]
    UnexpectedTail { kind: Kind, tail_len: usize },
    #[error("payload is {found} bytes, the frame header says {expected}")]
    PayloadLength { expected: usize, found: usize },
    #[error("meta part of a {kind} frame does not decode: {reason}")]
    BadPayload { kind: Kind, reason: String },
    #[error("bad record in the raw tail: {0}")]
    BadRecord(#[from] RecordError),
    #[error("raw tail holds {found} records, the meta part says {expected}")]
    RecordCount { expected: u32, found: u32 },
    #[error("cannot encode a {kind} frame: {reason}")]
    Encode { kind: Kind, reason: String },
    #[error("frame limit of {found} bytes is outside [{min}, {max}]")]
    BadLimit { found: u32, min: u32, max: u32 },
}

impl ProtocolError {
    /// The code an error response about this failure carries.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtocolError::Truncated { .. }
            | ProtocolError::BadMagic { .. }
            | ProtocolError::FrameTooSmall { .. }
            | ProtocolError::MetaTooLong { .. }
            | ProtocolError::BadFlags { .. }
            | ProtocolError::UnexpectedKind { .. }
            | ProtocolError::KindMismatch { .. }
            | ProtocolError::UnexpectedTail { .. }
            | ProtocolError::PayloadLength { .. }
            | ProtocolError::BadPayload { .. }
            | ProtocolError::BadRecord(_)
            | ProtocolError::RecordCount { .. } => ErrorCode::MalformedFrame,
            ProtocolError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            ProtocolError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            ProtocolError::UnknownKind(_) => ErrorCode::UnknownKind,
            ProtocolError::Encode { .. } | ProtocolError::BadLimit { .. } => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_u16_is_the_inverse_of_as_u16_over_the_whole_range() {
        let mut known = 0;
        for n in 0..=u16::MAX {
            if let Some(code) = ErrorCode::from_u16(n) {
                assert_eq!(code.as_u16(), n);
                assert!(ErrorCode::ALL.contains(&code));
                known += 1;
            }
        }
        assert_eq!(known, ErrorCode::ALL.len());
        assert!(ErrorCode::ALL.windows(2).all(|w| w[0] < w[1]));
    }

    /// The numbers are the wire format; a failing line here breaks deployed clients.
    #[test]
    fn numbers_are_stable() {
        let expected: [(ErrorCode, u16); 32] = [
            (ErrorCode::MalformedFrame, 1),
            (ErrorCode::FrameTooLarge, 2),
            (ErrorCode::UnknownKind, 3),
            (ErrorCode::UnsupportedVersion, 4),
            (ErrorCode::TopicNotFound, 10),
            (ErrorCode::TopicExists, 11),
            (ErrorCode::InvalidTopic, 12),
            (ErrorCode::BodyTooLarge, 13),
            (ErrorCode::InvalidMessage, 14),
            (ErrorCode::QueueNotFound, 15),
            (ErrorCode::OffsetNotFound, 20),
            (ErrorCode::OffsetTooSmall, 21),
            (ErrorCode::OffsetTooBig, 22),
            (ErrorCode::OffsetsReset, 23),
            (ErrorCode::StoreUnavailable, 30),
            (ErrorCode::StoreIo, 31),
            (ErrorCode::Timeout, 40),
            (ErrorCode::ShardUnavailable, 41),
            (ErrorCode::ScheduleFull, 42),
            (ErrorCode::TooManyConnections, 43),
            (ErrorCode::Conflict, 44),
            (ErrorCode::ClientIdInUse, 61),
            (ErrorCode::StoreCorrupt, 32),
            (ErrorCode::DiskFull, 33),
            (ErrorCode::LimitReached, 45),
            (ErrorCode::BrokerBusy, 46),
            (ErrorCode::StoreUnsure, 34),
            (ErrorCode::InvalidDelay, 16),
            (ErrorCode::BadFilterExpression, 50),
            (ErrorCode::TransactionNotFound, 70),
            (ErrorCode::TransactionResolved, 71),
            (ErrorCode::Internal, 99),
        ];
        for (code, n) in expected {
            assert_eq!(code.as_u16(), n, "{code:?}");
        }
    }

    #[test]
    fn retriable_codes_are_the_transient_ones() {
        let retriable: Vec<_> = ErrorCode::ALL
            .into_iter()
            .filter(|c| c.is_retriable())
            .collect();
        assert_eq!(
            retriable,
            vec![
                ErrorCode::StoreUnavailable,
                ErrorCode::StoreIo,
                ErrorCode::DiskFull,
                ErrorCode::StoreUnsure,
                ErrorCode::Timeout,
                ErrorCode::ShardUnavailable,
                ErrorCode::ScheduleFull,
                ErrorCode::TooManyConnections,
                ErrorCode::Conflict,
                ErrorCode::BrokerBusy
            ]
        );
    }

    #[test]
    fn protocol_errors_map_to_codes() {
        let check = |e: ProtocolError, code: ErrorCode| assert_eq!(e.code(), code, "{e}");
        check(
            ProtocolError::BadMagic {
                found: 0,
                expected: 1,
            },
            ErrorCode::MalformedFrame,
        );
        check(
            ProtocolError::FrameTooLarge { len: 10, max: 5 },
            ErrorCode::FrameTooLarge,
        );
        check(ProtocolError::UnknownKind(777), ErrorCode::UnknownKind);
        check(
            ProtocolError::UnsupportedVersion {
                found: 9,
                supported: 1,
            },
            ErrorCode::UnsupportedVersion,
        );
        check(
            ProtocolError::BadRecord(RecordError::BadTopic),
            ErrorCode::MalformedFrame,
        );
        check(
            ProtocolError::Encode {
                kind: Kind::Pull,
                reason: "x".into(),
            },
            ErrorCode::Internal,
        );
    }

    #[test]
    fn messages_say_what_was_expected_and_found() {
        let e = ProtocolError::BadMagic {
            found: 0x47,
            expected: 0x52,
        };
        assert_eq!(e.to_string(), "bad frame magic 0x47, expected 0x52");
        let e = ProtocolError::FrameTooLarge { len: 100, max: 50 };
        assert_eq!(
            e.to_string(),
            "frame of 100 bytes is larger than the limit of 50 bytes"
        );
    }
}
