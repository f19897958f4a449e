//! Push consumers against a real broker started in this process (two shards, loopback, a
//! temporary data directory): a clustering group shares the queues and consumes each
//! message once, including across a member leaving; tag filters; broadcasting (with local
//! offsets surviving a restart); where a new group starts (first, last, timestamp);
//! ordered consumption with a hand-over; local retries; and the group admin requests.
//!
//! Timeouts in here are upper bounds for a slow machine, never the behaviour under test.
#![cfg(feature = "broker")]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ringmq::client::{
    Client, ClientConfig, ClientError, ConsumeFrom, ConsumeStatus, Message, MessageModel,
    MessageQueue, OrderlyStatus, OutgoingMessage, Producer, PushConsumer, PushConsumerOptions,
};
use ringmq::log::FlushMode;
use ringmq::protocol::ErrorCode;
use ringmq::shard::{Broker, BrokerConfig};

/// Bound on every wait for something the consumers must do.
const PATIENCE: Duration = Duration::from_secs(60);

/// One broker per test, and one test at a time: each test starts a broker with two shards
/// and several consumers, which is a lot for a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn with_broker<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    with_broker_and(|_| {}, test)
}

/// [`with_broker`] with `configure` applied to the broker's configuration first.
fn with_broker_and<F, Fut>(configure: impl FnOnce(&mut BrokerConfig), test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mut config = BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_owned(),
        shards: 2,
        flush: FlushMode::Async,
        auto_create_topics: true,
        // Short delay levels: a retry (level 3 and up) comes back after 100 ms.
        delay_levels: RETRY_LEVELS.into(),
        // Preallocated segments: keep them small when many brokers run at once.
        segment_bytes: 64 << 20,
        ..Default::default()
    };
    configure(&mut config);
    let broker = Broker::start(config).unwrap();
    let addr = broker.addr().to_string();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(test(addr));
    drop(runtime);
    broker.shutdown().unwrap();
}

/// The brokers' delay levels in these tests.
const RETRY_LEVELS: &str = "50ms 50ms 100ms 100ms 100ms 100ms 100ms 100ms 100ms 100ms";

/// Options for tests: short long-polls and frequent commits, defaults otherwise.
fn options() -> PushConsumerOptions {
    PushConsumerOptions {
        pull_wait_ms: 1000,
        commit_interval_ms: 200,
        ..Default::default()
    }
}

#[derive(Debug, Clone)]
struct Delivery {
    consumer: usize,
    body: String,
    tag: Option<String>,
    queue_id: u32,
}

type Log = Arc<Mutex<Vec<Delivery>>>;

fn record(log: &Log, consumer: usize, messages: &[Message]) {
    let mut log = log.lock().unwrap();
    for m in messages {
        log.push(Delivery {
            consumer,
            body: String::from_utf8_lossy(m.body()).into_owned(),
            tag: m.tags().map(str::to_owned),
            queue_id: m.queue_id(),
        });
    }
}

/// A started concurrent consumer that records every delivery in `log`.
async fn concurrent(
    addr: &str,
    group: &str,
    topic: &str,
    expression: &str,
    options: PushConsumerOptions,
    log: &Log,
    index: usize,
) -> PushConsumer {
    concurrent_with_config(
        ClientConfig::new(addr),
        group,
        topic,
        expression,
        options,
        log,
        index,
    )
    .await
}

