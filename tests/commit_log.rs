//! The commit log on its own: round trips of random records, rolling over tiny segments,
//! reopen, poisoning rules and retention.

mod common;

use common::message;
use ringmq::io::run_local;
use ringmq::log::{CommitLog, FlushMode, LogConfig, LogError};
use ringmq::protocol::record::{Placement, RecordView};

fn config(segment_bytes: u64, flush: FlushMode) -> LogConfig {
    LogConfig {
        segment_bytes,
        flush,
        flush_interval_ms: 20,
        ..LogConfig::default()
    }
}

/// Appends messages `0..count` of `seed` and returns (physical offset, expected bytes).
async fn append_all(
    log: &CommitLog,
    seed: u64,
    count: u64,
    max_body: usize,
) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut last_end = 0;
    for n in 0..count {
        let m = message(seed, n, 4, max_body);
        let a = log.append(&m.draft(), n).unwrap();
        let expected = m.draft().encode(Placement {
            queue_offset: n,
            physical_offset: a.physical_offset,
            store_timestamp_ms: a.store_timestamp_ms,
        });
        assert_eq!(expected.len(), a.size as usize);
        last_end = a.end();
        out.push((a.physical_offset, expected));
        if n % 16 == 0 {
            log.wait_acked(last_end).await.unwrap();
        }
    }
    log.wait_acked(last_end).await.unwrap();
    out
}

async fn check_all(log: &CommitLog, expected: &[(u64, Vec<u8>)]) {
    for (phys, bytes) in expected {
        let got = log.read_record(*phys, bytes.len() as u32).await.unwrap();
        assert_eq!(&got[..], &bytes[..], "record at {phys}");
        let got = log.read_record_at(*phys).await.unwrap();
        assert_eq!(&got[..], &bytes[..], "record at {phys} (size unknown)");
        let view = RecordView::parse(&got).unwrap();
        assert_eq!(view.physical_offset(), *phys);
    }
}

/// Every record of `kept` reads back, and after a close and a reopen too, and the reopened
/// log ends where the last one does (nothing else was kept).
async fn check_closed_and_reopened(
    log: CommitLog,
    dir: &std::path::Path,
    cfg: LogConfig,
    kept: &[(u64, Vec<u8>)],
) {
    check_all(&log, kept).await;
    log.close().await.unwrap();
    drop(log);
    let (log, report) = CommitLog::open(dir, cfg, 0, |_| {}).await.unwrap();
    check_all(&log, kept).await;
    let (last_phys, last_bytes) = kept.last().unwrap();
    assert_eq!(
        report.end_offset,
        last_phys + last_bytes.len() as u64,
        "nothing else was kept"
    );
}

#[test]
fn round_trip_random_sizes_up_to_4_mib() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(16 << 20, FlushMode::Async);
        let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
            .await
            .unwrap();
        let expected = append_all(&log, 1, 300, 4 << 20).await;
        assert!(
            expected.iter().any(|(_, b)| b.len() > 1 << 20),
            "some big records"
        );
        assert!(
            expected.iter().any(|(_, b)| b.len() < 200),
            "some small records"
        );
        check_all(&log, &expected).await;
        log.close().await.unwrap();
        // Reopen: the same bytes, and appends go on after them.
        let mut seen = Vec::new();
        let (log, report) = CommitLog::open(dir.path(), cfg, 0, |v| seen.push(v.physical_offset()))
            .await
            .unwrap();
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(seen, expected.iter().map(|e| e.0).collect::<Vec<_>>());
        check_all(&log, &expected).await;
        let m = message(1, 9999, 4, 10);
        let a = log.append(&m.draft(), 0).unwrap();
        assert_eq!(a.physical_offset, log.readable_end());
        log.wait_acked(a.end()).await.unwrap();
    });
}

