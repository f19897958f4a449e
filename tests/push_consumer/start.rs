//! Where a group's queues start when it has no committed offset there: the first message,
//! the last or a timestamp; queues made after the group subscribed (a topic a send made,
//! queues an update added, with or without a member running, a topic deleted and made
//! again under a member) at their first message; and the start committed before the first
//! message. Helpers are the parent module's.

use super::*;

/// A producer, its client, `topic` made with two queues, and options that start a queue
/// with no offset at its end (`LastOffset`).
async fn two_queues_and_last(addr: &str, topic: &str) -> (Producer, Client, PushConsumerOptions) {
    let producer = Producer::connect(ClientConfig::new(addr)).await.unwrap();
    let client = producer.client().clone();
    client.create_topic(topic, 2).await.unwrap();
    let last = PushConsumerOptions {
        consume_from: ConsumeFrom::LastOffset,
        ..options()
    };
    (producer, client, last)
}

#[test]
fn a_new_group_starts_from_the_first_the_last_or_a_timestamp() {
    with_broker(|addr| async move {
        let topic = "from";
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 2).await.unwrap();
        send_all(&producer, topic, bodies("old", 20)).await;
        // Every old message was stored before `middle`, every new one after it.
        let middle = now_ms() + 1;
        while now_ms() <= middle {
            tokio::task::yield_now().await;
        }
        send_all(&producer, topic, bodies("new", 20)).await;

        let check = |from: ConsumeFrom, group: &'static str, expected: BTreeSet<String>| {
            let addr = addr.clone();
            let client = client.clone();
            async move {
                let log: Log = Arc::default();
                let options = PushConsumerOptions {
                    consume_from: from,
                    ..options()
                };
                let consumer = concurrent(&addr, group, topic, "*", options, &log, 0).await;
                eventually(group, || counts(&log).len() >= expected.len()).await;
                caught_up(&client, group, topic).await;
                check_exactly_once(&log, &expected);
                consumer.shutdown().await.unwrap();
            }
        };
        let mut everything = names("old", 20);
        everything.extend(names("new", 20));
        check(ConsumeFrom::FirstOffset, "g-first", everything).await;
        check(ConsumeFrom::Timestamp(middle), "g-time", names("new", 20)).await;

        let log: Log = Arc::default();
        let options = PushConsumerOptions {
            consume_from: ConsumeFrom::LastOffset,
            ..options()
        };
        let last = concurrent(&addr, "g-last", topic, "*", options, &log, 0).await;
        settled(&[&last], 2).await;
        send_all(&producer, topic, bodies("latest", 10)).await;
        eventually("the 10 latest", || counts(&log).len() >= 10).await;
        caught_up(&client, "g-last", topic).await;
        check_exactly_once(&log, &names("latest", 10));
        last.shutdown().await.unwrap();
    });
}

/// A group subscribed to a topic no send has made yet (`LastOffset`, the default) gets every
/// message sent to it from its first on: the topic's queues did not exist when the group
/// subscribed, so they start at their first message, not at the end they have by the time
/// the member starts them (which skipped what was stored before: in about one run in three
/// here, the batch of the send that made the topic). Queues added later (`update_topic`)
/// start the same way. `start_from`'s unit test checks the choice itself.
#[test]
fn a_group_subscribed_before_its_topic_exists_gets_every_message() {
    with_broker(|addr| async move {
        let topic = "made-by-a-send";
        let log: Log = Arc::default();
        let options = PushConsumerOptions {
            consume_from: ConsumeFrom::LastOffset,
            ..options()
        };
        let consumer = concurrent(&addr, "g-early", topic, "*", options, &log, 0).await;
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        // The send that makes the topic stores its batch before the member can hear of it.
        producer
            .send_batch(topic, bodies("first", 20))
            .await
            .unwrap();
        eventually("the first 20", || counts(&log).len() >= 20).await;
        caught_up(&client, "g-early", topic).await;
        check_exactly_once(&log, &names("first", 20));

        let queues = client.describe_topic(topic).await.unwrap().queues.len() as u32;
        client.update_topic(topic, queues + 4).await.unwrap();
        // A producer that learns the new count at its first send.
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        send_all(&producer, topic, bodies("grown", 40)).await;
        eventually("all 60", || counts(&log).len() >= 60).await;
        caught_up(&client, "g-early", topic).await;
        let mut all = names("first", 20);
        all.extend(names("grown", 40));
        check_exactly_once(&log, &all);
        consumer.shutdown().await.unwrap();
    });
}

