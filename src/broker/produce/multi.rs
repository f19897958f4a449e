//! `SendMulti`: single sends to several queues of one topic, packed into one request by a
//! producer (`ProducerOptions::coalesce`), every queue owned by the shard that stores them.
//! Checked as a batch is, appended in the request's order (each queue's messages in the
//! order they came; a run of one queue shares one look-up), all or nothing, and answered
//! with where each message went once the flush mode's acknowledgement holds. Appended now,
//! unless the shard must first learn the topic or a queue of it, or a send to the topic
//! that arrived earlier is still waiting to (the topic's line, `line`).

use std::net::SocketAddr;
use std::rc::Rc;

use super::{check_items, OwnedItem, SendItem, BATCH_MESSAGES_MAX};
use crate::broker::{err, response_frame, Handled, ShardCtx};
use crate::protocol::{ErrorBody, ErrorCode, Response, SendMulti, SendMultiResult};
use crate::store::PutResult;

impl ShardCtx {
    /// `SendMulti`, decoded.
    pub(in crate::broker) fn send_multi(
        self: &Rc<Self>,
        request_id: u64,
        m: SendMulti,
        peer: SocketAddr,
    ) -> Handled {
        let SendMulti {
            topic,
            queue_ids,
            messages,
            wait_durable,
        } = m;
        let items: Vec<SendItem<'_>> = messages.iter().map(SendItem::from).collect();
        self.send_multi_items(request_id, &topic, queue_ids, &items, wait_durable, peer)
    }

