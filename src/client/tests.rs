//! Client tests against a fake broker: tokio listeners that speak the frame protocol, answer
//! the handshake themselves and hand every other request to the test's handler. They cover
//! what needs no real broker: pipelining, timeouts, reconnects, routing, decoding of pull
//! answers, and refusals before any I/O.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpListener;

use crate::protocol::record::{prop, Placement, PropertiesBuilder, RecordDraft, BODY_BYTES_MAX};
use crate::protocol::{
    encode_error, encode_response, ErrorCode, FrameDecoder, HandshakeOk, Offset, PullResponse,
    PullStatus, QueueInfo, Request, Response, SendResult, TopicInfo, FRAME_MAGIC, PROTOCOL_VERSION,
};

use super::route::{owner, tag_hash};
use super::*;

mod connection;
mod consumer;
mod producer;

/// What the fake broker does after a request.
enum Out {
    /// Write this frame now.
    Frame(Vec<u8>),
    /// Write this frame after a pause (a slow broker).
    Later(Duration, Vec<u8>),
    /// Close the connection.
    Close,
    /// Read nothing more from the connection for this long (a broker that stops reading:
    /// the client's writes back up).
    Stall(Duration),
}

struct Ctx {
    shard: u32,
    /// Connections this shard accepted before this one.
    conn_no: usize,
}

type Handler = Arc<dyn Fn(&Ctx, u64, Request) -> Vec<Out> + Send + Sync>;

/// A fake broker of `shards` shards; shard 0's address is the bootstrap address.
struct Fake {
    addrs: Vec<SocketAddr>,
    /// Every request but handshakes, with the shard that received it.
    log: Arc<Mutex<Vec<(u32, Request)>>>,
    handshakes: Arc<AtomicUsize>,
    /// The broker id its handshakes answer (7 unless a test changes it).
    broker_id: Arc<AtomicU32>,
    /// The session timeout and lock expiry (ms) its handshakes answer (10 s and 60 s
    /// unless a test changes them).
    limits: Arc<Mutex<(u64, u64)>>,
    /// Connections open now (accepted, not yet closed by the client).
    open: Arc<AtomicUsize>,
    /// Every shard's handshake says shard 0 (addresses that lead to the wrong shard).
    all_say_shard_0: Arc<std::sync::atomic::AtomicBool>,
}

