//! `ringmq-bench`: the bundled load generator. It drives a broker through the native client
//! (or starts one in this process, in a temporary directory, for a one-command demo),
//! produces and consumes a topic, and reports throughput and latency percentiles from HDR
//! histograms, on stdout and optionally as JSON.
//!
//! Every message body starts with its send time (ns since the UNIX epoch, u64 LE) and a
//! sequence number (u64 LE); consumers subtract the send time from the time they see the
//! message: the end-to-end latency. The sequence is `run tag (16 bits) | producer (8) |
//! message number (40)`: consumers ignore messages of other runs, and count a message
//! delivered twice (a send retried after a timeout may be stored twice) once, reporting
//! the duplicates apart.
//!
//! With `--rate`, producers run open loop: each send is scheduled at a fixed time whether
//! or not earlier sends were answered, and latency counts from the scheduled time, so a
//! stalled broker shows up as latency rather than as fewer samples (no coordinated
//! omission). Without it, each producer keeps `--in-flight` sends outstanding.
//!
//! Consumers are pull loops over their share of the queues by default. With `--group`,
//! they are push consumers (concurrent mode) of that consumer group instead: the broker
//! divides the queues among them, the listener sees the message (end-to-end latency is
//! taken there), and offsets are committed to the broker. The group's offsets are first
//! set to the queues' current ends, so that, like the pull loops, they start there.
//!
//! `--keys N` sends with sharding keys (`k0`..`k{N-1}`, in turn), so each key's messages go
//! to one queue, in order.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use hdrhistogram::Histogram;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

use ringmq::client::{
    Client, ClientConfig, ClientError, ConsumeFrom, ConsumeStatus, OutgoingMessage, Producer,
    ProducerOptions, PullStatus, PushConsumer, PushConsumerOptions,
};
use ringmq::log::FlushMode;
use ringmq::protocol::ErrorCode;

