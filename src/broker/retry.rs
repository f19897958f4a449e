//! The failure path of consumption: a consumer sends a message it could not consume back
//! (`ConsumerSendBack`); the shard that stored it builds the retry copy and puts it on the
//! group's retry topic `%RETRY%<group>` with the delay of its attempt (level
//! `3 + reconsume times` by default), or, after `max_reconsume_times` retries, on the
//! group's dead-letter topic `%DLQ%<group>`. Both topics have one queue and are created on
//! demand whatever `--auto-create-topics` says. The copy keeps the body, flag, keys, tags
//! and user properties, and records the topic it was first consumed from (`RETRY_TOPIC`)
//! and its first id (`ORIGIN_MESSAGE_ID`); its header's reconsume count goes up by one.
//!
//! Copies travel to the shard that owns their target queue as `MeshRequest::Put`; that
//! shard holds a delayed one in its own schedule (`schedule.rs`).

use std::rc::Rc;

use super::mesh::{MeshReply, MeshRequest};
use super::schedule::{rebuild_properties, OwnedDraft};
use super::topics::NewTopic;
use super::{err, unsure_error, ShardCtx};
use crate::protocol::names::{dlq_topic, retry_topic};
use crate::protocol::record::{prop, Properties, RecordView};
use crate::protocol::{ConsumerSendBack, ErrorBody, ErrorCode, SendBackResult};

/// Queues of a retry or dead-letter topic.
pub const SYSTEM_TOPIC_QUEUES: u32 = 1;

/// Until when a put on the owning shard waits: until an fdatasync covers the message,
/// made for it at once (async mode) or the flusher's next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutWait {
    /// A message sent back for retry: its original's group commits past it once answered,
    /// and a crash that kept the commit must not lose the copy.
    SyncNow,
    /// A scheduled message delivered to another shard: its done record waits, nobody else.
    NextFlush,
}

/// What a put on the owning shard gives back.
#[derive(Debug, Clone)]
pub struct PutDone {
    pub msg_id: String,
    pub queue_offset: u64,
}

