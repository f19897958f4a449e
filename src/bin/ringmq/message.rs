//! `ringmq message`: looks messages up by message id, by key (in a time range) or by queue
//! offset, and prints them in full.

use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::Value;

use ringmq::client::{Message, MessageId, PullStatus};

use crate::output::{emit, emit_json, message_json, message_text};
use crate::{CmdResult, Ctx, Failure};

/// Most messages a key lookup may ask for (the broker's limit).
const KEY_MAX_LIMIT: u32 = 1024;

#[derive(Subcommand, Debug)]
pub(crate) enum MessageCommand {
    /// The message with this id (fails when there is none)
    Id {
        /// Message id (32 hex digits, as `send` prints it; case does not matter). A delayed
        /// or transactional send's id names the record the broker holds: the message
        /// delivered or committed gets an id of its own (found by key)
        msg_id: String,
        #[command(flatten)]
        show: ShowArgs,
    },
    /// Messages of TOPIC with key KEY, newest first (fails when there are none)
    Key {
        /// Topic name
        topic: String,
        /// One of the message's keys
        key: String,
        /// Only messages stored at or after this time (ms since the UNIX epoch)
        #[arg(long, value_name = "MS", default_value_t = 0)]
        begin_ms: i64,
        /// Only messages stored at or before this time (ms since the UNIX epoch; default: no
        /// limit)
        #[arg(long, value_name = "MS")]
        end_ms: Option<i64>,
        /// Most messages to show
        #[arg(long, value_name = "N", default_value_t = 32,
              value_parser = clap::value_parser!(u32).range(1..=KEY_MAX_LIMIT as i64))]
        max: u32,
        #[command(flatten)]
        show: ShowArgs,
    },
    /// The message at OFFSET of queue QUEUE of TOPIC (fails when there is none)
    Offset {
        /// Topic name
        topic: String,
        /// Queue id
        queue: u32,
        /// Queue offset of the message
        offset: u64,
        #[command(flatten)]
        show: ShowArgs,
    },
}

#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct ShowArgs {
    /// Show bodies as hex instead of UTF-8 text (invalid UTF-8 is otherwise replaced)
    #[arg(long)]
    hex: bool,
}

pub(crate) async fn run(ctx: &Ctx, command: MessageCommand) -> CmdResult {
    let client = ctx.client().await?;
    match command {
        MessageCommand::Id { msg_id, show } => {
            // Ids are upper-case hex; accept a lower-case copy too (errors quote the input).
            let upper = msg_id.to_ascii_uppercase();
            let msg_id = if MessageId::parse(&upper).is_ok() {
                upper
            } else {
                msg_id
            };
            let found = client
                .message_by_id(&msg_id)
                .await
                .map_err(|e| ctx.fail(e))?;
            match found {
                Some(m) => print_messages(ctx, &[m], show, false),
                None => Err(Failure::Failed(format!(
                    "no message with id {msg_id} (a delayed or transactional send's id names the record the broker holds until delivery or commit; the message delivered gets an id of its own: look it up by key)"
                ))),
            }
        }
        MessageCommand::Key {
            topic,
            key,
            begin_ms,
            end_ms,
            max,
            show,
        } => {
            let end_ms = end_ms.unwrap_or(i64::MAX);
            if end_ms < begin_ms {
                return Err(Failure::Usage(format!(
                    "--end-ms {end_ms} is before --begin-ms {begin_ms}"
                )));
            }
            let found = client
                .messages_by_key(&topic, &key, begin_ms, end_ms, max)
                .await
                .map_err(|e| ctx.fail(e))?;
            if found.is_empty() {
                return Err(Failure::Failed(format!(
                    "no message of topic {topic} with key {key}"
                )));
            }
            print_messages(ctx, &found, show, true)
        }
        MessageCommand::Offset {
            topic,
            queue,
            offset,
            show,
        } => {
            let pulled = client
                .pull(&topic, queue, offset, 1, Duration::ZERO, &[])
                .await
                .map_err(|e| ctx.fail(e))?;
            match pulled.messages.into_iter().next() {
                Some(m) if pulled.status == PullStatus::Found && m.queue_offset() == offset => {
                    print_messages(ctx, &[m], show, false)
                }
                _ => Err(Failure::Failed(format!(
                    "no message at offset {offset} of {topic} queue {queue} (it holds offsets \
                     {}..{})",
                    pulled.min_offset, pulled.max_offset
                ))),
            }
        }
    }
}

/// Prints messages in full: text blocks separated by blank lines, or JSON (`as_list`: an
/// array even for one message).
fn print_messages(ctx: &Ctx, messages: &[Message], show: ShowArgs, as_list: bool) -> CmdResult {
    if ctx.json {
        let values: Vec<Value> = messages.iter().map(|m| message_json(m, show.hex)).collect();
        if as_list {
            emit_json(&Value::Array(values));
        } else if let Some(v) = values.into_iter().next() {
            emit_json(&v);
        }
        return Ok(());
    }
    let blocks: Vec<String> = messages.iter().map(|m| message_text(m, show.hex)).collect();
    emit(&blocks.join("\n\n"));
    Ok(())
}
