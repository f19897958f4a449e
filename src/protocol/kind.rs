//! Frame kinds: the stable registry of every request, response and pushed notification the
//! native protocol knows.
//!
//! A kind's number is part of the wire format. Numbers are never changed and never reused:
//! a retired kind keeps its number reserved forever. The number also says what a frame is:
//!
//! | range        | class                                 |
//! |--------------|---------------------------------------|
//! | `1..=999`    | requests (client to broker)           |
//! | `1000..=1999`| responses (broker to client)          |
//! | `2000..=2999`| pushed notifications (broker to client) |
//!
//! Requests are grouped by tens so related kinds stay together when new ones are added:
//! session `1..`, produce `10..`, consume `20..`, offsets `30..`, topic admin `40..`,
//! queries `50..`; `60..` is kept for consumer groups, `70..` for queue locks, `80..` for
//! transactions, `90..` for delayed and retried messages.

/// Where a kind's number falls: who sends it and whether it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KindClass {
    /// Sent by a client; answered by one response with the same request id (unless oneway).
    Request,
    /// Sent by the broker in answer to a request.
    Response,
    /// Sent by the broker unasked (rebalance, lock loss); never answered.
    Push,
}

/// Every frame kind, with its stable wire number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Kind {
    // Session.
    Handshake = 1,
    Heartbeat = 2,
    // Produce.
    SendMessage = 10,
    SendBatch = 11,
    // Consume.
    Pull = 20,
    GetMinOffset = 21,
    GetMaxOffset = 22,
    SearchOffsetByTimestamp = 23,
    // Committed offsets of consumer groups.
    CommitOffset = 30,
    QueryOffset = 31,
    // Topic admin.
    CreateTopic = 40,
    UpdateTopic = 41,
    DeleteTopic = 42,
    ListTopics = 43,
    DescribeTopic = 44,
    // Message queries.
    MessageById = 50,
    MessagesByKey = 51,
    // Consumer groups.
    GroupHeartbeat = 60,
    Unregister = 61,
    QueryAssignment = 62,
    GroupMembers = 63,
    ResetOffset = 64,
    ConsumerProgress = 65,
    // Queue locks.
    LockBatch = 70,
    UnlockBatch = 71,

    // Responses.
    Error = 1000,
    Empty = 1001,
    HandshakeOk = 1002,
    SendResult = 1003,
    SendBatchResult = 1004,
    PullResult = 1005,
    Offset = 1006,
    TopicList = 1007,
    TopicInfo = 1008,
    Records = 1009,
    Assignment = 1010,
    GroupMembersInfo = 1011,
    Progress = 1012,
    Locked = 1013,

    // Pushed notifications.
    RebalanceNotify = 2000,
}

/// First number of the response range.
pub const KIND_RESPONSE_FIRST: u16 = 1000;
/// First number of the pushed-notification range.
pub const KIND_PUSH_FIRST: u16 = 2000;
/// One past the last number of the pushed-notification range.
pub const KIND_PUSH_END: u16 = 3000;

impl Kind {
    /// Every kind, in number order.
    pub const ALL: [Kind; 40] = [
        Kind::Handshake,
        Kind::Heartbeat,
        Kind::SendMessage,
        Kind::SendBatch,
        Kind::Pull,
        Kind::GetMinOffset,
        Kind::GetMaxOffset,
        Kind::SearchOffsetByTimestamp,
        Kind::CommitOffset,
        Kind::QueryOffset,
        Kind::CreateTopic,
        Kind::UpdateTopic,
        Kind::DeleteTopic,
        Kind::ListTopics,
        Kind::DescribeTopic,
        Kind::MessageById,
        Kind::MessagesByKey,
        Kind::GroupHeartbeat,
        Kind::Unregister,
        Kind::QueryAssignment,
        Kind::GroupMembers,
        Kind::ResetOffset,
        Kind::ConsumerProgress,
        Kind::LockBatch,
        Kind::UnlockBatch,
        Kind::Error,
        Kind::Empty,
        Kind::HandshakeOk,
        Kind::SendResult,
        Kind::SendBatchResult,
        Kind::PullResult,
        Kind::Offset,
        Kind::TopicList,
        Kind::TopicInfo,
        Kind::Records,
        Kind::Assignment,
        Kind::GroupMembersInfo,
        Kind::Progress,
        Kind::Locked,
        Kind::RebalanceNotify,
    ];

