//! The broker's caps on what clients can make it hold, against the real binary: topics (all,
//! and those auto-create made), consumer groups per shard (membership and committed
//! offsets) and per connection. Past each a typed `LimitReached` error names the flag;
//! deleting a topic or a group frees a place, also across a restart. And the memory the
//! operator gives the shards' tail caches, capped by the machine's.

mod common;

use common::broker::BrokerProcess;
use common::{refused as code, runtime};
use ringmq::client::{Client, ClientConfig, ClientError, MemberSpec, OutgoingMessage, Producer};
use ringmq::protocol::route::coordinator_shard;
use ringmq::protocol::ErrorCode;

#[test]
fn topics_past_the_caps_are_refused_until_one_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--topics-max", "4", "--auto-create-topics-max", "2"],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client();
        for t in ["auto1", "auto2"] {
            producer
                .send(t, OutgoingMessage::new(b"x".to_vec()))
                .await
                .unwrap();
        }
        let (c, m) = code(
            producer
                .send("auto3", OutgoingMessage::new(b"x".to_vec()))
                .await,
        );
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        assert!(m.contains("--auto-create-topics-max"), "{m}");
        // Explicit creation is still allowed, up to the broker's topic cap.
        client.create_topic("made1", 2).await.unwrap();
        client.create_topic("made2", 2).await.unwrap();
        let (c, m) = code(client.create_topic("made3", 2).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        assert!(m.contains("--topics-max"), "{m}");
        // Deleting an auto-created topic frees a place of both kinds.
        client.delete_topic("auto1").await.unwrap();
        producer
            .send("auto3", OutgoingMessage::new(b"x".to_vec()))
            .await
            .unwrap();
        let (c, _) = code(client.create_topic("made3", 2).await);
        assert_eq!(c, ErrorCode::LimitReached);
        assert_eq!(client.list_topics().await.unwrap().len(), 4);
    });
    // The count of auto-created topics survives a restart.
    let mut broker = broker;
    assert!(broker.stop());
    broker.restart();
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().delete_topic("made2").await.unwrap();
        let (c, m) = code(
            producer
                .send("auto4", OutgoingMessage::new(b"x".to_vec()))
                .await,
        );
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        producer.client().create_topic("made3", 1).await.unwrap();
    });
}

/// `count` group names that shard `shard` of `shards` coordinates.
fn groups_on(shard: u32, shards: u32, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("g{i}"))
        .filter(|g| coordinator_shard(g, shards) == shard)
        .take(count)
        .collect()
}

#[test]
fn groups_past_the_cap_are_refused_and_a_deleted_group_frees_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start(&dir.path().join("data"), 2, &["--groups-max", "2"]);
    let addr = broker.addr_string();
    let names = groups_on(0, 2, 3);
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("t", 1).await.unwrap();
        // Committed offsets: two groups fit on the queue's shard, the third does not.
        client.commit_offset(&names[0], "t", 0, 0).await.unwrap();
        client.commit_offset(&names[1], "t", 0, 0).await.unwrap();
        let (c, m) = code(client.commit_offset(&names[2], "t", 0, 0).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        assert!(m.contains("--groups-max"), "{m}");
        // Membership: two groups on one coordinator, the third is refused.
        let member = MemberSpec {
            subscriptions: vec![("t".into(), "*".into())],
            ..MemberSpec::default()
        };
        client.group_heartbeat(&names[0], &member).await.unwrap();
        client.group_heartbeat(&names[1], &member).await.unwrap();
        let (c, m) = code(client.group_heartbeat(&names[2], &member).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        // Refused, a member subscribed to its group's retry topic leaves no such topic
        // behind (each is kept, and counts against --topics-max).
        let retry = format!("%RETRY%{}", names[2]);
        let with_retry = MemberSpec {
            subscriptions: vec![("t".into(), "*".into()), (retry.clone(), "*".into())],
            ..MemberSpec::default()
        };
        let (c, m) = code(client.group_heartbeat(&names[2], &with_retry).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        let topics = client.list_topics().await.unwrap();
        assert!(!topics.contains(&retry), "{topics:?}");
        // A group with live members cannot be deleted.
        let (c, m) = code(client.delete_group(&names[0]).await);
        assert_eq!(c, ErrorCode::Conflict, "{m}");
        client.unregister(&names[0]).await.unwrap();
        client.delete_group(&names[0]).await.unwrap();
        assert_eq!(client.query_offset(&names[0], "t", 0).await.unwrap(), None);
        client.commit_offset(&names[2], "t", 0, 0).await.unwrap();
        client
            .group_heartbeat(&names[2], &with_retry)
            .await
            .unwrap();
        let topics = client.list_topics().await.unwrap();
        assert!(topics.contains(&retry), "admitted, it has one: {topics:?}");
    });
    assert!(broker.stop());
    broker.restart();
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        assert_eq!(client.query_offset(&names[0], "t", 0).await.unwrap(), None);
        assert_eq!(
            client.query_offset(&names[2], "t", 0).await.unwrap(),
            Some(0)
        );
        let (c, _) = code(client.commit_offset(&names[0], "t", 0, 0).await);
        assert_eq!(c, ErrorCode::LimitReached, "still two groups with offsets");
    });
}

