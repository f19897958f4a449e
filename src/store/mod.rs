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
//! runs                           the last 64 starts (runs) and where the log ended at each
//! ```
//!
//! By role: `append` (the write side), `read` (pulls, reads by offset, time and key),
//! `recovery` (opening: re-indexing the log past the checkpoint), `housekeeping`
//! (checkpoints, retention, idle index files, close), `space` (the free-space floor),
//! `checkpoint` and `runs` (their files); here the types, the queue map and the queue ranges.

mod append;
mod checkpoint;
mod housekeeping;
mod read;
mod recovery;
mod runs;
mod space;

use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crate::index::{
    ConsumeQueue, ConsumeQueueConfig, CqEntry, IndexError, KeyIndex, KeyIndexConfig,
};
use crate::log::{CommitLog, LogConfig, LogError};

pub use checkpoint::Checkpoint;
pub use housekeeping::Holder;
pub use read::{is_damage, AloneAfterDamage, QueuePlan, QueueRead, Runs};
pub use recovery::StoreRecovery;

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
    /// This start's incarnation is later than this (besides every earlier start's): the
    /// broker passes the last topic creation stamp it gave (`TopicTable::last_born`), so a
    /// run started after a creation is named by a later incarnation even if the clock
    /// went back.
    pub incarnation_after: u64,
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
            incarnation_after: 0,
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
    /// The queue's index is being opened off the shard's thread (its topic is being created
    /// or grown): nothing was stored; the same append a moment later goes through.
    #[error("queue {topic}:{queue_id} is being opened; try again")]
    QueueOpening { topic: String, queue_id: u32 },
    /// Retention stopped at the checkpoint on disk (a recovery after a crash replays the
    /// log from there): the checkpoint past it that a retention pass wrote first failed.
    #[error(
        "retention held at the last checkpoint (log offset {checkpoint}): a checkpoint past it failed: {reason}"
    )]
    RetentionHeld { checkpoint: u64, reason: String },
    /// An index file failed to sync in an earlier checkpoint: a second sync could succeed
    /// without the lost writes ever reaching the disk, so the checkpoint stays where it was
    /// for the rest of the run (and retention with it); a restart replays the log from it.
    #[error(
        "checkpoint held at log offset {checkpoint} until a restart: an index file failed to sync ({reason}); the restart indexes the records past it again from the log"
    )]
    CheckpointHeld { checkpoint: u64, reason: String },
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

struct QueueState {
    cq: ConsumeQueue,
    /// Recovery only: one past the last entry the replay wrote (the queue is cut there
    /// after the replay).
    replayed_end: Option<u64>,
}