/// Bytes at the start of every body: send time (u64 LE) and sequence (u64 LE).
const BODY_HEADER_BYTES: usize = 16;
/// Longest the run waits, after the producers are done, for consumers to catch up.
const DRAIN_TIMEOUT_S: u64 = 30;
/// Long-polling wait of the bench's pulls: short enough that consumers notice the end.
const PULL_WAIT_MS: u64 = 500;
/// Longest the run waits for push consumers (`--group`) to share the queues before it
/// starts producing anyway.
const SETTLE_TIMEOUT_S: u64 = 30;
/// Pause after a failed pull before the next one.
const PULL_ERROR_PAUSE_MS: u64 = 100;
/// Histogram range: 1 µs to 1 hour, 3 significant digits.
const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Bounds of the numeric flags.
/// The producer index has 8 bits of the sequence.
const PRODUCERS_MAX: usize = 256;
const CONSUMERS_MAX: usize = 1024;
const IN_FLIGHT_MAX: usize = 65_536;
const BATCH_MAX: usize = ringmq::client::BATCH_MESSAGES_MAX;
const SEQ_PRODUCER_SHIFT: u32 = 40;
const SEQ_TAG_SHIFT: u32 = 48;
const SEQ_NUMBER_MASK: u64 = (1 << SEQ_PRODUCER_SHIFT) - 1;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "ringmq-bench",
    version,
    about = "Load generator for ringmq: produces and consumes a topic and reports throughput \
             and latency percentiles (HDR histograms)"
)]
struct Cli {
    /// Broker address (host:port). Without it, a broker is started in this process, in a
    /// temporary directory that is removed afterwards.
    #[arg(long)]
    broker: Option<String>,
    /// Topic to use; created with --queues queues if it does not exist.
    #[arg(long, default_value = "bench")]
    topic: String,
    /// Queues of the topic when the bench creates it.
    #[arg(long, default_value_t = 8)]
    queues: u32,
    /// Producer clients (each with its own connections).
    #[arg(long, default_value_t = 2)]
    producers: usize,
    /// Consumer clients; the topic's queues are divided among them (0: produce only).
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Make the consumers push consumers (concurrent mode) of this consumer group, which
    /// the broker divides the queues among, instead of pull loops; their offsets start at
    /// the queues' current ends and are committed to the broker.
    #[arg(long, value_name = "NAME")]
    group: Option<String>,
    /// With --group: messages per listener call [default: 1, as RocketMQ].
    #[arg(long, value_name = "N", requires = "group")]
    consume_batch: Option<usize>,
    /// With --group: listener calls running at once, per consumer [default: 20].
    #[arg(long, value_name = "N", requires = "group")]
    consume_threads: Option<usize>,
    /// With --group: pulls of one queue in flight at once while a consumer is behind
    /// [default: 8; 1 pulls one batch at a time, as RocketMQ].
    #[arg(long, value_name = "N", requires = "group")]
    pulls_in_flight: Option<usize>,
    /// With --group: run the listener on the consumer's own tokio tasks instead of the
    /// blocking pool (the bench's listener never blocks; this is the setting for cheap,
    /// non-blocking listeners).
    #[arg(long, requires = "group")]
    non_blocking_listener: bool,
    /// With --group: start the push consumers only once producing is over, and report how
    /// fast they drain the backlog (consume msg/s counts from their start; end-to-end
    /// latency then includes the wait in the backlog).
    #[arg(long, requires = "group")]
    consume_after_produce: bool,
    /// Send with sharding keys `k0`..`k{N-1}` (in turn) instead of round-robin: each key's
    /// messages go to one queue. Only with --batch 1.
    #[arg(long, value_name = "N")]
    keys: Option<u64>,
    /// Message body size in bytes (at least 16: send time and sequence).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Messages per send: 1 sends one by one, N > 1 sends batches of N to one queue.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Messages to send in total (instead of --duration).
    #[arg(long, conflicts_with = "duration")]
    messages: Option<u64>,
    /// Seconds to produce for [default: 10, unless --messages is given].
    #[arg(long)]
    duration: Option<u64>,
    /// Target rate in messages per second over all producers, open loop (latency counts
    /// from each send's scheduled time); 0: as fast as --in-flight allows.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Sends (or batches) outstanding per producer; in --rate mode a full window delays
    /// sends, and the delay counts as latency.
    #[arg(long, default_value_t = 128)]
    in_flight: usize,
    /// Flush mode of the embedded broker: async (ack after the write) or sync (ack after
    /// fdatasync, group commit).
    #[arg(long, default_value = "async")]
    flush: FlushMode,
    /// Shards of the embedded broker [default: one per core].
    #[arg(long)]
    shards: Option<usize>,
    /// Data directory of the embedded broker [default: a new temporary directory]. It must
    /// be new or made by an earlier run with the same --shards.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Messages per pull.
    #[arg(long, default_value_t = 32)]
    pull_batch: u32,
    /// Route requests straight to the shard that owns each queue (false: everything goes
    /// through one connection and the broker forwards).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    shard_aware: bool,
    /// Timeout of each request of the clients, in milliseconds (queueing in the client
    /// counts: with large batches and a deep --in-flight window, raise it or lower the
    /// window).
    #[arg(long, default_value_t = ringmq::client::REQUEST_TIMEOUT_MS_DEFAULT)]
    request_timeout_ms: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl Cli {
    fn check(&self) -> Result<(), String> {
        let range = |name: &str, value: usize, min: usize, max: usize| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(format!("--{name} {value}: must be in {min}..={max}"))
            }
        };
        range("producers", self.producers, 1, PRODUCERS_MAX)?;
        range("consumers", self.consumers, 0, CONSUMERS_MAX)?;
        range("batch", self.batch, 1, BATCH_MAX)?;
        range("in-flight", self.in_flight, 1, IN_FLIGHT_MAX)?;
        range(
            "size",
            self.size,
            BODY_HEADER_BYTES,
            ringmq::protocol::record::BODY_BYTES_MAX,
        )?;
        if self.queues == 0 {
            return Err("--queues must be at least 1".into());
        }
        if self.pull_batch == 0 {
            return Err("--pull-batch must be at least 1".into());
        }
        if self.group.is_some() && self.consumers == 0 {
            return Err("--group needs --consumers 1 or more".into());
        }
        if self.group.is_some() && self.pull_batch > ringmq::client::PULL_BATCH_MAX_LIMIT {
            return Err(format!(
                "--pull-batch {}: push consumers pull at most {} messages at once",
                self.pull_batch,
                ringmq::client::PULL_BATCH_MAX_LIMIT
            ));
        }
        if let Some(n) = self.consume_batch {
            range(
                "consume-batch",
                n,
                1,
                ringmq::client::CONSUME_BATCH_MAX_LIMIT,
            )?;
        }
        if let Some(n) = self.consume_threads {
            range("consume-threads", n, 1, ringmq::client::CONSUME_THREADS_MAX)?;
        }
        if let Some(n) = self.pulls_in_flight {
            range(
                "pulls-in-flight",
                n,
                1,
                ringmq::client::PULLS_IN_FLIGHT_MAX_LIMIT,
            )?;
        }
        if self.keys == Some(0) {
            return Err("--keys must be at least 1".into());
        }
        if self.keys.is_some() && self.batch > 1 {
            return Err("--keys goes with --batch 1 only".into());
        }
        if self.messages == Some(0) || self.duration == Some(0) {
            return Err("--messages and --duration must be at least 1".into());
        }
        if self.broker.is_some() && (self.shards.is_some() || self.data_dir.is_some()) {
            return Err(
                "--shards and --data-dir configure the embedded broker; they do not \
                        go with --broker"
                    .into(),
            );
        }
        Ok(())
    }

    fn duration(&self) -> Option<Duration> {
        match (self.messages, self.duration) {
            (Some(_), _) => None,
            (None, Some(s)) => Some(Duration::from_secs(s)),
            (None, None) => Some(Duration::from_secs(10)),
        }
    }
}

/// Nanoseconds since the UNIX epoch, from a monotonic clock: the wall clock is read once,
/// so a clock step during the run cannot produce negative or huge latencies.
fn epoch_ns(at: Instant) -> u64 {
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    let (base_instant, base_ns) = *BASE.get_or_init(|| {
        let now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        (Instant::now(), now_ns)
    });
    let since = at.saturating_duration_since(base_instant).as_nanos();
    base_ns.saturating_add(u64::try_from(since).unwrap_or(u64::MAX))
}

fn histogram() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, LATENCY_US_MAX, 3) {
        Ok(h) => h,
        // Constant, valid bounds: failing here is a bug in this file.
        Err(e) => unreachable!("histogram bounds: {e}"),
    }
}

