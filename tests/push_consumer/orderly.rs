//! Ordered consumption: orderly members keep each key's order across a hand-over and a
//! member's death, and consumers catching up a backlog pipeline their pulls (concurrent and
//! orderly), each message once and in order. Helpers are the parent module's.

use super::*;
use std::time::Instant;

/// Key → sequence numbers in delivery order.
type OrderLog = Arc<Mutex<BTreeMap<String, Vec<u32>>>>;

async fn orderly(addr: &str, group: &str, topic: &str, log: &OrderLog) -> PushConsumer {
    orderly_with(addr, group, topic, log, options()).await
}

/// A started orderly consumer of `topic` with `options` that logs `key:seq` bodies.
async fn orderly_with(
    addr: &str,
    group: &str,
    topic: &str,
    log: &OrderLog,
    options: PushConsumerOptions,
) -> PushConsumer {
    let consumer = PushConsumer::new(ClientConfig::new(addr), group, options).unwrap();
    consumer.subscribe(topic, "*").unwrap();
    let log = log.clone();
    consumer
        .register_orderly(move |messages| {
            let mut log = log.lock().unwrap();
            for m in messages {
                let body = String::from_utf8_lossy(m.body()).into_owned();
                let (key, seq) = body.split_once(':').unwrap();
                log.entry(key.to_owned())
                    .or_default()
                    .push(seq.parse().unwrap());
            }
            OrderlyStatus::Success
        })
        .unwrap();
    consumer.start().await.unwrap();
    consumer
}

fn keyed(keys: usize, from: u32, to: u32) -> Vec<OutgoingMessage> {
    let mut messages = Vec::new();
    for seq in from..to {
        for k in 0..keys {
            messages.push(
                OutgoingMessage::new(format!("k{k}:{seq}")).with_sharding_key(format!("k{k}")),
            );
        }
    }
    messages
}

/// Every key's messages arrived once each, in order.
fn check_in_order(log: &OrderLog, keys: usize, count: u32) {
    let log = log.lock().unwrap();
    assert_eq!(log.len(), keys);
    for (key, seqs) in log.iter() {
        assert_eq!(*seqs, (0..count).collect::<Vec<_>>(), "key {key}");
    }
}

/// Like [`check_in_order`] for a member that died: first deliveries are in order, and a
/// message is delivered again only if the dead member had consumed it without committing
/// (at most its last batch per queue).
fn check_in_order_redelivering_at_most(log: &OrderLog, count: u32, again_max: usize) {
    let log = log.lock().unwrap();
    let mut again = 0;
    for (key, seqs) in log.iter() {
        let mut seen = BTreeSet::new();
        let firsts: Vec<u32> = seqs.iter().copied().filter(|s| seen.insert(*s)).collect();
        assert_eq!(firsts, (0..count).collect::<Vec<_>>(), "key {key}");
        again += seqs.len() - firsts.len();
    }
    assert!(again <= again_max, "{again} re-deliveries: {log:?}");
}

#[test]
fn orderly_consumers_keep_key_order_across_a_hand_over() {
    with_broker(|addr| async move {
        let (topic, group) = ("ordered", "g-ordered");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 4).await.unwrap();
        let log: OrderLog = Arc::default();
        let first = orderly(&addr, group, topic, &log).await;
        let second = orderly(&addr, group, topic, &log).await;
        settled(&[&first, &second], 4).await;

        send_all(&producer, topic, keyed(8, 0, 25)).await;
        let consumed = |log: &OrderLog| log.lock().unwrap().values().map(Vec::len).sum::<usize>();
        eventually("the first 200", || consumed(&log) == 200).await;
        check_in_order(&log, 8, 25);

        // The first member leaves while messages keep coming: the second locks its
        // queues and goes on from the committed offsets, in order, without duplicates.
        let sending = {
            let producer = producer.clone();
            tokio::spawn(async move { send_all(&producer, topic, keyed(8, 25, 50)).await })
        };
        first.shutdown().await.unwrap();
        sending.await.unwrap();
        settled(&[&second], 4).await;
        eventually("all 400", || consumed(&log) == 400).await;
        caught_up(&client, group, topic).await;
        check_in_order(&log, 8, 50);
        second.shutdown().await.unwrap();
    });
}