#[test]
fn one_connection_carries_members_of_at_most_64_groups() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("t", 1).await.unwrap();
        let member = MemberSpec {
            subscriptions: vec![("t".into(), "*".into())],
            ..MemberSpec::default()
        };
        for i in 0..64 {
            client
                .group_heartbeat(&format!("g{i}"), &member)
                .await
                .unwrap();
        }
        let (c, m) = code(client.group_heartbeat("g64", &member).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        // Groups it is in already keep working.
        client.group_heartbeat("g3", &member).await.unwrap();
        // Another connection is not affected.
        let other = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        other.group_heartbeat("g64", &member).await.unwrap();
    });
}

/// Group members count their bytes (ids, subscriptions, strategies) against
/// `--group-members-mb` on their coordinator: a heartbeat that would join or grow a member
/// past it is refused with a typed error naming the flag, members already in keep
/// refreshing, and a member that leaves frees its bytes.
#[test]
fn group_members_past_the_shards_memory_budget_are_refused_until_one_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        1,
        &["--group-members-mb", "1", "--groups-max", "2"],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        // About 620 KB held: one fits in 1 MiB, two do not.
        let tag = "x".repeat(3000);
        let large = MemberSpec {
            subscriptions: (0..200)
                .map(|i| (format!("t{i}"), tag.as_str().into()))
                .collect(),
            ..MemberSpec::default()
        };
        let small = MemberSpec {
            subscriptions: vec![("t0".into(), "*".into())],
            ..MemberSpec::default()
        };
        client.group_heartbeat("a", &large).await.unwrap();
        let (c, m) = code(client.group_heartbeat("b", &large).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        assert!(m.contains("--group-members-mb"), "{m}");
        // The refused group was not kept: another takes the second place under
        // --groups-max, and gives it back.
        client.group_heartbeat("c", &small).await.unwrap();
        client.unregister("c").await.unwrap();
        client.delete_group("c").await.unwrap();
        // What is in goes on, and a member that still fits joins.
        client.group_heartbeat("a", &large).await.unwrap();
        client.group_heartbeat("b", &small).await.unwrap();
        // A member may not grow past it either; it stays in as it was (until its session
        // ends, unless it heartbeats as it was).
        let (c, m) = code(client.group_heartbeat("b", &large).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        assert_eq!(client.group_members("b").await.unwrap().members.len(), 1);
        client.group_heartbeat("b", &small).await.unwrap();
        // a leaves: its bytes are free for b.
        client.unregister("a").await.unwrap();
        client.group_heartbeat("b", &large).await.unwrap();
        let (c, _) = code(client.group_heartbeat("a", &large).await);
        assert_eq!(c, ErrorCode::LimitReached, "b holds them now");
    });
}

#[test]
fn queues_of_all_topics_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &["--queues-max", "10"]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("a", 4).await.unwrap();
        client.create_topic("b", 4).await.unwrap();
        let (c, m) = code(client.create_topic("c", 4).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        assert!(m.contains("--queues-max"), "{m}");
        let (c, _) = code(client.update_topic("b", 8).await);
        assert_eq!(c, ErrorCode::LimitReached, "growing a topic counts too");
        // A deleted topic frees its queues.
        client.delete_topic("a").await.unwrap();
        client.create_topic("c", 2).await.unwrap();
        client.update_topic("c", 6).await.unwrap();
    });
}

