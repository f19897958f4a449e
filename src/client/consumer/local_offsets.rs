//! Offsets of a broadcasting consumer, kept by the consumer itself: every member reads
//! every queue, so the broker's one offset per (group, queue) cannot hold them. One JSON
//! file per (client id, group), `<dir>/<client id>/<group>.offsets.json`, rewritten whole
//! (temporary file, fsync, rename) so a crash leaves either the old or the new file.
//!
//! A file that exists but does not parse stops the consumer at start rather than being
//! ignored: starting over from `consume_from` would silently re-deliver or skip messages.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use serde::{Deserialize, Serialize};

use super::super::error::{ClientError, Result};
use super::MessageQueue;

/// Layout version of the file; a file of another version is refused.
const FILE_VERSION: u32 = 1;
/// Largest offsets file read at start: far above any real one (a queue takes ~60 bytes).
const FILE_BYTES_MAX: u64 = 64 << 20;

#[derive(Serialize, Deserialize)]
struct FileBody {
    version: u32,
    group: String,
    client_id: String,
    offsets: Vec<FileEntry>,
}

#[derive(Serialize, Deserialize)]
struct FileEntry {
    topic: String,
    queue_id: u32,
    offset: u64,
    /// The broker run the offset was read under ([`Position::incarnation`]); absent in
    /// files written before it was kept (0: unknown).
    #[serde(default)]
    incarnation: u64,
}

/// A queue's position as kept in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub offset: u64,
    /// The broker run (`PullResult::incarnation`) the offset was read under, 0 when
    /// unknown. A consumer that starts from it names that run in its pulls, so a broker
    /// that lost records past the offset in a crash sends it back to where the queue ended
    /// (the local twin of what the broker does to committed offsets at its start).
    pub incarnation: u64,
}

impl From<crate::protocol::Offset> for Position {
    /// An offset the broker answered, named by the run it was read under.
    fn from(o: crate::protocol::Offset) -> Position {
        Position {
            offset: o.offset,
            incarnation: o.incarnation,
        }
    }
}

/// The local offsets of one (client id, group).
#[derive(Debug)]
pub(crate) struct LocalOffsets {
    path: PathBuf,
    group: String,
    client_id: String,
    offsets: Mutex<BTreeMap<MessageQueue, Position>>,
    dirty: AtomicBool,
}

/// A name that is safe as one path component: ASCII letters, digits, `-`, `_` and `.`
/// kept, anything else (path separators included) replaced by `_`, plus a hash of the
/// original when anything was replaced so two names never share a file.
fn file_component(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe == name && name != "." && name != ".." {
        safe
    } else {
        format!(
            "{safe}-{:016x}",
            super::super::route::fnv1a_64(name.as_bytes())
        )
    }
}

/// One write of local offsets at a time in this process (see [`LocalOffsets::flush`]).
static ONE_WRITER: Mutex<()> = Mutex::new(());

/// The offsets files open in this process, by path ([`LocalOffsets::open_shared`]).
static OPEN: Mutex<BTreeMap<PathBuf, Weak<LocalOffsets>>> = Mutex::new(BTreeMap::new());

/// The file a write of `path` by process `pid` goes through before it is renamed.
fn temp_path(path: &Path, pid: u32) -> PathBuf {
    path.with_extension(format!("json.{pid}.tmp"))
}

