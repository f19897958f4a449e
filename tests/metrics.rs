//! The broker's Prometheus endpoint against the real binary: `/metrics` parsed by a real
//! Prometheus text parser, with values that match what the test did (N messages sent →
//! the stored counter is N; a group behind by K on a queue → lag K; every send's
//! acknowledgement in the latency histogram), and a clear error when the address is taken.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::broker::BrokerProcess;
use common::eventually;
use common::metrics::{scrape, sum};
use common::{free_port, runtime};
use prometheus_parse::Value;
use ringmq::client::{
    Client, ClientConfig, MemberSpec, OutgoingMessage, Producer, TransactionOutcome,
    TransactionProducer,
};

/// A broker of `shards` in `dir` with its metrics endpoint on a free port (its address
/// answered) and `flags` besides.
fn broker_with_metrics(
    dir: &std::path::Path,
    shards: usize,
    flags: &[&str],
) -> (BrokerProcess, String) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--metrics-listen", metrics.as_str()];
    args.extend_from_slice(flags);
    let broker = BrokerProcess::start(&dir.join("data"), shards, &args);
    (broker, metrics)
}

#[test]
fn metrics_match_what_was_sent_and_how_far_a_group_is_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, metrics) = broker_with_metrics(dir.path(), 2, &[]);
    let addr = broker.addr_string();
    const N: u32 = 50;
    let maxes = runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("m", 4).await.unwrap();
        for i in 0..N {
            producer
                .send("m", OutgoingMessage::new(format!("m{i}")))
                .await
                .unwrap();
        }
        let info = client.describe_topic("m").await.unwrap();
        // The group has read everything but the last 3 messages of queue 0.
        for q in &info.queues {
            let behind = if q.queue_id == 0 { 3 } else { 0 };
            client
                .commit_offset("g", "m", q.queue_id, q.max_offset - behind)
                .await
                .unwrap();
        }
        let pulled = client
            .pull("m", 0, 0, 32, Duration::ZERO, &[])
            .await
            .unwrap();
        assert!(!pulled.messages.is_empty());
        // One error answer, counted by its code.
        assert!(client
            .pull("nope", 0, 0, 32, Duration::ZERO, &[])
            .await
            .is_err());
        info.queues.iter().map(|q| q.max_offset).collect::<Vec<_>>()
    });
    assert!(maxes[0] >= 3);
    // Each shard publishes its figures about once a second, on its own: a scrape showing
    // what the test did last on each (the N stored, the error answer, the commits, the
    // pull) is waited for, and the rest checked on it.
    let mut s = scrape(&metrics);
    eventually("a scrape with everything the test did", || {
        s = scrape(&metrics);
        sum(&s, "ringmq_messages_stored_total", &[("topic", "m")]) == f64::from(N)
            && sum(&s, "ringmq_errors_total", &[("code", "TopicNotFound")]) == 1.0
            && sum(
                &s,
                "ringmq_consumer_lag_messages",
                &[("group", "g"), ("topic", "m")],
            ) == 3.0
            && sum(&s, "ringmq_pull_messages_total", &[]) >= 1.0
    });
    assert_eq!(
        sum(
            &s,
            "ringmq_consumer_lag_messages",
            &[("group", "g"), ("topic", "m"), ("queue", "0")]
        ),
        3.0
    );
    assert_eq!(
        sum(
            &s,
            "ringmq_consumer_lag_messages",
            &[("group", "g"), ("topic", "m")]
        ),
        3.0
    );
    assert!(sum(&s, "ringmq_bytes_stored_total", &[("topic", "m")]) > f64::from(N) * 96.0);
    assert!(sum(&s, "ringmq_pull_messages_total", &[]) >= 1.0);
    assert_eq!(
        sum(&s, "ringmq_errors_total", &[("code", "TopicNotFound")]),
        1.0
    );
    assert!(sum(&s, "ringmq_requests_total", &[("kind", "SendMessage")]) >= f64::from(N));
    for gauge in [
        "ringmq_connections_open",
        "ringmq_locks_held",
        "ringmq_schedule_pending",
        "ringmq_schedule_wheel_entries",
        "ringmq_retention_held",
        "ringmq_checkpoint_held",
    ] {
        assert!(s.samples.iter().any(|x| x.metric == gauge), "{gauge}");
    }
    assert!(sum(&s, "ringmq_disk_free_bytes", &[]) > 0.0);
    assert!(sum(&s, "ringmq_commitlog_bytes", &[]) > 0.0);
    let age = sum(&s, "ringmq_commitlog_oldest_record_age_seconds", &[]);
    assert!((0.0..600.0).contains(&age), "{age}");
    // Every acknowledgement is in the histogram, with buckets that add up.
    let acks: Vec<_> = s
        .samples
        .iter()
        .filter(|x| x.metric == "ringmq_send_ack_seconds")
        .collect();
    assert_eq!(acks.len(), 2, "one histogram per shard");
    let mut count = 0.0;
    for h in acks {
        let Value::Histogram(buckets) = &h.value else {
            panic!("{h:?}")
        };
        let inf = buckets.iter().find(|b| b.less_than.is_infinite()).unwrap();
        count += inf.count;
    }
    assert!(count >= f64::from(N), "{count}");
    assert!(sum(&s, "ringmq_send_ack_seconds_count", &[]) >= f64::from(N));

    // Every series the Grafana dashboard draws exists.
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/grafana-ringmq.json"
    ))
    .unwrap();
    let names: std::collections::BTreeSet<&str> =
        s.samples.iter().map(|x| x.metric.as_str()).collect();
    let mut drawn = 0;
    for word in dashboard.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if let Some(series) = word.strip_prefix("ringmq_") {
            let base = format!("ringmq_{}", series.trim_end_matches("_bucket"));
            // Members exist only while a group has live members (none here).
            if base == "ringmq_group_members" {
                continue;
            }
            assert!(
                names.contains(base.as_str()),
                "the dashboard draws {word}, which /metrics lacks"
            );
            drawn += 1;
        }
    }
    assert!(drawn > 10);
    for histogram in ["ringmq_fdatasync_seconds", "ringmq_pull_seconds"] {
        assert!(names.contains(histogram), "{histogram}");
    }

    // Every queue the sends reached was opened ahead, not by a send on the shard's thread:
    // the created topic's, an auto-created one's (sent to 8 times, so both shards' queues
    // take a message), and each shard's system queues, at the start (delayed messages held
    // and delivered, transactional halves and their commits: sent to 8 times over
    // connections spread on both shards).
    assert_eq!(sum(&s, "ringmq_queue_opens_inline_total", &[]), 0.0);
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let txn = TransactionProducer::start(ClientConfig::new(&addr), "txg", |_| {
            TransactionOutcome::Unknown
        })
        .await
        .unwrap();
        for i in 0..8 {
            producer
                .send("auto-made", OutgoingMessage::new(format!("a{i}")))
                .await
                .unwrap();
            let delayed = OutgoingMessage::new(format!("d{i}")).with_delay_ms(10);
            producer.send("auto-made", delayed).await.unwrap();
            let sent = txn
                .send_in_transaction("auto-made", OutgoingMessage::new(format!("t{i}")), |_| {
                    TransactionOutcome::Commit
                })
                .await
                .unwrap();
            assert!(sent.end_error.is_none(), "{:?}", sent.end_error);
        }
    });
    eventually("the auto-created topic's messages are counted", || {
        sum(
            &scrape(&metrics),
            "ringmq_messages_stored_total",
            &[("topic", "auto-made")],
        ) == 24.0
    });
    assert_eq!(
        sum(&scrape(&metrics), "ringmq_queue_opens_inline_total", &[]),
        0.0
    );

    // Anything but /metrics is not found.
    let mut conn = TcpStream::connect(&metrics).unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 404"), "{text}");

    // A deleted topic's counters go with it (topics created and deleted over and over
    // must not add up in the shards' memory).
    runtime().block_on(async {
        let client = ringmq::client::Client::connect(ClientConfig::new(&addr))
            .await
            .unwrap();
        client.delete_topic("m").await.unwrap();
    });
    // (A topic the shard counts but does not know is shown as "_other".)
    eventually("the deleted topic's stored counters are gone", || {
        let s = scrape(&metrics);
        !s.samples.iter().any(|x| {
            matches!(x.labels.get("topic"), Some("m") | Some("_other"))
                && x.metric.contains("stored")
        })
    });
}