/// Memory maps and open descriptors of the broker on consume-queue files of `topic`.
fn index_files_held(broker: &BrokerProcess, topic: &str) -> (usize, usize) {
    let pid = broker.pid().expect("the broker runs");
    let needle = format!("/consumequeue/{topic}/");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.contains(&needle))
        .count();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains(&needle))
        .count();
    (maps, fds)
}

#[test]
fn idle_queues_hold_no_mapped_files_or_descriptors() {
    const QUEUES: u32 = 256;
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &["--index-idle-close-ms", "4000"],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer
            .client()
            .create_topic("idle", QUEUES)
            .await
            .unwrap();
        let sends: Vec<_> = (0..2 * QUEUES)
            .map(|i| producer.send_async("idle", OutgoingMessage::new(format!("m{i}"))))
            .collect();
        for send in sends {
            send.await.unwrap();
        }
    });
    // Just written: mapped (a file is closed only after a whole idle period unused), and
    // no descriptor kept open for it. Each shard's checkpoint opens the files it syncs one
    // at a time, for the sync's length, and a spare is opened while it is made (both off
    // the shards' threads, so at any moment after the sends): 256 files mapped with a
    // descriptor each would show 256, work under way a few, and none once it is done.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        let (maps, fds) = index_files_held(&broker, "idle");
        assert!(maps > 0, "the queues just written are mapped");
        if fds == 0 {
            break;
        }
        assert!(
            fds <= 4 && std::time::Instant::now() < deadline,
            "a mapped file holds no descriptor beyond a sync's: {fds} held"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Idle: every file is unmapped.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while index_files_held(&broker, "idle") != (0, 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "still held after 20 s: {:?}",
            index_files_held(&broker, "idle")
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let read_all = |addr: String| {
        runtime().block_on(async move {
            let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
            let mut bodies = Vec::new();
            for q in 0..QUEUES {
                let pulled = client
                    .pull("idle", q, 0, 32, std::time::Duration::ZERO, &[])
                    .await
                    .unwrap();
                bodies.extend(pulled.messages.iter().map(|m| m.body().to_vec()));
            }
            bodies.sort();
            bodies
        })
    };
    let mut expected: Vec<Vec<u8>> = (0..2 * QUEUES)
        .map(|i| format!("m{i}").into_bytes())
        .collect();
    expected.sort();
    // A closed file maps again on use: every message is served.
    assert_eq!(read_all(addr), expected);
    assert!(index_files_held(&broker, "idle").0 > 0);

    // A restart opens the queues without mapping their files.
    broker.stop();
    broker.restart();
    assert_eq!(index_files_held(&broker, "idle"), (0, 0));
    assert_eq!(read_all(broker.addr_string()), expected);
}

#[test]
fn a_creation_refused_part_way_leaves_no_queues_behind() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = BrokerProcess::start(&data, 1, &[]);
    // Queue 2's directory cannot be made: queues 0, 1 and 3 open, then the creation fails.
    let topic_dir = data.join("shard-0").join("consumequeue").join("blocked");
    std::fs::create_dir_all(&topic_dir).unwrap();
    std::fs::write(topic_dir.join("2"), b"not a directory").unwrap();
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        let (c, m) = code(client.create_topic("blocked", 4).await);
        assert_eq!(c, ErrorCode::StoreIo, "{m}");
        assert!(m.contains("blocked"), "{m}");
        assert!(
            !topic_dir.exists(),
            "the queues opened before the failure are removed: {:?}",
            std::fs::read_dir(&topic_dir).map(|d| d.count())
        );
        assert!(!client
            .list_topics()
            .await
            .unwrap()
            .iter()
            .any(|t| t == "blocked"));
        // Nothing is left in the way of creating it again.
        client.create_topic("blocked", 4).await.unwrap();
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer
            .send("blocked", OutgoingMessage::new(b"after".to_vec()))
            .await
            .unwrap();
        let bodies = bodies_of(&client, "blocked", 4).await;
        assert_eq!(bodies, vec![b"after".to_vec()]);
    });
}

