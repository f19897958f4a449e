//! The channel mesh between shards: what one shard asks another ([`MeshRequest`]), the
//! answers, request/answer pairing by correlation id with a timeout, and one FIFO per peer
//! shard so forwarded requests keep their order.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::answer::Answer;
use super::group_service::LockOp;
use super::schedule::OwnedDraft;
use super::{err, Handled, LocalBoxFuture, PollStep, ShardCtx};
use crate::protocol::{ErrorBody, ErrorCode};

/// How long a shard waits for another shard's answer.
pub(super) const MESH_CALL_TIMEOUT_MS: u64 = 30_000;
/// Requests queued for one peer shard before `call` waits.
const OUTBOX_CAPACITY: usize = 1024;

/// What one shard asks another.
#[derive(Debug)]
pub enum MeshRequest {
    /// A client's request frame, to handle as if it had arrived on this shard.
    Frame {
        bytes: Vec<u8>,
        peer: SocketAddr,
        conn: u64,
        /// The largest frame the connection takes.
        frame_max: u32,
        /// The part of a pull to run (other requests: [`PollStep::Whole`]).
        poll: PollStep,
    },
    /// Shard 0 tells the others of a topic change (None: deleted), with the topic's
    /// creation stamp (`TopicTable::born`).
    TopicChanged {
        topic: String,
        queues: Option<u32>,
        born: u64,
    },
    /// Shard 0 is asked about a topic the asking shard's table lacks: to create it if it
    /// does not exist (`create`: auto-create), and, if it does, to tell the asking shard
    /// again (a change it missed: its call failed or timed out). `queues` and `origin` are
    /// those of a creation, unused when `create` is false.
    EnsureTopic {
        topic: String,
        queues: u32,
        origin: super::topics::NewTopic,
        create: bool,
    },
    /// (queue, min, max) of the topic's queues this shard owns.
    QueueRanges { topic: String },
    /// Records with this key on this shard.
    ByKey {
        topic: String,
        key: String,
        begin_ms: i64,
        end_ms: i64,
        max: u32,
    },
    /// Write a pushed frame to a client connection of this shard.
    Push { conn: u64, frame: Vec<u8> },
    /// A member left (decided at `stamp`): drop its locks here.
    ReleaseClient {
        group: String,
        client_id: String,
        stamp: u64,
    },
    /// (to a coordinator) a connection carrying members of the group closed.
    ConnectionClosed { group: String, conn: u64 },
    /// A connection of the asking shard closed while a request of it forwarded here was
    /// handled: what waits for it (a long poll) ends.
    ForwardedConnectionClosed { conn: u64 },
    /// To a producer group's coordinator: push this check to one of its producers.
    AskProducer {
        group: String,
        turn: usize,
        frame: Vec<u8>,
    },
    /// This shard's unresolved half messages.
    ListTransactions,
    /// Lock or unlock queues this shard owns.
    Locks {
        op: LockOp,
        group: String,
        client_id: String,
        /// The requesting connection (`LockTable::lock_batch`).
        conn: u64,
        topic: String,
        queues: Vec<u32>,
        /// When the request was made ([`super::group_service::steady_ns`]).
        stamp: u64,
    },
    /// Reset the group's offsets of this shard's queues of the topic; refuse the group's
    /// commits of positions read under an offsets epoch before `epoch`.
    ResetOffsets {
        group: String,
        topic: String,
        timestamp_ms: i64,
        epoch: u64,
    },
    /// Forget the group's offsets and locks on this shard.
    ForgetGroup { group: String },
    /// (to a coordinator) the epoch of a reset of the group's offsets that starts.
    ReserveOffsetsEpoch { group: String },
    /// (to a coordinator) the group's offsets were reset at `epoch`: members must re-read
    /// them.
    OffsetsReset { group: String, epoch: u64 },
    /// (to a coordinator) a shard keeps a fence of the group's offsets at `epoch`: publish
    /// it, unless it is the epoch of a reset this coordinator reserved (which publishes it
    /// once every shard is done).
    FenceSeen { group: String, epoch: u64 },
    /// The group's progress on this shard's queues of the topic.
    Progress { group: String, topic: String },
    /// The groups with an offset of the topic kept on this shard, and those this shard
    /// coordinates with a live clustering member subscribed to it.
    GroupsOfTopic { topic: String },
    /// (from shard 0, before a topic update adds queues) offsets at the start of these new
    /// queues of the topic this shard owns, for these groups, durable before the answer.
    SeedOffsets {
        topic: String,
        queues: Vec<u32>,
        groups: Vec<String>,
    },
    /// Store a message in a queue this shard owns (held in its schedule if delayed);
    /// answer once an fdatasync covers it.
    Put {
        draft: OwnedDraft,
        wait: super::retry::PutWait,
    },
    /// This shard's schedule of delayed messages.
    ScheduleStats,
}

