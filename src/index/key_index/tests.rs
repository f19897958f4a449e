use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};

fn cfg(slots_per_file: u32, entries_per_file: u32) -> KeyIndexConfig {
    KeyIndexConfig {
        slots_per_file,
        entries_per_file,
    }
}

const TINY: KeyIndexConfig = KeyIndexConfig {
    slots_per_file: 8,
    entries_per_file: 16,
};

/// What was put, in put order.
#[derive(Default)]
struct Model {
    puts: Vec<(String, u64, i64)>,
}

impl Model {
    /// Offsets of `key` in `[begin_ms, end_ms]` among puts that `keep` accepts, newest
    /// first, deduplicated, at most `max`.
    fn query(
        &self,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
        keep: impl Fn(usize) -> bool,
    ) -> Vec<u64> {
        let mut seen = HashSet::new();
        self.puts
            .iter()
            .enumerate()
            .rev()
            .filter(|&(n, (k, _, ts))| keep(n) && k == key && (begin_ms..=end_ms).contains(ts))
            .map(|(_, &(_, phys, _))| phys)
            .filter(|phys| seen.insert(*phys))
            .take(max)
            .collect()
    }
}

/// The query in one go, and walked in slices of each size from 1 to 4 entries (each slice
/// a step on, so no more slices than entries).
fn check(index: &KeyIndex, key: &str, begin_ms: i64, end_ms: i64, max: usize, expected: &[u64]) {
    assert_eq!(
        index.query(key, begin_ms, end_ms, max),
        expected,
        "query({key:?}, {begin_ms}, {end_ms}, {max})"
    );
    let entries: usize = index.files.iter().map(|f| f.entry_count() as usize).sum();
    for steps in 1..=4 {
        let mut walk = index.walk_start(key, begin_ms, end_ms, max);
        let mut slices = 1;
        while !index.walk(&mut walk, steps) {
            slices += 1;
            assert!(
                slices <= entries + 1,
                "{slices} slices of {entries} entries"
            );
        }
        assert!(walk.is_done());
        assert_eq!(
            walk.into_found(),
            expected,
            "walk({key:?}, {begin_ms}, {end_ms}, {max}) in slices of {steps}"
        );
    }
}

/// Fills `index` and `model` with random puts: messages of 1..=3 keys from `key_count`
/// keys (sometimes the same key twice), increasing physical offsets, non-decreasing
/// store timestamps.
fn fill(
    index: &mut KeyIndex,
    model: &mut Model,
    rng: &mut StdRng,
    messages: usize,
    key_count: usize,
) {
    let (mut phys, mut ts) = model
        .puts
        .last()
        .map_or((0, 1_700_000_000_000), |&(_, p, t)| (p + 1, t));
    for _ in 0..messages {
        phys += rng.gen_range(1..500);
        ts += rng.gen_range(0..4);
        for _ in 0..rng.gen_range(1..=3) {
            let key = format!("key-{}", rng.gen_range(0..key_count));
            index.put(&key, phys, ts).unwrap();
            model.puts.push((key, phys, ts));
        }
    }
}

/// Compares random queries (and every key over the whole range) with the model.
fn check_against_model(
    index: &KeyIndex,
    model: &Model,
    rng: &mut StdRng,
    key_count: usize,
    keep: impl Fn(usize) -> bool,
) {
    let first_ts = model.puts.first().map_or(0, |p| p.2);
    let last_ts = model.puts.last().map_or(0, |p| p.2);
    for k in 0..key_count {
        let key = format!("key-{k}");
        let expected = model.query(&key, i64::MIN, i64::MAX, usize::MAX, &keep);
        check(index, &key, i64::MIN, i64::MAX, usize::MAX, &expected);
    }
    for _ in 0..300 {
        let key = format!("key-{}", rng.gen_range(0..key_count + 2));
        let a = rng.gen_range(first_ts - 5..=last_ts + 5);
        let b = rng.gen_range(first_ts - 5..=last_ts + 5);
        let (begin_ms, end_ms) = (a.min(b), a.max(b));
        let max = rng.gen_range(0..20);
        let expected = model.query(&key, begin_ms, end_ms, max, &keep);
        check(index, &key, begin_ms, end_ms, max, &expected);
    }
}

/// The test keys are told apart by their stored hash, so the model's exact answers are
/// the index's candidates (slots still collide constantly with 8 slots).
fn assert_no_stored_hash_collision(key_count: usize) {
    let mut seen = HashMap::new();
    for k in 0..key_count + 2 {
        let key = format!("key-{k}");
        if let Some(other) = seen.insert(KeyHash::of(&key).stored, key.clone()) {
            panic!("{key} and {other} share a stored hash; pick other test keys");
        }
    }
}

