//! The push consumer's options, their RocketMQ-like defaults and the checks they get.

use super::*;

pub const PULL_BATCH_MAX_DEFAULT: u32 = 32;
/// The broker's own cap on one pull.
pub const PULL_BATCH_MAX_LIMIT: u32 = 1024;
pub const PULLS_IN_FLIGHT_MAX_DEFAULT: usize = 8;
pub const PULLS_IN_FLIGHT_MAX_LIMIT: usize = 64;
pub const PULL_WAIT_MS_DEFAULT: u64 = 15_000;
pub const CONSUME_THREADS_DEFAULT: usize = 20;
pub const CONSUME_THREADS_MAX: usize = 1024;
pub const CONSUME_BATCH_MAX_DEFAULT: usize = 1;
pub const CONSUME_BATCH_MAX_LIMIT: usize = 1024;
pub const CACHED_MESSAGES_MAX_DEFAULT: usize = 1000;
pub const CACHED_BYTES_MAX_DEFAULT: u64 = 100 << 20;
pub const CACHED_SPAN_MAX_DEFAULT: u64 = 2000;
pub const FLOW_RETRY_MS_DEFAULT: u64 = 50;
pub const PULL_ERROR_BACKOFF_MS_DEFAULT: u64 = 1000;
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 3000;
/// The broker's default session timeout (a consumer takes the broker's own at start).
pub const SESSION_TIMEOUT_MS_DEFAULT: u64 = 10_000;
pub const REBALANCE_INTERVAL_MS_DEFAULT: u64 = 20_000;
pub const LOCK_RENEW_MS_DEFAULT: u64 = 20_000;
pub const LOCK_VALID_MS_DEFAULT: u64 = 30_000;
pub const LOCK_RETRY_MS_DEFAULT: u64 = 500;
pub const COMMIT_INTERVAL_MS_DEFAULT: u64 = 1000;
pub const MAX_RECONSUME_TIMES_DEFAULT: u32 = 16;
pub const SUSPEND_MS_DEFAULT: u64 = 1000;
pub const RECONSUME_DELAY_MS_DEFAULT: u64 = 1000;
pub const SHUTDOWN_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Most topics one consumer subscribes to (the broker's limit per member).
pub const SUBSCRIPTIONS_MAX: usize = 256;

/// The broker's lock expiry (`broker::groups::LOCK_EXPIRY_MS_DEFAULT`, broker-only): a
/// lock this client still trusts must not have expired there.
pub(super) const BROKER_LOCK_EXPIRY_MS: u64 = BROKER_LOCK_EXPIRY_MS_DEFAULT;
/// The broker's default lock expiry (a broker tells its own in the handshake).
pub const BROKER_LOCK_EXPIRY_MS_DEFAULT: u64 = 60_000;
/// Upper bound of every interval option: a typo must not become a hang.
const INTERVAL_MS_MAX: u64 = 24 * 3600 * 1000;
/// How often an orderly queue whose lock is not valid looks again.
pub(super) const LOCK_WAIT_MS: u64 = 100;

const _: () = assert!(LOCK_RENEW_MS_DEFAULT < LOCK_VALID_MS_DEFAULT);
const _: () = assert!(LOCK_VALID_MS_DEFAULT < BROKER_LOCK_EXPIRY_MS);
const _: () = assert!(3 * HEARTBEAT_INTERVAL_MS_DEFAULT <= SESSION_TIMEOUT_MS_DEFAULT);
const _: () = assert!(PULL_BATCH_MAX_DEFAULT <= PULL_BATCH_MAX_LIMIT);
const _: () = assert!(CONSUME_THREADS_DEFAULT <= CONSUME_THREADS_MAX);

/// How a push consumer consumes. Defaults follow RocketMQ (see the `*_DEFAULT` constants);
/// the consume mode is chosen by the listener registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushConsumerOptions {
    pub message_model: MessageModel,
    pub strategy: AllocateStrategy,
    /// Used for a queue the group has no committed offset for.
    pub consume_from: ConsumeFrom,
    /// Messages asked for per pull.
    pub pull_batch_max: u32,
    /// Most pulls of one queue in flight at once. While the broker reports more messages
    /// past the consumer's position than one pull brings, the next pulls go out before
    /// the earlier answers arrive (counted against `cached_messages_max` as full
    /// batches), so a consumer catching up is not held to one round trip per batch.
    /// 1 pulls one batch at a time, as upstream.
    pub pulls_in_flight_max: usize,
    /// How long the broker may hold a pull that finds nothing (long polling).
    pub pull_wait_ms: u64,
    /// Listener calls running at once, over all queues.
    pub consume_threads: usize,
    /// Messages per listener call.
    pub consume_batch_max: usize,
    /// Run the listener on the runtime's own task instead of the consume threads. For
    /// listeners that never block (no waiting on I/O or long-held locks): it saves the two
    /// thread hand-offs of every call. A listener that blocks with this set stalls a
    /// runtime worker thread.
    pub listener_non_blocking: bool,
    /// A queue is not pulled while it caches more messages than this...
    pub cached_messages_max: usize,
    /// ...or more bytes than this...
    pub cached_bytes_max: u64,
    /// ...or (concurrent mode) while its smallest and largest cached offsets are further
    /// apart than this (one slow message must not let the rest run far ahead).
    pub cached_span_max: u64,
    /// Pause before looking again at a queue paused by flow control.
    pub flow_retry_ms: u64,
    /// Pause after a failed pull or failed start-position lookup.
    pub pull_error_backoff_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// The broker's session timeout (its `session_timeout_ms`): replaced by the broker's
    /// own, told in its handshake, at the start and after each reconnect (never longer
    /// than before; the heartbeat interval is capped at a third of it, and
    /// `lock_valid_ms` and `lock_renew_ms` are fitted to the broker's lock expiry the
    /// same way: these fields are where the running consumer's timings start). Orderly consumption pauses when the last acknowledged heartbeat is older than
    /// this minus one heartbeat interval, since the broker may have dropped the member and
    /// its locks.
    pub session_timeout_ms: u64,
    /// Period of the safety-net assignment query (notifications are the fast path).
    pub rebalance_interval_ms: u64,
    /// Orderly: period of lock renewals.
    pub lock_renew_ms: u64,
    /// Orderly: a lock not confirmed for this long is not used (below the broker's 60 s
    /// expiry, above `lock_renew_ms`).
    pub lock_valid_ms: u64,
    /// Orderly: period of attempts to lock assigned queues held by someone else.
    pub lock_retry_ms: u64,
    pub commit_interval_ms: u64,
    /// Clustering: retries of a failing message before the broker puts it on the group's
    /// dead-letter topic (`%DLQ%<group>`) instead of its retry topic. Broadcasting retries
    /// locally without end.
    pub max_reconsume_times: u32,
    /// Orderly: how long a queue waits after `SuspendCurrentQueueAMoment`.
    pub suspend_ms: u64,
    /// Concurrent: delay before a failed message the broker did not take back (and, in
    /// broadcasting mode, any failed message) is delivered again locally.
    pub reconsume_delay_ms: u64,
    /// Shutdown waits this long for running listeners (orderly ones too) before committing
    /// what finished and leaving the group, which frees the member's queue locks: an
    /// orderly call still running then may overlap the next owner's first calls.
    pub shutdown_timeout_ms: u64,
    /// Broadcasting: directory of the local offsets files (default `~/.ringmq/offsets`,
    /// or `<temp dir>/ringmq-offsets` without a home directory). The file is per client
    /// id and group: give the consumer a stable `client_id` to resume after a restart.
    pub offsets_dir: Option<PathBuf>,
}

