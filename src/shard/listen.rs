//! Listening and accepting: sockets bound with SO_REUSEADDR (a restart right after a stop
//! is not refused because of connections in TIME_WAIT) and SO_REUSEPORT (every shard
//! accepts on the shared port), the exclusive-port probe, the broker-wide connection cap
//! derived from the open-file limit, and an accept loop that backs off when accepting
//! fails (no descriptors left) instead of spinning.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glommio::net::TcpListener;
use socket2::{Domain, Protocol, Socket, Type};

use super::conn::{serve_connection, ConnSettings, ReadBudget};
use super::BrokerError;
use crate::broker::ShardCtx;
use crate::protocol::{encode_error, ErrorCode};

/// Descriptors kept for the runtime, plus [`FD_RESERVE_PER_SHARD`] for each shard's store
/// (log segments, index files, offsets, snapshots), when the connection cap is derived from
/// the open-file limit.
pub const FD_RESERVE: u64 = 256;
pub const FD_RESERVE_PER_SHARD: u64 = 64;
/// Connections a broker takes when neither the flag nor the open-file limit says less.
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Longest pause of the accept loop after failures.
const ACCEPT_BACKOFF_MAX_MS: u64 = 1_000;
/// How long start-up looks again at a port in use (a broker that just died may hold it).
const PORT_RETRY_MS: u64 = 3_000;
/// Backlog of each listening socket.
const LISTEN_BACKLOG: i32 = 1024;

fn socket_for(addr: SocketAddr) -> std::io::Result<Socket> {
    let domain = if addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    Ok(socket)
}

/// A listening socket of one shard on `addr` (shared with the other shards by
/// SO_REUSEPORT), and a handle that stops it.
pub fn bind(addr: SocketAddr) -> Result<(TcpListener, ListenerStop), String> {
    let open = || -> std::io::Result<(Socket, Socket)> {
        let socket = socket_for(addr)?;
        socket.set_reuse_port(true)?;
        socket.bind(&addr.into())?;
        socket.listen(LISTEN_BACKLOG)?;
        let stop = socket.try_clone()?;
        Ok((socket, stop))
    };
    let (socket, stop) = open().map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    // SAFETY: the descriptor is a bound, listening TCP socket that we own; ownership moves
    // into the glommio listener, which closes it.
    let listener = unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) };
    Ok((listener, ListenerStop(stop)))
}

/// Stops a listening socket at once: its pending accepts fail and its port is free for a
/// broker started right after this one (an accept still queued in io_uring would otherwise
/// keep the socket listening until the ring is torn down, after the process exits).
pub struct ListenerStop(Socket);

impl ListenerStop {
    pub fn stop(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

/// Refuses to start when another process listens on one of the ports: a probe bound
/// without SO_REUSEPORT (which would let two brokers share a port) but with SO_REUSEADDR
/// (so connections of an earlier run in TIME_WAIT do not count).
pub fn check_ports_free(listen: &SocketAddr, shards: usize) -> Result<(), BrokerError> {
    if listen.port() == 0 {
        return Ok(());
    }
    let ports = std::iter::once(listen.port() as usize)
        .chain((0..shards).map(|i| listen.port() as usize + 1 + i));
    for port in ports {
        let port = u16::try_from(port)
            .map_err(|_| BrokerError::Config(format!("port {port} is out of range")))?;
        let addr = SocketAddr::new(listen.ip(), port);
        let try_bind = || {
            socket_for(addr).and_then(|s| {
                s.bind(&addr.into())?;
                s.listen(1)
            })
        };
        // A broker killed a moment ago may still hold its ports while the kernel tears its
        // io_uring down: look again for a few seconds before calling the port taken.
        let mut probe = try_bind();
        let deadline = std::time::Instant::now() + Duration::from_millis(PORT_RETRY_MS);
        while probe
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
            probe = try_bind();
        }
        if let Err(e) = probe {
            return Err(BrokerError::Config(format!(
                "cannot listen on {addr}: {e} (is another broker running? shard i also uses port {}+1+i)",
                listen.port()
            )));
        }
    }
    Ok(())
}

/// The open-file limit (soft, hard), after raising the soft limit to the hard one.
pub fn raise_file_limit() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass; no other memory.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return (1024, 1024);
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    (lim.rlim_cur, lim.rlim_max)
}

