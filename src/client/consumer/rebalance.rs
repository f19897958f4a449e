//! Group membership and queue ownership: the membership task (heartbeats, rebalance
//! notifications, the periodic assignment query), the committer, and the [`Controller`],
//! which turns each assignment into running queues and, in orderly clustering mode, takes,
//! renews and gives up the queue locks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::protocol::{Assignment, ErrorCode, Kind, RebalanceNotify};

use super::super::connection::PushFrame;
use super::super::error::Result;
use super::queue::{commit_queue, orderly_loop, pull_loop};
use super::{lock, Lease, Listener, MessageQueue, ProcessQueue, QueueState, Shared};

/// Whether a pushed frame asks this group to rebalance. A notification that does not
/// decode also counts: asking for the assignment once too often is harmless.
fn is_rebalance_for(push: &PushFrame, group: &str) -> bool {
    if push.kind() != Kind::RebalanceNotify {
        return false;
    }
    match push
        .frame()
        .and_then(|f| f.decode_meta::<RebalanceNotify>())
    {
        Ok(notify) => notify.group == group,
        Err(_) => true,
    }
}

/// Heartbeats, reacts to rebalance notifications, queries the assignment periodically;
/// publishes every assignment answered, newest last.
pub(super) async fn membership_loop(
    shared: Arc<Shared>,
    assignments: watch::Sender<Option<Assignment>>,
    mut pushes: broadcast::Receiver<PushFrame>,
    mut stop: watch::Receiver<bool>,
) {
    let every = |ms: u64| {
        let period = Duration::from_millis(ms);
        let mut tick = interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tick
    };
    let mut heartbeat_ms = shared.timings.heartbeat_interval_ms();
    let mut heartbeat = every(heartbeat_ms);
    let mut safety_net = every(shared.options.rebalance_interval_ms);
    let mut failing: Option<String> = None;
    loop {
        let query = tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = shared.rejoin.notified() => false,
            _ = heartbeat.tick() => false,
            push = pushes.recv() => match push {
                Ok(push) if is_rebalance_for(&push, &shared.group) => true,
                Ok(_) => continue,
                // Missed frames may have been notifications.
                Err(broadcast::error::RecvError::Lagged(_)) => true,
                // The client outlives this task; nothing more will come otherwise.
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = safety_net.tick() => true,
        };
        let answer = if query {
            match shared.client.query_assignment(&shared.group).await {
                // Not a member (any more): join again.
                Err(e) if e.code() == Some(ErrorCode::GroupNotFound) => {
                    heartbeat_now(&shared).await
                }
                other => other,
            }
        } else {
            heartbeat_now(&shared).await
        };
        if heartbeat_ms != shared.timings.heartbeat_interval_ms() {
            heartbeat_ms = shared.timings.heartbeat_interval_ms();
            heartbeat = every(heartbeat_ms);
        }
        match answer {
            Ok(assignment) => {
                if failing.take().is_some() {
                    shared.log(format_args!("group requests succeed again"));
                }
                assignments.send_replace(Some(assignment));
            }
            Err(e) => {
                let text = e.to_string();
                if failing.as_deref() != Some(text.as_str()) {
                    shared.log(format_args!("group request failed: {text}"));
                    failing = Some(text);
                }
            }
        }
    }
}

async fn heartbeat_now(shared: &Shared) -> Result<Assignment> {
    let sent_ms = shared.now_ms();
    let before = shared.client.bootstrap_session();
    let assignment = shared
        .client
        .group_heartbeat(&shared.group, &shared.spec)
        .await?;
    // Before the membership is judged by them, and before any lock is asked for on a new
    // connection: the broker there may keep sessions and locks for less time.
    (shared.timings).refit(&shared.options, &shared.client.broker_info());
    shared.heartbeat_acked(sent_ms);
    shared.joined_on(before);
    Ok(assignment)
}

