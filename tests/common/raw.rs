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
    let mut out = Vec::new();
    encode_request(&request, 9, &mut out).unwrap();
    conn.write_all(&out).unwrap();
    read_answer(&mut conn)
}

pub fn read_answer(conn: &mut TcpStream) -> Response<'static> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        if let Some(frame) = FrameDecoder::new(
            ringmq::protocol::FrameLimits::new(ringmq::protocol::FRAME_BYTES_CEILING).unwrap(),
        )
        .decode(&buf)
        .unwrap()
        {
            let len = frame.frame_len();
            let owned: &'static [u8] = Box::leak(buf[..len].to_vec().into_boxed_slice());
            let frame = FrameDecoder::new(
                ringmq::protocol::FrameLimits::new(ringmq::protocol::FRAME_BYTES_CEILING).unwrap(),
            )
            .decode(owned)
            .unwrap()
            .unwrap();
            return frame.decode_response().unwrap();
        }
        let n = conn.read(&mut chunk).unwrap();
        assert!(n > 0, "the broker closed the connection without an answer");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The error code and message of an error answer.
pub fn error_of(answer: Response<'_>) -> (ErrorCode, String) {
    match answer {
        Response::Error(e) => (e.error_code().unwrap(), e.message),
        other => panic!("not an error: {other:?}"),
    }
}
