//! Crash model of the store: SIGKILL a sync-mode appender, cut the last segment at random
//! byte positions, flip bytes in the middle of the log. Every acknowledged record must come
//! back intact and in order, nothing unappended may appear, and rot is refused by name.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringmq::io::run_local;
use ringmq::log::LogError;
use ringmq::protocol::record::{Placement, RecordView};
use ringmq::store::{MessageStore, StoreConfig, StoreError};

use common::built::{build_store, copy_dir, segment_of, segments, tiny_config, Built};

fn body_of(n: u64) -> Vec<u8> {
    // Same as ringmq-storage-demo's append-forever.
    let len = 16 + (n % 300) as usize;
    let mut b = vec![(n % 251) as u8; len];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b
}

#[derive(Debug, Clone, Copy)]
struct Ack {
    n: u64,
    queue_id: u32,
    queue_offset: u64,
}

/// When the append-forever child is killed.
#[derive(Clone, Copy)]
enum KillAt {
    /// After this many acknowledgements (or 20 s).
    Acks(usize),
    /// This long after it was spawned, whatever it did by then (opening the store,
    /// recovering it, appending).
    After(Duration),
}

/// Runs the append-forever child for a random time, SIGKILLs it, returns what it acked.
fn run_child_and_kill(dir: &Path, seed: u64) -> Vec<Ack> {
    let mut rng = StdRng::seed_from_u64(seed);
    let acks = run_child(dir, KillAt::Acks(rng.gen_range(200..3000)));
    assert!(
        acks.len() >= 100,
        "child acknowledged only {} records",
        acks.len()
    );
    acks
}

/// Runs the append-forever child on `dir` until `kill`, SIGKILLs it, returns what it acked.
fn run_child(dir: &Path, kill: KillAt) -> Vec<Ack> {
    let spawned = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringmq-storage-demo"))
        .args([
            "--data-dir",
            dir.to_str().unwrap(),
            "--flush",
            "sync",
            "--segment-bytes",
            "65536",
        ])
        .args(["append-forever", "--queues", "4", "--concurrency", "16"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() == 6 && f[0] == "ACK" {
                let ack = Ack {
                    n: f[1].parse().unwrap(),
                    queue_id: f[2].parse().unwrap(),
                    queue_offset: f[3].parse().unwrap(),
                };
                if tx.send(ack).is_err() {
                    break;
                }
            }
        }
    });
    let mut acks = Vec::new();
    match kill {
        KillAt::Acks(target) => {
            while acks.len() < target && spawned.elapsed() < Duration::from_secs(20) {
                if let Ok(a) = rx.recv_timeout(Duration::from_millis(100)) {
                    acks.push(a);
                }
            }
        }
        KillAt::After(delay) => {
            let deadline = spawned + delay;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                if let Ok(a) = rx.recv_timeout(left) {
                    acks.push(a);
                }
            }
        }
    }
    // SAFETY: kill(2) with the pid of a child this test started and has not reaped.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGKILL);
    }
    let _ = child.wait();
    let _ = reader.join();
    acks.extend(rx.try_iter());
    acks
}

#[test]
fn sigkill_in_sync_mode_keeps_every_acknowledged_record() {
    for seed in 0..3u64 {
        let dir = tempfile::tempdir().unwrap();
        let acks = run_child_and_kill(dir.path(), seed);
        check_every_ack_kept(dir.path(), acks);
    }
}

/// A store killed while appending, then killed again and again while it starts, recovers
/// and appends once more (kills from 0 to 40 ms after the child is spawned): every record
/// acknowledged in any round is still in its place at the end, and nothing was invented.
#[test]
fn sigkills_while_the_store_recovers_keep_every_acknowledged_record() {
    let mut rng = StdRng::seed_from_u64(11);
    let dir = tempfile::tempdir().unwrap();
    let mut acks = run_child_and_kill(dir.path(), 11);
    let mut silent = 0;
    // The child opens (recovers) the store within about 10-25 ms of its spawn here, and
    // appends from then on.
    for round in 0..18 {
        let ms = if round % 3 == 0 {
            rng.gen_range(0..12)
        } else {
            rng.gen_range(8..40)
        };
        let got = run_child(dir.path(), KillAt::After(Duration::from_millis(ms)));
        silent += usize::from(got.is_empty());
        acks.extend(got);
    }
    assert!(
        silent > 0,
        "every round acknowledged something: none was killed while it started"
    );
    check_every_ack_kept(dir.path(), acks);
}

