//! The tasks of one consumed queue: finding its start position, the pull loop (long
//! polls, flow control, hand-off to the listener), concurrent batches with their local
//! retries, and the orderly loop (one batch at a time, in offset order, under the lock).
//! Also the commit of one queue's position, used by all of them.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;
use tokio::time::sleep;

use crate::protocol::{CommitOffset, ErrorCode, PullStatus};

use super::super::error::Result;
use super::super::message::Message;
use super::super::session::PullResult;
use super::local_offsets::Position;
use super::pipeline::{PullPipeline, Verdict};
use super::{
    add, AnyListener, ConcurrentListener, ConsumeFrom, ConsumeStatus, Listener, MessageQueue,
    OrderlyListener, OrderlyStatus, ProcessQueue, Shared, LOCK_WAIT_MS,
};
use crate::client::group::MessageModel;

/// Commits `pq`'s commit point when it moved: to the broker, or to the local offsets in
/// broadcasting mode (written to disk by the committer).
pub(super) async fn commit_queue(shared: &Shared, pq: &ProcessQueue) -> Result<()> {
    commit_queue_as(shared, pq, false).await
}

/// [`commit_queue`], stored by the broker only if the group has no offset of the queue
/// when `if_absent` ([`CommitOffset::if_absent`]).
async fn commit_queue_as(shared: &Shared, pq: &ProcessQueue, if_absent: bool) -> Result<()> {
    if pq.no_commit.load(Ordering::SeqCst) {
        return Ok(());
    }
    let (point, incarnation, if_absent) = {
        let state = pq.state();
        match state.tracker.commit_point() {
            Some(point) if state.committed != Some(point) => (
                point,
                state.incarnation,
                if_absent || state.start_unconfirmed,
            ),
            _ => return Ok(()),
        }
    };
    match &shared.local {
        Some(local) => local.set(
            &pq.mq,
            Position {
                offset: point,
                incarnation,
            },
        ),
        None => {
            let request = CommitOffset {
                group: shared.group.clone(),
                topic: pq.mq.topic.clone(),
                queue_id: pq.mq.queue_id,
                offset: point,
                incarnation,
                offsets_epoch: pq.offsets_epoch,
                if_absent,
            };
            let committed = shared.client.commit_offset_request(&request).await;
            if let Err(e) = &committed {
                if e.code() == Some(ErrorCode::OffsetsReset) {
                    // The group's offsets were reset since this queue's position was read;
                    // the member learns the new epoch from the coordinator and restarts its
                    // queues from the reset offsets. Until then nothing of this one is
                    // committed (what it consumes meanwhile comes again; a queue refused its
                    // first commit waits, see `pull_loop`).
                    if !pq.no_commit.swap(true, Ordering::SeqCst) {
                        shared.log(format_args!(
                            "{}[{}]: {e}; asking for the new assignment",
                            pq.mq.topic, pq.mq.queue_id
                        ));
                        shared.rejoin.notify_one();
                    }
                    return Ok(());
                }
            }
            if committed.is_err() {
                add(&shared.counters.commit_errors, 1);
            }
            committed?
        }
    }
    pq.state().committed = Some(point);
    Ok(())
}

/// What became of a listener call.
enum Outcome<S> {
    Returned(S),
    /// It panicked: counted as a failed attempt.
    Panicked,
    /// The consumer is shutting down and dropped the call before it ran: the messages
    /// stay uncommitted and are delivered again to whoever consumes the queue next.
    Cancelled,
}

/// Runs a listener on the consume threads (on a copy of the batch), or right here on the
/// batch itself when it is declared non-blocking.
async fn run_listener<S: Send + 'static>(
    shared: &Shared,
    listener: AnyListener<S>,
    messages: &[Message],
) -> Outcome<S> {
    if shared.options.listener_non_blocking {
        let call = std::panic::AssertUnwindSafe(|| listener(messages));
        return match std::panic::catch_unwind(call) {
            Ok(status) => Outcome::Returned(status),
            Err(_) => Outcome::Panicked,
        };
    }
    // The consume threads get their own copy (a Vec of shared buffers): the caller keeps
    // the batch for what follows the call.
    let messages = messages.to_vec();
    match shared.workers.run(move || listener(&messages)).await {
        Some(Ok(status)) => Outcome::Returned(status),
        Some(Err(_)) => Outcome::Panicked,
        None => Outcome::Cancelled,
    }
}

