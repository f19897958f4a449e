//! Delayed messages against the real broker binary and the real client: delay levels,
//! delays and delivery times arrive no earlier than due and soon after; bad delays are
//! refused with typed errors; a broker killed with thousands of scheduled messages pending
//! (some falling due while it is down) delivers every one after its restart, in due order
//! per queue.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::broker::BrokerProcess;
use ringmq::client::{
    Client, ClientConfig, Message, OutgoingMessage, Producer, ProducerOptions,
    QUEUE_OFFSET_SCHEDULED,
};
use ringmq::protocol::record::prop;
use ringmq::protocol::ErrorCode;

use common::runtime;

/// A broker with levels 200 ms, 400 ms, 1 s and delays up to 60 s.
fn short_levels_broker(dir: &tempfile::TempDir) -> BrokerProcess {
    BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &[
            "--delay-levels",
            "200ms 400ms 1s",
            "--delay-max-ms",
            "60000",
        ],
    )
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Every shard's schedule statistics, asked again every 20 ms until `done` says they are
/// what the test waits for (it may assert on them too), for `patience` at most.
async fn stats_until(
    client: &Client,
    patience: Duration,
    mut done: impl FnMut(&[ringmq::protocol::ShardScheduleInfo]) -> bool,
) -> Vec<ringmq::protocol::ShardScheduleInfo> {
    let deadline = Instant::now() + patience;
    loop {
        let stats = client.schedule_stats().await.unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "gave up waiting: {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Pulls every queue of `topic` from its start, calling `seen` with each message and the
/// wall time it was pulled, until `seen` says it has enough (or the patience runs out).
async fn pull_until(
    client: &Client,
    topic: &str,
    queues: u32,
    patience: Duration,
    mut seen: impl FnMut(&Message, u64) -> bool,
) {
    let mut next = vec![0u64; queues as usize];
    let deadline = Instant::now() + patience;
    loop {
        assert!(Instant::now() < deadline, "gave up waiting for {topic}");
        for q in 0..queues {
            let pulled = client
                .pull(
                    topic,
                    q,
                    next[q as usize],
                    256,
                    Duration::from_millis(20),
                    &[],
                )
                .await
                .unwrap();
            let at = now_ms();
            for m in &pulled.messages {
                if seen(m, at) {
                    return;
                }
            }
            next[q as usize] = pulled.next_offset;
        }
    }
}

#[test]
fn levels_delays_and_times_are_delivered_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let broker = short_levels_broker(&dir);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("sched", 4).await.unwrap();
        let now = now_ms();
        let cases: Vec<(&str, OutgoingMessage, u64)> = vec![
            (
                "level-1",
                OutgoingMessage::new("level-1").with_delay_level(1),
                200,
            ),
            (
                "level-2",
                OutgoingMessage::new("level-2").with_delay_level(2),
                400,
            ),
            (
                "ms-300",
                OutgoingMessage::new("ms-300").with_delay_ms(300),
                300,
            ),
            (
                "at-500",
                OutgoingMessage::new("at-500").with_deliver_at_ms(now + 500),
                500,
            ),
            (
                "past",
                OutgoingMessage::new("past").with_deliver_at_ms(now - 10_000),
                0,
            ),
            ("plain", OutgoingMessage::new("plain"), 0),
        ];
        // body → (sent from, sent until, delay, msg id, queue)
        let mut sent: HashMap<String, (u64, u64, u64, String, u32)> = HashMap::new();
        for (body, message, delay) in cases {
            let from = now_ms();
            let r = producer.send("sched", message).await.unwrap();
            let until = now_ms();
            // The broker computes "at-500" from our clock reading before the send.
            let from = if body == "at-500" { now } else { from };
            assert_eq!(
                r.queue_offset == QUEUE_OFFSET_SCHEDULED,
                delay > 0,
                "{body}: {r:?}"
            );
            sent.insert(body.to_owned(), (from, until, delay, r.msg_id, r.queue_id));
        }
        let mut arrived: HashMap<String, (u64, Message)> = HashMap::new();
        pull_until(&client, "sched", 4, Duration::from_secs(20), |m, at| {
            let body = String::from_utf8_lossy(m.body()).into_owned();
            arrived.entry(body).or_insert((at, m.clone()));
            arrived.len() == sent.len()
        })
        .await;
        for (body, (from, until, delay, msg_id, queue)) in &sent {
            let (at, m) = &arrived[body];
            assert!(
                *at >= from + delay,
                "{body} arrived {} ms early",
                from + delay - at
            );
            // Soon after: stored by the broker within a second of being due, and seen by
            // this test's pulls (one queue after another, 20 ms long polls, on a machine
            // running other tests) within a few.
            if *delay > 0 {
                let stored = m.store_timestamp_ms() as u64;
                assert!(
                    stored <= until + delay + 1000,
                    "{body} delivered {} ms late",
                    stored - (until + delay)
                );
            }
            assert!(
                *at <= until + delay + 5000,
                "{body} arrived {} ms late",
                at - (until + delay)
            );
            assert_eq!(m.queue_id(), *queue, "{body}");
            if *delay > 0 {
                assert!(m.store_timestamp_ms() as u64 >= from + delay, "{body}");
                assert_eq!(m.origin_msg_id(), Some(msg_id.as_str()), "{body}");
            }
            for name in prop::DELAY_PROPERTIES {
                assert_eq!(m.property(name), None, "{body} keeps {name}");
            }
        }
        // Nothing waits any more; the four delayed ones were delivered by the schedules.
        stats_until(&client, Duration::from_secs(10), |stats| {
            assert_eq!(stats.len(), 2, "one schedule per shard");
            let pending: u64 = stats.iter().map(|s| s.pending).sum();
            let delivered: u64 = stats.iter().map(|s| s.delivered_total).sum();
            if pending == 0 {
                assert_eq!(delivered, 4);
            }
            pending == 0
        })
        .await;
    });
}

