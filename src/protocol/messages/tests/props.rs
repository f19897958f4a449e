//! Property tests and fuzzing of the wire types: round trips, truncations, corruptions.

use super::*;

fn arb_text() -> impl Strategy<Value = String> {
    "\\PC{0,24}"
}

fn arb_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

prop_compose! {
    fn arb_send_message()(
        topic in arb_text(),
        queue_id: i32,
        flag: i32,
        properties in arb_bytes(64),
        body in arb_bytes(300),
        born_timestamp_ms: i64,
        wait_durable: bool,
    ) -> SendMessage {
        SendMessage { topic, queue_id, flag, properties, body, born_timestamp_ms, wait_durable }
    }
}

prop_compose! {
    fn arb_batch_item()(
        flag: i32,
        properties in arb_bytes(32),
        body in arb_bytes(64),
        born_timestamp_ms: i64,
    ) -> BatchItem {
        BatchItem { flag, properties, body: body.into(), born_timestamp_ms }
    }
}

prop_compose! {
    fn arb_send_batch()(
        topic in arb_text(),
        queue_id: i32,
        messages in proptest::collection::vec(arb_batch_item(), 0..8),
        wait_durable: bool,
    ) -> SendBatch {
        SendBatch { topic, queue_id, messages, wait_durable }
    }
}

prop_compose! {
    fn arb_pull()(
        topic in arb_text(),
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_wait_ms: u32,
        tag_hashes in proptest::collection::vec(any::<u64>(), 0..8),
        sql in arb_text(),
        incarnation: u64,
    ) -> Pull {
        Pull { topic, queue_id, offset, max_messages, max_wait_ms, tag_hashes, sql, incarnation }
    }
}

prop_compose! {
    fn arb_commit_offset()(
        group in arb_text(),
        topic in arb_text(),
        queue_id: u32,
        offset: u64,
        incarnation: u64,
        offsets_epoch: Option<u64>,
        if_absent: bool,
    ) -> CommitOffset {
        CommitOffset { group, topic, queue_id, offset, incarnation, offsets_epoch, if_absent }
    }
}

fn arb_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        arb_send_message().prop_map(Request::from),
        arb_send_batch().prop_map(Request::from),
        arb_pull().prop_map(Request::from),
        arb_commit_offset().prop_map(Request::from),
        (any::<u32>(), arb_text()).prop_map(|(protocol_version, client_id)| {
            Request::from(Handshake {
                protocol_version,
                client_id,
            })
        }),
    ]
}

prop_compose! {
    fn arb_handshake_ok()(
        protocol_version: u32,
        shard_count: u32,
        shard_id: u32,
        shard_addrs in proptest::collection::vec(arb_text(), 0..6),
        broker_id: u32,
    ) -> HandshakeOk {
        HandshakeOk { protocol_version, shard_count, shard_id, shard_addrs, broker_id }
    }
}

fn encoded(request: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(request, 1, &mut out).unwrap();
    out
}

/// Runs every decoding step on `bytes`; any outcome but a panic is fine.
fn decode_everything(bytes: &[u8]) {
    let decoder = FrameDecoder::default();
    let _ = decoder.bytes_needed(bytes);
    if let Ok(Some(frame)) = decoder.decode(bytes) {
        let _ = frame.decode_request();
        if let Ok(Response::Pull(pull)) = frame.decode_response() {
            let _ = pull.check_records();
        }
    }
}

