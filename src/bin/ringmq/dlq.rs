//! `ringmq dlq`: a consumer group's dead-letter topic (`%DLQ%<group>`): list the messages
//! there (with the topic they came from, how often they were retried, when they were
//! stored) and resend them to their original topic.

use clap::Subcommand;
use serde_json::{json, Value};

use ringmq::client::{Client, Message, OutgoingMessage, Producer};
use ringmq::protocol::names::dlq_topic;
use ringmq::protocol::record::prop;
use ringmq::protocol::ErrorCode;

use crate::consume::{step, Step};
use crate::datetime::format_ms;
use crate::output::{body_text, emit, emit_json, table};
use crate::{CmdResult, Ctx};

/// Messages asked for per pull while reading the dead-letter topic.
const PULL_BATCH: u32 = 32;

#[derive(Subcommand, Debug)]
pub(crate) enum DlqCommand {
    /// The group's dead letters: DLQ offset, message id, original topic, reconsume times,
    /// store time and body
    List {
        /// Consumer group
        group: String,
        /// Start at this offset of the dead-letter queue
        #[arg(long, value_name = "N", default_value_t = 0)]
        from_offset: u64,
        /// Show bodies as hex instead of UTF-8 text
        #[arg(long)]
        hex: bool,
        /// List at most this many (the output then says the offset to continue from)
        #[arg(long, value_name = "N", default_value_t = 1000,
              value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
    },
    /// Send dead letters back to the topic they came from (body, tags, keys, flag and user
    /// properties as they were; ORIGIN_MESSAGE_ID kept), a pull of 32 at a time, up to where
    /// the dead-letter queue ended when it began (letters that fail again and come back are
    /// for another run). Prints one line per message and the offset to continue from (also
    /// when it fails part way: a letter whose send timed out may have been resent); the
    /// dead letters stay where they are. Where a resend ended is kept on the broker (as the
    /// group's committed offset of its dead-letter topic, which `group progress` and the
    /// lag metric then show for it): the next resend goes on from there. Two resends of a
    /// group run at once both start there, and send the same letters
    Resend {
        /// Consumer group
        group: String,
        /// Only this message (its id on the dead-letter topic, or its original id; hex digits
        /// in either case), looked for from the first letter (or --from-offset); where
        /// resends got to is neither used nor moved
        #[arg(long, value_name = "ID")]
        msg_id: Option<String>,
        /// Start at this offset of the dead-letter queue [default: where the last resend
        /// ended, else 0]; 0 resends every letter still kept again
        #[arg(long, value_name = "N")]
        from_offset: Option<u64>,
    },
}

