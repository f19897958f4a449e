//! Transactional messages: half messages, outcomes, check-backs, producer groups.
//!
//! A send carrying `TRAN_MSG=true` (and its producer group in `PGROUP`) is stored as a
//! *half message* in [`HALF_TOPIC`] (queue 0 of the shard that owns the queue it is bound
//! for, which it names in `REAL_TOPIC`/`REAL_QID`): invisible to consumers. Its
//! transaction id is its offset in that queue plus one, above 16 bits of its store time
//! ([`transaction_id`]). An [`EndTransaction`] with commit appends the message to its real
//! queue (same body, properties and keys, plus `TRAN_ID`) and then an *op record* in
//! [`OP_TOPIC`] (body: the half's offset, the outcome and the id's time bits), in
//! the same synchronous step, so the log holds either neither, the commit alone or both;
//! rollback appends only the op record. The answer waits for the op record (acked or
//! durable, as for sends). A restart rebuilds the unresolved half messages from the two
//! topics; a half whose commit reached the log without its op record (a crash between the
//! two, which can be two writes of the log) is found by its unique key (`UNIQ_KEY`, given
//! to a half message that comes without one) in the real topic, in a record only the broker
//! writes ([`SYS_FLAG_TRANSACTION_COMMIT`], the half's log offset as its transaction
//! offset), and its op record written then, so it is never committed twice.
//!
//! Check-back: a half message older than `--transaction-timeout-ms` is asked about every
//! `--transaction-check-interval-ms`: a [`CheckTransaction`] is pushed to a live producer
//! of its group (the group's coordinator shard keeps the producers' connections, as
//! registered by [`ProducerHeartbeat`] and dropped when the connection closes; each check
//! asks the next producer). After `--transaction-check-max` checks answered "unknown" (a
//! check no checker answered does not count: RocketMQ counts each check sent, so a
//! lagging or gone checker cost committed transactions) the half message is copied to
//! [`DISCARDED_TOPIC`], an op record written, and it is counted. A topic's
//! deletion discards its unresolved halves the same way, and a commit whose topic is gone
//! is a discard too (its producer told); a discard whose op record a full disk refused is
//! found by its key in [`DISCARDED_TOPIC`] at the next start, as a commit is in its topic.
//!
//! Retention: the oldest unresolved half holds the store's retention floor, and a half
//! stored where retention wants to delete is discarded as after its last check, so none
//! goes unresolved with its segment and none holds the log for ever.
//!
//! Files: this one (halves, outcomes, checks, listing), `pending` (the unresolved halves),
//! `recovery` (the rebuild at start), `retention` (floor and discards), `producers` (the
//! producers checks go to).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use super::mesh::{MeshReply, MeshRequest};
use super::schedule::rebuild_properties;
use super::{err, store_error, unsure_error, ShardCtx};
use crate::protocol::record::{
    prop, Properties, RecordDraft, RecordView, SYS_FLAG_TRANSACTION_COMMIT,
};
use crate::protocol::{
    encode_frame, CheckTransaction, EndTransaction, ErrorBody, ErrorCode, Flags, HalfMessageInfo,
    TransactionList, TRANSACTION_COMMIT, TRANSACTION_ROLLBACK, TRANSACTION_UNKNOWN,
};
use crate::store::{Holder, PutResult};

mod pending;
mod producers;
mod recovery;
mod resolved;
mod retention;

pub use producers::ProducerGroups;

use pending::{Half, PendingHalves};
use resolved::Resolved;

/// Half messages, one queue per shard.
pub const HALF_TOPIC: &str = "%SYS_TXN_HALF%";
/// Outcomes of half messages: body = half offset (`u64` LE) and the outcome byte.
pub const OP_TOPIC: &str = "%SYS_TXN_OP%";
/// Half messages given up after their last check, kept for inspection.
pub const DISCARDED_TOPIC: &str = "%SYS_TXN_DISCARDED%";

/// Default of `--transaction-timeout-ms`.
pub const TRANSACTION_TIMEOUT_MS_DEFAULT: u64 = 6_000;
/// Default of `--transaction-check-interval-ms`.
pub const TRANSACTION_CHECK_INTERVAL_MS_DEFAULT: u64 = 30_000;
/// Default of `--transaction-check-max`.
pub const TRANSACTION_CHECK_MAX_DEFAULT: u32 = 15;
/// Default of `--transaction-pending-max`: most unresolved half messages one shard holds;
/// past it transactional sends are refused (`LimitReached`) until some are resolved.
pub const TRANSACTION_PENDING_MAX_DEFAULT: usize = 200_000;
/// Default of `--transaction-group-pending-max`: most unresolved half messages of one
/// producer group on one shard (a group that leaves its transactions behind blocks only its
/// own sends, not the other groups', until they are checked or discarded).
pub const TRANSACTION_GROUP_PENDING_MAX_DEFAULT: usize = 50_000;
/// Resolved transactions remembered per shard (to answer a repeated outcome).
const RESOLVED_REMEMBERED: usize = 200_000;
/// Most halves one round of checks (every `--transaction-check-interval-ms`, at most a
/// second) asks about or discards.
const CHECKS_PER_ROUND_MAX: usize = 1024;
/// The op record's outcome for a half message given up after its checks.
const OUTCOME_DISCARDED: u8 = 3;