/// Queues recovery found on disk for a topic the table does not name (its table lost) are
/// not a refused creation's to remove: their messages stay readable once it is created.
#[test]
fn a_refused_creation_keeps_the_queues_recovery_found() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = BrokerProcess::start(&data, 1, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("kept", 2).await.unwrap();
        for i in 0..4 {
            producer
                .send("kept", OutgoingMessage::new(format!("m{i}")))
                .await
                .unwrap();
        }
    });
    assert!(broker.stop());
    std::fs::remove_file(data.join("topics.json")).unwrap();
    let topic_dir = data.join("shard-0").join("consumequeue").join("kept");
    broker.restart();
    std::fs::write(topic_dir.join("3"), b"not a directory").unwrap();
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        assert!(!client
            .list_topics()
            .await
            .unwrap()
            .contains(&"kept".to_owned()));
        let (c, m) = code(client.create_topic("kept", 4).await);
        assert_eq!(c, ErrorCode::StoreIo, "{m}");
        for q in ["0", "1"] {
            assert!(topic_dir.join(q).is_dir(), "queue {q} is kept");
        }
        std::fs::remove_file(topic_dir.join("3")).unwrap();
        client.create_topic("kept", 4).await.unwrap();
        let mut bodies = bodies_of(&client, "kept", 4).await;
        bodies.sort();
        let expected: Vec<Vec<u8>> = (0..4).map(|i| format!("m{i}").into_bytes()).collect();
        assert_eq!(bodies, expected);
    });
}

/// The bodies of the first 32 messages of each of `topic`'s first `queues` queues, queue by
/// queue.
async fn bodies_of(client: &Client, topic: &str, queues: u32) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    for q in 0..queues {
        let pulled = client
            .pull(topic, q, 0, 32, std::time::Duration::ZERO, &[])
            .await
            .unwrap();
        bodies.extend(pulled.messages.iter().map(|m| m.body().to_vec()));
    }
    bodies
}

/// A connection at its limit of requests in flight (here 1,024 long polls) has its next
/// request handled only once one of them ends. A send it carries after them, to a topic
/// the shard must first create, therefore holds no place in that topic's line of sends
/// meanwhile: a send to the topic on another connection is stored at once, not after the
/// polls end; the held send is stored once a poll ends, after it.
#[test]
fn a_connection_at_its_in_flight_limit_holds_up_no_other_connections_send() {
    use ringmq::protocol::{encode_request, Response};
    use std::io::Write;
    use std::time::{Duration, Instant};
    const POLL_MS: u32 = 8_000;
    let dir = tempfile::tempdir().unwrap();
    let (broker, metrics) = broker_with_idle_topic(dir.path(), 1, &[]);
    let addr = broker.addr_string();
    let send = |body: &str| common::raw::send_to("fresh", 0, body);
    let mut held = std::net::TcpStream::connect(&addr).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut out = long_polls(1024, 1, POLL_MS);
    encode_request(&send("held").into(), 5_000, &mut out).unwrap();
    held.write_all(&out).unwrap();
    let polls = |n: f64| n >= 1024.0;
    wait_metric(
        &metrics,
        "ringmq_requests_total",
        &[("kind", "Pull")],
        polls,
    );
    let started = Instant::now();
    match common::raw::call(&addr, send("other").into()) {
        Response::SendResult(r) => assert_eq!(r.queue_offset, 0),
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_millis(u64::from(POLL_MS) / 2),
        "the send waited {:?}, behind the other connection's",
        started.elapsed()
    );
    let answers = common::raw::read_answers(&mut held, 1025);
    let stored = answers.iter().find(|(id, _)| *id == 5_000);
    match stored {
        Some((_, Response::SendResult(r))) => assert_eq!(r.queue_offset, 1),
        other => panic!("{other:?}"),
    }
}

