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

pub use super::registry::{Kind, KIND_NUMBERS};

/// First number of the response range.
pub const KIND_RESPONSE_FIRST: u16 = 1000;
/// First number of the pushed-notification range.
pub const KIND_PUSH_FIRST: u16 = 2000;
/// One past the last number of the pushed-notification range.
pub const KIND_PUSH_END: u16 = 3000;

impl Kind {
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
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}({})", self, *self as u16)
    }
}

const _: () = assert!(KIND_RESPONSE_FIRST < KIND_PUSH_FIRST && KIND_PUSH_FIRST < KIND_PUSH_END);
const _: () = assert!(Kind::Error as u16 == KIND_RESPONSE_FIRST);
// Each registry section's numbers are checked against its range where they are declared.

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

    /// Numbers of released kinds, frozen: the registry must keep every one of them. Changing
    /// or removing a line here means breaking every deployed client. New kinds are added
    /// here when they are released (until then the registry alone holds them).
    const RELEASED: &str = "
        Handshake 1, Heartbeat 2, SendMessage 10, SendBatch 11, Pull 20, GetMinOffset 21,
        GetMaxOffset 22, SearchOffsetByTimestamp 23, CommitOffset 30, QueryOffset 31,
        CreateTopic 40, UpdateTopic 41, DeleteTopic 42, ListTopics 43, DescribeTopic 44,
        MessageById 50, MessagesByKey 51, GroupHeartbeat 60, Unregister 61,
        QueryAssignment 62, GroupMembers 63, ResetOffset 64, ConsumerProgress 65,
        LockBatch 70, UnlockBatch 71, Error 1000, Empty 1001, HandshakeOk 1002,
        SendResult 1003, SendBatchResult 1004, PullResult 1005, Offset 1006, TopicList 1007,
        TopicInfo 1008, Records 1009, Assignment 1010, GroupMembersInfo 1011, Progress 1012,
        Locked 1013, RebalanceNotify 2000";

    #[test]
    fn released_numbers_are_stable() {
        let registry: std::collections::HashMap<&str, u16> = KIND_NUMBERS.into_iter().collect();
        assert_eq!(
            registry.len(),
            KIND_NUMBERS.len(),
            "a name is declared twice"
        );
        for entry in RELEASED.split(',') {
            let (name, number) = entry.trim().split_once(' ').expect("name number");
            let number: u16 = number.parse().expect("a number");
            assert_eq!(
                registry.get(name),
                Some(&number),
                "released kind {name} = {number} was changed or removed"
            );
        }
        for (name, number) in KIND_NUMBERS {
            assert_eq!(
                Kind::from_u16(number).map(|k| format!("{k:?}")),
                Some(name.into())
            );
        }
    }
}