impl Default for PushConsumerOptions {
    fn default() -> Self {
        PushConsumerOptions {
            message_model: MessageModel::Clustering,
            strategy: AllocateStrategy::Averagely,
            consume_from: ConsumeFrom::LastOffset,
            pull_batch_max: PULL_BATCH_MAX_DEFAULT,
            pulls_in_flight_max: PULLS_IN_FLIGHT_MAX_DEFAULT,
            pull_wait_ms: PULL_WAIT_MS_DEFAULT,
            consume_threads: CONSUME_THREADS_DEFAULT,
            consume_batch_max: CONSUME_BATCH_MAX_DEFAULT,
            listener_non_blocking: false,
            cached_messages_max: CACHED_MESSAGES_MAX_DEFAULT,
            cached_bytes_max: CACHED_BYTES_MAX_DEFAULT,
            cached_span_max: CACHED_SPAN_MAX_DEFAULT,
            flow_retry_ms: FLOW_RETRY_MS_DEFAULT,
            pull_error_backoff_ms: PULL_ERROR_BACKOFF_MS_DEFAULT,
            heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS_DEFAULT,
            session_timeout_ms: SESSION_TIMEOUT_MS_DEFAULT,
            rebalance_interval_ms: REBALANCE_INTERVAL_MS_DEFAULT,
            lock_renew_ms: LOCK_RENEW_MS_DEFAULT,
            lock_valid_ms: LOCK_VALID_MS_DEFAULT,
            lock_retry_ms: LOCK_RETRY_MS_DEFAULT,
            commit_interval_ms: COMMIT_INTERVAL_MS_DEFAULT,
            max_reconsume_times: MAX_RECONSUME_TIMES_DEFAULT,
            suspend_ms: SUSPEND_MS_DEFAULT,
            reconsume_delay_ms: RECONSUME_DELAY_MS_DEFAULT,
            shutdown_timeout_ms: SHUTDOWN_TIMEOUT_MS_DEFAULT,
            offsets_dir: None,
        }
    }
}

