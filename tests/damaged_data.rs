//! Data damaged on disk while the broker was stopped (bits flipped in a consume-queue entry
//! or in a record of the log), against the real broker binary and the real client: what
//! the damage holds up is reported where it is, naming it, and nothing is skipped unseen;
//! what comes before it is served.

mod common;

use std::time::Duration;

use common::broker::BrokerProcess;
use common::runtime;
use ringmq::client::{Client, ClientConfig, ClientError, OutgoingMessage, Producer};
use ringmq::protocol::ErrorCode;

/// A tag-filtered pull decides by each consume-queue entry's tag hash, without reading the
/// record. A damaged entry (one bit of its tag hash flipped on disk while the broker was
/// stopped) must not make its message vanish: the pull answers the messages before it, the
/// pull that starts at it fails with `StoreCorrupt` naming it (an unfiltered pull serves
/// all), and once the index is rebuilt (a `reindex` file in the shard's directory, as the
/// error says: the next start indexes the log again, then removes it) every message is
/// served again. Before entries were checked, the
/// pull skipped it unseen.
#[test]
fn a_damaged_index_entry_fails_the_tag_filtered_pull_at_it_instead_of_skipping_it() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let (mut broker, index) = ten_tagged_then_stopped(&data, "tagged", "t").await;
        let mut bytes = std::fs::read(&index).unwrap();
        bytes[4 * 20 + 12 + 3] ^= 0x10;
        std::fs::write(&index, bytes).unwrap();
        broker.restart();
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let pull = |offset| client.pull("tagged", 0, offset, 32, Duration::ZERO, &["A"]);
        let before = pull(0).await.unwrap();
        let bodies: Vec<&[u8]> = before.messages.iter().map(|m| m.body()).collect();
        assert_eq!(bodies, [&b"t-0"[..], b"t-1", b"t-2", b"t-3"]);
        assert_eq!(before.next_offset, 4);
        match pull(4).await {
            Err(ClientError::Broker { code, message, .. }) => {
                assert_eq!(code, Some(ErrorCode::StoreCorrupt), "{message}");
                assert!(message.contains("entry 4 fails its check"), "{message}");
                assert!(message.contains("named `reindex`"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Without a filter each record read is checked against its entry, whose tag hash
        // plays no part: every message is served.
        let plain = client.pull("tagged", 0, 0, 32, Duration::ZERO, &[]).await;
        assert_eq!(plain.unwrap().messages.len(), 10);
        drop(client);
        assert!(broker.stop(), "a clean stop");
        std::fs::write(data.join("shard-0/reindex"), b"").unwrap();
        broker.restart();
        assert!(!data.join("shard-0/reindex").exists(), "the request stays");
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let all = client.pull("tagged", 0, 0, 32, Duration::ZERO, &["A"]);
        let all = all.await.unwrap();
        let bodies: Vec<String> = all
            .messages
            .iter()
            .map(|m| String::from_utf8_lossy(m.body()).into_owned())
            .collect();
        let want: Vec<String> = (0..10).map(|i| format!("t-{i}")).collect();
        assert_eq!(bodies, want);
    });
}

/// An index entry found empty inside its queue (a zeroed stretch of the file; a power loss
/// can leave entries past a lost tail that the replay does not reach) stops pulls at it,
/// filtered or not: the ones before it are answered and the pull that starts at it fails
/// with `StoreCorrupt` naming it. Before, the queue looked as if it ended there: every pull
/// at it waited and answered `NoNewMessage` for ever while the queue's end said more.
#[test]
fn an_empty_index_entry_inside_a_queue_fails_the_pull_at_it_instead_of_ending_the_queue() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let (mut broker, index) = ten_tagged_then_stopped(&data, "holed", "h").await;
        let mut bytes = std::fs::read(&index).unwrap();
        bytes[4 * 20..5 * 20].fill(0);
        std::fs::write(&index, bytes).unwrap();
        broker.restart();
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        for tags in [&[][..], &["A"][..]] {
            let pull =
                |offset| client.pull("holed", 0, offset, 32, Duration::from_millis(200), tags);
            let before = pull(0).await.unwrap();
            let bodies: Vec<&[u8]> = before.messages.iter().map(|m| m.body()).collect();
            assert_eq!(bodies, [&b"h-0"[..], b"h-1", b"h-2", b"h-3"], "{tags:?}");
            assert_eq!(before.next_offset, 4, "{tags:?}");
            match pull(4).await {
                Err(ClientError::Broker { code, message, .. }) => {
                    assert_eq!(code, Some(ErrorCode::StoreCorrupt), "{message}");
                    assert!(message.contains("entry 4 is empty"), "{message}");
                }
                other => panic!("{tags:?}: {other:?}"),
            }
            // Past it, the rest is served.
            assert_eq!(pull(5).await.unwrap().messages.len(), 5, "{tags:?}");
        }
    });
}

