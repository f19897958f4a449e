//! Requests a careless or hostile client may send, written as raw frames (past the client's
//! own checks) to the real broker binary: each gets a typed error and a clear message, the
//! broker keeps its memory and keeps serving. Also the broker's own start-up checks
//! (timings, the topic table on disk), a restart on the same port while clients are
//! connected, and the limits a broker tells its clients.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::broker::BrokerProcess;
use common::raw::{call, error_of, read_answer, send_to};
use common::runtime;
use ringmq::client::{Client, ClientConfig, OutgoingMessage, Producer};
use ringmq::protocol::{
    encode_request, BatchItem, ErrorCode, GroupHeartbeat, Heartbeat, LockBatch, Pull, Request,
    Response, SendBatch, SendMessage, SubscriptionData, EXPRESSION_SQL92, FRAME_HEADER_BYTES,
};

fn send(topic: &str, queue_id: i32, properties: Vec<u8>, body: &[u8]) -> Request {
    SendMessage {
        properties,
        ..send_to(topic, queue_id, body)
    }
    .into()
}

/// A batch to queue 0 of `topic`: a message without properties, then one with
/// `properties`.
fn batch_to(topic: &str, properties: Vec<u8>) -> Request {
    let item = |properties: Vec<u8>| BatchItem {
        flag: 0,
        properties,
        body: b"x".to_vec().into(),
        born_timestamp_ms: 0,
    };
    SendBatch {
        topic: topic.into(),
        queue_id: 0,
        messages: vec![item(Vec::new()), item(properties)],
        wait_durable: false,
    }
    .into()
}

#[test]
fn malformed_and_oversized_requests_get_typed_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("t", 2).await.unwrap();
    });
    let rss_before = broker.rss_mib();
    // A lock request for more queues than a topic may have, with a 1 MB client id: no
    // memory is spent on it.
    let (code, message) = error_of(call(
        &addr,
        LockBatch {
            group: "g".into(),
            client_id: "c".repeat(1 << 20),
            topic: "t".into(),
            queues: (0..1024).collect(),
        }
        .into(),
    ));
    assert_eq!(code, ErrorCode::InvalidMessage, "{message}");
    assert!(message.len() < 400, "the id is not echoed whole");
    let (code, message) = error_of(call(
        &addr,
        LockBatch {
            group: "g".into(),
            client_id: "c".into(),
            topic: "t".into(),
            queues: (0..5000).collect(),
        }
        .into(),
    ));
    assert_eq!(code, ErrorCode::InvalidMessage, "{message}");
    // An empty client id.
    let (code, _) = error_of(call(
        &addr,
        LockBatch {
            group: "g".into(),
            client_id: String::new(),
            topic: "t".into(),
            queues: vec![0],
        }
        .into(),
    ));
    assert_eq!(code, ErrorCode::InvalidMessage);
    assert!(broker.rss_mib() < rss_before + 50);
    // A pull filtering on more tags than any expression has.
    let mut pull = Pull::new("t", 0, 0);
    pull.tag_hashes = (1..=65).collect();
    let (code, message) = error_of(call(&addr, pull.into()));
    assert_eq!(code, ErrorCode::BadFilterExpression, "{message}");
    // Refused for its filter before its topic is looked for (on a shard other than 0,
    // that waits for shard 0, with the request held).
    let mut pull = Pull::new("no-such-topic", 0, 0);
    pull.tag_hashes = (1..=65).collect();
    let (code, message) = error_of(call(&addr, pull.into()));
    assert_eq!(code, ErrorCode::BadFilterExpression, "{message}");
    let pull = Pull {
        sql: "a = 1 OR ".repeat(500) + "a = 2",
        ..Pull::new("no-such-topic", 0, 0)
    };
    let (code, message) = error_of(call(&addr, pull.into()));
    assert_eq!(code, ErrorCode::BadFilterExpression, "{message}");
    assert!(message.contains("at most 4096"), "{message}");
    // Only -1 leaves the queue to the broker.
    for queue in [-2, i32::MIN] {
        let (code, message) = error_of(call(&addr, send("t", queue, Vec::new(), b"x")));
        assert_eq!(code, ErrorCode::QueueNotFound, "{queue}: {message}");
    }
    // A batch with one bad message stores none of them.
    let good = BatchItem {
        flag: 0,
        properties: Vec::new(),
        body: b"ok".to_vec().into(),
        born_timestamp_ms: 0,
    };
    let bad = BatchItem {
        properties: b"no separators".to_vec(),
        ..good.clone()
    };
    let (code, _) = error_of(call(
        &addr,
        SendBatch {
            topic: "t".into(),
            queue_id: 0,
            messages: vec![good.clone(), good.clone(), bad],
            wait_durable: false,
        }
        .into(),
    ));
    assert_eq!(code, ErrorCode::InvalidMessage);
    // Properties over the client's share of the block.
    let mut big = b"p\x01".to_vec();
    big.resize(64 * 1024 - 100, b'v');
    big.push(0x02);
    let (code, message) = error_of(call(&addr, send("t", 0, big, b"x")));
    assert_eq!(code, ErrorCode::InvalidMessage, "{message}");
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        let info = client.describe_topic("t").await.unwrap();
        assert!(
            info.queues.iter().all(|q| q.max_offset == 0),
            "nothing was stored: {info:?}"
        );
    });
    // A string that is not UTF-8 is named as such.
    let mut out = Vec::new();
    encode_request(
        &Heartbeat {
            client_id: "abcdefghijklmnopqrstuvwx".into(),
        }
        .into(),
        3,
        &mut out,
    )
    .unwrap();
    let at = out
        .windows(24)
        .position(|w| w == b"abcdefghijklmnopqrstuvwx")
        .expect("the id is in the frame");
    out[at + 5] = 0xff;
    let mut conn = TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.write_all(&out).unwrap();
    let (code, message) = error_of(read_answer(&mut conn));
    assert_eq!(code, ErrorCode::MalformedFrame);
    assert!(
        message.to_lowercase().contains("utf"),
        "the message says what is wrong: {message}"
    );
    assert!(!message.contains("enable debug assertions"), "{message}");
    assert!(!broker.stderr().contains("panicked"), "{}", broker.stderr());
}