/// A shard's transactions.
#[derive(Default)]
pub struct Transactions {
    /// Unresolved half messages by their offset in [`HALF_TOPIC`].
    pending: PendingHalves,
    /// Recent outcomes by half offset, with the half's [`time_bits`].
    resolved: Resolved,
    /// Halves whose outcome is being written and acknowledged (resolved until it fails),
    /// with the topic each is bound for.
    resolving: BTreeMap<u64, (Rc<tokio::sync::Notify>, String)>,
    discarded: u64,
    /// Where the next round of checks starts looking for halves due (past the last one
    /// checked, going round): a round checks at most [`CHECKS_PER_ROUND_MAX`], and halves
    /// due again before the rest were reached (a group with no live producer holding
    /// thousands) would otherwise take every round from those at higher offsets.
    check_cursor: u64,
    /// Checks that could not be delivered (no live producer of the group, or its
    /// connection holds too much not yet written): not counted against the check limit.
    checks_undelivered: u64,
    /// The latest discards (their copies in [`DISCARDED_TOPIC`]), newest last.
    discarded_recent: std::collections::VecDeque<HalfMessageInfo>,
    /// When a failed lookup that holds the whole log (`hold_halves`) may be said again.
    hold_said_after_ms: u64,
    /// Op records (outcome, time bits) of halves whose message copy is in the log without
    /// them (`write_outcome`), appended again at each check tick; their halves hold the
    /// retention floor until then.
    owed_ops: BTreeMap<u64, (u8, u16)>,
}

/// Discards listed by [`ListTransactions`](crate::protocol::ListTransactions), per shard.
const DISCARDED_LISTED: usize = 100;
/// Most unresolved half messages one `ListTransactions` answer lists (the oldest).
pub const TRANSACTIONS_LISTED_MAX: usize = 1_000;

/// A transaction's id: its half message's offset in [`HALF_TOPIC`] plus one, above the low
/// 16 bits of the half's store time (ms). The offset alone could name two halves: a crash
/// that lost an unsynced half (async flush) gives its offset to the next half stored, and
/// an outcome meant for the lost one would resolve that one, another producer's
/// transaction maybe. The time bits tell them apart (but for halves stored a multiple of
/// 65.536 s apart). Ids of one shard still grow with the offset.
pub(super) fn transaction_id(half: u64, stored_ms: u64) -> u64 {
    ((half + 1) << 16) | (stored_ms & 0xffff)
}

/// The half message a transaction id names (its offset in [`HALF_TOPIC`]) and the time
/// bits that tell it from another stored there since; `None` for an id that names none.
fn named_half(id: u64) -> Option<(u64, u16)> {
    Some(((id >> 16).checked_sub(1)?, id as u16))
}

/// The time bits of [`transaction_id`].
fn time_bits(stored_ms: u64) -> u16 {
    stored_ms as u16
}

impl Transactions {
    /// Half messages waiting for an outcome.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Checks not delivered to a producer, since the shard started.
    pub fn checks_undelivered(&self) -> u64 {
        self.checks_undelivered
    }

    /// Remembers the outcome of the half at `half` (taken out of the pending ones already),
    /// with its time bits.
    fn resolve(&mut self, half: u64, outcome: u8, bits: u16) {
        self.resolved.insert(half, outcome, Some(bits));
    }
}

/// An outcome being written for a half: outcomes for it arriving meanwhile wait for its
/// end, which dropping this marks.
struct Resolving<'a> {
    txn: &'a std::cell::RefCell<Transactions>,
    half: u64,
}

impl<'a> Resolving<'a> {
    fn start(txn: &'a std::cell::RefCell<Transactions>, half: u64, topic: &str) -> Resolving<'a> {
        (txn.borrow_mut().resolving).insert(half, (Rc::default(), topic.to_owned()));
        Resolving { txn, half }
    }
}

impl Drop for Resolving<'_> {
    fn drop(&mut self) {
        if let Some((done, _)) = self.txn.borrow_mut().resolving.remove(&self.half) {
            done.notify_waiters();
        }
    }
}