#[test]
fn an_orderly_member_that_dies_hands_its_queues_over_in_order() {
    with_broker(|addr| async move {
        let (topic, group) = ("ordered-crash", "g-ordered-crash");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 4).await.unwrap();
        let log: OrderLog = Arc::default();

        // The member that dies runs on its own runtime: shutting that down stops its tasks
        // where they are and closes its sockets, like a killed process.
        let doomed_runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        {
            let (addr, log) = (addr.clone(), log.clone());
            doomed_runtime.spawn(async move {
                let doomed = orderly(&addr, group, topic, &log).await;
                let _ = ready_tx.send(doomed.client().unwrap().config().client_id.clone());
                std::future::pending::<()>().await;
                drop(doomed);
            });
        }
        let doomed_id = ready_rx.await.unwrap();
        let survivor = orderly(&addr, group, topic, &log).await;
        // Both members hold queues.
        eventually("both members to hold queues", || {
            survivor.consuming_queues().len() == 2
        })
        .await;
        let members = client.group_members(group).await.unwrap();
        assert!(members.members.iter().any(|m| m.client_id == doomed_id));

        send_all(&producer, topic, keyed(8, 0, 25)).await;
        let distinct = |log: &OrderLog| {
            log.lock()
                .unwrap()
                .values()
                .map(|seqs| seqs.iter().collect::<BTreeSet<_>>().len())
                .sum::<usize>()
        };
        eventually("the first 200", || distinct(&log) == 200).await;
        // It dies while messages flow.
        let sending = {
            let producer = producer.clone();
            tokio::spawn(async move { send_all(&producer, topic, keyed(8, 25, 50)).await })
        };
        eventually("some of the next 200", || distinct(&log) >= 240).await;
        doomed_runtime.shutdown_background();
        sending.await.unwrap();
        eventually("the survivor to hold every queue", || {
            survivor.consuming_queues().len() == 4
        })
        .await;
        eventually("all 400", || distinct(&log) == 400).await;
        caught_up(&client, group, topic).await;
        check_in_order_redelivering_at_most(&log, 50, 4);
        survivor.shutdown().await.unwrap();
    });
}

/// A batch of `n` messages of one key, `key:seq` for `seq` in `from..from + n`.
fn keyed_batch(key: &str, from: u32, n: u32) -> Vec<OutgoingMessage> {
    (from..from + n)
        .map(|seq| OutgoingMessage::new(format!("{key}:{seq}")).with_sharding_key(key))
        .collect()
}

