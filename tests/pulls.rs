//! Pulls against the real broker binary at the edges of their waits: a long poll that
//! reaches a shard that does not own its queue is passed on in two steps; a long poll is
//! answered once a message is readable. And what the store's read for a pull holds in
//! memory beyond its records.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::broker::BrokerProcess;
use ringmq::protocol::{Handshake, Heartbeat, Pull, PullStatus, Request, Response};

/// A long poll sent to a shard that does not own its queue (from a client that is not
/// shard aware) is passed on in two steps, its wait and then its read: one whose wait runs
/// out answers `NoNewMessage` after it, and one waiting when a message lands answers it.
#[test]
fn a_forwarded_long_poll_answers_when_a_message_lands() {
    use ringmq::protocol::route::owner;
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    let create = ringmq::protocol::CreateTopic {
        topic: "fwd".into(),
        queue_count: 8,
    };
    let created = common::raw::call(&addr, create.into());
    assert!(matches!(created, Response::Empty(_)), "{created:?}");
    let mut conn = TcpStream::connect(&addr).unwrap();
    let shard = match common::raw::answer_on(&mut conn, Handshake::new("fwd").into()) {
        Some(Response::HandshakeOk(h)) => h.shard_id,
        other => panic!("{other:?}"),
    };
    let queue = (0..8).find(|&q| owner("fwd", q, 2) != shard).unwrap();
    let poll = |wait_ms| {
        let mut pull = Pull::new("fwd", queue, 0);
        pull.max_wait_ms = wait_ms;
        Request::from(pull)
    };
    let started = Instant::now();
    match common::raw::answer_on(&mut conn, poll(200)) {
        Some(Response::Pull(p)) => assert_eq!(p.meta().status, PullStatus::NoNewMessage),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(150), "it waited");
    common::raw::write(&mut conn, 7, poll(20_000));
    // Answered after the poll was taken in (a connection's requests are taken in order).
    let beat = Heartbeat {
        client_id: "fwd".into(),
    };
    let beat = common::raw::answer_on(&mut conn, beat.into());
    assert!(matches!(beat, Some(Response::Empty(_))), "{beat:?}");
    let sent = common::raw::call(
        &addr,
        common::raw::send_to("fwd", queue as i32, "wake up").into(),
    );
    assert!(matches!(sent, Response::SendResult(_)), "{sent:?}");
    let (id, answer) = common::raw::read_answers(&mut conn, 1).pop().unwrap();
    assert_eq!(id, 7);
    let Response::Pull(p) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!((p.meta().status, p.meta().count), (PullStatus::Found, 1));
    let record = p.records().next().unwrap().unwrap();
    assert_eq!(record.body(), b"wake up");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered when the message landed, not at the deadline"
    );
}

/// A long poll is answered once a message is readable, not once it is durable: a send
/// that asks for durability in async mode waits for the flusher (here 60 s), its queue's
/// polls do not. Before, they were woken with the send's answer, after the fdatasync.
#[test]
fn a_long_poll_is_answered_when_the_message_is_readable_not_when_it_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        1,
        &["--flush", "async", "--flush-interval-ms", "60000"],
    );
    let addr = broker.addr_string();
    let create = ringmq::protocol::CreateTopic {
        topic: "soon".into(),
        queue_count: 1,
    };
    let created = common::raw::call(&addr, create.into());
    assert!(matches!(created, Response::Empty(_)), "{created:?}");
    let mut poller = TcpStream::connect(&addr).unwrap();
    let mut pull = Pull::new("soon", 0, 0);
    pull.max_wait_ms = 30_000;
    common::raw::write(&mut poller, 7, pull.into());
    // Answered after the poll was taken in (a connection's requests are taken in order).
    let beat = Heartbeat {
        client_id: "soon".into(),
    };
    let beat = common::raw::answer_on(&mut poller, beat.into());
    assert!(matches!(beat, Some(Response::Empty(_))), "{beat:?}");
    let mut sender = TcpStream::connect(&addr).unwrap();
    let mut send = common::raw::send_to("soon", 0, "readable");
    send.wait_durable = true;
    let sent_at = Instant::now();
    common::raw::write(&mut sender, 1, send.into());
    let (id, answer) = common::raw::read_answers(&mut poller, 1).pop().unwrap();
    let waited = sent_at.elapsed();
    assert_eq!(id, 7);
    let Response::Pull(p) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!((p.meta().status, p.meta().count), (PullStatus::Found, 1));
    assert!(
        waited < Duration::from_secs(5),
        "answered after {waited:?}: when the flusher made it durable"
    );
    // The send's own answer waits for the flusher: not waited for here.
    drop(sender);
}