pub(super) async fn commit_loop(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let period = Duration::from_millis(shared.options.commit_interval_ms);
    let mut tick = interval_at(Instant::now() + period, period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let queues: Vec<Arc<ProcessQueue>> = lock(&shared.queues).values().cloned().collect();
        let mut result = Ok(());
        for pq in queues {
            if let Err(e) = commit_queue(&shared, &pq).await {
                result = Err(e);
            }
        }
        if let Err(e) = shared.flush_local().await {
            result = Err(e);
        }
        match result {
            Err(e) if !failing => {
                shared.log(format_args!("committing offsets failed: {e}"));
                failing = true;
            }
            Ok(()) if failing => {
                shared.log(format_args!("offsets are committed again"));
                failing = false;
            }
            _ => {}
        }
    }
}

/// The tasks of one running queue.
struct QueueTasks {
    pq: Arc<ProcessQueue>,
    pull: JoinHandle<()>,
    consume: Option<JoinHandle<()>>,
}

/// Owns the running queues; applies assignments; takes, renews and gives up locks.
pub(super) struct Controller {
    shared: Arc<Shared>,
    running: BTreeMap<MessageQueue, QueueTasks>,
    /// Orderly clustering: assigned queues not locked yet.
    pending: BTreeSet<MessageQueue>,
    offsets_epoch: Option<u64>,
    /// Lock requests are failing (logged once, not every `lock_retry_ms`).
    lock_failing: bool,
    /// Lock requests are held back: this client is not surely a member (said once).
    lock_held_back: bool,
    /// Orderly queues stopped while a listener call of theirs still runs: nothing
    /// consumes them, their locks are still renewed (the next owner must not start before
    /// the call ends), and they are neither locked nor started again until their orderly
    /// task ended ([`hand_over_ended`](Self::hand_over_ended)). The controller does not
    /// wait for those calls: renewals, lock checks and assignments go on meanwhile.
    handing_over: BTreeMap<MessageQueue, Arc<ProcessQueue>>,
    /// The queues whose hand-over's orderly task ended, from the tasks that wait for them.
    ended_tx: mpsc::UnboundedSender<MessageQueue>,
    /// Taken by `run` and `shutdown` while they wait on it.
    ended_rx: Option<mpsc::UnboundedReceiver<MessageQueue>>,
    /// A renewal of held locks failed: tried again at the next `lock_retry_ms`, not a
    /// whole `lock_renew_ms` later (the leases would lapse meanwhile).
    renew_owed: bool,
}

/// Stopped queues, for the commit and unlock that follow.
type Stopped = Vec<Arc<ProcessQueue>>;

/// A `LockBatch` answer trusted for use: it came on one unchanged bootstrap session.
struct Granted {
    topic: String,
    /// `Client::bootstrap_session` before and after the request.
    session: u64,
    /// `Shared::lapses` before the request.
    lapses: u64,
    /// When (ms since start) the request was sent: the lock's validity counts from then.
    sent_ms: u64,
    /// Queues held now, sorted.
    queues: Vec<u32>,
}

impl Controller {
    pub(super) fn new(shared: Arc<Shared>) -> Controller {
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        Controller {
            shared,
            running: BTreeMap::new(),
            pending: BTreeSet::new(),
            offsets_epoch: None,
            lock_failing: false,
            lock_held_back: false,
            handing_over: BTreeMap::new(),
            ended_tx,
            ended_rx: Some(ended_rx),
            renew_owed: false,
        }
    }

