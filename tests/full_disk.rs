//! A full disk, against the real broker binary on a small loop-mounted ext4 made by the
//! test (root is needed to mount it; without it the test says so and does nothing): sends
//! fill the disk, then get the typed, retriable `DiskFull`; the broker does not crash,
//! keeps serving pulls and admin requests, takes sends again once space is freed (no
//! restart), stops cleanly, and after a restart every acknowledged message is there, in
//! order, and nothing else. Also the free-space floor (`--disk-free-min-mb`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::broker::BrokerProcess;
use common::runtime;
use ringmq::client::{Client, ClientConfig, ClientError, OutgoingMessage, Producer};
use ringmq::protocol::ErrorCode;

/// A loop-mounted ext4 of a few MiB, unmounted on drop.
struct SmallDisk {
    mnt: PathBuf,
}

impl SmallDisk {
    fn make(root: &Path, mib: u64) -> Result<SmallDisk, String> {
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: cannot mount a loop filesystem".into());
        }
        let image = root.join("disk.img");
        let mnt = root.join("mnt");
        std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(mib << 20))
            .map_err(|e| e.to_string())?;
        let run = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{cmd:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt))?;
        Ok(SmallDisk { mnt })
    }
}

/// A small disk of `mib` MiB holding 16 MiB of ballast to free later (its path); `None`
/// (the test says why and does nothing) without root.
fn disk_with_ballast(root: &Path, mib: u64) -> Option<(SmallDisk, PathBuf)> {
    let disk = match SmallDisk::make(root, mib) {
        Ok(d) => d,
        Err(reason) => {
            eprintln!("full-disk test skipped: {reason}");
            return None;
        }
    };
    let ballast = disk.mnt.join("ballast");
    std::fs::write(&ballast, vec![1u8; 16 << 20]).unwrap();
    Some((disk, ballast))
}

/// A one-shard broker on a 64 MiB disk filled up to a ballast file, which frees the disk
/// when removed (`None`: no such disk can be made here). Dropped in this order (broker,
/// then disk) when bound as `(disk, ballast, broker)`.
fn one_shard_beside_ballast(root: &Path) -> Option<(SmallDisk, PathBuf, BrokerProcess)> {
    let (disk, ballast) = disk_with_ballast(root, 64)?;
    let broker = one_shard_on(&disk);
    Some((disk, ballast, broker))
}

/// A broker of one shard on `disk`, 4 MiB segments, no free-space floor (the disk really
/// fills).
fn one_shard_on(disk: &SmallDisk) -> BrokerProcess {
    let args = ["--segment-bytes", "4194304", "--disk-free-min-mb", "0"];
    BrokerProcess::start(&disk.mnt.join("data"), 1, &args)
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

fn body(n: u64) -> Vec<u8> {
    let mut b = vec![b'x'; 64 << 10];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b
}

/// Reads queue `q` of `topic` from the start; returns the numbers in the bodies.
async fn read_queue(client: &Client, topic: &str, q: u32) -> Vec<u64> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let r = client
            .pull(topic, q, offset, 32, Duration::ZERO, &[])
            .await
            .unwrap();
        if r.messages.is_empty() {
            assert_eq!(offset, r.max_offset, "no message left unread");
            return out;
        }
        for m in &r.messages {
            out.push(u64::from_le_bytes(m.body()[..8].try_into().unwrap()));
        }
        offset = r.next_offset;
    }
}

/// Sends message `n` to topic `n % 2`; an acknowledged one must come next in its queue.
async fn send_next(
    producer: &Producer,
    topics: &[&str],
    acked: &mut [Vec<u64>],
    n: u64,
) -> Result<(), ClientError> {
    let q = (n % topics.len() as u64) as usize;
    let r = producer
        .send(topics[q], OutgoingMessage::new(body(n)))
        .await?;
    assert_eq!(r.queue_offset, acked[q].len() as u64);
    acked[q].push(n);
    Ok(())
}