/// Counts a fake's connection as open while it lives.
struct OpenConnection(Arc<AtomicUsize>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fake {
    async fn start(shards: u32, handler: Handler) -> Fake {
        let mut listeners = Vec::new();
        for _ in 0..shards {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let shard_addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        let log = Arc::new(Mutex::new(Vec::new()));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let broker_id = Arc::new(AtomicU32::new(7));
        let limits = Arc::new(Mutex::new((10_000, 60_000)));
        let open = Arc::new(AtomicUsize::new(0));
        let all_say_shard_0 = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for (shard, listener) in listeners.into_iter().enumerate() {
            let (open, all_say_shard_0) = (open.clone(), all_say_shard_0.clone());
            let (handler, log, handshakes, shard_addrs, broker_id, limits) = (
                handler.clone(),
                log.clone(),
                handshakes.clone(),
                shard_addrs.clone(),
                broker_id.clone(),
                limits.clone(),
            );
            tokio::spawn(async move {
                let mut conn_no = 0;
                while let Ok((stream, _)) = listener.accept().await {
                    let ctx = Ctx {
                        shard: shard as u32,
                        conn_no,
                    };
                    conn_no += 1;
                    let (handler, log, handshakes, shard_addrs, broker_id, limits) = (
                        handler.clone(),
                        log.clone(),
                        handshakes.clone(),
                        shard_addrs.clone(),
                        broker_id.clone(),
                        limits.clone(),
                    );
                    open.fetch_add(1, Ordering::SeqCst);
                    let counted = OpenConnection(open.clone());
                    let all_say_shard_0 = all_say_shard_0.clone();
                    tokio::spawn(async move {
                        let _counted = counted;
                        let (mut input, output) = stream.into_split();
                        let output = Arc::new(tokio::sync::Mutex::new(output));
                        let mut buf = Vec::new();
                        let mut chunk = vec![0u8; 64 * 1024];
                        loop {
                            let n = match input.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            buf.extend_from_slice(&chunk[..n]);
                            while let Some(frame) = FrameDecoder::default().decode(&buf).unwrap() {
                                let (id, len) = (frame.request_id(), frame.frame_len());
                                let request = frame.decode_request().unwrap();
                                buf.drain(..len);
                                let outs = match request {
                                    Request::Handshake2(_) => {
                                        handshakes.fetch_add(1, Ordering::SeqCst);
                                        let ok = HandshakeOk {
                                            protocol_version: PROTOCOL_VERSION as u32,
                                            shard_count: shard_addrs.len() as u32,
                                            shard_id: if all_say_shard_0.load(Ordering::SeqCst) {
                                                0
                                            } else {
                                                ctx.shard
                                            },
                                            shard_addrs: shard_addrs.clone(),
                                            broker_id: broker_id.load(Ordering::SeqCst),
                                        };
                                        let limits = *limits.lock().unwrap();
                                        let reply = handshake_ok2_with(ok, limits);
                                        vec![Out::Frame(answer(id, &reply))]
                                    }
                                    request => {
                                        log.lock().unwrap().push((ctx.shard, request.clone()));
                                        handler(&ctx, id, request)
                                    }
                                };
                                let mut stall = None;
                                for out in outs {
                                    if let Out::Stall(pause) = out {
                                        stall = Some(pause);
                                    } else if !write(&output, out).await {
                                        return;
                                    }
                                }
                                if let Some(pause) = stall {
                                    tokio::time::sleep(pause).await;
                                }
                            }
                        }
                    });
                }
            });
        }
        Fake {
            addrs,
            log,
            handshakes,
            broker_id,
            limits,
            open,
            all_say_shard_0,
        }
    }

    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(self.addrs[0].to_string());
        config.request_timeout_ms = 2_000;
        config.reconnect_backoff_min_ms = 10;
        config
    }

    fn requests(&self) -> Vec<(u32, Request)> {
        self.log.lock().unwrap().clone()
    }

    /// Waits (10 s at most) until a single send of `body` has arrived.
    async fn received_send(&self, body: &[u8]) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !(self.requests().iter())
            .any(|(_, r)| matches!(r, Request::SendMessage(m) if m.body == body))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the send of {body:?} never arrived"
            );
            tokio::task::yield_now().await;
        }
    }

    fn sends(&self) -> Vec<(u32, i32)> {
        self.requests()
            .into_iter()
            .filter_map(|(shard, r)| match r {
                Request::SendMessage(m) => Some((shard, m.queue_id)),
                _ => None,
            })
            .collect()
    }
}

/// Returns false when the connection is to be closed.
async fn write(output: &Arc<tokio::sync::Mutex<OwnedWriteHalf>>, out: Out) -> bool {
    match out {
        Out::Frame(bytes) => {
            let _ = output.lock().await.write_all(&bytes).await;
            true
        }
        Out::Later(pause, bytes) => {
            let output = output.clone();
            tokio::spawn(async move {
                tokio::time::sleep(pause).await;
                let _ = output.lock().await.write_all(&bytes).await;
            });
            true
        }
        Out::Close => {
            let _ = output.lock().await.shutdown().await;
            false
        }
        Out::Stall(_) => true,
    }
}

fn answer(id: u64, response: &Response<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_response(response, id, &mut out).unwrap();
    out
}

fn error(id: u64, code: ErrorCode, message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_error(id, code, message, &mut out).unwrap();
    out
}

fn topic_info(topic: &str, queues: u32) -> TopicInfo {
    TopicInfo {
        topic: topic.to_owned(),
        queues: (0..queues)
            .map(|queue_id| QueueInfo {
                queue_id,
                min_offset: 0,
                max_offset: 0,
            })
            .collect(),
    }
}

fn send_result(queue_id: u32, queue_offset: u64) -> Response<'static> {
    Response::SendResult(SendResult {
        msg_id: "00000007000000000000000000000000".into(),
        queue_id,
        queue_offset,
        physical_offset: 0,
        transaction_id: 0,
    })
}

/// The answer to a `DescribeTopic` of `topic`: `queues` queues.
fn described(id: u64, topic: &str, queues: u32) -> Vec<Out> {
    vec![Out::Frame(answer(
        id,
        &Response::TopicInfo(topic_info(topic, queues)),
    ))]
}

