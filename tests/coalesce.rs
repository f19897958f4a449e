//! Coalesced single sends (`ProducerOptions::coalesce`) against the real broker binary: many
//! concurrent sends go out packed into one request per shard (`SendMulti`, messages to
//! several queues) while a send to that shard is in flight, and every send still gets its
//! own result (message id, queue, offset) that names exactly its message; keyed sends keep
//! their order; delayed messages still go alone. And `SendMulti` itself, written as raw
//! frames: each message in its queue, in order, forwarded to the shard that owns the queues,
//! and typed errors (nothing stored) for what it refuses.

mod common;

use std::collections::BTreeMap;
use std::future::Future;

use common::broker::BrokerProcess;
use common::raw::{call, error_of};
use common::runtime;
use ringmq::client::{Client, ClientConfig, OutgoingMessage, Producer, ProducerOptions};
use ringmq::protocol::record::PropertiesBuilder;
use ringmq::protocol::route::owner;
use ringmq::protocol::{BatchItem, ErrorCode, Response, SendMulti};

fn one_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn coalescing_producer(addr: &str) -> Producer {
    let options = ProducerOptions {
        coalesce: true,
        ..Default::default()
    };
    Producer::connect_with(ClientConfig::new(addr), options)
        .await
        .unwrap()
}

/// Runs `body` with a coalescing producer, and its client, against a broker of `shards`,
/// on one thread: nothing else runs while `body` polls (answers are taken between its
/// polls, not during them), so what a test sees packed does not depend on the machine.
fn with_producer<F, Fut>(shards: usize, body: F)
where
    F: FnOnce(Producer, Client) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), shards, &[]);
    let addr = broker.addr_string();
    one_thread().block_on(async {
        let producer = coalescing_producer(&addr).await;
        let client = producer.client().clone();
        body(producer, client).await;
    });
}

