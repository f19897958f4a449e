//! The commit log of one shard: segment files named by their 20-digit base offset, an
//! appender that batches every append of a tick into one aligned direct write (and, in sync
//! mode, one fdatasync: group commit), reads by physical offset, recovery and retention.
//!
//! Physical offsets are global positions: segment `base + position in file`. A record never
//! spans two segments; when the next record does not fit, a blank filler closes the segment
//! and the next one starts at `base + segment_bytes`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod recovery;
mod tail_cache;
mod writer;

use recovery::*;
use tail_cache::TailCache;
use writer::*;

use crate::io::{align_up, LogFile, ReadBuf, WriteBuf, Written, IO_ALIGN};
use crate::protocol::record::{
    encode_blank, peek_frame, Placement, RecordDraft, RecordError, RecordView, BLANK_MAGIC,
    HEADER_BYTES, RECORD_BYTES_MAX, RECORD_MAGIC_V1,
};

/// When an append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// After the write reached the file; an fdatasync runs in the background every
    /// `flush_interval_ms`.
    Async,
    /// Once the record is durable: the segment files are written with O_DSYNC (a write
    /// completes as write + fdatasync would); concurrent appends share one write.
    Sync,
}

impl std::str::FromStr for FlushMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "async" => Ok(FlushMode::Async),
            "sync" => Ok(FlushMode::Sync),
            other => Err(format!(
                "unknown flush mode {other:?}: expected async or sync"
            )),
        }
    }
}

/// Options of a commit log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Size of one segment file.
    pub segment_bytes: u64,
    pub flush: FlushMode,
    /// Background fdatasync period in async mode.
    pub flush_interval_ms: u64,
    /// Segments whose newest write is older than this are deleted.
    pub retention_ms: u64,
    /// When the log is larger than this, the oldest segments are deleted (0: no limit).
    pub retention_bytes_max: u64,
    /// Recovery verifies every record of the last this-many segments, and every record
    /// after the checkpoint (0: verify all segments).
    pub verify_segments_on_start: u32,
    /// Reserve the disk space of a new segment when it is created.
    pub preallocate: bool,
    /// Largest single read (a pull's range read, a recovery chunk).
    pub read_chunk_bytes: usize,
    /// The newest bytes of the log kept in memory, so that consumers that keep up are
    /// served without a disk read (0: off).
    pub tail_cache_bytes: usize,
    /// How far the log is known durable (recorded by the store's checkpoint after an
    /// fdatasync). At recovery a bad record before this offset is rot (start-up refuses,
    /// naming file and offset); one at or after it is damage a crash leaves in writes that
    /// were in flight: the log ends there and the bytes from it on are moved to a
    /// quarantine file. `u64::MAX`: everything counts as durable.
    pub known_durable: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            flush: FlushMode::Async,
            flush_interval_ms: 500,
            retention_ms: 72 * 3600 * 1000,
            retention_bytes_max: 0,
            verify_segments_on_start: 3,
            preallocate: true,
            read_chunk_bytes: 8 << 20,
            tail_cache_bytes: 64 << 20,
            known_durable: u64::MAX,
        }
    }
}

/// Errors of the commit log. Each names what failed and where.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("commit log I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "commit log refuses writes after an earlier I/O failure (reopen to recover): {reason}"
    )]
    Poisoned { reason: String },
    #[error(
        "corrupt record in {path} at file offset {file_offset} (log offset {log_offset}): {reason}"
    )]
    Corrupt {
        path: PathBuf,
        file_offset: u64,
        log_offset: u64,
        reason: String,
    },
    #[error("no record starts at log offset {offset}")]
    NoRecord { offset: u64 },
    #[error("offset {offset} is below the log's first offset {min} (deleted by retention)")]
    OffsetTooSmall { offset: u64, min: u64 },
    #[error("offset {offset} is beyond the readable end of the log {end}")]
    OffsetTooBig { offset: u64, end: u64 },
    #[error("record of {len} bytes does not fit a segment of {segment_bytes} bytes")]
    RecordTooLarge { len: usize, segment_bytes: u64 },
    #[error("invalid record: {0}")]
    InvalidRecord(#[from] RecordError),
    #[error("disk full: {reason}; nothing of this write was stored")]
    DiskFull { reason: String },
    #[error("invalid log configuration: {0}")]
    Config(String),
    #[error("commit log directory {path}: {reason}")]
    Layout { path: PathBuf, reason: String },
}

