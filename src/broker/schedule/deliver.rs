//! Delivering the schedule: the task that takes due messages from the wheel and puts them on
//! their queues, the done records that take them out of the schedule once their copies are
//! durable, what happens to messages that cannot be delivered, moving old held messages
//! forward so retention can go on, and the orderly stop.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::{
    now_ms, rebuild_properties, OwnedDraft, NOT_YET_WRITTEN_MS, PARK_MS, SCHEDULE_PROPS,
    UNDELIVERABLE_TOPIC,
};
use crate::broker::mesh::{MeshReply, MeshRequest};
use crate::broker::retry::PutWait;
use crate::broker::{err, ShardCtx};
use crate::protocol::names::{DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX};
use crate::protocol::record::{prop, RecordDraft, RecordView};
use crate::protocol::{ErrorBody, ErrorCode, MessageId};
use crate::store::{StoreError, Written, SCHEDULE_DONE_TOPIC, SCHEDULE_TOPIC};

/// Most messages one delivery turn takes from the wheel.
pub const DELIVER_BATCH_MAX: usize = 512;
/// About the most record bytes one delivery turn reads (at least one read of the largest
/// frame's): the rest of its messages are taken again at their own due time, next turn.
/// 512 delayed messages of 4 MiB due together would otherwise have a turn read 2 GiB and
/// append all their copies into one growing write buffer.
const DELIVER_BYTES_MAX: usize = 32 << 20;
/// Most moves to another shard (to the undeliverable topic) in flight at once; past it a
/// move waits in the wheel for [`REMOTE_MOVE_WAIT_MS`] (a turn does not wait: the others'
/// deliveries and a stop go on).
pub const REMOTE_MOVES_MAX: usize = 16;
/// How long a move past [`REMOTE_MOVES_MAX`] waits in the wheel. (It waited the 5 s of a
/// failed delivery: 400 messages moved at once took two minutes.)
const REMOTE_MOVE_WAIT_MS: u64 = 50;
/// How often the wheel is snapshotted (when it changed).
const SNAPSHOT_INTERVAL_MS: u64 = 5_000;
/// Most held messages moved forward in one pass.
const ROLL_BATCH_MAX: usize = 10_000;
/// Longest the delivery task sleeps without looking at the wheel.
const IDLE_WAKE_MS: u64 = 1_000;
/// How long a stop waits for done records to be written.
const STOP_WAIT_MS: u64 = 5_000;
/// At most one log line per this long about messages that wait or fail.
const LOG_EVERY_MS: u64 = 60_000;

/// Why a scheduled record could not be read.
enum ReadFailure {
    /// Appended but not written yet: try again in a moment.
    NotReady,
    /// No message has the offset: the entry's send was cut from the log by a full disk (and
    /// refused) and no later message took the offset yet. Nothing can ever be delivered for
    /// the entry (a message that takes the offset later comes with an entry of its own).
    NoMessage,
    /// Gone (retention) or damaged: it can never be delivered.
    Lost(String),
    /// An I/O error: try again later.
    Retry(String),
}

/// When the scheduled record `bytes` is due (ms since the epoch). An entry of the wheel
/// falls due no earlier than its record (later when tried again), save one left by a send
/// a full disk cut whose offset another message took.
fn record_due(bytes: &[u8]) -> Option<u64> {
    let view = RecordView::parse(bytes).ok()?;
    view.properties().get(prop::TIMER_OUT_MS)?.parse().ok()
}

