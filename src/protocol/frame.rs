//! Frames: a fixed 24-byte little-endian header, then the payload.
//!
//! ```text
//! offset size field
//!      0    4 frame_len    header + payload, in bytes
//!      4    1 magic        FRAME_MAGIC ('R')
//!      5    1 version      PROTOCOL_VERSION
//!      6    2 kind         see `Kind`
//!      8    8 request_id   chosen by the client, echoed by the response (pipelining)
//!     16    4 flags        bit 0 response, 1 error, 2 oneway, 3 push; others must be 0
//!     20    4 meta_len     length of the rkyv meta part at the start of the payload
//!     24      payload      meta (rkyv) || raw tail (stored records, only for some responses)
//! ```
//!
//! Decoding checks every header field, and the lengths before anything is allocated. The meta
//! part is read with rkyv's checked access: garbage gives a [`ProtocolError`], never a panic
//! or undefined behaviour. Nothing here does I/O: a reader (glommio or tokio) hands in bytes.

use bytes::Bytes;
use rkyv::rancor;
use rkyv::ser::{Positional, Writer};
use rkyv::util::AlignedVec;

mod parts;
pub use parts::{encode_frame_parts, FrameParts, ShareBytes, SharedBytes};

use crate::protocol::record::RECORD_BYTES_MAX;

use super::error::ProtocolError;
use super::kind::{Kind, KindClass};

/// Size of the fixed frame header.
pub const FRAME_HEADER_BYTES: usize = 24;
/// First byte of the magic/version field.
pub const FRAME_MAGIC: u8 = b'R';
/// Second byte of the magic/version field: the protocol version this side speaks.
pub const PROTOCOL_VERSION: u8 = 6;

/// Room kept in a frame for a meta part beside the largest record (pull answers, sends).
pub const META_BYTES_RESERVE: u32 = 4096;
/// Smallest frame limit a peer may configure: one record of the largest size, with its meta
/// part, must always fit, or a pull could never get past that record.
pub const FRAME_BYTES_MIN: u32 =
    FRAME_HEADER_BYTES as u32 + RECORD_BYTES_MAX as u32 + META_BYTES_RESERVE;
/// Extra room above one largest record in the default limit (batches, several records).
pub const FRAME_SLACK_BYTES: u32 = 1024 * 1024;
/// Default frame limit: a largest record plus 1 MiB, a little over 5 MiB.
pub const FRAME_BYTES_MAX_DEFAULT: u32 = RECORD_BYTES_MAX as u32 + FRAME_SLACK_BYTES;
/// Largest frame limit a peer may configure.
pub const FRAME_BYTES_CEILING: u32 = 1 << 30;

/// Alignment the meta part needs to be read in place. Every archived message type is checked
/// against it at compile time (in `messages`); a meta slice at a less aligned address is
/// copied into an aligned buffer first.
pub const META_ALIGN: usize = 8;
/// Alignment of the buffer a misaligned meta part is copied into.
const META_COPY_ALIGN: usize = 16;

const OFF_FRAME_LEN: usize = 0;
const OFF_MAGIC: usize = 4;
const OFF_VERSION: usize = 5;
const OFF_KIND: usize = 6;
const OFF_REQUEST_ID: usize = 8;
const OFF_FLAGS: usize = 16;
const OFF_META_LEN: usize = 20;

const _: () = assert!(OFF_META_LEN + 4 == FRAME_HEADER_BYTES);
const _: () = assert!(OFF_KIND == OFF_MAGIC + 2 && OFF_VERSION == OFF_MAGIC + 1);
const _: () = assert!(OFF_REQUEST_ID.is_multiple_of(8) && FRAME_HEADER_BYTES.is_multiple_of(8));
// The meta part starts right after the header; keeping the header a multiple of the meta
// alignment means a frame read into an aligned buffer is read in place, never copied.
const _: () = assert!(FRAME_HEADER_BYTES.is_multiple_of(META_ALIGN));
const _: () = assert!(META_COPY_ALIGN.is_multiple_of(META_ALIGN));
const _: () = assert!((RECORD_BYTES_MAX as u64) < FRAME_BYTES_MIN as u64);
const _: () = assert!(FRAME_BYTES_MIN <= FRAME_BYTES_MAX_DEFAULT);
const _: () = assert!(FRAME_BYTES_MAX_DEFAULT <= FRAME_BYTES_CEILING);
const _: () = assert!(FRAME_BYTES_CEILING as u64 <= isize::MAX as u64);

