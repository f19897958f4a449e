//! The broker's flow control against the real binary: producers with thousands of sends in
//! flight against a broker whose disk is slow (a testing delay on every log write, sync
//! flush) get `BrokerBusy` answers (retriable: the producer waits them out and sends
//! again) instead of queuing without bound; the broker's memory stays bounded, every
//! acknowledged message is stored, and pulls keep being served meanwhile. Out of file
//! descriptors, a log roll refuses its sends and the log takes them again once some free;
//! a connection's place is held until the requests it handed over end.

mod common;

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::broker::BrokerProcess;
use common::runtime;
use ringmq::client::{Client, ClientConfig, OutgoingMessage, Producer, PullStatus};
use ringmq::protocol::{encode_request, ErrorCode, Heartbeat, Pull, Response};

#[test]
fn a_slow_disk_makes_the_broker_answer_busy_and_keeps_memory_bounded_and_pulls_served() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &[
            "--flush",
            "sync",
            "--testing-write-delay-us",
            "100000",
            "--send-wait-max-ms",
            "50",
            "--send-backlog-max-mb",
            "1",
        ],
    );
    let addr = broker.addr_string();
    let start_rss = broker.rss_mib();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
        client.create_topic("busy", 4).await.unwrap();
        client.create_topic("steady", 1).await.unwrap();
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        for i in 0..10 {
            producer
                .send("steady", OutgoingMessage::new(format!("s{i}")))
                .await
                .unwrap();
        }
        // Thousands of 1 KiB sends at once.
        const N: usize = 3000;
        let body = |i: usize| {
            let mut b = format!("m{i}:").into_bytes();
            b.resize(1024, b'x');
            b
        };
        let sends: Vec<_> = (0..N)
            .map(|i| {
                let send = producer.send_async("busy", OutgoingMessage::new(body(i)));
                tokio::spawn(async move { (i, send.await) })
            })
            .collect();
        // Meanwhile, as long as sends are in flight, a consumer's pulls are answered at
        // once.
        let mut slowest_pull = Duration::ZERO;
        let mut pulls = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while pulls < 20 || sends.iter().any(|s| !s.is_finished()) {
            assert!(Instant::now() < deadline, "sends still in flight after 60 s");
            let t = Instant::now();
            let r = client
                .pull("steady", 0, 0, 32, Duration::ZERO, &[])
                .await
                .unwrap();
            slowest_pull = slowest_pull.max(t.elapsed());
            pulls += 1;
            assert_eq!(r.status, PullStatus::Found);
            assert_eq!(r.messages.len(), 10);
            tokio::task::yield_now().await;
        }
        let mut acked = BTreeSet::new();
        let mut busy_failures = 0;
        for s in sends {
            let (i, r) = s.await.unwrap();
            match r {
                Ok(_) => {
                    acked.insert(i);
                }
                Err(e) => {
                    let code = e.code();
                    assert!(
                        matches!(code, Some(ErrorCode::BrokerBusy) | Some(ErrorCode::Timeout))
                            || e.is_retriable(),
                        "{e}"
                    );
                    if code == Some(ErrorCode::BrokerBusy) {
                        busy_failures += 1;
                    }
                }
            }
        }
        let busy = producer.busy_answers();
        eprintln!(
            "{} of {N} acknowledged, {busy} busy answers waited out, {busy_failures} sends gave up busy, slowest pull {slowest_pull:?}",
            acked.len()
        );
        assert!(busy > 0, "flow control never answered busy");
        assert!(!acked.is_empty());
        assert!(slowest_pull < Duration::from_secs(1), "pulls stalled: {slowest_pull:?}");
        // Every acknowledged message is stored.
        let info = client.describe_topic("busy").await.unwrap();
        let mut stored = BTreeSet::new();
        for q in info.queues {
            let mut offset = 0;
            loop {
                let r = client
                    .pull("busy", q.queue_id, offset, 256, Duration::ZERO, &[])
                    .await
                    .unwrap();
                for m in &r.messages {
                    let text = String::from_utf8_lossy(m.body());
                    let i: usize = text[1..text.find(':').unwrap()].parse().unwrap();
                    stored.insert(i);
                }
                if r.status != PullStatus::Found {
                    break;
                }
                offset = r.next_offset;
            }
        }
        let lost: Vec<_> = acked.difference(&stored).collect();
        assert!(lost.is_empty(), "acknowledged but not stored: {lost:?}");
    });
    // The kernel's high-water mark of the broker's resident memory over the whole test.
    let pid = broker.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let peak = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap()
        / 1024;
    eprintln!("broker RSS: {start_rss} MiB at start, {peak} MiB at the peak");
    assert!(
        peak < start_rss + 300,
        "broker RSS grew from {start_rss} to {peak} MiB"
    );
}

