//! SQL92 property filters against the real broker binary (2 shards) and the real client:
//! plain pulls keep exactly the matching messages of queues on both shards, a filter that
//! rejects everything moves the position on instead of making the consumer spin, and the
//! CLI's `consume --sql`.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::broker::BrokerProcess;
use common::runtime;
use ringmq::client::{Client, ClientConfig, ClientError, OutgoingMessage, Producer, PullStatus};

const QUEUES: u32 = 4;

/// Message `i`: region, amount, an optional tag and a note, in a pattern that gives every
/// operator something to match and something to reject.
fn message(i: u32) -> OutgoingMessage {
    let mut m = OutgoingMessage::new(format!("m-{i}"))
        .with_property("region", ["eu", "us", "apac"][i as usize % 3])
        .with_property("amount", ((i * 37) % 250).to_string())
        .with_property(
            "note",
            format!(
                "order-{i}-{}",
                if i.is_multiple_of(4) { "paid" } else { "open" }
            ),
        );
    if i.is_multiple_of(5) {
        m = m.with_tags("vip");
    }
    if !i.is_multiple_of(7) {
        m = m.with_property("score", format!("{}.5", i % 10));
    }
    m
}

/// What the broker must keep for each expression, computed here from the same numbers.
fn expected(expr: &str, i: u32) -> bool {
    let region = ["eu", "us", "apac"][i as usize % 3];
    let amount = (i * 37) % 250;
    let paid = i.is_multiple_of(4);
    let vip = i.is_multiple_of(5);
    let score = (!i.is_multiple_of(7)).then_some((i % 10) as f64 + 0.5);
    match expr {
        "region = 'eu' AND amount > 100" => region == "eu" && amount > 100,
        "region <> 'eu'" => region != "eu",
        "amount BETWEEN 50 AND 60" => (50..=60).contains(&amount),
        "amount NOT BETWEEN 10 AND 240" => !(10..=240).contains(&amount),
        "region IN ('us', 'apac') AND amount <= 20" => region != "eu" && amount <= 20,
        "region NOT IN ('us')" => region != "us",
        "TAGS = 'vip'" => vip,
        "TAGS IS NULL" => !vip,
        "score IS NOT NULL AND score >= 8.5" => score.is_some_and(|s| s >= 8.5),
        "score < 1" => score.is_some_and(|s| s < 1.0),
        "note ENDSWITH 'paid' OR NOT (amount < 245)" => paid || amount >= 245,
        "note STARTSWITH 'order-1' AND note CONTAINS '-open'" => {
            format!("{i}").starts_with('1') && !paid
        }
        "FALSE" => false,
        "TRUE" => true,
        other => panic!("no expectation for {other}"),
    }
}

const EXPRESSIONS: &[&str] = &[
    "region = 'eu' AND amount > 100",
    "region <> 'eu'",
    "amount BETWEEN 50 AND 60",
    "amount NOT BETWEEN 10 AND 240",
    "region IN ('us', 'apac') AND amount <= 20",
    "region NOT IN ('us')",
    "TAGS = 'vip'",
    "TAGS IS NULL",
    "score IS NOT NULL AND score >= 8.5",
    "score < 1",
    "note ENDSWITH 'paid' OR NOT (amount < 245)",
    "note STARTSWITH 'order-1' AND note CONTAINS '-open'",
    "FALSE",
    "TRUE",
];

/// Every body a filtered pull of every queue returns, draining each queue; and the pulls
/// it took.
async fn drain(client: &Client, topic: &str, expr: &str) -> (BTreeSet<String>, usize) {
    let mut seen = BTreeSet::new();
    let mut pulls = 0;
    for q in 0..QUEUES {
        let mut offset = 0;
        loop {
            let r = client
                .pull_sql(topic, q, offset, 32, Duration::ZERO, expr)
                .await
                .unwrap();
            pulls += 1;
            for m in &r.messages {
                assert!(seen.insert(String::from_utf8_lossy(m.body()).into_owned()));
            }
            match r.status {
                PullStatus::Found | PullStatus::NoMatchedMessage => {
                    assert!(r.next_offset > offset, "{expr}: no progress at {offset}");
                    offset = r.next_offset;
                }
                PullStatus::NoNewMessage => break,
                other => panic!("{expr}: {other:?}"),
            }
        }
    }
    (seen, pulls)
}