/// Answers DescribeTopic with `queues` queues and every send with its queue and offset 0.
fn simple_handler(queues: u32) -> Handler {
    Arc::new(move |_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, queues),
        Request::SendMessage(m) => vec![Out::Frame(answer(id, &send_result(m.queue_id as u32, 0)))],
        _ => vec![Out::Frame(error(id, ErrorCode::Internal, "not faked"))],
    })
}

fn no_retries() -> ProducerOptions {
    ProducerOptions {
        retries: 0,
        ..ProducerOptions::default()
    }
}

#[tokio::test]
async fn an_oversize_body_is_refused_before_any_io() {
    let fake = Fake::start(1, simple_handler(4)).await;
    let producer = Producer::connect(fake.config()).await.unwrap();
    let body = vec![0u8; BODY_BYTES_MAX + 1];
    let err = producer
        .send("fresh-topic", OutgoingMessage::new(body.clone()))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClientError::BodyTooLarge {
            len: BODY_BYTES_MAX + 1,
            max: BODY_BYTES_MAX
        }
    );
    let batch = vec![OutgoingMessage::new("ok"), OutgoingMessage::new(body)];
    let err = producer.send_batch("fresh-topic", batch).await.unwrap_err();
    assert!(matches!(err, ClientError::BodyTooLarge { .. }), "{err:?}");
    let err = producer
        .send_oneway(
            "fresh-topic",
            OutgoingMessage::new(vec![1u8; BODY_BYTES_MAX + 1]),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::BodyTooLarge { .. }), "{err:?}");
    // Not even the topic was described.
    assert!(fake.requests().is_empty(), "{:?}", fake.requests());
}

fn record(topic: &str, queue_id: u32, queue_offset: u64, tag: &str, body: &[u8]) -> Vec<u8> {
    let mut props = PropertiesBuilder::new();
    props
        .put(prop::TAGS, tag)
        .unwrap()
        .put(prop::KEYS, "k1 k2")
        .unwrap();
    RecordDraft {
        topic,
        queue_id,
        flag: 3,
        sys_flag: 0,
        born_timestamp_ms: 1_000,
        born_host: "127.0.0.1:9".parse().unwrap(),
        reconsume_times: 1,
        transaction_offset: 0,
        properties: props.as_bytes(),
        body,
    }
    .encode(Placement {
        queue_offset,
        physical_offset: 4096 * (queue_offset + 1),
        store_timestamp_ms: 2_000,
    })
}

#[tokio::test]
async fn pull_answers_are_read_in_place_and_tags_rechecked() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::Pull(p) => {
            let mut raw = Vec::new();
            for (i, tag) in ["A", "B", "A"].iter().enumerate() {
                let offset = p.offset + i as u64;
                raw.extend(record(
                    &p.topic,
                    p.queue_id,
                    offset,
                    tag,
                    format!("m{offset}").as_bytes(),
                ));
            }
            let meta = crate::protocol::PullResult {
                status: PullStatus::Found,
                next_offset: p.offset + 3,
                min_offset: 0,
                max_offset: 100,
                count: 3,
                incarnation: 7,
            };
            vec![Out::Frame(answer(
                id,
                &Response::Pull(PullResponse::new(meta, &raw)),
            ))]
        }
        _ => Vec::new(),
    });
    let fake = Fake::start(2, handler).await;
    let client = Client::connect(fake.config()).await.unwrap();
    let wait = Duration::from_millis(10);
    let all = client.pull("t", 5, 10, 32, wait, &[]).await.unwrap();
    assert_eq!(all.status, PullStatus::Found);
    assert_eq!(
        (all.next_offset, all.min_offset, all.max_offset),
        (13, 0, 100)
    );
    assert_eq!(all.messages.len(), 3);
    // One buffer: each record starts where the previous one ends.
    for pair in all.messages.windows(2) {
        let end = pair[0].as_bytes().as_ptr() as usize + pair[0].as_bytes().len();
        assert_eq!(end, pair[1].as_bytes().as_ptr() as usize);
    }
    let m = &all.messages[0];
    assert_eq!((m.topic(), m.queue_id(), m.queue_offset()), ("t", 5, 10));
    assert_eq!(m.body(), b"m10");
    assert_eq!(m.tags(), Some("A"));
    assert_eq!(m.keys().collect::<Vec<_>>(), vec!["k1", "k2"]);
    assert_eq!(m.property(prop::TAGS), Some("A"));
    assert_eq!((m.flag(), m.reconsume_times()), (3, 1));
    assert_eq!(
        (m.born_timestamp_ms(), m.store_timestamp_ms()),
        (1_000, 2_000)
    );
    let id = m.msg_id();
    assert_eq!(
        (id.broker_id, id.store_id, id.physical_offset),
        (7, owner("t", 5, 2), 4096 * 11)
    );

    let filtered = client.pull("t", 5, 10, 32, wait, &["A"]).await.unwrap();
    let offsets: Vec<u64> = filtered.messages.iter().map(|m| m.queue_offset()).collect();
    assert_eq!(offsets, vec![10, 12]);
    assert_eq!(filtered.next_offset, 13);
    let pulls: Vec<Vec<u64>> = fake
        .requests()
        .into_iter()
        .filter_map(|(_, r)| match r {
            Request::Pull(p) => Some(p.tag_hashes),
            _ => None,
        })
        .collect();
    assert_eq!(pulls, vec![vec![], vec![tag_hash("A")]]);
    // "*" means every tag.
    assert_eq!(
        client
            .pull("t", 5, 10, 32, wait, &["*"])
            .await
            .unwrap()
            .messages
            .len(),
        3
    );
}

