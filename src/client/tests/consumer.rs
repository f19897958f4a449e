//! Push consumer tests against the fake broker (see the parent module) that need a broker
//! to misbehave on cue.

use super::*;
use std::time::Instant;

/// An orderly member of group `g` on topic `t`, every call a success, started.
async fn started_orderly(config: ClientConfig, options: PushConsumerOptions) -> PushConsumer {
    let consumer = PushConsumer::new(config, "g", options).unwrap();
    consumer.subscribe("t", "*").unwrap();
    consumer
        .register_orderly(|_| OrderlyStatus::Success)
        .unwrap();
    consumer.start().await.unwrap();
    consumer
}

/// What the fake saw on which connection, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    HeartbeatRefused,
    HeartbeatAnswered,
    Lock,
}

/// An orderly member whose bootstrap connection drops asks for no lock on the new one
/// before a heartbeat on it is acknowledged. Until the broker has handled the old
/// connection's close it refuses the member's heartbeats there (`ClientIdInUse`), and its
/// release of the old member's locks, decided then, could take away a lock granted in the
/// meantime while the member went on consuming under it.
#[tokio::test]
async fn an_orderly_member_locks_on_a_new_connection_only_once_its_heartbeat_is_taken() {
    let seen: Arc<Mutex<Vec<(usize, Seen)>>> = Arc::default();
    let first_conn: Arc<Mutex<Option<usize>>> = Arc::default();
    let refused = Arc::new(AtomicUsize::new(0));
    let (log, first, refusals) = (seen.clone(), first_conn.clone(), refused.clone());
    let handler: Handler = Arc::new(move |ctx, id, request| {
        let conn = ctx.conn_no;
        let note = |what| log.lock().unwrap().push((conn, what));
        let on_first = *first.lock().unwrap().get_or_insert(conn) == conn;
        match request {
            Request::GroupHeartbeat(_)
                if !on_first && refusals.fetch_add(1, Ordering::SeqCst) < 2 =>
            {
                note(Seen::HeartbeatRefused);
                vec![Out::Frame(error(
                    id,
                    ErrorCode::ClientIdInUse,
                    "still on the old connection",
                ))]
            }
            Request::GroupHeartbeat(_) | Request::QueryAssignment(_) => {
                note(Seen::HeartbeatAnswered);
                vec![Out::Frame(answer(id, &assignment(1, "t", &[0])))]
            }
            Request::LockBatch(l) => {
                let renewals = log
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(c, s)| *c == conn && *s == Seen::Lock)
                    .count();
                note(Seen::Lock);
                if on_first && renewals >= 1 {
                    // The bootstrap connection drops at the first renewal.
                    return vec![Out::Close];
                }
                vec![Out::Frame(answer(
                    id,
                    &Response::Locked(crate::protocol::Locked { queues: l.queues }),
                ))]
            }
            other => idle_topic(id, other, "t", 1),
        }
    });
    let fake = Fake::start(1, handler).await;
    let options = PushConsumerOptions {
        heartbeat_interval_ms: 100,
        lock_renew_ms: 200,
        lock_retry_ms: 50,
        ..PushConsumerOptions::default()
    };
    let consumer = started_orderly(fake.config(), options).await;

    // Wait for a lock granted on a connection after the first, and the queue consumed
    // again under it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let first = loop {
        let first = *first_conn.lock().unwrap();
        let relocked = seen
            .lock()
            .unwrap()
            .iter()
            .any(|&(c, s)| s == Seen::Lock && Some(c) != first);
        if relocked && consumer.consuming_queues() == [MessageQueue::new("t", 0)] {
            break first;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    consumer.shutdown().await.unwrap();

    let seen = seen.lock().unwrap().clone();
    for conn in seen.iter().map(|&(c, _)| c).filter(|&c| Some(c) != first) {
        let on_it: Vec<Seen> = seen
            .iter()
            .filter(|&&(c, _)| c == conn)
            .map(|&(_, s)| s)
            .collect();
        let first_lock = on_it.iter().position(|&s| s == Seen::Lock);
        let first_answer = on_it.iter().position(|&s| s == Seen::HeartbeatAnswered);
        if let Some(lock) = first_lock {
            assert!(
                first_answer.is_some_and(|answered| answered < lock),
                "connection {conn}: a lock asked for before a heartbeat was answered: {on_it:?} (all: {seen:?})"
            );
        }
    }
    assert!(refused.load(Ordering::SeqCst) >= 2, "{seen:?}");
}

