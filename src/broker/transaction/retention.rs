//! What unresolved transactions hold back from retention, and the discards that let the
//! log go: the halves' retention floor, halves a full disk cut, and the halves discarded
//! (copied to [`DISCARDED_TOPIC`] with an op record) when their topic is deleted or their
//! segment is due for retention.

use std::collections::BTreeMap;

use super::{now_ms, Transactions, DISCARDED_TOPIC, HALF_TOPIC, OUTCOME_DISCARDED};
use crate::broker::ShardCtx;
use crate::protocol::ErrorCode;
use crate::store::Holder;

/// Most discards a topic's deletion writes at once.
const DISCARDS_AT_ONCE: usize = 256;

/// Most record bytes a topic's deletion reads and copies at once (each discard holds its
/// half's record and its copy until written).
const DISCARD_BYTES_AT_ONCE: u64 = 16 << 20;

/// Most half messages discarded in one pass for being past retention.
const HALVES_DISCARDED_PER_PASS: usize = 1024;

impl ShardCtx {
    /// Keeps the oldest unresolved half message (and every later record) from retention:
    /// the pending ones, and those whose outcome is being written (one that fails is
    /// pending again). A half not in the index (its send was cut from the log by a full
    /// disk, and failed) holds nothing; one whose lookup fails holds everything (0) until a
    /// lookup works: retention must not pass what it could not see.
    pub(super) fn hold_halves(&self) {
        let floor = {
            let txn = self.txn.borrow();
            let lists: [&mut dyn Iterator<Item = &u64>; 3] = [
                &mut txn.pending.keys(),
                &mut txn.resolving.keys(),
                &mut txn.owed_ops.keys(),
            ];
            halves_floor(&self.store, lists)
        };
        let floor = floor.unwrap_or_else(|e| {
            let now = now_ms();
            let mut txn = self.txn.borrow_mut();
            if now >= txn.hold_said_after_ms {
                txn.hold_said_after_ms = now + 60_000;
                crate::warn!(
                    "ringmq: shard {}: unresolved transactions hold the whole log from retention until a lookup works: {e}",
                    self.id
                );
            }
            0
        });
        self.store.set_retention_floor(Holder::Transactions, floor);
    }

    /// Pending halves at or past the next offset of the halves' queue were cut from the log
    /// with the write that found the disk full, and their sends refused: no producer ends
    /// them, and nothing is stored to check or discard. They leave the list (a half that
    /// takes such an offset later is listed as it is appended).
    pub(super) fn forget_cut_halves(&self) {
        let Ok(Some(next)) = self.store.queue_next_offset(HALF_TOPIC, 0) else {
            return;
        };
        let cut = self.txn.borrow_mut().pending.split_off(&next);
        if let (Some((&first, f)), Some((&last, l))) = (cut.iter().next(), cut.iter().next_back()) {
            crate::warn!(
                "ringmq: shard {}: {} half message(s) (transactions {}..={}) were cut from the log by a full disk, their sends refused: no longer listed as unresolved",
                self.id,
                cut.len(),
                f.id(first),
                l.id(last)
            );
        }
    }

    /// A deleted topic's pending transactions on this shard are discarded (kept, listed and
    /// counted): a commit arriving later, even after a topic of the name was created
    /// again, must not put an old transaction's message in the new topic. Run once the
    /// shard's table has no topic of the name (no half is stored for it from then on); waits
    /// for the outcomes being written for its halves (one that fails puts its half back).
    /// An `Err` says how many could not be discarded and why: their halves stay pending,
    /// and the deletion is retried.
    pub(in crate::broker) async fn discard_halves_of(&self, topic: &str) -> Result<(), String> {
        // The halves whose discard failed: their transaction's id (unless resolved since),
        // and why.
        let mut failed: BTreeMap<u64, (Option<u64>, String)> = BTreeMap::new();
        let mut discarded = 0usize;
        loop {
            Transactions::resolutions_ended(&self.txn, |_, t| t == topic).await;
            let halves = self.next_discards(topic, &failed);
            if halves.is_empty() {
                break;
            }
            // Together, so their writes share the log's flushes.
            let discards = halves
                .iter()
                .map(|&half| self.resolve_half(half, OUTCOME_DISCARDED));
            let results = futures_util::future::join_all(discards).await;
            for (half, result) in halves.into_iter().zip(results) {
                match result {
                    Ok(()) => discarded += 1,
                    // Resolved meanwhile by its producer.
                    Err(e) if e.error_code() == Some(ErrorCode::TransactionNotFound) => {}
                    Err(e) => {
                        let id = (self.txn.borrow().pending.get(&half)).map(|h| h.id(half));
                        failed.insert(half, (id, e.message));
                    }
                }
            }
        }
        if discarded > 0 {
            crate::warn!(
                "ringmq: shard {}: {discarded} unresolved transaction(s) of deleted topic {topic} discarded, kept in {DISCARDED_TOPIC}",
                self.id
            );
        }
        match failed.first_key_value() {
            None => Ok(()),
            Some((half, (id, why))) => Err(format!(
                "discarding {} of its unresolved transactions (the first, {}: {why})",
                failed.len(),
                id.map_or(format!("at {half} of {HALF_TOPIC}"), |id| format!(
                    "transaction {id}"
                ))
            )),
        }
    }

