//! A consume queue's spare file (see [`crate::index::spare`]): asked for once appends come
//! near the end of the queue's last file.

use super::{ConsumeQueue, OpenFile, CQ_ENTRY_BYTES};
use crate::index::spare::{MappedFile, SpareFile, Spares};

/// How far ahead of the last file's end (in entry bytes: 52,428 entries) a queue asks for
/// its next file. The pool needs a few milliseconds to make it (more on a busy machine); a
/// queue taking 2 M messages a second (128-byte messages in batches of 1000, one queue)
/// reached the end first in 12 of 65 rolls when it asked 64 KiB ahead, and then rolled on
/// the shard's thread.
pub(super) const SPARE_LEAD_BYTES: u64 = 1 << 20;

impl From<MappedFile> for OpenFile {
    fn from(MappedFile { backing, mmap }: MappedFile) -> OpenFile {
        OpenFile { mmap, backing }
    }
}

impl ConsumeQueue {
    /// A spare file to make off the appending thread, once appends come within
    /// [`SPARE_LEAD_BYTES`] of the last file's end and the queue has none (one out at a time):
    /// [`SpareFile::make`] it, then hand it to [`Spares::made`].
    pub fn spare_ahead(&mut self) -> Option<SpareFile> {
        let last = self.segments.back()?;
        let ahead = SPARE_LEAD_BYTES / CQ_ENTRY_BYTES;
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
