//! The message store of one shard: its commit log, the consume queues of its queues, the
//! key index, the checkpoint and crash recovery. It assigns queue offsets, so it is the
//! layer that knows topics and queues; it knows nothing of sockets, groups or consumers.
//!
//! On disk, under the store's directory:
//! ```text
//! commitlog/<20-digit base>      segments of the commit log
//! consumequeue/<topic>/<queue>/  consume queue files
//! index/                         key index files
//! checkpoint                     log offset below which every index entry is on disk
//! abort                          present while the store is open: its presence at start
//!                                means the last shutdown was not clean
//! ```

mod checkpoint;
mod read;
mod space;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crate::index::{
    tag_hash, ConsumeQueue, ConsumeQueueConfig, CqEntry, DirtyFile, IndexError, KeyIndex,
    KeyIndexConfig, TAG_HASH_NONE,
};
use crate::io::ReadBuf;
use crate::log::{CommitLog, LogConfig, LogError, RecoveryReport};
use crate::protocol::record::{prop, RecordDraft, RecordView, HEADER_BYTES};

pub use checkpoint::Checkpoint;

/// Options of a store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub log: LogConfig,
    pub consume_queue: ConsumeQueueConfig,
    pub key_index: KeyIndexConfig,
    /// How often indexes are flushed and the checkpoint advanced.
    pub checkpoint_interval_ms: u64,
    /// How often retention runs.
    pub retention_check_interval_ms: u64,
    /// A consume-queue file unused this long (at least; at most twice as long) is unmapped
    /// until the next use.
    pub index_idle_close_ms: u64,
    /// Sends are refused with `DiskFull` while the data directory's filesystem has less
    /// free space than this (checked every second), so indexes and checkpoints always find
    /// room.
    pub disk_free_min_bytes: u64,
}

/// Default of [`StoreConfig::disk_free_min_bytes`]: 256 MiB.
pub const DISK_FREE_MIN_BYTES_DEFAULT: u64 = 256 << 20;

/// Default of [`StoreConfig::index_idle_close_ms`].
pub const INDEX_IDLE_CLOSE_MS_DEFAULT: u64 = 30_000;

/// How often the free space of the data directory is looked at.
const DISK_CHECK_INTERVAL: Duration = Duration::from_secs(1);

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            log: LogConfig::default(),
            consume_queue: ConsumeQueueConfig::default(),
            key_index: KeyIndexConfig::default(),
            checkpoint_interval_ms: 5_000,
            retention_check_interval_ms: 60_000,
            index_idle_close_ms: INDEX_IDLE_CLOSE_MS_DEFAULT,
            disk_free_min_bytes: DISK_FREE_MIN_BYTES_DEFAULT,
        }
    }
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("invalid topic name {}: use 1 to 127 characters of A-Z a-z 0-9 _ - % | .", crate::protocol::names::shown(.0))]
    InvalidTopic(String),
    #[error("queue offset {offset} of {topic}:{queue_id} is below the queue's first offset {min}")]
    OffsetTooSmall {
        topic: String,
        queue_id: u32,
        offset: u64,
        min: u64,
    },
    #[error("queue offset {offset} of {topic}:{queue_id} is beyond the queue's end {max}")]
    OffsetTooBig {
        topic: String,
        queue_id: u32,
        offset: u64,
        max: u64,
    },
    #[error("store I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("recovery failed: {0}")]
    Recovery(String),
}

/// Where a stored message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutResult {
    pub queue_offset: u64,
    pub physical_offset: u64,
    pub size: u32,
    pub store_timestamp_ms: i64,
    /// The log's cut count at the append (see [`Written`]).
    pub epoch: u64,
}

impl PutResult {
    pub fn end(&self) -> u64 {
        self.physical_offset + self.size as u64
    }

    /// What to wait for to know the record is stored.
    pub fn written(&self) -> Written {
        Written {
            end: self.end(),
            epoch: self.epoch,
        }
    }
}

/// The end of appended records and the log's cut count when they were appended: a wait
/// for them fails with `DiskFull` if a full disk made the log drop them meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Written {
    pub end: u64,
    pub epoch: u64,
}

impl Written {
    /// Covers both (appends of one tick share the epoch; the later epoch is the stricter).
    pub fn max(self, other: Written) -> Written {
        Written {
            end: self.end.max(other.end),
            epoch: self.epoch.min(other.epoch),
        }
    }
}