#[test]
fn sql_pulls_keep_exactly_the_matching_messages_of_queues_on_both_shards() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("orders", QUEUES).await.unwrap();
        const N: u32 = 1000;
        let sends: Vec<_> = (0..N)
            .map(|i| producer.send_async("orders", message(i)))
            .collect();
        let mut per_queue = [0u32; QUEUES as usize];
        for s in sends {
            per_queue[s.await.unwrap().queue_id as usize] += 1;
        }
        assert!(per_queue.iter().all(|&n| n > 0), "{per_queue:?}");
        for expr in EXPRESSIONS {
            let want: BTreeSet<String> = (0..N)
                .filter(|&i| expected(expr, i))
                .map(|i| format!("m-{i}"))
                .collect();
            let (got, _) = drain(&client, "orders", expr).await;
            assert_eq!(got, want, "{expr}");
        }
        // A bad expression is refused by the client before it is sent, with its column.
        match client
            .pull_sql("orders", 0, 0, 32, Duration::ZERO, "amount > ")
            .await
        {
            Err(ClientError::InvalidArgument(why)) => assert!(why.contains("column 10"), "{why}"),
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn a_filter_that_rejects_everything_moves_on_instead_of_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("one", 1).await.unwrap();
        const N: u32 = 2000;
        for chunk in (0..N).collect::<Vec<_>>().chunks(100) {
            let batch = chunk.iter().map(|&i| message(i)).collect();
            producer.send_batch("one", batch).await.unwrap();
        }
        // Each pull of 32 looks at 32 messages: the queue is passed over in 63 pulls.
        let mut offset = 0;
        let mut pulls = 0;
        while offset < u64::from(N) {
            let r = client
                .pull_sql("one", 0, offset, 32, Duration::ZERO, "region = 'mars'")
                .await
                .unwrap();
            pulls += 1;
            assert_eq!(r.status, PullStatus::NoMatchedMessage);
            assert!(r.messages.is_empty());
            assert!(r.next_offset > offset);
            offset = r.next_offset;
        }
        assert_eq!(offset, u64::from(N));
        assert!(pulls <= 63, "{pulls} pulls to pass over {N} messages");
        // At the end, a long poll waits for new messages instead of answering at once.
        let started = Instant::now();
        let r = client
            .pull_sql(
                "one",
                0,
                offset,
                32,
                Duration::from_millis(500),
                "region = 'mars'",
            )
            .await
            .unwrap();
        assert_eq!(r.status, PullStatus::NoNewMessage);
        assert!(started.elapsed() >= Duration::from_millis(450));
        // A match sent meanwhile ends the wait: answered long before its 10 s run out.
        let started = Instant::now();
        let waiting = {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .pull_sql(
                        "one",
                        0,
                        offset,
                        32,
                        Duration::from_secs(10),
                        "region = 'mars'",
                    )
                    .await
            })
        };
        producer
            .send(
                "one",
                OutgoingMessage::new("hello").with_property("region", "mars"),
            )
            .await
            .unwrap();
        let r = waiting.await.unwrap().unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(r.status, PullStatus::Found);
        assert_eq!(r.messages.len(), 1);
        assert_eq!(r.messages[0].body(), b"hello");
    });
}

#[test]
fn the_cli_consumes_with_an_sql_filter_and_refuses_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("cli", QUEUES).await.unwrap();
        for i in 0..60 {
            producer.send("cli", message(i)).await.unwrap();
        }
    });
    let cli = env!("CARGO_BIN_EXE_ringmq");
    let out = std::process::Command::new(cli)
        .args([
            "--broker",
            &addr,
            "consume",
            "cli",
            "--sql",
            "TAGS = 'vip' AND region = 'eu'",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut bodies: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split("body=").nth(1))
        .collect();
    bodies.sort();
    // i % 5 == 0 and i % 3 == 0 below 60: 0, 15, 30, 45.
    assert_eq!(bodies, ["m-0", "m-15", "m-30", "m-45"], "{stdout}");
    // As a member of a consumer group: the same four, then it leaves.
    let out = std::process::Command::new(cli)
        .args(["--broker", &addr, "consume", "cli", "--group", "gsql"])
        .args(["--sql", "TAGS = 'vip' AND region = 'eu'", "--max", "4"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut bodies: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("MSG "))
        .filter_map(|l| l.split("body=").nth(1))
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["m-0", "m-15", "m-30", "m-45"], "{stdout}");
    let out = std::process::Command::new(cli)
        .args(["--broker", &addr, "consume", "cli", "--sql", "region = "])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("column 10"), "{stderr}");
}
