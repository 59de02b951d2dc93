//! The one error type of every transport.

use crate::caller_memory::CallerMemory;
use crate::error_kind::ErrorKind;
use crate::region::{MemoryKind, RegionId};
use std::net::SocketAddr;
use thiserror::Error;

/// Errors of any transport. Every wait has a deadline, so a dead peer ends in
/// [`TransportError::DeadlineExceeded`] or [`TransportError::PeerGone`], never a hang.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The backend cannot run here (library or device missing).
    #[error("the {backend} backend is unavailable: {reason}")]
    Unavailable {
        /// Backend name.
        backend: &'static str,
        /// Why (e.g. "libibverbs.so.1 not found").
        reason: String,
    },
    /// The transport cannot register this memory kind.
    #[error("memory kind {kind:?} cannot be registered on this transport")]
    UnsupportedMemory {
        /// The kind asked for.
        kind: MemoryKind,
    },
    /// Memory could not be registered (zero or absurd length, allocation refused).
    #[error("cannot register {len} B: {reason}")]
    Registration {
        /// Length asked for.
        len: u64,
        /// Why.
        reason: String,
    },
    /// Registering `len` bytes would commit more memory than can be spared: by the machine
    /// (`MemAvailable` less a margin), this process's memory cgroup, or the transport's own cap.
    /// Nothing was allocated; register less, raise the cap or free memory.
    #[error("cannot register {len} B: only {available} B can be committed ({limited_by})")]
    OutOfMemory {
        /// Length asked for, in bytes.
        len: u64,
        /// Bytes that could be committed now, in bytes.
        available: u64,
        /// What sets `available`: the machine, a cgroup (with its path), or the cap.
        limited_by: String,
    },
    /// An op names a region that is not registered (or was deregistered).
    #[error("region {0:?} is not registered")]
    UnregisteredRegion(RegionId),
    /// An op names a region of the peer's that the peer withdrew
    /// ([`Transport::withdraw`](crate::Transport::withdraw)); nothing was posted.
    #[error("the peer withdrew region {0:?}")]
    RegionWithdrawn(RegionId),
    /// An op runs past the end of a region.
    #[error("{side} range {offset}+{len} B exceeds the region's {region_len} B")]
    OutOfBounds {
        /// `local` or `remote`.
        side: &'static str,
        /// Offset in bytes.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Region length in bytes.
        region_len: u64,
    },
    /// An op of zero bytes.
    #[error("work request {wr_id} has zero length")]
    ZeroLength {
        /// The op's tag.
        wr_id: u64,
    },
    /// An op larger than the transport's max message.
    #[error("message of {len} B exceeds max_msg {max_msg_bytes} B")]
    MessageTooLarge {
        /// Length in bytes.
        len: u64,
        /// Largest message in bytes.
        max_msg_bytes: u64,
    },
    /// A gather op with more entries than the transport's [`Capabilities::max_sges`](crate::Capabilities::max_sges).
    #[error("a gather of {given} entries exceeds the transport's max_sges of {max_sges}")]
    TooManyEntries {
        /// Entries given.
        given: u32,
        /// Entries one work request may gather.
        max_sges: u32,
    },
    /// More ops in one post, or outstanding, than the queue allows.
    #[error("{given} work requests exceed the limit of {max}")]
    QueueFull {
        /// Requested.
        given: u32,
        /// Allowed.
        max: u32,
    },
    /// A deadline passed before the operation finished.
    #[error("deadline passed after {waited_ms} ms waiting for {what}")]
    DeadlineExceeded {
        /// What was awaited.
        what: &'static str,
        /// How long it waited.
        waited_ms: u64,
    },
    /// The peer closed the connection or stopped answering.
    #[error("peer gone: {0}")]
    PeerGone(String),
    /// The dialled address refused every attempt for the dial's grace period (3 s) or until
    /// the deadline: nobody listens there. Retry later if the peer may still start.
    #[error("connection refused by {address}: no peer listens there (retried for 3 s)")]
    Refused {
        /// The dialled address.
        address: SocketAddr,
    },
    /// The listener at `peer` is busy with another peer and turned this connection away
    /// before any hello: nothing was exchanged. Try again when it is done.
    #[error("the peer at {peer} is busy with another peer; try again when it is done")]
    PeerBusy {
        /// The peer's address.
        peer: String,
    },
    /// The peer did not present the pre-shared token this side expects.
    #[error("peer {peer} rejected: wrong or missing token")]
    Unauthorized {
        /// The peer's address.
        peer: String,
    },
    /// The out-of-band exchange carried something we do not accept (malformed, wrong version,
    /// other channel), or the peer refused ours.
    #[error("handshake rejected: {0}")]
    Handshake(String),
    /// An operation that needs a connection ran before [`Transport::connect`](crate::Transport::connect) succeeded.
    #[error("not connected: call connect first")]
    NotConnected,
    /// [`Transport::connect`](crate::Transport::connect) ran on a transport that is already connected (one peer each).
    #[error("already connected: a transport has one peer; open another transport")]
    AlreadyConnected,
    /// Caller memory whose first byte (or dma-buf offset) is not aligned as the path needs.
    #[error("{what} {value:#x} is not {align_bytes}-byte aligned")]
    Misaligned {
        /// What was misaligned (`host address`, `device pointer`, `dma-buf offset`).
        what: &'static str,
        /// The value given.
        value: u64,
        /// The alignment needed, in bytes.
        align_bytes: u64,
    },
    /// A region cannot be released now.
    #[error("region {region:?} is busy: {why}")]
    RegionBusy {
        /// The region.
        region: RegionId,
        /// Why (exposed to the connected peer, writes in flight).
        why: &'static str,
    },
    /// An argument is out of its range (a token's length, a bind address).
    #[error("invalid {what}: {why}")]
    InvalidArgument {
        /// What was invalid.
        what: &'static str,
        /// Why, with the accepted range.
        why: String,
    },
    /// A signalled op completed with an error status.
    #[error("work request {wr_id} failed with status {code}")]
    Completion {
        /// The op's tag.
        wr_id: u64,
        /// Backend status code.
        code: u32,
    },
    /// I/O error of the out-of-band channel or a software transport.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A registration of caller memory was refused: `error` says why, and the caller's memory
    /// comes back untouched in `memory`.
    #[error("{error}")]
    MemoryRefused {
        /// Why the transport refused.
        error: Box<TransportError>,
        /// The caller's memory, as it was given.
        memory: CallerMemory,
    },
    /// A GPU driver call failed.
    #[error("GPU driver call {call} failed: {detail}")]
    Driver {
        /// The call.
        call: &'static str,
        /// The driver's error.
        detail: String,
    },
}