impl ShardCtx {
    /// The delivery task of this shard's schedule; runs until the shard stops.
    pub async fn run_schedule(self: Rc<Self>) {
        self.schedule.borrow_mut().running = true;
        let mut due = Vec::with_capacity(DELIVER_BATCH_MAX);
        let mut next_snapshot = Instant::now() + Duration::from_millis(SNAPSHOT_INTERVAL_MS);
        // Held messages that keep retention from deleting are moved as often as it runs.
        let roll_every = Duration::from_millis(self.cfg.retention_check_interval_ms);
        let mut next_roll = Instant::now() + roll_every;
        while !self.stopping.get() {
            if Instant::now() >= next_snapshot {
                next_snapshot = Instant::now() + Duration::from_millis(SNAPSHOT_INTERVAL_MS);
                self.snapshot_schedule().await;
            }
            if Instant::now() >= next_roll {
                next_roll = Instant::now() + roll_every;
                self.roll_forward().await;
            }
            due.clear();
            let now = now_ms();
            {
                let mut s = self.schedule.borrow_mut();
                s.wheel.poll(now, DELIVER_BATCH_MAX, &mut due);
                // Messages moved forward come due under their new offset.
                due.retain(|(_, off)| {
                    let moved = s.superseded.remove(off);
                    if moved {
                        s.unpark(*off);
                    }
                    !moved
                });
                for &(d, off) in &due {
                    s.in_flight.insert(off, d);
                }
            }
            self.repark(&mut due).await;
            if due.is_empty() {
                let wake = self.schedule.borrow().wheel.next_wake_ms();
                let wait_ms = wake
                    .map(|w| w.saturating_sub(now))
                    .unwrap_or(IDLE_WAKE_MS)
                    .clamp(1, IDLE_WAKE_MS);
                let notified = self.schedule_wake.notified();
                let sleep = crate::io::sleep(Duration::from_millis(wait_ms));
                futures_lite::future::or(notified, sleep).await;
                continue;
            }
            self.deliver(&due).await;
        }
        self.schedule.borrow_mut().running = false;
        self.schedule_wake.notify_one();
    }

    /// At a clean stop: waits for the delivery task to end and for the done records of
    /// what it delivered (making the log durable so they need not wait for the flusher),
    /// then writes the last snapshot. Returns when done or after a few seconds.
    pub async fn stop_schedule(&self) {
        let deadline = Instant::now() + Duration::from_millis(STOP_WAIT_MS);
        let _ = self.store.log().sync_all().await;
        while Instant::now() < deadline {
            let settled = {
                let s = self.schedule.borrow();
                !s.running && s.marking == 0
            };
            if settled {
                break;
            }
            self.schedule_wake.notify_one();
            crate::io::sleep(Duration::from_millis(5)).await;
        }
        self.snapshot_schedule().await;
    }

    /// Puts offsets back in the wheel, to be tried again at `at`.
    fn retry_later(&self, offsets: impl IntoIterator<Item = u64>, at: u64) {
        let mut s = self.schedule.borrow_mut();
        for off in offsets {
            s.in_flight.remove(&off);
            s.wheel.insert(at, off);
        }
    }

    /// Puts the parked messages of `due` whose target queue still does not exist (after
    /// trying to create it, as a delivery would) back in the wheel for a while, without
    /// reading their records again: a message waits up to `schedule_park_max_ms` (an hour)
    /// for its topic, and a read every few seconds of each would cost the disk and the
    /// others' turns that long.
    async fn repark(self: &Rc<Self>, due: &mut Vec<(u64, u64)>) {
        // Names copied, not shared: a name shared across the wait would outlive the last
        // message parked for it (`Schedule::unpark` goes by the name's count).
        let targets: Vec<(String, u32)> = {
            let s = self.schedule.borrow();
            if s.parked.is_empty() {
                return;
            }
            let mut targets: Vec<(String, u32)> = Vec::new();
            for p in due.iter().filter_map(|(_, off)| s.parked.get(off)) {
                if !targets
                    .iter()
                    .any(|(t, q)| **t == *p.topic && *q == p.queue_id)
                {
                    targets.push((p.topic.to_string(), p.queue_id));
                }
            }
            targets
        };
        if targets.is_empty() {
            return;
        }
        self.ensure_targets(targets.iter().map(|(t, q)| (t.as_str(), *q)))
            .await;
        self.schedule.borrow_mut().repark(
            due,
            now_ms(),
            self.cfg.schedule_park_max_ms,
            |topic, queue| self.known_queue(topic, queue).is_ok(),
        );
    }