    pub(super) async fn run(
        mut self,
        mut assignments: watch::Receiver<Option<Assignment>>,
        mut stop: watch::Receiver<bool>,
    ) -> Controller {
        let locks = self.shared.needs_locks();
        let every = |ms: u64| {
            let period = Duration::from_millis(ms);
            let mut tick = interval_at(Instant::now() + period, period);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick
        };
        let mut renew_ms = self.shared.timings.lock_renew_ms();
        let mut renew = every(renew_ms);
        let mut retry = every(self.shared.options.lock_retry_ms);
        let Some(mut ended) = self.ended_rx.take() else {
            return self;
        };
        let first = assignments.borrow_and_update().clone();
        if let Some(first) = first {
            self.apply(first).await;
        }
        loop {
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                Some(mq) = ended.recv() => self.hand_over_ended(mq).await,
                changed = assignments.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let latest = assignments.borrow_and_update().clone();
                    if let Some(latest) = latest {
                        self.apply(latest).await;
                    }
                }
                _ = renew.tick(), if locks => self.renew_locks().await,
                _ = retry.tick(), if locks => self.check_locks().await,
            }
            if renew_ms != self.shared.timings.lock_renew_ms() {
                renew_ms = self.shared.timings.lock_renew_ms();
                renew = every(renew_ms);
            }
        }
        self.ended_rx = Some(ended);
        self
    }

    /// Makes the running queues match `assignment`.
    async fn apply(&mut self, assignment: Assignment) {
        let target: BTreeSet<MessageQueue> = assignment
            .topics
            .iter()
            .filter(|t| self.shared.filters.contains_key(&t.topic))
            .flat_map(|t| {
                t.queues
                    .iter()
                    .map(|q| MessageQueue::new(t.topic.clone(), *q))
            })
            .collect();
        *lock(&self.shared.assigned) = target.iter().cloned().collect();

        let reset = self.shared.local.is_none()
            && self
                .offsets_epoch
                .is_some_and(|epoch| assignment.offsets_epoch > epoch);
        self.offsets_epoch = Some(self.offsets_epoch.map_or(assignment.offsets_epoch, |e| {
            e.max(assignment.offsets_epoch)
        }));
        if reset {
            // Positions in memory predate the reset: drop them uncommitted and restart the
            // kept queues from the committed (reset) offsets, under the same locks.
            self.shared.log(format_args!(
                "offsets were reset (epoch {}): re-reading committed offsets",
                assignment.offsets_epoch
            ));
            let all: Vec<MessageQueue> = self.running.keys().cloned().collect();
            for mq in &all {
                if let Some(tasks) = self.running.get(mq) {
                    tasks.pq.no_commit.store(true, Ordering::SeqCst);
                }
            }
            let stopped = self.stop_queues(&all).await;
            for pq in stopped {
                if target.contains(&pq.mq) {
                    let lease = pq.lease.as_ref().map(|l| Lease {
                        session: l.session,
                        lapses: l.lapses,
                        confirmed_ms: AtomicU64::new(l.confirmed_ms.load(Ordering::SeqCst)),
                    });
                    self.start_queue(pq.mq.clone(), lease);
                } else if pq.lease.is_some() {
                    // Logged inside; the lock expires on the broker otherwise.
                    let _ = self.unlock(&[pq]).await;
                }
            }
        }

        let removed: Vec<MessageQueue> = self
            .running
            .keys()
            .filter(|mq| !target.contains(mq))
            .cloned()
            .collect();
        if !removed.is_empty() {
            // Commit before unlocking: the next owner reads the committed offset as soon
            // as it holds the lock. Failures are logged inside; the next owner then
            // re-delivers from the older offset (at least once).
            let stopped = self.stop_queues(&removed).await;
            let _ = self.commit(&stopped).await;
            let _ = self.unlock(&stopped).await;
        }
        // Pending queues taken away: their locks are given up, all of them (an unlock of a
        // queue not held takes nothing from its holder), or the next owner waits for them
        // to expire. Only those whose last lock request's outcome was unknown were: an
        // answer that left a queue out may still see it granted (the broker answers what
        // the shards that answered hold; a shard that timed out may grant it later).
        let taken_away: Vec<MessageQueue> = (self.pending.iter())
            .filter(|mq| !target.contains(*mq))
            .cloned()
            .collect();
        self.pending.retain(|mq| target.contains(mq));
        if !taken_away.is_empty() {
            // Logged inside; the locks expire on the broker otherwise.
            let _ = self.unlock_queues(&taken_away).await;
        }
        let added: Vec<MessageQueue> = target
            .into_iter()
            .filter(|mq| {
                !self.running.contains_key(mq)
                    && !self.pending.contains(mq)
                    && !self.handing_over.contains_key(mq)
            })
            .collect();
        if self.shared.needs_locks() {
            self.pending.extend(added);
            self.lock_pending().await;
        } else {
            for mq in added {
                self.start_queue(mq, None);
            }
        }
    }

    fn start_queue(&mut self, mq: MessageQueue, lease: Option<Lease>) {
        let selector = self.shared.filters.get(&mq.topic);
        let tags = selector.map(|f| f.tags().to_vec()).unwrap_or_default();
        let sql = selector.map(|f| f.sql().to_owned()).unwrap_or_default();
        let pq = Arc::new(ProcessQueue {
            mq: mq.clone(),
            tags,
            sql,
            state: Mutex::new(QueueState::default()),
            dropped: AtomicBool::new(false),
            no_commit: AtomicBool::new(false),
            offsets_epoch: self.offsets_epoch,
            started: AtomicBool::new(false),
            wake: Notify::new(),
            lease,
        });
        lock(&self.shared.queues).insert(mq.clone(), pq.clone());
        let pull = tokio::spawn(pull_loop(self.shared.clone(), pq.clone()));
        let consume = match &self.shared.listener {
            Listener::Orderly(listener) => Some(tokio::spawn(orderly_loop(
                self.shared.clone(),
                pq.clone(),
                listener.clone(),
            ))),
            Listener::Concurrent(_) => None,
        };
        self.running.insert(mq, QueueTasks { pq, pull, consume });
    }

    /// Stops the queues' pull tasks; answers those stopped, for their commit (and unlock).
    /// An orderly queue whose task has not ended (a listener call in progress finishes
    /// first) is not among them: it is handed over once its task ends
    /// ([`handing_over`](Self::handing_over)), without the controller waiting for it.
    /// Concurrent listener calls already running go on; their results still move the
    /// commit point.
    async fn stop_queues(&mut self, queues: &[MessageQueue]) -> Stopped {
        let mut stopped = Vec::with_capacity(queues.len());
        for mq in queues {
            let Some(tasks) = self.running.remove(mq) else {
                continue;
            };
            tasks.pq.drop_queue();
            tasks.pull.abort();
            lock(&self.shared.queues).remove(mq);
            // Aborted: the result is a cancellation, or the task had ended.
            let _ = tasks.pull.await;
            match tasks.consume {
                Some(consume) if !consume.is_finished() => {
                    let (shared, ended, mq) =
                        (self.shared.clone(), self.ended_tx.clone(), mq.clone());
                    self.handing_over.insert(mq.clone(), tasks.pq);
                    tokio::spawn(async move {
                        if let Err(e) = consume.await {
                            shared.log(format_args!("orderly task ended abnormally: {e}"));
                        }
                        let _ = ended.send(mq);
                    });
                }
                Some(consume) => {
                    if let Err(e) = consume.await {
                        self.shared
                            .log(format_args!("orderly task ended abnormally: {e}"));
                    }
                    stopped.push(tasks.pq);
                }
                None => stopped.push(tasks.pq),
            }
        }
        stopped
    }

    /// A handed-over queue's orderly task ended: its position is committed, and its lock
    /// given up, unless the queue is assigned here again (given back meanwhile, or stopped
    /// for a lost lock or an offsets reset): then it is locked and started anew.
    async fn hand_over_ended(&mut self, mq: MessageQueue) {
        let Some(pq) = self.handing_over.remove(&mq) else {
            return;
        };
        let stopped = vec![pq];
        let _ = self.commit(&stopped).await;
        if !lock(&self.shared.assigned).contains(&mq) {
            let _ = self.unlock(&stopped).await;
        } else if self.shared.needs_locks() {
            self.pending.insert(mq);
            self.lock_pending().await;
        } else {
            self.start_queue(mq, None);
        }
    }

    /// Commits the final positions of stopped queues; the first error is returned (and
    /// logged).
    async fn commit(&self, stopped: &Stopped) -> Result<()> {
        let mut result = Ok(());
        for pq in stopped {
            if let Err(e) = commit_queue(&self.shared, pq).await {
                self.shared.log(format_args!(
                    "committing {}[{}] on hand-over failed: {e}",
                    pq.mq.topic, pq.mq.queue_id
                ));
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        if let Err(e) = self.shared.flush_local().await {
            self.shared.log(format_args!("{e}"));
            if result.is_ok() {
                result = Err(e);
            }
        }
        result
    }

    /// Gives up the locks of stopped queues that had one.
    async fn unlock(&self, stopped: &[Arc<ProcessQueue>]) -> Result<()> {
        let leased = stopped.iter().filter(|pq| pq.lease.is_some());
        self.unlock_queues(leased.map(|pq| &pq.mq)).await
    }

    /// Gives up the locks of `queues` (one request per topic; a lock not held is let be).
    async fn unlock_queues<'a>(
        &self,
        queues: impl IntoIterator<Item = &'a MessageQueue>,
    ) -> Result<()> {
        let mut by_topic: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for mq in queues {
            by_topic
                .entry(mq.topic.as_str())
                .or_default()
                .push(mq.queue_id);
        }
        let mut result = Ok(());
        for (topic, queues) in by_topic {
            if let Err(e) = self
                .shared
                .client
                .unlock_batch(&self.shared.group, topic, &queues)
                .await
            {
                // The lock then expires on the broker by itself.
                self.shared
                    .log(format_args!("unlocking {topic} {queues:?} failed: {e}"));
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }

    /// Asks for the locks of `queues`, one request per topic; answers the topics whose
    /// request succeeded on one unchanged bootstrap session.
    async fn lock(&mut self, queues: &BTreeSet<MessageQueue>) -> Vec<Granted> {
        let mut by_topic: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for mq in queues {
            by_topic
                .entry(mq.topic.as_str())
                .or_default()
                .push(mq.queue_id);
        }
        let client = &self.shared.client;
        let mut answers = Vec::new();
        for (topic, ids) in by_topic {
            let before = client.bootstrap_session();
            // Not before this connection's heartbeat is acknowledged: the member's release
            // on the old one could take the lock away after it was granted (tried again at
            // the next `lock_retry_ms`).
            if before != Some(self.shared.joined_session.load(Ordering::SeqCst)) {
                self.shared.rejoin.notify_one();
                continue;
            }
            // Nor while this client is not surely a member (its heartbeats unanswered or
            // refused for most of a session): the broker may have dropped it and given
            // these queues to others, and a renewal took back those not locked again yet,
            // for a member whose leases were void (it consumed nothing), their new owner
            // waiting. The locks lapse; an acknowledged heartbeat locks again.
            if !self.shared.membership_fresh() {
                if !std::mem::replace(&mut self.lock_held_back, true) {
                    self.shared.log(format_args!(
                        "not surely a member (heartbeats unanswered or refused for most of a session): no lock requests until one is acknowledged"
                    ));
                }
                continue;
            }
            if std::mem::take(&mut self.lock_held_back) {
                self.shared
                    .log(format_args!("a member again: lock requests resume"));
            }
            let lapses = self.shared.lapses.load(Ordering::SeqCst);
            let sent_ms = self.shared.now_ms();
            match client.lock_batch(&self.shared.group, topic, &ids).await {
                Ok(held) => {
                    // A lock granted across a reconnect may already be released by the
                    // broker (the old connection closed): not trusted, asked again later.
                    let after = client.bootstrap_session();
                    if let (Some(before), Some(after)) = (before, after) {
                        if before == after {
                            answers.push(Granted {
                                topic: topic.to_owned(),
                                session: before,
                                lapses,
                                sent_ms,
                                queues: held,
                            });
                        }
                    }
                    if std::mem::take(&mut self.lock_failing) {
                        self.shared.log(format_args!("lock requests succeed again"));
                    }
                }
                Err(e) => {
                    if !std::mem::replace(&mut self.lock_failing, true) {
                        self.shared
                            .log(format_args!("locking {topic} {ids:?} failed: {e}"));
                    }
                }
            }
        }
        answers
    }

    /// Locks pending queues and starts those locked.
    async fn lock_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = self.pending.clone();
        for granted in self.lock(&pending).await {
            for queue_id in granted.queues {
                let mq = MessageQueue::new(granted.topic.clone(), queue_id);
                if self.pending.remove(&mq) {
                    let lease = Lease {
                        session: granted.session,
                        lapses: granted.lapses,
                        confirmed_ms: AtomicU64::new(granted.sent_ms),
                    };
                    self.start_queue(mq, Some(lease));
                }
            }
        }
    }

    /// Renews the locks of running queues; a queue whose lock went to someone else is
    /// stopped (offset committed) and waits for its lock again.
    async fn renew_locks(&mut self) {
        // Those handed over too: their last call still runs.
        let held: BTreeSet<MessageQueue> = (self.running.keys())
            .chain(self.handing_over.keys())
            .cloned()
            .collect();
        if held.is_empty() {
            return;
        }
        let mut lost = Vec::new();
        let answers = self.lock(&held).await;
        let topics: BTreeSet<&str> = held.iter().map(|mq| mq.topic.as_str()).collect();
        self.renew_owed = answers.len() < topics.len();
        for granted in answers {
            let topic = &granted.topic;
            let range =
                MessageQueue::new(topic.clone(), 0)..=MessageQueue::new(topic.clone(), u32::MAX);
            for (mq, tasks) in self.running.range(range) {
                let Some(lease) = &tasks.pq.lease else {
                    continue;
                };
                if granted.queues.binary_search(&mq.queue_id).is_err() {
                    lost.push(mq.clone());
                } else if lease.session == granted.session {
                    lease
                        .confirmed_ms
                        .fetch_max(granted.sent_ms, Ordering::SeqCst);
                }
                // Held on another session: `check_locks` voids it.
            }
        }
        if !lost.is_empty() {
            self.shared.log(format_args!(
                "lost the locks of {} queue(s); waiting to lock them again",
                lost.len()
            ));
            self.release_lost(lost).await;
        }
    }

    /// Stops queues whose lock is gone (waiting for a listener call in progress: it
    /// started while the lock was valid) and puts them back to pending.
    async fn release_lost(&mut self, lost: Vec<MessageQueue>) {
        let stopped = self.stop_queues(&lost).await;
        // Committing is still safe: a commit never moves the group's offset backwards,
        // and what was consumed here is done.
        let _ = self.commit(&stopped).await;
        // Those still in a call wait for it first (`hand_over_ended`).
        self.pending.extend(stopped.iter().map(|pq| pq.mq.clone()));
    }

    /// Every `lock_retry_ms`: queues locked on a bootstrap connection that is gone, or
    /// before a lapse of the membership (`Shared::heartbeat_acked`), lost their locks
    /// (the broker released them); pending queues are tried again.
    async fn check_locks(&mut self) {
        if self.renew_owed {
            self.renew_locks().await;
        }
        let session = self.shared.client.bootstrap_session();
        let lapses = self.shared.lapses.load(Ordering::SeqCst);
        let void = |lease: &Lease| (Some(lease.session) != session, lease.lapses != lapses);
        let (mut moved, mut lapsed) = (Vec::new(), Vec::new());
        for (mq, tasks) in &self.running {
            match tasks.pq.lease.as_ref().map(void) {
                Some((true, _)) => moved.push(mq.clone()),
                Some((false, true)) => lapsed.push(mq.clone()),
                _ => {}
            }
        }
        if !moved.is_empty() {
            self.shared.log(format_args!(
                "the bootstrap connection changed: {} queue lock(s) are void; joining again",
                moved.len()
            ));
            self.shared.rejoin.notify_one();
            self.release_lost(moved).await;
        }
        if !lapsed.is_empty() {
            self.shared.log(format_args!(
                "heartbeats lapsed past the session timeout (the broker may have given the queues to others): {} queue lock(s) are void; locking them again",
                lapsed.len()
            ));
            self.release_lost(lapsed).await;
        }
        self.lock_pending().await;
    }

    /// Shutdown: stop every queue, wait for listeners in flight (at most
    /// `shutdown_timeout_ms`), commit, unlock. In orderly clustering mode a queue is
    /// committed and unlocked as soon as its orderly task ended (its calls are done), and
    /// the locks of queues whose call still runs are renewed meanwhile. An orderly queue
    /// whose call outlasts the wait is committed up to what finished; the member then
    /// leaves the group, which frees its locks, so the next owner may start while that
    /// call still runs (as RocketMQ's shutdown unlocks every queue after its wait).
    pub(super) async fn shutdown(&mut self) -> Result<()> {
        let all: Vec<MessageQueue> = self.running.keys().cloned().collect();
        let mut stopped = self.stop_queues(&all).await;
        let threads = u32::try_from(self.shared.options.consume_threads).unwrap_or(u32::MAX);
        let wait = Duration::from_millis(self.shared.options.shutdown_timeout_ms);
        let pool = self.shared.pool.clone();
        let mut slots = std::pin::pin!(pool.acquire_many(threads));
        let mut slots_free = false;
        let locks = self.shared.needs_locks();
        let mut result = Ok(());
        if locks {
            // No call of theirs runs: their next owners need not wait for the others'.
            result = self.release(std::mem::take(&mut stopped)).await;
        }
        // From here: those releases' requests do not use up the listeners' time.
        let deadline = Instant::now() + wait;
        // Renewed at once (the last renewal may be nearly a period old), then every
        // period, and every `lock_retry_ms` (at most a period) while one failed.
        let renew_every = Duration::from_millis(self.shared.timings.lock_renew_ms());
        let mut last_renewal: Option<Instant> = None;
        let retry = Duration::from_millis(self.shared.options.lock_retry_ms).min(renew_every);
        let mut renew = interval_at(Instant::now(), retry);
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut ended = self.ended_rx.take();
        while !(slots_free && self.handing_over.is_empty()) {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {
                    self.shared.log(format_args!(
                        "listeners still running after {} ms; committing what finished{}",
                        self.shared.options.shutdown_timeout_ms,
                        if self.handing_over.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "; {} orderly queue(s) still in a call are freed as the member leaves (their next owner may start before the call ends)",
                                self.handing_over.len()
                            )
                        }
                    ));
                    break;
                }
                _ = &mut slots, if !slots_free => slots_free = true,
                Some(mq) = async { ended.as_mut()?.recv().await }, if !self.handing_over.is_empty() => {
                    let done: Stopped = self.handing_over.remove(&mq).into_iter().collect();
                    if locks {
                        result = result.and(self.release(done).await);
                    } else {
                        stopped.extend(done);
                    }
                }
                _ = renew.tick(), if locks && !self.handing_over.is_empty() => {
                    let due = last_renewal.is_none_or(|at| at.elapsed() >= renew_every);
                    if due || self.renew_owed {
                        last_renewal = Some(Instant::now());
                        self.renew_locks().await;
                    }
                }
            }
        }
        self.ended_rx = ended;
        // Late retries find no slot and end; calls still queued are dropped.
        self.shared.pool.close();
        self.shared.workers.close();
        // Committed up to what finished; their locks go as the member leaves.
        let still: Vec<Arc<ProcessQueue>> = self.handing_over.values().cloned().collect();
        let committed = self.commit(&still).await;
        let released = self.release(stopped).await;
        self.pending.clear();
        result.and(committed).and(released)
    }

    /// Commits stopped queues and gives up their locks; the first error is returned.
    async fn release(&self, stopped: Stopped) -> Result<()> {
        if stopped.is_empty() {
            return Ok(());
        }
        let committed = self.commit(&stopped).await;
        let unlocked = self.unlock(&stopped).await;
        committed.and(unlocked)
    }
}