/// The connection cap: the configured one (0: [`CONNECTIONS_MAX_DEFAULT`]), lowered to what
/// the open-file limit leaves after the descriptors kept for the stores.
pub fn connections_max(configured: usize, file_limit: u64, shards: usize) -> usize {
    let wanted = if configured == 0 {
        CONNECTIONS_MAX_DEFAULT
    } else {
        configured
    };
    let reserve = FD_RESERVE + FD_RESERVE_PER_SHARD.saturating_mul(shards as u64);
    let room = file_limit.saturating_sub(reserve).max(1);
    wanted.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// Open connections of the whole broker, against its cap.
pub struct ConnectionCap {
    open: AtomicUsize,
    max: usize,
}

impl ConnectionCap {
    pub fn new(max: usize) -> Arc<ConnectionCap> {
        Arc::new(ConnectionCap {
            open: AtomicUsize::new(0),
            max,
        })
    }

    fn try_open(self: &Arc<Self>) -> Option<OpenConnection> {
        let before = self.open.fetch_add(1, Ordering::AcqRel);
        let slot = OpenConnection(self.clone());
        (before < self.max).then_some(slot)
    }
}

/// One connection counted against the cap while it lives.
struct OpenConnection(Arc<ConnectionCap>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connections a shard serves, by descriptor, so that its stop can end them: the
/// peers see the connection close (in a process that embeds the broker, its sockets would
/// otherwise stay open after `Broker::shutdown`, their peers waiting out timeouts).
#[derive(Default)]
pub struct LiveConnections(std::cell::RefCell<std::collections::HashSet<i32>>);

impl LiveConnections {
    /// Shuts every connection down, `how` being `libc::SHUT_RD` (the readers end, and each
    /// writer writes the answers queued before it closes) or `libc::SHUT_RDWR`.
    pub fn shut_down_all(&self, how: i32) {
        for &fd in self.0.borrow().iter() {
            // SAFETY: `fd` is a socket a serving task holds open while it is listed here
            // (listed from its start, unlisted when it returns); shutdown closes nothing.
            unsafe {
                libc::shutdown(fd, how);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }
}

/// Accepts connections until the shard stops; past the cap a connection gets an error
/// frame and is closed.
pub async fn accept_loop(
    ctx: Rc<ShardCtx>,
    listener: TcpListener,
    settings: ConnSettings,
    read_budget: Rc<ReadBudget>,
    cap: Arc<ConnectionCap>,
    live: Rc<LiveConnections>,
) {
    let mut backoff_ms = 0u64;
    let mut failures = 0u64;
    loop {
        match listener.accept().await {
            Ok(stream) => {
                backoff_ms = 0;
                if ctx.is_stopping() {
                    return;
                }
                let Some(slot) = cap.try_open() else {
                    let mut out = Vec::new();
                    let message = format!(
                        "the broker serves {} connections, its limit (--connections-max); try again later",
                        cap.max
                    );
                    if encode_error(0, ErrorCode::TooManyConnections, message, &mut out).is_ok() {
                        glommio::spawn_local(async move {
                            use futures_lite::AsyncWriteExt;
                            let mut stream = stream;
                            let _ = stream.write_all(&out).await;
                            let _ = stream.close().await;
                        })
                        .detach();
                    }
                    continue;
                };
                let (ctx, budget, live) = (ctx.clone(), read_budget.clone(), live.clone());
                let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
                live.0.borrow_mut().insert(fd);
                glommio::spawn_local(async move {
                    let handed_over = serve_connection(ctx, stream, settings, budget).await;
                    live.0.borrow_mut().remove(&fd);
                    // The place is the connection's until the requests it handed to the
                    // shard end too: a client that resets its connection while they run
                    // (its writer failing) could otherwise open another meanwhile, and
                    // more requests would run than the cap allows.
                    handed_over.ended().await;
                    drop(slot);
                })
                .detach();
            }
            // A clean stop shuts the listener down: its accept fails (EINVAL), and that is
            // the end of this loop, not a failure to report.
            Err(_) if ctx.is_stopping() => return,
            Err(e) => {
                // Out of descriptors (or another transient failure): back off, say so now
                // and then, not thousands of times a second.
                failures += 1;
                if failures.is_power_of_two() {
                    crate::warn!(
                        "ringmq: shard {}: accept failed ({failures} times so far): {e}",
                        ctx.id
                    );
                }
                backoff_ms = (backoff_ms * 2).clamp(10, ACCEPT_BACKOFF_MAX_MS);
                crate::io::sleep(Duration::from_millis(backoff_ms)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_leaves_descriptors_for_the_stores() {
        assert_eq!(connections_max(0, 1_000_000, 2), CONNECTIONS_MAX_DEFAULT);
        assert_eq!(connections_max(50, 1_000_000, 2), 50);
        assert_eq!(connections_max(0, 1024, 2), 1024 - 256 - 128);
        assert_eq!(connections_max(0, 100, 2), 1);
    }
}
