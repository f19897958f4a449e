#![recursion_limit = "256"]
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
//! omission); one thread schedules every producer's sends. Without it, each producer keeps
//! `--in-flight` sends outstanding.
//!
//! Consumers are pull loops over their share of the queues by default. With `--group`,
//! they are push consumers (concurrent mode) of that consumer group instead: the broker
//! divides the queues among them, the listener sees the message (end-to-end latency is
//! taken there), and offsets are committed to the broker. The group's offsets are first
//! set to the queues' current ends, so that, like the pull loops, they start there; a
//! group with members running, or one that would skip messages so, is refused (a group
//! an application consumes must not be moved by a bench).
//!
//! `--keys N` sends with sharding keys (`k0`..`k{N-1}`, in turn), so each key's messages go
//! to one queue, in order.
//!
//! Files: `main.rs` (this one: the command line and its checks, the run's shared state, the
//! orchestration of a run, `main`), `producer.rs` (closed and open loop), `consumer.rs`
//! (pull loops, push consumers of `--group`, counting what arrives), `report.rs`
//! (histograms, the progress line, the text and JSON report), `embedded.rs` (the broker
//! started in this process when `--broker` is not given).

mod consumer;
mod embedded;
mod producer;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

use ringmq::client::{Client, ClientConfig, ClientError, Producer, ProducerOptions};
use ringmq::log::FlushMode;

/// The bench's tokio threads free memory other threads allocated (bodies, frames); with
/// glibc's arenas that took a lock and often a futex wait per message.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use ringmq::protocol::sql::SqlFilter;
use ringmq::protocol::ErrorCode;

use crate::consumer::{
    check_group_is_the_benchs, consume_queue, leave_group, start_push_consumers, Started,
};
use crate::embedded::{start_embedded, stop_embedded};
use crate::producer::produce_all;
use crate::report::{banner, print_report, progress, to_json, Latencies, Report};

