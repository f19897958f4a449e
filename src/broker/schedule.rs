//! The schedule of delayed messages of one shard: messages sent with a delay level, a delay
//! or a delivery time (and retries waiting on their group's retry topic) are held here and
//! put on their real queue when due.
//!
//! Where they live: a message for a queue this shard owns is appended to the shard's own log
//! under the system topic `%SYS_SCHEDULE%` (one queue), with its target in `REAL_TOPIC` /
//! `REAL_QID` and its due time in `TIMER_OUT_MS`; that queue's consume-queue entries carry
//! the due time where other queues carry a tag hash. In memory, a hierarchical timing wheel
//! (`index::timing_wheel`, O(1) insert) holds (due time, schedule offset) of every message
//! not yet delivered.
//!
//! Delivery: a task per shard takes what is due, at most [`DELIVER_BATCH_MAX`] at a time
//! (so a burst is spread over several turns and the shard keeps serving), reads the records
//! (consecutive schedule offsets in one read), appends each to its real queue with its
//! original properties (delay properties cleared, `ORIGIN_MESSAGE_ID` recorded), wakes the
//! queues' long polls once written, and once an fdatasync covers the copies appends a "done"
//! record (`%SYS_SCHEDULE_DONE%`, body: the schedule offsets delivered).
//!
//! Crash safety: every few seconds (and at a clean stop) a snapshot of the wheel (plus the
//! deliveries in flight) is written with the schedule's and the done queue's ends at that
//! moment. Start-up loads the snapshot, adds schedule entries past its end, removes those
//! named by done records past its end, and rebuilds the wheel. A message is taken out of
//! the schedule only by a done record, which is written only after its copy is durable, so
//! no due message is lost; one delivered but whose done record did not reach the disk
//! before a crash is delivered again (at most the deliveries of the last
//! `flush_interval_ms` plus one batch: the crash window). Retention never deletes the log
//! from the oldest undelivered scheduled message on (the store's retention floor).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::mesh::{MeshReply, MeshRequest};
use super::{err, ShardCtx};
use crate::index::TimingWheel;
use crate::protocol::delay::asks_for_delay;
use crate::protocol::record::{prop, Properties, PropertiesBuilder, RecordDraft, RecordView};
use crate::protocol::{ErrorBody, ErrorCode, MessageId, ShardScheduleInfo};
use crate::store::{MessageStore, PutResult, SCHEDULE_DONE_TOPIC, SCHEDULE_TOPIC};

/// Most messages one delivery turn takes from the wheel.
pub const DELIVER_BATCH_MAX: usize = 512;
/// Messages a shard may hold in its schedule by default (16 bytes each in memory).
pub const SCHEDULE_PENDING_MAX_DEFAULT: usize = 2_000_000;
/// How often the wheel is snapshotted (when it changed).
const SNAPSHOT_INTERVAL_MS: u64 = 5_000;
/// Longest the delivery task sleeps without looking at the wheel.
const IDLE_WAKE_MS: u64 = 1_000;
/// How long a message whose target topic is gone waits before the next try.
const PARK_MS: u64 = 5_000;
/// How long a message whose record is not written yet waits before the next try.
const NOT_YET_WRITTEN_MS: u64 = 2;
/// Schedule entries read per recovery step.
const RECOVERY_SCAN_STEP: usize = 65_536;
const SNAPSHOT_MAGIC: &[u8; 8] = b"RMQSCHD1";
const SNAPSHOT_FILE: &str = "schedule.snapshot";

/// Properties of a scheduled copy that the delivered message does not carry.
const SCHEDULE_PROPS: [&str; 6] = prop::DELAY_PROPERTIES;

/// The in-memory side of one shard's schedule.
pub struct Schedule {
    wheel: TimingWheel<u64>,
    /// Taken from the wheel, not yet marked done: schedule offset → due time.
    in_flight: BTreeMap<u64, u64>,
    /// Offsets waiting for their target topic to exist again.
    parked: BTreeSet<u64>,
    delivered_total: u64,
    /// Something changed since the last snapshot.
    changed: bool,
}

/// A message to store, owned: a send that travels to another shard, a send-back, a
/// delivery.
#[derive(Debug, Clone)]
pub struct OwnedDraft {
    pub topic: String,
    pub queue_id: u32,
    pub flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: std::net::SocketAddr,
    pub reconsume_times: u32,
    pub properties: Vec<u8>,
    pub body: Vec<u8>,
}

