//! A queue's spare files: taken by rolls, named by syncs, lost by crashes before that,
//! refused, given up and failed.

use super::*;

/// The roll takes the spare made ahead with no file-system call: the file keeps its
/// spare's name until a sync links it at its numbered name (both names in between), and the
/// queue then takes the new name and hands back the old one to remove.
#[test]
fn the_roll_takes_the_spare_made_ahead_and_the_sync_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..1);
    give_spare(&mut queue);
    let spare = spares(dir.path());
    assert_eq!(spare.len(), 1);
    assert_eq!(queue.mapped_files(), 2, "the last file and the spare");
    sync(&mut queue);
    append(&mut queue, 1..101);
    assert_eq!(file_bases(dir.path()), [0], "not named by the roll");
    assert_eq!(spares(dir.path()), spare);
    assert_eq!(queue.spares().rolls_inline(), 0);
    check(&queue, 0, 101);
    let dirty = queue.dirty_files();
    let listed: Vec<(u64, bool, Option<PathBuf>)> = dirty
        .iter()
        .map(|f| (f.key, f.name_unsynced, f.link_to.clone()))
        .collect();
    let numbered = dir.path().join(numbered_file_name(100));
    assert_eq!(
        listed,
        [(0, false, None), (100, true, Some(numbered.clone()))],
        "the new file's name is to be made and synced"
    );
    for f in &dirty {
        assert!(f.sync().unwrap());
    }
    assert_eq!(file_bases(dir.path()), [0, 100], "linked");
    assert_eq!(
        spares(dir.path()),
        spare,
        "the spare's name is kept until the queue lets go"
    );
    assert_eq!(queue.files_synced(&dirty), spare);
    std::fs::remove_file(&spare[0]).unwrap();
    assert!(queue.dirty_files().is_empty());
    // Closed and mapped again: through its numbered name.
    queue.close_idle(&mut Vec::new());
    queue.close_idle(&mut Vec::new());
    assert_eq!(queue.mapped_files(), 0);
    queue.put(101, entry(101)).unwrap();
    let dirty = queue.dirty_files();
    assert_eq!(dirty.len(), 1);
    assert!(
        !dirty[0].name_unsynced && dirty[0].link_to.is_none(),
        "named once"
    );
    assert_eq!(dirty[0].path, numbered);
    // Without a spare (none asked for since) the roll creates the file itself.
    append(&mut queue, 102..201);
    assert_eq!(queue.spares().rolls_inline(), 1);
    drop(queue);
    let mut queue = open(dir.path(), 100);
    check(&queue, 0, 201);
    append(&mut queue, 201..301);
    assert_eq!(queue.spares().rolls_inline(), 1);
    check(&queue, 0, 301);
}

/// Until a sync names it, a file taken from a spare is lost by a crash (the store replays
/// its entries from the log, the checkpoint being behind them); a later roll that has to
/// create its file names the unnamed one first, so a crash never leaves a gap (which the
/// next open would take for a retention left half done, removing the files before it).
#[test]
fn a_file_not_yet_named_goes_with_a_crash_and_never_leaves_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..10);
    give_spare(&mut queue);
    append(&mut queue, 10..150);
    drop(queue);
    let mut queue = open(dir.path(), 100);
    check(&queue, 0, 100);
    assert!(spares(dir.path()).is_empty(), "the open removes spares");

    give_spare(&mut queue);
    append(&mut queue, 100..201);
    assert_eq!(queue.spares().rolls_inline(), 1, "200 created here");
    assert_eq!(file_bases(dir.path()), [0, 100, 200], "100 named first");
    assert!(spares(dir.path()).is_empty());
    drop(queue);
    check(&open(dir.path(), 100), 0, 201);
}

/// A file its queue named itself while a sync of an earlier listing ran (a roll that had to
/// create its file named it first, removing the spare's name) is synced under its numbered
/// name, not skipped as gone.
#[test]
fn a_file_named_by_its_queue_while_a_sync_runs_is_synced_all_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..10);
    give_spare(&mut queue);
    append(&mut queue, 10..200);
    let listed = queue.dirty_files();
    assert!(listed[1].link_to.is_some());
    append(&mut queue, 200..201);
    assert_eq!(
        file_bases(dir.path()),
        [0, 100, 200],
        "100 named by the roll to 200"
    );
    assert!(spares(dir.path()).is_empty());
    for f in &listed {
        assert!(f.sync().unwrap(), "{f:?} skipped");
    }
    assert!(queue.files_synced(&listed).is_empty(), "named already");
    let dirty: Vec<u64> = queue.dirty_files().iter().map(|f| f.key).collect();
    assert_eq!(dirty, [200], "0 and 100 synced");
}

/// A spare is no file of the queue's: cut back across a whole file and crashed, the queue
/// comes back whole (a next file made ahead under its own number made recovery take the
/// file before it for a retention left half done).
#[test]
fn a_spare_outlives_a_cut_back_and_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..150);
    give_spare(&mut queue);
    queue.truncate_to(99).unwrap();
    check(&queue, 0, 99);
    // The spare serves the roll that follows; the cut after it removes its file.
    append(&mut queue, 99..120);
    assert_eq!(file_bases(dir.path()), [0]);
    assert_eq!(spares(dir.path()).len(), 1, "taken, not named yet");
    give_spare(&mut queue);
    assert_eq!(spares(dir.path()).len(), 2);
    queue.truncate_to(99).unwrap();
    drop(queue);
    assert_eq!(spares(dir.path()).len(), 1);
    let queue = open(dir.path(), 100);
    check(&queue, 0, 99);
    assert_eq!(file_bases(dir.path()), [0]);
    assert!(spares(dir.path()).is_empty(), "recovery removes spares");
}