fn offsets_of(messages: &[Message]) -> Vec<u64> {
    messages.iter().map(Message::queue_offset).collect()
}

/// Describes a range of offsets for a log line.
fn describe(mq: &MessageQueue, offsets: &[u64]) -> String {
    match (offsets.first(), offsets.last()) {
        (Some(first), Some(last)) if first != last => {
            format!("{}[{}] offsets {first}..={last}", mq.topic, mq.queue_id)
        }
        (Some(first), _) => format!("{}[{}] offset {first}", mq.topic, mq.queue_id),
        _ => format!("{}[{}]", mq.topic, mq.queue_id),
    }
}

/// Where a queue starts.
struct Start {
    /// Named by the broker run it was read under (an old broadcasting local file may not
    /// know it: 0).
    at: Position,
    /// From a commit (else from `consume_from`).
    committed: bool,
}

/// Where a queue starts: the committed offset (the broker's, or the local file's in
/// broadcasting), else `consume_from`.
async fn start_offset(shared: &Shared, mq: &MessageQueue) -> Result<Start> {
    let mut from = shared.options.consume_from;
    let committed = match &shared.local {
        Some(local) => {
            // A queue added to a topic while this broadcasting consumer was down holds
            // only what was sent since its last run: no broker-side offset was seeded for
            // it (as one is for a group), so it starts at its first message here.
            if shared.local_topics.contains(&mq.topic) {
                from = ConsumeFrom::FirstOffset;
            }
            local.get(mq)
        }
        None => shared
            .client
            .query_offset_read(&shared.group, &mq.topic, mq.queue_id)
            .await?
            .map(Position::from),
    };
    if let Some(at) = committed {
        return Ok(Start {
            at,
            committed: true,
        });
    }
    let client = &shared.client;
    let from = super::start::start_from(mq, from, &shared.queues_at_start);
    // Named by the broker run it was read under, as a position pulled is: a crash before
    // the first pull that lost records below it sends it back rather than past what is
    // stored there by then.
    let read = match from {
        ConsumeFrom::LastOffset => client.max_offset_read(&mq.topic, mq.queue_id).await?,
        ConsumeFrom::FirstOffset => client.min_offset_read(&mq.topic, mq.queue_id).await?,
        ConsumeFrom::Timestamp(ms) => {
            client
                .offset_by_timestamp_read(&mq.topic, mq.queue_id, ms)
                .await?
        }
    };
    Ok(Start {
        at: Position::from(read),
        committed: false,
    })
}

/// One pull of `pq` at `offset`, running on its own task so that several can be in
/// flight; answers with its start offset.
fn spawn_pull(
    shared: &Arc<Shared>,
    pq: &Arc<ProcessQueue>,
    offset: u64,
    wait: Duration,
) -> JoinHandle<Result<PullResult>> {
    let (shared, pq) = (shared.clone(), pq.clone());
    let incarnation = pq.state().incarnation;
    tokio::spawn(async move {
        let tags: Vec<&str> = pq.tags.iter().map(String::as_str).collect();
        shared
            .client
            .pull_with(
                &pq.mq.topic,
                pq.mq.queue_id,
                offset,
                shared.options.pull_batch_max,
                wait,
                &tags,
                &pq.sql,
                incarnation,
            )
            .await
    })
}

/// Pulls in flight, oldest first; dropping it cancels them.
struct InFlight(VecDeque<JoinHandle<Result<PullResult>>>);

impl InFlight {
    /// An answer just taken is thrown away, and with it every pull still in flight.
    fn discard(&mut self, shared: &Shared) {
        add(&shared.counters.pulls_discarded, 1 + self.0.len());
        self.cancel_all();
    }