#[test]
fn tiny_segments_roll_and_reads_cross_them() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(16 * 1024, FlushMode::Sync);
        let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
            .await
            .unwrap();
        let expected = append_all(&log, 2, 2000, 3000).await;
        let segments = std::fs::read_dir(dir.path()).unwrap().count();
        assert!(segments > 50, "only {segments} segments");
        check_all(&log, &expected).await;
        // A record beyond the readable end is refused with a typed error.
        let end = log.readable_end();
        assert!(matches!(
            log.read(end, 10).await,
            Err(LogError::OffsetTooBig { .. })
        ));
        log.close().await.unwrap();
        let (log, report) =
            CommitLog::open(dir.path(), config(16 * 1024, FlushMode::Sync), 0, |_| {})
                .await
                .unwrap();
        assert_eq!(report.end_offset, end);
        check_all(&log, &expected).await;
        // Too large for a segment: a typed error, nothing written.
        let big = message(2, 1, 4, 0);
        let body = vec![1u8; 20 * 1024];
        let mut d = big.draft();
        d.body = &body;
        assert!(matches!(
            log.append(&d, 0),
            Err(LogError::RecordTooLarge { .. })
        ));
        assert_eq!(log.write_offset(), end);
    });
}

#[test]
fn sync_mode_acks_only_durable_records_and_group_commits() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = CommitLog::open(dir.path(), config(1 << 20, FlushMode::Sync), 0, |_| {})
            .await
            .unwrap();
        // Many concurrent appenders: each waits for its own record to be durable.
        let mut tasks = Vec::new();
        for t in 0..64u64 {
            let log = log.clone();
            tasks.push(ringmq::io::spawn_joinable(async move {
                for i in 0..20u64 {
                    let m = message(3, t * 100 + i, 4, 200);
                    let a = log.append(&m.draft(), i).unwrap();
                    log.wait_acked(a.end()).await.unwrap();
                    assert!(log.durable_end() >= a.end());
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(log.durable_end(), log.write_offset());
    });
}

#[test]
fn retention_deletes_old_segments_and_reads_get_offset_too_small() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(16 * 1024, FlushMode::Async);
        cfg.retention_bytes_max = 64 * 1024;
        let (log, _) = CommitLog::open(dir.path(), cfg, 0, |_| {}).await.unwrap();
        let expected = append_all(&log, 4, 1000, 1000).await;
        // A floor keeps the segment holding it and every later one, whatever the limit.
        let floor = expected[expected.len() / 4].0;
        let held = log.apply_retention(ringmq::log::now_ms(), floor).await;
        assert!(held <= floor, "retention deleted past the floor");
        assert!(log.read_record_at(floor).await.is_ok());
        let min = log.apply_retention(ringmq::log::now_ms(), u64::MAX).await;
        assert!(min > held, "without the floor, more goes");
        assert!(min > 0);
        assert!(log.write_offset() - min <= 64 * 1024 + 16 * 1024);
        for (phys, bytes) in &expected {
            match log.read_record(*phys, bytes.len() as u32).await {
                Ok(got) => {
                    assert!(*phys >= min);
                    assert_eq!(&got[..], &bytes[..]);
                }
                Err(LogError::OffsetTooSmall { min: m, .. }) => {
                    assert!(*phys < min);
                    assert_eq!(m, min);
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        // Appends go on while and after segments are deleted.
        let m = message(4, 5000, 4, 100);
        let a = log.append(&m.draft(), 0).unwrap();
        log.wait_acked(a.end()).await.unwrap();
    });
}

#[test]
fn corrupt_config_is_refused() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let r = CommitLog::open(dir.path(), config(1000, FlushMode::Async), 0, |_| {}).await;
        assert!(matches!(r, Err(LogError::Config(_))));
    });
}

/// After a failed write or fdatasync the log refuses appends (typed error) until reopened,
/// and what was acknowledged before is intact after the reopen.
#[test]
fn a_failed_write_or_fdatasync_poisons_the_log_until_reopened() {
    for point in [
        ringmq::io::FailPoint::Write,
        ringmq::io::FailPoint::Fdatasync,
    ] {
        run_local(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let cfg = config(64 * 1024, FlushMode::Sync);
            let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
                .await
                .unwrap();
            let kept = append_all(&log, 5, 20, 100).await;
            ringmq::io::inject_failure(point);
            let m = message(5, 100, 4, 100);
            let a = log.append(&m.draft(), 0).unwrap();
            let err = log.wait_acked(a.end()).await.unwrap_err();
            assert!(matches!(err, LogError::Poisoned { .. }), "{point:?}: {err}");
            assert!(
                log.poisoned().unwrap().contains("injected"),
                "the reason is kept"
            );
            // No blind retry: later appends are refused at once.
            assert!(matches!(
                log.append(&m.draft(), 1),
                Err(LogError::Poisoned { .. })
            ));
            drop(log);
            let (log, _) = CommitLog::open(dir.path(), cfg, 0, |_| {}).await.unwrap();
            check_all(&log, &kept).await;
            let a = log.append(&m.draft(), 0).unwrap();
            log.wait_acked(a.end()).await.unwrap();
        });
    }
}

