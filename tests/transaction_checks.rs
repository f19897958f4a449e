//! Transaction check-backs against the real broker binary and the real client: checks
//! that commit, roll back or answer unknown (discarded after the last check), another
//! producer of the group asked when one is gone or cannot take checks, checks nobody could
//! take or no checker answered not counted, every group's halves reached while another's fill the rounds, and the
//! message id a checked half carries.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::broker::BrokerProcess;
use common::runtime;
use common::txn::{by_body, eventually, pending_half, unsure_producer, visible};
use common::FAST_CHECKS;
use ringmq::client::{
    Client, ClientConfig, OutgoingMessage, TransactionOutcome, TransactionProducer,
};
use ringmq::protocol::ErrorCode;

#[test]
fn check_backs_commit_roll_back_or_discard_after_the_last_check() {
    let dir = tempfile::tempdir().unwrap();
    // Slower than FAST_CHECKS: the halves are listed unresolved before their first check
    // (2 s), and an answer is never so late (1 s) that its half is asked again.
    let timings = [
        "--transaction-timeout-ms",
        "2000",
        "--transaction-check-interval-ms",
        "1000",
        "--transaction-check-max",
        "3",
    ];
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &timings);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let asked = Arc::new(AtomicU32::new(0));
        let counter = asked.clone();
        let tp = TransactionProducer::start(ClientConfig::new(&addr), "txc", move |m| {
            counter.fetch_add(1, Ordering::SeqCst);
            by_body(m)
        })
        .await
        .unwrap();
        let client = tp.producer().client().clone();
        client.create_topic("tc", 4).await.unwrap();
        for body in ["commit-1", "rollback-1", "never-1"] {
            let r = tp
                .send_in_transaction("tc", OutgoingMessage::new(body), |_| {
                    TransactionOutcome::Unknown
                })
                .await
                .unwrap();
            assert!(r.end_error.is_none());
        }
        // Unresolved, and listed as such.
        let list = client.list_transactions().await.unwrap();
        assert_eq!(list.halves.len(), 3, "{list:?}");
        assert!(list
            .halves
            .iter()
            .all(|h| h.producer_group == "txc" && h.topic == "tc"));
        assert!(
            visible(&client, "tc").await.is_empty(),
            "nothing visible before an outcome"
        );

        eventually(
            "commit-1 committed by its check",
            Duration::from_secs(20),
            async || visible(&client, "tc").await.contains_key("commit-1"),
        )
        .await;
        eventually(
            "never-1 discarded after 3 checks",
            Duration::from_secs(20),
            async || {
                let list = client.list_transactions().await.unwrap();
                list.halves.is_empty() && list.discarded == 1
            },
        )
        .await;
        let seen = visible(&client, "tc").await;
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["commit-1"]);
        assert_eq!(seen["commit-1"].len(), 1);
        // 1 check for commit-1, 1 for rollback-1, 3 for never-1.
        assert_eq!(asked.load(Ordering::SeqCst), 5);
        // The discarded one is kept for inspection.
        let list = client.list_transactions().await.unwrap();
        assert_eq!(list.recently_discarded.len(), 1);
        let kept = &list.recently_discarded[0];
        assert_eq!((kept.checks, kept.producer_group.as_str()), (3, "txc"));
        let copy = client.message_by_id(&kept.msg_id).await.unwrap().unwrap();
        assert_eq!(copy.body(), b"never-1");
        // Its id sent back for a retry (or as a dead letter) is refused: the copy would
        // deliver a message never committed. Before, it went to the group's retry topic.
        for level in [0, -1] {
            let e = client
                .send_back("g-txc", &kept.msg_id, level, 16)
                .await
                .unwrap_err();
            assert_eq!(e.code(), Some(ErrorCode::InvalidMessage), "{e}");
            assert!(e.to_string().contains("broker's own topic"), "{e}");
        }
        assert_eq!(
            client
                .schedule_stats()
                .await
                .unwrap()
                .iter()
                .map(|s| s.pending)
                .sum::<u64>(),
            0
        );
        for topic in ["%RETRY%g-txc", "%DLQ%g-txc"] {
            let e = client.max_offset(topic, 0).await.unwrap_err();
            assert_eq!(e.code(), Some(ErrorCode::TopicNotFound), "{topic}: {e}");
        }
        tp.shutdown().await;
    });
}