#[test]
fn matches_model_across_files_and_reopen() {
    let key_count = 40;
    assert_no_stored_hash_collision(key_count);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    assert_eq!(index.last_physical_offset(), None);
    let mut model = Model::default();
    fill(&mut index, &mut model, &mut rng, 300, key_count);
    let file_count = model.puts.len().div_ceil(16);
    assert!(file_count > 30, "{file_count}");
    assert_eq!(index.file_count(), file_count);
    check_against_model(&index, &model, &mut rng, key_count, |_| true);
    let last_phys = model.puts.last().map(|p| p.1);
    assert_eq!(index.last_physical_offset(), last_phys);

    index.flush().unwrap();
    drop(index);
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    assert_eq!(index.file_count(), file_count);
    assert_eq!(index.last_physical_offset(), last_phys);
    check_against_model(&index, &model, &mut rng, key_count, |_| true);

    // Writing goes on in the last file after a reopen.
    fill(&mut index, &mut model, &mut rng, 100, key_count);
    assert_eq!(index.file_count(), model.puts.len().div_ceil(16));
    check_against_model(&index, &model, &mut rng, key_count, |_| true);
    drop(index);
    let index = KeyIndex::open(dir.path(), TINY).unwrap();
    check_against_model(&index, &model, &mut rng, key_count, |_| true);
}

/// A walk taken a slice at a time while puts go on between slices (rolling to new files)
/// answers what the index held when it started; one whose files retention deleted between
/// slices ends with what it found before them.
#[test]
fn a_walk_in_slices_answers_what_was_there_when_it_started() {
    let key_count = 6;
    assert_no_stored_hash_collision(key_count);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(17);
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    let mut model = Model::default();
    fill(&mut index, &mut model, &mut rng, 200, key_count);
    for k in 0..key_count {
        let key = format!("key-{k}");
        let expected = model.query(&key, i64::MIN, i64::MAX, usize::MAX, |_| true);
        let mut walk = index.walk_start(&key, i64::MIN, i64::MAX, usize::MAX);
        let mut later = Model::default();
        later.puts.push(model.puts.last().unwrap().clone());
        while !index.walk(&mut walk, 3) {
            fill(&mut index, &mut later, &mut rng, 2, key_count);
        }
        assert_eq!(walk.into_found(), expected, "{key}");
        model.puts.extend(later.puts.into_iter().skip(1));
    }
    // Retention between slices: the walk goes on no further than the file it was in.
    let key = "key-1";
    let expected = model.query(key, i64::MIN, i64::MAX, usize::MAX, |_| true);
    let mut walk = index.walk_start(key, i64::MIN, i64::MAX, usize::MAX);
    assert!(!index.walk(&mut walk, 2));
    index.delete_before_physical(u64::MAX).unwrap();
    assert!(index.walk(&mut walk, 2));
    let found = walk.into_found();
    assert!(
        !found.is_empty() && found.len() < expected.len(),
        "{found:?}"
    );
    assert!(expected.starts_with(&found), "{found:?}");
}

