//! The writer side of the log: the one writer task that turns everything appended so far
//! into aligned direct writes (one per touched segment), pre-zeroing (sync mode, and async
//! mode while the log writes slowly), group
//! fdatasync, the background flusher of async mode, and poisoning after a failed write or
//! sync.

use super::*;

/// A write or an allocation failed. A full disk (nothing acknowledged past what is
/// readable) is not an integrity event: the log is cut back to its readable end, the appends
/// waiting past it fail with `DiskFull`, and appends are refused until the space returns.
/// No file descriptor left to open the next segment (a roll while connections or other
/// files hold them all) is cut the same way: appends are taken again at the next look at
/// the disk (every second), and a write that still finds none cuts again. Before, it
/// poisoned the log until a restart. Anything else poisons the log. `first_written`: the
/// file of `first` when its write went through (a later chunk of the round failed).
pub(super) fn write_failed(
    inner: &Rc<Inner>,
    first: &ReadyChunk,
    first_written: Option<Rc<LogFile>>,
    e: LogError,
) {
    let cause = match &e {
        LogError::Io(io) if crate::io::is_disk_full(io) => Some("disk full"),
        LogError::Io(io) if crate::io::is_out_of_descriptors(io) => {
            Some("no file descriptor left for the log")
        }
        _ => None,
    };
    if let Some(cause) = cause {
        cut(inner, first, first_written, format!("{cause} ({e})"));
    } else {
        poison(inner, e.to_string());
    }
}

/// Drops everything appended past the readable end: `first` is the first chunk of the
/// failed round (it starts at or before that end), `first_written` its file when its write
/// went through; `reason` says why (a full disk, no descriptor left).
fn cut(inner: &Rc<Inner>, first: &ReadyChunk, first_written: Option<Rc<LogFile>>, reason: String) {
    let at = inner.readable.value.get();
    debug_assert!(first.start <= at);
    let keep = ((at - first.start) as usize).min(first.bytes.len());
    let doomed: Vec<Segment> = {
        let mut st = inner.st.borrow_mut();
        st.active = st.new_chunk(first.seg_base, first.start, &first.bytes[..keep]);
        st.sealed.clear();
        st.write_pos = at;
        st.active_base = first.seg_base;
        let later: Vec<u64> = st
            .segments
            .range(first.seg_base + 1..)
            .map(|(b, _)| *b)
            .collect();
        let doomed = later
            .into_iter()
            .filter_map(|b| st.segments.remove(&b))
            .collect();
        st.epoch += 1;
        let epoch = st.epoch;
        st.cuts.push_back((epoch, at));
        if st.cuts.len() > CUTS_KEPT {
            st.cuts.pop_front();
        }
        st.full = Some(reason.clone());
        st.writer_running = false;
        doomed
    };
    crate::warn!(
        "ringmq: commit log {}: {reason}; appends after log offset {at} dropped and answered DiskFull, new ones refused until the next look at the disk (every second) finds room",
        inner.dir.display()
    );
    inner.tail.borrow_mut().clear();
    inner.readable.wake_all();
    inner.durable.wake_all();
    // Segments past the cut hold nothing kept (a failed creation may have allocated some
    // of the space): remove them off the shard thread. Until they are gone the disk stays
    // full for appends (`CommitLog::space_returned`) and a close waits: a roll must never
    // open one of these files just before it is unlinked (acknowledged records would go to
    // a file without a name), and a restart must not read what the failed round left in
    // them.
    let paths: Vec<PathBuf> = doomed.into_iter().map(|s| s.path).collect();
    // Records the first chunk's write put past the cut are whole and valid: answered
    // `DiskFull`, they would come back at the next start. Its blocks are written over with
    // what is kept and zeros after (an overwrite needs no new disk space), durably, before
    // appends are taken again.
    let wipe = first_written.map(|file| {
        let mut buf = file.alloc(align_up(first.bytes.len()));
        buf.as_bytes_mut()[..keep].copy_from_slice(&first.bytes[..keep]);
        (file, buf, first.start - first.seg_base)
    });
    if !paths.is_empty() || wipe.is_some() {
        inner.st.borrow_mut().removing += 1;
        let weak = Rc::downgrade(inner);
        crate::io::spawn(async move {
            let wiped = match wipe {
                Some((file, buf, pos)) => match file.write_at(buf, pos).await {
                    Ok(()) => file.fdatasync().await,
                    Err(e) => Err(e),
                },
                None => Ok(()),
            };
            let failed = crate::io::blocking(move || {
                let mut failed = Vec::new();
                for p in paths {
                    match std::fs::remove_file(&p) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => failed.push((p, e)),
                        _ => {}
                    }
                }
                failed
            })
            .await;
            let Some(inner) = weak.upgrade() else { return };
            inner.st.borrow_mut().removing -= 1;
            if let Err(e) = wiped {
                poison(
                    &inner,
                    format!("writing over the records past a disk-full cut failed: {e}"),
                );
            }
            // A file left there would be reused by the next roll, records and all: the log
            // takes no more appends until a restart (whose recovery deals with it).
            if let Some((p, e)) = failed.first() {
                poison(
                    &inner,
                    format!("removing {} after a disk-full cut failed: {e}", p.display()),
                );
            }
            inner.zeroed.notify_waiters();
        });
    }
}

