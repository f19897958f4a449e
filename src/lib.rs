//! ringmq: a shard-per-core, io_uring message broker with the RocketMQ messaging model.
//!
//! See ARCHITECTURE.md for the code map. The `broker` feature (default) carries everything
//! that needs glommio and io_uring; without it only the wire protocol, the record codec and
//! the client compile.

/// An event worth a line in the log (start, stop, recovery), through `tracing` at INFO. The
/// broker's subscriber writes to stderr and drops a line it cannot write, without a word
/// (tracing-subscriber's report of the failure is switched off: it is an `eprintln!`, which
/// panics when stderr fails): a broker whose stderr is a file on a full disk (or a closed
/// pipe) keeps running. Tested with stderr on `/dev/full` (tests/full_disk.rs).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        ::tracing::info!(target: "ringmq", "{}", ::std::format_args!($($arg)*))
    };
}

/// A problem worth an operator's attention (a failed background write, a damaged file, a
/// lowered limit), through `tracing` at WARN.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => {
        ::tracing::warn!(target: "ringmq", "{}", ::std::format_args!($($arg)*))
    };
}

/// An error that stops something (a poisoned log, a broker that cannot start), through
/// `tracing` at ERROR.
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => {
        ::tracing::error!(target: "ringmq", "{}", ::std::format_args!($($arg)*))
    };
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