pub(crate) async fn run(ctx: &Ctx, command: DlqCommand) -> CmdResult {
    match command {
        DlqCommand::List {
            group,
            from_offset,
            hex,
            limit,
        } => {
            let client = ctx.client().await?;
            let mut reader = Letters::new(ctx, &client, &group, from_offset);
            let mut letters = Vec::new();
            // Where a later list goes on, when the limit stopped this one.
            let mut more = None;
            while let Some(batch) = reader.next().await? {
                for m in batch {
                    if letters.len() as u64 == limit {
                        more = Some(m.queue_offset());
                        break;
                    }
                    letters.push(m);
                }
                if more.is_some() {
                    break;
                }
            }
            if ctx.json {
                let list: Vec<Value> = letters.iter().map(|m| letter_json(m, hex)).collect();
                let next = more.unwrap_or(reader.offset);
                emit_json(&json!({ "group": group, "messages": list, "next_offset": next }));
            } else if letters.is_empty() {
                emit(&format!("group {group} has no dead letters"));
            } else {
                let rows: Vec<Vec<String>> = letters
                    .iter()
                    .map(|m| {
                        vec![
                            m.queue_offset().to_string(),
                            m.msg_id().encode(),
                            m.origin_topic().to_owned(),
                            m.reconsume_times().to_string(),
                            format_ms(m.store_timestamp_ms()),
                            body_text(m.body(), hex, true),
                        ]
                    })
                    .collect();
                let headers = ["offset", "msg_id", "topic", "reconsumed", "stored", "body"];
                emit(&table(&headers, &rows));
                if let Some(next) = more {
                    emit(&format!("first {limit} listed; more: --from-offset {next}"));
                }
            }
            Ok(())
        }
        DlqCommand::Resend {
            group,
            msg_id,
            from_offset,
        } => {
            let producer = Producer::connect(ctx.config())
                .await
                .map_err(|e| ctx.fail(e))?;
            let topic = dlq_topic(&group);
            // A single letter is looked for from the first one; a whole resend goes on
            // from where the last one ended (kept as the group's committed offset there).
            let from_offset = match (from_offset, &msg_id) {
                (Some(offset), _) => offset,
                (None, Some(_)) => 0,
                (None, None) => match producer.client().query_offset(&group, &topic, 0).await {
                    Ok(kept) => kept.unwrap_or(0),
                    // No dead letters yet: the topic is created with the first one.
                    Err(e) if e.code() == Some(ErrorCode::TopicNotFound) => 0,
                    Err(e) => return Err(ctx.fail(e)),
                },
            };
            // Read and resent a pull at a time (up to where the queue ended when the read
            // began: letters that fail again and come back are not resent in this run);
            // only the JSON output's lines are kept.
            let mut reader = Letters::new(ctx, producer.client(), &group, from_offset);
            let (mut count, mut resent) = (0u64, Vec::new());
            // The first letter not resent yet (where a run that fails should go on from).
            let mut next = from_offset;
            let outcome: CmdResult = async {
                while let Some(batch) = reader.next().await? {
                    let chosen = batch.iter().filter(|m| {
                        msg_id.as_deref().is_none_or(|id| {
                            let same = |other: &str| same_id(id, other);
                            same(&m.msg_id().encode()) || m.origin_msg_id().is_some_and(same)
                        })
                    });
                    for m in chosen {
                        next = m.queue_offset();
                        let topic = m.origin_topic().to_owned();
                        let sent = producer
                            .send(&topic, original(m))
                            .await
                            .map_err(|e| ctx.fail(e))?;
                        count += 1;
                        if ctx.json {
                            resent.push(json!({
                                "dlq_offset": m.queue_offset(),
                                "dlq_msg_id": m.msg_id().encode(),
                                "topic": topic,
                                "msg_id": sent.msg_id,
                            }));
                        } else {
                            emit(&format!(
                                "resent {} (dlq offset {}) to {topic} as {}",
                                m.msg_id().encode(),
                                m.queue_offset(),
                                sent.msg_id
                            ));
                        }
                    }
                    next = reader.offset;
                }
                Ok(())
            }
            .await;
            // Where the next resend goes on from (a single letter's resend moves nothing).
            let kept = if msg_id.is_none() && next > from_offset {
                (producer.client().commit_offset(&group, &topic, 0, next).await).map_err(|e| {
                    crate::Failure::Failed(format!(
                        "{count} resent, but where the resend ended was not kept ({e}): a resend without --from-offset {next} would send them again"
                    ))
                })
            } else {
                Ok(())
            };
            let outcome = outcome.and(kept);
            if let Err(e) = outcome {
                // What was resent before the failure, and where to go on from.
                if ctx.json {
                    emit_json(&json!({ "group": group, "resent": resent, "next_offset": next }));
                } else {
                    emit(&format!(
                        "{count} resent before the failure; next: --from-offset {next}"
                    ));
                }
                return Err(e);
            }
            if let Some(id) = &msg_id {
                if count == 0 {
                    return Err(crate::Failure::Failed(format!(
                        "no dead letter of group {group} has id {id}"
                    )));
                }
            }
            if ctx.json {
                emit_json(&json!({ "group": group, "resent": resent, "next_offset": next }));
            } else {
                emit(&format!("{count} resent; next: --from-offset {next}"));
            }
            Ok(())
        }
    }
}

