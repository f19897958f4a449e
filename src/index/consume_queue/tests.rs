use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn cfg(entries_per_file: u64) -> ConsumeQueueConfig {
    ConsumeQueueConfig { entries_per_file }
}

fn open(dir: &Path, entries_per_file: u64) -> ConsumeQueue {
    let queue = ConsumeQueue::open(dir, cfg(entries_per_file)).unwrap();
    queue.check_invariants();
    queue
}

/// The entry the tests put at `queue_offset`: records of 100 bytes, back to back, with
/// a gap of `queue_offset % 3` bytes (other queues' records) and a tag on even offsets.
fn entry(queue_offset: u64) -> CqEntry {
    CqEntry {
        physical_offset: queue_offset * 103,
        size: 100,
        tag_hash: if queue_offset.is_multiple_of(2) {
            crate::index::tag_hash(&format!("tag{}", queue_offset % 5))
        } else {
            crate::index::TAG_HASH_NONE
        },
    }
}

fn append(queue: &mut ConsumeQueue, offsets: std::ops::Range<u64>) {
    for queue_offset in offsets {
        queue.put(queue_offset, entry(queue_offset)).unwrap();
    }
    queue.check_invariants();
}

/// The queue serves exactly `entry(q)` for q in `[min, max)` and nothing else.
fn check(queue: &ConsumeQueue, min: u64, max: u64) {
    queue.check_invariants();
    assert_eq!(queue.min_offset(), min, "min");
    assert_eq!(queue.max_offset(), max, "max");
    for queue_offset in min.saturating_sub(5)..max + 5 {
        let expected = (min..max)
            .contains(&queue_offset)
            .then(|| entry(queue_offset));
        assert_eq!(
            queue.get(queue_offset).unwrap(),
            expected,
            "get({queue_offset})"
        );
    }
    let last = (max > min).then(|| (max - 1, entry(max - 1)));
    assert_eq!(queue.last_entry(), last);
}

/// Syncs every dirty file as the store's checkpoint does: named, synced, the spares'
/// names of those linked removed.
fn sync(queue: &mut ConsumeQueue) {
    crate::index::dirty::sync_as_checkpoint(queue.dirty_files(), |d| queue.files_synced(d));
}

fn file_bases(dir: &Path) -> Vec<u64> {
    list_files(dir)
        .unwrap()
        .0
        .into_iter()
        .map(|(base, _)| base)
        .collect()
}

#[test]
fn empty_queue() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(dir.path(), 4);
    check(&queue, 0, 0);
    assert_eq!(queue.get(0).unwrap(), None);
    drop(queue);
    check(&open(dir.path(), 4), 0, 0);
}

#[test]
fn files_are_mapped_on_use_and_closed_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..10);
    assert_eq!(file_bases(dir.path()), [0, 4, 8]);
    assert_eq!(queue.mapped_files(), 3);
    drop(queue);

    // A reopen finds the end without mapping anything; the end and the last entry come
    // from reading the files.
    let mut queue = ConsumeQueue::open(dir.path(), cfg(4)).unwrap();
    assert_eq!(queue.mapped_files(), 0);
    assert_eq!(queue.max_offset(), 10);
    assert_eq!(queue.last_entry(), Some((9, entry(9))));
    assert_eq!(queue.end_within(u64::MAX).unwrap(), 10);
    assert_eq!(
        queue.mapped_files(),
        0,
        "the end is known without a mapping"
    );

    // A read maps the one file it needs.
    assert_eq!(queue.get(5).unwrap(), Some(entry(5)));
    assert_eq!(queue.mapped_files(), 1);
    // Used since the last sweep: kept by the first, closed by the second.
    assert_eq!(queue.close_idle(&mut Vec::new()), 0);
    assert_eq!(queue.mapped_files(), 1);
    assert_eq!(queue.close_idle(&mut Vec::new()), 1);
    assert_eq!(queue.mapped_files(), 0);

    // Appends to a closed file map it again; what they write is listed as dirty even after
    // the file is closed, and a reopen sees it.
    sync(&mut queue);
    for q in 10..13 {
        queue.put(q, entry(q)).unwrap();
    }
    assert_eq!(queue.mapped_files(), 2, "the last file and the new one");
    queue.close_idle(&mut Vec::new());
    queue.close_idle(&mut Vec::new());
    assert_eq!(queue.mapped_files(), 0);
    let dirty: Vec<u64> = queue.dirty_files().iter().map(|f| f.key).collect();
    assert_eq!(dirty, [8, 12]);
    queue.flush().unwrap();
    assert!(queue.dirty_files().is_empty());
    assert_eq!(
        queue.mapped_files(),
        0,
        "flushing a closed file does not map it"
    );
    drop(queue);
    check(&open(dir.path(), 4), 0, 13);
}

