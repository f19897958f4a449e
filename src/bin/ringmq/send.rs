//! `ringmq send`: sends one message (body from the command line or stdin) with tags, keys,
//! user properties, a sharding key and a delay; prints its message id, queue and queue
//! offset (`scheduled` for a delayed message: it gets its offset when it is delivered).

use std::io::Read;

use clap::Args;
use serde_json::json;

use ringmq::client::{
    OutgoingMessage, Producer, TransactionOutcome, TransactionProducer, QUEUE_OFFSET_SCHEDULED,
};

use crate::output::{emit, emit_json};
use crate::{CmdResult, Ctx, Failure};

#[derive(Args, Debug)]
pub(crate) struct SendArgs {
    /// Topic to send to (created on first use if the broker auto-creates topics)
    topic: String,
    /// The message body (UTF-8 text); `-` reads the body from stdin
    body: String,
    /// The message's tag
    #[arg(long, value_name = "T")]
    tags: Option<String>,
    /// A key for lookups by key (repeat for several; no spaces)
    #[arg(long = "key", value_name = "K")]
    keys: Vec<String>,
    /// A user property, name=value (repeat for several)
    #[arg(long = "property", value_name = "K=V", value_parser = parse_property)]
    properties: Vec<(String, String)>,
    /// Messages with the same sharding key go to the same queue
    #[arg(long, value_name = "S")]
    sharding_key: Option<String>,
    /// Deliver after the broker's delay level N (1-based; by default 1s 5s 10s 30s 1m 2m
    /// 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h)
    #[arg(long, value_name = "N", group = "delay",
          value_parser = clap::value_parser!(u32).range(1..))]
    delay_level: Option<u32>,
    /// Deliver MS milliseconds after the broker stores it
    #[arg(long, value_name = "MS", group = "delay")]
    delay_ms: Option<u64>,
    /// Deliver at TS, in ms since the UNIX epoch (a past time delivers at once)
    #[arg(long, value_name = "TS", group = "delay")]
    deliver_at_ms: Option<u64>,
    /// Send as a transactional message (a half message, invisible until committed), then
    /// end its transaction with this outcome; with `unknown`, stay up answering the
    /// broker's check-backs with --check-answer until the transaction is resolved or
    /// --wait-ms passes
    #[arg(long, value_enum, value_name = "OUTCOME", conflicts_with = "delay")]
    transaction: Option<Outcome>,
    /// With --transaction: how this producer answers the check-backs of its own half
    /// message (others of its group are answered unknown) [default: the --transaction
    /// outcome]
    #[arg(long, value_enum, value_name = "OUTCOME", requires = "transaction")]
    check_answer: Option<Outcome>,
    /// With --transaction: the producer group (check-backs go to its live producers)
    /// [default: ringmq-cli-<pid>-<random>, this run alone]
    #[arg(long, value_name = "G", requires = "transaction")]
    producer_group: Option<String>,
    /// With --transaction: how long to wait for the transaction to be resolved when it is
    /// not at once (unknown, or a commit or rollback that could not be told and is tried
    /// again); past it the command exits 1
    #[arg(
        long,
        value_name = "MS",
        requires = "transaction",
        default_value_t = 60_000
    )]
    wait_ms: u64,
}

/// What `send --transaction` was asked.
struct TxnArgs {
    outcome: Outcome,
    check_answer: Outcome,
    group: String,
    wait_ms: u64,
}

/// A transaction's outcome, as the command line says it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Commit,
    Rollback,
    Unknown,
}

impl Outcome {
    fn client(self) -> TransactionOutcome {
        match self {
            Outcome::Commit => TransactionOutcome::Commit,
            Outcome::Rollback => TransactionOutcome::Rollback,
            Outcome::Unknown => TransactionOutcome::Unknown,
        }
    }
}

