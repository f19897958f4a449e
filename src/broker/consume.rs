//! The consume path: pulls with long polling (answered at once when records or a definite
//! status are there, else held until a send to the queue is readable or the wait runs
//! out), queue bounds and the offset of a time. Pull answers are the frame head followed by
//! the stored record bytes as the store read them.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::answer::{Answer, AnswerHold};
use super::{err, error_frame, PollStep};
use super::{store_error, ShardCtx};
use crate::protocol::record::RecordView;
use crate::protocol::sql::{with_values_of, SqlFilter};
use crate::protocol::{
    encode_frame_head, ErrorBody, ErrorCode, Flags, Offset, Pull, PullResult, PullStatus,
    SearchOffsetByTimestamp,
};
use crate::store::StoreError;

/// Longest a pull may be held.
pub const PULL_WAIT_MS_MAX: u32 = 60_000;
/// Most tag hashes one pull may filter on (each stored message is compared with all).
pub const TAG_HASHES_MAX: usize = 64;
/// Most messages one pull may ask for.
pub const PULL_MESSAGES_MAX: u32 = 1024;
/// Distinct SQL92 filters a shard keeps parsed (4 KiB each at most); past it the cache
/// drops those no waiting pull holds (all, if that is not enough).
pub const SQL_FILTERS_CACHED_MAX: usize = 1024;
/// Most bytes of expressions the filters a shard keeps parsed may have together; past it
/// the cache drops as above. A parsed expression takes up to about 15 times its text
/// ([`SqlFilter::heap_bytes`]), so the cache holds about 4 MiB at most. Filters that
/// pulls hold while they wait count under `--sql-filters-mb` too.
pub const SQL_FILTERS_CACHED_BYTES_MAX: usize = 256 << 10;
/// What one filtered pull may look at ([`SqlFilter::work_per_record`]: bytes of property
/// values, once per comparison) before it answers the records it checked and leaves the
/// rest to the next pull: a long expression over large properties took seconds of the
/// shard's thread per pull.
pub const SQL_PULL_WORK_MAX: usize = 8 << 20;

/// A parsed SQL92 filter, counted in its shard's total (`--sql-filters-mb`) for as long as
/// it lives: in the shard's cache, or held by a pull while it waits.
pub(super) struct LiveFilter {
    pub(super) filter: SqlFilter,
    bytes: usize,
    live: Rc<std::cell::Cell<usize>>,
}

impl Drop for LiveFilter {
    fn drop(&mut self) {
        self.live.set(self.live.get() - self.bytes);
    }
}

/// A long poll's place among those waiting on its shard (`--long-polls-max`), given back
/// when the poll ends however it ends; a request waiting for room for its answer takes
/// one too while it waits.
pub(super) struct LongPoll<'a>(&'a std::cell::Cell<usize>);