/// A pull answered with records of another queue, below the pull's offset or out of order
/// fails (`DamagedRecord`, naming what came) instead of moving the queue's position to
/// their offsets.
#[tokio::test]
async fn a_pull_answered_with_another_queues_or_unordered_records_fails() {
    // (topic, queue, offsets) answered to any pull at 10 of t[5].
    let cases: [(&str, u32, &[u64]); 4] = [
        ("other", 5, &[10]),
        ("t", 4, &[10]),
        ("t", 5, &[9]),
        ("t", 5, &[11, 10]),
    ];
    for (topic, queue_id, offsets) in cases {
        let handler: Handler = Arc::new(move |_ctx, id, request| match request {
            Request::Pull(_) => {
                let mut raw = Vec::new();
                for &offset in offsets {
                    raw.extend(record(topic, queue_id, offset, "A", b"m"));
                }
                let meta = crate::protocol::PullResult {
                    status: PullStatus::Found,
                    next_offset: 12,
                    min_offset: 0,
                    max_offset: 100,
                    count: offsets.len() as u32,
                    incarnation: 7,
                };
                let raw = PullResponse::new(meta, &raw);
                vec![Out::Frame(answer(id, &Response::Pull(raw)))]
            }
            _ => Vec::new(),
        });
        let fake = Fake::start(1, handler).await;
        let client = Client::connect(fake.config()).await.unwrap();
        let wait = Duration::from_millis(10);
        let e = client.pull("t", 5, 10, 32, wait, &[]).await.unwrap_err();
        assert!(
            matches!(e, ClientError::DamagedRecord { .. }),
            "{topic}[{queue_id}] {offsets:?}: {e}"
        );
        assert!(
            e.to_string().contains("a pull at 10 was answered with"),
            "{e}"
        );
    }
    // (In order, of the queue, from the pull's offset, they are taken:
    // `pull_answers_are_read_in_place_and_tags_rechecked`.)
}

/// A pull of t[0] at `offset` answered with `count` records from there (the queue's end).
fn t0_records(id: u64, offset: u64, count: u32) -> Vec<Out> {
    let mut raw = Vec::new();
    for offset in offset..offset + u64::from(count) {
        raw.extend(record("t", 0, offset, "A", b"m"));
    }
    let meta = crate::protocol::PullResult {
        status: PullStatus::Found,
        next_offset: offset + u64::from(count),
        min_offset: 0,
        max_offset: offset + u64::from(count),
        count,
        incarnation: 7,
    };
    let raw = PullResponse::new(meta, &raw);
    vec![Out::Frame(answer(id, &Response::Pull(raw)))]
}

/// The member's assignment: t[0], until `gone` (then nothing).
fn t0_until(gone: &std::sync::atomic::AtomicBool, id: u64) -> Vec<Out> {
    let queues: &[u32] = if gone.load(Ordering::SeqCst) {
        &[]
    } else {
        &[0]
    };
    vec![Out::Frame(answer(id, &assignment(1, "t", queues)))]
}

/// A start taken from `consume_from` is committed only if the group has no offset of the
/// queue, and so is every commit of the queue until the stored offset was read back: the
/// committer's, and the one after the queue is taken away meanwhile. A plain commit of
/// this member's end, sent while its start commit waited, moved the group's offset past
/// another member's start, and what came between was consumed by neither.
#[tokio::test]
async fn commits_before_a_start_is_known_the_groups_are_stored_only_if_absent() {
    // (offset, if_absent) of each commit, in order.
    let commits: Arc<Mutex<Vec<(u64, bool)>>> = Arc::default();
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (log, gone) = (commits.clone(), dropped.clone());
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::GroupHeartbeat(_) | Request::QueryAssignment(_) => t0_until(&gone, id),
        Request::CommitOffset(c) => {
            log.lock().unwrap().push((c.offset, c.if_absent));
            // The start commit waits for a first offset's sync (a slow disk).
            let pause = Duration::from_millis(if c.if_absent { 600 } else { 0 });
            let empty = answer(id, &Response::Empty(crate::protocol::Empty {}));
            vec![Out::Later(pause, empty)]
        }
        other => idle_topic(id, other, "t", 1),
    });
    let fake = Fake::start(1, handler).await;
    let options = PushConsumerOptions {
        heartbeat_interval_ms: 50,
        commit_interval_ms: 20,
        ..PushConsumerOptions::default()
    };
    let consumer = PushConsumer::new(fake.config(), "g", options).unwrap();
    consumer.subscribe("t", "*").unwrap();
    consumer
        .register_concurrent(|_| ConsumeStatus::Success)
        .unwrap();
    consumer.start().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    // The committer's periods pass while the start commit waits (it commits too); then
    // the queue is taken away.
    while commits.lock().unwrap().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no commits");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    dropped.store(true, Ordering::SeqCst);
    while !consumer.consuming_queues().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queue was not taken away"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    consumer.shutdown().await.unwrap();
    let commits = commits.lock().unwrap().clone();
    assert!(
        commits
            .iter()
            .all(|&(offset, if_absent)| offset == 5 && if_absent),
        "{commits:?}"
    );
}

