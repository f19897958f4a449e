//! `ringmq schedule`: the broker's schedules of delayed messages (delay levels, delays,
//! delivery times, and retries waiting on retry topics), one per shard.

use clap::Subcommand;
use serde_json::{json, Value};

use crate::datetime::format_ms;
use crate::output::{emit, emit_json, table};
use crate::{CmdResult, Ctx};

#[derive(Subcommand, Debug)]
pub(crate) enum ScheduleCommand {
    /// Per shard: messages waiting, being delivered, overdue, the next due time, delivered
    /// since start, parked (waiting for a target topic that does not exist), and
    /// undeliverable since start (moved to %UNDELIVERABLE% after waiting, or unreadable)
    Stats,
}

pub(crate) async fn run(ctx: &Ctx, command: ScheduleCommand) -> CmdResult {
    match command {
        ScheduleCommand::Stats => {
            let client = ctx.client().await?;
            let shards = client.schedule_stats().await.map_err(|e| ctx.fail(e))?;
            if ctx.json {
                let list: Vec<Value> = shards
                    .iter()
                    .map(|s| {
                        json!({
                            "shard": s.shard,
                            "pending": s.pending,
                            "in_flight": s.in_flight,
                            "overdue": s.overdue,
                            "next_due_ms": (s.next_due_ms >= 0).then_some(s.next_due_ms),
                            "delivered_total": s.delivered_total,
                            "parked": s.parked,
                            "undeliverable_total": s.undeliverable_total,
                        })
                    })
                    .collect();
                emit_json(&json!({ "shards": list }));
            } else {
                let rows: Vec<Vec<String>> = shards
                    .iter()
                    .map(|s| {
                        vec![
                            s.shard.to_string(),
                            s.pending.to_string(),
                            s.in_flight.to_string(),
                            s.overdue.to_string(),
                            if s.next_due_ms >= 0 {
                                format_ms(s.next_due_ms)
                            } else {
                                "-".to_owned()
                            },
                            s.delivered_total.to_string(),
                            s.parked.to_string(),
                            s.undeliverable_total.to_string(),
                        ]
                    })
                    .collect();
                let headers = [
                    "shard",
                    "pending",
                    "in_flight",
                    "overdue",
                    "next_due",
                    "delivered",
                    "parked",
                    "undeliverable",
                ];
                emit(&table(&headers, &rows));
            }
            Ok(())
        }
    }
}
