//! The key index: message key -> physical offsets, queried by key within a store-time range
//! (RocketMQ's IndexFile).
//!
//! Layout of one file (all little-endian, fixed size, memory-mapped), named by a sequence
//! number of 20 zero-padded digits; the newest file is the one written to:
//!
//! ```text
//! header   64 bytes   magic "RMKI", version, begin_timestamp_ms i64, end_timestamp_ms i64,
//!                     begin_phys u64, end_phys u64, slot_count u32, entries_max u32,
//!                     entry_count u32, reserved
//! slots    slot_count * u32          1-based index of the newest entry of the slot's chain;
//!                                    0 = empty; an entry's slot is its key_hash modulo
//!                                    slot_count (version 1: the key's 64-bit hash modulo
//!                                    slot_count)
//! entries  entries_max * 24 bytes    key_hash u32, physical_offset u64,
//!                                    store_timestamp_ms i64, prev u32 (older entry of the
//!                                    same slot, 0 = none)
//! ```
//!
//! Entries store the whole store timestamp rather than a 32-bit difference from the file's
//! begin: the entry is 24 bytes either way with a 32-bit key hash, and a full timestamp
//! cannot overflow on a long-lived file or go negative when the clock steps back. A file
//! carries its own `slot_count` and `entries_max`, so a changed configuration applies to new
//! files only.
//!
//! The header's begin/end fields cover the file's entries: `[begin_timestamp_ms,
//! end_timestamp_ms]` lets a query skip files, and `end_phys` (the highest physical offset
//! indexed) drives replay after a crash and retention.
//!
//! After an unclean stop, [`KeyIndex::open_after_crash`] trusts only the entries the last
//! checkpoint found synced ([`KeyIndex::entries_below`]): pages written since may have
//! reached the disk in any order (a power loss), so the files after that point are removed,
//! and its file gets its count, ranges and slots again from those entries (a version 2 file
//! can tell an entry's slot from its stored hash). Replay puts the rest again from the log.

mod walk;

pub use walk::KeyWalk;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use super::dirty::DirtyFile;
use super::spare::{remove_leftovers, MappedFile, SpareFile, Spares};
use super::tag::fnv1a64;
use super::{
    create_mapped, io_err, list_files, map_file, numbered_file_name, open_existing, read_i64,
    read_u32, read_u64, remove_file, write_i64, write_u32, write_u64, AllocAhead, Backing,
    IndexError,
};

const KI_MAGIC: u32 = u32::from_le_bytes(*b"RMKI");
const KI_VERSION: u32 = 2;
/// Files made before version 2: an entry's slot came from the key's whole 64-bit hash, not
/// stored, so their slots cannot be rebuilt from their entries.
const KI_VERSION_1: u32 = 1;

const KI_HEADER_BYTES: usize = 64;
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = 4;
const BEGIN_TIMESTAMP_MS_AT: usize = 8;
const END_TIMESTAMP_MS_AT: usize = 16;
const BEGIN_PHYS_AT: usize = 24;
const END_PHYS_AT: usize = 32;
const SLOT_COUNT_AT: usize = 40;
const ENTRIES_MAX_AT: usize = 44;
const ENTRY_COUNT_AT: usize = 48;
const _: () = assert!(ENTRY_COUNT_AT + 4 <= KI_HEADER_BYTES);

const KI_SLOT_BYTES: usize = 4;

const KI_ENTRY_BYTES: usize = 24;
const ENTRY_KEY_HASH_AT: usize = 0;
const ENTRY_PHYS_AT: usize = 4;
const ENTRY_TIMESTAMP_MS_AT: usize = 12;
const ENTRY_PREV_AT: usize = 20;
const _: () = assert!(ENTRY_PREV_AT + 4 == KI_ENTRY_BYTES);
const _: () = assert!(KI_ENTRY_BYTES == 4 + 8 + 8 + 4);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyIndexConfig {
    /// Hash slots per file.
    pub slots_per_file: u32,
    /// Entries per file; a full file rolls to a new one. At most `u32::MAX - 1`, since entry
    /// indexes are 1-based `u32`.
    pub entries_per_file: u32,
}

/// Bytes of entries allocated at a time ahead of the appends (43,690 entries).
const KI_ALLOC_STEP: u64 = 1 << 20;

impl Default for KeyIndexConfig {
    fn default() -> Self {
        // Upstream's numbers: 5M slots, 20M entries, about 500 MB per (sparse) file.
        KeyIndexConfig {
            slots_per_file: 5_000_000,
            entries_per_file: 20_000_000,
        }
    }
}

