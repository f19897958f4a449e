//! One TCP connection to one broker address, with request pipelining.
//!
//! Two tasks own the socket halves:
//! - the **writer** drains a bounded channel of encoded frames and writes what is queued
//!   with vectored writes of at most 64 frames or 256 KiB each (frames of concurrent
//!   requests leave together);
//! - the **reader** reads large chunks into one growable buffer, cuts whole frames off its
//!   front with [`FrameDecoder`] (each frame becomes a shared `Bytes` slice of that buffer,
//!   no copy), and hands each response to the request that waits for its `request_id`.
//!
//! A request's frame carries its deadline: one still queued when its deadline has passed
//! (its caller was told `Timeout`) is not written, so a connection whose writes backed up
//! does not send every timed-out request later beside its retries (a send stored two or
//! three times).
//!
//! Callers wait on a oneshot channel registered under their request id. At most
//! `in_flight_max` requests wait at once (a semaphore); the frame channel has the same
//! bound, so memory is bounded however fast callers submit. When either task fails, every
//! waiting request fails at once with the same retriable [`ClientError::Connection`], both
//! tasks stop, and the connection is marked broken: its owner opens a new one on the next
//! request.

use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::{timeout_at, Duration, Instant};

use crate::protocol::kind::{KIND_PUSH_END, KIND_PUSH_FIRST};
use crate::protocol::{
    encode_frame_parts, Flags, Frame, FrameDecoder, FrameLimits, FrameParts, Kind, KindClass,
    Message, ProtocolError, Response, FRAME_BYTES_CEILING, FRAME_HEADER_BYTES,
};

use super::error::{ClientError, Result};

/// A new read buffer has this much room: large reads keep syscalls per frame low when
/// answers are small and many, and the frames read into one buffer share it (a buffer some
/// received frame still holds is not reused: the next one is allocated, and the partial
/// frame at the end copied over, once per buffer rather than once per read).
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// Reads go on into the current buffer while it has this much room left (and room for the
/// rest of the frame being read).
const READ_ROOM_MIN_BYTES: usize = 32 * 1024;
/// The writer stops gathering queued frames into one write past this size.
const WRITE_BATCH_BYTES_MAX: usize = 256 * 1024;
/// Most frames in one vectored write (well below the system's `IOV_MAX` of 1024).
const WRITE_BATCH_FRAMES_MAX: usize = 64;

/// A frame the broker pushed unasked (`Flags::PUSH`): group rebalances, lock losses.
#[derive(Debug, Clone)]
pub struct PushFrame {
    kind: Kind,
    frame: Bytes,
}

impl PushFrame {
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The whole frame, header included.
    pub fn bytes(&self) -> &Bytes {
        &self.frame
    }
    /// The frame, decoded again (its header was checked on receipt).
    pub fn frame(&self) -> std::result::Result<Frame<'_>, ProtocolError> {
        decode_checked(&self.frame)
    }
}

/// One whole, checked response frame, owned.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    frame: Bytes,
}

impl Reply {
    pub(crate) fn bytes(&self) -> &Bytes {
        &self.frame
    }

    /// The frame's header and payload, decoded again from the owned bytes.
    pub(crate) fn frame(&self) -> Result<Frame<'_>> {
        Ok(decode_checked(&self.frame)?)
    }

    /// The response, with an error frame turned into [`ClientError::Broker`].
    pub(crate) fn response(&self) -> Result<Response<'_>> {
        match self.frame()?.decode_response()? {
            Response::Error(e) => Err(e.into()),
            other => Ok(other),
        }
    }

    /// Where the raw record tail starts in [`bytes`](Self::bytes).
    pub(crate) fn tail_start(&self) -> Result<usize> {
        let frame = self.frame()?;
        Ok(FRAME_HEADER_BYTES + frame.header().meta_len() as usize)
    }
}

