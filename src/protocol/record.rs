//! The stored record: the one byte layout a message has on disk, in a pull answer and in
//! the client's hands. A fixed little-endian header is followed by the topic, the encoded
//! properties and the body. Fields are read in place from the header; nothing is
//! deserialized.
//!
//! ```text
//! offset size field
//!      0    4 total_len          whole record, header included
//!      4    4 magic              RECORD_MAGIC_V1 (also the format version)
//!      8    4 crc32c             over bytes [12, total_len)
//!     12    4 queue_id
//!     16    4 flag               i32, user defined
//!     20    4 sys_flag
//!     24    8 queue_offset
//!     32    8 physical_offset
//!     40    8 born_timestamp_ms  i64
//!     48    8 store_timestamp_ms i64
//!     56   16 born_host          IPv6 or IPv4-mapped address
//!     72    2 born_port
//!     74    2 topic_len
//!     76    4 reconsume_times
//!     80    8 transaction_offset
//!     88    4 properties_len
//!     92    4 body_len
//!     96      topic | properties | body
//! ```

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Magic number and format version of a record: "RMQ" and version 1.
pub const RECORD_MAGIC_V1: u32 = u32::from_le_bytes(*b"RMQ\x01");
/// Magic of the filler that closes a segment when the next record does not fit.
pub const BLANK_MAGIC: u32 = u32::from_le_bytes(*b"RMQ\xff");
/// Size of the fixed header.
pub const HEADER_BYTES: usize = 96;
/// Largest body a message may carry.
pub const BODY_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Largest topic name.
pub const TOPIC_BYTES_MAX: usize = 255;
/// Largest encoded property block.
pub const PROPERTIES_BYTES_MAX: usize = 64 * 1024;
/// Of the property block, what the broker keeps for the properties it adds itself (delay,
/// retry and dead-letter bookkeeping, about 400 bytes at most).
pub const BROKER_PROPERTIES_RESERVE_BYTES: usize = 1024;
/// Largest property block a client may send.
pub const CLIENT_PROPERTIES_BYTES_MAX: usize =
    PROPERTIES_BYTES_MAX - BROKER_PROPERTIES_RESERVE_BYTES;
/// Largest record the log accepts.
pub const RECORD_BYTES_MAX: usize =
    HEADER_BYTES + TOPIC_BYTES_MAX + PROPERTIES_BYTES_MAX + BODY_BYTES_MAX;
/// Smallest possible record (empty topic is refused at encode, but the codec allows it).
pub const RECORD_BYTES_MIN: usize = HEADER_BYTES;
/// In `sys_flag` (as RocketMQ's `TRANSACTION_COMMIT_TYPE`): a record the broker wrote from
/// a transaction's half message (its commit, or its discard's copy), whose transaction
/// offset is where that half is in the log. A client's send never carries it.
pub const SYS_FLAG_TRANSACTION_COMMIT: u32 = 0x8;

/// Most keys of one message (the `KEYS` property, space separated).
pub const KEYS_PER_MESSAGE_MAX: usize = 64;

/// Separates a property name from its value.
pub const PROPERTY_NAME_END: u8 = 0x01;
/// Ends a property value.
pub const PROPERTY_VALUE_END: u8 = 0x02;

