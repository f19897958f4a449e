//! The message store: queue offsets, pulls with tag filters, lookup by time and by key,
//! reopen, retention of indexes.

mod common;

use std::collections::{HashMap, HashSet};

use ringmq::index::tag_hash;
use ringmq::io::run_local;
use ringmq::log::LogError;
use ringmq::protocol::record::{Placement, RecordView};
use ringmq::store::{MessageStore, StoreConfig, StoreError};

fn small_config() -> StoreConfig {
    let mut cfg = StoreConfig::default();
    cfg.log.segment_bytes = 256 * 1024;
    cfg.consume_queue.entries_per_file = 100;
    cfg.key_index.slots_per_file = 16;
    cfg.key_index.entries_per_file = 200;
    cfg
}

/// A store with [`small_config`] in `dir`.
async fn open_small(dir: &std::path::Path) -> MessageStore {
    MessageStore::open(dir, small_config()).await.unwrap().0
}

/// A small message (`common::message`'s number 1 of `seed`) for queue `queue_id` of `topic`.
fn one_message(seed: u64, topic: &str, queue_id: u32) -> common::TestMessage {
    let mut m = common::message(seed, 1, 1, 10);
    m.topic = topic.to_owned();
    m.queue_id = queue_id;
    m
}

struct Stored {
    topic: String,
    queue_id: u32,
    queue_offset: u64,
    store_ts: i64,
    bytes: Vec<u8>,
    n: u64,
}

async fn fill(store: &MessageStore, seed: u64, count: u64) -> Vec<Stored> {
    let mut out = Vec::new();
    for n in 0..count {
        let m = common::message(seed, n, 4, 3000);
        let r = store.put(&m.draft()).await.unwrap();
        let bytes = m.draft().encode(Placement {
            queue_offset: r.queue_offset,
            physical_offset: r.physical_offset,
            store_timestamp_ms: r.store_timestamp_ms,
        });
        out.push(Stored {
            topic: m.topic.clone(),
            queue_id: m.queue_id,
            queue_offset: r.queue_offset,
            store_ts: r.store_timestamp_ms,
            bytes,
            n,
        });
        if n % 200 == 0 {
            // Spread store timestamps so time search has distinct values.
            ringmq::io::sleep(std::time::Duration::from_millis(3)).await;
        }
    }
    out
}

async fn check_contents(store: &MessageStore, stored: &[Stored]) {
    for s in stored {
        let got = store
            .read_at(&s.topic, s.queue_id, s.queue_offset)
            .await
            .unwrap();
        assert_eq!(&got[..], &s.bytes[..]);
    }
}

/// A batch append (a run of drafts of one queue shares one look-up of the queue and one
/// store timestamp) stores what appending the drafts one by one stores: the same queue
/// offsets, positions and bytes, whether the queue changes from one draft to the next or
/// stays the same for a run.
#[test]
fn a_batch_append_stores_what_single_appends_store() {
    run_local(|| async {
        let (dir_one, dir_batch) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (one, _) = MessageStore::open(dir_one.path(), small_config())
            .await
            .unwrap();
        let (batch, _) = MessageStore::open(dir_batch.path(), small_config())
            .await
            .unwrap();
        // 200 messages whose topic and queue change every time, then a run of 100 of one
        // queue (numbers 0, 8, 16, ...: topic0, queue 0).
        let messages: Vec<_> = (0..200)
            .chain((0..100).map(|i| 1000 + 8 * i))
            .map(|n| common::message(21, n, 4, 3000))
            .collect();
        let singles: Vec<_> = messages
            .iter()
            .map(|m| one.append(&m.draft()).unwrap())
            .collect();
        let mut puts = Vec::new();
        batch
            .append_batch(messages.iter().map(|m| m.draft()), &mut puts)
            .unwrap();
        assert_eq!(puts.len(), singles.len());
        for (b, s) in puts.iter().zip(&singles) {
            assert_eq!(
                (b.queue_offset, b.physical_offset, b.size),
                (s.queue_offset, s.physical_offset, s.size)
            );
            assert_eq!(b.store_timestamp_ms, puts[0].store_timestamp_ms);
        }
        let end = puts.last().unwrap().end();
        batch.log().wait_acked(end).await.unwrap();
        one.log().wait_acked(end).await.unwrap();
        let stored: Vec<Stored> = messages
            .iter()
            .zip(&puts)
            .enumerate()
            .map(|(n, (m, r))| Stored {
                topic: m.topic.clone(),
                queue_id: m.queue_id,
                queue_offset: r.queue_offset,
                store_ts: r.store_timestamp_ms,
                bytes: m.draft().encode(Placement {
                    queue_offset: r.queue_offset,
                    physical_offset: r.physical_offset,
                    store_timestamp_ms: r.store_timestamp_ms,
                }),
                n: n as u64,
            })
            .collect();
        check_contents(&batch, &stored).await;
        // The run of one queue took consecutive offsets after the queue's earlier 50.
        let run: Vec<u64> = puts[200..].iter().map(|p| p.queue_offset).collect();
        assert_eq!(run, (50..150).collect::<Vec<u64>>());
        assert_eq!(batch.queues().unwrap(), one.queues().unwrap());
    });
}