#[test]
fn bad_timings_and_a_bad_topic_table_stop_the_broker_at_start_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    // Runs the broker, which must refuse to start: a broker that starts is killed after
    // 30 s and fails the test (instead of hanging it).
    let start = |data: &std::path::Path, extra: &[&str]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq-broker"))
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the broker started with {extra:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    };
    for (flags, named) in [
        (&["--session-timeout-ms", "0"][..], "session-timeout-ms"),
        (
            &["--session-timeout-ms", "10000", "--lock-expiry-ms", "12000"][..],
            "lock-expiry-ms",
        ),
        // "Forever" as a huge number: refused (it once read as a negative retention).
        (
            &["--retention-hours", "18446744073709551615"][..],
            "retention-hours names more than a century",
        ),
        (
            &["--conn-timeout-ms", "18446744073709551615"][..],
            "conn-timeout-ms",
        ),
        (
            &["--transaction-timeout-ms", "9223372036854775807"][..],
            "transaction-timeout-ms",
        ),
    ] {
        let out = start(&dir.path().join("a"), flags);
        assert!(!out.status.success(), "{flags:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
    }
    for (table, named) in [
        (r#"{"topics": {"huge": 4294967295}}"#, "huge"),
        (r#"{"topics": {"../escape": 4}}"#, "../escape"),
        (r#"{"topics": {"%SYS_SCHEDULE%": 1}}"#, "%SYS_SCHEDULE%"),
    ] {
        let data = dir.path().join(format!("t{}", named.len()));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("topics.json"), table).unwrap();
        let out = start(&data, &[]);
        assert!(!out.status.success(), "{table}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named), "{table}: {stderr}");
    }
}

#[test]
fn a_restart_right_after_a_stop_takes_the_same_port_while_clients_were_connected() {
    let dir = tempfile::tempdir().unwrap();
    // A port with its direct ports (port + 1 + shard) free.
    let port = loop {
        let p = common::free_port();
        if p < 60_000 && (1..=2).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok())
        {
            break p;
        }
    };
    let listen = format!("127.0.0.1:{port}").parse().unwrap();
    let mut broker = BrokerProcess::start_on(listen, &dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    let rt = runtime();
    rt.block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        for i in 0..10 {
            producer
                .send("r", OutgoingMessage::new(format!("m{i}")))
                .await
                .unwrap();
        }
        // Connected when the broker stops: their connections go to TIME_WAIT.
        assert!(broker.stop());
        broker.restart();
        let again = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        again
            .send("r", OutgoingMessage::new("after"))
            .await
            .unwrap();
    });
    assert_eq!(broker.addr.port(), port);
}

#[test]
fn answers_stay_within_the_clients_frame_limit_and_the_broker_tells_its_limits() {
    let dir = tempfile::tempdir().unwrap();
    // The broker takes 64 MiB frames; the client keeps the default (about 5 MiB).
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &[
            "--frame-bytes-max",
            "67108864",
            "--session-timeout-ms",
            "7000",
            "--lock-expiry-ms",
            "30000",
        ],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        let info = client.broker_info();
        assert_eq!(
            (
                info.frame_bytes_max,
                info.session_timeout_ms,
                info.lock_expiry_ms
            ),
            (64 << 20, 7000, 30_000)
        );
        client.create_topic("wide", 1).await.unwrap();
        for i in 0..8u8 {
            producer
                .send("wide", OutgoingMessage::new(vec![i; 1 << 20]))
                .await
                .unwrap();
        }
        // 8 MiB of messages: each answer carries what fits the client's frames.
        let mut offset = 0;
        let mut got = 0;
        while got < 8 {
            let pulled = client
                .pull("wide", 0, offset, 32, Duration::from_millis(0), &[])
                .await
                .unwrap();
            assert!(!pulled.messages.is_empty());
            let bytes: usize = pulled.messages.iter().map(|m| m.as_bytes().len()).sum();
            assert!(bytes + FRAME_HEADER_BYTES < client.config().frame_bytes_max as usize);
            got += pulled.messages.len();
            offset = pulled.next_offset;
        }
        // A key lookup answers what fits one frame (newest first), not everything.
        for i in 0..4u8 {
            producer
                .send(
                    "wide",
                    OutgoingMessage::new(vec![i; 3 << 20]).with_key("same"),
                )
                .await
                .unwrap();
        }
        let found = client
            .messages_by_key("wide", "same", 0, i64::MAX, 64)
            .await
            .unwrap();
        assert_eq!(found.len(), 1, "one 3 MiB message fits a 5 MiB frame");
    });
}