/// The flags word of a frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(u32);

impl Flags {
    pub const NONE: Flags = Flags(0);
    /// The frame answers a request.
    pub const RESPONSE: Flags = Flags(1 << 0);
    /// The frame is an error response.
    pub const ERROR: Flags = Flags(1 << 1);
    /// The request expects no reply.
    pub const ONEWAY: Flags = Flags(1 << 2);
    /// The frame is a notification the broker pushes unasked.
    pub const PUSH: Flags = Flags(1 << 3);
    /// Every bit this version defines.
    pub const KNOWN: Flags = Flags(0b1111);

    pub fn bits(self) -> u32 {
        self.0
    }
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn is_response(self) -> bool {
        self.contains(Flags::RESPONSE)
    }
    pub fn is_error(self) -> bool {
        self.contains(Flags::ERROR)
    }
    pub fn is_oneway(self) -> bool {
        self.contains(Flags::ONEWAY)
    }
    pub fn is_push(self) -> bool {
        self.contains(Flags::PUSH)
    }

    /// The bits a frame of `kind` must carry; the encoder adds them itself.
    pub fn required_for(kind: Kind) -> Flags {
        match kind.class() {
            KindClass::Request => Flags::NONE,
            KindClass::Response if kind == Kind::Error => Flags(Flags::RESPONSE.0 | Flags::ERROR.0),
            KindClass::Response => Flags::RESPONSE,
            KindClass::Push => Flags::PUSH,
        }
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        Flags(self.0 | rhs.0)
    }
}

/// Checks that `flags` agree with `kind`: the same rule on both ends of the wire.
fn check_flags(kind: Kind, flags: u32) -> Result<Flags, ProtocolError> {
    let bad = |reason| ProtocolError::BadFlags {
        kind,
        flags,
        reason,
    };
    if flags & !Flags::KNOWN.0 != 0 {
        return Err(bad("unknown flag bits are set"));
    }
    let f = Flags(flags);
    let class = kind.class();
    if f.is_response() != (class == KindClass::Response) {
        return Err(bad(
            "the response flag must be set on responses and only there",
        ));
    }
    if f.is_error() != (kind == Kind::Error) {
        return Err(bad(
            "the error flag must be set on error responses and only there",
        ));
    }
    if f.is_push() != (class == KindClass::Push) {
        return Err(bad(
            "the push flag must be set on pushed frames and only there",
        ));
    }
    if f.is_oneway() && class != KindClass::Request {
        return Err(bad("only a request can be oneway"));
    }
    Ok(f)
}

/// The frame size limit a peer enforces. Its field carries an invariant (within
/// [`FRAME_BYTES_MIN`]`..=`[`FRAME_BYTES_CEILING`]), hence private.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    frame_bytes_max: u32,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        }
    }
}

impl FrameLimits {
    /// A limit of `frame_bytes_max` bytes per frame, header included.
    pub fn new(frame_bytes_max: u32) -> Result<FrameLimits, ProtocolError> {
        if !(FRAME_BYTES_MIN..=FRAME_BYTES_CEILING).contains(&frame_bytes_max) {
            return Err(ProtocolError::BadLimit {
                found: frame_bytes_max,
                min: FRAME_BYTES_MIN,
                max: FRAME_BYTES_CEILING,
            });
        }
        Ok(FrameLimits { frame_bytes_max })
    }

    /// Largest frame, header included.
    pub fn frame_bytes_max(&self) -> u32 {
        self.frame_bytes_max
    }

    /// Largest raw tail a response may carry: a pull stops adding records before the total
    /// would pass it. Always at least one record of the largest size.
    pub fn records_bytes_max(&self) -> u32 {
        self.frame_bytes_max - FRAME_HEADER_BYTES as u32 - META_BYTES_RESERVE
    }
}

/// A decoded, checked frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    frame_len: u32,
    kind: Kind,
    request_id: u64,
    flags: Flags,
    meta_len: u32,
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