/// Where an appended record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub physical_offset: u64,
    pub size: u32,
    pub store_timestamp_ms: i64,
    /// The log's cut count when appended: waits for the record fail if a cut (a full disk)
    /// dropped it since.
    pub epoch: u64,
}

impl Appended {
    pub fn end(&self) -> u64 {
        self.physical_offset + self.size as u64
    }
}

/// What recovery found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments: usize,
    /// Records verified (length, magic, CRC).
    pub records_verified: u64,
    pub bytes_verified: u64,
    /// Bytes cut from a torn tail (moved to `quarantined`).
    pub truncated_bytes: u64,
    /// Where the log was cut (the first bad record after the known-durable point).
    pub cut_at: Option<u64>,
    /// Why it was cut there.
    pub cut_reason: Option<String>,
    /// Files the cut bytes were moved to (never deleted).
    pub quarantined: Vec<PathBuf>,
    pub min_offset: u64,
    pub end_offset: u64,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn segment_name(base: u64) -> String {
    format!("{base:020}")
}

fn align_down(v: u64) -> u64 {
    v - v % IO_ALIGN as u64
}

struct Segment {
    base: u64,
    path: PathBuf,
    /// None until the writer creates the file.
    file: Option<Rc<LogFile>>,
    /// File bytes known to be initialized (written), for sync mode's pre-zeroing.
    zeroed_to: u64,
    /// Zeros are being written past `zeroed_to` in the background.
    zeroing: bool,
}

/// Bytes of one segment waiting to be written: they start at an aligned position, so the
/// first block may repeat bytes already written (the partial tail block is rewritten).
struct Chunk<B = WriteBuf> {
    seg_base: u64,
    start: u64,
    bytes: B,
}

/// A chunk ready to be written (or being written): its bytes padded to whole blocks and
/// shared with the write and then the tail cache.
type ReadyChunk = Chunk<Written>;

impl Chunk {
    /// Written as it is: the records were encoded into aligned memory.
    fn ready(self) -> ReadyChunk {
        Chunk {
            seg_base: self.seg_base,
            start: self.start,
            bytes: self.bytes.into_written(),
        }
    }
}

/// Room a new chunk starts with at least; a chunk starts with room for about the most the
/// recent writes took.
const CHUNK_CAP_MIN: usize = 16 << 10;

/// Room a new chunk starts with at most (more grows it).
const CHUNK_CAP_MAX: usize = 16 << 20;

struct State {
    segments: BTreeMap<u64, Segment>,
    active_base: u64,
    /// Position of the next record (absolute).
    write_pos: u64,
    /// Chunks of sealed segments not yet written, oldest first.
    sealed: Vec<Chunk>,
    /// The active segment's unwritten bytes, starting at an aligned position.
    active: Chunk,
    writer_running: bool,
    poisoned: Option<String>,
    /// Set when a write found the disk full: appends are refused with `DiskFull` until
    /// [`CommitLog::space_returned`] clears it.
    full: Option<String>,
    /// Removals of segment files past a cut still running (off the shard thread): `full`
    /// is not cleared until they end.
    removing: usize,
    /// Cuts made so far (each drops what was appended but not written when the disk was
    /// full), and the recent ones as (epoch after the cut, log offset cut at), oldest first.
    epoch: u64,
    cuts: VecDeque<(u64, u64)>,
    min_offset: u64,
    /// Files written since the last fdatasync.
    unsynced: Vec<Rc<LogFile>>,
    closed: bool,
    /// Room the next chunk starts with: about the most the recent rounds took (decaying by
    /// 1/16 a round), so steady rounds never grow a buffer by moving its bytes. A round
    /// larger than that grows its chunk: a round is one write per segment. (Writing a full
    /// chunk as it is and going on in a new one spared the move but made a round two writes
    /// one after the other, and raised the send p99.9 of batches of 1000 by 40-90%: see
    /// perf/README, issue 13.)
    chunk_cap: usize,
}