impl KeyIndexConfig {
    /// Bytes of a file (`open` checked that it can be mapped).
    fn file_bytes(&self) -> u64 {
        file_bytes(self.slots_per_file, self.entries_per_file).map_or(u64::MAX, |b| b as u64)
    }

    /// Bytes of a file's header and slots, allocated when it is created.
    fn slots_end(&self) -> u64 {
        (KI_HEADER_BYTES + self.slots_per_file as usize * KI_SLOT_BYTES) as u64
    }
}

/// Bytes of a file with these dimensions; `None` if it cannot be mapped.
fn file_bytes(slot_count: u32, entries_max: u32) -> Option<usize> {
    let bytes = (KI_HEADER_BYTES as u64)
        .checked_add(u64::from(slot_count).checked_mul(KI_SLOT_BYTES as u64)?)?
        .checked_add(u64::from(entries_max).checked_mul(KI_ENTRY_BYTES as u64)?)?;
    usize::try_from(bytes).ok()
}

/// The key's hash: the stored 32-bit hash folds both halves of the 64-bit one, and the slot
/// is the stored hash modulo the slot count (a version 1 file took the whole 64 bits modulo
/// the slot count), so a slot can be rebuilt from its entries. Keys sharing a slot share
/// their stored hash modulo the slot count, and still differ in the rest of it (about
/// 2^32 / slot_count values: a rare false candidate, which the caller's check of the key
/// drops).
struct KeyHash {
    full: u64,
    stored: u32,
}

impl KeyHash {
    fn of(key: &str) -> KeyHash {
        let full = fnv1a64(key.as_bytes());
        KeyHash {
            full,
            stored: (full ^ (full >> 32)) as u32,
        }
    }
}

/// One decoded entry.
#[derive(Debug, Clone, Copy)]
struct Entry {
    key_hash: u32,
    physical_offset: u64,
    store_timestamp_ms: i64,
    prev: u32,
}

/// One mapped index file.
struct IndexFile {
    seq: u64,
    /// Where the file is: its numbered name, or its spare's while `link_to` is set.
    path: PathBuf,
    /// The numbered name a spare taken by a roll gets at the next sync (see
    /// [`DirtyFile::link_to`]).
    link_to: Option<PathBuf>,
    mmap: MmapMut,
    backing: Backing,
    /// Copied from the header, which open validated against the file size.
    version: u32,
    slot_count: u32,
    entries_max: u32,
    /// Changes made to the mapping, and those known to be on disk (msync or fdatasync).
    dirty_gen: u64,
    synced_gen: u64,
    /// How many times entries were forgotten after a cut of the log: a walk resumed in the
    /// file after one starts its chain again (its place may now hold another key's entry).
    cuts: u64,
    /// Made (created, or a spare taken) by this index, its directory not synced since.
    name_unsynced: bool,
}

