//! Stores built for the storage tests: a small configuration (segments, consume-queue
//! and key-index files of a few KiB), a store filled with known records, copies of it to
//! damage.

use std::path::{Path, PathBuf};

use ringmq::io::run_local;
use ringmq::protocol::record::Placement;
use ringmq::store::{MessageStore, StoreConfig};

/// Small files: many segments and index files from a few thousand records.
pub fn tiny_config() -> StoreConfig {
    let mut cfg = StoreConfig::default();
    cfg.log.segment_bytes = 64 * 1024;
    cfg.log.flush = ringmq::log::FlushMode::Sync;
    cfg.consume_queue.entries_per_file = 64;
    cfg.key_index.slots_per_file = 64;
    cfg.key_index.entries_per_file = 256;
    cfg
}

/// What a store built by [`build_store`] holds.
pub struct Built {
    pub dir: tempfile::TempDir,
    /// (topic, queue, queue offset, physical offset, expected bytes)
    pub records: Vec<(String, u32, u64, u64, Vec<u8>)>,
}

pub fn build_store(count: u64, cfg: StoreConfig) -> Built {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let records = run_local(move || async move {
        let (store, _) = MessageStore::open(&path, cfg).await.unwrap();
        let mut out = Vec::new();
        for n in 0..count {
            let m = super::message(7, n, 3, 1500);
            let r = store.put(&m.draft()).await.unwrap();
            let bytes = m.draft().encode(Placement {
                queue_offset: r.queue_offset,
                physical_offset: r.physical_offset,
                store_timestamp_ms: r.store_timestamp_ms,
            });
            out.push((
                m.topic.clone(),
                m.queue_id,
                r.queue_offset,
                r.physical_offset,
                bytes,
            ));
        }
        store.close().await.unwrap();
        out
    });
    Built { dir, records }
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

pub fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("commitlog"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

pub fn segment_of(work: &Path, phys: u64) -> (PathBuf, usize) {
    let seg = tiny_config().log.segment_bytes;
    let base = phys - phys % seg;
    (
        work.join("commitlog").join(format!("{base:020}")),
        (phys - base) as usize,
    )
}