#[test]
fn when_the_asked_producer_is_gone_another_producer_of_the_group_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &[
            "--transaction-timeout-ms",
            "300",
            "--transaction-check-interval-ms",
            "300",
            "--transaction-check-max",
            "50",
        ],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let asked_a = Arc::new(AtomicU32::new(0));
        let counter = asked_a.clone();
        // A never decides.
        let a = TransactionProducer::start(ClientConfig::new(&addr), "txk", move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            TransactionOutcome::Unknown
        })
        .await
        .unwrap();
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("tk", 2).await.unwrap();
        pending_half(&a, "tk", OutgoingMessage::new("commit-me")).await;
        eventually("A asked", Duration::from_secs(20), async || {
            asked_a.load(Ordering::SeqCst) > 0
        })
        .await;
        // A goes away before answering; B of the same group is asked next.
        a.shutdown().await;
        let b = TransactionProducer::start(ClientConfig::new(&addr), "txk", by_body)
            .await
            .unwrap();
        eventually("B's commit visible", Duration::from_secs(20), async || {
            visible(&client, "tk").await.contains_key("commit-me")
        })
        .await;
        assert!(client.list_transactions().await.unwrap().halves.is_empty());
        b.shutdown().await;
    });
}

/// Checks pushed to a producer whose connection cannot take them (it never reads, and the
/// broker holds 16 MiB for it at most) do not count against the check limit: the group's
/// transactions are not discarded for checks nobody could answer, and a producer that
/// reads answers them later (before, each dropped check counted, and all were discarded),
/// while the deaf one is still there.
#[test]
fn checks_a_producers_connection_could_not_take_do_not_count() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let metrics = common::free_addr().to_string();
    // The first check 8 s after a half, not FAST_CHECKS' 300 ms: their producer answers
    // Unknown while the 400 are sent, and each check it answers counts, so on a slow
    // machine the first halves would be discarded before the deaf producer comes.
    let mut args = vec!["--metrics-listen", metrics.as_str()];
    args.extend_from_slice(FAST_CHECKS);
    args[3] = "8000";
    assert_eq!(args[2], "--transaction-timeout-ms");
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &args);
    let addr = broker.addr_string();
    const HALVES: usize = 400;
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("txfull", 1).await.unwrap();
        // 400 halves of 64 KiB: 25 MiB of checks a round. Their producer goes.
        let tp = unsure_producer(&addr, "txfull").await;
        let pad = "x".repeat(64 << 10);
        let sending = std::time::Instant::now();
        for i in 0..HALVES {
            let body = format!("commit-{i}-{pad}");
            pending_half(&tp, "txfull", OutgoingMessage::new(body)).await;
        }
        tp.shutdown().await;
        assert!(
            sending.elapsed() < Duration::from_secs(8),
            "the halves took {:?} to send, past their first check: too slow a machine for this test",
            sending.elapsed()
        );
        // The group's only producer now: a connection that says it is one, and never reads.
        let mut deaf = std::net::TcpStream::connect(&addr).unwrap();
        let hb = ringmq::protocol::ProducerHeartbeat {
            group: "txfull".into(),
            client_id: "deaf".into(),
        };
        let mut frame = Vec::new();
        ringmq::protocol::encode_request(&hb.into(), 1, &mut frame).unwrap();
        deaf.write_all(&frame).unwrap();
        // Two rounds' worth of checks could not be taken (the deaf connection is full):
        // by then every half was due three times at least.
        let undelivered = || {
            let s = common::metrics::scrape_any(&metrics);
            common::metrics::sum(&s, "ringmq_transaction_checks_undelivered_total", &[])
        };
        eventually(
            "checks the deaf producer cannot take",
            Duration::from_secs(60),
            async || undelivered() >= (2 * HALVES) as f64,
        )
        .await;
        let list = client.list_transactions().await.unwrap();
        assert_eq!(list.discarded, 0, "{:?}", list.recently_discarded.first());
        assert_eq!(list.halves.len(), HALVES);
        assert!(list.halves.iter().all(|h| h.checks < 3));
        // A producer that reads, beside the deaf one (still its group's first): every one is
        // committed by its check, as each check asks the next producer, delivered or not.
        // Before, a check the deaf one could not take did not move the turn on, and every
        // half went on being asked of it alone.
        let checker = TransactionProducer::start(ClientConfig::new(&addr), "txfull", by_body)
            .await
            .unwrap();
        eventually(
            "every transaction committed",
            Duration::from_secs(60),
            async || visible(&client, "txfull").await.len() == HALVES,
        )
        .await;
        assert_eq!(client.list_transactions().await.unwrap().discarded, 0);
        drop(deaf);
        checker.shutdown().await;
    });
}

