//! Serving one client connection, with everything it can make the shard hold bounded.
//!
//! - Requests are read into one buffer that grows only as bytes arrive (never straight to
//!   the size a frame header announces), is shrunk back after a large frame, and counts
//!   against the shard's read budget (all connections together); a connection over it
//!   waits before reading more.
//! - Each whole frame goes to the shard's services in arrival order; answers are queued in
//!   the connection's outbox in completion order (request ids pair them) and written by one
//!   writer task, which sends the frames that are ready together with one vectored write,
//!   each from where it is (a pull answer's records from the store's read buffers).
//! - While the outbox holds more than [`CONN_QUEUED_BYTES_MAX`], no further request is read:
//!   a client that does not read its answers is held back by TCP. Answers that carry
//!   records also reserve their bytes before they are built (`broker::answer`).
//! - Timeouts (`--conn-timeout-ms`, 30 s): a connection that sends no whole frame within it,
//!   stops in the middle of a frame for that long, or takes a batch of answers slower than
//!   that plus a second for every [`ANSWER_RATE_MIN_BYTES_PER_S`] of it, is closed. An
//!   established connection may be idle between frames.
//! - When the connection ends, queued answers are dropped (with their reservations), answers
//!   still being built are dropped when they complete, and the services are told at once
//!   (group members on it leave, its answer budget closes).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use tokio::sync::Notify;

use crate::broker::answer::Answer;
use crate::broker::{Handled, PollStep, ShardCtx};
use crate::protocol::{encode_error, ErrorBody, ErrorCode, FrameDecoder, FrameHeader, FrameLimits};

/// Requests of one connection being handled at once.
const CONN_IN_FLIGHT_MAX: usize = 1024;
/// Bytes gathered into one socket write.
const CONN_WRITE_BATCH_BYTES: usize = 1 << 20;
/// The slowest a peer may take its answers: a batch of answers must go out within the
/// connection timeout plus a second for every this many bytes of it.
pub const ANSWER_RATE_MIN_BYTES_PER_S: u64 = 64 << 10;
/// Receive buffer of a connection between large frames.
pub const CONN_READ_BUFFER_BYTES: usize = 64 * 1024;
/// Answer bytes queued for one connection past which its requests are not read.
pub const CONN_QUEUED_BYTES_MAX: usize = 16 << 20;
/// Default of `--conn-timeout-ms`: a new connection must send a whole frame within this
/// time; one that stops in the middle of a frame for this long, or takes a batch of answers
/// slower than this plus a second for every [`ANSWER_RATE_MIN_BYTES_PER_S`], is closed.
pub const CONN_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// A receive buffer grown for large frames is kept while they keep coming, and shrunk
/// back once the connection sends nothing for this long.
const READ_BUFFER_KEEP_MS: u64 = 100;
/// How long a closing connection reads on (and drops) what its peer still sends, after
/// its last answer, before it closes: see the end of [`serve_connection`].
const LINGER_MS: u64 = 2_000;

/// How often a reader waiting for a place among its connection's requests in flight (it
/// reads nothing meanwhile) looks whether the peer went.
const PEER_CHECK_MS: u64 = 200;

/// Shrinks a grown receive buffer back to its base size, giving its budget back.
fn shrink(buf: &mut Vec<u8>, taken: &mut BudgetTaken) {
    buf.truncate(CONN_READ_BUFFER_BYTES);
    buf.shrink_to_fit();
    taken.give_all();
}

/// How connections of a shard are served.
#[derive(Debug, Clone, Copy)]
pub struct ConnSettings {
    pub limits: FrameLimits,
    /// See [`CONN_TIMEOUT_MS_DEFAULT`].
    pub timeout_ms: u64,
}

