//! Transactional messages against the real broker binary (2 shards) and the real client:
//! commit, rollback, typed errors for unknown and resolved transactions, commits racing
//! their topic's deletion, SIGKILL of the broker in the middle of many concurrent
//! transactions, halves past retention. The check-backs are in `transaction_checks.rs`.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::broker::BrokerProcess;
use common::runtime;
use ringmq::client::{
    Client, ClientConfig, Message, OutgoingMessage, TransactionOutcome, TransactionProducer,
};
use ringmq::protocol::record::RecordView;
use ringmq::protocol::ErrorCode;

use common::txn::{code, eventually, pending_half, unsure_producer, visible};
use common::FAST_CHECKS;

#[test]
fn commit_and_rollback_and_typed_errors_for_unknown_or_resolved_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = unsure_producer(&addr, "txg").await;
        let client = tp.producer().client().clone();
        client.create_topic("tx", 4).await.unwrap();
        let mut committed = Vec::new();
        let mut rolled_back = Vec::new();
        for i in 0..8 {
            let commit = tp
                .send_in_transaction(
                    "tx",
                    OutgoingMessage::new(format!("c{i}"))
                        .with_key(format!("key{i}"))
                        .with_tags("T")
                        .with_property("p", "v"),
                    |sent| {
                        assert!(sent.transaction_id > 0);
                        TransactionOutcome::Commit
                    },
                )
                .await
                .unwrap();
            assert!(commit.end_error.is_none(), "{:?}", commit.end_error);
            committed.push(commit.send);
            let rollback = tp
                .send_in_transaction("tx", OutgoingMessage::new(format!("r{i}")), |_| {
                    TransactionOutcome::Rollback
                })
                .await
                .unwrap();
            assert!(rollback.end_error.is_none());
            rolled_back.push(rollback.send);
        }
        let seen = visible(&client, "tx").await;
        let bodies: Vec<&String> = seen.keys().collect();
        assert_eq!(
            bodies,
            (0..8)
                .map(|i| format!("c{i}"))
                .collect::<Vec<_>>()
                .iter()
                .collect::<Vec<_>>()
        );
        for (body, copies) in &seen {
            assert_eq!(copies.len(), 1, "{body} once");
            let m = &copies[0];
            assert_eq!(m.property("p"), Some("v"));
            assert_eq!(m.tags(), Some("T"));
            // Every commit carries a unique key (the broker gives one to a message without),
            // by which a restart finds a commit whose op record a crash lost.
            let uniq = m.property("UNIQ_KEY").expect("a UNIQ_KEY");
            let found = client
                .messages_by_key("tx", uniq, 0, i64::MAX, 8)
                .await
                .unwrap();
            assert_eq!(found.len(), 1, "{body}: found by its unique key");
            assert_eq!(found[0].body(), m.body());
            assert_eq!(m.keys().collect::<Vec<_>>(), [format!("key{}", &body[1..])]);
            assert!(m.property("TRAN_ID").is_some());
            assert_eq!(m.property("TRAN_MSG"), None);
        }
        // Found by key like any message.
        let by_key = client
            .messages_by_key("tx", "key3", 0, i64::MAX, 16)
            .await
            .unwrap();
        assert_eq!(by_key.len(), 1);
        assert_eq!(by_key[0].body(), b"c3");

        // A commit again is accepted (idempotent) and changes nothing; the other outcome
        // is refused.
        let c = &committed[0];
        tp.end(
            "tx",
            c.queue_id,
            c.transaction_id,
            TransactionOutcome::Commit,
            false,
        )
        .await
        .unwrap();
        assert_eq!(
            code(
                tp.end(
                    "tx",
                    c.queue_id,
                    c.transaction_id,
                    TransactionOutcome::Rollback,
                    false
                )
                .await
            ),
            ErrorCode::TransactionResolved
        );
        let r = &rolled_back[0];
        assert_eq!(
            code(
                tp.end(
                    "tx",
                    r.queue_id,
                    r.transaction_id,
                    TransactionOutcome::Commit,
                    false
                )
                .await
            ),
            ErrorCode::TransactionResolved
        );
        assert_eq!(
            code(
                tp.end("tx", c.queue_id, 987_654, TransactionOutcome::Commit, false)
                    .await
            ),
            ErrorCode::TransactionNotFound
        );
        assert_eq!(
            code(
                tp.end("tx", c.queue_id, 0, TransactionOutcome::Commit, false)
                    .await
            ),
            ErrorCode::TransactionNotFound
        );
        assert_eq!(visible(&client, "tx").await.len(), 8);
        let list = client.list_transactions().await.unwrap();
        assert!(list.halves.is_empty(), "{list:?}");
        tp.shutdown().await;
    });
}

