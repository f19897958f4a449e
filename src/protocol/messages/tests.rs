//! Round trips, limits and hostile input for every request and response type.

use super::*;
use crate::protocol::frame::{
    encode_frame_head, FrameDecoder, FrameLimits, FRAME_BYTES_MAX_DEFAULT, FRAME_BYTES_MIN,
    FRAME_HEADER_BYTES, FRAME_MAGIC, META_BYTES_RESERVE,
};
use crate::protocol::kind::{Kind, KindClass};
use crate::protocol::record::{
    prop, Placement, PropertiesBuilder, RecordDraft, RecordError, BODY_BYTES_MAX,
    PROPERTIES_BYTES_MAX, TOPIC_BYTES_MAX,
};
use proptest::prelude::*;
use rkyv::util::AlignedVec;

/// `bytes` placed `shift` bytes after a 16-aligned address; read it at `[shift..]`.
fn shifted(bytes: &[u8], shift: usize) -> AlignedVec<16> {
    let mut buf = AlignedVec::<16>::with_capacity(shift + bytes.len());
    buf.extend_from_slice(&vec![0u8; shift]);
    buf.extend_from_slice(bytes);
    buf
}

/// Encodes `request`, then decodes it from buffers at every misalignment.
fn check_request(request: &Request) {
    let mut out = Vec::new();
    let len = encode_request(request, 42, &mut out).unwrap();
    assert_eq!(len, out.len());
    for shift in 0..16 {
        let buf = shifted(&out, shift);
        let frame = FrameDecoder::default()
            .decode(&buf[shift..])
            .unwrap()
            .unwrap();
        assert_eq!(frame.frame_len(), len);
        assert_eq!(frame.request_id(), 42);
        assert_eq!(frame.kind(), request.kind());
        assert!(frame.tail().is_empty());
        assert_eq!(&frame.decode_request().unwrap(), request);
        assert_eq!(
            &decode_request(frame.header(), frame.payload()).unwrap(),
            request
        );
        assert_eq!(
            frame.decode_response(),
            Err(ProtocolError::UnexpectedKind {
                expected: KindClass::Response,
                found: request.kind()
            })
        );
    }
}

/// Encodes `response`, then decodes it from buffers at every misalignment.
fn check_response(response: &Response<'_>) {
    let mut out = Vec::new();
    let len = encode_response(response, 77, &mut out).unwrap();
    assert_eq!(len, out.len());
    for shift in 0..16 {
        let buf = shifted(&out, shift);
        let frame = FrameDecoder::default()
            .decode(&buf[shift..])
            .unwrap()
            .unwrap();
        assert_eq!(frame.request_id(), 77);
        assert_eq!(frame.kind(), response.kind());
        assert!(frame.header().flags().is_response());
        assert_eq!(
            frame.header().flags().is_error(),
            matches!(response, Response::Error(_))
        );
        assert_eq!(&frame.decode_response().unwrap(), response);
        assert_eq!(
            &decode_response(frame.header(), frame.payload()).unwrap(),
            response
        );
        assert_eq!(
            frame.decode_request(),
            Err(ProtocolError::UnexpectedKind {
                expected: KindClass::Request,
                found: response.kind()
            })
        );
    }
}

fn properties() -> Vec<u8> {
    let mut p = PropertiesBuilder::new();
    p.put(prop::TAGS, "TagA").unwrap();
    p.put(prop::KEYS, "order-1 order-2").unwrap();
    p.into_bytes()
}

/// Three stored records, concatenated as a pull answer carries them.
fn stored_records() -> Vec<u8> {
    let props = properties();
    let mut out = Vec::new();
    for (i, body) in [&b"first"[..], b"", b"third body"].into_iter().enumerate() {
        let draft = RecordDraft {
            topic: "orders",
            queue_id: 2,
            flag: i as i32,
            sys_flag: 0,
            born_timestamp_ms: 1_700_000_000_000 + i as i64,
            born_host: "10.0.0.1:9000".parse().unwrap(),
            reconsume_times: 0,
            transaction_offset: 0,
            properties: &props,
            body,
        };
        out.extend_from_slice(&draft.encode(Placement {
            queue_offset: 10 + i as u64,
            physical_offset: 4096 * i as u64,
            store_timestamp_ms: 1_700_000_000_500,
        }));
    }
    out
}