impl State {
    /// A chunk for the segment at `seg_base`, starting at `start`, holding a copy of `head`
    /// (the partial last block already written).
    fn new_chunk(&self, seg_base: u64, start: u64, head: &[u8]) -> Chunk {
        Chunk {
            seg_base,
            start,
            bytes: WriteBuf::from_slice(head, self.chunk_cap),
        }
    }

    /// Replaces the active chunk with a new one that starts with a copy of its partial last
    /// block (the new chunk's write rewrites that block with more records), and returns it.
    fn take_active(&mut self) -> Chunk {
        let end = self.active.start + self.active.bytes.len() as u64;
        let keep_from = align_down(end);
        let keep = &self.active.bytes.as_slice()[(keep_from - self.active.start) as usize..];
        let next = self.new_chunk(self.active.seg_base, keep_from, keep);
        std::mem::replace(&mut self.active, next)
    }
}

/// An offset that only grows, with tasks waiting for it to pass a target.
#[derive(Default)]
struct Watermark {
    value: Cell<u64>,
    waiters: RefCell<Vec<(u64, Waker)>>,
}

impl Watermark {
    fn advance(&self, v: u64) {
        debug_assert!(v >= self.value.get());
        self.value.set(v);
        let ready: Vec<Waker> = {
            let mut w = self.waiters.borrow_mut();
            let mut ready = Vec::new();
            w.retain(|(target, waker)| {
                if *target <= v {
                    ready.push(waker.clone());
                    false
                } else {
                    true
                }
            });
            ready
        };
        ready.into_iter().for_each(Waker::wake);
    }
    fn wake_all(&self) {
        let all: Vec<_> = self.waiters.borrow_mut().drain(..).collect();
        all.into_iter().for_each(|(_, w)| w.wake());
    }
}

struct Inner {
    tail: RefCell<TailCache>,
    dir: PathBuf,
    cfg: LogConfig,
    st: RefCell<State>,
    readable: Watermark,
    durable: Watermark,
    /// Wakes the background flusher early (close).
    flusher_stop: Cell<bool>,
    /// A background pre-zeroing, or the removal of files past a cut, ended.
    zeroed: tokio::sync::Notify,
    stats: crate::log::stats::LogStats,
}

/// The commit log. Cheap to clone (shared within one shard; not `Send`).
#[derive(Clone)]
pub struct CommitLog {
    inner: Rc<Inner>,
}

