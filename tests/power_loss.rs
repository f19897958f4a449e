//! A power loss after a checkpoint, simulated on the store's index files: every 512-byte
//! block written since the checkpoint may have reached the disk or not, and a file made
//! since may be missing. The log is left whole (what it lost is the commit log's own
//! recovery, tested in `commit_log.rs`). The next start is unclean: it must find every
//! message the log holds, by queue and by key, and nothing else.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringmq::io::run_local;
use ringmq::protocol::record::RecordView;
use ringmq::store::{Checkpoint, MessageStore, StoreConfig, StoreError};

fn small_config() -> StoreConfig {
    let mut cfg = StoreConfig::default();
    cfg.log.segment_bytes = 256 * 1024;
    cfg.consume_queue.entries_per_file = 100;
    cfg.key_index.slots_per_file = 64;
    cfg.key_index.entries_per_file = 300;
    // Checkpoints only when the test asks.
    cfg.checkpoint_interval_ms = 3_600_000;
    cfg
}

/// Every file under `dir` (the index directories), by path, with its bytes.
fn files_under(dir: &Path, out: &mut HashMap<PathBuf, Vec<u8>>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            let bytes = std::fs::read(&path).unwrap();
            out.insert(path, bytes);
        }
    }
}

fn index_files(data: &Path) -> HashMap<PathBuf, Vec<u8>> {
    let mut out = HashMap::new();
    for sub in ["index", "consumequeue"] {
        if data.join(sub).exists() {
            files_under(&data.join(sub), &mut out);
        }
    }
    out
}

/// What a power loss leaves of the files written since `at_checkpoint`: each block of
/// each file the old or the new one (zeros for a file made since), a file made since
/// perhaps not at all.
fn lose_power(data: &Path, at_checkpoint: &HashMap<PathBuf, Vec<u8>>, rng: &mut StdRng) {
    const BLOCK: usize = 512;
    for (path, new) in index_files(data) {
        let old = at_checkpoint.get(&path);
        if old.is_none() && rng.gen_bool(0.3) {
            std::fs::remove_file(&path).unwrap();
            continue;
        }
        let mut landed = new;
        for (n, block) in landed.chunks_mut(BLOCK).enumerate() {
            if rng.gen_bool(0.5) {
                let from = n * BLOCK;
                match old.filter(|old| old.len() >= from + block.len()) {
                    Some(old) => block.copy_from_slice(&old[from..from + block.len()]),
                    None => block.fill(0),
                }
            }
        }
        std::fs::write(&path, landed).unwrap();
    }
}

/// The number in a message's `key-<n>` key.
fn key_of(bytes: &[u8]) -> u64 {
    let view = RecordView::parse(bytes).unwrap();
    let key = view
        .keys()
        .find_map(|k| k.strip_prefix("key-")?.parse().ok());
    key.unwrap()
}

/// Each queue holds exactly its messages (by number, in queue order).
async fn check_queues(store: &MessageStore, queues: &HashMap<(String, u32), Vec<u64>>, seed: u64) {
    for ((topic, queue_id), numbers) in queues {
        let range = store.queue_range(topic, *queue_id).unwrap();
        assert_eq!(
            range,
            (0, numbers.len() as u64),
            "seed {seed}: {topic}:{queue_id}"
        );
        for (offset, n) in numbers.iter().enumerate() {
            let bytes = store
                .read_at(topic, *queue_id, offset as u64)
                .await
                .unwrap();
            assert_eq!(
                key_of(&bytes),
                *n,
                "seed {seed}: {topic}:{queue_id}@{offset}"
            );
        }
    }
}