pub(super) fn poison(inner: &Inner, reason: String) {
    crate::error!(
        "ringmq: commit log {} poisoned: {reason}",
        inner.dir.display()
    );
    inner.st.borrow_mut().poisoned = Some(reason);
    inner.readable.wake_all();
    inner.durable.wake_all();
}

pub(super) async fn ensure_file(inner: &Inner, seg_base: u64) -> Result<Rc<LogFile>, LogError> {
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
    let file = LogFile::open(&path, true, inner.cfg.flush == FlushMode::Sync).await?;
    // The new file's directory entry must be durable before any record in it is (synced
    // through the directory's kept descriptor: a roll needs no other than the file's).
    let (handle, dir) = (inner.dir_handle.clone(), inner.dir.clone());
    crate::io::blocking(move || crate::io::sync_open_dir(&handle, &dir)).await?;
    if inner.cfg.preallocate {
        file.preallocate(inner.cfg.segment_bytes).await?;
    }
    let file = Rc::new(file);
    if let Some(s) = inner.st.borrow_mut().segments.get_mut(&seg_base) {
        s.file = Some(file.clone());
    }
    Ok(file)
}

/// How many extra times the writer yields while appends keep joining a batch.
pub(super) const BATCH_SETTLE_YIELDS_MAX: usize = 4;

/// Bytes of a segment written with zeros ahead of the data at a time. In sync mode,
/// overwriting initialized blocks lets fdatasync skip the metadata journal commit that
/// extending a file (or converting unwritten extents) needs: on ext4 that is the difference
/// between a ~50 µs and a ~800 µs fdatasync. In async mode (while the log writes slowly:
/// [`LogConfig::async_prezero_rate_max`]) a write over zeroed blocks completes without the
/// io_uring worker and the extent conversion a write into preallocated blocks takes.
pub(super) const PREZERO_BYTES: u64 = 8 << 20;

/// Async mode zeroes this much at a time, once less than this is zeroed ahead of the
/// writer: a writer that catches up with a stretch (the log turned fast, or a roll) waits
/// for what is left of it, a few milliseconds at most.
const ASYNC_PREZERO_BYTES: u64 = 2 << 20;

/// Async mode, when the writer gets past what is zeroed (a segment's first write): the
/// stretch after its write left to the writes that follow, where the zeros ahead start
/// after it.
const ASYNC_PREZERO_GAP: u64 = 1 << 20;

/// Async mode measures how fast the log writes over windows of this length.
const WRITE_RATE_WINDOW: Duration = Duration::from_millis(100);

/// Once fewer initialized bytes than this are left ahead of the writer, the next
/// [`PREZERO_BYTES`] are zeroed in the background.
const PREZERO_AHEAD_MIN: u64 = PREZERO_BYTES / 2;

/// Background zeroing writes this much at a time: the device serves writes in order, and a
/// data write (an acknowledgement waits on it) queued behind one 8 MiB write of zeros waited
/// milliseconds for it; behind a piece this size it waits a fraction of one.
const PREZERO_PIECE_BYTES: u64 = 256 << 10;

