//! natsbench: ringmq-bench's workload against NATS JetStream, for perf/peer.sh.
//!
//! A file-storage stream `BENCH` over subjects `bench.0` .. `bench.<queues - 1>` (the
//! "queues", published to round-robin); `--producers` connections publish 1-message sends,
//! each holding up to `--in-flight` publishes waiting for their JetStream acknowledgement
//! (closed loop), or on a fixed schedule (`--rate`, open loop, latency counted from the
//! scheduled time, as ringmq-bench counts it); one pull consumer (`AckPolicy::None`, the
//! closest to ringmq's offset commits) receives everything. Bodies carry their send time:
//! the consumer records end-to-end latency. The JSON report has ringmq-bench's fields.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use clap::Parser;
use futures_util::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;

#[derive(Parser, Clone)]
#[command(about = "ringmq-bench's workload against NATS JetStream (perf/peer.sh)")]
struct Cli {
    /// NATS server address
    #[arg(long, default_value = "127.0.0.1:4222")]
    server: String,
    /// Message body bytes
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Publishing connections
    #[arg(long, default_value_t = 2)]
    producers: usize,
    /// Pull consumers (0 or 1)
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Subjects the stream's messages are spread over, round-robin
    #[arg(long, default_value_t = 8)]
    queues: usize,
    /// Publishes waiting for their acknowledgement, per producer
    #[arg(long, default_value_t = 128)]
    in_flight: usize,
    /// Messages per second over all producers, open loop; 0: closed loop
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Seconds of sending
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Seconds at the start whose latencies are not recorded
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Messages the consumer asks for per pull
    #[arg(long, default_value_t = 200)]
    pull_batch: usize,
    /// Write the results as JSON to this file
    #[arg(long)]
    json: Option<PathBuf>,
}

type Shared = Arc<Mutex<Histogram<u64>>>;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant bounds are valid")
}

fn record(h: &Shared, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
    h.lock().unwrap().saturating_record(us);
}

struct Run {
    cli: Cli,
    start: Instant,
    measure_from: Instant,
    deadline: Instant,
    sent: AtomicU64,
    errors: AtomicU64,
    send_latency: Shared,
}

