//! The load of perf/txn.sh: PRODUCERS producers x IN_FLIGHT sends in flight for SECS
//! seconds, each a transaction (half message, a no-op local transaction, commit) or a plain
//! send, of SIZE-byte bodies; prints msg/s and the latency of each (from the half's send to
//! the commit's answer, or the send's answer) as p50/p99/max in µs.
//!
//! txn ADDR MODE PRODUCERS IN_FLIGHT SECS SIZE      MODE: plain | txn

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ringmq::client::{
    ClientConfig, OutgoingMessage, Producer, TransactionOutcome, TransactionProducer,
};

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("argument {i}: {what}"))
}

enum Sender {
    Plain(Producer),
    Txn(TransactionProducer),
}

impl Sender {
    async fn one(&self, body: Vec<u8>) -> bool {
        match self {
            Sender::Plain(p) => p.send("perf-txn", OutgoingMessage::new(body)).await.is_ok(),
            Sender::Txn(t) => t
                .send_in_transaction("perf-txn", OutgoingMessage::new(body), |_| {
                    TransactionOutcome::Commit
                })
                .await
                .is_ok_and(|r| r.end_error.is_none()),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr: String = arg(&args, 1, "address");
    let mode: String = arg(&args, 2, "mode");
    let producers: usize = arg(&args, 3, "producers");
    let in_flight: usize = arg(&args, 4, "sends in flight per producer");
    let secs: u64 = arg(&args, 5, "seconds");
    let size: usize = arg(&args, 6, "body size");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut config = ClientConfig::new(&addr);
        config.in_flight_max = config.in_flight_max.max(in_flight);
        let mut senders = Vec::new();
        for p in 0..producers {
            let config = ClientConfig {
                client_id: format!("{}-{p}", config.client_id),
                ..config.clone()
            };
            senders.push(Arc::new(match mode.as_str() {
                "plain" => Sender::Plain(Producer::connect(config).await.unwrap()),
                _ => Sender::Txn(
                    TransactionProducer::start(config, "perf-txn", |_| TransactionOutcome::Commit)
                        .await
                        .unwrap(),
                ),
            }));
        }
        if let Sender::Plain(p) = senders[0].as_ref() {
            let _ = p.client().create_topic("perf-txn", 8).await;
        }
        if let Sender::Txn(t) = senders[0].as_ref() {
            let _ = t.producer().client().create_topic("perf-txn", 8).await;
        }
        let end = Instant::now() + Duration::from_secs(secs);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for s in &senders {
            for _ in 0..in_flight {
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    let mut h = Histogram::<u64>::new(3).unwrap();
                    let mut failed = 0u64;
                    while Instant::now() < end {
                        let t = Instant::now();
                        if s.one(vec![b'x'; size]).await {
                            let _ = h.record(t.elapsed().as_micros() as u64);
                        } else {
                            failed += 1;
                        }
                    }
                    (h, failed)
                }));
            }
        }
        let mut all = Histogram::<u64>::new(3).unwrap();
        let mut failed = 0;
        for t in tasks {
            let (h, f) = t.await.unwrap();
            all.add(&h).unwrap();
            failed += f;
        }
        let took = started.elapsed().as_secs_f64();
        println!(
            "{mode}: {} ok in {took:.1} s: {:.0} msg/s; latency p50 {} µs, p99 {} µs, max {} µs; {failed} failed",
            all.len(),
            all.len() as f64 / took,
            all.value_at_quantile(0.5),
            all.value_at_quantile(0.99),
            all.max()
        );
    });
}