/// A transaction producer of `group` whose checks are answered "unknown", with topics
/// `topic` and "fill" (one queue each) created.
async fn transaction_producer(
    addr: &str,
    group: &str,
    topic: &str,
) -> ringmq::client::TransactionProducer {
    use ringmq::client::{TransactionOutcome, TransactionProducer};
    let tp = TransactionProducer::start(ClientConfig::new(addr), group, |_| {
        TransactionOutcome::Unknown
    })
    .await
    .unwrap();
    let client = tp.producer().client();
    client.create_topic(topic, 1).await.unwrap();
    client.create_topic("fill", 1).await.unwrap();
    tp
}

/// Sends 64 KiB messages to topic "fill", 8 in flight, until 8 are refused with
/// `DiskFull`; returns how many were sent (the next message's number).
async fn fill_the_disk(producer: &Producer) -> u64 {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let mut fills = FuturesUnordered::new();
    let (mut n, mut refused) = (0u64, 0);
    while refused < 8 {
        while fills.len() < 8 {
            fills.push(producer.send("fill", OutgoingMessage::new(body(n))));
            n += 1;
        }
        if let Some(Err(e)) = fills.next().await {
            assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
            refused += 1;
        }
        assert!(n < 5000, "the disk never filled");
    }
    n
}

fn alive(broker: &BrokerProcess) -> bool {
    broker
        .pid()
        .is_some_and(|pid| unsafe { libc::kill(pid as i32, 0) } == 0)
}

#[test]
fn a_full_disk_answers_disk_full_keeps_serving_and_takes_sends_again_when_space_returns() {
    let root = tempfile::tempdir().unwrap();
    let Some((disk, ballast)) = disk_with_ballast(root.path(), 96) else {
        return;
    };
    // The broker's stderr log is on the small disk too: a failed log line must not
    // stop it.
    let data = disk.mnt.join("data");
    let mut broker = BrokerProcess::start(
        &data,
        2,
        // No floor: the disk really fills (the floor is tested below).
        &["--segment-bytes", "8388608", "--disk-free-min-mb", "0"],
    );
    let addr = broker.addr_string();
    // Two topics of one queue each (queues are spread over the shards).
    let topics = ["fill0", "fill1"];
    let mut acked: Vec<Vec<u64>> = vec![Vec::new(); topics.len()];
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client();
        for t in topics {
            client.create_topic(t, 1).await.unwrap();
        }
        let mut n = 0u64;
        let mut refused = 0;
        while refused < 3 {
            assert!(n < 5000, "the disk never filled");
            match send_next(&producer, &topics, &mut acked, n).await {
                Ok(()) => {}
                Err(e) => {
                    assert_eq!(
                        e.code(),
                        Some(ErrorCode::DiskFull),
                        "{e}; broker running {}; its stdout (a panic's report, why it \
                         stopped): {}; its stderr log: {}",
                        alive(&broker),
                        broker.stdout(),
                        broker.stderr()
                    );
                    assert!(e.is_retriable(), "{e}");
                    refused += 1;
                }
            }
            n += 1;
        }
        assert!(alive(&broker), "the broker survived the full disk");
        // Reads and admin requests are still served.
        for (q, t) in topics.iter().enumerate() {
            assert_eq!(read_queue(client, t, 0).await, acked[q]);
        }
        assert!(client.list_topics().await.unwrap().len() >= 2);
        // Free space: sends are taken again without a restart.
        std::fs::remove_file(&ballast).unwrap();
        let started = Instant::now();
        let mut resumed = 0;
        while resumed < 20 {
            match send_next(&producer, &topics, &mut acked, n).await {
                Ok(()) => resumed += 1,
                Err(e) => {
                    assert_eq!(
                        e.code(),
                        Some(ErrorCode::DiskFull),
                        "{e}; the broker's stdout: {}",
                        broker.stdout()
                    );
                    assert!(
                        started.elapsed() < Duration::from_secs(20),
                        "sends not taken again after space returned: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            n += 1;
        }
    });
    assert!(broker.stop(), "a clean stop after the full disk");
    broker.restart();
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        for (q, t) in topics.iter().enumerate() {
            assert_eq!(
                read_queue(&client, t, 0).await,
                acked[q],
                "{t} after a restart: every acknowledged message, in order, nothing else"
            );
        }
    });
}

