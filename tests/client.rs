//! The native client against a real broker started in this process (two shards, loopback,
//! a temporary data directory): sends, batches, pulls with tag filters, offsets, lookups by
//! id and key, and topic admin, both shard aware and through the bootstrap connection.
#![cfg(feature = "broker")]

mod common;

use std::time::Duration;

use ringmq::client::{
    ClientConfig, ClientError, OutgoingMessage, Producer, ProducerOptions, PullStatus,
};
use ringmq::log::FlushMode;
use ringmq::protocol::ErrorCode;
use ringmq::shard::{Broker, BrokerConfig, TopicChangeFault};

const WAIT: Duration = Duration::from_millis(200);

/// When a shard that missed a topic change is told again at the earliest, after the
/// failure (the broker's `TELL_AGAIN_FIRST_MS`).
const TOLD_AGAIN_AFTER_MS: u64 = 1_000;

fn start_broker(dir: &std::path::Path) -> Broker {
    Broker::start(BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_owned(),
        shards: 2,
        flush: FlushMode::Async,
        auto_create_topics: true,
        // Preallocated segments: keep them small when many brokers run at once.
        segment_bytes: 64 << 20,
        ..Default::default()
    })
    .unwrap()
}

/// Everything a client does, over one broker; `shard_aware` picks the routing.
async fn check_client(addr: String, shard_aware: bool) {
    let topic = format!("orders-{shard_aware}");
    let mut config = ClientConfig::new(addr);
    config.shard_aware = shard_aware;
    let producer = Producer::connect_with(config, ProducerOptions::default())
        .await
        .unwrap();
    let client = producer.client().clone();
    assert_eq!(client.broker_info().shard_count, 2);

    client.create_topic(&topic, 4).await.unwrap();
    let err = client.create_topic(&topic, 4).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::TopicExists), "{err}");
    assert!(client.list_topics().await.unwrap().contains(&topic));
    assert_eq!(client.describe_topic(&topic).await.unwrap().queues.len(), 4);

    // Keyed sends land in one queue, in order; their ids are the broker's.
    let mut sent = Vec::new();
    for i in 0..10 {
        let message = OutgoingMessage::new(format!("body-{i}"))
            .with_tags(if i % 2 == 0 { "even" } else { "odd" })
            .with_key(format!("key-{i}"))
            .with_property("n", i.to_string())
            .with_sharding_key("order-1");
        sent.push(producer.send(&topic, message).await.unwrap());
    }
    let queue = sent[0].queue_id;
    assert!(sent.iter().all(|r| r.queue_id == queue));
    let first = sent[0].queue_offset;
    for (i, r) in sent.iter().enumerate() {
        assert_eq!(r.queue_offset, first + i as u64);
    }

    let pulled = client
        .pull(&topic, queue, first, 32, WAIT, &[])
        .await
        .unwrap();
    assert_eq!(pulled.status, PullStatus::Found);
    assert_eq!(pulled.messages.len(), 10);
    for (i, (m, r)) in pulled.messages.iter().zip(&sent).enumerate() {
        assert_eq!(m.body(), format!("body-{i}").as_bytes());
        assert_eq!(
            m.msg_id().encode(),
            r.msg_id,
            "the client computes the broker's id"
        );
        assert_eq!(m.queue_offset(), r.queue_offset);
        assert_eq!(m.property("n"), Some(i.to_string().as_str()));
        assert_eq!(m.keys().collect::<Vec<_>>(), vec![format!("key-{i}")]);
    }
    let odd = client
        .pull(&topic, queue, first, 32, WAIT, &["odd"])
        .await
        .unwrap();
    assert!(odd.messages.iter().all(|m| m.tags() == Some("odd")));
    assert_eq!(odd.messages.len(), 5);

    // Long polling: nothing new past the end.
    let end = client.max_offset(&topic, queue).await.unwrap();
    assert_eq!(end, first + 10);
    let empty = client
        .pull(&topic, queue, end, 32, WAIT, &[])
        .await
        .unwrap();
    assert_eq!(empty.status, PullStatus::NoNewMessage);
    assert!(empty.messages.is_empty());
    assert_eq!(client.min_offset(&topic, queue).await.unwrap(), 0);
    assert_eq!(
        client.offset_by_timestamp(&topic, queue, 0).await.unwrap(),
        0
    );

    // Lookups.
    let by_id = client
        .message_by_id(&sent[3].msg_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(by_id.body(), b"body-3");
    let by_key = client
        .messages_by_key(&topic, "key-4", 0, i64::MAX, 10)
        .await
        .unwrap();
    assert_eq!(by_key.len(), 1);
    assert_eq!(by_key[0].body(), b"body-4");

    // Committed offsets.
    assert_eq!(client.query_offset("g", &topic, queue).await.unwrap(), None);
    client
        .commit_offset("g", &topic, queue, first + 5)
        .await
        .unwrap();
    assert_eq!(
        client.query_offset("g", &topic, queue).await.unwrap(),
        Some(first + 5)
    );

    // A batch: one queue, consecutive offsets.
    let batch: Vec<_> = (0..5)
        .map(|i| OutgoingMessage::new(format!("batch-{i}")))
        .collect();
    let result = producer.send_batch(&topic, batch).await.unwrap();
    assert_eq!(result.count, 5);
    assert_eq!(result.msg_ids().len(), 5);
    let pulled = client
        .pull(
            &topic,
            result.queue_id,
            result.first_queue_offset,
            5,
            WAIT,
            &[],
        )
        .await
        .unwrap();
    let bodies: Vec<&[u8]> = pulled.messages.iter().map(|m| m.body()).collect();
    assert_eq!(
        bodies,
        vec![
            &b"batch-0"[..],
            b"batch-1",
            b"batch-2",
            b"batch-3",
            b"batch-4"
        ]
    );

    // Round-robin sends, then every queue drained.
    for i in 0..40 {
        producer
            .send(&topic, OutgoingMessage::new(format!("rr-{i}")))
            .await
            .unwrap();
    }
    let mut total = 0;
    for q in 0..4 {
        let mut offset = 0;
        loop {
            let r = client.pull(&topic, q, offset, 16, WAIT, &[]).await.unwrap();
            total += r.messages.len();
            if r.status == PullStatus::NoNewMessage {
                break;
            }
            offset = r.next_offset;
        }
    }
    assert_eq!(total, 10 + 5 + 40);

    // An auto-created topic: the first send lets the broker pick the queue.
    let fresh = format!("fresh-{shard_aware}");
    producer
        .send(&fresh, OutgoingMessage::new("x"))
        .await
        .unwrap();
    producer
        .send(&fresh, OutgoingMessage::new("y"))
        .await
        .unwrap();

    // Oneway: stored without an answer.
    producer
        .send_oneway(
            &topic,
            OutgoingMessage::new("oneway").with_sharding_key("order-1"),
        )
        .await
        .unwrap();
    let mut seen = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        let r = client
            .pull(&topic, queue, first + 10, 32, WAIT, &[])
            .await
            .unwrap();
        if r.messages.iter().any(|m| m.body() == b"oneway") {
            seen = true;
            break;
        }
        // The oneway send is not acknowledged: give its write time to land.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen, "the oneway message was stored");

    client.delete_topic(&topic).await.unwrap();
    let err = client.describe_topic(&topic).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::TopicNotFound), "{err}");
    assert!(matches!(
        producer
            .send(&topic, OutgoingMessage::new(vec![0u8; 5 << 20]))
            .await,
        Err(ClientError::BodyTooLarge { .. })
    ));
}

