//! Unit tests of the schedule's recovery, parking and snapshots.

use super::*;

/// A record for the schedule's queue.
fn held_draft(properties: Vec<u8>, body: Vec<u8>) -> OwnedDraft {
    OwnedDraft {
        topic: SCHEDULE_TOPIC.to_owned(),
        queue_id: 0,
        flag: 0,
        born_timestamp_ms: 0,
        born_host: "127.0.0.1:1".parse().unwrap(),
        reconsume_times: 0,
        properties,
        body,
    }
}

/// A parked message comes due and goes back to the wheel without its record being
/// read while its target is missing and it may wait longer; it is read (kept in `due`)
/// once the target exists or it has waited its most. Its topic's name is held once.
#[test]
fn a_parked_message_waits_without_a_read_until_its_target_exists_or_its_time_is_up() {
    let mut s = Schedule::new(0);
    for off in [1, 2, 3] {
        s.wheel.insert(10, off);
    }
    let mut due = Vec::new();
    s.wheel.poll(10, 10, &mut due);
    for &(d, off) in &due {
        s.in_flight.insert(off, d);
    }
    // 1 and 2 wait for "gone" (2 since long ago), 3 for nothing.
    assert_eq!(s.park(1, "gone", 0, 1_000), 1_000);
    assert_eq!(s.park(2, "gone", 0, 0), 0);
    assert_eq!(
        s.park(1, "gone", 0, 2_000),
        1_000,
        "parked when first found"
    );
    assert_eq!(s.parked_topics.len(), 1);
    let missing = |_: &str, _: u32| false;
    assert_eq!(s.repark(&mut due, 3_000, 2_500, missing), 1);
    assert_eq!(due, [(10, 2), (10, 3)], "2 has waited its most: read");
    assert!(!s.in_flight.contains_key(&1));
    let mut later = Vec::new();
    s.wheel.poll(3_000 + PARK_MS, 10, &mut later);
    assert_eq!(later, [(3_000 + PARK_MS, 1)]);
    // Its topic exists now: read.
    let mut due = later;
    let exists = |t: &str, q: u32| t == "gone" && q == 0;
    assert_eq!(s.repark(&mut due, 3_500, 10_000, exists), 0);
    assert_eq!(due, [(3_000 + PARK_MS, 1)]);
    // The name goes with the last message parked for it.
    s.unpark(1);
    assert_eq!(s.parked_topics.len(), 1);
    s.unpark(2);
    assert!(s.parked_topics.is_empty() && s.parked.is_empty());
}

/// The held messages the retention pass moves forward are found by one search of the
/// schedule queue's index: the offsets whose records begin before where retention
/// wants the log to start.
#[test]
fn the_offsets_before_a_log_offset_are_found_by_a_search() {
    crate::io::run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::store::StoreConfig::default();
        let (store, _) = MessageStore::open(dir.path(), cfg).await.unwrap();
        let draft = held_draft(Vec::new(), b"held".to_vec());
        let mut at = Vec::new();
        for _ in 0..10 {
            at.push(store.put(&draft.draft()).await.unwrap().physical_offset);
        }
        let before = |physical| store.queue_offsets_before(SCHEDULE_TOPIC, 0, physical);
        assert_eq!(before(at[0]).unwrap(), 0..0);
        assert_eq!(before(at[4]).unwrap(), 0..4);
        assert_eq!(before(at[4] + 1).unwrap(), 0..5);
        assert_eq!(before(at[9] + 1).unwrap(), 0..10);
        assert_eq!(before(u64::MAX).unwrap(), 0..10);
        let unknown = store.queue_offsets_before(SCHEDULE_DONE_TOPIC, 0, u64::MAX);
        assert_eq!(unknown.unwrap(), 0..0);
    });
}

/// A store in `dir` whose schedule queue holds 10 messages due at 5000 (offsets 0..10).
async fn ten_held(dir: &Path) -> MessageStore {
    let cfg = crate::store::StoreConfig::default();
    let (store, _) = MessageStore::open(dir, cfg).await.unwrap();
    let mut props = PropertiesBuilder::new();
    props.put(prop::TIMER_OUT_MS, "5000").unwrap();
    let draft = held_draft(props.into_bytes(), b"held".to_vec());
    for _ in 0..10 {
        store.put(&draft.draft()).await.unwrap();
    }
    store
}