/// The body: send (or scheduled) time as nanoseconds since the run's start, the sequence,
/// then zeros.
fn body(run: &Run, at: Instant, seq: u64) -> Bytes {
    let mut b = vec![0u8; run.cli.size.max(16)];
    let ns = at.duration_since(run.start).as_nanos() as u64;
    b[..8].copy_from_slice(&ns.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(b)
}

async fn publish(js: &jetstream::Context, run: &Run, seq: u64, at: Instant) -> bool {
    let subject = format!("bench.{}", seq % run.cli.queues as u64);
    let acked = match js.publish(subject, body(run, at, seq)).await {
        Ok(ack) => ack.await.is_ok(),
        Err(_) => false,
    };
    settle(run, at, acked);
    acked
}

/// Counts a publish answered (`acked`) or failed; its latency from `at`.
fn settle(run: &Run, at: Instant, acked: bool) {
    if acked {
        run.sent.fetch_add(1, Ordering::Relaxed);
        if at >= run.measure_from {
            record(&run.send_latency, at.elapsed());
        }
    } else {
        run.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Closed loop: up to --in-flight publishes of this producer wait for their acks.
async fn produce_closed(js: jetstream::Context, run: Arc<Run>, index: u64) {
    let mut in_flight = FuturesUnordered::new();
    let mut seq = index << 40;
    loop {
        while in_flight.len() < run.cli.in_flight && Instant::now() < run.deadline {
            let (js, run) = (js.clone(), run.clone());
            let s = seq;
            seq += 1;
            // The publish itself is awaited here (it queues the message in order); its
            // acknowledgement is awaited with the others in flight.
            let subject = format!("bench.{}", s % run.cli.queues as u64);
            let at = Instant::now();
            match js.publish(subject, body(&run, at, s)).await {
                Ok(ack) => in_flight.push(async move { (at, ack.await.is_ok(), run) }),
                Err(_) => {
                    run.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        match in_flight.next().await {
            Some((at, ok, run)) => settle(&run, at, ok),
            None => break,
        }
    }
}

/// Open loop on a thread of its own (OS timer, as ringmq-bench's): publish `n` is due at
/// `start + n * interval`; each runs as a task, at most --in-flight at once.
fn produce_open(js: jetstream::Context, run: Arc<Run>, index: u64, handle: tokio::runtime::Handle) {
    let interval = Duration::from_secs_f64(run.cli.producers as f64 / run.cli.rate as f64);
    let window = Arc::new(tokio::sync::Semaphore::new(run.cli.in_flight));
    let mut n: u32 = 0;
    loop {
        let due = run.start + interval.saturating_mul(n);
        // Behind schedule at the end: stop on time, as ringmq-bench does, rather than
        // send the backlog after the deadline.
        if due >= run.deadline || Instant::now() >= run.deadline {
            break;
        }
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        let permit = match handle.block_on(window.clone().acquire_owned()) {
            Ok(p) => p,
            Err(_) => break,
        };
        let (js, run) = (js.clone(), run.clone());
        let seq = (index << 40) | u64::from(n);
        handle.spawn(async move {
            publish(&js, &run, seq, due).await;
            drop(permit);
        });
        n += 1;
    }
    let all = u32::try_from(run.cli.in_flight).unwrap_or(u32::MAX);
    let _ = handle.block_on(window.acquire_many(all));
}

struct Consumed {
    received: u64,
    last: Instant,
    e2e: Histogram<u64>,
}

async fn consume(
    messages: consumer::pull::Stream,
    run: Arc<Run>,
    producers_done: Arc<tokio::sync::Notify>,
) -> Consumed {
    let mut messages = messages;
    let mut out = Consumed {
        received: 0,
        last: run.start,
        e2e: histogram(),
    };
    let done = producers_done.notified();
    tokio::pin!(done);
    let mut producing = true;
    loop {
        if !producing && out.received >= run.sent.load(Ordering::Relaxed) {
            break;
        }
        let next = if producing {
            tokio::select! {
                m = messages.next() => m,
                _ = &mut done => { producing = false; continue; }
            }
        } else {
            match tokio::time::timeout(Duration::from_secs(10), messages.next()).await {
                Ok(m) => m,
                Err(_) => break,
            }
        };
        let m = match next {
            Some(Ok(m)) => m,
            // The pull stream reports missed heartbeats and the like, then goes on.
            Some(Err(e)) => {
                run.errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("natsbench: consumer: {e}");
                continue;
            }
            None => break,
        };
        let now = Instant::now();
        let p = &m.payload;
        if p.len() >= 8 {
            let ns = u64::from_le_bytes(p[..8].try_into().unwrap());
            let at = run.start + Duration::from_nanos(ns);
            if at >= run.measure_from {
                let us = u64::try_from(now.duration_since(at).as_micros()).unwrap_or(u64::MAX);
                out.e2e.saturating_record(us.max(1));
            }
        }
        out.received += 1;
        out.last = now;
    }
    out
}

fn pct(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "p50": h.value_at_quantile(0.5), "p90": h.value_at_quantile(0.9),
        "p99": h.value_at_quantile(0.99), "p999": h.value_at_quantile(0.999),
        "max": h.max(),
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let setup = async_nats::connect(&cli.server).await?;
    let js = jetstream::new(setup.clone());
    let _ = js.delete_stream("BENCH").await;
    let stream = js
        .create_stream(stream::Config {
            name: "BENCH".into(),
            subjects: vec!["bench.*".into()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    let consumer_stream = if cli.consumers > 0 {
        let c = stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("bench".into()),
                ack_policy: consumer::AckPolicy::None,
                ..Default::default()
            })
            .await?;
        Some(
            c.stream()
                .max_messages_per_batch(cli.pull_batch)
                .messages()
                .await?,
        )
    } else {
        None
    };
    let mut producer_js = Vec::new();
    for _ in 0..cli.producers {
        producer_js.push(jetstream::new(async_nats::connect(&cli.server).await?));
    }
    let start = Instant::now();
    let run = Arc::new(Run {
        measure_from: start + Duration::from_secs_f64(cli.warmup),
        deadline: start + Duration::from_secs_f64(cli.duration),
        cli: cli.clone(),
        start,
        sent: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        send_latency: Arc::new(Mutex::new(histogram())),
    });
    let producers_done = Arc::new(tokio::sync::Notify::new());
    let consumer =
        consumer_stream.map(|s| tokio::spawn(consume(s, run.clone(), producers_done.clone())));
    let mut tasks = Vec::new();
    for (i, js) in producer_js.into_iter().enumerate() {
        let run = run.clone();
        if cli.rate == 0 {
            tasks.push(tokio::spawn(produce_closed(js, run, i as u64)));
        } else {
            let handle = tokio::runtime::Handle::current();
            tasks.push(tokio::task::spawn_blocking(move || {
                produce_open(js, run, i as u64, handle)
            }));
        }
    }
    for t in tasks {
        t.await?;
    }
    let produced_in = start.elapsed().as_secs_f64();
    producers_done.notify_one();
    let sent = run.sent.load(Ordering::Relaxed);
    let consumed = match consumer {
        Some(c) => Some(c.await?),
        None => None,
    };
    let send = run.send_latency.lock().unwrap().clone();
    let (received, consume_rate, e2e) = match &consumed {
        Some(c) => (
            c.received,
            c.received as f64 / c.last.duration_since(start).as_secs_f64().max(1e-9),
            c.e2e.clone(),
        ),
        None => (0, 0.0, histogram()),
    };
    println!(
        "natsbench: produce {sent} messages in {produced_in:.2} s: {:.0} msg/s ({} errors); consume {received}: {consume_rate:.0} msg/s",
        sent as f64 / produced_in,
        run.errors.load(Ordering::Relaxed)
    );
    println!(
        "send latency us p50 {} p99 {} p99.9 {}; end-to-end p50 {} p99 {} p99.9 {}",
        send.value_at_quantile(0.5),
        send.value_at_quantile(0.99),
        send.value_at_quantile(0.999),
        e2e.value_at_quantile(0.5),
        e2e.value_at_quantile(0.99),
        e2e.value_at_quantile(0.999)
    );
    if let Some(path) = &cli.json {
        let j = serde_json::json!({
            "messages_sent": sent,
            "messages_received": received,
            "produce": { "msgs_per_sec": sent as f64 / produced_in },
            "consume": { "msgs_per_sec": consume_rate },
            "send_latency_us": pct(&send),
            "e2e_latency_us": pct(&e2e),
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)?;
    }
    if consumed.is_some() && received < sent {
        eprintln!("natsbench: {} messages not received", sent - received);
    }
    Ok(())
}
