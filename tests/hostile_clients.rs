//! Clients that misbehave, against the real broker binary: pipelining pulls without ever
//! reading the answers, announcing huge frames and sending nothing, stalling in the middle
//! of a frame, opening more connections than the broker takes, registering more members
//! than a group takes, pipelining transaction listings without reading them. The broker's memory stays
//! bounded (its resident size is read from /proc), what a closed connection held is given
//! back, and well-behaved clients keep being served.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::broker::BrokerProcess;
use common::runtime;
use ringmq::client::{ClientConfig, OutgoingMessage, Producer};
use ringmq::protocol::{
    encode_request, ErrorBody, ErrorCode, FrameDecoder, Heartbeat, ProducerHeartbeat, Pull,
    Request, Response, FRAME_HEADER_BYTES, FRAME_MAGIC, PROTOCOL_VERSION,
};

/// A topic of `count` messages of `size` bytes, in one queue.
fn fill(addr: &str, topic: &str, count: usize, size: usize) {
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(addr)).await.unwrap();
        producer.client().create_topic(topic, 1).await.unwrap();
        for i in 0..count {
            let mut body = vec![b'x'; size];
            body[..8].copy_from_slice(&(i as u64).to_le_bytes());
            producer
                .send(topic, OutgoingMessage::new(body))
                .await
                .unwrap();
        }
    });
}

fn frame(request: Request, id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&request, id, &mut out).unwrap();
    out
}

/// `pulls` pipelined pulls of queue 0 of `topic` from offset 0, written and never read.
fn flood_with_pulls(addr: &str, topic: &str, pulls: u64) -> TcpStream {
    let mut conn = TcpStream::connect(addr).unwrap();
    // Writing blocks once the broker stops reading us: that is the point.
    conn.set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    for id in 0..pulls {
        let mut pull = Pull::new(topic, 0, 0);
        pull.max_wait_ms = 0;
        if conn.write_all(&frame(pull.into(), id)).is_err() {
            break;
        }
    }
    conn
}

/// Samples the broker's memory every 100 ms for 2 s (a measurement window, not a wait for
/// a condition) and returns the highest reading.
fn settle_rss(broker: &BrokerProcess) -> u64 {
    let mut peak = 0;
    for _ in 0..20 {
        peak = peak.max(broker.rss_mib());
        std::thread::sleep(Duration::from_millis(100));
    }
    peak
}

/// What the broker still holds (MiB): waits until its resident size is back within 16 MiB
/// of `floor`, for 15 s at most, and returns the lowest size seen. Memory freed a moment ago
/// can stay resident for a while (the allocator gives it back lazily, more so on a loaded
/// machine: CI saw 149 MiB two seconds after a round whose memory was gone), but held memory
/// never drops below its size, so a leak still shows and adds up per round.
fn held_rss(broker: &BrokerProcess, floor: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut low = broker.rss_mib();
    while low > floor + 16 && Instant::now() < deadline {
        // Polls /proc without spinning on a core the broker needs to free its memory.
        std::thread::sleep(Duration::from_millis(20));
        low = low.min(broker.rss_mib());
    }
    low
}

/// Waits (up to 10 s) until a new connection is served again, e.g. after others closed.
fn serves_again(addr: &str) {
    drop(common::raw::served_connection(addr));
}

/// Sends a heartbeat on `conn` and reads its answer (`None`: the connection ended first).
fn heartbeat_answer(conn: &mut TcpStream) -> Option<Result<(), ErrorBody>> {
    let hb = Heartbeat {
        client_id: "ok".into(),
    };
    answer_of(conn, hb.into())
}

/// Sends `request` on `conn` and reads its empty or error answer (`None`: the connection
/// ended first).
fn answer_of(conn: &mut TcpStream, request: Request) -> Option<Result<(), ErrorBody>> {
    Some(match common::raw::answer_on(conn, request)? {
        Response::Empty(_) => Ok(()),
        Response::Error(e) => Err(e),
        other => panic!("{other:?}"),
    })
}

/// Answers a heartbeat, so the broker serves well-behaved clients.
fn still_serves(addr: &str) {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(&frame(
        Heartbeat {
            client_id: "ok".into(),
        }
        .into(),
        1,
    ))
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = 0;
    loop {
        let n = conn.read(&mut buf[got..]).unwrap();
        assert!(n > 0, "the broker closed a well-behaved connection");
        got += n;
        if let Some(f) = FrameDecoder::default().decode(&buf[..got]).unwrap() {
            assert!(matches!(f.decode_response().unwrap(), Response::Empty(_)));
            return;
        }
    }
}

