//! The failure path of consumption against the real broker binary, the real client and the
//! `ringmq` command line: a failing message comes back through the group's retry topic at
//! the configured delays with its reconsume count, then lands on the dead-letter topic,
//! from where `ringmq dlq resend` puts it back; a member killed while its message waits on
//! the retry topic does not take the message with it; send-backs cross shards; a
//! dead-letter topic the topic limit leaves no room for keeps its message retried by the
//! consumer, never dropped.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::broker::BrokerProcess;
use ringmq::client::{
    Client, ClientConfig, ConsumeFrom, ConsumeStatus, Message, OutgoingMessage, Producer,
    PushConsumer, PushConsumerOptions,
};
use ringmq::protocol::route::owner;
use ringmq::protocol::{ErrorCode, MessageId};

use common::runtime;

fn options() -> PushConsumerOptions {
    PushConsumerOptions {
        pull_wait_ms: 500,
        commit_interval_ms: 100,
        reconsume_delay_ms: 50,
        consume_from: ConsumeFrom::FirstOffset,
        ..Default::default()
    }
}

async fn eventually(what: &str, patience: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every message of queue 0 of `topic` (retry and dead-letter topics have one queue).
async fn all_of(client: &Client, topic: &str) -> Vec<Message> {
    match client
        .pull(topic, 0, 0, 256, Duration::from_millis(0), &[])
        .await
    {
        Ok(p) => p.messages,
        Err(e) if e.code() == Some(ErrorCode::TopicNotFound) => Vec::new(),
        Err(e) => panic!("pulling {topic}: {e}"),
    }
}

fn ringmq(addr: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ringmq"))
        .args(["--broker", addr])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ringmq {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One listener call: (reconsume times, topic it came from, when).
type Calls = Arc<Mutex<Vec<(u32, String, Instant)>>>;

#[test]
fn a_failing_message_returns_at_the_level_delays_then_goes_to_the_dead_letter_topic_and_is_resent()
{
    // Retries take levels 3, 4, 5...: 300 ms, 400 ms, 500 ms.
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--delay-levels", "100ms 100ms 300ms 400ms 500ms"],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("work", 2).await.unwrap();
        let calls: Calls = Arc::default();
        // "twice" fails twice then succeeds; "always" always fails (max 2 retries).
        let consumer = PushConsumer::new(
            ClientConfig::new(&addr),
            "g-fail",
            PushConsumerOptions {
                max_reconsume_times: 2,
                ..options()
            },
        )
        .unwrap();
        consumer.subscribe("work", "*").unwrap();
        {
            let calls = calls.clone();
            consumer
                .register_concurrent(move |messages| {
                    let m = &messages[0];
                    let body = String::from_utf8_lossy(m.body()).into_owned();
                    calls.lock().unwrap().push((
                        m.reconsume_times(),
                        format!("{body}@{}", m.origin_topic()),
                        Instant::now(),
                    ));
                    match (body.as_str(), m.reconsume_times()) {
                        ("twice", n) if n >= 2 => ConsumeStatus::Success,
                        _ => ConsumeStatus::ReconsumeLater,
                    }
                })
                .unwrap();
        }
        consumer.start().await.unwrap();
        producer
            .send("work", OutgoingMessage::new("twice").with_tags("T"))
            .await
            .unwrap();
        producer
            .send(
                "work",
                OutgoingMessage::new("always")
                    .with_key("k-always")
                    .with_property("user", "v"),
            )
            .await
            .unwrap();
        // The two go through their retries independently: "twice"'s third call may come
        // after "always" is dead-lettered.
        eventually(
            "always dead-lettered, twice consumed",
            Duration::from_secs(20),
            || {
                let twice_calls = (calls.lock().unwrap().iter())
                    .filter(|(_, b, _)| b.starts_with("twice"))
                    .count();
                consumer.stats().dead_lettered == 1 && twice_calls >= 3
            },
        )
        .await;
        let calls = calls.lock().unwrap().clone();
        for (body, expected) in [("twice", 3), ("always", 3)] {
            let of: Vec<&(u32, String, Instant)> = calls
                .iter()
                .filter(|(_, b, _)| b.starts_with(body))
                .collect();
            assert_eq!(of.len(), expected, "{body}: {calls:?}");
            // Reconsume counts 0, 1, 2; every call names the original topic.
            for (i, (times, b, _)) in of.iter().enumerate() {
                assert_eq!(*times, i as u32, "{body}");
                assert_eq!(b, &format!("{body}@work"));
            }
            // Each retry comes no earlier than its level's delay (levels 3 and 4), to the
            // millisecond the broker's clock counts in.
            let gap = |a: usize| of[a + 1].2.duration_since(of[a].2);
            assert!(gap(0) >= Duration::from_millis(299), "{body}: {:?}", gap(0));
            assert!(gap(1) >= Duration::from_millis(399), "{body}: {:?}", gap(1));
        }
        consumer.shutdown().await.unwrap();

        // The dead letter keeps what the message carried.
        let dead = all_of(&client, "%DLQ%g-fail").await;
        assert_eq!(dead.len(), 1);
        let d = &dead[0];
        assert_eq!(
            (d.body(), d.origin_topic(), d.reconsume_times()),
            (&b"always"[..], "work", 3)
        );
        assert_eq!(d.keys().collect::<Vec<_>>(), ["k-always"]);
        assert_eq!(d.property("user"), Some("v"));
        let origin = d.origin_msg_id().unwrap().to_owned();

        // The command line lists it, then resends it to its topic.
        let listed: serde_json::Value =
            serde_json::from_str(&ringmq(&addr, &["--json", "dlq", "list", "g-fail"])).unwrap();
        let listed = listed["messages"].as_array().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0]["topic"], "work");
        assert_eq!(listed[0]["reconsume_times"], 3);
        assert_eq!(listed[0]["body"], "always");
        let text = ringmq(&addr, &["dlq", "list", "g-fail"]);
        assert!(text.contains("always") && text.contains("work"), "{text}");
        // In lower case (ids are hex digits, taken in either case).
        let lower = origin.to_ascii_lowercase();
        let resent = ringmq(&addr, &["dlq", "resend", "g-fail", "--msg-id", &lower]);
        assert!(
            resent.contains("1 resent; next: --from-offset 1"),
            "{resent}"
        );
        let back: Vec<Message> = {
            let mut all = Vec::new();
            for q in 0..2 {
                let pulled = client
                    .pull("work", q, 0, 64, Duration::from_millis(0), &[])
                    .await
                    .unwrap();
                all.extend(pulled.messages);
            }
            all.into_iter().filter(|m| m.body() == b"always").collect()
        };
        assert_eq!(back.len(), 2, "the original and the resent copy");
        let copy = back.iter().find(|m| m.origin_msg_id().is_some()).unwrap();
        assert_eq!(copy.origin_msg_id(), Some(origin.as_str()));
        assert_eq!(copy.keys().collect::<Vec<_>>(), ["k-always"]);
        assert_eq!(copy.property("user"), Some("v"));
        // The dead letter stays for inspection.
        assert_eq!(all_of(&client, "%DLQ%g-fail").await.len(), 1);
    });
}

