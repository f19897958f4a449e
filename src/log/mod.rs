//! The commit log: append-only segment files of records, the record codec, recovery and
//! retention.
//!
//! Architecture invariant: the log knows records and byte positions. It knows nothing of
//! consumers, groups, sockets or queue assignment; the store above it assigns queue offsets.

pub mod record;

#[cfg(feature = "broker")]
mod commit_log;
#[cfg(feature = "broker")]
pub use commit_log::*;
