//! Consumers across a broker crash that lost the unsynced tail of an async log (played by
//! cutting the log after a SIGKILL): committed offsets, consumers that stay up, and
//! broadcasting consumers' local offsets past the loss are moved back to where the queue
//! ended, so the messages stored there next are consumed, never skipped.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::broker::BrokerProcess;
use ringmq::client::{
    ClientConfig, ConsumeFrom, ConsumeStatus, MessageModel, OutgoingMessage, Producer, PullStatus,
    PushConsumer, PushConsumerOptions,
};
use ringmq::protocol::ErrorCode;
use tokio::sync::Notify;

fn config(addr: &str, shard_aware: bool) -> ClientConfig {
    let mut c = ClientConfig::new(addr.to_owned());
    c.shard_aware = shard_aware;
    c.request_timeout_ms = 10_000;
    c
}

/// SIGKILLs the (one-shard) broker, cuts its first log segment at `physical_offset` (what a
/// machine crash does to an async log's unsynced tail) and starts it again.
fn crash_losing_from(broker: &mut BrokerProcess, data: &std::path::Path, physical_offset: u64) {
    broker.kill();
    let log = data
        .join("shard-0")
        .join("commitlog")
        .join(format!("{:020}", 0));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(physical_offset)
        .unwrap();
    broker.restart();
}

/// A machine that stops can lose the records an async-flush log had not synced, after a
/// consumer read them and committed past them. At the next start the committed offset is
/// lowered to the queue's recovered end: the messages stored there next are consumed, not
/// skipped. (The loss is played by cutting the log after a SIGKILL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_committed_past_what_a_crash_kept_is_lowered_to_the_recovered_end() {
    let (_dir, data, mut broker) = sync_broker();
    let sent = send_old(&broker.addr_string(), 20).await;
    let producer = connect(&broker.addr_string()).await;
    producer
        .client()
        .commit_offset("g", "lost", 0, 20)
        .await
        .unwrap();
    // The run a position read before the crash comes from.
    let old_run = producer
        .client()
        .pull("lost", 0, 19, 1, Duration::ZERO, &[])
        .await
        .unwrap()
        .incarnation;
    drop(producer);
    crash_losing_from(&mut broker, &data, sent[15].physical_offset);
    let producer = connect(&broker.addr_string()).await;
    let client = producer.client().clone();
    assert_eq!(client.max_offset("lost", 0).await.unwrap(), 15);
    assert_eq!(client.query_offset("g", "lost", 0).await.unwrap(), Some(15));
    // New messages take offsets 15..; the group reads them from its committed offset.
    for i in 0..5 {
        let m = OutgoingMessage::new(format!("new-{i}"));
        producer.send("lost", m).await.unwrap();
    }
    let pulled = client
        .pull("lost", 0, 15, 32, Duration::ZERO, &[])
        .await
        .unwrap();
    let bodies: Vec<_> = pulled.messages.iter().map(|m| m.body().to_vec()).collect();
    let want: Vec<_> = (0..5).map(|i| format!("new-{i}").into_bytes()).collect();
    assert_eq!(bodies, want);
    let new_run = pulled.incarnation;
    assert_ne!(new_run, old_run, "a restart is a new run");
    // A position read before the crash, committed or pulled now that the queue holds new
    // messages there: the committed offset stays at the recovered end, the pull is sent
    // back to it. The same position from the new run (or from no known run) is taken.
    client
        .commit_offset_from("g", "lost", 0, 20, old_run, None)
        .await
        .unwrap();
    assert_eq!(client.query_offset("g", "lost", 0).await.unwrap(), Some(15));
    let stale = client
        .pull_with("lost", 0, 18, 32, Duration::ZERO, &[], "", old_run)
        .await
        .unwrap();
    assert_eq!(
        (stale.status, stale.next_offset, stale.messages.len()),
        (PullStatus::OffsetTooBig, 15, 0)
    );
    let at_end = client
        .pull_with("lost", 0, 15, 32, Duration::ZERO, &[], "", old_run)
        .await
        .unwrap();
    assert_eq!(at_end.messages.len(), 5, "from the recovered end: served");
    client
        .commit_offset_from("g", "lost", 0, 18, new_run, None)
        .await
        .unwrap();
    assert_eq!(client.query_offset("g", "lost", 0).await.unwrap(), Some(18));
    client.commit_offset("g", "lost", 0, 20).await.unwrap();
    assert_eq!(client.query_offset("g", "lost", 0).await.unwrap(), Some(20));
    assert!(
        broker
            .stderr()
            .contains("committed offsets were past their queue's end"),
        "{}",
        broker.stderr()
    );
}