async fn concurrent_with_config(
    config: ClientConfig,
    group: &str,
    topic: &str,
    expression: &str,
    options: PushConsumerOptions,
    log: &Log,
    index: usize,
) -> PushConsumer {
    let consumer = PushConsumer::new(config, group, options).unwrap();
    consumer.subscribe(topic, expression).unwrap();
    let log = log.clone();
    consumer
        .register_concurrent(move |messages| {
            record(&log, index, messages);
            ConsumeStatus::Success
        })
        .unwrap();
    consumer
        .start()
        .await
        .unwrap_or_else(|e| panic!("starting a consumer of {group}: {e}"));
    consumer
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `consumers` consume `queue_count` queues of the subscribed topics between
/// them, each queue by one consumer, every consumer some, and each consumes exactly what it
/// was assigned. The group's retry topic (one queue, subscribed by every concurrent member)
/// is held by one of them besides.
async fn settled(consumers: &[&PushConsumer], queue_count: usize) {
    eventually("the group to settle", || {
        let mut all = BTreeSet::new();
        for c in consumers {
            let consuming = c.consuming_queues();
            if consuming != c.assigned_queues() {
                return false;
            }
            let own: Vec<MessageQueue> = consuming
                .into_iter()
                .filter(|q| !q.topic.starts_with("%RETRY%"))
                .collect();
            if own.is_empty() {
                return false;
            }
            for q in own {
                if !all.insert(q) {
                    return false;
                }
            }
        }
        all.len() == queue_count
    })
    .await;
}

/// Waits until every consumer consumes all `queue_count` queues (broadcasting).
async fn all_consuming(consumers: &[&PushConsumer], queue_count: usize) {
    eventually("every member to consume every queue", || {
        consumers
            .iter()
            .all(|c| c.consuming_queues().len() == queue_count)
    })
    .await;
}

/// Waits until `group` has committed the end of every queue of `topic`.
async fn caught_up(client: &Client, group: &str, topic: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let progress = client.consumer_progress(group, topic).await.unwrap();
        if !progress.is_empty()
            && progress
                .iter()
                .all(|q| q.lag == 0 && q.committed_offset == Some(q.max_offset))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{group} never caught up on {topic}: {progress:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn send_all(producer: &Producer, topic: &str, messages: Vec<OutgoingMessage>) {
    for m in messages {
        producer.send(topic, m).await.unwrap();
    }
}

fn bodies(prefix: &str, n: usize) -> Vec<OutgoingMessage> {
    (0..n)
        .map(|i| OutgoingMessage::new(format!("{prefix}-{i}")))
        .collect()
}

/// Body → how many times it was delivered.
fn counts(log: &Log) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for d in log.lock().unwrap().iter() {
        *counts.entry(d.body.clone()).or_insert(0) += 1;
    }
    counts
}

fn check_exactly_once(log: &Log, expected: &BTreeSet<String>) {
    let counts = counts(log);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let got: BTreeSet<String> = counts.into_keys().collect();
    assert_eq!(&got, expected);
}

fn names(prefix: &str, n: usize) -> BTreeSet<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A client id stable within one test (for broadcasting's local offsets), unique across
/// runs.
fn stable_id(name: &str) -> String {
    format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    )
}

#[path = "push_consumer/memory.rs"]
mod memory;
#[path = "push_consumer/orderly.rs"]
mod orderly;
#[path = "push_consumer/reset.rs"]
mod reset;
#[path = "push_consumer/start.rs"]
mod start;

#[test]
fn three_concurrent_consumers_share_16_queues_and_consume_each_message_once() {
    with_broker(|addr| async move {
        let (topic, group) = ("share", "g-share");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 16).await.unwrap();
        let log: Log = Arc::default();
        let mut consumers = Vec::new();
        for i in 0..3 {
            consumers.push(concurrent(&addr, group, topic, "*", options(), &log, i).await);
        }
        settled(&consumers.iter().collect::<Vec<_>>(), 16).await;
        let members = client.group_members(group).await.unwrap();
        assert_eq!(members.members.len(), 3, "{members:?}");

        send_all(&producer, topic, bodies("a", 480)).await;
        let expected = names("a", 480);
        eventually("480 messages consumed", || counts(&log).len() == 480).await;
        caught_up(&client, group, topic).await;
        check_exactly_once(&log, &expected);
        let by_consumer: BTreeSet<usize> = log.lock().unwrap().iter().map(|d| d.consumer).collect();
        assert_eq!(by_consumer.len(), 3, "every member consumed some");
        // A queue is consumed by one member.
        let mut owner_of: BTreeMap<u32, BTreeSet<usize>> = BTreeMap::new();
        for d in log.lock().unwrap().iter() {
            owner_of.entry(d.queue_id).or_default().insert(d.consumer);
        }
        assert!(
            owner_of.values().all(|owners| owners.len() == 1),
            "{owner_of:?}"
        );

        // A member leaves: the others take its queues, from its committed offsets.
        let leaving = consumers.pop().unwrap();
        leaving.shutdown().await.unwrap();
        settled(&consumers.iter().collect::<Vec<_>>(), 16).await;
        send_all(&producer, topic, bodies("b", 480)).await;
        let mut expected2 = expected.clone();
        expected2.extend(names("b", 480));
        eventually("960 messages consumed", || counts(&log).len() == 960).await;
        caught_up(&client, group, topic).await;
        check_exactly_once(&log, &expected2);
        assert!(log
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.body.starts_with("b-"))
            .all(|d| d.consumer != 2));

        for c in &consumers {
            c.shutdown().await.unwrap();
        }
        let members = client.group_members(group).await.unwrap();
        assert!(members.members.is_empty(), "unregistered: {members:?}");
    });
}