/// Decodes a frame whose header was already checked against the connection's limit.
fn decode_checked(bytes: &[u8]) -> std::result::Result<Frame<'_>, ProtocolError> {
    // The receive limit was enforced when the frame was cut from the stream; the ceiling
    // here only has to admit it again.
    let limits = FrameLimits::new(FRAME_BYTES_CEILING)?;
    match FrameDecoder::new(limits).decode(bytes)? {
        Some(frame) if frame.frame_len() == bytes.len() => Ok(frame),
        Some(frame) => Err(ProtocolError::PayloadLength {
            expected: frame.frame_len() - FRAME_HEADER_BYTES,
            found: bytes.len().saturating_sub(FRAME_HEADER_BYTES),
        }),
        None => Err(ProtocolError::Truncated {
            needed: FRAME_HEADER_BYTES,
            available: bytes.len(),
        }),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds valid data.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

type Waiter = oneshot::Sender<Result<Reply>>;

/// State shared by the connection handle and its two tasks.
struct Shared {
    peer: String,
    state: Mutex<State>,
    /// The handle was dropped: the writer writes only the frames queued without a deadline
    /// (oneway sends, told done once queued), then closes the socket.
    closing: std::sync::atomic::AtomicBool,
}

/// How long the writer of a connection whose handle was dropped may take to write its
/// queued oneway frames before it is stopped (a peer that reads nothing).
const DRAIN_ON_CLOSE: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    waiters: HashMap<u64, Waiter>,
    /// Why the connection is down; once set, no request is accepted.
    broken: Option<ClientError>,
    tasks: Vec<AbortHandle>,
}

impl Shared {
    /// Marks the connection broken (first reason wins), fails every waiter, stops both tasks.
    fn fail(&self, error: ClientError) {
        for task in self.fail_keeping_tasks(error) {
            task.abort();
        }
    }

    /// [`fail`](Self::fail), leaving both tasks running: their handles are returned (none
    /// when the connection was down already).
    fn fail_keeping_tasks(&self, error: ClientError) -> Vec<AbortHandle> {
        let (waiters, tasks) = {
            let mut state = lock(&self.state);
            if state.broken.is_some() {
                return Vec::new();
            }
            state.broken = Some(error.clone());
            (
                std::mem::take(&mut state.waiters),
                std::mem::take(&mut state.tasks),
            )
        };
        for waiter in waiters.into_values() {
            // The caller may have given up already; nothing to tell it then.
            let _ = waiter.send(Err(error.clone()));
        }
        tasks
    }

    fn broken(&self) -> Option<ClientError> {
        lock(&self.state).broken.clone()
    }

    fn broken_error(&self) -> ClientError {
        self.broken().unwrap_or_else(|| {
            ClientError::Connection(format!("connection to {} closed", self.peer))
        })
    }

    /// Hands a response to its waiter. Answers nobody waits for (the request timed out or
    /// was abandoned) are dropped.
    fn complete(&self, request_id: u64, reply: Reply) {
        let waiter = lock(&self.state).waiters.remove(&request_id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(Ok(reply));
        }
    }
}

/// Removes a request's waiter when the request ends in any way (answer, timeout, or the
/// caller dropping the future), so the map never keeps abandoned entries.
struct WaiterGuard<'a> {
    shared: &'a Shared,
    request_id: u64,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        lock(&self.shared.state).waiters.remove(&self.request_id);
    }
}

/// Settings a connection needs from the client configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    pub frames: FrameLimits,
    pub in_flight_max: usize,
}

/// A frame for the writer: a request's, not written past its deadline (`None`: oneway,
/// always written).
struct Outgoing {
    frame: FrameParts,
    deadline: Option<Instant>,
}

/// A pipelined connection to one broker address. Dropping the last handle closes it.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    frames: mpsc::Sender<Outgoing>,
    permits: Arc<Semaphore>,
    next_request_id: AtomicU64,
    /// The largest request frame sent: the client's own limit, lowered to the broker's once
    /// the handshake tells it (a larger one would be refused and the connection closed,
    /// failing every request on it as maybe stored).
    frame_bytes_max: AtomicU32,
    peer_addr: SocketAddr,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Requests waiting for answers fail, but the oneway frames queued (their callers
        // told done) are still written: the writer drains them and shuts its side down,
        // and the reader reads on (discarding) until the broker closes its side, so that
        // nothing unread turns the close into a reset that drops what was still unsent;
        // both are stopped after `DRAIN_ON_CLOSE`. Aborted at once, they dropped them.
        self.shared.closing.store(true, Ordering::Release);
        let tasks = self
            .shared
            .fail_keeping_tasks(ClientError::Connection(format!(
                "connection to {} closed by the client",
                self.shared.peer
            )));
        if tasks.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(DRAIN_ON_CLOSE).await;
                    for task in tasks {
                        task.abort();
                    }
                });
            }
            Err(_) => tasks.iter().for_each(AbortHandle::abort),
        }
    }
}

