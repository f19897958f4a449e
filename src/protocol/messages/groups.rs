//! Consumer groups: membership, assignments, progress and offset resets (part of
//! [`super`], split off for size).

wire_type! {
    /// One subscription of a group member: a topic and a tag expression (`*` or `A || B`)
    /// or an SQL92 filter.
    pub struct SubscriptionData {
        pub topic: String,
        pub expression: String,
        /// [`EXPRESSION_TAG`] or [`EXPRESSION_SQL92`].
        pub expression_type: u8,
    }
}

/// [`SubscriptionData::expression_type`]: a tag expression.
pub const EXPRESSION_TAG: u8 = 0;
/// [`SubscriptionData::expression_type`]: an SQL92 filter (`protocol::sql`).
pub const EXPRESSION_SQL92: u8 = 1;

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
    /// Leaves a consumer group at once. Answered by [`Empty`](super::Empty).
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
    /// their committed offsets, and name the epoch in their commits: see
    /// [`CommitOffset::offsets_epoch`](crate::protocol::CommitOffset::offsets_epoch)). A
    /// reset's epoch is later than the clock's milliseconds at the reset, so it grows across
    /// broker runs too; 0 until the first reset of the broker's run.
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
    /// stored at or after `timestamp_ms` (offsets may go backwards). Answered by [`Empty`](super::Empty).
    pub struct ResetOffset {
        pub group: String,
        pub topic: String,
        pub timestamp_ms: i64,
    }
}

wire_type! {
    /// Forgets a consumer group: its committed offsets on every shard and its queue locks.
    /// Refused with `Conflict` while the group has live members. Answered by [`Empty`](super::Empty).
    pub struct DeleteGroup {
        pub group: String,
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