/// Runs `test` on a two-thread tokio runtime against a broker of its own (its address).
fn against_a_broker<F: std::future::Future<Output = ()>>(test: impl FnOnce(String) -> F) {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(dir.path());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(test(broker.addr().to_string()));
    drop(runtime);
    broker.shutdown().unwrap();
}

#[test]
fn client_against_a_real_broker() {
    against_a_broker(|addr| async move {
        check_client(addr.clone(), true).await;
        check_client(addr, false).await;
    });
}

/// Sends with a sharding key to a topic that does not exist yet (the broker creates topics
/// on first use): the producer has the topic made and learns its queues before the first
/// one, so every message with one key lands on one queue, the first included (sent to any
/// queue, it went where the broker chose). Alone, coalesced and in a batch.
#[test]
fn the_first_keyed_send_to_a_new_topic_lands_on_its_keys_queue() {
    against_a_broker(|addr| async move {
        for coalesce in [false, true] {
            let options = ProducerOptions {
                coalesce,
                ..Default::default()
            };
            let producer = Producer::connect_with(ClientConfig::new(&addr), options)
                .await
                .unwrap();
            for key in ["k-1", "k-2", "k-3"] {
                let topic = format!("keyed-{coalesce}-{key}");
                let mut queues = std::collections::BTreeSet::new();
                for i in 0..4 {
                    let m = OutgoingMessage::new(format!("{i}")).with_sharding_key(key);
                    queues.insert(producer.send(&topic, m).await.unwrap().queue_id);
                }
                let batch = vec![OutgoingMessage::new("b").with_sharding_key(key)];
                let batched = producer.send_batch(&format!("{topic}-b"), batch).await;
                let m = OutgoingMessage::new("after").with_sharding_key(key);
                let after = producer.send(&format!("{topic}-b"), m).await.unwrap();
                assert_eq!(queues.len(), 1, "{topic}: {queues:?}");
                assert_eq!(batched.unwrap().queue_id, after.queue_id, "{topic}-b");
            }
        }
    });
}

