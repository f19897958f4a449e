use super::*;
use crate::protocol::messages::{Heartbeat, PullResult, PullStatus};

fn heartbeat_frame(request_id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let hb = Heartbeat {
        client_id: "client-1".into(),
    };
    let len = encode_frame(request_id, Flags::NONE, &hb, &[], &mut out).unwrap();
    assert_eq!(len, out.len());
    out
}

fn set_u16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn set_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Runs the default decoder on `buf`; `Ok(Some(n))` means a whole frame of `n` bytes.
fn check_decode(buf: &[u8], expected: Result<Option<usize>, ProtocolError>) {
    let got = FrameDecoder::default()
        .decode(buf)
        .map(|f| f.map(|f| f.frame_len()));
    assert_eq!(got, expected);
}

#[test]
fn header_layout_is_as_documented() {
    let frame = heartbeat_frame(0x0102_0304_0506_0708);
    assert_eq!(get_u32(&frame, 0) as usize, frame.len());
    assert_eq!(frame[4], b'R');
    assert_eq!(
        frame[5], 6,
        "version 6: send-backs say how often the consumer retried in place (5: commits name \
         the group's offsets epoch; 4: offset answers name the broker run, send-backs carry \
         the record's CRC and may carry the record)"
    );
    assert_eq!(get_u16(&frame, 6), Kind::Heartbeat as u16);
    assert_eq!(get_u64(&frame, 8), 0x0102_0304_0506_0708);
    assert_eq!(get_u32(&frame, 16), 0);
    assert_eq!(
        get_u32(&frame, 20) as usize,
        frame.len() - FRAME_HEADER_BYTES
    );
}

#[test]
fn a_whole_frame_decodes() {
    let frame = heartbeat_frame(9);
    check_decode(&frame, Ok(Some(frame.len())));
    let f = FrameDecoder::default().decode(&frame).unwrap().unwrap();
    assert_eq!(f.kind(), Kind::Heartbeat);
    assert_eq!(f.request_id(), 9);
    assert_eq!(f.header().flags(), Flags::NONE);
    assert_eq!(f.meta().len(), f.payload().len());
    assert!(f.tail().is_empty());
    let hb: Heartbeat = f.decode_meta().unwrap();
    assert_eq!(hb.client_id, "client-1");
}

#[test]
fn frames_back_to_back_decode_one_at_a_time() {
    let mut buf = heartbeat_frame(1);
    let first_len = buf.len();
    buf.extend_from_slice(&heartbeat_frame(2));
    let decoder = FrameDecoder::default();
    let first = decoder.decode(&buf).unwrap().unwrap();
    assert_eq!((first.request_id(), first.frame_len()), (1, first_len));
    let second = decoder.decode(&buf[first_len..]).unwrap().unwrap();
    assert_eq!(second.request_id(), 2);
    assert_eq!(first_len + second.frame_len(), buf.len());
}

#[test]
fn bad_magic_and_version_are_rejected_early() {
    let mut frame = heartbeat_frame(1);
    frame[4] = b'G';
    check_decode(
        &frame,
        Err(ProtocolError::BadMagic {
            found: b'G',
            expected: FRAME_MAGIC,
        }),
    );
    // Another protocol is rejected as soon as its fifth byte arrives.
    check_decode(
        b"GET /",
        Err(ProtocolError::BadMagic {
            found: b'/',
            expected: FRAME_MAGIC,
        }),
    );
    // A version-1 peer (batch results with id strings) is refused at its first frame.
    let mut frame = heartbeat_frame(1);
    frame[5] = 1;
    check_decode(
        &frame[..6],
        Err(ProtocolError::UnsupportedVersion {
            found: 1,
            supported: PROTOCOL_VERSION,
        }),
    );
}

#[test]
fn frame_len_bounds() {
    let mut frame = heartbeat_frame(1);
    set_u32(&mut frame, 0, 23);
    check_decode(
        &frame,
        Err(ProtocolError::FrameTooSmall { len: 23, min: 24 }),
    );
    for len in [FRAME_BYTES_MAX_DEFAULT + 1, u32::MAX] {
        set_u32(&mut frame, 0, len);
        let too_large = ProtocolError::FrameTooLarge {
            len: len as u64,
            max: FRAME_BYTES_MAX_DEFAULT,
        };
        // Rejected from the length field alone: nothing is reserved for it.
        check_decode(&frame[..4], Err(too_large.clone()));
        check_decode(&frame, Err(too_large.clone()));
        assert_eq!(
            FrameDecoder::default().bytes_needed(&frame[..4]),
            Err(too_large)
        );
    }
}

#[test]
fn unknown_kind_is_rejected() {
    let mut frame = heartbeat_frame(1);
    set_u16(&mut frame, 6, 999);
    check_decode(&frame[..8], Err(ProtocolError::UnknownKind(999)));
}