/// Before the writer writes a segment's file up to `need` (a file position). Sync mode: the
/// blocks there must be initialized. Normally they are, zeroed in the background ahead of
/// the writer (started here once less than [`PREZERO_AHEAD_MIN`] is left), so sends do not
/// wait for zeroing. The writer zeroes inline only when it has caught up (the first write
/// of a segment after a start), and waits when it reaches a stretch still being zeroed:
/// zeros never land where data is or will be written. Async mode zeroes ahead in shorter
/// stretches ([`ASYNC_PREZERO_BYTES`]) while the log writes slowly, never inline: past what
/// is zeroed it writes into the preallocated blocks, and it waits only when it reaches a
/// stretch still being zeroed (then the log counts as writing fast: no new stretch starts
/// until a window says otherwise).
pub(super) async fn zeroed_ahead(
    inner: &Rc<Inner>,
    seg_base: u64,
    file: &Rc<LogFile>,
    need: u64,
) -> Result<(), LogError> {
    let sync = inner.cfg.flush == FlushMode::Sync;
    let (stretch, ahead_min) = if sync {
        (PREZERO_BYTES, PREZERO_AHEAD_MIN)
    } else {
        (ASYNC_PREZERO_BYTES, ASYNC_PREZERO_BYTES)
    };
    if !sync {
        measure_write_rate(inner, seg_base + need);
    }
    let mut caught_up = false;
    loop {
        let ended = inner.zeroed.notified();
        let mut ended = std::pin::pin!(ended);
        ended.as_mut().enable();
        let Some((zeroed_to, zeroing)) = inner
            .st
            .borrow()
            .segments
            .get(&seg_base)
            .map(|s| (s.zeroed_to, s.zeroing))
        else {
            // The segment is gone (a cut): its write fails or goes nowhere anyway.
            return Ok(());
        };
        if need <= zeroed_to {
            if !zeroing
                && zeroed_to < inner.cfg.segment_bytes
                && zeroed_to - need < ahead_min
                && (sync || inner.writes_slowly.get())
            {
                zero_in_background(inner, seg_base, file.clone(), zeroed_to, stretch);
            }
            return Ok(());
        }
        if zeroing {
            if !sync && !caught_up {
                // Caught up with the zeros: the log writes too fast for them.
                caught_up = true;
                inner.writes_slowly.set(false);
                inner
                    .stats
                    .prezero_caught_up
                    .set(inner.stats.prezero_caught_up.get() + 1);
            }
            ended.await;
            continue;
        }
        if !sync {
            // Zeros never land where this write goes, nor on a stretch after it: the writes
            // right after this one go there (into the preallocated blocks) rather than wait
            // for zeros the background only now starts writing.
            if let Some(s) = inner.st.borrow_mut().segments.get_mut(&seg_base) {
                s.zeroed_to = (need + ASYNC_PREZERO_GAP).min(inner.cfg.segment_bytes);
            }
            continue;
        }
        prezero(inner, seg_base, file, need).await?;
        inner
            .stats
            .prezero_inline
            .set(inner.stats.prezero_inline.get() + 1);
    }
}

/// Zeros `stretch` bytes of a segment's file from `from` (no zeros are written below it)
/// in a task of its own, [`PREZERO_PIECE_BYTES`] at a time, each piece counted as zeroed
/// once written; the writer writes below what is zeroed meanwhile.
fn zero_in_background(
    inner: &Rc<Inner>,
    seg_base: u64,
    file: Rc<LogFile>,
    from: u64,
    stretch: u64,
) {
    let target = (from + stretch).min(inner.cfg.segment_bytes);
    match inner.st.borrow_mut().segments.get_mut(&seg_base) {
        Some(s) => s.zeroing = true,
        None => return,
    }
    let weak = Rc::downgrade(inner);
    crate::io::spawn(async move {
        // Ok(true): every piece zeroed; Ok(false): the segment went away first.
        let mut piece_from = from;
        let result = loop {
            if piece_from >= target {
                break Ok(true);
            }
            let piece_to = (piece_from + PREZERO_PIECE_BYTES).min(target);
            let written = write_zeros(&file, piece_from, piece_to).await;
            let Some(inner) = weak.upgrade() else { return };
            if let Err(e) = written {
                break Err(e);
            }
            // Only the file this task zeroed: a disk-full cut may have removed its segment,
            // and a later roll created another at the same base (whose own zeroing this
            // must not end, nor claim its bytes zeroed).
            match zeroing_segment(&inner, seg_base, &file) {
                Some(mut s) => s.zeroed_to = s.zeroed_to.max(piece_to),
                None => break Ok(false),
            }
            inner.zeroed.notify_waiters();
            piece_from = piece_to;
        };
        let Some(inner) = weak.upgrade() else { return };
        if let Some(mut s) = zeroing_segment(&inner, seg_base, &file) {
            s.zeroing = false;
            // Left to the writer: in sync mode it zeroes inline when it gets there, and a
            // failure there fails its write; in async mode it writes into the preallocated
            // blocks.
            if let Err(e) = &result {
                crate::warn!("pre-zeroing {}: {e}", file.path().display());
            }
        }
        if let Ok(true) = result {
            inner
                .stats
                .prezero_background
                .set(inner.stats.prezero_background.get() + 1);
        }
        inner.zeroed.notify_waiters();
    });
}