fn record_us(h: &mut Histogram<u64>, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    h.saturating_record(us.max(1));
}

/// Counters shared by producers, consumers and the progress line.
#[derive(Default)]
struct Stats {
    /// Messages the broker acknowledged.
    sent: AtomicU64,
    /// Messages whose send failed (after the producer's retries).
    send_errors: AtomicU64,
    /// Distinct messages of this run received.
    received: AtomicU64,
    /// Deliveries of a message already received.
    duplicates: AtomicU64,
    pull_errors: AtomicU64,
    /// When the last message was received, in ns after the start.
    last_received_ns: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Stats {
    fn error(&self, what: &str, e: &ClientError) {
        let mut first = self
            .first_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if first.is_none() {
            *first = Some(format!("{what}: {e}"));
            eprintln!("ringmq-bench: first error: {what}: {e}");
        }
    }
}

struct Run {
    cli: Cli,
    /// Marks this run's messages (top 16 bits of the sequence).
    tag: u16,
    /// Per producer, a bit per message number received.
    seen: Vec<Mutex<Vec<u64>>>,
    queue_count: u32,
    start: Instant,
    stats: Stats,
    stop_consumers: AtomicBool,
}

/// A message body: send time, sequence, then zeros up to `size`.
fn body(size: usize, sent_at_ns: u64, seq: u64) -> Vec<u8> {
    let mut body = vec![0u8; size];
    body[..8].copy_from_slice(&sent_at_ns.to_le_bytes());
    body[8..16].copy_from_slice(&seq.to_le_bytes());
    body
}

fn client_config(cli: &Cli, broker: &str) -> ClientConfig {
    let mut config = ClientConfig::new(broker);
    config.shard_aware = cli.shard_aware;
    config.in_flight_max = config.in_flight_max.max(cli.in_flight);
    config.request_timeout_ms = cli.request_timeout_ms;
    config
}

/// One producer's sending state: its sends in flight (bounded by the window), its
/// send-latency histogram, and the numbering of its messages.
struct Sender {
    run: Arc<Run>,
    producer: Producer,
    window: Arc<Semaphore>,
    latencies: Arc<Mutex<Histogram<u64>>>,
    first_seq: u64,
    quota: Option<u64>,
    /// Messages handed to sends so far.
    scheduled_messages: u64,
}

impl Sender {
    fn new(run: Arc<Run>, producer: Producer, index: usize, quota: Option<u64>) -> Sender {
        let first_seq =
            (u64::from(run.tag) << SEQ_TAG_SHIFT) | ((index as u64) << SEQ_PRODUCER_SHIFT);
        Sender {
            window: Arc::new(Semaphore::new(run.cli.in_flight)),
            latencies: Arc::new(Mutex::new(histogram())),
            run,
            producer,
            first_seq,
            quota,
            scheduled_messages: 0,
        }
    }

    /// Messages the next send carries; 0 when the quota is spent.
    fn next_count(&self) -> usize {
        let batch = self.run.cli.batch;
        match self.quota {
            Some(q) => batch
                .min(usize::try_from(q.saturating_sub(self.scheduled_messages)).unwrap_or(batch)),
            None => batch,
        }
    }