struct Inner {
    dir: PathBuf,
    cfg: StoreConfig,
    log: CommitLog,
    /// This start and the earlier ones, with where the log ended at each.
    runs: runs::Runs,
    queues: RefCell<HashMap<(String, u32), QueueState>>,
    /// Queues [`MessageStore::open_queues`] is opening off the shard's thread: an append to
    /// one fails with [`StoreError::QueueOpening`] meanwhile (two openers would both create
    /// its first file).
    opening: RefCell<HashSet<(String, u32)>>,
    /// An [`MessageStore::open_queues`] ended.
    opened: tokio::sync::Notify,
    /// Queues opened on the shard's thread by an append (none had opened them ahead).
    inline_opens: std::cell::Cell<u64>,
    keys: RefCell<KeyIndex>,
    stopped: std::cell::Cell<bool>,
    /// Retention never deletes the segment holding any of these log offsets (one per
    /// [`Holder`]) or later ones.
    retention_floors: [std::cell::Cell<u64>; Holder::COUNT],
    /// The log offset of the checkpoint on disk: a recovery after a crash replays the log
    /// from there, so retention keeps its segment and every later one.
    checkpointed: std::cell::Cell<u64>,
    /// Held by a checkpoint while it runs: one at a time, so that the checkpoint on disk
    /// and `checkpointed` only move forward, together.
    checkpointing: tokio::sync::Mutex<()>,
    /// Why an index sync of a checkpoint failed, if one did: no later checkpoint is taken
    /// in this run ([`StoreError::CheckpointHeld`]).
    index_sync_failed: RefCell<Option<String>>,
    /// The last retention pass stopped at the checkpoint on disk: the checkpoint it wrote
    /// first failed.
    retention_held: std::cell::Cell<bool>,
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

/// Prefix of a deleted topic's consume-queue directory while it is removed.
const DELETED_PREFIX: &str = "deleted~";

/// The state of queue `queue_id` of `topic`, its consume queue (under the store directory
/// `dir`) opened, or created, on its first use here unless
/// [`open_queues`](MessageStore::open_queues) opened it ahead (`inline_opens` counts the
/// others), and refused while that is opening it (`opening`).
fn queue_state<'q>(
    queues: &'q mut HashMap<(String, u32), QueueState>,
    opening: &HashSet<(String, u32)>,
    inline_opens: &std::cell::Cell<u64>,
    dir: &Path,
    cfg: &StoreConfig,
    topic: &str,
    queue_id: u32,
) -> Result<&'q mut QueueState, StoreError> {
    match queues.entry((topic.to_owned(), queue_id)) {
        Entry::Occupied(e) => Ok(e.into_mut()),
        Entry::Vacant(e) => {
            if opening.contains(e.key()) {
                return Err(StoreError::QueueOpening {
                    topic: topic.to_owned(),
                    queue_id,
                });
            }
            let qdir = queue_dir(&dir.join("consumequeue"), topic, queue_id);
            let cq = ConsumeQueue::open(&qdir, cfg.consume_queue)?;
            inline_opens.set(inline_opens.get() + 1);
            Ok(e.insert(QueueState {
                cq,
                replayed_end: None,
            }))
        }
    }
}

fn io_err(op: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(std::io::Error::new(
        e.kind(),
        format!("{op} {}: {e}", path.display()),
    ))
}

/// Takes queues out of [`Inner::opening`] and wakes those waiting for them, when dropped.
struct OpeningEnds<'a> {
    inner: &'a Inner,
    topic: &'a str,
    queue_ids: &'a [u32],
}

impl Drop for OpeningEnds<'_> {
    fn drop(&mut self) {
        let mut opening = self.inner.opening.borrow_mut();
        for &q in self.queue_ids {
            opening.remove(&(self.topic.to_owned(), q));
        }
        drop(opening);
        self.inner.opened.notify_waiters();
    }
}