/// A batch whose indexing fails half-way (here the key index cannot create its next file;
/// on a real disk: a full one) is answered with the error and stores none of its messages:
/// the ones appended before the failure are taken back from the log, the consume queue and
/// the key index, so the sender's retry stores each message once. After a reopen the queue
/// holds every message once, in order.
#[test]
fn a_batch_whose_indexing_fails_half_way_stores_none_of_it() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        // Two keys per message, 200 entries per key file: 90 messages fill 180.
        let messages: Vec<_> = (0..110)
            .map(|n| {
                let mut m = common::message(31, n, 1, 3000);
                m.topic = "t".into();
                m
            })
            .collect();
        // Appended without yielding, up to the last failure below: the key index's spare,
        // made in the blocking pool, is handed back by a task of this thread, so every
        // roll until then creates its file here, where the blocker fails it (a roll that
        // takes a spare makes no file-system call, and cannot fail).
        for m in &messages[..90] {
            store.append(&m.draft()).unwrap();
        }
        let first_end = store.log().write_offset();
        let blocker = dir.path().join("index").join(format!("{:020}", 1));
        std::fs::create_dir(&blocker).unwrap();
        let mut puts = Vec::new();
        let batch = || messages[90..].iter().map(|m| m.draft());
        let err = store.append_batch(batch(), &mut puts).unwrap_err();
        assert!(puts.is_empty(), "{} puts kept after {err}", puts.len());
        assert_eq!(
            store.log().write_offset(),
            first_end,
            "records left in the log"
        );
        // Single appends: the ten that fit the key file are stored; the next fails and
        // stores nothing either.
        for m in &messages[90..100] {
            store.append(&m.draft()).unwrap();
        }
        let log_end = store.log().write_offset();
        assert!(store.append(&messages[100].draft()).is_err());
        assert_eq!(store.log().write_offset(), log_end);
        // (Entries are visible once their records are written.) Entries of the failed
        // batch left in the queue would show here.
        store.log().wait_readable(log_end).await.unwrap();
        assert_eq!(store.queue_range("t", 0).unwrap(), (0, 100));
        // The retry, once the index can grow, stores each message once.
        std::fs::remove_dir(&blocker).unwrap();
        store
            .append_batch(messages[100..].iter().map(|m| m.draft()), &mut puts)
            .unwrap();
        assert_eq!(puts[0].physical_offset, log_end);
        assert_eq!(puts[0].queue_offset, 100);
        store.acked(puts.last().unwrap().written()).await.unwrap();
        store.close().await.unwrap();
        drop(store);
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        assert_eq!(store.queue_range("t", 0).unwrap(), (0, 110));
        for (n, m) in messages.iter().enumerate() {
            let got = store.read_at("t", 0, n as u64).await.unwrap();
            let view = RecordView::parse(&got).unwrap();
            assert_eq!(view.body(), &m.body[..], "message {n}");
        }
        // Keys of the retried batch find their message once.
        let found = store
            .messages_by_key("t", "key-95", 0, i64::MAX, 10)
            .await
            .unwrap();
        assert_eq!(found.len(), 1);
    });
}

#[test]
fn queue_offsets_are_dense_per_queue_and_reads_are_byte_identical() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        let stored = fill(&store, 11, 2000).await;
        let mut next: HashMap<(String, u32), u64> = HashMap::new();
        for s in &stored {
            let e = next.entry((s.topic.clone(), s.queue_id)).or_default();
            assert_eq!(s.queue_offset, *e, "dense and increasing");
            *e += 1;
        }
        for ((t, q), max) in &next {
            assert_eq!(store.queue_range(t, *q).unwrap(), (0, *max));
        }
        check_contents(&store, &stored).await;
        store.close().await.unwrap();
        let (store, rec) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        assert!(rec.clean_shutdown);
        assert_eq!(
            rec.records_dispatched, 0,
            "a clean checkpoint needs no re-indexing"
        );
        check_contents(&store, &stored).await;
        for ((t, q), max) in &next {
            assert_eq!(store.queue_range(t, *q).unwrap(), (0, *max));
        }
    });
}