/// A log segment that rolls while connections hold every file descriptor the broker may
/// open: the sends whose records needed it are answered `DiskFull` saying so (nothing of
/// them stored), the log is cut back instead of poisoned, and once descriptors are free
/// again (the connections closed) sends are stored again, without a restart. Every
/// acknowledged message is there, in order, and nothing else. Before, the failed open
/// poisoned the log: every later send failed until the broker was restarted.
#[test]
fn a_roll_with_no_file_descriptor_left_is_refused_and_sends_resume_once_some_free() {
    let dir = tempfile::tempdir().unwrap();
    // 512 descriptors, 1 shard: the broker serves at most 192 connections, keeping 320
    // for itself; 256 KiB segments, so the log uses them up after a few dozen MiB.
    let mut broker = BrokerProcess::start_with_file_limit(
        &dir.path().join("data"),
        1,
        &["--segment-bytes", "262144"],
        512,
    );
    let addr = broker.addr_string();
    let idle: Vec<_> = (0..185)
        .map(|_| common::raw::served_connection(&addr))
        .collect();
    let body = |i: u64| {
        let mut b = format!("m{i}:").into_bytes();
        b.resize(4000, b'x');
        OutgoingMessage::new(b)
    };
    let rt = runtime();
    let producer = rt
        .block_on(Producer::connect(ClientConfig::new(&addr)))
        .unwrap();
    let client = producer.client().clone();
    rt.block_on(client.create_topic("fd", 1)).unwrap();
    let mut acked = Vec::new();
    let mut next = 0u64;
    let send = |from: u64| {
        let batch = (from..from + 16).map(body).collect();
        rt.block_on(producer.send_batch("fd", batch))
    };
    // About 1,200 segments' worth at most: the descriptors run out well before.
    let refusal = loop {
        assert!(
            next < 300_000,
            "every send stored: the descriptors never ran out"
        );
        match send(next) {
            Ok(r) => {
                assert_eq!(r.first_queue_offset, acked.len() as u64);
                acked.extend(next..next + 16);
            }
            Err(e) => break e,
        }
        next += 16;
    };
    assert_eq!(refusal.code(), Some(ErrorCode::DiskFull), "{refusal}");
    assert!(
        refusal.to_string().contains("no file descriptor left"),
        "{refusal}"
    );
    next += 16;
    drop(idle);
    // Descriptors free: sends are stored again once the next look at the disk (every
    // second) lets appends in.
    common::eventually("a send stored once descriptors are free", || {
        let from = next;
        next += 16;
        match send(from) {
            Ok(r) => {
                assert_eq!(r.first_queue_offset, acked.len() as u64);
                acked.extend(from..from + 16);
                true
            }
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::DiskFull), "{e}");
                false
            }
        }
    });
    let mut stored = Vec::new();
    let mut offset = 0;
    loop {
        let r = rt
            .block_on(client.pull("fd", 0, offset, 256, Duration::ZERO, &[]))
            .unwrap();
        for m in &r.messages {
            let text = String::from_utf8_lossy(m.body());
            stored.push(text[1..text.find(':').unwrap()].parse::<u64>().unwrap());
        }
        if r.status != PullStatus::Found {
            break;
        }
        offset = r.next_offset;
    }
    eprintln!("{} messages acknowledged; refused: {refusal}", acked.len());
    assert_eq!(stored.len(), acked.len());
    assert!(
        stored == acked,
        "stored messages differ from the acknowledged ones"
    );
    let log = broker.stderr();
    assert!(log.contains("no file descriptor left"), "{log}");
    assert!(!log.contains("poisoned"), "{log}");
    assert!(broker.stop(), "a clean stop (checkpoint)");
}