/// Where a new group starts is committed before it consumes: a member that stops before
/// its first periodic commit does not leave the next owner to start from its own (later)
/// end of the queue, skipping what came in between.
#[test]
fn a_new_group_commits_where_it_starts_before_consuming() {
    with_broker(|addr| async move {
        let topic = "start";
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic(topic, 1).await.unwrap();
        send_all(&producer, topic, bodies("old", 5)).await;
        let log: Log = Arc::default();
        let options = PushConsumerOptions {
            consume_from: ConsumeFrom::LastOffset,
            // No periodic commit during the test.
            commit_interval_ms: 3_600_000,
            ..options()
        };
        let first = concurrent(&addr, "g-start", topic, "*", options.clone(), &log, 0).await;
        settled(&[&first], 1).await;
        assert_eq!(
            client.query_offset("g-start", topic, 0).await.unwrap(),
            Some(5),
            "the start is committed before the first message"
        );
        // Gone without a commit (dropped: its tasks stop, nothing is committed), and
        // messages come in meanwhile: the next member starts where the first did.
        drop(first);
        send_all(&producer, topic, bodies("meanwhile", 5)).await;
        let second = concurrent(&addr, "g-start", topic, "*", options, &log, 1).await;
        eventually("the messages sent meanwhile", || counts(&log).len() >= 5).await;
        check_exactly_once(&log, &names("meanwhile", 5));
        second.shutdown().await.unwrap();
    });
}

/// Queues added to a topic while no member of a group that consumes it runs start at their
/// first message for that group (the update gives the group offsets there first), not at
/// the end they have when a member comes back, which skipped what was sent to them
/// meanwhile. A group new to the topic after the update still starts at the end.
#[test]
fn queues_added_while_no_member_runs_start_at_their_first_message() {
    with_broker(|addr| async move {
        let topic = "grown-unwatched";
        let (producer, client, last) = two_queues_and_last(&addr, topic).await;
        let log: Log = Arc::default();
        let member = concurrent(&addr, "g-away", topic, "*", last.clone(), &log, 0).await;
        settled(&[&member], 2).await;
        send_all(&producer, topic, bodies("before", 10)).await;
        eventually("the 10 before", || counts(&log).len() >= 10).await;
        caught_up(&client, "g-away", topic).await;
        member.shutdown().await.unwrap();

        client.update_topic(topic, 8).await.unwrap();
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        send_all(&producer, topic, bodies("away", 40)).await;
        let on_new_queues = |log: &Log| {
            let log = log.lock().unwrap();
            log.iter().filter(|d| d.queue_id >= 2).count()
        };
        let back = concurrent(&addr, "g-away", topic, "*", last.clone(), &log, 1).await;
        let later: Log = Arc::default();
        let newcomer = concurrent(&addr, "g-later", topic, "*", last, &later, 2).await;
        settled(&[&newcomer], 8).await;
        // Its start committed on every queue (at their ends).
        caught_up(&client, "g-later", topic).await;
        eventually("the 50", || counts(&log).len() >= 50).await;
        caught_up(&client, "g-away", topic).await;
        let mut all = names("before", 10);
        all.extend(names("away", 40));
        check_exactly_once(&log, &all);
        assert!(on_new_queues(&log) > 0, "some went to the added queues");
        // The group new to the topic takes only what is sent once it started.
        send_all(&producer, topic, bodies("after", 8)).await;
        eventually("the 8 after", || counts(&later).len() >= 8).await;
        caught_up(&client, "g-later", topic).await;
        check_exactly_once(&later, &names("after", 8));
        back.shutdown().await.unwrap();
        newcomer.shutdown().await.unwrap();
    });
}

