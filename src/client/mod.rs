//! The native client: a tokio library for applications that produce to and consume from a
//! ringmq broker. It compiles without the `broker` feature (no glommio, no io_uring).
//!
//! - [`Client`]: one session with a broker: connections (pipelined, one per shard when
//!   shard aware), routing, pulls, offsets, message queries, topic admin.
//! - [`Producer`]: sync, async, oneway and batch sends, with queue selection (round-robin,
//!   sharding key, or a [`QueueSelector`]) and retries.
//! - [`PushConsumer`]: a consumer-group member that pulls its queues and calls a listener,
//!   concurrently or in order (queue locks), clustering or broadcasting; the group
//!   requests it uses are [`Client`] methods too (`group_heartbeat`, `lock_batch`, ...).
//! - [`Message`]: a received record, read in place from the answer's shared buffer;
//!   [`OutgoingMessage`]: what a producer sends.
//! - [`route`]: queue ownership and the tag hash, shared with the broker.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ringmq::client::ClientError> {
//! use ringmq::client::{ClientConfig, OutgoingMessage, Producer};
//! let producer = Producer::connect(ClientConfig::new("127.0.0.1:7800")).await?;
//! let sent = producer
//!     .send("orders", OutgoingMessage::new("hello").with_tags("TagA").with_key("order-1"))
//!     .await?;
//! let pulled = producer
//!     .client()
//!     .pull("orders", sent.queue_id, sent.queue_offset, 32, std::time::Duration::from_secs(1), &[])
//!     .await?;
//! assert_eq!(pulled.messages[0].body(), b"hello");
//! # Ok(()) }
//! ```
//!
//! Architecture invariant: the client knows the wire protocol and the record layout, never
//! the broker's internals (shards, stores, logs); it talks to a broker only through frames.
//! Every queue and buffer is bounded (`in_flight_max` requests per connection, the frame
//! limit, the push channel), and nothing from the network is trusted before it is checked.

mod config;
mod connection;
mod consumer;
mod error;
mod group;
mod message;
mod producer;
pub mod route;
mod session;
mod tag_filter;
mod transaction;

#[cfg(test)]
mod tests;

pub use config::{
    ClientConfig, BROKER_PORT_DEFAULT, CONNECT_TIMEOUT_MS_DEFAULT, IN_FLIGHT_MAX_DEFAULT,
    PUSH_BUFFER_MAX_DEFAULT, RECONNECT_BACKOFF_MAX_MS_DEFAULT, RECONNECT_BACKOFF_MIN_MS_DEFAULT,
    REQUEST_TIMEOUT_MS_DEFAULT,
};
pub use connection::PushFrame;
pub use consumer::{
    ConcurrentListener, ConsumeFrom, ConsumeStatus, ConsumerStats, MessageQueue, OrderlyListener,
    OrderlyStatus, PushConsumer, PushConsumerOptions, CACHED_BYTES_MAX_DEFAULT,
    CACHED_MESSAGES_MAX_DEFAULT, CACHED_SPAN_MAX_DEFAULT, COMMIT_INTERVAL_MS_DEFAULT,
    CONSUME_BATCH_MAX_DEFAULT, CONSUME_BATCH_MAX_LIMIT, CONSUME_THREADS_DEFAULT,
    CONSUME_THREADS_MAX, FLOW_RETRY_MS_DEFAULT, HEARTBEAT_INTERVAL_MS_DEFAULT,
    LOCK_RENEW_MS_DEFAULT, LOCK_RETRY_MS_DEFAULT, LOCK_VALID_MS_DEFAULT,
    MAX_RECONSUME_TIMES_DEFAULT, PULLS_IN_FLIGHT_MAX_DEFAULT, PULLS_IN_FLIGHT_MAX_LIMIT,
    PULL_BATCH_MAX_DEFAULT, PULL_BATCH_MAX_LIMIT, PULL_ERROR_BACKOFF_MS_DEFAULT,
    PULL_WAIT_MS_DEFAULT, REBALANCE_INTERVAL_MS_DEFAULT, RECONSUME_DELAY_MS_DEFAULT,
    SESSION_TIMEOUT_MS_DEFAULT, SHUTDOWN_TIMEOUT_MS_DEFAULT, SUBSCRIPTIONS_MAX, SUSPEND_MS_DEFAULT,
};
pub use error::{ClientError, Result};
pub use group::{
    AllocateStrategy, ConsumeMode, MemberAssignment, MemberSpec, MessageModel, QueueLag,
    SubscriptionExpression, TopicAssignment, CLIENT_ID_BYTES_MAX, GROUP_BYTES_MAX,
    LOCK_BATCH_QUEUES_MAX,
};
pub use message::{Delay, Message, OutgoingMessage};
pub use producer::{
    Producer, ProducerOptions, QueueSelector, SendBatchResult, SendResult, BATCH_MESSAGES_MAX,
    ROUTE_REFRESH_MS_DEFAULT, SEND_RETRIES_DEFAULT,
};
pub use session::{BrokerInfo, Client, PullResult};
pub use tag_filter::{
    MessageSelector, SqlExpression, TagExpression, TAGS_PER_EXPRESSION_MAX,
    TAG_EXPRESSION_BYTES_MAX,
};
pub use transaction::{
    TransactionChecker, TransactionOutcome, TransactionProducer, TransactionSendResult,
};

pub use crate::protocol::{
    Assignment, GroupMembersInfo, MessageId, PullStatus, QueueInfo, SendBackResult,
    ShardScheduleInfo, TopicInfo, QUEUE_OFFSET_SCHEDULED,
};