#[test]
fn a_member_killed_while_its_message_waits_on_the_retry_topic_does_not_take_it_along() {
    // The first retry waits 2 s: long enough to kill the member meanwhile.
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--delay-levels", "100ms 100ms 2s 2s 2s"],
    );
    let addr = broker.addr_string();
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("kt", 1).await.unwrap();
    });
    let mut member = Command::new(env!("CARGO_BIN_EXE_ringmq"))
        .args(["--broker", &addr, "consume", "kt", "--group", "g-kill"])
        .args(["--reconsume-later", "--client-id", "victim"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(member.stdout.take().unwrap()).lines();
    rt.block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        // The member joins, then the message goes out.
        let client = producer.client().clone();
        let deadline = Instant::now() + Duration::from_secs(20);
        while client.group_members("g-kill").await.unwrap().members.len() != 1 {
            assert!(Instant::now() < deadline, "the member did not join");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        producer
            .send("kt", OutgoingMessage::new("precious"))
            .await
            .unwrap();
    });
    let line = lines.next().unwrap().unwrap();
    assert!(line.contains("body=precious"), "{line}");
    // It answered ReconsumeLater: once the copy is on the retry topic, kill the member.
    rt.block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let stats = client.schedule_stats().await.unwrap();
            if stats.iter().map(|s| s.pending).sum::<u64>() == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "the copy was not scheduled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    unsafe {
        libc::kill(member.id() as i32, libc::SIGKILL);
    }
    let _ = member.wait();
    rt.block_on(async {
        let got: Arc<Mutex<Vec<(String, u32, String)>>> = Arc::default();
        let consumer = PushConsumer::new(ClientConfig::new(&addr), "g-kill", options()).unwrap();
        consumer.subscribe("kt", "*").unwrap();
        {
            let got = got.clone();
            consumer
                .register_concurrent(move |messages| {
                    for m in messages {
                        got.lock().unwrap().push((
                            String::from_utf8_lossy(m.body()).into_owned(),
                            m.reconsume_times(),
                            m.topic().to_owned(),
                        ));
                    }
                    ConsumeStatus::Success
                })
                .unwrap();
        }
        consumer.start().await.unwrap();
        eventually("the retried copy", Duration::from_secs(20), || {
            got.lock()
                .unwrap()
                .iter()
                .any(|(b, n, t)| b == "precious" && *n == 1 && t == "%RETRY%g-kill")
        })
        .await;
        consumer.shutdown().await.unwrap();
    });
}