/// A walk whose file was cut between slices (entries forgotten after a cut of the log, their
/// places then written again with other keys' entries, or not) still finds every entry of
/// its key below the cut.
#[test]
fn a_walk_resumed_after_a_cut_of_the_log_finds_the_entries_below_it() {
    let key_count = 6;
    assert_no_stored_hash_collision(key_count);
    for (seed, refill) in [(5, true), (6, false), (7, true), (8, false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut index = KeyIndex::open(dir.path(), cfg(8, 2_000)).unwrap();
        let mut model = Model::default();
        fill(&mut index, &mut model, &mut rng, 200, key_count);
        let key = "key-1";
        let before = model.query(key, i64::MIN, i64::MAX, usize::MAX, |_| true);
        let mut walk = index.walk_start(key, i64::MIN, i64::MAX, usize::MAX);
        assert!(!index.walk(&mut walk, 3));
        // The cut is below the walk's place: half the puts go, and the log goes on from it.
        let cut = model.puts[model.puts.len() / 2].1;
        index.forget_from_physical(cut);
        model.puts.retain(|p| p.1 < cut);
        if refill {
            let ts = model.puts.last().unwrap().2;
            for n in 0..400 {
                let other = format!("key-{}", [0, 2, 3, 4, 5][n % 5]);
                index.put(&other, cut + n as u64, ts).unwrap();
            }
        }
        while !index.walk(&mut walk, 3) {}
        let found = walk.into_found();
        let below: Vec<u64> = found.iter().copied().filter(|&p| p < cut).collect();
        let expected = model.query(key, i64::MIN, i64::MAX, usize::MAX, |_| true);
        assert!(expected.len() > 10, "{expected:?}");
        assert_eq!(below, expected, "seed {seed}, refill {refill}");
        assert!(before.starts_with(&found[..found.len() - below.len()]));
    }
}

#[test]
fn reopen_with_other_config_keeps_old_files_dimensions() {
    let key_count = 10;
    assert_no_stored_hash_collision(key_count);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    let mut model = Model::default();
    fill(&mut index, &mut model, &mut rng, 30, key_count);
    drop(index);
    let mut index = KeyIndex::open(dir.path(), cfg(3, 5)).unwrap();
    fill(&mut index, &mut model, &mut rng, 30, key_count);
    check_against_model(&index, &model, &mut rng, key_count, |_| true);
    drop(index);
    let index = KeyIndex::open(dir.path(), cfg(1, 1)).unwrap();
    check_against_model(&index, &model, &mut rng, key_count, |_| true);
}

#[test]
fn newest_first_dedup_and_max() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), cfg(2, 3)).unwrap();
    // One message with the key twice, then re-put by a replay: one candidate.
    index.put("order-1", 100, 10).unwrap();
    index.put("order-1", 100, 10).unwrap();
    index.put("order-2", 150, 11).unwrap();
    index.put("order-1", 100, 10).unwrap();
    index.put("order-1", 200, 12).unwrap();
    index.put("order-1", 300, 13).unwrap();
    index.put("order-1", 400, 14).unwrap();
    check(&index, "order-1", 0, 100, 10, &[400, 300, 200, 100]);
    check(&index, "order-1", 0, 100, 2, &[400, 300]);
    check(&index, "order-1", 0, 100, 0, &[]);
    check(&index, "order-1", 12, 13, 10, &[300, 200]);
    check(&index, "order-1", 13, 12, 10, &[]);
    check(&index, "order-1", 15, 100, 10, &[]);
    check(&index, "order-1", 0, 9, 10, &[]);
    check(&index, "order-2", 11, 11, 10, &[150]);
    check(&index, "order-3", 0, 100, 10, &[]);
}