/// A topic's deletion discards its pending transactions (kept in the discarded topic,
/// listed and counted): a commit arriving after it, even once a topic of the name was
/// created again, is refused (`TransactionResolved`) and never puts the old transaction's
/// message in the new topic.
#[test]
fn a_commit_after_its_topic_was_deleted_is_refused_and_its_message_kept_as_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = unsure_producer(&addr, "txd").await;
        let client = tp.producer().client().clone();
        client.create_topic("tx-gone", 2).await.unwrap();
        let sent = pending_half(&tp, "tx-gone", OutgoingMessage::new("orphan")).await;
        client.delete_topic("tx-gone").await.unwrap();
        client.create_topic("tx-gone", 2).await.unwrap();
        let commit = tp.end(
            "tx-gone",
            sent.queue_id,
            sent.transaction_id,
            TransactionOutcome::Commit,
            false,
        );
        let e = commit.await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::TransactionResolved), "{e}");
        assert!(e.to_string().contains("discarded"), "{e}");
        let list = client.list_transactions().await.unwrap();
        assert!(list.halves.is_empty(), "{list:?}");
        assert_eq!(list.discarded, 1, "{list:?}");
        let kept = &list.recently_discarded[0];
        assert_eq!(kept.transaction_id, sent.transaction_id);
        let copy = client.message_by_id(&kept.msg_id).await.unwrap().unwrap();
        assert_eq!(copy.body(), b"orphan");
        // It says where it was going, for as long as it is kept (the list is memory only).
        assert_eq!(copy.property("REAL_TOPIC"), Some("tx-gone"));
        let queue = sent.queue_id.to_string();
        assert_eq!(copy.property("REAL_QID"), Some(queue.as_str()));
        // The name, created again, holds nothing of it.
        assert!(visible(&client, "tx-gone").await.is_empty());
        tp.shutdown().await;
    });
}

/// A deletion discards every unresolved transaction of its topic, more than it writes at
/// once on each shard (256), and none of another topic.
#[test]
fn a_deletion_discards_every_unresolved_transaction_of_its_topic_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = unsure_producer(&addr, "txm").await;
        let client = tp.producer().client().clone();
        client.create_topic("tx-many", 2).await.unwrap();
        client.create_topic("tx-stays", 2).await.unwrap();
        let mut per_queue = [0u32; 2];
        for i in 0..600 {
            let sent = pending_half(&tp, "tx-many", OutgoingMessage::new(format!("m-{i}"))).await;
            per_queue[sent.queue_id as usize] += 1;
        }
        assert!(per_queue.iter().all(|&n| n > 256), "{per_queue:?}");
        let stays = pending_half(&tp, "tx-stays", OutgoingMessage::new("stays")).await;
        client.delete_topic("tx-many").await.unwrap();
        let list = client.list_transactions().await.unwrap();
        assert_eq!(list.discarded, 600);
        // Each shard lists its last 100, and the two queues are on different shards (a
        // queue's shard is the topic's hash plus its id, modulo the shards).
        assert_eq!(list.recently_discarded.len(), 200);
        assert!(list.recently_discarded.iter().all(|h| h.topic == "tx-many"));
        assert_eq!(list.halves.len(), 1, "{:?}", list.halves);
        assert_eq!(list.halves[0].topic, "tx-stays");
        let commit = tp.end(
            "tx-stays",
            stays.queue_id,
            stays.transaction_id,
            TransactionOutcome::Commit,
            false,
        );
        commit.await.unwrap();
        let seen = visible(&client, "tx-stays").await;
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["stays"]);
        assert_eq!(seen["stays"].len(), 1);
        tp.shutdown().await;
    });
}