/// What recovery did.
#[derive(Debug, Clone, Default)]
pub struct StoreRecovery {
    pub log: RecoveryReport,
    pub clean_shutdown: bool,
    pub checkpoint_offset: u64,
    pub records_dispatched: u64,
    pub queues: usize,
}

impl StoreRecovery {
    /// One line for the log: how the store was left, what recovery read, rebuilt and cut,
    /// and how long it took.
    pub fn summary(&self, took: Duration) -> String {
        let mut line = format!(
            "store opened in {} ms after a {} stop: {} records verified ({} bytes), {} re-indexed from log offset {}",
            took.as_millis(),
            if self.clean_shutdown { "clean" } else { "crash or unclean" },
            self.log.records_verified,
            self.log.bytes_verified,
            self.records_dispatched,
            self.checkpoint_offset,
        );
        if let Some(at) = self.log.cut_at {
            line.push_str(&format!(
                "; the log was cut at offset {at} ({}): {} bytes moved to {}",
                self.log.cut_reason.as_deref().unwrap_or("torn tail"),
                self.log.truncated_bytes,
                self.log
                    .quarantined
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        line
    }
}

/// The records a queue read will take (see [`MessageStore::plan_queue_read`]).
pub struct QueuePlan {
    topic: String,
    queue_id: u32,
    picked: Vec<(u64, CqEntry)>,
    bytes: usize,
    /// The queue offset to read next.
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
}

impl QueuePlan {
    pub fn len(&self) -> usize {
        self.picked.len()
    }
    pub fn is_empty(&self) -> bool {
        self.picked.is_empty()
    }
    /// Bytes of the records it takes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Records read for one pull: a few large reads, and the byte ranges of the records in them.
pub struct QueueRead {
    bufs: Vec<ReadBuf>,
    /// (buffer index, start, length) of each record, in queue order.
    slices: Vec<(u32, u32, u32)>,
    /// Queue offset of each record.
    offsets: Vec<u64>,
    /// The queue offset to read next.
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
}

impl QueueRead {
    pub fn len(&self) -> usize {
        self.slices.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slices.is_empty()
    }
    pub fn bytes_len(&self) -> usize {
        self.slices.iter().map(|s| s.2 as usize).sum()
    }
    /// The stored bytes of each record, exactly as in the log.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.slices
            .iter()
            .map(|&(b, s, l)| &self.bufs[b as usize][s as usize..(s + l) as usize])
    }
    pub fn queue_offsets(&self) -> &[u64] {
        &self.offsets
    }
    /// Bytes of the records that share the buffers of the log's cache of its newest writes
    /// (read without a copy).
    pub fn shared_bytes(&self) -> usize {
        self.slices
            .iter()
            .filter(|s| matches!(self.bufs[s.0 as usize], ReadBuf::Shared { .. }))
            .map(|s| s.2 as usize)
            .sum()
    }
    /// Bytes of the cache buffers this read shares beyond its records' own bytes (each
    /// buffer counted once): what an answer carrying it holds in memory past its size.
    pub fn pinned_beyond(&self) -> usize {
        let mut last: Option<&crate::io::Written> = None;
        let mut held = 0;
        for b in &self.bufs {
            if let ReadBuf::Shared { bytes, .. } = b {
                // A read's records are in log order: buffers repeat only next to each other.
                if !last.is_some_and(|l| l.same(bytes)) {
                    held += bytes.capacity();
                    last = Some(bytes);
                }
            }
        }
        held.saturating_sub(self.shared_bytes())
    }
    /// Copies the records out of the cache buffers they share, so the read no longer holds
    /// those buffers.
    pub fn unshare(&mut self) {
        if self.shared_bytes() == 0 {
            return;
        }
        let mut out = Vec::with_capacity(self.bytes_len());
        let mut slices = Vec::with_capacity(self.slices.len());
        for r in self.records() {
            slices.push((0u32, out.len() as u32, r.len() as u32));
            out.extend_from_slice(r);
        }
        self.bufs = vec![ReadBuf::Plain(out)];
        self.slices = slices;
    }
    /// Keeps only the records `keep` says yes to (a filter evaluated over the bytes in
    /// place), in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        let kept: Vec<bool> = self.records().map(&mut keep).collect();
        let mut i = 0;
        self.slices.retain(|_| {
            i += 1;
            kept[i - 1]
        });
        let mut i = 0;
        self.offsets.retain(|_| {
            i += 1;
            kept[i - 1]
        });
    }
    /// The records' bytes in order as runs: records that follow each other in one read
    /// buffer come as one run (what a vectored write sends, from where the store read it).
    pub fn runs(&self) -> Runs<'_> {
        Runs { read: self, at: 0 }
    }
}

/// The runs of [`QueueRead::runs`].
pub struct Runs<'a> {
    read: &'a QueueRead,
    at: usize,
}