/// Async mode, at every write: once a [`WRITE_RATE_WINDOW`] has passed, decides from the
/// bytes written in it (up to log offset `pos`) whether the log writes slowly enough
/// (under [`LogConfig::async_prezero_rate_max`]) to zero ahead. A window much longer than
/// that (the log was idle) says nothing about the rate: the decision stands.
fn measure_write_rate(inner: &Inner, pos: u64) {
    let (since, from) = inner.rate_mark.get();
    let elapsed = since.elapsed();
    if elapsed < WRITE_RATE_WINDOW {
        return;
    }
    if elapsed <= 4 * WRITE_RATE_WINDOW {
        let rate = pos.saturating_sub(from) as f64 / elapsed.as_secs_f64();
        inner
            .writes_slowly
            .set(rate < inner.cfg.async_prezero_rate_max as f64);
    }
    inner.rate_mark.set((std::time::Instant::now(), pos));
}

/// The segment at `seg_base` if `file` is still its file.
fn zeroing_segment<'a>(
    inner: &'a Inner,
    seg_base: u64,
    file: &Rc<LogFile>,
) -> Option<std::cell::RefMut<'a, Segment>> {
    std::cell::RefMut::filter_map(inner.st.borrow_mut(), |st| {
        st.segments
            .get_mut(&seg_base)
            .filter(|s| s.file.as_ref().is_some_and(|f| Rc::ptr_eq(f, file)))
    })
    .ok()
}

/// Waits until no segment is being zeroed and no file past a cut is being removed in the
/// background (the log is closing).
pub(super) async fn zeroing_ended(inner: &Inner) {
    loop {
        let ended = inner.zeroed.notified();
        let mut ended = std::pin::pin!(ended);
        ended.as_mut().enable();
        {
            let st = inner.st.borrow();
            if st.removing == 0 && !st.segments.values().any(|s| s.zeroing) {
                return;
            }
        }
        ended.await;
    }
}

/// Writes zeros over `[from, to)` of a file (aligned); in sync mode, whose segments are
/// O_DSYNC, durably when the one write completes (each durable write is a journal commit
/// and a cache flush: one for the whole stretch). In async mode the fdatasync after data
/// written over them makes that data's blocks durable (zeros past the data may never be
/// synced: they read back as zeros either way).
async fn write_zeros(file: &LogFile, from: u64, to: u64) -> Result<(), LogError> {
    if from < to {
        let buf = file.alloc(align_up((to - from) as usize));
        file.write_at(buf, from).await?;
    }
    Ok(())
}

/// Writes zeros ahead of `need` (a file position) if the initialized region ends before it.
pub(super) async fn prezero(
    inner: &Inner,
    seg_base: u64,
    file: &LogFile,
    need: u64,
) -> Result<(), LogError> {
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
    write_zeros(file, pos, target).await?;
    if let Some(s) = inner.st.borrow_mut().segments.get_mut(&seg_base) {
        s.zeroed_to = target;
    }
    Ok(())
}

