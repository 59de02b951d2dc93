//! Completion and arrival queues for backends: bounded crossbeam channels whose sender wakes the
//! waits sleeping on the receiving side. Posting into and draining them never allocates.

use crate::wait::{wait, Notifier};
use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use rdma_hint_core::TransportError;
use rdma_hint_core::WaitMode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Moves ready items into `out` without waiting; returns how many.
///
/// ```
/// let (tx, rx) = crossbeam_channel::bounded(4);
/// tx.send(7u32).unwrap();
/// let mut out = [0u32; 4];
/// assert_eq!(rdma_hint_backend_core::queue::drain(&rx, &mut out), 1);
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

/// A bounded queue of `capacity` items whose sender wakes sleeping waits.
///
/// ```
/// use rdma_hint_backend_core::blocking::block_on;
/// use rdma_hint_core::{TransportError, WaitMode};
/// use rdma_hint_backend_core::queue::event_queue;
/// use std::time::{Duration, Instant};
///
/// let (sender, queue) = event_queue::<u32>(8);
/// let producer = std::thread::spawn(move || sender.try_send(5).unwrap());
/// let mut out = [0u32; 8];
/// let deadline = Instant::now() + Duration::from_secs(5);
/// let ready = block_on(queue.wait(&mut out, WaitMode::Adaptive, deadline, "a number", || {
///     TransportError::PeerGone("the producer left".into())
/// }));
/// assert_eq!((ready.unwrap(), out[0]), (1, 5));
/// producer.join().unwrap();
/// ```
pub fn event_queue<T>(capacity: usize) -> (EventSender<T>, EventQueue<T>) {
    let (sender, receiver) = crossbeam_channel::bounded(capacity);
    let notifier = Arc::new(Notifier::default());
    let senders = Arc::new(AtomicUsize::new(1));
    (
        EventSender { sender: Some(sender), notifier: notifier.clone(), senders: senders.clone() },
        EventQueue { receiver, notifier, senders },
    )
}

/// The producing side of an [`event_queue`]; dropping the last one wakes waits to see the
/// queue disconnected.
#[derive(Debug)]
pub struct EventSender<T> {
    /// `None` only while dropping: the channel must close before the waits are woken.
    sender: Option<Sender<T>>,
    notifier: Arc<Notifier>,
    /// Live senders, counted down after each one's channel handle is gone.
    senders: Arc<AtomicUsize>,
}

impl<T> Clone for EventSender<T> {
    fn clone(&self) -> Self {
        self.senders.fetch_add(1, Ordering::Relaxed);
        EventSender {
            sender: self.sender.clone(),
            notifier: self.notifier.clone(),
            senders: self.senders.clone(),
        }
    }
}

impl<T> EventSender<T> {
    /// Items the queue takes now (0 once it is closed).
    pub fn room(&self) -> usize {
        self.sender
            .as_ref()
            .map_or(0, |sender| sender.capacity().unwrap_or(usize::MAX).saturating_sub(sender.len()))
    }

    /// Queues `item` without blocking and wakes the waits; a full queue hands it back.
    pub fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        let sent = match &self.sender {
            Some(sender) => sender.try_send(item),
            None => Err(TrySendError::Disconnected(item)),
        };
        if sent.is_ok() {
            self.notifier.notify();
        }
        sent
    }

    /// Wakes the waits without queueing anything (the producer's state changed: a link broke).
    pub fn wake(&self) {
        self.notifier.notify();
    }
}

impl<T> Drop for EventSender<T> {
    fn drop(&mut self) {
        // Close (this handle of) the channel first: a woken wait must see it disconnected.
        drop(self.sender.take());
        // Released after the handle went: a drain that reads 0 sees every item sent before.
        self.senders.fetch_sub(1, Ordering::Release);
        self.notifier.notify();
    }
}

/// Every sender of an [`event_queue`] is gone and nothing is left in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disconnected;

/// The receiving side of an [`event_queue`].
#[derive(Debug)]
pub struct EventQueue<T> {
    receiver: Receiver<T>,
    notifier: Arc<Notifier>,
    senders: Arc<AtomicUsize>,
}

impl<T> EventQueue<T> {
    /// Moves ready items into `out` without waiting; [`Disconnected`] when nothing is left and
    /// every sender is gone.
    pub fn try_drain(&self, out: &mut [T]) -> Result<usize, Disconnected> {
        let mut ready = 0;
        while ready < out.len() {
            // A look at the length costs two loads where a receive from an empty queue costs
            // a full fence (crossbeam's bounded flavour): the common empty poll stays cheap.
            if self.receiver.is_empty() {
                let closed = self.senders.load(Ordering::Acquire) == 0;
                if !closed {
                    break;
                }
                // Every send is visible now: what the first look missed is taken below.
                if self.receiver.is_empty() {
                    return if ready == 0 { Err(Disconnected) } else { Ok(ready) };
                }
            }
            match self.receiver.try_recv() {
                Ok(item) => {
                    out[ready] = item;
                    ready += 1;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if ready == 0 => return Err(Disconnected),
                Err(TryRecvError::Disconnected) => break,
            }
        }
        Ok(ready)
    }

    /// Items queued now.
    pub fn len(&self) -> usize {
        self.receiver.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.receiver.is_empty()
    }

    /// Items that can still be queued before the queue is full.
    pub fn room(&self) -> usize {
        self.receiver.capacity().map_or(usize::MAX, |capacity| capacity.saturating_sub(self.receiver.len()))
    }

    /// The notifier senders wake (for waits that also look at other state).
    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// Waits for at least one item until `deadline`, then drains what else is ready. A queue
    /// whose senders are all gone is `on_disconnect()` (typically
    /// [`TransportError::PeerGone`]); a passed deadline is
    /// [`TransportError::DeadlineExceeded`] naming `what`.
    pub async fn wait(
        &self,
        out: &mut [T],
        mode: WaitMode,
        deadline: Instant,
        what: &'static str,
        on_disconnect: impl Fn() -> TransportError + Unpin,
    ) -> Result<usize, TransportError> {
        if out.is_empty() {
            return Ok(0);
        }
        wait(&self.notifier, mode, deadline, what, || match self.try_drain(out) {
            Ok(0) => Ok(None),
            Ok(ready) => Ok(Some(ready)),
            Err(Disconnected) => Err(on_disconnect()),
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_queue_reads_disconnected_only_once_every_sender_is_gone() {
        let (sender, queue) = event_queue::<u32>(4);
        let mut out = [0u32; 4];
        assert_eq!(queue.try_drain(&mut out), Ok(0), "empty, a sender alive");
        let second = sender.clone();
        sender.try_send(1).unwrap();
        second.try_send(2).unwrap();
        drop(sender);
        assert_eq!(queue.try_drain(&mut out[..1]), Ok(1), "what fits");
        assert_eq!(queue.try_drain(&mut out), Ok(1), "the rest, a clone alive");
        assert_eq!(out[0], 2);
        assert_eq!(queue.try_drain(&mut out), Ok(0), "empty, the clone alive");
        second.try_send(3).unwrap();
        drop(second);
        assert_eq!(queue.try_drain(&mut out), Ok(1), "an item sent before the last sender went");
        assert_eq!(queue.try_drain(&mut out), Err(Disconnected));
    }
}