fn sample_requests() -> Vec<Request> {
    vec![
        Handshake::new("client-a").into(),
        Heartbeat {
            client_id: "client-a".into(),
        }
        .into(),
        Handshake2 {
            protocol_version: PROTOCOL_VERSION as u32,
            client_id: "c".into(),
            frame_bytes_max: 1 << 23,
        }
        .into(),
        SendMessage {
            topic: "orders".into(),
            queue_id: QUEUE_ID_ANY,
            flag: -3,
            properties: properties(),
            body: b"hello".to_vec(),
            born_timestamp_ms: -1,
            wait_durable: true,
        }
        .into(),
        SendBatch {
            topic: "orders".into(),
            queue_id: 3,
            messages: vec![
                BatchItem {
                    flag: 1,
                    properties: properties(),
                    body: b"a".to_vec().into(),
                    born_timestamp_ms: 5,
                },
                BatchItem {
                    flag: 2,
                    properties: Vec::new(),
                    body: Default::default(),
                    born_timestamp_ms: 6,
                },
            ],
            wait_durable: false,
        }
        .into(),
        ProducerHeartbeat {
            group: "pg".into(),
            client_id: "c1".into(),
        }
        .into(),
        EndTransaction {
            topic: "orders".into(),
            queue_id: 2,
            transaction_id: 77,
            producer_group: "pg".into(),
            outcome: TRANSACTION_COMMIT,
            from_check: true,
        }
        .into(),
        SendMulti {
            topic: "orders".into(),
            queue_ids: vec![3, 5, 3],
            messages: (0..3)
                .map(|i| BatchItem {
                    flag: i,
                    properties: if i == 1 { properties() } else { Vec::new() },
                    body: vec![b'x'; i as usize].into(),
                    born_timestamp_ms: 5 + i64::from(i),
                })
                .collect(),
            wait_durable: true,
        }
        .into(),
        Pull {
            tag_hashes: vec![1, u64::MAX],
            ..Pull::new("orders", 3, 100)
        }
        .into(),
        Pull {
            sql: "region = 'eu' AND amount > 100".into(),
            ..Pull::new("orders", 3, 100)
        }
        .into(),
        GetMinOffset {
            topic: "orders".into(),
            queue_id: 1,
        }
        .into(),
        GetMaxOffset {
            topic: "orders".into(),
            queue_id: 1,
        }
        .into(),
        SearchOffsetByTimestamp {
            topic: "orders".into(),
            queue_id: 1,
            timestamp_ms: 1_700_000_000_000,
        }
        .into(),
        CommitOffset {
            group: "g".into(),
            topic: "orders".into(),
            queue_id: 7,
            offset: u64::MAX,
            incarnation: 9,
            offsets_epoch: Some(1_700_000_000_000),
            if_absent: true,
        }
        .into(),
        QueryOffset {
            group: "g".into(),
            topic: "orders".into(),
            queue_id: 7,
        }
        .into(),
        CreateTopic {
            topic: "orders".into(),
            queue_count: 8,
        }
        .into(),
        UpdateTopic {
            topic: "orders".into(),
            queue_count: 16,
        }
        .into(),
        DeleteTopic {
            topic: "orders".into(),
        }
        .into(),
        ListTopics {}.into(),
        DescribeTopic {
            topic: "orders".into(),
            create: true,
        }
        .into(),
        MessageById {
            msg_id: "0000000100000002000000000000ABCD".into(),
        }
        .into(),
        MessagesByKey {
            topic: "orders".into(),
            key: "order-1".into(),
            begin_ms: 0,
            end_ms: i64::MAX,
            max_messages: 64,
        }
        .into(),
        GroupHeartbeat {
            group: "g".into(),
            client_id: "c1".into(),
            subscriptions: vec![
                SubscriptionData {
                    topic: "orders".into(),
                    expression: "A || B".into(),
                    expression_type: EXPRESSION_TAG,
                },
                SubscriptionData {
                    topic: "payments".into(),
                    expression: "amount > 100".into(),
                    expression_type: EXPRESSION_SQL92,
                },
            ],
            consume_mode: CONSUME_MODE_ORDERLY,
            message_model: MESSAGE_MODEL_CLUSTERING,
            strategy: "averagely".into(),
        }
        .into(),
        Unregister {
            group: "g".into(),
            client_id: "c1".into(),
        }
        .into(),
        QueryAssignment {
            group: "g".into(),
            client_id: "c1".into(),
        }
        .into(),
        GroupMembers { group: "g".into() }.into(),
        ResetOffset {
            group: "g".into(),
            topic: "orders".into(),
            timestamp_ms: 17,
        }
        .into(),
        ConsumerProgress {
            group: "g".into(),
            topic: "orders".into(),
        }
        .into(),
        DeleteGroup { group: "g".into() }.into(),
        LockBatch {
            group: "g".into(),
            client_id: "c1".into(),
            topic: "orders".into(),
            queues: vec![0, 3],
        }
        .into(),
        UnlockBatch {
            group: "g".into(),
            client_id: "c1".into(),
            topic: "orders".into(),
            queues: vec![3],
        }
        .into(),
        ConsumerSendBack {
            group: "g".into(),
            msg_id: "0".repeat(32),
            delay_level: -1,
            max_reconsume_times: 16,
            reconsumed: 7,
            record_crc: 0x1234_5678,
            record: vec![1, 2, 3],
        }
        .into(),
        ScheduleStats {}.into(),
        ListTransactions {}.into(),
    ]
}