impl PushConsumerOptions {
    /// These options with their session and lock timings fitted to the broker's own (told
    /// in its handshake): heartbeats come at least three times per session, locks are
    /// trusted for at most half the broker's lock expiry and renewed well before.
    pub(crate) fn fitted_to(&self, broker: &crate::client::BrokerInfo) -> PushConsumerOptions {
        let mut o = self.clone();
        o.session_timeout_ms = broker.session_timeout_ms.max(3);
        o.heartbeat_interval_ms = o.heartbeat_interval_ms.min(o.session_timeout_ms / 3).max(1);
        o.lock_valid_ms = o.lock_valid_ms.min(broker.lock_expiry_ms / 2).max(2);
        o.lock_renew_ms = o.lock_renew_ms.min(o.lock_valid_ms * 2 / 3).max(1);
        o
    }

    /// Checks every field; [`PushConsumer::new`] calls it.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(ClientError::InvalidArgument(what));
        for (name, ms) in [
            ("pull_wait_ms", self.pull_wait_ms),
            ("flow_retry_ms", self.flow_retry_ms),
            ("pull_error_backoff_ms", self.pull_error_backoff_ms),
            ("heartbeat_interval_ms", self.heartbeat_interval_ms),
            ("session_timeout_ms", self.session_timeout_ms),
            ("rebalance_interval_ms", self.rebalance_interval_ms),
            ("lock_renew_ms", self.lock_renew_ms),
            ("lock_valid_ms", self.lock_valid_ms),
            ("lock_retry_ms", self.lock_retry_ms),
            ("commit_interval_ms", self.commit_interval_ms),
            ("suspend_ms", self.suspend_ms),
            ("reconsume_delay_ms", self.reconsume_delay_ms),
            ("shutdown_timeout_ms", self.shutdown_timeout_ms),
        ] {
            if ms == 0 || ms > INTERVAL_MS_MAX {
                return bad(format!("{name} = {ms}: must be in 1..={INTERVAL_MS_MAX}"));
            }
        }
        if self.pull_wait_ms > u64::from(u32::MAX) {
            return bad(format!(
                "pull_wait_ms = {}: must fit the wire's u32",
                self.pull_wait_ms
            ));
        }
        if self.pull_batch_max == 0 || self.pull_batch_max > PULL_BATCH_MAX_LIMIT {
            return bad(format!(
                "pull_batch_max = {}: must be in 1..={PULL_BATCH_MAX_LIMIT}",
                self.pull_batch_max
            ));
        }
        if self.pulls_in_flight_max == 0 || self.pulls_in_flight_max > PULLS_IN_FLIGHT_MAX_LIMIT {
            return bad(format!(
                "pulls_in_flight_max = {}: must be in 1..={PULLS_IN_FLIGHT_MAX_LIMIT}",
                self.pulls_in_flight_max
            ));
        }
        if self.consume_threads == 0 || self.consume_threads > CONSUME_THREADS_MAX {
            return bad(format!(
                "consume_threads = {}: must be in 1..={CONSUME_THREADS_MAX}",
                self.consume_threads
            ));
        }
        if self.consume_batch_max == 0 || self.consume_batch_max > CONSUME_BATCH_MAX_LIMIT {
            return bad(format!(
                "consume_batch_max = {}: must be in 1..={CONSUME_BATCH_MAX_LIMIT}",
                self.consume_batch_max
            ));
        }
        if self.cached_messages_max == 0 || self.cached_bytes_max == 0 || self.cached_span_max == 0
        {
            return bad(
                "cached_messages_max, cached_bytes_max and cached_span_max must be positive".into(),
            );
        }
        if self.lock_renew_ms >= self.lock_valid_ms || self.lock_valid_ms >= BROKER_LOCK_EXPIRY_MS {
            return bad(format!(
                "lock_renew_ms ({}) < lock_valid_ms ({}) < the broker's lock expiry \
                 ({BROKER_LOCK_EXPIRY_MS}) must hold, or a lock could expire while in use",
                self.lock_renew_ms, self.lock_valid_ms
            ));
        }
        if self.heartbeat_interval_ms >= self.session_timeout_ms {
            return bad(format!(
                "heartbeat_interval_ms ({}) must be below session_timeout_ms ({})",
                self.heartbeat_interval_ms, self.session_timeout_ms
            ));
        }
        Ok(())
    }

    pub(super) fn flow_limits(&self, mode: ConsumeMode) -> FlowLimits {
        FlowLimits {
            messages_max: self.cached_messages_max,
            bytes_max: self.cached_bytes_max,
            span_max: match mode {
                ConsumeMode::Concurrent => Some(self.cached_span_max),
                ConsumeMode::Orderly => None,
            },
        }
    }
}