#[test]
fn bad_delays_and_system_topics_are_refused_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let broker = short_levels_broker(&dir);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect_with(
            ClientConfig::new(&addr),
            ProducerOptions {
                retries: 0,
                ..ProducerOptions::default()
            },
        )
        .await
        .unwrap();
        producer.client().create_topic("bad", 2).await.unwrap();
        let refused = |m: OutgoingMessage| {
            let producer = producer.clone();
            async move { producer.send("bad", m).await.unwrap_err() }
        };
        for message in [
            OutgoingMessage::new("x").with_delay_level(4),
            OutgoingMessage::new("x").with_delay_ms(60_001),
            OutgoingMessage::new("x").with_deliver_at_ms(now_ms() + 3_600_000),
            OutgoingMessage::new("x").with_property(prop::TIMER_DELAY_MS, "soon"),
            OutgoingMessage::new("x")
                .with_property(prop::DELAY, "1")
                .with_property(prop::TIMER_DELAY_MS, "5"),
        ] {
            let e = refused(message.clone()).await;
            assert_eq!(e.code(), Some(ErrorCode::InvalidDelay), "{message:?}: {e}");
        }
        // A batch may not hold delayed messages (their queue offsets come later).
        let e = producer
            .send_batch(
                "bad",
                vec![
                    OutgoingMessage::new("a"),
                    OutgoingMessage::new("b").with_delay_ms(100),
                ],
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidDelay), "{e}");
        // The broker's own topics are not for clients.
        let e = producer
            .send("%SYS_SCHEDULE%", OutgoingMessage::new("x"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidTopic), "{e}");
        let e = producer
            .client()
            .create_topic("%SYS_SCHEDULE%", 1)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidTopic), "{e}");
        // Nothing was stored by the refused sends.
        let info = producer.client().describe_topic("bad").await.unwrap();
        assert!(info.queues.iter().all(|q| q.max_offset == 0), "{info:?}");
    });
    // A broker with bad delay levels does not start.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq-broker"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("other"))
        .args(["--delay-levels", "1s 5x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("delay-levels"), "{stderr}");
}

#[test]
fn scheduled_messages_survive_a_kill_and_come_out_in_due_order_per_queue() {
    const COUNT: u64 = 3000;
    const STEP_MS: u64 = 2;
    let dir = tempfile::tempdir().unwrap();
    // Deliveries are recorded once an fdatasync covers them: every 50 ms, not the default
    // 500, so that the copies a kill delivers twice stay well under the bound below on a
    // slow disk too (a lost record of deliveries would deliver about 1000 again).
    let mut broker =
        BrokerProcess::start(&dir.path().join("data"), 2, &["--flush-interval-ms", "50"]);
    let addr = broker.addr_string();
    let rt = runtime();
    // Due times are distinct and shuffled over the send order: message i is due at
    // base + perm(i) * STEP_MS.
    let perm = |i: u64| (i * 7919) % COUNT;
    let (base, queues) = rt.block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("crash", 4).await.unwrap();
        let base = now_ms() + 8_000;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..COUNT {
            let producer = producer.clone();
            tasks.spawn(async move {
                let m = OutgoingMessage::new(format!("m-{i}"))
                    .with_deliver_at_ms(base + perm(i) * STEP_MS);
                let r = producer.send("crash", m).await.unwrap();
                assert_eq!(r.queue_offset, QUEUE_OFFSET_SCHEDULED);
                (i, r.queue_id)
            });
            if tasks.len() >= 64 {
                tasks.join_next().await.unwrap().unwrap();
            }
        }
        while tasks.join_next().await.is_some() {}
        assert!(
            now_ms() < base,
            "sending took too long for the test's timing"
        );
        (base, 4u32)
    });
    // Kill it while part of the messages are delivered, keep it down while more fall due.
    let kill_at = base + COUNT * STEP_MS / 3;
    std::thread::sleep(Duration::from_millis(kill_at.saturating_sub(now_ms())));
    broker.kill();
    std::thread::sleep(Duration::from_millis(1_500));
    broker.restart();
    let addr = broker.addr_string();
    rt.block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        let mut first_seen: HashSet<u64> = HashSet::new();
        let mut order: HashMap<u32, Vec<u64>> = HashMap::new();
        let mut copies = 0u64;
        pull_until(&client, "crash", queues, Duration::from_secs(60), |m, _| {
            let body = std::str::from_utf8(m.body()).unwrap();
            let i: u64 = body.strip_prefix("m-").unwrap().parse().unwrap();
            assert!(i < COUNT, "invented message {body}");
            copies += 1;
            if first_seen.insert(i) {
                order.entry(m.queue_id()).or_default().push(perm(i));
            }
            first_seen.len() as u64 == COUNT
        })
        .await;
        for (queue, dues) in &order {
            assert!(
                dues.windows(2).all(|w| w[0] < w[1]),
                "queue {queue}: delivered out of due order"
            );
        }
        // Copies delivered twice are those whose delivery was not yet recorded durably when
        // the broker died (the documented crash window).
        eprintln!(
            "{COUNT} scheduled, all delivered; {} delivered twice",
            copies - COUNT
        );
        assert!(
            copies - COUNT < COUNT / 10,
            "{} delivered twice",
            copies - COUNT
        );
        // Deliveries leave the schedules once an fdatasync covers them.
        stats_until(&client, Duration::from_secs(10), |stats| {
            stats.iter().map(|s| s.pending).sum::<u64>() == 0
        })
        .await;
    });
}