/// A send whose write is still in flight when its topic is deleted: once both are answered,
/// the shard holds no counter for the deleted topic (the send's acknowledgement used to add
/// it back after the deletion had removed it).
#[test]
fn a_send_in_flight_at_a_deletion_leaves_no_counter_of_the_topic() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--testing-write-delay-us",
        "2000000",
        "--send-wait-max-ms",
        "10000",
    ];
    let (broker, metrics) = broker_with_metrics(dir.path(), 1, &flags);
    let addr = broker.addr_string();
    let sends = {
        let metrics = metrics.clone();
        move || {
            sum(
                &scrape(&metrics),
                "ringmq_requests_total",
                &[("kind", "SendMessage")],
            )
        }
    };
    runtime().block_on(async {
        let mut config = ClientConfig::new(&addr);
        config.request_timeout_ms = 20_000;
        let producer = Producer::connect(config).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("d", 1).await.unwrap();
        let before = tokio::task::spawn_blocking(sends.clone()).await.unwrap();
        let send = tokio::spawn(async move {
            producer
                .send("d", OutgoingMessage::new("in flight"))
                .await
                .map(|_| ())
        });
        // The send has reached the shard (its write takes 2 s; snapshots come every second):
        // delete the topic.
        tokio::task::spawn_blocking(move || {
            eventually("the send reaches the broker", || sends() > before)
        })
        .await
        .unwrap();
        client.delete_topic("d").await.unwrap();
        // Written before the deletion finished (it waits for the log's end): acknowledged.
        send.await.unwrap().unwrap();
        client.list_topics().await.unwrap();
    });
    // Snapshots are published every second: wait for one taken after both answers.
    eventually("a snapshot after the answers", || {
        sum(
            &scrape(&metrics),
            "ringmq_requests_total",
            &[("kind", "ListTopics")],
        ) > 0.0
    });
    let s = scrape(&metrics);
    let left: Vec<_> = s
        .samples
        .iter()
        .filter(|x| x.metric.contains("stored"))
        .filter(|x| matches!(x.labels.get("topic"), Some("d") | Some("_other")))
        .map(|x| format!("{} {:?}", x.metric, x.labels))
        .collect();
    assert!(left.is_empty(), "counters of the deleted topic: {left:?}");
}