impl IndexFile {
    /// A new file `seq` in `dir`: `spare` (its path and file, named at the next sync), or
    /// created here.
    fn create(
        dir: &Path,
        seq: u64,
        cfg: KeyIndexConfig,
        spare: Option<(PathBuf, MappedFile)>,
    ) -> Result<IndexFile, IndexError> {
        let numbered = dir.join(numbered_file_name(seq));
        let (path, link_to, backing, mmap) = match spare {
            Some((spare, MappedFile { backing, mmap })) => (spare, Some(numbered), backing, mmap),
            None => {
                let (backing, mmap) = create_mapped(&numbered, cfg.file_bytes())?;
                (numbered, None, backing, mmap)
            }
        };
        let mut file = IndexFile {
            seq,
            path,
            link_to,
            mmap,
            backing,
            version: KI_VERSION,
            slot_count: cfg.slots_per_file,
            entries_max: cfg.entries_per_file,
            dirty_gen: 1,
            synced_gen: 0,
            cuts: 0,
            name_unsynced: true,
        };
        if let Err(e) = file.allocate_slots() {
            // Nothing was written to it: do not leave a file the next start takes for one.
            let IndexFile { path, mmap, .. } = file;
            drop(mmap);
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        file.init_header();
        Ok(file)
    }

    /// Gives a spare taken by a roll its numbered name now (a link, then the spare's name
    /// removed), on the calling thread.
    fn name_now(&mut self) -> Result<(), IndexError> {
        super::dirty::name_now(&mut self.path, &mut self.link_to)
    }

    /// Allocates the header and the slots on disk (slots are written anywhere, at random).
    fn allocate_slots(&mut self) -> Result<(), IndexError> {
        let end = self.entry_at(1) as u64;
        self.backing.ensure_prefix(end, &self.path)
    }

    /// Makes sure `n` more entries fit in this file's allocated space.
    fn reserve(&mut self, n: u32) -> Result<(), IndexError> {
        let end = (self.entry_at(self.entry_count() + n) + KI_ENTRY_BYTES) as u64;
        self.backing.ensure(end, KI_ALLOC_STEP, &self.path)
    }

    fn init_header(&mut self) {
        let header = &mut self.mmap[..KI_HEADER_BYTES];
        header.fill(0);
        write_u32(header, MAGIC_AT, KI_MAGIC);
        write_u32(header, VERSION_AT, self.version);
        write_u32(header, SLOT_COUNT_AT, self.slot_count);
        write_u32(header, ENTRIES_MAX_AT, self.entries_max);
        self.dirty_gen += 1;
    }

    /// Maps an existing file and validates its header. The last file may be a torn creation
    /// (zero length or an all-zero header: the crash came before the header was written);
    /// it holds no entry and is initialised afresh with `cfg`.
    fn open(
        dir: &Path,
        path: PathBuf,
        seq: u64,
        is_last: bool,
        cfg: KeyIndexConfig,
    ) -> Result<IndexFile, IndexError> {
        let corrupt = |path: &Path, reason: String| IndexError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let (std_file, len_bytes) = open_existing(&path)?;
        if len_bytes == 0 && is_last {
            drop(std_file);
            return Self::create(dir, seq, cfg, None);
        }
        if len_bytes < KI_HEADER_BYTES as u64 {
            return Err(corrupt(
                &path,
                format!("{len_bytes} bytes, shorter than the header"),
            ));
        }
        let mmap = map_file(&std_file, &path)?;
        let header = &mmap[..KI_HEADER_BYTES];
        if is_last && header.iter().all(|&b| b == 0) {
            drop(mmap);
            return Self::create(dir, seq, cfg, None);
        }
        let magic = read_u32(header, MAGIC_AT);
        if magic != KI_MAGIC {
            return Err(corrupt(&path, format!("bad magic {magic:#010x}")));
        }
        let version = read_u32(header, VERSION_AT);
        if version != KI_VERSION && version != KI_VERSION_1 {
            return Err(corrupt(&path, format!("unsupported version {version}")));
        }
        let slot_count = read_u32(header, SLOT_COUNT_AT);
        let entries_max = read_u32(header, ENTRIES_MAX_AT);
        let entry_count = read_u32(header, ENTRY_COUNT_AT);
        if slot_count == 0 || entries_max == 0 || entries_max == u32::MAX {
            return Err(corrupt(
                &path,
                format!("bad dimensions: slot_count {slot_count}, entries_max {entries_max}"),
            ));
        }
        if entry_count > entries_max {
            return Err(corrupt(
                &path,
                format!("entry_count {entry_count} > entries_max {entries_max}"),
            ));
        }
        let expected_bytes = file_bytes(slot_count, entries_max);
        if expected_bytes.map(|b| b as u64) != Some(len_bytes) {
            return Err(corrupt(
                &path,
                format!(
                    "{len_bytes} bytes, expected {expected_bytes:?} for slot_count {slot_count}, \
                     entries_max {entries_max}"
                ),
            ));
        }
        let file = IndexFile {
            seq,
            path,
            link_to: None,
            mmap,
            backing: Backing::new(len_bytes),
            version,
            slot_count,
            entries_max,
            dirty_gen: 0,
            synced_gen: 0,
            cuts: 0,
            name_unsynced: false,
        };
        if entry_count > 0
            && (file.begin_timestamp_ms() > file.end_timestamp_ms()
                || file.begin_phys() > file.end_phys())
        {
            return Err(corrupt(
                &file.path,
                format!(
                    "inverted ranges: timestamps [{}, {}], physical offsets [{}, {}]",
                    file.begin_timestamp_ms(),
                    file.end_timestamp_ms(),
                    file.begin_phys(),
                    file.end_phys()
                ),
            ));
        }
        Ok(file)
    }

    fn header(&self) -> &[u8] {
        &self.mmap[..KI_HEADER_BYTES]
    }

    fn entry_count(&self) -> u32 {
        read_u32(self.header(), ENTRY_COUNT_AT)
    }

    fn begin_timestamp_ms(&self) -> i64 {
        read_i64(self.header(), BEGIN_TIMESTAMP_MS_AT)
    }

    fn end_timestamp_ms(&self) -> i64 {
        read_i64(self.header(), END_TIMESTAMP_MS_AT)
    }

    fn begin_phys(&self) -> u64 {
        read_u64(self.header(), BEGIN_PHYS_AT)
    }

    fn end_phys(&self) -> u64 {
        read_u64(self.header(), END_PHYS_AT)
    }

    fn is_full(&self) -> bool {
        self.entry_count() >= self.entries_max
    }

    fn slot_at(&self, hash: &KeyHash) -> usize {
        if self.version == KI_VERSION_1 {
            let slot = hash.full % u64::from(self.slot_count);
            return KI_HEADER_BYTES + slot as usize * KI_SLOT_BYTES;
        }
        self.slot_of_stored(hash.stored)
    }

    /// The slot of an entry with this stored hash (version 2 on).
    fn slot_of_stored(&self, stored: u32) -> usize {
        let slot = stored % self.slot_count;
        KI_HEADER_BYTES + slot as usize * KI_SLOT_BYTES
    }

    /// Byte position of the 1-based entry `index`.
    fn entry_at(&self, index: u32) -> usize {
        KI_HEADER_BYTES
            + self.slot_count as usize * KI_SLOT_BYTES
            + (index as usize - 1) * KI_ENTRY_BYTES
    }

    fn entry(&self, index: u32) -> Entry {
        let bytes = &self.mmap[self.entry_at(index)..][..KI_ENTRY_BYTES];
        Entry {
            key_hash: read_u32(bytes, ENTRY_KEY_HASH_AT),
            physical_offset: read_u64(bytes, ENTRY_PHYS_AT),
            store_timestamp_ms: read_i64(bytes, ENTRY_TIMESTAMP_MS_AT),
            prev: read_u32(bytes, ENTRY_PREV_AT),
        }
    }

    /// The newest counted entry of the slot at `slot_at`; 0 if none.
    ///
    /// A slot can point past `entry_count` after a power loss wrote the slot's page but not
    /// the header's. Those entries no longer count (replay puts them again), so follow their
    /// links back to the counted part of the chain. Links strictly decrease, so this ends.
    fn live_head(&self, slot_at: usize) -> u32 {
        let entry_count = self.entry_count();
        let mut index = read_u32(&self.mmap, slot_at);
        while index > entry_count {
            if index > self.entries_max {
                return 0;
            }
            let prev = self.entry(index).prev;
            if prev >= index {
                return 0;
            }
            index = prev;
        }
        index
    }

    /// Forgets the entries from the 1-based `index` on (they point past a cut of the log):
    /// the count goes back and every slot heading a forgotten entry heads its older live
    /// entry again, so later entries at those positions do not join other keys' chains.
    fn forget_from(&mut self, index: u32) {
        let keep = index.saturating_sub(1);
        if keep >= self.entry_count() {
            return;
        }
        write_u32(&mut self.mmap[..KI_HEADER_BYTES], ENTRY_COUNT_AT, keep);
        if keep > 0 {
            let last = self.entry(keep);
            write_u64(
                &mut self.mmap[..KI_HEADER_BYTES],
                END_PHYS_AT,
                last.physical_offset,
            );
        }
        for slot in 0..self.slot_count as usize {
            let at = KI_HEADER_BYTES + slot * KI_SLOT_BYTES;
            if read_u32(&self.mmap, at) > keep {
                let head = self.live_head(at);
                write_u32(&mut self.mmap, at, head);
            }
        }
        self.dirty_gen += 1;
        self.cuts += 1;
    }

    /// After an unclean stop: the file holds its first `count` entries, those the last
    /// checkpoint found synced (written before it and never since); the header and slots
    /// are made again from them, whatever pages of them reached the disk since. A version 1
    /// file cannot tell an entry's slot: its entries past `count` are forgotten as after a
    /// cut, and a slot whose newest entries were lost may lose its older ones.
    fn keep_synced(&mut self, count: u32) -> Result<(), IndexError> {
        if count > self.entries_max {
            return Err(IndexError::Corrupt {
                path: self.path.clone(),
                reason: format!(
                    "the checkpoint counts {count} entries synced, past entries_max {}",
                    self.entries_max
                ),
            });
        }
        if self.version == KI_VERSION_1 {
            crate::warn!(
                "ringmq: key index file {} is of version 1, whose slots cannot be rebuilt \
                 after an unclean stop: after a power loss, lookups by key may miss messages \
                 it indexed",
                self.path.display()
            );
            self.forget_from(count.saturating_add(1));
            return Ok(());
        }
        let mut heads = vec![0u32; self.slot_count as usize];
        let (mut begin_ts, mut end_ts) = (i64::MAX, i64::MIN);
        let (mut begin_phys, mut end_phys) = (u64::MAX, 0);
        for index in 1..=count {
            let entry = self.entry(index);
            let slot = (entry.key_hash % self.slot_count) as usize;
            if entry.prev != heads[slot] {
                let at = self.entry_at(index) + ENTRY_PREV_AT;
                write_u32(&mut self.mmap, at, heads[slot]);
            }
            heads[slot] = index;
            begin_ts = begin_ts.min(entry.store_timestamp_ms);
            end_ts = end_ts.max(entry.store_timestamp_ms);
            begin_phys = begin_phys.min(entry.physical_offset);
            end_phys = end_phys.max(entry.physical_offset);
        }
        for (slot, &head) in heads.iter().enumerate() {
            let at = KI_HEADER_BYTES + slot * KI_SLOT_BYTES;
            if read_u32(&self.mmap, at) != head {
                write_u32(&mut self.mmap, at, head);
            }
        }
        if count == 0 {
            (begin_ts, end_ts, begin_phys, end_phys) = (0, 0, 0, 0);
        }
        self.set_header(count, (begin_ts, end_ts), (begin_phys, end_phys));
        Ok(())
    }

    /// Writes the header's count and ranges (timestamps, physical offsets).
    fn set_header(&mut self, count: u32, timestamps: (i64, i64), phys: (u64, u64)) {
        let header = &mut self.mmap[..KI_HEADER_BYTES];
        write_i64(header, BEGIN_TIMESTAMP_MS_AT, timestamps.0);
        write_i64(header, END_TIMESTAMP_MS_AT, timestamps.1);
        write_u64(header, BEGIN_PHYS_AT, phys.0);
        write_u64(header, END_PHYS_AT, phys.1);
        write_u32(header, ENTRY_COUNT_AT, count);
        self.dirty_gen += 1;
    }

    /// Appends an entry; the file must not be full.
    fn put(&mut self, hash: &KeyHash, physical_offset: u64, store_timestamp_ms: i64) {
        let entry_count = self.entry_count();
        assert!(
            entry_count < self.entries_max,
            "put into a full key index file"
        );
        let index = entry_count + 1;
        let slot_at = self.slot_at(hash);
        let prev = self.live_head(slot_at);
        let entry_at = self.entry_at(index);
        // Entry, then slot, then count: within the process every step leaves a consistent
        // file. After a power loss the pages may land in any order: the next open keeps
        // only the entries the last checkpoint found synced (`keep_synced`), and replay
        // puts the rest again.
        let entry = &mut self.mmap[entry_at..][..KI_ENTRY_BYTES];
        write_u32(entry, ENTRY_KEY_HASH_AT, hash.stored);
        write_u64(entry, ENTRY_PHYS_AT, physical_offset);
        write_i64(entry, ENTRY_TIMESTAMP_MS_AT, store_timestamp_ms);
        write_u32(entry, ENTRY_PREV_AT, prev);
        write_u32(&mut self.mmap, slot_at, index);

        let (begin_timestamp_ms, end_timestamp_ms, begin_phys, end_phys) = if entry_count == 0 {
            (
                store_timestamp_ms,
                store_timestamp_ms,
                physical_offset,
                physical_offset,
            )
        } else {
            (
                self.begin_timestamp_ms().min(store_timestamp_ms),
                self.end_timestamp_ms().max(store_timestamp_ms),
                self.begin_phys().min(physical_offset),
                self.end_phys().max(physical_offset),
            )
        };
        self.set_header(
            index,
            (begin_timestamp_ms, end_timestamp_ms),
            (begin_phys, end_phys),
        );
    }
}

/// What of the key index a checkpoint found synced: the entries of records below its log
/// offset ([`KeyIndex::entries_below`]). A cut of the log is at or past its durable end and
/// retention removes whole files, so those entries are never written again: they survive a
/// power loss whatever else of the files does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KeysSynced {
    /// Not recorded (a checkpoint of an earlier version, or one written by hand): an unclean
    /// start takes the files as it finds them.
    Unknown,
    /// No entry (or no checkpoint).
    #[default]
    Nothing,
    /// The first `count` entries of file `seq`, and every entry of the files before it.
    UpTo { seq: u64, count: u32 },
}

