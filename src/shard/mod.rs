//! The shard runtime: one glommio executor per shard, the channel mesh between them, the
//! listeners (a shared SO_REUSEPORT port and one direct port per shard), connections, and
//! clean start and stop. Everything glommio-specific about serving lives here; the services
//! it runs are in `crate::broker`.
//!
//! Files: this one (start, stop, the mesh, the shard's main task), `checks.rs` (what is
//! checked before a start), `conn.rs` (serving one connection, with its bounds and
//! timeouts), `cpus.rs` (where shards are placed), `listen.rs` (sockets, the exclusive-port
//! probe, the connection cap, accepting).
//!
//! Architecture invariant: a shard's state is touched only by its own executor thread.
//! Shards exchange messages over bounded channels; the only things shared across threads
//! are start-up coordination and the stop flag.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use glommio::channels::channel_mesh::{Full, MeshBuilder};
use glommio::LocalExecutorBuilder;

mod checks;
mod config;
mod conn;
mod cpus;
mod listen;
mod mesh;

use crate::broker::offsets::OffsetStore;
use crate::broker::schedule::Schedule;
pub use crate::broker::topics::TopicChangeFault;
use crate::broker::topics::TopicTable;
use crate::broker::{MeshMsg, ServiceConfig, ShardCtx};
use crate::log::FlushMode;
use crate::protocol::delay::DelayRule;
use crate::protocol::FrameLimits;
use crate::store::{MessageStore, StoreConfig};
use checks::{check_durations, check_shard_count, fit_tail_cache, lock_data_dir, max_map_count};
pub use config::*;
use conn::{ConnSettings, ReadBudget};
use listen::{accept_loop, bind, check_ports_free, ConnectionCap, LiveConnections};
use mesh::{spawn_mesh_receiver, MeshPeers};

/// Capacity of each channel of the shard mesh.
const MESH_CHANNEL_CAPACITY: usize = 1024;
/// How often a shard looks for group members that missed their heartbeats.
const GROUP_EXPIRY_CHECK_MS: u64 = 500;
/// Bounds of `--session-timeout-ms`.
use crate::protocol::messages::SESSION_TIMEOUT_MS_MIN;
const SESSION_TIMEOUT_MS_MAX: u64 = 600_000;
/// `--lock-expiry-ms` is at least the session timeout plus this, and at most an hour.
const LOCK_EXPIRY_MARGIN_MS: u64 = 5_000;
const LOCK_EXPIRY_MS_MAX: u64 = 3_600_000;
/// How long a clean stop waits for requests in flight.
const STOP_DRAIN_MS: u64 = 10_000;
/// At a clean stop, how long the connections shut down last get to end.
const CONNS_CLOSE_MS: u64 = 1_000;
/// After a shard dies, how long the others get to stop cleanly beyond `STOP_DRAIN_MS`
/// (closing the store, syncing offsets) before [`Broker::wait`] gives up on them.
const STOP_AFTER_DEATH_MARGIN_MS: u64 = 20_000;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("data directory {path}: {reason}")]
    DataDir { path: PathBuf, reason: String },
    #[error("shard {shard} failed to start: {reason}")]
    ShardStart { shard: usize, reason: String },
    #[error("shard {shard} stopped with an error: {reason}")]
    ShardStop { shard: usize, reason: String },
    /// A shard ended without being asked to (a panic, an error); the others were stopped.
    #[error("shard {shard} died ({reason}); the broker stopped")]
    ShardDied { shard: usize, reason: String },
}

/// A running broker. Dropping it without [`shutdown`](Broker::shutdown) leaves the shards
/// running until the process exits.
pub struct Broker {
    addr: SocketAddr,
    shard_addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    threads: Vec<glommio::ExecutorJoinHandle<Result<(), String>>>,
    /// What the shards report; after start-up, only `Exited`.
    events: mpsc::Receiver<BootMsg>,
    /// Held while the broker runs.
    _dir_lock: std::fs::File,
}

enum BootMsg {
    Bound {
        shard: usize,
        direct: SocketAddr,
        peer_id: usize,
    },
    Ready,
    Failed {
        shard: usize,
        reason: String,
    },
    /// The shard's thread ended, however it ended.
    Exited {
        shard: usize,
    },
}

