//! Errors of planning and of transfers.

use rdma_hint_core::TransportError;
use rdma_hint_core::{ErrorKind, HintError};
use thiserror::Error;

/// Why a plan cannot be made. Nothing has been posted when one of these is returned.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PlanError {
    /// A transfer of 0 bytes.
    #[error("transfer length is 0 bytes")]
    ZeroLength,
    /// A block size and alignment the model's rules refuse (a zero block, an alignment that
    /// is not a power of two, a block that is not a whole number of alignment units).
    #[error(transparent)]
    Spec(#[from] HintError),
    /// The transfer runs past the end of a region.
    #[error("{side} range {offset}+{len} B lies outside the {region_len} B region")]
    OutOfRegion {
        /// `local` or `remote`.
        side: &'static str,
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Region length.
        region_len: u64,
    },
    /// A posting policy that cannot work (window smaller than a batch, signalling rarer than
    /// the window).
    #[error("invalid posting policy: {0}")]
    InvalidPolicy(String),
}

/// Why a transfer stopped, the [`Chunker`](crate::Chunker)'s or the
/// [`Engine`](crate::Engine)'s. `confirmed_bytes` counts payload bytes whose completion
/// arrived; nothing beyond them is reported delivered.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransferError {
    /// The transfer could not be planned; nothing was posted.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The engine refused the request before posting anything ([`Engine::submit`]'s
    /// refusals, so that `?` carries them into this type).
    ///
    /// [`Engine::submit`]: crate::Engine::submit
    #[error(transparent)]
    Refused(#[from] crate::RequestError),
    /// The transport failed (for an engine transfer: a lane of its connection failed while
    /// one of its blocks was in flight, or every lane failed while it was queued).
    #[error("transport error after {confirmed_bytes} B confirmed: {source}")]
    Transport {
        /// The transport's error.
        source: TransportError,
        /// Payload bytes confirmed delivered before it.
        confirmed_bytes: u64,
    },
    /// The transfer's own deadline passed first.
    #[error("deadline passed after {confirmed_bytes} of {len} B confirmed")]
    DeadlineExceeded {
        /// Payload bytes confirmed delivered.
        confirmed_bytes: u64,
        /// Payload bytes asked for.
        len: u64,
    },
    /// Cancelled (or the engine dropped) before it finished; blocks already posted may still
    /// land.
    #[error("cancelled after {confirmed_bytes} B confirmed")]
    Cancelled {
        /// Payload bytes confirmed.
        confirmed_bytes: u64,
    },
    /// The wait's deadline passed first; the transfer goes on and can be waited for again.
    #[error("the wait ended at its deadline; the transfer is still running")]
    WaitDeadline,
    /// Not a transfer of this engine, or its result was already handed out.
    #[error("unknown transfer (never submitted here, or already collected)")]
    UnknownTransfer,
}

impl PlanError {
    /// What kind of failure this is: always the call's ([`ErrorKind::InvalidInput`]): a plan
    /// fails on its inputs alone.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidInput
    }
}

impl TransferError {
    /// What kind of failure this is (a refusal's or a transport's own kind, through them).
    ///
    /// ```
    /// use rdma_hint_core::ErrorKind;
    /// use rdma_hint_engine::{RequestError, TransferError};
    /// let full = TransferError::Refused(RequestError::Full { max_transfers: 4096 });
    /// assert_eq!(full.kind(), ErrorKind::Busy); // wait for a transfer to end, or submit_when_ready
    /// assert_eq!(TransferError::WaitDeadline.kind(), ErrorKind::Deadline);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            TransferError::Plan(error) => error.kind(),
            TransferError::Refused(error) => error.kind(),
            TransferError::Transport { source, .. } => source.kind(),
            TransferError::DeadlineExceeded { .. } | TransferError::WaitDeadline => ErrorKind::Deadline,
            TransferError::Cancelled { .. } => ErrorKind::Cancelled,
            TransferError::UnknownTransfer => ErrorKind::InvalidInput,
        }
    }

    /// Payload bytes confirmed delivered before the error (0 for planning errors and refusals,
    /// and for a wait or an id that says nothing of the transfer's bytes).
    pub fn confirmed_bytes(&self) -> u64 {
        match self {
            TransferError::Plan(_)
            | TransferError::Refused(_)
            | TransferError::WaitDeadline
            | TransferError::UnknownTransfer => 0,
            TransferError::Transport { confirmed_bytes, .. }
            | TransferError::DeadlineExceeded { confirmed_bytes, .. }
            | TransferError::Cancelled { confirmed_bytes } => *confirmed_bytes,
        }
    }
}