#[test]
fn pulls_whose_answers_are_never_read_do_not_grow_the_broker_and_go_when_the_connection_does() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    // 64 messages of 64 KiB: each pull answer is 2 MiB (32 messages).
    fill(&addr, "big", 64, 64 * 1024);
    let before = settle_rss(&broker);
    let mut after_rounds = Vec::new();
    for round in 0..3 {
        // Four connections with 2,048 unread pulls each: 16 GiB of answers if held.
        let conns: Vec<TcpStream> = (0..4)
            .map(|_| flood_with_pulls(&addr, "big", 2048))
            .collect();
        let during = settle_rss(&broker);
        assert!(
            during < before + 400,
            "round {round}: {before} MiB before, {during} MiB with unread answers"
        );
        still_serves(&addr);
        drop(conns);
        after_rounds.push(held_rss(&broker, before));
    }
    // What the connections held went with them: rounds do not add up.
    assert!(
        after_rounds[2] < after_rounds[0] + 64,
        "resident MiB after each round: {after_rounds:?} (before: {before})"
    );
}

/// Look-ups by message id pipelined on a connection that never reads their answers (the
/// record read from the disk: no tail cache). Each waits for room for its answer before it
/// reads the record, so the unread ones hold nothing; the broker still serves. Before, each
/// read its record first and held it while it waited: 939 MiB two seconds in, on the way
/// to 3 GiB.
#[test]
fn lookups_by_id_whose_answers_are_never_read_hold_no_records() {
    use ringmq::protocol::MessageById;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = BrokerProcess::start(&data, 1, &["--tail-cache-mb", "0"]);
    let addr = broker.addr_string();
    let msg_id = runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(addr.as_str()));
        let producer = producer.await.unwrap();
        producer.client().create_topic("ids", 1).await.unwrap();
        let sent = producer.send("ids", OutgoingMessage::new(vec![b'i'; 3 << 20]));
        sent.await.unwrap().msg_id
    });
    let before = settle_rss(&broker);
    let mut conn = TcpStream::connect(&addr).unwrap();
    conn.set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    for id in 0..1024 {
        let by_id = MessageById {
            msg_id: msg_id.clone(),
        };
        if conn.write_all(&frame(by_id.into(), id)).is_err() {
            break;
        }
    }
    let during = settle_rss(&broker);
    assert!(
        during < before + 400,
        "{before} MiB before, {during} MiB with unread answers"
    );
    still_serves(&addr);
    drop(conn);
}

/// Transaction listings (about 350 KB each: 1,000 unresolved halves with long names)
/// pipelined on connections that never read their answers (two shards: a listing waits for
/// the other shard's part, so a connection's whole pipeline is taken in before the first
/// answer lands). Each waits for room for the largest answer before it is built, as a
/// lookup does, so the unread ones hold at most the connection's answer budget (32 MiB),
/// and the broker still serves. Before, every listing a connection had in flight was built
/// and queued at once, outside every budget: 1 GB more for these four connections.
#[test]
fn listings_whose_answers_are_never_read_are_built_only_as_there_is_room() {
    use ringmq::client::{TransactionOutcome, TransactionProducer};
    use ringmq::protocol::ListTransactions;
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    let topic = "t".repeat(127);
    // The producer stays to the end: its halves are not checked back meanwhile (the first
    // check is a minute away by default).
    let _producer = runtime().block_on(async {
        let group = "g".repeat(100);
        let unknown = |_: &_| TransactionOutcome::Unknown;
        let tp = TransactionProducer::start(ClientConfig::new(addr.as_str()), &group, unknown);
        let tp = tp.await.unwrap();
        tp.producer()
            .client()
            .create_topic(&topic, 1)
            .await
            .unwrap();
        for _ in 0..1000 {
            let half = OutgoingMessage::new("h");
            let sent = tp.send_in_transaction(&topic, half, |_| TransactionOutcome::Unknown);
            assert_eq!(sent.await.unwrap().outcome, TransactionOutcome::Unknown);
        }
        let listed = tp.producer().client().list_transactions().await.unwrap();
        assert_eq!(listed.halves.len(), 1000);
        tp
    });
    let before = settle_rss(&broker);
    let conns: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut conn = TcpStream::connect(&addr).unwrap();
            conn.set_write_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            // In one write, so that the broker reads them in one pass (it stops reading a
            // connection whose queued answers are over their limit, between passes).
            let all: Vec<u8> = (0..1024)
                .flat_map(|id| frame(ListTransactions {}.into(), id))
                .collect();
            conn.write_all(&all).unwrap();
            conn
        })
        .collect();
    let during = settle_rss(&broker);
    assert!(
        during < before + 400,
        "{before} MiB before, {during} MiB with unread answers"
    );
    still_serves(&addr);
    drop(conns);
}

