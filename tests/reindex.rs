//! Re-indexing a store from its log (an empty `reindex` file in its directory): damaged
//! entries written again, index files that refuse to open rebuilt, the key index rebuilt
//! whole, and the checkpoint's durable point kept.

mod common;

use ringmq::io::run_local;
use ringmq::log::LogError;
use ringmq::store::{MessageStore, StoreError};

use common::built::{build_store, copy_dir, segment_of, tiny_config};

/// A `reindex` file in the store's directory indexes the log again from its start: a
/// damaged consume-queue entry is written again from its record, the request is removed
/// once the indexes are synced, and the checkpoint's durable point still tells rot from a
/// torn tail, even after a crash (where removing the checkpoint, the other way to
/// re-index, counts none of the log as durable and would cut the log at the rot).
#[test]
fn a_reindex_request_rebuilds_the_index_and_keeps_the_durable_point() {
    let cfg = tiny_config();
    let built = build_store(1500, cfg.clone());
    let (topic, queue_id, qo, _, bytes) = built.records[40].clone();
    let work = tempfile::tempdir().unwrap();
    copy_dir(built.dir.path(), work.path());
    let per_file = cfg.consume_queue.entries_per_file;
    let index = work
        .path()
        .join("consumequeue")
        .join(&topic)
        .join(queue_id.to_string())
        .join(format!("{:020}", qo - qo % per_file));
    let mut entries = std::fs::read(&index).unwrap();
    let at = ((qo % per_file) * 20) as usize;
    entries[at..at + 20].fill(0);
    std::fs::write(&index, &entries).unwrap();
    std::fs::write(work.path().join("reindex"), b"").unwrap();
    let path = work.path().to_owned();
    let (t, c) = (topic.clone(), cfg.clone());
    let got = run_local(move || async move {
        let (store, _) = MessageStore::open(&path, c).await.unwrap();
        let got = store.read_at(&t, queue_id, qo).await.unwrap().to_vec();
        store.close().await.unwrap();
        got
    });
    assert_eq!(got, bytes, "the damaged entry is indexed again");
    assert!(!work.path().join("reindex").exists(), "the request stays");

    // After a crash (the abort marker left), with rot in an early record.
    let work = tempfile::tempdir().unwrap();
    copy_dir(built.dir.path(), work.path());
    let phys = built.records[3].3;
    let (file, at) = segment_of(work.path(), phys);
    let mut log = std::fs::read(&file).unwrap();
    log[at + 200] ^= 0x5a;
    std::fs::write(&file, &log).unwrap();
    std::fs::write(work.path().join("abort"), b"ringmq store open\n").unwrap();
    std::fs::write(work.path().join("reindex"), b"").unwrap();
    let path = work.path().to_owned();
    match run_local(move || async move { MessageStore::open(&path, cfg).await.err() }) {
        Some(StoreError::Log(LogError::Corrupt {
            path, file_offset, ..
        })) => {
            assert_eq!((path, file_offset), (file, at as u64));
        }
        other => panic!("rot before the durable point must refuse the start, got {other:?}"),
    }
    assert!(
        work.path().join("reindex").exists(),
        "kept for the next start"
    );
}

/// Index files damaged so that they do not open (a consume-queue file of the wrong length,
/// a key-index file shorter than its header) refuse the start, saying how to rebuild; a
/// `reindex` request then rebuilds them from the log: every record of the queue is read
/// at its offset again, and found by its key. Before, the request was never read (the
/// start failed opening the files first), and the key index was not rebuilt.
#[test]
fn a_reindex_request_rebuilds_index_files_that_do_not_open() {
    let cfg = tiny_config();
    let built = build_store(600, cfg.clone());
    let work = tempfile::tempdir().unwrap();
    copy_dir(built.dir.path(), work.path());
    let (topic, queue_id, ..) = built.records[7].clone();
    let queue_dir = work
        .path()
        .join("consumequeue")
        .join(&topic)
        .join(queue_id.to_string());
    let cq_file = queue_dir.join(format!("{:020}", 0));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cq_file)
        .unwrap()
        .set_len(100)
        .unwrap();
    let mut key_files: Vec<_> = std::fs::read_dir(work.path().join("index"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    key_files.sort();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&key_files[0])
        .unwrap()
        .set_len(10)
        .unwrap();
    // Opened and closed again: an error's text, or none.
    let open_close = || {
        let (path, c) = (work.path().to_owned(), cfg.clone());
        run_local(move || async move {
            match MessageStore::open(&path, c).await {
                Ok((store, _)) => store.close().await.err().map(|e| e.to_string()),
                Err(e) => Some(e.to_string()),
            }
        })
    };
    let refused = open_close().expect("damaged index files opened");
    assert!(refused.contains("named `reindex`"), "{refused}");
    std::fs::write(work.path().join("reindex"), b"").unwrap();
    let ours: Vec<_> = built
        .records
        .iter()
        .filter(|(t, q, ..)| *t == topic && *q == queue_id)
        .cloned()
        .collect();
    assert!(ours.len() > 64, "the queue's first file held entries");
    let (t, records) = (topic.clone(), built.records.clone());
    let (path, c) = (work.path().to_owned(), cfg.clone());
    run_local(move || async move {
        let (store, _) = MessageStore::open(&path, c).await.unwrap();
        for (_, _, qo, _, bytes) in &ours {
            let got = store.read_at(&t, queue_id, *qo).await.unwrap();
            assert_eq!(&got[..], &bytes[..], "queue offset {qo}");
        }
        // Every record by its key (`key-N`, unique), the rebuilt key index's.
        for (n, (topic, _, _, _, bytes)) in records.iter().enumerate().step_by(37) {
            let found = store
                .messages_by_key(topic, &format!("key-{n}"), 0, i64::MAX, 10)
                .await
                .unwrap();
            assert_eq!(found.len(), 1, "key-{n}");
            assert_eq!(&found[0][..], &bytes[..], "key-{n}");
        }
        store.close().await.unwrap();
    });
    assert!(!work.path().join("reindex").exists(), "the request stays");
    // Started again without a request: the rebuilt files open.
    assert_eq!(open_close(), None);
}