/// The key index over all files of one directory.
pub struct KeyIndex {
    dir: PathBuf,
    cfg: KeyIndexConfig,
    /// Oldest first; the last one is written to. Memory is bounded by the files on disk.
    files: VecDeque<IndexFile>,
    /// The spare file for the next roll, and the asks for it.
    spares: Spares,
}

impl KeyIndex {
    /// Opens the index in `dir`, creating `dir` if needed. A file with an inconsistent
    /// header is an error naming the file.
    ///
    /// # Panics
    /// If `cfg` has a zero dimension, `entries_per_file == u32::MAX`, or a file of that size
    /// cannot be mapped.
    pub fn open(dir: &Path, cfg: KeyIndexConfig) -> Result<Self, IndexError> {
        Self::open_after_crash(dir, cfg, KeysSynced::Unknown)
    }

    /// [`open`](Self::open) after an unclean stop, keeping only what the last checkpoint
    /// found `synced`: files past it are removed (all of them for
    /// [`KeysSynced::Nothing`]), and its file is cut to its synced entries, with its header
    /// and slots made again from them. The caller's replay from the checkpoint puts the
    /// rest again (it starts past [`last_physical_offset`](Self::last_physical_offset)).
    /// Costs a walk of that file's synced entries and slots.
    pub fn open_after_crash(
        dir: &Path,
        cfg: KeyIndexConfig,
        synced: KeysSynced,
    ) -> Result<Self, IndexError> {
        assert!(cfg.slots_per_file > 0, "slots_per_file must be positive");
        assert!(
            cfg.entries_per_file > 0,
            "entries_per_file must be positive"
        );
        assert!(
            cfg.entries_per_file < u32::MAX,
            "entries_per_file must be < u32::MAX"
        );
        assert!(
            file_bytes(cfg.slots_per_file, cfg.entries_per_file).is_some(),
            "a key index file of {cfg:?} does not fit in memory"
        );
        std::fs::create_dir_all(dir).map_err(io_err("create_dir", dir))?;
        let (names, others) = list_files(dir)?;
        remove_leftovers(others)?;
        let (names, past): (Vec<_>, Vec<_>) = match synced {
            KeysSynced::Unknown => (names, Vec::new()),
            KeysSynced::Nothing => (Vec::new(), names),
            KeysSynced::UpTo { seq, .. } => names.into_iter().partition(|&(s, _)| s <= seq),
        };
        // Written since the checkpoint only (perhaps in part): replay indexes their records
        // again. Newest first, so that a crash midway leaves numbers without a gap; synced,
        // so that a later power loss cannot bring them back for a clean start to take.
        for (_, path) in past.iter().rev() {
            remove_file(path)?;
        }
        if !past.is_empty() {
            super::sync_dir(dir)?;
        }
        let last_seq = names.last().map(|&(seq, _)| seq);
        // A file holding synced entries is never a torn creation: an all-zero header there
        // is damage, refused, not a file to make again empty.
        let holds_synced = |seq: u64| matches!(synced, KeysSynced::UpTo { seq: s, count } if s == seq && count > 0);
        let mut files = VecDeque::with_capacity(names.len());
        for (seq, path) in names {
            let may_be_torn = Some(seq) == last_seq && !holds_synced(seq);
            files.push_back(IndexFile::open(dir, path, seq, may_be_torn, cfg)?);
        }
        if let KeysSynced::UpTo { seq, count } = synced {
            match files.back_mut().filter(|f| f.seq == seq) {
                Some(last) => last.keep_synced(count)?,
                // Retention removes a file only once the log no longer holds any of its
                // records: nothing is lost then. Anything else removed it from outside.
                None => crate::warn!(
                    "ringmq: key index file {} (synced at the last checkpoint) is gone: \
                     lookups by key miss its messages unless retention removed it",
                    dir.join(numbered_file_name(seq)).display()
                ),
            }
        }
        Ok(KeyIndex {
            dir: dir.to_path_buf(),
            cfg,
            files,
            spares: Spares::new(),
        })
    }