/// The session and lock timings a running consumer follows: fitted to the broker's at its
/// start, and again after each handshake (a reconnect, perhaps to the broker restarted
/// with shorter ones), never longer than before. A member that kept its first ones after
/// the broker's session or lock expiry was shortened counted itself a member, and its
/// locks as held, after the broker had dropped them, and consumed an ordered queue beside
/// its next owner.
pub(super) struct Timings {
    session_timeout_ms: AtomicU64,
    heartbeat_interval_ms: AtomicU64,
    lock_valid_ms: AtomicU64,
    lock_renew_ms: AtomicU64,
}

impl Timings {
    /// The timings of options already fitted to the broker.
    pub(super) fn new(fitted: &PushConsumerOptions) -> Timings {
        Timings {
            session_timeout_ms: AtomicU64::new(fitted.session_timeout_ms),
            heartbeat_interval_ms: AtomicU64::new(fitted.heartbeat_interval_ms),
            lock_valid_ms: AtomicU64::new(fitted.lock_valid_ms),
            lock_renew_ms: AtomicU64::new(fitted.lock_renew_ms),
        }
    }

    /// Fits them to the broker's told in its latest handshake (`broker`), from `options`:
    /// each only ever goes down.
    pub(super) fn refit(&self, options: &PushConsumerOptions, broker: &crate::client::BrokerInfo) {
        let fitted = options.fitted_to(broker);
        // The periods before the spans they fit in: a reader between two stores sees a
        // period no longer than its span.
        let pairs = [
            (&self.heartbeat_interval_ms, fitted.heartbeat_interval_ms),
            (&self.lock_renew_ms, fitted.lock_renew_ms),
            (&self.session_timeout_ms, fitted.session_timeout_ms),
            (&self.lock_valid_ms, fitted.lock_valid_ms),
        ];
        for (now, fitted) in pairs {
            now.fetch_min(fitted, Ordering::SeqCst);
        }
    }

    pub(super) fn session_timeout_ms(&self) -> u64 {
        self.session_timeout_ms.load(Ordering::SeqCst)
    }
    pub(super) fn heartbeat_interval_ms(&self) -> u64 {
        self.heartbeat_interval_ms.load(Ordering::SeqCst)
    }
    pub(super) fn lock_valid_ms(&self) -> u64 {
        self.lock_valid_ms.load(Ordering::SeqCst)
    }
    pub(super) fn lock_renew_ms(&self) -> u64 {
        self.lock_renew_ms.load(Ordering::SeqCst)
    }
}