/// Bytes at the start of every body: send time (u64 LE) and sequence (u64 LE).
const BODY_HEADER_BYTES: usize = 16;
/// Longest the run waits, after the producers are done, for consumers to catch up.
const DRAIN_TIMEOUT_S: u64 = 30;
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
    /// the queues' current ends and are committed to the broker. A group of the bench's
    /// own: one with members running is refused, and so is one whose committed offsets
    /// are below the queues' ends (its messages there would be skipped) unless
    /// --skip-group-backlog; one with no committed offset on the topic counts as new.
    /// A run ended by SIGINT or SIGTERM has its consumers leave the group, committing
    /// what they consumed.
    #[arg(long, value_name = "NAME")]
    group: Option<String>,
    /// With --group: move the group's committed offsets up to the queues' ends even where
    /// they are lower, skipping the messages between for the group (for a group that only
    /// the bench consumes, left behind by an earlier run).
    #[arg(long, requires = "group")]
    skip_group_backlog: bool,
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
    /// With --group: run the listener on the consumer's own tokio tasks instead of its
    /// consume threads (the bench's listener never blocks; this is the setting for cheap,
    /// non-blocking listeners).
    #[arg(long, requires = "group")]
    non_blocking_listener: bool,
    /// Worker threads of the bench's tokio runtime (its producers, consumers and their
    /// connections) [default: one per core]. With the broker on the same cores, fewer
    /// threads mean fewer cross-thread wake-ups.
    #[arg(long, value_name = "N")]
    client_threads: Option<usize>,
    /// With --group: start the push consumers only once producing is over, and report how
    /// fast they drain the backlog (consume msg/s counts from their start; end-to-end
    /// latency then includes the wait in the backlog).
    #[arg(long, requires = "group")]
    consume_after_produce: bool,
    /// Producers pack single sends of a topic made while a send to the same broker shard
    /// is in flight into one request (SendMulti, each message to its own queue;
    /// ProducerOptions::coalesce); each send keeps its own result.
    #[arg(long)]
    coalesce: bool,
    /// Consumers keep only messages matching this SQL92 filter, evaluated by the broker.
    /// Every message then carries the property `n100`, its number modulo 100: `n100 < 10`
    /// keeps 10% of them. Consume figures count the matching messages.
    #[arg(long, value_name = "EXPR")]
    sql: Option<String>,
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
    /// Seconds to send before the measured run (at --rate, or closed loop), added to
    /// --duration: the latencies of messages due in the warm-up are left out of the
    /// histograms (those messages are still received and checked, and the rates count
    /// them). Keeps the load generator's own start (threads, connections' first
    /// requests, first allocations) out of the tails. Not with --messages.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "SECS",
        conflicts_with = "messages"
    )]
    warmup: u64,
    /// Target rate in messages per second over all producers, open loop (latency counts
    /// from each send's scheduled time); 0: as fast as --in-flight allows.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Send scheduled messages, delivered MS after they are stored (batch 1 only); the
    /// report adds `delivery_lateness_us`: consumed time minus due time.
    #[arg(long, value_name = "MS")]
    delay_ms: Option<u64>,
    /// Sends (or batches) outstanding per producer; in --rate mode a full window delays
    /// sends (one thread schedules every producer's: the later ones too), and the delay
    /// counts as latency.
    #[arg(long, default_value_t = 128)]
    in_flight: usize,
    /// Flush mode of the embedded broker: async (ack after the write) or sync (ack once
    /// durable: O_DSYNC writes, group commit) [default: async]. Not with --broker: a
    /// running broker's mode is its own.
    #[arg(long)]
    flush: Option<FlushMode>,
    /// Shards of the embedded broker [default: the count --data-dir was made with, else one
    /// per core].
    #[arg(long)]
    shards: Option<usize>,
    /// Data directory of the embedded broker [default: a new temporary directory]. It must
    /// be new or made by an earlier run with the same shard count.
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
        if self.delay_ms.is_some() && self.batch != 1 {
            return Err("--delay-ms sends one message at a time: use --batch 1".into());
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
        if self.client_threads == Some(0) {
            return Err("--client-threads must be at least 1".into());
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
        if self.broker.is_some()
            && (self.shards.is_some() || self.data_dir.is_some() || self.flush.is_some())
        {
            return Err(
                "--shards, --data-dir and --flush configure the embedded broker; they do not \
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

    /// How long producers send in all: the warm-up, then the measured duration.
    fn send_period(&self) -> Option<Duration> {
        self.duration()
            .map(|d| d + Duration::from_secs(self.warmup))
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

/// Counters shared by producers, consumers and the progress line.
#[derive(Default)]
struct Stats {
    /// Messages the broker acknowledged.
    sent: AtomicU64,
    /// Of those, the messages consumers should get (all of them, or those --sql keeps).
    expected: AtomicU64,
    /// Messages whose send failed (after the producer's retries).
    send_errors: AtomicU64,
    /// `BrokerBusy` answers (the broker's flow control), each waited out and sent again:
    /// not failures.
    busy_answers: AtomicU64,
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
    /// The end of the warm-up (`start` + --warmup): latencies count for messages due
    /// from here; `measure_from_ns` is the same instant in epoch nanoseconds.
    measure_from: Instant,
    measure_from_ns: u64,
    stats: Stats,
    stop_consumers: AtomicBool,
    /// The parsed --sql filter.
    sql: Option<SqlFilter>,
}

fn client_config(cli: &Cli, broker: &str) -> ClientConfig {
    let mut config = ClientConfig::new(broker);
    config.shard_aware = cli.shard_aware;
    config.in_flight_max = config.in_flight_max.max(cli.in_flight);
    config.request_timeout_ms = cli.request_timeout_ms;
    config
}

async fn run(cli: Cli, broker: String, started: Started) -> Result<Report, String> {
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
    if let Some(group) = &cli.group {
        // Before anything is sent (also when the group starts after producing).
        check_group_is_the_benchs(&cli, &admin, group, &start_offsets).await?;
    }

    // Connect everything before the clock starts: connection set-up is not throughput.
    let config = client_config(&cli, &broker);
    let mut producers = Vec::with_capacity(cli.producers);
    for p in 0..cli.producers {
        let options = ProducerOptions {
            coalesce: cli.coalesce,
            ..ProducerOptions::default()
        };
        let producer = Producer::connect_with(config.clone(), options)
            .await
            .map_err(|e| format!("producer {p}: {e}"))?;
        producers.push(producer);
    }
    let mut consumers = Vec::with_capacity(cli.consumers);
    let run_cell: Arc<OnceLock<Arc<Run>>> = Arc::default();
    let start_push = |group: &str| {
        let group = group.to_owned();
        let (cli, config, admin) = (&cli, &config, &admin);
        let (start_offsets, run_cell, started) = (&start_offsets, run_cell.clone(), &started);
        async move {
            start_push_consumers(cli, config, admin, &group, start_offsets, run_cell, started).await
        }
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

    let start = Instant::now();
    let measure_from = start + Duration::from_secs(cli.warmup);
    let run = Arc::new(Run {
        cli: cli.clone(),
        tag: rand::random::<u16>(),
        seen: (0..cli.producers).map(|_| Mutex::new(Vec::new())).collect(),
        queue_count,
        start,
        measure_from,
        measure_from_ns: epoch_ns(measure_from),
        stats: Stats::default(),
        stop_consumers: AtomicBool::new(false),
        sql: match &cli.sql {
            Some(expr) => Some(SqlFilter::parse(expr).map_err(|e| format!("--sql: {e}"))?),
            None => None,
        },
    });
    if run_cell.set(run.clone()).is_err() {
        unreachable!("the run is set once");
    }
    let done = Arc::new(AtomicBool::new(false));
    let progress = tokio::spawn(progress(run.clone(), done.clone()));

    let mut pullers: Vec<JoinHandle<Latencies>> = Vec::new();
    for (c, client) in consumers.into_iter().enumerate() {
        for (queue, offset) in start_offsets.iter().enumerate() {
            if queue % cli.consumers == c {
                let queue_id = queue as u32;
                let puller = consume_queue(run.clone(), client.clone(), queue_id, *offset);
                pullers.push(tokio::spawn(puller));
            }
        }
    }

    let producers = producers
        .into_iter()
        .enumerate()
        .map(|(p, producer)| {
            let quota = cli.messages.map(|n| {
                let per = n / cli.producers as u64;
                per + u64::from((p as u64) < n % cli.producers as u64)
            });
            (producer, quota)
        })
        .collect();
    let send_latency = produce_all(run.clone(), producers).await?;
    let produce_s = run.start.elapsed().as_secs_f64();
    let sent = run.stats.sent.load(Ordering::Relaxed);
    let expected = run.stats.expected.load(Ordering::Relaxed);
    // Consumers that start now drain what was produced; their rate counts from here.
    let mut consume_from_s = 0.0;
    if let (Some(group), true) = (&cli.group, cli.consume_after_produce) {
        consume_from_s = run.start.elapsed().as_secs_f64();
        push = Some(start_push(group).await?);
    }

    if cli.consumers > 0 {
        // Delayed messages arrive up to their delay after the last send.
        let drain_deadline = Instant::now()
            + Duration::from_secs(DRAIN_TIMEOUT_S)
            + Duration::from_millis(cli.delay_ms.unwrap_or(0));
        while run.stats.received.load(Ordering::Relaxed) < expected
            && Instant::now() < drain_deadline
        {
            sleep(Duration::from_millis(10)).await;
        }
    }
    run.stop_consumers.store(true, Ordering::Relaxed);
    let mut latencies = Latencies::new();
    for puller in pullers {
        let h = puller.await.map_err(|e| format!("consumer task: {e}"))?;
        latencies.add(&h)?;
    }
    if let Some(push) = push {
        let pull_errors = leave_group(&started).await;
        run.stats
            .pull_errors
            .fetch_add(pull_errors, Ordering::Relaxed);
        for h in &push.latencies {
            latencies.add(&h.lock().unwrap_or_else(PoisonError::into_inner))?;
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
        expected,
        received: stats.received.load(Ordering::Relaxed),
        duplicates: stats.duplicates.load(Ordering::Relaxed),
        send_errors: stats.send_errors.load(Ordering::Relaxed),
        busy_answers: stats.busy_answers.load(Ordering::Relaxed),
        pull_errors: stats.pull_errors.load(Ordering::Relaxed),
        produce_s,
        consume_s: (stats.last_received_ns.load(Ordering::Relaxed) as f64 / 1e9 - consume_from_s)
            .max(0.0),
        send_latency,
        e2e_latency: latencies.e2e,
        lateness: cli.delay_ms.map(|_| latencies.lateness),
        queue_count: run.queue_count,
        first_error,
    })
}

/// Set once SIGINT or SIGTERM came, or the run ended (an error may end it with the open
/// loop's scheduler going): the scheduler (a blocking thread, which the runtime's drop
/// waits for) stops sending then, not at the end of `--duration`.
pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How long push consumers of a run cut short have to leave their group.
const LEAVE_TIMEOUT_S: u64 = 10;

type Signals = (tokio::signal::unix::Signal, tokio::signal::unix::Signal);

/// SIGTERM and SIGINT taken from their default action (ending the process, which left the
/// embedded broker's temporary directory behind), from the start: one that comes while
/// the embedded broker starts ends the run as soon as it begins. `None` (said) when they
/// cannot be: a signal then ends the process as by default.
fn take_signals(runtime: &tokio::runtime::Runtime) -> Option<Signals> {
    use tokio::signal::unix::{signal, SignalKind};
    let _entered = runtime.enter();
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => Some((term, int)),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("ringmq-bench: installing the signal handlers: {e}");
            None
        }
    }
}

/// Ends once SIGINT or SIGTERM arrives, saying which: the run then ends without a report,
/// and the embedded broker is stopped and its temporary directory removed.
/// Also the exit code: 128 + the signal's number, as a shell reports a process it ended.
async fn interrupted(signals: Option<Signals>) -> (String, u8) {
    let Some((mut term, mut int)) = signals else {
        return std::future::pending().await;
    };
    let (name, number) = tokio::select! {
        _ = term.recv() => ("SIGTERM", libc::SIGTERM),
        _ = int.recv() => ("SIGINT", libc::SIGINT),
    };
    // A second one ends the process at once, as by default (the stop that follows may
    // wait on the broker).
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sets a signal's disposition to the default; no handler of ours runs.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
        }
    }
    INTERRUPTED.store(true, Ordering::Relaxed);
    let code = u8::try_from(128 + number).unwrap_or(1);
    (
        format!("interrupted by {name}: the run ends without a report (again: at once)"),
        code,
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.check() {
        eprintln!("ringmq-bench: {e}");
        return ExitCode::from(2);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cli.client_threads {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringmq-bench: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let signals = take_signals(&runtime);
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
    eprintln!("{}", banner(&cli, &broker, embedded.is_some()));
    let mut interrupted_code = None;
    let started = Started::default();
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = run(cli.clone(), broker.clone(), started.clone()) => outcome,
            (stopped, code) = interrupted(signals) => {
                interrupted_code = Some(code);
                Err(stopped)
            }
        }
    });
    // The open loop's scheduler stops, if a run cut short left it going.
    INTERRUPTED.store(true, Ordering::Relaxed);
    // Push consumers of a run cut short (a signal, an error) leave the group before the
    // runtime goes: dropped with it, they stayed members until their sessions timed out.
    // A second signal ends the process at once.
    runtime.block_on(async {
        let leave = leave_group(&started);
        if tokio::time::timeout(Duration::from_secs(LEAVE_TIMEOUT_S), leave)
            .await
            .is_err()
        {
            eprintln!(
                "ringmq-bench: the push consumers did not leave the group within {LEAVE_TIMEOUT_S} s; the broker drops them when their sessions time out"
            );
        }
    });
    // Close the client connections before the broker stops. Not waiting long for blocking
    // threads: the open loop's scheduler sees `INTERRUPTED` at its next send.
    runtime.shutdown_timeout(Duration::from_secs(1));
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
            if report.sent == 0 || (cli.consumers > 0 && report.received < report.expected) {
                code = ExitCode::FAILURE;
            }
            code
        }
        Err(e) => {
            eprintln!("ringmq-bench: {e}");
            interrupted_code.map_or(ExitCode::FAILURE, ExitCode::from)
        }
    };
    if let Some(embedded) = embedded {
        stop_embedded(embedded);
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn checks_refuse_what_cannot_run() {
        let check = |args: &[&str]| {
            let cli =
                Cli::try_parse_from(std::iter::once("ringmq-bench").chain(args.iter().copied()))
                    .expect("parses");
            cli.check()
        };
        assert_eq!(check(&[]), Ok(()));
        assert!(check(&["--keys", "4", "--batch", "2"]).is_err());
        assert!(check(&["--size", "15"]).is_err());
        assert!(check(&["--group", "g", "--consumers", "0"]).is_err());
        assert!(check(&["--broker", "127.0.0.1:1", "--shards", "2"]).is_err());
        assert_eq!(check(&["--warmup", "1", "--duration", "2"]), Ok(()));
        let both = ["ringmq-bench", "--warmup", "1", "--messages", "100"];
        assert!(
            Cli::try_parse_from(both).is_err(),
            "a warm-up is time added to --duration"
        );
    }
}
