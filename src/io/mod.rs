//! The runtime seam: the only place outside `src/shard/` that names glommio. Files for the
//! commit log (O_DIRECT through io_uring, or buffered I/O where the filesystem refuses
//! O_DIRECT), task spawning, timers and yielding. Swapping the io_uring runtime means
//! rewriting this module and `src/shard/`, nothing else.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod error;
mod iopoll;
pub use error::{is_disk_full, is_out_of_descriptors};
use error::{with_context, OsError};
use iopoll::probe_iopoll_once;

/// An I/O operation that fault-injection tests can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPoint {
    Write,
    /// A write that finds the disk full (ENOSPC).
    WriteNoSpace,
    Fdatasync,
}

/// Replaces the file at `path` with `bytes` so that a crash leaves the old file or the new
/// one, never a mix: writes `<path>.tmp`, fsyncs it, renames it over `path`, fsyncs the
/// directory. Blocking (call it off a shard's thread, or at start-up). Errors name the
/// operation and the file.
pub fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let ctx = |op: &str, p: &Path, e: io::Error| with_context(e, op, p);
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut f = std::fs::File::create(&tmp).map_err(|e| ctx("create", &tmp, e))?;
    f.write_all(bytes).map_err(|e| ctx("write", &tmp, e))?;
    f.sync_all().map_err(|e| ctx("fsync", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| ctx("rename", path, e))?;
    sync_parent(path)
}

/// fsyncs directory `dir` (its entries: names made or removed). Blocking. Errors name the
/// directory.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    sync_open_dir(&open_dir(dir)?, dir)
}

/// Opens directory `dir` for [`sync_open_dir`]: a directory synced often (a log's, at each
/// roll) keeps its descriptor, so that its sync never needs one (none may be left).
/// Blocking.
pub fn open_dir(dir: &Path) -> io::Result<std::fs::File> {
    std::fs::File::open(dir).map_err(|e| with_context(e, "open", dir))
}

/// fsyncs `dir`, opened as `handle` by [`open_dir`]. Blocking.
pub fn sync_open_dir(handle: &std::fs::File, dir: &Path) -> io::Result<()> {
    handle.sync_all().map_err(|e| with_context(e, "fsync", dir))
}

/// fsyncs the directory holding `path` (its name made, replaced or removed). Blocking.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir),
        _ => sync_dir(Path::new(".")),
    }
}