#[tokio::test]
async fn error_frames_become_typed_errors() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::QueryOffset(_) => vec![Out::Frame(error(id, ErrorCode::OffsetNotFound, "none"))],
        Request::GetMinOffset(_) => vec![Out::Frame(error(id, ErrorCode::TopicNotFound, "no t"))],
        Request::CommitOffset(_) => vec![Out::Frame(answer(
            id,
            &Response::Empty(crate::protocol::Empty {}),
        ))],
        _ => Vec::new(),
    });
    let fake = Fake::start(1, handler).await;
    let client = Client::connect(fake.config()).await.unwrap();
    assert_eq!(client.query_offset("g", "t", 0).await.unwrap(), None);
    client.commit_offset("g", "t", 0, 5).await.unwrap();
    let err = client.min_offset("t", 0).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::TopicNotFound));
    assert!(!err.is_retriable());
    assert_eq!(err.to_string(), "broker error TopicNotFound(10): no t");
    let err = client.message_by_id("not an id").await.unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)), "{err:?}");
}

/// A pushed frame of a kind from a newer protocol: kind 2999, flagged push, empty meta.
fn unknown_push_frame() -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&32u32.to_le_bytes());
    frame.extend_from_slice(&[FRAME_MAGIC, PROTOCOL_VERSION]);
    frame.extend_from_slice(&2999u16.to_le_bytes());
    frame.extend_from_slice(&0u64.to_le_bytes());
    frame.extend_from_slice(&8u32.to_le_bytes());
    frame.extend_from_slice(&8u32.to_le_bytes());
    frame.extend_from_slice(&[0u8; 8]);
    frame
}

#[tokio::test]
async fn pushed_frames_of_unknown_kinds_are_skipped() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::Heartbeat(_) => vec![
            Out::Frame(unknown_push_frame()),
            Out::Frame(answer(id, &Response::Empty(crate::protocol::Empty {}))),
        ],
        _ => Vec::new(),
    });
    let fake = Fake::start(1, handler).await;
    let client = Client::connect(fake.config()).await.unwrap();
    client.heartbeat().await.unwrap();
    client.heartbeat().await.unwrap();
    assert_eq!(fake.handshakes.load(Ordering::SeqCst), 1, "no reconnect");
}

fn handshake_ok2(ok: HandshakeOk) -> Response<'static> {
    handshake_ok2_with(ok, (10_000, 60_000))
}

/// A handshake answer with the broker's default frame limit and the session timeout and
/// lock expiry (ms) given.
fn handshake_ok2_with(ok: HandshakeOk, (session_ms, lock_ms): (u64, u64)) -> Response<'static> {
    Response::HandshakeOk2(crate::protocol::HandshakeOk2 {
        ok,
        limits: crate::protocol::BrokerLimits {
            frame_bytes_max: crate::protocol::FRAME_BYTES_MAX_DEFAULT,
            session_timeout_ms: session_ms,
            lock_expiry_ms: lock_ms,
        },
    })
}

fn empty_answer(id: u64) -> Out {
    Out::Frame(answer(id, &Response::Empty(crate::protocol::Empty {})))
}

