//! The native wire protocol: frames, request and response types, error codes and message ids.
//!
//! It owns the byte layout of everything a client and a broker say to each other:
//! - [`frame`]: the 24-byte frame header, size limits, finding whole frames in a receive
//!   buffer ([`FrameDecoder`]) and encoding them ([`encode_frame`]);
//! - `registry`: every kind declared once (number, types, reply, handler, route); it
//!   generates [`Kind`], [`Request`], [`Response`] and the [`Handlers`] trait;
//! - [`kind`]: kind classes and number ranges, and the frozen numbers of released kinds;
//! - [`messages`]: the request and response types (rkyv meta parts), the [`Request`] and
//!   [`Response`] enums and their encode/decode entry points; pull and query answers carry
//!   stored records as a raw tail, read in place with `crate::protocol::record::RecordIter`;
//! - [`error`]: [`ErrorCode`], the stable codes of error responses, and [`ProtocolError`];
//! - [`msg_id`]: the 32-hex-character message id.
//!
//! Architecture invariant: the protocol does no I/O at all (no sockets, files, executors or
//! async); it turns values into bytes and bytes into values, so the glommio broker and the
//! tokio client share it, with or without the `broker` feature. Everything read is checked
//! (lengths before allocating, magic, version, flags, rkyv validation): bad bytes give a
//! typed error, never a panic.
//!
//! Stability invariant: kind numbers, error code numbers and released layouts are never
//! changed and never reused. New requests get new kind numbers.

pub mod delay;
pub mod error;
pub mod frame;
pub mod keepalive;
pub mod kind;
pub mod messages;
pub mod msg_id;
pub mod names;
pub mod record;
mod registry;
pub mod route;
pub mod sql;
pub mod tag_filter;

pub use error::{ErrorCode, ProtocolError};
pub use frame::{
    encode_frame, encode_frame_head, encode_frame_parts, AlignedMeta, Flags, Frame, FrameDecoder,
    FrameHeader, FrameLimits, FrameParts, Message, SharedBytes, FRAME_BYTES_CEILING,
    FRAME_BYTES_MAX_DEFAULT, FRAME_BYTES_MIN, FRAME_HEADER_BYTES, FRAME_MAGIC, FRAME_SLACK_BYTES,
    META_ALIGN, META_BYTES_RESERVE, PROTOCOL_VERSION,
};
pub use kind::{Kind, KindClass};
pub use messages::*;
pub use msg_id::{MessageId, MsgIdError, MSG_ID_CHARS};
pub use route::Route;
