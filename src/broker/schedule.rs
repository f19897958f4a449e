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
//! and about 32 MiB of records (the rest of a turn is taken again next turn; so a burst is
//! spread over several turns and the shard keeps serving), reads the records
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use super::mesh::{MeshReply, MeshRequest};
use super::{err, ShardCtx};
use crate::index::TimingWheel;
use crate::protocol::delay::asks_for_delay;
use crate::protocol::names::RETRY_TOPIC_PREFIX;
use crate::protocol::record::{prop, Properties, PropertiesBuilder, RecordDraft, RecordView};
use crate::protocol::{ErrorBody, ErrorCode, ShardScheduleInfo};
use crate::store::{Holder, MessageStore, PutResult, SCHEDULE_DONE_TOPIC, SCHEDULE_TOPIC};

/// Messages a shard may hold in its schedule by default (16 bytes each in memory).
pub const SCHEDULE_PENDING_MAX_DEFAULT: usize = 2_000_000;
/// How long a message whose target topic is gone waits before the next try.
const PARK_MS: u64 = 5_000;
/// How long a message waits for its target topic before it goes to
/// [`UNDELIVERABLE_TOPIC`].
pub const PARK_MAX_MS: u64 = 3_600_000;
/// Where a delayed message goes whose target topic stayed missing for [`PARK_MAX_MS`]
/// (one queue; it keeps `REAL_TOPIC` and `REAL_QID`), so that it neither waits forever nor
/// holds the log back from retention.
pub const UNDELIVERABLE_TOPIC: &str = "%UNDELIVERABLE%";
/// How long a message whose record is not written yet waits before the next try.
const NOT_YET_WRITTEN_MS: u64 = 2;
/// Schedule entries read per recovery step.
const RECOVERY_SCAN_STEP: usize = 65_536;
const SNAPSHOT_MAGIC: &[u8; 8] = b"RMQSCHD1";
const SNAPSHOT_FILE: &str = "schedule.snapshot";

/// Properties of a scheduled copy that the delivered message does not carry.
const SCHEDULE_PROPS: [&str; 6] = prop::DELAY_PROPERTIES;

mod deliver;
pub(super) use deliver::REMOTE_MOVES_MAX;

/// The in-memory side of one shard's schedule.
pub struct Schedule {
    wheel: TimingWheel<u64>,
    /// Taken from the wheel, not yet marked done: schedule offset → due time.
    in_flight: BTreeMap<u64, u64>,
    /// Offsets waiting for their target queue to exist again, with it and when they were
    /// first parked. Until it exists (or they have waited their most), they come due and
    /// go back to the wheel without their records being read again.
    parked: BTreeMap<u64, Parked>,
    /// The target topics of `parked`, each held once (a burst for one deleted topic
    /// shares its name).
    parked_topics: HashSet<Rc<str>>,
    /// Offsets whose message was copied to a newer schedule entry (so that retention can
    /// go on): skipped when they fall due.
    superseded: HashSet<u64>,
    delivered_total: u64,
    /// Messages that could not be delivered: their record is unreadable, or their target
    /// stayed missing for [`PARK_MAX_MS`] (then they went to [`UNDELIVERABLE_TOPIC`]).
    undeliverable_total: u64,
    /// Deliveries whose copies are being stored on another shard, and done records being
    /// written (each waits for its copies to be durable): a clean stop waits for none.
    marking: usize,
    /// The delivery task runs.
    running: bool,
    /// Something changed since the last snapshot.
    changed: bool,
    /// The retention floor was set short of what it should be: everything (0), a lookup
    /// having failed, or the log's readable end, a held message being written then. Set
    /// again at each snapshot pass until neither, changed or not.
    floor_held: bool,
    /// The log's cut count at the last append to the schedule's queue (`appended`).
    epoch: u64,
}