#[test]
fn send_backs_travel_to_the_shard_that_owns_the_retry_queue() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--delay-levels", "100ms 100ms 200ms"],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("xs", 2).await.unwrap();
        let group = "g-cross";
        let retry_shard = owner("%RETRY%g-cross", 0, 2);
        let dlq_shard = owner("%DLQ%g-cross", 0, 2);
        // A message stored on the other shard.
        let mut original = None;
        for i in 0..8 {
            let r = producer
                .send("xs", OutgoingMessage::new(format!("x-{i}")))
                .await
                .unwrap();
            if owner("xs", r.queue_id, 2) != retry_shard {
                original = Some(r);
                break;
            }
        }
        let original = original.expect("round-robin reaches both shards");
        let sent_at = Instant::now();
        let r = client
            .send_back(group, &original.msg_id, 0, 16)
            .await
            .unwrap();
        assert!(!r.dead_lettered);
        assert_eq!(r.reconsume_times, 1);
        assert_eq!(MessageId::parse(&r.msg_id).unwrap().store_id, retry_shard);
        // Held in the retry queue owner's schedule, delivered there after level 3 (200 ms).
        let mut copy = Vec::new();
        while copy.is_empty() {
            assert!(sent_at.elapsed() < Duration::from_secs(20));
            copy = all_of(&client, "%RETRY%g-cross").await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(sent_at.elapsed() >= Duration::from_millis(200));
        assert_eq!(copy[0].msg_id().store_id, retry_shard);
        assert_eq!(copy[0].origin_topic(), "xs");
        assert_eq!(copy[0].origin_msg_id(), Some(original.msg_id.as_str()));
        // A negative level goes straight to the dead-letter topic.
        let d = client
            .send_back(group, &copy[0].msg_id().encode(), -1, 16)
            .await
            .unwrap();
        assert!(d.dead_lettered);
        assert_eq!(MessageId::parse(&d.msg_id).unwrap().store_id, dlq_shard);
        let dead = all_of(&client, "%DLQ%g-cross").await;
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].reconsume_times(), 2);
        assert_eq!(dead[0].origin_msg_id(), Some(original.msg_id.as_str()));
        // An id that names no message is refused.
        let bogus = MessageId {
            broker_id: 0,
            store_id: 0,
            physical_offset: 1 << 40,
        }
        .encode();
        let e = client.send_back(group, &bogus, 0, 16).await.unwrap_err();
        assert!(e.code().is_some(), "{e}");
    });
}

