//! Consumer-group requests of [`Client`]: membership (heartbeat, unregister, assignment,
//! members), offsets admin (reset by time, progress), the queue locks of ordered
//! consumption, sending failed messages back (retry and dead letters) and the broker's
//! schedule of delayed messages. [`PushConsumer`](super::PushConsumer) is built on these; they are public so
//! tools and tests can drive a group by hand.
//!
//! Every group request goes to the bootstrap connection: the broker routes it to the
//! group's coordinator shard (or, for locks, to the shards that own the queues). The
//! member is tied to the connection its heartbeats arrive on, and `RebalanceNotify` is
//! pushed there, so heartbeats must keep using one connection; the bootstrap connection is
//! the one that stays.

use crate::protocol::{
    Assignment, ConsumerProgress, ConsumerSendBack, DeleteGroup, GroupHeartbeat, GroupMembers,
    GroupMembersInfo, Kind, LockBatch, MessageId, QueryAssignment, ResetOffset, Response,
    ScheduleStats, SendBackResult, ShardScheduleInfo, SubscriptionData, UnlockBatch, Unregister,
    CONSUME_MODE_CONCURRENT, CONSUME_MODE_ORDERLY, MESSAGE_MODEL_BROADCASTING,
    MESSAGE_MODEL_CLUSTERING,
};

use super::error::{ClientError, Result};
use super::message::{check_topic, Message};
use super::session::{expect_empty, unexpected, Client, Route};
use super::tag_filter::MessageSelector;

/// Longest consumer group name, in bytes (the broker's limit on ids; a group name also
/// names the broadcasting offsets file).
pub const GROUP_BYTES_MAX: usize = crate::protocol::names::GROUP_NAME_BYTES_MAX;
/// Longest client id a group member may have, in bytes (the broker's limit).
pub const CLIENT_ID_BYTES_MAX: usize = crate::protocol::names::CLIENT_ID_BYTES_MAX;
/// Most queues in one lock or unlock request.
pub const LOCK_BATCH_QUEUES_MAX: usize = 1024;

/// How a member consumes the queues it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ConsumeMode {
    /// Many messages of a queue at once.
    #[default]
    Concurrent,
    /// One message of a queue at a time, in offset order, under the queue's lock
    /// (clustering model).
    Orderly,
}

impl ConsumeMode {
    /// The wire value (`CONSUME_MODE_*`).
    pub fn wire(self) -> u8 {
        match self {
            ConsumeMode::Concurrent => CONSUME_MODE_CONCURRENT,
            ConsumeMode::Orderly => CONSUME_MODE_ORDERLY,
        }
    }
}

/// Who gets each message of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MessageModel {
    /// Each message goes to one member of the group; offsets are kept by the broker.
    #[default]
    Clustering,
    /// Each message goes to every member; offsets are kept by each member, in a local file.
    Broadcasting,
}

impl MessageModel {
    /// The wire value (`MESSAGE_MODEL_*`).
    pub fn wire(self) -> u8 {
        match self {
            MessageModel::Clustering => MESSAGE_MODEL_CLUSTERING,
            MessageModel::Broadcasting => MESSAGE_MODEL_BROADCASTING,
        }
    }
}

/// How the broker divides a topic's queues among the members of a group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum AllocateStrategy {
    /// Contiguous blocks (RocketMQ's `AllocateMessageQueueAveragely`).
    #[default]
    Averagely,
    /// Round-robin (`AllocateMessageQueueAveragelyByCircle`).
    Circle,
    /// A consistent-hash ring: few queues move when a member joins or leaves.
    ConsistentHash,
    /// As configured on the broker.
    Config,
    /// Any other name the broker accepts (e.g. `consistent-hash:32`), sent as is.
    Named(String),
}

impl AllocateStrategy {
    /// The name sent to the broker.
    pub fn name(&self) -> &str {
        match self {
            AllocateStrategy::Averagely => "averagely",
            AllocateStrategy::Circle => "circle",
            AllocateStrategy::ConsistentHash => "consistent-hash",
            AllocateStrategy::Config => "config",
            AllocateStrategy::Named(name) => name,
        }
    }
}

/// How a message goes back to the broker (see [`Client::send_back`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendBack {
    pub(crate) delay_level: i32,
    pub(crate) max_reconsume_times: u32,
    /// How many times the consumer consumed it again itself.
    pub(crate) reconsumed: u32,
}

