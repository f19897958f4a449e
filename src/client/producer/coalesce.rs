//! Coalescing (`ProducerOptions::coalesce`): single sends made while a send of their topic
//! to the same shard is in flight wait in that shard's `Coalescer` and go out together as
//! one `SendMulti` when it is answered; one request in flight per (topic, shard).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::{unexpected, ProducerInner, BATCH_MESSAGES_MAX};
use crate::client::error::{ClientError, Result};
use crate::protocol::{
    BatchItem, ErrorCode, Kind, ProtocolError, Response, SendMessage, SendMulti, SendResult,
    QUEUE_ID_ANY,
};

tokio::task_local! {
    /// Set on the task a coalesced send's leader runs on (its request goes on whether or
    /// not its caller still polls it): whether its caller gave up.
    static CALLER_GONE: Arc<AtomicBool>;
}

/// Whether this is a coalesced send's leader whose caller gave up: it writes nothing more.
/// Before, it went on retrying (busy pauses, new attempts) for its whole request timeout,
/// and a message its caller sent again could be stored twice.
pub(super) fn caller_gone() -> bool {
    CALLER_GONE
        .try_with(|gone| gone.load(Ordering::Relaxed))
        .unwrap_or(false)
}

/// Marks the leader's caller gone when the caller's future drops.
struct GoneOnDrop(Arc<AtomicBool>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

pub(super) type SharedCoalescer = Arc<Mutex<Coalescer>>;

/// Where a queued send's result goes.
type ResultTx = tokio::sync::oneshot::Sender<Result<SendResult>>;

/// Most bytes of single sends one producer keeps queued behind requests in flight; a send
/// past them waits for room, for its request timeout at most.
pub(super) const COALESCE_WAITING_BYTES_MAX: usize = 64 << 20;

/// A queued send.
struct Waiting {
    queue: u32,
    item: BatchItem,
    /// Where its result goes (closed: its caller gave up, and it is not sent).
    tx: ResultTx,
    /// Not taken into a request by then (its request timeout from the call), it fails
    /// with `Timeout`, unsent.
    deadline: Instant,
    /// Its bytes' room under [`COALESCE_WAITING_BYTES_MAX`], freed as it leaves the queue.
    _room: Option<OwnedSemaphorePermit>,
}

/// What a queued send of a body and properties of these lengths counts for in a batch and
/// against the producer's room.
fn queued_bytes(body: usize, properties: usize) -> usize {
    body + properties + 64
}

/// Single sends queued for the queues of one shard while a send to it is in flight
/// (`coalesce`).
#[derive(Default)]
pub(super) struct Coalescer {
    in_flight: bool,
    waiting: Vec<Waiting>,
    /// A task fails the queued sends that pass their deadline ([`sweep_expired`]).
    sweeping: bool,
}

/// Fails with `Timeout`, unsent, each send of `co` still queued at its deadline (the
/// request ahead of it is slow, retried, or waits out a busy broker), then and not once
/// that request ends, giving its room back; ends when nothing is queued. One timer for a
/// coalescer's queued sends, not one for each.
async fn sweep_expired(co: SharedCoalescer, timeout_ms: u64) {
    // However it ends (its runtime stopped under it, too), the next queued send starts
    // another: a flag left set would leave queued sends to fail only when the request
    // ahead of them ends.
    struct Stopped(Option<SharedCoalescer>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            if let Some(co) = self.0.take() {
                lock(&co).sweeping = false;
            }
        }
    }
    let mut stopped = Stopped(Some(co.clone()));
    loop {
        let next = {
            let mut st = lock(&co);
            let now = Instant::now();
            let (expired, kept): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut st.waiting)
                .into_iter()
                .partition(|w| w.deadline <= now);
            st.waiting = kept;
            let next = st.waiting.iter().map(|w| w.deadline).min();
            if next.is_none() {
                // Under the lock that found the queue empty: a send queued after it starts
                // another sweep.
                st.sweeping = false;
                stopped.0 = None;
            }
            drop(st);
            for w in expired {
                let _ = w.tx.send(Err(ClientError::Timeout { timeout_ms }));
            }
            next
        };
        match next {
            Some(at) => tokio::time::sleep_until(at).await,
            None => return,
        }
    }
}