#[test]
fn consumers_catching_up_a_backlog_pipeline_pulls_and_get_each_message_once_in_order() {
    with_broker(|addr| async move {
        let (topic, keyed_topic, big_topic) = ("backlog", "backlog-keyed", "backlog-big");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 4).await.unwrap();
        client.create_topic(keyed_topic, 4).await.unwrap();
        client.create_topic(big_topic, 1).await.unwrap();
        // The backlog is there before any consumer: 6,000 messages in batches of 50, in
        // runs of 7 messages per tag (A, B, C), so a filter's answers vary in length.
        let tags = ["A", "B", "C"];
        let (mut all, mut matching) = (BTreeSet::new(), BTreeSet::new());
        for b in 0..120 {
            let batch: Vec<OutgoingMessage> = (0..50)
                .map(|i| {
                    let n = b * 50 + i;
                    let tag = tags[(n / 7) % 3];
                    let body = format!("m-{n}");
                    all.insert(body.clone());
                    if tag != "C" {
                        matching.insert(body.clone());
                    }
                    OutgoingMessage::new(body).with_tags(tag)
                })
                .collect();
            producer.send_batch(topic, batch).await.unwrap();
        }
        // 8 keys x 400 messages, in batches of 40 per key (one key's batch goes to the
        // key's queue).
        let (keys, per_key) = (8u32, 400u32);
        for round in 0..per_key / 40 {
            for k in 0..keys {
                let batch = keyed_batch(&format!("k{k}"), round * 40, 40);
                producer.send_batch(keyed_topic, batch).await.unwrap();
            }
        }

        // 60 messages of 600 KiB: an answer holds what fits in one frame (6 of them, not
        // the 16 asked for), so pulls sent ahead would start past its end and be redone:
        // after a short answer, none is sent ahead.
        let big: Vec<OutgoingMessage> = (0..60)
            .map(|i| {
                let mut body = format!("big-{i}:").into_bytes();
                body.resize(600 << 10, b'.');
                OutgoingMessage::new(body)
            })
            .collect();
        send_all(&producer, big_topic, big).await;

        // Small pulls, a small cache and deep pipelines: many pulls ahead, cut short by
        // the cache, by the filter, by the frame size and by the queues' ends.
        let options = PushConsumerOptions {
            consume_from: ConsumeFrom::FirstOffset,
            pull_batch_max: 16,
            pulls_in_flight_max: 8,
            cached_messages_max: 200,
            consume_batch_max: 8,
            listener_non_blocking: true,
            ..options()
        };
        let (all_log, matching_log): (Log, Log) = (Arc::default(), Arc::default());
        let everything = concurrent(
            &addr,
            "g-backlog-all",
            topic,
            "*",
            options.clone(),
            &all_log,
            0,
        )
        .await;
        let filtered = concurrent(
            &addr,
            "g-backlog-ab",
            topic,
            "A || B",
            options.clone(),
            &matching_log,
            1,
        )
        .await;
        let big_log: Log = Arc::default();
        let big = concurrent(
            &addr,
            "g-backlog-big",
            big_topic,
            "*",
            options.clone(),
            &big_log,
            2,
        )
        .await;
        let order_log: OrderLog = Arc::default();
        let ordered =
            orderly_with(&addr, "g-backlog-ordered", keyed_topic, &order_log, options).await;

        caught_up(&client, "g-backlog-all", topic).await;
        caught_up(&client, "g-backlog-ab", topic).await;
        caught_up(&client, "g-backlog-ordered", keyed_topic).await;
        caught_up(&client, "g-backlog-big", big_topic).await;
        check_exactly_once(&all_log, &all);
        let big_names: BTreeSet<String> = big_log
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.body.split_once(':').unwrap().0.to_owned())
            .collect();
        assert_eq!(big_names, names("big", 60));
        assert_eq!(big_log.lock().unwrap().len(), 60, "each big message once");
        let stats = big.stats();
        assert_eq!(
            (stats.pulls_ahead, stats.pulls_discarded),
            (0, 0),
            "answers cut by the frame size, each followed by one pull: {stats:?}"
        );
        check_exactly_once(&matching_log, &matching);
        check_in_order(&order_log, keys as usize, per_key);
        for (name, consumer) in [
            ("everything", &everything),
            ("filtered", &filtered),
            ("ordered", &ordered),
        ] {
            let stats = consumer.stats();
            assert!(stats.pulls_ahead > 0, "{name} pulled ahead: {stats:?}");
            consumer.shutdown().await.unwrap();
        }
        big.shutdown().await.unwrap();
    });
}

/// A member shutting down keeps its heartbeats while its last listener calls end, so a
/// call that outlasts the broker's session timeout keeps its queue's lock: another member
/// takes the queue only once the call ended and the lock was given up. Before, the
/// heartbeats stopped first: the broker dropped the member and its locks after the session
/// timeout, and the other member consumed the queue while the call still ran.
#[test]
fn a_member_shutting_down_keeps_its_queues_locked_until_its_last_call_ends() {
    with_broker_and(
        |cfg| cfg.session_timeout_ms = 1_000,
        |addr| async move {
            let topic = "slow-end";
            let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
            producer.client().create_topic(topic, 1).await.unwrap();
            let calls: Calls = Arc::default();
            let slow = ("slow", Duration::from_secs(3));
            // Sorted first, the first member keeps the one queue when the second joins.
            let member =
                |name| recording_member(&addr, ("g-slow-end", topic), name, &calls, slow, false);
            let a = member("a-slow").await;
            all_consuming(&[&a], 1).await;
            producer
                .send(topic, OutgoingMessage::new("slow"))
                .await
                .unwrap();
            let b = member("b-slow").await;
            producer
                .send(topic, OutgoingMessage::new("after"))
                .await
                .unwrap();
            // The slow call is under way (it ends in 3 s): a shuts down meanwhile.
            let shutdown = tokio::spawn(async move { a.shutdown().await });
            eventually("b consumes what came after", || {
                calls
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|c| c.0 == "b-slow" && c.1 == "after")
            })
            .await;
            shutdown.await.unwrap().unwrap();
            let calls = calls.lock().unwrap().clone();
            let slow_ended = (calls.iter())
                .find(|c| c.0 == "a-slow" && c.1 == "slow")
                .map(|c| c.3)
                .expect("a consumed the slow one");
            for (_, body, started, _) in calls.iter().filter(|c| c.0 == "b-slow") {
                assert!(
                    *started >= slow_ended,
                    "b consumed {body} while a's call on the slow one still ran: {calls:?}"
                );
            }
            b.shutdown().await.unwrap();
        },
    );
}