/// A topic deleted and created again under a running member starts its queues at their
/// first message for the member's group: the creation gives the groups with a live member
/// subscribed offsets there first. The member counted the topic's queues when it started,
/// so it would take the new queues for old ones and start them at their end, skipping
/// what was sent to them before it heard of them (checked with a member that never starts
/// a queue, where the push consumer's race is hard to lose on purpose). A group with no
/// member keeps nothing of the old topic.
#[test]
fn a_topic_created_again_under_a_running_member_starts_at_its_first_message() {
    with_broker(|addr| async move {
        let topic = "made-again";
        let (producer, client, last) = two_queues_and_last(&addr, topic).await;
        let log: Log = Arc::default();
        let member = concurrent(&addr, "g-again", topic, "*", last, &log, 0).await;
        settled(&[&member], 2).await;
        send_all(&producer, topic, bodies("first", 10)).await;
        eventually("the 10 first", || counts(&log).len() >= 10).await;
        caught_up(&client, "g-again", topic).await;

        // A member that never starts a queue (the race the push consumer can lose, made
        // sure), and a group without members that had consumed the topic.
        let raw = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        let spec = ringmq::client::MemberSpec {
            subscriptions: vec![(topic.to_owned(), "*".into())],
            ..Default::default()
        };
        raw.group_heartbeat("g-raw", &spec).await.unwrap();
        client.commit_offset("g-gone", topic, 0, 5).await.unwrap();

        client.delete_topic(topic).await.unwrap();
        client.create_topic(topic, 2).await.unwrap();
        for q in 0..2 {
            let at = client.query_offset("g-raw", topic, q).await.unwrap();
            assert_eq!(
                at,
                Some(0),
                "queue {q}: its start is the group's before any member"
            );
            let at = client.query_offset("g-gone", topic, q).await.unwrap();
            assert_eq!(
                at, None,
                "queue {q}: no member, nothing kept from the old topic"
            );
        }
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        send_all(&producer, topic, bodies("again", 20)).await;
        eventually("the 30", || counts(&log).len() >= 30).await;
        caught_up(&client, "g-again", topic).await;
        let mut all = names("first", 10);
        all.extend(names("again", 20));
        check_exactly_once(&log, &all);
        member.shutdown().await.unwrap();
    });
}

/// A client config with a stable id named after `name` (started again, a member resumes
/// from its file) and `options` made broadcasting, with their offsets files in `dir`.
fn broadcasting_as(
    addr: &str,
    name: &str,
    dir: &tempfile::TempDir,
    options: PushConsumerOptions,
) -> (ClientConfig, PushConsumerOptions) {
    let mut config = ClientConfig::new(addr);
    config.client_id = stable_id(name);
    let options = PushConsumerOptions {
        message_model: MessageModel::Broadcasting,
        offsets_dir: Some(dir.path().to_owned()),
        ..options
    };
    (config, options)
}