/// Removes what writes of `path` left when their process died between creating the
/// temporary file and renaming it (best effort: a file that cannot be removed stays).
fn remove_dead_writers_files(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let pid = file_name
            .to_str()
            .and_then(|f| f.strip_prefix(name))
            .and_then(|f| f.strip_prefix('.'))
            .and_then(|f| f.strip_suffix(".tmp"))
            .and_then(|f| f.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> ClientError {
    ClientError::OffsetStore(format!("{what} {}: {e}", path.display()))
}

impl LocalOffsets {
    /// The default directory: `~/.ringmq/offsets`, or `<temp dir>/ringmq-offsets` when
    /// there is no home directory.
    pub(crate) fn default_dir() -> PathBuf {
        match std::env::var_os("HOME") {
            Some(home) if !home.is_empty() => PathBuf::from(home).join(".ringmq").join("offsets"),
            _ => std::env::temp_dir().join("ringmq-offsets"),
        }
    }

    /// [`open`](Self::open), shared by the consumers of this process that name the same
    /// file (one group and client id): each holding its own copy, each flush wrote its own
    /// topics' positions over the other's, and a restart started those from
    /// `consume_from`, skipping what was sent meanwhile.
    pub(crate) fn open_shared(
        dir: &Path,
        client_id: &str,
        group: &str,
    ) -> Result<Arc<LocalOffsets>> {
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        let path = Self::path_of(dir, client_id, group);
        if let Some(live) = open.get(&path).and_then(Weak::upgrade) {
            return Ok(live);
        }
        open.retain(|_, w| w.strong_count() > 0);
        let opened = Arc::new(Self::open(dir, client_id, group)?);
        open.insert(path, Arc::downgrade(&opened));
        Ok(opened)
    }

    fn path_of(dir: &Path, client_id: &str, group: &str) -> PathBuf {
        dir.join(file_component(client_id))
            .join(format!("{}.offsets.json", file_component(group)))
    }

    /// Opens (reading it when it exists) the offsets file of `client_id` in `group`.
    pub(crate) fn open(dir: &Path, client_id: &str, group: &str) -> Result<LocalOffsets> {
        let path = Self::path_of(dir, client_id, group);
        remove_dead_writers_files(&path);
        let mut offsets = BTreeMap::new();
        match std::fs::metadata(&path) {
            Ok(meta) if meta.len() > FILE_BYTES_MAX => {
                return Err(ClientError::OffsetStore(format!(
                    "{} is {} bytes, more than the {FILE_BYTES_MAX} an offsets file may have",
                    path.display(),
                    meta.len()
                )))
            }
            Ok(_) => {
                let text = std::fs::read(&path).map_err(|e| io_error("reading", &path, e))?;
                let body: FileBody = serde_json::from_slice(&text).map_err(|e| {
                    ClientError::OffsetStore(format!(
                        "{} does not parse ({e}); move it away to start from consume_from",
                        path.display()
                    ))
                })?;
                if body.version != FILE_VERSION {
                    return Err(ClientError::OffsetStore(format!(
                        "{} has version {}, this client reads version {FILE_VERSION}",
                        path.display(),
                        body.version
                    )));
                }
                for e in body.offsets {
                    let position = Position {
                        offset: e.offset,
                        incarnation: e.incarnation,
                    };
                    offsets.insert(MessageQueue::new(e.topic, e.queue_id), position);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Said: a member whose client id changes from run to run (the default one
                // does) starts each run here, and whatever was sent while it was down is
                // not delivered to it.
                crate::warn!(
                    "ringmq broadcasting consumer {client_id} of group {group}: no earlier \
                     positions ({} does not exist): every queue starts from consume_from; \
                     give the member a client id that stays the same across runs to resume \
                     where it stopped",
                    path.display()
                );
            }
            Err(e) => return Err(io_error("reading", &path, e)),
        }
        // Written again by the first flush (the consumer's start), so that a directory it
        // cannot be written in is found then, not once positions are lost.
        Ok(LocalOffsets {
            path,
            group: group.to_owned(),
            client_id: client_id.to_owned(),
            offsets: Mutex::new(offsets),
            dirty: AtomicBool::new(true),
        })
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn get(&self, queue: &MessageQueue) -> Option<Position> {
        self.lock().get(queue).copied()
    }

    /// The topics with a position of any queue: taken when a consumer starts, a topic
    /// among them whose queue has none was not there when the consumer last ran (its
    /// start position is written before it is consumed), and holds nothing older than that
    /// run. (Taken at the start, not looked up later: a queue whose start is slow to be
    /// read would be taken for a new one once another queue of its topic set a position.)
    pub(crate) fn topics(&self) -> BTreeSet<String> {
        self.lock().keys().map(|q| q.topic.clone()).collect()
    }

    /// Records a queue's position; written to disk by the next [`flush`](Self::flush).
    pub(crate) fn set(&self, queue: &MessageQueue, position: Position) {
        let mut offsets = self.lock();
        if offsets.get(queue) != Some(&position) {
            offsets.insert(queue.clone(), position);
            self.dirty.store(true, Ordering::SeqCst);
        }
    }

    /// Writes the file when a position changed since the last write.
    pub(crate) fn flush(&self) -> Result<()> {
        // The positions are taken and written under it: the last file renamed into place
        // holds the newest (the committer and a rebalance may flush at once, and two
        // consumers of one group and client id in one process share the file).
        let _one_writer = ONE_WRITER.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.dirty.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        let body = FileBody {
            version: FILE_VERSION,
            group: self.group.clone(),
            client_id: self.client_id.clone(),
            offsets: self
                .lock()
                .iter()
                .map(|(q, position)| FileEntry {
                    topic: q.topic.clone(),
                    queue_id: q.queue_id,
                    offset: position.offset,
                    incarnation: position.incarnation,
                })
                .collect(),
        };
        let written = self.write(&body);
        if written.is_err() {
            // Try again on the next flush.
            self.dirty.store(true, Ordering::SeqCst);
        }
        written
    }

    fn write(&self, body: &FileBody) -> Result<()> {
        let text = serde_json::to_vec_pretty(body)
            .map_err(|e| ClientError::OffsetStore(format!("encoding offsets: {e}")))?;
        if let Some(dir) = self.path.parent() {
            create_dirs_durably(dir)?;
        }
        // One write at a time in this process (`ONE_WRITER`); other processes use their own.
        let tmp = temp_path(&self.path, std::process::id());
        let written = std::fs::File::create(&tmp)
            .map_err(|e| io_error("creating", &tmp, e))
            .and_then(|mut file| {
                file.write_all(&text)
                    .map_err(|e| io_error("writing", &tmp, e))?;
                file.sync_all().map_err(|e| io_error("syncing", &tmp, e))
            })
            .and_then(|()| {
                std::fs::rename(&tmp, &self.path)
                    .map_err(|e| io_error("renaming to", &self.path, e))
            })
            .and_then(|()| {
                // The new name is durable once its directory is synced.
                let dir = self.path.parent().unwrap_or(Path::new("."));
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| io_error("syncing", dir, e))
            });
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<MessageQueue, Position>> {
        // Nothing panics while holding it; a poisoned map still holds valid offsets.
        self.offsets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Creates `dir` and the directories above it that are missing, each made durable in the
/// directory that holds it (a name is durable once its directory is synced): a power loss
/// after the first write must not lose the file with the directory the write made.
fn create_dirs_durably(dir: &Path) -> Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| io_error("creating", dir, e))?;
    for made in missing.iter().rev() {
        let holder = match made.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(holder)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("syncing", holder, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> Position {
        Position {
            offset,
            incarnation: 0,
        }
    }

    /// A topic counts as known when the file named it at open, not once a position of it
    /// is set during this run (a queue whose start is slow to be read would otherwise be
    /// taken for one added while the consumer was down, and replayed from its start).
    #[test]
    fn a_topic_is_known_from_the_file_as_opened() {
        let dir = tempfile::tempdir().unwrap();
        let q = |t: &str, n| MessageQueue::new(t, n);
        let store = LocalOffsets::open(dir.path(), "c", "g").unwrap();
        let known = store.topics();
        store.set(&q("t", 0), at(5));
        assert!(!known.contains("t"), "set in this run");
        store.flush().unwrap();
        let store = LocalOffsets::open(dir.path(), "c", "g").unwrap();
        assert_eq!(store.topics(), BTreeSet::from(["t".to_owned()]));
    }

    /// The first write makes every missing directory above the file (each synced in the
    /// one holding it); a directory that is there already is left alone.
    #[test]
    fn a_first_write_makes_the_missing_directories() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a").join("b");
        let store = LocalOffsets::open(&deep, "c", "g").unwrap();
        store.set(&MessageQueue::new("t", 0), at(3));
        store.flush().unwrap();
        let again = LocalOffsets::open(&deep, "c", "g").unwrap();
        assert_eq!(again.topics(), BTreeSet::from(["t".to_owned()]));
        create_dirs_durably(dir.path()).unwrap();
    }

    #[test]
    fn offsets_survive_a_reopen_and_names_stay_apart() {
        let dir = tempfile::tempdir().unwrap();
        let q = |t: &str, n| MessageQueue::new(t, n);
        let store = LocalOffsets::open(dir.path(), "client/1", "group a").unwrap();
        assert_eq!(store.get(&q("t", 0)), None);
        store.set(&q("t", 0), at(5));
        let read_under_run_9 = Position {
            offset: 7,
            incarnation: 9,
        };
        store.set(&q("t", 3), read_under_run_9);
        store.flush().unwrap();
        store.set(&q("t", 0), at(6));
        store.flush().unwrap();
        assert!(store.path().starts_with(dir.path()));

        let again = LocalOffsets::open(dir.path(), "client/1", "group a").unwrap();
        assert_eq!(again.get(&q("t", 0)), Some(at(6)));
        assert_eq!(again.get(&q("t", 3)), Some(read_under_run_9));
        // Another client id or group: another file.
        let other = LocalOffsets::open(dir.path(), "client_1", "group a").unwrap();
        assert_eq!(other.get(&q("t", 0)), None);
        assert_ne!(other.path(), again.path());
        assert_eq!(
            file_component(".."),
            format!("..-{:016x}", super::super::super::route::fnv1a_64(b".."))
        );
    }

    #[test]
    fn a_dead_writers_temporary_file_is_removed_at_open_and_a_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalOffsets::open(dir.path(), "c", "g").unwrap();
        store.set(&MessageQueue::new("t", 0), at(4));
        store.flush().unwrap();
        // No process has this id (above any pid_max); this test's process is alive.
        let dead = temp_path(store.path(), 999_999_999);
        let live = temp_path(store.path(), std::process::id());
        std::fs::write(&dead, b"{").unwrap();
        std::fs::write(&live, b"{").unwrap();
        let again = LocalOffsets::open(dir.path(), "c", "g").unwrap();
        assert_eq!(again.get(&MessageQueue::new("t", 0)), Some(at(4)));
        assert!(
            !dead.exists(),
            "a dead writer's file stays: {}",
            dead.display()
        );
        assert!(live.exists(), "a live writer's file was removed");
    }

    #[test]
    fn a_damaged_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalOffsets::open(dir.path(), "c", "g").unwrap();
        store.set(&MessageQueue::new("t", 0), at(1));
        store.flush().unwrap();
        std::fs::write(store.path(), b"{not json").unwrap();
        match LocalOffsets::open(dir.path(), "c", "g") {
            Err(ClientError::OffsetStore(why)) => assert!(why.contains("offsets.json"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Consumers of one group and client id in one process share one copy of the file:
    /// each one's flush writes the other's positions too.
    #[test]
    fn consumers_of_one_file_in_a_process_share_its_positions() {
        let dir = tempfile::tempdir().unwrap();
        let x = LocalOffsets::open_shared(dir.path(), "c", "g").unwrap();
        let y = LocalOffsets::open_shared(dir.path(), "c", "g").unwrap();
        let other = LocalOffsets::open_shared(dir.path(), "c2", "g").unwrap();
        assert!(!Arc::ptr_eq(&x, &other));
        y.set(&MessageQueue::new("b", 0), at(3));
        x.set(&MessageQueue::new("a", 0), at(5));
        x.flush().unwrap();
        drop((x, y));
        // Once both went, the next open reads the file: both topics are there.
        let again = LocalOffsets::open_shared(dir.path(), "c", "g").unwrap();
        assert_eq!(again.topics(), BTreeSet::from(["a".into(), "b".into()]));
        assert_eq!(again.get(&MessageQueue::new("b", 0)), Some(at(3)));
        let also = LocalOffsets::open_shared(dir.path(), "c", "g").unwrap();
        assert!(Arc::ptr_eq(&again, &also));
    }

    #[test]
    fn a_file_written_before_runs_were_kept_reads_with_an_unknown_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = LocalOffsets::open(dir.path(), "c", "g")
            .unwrap()
            .path()
            .to_owned();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let old = r#"{"version":1,"group":"g","client_id":"c",
            "offsets":[{"topic":"t","queue_id":2,"offset":11}]}"#;
        std::fs::write(&path, old).unwrap();
        let store = LocalOffsets::open(dir.path(), "c", "g").unwrap();
        assert_eq!(store.get(&MessageQueue::new("t", 2)), Some(at(11)));
    }
}