/// Transactional sends racing a disk that fills: the half messages of those the full disk
/// cut from the log (their sends answered `DiskFull`) are not listed as unresolved for
/// ever (they were, until another half took their offset); those taken stay listed.
#[test]
fn halves_of_transactional_sends_cut_by_a_full_disk_are_not_listed_as_unresolved() {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    use ringmq::client::TransactionOutcome;
    use std::collections::BTreeSet;
    let root = tempfile::tempdir().unwrap();
    let Some((_disk, ballast, broker)) = one_shard_beside_ballast(root.path()) else {
        return;
    };
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = transaction_producer(&addr, "txc", "tc").await;
        let producer = tp.producer();
        let client = producer.client().clone();
        let half = |i: u64| {
            let m = OutgoingMessage::new(i.to_le_bytes().to_vec());
            tp.send_in_transaction("tc", m, |_| TransactionOutcome::Unknown)
        };
        // Fill the disk with 8 sends in flight and 4 transactional sends beside them.
        let (mut fills, mut halves) = (FuturesUnordered::new(), FuturesUnordered::new());
        let (mut n, mut i, mut refused) = (0u64, 0u64, 0);
        let (mut taken, mut halves_refused) = (BTreeSet::new(), 0);
        while refused < 8 {
            while fills.len() < 8 {
                fills.push(producer.send("fill", OutgoingMessage::new(body(n))));
                n += 1;
            }
            while halves.len() < 4 {
                halves.push(half(i));
                i += 1;
            }
            tokio::select! {
                Some(r) = fills.next() => {
                    if let Err(e) = r {
                        assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
                        refused += 1;
                    }
                }
                Some(r) = halves.next() => match r {
                    Ok(r) => {
                        taken.insert(r.send.transaction_id);
                    }
                    Err(e) => {
                        assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
                        halves_refused += 1;
                    }
                },
            }
            assert!(n < 5000, "the disk never filled");
        }
        while let Some(r) = halves.next().await {
            match r {
                Ok(r) => {
                    taken.insert(r.send.transaction_id);
                }
                Err(e) => {
                    assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
                    halves_refused += 1;
                }
            }
        }
        drop((fills, halves));
        assert!(
            halves_refused > 0,
            "no transactional send met the full disk"
        );
        std::fs::remove_file(&ballast).unwrap();
        let started = Instant::now();
        loop {
            let list = client.list_transactions().await.unwrap();
            let listed: BTreeSet<u64> = list.halves.iter().map(|h| h.transaction_id).collect();
            if listed == taken {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{} listed as unresolved, not taken ({halves_refused} refused); {} taken, not \
                 listed",
                listed.difference(&taken).count(),
                taken.difference(&listed).count()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Some were there to take off the list (not all refused sends leave one: a send
        // refused before its append leaves none).
        let log = broker.stderr();
        assert!(
            log.contains("were cut from the log by a full disk"),
            "{log}"
        );
        tp.shutdown().await;
    });
}

/// Commits racing a disk that fills: a commit answered with an error is not taken for done
/// (its append may have been accepted, then cut from the log with the write that found
/// the disk full): a repeat is refused again, or stored (a commit's record can fit where a
/// larger write failed), never answered "committed" from memory; a second commit of the
/// same transaction at the same time is answered only once the first is, and "committed"
/// only for a message stored. Once space returns every transaction commits, each message
/// stored exactly once.
#[test]
fn a_commit_cut_by_a_full_disk_is_not_taken_for_done() {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    use ringmq::client::TransactionOutcome;
    use std::collections::BTreeSet;
    let root = tempfile::tempdir().unwrap();
    let Some((_disk, ballast, broker)) = one_shard_beside_ballast(root.path()) else {
        return;
    };
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = transaction_producer(&addr, "txf", "tf").await;
        let producer = tp.producer();
        let client = producer.client().clone();
        let mut open = Vec::new();
        for i in 0..400u64 {
            let message = OutgoingMessage::new(i.to_le_bytes().to_vec());
            let r = tp
                .send_in_transaction("tf", message, |_| TransactionOutcome::Unknown)
                .await
                .unwrap();
            open.push((i, r.send.transaction_id));
        }
        // Fill the disk with 8 sends in flight while the commits go, each transaction's
        // twice at once, 2 transactions at a time.
        let commit = |id: u64| tp.end("tf", 0, id, TransactionOutcome::Commit, false);
        let mut fills = FuturesUnordered::new();
        let mut n = 0u64;
        let mut refused = 0;
        let (mut committed, mut refused_commit) = (BTreeSet::new(), BTreeSet::new());
        let mut commits = FuturesUnordered::new();
        let mut pending = open.iter();
        while refused < 8 || !commits.is_empty() {
            while fills.len() < 8 && refused < 8 {
                fills.push(producer.send("fill", OutgoingMessage::new(body(n))));
                n += 1;
            }
            while commits.len() < 4 {
                let Some(&(i, id)) = pending.next() else {
                    break;
                };
                for _ in 0..2 {
                    commits.push(async move { (i, id, commit(id).await) });
                }
            }
            tokio::select! {
                Some(r) = fills.next(), if !fills.is_empty() => {
                    if let Err(e) = r {
                        assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
                        refused += 1;
                    }
                }
                Some((i, id, r)) = commits.next(), if !commits.is_empty() => {
                    match r {
                        Ok(()) => committed.insert(i),
                        Err(e) => {
                            assert_eq!(e.code(), Some(ErrorCode::DiskFull), "t{i}: {e}");
                            refused_commit.insert((i, id))
                        }
                    };
                }
            }
            assert!(n < 5000, "the disk never filled");
        }
        drop((fills, commits));
        // Every commit answered "committed" is stored, the disk full as it is.
        let stored: BTreeSet<u64> = read_queue(&client, "tf", 0).await.into_iter().collect();
        let lost: Vec<_> = committed.difference(&stored).collect();
        assert!(lost.is_empty(), "answered committed, not stored: {lost:?}");
        let failed: Vec<(u64, u64)> = (refused_commit.into_iter())
            .filter(|(i, _)| !committed.contains(i))
            .collect();
        let unsent: Vec<(u64, u64)> = pending.copied().collect();
        assert!(!failed.is_empty() || !unsent.is_empty());
        // Tried again while the disk is full: refused, or committed and then stored (a
        // commit's record can fit where a larger write failed), never "committed" from
        // memory: the check of every message below finds one answered so and not stored.
        let mut failed_again = Vec::new();
        let mut committed_again = BTreeSet::new();
        for &(i, id) in &failed {
            match commit(id).await {
                Ok(()) => committed_again.insert(i),
                Err(e) => {
                    assert_eq!(e.code(), Some(ErrorCode::DiskFull), "t{i}: {e}");
                    failed_again.push((i, id));
                    false
                }
            };
        }
        let stored: BTreeSet<u64> = read_queue(&client, "tf", 0).await.into_iter().collect();
        let lost: Vec<_> = committed_again.difference(&stored).collect();
        assert!(
            lost.is_empty(),
            "committed again on the full disk, not stored: {lost:?}"
        );
        let failed = failed_again;
        std::fs::remove_file(&ballast).unwrap();
        let started = Instant::now();
        for &(i, id) in failed.iter().chain(&unsent) {
            while let Err(e) = commit(id).await {
                assert_eq!(e.code(), Some(ErrorCode::DiskFull), "t{i}: {e}");
                assert!(started.elapsed() < Duration::from_secs(20), "t{i}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let mut stored = read_queue(&client, "tf", 0).await;
        stored.sort_unstable();
        assert_eq!(
            stored,
            (0..400).collect::<Vec<u64>>(),
            "every transaction committed once ({} failed at first)",
            failed.len()
        );
        tp.shutdown().await;
    });
}

/// Delayed messages held while the disk is nearly full: every retention interval the
/// schedule moves them forward (copies, then a done record for the old entries), and here
/// the copies do not fit: those written before the disk filled are cut from the log with
/// the write that found it full. The old entries then stay; once space returns every
/// delayed message is delivered (at least once).
#[test]
fn held_messages_moved_forward_into_a_full_disk_are_all_delivered() {
    use std::collections::BTreeSet;
    const HELD: u64 = 3000;
    let root = tempfile::tempdir().unwrap();
    let Some((disk, ballast)) = disk_with_ballast(root.path(), 64) else {
        return;
    };
    // Room for about half the copies of the held messages, given back once the disk is full.
    let room = disk.mnt.join("room");
    std::fs::write(&room, vec![1u8; 1 << 20]).unwrap();
    let mut args = common::SMALL_RETENTION.to_vec();
    args.extend(["--disk-free-min-mb", "0"]);
    let broker = BrokerProcess::start(&disk.mnt.join("data"), 1, &args);
    let addr = broker.addr_string();
    let disk_fulls = || broker.stderr().matches("appends after log offset").count();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("held", 1).await.unwrap();
        client.create_topic("fill", 1).await.unwrap();
        // Room for 3000 sends, a full disk and its recovery on a slow machine before any
        // is due.
        let due_in = Duration::from_secs(25);
        let sent_at = Instant::now();
        for i in 0..HELD {
            let mut b = vec![b'h'; 512];
            b[..8].copy_from_slice(&i.to_le_bytes());
            let message = OutgoingMessage::new(b).with_delay_ms(due_in.as_millis() as u64);
            producer.send("held", message).await.unwrap();
        }
        // Retention wants the held messages' segments from here on: each pass moves them
        // (the schedule's floor keeps the log, so the disk fills).
        let mut n = fill_the_disk(&producer).await;
        // A little room: the next pass's copies fill it and are cut.
        let full_before = disk_fulls();
        std::fs::remove_file(&room).unwrap();
        let deadline = Instant::now() + Duration::from_secs(8);
        while disk_fulls() == full_before {
            assert!(
                Instant::now() < deadline,
                "the moved copies never filled the disk"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        std::fs::remove_file(&ballast).unwrap();
        // Writes past whatever that pass appended.
        let mut taken = 0;
        while taken < 20 {
            match producer.send("fill", OutgoingMessage::new(body(n))).await {
                Ok(_) => taken += 1,
                Err(e) => {
                    assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            n += 1;
        }
        assert!(sent_at.elapsed() < due_in, "the test machine is too slow");
        let mut seen = BTreeSet::new();
        let mut next = 0;
        let deadline = sent_at + due_in + Duration::from_secs(30);
        while (seen.len() as u64) < HELD {
            assert!(
                Instant::now() < deadline,
                "{} of {HELD} delayed messages delivered",
                seen.len()
            );
            let r = client
                .pull("held", 0, next, 256, Duration::from_millis(500), &[])
                .await
                .unwrap();
            for m in &r.messages {
                seen.insert(u64::from_le_bytes(m.body()[..8].try_into().unwrap()));
            }
            next = r.next_offset;
        }
    });
}

/// Creates topics "soon" and "fill" (one queue each) and fills the disk with sends to
/// "fill" (8 in flight) beside delayed sends to "soon" due in `due_ms` (4 in flight, bodies
/// `soon-<n>`), until 8 fills are refused; some delayed sends meet the full disk. Returns
/// the bodies of the delayed sends taken and how many were refused.
async fn fill_beside_delayed_sends(producer: &Producer, due_ms: u64) -> (Vec<String>, usize) {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let client = producer.client().clone();
    client.create_topic("soon", 1).await.unwrap();
    client.create_topic("fill", 1).await.unwrap();
    let delayed = |n: u64| async move {
        let body = format!("soon-{n}");
        let m = OutgoingMessage::new(body.clone()).with_delay_ms(due_ms);
        (body, producer.send("soon", m).await)
    };
    let mut fills = FuturesUnordered::new();
    let mut soon = FuturesUnordered::new();
    let (mut n, mut refused, mut soon_n) = (0u64, 0, 0u64);
    let (mut taken, mut soon_refused) = (Vec::new(), 0);
    let mut delayed_ended = |(body, r): (String, Result<_, ClientError>)| match r {
        Ok(_) => taken.push(body),
        Err(e) => {
            assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
            soon_refused += 1;
        }
    };
    while refused < 8 {
        while fills.len() < 8 {
            fills.push(producer.send("fill", OutgoingMessage::new(body(n))));
            n += 1;
        }
        while soon.len() < 4 {
            soon.push(delayed(soon_n));
            soon_n += 1;
        }
        tokio::select! {
            Some(r) = fills.next() => {
                if let Err(e) = r {
                    assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
                    refused += 1;
                }
            }
            Some(ended) = soon.next() => delayed_ended(ended),
        }
        assert!(n < 5000, "the disk never filled");
    }
    while let Some(ended) = soon.next().await {
        delayed_ended(ended);
    }
    assert!(soon_refused > 0, "no delayed send met the full disk");
    (taken, soon_refused)
}

/// Once the disk has room again: `count` delayed sends (`late-0`, ...) to `soon`, due in
/// `delay_ms`, each sent again while refused with `DiskFull` (for 10 s at most); their bodies.
async fn send_late(producer: &Producer, count: usize, delay_ms: u64) -> Vec<String> {
    let started = Instant::now();
    let mut late = Vec::with_capacity(count);
    while late.len() < count {
        let body = format!("late-{}", late.len());
        let m = OutgoingMessage::new(body.clone()).with_delay_ms(delay_ms);
        match producer.send("soon", m).await {
            Ok(_) => late.push(body),
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
                assert!(started.elapsed() < Duration::from_secs(10), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    late
}

/// Delayed sends racing a disk that fills, and no delayed send after: the schedule entries
/// left by those the full disk cut (whose offsets no message took again) are dropped once
/// due, rather than tried again every few milliseconds for ever, and every delayed send
/// taken is delivered.
#[test]
fn schedule_entries_of_delayed_sends_cut_by_a_full_disk_do_not_stay_pending() {
    let root = tempfile::tempdir().unwrap();
    let Some((_disk, ballast, broker)) = one_shard_beside_ballast(root.path()) else {
        return;
    };
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let (taken, refused) = fill_beside_delayed_sends(&producer, 1_000).await;
        std::fs::remove_file(&ballast).unwrap();
        let client = producer.client();
        let started = Instant::now();
        let (mut delivered, mut next) = (std::collections::BTreeSet::new(), 0);
        loop {
            let stats = client.schedule_stats().await.unwrap();
            let pending: u64 = stats.iter().map(|s| s.pending).sum();
            let r = client
                .pull("soon", 0, next, 256, Duration::from_millis(200), &[])
                .await
                .unwrap();
            delivered.extend(r.messages.iter().map(|m| m.body().to_vec()));
            next = r.next_offset;
            if pending == 0 && taken.iter().all(|b| delivered.contains(b.as_bytes())) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{pending} entries still pending ({refused} delayed sends refused); {} of {} \
                 taken delivered",
                taken
                    .iter()
                    .filter(|b| delivered.contains(b.as_bytes()))
                    .count(),
                taken.len()
            );
        }
        // Some were there to drop (not all refused sends leave one: a send refused before
        // its append leaves none): at the next delayed send's append, or once due.
        let log = broker.stderr();
        assert!(
            log.contains("named no stored message dropped")
                || log.contains("a full disk cut from the log (they were refused): dropped"),
            "{log}"
        );
    });
}

/// Delayed sends racing a disk that fills, due in 6 s, then delayed sends due in 1 s that
/// take the offsets of those the full disk cut: each message taken is delivered exactly
/// once and no refused one at all. (The cut sends' entries, left in the schedule, used to
/// fire at their time and deliver the message stored at their offset by then a second
/// time.)
#[test]
fn a_delayed_send_cut_by_a_full_disk_does_not_deliver_its_offsets_next_message_twice() {
    let root = tempfile::tempdir().unwrap();
    let Some((_disk, ballast, broker)) = one_shard_beside_ballast(root.path()) else {
        return;
    };
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let cut_due = Duration::from_secs(6);
        let filled = Instant::now();
        let (mut taken, soon_refused) =
            fill_beside_delayed_sends(&producer, cut_due.as_millis() as u64).await;
        std::fs::remove_file(&ballast).unwrap();
        let started = Instant::now();
        taken.extend(send_late(&producer, soon_refused + 8, 1_000).await);
        // Until every message taken came and the cut sends' time (6 s after the last of
        // them) has passed by 3 s.
        let client = producer.client();
        let mut delivered: std::collections::BTreeMap<Vec<u8>, usize> = Default::default();
        let mut next = 0;
        let all_came = |d: &std::collections::BTreeMap<Vec<u8>, usize>| {
            taken.iter().all(|b| d.contains_key(b.as_bytes()))
        };
        while !all_came(&delivered) || started.elapsed() < cut_due + Duration::from_secs(3) {
            assert!(
                filled.elapsed() < Duration::from_secs(60),
                "{} of {} taken delivered",
                taken
                    .iter()
                    .filter(|b| delivered.contains_key(b.as_bytes()))
                    .count(),
                taken.len()
            );
            let r = client
                .pull("soon", 0, next, 256, Duration::from_millis(200), &[])
                .await
                .unwrap();
            for m in &r.messages {
                *delivered.entry(m.body().to_vec()).or_default() += 1;
            }
            next = r.next_offset;
        }
        let twice: Vec<String> = delivered
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(b, n)| format!("{} x{n}", String::from_utf8_lossy(b)))
            .collect();
        assert!(twice.is_empty(), "delivered more than once: {twice:?}");
        let unknown: Vec<String> = delivered
            .keys()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .filter(|b| !taken.contains(b))
            .collect();
        assert!(unknown.is_empty(), "refused sends delivered: {unknown:?}");
    });
}

/// Delayed sends racing a disk that fills: one whose record was cut from the log (its
/// send answered `DiskFull`) leaves no schedule entry that fires for the message stored at
/// its offset later. The later delayed messages are delivered at their own time, not
/// before, and none is lost, across a restart too (the snapshot holds both entries of such
/// an offset).
#[test]
fn a_delayed_send_cut_by_a_full_disk_brings_no_later_message_forward() {
    let root = tempfile::tempdir().unwrap();
    let Some((_disk, ballast, mut broker)) = one_shard_beside_ballast(root.path()) else {
        return;
    };
    let addr = broker.addr_string();
    let (started, late, due_in) = runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let (_, soon_refused) = fill_beside_delayed_sends(&producer, 1_000).await;
        std::fs::remove_file(&ballast).unwrap();
        // Later delayed messages take the offsets of those cut.
        let due_in = Duration::from_secs(8);
        let started = Instant::now();
        let late = send_late(&producer, soon_refused + 8, due_in.as_millis() as u64).await;
        // Sent before they were due (the check below needs them all sent early).
        assert!(started.elapsed() < Duration::from_secs(7));
        (started, late.len(), due_in)
    });
    assert!(broker.stop(), "a clean stop");
    broker.restart();
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        let sent = Instant::now();
        let (mut next, mut got) = (0, 0);
        while got < late {
            assert!(
                sent.elapsed() < due_in + Duration::from_secs(30),
                "{got} of {late} late messages delivered"
            );
            let r = client
                .pull("soon", 0, next, 256, Duration::from_millis(500), &[])
                .await
                .unwrap();
            let delivered = (r.messages.iter())
                .filter(|m| m.body().starts_with(b"late-"))
                .count();
            assert!(
                delivered == 0 || started.elapsed() >= due_in,
                "a message due in {due_in:?} delivered after {:?}",
                started.elapsed()
            );
            got += delivered;
            next = r.next_offset;
        }
    });
}