/// Receive-buffer bytes of all connections of a shard beyond their base buffers (bounded by
/// the connection cap): what frames larger than a base buffer take. A connection takes what
/// its frame needs all at once (its buffer then grows as the bytes arrive), so none holds
/// part of what it needs while waiting for the rest: connections doing that would wait on
/// each other until their frames time out. A buffer kept from an earlier large frame (for
/// [`READ_BUFFER_KEEP_MS`]) reads a base buffer's worth first, and goes back to the base
/// size when the next frame is larger than it; only when it holds more than a base
/// buffer's worth of that frame (its bytes came behind an earlier frame's in one read) does
/// it wait holding it, counted (see `BudgetTaken::grow_to`: it gave it back, and the bytes
/// it still held were taken again by others).
///
/// The connections from one address (an IPv6 /64, [`share_key`]) take at most a quarter of
/// it (at least one largest frame): before, about fifty connections from one host that each announced a 5 MiB frame
/// and stalled held all of it, and every large frame from other hosts waited, then was
/// refused, for as long as the connection timeout.
pub struct ReadBudget {
    used: Cell<usize>,
    max: usize,
    /// Bytes taken by the connections from each address (none with nothing taken).
    by_peer: RefCell<HashMap<IpAddr, usize>>,
    peer_max: usize,
    /// Woken when bytes are given back, for the connections waiting for room.
    freed: Notify,
}

impl ReadBudget {
    /// A budget that holds at least four of the largest frames.
    pub fn new(frame_bytes_max: usize) -> Rc<ReadBudget> {
        let max = (256 << 20).max(4 * frame_bytes_max);
        Rc::new(ReadBudget {
            used: Cell::new(0),
            max,
            by_peer: RefCell::new(HashMap::new()),
            // At least one largest frame: `max` holds four.
            peer_max: max / 4,
            freed: Notify::new(),
        })
    }

    fn try_take(&self, peer: IpAddr, bytes: usize) -> bool {
        let used = self.used.get();
        let mut by_peer = self.by_peer.borrow_mut();
        let peer_used = by_peer.get(&peer).copied().unwrap_or(0);
        if used + bytes > self.max || peer_used + bytes > self.peer_max {
            return false;
        }
        self.used.set(used + bytes);
        by_peer.insert(peer, peer_used + bytes);
        true
    }

    fn give(&self, peer: IpAddr, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.used.set(self.used.get().saturating_sub(bytes));
        let mut by_peer = self.by_peer.borrow_mut();
        if let Some(peer_used) = by_peer.get_mut(&peer) {
            *peer_used = peer_used.saturating_sub(bytes);
            if *peer_used == 0 {
                by_peer.remove(&peer);
            }
        }
        self.freed.notify_waiters();
    }

    /// Takes `bytes` for `peer`, waiting up to `within_ms` for them to be given back by
    /// others; false if they were not by then.
    async fn take(&self, peer: IpAddr, bytes: usize, within_ms: u64) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_millis(within_ms);
        loop {
            // Made before the look, so a give between the look and the wait wakes it.
            let freed = self.freed.notified();
            if self.try_take(peer, bytes) {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = within(left.as_millis() as u64 + 1, freed).await;
        }
    }

    /// Bytes taken now, in all and by `peer`.
    #[cfg(test)]
    fn used(&self, peer: IpAddr) -> (usize, usize) {
        let by_peer = self.by_peer.borrow().get(&peer).copied().unwrap_or(0);
        (self.used.get(), by_peer)
    }
}

/// The address whose share of the [`ReadBudget`] a connection from `ip` counts in: an IPv6
/// peer's /64 (what one host is usually given: by its full address, one host could take
/// the whole budget), an IPv4-mapped one as IPv4.
fn share_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u128::from(u64::MAX)))),
        },
        v4 => v4,
    }
}

/// What one connection holds of its shard's [`ReadBudget`]; given back when dropped.
struct BudgetTaken {
    budget: Rc<ReadBudget>,
    peer: IpAddr,
    bytes: usize,
}

impl BudgetTaken {
    fn give_all(&mut self) {
        self.budget.give(self.peer, std::mem::take(&mut self.bytes));
    }

    /// Holds at least `need` bytes: takes the rest now, or waits up to `within_ms` for it;
    /// false if it did not come by then. What is held stays counted while it waits: a
    /// buffer kept from an earlier large frame holds the first bytes of the next one by
    /// then, and giving its bytes back (to wait for the whole, as `ReadBudget` has a frame
    /// do) left them held but uncounted, for other connections to take again.
    async fn grow_to(&mut self, need: usize, within_ms: u64) -> bool {
        if need <= self.bytes {
            return true;
        }
        let more = need - self.bytes;
        if !self.budget.take(self.peer, more, within_ms).await {
            return false;
        }
        self.bytes = need;
        true
    }
}

