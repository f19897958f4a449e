//! Opening a consume queue: its files listed and checked, and its end found by reading
//! the last files back without mapping them.

use super::*;

impl ConsumeQueue {
    /// Opens the queue stored in `dir`, creating `dir` if needed, and recovers `min_offset`
    /// and `max_offset` from the files.
    ///
    /// `min_offset` becomes the first file's base: the retention position inside a file is
    /// not persisted, so a reopen may report an older min until the store re-applies
    /// retention. `max_offset` is one past the last non-zero entry.
    ///
    /// # Panics
    /// If `cfg.entries_per_file` is 0 or too large for a file to be mapped.
    pub fn open(dir: &Path, cfg: ConsumeQueueConfig) -> Result<Self, IndexError> {
        assert!(
            cfg.entries_per_file > 0,
            "entries_per_file must be positive"
        );
        let file_bytes = cfg
            .entries_per_file
            .checked_mul(CQ_ENTRY_BYTES)
            .filter(|&bytes| usize::try_from(bytes).is_ok())
            .expect("entries_per_file * 20 must fit in memory");
        std::fs::create_dir_all(dir).map_err(io_err("create_dir", dir))?;

        let (mut files, others) = list_files(dir)?;
        remove_leftovers(others)?;
        // A file base that is not exactly one file after its predecessor means either a
        // crash in the middle of retention (which removes files oldest first, but the
        // directory updates may reach the disk in any order) or a different entries_per_file.
        // The former leaves a gap: the files before the last gap are what retention was
        // removing, so finish its job. An overlap cannot come from a crash.
        let mut first_kept = 0;
        for i in 1..files.len() {
            let (prev_base, ref prev_path) = files[i - 1];
            let (base, ref path) = files[i];
            let expected = prev_base.checked_add(cfg.entries_per_file);
            if expected.is_some_and(|expected| base < expected) {
                return Err(IndexError::Corrupt {
                    path: path.clone(),
                    reason: format!(
                        "base {base} overlaps {} (entries_per_file {} changed?)",
                        prev_path.display(),
                        cfg.entries_per_file
                    ),
                });
            }
            if expected != Some(base) {
                first_kept = i;
            }
        }
        for (_, path) in files.drain(..first_kept) {
            remove_file(&path)?;
        }

        let mut segments = VecDeque::with_capacity(files.len());
        for (base, path) in files {
            let len_bytes = std::fs::metadata(&path)
                .map_err(io_err("stat", &path))?
                .len();
            if len_bytes == 0 {
                // A crash between creating the file and sizing it: it holds no entry.
                let (file, _) = open_existing(&path)?;
                file.set_len(file_bytes).map_err(io_err("set_len", &path))?;
            } else if len_bytes != file_bytes {
                return Err(IndexError::Corrupt {
                    path,
                    reason: format!(
                        "{len_bytes} bytes, expected {file_bytes} ({} entries of {CQ_ENTRY_BYTES} \
                         bytes; entries_per_file changed?)",
                        cfg.entries_per_file
                    ),
                });
            }
            segments.push_back(Segment::closed(base, path));
        }

        let mut queue = ConsumeQueue {
            dir: dir.to_path_buf(),
            entries_per_file: cfg.entries_per_file,
            file_bytes,
            min_offset: segments.front().map_or(0, |s| s.base),
            max_offset: 0,
            segments,
            first_physical: None,
            last: None,
            spares: Spares::new(),
        };
        (queue.max_offset, queue.last) = queue.scan_max_offset()?;
        if queue.max_offset == queue.min_offset {
            queue.last = None;
        } else if let Some(first) = queue.segments.front() {
            // Retention at start-up then skips a queue whose oldest entry is kept without
            // mapping it.
            queue.first_physical = read_entry(&first.path, 0)?.map(|e| e.physical_offset);
        }
        // Files wholly beyond the end hold nothing (a crash right after rolling to a new
        // file); dropping them restores the invariant `last.base <= max`.
        while queue
            .segments
            .back()
            .is_some_and(|s| s.base > queue.max_offset)
        {
            queue.pop_back_segment()?;
        }
        Ok(queue)
    }