/// Producer heartbeats naming groups the broker refuses (4 MiB names: a frame under the
/// limit) get `InvalidMessage`, and the connection keeps nothing of them: 64 of them on one
/// open connection held 256 MiB when the name was noted on the connection before it was
/// checked.
#[test]
fn producer_heartbeats_with_refused_group_names_are_answered_and_not_held() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &[]);
    let addr = broker.addr_string();
    let before = settle_rss(&broker);
    let mut conn = TcpStream::connect(&addr).unwrap();
    for id in 0..64u64 {
        let hb = ProducerHeartbeat {
            group: format!("{id:08}{}", "g".repeat(4 << 20)),
            client_id: "hostile".into(),
        };
        match answer_of(&mut conn, hb.into()) {
            Some(Err(e)) => assert_eq!(e.code, ErrorCode::InvalidMessage as u16, "{e:?}"),
            other => panic!("heartbeat {id}: {other:?}"),
        }
    }
    // The connection is still open: nothing it sent may be held.
    let held = held_rss(&broker, before);
    assert!(
        held < before + 64,
        "{before} MiB before, {held} MiB held by one connection after 64 refused heartbeats"
    );
    still_serves(&addr);
    drop(conn);
}

/// The broker's receive buffer between large frames (a frame past it takes room of the
/// shard's receive budget).
const CONN_BASE_BUFFER: usize = 64 * 1024;

/// The header of a 5 MiB `Pull` frame (what follows is up to the caller).
fn announce_5_mib() -> Vec<u8> {
    announce(5 << 20)
}

/// The header of a `Pull` frame of `bytes` (what follows is up to the caller).
fn announce(bytes: u32) -> Vec<u8> {
    let mut head = Vec::new();
    head.extend_from_slice(&bytes.to_le_bytes());
    head.extend_from_slice(&[FRAME_MAGIC, PROTOCOL_VERSION]);
    head.extend_from_slice(&ringmq::protocol::Kind::Pull.as_u16().to_le_bytes());
    head.extend_from_slice(&1u64.to_le_bytes());
    head.extend_from_slice(&0u32.to_le_bytes());
    head.extend_from_slice(&(bytes - FRAME_HEADER_BYTES as u32).to_le_bytes());
    assert_eq!(head.len(), FRAME_HEADER_BYTES);
    head
}

/// Bytes received on loopback connections to `port` that their reader has not read yet, and
/// how many such connections there are (from /proc/net/tcp).
fn unread_on(port: u16) -> (u64, usize) {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let mut unread = (0, 0);
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local_port = fields[1].rsplit(':').next().unwrap();
        // Established connections on the broker's side.
        if u16::from_str_radix(local_port, 16).unwrap() == port && fields[3] == "01" {
            let rx = fields[4].rsplit(':').next().unwrap();
            unread.0 += u64::from_str_radix(rx, 16).unwrap();
            unread.1 += 1;
        }
    }
    unread
}

