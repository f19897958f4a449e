//! `ringmq offset`: a consumer group's committed offsets in a topic: query them, or commit
//! one.

use clap::Subcommand;
use serde_json::{json, Value};

use crate::output::{emit, emit_json, opt_offset, table};
use crate::{CmdResult, Ctx};

#[derive(Subcommand, Debug)]
pub(crate) enum OffsetCommand {
    /// GROUP's committed offset in every queue of TOPIC (`-`: none committed)
    Query {
        /// Consumer group
        group: String,
        /// Topic name
        topic: String,
    },
    /// Commit OFFSET as GROUP's offset of queue QUEUE of TOPIC
    ///
    /// Committed offsets only move forward: an OFFSET below the one committed is not
    /// committed (the command fails, naming the offset kept). `ringmq group reset-offset`
    /// moves a group back, by time.
    Commit {
        /// Consumer group
        group: String,
        /// Topic name
        topic: String,
        /// Queue id
        queue: u32,
        /// The next offset the group will consume
        offset: u64,
    },
}

pub(crate) async fn run(ctx: &Ctx, command: OffsetCommand) -> CmdResult {
    let client = ctx.client().await?;
    match command {
        OffsetCommand::Query { group, topic } => {
            let info = client
                .describe_topic(&topic)
                .await
                .map_err(|e| ctx.fail(e))?;
            let mut committed = Vec::with_capacity(info.queues.len());
            for q in &info.queues {
                let offset = client
                    .query_offset(&group, &topic, q.queue_id)
                    .await
                    .map_err(|e| ctx.fail(e))?;
                committed.push((q.queue_id, offset));
            }
            if ctx.json {
                let queues: Vec<Value> = committed
                    .iter()
                    .map(|(q, o)| json!({"queue": q, "committed_offset": o}))
                    .collect();
                emit_json(&json!({"group": group, "topic": topic, "queues": queues}));
            } else {
                let rows: Vec<Vec<String>> = committed
                    .iter()
                    .map(|(q, o)| vec![q.to_string(), opt_offset(*o)])
                    .collect();
                emit(&format!(
                    "group {group}, topic {topic}\n{}",
                    table(&["QUEUE", "COMMITTED"], &rows)
                ));
            }
        }
        OffsetCommand::Commit {
            group,
            topic,
            queue,
            offset,
        } => {
            // The broker keeps a higher offset committed (offsets only move forward) and
            // says nothing of it: asked first, so that a lower one is not reported done.
            // Best effort: a member's commit past OFFSET between the two goes unseen
            // (asked after, it would read as a refusal).
            let kept =
                (client.query_offset(&group, &topic, queue).await).map_err(|e| ctx.fail(e))?;
            if let Some(kept) = kept.filter(|&kept| kept > offset) {
                return Err(crate::Failure::Failed(format!(
                    "group {group} keeps offset {kept} on {topic} queue {queue}: committed offsets only move forward (`ringmq group reset-offset` moves a group back, by time)"
                )));
            }
            client
                .commit_offset(&group, &topic, queue, offset)
                .await
                .map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({
                    "group": group, "topic": topic, "queue": queue,
                    "committed_offset": offset,
                }));
            } else {
                emit(&format!(
                    "committed offset {offset} for group {group} on {topic} queue {queue}"
                ));
            }
        }
    }
    Ok(())
}