/// A broker of `shards` shards (with `extra` flags) publishing its metrics (at the address
/// returned) with a topic "idle" of one queue per shard, for long polls that wait.
fn broker_with_idle_topic(
    dir: &std::path::Path,
    shards: usize,
    extra: &[&str],
) -> (BrokerProcess, String) {
    let metrics = common::free_addr().to_string();
    let mut args = vec!["--metrics-listen", &metrics];
    args.extend_from_slice(extra);
    let broker = BrokerProcess::start(&dir.join("data"), shards, &args);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("idle", shards as u32).await.unwrap();
    });
    (broker, metrics)
}

/// `n` pulls of "idle", over its first `queues` queues in turn, that wait up to `poll_ms`
/// each, encoded (request ids 0..n).
fn long_polls(n: u64, queues: u32, poll_ms: u32) -> Vec<u8> {
    use ringmq::protocol::{encode_request, Pull};
    let mut out = Vec::new();
    for id in 0..n {
        let poll = Pull {
            max_wait_ms: poll_ms,
            ..Pull::new("idle", (id % u64::from(queues)) as u32, 0)
        };
        encode_request(&poll.into(), id, &mut out).unwrap();
    }
    out
}

/// Waits until metric `name`, summed over the samples labelled `want`, meets `done`.
fn wait_metric(metrics: &str, name: &str, want: &[(&str, &str)], done: impl Fn(f64) -> bool) {
    use common::eventually;
    use common::metrics::{scrape_any, sum};
    eventually(name, || done(sum(&scrape_any(metrics), name, want)));
}

/// A connection at its in-flight limit reads nothing until one of its requests ends (here,
/// long polls of 20 s). Closed by its peer meanwhile, it is let go at once: it leaves the
/// broker's connections (and its members their groups) well before the polls end.
#[test]
fn a_connection_closed_at_its_in_flight_limit_is_let_go_before_its_requests_end() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    const POLL_MS: u32 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let (broker, metrics) = broker_with_idle_topic(dir.path(), 1, &[]);
    let addr = broker.addr_string();
    let mut held = std::net::TcpStream::connect(&addr).unwrap();
    let out = long_polls(1024, 1, POLL_MS);
    held.write_all(&out).unwrap();
    wait_metric(
        &metrics,
        "ringmq_requests_total",
        &[("kind", "Pull")],
        |n| n >= 1024.0,
    );
    wait_metric(&metrics, "ringmq_connections_open", &[], |n| n == 1.0);
    let closed = Instant::now();
    drop(held);
    wait_metric(&metrics, "ringmq_connections_open", &[], |n| n == 0.0);
    assert!(
        closed.elapsed() < Duration::from_millis(u64::from(POLL_MS) / 2),
        "let go after {:?}",
        closed.elapsed()
    );
}

/// A long poll ends with its connection: a connection closed by its peer while its polls
/// of 20 s wait is let go at once, and its place under `--connections-max` with it (the
/// place used to be held until the polls ended, as the connection waited for their
/// answers). With two shards one of the polls is held for the other shard's queue: told
/// of the close, that shard ends it too (no request is left in flight on any shard).
#[test]
fn a_long_poll_ends_with_its_connection_and_frees_the_connections_place() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    const POLL_MS: u32 = 20_000;
    for shards in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let (broker, metrics) =
            broker_with_idle_topic(dir.path(), shards, &["--connections-max", "1"]);
        let addr = broker.addr_string();
        // The set-up's connection may hold the one place a moment longer.
        let mut held = common::raw::served_connection(&addr);
        let polls = shards as u64;
        held.write_all(&long_polls(polls, shards as u32, POLL_MS))
            .unwrap();
        // Waiting on the owning shards (a forwarded one counts there).
        let waiting = move |n: f64| n >= polls as f64;
        wait_metric(&metrics, "ringmq_requests_in_flight", &[], waiting);
        let errors = || {
            let s = common::metrics::scrape(&metrics);
            common::metrics::sum(&s, "ringmq_errors_total", &[])
        };
        let errors_before = errors();
        let closed = Instant::now();
        drop(held);
        // Served once the place is free; refused (TooManyConnections) until then.
        drop(common::raw::served_connection(&addr));
        assert!(
            closed.elapsed() < Duration::from_millis(u64::from(POLL_MS) / 2),
            "{shards} shards: the place was held for {:?}",
            closed.elapsed()
        );
        wait_metric(&metrics, "ringmq_requests_in_flight", &[], |n| n == 0.0);
        assert!(
            closed.elapsed() < Duration::from_millis(u64::from(POLL_MS) / 2),
            "{shards} shards: the polls were held for {:?}",
            closed.elapsed()
        );
        // Ended by the close: no answer, and no error of the broker's.
        assert_eq!(errors(), errors_before, "{shards} shards");
    }
}