fn lock(co: &SharedCoalescer) -> std::sync::MutexGuard<'_, Coalescer> {
    co.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A coalescer's one request slot, held by the send that took it (the leader, sent alone)
/// or by the task sending what queued behind it. Passed on when its request is answered
/// (`pass_on`: to a task for what queued meanwhile, or back to idle); dropped before that
/// (its caller gave up on the leader, or the runtime stopped under the task), it passes on
/// all the same, so sends queued behind it never wait for a request that will not come.
struct Slot {
    inner: Arc<ProducerInner>,
    topic: String,
    co: SharedCoalescer,
    leader: bool,
    released: bool,
}

impl Slot {
    /// The request is done: what queued meanwhile goes now, on its own task (the leader's
    /// answer is not held back for theirs); nothing queued, the shard is idle again.
    fn pass_on(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        let mut st = lock(&self.co);
        if st.waiting.is_empty() {
            st.in_flight = false;
            return;
        }
        drop(st);
        // A task holding the slot, unless there is no runtime to run one (or the slot is
        // a task's, dropped with its runtime: spawning again could go on forever): then the
        // queued sends fail rather than wait.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if self.leader => {
                let next = Slot {
                    inner: self.inner.clone(),
                    topic: self.topic.clone(),
                    co: self.co.clone(),
                    leader: false,
                    released: false,
                };
                let inner = self.inner.clone();
                runtime.spawn(async move { inner.flush_coalesced(next).await });
            }
            _ => {
                let mut st = lock(&self.co);
                st.in_flight = false;
                let waiting = std::mem::take(&mut st.waiting);
                drop(st);
                for Waiting { tx, .. } in waiting {
                    let _ = tx.send(Err(ClientError::Connection(format!(
                        "a send to {} queued behind one that was dropped with its runtime; send it again",
                        self.topic
                    ))));
                }
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pass_on();
    }
}

/// Where a coalesced send goes: alone at once (nothing in flight to its shard), queued
/// behind the request in flight (with its result's receiver, and whether it starts the
/// sweep of expired ones), or nowhere yet (no room to queue it).
enum Place {
    Alone,
    Queued(tokio::sync::oneshot::Receiver<Result<SendResult>>, bool),
    NoRoom,
}

/// How many times in a row a coalescer yields while sends keep queuing.
const COALESCE_SETTLE_YIELDS_MAX: usize = 4;

/// Most bytes of bodies and properties one coalesced batch carries (well within a frame).
const COALESCED_BATCH_BYTES_MAX: usize = 1 << 20;

/// The coalescer of `topic`'s queues on `shard`, made on first use; looked up by the
/// borrowed name (no key is built per send).
fn coalescer_of(
    coalescers: &mut HashMap<String, Vec<Option<SharedCoalescer>>>,
    topic: &str,
    shard: usize,
) -> SharedCoalescer {
    if coalescers.len() >= super::TOPICS_KEPT_MAX && !coalescers.contains_key(topic) {
        // The topics whose coalescers are all idle go (made again at their next send).
        coalescers.retain(|_, shards| {
            (shards.iter().flatten()).any(|co| {
                let c = lock(co);
                Arc::strong_count(co) > 1 || c.in_flight || !c.waiting.is_empty()
            })
        });
    }
    let of_topic = match coalescers.get_mut(topic) {
        Some(of_topic) => of_topic,
        None => coalescers.entry(topic.to_owned()).or_default(),
    };
    if of_topic.len() <= shard {
        // Slots up to the shard (no more than the broker's shards): only those used hold one.
        of_topic.resize(shard + 1, None);
    }
    of_topic[shard].get_or_insert_with(Default::default).clone()
}

