//! Completion and arrival queues for backends built on crossbeam channels: drain without
//! waiting, or wait for the first item until a deadline. Neither allocates.

use crate::transport::TransportError;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::time::Instant;

/// Moves ready items into `out` without waiting; returns how many.
///
/// ```
/// let (tx, rx) = crossbeam_channel::bounded(4);
/// tx.send(7u32).unwrap();
/// let mut out = [0u32; 4];
/// assert_eq!(rdma_hint_core::queue::drain(&rx, &mut out), 1);
/// assert_eq!(out[0], 7);
/// ```
pub fn drain<T>(queue: &Receiver<T>, out: &mut [T]) -> usize {
    let mut ready = 0;
    while ready < out.len() {
        match queue.try_recv() {
            Ok(item) => {
                out[ready] = item;
                ready += 1;
            }
            Err(_) => break,
        }
    }
    ready
}

/// Waits for at least one item until `deadline`, then drains what else is ready.
///
/// A passed deadline is [`TransportError::DeadlineExceeded`] naming `what`; a queue whose
/// senders are all gone is `on_disconnect()` (typically [`TransportError::PeerGone`]).
pub fn wait<T>(
    queue: &Receiver<T>,
    out: &mut [T],
    deadline: Instant,
    what: &'static str,
    on_disconnect: impl FnOnce() -> TransportError,
) -> Result<usize, TransportError> {
    let ready = drain(queue, out);
    if ready > 0 || out.is_empty() {
        return Ok(ready);
    }
    let started = Instant::now();
    match queue.recv_deadline(deadline) {
        Ok(item) => {
            out[0] = item;
            Ok(1 + drain(queue, &mut out[1..]))
        }
        Err(RecvTimeoutError::Timeout) => {
            Err(TransportError::DeadlineExceeded { what, waited_ms: started.elapsed().as_millis() as u64 })
        }
        Err(RecvTimeoutError::Disconnected) => Err(on_disconnect()),
    }
}