#[test]
fn reopen_reads_a_big_sparse_file_only_up_to_its_data() {
    // The default file size: 300,000 entries (5.7 MiB), of which 3 are used. The scan
    // starts at the end of the file's data, so it agrees with a full scan.
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 300_000);
    append(&mut queue, 0..3);
    drop(queue);
    let path = dir.path().join(numbered_file_name(0));
    assert_eq!(
        entries_in_file(&path, 300_000 * CQ_ENTRY_BYTES).unwrap(),
        Some((3, entry(2)))
    );
    check(&open(dir.path(), 300_000), 0, 3);
}

/// A page allocated ahead and never written reads as a hole (a power loss lost it), while
/// the next page, holding later entries, reached the disk: the entries past the hole are
/// found (before, the scan started at the first hole and missed them).
#[test]
fn entries_past_a_hole_in_the_file_are_found() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(numbered_file_name(0));
    let per_page = 4096 / CQ_ENTRY_BYTES;
    let file_bytes = 300_000 * CQ_ENTRY_BYTES;
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(file_bytes).unwrap();
    let write = |queue_offset: u64| {
        let mut bytes = [0u8; CQ_ENTRY_BYTES as usize];
        entry(queue_offset).encode(&mut bytes);
        file.write_all_at(&bytes, queue_offset * CQ_ENTRY_BYTES)
            .unwrap();
    };
    write(0);
    // The first entry wholly in the third page: the second page is a hole.
    let later = (2 * 4096u64).div_ceil(CQ_ENTRY_BYTES);
    assert!(later < 3 * per_page);
    write(later);
    file.sync_all().unwrap();
    assert_eq!(
        entries_in_file(&path, file_bytes).unwrap(),
        Some((later + 1, entry(later)))
    );
}

#[test]
fn dense_appends_across_files_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..37);
    check(&queue, 0, 37);
    assert_eq!(
        file_bases(dir.path()),
        (0..10).map(|i| i * 4).collect::<Vec<_>>()
    );
    queue.flush().unwrap();
    drop(queue);
    let mut queue = open(dir.path(), 4);
    check(&queue, 0, 37);
    // Appending after a reopen continues in the same file, then rolls.
    append(&mut queue, 37..45);
    check(&queue, 0, 45);
    drop(queue);
    check(&open(dir.path(), 4), 0, 45);
}

#[test]
fn reopen_at_exact_file_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..8);
    assert_eq!(file_bases(dir.path()), vec![0, 4]);
    drop(queue);
    let mut queue = open(dir.path(), 4);
    check(&queue, 0, 8);
    append(&mut queue, 8..9);
    assert_eq!(file_bases(dir.path()), vec![0, 4, 8]);
    check(&queue, 0, 9);
}

#[test]
fn entry_layout_is_little_endian_20_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    let e = CqEntry {
        physical_offset: 0x0000_0304_0506_0708,
        size: 0x1112_1314,
        tag_hash: 0x2122_2324_2526_2728,
    };
    queue.put(0, e).unwrap();
    queue.flush().unwrap();
    let bytes = std::fs::read(dir.path().join("00000000000000000000")).unwrap();
    assert_eq!(bytes.len(), 4 * 20);
    let plain = [
        8, 7, 6, 5, 4, 3, 0, 0, 0x14, 0x13, 0x12, 0x11, 0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22,
        0x21,
    ];
    // The top 16 bits of the offset: bit 63 set, then 15 bits of the CRC32C of the rest.
    let check = 0x8000 | (crc32c::crc32c(&plain) & 0x7fff) as u16;
    let mut want = plain;
    want[6..8].copy_from_slice(&check.to_le_bytes());
    assert_eq!(&bytes[..20], &want);
    assert!(bytes[20..].iter().all(|&b| b == 0));
}