/// 65 connections each send 4 MiB less a byte of a 5 MiB frame: together they hold their
/// address's share of the shard's receive budget for large frames (64 MiB of 256 MiB) if
/// each takes room as its bytes come.
/// Then each sends one byte more, so that every one needs more room at once. None may hold
/// part of what it needs while waiting for the rest: they used to wait on each other for
/// ever, reading nothing (not even that their peers went), and every large frame on the
/// shard after them waited too. Now each takes its whole frame's room at once: those that
/// got it stall and are closed (`Timeout`), the others are refused (`BrokerBusy`) once
/// their wait passes the connection timeout, and a large send goes through.
#[test]
fn large_frames_stalled_past_the_read_budget_do_not_hold_it_for_ever() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &["--conn-timeout-ms", "3000"]);
    let addr = broker.addr_string();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let mut frame = announce_5_mib();
    frame.resize(4 << 20, 7);
    let frame = std::sync::Arc::new(frame);
    let n = 65;
    let written = std::sync::Arc::new(std::sync::Barrier::new(n + 1));
    let last_byte = std::sync::Arc::new(std::sync::Barrier::new(n + 1));
    let stalled: Vec<_> = (0..n)
        .map(|_| {
            let (addr, frame) = (addr.clone(), frame.clone());
            let (written, last_byte) = (written.clone(), last_byte.clone());
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(&addr).unwrap();
                c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                let sent = c.write_all(&frame[..frame.len() - 1]).is_ok();
                written.wait();
                last_byte.wait();
                if sent {
                    let _ = c.write_all(&frame[frame.len() - 1..]);
                }
                // Open until the broker closes it, with its reason.
                c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut all = Vec::new();
                let _ = c.read_to_end(&mut all);
                let f = FrameDecoder::default().decode(&all).ok().flatten()?;
                match f.decode_response().ok()? {
                    Response::Error(e) => e.error_code(),
                    _ => None,
                }
            })
        })
        .collect();
    written.wait();
    // The broker reads what it will of every connection before the last bytes go: all of
    // it when each takes room as its bytes come (the setting that used to lock up), only
    // what room was found for when each takes its frame's at once, so this is a bounded
    // wait rather than a check (well within the connection timeout).
    let deadline = Instant::now() + Duration::from_secs(2);
    while unread_on(port) != (0, n) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    last_byte.wait();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("big", 1).await.unwrap();
        let started = Instant::now();
        loop {
            let sent = producer
                .send("big", OutgoingMessage::new(vec![1u8; 3 << 20]))
                .await;
            match sent {
                Ok(_) => break,
                Err(e) => assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "a 3 MiB send still fails after {:?}: {e}",
                    started.elapsed()
                ),
            }
        }
    });
    // Every one was closed (a refused one's unread bytes may reset the connection before
    // its error is read); those that had their room stalled and were told so.
    let codes: Vec<Option<ErrorCode>> = stalled.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        codes
            .iter()
            .all(|c| matches!(c, None | Some(ErrorCode::Timeout | ErrorCode::BrokerBusy))),
        "{codes:?}"
    );
    assert!(codes.contains(&Some(ErrorCode::Timeout)), "{codes:?}");
    still_serves(&addr);
}

/// A connection that sends the start of a large frame (taking the frame's room of the
/// shard's receive budget) and then a byte now and then, each within the connection
/// timeout: it is closed once the timeout has passed since the frame's first bytes, not
/// kept for as long as it trickles.
#[test]
fn a_large_frame_trickled_a_byte_at_a_time_is_cut_off_at_the_connection_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &["--conn-timeout-ms", "2000"]);
    let mut c = TcpStream::connect(broker.addr_string()).unwrap();
    let mut start = announce_5_mib();
    start.resize(CONN_BASE_BUFFER + 1, 7);
    c.write_all(&start).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let started = Instant::now();
    let mut all = Vec::new();
    // A byte every 300 ms (the pace is the test, not a wait), until the broker answers
    // and closes.
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still open after {:?} of trickling",
            started.elapsed()
        );
        let _ = c.write_all(&[7]);
        match c.read_to_end(&mut all) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let f = FrameDecoder::default().decode(&all).unwrap().unwrap();
    let Response::Error(e) = f.decode_response().unwrap() else {
        panic!("not an error answer")
    };
    assert_eq!(e.error_code(), Some(ErrorCode::Timeout), "{e}");
    assert!(e.message.contains("did not arrive whole"), "{e}");
    // Named by the frame's request id (its header arrived): a client hands it to the request.
    assert_eq!(f.request_id(), 1);
}

/// Connections to `port` from `remote_ip` (as /proc/net/tcp writes it, e.g. `0200007F` for
/// 127.0.0.2) whose received bytes the broker has all read.
fn read_whole_from(port: u16, remote_ip: &str) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let established = table.lines().skip(1).filter(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local_port = fields[1].rsplit(':').next().unwrap();
        u16::from_str_radix(local_port, 16).unwrap() == port
            && fields[2].starts_with(remote_ip)
            && fields[3] == "01"
            && fields[4].ends_with(":00000000")
    });
    established.count()
}

