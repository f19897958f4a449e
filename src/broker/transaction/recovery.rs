//! Rebuilding a shard's unresolved transactions at start, from the op records and the
//! half messages (see the parent module).

use std::collections::BTreeMap;

use super::{
    now_ms, outcome_name, parse_op, Half, DISCARDED_TOPIC, HALF_TOPIC, OP_TOPIC, OUTCOME_DISCARDED,
    RESOLVED_REMEMBERED,
};
use crate::broker::ShardCtx;
use crate::protocol::record::{prop, RecordView, SYS_FLAG_TRANSACTION_COMMIT};
use crate::protocol::TRANSACTION_COMMIT;

impl ShardCtx {
    /// Rebuilds the unresolved half messages after a start: every op record, then every
    /// half message without one. A half whose commit is in its real topic (or whose discard
    /// is in [`DISCARDED_TOPIC`]) without an op record gets that op record now.
    pub async fn recover_transactions(&self) -> Result<(), String> {
        let mut resolved = BTreeMap::new();
        for record in self.read_all(OP_TOPIC).await? {
            if let Ok(view) = RecordView::parse(&record) {
                if let Some((half, outcome)) = parse_op(view.body()) {
                    resolved.insert(half, outcome);
                }
            }
        }
        let now = now_ms();
        let mut pending = BTreeMap::new();
        // Copies that could not be looked for: how many, and the first (transaction, why).
        let mut lookups_failed: Option<(usize, u64, String)> = None;
        let (min, _) = self
            .store
            .queue_range(HALF_TOPIC, 0)
            .map_err(|e| e.to_string())?;
        for (i, record) in self.read_all(HALF_TOPIC).await?.into_iter().enumerate() {
            let half = min + i as u64;
            if resolved.contains_key(&half) {
                continue;
            }
            let Ok(view) = RecordView::parse(&record) else {
                continue;
            };
            let props = view.properties();
            let (Some(topic), Some(queue_id)) = (
                props.get(prop::REAL_TOPIC),
                props.get(prop::REAL_QID).and_then(|q| q.parse().ok()),
            ) else {
                continue;
            };
            if let Some(uniq) = props.get(prop::UNIQ_KEY) {
                // A commit (or a discard) whose op record a full disk refused: its copy is
                // stored, and the outcome stood.
                let mut copied = None;
                for (outcome, copy_topic) in [
                    (TRANSACTION_COMMIT, topic),
                    (OUTCOME_DISCARDED, DISCARDED_TOPIC),
                ] {
                    match self.copied_without_op(copy_topic, uniq, half, &view).await {
                        Ok(false) => {}
                        Ok(true) => {
                            copied = Some(outcome);
                            break;
                        }
                        Err(e) => {
                            let first = lookups_failed.get_or_insert((0, half, e));
                            first.0 += 1;
                        }
                    }
                }
                if let Some(outcome) = copied {
                    // Resolved all the same when the op record is refused (a full disk):
                    // the copy stays, and the next start finds it again.
                    if let Err(e) = self.append_op(half, outcome) {
                        crate::warn!(
                            "ringmq: shard {}: op record of transaction {} (found {}): {}; the next start writes it",
                            self.id,
                            half + 1,
                            outcome_name(outcome),
                            e.message
                        );
                    }
                    resolved.insert(half, outcome);
                    continue;
                }
            }
            pending.insert(
                half,
                Half {
                    topic: topic.to_owned(),
                    queue_id,
                    group: props.get(prop::PRODUCER_GROUP).unwrap_or("").to_owned(),
                    msg_id: self.msg_id(view.physical_offset()),
                    stored_ms: view.store_timestamp_ms().max(0) as u64,
                    checks: 0,
                    next_check_ms: (view.store_timestamp_ms().max(0) as u64
                        + self.cfg.transaction_timeout_ms)
                        .max(now),
                },
            );
        }
        if let Some((n, half, why)) = lookups_failed {
            crate::warn!(
                "ringmq: shard {}: {n} look-up(s) for the copy of a transaction failed (the first, transaction {}: {why}); their transactions are taken as unresolved and their producers asked (a commit may come twice, nothing is lost)",
                self.id,
                half + 1
            );
        }
        {
            let mut txn = self.txn.borrow_mut();
            txn.pending = pending;
            txn.resolved = resolved;
            while txn.resolved.len() > RESOLVED_REMEMBERED {
                txn.resolved.pop_first();
            }
        }
        self.hold_halves();
        Ok(())
    }

    /// Whether `topic` holds the copy of half message `half` (`view`: its commit in its real
    /// topic, or its discard in [`DISCARDED_TOPIC`]), found by its unique key, its `TRAN_ID`
    /// and the half's place in the log (kept in its transaction offset) under
    /// [`SYS_FLAG_TRANSACTION_COMMIT`]: no client's send carries that flag, so a plain send
    /// naming the transaction is not taken for its commit. Looked for among the (at most 64
    /// newest) records of the key stored from a minute before the half on (a clock set
    /// back), so that a key reused long before does not crowd it out; 64 reuses after the
    /// half still would. An `Err` says why it could not be looked for.
    async fn copied_without_op(
        &self,
        topic: &str,
        uniq: &str,
        half: u64,
        view: &RecordView<'_>,
    ) -> Result<bool, String> {
        let want = (half + 1).to_string();
        let half_at = view.physical_offset();
        let since = view.store_timestamp_ms().saturating_sub(60_000);
        let found = (self.store)
            .messages_by_key(topic, uniq, since, i64::MAX, 64)
            .await
            .map_err(|e| format!("looking in {topic} by key {uniq}: {e}"))?;
        Ok(found.iter().any(|r| {
            RecordView::parse(r).is_ok_and(|v| {
                v.topic() == topic
                    && v.sys_flag() & SYS_FLAG_TRANSACTION_COMMIT != 0
                    && v.transaction_offset() == half_at
                    && v.properties().get(prop::TRANSACTION_ID) == Some(want.as_str())
            })
        }))
    }

    /// Every record of queue 0 of a system topic, in order.
    async fn read_all(&self, topic: &str) -> Result<Vec<Vec<u8>>, String> {
        let (min, end) = self
            .store
            .queue_range(topic, 0)
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let mut next = min;
        while next < end {
            let read = self
                .store
                .read_queue(topic, 0, next, 1024, 16 << 20, &[])
                .await
                .map_err(|e| format!("reading {topic} at {next}: {e}"))?;
            if read.is_empty() {
                break;
            }
            out.extend(read.records().map(<[u8]>::to_vec));
            next = read.next_offset;
        }
        Ok(out)
    }
}