#[test]
fn a_message_whose_topic_is_gone_goes_to_the_undeliverable_topic_after_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &[
            "--metrics-listen",
            &metrics,
            "--auto-create-topics",
            "false",
            "--schedule-park-max-ms",
            "500",
            "--topics-max",
            "1",
        ],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("gone", 1).await.unwrap();
        let sent = producer
            .send("gone", OutgoingMessage::new("orphan").with_delay_ms(300))
            .await
            .unwrap();
        client.delete_topic("gone").await.unwrap();
        // The broker at its topic cap: the undeliverable topic is made past it, by the
        // broker only (a client cannot use its name to pass the cap).
        client.create_topic("filler", 1).await.unwrap();
        let refused = client.create_topic("%UNDELIVERABLE%", 8).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Some(ringmq::protocol::ErrorCode::LimitReached),
            "{refused}"
        );
        // It waits for the topic, then is moved where an operator can find it.
        let mut found = Vec::new();
        pull_until(
            &client_when_ready(&client, "%UNDELIVERABLE%").await,
            "%UNDELIVERABLE%",
            1,
            Duration::from_secs(20),
            |m, _| {
                found.push(m.clone());
                true
            },
        )
        .await;
        let m = &found[0];
        assert_eq!(m.body(), b"orphan");
        assert_eq!(m.property(prop::REAL_TOPIC), Some("gone"));
        assert_eq!(m.property(prop::REAL_QID), Some("0"));
        assert_eq!(m.origin_msg_id(), Some(sent.msg_id.as_str()));
        // Counted once its move is recorded (after the copy is durable).
        stats_until(&client, Duration::from_secs(10), |stats| {
            let counted: u64 = stats.iter().map(|s| s.undeliverable_total).sum();
            assert!(counted <= 1, "counted {counted}");
            counted == 1
        })
        .await;
    });
    // Shown where an operator looks: the command line, the metrics, the log.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq"))
        .args(["--broker", &addr, "--json", "schedule", "stats"])
        .output()
        .unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown: u64 = stats["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["undeliverable_total"].as_u64().unwrap())
        .sum();
    assert_eq!(shown, 1, "{stats}");
    common::eventually("the undeliverable counter", || {
        let s = common::metrics::scrape_any(&metrics);
        common::metrics::sum(&s, "ringmq_schedule_undeliverable_total", &[]) == 1.0
    });
    let log = std::fs::read_to_string(dir.path().join("data.stderr.log")).unwrap();
    assert!(
        log.contains("1 scheduled message(s) waited 500 ms")
            && log.contains("moved to %UNDELIVERABLE%"),
        "{log}"
    );
}

