//! Producer tests against the fake broker (see the parent module): routing to the queue's
//! owner, sharding keys and selectors, unknown topics and their queue-count look-ups.

use super::*;

#[tokio::test]
async fn shard_aware_requests_go_to_the_queue_owner() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 16),
        Request::SendMessage(m) => vec![Out::Frame(answer(id, &send_result(m.queue_id as u32, 0)))],
        Request::GetMaxOffset(_) => vec![Out::Frame(answer(
            id,
            &Response::Offset(Offset {
                offset: 3,
                incarnation: 1,
            }),
        ))],
        Request::ListTopics(_) => vec![Out::Frame(answer(
            id,
            &Response::TopicList(crate::protocol::TopicList {
                topics: vec!["t".into()],
            }),
        ))],
        _ => Vec::new(),
    });
    let fake = Fake::start(3, handler).await;
    let producer = Producer::connect(fake.config()).await.unwrap();
    for _ in 0..32 {
        producer
            .send("orders", OutgoingMessage::new("x"))
            .await
            .unwrap();
    }
    for queue in 0..16 {
        assert_eq!(
            producer.client().max_offset("orders", queue).await.unwrap(),
            3
        );
    }
    assert_eq!(producer.client().list_topics().await.unwrap(), vec!["t"]);
    let mut shards_used = [false; 3];
    for (shard, request) in fake.requests() {
        let expected = match &request {
            Request::SendMessage(m) => owner("orders", m.queue_id as u32, 3),
            Request::GetMaxOffset(g) => owner("orders", g.queue_id, 3),
            // Requests without a queue use the bootstrap connection (shard 0 here).
            _ => 0,
        };
        assert_eq!(shard, expected, "{request:?}");
        shards_used[shard as usize] = true;
    }
    assert_eq!(shards_used, [true; 3]);

    // Not shard aware: everything goes through the bootstrap connection.
    let mut config = fake.config();
    config.shard_aware = false;
    let before = fake.requests().len();
    let producer = Producer::connect(config).await.unwrap();
    for _ in 0..8 {
        producer
            .send("orders", OutgoingMessage::new("x"))
            .await
            .unwrap();
    }
    assert!(fake.requests()[before..]
        .iter()
        .all(|(shard, _)| *shard == 0));
}

#[tokio::test]
async fn sharding_keys_pin_a_queue_and_round_robin_visits_all() {
    let fake = Fake::start(2, simple_handler(8)).await;
    let producer = Producer::connect(fake.config()).await.unwrap();
    for _ in 0..10 {
        let m = OutgoingMessage::new("x").with_sharding_key("order-42");
        producer.send("t", m).await.unwrap();
    }
    let keyed: Vec<i32> = fake.sends().into_iter().map(|(_, q)| q).collect();
    assert!(keyed.iter().all(|q| *q == keyed[0]), "{keyed:?}");
    assert_eq!(keyed[0] as u32, route::queue_for_key("order-42", 8));
    for _ in 0..8 {
        producer.send("t", OutgoingMessage::new("x")).await.unwrap();
    }
    let mut round_robin: Vec<i32> = fake.sends()[10..].iter().map(|(_, q)| *q).collect();
    round_robin.sort_unstable();
    assert_eq!(round_robin, (0..8).collect::<Vec<_>>());
}

struct FixedQueue(u32);

impl QueueSelector for FixedQueue {
    fn select(&self, _: &str, message: &OutgoingMessage, _: u32, _: u32) -> u32 {
        // The selector sees the whole message, body included.
        assert_eq!(message.body, b"seen");
        self.0
    }
}

#[tokio::test]
async fn a_custom_selector_decides_and_oneway_needs_no_answer() {
    let fake = Fake::start(1, simple_handler(8)).await;
    let options = ProducerOptions {
        selector: Some(Arc::new(FixedQueue(13))),
        ..ProducerOptions::default()
    };
    let producer = Producer::connect_with(fake.config(), options)
        .await
        .unwrap();
    let result = producer
        .send("t", OutgoingMessage::new("seen"))
        .await
        .unwrap();
    assert_eq!(result.queue_id, 13 % 8);
    producer
        .send_oneway("t", OutgoingMessage::new("seen"))
        .await
        .unwrap();
    // Wait for the oneway frame to arrive: an answered request behind it on the same
    // connection proves it was written.
    producer
        .send("t", OutgoingMessage::new("seen"))
        .await
        .unwrap();
    assert_eq!(fake.sends().len(), 3);
}

