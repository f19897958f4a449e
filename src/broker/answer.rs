//! Answers on their way to a client, and the byte budgets that bound them.
//!
//! A client that pipelines pulls and never reads the answers must not make the broker hold
//! them without limit. Answers that carry stored records (pulls, lookups) reserve their
//! size before the records are read, and large answers without records (listings) room
//! for an upper bound of their size (the largest frame at most) before they are built: from the budget of the connection they will be
//! written to (`CONN_ANSWER_BYTES_MAX`-sized, when the connection is on this shard) and
//! from the shard's budget (all connections together). The reservation travels with the
//! answer ([`Answer`]) and is given back once the answer is written or dropped; a pull
//! whose connection has no budget left waits, and one whose connection closed fails. The
//! shard runtime stops reading a connection's requests while its queued answers are over
//! their limit, so a client that does not read is held back by TCP itself.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{err, response_frame};
use crate::protocol::{ErrorBody, ErrorCode, Response};
use crate::store::QueueRead;

/// Budgets count in units of this many bytes.
const UNIT_BYTES: usize = 1024;

/// Bytes of record-carrying answers one connection may have reserved (queued or being
/// built), at least; raised to hold two of the largest frames.
pub const CONN_ANSWER_BYTES_MIN: usize = 32 << 20;
/// Bytes of record-carrying answers all connections of a shard may have reserved, at least;
/// raised to hold eight of the largest frames.
pub const SHARD_ANSWER_BYTES_MIN: usize = 256 << 20;

/// An answer frame, with the budget it holds until it is written.
///
/// A pull answer is not assembled: its head (frame header and meta) is followed on the wire
/// by the stored records, sent from the buffers the store read them into (a vectored
/// write), so no record is copied into the frame.
pub struct Answer {
    /// The whole frame, or its head when `records` follow it.
    head: Vec<u8>,
    records: Option<QueueRead>,
    _hold: Option<AnswerHold>,
}