impl Drop for LongPoll<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl ShardCtx {
    /// A place for a pull about to wait, or `BrokerBusy` past `--long-polls-max` (each
    /// waiting poll holds a few KiB: a client pipelining polls on many connections would
    /// otherwise hold the shard's memory).
    pub(super) fn long_poll(&self) -> Result<LongPoll<'_>, ErrorBody> {
        let waiting = self.long_polls.get();
        if waiting >= self.cfg.long_polls_max {
            return Err(err(
                ErrorCode::BrokerBusy,
                format!(
                    "shard {} holds {waiting} long polls and requests waiting for room for their answers, its limit (--long-polls-max); try again later",
                    self.id
                ),
            ));
        }
        self.long_polls.set(waiting + 1);
        Ok(LongPoll(&self.long_polls))
    }

    /// Room for an answer of `bytes` to `conn` ([`AnswerBudgets::reserve`]); a request
    /// that has to wait for it (the shard's answers wait for slow readers, or its own
    /// connection's do) holds a place among the shard's waiting polls meanwhile
    /// (`--long-polls-max`, `BrokerBusy` past it): else connections pipelining requests
    /// behind a spent budget would each hold up to 1,024 of them, unbounded in all.
    pub(super) async fn reserve_answer(
        &self,
        conn: u64,
        bytes: usize,
    ) -> Result<AnswerHold, ErrorBody> {
        let ours = self.conn_is_ours(conn);
        if let Some(hold) = self.answers.try_reserve(conn, ours, bytes)? {
            return Ok(hold);
        }
        let _waiting = self.long_poll()?;
        self.answers.reserve(conn, ours, bytes).await
    }

    fn poll_notify(&self, topic: &str, queue_id: u32) -> Rc<Notify> {
        self.polls
            .borrow_mut()
            .entry((topic.to_owned(), queue_id))
            .or_insert_with(|| Rc::new(Notify::new()))
            .clone()
    }

    /// The parsed form of a pull's SQL92 filter: parsed once per shard and expression.
    /// `BrokerBusy` if it would take the filters alive on the shard past `--sql-filters-mb`
    /// (each waiting pull holds its own: distinct long expressions, one per poll, held
    /// gigabytes).
    fn sql_filter(&self, expression: &str) -> Result<Rc<LiveFilter>, ErrorBody> {
        if let Some(f) = self.sql_filters.borrow().get(expression) {
            return Ok(f.clone());
        }
        let filter = SqlFilter::parse(expression)
            .map_err(|e| err(ErrorCode::BadFilterExpression, e.to_string()))?;
        let bytes = filter.heap_bytes() + expression.len();
        let max = self.cfg.sql_filters_bytes_max;
        let mut cache = self.sql_filters.borrow_mut();
        let full = |cache: &HashMap<String, Rc<LiveFilter>>| {
            let cached_bytes: usize = cache.keys().map(String::len).sum();
            cache.len() >= SQL_FILTERS_CACHED_MAX
                || cached_bytes + expression.len() > SQL_FILTERS_CACHED_BYTES_MAX
                || self.sql_filters_live.get() + bytes > max
        };
        if full(&cache) {
            // Those no waiting pull holds go first (dropping the others frees nothing
            // until their pulls end, and their next pulls would parse them again).
            cache.retain(|_, f| Rc::strong_count(f) > 1);
            if full(&cache) {
                cache.clear();
            }
        }
        let live = self.sql_filters_live.get();
        if live + bytes > max {
            return Err(err(
                ErrorCode::BrokerBusy,
                format!(
                    "shard {} holds {} KiB of parsed SQL92 filters of waiting pulls, and this one takes {} KiB more than its limit allows (--sql-filters-mb {}); try again later",
                    self.id,
                    live >> 10,
                    bytes >> 10,
                    max >> 20
                ),
            ));
        }
        self.sql_filters_live.set(live + bytes);
        let parsed = Rc::new(LiveFilter {
            filter,
            bytes,
            live: self.sql_filters_live.clone(),
        });
        cache.insert(expression.to_owned(), parsed.clone());
        Ok(parsed)
    }

    pub(super) fn wake_pollers(&self, topic: &str, queue_id: u32) {
        if let Some(n) = self.polls.borrow().get(&(topic.to_owned(), queue_id)) {
            n.notify_waiters();
        }
    }

    /// The first kept (`pick` = min) or one past the last (max) offset of a queue.
    pub(super) fn queue_bound(
        &self,
        topic: &str,
        queue_id: u32,
        pick: impl Fn(u64, u64) -> u64,
    ) -> Result<Offset, ErrorBody> {
        self.known_queue(topic, queue_id)?;
        let (min, max) = self
            .store
            .queue_range(topic, queue_id)
            .map_err(store_error)?;
        Ok(Offset {
            offset: pick(min, max),
            incarnation: self.position_incarnation(topic),
        })
    }

    /// `SearchOffsetByTimestamp`.
    pub(super) async fn offset_by_time(
        self: Rc<Self>,
        m: SearchOffsetByTimestamp,
    ) -> Result<Offset, ErrorBody> {
        self.learn_queue(&m.topic, m.queue_id).await?;
        let offset = self
            .store
            .offset_by_timestamp(&m.topic, m.queue_id, m.timestamp_ms)
            .await
            .map_err(store_error)?;
        Ok(Offset {
            offset,
            incarnation: self.position_incarnation(&m.topic),
        })
    }

    /// After a pull awaited something: its topic deleted meanwhile is an error; deleted and
    /// created again (`born` changed), its position, an offset of the old topic, names
    /// nothing in the new one and goes to the new queue's start, under the new topic's
    /// incarnation: `Some((status, next, min, max))`. `None`: the topic is as it was.
    fn topic_changed(
        &self,
        p: &Pull,
        born: u64,
        incarnation: &std::cell::Cell<u64>,
    ) -> Result<Option<(PullStatus, u64, u64, u64)>, ErrorBody> {
        self.known_queue(&p.topic, p.queue_id)?;
        if self.topics.borrow().born(&p.topic) == born {
            return Ok(None);
        }
        let (min, max) = self
            .store
            .queue_range(&p.topic, p.queue_id)
            .map_err(store_error)?;
        incarnation.set(self.position_incarnation(&p.topic));
        let moved = if p.offset > min {
            PullStatus::OffsetTooBig
        } else {
            PullStatus::NoNewMessage
        };
        Ok(Some((moved, min, min, max)))
    }

    /// A pull with long polling: answered at once when records (or a definite status) are
    /// there, else held until a message lands in the queue or the wait runs out. `poll`:
    /// all of it, or one of the two steps of a forwarded one ([`PollStep`]).
    pub(super) async fn pull(
        self: Rc<Self>,
        request_id: u64,
        conn: u64,
        max_bytes: usize,
        poll: PollStep,
        p: Pull,
    ) -> Result<Answer, ErrorBody> {
        // Before any wait (learning the topic can take a call to shard 0): the request's
        // filter is held meanwhile, and a frame can carry megabytes of it.
        if p.tag_hashes.len() > TAG_HASHES_MAX {
            return Err(err(
                ErrorCode::BadFilterExpression,
                format!(
                    "a pull filters on {} tags; at most {TAG_HASHES_MAX}",
                    p.tag_hashes.len()
                ),
            ));
        }
        SqlFilter::check_length(&p.sql)
            .map_err(|e| err(ErrorCode::BadFilterExpression, e.to_string()))?;
        self.learn_queue(&p.topic, p.queue_id).await?;
        let max_messages = if p.max_messages == 0 {
            crate::protocol::PULL_BATCH_DEFAULT
        } else {
            p.max_messages.min(PULL_MESSAGES_MAX)
        };
        // Parsed before anything is read: a bad expression is an error, not an empty queue.
        let sql = if p.sql.is_empty() {
            None
        } else {
            Some(self.sql_filter(&p.sql)?)
        };
        // Its text (up to 4 KiB) is not held while the poll waits: the parsed filter,
        // shared through the shard's cache and counted under `--sql-filters-mb`, is.
        let p = Pull {
            sql: String::new(),
            ..p
        };

        let started = Instant::now();
        let wait_ms = match poll {
            PollStep::Read => 0,
            PollStep::Whole | PollStep::Wait => p.max_wait_ms.min(PULL_WAIT_MS_MAX),
        };
        let deadline = Instant::now() + Duration::from_millis(wait_ms as u64);
        // What names the answer's position: changed only by the topic's creation again.
        let born = self.topics.borrow().born(&p.topic);
        let incarnation = std::cell::Cell::new(self.incarnation_after(born));
        let status = |status, next_offset, min_offset, max_offset| {
            let r = PullResult {
                status,
                next_offset,
                min_offset,
                max_offset,
                count: 0,
                incarnation: incarnation.get(),
            };
            Ok(Answer::from(pull_frame(request_id, &r, &[])))
        };
        // Below the queue's start (`min`: where it starts now).
        let below_start = |min| {
            let (_, max) = (self.store)
                .queue_range(&p.topic, p.queue_id)
                .map_err(store_error)?;
            status(PullStatus::OffsetTooSmall, min, min, max)
        };
        // A position read under an earlier run of this shard, past where the queue ended
        // when a later run started: what the puller read there, a crash lost (an async
        // log's unsynced tail), and those offsets hold other messages now. Back to that
        // end, even if the queue has grown past the position since. Or one read in an
        // older topic of the name (deleted, and this one created since): back to the
        // start, even if it is within the queue now.
        let lost_past = self
            .position_moved(&p.topic, p.queue_id, p.offset, p.incarnation, born)
            .map_err(store_error)?;
        if let Some(kept) = lost_past {
            let (min, max) = self
                .store
                .queue_range(&p.topic, p.queue_id)
                .map_err(store_error)?;
            return status(PullStatus::OffsetTooBig, kept.max(min), min, max);
        }
        let notify = self.poll_notify(&p.topic, p.queue_id);
        // This poll's place among the shard's waiting ones, taken when it first waits.
        let mut waiting: Option<LongPoll<'_>> = None;
        loop {
            let notified = notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let plan = self.store.plan_queue_read(
                &p.topic,
                p.queue_id,
                p.offset,
                max_messages,
                max_bytes,
                &p.tag_hashes,
            );
            match plan {
                // Records to read: what the wait of a forwarded pull waits for.
                Ok(plan) if !plan.is_empty() && poll == PollStep::Wait => {
                    return status(
                        PullStatus::Found,
                        p.offset,
                        plan.min_offset,
                        plan.max_offset,
                    );
                }
                Ok(plan) if !plan.is_empty() => {
                    // Room for the answer first: a client that does not read its answers
                    // holds its pulls here, not their records in memory. One that has to
                    // wait for it holds a place meanwhile (under the one it took to wait
                    // for a message, if it did: one each).
                    let mut hold = match waiting {
                        Some(_) => {
                            let ours = self.conn_is_ours(conn);
                            (self.answers.reserve(conn, ours, plan.bytes())).await?
                        }
                        None => self.reserve_answer(conn, plan.bytes()).await?,
                    };
                    let fetched = self.store.fetch(plan).await;
                    // Deleted, or deleted and created again, while the answer's room or
                    // the records were waited for: what was read is the old topic's.
                    if let Some((moved, next, min, max)) =
                        self.topic_changed(&p, born, &incarnation)?
                    {
                        return status(moved, next, min, max);
                    }
                    let mut r = match fetched {
                        Ok(r) => r,
                        // Retention deleted the records while the room was waited for.
                        Err(StoreError::OffsetTooSmall { min, .. }) => return below_start(min),
                        Err(e) => return Err(store_error(e)),
                    };
                    // Records shared with the cache keep its whole buffers alive while the
                    // answer waits, as do the other bytes of the reads that took them: that
                    // memory is reserved too, or the records are copied.
                    // (A little past its bytes, such as a disk read's alignment, is not worth a
                    // copy; nor is a forwarded read's, which is copied into its answer now.)
                    let beyond = r.held_beyond();
                    if beyond > 0
                        && !self.answers.try_grow(&mut hold, conn, beyond)
                        && beyond > (r.bytes_len() / 8).max(64 << 10)
                        && poll != PollStep::Read
                    {
                        r.compact();
                    }
                    // A filtered pull looks at as many messages as it asks for and answers
                    // those that match: each pull moves the position by its batch, so a
                    // consumer pipelining pulls predicts where the next starts.
                    if let Some(live) = &sql {
                        let mut work = SqlWork::new();
                        r.retain_checked(|bytes| matches_sql(bytes, &live.filter, &mut work));
                    }
                    if r.is_empty() {
                        // The whole window was filtered out: go on past it.
                        return status(
                            PullStatus::NoMatchedMessage,
                            r.next_offset,
                            r.min_offset,
                            r.max_offset,
                        );
                    }
                    let st = &self.stats;
                    let bytes = r.bytes_len();
                    st.pulled_messages
                        .set(st.pulled_messages.get() + r.len() as u64);
                    st.pulled_bytes.set(st.pulled_bytes.get() + bytes as u64);
                    st.pull.borrow_mut().record(started.elapsed());
                    let meta = PullResult {
                        status: PullStatus::Found,
                        next_offset: r.next_offset,
                        min_offset: r.min_offset,
                        max_offset: r.max_offset,
                        count: r.len() as u32,
                        incarnation: incarnation.get(),
                    };
                    // The records follow the head from where the store read them.
                    let head = records_head(request_id, &meta, bytes)?;
                    return Ok(Answer::with_records(head, r, hold));
                }
                Ok(r) if r.next_offset > p.offset => {
                    return status(
                        PullStatus::NoMatchedMessage,
                        r.next_offset,
                        r.min_offset,
                        r.max_offset,
                    );
                }
                Ok(r) => {
                    let now = Instant::now();
                    if now >= deadline || self.stopping.get() {
                        return status(
                            PullStatus::NoNewMessage,
                            r.next_offset,
                            r.min_offset,
                            r.max_offset,
                        );
                    }
                    if waiting.is_none() {
                        waiting = Some(self.long_poll()?);
                    }
                    let wait = crate::io::sleep(deadline - now);
                    let woken = async {
                        futures_lite::future::or(notified, wait).await;
                        Ok(())
                    };
                    // A long poll ends with its connection (the client is gone, and the
                    // connection's place with it once its requests end); at once if it
                    // closed already.
                    let ours = self.conn_is_ours(conn);
                    self.answers.unless_closed(conn, ours, woken).await?;
                    // Woken by the topic's deletion (its notifier is gone): say so now rather
                    // than park again on a notifier nothing wakes. Deleted and created again
                    // meanwhile: the position, checked against the topic before, names an
                    // offset of the old one (`position_moved`).
                    if let Some((moved, next, min, max)) =
                        self.topic_changed(&p, born, &incarnation)?
                    {
                        return status(moved, next, min, max);
                    }
                }
                Err(StoreError::OffsetTooSmall { min, .. }) => return below_start(min),
                // Past the end. A position read under this run (named by it: one read under
                // an earlier run was looked at above) names another queue than this one,
                // such as one of a topic deleted and created again, whose new messages sit
                // below it: back to the queue's start while retention has not touched it
                // (RocketMQ's rule), so they are delivered, not skipped. An unnamed
                // position (a position given by hand, an old local file) goes to the end.
                Err(StoreError::OffsetTooBig { max, .. }) => {
                    let (min, _) = self
                        .store
                        .queue_range(&p.topic, p.queue_id)
                        .map_err(store_error)?;
                    let this_run = p.incarnation == incarnation.get();
                    let next = if this_run && min == 0 { min } else { max };
                    return status(PullStatus::OffsetTooBig, next, min, max);
                }
                Err(e) => return Err(store_error(e)),
            }
        }
    }
}

