//! The attacks of perf/abuse.sh: careless or hostile clients, written as raw frames (past the
//! client's own checks) so they work against older brokers too. Each prints one line.
//!
//! ```text
//! abuse fill ADDR TOPIC COUNT SIZE [KEY]      COUNT messages of SIZE bytes in queue 0
//! abuse unread-pulls ADDR TOPIC CONNS PULLS HOLD_S
//!                                            pipelined pulls never read, held, then closed
//! abuse parked-polls ADDR TOPIC CONNS PULLS HOLD_S
//!                                            long polls (30 s) of an empty queue 0 of
//!                                            TOPIC, pipelined, held, then closed
//! abuse lock-flood ADDR CONNS                one LockBatch of 1,024 queues with a 5 MB
//!                                            client id per connection
//! abuse key-lookups ADDR TOPIC KEY CONNS     concurrent lookups by key, answers read
//! abuse many-queues ADDR TOPICS QUEUES SECS  TOPICS x QUEUES queues, a 2-byte send to each,
//!                                            then heartbeats every 100 ms for SECS: the
//!                                            slowest answer
//! abuse commits ADDR TOPIC QUEUES N [RATE]   N offset commits (offset 0) of distinct
//!                                            (group, queue) pairs, pipelined (RATE a
//!                                            second): the offsets file grows past its
//!                                            rewrite size
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ringmq::client::OutgoingMessage;
use ringmq::protocol::{
    encode_request, CommitOffset, CreateTopic, Heartbeat, LockBatch, MessagesByKey, Pull, Request,
    SendMessage, FRAME_HEADER_BYTES,
};

fn frame(request: Request, id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&request, id, &mut out).expect("encode");
    out
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("argument {i}: {what}"))
}