    /// One past the last non-zero entry, scanning backward from the end of the data of the
    /// last file; the first file's base if every entry is zero. Reads the files without
    /// mapping them, and only up to the end of their last data: entries are written from
    /// the start of a file, so a file holding a few entries costs a page, not its 5.7 MiB.
    /// Also returns the last entry.
    fn scan_max_offset(&self) -> Result<(u64, Option<CqEntry>), IndexError> {
        for segment in self.segments.iter().rev() {
            if let Some((used, last)) = entries_in_file(&segment.path, self.file_bytes)? {
                return Ok((segment.base + used, Some(last)));
            }
        }
        Ok((self.segments.front().map_or(0, |s| s.base), None))
    }
}

/// How many entries of a file are in use: one past its last non-zero entry, `None` if all
/// are zero. Reads backward from the end of the file's last data (`SEEK_DATA` and
/// `SEEK_HOLE`; the whole file where the filesystem cannot say), in chunks.
pub(super) fn entries_in_file(
    path: &Path,
    file_bytes: u64,
) -> Result<Option<(u64, CqEntry)>, IndexError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(io_err("open", path))?;
    let data_end = last_data_end(&file).map_or(file_bytes, |e| e.min(file_bytes));
    // Whole entries only; an entry cut by the hole reads its tail as zeros, which is right.
    let mut end = data_end.div_ceil(CQ_ENTRY_BYTES) * CQ_ENTRY_BYTES;
    end = end.min(file_bytes);
    const CHUNK_ENTRIES: u64 = 3_276;
    let mut chunk = vec![0u8; (CHUNK_ENTRIES * CQ_ENTRY_BYTES) as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK_ENTRIES * CQ_ENTRY_BYTES);
        let buf = &mut chunk[..(end - start) as usize];
        file.read_exact_at(buf, start)
            .map_err(io_err("read", path))?;
        let mut entries = buf.chunks_exact(CQ_ENTRY_BYTES as usize);
        if let Some(i) = entries.rposition(|e| CqEntry::decode(e).is_some()) {
            let at = i * CQ_ENTRY_BYTES as usize;
            // Not checked: the last entry may be torn by a crash (the replay overwrites it).
            if let Some((last, _)) = CqEntry::decode(&buf[at..at + CQ_ENTRY_BYTES as usize]) {
                return Ok(Some((start / CQ_ENTRY_BYTES + i as u64 + 1, last)));
            }
        }
        end = start;
    }
    Ok(None)
}

/// Where the last stretch of data of `file` ends (0: none), `None` where the filesystem
/// cannot say. Not the first hole: a page allocated ahead and never written reads as a hole
/// after a power loss, while a later page holding entries may have reached the disk; the
/// entries past the hole are found, and the lost ones before them are damage the recovery
/// sees, not an end.
fn last_data_end(file: &std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mut end = 0u64;
    loop {
        let from = i64::try_from(end).ok()?;
        // SAFETY: lseek on a descriptor owned by `file`; it only moves the file position.
        let data = unsafe { libc::lseek(fd, from, libc::SEEK_DATA) };
        if data < 0 {
            // ENXIO: no data at or after `end`.
            let e = std::io::Error::last_os_error();
            return (e.raw_os_error() == Some(libc::ENXIO)).then_some(end);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let hole = u64::try_from(hole).ok()?;
        if hole <= end {
            return Some(end);
        }
        end = hole;
    }
}

/// Entry `i` of a file, read without mapping it.
fn read_entry(path: &Path, i: u64) -> Result<Option<CqEntry>, IndexError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(io_err("open", path))?;
    let mut bytes = [0u8; CQ_ENTRY_BYTES as usize];
    file.read_exact_at(&mut bytes, i * CQ_ENTRY_BYTES)
        .map_err(io_err("read", path))?;
    Ok(CqEntry::decode(&bytes).map(|(entry, _)| entry))
}