#[test]
fn a_tag_filter_delivers_only_and_all_matching_messages() {
    with_broker(|addr| async move {
        let (topic, group) = ("tags", "g-tags");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 4).await.unwrap();
        let log: Log = Arc::default();
        let consumer = concurrent(&addr, group, topic, "A || B", options(), &log, 0).await;
        settled(&[&consumer], 4).await;

        let tags = [Some("A"), Some("B"), Some("C"), None, Some("AB")];
        let mut expected = BTreeSet::new();
        let mut messages = Vec::new();
        for i in 0..300 {
            let tag = tags[i % tags.len()];
            let mut m = OutgoingMessage::new(format!("m-{i}"));
            if let Some(tag) = tag {
                m = m.with_tags(tag);
            }
            if matches!(tag, Some("A") | Some("B")) {
                expected.insert(format!("m-{i}"));
            }
            messages.push(m);
        }
        send_all(&producer, topic, messages).await;
        eventually("every A and B message", || {
            counts(&log).len() >= expected.len()
        })
        .await;
        // Every queue was read to its end, so nothing else is on its way.
        caught_up(&client, group, topic).await;
        check_exactly_once(&log, &expected);
        assert!(log
            .lock()
            .unwrap()
            .iter()
            .all(|d| matches!(d.tag.as_deref(), Some("A") | Some("B"))));
        consumer.shutdown().await.unwrap();
    });
}