pub(crate) async fn run(ctx: &Ctx, args: SendArgs) -> CmdResult {
    let txn = args.transaction.map(|outcome| TxnArgs {
        outcome,
        check_answer: args.check_answer.unwrap_or(outcome),
        // Its own group: a shared one would have this run answer other runs' check-backs.
        group: args.producer_group.clone().unwrap_or_else(|| {
            let random = std::collections::hash_map::RandomState::new();
            let nonce = std::hash::BuildHasher::hash_one(&random, std::process::id()) as u32;
            format!("ringmq-cli-{}-{nonce:08x}", std::process::id())
        }),
        wait_ms: args.wait_ms,
    });
    let body = if args.body == "-" {
        let mut body = Vec::new();
        std::io::stdin()
            .read_to_end(&mut body)
            .map_err(|e| Failure::Failed(format!("reading the body from stdin: {e}")))?;
        body
    } else {
        args.body.into_bytes()
    };
    let mut message = OutgoingMessage::new(body).with_keys(args.keys);
    if let Some(tags) = args.tags {
        message = message.with_tags(tags);
    }
    for (name, value) in args.properties {
        message = message.with_property(name, value);
    }
    if let Some(key) = args.sharding_key {
        message = message.with_sharding_key(key);
    }
    if let Some(level) = args.delay_level {
        message = message.with_delay_level(level);
    } else if let Some(ms) = args.delay_ms {
        message = message.with_delay_ms(ms);
    } else if let Some(at) = args.deliver_at_ms {
        message = message.with_deliver_at_ms(at);
    }
    // Refuse a bad message before connecting: a usage error, not a broker one.
    message.validate().map_err(|e| ctx.fail(e))?;
    if let Some(txn) = txn {
        return send_in_transaction(ctx, &args.topic, message, txn).await;
    }
    let producer = Producer::connect(ctx.config())
        .await
        .map_err(|e| ctx.fail(e))?;
    let sent = producer
        .send(&args.topic, message)
        .await
        .map_err(|e| ctx.fail(e))?;
    let scheduled = sent.queue_offset == QUEUE_OFFSET_SCHEDULED;
    if ctx.json {
        emit_json(&json!({
            "topic": args.topic,
            "msg_id": sent.msg_id,
            "queue": sent.queue_id,
            "offset": (!scheduled).then_some(sent.queue_offset),
            "scheduled": scheduled,
        }));
    } else {
        let offset = if scheduled {
            "scheduled".to_owned()
        } else {
            sent.queue_offset.to_string()
        };
        emit(&format!(
            "msg_id={} queue={} offset={offset}",
            sent.msg_id, sent.queue_id
        ));
    }
    Ok(())
}