    /// Makes room for `n` more entries: a file with space for them, allocated on disk. A
    /// full disk fails here, before the record is written anywhere.
    pub fn reserve(&mut self, n: u32) -> Result<(), IndexError> {
        if n == 0 {
            return Ok(());
        }
        let next_seq = self.files.back().map_or(0, |last| last.seq + 1);
        match self.files.back_mut() {
            // A version 1 file is written no more: a power loss would lose its slots.
            Some(last)
                if last.version != KI_VERSION_1 && last.entry_count() + n <= last.entries_max =>
            {
                if last.backing.allocated_to() == 0 {
                    last.allocate_slots()?;
                }
                last.reserve(n)
            }
            _ => self.roll(next_seq)?.reserve(n),
        }
    }

    /// Adds file `seq` (the first, or the next after a full one): the spare made ahead
    /// (no file-system call: the next sync names it), or a file created here if none is
    /// ready (counted).
    fn roll(&mut self, seq: u64) -> Result<&mut IndexFile, IndexError> {
        let spare = self.spares.take(true);
        if spare.is_none() {
            // A file created with its name must follow no file still without one: a crash
            // would lose the one between, whose keys replay (from the newest file's end)
            // would not index again. So those are named here too.
            for file in &mut self.files {
                file.name_now()?;
            }
        }
        let file = IndexFile::create(&self.dir, seq, self.cfg, spare)?;
        let last = self.files.len();
        self.files.push_back(file);
        Ok(&mut self.files[last])
    }

