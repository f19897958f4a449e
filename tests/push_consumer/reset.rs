//! Resets of a group's offsets while its members commit: a position read before the reset
//! is refused by the queue's shard (it would undo the reset, offsets only going forward),
//! and members re-read the reset offsets. Helpers are the parent module's.

use ringmq::client::MemberSpec;
use ringmq::protocol::ErrorCode;

use super::*;

/// Each queue's committed offset.
async fn committed(client: &Client, group: &str, topic: &str) -> Vec<Option<u64>> {
    let progress = client.consumer_progress(group, topic).await.unwrap();
    progress.iter().map(|q| q.committed_offset).collect()
}

#[test]
fn a_position_read_before_a_reset_is_refused_and_cannot_undo_it() {
    with_broker(|addr| async move {
        let (topic, group) = ("fenced", "g-fenced");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        // Two queues, one on each shard: the reset's fence goes up on both.
        client.create_topic(topic, 2).await.unwrap();
        send_all(&producer, topic, bodies("m", 20)).await;
        let log: Log = Arc::default();
        let first = PushConsumerOptions {
            consume_from: ConsumeFrom::FirstOffset,
            ..options()
        };
        let consumer = concurrent(&addr, group, topic, "*", first.clone(), &log, 0).await;
        caught_up(&client, group, topic).await;
        let member = consumer.client().unwrap();
        let before = member.query_assignment(group).await.unwrap().offsets_epoch;
        assert_eq!(before, 0, "no reset yet");
        consumer.shutdown().await.unwrap();
        let ends: Vec<u64> = client
            .consumer_progress(group, topic)
            .await
            .unwrap()
            .iter()
            .map(|q| q.max_offset)
            .collect();
        assert_eq!(ends.iter().sum::<u64>(), 20);

        let reset_at = now_ms() as u64;
        client.reset_offset_by_time(group, topic, 0).await.unwrap();
        // What a member's commit on its way when the reset came looks like: its position,
        // read under the epoch before. Refused, typed, and the reset offsets stay.
        for (q, end) in ends.iter().enumerate() {
            let stale = client
                .commit_offset_from(group, topic, q as u32, *end, 0, Some(before))
                .await
                .unwrap_err();
            assert_eq!(stale.code(), Some(ErrorCode::OffsetsReset), "{stale}");
            assert!(stale.to_string().contains("were reset"), "{stale}");
        }
        assert_eq!(committed(&client, group, topic).await, [Some(0), Some(0)]);
        // An admin's commit (no epoch) is not checked: it moves forward as ever.
        client.commit_offset(group, topic, 0, 1).await.unwrap();
        assert_eq!(committed(&client, group, topic).await, [Some(1), Some(0)]);
        // Nor is a commit of another topic of the group: its offsets were not reset.
        client.create_topic("unfenced", 1).await.unwrap();
        send_all(&producer, "unfenced", bodies("u", 1)).await;
        client
            .commit_offset_from(group, "unfenced", 0, 1, 0, Some(before))
            .await
            .unwrap();

        // A member started now reads the reset offsets, under the reset's epoch, and its
        // commits are taken.
        let log: Log = Arc::default();
        let consumer = concurrent(&addr, group, topic, "*", first, &log, 0).await;
        caught_up(&client, group, topic).await;
        assert_eq!(
            log.lock().unwrap().len(),
            19,
            "all but the one committed by hand"
        );
        let member = consumer.client().unwrap();
        let after = member.query_assignment(group).await.unwrap().offsets_epoch;
        assert!(
            after >= reset_at,
            "{after}: from the clock, not counted from 0"
        );
        client
            .commit_offset_from(group, topic, 0, ends[0], 0, Some(after))
            .await
            .unwrap();
        let older = client
            .commit_offset_from(group, topic, 0, ends[0], 0, Some(after - 1))
            .await
            .unwrap_err();
        assert_eq!(older.code(), Some(ErrorCode::OffsetsReset), "{older}");

        // A second reset has a later epoch still: the first one's positions are refused.
        client.reset_offset_by_time(group, topic, 0).await.unwrap();
        eventually("the member to learn the second reset", || {
            log.lock().unwrap().len() >= 39
        })
        .await;
        caught_up(&client, group, topic).await;
        assert_eq!(log.lock().unwrap().len(), 39, "each of the 20 once more");
        let again = member.query_assignment(group).await.unwrap().offsets_epoch;
        assert!(again > after);
        let stale = client
            .commit_offset_from(group, topic, 1, ends[1], 0, Some(after))
            .await
            .unwrap_err();
        assert_eq!(stale.code(), Some(ErrorCode::OffsetsReset), "{stale}");
        consumer.shutdown().await.unwrap();
    });
}

