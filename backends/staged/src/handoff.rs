//! Handing shm regions to the same-host peer: their memfd descriptors travel over a Unix socket
//! (`SCM_RIGHTS`), never as names in a shared directory. The side that accepted the
//! out-of-band connection offers an abstract socket whose name and a one-time cookie it sends
//! in its (authenticated) hello; a connection to it counts only from a process of the same
//! user (`SO_PEERCRED`) that presents the cookie. Then both sides send their descriptors.

use rdma_hint_core::TransportError;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// Bytes of the one-time cookie.
pub const COOKIE_BYTES: usize = 32;
/// Descriptors per message (the kernel's limit is 253).
const FDS_PER_MESSAGE: usize = 250;

fn handshake(why: impl Into<String>) -> TransportError {
    TransportError::Handshake(format!("shm hand-off: {}", why.into()))
}

/// Whether `name` is an abstract socket name this backend could have offered.
pub fn is_handoff_name(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with("rdma-hint-")
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// An offered socket, waiting for the peer.
#[derive(Debug)]
pub(crate) struct Offer {
    listener: UnixListener,
    pub(crate) name: String,
    pub(crate) cookie: [u8; COOKIE_BYTES],
}

impl Offer {
    /// Binds a fresh abstract socket with a random name and a random cookie.
    pub(crate) fn new() -> Result<Offer, TransportError> {
        let mut random = [0u8; 16 + COOKIE_BYTES];
        getrandom::fill(&mut random).map_err(|e| TransportError::Io(std::io::Error::other(e.to_string())))?;
        let name =
            format!("rdma-hint-{}", random[..16].iter().map(|b| format!("{b:02x}")).collect::<String>());
        let address = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&address)?;
        listener.set_nonblocking(true)?;
        let mut cookie = [0u8; COOKIE_BYTES];
        cookie.copy_from_slice(&random[16..]);
        Ok(Offer { listener, name, cookie })
    }

    /// The first connection from our own user that presents the cookie, before `deadline`;
    /// any other is logged and closed.
    pub(crate) fn accept(&self, deadline: Instant) -> Result<UnixStream, TransportError> {
        let started = Instant::now();
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => match self.admit(stream, deadline, started) {
                    Ok(stream) => return Ok(stream),
                    Err(e) => tracing::warn!(error = %e, "staged: refused a shm hand-off connection"),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(TransportError::DeadlineExceeded {
                            what: "the peer to take the shm regions",
                            waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn admit(
        &self,
        stream: UnixStream,
        deadline: Instant,
        started: Instant,
    ) -> Result<UnixStream, TransportError> {
        stream.set_nonblocking(false)?;
        bound(&stream, deadline, started)?;
        same_user(&stream)?;
        let mut presented = [0u8; COOKIE_BYTES];
        let mut read = 0;
        while read < COOKIE_BYTES {
            // Re-armed with what is left of the one deadline: a peer trickling the cookie a byte
            // at a time gets no more time than one sending it at once.
            bound(&stream, deadline, started)?;
            match (&stream).read(&mut presented[read..]) {
                Ok(0) => return Err(handshake("the peer closed before its cookie")),
                Ok(n) => read += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) if Instant::now() >= deadline => return Err(expired(started)),
                Err(e) => return Err(handshake(format!("reading the cookie: {e}"))),
            }
        }
        let difference = presented.iter().zip(&self.cookie).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if difference != 0 {
            return Err(handshake("wrong cookie"));
        }
        Ok(stream)
    }
}

/// Connects to the peer's offer `name` and presents `cookie`.
pub(crate) fn connect(
    name: &str,
    cookie: &[u8; COOKIE_BYTES],
    deadline: Instant,
) -> Result<UnixStream, TransportError> {
    if !is_handoff_name(name) {
        return Err(handshake(format!("{name:?} is not an rdma-hint socket")));
    }
    let started = Instant::now();
    let stream = dial_abstract(name.as_bytes(), deadline, started)?;
    bound(&stream, deadline, started)?;
    same_user(&stream)?;
    (&stream).write_all(cookie)?;
    Ok(stream)
}

/// Connects to the abstract socket `name` without ever blocking past `deadline`: a blocking
/// `connect` to a listener whose backlog is full sleeps in the kernel with no timeout of its
/// own (a peer that keeps its backlog full held a sweep for good), so the socket is
/// non-blocking and a full backlog (`EAGAIN`) is retried until the deadline.
fn dial_abstract(name: &[u8], deadline: Instant, started: Instant) -> Result<UnixStream, TransportError> {
    // SAFETY: socket(2) with constant arguments; no pointers.
    let raw = unsafe {
        libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
    };
    if raw < 0 {
        return Err(TransportError::Io(std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a descriptor socket(2) just returned, owned by nothing else.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_un is a valid value (family and path filled in below).
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // An abstract name: a leading NUL, then the name (no terminator; the length says where
    // it ends).
    if name.len() + 1 > address.sun_path.len() {
        return Err(handshake(format!("a socket name of {} bytes is too long", name.len())));
    }
    for (slot, byte) in address.sun_path[1..].iter_mut().zip(name) {
        *slot = *byte as libc::c_char;
    }
    let len = (std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len()) as libc::socklen_t;
    loop {
        // SAFETY: `address` is a sockaddr_un on this stack frame, `len` bytes of it are
        // initialised and within its size; the descriptor is ours.
        let status =
            unsafe { libc::connect(socket.as_raw_fd(), (&address as *const libc::sockaddr_un).cast(), len) };
        if status == 0 {
            break;
        }
        let error = std::io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Some(libc::EAGAIN | libc::EINTR) => return Err(expired(started)),
            _ => return Err(handshake(format!("connecting: {error}"))),
        }
    }
    let stream = UnixStream::from(socket);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The error for a hand-off that ran past its deadline, having waited since `started`.
fn expired(started: Instant) -> TransportError {
    TransportError::DeadlineExceeded {
        what: "the shm hand-off",
        waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    }
}

/// Arms the stream's timeouts with what is left until `deadline`; past it, the typed error.
fn bound(stream: &UnixStream, deadline: Instant, started: Instant) -> Result<(), TransportError> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err(expired(started));
    }
    stream.set_read_timeout(Some(remaining))?;
    stream.set_write_timeout(Some(remaining))?;
    Ok(())
}

/// Which of a stream's timeouts a call arms.
enum Way {
    Send,
    Receive,
}

/// Arms only the timeout of `way` with what is left until `deadline`: after connect, one thread
/// sends on the hand-off (an expose) while another receives (the peer's), and neither's call may
/// cut the other's short.
fn bound_one(
    stream: &UnixStream,
    deadline: Instant,
    started: Instant,
    way: Way,
) -> Result<(), TransportError> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err(expired(started));
    }
    match way {
        Way::Send => stream.set_write_timeout(Some(remaining))?,
        Way::Receive => stream.set_read_timeout(Some(remaining))?,
    }
    Ok(())
}

/// The process at the other end runs as our user (root included: then both are root).
fn same_user(stream: &UnixStream) -> Result<(), TransportError> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut size = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a `ucred` of `size` bytes at the pointer given; both live on
    // this stack frame for the call.
    let status = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut credentials as *mut libc::ucred).cast(),
            &mut size,
        )
    };
    if status != 0 {
        return Err(TransportError::Io(std::io::Error::last_os_error()));
    }
    // SAFETY: geteuid takes no arguments and cannot fail.
    let ours = unsafe { libc::geteuid() };
    if credentials.uid != ours {
        return Err(handshake(format!(
            "the process at the other end (pid {}) runs as uid {}, this one as uid {ours}",
            credentials.pid, credentials.uid
        )));
    }
    Ok(())
}