/// A message waiting for its target queue to exist again.
#[derive(Debug, Clone)]
struct Parked {
    /// When it was first found waiting (ms since the epoch).
    since: u64,
    topic: Rc<str>,
    queue_id: u32,
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
            parked: BTreeMap::new(),
            parked_topics: HashSet::new(),
            superseded: HashSet::new(),
            delivered_total: 0,
            undeliverable_total: 0,
            marking: 0,
            running: false,
            changed: false,
            floor_held: false,
            epoch: 0,
        }
    }

    /// A record was appended to the schedule's queue at `offset` under the log's cut count
    /// `epoch`. If the log was cut since the last one, the entries at or past `offset`
    /// name records the cut dropped (their sends were refused): they go now, before
    /// their offsets hold other messages, which they would deliver a second time (a
    /// delivery already under way is not stopped). Returns how many went.
    fn appended(&mut self, epoch: u64, offset: u64) -> usize {
        if epoch == self.epoch {
            return 0;
        }
        self.epoch = epoch;
        let before = self.wheel.len();
        self.wheel.retain(|_, &off| off < offset);
        self.parked.retain(|&off, _| off < offset);
        self.parked_topics.retain(|t| Rc::strong_count(t) > 1);
        self.superseded.retain(|&off| off < offset);
        let dropped = before - self.wheel.len();
        self.changed |= dropped > 0;
        dropped
    }

    /// Records that `off`, whose target `topic`[`queue_id`] does not exist, waits for it;
    /// returns when it first did.
    fn park(&mut self, off: u64, topic: &str, queue_id: u32, now: u64) -> u64 {
        if let Some(p) = self.parked.get(&off) {
            return p.since;
        }
        let topic = match self.parked_topics.get(topic) {
            Some(t) => t.clone(),
            None => {
                let t: Rc<str> = Rc::from(topic);
                self.parked_topics.insert(t.clone());
                t
            }
        };
        let parked = Parked {
            since: now,
            topic,
            queue_id,
        };
        self.parked.insert(off, parked);
        now
    }

    /// Records that the messages at `moved` were copied to newer entries (their done record
    /// written). Their old entries are skipped when they fall due, and taken out of the
    /// wheel at once when they pass a quarter of it: each move of a message held for days
    /// left one more (retention moves held messages every pass), counted against no cap.
    fn supersede(&mut self, moved: impl IntoIterator<Item = u64>) {
        self.superseded.extend(moved);
        self.changed = true;
        if self.superseded.len() > self.wheel.len() / 4 {
            let superseded = std::mem::take(&mut self.superseded);
            self.wheel.retain(|_, off| !superseded.contains(off));
            for off in superseded {
                self.unpark(off);
            }
        }
    }

    /// Entries in the wheel: those [`pending`](Self::pending) less those in flight, and the
    /// old entries of messages moved forward not taken out yet.
    pub fn wheel_len(&self) -> usize {
        self.wheel.len()
    }

    /// Takes `off` out of the parked (delivered, moved, or no longer held).
    fn unpark(&mut self, off: u64) {
        if let Some(p) = self.parked.remove(&off) {
            // This one and the set's: the last message parked for the topic.
            if Rc::strong_count(&p.topic) == 2 {
                self.parked_topics.remove(&p.topic);
            }
        }
    }

    /// Takes out of `due` (in flight) the parked messages whose target queue still does not
    /// exist (`exists` says) and that may wait longer (parked less than `park_max_ms` ago):
    /// each goes back to the wheel for `PARK_MS`, its record not read again. Returns how
    /// many.
    fn repark(
        &mut self,
        due: &mut Vec<(u64, u64)>,
        now: u64,
        park_max_ms: u64,
        exists: impl Fn(&str, u32) -> bool,
    ) -> usize {
        if self.parked.is_empty() {
            return 0;
        }
        let before = due.len();
        due.retain(|&(_, off)| {
            let Some(p) = self.parked.get(&off) else {
                return true;
            };
            if now.saturating_sub(p.since) >= park_max_ms || exists(&p.topic, p.queue_id) {
                return true;
            }
            self.in_flight.remove(&off);
            self.wheel.insert(now + PARK_MS, off);
            false
        });
        before - due.len()
    }

    /// Messages delivered to their queues since start.
    pub fn delivered_total(&self) -> u64 {
        self.delivered_total
    }

    /// Messages that could not be delivered since start (moved to the undeliverable
    /// topic, or unreadable).
    pub fn undeliverable_total(&self) -> u64 {
        self.undeliverable_total
    }

    /// Messages held: waiting in the wheel or being delivered.
    pub fn pending(&self) -> usize {
        self.wheel.len() + self.in_flight.len() - self.superseded.len()
    }

    /// Every held message: (due, schedule offset).
    fn entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.wheel
            .iter()
            .map(|(due, off)| (due, *off))
            .filter(|(_, off)| !self.superseded.contains(off))
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
                crate::warn!(
                    "ringmq: {}: {e}; rebuilding the schedule from the log",
                    store.dir().display()
                );
                None
            }
        };
        let (min, end) = store
            .queue_range(SCHEDULE_TOPIC, 0)
            .map_err(|e| e.to_string())?;
        let (done_min, done_end) = store
            .queue_range(SCHEDULE_DONE_TOPIC, 0)
            .map_err(|e| e.to_string())?;
        let mut pending: HashMap<u64, u64> = HashMap::new();
        // A snapshot ahead of the log (the log lost a tail it had not made durable: a power
        // loss) still holds below the log's new ends: an entry left it only once its copy
        // was durable (and with it every record before the copy, its schedule record among
        // them), so the entries it kept below `end` are still pending and those it left
        // are delivered, whatever done records the tail took. Its entries at or past `end`
        // name records lost (the offsets are used again from now on): dropped below.
        let mut ahead = false;
        let snapshot = snapshot.map(|mut s| {
            if s.schedule_end > end || s.done_end > done_end {
                ahead = true;
                crate::warn!(
                    "ringmq: {}: the schedule snapshot is ahead of the log (it lost its tail): its entries past the log's end are dropped (their delayed sends were lost with it)",
                    store.dir().display()
                );
                s.schedule_end = s.schedule_end.min(end);
                s.done_end = s.done_end.min(done_end);
            }
            s
        });
        let (from, done_from) = match &snapshot {
            Some(s) => {
                for &(due, off) in &s.entries {
                    if (min..end).contains(&off) {
                        // Two entries of one offset: one left by a send a full disk cut; the
                        // later is the message stored there now.
                        let at = pending.entry(off).or_insert(due);
                        *at = (*at).max(due);
                    }
                }
                (s.schedule_end, s.done_end)
            }
            None => (min, done_min),
        };
        // The done records first: those of entries past the snapshot are marked in a bitmap
        // (a bit per entry: a full scan of a long-lived log meets many delivered entries,
        // which would otherwise all be held before their done records took them out), the
        // others taken out of the snapshot's.
        let scan_from = from.max(min);
        let mut delivered = vec![0u64; (end.saturating_sub(scan_from)).div_ceil(64) as usize];
        let mut done = 0u64;
        for off in done_from.max(done_min)..done_end {
            // A done record that cannot be read means its messages are delivered again: a
            // duplicate, not a reason to refuse to start.
            let buf = match store.read_at(SCHEDULE_DONE_TOPIC, 0, off).await {
                Ok(buf) => buf,
                Err(e) => {
                    crate::warn!(
                        "ringmq: {}: schedule done record {off} cannot be read ({e}); its messages are delivered again",
                        store.dir().display()
                    );
                    continue;
                }
            };
            let Ok(view) = RecordView::parse(&buf) else {
                continue;
            };
            for chunk in view.body().chunks_exact(8) {
                let mut b = [0u8; 8];
                b.copy_from_slice(chunk);
                let named = u64::from_le_bytes(b);
                // The snapshot's own (it may hold entries at or past its end: in the wheel
                // from their append, before their records were written)...
                if pending.remove(&named).is_some() {
                    done += 1;
                }
                // ...and those of the scan.
                if (scan_from..end).contains(&named) {
                    let bit = named - scan_from;
                    delivered[(bit / 64) as usize] |= 1 << (bit % 64);
                }
            }
        }
        let mut next = scan_from;
        // Slots of the schedule's index found empty: sends a full disk cut (refused), or
        // entries damaged on disk, whose messages would wait unseen; said, not passed.
        let mut holes = 0u64;
        while next < end {
            let entries = store
                .queue_entries(SCHEDULE_TOPIC, 0, next, RECOVERY_SCAN_STEP)
                .map_err(|e| e.to_string())?;
            let span = end.min(next.saturating_add(RECOVERY_SCAN_STEP as u64)) - next;
            holes += span - entries.len() as u64;
            for (off, e) in entries {
                let bit = off.saturating_sub(scan_from);
                let word = delivered.get((bit / 64) as usize).copied().unwrap_or(0);
                if word & (1 << (bit % 64)) == 0 {
                    pending.insert(off, e.tag_hash);
                } else {
                    done += 1;
                }
            }
            next = next.saturating_add(RECOVERY_SCAN_STEP as u64);
        }
        if holes > 0 {
            crate::warn!(
                "ringmq: {}: {holes} empty slot(s) in the schedule's index past its snapshot: delayed sends a full disk cut (refused), or index entries damaged on disk; if the disk was not full, stop the broker and put a file named `reindex` in the shard's directory to index the log again",
                store.dir().display()
            );
        }
        // In due order (then offset order): late items go to the wheel's ready list, whose
        // inserts are cheap in order.
        let mut pending: Vec<(u64, u64)> = pending.into_iter().map(|(o, d)| (d, o)).collect();
        pending.sort_unstable();
        let mut schedule = Schedule::new(now_ms());
        schedule.epoch = store.log().epoch();
        for (due, off) in pending {
            schedule.wheel.insert(due, off);
        }
        // The first snapshot of this run is written soon, whatever happens next.
        schedule.changed = true;
        if ahead {
            // The snapshot on disk names offsets the log lost, which this run's sends take
            // again: a crash before this run's first snapshot would read it again, skip the
            // entries scheduled at those offsets (delayed sends acknowledged, never
            // delivered) and its done records. Replaced before the shard serves.
            let now = Snapshot {
                schedule_end: end,
                done_end,
                entries: schedule.entries().collect(),
            };
            let dir = store.dir().to_owned();
            crate::io::blocking(move || write_snapshot(&dir, &encode_snapshot(&now)))
                .await
                .map_err(|e| {
                    format!(
                        "{}: the schedule snapshot is ahead of the log, and writing the recovered one over it failed: {e}; the start is refused (a crash later would read the old one again)",
                        store.dir().display()
                    )
                })?;
            schedule.changed = false;
        }
        if from > min || done_from > done_min || done > 0 || !schedule.wheel.is_empty() {
            crate::say!(
                "ringmq: {}: schedule recovered in {} ms: {} messages waiting ({} entries and {} done records read past the snapshot)",
                store.dir().display(),
                started.elapsed().as_millis(),
                schedule.wheel.len(),
                end.saturating_sub(from.max(min)),
                done_end.saturating_sub(done_from.max(done_min)),
            );
        }
        // Done records a recovery reads: from the snapshot just written, if one was.
        let done_read_from = if ahead {
            done_end
        } else {
            done_from.max(done_min)
        };
        let floor = match retention_floor(store, &schedule, done_read_from) {
            Ok((floor, writing)) => {
                schedule.floor_held = writing;
                floor
            }
            Err(e) => {
                crate::warn!(
                    "ringmq: {}: the schedule holds the whole log from retention until a lookup works: {e}",
                    store.dir().display()
                );
                schedule.floor_held = true;
                0
            }
        };
        store.set_retention_floor(Holder::Schedule, floor);
        Ok(schedule)
    }
}