/// Well-known property names (RocketMQ's names).
pub mod prop {
    /// Tag of the message, used by tag filters.
    pub const TAGS: &str = "TAGS";
    /// Space-separated keys, indexed by the key index.
    pub const KEYS: &str = "KEYS";
    /// Client-generated unique id.
    pub const UNIQ_KEY: &str = "UNIQ_KEY";
    /// Delay level (1-based; 0 or absent: no delay).
    pub const DELAY: &str = "DELAY";
    /// Delay in ms from the store time (RocketMQ 5 timer messages).
    pub const TIMER_DELAY_MS: &str = "TIMER_DELAY_MS";
    /// Delivery time in ms since the epoch (RocketMQ 5 timer messages).
    pub const TIMER_DELIVER_MS: &str = "TIMER_DELIVER_MS";
    /// Set by the broker on a message held in its schedule: when it is due (ms since the
    /// epoch).
    pub const TIMER_OUT_MS: &str = "TIMER_OUT_MS";
    /// Set by the broker on a message held in its schedule: the topic it is bound for.
    pub const REAL_TOPIC: &str = "REAL_TOPIC";
    /// Set by the broker on a message held in its schedule: the queue it is bound for.
    pub const REAL_QID: &str = "REAL_QID";
    /// On a retried or dead-lettered message: the topic it was first consumed from.
    pub const RETRY_TOPIC: &str = "RETRY_TOPIC";
    /// On a message that was delayed, retried or dead-lettered: the id it was first stored
    /// with.
    pub const ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
    /// The properties that ask for or describe a delay: a delivered (or resent) message
    /// carries none of them.
    pub const DELAY_PROPERTIES: [&str; 6] = [
        DELAY,
        TIMER_DELAY_MS,
        TIMER_DELIVER_MS,
        TIMER_OUT_MS,
        REAL_TOPIC,
        REAL_QID,
    ];
    /// The properties only the broker sets, to say where a message it holds is bound
    /// (`REAL_TOPIC`, `REAL_QID`, `TIMER_OUT_MS`) or where a retried message came from
    /// (`RETRY_TOPIC`): a send carrying one is refused, so that a producer cannot make its
    /// message pass for another topic's (a consumer's `origin_topic`, a dead letter's
    /// topic). (`ORIGIN_MESSAGE_ID` is not among them: `ringmq dlq resend` sends a letter
    /// back with it, so the resent copy names the message first sent.)
    pub const BROKER_SET: [&str; 4] = [REAL_TOPIC, REAL_QID, TIMER_OUT_MS, RETRY_TOPIC];
    /// Wait for the store to be durable before answering.
    pub const WAIT: &str = "WAIT";
    /// `true` on a transaction's half message, as sent: it stays invisible until committed.
    pub const TRAN_MSG: &str = "TRAN_MSG";
    /// The producer group of a transactional message (asked about it by check-backs).
    pub const PRODUCER_GROUP: &str = "PGROUP";
    /// On a committed message: the transaction it was committed by.
    pub const TRANSACTION_ID: &str = "TRAN_ID";
}

const OFF_TOTAL_LEN: usize = 0;
const OFF_MAGIC: usize = 4;
const OFF_CRC: usize = 8;
const OFF_QUEUE_ID: usize = 12;
const OFF_FLAG: usize = 16;
const OFF_SYS_FLAG: usize = 20;
const OFF_QUEUE_OFFSET: usize = 24;
const OFF_PHYSICAL_OFFSET: usize = 32;
const OFF_BORN_TS: usize = 40;
const OFF_STORE_TS: usize = 48;
const OFF_BORN_HOST: usize = 56;
const OFF_BORN_PORT: usize = 72;
const OFF_TOPIC_LEN: usize = 74;
const OFF_RECONSUME: usize = 76;
const OFF_TX_OFFSET: usize = 80;
const OFF_PROPS_LEN: usize = 88;
const OFF_BODY_LEN: usize = 92;
/// The CRC covers everything after the CRC field.
pub const CRC_START: usize = OFF_CRC + 4;

const _: () = assert!(OFF_BODY_LEN + 4 == HEADER_BYTES);
const _: () = assert!(OFF_BORN_PORT == OFF_BORN_HOST + 16);
const _: () = assert!(HEADER_BYTES.is_multiple_of(8));
const _: () = assert!(RECORD_BYTES_MAX < u32::MAX as usize);
const _: () = assert!(TOPIC_BYTES_MAX <= u16::MAX as usize);

/// Why bytes are not a valid record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("bad record magic {found:#010x}, expected {expected:#010x}")]
    BadMagic { found: u32, expected: u32 },
    #[error("bad record length {found}: {reason}")]
    BadLength { found: u32, reason: &'static str },
    #[error("record crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadCrc { stored: u32, computed: u32 },
    #[error("record topic is not UTF-8")]
    BadTopic,
    #[error("invalid message: {0}")]
    Invalid(&'static str),
}

/// The parts of a message the producer chooses; the store adds offsets and the store time.
#[derive(Debug, Clone, Copy)]
pub struct RecordDraft<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub flag: i32,
    pub sys_flag: u32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub reconsume_times: u32,
    pub transaction_offset: u64,
    /// Encoded with [`PropertiesBuilder`] (or bytes taken from another record).
    pub properties: &'a [u8],
    pub body: &'a [u8],
}

