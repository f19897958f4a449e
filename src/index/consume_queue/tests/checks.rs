//! Each entry's check: a damaged entry is an error to a checked read (a tag filter's),
//! never a message skipped; a torn entry at the tail does not stop a reopen (the store's
//! replay overwrites it); entries written before checks were kept read as they did.

use super::*;
use crate::index::consume_queue::entry::TAG_HASH_AT;

/// Flips one bit of byte `at` of entry `i` of the queue's first file.
fn flip(dir: &Path, i: u64, at: usize) {
    let path = dir.join("00000000000000000000");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(i * CQ_ENTRY_BYTES) as usize + at] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
}

/// A flipped bit anywhere in an entry (its tag hash above all: a tag-filtered pull decides
/// by it without reading the record) makes reading that entry fail, naming the file; the
/// entries around it read as written.
#[test]
fn a_damaged_entry_fails_its_read_and_only_its_own() {
    for at in [0, 5, 7, 9, TAG_HASH_AT, TAG_HASH_AT + 7] {
        let dir = tempfile::tempdir().unwrap();
        let mut queue = open(dir.path(), 16);
        append(&mut queue, 0..10);
        queue.flush().unwrap();
        drop(queue);
        flip(dir.path(), 4, at);
        let queue = open(dir.path(), 16);
        match queue.get_checked(4) {
            Err(IndexError::Corrupt { path, reason }) => {
                assert!(path.ends_with("00000000000000000000"), "{path:?}");
                assert!(reason.contains("entry 4 fails its check"), "{reason}");
            }
            other => panic!("byte {at}: {other:?}"),
        }
        for queue_offset in (0..10).filter(|&q| q != 4) {
            let e = queue.get_checked(queue_offset).unwrap();
            assert_eq!(e, Some(entry(queue_offset)));
        }
        // Unchecked (the searches by place in the log), it reads with the check's bits
        // taken off the offset.
        let unchecked = queue.get(4).unwrap().unwrap();
        if at >= 6 {
            assert_eq!(
                unchecked.physical_offset,
                entry(4).physical_offset,
                "byte {at}"
            );
        }
    }
}

/// An entry written before checks were kept (the offset's top 16 bits zero) reads as it
/// did, unchecked.
#[test]
fn an_entry_without_a_check_reads_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 16);
    append(&mut queue, 0..3);
    queue.flush().unwrap();
    drop(queue);
    let path = dir.path().join("00000000000000000000");
    let mut bytes = std::fs::read(&path).unwrap();
    for i in 0..3 {
        let at = (i * CQ_ENTRY_BYTES) as usize;
        bytes[at + 6..at + 8].copy_from_slice(&[0, 0]);
    }
    std::fs::write(&path, bytes).unwrap();
    check(&open(dir.path(), 16), 0, 3);
}

/// The last entry torn by a crash (its check fails) does not stop a reopen or the cut of
/// what lies past the log's end; the replay's put at its offset makes it whole again.
#[test]
fn a_torn_last_entry_is_reopened_cut_and_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 16);
    append(&mut queue, 0..6);
    queue.flush().unwrap();
    drop(queue);
    flip(dir.path(), 5, TAG_HASH_AT + 3);
    let mut queue = ConsumeQueue::open(dir.path(), cfg(16)).unwrap();
    assert_eq!(queue.max_offset(), 6);
    assert!(queue.get_checked(5).is_err());
    queue.truncate_after_log_end(entry(5).end()).unwrap();
    assert_eq!(queue.max_offset(), 6, "the record is within the log");
    queue.put(5, entry(5)).unwrap();
    check(&queue, 0, 6);
    queue.truncate_after_log_end(entry(4).end()).unwrap();
    check(&queue, 0, 5);
}

/// Offsets past what an entry holds (2^48) are refused, not cut.
#[test]
fn a_log_offset_past_what_an_entry_holds_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 16);
    let mut far = entry(0);
    far.physical_offset = CQ_PHYSICAL_OFFSET_MAX + 1;
    assert!(matches!(queue.put(0, far), Err(IndexError::Corrupt { .. })));
    far.physical_offset = CQ_PHYSICAL_OFFSET_MAX - 200;
    queue.put(0, far).unwrap();
    assert_eq!(queue.get_checked(0).unwrap(), Some(far));
}

/// Retention's search for a queue's new start judges an empty (zeroed) entry by the next
/// entry that is not empty: counted as below the log's start, it moved the start past
/// entries whose records the log still held (here 2 and 3), and past the damage itself.
#[test]
fn an_empty_entry_met_by_retentions_search_keeps_the_entries_after_the_logs_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 16);
    append(&mut queue, 0..8);
    queue.flush().unwrap();
    drop(queue);
    let path = dir.path().join("00000000000000000000");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = (4 * CQ_ENTRY_BYTES) as usize;
    bytes[at..at + CQ_ENTRY_BYTES as usize].fill(0);
    std::fs::write(&path, bytes).unwrap();
    // Opened without the helper's invariants, which hold for undamaged queues only.
    let reopen = || ConsumeQueue::open(dir.path(), cfg(16)).unwrap();
    let mut queue = reopen();
    assert_eq!(queue.max_offset(), 8);
    assert_eq!(queue.get(4).unwrap(), None);
    // The log starts between entries 1 and 2.
    let log_min = entry(2).physical_offset - 1;
    assert_eq!(queue.first_kept(log_min).unwrap(), 2);
    assert_eq!(
        queue
            .trim_before_physical(log_min, &mut Vec::new())
            .unwrap(),
        2
    );
    // Past the entries after the damage too: the start is at the first one kept.
    let log_min = entry(6).physical_offset;
    assert_eq!(queue.first_kept(log_min).unwrap(), 6);
    // Nothing after the damage: it is kept, and the read at it says what is wrong.
    drop(queue);
    let mut queue = reopen();
    queue.truncate_after_log_end(entry(4).end()).unwrap();
    assert_eq!(queue.max_offset(), 5);
    assert_eq!(queue.first_kept(entry(3).end()).unwrap(), 4);
}