/// Broadcasting: the twin of the test above for a member's local offsets, which the broker
/// cannot seed. Queues added while the member was down start at their first message when
/// it comes back (its file knows the topic but not them), so it gets all that was sent.
#[test]
fn broadcasting_queues_added_while_the_member_was_down_start_at_their_first_message() {
    with_broker(|addr| async move {
        let topic = "grown-bcast";
        let (producer, client, last) = two_queues_and_last(&addr, topic).await;
        let offsets_dir = tempfile::tempdir().unwrap();
        let (config, broadcasting) = broadcasting_as(&addr, "grown-bcast", &offsets_dir, last);
        let log: Log = Arc::default();
        let start = |log: Log| {
            let (config, options) = (config.clone(), broadcasting.clone());
            async move {
                concurrent_with_config(config, "g-bcast-grown", topic, "*", options, &log, 0).await
            }
        };
        let member = start(log.clone()).await;
        all_consuming(&[&member], 2).await;
        send_all(&producer, topic, bodies("before", 10)).await;
        eventually("the 10 before", || counts(&log).len() >= 10).await;
        member.shutdown().await.unwrap();

        client.update_topic(topic, 6).await.unwrap();
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        send_all(&producer, topic, bodies("away", 36)).await;
        let back = start(log.clone()).await;
        all_consuming(&[&back], 6).await;
        eventually("the 36 sent while it was down", || counts(&log).len() >= 46).await;
        // Shut down, its calls ended: a message consumed twice is in the record.
        back.shutdown().await.unwrap();
        let mut all = names("before", 10);
        all.extend(names("away", 36));
        check_exactly_once(&log, &all);
        let on_new_queues = log
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.queue_id >= 2)
            .count();
        assert!(on_new_queues > 0, "some went to the added queues");
    });
}

/// Broadcasting: a member's start positions are in its offsets file before it consumes
/// (committed there, not only at the committer's next pass or at shutdown: a member
/// killed before either would start again from `consume_from` and skip what was sent
/// meanwhile), and a directory the file cannot be written in refuses the start.
#[test]
fn broadcasting_start_positions_are_written_before_consuming() {
    with_broker(|addr| async move {
        let topic = "bcast-start";
        let (producer, _client, last) = two_queues_and_last(&addr, topic).await;
        send_all(&producer, topic, bodies("old", 6)).await;
        let offsets_dir = tempfile::tempdir().unwrap();
        // No periodic write during the test.
        let last = PushConsumerOptions {
            commit_interval_ms: 600_000,
            ..last
        };
        let (config, broadcasting) = broadcasting_as(&addr, "bcast-start", &offsets_dir, last);
        let log: Log = Arc::default();
        let member = concurrent_with_config(
            config.clone(),
            "g-bcast-start",
            topic,
            "*",
            broadcasting.clone(),
            &log,
            0,
        )
        .await;
        all_consuming(&[&member], 2).await;
        send_all(&producer, topic, bodies("new", 4)).await;
        eventually("the 4 new", || counts(&log).len() >= 4).await;
        check_exactly_once(&log, &names("new", 4));
        // The file, as a member killed now would find it: both queues at their starts
        // (the ends when it started: 3 old messages each).
        let file = std::fs::read_dir(offsets_dir.path())
            .unwrap()
            .flat_map(|client| std::fs::read_dir(client.unwrap().path()).unwrap())
            .map(|f| f.unwrap().path())
            .find(|f| f.to_string_lossy().ends_with(".offsets.json"))
            .expect("the offsets file is written");
        let body: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let mut kept: Vec<(u64, u64)> = body["offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["queue_id"].as_u64().unwrap(),
                    e["offset"].as_u64().unwrap(),
                )
            })
            .collect();
        kept.sort();
        assert_eq!(kept, vec![(0, 3), (1, 3)], "{body}");
        member.shutdown().await.unwrap();

        // A file that cannot be written (a directory where the write's temporary file
        // goes; permissions would not stop root): refused at the start.
        let blocked = tempfile::tempdir().unwrap();
        let temporary = format!("g-bcast-start.offsets.json.{}.tmp", std::process::id());
        let in_the_way = blocked.path().join(&config.client_id).join(temporary);
        std::fs::create_dir_all(in_the_way.join("in-the-way")).unwrap();
        let consumer = PushConsumer::new(
            config,
            "g-bcast-start",
            PushConsumerOptions {
                offsets_dir: Some(blocked.path().to_owned()),
                ..broadcasting
            },
        )
        .unwrap();
        consumer.subscribe(topic, "*").unwrap();
        consumer
            .register_concurrent(|_| ConsumeStatus::Success)
            .unwrap();
        let e = consumer.start().await.unwrap_err();
        assert!(e.to_string().contains("g-bcast-start.offsets.json"), "{e}");
    });
}
