//! The commit log of one shard: segment files named by their 20-digit base offset, an
//! appender that batches every append of a tick into one aligned direct write (and, in sync
//! mode, one fdatasync: group commit), reads by physical offset, recovery and retention.
//!
//! Physical offsets are global positions: segment `base + position in file`. A record never
//! spans two segments; when the next record does not fit, a blank filler closes the segment
//! and the next one starts at `base + segment_bytes`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::record::{
    encode_blank, peek_frame, Placement, RecordDraft, RecordError, RecordView, BLANK_MAGIC,
    HEADER_BYTES, RECORD_BYTES_MAX, RECORD_MAGIC_V1,
};
use crate::io::{LogFile, ReadBuf, IO_ALIGN};

/// When an append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// After the write reached the file; an fdatasync runs in the background every
    /// `flush_interval_ms`.
    Async,
    /// After an fdatasync covers the record; concurrent appends share one fdatasync.
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
    #[error("offset {offset} is below the log's first offset {min} (deleted by retention)")]
    OffsetTooSmall { offset: u64, min: u64 },
    #[error("offset {offset} is beyond the readable end of the log {end}")]
    OffsetTooBig { offset: u64, end: u64 },
    #[error("record of {len} bytes does not fit a segment of {segment_bytes} bytes")]
    RecordTooLarge { len: usize, segment_bytes: u64 },
    #[error("invalid record: {0}")]
    InvalidRecord(#[from] RecordError),
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
    /// Bytes cut from a torn tail.
    pub truncated_bytes: u64,
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

fn align_up(v: usize) -> usize {
    v.div_ceil(IO_ALIGN) * IO_ALIGN
}

struct Segment {
    base: u64,
    path: PathBuf,
    /// None until the writer creates the file.
    file: Option<Rc<LogFile>>,
    /// File bytes known to be initialized (written), for sync mode's pre-zeroing.
    zeroed_to: u64,
}

/// Bytes of one segment waiting to be written: they start at an aligned position, so the
/// first block may repeat bytes already written (the partial tail block is rewritten).
struct Chunk {
    seg_base: u64,
    start: u64,
    bytes: Vec<u8>,
}

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
    min_offset: u64,
    /// Files written since the last fdatasync.
    unsynced: Vec<Rc<LogFile>>,
    closed: bool,
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

/// The newest written bytes of the log, in two contiguous halves of up to half the cache
/// each: `newer` takes the writes; when it is full it becomes `older` and the old `older`
/// buffer (its memory kept) starts again as `newer`. Every written byte is copied in once,
/// never moved (a single buffer that dropped its oldest half moved half the cache each
/// time). A read spanning the two halves misses and goes to the file.
#[derive(Default)]
struct TailCache {
    older: CacheHalf,
    newer: CacheHalf,
}

#[derive(Default)]
struct CacheHalf {
    base: u64,
    bytes: Vec<u8>,
}

impl CacheHalf {
    fn end(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    fn get(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let from = usize::try_from(offset.checked_sub(self.base)?).ok()?;
        self.bytes.get(from..from.checked_add(len)?)
    }
}

impl TailCache {
    /// Records that `bytes` were written at `start`. Writes follow each other (a write may
    /// repeat the end of the one before, the partial block); anything else starts over.
    fn extend(&mut self, start: u64, bytes: &[u8], cap: usize) {
        if cap == 0 {
            return;
        }
        let low = if self.older.bytes.is_empty() {
            self.newer.base
        } else {
            self.older.base
        };
        let cached = !self.older.bytes.is_empty() || !self.newer.bytes.is_empty();
        let contiguous = cached && start >= low && start <= self.newer.end();
        if !contiguous {
            self.older.bytes.clear();
            self.newer.bytes.clear();
            self.newer.base = start;
        }
        let end = start + bytes.len() as u64;
        let have_end = self.newer.end();
        if end > have_end {
            self.newer
                .bytes
                .extend_from_slice(&bytes[(have_end - start) as usize..]);
        }
        if self.newer.bytes.len() >= (cap / 2).max(1) {
            std::mem::swap(&mut self.older, &mut self.newer);
            self.newer.bytes.clear();
            self.newer.base = self.older.end();
        }
    }

    fn get(&self, offset: u64, len: usize) -> Option<&[u8]> {
        if offset >= self.newer.base {
            self.newer.get(offset, len)
        } else {
            self.older.get(offset, len)
        }
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
            let file = LogFile::open(&path, false).await?;
            segments.insert(
                base,
                Segment {
                    base,
                    path,
                    file: Some(Rc::new(file)),
                    zeroed_to: 0,
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
                bytes: tail_bytes,
            },
            writer_running: false,
            poisoned: None,
            min_offset,
            unsynced: Vec::new(),
            closed: false,
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

    /// The reason the log refuses writes, if it does.
    pub fn poisoned(&self) -> Option<String> {
        self.inner.st.borrow().poisoned.clone()
    }

    /// Encodes a record into the write buffer and schedules its write. The record is not
    /// readable until [`wait_readable`](Self::wait_readable) (or `wait_durable`) returns for
    /// its end. All appends of one tick share one write.
    pub fn append(&self, draft: &RecordDraft<'_>, queue_offset: u64) -> Result<Appended, LogError> {
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
        let seg_end = st.active_base + seg_bytes;
        if st.write_pos + len as u64 > seg_end {
            self.roll(&mut st);
        }
        let physical_offset = st.write_pos;
        let store_timestamp_ms = now_ms();
        let at = Placement {
            queue_offset,
            physical_offset,
            store_timestamp_ms,
        };
        let chunk = &mut st.active;
        let from = chunk.bytes.len();
        debug_assert_eq!(chunk.start + from as u64, physical_offset);
        chunk.bytes.resize(from + len, 0);
        draft.encode_into(at, &mut chunk.bytes[from..]);
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
        })
    }

    /// Closes the active segment with a blank filler and starts the next one.
    fn roll(&self, st: &mut State) {
        let seg_bytes = self.inner.cfg.segment_bytes;
        let seg_end = st.active_base + seg_bytes;
        let remaining = (seg_end - st.write_pos) as usize;
        if remaining >= 8 {
            let from = st.active.bytes.len();
            st.active.bytes.resize(from + remaining, 0);
            encode_blank(&mut st.active.bytes[from..]);
        } else if remaining > 0 {
            // Too small for a filler: zeros mark the end of a sealed segment.
            let from = st.active.bytes.len();
            st.active.bytes.resize(from + remaining, 0);
        }
        let next = seg_end;
        let old = std::mem::replace(
            &mut st.active,
            Chunk {
                seg_base: next,
                start: next,
                bytes: Vec::new(),
            },
        );
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
            },
        );
    }

    /// Waits until the log is readable up to `end` (async flush mode acknowledgement).
    pub fn wait_readable(&self, end: u64) -> WaitFor<'_> {
        WaitFor {
            inner: &self.inner,
            target: end,
            durable: false,
        }
    }

    /// Waits until an fdatasync covers everything below `end`.
    pub fn wait_durable(&self, end: u64) -> WaitFor<'_> {
        WaitFor {
            inner: &self.inner,
            target: end,
            durable: true,
        }
    }

    /// Waits as the flush mode says an append is acknowledged.
    pub fn wait_acked(&self, end: u64) -> WaitFor<'_> {
        match self.inner.cfg.flush {
            FlushMode::Async => self.wait_readable(end),
            FlushMode::Sync => self.wait_durable(end),
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

    /// Reads `len` bytes at `offset` (within one segment, below the readable end).
    pub async fn read(&self, offset: u64, len: usize) -> Result<ReadBuf, LogError> {
        let (file, pos) = self.file_for(offset, len as u64)?;
        if let Some(bytes) = self.inner.tail.borrow().get(offset, len) {
            return Ok(ReadBuf::Plain(bytes.to_vec()));
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

    /// Reads the record at `offset` without knowing its size (message by id).
    pub async fn read_record_at(&self, offset: u64) -> Result<ReadBuf, LogError> {
        let head = self.read(offset, HEADER_BYTES).await?;
        let (len, magic) = peek_frame(&head).unwrap_or((0, 0));
        if magic != RECORD_MAGIC_V1
            || (len as usize) < HEADER_BYTES
            || len as usize > RECORD_BYTES_MAX
        {
            return Err(LogError::InvalidRecord(RecordError::BadMagic {
                found: magic,
                expected: RECORD_MAGIC_V1,
            }));
        }
        self.read_record(offset, len).await
    }

    fn check_record(&self, bytes: &[u8], offset: u64) -> Result<(), LogError> {
        let view = RecordView::parse(bytes)?;
        if view.physical_offset() != offset || view.total_len() as usize != bytes.len() {
            return Err(LogError::InvalidRecord(RecordError::Invalid(
                "record at this offset has another physical offset or size",
            )));
        }
        Ok(())
    }

    /// Deletes segments older than the retention age, or beyond the size limit, oldest
    /// first; never the active one. Deletion runs off the shard's thread; readers of a
    /// deleted range get `OffsetTooSmall` at once. Returns the new minimum offset.
    pub async fn apply_retention(&self, now_ms: i64) -> u64 {
        let cfg = &self.inner.cfg;
        let mut doomed = Vec::new();
        {
            let mut st = self.inner.st.borrow_mut();
            let active = st.active_base;
            let total: u64 = st.write_pos - st.min_offset;
            let mut remaining_bytes = total;
            let candidates: Vec<(u64, PathBuf)> = st
                .segments
                .values()
                .filter(|s| s.base < active && s.base + cfg.segment_bytes <= self.readable_end())
                .map(|s| (s.base, s.path.clone()))
                .collect();
            for (base, path) in candidates {
                let too_big =
                    cfg.retention_bytes_max > 0 && remaining_bytes > cfg.retention_bytes_max;
                let age_ms = std::fs::metadata(&path)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map(|d| now_ms - d.as_millis() as i64)
                    .unwrap_or(0);
                let too_old = age_ms > cfg.retention_ms as i64;
                if !(too_big || too_old) {
                    break;
                }
                st.segments.remove(&base);
                st.min_offset = base + cfg.segment_bytes;
                remaining_bytes = remaining_bytes.saturating_sub(cfg.segment_bytes);
                doomed.push(path);
            }
        }
        if !doomed.is_empty() {
            crate::io::blocking(move || {
                for p in doomed {
                    if let Err(e) = std::fs::remove_file(&p) {
                        eprintln!("ringmq: retention could not delete {}: {e}", p.display());
                    }
                }
            })
            .await;
        }
        self.min_offset()
    }

    /// Writes everything pending, fdatasyncs, and refuses further appends.
    pub async fn close(&self) -> Result<u64, LogError> {
        let end = self.write_offset();
        self.wait_readable(end).await?;
        self.sync_all().await?;
        self.inner.st.borrow_mut().closed = true;
        self.inner.flusher_stop.set(true);
        Ok(end)
    }

    /// fdatasyncs every file written since the last sync and advances the durable end.
    pub async fn sync_all(&self) -> Result<(), LogError> {
        sync_unsynced(&self.inner).await
    }
}

/// A wait for a watermark; fails if the log is poisoned meanwhile.
pub struct WaitFor<'a> {
    inner: &'a Inner,
    target: u64,
    durable: bool,
}

impl Future for WaitFor<'_> {
    type Output = Result<(), LogError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mark = if self.durable {
            &self.inner.durable
        } else {
            &self.inner.readable
        };
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

fn poison(inner: &Inner, reason: String) {
    eprintln!(
        "ringmq: commit log {} poisoned: {reason}",
        inner.dir.display()
    );
    inner.st.borrow_mut().poisoned = Some(reason);
    inner.readable.wake_all();
    inner.durable.wake_all();
}

async fn ensure_file(inner: &Inner, seg_base: u64) -> Result<Rc<LogFile>, LogError> {
    let (existing, path) = {
        let st = inner.st.borrow();
        match st.segments.get(&seg_base) {
            Some(s) => (s.file.clone(), s.path.clone()),
            None => (None, inner.dir.join(segment_name(seg_base))),
        }
    };
    if let Some(f) = existing {
        return Ok(f);
    }
    let file = LogFile::open(&path, true).await?;
    if inner.cfg.preallocate {
        file.preallocate(inner.cfg.segment_bytes).await?;
    }
    // The new file's directory entry must be durable before any record in it is.
    let dir = inner.dir.clone();
    crate::io::blocking(move || std::fs::File::open(&dir).and_then(|d| d.sync_all())).await?;
    let file = Rc::new(file);
    if let Some(s) = inner.st.borrow_mut().segments.get_mut(&seg_base) {
        s.file = Some(file.clone());
    }
    Ok(file)
}

/// How many extra times the writer yields while appends keep joining a batch.
const BATCH_SETTLE_YIELDS_MAX: usize = 4;

/// In sync mode, bytes of a segment written with zeros ahead of the data. Overwriting
/// initialized blocks lets fdatasync skip the metadata journal commit that extending a file
/// (or converting unwritten extents) needs: on ext4 that is the difference between a ~50 µs
/// and a ~800 µs fdatasync.
const PREZERO_BYTES: u64 = 8 << 20;

/// Writes zeros ahead of `need` (a file position) if the initialized region ends before it.
async fn prezero(inner: &Inner, seg_base: u64, file: &LogFile, need: u64) -> Result<(), LogError> {
    let zeroed_to = inner
        .st
        .borrow()
        .segments
        .get(&seg_base)
        .map(|s| s.zeroed_to)
        .unwrap_or(0);
    if need <= zeroed_to {
        return Ok(());
    }
    let seg_bytes = inner.cfg.segment_bytes;
    let target = (need + PREZERO_BYTES).min(seg_bytes);
    let mut pos = align_down(zeroed_to.max(need.saturating_sub(1)));
    // Never overwrite data: start at the block after the chunk being written.
    pos = pos.max(align_up(need as usize) as u64);
    const ZERO_WRITE_BYTES: u64 = 1 << 20;
    while pos < target {
        let len = (target - pos).min(ZERO_WRITE_BYTES);
        let buf = file.alloc(align_up(len as usize));
        file.write_at(buf, pos).await?;
        pos += len;
    }
    file.fdatasync().await?;
    if let Some(s) = inner.st.borrow_mut().segments.get_mut(&seg_base) {
        s.zeroed_to = target;
    }
    Ok(())
}

/// The single writer task of a log: takes everything appended so far, writes it with one
/// aligned write per segment, syncs in sync mode, and wakes the waiters. Runs while there is
/// work; an append restarts it.
async fn writer(weak: std::rc::Weak<Inner>) {
    loop {
        // Let every append of this tick join the batch. Appenders woken by the previous
        // acknowledgement may still be queued behind this task: yield again while the batch
        // keeps growing, a bounded number of times.
        crate::io::yield_now().await;
        for _ in 0..BATCH_SETTLE_YIELDS_MAX {
            let before = match weak.upgrade() {
                Some(inner) => inner.st.borrow().write_pos,
                None => return,
            };
            crate::io::yield_now().await;
            match weak.upgrade() {
                Some(inner) if inner.st.borrow().write_pos != before => continue,
                _ => break,
            }
        }
        let Some(inner) = weak.upgrade() else { return };
        let (chunks, end) = {
            let mut st = inner.st.borrow_mut();
            if st.poisoned.is_some() {
                st.writer_running = false;
                return;
            }
            let mut chunks = std::mem::take(&mut st.sealed);
            let active = &mut st.active;
            let written_to = active.start + active.bytes.len() as u64;
            if written_to > inner.readable.value.get() || !chunks.is_empty() {
                // Keep the partial last block: the next write rewrites it with more data.
                let keep_from = align_down(written_to);
                let keep = active.bytes[(keep_from - active.start) as usize..].to_vec();
                let taken = std::mem::replace(
                    active,
                    Chunk {
                        seg_base: active.seg_base,
                        start: keep_from,
                        bytes: keep,
                    },
                );
                if taken.start + taken.bytes.len() as u64 > inner.readable.value.get() {
                    chunks.push(taken);
                }
            }
            if chunks.is_empty() {
                st.writer_running = false;
                return;
            }
            (chunks, written_to)
        };
        let mut touched: Vec<Rc<LogFile>> = Vec::new();
        for chunk in chunks {
            let file = match ensure_file(&inner, chunk.seg_base).await {
                Ok(f) => f,
                Err(e) => return poison(&inner, e.to_string()),
            };
            if inner.cfg.flush == FlushMode::Sync && inner.cfg.preallocate {
                let chunk_end = chunk.start - chunk.seg_base + align_up(chunk.bytes.len()) as u64;
                if let Err(e) = prezero(&inner, chunk.seg_base, &file, chunk_end).await {
                    return poison(&inner, e.to_string());
                }
            }
            let mut buf = file.alloc_filled_to(align_up(chunk.bytes.len()), chunk.bytes.len());
            buf.as_bytes_mut()[..chunk.bytes.len()].copy_from_slice(&chunk.bytes);
            if let Err(e) = file.write_at(buf, chunk.start - chunk.seg_base).await {
                return poison(&inner, e.to_string());
            }
            inner
                .tail
                .borrow_mut()
                .extend(chunk.start, &chunk.bytes, inner.cfg.tail_cache_bytes);
            if !touched.iter().any(|f| Rc::ptr_eq(f, &file)) {
                touched.push(file);
            }
        }
        if inner.cfg.flush == FlushMode::Sync {
            for f in &touched {
                if let Err(e) = f.fdatasync().await {
                    return poison(&inner, e.to_string());
                }
            }
            inner.readable.advance(end);
            inner.durable.advance(end);
        } else {
            {
                let mut st = inner.st.borrow_mut();
                for f in touched {
                    if !st.unsynced.iter().any(|u| Rc::ptr_eq(u, &f)) {
                        st.unsynced.push(f);
                    }
                }
            }
            inner.readable.advance(end);
        }
    }
}

async fn sync_unsynced(inner: &Inner) -> Result<(), LogError> {
    let target = inner.readable.value.get();
    let files = std::mem::take(&mut inner.st.borrow_mut().unsynced);
    for f in files {
        if let Err(e) = f.fdatasync().await {
            let reason = e.to_string();
            poison(inner, reason.clone());
            return Err(LogError::Poisoned { reason });
        }
    }
    if target > inner.durable.value.get() {
        inner.durable.advance(target);
    }
    Ok(())
}

/// Background fdatasync in async flush mode.
async fn flusher(weak: std::rc::Weak<Inner>) {
    let interval = match weak.upgrade() {
        Some(i) => Duration::from_millis(i.cfg.flush_interval_ms.max(1)),
        None => return,
    };
    loop {
        crate::io::sleep(interval).await;
        let Some(inner) = weak.upgrade() else { return };
        if inner.flusher_stop.get() || inner.st.borrow().poisoned.is_some() {
            return;
        }
        if inner.durable.value.get() < inner.readable.value.get() {
            let _ = sync_unsynced(&inner).await;
        }
    }
}

fn list_segments(dir: &Path) -> Result<Vec<u64>, LogError> {
    let layout = |reason: String| LogError::Layout {
        path: dir.to_owned(),
        reason,
    };
    let mut bases = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| layout(format!("read_dir: {e}")))? {
        let entry = entry.map_err(|e| layout(format!("read_dir: {e}")))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()) {
            let base: u64 = name
                .parse()
                .map_err(|_| layout(format!("bad segment name {name}")))?;
            bases.push(base);
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

/// How a scan of one segment ended.
enum SegmentEnd {
    /// A blank filler or zeros: the segment is complete.
    Sealed,
    /// Data ended before the segment's end (the last segment's tail), at this position.
    Open(u64),
}

/// The open file of a segment found on disk at start-up.
fn opened(segments: &BTreeMap<u64, Segment>, base: u64) -> Result<Rc<LogFile>, LogError> {
    segments
        .get(&base)
        .and_then(|s| s.file.clone())
        .ok_or_else(|| LogError::Layout {
            path: PathBuf::from(segment_name(base)),
            reason: "segment was not opened".into(),
        })
}

/// Verifies the tail of the log, dispatches records from `dispatch_from`, truncates a torn
/// tail and refuses rot. Returns (end offset, bytes of the partial last block, active base).
async fn recover(
    cfg: &LogConfig,
    segments: &mut BTreeMap<u64, Segment>,
    dispatch_from: u64,
    dispatch: &mut impl FnMut(RecordView<'_>),
    report: &mut RecoveryReport,
) -> Result<(u64, Vec<u8>, u64), LogError> {
    let bases: Vec<u64> = segments.keys().copied().collect();
    for pair in bases.windows(2) {
        if pair[1] != pair[0] + cfg.segment_bytes {
            return Err(LogError::Layout {
                path: segments[&pair[0]].path.clone(),
                reason: format!(
                    "segment {} is not followed by {} (segment_bytes {}); was segment_bytes changed?",
                    segment_name(pair[0]),
                    segment_name(pair[0] + cfg.segment_bytes),
                    cfg.segment_bytes
                ),
            });
        }
    }
    let n = bases.len();
    let verify_from_idx = if cfg.verify_segments_on_start == 0 {
        0
    } else {
        n.saturating_sub(cfg.verify_segments_on_start as usize)
    };
    let dispatch_idx = bases.iter().rposition(|&b| b <= dispatch_from).unwrap_or(0);
    let first = verify_from_idx.min(dispatch_idx);
    let mut end = bases[first];
    let mut last_idx = first;
    for idx in first..n {
        let base = bases[idx];
        last_idx = idx;
        let file = opened(segments, base)?;
        let path = segments[&base].path.clone();
        match scan_segment(cfg, &file, &path, base, dispatch_from, dispatch, report).await? {
            SegmentEnd::Sealed => {
                end = base + cfg.segment_bytes;
            }
            SegmentEnd::Open(pos) => {
                end = base + pos;
                // Anything in later segments means this was not the tail: rot.
                for &later in &bases[idx + 1..] {
                    let lf = opened(segments, later)?;
                    let head = lf.read_at(0, IO_ALIGN).await?;
                    if head.iter().any(|&b| b != 0) {
                        return Err(LogError::Corrupt {
                            path,
                            file_offset: pos,
                            log_offset: base + pos,
                            reason: format!(
                                "the segment ends early but a later segment {} holds data",
                                segment_name(later)
                            ),
                        });
                    }
                }
                break;
            }
        }
    }
    // Drop empty segments after the end (created but never written).
    let later: Vec<u64> = bases[last_idx + 1..].to_vec();
    for b in later {
        if let Some(seg) = segments.remove(&b) {
            std::fs::remove_file(&seg.path).map_err(|e| LogError::Layout {
                path: seg.path.clone(),
                reason: format!("remove empty segment: {e}"),
            })?;
        }
    }
    let last_base = bases[last_idx];
    if end == last_base + cfg.segment_bytes {
        // The last segment is full: the next append starts a new one.
        return Ok((end, Vec::new(), end));
    }
    let file = opened(segments, last_base)?;
    let pos = end - last_base;
    let size = file.size().await?;
    if size > pos {
        // Cut the torn tail so that stale bytes can never be mistaken for records later.
        report.truncated_bytes += tail_nonzero_bytes(&file, pos, size).await?;
        file.truncate(pos).await?;
        if cfg.preallocate {
            file.preallocate(cfg.segment_bytes).await?;
        }
        file.fdatasync().await?;
    }
    let block = align_down(pos);
    let tail = file.read_at(block, (pos - block) as usize).await?;
    if tail.len() as u64 != pos - block {
        return Err(LogError::Corrupt {
            path: file.path().to_owned(),
            file_offset: block,
            log_offset: last_base + block,
            reason: "short read of the last block".into(),
        });
    }
    Ok((end, tail.to_vec(), last_base))
}

async fn tail_nonzero_bytes(file: &LogFile, from: u64, size: u64) -> Result<u64, LogError> {
    // Counts bytes up to the last non-zero byte (what was really cut), reading in chunks.
    let mut last_nonzero = from;
    let mut pos = from;
    while pos < size {
        let len = ((size - pos) as usize).min(1 << 20);
        let buf = file.read_at(pos, len).await?;
        if buf.is_empty() {
            break;
        }
        if let Some(i) = buf.iter().rposition(|&b| b != 0) {
            last_nonzero = pos + i as u64 + 1;
        }
        pos += buf.len() as u64;
    }
    Ok(last_nonzero - from)
}

/// Scans one segment from its start: verifies each record, dispatches, and tells a torn
/// tail from rot.
async fn scan_segment(
    cfg: &LogConfig,
    file: &LogFile,
    path: &Path,
    base: u64,
    dispatch_from: u64,
    dispatch: &mut impl FnMut(RecordView<'_>),
    report: &mut RecoveryReport,
) -> Result<SegmentEnd, LogError> {
    let seg_bytes = cfg.segment_bytes;
    let file_size = file.size().await?.min(seg_bytes);
    let mut pos: u64 = 0;
    while pos < file_size {
        let chunk_len = ((file_size - pos) as usize).min(cfg.read_chunk_bytes);
        let chunk = file.read_at(pos, chunk_len).await?;
        let chunk_full = chunk.len() == chunk_len;
        let mut at = 0usize;
        loop {
            let rest = &chunk[at..];
            let abs = base + pos + at as u64;
            let in_seg = pos + at as u64;
            if seg_bytes - in_seg < 8 {
                // Too small for anything: the end of a sealed segment.
                return Ok(SegmentEnd::Sealed);
            }
            let Some((len, magic)) = peek_frame(rest) else {
                break;
            };
            if magic == BLANK_MAGIC {
                if in_seg + len as u64 == seg_bytes {
                    return Ok(SegmentEnd::Sealed);
                }
                return torn_or_rot(
                    file,
                    path,
                    base,
                    in_seg,
                    file_size,
                    "bad blank filler length",
                )
                .await;
            }
            if len == 0 && magic == 0 {
                return torn_or_rot(file, path, base, in_seg, file_size, "zeros").await;
            }
            match RecordView::parse(rest) {
                Ok(view) => {
                    if view.physical_offset() != abs {
                        return torn_or_rot(
                            file,
                            path,
                            base,
                            in_seg,
                            file_size,
                            "record names another physical offset",
                        )
                        .await;
                    }
                    report.records_verified += 1;
                    report.bytes_verified += view.total_len() as u64;
                    if abs >= dispatch_from {
                        dispatch(view);
                    }
                    at += view.total_len() as usize;
                }
                Err(RecordError::Truncated { .. })
                    if chunk_full && pos + (chunk.len() as u64) < file_size =>
                {
                    // The record continues in the next chunk.
                    break;
                }
                Err(e) => {
                    return torn_or_rot(file, path, base, in_seg, file_size, &e.to_string()).await;
                }
            }
        }
        if at == 0 {
            // Nothing parsed in a whole chunk that is not the end: impossible with
            // read_chunk_bytes > RECORD_BYTES_MAX, so this is a short read.
            return torn_or_rot(file, path, base, pos, file_size, "short read").await;
        }
        pos += at as u64;
    }
    if pos >= seg_bytes {
        Ok(SegmentEnd::Sealed)
    } else {
        Ok(SegmentEnd::Open(pos))
    }
}

/// A record failed at `pos`. If a valid record can be found anywhere after it in this
/// segment, the log is corrupt in the middle: refuse. Otherwise it is a torn tail.
async fn torn_or_rot(
    file: &LogFile,
    path: &Path,
    base: u64,
    pos: u64,
    file_size: u64,
    reason: &str,
) -> Result<SegmentEnd, LogError> {
    let magic = RECORD_MAGIC_V1.to_le_bytes();
    let mut scan = pos + 1;
    let window = 8usize << 20;
    while scan + (HEADER_BYTES as u64) <= file_size {
        let len = ((file_size - scan) as usize).min(window + RECORD_BYTES_MAX);
        let buf = file.read_at(scan, len).await?;
        let limit = buf.len().min(window);
        let mut i = 0usize;
        while i + 8 <= limit {
            // A record's magic sits 4 bytes into it.
            if buf[i + 4..i + 8] == magic {
                if let Ok(view) = RecordView::parse(&buf[i..]) {
                    let at = scan + i as u64;
                    if view.physical_offset() == base + at {
                        return Err(LogError::Corrupt {
                            path: path.to_owned(),
                            file_offset: pos,
                            log_offset: base + pos,
                            reason: format!(
                                "{reason}; a valid record follows at file offset {at}, so this is not a torn tail"
                            ),
                        });
                    }
                }
            }
            i += 1;
        }
        if limit == 0 {
            break;
        }
        scan += limit as u64;
    }
    Ok(SegmentEnd::Open(pos))
}

#[cfg(test)]
mod tail_cache_tests {
    use super::TailCache;

    /// Writes of `sizes` bytes one after another (byte i of the log is `i as u8`); every
    /// range is then either served with the right bytes or missed, and the newest bytes
    /// are always served.
    fn check(cap: usize, sizes: &[usize]) {
        let mut cache = TailCache::default();
        let mut pos = 0u64;
        for &n in sizes {
            let bytes: Vec<u8> = (pos..pos + n as u64).map(|i| i as u8).collect();
            cache.extend(pos, &bytes, cap);
            pos += n as u64;
            let newest = n.min(cap / 2).max(1).min(n);
            if newest > 0 {
                let got = cache.get(pos - newest as u64, newest);
                assert!(
                    got.is_some(),
                    "the newest {newest} bytes are cached (cap {cap})"
                );
            }
        }
        for offset in 0..pos {
            for len in [1usize, 7, 64] {
                if let Some(got) = cache.get(offset, len) {
                    let want: Vec<u8> = (offset..offset + len as u64).map(|i| i as u8).collect();
                    assert_eq!(got, &want[..], "at {offset} len {len}");
                }
            }
        }
        assert!(cache.get(pos, 1).is_none(), "nothing past the end");
        let held = cache.older.bytes.len() + cache.newer.bytes.len();
        assert!(
            held <= cap + sizes.iter().max().copied().unwrap_or(0),
            "{held} bytes held"
        );
    }

    #[test]
    fn serves_recent_bytes_and_never_wrong_ones() {
        check(256, &[10; 100]);
        check(256, &[100, 3, 200, 1, 57, 300, 5]);
        check(1, &[4, 4, 4]);
        check(1000, &[10; 20]);
    }

    #[test]
    fn a_repeated_partial_block_and_a_jump_are_handled() {
        let mut cache = TailCache::default();
        cache.extend(0, &[1, 2, 3, 4], 64);
        // The partial last block is written again with more after it.
        cache.extend(2, &[3, 4, 5, 6], 64);
        assert_eq!(cache.get(0, 6), Some(&[1, 2, 3, 4, 5, 6][..]));
        // A write elsewhere (a new segment after a gap) starts over.
        cache.extend(100, &[9, 9], 64);
        assert_eq!(cache.get(0, 1), None);
        assert_eq!(cache.get(100, 2), Some(&[9, 9][..]));
    }
}