/// Commits racing their topic's deletion: each transaction ends exactly one way, committed
/// (answered OK) or discarded (answered with an error and counted), and none is left
/// pending.
#[test]
fn commits_racing_their_topics_deletion_end_each_transaction_once() {
    const N: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = unsure_producer(&addr, "txr").await;
        let tp = Arc::new(tp);
        let client = tp.producer().client().clone();
        client.create_topic("race", 2).await.unwrap();
        let mut halves = Vec::new();
        for i in 0..N {
            let sent = pending_half(&tp, "race", OutgoingMessage::new(format!("r{i}"))).await;
            halves.push(sent);
        }
        // Eight commits in flight at a time; the one answered as the 60th starts the
        // deletion, and the rest keep going while it runs.
        let window = Arc::new(tokio::sync::Semaphore::new(8));
        let answered = Arc::new(AtomicU32::new(0));
        let mut deletion = None;
        let (deletion_tx, mut deletion_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut commits = Vec::new();
        for h in &halves {
            let permit = window.clone().acquire_owned().await.unwrap();
            let (tp, queue, id) = (tp.clone(), h.queue_id, h.transaction_id);
            let (answered, client, deletion_tx) =
                (answered.clone(), client.clone(), deletion_tx.clone());
            commits.push(tokio::spawn(async move {
                let r = tp
                    .end("race", queue, id, TransactionOutcome::Commit, false)
                    .await;
                if answered.fetch_add(1, Ordering::SeqCst) + 1 == 60 {
                    let _ =
                        deletion_tx.send(tokio::spawn(
                            async move { client.delete_topic("race").await },
                        ));
                }
                drop(permit);
                r
            }));
            if let Ok(started) = deletion_rx.try_recv() {
                deletion = Some(started);
            }
        }
        let mut committed = 0u64;
        for commit in commits {
            match commit.await.unwrap() {
                Ok(()) => committed += 1,
                Err(e) => assert!(
                    matches!(
                        e.code(),
                        Some(
                            ErrorCode::TransactionResolved
                                | ErrorCode::TopicNotFound
                                | ErrorCode::QueueNotFound
                        )
                    ),
                    "{e}"
                ),
            }
        }
        let deletion = match deletion {
            Some(d) => d,
            None => deletion_rx.recv().await.unwrap(),
        };
        deletion.await.unwrap().unwrap();
        eprintln!("{committed} of {N} committed before the deletion");
        let list = client.list_transactions().await.unwrap();
        assert!(
            list.halves.is_empty(),
            "{} left pending, the first: {:?}",
            list.halves.len(),
            list.halves.first()
        );
        assert_eq!(list.discarded, N - committed, "each transaction ended once");
        Arc::try_unwrap(tp).ok().unwrap().shutdown().await;
    });
}

