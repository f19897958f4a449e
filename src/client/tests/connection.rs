//! Connection tests against the fake broker (see the parent module): pipelined answers
//! matched by request id, timeouts, broken and refused connections, shards that answer
//! for another broker or another shard, handshakes refused, keepalive probes.

use super::*;

#[tokio::test]
async fn pipelined_requests_are_matched_by_request_id() {
    const N: usize = 64;
    // Holds every send until all N are in flight, then answers them in reverse order: only
    // pipelining can finish this, and only matching by request id gets the answers right.
    let held: Arc<Mutex<Vec<(u64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let handler: Handler = Arc::new(move |_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 4),
        Request::SendMessage(m) => {
            let n: u64 = std::str::from_utf8(&m.body).unwrap().parse().unwrap();
            let mut held = held.lock().unwrap();
            held.push((id, n));
            if held.len() < N {
                return Vec::new();
            }
            held.drain(..)
                .rev()
                .map(|(id, n)| Out::Frame(answer(id, &send_result(0, n))))
                .collect()
        }
        _ => Vec::new(),
    });
    let fake = Fake::start(1, handler).await;
    let producer = Producer::connect(fake.config()).await.unwrap();
    let sends: Vec<_> = (0..N)
        .map(|n| tokio::spawn(producer.send_async("t", OutgoingMessage::new(n.to_string()))))
        .collect();
    for (n, send) in sends.into_iter().enumerate() {
        let result = send.await.unwrap().unwrap();
        assert_eq!(result.queue_offset, n as u64);
    }
}

#[tokio::test]
async fn a_timeout_is_typed_and_the_late_answer_is_ignored() {
    let handler: Handler = Arc::new(|_ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 2),
        Request::SendMessage(_) => vec![Out::Later(
            Duration::from_millis(400),
            answer(id, &send_result(0, 0)),
        )],
        _ => Vec::new(),
    });
    let fake = Fake::start(1, handler).await;
    let mut config = fake.config();
    config.request_timeout_ms = 100;
    let producer = Producer::connect_with(config, no_retries()).await.unwrap();
    let err = producer
        .send("t", OutgoingMessage::new("slow"))
        .await
        .unwrap_err();
    assert_eq!(err, ClientError::Timeout { timeout_ms: 100 });
    assert!(err.is_retriable());
    // The late answer arrives on a connection nobody waits on: it is dropped, and the
    // connection keeps working.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let info = producer.client().describe_topic("t").await.unwrap();
    assert_eq!(info.queues.len(), 2);
    assert_eq!(fake.handshakes.load(Ordering::SeqCst), 2, "no reconnect");
}

/// A shard connection opened again while the bootstrap connection stays up, to a shard
/// that answers for another broker now (another broker on its address): the handshake is
/// checked against the topology routed with, the topology is taken from it, and the
/// request fails (retriable) to be routed again; the next one goes.
#[tokio::test]
async fn a_shard_answering_for_another_broker_refreshes_the_routes() {
    use crate::client::session::Route;
    use crate::protocol::GetMinOffset;
    // Shard 1's first connection closes on its first request; later ones answer.
    let handler: Handler = Arc::new(|ctx, id, _| match (ctx.shard, ctx.conn_no) {
        (1, 0) => vec![Out::Close],
        _ => vec![empty_answer(id)],
    });
    let fake = Fake::start(2, handler).await;
    let client = Client::connect(fake.config()).await.unwrap();
    assert_eq!(client.broker_info().broker_id, 7);
    let ask = || GetMinOffset {
        topic: "t".into(),
        queue_id: 0,
    };
    let err = client.call(Route::Shard(1), &ask()).await.unwrap_err();
    assert!(matches!(err, ClientError::Connection(_)), "{err:?}");
    fake.broker_id.store(8, Ordering::SeqCst);
    let err = client.call(Route::Shard(1), &ask()).await.unwrap_err();
    match &err {
        ClientError::Connection(said) => assert!(said.contains("the broker changed"), "{said}"),
        other => panic!("{other:?}"),
    }
    assert!(err.is_retriable());
    assert_eq!(client.broker_info().broker_id, 8);
    client.call(Route::Shard(1), &ask()).await.unwrap();
}

/// A shard address that leads to another shard of the same broker (its handshake names
/// another shard while the broker's addresses are unchanged) is a failed attempt, backed
/// off: before, every request connected and handshook again at once.
#[tokio::test]
async fn a_shard_address_leading_to_another_shard_backs_off() {
    use crate::client::session::Route;
    use crate::protocol::GetMinOffset;
    let fake = Fake::start(2, Arc::new(|_, id, _| vec![empty_answer(id)])).await;
    let mut config = fake.config();
    config.reconnect_backoff_min_ms = 50;
    let client = Client::connect(config).await.unwrap();
    fake.all_say_shard_0.store(true, Ordering::SeqCst);
    let ask = || GetMinOffset {
        topic: "t".into(),
        queue_id: 0,
    };
    let before = fake.handshakes.load(Ordering::SeqCst);
    let started = std::time::Instant::now();
    for _ in 0..5 {
        let err = client.call(Route::Shard(1), &ask()).await.unwrap_err();
        match &err {
            ClientError::Connection(said) => {
                assert!(said.contains("leads to another shard"), "{said}")
            }
            other => panic!("{other:?}"),
        }
    }
    // Each attempt after the first waited its backoff: 50 + 100 + 200 + 400 ms.
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(700), "{waited:?}");
    assert_eq!(fake.handshakes.load(Ordering::SeqCst) - before, 5);
}