/// A packed request's parts (queues, messages, where each result goes), each queue's sends
/// in one run, in the order they were made: the broker looks each queue up once per run.
/// Their (queue, position) pairs are sorted, a few bytes each, and each send is then moved
/// once into its place (a stable sort of the sends themselves moved each several times).
fn in_queue_runs(waiting: Vec<Waiting>) -> (Vec<u32>, Vec<BatchItem>, Vec<ResultTx>) {
    let mut order: Vec<(u32, usize)> = waiting
        .iter()
        .enumerate()
        .map(|(at, w)| (w.queue, at))
        .collect();
    order.sort_unstable();
    let mut sends: Vec<Option<(BatchItem, ResultTx)>> =
        waiting.into_iter().map(|w| Some((w.item, w.tx))).collect();
    let n = order.len();
    let (mut queue_ids, mut items, mut senders) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for (queue, at) in order {
        if let Some((item, tx)) = sends[at].take() {
            queue_ids.push(queue);
            items.push(item);
            senders.push(tx);
        }
    }
    (queue_ids, items, senders)
}

/// Whether a queued send still goes: its caller waits for it, within its deadline.
fn goes(w: &Waiting, now: Instant) -> bool {
    !w.tx.is_closed() && w.deadline > now
}

/// The next batch of queued sends: the oldest ones, up to the batch limits; and the
/// result channels of those ahead of them that are past their deadline (to fail, unsent).
/// Sends whose callers gave up are dropped unsent.
fn take_batch(waiting: &mut Vec<Waiting>, now: Instant) -> (Vec<Waiting>, Vec<ResultTx>) {
    let (mut bytes, mut n, mut end) = (0, 0, 0);
    for w in waiting.iter() {
        if goes(w, now) {
            let size = queued_bytes(w.item.body.len(), w.item.properties.len());
            if n > 0 && (n == BATCH_MESSAGES_MAX || bytes + size > COALESCED_BATCH_BYTES_MAX) {
                break;
            }
            bytes += size;
            n += 1;
        }
        end += 1;
    }
    let rest = waiting.split_off(end);
    let mut late = Vec::new();
    let batch = std::mem::replace(waiting, rest)
        .into_iter()
        .filter_map(|w| {
            if goes(&w, now) {
                Some(w)
            } else {
                if !w.tx.is_closed() {
                    late.push(w.tx);
                }
                None
            }
        })
        .collect();
    (batch, late)
}

