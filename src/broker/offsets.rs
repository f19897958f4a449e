//! Committed consumer offsets per (group, topic, queue), kept by the shard that owns the
//! queue. An append-only file of checksummed records (last one wins), replayed at start and
//! rewritten as a snapshot when it grows.
//!
//! The map changes at once; the file is written by [`crate::broker::ShardCtx::flush_offsets`]
//! off the shard's thread, one write at a time, in order. The map is persistent
//! ([`imbl::HashMap`]): a snapshot takes a clone of it (a pointer copy; changes after it
//! copy the nodes they touch) and is encoded off the shard's thread too, however many
//! offsets there are (up to `--offsets-max` per shard). A commit is fdatasynced before it
//! is acknowledged in sync flush mode, and so is a queue's first offset in async mode (a
//! retry of that commit, or a query of the offset, waits for its sync too); any other
//! async commit is written before it is acknowledged (a process kill keeps it) and
//! fdatasynced in the background. At open, a bad stretch with whole records after it
//! (damage, or a crash that kept later pages of its last writes and not earlier ones) is
//! skipped with a warning and the file as found kept beside it; a torn tail is cut. A
//! failed fdatasync has the file written whole again. This module is the state and the encoding; it does file I/O only when it
//! opens (before the shard serves) and in the [`OffsetsIo`] jobs it hands out.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rewrite the file as a snapshot once it is this large, and twice its last snapshot (so
/// rewrites stay rare, amortized over the appends, however many offsets there are).
const OFFSETS_FILE_BYTES_MAX: u64 = 4 << 20;
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RMQO");
/// The queue id of a record that keeps a reset's fence (its offset: the epoch), not an
/// offset: no queue has it (a topic has at most 1,024).
const FENCE_QUEUE: u32 = u32::MAX;

type Key = (String, String, u32);
type Offsets = imbl::HashMap<Key, u64>;
/// group → topic → the epoch of its latest reset.
type Fences = HashMap<String, HashMap<String, u64>>;

pub struct OffsetStore {
    path: PathBuf,
    /// The file records are appended to (replaced when the file is rewritten).
    file: Arc<std::fs::File>,
    offsets: Offsets,
    /// Offsets kept per group (bounded by `--groups-max`).
    groups: HashMap<String, usize>,
    /// Records encoded but not yet written.
    pending: Vec<u8>,
    /// Bytes in the file, written or pending.
    file_bytes: u64,
    /// Bytes of the last snapshot written.
    snapshot_bytes: u64,
    /// The next write rewrites the file as a snapshot (it grew, or a topic was forgotten).
    rewrite: bool,
    /// Per group and topic, the offsets epoch of the latest reset here: a member's position
    /// read under an earlier epoch may not be committed over the reset offsets. Set only
    /// for a topic with queues here and a group admitted to keep offsets here (bounded by
    /// `--groups-max`), before its offsets are written, and written with them (a record of
    /// queue [`FENCE_QUEUE`]), so a restart keeps it; forgotten with the topic or the group.
    reset_epochs: Fences,
    /// Offsets whose first record is not covered by an fdatasync yet, with the generation
    /// of that record: a commit or a query of one waits for the sync in async mode too (a
    /// member commits where it starts before consuming; a power loss that lost that would
    /// start the queue's next owner from its `consume_from`, past what came meanwhile).
    unsynced_firsts: HashMap<Key, u64>,
    /// Changes made / written to the file / covered by a finished fdatasync.
    changed_gen: u64,
    written_gen: u64,
    synced_gen: u64,
}

/// A write of the offsets file, to run off the shard's thread.
pub enum OffsetsIo {
    /// Append these records.
    Append {
        file: Arc<std::fs::File>,
        bytes: Vec<u8>,
    },
    /// Replace the file with a snapshot of these offsets and fences, encoded by the job
    /// (temporary file, fsync, rename, directory fsync).
    Rewrite {
        path: PathBuf,
        offsets: Offsets,
        fences: Fences,
    },
}

/// What a rewrite made: the new file to append to, and the size of its snapshot.
pub struct Rewritten {
    file: Arc<std::fs::File>,
    snapshot_bytes: u64,
}