    /// Starts one send of `count` messages stamped with `scheduled`, holding `permit`
    /// until it is answered; its latency counts from `scheduled`.
    fn launch(
        &mut self,
        handle: &tokio::runtime::Handle,
        scheduled: Instant,
        count: usize,
        permit: OwnedSemaphorePermit,
    ) {
        let cli = &self.run.cli;
        let sent_at_ns = epoch_ns(scheduled);
        let mut messages: Vec<OutgoingMessage> = (0..count)
            .map(|i| {
                let n = self.scheduled_messages + i as u64;
                let number = n & SEQ_NUMBER_MASK;
                let message =
                    OutgoingMessage::new(body(cli.size, sent_at_ns, self.first_seq | number));
                match cli.keys {
                    Some(keys) => message.with_sharding_key(format!("k{}", n % keys)),
                    None => message,
                }
            })
            .collect();
        self.scheduled_messages += count as u64;
        let (producer, run, latencies) = (
            self.producer.clone(),
            self.run.clone(),
            self.latencies.clone(),
        );
        handle.spawn(async move {
            let topic = run.cli.topic.as_str();
            let outcome = if run.cli.batch == 1 {
                match messages.pop() {
                    Some(message) => producer.send(topic, message).await.map(|_| ()),
                    None => Ok(()),
                }
            } else {
                producer.send_batch(topic, messages).await.map(|_| ())
            };
            match outcome {
                Ok(()) => {
                    record_us(
                        &mut latencies.lock().unwrap_or_else(PoisonError::into_inner),
                        scheduled.elapsed(),
                    );
                    run.stats.sent.fetch_add(count as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    run.stats
                        .send_errors
                        .fetch_add(count as u64, Ordering::Relaxed);
                    run.stats.error("send", &e);
                }
            }
            drop(permit);
        });
    }

    /// Waits for every send in flight (each holds a permit) and returns the histogram.
    async fn finish(self) -> Histogram<u64> {
        let permits = u32::try_from(self.run.cli.in_flight).unwrap_or(u32::MAX);
        let _all = self.window.acquire_many(permits).await;
        let h = self
            .latencies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        h
    }
}

/// Closed loop: a send starts as soon as the window has room; its latency counts from
/// then (waiting for room is the loop's own pacing, not the broker's delay).
async fn produce_closed(mut sender: Sender) -> Histogram<u64> {
    let handle = tokio::runtime::Handle::current();
    let deadline = sender.run.cli.duration().map(|d| sender.run.start + d);
    loop {
        let count = sender.next_count();
        if count == 0 {
            break;
        }
        let Ok(permit) = sender.window.clone().acquire_owned().await else {
            break;
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break;
        }
        sender.launch(&handle, now, count, permit);
    }
    sender.finish().await
}

/// Open loop, on its own thread: send `n` is due at `start + n * interval`, whatever
/// happened to earlier sends, and its latency counts from that time (waiting for window
/// room included). The thread sleeps with the OS timer (tens of microseconds of slack)
/// rather than tokio's 1 ms timer wheel, whose rounding would otherwise show up as latency.
fn produce_open(mut sender: Sender, handle: tokio::runtime::Handle, interval: Duration) -> Sender {
    let deadline = sender.run.cli.duration().map(|d| sender.run.start + d);
    let mut sends: u32 = 0;
    loop {
        let count = sender.next_count();
        if count == 0 {
            break;
        }
        let due = sender.run.start + interval.saturating_mul(sends);
        if let Some(deadline) = deadline {
            if due >= deadline {
                break;
            }
            // Behind schedule at the end: stop on time rather than issue the backlog.
            if Instant::now() >= deadline {
                let due_total = deadline.duration_since(sender.run.start).as_secs_f64()
                    / interval.as_secs_f64();
                eprintln!(
                    "ringmq-bench: a producer started {sends} of the {due_total:.0} sends due: \
                     the target rate is above what was sustained"
                );
                break;
            }
        }
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        let permit = match sender.window.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => match handle.block_on(sender.window.clone().acquire_owned()) {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        sender.launch(&handle, due, count, permit);
        sends = sends.saturating_add(1);
    }
    sender
}

/// One producer, closed or open loop; returns its send-latency histogram.
async fn produce(
    run: Arc<Run>,
    producer: Producer,
    index: usize,
    quota: Option<u64>,
) -> Histogram<u64> {
    let cli = &run.cli;
    let sender = Sender::new(run.clone(), producer, index, quota);
    if cli.rate == 0 {
        return produce_closed(sender).await;
    }
    // One send (of `batch` messages) per interval, per producer.
    let interval =
        Duration::from_secs_f64(cli.batch as f64 * cli.producers as f64 / cli.rate as f64);
    let handle = tokio::runtime::Handle::current();
    match tokio::task::spawn_blocking(move || produce_open(sender, handle, interval)).await {
        Ok(sender) => sender.finish().await,
        Err(e) => {
            eprintln!("ringmq-bench: producer {index} scheduler: {e}");
            histogram()
        }
    }
}

/// Pulls one queue from `offset` until told to stop; returns its end-to-end histogram.
async fn consume_queue(
    run: Arc<Run>,
    client: Client,
    queue_id: u32,
    mut offset: u64,
) -> Histogram<u64> {
    let mut latencies = histogram();
    let wait = Duration::from_millis(PULL_WAIT_MS);
    while !run.stop_consumers.load(Ordering::Relaxed) {
        let pulled = client
            .pull(
                &run.cli.topic,
                queue_id,
                offset,
                run.cli.pull_batch,
                wait,
                &[],
            )
            .await;
        let result = match pulled {
            Ok(result) => result,
            Err(e) => {
                run.stats.pull_errors.fetch_add(1, Ordering::Relaxed);
                run.stats.error("pull", &e);
                sleep(Duration::from_millis(PULL_ERROR_PAUSE_MS)).await;
                continue;
            }
        };
        let now = Instant::now();
        let (counted, duplicates) =
            count_new(&run, &result.messages, epoch_ns(now), &mut latencies);
        note_received(&run, counted, duplicates, now);
        match result.status {
            PullStatus::Found
            | PullStatus::NoMatchedMessage
            | PullStatus::OffsetTooSmall
            | PullStatus::OffsetTooBig => offset = result.next_offset,
            PullStatus::NoNewMessage => {}
        }
    }
    latencies
}

/// Adds what [`count_new`] found, seen at `now`, to the run's counters.
fn note_received(run: &Run, counted: u64, duplicates: u64, now: Instant) {
    if duplicates > 0 {
        run.stats
            .duplicates
            .fetch_add(duplicates, Ordering::Relaxed);
    }
    if counted > 0 {
        run.stats.received.fetch_add(counted, Ordering::Relaxed);
        let since_start =
            u64::try_from(now.saturating_duration_since(run.start).as_nanos()).unwrap_or(u64::MAX);
        run.stats
            .last_received_ns
            .fetch_max(since_start, Ordering::Relaxed);
    }
}

/// The push consumers of `--group`, each with its end-to-end histogram.
struct PushConsumers {
    consumers: Vec<PushConsumer>,
    latencies: Vec<Arc<Mutex<Histogram<u64>>>>,
}

/// Sets `group`'s offsets to `start_offsets` (the queues' ends: messages of earlier runs
/// are skipped, as the pull loops do), then starts `--consumers` push consumers of the
/// group and waits until they share the queues. Their listeners count into the run once
/// `run` is set (nothing is sent before).
async fn start_push_consumers(
    cli: &Cli,
    config: &ClientConfig,
    admin: &Client,
    group: &str,
    start_offsets: &[u64],
    run: Arc<OnceLock<Arc<Run>>>,
) -> Result<PushConsumers, String> {
    for (queue, offset) in start_offsets.iter().enumerate() {
        admin
            .commit_offset(group, &cli.topic, queue as u32, *offset)
            .await
            .map_err(|e| format!("setting group {group}'s offset of queue {queue}: {e}"))?;
    }
    let defaults = PushConsumerOptions::default();
    let options = PushConsumerOptions {
        consume_from: ConsumeFrom::LastOffset,
        pull_batch_max: cli.pull_batch,
        consume_batch_max: cli.consume_batch.unwrap_or(defaults.consume_batch_max),
        consume_threads: cli.consume_threads.unwrap_or(defaults.consume_threads),
        listener_non_blocking: cli.non_blocking_listener,
        pulls_in_flight_max: cli.pulls_in_flight.unwrap_or(defaults.pulls_in_flight_max),
        ..defaults
    };
    let mut push = PushConsumers {
        consumers: Vec::with_capacity(cli.consumers),
        latencies: Vec::with_capacity(cli.consumers),
    };
    for c in 0..cli.consumers {
        let fail = |e: ClientError| format!("push consumer {c} of group {group}: {e}");
        // One member each: the broker tells members apart by client id.
        let config = ClientConfig {
            client_id: format!("{}-consumer-{c}", config.client_id),
            ..config.clone()
        };
        let consumer = PushConsumer::new(config, group, options.clone()).map_err(fail)?;
        consumer.subscribe(&cli.topic, "*").map_err(fail)?;
        let latencies = Arc::new(Mutex::new(histogram()));
        let (histogram, run) = (latencies.clone(), run.clone());
        consumer
            .register_concurrent(move |messages| {
                // After the drain, what arrives is not measured: it is the re-delivery of
                // queues handed over while the members leave one by one.
                if let Some(run) = run
                    .get()
                    .filter(|run| !run.stop_consumers.load(Ordering::Relaxed))
                {
                    let now = Instant::now();
                    let (counted, duplicates) = count_new(
                        run,
                        messages,
                        epoch_ns(now),
                        &mut histogram.lock().unwrap_or_else(PoisonError::into_inner),
                    );
                    note_received(run, counted, duplicates, now);
                }
                ConsumeStatus::Success
            })
            .map_err(fail)?;
        consumer.start().await.map_err(fail)?;
        push.consumers.push(consumer);
        push.latencies.push(latencies);
    }
    // Settled: the broker counts every consumer as a member, and each consumes exactly the
    // queues the broker assigns it (a consumer that has not applied its first assignment
    // yet consumes nothing, which is not the same as being assigned nothing).
    let deadline = Instant::now() + Duration::from_secs(SETTLE_TIMEOUT_S);
    loop {
        let members = admin
            .group_members(group)
            .await
            .map_err(|e| format!("members of group {group}: {e}"))?;
        let assigned: std::collections::BTreeMap<&str, Vec<u32>> = members
            .members
            .iter()
            .map(|m| {
                let queues = m
                    .topics
                    .iter()
                    .filter(|t| t.topic == cli.topic)
                    .flat_map(|t| t.queues.iter().copied())
                    .collect();
                (m.client_id.as_str(), queues)
            })
            .collect();
        let settled = assigned.len() == push.consumers.len()
            && push.consumers.iter().all(|c| {
                let id = c.client().map(|c| c.config().client_id.clone());
                let consuming: Vec<u32> = c.consuming_queues().iter().map(|q| q.queue_id).collect();
                id.and_then(|id| assigned.get(id.as_str()).cloned()) == Some(consuming)
            });
        if settled {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "ringmq-bench: the push consumers did not settle within {SETTLE_TIMEOUT_S} s; \
                 starting anyway"
            );
            break;
        }
        sleep(Duration::from_millis(20)).await;
    }
    Ok(push)
}

/// Counts the messages of this run seen for the first time, recording their end-to-end
/// latency; returns (new, duplicates). Messages of other runs are ignored.
fn count_new(
    run: &Run,
    messages: &[ringmq::client::Message],
    now_ns: u64,
    latencies: &mut Histogram<u64>,
) -> (u64, u64) {
    let (mut counted, mut duplicates) = (0, 0);
    for message in messages {
        let body = message.body();
        if body.len() < BODY_HEADER_BYTES {
            continue;
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&body[..8]);
        let sent_at_ns = u64::from_le_bytes(word);
        word.copy_from_slice(&body[8..16]);
        let seq = u64::from_le_bytes(word);
        let producer = ((seq >> SEQ_PRODUCER_SHIFT) & 0xFF) as usize;
        if (seq >> SEQ_TAG_SHIFT) as u16 != run.tag || producer >= run.seen.len() {
            continue;
        }
        let number = seq & SEQ_NUMBER_MASK;
        // Our own producers wrote the number, so the bitmap grows only as far as they sent.
        let (word_at, bit) = ((number / 64) as usize, 1u64 << (number % 64));
        let mut seen = run.seen[producer]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if seen.len() <= word_at {
            seen.resize(word_at + 1, 0);
        }
        if seen[word_at] & bit != 0 {
            duplicates += 1;
            continue;
        }
        seen[word_at] |= bit;
        drop(seen);
        record_us(
            latencies,
            Duration::from_nanos(now_ns.saturating_sub(sent_at_ns)),
        );
        counted += 1;
    }
    (counted, duplicates)
}

/// Prints a progress line to stderr every second until `done` is set.
async fn progress(run: Arc<Run>, done: Arc<AtomicBool>) {
    let mut last = (0u64, 0u64);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    while !done.load(Ordering::Relaxed) {
        tick.tick().await;
        let sent = run.stats.sent.load(Ordering::Relaxed);
        let received = run.stats.received.load(Ordering::Relaxed);
        let errors = run.stats.send_errors.load(Ordering::Relaxed)
            + run.stats.pull_errors.load(Ordering::Relaxed);
        eprintln!(
            "[{:>4.0}s] sent {sent} ({} msg/s, {:.1} MB/s)  received {received} ({} msg/s)  errors {errors}",
            run.start.elapsed().as_secs_f64(),
            sent - last.0,
            ((sent - last.0) as f64 * run.cli.size as f64) / 1e6,
            received.saturating_sub(last.1),
        );
        last = (sent, received);
    }
}

struct Report {
    sent: u64,
    received: u64,
    duplicates: u64,
    send_errors: u64,
    pull_errors: u64,
    produce_s: f64,
    consume_s: f64,
    send_latency: Histogram<u64>,
    e2e_latency: Histogram<u64>,
    queue_count: u32,
    first_error: Option<String>,
}

async fn run(cli: Cli, broker: String) -> Result<Report, String> {
    let admin = Client::connect(client_config(&cli, &broker))
        .await
        .map_err(|e| format!("connect to {broker}: {e}"))?;
    match admin.create_topic(&cli.topic, cli.queues).await {
        Ok(()) => {}
        Err(e) if e.code() == Some(ErrorCode::TopicExists) => {}
        Err(e) => return Err(format!("create topic {}: {e}", cli.topic)),
    }
    let info = admin
        .describe_topic(&cli.topic)
        .await
        .map_err(|e| format!("describe topic {}: {e}", cli.topic))?;
    let queue_count = info.queues.len() as u32;
    if queue_count != cli.queues {
        eprintln!(
            "ringmq-bench: topic {} already exists with {queue_count} queues; using them",
            cli.topic
        );
    }
    // Consumers start at the current end, so messages of earlier runs are not counted.
    let start_offsets: Vec<u64> = info.queues.iter().map(|q| q.max_offset).collect();

    // Connect everything before the clock starts: connection set-up is not throughput.
    let config = client_config(&cli, &broker);
    let mut producers = Vec::with_capacity(cli.producers);
    for p in 0..cli.producers {
        let producer = Producer::connect_with(config.clone(), ProducerOptions::default())
            .await
            .map_err(|e| format!("producer {p}: {e}"))?;
        producers.push(producer);
    }
    let mut consumers = Vec::with_capacity(cli.consumers);
    let run_cell: Arc<OnceLock<Arc<Run>>> = Arc::default();
    let start_push = |group: &str| {
        let group = group.to_owned();
        let (cli, config, admin) = (&cli, &config, &admin);
        let (start_offsets, run_cell) = (&start_offsets, run_cell.clone());
        async move { start_push_consumers(cli, config, admin, &group, start_offsets, run_cell).await }
    };
    let mut push = None;
    match &cli.group {
        Some(group) if !cli.consume_after_produce => push = Some(start_push(group).await?),
        Some(_) => {}
        None => {
            for c in 0..cli.consumers {
                let client = Client::connect(config.clone())
                    .await
                    .map_err(|e| format!("consumer {c}: {e}"))?;
                consumers.push(client);
            }
        }
    }

    let run = Arc::new(Run {
        cli: cli.clone(),
        tag: rand::random::<u16>(),
        seen: (0..cli.producers).map(|_| Mutex::new(Vec::new())).collect(),
        queue_count,
        start: Instant::now(),
        stats: Stats::default(),
        stop_consumers: AtomicBool::new(false),
    });
    if run_cell.set(run.clone()).is_err() {
        unreachable!("the run is set once");
    }
    let done = Arc::new(AtomicBool::new(false));
    let progress = tokio::spawn(progress(run.clone(), done.clone()));

    let mut pullers: Vec<JoinHandle<Histogram<u64>>> = Vec::new();
    for (c, client) in consumers.into_iter().enumerate() {
        for (queue, offset) in start_offsets.iter().enumerate() {
            if queue % cli.consumers == c {
                let queue_id = queue as u32;
                let puller = consume_queue(run.clone(), client.clone(), queue_id, *offset);
                pullers.push(tokio::spawn(puller));
            }
        }
    }

    let mut producing = Vec::with_capacity(cli.producers);
    for (p, producer) in producers.into_iter().enumerate() {
        let quota = cli.messages.map(|n| {
            let per = n / cli.producers as u64;
            per + u64::from((p as u64) < n % cli.producers as u64)
        });
        producing.push(tokio::spawn(produce(run.clone(), producer, p, quota)));
    }
    let mut send_latency = histogram();
    for (p, producer) in producing.into_iter().enumerate() {
        let h = producer
            .await
            .map_err(|e| format!("producer {p} task: {e}"))?;
        send_latency
            .add(&h)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    let produce_s = run.start.elapsed().as_secs_f64();
    let sent = run.stats.sent.load(Ordering::Relaxed);
    // Consumers that start now drain what was produced; their rate counts from here.
    let mut consume_from_s = 0.0;
    if let (Some(group), true) = (&cli.group, cli.consume_after_produce) {
        consume_from_s = run.start.elapsed().as_secs_f64();
        push = Some(start_push(group).await?);
    }

    if cli.consumers > 0 {
        let drain_deadline = Instant::now() + Duration::from_secs(DRAIN_TIMEOUT_S);
        while run.stats.received.load(Ordering::Relaxed) < sent && Instant::now() < drain_deadline {
            sleep(Duration::from_millis(10)).await;
        }
    }
    run.stop_consumers.store(true, Ordering::Relaxed);
    let mut e2e_latency = histogram();
    for puller in pullers {
        let h = puller.await.map_err(|e| format!("consumer task: {e}"))?;
        e2e_latency
            .add(&h)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    if let Some(push) = push {
        // All at once: each leaves the group cleanly (commits, unregisters).
        let mut leaving = Vec::with_capacity(push.consumers.len());
        for consumer in push.consumers {
            run.stats
                .pull_errors
                .fetch_add(consumer.stats().pull_errors, Ordering::Relaxed);
            leaving.push(tokio::spawn(async move { consumer.shutdown().await }));
        }
        for (c, left) in leaving.into_iter().enumerate() {
            match left.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    eprintln!("ringmq-bench: push consumer {c} shut down with an error: {e}")
                }
                Err(e) => eprintln!("ringmq-bench: push consumer {c} shutdown task: {e}"),
            }
        }
        for h in &push.latencies {
            e2e_latency
                .add(&*h.lock().unwrap_or_else(PoisonError::into_inner))
                .map_err(|e| format!("merging histograms: {e}"))?;
        }
    }
    done.store(true, Ordering::Relaxed);
    progress.abort();

    let stats = &run.stats;
    let first_error = stats
        .first_error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Ok(Report {
        sent,
        received: stats.received.load(Ordering::Relaxed),
        duplicates: stats.duplicates.load(Ordering::Relaxed),
        send_errors: stats.send_errors.load(Ordering::Relaxed),
        pull_errors: stats.pull_errors.load(Ordering::Relaxed),
        produce_s,
        consume_s: (stats.last_received_ns.load(Ordering::Relaxed) as f64 / 1e9 - consume_from_s)
            .max(0.0),
        send_latency,
        e2e_latency,
        queue_count: run.queue_count,
        first_error,
    })
}

fn percentiles(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "p50": h.value_at_quantile(0.50),
        "p90": h.value_at_quantile(0.90),
        "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999),
        "p9999": h.value_at_quantile(0.9999),
        "max": h.max(),
        "samples": h.len(),
    })
}