#[test]
fn pulls_return_stored_bytes_in_order_and_filter_tags() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        let stored = fill(&store, 12, 1200).await;
        let want: Vec<&Stored> = stored
            .iter()
            .filter(|s| s.topic == "topic0" && s.queue_id == 2)
            .collect();
        // All of the queue, 32 at a time.
        let mut off = 0;
        let mut got = Vec::new();
        loop {
            let r = store
                .read_queue("topic0", 2, off, 32, 1 << 20, &[])
                .await
                .unwrap();
            assert!(r.len() <= 32);
            if r.is_empty() {
                assert_eq!(r.next_offset, r.max_offset);
                break;
            }
            for (rec, qo) in r.records().zip(r.queue_offsets()) {
                assert_eq!(RecordView::parse(rec).unwrap().queue_offset(), *qo);
                got.push(rec.to_vec());
            }
            off = r.next_offset;
        }
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, &w.bytes);
        }
        // Tag filter: only TagA and TagB, and all of them.
        let hashes = [tag_hash("TagA"), tag_hash("TagB")];
        let mut off = 0;
        let mut tagged = Vec::new();
        loop {
            let r = store
                .read_queue("topic0", 2, off, 32, 1 << 20, &hashes)
                .await
                .unwrap();
            if r.next_offset == off {
                break;
            }
            for rec in r.records() {
                tagged.push(RecordView::parse(rec).unwrap().tags().unwrap().to_owned());
            }
            off = r.next_offset;
        }
        let expected: Vec<String> = want
            .iter()
            .map(|w| {
                RecordView::parse(&w.bytes)
                    .unwrap()
                    .tags()
                    .unwrap()
                    .to_owned()
            })
            .filter(|t| t == "TagA" || t == "TagB")
            .collect();
        assert_eq!(tagged, expected);
        // Offsets out of range get typed errors.
        let (_, max) = store.queue_range("topic0", 2).unwrap();
        assert!(matches!(
            store
                .read_queue("topic0", 2, max + 1, 32, 1 << 20, &[])
                .await,
            Err(StoreError::OffsetTooBig { .. })
        ));
        assert!(store
            .read_queue("topic0", 2, max, 32, 1 << 20, &[])
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            store.read_at("topic0", 2, max).await,
            Err(StoreError::OffsetTooBig { .. })
        ));
        assert!(matches!(
            store.read_at("nosuchtopic", 0, 0).await,
            Err(StoreError::OffsetTooBig { .. })
        ));
    });
}

/// A re-index (`reindex` in the store's directory) keeps the end of a queue whose records
/// retention deleted (its entries point below the log's start, and the replay from the
/// log's start writes none of them). Before, the queue was cut back to its first file's
/// start, and the next messages took queue offsets consumers had already passed.
#[test]
fn a_reindex_keeps_the_end_of_a_queue_whose_records_retention_deleted() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config();
        cfg.log.retention_bytes_max = 512 * 1024;
        let (store, _) = MessageStore::open(dir.path(), cfg.clone()).await.unwrap();
        for n in 0..5 {
            let mut m = common::message(23, n, 1, 100);
            m.topic = "early".into();
            store.put(&m.draft()).await.unwrap();
        }
        fill(&store, 24, 1200).await;
        store.apply_retention(ringmq::log::now_ms()).await.unwrap();
        assert_eq!(store.queue_range("early", 0).unwrap(), (5, 5));
        store.close().await.unwrap();
        std::fs::write(dir.path().join("reindex"), b"").unwrap();
        let (store, report) = MessageStore::open(dir.path(), cfg).await.unwrap();
        assert_eq!(report.checkpoint_offset, 0, "re-indexed from the start");
        assert_eq!(store.queue_range("early", 0).unwrap(), (5, 5));
        assert!(!dir.path().join("reindex").exists());
        store.close().await.unwrap();
    });
}