/// Checks every header field whose bytes are present in `bytes` (which may be shorter than a
/// header), in a fixed order. Returns the header once all 24 bytes are there. Checking a
/// partial header lets a server drop a peer that speaks another protocol without waiting
/// for 24 bytes that may never come.
fn decode_prefix(bytes: &[u8], frame_bytes_max: u32) -> Result<Option<FrameHeader>, ProtocolError> {
    let have = bytes.len().min(FRAME_HEADER_BYTES);
    if have > OFF_MAGIC && bytes[OFF_MAGIC] != FRAME_MAGIC {
        return Err(ProtocolError::BadMagic {
            found: bytes[OFF_MAGIC],
            expected: FRAME_MAGIC,
        });
    }
    if have > OFF_VERSION && bytes[OFF_VERSION] != PROTOCOL_VERSION {
        return Err(ProtocolError::UnsupportedVersion {
            found: bytes[OFF_VERSION],
            supported: PROTOCOL_VERSION,
        });
    }
    if have < OFF_FRAME_LEN + 4 {
        return Ok(None);
    }
    let frame_len = get_u32(bytes, OFF_FRAME_LEN);
    if (frame_len as usize) < FRAME_HEADER_BYTES {
        return Err(ProtocolError::FrameTooSmall {
            len: frame_len,
            min: FRAME_HEADER_BYTES as u32,
        });
    }
    if frame_len > frame_bytes_max {
        return Err(ProtocolError::FrameTooLarge {
            len: frame_len as u64,
            max: frame_bytes_max,
        });
    }
    if have < OFF_KIND + 2 {
        return Ok(None);
    }
    let raw_kind = get_u16(bytes, OFF_KIND);
    let kind = Kind::from_u16(raw_kind).ok_or(ProtocolError::UnknownKind(raw_kind))?;
    if have < OFF_FLAGS + 4 {
        return Ok(None);
    }
    let flags = check_flags(kind, get_u32(bytes, OFF_FLAGS))?;
    if have < FRAME_HEADER_BYTES {
        return Ok(None);
    }
    let meta_len = get_u32(bytes, OFF_META_LEN);
    let payload_len = frame_len - FRAME_HEADER_BYTES as u32;
    if meta_len > payload_len {
        return Err(ProtocolError::MetaTooLong {
            meta_len,
            payload_len,
        });
    }
    if !kind.carries_records() && meta_len != payload_len {
        return Err(ProtocolError::UnexpectedTail {
            kind,
            tail_len: (payload_len - meta_len) as usize,
        });
    }
    Ok(Some(FrameHeader {
        frame_len,
        kind,
        request_id: get_u64(bytes, OFF_REQUEST_ID),
        flags,
        meta_len,
    }))
}

impl FrameHeader {
    /// Decodes and checks the header at the start of `bytes`: magic, version, length bounds
    /// (against `limits`), kind, flags, meta length. Nothing is allocated.
    pub fn decode(bytes: &[u8], limits: &FrameLimits) -> Result<FrameHeader, ProtocolError> {
        match decode_prefix(bytes, limits.frame_bytes_max)? {
            Some(header) => Ok(header),
            None => Err(ProtocolError::Truncated {
                needed: FRAME_HEADER_BYTES,
                available: bytes.len(),
            }),
        }
    }

    /// The whole frame, header included.
    pub fn frame_len(&self) -> u32 {
        self.frame_len
    }
    pub fn kind(&self) -> Kind {
        self.kind
    }
    pub fn request_id(&self) -> u64 {
        self.request_id
    }
    pub fn flags(&self) -> Flags {
        self.flags
    }
    /// Bytes of the rkyv meta part.
    pub fn meta_len(&self) -> u32 {
        self.meta_len
    }
    /// Bytes after the header: meta part and raw tail.
    pub fn payload_len(&self) -> usize {
        self.frame_len as usize - FRAME_HEADER_BYTES
    }
    /// Bytes of raw records after the meta part.
    pub fn tail_len(&self) -> usize {
        self.payload_len() - self.meta_len as usize
    }

    fn write(&self, out: &mut [u8]) {
        assert_eq!(out.len(), FRAME_HEADER_BYTES, "frame header: buffer size");
        out[OFF_FRAME_LEN..OFF_FRAME_LEN + 4].copy_from_slice(&self.frame_len.to_le_bytes());
        out[OFF_MAGIC] = FRAME_MAGIC;
        out[OFF_VERSION] = PROTOCOL_VERSION;
        out[OFF_KIND..OFF_KIND + 2].copy_from_slice(&(self.kind as u16).to_le_bytes());
        out[OFF_REQUEST_ID..OFF_REQUEST_ID + 8].copy_from_slice(&self.request_id.to_le_bytes());
        out[OFF_FLAGS..OFF_FLAGS + 4].copy_from_slice(&self.flags.0.to_le_bytes());
        out[OFF_META_LEN..OFF_META_LEN + 4].copy_from_slice(&self.meta_len.to_le_bytes());
    }
}

