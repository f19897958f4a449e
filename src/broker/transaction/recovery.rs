//! Rebuilding a shard's unresolved transactions at start, from the op records and the
//! half messages (see the parent module).

use super::{
    now_ms, outcome_name, parse_op, time_bits, transaction_id, Half, PendingHalves, Resolved,
    DISCARDED_TOPIC, HALF_TOPIC, OP_TOPIC, OUTCOME_DISCARDED,
};
use crate::broker::ShardCtx;
use crate::protocol::record::{prop, RecordView, SYS_FLAG_TRANSACTION_COMMIT};
use crate::protocol::TRANSACTION_COMMIT;
use crate::store::{is_damage, AloneAfterDamage};

impl ShardCtx {
    /// Rebuilds the unresolved half messages after a start: every op record (kept as one
    /// bit per half in the half queue's range, and the newest outcomes), then every half
    /// message without one, read in bounded chunks: the halves a producer resolved, which
    /// stay in the log until retention, are never read. A half whose commit is in its real
    /// topic (or whose discard is in [`DISCARDED_TOPIC`]) without an op record gets that
    /// op record now. Damaged records are counted and logged, not taken.
    pub async fn recover_transactions(&self) -> Result<(), String> {
        let (min, end) = self
            .store
            .queue_range(HALF_TOPIC, 0)
            .map_err(|e| e.to_string())?;
        let mut has_op = OpBits::new(min, end);
        let mut resolved = Resolved::default();
        let mut damaged = Damaged::default();
        let (op_min, op_end) = self
            .store
            .queue_range(OP_TOPIC, 0)
            .map_err(|e| e.to_string())?;
        let mut next = op_min;
        let mut chunks = AloneAfterDamage::default();
        while next < op_end {
            let read = self.read_chunk(OP_TOPIC, next, op_end - next, &mut chunks);
            let Some(read) = read.await? else {
                damaged.note("op record", next);
                next += 1;
                continue;
            };
            let Some(&last) = read.queue_offsets().last() else {
                break;
            };
            for (record, &at) in read.records().zip(read.queue_offsets()) {
                match RecordView::parse(record)
                    .ok()
                    .and_then(|view| parse_op(view.body()))
                {
                    Some((half, outcome, bits)) => {
                        has_op.set(half);
                        resolved.insert(half, outcome, bits);
                    }
                    None => damaged.note("op record", at),
                }
            }
            next = read.next_offset.max(last + 1);
        }
        let now = now_ms();
        let mut pending = PendingHalves::default();
        // Copies that could not be looked for: how many, and the first (transaction, why).
        let mut lookups_failed: Option<(usize, u64, String)> = None;
        let mut next = min;
        let mut chunks = AloneAfterDamage::default();
        while let Some((from, to)) = has_op.next_run_without(next) {
            let read = self.read_chunk(HALF_TOPIC, from, to - from, &mut chunks);
            let Some(read) = read.await? else {
                damaged.note("half message", from);
                next = from + 1;
                continue;
            };
            let Some(&last) = read.queue_offsets().last() else {
                break;
            };
            next = read.next_offset.max(last + 1);
            for (record, &half) in read.records().zip(read.queue_offsets()) {
                if has_op.get(half) {
                    continue;
                }
                let Ok(view) = RecordView::parse(record) else {
                    damaged.note("half message", half);
                    continue;
                };
                let stored_ms = view.store_timestamp_ms().max(0) as u64;
                let id = transaction_id(half, stored_ms);
                let props = view.properties();
                let (Some(topic), Some(queue_id)) = (
                    props.get(prop::REAL_TOPIC),
                    props.get(prop::REAL_QID).and_then(|q| q.parse().ok()),
                ) else {
                    damaged.note("half message without its real topic", half);
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
                                let first = lookups_failed.get_or_insert((0, id, e));
                                first.0 += 1;
                            }
                        }
                    }
                    if let Some(outcome) = copied {
                        // Resolved all the same when the op record is refused (a full disk):
                        // the copy stays, and the next start finds it again.
                        if let Err(e) = self.append_op(half, outcome, time_bits(stored_ms)) {
                            crate::warn!(
                                "ringmq: shard {}: op record of transaction {} (found {}): {}; the next start writes it",
                                self.id,
                                id,
                                outcome_name(outcome),
                                e.message
                            );
                        }
                        resolved.insert(half, outcome, Some(time_bits(stored_ms)));
                        continue;
                    }
                }
                pending.insert(
                    half,
                    Half::new(
                        topic.to_owned(),
                        queue_id,
                        props.get(prop::PRODUCER_GROUP).unwrap_or("").to_owned(),
                        self.msg_id(view.physical_offset()),
                        stored_ms,
                        (stored_ms + self.cfg.transaction_timeout_ms).max(now),
                    ),
                );
            }
        }
        damaged.warn(self.id);
        if let Some((n, id, why)) = lookups_failed {
            crate::warn!(
                "ringmq: shard {}: {n} look-up(s) for the copy of a transaction failed (the first, transaction {id}: {why}); their transactions are taken as unresolved and their producers asked (a commit may come twice, nothing is lost)",
                self.id,
            );
        }
        {
            let mut txn = self.txn.borrow_mut();
            txn.pending = pending;
            txn.resolved = resolved;
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
        // The id as written by this version, or by one that named a transaction by its
        // offset alone.
        let stored_ms = view.store_timestamp_ms().max(0) as u64;
        let want = [transaction_id(half, stored_ms), half + 1].map(|id| id.to_string());
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
                    && (v.properties().get(prop::TRANSACTION_ID))
                        .is_some_and(|id| want.iter().any(|w| w == id))
            })
        }))
    }

    /// Up to 1024 records (16 MiB) of queue 0 of a system topic from `from`, at most `n`.
    /// A read that fails for a damaged record (not I/O) is made again one record at a
    /// time over its offsets (`chunks`): `None` for the one record whose own read fails,
    /// which the caller counts as damaged and passes; the others are read.
    async fn read_chunk(
        &self,
        topic: &str,
        from: u64,
        n: u64,
        chunks: &mut AloneAfterDamage,
    ) -> Result<Option<crate::store::QueueRead>, String> {
        loop {
            let max = chunks.batch(from, n.min(1024));
            let read = self
                .store
                .read_queue(topic, 0, from, max as u32, 16 << 20, &[]);
            match read.await {
                Ok(read) => return Ok(Some(read)),
                Err(e) if chunks.again_alone(from, max, &e) => {}
                Err(e) if is_damage(&e) => return Ok(None),
                Err(e) => return Err(format!("reading {topic} at {from}: {e}")),
            }
        }
    }
}