/// A position read before two restarts: the first lost 15..19 (a crash), producers stored
/// five messages there, and the second kept everything. The position (20) is within what
/// the second start found, but past what the first kept: it goes back to 15, not on from
/// 20 over the five stored in between (before, only the latest start was checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_from_before_two_restarts_is_checked_against_each_start_since() {
    let (_dir, data, mut broker) = sync_broker();
    let sent = send_old(&broker.addr_string(), 20).await;
    let run_of = |client: ringmq::client::Client| async move {
        let pulled = client.pull("lost", 0, 0, 1, Duration::ZERO, &[]).await;
        pulled.unwrap().incarnation
    };
    let first_run = run_of(connect(&broker.addr_string()).await.client().clone()).await;
    crash_losing_from(&mut broker, &data, sent[15].physical_offset);
    let producer = connect(&broker.addr_string()).await;
    let second_run = run_of(producer.client().clone()).await;
    for i in 0..5 {
        let m = OutgoingMessage::new(format!("mid-{i}"));
        assert_eq!(producer.send("lost", m).await.unwrap().queue_offset, 15 + i);
    }
    drop(producer);
    broker.kill();
    broker.restart();
    let producer = connect(&broker.addr_string()).await;
    for i in 0..5 {
        let m = OutgoingMessage::new(format!("new-{i}"));
        assert_eq!(producer.send("lost", m).await.unwrap().queue_offset, 20 + i);
    }
    let client = producer.client();
    let third_run = run_of(client.clone()).await;
    assert!(first_run < second_run && second_run < third_run);
    let pull_at =
        |offset, run| client.pull_with("lost", 0, offset, 32, Duration::ZERO, &[], "", run);
    let stale = pull_at(20, first_run).await.unwrap();
    assert_eq!(
        (stale.status, stale.next_offset, stale.messages.len()),
        (PullStatus::OffsetTooBig, 15, 0),
        "a position from the first run goes back to what the first crash kept"
    );
    let from_second = pull_at(20, second_run).await.unwrap();
    assert_eq!(
        from_second.status,
        PullStatus::Found,
        "the second run's 20 was kept"
    );
    let from_second = pull_at(22, second_run).await.unwrap();
    assert_eq!(
        (from_second.status, from_second.next_offset),
        (PullStatus::OffsetTooBig, 20)
    );
    client
        .commit_offset_from("g", "lost", 0, 22, first_run, None)
        .await
        .unwrap();
    assert_eq!(client.query_offset("g", "lost", 0).await.unwrap(), Some(15));
}

/// The same loss, seen by a consumer that stays up through the broker's restart: its
/// position (20) is past the recovered end (15), and producers refill the queue past it
/// before its next pull. The broker tells it by the run its last answer came from: it goes
/// back to 15 and consumes every new message (before, it went on from 20 and skipped the
/// five stored at 15..19).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_stays_up_through_a_crash_consumes_what_is_stored_past_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = sync_broker_on_one_port(&data);
    let addr = broker.addr_string();
    let sent = send_old(&addr, 20).await;
    let consumer = Collector::default().start(&addr, clustering()).await;
    consumer.wait_for("the first 20", |b| b.len() >= 20).await;
    crash_losing_from(&mut broker, &data, sent[15].physical_offset);
    assert_eq!(broker.addr_string(), addr);
    let producer = connect(&addr).await;
    for i in 0..10 {
        let m = OutgoingMessage::new(format!("new-{i}"));
        let r = producer.send("lost", m).await.unwrap();
        assert_eq!(r.queue_offset, 15 + i);
    }
    // Every new message, new-0..new-9 (stored at 15..24).
    consumer.wait_for("the ten new messages", all_new).await;
    consumer.consumer.shutdown().await.unwrap();
}

/// The loss seen by a broadcasting consumer: it read the 20 first messages, kept its
/// position (20) in its local offsets file and stopped; the broker lost 15..19 in a crash
/// and producers refilled the queue past 20. Restarted, it names the broker run its
/// position was read under, goes back to 15 and consumes every new message (before, it
/// went on from 20 and skipped the five stored at 15..19).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcasting_consumer_restarted_after_a_crash_consumes_what_is_stored_past_the_loss() {
    let (dir, data, mut broker) = sync_broker();
    let sent = send_old(&broker.addr_string(), 20).await;
    let options = PushConsumerOptions {
        message_model: MessageModel::Broadcasting,
        offsets_dir: Some(dir.path().join("offsets")),
        ..clustering()
    };
    let first = Collector::default()
        .start(&broker.addr_string(), options.clone())
        .await;
    first.wait_for("the first 20", |b| b.len() >= 20).await;
    // Stopping writes the position (20) to the local offsets file.
    first.consumer.shutdown().await.unwrap();
    crash_losing_from(&mut broker, &data, sent[15].physical_offset);
    let producer = connect(&broker.addr_string()).await;
    for i in 0..10 {
        let m = OutgoingMessage::new(format!("new-{i}"));
        assert_eq!(producer.send("lost", m).await.unwrap().queue_offset, 15 + i);
    }
    let again = Collector::default()
        .start(&broker.addr_string(), options)
        .await;
    again.wait_for("the ten new messages", all_new).await;
    let bodies = again.bodies.lock().unwrap().clone();
    assert!(
        bodies.iter().all(|b| b.starts_with("new-")),
        "from the recovered end, not from the start: {bodies:?}"
    );
    again.consumer.shutdown().await.unwrap();
}