/// (member, body, started, ended) of each listener call.
type Calls = Arc<Mutex<Vec<(&'static str, String, Instant, Instant)>>>;

/// An orderly member of `group` on `topic` named `name` (sorted by it among members),
/// one message a call, recording its calls; `slow` bodies take `slow_for`, blocking the
/// listener's thread (with `non_blocking`, the member's whole runtime).
async fn recording_member(
    addr: &str,
    (group, topic): (&str, &str),
    name: &'static str,
    calls: &Calls,
    slow: (&'static str, Duration),
    non_blocking: bool,
) -> PushConsumer {
    let unwatched = Arc::default();
    recording_member_with(
        addr,
        (group, topic),
        name,
        calls,
        slow,
        non_blocking,
        &unwatched,
    )
    .await
}

/// [`recording_member`], setting `slow_started` when a slow call starts.
async fn recording_member_with(
    addr: &str,
    (group, topic): (&str, &str),
    name: &'static str,
    calls: &Calls,
    (slow, slow_for): (&'static str, Duration),
    non_blocking: bool,
    slow_started: &Arc<std::sync::atomic::AtomicBool>,
) -> PushConsumer {
    let mut config = ClientConfig::new(addr);
    config.client_id = stable_id(name);
    let options = PushConsumerOptions {
        consume_batch_max: 1,
        listener_non_blocking: non_blocking,
        ..options()
    };
    let consumer = PushConsumer::new(config, group, options).unwrap();
    consumer.subscribe(topic, "*").unwrap();
    let (calls, slow_started) = (calls.clone(), slow_started.clone());
    consumer
        .register_orderly(move |messages| {
            for m in messages {
                let body = String::from_utf8_lossy(m.body()).into_owned();
                let started = Instant::now();
                if body == slow {
                    slow_started.store(true, Ordering::SeqCst);
                    std::thread::sleep(slow_for);
                }
                calls
                    .lock()
                    .unwrap()
                    .push((name, body, started, Instant::now()));
            }
            OrderlyStatus::Success
        })
        .unwrap();
    consumer.start().await.unwrap();
    consumer
}

/// A member whose heartbeats stalled past the session timeout (its whole process stood
/// still, its connection open) was dropped by the broker with its locks, and another
/// member took its queue. When it runs again, its next heartbeat joins the group anew: the
/// locks it held before are void, so it consumes the queue only after locking it again
/// (once the other member gave it up) and from the committed offset. Before, the
/// acknowledged heartbeat made its old lease look valid, and it consumed the messages it
/// had cached while the other member still held the queue.
#[test]
fn a_member_whose_heartbeats_lapsed_locks_its_queues_again_before_consuming() {
    with_broker_and(
        |cfg| cfg.session_timeout_ms = 1_000,
        |addr| async move {
            let (group, topic) = ("g-lapse", "lapse");
            let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
            producer.client().create_topic(topic, 1).await.unwrap();
            let calls: Calls = Arc::default();
            // The first member on a runtime of its own, one thread: its "stall" call stops
            // all of it, heartbeats included, for 2.5 s.
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let first = {
                let (addr, calls) = (addr.clone(), calls.clone());
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async move {
                        let stall = ("stall", Duration::from_millis(2_500));
                        let a =
                            recording_member(&addr, (group, topic), "a-lapse", &calls, stall, true)
                                .await;
                        let _ = ready_tx.send(());
                        let _ = stop_rx.await;
                        a.shutdown().await.unwrap();
                    });
                })
            };
            ready_rx.await.unwrap();
            producer
                .send(topic, OutgoingMessage::new("first"))
                .await
                .unwrap();
            eventually("a consumes the first", || calls.lock().unwrap().len() == 1).await;
            // Sorted after it, the second member gets no queue while the first is live.
            let slow = ("stall", Duration::from_secs(3));
            // A member once started: its first heartbeat was answered.
            let b = recording_member(&addr, (group, topic), "b-lapse", &calls, slow, false).await;
            let messages: Vec<OutgoingMessage> = std::iter::once("stall".to_owned())
                .chain((0..5).map(|i| format!("m{i}")))
                .map(OutgoingMessage::new)
                .collect();
            producer.send_batch(topic, messages).await.unwrap();
            // The first member has the queue back (sorted first) and consumes to the end.
            eventually("a consumes m4", || {
                let calls = calls.lock().unwrap();
                calls.iter().any(|c| c.0 == "a-lapse" && c.1 == "m4")
            })
            .await;
            // Both shut down, their calls ended: every call is in the record.
            let _ = stop_tx.send(());
            first.join().unwrap();
            b.shutdown().await.unwrap();
            let calls = calls.lock().unwrap().clone();
            let stalled =
                |c: &&(&str, String, Instant, Instant)| c.0 == "a-lapse" && c.1 == "stall";
            assert!(calls.iter().any(|c| stalled(&c)), "a stalled: {calls:?}");
            assert!(
                calls.iter().any(|c| c.0 == "b-lapse" && c.1 == "stall"),
                "b took the queue while a stood still: {calls:?}"
            );
            // Apart from the call a was in when it stood still, no call of one member ran
            // while one of the other did.
            let of = |who: &'static str| calls.iter().filter(move |c| c.0 == who && !stalled(c));
            for a in of("a-lapse") {
                for b in of("b-lapse") {
                    assert!(
                        a.3 <= b.2 || b.3 <= a.2,
                        "a consumed {} while b consumed {}: {calls:?}",
                        a.1,
                        b.1
                    );
                }
            }
        },
    );
}

