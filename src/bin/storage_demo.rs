//! `ringmq-storage-demo`: appends messages to a store in a data directory, reads them back
//! by queue offset, by key and by time, and prints what it did. It is the first-run demo
//! until the broker lands, and the crash-test child process (`append-forever`).

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use ringmq::log::FlushMode;
use ringmq::protocol::record::{PropertiesBuilder, RecordDraft, RecordView};
use ringmq::store::{MessageStore, StoreConfig};

#[derive(Parser)]
#[command(
    name = "ringmq-storage-demo",
    about = "Append and read back messages with the ringmq storage engine"
)]
struct Cli {
    /// Data directory of the store.
    #[arg(long, default_value = "./data/storage-demo")]
    data_dir: PathBuf,
    /// Flush mode: async or sync.
    #[arg(long, default_value = "async")]
    flush: FlushMode,
    /// Segment size in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    segment_bytes: u64,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Append N messages over 4 queues of topic `demo`, then read them back.
    Demo {
        #[arg(long, default_value_t = 10_000)]
        messages: u64,
    },
    /// Measure raw commit-log append throughput: N records of SIZE bytes from APPENDERS
    /// concurrent tasks, each waiting for its acknowledgement (the flush mode decides what
    /// that means); with one async appender, appends are pipelined.
    BenchAppend {
        #[arg(long, default_value_t = 1024)]
        size: usize,
        #[arg(long, default_value_t = 1)]
        appenders: u64,
        #[arg(long, default_value_t = 1 << 20)]
        records: u64,
    },
    /// Measure the recovery scan: open the log in --data-dir verifying every segment.
    BenchRecovery,
    /// Append numbered messages until killed; print `ACK <n> <queue> <queue offset> <physical offset> <size>` after each acknowledgement.
    AppendForever {
        #[arg(long, default_value_t = 4)]
        queues: u32,
        #[arg(long, default_value_t = 8)]
        concurrency: u32,
    },
}

fn main() {
    let cli = Cli::parse();
    let code = ringmq::io::run_local(move || async move {
        match run(cli).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("ringmq-storage-demo: {e}");
                1
            }
        }
    });
    std::process::exit(code);
}

fn config(cli: &Cli) -> StoreConfig {
    let mut cfg = StoreConfig::default();
    cfg.log.flush = cli.flush;
    cfg.log.segment_bytes = cli.segment_bytes;
    cfg
}

/// Body of message `n`: its number and a pattern the crash test can check.
pub fn body_of(n: u64) -> Vec<u8> {
    let len = 16 + (n % 300) as usize;
    let mut b = vec![(n % 251) as u8; len];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.cmd {
        Some(Cmd::BenchAppend {
            size,
            appenders,
            records,
        }) => {
            return bench_append(&cli, size, appenders, records).await;
        }
        Some(Cmd::BenchRecovery) => return bench_recovery(&cli).await,
        _ => {}
    }
    let (store, rec) = MessageStore::open(&cli.data_dir, config(&cli)).await?;
    match cli.cmd {
        None | Some(Cmd::Demo { .. }) => {
            let messages = match cli.cmd {
                Some(Cmd::Demo { messages }) => messages,
                _ => 10_000,
            };
            println!(
                "opened {} ({} shutdown; recovered {} records, log {}..{})",
                cli.data_dir.display(),
                if rec.clean_shutdown {
                    "clean"
                } else {
                    "unclean"
                },
                rec.log.records_verified,
                rec.log.min_offset,
                rec.log.end_offset
            );
            let started = std::time::Instant::now();
            let mut last = None;
            let mut first_offsets = [None; 4];
            for n in 0..messages {
                let mut p = PropertiesBuilder::new();
                p.put("TAGS", if n % 2 == 0 { "even" } else { "odd" })?;
                p.put("KEYS", &format!("demo-{n}"))?;
                let body = format!("hello from ringmq, message {n}");
                let queue_id = (n % 4) as u32;
                let draft = RecordDraft {
                    topic: "demo",
                    queue_id,
                    flag: 0,
                    sys_flag: 0,
                    born_timestamp_ms: ringmq::log::now_ms(),
                    born_host: "127.0.0.1:0".parse()?,
                    reconsume_times: 0,
                    transaction_offset: 0,
                    properties: p.as_bytes(),
                    body: body.as_bytes(),
                };
                let r = store.append(&draft)?;
                first_offsets[queue_id as usize].get_or_insert(r.queue_offset);
                last = Some(r);
            }
            if let Some(r) = last {
                store.acked(r.written()).await?;
            }
            let secs = started.elapsed().as_secs_f64();
            println!(
                "appended {messages} messages to topic demo (4 queues) in {:.3} s ({:.0} msg/s)",
                secs,
                messages as f64 / secs
            );
            let mut read = 0u64;
            for q in 0..4u32 {
                let (min, max) = store.queue_range("demo", q)?;
                let mut off = first_offsets[q as usize].unwrap_or(max);
                while off < max {
                    let batch = store.read_queue("demo", q, off, 32, 1 << 20, &[]).await?;
                    for rec in batch.records() {
                        RecordView::parse(rec)?;
                        read += 1;
                    }
                    off = batch.next_offset;
                }
                println!("queue {q}: offsets {min}..{max}");
            }
            println!("read back {read} messages by queue offset, 32 per read");
            let key = format!("demo-{}", messages.saturating_sub(1));
            let found = store.messages_by_key("demo", &key, 0, i64::MAX, 10).await?;
            for buf in &found {
                let v = RecordView::parse(buf)?;
                println!(
                    "by key {key}: queue {} offset {} body {:?}",
                    v.queue_id(),
                    v.queue_offset(),
                    String::from_utf8_lossy(v.body())
                );
            }
            store.close().await?;
            println!("closed cleanly; run again to see recovery from the checkpoint");
        }
        Some(Cmd::BenchAppend { .. }) | Some(Cmd::BenchRecovery) => unreachable!("handled above"),
        Some(Cmd::AppendForever {
            queues,
            concurrency,
        }) => {
            let counter = std::rc::Rc::new(std::cell::Cell::new(0u64));
            let mut tasks = Vec::new();
            for _ in 0..concurrency {
                let store = store.clone();
                let counter = counter.clone();
                tasks.push(ringmq::io::spawn_joinable(async move {
                    loop {
                        let n = counter.get();
                        counter.set(n + 1);
                        let body = body_of(n);
                        let mut p = PropertiesBuilder::new();
                        p.put("KEYS", &format!("n{n}")).map_err(|e| e.to_string())?;
                        let draft = RecordDraft {
                            topic: "crash",
                            queue_id: (n % queues as u64) as u32,
                            flag: n as i32,
                            sys_flag: 0,
                            born_timestamp_ms: n as i64,
                            born_host: "127.0.0.1:0".parse().map_err(|_| "addr".to_string())?,
                            reconsume_times: 0,
                            transaction_offset: 0,
                            properties: p.as_bytes(),
                            body: &body,
                        };
                        let r = store.append(&draft).map_err(|e| e.to_string())?;
                        store
                            .durable(r.written())
                            .await
                            .map_err(|e| e.to_string())?;
                        let mut out = std::io::stdout().lock();
                        writeln!(
                            out,
                            "ACK {n} {} {} {} {}",
                            draft.queue_id, r.queue_offset, r.physical_offset, r.size
                        )
                        .and_then(|_| out.flush())
                        .map_err(|e| e.to_string())?;
                    }
                    #[allow(unreachable_code)]
                    Ok::<(), String>(())
                }));
            }
            for t in tasks {
                if let Some(Err(e)) = t.await {
                    return Err(e.into());
                }
            }
        }
    }
    Ok(())
}

