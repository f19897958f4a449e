//! The broker's options ([`BrokerConfig`], the same keys as `ringmq-broker`'s flags and
//! TOML file) and their defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::conn;
use super::TopicChangeFault;
use crate::log::FlushMode;

/// Default of `--topics-max`.
pub const TOPICS_MAX_DEFAULT: usize = 4096;
/// Default of `--auto-create-topics-max`.
pub const AUTO_CREATE_TOPICS_MAX_DEFAULT: usize = 1024;
/// Default of `--queues-max`.
pub const QUEUES_MAX_DEFAULT: usize = 30_000;
/// Default of `--groups-max`.
pub const GROUPS_MAX_DEFAULT: usize = 4096;
/// Default of `--offsets-max`.
pub const OFFSETS_MAX_DEFAULT: usize = 1_000_000;
/// Default of `--long-polls-max`.
pub const LONG_POLLS_MAX_DEFAULT: usize = 65_536;
/// Default of `--sql-filters-mb`.
pub const SQL_FILTERS_MB_DEFAULT: u64 = 64;
/// Default of `--group-members-mb`.
pub const GROUP_MEMBERS_MB_DEFAULT: u64 = 256;
/// Options of a broker; the same keys work in the TOML file (`--config`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct BrokerConfig {
    /// Address of the shared native port.
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Number of shards (0: one per CPU listed in `cpus`, else the count `data_dir` was
    /// created with, else one per core).
    pub shards: usize,
    pub flush: FlushMode,
    pub flush_interval_ms: u64,
    pub auto_create_topics: bool,
    /// Queues of an auto-created topic.
    pub default_queues: u32,
    pub segment_bytes: u64,
    pub retention_hours: u64,
    /// 0: no size limit.
    pub retention_bytes_max: u64,
    pub frame_bytes_max: u32,
    pub broker_id: u32,
    /// A group member that sends no heartbeat for this long leaves its group.
    pub session_timeout_ms: u64,
    /// A queue lock of ordered consumption not renewed for this long is free.
    pub lock_expiry_ms: u64,
    /// Delay levels, level 1 first (RocketMQ's `messageDelayLevel`).
    pub delay_levels: String,
    /// The longest delay a message may ask for.
    pub delay_max_ms: u64,
    /// Most delayed messages one shard holds.
    pub schedule_pending_max: usize,
    /// Most client connections of the whole broker (0: 10,000, lowered to what the
    /// open-file limit allows).
    pub connections_max: usize,
    /// A connection silent this long before its first frame, or in the middle of a frame,
    /// or not taking what is written to it, is closed.
    pub conn_timeout_ms: u64,
    /// How often retention looks for segments to delete (and the schedule for held messages
    /// that keep it from doing so).
    pub retention_check_interval_ms: u64,
    /// Sends are refused with `DiskFull` while the data directory's filesystem has less
    /// free space than this many MiB.
    pub disk_free_min_mb: u64,
    /// How long a delayed message waits for a missing target topic before it goes to
    /// `%UNDELIVERABLE%`.
    pub schedule_park_max_ms: u64,
    /// MiB of each shard's newest log writes kept in memory: a pull within them is served
    /// from memory, one further back from the disk (0: every pull reads the disk). Lowered
    /// at start so that all shards together hold at most half of the machine's memory (or cgroup limit).
    pub tail_cache_mb: u64,
    /// Most topics the broker holds (retry and dead-letter topics included).
    pub topics_max: usize,
    /// Most topics sends may create (auto-create).
    pub auto_create_topics_max: usize,
    /// Most consumer groups one shard coordinates, and most groups whose committed offsets
    /// one shard keeps.
    pub groups_max: usize,
    /// Most committed offsets (entries of group, topic and queue) one shard keeps.
    pub offsets_max: usize,
    /// Most long polls, and requests waiting for room for their answers, one shard holds
    /// at a time (each about 6 KiB); past it a request that would wait is refused
    /// `BrokerBusy`.
    pub long_polls_max: usize,
    /// MiB of parsed SQL92 filters one shard holds (cached, or held by waiting pulls); a
    /// pull with a new expression past it is refused `BrokerBusy`.
    pub sql_filters_mb: u64,
    /// MiB of consumer-group members (client ids, subscriptions, strategies) one shard
    /// coordinates; a heartbeat that would add past it is refused.
    pub group_members_mb: u64,
    /// Most queues of all topics together (each maps a file while in use); lowered at
    /// start-up to half the kernel's `vm.max_map_count`.
    pub queues_max: usize,
    /// A consume-queue file unused this long is unmapped and closed until its next use.
    pub index_idle_close_ms: u64,
    /// A half message this old without an outcome is asked about (check-back).
    pub transaction_timeout_ms: u64,
    /// How often an unresolved half message is asked about.
    pub transaction_check_interval_ms: u64,
    /// Checks answered "unknown" before an unresolved half message is discarded (checks no
    /// checker answers do not count).
    pub transaction_check_max: u32,
    /// Most unresolved half messages one shard holds (transactional sends past it get
    /// `LimitReached`).
    pub transaction_pending_max: usize,
    /// Most unresolved half messages of one producer group on one shard (its transactional
    /// sends past it get `LimitReached`; other groups' go on).
    pub transaction_group_pending_max: usize,
    /// Flow control: sends get `BrokerBusy` while a shard's oldest owed acknowledgement has
    /// waited longer than this for the disk.
    pub send_wait_max_ms: u64,
    /// Flow control: sends get `BrokerBusy` while more than this many MiB appended on a
    /// shard wait for the disk.
    pub send_backlog_max_mb: u64,
    /// Testing: every log write waits this long first (a slow disk), in µs.
    pub testing_write_delay_us: u64,
    /// Testing: the shard asked to create a topic of this name panics (a flag only, not a
    /// key of the TOML file).
    #[serde(skip)]
    pub testing_panic_topic: Option<String>,
    /// Testing: the shards other than 0 mishandle the changes to this topic that shard 0
    /// tells them of (a field only, for tests that start the broker in their process).
    #[serde(skip)]
    pub testing_topic_change_fault: Option<(String, TopicChangeFault)>,
    /// Testing: a shard whose fence refused a commit waits this long (ms) before telling
    /// the group's coordinator (a field only, for tests that start the broker in their
    /// process).
    #[serde(skip)]
    pub testing_fence_tell_delay_ms: u64,
    /// A shard with nothing to do polls this long before it parks its thread, in µs (0:
    /// park at once). Spinning saves the park/wake cost under load but keeps the core busy.
    pub spin_before_park_us: u64,
    /// CPUs for the shards, shard i on the i-th listed (`"1"`, `"0-3,8"`); with no
    /// `shards`, one shard per CPU listed. Empty: one shard per CPU the process may use
    /// when there are enough (with fewer shards than CPUs, those taking the data disk's
    /// completion interrupts first), unpinned otherwise (also under a CPU quota smaller
    /// than the affinity).
    pub cpus: String,
    /// Serve `GET /metrics` (Prometheus text format) here; off when `None`.
    pub metrics_listen: Option<SocketAddr>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7800)),
            data_dir: PathBuf::from("./data"),
            shards: 0,
            flush: FlushMode::Async,
            flush_interval_ms: 500,
            auto_create_topics: true,
            default_queues: 8,
            segment_bytes: 1 << 30,
            retention_hours: 72,
            retention_bytes_max: 0,
            frame_bytes_max: crate::protocol::FRAME_BYTES_MAX_DEFAULT,
            broker_id: 0,
            session_timeout_ms: crate::broker::groups::SESSION_TIMEOUT_MS_DEFAULT,
            lock_expiry_ms: crate::broker::groups::LOCK_EXPIRY_MS_DEFAULT,
            delay_levels: crate::protocol::delay::DELAY_LEVELS_DEFAULT.to_owned(),
            delay_max_ms: crate::protocol::delay::DELAY_MAX_MS_DEFAULT,
            schedule_pending_max: crate::broker::schedule::SCHEDULE_PENDING_MAX_DEFAULT,
            connections_max: 0,
            conn_timeout_ms: conn::CONN_TIMEOUT_MS_DEFAULT,
            retention_check_interval_ms: 60_000,
            disk_free_min_mb: crate::store::DISK_FREE_MIN_BYTES_DEFAULT >> 20,
            schedule_park_max_ms: crate::broker::schedule::PARK_MAX_MS,
            tail_cache_mb: (crate::log::TAIL_CACHE_BYTES_DEFAULT >> 20) as u64,
            topics_max: TOPICS_MAX_DEFAULT,
            auto_create_topics_max: AUTO_CREATE_TOPICS_MAX_DEFAULT,
            groups_max: GROUPS_MAX_DEFAULT,
            offsets_max: OFFSETS_MAX_DEFAULT,
            long_polls_max: LONG_POLLS_MAX_DEFAULT,
            sql_filters_mb: SQL_FILTERS_MB_DEFAULT,
            group_members_mb: GROUP_MEMBERS_MB_DEFAULT,
            queues_max: QUEUES_MAX_DEFAULT,
            index_idle_close_ms: crate::store::INDEX_IDLE_CLOSE_MS_DEFAULT,
            transaction_timeout_ms: crate::broker::transaction::TRANSACTION_TIMEOUT_MS_DEFAULT,
            transaction_check_interval_ms:
                crate::broker::transaction::TRANSACTION_CHECK_INTERVAL_MS_DEFAULT,
            transaction_check_max: crate::broker::transaction::TRANSACTION_CHECK_MAX_DEFAULT,
            transaction_pending_max: crate::broker::transaction::TRANSACTION_PENDING_MAX_DEFAULT,
            transaction_group_pending_max:
                crate::broker::transaction::TRANSACTION_GROUP_PENDING_MAX_DEFAULT,
            send_wait_max_ms: crate::broker::SEND_WAIT_MAX_MS_DEFAULT,
            send_backlog_max_mb: crate::broker::SEND_BACKLOG_BYTES_MAX_DEFAULT >> 20,
            testing_write_delay_us: 0,
            testing_panic_topic: None,
            testing_topic_change_fault: None,
            testing_fence_tell_delay_ms: 0,
            spin_before_park_us: 0,
            cpus: String::new(),
            metrics_listen: None,
        }
    }
}