/// A client whose own frame limit is larger than the broker's sends no request past the
/// broker's (the handshake tells it): the send fails at once, typed and not retriable, and
/// the connection (with what else is in flight on it) goes on. Before, the broker refused
/// the frame and closed the connection, which failed every request on it as maybe stored
/// (retried: stored twice) and the batch itself as a retriable connection error.
#[test]
fn a_request_past_the_brokers_frame_limit_is_refused_before_it_is_written() {
    use ringmq::client::ClientError;
    let dir = tempfile::tempdir().unwrap();
    // The broker keeps its default limit (about 5 MiB); the client takes 64 MiB frames.
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let mut config = ClientConfig::new(&addr);
        config.frame_bytes_max = 64 << 20;
        let producer = Producer::connect(config).await.unwrap();
        producer.client().create_topic("big", 1).await.unwrap();
        producer
            .send("big", OutgoingMessage::new("first"))
            .await
            .unwrap();
        let batch: Vec<_> = (0..8u8)
            .map(|i| OutgoingMessage::new(vec![i; 1 << 20]))
            .collect();
        let (refused, alongside) = tokio::join!(
            producer.send_batch("big", batch),
            producer.send("big", OutgoingMessage::new("alongside"))
        );
        let err = refused.unwrap_err();
        assert!(matches!(err, ClientError::InvalidArgument(_)), "{err:?}");
        assert!(!err.is_retriable(), "{err:?}");
        assert!(err.to_string().contains("--frame-bytes-max"), "{err}");
        alongside.unwrap();
        // Nothing of the batch was stored.
        assert_eq!(producer.client().max_offset("big", 0).await.unwrap(), 2);
    });
}