/// What the store assigns when a record is appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub queue_offset: u64,
    pub physical_offset: u64,
    pub store_timestamp_ms: i64,
}

impl<'a> RecordDraft<'a> {
    /// A draft of a plain message: no flags, born at time 0 on an unnamed host
    /// (`127.0.0.1:1`), never consumed, outside any transaction (tools, tests, benches).
    pub fn plain(topic: &'a str, queue_id: u32, properties: &'a [u8], body: &'a [u8]) -> Self {
        RecordDraft {
            topic,
            queue_id,
            flag: 0,
            sys_flag: 0,
            born_timestamp_ms: 0,
            born_host: SocketAddr::from(([127, 0, 0, 1], 1)),
            reconsume_times: 0,
            transaction_offset: 0,
            properties,
            body,
        }
    }

    /// Bytes the encoded record takes.
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES + self.topic.len() + self.properties.len() + self.body.len()
    }

    /// Checks the limits a record must respect before it is encoded.
    pub fn validate(&self) -> Result<(), RecordError> {
        if self.topic.is_empty() {
            return Err(RecordError::Invalid("empty topic"));
        }
        if self.topic.len() > TOPIC_BYTES_MAX {
            return Err(RecordError::Invalid("topic longer than 255 bytes"));
        }
        if self.body.len() > BODY_BYTES_MAX {
            return Err(RecordError::Invalid("body larger than 4 MiB"));
        }
        if self.properties.len() > PROPERTIES_BYTES_MAX {
            return Err(RecordError::Invalid("properties larger than 64 KiB"));
        }
        if Properties::new(self.properties).validate().is_err() {
            return Err(RecordError::Invalid("malformed properties"));
        }
        Ok(())
    }

    /// Encodes into `out`, which must be exactly `encoded_len()` bytes, and computes the CRC.
    pub fn encode_into(&self, at: Placement, out: &mut [u8]) {
        let total = self.encoded_len();
        assert_eq!(out.len(), total, "encode_into: buffer size");
        put_u32(out, OFF_TOTAL_LEN, total as u32);
        put_u32(out, OFF_MAGIC, RECORD_MAGIC_V1);
        put_u32(out, OFF_QUEUE_ID, self.queue_id);
        put_u32(out, OFF_FLAG, self.flag as u32);
        put_u32(out, OFF_SYS_FLAG, self.sys_flag);
        put_u64(out, OFF_QUEUE_OFFSET, at.queue_offset);
        put_u64(out, OFF_PHYSICAL_OFFSET, at.physical_offset);
        put_u64(out, OFF_BORN_TS, self.born_timestamp_ms as u64);
        put_u64(out, OFF_STORE_TS, at.store_timestamp_ms as u64);
        let ip = match self.born_host.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        out[OFF_BORN_HOST..OFF_BORN_HOST + 16].copy_from_slice(&ip.octets());
        out[OFF_BORN_PORT..OFF_BORN_PORT + 2].copy_from_slice(&self.born_host.port().to_le_bytes());
        out[OFF_TOPIC_LEN..OFF_TOPIC_LEN + 2]
            .copy_from_slice(&(self.topic.len() as u16).to_le_bytes());
        put_u32(out, OFF_RECONSUME, self.reconsume_times);
        put_u64(out, OFF_TX_OFFSET, self.transaction_offset);
        put_u32(out, OFF_PROPS_LEN, self.properties.len() as u32);
        put_u32(out, OFF_BODY_LEN, self.body.len() as u32);
        let mut at_var = HEADER_BYTES;
        for part in [self.topic.as_bytes(), self.properties, self.body] {
            out[at_var..at_var + part.len()].copy_from_slice(part);
            at_var += part.len();
        }
        let crc = crc32c::crc32c(&out[CRC_START..]);
        put_u32(out, OFF_CRC, crc);
        // Assert the other end of the boundary: what was written reads back.
        debug_assert!(RecordView::parse(out).is_ok());
    }

    /// Encodes into a new vector (tests and tools; the log encodes in place).
    pub fn encode(&self, at: Placement) -> Vec<u8> {
        let mut out = vec![0u8; self.encoded_len()];
        self.encode_into(at, &mut out);
        out
    }
}

