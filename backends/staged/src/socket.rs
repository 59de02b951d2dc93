//! The few socket calls the TCP channel needs beyond `std`: whether bytes wait, how many, a look
//! at the next header without taking it, and a send that never waits. A wait that polls the socket
//! itself (`BusyPoll`) takes only frames that are wholly there, so it never blocks on a peer.

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Whether `socket` has bytes to read (or an end or error to report) within `timeout`.
pub(crate) fn readable(socket: &TcpStream, timeout: Duration) -> bool {
    let mut watched = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one initialised pollfd, live for the call, for a descriptor `socket` keeps open.
    unsafe { libc::poll(&mut watched, 1, millis) > 0 }
}

/// Bytes waiting to be read on `socket` now (0 when the call fails: the reader finds out why).
pub(crate) fn waiting_bytes(socket: &TcpStream) -> u64 {
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the live `waiting`, for a descriptor `socket` keeps open.
    let status = unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &mut waiting) };
    if status == 0 {
        u64::try_from(waiting).unwrap_or(0)
    } else {
        0
    }
}

/// Copies up to `out.len()` of the bytes waiting into `out` without taking them off the socket
/// and without waiting: how many it copied, `Ok(0)` once the peer closed its end, and
/// `WouldBlock` while nothing waits.
pub(crate) fn peek(socket: &TcpStream, out: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: `out` is writable for its length; MSG_PEEK leaves the bytes queued.
    let got = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            out.as_mut_ptr().cast(),
            out.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(got).map_err(|_| std::io::Error::last_os_error())
}

/// Sends what of `bytes` the socket's buffer takes now, without waiting: 0 when it is full.
pub(crate) fn send_now(socket: &TcpStream, bytes: &[u8]) -> std::io::Result<usize> {
    // SAFETY: `bytes` is readable for its length; MSG_DONTWAIT makes this one call return at
    // once on a blocking socket, and MSG_NOSIGNAL turns a closed peer into an error, not SIGPIPE.
    let sent = unsafe {
        libc::send(
            socket.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if let Ok(sent) = usize::try_from(sent) {
        return Ok(sent);
    }
    let error = std::io::Error::last_os_error();
    match error.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(0),
        _ => Err(error),
    }
}
