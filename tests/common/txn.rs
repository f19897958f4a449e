//! Helpers of the transaction tests (`transactions.rs`, `transaction_checks.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ringmq::client::{
    Client, ClientConfig, ClientError, Message, OutgoingMessage, PullStatus, SendResult,
    TransactionOutcome, TransactionProducer,
};
use ringmq::protocol::ErrorCode;

/// Every message of every queue of `topic`: body → how many times.
pub async fn visible(client: &Client, topic: &str) -> BTreeMap<String, Vec<Message>> {
    let info = client.describe_topic(topic).await.unwrap();
    let mut seen: BTreeMap<String, Vec<Message>> = BTreeMap::new();
    for q in info.queues {
        let mut offset = q.min_offset;
        loop {
            let r = client
                .pull(topic, q.queue_id, offset, 32, Duration::ZERO, &[])
                .await
                .unwrap();
            for m in r.messages {
                seen.entry(String::from_utf8_lossy(m.body()).into_owned())
                    .or_default()
                    .push(m);
            }
            if r.status != PullStatus::Found {
                break;
            }
            offset = r.next_offset;
        }
    }
    seen
}

pub async fn eventually(what: &str, patience: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + patience;
    // Looked at again every 50 ms until the deadline.
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    while !done().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        poll.tick().await;
    }
}

pub fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Err(e) => e.code().unwrap_or_else(|| panic!("no code: {e}")),
        Ok(v) => panic!("accepted: {v:?}"),
    }
}

/// The checker's rule in these tests: by the body's prefix.
pub fn by_body(m: &Message) -> TransactionOutcome {
    let body = String::from_utf8_lossy(m.body());
    if body.starts_with("commit") {
        TransactionOutcome::Commit
    } else if body.starts_with("rollback") {
        TransactionOutcome::Rollback
    } else {
        TransactionOutcome::Unknown
    }
}

/// A transaction producer of `group` whose checker never knows (`Unknown`).
pub async fn unsure_producer(addr: &str, group: &str) -> TransactionProducer {
    TransactionProducer::start(ClientConfig::new(addr), group, |_| {
        TransactionOutcome::Unknown
    })
    .await
    .unwrap()
}

/// Sends `message` to `topic` as a half whose local transaction does not know its outcome
/// (it stays pending until a commit, a rollback or a check says otherwise).
pub async fn pending_half(
    tp: &TransactionProducer,
    topic: &str,
    message: OutgoingMessage,
) -> SendResult {
    tp.send_in_transaction(topic, message, |_| TransactionOutcome::Unknown)
        .await
        .unwrap()
        .send
}