/// A commit that fails is reported and counted: the broker dies after the consumer took
/// the 20 messages and before any periodic commit, so the commit its shutdown makes fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_commits_are_reported_and_counted() {
    let (_dir, _, mut broker) = sync_broker();
    send_old(&broker.addr_string(), 20).await;
    let options = PushConsumerOptions {
        commit_interval_ms: 3_600_000,
        ..clustering()
    };
    let consumer = Collector::default()
        .start(&broker.addr_string(), options)
        .await;
    consumer.wait_for("the 20", |b| b.len() >= 20).await;
    assert_eq!(consumer.consumer.stats().commit_errors, 0);
    broker.kill();
    let stopped = consumer.consumer.shutdown().await;
    assert!(
        stopped.is_err(),
        "the failed commit is the shutdown's error"
    );
    assert!(consumer.consumer.stats().commit_errors >= 1);
}

/// A member that saw a reset of its group's offsets, then a broker restart, still sees the
/// next reset: the epochs are later than the clock's milliseconds, not a count that starts
/// again at each broker run (before, the member kept its higher epoch from the first run,
/// took the second reset for one it had seen and went on from its own position).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_a_broker_restart_reaches_a_member_that_saw_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = sync_broker_on_one_port(&data);
    let addr = broker.addr_string();
    send_old(&addr, 20).await;
    let consumer = Collector::default().start(&addr, clustering()).await;
    consumer.wait_for("the 20", |b| b.len() >= 20).await;
    let admin = connect(&addr).await.client().clone();
    admin.reset_offset_by_time("g", "lost", 0).await.unwrap();
    consumer.wait_for("the 20 again", |b| b.len() >= 40).await;
    assert!(broker.stop(), "a clean stop");
    broker.restart();
    let admin = connect(&addr).await.client().clone();
    admin.reset_offset_by_time("g", "lost", 0).await.unwrap();
    consumer
        .wait_for("the 20 a third time", |b| b.len() >= 60)
        .await;
    // The shutdown commits where the member is: no delivery comes after it.
    consumer.consumer.shutdown().await.unwrap();
    assert_eq!(admin.query_offset("g", "lost", 0).await.unwrap(), Some(20));
    let bodies = consumer.bodies.lock().unwrap().clone();
    for i in 0..20 {
        let n = bodies.iter().filter(|b| **b == format!("old-{i}")).count();
        assert_eq!(n, 3, "old-{i}: {bodies:?}");
    }
}

/// A reset's fence outlives a kill: a member's commit of a position read before the reset,
/// arriving after the broker was killed and started again, is refused (it would undo the
/// reset), and a member joining then is told the reset's epoch in its assignment, so its
/// own commits are taken (told nothing, each would be refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_outlives_a_kill_and_a_position_read_before_it_is_refused_after() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = sync_broker_on_one_port(&data);
    let addr = broker.addr_string();
    send_old(&addr, 20).await;
    let admin = connect(&addr).await.client().clone();
    // A member's position, read before any reset (epoch 0).
    (admin.commit_offset_from("g", "lost", 0, 20, 0, Some(0)))
        .await
        .unwrap();
    admin.reset_offset_by_time("g", "lost", 0).await.unwrap();
    broker.kill();
    broker.restart();
    let admin = connect(&addr).await.client().clone();
    assert_eq!(admin.query_offset("g", "lost", 0).await.unwrap(), Some(0));
    // Told the epoch at once, the member reads the reset offsets and consumes each message
    // once (told it only by a refused commit, it would consume them again after it).
    let consumer = Collector::default().start(&addr, clustering()).await;
    consumer.wait_for("the 20", |b| b.len() >= 20).await;
    // The shutdown commits where the member is.
    consumer.consumer.shutdown().await.unwrap();
    assert_eq!(admin.query_offset("g", "lost", 0).await.unwrap(), Some(20));
    assert_eq!(consumer.bodies.lock().unwrap().len(), 20);
    let stale = admin
        .commit_offset_from("g", "lost", 0, 20, 0, Some(0))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Some(ErrorCode::OffsetsReset), "{stale}");
}