/// Long polls waiting on one shard are bounded (`--long-polls-max`): past it a pull that
/// would wait is refused `BrokerBusy` naming the flag, one with messages to read is still
/// answered, and a poll that ends gives its place back.
#[test]
fn long_polls_past_the_cap_are_refused_busy_and_an_ended_one_gives_its_place_back() {
    use ringmq::client::{Client, ClientConfig};
    use ringmq::protocol::ErrorCode;
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &["--long-polls-max", "2"]);
    let addr = broker.addr_string();
    common::runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("t", 3).await.unwrap();
        let long = Duration::from_secs(30);
        // Two polls wait, on queues 0 and 1. Each is polled once here, which queues its
        // request on the connection before the probes below (a connection's requests are
        // taken in order): spawned unpolled, a loaded machine ran a probe first, which took
        // a place, a poll was refused, and no probe ever was (a fresh-clone run).
        let mut waiting = Vec::new();
        for q in 0..2 {
            let c = client.clone();
            let mut poll = Box::pin(async move { c.pull("t", q, 0, 32, long, &[]).await });
            let first = futures_lite::future::poll_once(&mut poll).await;
            assert!(first.is_none(), "{first:?}");
            waiting.push(tokio::spawn(poll));
        }
        // Once both wait, a third that would wait is refused (before, it waits its 50 ms).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        let refusal = loop {
            assert!(Instant::now() < deadline, "no pull was refused");
            tick.tick().await;
            // A waiting poll that ended (refused busy: on a loaded machine a probe's pull
            // can still take a place first, a fresh-clone run) waits again, so that two
            // wait when a probe is refused.
            for (q, w) in (0..).zip(waiting.iter_mut()) {
                if w.is_finished() {
                    let c = client.clone();
                    *w = tokio::spawn(async move { c.pull("t", q, 0, 32, long, &[]).await });
                }
            }
            match client
                .pull("t", 2, 0, 32, Duration::from_millis(50), &[])
                .await
            {
                Ok(r) => assert_eq!(r.status, PullStatus::NoNewMessage),
                Err(e) => break e,
            }
        };
        assert_eq!(refusal.code(), Some(ErrorCode::BrokerBusy), "{refusal}");
        assert!(
            refusal.to_string().contains("--long-polls-max"),
            "{refusal}"
        );
        // A pull with a message to read does not wait: answered at the cap.
        let send = |q: i32, body: &str| {
            let sent = common::raw::call(&addr, common::raw::send_to("t", q, body).into());
            assert!(matches!(sent, Response::SendResult(_)), "{sent:?}");
        };
        send(2, "two");
        let read = client.pull("t", 2, 0, 32, long, &[]).await.unwrap();
        assert_eq!((read.status, read.messages.len()), (PullStatus::Found, 1));
        // A message for a waiting poll ends it, and its place is free once it is answered:
        // a pull that waits is taken again.
        send(0, "zero");
        let mut waiting = waiting.into_iter();
        let woken = waiting.next().unwrap().await.unwrap().unwrap();
        assert_eq!((woken.status, woken.messages.len()), (PullStatus::Found, 1));
        let started = Instant::now();
        let again = client
            .pull("t", 2, 1, 32, Duration::from_millis(300), &[])
            .await;
        assert_eq!(again.unwrap().status, PullStatus::NoNewMessage);
        assert!(started.elapsed() >= Duration::from_millis(250), "it waited");
    });
}