/// Eighty connections from one address (127.0.0.2) each start a 4 MiB frame and stall: they
/// take no more than that address's share of the shard's receive budget for large frames
/// (a quarter of 256 MiB: sixteen of them, each taking 4 MiB less the 64 KiB base buffer),
/// and a large send from another address (the client on 127.0.0.1) goes through at once.
/// Before, sixty-five of them held all of it and the send waited for the connection
/// timeout (30 s), then was refused.
#[test]
fn large_frames_stalled_from_one_address_leave_room_for_others() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 1, &["--conn-timeout-ms", "30000"]);
    let addr = broker.addr_string();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let mut start = announce(4 << 20);
    start.resize(CONN_BASE_BUFFER + 4096, 7);
    runtime().block_on(async {
        let mut stalled = Vec::new();
        for _ in 0..80 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let mut c = socket.connect(addr.parse().unwrap()).await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut c, &start)
                .await
                .unwrap();
            stalled.push(c);
        }
        // The share's sixteen frames are read past the base buffer.
        let deadline = Instant::now() + Duration::from_secs(10);
        while read_whole_from(port, "0200007F") < 16 {
            assert!(
                Instant::now() < deadline,
                "{}",
                read_whole_from(port, "0200007F")
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let producer = Producer::connect(ClientConfig::new(&addr)).await.unwrap();
        producer.client().create_topic("big", 1).await.unwrap();
        let big = OutgoingMessage::new(vec![1u8; 1 << 20]);
        let sent = tokio::time::timeout(Duration::from_secs(5), producer.send("big", big)).await;
        assert!(matches!(sent, Ok(Ok(_))), "{sent:?}");
        let whole = read_whole_from(port, "0200007F");
        assert!(
            whole <= 17,
            "{whole} stalled frames from one address were given room"
        );
        drop(stalled);
    });
    still_serves(&addr);
}

#[test]
fn huge_announced_frames_stalls_and_silent_connections_hold_little_and_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &["--conn-timeout-ms", "1000"]);
    let addr = broker.addr_string();
    let before = settle_rss(&broker);
    // 400 connections each announce a 5 MiB frame and send 100 bytes of it: 2 GiB if the
    // buffers were sized by the header.
    let mut conns = Vec::new();
    for _ in 0..400 {
        let mut c = TcpStream::connect(&addr).unwrap();
        let mut head = announce_5_mib();
        head.extend_from_slice(&[0u8; 100]);
        c.write_all(&head).unwrap();
        conns.push(c);
    }
    let during = settle_rss(&broker);
    assert!(
        during < before + 200,
        "{before} MiB before, {during} MiB with 400 announced 5 MiB frames"
    );
    // They stalled mid-frame: each is told why and closed.
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut all = Vec::new();
        let _ = c.read_to_end(&mut all);
        let f = FrameDecoder::default().decode(&all).unwrap().unwrap();
        let Response::Error(e) = f.decode_response().unwrap() else {
            panic!("not an error answer")
        };
        assert_eq!(e.error_code(), Some(ErrorCode::Timeout), "{e}");
    }
    // A connection that never sends a frame is closed too.
    let mut silent = TcpStream::connect(&addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut all = Vec::new();
    let _ = silent.read_to_end(&mut all);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!all.is_empty(), "closed with an explanation");
    still_serves(&addr);
}

#[test]
fn connections_past_the_cap_are_refused_with_a_typed_error_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &["--connections-max", "4"]);
    let addr = broker.addr_string();
    // Each held connection is in once its heartbeat is answered.
    let held: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut c = TcpStream::connect(&addr).unwrap();
            assert!(matches!(heartbeat_answer(&mut c), Some(Ok(()))));
            c
        })
        .collect();
    let mut refused = TcpStream::connect(&addr).unwrap();
    refused
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut all = Vec::new();
    let _ = refused.read_to_end(&mut all);
    let f = FrameDecoder::default().decode(&all).unwrap().unwrap();
    let Response::Error(e) = f.decode_response().unwrap() else {
        panic!("not an error answer")
    };
    assert_eq!(e.error_code(), Some(ErrorCode::TooManyConnections), "{e}");
    assert!(e.is_retriable());
    drop(held);
    serves_again(&addr);
}

/// With a low open-file limit the broker says so at start, caps connections below it
/// (descriptors stay for the stores), refuses the ones past the cap with a typed error
/// instead of failing accept in a loop, and keeps storing and checkpointing.
#[test]
fn a_low_open_file_limit_caps_connections_and_keeps_descriptors_for_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = BrokerProcess::start_with_file_limit(&dir.path().join("data"), 2, &[], 512);
    let addr = broker.addr_string();
    assert!(
        broker.stderr().contains("open-file limit is 512"),
        "{}",
        broker.stderr()
    );
    // More connections than the limit leaves room for: each asks once; the ones past the
    // cap are answered with the typed refusal, the others are served.
    let mut conns = Vec::new();
    let mut refused = 0;
    for _ in 0..600 {
        let Ok(c) = TcpStream::connect(&addr) else {
            refused += 1;
            continue;
        };
        conns.push(c);
    }
    for c in &mut conns {
        match heartbeat_answer(c) {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                assert_eq!(e.error_code(), Some(ErrorCode::TooManyConnections), "{e}");
                refused += 1;
            }
            // Closed right after the refusal was written.
            None => refused += 1,
        }
    }
    assert!(refused >= 600 - 512, "refused {refused}");
    drop(conns);
    serves_again(&addr);
    fill(&addr, "fd", 10, 100);
    assert!(broker.stop(), "a clean stop (checkpoint) with the limit");
    let log = broker.stderr();
    assert!(!log.contains("Too many open files"), "{log}");
}