impl Connection {
    /// Opens a TCP connection to `addr` (no handshake: the caller sends it) and starts the
    /// reader and writer tasks. Pushed frames go to `pushes`.
    pub(crate) async fn open(
        addr: &str,
        deadline: Instant,
        limits: ConnectionLimits,
        pushes: broadcast::Sender<PushFrame>,
    ) -> Result<Connection> {
        let stream = match timeout_at(deadline, TcpStream::connect(addr)).await {
            Err(_) => {
                return Err(ClientError::Connection(format!(
                    "connect to {addr}: timed out"
                )))
            }
            Ok(Err(e)) => return Err(ClientError::Connection(format!("connect to {addr}: {e}"))),
            Ok(Ok(stream)) => stream,
        };
        // Requests are small and latency-bound; the writer batches on its own.
        stream
            .set_nodelay(true)
            .map_err(|e| ClientError::Connection(format!("set TCP_NODELAY on {addr}: {e}")))?;
        // A broker whose host vanished is found within about 2 minutes of silence: every
        // request on the connection then fails at once, instead of each timing out for as
        // long as the kernel retransmits (about 15 minutes).
        if let Err(e) =
            crate::protocol::keepalive::keep_alive(std::os::fd::AsRawFd::as_raw_fd(&stream))
        {
            crate::warn!("ringmq client: TCP keepalive not set on the connection to {addr}: {e}");
        }
        let peer_addr = stream
            .peer_addr()
            .map_err(|e| ClientError::Connection(format!("peer address of {addr}: {e}")))?;
        let (read_half, write_half) = stream.into_split();
        let shared = Arc::new(Shared {
            peer: addr.to_owned(),
            state: Mutex::new(State::default()),
            closing: std::sync::atomic::AtomicBool::new(false),
        });
        let (frames_tx, frames_rx) = mpsc::channel(limits.in_flight_max);
        let writer = tokio::spawn(write_loop(frames_rx, write_half, shared.clone()));
        let reader = tokio::spawn(read_loop(
            read_half,
            shared.clone(),
            FrameDecoder::new(limits.frames),
            pushes,
        ));
        {
            let mut state = lock(&shared.state);
            if state.broken.is_some() {
                // A task failed before we could record it: stop the other one too.
                writer.abort();
                reader.abort();
            } else {
                state.tasks = vec![writer.abort_handle(), reader.abort_handle()];
            }
        }
        Ok(Connection {
            shared,
            frames: frames_tx,
            permits: Arc::new(Semaphore::new(limits.in_flight_max)),
            next_request_id: AtomicU64::new(1),
            frame_bytes_max: AtomicU32::new(limits.frames.frame_bytes_max()),
            peer_addr,
        })
    }

    /// The broker's frame limit, from its handshake: no larger request is sent.
    pub(crate) fn lower_frame_limit(&self, broker: u32) {
        self.frame_bytes_max.fetch_min(broker, Ordering::Relaxed);
    }

    /// The address this connection reached.
    pub(crate) fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// Whether the connection broke (or was closed) and must be replaced.
    pub(crate) fn is_broken(&self) -> bool {
        self.shared.broken().is_some()
    }