#[test]
fn broadcasting_gives_every_member_every_message_and_resumes_from_local_offsets() {
    with_broker(|addr| async move {
        let (topic, group) = ("bcast", "g-bcast");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic(topic, 4).await.unwrap();
        let offsets_dir = tempfile::tempdir().unwrap();
        let broadcasting = || PushConsumerOptions {
            message_model: MessageModel::Broadcasting,
            offsets_dir: Some(offsets_dir.path().to_owned()),
            ..options()
        };
        let mut config = ClientConfig::new(&addr);
        config.client_id = stable_id("bcast-0");
        let logs: Vec<Log> = vec![Arc::default(), Arc::default()];
        let first = concurrent_with_config(
            config.clone(),
            group,
            topic,
            "*",
            broadcasting(),
            &logs[0],
            0,
        )
        .await;
        let second = concurrent(&addr, group, topic, "*", broadcasting(), &logs[1], 1).await;
        all_consuming(&[&first, &second], 4).await;

        send_all(&producer, topic, bodies("a", 100)).await;
        for log in &logs {
            eventually("every member gets all 100", || counts(log).len() == 100).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        for log in &logs {
            check_exactly_once(log, &names("a", 100));
        }

        // The first member stops (its offsets go to its file); messages sent meanwhile
        // reach it when it comes back with the same client id, and nothing else does.
        first.shutdown().await.unwrap();
        send_all(&producer, topic, bodies("b", 50)).await;
        eventually("the running member gets the 50", || {
            counts(&logs[1]).len() == 150
        })
        .await;
        let back_log: Log = Arc::default();
        let back =
            concurrent_with_config(config, group, topic, "*", broadcasting(), &back_log, 0).await;
        eventually("the member that came back gets what it missed", || {
            counts(&back_log).len() == 50
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        check_exactly_once(&back_log, &names("b", 50));
        back.shutdown().await.unwrap();
        second.shutdown().await.unwrap();
    });
}

/// Body → listener calls that saw it.
type Attempts = Arc<Mutex<HashMap<String, u32>>>;

/// Counts one more call with `message`; returns its body and the calls so far.
fn count_attempt(attempts: &Attempts, message: &Message) -> (String, u32) {
    let body = String::from_utf8_lossy(message.body()).into_owned();
    let mut attempts = attempts.lock().unwrap();
    let n = attempts.entry(body.clone()).or_insert(0);
    *n += 1;
    (body, *n)
}

/// The messages on a group's dead-letter topic.
async fn dead_letters(client: &Client, group: &str) -> Vec<Message> {
    let topic = format!("%DLQ%{group}");
    let pulled = client
        .pull(&topic, 0, 0, 32, Duration::from_millis(0), &[])
        .await
        .unwrap();
    pulled.messages
}

#[test]
fn failing_messages_come_back_through_the_retry_topic_then_go_to_the_dead_letter_topic() {
    with_broker(|addr| async move {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        let retrying = PushConsumerOptions {
            max_reconsume_times: 2,
            reconsume_delay_ms: 50,
            suspend_ms: 50,
            ..options()
        };

        // Concurrent: "flaky" fails twice (a panic, then ReconsumeLater) then succeeds;
        // "bad" always fails: 1 + 2 deliveries, then the dead-letter topic. Both come back
        // through the broker (the group's retry topic) with their reconsume count.
        client.create_topic("retry-c", 1).await.unwrap();
        let attempts: Attempts = Arc::default();
        let times: Arc<Mutex<Vec<(String, u32, String)>>> = Arc::default();
        let consumer =
            PushConsumer::new(ClientConfig::new(&addr), "g-retry-c", retrying.clone()).unwrap();
        consumer.subscribe("retry-c", "*").unwrap();
        {
            let (attempts, times) = (attempts.clone(), times.clone());
            consumer
                .register_concurrent(move |messages| {
                    let (body, n) = count_attempt(&attempts, &messages[0]);
                    times.lock().unwrap().push((
                        body.clone(),
                        messages[0].reconsume_times(),
                        messages[0].origin_topic().to_owned(),
                    ));
                    match body.as_str() {
                        // A panic counts as a failed attempt.
                        "flaky" if n == 1 => panic!("a listener panic, on purpose"),
                        "flaky" if n == 2 => ConsumeStatus::ReconsumeLater,
                        "bad" => ConsumeStatus::ReconsumeLater,
                        _ => ConsumeStatus::Success,
                    }
                })
                .unwrap();
        }
        consumer.start().await.unwrap();
        settled(&[&consumer], 1).await;
        let sends = ["ok-1", "flaky", "bad", "ok-2"]
            .map(OutgoingMessage::new)
            .to_vec();
        send_all(&producer, "retry-c", sends).await;
        eventually("bad in the dead-letter topic", || {
            consumer.stats().dead_lettered == 1
        })
        .await;
        caught_up(&client, "g-retry-c", "retry-c").await;
        caught_up(&client, "g-retry-c", "%RETRY%g-retry-c").await;
        let seen = attempts.lock().unwrap().clone();
        assert_eq!(seen.get("flaky"), Some(&3), "{seen:?}");
        assert_eq!(seen.get("bad"), Some(&3), "{seen:?}");
        assert_eq!((seen.get("ok-1"), seen.get("ok-2")), (Some(&1), Some(&1)));
        let times = times.lock().unwrap().clone();
        for body in ["flaky", "bad"] {
            let of: Vec<(u32, &str)> = times
                .iter()
                .filter(|(b, _, _)| b == body)
                .map(|(_, t, topic)| (*t, topic.as_str()))
                .collect();
            assert_eq!(
                of,
                [(0, "retry-c"), (1, "retry-c"), (2, "retry-c")],
                "{body}"
            );
        }
        let stats = consumer.stats();
        assert_eq!(
            (
                stats.consumed,
                stats.retried,
                stats.sent_back,
                stats.dead_lettered
            ),
            (3, 5, 5, 1)
        );
        let dead = dead_letters(&client, "g-retry-c").await;
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].body(), b"bad");
        assert_eq!(dead[0].origin_topic(), "retry-c");
        assert_eq!(dead[0].reconsume_times(), 3);
        assert!(dead[0].origin_msg_id().is_some());
        consumer.shutdown().await.unwrap();

        // Orderly: the queue waits on a failing message, so what follows comes after it;
        // after max_reconsume_times suspensions it goes to the dead-letter topic.
        client.create_topic("retry-o", 1).await.unwrap();
        let order: Arc<Mutex<Vec<String>>> = Arc::default();
        let consumer = PushConsumer::new(ClientConfig::new(&addr), "g-retry-o", retrying).unwrap();
        consumer.subscribe("retry-o", "*").unwrap();
        {
            let order = order.clone();
            consumer
                .register_orderly(move |messages| {
                    let body = String::from_utf8_lossy(messages[0].body()).into_owned();
                    let mut order = order.lock().unwrap();
                    order.push(body.clone());
                    let tries = order.iter().filter(|b| **b == body).count();
                    match body.as_str() {
                        "flaky" if tries <= 2 => OrderlyStatus::SuspendCurrentQueueAMoment,
                        "bad" => OrderlyStatus::SuspendCurrentQueueAMoment,
                        _ => OrderlyStatus::Success,
                    }
                })
                .unwrap();
        }
        consumer.start().await.unwrap();
        settled(&[&consumer], 1).await;
        let sends = ["ok-1", "flaky", "bad", "ok-2"]
            .map(OutgoingMessage::new)
            .to_vec();
        send_all(&producer, "retry-o", sends).await;
        caught_up(&client, "g-retry-o", "retry-o").await;
        assert_eq!(
            *order.lock().unwrap(),
            ["ok-1", "flaky", "flaky", "flaky", "bad", "bad", "bad", "ok-2"]
        );
        assert_eq!(consumer.stats().dead_lettered, 1);
        let dead = dead_letters(&client, "g-retry-o").await;
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].body(), b"bad");
        assert_eq!(dead[0].origin_topic(), "retry-o");
        consumer.shutdown().await.unwrap();
    });
}