/// What a filtered pull has left to look at ([`SQL_PULL_WORK_MAX`]).
struct SqlWork {
    left: usize,
    checked: bool,
}

impl SqlWork {
    fn new() -> SqlWork {
        SqlWork {
            left: SQL_PULL_WORK_MAX,
            checked: false,
        }
    }
}

/// Whether a stored record matches an SQL92 filter, evaluated over its property block in
/// place, or must go to the consumer anyway: a damaged record is never skipped unseen. The
/// store checked the structure of what it read, not the CRC (the consumer checks it); a
/// record the filter would skip has its CRC checked here, and a damaged one is answered
/// so that the consumer's check reports it. `None`: not checked, `work` would run out
/// (the first record of a pull is always checked, so each pull moves on).
fn matches_sql(bytes: &[u8], filter: &SqlFilter, work: &mut SqlWork) -> Option<bool> {
    let Ok(view) = RecordView::parse_unchecked_crc(bytes) else {
        return Some(true);
    };
    // One pass over the record's properties, however often the expression names them
    // (a lookup per name walked them all each time: a long expression over records of
    // many properties held the shard for seconds).
    let props = view.properties();
    let cost = filter.work_per_record(props.as_bytes().len());
    if work.checked && cost > work.left {
        return None;
    }
    work.left = work.left.saturating_sub(cost);
    work.checked = true;
    let matches = with_values_of(filter, &props, |values| filter.matches_values(values));
    Some(matches || RecordView::parse(bytes).is_err())
}