#[test]
fn coalesced_single_sends_each_get_the_result_of_their_own_message() {
    with_producer(2, |producer, client| async move {
        // 16 queues over 2 shards: packed per shard, a few requests carry them all (packed
        // per queue, it would take one request per queue at least).
        client.create_topic("co", 16).await.unwrap();
        // The producer learns the topic's queues first (sends made before that wait for
        // it and may go in any order).
        producer
            .send("co", OutgoingMessage::new("first"))
            .await
            .unwrap();
        const N: usize = 4000;
        // All at once, issued in order: every send is polled, in send order, before any
        // answer comes, so sends to a queue pile up while one to it is in flight.
        let mut sends: Vec<_> = (0..N)
            .map(|i| {
                let m = OutgoingMessage::new(format!("m{i}"));
                // A quarter keyed: their order in their queue must hold.
                let m = if i % 4 == 0 {
                    m.with_sharding_key("k")
                } else {
                    m
                };
                Some(Box::pin(producer.send_async("co", m)))
            })
            .collect();
        let mut done: Vec<Option<_>> = (0..N).map(|_| None).collect();
        std::future::poll_fn(|cx| {
            for (send, out) in sends.iter_mut().zip(done.iter_mut()) {
                if let Some(f) = send {
                    if let std::task::Poll::Ready(r) = f.as_mut().poll(cx) {
                        *out = Some(r);
                        *send = None;
                    }
                }
            }
            if sends.iter().all(Option::is_none) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        let results: Vec<_> = done
            .into_iter()
            .enumerate()
            .map(|(i, r)| (i, r.unwrap().unwrap()))
            .collect();
        // Every result names its own message, at a distinct place.
        let mut places = BTreeMap::new();
        for (i, r) in &results {
            assert!(
                places.insert((r.queue_id, r.queue_offset), *i).is_none(),
                "{r:?}"
            );
            let by_id = client.message_by_id(&r.msg_id).await.unwrap().unwrap();
            assert_eq!(by_id.body(), format!("m{i}").as_bytes());
            assert_eq!(
                (by_id.queue_id(), by_id.queue_offset()),
                (r.queue_id, r.queue_offset)
            );
        }
        // Keyed sends: one queue, in send order.
        let keyed: Vec<_> = results.iter().filter(|(i, _)| i % 4 == 0).collect();
        let q = keyed[0].1.queue_id;
        assert!(keyed.iter().all(|(_, r)| r.queue_id == q));
        assert!(keyed
            .windows(2)
            .all(|w| w[0].1.queue_offset < w[1].1.queue_offset));
        // A few requests, each for the queues of one shard, carried most of them.
        let batches = producer.coalesced_batches();
        assert!(batches > 0 && batches < 16, "{batches} batches");
        let info = client.describe_topic("co").await.unwrap();
        assert_eq!(
            info.queues.iter().map(|q| q.max_offset).sum::<u64>(),
            N as u64 + 1
        );
        // A delayed message still goes alone and is scheduled.
        let r = producer
            .send("co", OutgoingMessage::new("later").with_delay_ms(50))
            .await
            .unwrap();
        assert_eq!(r.queue_offset, ringmq::client::QUEUE_OFFSET_SCHEDULED);
    });
}

fn multi(topic: &str, queue_ids: Vec<u32>, bodies: &[&str]) -> SendMulti {
    SendMulti {
        topic: topic.into(),
        queue_ids,
        messages: bodies
            .iter()
            .map(|b| BatchItem {
                flag: 0,
                properties: Vec::new(),
                body: bytes::Bytes::copy_from_slice(b.as_bytes()),
                born_timestamp_ms: 0,
            })
            .collect(),
        wait_durable: false,
    }
}

/// The messages stored in each queue of `topic`, summed.
async fn stored(client: &Client, topic: &str) -> u64 {
    let info = client.describe_topic(topic).await.unwrap();
    info.queues.iter().map(|q| q.max_offset).sum()
}

#[test]
fn a_multi_queue_send_stores_each_message_in_its_queue_in_order_or_refuses_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("mq", 8).await.unwrap();
        // Queues of shard 1, sent to the broker's address (shard 0 reads it and passes it on).
        let mine: Vec<u32> = (0..8).filter(|&q| owner("mq", q, 2) == 1).collect();
        let theirs = (0..8).find(|&q| owner("mq", q, 2) == 0).unwrap();
        assert!(mine.len() >= 2, "{mine:?}");
        let (a, b) = (mine[0], mine[1]);
        let queues = vec![a, b, a, b, a];
        let bodies = ["a0", "b0", "a1", "b1", "a2"];
        let r = match call(&addr, multi("mq", queues.clone(), &bodies).into()) {
            Response::SendMultiResult(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(r.store_id, 1);
        assert_eq!(r.queue_offsets, vec![0, 0, 1, 1, 2]);
        assert!(r.physical_offsets.windows(2).all(|w| w[0] < w[1]));
        for (i, body) in bodies.iter().enumerate() {
            let m = client
                .message_by_id(&r.msg_id(i).unwrap())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(m.body(), body.as_bytes());
            assert_eq!(
                (m.queue_id(), m.queue_offset()),
                (queues[i], r.queue_offsets[i])
            );
        }
        assert_eq!(stored(&client, "mq").await, 5);

        // Refused whole, with a typed error naming the problem; nothing stored.
        let delayed = {
            let mut m = multi("mq", vec![a, b], &["x", "y"]);
            let mut props = PropertiesBuilder::new();
            props
                .put(ringmq::protocol::record::prop::DELAY, "1")
                .unwrap();
            m.messages[1].properties = props.into_bytes();
            m
        };
        let refused = [
            (
                multi("mq", vec![a, theirs], &["x", "y"]),
                ErrorCode::QueueNotFound,
                "one shard",
            ),
            (
                multi("mq", vec![a], &["x", "y"]),
                ErrorCode::InvalidMessage,
                "1 queues for 2 messages",
            ),
            (
                multi("mq", vec![a, 8], &["x", "y"]),
                ErrorCode::QueueNotFound,
                "no queue 8",
            ),
            (multi("mq", vec![], &[]), ErrorCode::InvalidMessage, "1..="),
            (
                multi("nope", vec![0], &["x"]),
                ErrorCode::TopicNotFound,
                "nope",
            ),
            (delayed, ErrorCode::InvalidDelay, "delayed"),
        ];
        for (request, code, says) in refused {
            let (found, message) = error_of(call(&addr, request.into()));
            assert_eq!(found, code, "{message}");
            assert!(message.contains(says), "{message}");
        }
        assert_eq!(stored(&client, "mq").await, 5);
        // Still serving.
        match call(&addr, multi("mq", vec![b], &["b2"]).into()) {
            Response::SendMultiResult(r) => assert_eq!(r.queue_offsets, vec![2]),
            other => panic!("{other:?}"),
        }
    });
}

/// A window of sends in flight, each answered send followed by a new one (as an
/// application, or ringmq-bench, keeps its window full): the sends made on an answer queue
/// before the shard counts as idle, so nearly every request carries a window's worth and
/// hardly any send goes alone (going alone, the first of them would hold the rest back a
/// round trip: one request alone for every packed one).
#[test]
fn a_full_window_of_sends_goes_out_packed_round_after_round() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    // One thread: what runs between an answer and the next request is deterministic.
    one_thread().block_on(async {
        let producer = coalescing_producer(&addr).await;
        producer.client().create_topic("win", 4).await.unwrap();
        producer
            .send("win", OutgoingMessage::new("first"))
            .await
            .unwrap();
        const N: u64 = 3000;
        const WINDOW: u64 = 100;
        let mut in_flight = futures_util::stream::FuturesUnordered::new();
        let mut sent = 0;
        while sent < WINDOW {
            in_flight.push(producer.send_async("win", OutgoingMessage::new(format!("m{sent}"))));
            sent += 1;
        }
        use futures_util::StreamExt;
        while let Some(r) = in_flight.next().await {
            r.unwrap();
            if sent < N {
                in_flight
                    .push(producer.send_async("win", OutgoingMessage::new(format!("m{sent}"))));
                sent += 1;
            }
        }
        let batches = producer.coalesced_batches();
        let alone = N - producer.coalesced_sends();
        assert!(batches >= N / WINDOW - 1, "{batches} requests");
        assert!(
            alone * 4 <= batches,
            "{alone} sends went alone, {batches} packed requests"
        );
    });
}