/// An orderly member giving up a queue whose listener call still runs (a rebalance moved
/// it to another member) goes on renewing its locks meanwhile: its other queue is consumed
/// all along, and the moved queue's lock is kept until the call ends, so that the next
/// owner starts only then. Before, the member's controller waited for the call: no lock
/// was renewed, the other queue stopped once its lease lapsed (7.5 s here), and the
/// broker's lock on the moved queue lapsed too (15 s, the least `--lock-expiry-ms` takes),
/// so the next owner consumed it while the call (18 s) still ran.
#[test]
fn a_queue_handed_over_mid_call_keeps_its_lock_and_the_members_other_queue_goes_on() {
    with_broker_and(
        |cfg| cfg.lock_expiry_ms = 15_000,
        |addr| async move {
            let (group, topic) = ("g-hand-over", "hand-over");
            let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
            producer.client().create_topic(topic, 2).await.unwrap();
            // A sharding key of each queue.
            let mut keys: [Option<String>; 2] = [None, None];
            for k in 0..1000 {
                let key = format!("k{k}");
                let probe = OutgoingMessage::new("probe").with_sharding_key(key.clone());
                let sent = producer.send(topic, probe).await.unwrap();
                keys[sent.queue_id as usize].get_or_insert(key);
                if keys.iter().all(Option::is_some) {
                    break;
                }
            }
            let [Some(k0), Some(k1)] = keys else {
                panic!("no key found for each queue: {keys:?}");
            };
            let calls: Calls = Arc::default();
            let slow = ("slow", Duration::from_secs(18));
            let slow_started = Arc::default();
            // Sorted first, a keeps queue 0 when b joins; b gets queue 1.
            let a = recording_member_with(
                &addr,
                (group, topic),
                "a-hand-over",
                &calls,
                slow,
                false,
                &slow_started,
            )
            .await;
            all_consuming(&[&a], 2).await;
            producer
                .send(
                    topic,
                    OutgoingMessage::new("slow").with_sharding_key(k1.clone()),
                )
                .await
                .unwrap();
            eventually("a's slow call on queue 1 starts", || {
                slow_started.load(Ordering::SeqCst)
            })
            .await;
            let b =
                recording_member(&addr, (group, topic), "b-hand-over", &calls, slow, false).await;
            producer
                .send(topic, OutgoingMessage::new("after").with_sharding_key(k1))
                .await
                .unwrap();
            // Queue 0 is sent to every 100 ms (paced by an interval) until b consumed
            // "after", at most for the tests' patience.
            let deadline = tokio::time::Instant::now() + PATIENCE;
            let mut pace = tokio::time::interval(Duration::from_millis(100));
            let mut ticks = 0;
            loop {
                let done = calls
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|c| c.0 == "b-hand-over" && c.1 == "after");
                if done {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "b never consumed what came after: {:?}",
                    calls.lock().unwrap()
                );
                pace.tick().await;
                let tick =
                    OutgoingMessage::new(format!("tick-{ticks}")).with_sharding_key(k0.clone());
                producer.send(topic, tick).await.unwrap();
                ticks += 1;
            }
            let calls = calls.lock().unwrap().clone();
            // Said on failure: every call but the ticks, and the ticks' count.
            let shown: Vec<_> = calls.iter().filter(|c| !c.1.starts_with("tick-")).collect();
            let (slow_start, slow_end) = (calls.iter())
                .find(|c| c.0 == "a-hand-over" && c.1 == "slow")
                .map(|c| (c.2, c.3))
                .expect("a consumed the slow one");
            for (_, body, started, _) in calls.iter().filter(|c| c.0 == "b-hand-over") {
                assert!(
                    *started >= slow_end,
                    "b consumed {body} while a's call on the slow one still ran: {shown:?}"
                );
            }
            // a's calls on queue 0 went on while its slow call ran (none of them is
            // slow: their starts are at most ~100 ms apart but for the lock's pauses).
            let mut starts: Vec<Instant> = (calls.iter())
                .filter(|c| c.0 == "a-hand-over" && c.1.starts_with("tick-"))
                .map(|c| c.2)
                .filter(|s| *s >= slow_start && *s <= slow_end)
                .collect();
            starts.insert(0, slow_start);
            starts.push(slow_end);
            let gap = starts.windows(2).map(|w| w[1] - w[0]).max().unwrap();
            assert!(
                gap < Duration::from_millis(1_500),
                "queue 0 stood still for {gap:?} while the slow call ran ({} calls in it): {shown:?}",
                starts.len() - 2
            );
            b.shutdown().await.unwrap();
            a.shutdown().await.unwrap();
        },
    );
}