/// A connection's place among `--connections-max` is held until the requests it handed to
/// the shard end, not only until the connection does: a client that resets its connection
/// while its send waits for a slow disk (answers to other requests still being written
/// to it, so the broker's writer fails at once) cannot take another place until the send
/// is done (by doing it again and again, it would leave requests running past the cap).
/// Before, the place was freed when the connection ended, the send still running.
#[test]
fn a_connections_place_is_held_until_the_requests_it_handed_over_end() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // 8 MiB to pull, stored before the disk is made slow.
    let mut broker = BrokerProcess::start(&data, 1, &[]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        let client = producer.client().clone();
        client.create_topic("big", 1).await.unwrap();
        client.create_topic("slow", 1).await.unwrap();
        for _ in 0..2 {
            let big: Vec<_> = (0..16)
                .map(|_| OutgoingMessage::new(vec![7u8; 256 << 10]))
                .collect();
            producer.send_batch("big", big).await.unwrap();
        }
    });
    assert!(broker.stop());
    let broker = BrokerProcess::start(
        &data,
        1,
        &[
            "--flush",
            "sync",
            "--testing-write-delay-us",
            "5000000",
            "--connections-max",
            "1",
            "--conn-timeout-ms",
            "1000",
        ],
    );
    let addr = broker.addr_string();
    let mut conn = common::raw::served_connection(&addr);
    let mut frames = Vec::new();
    let mut send = common::raw::send_to("slow", 0, b"held");
    send.wait_durable = true;
    encode_request(&send.into(), 1, &mut frames).unwrap();
    for id in 2..8 {
        encode_request(&Pull::new("big", 0, 0).into(), id, &mut frames).unwrap();
    }
    // Written, then not read until its receive buffer holds 64 KiB of answers, then reset.
    conn.write_all(&frames).unwrap();
    let sent = Instant::now();
    common::eventually_within(
        "64 KiB of answers in the receive buffer",
        Duration::from_secs(20),
        || common::raw::queued_bytes(&conn) >= 64 << 10,
    );
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on the socket `conn` holds open, with a struct on the stack of
    // the size given.
    let set = unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0);
    drop(conn);
    // The send's write takes 5 s at least (10 with the zeros written ahead of it after
    // the restart): no other connection is served before it is done.
    let mut served = None;
    common::eventually_within("another connection served", Duration::from_secs(40), || {
        let mut other = TcpStream::connect(&addr).unwrap();
        let hb = Heartbeat {
            client_id: "other".into(),
        };
        match common::raw::answer_on(&mut other, hb.into()) {
            Some(Response::Empty(_)) => served = Some(other),
            Some(Response::Error(e)) => {
                assert_eq!(e.error_code(), Some(ErrorCode::TooManyConnections), "{e}")
            }
            Some(other) => panic!("{other:?}"),
            None => {}
        }
        served.is_some()
    });
    let waited = sent.elapsed();
    assert!(
        waited >= Duration::from_secs(5),
        "another connection served {waited:?} after the requests were sent, the send still running"
    );
    drop(served);
    let mut conn = common::raw::served_connection(&addr);
    match common::raw::answer_on(&mut conn, Pull::new("slow", 0, 0).into()) {
        Some(Response::Pull(p)) => assert_eq!(p.meta().count, 1),
        other => panic!("{other:?}"),
    }
}
