//! [`PushConsumer`]: a member of a consumer group that pulls its queues and calls a
//! listener, RocketMQ's push consumer. "Push" is a pull loop inside the client.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ringmq::client::ClientError> {
//! use ringmq::client::{ClientConfig, ConsumeStatus, PushConsumer, PushConsumerOptions};
//! let consumer = PushConsumer::new(
//!     ClientConfig::new("127.0.0.1:7800"),
//!     "billing",
//!     PushConsumerOptions::default(),
//! )?;
//! consumer.subscribe("orders", "TagA || TagB")?;
//! consumer.register_concurrent(|messages| {
//!     for m in messages {
//!         println!("{:?}", m.body());
//!     }
//!     ConsumeStatus::Success
//! })?;
//! consumer.start().await?;
//! // ...
//! consumer.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! How it runs (tasks on the caller's tokio runtime):
//! - **membership**: a `GroupHeartbeat` every `heartbeat_interval_ms` on the bootstrap
//!   connection (the broker ties the member to it), answered by the member's assignment;
//!   on a pushed `RebalanceNotify` for the group it asks for the assignment at once
//!   (`QueryAssignment`), and again every `rebalance_interval_ms` as a safety net.
//! - **controller**: applies each assignment: starts a pull task for each new queue and
//!   stops the queues given up (their offsets committed first). In orderly clustering mode
//!   it locks new queues first (`LockBatch`), starts only the locked ones, retries the
//!   others every `lock_retry_ms`, renews held locks every `lock_renew_ms`, and unlocks a
//!   queue only after its task stopped and its offset was committed.
//! - **one pull task per queue**: finds the start position (committed offset, else
//!   `consume_from`), then long-polls batches, pausing while the queue's cache is over the
//!   flow-control limits. Concurrent mode hands each batch to the listener pool at once;
//!   orderly mode has a second task per queue that feeds the listener one batch at a time,
//!   in offset order.
//! - **committer**: commits every queue's commit point each `commit_interval_ms` (to the
//!   broker, or to the local file in broadcasting mode).
//!
//! `shutdown` stops the committer and the queues (waiting for their listener calls,
//! committing, unlocking), then the heartbeats, then unregisters: a member must stay one
//! while its calls end, or the broker would drop it and its locks after the session timeout
//! and another member would take an orderly queue under a call still running.
//!
//! Listeners are plain closures `Fn(&[Message]) -> status`, run on the consumer's own
//! threads (up to `consume_threads`, started as needed; see `workers.rs` for why not
//! tokio's blocking pool), at most `consume_threads` calls at once over all queues: a
//! listener may block (a database call) without stalling the runtime. With
//! `listener_non_blocking` a listener that never blocks runs on the runtime's tasks
//! instead, saving the thread hand-offs. A listener that panics counts as a failed
//! attempt (`ReconsumeLater` / `SuspendCurrentQueueAMoment`).
//!
//! Delivery is at least once. The commit point of a queue is the smallest offset still in
//! flight, so a crash or a rebalance re-delivers what was being consumed and never skips.
//! A message that fails is never skipped. In clustering mode, concurrent consumption sends
//! it back to the broker, which stores it on the group's retry topic (delivered again after
//! the delay of its attempt) or, after `max_reconsume_times` retries, on the group's
//! dead-letter topic (`%DLQ%<group>`; counted in [`ConsumerStats`]); orderly consumption
//! suspends the queue for `suspend_ms` and retries in place, then sends each message that
//! failed more than `max_reconsume_times` times (counted per message) to the dead-letter
//! topic, in offset order. What the broker does not take (a
//! failed send-back), and every failure in broadcasting mode (no shared retry topic), is
//! consumed again here after `reconsume_delay_ms` (orderly: `suspend_ms`), for as long as it
//! fails, the committed offset staying below it.
//!
//! Ordered consumption never runs a listener on a queue without a valid lock: the lock was
//! confirmed within `lock_valid_ms`, on the bootstrap connection that is still open (the
//! broker releases a member's locks when that connection closes), and the last heartbeat
//! acknowledged is younger than `session_timeout_ms - heartbeat_interval_ms` (the broker
//! drops a silent member and its locks after its session timeout).