    /// Delivers one batch taken from the wheel (all now in flight).
    async fn deliver(self: &Rc<Self>, due: &[(u64, u64)]) {
        let mut records = self.read_scheduled(due).await;
        let now = now_ms();
        let mut copies: Vec<(u64, OwnedDraft)> = Vec::with_capacity(due.len());
        let mut lost: Vec<u64> = Vec::new();
        // Why the first of them was lost.
        let mut lost_why = String::new();
        let mut no_message: Vec<u64> = Vec::new();
        for &(entry_due, off) in due {
            match records.remove(&off) {
                // A stale entry: the message it was made for was cut from the log by a full
                // disk (its send failed) and its offset holds a later one now (the entries a
                // cut leaves go at the next append, `Schedule::appended`, but not one being
                // delivered then). It moves to that one's own time (which a duplicate entry
                // there delivers twice rather than a lost one never).
                Some(Ok(bytes)) if record_due(&bytes).is_some_and(|own| own > entry_due) => {
                    let own = record_due(&bytes).unwrap_or(entry_due);
                    let mut s = self.schedule.borrow_mut();
                    s.in_flight.remove(&off);
                    s.wheel.insert(own, off);
                }
                Some(Ok(bytes)) => match self.delivered_copy(&bytes) {
                    Ok(copy) => copies.push((off, copy)),
                    Err(e) => {
                        if lost.is_empty() {
                            lost_why = format!("{off} cannot be delivered: {}", e.message);
                        }
                        lost.push(off);
                    }
                },
                Some(Err(ReadFailure::NotReady)) => {
                    self.retry_later([off], now + NOT_YET_WRITTEN_MS)
                }
                Some(Err(ReadFailure::NoMessage)) => {
                    // Tried again every few milliseconds, it would wait for ever when no
                    // delayed send comes.
                    let mut s = self.schedule.borrow_mut();
                    s.in_flight.remove(&off);
                    s.unpark(off);
                    s.changed = true;
                    no_message.push(off);
                }
                Some(Err(ReadFailure::Lost(why))) => {
                    if lost.is_empty() {
                        lost_why = format!("{off} is unreadable: {why}");
                    }
                    lost.push(off);
                }
                Some(Err(ReadFailure::Retry(why))) => {
                    self.log_rarely(format_args!(
                        "reading scheduled message {off} failed ({why}); trying again"
                    ));
                    self.retry_later([off], now + PARK_MS);
                }
                None => {
                    // Not reached by the read (it ended early, or the turn's bytes were
                    // read): next turn, in its place in due order.
                    self.retry_later([off], entry_due);
                }
            }
        }
        if let (Some(first), Some(last)) = (no_message.iter().min(), no_message.iter().max()) {
            crate::warn!(
                "ringmq: shard {}: schedule entries that named no stored message dropped ({}, offsets {first}..={last}): their delayed sends were cut from the log by a full disk, and refused",
                self.id,
                no_message.len()
            );
        }
        if let (Some(first), Some(last)) = (lost.iter().min(), lost.iter().max()) {
            // Every time, not under the once-a-minute budget: these messages are gone.
            crate::warn!(
                "ringmq: shard {}: scheduled messages that cannot be delivered dropped ({}, offsets {first}..={last}; {lost_why}); counted as undeliverable",
                self.id,
                lost.len()
            );
        }
        if !lost.is_empty() {
            let ctx = self.clone();
            let count = lost.len() as u64;
            self.spawn_marking(async move { ctx.mark_done(0, lost, false, count).await });
        }
        self.ensure_targets(copies.iter().map(|(_, d)| (d.topic.as_str(), d.queue_id)))
            .await;
        let mut local: Vec<(u64, OwnedDraft)> = Vec::with_capacity(copies.len());
        let mut remote: Vec<(u64, u32, OwnedDraft)> = Vec::new();
        for (off, mut copy) in copies {
            if self.known_queue(&copy.topic, copy.queue_id).is_err() {
                let since = self
                    .schedule
                    .borrow_mut()
                    .park(off, &copy.topic, copy.queue_id, now);
                if now.saturating_sub(since) < self.cfg.schedule_park_max_ms {
                    self.log_rarely(format_args!(
                        "scheduled messages for {}[{}] wait: the queue does not exist",
                        copy.topic, copy.queue_id
                    ));
                    self.retry_later([off], now + PARK_MS);
                    continue;
                }
                // Waited long enough: to the undeliverable topic, with its target recorded.
                if let Err(e) = self.to_undeliverable(&mut copy).await {
                    self.log_rarely(format_args!(
                        "moving scheduled message {off} to {UNDELIVERABLE_TOPIC}: {}",
                        e.message
                    ));
                    self.retry_later([off], now + PARK_MS);
                    continue;
                }
            }
            let owner = self.owner_of(&copy.topic, copy.queue_id);
            if owner == self.id {
                local.push((off, copy));
            } else {
                remote.push((off, owner, copy));
            }
        }
        for (off, owner, copy) in remote {
            let moved_away = copy.topic == UNDELIVERABLE_TOPIC;
            let ctx = self.clone();
            let Ok(one_of_few) = self.schedule_remote_moves.clone().try_acquire_owned() else {
                self.retry_later([off], now + REMOTE_MOVE_WAIT_MS);
                continue;
            };
            self.spawn_marking(async move {
                let _one_of_few = one_of_few;
                let put = MeshRequest::Put {
                    draft: copy,
                    wait: PutWait::NextFlush,
                };
                match ctx.call(owner, put).await {
                    Ok(MeshReply::Put { .. }) => {
                        let moved = u64::from(moved_away);
                        ctx.mark_done(0, vec![off], true, moved).await
                    }
                    other => {
                        ctx.log_rarely(format_args!(
                            "delivering scheduled message {off} to shard {owner}: {other:?}; trying again"
                        ));
                        ctx.retry_later([off], now_ms() + PARK_MS);
                    }
                }
            });
        }
        let mut delivered: Vec<u64> = Vec::with_capacity(local.len());
        let mut written = crate::store::Written {
            end: 0,
            epoch: u64::MAX,
        };
        let mut woken: Vec<(String, u32)> = Vec::new();
        let mut moved = 0u64;
        for (off, copy) in local {
            // Checked again with nothing awaited before the append: a move to the
            // undeliverable topic above may have waited while the topic was deleted, and an
            // append now would put the copy in a queue no one can read (or in the next topic
            // of that name).
            if self.known_queue(&copy.topic, copy.queue_id).is_err() {
                self.retry_later([off], now + PARK_MS);
                continue;
            }
            match self.store.append(&copy.draft()) {
                Ok(put) => {
                    written = written.max(put.written());
                    delivered.push(off);
                    moved += u64::from(copy.topic == UNDELIVERABLE_TOPIC);
                    if !woken
                        .iter()
                        .any(|(t, q)| *t == copy.topic && *q == copy.queue_id)
                    {
                        woken.push((copy.topic, copy.queue_id));
                    }
                }
                Err(e) => {
                    self.log_rarely(format_args!(
                        "delivering scheduled message {off}: {e}; trying again"
                    ));
                    self.retry_later([off], now + PARK_MS);
                }
            }
        }
        if delivered.is_empty() {
            return;
        }
        let end = written.end;
        if let Err(e) = self.store.acked(written).await {
            self.log_rarely(format_args!(
                "scheduled deliveries were not written ({e}); trying again"
            ));
            self.retry_later(delivered, now_ms() + PARK_MS);
            return;
        }
        for (topic, queue) in &woken {
            self.wake_pollers(topic, *queue);
        }
        let ctx = self.clone();
        self.spawn_marking(async move { ctx.mark_done(end, delivered, true, moved).await });
    }