#[test]
fn flags_must_agree_with_the_kind() {
    let check_flags_word = |flags: u32, expected_ok: bool| {
        let mut frame = heartbeat_frame(1);
        set_u32(&mut frame, 16, flags);
        let got = FrameDecoder::default().decode(&frame);
        match got {
            Ok(Some(f)) => {
                assert!(expected_ok, "{flags:#x} accepted");
                assert_eq!(f.header().flags().bits(), flags);
            }
            Err(ProtocolError::BadFlags { kind, flags: f, .. }) => {
                assert!(!expected_ok, "{flags:#x} refused");
                assert_eq!((kind, f), (Kind::Heartbeat, flags));
            }
            other => panic!("{other:?}"),
        }
    };
    check_flags_word(0, true);
    check_flags_word(Flags::ONEWAY.bits(), true);
    check_flags_word(Flags::RESPONSE.bits(), false);
    check_flags_word(Flags::ERROR.bits(), false);
    check_flags_word(Flags::PUSH.bits(), false);
    check_flags_word(1 << 4, false);
    check_flags_word(1 << 31, false);
}

#[test]
fn meta_len_bounds() {
    let mut frame = heartbeat_frame(1);
    let payload_len = (frame.len() - FRAME_HEADER_BYTES) as u32;
    set_u32(&mut frame, 20, payload_len + 1);
    check_decode(
        &frame,
        Err(ProtocolError::MetaTooLong {
            meta_len: payload_len + 1,
            payload_len,
        }),
    );
    set_u32(&mut frame, 20, payload_len - 8);
    check_decode(
        &frame,
        Err(ProtocolError::UnexpectedTail {
            kind: Kind::Heartbeat,
            tail_len: 8,
        }),
    );
}

#[test]
fn partial_frames_need_more() {
    let frame = heartbeat_frame(1);
    let decoder = FrameDecoder::default();
    for cut in 0..frame.len() {
        check_decode(&frame[..cut], Ok(None));
        let needed = if cut < FRAME_HEADER_BYTES {
            FRAME_HEADER_BYTES
        } else {
            frame.len()
        };
        assert_eq!(decoder.bytes_needed(&frame[..cut]), Ok(needed));
    }
    assert_eq!(
        FrameHeader::decode(&frame[..10], &FrameLimits::default()),
        Err(ProtocolError::Truncated {
            needed: 24,
            available: 10
        })
    );
}

#[test]
fn header_then_payload_read_separately() {
    let frame = heartbeat_frame(5);
    let header = FrameHeader::decode(&frame, &FrameLimits::default()).unwrap();
    assert_eq!(header.payload_len(), frame.len() - FRAME_HEADER_BYTES);
    let f = Frame::new(header, &frame[FRAME_HEADER_BYTES..]).unwrap();
    assert_eq!(f.request_id(), 5);
    assert_eq!(
        Frame::new(header, &frame[FRAME_HEADER_BYTES + 1..]),
        Err(ProtocolError::PayloadLength {
            expected: header.payload_len(),
            found: header.payload_len() - 1
        })
    );
}

#[test]
fn limits_are_bounded() {
    assert_eq!(
        FrameLimits::default().frame_bytes_max(),
        FRAME_BYTES_MAX_DEFAULT
    );
    assert!(FrameLimits::new(FRAME_BYTES_MIN).is_ok());
    assert!(FrameLimits::new(FRAME_BYTES_CEILING).is_ok());
    for bad in [0, FRAME_BYTES_MIN - 1, FRAME_BYTES_CEILING + 1] {
        assert_eq!(
            FrameLimits::new(bad),
            Err(ProtocolError::BadLimit {
                found: bad,
                min: FRAME_BYTES_MIN,
                max: FRAME_BYTES_CEILING
            })
        );
    }
    let smallest = FrameLimits::new(FRAME_BYTES_MIN).unwrap();
    assert!(smallest.records_bytes_max() as usize >= RECORD_BYTES_MAX);
}

#[test]
fn a_smaller_configured_limit_is_enforced() {
    let decoder = FrameDecoder::new(FrameLimits::new(FRAME_BYTES_MIN).unwrap());
    let mut frame = heartbeat_frame(1);
    set_u32(&mut frame, 0, FRAME_BYTES_MIN + 1);
    assert_eq!(
        decoder.decode(&frame),
        Err(ProtocolError::FrameTooLarge {
            len: FRAME_BYTES_MIN as u64 + 1,
            max: FRAME_BYTES_MIN
        })
    );
}