thread_local! {
    static FAIL_NEXT: std::cell::Cell<Option<FailPoint>> = const { std::cell::Cell::new(None) };
    /// Occurrences of the armed point that pass before one fails.
    static FAIL_SKIP: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Fault injection: the next `point` on a [`LogFile`] of this thread fails with EIO. For tests
/// of the error paths (a failed write or fdatasync poisons the log); costs one thread-local
/// read per operation otherwise.
pub fn inject_failure(point: FailPoint) {
    inject_failure_after(point, 0);
}

/// Fault injection: `point` on a [`LogFile`] of this thread succeeds `skip` more times, then
/// fails once (for example the second write of a round, the first one into a new segment).
pub fn inject_failure_after(point: FailPoint, skip: u32) {
    FAIL_SKIP.with(|s| s.set(skip));
    FAIL_NEXT.with(|f| f.set(Some(point)));
}

/// Testing: every log write waits this long first (a slow disk), in µs; 0 (the default):
/// no wait.
static WRITE_DELAY_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Testing: makes every later [`LogFile::write_at`] of the process wait `d` first, as a
/// slow disk would (flow-control tests).
pub fn set_write_delay(d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    WRITE_DELAY_US.store(us, std::sync::atomic::Ordering::Relaxed);
}

fn injected(point: FailPoint, path: &Path) -> io::Result<()> {
    if FAIL_NEXT.with(|f| f.get()) == Some(point) {
        let skip = FAIL_SKIP.with(|s| s.get());
        if skip > 0 {
            FAIL_SKIP.with(|s| s.set(skip - 1));
            return Ok(());
        }
        FAIL_NEXT.with(|f| f.set(None));
        if point == FailPoint::WriteNoSpace {
            let e = io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(io::Error::new(
                e.kind(),
                format!("write {}: injected failure: {e}", path.display()),
            ));
        }
        return Err(io::Error::other(format!(
            "{point:?} {}: injected failure (EIO)",
            path.display()
        )));
    }
    Ok(())
}

/// Alignment of every write offset and length on a [`LogFile`].
pub const IO_ALIGN: usize = 4096;

/// A file of the commit log: direct I/O when the filesystem supports it, buffered I/O
/// otherwise (tmpfs), decided when it is opened.
pub struct LogFile {
    path: PathBuf,
    inner: Inner,
    /// Opened with O_DSYNC: every completed write is durable.
    dsync: bool,
}

enum Inner {
    Dma(glommio::io::DmaFile),
    /// Used off the shard's thread only (`blocking`), each call with its own clone.
    Buffered(std::sync::Arc<std::fs::File>),
}

/// A buffer to write with [`LogFile::write_at`]: aligned memory for direct I/O.
pub struct IoBuf {
    inner: IoBufInner,
}

enum IoBufInner {
    Dma(glommio::io::DmaBuffer),
    Plain(Vec<u8>),
}

impl IoBuf {
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.inner {
            IoBufInner::Dma(b) => b.as_bytes_mut(),
            IoBufInner::Plain(v) => v.as_mut_slice(),
        }
    }
    pub fn len(&self) -> usize {
        match &self.inner {
            IoBufInner::Dma(b) => b.len(),
            IoBufInner::Plain(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Log bytes gathered for one write, in aligned memory that direct I/O writes as it is
/// (records are encoded straight into it: no copy into a separate I/O buffer). Filled from
/// the start; grows by moving to a larger buffer.
#[derive(Default)]
pub struct WriteBuf {
    mem: Option<glommio::io::DmaBuffer>,
    len: usize,
}

impl WriteBuf {
    /// An empty buffer with room for at least `cap` bytes.
    pub fn with_capacity(cap: usize) -> WriteBuf {
        let mut b = WriteBuf::default();
        b.reserve(cap);
        b
    }

    /// A buffer holding a copy of `bytes`, with room for at least `cap` bytes in all.
    pub fn from_slice(bytes: &[u8], cap: usize) -> WriteBuf {
        let mut b = WriteBuf::with_capacity(cap.max(bytes.len()));
        b.extend(bytes.len()).copy_from_slice(bytes);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.mem.as_ref().map_or(0, |m| m.len())
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.mem {
            Some(m) => &m.as_bytes()[..self.len],
            None => &[],
        }
    }

    /// Room for `additional` more bytes (moves to a buffer twice as large, or as large as
    /// needed, when there is not).
    fn reserve(&mut self, additional: usize) {
        let need = self.len + additional;
        if need <= self.capacity() {
            return;
        }
        let cap = align_up(need.max(self.capacity() * 2));
        let mut mem = glommio::allocate_dma_buffer_global(cap);
        if let Some(old) = &self.mem {
            mem.as_bytes_mut()[..self.len].copy_from_slice(&old.as_bytes()[..self.len]);
        }
        self.mem = Some(mem);
    }

    /// Appends `n` bytes and returns them to be filled. Their content is unspecified (the
    /// memory is not zeroed first, to spare a pass over every byte): the caller writes all
    /// of them before anything reads them.
    pub fn extend(&mut self, n: usize) -> &mut [u8] {
        self.reserve(n);
        let from = self.len;
        self.len += n;
        match &mut self.mem {
            Some(m) => &mut m.as_bytes_mut()[from..from + n],
            None => &mut [],
        }
    }

    /// Drops the bytes past the first `len` (no-op when it holds no more).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Ready to be written: the partial last block is padded with zeros up to the
    /// alignment, and a buffer much larger than its bytes (more than
    /// `WRITE_BUF_FIT_RATIO` times, and by more than `WRITE_BUF_SLACK_MAX`) is swapped for
    /// one that fits (the cache of the newest writes counts capacity). The swap is a copy
    /// of every byte: at twice, rounds of varying size (batches) copied ~40% of their bytes
    /// again.
    pub fn into_written(mut self) -> Written {
        let len = self.len;
        let aligned = align_up(len);
        // Nothing to write (a chunk left empty at a segment's end and sealed by a roll):
        // no memory is kept, and there is no zero-byte buffer to shrink into.
        let Some(mut mem) = self.mem.take().filter(|_| aligned > 0) else {
            return Written {
                mem: None,
                len: 0,
                capacity: 0,
            };
        };
        mem.as_bytes_mut()[len..aligned].fill(0);
        if mem.len() > WRITE_BUF_FIT_RATIO * aligned && mem.len() - aligned > WRITE_BUF_SLACK_MAX {
            let mut fit = glommio::allocate_dma_buffer_global(aligned);
            fit.as_bytes_mut()
                .copy_from_slice(&mem.as_bytes()[..aligned]);
            mem = fit;
        }
        let capacity = mem.len();
        mem.trim_to_size(aligned);
        Written {
            mem: Some(std::rc::Rc::new(mem)),
            len,
            capacity,
        }
    }
}

/// Unused room a written buffer may keep before it is swapped for one that fits.
const WRITE_BUF_SLACK_MAX: usize = 64 << 10;

/// A written buffer is swapped for one that fits only past this many times its bytes.
const WRITE_BUF_FIT_RATIO: usize = 4;

/// `n` rounded up to a multiple of [`IO_ALIGN`].
pub fn align_up(n: usize) -> usize {
    n.div_ceil(IO_ALIGN) * IO_ALIGN
}

/// The bytes of a [`WriteBuf`] once written (or being written): shared, by reference count,
/// between the write in flight, the cache of the newest writes and the answers that carry
/// its records.
#[derive(Clone)]
pub struct Written {
    /// Trimmed to `len` aligned up: what is written.
    mem: Option<std::rc::Rc<glommio::io::DmaBuffer>>,
    len: usize,
    /// Memory the buffer holds.
    capacity: usize,
}

impl Written {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Memory the buffer holds (at least `len`).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether `self` and `other` share one buffer.
    pub fn same(&self, other: &Written) -> bool {
        match (&self.mem, &other.mem) {
            (Some(a), Some(b)) => std::rc::Rc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl std::ops::Deref for Written {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.mem {
            Some(m) => &m.as_bytes()[..self.len],
            None => &[],
        }
    }
}

/// Bytes read from a [`LogFile`], or from the log's cache of its newest writes.
pub enum ReadBuf {
    Dma(glommio::io::ReadResult),
    Plain(Vec<u8>),
    /// `len` bytes at `start` of a buffer shared with the cache (not copied).
    Shared {
        bytes: Written,
        start: usize,
        len: usize,
    },
}

impl std::ops::Deref for ReadBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBuf::Dma(r) => r,
            ReadBuf::Plain(v) => v,
            ReadBuf::Shared { bytes, start, len } => &bytes[*start..*start + *len],
        }
    }
}

impl LogFile {
    /// Opens (and with `create`, creates) a file for reading and writing. Falls back to
    /// buffered I/O, with a warning on stderr, when the filesystem refuses O_DIRECT. With
    /// `dsync` (O_DSYNC), a write completes only once it is durable, as if an fdatasync
    /// followed it: one operation instead of two, and the kernel issues the cache flush
    /// from the write's completion (no hand-off of a separate fdatasync to an io_uring
    /// worker thread).
    pub async fn open(path: &Path, create: bool, dsync: bool) -> io::Result<LogFile> {
        probe_iopoll_once(path).await;
        let flags = if dsync { libc::O_DSYNC } else { 0 };
        let dma = glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .custom_flags(flags)
            .dma_open(path)
            .await;
        match dma {
            Ok(f) => Ok(LogFile {
                path: path.to_owned(),
                inner: Inner::Dma(f),
                dsync,
            }),
            Err(e) => {
                let e = e.os_error();
                if e.raw_os_error() == Some(libc::EINVAL) {
                    warn_buffered_once(path);
                    Self::open_buffered(path, create, dsync).await
                } else {
                    Err(with_context(e, "open", path))
                }
            }
        }
    }

    /// Opens the file for buffered I/O (the filesystem refuses O_DIRECT): every operation
    /// runs in the blocking pool, never on the shard's thread, its data copied once more.
    async fn open_buffered(path: &Path, create: bool, dsync: bool) -> io::Result<LogFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let flags = if dsync { libc::O_DSYNC } else { 0 };
        let owned = path.to_owned();
        let f = blocking(move || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .truncate(false)
                .custom_flags(flags)
                .open(&owned)
        })
        .await
        .map_err(|e| with_context(e, "open", path))?;
        Ok(LogFile {
            path: path.to_owned(),
            inner: Inner::Buffered(std::sync::Arc::new(f)),
            dsync,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when every completed write to this file is durable (O_DSYNC).
    pub fn is_dsync(&self) -> bool {
        self.dsync
    }

    /// True when this file uses direct I/O.
    pub fn is_direct(&self) -> bool {
        matches!(self.inner, Inner::Dma(_))
    }

    /// A zeroed buffer of `len` bytes (a multiple of [`IO_ALIGN`]) to write with.
    pub fn alloc(&self, len: usize) -> IoBuf {
        debug_assert_eq!(len % IO_ALIGN, 0);
        match &self.inner {
            Inner::Dma(f) => {
                let mut b = f.alloc_dma_buffer(len);
                b.as_bytes_mut().fill(0);
                IoBuf {
                    inner: IoBufInner::Dma(b),
                }
            }
            Inner::Buffered(_) => IoBuf {
                inner: IoBufInner::Plain(vec![0u8; len]),
            },
        }
    }

    /// Fault injection and the slow-disk delay of tests, before a write.
    async fn before_write(&self, pos: u64) -> io::Result<()> {
        debug_assert_eq!(pos % IO_ALIGN as u64, 0);
        injected(FailPoint::Write, &self.path)?;
        injected(FailPoint::WriteNoSpace, &self.path)?;
        if self.dsync {
            // An O_DSYNC write fails where its fdatasync would.
            injected(FailPoint::Fdatasync, &self.path)?;
        }
        let delay_us = WRITE_DELAY_US.load(std::sync::atomic::Ordering::Relaxed);
        if delay_us > 0 {
            sleep(Duration::from_micros(delay_us)).await;
        }
        Ok(())
    }

    fn check_written(&self, written: usize, want: usize, pos: u64) -> io::Result<()> {
        if written != want {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "short write {}: {written} of {want} bytes at {pos}",
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }

    /// Writes the bytes of `buf` at `pos` (aligned), its last block padded with zeros; the
    /// buffer is shared with the write, not copied.
    pub async fn write_shared(&self, buf: &Written, pos: u64) -> io::Result<()> {
        self.before_write(pos).await?;
        let Some(mem) = &buf.mem else { return Ok(()) };
        let want = mem.len();
        let written = match &self.inner {
            Inner::Dma(f) => f
                .write_rc_at(mem.clone(), pos)
                .await
                .map_err(|e| with_context(e, "write", &self.path))?,
            Inner::Buffered(f) => {
                let bytes = mem.as_bytes().to_vec();
                buffered(f, move |f| f.write_all_at(&bytes, pos))
                    .await
                    .map_err(|e| with_context(e, "write", &self.path))?;
                want
            }
        };
        self.check_written(written, want, pos)
    }

    /// Writes the whole buffer at `pos` (aligned).
    pub async fn write_at(&self, buf: IoBuf, pos: u64) -> io::Result<()> {
        self.before_write(pos).await?;
        let want = buf.len();
        let written = match (&self.inner, buf.inner) {
            (Inner::Dma(f), IoBufInner::Dma(b)) => f
                .write_at(b, pos)
                .await
                .map_err(|e| with_context(e, "write", &self.path))?,
            (Inner::Buffered(f), IoBufInner::Plain(v)) => {
                let len = v.len();
                buffered(f, move |f| f.write_all_at(&v, pos))
                    .await
                    .map_err(|e| with_context(e, "write", &self.path))?;
                len
            }
            _ => unreachable!("IoBuf allocated by another LogFile"),
        };
        self.check_written(written, want, pos)
    }

    /// Reads up to `len` bytes at `pos`; fewer at the end of the file.
    pub async fn read_at(&self, pos: u64, len: usize) -> io::Result<ReadBuf> {
        match &self.inner {
            Inner::Dma(f) => f
                .read_at(pos, len)
                .await
                .map(ReadBuf::Dma)
                .map_err(|e| with_context(e, "read", &self.path)),
            Inner::Buffered(f) => buffered(f, move |f| {
                let mut v = vec![0u8; len];
                let mut got = 0;
                while got < len {
                    let n = f.read_at(&mut v[got..], pos + got as u64)?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                v.truncate(got);
                Ok(v)
            })
            .await
            .map(ReadBuf::Plain)
            .map_err(|e| with_context(e, "read", &self.path)),
        }
    }

    pub async fn fdatasync(&self) -> io::Result<()> {
        injected(FailPoint::Fdatasync, &self.path)?;
        match &self.inner {
            Inner::Dma(f) => f
                .fdatasync()
                .await
                .map_err(|e| with_context(e, "fdatasync", &self.path)),
            Inner::Buffered(f) => buffered(f, |f| f.sync_data())
                .await
                .map_err(|e| with_context(e, "fdatasync", &self.path)),
        }
    }

    pub async fn size(&self) -> io::Result<u64> {
        match &self.inner {
            Inner::Dma(f) => f
                .file_size()
                .await
                .map_err(|e| with_context(e, "stat", &self.path)),
            Inner::Buffered(f) => buffered(f, |f| f.metadata().map(|m| m.len()))
                .await
                .map_err(|e| with_context(e, "stat", &self.path)),
        }
    }

    pub async fn truncate(&self, len: u64) -> io::Result<()> {
        match &self.inner {
            Inner::Dma(f) => f
                .truncate(len)
                .await
                .map_err(|e| with_context(e, "truncate", &self.path)),
            Inner::Buffered(f) => buffered(f, move |f| f.set_len(len))
                .await
                .map_err(|e| with_context(e, "truncate", &self.path)),
        }
    }

    /// Reserves `len` bytes of disk for the file without changing its size.
    pub async fn preallocate(&self, len: u64) -> io::Result<()> {
        match &self.inner {
            Inner::Dma(f) => f
                .pre_allocate(len, true)
                .await
                .map_err(|e| with_context(e, "fallocate", &self.path)),
            Inner::Buffered(_) => Ok(()),
        }
    }

    /// Closes the file (a buffered one off the shard's thread: its last close may free
    /// the pages of an unlinked file).
    pub async fn close(self) -> io::Result<()> {
        match self.inner {
            Inner::Dma(f) => f
                .close()
                .await
                .map_err(|e| with_context(e, "close", &self.path)),
            Inner::Buffered(f) => {
                blocking(move || drop(f)).await;
                Ok(())
            }
        }
    }
}

/// Runs `op` on a buffered file in the blocking pool.
async fn buffered<R: Send + 'static>(
    f: &std::sync::Arc<std::fs::File>,
    op: impl FnOnce(&std::fs::File) -> io::Result<R> + Send + 'static,
) -> io::Result<R> {
    let f = f.clone();
    blocking(move || op(&f)).await
}

fn warn_buffered_once(path: &Path) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        crate::warn!(
            "ringmq: warning: the filesystem of {} does not support O_DIRECT; the commit log \
             uses buffered I/O in the blocking pool instead of io_uring (a copy per write, one \
             thread hand-off per operation, no preallocation: slower writes and a full disk \
             found at the write, not the roll); put --data-dir on ext4 or xfs for direct I/O",
            path.display()
        );
    }
}

/// Spawns a task on the current shard's executor. The task runs until it finishes even if
/// the handle is dropped.
pub fn spawn<T: 'static>(fut: impl std::future::Future<Output = T> + 'static) {
    glommio::spawn_local(fut).detach();
}

/// Spawns a task and returns a handle to await its result.
pub fn spawn_joinable<T: 'static>(
    fut: impl std::future::Future<Output = T> + 'static,
) -> impl std::future::Future<Output = Option<T>> {
    glommio::spawn_local(fut).detach()
}

/// Runs a blocking function (file deletion, directory scans) off the shard's thread. A
/// panic in `f` is resumed here, on the caller's thread: glommio's pool thread would die of
/// it without an answer, leaving the caller (and every later blocking call of the executor,
/// whose pool has one thread) waiting forever; a shard that panics instead stops the broker
/// (`Broker::wait`).
pub async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let caught = glommio::executor()
        .spawn_blocking(move || std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)))
        .await;
    match caught {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

pub async fn sleep(d: Duration) {
    glommio::timer::sleep(d).await;
}

/// Lets the other tasks of this shard run before going on.
pub async fn yield_now() {
    glommio::executor().yield_now().await;
}

/// Runs a future to completion on a fresh single-threaded executor (tools, tests, benches).
pub fn run_local<F, Fut, T>(make: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(make)
        .expect("spawn executor")
        .join()
        .expect("executor thread panicked")
}

#[cfg(test)]
mod tests {
    use super::{WriteBuf, IO_ALIGN};

    /// A log file on a filesystem that refuses O_DIRECT (opened for buffered I/O here):
    /// every operation works, run in the blocking pool.
    #[test]
    fn a_buffered_log_file_writes_reads_syncs_and_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        super::run_local(move || async move {
            let f = super::LogFile::open_buffered(&path, true, false)
                .await
                .unwrap();
            assert!(!f.is_direct());
            let mut buf = f.alloc(2 * IO_ALIGN);
            buf.as_bytes_mut()[..5].copy_from_slice(b"hello");
            f.write_at(buf, IO_ALIGN as u64).await.unwrap();
            f.fdatasync().await.unwrap();
            assert_eq!(f.size().await.unwrap(), 3 * IO_ALIGN as u64);
            let read = f.read_at(IO_ALIGN as u64, 8).await.unwrap();
            assert_eq!(&read[..], b"hello\0\0\0");
            // Short at the end of the file.
            assert_eq!(
                f.read_at(3 * IO_ALIGN as u64 - 2, 8).await.unwrap().len(),
                2
            );
            f.truncate(IO_ALIGN as u64 + 2).await.unwrap();
            assert_eq!(&f.read_at(IO_ALIGN as u64, 8).await.unwrap()[..], b"he");
            f.close().await.unwrap();
        });
    }

    #[test]
    fn a_write_buffer_keeps_its_bytes_as_it_grows_and_pads_its_last_block() {
        let mut b = WriteBuf::from_slice(b"head", 8);
        assert_eq!(b.capacity(), IO_ALIGN, "aligned memory, a block at least");
        assert_eq!(b.as_slice().as_ptr() as usize % IO_ALIGN, 0);
        let mut want = b"head".to_vec();
        for i in 0..3000u32 {
            let bytes = i.to_le_bytes();
            b.extend(4).copy_from_slice(&bytes);
            want.extend_from_slice(&bytes);
        }
        assert!(b.capacity() >= want.len() && b.capacity().is_multiple_of(IO_ALIGN));
        assert_eq!(b.as_slice(), &want[..], "growing moved every byte");
        let cap = b.capacity();
        let w = b.into_written();
        assert_eq!(&w[..], &want[..]);
        assert_eq!(w.capacity(), cap, "close to its size: kept as it is");
        let mem = w.mem.as_ref().expect("memory");
        let aligned = want.len().div_ceil(IO_ALIGN) * IO_ALIGN;
        assert_eq!(mem.len(), aligned, "the write covers whole blocks");
        assert!(
            mem.as_bytes()[want.len()..].iter().all(|&b| b == 0),
            "the partial last block is padded with zeros, not stale memory"
        );
        assert!(w.same(&w.clone()));
    }

    /// A panic in a blocking function reaches the task that awaited it (and its executor's
    /// thread, which ends) instead of killing the pool thread without an answer, which left
    /// the caller waiting forever.
    #[test]
    fn a_panic_in_a_blocking_function_reaches_its_caller() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(|| {
                super::run_local(|| async {
                    let before = super::blocking(|| 7).await;
                    let never: u32 = super::blocking(|| panic!("in the blocking pool")).await;
                    before + never
                })
            });
            let _ = tx.send(r.is_err());
        });
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(60)),
            Ok(true),
            "the executor's thread ended with the blocking function's panic"
        );
    }

    #[test]
    fn a_written_buffer_much_larger_than_its_bytes_is_swapped_for_one_that_fits() {
        let mut b = WriteBuf::with_capacity(1 << 20);
        b.extend(100).fill(7);
        let w = b.into_written();
        assert_eq!(
            w.capacity(),
            IO_ALIGN,
            "what the cache counts is what it holds"
        );
        assert_eq!(&w[..], &[7u8; 100][..]);
        // Up to four times its bytes, a buffer is kept as it is (swapping copies every byte).
        let mut b = WriteBuf::with_capacity(1 << 20);
        b.extend(300 << 10).fill(8);
        let w = b.into_written();
        assert_eq!(w.capacity(), 1 << 20, "under four times its bytes, no copy");
        assert_eq!(w.len(), 300 << 10);
        let mut b = WriteBuf::with_capacity(1 << 20);
        b.extend(200 << 10).fill(9);
        let w = b.into_written();
        assert_eq!(
            w.capacity(),
            200 << 10,
            "past four times its bytes it is swapped"
        );
        assert!(w.iter().all(|&x| x == 9));
        let empty = WriteBuf::default().into_written();
        assert!(empty.is_empty() && empty.capacity() == 0);
        // Empty with room to spare (a chunk left empty at a segment's end): nothing kept,
        // and no zero-byte buffer asked for (that panicked).
        let empty = WriteBuf::with_capacity(1 << 20).into_written();
        assert!(empty.is_empty() && empty.capacity() == 0 && empty.mem.is_none());
    }

    /// An executor for a test's own thread, with glommio's preempt timer or `preempt`.
    fn test_executor(preempt: Option<std::time::Duration>) -> glommio::LocalExecutor {
        let builder = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound);
        match preempt {
            Some(d) => builder.preempt_timer(d),
            None => builder,
        }
        .make()
        .expect("executor")
    }

    /// The executor never parks with runnable work when preemption is due as it looks for
    /// work (glommio 0.9.0 did: vendor/glommio/RINGMQ.md). A preempt timer of 1 ns makes
    /// preemption due almost always: each `run` of an empty future needs the executor to run
    /// its task; 0.9.0 hung here within the first few.
    #[test]
    fn an_executor_always_preempted_still_runs_its_tasks_and_never_sleeps_on_them() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ex = test_executor(Some(std::time::Duration::from_nanos(1)));
            for i in 0..2_000u32 {
                assert_eq!(ex.run(async move { i }), i);
            }
            // Tasks that wait for each other and for a blocking thread, preempted throughout.
            let sum = ex.run(async {
                let mut sum = 0u64;
                for i in 0..200u64 {
                    let t = glommio::spawn_local(async move { i }).detach();
                    sum += t.await.unwrap_or(0);
                    sum += super::blocking(move || i).await;
                }
                sum
            });
            let _ = tx.send(sum);
        });
        let sum = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the executor slept with a runnable task");
        assert_eq!(sum, 2 * (0..200u64).sum::<u64>());
    }

    /// An executor that parks waiting for another thread is always woken by it (the sleep
    /// protocol of vendor/glommio/RINGMQ.md: a fence on each side instead of a membarrier).
    /// Two executors play ping-pong over channels of one slot, each parking between balls,
    /// while a third thread's blocking jobs wake one of them too; a lost wake-up hangs.
    #[test]
    fn executors_parked_on_each_other_are_always_woken() {
        use glommio::channels::shared_channel;
        const ROUNDS: u64 = 20_000;
        let (ping_tx, ping_rx) = shared_channel::new_bounded::<u64>(1);
        let (pong_tx, pong_rx) = shared_channel::new_bounded::<u64>(1);
        let (done, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ex = test_executor(None);
            let sum = ex.run(async move {
                let (tx, rx) = (ping_tx.connect().await, pong_rx.connect().await);
                let mut sum = 0;
                for i in 0..ROUNDS {
                    tx.send(i).await.expect("ping");
                    sum += rx.recv().await.expect("pong");
                    if i % 64 == 0 {
                        sum += super::blocking(move || i).await - i;
                    }
                }
                sum
            });
            let _ = done.send(sum);
        });
        std::thread::spawn(move || {
            let ex = test_executor(None);
            ex.run(async move {
                let (rx, tx) = (ping_rx.connect().await, pong_tx.connect().await);
                while let Some(i) = rx.recv().await {
                    if tx.send(i + 1).await.is_err() {
                        break;
                    }
                }
            });
        });
        let sum = done_rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("an executor slept through a wake-up from another thread");
        assert_eq!(sum, (1..=ROUNDS).sum::<u64>());
    }

    /// A task queue that runs past its time slice yields to another (vendor/glommio/RINGMQ.md:
    /// the slice is a deadline `need_preempt` checks, not a kernel timeout re-armed per loop).
    /// The first queue's task spins, calling `yield_if_needed`, until the second queue's task
    /// has run; without preemption it would spin until its own 20 s limit.
    #[test]
    fn a_task_queue_past_its_time_slice_lets_another_run() {
        use glommio::{Latency, Shares};
        use std::time::{Duration, Instant};
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ex = test_executor(Some(Duration::from_millis(5)));
            let spun_for = ex.run(async {
                let queue = |name| {
                    glommio::executor().create_task_queue(
                        Shares::default(),
                        Latency::NotImportant,
                        name,
                    )
                };
                let (a, b) = (queue("spinner"), queue("other"));
                let ran = std::rc::Rc::new(std::cell::Cell::new(false));
                let flag = ran.clone();
                let spinner = glommio::spawn_local_into(
                    async move {
                        let start = Instant::now();
                        while !flag.get() && start.elapsed() < Duration::from_secs(20) {
                            glommio::yield_if_needed().await;
                        }
                        start.elapsed()
                    },
                    a,
                )
                .expect("spawn")
                .detach();
                let other = glommio::spawn_local_into(async move { ran.set(true) }, b)
                    .expect("spawn")
                    .detach();
                let spun_for = spinner.await;
                other.await;
                spun_for
            });
            let _ = tx.send(spun_for);
        });
        let spun_for = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the executor ended")
            .expect("the spinner ran");
        assert!(
            spun_for < Duration::from_secs(5),
            "the other queue waited {spun_for:?} for a 5 ms time slice to end"
        );
    }

    /// An executor that parks with a far timer armed, woken by another thread, then parks
    /// for a nearer timer, wakes for the nearer one (vendor/glommio/RINGMQ.md: the armed
    /// wake-up is kept across sleeps only while it fires no later than needed). Repeated,
    /// with the nearer timers also firing while the far one stays armed. The sleeps here are
    /// the timers under test (the sender's spaces its pings so the receiver parks between
    /// them), not waits for another thread's work.
    #[test]
    fn a_parked_executor_wakes_for_a_timer_nearer_than_the_one_armed() {
        use glommio::channels::shared_channel;
        use std::time::{Duration, Instant};
        let (ping_tx, ping_rx) = shared_channel::new_bounded::<u32>(1);
        let (done, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ex = test_executor(None);
            let slept = ex.run(async move {
                let rx = ping_rx.connect().await;
                // Armed at every park below: the earliest timer but for the short sleeps.
                let far =
                    glommio::spawn_local(glommio::timer::sleep(Duration::from_secs(60))).detach();
                let mut longest = Duration::ZERO;
                while let Some(i) = rx.recv().await {
                    let start = Instant::now();
                    glommio::timer::sleep(Duration::from_millis(2 + u64::from(i % 5))).await;
                    longest = longest.max(start.elapsed());
                }
                drop(far);
                longest
            });
            let _ = done.send(slept);
        });
        let sender = std::thread::spawn(move || {
            let ex = test_executor(None);
            ex.run(async move {
                let tx = ping_tx.connect().await;
                for i in 0..20u32 {
                    glommio::timer::sleep(Duration::from_millis(20)).await;
                    if tx.send(i).await.is_err() {
                        break;
                    }
                }
            });
        });
        let longest = done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a short sleep waited for the 60 s timer armed before it");
        let _ = sender.join();
        assert!(
            longest < Duration::from_secs(5),
            "a sleep of a few ms took {longest:?}"
        );
    }
}