#[test]
fn hole_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..5);
    let err = queue.put(7, entry(7)).unwrap_err();
    assert!(
        matches!(err, IndexError::Hole { offset: 7, max: 5 }),
        "{err}"
    );
    assert_eq!(err.to_string(), "consume queue hole: put at 7, max is 5");
    check(&queue, 0, 5);
}

#[test]
fn empty_queue_starts_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 1000..1006);
    check(&queue, 1000, 1006);
    assert_eq!(file_bases(dir.path()), vec![1000, 1004]);
    drop(queue);
    check(&open(dir.path(), 4), 1000, 1006);
}

#[test]
fn overwrite_in_place_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..10);
    // Replay re-puts everything from an older checkpoint, then continues.
    append(&mut queue, 3..10);
    append(&mut queue, 0..14);
    check(&queue, 0, 14);
    drop(queue);
    check(&open(dir.path(), 4), 0, 14);
}

/// An append before the previous entry's end (that entry damaged on disk) is a typed
/// error naming it, not a panic of the shard; the queue is unchanged.
#[test]
fn append_going_backward_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..3);
    match queue.put(3, entry(1)) {
        Err(IndexError::Corrupt { reason, .. }) => {
            assert!(
                reason.contains("entry 2 (log offset 206, size 100)"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    check(&queue, 0, 3);
}

#[test]
#[should_panic(expected = "size 0")]
fn size_zero_panics() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    let e = CqEntry {
        size: 0,
        ..entry(0)
    };
    queue.put(0, e).unwrap();
}

#[test]
fn truncate_after_log_end_drops_exact_suffix() {
    let check_truncate = |log_end: u64, expected_max: u64| {
        let dir = tempfile::tempdir().unwrap();
        let mut queue = open(dir.path(), 4);
        append(&mut queue, 0..23);
        queue.truncate_after_log_end(log_end).unwrap();
        check(&queue, 0, expected_max);
        drop(queue);
        let mut queue = open(dir.path(), 4);
        check(&queue, 0, expected_max);
        // The queue continues from the truncation point.
        append(&mut queue, expected_max..expected_max + 6);
        check(&queue, 0, expected_max + 6);
        drop(queue);
        check(&open(dir.path(), 4), 0, expected_max + 6);
    };
    // Entry q spans [103q, 103q + 100).
    check_truncate(u64::MAX, 23);
    check_truncate(22 * 103 + 100, 23);
    check_truncate(22 * 103 + 99, 22);
    check_truncate(10 * 103 + 100, 11);
    check_truncate(10 * 103 + 102, 11);
    check_truncate(8 * 103 + 99, 8); // at a file boundary
    check_truncate(100, 1);
    check_truncate(99, 0);
    check_truncate(0, 0);
}

#[test]
fn truncate_to() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..20);
    queue.truncate_to(25).unwrap(); // beyond max: nothing to drop
    check(&queue, 0, 20);
    queue.truncate_to(13).unwrap();
    check(&queue, 0, 13);
    queue.truncate_to(12).unwrap();
    check(&queue, 0, 12);
    assert_eq!(file_bases(dir.path()), vec![0, 4, 8, 12]);
    drop(queue);
    let mut queue = open(dir.path(), 4);
    check(&queue, 0, 12);
    queue.truncate_to(0).unwrap();
    check(&queue, 0, 0);
    drop(queue);
    let mut queue = open(dir.path(), 4);
    check(&queue, 0, 0);
    append(&mut queue, 0..3);
    check(&queue, 0, 3);
}