fn put_u32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut [u8], at: usize, v: u64) {
    out[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Reads the length and magic of whatever starts at `bytes` (a record or a blank filler).
/// Returns `None` when fewer than 8 bytes are available.
pub fn peek_frame(bytes: &[u8]) -> Option<(u32, u32)> {
    if bytes.len() < 8 {
        return None;
    }
    Some((get_u32(bytes, OFF_TOTAL_LEN), get_u32(bytes, OFF_MAGIC)))
}

/// Where the record starting at `bytes` (its header at least) says it belongs: (queue id,
/// queue offset, topic length). `None` when the bytes are too few or not a record's magic.
/// Nothing else is checked: a lookup by physical offset asks the index first.
pub fn peek_place(bytes: &[u8]) -> Option<(u32, u64, usize)> {
    if bytes.len() < HEADER_BYTES || get_u32(bytes, OFF_MAGIC) != RECORD_MAGIC_V1 {
        return None;
    }
    Some((
        get_u32(bytes, OFF_QUEUE_ID),
        get_u64(bytes, OFF_QUEUE_OFFSET),
        usize::from(get_u16(bytes, OFF_TOPIC_LEN)),
    ))
}

/// Writes a blank filler of `len` bytes (at least 8) that closes a segment.
pub fn encode_blank(out: &mut [u8]) {
    assert!(out.len() >= 8);
    let len = out.len() as u32;
    put_u32(out, OFF_TOTAL_LEN, len);
    put_u32(out, OFF_MAGIC, BLANK_MAGIC);
}

/// A validated record, read in place.
#[derive(Clone, Copy)]
pub struct RecordView<'a> {
    bytes: &'a [u8],
}

impl std::fmt::Debug for RecordView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("topic", &self.topic())
            .field("queue_id", &self.queue_id())
            .field("queue_offset", &self.queue_offset())
            .field("physical_offset", &self.physical_offset())
            .field("body_len", &self.body().len())
            .finish()
    }
}