/// A message whose stored record rotted on disk after a consumer received it (the broker
/// answers `StoreCorrupt` at its id) is sent back from the consumer's own copy, which the
/// broker checks against the id and CRC: it reaches the dead-letter topic instead of
/// failing every round and holding its queue's commit point for good.
#[test]
fn a_message_damaged_on_disk_is_sent_back_from_the_consumers_copy() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Every read from the disk (no newest writes kept in memory).
    let broker = BrokerProcess::start(&data, 1, &["--tail-cache-mb", "0"]);
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let client = producer.client().clone();
        client.create_topic("rot", 1).await.unwrap();
        for i in 0..10 {
            let body = format!("rot-{i}-{}", "x".repeat(100));
            producer
                .send("rot", OutgoingMessage::new(body))
                .await
                .unwrap();
        }
        let received = all_of(&client, "rot").await.remove(0);
        // One byte of the record's body flipped in the log file, under the running broker
        // (which reads the log past the page cache).
        let log = data
            .join("shard-0")
            .join("commitlog")
            .join(format!("{:020}", 0));
        let at = received.msg_id().physical_offset + received.as_bytes().len() as u64 - 20;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&log)
            .unwrap();
        let mut byte = [0u8];
        file.seek(SeekFrom::Start(at)).unwrap();
        std::io::Read::read_exact(&mut file, &mut byte).unwrap();
        file.seek(SeekFrom::Start(at)).unwrap();
        file.write_all(&[byte[0] ^ 0xff]).unwrap();
        file.sync_all().unwrap();
        drop(file);
        let at_id = client
            .send_back("g-rot", &received.msg_id().encode(), -1, 16)
            .await
            .unwrap_err();
        assert_eq!(at_id.code(), Some(ErrorCode::StoreCorrupt), "{at_id}");
        let back = client
            .send_back_received("g-rot", &received, -1, 16)
            .await
            .unwrap();
        assert!(back.dead_lettered);
        let dead = all_of(&client, "%DLQ%g-rot").await;
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].body(), received.body());
    });
}

#[test]
fn a_dead_letter_topic_past_the_topic_limit_keeps_its_messages_retried_here_until_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    // "work", "spare" and the group's retry topic: no room for its dead-letter topic.
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &["--topics-max", "3"]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("work", 1).await.unwrap();
        client.create_topic("spare", 1).await.unwrap();
        let attempts = Arc::new(Mutex::new(0u32));
        let consumer = PushConsumer::new(
            ClientConfig::new(&addr),
            "g-full",
            PushConsumerOptions {
                max_reconsume_times: 0,
                ..options()
            },
        )
        .unwrap();
        consumer.subscribe("work", "*").unwrap();
        {
            let attempts = attempts.clone();
            consumer
                .register_concurrent(move |_| {
                    *attempts.lock().unwrap() += 1;
                    ConsumeStatus::ReconsumeLater
                })
                .unwrap();
        }
        consumer.start().await.unwrap();
        // A new group cannot join: its retry topic cannot be made.
        let late = PushConsumer::new(ClientConfig::new(&addr), "g-late", options()).unwrap();
        late.subscribe("work", "*").unwrap();
        late.register_concurrent(|_| ConsumeStatus::Success)
            .unwrap();
        let refused = late.start().await.unwrap_err();
        assert_eq!(refused.code(), Some(ErrorCode::LimitReached), "{refused}");
        producer
            .send("work", OutgoingMessage::new("doomed"))
            .await
            .unwrap();
        // Its dead-letter topic cannot be made: the message stays here, tried again.
        eventually("retried locally", Duration::from_secs(20), || {
            *attempts.lock().unwrap() >= 3
        })
        .await;
        assert!(all_of(&client, "%DLQ%g-full").await.is_empty());
        let stats = consumer.stats();
        assert_eq!((stats.sent_back, stats.dead_lettered), (0, 0), "{stats:?}");
        assert!(stats.retried >= 2, "{stats:?}");
        // Nor does its queue's committed offset move past it.
        let committed = client.query_offset("g-full", "work", 0).await;
        assert_eq!(committed.unwrap(), Some(0));
        // Room for it: the message lands on the dead-letter topic, once, and stops coming.
        client.delete_topic("spare").await.unwrap();
        eventually(
            "dead-lettered once there is room",
            Duration::from_secs(20),
            || consumer.stats().dead_lettered == 1,
        )
        .await;
        let dead = all_of(&client, "%DLQ%g-full").await;
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].body(), b"doomed");
        consumer.shutdown().await.unwrap();
    });
}