    fn cancel_all(&mut self) {
        for pull in self.0.drain(..) {
            pull.abort();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.cancel_all();
    }
}

/// Runs `attempt` until it succeeds (`Some`) or the queue is dropped or the consumer stops
/// (`None`), pausing `pull_error_backoff_ms` after each failure; the first failure of a run
/// is logged as "{what} <queue> starts failed" (and counted as a pull error if `pull_error`).
async fn until_done<T, F, Fut>(
    shared: &Shared,
    pq: &ProcessQueue,
    what: &str,
    pull_error: bool,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut failing = false;
    loop {
        if pq.is_dropped() || shared.is_stopping() {
            return None;
        }
        match attempt().await {
            Ok(done) => return Some(done),
            Err(e) => {
                if pull_error {
                    add(&shared.counters.pull_errors, 1);
                }
                if !failing {
                    shared.log(format_args!(
                        "{what} {}[{}] starts failed: {e}; retrying",
                        pq.mq.topic, pq.mq.queue_id
                    ));
                    failing = true;
                }
                sleep(Duration::from_millis(shared.options.pull_error_backoff_ms)).await;
            }
        }
    }
}

/// Commits where a queue starts, taken from `consume_from`, if the group has no offset of
/// it yet, and starts from the group's offset if it has one: another member started the
/// queue first (an assignment that moved while both read the queue's end), and starting
/// from a later end would skip what came between, which that member may never consume.
async fn commit_start(shared: &Shared, pq: &ProcessQueue) -> Result<()> {
    if shared.local.is_some() {
        return commit_queue(shared, pq).await;
    }
    commit_queue_as(shared, pq, true).await?;
    if pq.no_commit.load(Ordering::SeqCst) {
        return Ok(());
    }
    let (group, mq) = (&shared.group, &pq.mq);
    let stored = (shared.client)
        .query_offset_read(group, &mq.topic, mq.queue_id)
        .await?;
    let mut state = pq.state();
    match stored {
        Some(at) if state.committed != Some(at.offset) => {
            state.tracker.set_next_pull(at.offset);
            state.incarnation = at.incarnation;
            state.committed = Some(at.offset);
        }
        _ => {}
    }
    state.start_unconfirmed = false;
    Ok(())
}

/// The pull loop of one queue: start position, then long-polled batches (pipelined while
/// the queue is known to hold more, see [`PullPipeline`]), cached and handed to the
/// listener (concurrent) or to the queue's orderly task.
pub(super) async fn pull_loop(shared: Arc<Shared>, pq: Arc<ProcessQueue>) {
    let stopped = |pq: &ProcessQueue| pq.is_dropped() || shared.is_stopping();
    let Some(start) = until_done(&shared, &pq, "finding where", true, || {
        start_offset(&shared, &pq.mq)
    })
    .await
    else {
        return;
    };
    {
        let mut state = pq.state();
        state.tracker.set_next_pull(start.at.offset);
        // The first pull names the run the position was read under: a broker that lost
        // what lay past it in a crash answers with where the queue ended instead.
        state.incarnation = start.at.incarnation;
        if start.committed {
            state.committed = Some(start.at.offset);
        }
        state.start_unconfirmed = !start.committed && shared.local.is_none();
    }
    // A start taken from `consume_from` is committed before the first pull: a member that
    // stopped before its first commit would leave the next owner to start from its own
    // `consume_from` (the end of the queue, by default), skipping what came in between.
    // Until it is, the queue waits (a group whose offsets the broker refuses is not
    // consumed unrecorded). In broadcasting, the local file is written too: this consumer
    // is the next owner, and a kill before the committer's next write would have it start
    // from `consume_from` again.
    if !start.committed
        && until_done(&shared, &pq, "committing where", false, || async {
            commit_start(&shared, &pq).await?;
            shared.flush_local().await
        })
        .await
        .is_none()
    {
        return;
    }
    // That commit was refused as read before a reset of the group's offsets: the start is
    // stale, and nothing consumed from it could be recorded. The queue waits until the new
    // epoch restarts it from the reset offsets.
    while pq.no_commit.load(Ordering::SeqCst) {
        if stopped(&pq) {
            return;
        }
        sleep(Duration::from_millis(shared.options.pull_error_backoff_ms)).await;
    }
    pq.started.store(true, Ordering::SeqCst);
    let mut failing = false;
    let limits = shared.options.flow_limits(shared.mode);
    let wait = Duration::from_millis(shared.options.pull_wait_ms);
    // Where the group starts (another member's start, if it set one first).
    let position = pq.state().tracker.next_pull().unwrap_or(start.at.offset);
    let mut pipeline = PullPipeline::new(
        shared.options.pulls_in_flight_max,
        shared.options.pull_batch_max,
        position,
    );
    let mut in_flight = InFlight(VecDeque::new());
    loop {
        if stopped(&pq) {
            return;
        }
        // Send what the pipeline and flow control allow.
        loop {
            let next = {
                let state = pq.state();
                let bytes_room = limits.bytes_max.saturating_sub(state.tracker.bytes());
                if limits.check(&state.tracker).is_some() || !pipeline.fits_bytes(bytes_room) {
                    None
                } else {
                    pipeline.next_pull(state.tracker.len(), limits.messages_max)
                }
            };
            let Some(offset) = next else { break };
            if !in_flight.0.is_empty() {
                add(&shared.counters.pulls_ahead, 1);
            }
            in_flight
                .0
                .push_back(spawn_pull(&shared, &pq, offset, wait));
            pipeline.sent(offset);
        }
        let Some(pull) = in_flight.0.pop_front() else {
            // Nothing in flight: the cache is over a limit.
            add(&shared.counters.flow_pauses, 1);
            sleep(Duration::from_millis(shared.options.flow_retry_ms)).await;
            continue;
        };
        let pulled = match pull.await {
            Ok(pulled) => pulled,
            // A bug in the client: said, and taken as a failed pull (pulled again from the
            // position after the back-off), not left assigned (and locked) unconsumed.
            Err(e) if e.is_panic() => {
                add(&shared.counters.pull_errors, 1);
                shared.log(format_args!(
                    "a pull of {}[{}] panicked (a bug in the client): {e}; pulling again in {} ms",
                    pq.mq.topic, pq.mq.queue_id, shared.options.pull_error_backoff_ms
                ));
                let Some(next) = pq.state().tracker.next_pull() else {
                    return;
                };
                in_flight.cancel_all();
                pipeline.restart_after_error(next);
                sleep(Duration::from_millis(shared.options.pull_error_backoff_ms)).await;
                continue;
            }
            // Cancelled: the runtime is shutting down.
            Err(_) => return,
        };
        if stopped(&pq) {
            return;
        }
        let Some(next) = pq.state().tracker.next_pull() else {
            return;
        };
        let verdict = pipeline.answered(next);
        if verdict == Verdict::Restart {
            in_flight.discard(&shared);
            continue;
        }
        let pulled = match pulled {
            Ok(pulled) => pulled,
            Err(e) => {
                add(&shared.counters.pull_errors, 1);
                if !failing {
                    shared.log(format_args!(
                        "pulling {}[{}] failed: {e}; retrying every {} ms",
                        pq.mq.topic, pq.mq.queue_id, shared.options.pull_error_backoff_ms
                    ));
                    failing = true;
                }
                in_flight.cancel_all();
                pipeline.restart_after_error(next);
                sleep(Duration::from_millis(shared.options.pull_error_backoff_ms)).await;
                continue;
            }
        };
        if failing {
            shared.log(format_args!(
                "pulling {}[{}] works again",
                pq.mq.topic, pq.mq.queue_id
            ));
            failing = false;
        }
        let found = matches!(
            pulled.status,
            PullStatus::Found | PullStatus::NoMatchedMessage
        );
        let seen = pq.state().incarnation;
        let new_run = seen != 0 && seen != pulled.incarnation;
        if verdict == Verdict::Behind && (!found || new_run) {
            // A status about a position already passed (say, offset too small after a
            // retention run): not ours to follow. Or the first answer of a restarted broker,
            // to a pull that started below the position: the broker checked that pull's
            // offset, not the position (`Pull::incarnation`). Pull again from the position.
            in_flight.discard(&shared);
            pipeline.restart(next);
            continue;
        }
        // `Client::pull` already re-checked the tag strings. Offsets below the position
        // were delivered by an earlier answer (a tag filter's answer can reach past where
        // the next pull started).
        pipeline.answer_bytes(
            (pulled.messages.iter())
                .map(|m| m.as_bytes().len() as u64)
                .sum(),
        );
        let messages: Vec<Message> = pulled
            .messages
            .into_iter()
            .filter(|m| m.queue_offset() >= next)
            .collect();
        // Orderly mode keeps the messages in the cache until the queue's task takes them:
        // copies of their own (made before the lock), not the answer's read buffer.
        let mut copies = match shared.listener {
            Listener::Orderly(_) => messages.iter().map(Message::detached).collect(),
            Listener::Concurrent(_) => Vec::new(),
        }
        .into_iter();
        {
            let mut state = pq.state();
            // Each is counted until done (concurrent: it goes to a listener now; orderly: the
            // queue's task consumes from the cache), two at one offset after the broker moved
            // the position back each in turn.
            for m in &messages {
                let (offset, bytes) = (m.queue_offset(), m.as_bytes().len() as u64);
                state.tracker.insert(offset, bytes, copies.next());
            }
            let after_last = messages
                .last()
                .map_or(0, |m| m.queue_offset().saturating_add(1));
            let position = match pulled.status {
                PullStatus::Found | PullStatus::NoMatchedMessage => {
                    pulled.next_offset.max(after_last).max(next)
                }
                // The broker corrects a position outside the queue; follow it.
                PullStatus::OffsetTooSmall | PullStatus::OffsetTooBig => {
                    shared.log(format_args!(
                        "{}[{}]: offset {next} is outside the queue ({:?}); moving to {}",
                        pq.mq.topic, pq.mq.queue_id, pulled.status, pulled.next_offset
                    ));
                    pulled.next_offset
                }
                PullStatus::NoNewMessage => pulled.next_offset,
            };
            state.tracker.set_next_pull(position);
            // Followed from here on: the next pulls and commits name this broker run. (An
            // answer thrown away above must not: a position it did not check would pass as
            // checked.)
            state.incarnation = pulled.incarnation;
            match pulled.status {
                PullStatus::Found | PullStatus::NoMatchedMessage => {
                    pipeline.used(position, pulled.max_offset)
                }
                // Anything else (the queue's end, a corrected position) ends the run of
                // pulls ahead.
                _ => {
                    in_flight.cancel_all();
                    pipeline.restart(position);
                }
            }
        }
        if messages.is_empty() {
            continue;
        }
        match &shared.listener {
            Listener::Orderly(_) => pq.wake.notify_one(),
            Listener::Concurrent(listener) => {
                let calls: Vec<&[Message]> =
                    messages.chunks(shared.options.consume_batch_max).collect();
                let mut rest = &calls[..];
                while !rest.is_empty() {
                    // Waiting for a listener slot here is the backpressure of a saturated
                    // pool; the cache limits bound the rest.
                    let Ok(permit) = shared.pool.clone().acquire_owned().await else {
                        return;
                    };
                    if stopped(&pq) {
                        return;
                    }
                    // One call per slot (each on its own thread), unless calls are known
                    // to be cheap: then one slot runs several in a row, since a hand-off
                    // would cost more than the call.
                    let take = if !shared.options.listener_non_blocking
                        && shared.workers.calls_are_cheap()
                    {
                        rest.len().min(CALLS_PER_JOB_MAX)
                    } else {
                        1
                    };
                    let (now, later) = rest.split_at(take);
                    let now = now.iter().map(|call| call.to_vec()).collect();
                    start_concurrent(&shared, &pq, listener, now, permit);
                    rest = later;
                }
            }
        }
    }
}

/// Most listener calls one job runs in a row (when calls are cheap).
const CALLS_PER_JOB_MAX: usize = 32;

/// Starts consuming `calls` (one listener call each) concurrently, in one listener slot.
/// On the consume threads they run in a row as one job that also books each result on
/// that thread (no task, no hand-back); a listener declared non-blocking runs on runtime
/// tasks, one per call. Retries go through [`concurrent_batch`] either way.
fn start_concurrent(
    shared: &Arc<Shared>,
    pq: &Arc<ProcessQueue>,
    listener: &ConcurrentListener,
    calls: Vec<Vec<Message>>,
    permit: OwnedSemaphorePermit,
) {
    let (shared, pq, listener) = (shared.clone(), pq.clone(), listener.clone());
    if shared.options.listener_non_blocking {
        // A task per call (the pull loop gives one call per slot here).
        let mut permit = Some(permit);
        for messages in calls {
            let (shared, pq, listener) = (shared.clone(), pq.clone(), listener.clone());
            let permit = permit.take();
            tokio::spawn(async move {
                let permit = match permit {
                    Some(permit) => permit,
                    None => match shared.pool.clone().acquire_owned().await {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                };
                concurrent_batch(shared, pq, listener, messages, permit).await
            });
        }
        return;
    }
    let runtime = tokio::runtime::Handle::current();
    let workers = shared.clone();
    // Not taken (the consumer is closing): the messages stay uncommitted and are
    // delivered again to whoever consumes the queue next.
    workers.workers.submit(Box::new(move || {
        for messages in calls {
            if pq.is_dropped() {
                return;
            }
            let started = std::time::Instant::now();
            let call = std::panic::AssertUnwindSafe(|| listener(&messages));
            let status = match std::panic::catch_unwind(call) {
                Ok(status) => Outcome::Returned(status),
                Err(_) => Outcome::Panicked,
            };
            shared.workers.record_call(started.elapsed());
            if settle_concurrent(&shared, &pq, &messages, status) {
                let (shared, pq, listener) = (shared.clone(), pq.clone(), listener.clone());
                runtime.spawn(async move { failed_batch(shared, pq, listener, messages).await });
            }
        }
        drop(permit);
    }));
}

/// Consumes one batch concurrently (a listener that never blocks, on a runtime task);
/// a failure goes to [`failed_batch`].
async fn concurrent_batch(
    shared: Arc<Shared>,
    pq: Arc<ProcessQueue>,
    listener: ConcurrentListener,
    messages: Vec<Message>,
    permit: OwnedSemaphorePermit,
) {
    // A queue given up (rebalance, shutdown) runs no listener: its new owner delivers
    // these messages again from the committed offset.
    if pq.is_dropped() {
        return;
    }
    let status = run_listener(&shared, listener.clone(), &messages).await;
    drop(permit);
    if settle_concurrent(&shared, &pq, &messages, status) {
        failed_batch(shared, pq, listener, messages).await;
    }
}

/// Books one attempt of a concurrent batch; true when it failed.
fn settle_concurrent(
    shared: &Shared,
    pq: &ProcessQueue,
    messages: &[Message],
    status: Outcome<ConsumeStatus>,
) -> bool {
    match status {
        Outcome::Cancelled => false,
        Outcome::Returned(ConsumeStatus::Success) => {
            add(&shared.counters.consumed, messages.len());
            pq.finish(offsets_of(messages));
            false
        }
        status => {
            if matches!(status, Outcome::Panicked) {
                shared.log(format_args!(
                    "listener panicked on {}; treated as ReconsumeLater",
                    describe(&pq.mq, &offsets_of(messages))
                ));
            }
            add(&shared.counters.retried, messages.len());
            true
        }
    }
}

/// A concurrent batch failed. In clustering mode each message goes back to the broker
/// (its group's retry topic, or the dead-letter topic after `max_reconsume_times`
/// retries) and counts as finished once the broker has it. What the broker did not take
/// (and, in broadcasting mode, everything: there is no shared retry topic) is consumed
/// again here after `reconsume_delay_ms`, for as long as it fails: a message is never
/// skipped, and the committed offset stays below it meanwhile.
async fn failed_batch(
    shared: Arc<Shared>,
    pq: Arc<ProcessQueue>,
    listener: ConcurrentListener,
    messages: Vec<Message>,
) {
    // Kept here for as long as they fail, sent back one at a time meanwhile: not holding
    // their answers' read buffers.
    // (The originals go now: kept, they would hold the buffers as long as the copies.)
    let mut messages: Vec<Message> = messages.into_iter().map(|m| m.detached()).collect();
    let mut failures: u64 = 0;
    loop {
        if pq.is_dropped() {
            return;
        }
        if shared.options.message_model == MessageModel::Clustering {
            messages = send_back_all(&shared, &pq, messages, 0, None).await;
            if messages.is_empty() {
                return;
            }
        } else {
            // Broadcasting has no retry topic nor dead-letter topic: a message that fails
            // for good is retried here for ever, holding its queue's committed offset. Said
            // at its 1st, 2nd, 4th, 8th... failure, so that it is seen without a line
            // every `reconsume_delay_ms`.
            failures += 1;
            if failures.is_power_of_two() {
                shared.log(format_args!(
                    "{} failed {failures} time(s) (broadcasting: no retry topic); consumed again here after {} ms for as long as it fails, its queue's committed offset held below it",
                    describe(&pq.mq, &offsets_of(&messages)),
                    shared.options.reconsume_delay_ms
                ));
            }
        }
        let Some(permit) = wait_to_retry(&shared, &pq).await else {
            return;
        };
        let status = run_listener(&shared, listener.clone(), &messages).await;
        drop(permit);
        if !settle_concurrent(&shared, &pq, &messages, status) {
            return;
        }
    }
}

/// Sends `messages` back to the broker (`delay_level` 0: its schedule of retries; negative:
/// the dead-letter topic) and finishes those it took; returns the others. With `orderly`
/// (the times each offset failed in place), the first one the broker does not take stops
/// the sending: what follows it is kept unsent, so none leaves the queue before one ahead
/// of it; and each copy counts the attempts made here.
async fn send_back_all(
    shared: &Shared,
    pq: &ProcessQueue,
    messages: Vec<Message>,
    delay_level: i32,
    orderly: Option<&std::collections::BTreeMap<u64, u32>>,
) -> Vec<Message> {
    let mut kept = Vec::new();
    let mut taken = Vec::with_capacity(messages.len());
    for m in messages {
        // A queue given up meanwhile is its new owner's to consume (from its commit point,
        // below these): nothing more is sent back from here. Orderly, nor once its lock
        // lapsed (looked at before each: each send waits for its copy to be durable).
        let orderly_stop = !kept.is_empty() || !pq.may_consume(shared);
        if (orderly.is_some() && orderly_stop) || pq.is_dropped() {
            kept.push(m);
            continue;
        }
        // Failed n times here: consumed again n - 1 times.
        let failed = orderly.and_then(|f| f.get(&m.queue_offset()).copied());
        let back = crate::client::group::SendBack {
            delay_level,
            max_reconsume_times: shared.options.max_reconsume_times,
            reconsumed: failed.unwrap_or(0).saturating_sub(1),
        };
        let sent = shared
            .client
            .send_back_reconsumed(&shared.group, &m, back)
            .await;
        match sent {
            Ok(r) => {
                add(&shared.counters.sent_back, 1);
                if r.dead_lettered {
                    add(&shared.counters.dead_lettered, 1);
                    shared.log(format_args!(
                        "{} went to the dead-letter topic after {} attempts",
                        describe(&pq.mq, &[m.queue_offset()]),
                        r.reconsume_times
                    ));
                }
                taken.push(m.queue_offset());
            }
            Err(e) => {
                shared.log(format_args!(
                    "sending {} back to the broker failed: {e}; consuming it again here",
                    describe(&pq.mq, &[m.queue_offset()])
                ));
                kept.push(m);
            }
        }
    }
    if !taken.is_empty() {
        pq.finish(taken);
    }
    kept
}

/// The pause before a retry, taken without holding a listener slot; then a slot. `None`
/// when the queue was given up or the consumer is closing meanwhile.
async fn wait_to_retry(shared: &Shared, pq: &ProcessQueue) -> Option<OwnedSemaphorePermit> {
    sleep(Duration::from_millis(shared.options.reconsume_delay_ms)).await;
    if pq.is_dropped() {
        return None;
    }
    let permit = shared.pool.clone().acquire_owned().await.ok()?;
    // The wait for a slot can be long (every slot busy): the queue may have gone to
    // another member meanwhile, which consumes these messages from its commit point.
    (!pq.is_dropped() && !shared.is_stopping()).then_some(permit)
}

/// The orderly task of one queue: the cached messages in offset order, one batch at a
/// time, only while the lock is valid; commits after each batch.
pub(super) async fn orderly_loop(
    shared: Arc<Shared>,
    pq: Arc<ProcessQueue>,
    listener: OrderlyListener,
) {
    // Failed attempts of each message (by offset) still cached: counted per message, as
    // RocketMQ counts reconsume times, so a batch that grew meanwhile does not take the
    // messages that joined it to the dead-letter topic early. A count goes when its message
    // is done (consumed or dead-lettered): a message cached later at the same offset (the
    // broker moved the position back after a crash) starts from none. A batch is the first
    // messages of one era, so the counts never grow along a batch.
    let mut failures: std::collections::BTreeMap<u64, u32> = std::collections::BTreeMap::new();
    loop {
        if pq.is_dropped() || shared.is_stopping() {
            return;
        }
        if !pq.may_consume(&shared) {
            pq.pause(LOCK_WAIT_MS).await;
            continue;
        }
        // Every cached message is kept in orderly mode; were one not, its offset would stay
        // cached (the queue waits), never be finished unseen.
        let batch: Vec<(u64, Message)> =
            (pq.state().tracker.first(shared.options.consume_batch_max))
                .into_iter()
                .map_while(|(offset, m)| Some((offset, m?)))
                .collect();
        if batch.is_empty() {
            // The pull task (new messages) and a drop wake it.
            pq.wake.notified().await;
            continue;
        }
        // A drop ends the wait for a slot (other queues' calls may hold them all): the
        // queue's hand-over does not wait for those. New messages do not: the wait keeps
        // its place in the slots' line.
        let mut acquire = std::pin::pin!(shared.pool.clone().acquire_owned());
        let permit = loop {
            tokio::select! {
                permit = &mut acquire => break permit,
                _ = pq.wake.notified() => {
                    if pq.is_dropped() {
                        return;
                    }
                }
            }
        };
        let Ok(permit) = permit else {
            return;
        };
        // Checked again right before the call: the wait for a slot may have been long.
        if pq.is_dropped() || !pq.may_consume(&shared) {
            continue;
        }
        let offsets: Vec<u64> = batch.iter().map(|(offset, _)| *offset).collect();
        // Those below the batch are finished (consumed or dead-lettered).
        failures = failures.split_off(&offsets[0]);
        let mut messages: Vec<Message> = batch.into_iter().map(|(_, m)| m).collect();
        let mut retry_rest = false;
        let status = run_listener(&shared, listener.clone(), &messages).await;
        drop(permit);
        match status {
            Outcome::Cancelled => return,
            Outcome::Returned(OrderlyStatus::Success) => {
                for offset in &offsets {
                    failures.remove(offset);
                }
                add(&shared.counters.consumed, offsets.len());
                pq.finish(offsets);
            }
            status => {
                if matches!(status, Outcome::Panicked) {
                    shared.log(format_args!(
                        "listener panicked on {}; treated as SuspendCurrentQueueAMoment",
                        describe(&pq.mq, &offsets)
                    ));
                }
                add(&shared.counters.retried, offsets.len());
                for offset in &offsets {
                    let count = failures.entry(*offset).or_default();
                    *count = count.saturating_add(1);
                }
                let max = shared.options.max_reconsume_times;
                let exhausted = if shared.options.message_model == MessageModel::Broadcasting {
                    0
                } else {
                    offsets.iter().take_while(|o| failures[*o] > max).count()
                };
                if exhausted == 0 {
                    pq.pause(shared.options.suspend_ms).await;
                    continue;
                }
                // Retried enough (the first `exhausted`, in offset order): to the dead-letter
                // topic, and the queue moves on to the rest. If the broker does not take
                // them, the queue waits and tries again (never skips). Not once the lock
                // lapsed during the call: the next owner consumes them from the committed
                // offset, and they would be both dead-lettered and consumed.
                if pq.is_dropped() || !pq.may_consume(&shared) {
                    continue;
                }
                messages.truncate(exhausted);
                let left = send_back_all(&shared, &pq, messages, -1, Some(&failures)).await;
                // Those taken are done; those left (a suffix) keep their counts.
                for offset in &offsets[..exhausted - left.len()] {
                    failures.remove(offset);
                }
                if !left.is_empty() {
                    pq.pause(shared.options.suspend_ms).await;
                    continue;
                }
                // The rest of the batch failed too: after the commit, a pause as for any
                // failure.
                retry_rest = exhausted < offsets.len();
            }
        }
        if let Err(e) = commit_queue(&shared, &pq).await {
            // The committer retries every interval; a handover commits again first.
            shared.log(format_args!(
                "committing {}[{}] failed: {e}",
                pq.mq.topic, pq.mq.queue_id
            ));
        }
        if retry_rest {
            pq.pause(shared.options.suspend_ms).await;
        }
    }
}