    /// Sends `meta` as a request and waits for its answer until `deadline`.
    /// `timeout_ms` is only for the error message.
    pub(crate) async fn request<M: Message>(
        &self,
        meta: &M,
        deadline: Instant,
        timeout_ms: u64,
    ) -> Result<Reply> {
        let timed_out = ClientError::Timeout { timeout_ms };
        let _permit: OwnedSemaphorePermit =
            match timeout_at(deadline, self.permits.clone().acquire_owned()).await {
                Err(_) => return Err(timed_out),
                Ok(Err(_)) => return Err(self.shared.broken_error()),
                Ok(Ok(permit)) => permit,
            };
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let frame = self.encode(request_id, Flags::NONE, meta)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut state = lock(&self.shared.state);
            if let Some(e) = &state.broken {
                return Err(e.clone());
            }
            state.waiters.insert(request_id, tx);
        }
        let _guard = WaiterGuard {
            shared: &self.shared,
            request_id,
        };
        let frame = Outgoing {
            frame,
            deadline: Some(deadline),
        };
        match timeout_at(deadline, self.frames.send(frame)).await {
            Err(_) => return Err(timed_out),
            Ok(Err(_)) => return Err(self.shared.broken_error()),
            Ok(Ok(())) => {}
        }
        match timeout_at(deadline, rx).await {
            Err(_) => Err(timed_out),
            // The waiter was dropped without an answer: the connection failed.
            Ok(Err(_)) => Err(self.shared.broken_error()),
            Ok(Ok(result)) => result,
        }
    }

    /// Sends `meta` as a oneway request: no answer comes, not even an error. Returns once
    /// the frame is queued for the writer.
    pub(crate) async fn send_oneway<M: Message>(
        &self,
        meta: &M,
        deadline: Instant,
        timeout_ms: u64,
    ) -> Result<()> {
        if let Some(e) = self.shared.broken() {
            return Err(e);
        }
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let frame = Outgoing {
            frame: self.encode(request_id, Flags::ONEWAY, meta)?,
            deadline: None,
        };
        match timeout_at(deadline, self.frames.send(frame)).await {
            Err(_) => Err(ClientError::Timeout { timeout_ms }),
            Ok(Err(_)) => Err(self.shared.broken_error()),
            Ok(Ok(())) => Ok(()),
        }
    }

    /// The request's frame, with message bodies kept by reference (not copied into it).
    fn encode<M: Message>(&self, request_id: u64, flags: Flags, meta: &M) -> Result<FrameParts> {
        let mut frame = FrameParts {
            bytes: Vec::with_capacity(FRAME_HEADER_BYTES + meta.meta_len_hint()),
            shared: Vec::new(),
        };
        let len = encode_frame_parts(request_id, flags, meta, &mut frame)?;
        let max = self.frame_bytes_max.load(Ordering::Relaxed);
        if len > max as usize {
            return Err(ClientError::InvalidArgument(format!(
                "a {} request of {len} bytes is larger than the frame limit of {max} bytes (the smaller of the client's frame_bytes_max and the broker's --frame-bytes-max)",
                M::KIND,
            )));
        }
        Ok(frame)
    }
}

async fn write_loop(
    mut frames: mpsc::Receiver<Outgoing>,
    mut out: OwnedWriteHalf,
    shared: Arc<Shared>,
) {
    // Frames ready together go out in one vectored write, without copying them together.
    let mut batch: Vec<FrameParts> = Vec::with_capacity(WRITE_BATCH_FRAMES_MAX);
    while let Some(first) = frames.recv().await {
        // One clock reading a write: a request past its deadline was answered `Timeout`.
        let now = Instant::now();
        // Closing: the requests' callers were told it failed; only oneway frames go.
        let closing = shared.closing.load(Ordering::Acquire);
        let mut bytes = 0;
        let mut next = Some(first);
        while let Some(outgoing) = next.take() {
            let wanted = match outgoing.deadline {
                Some(deadline) => !closing && deadline > now,
                None => true,
            };
            if wanted {
                bytes += outgoing.frame.len();
                batch.push(outgoing.frame);
            }
            if bytes < WRITE_BATCH_BYTES_MAX && batch.len() < WRITE_BATCH_FRAMES_MAX {
                next = frames.try_recv().ok();
            }
        }
        if batch.is_empty() {
            continue;
        }
        let written = write_frames(&mut out, &batch).await;
        batch.clear();
        if let Err(e) = written {
            shared.fail(ClientError::Connection(format!(
                "write to {}: {e}",
                shared.peer
            )));
            return;
        }
    }
    // Every sender is gone: the connection handle was dropped.
    let _ = out.shutdown().await;
}