async fn bench_append(
    cli: &Cli,
    size: usize,
    appenders: u64,
    records: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    use ringmq::log::CommitLog;
    let header = ringmq::protocol::record::HEADER_BYTES + 5;
    if size < header {
        return Err(format!("--size must be at least {header}").into());
    }
    let dir = cli.data_dir.join("commitlog");
    let (log, _) = CommitLog::open(&dir, config(cli).log, 0, |_| {}).await?;
    let body = std::rc::Rc::new(vec![7u8; size - header]);
    let per = records / appenders.max(1);
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..appenders.max(1) {
        let log = log.clone();
        let body = body.clone();
        let flush = cli.flush;
        tasks.push(ringmq::io::spawn_joinable(async move {
            let draft = RecordDraft::plain("bench", 0, b"", &body);
            let pipelined = appenders == 1 && flush == FlushMode::Async;
            let (mut end, mut epoch) = (0, 0);
            for i in 0..per {
                let a = log.append(&draft, i).map_err(|e| e.to_string())?;
                (end, epoch) = (a.end(), a.epoch);
                if !pipelined || i % 1024 == 1023 {
                    log.wait_acked_since(end, epoch)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            log.wait_acked_since(end, epoch)
                .await
                .map_err(|e| e.to_string())
        }));
    }
    for t in tasks {
        if let Some(Err(e)) = t.await {
            return Err(e.into());
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let bytes = (per * appenders.max(1)) as f64 * size as f64;
    log.close().await?;
    println!(
        "{{\"records\": {}, \"size\": {size}, \"appenders\": {appenders}, \"flush\": \"{:?}\", \"secs\": {secs:.3}, \"records_per_sec\": {:.0}, \"mb_per_sec\": {:.1}}}",
        per * appenders.max(1),
        cli.flush,
        (per * appenders.max(1)) as f64 / secs,
        bytes / secs / 1e6
    );
    Ok(())
}

async fn bench_recovery(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    use ringmq::log::CommitLog;
    let dir = cli.data_dir.join("commitlog");
    let mut cfg = config(cli).log;
    cfg.verify_segments_on_start = 0;
    let started = std::time::Instant::now();
    let (log, report) = CommitLog::open(&dir, cfg, 0, |_| {}).await?;
    let secs = started.elapsed().as_secs_f64();
    log.close().await?;
    println!(
        "{{\"records\": {}, \"bytes\": {}, \"secs\": {secs:.3}, \"mb_per_sec\": {:.1}}}",
        report.records_verified,
        report.bytes_verified,
        report.bytes_verified as f64 / secs / 1e6
    );
    Ok(())
}