impl Answer {
    pub fn held(bytes: Vec<u8>, hold: AnswerHold) -> Answer {
        Answer {
            head: bytes,
            records: None,
            _hold: Some(hold),
        }
    }
    /// A frame of `head` (encoded for a tail of `records.bytes_len()` bytes) followed by
    /// `records`, written from where they were read.
    pub fn with_records(head: Vec<u8>, records: QueueRead, hold: AnswerHold) -> Answer {
        Answer {
            head,
            records: Some(records),
            _hold: Some(hold),
        }
    }
    /// The frame's bytes in order, in as few parts as they are stored in.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> + '_ {
        std::iter::once(&self.head[..]).chain(self.records.iter().flat_map(|r| r.runs()))
    }
    pub fn len(&self) -> usize {
        self.head.len() + self.records.as_ref().map_or(0, |r| r.bytes_len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The frame alone, in one buffer (its reservation is given back): what crosses to
    /// another shard.
    pub fn into_bytes(self) -> Vec<u8> {
        match &self.records {
            None => self.head,
            Some(_) => {
                let mut out = Vec::with_capacity(self.len());
                for part in self.parts() {
                    out.extend_from_slice(part);
                }
                out
            }
        }
    }
}

impl From<Vec<u8>> for Answer {
    fn from(bytes: Vec<u8>) -> Answer {
        Answer {
            head: bytes,
            records: None,
            _hold: None,
        }
    }
}

/// Bytes of requests one shard holds copied while they wait, at least; raised to hold eight
/// of the largest frames.
pub const SHARD_HELD_REQUEST_BYTES_MIN: usize = 256 << 20;
/// Bytes of those one client connection may have held on a shard, at least; raised to hold
/// two of the largest frames.
pub const CONN_HELD_REQUEST_BYTES_MIN: usize = 32 << 20;
/// The last this many bytes of a shard's budget are for requests of at most
/// [`HELD_SMALL_REQUEST_BYTES`] (group heartbeats, locks, topic admin: what a shard-aware
/// client's bootstrap connection has passed on), so large sends held for a slow shard do not
/// refuse them.
pub const HELD_RESERVE_BYTES: usize = 32 << 20;
pub const HELD_SMALL_REQUEST_BYTES: usize = 64 << 10;

/// The requests a shard holds copied while they wait: frames passed on to another shard
/// until its answer comes (what a client sends to another shard than the one that handles
/// it: a queue's sends from a client that is not shard aware, group and admin requests on a
/// client's bootstrap connection), sends kept until their topic is known or their turn in
/// its line comes, messages sent back for retry until their copy is durable, and what a
/// lookup by key found until there is room for its answer. Each
/// connection's requests in flight are bounded by count; this bounds their bytes, per
/// client connection (by its address, which a request passed on keeps) and for the shard.
/// Past either such a request is refused at once with `BrokerBusy` (the copy is what is
/// counted: it is not made and then waited on).
pub struct HeldRequests {
    used: Cell<usize>,
    max: usize,
    conn_max: usize,
    by_conn: RefCell<HashMap<SocketAddr, usize>>,
}

/// A request's bytes in [`HeldRequests`]; dropping it gives them back.
pub struct HeldRequest {
    of: Rc<HeldRequests>,
    peer: SocketAddr,
    bytes: usize,
}

impl Drop for HeldRequest {
    fn drop(&mut self) {
        self.of.used.set(self.of.used.get() - self.bytes);
        let mut by_conn = self.of.by_conn.borrow_mut();
        if let Some(held) = by_conn.get_mut(&self.peer) {
            *held -= self.bytes;
            if *held == 0 {
                by_conn.remove(&self.peer);
            }
        }
    }
}

impl HeldRequests {
    pub fn new(frame_bytes_max: usize) -> Rc<HeldRequests> {
        let max = SHARD_HELD_REQUEST_BYTES_MIN.max(frame_bytes_max.saturating_mul(8));
        Rc::new(HeldRequests {
            used: Cell::new(0),
            max: max.saturating_add(HELD_RESERVE_BYTES),
            conn_max: CONN_HELD_REQUEST_BYTES_MIN.max(frame_bytes_max.saturating_mul(2)),
            by_conn: RefCell::new(HashMap::new()),
        })
    }

    /// Takes `bytes` for a request of the client at `peer` held on shard `shard`, or
    /// refuses it.
    pub fn hold(
        self: &Rc<Self>,
        bytes: usize,
        shard: u32,
        peer: SocketAddr,
    ) -> Result<HeldRequest, ErrorBody> {
        let used = self.used.get();
        let conn_used = self.by_conn.borrow().get(&peer).copied().unwrap_or(0);
        let room = if bytes <= HELD_SMALL_REQUEST_BYTES {
            self.max
        } else {
            self.max - HELD_RESERVE_BYTES
        };
        let why = if conn_used.saturating_add(bytes) > self.conn_max {
            format!(
                "connection {peer} has {conn_used} bytes of requests held on shard {shard}, \
                 its share is {}",
                self.conn_max
            )
        } else if used.saturating_add(bytes) > room {
            format!("shard {shard} holds {used} bytes of requests, its limit is {room}")
        } else {
            self.used.set(used + bytes);
            *self.by_conn.borrow_mut().entry(peer).or_default() += bytes;
            return Ok(HeldRequest {
                of: self.clone(),
                peer,
                bytes,
            });
        };
        Err(err(
            ErrorCode::BrokerBusy,
            format!(
                "{why} (waiting for another shard, their topic, the disk or room for their \
                 answers); send again once some are answered (a send to a known topic's queue made on the queue's own \
                 shard, as ringmq's producer makes them, is not held)"
            ),
        ))
    }

    #[cfg(test)]
    fn used(&self) -> usize {
        self.used.get()
    }
}

/// A reservation of answer bytes; dropping it gives them back.
pub struct AnswerHold {
    conn: Option<OwnedSemaphorePermit>,
    shard: OwnedSemaphorePermit,
}

impl AnswerHold {
    /// Gives back what is reserved beyond `bytes` (a reservation made for an upper bound
    /// of the answer, once the real one is known).
    pub fn shrink_to(&mut self, bytes: usize) {
        let keep = units(bytes) as usize;
        for permit in [self.conn.as_mut(), Some(&mut self.shard)]
            .into_iter()
            .flatten()
        {
            let extra = permit.num_permits().saturating_sub(keep);
            drop(permit.split(extra));
        }
    }
}

/// The answer budgets of one shard: its own, and one per connection it serves.
pub struct AnswerBudgets {
    shard: Arc<Semaphore>,
    shard_units: u32,
    conn_units: u32,
    conns: RefCell<HashMap<u64, ConnBudget>>,
    /// Connections of other shards with requests forwarded here being handled: their end,
    /// as their shard tells it ([`close_forwarded`](Self::close_forwarded)).
    forwarded: Rc<RefCell<HashMap<u64, Forwarded>>>,
    /// (connection of this shard, shard) pairs whose close is being told to that shard.
    telling: RefCell<HashSet<(u64, u32)>>,
}

/// Another shard's connection while requests of it are handled here.
struct Forwarded {
    ended: Rc<Ended>,
    /// Requests handled here for it ([`ForwardedConn`]s).
    requests: usize,
}

/// A request forwarded from another shard's connection, while it is handled here: its
/// connection's end reaches what waits for it. Dropping it forgets the connection once no
/// request of it is left.
pub struct ForwardedConn {
    conn: u64,
    map: Rc<RefCell<HashMap<u64, Forwarded>>>,
}

impl Drop for ForwardedConn {
    fn drop(&mut self) {
        let mut map = self.map.borrow_mut();
        if let Some(f) = map.get_mut(&self.conn) {
            f.requests -= 1;
            if f.requests == 0 {
                map.remove(&self.conn);
            }
        }
    }
}

/// One connection's budget, and its end.
struct ConnBudget {
    budget: Arc<Semaphore>,
    ended: Rc<Ended>,
}

/// A connection's end, for what waits on its behalf (long polls).
#[derive(Default)]
struct Ended {
    yes: Cell<bool>,
    notify: tokio::sync::Notify,
}

impl Ended {
    fn end(&self) {
        self.yes.set(true);
        self.notify.notify_waiters();
    }
}

/// The error of a request whose connection closed while it was handled.
pub(super) fn connection_closed() -> ErrorBody {
    err(ErrorCode::ShardUnavailable, "the connection closed")
}

fn units(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(UNIT_BYTES)).unwrap_or(u32::MAX)
}