/// Sends `ours` (in order) before `deadline`: full messages of [`FDS_PER_MESSAGE`]
/// descriptors, then the rest; one empty message when there is nothing to send.
pub(crate) fn send(
    stream: &UnixStream,
    ours: &[BorrowedFd<'_>],
    deadline: Instant,
) -> Result<(), TransportError> {
    let started = Instant::now();
    let mut chunks: Vec<&[BorrowedFd<'_>]> = ours.chunks(FDS_PER_MESSAGE).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for chunk in chunks {
        bound_one(stream, deadline, started, Way::Send)?;
        send_fds(stream, chunk).map_err(|e| if Instant::now() >= deadline { expired(started) } else { e })?;
    }
    Ok(())
}

/// Receives exactly `expected` descriptors from the peer before `deadline` (one deadline for
/// the whole exchange, however the peer paces it). The peer's messages must be the ones
/// [`send`] sends; anything else is refused at once.
pub(crate) fn receive(
    stream: &UnixStream,
    expected: usize,
    deadline: Instant,
) -> Result<Vec<OwnedFd>, TransportError> {
    let started = Instant::now();
    let mut theirs = Vec::with_capacity(expected);
    loop {
        let due = (expected - theirs.len()).min(FDS_PER_MESSAGE);
        bound_one(stream, deadline, started, Way::Receive)?;
        let received =
            receive_fds(stream).map_err(|e| if Instant::now() >= deadline { expired(started) } else { e })?;
        if received.len() != due {
            return Err(handshake(format!(
                "a message carried {} descriptors where {due} were due ({expected} regions advertised, {} received)",
                received.len(),
                theirs.len()
            )));
        }
        theirs.extend(received);
        if theirs.len() == expected {
            return Ok(theirs);
        }
    }
}

/// Room for a control message carrying `count` descriptors.
fn control_space(count: usize) -> usize {
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE((count * std::mem::size_of::<libc::c_int>()) as u32) as usize }
}