/// Sends `BootMsg::Exited` when dropped. Kept in a thread-local of the shard's thread, so it
/// is dropped as the thread ends even when a panic unwinds out of the executor (a panic in
/// any task of a glommio executor ends its thread).
struct ExitNotice {
    shard: usize,
    tx: mpsc::Sender<BootMsg>,
}

impl Drop for ExitNotice {
    fn drop(&mut self) {
        let _ = self.tx.send(BootMsg::Exited { shard: self.shard });
    }
}

thread_local! {
    static EXIT_NOTICE: std::cell::RefCell<Option<ExitNotice>> =
        const { std::cell::RefCell::new(None) };
}

/// What a shard thread's join says, as a result whose error names a panic's message.
fn how_it_ended(joined: glommio::Result<Result<(), String>, ()>) -> Result<(), String> {
    match joined {
        Ok(r) => r,
        Err(glommio::GlommioError::BuilderError(glommio::BuilderErrorKind::ThreadPanic(p))) => {
            let text = p
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("a panic without a message");
            Err(format!("panicked: {text}"))
        }
        Err(e) => Err(e.to_string()),
    }
}

struct Boot {
    /// Where the shards publish their metrics, when they are served.
    metrics: Option<Arc<crate::broker::metrics::MetricsHub>>,
    main_addr: OnceLock<SocketAddr>,
    /// Direct address of each shard, and the mesh peer index of each shard.
    table: OnceLock<(Vec<String>, Vec<usize>)>,
    /// Shards whose transactions are rebuilt and whose mesh receivers run.
    recovered: std::sync::atomic::AtomicUsize,
    /// Shards that told the coordinators of their resets' epochs (`publish_fences`).
    fences_told: std::sync::atomic::AtomicUsize,
    /// The latest incarnation of the shards' stores (each sets it before it binds): topic
    /// creation stamps are later (`ShardCtx::stamp_creations_after`).
    runs_max: std::sync::atomic::AtomicU64,
}

