//! The commit log: append-only segment files of records, recovery and retention. The record
//! format itself is the wire's (`crate::protocol::record`): stored bytes are the bytes a
//! pull answer carries.
//!
//! Architecture invariant: the log knows records and byte positions. It knows nothing of
//! consumers, groups, sockets or queue assignment; the store above it assigns queue offsets.

mod commit_log;
pub mod stats;
pub use commit_log::*;
