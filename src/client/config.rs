//! Client settings. Every limit is named and bounded; `validate` refuses nonsense before a
//! socket is opened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::protocol::{FrameLimits, FRAME_BYTES_MAX_DEFAULT};

use super::error::{ClientError, Result};

/// The broker's default native port.
pub const BROKER_PORT_DEFAULT: u16 = 7800;
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 3_000;
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 3_000;
pub const RECONNECT_BACKOFF_MIN_MS_DEFAULT: u64 = 100;
pub const RECONNECT_BACKOFF_MAX_MS_DEFAULT: u64 = 10_000;
pub const IN_FLIGHT_MAX_DEFAULT: usize = 1024;
/// Pushed frames buffered for a slow subscriber before it starts missing some.
pub const PUSH_BUFFER_MAX_DEFAULT: usize = 1024;

/// Upper bounds that keep a typo from becoming a hang or a huge allocation.
const TIMEOUT_MS_MAX: u64 = 24 * 3600 * 1000;
const IN_FLIGHT_MAX_MAX: usize = 1 << 20;
const PUSH_BUFFER_MAX_MAX: usize = 1 << 20;

/// How to reach a broker and how patient to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// `host:port` of any shard of the broker (the bootstrap address).
    pub broker: String,
    /// Identifies this client to the broker (sessions, group membership, locks).
    pub client_id: String,
    /// Time a request may take, from the call to the answer. Pulls add their long-polling
    /// wait to it.
    pub request_timeout_ms: u64,
    /// Time a TCP connect plus handshake may take.
    pub connect_timeout_ms: u64,
    /// First pause before reconnecting to an address that failed; doubled per failure.
    pub reconnect_backoff_min_ms: u64,
    /// Longest pause between reconnect attempts.
    pub reconnect_backoff_max_ms: u64,
    /// Send each queue-bound request straight to the shard that owns the queue, over one
    /// connection per shard. Off: everything goes through the bootstrap connection and the
    /// broker forwards.
    pub shard_aware: bool,
    /// Requests awaiting an answer on one connection; more wait for a slot.
    pub in_flight_max: usize,
    /// Largest frame this client sends or accepts, header included. The handshake keeps
    /// answers within the smaller of this and the broker's limit, and a request larger than
    /// that smaller one fails (`InvalidArgument`) before it is written: raise both to send
    /// or receive larger frames.
    pub frame_bytes_max: u32,
    /// Capacity of the pushed-frame channel (see `Client::pushes`), in frames: a frame
    /// unread holds its bytes (up to `frame_bytes_max`) until every receiver has read it.
    pub push_buffer_max: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig::new(format!("127.0.0.1:{BROKER_PORT_DEFAULT}"))
    }
}

impl ClientConfig {
    /// Defaults for everything but the broker address; a client id unique across hosts and
    /// processes: `<host>-<pid>-<random>-<n>` (a PID alone repeats across containers).
    pub fn new(broker: impl Into<String>) -> ClientConfig {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = PREFIX.get_or_init(|| {
            format!(
                "{}-{}-{:08x}",
                host_name(),
                std::process::id(),
                rand::random::<u32>()
            )
        });
        ClientConfig {
            broker: broker.into(),
            client_id: format!("{prefix}-{n}"),
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
            connect_timeout_ms: CONNECT_TIMEOUT_MS_DEFAULT,
            reconnect_backoff_min_ms: RECONNECT_BACKOFF_MIN_MS_DEFAULT,
            reconnect_backoff_max_ms: RECONNECT_BACKOFF_MAX_MS_DEFAULT,
            shard_aware: true,
            in_flight_max: IN_FLIGHT_MAX_DEFAULT,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            push_buffer_max: PUSH_BUFFER_MAX_DEFAULT,
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// The pause before reconnect attempt number `failures + 1` (after `failures`
    /// consecutive failures): min, 2·min, 4·min, … capped at max.
    pub fn reconnect_backoff(&self, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(32);
        let ms = self
            .reconnect_backoff_min_ms
            .saturating_mul(1u64 << shift)
            .min(self.reconnect_backoff_max_ms);
        Duration::from_millis(ms)
    }

    /// Checks every field; the client calls it before connecting.
    pub fn validate(&self) -> Result<FrameLimits> {
        let bad = |what: String| Err(ClientError::InvalidArgument(what));
        if self.broker.is_empty() {
            return bad("broker address is empty".into());
        }
        for (name, ms) in [
            ("request_timeout_ms", self.request_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("reconnect_backoff_min_ms", self.reconnect_backoff_min_ms),
            ("reconnect_backoff_max_ms", self.reconnect_backoff_max_ms),
        ] {
            if ms == 0 || ms > TIMEOUT_MS_MAX {
                return bad(format!("{name} = {ms}: must be in 1..={TIMEOUT_MS_MAX}"));
            }
        }
        if self.reconnect_backoff_min_ms > self.reconnect_backoff_max_ms {
            return bad(format!(
                "reconnect_backoff_min_ms ({}) is above reconnect_backoff_max_ms ({})",
                self.reconnect_backoff_min_ms, self.reconnect_backoff_max_ms
            ));
        }
        if self.in_flight_max == 0 || self.in_flight_max > IN_FLIGHT_MAX_MAX {
            return bad(format!(
                "in_flight_max = {}: must be in 1..={IN_FLIGHT_MAX_MAX}",
                self.in_flight_max
            ));
        }
        if self.push_buffer_max == 0 || self.push_buffer_max > PUSH_BUFFER_MAX_MAX {
            return bad(format!(
                "push_buffer_max = {}: must be in 1..={PUSH_BUFFER_MAX_MAX}",
                self.push_buffer_max
            ));
        }
        FrameLimits::new(self.frame_bytes_max)
            .map_err(|e| ClientError::InvalidArgument(format!("frame_bytes_max: {e}")))
    }
}

/// This host's name, cut to the characters a client id keeps readable.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let name = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    };
    let name: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .take(64)
        .collect();
    if name.is_empty() {
        "ringmq".to_owned()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_backoff_doubles_to_the_cap() {
        let c = ClientConfig::default();
        assert!(c.validate().is_ok());
        assert!(c.shard_aware);
        assert_eq!(c.request_timeout_ms, 3000);
        assert_eq!(c.in_flight_max, 1024);
        let ms = |f| c.reconnect_backoff(f).as_millis();
        assert_eq!((ms(0), ms(1), ms(2), ms(3)), (100, 100, 200, 400));
        assert_eq!(ms(100), 10_000);
        assert_ne!(
            ClientConfig::new("a:1").client_id,
            ClientConfig::new("a:1").client_id
        );
    }

    #[test]
    fn nonsense_is_refused() {
        let check = |f: fn(&mut ClientConfig)| {
            let mut c = ClientConfig::default();
            f(&mut c);
            assert!(
                matches!(c.validate(), Err(ClientError::InvalidArgument(_))),
                "{c:?}"
            );
        };
        check(|c| c.broker.clear());
        check(|c| c.request_timeout_ms = 0);
        check(|c| c.in_flight_max = 0);
        check(|c| c.frame_bytes_max = 10);
        check(|c| c.reconnect_backoff_min_ms = c.reconnect_backoff_max_ms + 1);
        check(|c| c.push_buffer_max = 0);
    }
}