/// The single writer task of a log: takes everything appended so far, writes it with one
/// aligned write per segment, syncs in sync mode, and wakes the waiters. Runs while there is
/// work; an append restarts it.
pub(super) async fn writer(weak: std::rc::Weak<Inner>) {
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
            let written_to = st.active.start + st.active.bytes.len() as u64;
            if written_to > inner.readable.value.get() || !chunks.is_empty() {
                // The next chunk starts with room for about the most the recent rounds
                // took (decaying by 1/16 a round), so a round rarely grows its chunk.
                let took =
                    st.active.bytes.len() + chunks.iter().map(|c| c.bytes.len()).sum::<usize>();
                let decayed = st.chunk_cap - st.chunk_cap / 16;
                st.chunk_cap = (took + took / 4)
                    .max(decayed)
                    .clamp(CHUNK_CAP_MIN, CHUNK_CAP_MAX);
                // Keep the partial last block: the next write rewrites it with more data.
                let taken = st.take_active();
                if taken.start + taken.bytes.len() as u64 > inner.readable.value.get() {
                    chunks.push(taken);
                }
            }
            if chunks.is_empty() {
                st.writer_running = false;
                return;
            }
            let chunks: Vec<ReadyChunk> = chunks.into_iter().map(Chunk::ready).collect();
            (chunks, written_to)
        };
        let mut touched: Vec<Rc<LogFile>> = Vec::new();
        for chunk in &chunks {
            let file = match ensure_file(&inner, chunk.seg_base).await {
                Ok(f) => f,
                Err(e) => return write_failed(&inner, &chunks[0], touched.first().cloned(), e),
            };
            // (Async mode: only with direct I/O, where a write into preallocated blocks is
            // the slow one.)
            if inner.cfg.preallocate
                && (inner.cfg.flush == FlushMode::Sync
                    || (inner.cfg.async_prezero_rate_max > 0 && file.is_direct()))
            {
                let chunk_end = chunk.start - chunk.seg_base + align_up(chunk.bytes.len()) as u64;
                if let Err(e) = zeroed_ahead(&inner, chunk.seg_base, &file, chunk_end).await {
                    return write_failed(&inner, &chunks[0], touched.first().cloned(), e);
                }
            }
            let t = std::time::Instant::now();
            if let Err(e) = file
                .write_shared(&chunk.bytes, chunk.start - chunk.seg_base)
                .await
            {
                return write_failed(&inner, &chunks[0], touched.first().cloned(), e.into());
            }
            inner.stats.writes.set(inner.stats.writes.get() + 1);
            if inner.cfg.flush == FlushMode::Sync {
                // Durable once written (O_DSYNC): the write is what fdatasync would have been.
                debug_assert!(file.is_dsync());
                inner.stats.fdatasync.borrow_mut().record(t.elapsed());
            }
            if !touched.iter().any(|f| Rc::ptr_eq(f, &file)) {
                touched.push(file);
            }
        }
        // Written: the buffers themselves become the cache of the newest bytes.
        {
            let mut tail = inner.tail.borrow_mut();
            for chunk in chunks {
                tail.push(chunk.start, chunk.bytes, inner.cfg.tail_cache_bytes);
            }
        }
        if inner.cfg.flush == FlushMode::Sync {
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

pub(super) async fn sync_unsynced(inner: &Inner) -> Result<(), LogError> {
    sync_unsynced_to(inner, None).await
}

/// A sync pass ([`Inner::sync_turn`]), skipped when the durable end reached `covered` while
/// this waited for its turn.
pub(super) async fn sync_unsynced_to(inner: &Inner, covered: Option<u64>) -> Result<(), LogError> {
    let _turn = inner.sync_turn.lock().await;
    if covered.is_some_and(|end| inner.durable.value.get() >= end) {
        return Ok(());
    }
    let target = inner.readable.value.get();
    let files = std::mem::take(&mut inner.st.borrow_mut().unsynced);
    for f in files {
        let t = std::time::Instant::now();
        if let Err(e) = f.fdatasync().await {
            let reason = e.to_string();
            poison(inner, reason.clone());
            return Err(LogError::Poisoned { reason });
        }
        inner.stats.fdatasync.borrow_mut().record(t.elapsed());
    }
    if target > inner.durable.value.get() {
        inner.durable.advance(target);
    }
    Ok(())
}

/// Background fdatasync in async flush mode.
pub(super) async fn flusher(weak: std::rc::Weak<Inner>) {
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