/// Orderly: failures are counted per message, so messages that joined a failing batch
/// later are not dead-lettered with the one that failed from the start (RocketMQ counts
/// reconsume times per message too).
#[test]
fn orderly_failures_count_per_message_so_a_grown_batch_is_not_dead_lettered_early() {
    with_broker(|addr| async move {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("grown", 1).await.unwrap();
        let opts = PushConsumerOptions {
            max_reconsume_times: 3,
            suspend_ms: 200,
            consume_batch_max: 8,
            ..options()
        };
        let batches: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
        let called = Arc::new(tokio::sync::Notify::new());
        let consumer = PushConsumer::new(ClientConfig::new(&addr), "g-grown", opts).unwrap();
        consumer.subscribe("grown", "*").unwrap();
        {
            let (batches, called) = (batches.clone(), called.clone());
            consumer
                .register_orderly(move |messages| {
                    let bodies: Vec<String> = messages
                        .iter()
                        .map(|m| String::from_utf8_lossy(m.body()).into_owned())
                        .collect();
                    let bad = bodies.iter().any(|b| b == "bad");
                    batches.lock().unwrap().push(bodies);
                    called.notify_one();
                    if bad {
                        OrderlyStatus::SuspendCurrentQueueAMoment
                    } else {
                        OrderlyStatus::Success
                    }
                })
                .unwrap();
        }
        consumer.start().await.unwrap();
        settled(&[&consumer], 1).await;
        send_all(&producer, "grown", vec![OutgoingMessage::new("bad")]).await;
        // After its first failure, two more join the queue: the next batches hold all three.
        tokio::time::timeout(Duration::from_secs(10), called.notified())
            .await
            .unwrap();
        send_all(&producer, "grown", bodies("late", 2)).await;
        caught_up(&client, "g-grown", "grown").await;
        let batches = batches.lock().unwrap().clone();
        let grown = ["bad", "late-0", "late-1"].map(String::from).to_vec();
        // "bad" in 1 + 3 failed batches, the last ones grown; then the two without it.
        let (last, failed) = batches.split_last().unwrap();
        assert_eq!(last, &grown[1..], "{batches:?}");
        assert_eq!(failed.len(), 4, "{batches:?}");
        assert!(failed.iter().all(|b| b[0] == "bad"), "{batches:?}");
        assert_eq!(failed.last(), Some(&grown), "{batches:?}");
        let dead = dead_letters(&client, "g-grown").await;
        // The copy counts the attempts made in place, as a concurrent consumer's last copy
        // does (4 after 3 retries), not the stored record's 0 plus one.
        let times: Vec<_> = dead.iter().map(|m| m.reconsume_times()).collect();
        assert_eq!(times, [4]);
        let dead: Vec<_> = dead.iter().map(|m| m.body().to_vec()).collect();
        assert_eq!(dead, [b"bad".to_vec()]);
        consumer.shutdown().await.unwrap();
    });
}