/// An unresolved half message stored where retention wants to delete, on a disk it helped
/// fill (it held retention back): it does not keep the disk full. It is discarded (copied
/// to the discarded topic, when the copy fits what is left) or, if its copy does not fit,
/// let go with its segment with a warning naming it; either way retention then frees the
/// disk and sends are taken again with nobody freeing space. (Once the half is older than
/// the transaction timeout and a check interval: 1.3 s here.)
#[test]
fn a_half_message_that_cannot_be_discarded_does_not_keep_a_full_disk_full() {
    use ringmq::client::TransactionOutcome;
    let root = tempfile::tempdir().unwrap();
    let Some((disk, _ballast)) = disk_with_ballast(root.path(), 64) else {
        return;
    };
    let mut args = common::SMALL_RETENTION.to_vec();
    args.extend(["--disk-free-min-mb", "0", "--transaction-timeout-ms", "300"]);
    args.extend(["--transaction-check-interval-ms", "1000"]);
    let broker = BrokerProcess::start(&disk.mnt.join("data"), 1, &args);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let tp = transaction_producer(&addr, "txd", "td").await;
        let producer = tp.producer();
        let client = producer.client().clone();
        let sent = tp
            .send_in_transaction("td", OutgoingMessage::new("stuck"), |_| {
                TransactionOutcome::Unknown
            })
            .await
            .unwrap();
        // The half holds retention back: the disk fills.
        let n = fill_the_disk(producer).await;
        let started = Instant::now();
        while let Err(e) = producer.send("fill", OutgoingMessage::new(body(n))).await {
            assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the disk stayed full: {e}; the broker's log: {}",
                broker.stderr()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut list = client.list_transactions().await.unwrap();
        while !list.halves.is_empty() {
            assert!(started.elapsed() < Duration::from_secs(20), "{list:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
            list = client.list_transactions().await.unwrap();
        }
        let id = sent.send.transaction_id;
        let log = broker.stderr();
        let discarded = (list.recently_discarded.iter()).any(|h| h.transaction_id == id);
        let let_go =
            log.contains("age out with retention unresolved") && log.contains(&format!("{id}"));
        assert!(discarded || let_go, "{list:?}; {log}");
        tp.shutdown().await;
    });
}