/// A header that passes the checks, for `kind`, followed by `payload`.
fn header_for(kind: Kind, meta_len: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&((FRAME_HEADER_BYTES + payload.len()) as u32).to_le_bytes());
    out.extend_from_slice(&[FRAME_MAGIC, PROTOCOL_VERSION]);
    out.extend_from_slice(&kind.as_u16().to_le_bytes());
    out.extend_from_slice(&7u64.to_le_bytes());
    out.extend_from_slice(&Flags::required_for(kind).bits().to_le_bytes());
    out.extend_from_slice(&meta_len.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A frame written from its parts, as a vectored write would.
fn joined(parts: &crate::protocol::FrameParts) -> Vec<u8> {
    let mut out = Vec::new();
    parts.for_each_slice(|s| {
        assert!(!s.is_empty());
        out.extend_from_slice(s)
    });
    assert_eq!(out.len(), parts.len());
    out
}

proptest! {
    /// A batch's bodies kept by reference make the very bytes of the copying encoder, so
    /// the broker reads them as before; only the bodies are kept aside.
    #[test]
    fn batches_encoded_in_parts_are_the_same_bytes(batch in arb_send_batch(), request_id: u64) {
        let mut whole = Vec::new();
        let len = encode_frame(request_id, Flags::NONE, &batch, &[], &mut whole).unwrap();
        let mut parts = crate::protocol::FrameParts::default();
        let parts_len =
            crate::protocol::encode_frame_parts(request_id, Flags::NONE, &batch, &mut parts)
                .unwrap();
        prop_assert_eq!(len, parts_len);
        prop_assert_eq!(joined(&parts), whole);
        let bodies: Vec<&[u8]> =
            batch.messages.iter().map(|m| &m.body[..]).filter(|b| !b.is_empty()).collect();
        let shared: Vec<&[u8]> = parts.shared.iter().map(|(_, b)| &b[..]).collect();
        prop_assert_eq!(shared, bodies);
        // Kept by reference: the very buffers of the request.
        for ((_, b), m) in parts.shared.iter().zip(batch.messages.iter().filter(|m| !m.body.is_empty())) {
            prop_assert_eq!(b.as_ptr(), m.body.as_ptr());
        }
    }

    #[test]
    fn requests_round_trip(request in arb_request(), shift in 0usize..16) {
        let out = encoded(&request);
        let buf = shifted(&out, shift);
        let frame = FrameDecoder::default().decode(&buf[shift..]).unwrap().unwrap();
        prop_assert_eq!(frame.frame_len(), out.len());
        prop_assert_eq!(frame.decode_request().unwrap(), request);
    }

    #[test]
    fn handshake_ok_round_trips(ok in arb_handshake_ok(), request_id: u64) {
        let response = Response::HandshakeOk(ok);
        let mut out = Vec::new();
        encode_response(&response, request_id, &mut out).unwrap();
        let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
        prop_assert_eq!(frame.request_id(), request_id);
        prop_assert_eq!(frame.decode_response().unwrap(), response);
    }

    #[test]
    fn fuzz_frames_of_arbitrary_bytes_never_panic(bytes in arb_bytes(512)) {
        decode_everything(&bytes);
    }

    #[test]
    fn fuzz_every_kind_with_an_arbitrary_payload_never_panics(
        kind in proptest::sample::select(Kind::ALL.to_vec()),
        payload in arb_bytes(256),
        meta_len: u32,
        meta_fits: bool,
    ) {
        let meta_len = if meta_fits && !payload.is_empty() {
            meta_len % (payload.len() as u32 + 1)
        } else {
            meta_len
        };
        let bytes = header_for(kind, meta_len, &payload);
        decode_everything(&bytes);
        // Every outcome is typed: a decoded frame or an error naming the problem.
        if let Ok(Some(frame)) = FrameDecoder::default().decode(&bytes) {
            let outcome = match kind.class() {
                KindClass::Request => frame.decode_request().map(|_| ()),
                _ => frame.decode_response().map(|_| ()),
            };
            if let Err(e) = outcome {
                prop_assert_eq!(e.code(), ErrorCode::MalformedFrame, "{}", e);
            }
        }
    }

    #[test]
    fn fuzz_one_corrupt_byte_in_a_valid_frame_never_panics(
        request in arb_request(),
        at: proptest::sample::Index,
        value: u8,
    ) {
        let mut bytes = encoded(&request);
        let i = at.index(bytes.len());
        bytes[i] = value;
        decode_everything(&bytes);
    }

    /// The corpus: one valid frame of every request kind (`sample_requests`), with a few
    /// bytes changed and cut anywhere: every outcome is a value or a typed error.
    #[test]
    fn fuzz_corrupted_corpus_frames_never_panic(
        which: proptest::sample::Index,
        changes in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..5),
        cut: proptest::sample::Index,
    ) {
        let corpus = sample_requests();
        let mut bytes = encoded(&corpus[which.index(corpus.len())]);
        for (at, value) in changes {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        decode_everything(&bytes);
        let end = cut.index(bytes.len() + 1);
        decode_everything(&bytes[..end]);
    }

    #[test]
    fn every_truncation_needs_more(request in arb_request()) {
        let bytes = encoded(&request);
        let decoder = FrameDecoder::default();
        for cut in 0..bytes.len() {
            prop_assert_eq!(decoder.decode(&bytes[..cut]), Ok(None), "cut {}", cut);
            let needed = if cut < FRAME_HEADER_BYTES {
                FRAME_HEADER_BYTES
            } else {
                bytes.len()
            };
            prop_assert_eq!(decoder.bytes_needed(&bytes[..cut]), Ok(needed));
        }
        prop_assert!(decoder.decode(&bytes).unwrap().is_some());
    }

    #[test]
    fn huge_frame_len_is_rejected_from_the_header_alone(
        len in (FRAME_BYTES_MAX_DEFAULT + 1)..=u32::MAX,
        kind in proptest::sample::select(Kind::ALL.to_vec()),
    ) {
        let mut header = header_for(kind, 0, &[]);
        header[..4].copy_from_slice(&len.to_le_bytes());
        let expected = ProtocolError::FrameTooLarge {
            len: len as u64,
            max: FRAME_BYTES_MAX_DEFAULT,
        };
        prop_assert_eq!(FrameDecoder::default().decode(&header), Err(expected.clone()));
        prop_assert_eq!(
            FrameHeader::decode(&header, &FrameLimits::default()),
            Err(expected)
        );
    }

    #[test]
    fn pull_answers_round_trip_with_records(
        status in proptest::sample::select(vec![
            PullStatus::Found,
            PullStatus::NoNewMessage,
            PullStatus::NoMatchedMessage,
            PullStatus::OffsetTooSmall,
            PullStatus::OffsetTooBig,
        ]),
        next_offset: u64,
        take in 0usize..=3,
        shift in 0usize..16,
    ) {
        let all = stored_records();
        let mut end = 0;
        for record in crate::protocol::record::RecordIter::new(&all).take(take) {
            end += record.unwrap().as_bytes().len();
        }
        let response = Response::Pull(PullResponse::new(
            PullResult {
                status,
                next_offset,
                min_offset: 0,
                max_offset: 13,
                count: take as u32,
                incarnation: 7,
            },
            &all[..end],
        ));
        let mut out = Vec::new();
        encode_response(&response, 3, &mut out).unwrap();
        let buf = shifted(&out, shift);
        let frame = FrameDecoder::default().decode(&buf[shift..]).unwrap().unwrap();
        let decoded = frame.decode_response().unwrap();
        prop_assert_eq!(&decoded, &response);
        let Response::Pull(pull) = decoded else { unreachable!() };
        prop_assert_eq!(pull.check_records(), Ok(()));
    }
}