/// Pulls waiting for room for their answers (the shard's 256 MiB is spent on answers that
/// connections do not read) take places among the shard's waiting polls too: past
/// `--long-polls-max` they are refused `BrokerBusy` at once rather than held, each with its
/// plan, for as long as their connections live.
#[test]
fn pulls_waiting_for_room_for_their_answers_count_against_the_long_polls_cap() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &["--long-polls-max", "4"]);
    let addr = broker.addr_string();
    let create = ringmq::protocol::CreateTopic {
        topic: "big".into(),
        queue_count: 1,
    };
    assert!(matches!(
        common::raw::call(&addr, create.into()),
        Response::Empty(_)
    ));
    // 64 messages of 64 KiB: each pull of 32 answers 2 MiB.
    let body = "x".repeat(64 * 1024);
    for _ in 0..64 {
        let sent = common::raw::call(&addr, common::raw::send_to("big", 0, &body).into());
        assert!(matches!(sent, Response::SendResult(_)), "{sent:?}");
    }
    let pulls = |n: u64| {
        let mut frames = Vec::new();
        for id in 0..n {
            let mut pull = Pull::new("big", 0, 0);
            pull.max_wait_ms = 0;
            ringmq::protocol::encode_request(&Request::from(pull), id, &mut frames).unwrap();
        }
        frames
    };
    // 24 connections that read none of their answers: over 16 MiB each, past the shard's
    // 256 MiB in all.
    let mut open = Vec::new();
    for _ in 0..24 {
        let mut conn = TcpStream::connect(&addr).unwrap();
        std::io::Write::write_all(&mut conn, &pulls(64)).unwrap();
        open.push(conn);
    }
    // One pull at a time on new connections (kept open, so a waiting one keeps its place):
    // answered while there is room; then up to 4 wait, and the next is refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    let refusal = loop {
        assert!(Instant::now() < deadline, "no pull was refused");
        let mut probe = TcpStream::connect(&addr).unwrap();
        probe
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        std::io::Write::write_all(&mut probe, &pulls(1)).unwrap();
        let mut head = [0u8; 1];
        // Nothing within the timeout: it waits for room (read on below if it comes).
        let waits = probe.peek(&mut head).is_err();
        probe.set_read_timeout(None).unwrap();
        if !waits {
            match common::raw::read_answer(&mut probe) {
                Response::Pull(p) => assert_eq!(p.meta().status, PullStatus::Found),
                other => break common::raw::error_of(other),
            }
        }
        open.push(probe);
    };
    assert_eq!(
        refusal.0,
        ringmq::protocol::ErrorCode::BrokerBusy,
        "{}",
        refusal.1
    );
    assert!(refusal.1.contains("--long-polls-max"), "{}", refusal.1);
}

/// A chain of `n` comparisons of property `a`, distinct by `salt`, of about 4 KiB.
fn long_filter(salt: usize, n: usize) -> String {
    let chain: Vec<String> = (0..n).map(|i| format!("a > {}", salt * 1000 + i)).collect();
    let chain = chain.join(" OR ");
    let end = chain.len().min(4000);
    match chain[..end].rfind(" OR ") {
        Some(cut) if end < chain.len() => chain[..cut].to_owned(),
        _ => chain,
    }
}

/// A filtered pull looks at a bounded amount of property bytes per comparison: past it,
/// it answers the records it checked and ends its window there, so the next pull goes on
/// from the first record not checked (a long expression over large properties held the
/// shard's thread for seconds per pull). Every message is still delivered, once.
#[test]
fn a_filtered_pull_answers_what_its_work_allows_and_the_next_goes_on_from_there() {
    use ringmq::client::{ClientConfig, OutgoingMessage, Producer};
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    common::runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("heavy", 1).await.unwrap();
        let big = "7".repeat(60_000);
        for i in 0..3 {
            let m = OutgoingMessage::new(format!("m{i}")).with_property("a", big.clone());
            producer.send("heavy", m).await.unwrap();
        }
        // 200 comparisons of a 60 KB value: about 12 MB to look at per record.
        let costly = long_filter(0, 200);
        let wait = Duration::from_millis(50);
        let mut offset = 0;
        let mut bodies = Vec::new();
        for _ in 0..3 {
            let r = client
                .pull_sql("heavy", 0, offset, 32, wait, &costly)
                .await
                .unwrap();
            assert_eq!(r.status, PullStatus::Found);
            assert_eq!(r.messages.len(), 1, "one record's work fills the pull's");
            assert_eq!(r.next_offset, offset + 1);
            bodies.extend(r.messages.iter().map(|m| m.body().to_vec()));
            offset = r.next_offset;
        }
        assert_eq!(bodies, [b"m0".to_vec(), b"m1".to_vec(), b"m2".to_vec()]);
        let end = client.pull_sql("heavy", 0, 3, 32, wait, &costly).await;
        assert_eq!(end.unwrap().status, PullStatus::NoNewMessage);
        // A light filter reads them all in one pull.
        let all = client.pull_sql("heavy", 0, 0, 32, wait, "a > 1").await;
        assert_eq!(all.unwrap().messages.len(), 3);
    });
}