/// Opens the child's store in this process: every record in `acks` is there (number and
/// body), and every stored record is one the child appended, in its queue, dense from 0.
fn check_every_ack_kept(dir: &Path, acks: Vec<Ack>) {
    let path = dir.to_owned();
    run_local(move || async move {
        // The child's configuration: 64 KiB segments, default index sizes.
        let mut cfg = StoreConfig::default();
        cfg.log.segment_bytes = 64 * 1024;
        cfg.log.flush = ringmq::log::FlushMode::Sync;
        let (store, rec) = MessageStore::open(&path, cfg).await.unwrap();
        assert!(!rec.clean_shutdown, "a SIGKILL is an unclean shutdown");
        for a in &acks {
            let buf = store
                .read_at("crash", a.queue_id, a.queue_offset)
                .await
                .unwrap_or_else(|e| panic!("acked record {a:?} missing: {e}"));
            let v = RecordView::parse(&buf).unwrap();
            assert_eq!(v.flag() as u64, a.n);
            assert_eq!(v.body(), &body_of(a.n)[..]);
        }
        // Nothing invented: every stored record is one the child appended, queue
        // offsets are dense from 0, and each queue holds its own numbers only.
        let mut total = 0;
        for q in 0..4u32 {
            let (min, max) = store.queue_range("crash", q).unwrap();
            assert_eq!(min, 0);
            for off in min..max {
                let buf = store.read_at("crash", q, off).await.unwrap();
                let v = RecordView::parse(&buf).unwrap();
                let n = v.flag() as u64;
                assert_eq!(n % 4, q as u64);
                assert_eq!(v.queue_offset(), off);
                assert_eq!(v.body(), &body_of(n)[..]);
                total += 1;
            }
        }
        assert!(total >= acks.len());
        store.close().await.unwrap();
    });
}

#[test]
fn cutting_the_last_segment_anywhere_recovers_a_valid_prefix() {
    let built = build_store(1500, tiny_config());
    let segs = segments(built.dir.path());
    let last = segs.last().unwrap().clone();
    let last_base: u64 = last.file_name().unwrap().to_str().unwrap().parse().unwrap();
    let last_len = std::fs::metadata(&last).unwrap().len();
    let mut rng = StdRng::seed_from_u64(42);
    for round in 0..30 {
        let cut = if round == 0 {
            0
        } else {
            rng.gen_range(0..=last_len)
        };
        let work = tempfile::tempdir().unwrap();
        copy_dir(built.dir.path(), work.path());
        let victim = work
            .path()
            .join("commitlog")
            .join(last.file_name().unwrap());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&victim)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let records = built.records.clone();
        let path = work.path().to_owned();
        run_local(move || async move {
            let (store, report) = MessageStore::open(&path, tiny_config())
                .await
                .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            // The checkpoint (written at the old end by the clean close) comes down to the
            // recovered end before anything is appended: a power loss would otherwise bring
            // back index entries of the records cut.
            let checkpoint = ringmq::store::Checkpoint::read(&path).unwrap();
            assert!(
                checkpoint.log_offset <= last_base + cut,
                "cut at {cut}: the checkpoint stayed at {}",
                checkpoint.log_offset
            );
            let survives = |phys: u64, len: usize| phys + len as u64 <= last_base + cut;
            // The clean close's checkpoint was at the log's end: bytes are said lost
            // exactly when a record is.
            let lost_any = (records.iter()).any(|(_, _, _, phys, b)| !survives(*phys, b.len()));
            assert_eq!(
                report.durable_bytes_lost > 0,
                lost_any,
                "cut at {cut}: {}",
                report.summary(Duration::ZERO)
            );
            let mut expected_max: HashMap<(String, u32), u64> = HashMap::new();
            for (topic, q, qo, phys, bytes) in &records {
                if survives(*phys, bytes.len()) {
                    let got = store.read_at(topic, *q, *qo).await.unwrap_or_else(|e| {
                        panic!("cut at {cut}: record {topic}:{q}:{qo} lost: {e}")
                    });
                    assert_eq!(&got[..], &bytes[..]);
                    let m = expected_max.entry((topic.clone(), *q)).or_default();
                    *m = (*m).max(qo + 1);
                }
            }
            for (topic, q, _, _, _) in &records {
                let (_, max) = store.queue_range(topic, *q).unwrap();
                let want = expected_max.get(&(topic.clone(), *q)).copied().unwrap_or(0);
                assert_eq!(
                    max, want,
                    "cut at {cut}: {topic}:{q} has records nobody kept"
                );
            }
            // Appending goes on at the recovered end with the next queue offsets.
            let m = common::message(8, 0, 3, 10);
            let r = store.put(&m.draft()).await.unwrap();
            let want = expected_max
                .get(&(m.topic.clone(), m.queue_id))
                .copied()
                .unwrap_or(0);
            assert_eq!(r.queue_offset, want);
            store.close().await.unwrap();
        });
    }
}