/// A pending queue whose lock request timed out (the broker may have granted it after the
/// client stopped waiting), or was answered without it (the broker answers what the shards
/// that answered in time hold; a late one may grant it after), is unlocked when the
/// assignment takes it away: else its next owner waited for the lock to expire (a minute
/// by default) before consuming it. The second case was not unlocked.
#[tokio::test]
async fn a_pending_queue_whose_lock_answer_was_lost_is_unlocked_when_taken_away() {
    for answered_without_it in [false, true] {
        pending_queue_taken_away(answered_without_it).await;
    }
}

async fn pending_queue_taken_away(answered_without_it: bool) {
    // (topic, queues) of each unlock.
    type Unlocks = Vec<(String, Vec<u32>)>;
    let unlocked: Arc<Mutex<Unlocks>> = Arc::default();
    let taken_away = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (log, gone) = (unlocked.clone(), taken_away.clone());
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::GroupHeartbeat(_) | Request::QueryAssignment(_) => t0_until(&gone, id),
        Request::LockBatch(_) if answered_without_it => {
            gone.store(true, Ordering::SeqCst);
            let locked = Response::Locked(crate::protocol::Locked { queues: Vec::new() });
            vec![Out::Frame(answer(id, &locked))]
        }
        Request::LockBatch(l) => {
            // Granted, but answered after the client's timeout; then the queue moves.
            gone.store(true, Ordering::SeqCst);
            let locked = Response::Locked(crate::protocol::Locked { queues: l.queues });
            vec![Out::Later(Duration::from_millis(600), answer(id, &locked))]
        }
        Request::UnlockBatch(u) => {
            log.lock()
                .unwrap()
                .push((u.topic.clone(), u.queues.clone()));
            vec![empty_answer(id)]
        }
        other => idle_topic(id, other, "t", 1),
    });
    let fake = Fake::start(1, handler).await;
    let mut config = fake.config();
    config.request_timeout_ms = 200;
    let options = PushConsumerOptions {
        heartbeat_interval_ms: 50,
        lock_retry_ms: 50,
        ..PushConsumerOptions::default()
    };
    let consumer = started_orderly(config, options).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while unlocked.lock().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queue was never unlocked (answered without it: {answered_without_it})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(unlocked.lock().unwrap()[0], ("t".to_owned(), vec![0]));
    assert!(consumer.consuming_queues().is_empty());
    consumer.shutdown().await.unwrap();
}

