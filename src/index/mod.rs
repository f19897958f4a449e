//! Indexes over the commit log: the per-(topic, queue) consume queues, the key index and the
//! tag hash stored in consume-queue entries.
//!
//! Owns: the on-disk formats and files under `<data>/consumequeue/<topic>/<queue_id>/`
//! ([`ConsumeQueue`]) and `<data>/index/` ([`KeyIndex`]), their recovery on open, their
//! truncation after the log's recovery and their retention.
//!
//! Architecture invariant: indexes are derived data. Everything here can be rebuilt from the
//! commit log, so this module never decides what is durable: after a crash the store
//! truncates an index to the recovered log and replays the log into it, and both operations
//! are idempotent. The module does no network I/O, knows nothing of consumers, groups or
//! offsets committed by them, and is synchronous and runtime-free (memory-mapped files,
//! called from one single-threaded shard).

mod consume_queue;
mod dirty;
mod key_index;
mod spare;
mod tag;
pub mod timing_wheel;

use std::path::{Path, PathBuf};

pub use consume_queue::{ConsumeQueue, ConsumeQueueConfig, CqEntry, CQ_ENTRY_BYTES};
pub use dirty::{is_writeback_failure, testing_fail_syncs_under, DirtyFile, WritebackFailed};
pub use key_index::{KeyIndex, KeyIndexConfig, KeyWalk, KeysSynced};
pub use spare::{MadeSpare, SpareFile, Spares};
pub use tag::{tag_hash, TAG_HASH_NONE};
pub use timing_wheel::TimingWheel;

/// The one error type of the index layer.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("index I/O: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt index file {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("consume queue hole: put at {offset}, max is {max}")]
    Hole { offset: u64, max: u64 },
    #[error("disk full: cannot allocate index space in {path}")]
    DiskFull { path: PathBuf },
}

/// A stretch of a mapped index file to allocate ahead of its appends, away from the thread
/// that appends ([`ConsumeQueue::allocate_ahead`]): `allocate` it (it blocks on the file
/// system), then report how it went to the index it came from.
#[derive(Debug)]
pub struct AllocAhead {
    pub path: PathBuf,
    /// The numbered name of a file still at a spare's name (`path`) when asked for: the
    /// checkpoint may name it and remove the spare's name meanwhile.
    named: Option<PathBuf>,
    /// The [`Backing`] it was asked for: a file mapped again (or another file made at the
    /// same path) has another, and ignores the result.
    backing: u64,
    from: u64,
    to: u64,
}

impl AllocAhead {
    /// Allocates the stretch (opens the file, `fallocate`, closes it). Blocks.
    pub fn allocate(&self) -> Result<(), IndexError> {
        match (fallocate_range(&self.path, self.from, self.to), &self.named) {
            (Err(IndexError::Io { source, .. }), Some(named))
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                fallocate_range(named, self.from, self.to)
            }
            (allocated, _) => allocated,
        }
        .map(|_| ())
    }
}

/// Allocates `[from, to)` of the file at `path` (mode 0: blocks only, the size stays).
/// `Ok(false)`: a file system without `fallocate`, where nothing better can be done.
fn fallocate_range(path: &Path, from: u64, to: u64) -> Result<bool, IndexError> {
    use std::os::fd::AsRawFd;
    let (file, _) = open_existing(path)?;
    // SAFETY: fallocate on a descriptor owned here, with a range inside the file: it only
    // allocates blocks (mode 0 keeps the size, which is already the file's length).
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            0,
            from as libc::off_t,
            (to - from) as libc::off_t,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Err(IndexError::DiskFull {
            path: path.to_owned(),
        }),
        Some(libc::EOPNOTSUPP) => Ok(false),
        _ => Err(io_err("fallocate", path)(e)),
    }
}

/// A mapped index file's disk blocks, allocated for real (`fallocate`) ahead of the stores
/// into the mapping: a store into a hole of a sparse file on a full disk raises SIGBUS and
/// kills the process, a failed `fallocate` is an error the caller can answer.
///
/// Holds no descriptor: a mapping stays valid once its file is closed, and the file is
/// opened again only to allocate the next chunk (tens of thousands of queues would
/// otherwise hold as many descriptors).
pub(crate) struct Backing {
    len: u64,
    /// Bytes from the start known to be allocated (or written).
    allocated_to: u64,
    /// Tells this backing apart from any other (an [`AllocAhead`]'s result is for one).
    id: u64,
    /// An [`AllocAhead`] is out for this file.
    ahead_out: bool,
}

