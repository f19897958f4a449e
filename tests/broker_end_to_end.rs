//! The broker binary end to end, on loopback with ephemeral ports and temp data dirs:
//! many producers and shards, long polling, restarts (clean and SIGKILL), a client that is
//! not shard aware, and bad input.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::broker::BrokerProcess;
use ringmq::client::{Client, ClientConfig, OutgoingMessage, Producer, PullStatus};
use ringmq::protocol::{
    encode_request, ErrorCode, FrameDecoder, FrameLimits, Handshake, Heartbeat, Request, Response,
};

fn config(addr: &str, shard_aware: bool) -> ClientConfig {
    let mut c = ClientConfig::new(addr.to_owned());
    c.shard_aware = shard_aware;
    c.request_timeout_ms = 10_000;
    c
}

/// Pulls every message of every queue from offset 0 to the end.
async fn drain(
    client: &Client,
    topic: &str,
    queues: u32,
) -> HashMap<u32, Vec<ringmq::client::Message>> {
    let mut out = HashMap::new();
    for q in 0..queues {
        let mut offset = 0;
        let mut got = Vec::new();
        loop {
            let r = client
                .pull(topic, q, offset, 32, Duration::ZERO, &[])
                .await
                .unwrap();
            if r.messages.is_empty() {
                assert_eq!(r.next_offset, r.max_offset, "queue {q} drained");
                break;
            }
            offset = r.next_offset;
            got.extend(r.messages);
        }
        out.insert(q, got);
    }
    out
}