impl CommitLog {
    /// Opens (or creates) the log in `dir` and recovers it. Every record from
    /// `dispatch_from` on (and every record of the verified tail segments) is checked, and
    /// records at or after `dispatch_from` are passed to `dispatch` in log order so the
    /// caller can rebuild its indexes.
    pub async fn open(
        dir: &Path,
        cfg: LogConfig,
        dispatch_from: u64,
        mut dispatch: impl FnMut(RecordView<'_>),
    ) -> Result<(CommitLog, RecoveryReport), LogError> {
        if cfg.segment_bytes < 2 * IO_ALIGN as u64 || cfg.segment_bytes % IO_ALIGN as u64 != 0 {
            return Err(LogError::Config(format!(
                "segment_bytes {} must be a multiple of {IO_ALIGN} and at least {}",
                cfg.segment_bytes,
                2 * IO_ALIGN
            )));
        }
        if cfg.read_chunk_bytes < RECORD_BYTES_MAX + IO_ALIGN {
            return Err(LogError::Config(format!(
                "read_chunk_bytes must be at least {}",
                RECORD_BYTES_MAX + IO_ALIGN
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| LogError::Layout {
            path: dir.to_owned(),
            reason: format!("create: {e}"),
        })?;
        let bases = list_segments(dir)?;
        let mut report = RecoveryReport {
            segments: bases.len(),
            ..Default::default()
        };
        let mut segments = BTreeMap::new();
        for &base in &bases {
            let path = dir.join(segment_name(base));
            let file = LogFile::open(&path, false, cfg.flush == FlushMode::Sync).await?;
            segments.insert(
                base,
                Segment {
                    base,
                    path,
                    file: Some(Rc::new(file)),
                    zeroed_to: 0,
                    zeroing: false,
                },
            );
        }
        let (end, tail_bytes, active_base) = if bases.is_empty() {
            (0u64, Vec::new(), 0u64)
        } else {
            recover(
                &cfg,
                &mut segments,
                dispatch_from,
                &mut dispatch,
                &mut report,
            )
            .await?
        };
        let min_offset = segments.keys().next().copied().unwrap_or(active_base);
        report.min_offset = min_offset;
        report.end_offset = end;
        let path = dir.join(segment_name(active_base));
        segments.entry(active_base).or_insert(Segment {
            base: active_base,
            path,
            file: None,
            zeroed_to: 0,
            zeroing: false,
        });
        let start = align_down(end);
        let st = State {
            segments,
            active_base,
            write_pos: end,
            sealed: Vec::new(),
            active: Chunk {
                seg_base: active_base,
                start,
                bytes: WriteBuf::from_slice(&tail_bytes, CHUNK_CAP_MIN),
            },
            writer_running: false,
            poisoned: None,
            full: None,
            removing: 0,
            epoch: 0,
            cuts: VecDeque::new(),
            min_offset,
            unsynced: Vec::new(),
            closed: false,
            chunk_cap: CHUNK_CAP_MIN,
        };
        debug_assert_eq!(st.active.bytes.len() as u64, end - start);
        let inner = Rc::new(Inner {
            tail: RefCell::new(TailCache::default()),
            dir: dir.to_owned(),
            cfg,
            st: RefCell::new(st),
            readable: Watermark::default(),
            durable: Watermark::default(),
            flusher_stop: Cell::new(false),
            zeroed: tokio::sync::Notify::new(),
            stats: Default::default(),
        });
        inner.readable.value.set(end);
        inner.durable.value.set(end);
        let log = CommitLog { inner };
        if log.inner.cfg.flush == FlushMode::Async {
            let weak = Rc::downgrade(&log.inner);
            crate::io::spawn(async move { flusher(weak).await });
        }
        Ok((log, report))
    }

    pub fn config(&self) -> &LogConfig {
        &self.inner.cfg
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// First readable offset (older segments were deleted by retention).
    pub fn min_offset(&self) -> u64 {
        self.inner.st.borrow().min_offset
    }

    /// Offset of the next record to be appended.
    pub fn write_offset(&self) -> u64 {
        self.inner.st.borrow().write_pos
    }

    /// Everything below this offset is written and can be read.
    pub fn readable_end(&self) -> u64 {
        self.inner.readable.value.get()
    }

    /// Everything below this offset is covered by an fdatasync.
    pub fn durable_end(&self) -> u64 {
        self.inner.durable.value.get()
    }

    /// Refuses every later append until a restart (whose recovery reads the log as it is
    /// on disk): for a caller whose indexes no longer agree with the log.
    pub fn poison(&self, reason: String) {
        writer::poison(&self.inner, reason);
    }

    /// The reason the log refuses writes, if it does.
    pub fn poisoned(&self) -> Option<String> {
        self.inner.st.borrow().poisoned.clone()
    }

    /// Encodes a record into the write buffer and schedules its write. The record is not
    /// readable until [`wait_readable`](Self::wait_readable) (or `wait_durable`) returns for
    /// its end. All appends of one tick share one write.
    pub fn append(&self, draft: &RecordDraft<'_>, queue_offset: u64) -> Result<Appended, LogError> {
        self.append_at(draft, queue_offset, now_ms())
    }

    /// [`append`](Self::append) with the store timestamp given (one for a whole batch).
    pub fn append_at(
        &self,
        draft: &RecordDraft<'_>,
        queue_offset: u64,
        store_timestamp_ms: i64,
    ) -> Result<Appended, LogError> {
        draft.validate()?;
        let len = draft.encoded_len();
        let seg_bytes = self.inner.cfg.segment_bytes;
        if len as u64 > seg_bytes {
            return Err(LogError::RecordTooLarge {
                len,
                segment_bytes: seg_bytes,
            });
        }
        let mut st = self.inner.st.borrow_mut();
        if let Some(reason) = &st.poisoned {
            return Err(LogError::Poisoned {
                reason: reason.clone(),
            });
        }
        if st.closed {
            return Err(LogError::Poisoned {
                reason: "log is closed".into(),
            });
        }
        if let Some(reason) = &st.full {
            return Err(LogError::DiskFull {
                reason: reason.clone(),
            });
        }
        let seg_end = st.active_base + seg_bytes;
        if st.write_pos + len as u64 > seg_end {
            self.roll(&mut st);
        }
        let physical_offset = st.write_pos;
        let at = Placement {
            queue_offset,
            physical_offset,
            store_timestamp_ms,
        };
        let chunk = &mut st.active;
        debug_assert_eq!(chunk.start + chunk.bytes.len() as u64, physical_offset);
        draft.encode_into(at, chunk.bytes.extend(len));
        st.write_pos += len as u64;
        if !st.writer_running {
            st.writer_running = true;
            let weak = Rc::downgrade(&self.inner);
            crate::io::spawn(async move { writer(weak).await });
        }
        Ok(Appended {
            physical_offset,
            size: len as u32,
            store_timestamp_ms,
            epoch: st.epoch,
        })
    }

    /// Whether the records appended from log offset `from` on can still be taken back
    /// ([`take_back`](Self::take_back)): they all sit in the active segment's chunk, which no
    /// write has taken yet (true only within the tick that appended them).
    pub fn can_take_back(&self, from: u64) -> bool {
        let st = self.inner.st.borrow();
        st.poisoned.is_none()
            && from >= st.active_base
            && from >= st.active.start
            && from <= st.write_pos
    }

    /// Takes back the records appended from `from` on, as if never appended: the caller
    /// checked [`can_take_back`](Self::can_take_back) in the same tick (a batch whose
    /// indexing failed half-way is answered with an error and stores none of its records).
    pub fn take_back(&self, from: u64) {
        let mut st = self.inner.st.borrow_mut();
        debug_assert!(from >= st.active.start && from >= st.active_base && from <= st.write_pos);
        let keep = (from - st.active.start) as usize;
        st.active.bytes.truncate(keep);
        st.write_pos = from;
    }

    /// Closes the active segment with a blank filler and starts the next one.
    fn roll(&self, st: &mut State) {
        let seg_bytes = self.inner.cfg.segment_bytes;
        let seg_end = st.active_base + seg_bytes;
        let remaining = (seg_end - st.write_pos) as usize;
        let rest = st.active.bytes.extend(remaining);
        rest.fill(0);
        if remaining >= 8 {
            encode_blank(rest);
        }
        // else too small for a filler: zeros mark the end of a sealed segment.
        let next = seg_end;
        let fresh = st.new_chunk(next, next, &[]);
        let old = std::mem::replace(&mut st.active, fresh);
        st.sealed.push(old);
        st.active_base = next;
        st.write_pos = next;
        let path = self.inner.dir.join(segment_name(next));
        st.segments.insert(
            next,
            Segment {
                base: next,
                path,
                file: None,
                zeroed_to: 0,
                zeroing: false,
            },
        );
    }

    /// Waits until the log is readable up to `end` (async flush mode acknowledgement), for
    /// records appended at the current epoch or already readable.
    pub fn wait_readable(&self, end: u64) -> WaitFor<'_> {
        self.wait(end, self.epoch(), false)
    }

    /// Waits until an fdatasync covers everything below `end` (appended at the current
    /// epoch or already readable).
    pub fn wait_durable(&self, end: u64) -> WaitFor<'_> {
        self.wait(end, self.epoch(), true)
    }

    /// Waits as the flush mode says an append is acknowledged (appended at the current
    /// epoch).
    pub fn wait_acked(&self, end: u64) -> WaitFor<'_> {
        self.wait_acked_since(end, self.epoch())
    }

    /// Waits as the flush mode says an append is acknowledged: the record appended at
    /// `epoch` (see [`Appended::epoch`]) ending at `end`. Fails with `DiskFull` if a cut
    /// dropped it meanwhile.
    pub fn wait_acked_since(&self, end: u64, epoch: u64) -> WaitFor<'_> {
        self.wait(end, epoch, self.inner.cfg.flush == FlushMode::Sync)
    }

    /// Waits until an fdatasync covers the record appended at `epoch` ending at `end`.
    pub fn wait_durable_since(&self, end: u64, epoch: u64) -> WaitFor<'_> {
        self.wait(end, epoch, true)
    }

