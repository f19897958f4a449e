//! One file of a consume queue: its mapping, taken on first use and dropped when idle,
//! and its entries read and written through it.

use super::*;

/// One segment file.
pub(super) struct Segment {
    /// Queue offset of the file's first entry.
    pub(super) base: u64,
    /// Where the file is: its numbered name, or its spare's while `link_to` is set.
    pub(super) path: PathBuf,
    /// The numbered name a spare taken by a roll gets at the next sync (see
    /// [`DirtyFile::link_to`]).
    pub(super) link_to: Option<PathBuf>,
    /// The mapping and descriptor while the file is in use; empty until first used and
    /// again once closed idle.
    pub(super) open: OnceCell<OpenFile>,
    /// Used since the last [`ConsumeQueue::close_idle`].
    pub(super) used: Cell<bool>,
    /// Bytes from the start known to be allocated, kept across a close.
    pub(super) allocated_to: u64,
    /// Changes made to the mapping, and those known to be on disk (msync or fdatasync).
    pub(super) dirty_gen: u64,
    pub(super) synced_gen: u64,
    /// Made (created, or a spare taken) by this queue, its directory not synced since.
    pub(super) name_unsynced: bool,
    /// Tells this segment apart from any other of the process (see [`DirtyFile::serial`]).
    pub(super) serial: u64,
}

/// A segment file in use: its mapping (the descriptor is closed once mapped) and what of
/// it is allocated.
pub(super) struct OpenFile {
    pub(super) mmap: MmapMut,
    pub(super) backing: Backing,
}

impl Segment {
    /// A file on disk, not mapped yet.
    pub(super) fn closed(base: u64, path: PathBuf) -> Segment {
        Segment {
            base,
            path,
            link_to: None,
            open: OnceCell::new(),
            used: Cell::new(false),
            allocated_to: 0,
            dirty_gen: 0,
            synced_gen: 0,
            name_unsynced: false,
            serial: next_serial(),
        }
    }

    /// The mapping, made now if the file is closed.
    pub(super) fn file(&self, file_bytes: u64) -> Result<&OpenFile, IndexError> {
        self.used.set(true);
        if let Some(open) = self.open.get() {
            return Ok(open);
        }
        let (file, len_bytes) = open_existing(&self.path)?;
        if len_bytes != file_bytes {
            return Err(IndexError::Corrupt {
                path: self.path.clone(),
                reason: format!("{len_bytes} bytes, expected {file_bytes}"),
            });
        }
        let mmap = map_file(&file, &self.path)?;
        let backing = Backing::reopened(file_bytes, self.allocated_to);
        Ok(self.open.get_or_init(|| OpenFile { mmap, backing }))
    }

    pub(super) fn file_mut(&mut self, file_bytes: u64) -> Result<&mut OpenFile, IndexError> {
        self.file_and_path_mut(file_bytes).map(|(open, _)| open)
    }

    /// The mapping, and the file's path borrowed beside it (not copied).
    pub(super) fn file_and_path_mut(
        &mut self,
        file_bytes: u64,
    ) -> Result<(&mut OpenFile, &Path), IndexError> {
        self.file(file_bytes)?;
        let Segment { open, path, .. } = self;
        let open = open.get_mut().ok_or_else(|| IndexError::Corrupt {
            path: path.clone(),
            reason: "mapping vanished".into(),
        })?;
        Ok((open, path))
    }

    /// The entry at index `i` of the file; `None` for an empty slot.
    /// `checked`: an entry whose check fails is an error. Reads check; the searches by
    /// physical offset do not, which a torn entry of the tail (one the store's replay
    /// overwrites) must not fail.
    pub(super) fn entry(
        &self,
        i: u64,
        file_bytes: u64,
        checked: bool,
    ) -> Result<Option<CqEntry>, IndexError> {
        let at = entry_at(i);
        let open = self.file(file_bytes)?;
        let bytes = &open.mmap[at..at + CQ_ENTRY_BYTES as usize];
        if checked {
            CqEntry::decode_checked(bytes, &self.path, i)
        } else {
            Ok(CqEntry::decode(bytes).map(|(entry, _)| entry))
        }
    }

    /// The paths to remove to remove the file: its spare's name first, so that a sync
    /// running meanwhile cannot link it at its numbered name afterwards.
    pub(super) fn into_paths(self) -> impl Iterator<Item = PathBuf> {
        std::iter::once(self.path).chain(self.link_to)
    }

    /// Gives a spare taken by a roll its numbered name now (a link, then the spare's name
    /// removed), on the calling thread.
    pub(super) fn name_now(&mut self) -> Result<(), IndexError> {
        crate::index::dirty::name_now(&mut self.path, &mut self.link_to)
    }

    /// Unmaps the file.
    pub(super) fn close(&mut self) {
        if let Some(open) = self.open.take() {
            self.allocated_to = self.allocated_to.max(open.backing.allocated_to());
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.open.get().is_some()
    }
}