#[test]
fn a_plain_send_naming_a_pending_transaction_is_not_taken_for_its_commit_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    let half = runtime().block_on(async {
        let tp = unsure_producer(&addr, "txf").await;
        let client = tp.producer().client().clone();
        client.create_topic("tf", 1).await.unwrap();
        let half = pending_half(
            &tp,
            "tf",
            OutgoingMessage::new("pending").with_property("UNIQ_KEY", "uk-1"),
        )
        .await;
        // What a commit's copy holds, sent as a plain message to the same queue: the
        // half's unique key and its transaction.
        let forged = OutgoingMessage::new("forged")
            .with_property("UNIQ_KEY", "uk-1")
            .with_property("TRAN_ID", half.transaction_id.to_string());
        tp.producer().send("tf", forged).await.unwrap();
        let list = client.list_transactions().await.unwrap();
        assert_eq!(list.halves.len(), 1, "unresolved before the kill: {list:?}");
        tp.shutdown().await;
        half
    });
    broker.kill();
    broker.restart();
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = unsure_producer(&addr, "txf").await;
        let client = tp.producer().client().clone();
        let list = client.list_transactions().await.unwrap();
        assert_eq!(list.halves.len(), 1, "still unresolved: {list:?}");
        assert_eq!(list.halves[0].transaction_id, half.transaction_id);
        let commit = tp.end(
            "tf",
            half.queue_id,
            half.transaction_id,
            TransactionOutcome::Commit,
            false,
        );
        commit.await.unwrap();
        let seen = visible(&client, "tf").await;
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["forged", "pending"]);
        assert_eq!(seen["pending"].len(), 1);
        tp.shutdown().await;
    });
}

/// A commit whose op record a crash lost (the log cut right after the commit's copy) is
/// found at the next start by its key and taken as done: not pending, stored once. Also
/// when the start cannot write the op record (a free-space floor above the disk's size
/// refuses every append): the broker starts, and the transaction is taken as done.
#[test]
fn a_commit_whose_op_record_was_lost_is_found_again_at_start() {
    for refused in [false, true] {
        commit_without_op_record_at_start(refused);
    }
}

fn commit_without_op_record_at_start(op_record_refused: bool) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = BrokerProcess::start(&data, 1, &[]);
    let addr = broker.addr_string();
    let copy_at = runtime().block_on(async {
        let tp = unsure_producer(&addr, "txo").await;
        let client = tp.producer().client().clone();
        client.create_topic("to", 1).await.unwrap();
        let r = tp
            .send_in_transaction("to", OutgoingMessage::new("c0"), |_| {
                TransactionOutcome::Commit
            })
            .await
            .unwrap();
        assert!(r.end_error.is_none(), "{:?}", r.end_error);
        let seen = visible(&client, "to").await;
        tp.shutdown().await;
        // Written by the broker from the half: flagged, naming where the half is.
        let copy = seen["c0"][0].view();
        assert_eq!(
            copy.sys_flag(),
            ringmq::protocol::record::SYS_FLAG_TRANSACTION_COMMIT
        );
        assert_eq!(copy.transaction_offset(), r.send.physical_offset);
        copy.physical_offset()
    });
    broker.kill();
    // The op record follows the commit's copy in the log: cut the segment at the copy's end.
    let log = data.join("shard-0").join("commitlog");
    let mut segments: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(&log)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let base = path.file_name()?.to_str()?.parse().ok()?;
            Some((base, path))
        })
        .collect();
    segments.sort();
    let (base, segment) = segments
        .into_iter()
        .rev()
        .find(|(base, _)| *base <= copy_at)
        .unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = (copy_at - base) as usize;
    let copy_len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let op = RecordView::parse(&bytes[at + copy_len..]).unwrap();
    assert_eq!(
        op.topic(),
        "%SYS_TXN_OP%",
        "the op record follows the commit"
    );
    // As a torn write leaves it: zeros from the op record on.
    bytes[at + copy_len..].fill(0);
    std::fs::write(&segment, &bytes).unwrap();
    if op_record_refused {
        broker = BrokerProcess::start(&data, 1, &["--disk-free-min-mb", "1000000000"]);
    } else {
        broker.restart();
    }
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = unsure_producer(&addr, "txo").await;
        let client = tp.producer().client().clone();
        let list = client.list_transactions().await.unwrap();
        assert!(
            list.halves.is_empty(),
            "taken as committed (op record refused: {op_record_refused}): {list:?}"
        );
        let seen = visible(&client, "to").await;
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["c0"]);
        assert_eq!(seen["c0"].len(), 1);
        tp.shutdown().await;
    });
}