/// Segment files missing at the log's end (or all of them) refuse the start, naming what
/// the checkpoint found durable; with the checkpoint removed (the operator's choice), the
/// store starts with what is left. Before, the log was taken as ending early (a torn tail):
/// the indexes were cut to what was left and queue offsets given again.
#[test]
fn segment_files_missing_below_the_checkpoint_refuse_the_start() {
    let built = build_store(1500, tiny_config());
    let segs = segments(built.dir.path());
    assert!(segs.len() >= 4, "{} segments", segs.len());
    for missing in [2, segs.len()] {
        let work = tempfile::tempdir().unwrap();
        copy_dir(built.dir.path(), work.path());
        for seg in &segs[segs.len() - missing..] {
            std::fs::remove_file(work.path().join("commitlog").join(seg.file_name().unwrap()))
                .unwrap();
        }
        let path = work.path().to_owned();
        match run_local(move || async move { MessageStore::open(&path, tiny_config()).await.err() })
        {
            Some(StoreError::Log(LogError::Layout { reason, .. })) => {
                assert!(reason.contains("segment files are missing"), "{reason}");
                assert!(
                    reason.contains("remove the file named checkpoint"),
                    "{reason}"
                );
            }
            other => panic!("{missing} missing segments: the start must refuse, got {other:?}"),
        }
        assert!(
            work.path().join("checkpoint").exists(),
            "the checkpoint was changed"
        );
        std::fs::remove_file(work.path().join("checkpoint")).unwrap();
        let records = built.records.clone();
        let path = work.path().to_owned();
        let reach = (segs.len() - missing) as u64 * tiny_config().log.segment_bytes;
        run_local(move || async move {
            let (store, _) = MessageStore::open(&path, tiny_config()).await.unwrap();
            assert!(store.log().write_offset() <= reach);
            for (topic, q, qo, phys, bytes) in &records {
                if phys + (bytes.len() as u64) <= store.log().write_offset() {
                    assert_eq!(
                        &store.read_at(topic, *q, *qo).await.unwrap()[..],
                        &bytes[..]
                    );
                }
            }
            store.close().await.unwrap();
        });
    }
    // The log's directory moved away: refused, and not made again (it would be in the way
    // of the one moved back).
    let work = tempfile::tempdir().unwrap();
    copy_dir(built.dir.path(), work.path());
    let log_dir = work.path().join("commitlog");
    std::fs::rename(&log_dir, work.path().join("moved")).unwrap();
    let path = work.path().to_owned();
    match run_local(move || async move { MessageStore::open(&path, tiny_config()).await.err() }) {
        Some(StoreError::Log(LogError::Layout { reason, .. })) => {
            assert!(reason.contains("segment files are missing"), "{reason}");
        }
        other => panic!("the log's directory moved: the start must refuse, got {other:?}"),
    }
    assert!(!log_dir.exists(), "the log's directory was made again");
}

fn flip_and_expect_refusal(
    built: &Built,
    record_index: usize,
    byte_in_record: usize,
    cfg: StoreConfig,
) {
    let work = tempfile::tempdir().unwrap();
    copy_dir(built.dir.path(), work.path());
    let (_, _, _, phys, _) = &built.records[record_index];
    let seg_bytes = cfg.log.segment_bytes;
    let base = phys - phys % seg_bytes;
    let file = work.path().join("commitlog").join(format!("{base:020}"));
    let mut bytes = std::fs::read(&file).unwrap();
    let at = (phys - base) as usize + byte_in_record;
    bytes[at] ^= 0x5a;
    std::fs::write(&file, &bytes).unwrap();
    let path = work.path().to_owned();
    let err = run_local(move || async move { MessageStore::open(&path, cfg).await.err() });
    match err {
        Some(StoreError::Log(LogError::Corrupt {
            path, file_offset, ..
        })) => {
            assert_eq!(path, file);
            assert_eq!(file_offset, phys - base, "names the bad record's offset");
            let msg = StoreError::Log(LogError::Corrupt {
                path: path.clone(),
                file_offset,
                log_offset: 0,
                reason: String::new(),
            })
            .to_string();
            assert!(
                msg.contains(&format!("{base:020}")),
                "message names the file: {msg}"
            );
        }
        other => panic!("expected a refusal naming the file, got {other:?}"),
    }
}