/// Writes every frame, in order, with as few (vectored) writes as the socket allows (a
/// write takes up to the system's `IOV_MAX` pieces; the rest go in the next).
async fn write_frames(out: &mut OwnedWriteHalf, frames: &[FrameParts]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(frames.len());
    for f in frames {
        f.for_each_slice(|s| slices.push(IoSlice::new(s)));
    }
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = out.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// What the front of the receive buffer holds.
enum Step {
    /// A whole frame of this many bytes.
    Frame {
        len: usize,
        kind: Kind,
        request_id: u64,
        flags: Flags,
    },
    /// A pushed frame of a kind this client does not know yet (a newer broker): skipped,
    /// so a newer broker's notifications never break an older client's connection.
    SkipUnknownPush { len: usize },
    /// Not a whole frame yet: read until the buffer holds this many bytes.
    NeedMore { total: usize },
}

fn next_step(decoder: &FrameDecoder, buf: &[u8]) -> std::result::Result<Step, ProtocolError> {
    match decoder.decode(buf) {
        Ok(Some(frame)) => Ok(Step::Frame {
            len: frame.frame_len(),
            kind: frame.kind(),
            request_id: frame.request_id(),
            flags: frame.header().flags(),
        }),
        Ok(None) => Ok(Step::NeedMore {
            total: decoder.bytes_needed(buf)?,
        }),
        // The decoder checks magic, version and the length bounds before the kind, so
        // the length field of a frame refused for its kind is trustworthy.
        Err(ProtocolError::UnknownKind(kind))
            if (KIND_PUSH_FIRST..KIND_PUSH_END).contains(&kind) =>
        {
            let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() >= len {
                Ok(Step::SkipUnknownPush { len })
            } else {
                Ok(Step::NeedMore { total: len })
            }
        }
        Err(e) => Err(e),
    }
}

/// What every request waiting on a connection fails with once the broker sent a frame the
/// client cannot read: the retriable `Connection` of any broken connection (the requests
/// in flight may have been done: a send may be stored), naming the frame's fault. Before,
/// it was `Protocol`, which a producer took for a refusal.
fn unreadable(shared: &Shared, e: ProtocolError) -> ClientError {
    ClientError::Connection(format!(
        "connection to {} broken: the broker sent a frame that cannot be read: {e}",
        shared.peer
    ))
}

async fn read_loop(
    mut input: OwnedReadHalf,
    shared: Arc<Shared>,
    decoder: FrameDecoder,
    pushes: broadcast::Sender<PushFrame>,
) {
    let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    loop {
        let total = loop {
            match next_step(&decoder, &buf) {
                Ok(Step::Frame {
                    len,
                    kind,
                    request_id,
                    flags,
                }) => {
                    // The frame leaves the buffer as a shared slice: records of a pull
                    // answer are read where they landed.
                    let frame = buf.split_to(len).freeze();
                    if flags.is_push() {
                        // No subscriber is fine: nobody asked for notifications.
                        let _ = pushes.send(PushFrame { kind, frame });
                    } else if kind.class() == KindClass::Response {
                        shared.complete(request_id, Reply { frame });
                    } else {
                        let e = ProtocolError::UnexpectedKind {
                            expected: KindClass::Response,
                            found: kind,
                        };
                        shared.fail(unreadable(&shared, e));
                        return;
                    }
                }
                Ok(Step::SkipUnknownPush { len }) => buf.advance(len),
                Ok(Step::NeedMore { total }) => break total,
                Err(e) => {
                    shared.fail(unreadable(&shared, e));
                    return;
                }
            }
        };
        // Room for the rest of the frame, and some more, in the current buffer; else a big
        // chunk. When every earlier frame has been dropped, `reserve` reuses the same
        // allocation (moving only the partial frame to its front); only a frame still held
        // elsewhere (a pull answer the application keeps) makes it allocate.
        let rest = total.saturating_sub(buf.len());
        if buf.capacity() - buf.len() < rest.max(READ_ROOM_MIN_BYTES) {
            buf.reserve(rest.max(READ_CHUNK_BYTES));
        }
        match input.read_buf(&mut buf).await {
            Ok(0) => {
                shared.fail(ClientError::Connection(format!(
                    "connection to {} closed by the broker",
                    shared.peer
                )));
                return;
            }
            Ok(_) => {}
            Err(e) => {
                shared.fail(ClientError::Connection(format!(
                    "read from {}: {e}",
                    shared.peer
                )));
                return;
            }
        }
    }
}