impl AnswerBudgets {
    /// Budgets sized for frames of up to `frame_bytes_max`.
    pub fn new(frame_bytes_max: usize) -> AnswerBudgets {
        let conn = CONN_ANSWER_BYTES_MIN.max(2 * frame_bytes_max);
        let shard = SHARD_ANSWER_BYTES_MIN.max(8 * frame_bytes_max);
        AnswerBudgets {
            shard: Arc::new(Semaphore::new(units(shard) as usize)),
            shard_units: units(shard),
            conn_units: units(conn),
            conns: RefCell::new(HashMap::new()),
            forwarded: Rc::default(),
            telling: RefCell::default(),
        }
    }

    /// A connection of this shard opened.
    pub fn open(&self, conn: u64) {
        let budget = Arc::new(Semaphore::new(self.conn_units as usize));
        let ended = Rc::default();
        (self.conns.borrow_mut()).insert(conn, ConnBudget { budget, ended });
    }

    /// A connection of this shard closed: answers waiting for its budget fail at once, and
    /// so do long polls waiting for it ([`closed`](Self::closed)).
    pub fn close(&self, conn: u64) {
        if let Some(c) = self.conns.borrow_mut().remove(&conn) {
            c.budget.close();
            c.ended.end();
        }
    }

    /// Connection `conn` of this shard is open.
    pub fn is_open(&self, conn: u64) -> bool {
        self.conns.borrow().contains_key(&conn)
    }

