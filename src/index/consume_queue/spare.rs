//! A consume queue's spare file (see [`crate::index::spare`]): asked for once appends come
//! near the end of the queue's last file.

use super::{ConsumeQueue, OpenFile, CQ_ALLOC_STEP, CQ_ENTRY_BYTES};
use crate::index::spare::{MadeSpare, MappedFile, SpareFile};
use std::path::PathBuf;

impl From<MappedFile> for OpenFile {
    fn from(MappedFile { backing, mmap }: MappedFile) -> OpenFile {
        OpenFile { mmap, backing }
    }
}

impl ConsumeQueue {
    /// A spare file to make off the appending thread, once appends come within a
    /// [`CQ_ALLOC_STEP`] of the last file's end and the queue has none (one out at a time):
    /// [`SpareFile::make`] it, then hand it to [`spare_made`](Self::spare_made).
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

    /// Takes a spare made for this queue and keeps it for the next roll. Returns the path
    /// of a file the queue does not take, for the caller to remove off its thread: one made
    /// for another queue opened on this directory before.
    pub fn spare_made(&mut self, made: MadeSpare) -> Option<PathBuf> {
        self.spares.made(made)
    }

    /// Rolls that created their file on the appending thread (no spare was ready).
    pub fn rolls_inline(&self) -> u64 {
        self.spares.rolls_inline()
    }

    /// A spare it asked for is out, not yet handed back.
    pub fn spare_out(&self) -> bool {
        self.spares.out()
    }

    /// Gives its spare up (a store closing): the path, for the caller to remove.
    pub fn give_up_spare(&mut self) -> Option<PathBuf> {
        self.spares.give_up()
    }
}
