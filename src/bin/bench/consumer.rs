//! The consumers of `ringmq-bench`: pull loops over their share of the queues (the
//! default), or push consumers of one group (`--group`); both count this run's messages
//! once each, recording end-to-end latency, and count duplicates apart.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::{sleep, Instant};

use ringmq::client::{
    Client, ClientConfig, ClientError, ConsumeFrom, ConsumeStatus, PullStatus, PushConsumer,
    PushConsumerOptions,
};

use crate::report::{record_us, Latencies};
use crate::{
    epoch_ns, Cli, Run, BODY_HEADER_BYTES, SEQ_NUMBER_MASK, SEQ_PRODUCER_SHIFT, SEQ_TAG_SHIFT,
};

/// Long-polling wait of the bench's pulls: short enough that consumers notice the end.
const PULL_WAIT_MS: u64 = 500;
/// Longest the run waits for push consumers (`--group`) to share the queues before it
/// starts producing anyway.
const SETTLE_TIMEOUT_S: u64 = 30;
/// Pause after a failed pull before the next one.
const PULL_ERROR_PAUSE_MS: u64 = 100;

/// Pulls one queue from `offset` until told to stop; returns its latency histograms.
pub(crate) async fn consume_queue(
    run: Arc<Run>,
    client: Client,
    queue_id: u32,
    mut offset: u64,
) -> Latencies {
    let mut latencies = Latencies::new();
    let wait = Duration::from_millis(PULL_WAIT_MS);
    while !run.stop_consumers.load(Ordering::Relaxed) {
        let pulled = match &run.cli.sql {
            None => {
                client
                    .pull(
                        &run.cli.topic,
                        queue_id,
                        offset,
                        run.cli.pull_batch,
                        wait,
                        &[],
                    )
                    .await
            }
            Some(sql) => {
                client
                    .pull_sql(
                        &run.cli.topic,
                        queue_id,
                        offset,
                        run.cli.pull_batch,
                        wait,
                        sql,
                    )
                    .await
            }
        };
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

/// The push consumers of `--group` started so far. Each goes in as soon as it starts, so
/// whatever ends the run (its end, an error, SIGINT or SIGTERM) finds every member that
/// must leave the group: [`leave_group`].
pub(crate) type Started = Arc<Mutex<Vec<Arc<PushConsumer>>>>;

/// The end-to-end histograms of the push consumers of `--group`, one each.
pub(crate) struct PushConsumers {
    pub(crate) latencies: Vec<Arc<Mutex<Latencies>>>,
}

/// Has every push consumer in `started` leave the group cleanly, all at once (each
/// commits, gives back its queues and unregisters, so the group is free at once, not when
/// their sessions time out: a rerun was refused as "members running" meanwhile). Returns
/// the pull errors they counted. They stay in `started` until they have left: a leave cut
/// short (a signal during the run's own) is waited for by the next (a shutdown waits for
/// one in progress).
pub(crate) async fn leave_group(started: &Started) -> u64 {
    let consumers = lock(started).clone();
    let mut pull_errors = 0;
    let mut leaving = Vec::with_capacity(consumers.len());
    for consumer in consumers {
        pull_errors += consumer.stats().pull_errors;
        leaving.push(tokio::spawn(async move { consumer.shutdown().await }));
    }
    for (c, left) in leaving.into_iter().enumerate() {
        match left.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("ringmq-bench: push consumer {c} shut down with an error: {e}"),
            Err(e) => eprintln!("ringmq-bench: push consumer {c} shutdown task: {e}"),
        }
    }
    lock(started).clear();
    pull_errors
}

/// Refuses a group an application may be consuming: one with members running (the bench
/// would share its queues and move its offsets), and one whose committed offsets are below
/// `start_offsets`, the queues' ends (setting them there would skip the messages between
/// for the group), unless `--skip-group-backlog`. A group with no committed offset on the
/// topic counts as new. Run before anything is sent.
pub(crate) async fn check_group_is_the_benchs(
    cli: &Cli,
    admin: &Client,
    group: &str,
    start_offsets: &[u64],
) -> Result<(), String> {
    let members = (admin.group_members(group).await)
        .map_err(|e| format!("members of group {group}: {e}"))?
        .members
        .len();
    if members > 0 {
        return Err(format!(
            "group {group} has {members} member(s) running: the bench would share its queues and move its committed offsets; give --group a group of the bench's own (a bench killed a moment ago, not stopped by SIGINT or SIGTERM, leaves its members until their sessions time out)"
        ));
    }
    if cli.skip_group_backlog {
        return Ok(());
    }
    let mut behind = 0u64;
    for (queue, end) in start_offsets.iter().enumerate() {
        let committed = (admin.query_offset(group, &cli.topic, queue as u32).await)
            .map_err(|e| format!("group {group}'s offset of queue {queue}: {e}"))?;
        behind += committed.map_or(0, |c| end.saturating_sub(c));
    }
    if behind > 0 {
        return Err(format!(
            "group {group} has {behind} message(s) of {} not consumed yet: starting it at the queues' ends would skip them; give --group a group of the bench's own, or --skip-group-backlog if only the bench consumes {group}",
            cli.topic
        ));
    }
    Ok(())
}

/// Sets `group`'s offsets to `start_offsets` (the queues' ends: messages of earlier runs
/// are skipped, as the pull loops do), then starts `--consumers` push consumers of the
/// group and waits until they share the queues. Their listeners count into the run once
/// `run` is set (nothing is sent before).
pub(crate) async fn start_push_consumers(
    cli: &Cli,
    config: &ClientConfig,
    admin: &Client,
    group: &str,
    start_offsets: &[u64],
    run: Arc<OnceLock<Arc<Run>>>,
    started: &Started,
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
        match &cli.sql {
            Some(sql) => consumer.subscribe_sql(&cli.topic, sql).map_err(fail)?,
            None => consumer.subscribe(&cli.topic, "*").map_err(fail)?,
        }
        let latencies = Arc::new(Mutex::new(Latencies::new()));
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
        lock(started).push(Arc::new(consumer));
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
        let settled = {
            let started = lock(started);
            assigned.len() == started.len()
                && started.iter().all(|c| {
                    let id = c.client().map(|c| c.config().client_id.clone());
                    // The group's retry topic is consumed too; only the bench topic's queues count.
                    let mut consuming: Vec<u32> = c
                        .consuming_queues()
                        .iter()
                        .filter(|q| q.topic == cli.topic)
                        .map(|q| q.queue_id)
                        .collect();
                    consuming.sort_unstable();
                    id.and_then(|id| assigned.get(id.as_str()).cloned()) == Some(consuming)
                })
        };
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

fn lock(started: &Started) -> std::sync::MutexGuard<'_, Vec<Arc<PushConsumer>>> {
    started.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts the messages of this run seen for the first time, recording the end-to-end
/// latency of those due after the warm-up; returns (new, duplicates). Messages of other runs are ignored.
fn count_new(
    run: &Run,
    messages: &[ringmq::client::Message],
    now_ns: u64,
    latencies: &mut Latencies,
) -> (u64, u64) {
    let delay_ns = run.cli.delay_ms.unwrap_or(0).saturating_mul(1_000_000);
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
        counted += 1;
        if sent_at_ns < run.measure_from_ns {
            continue; // due in the warm-up
        }
        let e2e_ns = now_ns.saturating_sub(sent_at_ns);
        record_us(&mut latencies.e2e, Duration::from_nanos(e2e_ns));
        if delay_ns > 0 {
            record_us(
                &mut latencies.lateness,
                Duration::from_nanos(e2e_ns.saturating_sub(delay_ns)),
            );
        }
    }
    (counted, duplicates)
}