#[test]
fn a_flipped_byte_in_an_early_record_stops_start_up() {
    // Default verification scope (the last 3 segments), log of 2 segments.
    let mut cfg = tiny_config();
    cfg.log.segment_bytes = 1 << 20;
    let built = build_store(800, cfg.clone());
    assert!(segments(built.dir.path()).len() <= 3);
    flip_and_expect_refusal(&built, 3, 200, cfg.clone()); // in the body: CRC mismatch
    flip_and_expect_refusal(&built, 5, 1, cfg.clone()); // in the length field
                                                        // With full verification, rot anywhere in a long log of tiny segments is found.
    let mut all = tiny_config();
    all.log.verify_segments_on_start = 0;
    let built = build_store(1500, all.clone());
    assert!(segments(built.dir.path()).len() > 5);
    flip_and_expect_refusal(&built, 2, 150, all);
}

/// Rot in an early record with the checkpoint removed (the documented way to re-index: a
/// clean stop, then remove `checkpoint`) or damaged stops the start as with it: after a
/// clean stop nothing was in flight, so a bad record followed by good ones is not a torn
/// tail. Before, a missing checkpoint counted the whole log as past the durable point: the
/// log was cut at the bad record and every later segment moved to quarantine, their
/// messages gone from their queues.
#[test]
fn rot_stops_the_start_after_a_clean_stop_without_a_usable_checkpoint() {
    let mut cfg = tiny_config();
    cfg.log.segment_bytes = 1 << 20;
    let built = build_store(800, cfg.clone());
    let checkpoint = built.dir.path().join("checkpoint");
    let good = std::fs::read(&checkpoint).unwrap();
    std::fs::remove_file(&checkpoint).unwrap();
    flip_and_expect_refusal(&built, 3, 200, cfg.clone());
    let mut damaged = good;
    damaged[9] ^= 1;
    std::fs::write(&checkpoint, damaged).unwrap();
    flip_and_expect_refusal(&built, 3, 200, cfg);
}

/// A copy of `built` whose checkpoint says the log was known durable only up to the start
/// of record `durable_record` (as if the broker crashed before its next checkpoint), with
/// `damage` done to the segment files.
fn crashed_copy(
    built: &Built,
    durable_record: usize,
    damage: impl FnOnce(&Path),
) -> (tempfile::TempDir, u64) {
    let work = tempfile::tempdir().unwrap();
    copy_dir(built.dir.path(), work.path());
    let durable = built.records[durable_record].3;
    ringmq::store::Checkpoint {
        log_offset: durable,
        timestamp_ms: 0,
        // Not what a checkpoint synced: the key index is taken as the copy has it.
        keys: ringmq::index::KeysSynced::Unknown,
    }
    .write(work.path())
    .unwrap();
    damage(work.path());
    (work, durable)
}

/// Opens the damaged copy: it must start, keep every record before the first damaged one
/// byte for byte, invent nothing, and have moved the cut bytes to a quarantine file.
/// Returns the quarantine files.
fn expect_cut_and_quarantine(
    built: &Built,
    work: &Path,
    damaged_from: u64,
    what: &str,
) -> Vec<PathBuf> {
    let records = built.records.clone();
    let path = work.to_owned();
    let what = what.to_owned();
    let quarantined = run_local(move || async move {
        let (store, report) = MessageStore::open(&path, tiny_config())
            .await
            .unwrap_or_else(|e| panic!("{what}: refused to start: {e}"));
        assert_eq!(report.log.cut_at, Some(damaged_from), "{what}");
        let mut kept: HashMap<(String, u32), u64> = HashMap::new();
        for (topic, q, qo, phys, bytes) in &records {
            if phys + bytes.len() as u64 <= damaged_from {
                let got = store
                    .read_at(topic, *q, *qo)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: record at {phys} lost: {e}"));
                assert_eq!(&got[..], &bytes[..], "{what}");
                let m = kept.entry((topic.clone(), *q)).or_default();
                *m = (*m).max(qo + 1);
            }
        }
        for (topic, q, _, _, _) in &records {
            let want = kept.get(&(topic.clone(), *q)).copied().unwrap_or(0);
            assert_eq!(
                store.queue_range(topic, *q).unwrap().1,
                want,
                "{what}: {topic}:{q}"
            );
        }
        store.close().await.unwrap();
        report.log.quarantined
    });
    let what = "the same damage";
    assert!(!quarantined.is_empty(), "{what}: nothing quarantined");
    for q in &quarantined {
        assert!(q.exists(), "{what}: {} is missing", q.display());
        assert!(std::fs::metadata(q).unwrap().len() > 0);
    }
    quarantined
}