mod local_offsets;
mod options;
mod pipeline;
mod queue;
mod rebalance;
mod start;
mod tracker;
mod workers;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use super::config::ClientConfig;
use super::error::{ClientError, Result};
use super::group::{
    check_group, AllocateStrategy, ConsumeMode, MemberSpec, MessageModel, SubscriptionExpression,
    CLIENT_ID_BYTES_MAX,
};
use super::message::{check_topic, Message};
use super::session::Client;
use super::tag_filter::MessageSelector;

use local_offsets::LocalOffsets;
use rebalance::{commit_loop, membership_loop, Controller};
use tracker::{FlowLimits, OffsetTracker};
use workers::Workers;

#[cfg(test)]
use options::BROKER_LOCK_EXPIRY_MS;
use options::LOCK_WAIT_MS;
pub use options::*;

/// Where a queue starts when the group has no committed offset for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsumeFrom {
    /// The queue's end at that moment: only messages stored from then on. A queue made
    /// after the consumer started (a topic its first send created, queues a topic update
    /// added) starts at its first message instead: everything in it was sent since.
    #[default]
    LastOffset,
    /// The queue's first message still kept.
    FirstOffset,
    /// The first message stored at or after this time (ms since the Unix epoch).
    Timestamp(i64),
}

/// A concurrent listener's verdict on a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeStatus {
    Success,
    /// Consume again later: clustering sends each message back to the group's retry topic
    /// (then DLQ); broadcasting, or a refused send-back, redelivers after `reconsume_delay_ms`.
    ReconsumeLater,
}

/// An orderly listener's verdict on a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderlyStatus {
    Success,
    /// Stop the queue for `suspend_ms`, then deliver the same batch again.
    SuspendCurrentQueueAMoment,
}

/// A listener of concurrent consumption.
pub type ConcurrentListener = Arc<dyn Fn(&[Message]) -> ConsumeStatus + Send + Sync>;
/// A listener of ordered consumption.
pub type OrderlyListener = Arc<dyn Fn(&[Message]) -> OrderlyStatus + Send + Sync>;
/// Either listener, by its status type.
type AnyListener<S> = Arc<dyn Fn(&[Message]) -> S + Send + Sync>;

#[derive(Clone)]
enum Listener {
    Concurrent(ConcurrentListener),
    Orderly(OrderlyListener),
}

/// One queue of a topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageQueue {
    pub topic: String,
    pub queue_id: u32,
}

impl MessageQueue {
    pub fn new(topic: impl Into<String>, queue_id: u32) -> MessageQueue {
        MessageQueue {
            topic: topic.into(),
            queue_id,
        }
    }
}

/// Counters of a running consumer, since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Messages the listener finished with success.
    pub consumed: u64,
    /// Failed attempts (a message of a failed batch counts once per attempt).
    pub retried: u64,
    /// Failed messages the broker took back (to the retry or the dead-letter topic).
    pub sent_back: u64,
    /// Of those, messages that went to the dead-letter topic (`%DLQ%<group>`).
    pub dead_lettered: u64,
    /// Pulls put off by flow control.
    pub flow_pauses: u64,
    /// Pulls that failed (timeouts, broken connections, broker errors).
    pub pull_errors: u64,
    /// Pulls sent while another pull of the same queue was in flight (pipelining).
    pub pulls_ahead: u64,
    /// Answers of pulls sent ahead that were thrown away because an earlier answer
    /// ended short of where they started.
    pub pulls_discarded: u64,
    /// Commits of a queue's position that failed (to the broker, or writes of the local
    /// offsets file in broadcasting). The position stays uncommitted and is committed by
    /// the next try; a consumer that stops meanwhile leaves its queues to be consumed again
    /// from the older position (at least once).
    pub commit_errors: u64,
}

#[derive(Default)]
struct Counters {
    consumed: AtomicU64,
    retried: AtomicU64,
    sent_back: AtomicU64,
    dead_lettered: AtomicU64,
    flow_pauses: AtomicU64,
    pull_errors: AtomicU64,
    pulls_ahead: AtomicU64,
    pulls_discarded: AtomicU64,
    commit_errors: AtomicU64,
}

fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

/// What is set up before `start`.
#[derive(Default)]
struct Setup {
    /// topic → (expression as given, parsed).
    subscriptions: BTreeMap<String, MessageSelector>,
    listener: Option<Listener>,
    /// Taken by a start (under way or done): a subscription or listener set after the
    /// start copied them would be answered `Ok` and never used.
    taken: bool,
}

/// The setup taken by a start under way; given back if the start fails or is dropped.
struct SetupTaken<'a> {
    setup: &'a Mutex<Setup>,
    kept: bool,
}