/// `--tail-cache-mb` sizes the memory that serves pulls of the newest writes: with the
/// default (64 MiB a shard) 8 MiB just sent are pulled back without a disk read; with 0
/// every pull reads the disk, and still returns every message in order. A size whose
/// shards together would take more than half of the machine's memory is lowered to that at
/// start, with a line naming the option.
#[test]
fn the_tail_cache_serves_pulls_from_memory_as_sized_and_is_fitted_to_the_machines_memory() {
    let dir = tempfile::tempdir().unwrap();
    for (cache_mb, from_disk) in [("64", false), ("0", true)] {
        let data = dir.path().join(format!("data-{cache_mb}"));
        let broker = BrokerProcess::start(&data, 1, &["--tail-cache-mb", cache_mb]);
        runtime().block_on(async {
            let producer = Producer::connect(ClientConfig::new(broker.addr_string()))
                .await
                .unwrap();
            let client = producer.client();
            client.create_topic("t", 1).await.unwrap();
            let sent: Vec<Vec<u8>> = (0..8192u32)
                .map(|i| format!("{i:08}").into_bytes().repeat(128))
                .collect();
            for chunk in sent.chunks(64) {
                let batch = chunk.iter().map(|b| OutgoingMessage::new(b.clone()));
                producer.send_batch("t", batch.collect()).await.unwrap();
            }
            let before = broker.disk_read_bytes();
            let mut got = Vec::new();
            while got.len() < sent.len() {
                let pulled = client
                    .pull("t", 0, got.len() as u64, 32, std::time::Duration::ZERO, &[])
                    .await
                    .unwrap();
                assert!(!pulled.messages.is_empty(), "at {}", got.len());
                got.extend(pulled.messages.iter().map(|m| m.body().to_vec()));
            }
            assert!(got == sent, "tail cache {cache_mb} MiB: not what was sent");
            // Reads are counted when they reach the disk: O_DIRECT, which a filesystem such
            // as tmpfs refuses (the log then reads through the page cache).
            let buffered = broker.stderr().contains("does not support O_DIRECT");
            let (Some(before), Some(after), false) = (before, broker.disk_read_bytes(), buffered)
            else {
                eprintln!("disk reads not counted here (no I/O accounting, or no O_DIRECT)");
                return;
            };
            let read = after - before;
            if from_disk {
                assert!(read >= 8 << 20, "no cache: {read} bytes read from the disk");
            } else {
                assert!(read < 1 << 20, "cached: {read} bytes read from the disk");
            }
        });
    }
    // Too large for the machine: lowered to at most half of its memory (less under a
    // cgroup limit) over the shards, said so.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let huge = (u64::MAX >> 21).to_string();
    let data = dir.path().join("data-huge");
    let mut broker = BrokerProcess::start(&data, 2, &["--tail-cache-mb", &huge]);
    assert!(broker.stop(), "stopped cleanly");
    let stderr = broker.stderr();
    let said = format!("tail-cache-mb {huge} for each of 2 shards");
    let line = stderr.lines().find(|l| l.contains(&said));
    let fit_mb: u64 = line
        .and_then(|l| {
            l.strip_suffix(" MiB each")?
                .rsplit(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no line lowering the tail cache: {stderr}"));
    assert!(
        fit_mb > 0 && fit_mb <= (mem_kib * 1024 / 4) >> 20,
        "{fit_mb} MiB each of 2 shards, {mem_kib} KiB of memory"
    );
}

/// A restart reads the transactions still unresolved, not every half message the log
/// holds: the resolved ones (here 40 MiB of them) stay in the log until retention, and a
/// start that read them all (into memory, before) could not end on a busy broker's data.
#[test]
fn a_restart_reads_only_the_unresolved_transactions() {
    use ringmq::client::{TransactionOutcome, TransactionProducer};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = BrokerProcess::start(&data, 1, &[]);
    let body = "x".repeat(128 << 10);
    runtime().block_on(async {
        let tp = TransactionProducer::start(ClientConfig::new(broker.addr_string()), "g", |_| {
            TransactionOutcome::Unknown
        })
        .await
        .unwrap();
        tp.producer().client().create_topic("t", 1).await.unwrap();
        for i in 0..320 {
            let m = OutgoingMessage::new(format!("{i}-{body}"));
            let sent = tp
                .send_in_transaction("t", m, |_| TransactionOutcome::Commit)
                .await
                .unwrap();
            assert!(sent.end_error.is_none(), "{:?}", sent.end_error);
        }
        let m = OutgoingMessage::new(format!("open-{body}"));
        let open = tp.send_in_transaction("t", m, |_| TransactionOutcome::Unknown);
        assert!(open.await.unwrap().end_error.is_none());
        tp.shutdown().await;
    });
    assert!(broker.stop(), "a clean stop");
    broker.restart();
    let read = broker.disk_read_bytes();
    if broker.stderr().contains("does not support O_DIRECT") || read.is_none() {
        eprintln!("disk reads not counted here (no I/O accounting, or no O_DIRECT)");
        return;
    }
    // The log holds the 321 halves and the 320 commits' copies, ~80 MiB; the start reads
    // it about once over (the log's own recovery) and the halves not again (it read them
    // all a second time: 2.06 times the log here, 1.05 times after).
    let stored = 641 * body.len() as u64;
    let read = read.unwrap_or(0);
    assert!(
        read < stored * 3 / 2,
        "{read} bytes read from the disk to start, {stored} stored"
    );
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let list = client.list_transactions().await.unwrap();
        assert_eq!(list.halves.len(), 1, "the open one, recovered");
    });
}

#[test]
fn a_producer_group_that_leaves_its_transactions_open_blocks_only_its_own() {
    use ringmq::client::{SendResult, TransactionOutcome, TransactionProducer};
    let dir = tempfile::tempdir().unwrap();
    let limits = [
        "--transaction-pending-max",
        "6",
        "--transaction-group-pending-max",
        "4",
    ];
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &limits);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let start = async |group: &str| {
            TransactionProducer::start(ClientConfig::new(&addr), group, |_| {
                TransactionOutcome::Unknown
            })
            .await
            .unwrap()
        };
        // A half message its local transaction does not end.
        let open = async |tp: &TransactionProducer, i: usize| -> Result<SendResult, ClientError> {
            let m = OutgoingMessage::new(format!("{i}"));
            let sent = tp.send_in_transaction("t", m, |_| TransactionOutcome::Unknown);
            sent.await.map(|s| s.send)
        };
        let gone = start("gone").await;
        gone.producer().client().create_topic("t", 1).await.unwrap();
        for i in 0..4 {
            open(&gone, i).await.unwrap();
        }
        let (c, why) = code(open(&gone, 4).await);
        assert_eq!(c, ErrorCode::LimitReached, "{why}");
        assert!(
            why.contains("producer group gone") && why.contains("--transaction-group-pending-max"),
            "{why}"
        );
        // The group goes, its four transactions open: the other groups still have the
        // rest of the shard's allowance.
        gone.shutdown().await;
        let other = start("other").await;
        let first = open(&other, 0).await.unwrap();
        open(&other, 1).await.unwrap();
        let (c, why) = code(open(&other, 2).await);
        assert_eq!(c, ErrorCode::LimitReached, "{why}");
        assert!(why.contains("--transaction-pending-max"), "{why}");
        // An ended transaction frees its place.
        let tid = first.transaction_id;
        (other.end("t", first.queue_id, tid, TransactionOutcome::Commit, false))
            .await
            .unwrap();
        open(&other, 3).await.unwrap();
        let list = other.producer().client().list_transactions().await.unwrap();
        let of = |g: &str| list.halves.iter().filter(|h| h.producer_group == g).count();
        assert_eq!((of("gone"), of("other")), (4, 2));
        other.shutdown().await;
    });
}