#[test]
fn hash_collisions_are_candidates() {
    // Two keys with the same slot (in 8) and stored hash: a query for one returns the
    // other's offsets too, for the caller to filter.
    let mut seen = HashMap::new();
    let (a, b) = (0u32..)
        .map(|i| format!("k{i}"))
        .find_map(|key| {
            let hash = KeyHash::of(&key);
            seen.insert((hash.stored, hash.full % 8), key.clone())
                .map(|other| (other, key))
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    index.put(&a, 10, 1).unwrap();
    index.put("other", 15, 1).unwrap();
    index.put(&b, 20, 2).unwrap();
    check(&index, &a, 0, 10, 10, &[20, 10]);
    check(&index, &b, 0, 10, 10, &[20, 10]);
}

#[test]
fn delete_before_physical_removes_old_files() {
    let key_count = 12;
    assert_no_stored_hash_collision(key_count);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    let mut model = Model::default();
    index.delete_before_physical(u64::MAX).unwrap(); // no file yet
    fill(&mut index, &mut model, &mut rng, 100, key_count);
    let file_count = model.puts.len().div_ceil(16);
    // File f holds puts [16f, 16f + 16); its end_phys is its last put's offset.
    let end_phys = |f: usize| model.puts[(16 * f + 15).min(model.puts.len() - 1)].1;

    index.delete_before_physical(0).unwrap();
    assert_eq!(index.file_count(), file_count);
    // Exactly a file's end_phys keeps that file.
    index.delete_before_physical(end_phys(4)).unwrap();
    assert_eq!(index.file_count(), file_count - 4);
    check_against_model(&index, &model, &mut rng, key_count, |n| n / 16 >= 4);
    index.delete_before_physical(end_phys(6) + 1).unwrap();
    assert_eq!(index.file_count(), file_count - 7);
    check_against_model(&index, &model, &mut rng, key_count, |n| n / 16 >= 7);
    drop(index);
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    check_against_model(&index, &model, &mut rng, key_count, |n| n / 16 >= 7);
    // Everything: the last file stays.
    index.delete_before_physical(u64::MAX).unwrap();
    assert_eq!(index.file_count(), 1);
    let last_file = file_count - 1;
    check_against_model(&index, &model, &mut rng, key_count, |n| n / 16 >= last_file);
    assert_eq!(index.last_physical_offset(), model.puts.last().map(|p| p.1));
}

fn corrupt_header(at: usize, bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    for i in 0..20 {
        index.put("k", i, 0).unwrap();
    }
    drop(index);
    let path = dir.path().join(numbered_file_name(0));
    let mut file = std::fs::read(&path).unwrap();
    file[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(&path, file).unwrap();
    let err = KeyIndex::open(dir.path(), TINY).err().unwrap();
    assert!(matches!(err, IndexError::Corrupt { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("00000000000000000000"), "{message}");
    message
}

#[test]
fn inconsistent_header_is_an_error_naming_the_file() {
    assert!(corrupt_header(MAGIC_AT, b"XXXX").contains("bad magic"));
    assert!(corrupt_header(VERSION_AT, &9u32.to_le_bytes()).contains("version 9"));
    assert!(corrupt_header(ENTRY_COUNT_AT, &17u32.to_le_bytes()).contains("entry_count 17"));
    assert!(corrupt_header(SLOT_COUNT_AT, &9u32.to_le_bytes()).contains("expected"));
    assert!(corrupt_header(SLOT_COUNT_AT, &0u32.to_le_bytes()).contains("dimensions"));
    assert!(corrupt_header(BEGIN_PHYS_AT, &u64::MAX.to_le_bytes()).contains("inverted"));
    // An all-zero header is a torn creation only in the last file.
    assert!(corrupt_header(0, &[0; KI_HEADER_BYTES]).contains("bad magic"));
}

#[test]
fn torn_creation_of_last_file_is_reinitialised() {
    for torn in [&b""[..], &[0u8; 200][..]] {
        let dir = tempfile::tempdir().unwrap();
        let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
        for i in 0..16 {
            index.put("k", i, 0).unwrap();
        }
        drop(index);
        std::fs::write(dir.path().join(numbered_file_name(1)), torn).unwrap();
        let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
        assert_eq!(index.file_count(), 2);
        assert_eq!(index.last_physical_offset(), Some(15));
        index.put("k", 16, 1).unwrap();
        assert_eq!(index.file_count(), 2);
        assert_eq!(index.query("k", 0, 10, 3), vec![16, 15, 14]);
    }
}

#[test]
fn links_beyond_entry_count_are_ignored() {
    // After a power loss the slot page may be newer than the header page.
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    for i in 0..5 {
        index.put("k", i * 10, 0).unwrap();
    }
    drop(index);
    let path = dir.path().join(numbered_file_name(0));
    let mut file = std::fs::read(&path).unwrap();
    file[ENTRY_COUNT_AT..ENTRY_COUNT_AT + 4].copy_from_slice(&3u32.to_le_bytes());
    std::fs::write(&path, file).unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    check(&index, "k", 0, 0, 10, &[20, 10, 0]);
    assert_eq!(
        index.last_physical_offset(),
        Some(40),
        "the header page was not torn"
    );
    // The next put overwrites entry 4 and links it to the counted chain.
    index.put("k", 30, 0).unwrap();
    check(&index, "k", 0, 0, 10, &[30, 20, 10, 0]);
}

#[test]
fn layout_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), cfg(4, 2)).unwrap();
    index.put("a", 0x0102, -5).unwrap();
    index.flush().unwrap();
    let file = std::fs::read(dir.path().join(numbered_file_name(0))).unwrap();
    assert_eq!(file.len(), 64 + 4 * 4 + 2 * 24);
    assert_eq!(&file[..4], b"RMKI");
    assert_eq!(read_u32(&file, VERSION_AT), 2);
    assert_eq!(read_i64(&file, BEGIN_TIMESTAMP_MS_AT), -5);
    assert_eq!(read_i64(&file, END_TIMESTAMP_MS_AT), -5);
    assert_eq!(read_u64(&file, BEGIN_PHYS_AT), 0x0102);
    assert_eq!(read_u64(&file, END_PHYS_AT), 0x0102);
    assert_eq!(read_u32(&file, SLOT_COUNT_AT), 4);
    assert_eq!(read_u32(&file, ENTRIES_MAX_AT), 2);
    assert_eq!(read_u32(&file, ENTRY_COUNT_AT), 1);
    let hash = KeyHash::of("a");
    let slot = (hash.stored % 4) as usize;
    for s in 0..4 {
        let expected = u32::from(s == slot);
        assert_eq!(read_u32(&file, 64 + 4 * s), expected, "slot {s}");
    }
    let entry = &file[80..104];
    assert_eq!(read_u32(entry, 0), hash.stored);
    assert_eq!(read_u64(entry, 4), 0x0102);
    assert_eq!(read_i64(entry, 12), -5);
    assert_eq!(read_u32(entry, 20), 0);
    assert!(file[104..].iter().all(|&b| b == 0));
}

#[test]
fn default_config() {
    let cfg = KeyIndexConfig::default();
    assert_eq!(
        (cfg.slots_per_file, cfg.entries_per_file),
        (5_000_000, 20_000_000)
    );
    assert!(file_bytes(cfg.slots_per_file, cfg.entries_per_file).is_some());
}

/// With the next stretch allocated ahead (what the store does in the blocking pool), puts
/// past the file's first step never allocate on the putting thread; before, every MiB of
/// entries was an `fallocate` there. What was put is all found.
#[test]
fn puts_with_stretches_allocated_ahead_never_allocate_past_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), cfg(1_000, 200_000)).unwrap();
    let allocated = |index: &KeyIndex| index.files.back().map_or(0, |f| f.backing.allocated_to());
    let (mut by_puts_past_first_step, mut ahead_done) = (0, 0);
    const PUTS: u64 = 150_000;
    for n in 0..PUTS {
        let before = allocated(&index);
        index
            .put(&format!("k{}", n % 5_000), n * 100, 1_000 + n as i64)
            .unwrap();
        if allocated(&index) != before && before >= KI_ALLOC_STEP {
            by_puts_past_first_step += 1;
        }
        if let Some(ahead) = index.allocate_ahead() {
            assert!(
                index.allocate_ahead().is_none(),
                "one stretch out at a time"
            );
            ahead.allocate().unwrap();
            index.allocated_ahead(&ahead, true);
            ahead_done += 1;
        }
    }
    assert_eq!(by_puts_past_first_step, 0);
    assert!(ahead_done >= 2, "{ahead_done} stretches ahead");
    let end = allocated(&index);
    let last = index.files.back().unwrap();
    assert!(end >= (last.entry_at(last.entry_count()) + KI_ENTRY_BYTES) as u64);
    let meta = std::fs::metadata(dir.path().join(numbered_file_name(0))).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 >= end, "the blocks are there");
    let expected: Vec<u64> = (0..PUTS)
        .rev()
        .filter(|n| n % 5_000 == 7)
        .map(|n| n * 100)
        .collect();
    check(&index, "k7", 0, i64::MAX, 100, &expected);
}