impl Drop for SetupTaken<'_> {
    fn drop(&mut self) {
        if !self.kept {
            lock(self.setup).taken = false;
        }
    }
}

enum Lifecycle {
    New,
    Running(Running),
    Stopped,
}

/// A push consumer: see the module documentation. Configure it (`subscribe`, one
/// `register_*`), then `start` it; `shutdown` leaves the group cleanly. Dropped without
/// `shutdown` inside a tokio runtime, it shuts down in a task of its own (errors logged;
/// its unregister names the client id, so await `shutdown` before starting another
/// consumer of the group with the same id); outside one, it stops its tasks and the broker
/// drops the member when its session ends.
pub struct PushConsumer {
    config: ClientConfig,
    group: String,
    options: PushConsumerOptions,
    setup: Mutex<Setup>,
    lifecycle: tokio::sync::Mutex<Lifecycle>,
    /// Set by `start`, for the observers (`assigned_queues`, `stats`).
    shared: Mutex<Option<Arc<Shared>>>,
}

impl std::fmt::Debug for PushConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushConsumer")
            .field("group", &self.group)
            .field("client_id", &self.config.client_id)
            .field("options", &self.options)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks (listeners run outside them); a poisoned
    // one still holds valid data.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Refuses to change `setup` once a start took it.
fn check_not_started(setup: &Setup, what: &str) -> Result<()> {
    if setup.taken {
        return Err(ClientError::InvalidArgument(format!(
            "{what} before start: this consumer has started"
        )));
    }
    Ok(())
}

