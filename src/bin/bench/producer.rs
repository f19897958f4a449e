//! The producers of `ringmq-bench`: each sends numbered, time-stamped messages (one by one
//! or in batches, round-robin or by sharding key) with at most `--in-flight` sends
//! outstanding, closed loop (as fast as the window allows) or open loop (`--rate`: on a
//! fixed schedule, latency counted from the scheduled time).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use futures_util::future::Either;
use ringmq::client::{ClientError, OutgoingMessage, Producer};

use crate::report::{histogram, record_us};
use crate::{epoch_ns, Run, SEQ_NUMBER_MASK, SEQ_PRODUCER_SHIFT, SEQ_TAG_SHIFT};

/// A message body: send time, sequence, then zeros up to `size`.
fn body(size: usize, sent_at_ns: u64, seq: u64) -> Vec<u8> {
    let mut body = vec![0u8; size];
    body[..8].copy_from_slice(&sent_at_ns.to_le_bytes());
    body[8..16].copy_from_slice(&seq.to_le_bytes());
    body
}

/// One producer's sending state: its sends in flight (bounded by the window), its
/// send-latency histogram, and the numbering of its messages.
struct Sender {
    /// What each send's future holds: one count taken per send, on this producer's own.
    of_sends: Arc<OfSends>,
    window: Arc<Semaphore>,
    first_seq: u64,
    quota: Option<u64>,
    /// Messages handed to sends so far.
    scheduled_messages: u64,
}

/// A producer's part of the run that its sends use when answered.
struct OfSends {
    run: Arc<Run>,
    producer: Producer,
    latencies: Mutex<Histogram<u64>>,
}

impl Sender {
    fn new(run: Arc<Run>, producer: Producer, index: usize, quota: Option<u64>) -> Sender {
        let first_seq =
            (u64::from(run.tag) << SEQ_TAG_SHIFT) | ((index as u64) << SEQ_PRODUCER_SHIFT);
        Sender {
            window: Arc::new(Semaphore::new(run.cli.in_flight)),
            of_sends: Arc::new(OfSends {
                latencies: Mutex::new(histogram()),
                run,
                producer,
            }),
            first_seq,
            quota,
            scheduled_messages: 0,
        }
    }

    fn run(&self) -> &Run {
        &self.of_sends.run
    }

    /// Messages the next send carries; 0 when the quota is spent.
    fn next_count(&self) -> usize {
        let batch = self.run().cli.batch;
        match self.quota {
            Some(q) => batch
                .min(usize::try_from(q.saturating_sub(self.scheduled_messages)).unwrap_or(batch)),
            None => batch,
        }
    }

    /// One send of `count` messages stamped with `scheduled`, counted when answered.
    fn send(
        &mut self,
        scheduled: Instant,
        count: usize,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let cli = &self.run().cli;
        let sent_at_ns = epoch_ns(scheduled);
        let mut messages: Vec<OutgoingMessage> = (0..count)
            .map(|i| {
                let n = self.scheduled_messages + i as u64;
                let number = n & SEQ_NUMBER_MASK;
                let message =
                    OutgoingMessage::new(body(cli.size, sent_at_ns, self.first_seq | number));
                let message = match cli.delay_ms {
                    Some(ms) => message.with_delay_ms(ms),
                    None => message,
                };
                let message = match cli.sql {
                    Some(_) => message.with_property("n100", (n % 100).to_string()),
                    None => message,
                };
                match cli.keys {
                    Some(keys) => message.with_sharding_key(format!("k{}", n % keys)),
                    None => message,
                }
            })
            .collect();
        let expected = match &self.run().sql {
            None => count as u64,
            Some(filter) => (0..count as u64)
                .filter(|i| {
                    let n100 = ((self.scheduled_messages + i) % 100).to_string();
                    filter.matches(&|name| (name == "n100").then_some(n100.as_str()))
                })
                .count() as u64,
        };
        self.scheduled_messages += count as u64;
        let of = self.of_sends.clone();
        // A single send's future holds only its own send's future, as an application's
        // window of single sends would; a batch's (larger, one per batch) is boxed.
        if self.run().cli.batch == 1 {
            let message = messages.pop();
            Either::Left(async move {
                let outcome = match message {
                    Some(m) => of.producer.send(&of.run.cli.topic, m).await.map(|_| ()),
                    None => Ok(()),
                };
                of.sent(scheduled, count, expected, outcome);
            })
        } else {
            Either::Right(Box::pin(async move {
                let outcome = of.producer.send_batch(&of.run.cli.topic, messages).await;
                of.sent(scheduled, count, expected, outcome.map(|_| ()));
            }))
        }
    }

    /// Waits for every send in flight (each holds a permit) and returns the histogram.
    async fn finish(self) -> Histogram<u64> {
        let permits = u32::try_from(self.run().cli.in_flight).unwrap_or(u32::MAX);
        let _all = self.window.acquire_many(permits).await;
        let of = &self.of_sends;
        of.run
            .stats
            .busy_answers
            .fetch_add(of.producer.busy_answers(), Ordering::Relaxed);
        let h = of
            .latencies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        h
    }
}