#[test]
fn delete_before_physical_removes_files_and_advances_min() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..22);
    // Nothing below the log's start.
    assert_eq!(queue.delete_before_physical(0).unwrap(), 0);
    check(&queue, 0, 22);
    // Entry 9 starts at 927: entries 0..=9 go; file 0..4 and 4..8 go, 8..12 stays.
    assert_eq!(queue.delete_before_physical(9 * 103 + 1).unwrap(), 10);
    check(&queue, 10, 22);
    assert_eq!(file_bases(dir.path()), vec![8, 12, 16, 20]);
    // A smaller log_min never moves min back.
    assert_eq!(queue.delete_before_physical(5).unwrap(), 10);
    check(&queue, 10, 22);
    // A reopen reports the first file's base; the store re-applies retention.
    drop(queue);
    let mut queue = open(dir.path(), 4);
    check(&queue, 8, 22);
    assert_eq!(queue.delete_before_physical(9 * 103 + 1).unwrap(), 10);
    check(&queue, 10, 22);
    // Exactly at a file boundary.
    assert_eq!(queue.delete_before_physical(16 * 103).unwrap(), 16);
    check(&queue, 16, 22);
    assert_eq!(file_bases(dir.path()), vec![16, 20]);
    // Everything: the last file stays so a reopen still knows max.
    assert_eq!(queue.delete_before_physical(u64::MAX).unwrap(), 22);
    check(&queue, 22, 22);
    assert_eq!(file_bases(dir.path()), vec![20]);
    append(&mut queue, 22..27);
    check(&queue, 22, 27);
    drop(queue);
    check(&open(dir.path(), 4), 20, 27);
}

#[test]
fn delete_everything_at_full_last_file_then_restart_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..8);
    assert_eq!(queue.delete_before_physical(u64::MAX).unwrap(), 8);
    check(&queue, 8, 8);
    assert_eq!(file_bases(dir.path()), vec![4]);
    drop(queue);
    let mut queue = open(dir.path(), 4);
    check(&queue, 4, 8);
    queue.delete_before_physical(u64::MAX).unwrap();
    check(&queue, 8, 8);
    // The empty queue may restart at any offset; its old files go.
    append(&mut queue, 50..53);
    check(&queue, 50, 53);
    assert_eq!(file_bases(dir.path()), vec![50]);
    // Below min is a no-op.
    queue.put(8, entry(8)).unwrap();
    check(&queue, 50, 53);
}

#[test]
fn recovery_removes_files_before_a_gap_and_after_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..18);
    queue.flush().unwrap();
    drop(queue);
    // A crash mid-retention lost file 4 but not file 0; a crash after rolling left an
    // empty file 20, and a crash before sizing left an empty file 24.
    std::fs::remove_file(dir.path().join(numbered_file_name(4))).unwrap();
    std::fs::write(dir.path().join(numbered_file_name(20)), vec![0; 80]).unwrap();
    std::fs::write(dir.path().join(numbered_file_name(24)), b"").unwrap();
    std::fs::write(dir.path().join("not-a-queue-file"), b"x").unwrap();
    let queue = open(dir.path(), 4);
    check(&queue, 8, 18);
    assert_eq!(file_bases(dir.path()), vec![8, 12, 16]);
}

#[test]
fn recovery_after_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..10);
    queue.flush().unwrap();
    drop(queue);
    // The last entries never reached the disk.
    let path = dir.path().join(numbered_file_name(8));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[20..40].fill(0);
    std::fs::write(&path, bytes).unwrap();
    check(&open(dir.path(), 4), 0, 9);
}

#[test]
fn wrong_file_size_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..5);
    drop(queue);
    let err = ConsumeQueue::open(dir.path(), cfg(8)).err().unwrap();
    let message = err.to_string();
    assert!(matches!(err, IndexError::Corrupt { .. }), "{message}");
    assert!(message.contains("00000000000000000000"), "{message}");
    assert!(message.contains("entries_per_file"), "{message}");
}

#[test]
fn default_config() {
    assert_eq!(ConsumeQueueConfig::default().entries_per_file, 300_000);
}

