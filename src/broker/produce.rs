//! The produce path: validate a send or a batch, append it now (so pipelined sends keep their
//! order), wait for the acknowledgement the flush mode asks for, wake the queue's long polls,
//! and answer with where the messages were stored. A send that leaves the queue to the broker
//! (or names a topic to auto-create) picks a queue and, when another shard owns it, forwards
//! the re-encoded request there. A send that must first learn its topic (or a queue of it)
//! from shard 0 appends later, in the topic's line (`line`), and so do the sends naming
//! the topic's queues that arrive while it waits.

use std::net::SocketAddr;
use std::rc::Rc;

use super::mesh::MESH_CALL_TIMEOUT_MS;
use super::mesh::{MeshReply, MeshRequest};
use super::schedule::goes_straight;
use super::transaction::is_half;
use super::{
    err, error_frame, response_frame, store_error, unsure_error, Arrival, Forward, Handled,
    PollStep, ShardCtx,
};
use crate::protocol::delay::asks_for_delay;
use crate::protocol::record::{
    prop, Properties, RecordDraft, BODY_BYTES_MAX, CLIENT_PROPERTIES_BYTES_MAX,
};
use crate::protocol::{
    encode_frame, ArchivedBatchItem, ArchivedSendMessage, BatchItem, ErrorBody, ErrorCode, Flags,
    Frame, Kind, MessageId, Response, SendBatch, SendBatchResult, SendMessage, SendMulti,
    SendResult, QUEUE_OFFSET_HALF,
};
use crate::store::PutResult;

mod line;
mod multi;

pub(super) use line::SendLines;

/// Most messages in one batch send.
pub const BATCH_MESSAGES_MAX: usize = 4096;
/// Default of `--send-wait-max-ms`: as RocketMQ's 200 ms for the head of its send queue.
pub const SEND_WAIT_MAX_MS_DEFAULT: u64 = 200;
/// Default of `--send-backlog-max-mb`.
pub const SEND_BACKLOG_BYTES_MAX_DEFAULT: u64 = 64 << 20;
pub use crate::protocol::record::KEYS_PER_MESSAGE_MAX;
/// Sends one shard tracks waiting for the disk at most; past it sends are refused too.
const WAITING_SENDS_MAX: usize = 1 << 20;

/// One message of a send, borrowed from the request: read in place from the received
/// frame (rkyv's checked access), or from a decoded request.
#[derive(Clone, Copy)]
pub(super) struct SendItem<'a> {
    pub flag: i32,
    pub properties: &'a [u8],
    pub body: &'a [u8],
    pub born_timestamp_ms: i64,
}

/// A [`SendItem`] kept across a wait (a topic being created, a hop to another shard).
struct OwnedItem {
    flag: i32,
    properties: Vec<u8>,
    body: Vec<u8>,
    born_timestamp_ms: i64,
}

impl<'a> From<&'a BatchItem> for SendItem<'a> {
    fn from(i: &'a BatchItem) -> SendItem<'a> {
        SendItem {
            flag: i.flag,
            properties: &i.properties,
            body: &i.body,
            born_timestamp_ms: i.born_timestamp_ms,
        }
    }
}

impl<'a> From<&'a ArchivedBatchItem> for SendItem<'a> {
    fn from(i: &'a ArchivedBatchItem) -> SendItem<'a> {
        SendItem {
            flag: i.flag.to_native(),
            properties: i.properties.as_slice(),
            body: i.body.as_slice(),
            born_timestamp_ms: i.born_timestamp_ms.to_native(),
        }
    }
}

impl<'a> From<&'a SendMessage> for SendItem<'a> {
    fn from(m: &'a SendMessage) -> SendItem<'a> {
        SendItem {
            flag: m.flag,
            properties: &m.properties,
            body: &m.body,
            born_timestamp_ms: m.born_timestamp_ms,
        }
    }
}

impl<'a> From<&'a ArchivedSendMessage> for SendItem<'a> {
    fn from(m: &'a ArchivedSendMessage) -> SendItem<'a> {
        SendItem {
            flag: m.flag.to_native(),
            properties: m.properties.as_slice(),
            body: m.body.as_slice(),
            born_timestamp_ms: m.born_timestamp_ms.to_native(),
        }
    }
}