    /// The kind with this wire number, if it is one this side knows.
    pub fn from_u16(n: u16) -> Option<Kind> {
        Some(match n {
            1 => Kind::Handshake,
            2 => Kind::Heartbeat,
            10 => Kind::SendMessage,
            11 => Kind::SendBatch,
            20 => Kind::Pull,
            21 => Kind::GetMinOffset,
            22 => Kind::GetMaxOffset,
            23 => Kind::SearchOffsetByTimestamp,
            30 => Kind::CommitOffset,
            31 => Kind::QueryOffset,
            40 => Kind::CreateTopic,
            41 => Kind::UpdateTopic,
            42 => Kind::DeleteTopic,
            43 => Kind::ListTopics,
            44 => Kind::DescribeTopic,
            50 => Kind::MessageById,
            51 => Kind::MessagesByKey,
            60 => Kind::GroupHeartbeat,
            61 => Kind::Unregister,
            62 => Kind::QueryAssignment,
            63 => Kind::GroupMembers,
            64 => Kind::ResetOffset,
            65 => Kind::ConsumerProgress,
            70 => Kind::LockBatch,
            71 => Kind::UnlockBatch,
            1000 => Kind::Error,
            1001 => Kind::Empty,
            1002 => Kind::HandshakeOk,
            1003 => Kind::SendResult,
            1004 => Kind::SendBatchResult,
            1005 => Kind::PullResult,
            1006 => Kind::Offset,
            1007 => Kind::TopicList,
            1008 => Kind::TopicInfo,
            1009 => Kind::Records,
            1010 => Kind::Assignment,
            1011 => Kind::GroupMembersInfo,
            1012 => Kind::Progress,
            1013 => Kind::Locked,
            2000 => Kind::RebalanceNotify,
            _ => return None,
        })
    }

    /// The wire number.
    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// Request, response or push, from the number range.
    pub fn class(self) -> KindClass {
        let n = self as u16;
        if n < KIND_RESPONSE_FIRST {
            KindClass::Request
        } else if n < KIND_PUSH_FIRST {
            KindClass::Response
        } else {
            KindClass::Push
        }
    }

    /// Whether the payload may carry raw stored records after its meta part.
    pub fn carries_records(self) -> bool {
        matches!(self, Kind::PullResult | Kind::Records)
    }

    /// The response kind a successful answer to this request has (an error answer is always
    /// [`Kind::Error`]). `None` for kinds that are not requests.
    pub fn success_reply(self) -> Option<Kind> {
        Some(match self {
            Kind::Handshake => Kind::HandshakeOk,
            Kind::Heartbeat => Kind::Empty,
            Kind::SendMessage => Kind::SendResult,
            Kind::SendBatch => Kind::SendBatchResult,
            Kind::Pull => Kind::PullResult,
            Kind::GetMinOffset | Kind::GetMaxOffset | Kind::SearchOffsetByTimestamp => Kind::Offset,
            Kind::CommitOffset => Kind::Empty,
            Kind::QueryOffset => Kind::Offset,
            Kind::CreateTopic | Kind::UpdateTopic | Kind::DeleteTopic => Kind::Empty,
            Kind::ListTopics => Kind::TopicList,
            Kind::DescribeTopic => Kind::TopicInfo,
            Kind::MessageById | Kind::MessagesByKey => Kind::Records,
            Kind::GroupHeartbeat | Kind::QueryAssignment => Kind::Assignment,
            Kind::Unregister | Kind::ResetOffset | Kind::UnlockBatch => Kind::Empty,
            Kind::GroupMembers => Kind::GroupMembersInfo,
            Kind::ConsumerProgress => Kind::Progress,
            Kind::LockBatch => Kind::Locked,
            Kind::Assignment
            | Kind::GroupMembersInfo
            | Kind::Progress
            | Kind::Locked
            | Kind::RebalanceNotify
            | Kind::Error
            | Kind::Empty
            | Kind::HandshakeOk
            | Kind::SendResult
            | Kind::SendBatchResult
            | Kind::PullResult
            | Kind::Offset
            | Kind::TopicList
            | Kind::TopicInfo
            | Kind::Records => return None,
        })
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}({})", self, *self as u16)
    }
}