impl MessageStore {
    pub fn log(&self) -> &CommitLog {
        &self.inner.log
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Opens the consume queues `queue_ids` of `topic` that are not open yet, off the shard's
    /// thread: their directories made and listed, a new queue's first file created and the
    /// room for its first entry allocated, so the first append to each does no file I/O on
    /// the shard's thread. Appends to them are refused with [`StoreError::QueueOpening`]
    /// until this returns (callers open a topic's queues before sends can name them). Waits
    /// for an opening of the same queues already running. Returns how many it opened.
    pub async fn open_queues(
        &self,
        topic: &str,
        queue_ids: impl IntoIterator<Item = u32>,
    ) -> Result<usize, StoreError> {
        validate_topic(topic)?;
        let mut wanted: Vec<u32> = queue_ids.into_iter().collect();
        let mut opened = 0;
        loop {
            let ended = self.inner.opened.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            let (mine, theirs) = {
                let queues = self.inner.queues.borrow();
                let mut opening = self.inner.opening.borrow_mut();
                wanted.retain(|&q| !queues.contains_key(&(topic.to_owned(), q)));
                let (theirs, mine): (Vec<u32>, Vec<u32>) = wanted
                    .iter()
                    .partition(|&&q| opening.contains(&(topic.to_owned(), q)));
                for &q in &mine {
                    opening.insert((topic.to_owned(), q));
                }
                (mine, theirs)
            };
            if !mine.is_empty() {
                // Ends the opening however this ends: returned, failed, panicked or dropped
                // (a queue left in `opening` would refuse every append to it).
                let _ended = OpeningEnds {
                    inner: &self.inner,
                    topic,
                    queue_ids: &mine,
                };
                opened += self.open_off_thread(topic, &mine).await?;
            }
            if theirs.is_empty() {
                return Ok(opened);
            }
            wanted = theirs;
            ended.await;
        }
    }

    /// The blocking part of [`open_queues`](Self::open_queues): each queue opened and its
    /// first entry's room reserved in the blocking pool, then put in the map (those that
    /// opened, when another failed: the first failure is returned).
    async fn open_off_thread(&self, topic: &str, queue_ids: &[u32]) -> Result<usize, StoreError> {
        let root = self.inner.dir.join("consumequeue");
        let cfg = self.inner.cfg.consume_queue;
        let (owned_topic, ids) = (topic.to_owned(), queue_ids.to_vec());
        let results: Vec<(u32, Result<ConsumeQueue, IndexError>)> =
            crate::io::blocking(move || {
                ids.into_iter()
                    .map(|q| {
                        let opened = ConsumeQueue::open(&queue_dir(&root, &owned_topic, q), cfg)
                            .and_then(|mut cq| {
                                cq.reserve_next()?;
                                Ok(cq)
                            });
                        (q, opened)
                    })
                    .collect()
            })
            .await;
        let mut queues = self.inner.queues.borrow_mut();
        let mut first_error = None;
        let mut opened = 0;
        for (q, result) in results {
            match result {
                Ok(cq) => {
                    let state = QueueState {
                        cq,
                        replayed_end: None,
                    };
                    queues.insert((topic.to_owned(), q), state);
                    opened += 1;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e.into()),
            None => Ok(opened),
        }
    }

    /// Queues opened on the shard's thread by their first append since the store opened
    /// (not ahead by [`open_queues`](Self::open_queues) nor by recovery).
    pub fn inline_queue_opens(&self) -> u64 {
        self.inner.inline_opens.get()
    }

    /// Index files created on the shard's thread by a roll (no spare made ahead was ready;
    /// see `ConsumeQueue::spare_ahead`, `KeyIndex::spare_ahead`): the consume queues', each
    /// since it was opened, and the key index's since the store opened.
    pub fn index_rolls_inline(&self) -> u64 {
        let mut rolls = 0;
        self.each_index_spares(|s| rolls += s.rolls_inline());
        rolls
    }

    /// Spare index files asked for and being made in the blocking pool now.
    pub fn index_spares_out(&self) -> usize {
        let mut out = 0;
        self.each_index_spares(|s| out += usize::from(s.out()));
        out
    }

    /// Calls `f` with every index's spares: each open queue's, then the key index's.
    pub(super) fn each_index_spares(&self, mut f: impl FnMut(&mut crate::index::Spares)) {
        for q in self.inner.queues.borrow_mut().values_mut() {
            f(q.cq.spares());
        }
        f(self.inner.keys.borrow_mut().spares());
    }

    /// The queues this store has, with (min, max) offsets.
    pub fn queues(&self) -> Result<Vec<(String, u32, u64, u64)>, StoreError> {
        let mut v: Vec<_> = self
            .inner
            .queues
            .borrow()
            .iter()
            .map(|((t, q), s)| {
                Ok((
                    t.clone(),
                    *q,
                    self.kept_min(&s.cq)?,
                    self.visible_max(&s.cq)?,
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        v.sort();
        Ok(v)
    }

    /// The readable end of a queue: entries whose record is not written yet are not visible.
    fn visible_max(&self, cq: &ConsumeQueue) -> Result<u64, StoreError> {
        Ok(cq.end_within(self.inner.log.readable_end())?)
    }

    /// The start of a queue: its first entry whose record the log still holds (retention
    /// moves the log before it trims the indexes; [`ConsumeQueue::first_kept`]).
    fn kept_min(&self, cq: &ConsumeQueue) -> Result<u64, StoreError> {
        Ok(cq.first_kept(self.inner.log.min_offset())?)
    }

    /// Whether any queue of `topic` is open here (recovery opens every queue found on disk,
    /// named in the topic table or not).
    pub fn holds_topic(&self, topic: &str) -> bool {
        self.inner.queues.borrow().keys().any(|(t, _)| t == topic)
    }

    /// (min, max) queue offsets; max is the offset the next message will get. An unknown
    /// queue is empty: (0, 0). Fails only when an index file cannot be mapped.
    pub fn queue_range(&self, topic: &str, queue_id: u32) -> Result<(u64, u64), StoreError> {
        let queues = self.inner.queues.borrow();
        match queues.get(&(topic.to_owned(), queue_id)) {
            Some(q) => Ok((self.kept_min(&q.cq)?, self.visible_max(&q.cq)?)),
            None => Ok((0, 0)),
        }
    }

    /// This start of the store (its run): never 0, later than every earlier start's. A
    /// consumer's position read under it is named by it (`PullResult::incarnation`).
    pub fn incarnation(&self) -> u64 {
        self.inner.runs.current()
    }

    /// Where a position in the queue read under the run `incarnation` must go back to:
    /// the queue's end at the lowest point any later start found the log at, when
    /// `offset` is past it. A consumer that read past that end read records a crash lost
    /// (an async log's unsynced tail); the offsets there hold other messages now. `None`
    /// when the position stands: read under this run, or under an unknown one (0), or
    /// within what every later start kept (one index entry looked at; the search for the
    /// end only when the position must move). Fails only when an index file cannot be
    /// mapped.
    pub fn lost_past(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        incarnation: u64,
    ) -> Result<Option<u64>, StoreError> {
        let Some(log_end) = self.inner.runs.log_end_since(incarnation) else {
            return Ok(None);
        };
        let queues = self.inner.queues.borrow();
        let Some(q) = queues.get(&(topic.to_owned(), queue_id)) else {
            return Ok((offset > 0).then_some(0));
        };
        if offset <= q.cq.min_offset() {
            return Ok(None);
        }
        // The message before the position: kept, so is everything below it.
        if let Some(before) = q.cq.get(offset - 1)? {
            if before.end() <= log_end {
                return Ok(None);
            }
        }
        let end = q.cq.end_within(log_end)?;
        Ok((offset > end).then_some(end))
    }

    /// What an empty entry at `offset` inside the queue is: damage, named with its file
    /// (`ConsumeQueue::hole`).
    fn hole(&self, topic: &str, queue_id: u32, offset: u64) -> StoreError {
        let queues = self.inner.queues.borrow();
        match queues.get(&(topic.to_owned(), queue_id)) {
            Some(q) => q.cq.hole(offset).into(),
            None => StoreError::OffsetTooBig {
                topic: topic.into(),
                queue_id,
                offset,
                max: 0,
            },
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
        // The rename made durable (a crash must not bring the queues back under the
        // topic's name), also when an earlier try renamed it and then failed to sync.
        let renamed = {
            let (dir, aside, root) = (dir.clone(), aside.clone(), root.clone());
            crate::io::blocking(move || {
                let renamed = match std::fs::rename(&dir, &aside) {
                    Ok(()) => true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                    Err(e) => return Err(io_err("rename", &dir, e)),
                };
                match crate::io::sync_dir(&root) {
                    // No queue of any topic here yet: nothing to make durable.
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::Io(e)),
                    _ => Ok(renamed),
                }
            })
            .await?
        };
        if renamed {
            crate::io::spawn(async move {
                let gone = crate::io::blocking(move || std::fs::remove_dir_all(&aside)).await;
                if let Err(e) = gone {
                    crate::warn!("ringmq: removing a deleted topic's indexes: {e}");
                }
            });
        }
        Ok(())
    }
}

fn queue_dir(root: &Path, topic: &str, queue_id: u32) -> PathBuf {
    root.join(topic).join(queue_id.to_string())
}