impl<'a> SendItem<'a> {
    /// The record a client's message becomes in `queue_id` of `topic`.
    fn draft(&self, topic: &'a str, queue_id: u32, peer: SocketAddr) -> RecordDraft<'a> {
        RecordDraft {
            topic,
            queue_id,
            flag: self.flag,
            sys_flag: 0,
            born_timestamp_ms: self.born_timestamp_ms,
            born_host: peer,
            reconsume_times: 0,
            transaction_offset: 0,
            properties: self.properties,
            body: self.body,
        }
    }
}

impl OwnedItem {
    /// Copies of `items`, kept across a wait, their bytes held in shard `ctx`'s budget of
    /// held requests ([`HeldRequests`](super::answer::HeldRequests)); refused past it.
    fn keep(
        ctx: &ShardCtx,
        items: &[SendItem<'_>],
        peer: SocketAddr,
    ) -> Result<(Vec<OwnedItem>, super::answer::HeldRequest), ErrorBody> {
        let bytes: usize = items
            .iter()
            .map(|i| std::mem::size_of::<OwnedItem>() + i.properties.len() + i.body.len())
            .sum();
        let held = ctx.held.hold(bytes, ctx.id, peer)?;
        Ok((items.iter().map(OwnedItem::of).collect(), held))
    }

    fn of(i: &SendItem<'_>) -> OwnedItem {
        OwnedItem {
            flag: i.flag,
            properties: i.properties.to_vec(),
            body: i.body.to_vec(),
            born_timestamp_ms: i.born_timestamp_ms,
        }
    }
    fn borrow(&self) -> SendItem<'_> {
        SendItem {
            flag: self.flag,
            properties: &self.properties,
            body: &self.body,
            born_timestamp_ms: self.born_timestamp_ms,
        }
    }
}

impl ShardCtx {
    /// Every send and batch, handled straight from the received frame (rkyv's checked
    /// access: no message is deserialized into owned buffers, and the payload is validated
    /// once): appended here, or passed on as it came to the shard that owns its queue.
    /// `None` leaves the frame to the general path, which reports a payload that does not
    /// check.
    pub(super) fn send_in_place(
        self: &Rc<Self>,
        frame: &Frame<'_>,
        at: &Arrival<'_>,
    ) -> Option<Handled> {
        let kind = frame.kind();
        if !matches!(kind, Kind::SendMessage | Kind::SendBatch | Kind::SendMulti) {
            return None;
        }
        let meta = frame.aligned_meta();
        // The owner of a named queue; a queue left to the broker is chosen here (`send`).
        let owner = |topic: &str, queue_id: i32| {
            u32::try_from(queue_id)
                .ok()
                .map(|q| crate::protocol::route::owner(topic, q, self.shard_count))
                .filter(|&to| to != self.id)
        };
        let (request_id, peer) = (at.request_id, at.peer);
        if kind == Kind::SendMessage {
            let m = meta.access::<SendMessage>().ok()?;
            let (topic, queue_id) = (m.topic.as_str(), m.queue_id.to_native());
            if let Some(to) = owner(topic, queue_id) {
                return Some(self.forward(to, at, MESH_CALL_TIMEOUT_MS, Forward::Plain));
            }
            let item = [SendItem::from(m)];
            Some(self.run_request(kind, at.oneway, true, || {
                self.send(
                    request_id,
                    topic,
                    queue_id,
                    &item,
                    m.wait_durable,
                    peer,
                    false,
                )
            }))
        } else if kind == Kind::SendMulti {
            let m = meta.access::<SendMulti>().ok()?;
            let topic = m.topic.as_str();
            // Every queue is on one shard: the first one's owner stores them all.
            if let Some(to) = m
                .queue_ids
                .first()
                .and_then(|q| i32::try_from(q.to_native()).ok())
                .and_then(|q| owner(topic, q))
            {
                return Some(self.forward(to, at, MESH_CALL_TIMEOUT_MS, Forward::Plain));
            }
            // One past the limit is enough to refuse a request over it.
            let limit = BATCH_MESSAGES_MAX + 1;
            let queue_ids: Vec<u32> = m
                .queue_ids
                .iter()
                .take(limit)
                .map(|q| q.to_native())
                .collect();
            let items: Vec<SendItem<'_>> =
                m.messages.iter().take(limit).map(SendItem::from).collect();
            Some(self.run_request(kind, at.oneway, true, || {
                self.send_multi_items(request_id, topic, queue_ids, &items, m.wait_durable, peer)
            }))
        } else {
            let b = meta.access::<SendBatch>().ok()?;
            let (topic, queue_id) = (b.topic.as_str(), b.queue_id.to_native());
            if let Some(to) = owner(topic, queue_id) {
                return Some(self.forward(to, at, MESH_CALL_TIMEOUT_MS, Forward::Plain));
            }
            let items: Vec<SendItem<'_>> = b.messages.iter().map(SendItem::from).collect();
            Some(self.run_request(kind, at.oneway, true, || {
                self.send_items(request_id, topic, queue_id, &items, b.wait_durable, peer)
            }))
        }
    }