    /// A request of connection `conn` of another shard is handled here until the returned
    /// guard drops: its shard's word that the connection closed
    /// ([`close_forwarded`](Self::close_forwarded)) ends what waits for it meanwhile.
    pub fn forwarded(&self, conn: u64) -> ForwardedConn {
        let mut map = self.forwarded.borrow_mut();
        let f = map.entry(conn).or_insert_with(|| Forwarded {
            ended: Rc::default(),
            requests: 0,
        });
        f.requests += 1;
        ForwardedConn {
            conn,
            map: self.forwarded.clone(),
        }
    }

    /// Another shard's connection `conn` closed: its requests handled here that wait for
    /// it (long polls) end. Nothing if none is handled here.
    pub fn close_forwarded(&self, conn: u64) {
        if let Some(f) = self.forwarded.borrow().get(&conn) {
            f.ended.end();
        }
    }

    /// Connection `conn` of this shard closed and shard `to` is to be told so: true unless
    /// it is being told already ([`done_telling`](Self::done_telling) once told).
    pub fn start_telling(&self, conn: u64, to: u32) -> bool {
        self.telling.borrow_mut().insert((conn, to))
    }

    pub fn done_telling(&self, conn: u64, to: u32) {
        self.telling.borrow_mut().remove(&(conn, to));
    }

    /// Connection `conn` has closed, as far as this shard knows: `ours` says it is a
    /// connection of this shard; another shard's is known closed once its shard said so.
    pub fn ended(&self, conn: u64, ours: bool) -> bool {
        if ours {
            return !self.is_open(conn);
        }
        (self.forwarded.borrow().get(&conn)).is_some_and(|f| f.ended.yes.get())
    }