/// A one-shard broker (sync flush) on `data` given ten messages `{prefix}-0`.. tagged `A` in
/// `topic`'s one queue, then stopped cleanly; with the index file of that queue.
async fn ten_tagged_then_stopped(
    data: &std::path::Path,
    topic: &str,
    prefix: &str,
) -> (BrokerProcess, std::path::PathBuf) {
    let mut broker = BrokerProcess::start(data, 1, &["--flush", "sync"]);
    let producer = Producer::connect(ClientConfig::new(broker.addr_string()))
        .await
        .unwrap();
    producer.client().create_topic(topic, 1).await.unwrap();
    for i in 0..10 {
        let m = OutgoingMessage::new(format!("{prefix}-{i}")).with_tags("A");
        producer.send(topic, m).await.unwrap();
    }
    drop(producer);
    assert!(broker.stop(), "a clean stop");
    let index = data.join(format!(
        "shard-0/consumequeue/{topic}/0/00000000000000000000"
    ));
    (broker, index)
}

/// A record damaged on a disk after the start-up checks (a body byte flipped in a segment
/// older than the three a start verifies): the consumer's CRC check catches it. A pull
/// that reaches it answers the records before it and ends there; the pull that starts at
/// it fails with `DamagedRecord` naming its offset, every time (nothing past it is
/// delivered, so nothing is skipped); committed past it, the group goes on from there.
/// Before, the whole answer failed: the records before it in the batch were held up too,
/// and the error named no offset.
#[test]
fn a_damaged_record_stops_its_queue_at_its_offset_and_names_it() {
    runtime().block_on(async {
        let (dir, mut broker, producer) = small_segments_broker_with("rot").await;
        let data = dir.path().join("data");
        for i in 0..10 {
            let mut m = OutgoingMessage::new(format!("rot-body-{i:04}"));
            if i % 2 == 1 {
                m = m.with_tags("A");
            }
            producer.send("rot", m).await.unwrap();
        }
        fill_four_segments(&producer).await;
        drop(producer);
        assert!(broker.stop(), "a clean stop");
        let segment = data.join("shard-0/commitlog").join(format!("{:020}", 0));
        let mut bytes = std::fs::read(&segment).unwrap();
        let at = bytes
            .windows(13)
            .position(|w| w == b"rot-body-0005")
            .expect("the body is in the first segment");
        bytes[at + 12] ^= 0x01;
        std::fs::write(&segment, bytes).unwrap();
        broker.restart();
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let pull = |offset| client.pull("rot", 0, offset, 32, Duration::ZERO, &[]);
        let before = pull(0).await.unwrap();
        let offsets: Vec<u64> = before.messages.iter().map(|m| m.queue_offset()).collect();
        assert_eq!(offsets, [0, 1, 2, 3, 4]);
        assert_eq!(
            before.next_offset, 5,
            "the next pull starts at the damaged record"
        );
        for _ in 0..2 {
            match pull(5).await {
                Err(e @ ClientError::DamagedRecord { .. }) => {
                    let ClientError::DamagedRecord { offset, .. } = &e else {
                        unreachable!()
                    };
                    assert_eq!(*offset, 5);
                    let said = e.to_string();
                    assert!(said.contains("offset 5 of rot[0]"), "{said}");
                    assert!(said.contains("commit GROUP rot 0 6"), "{said}");
                }
                other => panic!("{other:?}"),
            }
        }
        let after = pull(6).await.unwrap();
        let offsets: Vec<u64> = after.messages.iter().map(|m| m.queue_offset()).collect();
        assert_eq!(offsets, [6, 7, 8, 9], "past it, the rest is there");
        // Filtered, a pull's answer starts past where it started: the error names the
        // damaged record's own offset, not the pull's.
        let tagged = |offset| client.pull("rot", 0, offset, 32, Duration::ZERO, &["A"]);
        let before = tagged(0).await.unwrap();
        let offsets: Vec<u64> = before.messages.iter().map(|m| m.queue_offset()).collect();
        assert_eq!((offsets, before.next_offset), (vec![1, 3], 4));
        match tagged(4).await {
            Err(ClientError::DamagedRecord { offset, .. }) => assert_eq!(offset, 5),
            other => panic!("{other:?}"),
        }
    });
}