impl<'a> RecordView<'a> {
    /// Validates the record at the start of `bytes` (length, magic, CRC, part lengths) and
    /// returns it. Trailing bytes after the record are allowed.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, RecordError> {
        let view = Self::parse_unchecked_crc(bytes)?;
        let stored = get_u32(view.bytes, OFF_CRC);
        let computed = crc32c::crc32c(&view.bytes[CRC_START..]);
        if stored != computed {
            return Err(RecordError::BadCrc { stored, computed });
        }
        Ok(view)
    }

    /// Like [`parse`](Self::parse) but without the CRC: for bytes whose CRC was already
    /// verified (a pull answer the broker read from its own verified log is checked by
    /// the client with `parse`).
    pub fn parse_unchecked_crc(bytes: &'a [u8]) -> Result<Self, RecordError> {
        if bytes.len() < HEADER_BYTES {
            return Err(RecordError::Truncated {
                needed: HEADER_BYTES,
                available: bytes.len(),
            });
        }
        let magic = get_u32(bytes, OFF_MAGIC);
        if magic != RECORD_MAGIC_V1 {
            return Err(RecordError::BadMagic {
                found: magic,
                expected: RECORD_MAGIC_V1,
            });
        }
        let total = get_u32(bytes, OFF_TOTAL_LEN);
        if (total as usize) < HEADER_BYTES || total as usize > RECORD_BYTES_MAX {
            return Err(RecordError::BadLength {
                found: total,
                reason: "outside record bounds",
            });
        }
        if bytes.len() < total as usize {
            return Err(RecordError::Truncated {
                needed: total as usize,
                available: bytes.len(),
            });
        }
        let topic_len = get_u16(bytes, OFF_TOPIC_LEN) as usize;
        let props_len = get_u32(bytes, OFF_PROPS_LEN) as usize;
        let body_len = get_u32(bytes, OFF_BODY_LEN) as usize;
        let parts = (HEADER_BYTES as u64) + topic_len as u64 + props_len as u64 + body_len as u64;
        if parts != total as u64 {
            return Err(RecordError::BadLength {
                found: total,
                reason: "parts do not add up",
            });
        }
        let bytes = &bytes[..total as usize];
        if std::str::from_utf8(&bytes[HEADER_BYTES..HEADER_BYTES + topic_len]).is_err() {
            return Err(RecordError::BadTopic);
        }
        Ok(RecordView { bytes })
    }

    /// A view of bytes that [`parse`](Self::parse) accepted whole earlier and that have not
    /// changed since (a received message's accessors), without checking them again.
    pub(crate) fn verified(bytes: &'a [u8]) -> Self {
        debug_assert!(
            Self::parse_unchecked_crc(bytes).is_ok_and(|v| v.bytes.len() == bytes.len()),
            "not one whole record"
        );
        RecordView { bytes }
    }

    /// The record's bytes, exactly as stored.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
    pub fn total_len(&self) -> u32 {
        self.bytes.len() as u32
    }
    pub fn crc(&self) -> u32 {
        get_u32(self.bytes, OFF_CRC)
    }
    pub fn queue_id(&self) -> u32 {
        get_u32(self.bytes, OFF_QUEUE_ID)
    }
    pub fn flag(&self) -> i32 {
        get_u32(self.bytes, OFF_FLAG) as i32
    }
    pub fn sys_flag(&self) -> u32 {
        get_u32(self.bytes, OFF_SYS_FLAG)
    }
    pub fn queue_offset(&self) -> u64 {
        get_u64(self.bytes, OFF_QUEUE_OFFSET)
    }
    pub fn physical_offset(&self) -> u64 {
        get_u64(self.bytes, OFF_PHYSICAL_OFFSET)
    }
    pub fn born_timestamp_ms(&self) -> i64 {
        get_u64(self.bytes, OFF_BORN_TS) as i64
    }
    pub fn store_timestamp_ms(&self) -> i64 {
        get_u64(self.bytes, OFF_STORE_TS) as i64
    }
    pub fn born_host(&self) -> SocketAddr {
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&self.bytes[OFF_BORN_HOST..OFF_BORN_HOST + 16]);
        let v6 = Ipv6Addr::from(ip);
        let ip = match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        };
        SocketAddr::new(ip, get_u16(self.bytes, OFF_BORN_PORT))
    }
    pub fn reconsume_times(&self) -> u32 {
        get_u32(self.bytes, OFF_RECONSUME)
    }
    pub fn transaction_offset(&self) -> u64 {
        get_u64(self.bytes, OFF_TX_OFFSET)
    }
    fn topic_len(&self) -> usize {
        get_u16(self.bytes, OFF_TOPIC_LEN) as usize
    }
    fn props_len(&self) -> usize {
        get_u32(self.bytes, OFF_PROPS_LEN) as usize
    }
    pub fn topic(&self) -> &'a str {
        let raw = &self.bytes[HEADER_BYTES..HEADER_BYTES + self.topic_len()];
        // Checked in parse.
        std::str::from_utf8(raw).unwrap_or("")
    }
    pub fn properties(&self) -> Properties<'a> {
        let start = HEADER_BYTES + self.topic_len();
        Properties::new(&self.bytes[start..start + self.props_len()])
    }
    pub fn body(&self) -> &'a [u8] {
        &self.bytes[HEADER_BYTES + self.topic_len() + self.props_len()..]
    }
    /// The message's tag, if it has one.
    pub fn tags(&self) -> Option<&'a str> {
        self.properties().get(prop::TAGS)
    }
    /// The message's keys (space separated in the KEYS property).
    pub fn keys(&self) -> impl Iterator<Item = &'a str> {
        self.properties()
            .get(prop::KEYS)
            .unwrap_or("")
            .split(' ')
            .filter(|k| !k.is_empty())
    }
}