    /// A spare file to make off the appending thread for the next roll (one out at a
    /// time): for the first file as soon as the index has none (the store asks when it
    /// opens, so the first key finds it; a store that never indexes a key holds this one
    /// sparse file of the key index's size, its header and slots allocated), then once the
    /// last file's entries come within a [`KI_ALLOC_STEP`] of its end. [`SpareFile::make`]
    /// it, then hand it to [`Spares::made`].
    pub fn spare_ahead(&mut self) -> Option<SpareFile> {
        let (bytes, slots_end) = (self.cfg.file_bytes(), self.cfg.slots_end());
        let Some(last) = self.files.back() else {
            // No roll names the first file's ask: one that failed is not asked again.
            return self.spares.ask(&self.dir, u64::MAX, bytes, slots_end);
        };
        let ahead = (KI_ALLOC_STEP / KI_ENTRY_BYTES as u64) as u32;
        // A version 1 file is written no more: the next put rolls.
        if last.version != KI_VERSION_1
            && last.entry_count().saturating_add(ahead) < last.entries_max
        {
            return None;
        }
        self.spares.ask(&self.dir, last.seq, bytes, slots_end)
    }

    /// The index's spare file and the asks for it.
    pub fn spares(&mut self) -> &mut Spares {
        &mut self.spares
    }