/// Answers the first `DescribeTopic` with `first` (given the request id and topic), the
/// later ones with 4 queues, and every send with its queue; counts the `DescribeTopic`s.
fn described_after_first(
    described: &Arc<AtomicUsize>,
    first: fn(u64, &str) -> Vec<Out>,
) -> Handler {
    let seen = described.clone();
    Arc::new(move |_ctx, id, request| match request {
        Request::DescribeTopic(d) if seen.fetch_add(1, Ordering::SeqCst) == 0 => {
            first(id, &d.topic)
        }
        Request::DescribeTopic(d) => super::described(id, &d.topic, 4),
        Request::SendMessage(m) => vec![Out::Frame(answer(
            id,
            &send_result(m.queue_id.max(0) as u32, 0),
        ))],
        _ => Vec::new(),
    })
}

#[tokio::test]
async fn an_unknown_topic_is_sent_to_any_queue_then_described() {
    let described = Arc::new(AtomicUsize::new(0));
    let handler = described_after_first(&described, |id, topic| {
        vec![Out::Frame(error(id, ErrorCode::TopicNotFound, topic))]
    });
    let fake = Fake::start(1, handler).await;
    let producer = Producer::connect(fake.config()).await.unwrap();
    producer
        .send("new", OutgoingMessage::new("1"))
        .await
        .unwrap();
    producer
        .send("new", OutgoingMessage::new("2"))
        .await
        .unwrap();
    let queues: Vec<i32> = fake.sends().into_iter().map(|(_, q)| q).collect();
    assert_eq!(queues[0], crate::protocol::QUEUE_ID_ANY);
    assert!((0..4).contains(&queues[1]), "{queues:?}");
    assert_eq!(described.load(Ordering::SeqCst), 2);
}

/// A coalesced send whose topic's queue count must be looked up, the look-up timing out
/// once: the send goes alone, with its retries (which look the count up again), as a send
/// without coalescing would; it failed at once.
#[tokio::test]
async fn a_coalesced_sends_look_up_that_times_out_is_retried() {
    let described = Arc::new(AtomicUsize::new(0));
    // The first one is never answered.
    let handler = described_after_first(&described, |_, _| Vec::new());
    let fake = Fake::start(1, handler).await;
    let mut config = fake.config();
    config.request_timeout_ms = 200;
    let options = ProducerOptions {
        coalesce: true,
        ..Default::default()
    };
    let producer = Producer::connect_with(config, options).await.unwrap();
    producer
        .send("slow", OutgoingMessage::new("1"))
        .await
        .unwrap();
    assert_eq!(described.load(Ordering::SeqCst), 2);
    let queues: Vec<i32> = fake.sends().into_iter().map(|(_, q)| q).collect();
    assert_eq!(queues.len(), 1);
    assert!((0..4).contains(&queues[0]), "{queues:?}");
}

/// A half message whose send broke off (it may be stored) is not sent again: the broker
/// asks the checker about the one it may hold, and a second copy would leave two halves of
/// one transaction for the checker to commit. The local transaction does not run.
#[tokio::test]
async fn a_half_message_whose_send_broke_off_is_not_sent_again() {
    let handler: Handler = Arc::new(|ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        // The shard's first connection breaks at the half's send; later ones answer.
        Request::SendMessage(_) if ctx.conn_no == 1 => vec![Out::Close],
        Request::SendMessage(m) => vec![Out::Frame(answer(id, &send_result(m.queue_id as u32, 5)))],
        _ => vec![empty_answer(id)],
    });
    let fake = Fake::start(1, handler).await;
    let tp = TransactionProducer::start(fake.config(), "txg", |_| TransactionOutcome::Rollback)
        .await
        .unwrap();
    let ran = std::sync::atomic::AtomicBool::new(false);
    let sent = tp
        .send_in_transaction("t", OutgoingMessage::new("a"), |_| {
            ran.store(true, Ordering::SeqCst);
            TransactionOutcome::Commit
        })
        .await;
    assert!(matches!(sent, Err(ClientError::Connection(_))), "{sent:?}");
    assert!(!ran.load(Ordering::SeqCst), "the local transaction ran");
    let sends = fake.sends();
    assert_eq!(sends.len(), 1, "{sends:?}");
}