/// The message a check-back hands the checker has the message id its send was answered
/// with, on every shard: a checker that keeps its local transactions by message id finds
/// them. Before, the id named shard 0 whichever shard held the half, so a checker looking
/// up a half stored on another shard found nothing (and would typically roll back).
#[test]
fn a_checked_half_has_the_message_id_its_send_was_answered_with() {
    use ringmq::protocol::MessageId;
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, FAST_CHECKS);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let checked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = checked.clone();
        let tp = TransactionProducer::start(ClientConfig::new(&addr), "txid", move |m| {
            // The topic the half was sent to, not the broker's topic of halves.
            assert_eq!(m.origin_topic(), "tid");
            seen.lock().unwrap().push(m.msg_id().to_string());
            TransactionOutcome::Rollback
        })
        .await
        .unwrap();
        tp.producer().client().create_topic("tid", 4).await.unwrap();
        let mut sent = Vec::new();
        for i in 0..8 {
            let message = OutgoingMessage::new(format!("half-{i}"));
            sent.push(pending_half(&tp, "tid", message).await.msg_id);
        }
        let stores: BTreeSet<u32> = sent
            .iter()
            .map(|id| MessageId::parse(id).unwrap().store_id)
            .collect();
        assert_eq!(stores, BTreeSet::from([0, 1]), "halves on both shards");
        eventually("every half checked", Duration::from_secs(20), async || {
            let checked = checked.lock().unwrap();
            sent.iter().all(|id| checked.contains(id))
        })
        .await;
        let checked: BTreeSet<String> = checked.lock().unwrap().iter().cloned().collect();
        assert_eq!(checked, sent.into_iter().collect::<BTreeSet<_>>());
        tp.shutdown().await;
    });
}

/// A group gone with more halves than a round of checks takes (1,024), each due again
/// within the interval (their checks, undelivered, do not count), does not keep another
/// group's halves, stored after them, from their checks. Before, every round took the
/// due halves from the lowest offset up: the gone group's, every time.
#[test]
fn a_gone_group_with_more_halves_than_a_round_does_not_starve_another_groups_checks() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = FAST_CHECKS.to_vec();
    args[5] = "1000000";
    assert_eq!(args[4], "--transaction-check-max");
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &args);
    let addr = broker.addr_string();
    const GONE: usize = 2_000;
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("tstarve", 1).await.unwrap();
        let gone = unsure_producer(&addr, "txgone").await;
        let sends = (0..GONE)
            .map(|i| pending_half(&gone, "tstarve", OutgoingMessage::new(format!("gone-{i}"))));
        futures_util::future::join_all(sends).await;
        gone.shutdown().await;
        let live = TransactionProducer::start(ClientConfig::new(&addr), "txlive", by_body)
            .await
            .unwrap();
        pending_half(&live, "tstarve", OutgoingMessage::new("commit-live")).await;
        eventually(
            "the live group's half checked and committed",
            Duration::from_secs(20),
            async || {
                visible(&client, "tstarve")
                    .await
                    .contains_key("commit-live")
            },
        )
        .await;
        let list = client.list_transactions().await.unwrap();
        assert_eq!(
            list.unresolved, GONE as u64,
            "the gone group's halves stay pending"
        );
        assert_eq!(list.discarded, 0);
        live.shutdown().await;
    });
}