/// Whether `--msg-id`'s `id` names `other`: hex digits in either case, as `ringmq message
/// id` takes them; exactly otherwise (an original id a producer set may be any text).
fn same_id(id: &str, other: &str) -> bool {
    let hex = id.bytes().all(|b| b.is_ascii_hexdigit());
    other == id || (hex && other.eq_ignore_ascii_case(id))
}

/// A group's dead letters read a pull at a time (never all held at once: a dead-letter
/// queue may hold millions).
struct Letters<'a> {
    ctx: &'a Ctx,
    client: &'a Client,
    topic: String,
    /// Where the next pull starts; after the last batch, the offset after the last one.
    offset: u64,
    /// Where the queue ended at the first pull: letters appended since (a resend's
    /// messages failing again) are not read.
    end: Option<u64>,
    done: bool,
}

impl<'a> Letters<'a> {
    fn new(ctx: &'a Ctx, client: &'a Client, group: &str, from: u64) -> Letters<'a> {
        Letters {
            ctx,
            client,
            topic: dlq_topic(group),
            offset: from,
            end: None,
            done: false,
        }
    }

    /// The next pull's dead letters (perhaps none, where retention took some); `None` past
    /// the last one.
    async fn next(&mut self) -> CmdResult<Option<Vec<Message>>> {
        if self.done {
            return Ok(None);
        }
        let pulled = match self
            .client
            .pull(
                &self.topic,
                0,
                self.offset,
                PULL_BATCH,
                std::time::Duration::ZERO,
                &[],
            )
            .await
        {
            Ok(p) => p,
            // No dead letters yet: the topic is created with the first one.
            Err(e) if e.code() == Some(ErrorCode::TopicNotFound) => {
                self.done = true;
                return Ok(None);
            }
            Err(e) => return Err(self.ctx.fail(e)),
        };
        let end = *self.end.get_or_insert(pulled.max_offset);
        // Below the queue's first kept offset (retention took the oldest dead letters), the
        // pull answers where it starts: read on from there, as `consume` does.
        match step(pulled.status, self.offset, pulled.next_offset) {
            Step::Continue(next) => self.offset = next,
            Step::Drained => {
                self.offset = pulled.next_offset;
                self.done = true;
            }
        }
        if self.offset >= end {
            self.offset = self.offset.min(end.max(pulled.min_offset));
            self.done = true;
        }
        let mut messages = pulled.messages;
        messages.retain(|m| m.queue_offset() < end);
        Ok(Some(messages))
    }
}

/// The message as it was first sent, from its dead-letter copy.
fn original(m: &Message) -> OutgoingMessage {
    let system = [prop::TAGS, prop::KEYS, prop::RETRY_TOPIC];
    let mut out = OutgoingMessage::new(m.body().to_vec())
        .with_keys(m.keys().map(str::to_owned))
        .with_flag(m.flag());
    if let Some(tags) = m.tags() {
        out = out.with_tags(tags);
    }
    for (name, value) in m.properties().iter() {
        if !system.contains(&name) && !prop::DELAY_PROPERTIES.contains(&name) {
            out = out.with_property(name, value);
        }
    }
    out
}

fn letter_json(m: &Message, hex: bool) -> Value {
    let mut v = json!({
        "offset": m.queue_offset(),
        "msg_id": m.msg_id().encode(),
        "origin_msg_id": m.origin_msg_id(),
        "topic": m.origin_topic(),
        "reconsume_times": m.reconsume_times(),
        "store_timestamp_ms": m.store_timestamp_ms(),
        "tags": m.tags(),
    });
    v["body"] = Value::String(body_text(m.body(), hex, false));
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_in_hex_match_in_either_case_and_other_text_exactly() {
        use super::same_id;
        assert!(same_id("00AB12", "00AB12"));
        assert!(same_id("00ab12", "00AB12"));
        assert!(!same_id("00ab13", "00AB12"));
        assert!(same_id("order-7", "order-7"));
        assert!(!same_id("order-7", "ORDER-7"));
    }
}