fn per_sec(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

fn to_json(cli: &Cli, broker: &str, embedded: bool, r: &Report) -> serde_json::Value {
    let mb = |n: u64, s: f64| per_sec(n, s) * cli.size as f64 / 1e6;
    serde_json::json!({
        "messages_sent": r.sent,
        "messages_received": r.received,
        "messages_missing": if cli.consumers > 0 { r.sent.saturating_sub(r.received) } else { 0 },
        "messages_duplicated": r.duplicates,
        "send_errors": r.send_errors,
        "pull_errors": r.pull_errors,
        "first_error": r.first_error,
        "produce": {
            "msgs_per_sec": per_sec(r.sent, r.produce_s),
            "mb_per_sec": mb(r.sent, r.produce_s),
            "seconds": r.produce_s,
        },
        "consume": {
            "msgs_per_sec": per_sec(r.received, r.consume_s),
            "mb_per_sec": mb(r.received, r.consume_s),
            "seconds": r.consume_s,
        },
        "send_latency_us": percentiles(&r.send_latency),
        "e2e_latency_us": percentiles(&r.e2e_latency),
        "config": {
            "broker": broker,
            "embedded_broker": embedded,
            "topic": cli.topic,
            "queues": r.queue_count,
            "producers": cli.producers,
            "consumers": cli.consumers,
            "group": cli.group,
            "consume_batch": cli.consume_batch,
            "consume_threads": cli.consume_threads,
            "pulls_in_flight": cli.pulls_in_flight,
            "non_blocking_listener": cli.non_blocking_listener,
            "consume_after_produce": cli.consume_after_produce,
            "keys": cli.keys,
            "size": cli.size,
            "batch": cli.batch,
            "messages": cli.messages,
            "duration_s": cli.duration().map(|d| d.as_secs()),
            "rate": cli.rate,
            "in_flight": cli.in_flight,
            "flush": if embedded { Some(format!("{:?}", cli.flush).to_lowercase()) } else { None },
            "shards": cli.shards,
            "pull_batch": cli.pull_batch,
            "shard_aware": cli.shard_aware,
            "request_timeout_ms": cli.request_timeout_ms,
            "mb": "10^6 bytes of message bodies",
        },
    })
}

fn print_report(cli: &Cli, r: &Report) {
    let mb = |n: u64, s: f64| per_sec(n, s) * cli.size as f64 / 1e6;
    println!(
        "produce: {} messages in {:.2} s: {:.0} msg/s, {:.1} MB/s ({} failed)",
        r.sent,
        r.produce_s,
        per_sec(r.sent, r.produce_s),
        mb(r.sent, r.produce_s),
        r.send_errors
    );
    if cli.consumers > 0 {
        println!(
            "consume: {} messages in {:.2} s: {:.0} msg/s, {:.1} MB/s ({} missing, {} duplicates)",
            r.received,
            r.consume_s,
            per_sec(r.received, r.consume_s),
            mb(r.received, r.consume_s),
            r.sent.saturating_sub(r.received),
            r.duplicates
        );
    }
    let line = |name: &str, h: &Histogram<u64>| {
        println!(
            "{name:<22} p50 {:>8}  p90 {:>8}  p99 {:>8}  p99.9 {:>8}  p99.99 {:>8}  max {:>8}",
            h.value_at_quantile(0.50),
            h.value_at_quantile(0.90),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.value_at_quantile(0.9999),
            h.max()
        );
    };
    let unit = if cli.batch > 1 { " (per batch)" } else { "" };
    line(&format!("send latency us{unit}"), &r.send_latency);
    if cli.consumers > 0 {
        line("end-to-end latency us", &r.e2e_latency);
    }
}

/// A broker started in this process, and the directory it owns.
struct Embedded {
    broker: ringmq::shard::Broker,
    /// Removed at the end when the bench created it.
    temp_dir: Option<PathBuf>,
}

fn start_embedded(cli: &Cli) -> Result<Embedded, String> {
    let (data_dir, temp_dir) = match &cli.data_dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let nanos = epoch_ns(Instant::now());
            let dir =
                std::env::temp_dir().join(format!("ringmq-bench-{}-{nanos}", std::process::id()));
            (dir.clone(), Some(dir))
        }
    };
    let config = ringmq::shard::BrokerConfig {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: data_dir.clone(),
        shards: cli.shards.unwrap_or(0),
        flush: cli.flush,
        auto_create_topics: true,
        ..Default::default()
    };
    match ringmq::shard::Broker::start(config) {
        Ok(broker) => Ok(Embedded { broker, temp_dir }),
        Err(e) => {
            if let Some(dir) = &temp_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            Err(format!("embedded broker in {}: {e}", data_dir.display()))
        }
    }
}