    /// `SendMessage`.
    pub(super) fn send_message(
        self: &Rc<Self>,
        request_id: u64,
        m: SendMessage,
        peer: SocketAddr,
    ) -> Handled {
        let item = [SendItem::from(&m)];
        self.send(
            request_id,
            &m.topic,
            m.queue_id,
            &item,
            m.wait_durable,
            peer,
            false,
        )
    }

    /// `SendBatch`: 1 to [`BATCH_MESSAGES_MAX`] messages into one queue, in order.
    pub(super) fn send_batch(
        self: &Rc<Self>,
        request_id: u64,
        b: SendBatch,
        peer: SocketAddr,
    ) -> Handled {
        let items: Vec<_> = b.messages.iter().map(SendItem::from).collect();
        self.send_items(
            request_id,
            &b.topic,
            b.queue_id,
            &items,
            b.wait_durable,
            peer,
        )
    }

    /// A batch's messages, however they were read: checks the count, then [`send`](Self::send).
    pub(super) fn send_items(
        self: &Rc<Self>,
        request_id: u64,
        topic: &str,
        queue_id: i32,
        items: &[SendItem<'_>],
        wait_durable: bool,
        peer: SocketAddr,
    ) -> Handled {
        if items.is_empty() || items.len() > BATCH_MESSAGES_MAX {
            let e = err(
                ErrorCode::InvalidMessage,
                format!("a batch holds 1..={BATCH_MESSAGES_MAX} messages"),
            );
            return self.refuse(request_id, e);
        }
        self.send(request_id, topic, queue_id, items, wait_durable, peer, true)
    }

    pub(super) fn msg_id(&self, physical_offset: u64) -> String {
        MessageId {
            broker_id: self.cfg.broker_id,
            store_id: self.id,
            physical_offset,
        }
        .to_string()
    }

    /// Validates and appends `items` now (so pipelined sends keep their order), then waits
    /// for the acknowledgement the flush mode (or `wait_durable`) asks for. A send to a
    /// named queue that must first learn its topic, and those behind it, append in the
    /// topic's line (`line`), in arrival order.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send(
        self: &Rc<Self>,
        request_id: u64,
        topic: &str,
        queue_id: i32,
        items: &[SendItem<'_>],
        wait_durable: bool,
        peer: SocketAddr,
        batch: bool,
    ) -> Handled {
        if let Err(e) = check_items(topic, items, batch) {
            return self.refuse(request_id, e);
        }
        if queue_id < 0 && queue_id != crate::protocol::QUEUE_ID_ANY {
            let e = err(
                ErrorCode::QueueNotFound,
                format!(
                    "queue id {queue_id} is not a queue ({} lets the broker choose)",
                    crate::protocol::QUEUE_ID_ANY
                ),
            );
            return self.refuse(request_id, e);
        }
        // A transaction's half message: answered with its transaction id.
        let half = !batch
            && items
                .first()
                .is_some_and(|i| is_half(&Properties::new(i.properties)));
        let known = self.topics.borrow().get(topic);
        let named = queue_id >= 0;
        match known {
            // A queue past the count on another shard than 0 takes the path below, which
            // asks shard 0 first (a growth this shard may have missed); so does a send behind
            // one deferred that way, in the topic's line.
            Some(count)
                if named
                    && ((queue_id as u32) < count || self.id == 0)
                    && !self.send_lines.has(topic) =>
            {
                let q = queue_id as u32;
                if q >= count {
                    let e = err(
                        ErrorCode::QueueNotFound,
                        format!("topic {topic} has {count} queues; no queue {q}"),
                    );
                    return self.refuse(request_id, e);
                }
                if let Err(e) = self.admit_send() {
                    return self.refuse(request_id, e);
                }
                let appended = self.append_all(topic, q, items, peer);
                let topic = topic.to_owned();
                self.answer_appended(request_id, appended, move |ctx, puts| async move {
                    ctx.finish_send(request_id, &topic, q, puts, wait_durable, batch, half)
                        .await
                })
            }
            _ => {
                // Unknown topic (maybe auto-created) or a queue left to the broker. A named
                // queue is this shard's (`send_in_place` forwards the others): the send keeps
                // its place among the topic's sends while it waits.
                let (kept, held) = match OwnedItem::keep(self, items, peer) {
                    Ok(kept) => kept,
                    Err(e) => return self.refuse(request_id, e),
                };
                let place = named.then(|| self.send_lines.place(topic));
                let ctx = self.clone();
                let topic = topic.to_owned();
                Handled::later(async move {
                    let items: Vec<SendItem<'_>> = kept.iter().map(OwnedItem::borrow).collect();
                    let mut count = match ctx.ensure_topic(&topic).await {
                        Ok(c) => c,
                        Err(e) => {
                            ctx.count_error(&e);
                            return Some(error_frame(request_id, &e));
                        }
                    };
                    if queue_id >= 0 && queue_id as u32 >= count && ctx.id != 0 {
                        count = ctx.refresh_topic(&topic).await.unwrap_or(count);
                    }
                    let q = if queue_id >= 0 {
                        queue_id as u32
                    } else {
                        ctx.choose_queue(&topic, count)
                    };
                    if q >= count {
                        let e = err(
                            ErrorCode::QueueNotFound,
                            format!("topic {topic} has {count} queues; no queue {q}"),
                        );
                        ctx.count_error(&e);
                        return Some(error_frame(request_id, &e));
                    }
                    if let Some(place) = &place {
                        place.wait().await;
                    }
                    let to = ctx.owner_of(&topic, q);
                    if to != ctx.id {
                        // A queue the broker chose (a named one is this shard's): no place
                        // is held across the call. Re-encode with the chosen queue and let
                        // its owner handle it.
                        debug_assert!(place.is_none());
                        drop(place);
                        let frame =
                            reencode_send(request_id, &topic, q, &items, wait_durable, batch);
                        // The frame is held from here on, in the copies' place.
                        drop(items);
                        drop(kept);
                        let _held = held;
                        return match ctx
                            .call(
                                to,
                                MeshRequest::Frame {
                                    bytes: frame,
                                    peer,
                                    conn: 0,
                                    frame_max: ctx.cfg.frame_limits.frame_bytes_max(),
                                    poll: PollStep::Whole,
                                },
                            )
                            .await
                        {
                            Ok(MeshReply::Frame(f)) => Some(f),
                            Ok(_) => Some(error_frame(
                                request_id,
                                &err(ErrorCode::Internal, "unexpected reply"),
                            )),
                            Err(e) => {
                                ctx.count_error(&e);
                                Some(error_frame(request_id, &e))
                            }
                        };
                    }
                    // The topic may have been deleted (or made smaller) while this send waited
                    // for it or for its turn: looked at again with nothing awaited before the
                    // append, or the message would be stored in a queue being removed, or one
                    // a later topic of the name adopts, and acknowledged all the same.
                    let known = ctx.known_queue_after_wait(&topic, q);
                    if let Err(e) = known.and_then(|()| ctx.admit_send()) {
                        ctx.count_error(&e);
                        return Some(error_frame(request_id, &e));
                    }
                    let appended = ctx.append_all(&topic, q, &items, peer);
                    // Appended (or refused): the next send in line goes on, and the copies
                    // are not needed while the send waits for the disk.
                    drop(place);
                    drop(items);
                    drop(kept);
                    drop(held);
                    match appended {
                        Ok(puts) => {
                            ctx.note_waiting(&puts);
                            Some(
                                ctx.finish_send(
                                    request_id,
                                    &topic,
                                    q,
                                    puts,
                                    wait_durable,
                                    batch,
                                    half,
                                )
                                .await,
                            )
                        }
                        Err(e) => {
                            ctx.count_error(&e);
                            Some(error_frame(request_id, &e))
                        }
                    }
                })
            }
        }
    }

    /// A send refused before anything was stored: the error answer, counted.
    fn refuse(&self, request_id: u64, e: ErrorBody) -> Handled {
        self.count_error(&e);
        Handled::now(error_frame(request_id, &e))
    }

    /// Flow control: refuses a send with `BrokerBusy` while the shard's acknowledgements
    /// wait too long (or for too many bytes) for the disk, so memory stays bounded whatever
    /// producers do; pulls are not affected.
    fn admit_send(&self) -> Result<(), ErrorBody> {
        let log = self.store.log();
        let acked_end = if self.cfg.flush == crate::log::FlushMode::Sync {
            log.durable_end()
        } else {
            log.readable_end()
        };
        let epoch = log.epoch();
        let mut waiting = self.waiting_sends.borrow_mut();
        // Acknowledged, or (from before a cut of the log: a full disk) failed.
        while waiting
            .front()
            .is_some_and(|&(end, _, e)| end <= acked_end || e != epoch)
        {
            waiting.pop_front();
        }
        let backlog = log.write_offset().saturating_sub(acked_end);
        let oldest_ms = waiting
            .front()
            .map_or(0, |(_, at, _)| at.elapsed().as_millis() as u64);
        let why = if oldest_ms > self.cfg.send_wait_max_ms {
            format!(
                "the oldest send has waited {oldest_ms} ms for the disk (--send-wait-max-ms {})",
                self.cfg.send_wait_max_ms
            )
        } else if backlog > self.cfg.send_backlog_bytes_max {
            format!(
                "{backlog} bytes wait for the disk (--send-backlog-max-mb {})",
                self.cfg.send_backlog_bytes_max >> 20
            )
        } else if waiting.len() >= WAITING_SENDS_MAX {
            format!("{} sends wait for the disk", waiting.len())
        } else {
            return Ok(());
        };
        drop(waiting);
        self.busy_refusals.set(self.busy_refusals.get() + 1);
        Err(err(
            ErrorCode::BrokerBusy,
            format!("shard {} is busy: {why}; send again shortly", self.id),
        ))
    }

    /// A send was appended: its acknowledgement waits for the log up to `end`.
    fn note_waiting(&self, puts: &[PutResult]) {
        if let Some(last) = puts.last() {
            let end = last.physical_offset + u64::from(last.size);
            self.waiting_sends
                .borrow_mut()
                .push_back((end, std::time::Instant::now(), last.epoch));
        }
    }

    /// Picks a queue for a send that left the choice to the broker: round-robin over the
    /// queues this shard owns (no hop), or over all queues when it owns none.
    fn choose_queue(&self, topic: &str, count: u32) -> u32 {
        let n = self.round_robin.get();
        self.round_robin.set(n.wrapping_add(1));
        let local: Vec<u32> = (0..count)
            .filter(|&q| self.owner_of(topic, q) == self.id)
            .collect();
        if local.is_empty() {
            n % count
        } else {
            local[n as usize % local.len()]
        }
    }

    /// Appends a send's records (`drafts` yields them, in order, each time it is called),
    /// all or nothing: every one is checked (valid, within one log segment) before the
    /// first is appended; neither half nor delayed messages go in as one append (a run per
    /// queue), else one by one.
    fn append_drafts<'a, I: Iterator<Item = RecordDraft<'a>>>(
        &self,
        drafts: impl Fn() -> I,
    ) -> Result<Vec<PutResult>, ErrorBody> {
        let seg = self.store.log().config().segment_bytes as usize;
        for draft in drafts() {
            draft
                .validate()
                .map_err(|e| err(ErrorCode::InvalidMessage, e.to_string()))?;
            if draft.encoded_len() > seg {
                return Err(err(
                    ErrorCode::InvalidMessage,
                    format!(
                        "a record of {} bytes does not fit a log segment of {seg} bytes",
                        draft.encoded_len()
                    ),
                ));
            }
        }
        // The drafts come from slices: their count is known.
        let mut puts = Vec::with_capacity(drafts().size_hint().0);
        if drafts().all(|d| goes_straight(&Properties::new(d.properties))) {
            self.store
                .append_batch(drafts(), &mut puts)
                .map_err(store_error)?;
        } else {
            for draft in drafts() {
                puts.push(self.put_draft(&draft, false)?);
            }
        }
        Ok(puts)
    }

    /// A send's messages into `queue_id` of `topic` ([`append_drafts`](Self::append_drafts)).
    fn append_all<'a>(
        &self,
        topic: &'a str,
        queue_id: u32,
        items: &[SendItem<'a>],
        peer: SocketAddr,
    ) -> Result<Vec<PutResult>, ErrorBody> {
        self.append_drafts(|| items.iter().map(|i| i.draft(topic, queue_id, peer)))
    }

    /// The answer to a send appended now: the append's error at once, or once the appends
    /// are acknowledged, what `finish` answers (meanwhile they count as waiting for the
    /// disk, for flow control).
    fn answer_appended<F: std::future::Future<Output = Vec<u8>> + 'static>(
        self: &Rc<Self>,
        request_id: u64,
        appended: Result<Vec<PutResult>, ErrorBody>,
        finish: impl FnOnce(Rc<Self>, Vec<PutResult>) -> F,
    ) -> Handled {
        let puts = match appended {
            Ok(puts) => puts,
            Err(e) => return self.refuse(request_id, e),
        };
        self.note_waiting(&puts);
        let answer = finish(self.clone(), puts);
        Handled::later(async move { Some(answer.await) })
    }