impl OwnedDraft {
    pub fn draft(&self) -> RecordDraft<'_> {
        RecordDraft {
            topic: &self.topic,
            queue_id: self.queue_id,
            flag: self.flag,
            sys_flag: 0,
            born_timestamp_ms: self.born_timestamp_ms,
            born_host: self.born_host,
            reconsume_times: self.reconsume_times,
            transaction_offset: 0,
            properties: &self.properties,
            body: &self.body,
        }
    }
}

/// A property block with `drop` removed and `add` appended.
pub fn rebuild_properties(
    props: Properties<'_>,
    drop: &[&str],
    add: &[(&str, &str)],
) -> Result<Vec<u8>, ErrorBody> {
    let mut b = PropertiesBuilder::new();
    let bad =
        |e: crate::protocol::record::RecordError| err(ErrorCode::InvalidMessage, e.to_string());
    for (name, value) in props.iter() {
        if !drop.contains(&name) && !add.iter().any(|(n, _)| *n == name) {
            b.put(name, value).map_err(bad)?;
        }
    }
    for (name, value) in add {
        b.put(name, value).map_err(bad)?;
    }
    let bytes = b.into_bytes();
    if bytes.len() > crate::protocol::record::PROPERTIES_BYTES_MAX {
        return Err(err(
            ErrorCode::InvalidMessage,
            "the message's properties grew past their limit",
        ));
    }
    Ok(bytes)
}

fn now_ms() -> u64 {
    crate::log::now_ms().max(0) as u64
}

impl Schedule {
    fn new(now: u64) -> Schedule {
        Schedule {
            wheel: TimingWheel::new(now),
            in_flight: BTreeMap::new(),
            parked: BTreeSet::new(),
            delivered_total: 0,
            changed: false,
        }
    }

    /// Messages held: waiting in the wheel or being delivered.
    pub fn pending(&self) -> usize {
        self.wheel.len() + self.in_flight.len()
    }

    /// Every held message: (due, schedule offset).
    fn entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.wheel
            .iter()
            .map(|(due, off)| (due, *off))
            .chain(self.in_flight.iter().map(|(off, due)| (*due, *off)))
    }

    /// Rebuilds the schedule of `store` after a start: the last snapshot, plus the entries
    /// scheduled after it, minus those delivered after it.
    pub async fn recover(store: &MessageStore) -> Result<Schedule, String> {
        let started = Instant::now();
        let path = store.dir().join(SNAPSHOT_FILE);
        let snapshot = crate::io::blocking(move || read_snapshot(&path)).await;
        let snapshot = match snapshot {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "ringmq: {}: {e}; rebuilding the schedule from the log",
                    store.dir().display()
                );
                None
            }
        };
        let (min, end) = store.queue_range(SCHEDULE_TOPIC, 0);
        let (done_min, done_end) = store.queue_range(SCHEDULE_DONE_TOPIC, 0);
        let mut pending: HashMap<u64, u64> = HashMap::new();
        let (from, done_from) = match &snapshot {
            Some(s) => {
                for &(due, off) in &s.entries {
                    if (min..end).contains(&off) {
                        pending.insert(off, due);
                    }
                }
                (s.schedule_end, s.done_end)
            }
            None => (min, done_min),
        };
        let mut next = from.max(min);
        while next < end {
            let entries = store.queue_entries(SCHEDULE_TOPIC, 0, next, RECOVERY_SCAN_STEP);
            let Some(&(last, _)) = entries.last() else {
                break;
            };
            for (off, e) in entries {
                pending.insert(off, e.tag_hash);
            }
            next = last + 1;
        }
        let mut done = 0u64;
        for off in done_from.max(done_min)..done_end {
            let buf = store
                .read_at(SCHEDULE_DONE_TOPIC, 0, off)
                .await
                .map_err(|e| format!("reading schedule done record {off}: {e}"))?;
            let view = RecordView::parse(&buf).map_err(|e| format!("done record {off}: {e}"))?;
            for chunk in view.body().chunks_exact(8) {
                let mut b = [0u8; 8];
                b.copy_from_slice(chunk);
                if pending.remove(&u64::from_le_bytes(b)).is_some() {
                    done += 1;
                }
            }
        }
        let mut schedule = Schedule::new(now_ms());
        for (off, due) in pending {
            schedule.wheel.insert(due, off);
        }
        if from > min || done_from > done_min || done > 0 || !schedule.wheel.is_empty() {
            eprintln!(
                "ringmq: {}: schedule recovered in {} ms: {} messages waiting ({} entries and {} done records read past the snapshot)",
                store.dir().display(),
                started.elapsed().as_millis(),
                schedule.wheel.len(),
                end.saturating_sub(from.max(min)),
                done_end.saturating_sub(done_from.max(done_min)),
            );
        }
        store.set_retention_floor(retention_floor(store, &schedule, done_from.max(done_min)));
        Ok(schedule)
    }
}