#[derive(Debug)]
pub enum MeshReply {
    Frame(Vec<u8>),
    Ack,
    Ranges(Vec<(u32, u64, u64)>),
    Records(Vec<Vec<u8>>),
    Queues(Vec<u32>),
    /// A group's offsets epoch.
    Epoch(u64),
    Progress(Vec<crate::protocol::QueueProgress>),
    Groups(Vec<String>),
    Put {
        msg_id: String,
        queue_offset: u64,
    },
    Schedule(crate::protocol::ShardScheduleInfo),
    /// This shard's oldest unresolved half messages, their count, discards.
    Transactions(crate::protocol::TransactionList),
    Failed(ErrorCode, String),
}

#[derive(Debug)]
pub enum MeshMsg {
    Request {
        from: u32,
        corr: u64,
        body: MeshRequest,
    },
    Reply {
        corr: u64,
        body: MeshReply,
    },
}

/// A mesh call's place among the calls waiting for answers: given up when dropped.
struct PendingCall {
    ctx: Rc<ShardCtx>,
    corr: u64,
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        self.ctx.pending.borrow_mut().remove(&self.corr);
    }
}

/// How a shard reaches the others (implemented by the shard runtime over bounded channels).
pub trait Peers {
    /// Sends a message to shard `to`; waits while its channel is full; fails if the
    /// channel is closed (that shard stopped).
    fn send(&self, to: u32, msg: MeshMsg) -> LocalBoxFuture<'_, Result<(), String>>;
}

impl ShardCtx {
    /// Sends a request to another shard and waits for its answer.
    pub async fn call(self: &Rc<Self>, to: u32, body: MeshRequest) -> Result<MeshReply, ErrorBody> {
        self.call_with_timeout(to, body, MESH_CALL_TIMEOUT_MS).await
    }