impl OfSends {
    /// Counts a send of `count` messages (`expected` of them for the consumers) as answered.
    fn sent(
        &self,
        scheduled: Instant,
        count: usize,
        expected: u64,
        outcome: Result<(), ClientError>,
    ) {
        let stats = &self.run.stats;
        match outcome {
            Ok(()) => {
                if scheduled >= self.run.measure_from {
                    record_us(
                        &mut self
                            .latencies
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner),
                        scheduled.elapsed(),
                    );
                }
                stats.sent.fetch_add(count as u64, Ordering::Relaxed);
                stats.expected.fetch_add(expected, Ordering::Relaxed);
            }
            Err(e) => {
                stats.send_errors.fetch_add(count as u64, Ordering::Relaxed);
                stats.error("send", &e);
            }
        }
    }
}

/// Closed loop: a send starts as soon as one of the `--in-flight` before it is answered;
/// its latency counts from then. The sends in flight are polled by this one task (no task
/// per send), as an application keeping a window of sends would.
async fn produce_closed(mut sender: Sender) -> Histogram<u64> {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let deadline = sender
        .run()
        .cli
        .send_period()
        .map(|d| sender.run().start + d);
    let window = sender.run().cli.in_flight.max(1);
    let mut in_flight = FuturesUnordered::new();
    loop {
        while in_flight.len() < window {
            let count = sender.next_count();
            let now = Instant::now();
            if count == 0 || deadline.is_some_and(|d| now >= d) {
                break;
            }
            in_flight.push(sender.send(now, count));
        }
        if in_flight.next().await.is_none() {
            break;
        }
    }
    sender.finish().await
}

/// Open loop, on one thread for all producers: each producer's send `n` is due at `start +
/// n * interval`, whatever happened to earlier sends, and its latency counts from that time
/// (waiting for window room included). The producers' sends fall due together, so the
/// thread wakes once per interval and starts them with one task (one cross-thread wake-up
/// of the runtime per interval, not one per send). It sleeps with the OS timer (tens of
/// microseconds of slack) rather than tokio's 1 ms timer wheel, whose rounding would
/// otherwise show up as latency. It also builds every producer's messages: with many
/// producers or large batches at a high rate, this one thread is what falls behind first
/// (reported as the target rate not sustained).
fn produce_open(
    mut senders: Vec<Sender>,
    handle: tokio::runtime::Handle,
    interval: Duration,
) -> Vec<Sender> {
    let Some(run) = senders.first().map(|s| s.of_sends.run.clone()) else {
        return senders;
    };
    let deadline = run.cli.send_period().map(|d| run.start + d);
    let mut sends: u32 = 0;
    loop {
        let due = run.start + interval.saturating_mul(sends);
        if let Some(deadline) = deadline {
            if due >= deadline {
                break;
            }
            // Behind schedule at the end: stop on time rather than issue the backlog.
            if Instant::now() >= deadline {
                let due_total =
                    deadline.duration_since(run.start).as_secs_f64() / interval.as_secs_f64();
                eprintln!(
                    "ringmq-bench: the producers started {sends} of the {due_total:.0} sends \
                     each was due: the target rate is above what was sustained"
                );
                break;
            }
        }
        if senders.iter().all(|s| s.next_count() == 0) {
            // Every quota is spent.
            break;
        }
        if crate::INTERRUPTED.load(Ordering::Relaxed) {
            break;
        }
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        let mut due_sends = Vec::with_capacity(senders.len());
        for sender in &mut senders {
            let count = sender.next_count();
            if count == 0 {
                continue;
            }
            let permit = match sender.window.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    // A full window: the sends already due for other producers go first,
                    // then this one waits for room (the wait counts as its latency, and
                    // holds back the next interval's sends).
                    if !due_sends.is_empty() {
                        handle.spawn(futures_util::future::join_all(std::mem::take(
                            &mut due_sends,
                        )));
                    }
                    match handle.block_on(sender.window.clone().acquire_owned()) {
                        Ok(permit) => permit,
                        Err(_) => continue,
                    }
                }
            };
            let send = sender.send(due, count);
            due_sends.push(async move {
                send.await;
                drop(permit);
            });
        }
        if !due_sends.is_empty() {
            handle.spawn(futures_util::future::join_all(due_sends));
        }
        sends = sends.saturating_add(1);
    }
    senders
}

/// The producers, closed or open loop; returns their send-latency histograms merged.
pub(crate) async fn produce_all(
    run: Arc<Run>,
    producers: Vec<(Producer, Option<u64>)>,
) -> Result<Histogram<u64>, String> {
    let senders: Vec<Sender> = producers
        .into_iter()
        .enumerate()
        .map(|(index, (producer, quota))| Sender::new(run.clone(), producer, index, quota))
        .collect();
    let mut merged = histogram();
    if run.cli.rate == 0 {
        let producing: Vec<_> = senders
            .into_iter()
            .map(|sender| tokio::spawn(produce_closed(sender)))
            .collect();
        for (p, producing) in producing.into_iter().enumerate() {
            let h = producing
                .await
                .map_err(|e| format!("producer {p} task: {e}"))?;
            merged
                .add(&h)
                .map_err(|e| format!("merging histograms: {e}"))?;
        }
        return Ok(merged);
    }
    // One send (of `batch` messages) per interval, per producer.
    let cli = &run.cli;
    let interval =
        Duration::from_secs_f64(cli.batch as f64 * cli.producers as f64 / cli.rate as f64);
    let handle = tokio::runtime::Handle::current();
    let senders = tokio::task::spawn_blocking(move || produce_open(senders, handle, interval))
        .await
        .map_err(|e| format!("the producers' scheduler: {e}"))?;
    for sender in senders {
        let h = sender.finish().await;
        merged
            .add(&h)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    Ok(merged)
}
