//! `ringmq-broker`: runs a broker. Zero configuration by default (data in ./data, native
//! port 127.0.0.1:7800, one shard per core); flags or a TOML file (`--config`) for the rest.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clap::Parser;
use ringmq::log::FlushMode;
use ringmq::shard::{Broker, BrokerConfig};

#[derive(Parser, Debug)]
#[command(name = "ringmq-broker", version, about = "The ringmq message broker")]
struct Cli {
    /// TOML file with the same keys as the long flags (listen, data-dir, shards, flush,
    /// groups-max, tail-cache-mb, ...: every flag but --config and --log-level), plus broker-id (the
    /// id message ids carry, 0 by default). Flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Shared native port; shard i also listens on port+1+i (ephemeral ports when 0)
    /// [default: 127.0.0.1:7800]
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Data directory [default: ./data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Number of shards, 1 to 256 [default: one per CPU listed in --cpus, else the count
    /// the data directory was created with, else one per core]. Fixed for a data directory.
    #[arg(long)]
    shards: Option<usize>,
    /// async: acknowledge once written, fdatasync in the background; sync: acknowledge
    /// once durable (O_DSYNC writes, group commit) [default: async]
    #[arg(long)]
    flush: Option<FlushMode>,
    /// Background fdatasync period in async mode [default: 500]
    #[arg(long)]
    flush_interval_ms: Option<u64>,
    /// Create unknown topics on first send, with --default-queues queues [default: true]
    #[arg(long)]
    auto_create_topics: Option<bool>,
    /// Queues of an auto-created topic [default: 8]
    #[arg(long)]
    default_queues: Option<u32>,
    /// Commit log segment size in bytes: a multiple of 4096, at least 8192; a message whose
    /// record is larger than a segment is refused (InvalidMessage), so below 4263936 not
    /// every message the protocol allows (4 MiB bodies) fits [default: 1073741824]
    #[arg(long)]
    segment_bytes: Option<u64>,
    /// Delete log segments older than this, in hours; 1 to 876000 (a century: no duration
    /// option may exceed it) [default: 72]
    #[arg(long)]
    retention_hours: Option<u64>,
    /// Delete the oldest segments of a shard's log beyond this size, in bytes (0: no
    /// limit) [default: 0]
    #[arg(long)]
    retention_bytes_max: Option<u64>,
    /// A consumer-group member that sends no heartbeat for this long leaves; 1000 to 600000
    /// [default: 10000]
    #[arg(long)]
    session_timeout_ms: Option<u64>,
    /// A queue lock of ordered consumption not renewed for this long is free; at least
    /// --session-timeout-ms + 5000 (raise both together), at most 3600000 [default: 60000]
    #[arg(long)]
    lock_expiry_ms: Option<u64>,
    /// Delay levels, level 1 first, as RocketMQ's messageDelayLevel (units ms, s, m, h, d)
    /// [default: "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"]
    #[arg(long)]
    delay_levels: Option<String>,
    /// The longest delay a message may ask for, in ms; 1 to 31622400000 (366 days)
    /// [default: 259200000 (3 days)]
    #[arg(long)]
    delay_max_ms: Option<u64>,
    /// Most delayed messages one shard holds; sends past it get ScheduleFull (consumers'
    /// retry copies may go a quarter past it) [default: 2000000]
    #[arg(long)]
    schedule_pending_max: Option<usize>,
    /// Most client connections (beyond: refused with TooManyConnections); 0: 10000, lowered
    /// to what the open-file limit leaves after the descriptors kept for the stores
    /// [default: 0]
    #[arg(long)]
    connections_max: Option<usize>,
    /// Close a connection that sends no first request within this many ms, stops in the middle of
    /// a frame this long (a frame over 64 KiB must arrive whole within this time of its
    /// first bytes), or takes a batch of answers (1 MiB or one answer) slower than this
    /// plus a second for every 64 KiB of it [default: 30000]
    #[arg(long)]
    conn_timeout_ms: Option<u64>,
    /// The largest frame the broker takes and sends (answers to a client stay within the
    /// client's own limit too) [default: 5308767]
    #[arg(long)]
    frame_bytes_max: Option<u32>,
    /// Most topics the broker holds, retry and dead-letter topics included; beyond it
    /// creating one fails with LimitReached (the broker's own %UNDELIVERABLE%, one queue,
    /// is made past it and past --queues-max) [default: 4096]
    #[arg(long)]
    topics_max: Option<usize>,
    /// Most topics sends may create when --auto-create-topics is on [default: 1024]
    #[arg(long)]
    auto_create_topics_max: Option<usize>,
    /// Most consumer groups each shard coordinates, most groups whose committed offsets
    /// each shard keeps, and most groups holding queue locks on each shard; beyond it a new
    /// group gets LimitReached (`ringmq group delete` frees one) [default: 4096]
    #[arg(long)]
    groups_max: Option<usize>,
    /// Most committed offsets each shard keeps, one per group, topic and queue (about 150
    /// bytes each with short names); a commit, an offset reset or a topic update (which
    /// gives the consuming groups offsets of its added queues) that would add past it gets
    /// LimitReached, commits of offsets already kept go on (`ringmq group delete` forgets a
    /// group's, deleting a topic forgets its) [default: 1000000]
    #[arg(long)]
    offsets_max: Option<usize>,
    /// Most long polls (pulls waiting for messages), and requests waiting for room for
    /// their answers, each shard holds at a time, about 6 KiB each; past it a request that
    /// would wait is refused BrokerBusy, and the push consumer pulls again after its
    /// back-off [default: 65536]
    #[arg(long)]
    long_polls_max: Option<usize>,
    /// MiB of parsed SQL92 filters each shard holds: those it caches, and those of pulls
    /// waiting for messages (each holds its own); a pull with a new expression that would
    /// pass it is refused BrokerBusy, and the push consumer pulls again after its
    /// back-off [default: 64]
    #[arg(long, value_name = "MIB")]
    sql_filters_mb: Option<u64>,
    /// MiB of consumer-group members (client ids, subscriptions, by-config strategies) each
    /// shard coordinates; a heartbeat that would join or grow a member past it gets
    /// LimitReached, refreshes of members already in go on [default: 256]
    #[arg(long, value_name = "MIB")]
    group_members_mb: Option<u64>,
    /// Most queues of all topics together (each maps a file while in use); lowered at
    /// start-up to half of the kernel's vm.max_map_count, with a line saying so
    /// [default: 30000]
    #[arg(long)]
    queues_max: Option<usize>,
    /// Unmap a consume-queue file once unused this long, in ms; idle queues then hold no
    /// mapping [default: 30000]
    #[arg(long, value_name = "MS")]
    index_idle_close_ms: Option<u64>,
    /// Ask a producer of its group about a transaction's half message once it is this old
    /// without an outcome, in ms [default: 6000]
    #[arg(long, value_name = "MS")]
    transaction_timeout_ms: Option<u64>,
    /// How often an unresolved half message is asked about again, in ms [default: 30000]
    #[arg(long, value_name = "MS")]
    transaction_check_interval_ms: Option<u64>,
    /// Flow control: refuse sends with BrokerBusy (retriable; producers back off and send
    /// again) while a shard's oldest owed acknowledgement has waited longer than this for
    /// the disk, in ms; at least 1 [default: 200]
    #[arg(long, value_name = "MS")]
    send_wait_max_ms: Option<u64>,
    /// Flow control: refuse sends with BrokerBusy while more than this many MiB appended on
    /// a shard wait for the disk; at least 1 [default: 64]
    #[arg(long, value_name = "MIB")]
    send_backlog_max_mb: Option<u64>,
    /// Log level: error, warn, info, debug or trace (or a tracing filter such as
    /// `ringmq=debug`); overrides the RINGMQ_LOG environment variable [default: info]
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (for example 127.0.0.1:7880); off by
    /// default
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// A shard with nothing to do polls this long before it parks its thread, in µs: saves
    /// the park/wake-up cost under load, but keeps the core busy (use it when the broker
    /// has its cores to itself) [default: 0, park at once]
    #[arg(long, value_name = "US")]
    spin_before_park_us: Option<u64>,
    /// CPUs for the shards, shard i on the i-th listed (for example 1, or 0-3,8); without
    /// --shards, one shard per CPU listed [default: one shard per CPU when the cores
    /// suffice; with fewer shards than CPUs, first those taking the data disk's completion
    /// interrupts (a shard there is not woken from another CPU for every write); unpinned
    /// when shards outnumber the cores or a CPU quota is smaller than the affinity]
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Testing: make every log write wait this long first, as a slow disk would, in µs
    #[arg(long, value_name = "US", hide = true)]
    testing_write_delay_us: Option<u64>,
    /// Testing: the shard asked to create a topic of this name panics
    #[arg(long, value_name = "TOPIC", hide = true)]
    testing_panic_topic: Option<String>,
    /// Checks a producer answers "unknown" before an unresolved half message is discarded
    /// (kept in the %SYS_TXN_DISCARDED% topic and counted by `ringmq transaction list`);
    /// checks no checker answers do not count [default: 15]
    #[arg(long, value_name = "N")]
    transaction_check_max: Option<u32>,
    /// Most unresolved half messages one shard holds; transactional sends past it get
    /// LimitReached [default: 200000]
    #[arg(long, value_name = "N")]
    transaction_pending_max: Option<usize>,
    /// Most unresolved half messages of one producer group on one shard; its transactional
    /// sends past it get LimitReached, other groups' go on [default: 50000]
    #[arg(long, value_name = "N")]
    transaction_group_pending_max: Option<usize>,
    /// How often retention looks for old segments to delete, in ms [default: 60000]
    #[arg(long)]
    retention_check_interval_ms: Option<u64>,
    /// Refuse sends with DiskFull (retriable) while the data directory's filesystem has less
    /// free space than this many MiB; they are taken again once space is freed [default: 256]
    #[arg(long, value_name = "MIB")]
    disk_free_min_mb: Option<u64>,
    /// How long a delayed message waits for its target topic to exist again before it goes
    /// to the %UNDELIVERABLE% topic, in ms [default: 3600000]
    #[arg(long)]
    schedule_park_max_ms: Option<u64>,
    /// MiB of each shard's newest log writes kept in memory: consumers reading within them
    /// are served from memory, further back from the disk (0: always the disk). Lowered at
    /// start so that all shards together take at most half of the machine's memory (or cgroup limit)
    /// [default: 64]
    #[arg(long, value_name = "MIB")]
    tail_cache_mb: Option<u64>,
}

fn load(cli: &Cli) -> Result<BrokerConfig, String> {
    let mut cfg = match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => BrokerConfig::default(),
    };
    if let Some(v) = cli.listen {
        cfg.listen = v;
    }
    if let Some(v) = &cli.data_dir {
        cfg.data_dir = v.clone();
    }
    if let Some(v) = cli.shards {
        if v == 0 {
            return Err("--shards must be at least 1".into());
        }
        cfg.shards = v;
    }
    if let Some(v) = cli.flush {
        cfg.flush = v;
    }
    if let Some(v) = cli.flush_interval_ms {
        cfg.flush_interval_ms = v;
    }
    if let Some(v) = cli.auto_create_topics {
        cfg.auto_create_topics = v;
    }
    if let Some(v) = cli.default_queues {
        cfg.default_queues = v;
    }
    if let Some(v) = cli.segment_bytes {
        cfg.segment_bytes = v;
    }
    if let Some(v) = cli.retention_hours {
        cfg.retention_hours = v;
    }
    if let Some(v) = cli.retention_bytes_max {
        cfg.retention_bytes_max = v;
    }
    if let Some(v) = cli.session_timeout_ms {
        cfg.session_timeout_ms = v;
    }
    if let Some(v) = cli.lock_expiry_ms {
        cfg.lock_expiry_ms = v;
    }
    if let Some(v) = &cli.delay_levels {
        cfg.delay_levels = v.clone();
    }
    if let Some(v) = cli.delay_max_ms {
        cfg.delay_max_ms = v;
    }
    if let Some(v) = cli.schedule_pending_max {
        cfg.schedule_pending_max = v;
    }
    if let Some(v) = cli.connections_max {
        cfg.connections_max = v;
    }
    if let Some(v) = cli.conn_timeout_ms {
        cfg.conn_timeout_ms = v;
    }
    if let Some(v) = cli.frame_bytes_max {
        cfg.frame_bytes_max = v;
    }
    if let Some(v) = cli.topics_max {
        cfg.topics_max = v;
    }
    if let Some(v) = cli.auto_create_topics_max {
        cfg.auto_create_topics_max = v;
    }
    if let Some(v) = cli.groups_max {
        cfg.groups_max = v;
    }
    if let Some(v) = cli.offsets_max {
        cfg.offsets_max = v;
    }
    if let Some(v) = cli.long_polls_max {
        cfg.long_polls_max = v;
    }
    if let Some(v) = cli.sql_filters_mb {
        cfg.sql_filters_mb = v;
    }
    if let Some(v) = cli.group_members_mb {
        cfg.group_members_mb = v;
    }
    if let Some(v) = cli.queues_max {
        cfg.queues_max = v;
    }
    if let Some(v) = cli.index_idle_close_ms {
        cfg.index_idle_close_ms = v;
    }
    if let Some(v) = cli.transaction_timeout_ms {
        cfg.transaction_timeout_ms = v;
    }
    if let Some(v) = cli.transaction_check_interval_ms {
        cfg.transaction_check_interval_ms = v;
    }
    if let Some(v) = cli.transaction_check_max {
        cfg.transaction_check_max = v;
    }
    if let Some(v) = cli.transaction_pending_max {
        cfg.transaction_pending_max = v;
    }
    if let Some(v) = cli.transaction_group_pending_max {
        cfg.transaction_group_pending_max = v;
    }
    if let Some(v) = cli.send_wait_max_ms {
        cfg.send_wait_max_ms = v;
    }
    if let Some(v) = cli.send_backlog_max_mb {
        cfg.send_backlog_max_mb = v;
    }
    if let Some(v) = cli.spin_before_park_us {
        cfg.spin_before_park_us = v;
    }
    if let Some(v) = &cli.cpus {
        cfg.cpus = v.clone();
    }
    if let Some(v) = cli.testing_write_delay_us {
        cfg.testing_write_delay_us = v;
    }
    if let Some(v) = &cli.testing_panic_topic {
        cfg.testing_panic_topic = Some(v.clone());
    }
    if let Some(v) = cli.metrics_listen {
        cfg.metrics_listen = Some(v);
    }
    if let Some(v) = cli.disk_free_min_mb {
        cfg.disk_free_min_mb = v;
    }
    if let Some(v) = cli.retention_check_interval_ms {
        cfg.retention_check_interval_ms = v;
    }
    if let Some(v) = cli.schedule_park_max_ms {
        cfg.schedule_park_max_ms = v;
    }
    if let Some(v) = cli.tail_cache_mb {
        cfg.tail_cache_mb = v;
    }
    Ok(cfg)
}

fn block_stop_signals() -> libc::sigset_t {
    // Blocked before any shard thread starts, so that every thread inherits the mask and
    // the signals are taken by sigwait below.
    // SAFETY: the signal-set functions only write the zero-initialised `sigset_t` we own
    // (all-zero is a valid value to start from, and sigemptyset initialises it);
    // pthread_sigmask reads it and changes only this thread's mask (the old mask is not
    // asked for: null is allowed).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Where the broker is, for its stop signals: serving once `broker` holds its stop flag,
/// `done` once its clean stop has ended.
#[derive(Default)]
struct Phase {
    broker: OnceLock<Arc<AtomicBool>>,
    done: AtomicBool,
}

/// A repeated stop signal ends a clean stop only when it comes at least this long after the
/// first: a supervisor that signals twice in a row (systemd's `ExecStop=kill $MAINPID`,
/// then its own SIGTERM) still gets a clean stop.
const REPEAT_GRACE: Duration = Duration::from_secs(1);

/// Takes SIGTERM and SIGINT (blocked in every thread) on a thread of its own, from before
/// the start. The first one once the broker serves asks for a clean stop. One during the
/// start, or another one at least [`REPEAT_GRACE`] after the first while the clean stop
/// runs, ends the process at once, by that signal, as a crash (SIGKILL) would: the next
/// start recovers from the disk. So a start or a stop that hangs (a disk that stopped
/// answering, a long recovery) can still be ended without SIGKILL.
fn take_stop_signals(signals: libc::sigset_t, phase: Arc<Phase>) {
    std::thread::spawn(move || {
        let mut first: Option<Instant> = None;
        loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: sigwait reads the set (a valid, initialised `sigset_t` moved into
            // this thread) and writes the signal number into `sig`, which we own.
            unsafe {
                libc::sigwait(&signals, &mut sig);
            }
            if phase.done.load(Ordering::SeqCst) {
                continue; // stopped cleanly: the process is ending anyway
            }
            match (phase.broker.get(), first) {
                (None, _) => die_by(sig, "while starting: exiting"),
                (Some(stop), None) => {
                    first = Some(Instant::now());
                    ringmq::say!("ringmq-broker: signal {sig}: stopping");
                    stop.store(true, Ordering::SeqCst);
                }
                (Some(_), Some(at)) if at.elapsed() < REPEAT_GRACE => ringmq::say!(
                    "ringmq-broker: signal {sig} again within {REPEAT_GRACE:?} of the first: \
                     still stopping (another one later ends the broker at once)"
                ),
                (Some(_), Some(_)) => {
                    die_by(sig, "again: exiting without finishing the clean stop")
                }
            }
        }
    });
}

/// Says why (stderr and stdout, as the other fatal exits do), then ends the process by
/// `sig` itself, its default action: a supervisor sees the broker killed by SIGTERM or
/// SIGINT (which systemd counts as a clean end), and no exit handler runs.
fn die_by(sig: libc::c_int, what: &str) -> ! {
    let line = format!(
        "ringmq-broker: signal {sig} {what}; the next start recovers from the disk as after a crash"
    );
    ringmq::warn!("{line}");
    say_on_stdout(&line);
    // SAFETY: signal(2) restores the default action of a valid signal number; the set is
    // a zero-initialised `sigset_t` we own, initialised by sigemptyset; pthread_sigmask
    // unblocks it for this thread only, so raise(3) delivers it here; _exit(2) ends the
    // process if it somehow survives its own signal.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
        libc::_exit(128 + sig)
    }
}

/// Log lines go to stderr through `tracing`, filtered by --log-level, else RINGMQ_LOG,
/// else `info`. A failed write to stderr is ignored (a full disk must not stop the broker):
/// tracing-subscriber's own report of a failed write is off, because it is an `eprintln!`
/// to the same stderr, which panics when that write fails too (the thread that logged, a
/// shard, would die of a log line).
fn init_logs(level: Option<&str>) {
    let directive = level
        .map(str::to_owned)
        .or_else(|| std::env::var("RINGMQ_LOG").ok())
        .unwrap_or_else(|| "info".to_owned());
    let filter = match tracing_subscriber::EnvFilter::try_new(&directive) {
        Ok(f) => f,
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "ringmq-broker: log level {directive:?}: {e}; using info"
            );
            tracing_subscriber::EnvFilter::new("info")
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .log_internal_errors(false)
        .init();
}

/// Writes one line to stdout, where the ready line goes; a failed write is ignored.
fn say_on_stdout(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A panic's place and message go to stdout too, as one line, after the default hook's
/// report on stderr: the stderr log may sit on the disk that just filled, and a shard's
/// panic stops the broker (`Broker::wait`), so its reason must be seen.
fn report_panics_on_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let thread = std::thread::current();
        let what = info.to_string().replace('\n', " ");
        say_on_stdout(&format!(
            "ringmq-broker: thread '{}' {what}",
            thread.name().unwrap_or("unnamed")
        ));
    }));
}