#[test]
fn group_admin_requests_list_members_show_progress_and_reset_offsets() {
    with_broker(|addr| async move {
        let (topic, group) = ("admin", "g-admin");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 2).await.unwrap();
        let log: Log = Arc::default();
        let consumer = concurrent(&addr, group, topic, "*", options(), &log, 0).await;
        settled(&[&consumer], 2).await;

        let members = client.group_members(group).await.unwrap();
        assert_eq!(members.members.len(), 1);
        let member = &members.members[0];
        assert_eq!(
            member.client_id,
            consumer.client().unwrap().config().client_id
        );
        let queues: Vec<MessageQueue> = member
            .topics
            .iter()
            .flat_map(|t| {
                t.queues
                    .iter()
                    .map(|q| MessageQueue::new(t.topic.clone(), *q))
            })
            .collect();
        assert_eq!(queues, consumer.assigned_queues());

        send_all(&producer, topic, bodies("m", 10)).await;
        eventually("10 consumed", || counts(&log).len() == 10).await;
        caught_up(&client, group, topic).await;
        let progress = client.consumer_progress(group, topic).await.unwrap();
        assert_eq!(progress.iter().map(|q| q.max_offset).sum::<u64>(), 10);

        // Back to the start: the member drops its positions and consumes everything again.
        client.reset_offset_by_time(group, topic, 0).await.unwrap();
        eventually("10 consumed again", || {
            counts(&log).values().filter(|n| **n == 2).count() == 10
        })
        .await;
        caught_up(&client, group, topic).await;
        assert!(counts(&log).values().all(|n| *n == 2));

        // Locks by hand: one holder at a time, released by unlock.
        let other = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        assert_eq!(
            client.lock_batch("g-locks", topic, &[0, 1]).await.unwrap(),
            [0, 1]
        );
        assert!(other
            .lock_batch("g-locks", topic, &[0, 1])
            .await
            .unwrap()
            .is_empty());
        client.unlock_batch("g-locks", topic, &[1]).await.unwrap();
        assert_eq!(
            other.lock_batch("g-locks", topic, &[0, 1]).await.unwrap(),
            [1]
        );
        consumer.shutdown().await.unwrap();
    });
}