/// A write that finds the disk full is not an integrity event: the appends waiting for it
/// fail with `DiskFull` (nothing of them is kept), new appends are refused until the space
/// returns, then the log goes on from where it was readable, including across a segment
/// roll, and a reopen finds exactly the acknowledged records.
#[test]
fn a_full_disk_cuts_the_unwritten_appends_and_the_log_goes_on_when_space_returns() {
    for flush in [FlushMode::Sync, FlushMode::Async] {
        run_local(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let cfg = config(64 * 1024, flush);
            let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
                .await
                .unwrap();
            let mut kept = append_all(&log, 7, 20, 100).await;
            ringmq::io::inject_failure(ringmq::io::FailPoint::WriteNoSpace);
            // Enough to roll into a new segment within the failed write.
            let mut cut = Vec::new();
            for n in 0..40 {
                let m = message(7, 1000 + n, 4, 3000);
                cut.push(log.append(&m.draft(), 100 + n).unwrap());
            }
            let end_before = log.readable_end();
            for a in &cut {
                let err = log.wait_acked_since(a.end(), a.epoch).await.unwrap_err();
                assert!(matches!(err, LogError::DiskFull { .. }), "{flush:?}: {err}");
            }
            assert_eq!(
                log.write_offset(),
                end_before,
                "cut back to the readable end"
            );
            assert!(log.full().is_some());
            let m = message(7, 5000, 4, 100);
            assert!(matches!(
                log.append(&m.draft(), 0),
                Err(LogError::DiskFull { .. })
            ));
            assert!(log.poisoned().is_none(), "a full disk does not poison");
            log.space_returned();
            // Same positions again: waits for the old appends still fail, new ones succeed.
            let more = append_all(&log, 8, 60, 3000).await;
            assert!(
                more.last().unwrap().0 > 64 * 1024,
                "the new appends roll into the next segment"
            );
            for a in &cut {
                let err = log.wait_acked_since(a.end(), a.epoch).await.unwrap_err();
                assert!(matches!(err, LogError::DiskFull { .. }));
            }
            kept.extend(more);
            check_closed_and_reopened(log, dir.path(), cfg, &kept).await;
        });
    }
}

/// Appends 30 records of 3,000-byte bodies in one tick (queue offsets from `first_offset`),
/// whose round is armed to fail, and waits for the last one: it must fail with `DiskFull`.
/// Returns each append with the bytes it encodes.
async fn append_round(
    log: &CommitLog,
    seed: u64,
    first_offset: u64,
) -> Vec<(ringmq::log::Appended, Vec<u8>)> {
    let mut round = Vec::new();
    for n in 0..30 {
        let mut m = message(seed, 1000 + n, 4, 0);
        m.body = vec![n as u8; 3000];
        let q = first_offset + n;
        let a = log.append(&m.draft(), q).unwrap();
        let bytes = m.draft().encode(Placement {
            queue_offset: q,
            physical_offset: a.physical_offset,
            store_timestamp_ms: a.store_timestamp_ms,
        });
        round.push((a, bytes));
    }
    let (last, _) = round.last().unwrap();
    let err = log
        .wait_acked_since(last.end(), last.epoch)
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::DiskFull { .. }), "{err}");
    round
}

/// Tells the log its disk has room again until it takes appends (once the cleanup of its
/// last cut is done), for 10 s at most.
async fn space_back(log: &CommitLog) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        log.space_returned();
        if log.full().is_none() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "appends still refused 10 s after space returned: {:?}",
            log.full()
        );
        ringmq::io::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// A round that rolls into a new segment and finds the disk full there (the first segment's