/// A member reconnected to a broker that keeps sessions and locks for less time (restarted
/// with shorter `--session-timeout-ms` and `--lock-expiry-ms`) follows its timings:
/// heartbeats come at least three times per session and locks are renewed well within
/// their expiry. With the timings fitted at its start only, it counted itself a member,
/// and its locks as held, after the broker had dropped them, and consumed an ordered queue
/// beside its next owner.
#[tokio::test]
async fn timings_follow_the_broker_after_a_reconnect() {
    // (connection, request kind, when) of heartbeats and lock requests.
    type Seen = Vec<(usize, &'static str, tokio::time::Instant)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (log, cutting) = (seen.clone(), cut.clone());
    let handler: Handler = Arc::new(move |ctx, id, request| {
        let note = |what| {
            let at = tokio::time::Instant::now();
            log.lock().unwrap().push((ctx.conn_no, what, at));
        };
        match request {
            Request::GroupHeartbeat(_) if cutting.swap(false, Ordering::SeqCst) => {
                vec![Out::Close]
            }
            Request::GroupHeartbeat(_) | Request::QueryAssignment(_) => {
                note("heartbeat");
                vec![Out::Frame(answer(id, &assignment(1, "t", &[0])))]
            }
            Request::LockBatch(l) => {
                note("lock");
                let locked = Response::Locked(crate::protocol::Locked { queues: l.queues });
                vec![Out::Frame(answer(id, &locked))]
            }
            other => idle_topic(id, other, "t", 1),
        }
    });
    let fake = Fake::start(1, handler).await;
    let consumer = PushConsumer::new(fake.config(), "g", PushConsumerOptions::default());
    let consumer = consumer.unwrap();
    consumer.subscribe("t", "*").unwrap();
    consumer
        .register_orderly(|_| OrderlyStatus::Success)
        .unwrap();
    consumer.start().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while consumer.consuming_queues().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "never consumed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The broker restarts with a 3 s session and 8 s locks: the next heartbeat finds the
    // connection closed, and the new one's handshake tells the new timings.
    *fake.limits.lock().unwrap() = (3_000, 8_000);
    cut.store(true, Ordering::SeqCst);
    let on_new = |what: &str| -> Vec<tokio::time::Instant> {
        let seen = seen.lock().unwrap();
        (seen.iter())
            .filter(|&&(conn, kind, _)| conn > 0 && kind == what)
            .map(|&(_, _, at)| at)
            .collect()
    };
    // Heartbeats at most a third of the session apart, and a lock renewed (asked for
    // again) within two thirds of half the expiry.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while on_new("heartbeat").len() < 4 || on_new("lock").len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    consumer.shutdown().await.unwrap();
    let slack = Duration::from_millis(300);
    let gaps = |at: &[tokio::time::Instant]| -> Vec<Duration> {
        at.windows(2).map(|w| w[1] - w[0]).collect()
    };
    let heartbeats = gaps(&on_new("heartbeat"));
    // (The first gap may hold the rejoin heartbeat sent at once after the reconnect.)
    assert!(
        heartbeats
            .iter()
            .skip(1)
            .all(|&g| g <= Duration::from_millis(1_000) + slack),
        "{heartbeats:?}"
    );
    let locks = gaps(&on_new("lock"));
    assert!(
        locks
            .iter()
            .all(|&g| g <= Duration::from_millis(2_666) + slack),
        "{locks:?}"
    );
}

/// An orderly member dead-lettering a batch (each message retried enough) whose lock lapses
/// while one of them is being sent back sends no more of them: the next owner consumes them
/// from the committed offset, and they would be both dead-lettered and consumed. The lease
/// was looked at once before the batch.
#[tokio::test]
async fn an_orderly_member_whose_lock_lapses_while_it_dead_letters_a_batch_sends_no_more() {
    let sent_back = Arc::new(AtomicUsize::new(0));
    let pulled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // When the first send-back came, and the lock requests since (none answered).
    let first_back: Arc<Mutex<Option<Instant>>> = Arc::default();
    let unanswered: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (sends, once) = (sent_back.clone(), pulled.clone());
    let (first, locks) = (first_back.clone(), unanswered.clone());
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::GroupHeartbeat(_) | Request::QueryAssignment(_) => {
            vec![Out::Frame(answer(id, &assignment(1, "t", &[0])))]
        }
        // The lock lapses: its renewals get no answer (a refusal would drop the queue).
        Request::LockBatch(_) if first.lock().unwrap().is_some() => {
            locks.lock().unwrap().push(Instant::now());
            Vec::new()
        }
        Request::LockBatch(l) => {
            let locked = crate::protocol::Locked { queues: l.queues };
            vec![Out::Frame(answer(id, &Response::Locked(locked)))]
        }
        Request::Pull(p) if !once.swap(true, Ordering::SeqCst) => t0_records(id, p.offset, 4),
        Request::ConsumerSendBack(b) => {
            // The first is answered after the lock's validity has passed.
            let pause = match sends.fetch_add(1, Ordering::SeqCst) {
                0 => {
                    *first.lock().unwrap() = Some(Instant::now());
                    Duration::from_millis(1_000)
                }
                _ => Duration::ZERO,
            };
            let result = crate::protocol::SendBackResult {
                dead_lettered: true,
                msg_id: b.msg_id,
                reconsume_times: 1,
            };
            vec![Out::Later(
                pause,
                answer(id, &Response::SendBackResult(result)),
            )]
        }
        other => idle_topic(id, other, "t", 1),
    });
    let fake = Fake::start(1, handler).await;
    let options = PushConsumerOptions {
        heartbeat_interval_ms: 100,
        lock_renew_ms: 100,
        lock_valid_ms: 500,
        lock_retry_ms: 50,
        max_reconsume_times: 0,
        consume_batch_max: 4,
        suspend_ms: 10,
        ..PushConsumerOptions::default()
    };
    let consumer = PushConsumer::new(fake.config(), "g", options).unwrap();
    consumer.subscribe("t", "*").unwrap();
    consumer
        .register_orderly(|_| OrderlyStatus::SuspendCurrentQueueAMoment)
        .unwrap();
    consumer.start().await.unwrap();
    // Until a lock request comes 300 ms after the first send-back was answered: the rest
    // of the batch, sent back without a look at the lease, went at once after its answer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answered = first_back
            .lock()
            .unwrap()
            .map(|at| at + Duration::from_millis(1_300));
        let last_lock = unanswered.lock().unwrap().last().copied();
        if answered.is_some_and(|a| last_lock.is_some_and(|l| l >= a)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    consumer.shutdown().await.unwrap();
    assert_eq!(
        sent_back.load(Ordering::SeqCst),
        1,
        "messages dead-lettered"
    );
}