/// The parsed SQL92 filters a shard holds are bounded (`--sql-filters-mb`): each waiting
/// pull holds its own, so distinct long expressions, one per poll, held gigabytes. Past it
/// a pull with a new expression is refused `BrokerBusy` naming the flag; once the polls
/// end, new expressions are taken again.
#[test]
fn parsed_filters_of_waiting_pulls_are_bounded_by_sql_filters_mb() {
    use ringmq::client::{Client, ClientConfig};
    use ringmq::protocol::ErrorCode;
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &["--sql-filters-mb", "1"]);
    let addr = broker.addr_string();
    common::runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("t", 1).await.unwrap();
        // Each parsed filter holds about 60 KiB: 1 MiB is spent well before 40 wait.
        let long = Duration::from_secs(30);
        let polls: Vec<_> = (0..40)
            .map(|salt| {
                let c = client.clone();
                let filter = long_filter(salt, 1000);
                tokio::spawn(async move { c.pull_sql("t", 0, 0, 32, long, &filter).await })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        while polls.iter().filter(|p| p.is_finished()).count() < 10 {
            assert!(
                Instant::now() < deadline,
                "fewer than 10 polls were refused"
            );
            tick.tick().await;
        }
        let mut refused = 0;
        let mut waited = 0;
        for poll in polls {
            if !poll.is_finished() {
                waited += 1;
                continue;
            }
            let e = poll.await.unwrap().unwrap_err();
            assert_eq!(e.code(), Some(ErrorCode::BrokerBusy), "{e}");
            assert!(e.to_string().contains("--sql-filters-mb"), "{e}");
            refused += 1;
        }
        assert!(waited >= 10, "{waited} polls waited, {refused} refused");
        // A message without `a` ends the waiting polls (none matches); then a new
        // expression is taken.
        let sent = common::raw::call(&addr, common::raw::send_to("t", 0, "x").into());
        assert!(matches!(sent, Response::SendResult(_)), "{sent:?}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pulled = client
                .pull_sql(
                    "t",
                    0,
                    1,
                    32,
                    Duration::from_millis(50),
                    &long_filter(99, 1000),
                )
                .await;
            match pulled {
                Ok(r) => {
                    assert_eq!(r.status, PullStatus::NoNewMessage);
                    break;
                }
                Err(e) => assert_eq!(e.code(), Some(ErrorCode::BrokerBusy), "{e}"),
            }
            assert!(
                Instant::now() < deadline,
                "new expressions are still refused"
            );
            tick.tick().await;
        }
    });
}

/// A tag-filtered read of a queue whose matching records are small and far apart (each
/// between two 60 KiB records of another tag) takes at most 256 KiB of the other records in
/// passing, however many it answers, and says what it holds beyond its records (the
/// broker reserves that too, or copies the records out). Before, each read of two small
/// records took the 60 KiB between them: about 300 times the bytes the answer reserved.
#[test]
fn a_sparse_read_holds_little_beyond_its_records() {
    use ringmq::protocol::record::PropertiesBuilder;
    ringmq::io::run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ringmq::store::StoreConfig::default();
        cfg.log.tail_cache_bytes = 0;
        let (store, _) = ringmq::store::MessageStore::open(dir.path(), cfg)
            .await
            .unwrap();
        let message = |tag: &str, body: usize| {
            let mut p = PropertiesBuilder::new();
            p.put("TAGS", tag).unwrap();
            common::TestMessage {
                topic: "t".into(),
                queue_id: 0,
                properties: p.into_bytes(),
                body: vec![7; body],
                born_timestamp_ms: 1_700_000_000_000,
            }
        };
        let (small, large) = (message("A", 100), message("B", 60 << 10));
        for _ in 0..200 {
            store.put(&small.draft()).await.unwrap();
            store.put(&large.draft()).await.unwrap();
        }
        let a = ringmq::index::tag_hash("A");
        let mut r = store
            .read_queue("t", 0, 0, 1024, 16 << 20, &[a])
            .await
            .unwrap();
        assert_eq!(r.len(), 200);
        let even: Vec<u64> = (0..200).map(|n| 2 * n).collect();
        assert_eq!(r.queue_offsets(), &even[..]);
        let held = r.held_beyond();
        let bound = (256 << 10) + r.len() * 2 * ringmq::io::IO_ALIGN;
        assert!(held <= bound, "{held} bytes held beyond {}", r.bytes_len());
        let records: Vec<Vec<u8>> = r.records().map(|b| b.to_vec()).collect();
        r.compact();
        assert_eq!(r.held_beyond(), 0);
        assert!(
            r.records().map(|b| b.to_vec()).eq(records),
            "the same records"
        );
    });
}
