//! The consume queue of one (topic, queue): entry `n` locates the message at queue offset `n`
//! in the commit log.
//!
//! Layout: segment files of `entries_per_file` fixed 20-byte entries, each file named by the
//! queue offset of its first entry (20 zero-padded digits). An entry is, little-endian:
//! physical offset `u64`, size `u32`, tag hash `u64`. An all-zero entry is empty: a real
//! entry never has size 0, because every record has a header. The physical offset's top 16
//! bits are the entry's check: bit 63 set, and in bits 48..63 the low 15 bits of the
//! CRC32C of the entry with those bits zero (log offsets stay below 2^48, 256 TiB). A read
//! whose check fails is an error (the tag hash of a damaged entry would otherwise let a
//! tag-filtered pull skip its message unseen: the record itself is not read). Entries
//! written before checks were kept have the 16 bits zero and are read unchecked.
//!
//! Invariants held between calls (checked in [`ConsumeQueue::check_invariants`] by tests):
//! - segment bases are contiguous: `segments[i + 1].base == segments[i].base + entries_per_file`;
//! - with no segment, the queue is empty (`min == max`);
//! - otherwise `segments[0].base <= min <= max <= last.base + entries_per_file` and
//!   `last.base <= max`: no file lies wholly beyond the end;
//! - entries in `[segments[0].base, max)` are non-zero, entries from `max` to the end of the
//!   last file are zero, so a reopen finds `max` again by scanning for the last non-zero
//!   entry. Entries below `min` (retention moved `min` inside a file) stay on disk until
//!   their whole file goes.
//!
//! Files are mapped on first use and unmapped once a call to [`ConsumeQueue::close_idle`]
//! finds them unused since the previous call: a shard may hold tens of thousands of queues,
//! most of them idle, and each mapping counts against the kernel's `vm.max_map_count`. No
//! descriptor stays open (a mapping outlives its descriptor). A file written through its
//! mapping and then unmapped keeps its dirty pages in the page cache; an fdatasync by path
//! (the store's checkpoint) writes them back.

use std::cell::{Cell, OnceCell};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use super::{
    create_mapped, io_err, list_files, map_file, next_serial, numbered_file_name, open_existing,
    read_u32, read_u64, remove_file, write_u32, write_u64, AllocAhead, Backing, DirtyFile,
    IndexError,
};

mod entry;
mod open;
#[cfg(test)]
use open::entries_in_file;
mod segment;
mod spare;
use super::spare::{remove_leftovers, Spares};
pub use entry::{CqEntry, CQ_ENTRY_BYTES, CQ_PHYSICAL_OFFSET_MAX};
use segment::{OpenFile, Segment};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumeQueueConfig {
    /// Entries per segment file. Changing it for an existing queue makes open fail (the file
    /// sizes no longer match): rebuild the queue from the log instead.
    pub entries_per_file: u64,
}

impl Default for ConsumeQueueConfig {
    fn default() -> Self {
        // 300_000 * 20 bytes = 5.72 MiB per file, as upstream.
        ConsumeQueueConfig {
            entries_per_file: 300_000,
        }
    }
}

/// Bytes of a consume-queue file allocated at a time ahead of its appends (3,276 entries).
const CQ_ALLOC_STEP: u64 = 64 << 10;

/// The consume queue of one (topic, queue). See the module doc for the format.
pub struct ConsumeQueue {
    dir: PathBuf,
    entries_per_file: u64,
    /// Bytes of one file.
    file_bytes: u64,
    /// The files, oldest first, mapped while in use. Memory is bounded by the files on
    /// disk: entries are read from the mappings, never cached.
    segments: VecDeque<Segment>,
    min_offset: u64,
    max_offset: u64,
    /// The physical offset of the entry at `min_offset` once known: retention skips a
    /// queue whose oldest entry is still kept without reading its files (a shard may hold
    /// tens of thousands of queues; a read is a page fault each).
    first_physical: Option<u64>,
    /// The entry at `max_offset - 1` while the queue is not empty, so that the end of a
    /// queue is known without mapping its last file.
    last: Option<CqEntry>,
    /// The spare file for the next roll, and the asks for it.
    spares: Spares,
}