const _: () = assert!(KIND_RESPONSE_FIRST < KIND_PUSH_FIRST && KIND_PUSH_FIRST < KIND_PUSH_END);
const _: () = assert!((Kind::UnlockBatch as u16) < KIND_RESPONSE_FIRST);
const _: () = assert!(Kind::Error as u16 == KIND_RESPONSE_FIRST);
const _: () = assert!((Kind::Locked as u16) < KIND_PUSH_FIRST);
const _: () = assert!((Kind::RebalanceNotify as u16) >= KIND_PUSH_FIRST);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_u16_is_the_inverse_of_as_u16_over_the_whole_range() {
        let mut known = 0;
        for n in 0..=u16::MAX {
            match Kind::from_u16(n) {
                Some(kind) => {
                    assert_eq!(kind.as_u16(), n);
                    assert!(Kind::ALL.contains(&kind));
                    known += 1;
                }
                None => assert!(Kind::ALL.iter().all(|k| k.as_u16() != n)),
            }
        }
        assert_eq!(known, Kind::ALL.len());
    }

    #[test]
    fn all_is_sorted_and_unique() {
        assert!(Kind::ALL.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn every_request_has_a_response_reply_and_nothing_else_has_one() {
        for kind in Kind::ALL {
            match kind.class() {
                KindClass::Request => {
                    let reply = kind.success_reply();
                    assert_eq!(reply.map(Kind::class), Some(KindClass::Response), "{kind}");
                    assert_ne!(reply, Some(Kind::Error));
                }
                KindClass::Response | KindClass::Push => {
                    assert_eq!(kind.success_reply(), None, "{kind}")
                }
            }
        }
    }

    #[test]
    fn only_record_carrying_responses_take_a_tail() {
        for kind in Kind::ALL {
            if kind.carries_records() {
                assert_eq!(kind.class(), KindClass::Response);
            }
        }
    }

    /// The numbers are the wire format: this test is the registry's tripwire. Changing an
    /// existing line here means breaking every deployed client.
    #[test]
    fn numbers_are_stable() {
        let expected: [(Kind, u16); 40] = [
            (Kind::Handshake, 1),
            (Kind::Heartbeat, 2),
            (Kind::SendMessage, 10),
            (Kind::SendBatch, 11),
            (Kind::Pull, 20),
            (Kind::GetMinOffset, 21),
            (Kind::GetMaxOffset, 22),
            (Kind::SearchOffsetByTimestamp, 23),
            (Kind::CommitOffset, 30),
            (Kind::QueryOffset, 31),
            (Kind::CreateTopic, 40),
            (Kind::UpdateTopic, 41),
            (Kind::DeleteTopic, 42),
            (Kind::ListTopics, 43),
            (Kind::DescribeTopic, 44),
            (Kind::MessageById, 50),
            (Kind::MessagesByKey, 51),
            (Kind::Error, 1000),
            (Kind::Empty, 1001),
            (Kind::HandshakeOk, 1002),
            (Kind::SendResult, 1003),
            (Kind::SendBatchResult, 1004),
            (Kind::PullResult, 1005),
            (Kind::Offset, 1006),
            (Kind::TopicList, 1007),
            (Kind::TopicInfo, 1008),
            (Kind::Records, 1009),
            (Kind::GroupHeartbeat, 60),
            (Kind::Unregister, 61),
            (Kind::QueryAssignment, 62),
            (Kind::GroupMembers, 63),
            (Kind::ResetOffset, 64),
            (Kind::ConsumerProgress, 65),
            (Kind::LockBatch, 70),
            (Kind::UnlockBatch, 71),
            (Kind::Assignment, 1010),
            (Kind::GroupMembersInfo, 1011),
            (Kind::Progress, 1012),
            (Kind::Locked, 1013),
            (Kind::RebalanceNotify, 2000),
        ];
        for (kind, n) in expected {
            assert_eq!(kind.as_u16(), n, "{kind:?}");
        }
    }
}