/// A record damaged in its structure on disk (its header's magic flipped, in a segment older
/// than the three a start verifies), and an index entry whose size says one byte more than
/// its record has: the broker's own check of each record read stops the pull before each,
/// answering what comes before, and the pull that starts at one fails with `StoreCorrupt`
/// naming its queue offset; past each, the rest is served. Before, the first failed every
/// pull that reached it, naming no queue offset (the records before it held up too), and
/// the second sent the next record's first byte with its record, which the consumer could
/// not parse.
#[test]
fn records_that_are_not_what_their_entries_say_stop_the_pull_at_their_offsets() {
    runtime().block_on(async {
        let (dir, mut broker, producer) = small_segments_broker_with("bent").await;
        let data = dir.path().join("data");
        for i in 0..10 {
            let m = OutgoingMessage::new(format!("bent-body-{i:04}"));
            producer.send("bent", m).await.unwrap();
        }
        fill_four_segments(&producer).await;
        drop(producer);
        assert!(broker.stop(), "a clean stop");
        damage_header_of(&data, b"bent-body-0005");
        let index = data.join("shard-0/consumequeue/bent/0/00000000000000000000");
        let mut bytes = std::fs::read(&index).unwrap();
        let size = 2 * 20 + 8;
        let longer = u32::from_le_bytes(bytes[size..size + 4].try_into().unwrap()) + 1;
        bytes[size..size + 4].copy_from_slice(&longer.to_le_bytes());
        std::fs::write(&index, bytes).unwrap();
        broker.restart();
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let pull = |offset| client.pull("bent", 0, offset, 32, Duration::ZERO, &[]);
        for (from, answered, damaged, said) in
            [(0, vec![0, 1], 2, "says"), (3, vec![3, 4], 5, "magic")]
        {
            let before = pull(from).await.unwrap();
            let offsets: Vec<u64> = before.messages.iter().map(|m| m.queue_offset()).collect();
            assert_eq!((offsets, before.next_offset), (answered, damaged));
            expect_store_corrupt(pull(damaged).await, &format!("bent:0:{damaged}"), said);
        }
        let after = pull(6).await.unwrap();
        let offsets: Vec<u64> = after.messages.iter().map(|m| m.queue_offset()).collect();
        assert_eq!(offsets, [6, 7, 8, 9], "past it, the rest is there");
    });
}