/// The first record that ends in the last 4 KiB of the segment before `segment`, or later.
fn first_record_near_the_end_of_the_segment_before(built: &Built, segment: &Path) -> usize {
    let base: u64 = segment
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    (built.records.iter())
        .position(|r| r.3 + r.4.len() as u64 > base - 4096)
        .unwrap()
}

#[test]
fn damage_a_crash_leaves_after_the_durable_point_is_cut_and_quarantined_before_it_refused() {
    let built = build_store(1500, tiny_config());
    let n = built.records.len();
    let durable_record = n - 120;
    // A zeroed range followed by records that did reach the disk (writes landed out of
    // order): a hole inside the last segment.
    let victim = n - 60;
    let hole_at = built.records[victim].3;
    let (work, _) = crashed_copy(&built, durable_record, |dir| {
        let (file, at) = segment_of(dir, hole_at);
        let mut bytes = std::fs::read(&file).unwrap();
        let end = (at + 700).min(bytes.len());
        bytes[at..end].iter_mut().for_each(|b| *b = 0);
        std::fs::write(&file, &bytes).unwrap();
    });
    expect_cut_and_quarantine(&built, work.path(), hole_at, "a hole");
    // Garbage over a record after the durable point.
    let garbage_at = built.records[n - 30].3;
    let (work, _) = crashed_copy(&built, durable_record, |dir| {
        let (file, at) = segment_of(dir, garbage_at);
        let mut bytes = std::fs::read(&file).unwrap();
        let mut rng = StdRng::seed_from_u64(9);
        for b in &mut bytes[at..at + 300] {
            *b = rng.gen();
        }
        std::fs::write(&file, &bytes).unwrap();
    });
    expect_cut_and_quarantine(&built, work.path(), garbage_at, "garbage");
    // Out-of-order partial writes across segments: the tail of one segment never reached
    // the disk while the next segment did.
    let segs = segments(built.dir.path());
    let first_lost = first_record_near_the_end_of_the_segment_before(&built, segs.last().unwrap());
    let lost_at = built.records[first_lost].3;
    let durable_record = first_lost.saturating_sub(10);
    let (work, _) = crashed_copy(&built, durable_record, |dir| {
        let (file, at) = segment_of(dir, lost_at);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[at..].iter_mut().for_each(|b| *b = 0);
        std::fs::write(&file, &bytes).unwrap();
    });
    expect_cut_and_quarantine(&built, work.path(), lost_at, "a lost segment tail");
    // The same hole before the durable point is rot: start-up refuses, naming the file.
    let early = built.records[100].3;
    let (work, _) = crashed_copy(&built, 200, |dir| {
        let (file, at) = segment_of(dir, early);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[at..at + 500].iter_mut().for_each(|b| *b = 0);
        std::fs::write(&file, &bytes).unwrap();
    });
    let (file, at) = segment_of(work.path(), early);
    let path = work.path().to_owned();
    let mut cfg = tiny_config();
    cfg.log.verify_segments_on_start = 0;
    match run_local(move || async move { MessageStore::open(&path, cfg).await.err() }) {
        Some(StoreError::Log(LogError::Corrupt {
            path, file_offset, ..
        })) => {
            assert_eq!(path, file);
            assert_eq!(file_offset, at as u64);
        }
        other => panic!("rot before the durable point must refuse, got {other:?}"),
    }
}

/// A crash kept a segment's later pages and lost its first block, while the segment before
/// it lost its tail: the segment is kept whole in quarantine. Before, only its first 4 KiB
/// were looked at, and the segment was removed as one created but never written.
#[test]
fn a_later_segment_whose_first_block_was_lost_goes_to_quarantine_whole() {
    let built = build_store(1500, tiny_config());
    let segs = segments(built.dir.path());
    let later = segs[segs.len() - 2].clone();
    let first_lost = first_record_near_the_end_of_the_segment_before(&built, &later);
    let lost_at = built.records[first_lost].3;
    let (work, _) = crashed_copy(&built, first_lost - 10, |dir| {
        let (file, at) = segment_of(dir, lost_at);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[at..].fill(0);
        std::fs::write(&file, &bytes).unwrap();
        let later = dir.join("commitlog").join(later.file_name().unwrap());
        let mut bytes = std::fs::read(&later).unwrap();
        bytes[..4096].fill(0);
        std::fs::write(&later, &bytes).unwrap();
    });
    let quarantined = expect_cut_and_quarantine(&built, work.path(), lost_at, "a lost block");
    let name = format!("{}.0", later.file_name().unwrap().to_str().unwrap());
    let kept = quarantined
        .iter()
        .find(|q| q.file_name().unwrap().to_str() == Some(name.as_str()))
        .unwrap_or_else(|| panic!("{name} is not among {quarantined:?}"));
    let want = std::fs::read(&later).unwrap();
    let got = std::fs::read(kept).unwrap();
    assert_eq!(got.len(), want.len());
    assert_eq!(
        got[4096..],
        want[4096..],
        "the segment's data past its lost block"
    );
}