/// Iterates the records packed one after another in `bytes` (a pull answer or a log range),
/// validating each. Stops with an error at the first bad record.
pub struct RecordIter<'a> {
    rest: &'a [u8],
    verify_crc: bool,
}

impl<'a> RecordIter<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        RecordIter {
            rest: bytes,
            verify_crc: true,
        }
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<RecordView<'a>, RecordError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let parsed = if self.verify_crc {
            RecordView::parse(self.rest)
        } else {
            RecordView::parse_unchecked_crc(self.rest)
        };
        match parsed {
            Ok(view) => {
                self.rest = &self.rest[view.bytes.len()..];
                Some(Ok(view))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// A property block read in place: `name 0x01 value 0x02` repeated.
#[derive(Clone, Copy, Debug)]
pub struct Properties<'a> {
    bytes: &'a [u8],
}

impl<'a> Properties<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Properties { bytes }
    }
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
    /// Checks the block is well formed UTF-8 pairs.
    pub fn validate(&self) -> Result<(), RecordError> {
        self.validate_finding(&[]).map(|_| ())
    }

    /// [`validate`](Self::validate), answering the first property named in `names` too,
    /// in the same pass (a send's check for the names only the broker sets).
    pub fn validate_finding(&self, names: &[&str]) -> Result<Option<&'a str>, RecordError> {
        let mut found = None;
        let mut rest = self.bytes;
        while !rest.is_empty() {
            let name_end = rest
                .iter()
                .position(|&b| b == PROPERTY_NAME_END)
                .ok_or(RecordError::Invalid("property without value"))?;
            let after = &rest[name_end + 1..];
            let value_end = after
                .iter()
                .position(|&b| b == PROPERTY_VALUE_END)
                .ok_or(RecordError::Invalid("unterminated property value"))?;
            let name = &rest[..name_end];
            let value = &after[..value_end];
            if name.is_empty()
                || name.contains(&PROPERTY_VALUE_END)
                || value.contains(&PROPERTY_NAME_END)
            {
                return Err(RecordError::Invalid("malformed property"));
            }
            let (Ok(name), Ok(_)) = (std::str::from_utf8(name), std::str::from_utf8(value)) else {
                return Err(RecordError::Invalid("property is not UTF-8"));
            };
            if found.is_none() && names.contains(&name) {
                found = Some(name);
            }
            rest = &after[value_end + 1..];
        }
        Ok(found)
    }

    /// The (name, value) pairs as bytes, up to the first malformed one (a malformed tail is
    /// skipped).
    fn pairs(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        let mut rest = self.bytes;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let name_end = rest.iter().position(|&b| b == PROPERTY_NAME_END)?;
            let after = &rest[name_end + 1..];
            let value_end = after.iter().position(|&b| b == PROPERTY_VALUE_END)?;
            let pair = (&rest[..name_end], &after[..value_end]);
            rest = &after[value_end + 1..];
            Some(pair)
        })
    }

    /// The pairs whose name and value are UTF-8.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.pairs().filter_map(|(name, value)| {
            Some((
                std::str::from_utf8(name).ok()?,
                std::str::from_utf8(value).ok()?,
            ))
        })
    }

    /// In one pass over the pairs, `values[i]` becomes the value of the first pair whose
    /// name `index` maps to `i` and whose value is UTF-8 (as [`get`](Self::get) finds it);
    /// the pass ends once every slot holds one.
    pub fn values_of(
        &self,
        index: impl Fn(&[u8]) -> Option<usize>,
        values: &mut [Option<&'a str>],
    ) {
        let mut empty = values.iter().filter(|v| v.is_none()).count();
        for (name, value) in self.pairs() {
            if empty == 0 {
                break;
            }
            if let Some(slot @ None) = index(name).and_then(|i| values.get_mut(i)) {
                if let Ok(value) = std::str::from_utf8(value) {
                    *slot = Some(value);
                    empty -= 1;
                }
            }
        }
    }

    /// The value of the first pair named `name` whose value is UTF-8 (as [`iter`](Self::iter)
    /// finds it; only the values of pairs so named are checked).
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.pairs()
            .filter(|(n, _)| *n == name.as_bytes())
            .find_map(|(_, value)| std::str::from_utf8(value).ok())
    }
}

