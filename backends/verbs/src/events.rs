//! The thread that watches the completion channel: CQ events wake the tasks waiting on the CQ
//! (re-arming it first, so no completion falls between the event and the next arm); the
//! out-of-band socket's control frames are acted on, and its EOF marks the peer gone.
//!
//! A CQ is armed only while someone may sleep on it: in [`WaitMode::BusyPoll`] with nobody
//! asleep, an event leaves the CQ unarmed, so the busy-polling waiter's completions wake no
//! thread (on a machine with as many cores as pollers, that wake-up preempts a poller: in the
//! 2-core Soft-RoCE guest it was most of a small write's round trip). A wait that goes to
//! sleep arms the CQ itself first ([`Events::arm_before_sleep`]).

use crate::cq::{CompletionChannel, CompletionQueue};
use crate::lending::Lent;
use rdma_hint_backend_core::wait::{Notifier, WaitModeCell};
use rdma_hint_backend_core::PeerGone;
use rdma_hint_core::TransportError;
use rdma_hint_core::WaitMode;
use rdma_hint_oob::PeerLoss;
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What the transport and its event thread share.
#[derive(Debug)]
pub(crate) struct Events {
    /// Woken when the send CQ has an event.
    pub(crate) completions: Notifier,
    /// Woken when the receive CQ has an event.
    pub(crate) arrivals: Notifier,
    /// Why the connection is gone; first reason wins.
    pub(crate) gone: PeerGone,
    /// How the transport's waits wait (the event thread re-arms in `Adaptive` only).
    pub(crate) wait_mode: WaitModeCell,
    /// Whether the send CQ is armed (or about to be): cleared when its event is taken.
    send_armed: AtomicBool,
    /// The same for the receive CQ.
    recv_armed: AtomicBool,
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
            gone: PeerGone::default(),
            wait_mode: WaitModeCell::default(),
            // Both CQs are armed when they are created.
            send_armed: AtomicBool::new(true),
            recv_armed: AtomicBool::new(true),
            stop: AtomicBool::new(false),
            stop_fd,
        })
    }

    /// Arms `cq` (the send CQ when `send`) unless it is armed, for a wait about to sleep on it
    /// after a look found nothing; `true` when it armed it, so the caller looks once more
    /// (a completion that came before the arm produced no event).
    ///
    /// Against the event thread: it clears the flag, then re-arms only if someone sleeps. A
    /// wait registers before its last look, so either the thread sees it registered and re-arms,
    /// or this look sees the flag cleared and arms.
    pub(crate) fn arm_before_sleep(&self, cq: &CompletionQueue, send: bool) -> Result<bool, TransportError> {
        let armed = if send { &self.send_armed } else { &self.recv_armed };
        if armed.load(Ordering::SeqCst) || armed.swap(true, Ordering::SeqCst) {
            return Ok(false);
        }
        cq.arm()?;
        Ok(true)
    }

    /// Marks the connection gone and wakes every waiter.
    pub(crate) fn fail(&self, why: String) {
        self.lost(PeerLoss::failure(why));
    }

    /// Marks the connection gone for `loss` (quietly when the peer said goodbye) and wakes
    /// every waiter.
    pub(crate) fn lost(&self, loss: PeerLoss) {
        if self.gone.set(loss.why.clone()) {
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

/// What the event thread watches: the channel both CQs report to, and the CQs. Holding them
/// keeps them alive while the thread runs (it is joined before the transport releases them).
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    pub(crate) channel: Arc<CompletionChannel>,
    pub(crate) send_cq: Arc<CompletionQueue>,
    pub(crate) recv_cq: Arc<CompletionQueue>,
}

/// The running event thread; [`EventThread::stop`] (or dropping it) joins it.
#[derive(Debug)]
pub(crate) struct EventThread {
    events: Arc<Events>,
    handle: Option<JoinHandle<()>>,
    /// Counts the thread as lent while it runs: a transport dropped while the thread is still
    /// with an abandoned `connect` waits for it (and so for the `Watched` handles it holds).
    _loan: Lent<()>,
}

impl EventThread {
    /// Starts the thread: it watches `watched` and the out-of-band socket `oob`, and when the
    /// socket is readable calls `control` (which acts on the peer's requests and says whether
    /// the peer is gone).
    pub(crate) fn start(
        events: Arc<Events>,
        watched: Watched,
        oob: RawFd,
        control: impl Fn() -> Option<PeerLoss> + Send + 'static,
        loan: Lent<()>,
    ) -> Result<EventThread, TransportError> {
        let shared = events.clone();
        let handle = std::thread::Builder::new()
            .name("rdma-hint-verbs-events".into())
            .spawn(move || run(&shared, &watched, oob, &control))?;
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

fn run(events: &Events, watched: &Watched, oob: RawFd, control: &dyn Fn() -> Option<PeerLoss>) {
    let channel_fd = watched.channel.fd();
    let mut oob_fd = oob;
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
        if fds[1].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            // A broken channel would report forever and spin this thread.
            events.fail(format!("the completion channel reported {:#x}", fds[1].revents));
            return;
        }
        if fds[1].revents != 0 {
            drain_channel(events, watched);
        }
        if fds[2].revents != 0 {
            // The peer's requests are acted on here; its loss ends the watch.
            if let Some(loss) = control() {
                events.lost(loss);
                oob_fd = -1;
            }
        }
    }
}

/// Takes every pending CQ event: ack, re-arm where someone may sleep on the CQ, then wake (in
/// that order, so a completion that lands after the wake-up produces a new event).
fn drain_channel(events: &Events, watched: &Watched) {
    let cqs = [&*watched.send_cq, &*watched.recv_cq];
    while let Some(cq) = watched.channel.get_event(&cqs) {
        cq.ack_event();
        let (armed, notifier) = if std::ptr::eq(cq, cqs[0]) {
            (&events.send_armed, &events.completions)
        } else {
            (&events.recv_armed, &events.arrivals)
        };
        // The event disarmed the CQ. Cleared before the look at the sleepers: a wait that
        // registers after that look finds the flag cleared and arms the CQ itself.
        armed.store(false, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if events.wait_mode.get() == WaitMode::Adaptive || notifier.has_waiters() {
            armed.store(true, Ordering::SeqCst);
            if let Err(e) = cq.arm() {
                events.fail(format!("re-arming the CQ failed: {e}"));
            }
        }
        notifier.notify();
    }
}
