//! Index files written since they were last synced, and the sync that makes them durable
//! (the store's checkpoint runs it off the shard's thread, one file at a time).

use std::path::{Path, PathBuf};

use super::{io_err, remove_file, IndexError};

/// An index file written since it was last synced (see `ConsumeQueue::dirty_files`,
/// `KeyIndex::dirty_files`).
#[derive(Debug, Clone)]
pub struct DirtyFile {
    /// Where the file is now: its numbered name, or a spare's name while `link_to` is set.
    pub path: PathBuf,
    /// Which file of its index (a consume queue's base offset, a key index's sequence).
    pub key: u64,
    /// The change it was at when listed.
    pub generation: u64,
    /// Which file exactly (a consume-queue file popped and made again at the same base is
    /// another); 0 for the key index's, told apart by `key`.
    pub serial: u64,
    /// Its name is new since it was last synced (created, or a spare taken by a roll):
    /// the directory must be synced too, as syncing the file's data need not carry it.
    pub name_unsynced: bool,
    /// A spare taken by a roll still carries its spare's name (a roll does no file-system
    /// call): the sync gives it its numbered name, this path, first. Until then a crash
    /// loses the file (an index's open removes spares), which is why the checkpoint, not
    /// the roll, names it: the log is replayed from the last checkpoint.
    pub link_to: Option<PathBuf>,
}