    /// Waits until the appended `puts` are acknowledged as the flush mode (or
    /// `wait_durable`) asks, and counts them stored: the last of them, or the error answer.
    /// The long polls of `queues` are woken once the records are readable: before any wait
    /// for the disk, which in async mode can take the flush interval (or never end, on a
    /// failed fdatasync).
    async fn acknowledged(
        &self,
        request_id: u64,
        topic: &str,
        puts: &[PutResult],
        wait_durable: bool,
        queues: &[u32],
    ) -> Result<PutResult, Vec<u8>> {
        let Some(&last) = puts.last() else {
            return Err(error_frame(
                request_id,
                &err(ErrorCode::InvalidMessage, "nothing to send"),
            ));
        };
        let appended_at = std::time::Instant::now();
        let mut acked = self.store.acked(last.written()).await;
        if acked.is_ok() {
            for &q in queues {
                self.wake_pollers(topic, q);
            }
            if wait_durable {
                acked = self.store.durable(last.written()).await;
            }
        }
        if let Err(e) = acked {
            let e = unsure_error(e);
            self.count_error(&e);
            return Err(error_frame(request_id, &e));
        }
        self.stats
            .send_ack
            .borrow_mut()
            .record(appended_at.elapsed());
        // A topic deleted while the write was in flight took its counters with it: not
        // brought back (created and deleted over and over, topics must not add up).
        if self.topics.borrow().get(topic).is_some() {
            let bytes: u64 = puts.iter().map(|p| u64::from(p.size)).sum();
            self.stats.stored(topic, puts.len() as u64, bytes);
        }
        Ok(last)
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish_send(
        &self,
        request_id: u64,
        topic: &str,
        queue_id: u32,
        puts: Vec<PutResult>,
        wait_durable: bool,
        batch: bool,
        half: bool,
    ) -> Vec<u8> {
        let last = match self
            .acknowledged(request_id, topic, &puts, wait_durable, &[queue_id])
            .await
        {
            Ok(last) => last,
            Err(answer) => return answer,
        };
        if batch {
            let r = SendBatchResult {
                queue_id,
                first_queue_offset: puts[0].queue_offset,
                count: puts.len() as u32,
                broker_id: self.cfg.broker_id,
                store_id: self.id,
                physical_offsets: puts.iter().map(|p| p.physical_offset).collect(),
            };
            response_frame(request_id, &Response::SendBatchResult(r))
        } else {
            let r = SendResult {
                msg_id: self.msg_id(last.physical_offset),
                queue_id,
                queue_offset: if half {
                    QUEUE_OFFSET_HALF
                } else {
                    last.queue_offset
                },
                physical_offset: last.physical_offset,
                transaction_id: if half {
                    super::transaction::transaction_id(
                        last.queue_offset,
                        last.store_timestamp_ms.max(0) as u64,
                    )
                } else {
                    0
                },
            };
            response_frame(request_id, &Response::SendResult(r))
        }
    }
}

/// What every send checks of its messages before anything is stored: sizes, properties,
/// the topic not reserved, and in a batch (`batch`) neither transactional nor delayed
/// messages.
fn check_items(topic: &str, items: &[SendItem<'_>], batch: bool) -> Result<(), ErrorBody> {
    for &SendItem {
        properties: props,
        body,
        ..
    } in items
    {
        if body.len() > BODY_BYTES_MAX {
            return Err(err(
                ErrorCode::BodyTooLarge,
                format!(
                    "message body of {} bytes exceeds the {} byte limit",
                    body.len(),
                    BODY_BYTES_MAX
                ),
            ));
        }
        if props.len() > CLIENT_PROPERTIES_BYTES_MAX {
            return Err(err(
                ErrorCode::InvalidMessage,
                format!(
                    "properties of {} bytes exceed the {CLIENT_PROPERTIES_BYTES_MAX} byte limit",
                    props.len()
                ),
            ));
        }
        let reserved = Properties::new(props).validate_finding(&prop::BROKER_SET);
        let reserved = reserved.map_err(|e| err(ErrorCode::InvalidMessage, e.to_string()))?;
        if let Some(name) = reserved {
            return Err(err(
                ErrorCode::InvalidMessage,
                format!("property {name} is set by the broker only; a send may not carry it"),
            ));
        }
        // Each key is an entry of the key index (24 bytes, whatever its length): without a
        // bound, a 63 KiB property block of one-letter keys grew the index by 12 times the
        // log's growth, which retention by size does not count. (A block too short to
        // hold more than the bound is not looked at.)
        if props.len() > 2 * KEYS_PER_MESSAGE_MAX {
            let keys = Properties::new(props).get(prop::KEYS);
            let count = keys.map_or(0, |k| k.split(' ').filter(|k| !k.is_empty()).count());
            if count > KEYS_PER_MESSAGE_MAX {
                return Err(err(
                    ErrorCode::InvalidMessage,
                    format!("{count} keys; a message has at most {KEYS_PER_MESSAGE_MAX}"),
                ));
            }
        }
    }
    if crate::protocol::names::is_system_topic(topic) {
        return Err(err(
            ErrorCode::InvalidTopic,
            format!("topic {topic} is reserved for the broker"),
        ));
    }
    if batch
        && items
            .iter()
            .any(|i| is_half(&Properties::new(i.properties)))
    {
        return Err(err(
            ErrorCode::InvalidMessage,
            "transactional messages cannot be sent in a batch; send them one by one",
        ));
    }
    if batch
        && items
            .iter()
            .any(|i| asks_for_delay(&Properties::new(i.properties)))
    {
        return Err(err(
            ErrorCode::InvalidDelay,
            "delayed messages cannot be sent in a batch; send them one by one",
        ));
    }
    Ok(())
}

fn reencode_send(
    request_id: u64,
    topic: &str,
    queue_id: u32,
    items: &[SendItem<'_>],
    wait_durable: bool,
    batch: bool,
) -> Vec<u8> {
    let mut out = Vec::new();
    let r = if batch {
        let m = SendBatch {
            topic: topic.to_owned(),
            queue_id: queue_id as i32,
            messages: items
                .iter()
                .map(|i| crate::protocol::BatchItem {
                    flag: i.flag,
                    properties: i.properties.to_vec(),
                    body: bytes::Bytes::copy_from_slice(i.body),
                    born_timestamp_ms: i.born_timestamp_ms,
                })
                .collect(),
            wait_durable,
        };
        encode_frame(request_id, Flags::NONE, &m, &[], &mut out)
    } else {
        let i = &items[0];
        let m = SendMessage {
            topic: topic.to_owned(),
            queue_id: queue_id as i32,
            flag: i.flag,
            properties: i.properties.to_vec(),
            body: i.body.to_vec(),
            born_timestamp_ms: i.born_timestamp_ms,
            wait_durable,
        };
        encode_frame(request_id, Flags::NONE, &m, &[], &mut out)
    };
    if r.is_err() {
        out.clear();
    }
    out
}