fn send_fds(stream: &UnixStream, fds: &[BorrowedFd<'_>]) -> Result<(), TransportError> {
    let mut payload = [fds.len() as u8];
    let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: 1 };
    let mut control = vec![0u8; control_space(fds.len().max(1))];
    // SAFETY: an all-zero msghdr is valid (null name, no control) before the fields are set.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    if !fds.is_empty() {
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = control_space(fds.len()) as _;
        // SAFETY: `message` points at `control`, which has room for one header and `fds.len()`
        // descriptors (CMSG_SPACE), so CMSG_FIRSTHDR is non-null and CMSG_DATA has room for them.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN((fds.len() * std::mem::size_of::<libc::c_int>()) as u32) as _;
            let data = libc::CMSG_DATA(header).cast::<libc::c_int>();
            for (index, fd) in fds.iter().enumerate() {
                data.add(index).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    // SAFETY: `message` and everything it points at (iov, payload, control) live for the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
    if sent != 1 {
        return Err(TransportError::Io(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn receive_fds(stream: &UnixStream) -> Result<Vec<OwnedFd>, TransportError> {
    let mut payload = [0u8; 1];
    let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: 1 };
    let mut control = vec![0u8; control_space(FDS_PER_MESSAGE)];
    // SAFETY: as in `send_fds`.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = control.len() as _;
    // SAFETY: `message` and its buffers live for the call; received descriptors are close-on-exec.
    let received = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
    if received < 0 {
        return Err(TransportError::Io(std::io::Error::last_os_error()));
    }
    if received == 0 {
        return Err(TransportError::PeerGone("the peer closed the shm hand-off".into()));
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` with `msg_controllen` bytes of well-formed headers;
    // CMSG_FIRSTHDR/NXTHDR walk them within that length. Each SCM_RIGHTS descriptor is new to
    // this process and owned by nobody else, so wrapping it in an OwnedFd is sound.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<libc::c_int>();
                let bytes = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for index in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(index).read_unaligned()));
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    if message.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(handshake("descriptors were cut off"));
    }
    if fds.len() != usize::from(payload[0]) {
        return Err(handshake(format!(
            "a message announced {} descriptors and carried {}",
            payload[0],
            fds.len()
        )));
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_cross_to_a_peer_with_the_cookie_only() {
        let offer = Offer::new().unwrap();
        assert!(is_handoff_name(&offer.name));
        let deadline = Instant::now() + Duration::from_secs(5);
        let (name, cookie) = (offer.name.clone(), offer.cookie);
        // A process of ours without the cookie is refused; the one with it gets through.
        let intruder = connect(&name, &[0u8; COOKIE_BYTES], deadline).unwrap();
        let peer = std::thread::spawn(move || {
            let stream = connect(&name, &cookie, deadline).unwrap();
            let files: Vec<std::fs::File> =
                (0..300).map(|_| std::fs::File::open("/proc/self/exe").unwrap()).collect();
            let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
            send(&stream, &fds, deadline).unwrap();
            receive(&stream, 1, deadline).unwrap().len()
        });
        let accepted = offer.accept(deadline).unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let theirs = receive(&accepted, 300, deadline).unwrap();
        send(&accepted, &[file.as_fd()], deadline).unwrap();
        assert_eq!(theirs.len(), 300);
        assert_eq!(peer.join().unwrap(), 1);
        drop(intruder);
        assert!(connect("../../etc", &cookie, deadline).is_err());
    }

    /// A listener whose backlog is full and never accepts cannot hold a dial past its
    /// deadline (a blocking `connect` slept in the kernel with no timeout of its own).
    #[test]
    fn a_full_backlog_ends_the_dial_at_its_deadline() {
        let offer = Offer::new().unwrap();
        // SAFETY: listen(2) on the offer's own bound socket, shrinking its backlog; no pointers.
        assert_eq!(unsafe { libc::listen(offer.listener.as_raw_fd(), 0) }, 0);
        let address = SocketAddr::from_abstract_name(offer.name.as_bytes()).unwrap();
        // Fill the backlog: non-blocking dials until the kernel answers EAGAIN.
        let mut squatters = Vec::new();
        let soon = Instant::now() + Duration::from_millis(1);
        while let Ok(stream) = dial_abstract(offer.name.as_bytes(), soon, Instant::now()) {
            squatters.push(stream);
            assert!(squatters.len() < 64, "the backlog never filled");
        }
        let started = Instant::now();
        let dialled = connect(&offer.name, &offer.cookie, Instant::now() + Duration::from_millis(300));
        assert!(matches!(dialled, Err(TransportError::DeadlineExceeded { .. })), "{dialled:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "held for {:?}", started.elapsed());
        drop((squatters, address));
    }
}
