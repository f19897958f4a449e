//! A consume queue's spare file: its next file, made ahead off the appending thread under a
//! name of its own, that the roll renames into place instead of creating, sizing, mapping
//! and allocating a file on the appending thread.
//!
//! A spare is tied to no position (cut-backs and restarts of the queue do not stale it) and
//! never carries a numbered name, so recovery cannot take it for one of the queue's files:
//! opening a queue removes any spare it finds.

use std::path::{Path, PathBuf};

use super::{ConsumeQueue, OpenFile, CQ_ALLOC_STEP, CQ_ENTRY_BYTES};
use crate::index::{io_err, map_file, next_serial, remove_file, Backing, IndexError};

/// Names of spare files start with this.
pub(super) const SPARE_PREFIX: &str = "spare-";

/// An empty file of a queue's size to make in the blocking pool
/// ([`ConsumeQueue::spare_ahead`]).
#[derive(Debug)]
pub struct SpareFile {
    pub(super) path: PathBuf,
    /// The [`Spares`] it is for (a queue opened again on the directory refuses it).
    queue: u64,
    file_bytes: u64,
}

/// A [`SpareFile`] made (or not), for [`ConsumeQueue::spare_made`].
pub struct MadeSpare {
    path: PathBuf,
    queue: u64,
    open: Result<OpenFile, IndexError>,
}

impl SpareFile {
    /// Creates the file (a new name: never one of the queue's), sizes and maps it and
    /// allocates its first page. Blocks. A file created here that could not be made whole
    /// is removed (never one that was in the way).
    pub fn make(self) -> MadeSpare {
        let created = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&self.path)
            .map_err(io_err("create", &self.path));
        let created_here = created.is_ok();
        let made = created.and_then(|file| {
            file.set_len(self.file_bytes)
                .map_err(io_err("set_len", &self.path))?;
            let mmap = map_file(&file, &self.path)?;
            let mut backing = Backing::new(self.file_bytes);
            backing.ensure(CQ_ENTRY_BYTES, CQ_ALLOC_STEP, &self.path)?;
            Ok(OpenFile { mmap, backing })
        });
        if made.is_err() && created_here {
            let _ = remove_file(&self.path);
        }
        MadeSpare {
            path: self.path,
            queue: self.queue,
            open: made,
        }
    }
}

impl MadeSpare {
    /// Why it could not be made, if it could not.
    pub fn failure(&self) -> Option<&IndexError> {
        self.open.as_ref().err()
    }

    /// Where it is: to remove when no queue takes it.
    pub fn into_path(self) -> PathBuf {
        self.path
    }
}

/// A queue's spare, and the asks for one.
pub(super) struct Spares {
    /// Tells this queue apart from any other opened in this process.
    queue: u64,
    /// A [`SpareFile`] is out.
    out: bool,
    /// The base of the last file when a spare could not be made: none is asked again until
    /// the next roll (a full disk would fail every one).
    failed_for: Option<u64>,
    /// The spare made, mapped, for the next roll.
    held: Option<(PathBuf, OpenFile)>,
    /// Rolls that had no spare and created their file.
    rolls_inline: u64,
}

impl Spares {
    pub(super) fn new() -> Spares {
        Spares {
            queue: next_serial(),
            out: false,
            failed_for: None,
            held: None,
            rolls_inline: 0,
        }
    }

    pub(super) fn held(&self) -> bool {
        self.held.is_some()
    }

    /// Gives the spare up (an idle queue): its path, for the caller to remove.
    pub(super) fn give_up(&mut self) -> Option<PathBuf> {
        self.held.take().map(|(path, _)| path)
    }

    /// The spare, renamed to `path` (the roll's file); `None` if there is none or the
    /// rename failed, when the roll creates the file itself (counted if `rolling`, not
    /// for a queue's first file).
    pub(super) fn rename_to(&mut self, path: &Path, rolling: bool) -> Option<OpenFile> {
        let renamed =
            self.held
                .take()
                .and_then(|(spare, open)| match std::fs::rename(&spare, path) {
                    Ok(()) => Some(open),
                    Err(_) => {
                        let _ = remove_file(&spare);
                        None
                    }
                });
        if renamed.is_none() && rolling {
            self.rolls_inline += 1;
        }
        renamed
    }
}

/// Removes the spares among `others` (a queue directory's entries with other names than
/// numbered files): an earlier run's, or a queue's opened here before; no queue holds them.
pub(super) fn remove_leftovers(others: Vec<PathBuf>) -> Result<(), IndexError> {
    for path in others {
        let name = path.file_name().and_then(|n| n.to_str());
        if name.is_some_and(|n| n.starts_with(SPARE_PREFIX)) {
            remove_file(&path)?;
        }
    }
    Ok(())
}

impl ConsumeQueue {
    /// A spare file to make off the appending thread, once appends come within a
    /// [`CQ_ALLOC_STEP`] of the last file's end and the queue has none (one out at a time):
    /// [`SpareFile::make`] it, then hand it to [`spare_made`](Self::spare_made).
    pub fn spare_ahead(&mut self) -> Option<SpareFile> {
        let spares = &mut self.spares;
        if spares.held.is_some() || spares.out {
            return None;
        }
        let last = self.segments.back()?;
        let ahead = CQ_ALLOC_STEP / CQ_ENTRY_BYTES;
        if spares.failed_for == Some(last.base)
            || self.max_offset + ahead < last.base + self.entries_per_file
        {
            return None;
        }
        spares.out = true;
        let name = format!("{SPARE_PREFIX}{:x}-{:x}", spares.queue, next_serial());
        Some(SpareFile {
            path: self.dir.join(name),
            queue: spares.queue,
            file_bytes: self.file_bytes,
        })
    }

    /// Takes a spare made for this queue and keeps it for the next roll. Returns the path
    /// of a file the queue does not take, for the caller to remove off its thread: one made
    /// for another queue opened on this directory before.
    pub fn spare_made(&mut self, made: MadeSpare) -> Option<PathBuf> {
        let spares = &mut self.spares;
        if made.queue != spares.queue {
            return Some(made.path);
        }
        spares.out = false;
        match made.open {
            Ok(open) if spares.held.is_none() => {
                spares.held = Some((made.path, open));
                None
            }
            Ok(_) => Some(made.path),
            // Removed already by `make`.
            Err(_) => {
                spares.failed_for = self.segments.back().map(|s| s.base);
                None
            }
        }
    }

    /// Rolls that created their file on the appending thread (no spare was ready).
    pub fn rolls_inline(&self) -> u64 {
        self.spares.rolls_inline
    }
}