    /// Spawns `work` (a copy stored on another shard and its done record, or a done
    /// record), counted in `marking` from now until it ends: a clean stop waits for it
    /// ([`stop_schedule`](Self::stop_schedule)). Counted from its first poll on, a stop
    /// could find nothing counted while a copy was being stored on another shard, and
    /// snapshot its entry as still held: delivered again after the restart.
    fn spawn_marking(self: &Rc<Self>, work: impl std::future::Future<Output = ()> + 'static) {
        self.schedule.borrow_mut().marking += 1;
        let ctx = self.clone();
        crate::io::spawn(async move {
            work.await;
            ctx.schedule.borrow_mut().marking -= 1;
        });
    }

    /// Creates the targets that do not exist: a group's retry or dead-letter topic always
    /// (as at a send-back), another topic if topics may be auto-created.
    async fn ensure_targets<'a>(self: &Rc<Self>, targets: impl Iterator<Item = (&'a str, u32)>) {
        let mut missing: Vec<&str> = Vec::new();
        for (topic, queue) in targets {
            if self.known_queue(topic, queue).is_err() && !missing.contains(&topic) {
                missing.push(topic);
            }
        }
        for topic in missing {
            let made =
                if topic.starts_with(RETRY_TOPIC_PREFIX) || topic.starts_with(DLQ_TOPIC_PREFIX) {
                    self.ensure_system_topic(topic).await
                } else {
                    self.ensure_topic(topic).await.map(|_| ())
                };
            if let Err(e) = made {
                self.log_rarely(format_args!(
                    "scheduled messages for {topic} wait: {}",
                    e.message
                ));
            }
        }
    }

    /// Redirects a copy whose target stayed missing to [`UNDELIVERABLE_TOPIC`].
    async fn to_undeliverable(self: &Rc<Self>, copy: &mut OwnedDraft) -> Result<(), ErrorBody> {
        self.ensure_system_topic(UNDELIVERABLE_TOPIC).await?;
        let queue = copy.queue_id.to_string();
        copy.properties = rebuild_properties(
            crate::protocol::record::Properties::new(&copy.properties),
            &[],
            &[(prop::REAL_TOPIC, &copy.topic), (prop::REAL_QID, &queue)],
        )?;
        copy.topic = UNDELIVERABLE_TOPIC.to_owned();
        copy.queue_id = 0;
        Ok(())
    }

    /// Once the copies (up to log offset `end`; 0: nothing to wait for) are durable,
    /// records that `offsets` were delivered and takes them out of the schedule. If that
    /// fails they go back in the wheel: delivered again (a duplicate), never lost.
    /// `undeliverable` of them were (unreadable, or moved to the undeliverable topic):
    /// counted once recorded, so a retried move is counted once.
    async fn mark_done(
        self: Rc<Self>,
        end: u64,
        offsets: Vec<u64>,
        delivered: bool,
        undeliverable: u64,
    ) {
        let recorded = self.record_done(end, &offsets).await;
        let mut s = self.schedule.borrow_mut();
        match recorded {
            Ok(()) => {
                for off in &offsets {
                    s.in_flight.remove(off);
                    s.unpark(*off);
                }
                if delivered {
                    s.delivered_total += offsets.len() as u64;
                }
                s.undeliverable_total += undeliverable;
                s.changed = true;
                drop(s);
                // Moves recorded (durable), counted as made: every time, not under the
                // once-a-minute budget, as these leave their schedule for good.
                if delivered && undeliverable > 0 {
                    crate::warn!(
                        "ringmq: shard {}: {undeliverable} scheduled message(s) waited {} ms for a queue that does not exist: moved to {UNDELIVERABLE_TOPIC}, their target kept in {} and {}",
                        self.id,
                        self.cfg.schedule_park_max_ms,
                        prop::REAL_TOPIC,
                        prop::REAL_QID
                    );
                }
            }
            Err(e) => {
                drop(s);
                self.log_rarely(format_args!(
                    "recording scheduled deliveries failed ({}); they are delivered again",
                    e.message
                ));
                self.retry_later(offsets, now_ms() + PARK_MS);
            }
        }
    }

    /// Appends the done record of `offsets` once the log is durable up to `end`.
    async fn record_done(&self, end: u64, offsets: &[u64]) -> Result<(), ErrorBody> {
        let io = |e: StoreError| err(ErrorCode::StoreIo, e.to_string());
        if end > 0 {
            // Readable already (acknowledged): no cut can drop it.
            self.store.durable_readable(end).await.map_err(io)?;
        }
        let body: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
        let record = RecordDraft {
            topic: SCHEDULE_DONE_TOPIC,
            queue_id: 0,
            flag: 0,
            sys_flag: 0,
            born_timestamp_ms: now_ms() as i64,
            born_host: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            reconsume_times: 0,
            transaction_offset: 0,
            properties: &[],
            body: &body,
        };
        self.store.append(&record).map(|_| ()).map_err(io)
    }

    /// The stored bytes of each due schedule entry; consecutive offsets are read at once.
    /// The turn's bytes are spent in due order (`due`'s): the entries past them get no
    /// answer and come again next turn, all due no sooner than those read. (Spent in
    /// offset order, a burst stored in the reverse of its due order was delivered out of
    /// it: later ones stored first went a turn ahead of earlier ones stored after.)
    async fn read_scheduled(
        &self,
        due: &[(u64, u64)],
    ) -> HashMap<u64, Result<Vec<u8>, ReadFailure>> {
        let max_bytes = self.cfg.frame_limits.records_bytes_max() as usize;
        // Offsets not read within it get no answer: their turn comes again (`None`).
        let mut budget = DELIVER_BYTES_MAX.max(max_bytes);
        let mut planned = 0usize;
        let mut offsets: Vec<u64> = Vec::with_capacity(due.len());
        for &(_, off) in due {
            // An entry that cannot be looked up is read (and its failure answered) all
            // the same; the read's own bound still holds.
            let size = match self.store.queue_entry(SCHEDULE_TOPIC, 0, off) {
                Ok(Some(entry)) => entry.size as usize,
                _ => 0,
            };
            if !offsets.is_empty() && planned + size > budget {
                break;
            }
            planned += size;
            offsets.push(off);
        }
        offsets.sort_unstable();
        let mut out = HashMap::with_capacity(offsets.len());
        let mut i = 0;
        // Only the offset whose own read fails may be taken for lost, not its neighbours.
        let mut alone = crate::store::AloneAfterDamage::default();
        while i < offsets.len() && budget > 0 {
            let start = offsets[i];
            let mut run = 1;
            while i + run < offsets.len() && offsets[i + run] == start + run as u64 {
                run += 1;
            }
            let run = alone.batch(start, run as u64) as usize;
            let read = self
                .store
                .read_queue(
                    SCHEDULE_TOPIC,
                    0,
                    start,
                    run as u32,
                    max_bytes.min(budget),
                    &[],
                )
                .await;
            match read {
                Ok(r) if !r.is_empty() => {
                    let n = r.len();
                    budget = budget.saturating_sub(r.records().map(<[u8]>::len).sum());
                    for (off, bytes) in r.queue_offsets().iter().zip(r.records()) {
                        out.insert(*off, Ok(bytes.to_vec()));
                    }
                    i += n.min(run);
                }
                Ok(_) | Err(StoreError::OffsetTooBig { .. }) => {
                    match self.store.queue_next_offset(SCHEDULE_TOPIC, 0) {
                        // So is every offset of the run after it.
                        Ok(Some(next)) if start >= next => {
                            for &off in &offsets[i..i + run] {
                                out.insert(off, Err(ReadFailure::NoMessage));
                            }
                            i += run;
                        }
                        _ => {
                            out.insert(start, Err(ReadFailure::NotReady));
                            i += 1;
                        }
                    }
                }
                Err(e) if alone.again_alone(start, run as u64, &e) => {}
                Err(e @ (StoreError::OffsetTooSmall { .. } | StoreError::Log(_))) => {
                    let failure = match &e {
                        StoreError::Log(crate::log::LogError::Io { .. }) => {
                            ReadFailure::Retry(e.to_string())
                        }
                        _ => ReadFailure::Lost(e.to_string()),
                    };
                    out.insert(start, Err(failure));
                    i += 1;
                }
                Err(e) => {
                    out.insert(start, Err(ReadFailure::Retry(e.to_string())));
                    i += 1;
                }
            }
        }
        out
    }

    /// The message a scheduled record stands for, as it is to be delivered.
    fn delivered_copy(&self, bytes: &[u8]) -> Result<OwnedDraft, ErrorBody> {
        let view = RecordView::parse(bytes).map_err(|e| err(ErrorCode::StoreIo, e.to_string()))?;
        let props = view.properties();
        let topic = props
            .get(prop::REAL_TOPIC)
            .ok_or_else(|| err(ErrorCode::Internal, "scheduled record without REAL_TOPIC"))?;
        let queue_id: u32 = props
            .get(prop::REAL_QID)
            .and_then(|q| q.parse().ok())
            .ok_or_else(|| err(ErrorCode::Internal, "scheduled record without REAL_QID"))?;
        let id = MessageId {
            broker_id: self.cfg.broker_id,
            store_id: self.id,
            physical_offset: view.physical_offset(),
        }
        .to_string();
        let origin = props.get(prop::ORIGIN_MESSAGE_ID).unwrap_or(&id).to_owned();
        let properties = rebuild_properties(
            props,
            &SCHEDULE_PROPS,
            &[(prop::ORIGIN_MESSAGE_ID, &origin)],
        )?;
        Ok(OwnedDraft {
            topic: topic.to_owned(),
            queue_id,
            flag: view.flag(),
            born_timestamp_ms: view.born_timestamp_ms(),
            born_host: view.born_host(),
            reconsume_times: view.reconsume_times(),
            properties,
            body: view.body().to_vec(),
        })
    }

    /// Moves held messages stored where retention wants to delete forward: each is copied
    /// to a new schedule entry (same due time), and once the copies are durable (in the
    /// epoch they were appended in: a full disk may cut them) a done record takes the old
    /// entries out. A message held for days thus holds only its own
    /// bytes, not days of the shard's log. A crash in between delivers it twice.
    async fn roll_forward(self: &Rc<Self>) {
        let wanted = self
            .store
            .log()
            .retention_wanted_end(crate::log::now_ms())
            .await;
        // One search of the index, not a look-up per held message (millions, on the
        // shard's thread). If it fails, they stay this pass (the floor holds them).
        let doomed = match self.store.queue_offsets_before(SCHEDULE_TOPIC, 0, wanted) {
            Ok(doomed) if !doomed.is_empty() => doomed,
            Ok(_) => return,
            Err(e) => {
                self.log_rarely(format_args!("moving held scheduled messages forward: {e}"));
                return;
            }
        };
        let now = now_ms();
        // Messages due before the next pass are delivered rather than moved.
        let not_before = now + 2 * self.cfg.retention_check_interval_ms;
        let old: Vec<(u64, u64)> = {
            let s = self.schedule.borrow();
            let mut old: Vec<(u64, u64)> = s
                .wheel
                .iter()
                .filter(|(due, off)| {
                    *due > not_before && doomed.contains(*off) && !s.superseded.contains(off)
                })
                .map(|(due, off)| (due, *off))
                .collect();
            old.sort_unstable_by_key(|&(_, off)| off);
            old.truncate(ROLL_BATCH_MAX);
            old
        };
        if old.is_empty() {
            return;
        }
        // No snapshot until the copies are in the wheel: one taken between would cover
        // their offsets (the schedule's end) without them, and a restart would not read
        // them again from the log.
        let no_snapshot = self.snapshotting.lock().await;
        let mut moved = Vec::with_capacity(old.len());
        let mut copies = Vec::with_capacity(old.len());
        let mut written: Option<Written> = None;
        // Those that cannot be read stay (and hold retention where they are): said once a
        // pass, with the first, not skipped in silence (nor through `log_rarely`, whose
        // one line a minute they would take every pass).
        let mut unreadable: (usize, Option<(u64, String)>) = (0, None);
        for (due, off) in old {
            let read = self.store.read_at(SCHEDULE_TOPIC, 0, off).await;
            let parsed = read
                .as_ref()
                .map_err(|e| e.to_string())
                .and_then(|buf| RecordView::parse(buf).map_err(|e| e.to_string()));
            let view = match parsed {
                Ok(view) => view,
                Err(e) => {
                    unreadable.0 += 1;
                    unreadable.1.get_or_insert((off, e));
                    continue;
                }
            };
            // The copy keeps the id its producer was given (that of the record moved, the
            // first time): delivery names the message by it.
            let props = view.properties();
            let with_origin = match props.get(prop::ORIGIN_MESSAGE_ID) {
                Some(_) => None,
                None => {
                    let id = MessageId {
                        broker_id: self.cfg.broker_id,
                        store_id: self.id,
                        physical_offset: view.physical_offset(),
                    }
                    .to_string();
                    rebuild_properties(props, &[], &[(prop::ORIGIN_MESSAGE_ID, &id)]).ok()
                }
            };
            let draft = RecordDraft {
                topic: SCHEDULE_TOPIC,
                queue_id: 0,
                flag: view.flag(),
                sys_flag: view.sys_flag(),
                born_timestamp_ms: view.born_timestamp_ms(),
                born_host: view.born_host(),
                reconsume_times: view.reconsume_times(),
                transaction_offset: view.transaction_offset(),
                properties: with_origin.as_deref().unwrap_or(props.as_bytes()),
                body: view.body(),
            };
            match self.store.append(&draft) {
                Ok(put) => {
                    self.schedule_appended(&put);
                    written = Some(written.map_or(put.written(), |w| w.max(put.written())));
                    copies.push((due, put.queue_offset));
                    moved.push(off);
                }
                Err(e) => {
                    self.log_rarely(format_args!("moving held scheduled messages forward: {e}"));
                    break;
                }
            }
        }
        if let (n, Some((off, e))) = unreadable {
            crate::warn!(
                "ringmq: shard {}: {n} held scheduled messages could not be read to move them forward (the first, {off}: {e}); they keep retention from their segments",
                self.id
            );
        }
        let Some(written) = written else {
            return;
        };
        // The copies count once durable: a full disk may cut them from the log (their
        // offsets then hold other messages), and the old entries stay.
        if let Err(e) = self.store.durable(written).await {
            self.log_rarely(format_args!("moving held scheduled messages forward: {e}"));
            return;
        }
        {
            let mut s = self.schedule.borrow_mut();
            for (&old, (due, copy)) in moved.iter().zip(copies) {
                s.wheel.insert(due, copy);
                // A parked message's copy waits for its target from when it did.
                if let Some(p) = s.parked.get(&old).cloned() {
                    s.parked.insert(copy, p);
                }
            }
            s.changed = true;
        }
        drop(no_snapshot);
        // The old entries stay in the wheel (skipped when they fall due) until the done
        // record that takes them out is written.
        match self.record_done(written.end, &moved).await {
            Ok(_) => {
                self.schedule.borrow_mut().supersede(moved);
                // The floor moves with the next snapshot: take it now.
                self.snapshot_schedule().await;
            }
            // Both the old entries and their copies stay due: each such message is then
            // delivered twice (never lost), and retention waits for the old ones.
            Err(e) => self.log_rarely(format_args!(
                "retiring {} held scheduled messages moved forward: {e}; they will be delivered twice",
                moved.len()
            )),
        }
    }

    /// Logs a line about the schedule at most once a minute (per shard).
    pub(super) fn log_rarely(&self, what: std::fmt::Arguments<'_>) {
        let now = now_ms();
        if now >= self.schedule_log_after.get() {
            self.schedule_log_after.set(now + LOG_EVERY_MS);
            crate::say!("ringmq: shard {}: {what}", self.id);
        }
    }
}