/// A batch answered with fewer (or more) places than it had messages is a protocol error,
/// not a result whose message ids would be made from the wrong places; the answer that fits
/// is taken.
#[tokio::test]
async fn a_batch_answer_with_a_place_per_message_is_taken_and_another_refused() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        Request::SendBatch(b) => {
            let n = b.messages.len() as u64;
            // Batches of three are answered one place short.
            let places = if n == 3 { n - 1 } else { n };
            let result = crate::protocol::SendBatchResult {
                queue_id: 0,
                first_queue_offset: 0,
                count: n as u32,
                broker_id: 7,
                store_id: 0,
                physical_offsets: (0..places).map(|i| i * 100).collect(),
            };
            vec![Out::Frame(answer(id, &Response::SendBatchResult(result)))]
        }
        _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
    });
    let fake = Fake::start(1, handler).await;
    let producer = Producer::connect_with(fake.config(), no_retries())
        .await
        .unwrap();
    let batch = |n: usize| {
        (0..n)
            .map(|i| OutgoingMessage::new(i.to_string()))
            .collect()
    };
    let taken = producer.send_batch("t", batch(2)).await.unwrap();
    assert_eq!(taken.physical_offsets, [0, 100]);
    match producer.send_batch("t", batch(3)).await {
        Err(ClientError::Protocol(crate::protocol::ProtocolError::BadPayload {
            reason, ..
        })) => {
            assert!(reason.contains("3 messages at 2 places"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

/// A packed request (`coalesce`) the broker refuses for what one message is sends each of
/// its messages again alone, except those whose caller gave up meanwhile: sent again, they
/// would be stored with nobody told.
#[tokio::test]
async fn a_refused_packed_sends_messages_go_again_alone_except_those_given_up() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        // The first send stays in flight a while, so the next ones are packed behind it.
        Request::SendMessage(m) if m.body == b"s0" => vec![Out::Later(
            Duration::from_millis(300),
            answer(id, &send_result(0, 0)),
        )],
        Request::SendMessage(_) => vec![Out::Frame(answer(id, &send_result(0, 1)))],
        // Long enough for s2 to give up first on a loaded machine.
        Request::SendMulti(_) => vec![Out::Later(
            Duration::from_millis(1_500),
            error(id, ErrorCode::InvalidMessage, "one of them is refused"),
        )],
        _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
    });
    let fake = Fake::start(1, handler).await;
    let options = ProducerOptions {
        coalesce: true,
        ..no_retries()
    };
    let producer = Producer::connect_with(fake.config(), options)
        .await
        .unwrap();
    // The topic's queue count is cached first, so every send below is decided at once.
    producer.client().describe_topic("t").await.unwrap();
    let send = |body: &str| producer.send_async("t", OutgoingMessage::new(body.to_owned()));
    let s0 = tokio::spawn(send("s0"));
    // s0 is on its way before the others are made.
    fake.received_send(b"s0").await;
    let (s1, s3) = (tokio::spawn(send("s1")), tokio::spawn(send("s3")));
    // Given up while the packed request is in flight (sent at about 300 ms, answered at
    // about 1.8 s).
    let s2 = tokio::time::timeout(Duration::from_millis(450), send("s2"));
    assert!(s2.await.is_err(), "s2 was answered before it was given up");
    for s in [s0, s1, s3] {
        s.await.unwrap().unwrap();
    }
    let alone: Vec<Vec<u8>> = (fake.requests().into_iter())
        .filter_map(|(_, r)| match r {
            Request::SendMessage(m) => Some(m.body),
            _ => None,
        })
        .collect();
    assert_eq!(alone, [&b"s0"[..], b"s1", b"s3"]);
    let packed = (fake.requests().into_iter())
        .filter(|(_, r)| matches!(r, Request::SendMulti(_)))
        .count();
    assert_eq!(packed, 1, "s1, s2 and s3 went packed first");
}

/// A send whose first attempt got no answer (it may be stored) never ends with an error
/// that says nothing was stored: refused busy after it (flow control, waited out for a
/// request timeout from the first busy answer), it ends `Timeout`.
#[tokio::test]
async fn a_send_that_may_be_stored_does_not_end_with_a_refusal() {
    let sends = Arc::new(AtomicUsize::new(0));
    let seen = sends.clone();
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        // The first is never answered; the later ones are refused busy.
        Request::SendMessage(_) if seen.fetch_add(1, Ordering::SeqCst) == 0 => Vec::new(),
        Request::SendMessage(_) => vec![Out::Frame(error(id, ErrorCode::BrokerBusy, "busy"))],
        _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
    });
    let fake = Fake::start(1, handler).await;
    let mut config = fake.config();
    config.request_timeout_ms = 200;
    let producer = Producer::connect_with(config, ProducerOptions::default())
        .await
        .unwrap();
    let sent = producer.send("t", OutgoingMessage::new("a")).await;
    assert!(matches!(sent, Err(ClientError::Timeout { .. })), "{sent:?}");
    assert!(
        sends.load(Ordering::SeqCst) >= 3,
        "the busy broker was waited out"
    );
}