/// write went through, the new file was created, its write failed): the new file is removed
/// before appends are taken again, so the next roll cannot open it just before it is
/// unlinked (acknowledged records would go to a file without a name), and nothing of the
/// failed rounds is read back after a reopen. The removal runs on another thread and is
/// quick, so the check is made on 16 such cuts in a row (without the rule, 8 runs of 8 saw a
/// file still there, at the 2nd to the 9th cut).
#[test]
fn files_past_a_cut_are_gone_before_appends_are_taken_again() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let seg = 64 * 1024;
        let cfg = config(seg, FlushMode::Async);
        let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
            .await
            .unwrap();
        let mut kept = append_all(&log, 9, 20, 100).await;
        for cycle in 0..16u64 {
            let next_base = (log.write_offset() / seg + 1) * seg;
            let next = dir.path().join(format!("{next_base:020}"));
            assert!(!next.exists());
            // The round's first write passes; the second (the next segment's) finds the
            // disk full.
            ringmq::io::inject_failure_after(ringmq::io::FailPoint::WriteNoSpace, 1);
            let round = append_round(&log, 9, cycle * 1000).await;
            let (last, _) = round.last().unwrap();
            assert!(last.end() > next_base, "the round rolls");
            // Space is back at once: appends are taken again only once the file is gone.
            space_back(&log).await;
            assert!(
                !next.exists(),
                "cut {cycle}: appends taken again while {} was still being removed",
                next.display()
            );
            // What went out in an earlier round is acknowledged (never past the next
            // segment's start); the failed round is cut.
            for (a, bytes) in round {
                match log.wait_acked_since(a.end(), a.epoch).await {
                    Ok(()) => {
                        assert!(a.end() <= next_base, "acknowledged past the failed write");
                        kept.push((a.physical_offset, bytes));
                    }
                    Err(e) => assert!(matches!(e, LogError::DiskFull { .. }), "{e}"),
                }
            }
            let more = append_all(&log, 10 + cycle, 100, 3000).await;
            assert!(
                more.last().unwrap().0 > next_base,
                "the new appends roll into the next segment"
            );
            kept.extend(more);
        }
        check_closed_and_reopened(log, dir.path(), cfg, &kept).await;
    });
}

/// A round whose first write (into the segment it started in) went through and whose second
/// (into the next segment) found the disk full: the records the first write put past the
/// readable end were answered `DiskFull`, so a close and reopen right away (no append after
/// the cut to overwrite them) must not bring them back. Both flush modes.
#[test]
fn records_a_cut_dropped_do_not_come_back_after_a_reopen() {
    for flush in [FlushMode::Async, FlushMode::Sync] {
        run_local(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let seg = 64 * 1024;
            let cfg = config(seg, flush);
            let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
                .await
                .unwrap();
            let kept = append_all(&log, 21, 20, 100).await;
            let at = log.readable_end();
            // In sync mode the pre-zeroing writes count too: fail the data write into the
            // next segment, whatever comes before it.
            let skip = if flush == FlushMode::Sync { 2 } else { 1 };
            ringmq::io::inject_failure_after(ringmq::io::FailPoint::WriteNoSpace, skip);
            let round = append_round(&log, 21, 100).await;
            assert!(round.last().unwrap().0.end() > seg, "the round rolls");
            assert_eq!(log.write_offset(), at, "cut back to the readable end");
            space_back(&log).await;
            check_closed_and_reopened(log, dir.path(), cfg, &kept).await;
        });
    }
}

