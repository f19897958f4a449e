//! Requests written as raw frames on a plain socket (past the client's own checks), and
//! their answers.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use ringmq::protocol::{encode_request, ErrorCode, FrameDecoder, Request, Response};

/// Sends one request on a new connection and returns the answer.
pub fn call(addr: &str, request: Request) -> Response<'static> {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write(&mut conn, 9, request);
    read_answer(&mut conn)
}

/// A single send of `body` to queue `queue_id` of `topic`, acknowledged once written.
pub fn send_to(
    topic: &str,
    queue_id: i32,
    body: impl AsRef<[u8]>,
) -> ringmq::protocol::SendMessage {
    ringmq::protocol::SendMessage {
        topic: topic.to_owned(),
        queue_id,
        flag: 0,
        properties: Vec::new(),
        body: body.as_ref().to_vec(),
        born_timestamp_ms: 0,
        wait_durable: false,
    }
}

/// Writes `request` with `request_id` on `conn`, without waiting for its answer.
pub fn write(conn: &mut TcpStream, request_id: u64, request: Request) {
    let mut out = Vec::new();
    encode_request(&request, request_id, &mut out).unwrap();
    conn.write_all(&out).unwrap();
}

pub fn read_answer(conn: &mut TcpStream) -> Response<'static> {
    read_answers(conn, 1).pop().unwrap().1
}

/// The next `n` answers on `conn`, each with its request id, in the order they came
/// (notifications the broker pushes, such as a group's rebalance, passed over).
pub fn read_answers(conn: &mut TcpStream, n: usize) -> Vec<(u64, Response<'static>)> {
    let decoder = || {
        FrameDecoder::new(
            ringmq::protocol::FrameLimits::new(ringmq::protocol::FRAME_BYTES_CEILING).unwrap(),
        )
    };
    let mut answers = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    while answers.len() < n {
        if let Some(frame) = decoder().decode(&buf).unwrap() {
            let len = frame.frame_len();
            let owned: &'static [u8] = Box::leak(buf[..len].to_vec().into_boxed_slice());
            buf.drain(..len);
            let frame = decoder().decode(owned).unwrap().unwrap();
            if !frame.header().flags().is_push() {
                answers.push((frame.request_id(), frame.decode_response().unwrap()));
            }
            continue;
        }
        let read = conn.read(&mut chunk).unwrap();
        assert!(
            read > 0,
            "the broker closed the connection without an answer"
        );
        buf.extend_from_slice(&chunk[..read]);
    }
    answers
}

/// The error code and message of an error answer.
pub fn error_of(answer: Response<'_>) -> (ErrorCode, String) {
    match answer {
        Response::Error(e) => (e.error_code().unwrap(), e.message),
        other => panic!("not an error: {other:?}"),
    }
}

/// Writes `request` on `conn` and reads its answer; `None` if the connection ends first (as a
/// refused one may, right after its refusal) or nothing comes within 10 s.
pub fn answer_on(conn: &mut TcpStream, request: Request) -> Option<Response<'static>> {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut out = Vec::new();
    encode_request(&request, 1, &mut out).unwrap();
    // A refused connection may be closed before the request is written: its answer (the
    // refusal) is still read.
    let _ = conn.write_all(&out);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(f) = FrameDecoder::default().decode(&buf).unwrap() {
            let owned: &'static [u8] = Box::leak(buf[..f.frame_len()].to_vec().into_boxed_slice());
            let frame = FrameDecoder::default().decode(owned).unwrap().unwrap();
            return Some(frame.decode_response().unwrap());
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A new connection the broker serves (its heartbeat answered), polling every 20 ms for up
/// to 10 s: past `--connections-max` one is refused (`TooManyConnections`, or closed at
/// once) until a place frees, and nothing else tells a client when.
pub fn served_connection(addr: &str) -> TcpStream {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = TcpStream::connect(addr).unwrap();
        let hb = ringmq::protocol::Heartbeat {
            client_id: "served".into(),
        };
        match answer_on(&mut conn, hb.into()) {
            Some(Response::Empty(_)) => return conn,
            Some(Response::Error(e)) => {
                assert_eq!(e.error_code(), Some(ErrorCode::TooManyConnections), "{e}")
            }
            other => assert!(other.is_none(), "{other:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no connection served within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bytes of answers waiting in `conn`'s receive buffer, not read yet (FIONREAD).
pub fn queued_bytes(conn: &TcpStream) -> usize {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int, on a socket the caller holds open.
    unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(conn),
            libc::FIONREAD,
            &mut queued,
        );
    }
    usize::try_from(queued).unwrap_or(0)
}
