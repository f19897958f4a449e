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

mod append;
mod read;
mod recovery;
mod retention;
mod tail_cache;
mod wait;
mod writer;

use recovery::*;
use tail_cache::TailCache;
pub use wait::WaitFor;
use wait::{Watermark, CUTS_KEPT};
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

/// Default of [`LogConfig::async_prezero_rate_max`]: 64 MiB a second.
pub const ASYNC_PREZERO_RATE_MAX_DEFAULT: u64 = 64 << 20;

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
    /// Async mode (with `preallocate`) zeroes segment files in the background ahead of the
    /// writer while the log writes fewer bytes a second than this (0: never): a write into
    /// zeroed blocks is a plain overwrite, where a write into the preallocated (unwritten)
    /// blocks went through an io_uring worker and an extent conversion. Faster logs write
    /// straight into the preallocated blocks (the zeros would take the disk's bandwidth).
    pub async_prezero_rate_max: u64,
}

/// [`LogConfig::tail_cache_bytes`] by default.
pub const TAIL_CACHE_BYTES_DEFAULT: usize = 64 << 20;

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
            tail_cache_bytes: TAIL_CACHE_BYTES_DEFAULT,
            known_durable: u64::MAX,
            async_prezero_rate_max: ASYNC_PREZERO_RATE_MAX_DEFAULT,
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
    /// The log was cut (a full disk, no file descriptor left for a new segment) or the
    /// disk is below the broker's free-space floor; `reason` says which.
    #[error("{reason}; nothing of this write was stored")]
    DiskFull { reason: String },
    /// Too many cuts (full disks) since the record was appended to know whether one
    /// dropped it.
    #[error("{reason}; more cuts were made since this write than are remembered: it may be stored or not")]
    CutUnknown { reason: String },
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
    /// Sync mode: file bytes known to be initialized (written), for the pre-zeroing. Async
    /// mode: below this no zeros will be written (the writer never waits there).
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
    /// Set when a write found the disk full (or no file descriptor left): appends are
    /// refused with `DiskFull` until [`CommitLog::space_returned`] clears it.
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
    /// Segments retention took out of the log whose files could not be deleted yet, oldest
    /// first: its next pass deletes them first.
    undeleted: Vec<PathBuf>,
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

struct Inner {
    tail: RefCell<TailCache>,
    dir: PathBuf,
    /// `dir` kept open: a roll syncs it without taking a descriptor (the new segment's is
    /// the only one a roll needs).
    dir_handle: std::sync::Arc<std::fs::File>,
    cfg: LogConfig,
    st: RefCell<State>,
    readable: Watermark,
    durable: Watermark,
    /// Wakes the background flusher early (close).
    flusher_stop: Cell<bool>,
    /// A background pre-zeroing, or the removal of files past a cut, ended.
    zeroed: tokio::sync::Notify,
    /// Held by the sync pass under way (async mode): a pass finds the files written since
    /// the last one, fdatasyncs them, then advances the durable end to where the log was
    /// readable when it began. A second pass beginning meanwhile would find no files (the
    /// first took them) and advance the durable end over data whose fdatasync has not
    /// completed: it waits its turn.
    sync_turn: tokio::sync::Mutex<()>,
    /// Async mode's measure of how fast the log writes: (when, log offset) at the start of
    /// the current window, and whether the last window was slow enough to zero ahead.
    rate_mark: Cell<(std::time::Instant, u64)>,
    writes_slowly: Cell<bool>,
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
        if cfg.segment_bytes < 2 * IO_ALIGN as u64
            || !cfg.segment_bytes.is_multiple_of(IO_ALIGN as u64)
        {
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
        // Segment files missing at the end (every one of them, or the directory, when a
        // checkpoint found bytes durable): the log cannot reach what the checkpoint found
        // durable. Taken as a torn tail, the indexes would be cut to what is left and
        // queue offsets given again to new messages; a directory moved or a disk not
        // mounted is more likely. (Not made first: a directory made here would be in the
        // way of the one moved back.)
        let missing = |reach: u64, files: usize| {
            LogError::Layout {
            path: dir.to_owned(),
            reason: format!(
                "segment files are missing: the log's {files} segment(s) reach log offset {reach} (at --segment-bytes {}: was it changed?), but the checkpoint found it durable up to {} (a directory moved, or a disk not mounted?). Put the files back; or, to start with what is left and lose every message past {reach}, remove the file named checkpoint in the store's directory",
                cfg.segment_bytes, cfg.known_durable
            ),
        }
        };
        let durable_somewhere = cfg.known_durable != u64::MAX && cfg.known_durable > 0;
        if durable_somewhere && !dir.exists() {
            return Err(missing(0, 0));
        }
        std::fs::create_dir_all(dir).map_err(|e| LogError::Layout {
            path: dir.to_owned(),
            reason: format!("create: {e}"),
        })?;
        let bases = list_segments(dir)?;
        // Segments not spaced by the segment size are refused by the recovery, which says
        // so (a changed --segment-bytes).
        let spaced = bases.windows(2).all(|p| p[1] == p[0] + cfg.segment_bytes);
        let reach = bases.last().map_or(0, |b| b + cfg.segment_bytes);
        if durable_somewhere && spaced && reach < cfg.known_durable {
            return Err(missing(reach, bases.len()));
        }
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
        // The log is called durable to its end from here on (a checkpoint records that),
        // but the bytes past the last run's known durable point may still be only in the
        // page cache (written, not synced, when it stopped): synced now, every segment
        // holding some, however the run before wrote them.
        let unsure_from = end.min(cfg.known_durable);
        for seg in segments.values() {
            if seg.base + cfg.segment_bytes > unsure_from && seg.base < end {
                if let Some(file) = &seg.file {
                    file.fdatasync().await?;
                }
            }
        }
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
            undeleted: Vec::new(),
            closed: false,
            chunk_cap: CHUNK_CAP_MIN,
        };
        debug_assert_eq!(st.active.bytes.len() as u64, end - start);
        let dir_handle = {
            let dir = dir.to_owned();
            crate::io::blocking(move || crate::io::open_dir(&dir)).await?
        };
        let inner = Rc::new(Inner {
            tail: RefCell::new(TailCache::default()),
            dir: dir.to_owned(),
            dir_handle: std::sync::Arc::new(dir_handle),
            cfg,
            st: RefCell::new(st),
            readable: Watermark::default(),
            durable: Watermark::default(),
            flusher_stop: Cell::new(false),
            zeroed: tokio::sync::Notify::new(),
            sync_turn: tokio::sync::Mutex::new(()),
            rate_mark: Cell::new((std::time::Instant::now(), end)),
            writes_slowly: Cell::new(true),
            stats: Default::default(),
        });
        inner.readable.value.set(end);
        inner.durable.value.set(end);
        let log = CommitLog { inner };
        // Create (or open) the segment appends go to now rather than in the first append's
        // write: creating and preallocating a segment and syncing its directory take
        // milliseconds. A failure here (a full disk) is left to that write, which reports
        // it to the appends as it would have.
        let _ = writer::ensure_file(&log.inner, active_base).await;
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
                "ringmq: commit log {}: the disk has room, taking writes again",
                self.inner.dir.display()
            );
        }
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

    /// Makes the log durable up to `end` (readable already) now, not at the flusher's next
    /// pass (async mode; in sync mode it is once readable): a pass of [`Self::sync_all`]
    /// unless one that ended while this waited its turn covered `end`, so that many
    /// callers at once share passes.
    pub async fn sync_to(&self, end: u64) -> Result<(), LogError> {
        sync_unsynced_to(&self.inner, Some(end)).await
    }
}