impl DirtyFile {
    /// Makes the file durable under its numbered name: names it (a hard link, so `path`
    /// stays valid for its index until it takes the new name), fdatasyncs it and, for a new
    /// name, syncs its directory and the two above (a queue's first file comes with its
    /// directory, a topic's first queue with the topic's). Blocks. A file gone meanwhile
    /// (retention, a deleted topic, a cut) is skipped: `Ok(false)`. A spare's name gone because its index named the file itself
    /// meanwhile (a roll that created its file, another checkpoint) is no reason to skip:
    /// the numbered name is synced.
    pub fn sync(&self) -> std::io::Result<bool> {
        if failing(&self.path) {
            let injected = std::io::Error::other("injected failure");
            return Err(writeback_failed(&self.path, injected));
        }
        if let Some(to) = &self.link_to {
            if !link(&self.path, to)? && !to.exists() {
                return Ok(false);
            }
        }
        let at = self.link_to.as_deref().unwrap_or(&self.path);
        match std::fs::File::open(at) {
            Ok(f) => f.sync_data().map_err(|e| writeback_failed(at, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        }
        if self.name_unsynced || self.link_to.is_some() {
            // Up to the directory holding a new topic's (consumequeue/ for a queue's file).
            for dir in at.ancestors().skip(1).take(3) {
                match std::fs::File::open(dir) {
                    Ok(d) => d.sync_all()?,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(true)
    }
}

/// An index file's fdatasync failed: the writeback of some of its pages may have failed,
/// and Linux marks those pages clean, so a later fdatasync succeeds without them. (Any
/// other failure of a sync, such as opening the file or linking it, leaves the pages dirty:
/// a later sync writes them.)
#[derive(Debug, thiserror::Error)]
#[error("fdatasync {}: {source}", path.display())]
pub struct WritebackFailed {
    pub path: PathBuf,
    pub source: std::io::Error,
}

fn writeback_failed(path: &Path, source: std::io::Error) -> std::io::Error {
    std::io::Error::new(
        source.kind(),
        WritebackFailed {
            path: path.to_owned(),
            source,
        },
    )
}

/// Whether `e` is an index file's failed fdatasync ([`WritebackFailed`]).
pub fn is_writeback_failure(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<WritebackFailed>())
}

/// Testing: index files under these directories fail to sync, process-wide (syncs run in
/// the blocking pool, where a thread-local fault would not reach).
static FAIL_SYNCS_UNDER: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Testing: makes every later sync of an index file under `dir` fail (`fail`), or no longer
/// (`!fail`). Checked once per file a checkpoint syncs.
#[doc(hidden)]
pub fn testing_fail_syncs_under(dir: &Path, fail: bool) {
    let mut dirs = FAIL_SYNCS_UNDER.lock().unwrap_or_else(|e| e.into_inner());
    dirs.retain(|d| d != dir);
    if fail {
        dirs.push(dir.to_owned());
    }
}

fn failing(path: &Path) -> bool {
    let dirs = FAIL_SYNCS_UNDER.lock().unwrap_or_else(|e| e.into_inner());
    !dirs.is_empty() && dirs.iter().any(|d| path.starts_with(d))
}

/// Syncs `dirty` as the store's checkpoint does (each must sync), hands it to
/// `files_synced` and removes the spares' names it gives back. For the indexes' tests.
#[cfg(test)]
pub(super) fn sync_as_checkpoint(
    dirty: Vec<DirtyFile>,
    files_synced: impl FnOnce(&[DirtyFile]) -> Vec<PathBuf>,
) {
    for f in &dirty {
        assert!(f.sync().expect("synced"), "{f:?} gone");
    }
    for path in files_synced(&dirty) {
        std::fs::remove_file(path).expect("a spare's name removed");
    }
}

/// Gives a file at `path` (a spare's name) its numbered name `link_to`, if it has one to
/// get, on the calling thread: a link, then the spare's name removed. Blocks.
pub(super) fn name_now(
    path: &mut PathBuf,
    link_to: &mut Option<PathBuf>,
) -> Result<(), IndexError> {
    let Some(to) = link_to.as_ref() else {
        return Ok(());
    };
    let linked = link(path, to).map_err(io_err("link", to))?;
    if !linked {
        return Err(io_err("link", path)(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "an index file vanished before it was named",
        )));
    }
    remove_file(path)?;
    if let Some(to) = link_to.take() {
        *path = to;
    }
    Ok(())
}

/// A file of an index at `path` (with `link_to` its numbered name to get, if any) was
/// synced as `synced` listed it: if that named it, it takes the numbered name, and the
/// spare's name is returned for the caller to remove.
pub(super) fn took_name(
    path: &mut PathBuf,
    link_to: &mut Option<PathBuf>,
    synced: &DirtyFile,
) -> Option<PathBuf> {
    if synced.link_to.is_none() || *link_to != synced.link_to {
        return None;
    }
    link_to.take().map(|to| std::mem::replace(path, to))
}

/// Hard-links `from` at `to`; `Ok(false)` if `from` is gone. A `to` that is `from`'s file
/// already (an earlier sync linked it) is fine; another file there is an error.
pub(super) fn link(from: &Path, to: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::hard_link(from, to) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let from_meta = match std::fs::metadata(from) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(e),
            };
            let to_meta = std::fs::metadata(to)?;
            if (from_meta.dev(), from_meta.ino()) == (to_meta.dev(), to_meta.ino()) {
                Ok(true)
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!(
                        "naming {} {}: another file has that name",
                        from.display(),
                        to.display()
                    ),
                ))
            }
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a failed fdatasync of the file counts as a writeback failure (the checkpoint
    /// stays held for it); a file that cannot be opened or linked is synced next time.
    #[test]
    fn only_a_failed_fdatasync_is_a_writeback_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0");
        std::fs::write(&path, b"x").unwrap();
        let file = DirtyFile {
            path: path.clone(),
            key: 0,
            generation: 1,
            serial: 0,
            name_unsynced: true,
            link_to: None,
        };
        assert!(file.sync().unwrap());
        testing_fail_syncs_under(dir.path(), true);
        let failed = file.sync().unwrap_err();
        testing_fail_syncs_under(dir.path(), false);
        assert!(is_writeback_failure(&failed), "{failed}");
        assert!(failed.to_string().contains("fdatasync"), "{failed}");
        // Another file at its numbered name: it cannot be named.
        let taken = dir.path().join("1");
        std::fs::write(&taken, b"y").unwrap();
        let unnamed = DirtyFile {
            link_to: Some(taken),
            ..file
        };
        let failed = unnamed.sync().unwrap_err();
        assert!(!is_writeback_failure(&failed), "{failed}");
    }
}