#[test]
fn a_metrics_address_in_use_stops_the_broker_at_start_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq-broker"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--metrics-listen", &addr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot listen for metrics on {addr}")),
        "{stderr}"
    );
}

#[test]
fn the_log_goes_through_levels_set_by_flag_or_environment() {
    let run = |args: &[&str], env: Option<&str>| {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq-broker"));
        cmd.args(["--listen", "127.0.0.1:0", "--shards", "1", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        match env {
            Some(v) => cmd.env("RINGMQ_LOG", v),
            None => cmd.env_remove("RINGMQ_LOG"),
        };
        let mut child = cmd.spawn().unwrap();
        // Wait for "ready", then stop it cleanly.
        let mut stdout = child.stdout.take().unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains("ready") {
            let n = stdout.read(&mut buf).unwrap();
            assert!(n > 0, "the broker exited before it was ready");
            seen.extend_from_slice(&buf[..n]);
        }
        // SAFETY: kill(2) with the pid of a child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let default = run(&[], None);
    assert!(
        default.contains("INFO") && default.contains("stopped cleanly"),
        "{default}"
    );
    // The listeners' shutdown at a clean stop is not an accept failure.
    assert!(!default.contains("accept failed"), "{default}");
    let quiet = run(&["--log-level", "warn"], Some("debug"));
    assert!(
        !quiet.contains("stopped cleanly"),
        "the flag wins over RINGMQ_LOG: {quiet}"
    );
    let env_quiet = run(&[], Some("error"));
    assert!(!env_quiet.contains("INFO"), "{env_quiet}");
}

/// A group's assignment, kept once computed, counts in `ringmq_group_assignments_bytes`
/// while the group has members, and is given back when the last one leaves, also from a
/// group kept without members (one whose offsets were reset).
#[test]
fn a_groups_kept_assignment_is_given_back_when_its_members_leave() {
    let dir = tempfile::tempdir().unwrap();
    // The member stays until it leaves (it does not heartbeat again here).
    let flags = [
        "--session-timeout-ms",
        "120000",
        "--lock-expiry-ms",
        "125000",
    ];
    let (broker, metrics) = broker_with_metrics(dir.path(), 1, &flags);
    let addr = broker.addr_string();
    let rt = runtime();
    let client = rt.block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("a", 4).await.unwrap();
        let member = MemberSpec {
            subscriptions: vec![("a".into(), "*".into())],
            ..MemberSpec::default()
        };
        let assignment = client.group_heartbeat("ga", &member).await.unwrap();
        assert_eq!(assignment.topics[0].queues, [0, 1, 2, 3]);
        client
    });
    // Published by the shard about once a second (none before the first).
    let kept = || {
        let s = common::metrics::scrape_any(&metrics);
        let gauge = s
            .samples
            .iter()
            .any(|x| x.metric == "ringmq_group_assignments_bytes");
        gauge.then(|| sum(&s, "ringmq_group_assignments_bytes", &[]))
    };
    eventually("the assignment counted", || kept().is_some_and(|b| b > 0.0));
    // Reset, the group is kept once empty (its offsets epoch is what members compare).
    rt.block_on(client.reset_offset_by_time("ga", "a", 0))
        .unwrap();
    rt.block_on(client.unregister("ga")).unwrap();
    eventually("the assignment given back", || kept() == Some(0.0));
}