    /// The next pending halves of `topic` to discard together (not those in `failed`): at
    /// most [`DISCARDS_AT_ONCE`] of them, and past the first, at most
    /// [`DISCARD_BYTES_AT_ONCE`] of records.
    pub(super) fn next_discards<T>(&self, topic: &str, failed: &BTreeMap<u64, T>) -> Vec<u64> {
        let txn = self.txn.borrow();
        let mut bytes = 0u64;
        let mut halves = Vec::new();
        for (&half, h) in txn.pending.iter() {
            if h.topic != topic || failed.contains_key(&half) {
                continue;
            }
            let size = match self.store.queue_entry(HALF_TOPIC, 0, half) {
                Ok(entry) => entry.map_or(0, |e| u64::from(e.size)),
                Err(_) => 0,
            };
            bytes += size;
            if halves.len() == DISCARDS_AT_ONCE
                || (!halves.is_empty() && bytes > DISCARD_BYTES_AT_ONCE)
            {
                break;
            }
            halves.push(half);
        }
        halves
    }

    /// Discards the unresolved half messages stored where retention wants to delete (past
    /// `--retention-hours`, or beyond `--retention-bytes-max`): each is copied to
    /// [`DISCARDED_TOPIC`] (listed and counted, as one out of checks), so that a half no
    /// producer resolves (its group gone) neither goes with its segment unresolved nor keeps
    /// the log from shrinking. Until then the halves' retention floor keeps them.
    ///
    /// A half younger than the transaction timeout and one check interval is left alone
    /// (the log may outgrow `--retention-bytes-max` for that long): its producer may still
    /// end it, and has been asked once. Before, the size limit discarded halves seconds
    /// old, and their producers' prompt commits were refused.
    pub(super) async fn discard_halves_past_retention(&self) {
        let wanted = (self.store.log())
            .retention_wanted_end(crate::log::now_ms())
            .await;
        let grace = (self.cfg.transaction_timeout_ms)
            .saturating_add(self.cfg.transaction_check_interval_ms);
        let young_after = now_ms().saturating_sub(grace);
        let mut aged = Vec::new();
        let mut young = 0;
        for (&half, h) in self.txn.borrow().pending.iter() {
            if h.stored_ms > young_after {
                // Left alone; the ones after it are usually younger too, but not always:
                // a clock stepped back gave later ones earlier times. The scan ends at the
                // first half retention does not want (below), or past a bounded number of
                // young ones.
                young += 1;
                if young > HALVES_DISCARDED_PER_PASS {
                    break;
                }
                continue;
            }
            match self.store.queue_entry(HALF_TOPIC, 0, half) {
                Ok(Some(e)) if e.physical_offset < wanted => aged.push(half),
                // The ones after it are stored later.
                Ok(Some(_)) => break,
                // Not in the index: a send a full disk cut (it failed).
                Ok(None) => {}
                // Not looked up: held (the floor holds it too), tried at the next pass.
                Err(_) => break,
            }
            if aged.len() == HALVES_DISCARDED_PER_PASS {
                break;
            }
        }
        if aged.is_empty() {
            return;
        }
        let mut discarded = 0;
        let (mut released, mut held) = (Vec::new(), Vec::new());
        for &half in &aged {
            match self.resolve_half(half, OUTCOME_DISCARDED).await {
                Ok(()) => discarded += 1,
                // Resolved meanwhile by its producer.
                Err(e) if e.error_code() == Some(ErrorCode::TransactionNotFound) => {}
                // Its copy cannot be written (a full disk, which only retention can give
                // space back to) or its half read (damaged, or gone), or its discard
                // failed at every pass of a few: held back, it would hold the log for
                // ever. It ages out with its segment, said here.
                Err(e) if e.error_code().is_some_and(never_discarded) => {
                    if let Some(h) = self.txn.borrow_mut().pending.remove(&half) {
                        released.push((h.id(half), e.message));
                    }
                }
                // Anything else may pass (a read or write that failed once, a busy store):
                // tried again at the next pass, the floor holding it meanwhile, unless it
                // failed at the last few too (an I/O error under the half, every time).
                Err(e) => {
                    let mut txn = self.txn.borrow_mut();
                    let Some(h) = txn.pending.get_mut(&half) else {
                        continue;
                    };
                    h.discard_failures += 1;
                    let id = h.id(half);
                    if h.discard_failures >= DISCARD_PASSES_MAX {
                        txn.pending.remove(&half);
                        released.push((id, e.message));
                    } else {
                        held.push((id, e.message));
                    }
                }
            }
        }
        if let Some((first, why)) = held.first() {
            crate::warn!(
                "ringmq: shard {}: {} unresolved transactions past retention could not be discarded this time (transaction {first}: {why}); tried again at the next retention pass (let go after {DISCARD_PASSES_MAX} such passes), held until then",
                self.id,
                held.len()
            );
        }
        self.hold_halves();
        if discarded > 0 {
            crate::warn!(
                "ringmq: shard {}: {discarded} unresolved transactions discarded: their half messages were stored where retention deletes; kept in {DISCARDED_TOPIC}",
                self.id
            );
        }
        if let Some((first, why)) = released.first() {
            crate::warn!(
                "ringmq: shard {}: {} unresolved transactions age out with retention unresolved, as they could not be discarded (transaction {first}: {why}); ids: {:?}",
                self.id,
                released.len(),
                released.iter().map(|(id, _)| id).collect::<Vec<_>>()
            );
        }
    }
}