    /// A `SendMulti`'s messages, however they were read (`queue_ids[i]` is message `i`'s
    /// queue). On another shard than 0 whose table lacks the topic or names fewer queues,
    /// it asks shard 0 first, as a single send does (a creation or growth this shard
    /// missed), and is checked again once answered. It keeps its place in the topic's line
    /// meanwhile, and waits in it behind any send deferred before it (`line`): sends naming
    /// the topic's queues are appended in the order they arrived.
    pub(in crate::broker) fn send_multi_items(
        self: &Rc<Self>,
        request_id: u64,
        topic: &str,
        queue_ids: Vec<u32>,
        items: &[SendItem<'_>],
        wait_durable: bool,
        peer: SocketAddr,
    ) -> Handled {
        let checked = self.check_multi(topic, &queue_ids, items);
        // A creation or growth this shard may have missed.
        let missed = |e: &ErrorBody| {
            e.code == ErrorCode::TopicNotFound.as_u16()
                || (e.code == ErrorCode::QueueNotFound.as_u16()
                    && self.past_count(topic, &queue_ids))
        };
        let ask = self.id != 0 && checked.as_ref().is_err_and(missed);
        if ask || self.send_lines.has(topic) {
            let (owned, held) = match OwnedItem::keep(self, items, peer) {
                Ok(kept) => kept,
                Err(e) => return self.refuse(request_id, e),
            };
            let place = self.send_lines.place(topic);
            let ctx = self.clone();
            let topic = topic.to_owned();
            return Handled::Later(Box::pin(async move {
                if ask {
                    // Not found here either is check_multi's error, given again below.
                    let _ = ctx.refresh_topic(&topic).await;
                }
                place.wait().await;
                let items: Vec<SendItem<'_>> = owned.iter().map(OwnedItem::borrow).collect();
                let checked = ctx.check_multi(&topic, &queue_ids, &items);
                let handled = ctx.send_multi_checked(
                    request_id,
                    &topic,
                    queue_ids,
                    &items,
                    wait_durable,
                    peer,
                    checked,
                );
                // Appended (or refused): the next send in line goes on, and the copies are
                // not needed while the send waits for the disk.
                drop(place);
                drop(items);
                drop(owned);
                drop(held);
                match handled {
                    Handled::Now(answer) => answer,
                    Handled::Later(answer) => answer.await,
                }
            }));
        }
        self.send_multi_checked(
            request_id,
            topic,
            queue_ids,
            items,
            wait_durable,
            peer,
            checked,
        )
    }

    /// A `SendMulti` that `checked` came from [`check_multi`](Self::check_multi) for.
    #[allow(clippy::too_many_arguments)]
    fn send_multi_checked(
        self: &Rc<Self>,
        request_id: u64,
        topic: &str,
        queue_ids: Vec<u32>,
        items: &[SendItem<'_>],
        wait_durable: bool,
        peer: SocketAddr,
        checked: Result<(), ErrorBody>,
    ) -> Handled {
        if let Err(e) = checked.and_then(|()| self.admit_send()) {
            return self.refuse(request_id, e);
        }
        let appended = self.append_drafts(|| {
            items
                .iter()
                .zip(&queue_ids)
                .map(|(i, &queue_id)| i.draft(topic, queue_id, peer))
        });
        let topic = topic.to_owned();
        self.answer_appended(request_id, appended, move |ctx, puts| async move {
            ctx.finish_multi(request_id, &topic, queue_ids, puts, wait_durable)
                .await
        })
    }

    /// Whether the topic is known here and one of `queue_ids` is past its count.
    fn past_count(&self, topic: &str, queue_ids: &[u32]) -> bool {
        let count = self.topics.borrow().get(topic);
        count.is_some_and(|count| queue_ids.iter().any(|&q| q >= count))
    }

    /// Everything checkable before an append: the counts, the messages (as a batch's), the
    /// topic known here, and every queue one of the topic's, owned by this shard.
    fn check_multi(
        &self,
        topic: &str,
        queue_ids: &[u32],
        items: &[SendItem<'_>],
    ) -> Result<(), ErrorBody> {
        if items.is_empty() || items.len() > BATCH_MESSAGES_MAX {
            return Err(err(
                ErrorCode::InvalidMessage,
                format!("a multi-queue send holds 1..={BATCH_MESSAGES_MAX} messages"),
            ));
        }
        if queue_ids.len() != items.len() {
            return Err(err(
                ErrorCode::InvalidMessage,
                format!(
                    "a multi-queue send names {} queues for {} messages (one each)",
                    queue_ids.len(),
                    items.len()
                ),
            ));
        }
        check_items(topic, items, true)?;
        let Some(count) = self.topics.borrow().get(topic) else {
            return Err(err(
                ErrorCode::TopicNotFound,
                format!("topic {topic} does not exist"),
            ));
        };
        // A run of one queue is checked once (the producer sends each queue's in one run).
        let mut checked = None;
        for &q in queue_ids {
            if checked.replace(q) == Some(q) {
                continue;
            }
            if q >= count {
                return Err(err(
                    ErrorCode::QueueNotFound,
                    format!("topic {topic} has {count} queues; no queue {q}"),
                ));
            }
            let owner = self.owner_of(topic, q);
            if owner != self.id {
                return Err(err(
                    ErrorCode::QueueNotFound,
                    format!(
                        "queue {q} of topic {topic} is on shard {owner}, not on shard {}: \
                         a multi-queue send names queues of one shard",
                        self.id
                    ),
                ));
            }
        }
        Ok(())
    }

    async fn finish_multi(
        &self,
        request_id: u64,
        topic: &str,
        mut queue_ids: Vec<u32>,
        puts: Vec<PutResult>,
        wait_durable: bool,
    ) -> Vec<u8> {
        // Each queue's long polls, once.
        queue_ids.sort_unstable();
        queue_ids.dedup();
        if let Err(answer) = self
            .acknowledged(request_id, topic, &puts, wait_durable, &queue_ids)
            .await
        {
            return answer;
        }
        let r = SendMultiResult {
            broker_id: self.cfg.broker_id,
            store_id: self.id,
            queue_offsets: puts.iter().map(|p| p.queue_offset).collect(),
            physical_offsets: puts.iter().map(|p| p.physical_offset).collect(),
        };
        response_frame(request_id, &Response::SendMultiResult(r))
    }
}