/// What a consumer asks of a topic of `queues` queues, each holding 5 messages and no
/// committed offset, none coming: its queues, their ends, and pulls answered after 20 ms
/// with no new message. Any other request is answered empty.
fn idle_topic(id: u64, request: Request, topic: &str, queues: u32) -> Vec<Out> {
    match request {
        Request::DescribeTopic(_) => vec![Out::Frame(answer(
            id,
            &Response::TopicInfo(topic_info(topic, queues)),
        ))],
        Request::QueryOffset(_) => vec![Out::Frame(error(id, ErrorCode::OffsetNotFound, "none"))],
        Request::GetMaxOffset(_) => vec![Out::Frame(answer(
            id,
            &Response::Offset(Offset {
                offset: 5,
                incarnation: 1,
            }),
        ))],
        Request::Pull(p) => {
            let meta = crate::protocol::PullResult {
                status: PullStatus::NoNewMessage,
                next_offset: p.offset,
                min_offset: 0,
                max_offset: p.offset,
                count: 0,
                incarnation: 7,
            };
            vec![Out::Later(
                Duration::from_millis(20),
                answer(id, &Response::Pull(PullResponse::new(meta, &[]))),
            )]
        }
        _ => vec![empty_answer(id)],
    }
}

fn assignment(generation: u64, topic: &str, queues: &[u32]) -> Response<'static> {
    Response::Assignment(crate::protocol::Assignment {
        generation,
        offsets_epoch: 0,
        topics: vec![crate::protocol::TopicAssignment {
            topic: topic.to_owned(),
            queues: queues.to_vec(),
        }],
    })
}

#[tokio::test]
async fn group_requests_carry_this_client_and_answers_are_typed() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::GroupHeartbeat(_) | Request::QueryAssignment(_) => {
            vec![Out::Frame(answer(id, &assignment(3, "t", &[1, 0])))]
        }
        Request::LockBatch(_) => vec![Out::Frame(answer(
            id,
            &Response::Locked(crate::protocol::Locked {
                queues: vec![2, 0, 2],
            }),
        ))],
        Request::ConsumerProgress(p) => vec![Out::Frame(answer(
            id,
            &Response::Progress(crate::protocol::Progress {
                group: p.group,
                topic: p.topic,
                queues: vec![
                    crate::protocol::QueueProgress {
                        queue_id: 0,
                        committed_offset: -1,
                        max_offset: 4,
                        lag: 4,
                    },
                    crate::protocol::QueueProgress {
                        queue_id: 1,
                        committed_offset: 3,
                        max_offset: 4,
                        lag: 1,
                    },
                ],
            }),
        ))],
        Request::QueryOffset(_) => vec![Out::Frame(error(id, ErrorCode::GroupNotFound, "no"))],
        _ => vec![empty_answer(id)],
    });
    let fake = Fake::start(2, handler).await;
    let client = Client::connect(fake.config()).await.unwrap();
    let me = client.config().client_id.clone();
    let spec = MemberSpec {
        subscriptions: vec![("t".into(), "A || B".into())],
        consume_mode: ConsumeMode::Orderly,
        message_model: MessageModel::Broadcasting,
        strategy: AllocateStrategy::Circle,
    };
    let got = client.group_heartbeat("g", &spec).await.unwrap();
    assert_eq!(
        (got.generation, got.topics[0].queues.clone()),
        (3, vec![1, 0])
    );
    assert_eq!(client.query_assignment("g").await.unwrap().generation, 3);
    assert_eq!(client.lock_batch("g", "t", &[0, 2]).await.unwrap(), [0, 2]);
    client.unlock_batch("g", "t", &[0]).await.unwrap();
    client.unregister("g").await.unwrap();
    client.reset_offset_by_time("g", "t", 7).await.unwrap();
    let lag = client.consumer_progress("g", "t").await.unwrap();
    assert_eq!(lag[0].committed_offset, None);
    assert_eq!(lag[1].committed_offset, Some(3));
    assert!(client.group_heartbeat("", &spec).await.is_err());
    assert!(client
        .lock_batch("g", "t", &vec![0; LOCK_BATCH_QUEUES_MAX + 1])
        .await
        .is_err());

    let requests = fake.requests();
    // Membership and locks go to the bootstrap connection (shard 0 here), where the
    // broker ties the member to its connection.
    assert!(
        requests.iter().all(|(shard, _)| *shard == 0),
        "{requests:?}"
    );
    match &requests[0].1 {
        Request::GroupHeartbeat(h) => {
            assert_eq!((h.group.as_str(), h.client_id.as_str()), ("g", me.as_str()));
            assert_eq!(h.subscriptions[0].expression, "A || B");
            assert_eq!(h.consume_mode, crate::protocol::CONSUME_MODE_ORDERLY);
            assert_eq!(h.message_model, crate::protocol::MESSAGE_MODEL_BROADCASTING);
            assert_eq!(h.strategy, "circle");
        }
        other => panic!("{other:?}"),
    }
    for (_, r) in &requests[1..] {
        let client_id = match r {
            Request::QueryAssignment(q) => &q.client_id,
            Request::LockBatch(l) => &l.client_id,
            Request::UnlockBatch(u) => &u.client_id,
            Request::Unregister(u) => &u.client_id,
            Request::ResetOffset(_) | Request::ConsumerProgress(_) => continue,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(client_id, &me);
    }
}