/// Async flush: a send-back is answered once its copy is durable (the group commits past
/// the original then, and a crash that kept the commit must not lose the copy), made so at
/// once, whether the original is on the retry queue's shard or another: not at the
/// flusher's next pass, here an hour away.
#[test]
fn a_send_back_is_answered_once_its_copy_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &[
            "--flush-interval-ms",
            "3600000",
            "--metrics-listen",
            &metrics,
        ],
    );
    let addr = broker.addr_string();
    let group = "g-durable";
    let retry_shard = owner("%RETRY%g-durable", 0, 2).to_string();
    let syncs = || {
        let s = common::metrics::scrape_any(&metrics);
        let shard = [("shard", retry_shard.as_str())];
        common::metrics::sum(&s, "ringmq_fdatasync_seconds_count", &shard)
    };
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("sb", 2).await.unwrap();
        // A message stored on each shard.
        let mut on_shard = [None, None];
        for i in 0..16 {
            let r = producer
                .send("sb", OutgoingMessage::new(format!("sb-{i}")))
                .await
                .unwrap();
            on_shard[owner("sb", r.queue_id, 2) as usize].get_or_insert(r.msg_id);
        }
        common::eventually("the metrics are published", || {
            common::metrics::scrape_any(&metrics)
                .samples
                .iter()
                .any(|x| x.metric == "ringmq_fdatasync_seconds_count")
        });
        let mut want = syncs();
        for msg_id in on_shard {
            let msg_id = msg_id.expect("round-robin reaches both shards");
            let r = client.send_back(group, &msg_id, 0, 16).await.unwrap();
            assert!(!r.dead_lettered);
            want += 1.0;
            common::eventually("an fdatasync made for the send-back", || syncs() >= want);
        }
    });
}

/// A schedule full of producers' far-future delayed sends still takes consumers' retry
/// copies, a quarter past its limit: before, every send-back on the shard was refused
/// (`ScheduleFull`), and failing messages never moved on to the dead-letter topic.
#[test]
fn a_schedule_full_of_delayed_sends_still_takes_retry_copies() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        1,
        &["--schedule-pending-max", "8"],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let options = ringmq::client::ProducerOptions {
            retries: 0,
            ..Default::default()
        };
        let producer = Producer::connect_with(ClientConfig::new(&addr), options)
            .await
            .unwrap();
        let client = producer.client().clone();
        client.create_topic("later", 1).await.unwrap();
        client.create_topic("now", 1).await.unwrap();
        let hour = 3_600_000;
        for i in 0..8 {
            let m = OutgoingMessage::new(format!("later-{i}")).with_delay_ms(hour);
            producer.send("later", m).await.unwrap();
        }
        let m = OutgoingMessage::new("one too many").with_delay_ms(hour);
        let e = producer.send("later", m).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::ScheduleFull), "{e}");
        let mut failing = Vec::new();
        for i in 0..3 {
            let m = OutgoingMessage::new(format!("now-{i}"));
            failing.push(producer.send("now", m).await.unwrap().msg_id);
        }
        // A quarter of 8 past the limit: two retry copies, then refused. Not a producer's
        // delayed send to the retry topic's name: the reserve is for send-backs.
        for (n, msg_id) in failing[..2].iter().enumerate() {
            let r = client.send_back("g-full", msg_id, 0, 16).await.unwrap();
            assert!(!r.dead_lettered);
            if n == 0 {
                let m = OutgoingMessage::new("posing as a retry").with_delay_ms(hour);
                let e = producer.send("%RETRY%g-full", m).await.unwrap_err();
                assert_eq!(e.code(), Some(ErrorCode::ScheduleFull), "{e}");
            }
        }
        let e = client.send_back("g-full", &failing[2], 0, 16).await;
        let e = e.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::ScheduleFull), "{e}");
        assert!(e.to_string().contains("retry copies"), "{e}");
        // Straight to the dead-letter topic is no schedule's business.
        let r = client
            .send_back("g-full", &failing[2], -1, 16)
            .await
            .unwrap();
        assert!(r.dead_lettered);
    });
}