impl Broker {
    /// Starts the shards and returns once every shard serves.
    pub fn start(mut cfg: BrokerConfig) -> Result<Broker, BrokerError> {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let allowed = cpus::allowed_cpus().unwrap_or_else(|| (0..cores).collect());
        let cpu_list = cpus::parse_cpu_list(&cfg.cpus, &allowed).map_err(BrokerError::Config)?;
        let shards = match (cfg.shards, cpu_list.len()) {
            // The count the data directory holds (queue ownership depends on it): the
            // machine's cores may have changed since it was created.
            (0, 0) => checks::recorded_shard_count(&cfg.data_dir).unwrap_or(cores),
            (0, listed) => listed,
            (n, _) => n,
        };
        if shards > 256 {
            return Err(BrokerError::Config(format!(
                "{shards} shards is more than the 256 supported"
            )));
        }
        cpus::check_listed(&cpu_list, shards).map_err(BrokerError::Config)?;
        if cfg.default_queues == 0
            || cfg.default_queues > crate::broker::topics::QUEUES_PER_TOPIC_MAX
        {
            return Err(BrokerError::Config(
                "default-queues must be 1..=1024".into(),
            ));
        }
        let limits = FrameLimits::new(cfg.frame_bytes_max)
            .map_err(|e| BrokerError::Config(format!("frame-bytes-max: {e}")))?;
        DelayRule::new(&cfg.delay_levels, cfg.delay_max_ms)
            .map_err(|e| BrokerError::Config(format!("delay-levels / delay-max-ms: {e}")))?;
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&cfg.session_timeout_ms) {
            return Err(BrokerError::Config(format!(
                "session-timeout-ms must be {SESSION_TIMEOUT_MS_MIN}..={SESSION_TIMEOUT_MS_MAX}, not {}",
                cfg.session_timeout_ms
            )));
        }
        // A member must be gone (its session over) well before its locks lapse, or a new
        // owner could take an orderly queue the old one still works on.
        let lock_min = cfg.session_timeout_ms + LOCK_EXPIRY_MARGIN_MS;
        if !(lock_min..=LOCK_EXPIRY_MS_MAX).contains(&cfg.lock_expiry_ms) {
            return Err(BrokerError::Config(format!(
                "lock-expiry-ms must be {lock_min}..={LOCK_EXPIRY_MS_MAX} (at least the session timeout plus {LOCK_EXPIRY_MARGIN_MS}), not {}",
                cfg.lock_expiry_ms
            )));
        }
        if cfg.retention_check_interval_ms == 0 {
            return Err(BrokerError::Config(
                "retention-check-interval-ms must be at least 1".into(),
            ));
        }
        if cfg.transaction_timeout_ms == 0 || cfg.transaction_check_interval_ms == 0 {
            return Err(BrokerError::Config(
                "transaction-timeout-ms and transaction-check-interval-ms must be at least 1"
                    .into(),
            ));
        }
        if cfg.index_idle_close_ms == 0 {
            return Err(BrokerError::Config(
                "index-idle-close-ms must be at least 1".into(),
            ));
        }
        if cfg.conn_timeout_ms == 0 {
            return Err(BrokerError::Config(
                "conn-timeout-ms must be at least 1".into(),
            ));
        }
        for (name, v) in [
            ("topics-max", cfg.topics_max),
            ("groups-max", cfg.groups_max),
            ("offsets-max", cfg.offsets_max),
            ("long-polls-max", cfg.long_polls_max),
            ("queues-max", cfg.queues_max),
            ("transaction-pending-max", cfg.transaction_pending_max),
            (
                "transaction-group-pending-max",
                cfg.transaction_group_pending_max,
            ),
        ] {
            if v == 0 {
                return Err(BrokerError::Config(format!("{name} must be at least 1")));
            }
        }
        for (name, mb) in [
            ("group-members-mb", cfg.group_members_mb),
            ("sql-filters-mb", cfg.sql_filters_mb),
            // 0 hours would make every sealed segment old enough to delete, consumed or
            // not (the size limit's 0 is "no limit"; an age of 0 is no retention at all).
            ("retention-hours", cfg.retention_hours),
            // 0 would answer every send busy while anything is unacknowledged.
            ("send-wait-max-ms", cfg.send_wait_max_ms),
            ("send-backlog-max-mb", cfg.send_backlog_max_mb),
            // 0 would discard every half message at its first check, unasked.
            (
                "transaction-check-max",
                u64::from(cfg.transaction_check_max),
            ),
        ] {
            if mb == 0 {
                return Err(BrokerError::Config(format!("{name} must be at least 1")));
            }
        }
        if cfg.schedule_pending_max == 0 {
            return Err(BrokerError::Config(
                "schedule-pending-max must be at least 1".into(),
            ));
        }
        check_durations(&cfg)?;
        fit_tail_cache(&mut cfg, shards, checks::mem_total_bytes());
        // The lock first: two brokers starting at once on a new directory would both find
        // no shard count and write their own.
        let dir_lock = lock_data_dir(&cfg.data_dir)?;
        check_shard_count(&cfg.data_dir, shards)?;
        // A shard per core when there are enough cores (or on the CPU listed for it); the
        // cores shared otherwise: more shards than cores, or a CPU quota smaller than the
        // CPUs the process may use (containers sharing a host would all pick the same
        // CPUs).
        let pin_to: &[usize] = if shards <= cores && cores >= allowed.len() {
            &allowed
        } else {
            &[]
        };
        let placements = cpus::placements(&cpu_list, shards, pin_to, || {
            cpus::disk_interrupts(&cfg.data_dir)
        });
        check_ports_free(&cfg.listen, shards)?;
        let (file_limit, _) = listen::raise_file_limit();
        let connections_max = listen::connections_max(cfg.connections_max, file_limit, shards);
        let wanted = if cfg.connections_max == 0 {
            listen::CONNECTIONS_MAX_DEFAULT
        } else {
            cfg.connections_max
        };
        if connections_max < wanted {
            crate::warn!(
                "ringmq-broker: the open-file limit is {file_limit}: at most {connections_max} connections, not {wanted} (descriptors are kept for the stores)",
            );
        }
        let cap = ConnectionCap::new(connections_max);
        // Each queue maps at least one file, and past vm.max_map_count every mmap of the
        // process fails: keep half of it for queues.
        if let Some(maps) = max_map_count() {
            let fit = (maps / 2).max(1);
            if cfg.queues_max > fit {
                crate::warn!(
                    "ringmq-broker: vm.max_map_count is {maps}: at most {fit} queues, not {}",
                    cfg.queues_max
                );
                cfg.queues_max = fit;
            }
        }
        TopicTable::load(&cfg.data_dir).map_err(|e| BrokerError::DataDir {
            path: cfg.data_dir.clone(),
            reason: e.to_string(),
        })?;
        let metrics = match cfg.metrics_listen {
            Some(addr) => {
                let listener = crate::broker::metrics::bind(addr).map_err(BrokerError::Config)?;
                let hub = crate::broker::metrics::MetricsHub::new(shards);
                hub.serve(listener);
                Some(hub)
            }
            None => None,
        };
        let cfg = Arc::new(cfg);
        let boot = Arc::new(Boot {
            metrics,
            main_addr: OnceLock::new(),
            table: OnceLock::new(),
            recovered: std::sync::atomic::AtomicUsize::new(0),
            fences_told: std::sync::atomic::AtomicUsize::new(0),
            runs_max: std::sync::atomic::AtomicU64::new(0),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mesh: MeshBuilder<MeshMsg, Full> = MeshBuilder::full(shards, MESH_CHANNEL_CAPACITY);
        let (tx, rx) = mpsc::channel();
        let mut threads = Vec::with_capacity(shards);
        for (i, placement) in placements.into_iter().enumerate() {
            let (cfg, boot, stop, mesh, tx, cap) = (
                cfg.clone(),
                boot.clone(),
                stop.clone(),
                mesh.clone(),
                tx.clone(),
                cap.clone(),
            );
            let mut builder =
                LocalExecutorBuilder::new(placement).name(&format!("ringmq-shard-{i}"));
            if cfg.spin_before_park_us > 0 {
                builder = builder.spin_before_park(Duration::from_micros(cfg.spin_before_park_us));
            }
            let handle = builder
                .spawn(move || async move {
                    EXIT_NOTICE.with(|n| {
                        *n.borrow_mut() = Some(ExitNotice {
                            shard: i,
                            tx: tx.clone(),
                        })
                    });
                    let tx2 = tx.clone();
                    let r = shard_main(i, shards, cfg, limits, mesh, boot, tx, stop, cap).await;
                    if let Err(reason) = &r {
                        let _ = tx2.send(BootMsg::Failed {
                            shard: i,
                            reason: reason.clone(),
                        });
                    }
                    r
                })
                .map_err(|e| BrokerError::ShardStart {
                    shard: i,
                    reason: e.to_string(),
                })?;
            threads.push(handle);
        }
        drop(tx);
        // `reason: None`: what the shard's thread ended with (a panic).
        let fail = |threads: Vec<glommio::ExecutorJoinHandle<Result<(), String>>>,
                    stop: &AtomicBool,
                    shard,
                    reason: Option<String>| {
            stop.store(true, Ordering::SeqCst);
            let mut ended = None;
            for (i, t) in threads.into_iter().enumerate() {
                let r = how_it_ended(t.join());
                if i == shard {
                    ended = r.err();
                }
            }
            let reason = reason
                .or(ended)
                .unwrap_or_else(|| "the shard ended during start-up".into());
            BrokerError::ShardStart { shard, reason }
        };
        let mut direct = vec![None; shards];
        let mut peer_ids = vec![0usize; shards];
        let mut ready = 0;
        while ready < shards {
            match rx.recv() {
                Ok(BootMsg::Bound {
                    shard,
                    direct: addr,
                    peer_id,
                }) => {
                    direct[shard] = Some(addr);
                    peer_ids[shard] = peer_id;
                    if direct.iter().all(Option::is_some) {
                        let addrs = direct.iter().flatten().map(|a| a.to_string()).collect();
                        let _ = boot.table.set((addrs, peer_ids.clone()));
                    }
                }
                Ok(BootMsg::Ready) => ready += 1,
                Ok(BootMsg::Failed { shard, reason }) => {
                    return Err(fail(threads, &stop, shard, Some(reason)))
                }
                // After `Failed` when a shard's start-up failed; alone when it panicked.
                Ok(BootMsg::Exited { shard }) => return Err(fail(threads, &stop, shard, None)),
                Err(_) => {
                    return Err(fail(
                        threads,
                        &stop,
                        0,
                        Some("a shard exited during start-up".into()),
                    ))
                }
            }
        }
        let addr = *boot
            .main_addr
            .get()
            .ok_or_else(|| BrokerError::ShardStart {
                shard: 0,
                reason: "no listener".into(),
            })?;
        Ok(Broker {
            addr,
            shard_addrs: direct.into_iter().flatten().collect(),
            stop,
            threads,
            events: rx,
            _dir_lock: dir_lock,
        })
    }

    /// The shared native address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The direct address of each shard.
    pub fn shard_addrs(&self) -> &[SocketAddr] {
        &self.shard_addrs
    }

    /// A flag that stops the broker when set (for signal handlers).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Waits until the broker stops: after the stop flag is set, or as soon as a shard
    /// ends without being asked to (a panic, an error). A broker missing a shard would
    /// refuse that shard's connections and queues while looking alive, so the death of one
    /// stops the others cleanly (their requests in flight finish, their logs are flushed)
    /// and is returned as [`BrokerError::ShardDied`]: the process should exit and be
    /// restarted, and recovery runs as after any stop. Shards that have not stopped
    /// `STOP_DRAIN_MS + STOP_AFTER_DEATH_MARGIN_MS` after the death are left running
    /// (the error says so); exiting the process ends them.
    pub fn wait(self) -> Result<(), BrokerError> {
        let Broker {
            threads,
            events,
            stop,
            _dir_lock: dir_lock,
            ..
        } = self;
        let mut ended = vec![false; threads.len()];
        let mut died = None;
        let mut deadline: Option<Instant> = None;
        while ended.contains(&false) {
            let event = match deadline {
                None => events.recv().ok(),
                Some(d) => events
                    .recv_timeout(d.saturating_duration_since(Instant::now()))
                    .ok(),
            };
            match event {
                Some(BootMsg::Exited { shard }) => {
                    ended[shard] = true;
                    // Shards end on their own only when the stop flag is set.
                    if !stop.swap(true, Ordering::SeqCst) {
                        died = Some(shard);
                        deadline = Some(
                            Instant::now()
                                + Duration::from_millis(STOP_DRAIN_MS + STOP_AFTER_DEATH_MARGIN_MS),
                        );
                    }
                }
                Some(_) => {}
                // Timed out, or every shard's thread is gone.
                None => break,
            }
        }
        let mut first_err = None;
        let mut dead_reason = None;
        let mut stuck = Vec::new();
        for (shard, t) in threads.into_iter().enumerate() {
            if !ended[shard] {
                stuck.push(shard);
                continue;
            }
            let r = how_it_ended(t.join());
            if Some(shard) == died {
                dead_reason = Some(
                    r.err()
                        .unwrap_or_else(|| "ended without an error, unasked".into()),
                );
            } else if let (Err(reason), None) = (r, &first_err) {
                first_err = Some(BrokerError::ShardStop { shard, reason });
            }
        }
        if !stuck.is_empty() {
            // Shards still run on the data directory: it stays locked (until the process
            // exits).
            std::mem::forget(dir_lock);
        }
        if let (Some(shard), Some(mut reason)) = (died, dead_reason) {
            if !stuck.is_empty() {
                reason.push_str(&format!(
                    "; shards {stuck:?} had not stopped {} s later",
                    (STOP_DRAIN_MS + STOP_AFTER_DEATH_MARGIN_MS) / 1000
                ));
            }
            return Err(BrokerError::ShardDied { shard, reason });
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Clean stop: stop accepting, finish requests in flight, flush, write checkpoints.
    pub fn shutdown(self) -> Result<(), BrokerError> {
        self.stop.store(true, Ordering::SeqCst);
        self.wait()
    }
}

async fn wait_for<T: Clone>(cell: &OnceLock<T>, stop: &AtomicBool) -> Result<T, String> {
    wait_until(stop, Some(Duration::from_secs(60)), || cell.get().cloned()).await
}

/// Polls `ready` until it gives a value, the start-up is abandoned (`stop`), or `patience`
/// runs out.
async fn wait_until<T>(
    stop: &AtomicBool,
    patience: Option<Duration>,
    ready: impl Fn() -> Option<T>,
) -> Result<T, String> {
    let started = Instant::now();
    loop {
        if let Some(v) = ready() {
            return Ok(v);
        }
        if stop.load(Ordering::SeqCst) || patience.is_some_and(|p| started.elapsed() > p) {
            return Err("start-up was abandoned".into());
        }
        crate::io::sleep(Duration::from_millis(1)).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn shard_main(
    i: usize,
    shards: usize,
    cfg: Arc<BrokerConfig>,
    limits: FrameLimits,
    mesh: MeshBuilder<MeshMsg, Full>,
    boot: Arc<Boot>,
    tx: mpsc::Sender<BootMsg>,
    stop: Arc<AtomicBool>,
    cap: Arc<ConnectionCap>,
) -> Result<(), String> {
    // Join the mesh first: a shard that fails later must not leave the others waiting here.
    let (senders, receivers) = mesh
        .join()
        .await
        .map_err(|_| "joining the shard mesh failed".to_string())?;
    let peer_id = senders.peer_id();
    if cfg.testing_write_delay_us > 0 {
        crate::io::set_write_delay(Duration::from_micros(cfg.testing_write_delay_us));
    }
    let shard_dir = cfg.data_dir.join(format!("shard-{i}"));
    let mut store_cfg = StoreConfig::default();
    store_cfg.log.flush = cfg.flush;
    store_cfg.log.flush_interval_ms = cfg.flush_interval_ms;
    store_cfg.log.segment_bytes = cfg.segment_bytes;
    store_cfg.log.retention_ms = cfg.retention_hours.saturating_mul(3_600_000);
    store_cfg.log.retention_bytes_max = cfg.retention_bytes_max;
    store_cfg.retention_check_interval_ms = cfg.retention_check_interval_ms;
    store_cfg.index_idle_close_ms = cfg.index_idle_close_ms;
    store_cfg.disk_free_min_bytes = cfg.disk_free_min_mb.saturating_mul(1 << 20);
    // Fitted to the machine's memory before the start (`fit_tail_cache`).
    store_cfg.log.tail_cache_bytes =
        usize::try_from(cfg.tail_cache_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let topics = TopicTable::load(&cfg.data_dir).map_err(|e| e.to_string())?;
    store_cfg.incarnation_after = topics.last_born();
    let opened = Instant::now();
    let (store, recovery) = MessageStore::open(&shard_dir, store_cfg)
        .await
        .map_err(|e| format!("opening {}: {e}", shard_dir.display()))?;
    crate::say!(
        "ringmq-broker: shard {i}: {}",
        recovery.summary(opened.elapsed())
    );
    boot.runs_max
        .fetch_max(store.incarnation(), Ordering::SeqCst);
    // Nothing leaves the log before the schedule and the transactions say what they still
    // need.
    for holder in crate::store::Holder::ALL {
        store.set_retention_floor(holder, 0);
    }
    let schedule = Schedule::recover(&store)
        .await
        .map_err(|e| format!("recovering the schedule in {}: {e}", shard_dir.display()))?;
    let mut offsets = OffsetStore::open(&shard_dir)
        .map_err(|e| format!("opening offsets in {}: {e}", shard_dir.display()))?;
    // A queue whose end cannot be read refuses the start: an offset left past its end
    // would skip the messages stored there next.
    let mut unread = None;
    let lowered = offsets.lower_past_ends(|topic, queue_id| {
        match store.queue_range(topic, queue_id) {
            Ok((_, end)) => Some(end),
            Err(e) => {
                unread.get_or_insert_with(|| format!("reading the end of {topic}[{queue_id}] in {}, to check the offsets committed there: {e}", shard_dir.display()));
                None
            }
        }
    });
    if let Some(e) = unread {
        return Err(e);
    }
    if lowered > 0 {
        crate::warn!(
            "ringmq-broker: shard {i}: {lowered} committed offsets were past their queue's end (the last crash lost records not yet synced): lowered to it, so the messages stored there next are consumed"
        );
    }
    let (main_listener, main_stop) = if i == 0 {
        let (l, stop) = bind(cfg.listen)?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        let _ = boot.main_addr.set(addr);
        (l, stop)
    } else {
        let addr = wait_for(&boot.main_addr, &stop).await?;
        bind(addr)?
    };
    let direct_port = if cfg.listen.port() == 0 {
        0
    } else {
        cfg.listen.port() as usize + 1 + i
    };
    let direct_port = u16::try_from(direct_port)
        .map_err(|_| format!("direct port {direct_port} is out of range"))?;
    let direct_addr = (cfg.listen.ip(), direct_port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or("bad listen address")?;
    let (direct, direct_stop) = bind(direct_addr)?;
    let direct_addr = direct.local_addr().map_err(|e| e.to_string())?;
    let _ = tx.send(BootMsg::Bound {
        shard: i,
        direct: direct_addr,
        peer_id,
    });
    let (addrs, peer_of_shard) = wait_for(&boot.table, &stop).await?;
    let svc = ServiceConfig {
        broker_id: cfg.broker_id,
        data_dir: cfg.data_dir.clone(),
        flush: cfg.flush,
        flush_interval_ms: cfg.flush_interval_ms,
        auto_create_topics: cfg.auto_create_topics,
        default_queues: cfg.default_queues,
        frame_limits: limits,
        session_timeout_ms: cfg.session_timeout_ms,
        lock_expiry_ms: cfg.lock_expiry_ms,
        delay: DelayRule::new(&cfg.delay_levels, cfg.delay_max_ms).map_err(|e| e.to_string())?,
        schedule_pending_max: cfg.schedule_pending_max,
        schedule_park_max_ms: cfg.schedule_park_max_ms,
        retention_check_interval_ms: cfg.retention_check_interval_ms,
        topics_max: cfg.topics_max,
        auto_create_topics_max: cfg.auto_create_topics_max,
        groups_max: cfg.groups_max,
        offsets_max: cfg.offsets_max,
        long_polls_max: cfg.long_polls_max,
        sql_filters_bytes_max: usize::try_from(cfg.sql_filters_mb.saturating_mul(1 << 20))
            .unwrap_or(usize::MAX),
        group_members_bytes_max: usize::try_from(cfg.group_members_mb.saturating_mul(1 << 20))
            .unwrap_or(usize::MAX),
        queues_max: cfg.queues_max,
        transaction_timeout_ms: cfg.transaction_timeout_ms,
        transaction_check_interval_ms: cfg.transaction_check_interval_ms,
        transaction_check_max: cfg.transaction_check_max,
        transaction_pending_max: cfg.transaction_pending_max,
        transaction_group_pending_max: cfg.transaction_group_pending_max,
        send_wait_max_ms: cfg.send_wait_max_ms,
        send_backlog_bytes_max: cfg.send_backlog_max_mb.saturating_mul(1 << 20),
        testing_panic_topic: cfg.testing_panic_topic.clone(),
        testing_topic_change_fault: cfg.testing_topic_change_fault.clone(),
        testing_fence_tell_delay_ms: cfg.testing_fence_tell_delay_ms,
    };
    let peers = Box::new(MeshPeers {
        senders,
        peer_of_shard: peer_of_shard.clone(),
    });
    let ctx = ShardCtx::new(
        i as u32,
        shards as u32,
        svc,
        store.clone(),
        topics,
        offsets,
        schedule,
        peers,
    );
    ctx.set_shard_addrs(addrs);
    // Every shard opened its store before the address table was complete.
    ctx.stamp_creations_after(boot.runs_max.load(Ordering::SeqCst));
    // Before any send or topic change can reach a queue.
    ctx.open_all_local_queues().await;
    if lowered > 0 {
        // Durable before anything is served: written later (with the next commit, or the
        // next periodic sync), a crash after producers refilled those offsets would find
        // the old ones again, within the queue's end by then, and the group would skip
        // the refill.
        ctx.sync_offsets()
            .await
            .map_err(|e| format!("syncing the lowered offsets of shard {i}: {e}"))?;
    }
    // Before a connection or a peer's deletion can reach them: an early commit would find
    // no half (`TransactionNotFound`), and a deletion's discard would miss the halves
    // rebuilt after it (the rebuilt list replaces the one in use).
    ctx.recover_transactions()
        .await
        .map_err(|e| format!("recovering the transactions of shard {i}: {e}"))?;
    let receivers = Rc::new(receivers);
    for (shard, &peer) in peer_of_shard.iter().enumerate() {
        if shard != i {
            spawn_mesh_receiver(ctx.clone(), receivers.clone(), peer);
        }
    }
    // Nothing is taken from a connection before every shard can answer its peers: a
    // request needing a shard still recovering would wait there, and its client be told
    // the shard did not answer while it still ran.
    // No time limit: a shard's rebuild takes as long as its unresolved transactions do.
    boot.recovered.fetch_add(1, Ordering::SeqCst);
    wait_until(&stop, None, || {
        (boot.recovered.load(Ordering::SeqCst) >= shards).then_some(())
    })
    .await?;
    if i == 0 {
        ctx.finish_undone_deletions();
    }
    // Before a member's heartbeat can reach a coordinator, on any shard: the epochs of
    // resets of earlier runs.
    ctx.publish_fences().await;
    boot.fences_told.fetch_add(1, Ordering::SeqCst);
    wait_until(&stop, None, || {
        (boot.fences_told.load(Ordering::SeqCst) >= shards).then_some(())
    })
    .await?;
    let read_budget = ReadBudget::new(limits.frame_bytes_max() as usize);
    let live = Rc::new(LiveConnections::default());
    for listener in [main_listener, direct] {
        let ctx = ctx.clone();
        let (budget, cap, live) = (read_budget.clone(), cap.clone(), live.clone());
        let settings = ConnSettings {
            limits,
            timeout_ms: cfg.conn_timeout_ms,
        };
        glommio::spawn_local(async move {
            accept_loop(ctx, listener, settings, budget, cap, live).await
        })
        .detach();
    }
    if cfg.flush == FlushMode::Async {
        let ctx = ctx.clone();
        let every = Duration::from_millis(cfg.flush_interval_ms.max(1));
        glommio::spawn_local(async move {
            while !ctx.is_stopping() {
                crate::io::sleep(every).await;
                if let Err(e) = ctx.sync_offsets().await {
                    crate::warn!("ringmq: shard {}: syncing offsets: {e}", ctx.id);
                }
            }
        })
        .detach();
    }
    glommio::spawn_local(ctx.clone().run_schedule()).detach();
    glommio::spawn_local(ctx.clone().run_transaction_checks()).detach();
    if let Some(hub) = &boot.metrics {
        glommio::spawn_local(ctx.clone().publish_metrics(hub.clone())).detach();
    }
    {
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            while !ctx.is_stopping() {
                crate::io::sleep(Duration::from_millis(GROUP_EXPIRY_CHECK_MS)).await;
                ctx.expire_members().await;
            }
        })
        .detach();
    }
    let _ = tx.send(BootMsg::Ready);
    while !stop.load(Ordering::SeqCst) {
        crate::io::sleep(Duration::from_millis(20)).await;
    }
    // Clean stop: refuse new work, let requests in flight finish, then flush everything.
    ctx.begin_stop();
    // The ports are free at once (a broker may start on them right after this one).
    main_stop.stop();
    direct_stop.stop();
    let started = Instant::now();
    while ctx.in_flight() > 0 && started.elapsed() < Duration::from_millis(STOP_DRAIN_MS) {
        crate::io::sleep(Duration::from_millis(5)).await;
    }
    ctx.stop_schedule().await;
    // The offsets are synced whether or not the store closed (a store that cannot take a
    // checkpoint still has its offsets to keep).
    let store_closed = store
        .close()
        .await
        .map_err(|e| format!("closing the store: {e}"));
    let offsets_synced = ctx
        .sync_offsets()
        .await
        .map_err(|e| format!("syncing offsets: {e}"));
    let closed = match (store_closed, offsets_synced) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
    };
    // Last, the connections, whether or not the store closed, so that their peers see
    // them close: their reading first (each writer writes what is queued, then closes),
    // then whatever is left.
    for how in [libc::SHUT_RD, libc::SHUT_RDWR] {
        live.shut_down_all(how);
        let started = Instant::now();
        while !live.is_empty() && started.elapsed() < Duration::from_millis(CONNS_CLOSE_MS) {
            crate::io::sleep(Duration::from_millis(5)).await;
        }
    }
    closed
}