impl Transactions {
    /// Waits until no outcome is being written for a half `bound` accepts (one that fails
    /// puts its half back to pending).
    async fn resolutions_ended(
        cell: &std::cell::RefCell<Transactions>,
        bound: impl Fn(u64, &str) -> bool,
    ) {
        loop {
            let found = (cell.borrow().resolving.iter())
                .find(|(&half, (_, topic))| bound(half, topic))
                .map(|(&half, (done, _))| (half, done.clone()));
            let Some((half, done)) = found else { return };
            let notified = done.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if cell.borrow().resolving.contains_key(&half) {
                notified.await;
            }
        }
    }
}

fn now_ms() -> u64 {
    crate::log::now_ms().max(0) as u64
}

/// An op record's body: the half's offset, the outcome, and the [`time_bits`] of the half's
/// transaction id.
fn op_body(half: u64, outcome: u8, bits: u16) -> [u8; 11] {
    let mut b = [0u8; 11];
    b[..8].copy_from_slice(&half.to_le_bytes());
    b[8] = outcome;
    b[9..].copy_from_slice(&bits.to_le_bytes());
    b
}

/// An op record's half, outcome and time bits (`None`: written before op records kept
/// them).
fn parse_op(body: &[u8]) -> Option<(u64, u8, Option<u16>)> {
    let half = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
    let bits = (body.get(9..11)).and_then(|b| Some(u16::from_le_bytes(b.try_into().ok()?)));
    Some((half, *body.get(8)?, bits))
}

/// Whether `e` says a commit's topic or queue is gone.
fn is_gone(e: &ErrorBody) -> bool {
    matches!(
        e.error_code(),
        Some(ErrorCode::TopicNotFound | ErrorCode::QueueNotFound)
    )
}

fn outcome_name(outcome: u8) -> &'static str {
    match outcome {
        TRANSACTION_COMMIT => "committed",
        TRANSACTION_ROLLBACK => "rolled back",
        OUTCOME_DISCARDED => "discarded",
        _ => "unknown",
    }
}

/// Whether a send asks to be a transaction's half message.
pub fn is_half(props: &Properties<'_>) -> bool {
    props.get(prop::TRAN_MSG) == Some("true")
}

impl ShardCtx {
    /// Stores a half message (instead of appending it to its queue). The returned put's
    /// `queue_offset` is the half's offset in [`HALF_TOPIC`].
    pub(super) fn half_append(&self, draft: &RecordDraft<'_>) -> Result<PutResult, ErrorBody> {
        // Checked with the append (a send's path may await between its own check and here):
        // a half for a topic this shard's table no longer has would be missed by the
        // deletion's discard, and committed later into a topic created again.
        self.known_queue(draft.topic, draft.queue_id)?;
        let props = Properties::new(draft.properties);
        let group = props.get(prop::PRODUCER_GROUP).unwrap_or("");
        crate::protocol::names::check_group_name(group).map_err(|e| {
            err(
                ErrorCode::InvalidMessage,
                format!(
                    "a transactional message names its producer group ({}): {e}",
                    prop::PRODUCER_GROUP
                ),
            )
        })?;
        if crate::protocol::delay::asks_for_delay(&props) {
            return Err(err(
                ErrorCode::InvalidMessage,
                "a transactional message cannot be delayed",
            ));
        }
        self.room_for_half(group)?;
        let queue = draft.queue_id.to_string();
        let mut add = vec![
            (prop::REAL_TOPIC, draft.topic),
            (prop::REAL_QID, queue.as_str()),
        ];
        // The commit is found again by its unique key after a crash between it and its op
        // record (`recover_transactions`): a message without one gets one here.
        let uniq = props
            .get(prop::UNIQ_KEY)
            .is_none()
            .then(|| self.unique_key());
        if let Some(uniq) = &uniq {
            add.push((prop::UNIQ_KEY, uniq));
        }
        let held_props = rebuild_properties(props, &[], &add)?;
        let held = RecordDraft {
            topic: HALF_TOPIC,
            queue_id: 0,
            properties: &held_props,
            ..*draft
        };
        let put = self.store.append(&held).map_err(store_error)?;
        // Kept from retention until it is resolved.
        (self.store).lower_retention_floor(Holder::Transactions, put.physical_offset);
        let now = now_ms();
        self.txn.borrow_mut().pending.insert(
            put.queue_offset,
            Half::new(
                draft.topic.to_owned(),
                draft.queue_id,
                group.to_owned(),
                self.msg_id(put.physical_offset),
                // The record's own: what a start reads back, and the id's time bits.
                put.store_timestamp_ms.max(0) as u64,
                now + self.cfg.transaction_timeout_ms,
            ),
        );
        Ok(put)
    }