    /// The next stretch of the newest file to allocate, once its entries come within
    /// [`KI_ALLOC_STEP`] of what is allocated, for the caller to allocate off its thread and
    /// report with [`allocated_ahead`](Self::allocated_ahead) (one out at a time).
    /// [`reserve`](Self::reserve) still allocates whatever entries reach first.
    pub fn allocate_ahead(&mut self) -> Option<AllocAhead> {
        let last = self.files.back_mut()?;
        if last.is_full() || last.version == KI_VERSION_1 {
            return None;
        }
        let next_end = (last.entry_at(last.entry_count() + 1) + KI_ENTRY_BYTES) as u64;
        let named = last.link_to.as_deref();
        last.backing
            .ahead(next_end, KI_ALLOC_STEP, &last.path, named)
    }

    /// How an [`AllocAhead`] of this index went (`allocated`: it succeeded). One for a file
    /// gone or created again since is ignored.
    pub fn allocated_ahead(&mut self, ahead: &AllocAhead, allocated: bool) {
        let mut files = self.files.iter_mut().rev();
        if let Some(file) = files.find(|f| f.backing.id == ahead.backing) {
            file.backing.ahead_done(ahead, allocated);
        }
    }

    /// Forgets every entry pointing at or past `log_offset` (the log was cut there).
    pub fn forget_from_physical(&mut self, log_offset: u64) {
        for file in self.files.iter_mut().rev() {
            let count = file.entry_count();
            // Entries of a file follow the log: find the first at or past the cut.
            let mut first = count + 1;
            while first > 1 && file.entry(first - 1).physical_offset >= log_offset {
                first -= 1;
            }
            file.forget_from(first);
            if first > 1 {
                break;
            }
        }
    }

    /// Indexes `key` -> `physical_offset`, rolling to a new file when the last one is full.
    pub fn put(
        &mut self,
        key: &str,
        physical_offset: u64,
        store_timestamp_ms: i64,
    ) -> Result<(), IndexError> {
        let hash = KeyHash::of(key);
        // Rolls to a new file if the last one is full: the last file has room after it.
        self.reserve(1)?;
        if let Some(last) = self.files.back_mut() {
            last.put(&hash, physical_offset, store_timestamp_ms);
        }
        Ok(())
    }

    /// Candidate physical offsets of messages with `key` stored in `[begin_ms, end_ms]`,
    /// newest first, deduplicated, at most `max`. Candidates match the key's hash: the
    /// caller verifies the real key by reading the message.
    /// All in one go: see [`walk_start`](Self::walk_start) for a walk a slice at a time.
    pub fn query(&self, key: &str, begin_ms: i64, end_ms: i64, max: usize) -> Vec<u64> {
        let mut walk = self.walk_start(key, begin_ms, end_ms, max);
        self.walk(&mut walk, usize::MAX);
        walk.into_found()
    }