/// Passes of retention in a row a half past it may fail to be discarded for a reason that
/// could pass, before it is let go all the same.
const DISCARD_PASSES_MAX: u32 = 3;

/// Whether a discard that failed with `code` will fail the same way every time: the disk is
/// full (only retention gives space back, and the half holds it), or the half cannot be
/// read as a message (damaged, or gone from the log).
pub(super) fn never_discarded(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::DiskFull
            | ErrorCode::StoreCorrupt
            | ErrorCode::InvalidMessage
            | ErrorCode::OffsetNotFound
            | ErrorCode::OffsetTooSmall
    )
}

/// The retention floor of the halves in `lists` (each in queue offset order): the place of
/// each list's first half the index holds, the lowest of them. One appended but not yet
/// written (past the index's visible end, before its next offset) holds from the log's
/// readable end, below its place: left out, it let the floor rise over it (to nothing held,
/// with no other half), and retention could delete it before it was resolved.
fn halves_floor(
    store: &crate::store::MessageStore,
    lists: [&mut dyn Iterator<Item = &u64>; 3],
) -> Result<u64, crate::store::StoreError> {
    let mut floor = u64::MAX;
    for halves in lists {
        for &half in halves {
            if let Some(entry) = store.queue_entry(HALF_TOPIC, 0, half)? {
                floor = floor.min(entry.physical_offset);
                break;
            }
            let visible = store.queue_range(HALF_TOPIC, 0)?.1;
            let next = store.queue_next_offset(HALF_TOPIC, 0)?.unwrap_or(0);
            if half >= visible && half < next {
                floor = floor.min(store.log().readable_end());
                break;
            }
        }
    }
    Ok(floor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record::RecordDraft;

    /// A half appended and not yet written holds the log from below its place: the floor
    /// was taken from the index alone, which does not show it yet (nothing held).
    #[test]
    fn a_half_not_yet_written_holds_the_log() {
        crate::io::run_local(|| async {
            let dir = tempfile::tempdir().unwrap();
            let cfg = crate::store::StoreConfig::default();
            let (store, _) = crate::store::MessageStore::open(dir.path(), cfg)
                .await
                .unwrap();
            let half = |body: &'static [u8]| RecordDraft::plain(HALF_TOPIC, 0, &[], body);
            let first = store.put(&half(b"written")).await.unwrap();
            let second = store.append(&half(b"in flight")).unwrap();
            let floor = |offsets: &[u64]| {
                let lists: [&mut dyn Iterator<Item = &u64>; 3] =
                    [&mut offsets.iter(), &mut [].iter(), &mut [].iter()];
                halves_floor(&store, lists).unwrap()
            };
            assert_eq!(floor(&[first.queue_offset]), first.physical_offset);
            assert!(floor(&[second.queue_offset]) <= second.physical_offset);
            assert_eq!(floor(&[]), u64::MAX);
            store.acked(second.written()).await.unwrap();
            assert_eq!(floor(&[second.queue_offset]), second.physical_offset);
            store.close().await.unwrap();
        });
    }

    /// A half past retention is let go (to age out unresolved) only for a failure that
    /// would come again; one that may pass keeps it for the next try.
    #[test]
    fn only_lasting_failures_let_a_half_past_retention_go() {
        for code in [
            ErrorCode::DiskFull,
            ErrorCode::StoreCorrupt,
            ErrorCode::InvalidMessage,
            ErrorCode::OffsetNotFound,
            ErrorCode::OffsetTooSmall,
        ] {
            assert!(never_discarded(code), "{code:?}");
        }
        for code in [
            ErrorCode::StoreIo,
            ErrorCode::BrokerBusy,
            ErrorCode::StoreUnavailable,
            ErrorCode::Internal,
            ErrorCode::TopicNotFound,
        ] {
            assert!(!never_discarded(code), "{code:?}");
        }
    }
}