/// A frame from the broker that cannot be read breaks the connection: every request
/// waiting on it fails with the retriable `Connection` (a send in flight may be stored),
/// as the connection's doc says. Before, it was `Protocol`, which a producer took for a
/// refusal that stored nothing.
#[tokio::test]
async fn an_unreadable_frame_fails_the_requests_waiting_as_a_broken_connection() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        Request::SendMessage(_) => vec![Out::Frame(vec![0xAB; 64])],
        _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
    });
    let fake = Fake::start(1, handler).await;
    let producer = Producer::connect_with(fake.config(), no_retries())
        .await
        .unwrap();
    match producer.send("t", OutgoingMessage::new("a")).await {
        Err(ClientError::Connection(m)) => assert!(m.contains("cannot be read"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// A coalesced send's leader (its request runs on a task of its own) whose caller gave up
/// writes no new attempt: no resend after a busy pause. Before, it went on for its whole
/// request timeout, and a message its caller sent again could be stored twice.
#[tokio::test]
async fn a_coalesced_send_given_up_by_its_caller_is_not_sent_again() {
    let sends = Arc::new(AtomicUsize::new(0));
    let seen = sends.clone();
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        Request::SendMessage(_) => {
            seen.fetch_add(1, Ordering::SeqCst);
            vec![Out::Frame(error(id, ErrorCode::BrokerBusy, "busy"))]
        }
        _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
    });
    let fake = Fake::start(1, handler).await;
    let mut config = fake.config();
    config.request_timeout_ms = 10_000;
    let options = ProducerOptions {
        coalesce: true,
        ..Default::default()
    };
    let producer = Producer::connect_with(config, options).await.unwrap();
    let send = producer.send("t", OutgoingMessage::new("a"));
    let given_up = tokio::time::timeout(Duration::from_millis(300), send).await;
    assert!(given_up.is_err(), "{given_up:?}");
    let at_give_up = sends.load(Ordering::SeqCst);
    assert!(
        at_give_up >= 3,
        "{at_give_up} sends: the busy broker was waited out"
    );
    // An observation window, not a wait for a condition: the busy pauses (200 ms at most)
    // would have had it sent again several times within it.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let after = sends.load(Ordering::SeqCst);
    assert!(after <= at_give_up + 1, "{at_give_up} sends, then {after}");
}

/// The broker's own call to the queue's shard timed out (`Timeout` answered: the shard may
/// still store it), or its write failed after the append (`StoreUnsure`: the record may
/// be stored): a later attempt's refusal that says nothing was stored does not end the
/// send; the first answer does. Before, only the client's own timeouts counted, then
/// `Timeout` too.
#[tokio::test]
async fn a_send_the_broker_timed_out_on_does_not_end_with_a_refusal() {
    for first in [ErrorCode::Timeout, ErrorCode::StoreUnsure] {
        let sends = Arc::new(AtomicUsize::new(0));
        let seen = sends.clone();
        let handler: Handler = Arc::new(move |_ctx, id, request| match request {
            Request::DescribeTopic(d) => described(id, &d.topic, 1),
            Request::SendMessage(_) if seen.fetch_add(1, Ordering::SeqCst) == 0 => {
                vec![Out::Frame(error(id, first, "may be stored"))]
            }
            Request::SendMessage(_) => {
                vec![Out::Frame(error(id, ErrorCode::DiskFull, "nothing stored"))]
            }
            _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
        });
        let fake = Fake::start(1, handler).await;
        let producer = Producer::connect_with(fake.config(), ProducerOptions::default())
            .await
            .unwrap();
        let sent = producer.send("t", OutgoingMessage::new("a")).await;
        let code = sent.as_ref().err().and_then(ClientError::code);
        assert_eq!(code, Some(first), "{sent:?}");
        assert!(
            sends.load(Ordering::SeqCst) >= 2,
            "sent again after {first}"
        );
    }
}

/// Sends packed behind one in flight whose packed request is refused are sent again one at
/// a time; those not begun within a request timeout times (retries + 2) of the batch's
/// start fail with `Timeout`, unsent, instead of waiting for all before them (each sent
/// again is unanswered here, three attempts of 200 ms).
#[tokio::test]
async fn a_packed_send_waits_no_longer_than_its_own_send_for_those_sent_again_before_it() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        // The first send stays in flight a while, so the next ones are packed behind it.
        Request::SendMessage(m) if m.body == b"s0" => vec![Out::Later(
            Duration::from_millis(100),
            answer(id, &send_result(0, 0)),
        )],
        // Sent again alone: never answered.
        Request::SendMessage(_) => Vec::new(),
        Request::SendMulti(_) => vec![Out::Frame(error(
            id,
            ErrorCode::QueueNotFound,
            "one of them is refused",
        ))],
        _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
    });
    let fake = Fake::start(1, handler).await;
    let mut config = fake.config();
    config.request_timeout_ms = 200;
    let options = ProducerOptions {
        coalesce: true,
        ..ProducerOptions::default()
    };
    let producer = Producer::connect_with(config, options).await.unwrap();
    producer.client().describe_topic("t").await.unwrap();
    let send = |body: String| producer.send_async("t", OutgoingMessage::new(body));
    let started = tokio::time::Instant::now();
    let s0 = tokio::spawn(send("s0".into()));
    fake.received_send(b"s0").await;
    let packed: Vec<_> = (1..=8)
        .map(|i| tokio::spawn(send(format!("s{i}"))))
        .collect();
    s0.await.unwrap().unwrap();
    for s in packed {
        let sent = s.await.unwrap();
        assert!(matches!(sent, Err(ClientError::Timeout { .. })), "{sent:?}");
    }
    // Each sent again alone takes three unanswered attempts of 200 ms: one after the other,
    // the last of eight would end after about 5 s.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// A request still queued for the writer when its deadline passes (its caller was told