/// A subscription or listener set while a start is under way (it copied them, and waits
/// for the broker) is refused, as after the start: it was answered `Ok` and never used. A
/// start given up (its future dropped) gives the setup back.
#[tokio::test]
async fn a_subscription_made_while_a_start_is_under_way_is_refused() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::DescribeTopic(_) => vec![Out::Later(
            Duration::from_millis(300),
            answer(id, &Response::TopicInfo(topic_info("t", 1))),
        )],
        Request::GroupHeartbeat(_) | Request::QueryAssignment(_) => {
            vec![Out::Frame(answer(id, &assignment(1, "t", &[0])))]
        }
        other => idle_topic(id, other, "t", 1),
    });
    let fake = Fake::start(1, handler).await;
    let options = PushConsumerOptions::default();
    let consumer = Arc::new(PushConsumer::new(fake.config(), "g", options).unwrap());
    consumer.subscribe("t", "*").unwrap();
    consumer
        .register_concurrent(|_| ConsumeStatus::Success)
        .unwrap();
    let start = || {
        let consumer = consumer.clone();
        tokio::spawn(async move { consumer.start().await })
    };
    // Under way once it has asked for the topic (the `n`th time).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let requests = &fake.log;
    let described = |n: usize| async move {
        loop {
            let asked = (requests.lock().unwrap().iter())
                .filter(|(_, r)| matches!(r, Request::DescribeTopic(_)))
                .count();
            if asked >= n {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    // Given up while it waits for the topic: the setup is the caller's again.
    let given_up = start();
    described(1).await;
    given_up.abort();
    assert!(given_up.await.unwrap_err().is_cancelled());
    consumer
        .register_concurrent(|_| ConsumeStatus::Success)
        .unwrap();
    let starting = start();
    described(2).await;
    let e = consumer.subscribe("other", "*").unwrap_err();
    assert!(e.to_string().contains("this consumer has started"), "{e}");
    let e = consumer
        .register_orderly(|_| OrderlyStatus::Success)
        .unwrap_err();
    assert!(e.to_string().contains("this consumer has started"), "{e}");
    starting.await.unwrap().unwrap();
    assert!(consumer.subscribe("other", "*").is_err());
    consumer.shutdown().await.unwrap();
}

/// A consumer dropped without `shutdown` while a listener call runs shuts down in a task of
/// its own: heartbeats go on until the call ends, then the member unregisters. Before,
/// heartbeats stopped at once while the connection stayed open, and the member stayed
/// assigned its queues (an orderly one: locked) until its session ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_dropped_during_a_call_shuts_down_cleanly() {
    let pulled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = pulled.clone();
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::GroupHeartbeat(_) | Request::QueryAssignment(_) => {
            vec![Out::Frame(answer(id, &assignment(1, "t", &[0])))]
        }
        Request::LockBatch(l) => {
            let locked = crate::protocol::Locked { queues: l.queues };
            vec![Out::Frame(answer(id, &Response::Locked(locked)))]
        }
        Request::Pull(p) if !once.swap(true, Ordering::SeqCst) => t0_records(id, p.offset, 1),
        other => idle_topic(id, other, "t", 1),
    });
    let fake = Fake::start(1, handler).await;
    let options = PushConsumerOptions {
        heartbeat_interval_ms: 100,
        ..PushConsumerOptions::default()
    };
    let consumer = PushConsumer::new(fake.config(), "g", options).unwrap();
    consumer.subscribe("t", "*").unwrap();
    let (called, in_call) = std::sync::mpsc::channel();
    let (gate, wait) = std::sync::mpsc::channel::<()>();
    let (called, wait) = (Mutex::new(called), Mutex::new(wait));
    consumer
        .register_orderly(move |_| {
            let _ = called.lock().unwrap().send(());
            let _ = wait.lock().unwrap().recv();
            OrderlyStatus::Success
        })
        .unwrap();
    consumer.start().await.unwrap();
    tokio::task::spawn_blocking(move || in_call.recv().unwrap())
        .await
        .unwrap();
    drop(consumer);
    let count = |what: fn(&Request) -> bool| {
        let log = fake.log.lock().unwrap();
        log.iter().filter(|(_, r)| what(r)).count()
    };
    let heartbeats = || count(|r| matches!(r, Request::GroupHeartbeat(_)));
    // Heartbeats go on while the call runs (three more).
    let dropped_at = heartbeats();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while heartbeats() < dropped_at + 3 {
        assert!(tokio::time::Instant::now() < deadline, "heartbeats stopped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(count(|r| matches!(r, Request::Unregister(_))), 0);
    gate.send(()).unwrap();
    // Then the member leaves.
    while count(|r| matches!(r, Request::Unregister(_))) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no unregister");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An orderly member whose heartbeats are refused (its rejoin after an expiry refused, say)
/// stops asking for its locks once it is no longer surely a member: the broker may have
/// given its queues to others, and each renewal took back any not yet locked again, for a
/// member whose leases were void (it consumed nothing), the new owner waiting meanwhile.
#[tokio::test]
async fn an_orderly_member_whose_heartbeats_are_refused_stops_renewing_its_locks() {
    // When heartbeats began to be refused, and when each lock request came.
    let refusing: Arc<Mutex<Option<Instant>>> = Arc::default();
    let locks: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (refuse, lock_times) = (refusing.clone(), locks.clone());
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::GroupHeartbeat(_) | Request::QueryAssignment(_)
            if refuse.lock().unwrap().is_some() =>
        {
            vec![Out::Frame(error(id, ErrorCode::LimitReached, "group full"))]
        }
        Request::GroupHeartbeat(_) | Request::QueryAssignment(_) => {
            vec![Out::Frame(answer(id, &assignment(1, "t", &[0])))]
        }
        Request::LockBatch(l) => {
            let mut times = lock_times.lock().unwrap();
            times.push(Instant::now());
            // Heartbeats are refused from the second (the first renewal) on.
            if times.len() == 2 {
                refuse.lock().unwrap().get_or_insert_with(Instant::now);
            }
            let locked = crate::protocol::Locked { queues: l.queues };
            vec![Out::Frame(answer(id, &Response::Locked(locked)))]
        }
        other => idle_topic(id, other, "t", 1),
    });
    let fake = Fake::start(1, handler).await;
    // The broker's session: 1 s (its shortest).
    *fake.limits.lock().unwrap() = (1_000, 60_000);
    let options = PushConsumerOptions {
        heartbeat_interval_ms: 100,
        lock_renew_ms: 100,
        lock_valid_ms: 500,
        lock_retry_ms: 50,
        suspend_ms: 10,
        ..PushConsumerOptions::default()
    };
    let consumer = started_orderly(fake.config(), options).await;
    // The last heartbeat answered came before the refusals began: 900 ms after it (the
    // session less a heartbeat interval) the member is no longer surely one. Lock
    // requests are watched for 1.7 s past that (the first 900 ms of it are slack).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let since = loop {
        if let Some(at) = *refusing.lock().unwrap() {
            break at;
        }
        assert!(tokio::time::Instant::now() < deadline, "never locked twice");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    while since.elapsed() < Duration::from_millis(2_600) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late: Vec<Duration> = (locks.lock().unwrap().iter())
        .filter_map(|&at| at.checked_duration_since(since))
        .filter(|&after| after > Duration::from_millis(1_800))
        .collect();
    assert!(
        late.is_empty(),
        "lock requests after the membership lapsed: {late:?}"
    );
    let _ = consumer.shutdown().await;
}