/// Builds a property block.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub struct PropertiesBuilder {
    bytes: Vec<u8>,
}

impl PropertiesBuilder {
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a property; names and values may not contain the 0x01 and 0x02 separators.
    pub fn put(&mut self, name: &str, value: &str) -> Result<&mut Self, RecordError> {
        let bad = |s: &str| {
            s.bytes()
                .any(|b| b == PROPERTY_NAME_END || b == PROPERTY_VALUE_END)
        };
        if name.is_empty() || bad(name) || bad(value) {
            return Err(RecordError::Invalid(
                "property name or value contains a separator",
            ));
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(PROPERTY_NAME_END);
        self.bytes.extend_from_slice(value.as_bytes());
        self.bytes.push(PROPERTY_VALUE_END);
        Ok(self)
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft<'a>(topic: &'a str, props: &'a [u8], body: &'a [u8]) -> RecordDraft<'a> {
        RecordDraft {
            topic,
            queue_id: 3,
            flag: -7,
            sys_flag: 1,
            born_timestamp_ms: 1_700_000_000_000,
            born_host: "10.1.2.3:4567".parse().unwrap(),
            reconsume_times: 2,
            transaction_offset: 99,
            properties: props,
            body,
        }
    }

    #[test]
    fn round_trip_all_fields() {
        let mut p = PropertiesBuilder::new();
        p.put(prop::TAGS, "TagA")
            .unwrap()
            .put(prop::KEYS, "k1 k2")
            .unwrap();
        let d = draft("orders", p.as_bytes(), b"hello");
        let at = Placement {
            queue_offset: 5,
            physical_offset: 4096,
            store_timestamp_ms: 42,
        };
        let bytes = d.encode(at);
        let v = RecordView::parse(&bytes).unwrap();
        assert_eq!(v.topic(), "orders");
        assert_eq!(v.queue_id(), 3);
        assert_eq!(v.flag(), -7);
        assert_eq!(v.sys_flag(), 1);
        assert_eq!(v.queue_offset(), 5);
        assert_eq!(v.physical_offset(), 4096);
        assert_eq!(v.store_timestamp_ms(), 42);
        assert_eq!(v.born_timestamp_ms(), 1_700_000_000_000);
        assert_eq!(
            v.born_host(),
            "10.1.2.3:4567".parse::<std::net::SocketAddr>().unwrap()
        );
        assert_eq!(v.reconsume_times(), 2);
        assert_eq!(v.transaction_offset(), 99);
        assert_eq!(v.tags(), Some("TagA"));
        assert_eq!(v.keys().collect::<Vec<_>>(), vec!["k1", "k2"]);
        assert_eq!(v.body(), b"hello");
    }

    #[test]
    fn crc_catches_a_flipped_byte() {
        let d = draft("t", b"", b"body bytes");
        let mut bytes = d.encode(Placement {
            queue_offset: 0,
            physical_offset: 0,
            store_timestamp_ms: 0,
        });
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        assert!(matches!(
            RecordView::parse(&bytes),
            Err(RecordError::BadCrc { .. })
        ));
    }