    /// Fails once connection `conn` closes, with the error to answer, at once if it has
    /// closed already; `ours` says it is a connection of this shard. Another shard's (a
    /// forwarded request's) ends once its shard says so, and never if none of its requests
    /// is handled here.
    pub fn closed(&self, conn: u64, ours: bool) -> impl Future<Output = ErrorBody> + 'static {
        let ended = if ours {
            self.conns.borrow().get(&conn).map(|c| c.ended.clone())
        } else {
            self.forwarded.borrow().get(&conn).map(|f| f.ended.clone())
        };
        async move {
            let Some(ended) = ended else {
                if ours {
                    return connection_closed();
                }
                return std::future::pending().await;
            };
            loop {
                let notified = ended.notify.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                if ended.yes.get() {
                    return connection_closed();
                }
                notified.await;
            }
        }
    }

    /// `wait`, unless connection `conn` closes first (`ours` as for [`closed`]
    /// (Self::closed)): then its error. What waits for a connection's sake (a long poll, a
    /// forwarded call, room for an answer, a lookup's place) gives up when it goes.
    pub async fn unless_closed<T>(
        &self,
        conn: u64,
        ours: bool,
        wait: impl Future<Output = Result<T, ErrorBody>>,
    ) -> Result<T, ErrorBody> {
        let closed = self.closed(conn, ours);
        futures_lite::future::or(wait, async { Err(closed.await) }).await
    }

    /// Bytes reserved by the answers of this shard right now.
    pub fn shard_reserved_bytes(&self) -> usize {
        (self.shard_units as usize - self.shard.available_permits()) * UNIT_BYTES
    }

    /// Bytes reserved by the answers of one connection right now.
    pub fn conn_reserved_bytes(&self, conn: u64) -> usize {
        self.conns.borrow().get(&conn).map_or(0, |c| {
            (self.conn_units as usize - c.budget.available_permits()) * UNIT_BYTES
        })
    }

    /// Adds `bytes` to an answer's reservation without waiting (both budgets, as
    /// [`reserve`](Self::reserve) took them); false, with nothing added, when either lacks
    /// them.
    pub fn try_grow(&self, hold: &mut AnswerHold, conn: u64, bytes: usize) -> bool {
        let n = units(bytes);
        let Ok(shard) = self.shard.clone().try_acquire_many_owned(n) else {
            return false;
        };
        if let Some(held) = hold.conn.as_mut() {
            let budget = self.conns.borrow().get(&conn).map(|c| c.budget.clone());
            match budget.map(|b| b.try_acquire_many_owned(n)) {
                Some(Ok(more)) => held.merge(more),
                _ => return false,
            }
        }
        hold.shard.merge(shard);
        true
    }

    /// [`reserve`](Self::reserve) without waiting: `None` when either budget lacks the room
    /// now (nothing taken).
    pub fn try_reserve(
        &self,
        conn: u64,
        ours: bool,
        bytes: usize,
    ) -> Result<Option<AnswerHold>, ErrorBody> {
        let conn_budget = self.conns.borrow().get(&conn).map(|c| c.budget.clone());
        let conn_permit = match conn_budget {
            Some(budget) => {
                match budget.try_acquire_many_owned(units(bytes).min(self.conn_units)) {
                    Ok(permit) => Some(permit),
                    Err(tokio::sync::TryAcquireError::NoPermits) => return Ok(None),
                    Err(tokio::sync::TryAcquireError::Closed) => return Err(connection_closed()),
                }
            }
            None if ours => return Err(connection_closed()),
            None => None,
        };
        let n = units(bytes).min(self.shard_units);
        Ok(
            (self.shard.clone().try_acquire_many_owned(n).ok()).map(|shard| AnswerHold {
                conn: conn_permit,
                shard,
            }),
        )
    }

    /// Reserves `bytes` for an answer to connection `conn`: from its budget when it is a
    /// connection of this shard (a forwarded request's connection is on another shard,
    /// which accounts for it there), and from the shard's. Waits while either is spent;
    /// fails once the connection closes (`ours`: as [`closed`](Self::closed) tells it), so
    /// that a closed connection's requests give up their place in the shard's line.
    pub async fn reserve(
        &self,
        conn: u64,
        ours: bool,
        bytes: usize,
    ) -> Result<AnswerHold, ErrorBody> {
        let conn_budget = self.conns.borrow().get(&conn).map(|c| c.budget.clone());
        let gone = |_| connection_closed();
        let conn_permit = match conn_budget {
            Some(budget) => Some(
                budget
                    .acquire_many_owned(units(bytes).min(self.conn_units))
                    .await
                    .map_err(gone)?,
            ),
            None if ours => return Err(connection_closed()),
            None => None,
        };
        let n = units(bytes).min(self.shard_units);
        let shard_permit = match self.shard.clone().try_acquire_many_owned(n) {
            Ok(permit) => permit,
            Err(_) => {
                let shard = self.shard.clone().acquire_many_owned(n);
                (self.unless_closed(conn, ours, async { shard.await.map_err(gone) })).await?
            }
        };
        Ok(AnswerHold {
            conn: conn_permit,
            shard: shard_permit,
        })
    }
}