/// Batches go out with their bodies written from the caller's buffers (a vectored write of
/// the frame's pieces, more than one write's worth of pieces for the largest batch): the
/// largest batch, several batches at once on one connection, and a batch whose queue a
/// selector picks from the first message's body all arrive byte for byte, in order.
#[test]
fn batches_written_from_the_callers_buffers_arrive_byte_for_byte() {
    use ringmq::client::{QueueSelector, BATCH_MESSAGES_MAX};
    use std::sync::Arc;

    /// The queue named by the first byte of the body.
    struct FirstByte;
    impl QueueSelector for FirstByte {
        fn select(&self, _: &str, m: &OutgoingMessage, count: u32, _: u32) -> u32 {
            u32::from(m.body[0]) % count
        }
    }
    // Bodies of 0 to 700 bytes, each different: index, then a pattern.
    fn body(batch: usize, i: usize) -> Vec<u8> {
        let len = (i * 37 + batch * 11) % 701;
        let mut b = format!("{batch}:{i}:").into_bytes();
        b.extend((0..len).map(|k| (k * 7 + i) as u8));
        b
    }

    against_a_broker(|addr| async move {
        let producer = Producer::connect(ClientConfig::new(addr.clone()))
            .await
            .unwrap();
        let client = producer.client().clone();
        client.create_topic("parts", 4).await.unwrap();
        // Batch 0 alone at the largest size, then batches 1..=4 in flight together.
        let sizes = [BATCH_MESSAGES_MAX, 1000, 1, 2500, 300];
        let first = producer
            .send_batch(
                "parts",
                (0..sizes[0])
                    .map(|i| OutgoingMessage::new(body(0, i)))
                    .collect(),
            )
            .await
            .unwrap();
        let mut results = vec![first];
        let sends = (1..sizes.len()).map(|b| {
            let producer = &producer;
            async move {
                let batch = (0..sizes[b])
                    .map(|i| OutgoingMessage::new(body(b, i)))
                    .collect();
                producer.send_batch("parts", batch).await.unwrap()
            }
        });
        results.extend(futures_util::future::join_all(sends).await);
        // A selector: the queue comes from the first body's first byte.
        let selecting = Producer::connect_with(
            ClientConfig::new(addr.clone()),
            ProducerOptions {
                selector: Some(Arc::new(FirstByte)),
                ..ProducerOptions::default()
            },
        )
        .await
        .unwrap();
        let picked = selecting
            .send_batch(
                "parts",
                vec![
                    OutgoingMessage::new(vec![3u8, 1, 2]),
                    OutgoingMessage::new(vec![0u8]),
                ],
            )
            .await
            .unwrap();
        assert_eq!(picked.queue_id, 3);

        for (b, r) in results.iter().enumerate() {
            assert_eq!(r.count as usize, sizes[b]);
            let mut offset = r.first_queue_offset;
            let mut i = 0;
            while i < sizes[b] {
                let pulled = client
                    .pull("parts", r.queue_id, offset, 32, WAIT, &[])
                    .await
                    .unwrap();
                assert!(!pulled.messages.is_empty(), "batch {b}: stopped at {i}");
                for m in &pulled.messages {
                    if i < sizes[b] {
                        assert_eq!(m.body(), &body(b, i)[..], "batch {b} message {i}");
                    }
                    i += 1;
                }
                offset = pulled.next_offset;
            }
        }
        let last = client
            .pull("parts", 3, picked.first_queue_offset, 32, WAIT, &[])
            .await
            .unwrap();
        let bodies: Vec<&[u8]> = last.messages.iter().map(|m| m.body()).collect();
        assert_eq!(bodies[..2], [&[3u8, 1, 2][..], &[0u8][..]]);
    });
}