/// Long polls sent to a shard that does not own their queue (from a client that is not
/// shard-aware), on an empty queue, waiting 30 s: they hold no room for their answers while
/// they wait, so a pull of a queue with a message in it is answered at once on either
/// shard. Before, each held room for the largest answer (4 MiB) on the shard of its
/// connection for its whole wait: 70 of them took all of that shard's 256 MiB, and its own
/// pulls waited for them to end.
#[test]
fn forwarded_long_polls_hold_no_answer_room_while_they_wait() {
    use ringmq::client::Client;
    use ringmq::protocol::{route::owner, Handshake};
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    let client = runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(addr.as_str()));
        let client = client.await.unwrap();
        client.create_topic("full", 8).await.unwrap();
        client.create_topic("empty", 8).await.unwrap();
        client
    });
    for q in 0..8 {
        let sent = common::raw::call(&addr, common::raw::send_to("full", q, b"here").into());
        assert!(matches!(sent, Response::SendResult(_)), "{sent:?}");
    }
    // Ten connections on each shard, each with seven polls (what its own room for answers,
    // 32 MiB, holds) of an empty queue the other shard owns.
    let mut polls: [Vec<TcpStream>; 2] = Default::default();
    while polls.iter().any(|on| on.len() < 10) {
        let mut conn = TcpStream::connect(&addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let shard = match common::raw::answer_on(&mut conn, Handshake::new("lp").into()) {
            Some(Response::HandshakeOk(h)) => h.shard_id as usize,
            other => panic!("{other:?}"),
        };
        if polls[shard].len() == 10 {
            continue;
        }
        let queue = (0..8).find(|&q| owner("empty", q, 2) as usize != shard);
        for id in 0..7 {
            let mut pull = Pull::new("empty", queue.unwrap(), 0);
            pull.max_wait_ms = 30_000;
            conn.write_all(&frame(pull.into(), id)).unwrap();
        }
        // Answered after the polls were taken in (a connection's requests are taken in
        // order).
        assert_eq!(heartbeat_answer(&mut conn), Some(Ok(())));
        polls[shard].push(conn);
    }
    runtime().block_on(async {
        for shard in 0..2 {
            let queue = (0..8).find(|&q| owner("full", q, 2) == shard).unwrap();
            let pull = client.pull("full", queue, 0, 32, Duration::ZERO, &[]);
            let pulled = tokio::time::timeout(Duration::from_secs(5), pull).await;
            let pulled = pulled.unwrap_or_else(|_| panic!("shard {shard}: no answer in 5 s"));
            assert_eq!(pulled.unwrap().messages.len(), 1, "shard {shard}");
        }
    });
    drop(polls);
}

/// A new connection, answered by shard `shard` of a broker of two.
fn connection_on(addr: &str, shard: u32) -> TcpStream {
    use ringmq::protocol::Handshake;
    loop {
        let mut conn = TcpStream::connect(addr).unwrap();
        match common::raw::answer_on(&mut conn, Handshake::new("on").into()) {
            Some(Response::HandshakeOk(h)) if h.shard_id == shard => {
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                return conn;
            }
            Some(Response::HandshakeOk(_)) => {}
            other => panic!("{other:?}"),
        }
    }
}