/// The offsets a start lowers (past what a crash kept) are durable before the broker
/// serves: a second crash after producers refilled those offsets, with no commit in
/// between, finds the lowered ones, not the old ones (within the refilled queue by then,
/// they would skip what was stored below them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_lowered_at_a_start_outlive_a_second_crash_after_a_refill() {
    let (_dir, data, mut broker) = sync_broker();
    let sent = send_old_and_commit(&broker.addr_string()).await;
    crash_losing_from(&mut broker, &data, sent[15].physical_offset);
    send_new(&connect(&broker.addr_string()).await, 10).await;
    broker.kill();
    broker.restart();
    let client = connect(&broker.addr_string()).await.client().clone();
    assert_eq!(client.max_offset("lost", 0).await.unwrap(), 25);
    assert_eq!(client.query_offset("g", "lost", 0).await.unwrap(), Some(15));
}

/// A start position read before a crash (a committed offset, or a queue's end for
/// `consume_from`), followed after a refill: the answer names the run it was read under, so
/// the first pull from it is sent back to what the crash kept, not served past the refill
/// (the push consumer starts a queue this way; it pulled such a position as if unnamed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_position_read_before_a_crash_is_sent_back_to_what_it_kept() {
    let (_dir, data, mut broker) = sync_broker();
    let sent = send_old_and_commit(&broker.addr_string()).await;
    let producer = connect(&broker.addr_string()).await;
    let client = producer.client().clone();
    let committed = client.query_offset_read("g", "lost", 0).await.unwrap();
    let committed = committed.expect("committed");
    let end = client.max_offset_read("lost", 0).await.unwrap();
    assert_eq!((committed.offset, end.offset), (20, 20));
    drop((producer, client));
    crash_losing_from(&mut broker, &data, sent[15].physical_offset);
    let producer = connect(&broker.addr_string()).await;
    send_new(&producer, 10).await;
    for start in [committed, end] {
        let first = producer
            .client()
            .pull_with(
                "lost",
                0,
                start.offset,
                32,
                Duration::ZERO,
                &[],
                "",
                start.incarnation,
            )
            .await
            .unwrap();
        assert_eq!(
            (first.status, first.next_offset, first.messages.len()),
            (PullStatus::OffsetTooBig, 15, 0)
        );
    }
}

/// A message a consumer received, then lost in a crash, whose place in the log a later
/// message took: sent back (here to the dead-letter topic), the copy is of it, made from
/// the consumer's own bytes once the broker refused the id (the record there has another
/// CRC), not of the later message, which used to be copied in its stead while the lost
/// one counted as sent back. One whose place nothing took yet (past the log's end) goes
/// back from its bytes too. A message still stored goes back as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_message_is_not_sent_back_as_the_one_stored_at_its_id_since() {
    let (_dir, data, mut broker) = sync_broker();
    let sent = send_old(&broker.addr_string(), 20).await;
    let received = connect(&broker.addr_string())
        .await
        .client()
        .pull("lost", 0, 0, 32, Duration::ZERO, &[])
        .await
        .unwrap()
        .messages;
    assert_eq!(received.len(), 20);
    crash_losing_from(&mut broker, &data, sent[15].physical_offset);
    let producer = connect(&broker.addr_string()).await;
    let taken = producer
        .send("lost", OutgoingMessage::new("new-0"))
        .await
        .unwrap();
    assert_eq!(
        taken.physical_offset, sent[15].physical_offset,
        "the same place"
    );
    let client = producer.client();
    // 17: past the log's end now (new-0 is shorter than old-15), no record at all there.
    for m in [&received[15], &received[17], &received[3]] {
        let back = client.send_back_received("g", m, -1, 16).await.unwrap();
        assert!(back.dead_lettered);
    }
    let dead = client
        .pull("%DLQ%g", 0, 0, 32, Duration::ZERO, &[])
        .await
        .unwrap()
        .messages;
    let bodies: Vec<&[u8]> = dead.iter().map(|m| m.body()).collect();
    assert_eq!(bodies, [&b"old-15"[..], b"old-17", b"old-3"]);
    // The id alone (no CRC to check) still names what is stored there now.
    let id = received[15].msg_id().encode();
    let unchecked = client.send_back("g", &id, -1, 16).await.unwrap();
    assert!(unchecked.dead_lettered);
}