    /// The FIFO of requests to shard `to`. Requests leave in the order they were handed to
    /// `call` (one drain task per peer), so forwarded sends to one queue keep their order
    /// even when the mesh channel is full and its waiting senders would be woken in any order.
    fn outbox(self: &Rc<Self>, to: u32) -> tokio::sync::mpsc::Sender<MeshMsg> {
        if let Some(tx) = self.outboxes.borrow().get(&to) {
            return tx.clone();
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel::<MeshMsg>(OUTBOX_CAPACITY);
        self.outboxes.borrow_mut().insert(to, tx.clone());
        let ctx = self.clone();
        crate::io::spawn(async move {
            while let Some(msg) = rx.recv().await {
                if let Err(e) = ctx.peers.send(to, msg).await {
                    crate::warn!("ringmq: shard {}: to shard {to}: {e}", ctx.id);
                }
            }
        });
        tx
    }

    /// [`call`](Self::call) with its own timeout (a forwarded long poll waits longer).
    pub async fn call_with_timeout(
        self: &Rc<Self>,
        to: u32,
        body: MeshRequest,
        timeout_ms: u64,
    ) -> Result<MeshReply, ErrorBody> {
        self.request(to, body, timeout_ms).await?.await
    }

    /// Hands a request to shard `to`'s FIFO (the order of these calls is the order the
    /// requests leave in); the returned future waits for the answer.
    pub(super) async fn request(
        self: &Rc<Self>,
        to: u32,
        body: MeshRequest,
        timeout_ms: u64,
    ) -> Result<impl std::future::Future<Output = Result<MeshReply, ErrorBody>>, ErrorBody> {
        let corr = self.next_corr.get();
        self.next_corr.set(corr + 1);
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(corr, tx);
        // Its entry goes however the call ends: answered, timed out, or dropped (a caller
        // that gave up, say on its connection's close, even before the request left).
        let pending = PendingCall {
            ctx: self.clone(),
            corr,
        };
        let msg = MeshMsg::Request {
            from: self.id,
            corr,
            body,
        };
        if self.outbox(to).send(msg).await.is_err() {
            return Err(err(
                ErrorCode::ShardUnavailable,
                format!("shard {to} is not reachable"),
            ));
        }
        Ok(async move {
            let _pending = pending;
            let timeout = crate::io::sleep(Duration::from_millis(timeout_ms));
            let answer = futures_lite::future::or(async { rx.await.ok() }, async {
                timeout.await;
                None
            })
            .await;
            match answer {
                Some(MeshReply::Failed(code, message)) => Err(err(code, message)),
                Some(reply) => Ok(reply),
                // The request left: it may yet be carried out there (a send stored).
                None => Err(err(
                    ErrorCode::Timeout,
                    format!(
                        "shard {to} did not answer within {timeout_ms} ms; what was asked may \
                         still be done there"
                    ),
                )),
            }
        })
    }

    /// Tells shard `to` that connection `conn` of this shard closed while a request of it
    /// with records (a long poll, a lookup) was forwarded there, so that it ends there too. Once for the polls of one
    /// connection that end together (each would tell it again).
    pub(super) fn tell_forwarded_close(self: &Rc<Self>, to: u32, conn: u64) {
        if !self.answers.start_telling(conn, to) {
            return;
        }
        let ctx = self.clone();
        crate::io::spawn(async move {
            let _ = (ctx.call(to, MeshRequest::ForwardedConnectionClosed { conn })).await;
            ctx.answers.done_telling(conn, to);
        });
    }

    /// Handles a message from another shard.
    pub fn on_mesh(self: &Rc<Self>, msg: MeshMsg) {
        match msg {
            MeshMsg::Reply { corr, body } => {
                if let Some(tx) = self.pending.borrow_mut().remove(&corr) {
                    let _ = tx.send(body);
                }
            }
            MeshMsg::Request { from, corr, body } => {
                let ctx = self.clone();
                // Frames are dispatched now, in arrival order, so that forwarded sends keep
                // the order they were sent in; only their completion is asynchronous.
                let fut: LocalBoxFuture<'static, MeshReply> = match body {
                    MeshRequest::Frame {
                        bytes,
                        peer,
                        conn,
                        frame_max,
                        poll,
                    } => {
                        // Known before a word of its close can arrive (it comes after the
                        // frame, in this FIFO), for as long as the request is handled.
                        let forwarded = (conn != 0).then(|| ctx.answers.forwarded(conn));
                        match ctx.handle_frame(&bytes, peer, conn, Some(frame_max), poll) {
                            // The answer's reservation on this shard ends here: the bytes
                            // move to the shard of the connection, which accounts for them
                            // there.
                            Handled::Now(f) => Box::pin(async move {
                                MeshReply::Frame(f.map(Answer::into_bytes).unwrap_or_default())
                            }),
                            Handled::Later(f) => Box::pin(async move {
                                let f = f.await;
                                drop(forwarded);
                                MeshReply::Frame(f.map(Answer::into_bytes).unwrap_or_default())
                            }),
                        }
                    }
                    MeshRequest::TopicChanged {
                        topic,
                        queues,
                        born,
                    } => ctx.on_topic_changed(topic, queues, born),
                    // From the shard that asked: it may be told of the topic again.
                    MeshRequest::EnsureTopic {
                        topic,
                        queues,
                        origin,
                        create,
                    } => Box::pin(async move {
                        let create = create.then_some((queues, origin));
                        match ctx.ensure_topic_for(from, &topic, create).await {
                            Ok(()) => MeshReply::Ack,
                            Err(e) => MeshReply::Failed(
                                e.error_code().unwrap_or(ErrorCode::Internal),
                                e.message,
                            ),
                        }
                    }),
                    other => Box::pin(async move { ctx.mesh_request(other).await }),
                };
                let ctx = self.clone();
                crate::io::spawn(async move {
                    let body = fut.await;
                    let _ = ctx.peers.send(from, MeshMsg::Reply { corr, body }).await;
                });
            }
        }
    }