impl ProducerInner {
    /// A single send under `coalesce`: sent at once if no send to its queue's shard is in
    /// flight; else queued, and sent with the others queued meanwhile (to any queue of that
    /// shard) as one request as soon as the one in flight is answered.
    pub(super) async fn send_coalesced(
        self: &Arc<Self>,
        topic: &str,
        mut request: SendMessage,
    ) -> Result<SendResult> {
        let queue = request.queue_id;
        // Chosen by `choose`: a queue id, never `QUEUE_ID_ANY`.
        let queue_u32 = u32::try_from(queue).unwrap_or(0);
        let shard = crate::client::route::owner(topic, queue_u32, self.client.shard_count());
        let co = coalescer_of(
            &mut self
                .coalescers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            topic,
            shard as usize,
        );
        // Room for it if it queues (a send that goes at once takes none): bounded bytes,
        // waited for until its deadline.
        let timeout = self.client.config().request_timeout();
        let deadline = Instant::now() + timeout;
        let size = queued_bytes(request.body.len(), request.properties.len());
        // Within the room (a body is at most 4 MiB), so a permit count.
        let size = u32::try_from(size.min(COALESCE_WAITING_BYTES_MAX)).unwrap_or(u32::MAX);
        let mut room = None;
        let place = loop {
            let place = {
                let mut st = lock(&co);
                if !st.in_flight {
                    st.in_flight = true;
                    // Room waited for is given back: it goes at once.
                    drop(room.take());
                    Place::Alone
                } else if let Some(held) = (room.take())
                    .or_else(|| self.coalesce_room.clone().try_acquire_many_owned(size).ok())
                {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    // The first queued send of a while starts the sweep of those that pass
                    // their deadline still queued.
                    let sweep = !std::mem::replace(&mut st.sweeping, true);
                    st.waiting.push(Waiting {
                        queue: queue_u32,
                        item: BatchItem {
                            flag: request.flag,
                            properties: std::mem::take(&mut request.properties),
                            body: std::mem::take(&mut request.body).into(),
                            born_timestamp_ms: request.born_timestamp_ms,
                        },
                        tx,
                        deadline,
                        _room: Some(held),
                    });
                    Place::Queued(rx, sweep)
                } else {
                    Place::NoRoom
                }
            };
            if !matches!(place, Place::NoRoom) {
                break place;
            }
            // No room: waited for (boxed: the wait is rare, and every send's future would
            // carry it). The request in flight may have ended meanwhile: looked at again.
            room = Some(Box::pin(self.wait_for_room(size, deadline, timeout)).await?);
        };
        if let Place::Queued(rx, sweep) = place {
            if sweep {
                let timeout_ms = timeout.as_millis() as u64;
                tokio::spawn(sweep_expired(co, timeout_ms));
            }
            return rx.await.unwrap_or_else(|_| {
                Err(ClientError::Connection(format!(
                    "the batch carrying a send to {topic} was dropped"
                )))
            });
        }
        // This send holds the shard's one request slot until it is answered. Its request
        // runs on a task of its own, so the sends that queue meanwhile go once it is
        // answered whether or not its caller still polls it (dropped, the send may still be
        // stored, as any request already written).
        // The slot is made before the task: a task dropped unpolled (its runtime shutting
        // down) still hands the request slot on, or every later send to the shard waited.
        let inner = self.clone();
        let mut slot = Slot {
            inner: inner.clone(),
            topic: request.topic.clone(),
            co,
            leader: true,
            released: false,
        };
        let gone = Arc::new(AtomicBool::new(false));
        let leader = tokio::spawn(CALLER_GONE.scope(gone.clone(), async move {
            let topic = slot.topic.clone();
            let result = inner.send_to_queue(&topic, &mut request, queue).await;
            slot.pass_on();
            result
        }));
        // Dropped with this future: its caller gave up (or got the answer).
        let _gone = GoneOnDrop(gone);
        leader.await.unwrap_or_else(|e| {
            Err(ClientError::Connection(format!(
                "the send to {topic} was stopped: {e}"
            )))
        })
    }

