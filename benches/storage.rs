//! Storage engine micro benchmarks: append throughput (1 KiB and 16 KiB, async and sync
//! with 1, 16 and 64 concurrent appenders), range reads, and the recovery scan.
//! Under `cargo test --all-targets` each runs once at its smallest setting, so they cannot rot.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ringmq::io::run_local;
use ringmq::log::{CommitLog, FlushMode, LogConfig};
use ringmq::protocol::record::RecordDraft;

fn draft(body: &[u8]) -> RecordDraft<'_> {
    RecordDraft::plain("bench", 0, b"", body)
}

fn cfg(flush: FlushMode) -> LogConfig {
    LogConfig {
        segment_bytes: 256 << 20,
        flush,
        ..LogConfig::default()
    }
}

/// Appends `count` records of `record_bytes` total size with `appenders` concurrent tasks,
/// each waiting for its acknowledgement before the next append; returns the elapsed time.
pub fn append_run(flush: FlushMode, record_bytes: usize, appenders: u64, count: u64) -> Duration {
    run_local(move || async move {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let (log, _) = CommitLog::open(dir.path(), cfg(flush), 0, |_| {})
            .await
            .unwrap();
        let body = vec![7u8; record_bytes - ringmq::protocol::record::HEADER_BYTES - 5];
        let body = std::rc::Rc::new(body);
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..appenders {
            let log = log.clone();
            let body = body.clone();
            tasks.push(ringmq::io::spawn_joinable(async move {
                let per = count / appenders;
                if appenders == 1 && flush == FlushMode::Async {
                    // Pipelined: append everything, then wait for the last acknowledgement.
                    let mut end = 0;
                    for i in 0..per {
                        end = log.append(&draft(&body), i).unwrap().end();
                        if i % 256 == 255 {
                            log.wait_acked(end).await.unwrap();
                        }
                    }
                    log.wait_acked(end).await.unwrap();
                } else {
                    for i in 0..per {
                        let a = log.append(&draft(&body), i).unwrap();
                        log.wait_acked(a.end()).await.unwrap();
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let elapsed = start.elapsed();
        log.close().await.unwrap();
        elapsed
    })
}

fn appends(c: &mut Criterion) {
    let mut g = c.benchmark_group("append");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    let cases: &[(FlushMode, usize, u64)] = &[
        (FlushMode::Async, 1024, 1),
        (FlushMode::Async, 16 * 1024, 1),
        (FlushMode::Sync, 1024, 1),
        (FlushMode::Sync, 1024, 16),
        (FlushMode::Sync, 1024, 64),
        (FlushMode::Sync, 16 * 1024, 64),
    ];
    for &(flush, size, appenders) in cases {
        let per_iter: u64 = if flush == FlushMode::Sync && appenders == 1 {
            64
        } else {
            4096
        };
        g.throughput(Throughput::Bytes(per_iter * size as u64));
        let id = BenchmarkId::new(
            format!("{flush:?}/{size}B"),
            format!("{appenders}_appenders"),
        );
        g.bench_function(id, |b| {
            b.iter_custom(|iters| append_run(flush, size, appenders, per_iter * iters.max(1)))
        });
    }
    g.finish();
}

fn reads_and_recovery(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let path = dir.path().to_owned();
    let total_bytes: usize = 64 << 20;
    let record_bytes = 1024usize;
    let count = total_bytes / record_bytes;
    let p = path.clone();
    run_local(move || async move {
        let (log, _) = CommitLog::open(&p, cfg(FlushMode::Async), 0, |_| {})
            .await
            .unwrap();
        let body = vec![1u8; record_bytes - ringmq::protocol::record::HEADER_BYTES - 5];
        let mut end = 0;
        for i in 0..count as u64 {
            end = log.append(&draft(&body), i).unwrap().end();
        }
        log.wait_acked(end).await.unwrap();
        log.close().await.unwrap();
    });
    let mut g = c.benchmark_group("read");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Bytes(total_bytes as u64));
    let p = path.clone();
    g.bench_function("range_read_1MiB_chunks", |b| {
        let p = p.clone();
        b.iter_custom(move |iters| {
            let p = p.clone();
            run_local(move || async move {
                let (log, _) = CommitLog::open(&p, cfg(FlushMode::Async), u64::MAX, |_| {})
                    .await
                    .unwrap();
                let end = log.readable_end();
                let start = Instant::now();
                for _ in 0..iters {
                    let mut off = 0;
                    while off < end {
                        let len = ((end - off) as usize).min(1 << 20);
                        let buf = log.read(off, len).await.unwrap();
                        assert_eq!(buf.len(), len);
                        off += len as u64;
                    }
                }
                start.elapsed()
            })
        })
    });
    let p = path.clone();
    g.bench_function("recovery_scan_all_segments", |b| {
        let p = p.clone();
        b.iter_custom(move |iters| {
            let p = p.clone();
            run_local(move || async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut c = cfg(FlushMode::Async);
                    c.verify_segments_on_start = 0;
                    let start = Instant::now();
                    let (_log, report) = CommitLog::open(&p, c, 0, |_| {}).await.unwrap();
                    total += start.elapsed();
                    assert_eq!(report.records_verified as usize, count);
                }
                total
            })
        })
    });
    g.finish();
}

criterion_group!(benches, appends, reads_and_recovery);
criterion_main!(benches);