/// A message whose topic was deleted waits for it (parked, counted), and is delivered once
/// the topic exists again (within the few seconds a parked message waits between looks).
#[test]
fn a_parked_message_is_delivered_once_its_topic_exists_again() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--auto-create-topics", "false"],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("back", 1).await.unwrap();
        let sent = producer
            .send("back", OutgoingMessage::new("waited").with_delay_ms(2_000))
            .await
            .unwrap();
        client.delete_topic("back").await.unwrap();
        stats_until(&client, Duration::from_secs(20), |stats| {
            stats.iter().map(|s| s.parked).sum::<u64>() == 1
        })
        .await;
        client.create_topic("back", 1).await.unwrap();
        let mut found = Vec::new();
        pull_until(&client, "back", 1, Duration::from_secs(30), |m, _| {
            found.push(m.clone());
            true
        })
        .await;
        assert_eq!(found[0].body(), b"waited");
        assert_eq!(found[0].origin_msg_id(), Some(sent.msg_id.as_str()));
        // Out of the schedule once its done record is written; nothing undeliverable.
        stats_until(&client, Duration::from_secs(10), |stats| {
            let held: u64 = stats.iter().map(|s| s.parked + s.pending).sum();
            let undeliverable: u64 = stats.iter().map(|s| s.undeliverable_total).sum();
            assert_eq!(undeliverable, 0, "{stats:?}");
            held == 0
        })
        .await;
    });
}