/// A producer sends one message a millisecond while the member commits every millisecond;
/// each reset to the start must bring every message sent before it once more. A commit of
/// a position read before a reset, arriving after it, would move that queue's offset
/// forward again and the member would skip what lies below it.
#[test]
fn resets_while_a_member_commits_are_never_undone() {
    with_broker(|addr| async move {
        let (topic, group) = ("resets", "g-resets");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 2).await.unwrap();
        let log: Log = Arc::default();
        let options = PushConsumerOptions {
            consume_from: ConsumeFrom::FirstOffset,
            commit_interval_ms: 1,
            ..options()
        };
        let consumer = concurrent(&addr, group, topic, "*", options, &log, 0).await;
        settled(&[&consumer], 2).await;

        let sent = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let sending = {
            let (producer, sent) = (producer.clone(), sent.clone());
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_millis(1));
                let mut i = 0;
                loop {
                    tokio::select! {
                        _ = stopped.changed() => return,
                        _ = every.tick() => {}
                    }
                    // Counted once acknowledged; a failed send (a slow machine's timeout)
                    // goes again under the same body, so a copy can only add deliveries.
                    let body = format!("r-{i}");
                    if producer
                        .send(topic, OutgoingMessage::new(body))
                        .await
                        .is_ok()
                    {
                        i += 1;
                        sent.store(i, Ordering::SeqCst);
                    }
                }
            })
        };

        // How many had been sent when each reset came: each message is consumed once, then
        // once more after each reset that came after it was sent.
        let mut resets_at: Vec<usize> = Vec::new();
        for reset in 1..=6 {
            // Let the member consume and commit a while, then reset under it.
            let seen = log.lock().unwrap().len();
            eventually("the member to consume more", || {
                log.lock().unwrap().len() >= seen + 200
            })
            .await;
            resets_at.push(sent.load(Ordering::SeqCst) as usize);
            client.reset_offset_by_time(group, topic, 0).await.unwrap();
            let owed = |i: usize| 1 + resets_at.iter().filter(|at| i < **at).count();
            eventually(
                &format!("reset {reset} to bring back all {resets_at:?}"),
                || {
                    let counts = counts(&log);
                    (0..resets_at[reset - 1])
                        .all(|i| counts.get(&format!("r-{i}")).copied().unwrap_or(0) >= owed(i))
                },
            )
            .await;
        }
        stop.send(true).unwrap();
        sending.await.unwrap();
        caught_up(&client, group, topic).await;
        consumer.shutdown().await.unwrap();
    });
}

/// A group whose offsets were reset while it had no members keeps its epoch on the
/// coordinator, also through a refused first heartbeat (which otherwise forgets a group
/// without members): members joining later read it, and their commits are taken.
#[test]
fn a_reset_group_without_members_keeps_its_epoch_through_a_refused_heartbeat() {
    with_broker(|addr| async move {
        let (topic, group) = ("kept", "g-kept");
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 2).await.unwrap();
        send_all(&producer, topic, bodies("k", 10)).await;
        client.reset_offset_by_time(group, topic, 0).await.unwrap();
        // Refused by the coordinator: more subscriptions than a member may have.
        let spec = MemberSpec {
            subscriptions: (0..=256).map(|i| (format!("t{i}"), "*".into())).collect(),
            ..MemberSpec::default()
        };
        let refused = client.group_heartbeat(group, &spec).await.unwrap_err();
        assert!(refused.to_string().contains("subscriptions"), "{refused}");

        let log: Log = Arc::default();
        let consumer = concurrent(&addr, group, topic, "*", options(), &log, 0).await;
        caught_up(&client, group, topic).await;
        check_exactly_once(&log, &names("k", 10));
        let member = consumer.client().unwrap();
        assert!(member.query_assignment(group).await.unwrap().offsets_epoch > 0);
        consumer.shutdown().await.unwrap();
    });
}