/// An entry past a queue's start damaged to point below the log's start (its record gone
/// with retention, as far as the entry says): a pull answers the records before it, and
/// the pull that starts at it fails with `Corrupt` naming it. Before, it was told
/// `OffsetTooSmall` with the queue's start, behind the consumer: a push consumer went
/// back there and read the same records again, for ever.
#[test]
fn an_entry_pointing_below_the_logs_start_is_damage_not_the_queues_start() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config();
        cfg.log.retention_bytes_max = 512 * 1024;
        let (store, _) = MessageStore::open(dir.path(), cfg).await.unwrap();
        fill(&store, 22, 1200).await;
        store.apply_retention(ringmq::log::now_ms()).await.unwrap();
        // Files made ahead get their numbered names at a checkpoint.
        store.checkpoint().await.unwrap();
        let (min, max) = store.queue_range("topic0", 2).unwrap();
        assert!(min > 0 && max > min + 40, "{min}..{max}");
        // Entry min + 5 points at log offset 0 (its check bits kept: unfiltered reads
        // skip them), written into the mapped file.
        let damaged = min + 5;
        let per_file = small_config().consume_queue.entries_per_file;
        let file = dir
            .path()
            .join("consumequeue/topic0/2")
            .join(format!("{:020}", damaged - damaged % per_file));
        let at = ((damaged % per_file) * 20) as usize;
        let mut bytes = std::fs::read(&file).unwrap();
        let offset = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        bytes[at..at + 8].copy_from_slice(&(offset & !((1u64 << 48) - 1)).to_le_bytes());
        std::fs::write(&file, &bytes).unwrap();
        let before = store
            .read_queue("topic0", 2, min, 32, 1 << 20, &[])
            .await
            .unwrap();
        assert_eq!(before.records().count(), 5);
        assert_eq!(before.next_offset, damaged);
        match store
            .read_queue("topic0", 2, damaged, 32, 1 << 20, &[])
            .await
        {
            Err(StoreError::Log(LogError::Corrupt { reason, .. })) => {
                assert!(reason.contains(&format!("topic0:2:{damaged}")), "{reason}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a damaged entry answered"),
        }
        let after = store.read_queue("topic0", 2, damaged + 1, 32, 1 << 20, &[]);
        assert_eq!(after.await.unwrap().records().count(), 32);
        store.close().await.unwrap();
    });
}

/// Retention moves the log's start first and trims the indexes after (off the shard's
/// thread, in between), and a pull planned before a pass of it may read after it. In both
/// windows a pull below what the log kept is told the queue's new start (`OffsetTooSmall`
/// naming the first kept offset), not a store error, and a pull from there reads the
/// kept records.
#[test]
fn pulls_below_what_retention_kept_are_told_the_queues_new_start() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config();
        cfg.log.retention_bytes_max = 512 * 1024;
        let (store, _) = MessageStore::open(dir.path(), cfg).await.unwrap();
        let stored = fill(&store, 21, 1200).await;
        let queue: Vec<&Stored> = (stored.iter())
            .filter(|s| s.topic == "topic0" && s.queue_id == 2)
            .collect();
        let planned = store
            .plan_queue_read("topic0", 2, 0, 32, 1 << 20, &[])
            .unwrap();
        assert_eq!(planned.len(), 32);

        // The log's part of a retention pass, the indexes not trimmed yet.
        let log_min = store
            .log()
            .apply_retention(ringmq::log::now_ms(), u64::MAX)
            .await;
        assert!(log_min > 0, "retention deleted nothing");
        let physical = |s: &Stored| RecordView::parse(&s.bytes).unwrap().physical_offset();
        let first_kept = queue.iter().find(|s| physical(s) >= log_min).unwrap();
        assert!(first_kept.queue_offset > 0);
        let told_start = |r: Result<_, StoreError>, what: &str| match r {
            Err(StoreError::OffsetTooSmall { min, .. }) => assert_eq!(min, first_kept.queue_offset),
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: records answered below the log's start"),
        };
        assert_eq!(
            store.queue_range("topic0", 2).unwrap().0,
            first_kept.queue_offset
        );
        told_start(
            store
                .read_queue("topic0", 2, 0, 32, 1 << 20, &[])
                .await
                .map(|_| ()),
            "a pull from the old start",
        );
        told_start(
            store.fetch(planned).await.map(|_| ()),
            "a pull planned before",
        );

        let last_gone = first_kept.queue_offset - 1;
        let r = store.read_queue("topic0", 2, first_kept.queue_offset, 1000, 1 << 20, &[]);
        let kept = r.await.unwrap();
        let want: Vec<&[u8]> = (queue.iter())
            .filter(|s| s.queue_offset >= first_kept.queue_offset)
            .map(|s| &s.bytes[..])
            .collect();
        assert_eq!(kept.records().collect::<Vec<_>>(), want);
        store.apply_retention(ringmq::log::now_ms()).await.unwrap();
        assert_eq!(
            store.queue_range("topic0", 2).unwrap().0,
            first_kept.queue_offset
        );
        told_start(
            store
                .read_queue("topic0", 2, last_gone, 32, 1 << 20, &[])
                .await
                .map(|_| ()),
            "a pull below the trimmed start",
        );
        store.close().await.unwrap();
    });
}