#[tokio::test]
async fn the_bootstrap_session_changes_with_the_connection() {
    // The broker closes the first connection at its first request.
    let handler: Handler = Arc::new(|ctx, id, _request| {
        if ctx.shard == 0 && ctx.conn_no == 0 {
            vec![Out::Close]
        } else {
            vec![empty_answer(id)]
        }
    });
    let fake = Fake::start(1, handler).await;
    let client = Client::connect(fake.config()).await.unwrap();
    let first = client.bootstrap_session();
    assert!(first.is_some());
    assert!(client.unregister("g").await.is_err());
    assert_eq!(
        client.bootstrap_session(),
        None,
        "a broken connection has no session"
    );
    client.unregister("g").await.unwrap();
    let second = client.bootstrap_session();
    assert!(
        second.is_some() && second != first,
        "{first:?} then {second:?}"
    );
}

/// A push consumer against the fake: the first heartbeat gives it queue 0 and the broker
/// then pushes a rebalance notification; the consumer asks for its assignment (queues 0
/// and 1), starts both from the queue's end (no committed offset, `LastOffset`), and on
/// shutdown commits both and unregisters, last.
#[tokio::test]
async fn a_push_consumer_follows_rebalance_notifications_and_leaves_cleanly() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::GroupHeartbeat(h) => {
            let mut push = Vec::new();
            crate::protocol::encode_frame(
                0,
                crate::protocol::Flags::NONE,
                &crate::protocol::RebalanceNotify {
                    group: h.group,
                    generation: 2,
                },
                &[],
                &mut push,
            )
            .unwrap();
            vec![
                Out::Frame(answer(id, &assignment(1, "t", &[0]))),
                Out::Frame(push),
            ]
        }
        Request::QueryAssignment(_) => vec![Out::Frame(answer(id, &assignment(2, "t", &[0, 1])))],
        // Both queues exist when the consumer starts: they start at their end.
        other => idle_topic(id, other, "t", 2),
    });
    let fake = Fake::start(2, handler).await;
    let consumer = PushConsumer::new(fake.config(), "g", PushConsumerOptions::default()).unwrap();
    consumer.subscribe("t", "*").unwrap();
    consumer
        .register_concurrent(|_| ConsumeStatus::Success)
        .unwrap();
    consumer.start().await.unwrap();
    let both = vec![MessageQueue::new("t", 0), MessageQueue::new("t", 1)];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while consumer.consuming_queues() != both {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            consumer.consuming_queues()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(consumer.assigned_queues(), both);
    consumer.shutdown().await.unwrap();

    let requests = fake.requests();
    let pulls: BTreeSet<(u32, u64)> = requests
        .iter()
        .filter_map(|(_, r)| match r {
            Request::Pull(p) => Some((p.queue_id, p.offset)),
            _ => None,
        })
        .collect();
    assert_eq!(pulls, BTreeSet::from([(0, 5), (1, 5)]));
    let commits: BTreeSet<(u32, u64)> = requests
        .iter()
        .filter_map(|(_, r)| match r {
            Request::CommitOffset(c) => Some((c.queue_id, c.offset)),
            _ => None,
        })
        .collect();
    assert_eq!(commits, BTreeSet::from([(0, 5), (1, 5)]));
    assert!(
        matches!(requests.last(), Some((0, Request::Unregister(u))) if u.group == "g"),
        "{:?}",
        requests.last()
    );
}