/// A member shutting down while one of its orderly listener calls never ends returns after
/// `shutdown_timeout_ms`, having committed what finished. Before, the shutdown waited for
/// every orderly call to end before its timeout began: for ever, here.
#[test]
fn a_shutdown_gives_up_on_an_orderly_call_after_its_timeout() {
    with_broker_and(
        |_| {},
        |addr| async move {
            let topic = "stuck-end";
            let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
            producer.client().create_topic(topic, 1).await.unwrap();
            let (release, held) = std::sync::mpsc::channel::<()>();
            let held = Mutex::new(held);
            let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
            // From the queue's first message: a member that decided its start after the send
            // (its lock slow to come on a loaded machine) started past it from the last
            // offset, and the call never came.
            let options = PushConsumerOptions {
                shutdown_timeout_ms: 1_000,
                consume_batch_max: 1,
                consume_from: ConsumeFrom::FirstOffset,
                ..options()
            };
            let consumer =
                PushConsumer::new(ClientConfig::new(&addr), "g-stuck-end", options).unwrap();
            consumer.subscribe(topic, "*").unwrap();
            let calling = started.clone();
            consumer
                .register_orderly(move |_| {
                    calling.store(true, Ordering::SeqCst);
                    let _ = held.lock().unwrap().recv();
                    OrderlyStatus::Success
                })
                .unwrap();
            consumer.start().await.unwrap();
            producer
                .send(topic, OutgoingMessage::new("stuck"))
                .await
                .unwrap();
            eventually("the call starts", || started.load(Ordering::SeqCst)).await;
            let ended = tokio::time::timeout(Duration::from_secs(10), consumer.shutdown()).await;
            // The call ends only now, whatever the shutdown did.
            let _ = release.send(());
            let ended = ended.expect("the shutdown waited for the call past its timeout");
            ended.unwrap();
        },
    );
}