/// A check counts against `--transaction-check-max` only once a checker answers it
/// "unknown": checks delivered to a producer whose checker does not answer (here, busy
/// with the first one: later checks of the same transaction are skipped) do not count,
/// so the transaction is not discarded, and the checker's late commit lands. Before, every
/// check delivered counted, and the transaction was discarded after three.
#[test]
fn checks_no_checker_answered_do_not_count() {
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, FAST_CHECKS);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = std::sync::Mutex::new(held);
        let asked = Arc::new(AtomicU32::new(0));
        let counter = asked.clone();
        let tp = TransactionProducer::start(ClientConfig::new(&addr), "txslow", move |m| {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = held.lock().unwrap().recv_timeout(Duration::from_secs(60));
            by_body(m)
        })
        .await
        .unwrap();
        let client = tp.producer().client().clone();
        client.create_topic("ts", 1).await.unwrap();
        pending_half(&tp, "ts", OutgoingMessage::new("commit-late")).await;
        eventually("the checker asked", Duration::from_secs(20), async || {
            asked.load(Ordering::SeqCst) > 0
        })
        .await;
        // "Unknown" answered five times to the check delivered counts once.
        let half = client.list_transactions().await.unwrap().halves[0].clone();
        for _ in 0..5 {
            let unknown = TransactionOutcome::Unknown;
            let id = half.transaction_id;
            tp.end("ts", half.queue_id, id, unknown, true)
                .await
                .unwrap();
        }
        // Ten check intervals, each finding the first check still being answered.
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        while Instant::now() < deadline {
            tick.tick().await;
            let list = client.list_transactions().await.unwrap();
            assert_eq!(list.discarded, 0, "{:?}", list.recently_discarded.first());
            assert_eq!(list.halves.len(), 1);
            assert_eq!(list.halves[0].checks, 1, "one answer counted, to one check");
        }
        release.send(()).unwrap();
        eventually(
            "the late commit visible",
            Duration::from_secs(20),
            async || visible(&client, "ts").await.contains_key("commit-late"),
        )
        .await;
        let list = client.list_transactions().await.unwrap();
        assert_eq!((list.discarded, list.halves.len()), (0, 0));
        assert_eq!(visible(&client, "ts").await["commit-late"].len(), 1);
        tp.shutdown().await;
    });
}

/// `--transaction-check-max 0` (every half message discarded at its first check, its
/// producer never asked), `--sql-filters-mb 0`, `--retention-hours 0` (every sealed segment
/// deleted, consumed or not), `--send-wait-max-ms 0` and `--send-backlog-max-mb 0` (every
/// send answered busy while anything is unacknowledged) are refused at start, naming the
/// flag.
#[test]
fn a_zero_check_max_or_sql_filters_mb_is_refused_at_start() {
    use ringmq::shard::{Broker, BrokerConfig};
    let dir = tempfile::tempdir().unwrap();
    let base = || BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("data"),
        shards: 1,
        ..Default::default()
    };
    let zeros = [
        BrokerConfig {
            transaction_check_max: 0,
            ..base()
        },
        BrokerConfig {
            sql_filters_mb: 0,
            ..base()
        },
        BrokerConfig {
            retention_hours: 0,
            ..base()
        },
        BrokerConfig {
            send_wait_max_ms: 0,
            ..base()
        },
        BrokerConfig {
            send_backlog_max_mb: 0,
            ..base()
        },
    ];
    for (cfg, flag) in zeros.into_iter().zip([
        "transaction-check-max",
        "sql-filters-mb",
        "retention-hours",
        "send-wait-max-ms",
        "send-backlog-max-mb",
    ]) {
        let Err(e) = Broker::start(cfg) else {
            panic!("started with {flag} 0");
        };
        assert!(
            e.to_string()
                .contains(&format!("{flag} must be at least 1")),
            "{e}"
        );
    }
}