/// A cut where an earlier one was (two crashes at the same tail) keeps the earlier cut's
/// quarantine file and writes its own beside it. Before, the copy truncated the file of
/// the same name, the earlier cut's bytes gone.
#[test]
fn a_cut_keeps_the_quarantine_file_of_an_earlier_cut_at_the_same_place() {
    let built = build_store(1500, tiny_config());
    let n = built.records.len();
    let hole_at = built.records[n - 60].3;
    let (work, _) = crashed_copy(&built, n - 120, |dir| {
        let (file, at) = segment_of(dir, hole_at);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[at..at + 700].fill(0);
        std::fs::write(&file, &bytes).unwrap();
    });
    let (segment, at) = segment_of(work.path(), hole_at);
    let quarantine = work.path().join("commitlog/quarantine");
    std::fs::create_dir_all(&quarantine).unwrap();
    let earlier = quarantine.join(format!(
        "{}.{at}",
        segment.file_name().unwrap().to_str().unwrap()
    ));
    std::fs::write(&earlier, b"an earlier cut's bytes").unwrap();
    let path = work.path().to_owned();
    let report = run_local(move || async move {
        let (store, report) = MessageStore::open(&path, tiny_config()).await.unwrap();
        store.close().await.unwrap();
        report
    });
    assert_eq!(report.log.cut_at, Some(hole_at));
    let kept = std::fs::read(&earlier).unwrap() == b"an earlier cut's bytes";
    assert!(kept, "the earlier cut's quarantine file was written over");
    let ours = &report.log.quarantined[0];
    assert_eq!(ours, &earlier.with_extension(format!("{at}.1")), "{ours:?}");
    assert!(std::fs::metadata(ours).unwrap().len() > 700);
}

/// A power loss kept a later page of a consume queue and lost the one before it, while
/// the log lost the records of both: the queue ends after the last entry the replay wrote
/// (its first lost record's offset), with no hole of lost entries inside it. Before, the
/// lost entries stayed as a hole before the end (they counted as below the log's end),
/// and pulls stopped at it with `StoreCorrupt` until an operator moved the group past.
#[test]
fn entries_a_power_loss_lost_before_kept_ones_leave_no_hole_in_the_queue() {
    let built = build_store(1500, tiny_config());
    let n = built.records.len();
    // The queue has records between the checkpoint and the cut (the replay writes their
    // entries), or none (the checkpoint is at the cut).
    for durable in [n - 120, n - 60] {
        power_loss_keeping_a_later_page(&built, durable);
    }
}

fn power_loss_keeping_a_later_page(built: &Built, durable: usize) {
    let n = built.records.len();
    let lost = n - 60;
    let lost_at = built.records[lost].3;
    let (topic, queue_id, first_lost, _, _) = built.records[lost].clone();
    let (work, _) = crashed_copy(built, durable, |dir| {
        // The log from the lost record on never reached the disk.
        let (file, at) = segment_of(dir, lost_at);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[at..].iter_mut().for_each(|b| *b = 0);
        std::fs::write(&file, &bytes).unwrap();
        // Nor did the queue's entries of its first three lost records (the entries after
        // them did).
        let per_file = tiny_config().consume_queue.entries_per_file;
        for qo in first_lost..first_lost + 3 {
            let file = dir
                .join("consumequeue")
                .join(&topic)
                .join(queue_id.to_string())
                .join(format!("{:020}", qo - qo % per_file));
            let mut bytes = std::fs::read(&file).unwrap();
            let at = (qo % per_file) as usize * 20;
            bytes[at..at + 20].fill(0);
            std::fs::write(&file, &bytes).unwrap();
        }
    });
    let kept_after = built.records[lost..]
        .iter()
        .filter(|r| (&r.0, r.1) == (&topic, queue_id))
        .count();
    assert!(kept_after > 3, "entries past the lost ones: {kept_after}");
    let path = work.path().to_owned();
    let records = built.records.clone();
    run_local(move || async move {
        let (store, _) = MessageStore::open(&path, tiny_config()).await.unwrap();
        for (t, q, qo, phys, bytes) in &records {
            let want_end = records[..lost]
                .iter()
                .filter(|r| (&r.0, r.1) == (t, *q))
                .count() as u64;
            assert_eq!(store.queue_range(t, *q).unwrap().1, want_end, "{t}:{q}");
            if *phys < lost_at {
                let got = store.read_at(t, *q, *qo).await.unwrap();
                assert_eq!(&got[..], &bytes[..], "{t}:{q}:{qo}");
            }
        }
        assert_eq!(store.queue_range(&topic, queue_id).unwrap().1, first_lost);
        store.close().await.unwrap();
    });
}