#[test]
fn a_killed_broker_loses_no_commit_shows_no_rollback_and_checks_unresolved_ones_again() {
    const N: u32 = 600;
    // The rule every producer (and checker) of this test follows.
    let decide = |i: u32| match i % 3 {
        0 | 1 => TransactionOutcome::Commit,
        _ => TransactionOutcome::Rollback,
    };
    let checker = move |m: &Message| {
        let i: u32 = String::from_utf8_lossy(m.body())
            .trim_start_matches('m')
            .parse()
            .unwrap();
        decide(i)
    };
    for round in 0..2u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut broker = BrokerProcess::start(&dir.path().join("data"), 2, FAST_CHECKS);
        let addr = broker.addr_string();
        let acked_commits = runtime().block_on(async {
            let tp = Arc::new(
                TransactionProducer::start(ClientConfig::new(&addr), "txs", checker)
                    .await
                    .unwrap(),
            );
            tp.producer().client().create_topic("ts", 4).await.unwrap();
            // The kill lands while transactions are being sent and ended: the one that
            // makes the count of ended transactions reach a tenth (a quarter in round 1)
            // kills the broker, with the rest in flight.
            let pid = broker.pid().unwrap() as i32;
            let kill_at = if round == 0 { N / 10 } else { N / 4 } as usize;
            let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for i in 0..N {
                let (tp, ended) = (tp.clone(), ended.clone());
                tasks.push(tokio::spawn(async move {
                    // A third of the local transactions do not know yet: checked later.
                    let local = if i % 3 == 1 {
                        TransactionOutcome::Unknown
                    } else {
                        decide(i)
                    };
                    let r = tp
                        .send_in_transaction("ts", OutgoingMessage::new(format!("m{i}")), |_| local)
                        .await;
                    if ended.fetch_add(1, Ordering::SeqCst) + 1 == kill_at {
                        // SAFETY: kill(2) with the pid of a child process this test started.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                    match r {
                        Ok(r)
                            if r.end_error.is_none() && r.outcome == TransactionOutcome::Commit =>
                        {
                            Some(i)
                        }
                        _ => None,
                    }
                }));
            }
            let mut acked = Vec::new();
            for t in tasks {
                if let Some(i) = t.await.unwrap() {
                    acked.push(i);
                }
            }
            acked
        });
        broker.kill();
        broker.restart();
        let addr = broker.addr_string();
        runtime().block_on(async {
            let tp = TransactionProducer::start(ClientConfig::new(&addr), "txs", checker)
                .await
                .unwrap();
            let client = tp.producer().client().clone();
            eventually("every unresolved transaction checked", Duration::from_secs(30), async || {
                client.list_transactions().await.unwrap().halves.is_empty()
            })
            .await;
            let seen = visible(&client, "ts").await;
            eprintln!(
                "round {round}: {} commits acknowledged before the kill, {} visible after the restart",
                acked_commits.len(),
                seen.len()
            );
            for (body, copies) in &seen {
                assert_eq!(copies.len(), 1, "round {round}: {body} committed once: {:?}", copies.iter().map(|m| (m.queue_id(), m.queue_offset(), m.physical_offset(), m.store_timestamp_ms(), m.property("TRAN_ID").map(str::to_owned), m.property("UNIQ_KEY").map(str::to_owned))).collect::<Vec<_>>());
                let i: u32 = body.trim_start_matches('m').parse().unwrap();
                assert_eq!(decide(i), TransactionOutcome::Commit, "round {round}: {body} was rolled back");
            }
            for i in &acked_commits {
                assert!(seen.contains_key(&format!("m{i}")), "round {round}: acknowledged commit m{i} lost");
            }
            assert_eq!(client.list_transactions().await.unwrap().discarded, 0);
            tp.shutdown().await;
        });
    }
}

