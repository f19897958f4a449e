//! `ringmq transaction`: the transactions of every shard that wait for an outcome, and the
//! half messages discarded after their last check-back.

use clap::Subcommand;
use serde_json::{json, Value};

use ringmq::protocol::HalfMessageInfo;

use crate::output::{emit, emit_json, table};
use crate::{CmdResult, Ctx};

#[derive(Subcommand, Debug)]
pub(crate) enum TransactionCommand {
    /// Unresolved half messages (age, checks answered "unknown" so far, producer group), the
    /// number discarded after their last check, and the latest of those (message ids of their kept copies,
    /// for `ringmq message id`)
    List,
}

fn row(h: &HalfMessageInfo) -> Vec<String> {
    vec![
        h.shard.to_string(),
        h.transaction_id.to_string(),
        format!("{}:{}", h.topic, h.queue_id),
        h.producer_group.clone(),
        format!("{:.1}", h.age_ms as f64 / 1000.0),
        h.checks.to_string(),
        h.msg_id.clone(),
    ]
}

fn item(h: &HalfMessageInfo) -> Value {
    json!({
        "shard": h.shard,
        "transaction_id": h.transaction_id,
        "topic": h.topic,
        "queue": h.queue_id,
        "producer_group": h.producer_group,
        "age_ms": h.age_ms,
        "checks": h.checks,
        "msg_id": h.msg_id,
    })
}

pub(crate) async fn run(ctx: &Ctx, command: TransactionCommand) -> CmdResult {
    match command {
        TransactionCommand::List => {
            let client = ctx.client().await?;
            let list = client.list_transactions().await.map_err(|e| ctx.fail(e))?;
            if ctx.json {
                emit_json(&json!({
                    "unresolved": list.halves.iter().map(item).collect::<Vec<_>>(),
                    "unresolved_total": list.unresolved,
                    "discarded": list.discarded,
                    "recently_discarded": list.recently_discarded.iter().map(item).collect::<Vec<_>>(),
                }));
            } else {
                let headers = [
                    "shard",
                    "transaction",
                    "bound for",
                    "producer group",
                    "age s",
                    "checks",
                    "msg id",
                ];
                let rows: Vec<Vec<String>> = list.halves.iter().map(row).collect();
                emit(&table(&headers, &rows));
                let listed = if list.halves.len() as u64 == list.unresolved {
                    format!("{} unresolved", list.unresolved)
                } else {
                    format!(
                        "{} unresolved, the oldest {} listed",
                        list.unresolved,
                        list.halves.len()
                    )
                };
                emit(&format!(
                    "{listed}; {} discarded after their last check (kept in %SYS_TXN_DISCARDED%)",
                    list.discarded
                ));
                if !list.recently_discarded.is_empty() {
                    let rows: Vec<Vec<String>> = list.recently_discarded.iter().map(row).collect();
                    emit(&table(&headers, &rows));
                }
            }
            Ok(())
        }
    }
}