    #[test]
    fn oversize_body_is_invalid() {
        let body = vec![0u8; BODY_BYTES_MAX + 1];
        let d = draft("t", b"", &body);
        assert_eq!(
            d.validate(),
            Err(RecordError::Invalid("body larger than 4 MiB"))
        );
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    fn props_strategy() -> impl Strategy<Value = Vec<(String, String)>> {
        proptest::collection::vec(("[A-Za-z_][A-Za-z0-9_]{0,12}", "[ -~]{0,40}"), 0..6)
    }

    proptest! {
        // No case count here: CI raises PROPTEST_CASES for the fuzz_ tests.
        #[test]
        fn fuzz_record_view_of_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = RecordView::parse(&bytes);
            let _ = RecordView::parse_unchecked_crc(&bytes);
            for r in RecordIter::new(&bytes) {
                let _ = r;
            }
            let _ = Properties::new(&bytes).validate();
            let _ = Properties::new(&bytes).iter().count();
        }

        #[test]
        fn fuzz_property_get_finds_what_iter_finds(
            bytes in proptest::collection::vec(prop_oneof![Just(1u8), Just(2u8), Just(b'A'), Just(0xff), any::<u8>()], 0..256)
        ) {
            let props = Properties::new(&bytes);
            let names: Vec<&str> = props.iter().map(|(n, _)| n).chain(["A", "TAGS"]).collect();
            for name in &names {
                let by_iter = props.iter().find(|(n, _)| n == name).map(|(_, v)| v);
                prop_assert_eq!(props.get(name), by_iter, "{}", name);
            }
            // One pass for them all finds what a `get` of each finds (repeated names too).
            let mut values = vec![None; names.len()];
            let index = |n: &[u8]| names.iter().position(|m| m.as_bytes() == n);
            props.values_of(index, &mut values);
            for (name, value) in names.iter().zip(&values) {
                let first = names.iter().position(|m| m == name).unwrap();
                prop_assert_eq!(values[first], props.get(name), "{}", name);
                if first == names.iter().rposition(|m| m == name).unwrap() {
                    prop_assert_eq!(*value, props.get(name), "{}", name);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn encode_decode_identity(
            topic in "[A-Za-z0-9_%|-]{1,64}",
            queue_id in any::<u32>(),
            flag in any::<i32>(),
            sys_flag in any::<u32>(),
            born in any::<i64>(),
            port in any::<u16>(),
            ip in any::<[u8; 4]>(),
            reconsume in any::<u32>(),
            tx in any::<u64>(),
            props in props_strategy(),
            body in proptest::collection::vec(any::<u8>(), 0..4096),
            qo in any::<u64>(),
            phys in any::<u64>(),
            store_ts in any::<i64>(),
        ) {
            let mut pb = PropertiesBuilder::new();
            for (k, v) in &props {
                pb.put(k, v).unwrap();
            }
            let born_host = SocketAddr::from((ip, port));
            let d = RecordDraft {
                topic: &topic, queue_id, flag, sys_flag, born_timestamp_ms: born, born_host,
                reconsume_times: reconsume, transaction_offset: tx, properties: pb.as_bytes(), body: &body,
            };
            prop_assert!(d.validate().is_ok());
            let at = Placement { queue_offset: qo, physical_offset: phys, store_timestamp_ms: store_ts };
            let bytes = d.encode(at);
            let v = RecordView::parse(&bytes).unwrap();
            prop_assert_eq!(v.topic(), topic.as_str());
            prop_assert_eq!(v.queue_id(), queue_id);
            prop_assert_eq!(v.flag(), flag);
            prop_assert_eq!(v.sys_flag(), sys_flag);
            prop_assert_eq!(v.born_timestamp_ms(), born);
            prop_assert_eq!(v.born_host(), born_host);
            prop_assert_eq!(v.reconsume_times(), reconsume);
            prop_assert_eq!(v.transaction_offset(), tx);
            prop_assert_eq!(v.queue_offset(), qo);
            prop_assert_eq!(v.physical_offset(), phys);
            prop_assert_eq!(v.store_timestamp_ms(), store_ts);
            prop_assert_eq!(v.body(), &body[..]);
            let got: Vec<(String, String)> =
                v.properties().iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
            prop_assert_eq!(got, props);
            prop_assert_eq!(v.total_len() as usize, bytes.len());
            // Every truncation is an error, never a panic.
            for cut in 0..bytes.len() {
                prop_assert!(RecordView::parse(&bytes[..cut]).is_err());
            }
        }

        #[test]
        fn flipped_bytes_are_detected(
            body in proptest::collection::vec(any::<u8>(), 1..512),
            at in any::<proptest::sample::Index>(),
            bit in 0u8..8,
        ) {
            let d = RecordDraft::plain("t", 1, b"", &body);
            let mut bytes = d.encode(Placement { queue_offset: 0, physical_offset: 0, store_timestamp_ms: 0 });
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
            // A single flipped bit anywhere is caught: by the length, magic or CRC checks.
            prop_assert!(RecordView::parse(&bytes).is_err());
        }
    }
}