impl PushConsumer {
    /// A consumer of `group`; checks the configuration, connects nothing yet.
    pub fn new(
        config: ClientConfig,
        group: impl Into<String>,
        options: PushConsumerOptions,
    ) -> Result<PushConsumer> {
        let group = group.into();
        config.validate()?;
        check_group(&group)?;
        if config.client_id.is_empty() || config.client_id.len() > CLIENT_ID_BYTES_MAX {
            return Err(ClientError::InvalidArgument(format!(
                "client id {:?}: a group member's id is 1 to {CLIENT_ID_BYTES_MAX} bytes",
                config.client_id
            )));
        }
        options.validate()?;
        Ok(PushConsumer {
            config,
            group,
            options,
            setup: Mutex::new(Setup::default()),
            lifecycle: tokio::sync::Mutex::new(Lifecycle::New),
            shared: Mutex::new(None),
        })
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    pub fn options(&self) -> &PushConsumerOptions {
        &self.options
    }

    /// Subscribes to `topic` with a tag expression: `*` for every message, or tags joined
    /// by `||` (`TagA || TagB`). A bad expression is refused here with a clear error.
    /// Subscribing to a topic again replaces its expression. Only before `start`.
    pub fn subscribe(&self, topic: &str, expression: &str) -> Result<()> {
        self.subscribe_with(topic, MessageSelector::by_tag(expression)?)
    }

    /// Subscribes to `topic` with an SQL92 filter over the messages' properties and `TAGS`
    /// (`region = 'eu' AND amount > 100`), evaluated by the broker: messages that do not
    /// match never cross the network. A bad expression is refused here with its column.
    /// Only before `start`.
    pub fn subscribe_sql(&self, topic: &str, expression: &str) -> Result<()> {
        self.subscribe_with(topic, MessageSelector::by_sql(expression)?)
    }

    /// Subscribes to `topic` with tags or an SQL92 filter. Only before `start`.
    pub fn subscribe_with(&self, topic: &str, selector: MessageSelector) -> Result<()> {
        check_topic(topic)?;
        let mut setup = lock(&self.setup);
        check_not_started(&setup, "subscribe")?;
        if !setup.subscriptions.contains_key(topic)
            && setup.subscriptions.len() >= SUBSCRIPTIONS_MAX
        {
            return Err(ClientError::InvalidArgument(format!(
                "at most {SUBSCRIPTIONS_MAX} subscriptions per consumer"
            )));
        }
        setup.subscriptions.insert(topic.to_owned(), selector);
        Ok(())
    }

    /// Consumes concurrently: many batches of a queue at once, through `listener` (called
    /// on the consume threads). Replaces any listener registered before. Only before `start`.
    pub fn register_concurrent<F>(&self, listener: F) -> Result<()>
    where
        F: Fn(&[Message]) -> ConsumeStatus + Send + Sync + 'static,
    {
        self.register(Listener::Concurrent(Arc::new(listener)))
    }

    /// Consumes in order: each queue one batch at a time, in offset order, under the
    /// queue's broker lock (clustering). Replaces any listener registered before. Only
    /// before `start`.
    pub fn register_orderly<F>(&self, listener: F) -> Result<()>
    where
        F: Fn(&[Message]) -> OrderlyStatus + Send + Sync + 'static,
    {
        self.register(Listener::Orderly(Arc::new(listener)))
    }

    fn register(&self, listener: Listener) -> Result<()> {
        let mut setup = lock(&self.setup);
        check_not_started(&setup, "register a listener")?;
        setup.listener = Some(listener);
        Ok(())
    }

    /// Connects, joins the group (the first heartbeat must succeed: a broker that does not
    /// know consumer groups fails here) and starts consuming. A consumer starts once.
    pub async fn start(&self) -> Result<()> {
        let mut lifecycle = self.lifecycle.lock().await;
        match &*lifecycle {
            Lifecycle::New => {}
            Lifecycle::Running(_) => {
                return Err(ClientError::InvalidArgument(
                    "this consumer has started already".into(),
                ))
            }
            Lifecycle::Stopped => {
                return Err(ClientError::InvalidArgument(
                    "this consumer was shut down; create a new one".into(),
                ))
            }
        }
        let (subscriptions, listener) = {
            let mut setup = lock(&self.setup);
            setup.taken = true;
            (setup.subscriptions.clone(), setup.listener.clone())
        };
        let mut taken = SetupTaken {
            setup: &self.setup,
            kept: false,
        };
        if subscriptions.is_empty() {
            return Err(ClientError::InvalidArgument(
                "subscribe to at least one topic before start".into(),
            ));
        }
        let Some(listener) = listener else {
            return Err(ClientError::InvalidArgument(
                "register a listener (register_concurrent or register_orderly) before start".into(),
            ));
        };
        let mode = match listener {
            Listener::Concurrent(_) => ConsumeMode::Concurrent,
            Listener::Orderly(_) => ConsumeMode::Orderly,
        };
        let mut subscriptions = subscriptions;
        if mode == ConsumeMode::Concurrent && self.options.message_model == MessageModel::Clustering
        {
            // Failed messages come back on the group's retry topic, to any member.
            subscriptions
                .entry(crate::protocol::names::retry_topic(&self.group))
                .or_insert(MessageSelector::by_tag("*")?);
        }
        let local = match self.options.message_model {
            MessageModel::Broadcasting => {
                let dir = self
                    .options
                    .offsets_dir
                    .clone()
                    .unwrap_or_else(LocalOffsets::default_dir);
                let local = LocalOffsets::open_shared(&dir, &self.config.client_id, &self.group)?;
                // Written now (a new file) so that a directory it cannot be written in
                // refuses the start, rather than each restart skipping what was sent
                // while this consumer was down.
                let flushing = local.clone();
                tokio::task::spawn_blocking(move || flushing.flush())
                    .await
                    .map_err(|e| {
                        ClientError::OffsetStore(format!("the offsets write did not finish: {e}"))
                    })??;
                Some(local)
            }
            MessageModel::Clustering => None,
        };
        let client = Client::connect(self.config.clone()).await?;
        let queues_at_start = start::queues_at_start(&client, &subscriptions).await?;
        // The broker says how long sessions and locks last: timings follow.
        let options = self.options.fitted_to(&client.broker_info());
        let timings = options::Timings::new(&options);
        let spec = MemberSpec {
            subscriptions: subscriptions
                .iter()
                .map(|(topic, selector)| (topic.clone(), SubscriptionExpression::from(selector)))
                .collect(),
            consume_mode: mode,
            message_model: self.options.message_model,
            strategy: self.options.strategy.clone(),
        };
        let shared = Arc::new(Shared {
            group: self.group.clone(),
            options,
            mode,
            filters: subscriptions,
            listener,
            pool: Arc::new(Semaphore::new(self.options.consume_threads)),
            workers: Workers::new(self.options.consume_threads, "ringmq-consume"),
            queues: Mutex::new(BTreeMap::new()),
            assigned: Mutex::new(Vec::new()),
            local_topics: local.as_ref().map(|l| l.topics()).unwrap_or_default(),
            local,
            stopping: AtomicBool::new(false),
            rejoin: Notify::new(),
            started_at: Instant::now(),
            started_boot_ms: boot_ms(),
            queues_at_start,
            heartbeat_ok_ms: AtomicU64::new(0),
            joined_session: AtomicU64::new(0),
            lapses: AtomicU64::new(0),
            timings,
            counters: Counters::default(),
            spec,
            client,
        });
        // Subscribed before the first heartbeat, so no notification is missed.
        let pushes = shared.client.pushes();
        let sent_ms = shared.now_ms();
        let session = shared.client.bootstrap_session();
        let first = shared
            .client
            .group_heartbeat(&shared.group, &shared.spec)
            .await?;
        shared.heartbeat_ok_ms.store(sent_ms, Ordering::SeqCst);
        shared.joined_on(session);

        let (stop_tx, stop_rx) = watch::channel(false);
        let (leave_tx, leave_rx) = watch::channel(false);
        let (assignment_tx, assignment_rx) = watch::channel(Some(first));
        let membership = tokio::spawn(membership_loop(
            shared.clone(),
            assignment_tx,
            pushes,
            leave_rx,
        ));
        let controller = Controller::new(shared.clone());
        let controller = tokio::spawn(controller.run(assignment_rx, stop_rx.clone()));
        let committer = tokio::spawn(commit_loop(shared.clone(), stop_rx));
        *lock(&self.shared) = Some(shared.clone());
        taken.kept = true;
        *lifecycle = Lifecycle::Running(Running {
            shared,
            stop: stop_tx,
            leave: leave_tx,
            membership,
            controller,
            committer,
        });
        Ok(())
    }

    /// Leaves the group cleanly: stops the pull tasks, waits for running listeners (up to
    /// `shutdown_timeout_ms`), commits offsets, unlocks queues, and unregisters, so the
    /// group rebalances at once. Every step is attempted; the first error is returned.
    pub async fn shutdown(&self) -> Result<()> {
        let mut lifecycle = self.lifecycle.lock().await;
        match std::mem::replace(&mut *lifecycle, Lifecycle::Stopped) {
            Lifecycle::Running(running) => running.shutdown().await,
            Lifecycle::New | Lifecycle::Stopped => Ok(()),
        }
    }

    /// The queues the broker assigned to this consumer (in orderly mode, locked or not
    /// yet), sorted; empty before start.
    pub fn assigned_queues(&self) -> Vec<MessageQueue> {
        match &*lock(&self.shared) {
            Some(shared) => lock(&shared.assigned).clone(),
            None => Vec::new(),
        }
    }

    /// The queues this consumer is consuming: assigned, locked (orderly clustering), and
    /// with their start position known. Sorted.
    pub fn consuming_queues(&self) -> Vec<MessageQueue> {
        match &*lock(&self.shared) {
            Some(shared) => lock(&shared.queues)
                .values()
                .filter(|pq| pq.started.load(Ordering::SeqCst))
                .map(|pq| pq.mq.clone())
                .collect(),
            None => Vec::new(),
        }
    }

    /// Counters since start (zero before).
    pub fn stats(&self) -> ConsumerStats {
        match &*lock(&self.shared) {
            Some(shared) => {
                let c = &shared.counters;
                let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
                ConsumerStats {
                    consumed: get(&c.consumed),
                    retried: get(&c.retried),
                    sent_back: get(&c.sent_back),
                    dead_lettered: get(&c.dead_lettered),
                    flow_pauses: get(&c.flow_pauses),
                    pull_errors: get(&c.pull_errors),
                    pulls_ahead: get(&c.pulls_ahead),
                    pulls_discarded: get(&c.pulls_discarded),
                    commit_errors: get(&c.commit_errors),
                }
            }
            None => ConsumerStats::default(),
        }
    }

    /// The client session underneath (after start), for admin calls.
    pub fn client(&self) -> Option<Client> {
        lock(&self.shared).as_ref().map(|s| s.client.clone())
    }
}

impl Drop for PushConsumer {
    fn drop(&mut self) {
        // A clean shutdown in a task of its own: heartbeats go on while listener calls
        // end, the offsets are committed, the locks given back and the member leaves at
        // once. Before, heartbeats stopped at once while the connection stayed open (held
        // by the calls and long polls still running): the member stayed assigned its
        // queues until its session ended, and an orderly call running longer overlapped
        // the next owner of its queue.
        if let (Ok(handle), Ok(mut lifecycle)) = (
            tokio::runtime::Handle::try_current(),
            self.lifecycle.try_lock(),
        ) {
            if let Lifecycle::Running(running) =
                std::mem::replace(&mut *lifecycle, Lifecycle::Stopped)
            {
                // Its first steps now, as `shutdown` takes them (heartbeats go on until
                // `leave`): a task spawned on a runtime that ends before it runs is dropped
                // unpolled, and the queue tasks (perhaps on another runtime) would go on.
                let shared = running.shared.clone();
                shared.stopping.store(true, Ordering::SeqCst);
                running.stop.send_replace(true);
                handle.spawn(async move {
                    if let Err(e) = running.shutdown().await {
                        shared.log(format_args!("shutdown after the consumer was dropped: {e}"));
                    }
                });
                return;
            }
        }
        // No async here: tell every task to stop; pulls end within one long-poll wait.
        if let Some(shared) = lock(&self.shared).as_ref() {
            shared.stopping.store(true, Ordering::SeqCst);
            for pq in lock(&shared.queues).values() {
                pq.drop_queue();
            }
        }
        if let Ok(lifecycle) = self.lifecycle.try_lock() {
            if let Lifecycle::Running(running) = &*lifecycle {
                running.stop.send_replace(true);
            }
        }
    }
}

struct Running {
    shared: Arc<Shared>,
    /// Stops the queues' tasks and the committer.
    stop: watch::Sender<bool>,
    /// Stops the heartbeats: only once the queues are stopped (see `shutdown`).
    leave: watch::Sender<bool>,
    membership: JoinHandle<()>,
    controller: JoinHandle<Controller>,
    committer: JoinHandle<()>,
}

impl Running {
    async fn shutdown(self) -> Result<()> {
        let shared = self.shared;
        shared.stopping.store(true, Ordering::SeqCst);
        self.stop.send_replace(true);
        let mut first_error: Option<ClientError> = None;
        // Neither task returns an error; a join error means a panic, only logged.
        let ended = |name: &str, joined: std::result::Result<(), tokio::task::JoinError>| {
            if let Err(e) = joined {
                shared.log(format_args!("{name} task ended abnormally: {e}"));
            }
        };
        ended("committer", self.committer.await);
        // Heartbeats go on while the queues stop (their listener calls may run for up to
        // `shutdown_timeout_ms`): a member the broker no longer heard from would be
        // dropped with its locks, and another member would take an orderly queue while a
        // call on it still runs here.
        match self.controller.await {
            Ok(mut controller) => {
                if let Err(e) = controller.shutdown().await {
                    first_error.get_or_insert(e);
                }
            }
            Err(e) => {
                // The queue tasks were the controller's: without it, stop what can be
                // reached and still leave the group.
                for pq in lock(&shared.queues).values() {
                    pq.drop_queue();
                }
                first_error.get_or_insert(ClientError::Connection(format!(
                    "consumer controller task ended abnormally: {e}"
                )));
            }
        }
        self.leave.send_replace(true);
        ended("membership", self.membership.await);
        match shared.client.unregister(&shared.group).await {
            Ok(()) => {}
            // The member is on an earlier connection of this client that the broker has
            // not seen close yet (it reconnected): the member leaves when the broker does,
            // or at the end of its session. Nothing of this consumer's waits on it.
            Err(e) if e.code() == Some(crate::protocol::ErrorCode::ClientIdInUse) => {
                shared.log(format_args!("leaving the group: {e}"));
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// State shared by the tasks of one running consumer.
struct Shared {
    client: Client,
    group: String,
    options: PushConsumerOptions,
    mode: ConsumeMode,
    spec: MemberSpec,
    /// topic → tag expression.
    filters: BTreeMap<String, MessageSelector>,
    listener: Listener,
    /// Listener calls running at once.
    pool: Arc<Semaphore>,
    /// The threads listeners run on (unless they are declared non-blocking).
    workers: Workers,
    /// The queues with a running pull task.
    queues: Mutex<BTreeMap<MessageQueue, Arc<ProcessQueue>>>,
    /// The latest assignment, for observers.
    assigned: Mutex<Vec<MessageQueue>>,
    /// Broadcasting: the local offsets (one copy per file in the process).
    local: Option<Arc<LocalOffsets>>,
    /// Broadcasting: the topics the local offsets held positions of when this consumer
    /// started ([`LocalOffsets::topics`]).
    local_topics: std::collections::BTreeSet<String>,
    stopping: AtomicBool,
    /// Asks the membership task for a heartbeat now (after a reconnect).
    rejoin: Notify,
    started_at: Instant,
    /// `boot_ms()` at the start, if the clock reads.
    started_boot_ms: Option<u64>,
    /// How many queues each subscribed topic had when this consumer started (0: it did
    /// not exist): see [`start::queues_at_start`].
    queues_at_start: BTreeMap<String, u32>,
    /// When (ms since `started_at`) the last acknowledged heartbeat was sent.
    heartbeat_ok_ms: AtomicU64,
    /// The bootstrap session (`Client::bootstrap_session`, never 0) a heartbeat was last
    /// sent and acknowledged on, 0 before the first. Locks are asked for on this session
    /// only: on a new connection the broker may still count the member on the old one,
    /// and its release of the old member's locks, decided once it drops it, can come
    /// after a lock asked for before that and take it away (`Controller::lock`).
    joined_session: AtomicU64,
    /// Heartbeats acknowledged after a time in which the broker may have dropped this
    /// member (see `Shared::heartbeat_acked`): a lease granted before the latest is void.
    lapses: AtomicU64,
    /// The session and lock timings, fitted to the broker's again after each handshake.
    timings: options::Timings,
    counters: Counters,
}

/// Milliseconds on CLOCK_BOOTTIME, which goes on while the machine is suspended (the
/// monotonic clock tokio's `Instant` reads does not): a lease or a membership aged by it
/// is not taken for fresh after a resume, when the broker, which kept running, may have
/// dropped the member and its locks long ago. `None` if the clock cannot be read.
fn boot_ms() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the one we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let ms = u64::try_from(ts.tv_nsec).ok()? / 1_000_000;
    (rc == 0).then(|| secs.saturating_mul(1000).saturating_add(ms))
}

impl Shared {
    /// Milliseconds since the start, on CLOCK_BOOTTIME (see [`boot_ms`]).
    fn now_ms(&self) -> u64 {
        match (self.started_boot_ms, boot_ms()) {
            (Some(start), Some(now)) => now.saturating_sub(start),
            _ => u64::try_from(self.started_at.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }

    fn needs_locks(&self) -> bool {
        self.mode == ConsumeMode::Orderly && self.options.message_model == MessageModel::Clustering
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Broadcasting: writes the local offsets file if a position changed. The write and
    /// its fsync run on the blocking pool, not on a runtime worker.
    async fn flush_local(&self) -> Result<()> {
        let Some(local) = self.local.clone() else {
            return Ok(());
        };
        let flushed = match tokio::task::spawn_blocking(move || local.flush()).await {
            Ok(flushed) => flushed,
            Err(e) => Err(ClientError::OffsetStore(format!(
                "the offsets write did not finish: {e}"
            ))),
        };
        if flushed.is_err() {
            add(&self.counters.commit_errors, 1);
        }
        flushed
    }

    /// Whether the broker surely still counts this client as a member: its last
    /// acknowledged heartbeat is at least one heartbeat interval within the session.
    fn membership_fresh(&self) -> bool {
        let age = self
            .now_ms()
            .saturating_sub(self.heartbeat_ok_ms.load(Ordering::SeqCst));
        let session_ms = self.timings.session_timeout_ms();
        age < session_ms.saturating_sub(self.timings.heartbeat_interval_ms())
    }

    /// A heartbeat sent at `sent_ms` was acknowledged. If the membership is not fresh now,
    /// before this acknowledgement counts (a stalled process, a stalled network, a
    /// heartbeat held up on its way: the broker may have dropped the member and its locks,
    /// and this heartbeat joined it again as a new member), the locks held before are void:
    /// another member may have taken and consumed their queues meanwhile, so they are
    /// locked again and restarted from the committed offsets (`Controller::check_locks`)
    /// rather than consumed on.
    fn heartbeat_acked(&self, sent_ms: u64) {
        if !self.membership_fresh() {
            self.lapses.fetch_add(1, Ordering::SeqCst);
        }
        self.heartbeat_ok_ms.fetch_max(sent_ms, Ordering::SeqCst);
    }

    /// A heartbeat sent on the bootstrap session `session` was acknowledged: if that
    /// connection is still the live one, the broker counts the member on it, and locks
    /// may be asked for on it (`joined_session`).
    fn joined_on(&self, session: Option<u64>) {
        if let Some(session) = session.filter(|&s| Some(s) == self.client.bootstrap_session()) {
            self.joined_session.fetch_max(session, Ordering::SeqCst);
        }
    }

    /// Consumers are libraries without a logger: what must not go unnoticed (a message
    /// given up, a failing pull) goes to stderr, once per change of state, not per retry.
    fn log(&self, what: std::fmt::Arguments<'_>) {
        crate::warn!(
            "ringmq consumer {} ({}): {what}",
            self.group,
            self.client.config().client_id
        );
    }
}

/// A lock a queue was started under.
struct Lease {
    /// `Client::bootstrap_session` when the lock was granted.
    session: u64,
    /// `Shared::lapses` when the lock was granted.
    lapses: u64,
    /// When (ms since start) the request that last granted or renewed it was sent.
    confirmed_ms: AtomicU64,
}

/// One assigned queue being consumed: its cache and the flags its tasks watch.
struct ProcessQueue {
    mq: MessageQueue,
    /// Pull filter (empty: every message).
    tags: Vec<String>,
    /// SQL92 pull filter (empty: none).
    sql: String,
    state: Mutex<QueueState>,
    /// Set when the queue is given up: its tasks stop and run no listener again.
    dropped: AtomicBool,
    /// Set when the group's offsets were reset: the positions held are stale and must
    /// never be committed over the reset ones.
    no_commit: AtomicBool,
    /// The group's offsets epoch the queue's start was read under (clustering), sent with
    /// each commit: the broker refuses it after a later reset.
    offsets_epoch: Option<u64>,
    /// The start position is known and pulls run.
    started: AtomicBool,
    /// Wakes the orderly task (new messages, or drop). Only that task waits on it, so a
    /// `notify_one` always reaches it: no other waiter can take the wake-up.
    wake: Notify,
    lease: Option<Lease>,
}

#[derive(Default)]
struct QueueState {
    /// The cached messages themselves only in orderly mode (where the queue's task takes
    /// them from here), detached from their answers' buffers; concurrent mode hands each
    /// answer's messages to listener calls at once and tracks offsets and sizes only.
    tracker: OffsetTracker<Option<Message>>,
    /// The offset last committed (or read as committed at start).
    committed: Option<u64>,
    /// The broker run (`PullResult::incarnation`) the tracker's position was read under
    /// (0: unknown); sent with each pull and commit. Changed with the position, under one
    /// lock: a commit never pairs a position with a run that did not check it.
    incarnation: u64,
    /// The start was taken from `consume_from` and is not yet known to be the group's:
    /// until `commit_start` read the stored offset back, every commit of the queue (the
    /// committer's, the one after a stop) is stored only if the group has none. A plain
    /// commit of this member's later end, sent meanwhile, moved the group's offset past
    /// another member's start, and what came between was consumed by neither.
    start_unconfirmed: bool,
}

impl ProcessQueue {
    fn state(&self) -> MutexGuard<'_, QueueState> {
        lock(&self.state)
    }

    fn is_dropped(&self) -> bool {
        self.dropped.load(Ordering::SeqCst)
    }

    fn drop_queue(&self) {
        self.dropped.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Orderly task only: waits `ms`, or less when the queue is dropped. New messages do
    /// not cut it short (a suspended queue must stay suspended under traffic); their
    /// wake-up is taken here, which is fine: the caller looks at the cache afterwards.
    async fn pause(&self, ms: u64) {
        let deadline = Instant::now() + Duration::from_millis(ms);
        while !self.is_dropped() {
            tokio::select! {
                _ = sleep_until(deadline) => return,
                _ = self.wake.notified() => {}
            }
        }
    }

    /// Orderly: whether a listener may run on this queue now.
    fn may_consume(&self, shared: &Shared) -> bool {
        match &self.lease {
            None => true,
            Some(lease) => {
                let age = shared
                    .now_ms()
                    .saturating_sub(lease.confirmed_ms.load(Ordering::SeqCst));
                age < shared.timings.lock_valid_ms()
                    && shared.client.bootstrap_session() == Some(lease.session)
                    && shared.lapses.load(Ordering::SeqCst) == lease.lapses
                    && shared.membership_fresh()
            }
        }
    }

    /// Marks messages done (consumed or given up): the commit point may move past them.
    fn finish(&self, offsets: impl IntoIterator<Item = u64>) {
        let mut state = self.state();
        for offset in offsets {
            state.tracker.remove(offset);
        }
    }
}

#[cfg(test)]
mod tests;