/// A crash that lost a half message (its place in the log cut) gives its offset in the
/// halves' queue to the next half stored, another producer's transaction maybe. An outcome
/// meant for the lost one (its producer's local transaction ended after the restart) is
/// refused as naming no transaction, and the other stays unresolved until its own id
/// resolves it. Before, a transaction's id was that offset alone, and the outcome
/// committed the other one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_for_a_half_a_crash_lost_does_not_resolve_the_one_stored_in_its_place() {
    use ringmq::client::{TransactionOutcome, TransactionProducer};
    let (_dir, data, mut broker) = sync_broker();
    let unsure = |_: &_| TransactionOutcome::Unknown;
    let start = |addr: String| TransactionProducer::start(config(&addr, true), "tg", unsure);
    let tp = start(broker.addr_string()).await.unwrap();
    tp.producer().client().create_topic("txl", 1).await.unwrap();
    let lost = unresolved_half(&tp, "lost").await;
    drop(tp);
    crash_losing_from(&mut broker, &data, lost.physical_offset);
    let tp = start(broker.addr_string()).await.unwrap();
    let other = unresolved_half(&tp, "other").await;
    let commit = TransactionOutcome::Commit;
    stale_commit_refused(&tp, lost.transaction_id).await;
    let listed = tp.producer().client().list_transactions().await.unwrap();
    let ids: Vec<u64> = listed.halves.iter().map(|h| h.transaction_id).collect();
    assert_eq!(ids, [other.transaction_id], "the other stays unresolved");
    tp.end("txl", 0, other.transaction_id, commit, false)
        .await
        .unwrap();
    let pulled = tp
        .producer()
        .client()
        .pull("txl", 0, 0, 32, Duration::ZERO, &[]);
    let bodies: Vec<Vec<u8>> = (pulled.await.unwrap().messages.iter())
        .map(|m| m.body().to_vec())
        .collect();
    assert_eq!(bodies, [b"other".to_vec()]);
    // Not taken for the outcome of the other once that one is resolved either (told it
    // was committed, the producer would take its lost message for delivered), nor after a
    // restart (the outcome read back from its op record).
    stale_commit_refused(&tp, lost.transaction_id).await;
    drop(tp);
    assert!(broker.stop(), "a clean stop");
    broker.restart();
    let tp = start(broker.addr_string()).await.unwrap();
    stale_commit_refused(&tp, lost.transaction_id).await;
}