/// Polls each future once (so each takes its place: the first the shard's request slot,
/// the rest the queue behind it).
async fn poll_once<F: Future + Unpin>(futures: &mut [F]) {
    std::future::poll_fn(|cx| {
        for f in futures.iter_mut() {
            let _ = std::pin::Pin::new(f).poll(cx);
        }
        std::task::Poll::Ready(())
    })
    .await;
}

/// Runs `body` with a coalescing producer against a one-shard broker whose every log write
/// takes 300 ms, after it sent `first` to `topic` (made with `queues` queues): it knows the
/// topic's queues, and a send takes the shard's request slot on its first poll.
fn behind_slow_writes<F, Fut>(topic: &str, queues: u32, body: F)
where
    F: FnOnce(Producer) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        1,
        &["--testing-write-delay-us", "300000"],
    );
    runtime().block_on(async {
        let producer = coalescing_producer(&broker.addr_string()).await;
        producer.client().create_topic(topic, queues).await.unwrap();
        producer
            .send(topic, OutgoingMessage::new("first"))
            .await
            .unwrap();
        body(producer).await;
    });
}

/// The send that holds a shard's request slot is dropped before its answer (a caller's
/// timeout): the sends queued behind it still go, and are answered.
#[test]
fn sends_queued_behind_a_dropped_send_still_go() {
    // Every log write waits 300 ms: the first send is still unanswered when it is dropped.
    behind_slow_writes("drop", 2, |producer| async move {
        let mut lead = vec![Box::pin(
            producer.send_async("drop", OutgoingMessage::new("lead")),
        )];
        let mut queued: Vec<_> = (0..10)
            .map(|i| Box::pin(producer.send_async("drop", OutgoingMessage::new(format!("m{i}")))))
            .collect();
        poll_once(&mut lead).await;
        poll_once(&mut queued).await;
        drop(lead);
        let answered = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            futures_util::future::join_all(queued),
        )
        .await
        .expect("the sends queued behind a dropped send were never sent");
        let mut places = std::collections::BTreeSet::new();
        for r in answered {
            let r = r.unwrap();
            assert!(places.insert((r.queue_id, r.queue_offset)), "{r:?}");
        }
        assert_eq!(producer.coalesced_sends(), 10);
    });
}