    /// Waits for `size` bytes of room among the queued sends, until `deadline`.
    async fn wait_for_room(
        &self,
        size: u32,
        deadline: Instant,
        timeout: std::time::Duration,
    ) -> Result<OwnedSemaphorePermit> {
        let wait = self.coalesce_room.clone().acquire_many_owned(size);
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(room)) => Ok(room),
            _ => Err(ClientError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            }),
        }
    }

    /// Sends what is queued for one shard's queues as `SendMulti` requests until nothing
    /// is, then marks the shard idle. Holds the shard's request slot (`slot`).
    async fn flush_coalesced(self: &Arc<Self>, mut slot: Slot) {
        let (topic, co) = (slot.topic.clone(), slot.co.clone());
        let topic = topic.as_str();
        loop {
            // The senders just answered often send again at once (a window of sends in
            // flight): let them queue before the shard counts as idle, yielding while the
            // queue grows, a bounded number of times. Otherwise the first of them would go
            // alone and the rest wait a round trip for it.
            for _ in 0..COALESCE_SETTLE_YIELDS_MAX {
                let before = lock(&co).waiting.len();
                tokio::task::yield_now().await;
                if lock(&co).waiting.len() == before {
                    break;
                }
            }
            let (waiting, late) = {
                let mut st = lock(&co);
                if st.waiting.is_empty() {
                    st.in_flight = false;
                    slot.released = true;
                    return;
                }
                take_batch(&mut st.waiting, Instant::now())
            };
            let taken_at = Instant::now();
            let timeout_ms = self.client.config().request_timeout_ms;
            for tx in late {
                let _ = tx.send(Err(ClientError::Timeout { timeout_ms }));
            }
            if waiting.is_empty() {
                continue;
            }
            let (queue_ids, items, senders) = in_queue_runs(waiting);
            self.coalesced_batches.fetch_add(1, Ordering::Relaxed);
            self.coalesced_sends
                .fetch_add(queue_ids.len() as u64, Ordering::Relaxed);
            // All on one shard: the first queue routes the request.
            let first = i32::try_from(queue_ids[0]).unwrap_or(QUEUE_ID_ANY);
            let mut request = SendMulti {
                topic: topic.to_owned(),
                queue_ids,
                messages: items,
                wait_durable: self.options.wait_durable,
            };
            let result = self
                .with_retries(
                    topic,
                    false,
                    &mut request,
                    |_, _, _| first,
                    |response| match response {
                        Response::SendMultiResult(result) => Ok(result),
                        other => Err(unexpected(Kind::SendMultiResult, &other)),
                    },
                )
                .await
                .and_then(|r| {
                    // One place per message, or the answer is not for this request.
                    let n = request.queue_ids.len();
                    for found in [r.queue_offsets.len(), r.physical_offsets.len()] {
                        if found != n {
                            return Err(ClientError::Protocol(ProtocolError::BadPayload {
                                kind: Kind::SendMultiResult,
                                reason: format!("{found} places for {n} messages"),
                            }));
                        }
                    }
                    Ok(r)
                });
            match result {
                Ok(r) => {
                    for (i, tx) in senders.into_iter().enumerate() {
                        let _ = tx.send(Ok(SendResult {
                            msg_id: r.msg_id(i).unwrap_or_default(),
                            queue_id: request.queue_ids[i],
                            queue_offset: r.queue_offsets[i],
                            physical_offset: r.physical_offsets[i],
                            transaction_id: 0,
                        }));
                    }
                }
                // The broker refused the request for what one message or queue is (a queue
                // gone with a topic that shrank, a message only the broker checks): each
                // message goes again alone, so only those at fault fail, in queue order.
                Err(e)
                    if matches!(
                        e.code(),
                        Some(
                            ErrorCode::QueueNotFound
                                | ErrorCode::InvalidMessage
                                | ErrorCode::BodyTooLarge
                        )
                    ) =>
                {
                    let SendMulti {
                        queue_ids,
                        messages,
                        ..
                    } = request;
                    // One after the other, the last would wait for all before it: a send
                    // not begun within a whole send's time of its batch's start fails with
                    // `Timeout`, unsent (a timer per queued send would cost every send).
                    let config = self.client.config();
                    let give_up_at = taken_at
                        + config.request_timeout() * self.options.retries.saturating_add(2);
                    for ((queue, item), tx) in queue_ids.into_iter().zip(messages).zip(senders) {
                        // A caller that gave up on its send is not sent again (it would be
                        // stored with nobody told).
                        if tx.is_closed() {
                            continue;
                        }
                        if Instant::now() >= give_up_at {
                            let _ = tx.send(Err(ClientError::Timeout { timeout_ms }));
                            continue;
                        }
                        let _ = tx.send(self.resend_alone(topic, queue, item).await);
                    }
                }
                Err(e) => {
                    for tx in senders {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// One message of a refused `SendMulti`, sent alone to its queue.
    async fn resend_alone(
        self: &Arc<Self>,
        topic: &str,
        queue: u32,
        item: BatchItem,
    ) -> Result<SendResult> {
        let queue = i32::try_from(queue).unwrap_or(QUEUE_ID_ANY);
        let mut request = SendMessage {
            topic: topic.to_owned(),
            queue_id: queue,
            flag: item.flag,
            properties: item.properties,
            body: item.body.to_vec(),
            born_timestamp_ms: item.born_timestamp_ms,
            wait_durable: self.options.wait_durable,
        };
        self.send_to_queue(topic, &mut request, queue).await
    }
}

#[cfg(test)]
mod tests {
    use super::{coalescer_of, in_queue_runs, Waiting};
    use crate::protocol::BatchItem;
    use std::collections::HashMap;
    use std::sync::Arc;

    /// A packed request's sends: grouped by queue, queues ascending, each queue's sends in
    /// the order they were made, and each result channel still with its own message.
    #[test]
    fn a_packed_requests_sends_go_in_queue_runs_in_the_order_made() {
        let queues = [3u32, 1, 3, 0, 1, 3, 2, 0, 1, 3];
        let mut receivers = Vec::new();
        let waiting: Vec<Waiting> = queues
            .iter()
            .enumerate()
            .map(|(n, &q)| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                receivers.push(rx);
                let item = BatchItem {
                    flag: n as i32,
                    properties: Vec::new(),
                    body: Vec::new().into(),
                    born_timestamp_ms: 0,
                };
                Waiting {
                    queue: q,
                    item,
                    tx,
                    deadline: tokio::time::Instant::now(),
                    _room: None,
                }
            })
            .collect();
        let (queue_ids, items, senders) = in_queue_runs(waiting);
        let made: Vec<(u32, i32)> = queue_ids
            .iter()
            .zip(&items)
            .map(|(&q, i)| (q, i.flag))
            .collect();
        assert_eq!(
            made,
            [
                (0, 3),
                (0, 7),
                (1, 1),
                (1, 4),
                (1, 8),
                (2, 6),
                (3, 0),
                (3, 2),
                (3, 5),
                (3, 9)
            ]
        );
        // Each sender is its own message's: what it carries reaches that message's receiver.
        for (tx, item) in senders.into_iter().zip(&items) {
            let _ = tx.send(Err(crate::client::ClientError::Connection(
                item.flag.to_string(),
            )));
        }
        for (n, mut rx) in receivers.into_iter().enumerate() {
            match rx.try_recv() {
                Ok(Err(crate::client::ClientError::Connection(said))) => {
                    assert_eq!(said, n.to_string())
                }
                other => panic!("send {n}: {other:?}"),
            }
        }
    }

    /// One coalescer per (topic, shard): a packed request carries the queues of one shard
    /// (the broker refuses one that names another shard's queue).
    #[test]
    fn each_topic_and_shard_has_a_coalescer_of_its_own() {
        let mut map = HashMap::new();
        let a0 = coalescer_of(&mut map, "a", 0);
        let a3 = coalescer_of(&mut map, "a", 3);
        // Only the shards used hold a coalescer.
        assert_eq!(map["a"].iter().filter(|c| c.is_some()).count(), 2);
        let b0 = coalescer_of(&mut map, "b", 0);
        assert!(!Arc::ptr_eq(&a0, &a3) && !Arc::ptr_eq(&a0, &b0) && !Arc::ptr_eq(&a3, &b0));
        let a1 = coalescer_of(&mut map, "a", 1);
        assert!(!Arc::ptr_eq(&a1, &a0) && !Arc::ptr_eq(&a1, &a3));
        // The same ones again, however they were made (shard 1 after 3 filled the gap).
        assert!(Arc::ptr_eq(&coalescer_of(&mut map, "a", 0), &a0));
        assert!(Arc::ptr_eq(&coalescer_of(&mut map, "a", 1), &a1));
        assert!(Arc::ptr_eq(&coalescer_of(&mut map, "a", 3), &a3));
        assert!(Arc::ptr_eq(&coalescer_of(&mut map, "b", 0), &b0));
        assert_eq!(map.len(), 2);
    }

    /// A full map forgets the topics whose coalescers are all idle, and keeps one held
    /// elsewhere (a send of it under way).
    #[test]
    fn a_full_map_forgets_the_idle_topics() {
        let mut map = HashMap::new();
        let held = coalescer_of(&mut map, "busy", 1);
        for i in 0..super::super::TOPICS_KEPT_MAX - 1 {
            coalescer_of(&mut map, &format!("t{i}"), 0);
        }
        assert_eq!(map.len(), super::super::TOPICS_KEPT_MAX);
        let new = coalescer_of(&mut map, "new", 0);
        assert_eq!(map.len(), 2, "busy and new are kept");
        assert!(Arc::ptr_eq(&coalescer_of(&mut map, "busy", 1), &held));
        assert!(Arc::ptr_eq(&coalescer_of(&mut map, "new", 0), &new));
    }
}