impl<'a> Iterator for Runs<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let slices = &self.read.slices;
        let &(buf, start, len) = slices.get(self.at)?;
        let mut end = start + len;
        self.at += 1;
        while let Some(&(b, s, l)) = slices.get(self.at) {
            if b != buf || s != end {
                break;
            }
            end += l;
            self.at += 1;
        }
        Some(&self.read.bufs[buf as usize][start as usize..end as usize])
    }
}

struct QueueState {
    cq: ConsumeQueue,
}

struct Inner {
    dir: PathBuf,
    cfg: StoreConfig,
    log: CommitLog,
    queues: RefCell<HashMap<(String, u32), QueueState>>,
    keys: RefCell<KeyIndex>,
    stopped: std::cell::Cell<bool>,
    /// Retention never deletes the segment holding this log offset or later ones.
    retention_floor: std::cell::Cell<u64>,
    /// The log minimum the indexes were last trimmed to.
    trimmed_to: std::cell::Cell<u64>,
    /// The log's cut count the indexes agree with.
    seen_epoch: std::cell::Cell<u64>,
    /// Why sends are refused: free space below the floor.
    space_low: RefCell<Option<String>>,
    /// Free bytes of the data directory's filesystem, as last looked at.
    disk_free: std::cell::Cell<u64>,
}

/// The store of one shard. Cheap to clone; not `Send`.
#[derive(Clone)]
pub struct MessageStore {
    inner: Rc<Inner>,
}

/// Topic names become directory names: keep them to a safe alphabet
/// (`protocol::names::check_topic_name`).
pub fn validate_topic(topic: &str) -> Result<(), StoreError> {
    crate::protocol::names::check_topic_name(topic)
        .map_err(|_| StoreError::InvalidTopic(topic.to_owned()))
}

/// The broker's schedule of delayed messages: one queue per store, whose consume-queue
/// entries carry the due time (ms since the epoch) where other queues carry a tag hash.
pub const SCHEDULE_TOPIC: &str = "%SYS_SCHEDULE%";
/// Records that say which schedule entries were delivered (body: their queue offsets).
pub const SCHEDULE_DONE_TOPIC: &str = "%SYS_SCHEDULE_DONE%";

/// What a consume-queue entry carries besides the record's place: the tag hash, or, for the
/// schedule, the due time.
fn cq_tag_slot(topic: &str, props: crate::protocol::record::Properties<'_>) -> u64 {
    if topic == SCHEDULE_TOPIC {
        return props
            .get(prop::TIMER_OUT_MS)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
    }
    props.get(prop::TAGS).map(tag_hash).unwrap_or(TAG_HASH_NONE)
}

/// Prefix of a deleted topic's consume-queue directory while it is removed.
const DELETED_PREFIX: &str = "deleted~";

fn index_key(topic: &str, key: &str) -> String {
    format!("{topic}#{key}")
}

fn io_err(op: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(std::io::Error::new(
        e.kind(),
        format!("{op} {}: {e}", path.display()),
    ))
}