/// The send that holds a shard's request slot is polled once, then left alone while its
/// caller awaits sends queued behind it (a `select!` loop's other branch): they still go
/// once it is answered, since its request runs on a task of its own.
#[test]
fn sends_queued_behind_a_send_left_unpolled_still_go() {
    behind_slow_writes("idle", 1, |producer| async move {
        let mut lead = vec![Box::pin(
            producer.send_async("idle", OutgoingMessage::new("lead")),
        )];
        poll_once(&mut lead).await;
        let queued: Vec<_> = (0..10)
            .map(|i| producer.send_async("idle", OutgoingMessage::new(format!("m{i}"))))
            .collect();
        let answered = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            futures_util::future::join_all(queued),
        )
        .await
        .expect("the sends queued behind a send left unpolled were never sent");
        assert!(answered.iter().all(Result::is_ok), "{answered:?}");
        let lead = lead.pop().unwrap().await.unwrap();
        assert_eq!(lead.queue_offset, 1, "{lead:?}");
    });
}

/// The bodies stored in queue 0 of `topic`, in order.
async fn bodies_in(client: &Client, topic: &str) -> Vec<String> {
    let end = client.max_offset(topic, 0).await.unwrap();
    let pulled = client
        .pull(topic, 0, 0, end as u32, std::time::Duration::ZERO, &[])
        .await
        .unwrap();
    pulled
        .messages
        .iter()
        .map(|m| String::from_utf8_lossy(m.body()).into_owned())
        .collect()
}

/// Sends queued behind a slow one whose callers gave up (a timeout around each send, as
/// applications do) are not sent: nothing they asked for is stored behind their back, and
/// the queue of them does not grow with every retry.
#[test]
fn queued_sends_whose_callers_gave_up_are_not_sent() {
    behind_slow_writes("gave-up", 1, |producer| async move {
        let client = producer.client().clone();
        let mut lead = vec![Box::pin(
            producer.send_async("gave-up", OutgoingMessage::new("lead")),
        )];
        poll_once(&mut lead).await;
        let abandoned = (0..200).map(|i| {
            let send = producer.send_async("gave-up", OutgoingMessage::new(format!("m{i}")));
            tokio::time::timeout(std::time::Duration::from_millis(5), send)
        });
        let abandoned = futures_util::future::join_all(abandoned).await;
        assert!(abandoned.iter().all(|r| r.is_err()), "all gave up");
        lead.pop().unwrap().await.unwrap();
        producer
            .send("gave-up", OutgoingMessage::new("last"))
            .await
            .unwrap();
        assert_eq!(
            bodies_in(&client, "gave-up").await,
            ["first", "lead", "last"]
        );
    });
}

/// A one-shard broker whose every log write takes `write_delay_us`, without flow control's
/// `BrokerBusy`: sends wait for the slow disk, or time out.
fn slow_broker(dir: &tempfile::TempDir, write_delay_us: u64) -> BrokerProcess {
    let delay = write_delay_us.to_string();
    let args = [
        "--testing-write-delay-us",
        &delay,
        "--send-wait-max-ms",
        "60000",
    ];
    BrokerProcess::start(&dir.path().join("data"), 1, &args)
}

/// A coalescing producer whose requests time out after `timeout_ms`, each tried
/// `1 + retries` times, knowing the queue of the one-queue `topic` it makes: its first
/// send (which times out on a slow broker) looks it up, so the next send takes the shard's
/// request slot on its first poll.
async fn impatient_producer(addr: &str, timeout_ms: u64, retries: u32, topic: &str) -> Producer {
    let mut config = ClientConfig::new(addr);
    config.request_timeout_ms = timeout_ms;
    let options = ProducerOptions {
        coalesce: true,
        retries,
        ..Default::default()
    };
    let producer = Producer::connect_with(config, options).await.unwrap();
    producer.client().create_topic(topic, 1).await.unwrap();
    let first = producer.send(topic, OutgoingMessage::new("first")).await;
    assert!(first.is_err(), "{first:?}");
    producer
}