/// Queue locks are kept for at most `--groups-max` groups a shard (anyone may lock under
/// any group name, member or not): past it a lock under a new group is refused with
/// `LimitReached`, the groups holding locks renew them, and a group whose locks are given
/// up frees its place.
#[test]
fn queue_locks_of_groups_past_the_cap_are_refused_until_one_is_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &["--groups-max", "3"]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("locked", 2).await.unwrap();
        for g in ["l0", "l1", "l2"] {
            assert_eq!(
                client.lock_batch(g, "locked", &[0, 1]).await.unwrap(),
                [0, 1]
            );
        }
        let (c, m) = code(client.lock_batch("l3", "locked", &[0]).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
        assert!(m.contains("--groups-max"), "{m}");
        // Renewals of the groups holding locks go on.
        assert_eq!(client.lock_batch("l1", "locked", &[1]).await.unwrap(), [1]);
        client.unlock_batch("l0", "locked", &[0, 1]).await.unwrap();
        assert_eq!(client.lock_batch("l3", "locked", &[0]).await.unwrap(), [0]);
    });
}

/// A lock request over queues of two shards, one of which has no room for the group's
/// locks: the other shard's queues are answered as held (they are), not an error that
/// would leave them locked for a client that took them for none held.
#[test]
fn a_lock_request_one_shard_refuses_answers_what_the_others_granted() {
    use ringmq::protocol::route::owner;
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &["--groups-max", "1"]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("split", 8).await.unwrap();
        let on =
            |shard| -> Vec<u32> { (0..8).filter(|&q| owner("split", q, 2) == shard).collect() };
        let (full, free) = (on(0), on(1));
        assert!(!full.is_empty() && !free.is_empty());
        // Shard 0 holds locks of one group: its limit.
        assert_eq!(
            client.lock_batch("first", "split", &full).await.unwrap(),
            full
        );
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(
            client.lock_batch("second", "split", &all).await.unwrap(),
            free
        );
        let (c, m) = code(client.lock_batch("second", "split", &full).await);
        assert_eq!(c, ErrorCode::LimitReached, "{m}");
    });
}