#[test]
fn a_second_live_connection_with_the_same_client_id_is_refused_and_cannot_touch_the_members_locks()
{
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let mut config = ClientConfig::new(&addr);
        // Two containers, both PID 1, once made the same default id: now the default is
        // unique, and a clash is refused rather than merged.
        assert_ne!(config.client_id, ClientConfig::new(&addr).client_id);
        config.client_id = "twin".into();
        let spec = ringmq::client::MemberSpec {
            subscriptions: vec![("t".into(), "*".into())],
            consume_mode: ringmq::client::ConsumeMode::Orderly,
            message_model: ringmq::client::MessageModel::Clustering,
            strategy: ringmq::client::AllocateStrategy::Averagely,
        };
        let first = Client::connect(config.clone()).await.unwrap();
        first.create_topic("t", 2).await.unwrap();
        first.group_heartbeat("g", &spec).await.unwrap();
        let second = Client::connect(config.clone()).await.unwrap();
        let err = second.group_heartbeat("g", &spec).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::ClientIdInUse), "{err}");
        drop(first);
        // Once the first connection is gone, the id is free.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match second.group_heartbeat("g", &spec).await {
                Ok(_) => break,
                Err(e) if e.code() == Some(ErrorCode::ClientIdInUse) => {
                    assert!(std::time::Instant::now() < deadline, "{e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
        // A connection with the same id that is not the member's (a process whose member
        // expired, replaced by one with its id, coming back) neither renews nor gives up
        // the member's queue locks, nor takes the member out of the group: before, it took
        // the locks over (two consumers of an orderly queue) and the member away.
        assert_eq!(second.lock_batch("g", "t", &[0, 1]).await.unwrap(), [0, 1]);
        let late = Client::connect(config.clone()).await.unwrap();
        assert!(late.lock_batch("g", "t", &[0, 1]).await.unwrap().is_empty());
        late.unlock_batch("g", "t", &[0, 1]).await.unwrap();
        let mut other = config.clone();
        other.client_id = "other".into();
        let other = Client::connect(other).await.unwrap();
        assert!(
            other
                .lock_batch("g", "t", &[0, 1])
                .await
                .unwrap()
                .is_empty(),
            "the late connection's unlock freed the member's locks"
        );
        let refused = late.unregister("g").await.unwrap_err();
        assert_eq!(refused.code(), Some(ErrorCode::ClientIdInUse), "{refused}");
        assert!(
            refused.to_string().contains("another connection"),
            "{refused}"
        );
        let members = second.group_members("g").await.unwrap().members;
        assert_eq!(members.len(), 1, "the late connection's unregister took it");
        assert_eq!(second.lock_batch("g", "t", &[0, 1]).await.unwrap(), [0, 1]);
        // From its own connection, it leaves, and its locks go with it.
        second.unregister("g").await.unwrap();
        assert!(second.group_members("g").await.unwrap().members.is_empty());
        assert_eq!(other.lock_batch("g", "t", &[0, 1]).await.unwrap(), [0, 1]);
    });
}

