//! Lookups: by key (what a lookup reads, a deleted topic's messages), by message id (one
//! outside the log) and by time (a search that retention runs under), at the store and
//! against the real broker binary with the real client.

mod common;

use common::broker::BrokerProcess;
use ringmq::client::{Client, ClientConfig, OutgoingMessage, Producer};
use ringmq::protocol::record::PropertiesBuilder;
use ringmq::store::{MessageStore, StoreConfig};

/// A message of `body` bytes for queue 0 of `topic` with `key`.
fn keyed(topic: &str, key: &str, body: usize) -> common::TestMessage {
    let mut p = PropertiesBuilder::new();
    p.put("KEYS", key).unwrap();
    common::TestMessage {
        topic: topic.into(),
        queue_id: 0,
        properties: p.into_bytes(),
        body: vec![3; body],
        born_timestamp_ms: 1_700_000_000_000,
    }
}

/// A lookup by key reads no more records than fit in its bytes (at least one), newest
/// first: before, the broker's lookup read, and held, up to 1,024 whole records (of up to
/// 4 MiB each) to answer one frame. A start's search for a transaction's copy still reads
/// what it asks for.
#[test]
fn a_lookup_by_key_reads_no_more_than_its_bytes() {
    ringmq::io::run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = MessageStore::open(dir.path(), StoreConfig::default())
            .await
            .unwrap();
        let mut offsets = Vec::new();
        for _ in 0..8 {
            let put = store.put(&keyed("t", "big", 600 << 10).draft()).await;
            offsets.push(put.unwrap().physical_offset);
        }
        let log = store.log();
        log.wait_readable(log.write_offset()).await.unwrap();
        let newest: Vec<u64> = offsets.iter().rev().copied().collect();
        let at = |found: &[ringmq::io::ReadBuf]| -> Vec<u64> {
            let view = |b| ringmq::protocol::record::RecordView::parse(b).unwrap();
            found.iter().map(|b| view(b).physical_offset()).collect()
        };
        let found = store
            .lookup_by_key("t", "big", 0, i64::MAX, 100, 2 << 20)
            .await;
        assert_eq!(at(&found.unwrap()), newest[..3]);
        let found = store.lookup_by_key("t", "big", 0, i64::MAX, 100, 1).await;
        assert_eq!(at(&found.unwrap()), newest[..1], "at least one");
        let found = store.messages_by_key("t", "big", 0, i64::MAX, 100).await;
        assert_eq!(at(&found.unwrap()), newest);
    });
}

fn config(addr: &str) -> ClientConfig {
    let mut c = ClientConfig::new(addr.to_owned());
    c.request_timeout_ms = 10_000;
    c
}

/// A deleted topic's messages stay in the log, and in the key index, until retention:
/// a lookup by key finds none of them, also once the topic is made again (when it finds
/// the new topic's). Before, it answered them as the topic's. And a message id outside
/// the log is no message (`None`), not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_topics_messages_are_not_found_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let client = Client::connect(config(&broker.addr_string()))
        .await
        .unwrap();
    let producer = Producer::from_client(client.clone(), Default::default());
    let send = |body: &str, key: &str| {
        let m = OutgoingMessage::new(body.to_owned()).with_key(key);
        producer.send("kt", m)
    };
    client.create_topic("kt", 4).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(send(&format!("old-{i}"), "k").await.unwrap().msg_id);
    }
    let by_key = |key: &'static str| client.messages_by_key("kt", key, 0, i64::MAX, 32);
    assert_eq!(by_key("k").await.unwrap().len(), 4);
    client.delete_topic("kt").await.unwrap();
    assert!(by_key("k").await.unwrap().is_empty());
    client.create_topic("kt", 4).await.unwrap();
    assert!(by_key("k").await.unwrap().is_empty());
    for i in 0..4 {
        send(&format!("other-{i}"), "other").await.unwrap();
    }
    send("new", "k").await.unwrap();
    let found = by_key("k").await.unwrap();
    let bodies: Vec<&[u8]> = found.iter().map(|m| m.body()).collect();
    assert_eq!(bodies, [b"new"]);
    assert!(client.message_by_id(&ids[0]).await.unwrap().is_none());
    let mut past = ringmq::protocol::MessageId::parse(&ids[0]).unwrap();
    past.physical_offset += 1 << 40;
    let past = client.message_by_id(&past.encode()).await;
    assert!(past.unwrap().is_none(), "an id past the log's end");
}