fn stop_embedded(embedded: Embedded) {
    if let Err(e) = embedded.broker.shutdown() {
        eprintln!("ringmq-bench: embedded broker stopped with an error: {e}");
    }
    if let Some(dir) = embedded.temp_dir {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            eprintln!("ringmq-bench: removing {}: {e}", dir.display());
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.check() {
        eprintln!("ringmq-bench: {e}");
        return ExitCode::from(2);
    }
    let (embedded, broker) = match &cli.broker {
        Some(addr) => (None, addr.clone()),
        None => match start_embedded(&cli) {
            Ok(embedded) => {
                let addr = embedded.broker.addr().to_string();
                (Some(embedded), addr)
            }
            Err(e) => {
                eprintln!("ringmq-bench: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    eprintln!(
        "ringmq-bench: {} on {broker}{}: {} producers, {} consumers{}, {} B messages, batch {}, {}",
        cli.topic,
        if embedded.is_some() {
            " (embedded)"
        } else {
            ""
        },
        cli.producers,
        cli.consumers,
        match &cli.group {
            Some(group) => format!(" (push, group {group})"),
            None => String::new(),
        },
        cli.size,
        cli.batch,
        match (cli.messages, cli.duration(), cli.rate) {
            (Some(n), _, 0) => format!("{n} messages, closed loop"),
            (Some(n), _, r) => format!("{n} messages at {r} msg/s"),
            (None, Some(d), 0) => format!("{} s, closed loop", d.as_secs()),
            (None, Some(d), r) => format!("{} s at {r} msg/s", d.as_secs()),
            (None, None, _) => String::new(),
        }
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringmq-bench: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(cli.clone(), broker.clone()));
    // Close the client connections before the broker stops.
    drop(runtime);
    let code = match outcome {
        Ok(report) => {
            print_report(&cli, &report);
            let mut code = ExitCode::SUCCESS;
            if let Some(path) = &cli.json {
                let json = to_json(&cli, &broker, embedded.is_some(), &report);
                let text = serde_json::to_string_pretty(&json).unwrap_or_default();
                if let Err(e) = std::fs::write(path, text + "\n") {
                    eprintln!("ringmq-bench: writing {}: {e}", path.display());
                    code = ExitCode::FAILURE;
                }
            }
            if report.sent == 0 || (cli.consumers > 0 && report.received < report.sent) {
                code = ExitCode::FAILURE;
            }
            code
        }
        Err(e) => {
            eprintln!("ringmq-bench: {e}");
            ExitCode::FAILURE
        }
    };
    if let Some(embedded) = embedded {
        stop_embedded(embedded);
    }
    code
}