/// `Timeout`) is not written: a connection whose writes backed up behind a broker that
/// stopped reading does not send every timed-out request once it reads again.
#[tokio::test]
async fn requests_past_their_deadline_are_not_written() {
    // 128 MiB: more than a host's socket buffers hold, however large they are tuned.
    const SENDS: usize = 32;
    let first = Arc::new(AtomicUsize::new(0));
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        // The first large send stops the broker reading for a while: the client's socket
        // fills, and the other sends wait in its writer past their deadlines.
        Request::SendMessage(m)
            if m.body.len() > 1024 && first.fetch_add(1, Ordering::SeqCst) == 0 =>
        {
            vec![Out::Stall(Duration::from_millis(1_500))]
        }
        Request::SendMessage(m) => vec![Out::Frame(answer(id, &send_result(m.queue_id as u32, 0)))],
        _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
    });
    let fake = Fake::start(1, handler).await;
    let mut config = fake.config();
    config.request_timeout_ms = 300;
    let producer = Producer::connect_with(config, no_retries()).await.unwrap();
    producer.client().describe_topic("t").await.unwrap();
    let large = vec![7u8; BODY_BYTES_MAX];
    let sends: Vec<_> = (0..SENDS)
        .map(|_| tokio::spawn(producer.send_async("t", OutgoingMessage::new(large.clone()))))
        .collect();
    for s in sends {
        let sent = s.await.unwrap();
        assert!(matches!(sent, Err(ClientError::Timeout { .. })), "{sent:?}");
    }
    // Once a later send is answered, the broker has read everything written before it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while producer
        .send("t", OutgoingMessage::new("last"))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never answered again"
        );
    }
    let written = (fake.requests().into_iter())
        .filter(|(_, r)| matches!(r, Request::SendMessage(m) if m.body.len() > 1024))
        .count();
    assert!(written < SENDS, "all {SENDS} written, after their deadline");
}

/// A oneway send is done once its frame is queued: dropping the producer right after still
/// writes it (the connection's writer drains oneway frames before closing). Before, the
/// drop aborted the writer and the frame was never written.
#[tokio::test(flavor = "current_thread")]
async fn a_oneway_send_queued_before_the_producer_is_dropped_is_written() {
    let fake = Fake::start(1, simple_handler(4)).await;
    let producer = Producer::connect(fake.config()).await.unwrap();
    // The route first, so the oneway send only queues its frame.
    producer
        .send("t", OutgoingMessage::new("first"))
        .await
        .unwrap();
    producer
        .send_oneway("t", OutgoingMessage::new("last words"))
        .await
        .unwrap();
    drop(producer);
    fake.received_send(b"last words").await;
}

