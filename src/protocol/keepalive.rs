//! TCP keepalive, set by both ends of a connection: the broker on what it accepts (what a
//! vanished client held is freed), the client on what it opens (requests to a vanished
//! broker fail once the probes go unanswered, instead of timing out one by one for as
//! long as the kernel retransmits).

/// A peer gone without a word (its host lost, a cable pulled) is found by TCP keepalive
/// probes after [`KEEPALIVE_IDLE_S`] of silence, then [`KEEPALIVE_PROBES`] unanswered ones
/// [`KEEPALIVE_INTERVAL_S`] apart (2 minutes in all): the connection's read fails and what
/// it held is freed. An idle connection otherwise lasts for ever.
pub const KEEPALIVE_IDLE_S: i32 = 60;
pub const KEEPALIVE_INTERVAL_S: i32 = 10;
pub const KEEPALIVE_PROBES: i32 = 6;
/// Keepalive probes wait while sent data is unacknowledged (a peer that vanished with a
/// request in flight), and the kernel would retransmit for about 15 minutes: data
/// unacknowledged this long (ms) fails the connection too, the same 2 minutes.
pub const USER_TIMEOUT_MS: i32 =
    (KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES) * 1000;

/// Turns keepalive on for socket `fd`, with the settings above.
pub fn keep_alive(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    let set = |level: i32, name: i32, value: i32| {
        // SAFETY: an int socket option set on a socket descriptor the caller holds open.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &value as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES)?;
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
}

/// The keepalive settings of socket `fd`: (on, idle s, interval s, probes, user timeout ms).
pub fn keepalive_of(fd: std::os::fd::RawFd) -> std::io::Result<(i32, i32, i32, i32, i32)> {
    let get = |level: i32, name: i32| {
        let mut value = 0i32;
        let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: reads an int socket option into a local of its size.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                level,
                name,
                &mut value as *mut i32 as *mut libc::c_void,
                &mut len,
            )
        };
        if rc == 0 {
            Ok(value)
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    Ok((
        get(libc::SOL_SOCKET, libc::SO_KEEPALIVE)?,
        get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE)?,
        get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL)?,
        get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT)?,
        get(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_socket_probes_a_silent_peer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        let fd = served.as_raw_fd();
        assert_eq!(keepalive_of(fd).unwrap().0, 0);
        keep_alive(fd).unwrap();
        assert_eq!(
            keepalive_of(fd).unwrap(),
            (
                1,
                KEEPALIVE_IDLE_S,
                KEEPALIVE_INTERVAL_S,
                KEEPALIVE_PROBES,
                USER_TIMEOUT_MS
            )
        );
    }
}