/// Operations for the model test; offsets are reduced modulo the current range.
#[derive(Debug, Clone)]
enum Op {
    Append(u8),
    Replay(u16, u8),
    TruncateAfterLogEnd(u16),
    TruncateTo(u16),
    DeleteBefore(u16),
    Flush,
    /// The store's checkpoint: every dirty file named and synced.
    Sync,
    /// Dropped and opened again (as after a crash): files not named yet are lost.
    Reopen,
    CloseIdle,
    /// A spare asked for, made and handed back (if the queue asks).
    Spare,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..12).prop_map(Op::Append),
        1 => (any::<u16>(), 1u8..8).prop_map(|(at, n)| Op::Replay(at, n)),
        1 => any::<u16>().prop_map(Op::TruncateAfterLogEnd),
        1 => any::<u16>().prop_map(Op::TruncateTo),
        1 => any::<u16>().prop_map(Op::DeleteBefore),
        1 => Just(Op::Flush),
        1 => Just(Op::Sync),
        1 => Just(Op::Reopen),
        1 => Just(Op::CloseIdle),
        2 => Just(Op::Spare),
    ]
}

/// What the queue must serve: entries of `[min, max)`, plus entries below `min` that a
/// reopen may serve again (retention inside a file is not persisted).
struct Model {
    min: u64,
    max: u64,
    entries: BTreeMap<u64, CqEntry>,
}