/// `TransactionProducer::shutdown` abandons the answers being made: their tasks held
/// handles on the client, so a checker that blocks kept the connection open (the broker
/// went on sending this producer checks nobody read), and its outcome was sent after
/// `shutdown` returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_abandons_answers_in_progress_and_closes_the_connections() {
    let pushed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::ProducerHeartbeat(h) if !pushed.swap(true, Ordering::SeqCst) => {
            let check = crate::protocol::CheckTransaction {
                topic: "t".into(),
                queue_id: 0,
                transaction_id: 1,
                producer_group: h.group.clone(),
                record: record("t", 0, 1, "", b"half"),
            };
            let mut push = Vec::new();
            crate::protocol::encode_frame(0, crate::protocol::Flags::NONE, &check, &[], &mut push)
                .unwrap();
            vec![empty_answer(id), Out::Frame(push)]
        }
        _ => vec![empty_answer(id)],
    });
    let fake = Fake::start(1, handler).await;
    let (asked_tx, asked_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (asked_tx, go_rx) = (Mutex::new(asked_tx), Mutex::new(go_rx));
    let tp = TransactionProducer::start(fake.config(), "txs", move |_| {
        let _ = asked_tx.lock().unwrap().send(());
        let _ = go_rx.lock().unwrap().recv();
        TransactionOutcome::Commit
    })
    .await
    .unwrap();
    tokio::task::spawn_blocking(move || asked_rx.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the checker was not asked");
    tp.shutdown().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while fake.open.load(Ordering::SeqCst) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a connection stays open while the checker runs"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    go_tx.send(()).unwrap();
    let ended = (fake.requests().iter())
        .filter(|(_, r)| matches!(r, Request::EndTransaction(_)))
        .count();
    assert_eq!(ended, 0);
}

/// Check-backs pushed faster than the checker answers are answered at most
/// `CHECKS_IN_PROGRESS_MAX` at a time, the others waiting (not each given a task and a
/// blocking thread holding its half message, nor skipped: a skipped check still counts
/// against the broker's check limit); a check of a transaction being answered is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_backs_answered_at_once_are_bounded() {
    use crate::client::transaction::CHECKS_IN_PROGRESS_MAX;
    // 0..32 twice (the second while the first are answered), then 200 more.
    const TWICE: u64 = 32;
    const MORE: std::ops::Range<u64> = 100..300;
    let pushed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        // All at once, after the first registration's answer.
        Request::ProducerHeartbeat(h) if !pushed.swap(true, Ordering::SeqCst) => {
            let mut outs = vec![empty_answer(id)];
            for transaction_id in (0..TWICE).chain(0..TWICE).chain(MORE) {
                let check = crate::protocol::CheckTransaction {
                    topic: "t".into(),
                    queue_id: 0,
                    transaction_id,
                    producer_group: h.group.clone(),
                    record: record("t", 0, transaction_id, "", b"half"),
                };
                let mut push = Vec::new();
                crate::protocol::encode_frame(
                    0,
                    crate::protocol::Flags::NONE,
                    &check,
                    &[],
                    &mut push,
                )
                .unwrap();
                outs.push(Out::Frame(push));
            }
            outs
        }
        _ => vec![empty_answer(id)],
    });
    let fake = Fake::start(1, handler).await;
    let (running, most, calls) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (r, m, c) = (running.clone(), most.clone(), calls.clone());
    let _tp = TransactionProducer::start(fake.config(), "txg", move |_| {
        c.fetch_add(1, Ordering::SeqCst);
        let now = r.fetch_add(1, Ordering::SeqCst) + 1;
        m.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(300));
        r.fetch_sub(1, Ordering::SeqCst);
        TransactionOutcome::Commit
    })
    .await
    .unwrap();
    // Every transaction is answered once, and ended.
    let want = TWICE as usize + MORE.count();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ended = (fake.requests().iter())
            .filter(|(_, r)| matches!(r, Request::EndTransaction(_)))
            .count();
        let called = calls.load(Ordering::SeqCst);
        if ended >= want && running.load(Ordering::SeqCst) == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ended} of {called} ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= CHECKS_IN_PROGRESS_MAX,
        "{most} checks answered at once"
    );
    assert_eq!(calls.load(Ordering::SeqCst), want, "each answered once");
}