/// Requests sent to another shard than the one that handles them (a queue's sends from a
/// client that is not shard aware) are copied and held until that shard answers. Each
/// connection's requests in flight are bounded by count (1,024); their bytes are bounded
/// per connection (32 MiB) and per shard (256 MiB for large requests, 32 MiB more for small
/// ones): past either, such a request is refused at once with `BrokerBusy` instead of
/// being held too. Before, one connection could have its shard hold 1,024 of the largest
/// frames (5 GiB) while the owner's disk was slow; and small requests (a group heartbeat
/// on a client's bootstrap connection) still pass once large ones fill the shard's part.
#[test]
fn requests_held_for_another_shard_are_bounded_in_bytes() {
    use ringmq::client::Client;
    use ringmq::protocol::route::owner;
    let dir = tempfile::tempdir().unwrap();
    // The owner's first write takes 60 s: what is passed on to it waits for its answer.
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        2,
        &[
            "--testing-write-delay-us",
            "60000000",
            "--send-backlog-max-mb",
            "2048",
            "--send-wait-max-ms",
            "120000",
        ],
    );
    let addr = broker.addr_string();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(addr.as_str())).await;
        client.unwrap().create_topic("far", 8).await.unwrap();
    });
    let (here, there) = (0, 1);
    let queue = (0..8).find(|&q| owner("far", q, 2) == there).unwrap() as i32;
    let body = vec![b'x'; 3 << 20];
    let send = |id| frame(common::raw::send_to("far", queue, &body).into(), id);
    let len = send(0).len();
    let per_conn = (32 << 20) / len;
    let shard_fit = (256 << 20) / len;
    let refusals = |conn: &mut TcpStream, n: usize, first: usize, what: &str| {
        for (id, answer) in common::raw::read_answers(conn, n) {
            assert!(id as usize >= first, "send {id} refused");
            let (code, message) = common::raw::error_of(answer);
            assert_eq!(code, ErrorCode::BrokerBusy, "{message}");
            assert!(message.contains(what), "{message}");
        }
    };
    // One connection: its share, then refusals.
    let mut conns = vec![connection_on(&addr, here)];
    for id in 0..per_conn + 2 {
        conns[0].write_all(&send(id as u64)).unwrap();
    }
    refusals(&mut conns[0], 2, per_conn, "its share is");
    // More connections, each its share, until the shard's part for large requests is full:
    // the last one's sends past it are refused.
    let mut held = per_conn;
    while held + per_conn <= shard_fit {
        let mut conn = connection_on(&addr, here);
        for id in 0..per_conn {
            conn.write_all(&send(id as u64)).unwrap();
        }
        held += per_conn;
        conns.push(conn);
    }
    let mut last = connection_on(&addr, here);
    for id in 0..per_conn {
        last.write_all(&send(id as u64)).unwrap();
    }
    let over = held + per_conn - shard_fit;
    refusals(&mut last, over, per_conn - over, "requests, its limit is");
    // A small request passed on still goes: a pull of the other shard's queue (nothing is
    // readable there while its first write waits).
    let mut small = connection_on(&addr, here);
    let mut pull = Pull::new("far", queue as u32, 0);
    pull.max_wait_ms = 0;
    common::raw::write(&mut small, 1, pull.into());
    let answer = common::raw::read_answer(&mut small);
    assert!(matches!(answer, Response::Pull(_)), "{answer:?}");
    // A send whose queue the broker is to choose is kept on that shard's budget too.
    let any = ringmq::protocol::QUEUE_ID_ANY;
    let send = common::raw::send_to("far", any, vec![b'y'; 1 << 20]);
    common::raw::write(&mut small, 2, send.into());
    let (code, message) = common::raw::error_of(common::raw::read_answer(&mut small));
    assert_eq!(code, ErrorCode::BrokerBusy, "{message}");
    drop(conns);
}

/// Messages sent back for retry with their own record (what a consumer sends when the
/// broker no longer holds the message at its id) hold the record and the copy made of it
/// until the copy is durable: they count in the shard's budget of held requests, so one
/// connection's are refused with `BrokerBusy` past its share (32 MiB) instead of holding
/// 1,024 records of up to 4 MiB twice each while the disk is slow.
#[test]
fn records_sent_back_for_retry_are_held_within_the_connections_share() {
    use ringmq::client::Client;
    use ringmq::protocol::ConsumerSendBack;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A 3 MiB message, stored and read back by a broker whose disk is quick.
    let mut broker = BrokerProcess::start(&data, 1, &[]);
    let addr = broker.addr_string();
    let received = runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(addr.as_str())).await;
        let producer = producer.unwrap();
        producer.client().create_topic("back", 1).await.unwrap();
        let body = vec![b'x'; 3 << 20];
        producer
            .send("back", OutgoingMessage::new(body))
            .await
            .unwrap();
        let client = Client::connect(ClientConfig::new(addr.as_str()))
            .await
            .unwrap();
        let pulled = client
            .pull("back", 0, 0, 1, Duration::ZERO, &[])
            .await
            .unwrap();
        pulled.messages.into_iter().next().unwrap()
    });
    assert!(broker.stop());
    // Again with every write taking 60 s: each send-back's copy waits to be durable.
    let broker = BrokerProcess::start(&data, 1, &["--testing-write-delay-us", "60000000"]);
    let addr = broker.addr_string();
    let mut conn = TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let record = received.view().as_bytes().to_vec();
    for id in 0..8 {
        let back = ConsumerSendBack {
            group: "g".into(),
            msg_id: received.msg_id().encode(),
            delay_level: 1,
            max_reconsume_times: 16,
            reconsumed: 0,
            record_crc: received.view().crc(),
            record: record.clone(),
        };
        conn.write_all(&frame(back.into(), id)).unwrap();
    }
    // Each holds the record twice (6 MiB): five fit in the share, three are refused.
    for (_, answer) in common::raw::read_answers(&mut conn, 3) {
        let (code, message) = common::raw::error_of(answer);
        assert_eq!(code, ErrorCode::BrokerBusy, "{message}");
        assert!(message.contains("its share is"), "{message}");
    }
}