impl Backing {
    /// A file just created: nothing allocated yet.
    fn new(len: u64) -> Backing {
        Backing::reopened(len, 0)
    }

    /// A file opened again, whose first `allocated_to` bytes are known to be allocated.
    fn reopened(len: u64, allocated_to: u64) -> Backing {
        Backing {
            len,
            allocated_to,
            id: next_serial(),
            ahead_out: false,
        }
    }

    /// The next chunk past what is allocated, for the caller to allocate off its thread:
    /// chunks double from one page up to `step`, as appends' own do ([`ensure`]), so a
    /// file's growth is all ahead once its first page is there. Asked once appends (up to
    /// `next_end`) come within a step of the end (within half a chunk while the file grows:
    /// a queue of a few messages keeps one page); `None` while one is out, before the
    /// first page, or when the file is allocated to its end.
    ///
    /// [`ensure`]: Self::ensure
    fn ahead(
        &mut self,
        next_end: u64,
        step: u64,
        path: &Path,
        named: Option<&Path>,
    ) -> Option<AllocAhead> {
        let chunk = self.chunk(step);
        let margin = if chunk >= step { chunk } else { chunk / 2 };
        if self.ahead_out
            || self.allocated_to < ALLOC_ALIGN
            || self.allocated_to >= self.len
            || self.allocated_to.saturating_sub(next_end) >= margin
        {
            return None;
        }
        self.ahead_out = true;
        Some(AllocAhead {
            path: path.to_owned(),
            backing: self.id,
            from: self.allocated_to,
            to: self.allocated_to.saturating_add(chunk).min(self.len),
            named: named.map(Path::to_path_buf),
        })
    }

    /// Takes the result of an [`AllocAhead`] of this backing (others are ignored): what it
    /// allocated joins what is known allocated when the two touch.
    fn ahead_done(&mut self, ahead: &AllocAhead, allocated: bool) {
        if ahead.backing != self.id {
            return;
        }
        self.ahead_out = false;
        if allocated && self.allocated_to >= ahead.from {
            self.allocated_to = self.allocated_to.max(ahead.to);
        }
    }

    pub(crate) fn allocated_to(&self) -> u64 {
        self.allocated_to
    }

    /// Allocates `[0, end)` if not yet done.
    fn ensure_prefix(&mut self, end: u64, path: &Path) -> Result<(), IndexError> {
        if self.allocated_to >= end {
            return Ok(());
        }
        self.allocated_to = 0;
        let step = end;
        // From 0: `ensure` starts at what is allocated, which is nothing.
        self.ensure_from(0, end, step, path)
    }

    /// Makes sure the bytes below `end` are allocated, in chunks that double from one page
    /// up to `step` (then one call per `step` bytes of appends; a no-op where blocks exist
    /// already). Blocks before the first position asked for on a reopened file were
    /// written before, so they exist.
    /// The size of the next allocation: it grows with the file (doubling from one page) up
    /// to `step`, so a queue with one message holds one page.
    fn chunk(&self, step: u64) -> u64 {
        self.allocated_to.clamp(ALLOC_ALIGN, step.max(ALLOC_ALIGN))
    }

    fn ensure(&mut self, end: u64, step: u64, path: &Path) -> Result<(), IndexError> {
        if end <= self.allocated_to {
            return Ok(());
        }
        let from = self
            .allocated_to
            .max(end.saturating_sub(1) & !(ALLOC_ALIGN - 1));
        self.ensure_from(from, end, step, path)
    }

    fn ensure_from(
        &mut self,
        from: u64,
        end: u64,
        step: u64,
        path: &Path,
    ) -> Result<(), IndexError> {
        let to = from.saturating_add(self.chunk(step)).max(end).min(self.len);
        if to <= from {
            return Ok(());
        }
        self.allocated_to = if fallocate_range(path, from, to)? {
            to
        } else {
            self.len // nothing better to do than the old way
        };
        Ok(())
    }
}

/// Allocation ranges start at a page boundary.
const ALLOC_ALIGN: u64 = 4096;

/// Builds the `map_err` closure of an I/O operation on `path`.
fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> IndexError {
    let path = path.to_path_buf();
    move |source| IndexError::Io { op, path, source }
}

/// The file name of a file numbered `number`: 20 zero-padded digits, so names sort like
/// numbers.
fn numbered_file_name(number: u64) -> String {
    format!("{number:020}")
}