#[test]
fn timestamp_search_returns_first_offset_at_or_after_the_time() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        let stored = fill(&store, 13, 1500).await;
        let queue: Vec<&Stored> = stored
            .iter()
            .filter(|s| s.topic == "topic1" && s.queue_id == 1)
            .collect();
        let mut probes: Vec<i64> = queue.iter().map(|s| s.store_ts).collect();
        probes.push(queue[0].store_ts - 1000);
        probes.push(queue.last().unwrap().store_ts + 1000);
        for ts in probes {
            let expected = queue
                .iter()
                .position(|s| s.store_ts >= ts)
                .map(|i| queue[i].queue_offset)
                .unwrap_or(queue.len() as u64);
            let got = store.offset_by_timestamp("topic1", 1, ts).await.unwrap();
            assert_eq!(got, expected, "timestamp {ts}");
        }
    });
}

#[test]
fn key_queries_return_exactly_the_matching_messages() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        let stored = fill(&store, 14, 600).await;
        let check = |stored: &[Stored], topic: &str, key: &str| -> HashSet<u64> {
            stored
                .iter()
                .filter(|s| s.topic == topic)
                .filter(|s| {
                    RecordView::parse(&s.bytes)
                        .unwrap()
                        .keys()
                        .any(|k| k == key)
                })
                .map(|s| s.n)
                .collect()
        };
        for (topic, key) in [
            ("topic0", "order-4"),
            ("topic1", "order-3"),
            ("topic0", "key-10"),
            ("topic1", "key-10"),
            ("topic0", "absent"),
        ] {
            let found = store
                .messages_by_key(topic, key, 0, i64::MAX, 1000)
                .await
                .unwrap();
            let got: HashSet<u64> = found
                .iter()
                .map(|b| {
                    let v = RecordView::parse(b).unwrap();
                    stored
                        .iter()
                        .find(|s| s.bytes == b[..])
                        .map(|s| s.n)
                        .unwrap_or_else(|| panic!("unknown record {v:?}"))
                })
                .collect();
            assert_eq!(got, check(&stored, topic, key), "{topic} {key}");
            assert_eq!(got.len(), found.len(), "no duplicates");
        }
        // Time range and max.
        let all = store
            .messages_by_key("topic0", "order-4", 0, i64::MAX, 1000)
            .await
            .unwrap();
        assert!(all.len() > 5);
        let two = store
            .messages_by_key("topic0", "order-4", 0, i64::MAX, 2)
            .await
            .unwrap();
        assert_eq!(two.len(), 2);
        let none = store
            .messages_by_key("topic0", "order-4", 0, 1, 100)
            .await
            .unwrap();
        assert!(none.is_empty());
        // After an unclean stop (no close) the index is rebuilt from the log.
        drop(store);
        let (store, rec) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        assert!(!rec.clean_shutdown);
        let again = store
            .messages_by_key("topic0", "order-4", 0, i64::MAX, 1000)
            .await
            .unwrap();
        assert_eq!(again.len(), all.len());
    });
}

#[test]
fn invalid_topics_are_refused() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        let mut m = common::message(1, 1, 1, 10);
        for bad in ["", "../etc", "a/b", "with space"] {
            m.topic = bad.to_owned();
            assert!(
                matches!(
                    store.append(&m.draft()),
                    Err(StoreError::InvalidTopic(_)) | Err(StoreError::Log(_))
                ),
                "{bad:?}"
            );
        }
    });
}