/// `send --transaction`: the half message, its outcome, and with `unknown` the check-backs
/// until the broker has resolved it.
async fn send_in_transaction(
    ctx: &Ctx,
    topic: &str,
    message: OutgoingMessage,
    args: TxnArgs,
) -> CmdResult {
    let outcome = args.outcome;
    let answer = args.check_answer.client();
    // Only its own half is answered (known once sent); any other of the group is unknown.
    let ours = std::sync::Arc::new(std::sync::OnceLock::<String>::new());
    let mine = ours.clone();
    let tp = TransactionProducer::start(ctx.config(), &args.group, move |half| match mine.get() {
        Some(id) if *id == half.msg_id().to_string() => answer,
        _ => TransactionOutcome::Unknown,
    })
    .await
    .map_err(|e| ctx.fail(e))?;
    let r = tp
        .send_in_transaction(topic, message, |_| outcome.client())
        .await
        .map_err(|e| ctx.fail(e))?;
    let _ = ours.set(r.send.msg_id.clone());
    let id = r.send.transaction_id;
    let said = format!("transaction {id} (msg_id {})", r.send.msg_id);
    // What this run asks for: the outcome it tells, else the one its checker answers.
    let intended = match outcome {
        Outcome::Unknown => args.check_answer,
        told => told,
    };
    let mut resolved = match r.end_error {
        None => outcome != Outcome::Unknown,
        Some(e) if e.is_retriable() => {
            eprintln!(
                "ringmq: {said}: telling the outcome failed ({e}); the broker will ask again"
            );
            false
        }
        // Refused for good (resolved otherwise, or discarded with its topic): nothing asks
        // again.
        Some(e) => match settled(&said, intended, Err(e)) {
            Ok(()) => true,
            Err(failure) => {
                tp.shutdown().await;
                return Err(failure);
            }
        },
    };
    if !resolved {
        // Stay up to answer check-backs until the broker no longer lists the transaction.
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(args.wait_ms);
        let client = tp.producer().client().clone();
        while std::time::Instant::now() < deadline {
            let list = match client.list_transactions().await {
                Ok(list) => list,
                Err(e) => {
                    tp.shutdown().await;
                    return Err(Failure::Failed(format!(
                        "{said}: listing the unresolved transactions failed: {e}"
                    )));
                }
            };
            // Past 1,000 unresolved the list holds the oldest: this one is resolved if it is
            // not listed while a later one of its queue (so of its shard) is.
            let of_its_queue = |h: &&ringmq::protocol::HalfMessageInfo| {
                h.topic == topic && h.queue_id == r.send.queue_id
            };
            let listed = list
                .halves
                .iter()
                .filter(of_its_queue)
                .any(|h| h.transaction_id == id);
            let later_listed = list
                .halves
                .iter()
                .filter(of_its_queue)
                .any(|h| h.transaction_id > id);
            let whole = list.halves.len() as u64 == list.unresolved;
            if !listed && (whole || later_listed) {
                if intended == Outcome::Unknown {
                    // Whichever outcome (another producer of the group answered).
                    resolved = true;
                    break;
                }
                // Not listed is not yet as asked (discarded: its topic deleted, its checks
                // used up, past retention). The broker confirms: an outcome for a resolved
                // transaction is answered Ok when it is the one it had, TransactionResolved
                // naming it when not (after any resolution under way).
                let queue = r.send.queue_id;
                match tp.end(topic, queue, id, intended.client(), false).await {
                    Err(e) if e.is_retriable() => {}
                    told => {
                        if let Err(failure) = settled(&said, intended, told) {
                            tp.shutdown().await;
                            return Err(failure);
                        }
                        resolved = true;
                        break;
                    }
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    if ctx.json {
        emit_json(&json!({
            "topic": topic,
            "msg_id": r.send.msg_id,
            "queue": r.send.queue_id,
            "transaction_id": id,
            "outcome": format!("{:?}", outcome).to_lowercase(),
            "resolved": resolved,
        }));
    } else {
        emit(&format!(
            "msg_id={} queue={} transaction={id} outcome={} resolved={resolved}",
            r.send.msg_id,
            r.send.queue_id,
            format!("{outcome:?}").to_lowercase()
        ));
    }
    tp.shutdown().await;
    if resolved {
        Ok(())
    } else {
        Err(Failure::Failed(format!(
            "transaction {id} was not resolved within {} ms",
            args.wait_ms
        )))
    }
}

/// Whether transaction `said`'s end, as the broker answered it, is what the run asked for
/// (`intended`): its own outcome, or for a rollback a half discarded or whose topic went
/// (nothing delivered either way); a failure naming what happened instead if not.
fn settled(
    said: &str,
    intended: Outcome,
    told: Result<(), ringmq::client::ClientError>,
) -> Result<(), Failure> {
    use ringmq::protocol::ErrorCode;
    let Err(e) = told else { return Ok(()) };
    let nothing_delivered = matches!(
        e.code(),
        Some(ErrorCode::TopicNotFound | ErrorCode::QueueNotFound)
    ) || (e.code() == Some(ErrorCode::TransactionResolved)
        // The broker's words for a discarded half (`outcome_name`).
        && e.to_string().contains("was discarded"));
    if intended == Outcome::Rollback && nothing_delivered {
        return Ok(());
    }
    let asked = match intended {
        Outcome::Commit => "committed",
        Outcome::Rollback => "rolled back",
        Outcome::Unknown => "resolved",
    };
    Err(Failure::Failed(format!(
        "{said}: {e}; not {asked} as asked (`ringmq transaction list` shows the halves the broker \
         discarded)"
    )))
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("expected name=value, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_parse() {
        assert_eq!(parse_property("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_property("a="), Ok(("a".into(), String::new())));
        assert!(parse_property("=b").is_err());
        assert!(parse_property("ab").is_err());
    }
}