/// Dead letters kept past retention's reach: the oldest are gone with their segments, and
/// `ringmq dlq list` and `dlq resend` read on from the queue's first kept one. Before, the
/// read from offset 0 got `OffsetTooSmall` with no messages and stopped there: the group
/// "had no dead letters", and a resend sent none.
#[test]
fn dlq_commands_read_on_past_dead_letters_that_retention_took() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        1,
        &[
            "--segment-bytes",
            "65536",
            "--retention-bytes-max",
            "131072",
            "--retention-check-interval-ms",
            "100",
        ],
    );
    let addr = broker.addr_string();
    let dlq = "%DLQ%g-old";
    let sent = 48u64;
    let rt = runtime();
    let (min, consumer) = rt.block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("old", 1).await.unwrap();
        let consumer = PushConsumer::new(
            ClientConfig::new(&addr),
            "g-old",
            PushConsumerOptions {
                max_reconsume_times: 0,
                ..options()
            },
        )
        .unwrap();
        consumer.subscribe("old", "*").unwrap();
        consumer
            .register_concurrent(|_| ConsumeStatus::ReconsumeLater)
            .unwrap();
        consumer.start().await.unwrap();
        for i in 0..sent {
            let body = format!("{i:04}{}", "x".repeat(4000));
            producer
                .send("old", OutgoingMessage::new(body))
                .await
                .unwrap();
        }
        eventually(
            "every message dead-lettered",
            Duration::from_secs(30),
            || consumer.stats().dead_lettered == sent,
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        let min = loop {
            let min = client.min_offset(dlq, 0).await.unwrap();
            if min > 0 {
                break min;
            }
            assert!(Instant::now() < deadline, "retention took no dead letter");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Still running: what the resend below sends fails again, dead-lettered at once.
        (min, consumer)
    });
    assert!(min < sent, "retention took every dead letter ({min})");
    let listed: serde_json::Value =
        serde_json::from_str(&ringmq(&addr, &["--json", "dlq", "list", "g-old"])).unwrap();
    let listed = listed["messages"].as_array().unwrap();
    assert!(listed.len() as u64 >= sent - min, "{} listed", listed.len());
    let last = listed.last().unwrap();
    assert_eq!(last["offset"], sent - 1, "{last}");
    // At most --limit, and where to go on from.
    let first: serde_json::Value = serde_json::from_str(&ringmq(
        &addr,
        &["--json", "dlq", "list", "g-old", "--limit", "5"],
    ))
    .unwrap();
    let five = first["messages"].as_array().unwrap();
    assert_eq!(five.len(), 5, "{first}");
    assert_eq!(five[0]["offset"], listed[0]["offset"]);
    assert_eq!(first["next_offset"], listed[5]["offset"], "{first}");
    let text = ringmq(&addr, &["dlq", "list", "g-old", "--limit", "5"]);
    let more = format!(
        "first 5 listed; more: --from-offset {}",
        listed[5]["offset"]
    );
    assert!(text.contains(&more), "{text}");
    // The letters that were there when it began, not those that come back meanwhile.
    // Before, it read on into them, resending each again and again.
    let resent = ringmq(&addr, &["dlq", "resend", "g-old"]);
    let want = format!("resent; next: --from-offset {sent}");
    assert!(resent.contains(&want), "{resent}");
    let count: u64 = resent
        .lines()
        .last()
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(count > 0 && count <= sent - min, "{resent}");
    // The next resend goes on from where that one ended: only letters that came back
    // since (the consumer fails them again). Before, each resend began at offset 0.
    let offsets = |out: &str| -> Vec<u64> {
        out.lines()
            .filter_map(|l| l.split_once("(dlq offset ")?.1.split_once(')'))
            .map(|(n, _)| n.parse().unwrap())
            .collect()
    };
    let again = ringmq(&addr, &["dlq", "resend", "g-old"]);
    assert!(
        offsets(&again).iter().all(|&o| o >= sent),
        "resent again: {again}"
    );
    // From an offset given: from there, whatever was resent before.
    let from = (sent - 2).to_string();
    let again = ringmq(&addr, &["dlq", "resend", "g-old", "--from-offset", &from]);
    assert_eq!(offsets(&again)[..2], [sent - 2, sent - 1], "{again}");
    rt.block_on(consumer.shutdown()).unwrap();
}