fn sample_responses(raw: &[u8]) -> Vec<Response<'_>> {
    vec![
        ErrorBody::new(ErrorCode::TopicNotFound, "no topic \"x\"").into(),
        Response::Empty(Empty {}),
        Response::HandshakeOk(HandshakeOk {
            protocol_version: PROTOCOL_VERSION as u32,
            shard_count: 2,
            shard_id: 1,
            shard_addrs: vec!["127.0.0.1:7800".into(), "127.0.0.1:7801".into()],
            broker_id: 9,
        }),
        Response::SendResult(SendResult {
            msg_id: "0000000900000001000000000000F000".into(),
            queue_id: 3,
            queue_offset: 12,
            physical_offset: 0xF000,
            transaction_id: 0,
        }),
        Response::SendBatchResult(SendBatchResult {
            queue_id: 3,
            first_queue_offset: 13,
            count: 2,
            broker_id: 1,
            store_id: 2,
            physical_offsets: vec![0x10, 0x20],
        }),
        Response::Pull(PullResponse::new(
            PullResult {
                status: PullStatus::Found,
                next_offset: 13,
                min_offset: 0,
                max_offset: 20,
                count: 3,
                incarnation: 7,
            },
            raw,
        )),
        Response::Pull(PullResponse::new(
            PullResult {
                status: PullStatus::OffsetTooBig,
                next_offset: 20,
                min_offset: 0,
                max_offset: 20,
                count: 0,
                incarnation: 7,
            },
            &[],
        )),
        Response::Offset(Offset {
            offset: 5,
            incarnation: 7,
        }),
        Response::TopicList(TopicList {
            topics: vec!["a".into(), "orders".into()],
        }),
        Response::TopicInfo(TopicInfo {
            topic: "orders".into(),
            queues: vec![
                QueueInfo {
                    queue_id: 0,
                    min_offset: 0,
                    max_offset: 10,
                },
                QueueInfo {
                    queue_id: 1,
                    min_offset: 3,
                    max_offset: 4,
                },
            ],
        }),
        Response::Records(RecordsResponse::new(Records { count: 3 }, raw)),
        Response::Assignment(Assignment {
            generation: 4,
            offsets_epoch: 1,
            topics: vec![TopicAssignment {
                topic: "orders".into(),
                queues: vec![0, 2],
            }],
        }),
        Response::GroupMembersInfo(GroupMembersInfo {
            group: "g".into(),
            generation: 4,
            members: vec![MemberAssignment {
                client_id: "c1".into(),
                topics: vec![TopicAssignment {
                    topic: "orders".into(),
                    queues: vec![1],
                }],
            }],
        }),
        Response::Progress(Progress {
            group: "g".into(),
            topic: "orders".into(),
            queues: vec![QueueProgress {
                queue_id: 0,
                committed_offset: -1,
                max_offset: 9,
                lag: 9,
            }],
        }),
        Response::Locked(Locked { queues: vec![0, 3] }),
        Response::SendBackResult(SendBackResult {
            dead_lettered: true,
            msg_id: "1".repeat(32),
            reconsume_times: 17,
        }),
        Response::ScheduleInfo(ScheduleInfo {
            shards: vec![ShardScheduleInfo {
                shard: 1,
                pending: 5,
                in_flight: 1,
                next_due_ms: 1_700_000_000_000,
                overdue: 2,
                delivered_total: 9,
                parked: 0,
                undeliverable_total: 1,
            }],
        }),
        Response::HandshakeOk2(HandshakeOk2 {
            ok: HandshakeOk {
                protocol_version: PROTOCOL_VERSION as u32,
                shard_count: 2,
                shard_id: 1,
                shard_addrs: vec!["a:1".into(), "a:2".into()],
                broker_id: 3,
            },
            limits: BrokerLimits {
                frame_bytes_max: 1 << 23,
                session_timeout_ms: 10_000,
                lock_expiry_ms: 60_000,
            },
        }),
        Response::TransactionList(TransactionList {
            halves: vec![HalfMessageInfo {
                shard: 1,
                transaction_id: 5,
                topic: "orders".into(),
                queue_id: 2,
                producer_group: "pg".into(),
                msg_id: "0000000900000001000000000000F000".into(),
                age_ms: 7_000,
                checks: 2,
            }],
            unresolved: 4,
            discarded: 3,
            recently_discarded: Vec::new(),
        }),
        Response::SendMultiResult(SendMultiResult {
            broker_id: 1,
            store_id: 2,
            queue_offsets: vec![13, 0, 14],
            physical_offsets: vec![0x10, 0x20, 0x30],
        }),
    ]
}