/// The number of a file named by [`numbered_file_name`]; `None` for any other name.
fn parse_numbered_file_name(name: &std::ffi::OsStr) -> Option<u64> {
    let name = name.to_str()?;
    if name.len() != 20 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// A number no other call in this process returns: tells apart objects that may share a
/// name or a path over time (a backing, a consume-queue file, a queue).
fn next_serial() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Numbered files (number, path), sorted by number.
type NumberedFiles = Vec<(u64, PathBuf)>;

/// The numbered files in `dir`, sorted by number, and the paths of all other entries (the
/// callers remove spares among them and ignore the rest, so a stray file such as an editor
/// backup or a `lost+found` does not stop the broker).
fn list_files(dir: &Path) -> Result<(NumberedFiles, Vec<PathBuf>), IndexError> {
    let (mut files, mut others) = (Vec::new(), Vec::new());
    for dir_entry in std::fs::read_dir(dir).map_err(io_err("read_dir", dir))? {
        let dir_entry = dir_entry.map_err(io_err("read_dir", dir))?;
        match parse_numbered_file_name(&dir_entry.file_name()) {
            Some(number) => files.push((number, dir_entry.path())),
            None => others.push(dir_entry.path()),
        }
    }
    files.sort_unstable_by_key(|&(number, _)| number);
    Ok((files, others))
}

/// Little-endian field access on mapped bytes. The callers compute `at` from validated
/// sizes, so an out-of-range `at` is a programmer error and panics.
fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(field)
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(field)
}

fn read_i64(bytes: &[u8], at: usize) -> i64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    i64::from_le_bytes(field)
}

fn write_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn write_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn write_i64(bytes: &mut [u8], at: usize, value: i64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Creates `path` all zeros (sparse), `len_bytes` long, and maps it read-write (the
/// descriptor is closed on return). A leftover file of that name is emptied first: callers
/// create a file only for a position that holds nothing they keep.
fn create_mapped(path: &Path, len_bytes: u64) -> Result<(Backing, memmap2::MmapMut), IndexError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io_err("create", path))?;
    file.set_len(len_bytes).map_err(io_err("set_len", path))?;
    let mmap = map_file(&file, path)?;
    Ok((Backing::new(len_bytes), mmap))
}

/// Opens an existing `path` read-write; returns it with its length.
fn open_existing(path: &Path) -> Result<(std::fs::File, u64), IndexError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err("open", path))?;
    let len_bytes = file.metadata().map_err(io_err("stat", path))?.len();
    Ok((file, len_bytes))
}

fn map_file(file: &std::fs::File, path: &Path) -> Result<memmap2::MmapMut, IndexError> {
    // SAFETY: index files are private to this broker process, which opens each one through
    // exactly one index object, and they are never truncated while mapped (retention unmaps a
    // file before removing it). So no other party changes the bytes or the length under the
    // mapping, which is what makes handing out `&[u8]` over it sound.
    unsafe { memmap2::MmapMut::map_mut(file) }.map_err(io_err("mmap", path))
}

/// fsyncs directory `dir` (its entries: names made or removed).
fn sync_dir(dir: &Path) -> Result<(), IndexError> {
    crate::io::sync_dir(dir).map_err(io_err("fsync", dir))
}

pub(crate) fn remove_file(path: &Path) -> Result<(), IndexError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        // Already gone (a crash between unmapping and removing on a previous run): the goal
        // of the removal is reached.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_names_round_trip_and_sort() {
        assert_eq!(numbered_file_name(0), "00000000000000000000");
        assert_eq!(numbered_file_name(u64::MAX), "18446744073709551615");
        for number in [0, 1, 300_000, u64::MAX] {
            let name = numbered_file_name(number);
            assert_eq!(
                parse_numbered_file_name(std::ffi::OsStr::new(&name)),
                Some(number)
            );
        }
        for bad in [
            "",
            "0",
            "0000000000000000000a",
            "000000000000000000000",
            "99999999999999999999",
        ] {
            assert_eq!(
                parse_numbered_file_name(std::ffi::OsStr::new(bad)),
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn error_messages_name_the_file() {
        let e = IndexError::Corrupt {
            path: PathBuf::from("/d/f"),
            reason: "bad magic".into(),
        };
        assert_eq!(e.to_string(), "corrupt index file /d/f: bad magic");
        let e = io_err("open", Path::new("/d/g"))(std::io::Error::other("boom"));
        assert_eq!(e.to_string(), "index I/O: open /d/g: boom");
    }
}