/// The oldest log offset the schedule still needs: its oldest held message the index holds,
/// or the first done record a recovery would read. Fails when either cannot be looked up: a
/// lookup that failed is no absence, and the caller holds everything (0) rather than pass
/// what it could not see. A held message the index lacks (below the queue's start, or past
/// its end: its send cut from the log by a full disk) is passed over for the next one, as
/// the transactions' floor does, rather than taken to mean that nothing is held. One
/// appended but not yet written (past the index's readable end, below the queue's next
/// offset) holds the floor at the log's readable end, where its record goes, and asks to
/// be looked at again (the `bool`): passed over, it left the floor above it, and a quiet
/// schedule did not set the floor again before retention took its segment.
fn retention_floor(
    store: &MessageStore,
    schedule: &Schedule,
    done_from: u64,
) -> Result<(u64, bool), crate::store::StoreError> {
    let (oldest, newest) = schedule
        .entries()
        .map(|(_, off)| off)
        .fold(None, |range: Option<(u64, u64)>, off| {
            Some(range.map_or((off, off), |(lo, hi)| (lo.min(off), hi.max(off))))
        })
        .unzip();
    // (An empty schedule looks nothing up: its floor is the done records' alone.)
    let writing = match newest {
        Some(newest) => {
            let readable = store.queue_range(SCHEDULE_TOPIC, 0)?.1;
            newest >= readable && {
                let next = store.queue_next_offset(SCHEDULE_TOPIC, 0)?.unwrap_or(0);
                (schedule.entries()).any(|(_, off)| off >= readable && off < next)
            }
        }
        None => false,
    };
    let held = match oldest {
        None => None,
        Some(oldest) => match store.queue_entry(SCHEDULE_TOPIC, 0, oldest)? {
            Some(entry) => Some(entry),
            // The next ones up, in order (the rare case: one pass, then a heap).
            None => {
                let mut rest: std::collections::BinaryHeap<std::cmp::Reverse<u64>> = (schedule
                    .entries())
                .filter(|&(_, off)| off > oldest)
                .map(|(_, off)| std::cmp::Reverse(off))
                .collect();
                let mut found = None;
                while let Some(std::cmp::Reverse(off)) = rest.pop() {
                    found = store.queue_entry(SCHEDULE_TOPIC, 0, off)?;
                    if found.is_some() {
                        break;
                    }
                }
                found
            }
        },
    };
    let done = store.queue_entry(SCHEDULE_DONE_TOPIC, 0, done_from)?;
    let floor = (held.into_iter().chain(done))
        .map(|e| e.physical_offset)
        .chain(writing.then(|| store.log().readable_end()))
        .min()
        .unwrap_or(u64::MAX);
    Ok((floor, writing))
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
    crate::io::replace_file(&dir.join(SNAPSHOT_FILE), bytes)
}