/// Which half messages (queue offsets in `[min, end)` of the half topic) have an op record:
/// one bit each.
struct OpBits {
    min: u64,
    end: u64,
    bits: Vec<u64>,
}

impl OpBits {
    fn new(min: u64, end: u64) -> OpBits {
        let words = usize::try_from(end.saturating_sub(min).div_ceil(64)).unwrap_or(0);
        OpBits {
            min,
            end,
            bits: vec![0; words],
        }
    }

    /// Records an op record of `half` (one outside the range names a half retention took).
    fn set(&mut self, half: u64) {
        if (self.min..self.end).contains(&half) {
            let i = half - self.min;
            self.bits[(i / 64) as usize] |= 1 << (i % 64);
        }
    }

    fn get(&self, half: u64) -> bool {
        if !(self.min..self.end).contains(&half) {
            return false;
        }
        let i = half - self.min;
        self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// The first run of halves without an op record at or after `from`: `[start, end)`.
    fn next_run_without(&self, from: u64) -> Option<(u64, u64)> {
        let mut start = from.max(self.min);
        while start < self.end && self.get(start) {
            // A full word of resolved halves is skipped at once.
            let i = start - self.min;
            if i.is_multiple_of(64) && self.bits[(i / 64) as usize] == u64::MAX {
                start += 64;
            } else {
                start += 1;
            }
        }
        if start >= self.end {
            return None;
        }
        let mut end = start + 1;
        while end < self.end && !self.get(end) {
            end += 1;
        }
        Some((start, end))
    }
}

/// Records recovery could not take (damaged, or missing what they need): counted, with the
/// first, and logged once.
#[derive(Default)]
struct Damaged {
    count: usize,
    first: Option<(&'static str, u64)>,
}

impl Damaged {
    fn note(&mut self, what: &'static str, offset: u64) {
        self.count += 1;
        self.first.get_or_insert((what, offset));
    }

    fn warn(&self, shard: u32) {
        if let Some((what, offset)) = self.first {
            crate::warn!(
                "ringmq: shard {shard}: {} transaction record(s) could not be read at start and were skipped (the first, a {what} at queue offset {offset}); a half message skipped is not checked, and a commit of it is refused as unknown; an op record skipped leaves its half to be checked again",
                self.count
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::OpBits;

    #[test]
    fn runs_without_op_records_skip_the_resolved_halves() {
        let mut bits = OpBits::new(100, 300);
        assert_eq!(bits.next_run_without(0), Some((100, 300)));
        for half in (100..200).chain(201..203) {
            bits.set(half);
        }
        bits.set(50); // below the range: a half retention took
        bits.set(300); // past it
        assert_eq!(bits.next_run_without(100), Some((200, 201)));
        assert_eq!(bits.next_run_without(201), Some((203, 300)));
        assert!(bits.get(150) && !bits.get(200) && !bits.get(50) && !bits.get(300));
        for half in 203..300 {
            bits.set(half);
        }
        assert_eq!(bits.next_run_without(201), None);
        assert_eq!(OpBits::new(5, 5).next_run_without(0), None);
    }
}