/// A start is named by an incarnation later than `incarnation_after` (the broker passes the
/// last topic creation stamp it gave), even when the clock is earlier, and later than
/// every earlier start's.
#[test]
fn a_start_is_named_after_the_incarnation_it_is_told_to_follow() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let first = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap()
            .0;
        let first_run = first.incarnation();
        first.close().await.unwrap();
        let ahead = first_run + 3_600_000_000_000;
        let mut cfg = small_config();
        cfg.incarnation_after = ahead;
        let second = MessageStore::open(dir.path(), cfg).await.unwrap().0;
        let second_run = second.incarnation();
        assert!(second_run > ahead, "{second_run} after {ahead}");
        second.close().await.unwrap();
        let third = open_small(dir.path()).await;
        assert!(third.incarnation() > second_run);
    });
}

/// Pulls near the tail share the buffers the log wrote (no copy); pulls of older records
/// read the file; both give the stored bytes, and the runs a vectored answer sends are the
/// records in order.
#[test]
fn the_newest_records_are_read_from_the_writes_own_buffers() {
    for (tail_cache_bytes, shared) in [(64usize << 20, true), (0, false)] {
        run_local(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = small_config();
            cfg.log.tail_cache_bytes = tail_cache_bytes;
            let (store, _) = MessageStore::open(dir.path(), cfg).await.unwrap();
            let stored = fill(&store, 5, 600).await;
            let mut queues: HashMap<(String, u32), Vec<&Stored>> = HashMap::new();
            for s in &stored {
                queues
                    .entry((s.topic.clone(), s.queue_id))
                    .or_default()
                    .push(s);
            }
            for ((topic, queue), want) in &queues {
                let r = store
                    .read_queue(topic, *queue, 0, 32, 16 << 20, &[])
                    .await
                    .unwrap();
                assert_eq!(r.len(), want.len().min(32));
                let wanted: Vec<u8> = want[..r.len()]
                    .iter()
                    .flat_map(|s| s.bytes.iter().copied())
                    .collect();
                let records: Vec<u8> = r.records().flatten().copied().collect();
                let runs: Vec<u8> = r.runs().flatten().copied().collect();
                assert!(records == wanted, "{topic}:{queue}: the stored bytes");
                assert!(runs == wanted, "{topic}:{queue}: the runs are the records");
                let expect_shared = if shared { r.bytes_len() } else { 0 };
                assert_eq!(r.shared_bytes(), expect_shared, "{topic}:{queue}");
            }
        });
    }
}

/// A read of a few records from a large cached write holds that whole buffer: the read
/// says how much beyond its records it holds, and can copy its records out instead.
#[test]
fn a_small_read_of_a_large_cached_write_can_let_it_go() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        // A first round of 60 sizes the write buffer for the next; the next 60 appended
        // together: one write, one buffer in the cache. (Even numbers are topic0's: its
        // first of the 60 is its offset 30.)
        let mut last = None;
        for n in 0..60 {
            last = Some(
                store
                    .append(&common::message(3, n, 1, 2000).draft())
                    .unwrap(),
            );
        }
        store.acked(last.unwrap().written()).await.unwrap();
        let mut first = None;
        for n in 60..120 {
            let m = common::message(3, n, 1, 2000);
            let r = store.append(&m.draft()).unwrap();
            let bytes = m.draft().encode(Placement {
                queue_offset: r.queue_offset,
                physical_offset: r.physical_offset,
                store_timestamp_ms: r.store_timestamp_ms,
            });
            first.get_or_insert((m.topic.clone(), m.queue_id, bytes));
            last = Some(r);
        }
        store.acked(last.unwrap().written()).await.unwrap();
        let (topic, queue, bytes) = first.unwrap();
        let mut r = store
            .read_queue(&topic, queue, 30, 1, 1 << 20, &[])
            .await
            .unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r.shared_bytes(), bytes.len(), "read from the cached write");
        assert!(
            r.pinned_beyond() > 20 * bytes.len(),
            "holds the whole write: {} bytes beyond {}",
            r.pinned_beyond(),
            bytes.len()
        );
        r.compact();
        assert_eq!((r.shared_bytes(), r.pinned_beyond()), (0, 0));
        let got: Vec<u8> = r.runs().flatten().copied().collect();
        assert!(got == bytes, "the same bytes, copied");
    });
}