/// Recovery takes out what the done records name, both of a snapshot's entries and of
/// those scanned past it (marked in a bitmap before the scan, so a full scan holds
/// only what is still pending); a done record naming an offset the log does not hold
/// changes nothing.
#[test]
fn recovery_keeps_only_what_no_done_record_names() {
    crate::io::run_local(|| async {
        for with_snapshot in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let store = ten_held(dir.path()).await;
            for named in [vec![1u64], vec![3, 7], vec![9, 42]] {
                let mut done = held_draft(Vec::new(), Vec::new());
                done.topic = SCHEDULE_DONE_TOPIC.to_owned();
                done.body = named.iter().flat_map(|o| o.to_le_bytes()).collect();
                store.put(&done.draft()).await.unwrap();
            }
            if with_snapshot {
                // Taken after the first done record, when 0..6 were written and 7 was in
                // the wheel already (appended, not written yet).
                let snapshot = Snapshot {
                    schedule_end: 6,
                    done_end: 1,
                    entries: [0, 2, 3, 4, 5, 7].map(|off| (5000, off)).to_vec(),
                };
                write_snapshot(store.dir(), &encode_snapshot(&snapshot)).unwrap();
            }
            let schedule = Schedule::recover(&store).await.unwrap();
            let mut held: Vec<u64> = schedule.entries().map(|(_, off)| off).collect();
            held.sort_unstable();
            assert_eq!(held, [0, 2, 4, 5, 6, 8], "snapshot: {with_snapshot}");
        }
    });
}

/// A snapshot ahead of the log (a power loss took the log's tail after it was written)
/// is kept below the log's new end: its entries there are pending, those it had left
/// are delivered, its entries past the end are dropped. Before, the whole log was
/// scanned again, every entry taken for pending and delivered a second time.
#[test]
fn a_snapshot_ahead_of_the_log_is_kept_below_its_end() {
    crate::io::run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = ten_held(dir.path()).await;
        // Written when 15 were scheduled and 2 and 5 (and 12) were still held.
        let snapshot = Snapshot {
            schedule_end: 15,
            done_end: 3,
            entries: vec![(5000, 2), (5000, 5), (5000, 12)],
        };
        write_snapshot(store.dir(), &encode_snapshot(&snapshot)).unwrap();
        let schedule = Schedule::recover(&store).await.unwrap();
        let mut held: Vec<u64> = schedule.entries().map(|(_, off)| off).collect();
        held.sort_unstable();
        assert_eq!(held, [2, 5]);
        // The one on disk was replaced by the recovered one before the start went on...
        let on_disk = read_snapshot(&store.dir().join(SNAPSHOT_FILE)).unwrap();
        let on_disk = on_disk.unwrap();
        assert_eq!((on_disk.schedule_end, on_disk.done_end), (10, 0));
        // ...so the offsets this run schedules at again (10..15, due at 9000) are found by
        // a crash before its own first snapshot. Before, the old one was read again: 10,
        // 11, 13 and 14 were never delivered, and 12 came due at the lost message's time.
        let mut props = PropertiesBuilder::new();
        props.put(prop::TIMER_OUT_MS, "9000").unwrap();
        let draft = held_draft(props.into_bytes(), b"later".to_vec());
        for _ in 10..15 {
            store.put(&draft.draft()).await.unwrap();
        }
        let schedule = Schedule::recover(&store).await.unwrap();
        let mut held: Vec<(u64, u64)> = schedule.entries().map(|(due, off)| (off, due)).collect();
        held.sort_unstable();
        let later = (10..15).map(|off| (off, 9000));
        assert_eq!(
            held,
            [(2, 5000), (5, 5000)]
                .into_iter()
                .chain(later)
                .collect::<Vec<_>>()
        );
    });
}

