//! ringmq: a shard-per-core, io_uring message broker with the RocketMQ messaging model.
//!
//! See ARCHITECTURE.md for the code map. The `broker` feature (default) carries everything
//! that needs glommio and io_uring; without it only the wire protocol, the record codec and
//! the client compile.

/// Writes a line to stderr like `eprintln!`, but never panics: a broker whose stderr is a
/// file on a full disk (or a closed pipe) must keep running.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

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