/// Appends of one tick that outgrow the write buffer (sized by a first, one-record round)
/// grow it: the round is still one write (two writes one after the other cost the tail
/// latency of large batches). Every record reads back from the cache of the newest writes
/// and, after a reopen, from the files; both flush modes.
#[test]
fn a_round_larger_than_its_buffer_grows_it_and_is_one_write() {
    for flush in [FlushMode::Async, FlushMode::Sync] {
        run_local(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let cfg = config(16 << 20, flush);
            let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
                .await
                .unwrap();
            // A first round sizes the buffers for small writes (one record).
            let first = append_all(&log, 11, 1, 100).await;
            let writes_before = log.stats().writes.get();
            // Then 400 records (~400 KiB) in one tick: no wait between the appends.
            let mut expected = first;
            let mut last_end = 0;
            for n in 1..=400u64 {
                let m = message(11, n, 4, 3000);
                let a = log.append(&m.draft(), n).unwrap();
                let bytes = m.draft().encode(Placement {
                    queue_offset: n,
                    physical_offset: a.physical_offset,
                    store_timestamp_ms: a.store_timestamp_ms,
                });
                last_end = a.end();
                expected.push((a.physical_offset, bytes));
            }
            assert!(last_end > 200 << 10, "{last_end} bytes appended");
            log.wait_acked(last_end).await.unwrap();
            let writes = log.stats().writes.get() - writes_before;
            assert_eq!(
                writes,
                1,
                "writes for ~{} KiB appended in one tick into a buffer sized for one record",
                last_end >> 10
            );
            check_all(&log, &expected).await;
            log.close().await.unwrap();
            let (log, report) = CommitLog::open(dir.path(), cfg, 0, |_| {}).await.unwrap();
            assert_eq!(report.end_offset, last_end);
            assert_eq!(report.truncated_bytes, 0);
            check_all(&log, &expected).await;
        });
    }
}

/// A round that ends exactly at a segment's end leaves an empty chunk there, which the next
/// append's roll seals. With the write buffers grown past 64 KiB by large rounds, that empty
/// chunk once panicked the writer (it asked for a zero-byte buffer to shrink into). Both
/// flush modes; every record reads back, from the cache and after a reopen.
#[test]
fn a_round_that_ends_exactly_at_a_segment_end_then_a_roll() {
    for flush in [FlushMode::Async, FlushMode::Sync] {
        run_local(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let seg = 1u64 << 20;
            let cfg = config(seg, flush);
            let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
                .await
                .unwrap();
            let mut expected = Vec::new();
            let mut append = |m: &common::TestMessage, n: u64| {
                let a = log.append(&m.draft(), n).unwrap();
                let bytes = m.draft().encode(Placement {
                    queue_offset: n,
                    physical_offset: a.physical_offset,
                    store_timestamp_ms: a.store_timestamp_ms,
                });
                assert_eq!(bytes.len(), a.size as usize);
                expected.push((a.physical_offset, bytes));
                a.end()
            };
            // What a record costs beyond its body.
            let mut probe = message(13, 0, 4, 0);
            probe.body.clear();
            let overhead = probe
                .draft()
                .encode(Placement {
                    queue_offset: 0,
                    physical_offset: 0,
                    store_timestamp_ms: 0,
                })
                .len() as u64;
            // Rounds of ~256 KiB (the chunks then start with room past 64 KiB), the last
            // one ending exactly at the segment's end.
            let mut n = 0;
            let mut end = 0;
            while end < seg {
                let round_end = (end + (256 << 10)).min(seg);
                while end < round_end {
                    let mut m = probe.clone();
                    let left = seg - end;
                    let body = if left < 2 * (4096 + overhead) {
                        left - overhead
                    } else {
                        4096
                    };
                    m.body = vec![(n % 251) as u8; body as usize];
                    end = append(&m, n);
                    n += 1;
                }
                log.wait_acked(end).await.unwrap();
            }
            assert_eq!(end, seg, "the last record ends at the segment's end");
            let mut m = probe.clone();
            m.body = vec![7; 100];
            let after = append(&m, n);
            log.wait_acked(after).await.unwrap();
            assert_eq!(
                expected.last().unwrap().0,
                seg,
                "the next record opens segment 2"
            );
            check_all(&log, &expected).await;
            log.close().await.unwrap();
            drop(log);
            let (log, report) = CommitLog::open(dir.path(), cfg, 0, |_| {}).await.unwrap();
            assert_eq!(report.end_offset, after);
            check_all(&log, &expected).await;
        });
    }
}

/// Opens a log of 64 MiB segments in `dir` and appends more than 20 MiB to it; returns the
/// log and what it holds.
async fn log_of_20_mib(dir: &std::path::Path, cfg: &LogConfig) -> (CommitLog, Vec<(u64, Vec<u8>)>) {
    let (log, _) = CommitLog::open(dir, cfg.clone(), 0, |_| {}).await.unwrap();
    let expected = append_all(&log, 9, 12_000, 32 * 1024).await;
    assert!(
        log.write_offset() > 20 << 20,
        "{} bytes",
        log.write_offset()
    );
    (log, expected)
}