/// The expression of one subscription as a heartbeat carries it: tags (`*` or `A || B`;
/// what a `&str` converts to) or an SQL92 filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionExpression {
    pub expression: String,
    pub sql: bool,
}

impl From<&str> for SubscriptionExpression {
    fn from(tags: &str) -> Self {
        SubscriptionExpression {
            expression: tags.to_owned(),
            sql: false,
        }
    }
}

impl From<&MessageSelector> for SubscriptionExpression {
    fn from(selector: &MessageSelector) -> Self {
        match selector {
            MessageSelector::Tags(t) => SubscriptionExpression {
                expression: t.to_string(),
                sql: false,
            },
            MessageSelector::Sql(s) => SubscriptionExpression {
                expression: s.as_str().to_owned(),
                sql: true,
            },
        }
    }
}

/// What a member declares in each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberSpec {
    /// `(topic, expression)`.
    pub subscriptions: Vec<(String, SubscriptionExpression)>,
    pub consume_mode: ConsumeMode,
    pub message_model: MessageModel,
    pub strategy: AllocateStrategy,
}

/// A group's progress in one queue (from [`Client::consumer_progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLag {
    pub queue_id: u32,
    /// `None` when the group has no committed offset for the queue.
    pub committed_offset: Option<u64>,
    /// One past the last message of the queue.
    pub max_offset: u64,
    /// Messages stored but not yet committed by the group.
    pub lag: u64,
}

pub use crate::protocol::{MemberAssignment, TopicAssignment};

/// Checks a group name before it is sent (and used in a file name).
pub(crate) fn check_group(group: &str) -> Result<()> {
    crate::protocol::names::check_group_name(group).map_err(ClientError::InvalidArgument)
}

fn check_queues(what: &str, queues: &[u32]) -> Result<()> {
    if queues.len() > LOCK_BATCH_QUEUES_MAX {
        return Err(ClientError::InvalidArgument(format!(
            "{what} of {} queues: at most {LOCK_BATCH_QUEUES_MAX} per request",
            queues.len()
        )));
    }
    Ok(())
}

impl Client {
    /// Joins `group` or keeps this client's membership alive; answers the member's queues.
    /// Keep calling it (every few seconds, well within the broker's session timeout): a
    /// member that stops, or whose bootstrap connection closes, leaves the group.
    pub async fn group_heartbeat(&self, group: &str, member: &MemberSpec) -> Result<Assignment> {
        check_group(group)?;
        for (topic, _) in &member.subscriptions {
            check_topic(topic)?;
        }
        let request = GroupHeartbeat {
            group: group.to_owned(),
            client_id: self.config().client_id.clone(),
            subscriptions: member
                .subscriptions
                .iter()
                .map(|(topic, e)| SubscriptionData {
                    topic: topic.clone(),
                    expression: e.expression.clone(),
                    expression_type: if e.sql {
                        crate::protocol::messages::EXPRESSION_SQL92
                    } else {
                        crate::protocol::messages::EXPRESSION_TAG
                    },
                })
                .collect(),
            consume_mode: member.consume_mode.wire(),
            message_model: member.message_model.wire(),
            strategy: member.strategy.name().to_owned(),
        };
        let reply = self.call(Route::Bootstrap, &request).await?;
        expect_assignment(reply.response()?)
    }

    /// Leaves `group` at once (the group rebalances without waiting for a timeout); the
    /// broker releases this client's queue locks of the group. Not a member: done, nothing
    /// changes. Fails with `ErrorCode::ClientIdInUse` when the member with this client id is
    /// on another connection (an earlier one the broker still sees open, or another
    /// process with the same id): that member stays until its connection closes or its
    /// session expires.
    pub async fn unregister(&self, group: &str) -> Result<()> {
        check_group(group)?;
        let request = Unregister {
            group: group.to_owned(),
            client_id: self.config().client_id.clone(),
        };
        expect_empty(&self.call(Route::Bootstrap, &request).await?)
    }

    /// This member's current queues. Fails with `ErrorCode::GroupNotFound` when this
    /// client is not (or no longer) a member: send a heartbeat to join again.
    pub async fn query_assignment(&self, group: &str) -> Result<Assignment> {
        check_group(group)?;
        let request = QueryAssignment {
            group: group.to_owned(),
            client_id: self.config().client_id.clone(),
        };
        let reply = self.call(Route::Bootstrap, &request).await?;
        expect_assignment(reply.response()?)
    }