/// A file the index creates is listed with its name unsynced (the checkpoint syncs its
/// directory) until a sync of that listing; files found at an opening are not.
#[test]
fn a_created_file_is_listed_with_its_name_to_sync_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    index.put("a", 1, 10).unwrap();
    let listed = index.dirty_files();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].name_unsynced);
    index.put("b", 2, 11).unwrap();
    assert!(index.files_synced(&listed).is_empty(), "no spare linked");
    let again = index.dirty_files();
    assert_eq!(again.len(), 1, "written since the listing");
    assert!(
        !again[0].name_unsynced,
        "the name was synced with the listing"
    );
    drop(index);
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    index.put("c", 3, 12).unwrap();
    assert!(index.dirty_files().iter().all(|f| !f.name_unsynced));
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Syncs every dirty file as the store's checkpoint does: named, synced, the spares' names
/// of those linked removed.
fn sync(index: &mut KeyIndex) {
    crate::index::dirty::sync_as_checkpoint(index.dirty_files(), |d| index.files_synced(d));
}

/// Makes the spare the index asks for now and hands it back.
fn make_spare(index: &mut KeyIndex) {
    let spare = index.spare_ahead().expect("a spare is asked for");
    assert!(index.spare_ahead().is_none(), "one out at a time");
    assert_eq!(index.spares().made(spare.make()), None, "taken");
    assert!(index.spare_ahead().is_none(), "one held at a time");
}