/// Sync mode keeps the blocks ahead of the writer initialized from a background task: the
/// sends after a segment's first write never wait for zeroing, and no zero ever lands on
/// a record (the records read back from the files after a reopen are the ones written).
#[test]
fn sync_mode_zeroes_ahead_of_the_writer_in_the_background() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(64 << 20, FlushMode::Sync);
        let (log, expected) = log_of_20_mib(dir.path(), &cfg).await;
        let stats = log.stats();
        assert_eq!(
            stats.prezero_inline.get(),
            1,
            "only the segment's first write zeroes on the acknowledgement path"
        );
        assert!(
            stats.prezero_background.get() >= 2,
            "{} background zeroings",
            stats.prezero_background.get()
        );
        // Read from the files (a new log has nothing cached).
        check_closed_and_reopened(log, dir.path(), cfg, &expected).await;
    });
}

/// Async mode zeroes ahead in the background (never inline) while the log writes slowly,
/// and not at all when told not to; either way every record reads back after a reopen (no
/// zeros landed on data).
#[test]
fn async_mode_zeroes_ahead_while_the_log_writes_slowly() {
    for (rate_max, zeroes) in [(u64::MAX, true), (0, false)] {
        run_local(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let cfg = async_config(rate_max);
            let (log, expected) = log_of_20_mib(dir.path(), &cfg).await;
            let stats = log.stats();
            assert_eq!(
                stats.prezero_inline.get(),
                0,
                "async mode never zeroes inline"
            );
            let background = stats.prezero_background.get();
            assert_eq!(
                background >= 2,
                zeroes,
                "rate max {rate_max}: {background} zeroings"
            );
            check_closed_and_reopened(log, dir.path(), cfg, &expected).await;
        });
    }
}

/// A log config of 64 MiB segments in async mode, zeroing ahead below `rate_max` bytes a
/// second.
fn async_config(rate_max: u64) -> LogConfig {
    LogConfig {
        async_prezero_rate_max: rate_max,
        ..config(64 << 20, FlushMode::Async)
    }
}

/// Opens a log in `dir` with [`async_config`]; returns it and its config.
async fn open_async_log(dir: &std::path::Path, rate_max: u64) -> (CommitLog, LogConfig) {
    let cfg = async_config(rate_max);
    let (log, _) = CommitLog::open(dir, cfg.clone(), 0, |_| {}).await.unwrap();
    (log, cfg)
}

/// Async mode stops zeroing ahead once the log writes faster than the rate given: here 1
/// byte a second, which the first measured window exceeds.
#[test]
fn async_mode_stops_zeroing_ahead_when_the_log_writes_fast() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (log, cfg) = open_async_log(dir.path(), 1).await;
        let mut expected = append_all(&log, 12, 200, 4 * 1024).await;
        // The rate is measured over windows of 100 ms of writing: write small records
        // through the first one (too little to need a second stretch meanwhile).
        let started = std::time::Instant::now();
        for seed in 100.. {
            if started.elapsed() >= std::time::Duration::from_millis(150) {
                break;
            }
            expected.extend(append_all(&log, seed, 1, 100).await);
        }
        expected.extend(append_all(&log, 13, 12_000, 32 * 1024).await);
        assert!(
            log.write_offset() > 20 << 20,
            "{} bytes",
            log.write_offset()
        );
        // One stretch, started before any window ended (the log counts as slow until one
        // says otherwise), and none after.
        let background = log.stats().prezero_background.get();
        assert_eq!(background, 1, "{background} zeroings");
        check_closed_and_reopened(log, dir.path(), cfg, &expected).await;
    });
}