/// Finds whole frames in a receive buffer. It keeps no state and does no I/O: a glommio
/// server or a tokio client reads into its own buffer and asks, after each read, whether a
/// whole frame is at the front.
#[derive(Debug, Clone, Copy, Default)]
pub struct FrameDecoder {
    limits: FrameLimits,
}

impl FrameDecoder {
    pub fn new(limits: FrameLimits) -> FrameDecoder {
        FrameDecoder { limits }
    }

    pub fn limits(&self) -> &FrameLimits {
        &self.limits
    }

    /// `Ok(None)`: `buf` holds only the start of a frame (what is there is valid so far); read
    /// more. `Ok(Some(frame))`: the first `frame.frame_len()` bytes of `buf` are a whole frame;
    /// consume them. `Err`: the peer sent a bad frame; answer with an error frame and close.
    pub fn decode<'a>(&self, buf: &'a [u8]) -> Result<Option<Frame<'a>>, ProtocolError> {
        let Some(header) = decode_prefix(buf, self.limits.frame_bytes_max)? else {
            return Ok(None);
        };
        let frame_len = header.frame_len as usize;
        if buf.len() < frame_len {
            return Ok(None);
        }
        Ok(Some(Frame {
            header,
            payload: &buf[FRAME_HEADER_BYTES..frame_len],
        }))
    }

    /// How many bytes `buf` must hold before [`decode`](Self::decode) can return a frame: the
    /// header size while the header is incomplete, then the frame length (already checked
    /// against the limit, so a reader may reserve it).
    pub fn bytes_needed(&self, buf: &[u8]) -> Result<usize, ProtocolError> {
        Ok(match decode_prefix(buf, self.limits.frame_bytes_max)? {
            None => FRAME_HEADER_BYTES,
            Some(header) => header.frame_len as usize,
        })
    }
}

/// One whole frame: a checked header and its payload, borrowed from the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    header: FrameHeader,
    payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// A frame from a header and a payload read separately (read the header, then exactly
    /// `header.payload_len()` bytes).
    pub fn new(header: FrameHeader, payload: &'a [u8]) -> Result<Frame<'a>, ProtocolError> {
        if payload.len() != header.payload_len() {
            return Err(ProtocolError::PayloadLength {
                expected: header.payload_len(),
                found: payload.len(),
            });
        }
        Ok(Frame { header, payload })
    }

    pub fn header(&self) -> &FrameHeader {
        &self.header
    }
    pub fn kind(&self) -> Kind {
        self.header.kind
    }
    pub fn request_id(&self) -> u64 {
        self.header.request_id
    }
    /// Bytes this frame takes in the receive buffer.
    pub fn frame_len(&self) -> usize {
        self.header.frame_len as usize
    }
    /// Meta part and raw tail.
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
    /// The rkyv meta part, as received (possibly misaligned).
    pub fn meta(&self) -> &'a [u8] {
        &self.payload[..self.header.meta_len as usize]
    }
    /// The raw records after the meta part (empty for most kinds).
    pub fn tail(&self) -> &'a [u8] {
        &self.payload[self.header.meta_len as usize..]
    }
    /// The meta part, aligned for in-place access.
    pub fn aligned_meta(&self) -> AlignedMeta<'a> {
        AlignedMeta::new(self.kind(), self.meta())
    }
    /// Deserializes the meta part as `M`, which must be this frame's kind.
    pub fn decode_meta<M: Message>(&self) -> Result<M, ProtocolError> {
        self.aligned_meta().deserialize::<M>()
    }
}

/// The meta part of a frame at an address rkyv can read: borrowed when the received bytes
/// are aligned, else copied once into an aligned buffer.
pub struct AlignedMeta<'a> {
    kind: Kind,
    bytes: MetaBytes<'a>,
}