#[test]
fn every_request_kind_round_trips() {
    let samples = sample_requests();
    for request in &samples {
        check_request(request);
    }
    let mut covered: Vec<Kind> = samples.iter().map(Request::kind).collect();
    covered.dedup();
    let requests: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| k.class() == KindClass::Request)
        .collect();
    assert_eq!(covered, requests);
}

#[test]
fn every_response_kind_round_trips() {
    let raw = stored_records();
    let samples = sample_responses(&raw);
    for response in &samples {
        check_response(response);
    }
    let mut covered: Vec<Kind> = samples.iter().map(Response::kind).collect();
    covered.dedup();
    let responses: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| k.class() == KindClass::Response)
        .collect();
    assert_eq!(covered, responses);
}

#[test]
fn every_request_has_its_success_reply_kind() {
    // The pairs the server answers with, checked against the registry.
    let raw = stored_records();
    let replies = sample_responses(&raw);
    for request in sample_requests() {
        let reply = request.kind().success_reply().unwrap();
        assert!(replies.iter().any(|r| r.kind() == reply));
    }
}

#[test]
fn pull_records_are_read_in_place() {
    let raw = stored_records();
    let response = Response::Pull(PullResponse::new(
        PullResult {
            status: PullStatus::Found,
            next_offset: 13,
            min_offset: 0,
            max_offset: 13,
            count: 3,
            incarnation: 7,
        },
        &raw,
    ));
    let mut out = Vec::new();
    encode_response(&response, 1, &mut out).unwrap();
    // Misaligned on purpose: records need no alignment.
    let buf = shifted(&out, 3);
    let frame = FrameDecoder::default().decode(&buf[3..]).unwrap().unwrap();
    assert_eq!(frame.tail(), &raw[..]);
    let Response::Pull(pull) = frame.decode_response().unwrap() else {
        panic!("not a pull answer")
    };
    pull.check_records().unwrap();
    let records: Vec<_> = pull.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), 3);
    assert_eq!(
        records.iter().map(|r| r.queue_offset()).collect::<Vec<_>>(),
        vec![10, 11, 12]
    );
    assert_eq!(records[0].body(), b"first");
    assert_eq!(records[1].body(), b"");
    assert_eq!(records[2].body(), b"third body");
    assert_eq!(records[2].topic(), "orders");
    assert_eq!(records[2].tags(), Some("TagA"));
    assert_eq!(records[2].physical_offset(), 8192);
    // The records' bytes lie inside the received frame: nothing was copied.
    let frame_bytes = &buf[3..];
    let inside = frame_bytes.as_ptr_range();
    assert!(inside.contains(&records[0].as_bytes().as_ptr()));
}

#[test]
fn message_by_id_answer_carries_one_record() {
    let raw = stored_records();
    let first_len = crate::protocol::record::RecordView::parse(&raw)
        .unwrap()
        .as_bytes()
        .len();
    let response = Response::Records(RecordsResponse::new(
        Records { count: 1 },
        &raw[..first_len],
    ));
    let mut out = Vec::new();
    encode_response(&response, 2, &mut out).unwrap();
    let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
    let Response::Records(found) = frame.decode_response().unwrap() else {
        panic!("not a records answer")
    };
    found.check_records().unwrap();
    let record = found.records().next().unwrap().unwrap();
    assert_eq!(record.body(), b"first");
    assert_eq!(
        record.keys().collect::<Vec<_>>(),
        vec!["order-1", "order-2"]
    );
}