impl Model {
    fn check(&self, queue: &ConsumeQueue) {
        queue.check_invariants();
        assert_eq!(queue.min_offset(), self.min);
        assert_eq!(queue.max_offset(), self.max);
        for queue_offset in self.min.saturating_sub(2)..self.max + 2 {
            let expected = (self.min..self.max)
                .contains(&queue_offset)
                .then(|| self.entries[&queue_offset]);
            assert_eq!(
                queue.get(queue_offset).unwrap(),
                expected,
                "get({queue_offset})"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn matches_model(entries_per_file in 1u64..6, ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut queue = open(dir.path(), entries_per_file);
        let mut model = Model { min: 0, max: 0, entries: BTreeMap::new() };
        for op in ops {
            match op {
                Op::Append(n) => {
                    for _ in 0..n {
                        let q = model.max;
                        queue.put(q, entry(q)).unwrap();
                        model.entries.insert(q, entry(q));
                        model.max += 1;
                    }
                }
                Op::Replay(at, n) => {
                    let span = model.max - model.min + 1;
                    let from = model.min + u64::from(at) % span;
                    for q in from..(from + u64::from(n)).min(model.max + 1) {
                        queue.put(q, entry(q)).unwrap();
                        model.entries.insert(q, entry(q));
                        model.max = model.max.max(q + 1);
                    }
                }
                Op::TruncateAfterLogEnd(at) => {
                    let log_end = u64::from(at) % ((model.max + 1) * 103);
                    queue.truncate_after_log_end(log_end).unwrap();
                    let first_beyond = (model.min..model.max)
                        .find(|q| entry(*q).end() > log_end)
                        .unwrap_or(model.max);
                    model.max = first_beyond;
                    model.entries.retain(|&q, _| q < first_beyond);
                }
                Op::TruncateTo(at) => {
                    // Within [min, max]: below the first file the queue forgets its
                    // offsets on disk, which the store does not rely on.
                    let q = model.min + u64::from(at) % (model.max - model.min + 1);
                    queue.truncate_to(q).unwrap();
                    model.max = q;
                    model.entries.retain(|&k, _| k < q);
                }
                Op::DeleteBefore(at) => {
                    let log_min = u64::from(at) % ((model.max + 2) * 103);
                    let new_min = (model.min..model.max)
                        .find(|q| entry(*q).physical_offset >= log_min)
                        .unwrap_or(model.max);
                    prop_assert_eq!(queue.delete_before_physical(log_min).unwrap(), new_min);
                    model.min = new_min;
                }
                Op::Flush => queue.flush().unwrap(),
                Op::Sync => sync(&mut queue),
                Op::CloseIdle => {
                    // The first call marks what was used as unused, the second closes it.
                    let mut doomed = Vec::new();
                    queue.close_idle(&mut doomed);
                    queue.close_idle(&mut doomed);
                    prop_assert_eq!(queue.mapped_files(), 0);
                    for path in doomed {
                        std::fs::remove_file(path).unwrap();
                    }
                }
                Op::Spare => {
                    if let Some(spare) = queue.spare_ahead() {
                        prop_assert_eq!(queue.spares().made(spare.make()), None);
                    }
                }
                Op::Reopen => {
                    // Files not named yet are the last ones; their entries go.
                    let lost_from = queue.segments.iter().find(|s| s.link_to.is_some());
                    let kept_to = lost_from.map_or(model.max, |s| s.base.min(model.max));
                    drop(queue);
                    queue = open(dir.path(), entries_per_file);
                    prop_assert!(spares(dir.path()).is_empty());
                    model.max = kept_to;
                    if file_bases(dir.path()).is_empty() {
                        // All went: an empty queue, as a new one.
                        model.min = 0;
                        model.max = 0;
                    }
                    model.entries.retain(|&q, _| q < model.max);
                    // Reopen reports the first file's base: an older min, whose entries
                    // the model still knows.
                    prop_assert!(queue.min_offset() <= model.min);
                    model.min = queue.min_offset();
                }
            }
            model.check(&queue);
            let unnamed = queue.segments.iter().filter(|s| s.link_to.is_some()).count();
            prop_assert_eq!(
                spares(dir.path()).len(),
                unnamed + usize::from(queue.spares.held())
            );
            // Unnamed files are the last ones: a crash leaves no gap.
            let named = queue.segments.iter().rev().skip(unnamed);
            prop_assert!(named.into_iter().all(|s| s.link_to.is_none()));
        }
    }
}

/// `end_within` agrees with counting the entries whose record ends within the log end, for
/// every log end around every entry: found by the walk over the newest entries or by the
/// search over older ones, and at `min_offset` when nothing kept ends within it.
#[test]
fn end_within_counts_the_entries_a_log_end_covers() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 4);
    append(&mut queue, 0..30);
    queue
        .delete_before_physical(entry(3).physical_offset)
        .unwrap();
    let min = queue.min_offset();
    for q in 0..31u64 {
        for log_end in [q * 103, q * 103 + 99, q * 103 + 100] {
            let covered = (min..30).filter(|&o| entry(o).end() <= log_end).count() as u64;
            assert_eq!(
                queue.end_within(log_end).unwrap(),
                min + covered,
                "log end {log_end}"
            );
        }
    }
}

/// What the newest file has allocated, if it is mapped.
fn allocated_to(queue: &ConsumeQueue) -> Option<u64> {
    let segment = queue.segments.back()?;
    Some(segment.open.get()?.backing.allocated_to())
}

/// With each stretch asked for ahead allocated (as the store does in its blocking pool),
/// appends allocate on their own thread only the file's first page (which the store's
/// `open_queues` reserves off the thread too): a queue of 60,000 entries (1.2 MB) grows by
/// doubling chunks (8 to 64 KiB) and then steps of 64 KiB, all ahead, where every chunk
/// and step was the appending thread's (23 allocations) before.
#[test]
fn appends_with_stretches_allocated_ahead_rarely_allocate_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100_000);
    let (mut by_appends, mut ahead_done) = (0, 0);
    for queue_offset in 0..60_000 {
        let before = allocated_to(&queue);
        queue.reserve_next().unwrap();
        if allocated_to(&queue) != before {
            by_appends += 1;
        }
        queue.put(queue_offset, entry(queue_offset)).unwrap();
        let ahead = queue.allocate_ahead();
        if queue_offset < 100 {
            assert!(ahead.is_none(), "a queue of a few entries keeps one page");
        }
        if let Some(ahead) = ahead {
            assert!(
                queue.allocate_ahead().is_none(),
                "one stretch out at a time"
            );
            ahead.allocate().unwrap();
            queue.allocated_ahead(&ahead, true);
            ahead_done += 1;
        }
    }
    check(&queue, 0, 60_000);
    assert_eq!(by_appends, 1, "the first 4 KiB, then only ahead");
    assert_eq!(
        ahead_done,
        4 + 19,
        "8, 16, 32, 64 KiB, then 19 steps of 64 KiB"
    );
    let end = allocated_to(&queue).unwrap();
    assert!(end >= entry_at(60_000) as u64 + CQ_ENTRY_BYTES);
    let meta = std::fs::metadata(dir.path().join(numbered_file_name(0))).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.blocks() * 512 >= end,
        "the blocks are there: {}",
        meta.blocks()
    );
}