    /// Every member of `group` with its queues (no members: an empty list).
    pub async fn group_members(&self, group: &str) -> Result<GroupMembersInfo> {
        check_group(group)?;
        let request = GroupMembers {
            group: group.to_owned(),
        };
        let reply = self.call(Route::Bootstrap, &request).await?;
        match reply.response()? {
            Response::GroupMembersInfo(info) => Ok(info),
            other => Err(unexpected(Kind::GroupMembersInfo, &other)),
        }
    }

    /// Moves `group`'s committed offset of every queue of `topic` to the first message
    /// stored at or after `timestamp_ms` (backwards too). Running members are told and
    /// re-read their offsets. Refused with `Conflict` while the group is being deleted.
    pub async fn reset_offset_by_time(
        &self,
        group: &str,
        topic: &str,
        timestamp_ms: i64,
    ) -> Result<()> {
        check_group(group)?;
        check_topic(topic)?;
        let request = ResetOffset {
            group: group.to_owned(),
            topic: topic.to_owned(),
            timestamp_ms,
        };
        expect_empty(&self.call(Route::Bootstrap, &request).await?)
    }

    /// Forgets `group`: its committed offsets on every shard (consumers of that name start
    /// afresh) and its queue locks. Refused with `Conflict` while the group has live
    /// members.
    pub async fn delete_group(&self, group: &str) -> Result<()> {
        check_group(group)?;
        let request = DeleteGroup {
            group: group.to_owned(),
        };
        expect_empty(&self.call(Route::Bootstrap, &request).await?)
    }

    /// `group`'s committed offset, the queue's end and the lag, for each queue of `topic`,
    /// in queue order.
    pub async fn consumer_progress(&self, group: &str, topic: &str) -> Result<Vec<QueueLag>> {
        check_group(group)?;
        check_topic(topic)?;
        let request = ConsumerProgress {
            group: group.to_owned(),
            topic: topic.to_owned(),
        };
        let reply = self.call(Route::Bootstrap, &request).await?;
        let progress = match reply.response()? {
            Response::Progress(progress) => progress,
            other => return Err(unexpected(Kind::Progress, &other)),
        };
        Ok(progress
            .queues
            .into_iter()
            .map(|q| QueueLag {
                queue_id: q.queue_id,
                // The wire says -1 for "none"; any negative value means the same.
                committed_offset: u64::try_from(q.committed_offset).ok(),
                max_offset: q.max_offset,
                lag: q.lag,
            })
            .collect())
    }

    /// Locks (or renews the locks of) `queues` of `topic` for this client in `group`;
    /// answers the queues this client now holds, sorted. A queue held by another live
    /// client is not in the answer. A lock is held by this client on its bootstrap
    /// connection: after a reconnect only a member of `group` (a group heartbeat on the
    /// new connection) has its old locks released and can lock them again at once; a
    /// client that is not a member waits for its old locks to lapse (`lock_expiry_ms`).
    pub async fn lock_batch(&self, group: &str, topic: &str, queues: &[u32]) -> Result<Vec<u32>> {
        check_group(group)?;
        check_topic(topic)?;
        check_queues("a lock", queues)?;
        let request = LockBatch {
            group: group.to_owned(),
            client_id: self.config().client_id.clone(),
            topic: topic.to_owned(),
            queues: queues.to_vec(),
        };
        let reply = self.call(Route::Bootstrap, &request).await?;
        match reply.response()? {
            Response::Locked(locked) => {
                let mut held = locked.queues;
                held.sort_unstable();
                held.dedup();
                Ok(held)
            }
            other => Err(unexpected(Kind::Locked, &other)),
        }
    }

    /// Gives up this client's locks of `queues` of `topic` in `group` (queues it does not
    /// hold are ignored).
    pub async fn unlock_batch(&self, group: &str, topic: &str, queues: &[u32]) -> Result<()> {
        check_group(group)?;
        check_topic(topic)?;
        check_queues("an unlock", queues)?;
        let request = UnlockBatch {
            group: group.to_owned(),
            client_id: self.config().client_id.clone(),
            topic: topic.to_owned(),
            queues: queues.to_vec(),
        };
        expect_empty(&self.call(Route::Bootstrap, &request).await?)
    }