    async fn mesh_request(self: Rc<Self>, req: MeshRequest) -> MeshReply {
        match req {
            MeshRequest::Frame { .. } => {
                MeshReply::Failed(ErrorCode::Internal, "frame routed wrongly".into())
            }
            MeshRequest::TopicChanged { .. } | MeshRequest::EnsureTopic { .. } => {
                MeshReply::Failed(ErrorCode::Internal, "topic request routed wrongly".into())
            }
            MeshRequest::QueueRanges { topic } => match self.local_ranges(&topic) {
                Ok(ranges) => MeshReply::Ranges(ranges),
                Err(e) => {
                    MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                }
            },
            MeshRequest::Push { conn, frame } => {
                let pushed = self
                    .conns
                    .borrow()
                    .get(&conn)
                    .is_some_and(|push| push(frame));
                if pushed {
                    MeshReply::Ack
                } else {
                    MeshReply::Failed(
                        ErrorCode::ShardUnavailable,
                        format!("connection {conn} is gone or holds too much to take a push"),
                    )
                }
            }
            MeshRequest::ReleaseClient {
                group,
                client_id,
                stamp,
            } => {
                self.locks
                    .borrow_mut()
                    .release_client(&group, &client_id, stamp);
                MeshReply::Ack
            }
            MeshRequest::ConnectionClosed { group, conn } => {
                // Heard: acknowledged now, its members' departure (lock releases on every
                // shard, notices to the rest, each a mesh call) goes on in a task of its
                // own. Answered after it, a slow departure read as a notice not heard, and
                // the sender told it again and again.
                let ctx = self.clone();
                crate::io::spawn(async move { ctx.on_connection_closed(&group, conn).await });
                MeshReply::Ack
            }
            MeshRequest::ForwardedConnectionClosed { conn } => {
                self.answers.close_forwarded(conn);
                MeshReply::Ack
            }
            MeshRequest::AskProducer { group, turn, frame } => {
                if self.ask_producer(&group, turn, frame).await {
                    MeshReply::Ack
                } else {
                    MeshReply::Failed(
                        ErrorCode::GroupNotFound,
                        format!("producer group {group} has no live producer"),
                    )
                }
            }
            MeshRequest::ListTransactions => MeshReply::Transactions(self.local_transactions()),
            MeshRequest::Locks {
                op,
                group,
                client_id,
                conn,
                topic,
                queues,
                stamp,
            } => match self.local_locks(op, &group, &client_id, conn, &topic, &queues, stamp) {
                Ok(held) => MeshReply::Queues(held),
                Err(e) => {
                    MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                }
            },
            MeshRequest::ResetOffsets {
                group,
                topic,
                timestamp_ms,
                epoch,
            } => match self.local_reset(&group, &topic, timestamp_ms, epoch).await {
                Ok(()) => MeshReply::Ack,
                Err(e) => {
                    MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                }
            },
            MeshRequest::ForgetGroup { group } => match self.forget_group(&group).await {
                Ok(()) => MeshReply::Ack,
                Err(e) => {
                    MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                }
            },
            MeshRequest::ReserveOffsetsEpoch { group } => {
                match self.reserve_offsets_epoch(&group) {
                    Ok(epoch) => MeshReply::Epoch(epoch),
                    Err(e) => {
                        MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                    }
                }
            }
            MeshRequest::OffsetsReset { group, epoch } => {
                self.offsets_were_reset(&group, epoch).await;
                MeshReply::Ack
            }
            MeshRequest::FenceSeen { group, epoch } => {
                self.fence_seen(&group, epoch).await;
                MeshReply::Ack
            }
            MeshRequest::Progress { group, topic } => match self.local_progress(&group, &topic) {
                Ok(progress) => MeshReply::Progress(progress),
                Err(e) => {
                    MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                }
            },
            MeshRequest::GroupsOfTopic { topic } => MeshReply::Groups(self.groups_of_topic(&topic)),
            MeshRequest::SeedOffsets {
                topic,
                queues,
                groups,
            } => match self.seed_offsets(&topic, &queues, &groups).await {
                Ok(()) => MeshReply::Ack,
                Err(e) => {
                    MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                }
            },
            MeshRequest::Put { draft, wait } => match self.put_owned(draft, wait).await {
                Ok(done) => MeshReply::Put {
                    msg_id: done.msg_id,
                    queue_offset: done.queue_offset,
                },
                Err(e) => {
                    MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                }
            },
            MeshRequest::ScheduleStats => MeshReply::Schedule(self.local_schedule_info()),
            MeshRequest::ByKey {
                topic,
                key,
                begin_ms,
                end_ms,
                max,
            } => match self.local_by_key(&topic, &key, begin_ms, end_ms, max).await {
                Ok(records) => MeshReply::Records(records),
                Err(e) => {
                    MeshReply::Failed(e.error_code().unwrap_or(ErrorCode::Internal), e.message)
                }
            },
        }
    }
}
