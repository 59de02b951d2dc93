//! Completion queues and the completion channel they report to: `ibv_create_comp_channel` /
//! `ibv_create_cq`, polling (`ibv_poll_cq`), arming (`ibv_req_notify_cq`) and taking events
//! (`ibv_get_cq_event` / `ibv_ack_cq_events`). Each CQ holds an `Arc` of its channel, so the
//! channel is destroyed after every CQ on it.

use crate::context::Context;
use crate::handle::Owned;
use crate::status::unavailable;
use rdma_hint_core::TransportError;
use rdma_mummy_sys as ibv;
use std::os::fd::RawFd;
use std::sync::Arc;

/// A completion channel (CQ events arrive on its fd, made non-blocking), destroyed on drop.
#[derive(Debug)]
pub(crate) struct CompletionChannel(Owned<ibv::ibv_comp_channel, Arc<Context>>);

impl CompletionChannel {
    /// Creates a completion channel on `context` and makes its fd non-blocking.
    pub(crate) fn create(context: &Arc<Context>) -> Result<CompletionChannel, TransportError> {
        // SAFETY: the context is open (held by the `Arc`); every CQ on the channel holds an `Arc`
        // of it.
        let channel = unsafe { Owned::take(ibv::ibv_create_comp_channel(context.raw()), context.clone()) }
            .map(CompletionChannel)
            .ok_or_else(|| unavailable("ibv_create_comp_channel"))?;
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

    /// The descriptor that becomes readable when a CQ event is pending.
    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live until this value drops; `fd` is a plain field.
        unsafe { (*self.0.raw()).fd }
    }

    /// Takes the next pending event without blocking and returns the CQ of `cqs` it is for;
    /// `None` when no event is pending. The caller acknowledges it ([`CompletionQueue::ack_event`]).
    ///
    /// `cqs` are the CQs created on this channel; an event for any other (there is none) is
    /// left unacknowledged and skipped.
    pub(crate) fn get_event<'cq>(&self, cqs: &[&'cq CompletionQueue]) -> Option<&'cq CompletionQueue> {
        loop {
            let mut cq: *mut ibv::ibv_cq = std::ptr::null_mut();
            let mut context: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: the channel is live and non-blocking; both out-pointers are valid.
            if unsafe { ibv::ibv_get_cq_event(self.0.raw(), &mut cq, &mut context) } != 0 {
                return None;
            }
            match cqs.iter().find(|ours| ours.raw() == cq) {
                Some(ours) => return Some(ours),
                None => tracing::warn!("verbs: an event for a CQ this transport does not know"),
            }
        }
    }
}

/// A completion queue reporting to a [`CompletionChannel`], destroyed on drop: by then the QP
/// on it is gone (it holds an `Arc` of the CQ) and every event taken for it was acknowledged
/// (the event thread acknowledges each one as it takes it, and holds an `Arc` while it runs).
#[derive(Debug)]
pub(crate) struct CompletionQueue(Owned<ibv::ibv_cq, Arc<CompletionChannel>>);

impl CompletionQueue {
    /// Creates a CQ of at least `depth` entries on `channel`'s context, reporting to `channel`.
    /// `None` when `ibv_create_cq` fails, with `errno` saying why.
    pub(crate) fn create(channel: &Arc<CompletionChannel>, depth: u32) -> Option<CompletionQueue> {
        let context = channel.0.parent().raw();
        // SAFETY: the context and the channel are live (held by the `Arc`s); no CQ context.
        let raw =
            unsafe { ibv::ibv_create_cq(context, depth as i32, std::ptr::null_mut(), channel.0.raw(), 0) };
        // SAFETY: the CQ is ours alone; the QP created on it holds an `Arc` of it.
        unsafe { Owned::take(raw, channel.clone()) }.map(CompletionQueue)
    }

    /// The raw CQ, for creating a QP on it; valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut ibv::ibv_cq {
        self.0.raw()
    }

    /// Arms the CQ so its next completion produces an event on its channel.
    pub(crate) fn arm(&self) -> Result<(), TransportError> {
        // SAFETY: the CQ is live and was created on a completion channel.
        match unsafe { ibv::ibv_req_notify_cq(self.raw(), 0) } {
            0 => Ok(()),
            code => Err(TransportError::Io(std::io::Error::from_raw_os_error(code))),
        }
    }

    /// Acknowledges one event taken for this CQ ([`CompletionChannel::get_event`]).
    pub(crate) fn ack_event(&self) {
        // SAFETY: the CQ is live; acknowledging only counts the event (ibv_destroy_cq waits
        // until every event taken has been counted).
        unsafe { ibv::ibv_ack_cq_events(self.raw(), 1) };
    }

    /// Polls up to `wcs.len()` completions into `wcs` and returns how many there were.
    pub(crate) fn poll(&self, wcs: &mut [ibv::ibv_wc]) -> Result<usize, TransportError> {
        // SAFETY: the CQ is live; `wcs` holds `wcs.len()` writable entries.
        let found = unsafe { ibv::ibv_poll_cq(self.raw(), wcs.len() as i32, wcs.as_mut_ptr()) };
        if found < 0 {
            return Err(unavailable("ibv_poll_cq"));
        }
        Ok(found as usize)
    }
}