    /// Sends a message this client could not consume back to the broker, which stores it
    /// on the group's retry topic with the delay of its next attempt (`delay_level` 0: the
    /// broker's choice, `3 + reconsume times`), or, once it was retried
    /// `max_reconsume_times` times (or with a negative `delay_level`), on the group's
    /// dead-letter topic.
    pub async fn send_back(
        &self,
        group: &str,
        msg_id: &str,
        delay_level: i32,
        max_reconsume_times: u32,
    ) -> Result<SendBackResult> {
        let back = SendBack {
            delay_level,
            max_reconsume_times,
            reconsumed: 0,
        };
        self.send_back_checked(group, msg_id, 0, &[], back).await
    }

    /// [`send_back`](Self::send_back) for a message this client received. When the broker
    /// no longer holds that message at its id (a crash lost it, and a later message may have
    /// taken its place: refused with `OffsetNotFound` rather than the later one sent back in
    /// its stead; or retention removed it), or cannot read it there (damaged on disk:
    /// `StoreCorrupt`, `StoreIo`), it is sent again with the message's own bytes, from which
    /// the broker makes the copy (checked against the id and the CRC the client verified).
    pub async fn send_back_received(
        &self,
        group: &str,
        message: &Message,
        delay_level: i32,
        max_reconsume_times: u32,
    ) -> Result<SendBackResult> {
        let back = SendBack {
            delay_level,
            max_reconsume_times,
            reconsumed: 0,
        };
        self.send_back_reconsumed(group, message, back).await
    }

    /// [`send_back_received`](Self::send_back_received) for a message the consumer
    /// already consumed again `back.reconsumed` times itself (orderly consumption).
    pub(crate) async fn send_back_reconsumed(
        &self,
        group: &str,
        message: &Message,
        back: SendBack,
    ) -> Result<SendBackResult> {
        let (id, crc) = (message.msg_id().encode(), message.view().crc());
        let back = |record| self.send_back_checked(group, &id, crc, record, back);
        use crate::protocol::ErrorCode::{
            OffsetNotFound, OffsetTooBig, OffsetTooSmall, StoreCorrupt, StoreIo,
        };
        match back(&[]).await {
            // Not there (another record, or none: before the log's start after retention,
            // past its end after a crash with nothing written there since), or not readable
            // there (damaged on disk since it was received: the copy is checked instead).
            Err(e)
                if matches!(
                    e.code(),
                    Some(OffsetNotFound | OffsetTooBig | OffsetTooSmall | StoreCorrupt | StoreIo)
                ) =>
            {
                back(message.as_bytes()).await
            }
            answer => answer,
        }
    }

    async fn send_back_checked(
        &self,
        group: &str,
        msg_id: &str,
        record_crc: u32,
        record: &[u8],
        back: SendBack,
    ) -> Result<SendBackResult> {
        check_group(group)?;
        let id = MessageId::parse(msg_id)
            .map_err(|e| ClientError::InvalidArgument(format!("message id {msg_id:?}: {e}")))?;
        let request = ConsumerSendBack {
            group: group.to_owned(),
            msg_id: msg_id.to_owned(),
            delay_level: back.delay_level,
            max_reconsume_times: back.max_reconsume_times,
            reconsumed: back.reconsumed,
            record_crc,
            record: record.to_vec(),
        };
        let reply = self.call(Route::Shard(id.store_id), &request).await?;
        match reply.response()? {
            Response::SendBackResult(r) => Ok(r),
            other => Err(unexpected(Kind::SendBackResult, &other)),
        }
    }

    /// Every shard's schedule of delayed messages: how many wait, the next due, how many
    /// are overdue.
    pub async fn schedule_stats(&self) -> Result<Vec<ShardScheduleInfo>> {
        let reply = self.call(Route::Bootstrap, &ScheduleStats {}).await?;
        match reply.response()? {
            Response::ScheduleInfo(info) => Ok(info.shards),
            other => Err(unexpected(Kind::ScheduleInfo, &other)),
        }
    }
}

fn expect_assignment(response: Response<'_>) -> Result<Assignment> {
    match response {
        Response::Assignment(assignment) => Ok(assignment),
        other => Err(unexpected(Kind::Assignment, &other)),
    }
}
