//! Shared helpers of the integration tests.
#![allow(dead_code)]

pub mod broker;
pub mod built;
pub mod metrics;
pub mod raw;
pub mod txn;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringmq::protocol::record::{PropertiesBuilder, RecordDraft};

/// The code and message of a refusal (panics on success, or an error without a code).
pub fn refused<T: std::fmt::Debug>(
    r: Result<T, ringmq::client::ClientError>,
) -> (ringmq::protocol::ErrorCode, String) {
    match r {
        Err(e) => (
            e.code().unwrap_or_else(|| panic!("no code: {e}")),
            e.to_string(),
        ),
        Ok(v) => panic!("accepted: {v:?}"),
    }
}

/// Broker flags for short transaction check-backs: asked 300 ms after the half message,
/// then every 300 ms, at most 3 times.
pub const FAST_CHECKS: &[&str] = &[
    "--transaction-timeout-ms",
    "300",
    "--transaction-check-interval-ms",
    "300",
    "--transaction-check-max",
    "3",
];

/// Broker flags under which retention keeps about 2 MiB of a shard's log (1 MiB segments),
/// looked at every 300 ms.
pub const SMALL_RETENTION: &[&str] = &[
    "--segment-bytes",
    "1048576",
    "--retention-bytes-max",
    "2097152",
    "--retention-check-interval-ms",
    "300",
];

/// Sends 8 MiB of other messages to `topic` (batches of 64 of 1,000 bytes): past
/// [`SMALL_RETENTION`]'s size limit four times over.
pub async fn send_8_mib(producer: &ringmq::client::Producer, topic: &str) {
    let batch: Vec<ringmq::client::OutgoingMessage> = (0..64)
        .map(|_| ringmq::client::OutgoingMessage::new(vec![b'f'; 1000]))
        .collect();
    for _ in 0..128 {
        producer.send_batch(topic, batch.clone()).await.unwrap();
    }
}

/// Polls `ok` every 100 ms until it holds, for up to 15 s: for what the broker signals in
/// no other way (its metrics, published once a second; a refusal that lasts until its next
/// look at something).
pub fn eventually(what: &str, ok: impl FnMut() -> bool) {
    eventually_within(what, std::time::Duration::from_secs(15), ok)
}

/// [`eventually`], for up to `within`.
pub fn eventually_within(what: &str, within: std::time::Duration, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !ok() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A tokio runtime for a test's client side (two workers, like the test machine's cores).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A message the tests can rebuild from its number alone, so that recovered data can be
/// checked against what was appended.
#[derive(Clone)]
pub struct TestMessage {
    pub topic: String,
    pub queue_id: u32,
    pub properties: Vec<u8>,
    pub body: Vec<u8>,
    pub born_timestamp_ms: i64,
}

impl TestMessage {
    pub fn draft(&self) -> RecordDraft<'_> {
        RecordDraft {
            topic: &self.topic,
            queue_id: self.queue_id,
            flag: (self.body.len() as i32) ^ 0x55,
            sys_flag: 0,
            born_timestamp_ms: self.born_timestamp_ms,
            born_host: "127.0.0.1:9".parse().unwrap(),
            reconsume_times: 0,
            transaction_offset: 0,
            properties: &self.properties,
            body: &self.body,
        }
    }
}

/// Message number `n` of a run with `seed`: body size drawn from `max_body`, random
/// properties, a tag and keys.
pub fn message(seed: u64, n: u64, queues: u32, max_body: usize) -> TestMessage {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(n));
    let len = if max_body > 0 && rng.gen_ratio(1, 20) {
        rng.gen_range(0..=max_body)
    } else {
        rng.gen_range(0..=max_body.min(2048))
    };
    let mut body = vec![0u8; len];
    rng.fill(&mut body[..]);
    if body.len() >= 8 {
        body[..8].copy_from_slice(&n.to_le_bytes());
    }
    let mut p = PropertiesBuilder::new();
    p.put("TAGS", ["TagA", "TagB", "TagC"][(n % 3) as usize])
        .unwrap();
    p.put("KEYS", &format!("key-{} order-{}", n, n % 10))
        .unwrap();
    for i in 0..rng.gen_range(0..4) {
        p.put(&format!("user{i}"), &format!("v{}", rng.gen::<u32>()))
            .unwrap();
    }
    TestMessage {
        topic: format!("topic{}", n % 2),
        queue_id: (n % queues as u64) as u32,
        properties: p.into_bytes(),
        body,
        born_timestamp_ms: 1_700_000_000_000 + n as i64,
    }
}

/// A loopback port free when asked (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback address free when asked.
pub fn free_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// The body of an HTTP GET of `path` at `addr`, whose status must be 200.
pub fn http_get(addr: impl std::net::ToSocketAddrs, path: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// Waits until every spare index file asked for has been made and handed back.
pub async fn spares_made(store: &ringmq::store::MessageStore) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.index_spares_out() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a spare index file not made after 10 s"
        );
        ringmq::io::sleep(std::time::Duration::from_millis(1)).await;
    }
}