fn main() {
    let cli = Cli::parse();
    init_logs(cli.log_level.as_deref());
    report_panics_on_stdout();
    let cfg = match load(&cli) {
        Ok(c) => c,
        Err(e) => {
            ringmq::error!("ringmq-broker: {e}");
            std::process::exit(2);
        }
    };
    let signals = block_stop_signals();
    let phase = Arc::new(Phase::default());
    take_stop_signals(signals, phase.clone());
    let data_dir = cfg.data_dir.clone();
    let flush = cfg.flush;
    let broker = match Broker::start(cfg) {
        Ok(b) => b,
        Err(e) => {
            ringmq::error!("ringmq-broker: {e}");
            say_on_stdout(&format!("ringmq-broker: {e}"));
            std::process::exit(1);
        }
    };
    if phase.broker.set(broker.stop_flag()).is_err() {
        unreachable!("the stop flag is set once");
    }
    let direct: Vec<String> = broker.shard_addrs().iter().map(|a| a.to_string()).collect();
    say_on_stdout(&format!(
        "ringmq-broker ready: listening on {} ({} shards, direct {}), data {}, flush {:?}",
        broker.addr(),
        direct.len(),
        direct.join(","),
        data_dir.display(),
        flush
    ));
    let stopped = broker.wait();
    phase.done.store(true, Ordering::SeqCst);
    match stopped {
        Ok(()) => ringmq::say!("ringmq-broker: stopped cleanly"),
        Err(e) => {
            ringmq::error!("ringmq-broker: {e}");
            say_on_stdout(&format!("ringmq-broker: {e}"));
            std::process::exit(1);
        }
    }
}