/// The result of a stretch asked for before the file was closed and mapped again is
/// ignored: the mapping's record of what is allocated starts from what was known at the
/// close, and a failed stretch adds nothing.
#[test]
fn a_stretch_allocated_ahead_counts_only_for_the_mapping_that_asked() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100_000);
    let mut n = 0;
    let ahead = loop {
        append(&mut queue, n..n + 1);
        n += 1;
        if let Some(ahead) = queue.allocate_ahead() {
            break ahead;
        }
        assert!(
            n < 10_000,
            "a stretch is asked for once appends near the first page's end"
        );
    };
    let known = allocated_to(&queue).unwrap();
    queue.allocated_ahead(&ahead, false);
    assert_eq!(
        allocated_to(&queue),
        Some(known),
        "a failed stretch adds nothing"
    );
    let again = queue
        .allocate_ahead()
        .expect("asked again once the last one failed");
    assert_eq!(queue.close_idle(&mut Vec::new()), 0);
    assert_eq!(queue.close_idle(&mut Vec::new()), 1, "closed idle");
    append(&mut queue, n..n + 1);
    again.allocate().unwrap();
    queue.allocated_ahead(&again, true);
    assert_eq!(
        allocated_to(&queue),
        Some(known),
        "mapped again since: the old mapping's stretch is not counted"
    );
}

/// Names of the spare files in `dir`.
fn spares(dir: &Path) -> Vec<PathBuf> {
    list_files(dir)
        .unwrap()
        .1
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(crate::index::spare::SPARE_PREFIX)
        })
        .collect()
}

/// Asks `queue` for a spare (it must ask), makes it and hands it back.
fn give_spare(queue: &mut ConsumeQueue) {
    let spare = queue.spare_ahead().expect("the queue asks for a spare");
    assert!(queue.spare_ahead().is_none(), "one spare out at a time");
    assert_eq!(queue.spares().made(spare.make()), None, "taken");
    assert!(queue.spare_ahead().is_none(), "one spare held at a time");
}

mod checks;
mod spares;

/// The next append's file is mapped when its room is reserved, before the record goes to
/// the log: a file that cannot be mapped again (an idle close unmapped it, and no
/// descriptor is left to open it; here it is out of the way) fails the reservation with
/// nothing changed. Before, it failed the entry's write, the record already in the log.
#[test]
fn the_next_appends_file_is_mapped_when_its_room_is_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    for q in 0..3 {
        queue.reserve_next().unwrap();
        queue.put(q, entry(q)).unwrap();
    }
    sync(&mut queue);
    queue.close_idle(&mut Vec::new());
    queue.close_idle(&mut Vec::new());
    assert_eq!(queue.mapped_files(), 0);
    let bases = file_bases(dir.path());
    assert_eq!(bases.len(), 1);
    let file = dir.path().join(crate::index::numbered_file_name(bases[0]));
    let aside = dir.path().join("aside");
    std::fs::rename(&file, &aside).unwrap();
    assert!(queue.reserve_next().is_err(), "reserved without its file");
    assert_eq!(queue.max_offset(), 3);
    std::fs::rename(&aside, &file).unwrap();
    queue.reserve_next().unwrap();
    assert_eq!(queue.mapped_files(), 1);
    queue.put(3, entry(3)).unwrap();
    assert_eq!(queue.get(3).unwrap(), Some(entry(3)));
}