/// Look-ups by key pipelined on a connection that never reads their answers (each answer a
/// 3 MiB message). A shard runs a few look-ups at a time; one done gives its place up
/// before it waits for room for its answer, so another client's look-up is still served,
/// and what the waiting ones found is held within the connection's share (the rest are
/// refused with `BrokerBusy`). Before, four of them waited for room holding the shard's
/// four places, and every other look-up by key on the shard waited behind them.
#[test]
fn lookups_by_key_whose_answers_are_never_read_do_not_stop_anothers() {
    use ringmq::client::Client;
    use ringmq::protocol::MessagesByKey;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = BrokerProcess::start(&data, 1, &["--tail-cache-mb", "0"]);
    let addr = broker.addr_string();
    runtime().block_on(async {
        let producer = Producer::connect(ClientConfig::new(addr.as_str()));
        let producer = producer.await.unwrap();
        producer.client().create_topic("keyed", 1).await.unwrap();
        let big = OutgoingMessage::new(vec![b'k'; 3 << 20]).with_keys(["big"]);
        producer.send("keyed", big).await.unwrap();
        let small = OutgoingMessage::new("s").with_keys(["small"]);
        producer.send("keyed", small).await.unwrap();
    });
    let before = settle_rss(&broker);
    let mut conn = TcpStream::connect(&addr).unwrap();
    conn.set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    for id in 0..256 {
        let by_key = MessagesByKey {
            topic: "keyed".into(),
            key: "big".into(),
            begin_ms: 0,
            end_ms: i64::MAX,
            max_messages: 1,
        };
        if conn.write_all(&frame(by_key.into(), id)).is_err() {
            break;
        }
    }
    let during = settle_rss(&broker);
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(addr.as_str()));
        let client = client.await.unwrap();
        let found = client.messages_by_key("keyed", "small", 0, i64::MAX, 10);
        let found = tokio::time::timeout(Duration::from_secs(10), found).await;
        let found = found.expect("another client's look-up waited behind the unread ones");
        assert_eq!(found.unwrap().len(), 1);
    });
    assert!(
        during < before + 200,
        "{before} MiB before, {during} MiB with unread answers"
    );
    drop(conn);
}

/// A group holds at most 1,024 members: the next one is refused with `LimitReached` (the
/// group-full error mapped to the typed code a client retries on, not `InvalidMessage`),
/// members already in keep refreshing, and one leaving frees its place.
#[test]
fn members_past_a_groups_cap_are_refused_until_one_leaves() {
    use ringmq::protocol::{GroupHeartbeat, Response, SubscriptionData, Unregister};
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"), 2, &[]);
    let addr = broker.addr_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let heartbeat = |member: usize| -> ringmq::protocol::Request {
        GroupHeartbeat {
            group: "full".into(),
            client_id: format!("member-{member}"),
            subscriptions: vec![SubscriptionData {
                topic: "t".into(),
                expression: "*".into(),
                expression_type: ringmq::protocol::EXPRESSION_TAG,
            }],
            consume_mode: ringmq::protocol::CONSUME_MODE_CONCURRENT,
            message_model: ringmq::protocol::MESSAGE_MODEL_CLUSTERING,
            strategy: "averagely".into(),
        }
        .into()
    };
    let mut call = |request: ringmq::protocol::Request| {
        common::raw::write(&mut conn, 1, request);
        common::raw::read_answer(&mut conn)
    };
    for member in 0..1024 {
        match call(heartbeat(member)) {
            Response::Assignment(_) => {}
            other => panic!("member {member}: {other:?}"),
        }
    }
    let (c, m) = common::raw::error_of(call(heartbeat(1024)));
    assert_eq!(c, ErrorCode::LimitReached, "{m}");
    assert!(m.contains("1024"), "{m}");
    assert!(matches!(call(heartbeat(7)), Response::Assignment(_)));
    let leave = Unregister {
        group: "full".into(),
        client_id: "member-7".into(),
    };
    assert!(matches!(call(leave.into()), Response::Empty(_)));
    assert!(matches!(call(heartbeat(1024)), Response::Assignment(_)));
}