/// A two-shard broker whose shard 1 mishandles the changes to `topic` shard 0 tells it of
/// as `fault` says, and two clients, not shard aware: one whose requests shard 0 handles
/// (or forwards), one whose requests shard 1 does (its table is what `list_topics` shows).
fn with_a_topic_change_fault<F: std::future::Future<Output = ()>>(
    topic: &str,
    fault: TopicChangeFault,
    auto_create_topics: bool,
    test: impl FnOnce(Producer, Producer) -> F,
) {
    with_a_fault_and_metrics(topic, fault, auto_create_topics, None, test)
}

/// [`with_a_topic_change_fault`], with the metrics served at `metrics_listen`.
fn with_a_fault_and_metrics<F: std::future::Future<Output = ()>>(
    topic: &str,
    fault: TopicChangeFault,
    auto_create_topics: bool,
    metrics_listen: Option<std::net::SocketAddr>,
    test: impl FnOnce(Producer, Producer) -> F,
) {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_owned(),
        shards: 2,
        auto_create_topics,
        segment_bytes: 64 << 20,
        testing_topic_change_fault: Some((topic.to_owned(), fault)),
        metrics_listen,
        ..Default::default()
    })
    .unwrap();
    let on_shard = |i: usize| {
        let mut config = ClientConfig::new(broker.shard_addrs()[i].to_string());
        config.shard_aware = false;
        Producer::connect(config)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (zero, one) = (on_shard(0).await.unwrap(), on_shard(1).await.unwrap());
        test(zero, one).await;
    });
    drop(runtime);
    broker.shutdown().unwrap();
}

/// A shard that missed a topic's creation (shard 0's call to it failed) is told again the
/// first time it needs the topic, with auto-create on or off: sends through it are stored,
/// not refused until a restart.
#[test]
fn a_shard_that_missed_a_topics_creation_is_told_again_when_it_needs_the_topic() {
    for auto_create in [false, true] {
        with_a_topic_change_fault(
            "missed",
            TopicChangeFault::Drop(0),
            auto_create,
            |zero, one| async move {
                let asked = std::time::Instant::now();
                let err = zero.client().create_topic("missed", 4).await.unwrap_err();
                assert!(err.to_string().contains("dropped"), "{err}");
                assert!(zero
                    .client()
                    .list_topics()
                    .await
                    .unwrap()
                    .contains(&"missed".into()));
                // Told again a second after the failure at the earliest: until then, the
                // shard that missed it does not list it.
                let listed = one.client().list_topics().await.unwrap();
                if asked.elapsed() < Duration::from_millis(TOLD_AGAIN_AFTER_MS) {
                    assert!(!listed.contains(&"missed".into()));
                }
                for i in 0..8 {
                    one.send("missed", OutgoingMessage::new(format!("m{i}")))
                        .await
                        .unwrap_or_else(|e| panic!("auto-create {auto_create}: send {i}: {e}"));
                }
                assert!(one
                    .client()
                    .list_topics()
                    .await
                    .unwrap()
                    .contains(&"missed".into()));
                let info = zero.client().describe_topic("missed").await.unwrap();
                let stored: u64 = info.queues.iter().map(|q| q.max_offset).sum();
                assert_eq!(stored, 8, "auto-create {auto_create}: {info:?}");
            },
        );
    }
}