/// A search for the offset of a time (a consumer starting from a timestamp, a reset) that
/// retention runs under while it waits for a read: the records deleted count as earlier,
/// and the answer is the queue's first kept offset. Before, it failed with
/// `OffsetTooSmall` (the next probe was below the queue's new start).
#[test]
fn a_time_search_that_retention_runs_under_answers_the_first_kept_offset() {
    ringmq::io::run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ringmq::store::StoreConfig::default();
        cfg.log.segment_bytes = 256 << 10;
        cfg.log.retention_bytes_max = 512 << 10;
        cfg.log.tail_cache_bytes = 0;
        let (store, _) = ringmq::store::MessageStore::open(dir.path(), cfg)
            .await
            .unwrap();
        let mut m = common::message(31, 0, 1, 10);
        m.body = vec![5; 2000];
        (m.topic, m.queue_id) = ("t".into(), 0);
        for _ in 0..1000 {
            store.put(&m.draft()).await.unwrap();
        }
        let log = store.log();
        log.wait_readable(log.write_offset()).await.unwrap();
        assert_eq!(store.queue_range("t", 0).unwrap(), (0, 1000));
        // Timestamp 0: every probe goes towards the queue's start, each waiting for a disk
        // read (no tail cache); retention deletes the start while the first one waits.
        let search = store.offset_by_timestamp("t", 0, 0);
        let mut search = std::pin::pin!(search);
        let first = futures_lite::future::poll_once(&mut search).await;
        assert!(first.is_none(), "the search waits for its first read");
        store.apply_retention(ringmq::log::now_ms()).await.unwrap();
        let (min, max) = store.queue_range("t", 0).unwrap();
        assert!(
            min > 250 && max == 1000,
            "retention deleted the start: {min}..{max}"
        );
        assert_eq!(search.await.unwrap(), min);
    });
}

/// A time search that meets a damaged entry fails naming it: one pointing inside another
/// record's bytes (`Corrupt`, before: a time read from those bytes sent the search astray,
/// and a group reset by time could go to a wrong offset), and an empty one inside the queue
/// (before: `OffsetTooBig`, as if past the queue's end).
#[test]
fn a_time_search_that_meets_a_damaged_entry_names_it() {
    use ringmq::index::IndexError;
    use ringmq::log::LogError;
    use ringmq::store::StoreError;
    ringmq::io::run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = StoreConfig::default();
        cfg.consume_queue.entries_per_file = 100;
        let (store, _) = MessageStore::open(dir.path(), cfg).await.unwrap();
        for _ in 0..40 {
            store.put(&keyed("t", "k", 300).draft()).await.unwrap();
        }
        let log = store.log();
        log.wait_readable(log.write_offset()).await.unwrap();
        // Entry 20 (the search's first probe, in 0..40) is 20 bytes at 400 in the file
        // (the mapped file sees the write).
        let file = dir
            .path()
            .join("consumequeue/t/0")
            .join(format!("{:020}", 0));
        let damage = |entry: &dyn Fn(&mut [u8])| {
            let mut bytes = std::fs::read(&file).unwrap();
            entry(&mut bytes[400..420]);
            std::fs::write(&file, &bytes).unwrap();
        };
        damage(&|e| {
            let at = u64::from_le_bytes(e[..8].try_into().unwrap());
            e[..8].copy_from_slice(&(at + 100).to_le_bytes());
        });
        match store.offset_by_timestamp("t", 0, 0).await {
            Err(StoreError::Log(LogError::Corrupt { reason, .. })) => {
                assert!(reason.contains("t:0:20"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        damage(&|e| e.fill(0));
        match store.offset_by_timestamp("t", 0, 0).await {
            Err(StoreError::Index(IndexError::Corrupt { reason, .. })) => {
                assert!(reason.contains("entry 20 is empty"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    });
}
