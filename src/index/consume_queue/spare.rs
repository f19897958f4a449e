//! A consume queue's spare file (see [`crate::index::spare`]): asked for once appends come
//! near the end of the queue's last file.

use super::{ConsumeQueue, OpenFile, CQ_ALLOC_STEP, CQ_ENTRY_BYTES};
use crate::index::spare::{MappedFile, SpareFile, Spares};

impl From<MappedFile> for OpenFile {
    fn from(MappedFile { backing, mmap }: MappedFile) -> OpenFile {
        OpenFile { mmap, backing }
    }
}

impl ConsumeQueue {
    /// A spare file to make off the appending thread, once appends come within a
    /// [`CQ_ALLOC_STEP`] of the last file's end and the queue has none (one out at a time):
    /// [`SpareFile::make`] it, then hand it to [`Spares::made`].
    pub fn spare_ahead(&mut self) -> Option<SpareFile> {
        let last = self.segments.back()?;
        let ahead = CQ_ALLOC_STEP / CQ_ENTRY_BYTES;
        if self.max_offset + ahead < last.base + self.entries_per_file {
            return None;
        }
        // The first page, as an append would allocate it.
        self.spares
            .ask(&self.dir, last.base, self.file_bytes, CQ_ENTRY_BYTES)
    }

    /// The queue's spare file and the asks for it.
    pub fn spares(&mut self) -> &mut Spares {
        &mut self.spares
    }
}