#[test]
fn check_records_catches_a_wrong_count_and_a_bad_crc() {
    let mut raw = stored_records();
    let wrong_count = PullResponse::new(
        PullResult {
            status: PullStatus::Found,
            next_offset: 0,
            min_offset: 0,
            max_offset: 0,
            count: 4,
            incarnation: 7,
        },
        &raw,
    );
    assert_eq!(
        wrong_count.check_records(),
        Err(ProtocolError::RecordCount {
            expected: 4,
            found: 3
        })
    );
    let last = raw.len() - 1;
    raw[last] ^= 0x20;
    let corrupt = RecordsResponse::new(Records { count: 3 }, &raw);
    let err = corrupt.check_records().unwrap_err();
    assert!(
        matches!(err, ProtocolError::BadRecord(RecordError::BadCrc { .. })),
        "{err}"
    );
}

#[test]
fn oneway_requests_carry_the_flag() {
    let request: Request = Heartbeat {
        client_id: "c".into(),
    }
    .into();
    let mut out = Vec::new();
    encode_oneway_request(&request, 8, &mut out).unwrap();
    let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
    assert!(frame.header().flags().is_oneway());
    assert_eq!(frame.decode_request().unwrap(), request);
}

#[test]
fn error_answers_keep_code_and_message() {
    let mut out = Vec::new();
    encode_error(5, ErrorCode::OffsetNotFound, "no offset for g", &mut out).unwrap();
    let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
    let Response::Error(e) = frame.decode_response().unwrap() else {
        panic!("not an error")
    };
    assert_eq!(e.error_code(), Some(ErrorCode::OffsetNotFound));
    assert!(!e.is_retriable());
    assert_eq!(e.to_string(), "OffsetNotFound(20): no offset for g");
    let from_newer_broker = ErrorBody {
        code: 4242,
        message: "?".into(),
    };
    assert_eq!(from_newer_broker.error_code(), None);
    assert!(!from_newer_broker.is_retriable());
    let e = ErrorBody::from(&ProtocolError::UnknownKind(777));
    assert_eq!(e.error_code(), Some(ErrorCode::UnknownKind));
    assert_eq!(e.message, "unknown frame kind 777");
}

#[test]
fn garbage_meta_is_a_typed_error() {
    // A valid header around a payload that is not a Pull.
    let mut out = Vec::new();
    encode_request(&Pull::new("t", 0, 0).into(), 1, &mut out).unwrap();
    for b in &mut out[FRAME_HEADER_BYTES..] {
        *b = 0xFF;
    }
    let frame = FrameDecoder::default().decode(&out).unwrap().unwrap();
    let err = frame.decode_request().unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::BadPayload {
                kind: Kind::Pull,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.code(), ErrorCode::MalformedFrame);
}

#[test]
fn largest_messages_fit_the_smallest_limit() {
    let body = vec![7u8; BODY_BYTES_MAX];
    let mut props = Vec::with_capacity(PROPERTIES_BYTES_MAX);
    // One property filling the block: name, 0x01, value, 0x02.
    props.extend_from_slice(b"P\x01");
    props.resize(PROPERTIES_BYTES_MAX - 1, b'v');
    props.push(0x02);
    let send = SendMessage {
        topic: "t".repeat(TOPIC_BYTES_MAX),
        queue_id: 0,
        flag: 0,
        properties: props,
        body,
        born_timestamp_ms: 0,
        wait_durable: false,
    };
    let mut out = Vec::new();
    let len = encode_request(&send.into(), 1, &mut out).unwrap();
    assert!(len <= FRAME_BYTES_MIN as usize, "{len}");
    let decoder = FrameDecoder::new(FrameLimits::new(FRAME_BYTES_MIN).unwrap());
    let frame = decoder.decode(&out).unwrap().unwrap();
    // The zero-copy path: the body is read where it lies.
    let meta = frame.aligned_meta();
    let archived = meta.access::<SendMessage>().unwrap();
    assert_eq!(archived.body.len(), BODY_BYTES_MAX);
}

#[test]
fn record_answers_meta_fits_the_reserve() {
    let pull = PullResult {
        status: PullStatus::Found,
        next_offset: u64::MAX,
        min_offset: u64::MAX,
        max_offset: u64::MAX,
        count: u32::MAX,
        incarnation: 7,
    };
    let mut out = Vec::new();
    let len = encode_frame_head(1, Flags::NONE, &pull, 0, &mut out).unwrap();
    assert!(len - FRAME_HEADER_BYTES <= META_BYTES_RESERVE as usize);
    out.clear();
    let len = encode_frame_head(1, Flags::NONE, &Records { count: 1 }, 0, &mut out).unwrap();
    assert!(len - FRAME_HEADER_BYTES <= META_BYTES_RESERVE as usize);
}

mod props;
