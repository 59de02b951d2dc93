//! The completion channel and the thread that watches it: CQ events wake the tasks waiting on
//! the CQ (re-arming it first, so no completion falls between the event and the next arm), and
//! the out-of-band socket's EOF marks the peer gone.

use crate::qp::Lent;
use crate::status::unavailable;
use rdma_hint_oob::{peer_left, PeerLoss};
use rdma_hint_transport::wait::Notifier;
use rdma_hint_transport::TransportError;
use rdma_mummy_sys as ibv;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

/// What the transport and its event thread share.
#[derive(Debug)]
pub(crate) struct Events {
    /// Woken when the send CQ has an event.
    pub(crate) completions: Notifier,
    /// Woken when the receive CQ has an event.
    pub(crate) arrivals: Notifier,
    /// Why the connection is gone; first reason wins.
    pub(crate) broken: OnceLock<String>,
    stop: AtomicBool,
    /// An eventfd written to stop the thread.
    stop_fd: OwnedFd,
}

impl Events {
    pub(crate) fn new() -> Result<Events, TransportError> {
        // SAFETY: eventfd takes no pointers; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(TransportError::Io(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor this struct now owns alone.
        let stop_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Events {
            completions: Notifier::default(),
            arrivals: Notifier::default(),
            broken: OnceLock::new(),
            stop: AtomicBool::new(false),
            stop_fd,
        })
    }

    /// Marks the connection gone and wakes every waiter.
    pub(crate) fn fail(&self, why: String) {
        self.lost(PeerLoss { why, clean: false });
    }

    /// Marks the connection gone for `loss` (quietly when the peer said goodbye) and wakes
    /// every waiter.
    pub(crate) fn lost(&self, loss: PeerLoss) {
        if self.broken.set(loss.why.clone()).is_ok() {
            if loss.clean {
                tracing::debug!(why = %loss.why, "verbs: connection closed");
            } else {
                tracing::warn!(why = %loss.why, "verbs: connection lost");
            }
        }
        self.completions.notify();
        self.arrivals.notify();
    }
}

/// A completion channel both CQs report to, with its fd non-blocking.
#[derive(Debug)]
pub(crate) struct CompletionChannel {
    pub(crate) raw: *mut ibv::ibv_comp_channel,
}

impl CompletionChannel {
    pub(crate) fn create(context: *mut ibv::ibv_context) -> Result<CompletionChannel, TransportError> {
        // SAFETY: `context` is an open device context.
        let raw = unsafe { ibv::ibv_create_comp_channel(context) };
        if raw.is_null() {
            return Err(unavailable("ibv_create_comp_channel"));
        }
        let channel = CompletionChannel { raw };
        let fd = channel.fd();
        // SAFETY: `fd` is the channel's open descriptor; F_GETFL/F_SETFL take no pointers.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(TransportError::Io(std::io::Error::last_os_error()));
        }
        Ok(channel)
    }

    fn fd(&self) -> RawFd {
        // SAFETY: `raw` is live until this value drops.
        unsafe { (*self.raw).fd }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: the CQs on this channel were destroyed before (the transport's Drop order)
        // and the event thread has been joined; destroyed once.
        unsafe { ibv::ibv_destroy_comp_channel(self.raw) };
    }
}

/// Arms `cq` so its next completion produces an event on its channel.
pub(crate) fn arm(cq: *mut ibv::ibv_cq) -> Result<(), TransportError> {
    // SAFETY: `cq` is live (created on a completion channel).
    match unsafe { ibv::ibv_req_notify_cq(cq, 0) } {
        0 => Ok(()),
        code => Err(TransportError::Io(std::io::Error::from_raw_os_error(code))),
    }
}

/// The raw handles the thread touches; they outlive it (joined before they are destroyed).
#[derive(Clone, Copy)]
pub(crate) struct Watched {
    pub(crate) channel: *mut ibv::ibv_comp_channel,
    pub(crate) send_cq: *mut ibv::ibv_cq,
    pub(crate) recv_cq: *mut ibv::ibv_cq,
}

// SAFETY: libibverbs objects may be used from any thread; the thread only gets/acks events and
// re-arms CQs, which the transport never does itself.
unsafe impl Send for Watched {}

/// The running event thread; [`EventThread::stop`] (or dropping it) joins it.
#[derive(Debug)]
pub(crate) struct EventThread {
    events: Arc<Events>,
    handle: Option<JoinHandle<()>>,
    /// Keeps the channel and CQs lent while the thread runs: a transport dropped while the
    /// thread is still with an abandoned `connect` waits for it.
    _loan: Lent<()>,
}

impl EventThread {
    pub(crate) fn start(
        events: Arc<Events>,
        watched: Watched,
        oob: TcpStream,
        loan: Lent<()>,
    ) -> Result<EventThread, TransportError> {
        let shared = events.clone();
        let handle = std::thread::Builder::new()
            .name("rdma-hint-verbs-events".into())
            .spawn(move || run(&shared, &watched, &oob))?;
        Ok(EventThread { events, handle: Some(handle), _loan: loan })
    }

    pub(crate) fn stop(&mut self) {
        let Some(handle) = self.handle.take() else { return };
        self.events.stop.store(true, Ordering::Release);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to the eventfd this struct owns.
        unsafe { libc::write(self.events.stop_fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        let _ = handle.join();
    }
}

impl Drop for EventThread {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for Lent<()> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lent")
    }
}

fn run(events: &Events, watched: &Watched, oob: &TcpStream) {
    // SAFETY: the channel is live while the thread runs.
    let channel_fd = unsafe { (*watched.channel).fd };
    let mut oob_fd = oob.as_raw_fd();
    while !events.stop.load(Ordering::Acquire) {
        let mut fds = [
            libc::pollfd { fd: events.stop_fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: channel_fd, events: libc::POLLIN, revents: 0 },
            // A negative fd is ignored by poll: the socket is not watched once it reported.
            libc::pollfd { fd: oob_fd, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: `fds` holds 3 initialised entries for descriptors that stay open meanwhile.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if ready < 0 {
            if std::io::Error::last_os_error().kind() == ErrorKind::Interrupted {
                continue;
            }
            events
                .fail(format!("polling the completion channel failed: {}", std::io::Error::last_os_error()));
            return;
        }
        if fds[1].revents != 0 {
            drain_channel(events, watched);
        }
        if fds[2].revents != 0 {
            if let Some(loss) = peer_left(oob) {
                events.lost(loss);
                oob_fd = -1;
            }
        }
    }
}

/// Takes every pending CQ event: ack, re-arm, then wake (in that order, so a completion that
/// lands after the wake-up produces a new event).
fn drain_channel(events: &Events, watched: &Watched) {
    loop {
        let mut cq: *mut ibv::ibv_cq = std::ptr::null_mut();
        let mut context: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the channel is live and non-blocking; both out-pointers are valid.
        if unsafe { ibv::ibv_get_cq_event(watched.channel, &mut cq, &mut context) } != 0 {
            return;
        }
        // SAFETY: `cq` is one of our two live CQs (the only ones on this channel); acked once.
        unsafe { ibv::ibv_ack_cq_events(cq, 1) };
        if let Err(e) = arm(cq) {
            events.fail(format!("re-arming the CQ failed: {e}"));
        }
        if cq == watched.send_cq {
            events.completions.notify();
        } else if cq == watched.recv_cq {
            events.arrivals.notify();
        }
    }
}