/// More unresolved transactions than one answer lists (it must fit a frame): the oldest
/// 1,000 are listed, in order of shard and id, and all are counted.
#[test]
fn a_long_list_of_unresolved_transactions_shows_the_oldest_and_counts_all() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        use ringmq::client::{TransactionOutcome, TransactionProducer};
        let unsure = |_: &ringmq::client::Message| TransactionOutcome::Unknown;
        let tp = TransactionProducer::start(ClientConfig::new(&addr), "txl", unsure)
            .await
            .unwrap();
        let client = tp.producer().client().clone();
        client.create_topic("tx-long", 2).await.unwrap();
        let mut sent = Vec::new();
        for i in 0..1_100 {
            let m = OutgoingMessage::new(format!("m-{i}"));
            let s = tp.send_in_transaction("tx-long", m, |_| TransactionOutcome::Unknown);
            let s = s.await.unwrap().send;
            sent.push((s.queue_id, s.transaction_id));
        }
        let list = client.list_transactions().await.unwrap();
        assert_eq!(list.unresolved, 1_100);
        assert_eq!(list.halves.len(), 1_000);
        let listed: Vec<(u32, u64)> = list
            .halves
            .iter()
            .map(|h| (h.queue_id, h.transaction_id))
            .collect();
        let by_shard: Vec<(u32, u64)> = list
            .halves
            .iter()
            .map(|h| (h.shard, h.transaction_id))
            .collect();
        assert!(
            by_shard.windows(2).all(|w| w[0] < w[1]),
            "in order of shard and id"
        );
        // The newest are the ones left out (ages are in ms: a few at the edge may tie).
        let newest = &sent[sent.len() - 50..];
        assert!(
            newest.iter().all(|s| !listed.contains(s)),
            "a newest one listed"
        );
        assert!(
            sent[..50].iter().all(|s| listed.contains(s)),
            "an oldest one left out"
        );
        tp.shutdown().await;
    });
}