/// Each roll takes the spare made ahead with no file-system call; a sync names the files
/// (a crash before it loses them, and the keys in them, which the store replays from the
/// log as its checkpoint is behind them); a roll that has to create its file names those
/// still without a name first, so no named file follows an unnamed one.
#[test]
fn each_roll_takes_the_spare_made_ahead_and_a_sync_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    let mut model = Model::default();
    // The first file and three rolls, each from a spare: none creates its file on this
    // thread. The first file's is asked for by an index that has none.
    for i in 0..4 * u64::from(TINY.entries_per_file) {
        if i % u64::from(TINY.entries_per_file) == 0 {
            // Asked for as soon as the file has entries (a tiny file is always near its end).
            make_spare(&mut index);
        }
        let key = format!("k{}", i % 5);
        index.put(&key, i, i as i64).unwrap();
        model.puts.push((key, i, i as i64));
    }
    assert_eq!(index.spares().rolls_inline(), 0);
    assert_eq!(index.file_count(), 4);
    let names = names_in(dir.path());
    assert!(names.iter().all(|n| n.starts_with("spare-")), "{names:?}");
    let all_found = |index: &KeyIndex| {
        for key in ["k0", "k1", "k2", "k3", "k4"] {
            let expected = model.query(key, 0, i64::MAX, 100, |_| true);
            check(index, key, 0, i64::MAX, 100, &expected);
        }
    };
    all_found(&index);
    assert!(index.dirty_files().iter().all(|f| f.name_unsynced));
    let unnamed = index
        .dirty_files()
        .iter()
        .filter(|f| f.link_to.is_some())
        .count();
    assert_eq!(unnamed, 4);
    sync(&mut index);
    assert_eq!(
        names_in(dir.path()),
        (0..4).map(numbered_file_name).collect::<Vec<_>>(),
        "every spare named by the sync"
    );
    // Named, then reopened: the files read back as written.
    drop(index);
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    all_found(&index);

    // A roll from a spare, not synced, then one that creates its file: the first is named
    // by the second.
    let entries = u64::from(TINY.entries_per_file);
    make_spare(&mut index);
    for i in 4 * entries..6 * entries {
        index.put("late", i, i as i64).unwrap();
    }
    assert_eq!(index.spares().rolls_inline(), 1);
    assert_eq!(
        names_in(dir.path()),
        (0..6).map(numbered_file_name).collect::<Vec<_>>()
    );
    // A roll from a spare, then a crash: its file and keys are gone, the rest kept.
    make_spare(&mut index);
    for i in 6 * entries..7 * entries {
        index.put("lost", i, i as i64).unwrap();
    }
    check(&index, "lost", 0, i64::MAX, 1, &[7 * entries - 1]);
    drop(index);
    let index = KeyIndex::open(dir.path(), TINY).unwrap();
    assert_eq!(index.file_count(), 6);
    check(&index, "lost", 0, i64::MAX, 1, &[]);
    check(&index, "late", 0, i64::MAX, 1, &[6 * entries - 1]);
    assert_eq!(index.last_physical_offset(), Some(6 * entries - 1));
}

#[test]
fn a_roll_with_no_spare_ready_creates_its_file_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    index.put("k", 0, 0).unwrap();
    assert_eq!(
        index.spares().rolls_inline(),
        1,
        "the first file, no spare asked"
    );
    let out = index.spare_ahead().expect("asked for the next file");
    for i in 1..=u64::from(TINY.entries_per_file) {
        index.put("k", i, 0).unwrap();
    }
    assert_eq!(
        index.spares().rolls_inline(),
        2,
        "one roll, with no spare ready"
    );
    // The spare comes late: held for the next roll, which takes it.
    assert_eq!(index.spares().made(out.make()), None);
    for i in 0..u64::from(TINY.entries_per_file) {
        index.put("k", 100 + i, 0).unwrap();
    }
    assert_eq!((index.spares().rolls_inline(), index.file_count()), (2, 3));
    assert_eq!(names_in(dir.path()).len(), 3);
}

#[test]
fn leftover_spares_are_removed_at_open_and_one_of_another_opening_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    index.put("k", 1, 0).unwrap();
    // Held, not yet taken, when the index goes (a crash or a close).
    make_spare(&mut index);
    let late = index.spare_ahead();
    assert!(late.is_none());
    drop(index);
    assert_eq!(names_in(dir.path()).len(), 2, "the file and its spare");
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    assert_eq!(
        names_in(dir.path()),
        [numbered_file_name(0)],
        "spare removed"
    );
    check(&index, "k", 0, i64::MAX, 10, &[1]);
    // A spare asked for by another opening of the directory is not this index's.
    let mut other = KeyIndex::open(dir.path(), TINY).unwrap();
    let theirs = other.spare_ahead().unwrap().make();
    let refused = index.spares().made(theirs).expect("refused");
    assert!(refused.exists(), "left for the caller to remove");
    assert!(index.spare_ahead().is_some(), "this index asks its own");
}