impl ConsumeQueue {
    /// The queue offset of the oldest entry still served.
    pub fn min_offset(&self) -> u64 {
        self.min_offset
    }

    /// The next queue offset to write.
    pub fn max_offset(&self) -> u64 {
        self.max_offset
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry at `queue_offset`; `None` outside `[min_offset, max_offset)`. Fails only
    /// when the file holding it cannot be mapped. Its check is not verified: for the
    /// searches, bounds and floors that go by its place in the log, which the record read
    /// there is checked against (a torn entry of the tail, which the store's replay
    /// overwrites, must fail none of them). A read that decides by the tag hash alone, not
    /// reading the record, uses [`Self::get_checked`].
    pub fn get(&self, queue_offset: u64) -> Result<Option<CqEntry>, IndexError> {
        self.entry_of(queue_offset, false)
    }

    /// [`Self::get`], failing with [`IndexError::Corrupt`] (naming the file) when the
    /// entry fails its check: damaged on disk.
    pub fn get_checked(&self, queue_offset: u64) -> Result<Option<CqEntry>, IndexError> {
        self.entry_of(queue_offset, true)
    }

    /// What an empty entry at `queue_offset`, inside the queue, is: damage (a zeroed
    /// stretch of the file, or entries a power loss kept past a lost tail that the replay
    /// did not reach), named with the file. Reads stop before it rather than wait there for
    /// ever as if the queue ended.
    pub fn hole(&self, queue_offset: u64) -> IndexError {
        let path = self
            .locate(queue_offset)
            .map(|(segment, _)| segment.path.clone())
            .unwrap_or_default();
        IndexError::Corrupt {
            path,
            reason: format!(
                "entry {queue_offset} is empty inside the queue ({}..{})",
                self.min_offset, self.max_offset
            ),
        }
    }

    fn entry_of(&self, queue_offset: u64, checked: bool) -> Result<Option<CqEntry>, IndexError> {
        if queue_offset < self.min_offset || queue_offset >= self.max_offset {
            return Ok(None);
        }
        let Some((segment, i)) = self.locate(queue_offset) else {
            return Ok(None);
        };
        // `None` only for a zero entry inside the range, which a torn write in a power loss
        // could leave; the store's replay overwrites it.
        segment.entry(i, self.file_bytes, checked)
    }

    /// The newest entry and its queue offset (kept in memory: no file is read).
    pub fn last_entry(&self) -> Option<(u64, CqEntry)> {
        Some((self.max_offset.checked_sub(1)?, self.last?))
    }

    /// One past the last entry whose record ends within `log_end` (entries increase in
    /// physical offset): where the queue ends for reads while the commit log is readable up
    /// to `log_end` (entries of records not written yet are not served), or where it ended
    /// when the log ended there. `min_offset` when that is below every entry kept. Reads
    /// files only when the newest entry is beyond `log_end`: the few newest first (records
    /// being written), then a binary search over the rest.
    pub fn end_within(&self, log_end: u64) -> Result<u64, IndexError> {
        const TAIL_WALK: u64 = 8;
        if self.last.is_none_or(|e| e.end() <= log_end) {
            return Ok(self.max_offset);
        }
        let walk_to = self
            .max_offset
            .saturating_sub(TAIL_WALK)
            .max(self.min_offset);
        let mut end = self.max_offset - 1;
        while end > walk_to {
            match self.get(end - 1)? {
                Some(e) if e.end() > log_end => end -= 1,
                _ => return Ok(end),
            }
        }
        self.partition_point(self.min_offset, end, |e| e.end() <= log_end)
    }

    /// Re-reads the last entry after the end moved back.
    fn reload_last(&mut self) -> Result<(), IndexError> {
        self.last = match self.max_offset.checked_sub(1) {
            Some(last) if self.min_offset < self.max_offset => self.get(last)?,
            _ => None,
        };
        Ok(())
    }

    /// Files mapped now (a spare among them).
    pub fn mapped_files(&self) -> usize {
        self.segments.iter().filter(|s| s.is_open()).count() + usize::from(self.spares.held())
    }

    /// Closes the files not used since the previous call (unmaps them and releases their
    /// descriptors); the next use maps them again. Returns how many were closed. A queue
    /// whose last file closes gives up its spare too: its path goes into `doomed`, for the
    /// caller to remove off its thread.
    pub fn close_idle(&mut self, doomed: &mut Vec<PathBuf>) -> usize {
        let mut closed = 0;
        for segment in &mut self.segments {
            if segment.is_open() && !segment.used.replace(false) {
                segment.close();
                closed += 1;
            }
        }
        if self.segments.back().is_none_or(|s| !s.is_open()) {
            if let Some(path) = self.spares.give_up() {
                doomed.push(path);
                closed += 1;
            }
        }
        closed
    }

    /// Writes `entry` at `queue_offset`.
    ///
    /// Positional and idempotent, so the store's replay after a crash can re-put what may or
    /// may not be there:
    /// - `queue_offset == max_offset` appends;
    /// - `min_offset <= queue_offset < max_offset` overwrites in place;
    /// - `queue_offset < min_offset` is a no-op: retention already dropped that position;
    /// - `queue_offset > max_offset` is a [`IndexError::Hole`], except on an empty queue
    ///   (`min == max`), which restarts at `queue_offset` (its files are removed). That is
    ///   how a queue whose files were all deleted resumes at the log's next queue offset.
    ///
    /// An append that does not point past the previous entry's record is
    /// [`IndexError::Corrupt`]: entries increase in physical offset, which truncation and
    /// retention rely on, so the previous entry is damaged (it is read from the file,
    /// unchecked, after a start).
    ///
    /// # Panics
    /// If `entry.size` is 0 (that would read back as an empty slot).
    pub fn put(&mut self, queue_offset: u64, entry: CqEntry) -> Result<(), IndexError> {
        assert!(entry.size > 0, "consume-queue entry of size 0: {entry:?}");
        if entry.physical_offset > CQ_PHYSICAL_OFFSET_MAX {
            return Err(IndexError::Corrupt {
                path: self.dir.clone(),
                reason: format!(
                    "log offset {} is past what a consume-queue entry holds ({CQ_PHYSICAL_OFFSET_MAX}, 256 TiB)",
                    entry.physical_offset
                ),
            });
        }
        if queue_offset < self.min_offset {
            return Ok(());
        }
        if queue_offset > self.max_offset {
            if self.min_offset != self.max_offset {
                return Err(IndexError::Hole {
                    offset: queue_offset,
                    max: self.max_offset,
                });
            }
            while !self.segments.is_empty() {
                self.pop_back_segment()?;
            }
            self.min_offset = queue_offset;
            self.max_offset = queue_offset;
        }
        if queue_offset == self.max_offset {
            if let Some((at, previous)) = self.last_entry() {
                if entry.physical_offset < previous.end() {
                    return Err(IndexError::Corrupt {
                        path: self.dir.clone(),
                        reason: format!(
                            "entry {at} (log offset {}, size {}) reaches past the record appended after it at log offset {}: the index is damaged; create an empty file named `reindex` in the shard's directory (beside its `checkpoint`), and its next start indexes the log again",
                            previous.physical_offset, previous.size, entry.physical_offset
                        ),
                    });
                }
            }
            self.reserve_next()?;
            self.max_offset += 1;
        }
        if queue_offset == self.min_offset {
            self.first_physical = Some(entry.physical_offset);
        }
        let (entries_per_file, file_bytes) = (self.entries_per_file, self.file_bytes);
        let segment = self.segment_mut(queue_offset);
        debug_assert!(queue_offset - segment.base < entries_per_file);
        let at = entry_at(queue_offset - segment.base);
        segment.dirty_gen += 1;
        let open = segment.file_mut(file_bytes)?;
        entry.encode(&mut open.mmap[at..at + CQ_ENTRY_BYTES as usize]);
        if queue_offset + 1 == self.max_offset {
            self.last = Some(entry);
        }
        debug_assert_eq!(self.get(queue_offset).ok().flatten(), Some(entry));
        Ok(())
    }

    /// Makes room for the entry at `max_offset` (the next append): its file exists, is
    /// mapped, and its bytes are allocated on disk. A full disk fails here, before the
    /// record is written anywhere, with [`IndexError::DiskFull`]; so does a file that
    /// cannot be mapped again (an idle close unmapped it, and no descriptor is left to open
    /// it): mapped only by [`put`](Self::put), after the record was in the log, it failed
    /// there, and the append's undo, mapping it too, poisoned the log.
    pub fn reserve_next(&mut self) -> Result<(), IndexError> {
        self.ensure_segment_for_append()?;
        let (max, file_bytes) = (self.max_offset, self.file_bytes);
        let Some(segment) = self.segments.back_mut() else {
            return Ok(());
        };
        let end = entry_at(max - segment.base) as u64 + CQ_ENTRY_BYTES;
        let allocated = end <= segment.allocated_to;
        let (open, path) = segment.file_and_path_mut(file_bytes)?;
        if allocated {
            return Ok(());
        }
        open.backing.ensure(end, CQ_ALLOC_STEP, path)
    }

    /// The next stretch of the newest file to allocate, once appends come within
    /// [`CQ_ALLOC_STEP`] of what is allocated (the file mapped and grown to whole steps),
    /// for the caller to allocate off its thread and report with
    /// [`allocated_ahead`](Self::allocated_ahead). Appends past what is allocated still
    /// allocate it themselves ([`reserve_next`](Self::reserve_next)), so a late or failed
    /// one costs only that.
    pub fn allocate_ahead(&mut self) -> Option<AllocAhead> {
        let (max, entries_per_file) = (self.max_offset, self.entries_per_file);
        let segment = self.segments.back_mut()?;
        let next = max
            .checked_sub(segment.base)
            .filter(|&i| i < entries_per_file)?;
        let next_end = entry_at(next) as u64 + CQ_ENTRY_BYTES;
        let Segment {
            open,
            path,
            link_to,
            ..
        } = segment;
        let named = link_to.as_deref();
        open.get_mut()?
            .backing
            .ahead(next_end, CQ_ALLOC_STEP, path, named)
    }

    /// How an [`AllocAhead`] of this queue went (`allocated`: it succeeded). One for a file
    /// no longer mapped, or mapped again since, is ignored.
    pub fn allocated_ahead(&mut self, ahead: &AllocAhead, allocated: bool) {
        let backing = self
            .segments
            .iter_mut()
            .rev()
            .filter_map(|s| s.open.get_mut())
            .map(|open| &mut open.backing)
            .find(|b| b.id == ahead.backing);
        if let Some(backing) = backing {
            backing.ahead_done(ahead, allocated);
        }
    }

    /// Drops every entry whose record does not end within `log_end`, the recovered end of the
    /// commit log. Entries increase in physical offset, so they form a suffix.
    pub fn truncate_after_log_end(&mut self, log_end: u64) -> Result<(), IndexError> {
        if self.last.is_none_or(|e| e.end() <= log_end) {
            // Nothing beyond (the common case of a recovery): no file is read.
            return Ok(());
        }
        let first_beyond =
            self.partition_point(self.min_offset, self.max_offset, |e| e.end() <= log_end)?;
        self.truncate_to(first_beyond)
    }

    /// One past the last entry whose record ends within `log_offset`, an empty entry judged
    /// by the next one that is not: where the queue ended when the log was durable up to
    /// `log_offset` (an empty entry before entries within it is damage and kept; empty
    /// entries before entries past it were lost with them). Reads no file when the last
    /// entry ends within `log_offset`.
    pub fn end_within_durable(&self, log_offset: u64) -> Result<u64, IndexError> {
        if self.last.is_none_or(|e| e.end() <= log_offset) {
            return Ok(self.max_offset);
        }
        let within = |e: &CqEntry| e.end() <= log_offset;
        self.search(self.min_offset, self.max_offset, within, true)
    }

    /// Sets `max_offset` to `queue_offset`, dropping the entries from there on and zeroing
    /// their bytes so a reopen agrees. A no-op if `queue_offset >= max_offset`. Below
    /// `min_offset` the queue becomes empty at `queue_offset`.
    ///
    /// The zeroed bytes reach the disk on the next [`ConsumeQueue::flush`]. Until then a power
    /// loss may resurrect them, which the store's recovery truncates again.
    pub fn truncate_to(&mut self, queue_offset: u64) -> Result<(), IndexError> {
        if queue_offset >= self.max_offset {
            return Ok(());
        }
        let first_base = self.segments.front().map_or(queue_offset, |s| s.base);
        if queue_offset < first_base {
            while !self.segments.is_empty() {
                self.pop_back_segment()?;
            }
        } else {
            while self.segments.back().is_some_and(|s| s.base > queue_offset) {
                self.pop_back_segment()?;
            }
            let (old_max, file_bytes) = (self.max_offset, self.file_bytes);
            if let Some(segment) = self.segments.back_mut() {
                let from = entry_at(queue_offset - segment.base);
                let to = entry_at((old_max - segment.base).min(self.entries_per_file));
                segment.dirty_gen += 1;
                segment.file_mut(file_bytes)?.mmap[from..to].fill(0);
            }
        }
        self.max_offset = queue_offset;
        self.min_offset = self.min_offset.min(queue_offset);
        if self.min_offset == self.max_offset {
            self.first_physical = None;
        }
        self.reload_last()
    }

    /// Retention: advances `min_offset` to the first entry whose record starts at or after
    /// `log_min` (the commit log's first byte) and removes the files wholly before it.
    /// Never removes the last file, so a reopen still finds `max_offset`. Returns the new
    /// `min_offset`.
    pub fn delete_before_physical(&mut self, log_min: u64) -> Result<u64, IndexError> {
        let mut doomed = Vec::new();
        let new_min = self.trim_before_physical(log_min, &mut doomed)?;
        for path in doomed {
            remove_file(&path)?;
        }
        Ok(new_min)
    }

    /// [`delete_before_physical`](Self::delete_before_physical) without the file removals:
    /// the files no longer needed are unmapped and their paths added to `doomed`, for the
    /// caller to remove elsewhere (off a shard's thread). A queue whose oldest entry is
    /// known to be kept costs nothing.
    pub fn trim_before_physical(
        &mut self,
        log_min: u64,
        doomed: &mut Vec<PathBuf>,
    ) -> Result<u64, IndexError> {
        if self.min_offset >= self.max_offset || self.first_physical.is_some_and(|p| p >= log_min) {
            return Ok(self.min_offset);
        }
        let new_min = self.first_at_or_past(log_min)?;
        self.min_offset = new_min;
        self.first_physical = self.get(new_min)?.map(|e| e.physical_offset);
        if new_min == self.max_offset {
            self.last = None;
        }
        while self.segments.len() > 1
            && self
                .segments
                .front()
                .is_some_and(|s| s.base + self.entries_per_file <= new_min)
        {
            if let Some(mut segment) = self.segments.pop_front() {
                segment.close();
                doomed.extend(segment.into_paths());
            }
        }
        Ok(new_min)
    }

    /// The queue's first offset whose record the log still holds, `log_min` being the
    /// log's first byte: `min_offset` unless retention deleted records its oldest entries
    /// point at and the queue is not trimmed yet (the log moves first, the indexes after;
    /// a trim that failed waits for the next pass). One comparison then; a search of the
    /// entries only inside that window, which fails if an entry there cannot be read. An
    /// oldest entry found empty at the start (damage) is taken as kept: the read at it says
    /// what is wrong.
    pub fn first_kept(&self, log_min: u64) -> Result<u64, IndexError> {
        match self.first_physical {
            Some(p) if p < log_min && self.min_offset < self.max_offset => {
                self.first_at_or_past(log_min)
            }
            _ => Ok(self.min_offset),
        }
    }

    /// The first queue offset at or past `min_offset` whose record starts at or after
    /// `log_min` (`max_offset` if none does): a search, whatever the oldest entry.
    pub fn first_at_or_past(&self, log_min: u64) -> Result<u64, IndexError> {
        let below = |e: &CqEntry| e.physical_offset < log_min;
        self.search(self.min_offset, self.max_offset, below, true)
    }

    /// msyncs every file written since the last flush (on the calling thread: for a
    /// store's close and for tests; the broker uses [`dirty_files`](Self::dirty_files)).
    /// A spare taken by a roll gets its numbered name here too (the directory is not
    /// synced).
    pub fn flush(&mut self) -> Result<(), IndexError> {
        for segment in self
            .segments
            .iter_mut()
            .filter(|s| s.dirty_gen > s.synced_gen)
        {
            segment.name_now()?;
            match segment.open.get() {
                Some(open) => open.mmap.flush().map_err(io_err("msync", &segment.path))?,
                // Closed since written: its pages wait in the page cache.
                None => open_existing(&segment.path)?
                    .0
                    .sync_data()
                    .map_err(io_err("fdatasync", &segment.path))?,
            }
            segment.synced_gen = segment.dirty_gen;
        }
        Ok(())
    }

    /// The files written since they were last synced, to fdatasync elsewhere (an
    /// fdatasync of the file writes back what was written through the mapping); hand
    /// them back to [`files_synced`](Self::files_synced) once done.
    pub fn dirty_files(&self) -> Vec<DirtyFile> {
        self.segments
            .iter()
            .filter(|s| s.dirty_gen > s.synced_gen)
            .map(|s| DirtyFile {
                path: s.path.clone(),
                key: s.base,
                generation: s.dirty_gen,
                serial: s.serial,
                name_unsynced: s.name_unsynced,
                link_to: s.link_to.clone(),
            })
            .collect()
    }

    /// Files from [`dirty_files`](Self::dirty_files) were synced ([`DirtyFile::sync`]):
    /// what was written to them before is on disk, under their numbered names. Returns the
    /// spares' names of those linked, for the caller to remove off its thread.
    #[must_use = "the spares' names to remove"]
    pub fn files_synced(&mut self, files: &[DirtyFile]) -> Vec<PathBuf> {
        let mut unlinked = Vec::new();
        for f in files {
            // By serial: a file popped by a cut and made again at its base while the sync
            // ran is another file, with its own changes and name to sync.
            if let Some(s) = self.segments.iter_mut().find(|s| s.serial == f.serial) {
                s.synced_gen = s.synced_gen.max(f.generation);
                s.name_unsynced &= !f.name_unsynced;
                unlinked.extend(super::dirty::took_name(&mut s.path, &mut s.link_to, f));
            }
        }
        unlinked
    }

    /// `f` (from [`dirty_files`](Self::dirty_files)) is a spare taken by a roll that this
    /// queue still holds without its numbered name.
    pub fn still_unnamed(&self, f: &DirtyFile) -> bool {
        f.link_to.is_some()
            && (self.segments.iter()).any(|s| s.serial == f.serial && s.link_to == f.link_to)
    }

    /// The first queue offset in `[from, to)` whose entry fails `below`, assuming `below`
    /// holds for a prefix of the range (entries increase in physical offset). A zero entry
    /// (torn write) counts as `below`: its physical offset reads as 0.
    fn partition_point(
        &self,
        from: u64,
        to: u64,
        below: impl Fn(&CqEntry) -> bool,
    ) -> Result<u64, IndexError> {
        self.search(from, to, below, false)
    }

    /// [`partition_point`](Self::partition_point), or with `look_past_empty` an empty entry
    /// (damage) judged by the next entry before `to` that is not empty, and taken as not
    /// `below` when there is none: retention must not pass entries past damage it could not
    /// see (counted as below, a zeroed entry met by the search moved a queue's start past
    /// records the log still held).
    fn search(
        &self,
        from: u64,
        to: u64,
        below: impl Fn(&CqEntry) -> bool,
        look_past_empty: bool,
    ) -> Result<u64, IndexError> {
        let entry_at = |at: u64| match self.locate(at) {
            Some((segment, i)) => segment.entry(i, self.file_bytes, false).map(Some),
            None => Ok(None),
        };
        let (mut lo, mut hi) = (from, to);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let is_below = match entry_at(mid)? {
                Some(Some(entry)) => below(&entry),
                Some(None) if !look_past_empty => true,
                Some(None) => {
                    let mut next = mid + 1;
                    let mut judged = false;
                    while next < hi {
                        match entry_at(next)? {
                            Some(Some(entry)) => {
                                judged = below(&entry);
                                break;
                            }
                            Some(None) => next += 1,
                            None => break,
                        }
                    }
                    if judged {
                        // Below, and so is everything before it.
                        lo = next + 1;
                        continue;
                    }
                    false
                }
                None => false,
            };
            if is_below {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// The segment holding `queue_offset` and the entry's index in it.
    fn locate(&self, queue_offset: u64) -> Option<(&Segment, u64)> {
        let first = self.segments.front()?;
        let distance = queue_offset.checked_sub(first.base)?;
        let segment = self
            .segments
            .get(usize::try_from(distance / self.entries_per_file).ok()?)?;
        Some((segment, distance % self.entries_per_file))
    }

    /// The segment holding `queue_offset`, which must be mapped.
    fn segment_mut(&mut self, queue_offset: u64) -> &mut Segment {
        let first_base = self.segments.front().map_or(0, |s| s.base);
        let i = (queue_offset - first_base) / self.entries_per_file;
        &mut self.segments[i as usize]
    }

    /// Makes sure a file holds `max_offset`, rolling to a new one at a file boundary.
    fn ensure_segment_for_append(&mut self) -> Result<(), IndexError> {
        let base = match self.segments.back() {
            None => self.max_offset,
            Some(last) if last.base + self.entries_per_file == self.max_offset => self.max_offset,
            Some(_) => return Ok(()),
        };
        let numbered = self.dir.join(numbered_file_name(base));
        let (path, link_to, open) = match self.spares.take(!self.segments.is_empty()) {
            // No file-system call: the next sync names it.
            Some((spare, open)) => (spare, Some(numbered), open.into()),
            None => {
                // A file created with its name must follow no file still without one: a
                // crash would leave a gap, which the next open takes for a retention left
                // half done (it removes the files before it). So those are named here too.
                for segment in &mut self.segments {
                    segment.name_now()?;
                }
                let (backing, mmap) = create_mapped(&numbered, self.file_bytes)?;
                (numbered, None, OpenFile { mmap, backing })
            }
        };
        let mut segment = Segment::closed(base, path);
        segment.link_to = link_to;
        segment.dirty_gen = 1;
        // The checkpoint syncs the directory with the file's data.
        segment.name_unsynced = true;
        segment.used.set(true);
        if segment.open.set(open).is_err() {
            unreachable!("a new segment is not open");
        }
        self.segments.push_back(segment);
        Ok(())
    }

    fn pop_back_segment(&mut self) -> Result<(), IndexError> {
        if let Some(mut segment) = self.segments.pop_back() {
            segment.close();
            for path in segment.into_paths() {
                remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// Asserts the invariants listed in the module doc.
    #[cfg(test)]
    fn check_invariants(&self) {
        for pair in self.segments.iter().collect::<Vec<_>>().windows(2) {
            assert_eq!(pair[0].base + self.entries_per_file, pair[1].base);
        }
        assert!(self.min_offset <= self.max_offset);
        match (self.segments.front(), self.segments.back()) {
            (Some(first), Some(last)) => {
                assert!(first.base <= self.min_offset);
                assert!(last.base <= self.max_offset);
                assert!(self.max_offset <= last.base + self.entries_per_file);
            }
            _ => assert_eq!(self.min_offset, self.max_offset),
        }
        for segment in &self.segments {
            for i in 0..self.entries_per_file {
                let queue_offset = segment.base + i;
                let present = segment
                    .entry(i, self.file_bytes, false)
                    .expect("mapped")
                    .is_some();
                assert_eq!(present, queue_offset < self.max_offset, "at {queue_offset}");
            }
        }
    }
}

/// Byte position of entry `i` in its file.
fn entry_at(i: u64) -> usize {
    // Fits: open checked that a whole file's bytes fit in usize.
    (i * CQ_ENTRY_BYTES) as usize
}

#[cfg(test)]
mod tests;