/// The client, once `topic` exists (it is created when the first message goes there).
async fn client_when_ready(client: &Client, topic: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.describe_topic(topic).await.is_err() {
        assert!(Instant::now() < deadline, "{topic} was never created");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client.clone()
}

#[test]
fn a_held_message_does_not_keep_retention_from_deleting_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let metrics = common::free_addr().to_string();
    let mut args = vec!["--metrics-listen", &metrics];
    args.extend_from_slice(common::SMALL_RETENTION);
    let broker = BrokerProcess::start(&data, 1, &args);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("held", 1).await.unwrap();
        client.create_topic("filler", 1).await.unwrap();
        let due_in = Duration::from_secs(15);
        let sent_at = Instant::now();
        let (sent_ms, due_ms) = (now_ms(), due_in.as_millis() as u64);
        let sent = producer
            .send("held", OutgoingMessage::new("kept").with_delay_ms(due_ms))
            .await
            .unwrap();
        let sent_by_ms = now_ms();
        common::send_8_mib(&producer, "filler").await;
        // The first segments go although the held message was stored there.
        let first = data.join("shard-0/commitlog/00000000000000000000");
        let deadline = Instant::now() + Duration::from_secs(10);
        while first.exists() {
            assert!(
                Instant::now() < deadline,
                "retention was held back by the delayed message"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(sent_at.elapsed() < due_in, "the test machine is too slow");
        // The schedule's statistics see one message (not it and the copy it was moved
        // forward as, once the move is recorded), due when it was sent for, not overdue.
        let stats = stats_until(&client, Duration::from_secs(5), |stats| {
            assert_eq!(stats.len(), 1);
            (stats[0].pending, stats[0].overdue) == (1, 0)
        })
        .await;
        let due = stats[0].next_due_ms as u64;
        assert!(
            (sent_ms + due_ms..=sent_by_ms + due_ms).contains(&due),
            "next due {due}, sent between {sent_ms} and {sent_by_ms}"
        );
        // The old entry is out of the timing wheel once the move is recorded, not left in
        // it until it falls due (each move of a message held for days left one more): seen
        // in a publication that counts the statistics requests above, all sent after the
        // first segment went, so after the move was recorded.
        let mut wheel = f64::NAN;
        common::eventually("a publication after the statistics requests", || {
            let s = common::metrics::scrape_any(&metrics);
            wheel = common::metrics::sum(&s, "ringmq_schedule_wheel_entries", &[]);
            common::metrics::sum(&s, "ringmq_requests_total", &[("kind", "ScheduleStats")]) >= 1.0
        });
        // (Delivered meanwhile, it would be out of the wheel too.)
        assert!(sent_at.elapsed() < due_in, "the test machine is too slow");
        assert_eq!(wheel, 1.0, "entries in the wheel");
        assert!(sent_at.elapsed() < due_in, "the test machine is too slow");
        // And the message is still delivered, on time.
        let mut got = None;
        pull_until(&client, "held", 1, Duration::from_secs(20), |m, _| {
            got = Some(m.clone());
            true
        })
        .await;
        let got = got.unwrap();
        assert_eq!(got.body(), b"kept");
        // Under the id its producer was given, though it was moved forward.
        assert_eq!(got.origin_msg_id(), Some(sent.msg_id.as_str()));
        assert!(sent_at.elapsed() >= due_in);
    });
}

/// A burst of large delayed messages due at the same moment (64 of 3 MiB) is delivered
/// over several turns, each reading about 32 MiB of records: every one arrives, and the
/// broker never holds the burst at once. Before turns were bounded in bytes, one turn read
/// all 192 MiB and appended the copies into one write buffer grown to 256 MiB.
#[test]
fn a_burst_of_large_delayed_messages_is_delivered_in_turns_of_bounded_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &["--tail-cache-mb", "0"]);
    let addr = broker.addr_string();
    let pid = broker.pid().expect("the broker runs");
    let rss_mib = move || common::broker::rss_mib_of(pid);
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("burst", 1).await.unwrap();
        // Far enough for the 192 MiB of sends on a loaded machine.
        let due = now_ms() + 20_000;
        for i in 0..64u64 {
            let mut body = vec![b'b'; 3 << 20];
            body[..8].copy_from_slice(&i.to_le_bytes());
            let delayed = OutgoingMessage::new(body).with_deliver_at_ms(due);
            producer.send("burst", delayed).await.unwrap();
        }
        let before = rss_mib();
        assert!(
            now_ms() + 500 < due,
            "the sends took too long: the burst is due already"
        );
        // The broker's memory, sampled every 5 ms until every message is in.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut peak = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    peak = peak.max(rss_mib());
                    std::thread::sleep(Duration::from_millis(5));
                }
                peak
            })
        };
        let mut seen = HashSet::new();
        pull_until(&client, "burst", 1, Duration::from_secs(60), |m, _| {
            let n = u64::from_le_bytes(m.body()[..8].try_into().unwrap());
            seen.insert(n);
            seen.len() == 64
        })
        .await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let peak = sampler.join().unwrap();
        assert!(
            peak < before + 200,
            "{before} MiB before the burst fell due, {peak} MiB while it was delivered"
        );
    });
}