/// Queues opened ahead (`open_queues`: what the broker does when a topic is created or
/// grown, and at a start) have their first index file before any append, and appends to
/// them open nothing on the shard's thread; an append while they are being opened is
/// refused with `QueueOpening` and stores nothing; a queue nobody opened ahead is opened by
/// its first append, and counted.
#[test]
fn queues_opened_ahead_take_appends_without_opening_anything() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = open_small(dir.path()).await;
        let mut m = one_message(7, "ahead", 1);
        let opening = store.open_queues("ahead", [0, 1]);
        let mut opening = std::pin::pin!(opening);
        // The first poll hands the opening to the blocking pool and waits for it.
        assert!(futures_lite::future::poll_once(&mut opening)
            .await
            .is_none());
        assert!(
            matches!(
                store.append(&m.draft()),
                Err(StoreError::QueueOpening { ref topic, queue_id: 1 }) if topic == "ahead"
            ),
            "an append to a queue being opened is refused"
        );
        assert_eq!(opening.await.unwrap(), 2);
        for q in [0, 1] {
            let first = dir
                .path()
                .join(format!("consumequeue/ahead/{q}/00000000000000000000"));
            assert!(first.exists(), "{} made ahead", first.display());
        }
        assert_eq!(store.open_queues("ahead", [0, 1]).await.unwrap(), 0);
        for q in [0, 1] {
            m.queue_id = q;
            assert_eq!(store.put(&m.draft()).await.unwrap().queue_offset, 0);
        }
        assert_eq!(
            store.queue_range("ahead", 1).unwrap(),
            (0, 1),
            "the refused append stored nothing"
        );
        assert_eq!(store.inline_queue_opens(), 0);
        m.queue_id = 2;
        store.put(&m.draft()).await.unwrap();
        assert_eq!(
            store.inline_queue_opens(),
            1,
            "queue 2 was not opened ahead"
        );
        assert!(matches!(
            store.open_queues("../up", [0]).await,
            Err(StoreError::InvalidTopic(_))
        ));
    });
}

/// The names in `dir`.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// A queue and the key index roll into files made ahead in the blocking pool: with the
/// spares in place before each roll (the key index's first file too),
/// none creates its file on the shard's thread; checkpoints name and sync the files taken
/// (and their directory), and everything reads back after the store is dropped without a close.
#[test]
fn rolls_take_the_spare_files_made_ahead() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = open_small(dir.path()).await;
        let m = one_message(9, "rolling", 0);
        for i in 0..1_000u64 {
            common::spares_made(&store).await;
            assert_eq!(store.put(&m.draft()).await.unwrap().queue_offset, i);
            if i % 250 == 0 {
                store.checkpoint().await.unwrap();
            }
        }
        assert_eq!(store.index_rolls_inline(), 0);
        // The last files' spares (two keys a message: the key index rolls every 100).
        common::spares_made(&store).await;
        store.checkpoint().await.unwrap();
        let dir_of_queue = dir.path().join("consumequeue/rolling/0");
        let names = names_in(&dir_of_queue);
        assert_eq!(names.len(), 11, "ten files and a spare: {names:?}");
        let names = names_in(&dir.path().join("index"));
        let old_spares: Vec<&String> = names.iter().filter(|n| n.starts_with("spare-")).collect();
        assert_eq!(
            (names.len(), old_spares.len()),
            (11, 1),
            "ten files and a spare: {names:?}"
        );
        let old_spare = dir.path().join("index").join(old_spares[0]);
        let found = store.messages_by_key("rolling", "order-1", 0, i64::MAX, 5);
        assert_eq!(found.await.unwrap().len(), 5);
        drop(store);
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        assert_eq!(store.queue_range("rolling", 0).unwrap(), (0, 1_000));
        let names = std::fs::read_dir(&dir_of_queue).unwrap().count();
        assert_eq!(names, 10, "the spare is removed at the opening");
        // Removed at the opening (the reopened index may be making a new one).
        assert!(!old_spare.exists(), "{old_spare:?} left");
        let pulled = store
            .read_queue("rolling", 0, 950, 100, 1 << 20, &[])
            .await
            .unwrap();
        assert_eq!((pulled.len(), pulled.next_offset), (50, 1_000));
    });
}

/// A clean close removes the spare files held (a queue's and the key index's), so a stopped
/// broker's directories hold only its numbered files.
#[test]
fn a_close_removes_the_spare_files_held() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = open_small(dir.path()).await;
        let m = one_message(7, "closing", 0);
        for _ in 0..10 {
            store.put(&m.draft()).await.unwrap();
        }
        common::spares_made(&store).await;
        let spares = |sub: &str| {
            let names = names_in(&dir.path().join(sub));
            names.iter().filter(|n| n.starts_with("spare-")).count()
        };
        // Small files: both indexes are near their file's end and hold a spare.
        assert_eq!((spares("consumequeue/closing/0"), spares("index")), (1, 1));
        store.close().await.unwrap();
        assert_eq!((spares("consumequeue/closing/0"), spares("index")), (0, 0));
        drop(store);
        let (store, _) = MessageStore::open(dir.path(), small_config())
            .await
            .unwrap();
        assert_eq!(store.queue_range("closing", 0).unwrap(), (0, 10));
    });
}