    /// Refuses a half message of `group` past the shard's or the group's limit of unresolved
    /// ones.
    fn room_for_half(&self, group: &str) -> Result<(), ErrorBody> {
        let txn = self.txn.borrow();
        let max = self.cfg.transaction_pending_max;
        if txn.pending.len() >= max {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "shard {} holds {max} unresolved half messages, its limit (--transaction-pending-max); end some transactions first",
                    self.id
                ),
            ));
        }
        let group_max = self.cfg.transaction_group_pending_max;
        if txn.pending.of_group(group) >= group_max {
            return Err(err(
                ErrorCode::LimitReached,
                format!(
                    "producer group {group} holds {group_max} unresolved half messages on shard {}, its limit (--transaction-group-pending-max); end some of its transactions first",
                    self.id
                ),
            ));
        }
        Ok(())
    }

    /// `EndTransaction`: commit, roll back, or say nothing yet.
    pub(super) async fn end_transaction(
        self: Rc<Self>,
        e: EndTransaction,
    ) -> Result<crate::protocol::Empty, ErrorBody> {
        if !matches!(
            e.outcome,
            TRANSACTION_COMMIT | TRANSACTION_ROLLBACK | TRANSACTION_UNKNOWN
        ) {
            return Err(err(
                ErrorCode::InvalidMessage,
                format!(
                    "outcome {} is not 0 (unknown), 1 (commit) or 2 (rollback)",
                    e.outcome
                ),
            ));
        }
        let (half, bits) = named_half(e.transaction_id).ok_or_else(|| {
            err(
                ErrorCode::TransactionNotFound,
                format!("transaction id {} names no transaction", e.transaction_id),
            )
        })?;
        let not_here = || {
            err(
                ErrorCode::TransactionNotFound,
                format!(
                    "no transaction {} waits for an outcome on shard {}",
                    e.transaction_id, self.id
                ),
            )
        };
        // An outcome being written for it: its answer waits for that one's end (which may
        // put the half back to pending).
        Transactions::resolutions_ended(&self.txn, |h, _| h == half).await;
        {
            let txn = self.txn.borrow();
            if let Some(h) = txn.pending.get(&half) {
                // Another half stored where one a crash lost was.
                if time_bits(h.stored_ms) != bits {
                    return Err(not_here());
                }
                if h.topic != e.topic || h.queue_id != e.queue_id || h.group() != e.producer_group {
                    return Err(err(
                        ErrorCode::TransactionNotFound,
                        format!(
                            "transaction {} is bound for {}:{} of producer group {}, not {}:{} of {}",
                            e.transaction_id, h.topic, h.queue_id, h.group(), e.topic, e.queue_id,
                            e.producer_group
                        ),
                    ));
                }
            } else {
                return match txn.resolved.get(&half) {
                    Some((_, Some(b))) if b != bits => Err(not_here()),
                    Some((done, _)) if done == e.outcome || e.outcome == TRANSACTION_UNKNOWN => {
                        Ok(crate::protocol::Empty {})
                    }
                    Some((done, _)) => Err(err(
                        ErrorCode::TransactionResolved,
                        format!(
                            "transaction {} was {}",
                            e.transaction_id,
                            outcome_name(done)
                        ),
                    )),
                    None => Err(not_here()),
                };
            }
        }
        if e.outcome == TRANSACTION_UNKNOWN {
            // A checker's "unknown" counts against `--transaction-check-max`, once per
            // check delivered.
            if e.from_check {
                if let Some(p) = self.txn.borrow_mut().pending.get_mut(&half) {
                    if std::mem::take(&mut p.awaiting_answer) {
                        p.checks += 1;
                    }
                }
            }
            return Ok(crate::protocol::Empty {});
        }
        // The topic (or the queue) went since the half was stored, or goes while the half is
        // read: the commit has nowhere to go. The message is discarded (kept, listed and
        // counted) and the producer told.
        let gone = match (e.outcome, self.known_queue(&e.topic, e.queue_id)) {
            (TRANSACTION_COMMIT, Err(gone)) => gone,
            _ => match self.resolve_half(half, e.outcome).await {
                Err(gone) if e.outcome == TRANSACTION_COMMIT && is_gone(&gone) => gone,
                result => return result.map(|()| crate::protocol::Empty {}),
            },
        };
        match self.resolve_half(half, OUTCOME_DISCARDED).await {
            // Discarded meanwhile, by the topic's deletion.
            Err(x) if x.error_code() == Some(ErrorCode::TransactionNotFound) => {}
            result => result?,
        }
        crate::warn!(
            "ringmq: shard {}: transaction {} committed after {}: discarded, kept in {DISCARDED_TOPIC}",
            self.id,
            e.transaction_id,
            gone.message
        );
        Err(err(
            gone.error_code().unwrap_or(ErrorCode::TopicNotFound),
            format!(
                "transaction {} cannot be committed: {}; its message is kept in {DISCARDED_TOPIC} (ringmq transaction list)",
                e.transaction_id, gone.message
            ),
        ))
    }

    /// A `UNIQ_KEY` for a message that came without one: this shard's id and the time in
    /// nanoseconds, in hex (a commit is matched by this key and its `TRAN_ID` together).
    fn unique_key(&self) -> String {
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        format!("{:04X}{ns:016X}", self.id)
    }

    /// Waits until `put` is acknowledged as a send would be (written, or durable in sync
    /// flush mode).
    async fn acked(&self, put: PutResult) -> Result<(), ErrorBody> {
        let r = if self.cfg.flush == crate::log::FlushMode::Sync {
            self.store.durable(put.written()).await
        } else {
            self.store.acked(put.written()).await
        };
        r.map_err(unsure_error)
    }

    /// Gives a pending half message its outcome: the commit (for a commit) and the op
    /// record, appended together, and waits until they are acknowledged as a send would be
    /// (written, or durable in sync flush mode). The half stays pending if this fails: a
    /// commit a full disk then cut from the log is not taken for done (it is refused
    /// again, checked again, and can be committed once space returns).
    async fn resolve_half(&self, half: u64, outcome: u8) -> Result<(), ErrorBody> {
        // Resolved from here on: a second outcome arriving meanwhile waits for this one's
        // end (`Resolving`), then is answered from the resolved map (or resolves the half
        // put back to pending) instead of committing twice.
        let Some(h) = self.txn.borrow_mut().pending.remove(&half) else {
            return Err(err(ErrorCode::TransactionNotFound, "resolved meanwhile"));
        };
        (self.txn.borrow_mut().resolved).insert(half, outcome, Some(time_bits(h.stored_ms)));
        let resolving = Resolving::start(&self.txn, half, &h.topic);
        let result = match self.write_outcome(half, &h, outcome).await {
            Ok((copy, put)) => self.acked(put).await.map(|()| (copy, put)),
            Err(e) => Err(e),
        };
        let result = match result {
            Ok((copy, _)) => {
                // A discard is listed once its copy can be read (by the id the list gives);
                // a copy a full disk dropped is not listed (a restart finds the half again).
                let listed = copy.filter(|_| outcome == OUTCOME_DISCARDED);
                if let Some(copy) = listed {
                    let mut txn = self.txn.borrow_mut();
                    txn.discarded += 1;
                    txn.discarded_recent.push_back(HalfMessageInfo {
                        shard: self.id,
                        transaction_id: h.id(half),
                        topic: h.topic.clone(),
                        queue_id: h.queue_id,
                        producer_group: h.group().to_owned(),
                        msg_id: self.msg_id(copy.physical_offset),
                        age_ms: now_ms().saturating_sub(h.stored_ms),
                        checks: h.checks,
                    });
                    if txn.discarded_recent.len() > DISCARDED_LISTED {
                        txn.discarded_recent.pop_front();
                    }
                }
                (self.txn.borrow_mut()).resolve(half, outcome, time_bits(h.stored_ms));
                if outcome == TRANSACTION_COMMIT {
                    self.wake_pollers(&h.topic, h.queue_id);
                }
                Ok(())
            }
            Err(e) => {
                let mut txn = self.txn.borrow_mut();
                txn.resolved.remove(&half);
                // An op record owed for a copy that then failed (cut by a full disk) would
                // resolve the half at the next restart with no message in the log.
                txn.owed_ops.remove(&half);
                txn.pending.insert(half, h);
                Err(e)
            }
        };
        drop(resolving);
        self.hold_halves();
        result
    }

    /// Appends what an outcome writes; returns the put of the message's copy (commit,
    /// discard) and of the op record.
    async fn write_outcome(
        &self,
        half: u64,
        h: &Half,
        outcome: u8,
    ) -> Result<(Option<PutResult>, PutResult), ErrorBody> {
        let record = if outcome == TRANSACTION_ROLLBACK {
            None
        } else {
            Some(
                self.store
                    .read_at(HALF_TOPIC, 0, half)
                    .await
                    .map_err(store_error)?,
            )
        };
        let view =
            match &record {
                Some(r) => Some(RecordView::parse(r).map_err(|e| {
                    err(ErrorCode::StoreCorrupt, format!("half message {half}: {e}"))
                })?),
                None => None,
            };
        if outcome == TRANSACTION_COMMIT {
            // The topic may have gone while the half was read; checked with no await from
            // here to the append (a deletion discards the halves it finds pending after it
            // changed the table, and waits for those being resolved).
            self.known_queue(&h.topic, h.queue_id)?;
        }
        let tran_id = h.id(half).to_string();
        let props;
        let mut copy = None;
        if let Some(view) = &view {
            // A discarded copy keeps where it was going (`REAL_TOPIC`, `REAL_QID`), as a
            // copy in the undeliverable topic does: the list of recent discards is memory
            // only, and the copy may be looked at long after.
            let (topic, queue_id, dropped) = if outcome == TRANSACTION_COMMIT {
                let dropped: &[&str] = &[prop::TRAN_MSG, prop::REAL_TOPIC, prop::REAL_QID];
                (h.topic.as_str(), h.queue_id, dropped)
            } else {
                (DISCARDED_TOPIC, 0, &[prop::TRAN_MSG][..])
            };
            props = rebuild_properties(
                view.properties(),
                dropped,
                &[(prop::TRANSACTION_ID, &tran_id)],
            )?;
            copy = Some(RecordDraft {
                topic,
                queue_id,
                flag: view.flag(),
                // With where its half is in the log (RocketMQ's prepared transaction
                // offset): a restart takes only such a record for this copy.
                sys_flag: SYS_FLAG_TRANSACTION_COMMIT,
                born_timestamp_ms: view.born_timestamp_ms(),
                born_host: view.born_host(),
                reconsume_times: 0,
                transaction_offset: view.physical_offset(),
                properties: &props,
                body: view.body(),
            });
        }
        // The copy and the op record, adjacent in the log, all or nothing: an op record
        // that failed after its copy was appended (the op queue's index could not grow on
        // a full disk) left the half resolved in memory only, not held from retention,
        // until a restart found the copy by its key, if it still could.
        let with_copy = copy.is_some();
        let body = op_body(half, outcome, time_bits(h.stored_ms));
        let drafts = copy.into_iter().chain([op_draft(&body)]);
        let mut puts = Vec::with_capacity(2);
        match self.store.append_batch(drafts, &mut puts) {
            Ok(()) => match puts[..] {
                [copy, op] => Ok((Some(copy), op)),
                [op] => Ok((None, op)),
                _ => Err(err(ErrorCode::Internal, "an outcome's appends miscounted")),
            },
            // Not taken back (the copy's append rolled into a segment whose file is made
            // already, or the log is poisoned): the message is in the log, its op record
            // not. The outcome stands, answered once the message is written; the op record
            // is appended alone, now or at a later check tick (its half held from retention
            // until then), or by a restart, which finds the copy by its key.
            Err(e) if with_copy && puts.len() == 1 => {
                let (copy, bits) = (puts[0], time_bits(h.stored_ms));
                match self.append_op(half, outcome, bits) {
                    Ok(op) => Ok((Some(copy), op)),
                    Err(again) => {
                        self.txn.borrow_mut().owed_ops.insert(half, (outcome, bits));
                        crate::warn!(
                            "ringmq: shard {}: op record of transaction {}: {e}, then {}; appended again at each check tick (or by a restart)",
                            self.id,
                            h.id(half),
                            again.message
                        );
                        Ok((Some(copy), copy))
                    }
                }
            }
            Err(e) => Err(store_error(e)),
        }
    }

    /// A half message to be checked could not be read. For a lasting reason (damaged on
    /// disk, or gone from the log) no check will ever reach its producer, nor a commit
    /// write it: it is let go, said with its id (never delivered; it ages out with its
    /// segment), rather than held, unchecked, counted against its group's allowance until
    /// retention. Any other failure is said and tried again at the next check.
    fn half_unreadable(&self, half: u64, h: &Half, e: ErrorBody) {
        let lasting = e.error_code().is_some_and(retention::never_discarded);
        if lasting && self.txn.borrow_mut().pending.remove(&half).is_some() {
            self.hold_halves();
            crate::warn!(
                "ringmq: shard {}: transaction {} of producer group {} (for {}[{}]) cannot be checked, its half message cannot be read ({}); let go unresolved (never delivered): it ages out with its segment",
                self.id, h.id(half), h.group(), h.topic, h.queue_id, e.message
            );
        } else if !lasting {
            crate::warn!(
                "ringmq: shard {}: transaction {} of producer group {}: its half message could not be read for a check ({}); tried again at the next check",
                self.id, h.id(half), h.group(), e.message
            );
        }
    }

    fn append_op(&self, half: u64, outcome: u8, bits: u16) -> Result<PutResult, ErrorBody> {
        let body = op_body(half, outcome, bits);
        self.store.append(&op_draft(&body)).map_err(store_error)
    }

    /// Appends the op records owed (`Transactions::owed_ops`), oldest first, until one
    /// fails (tried again at the next tick).
    fn append_owed_ops(&self) {
        let owed: Vec<(u64, (u8, u16))> = (self.txn.borrow().owed_ops.iter())
            .map(|(&half, &op)| (half, op))
            .collect();
        if owed.is_empty() {
            return;
        }
        for (half, (outcome, bits)) in owed {
            if self.append_op(half, outcome, bits).is_err() {
                break;
            }
            self.txn.borrow_mut().owed_ops.remove(&half);
        }
        self.hold_halves();
    }

    /// The check-back task of this shard: asks about half messages past their timeout, and
    /// discards those out of checks.
    pub async fn run_transaction_checks(self: Rc<Self>) {
        let tick = Duration::from_millis(
            self.cfg
                .transaction_check_interval_ms
                .min(self.cfg.transaction_timeout_ms)
                .clamp(10, 1_000),
        );
        // Halves that keep retention from deleting are discarded as often as it runs.
        let discard_every = Duration::from_millis(self.cfg.retention_check_interval_ms);
        let mut next_discard = std::time::Instant::now() + discard_every;
        while !self.is_stopping() {
            crate::io::sleep(tick).await;
            if std::time::Instant::now() >= next_discard {
                next_discard = std::time::Instant::now() + discard_every;
                self.discard_halves_past_retention().await;
            }
            self.forget_cut_halves();
            // A half whose send a full disk cut holds nothing back from then on.
            self.hold_halves();
            self.append_owed_ops();
            let now = now_ms();
            let interval = self.cfg.transaction_check_interval_ms;
            let due: Vec<u64> = {
                let mut txn = self.txn.borrow_mut();
                let due: Vec<u64> = (txn.pending.iter_from(txn.check_cursor))
                    .filter(|(_, h)| h.next_check_ms <= now)
                    .map(|(k, _)| *k)
                    .take(CHECKS_PER_ROUND_MAX)
                    .collect();
                if let Some(last) = due.last() {
                    txn.check_cursor = last + 1;
                }
                due
            };
            for half in due {
                // Resolved while the round awaited an earlier one: not checked.
                let Some(h) = self.txn.borrow().pending.get(&half).cloned() else {
                    continue;
                };
                if h.checks >= self.cfg.transaction_check_max {
                    let discarded = self.resolve_half(half, OUTCOME_DISCARDED).await;
                    if discarded.is_err() {
                        // Put back as it was: tried again a check interval on, not every
                        // round (each try reads the half again and says why it failed).
                        if let Some(p) = self.txn.borrow_mut().pending.get_mut(&half) {
                            p.next_check_ms = now + interval;
                        }
                    }
                    match discarded {
                        Ok(_) => {
                            // The kept copy's id (`ringmq message id` reads it; the half's
                            // own is of a system topic).
                            let copy = self.txn.borrow().discarded_recent.back().and_then(|d| {
                                (d.transaction_id == h.id(half)).then(|| d.msg_id.clone())
                            });
                            crate::warn!(
                                "ringmq: shard {}: transaction {} of producer group {} (for {}[{}]) discarded after {} checks; kept in {DISCARDED_TOPIC} as message {}",
                                self.id, h.id(half), h.group(), h.topic, h.queue_id, h.checks,
                                copy.as_deref().unwrap_or("(none: a full disk cut the copy)")
                            );
                        }
                        // Its half cannot be read (damaged, or gone): let go as at a check.
                        Err(e)
                            if e.error_code().is_some_and(|c| {
                                c != ErrorCode::DiskFull && retention::never_discarded(c)
                            }) =>
                        {
                            self.half_unreadable(half, &h, e)
                        }
                        Err(e) => crate::warn!(
                            "ringmq: shard {}: discarding transaction {}: {}",
                            self.id,
                            h.id(half),
                            e.message
                        ),
                    }
                    continue;
                }
                if let Some(p) = self.txn.borrow_mut().pending.get_mut(&half) {
                    p.next_check_ms = now + interval;
                    p.attempts = p.attempts.wrapping_add(1);
                }
                let coordinator = self.coordinator_of(h.group());
                if coordinator == self.id && !self.has_producer(h.group()) {
                    // Nobody to ask here: the half is not read (up to 4 MiB, each round).
                    self.check_not_delivered(half, now);
                    continue;
                }
                let record = match self.store.read_at(HALF_TOPIC, 0, half).await {
                    Ok(r) => r.to_vec(),
                    Err(e) => {
                        self.half_unreadable(half, &h, store_error(e));
                        continue;
                    }
                };
                if self.txn.borrow().pending.get(&half).is_none() {
                    continue;
                }
                let check = CheckTransaction {
                    topic: h.topic.clone(),
                    queue_id: h.queue_id,
                    transaction_id: h.id(half),
                    producer_group: h.group().to_owned(),
                    record,
                };
                let mut frame = Vec::new();
                if encode_frame(0, Flags::NONE, &check, &[], &mut frame).is_err() {
                    continue;
                }
                // Turns start at the half's offset: the halves' first checks go round the
                // producers too, not all to the same one.
                let turn = (h.attempts as usize).wrapping_add(half as usize);
                // Awaited from before the push: a fast checker's answer may come back
                // before the push's own answer does.
                let was_awaiting = (self.txn.borrow_mut().pending.get_mut(&half))
                    .map(|p| std::mem::replace(&mut p.awaiting_answer, true));
                let asked = if coordinator == self.id {
                    self.ask_producer(h.group(), turn, frame).await
                } else {
                    let ask = MeshRequest::AskProducer {
                        group: h.group().to_owned(),
                        turn,
                        frame,
                    };
                    self.call(coordinator, ask).await.is_ok()
                };
                if !asked {
                    if was_awaiting == Some(false) {
                        if let Some(p) = self.txn.borrow_mut().pending.get_mut(&half) {
                            p.awaiting_answer = false;
                        }
                    }
                    self.check_not_delivered(half, now);
                }
            }
        }
    }

    /// A check of `half` that reached no producer. A check counts only once a checker
    /// answers it "unknown" (see `end_transaction`): a group with no live producer, one
    /// whose connection could not take the check (too much queued), or one that never
    /// answers loses no transaction to the check limit. A check not delivered comes back
    /// within the interval, at a random time: the checks that fill a connection first are
    /// not the same ones each round.
    fn check_not_delivered(&self, half: u64, now: u64) {
        let mut txn = self.txn.borrow_mut();
        txn.checks_undelivered += 1;
        if let Some(p) = txn.pending.get_mut(&half) {
            let interval = self.cfg.transaction_check_interval_ms.max(2);
            p.next_check_ms = now + interval / 2 + rand::random::<u64>() % (interval / 2);
        }
    }

    /// This shard's part of `ListTransactions`: its oldest unresolved half messages (at
    /// most [`TRANSACTIONS_LISTED_MAX`]), their count, and its discards.
    pub(super) fn local_transactions(&self) -> TransactionList {
        let now = now_ms();
        let txn = self.txn.borrow();
        let halves = (txn.pending.iter())
            .take(TRANSACTIONS_LISTED_MAX)
            .map(|(half, h)| HalfMessageInfo {
                shard: self.id,
                transaction_id: h.id(*half),
                topic: h.topic.clone(),
                queue_id: h.queue_id,
                producer_group: h.group().to_owned(),
                msg_id: h.msg_id.clone(),
                age_ms: now.saturating_sub(h.stored_ms),
                checks: h.checks,
            })
            .collect();
        TransactionList {
            halves,
            unresolved: txn.pending.len() as u64,
            discarded: txn.discarded,
            recently_discarded: txn.discarded_recent.iter().cloned().collect(),
        }
    }

    /// `ListTransactions`: every shard's unresolved half messages, the oldest
    /// [`TRANSACTIONS_LISTED_MAX`] of them listed (an answer must fit a frame, and 200,000
    /// a shard would not), and all of them counted.
    pub(super) async fn list_transactions(self: Rc<Self>) -> Result<TransactionList, ErrorBody> {
        let mut all = self.local_transactions();
        for to in (0..self.shard_count).filter(|&s| s != self.id) {
            if let MeshReply::Transactions(part) =
                self.call(to, MeshRequest::ListTransactions).await?
            {
                all.halves.extend(part.halves);
                all.unresolved += part.unresolved;
                all.discarded += part.discarded;
                all.recently_discarded.extend(part.recently_discarded);
            }
        }
        // The oldest first (within a shard, ties of a millisecond go to the lower id: the
        // listed ones of each shard are its lowest ids), then in order of shard and id.
        all.halves
            .sort_by_key(|h| (std::cmp::Reverse(h.age_ms), h.shard, h.transaction_id));
        all.halves.truncate(TRANSACTIONS_LISTED_MAX);
        all.halves.sort_by_key(|h| (h.shard, h.transaction_id));
        all.recently_discarded
            .sort_by_key(|h| (h.shard, h.transaction_id));
        Ok(all)
    }
}

/// The op record of an outcome; `body` is its [`op_body`].
fn op_draft(body: &[u8]) -> RecordDraft<'_> {
    RecordDraft {
        topic: OP_TOPIC,
        queue_id: 0,
        flag: 0,
        sys_flag: 0,
        born_timestamp_ms: crate::log::now_ms(),
        born_host: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        reconsume_times: 0,
        transaction_offset: 0,
        properties: &[],
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_records_round_trip() {
        for (half, outcome, bits) in [(0, TRANSACTION_COMMIT, 7), (u64::MAX, OUTCOME_DISCARDED, 0)]
        {
            let parsed = parse_op(&op_body(half, outcome, bits));
            assert_eq!(parsed, Some((half, outcome, Some(bits))));
        }
        assert_eq!(parse_op(&[1, 2, 3]), None);
        // Written before op records kept the time bits.
        let older = &op_body(5, TRANSACTION_ROLLBACK, 9)[..9];
        assert_eq!(parse_op(older), Some((5, TRANSACTION_ROLLBACK, None)));
    }
}