enum MetaBytes<'a> {
    Borrowed(&'a [u8]),
    Copied(AlignedVec<META_COPY_ALIGN>),
}

impl<'a> AlignedMeta<'a> {
    pub fn new(kind: Kind, meta: &'a [u8]) -> AlignedMeta<'a> {
        let bytes = if (meta.as_ptr() as usize).is_multiple_of(META_ALIGN) {
            MetaBytes::Borrowed(meta)
        } else {
            let mut copy = AlignedVec::<META_COPY_ALIGN>::with_capacity(meta.len());
            copy.extend_from_slice(meta);
            MetaBytes::Copied(copy)
        };
        AlignedMeta { kind, bytes }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.bytes {
            MetaBytes::Borrowed(b) => b,
            MetaBytes::Copied(v) => v.as_slice(),
        }
    }

    /// Whether the received bytes were misaligned and had to be copied.
    pub fn is_copied(&self) -> bool {
        matches!(self.bytes, MetaBytes::Copied(_))
    }

    /// Reads the meta part in place, after rkyv's validation: the zero-copy path (a send's
    /// body is read where it lies).
    pub fn access<M: Message>(&self) -> Result<&M::Archived, ProtocolError> {
        self.check_kind::<M>()?;
        M::access_meta(self.as_bytes()).map_err(|_| ProtocolError::BadPayload {
            kind: self.kind,
            reason: M::explain_meta(self.as_bytes()),
        })
    }

    /// Validates and deserializes the meta part into an owned `M`.
    pub fn deserialize<M: Message>(&self) -> Result<M, ProtocolError> {
        self.check_kind::<M>()?;
        M::read_meta(self.as_bytes()).map_err(|_| ProtocolError::BadPayload {
            kind: self.kind,
            reason: M::explain_meta(self.as_bytes()),
        })
    }

    fn check_kind<M: Message>(&self) -> Result<(), ProtocolError> {
        if self.kind != M::KIND {
            return Err(ProtocolError::KindMismatch {
                expected: M::KIND,
                found: self.kind,
            });
        }
        Ok(())
    }
}

/// A type that travels as the meta part of frames of one kind. Implemented for every message
/// type in `messages` (by a macro, which also checks the archived alignment).
pub trait Message: rkyv::Archive + Sized {
    /// The frame kind this type is the meta part of.
    const KIND: Kind;
    /// Appends the rkyv form to `out`, with positions relative to where it starts.
    fn write_meta(&self, out: &mut Vec<u8>) -> Result<(), rancor::Error>;
    /// Like [`write_meta`](Self::write_meta), but [`SharedBytes`] fields (message bodies)
    /// are not copied: each is recorded in `shared` with the index in `out` where it
    /// belongs ([`FrameParts`]).
    fn write_meta_parts(
        &self,
        out: &mut Vec<u8>,
        shared: &mut Vec<(usize, Bytes)>,
    ) -> Result<(), rancor::Error>;
    /// Validates `bytes` (aligned to [`META_ALIGN`]) and returns the archived value.
    fn access_meta(bytes: &[u8]) -> Result<&Self::Archived, rancor::Error>;
    /// Validates and deserializes `bytes` (aligned to [`META_ALIGN`]).
    fn read_meta(bytes: &[u8]) -> Result<Self, rancor::Error>;
    /// About how many bytes the meta part takes (0: small), so that an encoder can size
    /// its buffer once instead of growing it while copying message bodies in.
    fn meta_len_hint(&self) -> usize {
        0
    }
    /// Why `bytes` are not a valid meta part, in words (the failure path only: rkyv's
    /// fast error type says nothing in release builds).
    fn explain_meta(bytes: &[u8]) -> String;
}

/// An rkyv writer appending to a vector that may already hold other bytes (the frame header,
/// earlier frames). Positions count from where the meta part starts, so alignment padding is
/// right for a reader that sees the meta part alone.
/// [`SharedBytes`] fields are copied in, or, for [`Message::write_meta_parts`], kept aside in
/// `shared` (positions count them as if they were in `out`).
pub(crate) struct MetaWriter<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
    shared: Option<&'a mut Vec<(usize, Bytes)>>,
    shared_len: usize,
}

