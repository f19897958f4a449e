//! `ringmq send`: sends one message (body from the command line or stdin) with tags, keys,
//! user properties, a sharding key and a delay; prints its message id, queue and queue
//! offset (`scheduled` for a delayed message: it gets its offset when it is delivered).

use std::io::Read;

use clap::Args;
use serde_json::json;

use ringmq::client::{OutgoingMessage, Producer, QUEUE_OFFSET_SCHEDULED};

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
}

pub(crate) async fn run(ctx: &Ctx, args: SendArgs) -> CmdResult {
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