/// Large delayed messages falling due together (here while the broker is down), stored in
/// the reverse of their due order, are delivered in due order though one turn reads only
/// about 32 MiB of them: the turn's bytes are spent in due order. Before, they were spent
/// in the order the messages were stored, so those due last went a turn ahead of those
/// due first.
#[test]
fn a_burst_due_together_keeps_its_due_order_across_turns() {
    const COUNT: u64 = 24;
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let due = runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        producer.client().create_topic("order", 1).await.unwrap();
        // Far enough for the 48 MiB of sends on a loaded machine.
        let due = now_ms() + 10_000;
        for i in 0..COUNT {
            let mut body = vec![b'o'; 2 << 20];
            body[..8].copy_from_slice(&i.to_le_bytes());
            // Sent first, due last.
            let at = due + (COUNT - 1 - i);
            producer
                .send("order", OutgoingMessage::new(body).with_deliver_at_ms(at))
                .await
                .unwrap();
        }
        assert!(now_ms() + 500 < due, "the sends took too long");
        due
    });
    assert!(broker.stop(), "a clean stop");
    // Down until every message is overdue: the restart finds them all due together.
    let deadline = Instant::now() + Duration::from_secs(30);
    while now_ms() <= due + COUNT {
        assert!(
            Instant::now() < deadline,
            "the clock never reached the due times"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    broker.restart();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let mut order = Vec::new();
        pull_until(&client, "order", 1, Duration::from_secs(60), |m, _| {
            order.push(u64::from_le_bytes(m.body()[..8].try_into().unwrap()));
            order.len() == COUNT as usize
        })
        .await;
        let due_order: Vec<u64> = (0..COUNT).rev().collect();
        assert_eq!(order, due_order);
    });
}

/// A clean stop while parked messages are being moved to `%UNDELIVERABLE%` on another
/// shard waits for the moves under way: after the restart each message is there once.
/// Before, a move counted for the stop only once its copy was stored, so the stop could
/// snapshot a message being moved as still held, and the restart moved it again.
#[test]
fn a_clean_stop_during_moves_to_another_shard_adds_no_duplicates() {
    use ringmq::protocol::route::owner;
    const COUNT: usize = 400;
    let far = owner("%UNDELIVERABLE%", 0, 2);
    let topic = (0..)
        .map(|i| format!("gone-{i}"))
        .find(|t| owner(t, 0, 2) != far)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &[
            "--auto-create-topics",
            "false",
            "--schedule-park-max-ms",
            "300",
        ],
    );
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let client = producer.client().clone();
        client.create_topic(&topic, 1).await.unwrap();
        let sends: Vec<_> = (0..COUNT)
            .map(|i| {
                let m = OutgoingMessage::new(format!("m-{i}")).with_delay_ms(300);
                producer.send_async(&topic, m)
            })
            .collect();
        for send in sends {
            send.await.unwrap();
        }
        client.delete_topic(&topic).await.unwrap();
        // The stop comes as the first moves are recorded, the others under way.
        stats_until(&client, Duration::from_secs(30), |stats| {
            stats.iter().map(|s| s.undeliverable_total).sum::<u64>() > 0
        })
        .await;
    });
    assert!(broker.stop(), "a clean stop");
    broker.restart();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut copies = 0;
        pull_until(
            &client_when_ready(&client, "%UNDELIVERABLE%").await,
            "%UNDELIVERABLE%",
            1,
            Duration::from_secs(60),
            |m, _| {
                let body = String::from_utf8_lossy(m.body()).into_owned();
                *seen.entry(body).or_default() += 1;
                copies += 1;
                seen.len() == COUNT
            },
        )
        .await;
        // Whatever else comes within the schedule's settling (a duplicate moved late).
        stats_until(&client, Duration::from_secs(30), |stats| {
            stats.iter().all(|s| s.pending == 0 && s.in_flight == 0)
        })
        .await;
        let all = client
            .pull("%UNDELIVERABLE%", 0, 0, 1024, Duration::ZERO, &[])
            .await
            .unwrap();
        let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
        assert!(twice.is_empty(), "{twice:?}");
        assert_eq!((copies, all.messages.len()), (COUNT, COUNT));
    });
}