/// In async mode a write that reaches blocks still being zeroed waits for those zeros (they
/// must not land on its data), and the log then counts as writing fast. The executor runs
/// one task at a time: while this test appends 4 MiB in one go, the background zeroing
/// started by the first write cannot get past its first pieces.
#[test]
fn async_mode_writes_wait_for_zeros_only_where_they_catch_up() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (log, cfg) = open_async_log(dir.path(), u64::MAX).await;
        let mut expected = append_all(&log, 14, 1, 100).await;
        assert_eq!(log.stats().prezero_caught_up.get(), 0);
        let mut last_end = 0;
        for n in 1..1000u64 {
            let mut m = message(14, n, 4, 0);
            m.body = vec![n as u8; 4000];
            let a = log.append(&m.draft(), n).unwrap();
            expected.push((
                a.physical_offset,
                m.draft().encode(Placement {
                    queue_offset: n,
                    physical_offset: a.physical_offset,
                    store_timestamp_ms: a.store_timestamp_ms,
                }),
            ));
            last_end = a.end();
        }
        log.wait_acked(last_end).await.unwrap();
        assert_eq!(log.stats().prezero_caught_up.get(), 1);
        check_closed_and_reopened(log, dir.path(), cfg, &expected).await;
    });
}

/// The open flags of the file descriptor this process has on `path`, from /proc.
fn open_flags(path: &std::path::Path) -> Option<u32> {
    for fd in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        if std::fs::read_link(fd.path()).ok().as_deref() == Some(path) {
            let info = std::fs::read_to_string(format!(
                "/proc/self/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .ok()?;
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:"))?;
            return u32::from_str_radix(flags.trim(), 8).ok();
        }
    }
    None
}

/// Sync mode writes its segments through O_DSYNC (a write completes once durable: no
/// separate fdatasync on the acknowledgement path); async mode does not. Either way, what
/// was acknowledged reads back after a reopen.
#[test]
fn sync_mode_writes_segments_with_o_dsync() {
    for flush in [FlushMode::Sync, FlushMode::Async] {
        run_local(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let cfg = config(1 << 20, flush);
            let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
                .await
                .unwrap();
            let kept = append_all(&log, 9, 50, 300).await;
            let segment = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| p.file_name().unwrap().len() == 20)
                .expect("a segment file");
            let flags = open_flags(&segment).expect("the log holds its segment open");
            let dsync = flags & libc::O_DSYNC as u32 != 0;
            assert_eq!(
                dsync,
                flush == FlushMode::Sync,
                "{flush:?}: flags {flags:o}"
            );
            if flush == FlushMode::Sync {
                assert!(
                    log.stats().fdatasync.borrow().count() > 0,
                    "each durable write is counted where fdatasyncs were"
                );
            }
            drop(log);
            let (log, _) = CommitLog::open(dir.path(), cfg, 0, |_| {}).await.unwrap();
            check_all(&log, &kept).await;
        });
    }
}

/// Records appended across rolls in one tick are taken back whole: the segments the rolls
/// opened go (no file is made for them), appends go on from where the first one started,
/// and a reopen finds exactly what was kept. Once a write took them, they cannot be.
#[test]
fn appends_across_rolls_in_one_tick_are_taken_back_whole() {
    for flush in [FlushMode::Async, FlushMode::Sync] {
        run_local(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let cfg = config(16 * 1024, flush);
            let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
                .await
                .unwrap();
            let mut kept = append_all(&log, 5, 10, 3000).await;
            let from = log.write_offset();
            let segments = log.segment_count();
            // 40 KiB in one tick: two rolls at least.
            let mut n = 0;
            while log.write_offset() < from + 40 * 1024 {
                let m = message(6, n, 4, 3000);
                log.append(&m.draft(), 1_000 + n).unwrap();
                n += 1;
            }
            assert!(log.segment_count() >= segments + 2, "no two rolls");
            assert!(log.can_take_back(from));
            log.take_back(from);
            assert_eq!(log.write_offset(), from);
            assert_eq!(log.segment_count(), segments, "the rolled-to segments stay");
            let more = append_all(&log, 7, 30, 3000).await;
            assert_eq!(more[0].0, from, "appends go on where the taken back began");
            let last_kept = kept.last().unwrap().0;
            assert!(!log.can_take_back(last_kept), "a written record taken back");
            kept.extend(more);
            check_closed_and_reopened(log, dir.path(), cfg, &kept).await;
        });
    }
}