/// Pulls, offset and group requests, descriptions and multi-queue sends (`SendMulti`, as
/// a coalescing producer packs them) through a shard that missed a topic's creation ask
/// shard 0 as single sends do, rather than answer that the topic does not exist. Each kind
/// on a broker of its own: the first request that asks heals the shard for all that follow.
#[test]
fn pulls_and_offset_requests_through_a_shard_that_missed_a_creation_ask_shard_0() {
    use ringmq::protocol::route::owner;
    // Queue 0 is shard 1's, so that every request below is answered there.
    let topic = (0..)
        .map(|i| format!("unheard-{i}"))
        .find(|t| owner(t, 0, 2) == 1)
        .unwrap();
    let kinds = [
        "pull", "min", "max", "by-time", "commit", "query", "describe", "lock", "reset",
        "progress", "multi",
    ];
    for kind in kinds {
        let fault = TopicChangeFault::Drop(0);
        let name = topic.clone();
        with_a_topic_change_fault(&topic, fault, false, |zero, one| async move {
            let err = zero.client().create_topic(&name, 2).await.unwrap_err();
            assert!(err.to_string().contains("dropped"), "{err}");
            let c = one.client();
            match kind {
                "pull" => {
                    let r = c.pull(&name, 0, 0, 32, Duration::ZERO, &[]).await;
                    let r = r.unwrap_or_else(|e| panic!("{kind} through shard 1: {e}"));
                    assert!(r.messages.is_empty() && r.max_offset == 0, "{r:?}");
                }
                "min" => assert_eq!(
                    c.min_offset(&name, 0)
                        .await
                        .unwrap_or_else(|e| panic!("{kind} through shard 1: {e}")),
                    0
                ),
                "max" => assert_eq!(
                    c.max_offset(&name, 0)
                        .await
                        .unwrap_or_else(|e| panic!("{kind} through shard 1: {e}")),
                    0
                ),
                "by-time" => {
                    let at = c.offset_by_timestamp(&name, 0, 0).await;
                    assert_eq!(
                        at.unwrap_or_else(|e| panic!("{kind} through shard 1: {e}")),
                        0
                    );
                }
                "commit" => c
                    .commit_offset("g", &name, 0, 0)
                    .await
                    .unwrap_or_else(|e| panic!("{kind} through shard 1: {e}")),
                "query" => {
                    let committed = c.query_offset("g", &name, 0).await;
                    assert_eq!(
                        committed.unwrap_or_else(|e| panic!("{kind} through shard 1: {e}")),
                        None
                    );
                }
                "describe" => {
                    let info = c
                        .describe_topic(&name)
                        .await
                        .unwrap_or_else(|e| panic!("{kind} through shard 1: {e}"));
                    assert_eq!(info.queues.len(), 2, "{info:?}");
                }
                "lock" => {
                    let held = c.lock_batch("g", &name, &[0]).await;
                    assert_eq!(held.unwrap_or_else(|e| panic!("{kind}: {e}")), [0]);
                }
                "reset" => {
                    let reset = c.reset_offset_by_time("g", &name, 0).await;
                    reset.unwrap_or_else(|e| panic!("{kind}: {e}"));
                }
                "progress" => {
                    let lags = c.consumer_progress("g", &name).await;
                    assert_eq!(lags.unwrap_or_else(|e| panic!("{kind}: {e}")).len(), 2);
                }
                "multi" => {
                    let request = ringmq::protocol::SendMulti {
                        topic: name.clone(),
                        queue_ids: vec![0, 0],
                        messages: ["a", "b"]
                            .map(|b| ringmq::protocol::BatchItem {
                                flag: 0,
                                properties: Vec::new(),
                                body: bytes::Bytes::from_static(b.as_bytes()),
                                born_timestamp_ms: 0,
                            })
                            .into(),
                        wait_durable: false,
                    };
                    let addr = c.config().broker.clone();
                    let answer = tokio::task::spawn_blocking(move || {
                        common::raw::call(&addr, request.into())
                    });
                    match answer.await.unwrap() {
                        ringmq::protocol::Response::SendMultiResult(r) => {
                            assert_eq!((r.store_id, r.queue_offsets), (1, vec![0, 1]))
                        }
                        other => panic!("{kind} through shard 1: {other:?}"),
                    }
                    assert_eq!(c.max_offset(&name, 0).await.unwrap(), 2);
                }
                _ => unreachable!(),
            }
            let topics = c.list_topics().await.unwrap();
            assert!(topics.contains(&name), "{kind}: shard 1 lists {topics:?}");
        });
    }
}