#[test]
fn bad_sql_filters_are_refused_with_their_column_before_anything_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("t", 2).await.unwrap();
        for q in 0..2 {
            producer
                .send(
                    "t",
                    OutgoingMessage::new(format!("m{q}")).with_sharding_key(q.to_string()),
                )
                .await
                .unwrap();
        }
    });
    for (expr, column) in [
        ("region = 'eu", 10),
        ("amount > 'x'", 1),
        ("a IN (1, 2)", 7),
        ("((a = 1)", 9),
    ] {
        for queue_id in 0..2 {
            let pull = Pull {
                sql: expr.into(),
                ..Pull::new("t", queue_id, 0)
            };
            let (code, message) = error_of(call(&addr, pull.into()));
            assert_eq!(code, ErrorCode::BadFilterExpression, "{expr}: {message}");
            assert!(
                message.contains(&format!("column {column}")),
                "{expr}: {message}"
            );
        }
    }
    let heartbeat = |expression: &str, expression_type: u8| -> Request {
        GroupHeartbeat {
            group: "g".into(),
            client_id: "c".into(),
            subscriptions: vec![SubscriptionData {
                topic: "t".into(),
                expression: expression.into(),
                expression_type,
            }],
            consume_mode: 0,
            message_model: 0,
            strategy: "averagely".into(),
        }
        .into()
    };
    let (code, message) = error_of(call(&addr, heartbeat("a >", EXPRESSION_SQL92)));
    assert_eq!(code, ErrorCode::BadFilterExpression, "{message}");
    assert!(message.contains("column 4"), "{message}");
    let (code, message) = error_of(call(&addr, heartbeat("*", 7)));
    assert_eq!(code, ErrorCode::BadFilterExpression, "{message}");
    assert!(message.contains("unknown expression type 7"), "{message}");
    // Still serving, and the good filter filters.
    let pull = Pull {
        sql: "TAGS IS NULL".into(),
        ..Pull::new("t", 0, 0)
    };
    match call(&addr, pull.into()) {
        Response::Pull(p) => assert_eq!(p.meta().count, 1),
        other => panic!("{other:?}"),
    }
}

/// Each key of a message is an entry of the key index: a message has at most 64
/// (`InvalidMessage` past them, single or in a batch, from a client that does not check;
/// ringmq's client refuses such a message before sending it), so a block of one-letter keys
/// cannot grow the index many times faster than the log. Up to the bound, every key finds
/// it.
#[test]
fn messages_with_more_keys_than_the_bound_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("k", 1).await.unwrap();
        let keys = |n: usize| (0..n).map(|i| format!("k{i}")).collect::<Vec<_>>();
        let many = OutgoingMessage::new("many").with_keys(keys(65));
        let e = producer.send("k", many.clone()).await.unwrap_err();
        assert!(
            matches!(e, ringmq::client::ClientError::InvalidArgument(_)),
            "{e}"
        );
        assert!(e.to_string().contains("65 keys"), "{e}");
        // The broker's own check, for a client that sends them all the same.
        let mut built = ringmq::protocol::record::PropertiesBuilder::new();
        built.put("KEYS", &keys(65).join(" ")).unwrap();
        let properties = built.into_bytes();
        let (code, message) = error_of(call(&addr, send("k", 0, properties.clone(), b"many")));
        assert_eq!(code, ErrorCode::InvalidMessage, "{message}");
        assert!(message.contains("65 keys"), "{message}");
        let (code, message) = error_of(call(&addr, batch_to("k", properties)));
        assert_eq!(code, ErrorCode::InvalidMessage, "{message}");
        let enough = OutgoingMessage::new("enough").with_keys(keys(64));
        producer.send("k", enough).await.unwrap();
        for key in ["k0", "k63"] {
            let found = producer.client().messages_by_key("k", key, 0, i64::MAX, 10);
            let found = found.await.unwrap();
            let bodies: Vec<&[u8]> = found.iter().map(|m| m.body()).collect();
            assert_eq!(bodies, [&b"enough"[..]], "{key}");
        }
    });
}