impl Drop for BudgetTaken {
    fn drop(&mut self) {
        self.give_all();
    }
}

/// Answers waiting to be written to one connection.
struct Outbox {
    queue: RefCell<VecDeque<Answer>>,
    bytes: Cell<usize>,
    /// The writer is gone (write error or stall): answers are dropped.
    closed: Cell<bool>,
    /// Those that may still queue answers: the reader and every request in flight.
    producers: Cell<usize>,
    wake_writer: Notify,
    space: Notify,
}

impl Outbox {
    fn new() -> Rc<Outbox> {
        Rc::new(Outbox {
            queue: RefCell::new(VecDeque::new()),
            bytes: Cell::new(0),
            closed: Cell::new(false),
            producers: Cell::new(0),
            wake_writer: Notify::new(),
            space: Notify::new(),
        })
    }

    fn push(&self, answer: Answer) {
        if self.closed.get() || answer.is_empty() {
            return;
        }
        self.bytes.set(self.bytes.get() + answer.len());
        self.queue.borrow_mut().push_back(answer);
        self.wake_writer.notify_one();
    }

    fn close(&self) {
        self.closed.set(true);
        self.queue.borrow_mut().clear();
        self.bytes.set(0);
        self.space.notify_waiters();
    }

    /// Waits until the queued answers are within bounds (or the writer is gone).
    async fn room(&self) {
        loop {
            let space = self.space.notified();
            let mut space = std::pin::pin!(space);
            space.as_mut().enable();
            if self.closed.get() || self.bytes.get() <= CONN_QUEUED_BYTES_MAX {
                return;
            }
            space.await;
        }
    }
}

/// The requests of one connection being handled, at most [`CONN_IN_FLIGHT_MAX`]: the reader
/// takes a place before it hands a request to the services, and the place is given back
/// once the answer is queued (at once for a request answered at once).
#[derive(Default)]
struct InFlight {
    count: Cell<usize>,
    /// Wakes the reader waiting for a place, or, once the connection closed, the wait for
    /// its requests to end (one waits at a time).
    freed: Notify,
}

struct InFlightPlace(Rc<InFlight>);

impl InFlight {
    /// A place, if one is free now.
    fn try_take(self: &Rc<Self>) -> Option<InFlightPlace> {
        let count = self.count.get();
        (count < CONN_IN_FLIGHT_MAX).then(|| {
            self.count.set(count + 1);
            InFlightPlace(self.clone())
        })
    }

    /// Waits for a place. Cancel-safe: a wait given up holds nothing.
    async fn take(self: &Rc<Self>) -> InFlightPlace {
        loop {
            if let Some(place) = self.try_take() {
                return place;
            }
            self.freed.notified().await;
        }
    }
}

impl Drop for InFlightPlace {
    fn drop(&mut self) {
        let count = self.0.count.get();
        self.0.count.set(count - 1);
        // The reader waits when all are taken; `HandedOver::ended`, for none taken.
        if count == CONN_IN_FLIGHT_MAX || count == 1 {
            // Kept if none waits yet: the next wait returns at once (and looks again).
            self.0.freed.notify_one();
        }
    }
}

/// One more party that may queue answers; the writer ends once none is left and the queue
/// is empty.
struct Producer(Rc<Outbox>);

impl Producer {
    fn new(outbox: &Rc<Outbox>) -> Producer {
        outbox.producers.set(outbox.producers.get() + 1);
        Producer(outbox.clone())
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.0.producers.set(self.0.producers.get() - 1);
        self.0.wake_writer.notify_one();
    }
}

/// `fut`, or `None` once `ms` have passed.
async fn within<T>(ms: u64, fut: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(fut.await) }, async {
        crate::io::sleep(Duration::from_millis(ms)).await;
        None
    })
    .await
}