/// A send-back that carries its record's bytes (the client's way back for a message the
/// broker no longer holds at its id) makes the copy from bytes the broker cannot check
/// against its own: they must be what a consumer could have received. A record of the
/// broker's own topics (`%SYS_...`), one of another topic than the group's retry topic
/// naming a first topic (`RETRY_TOPIC`, which the broker puts on the group's retry copies),
/// or one whose id names another broker, is refused (`InvalidMessage`), so a client cannot
/// put a letter claiming another origin in a group's dead-letter topic by sending back a
/// forged record of a topic it sent to; a
/// transaction's mark in the bytes does not make the copy a half (it was held, unseen).
#[test]
fn a_record_sent_back_cannot_claim_another_origin() {
    use common::raw::{call, error_of};
    use ringmq::protocol::record::{Placement, PropertiesBuilder, RecordDraft, RecordView};
    use ringmq::protocol::{ConsumerSendBack, Response};

    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    let broker_id = runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("src", 1).await.unwrap();
        let sent = producer.send("src", OutgoingMessage::new("real")).await;
        MessageId::parse(&sent.unwrap().msg_id).unwrap().broker_id
    });
    // A record "lost" at an offset far past the log's end, as after a crash.
    let physical_offset = 1 << 40;
    let send_back_to = |broker_id: u32, topic: &str, props: &[(&str, &str)], body: &[u8]| {
        let mut built = PropertiesBuilder::new();
        for (name, value) in props {
            built.put(name, value).unwrap();
        }
        let properties = built.into_bytes();
        let record = RecordDraft::plain(topic, 0, &properties, body).encode(Placement {
            queue_offset: 0,
            physical_offset,
            store_timestamp_ms: 0,
        });
        let id = MessageId {
            broker_id,
            store_id: 0,
            physical_offset,
        };
        let request = ConsumerSendBack {
            group: "billing".into(),
            msg_id: id.encode(),
            delay_level: -1,
            max_reconsume_times: 16,
            reconsumed: 0,
            record_crc: RecordView::parse(&record).unwrap().crc(),
            record,
        };
        call(&addr, request.into())
    };
    let send_back = |topic: &str, props: &[(&str, &str)], body: &[u8]| {
        send_back_to(broker_id, topic, props, body)
    };
    let refused: [(&str, &[(&str, &str)]); 3] = [
        ("src", &[("RETRY_TOPIC", "payments")]),
        ("%RETRY%other", &[("RETRY_TOPIC", "payments")]),
        ("%SYS_SCHEDULE%", &[]),
    ];
    for (topic, props) in refused {
        let (code, message) = error_of(send_back(topic, props, b"forged"));
        assert_eq!(
            code,
            ErrorCode::InvalidMessage,
            "{topic} {props:?}: {message}"
        );
    }
    // An id of another broker: refused for good (not "not found", which the client
    // answers by sending the record's bytes again).
    let (code, message) = error_of(send_back_to(broker_id + 1, "src", &[], b"elsewhere"));
    assert_eq!(code, ErrorCode::InvalidMessage, "{message}");
    // What a consumer of the group can have received goes back.
    type Props<'a> = &'a [(&'a str, &'a str)];
    let kept: [(&str, Props<'_>, &[u8]); 2] = [
        ("%RETRY%billing", &[("RETRY_TOPIC", "src")], b"retried"),
        ("src", &[("TRAN_MSG", "true"), ("PGROUP", "p")], b"marked"),
    ];
    for (topic, props, body) in kept {
        match send_back(topic, props, body) {
            Response::SendBackResult(r) => assert!(r.dead_lettered, "{topic}"),
            other => panic!("{topic}: {other:?}"),
        }
    }
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        let letters = client.pull("%DLQ%billing", 0, 0, 32, Duration::ZERO, &[]);
        let letters = letters.await.unwrap().messages;
        let seen: Vec<(&[u8], &str, Option<&str>)> = letters
            .iter()
            .map(|m| (m.body(), m.origin_topic(), m.property("TRAN_MSG")))
            .collect();
        assert_eq!(
            seen,
            [(&b"retried"[..], "src", None), (b"marked", "src", None)]
        );
    });
}