impl OffsetsIo {
    /// Does the write; a rewrite gives the new file to append to.
    pub fn run(&self) -> std::io::Result<Option<Rewritten>> {
        match self {
            OffsetsIo::Append { file, bytes } => {
                let mut f: &std::fs::File = file;
                f.write_all(bytes)?;
                Ok(None)
            }
            OffsetsIo::Rewrite {
                path,
                offsets,
                fences,
            } => {
                let snapshot = snapshot(offsets, fences);
                crate::io::replace_file(path, &snapshot)?;
                let file = std::fs::OpenOptions::new().append(true).open(path)?;
                Ok(Some(Rewritten {
                    file: Arc::new(file),
                    snapshot_bytes: snapshot.len() as u64,
                }))
            }
        }
    }
}

/// Every offset and fence, encoded as the records of a new file.
fn snapshot(offsets: &Offsets, fences: &Fences) -> Vec<u8> {
    let mut out = Vec::with_capacity(offsets.len() * 64);
    for ((g, t, q), o) in offsets {
        encode(g, t, *q, *o, &mut out);
    }
    for (g, topics) in fences {
        for (t, epoch) in topics {
            encode(g, t, FENCE_QUEUE, *epoch, &mut out);
        }
    }
    out
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

fn count_groups(offsets: &Offsets) -> HashMap<String, usize> {
    let mut groups: HashMap<String, usize> = HashMap::new();
    for (g, _, _) in offsets.keys() {
        *groups.entry(g.clone()).or_default() += 1;
    }
    groups
}

/// The length of the whole, checked record `rest` starts with, if it starts with one.
fn record_len(rest: &[u8]) -> Option<usize> {
    if rest.len() < 12 {
        return None;
    }
    let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let magic = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
    let crc = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]);
    let whole = magic == RECORD_MAGIC && (12 + 16..=rest.len()).contains(&len);
    (whole && crc32c::crc32c(&rest[12..len]) == crc).then_some(len)
}

/// Where the first whole, checked record after byte `at` starts, if any: a replay that
/// stopped at `at` with one after it met damage, or a crash that wrote later pages of its
/// last writes and not earlier ones, not merely a torn tail.
fn record_after(bytes: &[u8], at: usize) -> Option<usize> {
    (at + 1..bytes.len().saturating_sub(12)).find(|&p| {
        bytes[p + 4..p + 8] == RECORD_MAGIC.to_le_bytes() && record_len(&bytes[p..]).is_some()
    })
}

/// Decodes records until the first incomplete or bad one (a torn tail after a crash):
/// offsets, and the fences of resets (the latest epoch of each group and topic).
fn replay(bytes: &[u8], offsets: &mut Offsets, fences: &mut Fences) -> usize {
    let mut at = 0;
    loop {
        let rest = &bytes[at..];
        let Some(len) = record_len(rest) else {
            return at;
        };
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
        match parse() {
            Some(((group, topic, FENCE_QUEUE), epoch)) => {
                let kept = fences.entry(group).or_default().entry(topic).or_default();
                *kept = (*kept).max(epoch);
            }
            Some((k, o)) => {
                offsets.insert(k, o);
            }
            None => {}
        }
        at += len;
    }
}