    fn wait(&self, end: u64, epoch: u64, durable: bool) -> WaitFor<'_> {
        WaitFor {
            inner: &self.inner,
            target: end,
            epoch,
            durable,
        }
    }

    /// How many cuts the log made (each after a write found the disk full).
    pub fn epoch(&self) -> u64 {
        self.inner.st.borrow().epoch
    }

    /// The offset of the last cut: everything appended at or after it before the cut was
    /// dropped (indexes must forget it).
    pub fn last_cut(&self) -> Option<u64> {
        self.inner.st.borrow().cuts.back().map(|&(_, at)| at)
    }

    /// Why appends are refused for a full disk, if they are.
    pub fn full(&self) -> Option<String> {
        self.inner.st.borrow().full.clone()
    }

    /// The disk has room again: appends are taken again (a write that still finds the disk
    /// full cuts again), once the segment files past the last cut are removed (until then
    /// this does nothing: the caller asks again later).
    pub fn space_returned(&self) {
        let was = {
            let mut st = self.inner.st.borrow_mut();
            if st.removing > 0 {
                return;
            }
            st.full.take()
        };
        if was.is_some() {
            crate::say!(
                "ringmq: commit log {}: disk space is back, taking writes again",
                self.inner.dir.display()
            );
        }
    }

    fn file_for(&self, offset: u64, len: u64) -> Result<(Rc<LogFile>, u64), LogError> {
        let st = self.inner.st.borrow();
        if offset < st.min_offset {
            return Err(LogError::OffsetTooSmall {
                offset,
                min: st.min_offset,
            });
        }
        let end = self.readable_end();
        // Offsets come from clients (message ids): never let them overflow.
        let Some(last) = offset.checked_add(len) else {
            return Err(LogError::OffsetTooBig { offset, end });
        };
        if last > end {
            return Err(LogError::OffsetTooBig { offset, end });
        }
        let (base, seg) =
            st.segments
                .range(..=offset)
                .next_back()
                .ok_or(LogError::OffsetTooSmall {
                    offset,
                    min: st.min_offset,
                })?;
        if last > base + self.inner.cfg.segment_bytes {
            return Err(LogError::OffsetTooBig {
                offset,
                end: base + self.inner.cfg.segment_bytes,
            });
        }
        let file = seg
            .file
            .clone()
            .ok_or(LogError::OffsetTooBig { offset, end })?;
        Ok((file, offset - base))
    }

    /// Where the cached write holding `offset` ends, if it is cached: a read that stays
    /// below it shares the cache's buffer instead of copying.
    pub fn cached_until(&self, offset: u64) -> Option<u64> {
        self.inner.tail.borrow().write_end(offset)
    }

    /// Reads `len` bytes at `offset` (within one segment, below the readable end): from the
    /// cache of the newest writes when it holds them (shared when one write holds them all),
    /// else from the file.
    pub async fn read(&self, offset: u64, len: usize) -> Result<ReadBuf, LogError> {
        let (file, pos) = self.file_for(offset, len as u64)?;
        {
            let tail = self.inner.tail.borrow();
            if let Some((bytes, start)) = tail.shared(offset, len) {
                return Ok(ReadBuf::Shared { bytes, start, len });
            }
            if let Some(bytes) = tail.copy(offset, len) {
                return Ok(ReadBuf::Plain(bytes));
            }
        }
        let buf = file.read_at(pos, len).await?;
        if buf.len() != len {
            return Err(LogError::Corrupt {
                path: file.path().to_owned(),
                file_offset: pos,
                log_offset: offset,
                reason: format!("short read: {} of {len} bytes", buf.len()),
            });
        }
        Ok(buf)
    }

    /// Reads and verifies the record of `size` bytes at `offset`.
    pub async fn read_record(&self, offset: u64, size: u32) -> Result<ReadBuf, LogError> {
        let buf = self.read(offset, size as usize).await?;
        self.check_record(&buf, offset)?;
        Ok(buf)
    }

    /// Reads the record at `offset` without knowing its size (message by id):
    /// [`LogError::NoRecord`] when no record starts there, [`LogError::Corrupt`] when one
    /// does but is damaged.
    pub async fn read_record_at(&self, offset: u64) -> Result<ReadBuf, LogError> {
        let head = self.read(offset, HEADER_BYTES).await?;
        let (len, magic) = peek_frame(&head).unwrap_or((0, 0));
        if magic != RECORD_MAGIC_V1 {
            return Err(LogError::NoRecord { offset });
        }
        if (len as usize) < HEADER_BYTES || len as usize > RECORD_BYTES_MAX {
            return Err(self.corrupt_at(offset, format!("bad record length {len}")));
        }
        self.read_record(offset, len).await
    }

    /// A record read back fails its checks: the disk returned something else than what was
    /// written. Names the segment file and the offset in it.
    fn check_record(&self, bytes: &[u8], offset: u64) -> Result<(), LogError> {
        let view = RecordView::parse(bytes).map_err(|e| self.corrupt_at(offset, e.to_string()))?;
        if view.physical_offset() != offset || view.total_len() as usize != bytes.len() {
            return Err(self.corrupt_at(
                offset,
                format!(
                    "the record there names log offset {} and {} bytes",
                    view.physical_offset(),
                    view.total_len()
                ),
            ));
        }
        Ok(())
    }

    /// The segment file holding log offset `offset`, and the offset in that file.
    pub fn locate(&self, offset: u64) -> (PathBuf, u64) {
        let seg = self.inner.cfg.segment_bytes;
        let base = offset - offset % seg;
        let st = self.inner.st.borrow();
        let path = st
            .segments
            .get(&base)
            .map(|s| s.path.clone())
            .unwrap_or_else(|| self.inner.dir.join(segment_name(base)));
        (path, offset - base)
    }

    /// A corruption error at log offset `offset`, naming the segment file.
    pub fn corrupt_at(&self, offset: u64, reason: String) -> LogError {
        let (path, file_offset) = self.locate(offset);
        LogError::Corrupt {
            path,
            file_offset,
            log_offset: offset,
            reason,
        }
    }

    /// The sealed segments (never the active one, nor one still being written), oldest
    /// first, with the age of their newest data in ms: the file times are read off the
    /// shard's thread.
    async fn sealed_segment_ages(&self, now_ms: i64) -> Vec<(u64, PathBuf, i64)> {
        let seg = self.inner.cfg.segment_bytes;
        let candidates: Vec<(u64, PathBuf)> = {
            let st = self.inner.st.borrow();
            let active = st.active_base;
            let readable = self.readable_end();
            st.segments
                .values()
                .filter(|s| s.base < active && s.base + seg <= readable)
                .map(|s| (s.base, s.path.clone()))
                .collect()
        };
        crate::io::blocking(move || {
            candidates
                .into_iter()
                .map(|(base, path)| {
                    let age_ms = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                        .map(|d| now_ms - d.as_millis() as i64)
                        .unwrap_or(0);
                    (base, path, age_ms)
                })
                .collect()
        })
        .await
    }

    /// How many of `aged` (oldest first) retention deletes: those past the age limit or
    /// beyond the size limit, stopping at the first that holds `keep_from` or later.
    fn retention_cut(&self, aged: &[(u64, PathBuf, i64)], keep_from: u64) -> usize {
        let cfg = &self.inner.cfg;
        let (write_pos, min) = {
            let st = self.inner.st.borrow();
            (st.write_pos, st.min_offset)
        };
        let mut remaining_bytes = write_pos - min;
        let mut cut = 0;
        for (base, _, age_ms) in aged {
            let too_big = cfg.retention_bytes_max > 0 && remaining_bytes > cfg.retention_bytes_max;
            // A retention past i64 milliseconds is "never" (the broker refuses one that
            // long; a log opened on its own must not read it as negative).
            let too_old = *age_ms > i64::try_from(cfg.retention_ms).unwrap_or(i64::MAX);
            if !(too_big || too_old) || base + cfg.segment_bytes > keep_from {
                break;
            }
            remaining_bytes = remaining_bytes.saturating_sub(cfg.segment_bytes);
            cut += 1;
        }
        cut
    }

    /// The log offset below which retention would delete now if nothing held it back (the
    /// log's minimum when it would delete nothing).
    pub async fn retention_wanted_end(&self, now_ms: i64) -> u64 {
        let aged = self.sealed_segment_ages(now_ms).await;
        match self.retention_cut(&aged, u64::MAX) {
            0 => self.min_offset(),
            n => aged[n - 1].0 + self.inner.cfg.segment_bytes,
        }
    }

    /// Deletes segments older than the retention age, or beyond the size limit, oldest
    /// first; never the active one. File times are read and files deleted off the shard's
    /// thread; readers of a deleted range get `OffsetTooSmall` at once. Returns the new
    /// minimum offset. `keep_from`: a log offset whose segment (and every later one) must
    /// stay, whatever its age or the size limit (`u64::MAX`: none).
    pub async fn apply_retention(&self, now_ms: i64, keep_from: u64) -> u64 {
        let aged = self.sealed_segment_ages(now_ms).await;
        let cut = self.retention_cut(&aged, keep_from);
        let mut doomed = Vec::with_capacity(cut);
        {
            let seg = self.inner.cfg.segment_bytes;
            let mut st = self.inner.st.borrow_mut();
            for (base, path, _) in aged.into_iter().take(cut) {
                // Still there (nothing else deletes segments, but stay safe).
                if st.segments.remove(&base).is_some() {
                    st.min_offset = st.min_offset.max(base + seg);
                    doomed.push(path);
                    self.inner
                        .stats
                        .segments_deleted
                        .set(self.inner.stats.segments_deleted.get() + 1);
                }
            }
        }
        if !doomed.is_empty() {
            crate::io::blocking(move || {
                for p in doomed {
                    if let Err(e) = std::fs::remove_file(&p) {
                        crate::warn!("ringmq: retention could not delete {}: {e}", p.display());
                    }
                }
            })
            .await;
        }
        self.min_offset()
    }

    /// What the log counted (fdatasync latency, segments deleted).
    pub fn stats(&self) -> &crate::log::stats::LogStats {
        &self.inner.stats
    }

    /// Segment files of the log.
    pub fn segment_count(&self) -> usize {
        self.inner.st.borrow().segments.len()
    }

    /// Writes everything pending, fdatasyncs, and refuses further appends.
    pub async fn close(&self) -> Result<u64, LogError> {
        let end = self.write_offset();
        self.wait_readable(end).await?;
        self.sync_all().await?;
        // No zeros may land after the log is closed (a log opened again on these files
        // would write there).
        writer::zeroing_ended(&self.inner).await;
        self.inner.st.borrow_mut().closed = true;
        self.inner.flusher_stop.set(true);
        Ok(end)
    }

    /// fdatasyncs every file written since the last sync and advances the durable end.
    pub async fn sync_all(&self) -> Result<(), LogError> {
        sync_unsynced(&self.inner).await
    }
}