#[test]
fn consume_max_leaves_the_messages_past_it_on_their_queues_not_on_the_retry_topic() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    let rt = runtime();
    let all: std::collections::BTreeSet<String> = (0..40).map(|i| format!("m{i}")).collect();
    rt.block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("mx", 4).await.unwrap();
        for body in &all {
            producer
                .send("mx", OutgoingMessage::new(body.as_str()))
                .await
                .unwrap();
        }
    });
    // 3 processed, 200 ms each, with 20 listener calls at once: the calls of the other
    // messages come past the budget.
    let out = ringmq(
        &addr,
        &[
            "consume",
            "mx",
            "--group",
            "g-max",
            "--max",
            "3",
            "--threads",
            "20",
            "--process-ms",
            "200",
        ],
    );
    let first: Vec<String> = out
        .lines()
        .filter(|l| l.starts_with("MSG"))
        .map(|l| l.rsplit_once("body=").unwrap().1.to_owned())
        .collect();
    assert_eq!(first.len(), 3, "{out}");
    rt.block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        // A copy sent back waits on the schedule first (the first retry level), then
        // moves to the retry topic.
        let scheduled: u64 = client
            .schedule_stats()
            .await
            .unwrap()
            .iter()
            .map(|s| s.pending)
            .sum();
        let retried = all_of(&client, "%RETRY%g-max").await.len() as u64;
        assert_eq!(
            scheduled + retried,
            0,
            "message(s) past --max were sent back for a retry"
        );
        // The group's next member gets every message the first did not process.
        let got: Arc<Mutex<Vec<String>>> = Arc::default();
        let consumer = PushConsumer::new(ClientConfig::new(&addr), "g-max", options()).unwrap();
        consumer.subscribe("mx", "*").unwrap();
        {
            let got = got.clone();
            consumer
                .register_concurrent(move |messages| {
                    for m in messages {
                        let body = String::from_utf8_lossy(m.body()).into_owned();
                        got.lock().unwrap().push(body);
                    }
                    ConsumeStatus::Success
                })
                .unwrap();
        }
        consumer.start().await.unwrap();
        eventually("the rest of the messages", Duration::from_secs(20), || {
            let got = got.lock().unwrap();
            let seen: std::collections::BTreeSet<String> =
                got.iter().chain(&first).cloned().collect();
            seen == all
        })
        .await;
        consumer.shutdown().await.unwrap();
        assert!(all_of(&client, "%RETRY%g-max").await.is_empty());
    });
    // A group without dead letters resends none (its dead-letter topic does not exist,
    // nor where a resend got to).
    let resent = ringmq(&addr, &["dlq", "resend", "g-max"]);
    assert!(
        resent.contains("0 resent; next: --from-offset 0"),
        "{resent}"
    );
}