#[test]
fn a_spare_that_cannot_be_made_is_asked_again_only_after_the_next_roll() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    index.put("k", 1, 0).unwrap();
    let spare = index.spare_ahead().unwrap();
    // Something in the way of its name: not made, and not removed (not created there).
    std::fs::write(&spare.path, b"in the way").unwrap();
    let path = spare.path.clone();
    let made = spare.make();
    assert!(made.failure().is_some());
    assert_eq!(index.spares().made(made), None);
    assert_eq!(std::fs::read(&path).unwrap(), b"in the way");
    assert!(index.spare_ahead().is_none(), "not until the next roll");
    for i in 1..u64::from(TINY.entries_per_file) {
        index.put("k", 1 + i, 0).unwrap();
    }
    assert!(
        index.spare_ahead().is_none(),
        "the file is full, not rolled"
    );
    index.put("k", 100, 0).unwrap();
    assert_eq!(
        index.spares().rolls_inline(),
        2,
        "the first file and the roll"
    );
    assert!(index.spare_ahead().is_some(), "asked again after the roll");
}

/// Every file of `dir` by name, with its bytes.
fn files_of(dir: &Path) -> HashMap<String, Vec<u8>> {
    names_in(dir)
        .into_iter()
        .map(|name| {
            let bytes = std::fs::read(dir.join(&name)).unwrap();
            (name, bytes)
        })
        .collect()
}

/// A power loss after a checkpoint, then an unclean start: every 512-byte block written
/// since may have reached the disk or not, a file created since may be missing, and the
/// start keeps what the checkpoint found synced, then replay puts the records from the
/// checkpoint on again. Queries then answer as if nothing was lost, with or without a cut
/// of the log (and entries written again) in between, and across rolls.
#[test]
fn after_a_power_loss_an_unclean_start_keeps_what_the_checkpoint_synced_and_replay_the_rest() {
    const BLOCK: usize = 512;
    let key_count = 40;
    assert_no_stored_hash_collision(key_count);
    for seed in 0..40u64 {
        // With 256 slots the header and the slots span blocks: either may land alone.
        let cfg = cfg([64, 256][seed as usize % 2], 120);
        let mut rng = StdRng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let mut index = KeyIndex::open(dir.path(), cfg).unwrap();
        let mut model = Model::default();
        let messages = rng.gen_range(1..150);
        fill(&mut index, &mut model, &mut rng, messages, key_count);
        // The checkpoint: records below `durable` are on disk, a few after it are not yet.
        let in_flight = rng.gen_range(0..6).min(model.puts.len() - 1);
        let durable = model.puts[model.puts.len() - 1 - in_flight].1;
        let synced = index.entries_below(durable);
        index.flush().unwrap();
        let at_checkpoint = files_of(dir.path());
        // Work since: more puts (often a roll), and sometimes a cut of the log past its
        // durable end whose entries' places are then written again.
        let messages = rng.gen_range(0..120);
        fill(&mut index, &mut model, &mut rng, messages, key_count);
        if rng.gen_bool(0.5) {
            let last = model.puts.last().unwrap().1;
            let cut = rng.gen_range(durable..=last);
            index.forget_from_physical(cut);
            model.puts.retain(|p| p.1 < cut);
            let messages = rng.gen_range(0..60);
            fill(&mut index, &mut model, &mut rng, messages, key_count);
        }
        drop(index);
        // The power loss.
        for (name, new) in files_of(dir.path()) {
            let path = dir.path().join(&name);
            let old = at_checkpoint.get(&name);
            if old.is_none() && rng.gen_bool(0.3) {
                std::fs::remove_file(&path).unwrap();
                continue;
            }
            let mut landed = new.clone();
            for (n, block) in landed.chunks_mut(BLOCK).enumerate() {
                if rng.gen_bool(0.5) {
                    let from = n * BLOCK;
                    match old {
                        Some(old) => block.copy_from_slice(&old[from..from + block.len()]),
                        None => block.fill(0),
                    }
                }
            }
            std::fs::write(&path, landed).unwrap();
        }
        let mut index = KeyIndex::open_after_crash(dir.path(), cfg, synced).unwrap();
        // Replay from the checkpoint, past what the index holds.
        let kept = index.last_physical_offset();
        assert!(kept.is_none_or(|k| k < durable), "seed {seed}: {kept:?}");
        for (key, phys, ts) in &model.puts {
            if *phys >= durable {
                index.put(key, *phys, *ts).unwrap();
            }
        }
        check_against_model(&index, &model, &mut rng, key_count, |_| true);
        // And it goes on from there: it reopens as it was.
        index.flush().unwrap();
        drop(index);
        let index = KeyIndex::open(dir.path(), cfg).unwrap();
        check_against_model(&index, &model, &mut rng, key_count, |_| true);
    }
}