/// Index entries damaged in their offset or their size, read by pulls without a filter
/// (which take entries unchecked and check the records read): an entry pointing back at an
/// earlier record, last of the entries a pull reads, and one whose size is 4 GiB. Each
/// stops the pull before it, and the pull that starts at it fails with `StoreCorrupt`
/// naming it; the rest is served. Before, the first made the read of the run shorter than
/// the records before it, and slicing them panicked the shard (the broker stopped); the
/// second sized a read of 4 GiB.
#[test]
fn entries_pointing_back_or_sized_past_any_record_stop_the_pull_at_their_offsets() {
    runtime().block_on(async {
        let (dir, mut broker, producer) = small_segments_broker_with("askew").await;
        for i in 0..10 {
            let m = OutgoingMessage::new(format!("askew-body-{i:04}"));
            producer.send("askew", m).await.unwrap();
        }
        drop(producer);
        assert!(broker.stop(), "a clean stop");
        let index = dir
            .path()
            .join("data/shard-0/consumequeue/askew/0/00000000000000000000");
        let mut bytes = std::fs::read(&index).unwrap();
        let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        // Entry 3's offset is entry 1's (its check bits kept: unfiltered reads skip them).
        let low = (1u64 << 48) - 1;
        let pointing_back = (u64_at(&bytes, 60) & !low) | (u64_at(&bytes, 20) & low);
        bytes[60..68].copy_from_slice(&pointing_back.to_le_bytes());
        // Entry 6's size.
        bytes[128..132].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        std::fs::write(&index, bytes).unwrap();
        broker.restart();
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let pull = |offset, max| client.pull("askew", 0, offset, max, Duration::ZERO, &[]);
        for (from, max, answered, damaged, said) in [
            (0, 4, vec![0, 1, 2], 3, "another record"),
            (4, 32, vec![4, 5], 6, "a record has"),
        ] {
            let before = pull(from, max).await.unwrap();
            let offsets: Vec<u64> = before.messages.iter().map(|m| m.queue_offset()).collect();
            assert_eq!((offsets, before.next_offset), (answered, damaged));
            let named = format!("askew:0:{damaged}");
            expect_store_corrupt(pull(damaged, 32).await, &named, said);
        }
        let after = pull(7, 32).await.unwrap();
        let offsets: Vec<u64> = after.messages.iter().map(|m| m.queue_offset()).collect();
        assert_eq!(offsets, [7, 8, 9], "past them, the rest is there");
    });
}

/// Delayed messages due together are read from the log in one run. One of them damaged on
/// disk (its header's magic flipped, in a segment older than the three a start verifies)
/// is the only one lost (counted as undeliverable): the others of its run are delivered.
/// Before, each failed read of the run took its first message for lost, so every message
/// before the damaged one went with it.
#[test]
fn a_damaged_delayed_message_is_the_only_one_of_its_run_lost() {
    runtime().block_on(async {
        let (dir, mut broker, producer) = small_segments_broker_with("later").await;
        let data = dir.path().join("data");
        for i in 0..10 {
            let m = OutgoingMessage::new(format!("later-body-{i:04}")).with_delay_ms(10_000);
            producer.send("later", m).await.unwrap();
        }
        fill_four_segments(&producer).await;
        let delivered = producer.client().max_offset("later", 0).await.unwrap();
        assert_eq!(
            delivered, 0,
            "too slow a machine: delivered before the stop"
        );
        drop(producer);
        assert!(broker.stop(), "a clean stop");
        damage_header_of(&data, b"later-body-0005");
        broker.restart();
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut got = Vec::new();
        while got.len() < 9 {
            assert!(std::time::Instant::now() < deadline, "delivered: {got:?}");
            let at = got.len() as u64;
            let pulled = client.pull("later", 0, at, 32, Duration::from_millis(500), &[]);
            for m in pulled.await.unwrap().messages {
                got.push(String::from_utf8_lossy(m.body()).into_owned());
            }
        }
        got.sort();
        let want: Vec<String> = (0..10)
            .filter(|&i| i != 5)
            .map(|i| format!("later-body-{i:04}"))
            .collect();
        assert_eq!(got, want);
        let more = client.pull("later", 0, 9, 32, Duration::from_millis(500), &[]);
        assert!(
            more.await.unwrap().messages.is_empty(),
            "the damaged one is not delivered"
        );
    });
}

/// A one-shard sync-flush broker whose log segments hold 64 KiB.
fn small_segments_broker(data: &std::path::Path) -> BrokerProcess {
    BrokerProcess::start(data, 1, &["--flush", "sync", "--segment-bytes", "65536"])
}

/// [`small_segments_broker`] in a new temporary directory (its `data`), with a producer
/// and the one-queue topic `topic`.
async fn small_segments_broker_with(topic: &str) -> (tempfile::TempDir, BrokerProcess, Producer) {
    let dir = tempfile::tempdir().unwrap();
    let broker = small_segments_broker(&dir.path().join("data"));
    let producer = Producer::connect(ClientConfig::new(broker.addr_string()));
    let producer = producer.await.unwrap();
    producer.client().create_topic(topic, 1).await.unwrap();
    (dir, broker, producer)
}