impl TransportError {
    /// What kind of failure this is: what the caller can do about it.
    pub fn kind(&self) -> ErrorKind {
        use TransportError as E;
        match self {
            E::Unavailable { .. } | E::UnsupportedMemory { .. } => ErrorKind::Unsupported,
            E::Registration { .. } | E::Completion { .. } | E::Io(_) | E::Driver { .. } => ErrorKind::System,
            E::MemoryRefused { error, .. } => error.kind(),
            E::OutOfMemory { .. } => ErrorKind::Exhausted,
            E::UnregisteredRegion(_)
            | E::RegionWithdrawn(_)
            | E::OutOfBounds { .. }
            | E::ZeroLength { .. }
            | E::MessageTooLarge { .. }
            | E::TooManyEntries { .. }
            | E::NotConnected
            | E::AlreadyConnected
            | E::Misaligned { .. }
            | E::InvalidArgument { .. } => ErrorKind::InvalidInput,
            E::QueueFull { .. } | E::RegionBusy { .. } => ErrorKind::Busy,
            E::DeadlineExceeded { .. } => ErrorKind::Deadline,
            E::PeerGone(_)
            | E::Refused { .. }
            | E::PeerBusy { .. }
            | E::Unauthorized { .. }
            | E::Handshake(_) => ErrorKind::Peer,
        }
    }
}