#[test]
fn a_spare_serves_a_queue_restarted_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..10);
    give_spare(&mut queue);
    queue.truncate_to(0).unwrap();
    append(&mut queue, 12_345..12_350);
    sync(&mut queue);
    assert_eq!(file_bases(dir.path()), [12_345]);
    assert!(spares(dir.path()).is_empty());
    check(&queue, 12_345, 12_350);
    drop(queue);
    check(&open(dir.path(), 100), 12_345, 12_350);
}

/// A spare asked for by a queue and made after another queue was opened on the same
/// directory is refused (its path handed back to remove); one left on disk by a crash is
/// removed by the next opening.
#[test]
fn a_spare_of_another_opening_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..10);
    let spare = queue.spare_ahead().unwrap();
    drop(queue);
    let mut queue = open(dir.path(), 100);
    let refused = queue.spares().made(spare.make()).expect("refused");
    assert!(refused.exists());
    append(&mut queue, 10..101);
    assert_eq!(
        queue.spares().rolls_inline(),
        1,
        "the refused spare was not used"
    );
    assert!(refused.exists(), "the caller removes it");
    drop(queue);
    let queue = open(dir.path(), 100);
    assert!(!refused.exists());
    check(&queue, 0, 101);
}

#[test]
fn an_idle_queue_gives_up_its_spare() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..10);
    give_spare(&mut queue);
    let mut doomed = Vec::new();
    assert_eq!(
        queue.close_idle(&mut doomed),
        0,
        "used since the last sweep"
    );
    assert!(doomed.is_empty());
    assert_eq!(queue.close_idle(&mut doomed), 2, "the file and the spare");
    assert_eq!(doomed, spares(dir.path()));
    assert_eq!(queue.mapped_files(), 0);
    give_spare(&mut queue);
}

/// A spare removed from outside before its file was named takes the entries indexed in it
/// along: its sync says it is gone, the queue still holds it unnamed (the store's checkpoint
/// then stays behind it), and a reopen serves what was named.
#[test]
fn a_spare_gone_before_it_is_named_is_told_apart_from_a_file_the_queue_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..10);
    give_spare(&mut queue);
    for spare in spares(dir.path()) {
        std::fs::remove_file(spare).unwrap();
    }
    append(&mut queue, 10..150);
    assert_eq!(queue.spares().rolls_inline(), 0);
    check(&queue, 0, 150);
    let dirty = queue.dirty_files();
    let synced: Vec<bool> = dirty.iter().map(|f| f.sync().unwrap()).collect();
    assert_eq!(synced, [true, false]);
    assert!(queue.still_unnamed(&dirty[1]));
    assert!(!queue.still_unnamed(&dirty[0]));
    // Let go by the queue (a cut): gone, and nothing the queue holds.
    queue.truncate_to(99).unwrap();
    assert!(!queue.still_unnamed(&dirty[1]));
    drop(queue);
    check(&open(dir.path(), 100), 0, 99);
}

/// A sync listed before a cut popped a file, which the queue then made again at the same
/// base, counts for the file it listed, not the new one (whose name and entries are still to
/// be synced).
#[test]
fn a_sync_of_a_file_popped_and_made_again_does_not_count_for_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..101);
    let listed = queue.dirty_files();
    assert_eq!(listed.len(), 2);
    queue.truncate_to(99).unwrap();
    append(&mut queue, 99..101);
    assert!(queue.files_synced(&listed).is_empty(), "no spare linked");
    let dirty: Vec<(u64, bool)> = queue
        .dirty_files()
        .iter()
        .map(|f| (f.key, f.name_unsynced))
        .collect();
    assert_eq!(dirty, [(0, false), (100, true)]);
}

/// A spare that cannot be made is not asked for again until the next roll (on a full disk
/// every one would fail), and the file in its way is left alone.
#[test]
fn a_spare_that_cannot_be_made_is_asked_again_only_after_the_next_roll() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = open(dir.path(), 100);
    append(&mut queue, 0..10);
    let spare = queue.spare_ahead().unwrap();
    std::fs::write(&spare.path, b"in the way").unwrap();
    let path = spare.path.clone();
    let made = spare.make();
    assert!(made.failure().is_some());
    assert_eq!(queue.spares().made(made), None);
    assert_eq!(std::fs::read(&path).unwrap(), b"in the way");
    append(&mut queue, 10..20);
    assert!(
        queue.spare_ahead().is_none(),
        "not asked again before the roll"
    );
    append(&mut queue, 20..101);
    assert_eq!(queue.spares().rolls_inline(), 1);
    give_spare(&mut queue);
}

/// A queue asks for its next file `SPARE_LEAD_BYTES` of entries (1 MiB) before its last
/// file's end (a fast queue must not reach the end before the pool made it), not earlier.
#[test]
fn the_spare_is_asked_for_a_lead_ahead_of_the_end() {
    let lead = crate::index::consume_queue::spare::SPARE_LEAD_BYTES / CQ_ENTRY_BYTES;
    let dir = tempfile::tempdir().unwrap();
    let per_file = 4 * lead;
    let mut queue = open(dir.path(), per_file);
    let ask_at = per_file - lead;
    append(&mut queue, 0..ask_at - 1);
    assert!(queue.spare_ahead().is_none(), "asked too early");
    append(&mut queue, ask_at - 1..ask_at);
    assert!(queue.spare_ahead().is_some(), "not asked a lead ahead");
}
