//! `ringmq topic`: create, update (queue count), delete, list and describe topics.

use clap::Subcommand;
use serde_json::{json, Value};

use crate::output::{emit, emit_json, table, total_row};
use crate::{CmdResult, Ctx};

#[derive(Subcommand, Debug)]
pub(crate) enum TopicCommand {
    /// Create a topic (fails with TopicExists if it exists)
    Create {
        /// Topic name
        name: String,
        /// Number of queues
        #[arg(long, value_name = "N", default_value_t = 8,
              value_parser = clap::value_parser!(u32).range(1..))]
        queues: u32,
    },
    /// Change a topic's queue count (queue counts only grow; groups that consume the topic
    /// start the added queues at their first message)
    Update {
        /// Topic name
        name: String,
        /// New number of queues
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        queues: u32,
    },
    /// Delete a topic
    Delete {
        /// Topic name
        name: String,
    },
    /// List the topics, one per line
    List,
    /// Show a topic's queues: min and max offset and message count per queue, and totals
    Describe {
        /// Topic name
        name: String,
    },
}

pub(crate) async fn run(ctx: &Ctx, command: TopicCommand) -> CmdResult {
    let client = ctx.client().await?;
    match command {
        TopicCommand::Create { name, queues } => {
            client
                .create_topic(&name, queues)
                .await
                .map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({"topic": name, "queues": queues, "created": true}));
            } else {
                emit(&format!("created topic {name} with {queues} queues"));
            }
        }
        TopicCommand::Update { name, queues } => {
            client
                .update_topic(&name, queues)
                .await
                .map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({"topic": name, "queues": queues, "updated": true}));
            } else {
                emit(&format!("updated topic {name}: {queues} queues"));
            }
        }
        TopicCommand::Delete { name } => {
            client.delete_topic(&name).await.map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({"topic": name, "deleted": true}));
            } else {
                emit(&format!("deleted topic {name}"));
            }
        }
        TopicCommand::List => {
            let mut topics = client.list_topics().await.map_err(|e| ctx.fail(e))?;
            topics.sort();
            if ctx.json {
                emit_json(&json!(topics));
            } else if !topics.is_empty() {
                emit(&topics.join("\n"));
            }
        }
        TopicCommand::Describe { name } => {
            let info = client
                .describe_topic(&name)
                .await
                .map_err(|e| ctx.fail(e))?;
            let total: u64 = info
                .queues
                .iter()
                .map(|q| q.max_offset.saturating_sub(q.min_offset))
                .sum();
            if ctx.json {
                let queues: Vec<Value> = info
                    .queues
                    .iter()
                    .map(|q| {
                        json!({
                            "queue": q.queue_id,
                            "min_offset": q.min_offset,
                            "max_offset": q.max_offset,
                            "messages": q.max_offset.saturating_sub(q.min_offset),
                        })
                    })
                    .collect();
                emit_json(&json!({
                    "topic": info.topic,
                    "queue_count": info.queues.len(),
                    "queues": queues,
                    "total_messages": total,
                }));
            } else {
                let mut rows: Vec<Vec<String>> = info
                    .queues
                    .iter()
                    .map(|q| {
                        vec![
                            q.queue_id.to_string(),
                            q.min_offset.to_string(),
                            q.max_offset.to_string(),
                            q.max_offset.saturating_sub(q.min_offset).to_string(),
                        ]
                    })
                    .collect();
                rows.push(total_row(4, total));
                emit(&format!(
                    "topic {}: {} queues, {total} messages\n{}",
                    info.topic,
                    info.queues.len(),
                    table(&["QUEUE", "MIN", "MAX", "MESSAGES"], &rows)
                ));
            }
        }
    }
    Ok(())
}
