//! Spare files: an index's next file (a consume queue's, the key index's), made ahead off
//! the appending thread under a name of its own, that the roll takes as its next file
//! instead of creating, sizing, mapping and allocating one on the appending thread. The
//! roll makes no file-system call: the file keeps its spare's name until the next
//! checkpoint links it at its numbered name ([`crate::index::DirtyFile::sync`]), and the
//! index removes the spare's name once told so.
//!
//! A spare is tied to no position (cut-backs and restarts of its index do not stale it) and
//! never carries a numbered name, so recovery cannot take it for one of the index's files:
//! opening an index removes any spare it finds in its directory.

use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use super::{io_err, map_file, next_serial, remove_file, Backing, IndexError};

/// Names of spare files start with this.
pub(super) const SPARE_PREFIX: &str = "spare-";

/// An empty file of an index's size to make in the blocking pool.
#[derive(Debug)]
pub struct SpareFile {
    pub(super) path: PathBuf,
    /// The [`Spares`] it is for (an index opened again on the directory refuses it).
    owner: u64,
    file_bytes: u64,
    /// Bytes allocated from the start (at least a page).
    first_bytes: u64,
    /// The roll it was asked for (its index's key for it).
    roll: u64,
}

/// A spare's file, mapped, with what is allocated of it.
pub(super) struct MappedFile {
    pub(super) backing: Backing,
    pub(super) mmap: MmapMut,
}

/// A [`SpareFile`] made (or not), to hand back to its index.
pub struct MadeSpare {
    path: PathBuf,
    owner: u64,
    roll: u64,
    made: Result<MappedFile, IndexError>,
}

impl SpareFile {
    /// Creates the file (a new name: never one of the index's), sizes and maps it and
    /// allocates its first bytes. Blocks. A file created here that could not be made whole
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
            backing.ensure_prefix(self.first_bytes, &self.path)?;
            Ok(MappedFile { backing, mmap })
        });
        if made.is_err() && created_here {
            let _ = remove_file(&self.path);
        }
        MadeSpare {
            path: self.path,
            owner: self.owner,
            roll: self.roll,
            made,
        }
    }
}

impl MadeSpare {
    /// Why it could not be made, if it could not.
    pub fn failure(&self) -> Option<&IndexError> {
        self.made.as_ref().err()
    }

    /// Where it is: to remove when no index takes it.
    pub fn into_path(self) -> PathBuf {
        self.path
    }
}

/// An index's spare, and the asks for one (`ConsumeQueue::spares`, `KeyIndex::spares`).
pub struct Spares {
    /// Tells this index apart from any other opened in this process.
    owner: u64,
    /// A [`SpareFile`] is out.
    out: bool,
    /// The roll (its index's key for it) a spare asked for then could not be made for: none
    /// is asked again until the next roll (a full disk would fail every one).
    failed_for: Option<u64>,
    /// The spare made, mapped, for the next roll.
    held: Option<(PathBuf, MappedFile)>,
    /// Rolls that had no spare and created their file.
    rolls_inline: u64,
}

impl Spares {
    pub(super) fn new() -> Spares {
        Spares {
            owner: next_serial(),
            out: false,
            failed_for: None,
            held: None,
            rolls_inline: 0,
        }
    }

    pub(super) fn held(&self) -> bool {
        self.held.is_some()
    }

    /// A spare asked for is out, not yet handed back.
    pub fn out(&self) -> bool {
        self.out
    }

    /// A spare to make in `dir`, asked for the roll `roll` names (the base or number of the
    /// index's last file), unless one is held or out, or one failed for that roll.
    pub(super) fn ask(
        &mut self,
        dir: &Path,
        roll: u64,
        file_bytes: u64,
        first_bytes: u64,
    ) -> Option<SpareFile> {
        if self.held.is_some() || self.out || self.failed_for == Some(roll) {
            return None;
        }
        self.out = true;
        let name = format!("{SPARE_PREFIX}{:x}-{:x}", self.owner, next_serial());
        Some(SpareFile {
            path: dir.join(name),
            owner: self.owner,
            file_bytes,
            first_bytes,
            roll,
        })
    }

    /// Takes a spare made for this index and keeps it for the next roll. Returns the path
    /// of a file the index does not take, for the caller to remove off its thread: one made
    /// for another index opened on this directory before, or one more than it holds.
    pub fn made(&mut self, made: MadeSpare) -> Option<PathBuf> {
        if made.owner != self.owner {
            return Some(made.path);
        }
        self.out = false;
        match made.made {
            Ok(file) if self.held.is_none() => {
                self.held = Some((made.path, file));
                None
            }
            Ok(_) => Some(made.path),
            // Removed already by `make`.
            Err(_) => {
                self.failed_for = Some(made.roll);
                None
            }
        }
    }

    /// Gives the spare up (an idle queue, a store closing): its path, for the caller to
    /// remove off its thread.
    pub fn give_up(&mut self) -> Option<PathBuf> {
        self.held.take().map(|(path, _)| path)
    }

    /// The spare for a roll, with its path (the file is named there until a checkpoint
    /// links it at its numbered name); `None` if there is none, when the roll creates the
    /// file itself (counted if `rolling`: a consume queue's first file is not, as
    /// `open_queues` creates it off the thread).
    pub(super) fn take(&mut self, rolling: bool) -> Option<(PathBuf, MappedFile)> {
        let taken = self.held.take();
        if taken.is_none() && rolling {
            self.rolls_inline += 1;
        }
        taken
    }

    /// Rolls that created their file on the appending thread (no spare was ready).
    pub fn rolls_inline(&self) -> u64 {
        self.rolls_inline
    }
}

/// Removes the spares among `others` (an index directory's entries with other names than
/// numbered files): an earlier run's, or an index's opened here before; none holds them.
pub(super) fn remove_leftovers(others: Vec<PathBuf>) -> Result<(), IndexError> {
    for path in others {
        let name = path.file_name().and_then(|n| n.to_str());
        if name.is_some_and(|n| n.starts_with(SPARE_PREFIX)) {
            remove_file(&path)?;
        }
    }
    Ok(())
}