/// A message that is neither a transaction's half nor delayed: [`ShardCtx::put_draft`]
/// appends it to its queue as it is.
pub(super) fn goes_straight(props: &Properties<'_>) -> bool {
    !super::transaction::is_half(props) && !asks_for_delay(props)
}

impl ShardCtx {
    /// Stores a message, holding it in the schedule when it asks for a delay still to come
    /// (a time already past is stored at once, without its delay properties). Runs now, in
    /// arrival order. A scheduled message's result carries `QUEUE_OFFSET_SCHEDULED`.
    /// `send_back`: a consumer's retry copy (`put_owned`), which may use the schedule's
    /// reserve ([`schedule_append`](Self::schedule_append)); a producer's send does not.
    pub(super) fn put_draft(
        &self,
        draft: &RecordDraft<'_>,
        send_back: bool,
    ) -> Result<PutResult, ErrorBody> {
        let props = Properties::new(draft.properties);
        // `goes_straight`, with each property looked up once.
        if super::transaction::is_half(&props) {
            return self.half_append(draft);
        }
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
            Some(at) if at > now => self.schedule_append(draft, at as u64, send_back),
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

    fn schedule_append(
        &self,
        draft: &RecordDraft<'_>,
        due: u64,
        send_back: bool,
    ) -> Result<PutResult, ErrorBody> {
        // Retry copies (sent back by consumers) may go a quarter past the limit: a producer
        // filling the schedule with far-future sends stopped every group's retries on the
        // shard (their messages never reached the dead-letter topic; each was consumed
        // again in place, holding its queue's commit point). Not a producer's delayed send
        // to a retry topic's name: it would take the reserve.
        let max = self.cfg.schedule_pending_max;
        let (max, whose) = if send_back && draft.topic.starts_with(RETRY_TOPIC_PREFIX) {
            (
                max.saturating_add(max / 4),
                "retry copies (a quarter past the limit)",
            )
        } else {
            (max, "delayed messages")
        };
        let pending = self.schedule.borrow().pending();
        if pending >= max {
            return Err(err(
                ErrorCode::ScheduleFull,
                format!(
                    "shard {} holds {pending} delayed messages, the most it takes for {whose} (--schedule-pending-max {}); try again later",
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
        // Kept from retention from now on (the snapshot's floor comes later).
        (self.store).lower_retention_floor(Holder::Schedule, put.physical_offset);
        self.schedule_appended(&put);
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

    /// Every append to the schedule's queue: entries a cut of the log left go first
    /// ([`Schedule::appended`]).
    fn schedule_appended(&self, put: &PutResult) {
        let dropped = (self.schedule.borrow_mut()).appended(put.written().epoch, put.queue_offset);
        if dropped > 0 {
            crate::warn!(
                "ringmq: shard {}: {dropped} schedule entries from offset {} on named delayed sends a full disk cut from the log (they were refused): dropped",
                self.id,
                put.queue_offset
            );
        }
    }

    /// Sets the retention floor to what the schedule still needs (records from the done
    /// queue's `done_end` on); everything (0) while a lookup fails, said once a minute.
    fn set_schedule_floor(&self, done_end: u64) {
        let floor = retention_floor(&self.store, &self.schedule.borrow(), done_end);
        let (floor, held) = match floor {
            Ok(floor) => floor,
            Err(e) => {
                self.log_rarely(format_args!(
                    "the schedule holds the whole log from retention until a lookup works: {e}"
                ));
                (0, true)
            }
        };
        self.schedule.borrow_mut().floor_held = held;
        self.store.set_retention_floor(Holder::Schedule, floor);
    }

    /// Writes a snapshot of the schedule if it changed, and moves the retention floor up
    /// to what the schedule still needs.
    pub async fn snapshot_schedule(&self) {
        // One at a time (the delivery task and the stop may both ask).
        let _one = self.snapshotting.lock().await;
        let snapshot = {
            let mut s = self.schedule.borrow_mut();
            if !s.changed {
                if s.floor_held {
                    drop(s);
                    if let Ok((_, done_end)) = self.store.queue_range(SCHEDULE_DONE_TOPIC, 0) {
                        self.set_schedule_floor(done_end);
                    }
                }
                return;
            }
            let ends = self
                .store
                .queue_range(SCHEDULE_TOPIC, 0)
                .and_then(|(_, schedule_end)| {
                    Ok((
                        schedule_end,
                        self.store.queue_range(SCHEDULE_DONE_TOPIC, 0)?.1,
                    ))
                });
            let (schedule_end, done_end) = match ends {
                Ok(ends) => ends,
                Err(e) => {
                    // Tried again at the next snapshot; the last one on disk stays right.
                    crate::warn!("ringmq: shard {}: schedule snapshot: {e}", self.id);
                    return;
                }
            };
            s.changed = false;
            Snapshot {
                schedule_end,
                done_end,
                entries: s.entries().collect(),
            }
        };
        let done_end = snapshot.done_end;
        let dir = self.store.dir().to_owned();
        // Encoding (a CRC over up to 32 MB) and writing run off the shard's thread.
        let written =
            crate::io::blocking(move || write_snapshot(&dir, &encode_snapshot(&snapshot))).await;
        match written {
            Ok(()) => self.set_schedule_floor(done_end),
            Err(e) => {
                self.schedule.borrow_mut().changed = true;
                crate::warn!(
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
        // Not a walk of every entry (millions, on the shard's thread): the wheel's summary
        // (a message moved forward has its copy, due at the same time, so the earliest is
        // theirs) and the few in flight.
        let (mut next, mut overdue) = s.wheel.due_summary(now, |off| s.superseded.contains(off));
        for &due in s.in_flight.values() {
            next = Some(next.map_or(due, |n| n.min(due)));
            overdue += usize::from(due <= now);
        }
        let overdue = overdue as u64;
        ShardScheduleInfo {
            shard: self.id,
            pending: s.pending() as u64,
            in_flight: s.in_flight.len() as u64,
            next_due_ms: next.map_or(-1, |n| n as i64),
            overdue,
            delivered_total: s.delivered_total,
            parked: s.parked.len() as u64,
            undeliverable_total: s.undeliverable_total,
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

#[cfg(test)]
mod tests;
