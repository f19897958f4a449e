//! `ringmq group`: consumer groups: live members and their queues, progress (committed
//! offset, max offset and lag per queue), resetting the offsets to a time, and deleting a
//! group.

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use ringmq::client::Client;

use crate::datetime::{format_ms, parse_rfc3339_ms};
use crate::output::{emit, emit_json, opt_offset, table, total_row};
use crate::{CmdResult, Ctx, Failure};

#[derive(Subcommand, Debug)]
pub(crate) enum GroupCommand {
    /// The group's live members and the queues assigned to each
    Members {
        /// Consumer group
        group: String,
    },
    /// Committed offset, max offset and lag per queue of TOPIC, and the total lag
    Progress {
        /// Consumer group
        group: String,
        /// Topic name
        topic: String,
    },
    /// Move the group's offsets in TOPIC to the first message stored at or after a time
    ///
    /// Every queue's committed offset moves (backwards too); running members re-read their
    /// offsets. Prints the resulting progress. Refused (Conflict) while the group is being
    /// deleted.
    ResetOffset(ResetArgs),
    /// Forget a group: its committed offsets on every shard and its queue locks
    ///
    /// Refused while the group has live members. Frees a place under the broker's
    /// --groups-max; consumers that join under the name again start from their
    /// consume-from setting.
    Delete {
        /// Consumer group
        group: String,
    },
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["timestamp_ms", "time"])))]
pub(crate) struct ResetArgs {
    /// Consumer group
    group: String,
    /// Topic name
    topic: String,
    /// The time, in ms since the UNIX epoch
    #[arg(long, value_name = "MS")]
    timestamp_ms: Option<i64>,
    /// The time, RFC 3339 (e.g. 2024-05-01T12:00:00Z or 2024-05-01T14:00:00.5+02:00)
    #[arg(long, value_name = "RFC3339", value_parser = parse_rfc3339_ms)]
    time: Option<i64>,
}

pub(crate) async fn run(ctx: &Ctx, command: GroupCommand) -> CmdResult {
    let client = ctx.client().await?;
    match command {
        GroupCommand::Members { group } => {
            let info = client
                .group_members(&group)
                .await
                .map_err(|e| ctx.fail(e))?;
            if ctx.json {
                let members: Vec<Value> = info
                    .members
                    .iter()
                    .map(|m| {
                        let topics: Vec<Value> = m
                            .topics
                            .iter()
                            .map(|t| json!({"topic": t.topic, "queues": t.queues}))
                            .collect();
                        json!({"client_id": m.client_id, "topics": topics})
                    })
                    .collect();
                emit_json(&json!({
                    "group": info.group,
                    "generation": info.generation,
                    "members": members,
                }));
            } else {
                let mut s = format!(
                    "group {}: generation {}, {} member{}",
                    info.group,
                    info.generation,
                    info.members.len(),
                    if info.members.len() == 1 { "" } else { "s" }
                );
                for m in &info.members {
                    let _ = write!(s, "\nmember {}", m.client_id);
                    if m.topics.is_empty() {
                        s.push_str("\n  (no queues)");
                    }
                    for t in &m.topics {
                        let queues: Vec<String> = t.queues.iter().map(u32::to_string).collect();
                        let _ = write!(
                            s,
                            "\n  {}: {}",
                            t.topic,
                            if queues.is_empty() {
                                "(no queues)".to_owned()
                            } else {
                                format!("queues {}", queues.join(" "))
                            }
                        );
                    }
                }
                emit(&s);
            }
        }
        GroupCommand::Delete { group } => {
            client.delete_group(&group).await.map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({"group": group, "deleted": true}));
            } else {
                emit(&format!("group {group} deleted"));
            }
        }
        GroupCommand::Progress { group, topic } => {
            print_progress(ctx, &client, &group, &topic, None).await?;
        }
        GroupCommand::ResetOffset(args) => {
            let Some(timestamp_ms) = args.timestamp_ms.or(args.time) else {
                return Err(Failure::Usage("give --timestamp-ms or --time".to_owned()));
            };
            client
                .reset_offset_by_time(&args.group, &args.topic, timestamp_ms)
                .await
                .map_err(|e| ctx.fail(e))?;
            print_progress(ctx, &client, &args.group, &args.topic, Some(timestamp_ms)).await?;
        }
    }
    Ok(())
}

/// Prints the group's progress in the topic; `reset_to`: after a reset to that time.
async fn print_progress(
    ctx: &Ctx,
    client: &Client,
    group: &str,
    topic: &str,
    reset_to: Option<i64>,
) -> CmdResult {
    let progress = client
        .consumer_progress(group, topic)
        .await
        .map_err(|e| ctx.fail(e))?;
    let total: u64 = progress.iter().map(|q| q.lag).sum();
    if ctx.json {
        let queues: Vec<Value> = progress
            .iter()
            .map(|q| {
                json!({
                    "queue": q.queue_id,
                    "committed_offset": q.committed_offset,
                    "max_offset": q.max_offset,
                    "lag": q.lag,
                })
            })
            .collect();
        let mut v = json!({"group": group, "topic": topic, "queues": queues, "total_lag": total});
        if let Some(ms) = reset_to {
            v["reset_to_ms"] = json!(ms);
        }
        emit_json(&v);
    } else {
        let mut rows: Vec<Vec<String>> = progress
            .iter()
            .map(|q| {
                vec![
                    q.queue_id.to_string(),
                    opt_offset(q.committed_offset),
                    q.max_offset.to_string(),
                    q.lag.to_string(),
                ]
            })
            .collect();
        rows.push(total_row(4, total));
        let head = match reset_to {
            Some(ms) => format!(
                "reset group {group} on topic {topic} to {} ({ms} ms)",
                format_ms(ms)
            ),
            None => format!("group {group}, topic {topic}: total lag {total}"),
        };
        emit(&format!(
            "{head}\n{}",
            table(&["QUEUE", "COMMITTED", "MAX", "LAG"], &rows)
        ));
    }
    Ok(())
}