#[test]
fn below_the_free_space_floor_sends_get_disk_full_and_pulls_go_on() {
    let dir = tempfile::tempdir().unwrap();
    // A floor above any disk's size: sends are refused from the first check on. Its
    // warning goes to a stderr that takes no writes, as a log on the full disk would.
    let mut broker = BrokerProcess::start_with_stderr(
        &dir.path().join("data"),
        1,
        &["--disk-free-min-mb", "1000000000"],
        Path::new("/dev/full"),
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("t", 1).await.unwrap();
        let started = Instant::now();
        let e = loop {
            match producer
                .send("t", OutgoingMessage::new(b"x".to_vec()))
                .await
            {
                Err(e) => break e,
                Ok(_) => {
                    // Only before the first look at the disk.
                    assert!(started.elapsed() < Duration::from_secs(3));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
        assert!(e.to_string().contains("floor"), "{e}");
        let r = producer
            .client()
            .pull("t", 0, 0, 32, Duration::ZERO, &[])
            .await
            .unwrap();
        assert!(r.max_offset <= 1, "pulls are answered");
    });
    let status = broker.stop_within(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "a clean stop: {status:?}; stdout:\n{}",
        broker.stdout()
    );
}

/// A broker whose log lines cannot be written (stderr is `/dev/full`: every write fails
/// with ENOSPC, as a log file on a full disk does) starts, serves and stops cleanly: a
/// failed log line is dropped, it never panics the thread that wrote it (tracing's own
/// report of the failure, an `eprintln!` to the same stderr, would). No root needed.
#[test]
fn a_broker_whose_stderr_takes_no_writes_serves_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker =
        BrokerProcess::start_with_stderr(&dir.path().join("data"), 2, &[], Path::new("/dev/full"));
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client();
        client.create_topic("logless", 2).await.unwrap();
        let mut sent = vec![Vec::new(); 2];
        for i in 0..50u64 {
            let r = producer
                .send("logless", OutgoingMessage::new(body(i)))
                .await
                .unwrap();
            sent[r.queue_id as usize].push(i);
        }
        for (q, want) in sent.iter().enumerate() {
            assert_eq!(&read_queue(client, "logless", q as u32).await, want);
        }
    });
    let status = broker.stop_within(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "a clean stop: {status:?}; stdout:\n{}",
        broker.stdout()
    );
}