#[test]
fn calls_sharing_one_listener_slot_succeed_and_retry_each_on_its_own() {
    with_broker(|addr| async move {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("slot", 1).await.unwrap();
        let mut bodies = vec!["flaky".to_owned(), "bad".to_owned()];
        bodies.extend((0..30).map(|i| format!("ok-{i}")));
        // One listener slot; once calls are known to be cheap (the warm-up message),
        // the 32 calls of one pull run in a row in one job.
        let options = PushConsumerOptions {
            consume_from: ConsumeFrom::FirstOffset,
            consume_threads: 1,
            max_reconsume_times: 2,
            reconsume_delay_ms: 50,
            ..options()
        };
        let attempts: Attempts = Arc::default();
        let consumer = PushConsumer::new(ClientConfig::new(&addr), "g-slot", options).unwrap();
        consumer.subscribe("slot", "*").unwrap();
        {
            let attempts = attempts.clone();
            consumer
                .register_concurrent(move |messages| {
                    assert_eq!(messages.len(), 1, "one message per call by default");
                    let (body, n) = count_attempt(&attempts, &messages[0]);
                    match body.as_str() {
                        "flaky" if n == 1 => panic!("a listener panic, on purpose"),
                        "bad" => ConsumeStatus::ReconsumeLater,
                        _ => ConsumeStatus::Success,
                    }
                })
                .unwrap();
        }
        producer
            .send("slot", OutgoingMessage::new("warm-up"))
            .await
            .unwrap();
        consumer.start().await.unwrap();
        caught_up(&client, "g-slot", "slot").await;
        // One batch: a pull brings all 32 at once.
        let batch: Vec<OutgoingMessage> = bodies
            .iter()
            .map(|b| OutgoingMessage::new(b.as_str()))
            .collect();
        producer.send_batch("slot", batch).await.unwrap();
        caught_up(&client, "g-slot", "slot").await;
        // The failed ones come back through the retry topic.
        eventually("bad dead-lettered", || consumer.stats().dead_lettered == 1).await;
        caught_up(&client, "g-slot", "%RETRY%g-slot").await;
        let seen = attempts.lock().unwrap().clone();
        assert_eq!(seen.get("flaky"), Some(&2), "{seen:?}");
        assert_eq!(seen.get("bad"), Some(&3), "{seen:?}");
        assert!(
            (0..30).all(|i| seen.get(&format!("ok-{i}")) == Some(&1)),
            "{seen:?}"
        );
        let stats = consumer.stats();
        // Failed attempts: flaky once, bad three times (the last one dead-letters it).
        assert_eq!(
            (stats.consumed, stats.dead_lettered, stats.retried),
            (32, 1, 4)
        );
        consumer.shutdown().await.unwrap();
    });
}

#[test]
fn an_sql_filter_delivers_only_and_all_matching_messages_from_both_shards() {
    with_broker(|addr| async move {
        let (topic, group) = ("sql", "g-sql");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 4).await.unwrap();
        let log: Log = Arc::default();
        let consumer = PushConsumer::new(ClientConfig::new(&addr), group, options()).unwrap();
        // A bad expression fails here, with its column, before anything is sent.
        let e = consumer.subscribe_sql(topic, "amount >").unwrap_err();
        assert!(e.to_string().contains("column 9"), "{e}");
        consumer
            .subscribe_sql(topic, "region = 'eu' AND amount > 100 OR TAGS = 'vip'")
            .unwrap();
        let sink = log.clone();
        consumer
            .register_concurrent(move |messages| {
                record(&sink, 0, messages);
                ConsumeStatus::Success
            })
            .unwrap();
        consumer.start().await.unwrap();
        settled(&[&consumer], 4).await;

        let mut expected = BTreeSet::new();
        let mut messages = Vec::new();
        for i in 0..400u32 {
            let region = ["eu", "us", "apac"][i as usize % 3];
            let amount = (i * 7) % 200;
            let mut m = OutgoingMessage::new(format!("m-{i}"))
                .with_property("region", region)
                .with_property("amount", amount.to_string());
            let vip = i % 50 == 0;
            if vip {
                m = m.with_tags("vip");
            }
            if (region == "eu" && amount > 100) || vip {
                expected.insert(format!("m-{i}"));
            }
            messages.push(m);
        }
        send_all(&producer, topic, messages).await;
        eventually("every matching message", || {
            counts(&log).len() >= expected.len()
        })
        .await;
        // Every queue was read to its end (filtered messages are passed over, not held).
        caught_up(&client, group, topic).await;
        check_exactly_once(&log, &expected);
        let queues: BTreeSet<u32> = log.lock().unwrap().iter().map(|d| d.queue_id).collect();
        assert_eq!(queues.len(), 4, "matches came from every queue: {queues:?}");
        consumer.shutdown().await.unwrap();
    });
}