/// A send still queued when its request timeout has passed (the send ahead of it takes
/// longer) fails with `Timeout` then, not once the send ahead is done, and is not sent:
/// its caller is told it failed, and it is not stored afterwards. Before, it failed only
/// when the send ahead of it had run all its attempts.
#[test]
fn a_send_queued_past_its_timeout_fails_unsent() {
    let dir = tempfile::tempdir().unwrap();
    // Each write takes 1.2 s: a send's five attempts, 500 ms each, all time out.
    let broker = slow_broker(&dir, 1_200_000);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = impatient_producer(&addr, 500, 4, "late").await;
        let mut lead = vec![Box::pin(
            producer.send_async("late", OutgoingMessage::new("lead")),
        )];
        poll_once(&mut lead).await;
        let queued = producer
            .send("late", OutgoingMessage::new("queued"))
            .await
            .unwrap_err();
        assert!(
            matches!(queued, ringmq::client::ClientError::Timeout { .. }),
            "{queued:?}"
        );
        // The lead (five attempts of 500 ms) is still unanswered.
        let mut still = false;
        std::future::poll_fn(|cx| {
            still = lead[0].as_mut().poll(cx).is_pending();
            std::task::Poll::Ready(())
        })
        .await;
        assert!(still, "the queued send waited for the lead's attempts");
        assert!(lead.pop().unwrap().await.is_err(), "the lead timed out too");
        // A send made after all of them, answered once every write before it is done.
        let mut config = ClientConfig::new(&addr);
        config.request_timeout_ms = 30_000;
        let client = Client::connect(config).await.unwrap();
        let patient = Producer::from_client(client.clone(), ProducerOptions::default());
        patient
            .send("late", OutgoingMessage::new("last"))
            .await
            .unwrap();
        let bodies = bodies_in(&client, "late").await;
        assert!(!bodies.iter().any(|b| b == "queued"), "{bodies:?}");
        assert!(bodies.iter().any(|b| b == "lead"), "{bodies:?}");
        assert_eq!(
            bodies.last().map(String::as_str),
            Some("last"),
            "{bodies:?}"
        );
    });
}

/// A producer keeps at most 64 MiB of sends queued behind requests in flight: a send past
/// that waits for room, and fails with `Timeout` when its request timeout passes first
/// (while the send ahead of all of them is still unanswered), unsent.
#[test]
fn queued_sends_are_bounded_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = slow_broker(&dir, 1_500_000);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = impatient_producer(&addr, 800, 2, "full").await;
        let mut lead = vec![Box::pin(
            producer.send_async("full", OutgoingMessage::new("lead")),
        )];
        poll_once(&mut lead).await;
        // Sixteen bodies of 4,000,000 bytes fit in the 64 MiB; the seventeenth does not.
        let body = vec![b'x'; 4_000_000];
        let mut queued: Vec<_> = (0..16)
            .map(|_| Box::pin(producer.send_async("full", OutgoingMessage::new(body.clone()))))
            .collect();
        poll_once(&mut queued).await;
        let over = producer
            .send("full", OutgoingMessage::new(body.clone()))
            .await
            .unwrap_err();
        assert!(
            matches!(over, ringmq::client::ClientError::Timeout { .. }),
            "{over:?}"
        );
        // The lead (three attempts of 800 ms) is still unanswered: the refused send did not
        // wait in the queue for it.
        let mut still = false;
        std::future::poll_fn(|cx| {
            still = lead[0].as_mut().poll(cx).is_pending();
            std::task::Poll::Ready(())
        })
        .await;
        assert!(
            still,
            "the lead was answered before the refused send gave up"
        );
        let _ = futures_util::future::join_all(queued).await;
        let _ = lead.pop().unwrap().await;
    });
}