#[test]
fn rot_found_by_a_read_names_the_segment_file_and_the_offset_in_it() {
    let built = build_store(1500, tiny_config());
    assert!(segments(built.dir.path()).len() > 5);
    let work = tempfile::tempdir().unwrap();
    copy_dir(built.dir.path(), work.path());
    // Rot in an old segment (not verified at start-up): a length field, then a body byte.
    let (topic_a, qa, qoa, phys_a, _) = built.records[5].clone();
    let (topic_b, qb, qob, phys_b, _) = built.records[9].clone();
    for (phys, byte) in [(phys_a, 1usize), (phys_b, 150)] {
        let (file, at) = segment_of(work.path(), phys);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[at + byte] ^= 0x5a;
        std::fs::write(&file, &bytes).unwrap();
    }
    let path = work.path().to_owned();
    let seg_a = segment_of(work.path(), phys_a);
    let seg_b = segment_of(work.path(), phys_b);
    run_local(move || async move {
        let (store, _) = MessageStore::open(&path, tiny_config()).await.unwrap();
        for (topic, q, qo, seg) in [(&topic_a, qa, qoa, &seg_a), (&topic_b, qb, qob, &seg_b)] {
            match store.read_at(topic, q, qo).await {
                Err(StoreError::Log(LogError::Corrupt {
                    path, file_offset, ..
                })) => {
                    assert_eq!(path, seg.0);
                    assert_eq!(file_offset, seg.1 as u64);
                }
                other => panic!("expected corruption naming the file, got {:?}", other.err()),
            }
        }
        // By id: a damaged record is a corruption, not "no message".
        match store.read_physical(phys_b).await {
            Err(StoreError::Log(LogError::Corrupt { path, .. })) => assert_eq!(path, seg_b.0),
            other => panic!("expected corruption, got {:?}", other.err()),
        }
        // An offset where no record starts is "no record".
        assert!(matches!(
            store.read_physical(phys_b + 1).await,
            Err(StoreError::Log(LogError::NoRecord { .. }))
        ));
        store.close().await.unwrap();
    });
}

/// Retention never deletes past the checkpoint on disk: a recovery after a crash replays
/// the log from there, and the index entries a power loss took of records retention
/// deleted meanwhile could never be written again (a hole in their queues, which refuses
/// the start). A pass that would delete past it writes a checkpoint first; when that
/// fails, the pass stops at the old checkpoint and says why. Before, retention went on past
/// a checkpoint that had stopped moving.
#[test]
fn retention_holds_at_a_checkpoint_it_cannot_move() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run_local(move || async move {
        let mut cfg = tiny_config();
        cfg.log.retention_bytes_max = 256 * 1024;
        let (store, _) = MessageStore::open(&path, cfg).await.unwrap();
        // Checkpoints fail from here on: their temporary file cannot be made.
        let blocker = path.join("checkpoint.tmp");
        std::fs::create_dir(&blocker).unwrap();
        for n in 0..600 {
            store
                .put(&common::message(11, n, 3, 1500).draft())
                .await
                .unwrap();
        }
        let on_disk = ringmq::store::Checkpoint::read(&path).unwrap().log_offset;
        assert!(store.log().write_offset() > on_disk + 512 * 1024);
        match store.apply_retention(ringmq::log::now_ms()).await {
            Err(StoreError::RetentionHeld { checkpoint, reason }) => {
                assert_eq!(checkpoint, on_disk);
                assert!(reason.contains("checkpoint.tmp"), "{reason}");
            }
            other => panic!("retention past the checkpoint: {other:?}"),
        }
        assert!(store.retention_held());
        assert!(
            store.log().min_offset() <= on_disk,
            "deleted past the checkpoint"
        );
        std::fs::remove_dir(&blocker).unwrap();
        let min = store.apply_retention(ringmq::log::now_ms()).await.unwrap();
        assert!(!store.retention_held());
        let moved = ringmq::store::Checkpoint::read(&path).unwrap().log_offset;
        assert!(min > on_disk && moved >= min, "{on_disk} {min} {moved}");
        store.close().await.unwrap();
    });
}