/// A message whose listener failed and whose send-back failed too (the group's retry topic
/// cannot be made: the broker is at `--topics-max`) waits to be consumed again here, for a
/// listener slot; a shutdown that comes while every slot is busy ends that wait: the
/// listener is not called with it again on a consumer that is leaving. It stays
/// uncommitted, and the group's next member consumes it. Before, the retry took the slot
/// the busy call gave back, ahead of the shutdown.
#[test]
fn a_message_waiting_to_be_retried_here_is_left_to_the_next_member_at_a_shutdown() {
    with_broker_and(
        |c| c.topics_max = 3,
        |addr| async move {
            let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
            let client = producer.client().clone();
            client.create_topic("late", 1).await.unwrap();
            let opts = PushConsumerOptions {
                consume_from: ConsumeFrom::FirstOffset,
                consume_threads: 1,
                reconsume_delay_ms: 20,
                ..options()
            };
            let attempts: Attempts = Arc::default();
            let (open, gate) = std::sync::mpsc::channel::<()>();
            let gate = Mutex::new(gate);
            let consumer =
                Arc::new(PushConsumer::new(ClientConfig::new(&addr), "g-late", opts).unwrap());
            consumer.subscribe("late", "*").unwrap();
            {
                let attempts = attempts.clone();
                consumer
                    .register_concurrent(move |messages| {
                        match count_attempt(&attempts, &messages[0]).0.as_str() {
                            "fails" => ConsumeStatus::ReconsumeLater,
                            _ => {
                                // Holds the only slot until the test opens the gate.
                                let _ = gate.lock().unwrap().recv();
                                ConsumeStatus::Success
                            }
                        }
                    })
                    .unwrap();
            }
            consumer.start().await.unwrap();
            // The group's retry topic, made by the start, goes, and no topic can be made.
            client.delete_topic("%RETRY%g-late").await.unwrap();
            for i in 0.. {
                match client.create_topic(&format!("filler-{i}"), 1).await {
                    Ok(()) => assert!(i < 10, "no topic limit"),
                    Err(ClientError::Broker { code, .. }) => {
                        assert_eq!(code, Some(ErrorCode::LimitReached));
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            for body in ["fails", "holds"] {
                producer
                    .send("late", OutgoingMessage::new(body))
                    .await
                    .unwrap();
            }
            let called = |body: &str| attempts.lock().unwrap().get(body).copied();
            eventually("both called", || {
                called("fails") == Some(1) && called("holds") == Some(1)
            })
            .await;
            // Observation window (intentional): the failed one's send-back is refused
            // within milliseconds, then it waits 20 ms and then for the slot, and nothing
            // a client sees says it is waiting there.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let leaving = tokio::spawn({
                let consumer = consumer.clone();
                async move { consumer.shutdown().await }
            });
            // Observation window (intentional): the shutdown marks the consumer stopping
            // and gives its queue up at its first step, before the slot frees; nothing a
            // client sees says when it took it.
            tokio::time::sleep(Duration::from_secs(1)).await;
            open.send(()).unwrap();
            leaving.await.unwrap().unwrap();
            assert_eq!(called("fails"), Some(1), "called again while leaving");
            // Room for the next member's retry topic.
            client.delete_topic("filler-0").await.unwrap();
            let next = PushConsumer::new(ClientConfig::new(&addr), "g-late", options()).unwrap();
            next.subscribe("late", "*").unwrap();
            let seen: Attempts = Arc::default();
            {
                let seen = seen.clone();
                next.register_concurrent(move |messages| {
                    count_attempt(&seen, &messages[0]);
                    ConsumeStatus::Success
                })
                .unwrap();
            }
            next.start().await.unwrap();
            eventually("the next member consumed it", || {
                seen.lock().unwrap().get("fails") == Some(&1)
            })
            .await;
            next.shutdown().await.unwrap();
        },
    );
}