/// The peer of socket `fd` closed the connection, or it failed: a peek (nothing is taken)
/// finds its end or an error, not data and not "nothing yet". Does not wait.
fn peer_gone(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: a non-blocking peek of at most one byte into a local the call may write.
    let n = unsafe {
        libc::recv(
            fd,
            std::ptr::addr_of_mut!(byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(
            io::Error::last_os_error().kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// Most parts one vectored socket write passes to the kernel (its limit is 1,024).
const SEND_PARTS_MAX: usize = 512;

/// Sends `parts` to socket `fd` with one `sendmsg`, without waiting: the bytes the kernel
/// took (maybe fewer than all), or `WouldBlock` when it has no room.
fn send_now(fd: RawFd, parts: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = parts.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = parts.len().min(SEND_PARTS_MAX) as _;
    loop {
        // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix (std guarantees it),
        // the slices outlive the call, and the kernel only reads them.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Writes the answers' parts (frame heads, stored records where they were read) to the
/// socket in order: vectored writes while the socket has room; when it has none, the
/// runtime's write waits for room.
async fn write_parts(
    fd: RawFd,
    writer: &mut (impl futures_lite::AsyncWrite + Unpin),
    answers: &[Answer],
) -> io::Result<()> {
    let mut iov: Vec<IoSlice<'_>> = answers
        .iter()
        .flat_map(|a| a.parts())
        .filter(|p| !p.is_empty())
        .map(IoSlice::new)
        .collect();
    let mut rest = &mut iov[..];
    while let Some(first) = rest.first() {
        let n = match send_now(fd, rest) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writer.write(first).await?,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// The writer task: writes queued answers until the connection ends. The answers that are
/// ready together go out in one vectored write, each from where it is (a pull answer's
/// records from the buffers the store read them into).
async fn write_answers(
    outbox: Rc<Outbox>,
    mut writer: impl futures_lite::AsyncWrite + Unpin,
    fd: RawFd,
    stall_ms: u64,
) {
    let mut sent: Vec<Answer> = Vec::new();
    loop {
        loop {
            if !outbox.queue.borrow().is_empty() {
                break;
            }
            if outbox.producers.get() == 0 {
                let _ = writer.flush().await;
                let _ = writer.close().await;
                return;
            }
            outbox.wake_writer.notified().await;
        }
        let mut written = 0;
        while written < CONN_WRITE_BATCH_BYTES {
            let next = outbox.queue.borrow_mut().pop_front();
            let Some(next) = next else { break };
            written += next.len();
            sent.push(next);
        }
        // The peer has `stall_ms`, and a second more for every 64 KiB of the batch, to take
        // it: one reading slowly but steadily is not cut off in the middle of a large
        // answer (one batch), and one that trickles cannot hold the connection's room for
        // answers for ever.
        let allowed_ms =
            (stall_ms).saturating_add(written as u64 * 1000 / ANSWER_RATE_MIN_BYTES_PER_S);
        let result = within(allowed_ms, write_parts(fd, &mut writer, &sent)).await;
        // Written (or not): their reservations go back either way.
        sent.clear();
        outbox.bytes.set(outbox.bytes.get().saturating_sub(written));
        outbox.space.notify_waiters();
        if !matches!(result, Some(Ok(()))) {
            // A broken or stalled peer: nothing more is written, and nothing more read. The
            // reader may be waiting for a request a peer that stopped reading never sends:
            // the connection ends now, not when the peer next sends or closes.
            outbox.close();
            let _ = writer.close().await;
            // SAFETY: `fd` is the connection's socket, held open by this task's write half
            // (both halves share the stream); shutdown closes nothing.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RD);
            }
            return;
        }
    }
}

/// An error frame for a request that could not be read, the frame at the start of
/// `partial`; the connection then closes. It names the request once the frame's header has
/// arrived and checks out (0 before): a client hands the error to the request it concerns,
/// and drops one of an id it never sent.
fn closing_error(decoder: &FrameDecoder, partial: &[u8], body: &ErrorBody) -> Vec<u8> {
    let mut out = Vec::new();
    let code = body.error_code().unwrap_or(ErrorCode::MalformedFrame);
    let message = format!("{}; closing the connection", body.message);
    let request_id = FrameHeader::decode(partial, decoder.limits()).map_or(0, |h| h.request_id());
    if encode_error(request_id, code, message, &mut out).is_err() {
        out.clear();
    }
    out
}

/// Serves one connection until the peer closes it, breaks the protocol, stalls, or the
/// writer fails. Returns with the socket closed; the requests it handed to the shard may
/// still run (a writer that failed does not wait for them): the caller holds the
/// connection's place until [`HandedOver::ended`].
pub async fn serve_connection(
    ctx: Rc<ShardCtx>,
    stream: TcpStream,
    settings: ConnSettings,
    read_budget: Rc<ReadBudget>,
) -> HandedOver {
    let ConnSettings { limits, timeout_ms } = settings;
    let _ = stream.set_nodelay(true);
    if let Err(e) = crate::protocol::keepalive::keep_alive(stream.as_raw_fd()) {
        crate::warn!(
            "ringmq: shard {}: TCP keepalive not set on a connection: {e}",
            ctx.id
        );
    }
    let peer = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let fd = stream.as_raw_fd();
    let (mut reader, writer) = futures_lite::io::split(stream);
    let outbox = Outbox::new();
    let reading = Producer::new(&outbox);
    let writer_task =
        glommio::spawn_local(write_answers(outbox.clone(), writer, fd, timeout_ms)).detach();
    let push_outbox = Rc::downgrade(&outbox);
    let conn = ctx.register_connection(Rc::new(move |frame: Vec<u8>| {
        // Pushed notifications are hints members re-check; past the bound they are dropped
        // (and the caller told: a transaction check dropped does not count).
        match push_outbox.upgrade() {
            Some(outbox) if outbox.bytes.get() <= CONN_QUEUED_BYTES_MAX => {
                outbox.push(Answer::from(frame));
                true
            }
            _ => false,
        }
    }));
    let in_flight = Rc::new(InFlight::default());
    let decoder = FrameDecoder::new(limits);
    let mut buf = vec![0u8; CONN_READ_BUFFER_BYTES];
    // Budget held for growth beyond the base buffer (which is always allowed).
    let mut taken = BudgetTaken {
        budget: read_budget,
        peer: share_key(peer.ip()),
        bytes: 0,
    };
    let (mut start, mut end) = (0usize, 0usize);
    let mut frames_seen = false;
    // The last frame needed more than half the base buffer: more like it may follow, so a
    // grown buffer is kept (regrowing it for every large frame zeroes and faults in fresh
    // memory each time) until a small frame comes or the connection pauses.
    let mut last_frame_large = false;
    // When the first bytes of the frame being received came: a frame holding room of the
    // budget must arrive whole within the connection timeout of them (a peer trickling a
    // byte now and then would hold its room for ever otherwise).
    let mut partial_since: Option<std::time::Instant> = None;
    'conn: loop {
        // Hand every whole frame in the buffer to the services.
        loop {
            if outbox.closed.get() {
                break 'conn;
            }
            // A place among the requests in flight before a request is handled: what it
            // takes on arrival (its place in a topic's line of sends) is then held by a
            // future that runs, not by one waiting here for another request to end. Then
            // room for its answer.
            let place = match in_flight.try_take() {
                Some(place) => place,
                // At the limit the reader reads nothing until a request ends (a long poll
                // may take seconds): it looks every so often whether the peer went, so that
                // its groups learn of it now.
                None => loop {
                    match within(PEER_CHECK_MS, in_flight.take()).await {
                        Some(place) => break place,
                        None if outbox.closed.get() => break 'conn,
                        // Only with no whole request buffered: those it sent before it went
                        // (a write, then a close) are handled as places free.
                        None if peer_gone(fd)
                            && matches!(decoder.decode(&buf[start..end]), Ok(None)) =>
                        {
                            break 'conn
                        }
                        None => {}
                    }
                },
            };
            outbox.room().await;
            if outbox.closed.get() {
                break 'conn;
            }
            match decoder.decode(&buf[start..end]) {
                Ok(Some(frame)) => {
                    frames_seen = true;
                    partial_since = None;
                    let len = frame.frame_len();
                    last_frame_large = len > CONN_READ_BUFFER_BYTES / 2;
                    let bytes = &buf[start..start + len];
                    start += len;
                    match ctx.handle_frame(bytes, peer, conn, None, PollStep::Whole) {
                        Handled::Now(Some(answer)) => outbox.push(answer),
                        Handled::Now(None) => {}
                        Handled::Later(fut) => {
                            let producing = Producer::new(&outbox);
                            glommio::spawn_local(async move {
                                if let Some(answer) = fut.await {
                                    producing.0.push(answer);
                                }
                                drop(place);
                                drop(producing);
                            })
                            .detach();
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let e = ErrorBody::from(&e);
                    outbox.push(Answer::from(closing_error(&decoder, &buf[start..end], &e)));
                    break 'conn;
                }
            }
        }
        // Make room: move the partial frame to the front; grow as bytes arrive, up to what
        // the frame needs; shrink back once a large frame is done.
        if start > 0 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        let needed = decoder.bytes_needed(&buf[..end]).unwrap_or(0);
        // A buffer kept from an earlier frame, too small for the next one, goes back to the
        // base size while what it holds of it fits there: it then takes the next frame's
        // room as a base buffer does, waiting (if it must) holding nothing.
        if needed > buf.len() && buf.len() > CONN_READ_BUFFER_BYTES && end <= CONN_READ_BUFFER_BYTES
        {
            shrink(&mut buf, &mut taken);
        }
        let full = end == buf.len();
        if full {
            let grown = (buf.len() * 2).min(needed.max(end + 1));
            // The whole frame's need at once (see `ReadBudget`), for as long as a stalled
            // frame is waited for at most; then a typed refusal.
            let need = needed.max(grown) - CONN_READ_BUFFER_BYTES;
            if !taken.grow_to(need, timeout_ms).await {
                let budget = &taken.budget;
                let e = ErrorBody::new(
                        ErrorCode::BrokerBusy,
                        format!(
                            "the shard's receive buffers for large frames ({} MiB, at most {} MiB for the connections from one address) stayed taken by other connections for {timeout_ms} ms; send the {needed}-byte frame again later",
                            budget.max >> 20,
                            budget.peer_max >> 20
                        ),
                    );
                outbox.push(Answer::from(closing_error(&decoder, &buf[..end], &e)));
                break;
            }
            buf.resize(grown, 0);
        } else if buf.len() > CONN_READ_BUFFER_BYTES
            && end <= CONN_READ_BUFFER_BYTES / 2
            && !last_frame_large
        {
            shrink(&mut buf, &mut taken);
        }
        if buf.len() > CONN_READ_BUFFER_BYTES && end == 0 {
            // Kept for the next large frame, unless the connection pauses. A base buffer's
            // worth first: a next frame larger than the kept buffer is seen before the
            // kept room fills with its bytes (the buffer then goes back to the base size).
            let first = &mut buf[..CONN_READ_BUFFER_BYTES];
            match within(READ_BUFFER_KEEP_MS, reader.read(first)).await {
                Some(Ok(0)) | Some(Err(_)) => break,
                Some(Ok(n)) => end = n,
                None => shrink(&mut buf, &mut taken),
            }
            continue;
        }
        if end == 0 {
            partial_since = None;
        } else if partial_since.is_none() {
            partial_since = Some(std::time::Instant::now());
        }
        // A large frame's whole time, from its first bytes; otherwise the time to the next
        // bytes.
        let large_left = partial_since.filter(|_| taken.bytes > 0).map(|since| {
            let spent = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
            timeout_ms.saturating_sub(spent).max(1)
        });
        let deadline_ms = large_left.or((!frames_seen || end > 0).then_some(timeout_ms));
        let read = match deadline_ms {
            Some(ms) => match within(ms, reader.read(&mut buf[end..])).await {
                Some(r) => r,
                None => {
                    let why = if large_left.is_some() {
                        "a frame over 64 KiB did not arrive whole within --conn-timeout-ms of its first bytes"
                    } else if frames_seen {
                        "the connection stopped in the middle of a frame"
                    } else {
                        "the connection sent no request"
                    };
                    let e = ErrorBody::new(ErrorCode::Timeout, why);
                    outbox.push(Answer::from(closing_error(&decoder, &buf[..end], &e)));
                    break;
                }
            },
            None => reader.read(&mut buf[end..]).await,
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => end += n,
        }
    }
    drop(taken);
    drop(buf);
    // The members on this connection leave their groups and its answer budget closes
    // (answers still being built fail); answers in flight go out.
    ctx.connection_closed(conn);
    drop(reading);
    let _ = writer_task.await;
    // A lingering close: the writer has shut its side down after the last answer; what the
    // peer still sends is read and dropped until it closes its side, for at most
    // `LINGER_MS`. Closing with its bytes unread has the kernel reset the connection and
    // drop what it had not sent yet: answers, and the typed error a protocol fault closes
    // with (`FrameTooLarge` to a client still writing the frame's body).
    let mut scratch = vec![0u8; CONN_READ_BUFFER_BYTES];
    let _ = within(LINGER_MS, async {
        while let Ok(1..) = reader.read(&mut scratch).await {}
    })
    .await;
    HandedOver(in_flight)
}

/// The requests a closed connection handed to the shard, some perhaps still running.
pub struct HandedOver(Rc<InFlight>);

impl HandedOver {
    /// Waits until every one has ended. Long polls and waits for answer room end with
    /// their connection; requests waiting for another shard end within the mesh's call
    /// timeout; sends waiting for the disk end when it answers (as long as a connection
    /// that closes normally, whose writer waits for them, holds its place).
    pub async fn ended(self) {
        while self.0.count.get() > 0 {
            self.0.freed.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection accepted here (its send buffer 4 KiB) whose peer, a thread, reads 4 KiB
    /// at a time with `pause` before each read until the end; the thread returns what it
    /// read.
    async fn slow_reader(
        pause: Duration,
    ) -> (
        glommio::net::TcpStream,
        RawFd,
        std::thread::JoinHandle<Vec<u8>>,
    ) {
        let listener = glommio::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let reader = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                std::thread::sleep(pause);
                match std::io::Read::read(&mut s, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            got
        });
        let stream = listener.accept().await.expect("accept");
        let fd = stream.as_raw_fd();
        let small = 4096i32;
        // SAFETY: setting an int socket option on a socket this test owns.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                &small as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as libc::socklen_t,
            );
        }
        (stream, fd, reader)
    }

    /// Many answers (more parts than one `sendmsg` takes) to a peer that reads slowly
    /// through a small socket buffer: the vectored writes stop part-way and wait for room,
    /// and the peer receives every byte once, in order.
    #[test]
    fn vectored_answers_arrive_whole_and_in_order_through_a_slow_reader() {
        let answers: Vec<Vec<u8>> = (0..1500u32)
            .map(|i| {
                let len = 1 + (i as usize * 7919) % 9000;
                (0..len).map(|j| (i as usize + j) as u8).collect()
            })
            .collect();
        let expected: Vec<u8> = answers.iter().flatten().copied().collect();
        let received = crate::io::run_local(move || async move {
            // Slower than the writer: its socket buffer fills and writes stop.
            let (stream, fd, reader) = slow_reader(Duration::from_micros(50)).await;
            let (_, mut writer) = futures_lite::io::split(stream);
            let answers: Vec<Answer> = answers.into_iter().map(Answer::from).collect();
            write_parts(fd, &mut writer, &answers)
                .await
                .expect("written");
            writer.close().await.expect("closed");
            drop(writer);
            reader.join().expect("reader")
        });
        assert_eq!(received.len(), expected.len());
        assert!(received == expected, "bytes differ");
    }

    /// A peer that reads slowly but steadily (1 MB/s through a small socket buffer) is not
    /// taken for stalled: a batch of answers (1 MiB) may take the connection timeout (here
    /// 500 ms) and a second for every 64 KiB, and every answer arrives though a batch takes
    /// twice the timeout. Before, the timeout alone covered a whole batch and the
    /// connection was cut mid-answer.
    #[test]
    fn a_slow_reader_that_keeps_reading_is_not_cut_off() {
        let answers: Vec<Vec<u8>> = (0..20u32).map(|i| vec![i as u8; 100 << 10]).collect();
        let expected: Vec<u8> = answers.iter().flatten().copied().collect();
        let (received, closed) = crate::io::run_local(move || async move {
            // The pace under test: 4 KiB every 4 ms.
            let (stream, fd, reader) = slow_reader(Duration::from_millis(4)).await;
            let (_, writer) = futures_lite::io::split(stream);
            let outbox = Outbox::new();
            for a in answers {
                outbox.push(Answer::from(a));
            }
            write_answers(outbox.clone(), writer, fd, 500).await;
            (reader.join().expect("reader"), outbox.closed.get())
        });
        assert!(!closed, "taken for stalled");
        assert_eq!(received.len(), expected.len());
        assert!(received == expected, "bytes differ");
    }

    #[test]
    fn the_read_budget_counts_what_is_taken_in_all_and_by_address() {
        let budget = ReadBudget::new(1 << 20);
        let peers: Vec<IpAddr> = (1..=5).map(|n| IpAddr::from([127, 0, 0, n])).collect();
        // A quarter of 256 MiB for each address.
        assert!(budget.try_take(peers[0], 60 << 20));
        assert!(!budget.try_take(peers[0], 5 << 20));
        for peer in &peers[1..4] {
            assert!(budget.try_take(*peer, 64 << 20));
        }
        assert_eq!(budget.used(peers[0]), (252 << 20, 60 << 20));
        assert!(!budget.try_take(peers[4], 5 << 20));
        budget.give(peers[1], 64 << 20);
        assert!(budget.try_take(peers[4], 5 << 20));
        assert!(budget.try_take(peers[0], 4 << 20));
        assert_eq!(budget.used(peers[0]), (197 << 20, 64 << 20));
        budget.give(peers[0], 64 << 20);
        assert_eq!(budget.used(peers[0]), (133 << 20, 0));
        assert!(budget.by_peer.borrow().get(&peers[0]).is_none());
        // At least one largest frame for an address.
        let budget = ReadBudget::new(100 << 20);
        assert!(budget.try_take(peers[0], 100 << 20));
        // An IPv6 host's /64 is one address; IPv4-mapped ones are IPv4.
        let v6 = |s: &str| share_key(s.parse::<IpAddr>().unwrap());
        assert_eq!(v6("2001:db8:1:2::7"), v6("2001:db8:1:2:ffff::1"));
        assert_ne!(v6("2001:db8:1:2::7"), v6("2001:db8:1:3::7"));
        assert_eq!(v6("::ffff:10.0.0.1"), v6("10.0.0.1"));
    }

    /// A connection growing past what it holds keeps what it holds counted while it waits
    /// for the rest, and after a wait that fails: its buffer holds those bytes (the next
    /// frame's first ones). It gave them back to wait for the whole, and another
    /// connection took them again: a client could hold many buffers outside the budget.
    #[test]
    fn growing_keeps_what_is_held_counted_while_waiting() {
        let (during, after_failed, grown) = crate::io::run_local(|| async {
            let budget = ReadBudget::new(1 << 20);
            let peer = IpAddr::from([127, 0, 0, 1]);
            let mut kept = BudgetTaken {
                budget: budget.clone(),
                peer,
                bytes: 0,
            };
            assert!(kept.grow_to(10 << 20, 0).await);
            // The others from the address take the rest of its quarter (64 MiB).
            assert!(budget.try_take(peer, 54 << 20));
            let other = budget.clone();
            let during = crate::io::spawn_joinable(async move {
                crate::io::sleep(Duration::from_millis(20)).await;
                // While the kept buffer waits: its 10 MiB are not there to take.
                let took = other.try_take(peer, 10 << 20);
                (took, other.used(peer))
            });
            let failed = !kept.grow_to(20 << 20, 100).await;
            assert!(failed, "grew past the quota");
            let after_failed = (budget.used(peer), kept.bytes);
            let during = during.await.expect("the other task");
            // Room given back: the rest comes while it waits.
            let giver = budget.clone();
            crate::io::spawn(async move {
                crate::io::sleep(Duration::from_millis(20)).await;
                giver.give(peer, 54 << 20);
            });
            let grown = kept.grow_to(20 << 20, 5_000).await;
            (during, after_failed, (grown, kept.bytes, budget.used(peer)))
        });
        assert_eq!(during, (false, (64 << 20, 64 << 20)));
        assert_eq!(after_failed, ((64 << 20, 64 << 20), 10 << 20));
        assert_eq!(grown, (true, 20 << 20, (20 << 20, 20 << 20)));
    }
}