/// The properties that say where the broker holds a message for (`REAL_TOPIC`, `REAL_QID`,
/// `TIMER_OUT_MS`) or where a retried one came from (`RETRY_TOPIC`) are the broker's own: a
/// send carrying one is refused (`InvalidMessage`, single, batched, delayed or
/// transactional), and ringmq's client refuses such a message before sending it, so a
/// producer cannot make its message pass for another topic's.
#[test]
fn sends_carrying_properties_only_the_broker_sets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("o", 1).await.unwrap();
        for name in ringmq::protocol::record::prop::BROKER_SET {
            let spoofed = OutgoingMessage::new("x").with_property(name, "other");
            let e = producer.send("o", spoofed).await.unwrap_err();
            assert!(
                matches!(e, ringmq::client::ClientError::InvalidArgument(_)),
                "{name}: {e}"
            );
            assert!(e.to_string().contains(name), "{e}");
            // The broker's own check, for a client that sends it all the same: alone, after
            // a delay or a transaction's mark, or in a batch.
            let extras: [&[(&str, &str)]; 3] = [&[], &[("DELAY", "1")], &[("TRAN_MSG", "true")]];
            for extra in extras {
                let mut built = ringmq::protocol::record::PropertiesBuilder::new();
                for (n, v) in extra {
                    built.put(n, v).unwrap();
                }
                built.put(name, "other").unwrap();
                let properties = built.into_bytes();
                let (code, message) = error_of(call(&addr, send("o", 0, properties, b"x")));
                assert_eq!(
                    code,
                    ErrorCode::InvalidMessage,
                    "{name} {extra:?}: {message}"
                );
                assert!(message.contains(name), "{message}");
            }
            let mut built = ringmq::protocol::record::PropertiesBuilder::new();
            built.put(name, "other").unwrap();
            let (code, message) = error_of(call(&addr, batch_to("o", built.into_bytes())));
            assert_eq!(code, ErrorCode::InvalidMessage, "{name} batched: {message}");
        }
        let info = producer.client().describe_topic("o").await.unwrap();
        assert_eq!(info.queues[0].max_offset, 0, "nothing was stored");
        // Nor held: no delayed message, no transaction's half.
        let stats = producer.client().schedule_stats().await.unwrap();
        assert!(stats.iter().all(|s| s.pending == 0), "{stats:?}");
        let halves = producer.client().list_transactions().await.unwrap().halves;
        assert!(halves.is_empty(), "{halves:?}");
        // A property of another name is the producer's to set.
        let own = OutgoingMessage::new("x").with_property("REAL_TOPIC_OF_MINE", "o");
        producer.send("o", own).await.unwrap();
    });
}

/// A frame over the broker's limit whose sender goes on writing its body, behind requests
/// whose answers (12 MiB or more) the client is still taking in: every answer arrives, then the
/// broker's `FrameTooLarge`, not a reset. The broker closed with the client's bytes unread,
/// which has the kernel reset the connection and drop what it had not sent yet (answers
/// and the typed error); now it reads on, discarding, until the client closes (a few
/// seconds at most).
#[test]
fn a_frame_over_the_limit_is_refused_with_its_error_while_the_client_writes_on() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("t", 1).await.unwrap();
        for i in 0..4u8 {
            let m = OutgoingMessage::new(vec![i; 1 << 20]);
            producer.send("t", m).await.unwrap();
        }
    });
    let pulls = 4;
    let mut oversize = Vec::new();
    // Over the default limit (about 5 MiB).
    let request = Request::SendMessage(send_to("t", 0, vec![7u8; 8 << 20]));
    encode_request(&request, 99, &mut oversize).unwrap();
    let mut conn = TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut writing = conn.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for id in 0..pulls {
            let mut out = Vec::new();
            encode_request(&Request::Pull(Pull::new("t", 0, 0)), id, &mut out).unwrap();
            writing.write_all(&out).unwrap();
        }
        // The whole frame and more, as a client that does not look at answers would.
        let _ = writing.write_all(&oversize);
        let _ = writing.write_all(&oversize);
    });
    // A slow reader: it starts reading once its socket's receive buffer is about full of
    // answers (about 124 KiB here), so more wait in the broker's when it closes.
    common::eventually("the receive buffer about full of answers", || {
        common::raw::queued_bytes(&conn) >= 96 << 10
    });
    let answers = common::raw::read_answers(&mut conn, pulls as usize + 1);
    for (id, answer) in &answers[..pulls as usize] {
        assert!(
            matches!(answer, Response::Pull(p) if p.meta().count >= 3),
            "{id}"
        );
    }
    let (_, last) = answers.into_iter().last().unwrap();
    let (code, message) = error_of(last);
    assert_eq!(code, ErrorCode::FrameTooLarge, "{message}");
    drop(conn);
    writer.join().unwrap();
}