/// The frame of answer `r`, or a `FrameTooLarge` error when it would be over `frame_max`,
/// the largest frame the connection takes (a group of very many members, a listing of
/// very many topics): the client's decoder refuses such a frame, and with it the whole
/// connection (every request in flight failed, sends as maybe stored).
pub(super) fn within_frame(
    request_id: u64,
    r: &Response<'_>,
    frame_max: u32,
) -> Result<Vec<u8>, ErrorBody> {
    let frame = response_frame(request_id, r);
    if frame.len() > frame_max as usize {
        return Err(err(
            ErrorCode::FrameTooLarge,
            format!(
                "the answer would be a {}-byte frame, over the connection's limit of {frame_max} bytes",
                frame.len()
            ),
        ));
    }
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `TOPIC_ANSWER_BYTES_MAX` holds the largest frames it bounds: a group's progress and a
    /// topic's description with the longest names and every queue a topic may have.
    #[test]
    fn a_topics_largest_description_and_progress_fit_their_reservation() {
        use crate::protocol::{Progress, QueueInfo, QueueProgress, TopicInfo};
        let queues = crate::broker::topics::QUEUES_PER_TOPIC_MAX;
        let progress = Progress {
            group: "g".repeat(crate::protocol::names::GROUP_NAME_BYTES_MAX),
            topic: "t".repeat(crate::protocol::names::TOPIC_NAME_BYTES_MAX),
            queues: (0..queues)
                .map(|queue_id| QueueProgress {
                    queue_id,
                    committed_offset: -1,
                    max_offset: u64::MAX,
                    lag: u64::MAX,
                })
                .collect(),
        };
        let info = TopicInfo {
            topic: "t".repeat(crate::protocol::names::TOPIC_NAME_BYTES_MAX),
            queues: (0..queues)
                .map(|queue_id| QueueInfo {
                    queue_id,
                    min_offset: u64::MAX,
                    max_offset: u64::MAX,
                })
                .collect(),
        };
        for r in [Response::from(progress), Response::from(info)] {
            let len = response_frame(1, &r).len();
            assert!(len <= crate::broker::TOPIC_ANSWER_BYTES_MAX, "{len} bytes");
            assert!(
                len > 24 * queues as usize,
                "{len} bytes: every queue encoded"
            );
        }
    }

    /// An answer over the connection's frame limit is a typed error naming both sizes; one
    /// within it is its frame.
    #[test]
    fn an_answer_over_the_connections_frame_limit_is_frame_too_large() {
        use crate::protocol::{FrameDecoder, TopicList};
        let topics = (0..40_000).map(|n| format!("{n:0>120}")).collect();
        let list = Response::from(TopicList { topics });
        let max = crate::protocol::FRAME_BYTES_MIN;
        let e = within_frame(7, &list, max).unwrap_err();
        assert_eq!(e.error_code(), Some(ErrorCode::FrameTooLarge), "{e:?}");
        assert!(
            e.message.contains(&format!("limit of {max} bytes")),
            "{e:?}"
        );
        let frame = within_frame(7, &list, 16 << 20).unwrap();
        let decoded = FrameDecoder::new(crate::protocol::FrameLimits::new(16 << 20).unwrap());
        let f = decoded.decode(&frame).unwrap().unwrap();
        assert_eq!(f.request_id(), 7);
    }

    #[test]
    fn held_requests_past_a_share_or_the_budget_are_refused_and_their_bytes_come_back() {
        let held = HeldRequests::new(1 << 20);
        let conn = |i: u16| SocketAddr::from(([127, 0, 0, 1], i));
        let busy = |r: Result<HeldRequest, ErrorBody>| match r {
            Err(e) if e.code == ErrorCode::BrokerBusy.as_u16() => e.message,
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("held"),
        };
        // One connection: 32 MiB.
        let first = held.hold(30 << 20, 3, conn(1)).ok().unwrap();
        let m = busy(held.hold(3 << 20, 3, conn(1)));
        assert!(
            m.starts_with("connection 127.0.0.1:1 has 31457280 bytes"),
            "{m}"
        );
        assert!(m.contains("shard 3"), "{m}");
        let second = held.hold(2 << 20, 3, conn(1)).ok().unwrap();
        drop(first);
        assert_eq!(held.used(), 2 << 20);
        let first = held.hold(30 << 20, 3, conn(1)).ok().unwrap();
        // The shard: 256 MiB for requests over 64 KiB, 32 MiB more for smaller ones.
        let others: Vec<_> = (2..9)
            .map(|i| held.hold(32 << 20, 3, conn(i)).ok().unwrap())
            .collect();
        assert_eq!(held.used(), 256 << 20);
        let m = busy(held.hold(65 << 10, 3, conn(9)));
        assert!(m.starts_with("shard 3 holds 268435456 bytes"), "{m}");
        let small: Vec<_> = (0..512)
            .map(|_| held.hold(64 << 10, 3, conn(9)).ok().unwrap())
            .collect();
        busy(held.hold(1, 3, conn(10)));
        drop((first, second, others, small));
        assert_eq!(held.used(), 0);
        assert!(held.by_conn.borrow().is_empty());
        // Two and eight of the largest frames fit, whatever the floors.
        let large = HeldRequests::new(64 << 20);
        let two: Vec<_> = (0..2)
            .map(|_| large.hold(64 << 20, 0, conn(1)).ok().unwrap())
            .collect();
        busy(large.hold(64 << 20, 0, conn(1)));
        let six: Vec<_> = (2..8)
            .map(|i| large.hold(64 << 20, 0, conn(i)).ok().unwrap())
            .collect();
        busy(large.hold(1 << 20, 0, conn(9)));
        drop((two, six));
    }

    #[test]
    fn reservations_wait_for_room_and_fail_once_the_connection_closes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let budgets = AnswerBudgets::new(1 << 20);
            budgets.open(7);
            let first = budgets.reserve(7, true, 20 << 20).await.unwrap();
            assert_eq!(budgets.conn_reserved_bytes(7), 20 << 20);
            // 20 + 20 MiB is over the 32 MiB of a connection: the second waits.
            let second = budgets.reserve(7, true, 20 << 20);
            let mut second = std::pin::pin!(second);
            assert!(futures_lite::future::poll_once(second.as_mut())
                .await
                .is_none());
            drop(first);
            let second = second.await.unwrap();
            assert_eq!(budgets.shard_reserved_bytes(), 20 << 20);
            // A closed connection's waiting reservations fail.
            let third = budgets.reserve(7, true, 20 << 20);
            let mut third = std::pin::pin!(third);
            assert!(futures_lite::future::poll_once(third.as_mut())
                .await
                .is_none());
            budgets.close(7);
            assert!(third.await.is_err());
            drop(second);
            assert_eq!(budgets.shard_reserved_bytes(), 0);
            budgets.open(7);
            // A reservation for the largest answer shrinks to the real one.
            let mut big = budgets.reserve(7, true, 8 << 20).await.unwrap();
            big.shrink_to(3000);
            assert_eq!(budgets.conn_reserved_bytes(7), 3072);
            drop(big);
            // A connection of another shard uses the shard budget only.
            let other = budgets.reserve(99, false, 1000).await.unwrap();
            assert_eq!(budgets.shard_reserved_bytes(), 1024);
            drop(other);
        });
    }

    /// A reservation waiting for the shard's budget (its connection's has room) fails once
    /// its connection closes, giving up its place in the shard's line. Before, it waited
    /// on, to read records for nobody.
    #[test]
    fn a_reservation_waiting_for_the_shard_fails_once_its_connection_closes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let budgets = AnswerBudgets::new(1 << 20);
            let mut taken = Vec::new();
            for conn in 1..=8 {
                budgets.open(conn);
                taken.push(budgets.reserve(conn, true, 32 << 20).await.unwrap());
            }
            assert_eq!(budgets.shard_reserved_bytes(), 256 << 20);
            // Waits, then fails once `close` is done.
            async fn waits_until(
                reserve: impl Future<Output = Result<AnswerHold, ErrorBody>>,
                close: impl FnOnce(),
            ) {
                let mut reserve = std::pin::pin!(reserve);
                let first = futures_lite::future::poll_once(reserve.as_mut()).await;
                assert!(first.is_none(), "did not wait");
                close();
                let ended = futures_lite::future::poll_once(reserve.as_mut()).await;
                assert!(matches!(ended, Some(Err(_))), "still waiting");
            }
            budgets.open(9);
            waits_until(budgets.reserve(9, true, 1 << 20), || budgets.close(9)).await;
            // Already closed: refused at once.
            assert!(budgets.reserve(9, true, 1000).await.is_err());
            // Another shard's connection, once its shard says it closed.
            let _handled = budgets.forwarded(99);
            let theirs = budgets.reserve(99, false, 1000);
            waits_until(theirs, || budgets.close_forwarded(99)).await;
            drop(taken);
            assert_eq!(budgets.shard_reserved_bytes(), 0);
        });
    }

    #[test]
    fn a_connections_end_ends_what_waits_for_it() {
        futures_lite::future::block_on(async {
            use futures_lite::future::poll_once;
            let budgets = AnswerBudgets::new(1 << 20);
            budgets.open(7);
            let waiting = budgets.closed(7, true);
            let mut waiting = std::pin::pin!(waiting);
            assert!(poll_once(waiting.as_mut()).await.is_none(), "open");
            // Another shard's connection: its shard answers for it.
            let other = budgets.closed(99, false);
            let mut other = std::pin::pin!(other);
            budgets.close(7);
            let e = poll_once(waiting.as_mut())
                .await
                .expect("ended with the close");
            assert_eq!(e.error_code(), Some(ErrorCode::ShardUnavailable));
            // Closed before the call: at once.
            assert!(poll_once(budgets.closed(7, true)).await.is_some());
            assert!(poll_once(other.as_mut()).await.is_none());
        });
    }

    #[test]
    fn another_shards_connection_ends_here_when_its_shard_says_so() {
        futures_lite::future::block_on(async {
            use futures_lite::future::poll_once;
            let budgets = AnswerBudgets::new(1 << 20);
            // Told before any request of it is handled here: nothing to end, nothing kept.
            budgets.close_forwarded(99);
            let first = budgets.forwarded(99);
            let second = budgets.forwarded(99);
            assert!(!budgets.ended(99, false));
            let waiting = budgets.closed(99, false);
            let mut waiting = std::pin::pin!(waiting);
            assert!(poll_once(waiting.as_mut()).await.is_none(), "open");
            // Another connection's word ends nothing of it.
            budgets.close_forwarded(98);
            assert!(poll_once(waiting.as_mut()).await.is_none(), "still open");
            budgets.close_forwarded(99);
            let e = poll_once(waiting.as_mut()).await.expect("ended");
            assert_eq!(e.error_code(), Some(ErrorCode::ShardUnavailable));
            assert!(budgets.ended(99, false));
            assert!(poll_once(budgets.closed(99, false)).await.is_some());
            // Kept while a request of it is handled, forgotten after the last.
            drop(first);
            assert!(budgets.ended(99, false));
            drop(second);
            assert!(!budgets.ended(99, false));
            assert!(budgets.forwarded.borrow().is_empty());
        });
    }

    #[test]
    fn a_reservation_grows_only_within_both_budgets() {
        futures_lite::future::block_on(async {
            let budgets = AnswerBudgets::new(1 << 20);
            budgets.open(7);
            let mut hold = budgets.reserve(7, true, 1 << 20).await.unwrap();
            assert!(budgets.try_grow(&mut hold, 7, 10 << 20));
            assert_eq!(budgets.conn_reserved_bytes(7), 11 << 20);
            assert_eq!(budgets.shard_reserved_bytes(), 11 << 20);
            // Past the connection's 32 MiB: refused, nothing taken from either budget.
            assert!(!budgets.try_grow(&mut hold, 7, 30 << 20));
            assert_eq!(budgets.conn_reserved_bytes(7), 11 << 20);
            assert_eq!(budgets.shard_reserved_bytes(), 11 << 20);
            drop(hold);
            assert_eq!(budgets.conn_reserved_bytes(7), 0);
            assert_eq!(budgets.shard_reserved_bytes(), 0);
        });
    }
}