/// Messages with keys `key-<n>` (one each) and `order-<n % 10>`, into four queues of two
/// topics, across rolls of both indexes' files, a checkpoint among them; then a power
/// loss, and the unclean start finds each by queue and by key, once.
#[test]
fn after_a_power_loss_every_message_is_found_by_queue_and_by_key() {
    for seed in 0..6u64 {
        run_local(move || async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let dir = tempfile::tempdir().unwrap();
            let data = dir.path();
            let (store, _) = MessageStore::open(data, small_config()).await.unwrap();
            let (before, after) = (rng.gen_range(100..700u64), rng.gen_range(1..700u64));
            // (topic, queue) -> the messages' numbers in queue order.
            let mut queues: HashMap<(String, u32), Vec<u64>> = HashMap::new();
            let mut at_checkpoint = HashMap::new();
            for n in 0..before + after {
                if n == before {
                    store.checkpoint().await.unwrap();
                    at_checkpoint = index_files(data);
                }
                let m = common::message(seed, n, 4, 300);
                let r = store.put(&m.draft()).await.unwrap();
                let queue = queues.entry((m.topic.clone(), m.queue_id)).or_default();
                assert_eq!(r.queue_offset, queue.len() as u64);
                queue.push(n);
            }
            // Spares made in the blocking pool are in place before the files are read.
            common::spares_made(&store).await;
            drop(store);
            lose_power(data, &at_checkpoint, &mut rng);

            let (store, recovery) = MessageStore::open(data, small_config()).await.unwrap();
            assert!(!recovery.clean_shutdown);
            check_queues(&store, &queues, seed).await;
            for n in 0..before + after {
                let topic = format!("topic{}", n % 2);
                let key = format!("key-{n}");
                let found = store.messages_by_key(&topic, &key, 0, i64::MAX, 10);
                let found: Vec<u64> = found.await.unwrap().iter().map(|b| key_of(b)).collect();
                assert_eq!(
                    found,
                    [n],
                    "seed {seed}: key-{n} ({before} before the checkpoint)"
                );
            }
            for k in 0..10u64 {
                let topic = format!("topic{}", k % 2);
                let key = format!("order-{k}");
                let found = store.messages_by_key(&topic, &key, 0, i64::MAX, 1000);
                let mut found: Vec<u64> = found.await.unwrap().iter().map(|b| key_of(b)).collect();
                found.sort_unstable();
                let expected: Vec<u64> = (0..before + after).filter(|n| n % 10 == k).collect();
                assert_eq!(found, expected, "seed {seed}: order-{k}");
            }
        });
    }
}

/// An index sync that failed holds the checkpoint for the rest of the run, even once syncs
/// work again (Linux marks the pages of a failed writeback clean, so a second fdatasync
/// succeeds without them ever reaching the disk); the clean close fails too, and a power
/// loss that takes every index write since the checkpoint still finds each message by
/// queue after the restart, which indexes them again from the log. Before, the next
/// checkpoint moved past the lost entries.
#[test]
fn an_index_sync_that_failed_holds_the_checkpoint_until_a_restart() {
    run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        let (store, _) = MessageStore::open(data, small_config()).await.unwrap();
        let mut queues: HashMap<(String, u32), Vec<u64>> = HashMap::new();
        let mut put = async |numbers: std::ops::Range<u64>| {
            for n in numbers {
                let m = common::message(7, n, 4, 300);
                let r = store.put(&m.draft()).await.unwrap();
                let queue = queues.entry((m.topic.clone(), m.queue_id)).or_default();
                assert_eq!(r.queue_offset, queue.len() as u64);
                queue.push(n);
            }
        };
        put(0..300).await;
        store.log().sync_all().await.unwrap();
        store.checkpoint().await.unwrap();
        let at_checkpoint = index_files(data);
        let held = Checkpoint::read(data).unwrap().log_offset;
        assert!(held > 0);
        put(300..600).await;
        store.log().sync_all().await.unwrap();
        let queues_dir = data.join("consumequeue");
        ringmq::index::testing_fail_syncs_under(&queues_dir, true);
        let failed = store.checkpoint().await.unwrap_err().to_string();
        ringmq::index::testing_fail_syncs_under(&queues_dir, false);
        assert!(failed.contains("injected"), "{failed}");
        put(600..610).await;
        store.log().sync_all().await.unwrap();
        match store.checkpoint().await {
            Err(StoreError::CheckpointHeld { checkpoint, reason }) => {
                assert_eq!(checkpoint, held);
                assert!(reason.contains("injected"), "{reason}");
            }
            other => panic!("a checkpoint past a failed index sync: {other:?}"),
        }
        assert_eq!(Checkpoint::read(data).unwrap().log_offset, held);
        assert!(store.close().await.is_err(), "closed cleanly");
        drop(store);
        // The worst the lost writebacks can leave: every index block as at the
        // checkpoint, every file made since gone.
        for (path, _) in index_files(data) {
            match at_checkpoint.get(&path) {
                Some(old) => std::fs::write(&path, old).unwrap(),
                None => std::fs::remove_file(&path).unwrap(),
            }
        }
        let (store, recovery) = MessageStore::open(data, small_config()).await.unwrap();
        assert!(!recovery.clean_shutdown);
        check_queues(&store, &queues, 7).await;
    });
}