/// What a checkpoint records: the end of the entries of records below its offset, in the
/// newest file holding one.
#[test]
fn entries_below_an_offset_end_at_the_last_entry_of_a_record_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), cfg(4, 3)).unwrap();
    assert_eq!(index.entries_below(100), KeysSynced::Nothing);
    for (key, phys) in [("a", 10), ("b", 10), ("c", 20), ("d", 30), ("e", 30)] {
        index.put(key, phys, 0).unwrap();
    }
    let up_to = |seq, count| KeysSynced::UpTo { seq, count };
    assert_eq!(index.entries_below(10), KeysSynced::Nothing);
    assert_eq!(index.entries_below(11), up_to(0, 2));
    assert_eq!(index.entries_below(21), up_to(0, 3));
    assert_eq!(index.entries_below(30), up_to(0, 3));
    assert_eq!(index.entries_below(31), up_to(1, 2));
}

/// A version 1 file (slots from the whole 64-bit hash) is still read, with its own slots,
/// and kept after an unclean start to what the checkpoint synced; puts go to a new file of
/// version 2 from the first one on (a version 1 file's slots cannot be rebuilt).
#[test]
fn a_version_1_file_is_read_with_its_own_slots_and_written_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(numbered_file_name(0));
    let (slots, entries) = (4u32, 3u32);
    let mut file = vec![0u8; file_bytes(slots, entries).unwrap()];
    write_u32(&mut file, MAGIC_AT, KI_MAGIC);
    write_u32(&mut file, VERSION_AT, KI_VERSION_1);
    write_u32(&mut file, SLOT_COUNT_AT, slots);
    write_u32(&mut file, ENTRIES_MAX_AT, entries);
    write_u32(&mut file, ENTRY_COUNT_AT, 2);
    write_u64(&mut file, BEGIN_PHYS_AT, 6);
    write_u64(&mut file, END_PHYS_AT, 7);
    let hash = KeyHash::of("a");
    write_u32(&mut file, 64 + 4 * (hash.full % 4) as usize, 2);
    for (n, phys) in [(1u32, 6u64), (2, 7)] {
        let entry = &mut file[80 + 24 * (n as usize - 1)..][..24];
        write_u32(entry, ENTRY_KEY_HASH_AT, hash.stored);
        write_u64(entry, ENTRY_PHYS_AT, phys);
        write_u32(entry, ENTRY_PREV_AT, n - 1);
    }
    std::fs::write(&path, file).unwrap();
    let synced = KeysSynced::UpTo { seq: 0, count: 1 };
    let index = KeyIndex::open(dir.path(), cfg(slots, entries)).unwrap();
    check(&index, "a", 0, 0, 10, &[7, 6]);
    drop(index);
    let mut index = KeyIndex::open_after_crash(dir.path(), cfg(slots, entries), synced).unwrap();
    check(&index, "a", 0, 0, 10, &[6]);
    assert_eq!(index.last_physical_offset(), Some(6));
    index.put("a", 8, 0).unwrap();
    index.put("a", 9, 0).unwrap();
    check(&index, "a", 0, 0, 10, &[9, 8, 6]);
    index.flush().unwrap();
    let version = |seq| {
        let file = std::fs::read(dir.path().join(numbered_file_name(seq))).unwrap();
        (read_u32(&file, VERSION_AT), read_u32(&file, ENTRY_COUNT_AT))
    };
    assert_eq!((version(0), version(1)), ((1, 1), (2, 2)));
}

/// The file holding the entries a checkpoint synced is never taken for a torn creation:
/// its header all zeros is damage, refused, not a file made again empty.
#[test]
fn a_zeroed_header_on_the_file_holding_synced_entries_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = KeyIndex::open(dir.path(), TINY).unwrap();
    index.put("k", 10, 0).unwrap();
    let synced = index.entries_below(11);
    index.flush().unwrap();
    drop(index);
    let path = dir.path().join(numbered_file_name(0));
    let mut file = std::fs::read(&path).unwrap();
    file[..KI_HEADER_BYTES].fill(0);
    std::fs::write(&path, file).unwrap();
    let refused = KeyIndex::open_after_crash(dir.path(), TINY, synced).err();
    assert!(
        matches!(refused, Some(IndexError::Corrupt { .. })),
        "{refused:?}"
    );
    // Without synced entries there (none, or not known) it is a torn creation.
    let index = KeyIndex::open_after_crash(dir.path(), TINY, KeysSynced::Unknown).unwrap();
    assert_eq!(index.last_physical_offset(), None);
}
