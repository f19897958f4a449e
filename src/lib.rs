//! ringmq: a shard-per-core, io_uring message broker with the RocketMQ messaging model.
//!
//! See ARCHITECTURE.md for the code map. The `broker` feature (default) carries everything
//! that needs glommio and io_uring; without it only the wire protocol, the record codec and
//! the client compile.

pub mod client;
pub mod protocol;

#[cfg(feature = "broker")]
pub mod broker;
#[cfg(feature = "broker")]
pub mod index;
#[cfg(feature = "broker")]
pub mod io;
#[cfg(feature = "broker")]
pub mod log;
#[cfg(feature = "broker")]
pub mod shard;
#[cfg(feature = "broker")]
pub mod store;