/// Whether shard 1's `ringmq_sends_in_line` comes to `want` within 10 s (published every
/// second).
async fn sends_in_line_come_to(metrics: std::net::SocketAddr, want: f64) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    tokio::task::spawn_blocking(move || loop {
        let text = common::http_get(metrics, "/metrics");
        // None until shard 1 has published once.
        let line = text
            .lines()
            .find(|l| l.starts_with("ringmq_sends_in_line{") && l.contains("shard=\"1\""));
        if line.is_some_and(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() == want) {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    })
    .await
    .unwrap()
}

/// Sends that waited for their topic (shard 1 creates it through shard 0, whose answer
/// comes late) or behind such a send in the topic's line are refused when the topic is
/// deleted meanwhile (`Conflict`: auto-create is on). Before, the one in line was appended to
/// the queue being removed and acknowledged: a message acknowledged and gone with the
/// topic.
#[test]
fn sends_waiting_for_their_topic_are_refused_when_it_is_deleted_meanwhile() {
    use ringmq::protocol::route::owner;
    use ringmq::protocol::Response;
    use std::time::Instant;
    const SLOW_MS: u64 = 5_000;
    let topic = (0..)
        .map(|i| format!("gone-{i}"))
        .find(|t| owner(t, 0, 2) == 1)
        .unwrap();
    let fault = TopicChangeFault::SlowCreationAnswer(SLOW_MS);
    let name = topic.clone();
    let metrics = common::free_addr();
    with_a_fault_and_metrics(&topic, fault, true, Some(metrics), |zero, one| async move {
        let addr = one.client().config().broker.clone();
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        common::raw::write(&mut conn, 1, common::raw::send_to(&name, 0, "first").into());
        let sent_at = Instant::now();
        while !one.client().list_topics().await.unwrap().contains(&name) {
            assert!(sent_at.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        common::raw::write(
            &mut conn,
            2,
            common::raw::send_to(&name, 0, "second").into(),
        );
        assert!(
            sends_in_line_come_to(metrics, 2.0).await,
            "two sends in line"
        );
        zero.client().delete_topic(&name).await.unwrap();
        assert!(
            sent_at.elapsed() < Duration::from_millis(SLOW_MS),
            "the test's premise: deleted while the first send waits"
        );
        let answers = tokio::task::spawn_blocking(move || common::raw::read_answers(&mut conn, 2));
        for (id, answer) in answers.await.unwrap() {
            // Both are told to try again (auto-create is on: sent again, they create the
            // topic anew); neither is stored in the queue being removed.
            let want = ErrorCode::Conflict;
            match answer {
                Response::Error(e) => assert_eq!(e.error_code(), Some(want), "{id}: {e}"),
                other => panic!("send {id}: {other:?}"),
            }
        }
        assert!(!zero.client().list_topics().await.unwrap().contains(&name));
        assert!(!one.client().list_topics().await.unwrap().contains(&name));
    });
}

/// Sends naming a queue are stored in the order they arrived even while the first of them
/// waits for its shard to learn the topic. Here shard 1 creates the topic through shard 0
/// (auto-create), whose answer comes late; a send pipelined after it on the same
/// connection (single, batch or multi-queue) arrives once shard 1 has applied the topic,
/// and waits behind the first instead of being stored before it. Shard 1's metrics count
/// both sends in line meanwhile, and none once they are stored.
#[test]
fn a_send_arriving_while_an_earlier_one_learns_its_topic_is_stored_after_it() {
    use ringmq::protocol::route::owner;
    use ringmq::protocol::{BatchItem, Response, SendBatch, SendMulti};
    use std::time::Instant;
    const SLOW_MS: u64 = 5_000;
    // Queue 0 is shard 1's: both sends are handled there.
    let topic = (0..)
        .map(|i| format!("line-{i}"))
        .find(|t| owner(t, 0, 2) == 1)
        .unwrap();
    let single = |topic: &str, body: &str| common::raw::send_to(topic, 0, body);
    let item = || BatchItem {
        flag: 0,
        properties: Vec::new(),
        body: bytes::Bytes::from_static(b"second"),
        born_timestamp_ms: 0,
    };
    for kind in ["single", "batch", "multi"] {
        let fault = TopicChangeFault::SlowCreationAnswer(SLOW_MS);
        let name = topic.clone();
        let metrics = common::free_addr();
        with_a_fault_and_metrics(&topic, fault, true, Some(metrics), |_, one| async move {
            let addr = one.client().config().broker.clone();
            let mut conn = std::net::TcpStream::connect(&addr).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            common::raw::write(&mut conn, 1, single(&name, "first").into());
            let sent_at = Instant::now();
            // Shard 1 applies the topic, then waits for shard 0's late answer.
            while !one.client().list_topics().await.unwrap().contains(&name) {
                assert!(sent_at.elapsed() < Duration::from_secs(10), "{kind}");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let second = match kind {
                "single" => single(&name, "second").into(),
                "batch" => SendBatch {
                    topic: name.clone(),
                    queue_id: 0,
                    messages: vec![item()],
                    wait_durable: false,
                }
                .into(),
                _ => SendMulti {
                    topic: name.clone(),
                    queue_ids: vec![0],
                    messages: vec![item()],
                    wait_durable: false,
                }
                .into(),
            };
            // The test's premise: the first send is still unanswered.
            conn.set_nonblocking(true).unwrap();
            let peeked = conn.peek(&mut [0u8; 1]);
            assert!(
                peeked.is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
                "{kind}: the first send was answered before shard 1 was seen to know the topic"
            );
            conn.set_nonblocking(false).unwrap();
            common::raw::write(&mut conn, 2, second);
            let two = sends_in_line_come_to(metrics, 2.0).await;
            assert!(two, "{kind}: two sends in line");
            let answers =
                tokio::task::spawn_blocking(move || common::raw::read_answers(&mut conn, 2));
            let mut offsets = [None, None];
            for (id, answer) in answers.await.unwrap() {
                offsets[id as usize - 1] = Some(match answer {
                    Response::SendResult(r) => r.queue_offset,
                    Response::SendBatchResult(r) => r.first_queue_offset,
                    Response::SendMultiResult(r) => r.queue_offsets[0],
                    other => panic!("{kind}: request {id}: {other:?}"),
                });
            }
            assert_eq!(offsets, [Some(0), Some(1)], "{kind}");
            let pulled = one.client().pull(&name, 0, 0, 32, Duration::ZERO, &[]);
            let pulled = pulled.await.unwrap();
            let bodies: Vec<&[u8]> = pulled.messages.iter().map(|m| m.body()).collect();
            assert_eq!(bodies, [&b"first"[..], &b"second"[..]], "{kind}");
            let gone = sends_in_line_come_to(metrics, 0.0).await;
            assert!(gone, "{kind}: the line is gone");
        });
    }
}

/// Another shard applies topic changes in the order shard 0 sent them, even when a
/// creation finishes after shard 0 stopped waiting for it (here: acknowledged at once,
/// applied once the next change has arrived): the deletion sent next waits for it, and the
/// topic does not come back on that shard alone.
#[test]
fn a_late_creation_does_not_outlive_the_deletion_sent_after_it() {
    with_a_topic_change_fault(
        "flip",
        TopicChangeFault::LateCreation(60_000),
        false,
        |zero, one| async move {
            zero.client().create_topic("flip", 2).await.unwrap();
            zero.client().delete_topic("flip").await.unwrap();
            // Applied in order, both are done when the deletion is acknowledged; out of
            // order, the creation lands a few milliseconds after the deletion: watched for
            // up to a second, failing the moment it shows.
            let watch_until = std::time::Instant::now() + Duration::from_secs(1);
            while std::time::Instant::now() < watch_until {
                let topics = one.client().list_topics().await.unwrap();
                assert!(
                    !topics.contains(&"flip".into()),
                    "the deleted topic is back on shard 1"
                );
            }
            let err = one
                .send("flip", OutgoingMessage::new(b"x".to_vec()))
                .await
                .unwrap_err();
            assert_eq!(err.code(), Some(ErrorCode::TopicNotFound), "{err}");
        },
    );
}

/// A shard that missed a topic's growth (shard 0's call failed) learns it from shard 0 when
/// a send reaches one of the new queues it owns, instead of refusing it until a restart:
/// a single send, or a multi-queue one (`SendMulti`, as a coalescing producer packs them).
#[test]
fn a_shard_that_missed_a_growth_learns_it_when_a_send_reaches_a_new_queue() {
    use ringmq::client::{ProducerOptions, QueueSelector};
    use ringmq::protocol::route::owner;
    use std::sync::Arc;

    /// Always queue 2.
    struct Two;
    impl QueueSelector for Two {
        fn select(&self, _: &str, _: &OutgoingMessage, count: u32, _: u32) -> u32 {
            assert!(count > 2, "the route lists {count} queues");
            2
        }
    }
    // A name whose queue 2 is shard 1's: after the missed growth shard 1 lists only its
    // queue 0 and shard 0 its queues 1 and 3, a route of 3 queues, which reaches queue 2.
    let topic = (0..)
        .map(|i| format!("grown-{i}"))
        .find(|t| owner(t, 2, 2) == 1)
        .unwrap();
    for kind in ["single", "multi"] {
        let fault = TopicChangeFault::Drop(1);
        let topic = topic.clone();
        with_a_topic_change_fault(&topic.clone(), fault, false, |zero, one| async move {
            zero.client().create_topic(&topic, 2).await.unwrap();
            let err = zero.client().update_topic(&topic, 4).await.unwrap_err();
            assert!(err.to_string().contains("dropped"), "{err}");
            if kind == "single" {
                let shard_0 = zero.client().broker_info().shard_addrs[0].clone();
                let mut config = ClientConfig::new(shard_0);
                config.shard_aware = false;
                let options = ProducerOptions {
                    selector: Some(Arc::new(Two)),
                    ..ProducerOptions::default()
                };
                let producer = Producer::connect_with(config, options).await.unwrap();
                let sent = producer
                    .send(&topic, OutgoingMessage::new(b"to a new queue".to_vec()))
                    .await
                    .unwrap();
                assert_eq!(sent.queue_id, 2);
            } else {
                let request = ringmq::protocol::SendMulti {
                    topic: topic.clone(),
                    queue_ids: vec![2],
                    messages: vec![ringmq::protocol::BatchItem {
                        flag: 0,
                        properties: Vec::new(),
                        body: bytes::Bytes::from_static(b"to a new queue"),
                        born_timestamp_ms: 0,
                    }],
                    wait_durable: false,
                };
                let addr = one.client().config().broker.clone();
                let answer =
                    tokio::task::spawn_blocking(move || common::raw::call(&addr, request.into()));
                match answer.await.unwrap() {
                    ringmq::protocol::Response::SendMultiResult(r) => {
                        assert_eq!((r.store_id, r.queue_offsets), (1, vec![0]))
                    }
                    other => panic!("{kind} through shard 1: {other:?}"),
                }
            }
            let info = zero.client().describe_topic(&topic).await.unwrap();
            assert_eq!(info.queues.len(), 4, "{kind}: {info:?}");
            assert_eq!(info.queues[2].max_offset, 1, "{kind}: {info:?}");
        });
    }
}

/// A shard whose call to take a deletion failed is told again in the background: the
/// topic leaves its table too, without a restart (no send would ever ask about a topic the
/// shard still lists).
#[test]
fn a_shard_that_missed_a_deletion_is_told_again_in_the_background() {
    with_a_topic_change_fault(
        "gone",
        TopicChangeFault::Drop(1),
        false,
        |zero, one| async move {
            zero.client().create_topic("gone", 2).await.unwrap();
            let asked = std::time::Instant::now();
            let err = zero.client().delete_topic("gone").await.unwrap_err();
            let said = err.to_string();
            assert!(
                said.contains("dropped") && said.contains("told again"),
                "{said}"
            );
            assert!(!zero
                .client()
                .list_topics()
                .await
                .unwrap()
                .contains(&"gone".into()));
            // Told again a second after the failure at the earliest.
            let listed = one.client().list_topics().await.unwrap();
            if asked.elapsed() < Duration::from_millis(TOLD_AGAIN_AFTER_MS) {
                assert!(listed.contains(&"gone".into()));
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while one
                .client()
                .list_topics()
                .await
                .unwrap()
                .contains(&"gone".into())
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "shard 1 still lists the deleted topic"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    );
}