/// The retention floor when the oldest held message is no longer in the index (below
/// the queue's start after retention, or past its end after a cut): the next held one
/// the index has sets it; with none, nothing is held.
#[test]
fn the_floor_passes_over_held_messages_the_index_lacks() {
    crate::io::run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = crate::store::StoreConfig::default();
        cfg.log.segment_bytes = 256 * 1024;
        cfg.log.retention_bytes_max = 512 * 1024;
        let (store, _) = MessageStore::open(dir.path(), cfg).await.unwrap();
        let draft = held_draft(Vec::new(), vec![b'd'; 1000]);
        let mut placed = Vec::new();
        for _ in 0..1200 {
            placed.push(store.put(&draft.draft()).await.unwrap().physical_offset);
        }
        store.apply_retention(crate::log::now_ms()).await.unwrap();
        let start = store.queue_range(SCHEDULE_TOPIC, 0).unwrap().0;
        assert!(start > 2, "retention kept the whole queue");
        let floor = |held: &[u64]| {
            let mut schedule = Schedule::new(0);
            for &off in held {
                schedule.wheel.insert(1_000, off);
            }
            let (floor, writing) = retention_floor(&store, &schedule, 0).unwrap();
            assert!(!writing, "{held:?}");
            floor
        };
        // The oldest held one gone with retention, the next two still there.
        let kept = [start + 5, start + 2];
        assert_eq!(
            floor(&[start - 2, kept[0], kept[1]]),
            placed[kept[1] as usize]
        );
        // Past the queue's end (a cut dropped their sends): passed over too.
        assert_eq!(
            floor(&[start - 1, 5_000, kept[0]]),
            placed[kept[0] as usize]
        );
        // None the index has: nothing is held.
        assert_eq!(floor(&[start - 1, 5_000]), u64::MAX);
    });
}

/// A held message appended but not yet written (its index entry past the readable end)
/// holds the floor at the log's readable end, below its record, and asks for the floor to
/// be set again; once written, its own record sets it. Passed over, it left the floor at
/// nothing held, and a quiet schedule kept it there while retention took its segment.
#[test]
fn the_floor_holds_a_held_message_being_written() {
    crate::io::run_local(|| async {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::store::StoreConfig::default();
        let (store, _) = MessageStore::open(dir.path(), cfg).await.unwrap();
        let draft = held_draft(Vec::new(), vec![b'd'; 1000]);
        store.put(&draft.draft()).await.unwrap();
        let put = store.append(&draft.draft()).unwrap();
        let mut schedule = Schedule::new(0);
        schedule.wheel.insert(1_000, put.queue_offset);
        let (floor, writing) = retention_floor(&store, &schedule, 0).unwrap();
        assert!(writing);
        assert!(floor <= put.physical_offset, "{floor} past {put:?}");
        store.acked(put.written()).await.unwrap();
        let floor = retention_floor(&store, &schedule, 0).unwrap();
        assert_eq!(floor, (put.physical_offset, false));
    });
}

#[test]
fn snapshots_round_trip_and_damage_is_detected() {
    let s = Snapshot {
        schedule_end: 7,
        done_end: 3,
        entries: vec![(100, 1), (50, 6)],
    };
    let bytes = encode_snapshot(&s);
    let back = decode_snapshot(&bytes).unwrap();
    assert_eq!(
        (back.schedule_end, back.done_end, back.entries),
        (7, 3, vec![(100, 1), (50, 6)])
    );
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x40;
        assert!(decode_snapshot(&bad).is_err(), "flip at {i}");
    }
    assert!(decode_snapshot(&bytes[..bytes.len() - 1]).is_err());
}

#[test]
fn properties_are_rebuilt() {
    let mut b = PropertiesBuilder::new();
    b.put("TAGS", "a").unwrap();
    b.put("DELAY", "3").unwrap();
    b.put("REAL_TOPIC", "old").unwrap();
    let bytes = b.into_bytes();
    let out = rebuild_properties(
        Properties::new(&bytes),
        &["DELAY"],
        &[("REAL_TOPIC", "new"), ("X", "1")],
    )
    .unwrap();
    let p = Properties::new(&out);
    assert_eq!(p.get("TAGS"), Some("a"));
    assert_eq!(p.get("DELAY"), None);
    assert_eq!(p.get("REAL_TOPIC"), Some("new"));
    assert_eq!(p.get("X"), Some("1"));
    assert_eq!(p.iter().count(), 3);
}
