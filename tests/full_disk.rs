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

fn alive(broker: &BrokerProcess) -> bool {
    broker
        .pid()
        .is_some_and(|pid| unsafe { libc::kill(pid as i32, 0) } == 0)
}

#[test]
fn a_full_disk_answers_disk_full_keeps_serving_and_takes_sends_again_when_space_returns() {
    let root = tempfile::tempdir().unwrap();
    let disk = match SmallDisk::make(root.path(), 96) {
        Ok(d) => d,
        Err(reason) => {
            eprintln!("full-disk test skipped: {reason}");
            return;
        }
    };
    // Space to free later.
    let ballast = disk.mnt.join("ballast");
    std::fs::write(&ballast, vec![1u8; 16 << 20]).unwrap();
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