/// An answer whose meta part is followed by stored records, copied straight from where
/// the store read them.
pub(super) fn with_records_frame<M: crate::protocol::Message>(
    request_id: u64,
    meta: &M,
    parts: &[&[u8]],
) -> Vec<u8> {
    let tail: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = match records_head(request_id, meta, tail) {
        Ok(head) => head,
        Err(e) => return error_frame(request_id, &e),
    };
    out.reserve(tail);
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

/// The head (frame header and meta) of an answer whose `tail_len` bytes of stored records
/// follow it.
fn records_head<M: crate::protocol::Message>(
    request_id: u64,
    meta: &M,
    tail_len: usize,
) -> Result<Vec<u8>, ErrorBody> {
    let mut head = Vec::with_capacity(128);
    encode_frame_head(request_id, Flags::NONE, meta, tail_len, &mut head)
        .map_err(|e| err(ErrorCode::Internal, format!("encode: {e}")))?;
    Ok(head)
}

fn pull_frame(request_id: u64, meta: &PullResult, parts: &[&[u8]]) -> Vec<u8> {
    with_records_frame(request_id, meta, parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record::{Placement, PropertiesBuilder, RecordDraft};

    #[test]
    fn a_damaged_record_the_filter_would_skip_goes_to_the_consumer() {
        let mut props = PropertiesBuilder::new();
        props.put("a", "1").unwrap();
        let props = props.into_bytes();
        let draft = RecordDraft::plain("t", 0, &props, b"body");
        let mut record = draft.encode(Placement {
            queue_offset: 0,
            physical_offset: 0,
            store_timestamp_ms: 0,
        });
        let (keep, skip) = (
            SqlFilter::parse("a = 1").unwrap(),
            SqlFilter::parse("a = 2").unwrap(),
        );
        let check = |record: &[u8], filter: &SqlFilter| {
            matches_sql(record, filter, &mut SqlWork::new()).unwrap()
        };
        assert!(check(&record, &keep));
        assert!(!check(&record, &skip));
        // One bit of the body flipped: the CRC no longer matches.
        *record.last_mut().unwrap() ^= 1;
        assert!(check(&record, &keep));
        assert!(check(&record, &skip), "a damaged record was filtered out");
    }

    /// A pull's filter looks at what [`SQL_PULL_WORK_MAX`] allows, then stops: its first
    /// record is checked however costly, the next only if the work left covers it.
    #[test]
    fn a_filtered_pull_stops_checking_where_its_work_runs_out() {
        let mut props = PropertiesBuilder::new();
        props.put("a", &"7".repeat(60_000)).unwrap();
        let props = props.into_bytes();
        let record = RecordDraft::plain("t", 0, &props, b"body").encode(Placement {
            queue_offset: 0,
            physical_offset: 0,
            store_timestamp_ms: 0,
        });
        let cheap = SqlFilter::parse("a > 1").unwrap();
        let costly = vec!["a > 1"; 200].join(" OR ");
        let costly = SqlFilter::parse(&costly).unwrap();
        assert!(costly.work_per_record(props.len()) > SQL_PULL_WORK_MAX);
        let mut work = SqlWork::new();
        assert_eq!(matches_sql(&record, &costly, &mut work), Some(true));
        assert_eq!(matches_sql(&record, &costly, &mut work), None);
        assert_eq!(matches_sql(&record, &cheap, &mut work), None, "none left");
        let mut work = SqlWork::new();
        let each = cheap.work_per_record(props.len());
        for _ in 0..SQL_PULL_WORK_MAX / each {
            assert_eq!(matches_sql(&record, &cheap, &mut work), Some(true));
        }
        assert_eq!(matches_sql(&record, &cheap, &mut work), None);
    }
}