/// An opening given up half way (its future dropped, as at a shutdown) leaves no queue
/// marked as opening: appends to it go through instead of being refused for ever.
#[test]
fn an_opening_dropped_half_way_refuses_nothing_after() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = open_small(dir.path()).await;
        let m = one_message(8, "dropped", 0);
        {
            let opening = store.open_queues("dropped", [0]);
            let mut opening = std::pin::pin!(opening);
            assert!(futures_lite::future::poll_once(&mut opening)
                .await
                .is_none());
            assert!(matches!(
                store.append(&m.draft()),
                Err(StoreError::QueueOpening { .. })
            ));
        }
        assert_eq!(store.put(&m.draft()).await.unwrap().queue_offset, 0);
    });
}

/// Rolls take their files from spares without naming them; a crash before the next
/// checkpoint loses those files, and the opening indexes their records again from the log
/// (the checkpoint is behind them): every message reads back and is found by its key.
/// A spare removed from outside before it was named fails the checkpoint, which stays
/// behind it, and the next opening indexes its records again too.
#[test]
fn files_rolled_into_since_the_last_checkpoint_are_rebuilt_after_a_crash() {
    // Checkpoints only when the test asks.
    let mut cfg = small_config();
    cfg.checkpoint_interval_ms = 3_600_000;
    let open = move |dir: std::path::PathBuf| {
        let cfg = cfg.clone();
        async move { MessageStore::open(&dir, cfg).await.unwrap().0 }
    };
    run_local(move || async move {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path().to_owned()).await;
        let m = one_message(11, "unnamed", 0);
        for i in 0..150u64 {
            common::spares_made(&store).await;
            assert_eq!(store.put(&m.draft()).await.unwrap().queue_offset, i);
        }
        store.checkpoint().await.unwrap();
        for i in 150..450u64 {
            common::spares_made(&store).await;
            assert_eq!(store.put(&m.draft()).await.unwrap().queue_offset, i);
        }
        assert_eq!(store.index_rolls_inline(), 0);
        let dir_of_queue = dir.path().join("consumequeue/unnamed/0");
        let numbered = |d: &std::path::Path| {
            names_in(d)
                .iter()
                .filter(|n| !n.starts_with("spare-"))
                .count()
        };
        assert_eq!(numbered(&dir_of_queue), 2, "files 0 and 100 named");
        // A crash: the store dropped without a checkpoint or a close.
        drop(store);
        let store = open(dir.path().to_owned()).await;
        assert_eq!(store.queue_range("unnamed", 0).unwrap(), (0, 450));
        let pulled = store
            .read_queue("unnamed", 0, 400, 100, 1 << 20, &[])
            .await
            .unwrap();
        assert_eq!((pulled.len(), pulled.next_offset), (50, 450));
        let found = store.messages_by_key("unnamed", "order-1", 0, i64::MAX, 1_000);
        assert_eq!(found.await.unwrap().len(), 450);

        // A spare taken by a roll, then removed from outside before a checkpoint names it.
        common::spares_made(&store).await;
        let spare_of_queue = || {
            let names = names_in(&dir_of_queue);
            let spare = names.into_iter().find(|n| n.starts_with("spare-"));
            spare.map(|n| dir_of_queue.join(n))
        };
        assert_eq!(store.put(&m.draft()).await.unwrap().queue_offset, 450);
        common::spares_made(&store).await;
        let held = spare_of_queue().expect("a spare held for the roll at 500");
        for i in 451..520u64 {
            assert_eq!(store.put(&m.draft()).await.unwrap().queue_offset, i);
        }
        std::fs::remove_file(&held).unwrap();
        let failed = store.checkpoint().await.unwrap_err().to_string();
        assert!(failed.contains("vanished"), "{failed}");
        drop(store);
        let store = open(dir.path().to_owned()).await;
        assert_eq!(store.queue_range("unnamed", 0).unwrap(), (0, 520));
        let pulled = store
            .read_queue("unnamed", 0, 490, 100, 1 << 20, &[])
            .await
            .unwrap();
        assert_eq!((pulled.len(), pulled.next_offset), (30, 520));
    });
}
