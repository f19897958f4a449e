//! Consumer groups, the pure core: queue allocation strategies ([`allocate()`]), the
//! membership and assignment of one group on its coordinator shard ([`GroupState`],
//! [`coordinator_shard`]), the queue locks of ordered consumption kept by the shard that
//! owns each queue ([`LockTable`]), and subscription tag expressions ([`TagFilter`]).
//!
//! Owns: who is in a group, what each member subscribes to, which queues each member gets,
//! who holds each queue lock, and how a tag expression reads and matches.
//!
//! Architecture invariant: pure and deterministic. No I/O, no async, no runtime, no clock:
//! time is a parameter (`now_ms`), and the same calls in the same order always give the
//! same state and answers. The shard runtime drives it from its own thread and messages;
//! nothing here knows of sockets, shards' channels or the message store.

pub mod allocate;
pub mod coordinator;
pub mod locks;

/// Tag expressions are shared with the client, so they live in `protocol::tag_filter`.
pub use crate::protocol::tag_filter::{
    TagFilter, TAGS_PER_EXPRESSION_MAX, TAG_EXPRESSION_BYTES_MAX,
};
pub use allocate::{allocate, Strategy, VIRTUAL_NODES_DEFAULT, VIRTUAL_NODES_MAX};
pub use coordinator::{
    coordinator_shard, ConsumeMode, GroupError, GroupState, MemberInfo, MessageModel, Subscription,
    CLIENT_ID_BYTES_MAX, CONFIG_QUEUES_MAX, MEMBERS_PER_GROUP_MAX, SESSION_TIMEOUT_MS_DEFAULT,
    SUBSCRIPTIONS_PER_MEMBER_MAX,
};
pub use locks::{LockTable, LOCK_EXPIRY_MS_DEFAULT};
