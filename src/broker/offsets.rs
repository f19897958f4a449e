//! Committed consumer offsets per (group, topic, queue), kept by the shard that owns the
//! queue. An append-only file of checksummed records (last one wins), replayed at start and
//! compacted when it grows; in sync flush mode every commit is fdatasynced before it is
//! acknowledged, in async mode the file is synced in the background.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Rewrite the file as a snapshot once it is this large.
const OFFSETS_FILE_BYTES_MAX: u64 = 4 << 20;
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RMQO");

type Key = (String, String, u32);

pub struct OffsetStore {
    path: PathBuf,
    file: std::fs::File,
    offsets: HashMap<Key, u64>,
    file_bytes: u64,
    /// Commits written / commits covered by a finished fdatasync.
    written_gen: u64,
    synced_gen: u64,
}

fn encode(group: &str, topic: &str, queue_id: u32, offset: u64, out: &mut Vec<u8>) {
    // Callers validate names (groups up to 255 bytes, topics up to 127): the u16 lengths
    // below cannot wrap.
    assert!(group.len() <= u16::MAX as usize && topic.len() <= u16::MAX as usize);
    let start = out.len();
    out.extend_from_slice(&[0u8; 12]);
    out.extend_from_slice(&(group.len() as u16).to_le_bytes());
    out.extend_from_slice(group.as_bytes());
    out.extend_from_slice(&(topic.len() as u16).to_le_bytes());
    out.extend_from_slice(topic.as_bytes());
    out.extend_from_slice(&queue_id.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    let len = (out.len() - start) as u32;
    let crc = crc32c::crc32c(&out[start + 12..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes records until the first incomplete or bad one (a torn tail after a crash).
fn replay(bytes: &[u8], offsets: &mut HashMap<Key, u64>) -> usize {
    let mut at = 0;
    loop {
        let rest = &bytes[at..];
        if rest.len() < 12 {
            return at;
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let magic = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let crc = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]);
        if magic != RECORD_MAGIC
            || len < 12 + 16
            || len > rest.len()
            || crc32c::crc32c(&rest[12..len]) != crc
        {
            return at;
        }
        let body = &rest[12..len];
        let parse = || -> Option<(Key, u64)> {
            let glen = u16::from_le_bytes([*body.first()?, *body.get(1)?]) as usize;
            let group = std::str::from_utf8(body.get(2..2 + glen)?).ok()?;
            let p = 2 + glen;
            let tlen = u16::from_le_bytes([*body.get(p)?, *body.get(p + 1)?]) as usize;
            let topic = std::str::from_utf8(body.get(p + 2..p + 2 + tlen)?).ok()?;
            let p = p + 2 + tlen;
            let q = u32::from_le_bytes(body.get(p..p + 4)?.try_into().ok()?);
            let o = u64::from_le_bytes(body.get(p + 4..p + 12)?.try_into().ok()?);
            Some(((group.to_owned(), topic.to_owned(), q), o))
        };
        // A record whose length and CRC check out but whose body does not parse was
        // written by a buggy version: skip it rather than drop everything after it.
        if let Some((k, o)) = parse() {
            offsets.insert(k, o);
        }
        at += len;
    }
}

impl OffsetStore {
    pub fn open(dir: &Path) -> std::io::Result<OffsetStore> {
        let path = dir.join("offsets.log");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("read {}: {e}", path.display()),
                ))
            }
        };
        let mut offsets = HashMap::new();
        replay(&bytes, &mut offsets);
        let mut store = OffsetStore {
            file: std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?,
            path,
            offsets,
            file_bytes: 0,
            written_gen: 0,
            synced_gen: 0,
        };
        store.compact()?;
        Ok(store)
    }

    /// Rewrites the file as one record per key (atomically).
    fn compact(&mut self) -> std::io::Result<()> {
        let mut out = Vec::new();
        for ((g, t, q), o) in &self.offsets {
            encode(g, t, *q, *o, &mut out);
        }
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        self.file = std::fs::OpenOptions::new().append(true).open(&self.path)?;
        self.file_bytes = out.len() as u64;
        self.synced_gen = self.written_gen;
        Ok(())
    }

    pub fn get(&self, group: &str, topic: &str, queue_id: u32) -> Option<u64> {
        self.offsets
            .get(&(group.to_owned(), topic.to_owned(), queue_id))
            .copied()
    }

    /// Records a commit (written to the file, not yet synced: see
    /// [`sync_handle`](Self::sync_handle)). A committed offset never moves backwards: a lower
    /// commit (a late answer from a member that lost the queue) is ignored. Returns the
    /// offset now committed.
    pub fn commit(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> std::io::Result<u64> {
        match self.get(group, topic, queue_id) {
            Some(cur) if cur >= offset => Ok(cur),
            _ => self.reset(group, topic, queue_id, offset).map(|_| offset),
        }
    }

    /// Sets an offset, backwards too (an explicit reset).
    pub fn reset(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> std::io::Result<()> {
        let mut rec = Vec::with_capacity(64);
        encode(group, topic, queue_id, offset, &mut rec);
        self.file.write_all(&rec)?;
        self.file_bytes += rec.len() as u64;
        self.offsets
            .insert((group.to_owned(), topic.to_owned(), queue_id), offset);
        self.written_gen += 1;
        if self.file_bytes > OFFSETS_FILE_BYTES_MAX {
            self.compact()?;
        }
        Ok(())
    }

    /// Removes every offset of a topic (topic deleted).
    pub fn forget_topic(&mut self, topic: &str) -> std::io::Result<()> {
        self.offsets.retain(|(_, t, _), _| t != topic);
        self.compact()
    }

    pub fn is_dirty(&self) -> bool {
        self.written_gen > self.synced_gen
    }

    /// A handle to fdatasync the file off the shard's thread, and the generation it will
    /// cover: pass it to [`synced`](Self::synced) once the fdatasync succeeded.
    pub fn sync_handle(&mut self) -> std::io::Result<(std::fs::File, u64)> {
        Ok((self.file.try_clone()?, self.written_gen))
    }

    /// Records a successful fdatasync that covered commits up to `generation`.
    pub fn synced(&mut self, generation: u64) {
        self.synced_gen = self.synced_gen.max(generation);
    }

    /// All offsets of a group (consumer progress).
    pub fn of_group(&self, group: &str) -> Vec<(String, u32, u64)> {
        let mut v: Vec<_> = self
            .offsets
            .iter()
            .filter(|((g, _, _), _)| g == group)
            .map(|((_, t, q), o)| (t.clone(), *q, *o))
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_survive_reopen_and_torn_tails() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g", "t", 1, 10).unwrap();
        s.commit("g", "t", 1, 12).unwrap();
        assert_eq!(s.commit("g", "t", 1, 11).unwrap(), 12, "never backwards");
        s.commit("g2", "t", 0, 5).unwrap();
        s.reset("g2", "t", 0, 3).unwrap();
        drop(s);
        // A torn last record is ignored; the earlier ones stay.
        let path = dir.path().join("offsets.log");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[40, 0, 0, 0, 1, 2]);
        std::fs::write(&path, &bytes).unwrap();
        let s = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(s.get("g", "t", 1), Some(12));
        assert_eq!(s.get("g2", "t", 0), Some(3), "a reset may go backwards");
        assert_eq!(s.get("g", "t", 0), None);
    }
}