/// A topic is made again with fewer queues under a producer that still sends to its old
/// ones (its cached count): the packed request is refused for the queues that are gone, and
/// its messages go again one by one, so the sends to queues that remain are stored and only
/// the others fail.
#[test]
fn a_refused_packed_request_fails_only_the_sends_at_fault() {
    with_producer(1, |producer, client| async move {
        client.create_topic("shrink", 4).await.unwrap();
        producer
            .send("shrink", OutgoingMessage::new("first"))
            .await
            .unwrap();
        client.delete_topic("shrink").await.unwrap();
        client.create_topic("shrink", 2).await.unwrap();
        // The producer still counts 4 queues (cached): round-robin over all of them.
        let mut sends: Vec<_> = (0..20)
            .map(|i| Box::pin(producer.send_async("shrink", OutgoingMessage::new(format!("m{i}")))))
            .collect();
        poll_once(&mut sends).await;
        let results = futures_util::future::join_all(sends).await;
        let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(ok.iter().all(|r| r.queue_id < 2), "{ok:?}");
        assert!(ok.len() >= 8, "{} stored, {failed:?}", ok.len());
        assert!(
            failed
                .iter()
                .all(|e| e.code() == Some(ErrorCode::QueueNotFound)),
            "{failed:?}"
        );
        assert!(producer.coalesced_sends() > 0);
        // What was answered stored is there, and nothing else.
        assert_eq!(stored(&client, "shrink").await, ok.len() as u64);
    });
}

/// A coalescing producer that never sent to a topic looks its queues up on the first sends
/// (they are not decided up front like the later ones), and the sends go out, each with the
/// result of its own message; a send the producer refuses before any I/O fails typed, and
/// the ones after it still go.
#[test]
fn a_topics_first_sends_look_its_queues_up_and_a_refused_send_fails_typed() {
    with_producer(2, |producer, client| async move {
        client.create_topic("fresh", 4).await.unwrap();
        // None of these finds the topic's queue count cached when first polled.
        let sends: Vec<_> = (0..64)
            .map(|i| Box::pin(producer.send_async("fresh", OutgoingMessage::new(format!("f{i}")))))
            .collect();
        let results = futures_util::future::join_all(sends).await;
        let mut places = BTreeMap::new();
        for (i, r) in results.into_iter().enumerate() {
            let r = r.unwrap();
            assert!(r.queue_id < 4, "{r:?}");
            assert!(
                places.insert((r.queue_id, r.queue_offset), i).is_none(),
                "{r:?}"
            );
            let by_id = client.message_by_id(&r.msg_id).await.unwrap().unwrap();
            assert_eq!(by_id.body(), format!("f{i}").as_bytes());
        }
        assert_eq!(stored(&client, "fresh").await, 64);
        // Refused before any I/O: a topic name too long, a body over the limit.
        let long = "t".repeat(300);
        let e = producer
            .send(&long, OutgoingMessage::new("x"))
            .await
            .unwrap_err();
        assert!(
            matches!(e, ringmq::client::ClientError::InvalidArgument(_)),
            "{e:?}"
        );
        let huge = vec![0u8; ringmq::protocol::record::BODY_BYTES_MAX + 1];
        let e = producer
            .send("fresh", OutgoingMessage::new(huge))
            .await
            .unwrap_err();
        assert!(
            matches!(e, ringmq::client::ClientError::BodyTooLarge { .. }),
            "{e:?}"
        );
        // Now cached: each `send` takes its queue when it is called. All made before any is
        // polled, one of them dropped unpolled (it sends nothing), the rest polled in the
        // reverse order.
        let coalesced_before = producer.coalesced_sends();
        drop(producer.send("fresh", OutgoingMessage::new("never")));
        let mut sends: Vec<_> = (0..64)
            .map(|i| Box::pin(producer.send("fresh", OutgoingMessage::new(format!("g{i}")))))
            .collect();
        sends.reverse();
        poll_once(&mut sends).await;
        let mut results = futures_util::future::join_all(sends).await;
        results.reverse();
        // Round-robin, one queue taken per send: 64 sends over 4 queues, 16 each.
        let mut per_queue = BTreeMap::new();
        for (i, r) in results.iter().enumerate() {
            let r = r.as_ref().unwrap();
            *per_queue.entry(r.queue_id).or_insert(0) += 1;
            let by_id = client.message_by_id(&r.msg_id).await.unwrap().unwrap();
            assert_eq!(by_id.body(), format!("g{i}").as_bytes());
        }
        assert_eq!(per_queue.into_values().collect::<Vec<_>>(), [16; 4]);
        assert!(producer.coalesced_sends() > coalesced_before);
        assert_eq!(stored(&client, "fresh").await, 128);
    });
}