/// Reads one whole answer frame (any size); `None` if the connection ends or stalls.
fn read_frame(conn: &mut TcpStream) -> Option<usize> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    conn.read_exact(&mut header).ok()?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let mut left = len.saturating_sub(FRAME_HEADER_BYTES);
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = conn.read(&mut buf[..left.min(1 << 20)]).ok()?;
        if n == 0 {
            return None;
        }
        left -= n;
    }
    Some(len)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cmd = args.get(1).map(String::as_str).unwrap_or("");
    let addr: String = arg(&args, 2, "broker address");
    match cmd {
        "fill" => {
            let topic: String = arg(&args, 3, "topic");
            let count: u64 = arg(&args, 4, "count");
            let size: usize = arg(&args, 5, "size");
            let mut m = OutgoingMessage::new(Vec::new());
            if let Some(k) = args.get(6) {
                m = m.with_key(k.clone());
            }
            let properties = m.encode_properties().unwrap();
            create_topic(&addr, &topic, 1);
            let sends = (0..count).map(|_| {
                Request::from(SendMessage {
                    topic: topic.clone(),
                    queue_id: 0,
                    flag: 0,
                    properties: properties.clone(),
                    body: vec![b'x'; size],
                    born_timestamp_ms: 0,
                    wait_durable: false,
                })
            });
            let answered = pipeline(&addr, sends);
            println!("filled {topic}: {answered} of {count} x {size} B answered");
        }
        "unread-pulls" => {
            let (written, conns, hold) = held_pulls(&addr, &args, 0);
            println!("unread-pulls: {written} pulls written on {conns} connections, held {hold} s, closed");
        }
        "parked-polls" => {
            create_topic(&addr, &arg::<String>(&args, 3, "topic"), 1);
            let (written, conns, hold) = held_pulls(&addr, &args, 30_000);
            println!("parked-polls: {written} long polls written on {conns} connections, held {hold} s, closed");
        }
        "lock-flood" => {
            let conns: usize = arg(&args, 3, "connections");
            create_topic(&addr, "t", 1024);
            let mut open = Vec::new();
            let mut answered = 0;
            for i in 0..conns {
                let mut c = TcpStream::connect(&addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let lock = LockBatch {
                    group: "g".into(),
                    client_id: format!("{i}{}", "c".repeat(5_000_000)),
                    topic: "t".into(),
                    queues: (0..1024).collect(),
                };
                if c.write_all(&frame(lock.into(), 1)).is_ok() && read_frame(&mut c).is_some() {
                    answered += 1;
                }
                open.push(c);
            }
            println!("lock-flood: {conns} requests of 1,024 queues with a 5 MB client id, {answered} answered");
        }
        "key-lookups" => {
            let topic: String = arg(&args, 3, "topic");
            let key: String = arg(&args, 4, "key");
            let conns: usize = arg(&args, 5, "connections");
            let handles: Vec<_> = (0..conns)
                .map(|_| {
                    let (addr, topic, key) = (addr.clone(), topic.clone(), key.clone());
                    std::thread::spawn(move || {
                        let mut c = TcpStream::connect(&addr).unwrap();
                        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                        let q = MessagesByKey {
                            topic,
                            key,
                            begin_ms: 0,
                            end_ms: i64::MAX,
                            max_messages: 1024,
                        };
                        c.write_all(&frame(q.into(), 1)).unwrap();
                        read_frame(&mut c).unwrap_or(0)
                    })
                })
                .collect();
            let sizes: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            let max = sizes.iter().max().copied().unwrap_or(0);
            println!(
                "key-lookups: {conns} concurrent, largest answer frame {} MB",
                max / 1_000_000
            );
        }
        "many-queues" => {
            let topics: u32 = arg(&args, 3, "topics");
            let queues: u32 = arg(&args, 4, "queues per topic");
            let secs: u64 = arg(&args, 5, "seconds of heartbeats");
            let mut sent = 0;
            for t in 0..topics {
                let name = format!("mq{t}");
                create_topic(&addr, &name, queues);
                // A 2-byte message in each queue.
                let sends = (0..queues).map(|q| {
                    Request::from(SendMessage {
                        topic: name.clone(),
                        queue_id: q as i32,
                        flag: 0,
                        properties: Vec::new(),
                        body: b"hi".to_vec(),
                        born_timestamp_ms: 0,
                        wait_durable: false,
                    })
                });
                sent += pipeline(&addr, sends);
            }
            let mut c = TcpStream::connect(&addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            let started = Instant::now();
            let mut worst = Duration::ZERO;
            let mut id = 0;
            while started.elapsed() < Duration::from_secs(secs) {
                id += 1;
                let t = Instant::now();
                let hb = Heartbeat {
                    client_id: "probe".into(),
                };
                c.write_all(&frame(hb.into(), id)).unwrap();
                if read_frame(&mut c).is_none() {
                    println!("many-queues: heartbeat connection lost");
                    break;
                }
                worst = worst.max(t.elapsed());
                std::thread::sleep(Duration::from_millis(100));
            }
            println!(
                "many-queues: {sent} sends to {topics} x {queues} queues; slowest heartbeat over {secs} s: {} ms",
                worst.as_millis()
            );
        }
        "commits" => {
            let topic: String = arg(&args, 3, "topic");
            let queues: u32 = arg(&args, 4, "queues");
            let n: u64 = arg(&args, 5, "commits");
            // Per second; 0: as fast as the socket takes them.
            let rate: u64 = args.get(6).and_then(|r| r.parse().ok()).unwrap_or(0);
            let mut c = TcpStream::connect(&addr).unwrap();
            let mut reader = c.try_clone().unwrap();
            let counter = std::thread::spawn(move || {
                let mut answers = 0u64;
                while answers < n && read_frame(&mut reader).is_some() {
                    answers += 1;
                }
                answers
            });
            let started = Instant::now();
            let mut batch = Vec::new();
            for i in 0..n {
                let commit = CommitOffset {
                    group: format!("g{}", i / u64::from(queues)),
                    topic: topic.clone(),
                    queue_id: (i % u64::from(queues)) as u32,
                    offset: 0,
                    incarnation: 0,
                    offsets_epoch: None,
                    if_absent: false,
                };
                batch.extend_from_slice(&frame(commit.into(), i));
                if rate > 0 && (i + 1) % (rate / 100).max(1) == 0 {
                    // 100 chunks a second.
                    c.write_all(&batch).unwrap();
                    batch.clear();
                    let due = started + Duration::from_secs_f64((i + 1) as f64 / rate as f64);
                    std::thread::sleep(due.saturating_duration_since(Instant::now()));
                } else if batch.len() > 1 << 16 {
                    c.write_all(&batch).unwrap();
                    batch.clear();
                }
            }
            c.write_all(&batch).unwrap();
            let answers = counter.join().unwrap();
            println!(
                "commits: {answers} of {n} answered in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        _ => {
            eprintln!("usage: see the comment at the top of perf/abuse.rs");
            std::process::exit(2);
        }
    }
}

/// Creates a topic (an existing one is fine).
/// Pulls of queue 0 of TOPIC (args 3-6: TOPIC CONNS PULLS HOLD_S) waiting `wait_ms`,
/// pipelined on CONNS connections and never read, held HOLD_S seconds, then closed.
/// Returns (pulls written, CONNS, HOLD_S).
fn held_pulls(addr: &str, args: &[String], wait_ms: u32) -> (u64, usize, u64) {
    let topic: String = arg(args, 3, "topic");
    let conns: usize = arg(args, 4, "connections");
    let pulls: u64 = arg(args, 5, "pulls per connection");
    let hold: u64 = arg(args, 6, "seconds to hold");
    let mut open = Vec::new();
    let mut written = 0u64;
    for _ in 0..conns {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        for id in 0..pulls {
            let mut pull = Pull::new(&topic, 0, 0);
            pull.max_wait_ms = wait_ms;
            if c.write_all(&frame(pull.into(), id)).is_err() {
                break;
            }
            written += 1;
        }
        open.push(c);
    }
    std::thread::sleep(Duration::from_secs(hold));
    drop(open);
    (written, conns, hold)
}

fn create_topic(addr: &str, topic: &str, queues: u32) {
    let mut c = TcpStream::connect(addr).unwrap();
    let create = CreateTopic {
        topic: topic.to_owned(),
        queue_count: queues,
    };
    c.write_all(&frame(create.into(), 1)).unwrap();
    read_frame(&mut c);
}

/// Writes every request on one connection while a thread reads the answers; returns how
/// many were answered.
fn pipeline(addr: &str, requests: impl Iterator<Item = Request>) -> u64 {
    let mut c = TcpStream::connect(addr).unwrap();
    let mut reader = c.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let counter = std::thread::spawn(move || {
        let mut answered = 0u64;
        let mut expected = None;
        loop {
            if let Ok(n) = rx.try_recv() {
                expected = Some(n);
            }
            if expected.is_some_and(|n| answered >= n) {
                return answered;
            }
            if read_frame(&mut reader).is_none() {
                return answered;
            }
            answered += 1;
        }
    });
    let mut written = 0u64;
    for (id, r) in requests.enumerate() {
        c.write_all(&frame(r, id as u64)).unwrap();
        written += 1;
    }
    tx.send(written).unwrap();
    // Wake the reader if every answer came already.
    let _ = c.write_all(&frame(
        Heartbeat {
            client_id: "x".into(),
        }
        .into(),
        u64::MAX,
    ));
    counter.join().unwrap().min(written)
}