impl OffsetStore {
    /// Opens (or creates) the offsets file in `dir`, replays it and rewrites it as a
    /// snapshot. Runs at start-up, before the shard serves.
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
        let (mut offsets, mut reset_epochs) = (Offsets::new(), HashMap::new());
        // A torn last record (a crash during a write) ends the replay; it is dropped by
        // the snapshot below. A bad stretch with whole records after it (damage, or a crash
        // that kept later pages of its last writes and not earlier ones) is skipped, not
        // cut with them: the offsets after it stand. What it held is lost: said, and the
        // file as found is kept beside it.
        let mut end = replay(&bytes, &mut offsets, &mut reset_epochs);
        let mut skipped = Vec::new();
        while end < bytes.len() {
            let Some(next) = record_after(&bytes, end) else {
                crate::warn!(
                    "ringmq: {}: cut a torn tail of {} bytes at byte {end} (a crash during a write)",
                    path.display(),
                    bytes.len() - end
                );
                break;
            };
            skipped.push(format!("{end}..{next}"));
            end = next + replay(&bytes[next..], &mut offsets, &mut reset_epochs);
        }
        if !skipped.is_empty() {
            let at = crate::log::now_ms();
            let free = (0..1_000)
                .map(|n| dir.join(format!("offsets.log.damaged-{at}-{n}")))
                .find(|p| !p.exists());
            // Kept durably before the file is written over: else the start is refused, and
            // the only copy of what the damage left stays where it is.
            let keep = |p: &Path| -> std::io::Result<()> {
                let mut f = (std::fs::OpenOptions::new().write(true).create_new(true)).open(p)?;
                let written = (f.write_all(&bytes)).and_then(|()| f.sync_all());
                if written.is_err() {
                    // No partial copy left behind (each refused start would add one).
                    let _ = std::fs::remove_file(p);
                }
                written?;
                std::fs::File::open(dir)?.sync_all()
            };
            let kept = match free.map(|p| (keep(&p), p)) {
                Some((Ok(()), p)) => format!("the file as found is kept as {}", p.display()),
                Some((Err(e), p)) => {
                    return Err(std::io::Error::other(format!(
                        "{}: damaged (bytes {}), and keeping the file as found as {} failed: {e}; not rewritten, so the start is refused (free space for the copy; moving offsets.log away instead would start without any of its offsets)",
                        path.display(),
                        skipped.join(", "),
                        p.display()
                    )));
                }
                None => {
                    return Err(std::io::Error::other(format!(
                        "{}: damaged (bytes {}), and no free name to keep the file as found under (offsets.log.damaged-*); the start is refused",
                        path.display(),
                        skipped.join(", ")
                    )));
                }
            };
            crate::warn!(
                "ringmq: {}: bytes {} hold no whole record, with whole records after them (damage, or a crash that wrote later pages of its last writes and not earlier ones): skipped, and the offsets they held are lost (those groups start the queues from an earlier commit, or from their consume_from); {kept}",
                path.display(),
                skipped.join(", ")
            );
        }
        let mut store = OffsetStore {
            file: Arc::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)?,
            ),
            path,
            groups: count_groups(&offsets),
            offsets,
            pending: Vec::new(),
            file_bytes: 0,
            snapshot_bytes: 0,
            rewrite: true,
            reset_epochs,
            changed_gen: 0,
            written_gen: 0,
            synced_gen: 0,
            unsynced_firsts: HashMap::new(),
        };
        if let Some((io, generation)) = store.take_io() {
            let file = io.run()?;
            store.written(generation, file);
        }
        store.synced(store.written_gen);
        Ok(store)
    }

    /// Offsets kept (entries of (group, topic, queue); bounded by `--offsets-max`).
    pub fn count(&self) -> usize {
        self.offsets.len()
    }

    /// How many of `group`'s offsets of `queues` of `topic` are not kept yet (entries
    /// that setting them would add).
    pub fn missing(&self, group: &str, topic: &str, queues: &[u32]) -> usize {
        let mut key = (group.to_owned(), topic.to_owned(), 0);
        (queues.iter())
            .filter(|&&q| {
                key.2 = q;
                !self.offsets.contains_key(&key)
            })
            .count()
    }

    /// Groups with at least one offset kept.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Whether offsets of `group` are kept.
    pub fn has_group(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    pub fn get(&self, group: &str, topic: &str, queue_id: u32) -> Option<u64> {
        self.offsets
            .get(&(group.to_owned(), topic.to_owned(), queue_id))
            .copied()
    }

    /// Groups with an offset of `topic` kept here (once per offset).
    pub fn groups_of_topic<'a>(&'a self, topic: &'a str) -> impl Iterator<Item = &'a str> {
        (self.offsets.keys())
            .filter(move |(_, t, _)| t == topic)
            .map(|(g, _, _)| g.as_str())
    }

    /// Marks `group`'s offsets of `topic` here as reset at offsets epoch `epoch`, before
    /// the reset itself: commits of positions read under an earlier epoch are refused from
    /// now on. `Err` with the later epoch when a later reset got here first (this one
    /// must not overwrite its offsets: members re-read those under the later epoch).
    pub fn fence(&mut self, group: &str, topic: &str, epoch: u64) -> Result<(), u64> {
        let topics = self.reset_epochs.entry(group.to_owned()).or_default();
        let kept = topics.entry(topic.to_owned()).or_default();
        if *kept > epoch {
            return Err(*kept);
        }
        if *kept < epoch {
            *kept = epoch;
            self.append(group, topic, FENCE_QUEUE, epoch);
        }
        Ok(())
    }

    /// Every group's latest reset epoch here (of any topic).
    pub fn fences(&self) -> Vec<(String, u64)> {
        (self.reset_epochs.iter())
            .filter_map(|(group, topics)| Some((group.clone(), *topics.values().max()?)))
            .collect()
    }

    /// The epoch of the latest reset of `group`'s offsets of `topic` here, when a commit of
    /// a position read under `epoch` would undo it (`None` epoch: an admin's commit, never
    /// refused).
    pub fn refuses(&self, group: &str, topic: &str, epoch: Option<u64>) -> Option<u64> {
        let reset = *self.reset_epochs.get(group)?.get(topic)?;
        epoch.filter(|e| *e < reset).map(|_| reset)
    }

    /// Whether a reset of `group`'s offsets left a fence here.
    pub fn is_fenced(&self, group: &str) -> bool {
        self.reset_epochs.contains_key(group)
    }

    /// Forgets `group`'s reset epochs (with its offsets, or when it has none here); the
    /// file is rewritten without them. Returns the change's generation (0: none kept).
    pub fn unfence(&mut self, group: &str) -> u64 {
        if self.reset_epochs.remove(group).is_none() {
            return 0;
        }
        self.rewrite = true;
        self.changed_gen += 1;
        self.changed_gen
    }

    /// Records a commit; offsets never go backwards (a lower one is ignored). Returns the
    /// offset now committed and the change's generation (0: nothing changed).
    pub fn commit(&mut self, group: &str, topic: &str, queue_id: u32, offset: u64) -> (u64, u64) {
        match self.get(group, topic, queue_id) {
            Some(cur) if cur >= offset => (cur, 0),
            _ => (offset, self.reset(group, topic, queue_id, offset)),
        }
    }

    /// Sets an offset, backwards too (an admin reset). Returns the change's generation.
    pub fn reset(&mut self, group: &str, topic: &str, queue_id: u32, offset: u64) -> u64 {
        let key = (group.to_owned(), topic.to_owned(), queue_id);
        let first = self.offsets.insert(key.clone(), offset).is_none();
        let generation = self.append(group, topic, queue_id, offset);
        if first {
            *self.groups.entry(group.to_owned()).or_default() += 1;
            self.unsynced_firsts.insert(key, generation);
        }
        generation
    }

    /// Whether the first record of `group`'s offset of the queue waits for an fdatasync.
    pub fn is_unsynced_first(&self, group: &str, topic: &str, queue_id: u32) -> bool {
        !self.unsynced_firsts.is_empty()
            && (self.unsynced_firsts).contains_key(&(group.to_owned(), topic.to_owned(), queue_id))
    }

    /// Appends a record to write; returns the change's generation.
    fn append(&mut self, group: &str, topic: &str, queue_id: u32, value: u64) -> u64 {
        let before = self.pending.len();
        encode(group, topic, queue_id, value, &mut self.pending);
        self.file_bytes += (self.pending.len() - before) as u64;
        if self.file_bytes > OFFSETS_FILE_BYTES_MAX.max(2 * self.snapshot_bytes) {
            self.rewrite = true;
        }
        self.changed_gen += 1;
        self.changed_gen
    }

    /// Forgets every offset of a deleted topic (the file is rewritten without them).
    pub fn forget_topic(&mut self, topic: &str) -> u64 {
        self.offsets.retain(|(_, t, _), _| t != topic);
        self.groups = count_groups(&self.offsets);
        for topics in self.reset_epochs.values_mut() {
            topics.remove(topic);
        }
        self.reset_epochs.retain(|_, topics| !topics.is_empty());
        self.rewrite = true;
        self.changed_gen += 1;
        self.changed_gen
    }

    /// Forgets every offset of a deleted group (the file is rewritten without them).
    pub fn forget_group(&mut self, group: &str) -> u64 {
        self.offsets.retain(|(g, _, _), _| g != group);
        self.groups.remove(group);
        self.unfence(group);
        self.rewrite = true;
        self.changed_gen += 1;
        self.changed_gen
    }

    /// The next write to do, and the generation it covers; `None` when all is written.
    pub fn take_io(&mut self) -> Option<(OffsetsIo, u64)> {
        if self.rewrite {
            // The snapshot holds every change so far: what is pending is not appended. Its
            // size is counted in `file_bytes` once it is written (`written`).
            self.rewrite = false;
            self.pending.clear();
            self.file_bytes = 0;
            let io = OffsetsIo::Rewrite {
                path: self.path.clone(),
                offsets: self.offsets.clone(),
                fences: self.reset_epochs.clone(),
            };
            return Some((io, self.changed_gen));
        }
        if self.pending.is_empty() {
            return None;
        }
        let io = OffsetsIo::Append {
            file: self.file.clone(),
            bytes: std::mem::take(&mut self.pending),
        };
        Some((io, self.changed_gen))
    }

    /// A write taken by [`take_io`](Self::take_io) failed: it is done again next time. An
    /// append may be in the file in part: the replay at the next start would stop at the
    /// record cut there, before everything appended after it (a later lowering or reset
    /// among them). The file is written whole again instead (the map holds every offset
    /// the lost bytes carried); so is a failed rewrite.
    pub fn write_failed(&mut self) {
        self.rewrite = true;
    }

    /// An fdatasync of the file failed: what it was to cover may never reach the disk,
    /// though a later fdatasync can succeed (the kernel reports a failed writeback once,
    /// and may drop the pages), so it is not tried again: the file is written whole
    /// again (a new file, synced before its rename).
    pub fn sync_failed(&mut self) {
        self.rewrite = true;
        self.written_gen = self.synced_gen;
    }

    /// Whether the changes up to `generation` are written (a process kill keeps them).
    pub fn is_written(&self, generation: u64) -> bool {
        self.written_gen >= generation
    }

    /// A write covering `generation` is done (`rewritten`: what a rewrite made).
    pub fn written(&mut self, generation: u64, rewritten: Option<Rewritten>) {
        if let Some(Rewritten {
            file,
            snapshot_bytes,
        }) = rewritten
        {
            self.file = file;
            self.snapshot_bytes = snapshot_bytes;
            self.file_bytes += snapshot_bytes;
        }
        self.written_gen = self.written_gen.max(generation);
    }

    /// Whether written changes wait for an fdatasync.
    pub fn needs_sync(&self) -> bool {
        self.written_gen > self.synced_gen
    }

    /// The generation of the last change: every offset kept is durable once it is synced.
    pub fn changed_generation(&self) -> u64 {
        self.changed_gen
    }

    /// Whether changes wait to be written.
    pub fn needs_write(&self) -> bool {
        self.changed_gen > self.written_gen
    }

    /// The file to fdatasync and the generation it will cover.
    pub fn sync_handle(&self) -> (Arc<std::fs::File>, u64) {
        (self.file.clone(), self.written_gen)
    }

    pub fn synced(&mut self, generation: u64) {
        self.synced_gen = self.synced_gen.max(generation);
        if !self.unsynced_firsts.is_empty() {
            let synced = self.synced_gen;
            self.unsynced_firsts.retain(|_, made| *made > synced);
        }
    }

    /// Whether the change of `generation` is covered by an fdatasync.
    pub fn is_synced(&self, generation: u64) -> bool {
        self.synced_gen >= generation
    }

    /// Lowers every offset past its queue's end (`end_of`; `None`: leave it) to that end,
    /// and returns how many it lowered. A crash can lose records the log had not synced
    /// (async flush, a machine that stopped) after a consumer read them and committed past
    /// them: new messages then take those queue offsets, and an offset left past them would
    /// skip them.
    pub fn lower_past_ends(&mut self, mut end_of: impl FnMut(&str, u32) -> Option<u64>) -> usize {
        let past: Vec<(String, String, u32, u64)> = self
            .iter()
            .filter_map(|(g, t, q, o)| {
                end_of(t, q)
                    .filter(|&end| o > end)
                    .map(|end| (g.to_owned(), t.to_owned(), q, end))
            })
            .collect();
        for (g, t, q, end) in &past {
            self.reset(g, t, *q, *end);
        }
        past.len()
    }

    /// Every committed offset: (group, topic, queue, offset), in no order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, u32, u64)> + '_ {
        self.offsets
            .iter()
            .map(|((g, t, q), o)| (g.as_str(), t.as_str(), *q, *o))
    }

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

    /// Writes what `s` has pending, as a flush does.
    fn write_pending(s: &mut OffsetStore) {
        let (io, covered) = s.take_io().unwrap();
        s.written(covered, io.run().unwrap());
    }

    #[test]
    fn groups_are_counted_and_a_forgotten_group_stays_gone_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g1", "t", 0, 1);
        s.commit("g1", "t", 1, 1);
        s.commit("g2", "t", 0, 1);
        s.commit("g2", "u", 0, 1);
        assert_eq!(s.group_count(), 2);
        s.forget_topic("u");
        assert_eq!(s.group_count(), 2, "g2 still has t:0");
        s.forget_group("g1");
        assert_eq!(s.group_count(), 1);
        assert!(!s.has_group("g1") && s.has_group("g2"));
        write_pending(&mut s);
        drop(s);
        let s = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(s.group_count(), 1);
        assert_eq!(s.get("g1", "t", 0), None);
        assert_eq!(s.get("g2", "t", 0), Some(1));
    }

    #[test]
    fn a_snapshot_holds_the_offsets_as_taken_and_changes_made_while_it_is_written_follow_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g", "t", 0, 1);
        s.commit("g", "t", 1, 1);
        s.forget_group("gone");
        let (io, covered) = s.take_io().unwrap();
        assert!(matches!(io, OffsetsIo::Rewrite { .. }));
        assert_eq!(s.missing("g", "t", &[0, 1, 2]), 1);
        // Changes while the snapshot is encoded and written (off the shard's thread).
        s.commit("g", "t", 0, 5);
        s.commit("g", "t", 2, 7);
        s.written(covered, io.run().unwrap());
        let (mut on_disk, mut fences) = (Offsets::new(), HashMap::new());
        replay(
            &std::fs::read(dir.path().join("offsets.log")).unwrap(),
            &mut on_disk,
            &mut fences,
        );
        let as_taken: Offsets = [
            (("g".into(), "t".into(), 0), 1),
            (("g".into(), "t".into(), 1), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(on_disk, as_taken);
        let (io, covered) = s.take_io().unwrap();
        assert!(matches!(io, OffsetsIo::Append { .. }));
        s.written(covered, io.run().unwrap());
        drop(s);
        let s = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(s.count(), 3);
        assert_eq!(
            (s.get("g", "t", 0), s.get("g", "t", 1), s.get("g", "t", 2)),
            (Some(5), Some(1), Some(7))
        );
    }

    #[test]
    fn a_first_offset_is_unsynced_until_a_sync_covers_its_first_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g", "t", 0, 1);
        assert!(s.is_unsynced_first("g", "t", 0));
        write_pending(&mut s);
        assert!(s.is_unsynced_first("g", "t", 0), "written is not synced");
        // A later commit of it, before the sync (a retry of the first), finds it so too.
        s.commit("g", "t", 0, 1);
        s.commit("g", "t", 0, 2);
        assert!(s.is_unsynced_first("g", "t", 0));
        s.commit("g", "t", 1, 1);
        let (_, covers) = s.sync_handle();
        s.synced(covers);
        assert!(!s.is_unsynced_first("g", "t", 0));
        assert!(
            s.is_unsynced_first("g", "t", 1),
            "made after the write the sync covers"
        );
        // A failed sync leaves it waiting.
        write_pending(&mut s);
        s.sync_failed();
        assert!(s.is_unsynced_first("g", "t", 1));
        write_pending(&mut s);
        let (_, covers) = s.sync_handle();
        s.synced(covers);
        assert!(!s.is_unsynced_first("g", "t", 1));
        // Forgotten and made again, it waits again.
        s.forget_group("g");
        s.commit("g", "t", 0, 1);
        assert!(s.is_unsynced_first("g", "t", 0));
    }

    #[test]
    fn rewrites_stay_rare_when_the_snapshot_itself_is_big() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        let mut rewrites = 0;
        // 200,000 distinct offsets: a snapshot of them is over the 4 MiB rewrite size.
        for i in 0..200_000u32 {
            s.commit(&format!("g{}", i / 1000), "topic", i % 1000, 1);
            if i % 1000 == 999 {
                while let Some((io, covered)) = s.take_io() {
                    rewrites += usize::from(matches!(io, OffsetsIo::Rewrite { .. }));
                    s.written(covered, io.run().unwrap());
                }
            }
        }
        assert!(s.snapshot_bytes > 4 << 20);
        assert!(rewrites <= 3, "{rewrites} rewrites");
        drop(s);
        let s = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(s.get("g199", "topic", 999), Some(1));
    }

    #[test]
    fn commits_survive_reopen_and_torn_tails() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g", "t", 1, 10);
        s.commit("g", "t", 1, 12);
        assert_eq!(s.commit("g", "t", 1, 11), (12, 0), "never backwards");
        s.commit("g2", "t", 0, 5);
        let generation = s.reset("g2", "t", 0, 3);
        assert!(s.needs_write());
        let (io, covered) = s.take_io().unwrap();
        assert_eq!(covered, generation);
        s.written(covered, io.run().unwrap());
        assert!(!s.needs_write() && s.needs_sync());
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

    /// A damaged record with whole records after it is skipped, not cut with them (their
    /// groups would start from `consume_from`): the offsets after it stand, and the file
    /// as found is kept beside it.
    #[test]
    fn damage_before_whole_records_is_skipped_and_the_file_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g", "t", 0, 10);
        s.commit("g", "t", 1, 11);
        s.commit("g", "t", 2, 12);
        write_pending(&mut s);
        drop(s);
        let path = dir.path().join("offsets.log");
        let whole = std::fs::read(&path).unwrap();
        let first = record_len(&whole).unwrap();
        let kept_copies = || {
            let names = std::fs::read_dir(dir.path()).unwrap();
            let names = names.map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
            names
                .filter(|n| n.starts_with("offsets.log.damaged-"))
                .count()
        };
        for (damaged_at, lost) in [(0, 0), (14, 0), (first + 20, 1)] {
            let mut bytes = whole.clone();
            bytes[damaged_at] ^= 0x40;
            std::fs::write(&path, &bytes).unwrap();
            let copies = kept_copies();
            let s = OffsetStore::open(dir.path()).unwrap();
            let got: Vec<Option<u64>> = (0..3).map(|q| s.get("g", "t", q)).collect();
            let mut want = vec![Some(10), Some(11), Some(12)];
            want[lost] = None;
            assert_eq!(got, want, "damage at {damaged_at}");
            assert_eq!(kept_copies(), copies + 1, "the file as found is kept");
            drop(s);
            std::fs::write(&path, &whole).unwrap();
        }
        // Damage in the last record alone is a torn tail: cut, the others kept.
        let mut bytes = whole.clone();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let s = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(
            (s.get("g", "t", 0), s.get("g", "t", 1)),
            (Some(10), Some(11))
        );
        assert_eq!(s.get("g", "t", 2), None);
    }

    #[test]
    fn a_reset_refuses_positions_read_before_it_until_the_group_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g", "t", 0, 9);
        s.commit("other", "t", 0, 9);
        assert_eq!(s.refuses("g", "t", Some(0)), None, "no reset yet");
        assert_eq!(s.fence("g", "t", 7), Ok(()));
        s.reset("g", "t", 0, 2);
        assert_eq!(
            s.refuses("g", "t", Some(6)),
            Some(7),
            "read before the reset"
        );
        assert_eq!(
            s.refuses("g", "t", Some(7)),
            None,
            "read at the reset's epoch"
        );
        assert_eq!(s.refuses("g", "t", Some(8)), None);
        assert_eq!(s.refuses("g", "t", None), None, "an admin's commit");
        assert_eq!(s.refuses("other", "t", Some(0)), None, "another group");
        assert_eq!(s.refuses("g", "u", Some(0)), None, "another topic");
        assert_eq!(
            s.fence("g", "t", 5),
            Err(7),
            "an earlier reset after a later one"
        );
        assert_eq!(
            s.refuses("g", "t", Some(6)),
            Some(7),
            "its fence is not lowered"
        );
        assert_eq!(s.fence("g", "t", 7), Ok(()), "the same reset again");
        s.forget_topic("t");
        assert_eq!(
            s.refuses("g", "t", Some(0)),
            None,
            "no offsets left, nothing to undo"
        );
        s.commit("g", "u", 0, 1);
        assert_eq!(s.fence("g", "u", 7), Ok(()));
        s.forget_group("g");
        assert_eq!(s.refuses("g", "u", Some(0)), None);
        // A fence without offsets (a reset that failed before writing them) goes too.
        assert_eq!(s.fence("g", "u", 9), Ok(()));
        s.unfence("g");
        assert_eq!(s.refuses("g", "u", Some(0)), None);
    }

    /// Writes what waits to be written (appends, or a rewrite).
    fn write_all(s: &mut OffsetStore) {
        while let Some((io, covered)) = s.take_io() {
            s.written(covered, io.run().unwrap());
        }
    }

    #[test]
    fn fences_outlive_a_reopen_appended_or_in_a_snapshot_until_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g", "t", 0, 9);
        s.commit("g", "u", 0, 9);
        assert_eq!(s.fence("g", "t", 7), Ok(()));
        s.reset("g", "t", 0, 2);
        assert_eq!(s.fence("g", "u", 3), Ok(()));
        assert_eq!(s.fence("h", "t", 5), Ok(()), "a fence without offsets");
        write_all(&mut s);
        drop(s);
        // Appended records, replayed (and written again as the start's snapshot).
        let mut s = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(s.refuses("g", "t", Some(6)), Some(7));
        assert_eq!(s.refuses("g", "u", Some(2)), Some(3));
        assert_eq!(s.refuses("h", "t", Some(0)), Some(5));
        assert_eq!(s.get("g", "t", 0), Some(2), "a fence is no offset");
        assert_eq!(s.get("g", "t", FENCE_QUEUE), None);
        assert_eq!(s.group_count(), 1, "a fence keeps no group's offsets");
        let mut fences = s.fences();
        fences.sort();
        assert_eq!(fences, [("g".to_owned(), 7), ("h".to_owned(), 5)]);
        s.forget_topic("u");
        assert_eq!(s.unfence("h"), s.changed_generation());
        assert_eq!(s.unfence("h"), 0, "nothing left to forget");
        write_all(&mut s);
        drop(s);
        // From the snapshot: what was forgotten stays forgotten.
        let s = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(s.refuses("g", "t", Some(6)), Some(7));
        assert_eq!(s.refuses("g", "u", Some(0)), None);
        assert_eq!(s.refuses("h", "t", Some(0)), None);
    }

    #[test]
    fn an_append_that_failed_part_way_is_not_where_the_replay_stops() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g", "t", 0, 1);
        write_pending(&mut s);
        s.commit("g", "t", 1, 5);
        let (io, _) = s.take_io().unwrap();
        // Half of the write lands, then it fails (a full disk).
        let OffsetsIo::Append { file, bytes } = &io else {
            panic!("an append, not a rewrite");
        };
        (&**file).write_all(&bytes[..bytes.len() / 2]).unwrap();
        drop(io);
        s.write_failed();
        s.commit("g", "t", 2, 7);
        while let Some((io, covered)) = s.take_io() {
            s.written(covered, io.run().unwrap());
        }
        drop(s);
        let s = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(s.get("g", "t", 0), Some(1));
        assert_eq!(s.get("g", "t", 1), Some(5));
        assert_eq!(s.get("g", "t", 2), Some(7));
    }

    #[test]
    fn writes_come_out_in_order_and_a_failed_one_is_done_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = OffsetStore::open(dir.path()).unwrap();
        s.commit("g", "t", 0, 1);
        let (io, generation) = s.take_io().unwrap();
        // The write fails (a full disk): nothing is lost, it is taken again with what came
        // after it.
        drop(io);
        s.write_failed();
        s.commit("g", "t", 0, 2);
        let (io, covered) = s.take_io().unwrap();
        assert!(covered > generation);
        s.written(covered, io.run().unwrap());
        // A rewrite (a forgotten topic) replaces the file; later commits go to the new one.
        s.commit("g", "gone", 0, 9);
        s.forget_topic("gone");
        let (io, covered) = s.take_io().unwrap();
        assert!(matches!(io, OffsetsIo::Rewrite { .. }));
        s.commit("g", "t", 1, 7);
        s.written(covered, io.run().unwrap());
        write_pending(&mut s);
        assert!(s.take_io().is_none());
        drop(s);
        let s = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(s.get("g", "t", 0), Some(2));
        assert_eq!(s.get("g", "t", 1), Some(7));
        assert_eq!(s.get("g", "gone", 0), None);
    }
}