/// Rot before the durable point followed, across a stretch of garbage, by a valid record
/// at one of the last starts of the recovery's 8 MiB search window stops the start: that
/// record proves the bad one is not a torn tail. Before, the last 7 starts of each window
/// were skipped and, with nothing valid after them, the log was cut at the rot, the
/// later records' queue entries left pointing into quarantine.
#[test]
fn a_valid_record_at_the_end_of_the_search_window_after_rot_stops_the_start() {
    const WINDOW: u64 = 8 << 20;
    let mut cfg = tiny_config();
    cfg.log.segment_bytes = 32 << 20;
    cfg.log.flush = ringmq::log::FlushMode::Async;
    cfg.consume_queue.entries_per_file = 4096;
    let built = build_store(12_000, cfg.clone());
    let (_, _, _, last_at, last) = built.records.last().unwrap();
    assert!(
        last_at + last.len() as u64 > WINDOW + 8192,
        "the log must reach past one window"
    );
    let rot = built.records[3].3;
    // The record moved to `at`: a valid record, placed there (its physical offset is `at`).
    let n = built.records.len() - 1;
    let (_, _, qo, _, bytes) = &built.records[n];
    let stamp = RecordView::parse(bytes).unwrap().store_timestamp_ms();
    let m = common::message(7, n as u64, 3, 1500);
    // Window starts are rot + 1 + k * WINDOW; the last start of the first one is
    // rot + WINDOW, its seventh-last rot + WINDOW - 6.
    for back in [0u64, 3, 6] {
        let at = rot + WINDOW - back;
        let moved = m.draft().encode(Placement {
            queue_offset: *qo,
            physical_offset: at,
            store_timestamp_ms: stamp,
        });
        let work = tempfile::tempdir().unwrap();
        copy_dir(built.dir.path(), work.path());
        let file = work.path().join("commitlog").join(format!("{:020}", 0));
        let mut seg = std::fs::read(&file).unwrap();
        seg[rot as usize..].fill(0);
        seg[rot as usize..at as usize].fill(0xab);
        seg[at as usize..at as usize + moved.len()].copy_from_slice(&moved);
        std::fs::write(&file, &seg).unwrap();
        let path = work.path().to_owned();
        let cfg = cfg.clone();
        let err = run_local(move || async move { MessageStore::open(&path, cfg).await.err() });
        match err {
            Some(StoreError::Log(LogError::Corrupt {
                file_offset,
                reason,
                ..
            })) => {
                assert_eq!(file_offset, rot, "names the rot");
                assert!(
                    reason.contains(&format!("a valid record follows at file offset {at}")),
                    "{back} before the window's last start: {reason}"
                );
            }
            other => {
                panic!("{back} before the window's last start: expected a refusal, got {other:?}")
            }
        }
    }
}

/// A segment retention cannot delete stops that pass there: the segments after it stay on
/// disk (a start refuses a gap between segments), and the next pass deletes them all once
/// it can; the log then reopens at the minimum retention left it. Before, the later ones
/// were deleted past it and the next start was refused.
#[test]
fn a_segment_retention_cannot_delete_holds_back_the_later_ones_until_it_can() {
    run_local(|| async {
        use ringmq::log::{CommitLog, FlushMode, LogConfig};
        let dir = tempfile::tempdir().unwrap();
        let segment = 64 * 1024;
        let cfg = LogConfig {
            segment_bytes: segment,
            flush: FlushMode::Sync,
            retention_bytes_max: segment,
            ..LogConfig::default()
        };
        let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
            .await
            .unwrap();
        let mut n = 0;
        while log.write_offset() < 5 * segment {
            let m = common::message(17, n, 1, 1000);
            let a = log.append(&m.draft(), n).unwrap();
            log.wait_acked(a.end()).await.unwrap();
            n += 1;
        }
        let name = |base: u64| dir.path().join(format!("{base:020}"));
        // The first segment's name is taken by a directory that is not empty: it cannot
        // be deleted.
        std::fs::remove_file(name(0)).unwrap();
        std::fs::create_dir(name(0)).unwrap();
        std::fs::write(name(0).join("x"), b"x").unwrap();
        log.apply_retention(ringmq::log::now_ms(), u64::MAX).await;
        for base in [segment, 2 * segment] {
            assert!(name(base).exists(), "segment {base} deleted past the first");
        }
        std::fs::remove_dir_all(name(0)).unwrap();
        let min = log.apply_retention(ringmq::log::now_ms(), u64::MAX).await;
        assert!(min >= 3 * segment, "{min}");
        for base in (0..min).step_by(segment as usize) {
            assert!(!name(base).exists(), "segment {base} left behind");
        }
        drop(log);
        let (log, _) = CommitLog::open(dir.path(), cfg, 0, |_| {}).await.unwrap();
        assert_eq!(log.min_offset(), min);
    });
}