impl MessageStore {
    /// Opens the store in `dir`, recovering from the last checkpoint.
    pub async fn open(
        dir: &Path,
        cfg: StoreConfig,
    ) -> Result<(MessageStore, StoreRecovery), StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| io_err("create", dir, e))?;
        let abort_path = dir.join("abort");
        let clean_shutdown = !abort_path.exists();
        let checkpoint = Checkpoint::read(dir)?;
        let checkpoint_offset = checkpoint.log_offset;
        // The checkpoint records the log's durable end when it was written: a bad record
        // before it is rot, one after it is what a crash leaves in writes in flight.
        let mut cfg = cfg;
        cfg.log.known_durable = checkpoint_offset;
        // Consume queues and key index as they were flushed.
        let mut queues = open_queues(&dir.join("consumequeue"), &cfg.consume_queue)?;
        let mut keys = KeyIndex::open(&dir.join("index"), cfg.key_index)?;
        let keys_last = keys.last_physical_offset();
        let mut dispatched = 0u64;
        let mut failure: Option<StoreError> = None;
        let (log, log_report) = {
            let cq_cfg = cfg.consume_queue;
            let cq_root = dir.join("consumequeue");
            let dispatch = |view: RecordView<'_>| {
                if failure.is_some() {
                    return;
                }
                dispatched += 1;
                if let Err(e) =
                    dispatch_record(&mut queues, &mut keys, keys_last, &cq_root, &cq_cfg, view)
                {
                    failure = Some(e);
                }
            };
            CommitLog::open(
                &dir.join("commitlog"),
                cfg.log.clone(),
                checkpoint_offset,
                dispatch,
            )
            .await?
        };
        if let Some(e) = failure {
            return Err(e);
        }
        // Drop index entries past the recovered end of the log, and below its start.
        let end = log.write_offset();
        for q in queues.values_mut() {
            q.cq.truncate_after_log_end(end)?;
            q.cq.delete_before_physical(log.min_offset())?;
        }
        let trimmed_to = log.min_offset();
        std::fs::write(&abort_path, b"ringmq store open\n")
            .map_err(|e| io_err("create", &abort_path, e))?;
        let report = StoreRecovery {
            log: log_report,
            clean_shutdown,
            checkpoint_offset,
            records_dispatched: dispatched,
            queues: queues.len(),
        };
        let store = MessageStore {
            inner: Rc::new(Inner {
                dir: dir.to_owned(),
                cfg,
                log,
                queues: RefCell::new(queues),
                keys: RefCell::new(keys),
                stopped: std::cell::Cell::new(false),
                retention_floor: std::cell::Cell::new(u64::MAX),
                trimmed_to: std::cell::Cell::new(trimmed_to),
                seen_epoch: std::cell::Cell::new(0),
                space_low: RefCell::new(None),
                disk_free: std::cell::Cell::new(0),
            }),
        };
        store.spawn_housekeeping();
        Ok((store, report))
    }

    pub fn log(&self) -> &CommitLog {
        &self.inner.log
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Assigns the next queue offset, appends the record and indexes it. The record becomes
    /// readable once the log's write completes: await [`acked`](Self::acked).
    pub fn append(&self, draft: &RecordDraft<'_>) -> Result<PutResult, StoreError> {
        let mut put = None;
        self.append_each(std::slice::from_ref(draft), |p| put = Some(p))?;
        put.ok_or_else(|| StoreError::Recovery("an append stored nothing".into()))
    }

    /// Appends `drafts` in order, as [`append`](Self::append) does each, pushing where each
    /// went onto `puts`. A run of drafts of one queue (a batch) shares one look-up of the
    /// queue and one store timestamp. Stops at the first error: the drafts before it are
    /// stored (and in `puts`), the rest are not.
    pub fn append_batch(
        &self,
        drafts: &[RecordDraft<'_>],
        puts: &mut Vec<PutResult>,
    ) -> Result<(), StoreError> {
        puts.reserve(drafts.len());
        self.append_each(drafts, |p| puts.push(p))
    }

    fn append_each(
        &self,
        drafts: &[RecordDraft<'_>],
        mut each: impl FnMut(PutResult),
    ) -> Result<(), StoreError> {
        let Some(first) = drafts.first() else {
            return Ok(());
        };
        if let Some(reason) = &*self.inner.space_low.borrow() {
            return Err(LogError::DiskFull {
                reason: reason.clone(),
            }
            .into());
        }
        if self.inner.log.epoch() != self.inner.seen_epoch.get() {
            self.forget_cut()?;
        }
        let store_timestamp_ms = crate::log::now_ms();
        let mut queues = self.inner.queues.borrow_mut();
        let mut keys = self.inner.keys.borrow_mut();
        let mut key = (String::new(), first.queue_id);
        let mut q: Option<&mut QueueState> = None;
        for draft in drafts {
            if q.is_none() || key.0 != draft.topic || key.1 != draft.queue_id {
                validate_topic(draft.topic)?;
                key = (draft.topic.to_owned(), draft.queue_id);
                q = None;
                if !queues.contains_key(&key) {
                    let qdir = queue_dir(
                        &self.inner.dir.join("consumequeue"),
                        draft.topic,
                        draft.queue_id,
                    );
                    let cq = ConsumeQueue::open(&qdir, self.inner.cfg.consume_queue)?;
                    queues.insert(key.clone(), QueueState { cq });
                }
            }
            let props = crate::protocol::record::Properties::new(draft.properties);
            keys.reserve(key_count(props))?;
            let state = match q.take() {
                Some(state) => state,
                None => queues
                    .get_mut(&key)
                    .ok_or_else(|| StoreError::Recovery("queue vanished".into()))?,
            };
            let queue_offset = state.cq.max_offset();
            // Index space first: a full disk fails before the record is in the log.
            state.cq.reserve_next()?;
            let appended = self
                .inner
                .log
                .append_at(draft, queue_offset, store_timestamp_ms)?;
            let entry = CqEntry {
                physical_offset: appended.physical_offset,
                size: appended.size,
                tag_hash: cq_tag_slot(draft.topic, props),
            };
            state.cq.put(queue_offset, entry)?;
            index_keys(
                &mut keys,
                draft.topic,
                props,
                appended.physical_offset,
                appended.store_timestamp_ms,
            )?;
            each(PutResult {
                queue_offset,
                physical_offset: appended.physical_offset,
                size: appended.size,
                store_timestamp_ms: appended.store_timestamp_ms,
                epoch: appended.epoch,
            });
            q = Some(state);
        }
        Ok(())
    }

    /// The log was cut (a write found the disk full): index entries of the dropped records
    /// go before anything else is appended.
    fn forget_cut(&self) -> Result<(), StoreError> {
        let epoch = self.inner.log.epoch();
        if let Some(at) = self.inner.log.last_cut() {
            for q in self.inner.queues.borrow_mut().values_mut() {
                q.cq.truncate_after_log_end(at)?;
            }
            self.inner.keys.borrow_mut().forget_from_physical(at);
        }
        self.inner.seen_epoch.set(epoch);
        Ok(())
    }

    /// Waits until the records are acknowledged under the flush mode.
    pub async fn acked(&self, w: Written) -> Result<(), StoreError> {
        Ok(self.inner.log.wait_acked_since(w.end, w.epoch).await?)
    }

    /// Waits until an fdatasync covers the records.
    pub async fn durable(&self, w: Written) -> Result<(), StoreError> {
        Ok(self.inner.log.wait_durable_since(w.end, w.epoch).await?)
    }

    /// Waits until an fdatasync covers everything below `end`, which is readable already.
    pub async fn durable_readable(&self, end: u64) -> Result<(), StoreError> {
        Ok(self.inner.log.wait_durable(end).await?)
    }

    /// Appends and waits for the acknowledgement.
    pub async fn put(&self, draft: &RecordDraft<'_>) -> Result<PutResult, StoreError> {
        let r = self.append(draft)?;
        self.acked(r.written()).await?;
        Ok(r)
    }

    /// The queues this store has, with (min, max) offsets.
    pub fn queues(&self) -> Result<Vec<(String, u32, u64, u64)>, StoreError> {
        let mut v: Vec<_> = self
            .inner
            .queues
            .borrow()
            .iter()
            .map(|((t, q), s)| Ok((t.clone(), *q, s.cq.min_offset(), self.visible_max(&s.cq)?)))
            .collect::<Result<_, StoreError>>()?;
        v.sort();
        Ok(v)
    }

    /// The readable end of a queue: entries whose record is not written yet are not visible.
    fn visible_max(&self, cq: &ConsumeQueue) -> Result<u64, StoreError> {
        Ok(cq.readable_max(self.inner.log.readable_end())?)
    }

    /// (min, max) queue offsets; max is the offset the next message will get. An unknown
    /// queue is empty: (0, 0). Fails only when an index file cannot be mapped.
    pub fn queue_range(&self, topic: &str, queue_id: u32) -> Result<(u64, u64), StoreError> {
        let queues = self.inner.queues.borrow();
        match queues.get(&(topic.to_owned(), queue_id)) {
            Some(q) => Ok((q.cq.min_offset(), self.visible_max(&q.cq)?)),
            None => Ok((0, 0)),
        }
    }

    fn entry(&self, topic: &str, queue_id: u32, offset: u64) -> Result<CqEntry, StoreError> {
        let (min, max) = self.queue_range(topic, queue_id)?;
        if offset < min {
            return Err(StoreError::OffsetTooSmall {
                topic: topic.into(),
                queue_id,
                offset,
                min,
            });
        }
        if offset >= max {
            return Err(StoreError::OffsetTooBig {
                topic: topic.into(),
                queue_id,
                offset,
                max,
            });
        }
        let queues = self.inner.queues.borrow();
        let found = match queues.get(&(topic.to_owned(), queue_id)) {
            Some(q) => q.cq.get(offset)?,
            None => None,
        };
        found.ok_or(StoreError::OffsetTooBig {
            topic: topic.into(),
            queue_id,
            offset,
            max,
        })
    }

    /// Forgets every queue of a topic: their consume queues are removed (the records stay
    /// in the commit log until retention deletes them). A topic created again starts at
    /// queue offset 0. The directory is renamed aside off the shard's thread (so a topic
    /// created again at once gets a fresh one) and removed in the background.
    pub async fn delete_topic(&self, topic: &str) -> Result<(), StoreError> {
        validate_topic(topic)?;
        self.inner
            .queues
            .borrow_mut()
            .retain(|(t, _), _| t != topic);
        let root = self.inner.dir.join("consumequeue");
        let dir = root.join(topic);
        static DELETED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = DELETED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // '~' is not in the topic alphabet: never mistaken for a topic (start-up removes
        // what a crash left of it).
        let aside = root.join(format!("{DELETED_PREFIX}{}-{n}", crate::log::now_ms()));
        let renamed = {
            let (dir, aside) = (dir.clone(), aside.clone());
            crate::io::blocking(move || std::fs::rename(&dir, &aside)).await
        };
        match renamed {
            Ok(()) => {
                crate::io::spawn(async move {
                    let gone = crate::io::blocking(move || std::fs::remove_dir_all(&aside)).await;
                    if let Err(e) = gone {
                        crate::warn!("ringmq: removing a deleted topic's indexes: {e}");
                    }
                });
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("rename", &dir, e)),
        }
    }

    /// Flushes the indexes and advances the checkpoint to the log's durable end. The index
    /// files written since the last checkpoint are fdatasynced off the shard's thread (an
    /// fdatasync writes back what was written through their mappings).
    pub async fn checkpoint(&self) -> Result<u64, StoreError> {
        let durable = self.inner.log.durable_end();
        // Every index entry of a record below `durable` is in a mapping by now (entries are
        // put when records are appended).
        let queues: Vec<((String, u32), Vec<DirtyFile>)> = self
            .inner
            .queues
            .borrow()
            .iter()
            .map(|(k, q)| (k.clone(), q.cq.dirty_files()))
            .filter(|(_, files)| !files.is_empty())
            .collect();
        let keys = self.inner.keys.borrow().dirty_files();
        let paths: Vec<PathBuf> = queues
            .iter()
            .flat_map(|(_, files)| files.iter().map(|f| f.path.clone()))
            .chain(keys.iter().map(|f| f.path.clone()))
            .collect();
        if !paths.is_empty() {
            crate::io::blocking(move || -> std::io::Result<()> {
                for path in paths {
                    match std::fs::File::open(&path) {
                        Ok(f) => f.sync_data()?,
                        // Deleted meanwhile (retention, a deleted topic): nothing to keep.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })
            .await?;
        }
        {
            let mut all = self.inner.queues.borrow_mut();
            for (key, files) in &queues {
                if let Some(q) = all.get_mut(key) {
                    q.cq.files_synced(files);
                }
            }
        }
        self.inner.keys.borrow_mut().files_synced(&keys);
        let cp = Checkpoint {
            log_offset: durable,
            timestamp_ms: crate::log::now_ms(),
        };
        let dir = self.inner.dir.clone();
        crate::io::blocking(move || cp.write(&dir)).await?;
        Ok(durable)
    }

    /// Keeps every record at or after this log offset from retention (records the broker
    /// still needs, such as scheduled messages not yet delivered); `u64::MAX`: no floor.
    pub fn set_retention_floor(&self, log_offset: u64) {
        self.inner.retention_floor.set(log_offset);
    }

    /// Lowers the retention floor to `log_offset` if it is above it.
    pub fn lower_retention_floor(&self, log_offset: u64) {
        let floor = self.inner.retention_floor.get();
        self.inner.retention_floor.set(floor.min(log_offset));
    }

    /// Runs retention on the log and trims the indexes to match. Work is proportional to
    /// what expired: nothing happens to the indexes when the log kept all its segments, a
    /// queue whose oldest entry is kept is skipped without reading it, and index files are
    /// removed off the shard's thread.
    pub async fn apply_retention(&self, now_ms: i64) -> Result<u64, StoreError> {
        let floor = self.inner.retention_floor.get();
        let min = self.inner.log.apply_retention(now_ms, floor).await;
        if min == self.inner.trimmed_to.get() {
            return Ok(min);
        }
        let mut doomed = Vec::new();
        let mut failed = None;
        for q in self.inner.queues.borrow_mut().values_mut() {
            // A queue that fails is trimmed next time; the files given up so far still go.
            if let Err(e) = q.cq.trim_before_physical(min, &mut doomed) {
                failed.get_or_insert(e);
            }
        }
        let keys = self.inner.keys.borrow_mut().delete_before_physical(min);
        if !doomed.is_empty() {
            crate::io::blocking(move || {
                for path in doomed {
                    if let Err(e) = std::fs::remove_file(&path) {
                        if e.kind() != std::io::ErrorKind::NotFound {
                            crate::warn!(
                                "ringmq: retention could not delete {}: {e}",
                                path.display()
                            );
                        }
                    }
                }
            })
            .await;
        }
        keys?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        self.inner.trimmed_to.set(min);
        Ok(min)
    }

    /// Unmaps the consume-queue files not used since the last call (a walk over the queues
    /// in memory; no file is read). Returns how many were closed.
    pub fn close_idle_index_files(&self) -> usize {
        self.inner
            .queues
            .borrow_mut()
            .values_mut()
            .map(|q| q.cq.close_idle())
            .sum()
    }

    /// Consume-queue files mapped now.
    pub fn mapped_index_files(&self) -> usize {
        self.inner
            .queues
            .borrow()
            .values()
            .map(|q| q.cq.mapped_files())
            .sum()
    }

    /// Clean shutdown: write and sync everything, flush the indexes, write the checkpoint
    /// at the end of the log and remove the abort marker.
    pub async fn close(&self) -> Result<(), StoreError> {
        self.inner.stopped.set(true);
        self.inner.log.close().await?;
        let end = self.checkpoint().await?;
        debug_assert_eq!(end, self.inner.log.write_offset());
        let abort = self.inner.dir.join("abort");
        std::fs::remove_file(&abort).map_err(|e| io_err("remove", &abort, e))?;
        Ok(())
    }

    fn spawn_housekeeping(&self) {
        let ms = |v: u64| Duration::from_millis(v.max(10));
        let cfg = &self.inner.cfg;
        self.spawn_periodic(ms(cfg.checkpoint_interval_ms), false, |store| async move {
            if let Err(e) = store.checkpoint().await {
                crate::warn!("ringmq: checkpoint failed: {e}");
            }
        });
        self.spawn_periodic(DISK_CHECK_INTERVAL, true, |store| async move {
            store.check_disk_space().await;
        });
        self.spawn_periodic(ms(cfg.index_idle_close_ms), false, |store| async move {
            store.close_idle_index_files();
        });
        self.spawn_periodic(
            ms(cfg.retention_check_interval_ms),
            false,
            |store| async move {
                if let Err(e) = store.apply_retention(crate::log::now_ms()).await {
                    crate::warn!("ringmq: retention failed: {e}");
                }
            },
        );
    }

    /// Runs `job` every `every` (first at once when `now`) until the store stops or is
    /// dropped.
    fn spawn_periodic<F, Fut>(&self, every: Duration, now: bool, job: F)
    where
        F: Fn(MessageStore) -> Fut + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let weak = Rc::downgrade(&self.inner);
        crate::io::spawn(async move {
            if !now {
                crate::io::sleep(every).await;
            }
            loop {
                let Some(inner) = weak.upgrade() else { return };
                if inner.stopped.get() {
                    return;
                }
                job(MessageStore { inner }).await;
                crate::io::sleep(every).await;
            }
        });
    }
}

fn store_timestamp_of_header(head: &[u8]) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&head[48..56]);
    i64::from_le_bytes(b)
}

fn queue_dir(root: &Path, topic: &str, queue_id: u32) -> PathBuf {
    root.join(topic).join(queue_id.to_string())
}

fn open_queues(
    root: &Path,
    cfg: &ConsumeQueueConfig,
) -> Result<HashMap<(String, u32), QueueState>, StoreError> {
    let mut out = HashMap::new();
    if !root.exists() {
        return Ok(out);
    }
    for topic in std::fs::read_dir(root).map_err(|e| io_err("read_dir", root, e))? {
        let topic = topic.map_err(|e| io_err("read_dir", root, e))?;
        let Some(name) = topic.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if name.starts_with(DELETED_PREFIX) {
            // A deleted topic's indexes a crash left before they were removed.
            let _ = std::fs::remove_dir_all(topic.path());
            continue;
        }
        if validate_topic(&name).is_err() {
            continue;
        }
        for q in
            std::fs::read_dir(topic.path()).map_err(|e| io_err("read_dir", &topic.path(), e))?
        {
            let q = q.map_err(|e| io_err("read_dir", &topic.path(), e))?;
            let Some(qid) = q.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let cq = ConsumeQueue::open(&q.path(), *cfg)?;
            out.insert((name.clone(), qid), QueueState { cq });
        }
    }
    Ok(out)
}

/// Keys a record adds to the key index.
fn key_count(props: crate::protocol::record::Properties<'_>) -> u32 {
    let keys = props
        .get(prop::KEYS)
        .map_or(0, |k| k.split(' ').filter(|k| !k.is_empty()).count());
    (keys + usize::from(props.get(prop::UNIQ_KEY).is_some())) as u32
}

fn index_keys(
    keys: &mut KeyIndex,
    topic: &str,
    props: crate::protocol::record::Properties<'_>,
    physical_offset: u64,
    store_timestamp_ms: i64,
) -> Result<(), StoreError> {
    if let Some(k) = props.get(prop::KEYS) {
        for key in k.split(' ').filter(|k| !k.is_empty()) {
            keys.put(&index_key(topic, key), physical_offset, store_timestamp_ms)?;
        }
    }
    if let Some(u) = props.get(prop::UNIQ_KEY) {
        keys.put(&index_key(topic, u), physical_offset, store_timestamp_ms)?;
    }
    Ok(())
}

/// Re-indexes one record found by recovery. Consume queue puts are positional (idempotent);
/// key index puts are skipped below what the key index already holds.
fn dispatch_record(
    queues: &mut HashMap<(String, u32), QueueState>,
    keys: &mut KeyIndex,
    keys_last: Option<u64>,
    cq_root: &Path,
    cq_cfg: &ConsumeQueueConfig,
    view: RecordView<'_>,
) -> Result<(), StoreError> {
    let key = (view.topic().to_owned(), view.queue_id());
    if !queues.contains_key(&key) {
        let cq = ConsumeQueue::open(&queue_dir(cq_root, &key.0, key.1), *cq_cfg)?;
        queues.insert(key.clone(), QueueState { cq });
    }
    let q = queues
        .get_mut(&key)
        .ok_or_else(|| StoreError::Recovery("queue vanished".into()))?;
    let entry = CqEntry {
        physical_offset: view.physical_offset(),
        size: view.total_len(),
        tag_hash: cq_tag_slot(view.topic(), view.properties()),
    };
    let qo = view.queue_offset();
    if qo > q.cq.max_offset() && q.cq.max_offset() > q.cq.min_offset() {
        return Err(StoreError::Recovery(format!(
            "record at log offset {} has queue offset {qo} of {}:{}, but the consume queue ends at {}",
            view.physical_offset(),
            key.0,
            key.1,
            q.cq.max_offset()
        )));
    }
    q.cq.put(qo, entry)?;
    if keys_last.is_none_or(|last| view.physical_offset() > last) {
        index_keys(
            keys,
            view.topic(),
            view.properties(),
            view.physical_offset(),
            view.store_timestamp_ms(),
        )?;
    }
    Ok(())
}
