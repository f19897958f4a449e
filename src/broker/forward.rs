//! Requests passed on to the shard that handles them: the frame as it came (its copy held
//! in the shard's [`HeldRequests`](super::answer::HeldRequests)), its answer back as the
//! bytes to write. Room for an answer with records is reserved here first; a pull runs
//! there in two steps ([`PollStep`]).

use std::rc::Rc;

use super::answer::Answer;
use super::mesh::{MeshReply, MeshRequest};
use super::{err, error_frame, Arrival, Handled, ShardCtx};
use crate::protocol::{ErrorBody, ErrorCode, FrameDecoder, Response};

impl ShardCtx {
    /// Passes a request frame, as it came, to the shard that handles it, waiting up to
    /// `timeout_ms`; its answer comes back as the bytes to write. An answer with records
    /// ([`Forward`]) is built on the other shard: room for the largest one is reserved here
    /// first, so a client that does not read cannot make the shards hold its answers
    /// (shard-aware clients send these straight to the owner). A pull is passed on in two
    /// steps ([`PollStep`]): its wait, holding no room (long polls held for their whole
    /// wait with the room of the largest answer each, about 50 of them took all of a
    /// shard's, and its own pulls waited behind them), then, once records are there, its
    /// read, with the room. Such a request ends with its connection, and a long poll ended
    /// so is ended on the other shard too.
    pub(super) fn forward(
        self: &Rc<Self>,
        to: u32,
        at: &Arrival<'_>,
        timeout_ms: u64,
        kind: Forward,
    ) -> Handled {
        let carries_records = kind != Forward::Plain;
        let held = match self.held.hold(at.bytes.len(), self.id, at.peer) {
            Ok(held) => held,
            Err(e) => {
                self.count_error(&e);
                let answer = (!at.oneway).then(|| Answer::from(error_frame(at.request_id, &e)));
                return Handled::Now(answer);
            }
        };
        self.stats.forwarded.set(self.stats.forwarded.get() + 1);
        let ctx = self.clone();
        let frame_bytes = at.bytes.to_vec();
        let &Arrival {
            request_id,
            oneway,
            peer,
            conn,
            frame_max,
            ..
        } = at;
        let largest = frame_max as usize;
        Handled::Later(Box::pin(async move {
            let _held = held;
            let ask = |bytes, poll| {
                let body = MeshRequest::Frame {
                    bytes,
                    peer,
                    conn,
                    frame_max,
                    poll,
                };
                ctx.forwarded_call(to, conn, body, timeout_ms, kind)
            };
            let failed =
                |e: ErrorBody| (!oneway).then(|| Answer::from(error_frame(request_id, &e)));
            let read_step = if kind == Forward::LongPoll {
                // A pull's frame is small: copied for this step.
                let waited = match ask(frame_bytes.clone(), PollStep::Wait).await? {
                    Ok(frame) => frame,
                    Err(e) => return failed(e),
                };
                if !records_ready(&ctx, &waited) {
                    // A status (no records, an error, a position moved): the answer.
                    return Some(Answer::from(waited));
                }
                PollStep::Read
            } else {
                PollStep::Whole
            };
            let hold = if carries_records {
                match ctx.reserve_answer(conn, largest).await {
                    // Its connection closed while it waited for room: nobody to answer.
                    Ok(_) if ctx.conn_closed(conn) => return None,
                    Ok(hold) => Some(hold),
                    Err(e) => return failed(e),
                }
            } else {
                None
            };
            let frame = match ask(frame_bytes, read_step).await? {
                Ok(frame) => frame,
                Err(e) => return failed(e),
            };
            Some(match hold {
                Some(mut hold) => {
                    hold.shrink_to(frame.len());
                    Answer::held(frame, hold)
                }
                None => Answer::from(frame),
            })
        }))
    }

    /// One call of [`forward`](Self::forward) for connection `conn`: the answer's frame;
    /// `None` when there is no answer to give (none for a one-way request, or the
    /// connection closed). A request with records ends with its connection here, as one of
    /// this shard's does, and a long poll's shard is told so: its poll ends too.
    async fn forwarded_call(
        self: &Rc<Self>,
        to: u32,
        conn: u64,
        body: MeshRequest,
        timeout_ms: u64,
        kind: Forward,
    ) -> Option<Result<Vec<u8>, ErrorBody>> {
        let call = self.call_with_timeout(to, body, timeout_ms);
        let called = if kind != Forward::Plain {
            let ours = self.conn_is_ours(conn);
            let call = async { Ok(call.await) };
            self.answers.unless_closed(conn, ours, call).await.ok()
        } else {
            Some(call.await)
        };
        let Some(called) = called else {
            // What waits there for room for its answer (a lookup) ends too: it held a
            // place among the shard's waiting polls for nobody.
            self.tell_forwarded_close(to, conn);
            return None;
        };
        Some(match called {
            Ok(MeshReply::Frame(f)) if f.is_empty() => return None,
            Ok(MeshReply::Frame(f)) => Ok(f),
            Ok(other) => Err(err(
                ErrorCode::Internal,
                format!("unexpected reply {other:?}"),
            )),
            Err(e) => Err(e),
        })
    }
}

/// Whether the answer to a pull's [`PollStep::Wait`] says records are there to read: the
/// `Found` with no records that only that step gives.
fn records_ready(ctx: &ShardCtx, frame: &[u8]) -> bool {
    let decoded = FrameDecoder::new(ctx.cfg.frame_limits).decode(frame);
    match decoded.ok().flatten().map(|f| f.decode_response()) {
        Some(Ok(Response::Pull(p))) => {
            p.meta().status == crate::protocol::PullStatus::Found && p.meta().count == 0
        }
        _ => false,
    }
}

/// The part of a pull a shard runs. A pull forwarded from the shard of its connection runs
/// in two steps, so that the room for its answer, reserved on that shard, is held only
/// once there are records to read, not for the whole wait.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PollStep {
    /// All of it, as it arrived.
    Whole,
    /// The wait only: answered `Found` with no records once there are records to read
    /// (none are read), else with the status the whole pull would give.
    Wait,
    /// The read only: answered with what is there now, no wait.
    Read,
}

/// What a forwarded request's answer carries.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Forward {
    Plain,
    /// Stored records, or an answer without records that can be large (a group's members):
    /// room for the largest frame is reserved first.
    Records,
    /// Stored records, after a wait for them (a pull).
    LongPoll,
}