#[tokio::test]
async fn a_broken_connection_fails_its_requests_and_the_next_request_reconnects() {
    // The first connection to the shard closes on its first send; later ones answer.
    let handler: Handler = Arc::new(|ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 2),
        Request::SendMessage(m) if ctx.conn_no == 1 => {
            let _ = m;
            vec![Out::Close]
        }
        Request::SendMessage(m) => vec![Out::Frame(answer(id, &send_result(m.queue_id as u32, 5)))],
        _ => Vec::new(),
    });
    let fake = Fake::start(1, handler).await;
    // Connection 0 is the bootstrap, connection 1 the shard's: the one that breaks.
    let producer = Producer::connect_with(fake.config(), no_retries())
        .await
        .unwrap();
    let err = producer
        .send("t", OutgoingMessage::new("a"))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Connection(_)), "{err:?}");
    assert!(err.is_retriable());
    let result = producer.send("t", OutgoingMessage::new("b")).await.unwrap();
    assert_eq!(result.queue_offset, 5);
    assert_eq!(fake.handshakes.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn retries_carry_a_send_over_a_broken_connection() {
    let handler: Handler = Arc::new(|ctx, id, request| match request {
        Request::DescribeTopic(d) => described(id, &d.topic, 2),
        Request::SendMessage(_) if ctx.conn_no == 1 => vec![Out::Close],
        Request::SendMessage(m) => vec![Out::Frame(answer(id, &send_result(m.queue_id as u32, 9)))],
        _ => Vec::new(),
    });
    let fake = Fake::start(1, handler).await;
    let producer = Producer::connect(fake.config()).await.unwrap();
    let result = producer.send("t", OutgoingMessage::new("a")).await.unwrap();
    assert_eq!(result.queue_offset, 9);
    // Round-robin moved to the other queue for the retry.
    let sends = fake.sends();
    assert_eq!(sends.len(), 2);
    assert_ne!(sends[0].1, sends[1].1);
}

#[tokio::test]
async fn a_refused_connect_is_a_retriable_connection_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = Client::connect(ClientConfig::new(addr.to_string()))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Connection(_)), "{err:?}");
    assert!(err.is_retriable());
}

/// A handshake answer the client cannot work with is refused, not retried: a shard count
/// its addresses do not match, or session and lock timings no broker announces (a session
/// under a second, locks that lapse no later than the session), which would have the
/// consumer heartbeat every millisecond and never trust an orderly lock.
#[tokio::test]
async fn a_bad_handshake_is_refused() {
    let good = |addr: std::net::SocketAddr| HandshakeOk {
        protocol_version: PROTOCOL_VERSION as u32,
        shard_count: 1,
        shard_id: 0,
        shard_addrs: vec![addr.to_string()],
        broker_id: 1,
    };
    refused_at_handshake(move |addr| {
        handshake_ok2(HandshakeOk {
            shard_count: 2,
            ..good(addr)
        })
    })
    .await;
    for timings in [(0, 0), (999, 60_000), (10_000, 10_000)] {
        refused_at_handshake(move |addr| handshake_ok2_with(good(addr), timings)).await;
    }
}

/// Connects to a listener that answers the handshake with `reply`, and expects the
/// connection refused as `BadHandshake`.
async fn refused_at_handshake(
    reply: impl FnOnce(std::net::SocketAddr) -> Response<'static> + Send + 'static,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = stream.read(&mut buf).await.unwrap();
        let frame = FrameDecoder::default().decode(&buf[..n]).unwrap().unwrap();
        let reply = answer(frame.request_id(), &reply(addr));
        stream.write_all(&reply).await.unwrap();
        // Kept open past the client's verdict.
        let _ = stream.read(&mut buf).await;
    });
    let err = Client::connect(ClientConfig::new(addr.to_string()))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::BadHandshake(_)), "{err:?}");
    assert!(!err.is_retriable());
}

/// A handshake answer with the broker's default limits.
/// The client's connections probe a silent broker (TCP keepalive): a broker whose host
/// vanished is found within minutes, not after the kernel's retransmissions give up.
#[tokio::test]
async fn connections_to_the_broker_probe_a_silent_peer() {
    let fake = Fake::start(1, simple_handler(1)).await;
    let client = Client::connect(fake.config()).await.unwrap();
    client.describe_topic("t").await.unwrap();
    // The port of the IPv4 peer of descriptor `fd`, if it is a connected socket.
    let peer_port = |fd: i32| {
        // SAFETY: getpeername writes at most `len` bytes into a zeroed local of that size.
        let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let rc =
            unsafe { libc::getpeername(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len) };
        (rc == 0 && i32::from(addr.sin_family) == libc::AF_INET)
            .then(|| u16::from_be(addr.sin_port))
    };
    let mut probed = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let Ok(fd) = entry.unwrap().file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if peer_port(fd) == Some(fake.addrs[0].port()) {
            let (on, .., user_timeout) = crate::protocol::keepalive::keepalive_of(fd).unwrap();
            probed.push((on, user_timeout));
        }
    }
    assert!(!probed.is_empty(), "the client's connection was not found");
    let want = (1, crate::protocol::keepalive::USER_TIMEOUT_MS);
    assert!(probed.iter().all(|&p| p == want), "{probed:?}");
}