/// A pull's `StoreCorrupt` answer naming `named` and saying `said`.
fn expect_store_corrupt<T: std::fmt::Debug>(
    pulled: Result<T, ClientError>,
    named: &str,
    said: &str,
) {
    match pulled {
        Err(ClientError::Broker { code, message, .. }) => {
            assert_eq!(code, Some(ErrorCode::StoreCorrupt), "{message}");
            assert!(message.contains(named), "{message}");
            assert!(message.contains(said), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// Four segments of other messages: what was sent before lies in a segment older than
/// the three a start verifies.
async fn fill_four_segments(producer: &Producer) {
    producer.client().create_topic("filler", 1).await.unwrap();
    // In flight together: their fdatasyncs are shared (sent one at a time, 260 of them on a
    // slow disk outlasted the delayed messages' delay).
    let sends: Vec<_> = (0..260)
        .map(|_| producer.send_async("filler", OutgoingMessage::new(vec![7u8; 1024])))
        .collect();
    for send in sends {
        send.await.unwrap();
    }
}

/// Flips a bit of the magic of the record whose body holds `body`, in the first log
/// segment of shard 0 (the broker stopped).
fn damage_header_of(data: &std::path::Path, body: &[u8]) {
    let segment = data.join("shard-0/commitlog").join(format!("{:020}", 0));
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = bytes
        .windows(body.len())
        .position(|w| w == body)
        .expect("the record is in the first segment");
    let magic = bytes[..at]
        .windows(4)
        .rposition(|w| w == b"RMQ\x01")
        .expect("its header");
    bytes[magic] ^= 0x01;
    std::fs::write(&segment, bytes).unwrap();
}

/// An unresolved half message damaged on disk (its header's magic flipped, in a segment
/// older than the three a start verifies): the start counts it as damaged and goes on,
/// and the other halves stay pending. Before, the start read the halves in chunks and one
/// damaged record failed the chunk and the whole start, on every start after.
#[test]
fn a_damaged_half_message_is_skipped_at_start_not_every_start_refused() {
    use ringmq::client::{TransactionOutcome, TransactionProducer};
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut broker = small_segments_broker(&data);
        let unsure = |_: &_| TransactionOutcome::Unknown;
        let config = ClientConfig::new(broker.addr_string());
        let tp = TransactionProducer::start(config, "txd", unsure)
            .await
            .unwrap();
        tp.producer().client().create_topic("txn", 1).await.unwrap();
        for i in 0..10 {
            let m = OutgoingMessage::new(format!("txn-body-{i:04}"));
            let sent = tp.send_in_transaction("txn", m, |_| TransactionOutcome::Unknown);
            let _half = sent.await.unwrap();
        }
        fill_four_segments(tp.producer()).await;
        drop(tp);
        assert!(broker.stop(), "a clean stop");
        damage_header_of(&data, b"txn-body-0005");
        broker.restart();
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let list = client.list_transactions().await.unwrap();
        assert_eq!(list.halves.len(), 9, "{list:?}");
        assert!(
            broker
                .stderr()
                .contains("1 transaction record(s) could not be read at start"),
            "{}",
            broker.stderr()
        );
    });
}

/// A lookup by key passes a damaged record among its candidates (with a warning) and
/// answers the others. Before, the one damaged record failed the whole lookup, and with it
/// a start's search for a transaction's committed copy, which then had the transaction
/// committed again.
#[test]
fn a_damaged_record_hides_no_other_message_of_its_key() {
    runtime().block_on(async {
        let (dir, mut broker, producer) = small_segments_broker_with("keyed").await;
        for i in 0..3 {
            let m = OutgoingMessage::new(format!("keyed-body-{i}")).with_keys(["shared-key"]);
            producer.send("keyed", m).await.unwrap();
        }
        fill_four_segments(&producer).await;
        drop(producer);
        assert!(broker.stop(), "a clean stop");
        damage_header_of(&dir.path().join("data"), b"keyed-body-1");
        broker.restart();
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let found = client.messages_by_key("keyed", "shared-key", 0, i64::MAX, 10);
        let found = found.await.unwrap();
        let mut bodies: Vec<&[u8]> = found.iter().map(|m| m.body()).collect();
        bodies.sort();
        assert_eq!(bodies, [&b"keyed-body-0"[..], b"keyed-body-2"]);
        assert!(
            broker.stderr().contains("1 damaged record(s) passed"),
            "{}",
            broker.stderr()
        );
    });
}

/// An empty slot in the schedule's index, found by a start that scans the schedule's queue
/// (no snapshot covers it), is said in the broker's log with what to do: a delayed send a
/// full disk cut, or an entry damaged on disk whose message would otherwise wait unseen.
/// Before, the scan passed it silently.
#[test]
fn an_empty_schedule_slot_found_at_start_is_said() {
    runtime().block_on(async {
        let (dir, mut broker, producer) = small_segments_broker_with("later").await;
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            + 3_600_000;
        for i in 0..3 {
            let m = OutgoingMessage::new(format!("later-{i}")).with_deliver_at_ms(at);
            producer.send("later", m).await.unwrap();
        }
        drop(producer);
        assert!(broker.stop(), "a clean stop");
        let shard = dir.path().join("data/shard-0");
        let index = shard.join("consumequeue/%SYS_SCHEDULE%/0/00000000000000000000");
        let mut bytes = std::fs::read(&index).unwrap();
        bytes[20..40].fill(0);
        std::fs::write(&index, bytes).unwrap();
        std::fs::remove_file(shard.join("schedule.snapshot")).unwrap();
        broker.restart();
        let client = Client::connect(ClientConfig::new(broker.addr_string()))
            .await
            .unwrap();
        let stats = client.schedule_stats().await.unwrap();
        assert_eq!(stats[0].pending, 2, "{stats:?}");
        assert!(
            broker
                .stderr()
                .contains("1 empty slot(s) in the schedule's index past its snapshot"),
            "{}",
            broker.stderr()
        );
    });
}

/// A pending half message damaged on disk while the broker runs (after the start that
/// would have counted it): its check cannot read it, so it is let go, said with its id,
/// rather than held unchecked (counted against its group) until retention. Before, each
/// check passed it over without a word.
#[test]
fn a_half_message_damaged_while_running_is_said_and_let_go_at_its_check() {
    use ringmq::client::{TransactionOutcome, TransactionProducer};
    use std::io::{Seek, SeekFrom, Write};
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let flags = [
            "--tail-cache-mb",
            "0",
            "--segment-bytes",
            "1048576",
            "--transaction-timeout-ms",
            "300",
            "--transaction-check-interval-ms",
            "300",
        ];
        let broker = BrokerProcess::start(&data, 1, &flags);
        let unsure = |_: &_| TransactionOutcome::Unknown;
        let config = ClientConfig::new(broker.addr_string());
        let tp = TransactionProducer::start(config, "txw", unsure)
            .await
            .unwrap();
        let client = tp.producer().client().clone();
        client.create_topic("txw", 1).await.unwrap();
        let m = OutgoingMessage::new("txw-body-damaged");
        let sent = tp.send_in_transaction("txw", m, |_| TransactionOutcome::Unknown);
        let id = sent.await.unwrap().send.transaction_id;
        // One bit of its header's magic flipped in place (the broker writes on).
        let segment = data.join("shard-0/commitlog").join(format!("{:020}", 0));
        let bytes = std::fs::read(&segment).unwrap();
        let body = b"txw-body-damaged";
        let at = bytes.windows(body.len()).position(|w| w == body).unwrap();
        let magic = bytes[..at]
            .windows(4)
            .rposition(|w| w == b"RMQ\x01")
            .unwrap();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&segment)
            .unwrap();
        file.seek(SeekFrom::Start(magic as u64)).unwrap();
        file.write_all(&[bytes[magic] ^ 0x01]).unwrap();
        file.sync_all().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !client.list_transactions().await.unwrap().halves.is_empty() {
            assert!(std::time::Instant::now() < deadline, "still pending");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let said = broker.stderr();
        let line = format!("transaction {id} of producer group txw (for txw[0]) cannot be checked");
        assert!(said.contains(&line), "{said}");
        assert!(said.contains("let go unresolved"), "{said}");
        tp.shutdown().await;
    });
}