/// The oldest log offset the schedule still needs: its oldest held message, or the first
/// done record a recovery would read.
fn retention_floor(store: &MessageStore, schedule: &Schedule, done_from: u64) -> u64 {
    let oldest = schedule.entries().map(|(_, off)| off).min();
    let held = oldest
        .and_then(|off| store.queue_entry(SCHEDULE_TOPIC, 0, off))
        .map(|e| e.physical_offset);
    let done = store
        .queue_entry(SCHEDULE_DONE_TOPIC, 0, done_from)
        .map(|e| e.physical_offset);
    held.into_iter().chain(done).min().unwrap_or(u64::MAX)
}

struct Snapshot {
    schedule_end: u64,
    done_end: u64,
    entries: Vec<(u64, u64)>,
}

fn encode_snapshot(s: &Snapshot) -> Vec<u8> {
    let mut out = Vec::with_capacity(36 + 16 * s.entries.len());
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&s.schedule_end.to_le_bytes());
    out.extend_from_slice(&s.done_end.to_le_bytes());
    out.extend_from_slice(&(s.entries.len() as u64).to_le_bytes());
    for (due, off) in &s.entries {
        out.extend_from_slice(&due.to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn decode_snapshot(bytes: &[u8]) -> Result<Snapshot, String> {
    let bad = |why: &str| format!("schedule snapshot is damaged ({why})");
    if bytes.len() < 36 || &bytes[..8] != SNAPSHOT_MAGIC {
        return Err(bad("bad header"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32c::crc32c(body) != crc {
        return Err(bad("checksum"));
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let count = u64_at(24);
    if (body.len() as u64 - 32) != count.saturating_mul(16) {
        return Err(bad("length"));
    }
    let entries = (0..count as usize)
        .map(|i| (u64_at(32 + 16 * i), u64_at(40 + 16 * i)))
        .collect();
    Ok(Snapshot {
        schedule_end: u64_at(8),
        done_end: u64_at(16),
        entries,
    })
}

fn read_snapshot(path: &Path) -> Result<Option<Snapshot>, String> {
    match std::fs::read(path) {
        Ok(bytes) => decode_snapshot(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

/// Writes the snapshot atomically: a temporary file, fsync, rename, directory fsync.
fn write_snapshot(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp: PathBuf = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_data()?;
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

impl ShardCtx {
    /// Stores a message, holding it in the schedule when it asks for a delay still to come
    /// (a time already past is stored at once, without its delay properties). Runs now, in
    /// arrival order. A scheduled message's result carries `QUEUE_OFFSET_SCHEDULED`.
    pub(super) fn put_draft(&self, draft: &RecordDraft<'_>) -> Result<PutResult, ErrorBody> {
        let props = Properties::new(draft.properties);
        if !asks_for_delay(&props) {
            return self.store.append(draft).map_err(super::store_error);
        }
        let now = now_ms() as i64;
        let at = self
            .cfg
            .delay
            .deliver_at(&props, now)
            .map_err(|e| err(ErrorCode::InvalidDelay, e.to_string()))?;
        match at {
            Some(at) if at > now => self.schedule_append(draft, at as u64),
            _ => {
                let cleared = rebuild_properties(props, &SCHEDULE_PROPS, &[])?;
                let draft = RecordDraft {
                    properties: &cleared,
                    ..*draft
                };
                self.store.append(&draft).map_err(super::store_error)
            }
        }
    }

    fn schedule_append(&self, draft: &RecordDraft<'_>, due: u64) -> Result<PutResult, ErrorBody> {
        if self.schedule.borrow().pending() >= self.cfg.schedule_pending_max {
            return Err(err(
                ErrorCode::ScheduleFull,
                format!(
                    "shard {} holds {} delayed messages, its limit; try again later",
                    self.id, self.cfg.schedule_pending_max
                ),
            ));
        }
        let queue = draft.queue_id.to_string();
        let due_text = due.to_string();
        let props = rebuild_properties(
            Properties::new(draft.properties),
            &[],
            &[
                (prop::REAL_TOPIC, draft.topic),
                (prop::REAL_QID, &queue),
                (prop::TIMER_OUT_MS, &due_text),
            ],
        )?;
        let held = RecordDraft {
            topic: SCHEDULE_TOPIC,
            queue_id: 0,
            properties: &props,
            ..*draft
        };
        let put = self.store.append(&held).map_err(super::store_error)?;
        let mut s = self.schedule.borrow_mut();
        s.wheel.insert(due, put.queue_offset);
        s.changed = true;
        drop(s);
        self.schedule_wake.notify_one();
        Ok(PutResult {
            queue_offset: crate::protocol::QUEUE_OFFSET_SCHEDULED,
            ..put
        })
    }

    /// The delivery task of this shard's schedule; runs until the shard stops.
    pub async fn run_schedule(self: Rc<Self>) {
        let mut due = Vec::with_capacity(DELIVER_BATCH_MAX);
        let mut next_snapshot = Instant::now() + Duration::from_millis(SNAPSHOT_INTERVAL_MS);
        while !self.stopping.get() {
            if Instant::now() >= next_snapshot {
                next_snapshot = Instant::now() + Duration::from_millis(SNAPSHOT_INTERVAL_MS);
                self.snapshot_schedule().await;
            }
            due.clear();
            let now = now_ms();
            {
                let mut s = self.schedule.borrow_mut();
                s.wheel.poll(now, DELIVER_BATCH_MAX, &mut due);
                for &(d, off) in &due {
                    s.in_flight.insert(off, d);
                }
            }
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
    }

    /// Delivers one batch taken from the wheel (all now in flight).
    async fn deliver(self: &Rc<Self>, due: &[(u64, u64)]) {
        let records = self.read_scheduled(due).await;
        let now = now_ms();
        let mut local: Vec<(u64, OwnedDraft)> = Vec::with_capacity(due.len());
        let mut later: Vec<(u64, u64)> = Vec::new();
        for &(_, off) in due {
            match records.get(&off) {
                Some(Ok(bytes)) => match self.delivered_copy(bytes) {
                    Ok(copy) => local.push((off, copy)),
                    Err(e) => {
                        eprintln!(
                            "ringmq: shard {}: scheduled message {off} cannot be delivered: {}; parked",
                            self.id, e.message
                        );
                        later.push((now + PARK_MS, off));
                    }
                },
                Some(Err(NotReady)) => later.push((now + NOT_YET_WRITTEN_MS, off)),
                None => later.push((now + PARK_MS, off)),
            }
        }
        // Targets must exist (a topic deleted meanwhile is created again when topics may
        // be auto-created; otherwise its messages wait).
        let mut missing: Vec<String> = Vec::new();
        for (_, d) in &local {
            if self.known_queue(&d.topic, d.queue_id).is_err() && !missing.contains(&d.topic) {
                missing.push(d.topic.clone());
            }
        }
        for topic in &missing {
            if let Err(e) = self.ensure_topic(topic).await {
                eprintln!(
                    "ringmq: shard {}: scheduled messages for {topic} wait: {}",
                    self.id, e.message
                );
            }
        }
        let mut remote: Vec<(u64, u32, OwnedDraft)> = Vec::new();
        let mut delivered: Vec<u64> = Vec::with_capacity(local.len());
        let mut end = 0u64;
        let mut woken: Vec<(String, u32)> = Vec::new();
        {
            let mut parked = Vec::new();
            for (off, copy) in local {
                if self.known_queue(&copy.topic, copy.queue_id).is_err() {
                    parked.push(off);
                    later.push((now + PARK_MS, off));
                    continue;
                }
                let owner = self.owner_of(&copy.topic, copy.queue_id);
                if owner != self.id {
                    remote.push((off, owner, copy));
                    continue;
                }
                match self.store.append(&copy.draft()) {
                    Ok(put) => {
                        end = end.max(put.end());
                        delivered.push(off);
                        if !woken
                            .iter()
                            .any(|(t, q)| *t == copy.topic && *q == copy.queue_id)
                        {
                            woken.push((copy.topic, copy.queue_id));
                        }
                    }
                    Err(e) => {
                        eprintln!(
                            "ringmq: shard {}: delivering scheduled message {off}: {e}; retrying",
                            self.id
                        );
                        later.push((now + PARK_MS, off));
                    }
                }
            }
            let mut s = self.schedule.borrow_mut();
            for off in parked {
                s.parked.insert(off);
            }
            for &(due, off) in &later {
                s.in_flight.remove(&off);
                s.wheel.insert(due, off);
            }
        }
        if !delivered.is_empty() {
            if let Err(e) = self.store.acked(end).await {
                eprintln!(
                    "ringmq: shard {}: scheduled deliveries were not written: {e}",
                    self.id
                );
                return;
            }
            for (topic, queue) in &woken {
                self.wake_pollers(topic, *queue);
            }
            let ctx = self.clone();
            crate::io::spawn(async move { ctx.mark_done(end, delivered).await });
        }
        for (off, owner, copy) in remote {
            let ctx = self.clone();
            crate::io::spawn(async move {
                let put = MeshRequest::Put {
                    draft: copy,
                    durable: true,
                };
                match ctx.call(owner, put).await {
                    Ok(MeshReply::Put { .. }) => ctx.mark_done(0, vec![off]).await,
                    other => {
                        eprintln!(
                            "ringmq: shard {}: delivering scheduled message {off} to shard {owner}: {other:?}; retrying",
                            ctx.id
                        );
                        let mut s = ctx.schedule.borrow_mut();
                        s.in_flight.remove(&off);
                        s.wheel.insert(now_ms() + PARK_MS, off);
                    }
                }
            });
        }
    }

    /// Once the copies (up to log offset `end`) are durable, records that `offsets` were
    /// delivered and takes them out of the schedule.
    async fn mark_done(self: Rc<Self>, end: u64, offsets: Vec<u64>) {
        if end > 0 {
            if let Err(e) = self.store.durable(end).await {
                eprintln!(
                    "ringmq: shard {}: scheduled deliveries did not reach the disk: {e}; they are delivered again after a restart",
                    self.id
                );
                return;
            }
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
        if let Err(e) = self.store.append(&record) {
            eprintln!(
                "ringmq: shard {}: recording scheduled deliveries: {e}; they are delivered again after a restart",
                self.id
            );
            return;
        }
        let mut s = self.schedule.borrow_mut();
        for off in &offsets {
            s.in_flight.remove(off);
            s.parked.remove(off);
        }
        s.delivered_total += offsets.len() as u64;
        s.changed = true;
    }

    /// The stored bytes of each due schedule entry; consecutive offsets are read at once.
    async fn read_scheduled(&self, due: &[(u64, u64)]) -> HashMap<u64, Result<Vec<u8>, NotReady>> {
        let mut offsets: Vec<u64> = due.iter().map(|&(_, off)| off).collect();
        offsets.sort_unstable();
        let mut out = HashMap::with_capacity(offsets.len());
        let max_bytes = self.cfg.frame_limits.records_bytes_max() as usize;
        let mut i = 0;
        while i < offsets.len() {
            let start = offsets[i];
            let mut run = 1;
            while i + run < offsets.len() && offsets[i + run] == start + run as u64 {
                run += 1;
            }
            let read = self
                .store
                .read_queue(SCHEDULE_TOPIC, 0, start, run as u32, max_bytes, &[])
                .await;
            match read {
                Ok(r) if !r.is_empty() => {
                    let n = r.len();
                    for (off, bytes) in r.queue_offsets().iter().zip(r.records()) {
                        out.insert(*off, Ok(bytes.to_vec()));
                    }
                    i += n.min(run);
                }
                Ok(_) | Err(crate::store::StoreError::OffsetTooBig { .. }) => {
                    // Appended but not written yet.
                    out.insert(start, Err(NotReady));
                    i += 1;
                }
                Err(e) => {
                    eprintln!(
                        "ringmq: shard {}: reading scheduled message {start}: {e}",
                        self.id
                    );
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

    /// Writes a snapshot of the schedule if it changed, and moves the retention floor up
    /// to what the schedule still needs.
    pub async fn snapshot_schedule(&self) {
        let (bytes, done_end) = {
            let mut s = self.schedule.borrow_mut();
            if !s.changed {
                return;
            }
            s.changed = false;
            let snapshot = Snapshot {
                schedule_end: self.store.queue_range(SCHEDULE_TOPIC, 0).1,
                done_end: self.store.queue_range(SCHEDULE_DONE_TOPIC, 0).1,
                entries: s.entries().collect(),
            };
            (encode_snapshot(&snapshot), snapshot.done_end)
        };
        let dir = self.store.dir().to_owned();
        match crate::io::blocking(move || write_snapshot(&dir, &bytes)).await {
            Ok(()) => {
                let floor = retention_floor(&self.store, &self.schedule.borrow(), done_end);
                self.store.set_retention_floor(floor);
            }
            Err(e) => {
                self.schedule.borrow_mut().changed = true;
                eprintln!(
                    "ringmq: shard {}: writing the schedule snapshot: {e}",
                    self.id
                );
            }
        }
    }

    /// This shard's part of `ScheduleStats`.
    pub(super) fn local_schedule_info(&self) -> ShardScheduleInfo {
        let s = self.schedule.borrow();
        let now = now_ms();
        let mut next: Option<u64> = None;
        let mut overdue = 0u64;
        for (due, _) in s.entries() {
            next = Some(next.map_or(due, |n| n.min(due)));
            if due <= now {
                overdue += 1;
            }
        }
        ShardScheduleInfo {
            shard: self.id,
            pending: s.pending() as u64,
            in_flight: s.in_flight.len() as u64,
            next_due_ms: next.map_or(-1, |n| n as i64),
            overdue,
            delivered_total: s.delivered_total,
            parked: s.parked.len() as u64,
        }
    }

    /// `ScheduleStats`: every shard's schedule.
    pub(super) async fn schedule_stats(
        self: Rc<Self>,
    ) -> Result<crate::protocol::ScheduleInfo, ErrorBody> {
        let mut shards = vec![self.local_schedule_info()];
        for to in (0..self.shard_count).filter(|&s| s != self.id) {
            if let MeshReply::Schedule(info) = self.call(to, MeshRequest::ScheduleStats).await? {
                shards.push(info);
            }
        }
        shards.sort_by_key(|s| s.shard);
        Ok(crate::protocol::ScheduleInfo { shards })
    }
}

/// A scheduled record appended but not written yet.
#[derive(Debug)]
struct NotReady;

/// A fresh schedule, for a shard that recovered nothing (tests).
pub fn empty_schedule() -> Schedule {
    Schedule::new(now_ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip_and_damage_is_detected() {
        let s = Snapshot {
            schedule_end: 7,
            done_end: 3,
            entries: vec![(100, 1), (50, 6)],
        };
        let bytes = encode_snapshot(&s);
        let back = decode_snapshot(&bytes).unwrap();
        assert_eq!(
            (back.schedule_end, back.done_end, back.entries),
            (7, 3, vec![(100, 1), (50, 6)])
        );
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode_snapshot(&bad).is_err(), "flip at {i}");
        }
        assert!(decode_snapshot(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn properties_are_rebuilt() {
        let mut b = PropertiesBuilder::new();
        b.put("TAGS", "a").unwrap();
        b.put("DELAY", "3").unwrap();
        b.put("REAL_TOPIC", "old").unwrap();
        let bytes = b.into_bytes();
        let out = rebuild_properties(
            Properties::new(&bytes),
            &["DELAY"],
            &[("REAL_TOPIC", "new"), ("X", "1")],
        )
        .unwrap();
        let p = Properties::new(&out);
        assert_eq!(p.get("TAGS"), Some("a"));
        assert_eq!(p.get("DELAY"), None);
        assert_eq!(p.get("REAL_TOPIC"), Some("new"));
        assert_eq!(p.get("X"), Some("1"));
        assert_eq!(p.iter().count(), 3);
    }
}