impl ShardCtx {
    /// Creates a retry or dead-letter topic if it does not exist (one queue; not subject to
    /// `--auto-create-topics`).
    pub(super) async fn ensure_system_topic(self: &Rc<Self>, topic: &str) -> Result<(), ErrorBody> {
        if self.topics.borrow().get(topic).is_some() {
            return Ok(());
        }
        if self.id == 0 {
            self.set_topic(topic, Some(SYSTEM_TOPIC_QUEUES), true, NewTopic::System)
                .await?;
        } else {
            self.call(
                0,
                MeshRequest::EnsureTopic {
                    topic: topic.to_owned(),
                    queues: SYSTEM_TOPIC_QUEUES,
                    origin: NewTopic::System,
                    create: true,
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Stores a message on the shard that owns its queue (this one or another), holding it
    /// in the schedule if it asks for a delay; waits until an fdatasync covers it.
    pub(super) async fn put_owned(
        self: &Rc<Self>,
        draft: OwnedDraft,
        wait: PutWait,
    ) -> Result<PutDone, ErrorBody> {
        let owner = self.owner_of(&draft.topic, draft.queue_id);
        if owner != self.id {
            return match self.call(owner, MeshRequest::Put { draft, wait }).await? {
                MeshReply::Put {
                    msg_id,
                    queue_offset,
                } => Ok(PutDone {
                    msg_id,
                    queue_offset,
                }),
                other => Err(err(
                    ErrorCode::Internal,
                    format!("unexpected reply {other:?}"),
                )),
            };
        }
        self.known_queue(&draft.topic, draft.queue_id)?;
        // Send-backs and scheduled deliveries (cleared of their delay) come this way.
        let put = self.put_draft(&draft.draft(), true)?;
        // Readable first: its queue's long polls are woken before the wait for the disk.
        self.store
            .acked(put.written())
            .await
            .map_err(unsure_error)?;
        self.wake_pollers(&draft.topic, draft.queue_id);
        let durable = match wait {
            PutWait::SyncNow => self.store.made_durable(put.written()).await,
            PutWait::NextFlush => self.store.durable(put.written()).await,
        };
        durable.map_err(unsure_error)?;
        Ok(PutDone {
            msg_id: self.msg_id(put.physical_offset),
            queue_offset: put.queue_offset,
        })
    }

    /// `ConsumerSendBack` of the client at `peer`, on the shard that stored the message.
    /// The record (sent back, or read by its id) and the copy made of it are held until
    /// the copy is durable: their bytes count in the shard's
    /// [`HeldRequests`](super::answer::HeldRequests), taken before the record is read.
    pub(super) async fn send_back(
        self: Rc<Self>,
        m: ConsumerSendBack,
        peer: std::net::SocketAddr,
    ) -> Result<SendBackResult, ErrorBody> {
        if !m.record.is_empty() {
            let _held = self.held.hold(2 * m.record.len(), self.id, peer)?;
            // The consumer's own copy of a message this broker no longer holds at its id:
            // whole (its CRC), the one named (the CRC given, the id's place in the log).
            let bad = |why: String| {
                err(
                    ErrorCode::InvalidMessage,
                    format!("the record sent back with message {}: {why}", m.msg_id),
                )
            };
            let view = RecordView::parse(&m.record).map_err(|e| bad(e.to_string()))?;
            // (`OffsetNotFound` from the lookup would have the client send it again.)
            let at = (self.msg_id_here(&m.msg_id)).map_err(|e| bad(e.message))?;
            if view.crc() != m.record_crc || view.physical_offset() != at {
                return Err(bad("it is not the message the id and CRC name".into()));
            }
            // The bytes are the client's: they must be what a member of the group can
            // have received (not a record of the broker's own topics; a first topic,
            // `RETRY_TOPIC`, only on a copy in the group's own retry topic, where the
            // broker puts it), or any client could put letters claiming any origin in a
            // group's dead-letter topic. (A member of the group can still forge one of
            // its retry topic: the broker cannot check bytes it no longer holds.)
            let topic = view.topic();
            if crate::protocol::names::is_system_topic(topic) {
                return Err(bad(format!("it is of the broker's own topic {topic}")));
            }
            let retried = topic == retry_topic(&m.group);
            if !retried && view.properties().get(prop::RETRY_TOPIC).is_some() {
                return Err(bad(format!(
                    "it names a first topic ({}) but is of {topic}, not the group's retry topic",
                    prop::RETRY_TOPIC
                )));
            }
            return self.store_retry_copy(&m, &view).await;
        }
        let size = self.message_size_by_id(&m.msg_id).await?;
        let _held = self.held.hold(2 * size, self.id, peer)?;
        let buf = self.read_by_msg_id(&m.msg_id).await?;
        let view = RecordView::parse(&buf).map_err(|e| err(ErrorCode::StoreIo, e.to_string()))?;
        if m.record_crc != 0 && view.crc() != m.record_crc {
            return Err(err(
                ErrorCode::OffsetNotFound,
                format!(
                    "message {} is not the one consumed (the record there has another CRC): a crash lost it, and a later message took its place",
                    m.msg_id
                ),
            ));
        }
        // Not a record of the broker's own topics either (a discarded transaction's copy,
        // a delayed message held on the schedule, a half message): its copy would deliver
        // a message never committed, or before its time.
        let topic = view.topic();
        if crate::protocol::names::is_system_topic(topic) {
            return Err(err(
                ErrorCode::InvalidMessage,
                format!(
                    "message {} is of the broker's own topic {topic}: it is not sent back",
                    m.msg_id
                ),
            ));
        }
        self.store_retry_copy(&m, &view).await
    }

    /// Stores the copy a sent-back message becomes, and says where it went.
    async fn store_retry_copy(
        self: &Rc<Self>,
        m: &ConsumerSendBack,
        view: &RecordView<'_>,
    ) -> Result<SendBackResult, ErrorBody> {
        let (dead_lettered, draft) = self.retry_copy(m, view)?;
        self.ensure_system_topic(&draft.topic).await?;
        let reconsume_times = draft.reconsume_times;
        let done = self.put_owned(draft, PutWait::SyncNow).await?;
        let counter = if dead_lettered {
            &self.stats.dead_letters
        } else {
            &self.stats.retries
        };
        counter.set(counter.get() + 1);
        Ok(SendBackResult {
            dead_lettered,
            msg_id: done.msg_id,
            reconsume_times,
        })
    }

    /// The copy a sent-back message becomes: (dead-lettered?, the copy).
    fn retry_copy(
        &self,
        m: &ConsumerSendBack,
        view: &RecordView<'_>,
    ) -> Result<(bool, OwnedDraft), ErrorBody> {
        // An orderly consumer retries in place: its count, not the record's, is the
        // attempts made.
        let times = view.reconsume_times().max(m.reconsumed);
        let dead = m.delay_level < 0 || times >= m.max_reconsume_times;
        let props = view.properties();
        let first_topic = props.get(prop::RETRY_TOPIC).unwrap_or(view.topic());
        let origin = props.get(prop::ORIGIN_MESSAGE_ID).unwrap_or(&m.msg_id);
        let level = if m.delay_level > 0 {
            (m.delay_level as u32).min(self.cfg.delay.levels() as u32)
        } else {
            self.cfg.delay.retry_level(times)
        };
        let level = level.to_string();
        let mut add = vec![
            (prop::RETRY_TOPIC, first_topic),
            (prop::ORIGIN_MESSAGE_ID, origin),
        ];
        if !dead {
            add.push((prop::DELAY, &level));
        }
        let topic = if dead {
            dlq_topic(&m.group)
        } else {
            retry_topic(&m.group)
        };
        // A retry is scheduled, which adds its target and due time: the copy must leave
        // room for them (as many characters as they can take), or the schedule would
        // refuse it on every send-back and it would never reach the dead-letter topic.
        let (most_queue, most_due) = (u32::MAX.to_string(), u64::MAX.to_string());
        let schedulable = |p: Vec<u8>| -> Result<Vec<u8>, ErrorBody> {
            if !dead {
                let scheduled = [
                    (prop::REAL_TOPIC, topic.as_str()),
                    (prop::REAL_QID, most_queue.as_str()),
                    (prop::TIMER_OUT_MS, most_due.as_str()),
                ];
                rebuild_properties(Properties::new(&p), &[], &scheduled)?;
            }
            Ok(p)
        };
        // A message the full copy cannot carry (properties of an older client at the
        // limit) still goes back, with what identifies it.
        // A copy is never a transaction's half (a delivered message carries no mark; one
        // sent back in its record would have the copy held as a half).
        let mut dropped = prop::DELAY_PROPERTIES.to_vec();
        dropped.push(prop::TRAN_MSG);
        let properties = rebuild_properties(props, &dropped, &add)
            .and_then(schedulable)
            .or_else(|_| {
                let keep: Vec<(&str, &str)> = [prop::TAGS, prop::KEYS]
                    .into_iter()
                    .filter_map(|name| props.get(name).map(|v| (name, v)))
                    .chain(add.iter().copied())
                    .collect();
                rebuild_properties(Properties::new(&[]), &[], &keep).and_then(schedulable)
            })
            .or_else(|_| rebuild_properties(Properties::new(&[]), &[], &add))?;
        Ok((
            dead,
            OwnedDraft {
                topic,
                queue_id: 0,
                flag: view.flag(),
                born_timestamp_ms: view.born_timestamp_ms(),
                born_host: view.born_host(),
                reconsume_times: times.saturating_add(1),
                properties,
                body: view.body().to_vec(),
            },
        ))
    }
}