/// A wait for a watermark; fails if the log is poisoned meanwhile, or if a cut dropped the
/// record waited for.
pub struct WaitFor<'a> {
    inner: &'a Inner,
    target: u64,
    /// The epoch the record was appended at.
    epoch: u64,
    durable: bool,
}

/// Most cuts remembered; a wait for a record appended before the oldest of them fails as
/// if cut (the record may be stored: a retry stores it twice, nothing is lost).
const CUTS_KEPT: usize = 1024;

impl Future for WaitFor<'_> {
    type Output = Result<(), LogError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mark = if self.durable {
            &self.inner.durable
        } else {
            &self.inner.readable
        };
        {
            let st = self.inner.st.borrow();
            if st.epoch != self.epoch {
                // Cuts after the append: did one drop bytes below the target?
                let forgotten = st.cuts.front().is_some_and(|&(e, _)| e > self.epoch + 1);
                let cut = st
                    .cuts
                    .iter()
                    .any(|&(e, at)| e > self.epoch && at < self.target);
                if cut || forgotten {
                    return Poll::Ready(Err(LogError::DiskFull {
                        reason: st
                            .full
                            .clone()
                            .unwrap_or_else(|| "the disk was full".into()),
                    }));
                }
            }
        }
        if mark.value.get() >= self.target {
            return Poll::Ready(Ok(()));
        }
        if let Some(reason) = &self.inner.st.borrow().poisoned {
            return Poll::Ready(Err(LogError::Poisoned {
                reason: reason.clone(),
            }));
        }
        mark.waiters
            .borrow_mut()
            .push((self.target, cx.waker().clone()));
        Poll::Pending
    }
}