/// Under `coalesce`, a send that goes at once (nothing in flight to its topic's shard)
/// takes none of the producer's 64 MiB of room for queued sends: with the room full of
/// sends queued behind an unanswered one to another topic, it is sent and answered.
/// Before, it waited for room, and failed with `Timeout`, unsent.
#[tokio::test]
async fn a_send_that_goes_at_once_needs_no_room_among_the_queued_ones() {
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        // Topic "stuck" is answered once (its queue count learnt), then never.
        Request::SendMessage(s) if s.topic == "stuck" && s.body != b"warm" => Vec::new(),
        Request::SendMessage(_) => vec![Out::Frame(answer(id, &send_result(0, 0)))],
        _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
    });
    let fake = Fake::start(1, handler).await;
    let mut config = fake.config();
    config.request_timeout_ms = 1_000;
    let options = ProducerOptions {
        coalesce: true,
        retries: 0,
        ..Default::default()
    };
    let producer = Producer::connect_with(config, options).await.unwrap();
    producer
        .send("stuck", OutgoingMessage::new("warm"))
        .await
        .unwrap();
    // The lead to "stuck", then sixteen bodies of 4,000,000 bytes behind it: the room is
    // full.
    let lead = producer.send_async("stuck", OutgoingMessage::new("lead"));
    let mut lead = Box::pin(lead);
    assert!(pending_after_one_poll(&mut lead).await);
    let body = vec![b'x'; 4_000_000];
    let mut queued: Vec<_> = (0..16)
        .map(|_| Box::pin(producer.send_async("stuck", OutgoingMessage::new(body.clone()))))
        .collect();
    for q in &mut queued {
        assert!(pending_after_one_poll(q).await);
    }
    let other = producer
        .send("free", OutgoingMessage::new(body.clone()))
        .await;
    assert!(other.is_ok(), "{other:?}");
    // The queued ones fail at their deadline, unsent.
    for q in queued {
        let e = q.await.unwrap_err();
        assert!(matches!(e, ClientError::Timeout { .. }), "{e:?}");
    }
    assert!(lead.await.is_err());
    let topics: Vec<String> = (fake.requests().into_iter())
        .filter_map(|(_, r)| match r {
            Request::SendMessage(s) => Some(s.topic),
            Request::SendMulti(s) => Some(s.topic),
            _ => None,
        })
        .collect();
    assert_eq!(topics, ["stuck", "stuck", "free"]);
}

/// Polls `f` once: whether it is still pending.
async fn pending_after_one_poll<F: std::future::Future + Unpin>(f: &mut F) -> bool {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::pin::Pin::new(&mut *f).poll(cx).is_pending())
    })
    .await
}

/// A retriable refusal that comes at once (here `ShardUnavailable`; an unreachable broker
/// answers so until its reconnect backoff ends) is retried after a pause, 5 ms doubling:
/// `retries: u32::MAX` spun meanwhile. The send that goes through in the end is answered.
#[tokio::test]
async fn retries_after_an_immediate_refusal_pause_and_back_off() {
    let sent_at = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = sent_at.clone();
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 1),
        Request::SendMessage(m) => {
            let mut at = seen.lock().unwrap();
            at.push(std::time::Instant::now());
            if at.len() < 6 {
                vec![Out::Frame(error(id, ErrorCode::ShardUnavailable, "moving"))]
            } else {
                vec![Out::Frame(answer(id, &send_result(m.queue_id as u32, 4)))]
            }
        }
        _ => Vec::new(),
    });
    let fake = Fake::start(1, handler).await;
    let options = ProducerOptions {
        retries: u32::MAX,
        ..ProducerOptions::default()
    };
    let producer = Producer::connect_with(fake.config(), options)
        .await
        .unwrap();
    let sent = producer.send("t", OutgoingMessage::new("a")).await.unwrap();
    assert_eq!(sent.queue_offset, 4);
    let at = sent_at.lock().unwrap().clone();
    assert_eq!(at.len(), 6);
    // Pauses of 5, 10, 20, 40, 80 ms at least (a loaded machine only makes them longer).
    for (i, pair) in at.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        let least = Duration::from_millis(5 << i);
        assert!(
            gap >= least,
            "retry {}: {gap:?} after the refusal, under {least:?}",
            i + 1
        );
    }
}