impl<'a> MetaWriter<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>) -> MetaWriter<'a> {
        let start = out.len();
        MetaWriter {
            out,
            start,
            shared: None,
            shared_len: 0,
        }
    }

    /// A writer that keeps shared bytes aside in `shared`, with the index in `out` where
    /// each belongs.
    pub(crate) fn with_parts(
        out: &'a mut Vec<u8>,
        shared: &'a mut Vec<(usize, Bytes)>,
    ) -> MetaWriter<'a> {
        MetaWriter {
            shared: Some(shared),
            ..MetaWriter::new(out)
        }
    }
}

impl Positional for MetaWriter<'_> {
    fn pos(&self) -> usize {
        self.out.len() - self.start + self.shared_len
    }
}

impl<E> Writer<E> for MetaWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), E> {
        self.out.extend_from_slice(bytes);
        Ok(())
    }
}

impl ShareBytes for MetaWriter<'_> {
    fn share(&mut self, bytes: &Bytes) {
        match &mut self.shared {
            None => self.out.extend_from_slice(bytes),
            Some(_) if bytes.is_empty() => {}
            Some(shared) => {
                self.shared_len += bytes.len();
                shared.push((self.out.len(), bytes.clone()));
            }
        }
    }
}

/// Appends to `out` the header and meta part of a frame whose raw tail of `tail_len` bytes
/// the caller writes next (a pull answer gathers stored records from the log without copying
/// them into one buffer first). Returns the whole frame's length.
///
/// `flags` may add [`Flags::ONEWAY`] to a request; the response, error and push bits follow
/// from `M::KIND` and are added here. On error `out` is left as it was.
pub fn encode_frame_head<M: Message>(
    request_id: u64,
    flags: Flags,
    meta: &M,
    tail_len: usize,
    out: &mut Vec<u8>,
) -> Result<usize, ProtocolError> {
    encode_head_with(M::KIND, request_id, flags, tail_len, out, |out| {
        meta.write_meta(out)?;
        Ok(0)
    })
}

/// [`encode_frame_head`] with the meta part written by `write_meta`, which returns how many
/// of its bytes it kept aside (shared, not in `out`).
fn encode_head_with(
    kind: Kind,
    request_id: u64,
    flags: Flags,
    tail_len: usize,
    out: &mut Vec<u8>,
    write_meta: impl FnOnce(&mut Vec<u8>) -> Result<usize, rancor::Error>,
) -> Result<usize, ProtocolError> {
    let flags = check_flags(kind, (flags | Flags::required_for(kind)).0)?;
    if tail_len > 0 && !kind.carries_records() {
        return Err(ProtocolError::UnexpectedTail { kind, tail_len });
    }
    let start = out.len();
    out.resize(start + FRAME_HEADER_BYTES, 0);
    let meta_start = out.len();
    let kept_aside = match write_meta(out) {
        Ok(n) => n,
        Err(e) => {
            out.truncate(start);
            return Err(ProtocolError::Encode {
                kind,
                reason: e.to_string(),
            });
        }
    };
    let meta_len = out.len() - meta_start + kept_aside;
    let frame_len = (FRAME_HEADER_BYTES + meta_len) as u64 + tail_len as u64;
    if frame_len > u32::MAX as u64 {
        out.truncate(start);
        return Err(ProtocolError::FrameTooLarge {
            len: frame_len,
            max: u32::MAX,
        });
    }
    let header = FrameHeader {
        frame_len: frame_len as u32,
        kind,
        request_id,
        flags,
        meta_len: meta_len as u32,
    };
    header.write(&mut out[start..meta_start]);
    // Assert the other end of the boundary: the header reads back as written.
    debug_assert_eq!(
        decode_prefix(&out[start..meta_start], u32::MAX),
        Ok(Some(header))
    );
    Ok(frame_len as usize)
}

/// Appends one whole frame to `out`: header, meta part, then `raw_tail` (stored records;
/// only record-carrying response kinds may have one). Returns the frame's length; the caller
/// compares it with the peer's [`FrameLimits`]. On error `out` is left as it was.
pub fn encode_frame<M: Message>(
    request_id: u64,
    flags: Flags,
    meta: &M,
    raw_tail: &[u8],
    out: &mut Vec<u8>,
) -> Result<usize, ProtocolError> {
    let frame_len = encode_frame_head(request_id, flags, meta, raw_tail.len(), out)?;
    out.extend_from_slice(raw_tail);
    Ok(frame_len)
}

#[cfg(test)]
mod tests;