/// A commit of transaction `id` of topic `txl` is refused as naming no transaction.
async fn stale_commit_refused(tp: &ringmq::client::TransactionProducer, id: u64) {
    let commit = ringmq::client::TransactionOutcome::Commit;
    match tp.end("txl", 0, id, commit, false).await {
        Err(ringmq::client::ClientError::Broker { code, message, .. }) => {
            assert_eq!(code, Some(ErrorCode::TransactionNotFound), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

/// A half message of `body` for topic `txl`, its local transaction undecided.
async fn unresolved_half(
    tp: &ringmq::client::TransactionProducer,
    body: &str,
) -> ringmq::client::SendResult {
    let unsure = |_: &_| ringmq::client::TransactionOutcome::Unknown;
    let sent = tp.send_in_transaction("txl", OutgoingMessage::new(body.to_owned()), unsure);
    sent.await.unwrap().send
}

/// A one-shard sync-flush broker in `data` on a port it listens on again after a restart
/// (the address stays valid for clients across crashes).
fn sync_broker_on_one_port(data: &std::path::Path) -> BrokerProcess {
    // A port whose direct port (port + 1, the one shard's) is free too.
    let port = loop {
        let p = common::free_port();
        if p < 60_000 && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            break p;
        }
    };
    let listen = format!("127.0.0.1:{port}").parse().unwrap();
    BrokerProcess::start_on(listen, data, 1, &["--flush", "sync"])
}

/// A one-shard sync-flush broker on a new data directory (in the returned temp dir).
fn sync_broker() -> (tempfile::TempDir, std::path::PathBuf, BrokerProcess) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = BrokerProcess::start(&data, 1, &["--flush", "sync"]);
    (dir, data, broker)
}

async fn connect(addr: &str) -> Producer {
    Producer::connect(config(addr, true)).await.unwrap()
}

/// Creates the one-queue topic `lost` and sends `old-0..old-{n-1}` to it.
async fn send_old(addr: &str, n: usize) -> Vec<ringmq::client::SendResult> {
    let producer = connect(addr).await;
    producer.client().create_topic("lost", 1).await.unwrap();
    let mut sent = Vec::new();
    for i in 0..n {
        let m = OutgoingMessage::new(format!("old-{i}"));
        sent.push(producer.send("lost", m).await.unwrap());
    }
    sent
}

/// Sends `old-0..old-19` to `lost` and commits group `g` past them (20).
async fn send_old_and_commit(addr: &str) -> Vec<ringmq::client::SendResult> {
    let sent = send_old(addr, 20).await;
    let client = connect(addr).await.client().clone();
    client.commit_offset("g", "lost", 0, 20).await.unwrap();
    sent
}

/// Sends `new-0..new-{n-1}` to `lost`.
async fn send_new(producer: &Producer, n: usize) {
    for i in 0..n {
        let m = OutgoingMessage::new(format!("new-{i}"));
        producer.send("lost", m).await.unwrap();
    }
}

fn all_new(bodies: &[String]) -> bool {
    (0..10).all(|i| bodies.iter().any(|m| *m == format!("new-{i}")))
}

fn clustering() -> PushConsumerOptions {
    PushConsumerOptions {
        consume_from: ConsumeFrom::FirstOffset,
        pull_wait_ms: 500,
        // Long enough for a restart and a refill to come before the next pull.
        pull_error_backoff_ms: 3_000,
        ..Default::default()
    }
}

/// A push consumer of `lost` in group `g` that keeps the bodies it is given.
#[derive(Default)]
struct Collector {
    bodies: Arc<Mutex<Vec<String>>>,
    /// Signalled after each delivery (a permit is kept when nobody waits: no wake-up lost).
    delivered: Arc<Notify>,
}

struct Started {
    consumer: PushConsumer,
    bodies: Arc<Mutex<Vec<String>>>,
    delivered: Arc<Notify>,
}

impl Collector {
    async fn start(self, addr: &str, options: PushConsumerOptions) -> Started {
        let mut cfg = config(addr, true);
        // One id across restarts: a broadcasting consumer's local offsets file is its.
        cfg.client_id = format!("crash-consumer-{}", std::process::id());
        let consumer = PushConsumer::new(cfg, "g", options).unwrap();
        consumer.subscribe("lost", "*").unwrap();
        let (log, wake) = (self.bodies.clone(), self.delivered.clone());
        consumer
            .register_concurrent(move |messages| {
                log.lock().unwrap().extend(
                    messages
                        .iter()
                        .map(|m| String::from_utf8_lossy(m.body()).into_owned()),
                );
                wake.notify_one();
                ConsumeStatus::Success
            })
            .unwrap();
        consumer.start().await.unwrap();
        Started {
            consumer,
            bodies: self.bodies,
            delivered: self.delivered,
        }
    }
}

impl Started {
    /// Waits, woken by deliveries, until what was consumed passes `done`; 30 s at most.
    async fn wait_for(&self, what: &str, done: fn(&[String]) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done(&self.bodies.lock().unwrap()) {
            let woken = tokio::time::timeout_at(deadline, self.delivered.notified()).await;
            assert!(
                woken.is_ok(),
                "gave up waiting: {what}; consumed {:?}",
                self.bodies.lock().unwrap()
            );
        }
    }
}

/// A topic deletion a shard cannot make durable (here: its group offsets cannot be
/// rewritten without the topic's) is answered with the error, not OK, and the name cannot
/// be taken by a new topic until every shard has made the deletion durable (retried in the
/// background). After that, a crash brings back none of the old topic's group offsets,
/// which the new topic would otherwise take for its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_that_could_not_be_made_durable_is_reported_and_tried_again() {
    let (dir, mut broker, obstacles) = delete_with_offsets_blocked().await;
    let client = connect(&broker.addr_string()).await.client().clone();
    let e = client.create_topic("gone", 4).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    for o in &obstacles {
        std::fs::remove_dir(o).unwrap();
    }
    // Once every shard has made the deletion durable, the tombstone leaves the saved table
    // (polled every 100 ms, at most 20 s), and the name may be created again.
    let path = dir.path().join("data").join("topics.json");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&path).unwrap().contains("deleting") {
        assert!(std::time::Instant::now() < deadline, "the tombstone stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client.create_topic("gone", 4).await.unwrap();
    drop(client);
    broker.kill();
    broker.restart();
    let client = connect(&broker.addr_string()).await.client().clone();
    for q in 0..4 {
        assert_eq!(client.query_offset("g", "gone", q).await.unwrap(), None);
    }
}

/// A deletion a crash cut before the shards made it durable (the saved table holds its
/// tombstone; the shards' group offsets of it are still in their files) is finished after
/// the next start: the name is refused until then, and a topic created again under it has
/// none of the old group offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_a_crash_left_undone_is_finished_after_the_next_start() {
    let (_dir, mut broker, obstacles) = delete_with_offsets_blocked().await;
    broker.kill();
    for o in &obstacles {
        std::fs::remove_dir(o).unwrap();
    }
    broker.restart();
    let client = connect(&broker.addr_string()).await.client().clone();
    create_once_deleted(&client, "gone").await;
    for q in 0..4 {
        assert_eq!(client.query_offset("g", "gone", q).await.unwrap(), None);
        assert_eq!(client.max_offset("gone", q).await.unwrap(), 0);
    }
    let log = broker.stderr();
    assert!(
        log.contains("the deletion of topic gone was not made durable"),
        "{log}"
    );
}

/// Creates `topic` (4 queues) once the broker takes the name again. The broker tells of
/// the end of a deletion's background retry in no other way: polled every 100 ms while it
/// answers `Conflict`, for at most 20 s (the first retry is 1 s after the failure or start).
async fn create_once_deleted(client: &ringmq::client::Client, topic: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match client.create_topic(topic, 4).await {
            Ok(()) => return,
            Err(e) if e.code() == Some(ErrorCode::Conflict) => {
                assert!(std::time::Instant::now() < deadline, "still refused: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A two-shard async broker whose topic `gone` (4 queues, 16 messages, group `g` committed
/// to each queue's end) was deleted while a directory stood where each shard writes its
/// offsets snapshot (the returned obstacles, still there): the deletion was answered with
/// `StoreIo`. Returns the temp dir, the broker and the obstacles.
async fn delete_with_offsets_blocked() -> (tempfile::TempDir, BrokerProcess, Vec<std::path::PathBuf>)
{
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = BrokerProcess::start(&data, 2, &[]);
    let producer = connect(&broker.addr_string()).await;
    let client = producer.client().clone();
    client.create_topic("gone", 4).await.unwrap();
    let mut ends = [0u64; 4];
    for i in 0..16 {
        let sent = producer
            .send("gone", OutgoingMessage::new(format!("m-{i}")))
            .await
            .unwrap();
        ends[sent.queue_id as usize] = sent.queue_offset + 1;
    }
    for (q, &end) in ends.iter().enumerate() {
        client
            .commit_offset("g", "gone", q as u32, end)
            .await
            .unwrap();
    }
    let obstacles: Vec<_> = (0..2)
        .map(|s| data.join(format!("shard-{s}")).join("offsets.log.tmp"))
        .collect();
    for o in &obstacles {
        std::fs::create_dir(o).unwrap();
    }
    let e = client.delete_topic("gone").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::StoreIo), "{e}");
    assert!(e.to_string().contains("could not make that durable"), "{e}");
    (dir, broker, obstacles)
}

/// `ringmq consume --follow` names the broker run its position comes from in each pull.
/// After a crash that lost the tail it had printed, its next pull (made here after new
/// messages were stored past the recovered end) goes on from where the queue ended at the
/// restart: the new messages are printed, not skipped as a position past the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_follow_prints_what_was_stored_after_a_crash_lost_what_it_printed() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = sync_broker_on_one_port(&data);
    let addr = broker.addr_string();
    let sent = send_old(&addr, 20).await;
    let mut follow = std::process::Command::new(env!("CARGO_BIN_EXE_ringmq"))
        .args(["--broker", &addr, "consume", "lost", "--from", "first"])
        .args(["--follow", "--max", "23", "--wait-ms", "500"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = follow.id() as i32;
    let stdout = follow.stdout.take().unwrap();
    let mut follow = KilledOnDrop(follow);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let body = line.unwrap().split_once(" body=").unwrap().1.to_owned();
            if tx.send(body).is_err() {
                return;
            }
        }
    });
    let printed = |n: usize| -> Vec<String> {
        (0..n)
            .map(|_| lines.recv_timeout(Duration::from_secs(20)).unwrap())
            .collect()
    };
    let want: Vec<_> = (0..20).map(|i| format!("old-{i}")).collect();
    assert_eq!(printed(20), want);
    // Stopped while the broker crashes and takes new messages, so its next pull comes
    // after them.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    crash_losing_from(&mut broker, &data, sent[15].physical_offset);
    assert_eq!(broker.addr_string(), addr);
    send_new(&connect(&addr).await, 3).await;
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let new = printed(3);
    assert_eq!(new, ["new-0", "new-1", "new-2"]);
    assert!(follow.0.wait().unwrap().success());
}

/// A child process killed (and reaped) when the test ends, also when it fails.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A topic deleted and created again starts its queues' offsets over. A position read in
/// the old topic, pulled or committed once the new queue holds that many messages, names
/// the run it was read under, earlier than the new topic's creation stamp: the pull goes
/// back to the queue's start and the commit stores the start, so the new topic's messages
/// below it are consumed, not skipped (before the stamps, both were taken as positions of
/// the new queue). Positions read in the new topic stand, before and after a SIGKILL and
/// restart. Two shards: the queues' shards learn the stamp from shard 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_read_before_its_topic_was_created_again_goes_back_to_the_start_even_within_it()
{
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = BrokerProcess::start(&data, 2, &["--flush", "sync"]);
    let producer = connect(&broker.addr_string()).await;
    let client = producer.client().clone();
    client.create_topic("again", 2).await.unwrap();
    for i in 0..40 {
        let m = OutgoingMessage::new(format!("old-{i}"));
        producer.send("again", m).await.unwrap();
    }
    let mut old = Vec::new();
    for q in 0..2 {
        let read = client.pull("again", q, 0, 64, Duration::ZERO, &[]);
        let read = read.await.unwrap();
        assert!(read.next_offset > 0, "queue {q} holds old messages");
        old.push((read.next_offset, read.incarnation));
    }
    client.delete_topic("again").await.unwrap();
    client.create_topic("again", 2).await.unwrap();
    for i in 0..200 {
        let m = OutgoingMessage::new(format!("new-{i}"));
        producer.send("again", m).await.unwrap();
    }
    let stale_is_sent_back = |client: ringmq::client::Client, committed: u64| {
        let old = old.clone();
        async move {
            for (q, &(position, run)) in (0u32..).zip(&old) {
                let stale =
                    client.pull_with("again", q, position, 64, Duration::ZERO, &[], "", run);
                let stale = stale.await.unwrap();
                assert!(
                    stale.max_offset > position,
                    "the new queue {q} holds the position"
                );
                assert_eq!(
                    (stale.status, stale.next_offset, stale.messages.len()),
                    (PullStatus::OffsetTooBig, 0, 0),
                    "queue {q}"
                );
                let commit = client.commit_offset_from("g", "again", q, position, run, None);
                commit.await.unwrap();
                let kept = client.query_offset("g", "again", q).await.unwrap();
                assert_eq!(kept, Some(committed), "queue {q}");
            }
        }
    };
    stale_is_sent_back(client.clone(), 0).await;
    // Read in the new topic: the position stands.
    let mut new = Vec::new();
    for q in 0..2 {
        let read = client.pull("again", q, 0, 10, Duration::ZERO, &[]).await;
        let read = read.unwrap();
        assert_eq!(read.next_offset, 10);
        new.push(read.incarnation);
    }
    let new_positions_stand = |client: ringmq::client::Client| {
        let new = new.clone();
        async move {
            for (q, &run) in (0u32..).zip(&new) {
                let read = client.pull_with("again", q, 10, 1, Duration::ZERO, &[], "", run);
                let read = read.await.unwrap();
                assert_eq!(read.status, PullStatus::Found, "queue {q}");
                let first = &read.messages[0];
                assert_eq!(first.queue_offset(), 10, "queue {q}");
                assert!(first.body().starts_with(b"new-"), "queue {q}");
            }
        }
    };
    new_positions_stand(client.clone()).await;
    for (q, &run) in (0u32..).zip(&new) {
        let commit = client.commit_offset_from("g", "again", q, 10, run, None);
        commit.await.unwrap();
    }
    drop((producer, client));
    broker.kill();
    broker.restart();
    let client = connect(&broker.addr_string()).await.client().clone();
    new_positions_stand(client.clone()).await;
    // The old positions are past 10: taken, they would move the offsets up to them.
    stale_is_sent_back(client, 10).await;
}

/// Async flush: a commit is answered once the offsets file has it, so one the file cannot
/// take (its rewrite blocked) is answered `StoreIo` rather than acknowledged and only
/// logged; taken once the way is clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_commit_the_offsets_file_cannot_take_is_answered_with_an_error() {
    let (_dir, broker, obstacles) = delete_with_offsets_blocked().await;
    let producer = connect(&broker.addr_string()).await;
    let client = producer.client().clone();
    client.create_topic("kept", 2).await.unwrap();
    for i in 0..8 {
        let m = OutgoingMessage::new(format!("k-{i}"));
        producer.send("kept", m).await.unwrap();
    }
    for q in 0..2 {
        let e = client.commit_offset("g2", "kept", q, 1).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::StoreIo), "{e}");
        assert!(e.to_string().contains("offsets"), "{e}");
    }
    for o in &obstacles {
        std::fs::remove_dir(o).unwrap();
    }
    for q in 0..2 {
        client.commit_offset("g2", "kept", q, 2).await.unwrap();
        assert_eq!(client.query_offset("g2", "kept", q).await.unwrap(), Some(2));
    }
}

/// Async flush: an acknowledged commit outlives a kill of the broker's process, a queue's
/// first one and later ones alike (written before the answer, not behind it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_commits_acknowledged_outlive_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let producer = connect(&broker.addr_string()).await;
    producer.client().create_topic("k", 4).await.unwrap();
    for i in 0..200 {
        let m = OutgoingMessage::new(format!("k-{i}"));
        producer.send("k", m).await.unwrap();
    }
    drop(producer);
    for round in 1..=3u64 {
        let client = connect(&broker.addr_string()).await.client().clone();
        for q in 0..4u32 {
            let offset = round * 10 + u64::from(q);
            client.commit_offset("g", "k", q, offset).await.unwrap();
        }
        drop(client);
        broker.kill();
        broker.restart();
        let client = connect(&broker.addr_string()).await.client().clone();
        for q in 0..4u32 {
            let kept = client.query_offset("g", "k", q).await.unwrap();
            assert_eq!(
                kept,
                Some(round * 10 + u64::from(q)),
                "round {round}, queue {q}"
            );
        }
    }
}