#[test]
fn encoder_refuses_flags_and_tails_the_kind_forbids() {
    let mut out = vec![0xAA; 3];
    let hb = Heartbeat {
        client_id: "c".into(),
    };
    let err = encode_frame(1, Flags::PUSH, &hb, &[], &mut out).unwrap_err();
    assert!(matches!(err, ProtocolError::BadFlags { .. }), "{err}");
    let err = encode_frame(1, Flags::NONE, &hb, b"tail", &mut out).unwrap_err();
    assert_eq!(
        err,
        ProtocolError::UnexpectedTail {
            kind: Kind::Heartbeat,
            tail_len: 4
        }
    );
    let pr = PullResult {
        status: PullStatus::Found,
        next_offset: 0,
        min_offset: 0,
        max_offset: 0,
        count: 0,
        incarnation: 7,
    };
    let err = encode_frame(1, Flags::ONEWAY, &pr, &[], &mut out).unwrap_err();
    assert!(matches!(err, ProtocolError::BadFlags { .. }), "{err}");
    // Nothing half-written is left behind.
    assert_eq!(out, vec![0xAA; 3]);
}

#[test]
fn encoder_adds_the_bits_the_kind_requires() {
    let pr = PullResult {
        status: PullStatus::NoNewMessage,
        next_offset: 1,
        min_offset: 0,
        max_offset: 1,
        count: 0,
        incarnation: 7,
    };
    let mut out = Vec::new();
    encode_frame(3, Flags::NONE, &pr, &[], &mut out).unwrap();
    let f = FrameDecoder::default().decode(&out).unwrap().unwrap();
    assert_eq!(f.header().flags(), Flags::RESPONSE);
}

#[test]
fn head_then_tail_equals_whole_frame() {
    let pr = PullResult {
        status: PullStatus::Found,
        next_offset: 9,
        min_offset: 0,
        max_offset: 10,
        count: 2,
        incarnation: 7,
    };
    let parts: [&[u8]; 2] = [b"first record", b"second"];
    let mut whole = Vec::new();
    encode_frame(4, Flags::NONE, &pr, &parts.concat(), &mut whole).unwrap();
    let mut gathered = Vec::new();
    let len = encode_frame_head(4, Flags::NONE, &pr, 18, &mut gathered).unwrap();
    for p in parts {
        gathered.extend_from_slice(p);
    }
    assert_eq!(len, gathered.len());
    assert_eq!(gathered, whole);
    let f = FrameDecoder::default().decode(&whole).unwrap().unwrap();
    assert_eq!(f.tail(), b"first recordsecond");
    assert_eq!(f.decode_meta::<PullResult>().unwrap(), pr);
}

#[test]
fn a_frame_without_shared_bytes_is_one_part_equal_to_the_whole_frame() {
    let hb = Heartbeat {
        client_id: "client-1".into(),
    };
    let whole = heartbeat_frame(7);
    let mut parts = FrameParts::default();
    let len = encode_frame_parts(7, Flags::NONE, &hb, &mut parts).unwrap();
    assert_eq!(len, whole.len());
    assert!(parts.shared.is_empty());
    let mut pieces = Vec::new();
    parts.for_each_slice(|s| pieces.push(s));
    assert_eq!(pieces, [&whole[..]]);
    // A refused frame leaves the parts as they were.
    let before = parts.bytes.len();
    let oneway_answer = PullResult {
        status: PullStatus::Found,
        next_offset: 0,
        min_offset: 0,
        max_offset: 0,
        count: 0,
        incarnation: 7,
    };
    assert!(encode_frame_parts(8, Flags::ONEWAY, &oneway_answer, &mut parts).is_err());
    assert_eq!(parts.bytes.len(), before);
}

#[test]
fn meta_is_borrowed_when_aligned_and_copied_when_not() {
    let frame = heartbeat_frame(1);
    for shift in 0..16 {
        let mut buf = AlignedVec::<16>::new();
        buf.extend_from_slice(&vec![0u8; shift]);
        buf.extend_from_slice(&frame);
        let bytes = &buf[shift..];
        let f = FrameDecoder::default().decode(bytes).unwrap().unwrap();
        let meta = f.aligned_meta();
        let aligned = (shift + FRAME_HEADER_BYTES).is_multiple_of(META_ALIGN);
        assert_eq!(meta.is_copied(), !aligned, "shift {shift}");
        let archived = meta.access::<Heartbeat>().unwrap();
        assert_eq!(archived.client_id.as_str(), "client-1");
    }
}

#[test]
fn meta_of_another_kind_is_refused() {
    let frame = heartbeat_frame(1);
    let f = FrameDecoder::default().decode(&frame).unwrap().unwrap();
    assert_eq!(
        f.decode_meta::<PullResult>(),
        Err(ProtocolError::KindMismatch {
            expected: Kind::PullResult,
            found: Kind::Heartbeat
        })
    );
}