/// A fresh log creates (and preallocates) the segment appends go to when it opens, so the
/// first append's write does not wait for the file's creation, allocation and directory
/// sync; it still works as before.
#[test]
fn a_fresh_log_creates_its_first_segment_when_it_opens() {
    use std::os::unix::fs::MetadataExt;
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(1 << 20, FlushMode::Async);
        let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
            .await
            .unwrap();
        let segment = dir.path().join(format!("{:020}", 0));
        let meta = std::fs::metadata(&segment).expect("the first segment exists before any append");
        assert!(
            meta.blocks() * 512 >= 1 << 20,
            "preallocated: {} blocks",
            meta.blocks()
        );
        let kept = append_all(&log, 5, 20, 200).await;
        check_closed_and_reopened(log, dir.path(), cfg, &kept).await;
    });
}

/// Async mode: a sync begun while another is under way waits for that one's fdatasync (the
/// first took the files to sync; the second, finding none, would otherwise say the log
/// durable over data not yet synced), and a sync to an end already durable makes none.
#[test]
fn a_sync_begun_during_another_waits_for_its_fdatasync() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(1 << 20, FlushMode::Async);
        cfg.flush_interval_ms = 3_600_000;
        let (log, _) = CommitLog::open(dir.path(), cfg, 0, |_| {}).await.unwrap();
        let syncs = || log.stats().fdatasync.borrow().count();
        let append = |n: u64| {
            let m = message(9, n, 4, 200);
            let a = log.append(&m.draft(), n).unwrap();
            let acked = log.wait_acked(a.end());
            async move {
                acked.await.unwrap();
                a.end()
            }
        };
        let end = append(0).await;
        assert!(log.durable_end() < end, "written, not synced yet");
        let before = syncs();
        let first = {
            let log = log.clone();
            ringmq::io::spawn_joinable(async move { log.sync_all().await })
        };
        // The first pass takes the file and waits for its fdatasync.
        ringmq::io::yield_now().await;
        log.sync_all().await.unwrap();
        assert_eq!(
            syncs(),
            before + 1,
            "the second sync ended after the first one's fdatasync, and made none of its own"
        );
        assert!(log.durable_end() >= end);
        first.await.unwrap().unwrap();
        log.sync_to(end).await.unwrap();
        assert_eq!(syncs(), before + 1, "durable already: nothing synced");
        let end = append(1).await;
        log.sync_to(end).await.unwrap();
        assert_eq!(syncs(), before + 2);
        assert!(log.durable_end() >= end);
    });
}

/// A log reopened after an unclean stop fdatasyncs every segment holding bytes past the
/// last run's known durable point before it calls its end durable (a checkpoint taken then
/// would claim bytes still only in the page cache), and one that cannot fails to open.
/// The layout: three segments written without a sync at the end, the last one's data lost
/// (the crash came before its pages were written), so that the recovery itself finds no
/// torn tail to cut and sync.
#[test]
fn a_reopened_log_syncs_the_segments_past_its_known_durable_point() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let segment = 64 * 1024;
        let cfg = config(segment, FlushMode::Async);
        let (log, _) = CommitLog::open(dir.path(), cfg.clone(), 0, |_| {})
            .await
            .unwrap();
        let mut kept = append_all(&log, 9, 400, 500).await;
        // Written (not synced) before the stop, whatever the writer's pace.
        log.wait_readable(log.write_offset()).await.unwrap();
        let last_base = kept.last().unwrap().0 / segment * segment;
        assert!(last_base >= 2 * segment, "three segments at least");
        drop(log);
        let last = dir.path().join(format!("{last_base:020}"));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&last)
            .unwrap()
            .set_len(0)
            .unwrap();
        kept.retain(|(phys, _)| *phys < last_base);
        let crashed = LogConfig {
            known_durable: 0,
            ..cfg
        };
        ringmq::io::inject_failure(ringmq::io::FailPoint::Fdatasync);
        let r = CommitLog::open(dir.path(), crashed.clone(), 0, |_| {}).await;
        let e = r.err().expect("opened without syncing");
        assert!(e.to_string().contains("injected"), "{e}");
        let (log, report) = CommitLog::open(dir.path(), crashed, 0, |_| {})
            .await
            .unwrap();
        assert_eq!(report.end_offset, last_base);
        assert_eq!(log.durable_end(), last_base);
        check_all(&log, &kept).await;
    });
}