/// A half message no producer resolves (its check says "unknown" every time) does not go
/// with its segment when retention deletes it, nor keep the log from shrinking: retention
/// moves it to the discarded topic (listed, its copy readable by id, never pending
/// again, after a restart too) and then deletes the segment it was stored in, once the
/// half is older than the transaction timeout and a check interval (1.3 s here; its 15
/// checks would take 15 s).
#[test]
fn a_half_message_past_retention_is_discarded_not_lost_and_retention_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let checks = ["--transaction-timeout-ms", "300"];
    let checks = [&checks[..], &["--transaction-check-interval-ms", "1000"]].concat();
    let flags = [common::SMALL_RETENTION, &checks].concat();
    let mut broker = BrokerProcess::start(&data, 1, &flags);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = unsure_producer(&addr, "txr").await;
        let client = tp.producer().client().clone();
        client.create_topic("tr", 1).await.unwrap();
        client.create_topic("filler", 1).await.unwrap();
        let sent = tp
            .send_in_transaction("tr", OutgoingMessage::new("unresolved"), |_| {
                TransactionOutcome::Unknown
            })
            .await
            .unwrap();
        common::send_8_mib(tp.producer(), "filler").await;
        eventually(
            "the half message discarded",
            Duration::from_secs(20),
            async || {
                let list = client.list_transactions().await.unwrap();
                list.halves.is_empty() && list.discarded == 1
            },
        )
        .await;
        let list = client.list_transactions().await.unwrap();
        let kept = &list.recently_discarded[0];
        assert_eq!(kept.transaction_id, sent.send.transaction_id);
        let copy = client.message_by_id(&kept.msg_id).await.unwrap().unwrap();
        assert_eq!(copy.body(), b"unresolved");
        // Retention then deletes the segment the half message was stored in.
        let first = data.join("shard-0/commitlog/00000000000000000000");
        eventually(
            "the first segment deleted",
            Duration::from_secs(10),
            async || !first.exists(),
        )
        .await;
        // Its outcome is known: a commit now is refused, nothing is committed.
        let end = tp
            .end(
                "tr",
                sent.send.queue_id,
                sent.send.transaction_id,
                TransactionOutcome::Commit,
                false,
            )
            .await;
        assert_eq!(code(end), ErrorCode::TransactionResolved);
        assert!(visible(&client, "tr").await.is_empty());
        tp.shutdown().await;
    });
    assert!(broker.stop());
    broker.restart();
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        let list = client.list_transactions().await.unwrap();
        assert!(list.halves.is_empty(), "{list:?}");
    });
}

/// The log's size limit does not discard a half message younger than the transaction
/// timeout and a check interval (36 s by default): its producer's commit a moment later is
/// taken and delivered. Before, the next retention pass (300 ms here) discarded it, and the
/// commit was refused `TransactionResolved`.
#[test]
fn a_young_half_message_is_not_discarded_for_the_logs_size() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, common::SMALL_RETENTION);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = unsure_producer(&addr, "txy").await;
        let client = tp.producer().client().clone();
        client.create_topic("ty", 1).await.unwrap();
        client.create_topic("filler", 1).await.unwrap();
        let sent = tp
            .send_in_transaction("ty", OutgoingMessage::new("young"), |_| {
                TransactionOutcome::Unknown
            })
            .await
            .unwrap();
        common::send_8_mib(tp.producer(), "filler").await;
        // Ten retention passes: the half stays pending.
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < until {
            let list = client.list_transactions().await.unwrap();
            assert_eq!((list.halves.len(), list.discarded), (1, 0), "{list:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (queue_id, id) = (sent.send.queue_id, sent.send.transaction_id);
        tp.end("ty", queue_id, id, TransactionOutcome::Commit, false)
            .await
            .unwrap();
        let seen = visible(&client, "ty").await;
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["young"]);
        assert_eq!(seen["young"].len(), 1);
        tp.shutdown().await;
    });
}