/// 4 producers, 8 queues, `shards` shards, 100,000 messages with 400 sharding keys: every
/// message is pulled exactly once, per queue in offset order, per key in send order.
async fn many_producers(shards: usize, shard_aware: bool) {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), shards, &[]);
    let addr = broker.addr_string();
    let topic = "load";
    let admin = Client::connect(config(&addr, true)).await.unwrap();
    admin.create_topic(topic, 8).await.unwrap();
    const PRODUCERS: u64 = 4;
    const TASKS: u64 = 25;
    const PER_TASK: u64 = 1000;
    let mut handles = Vec::new();
    for p in 0..PRODUCERS {
        let producer = Producer::connect(config(&addr, shard_aware)).await.unwrap();
        for t in 0..TASKS {
            let producer = producer.clone();
            handles.push(tokio::spawn(async move {
                // Each task owns 4 keys and sends each key's sequence in order.
                for i in 0..PER_TASK {
                    let key = format!("key-{p}-{t}-{}", i % 4);
                    let seq = i / 4;
                    let body = format!("{p}/{t}/{i}/{seq}");
                    let m = OutgoingMessage::new(body)
                        .with_sharding_key(key.clone())
                        .with_property("seq", seq.to_string());
                    producer.send(topic, m).await.unwrap();
                }
            }));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    let total = (PRODUCERS * TASKS * PER_TASK) as usize;
    let reader = Client::connect(config(&addr, shard_aware)).await.unwrap();
    let all = drain(&reader, topic, 8).await;
    let mut seen = std::collections::HashSet::new();
    let mut last_seq: HashMap<String, u64> = HashMap::new();
    let mut key_queue: HashMap<String, u32> = HashMap::new();
    let mut count = 0;
    for (q, msgs) in &all {
        for (i, m) in msgs.iter().enumerate() {
            assert_eq!(m.queue_offset(), i as u64, "queue {q} dense and in order");
            assert_eq!(m.queue_id(), *q);
            let body = String::from_utf8(m.body().to_vec()).unwrap();
            assert!(seen.insert(body.clone()), "duplicate {body}");
            let parts: Vec<&str> = body.split('/').collect();
            let key = format!(
                "key-{}-{}-{}",
                parts[0],
                parts[1],
                parts[2].parse::<u64>().unwrap() % 4
            );
            let seq: u64 = parts[3].parse().unwrap();
            assert_eq!(
                *key_queue.entry(key.clone()).or_insert(*q),
                *q,
                "a key stays in one queue"
            );
            if let Some(prev) = last_seq.insert(key.clone(), seq) {
                assert_eq!(seq, prev + 1, "key {key} in send order");
            } else {
                assert_eq!(seq, 0);
            }
            count += 1;
        }
    }
    assert_eq!(count, total, "every message exactly once");
    assert!(
        all.values().filter(|v| !v.is_empty()).count() >= 6,
        "keys spread over the queues"
    );
    drop(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_producers_two_shards_every_message_once_in_order() {
    many_producers(2, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_producers_three_shards_through_forwarding() {
    // Three shards on two cores, and clients that are not shard aware: every request that
    // reaches a non-owner is forwarded.
    many_producers(3, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polling_answers_when_a_message_lands() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    let client = Client::connect(config(&addr, true)).await.unwrap();
    client.create_topic("lp", 2).await.unwrap();
    // An empty pull with a short wait returns empty.
    let started = Instant::now();
    let r = client
        .pull("lp", 1, 0, 32, Duration::from_millis(200), &[])
        .await
        .unwrap();
    assert_eq!(r.status, PullStatus::NoNewMessage);
    assert!(r.messages.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(150), "it waited");
    // A waiting pull receives a message sent after it started.
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let r = client
                .pull("lp", 1, 0, 32, Duration::from_secs(20), &[])
                .await
                .unwrap();
            (r, started.elapsed())
        })
    };
    // Give the pull time to reach the broker and wait there. If it came later it would
    // find the message at once and the assertions below would still hold; the pause only
    // makes the long-polling path the one that is exercised.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let producer = Producer::from_client(client.clone(), Default::default());
    let sent = loop {
        // Round-robin sends until one lands on queue 1.
        let r = producer
            .send("lp", OutgoingMessage::new("wake up"))
            .await
            .unwrap();
        if r.queue_id == 1 {
            break r;
        }
    };
    let (r, waited) = waiter.await.unwrap();
    assert_eq!(r.status, PullStatus::Found);
    assert_eq!(r.messages[0].body(), b"wake up");
    assert_eq!(r.messages[0].queue_offset(), sent.queue_offset);
    assert!(
        waited < Duration::from_secs(10),
        "answered when the message landed, not at the deadline"
    );
    drop(broker);
}

/// Sends `n` messages with keys and commits offsets; returns (queue, offset, body) acked.
async fn produce_and_commit(addr: &str, topic: &str, n: usize) -> Vec<(u32, u64, Vec<u8>)> {
    let producer = Producer::connect(config(addr, true)).await.unwrap();
    let mut acked = Vec::new();
    for i in 0..n {
        let body = format!("durable-{i}").into_bytes();
        let r = producer
            .send(
                topic,
                OutgoingMessage::new(body.clone()).with_key(format!("k{i}")),
            )
            .await
            .unwrap();
        acked.push((r.queue_id, r.queue_offset, body));
    }
    for q in 0..4 {
        producer
            .client()
            .commit_offset("g1", topic, q, 3 + q as u64)
            .await
            .unwrap();
    }
    acked
}

/// Every acknowledged (queue, offset, body) of `topic`'s 4 queues is there, nothing else.
async fn check_acknowledged(client: &Client, topic: &str, acked: &[(u32, u64, Vec<u8>)]) {
    let all = drain(client, topic, 4).await;
    for (q, off, body) in acked {
        let m = &all[q][*off as usize];
        assert_eq!(m.body(), &body[..], "acknowledged message {q}:{off}");
    }
    let total: usize = all.values().map(Vec::len).sum();
    assert_eq!(total, acked.len(), "nothing invented");
}

async fn check_after_restart(addr: &str, topic: &str, acked: &[(u32, u64, Vec<u8>)]) {
    let client = Client::connect(config(addr, true)).await.unwrap();
    check_acknowledged(&client, topic, acked).await;
    for q in 0..4u32 {
        assert_eq!(
            client.query_offset("g1", topic, q).await.unwrap(),
            Some(3 + q as u64)
        );
    }
    assert_eq!(client.describe_topic(topic).await.unwrap().queues.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_clean_and_after_sigkill_keeps_acknowledged_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start(&dir.path().join("data"), 2, &["--flush", "sync"]);
    let addr = broker.addr_string();
    Client::connect(config(&addr, true))
        .await
        .unwrap()
        .create_topic("dur", 4)
        .await
        .unwrap();
    let mut acked = produce_and_commit(&addr, "dur", 300).await;
    assert!(broker.stop(), "clean stop exits 0");
    broker.restart();
    check_after_restart(&broker.addr_string(), "dur", &acked).await;
    // More, then SIGKILL: in sync mode every acknowledged message and offset survives.
    let addr = broker.addr_string();
    let producer = Producer::connect(config(&addr, true)).await.unwrap();
    for i in 0..300 {
        let body = format!("after-{i}").into_bytes();
        let r = producer
            .send("dur", OutgoingMessage::new(body.clone()))
            .await
            .unwrap();
        acked.push((r.queue_id, r.queue_offset, body));
    }
    for q in 0..4 {
        producer
            .client()
            .commit_offset("g1", "dur", q, 3 + q as u64)
            .await
            .unwrap();
    }
    broker.kill();
    broker.restart();
    check_after_restart(&broker.addr_string(), "dur", &acked).await;
    // Committed offsets never go backwards.
    let client = Client::connect(config(&broker.addr_string(), true))
        .await
        .unwrap();
    client.commit_offset("g1", "dur", 0, 1).await.unwrap();
    assert_eq!(client.query_offset("g1", "dur", 0).await.unwrap(), Some(3));
}

/// A shard that panics (here on purpose: the hidden `--testing-panic-topic`) must not leave
/// a broker that looks alive while that shard's connections are refused: the other shards
/// stop cleanly, the process exits with status 1 and says on stdout which shard died and
/// where it panicked, and after a restart every acknowledged message is there, in order,
/// nothing else (async flush: acknowledged means written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_panics_stops_the_broker_which_says_why_and_keeps_acknowledged_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--testing-panic-topic", "boom"],
    );
    let addr = broker.addr_string();
    let client = Client::connect(config(&addr, true)).await.unwrap();
    client.create_topic("kept", 4).await.unwrap();
    let producer = Producer::connect(config(&addr, true)).await.unwrap();
    let mut acked = Vec::new();
    for i in 0..200 {
        let body = format!("kept-{i}").into_bytes();
        let r = producer
            .send("kept", OutgoingMessage::new(body.clone()))
            .await
            .unwrap();
        acked.push((r.queue_id, r.queue_offset, body));
    }
    let panicking = Client::connect(config(&addr, false)).await.unwrap();
    assert!(
        panicking.create_topic("boom", 1).await.is_err(),
        "the shard asked died before it answered"
    );
    let status = tokio::task::block_in_place(|| broker.wait_exit(Duration::from_secs(60)));
    let out = broker.stdout();
    let status = status.unwrap_or_else(|| panic!("the broker kept running; stdout:\n{out}"));
    assert_eq!(status.code(), Some(1), "stdout:\n{out}");
    assert!(
        out.contains("panicked at") && out.contains("--testing-panic-topic, shard"),
        "the panic's place and message on stdout:\n{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("died (panicked: testing: topic boom")
                && l.contains("the broker stopped")),
        "why the broker stopped, on stdout:\n{out}"
    );
    broker.restart();
    let client = Client::connect(config(&broker.addr_string(), true))
        .await
        .unwrap();
    check_acknowledged(&client, "kept", &acked).await;
    assert!(
        client.describe_topic("boom").await.is_err(),
        "the topic whose creation panicked was not created"
    );
}

fn raw_request(req: &Request, id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(req, id, &mut out).unwrap();
    out
}

/// Reads one frame (or None on close/timeout).
fn read_frame(stream: &mut TcpStream) -> Option<Vec<u8>> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let decoder = FrameDecoder::new(FrameLimits::default());
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some(f)) = decoder.decode(&buf) {
            return Some(buf[..f.frame_len()].to_vec());
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn error_code_of(frame: &[u8]) -> Option<u16> {
    let decoder = FrameDecoder::new(FrameLimits::default());
    let f = decoder.decode(frame).ok()??;
    match f.decode_response().ok()? {
        Response::Error(e) => Some(e.code),
        _ => None,
    }
}

/// A bad connection gets an error frame and/or a close; the broker goes on serving.
fn check_bad_input(addr: &str, bytes: &[u8], expect_close: bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    let _ = s.write_all(bytes);
    if expect_close {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut answered = Vec::new();
    while let Some(f) = read_frame(&mut s) {
        answered.push(f);
    }
    for f in &answered {
        assert!(error_code_of(f).is_some(), "only error frames come back");
    }
    // Another client is served normally.
    let mut ok = TcpStream::connect(addr).unwrap();
    ok.write_all(&raw_request(
        &Request::Heartbeat(Heartbeat {
            client_id: "second".into(),
        }),
        7,
    ))
    .unwrap();
    let f = read_frame(&mut ok).expect("the broker still answers");
    assert_eq!(error_code_of(&f), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_errors_and_never_harms_others() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--auto-create-topics", "false"],
    );
    let addr = broker.addr_string();
    let client = Client::connect(config(&addr, true)).await.unwrap();
    client.create_topic("ok", 2).await.unwrap();
    let sent = Producer::from_client(client.clone(), Default::default())
        .send("ok", OutgoingMessage::new("kept"))
        .await
        .unwrap();
    let a = addr.clone();
    tokio::task::spawn_blocking(move || {
        // Random bytes.
        let mut junk = vec![0u8; 4096];
        for (i, b) in junk.iter_mut().enumerate() {
            *b = (i * 7919 % 251) as u8;
        }
        check_bad_input(&a, &junk, false);
        // A huge length.
        let mut huge = raw_request(&Request::Handshake(Handshake::new("x")), 1);
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        check_bad_input(&a, &huge, false);
        // A truncated frame, then the client closes.
        let full = raw_request(&Request::Handshake(Handshake::new("x")), 1);
        check_bad_input(&a, &full[..full.len() - 3], true);
        // An unknown request kind.
        let mut unknown = raw_request(
            &Request::Heartbeat(Heartbeat {
                client_id: "u".into(),
            }),
            2,
        );
        unknown[6..8].copy_from_slice(&999u16.to_le_bytes());
        check_bad_input(&a, &unknown, false);
    })
    .await
    .unwrap();
    // An unknown topic with auto-create off gets its typed error.
    let producer = Producer::from_client(client.clone(), Default::default());
    let err = producer
        .send("nosuchtopic", OutgoingMessage::new("x"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::TopicNotFound), "{err}");
    // A body over 4 MiB is refused (by the client before sending; the broker too).
    let big = vec![0u8; 4 * 1024 * 1024 + 1];
    assert!(producer
        .send("ok", OutgoingMessage::new(big.clone()))
        .await
        .is_err());
    let raw = Request::SendMessage(common::raw::send_to("ok", 0, big));
    let a = addr.clone();
    let code = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(&a).unwrap();
        s.write_all(&raw_request(&raw, 9)).unwrap();
        read_frame(&mut s).and_then(|f| error_code_of(&f))
    })
    .await
    .unwrap();
    assert_eq!(code, Some(ErrorCode::BodyTooLarge as u16));
    // Offsets out of range: typed statuses.
    let r = client
        .pull("ok", sent.queue_id, 1000, 32, Duration::ZERO, &[])
        .await
        .unwrap();
    assert_eq!(r.status, PullStatus::OffsetTooBig);
    // Nothing stored was harmed.
    let r = client
        .pull(
            "ok",
            sent.queue_id,
            sent.queue_offset,
            32,
            Duration::ZERO,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.messages[0].body(), b"kept");
    drop(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_topic_stays_deleted_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    let client = Client::connect(config(&addr, true)).await.unwrap();
    client.create_topic("gone", 2).await.unwrap();
    let producer = Producer::from_client(client.clone(), Default::default());
    for i in 0..50 {
        producer
            .send("gone", OutgoingMessage::new(format!("old-{i}")))
            .await
            .unwrap();
    }
    client.delete_topic("gone").await.unwrap();
    client.create_topic("gone", 2).await.unwrap();
    for i in 0..3 {
        producer
            .send("gone", OutgoingMessage::new(format!("new-{i}")))
            .await
            .unwrap();
    }
    // Crash. Acknowledged writes are in the file (O_DIRECT) even before the background
    // fdatasync, so a process kill loses none of them.
    broker.kill();
    broker.restart();
    let client = Client::connect(config(&broker.addr_string(), true))
        .await
        .unwrap();
    let all = drain(&client, "gone", 2).await;
    let bodies: Vec<String> = all
        .values()
        .flatten()
        .map(|m| String::from_utf8_lossy(m.body()).into_owned())
        .collect();
    assert!(
        bodies.iter().all(|b| b.starts_with("new-")),
        "deleted messages came back: {bodies:?}"
    );
    assert_eq!(bodies.len(), 3);
}

/// A position past a queue's end within one run of the broker (a consumer that followed a
/// topic deleted and created again) is sent back to the queue's start, not to its end: the
/// new topic's messages below that position are delivered, not skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_past_the_end_of_a_topic_created_again_goes_back_to_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let client = Client::connect(config(&broker.addr_string(), true))
        .await
        .unwrap();
    client.create_topic("again", 1).await.unwrap();
    let producer = Producer::from_client(client.clone(), Default::default());
    let send = |body: String| producer.send("again", OutgoingMessage::new(body));
    for i in 0..50 {
        send(format!("old-{i}")).await.unwrap();
    }
    let old = client
        .pull("again", 0, 0, 64, Duration::ZERO, &[])
        .await
        .unwrap();
    assert_eq!(old.next_offset, 50);
    client.delete_topic("again").await.unwrap();
    client.create_topic("again", 1).await.unwrap();
    for i in 0..3 {
        send(format!("new-{i}")).await.unwrap();
    }
    // The position names the run it was read under, as a consumer's does.
    let stale = client
        .pull_with(
            "again",
            0,
            old.next_offset,
            64,
            Duration::ZERO,
            &[],
            "",
            old.incarnation,
        )
        .await
        .unwrap();
    assert_eq!(
        (stale.status, stale.next_offset, stale.max_offset),
        (PullStatus::OffsetTooBig, 0, 3)
    );
    // A position named by no run (given by hand) goes to the end, as before.
    let unnamed = client
        .pull("again", 0, old.next_offset, 64, Duration::ZERO, &[])
        .await
        .unwrap();
    assert_eq!(
        (unnamed.status, unnamed.next_offset),
        (PullStatus::OffsetTooBig, 3)
    );
    let new = client
        .pull("again", 0, stale.next_offset, 64, Duration::ZERO, &[])
        .await
        .unwrap();
    let bodies: Vec<&[u8]> = new.messages.iter().map(|m| m.body()).collect();
    assert_eq!(bodies, [&b"new-0"[..], b"new-1", b"new-2"]);
}

/// A body can hold the bytes of a whole, valid record, placed so that the physical offset
/// inside it names the body's own place in the log. Read by that offset it would be a
/// message with a topic and properties the sender chose (here a topic it never sent to);
/// neither a lookup by id nor a send-back takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_forged_inside_a_body_is_not_a_message() {
    use ringmq::protocol::record::{Placement, RecordDraft, HEADER_BYTES};
    use ringmq::protocol::MessageId;

    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let producer = Producer::connect(config(&broker.addr_string(), true))
        .await
        .unwrap();
    let client = producer.client().clone();
    client.create_topic("forge", 1).await.unwrap();
    client.create_topic("victim", 1).await.unwrap();
    let forged = |physical_offset| {
        RecordDraft::plain("victim", 0, &[], b"not sent to victim").encode(Placement {
            queue_offset: 0,
            physical_offset,
            store_timestamp_ms: 0,
        })
    };
    let size = forged(0).len();
    // Records of a body this size are `stride` apart; the forging one comes next.
    let mut offsets = Vec::new();
    for _ in 0..3 {
        let r = producer
            .send("forge", OutgoingMessage::new(vec![0u8; size]))
            .await
            .unwrap();
        offsets.push(r.physical_offset);
    }
    let stride = offsets[1] - offsets[0];
    assert_eq!(
        offsets[2] - offsets[1],
        stride,
        "records of one size: {offsets:?}"
    );
    let at = offsets[2] + stride;
    let inside = at + stride - size as u64;
    let body = forged(inside);
    let sent = producer
        .send("forge", OutgoingMessage::new(body.clone()))
        .await
        .unwrap();
    assert_eq!(
        sent.physical_offset, at,
        "the forging record's place was predicted"
    );
    let real = client.message_by_id(&sent.msg_id).await.unwrap().unwrap();
    assert_eq!(real.body(), &body[..]);
    assert_eq!(real.topic(), "forge");

    let id = MessageId::parse(&sent.msg_id).unwrap();
    let id_at = |physical_offset| {
        MessageId {
            physical_offset,
            ..id
        }
        .encode()
    };
    let no_message_at = |msg_id: String| {
        let client = client.clone();
        async move {
            match client.message_by_id(&msg_id).await {
                Ok(None) => {}
                Err(e) => assert_eq!(e.code(), Some(ErrorCode::OffsetNotFound), "{e}"),
                Ok(Some(m)) => panic!("a forged record read as a message of {}", m.topic()),
            }
        }
    };
    let forged_id = id_at(inside);
    no_message_at(forged_id.clone()).await;
    let err = client.send_back("g", &forged_id, 0, 16).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::OffsetNotFound), "{err}");
    // One whose CRC does not match reads as no message either, not as a damaged store.
    let at = at + stride;
    let mut body = forged(at + stride - size as u64);
    *body.last_mut().unwrap() ^= 1;
    let sent_bad = producer
        .send("forge", OutgoingMessage::new(body))
        .await
        .unwrap();
    assert_eq!(sent_bad.physical_offset, at);
    no_message_at(id_at(at + stride - size as u64)).await;
    // A header at the log's end naming a topic longer than what follows: no message either
    // (reading its topic would pass the end of the log).
    let long_topic = "t".repeat(127);
    let head = RecordDraft::plain(&long_topic, 0, &[], b"").encode(Placement {
        queue_offset: 0,
        physical_offset: 0,
        store_timestamp_ms: 0,
    });
    let mut tail_body = vec![0u8; 64];
    tail_body.extend_from_slice(&head[..HEADER_BYTES]);
    let first = producer
        .send("forge", OutgoingMessage::new(tail_body.clone()))
        .await
        .unwrap();
    let last = producer
        .send("forge", OutgoingMessage::new(tail_body))
        .await
        .unwrap();
    let len = last.physical_offset - first.physical_offset;
    no_message_at(id_at(last.physical_offset + len - HEADER_BYTES as u64)).await;
    // The real one is still sent back, and nothing reached the forged topic.
    client.send_back("g", &sent.msg_id, 0, 16).await.unwrap();
    assert_eq!(client.max_offset("victim", 0).await.unwrap(), 0);
    assert!(!broker.stderr().contains("panicked"), "{}", broker.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_ids_and_names_get_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let client = Client::connect(config(&broker.addr_string(), true))
        .await
        .unwrap();
    client.create_topic("t", 2).await.unwrap();
    // A message id whose physical offset would overflow.
    let id = ringmq::protocol::MessageId {
        broker_id: 0,
        store_id: 1,
        physical_offset: u64::MAX - 10,
    };
    let r = client.message_by_id(&id.to_string()).await;
    assert!(r.is_err() || r.as_ref().unwrap().is_none(), "{r:?}");
    // A group name over the limit; the answer does not echo all of it.
    let long = "g".repeat(70_000);
    let err = client.commit_offset(&long, "t", 0, 1).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidMessage));
    assert!(
        err.to_string().len() < 400,
        "{} bytes",
        err.to_string().len()
    );
    // An offset past the queue's end is refused by the broker.
    let err = client.commit_offset("g", "t", 0, 5).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::OffsetTooBig), "{err}");
    // The broker still serves.
    client.commit_offset("g", "t", 0, 0).await.unwrap();
    assert_eq!(client.query_offset("g", "t", 0).await.unwrap(), Some(0));
    assert!(!broker.stderr().contains("panicked"), "{}", broker.stderr());
}