    /// Where the entries of records below `log_offset` end, for a checkpoint at that offset
    /// to record once the files are synced. Entries follow the log, so this looks back from
    /// the newest only past the records not yet durable.
    pub fn entries_below(&self, log_offset: u64) -> KeysSynced {
        for file in self.files.iter().rev() {
            let mut count = file.entry_count();
            while count > 0 && file.entry(count).physical_offset >= log_offset {
                count -= 1;
            }
            if count > 0 {
                return KeysSynced::UpTo {
                    seq: file.seq,
                    count,
                };
            }
        }
        KeysSynced::Nothing
    }

    /// The highest physical offset indexed; `None` if nothing is. Replay after a crash
    /// re-puts only records above it, which makes replay idempotent.
    pub fn last_physical_offset(&self) -> Option<u64> {
        self.files
            .iter()
            .filter(|f| f.entry_count() > 0)
            .map(IndexFile::end_phys)
            .max()
    }

    /// Retention: removes every file, except the last one (being written), whose entries all
    /// point below `log_min`, the commit log's first byte.
    pub fn delete_before_physical(&mut self, log_min: u64) -> Result<(), IndexError> {
        let mut doomed = Vec::new();
        self.trim_before_physical(log_min, &mut doomed);
        doomed.iter().try_for_each(|path| remove_file(path))
    }

    /// [`delete_before_physical`](Self::delete_before_physical) without the file removals:
    /// the files no longer needed are unmapped and their paths added to `doomed`, oldest
    /// first (a crash midway through removing them then leaves a dense suffix), for the
    /// caller to remove off its thread.
    pub fn trim_before_physical(&mut self, log_min: u64, doomed: &mut Vec<PathBuf>) {
        let Some(last_seq) = self.files.back().map(|f| f.seq) else {
            return;
        };
        let mut kept = VecDeque::with_capacity(self.files.len());
        for file in self.files.drain(..) {
            let is_obsolete =
                file.seq != last_seq && (file.entry_count() == 0 || file.end_phys() < log_min);
            if is_obsolete {
                let IndexFile {
                    path,
                    link_to,
                    mmap,
                    ..
                } = file;
                drop(mmap);
                // The spare's name first, as a consume queue's segment does.
                doomed.extend(std::iter::once(path).chain(link_to));
            } else {
                kept.push_back(file);
            }
        }
        self.files = kept;
    }

    /// msyncs every file written since the last flush (on the calling thread: for a
    /// store's close and for tests; the broker uses [`dirty_files`](Self::dirty_files)).
    /// A spare taken by a roll gets its numbered name here too (the directory is not
    /// synced).
    pub fn flush(&mut self) -> Result<(), IndexError> {
        for file in self.files.iter_mut().filter(|f| f.dirty_gen > f.synced_gen) {
            file.name_now()?;
            file.mmap.flush().map_err(io_err("msync", &file.path))?;
            file.synced_gen = file.dirty_gen;
        }
        Ok(())
    }

    /// The files written since they were last synced, to fdatasync elsewhere.
    pub fn dirty_files(&self) -> Vec<DirtyFile> {
        self.files
            .iter()
            .filter(|f| f.dirty_gen > f.synced_gen)
            .map(|f| DirtyFile {
                path: f.path.clone(),
                key: f.seq,
                generation: f.dirty_gen,
                serial: 0,
                name_unsynced: f.name_unsynced,
                link_to: f.link_to.clone(),
            })
            .collect()
    }

    /// Files from [`dirty_files`](Self::dirty_files) were synced ([`DirtyFile::sync`]).
    /// Returns the spares' names of those linked, for the caller to remove off its thread.
    #[must_use = "the spares' names to remove"]
    pub fn files_synced(&mut self, files: &[DirtyFile]) -> Vec<PathBuf> {
        let mut unlinked = Vec::new();
        for synced in files {
            if let Some(f) = self.files.iter_mut().find(|f| f.seq == synced.key) {
                f.synced_gen = f.synced_gen.max(synced.generation);
                f.name_unsynced &= !synced.name_unsynced;
                unlinked.extend(super::dirty::took_name(&mut f.path, &mut f.link_to, synced));
            }
        }
        unlinked
    }

    /// `f` (from [`dirty_files`](Self::dirty_files)) is a spare taken by a roll that this
    /// index still holds without its numbered name.
    pub fn still_unnamed(&self, f: &DirtyFile) -> bool {
        f.link_to.is_some() && (self.files.iter()).any(|x| x.seq == f.key && x.link_to == f.link_to)
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    #[cfg(test)]
    fn file_count(&self) -> usize {
        self.files.len()
    }
}

#[cfg(test)]
mod tests;
