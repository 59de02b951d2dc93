//! Host-staged fallback backend for rdma-hint: the path every machine has.
//!
//! [`StagedTransport`] gives RDMA-WRITE semantics without an RDMA NIC: a registered local region
//! is written into a registered remote region at an offset, with selective signalling and
//! write-with-immediate arrivals.
//!
//! * **shm** (same host): regions are sealed anonymous memfds whose descriptors cross to the
//!   peer over a Unix socket at connect ([`handoff`]); the peer maps them and its sender
//!   thread copies each block straight into the receiver's memory (one copy);
//!   completions are local, arrivals travel as small frames over the control socket.
//! * **tcp** (any host): each block is a framed write on the socket, read by the receiver
//!   straight into the target region; signalled writes are acknowledged once placed.
//!
//! Out-of-band setup and every frame are validated ([`wire`]); a peer that vanishes breaks
//! the link, flushes outstanding signalled writes with an error, and every wait has a deadline.
//! With feature `cuda`, [`gpu`] reports the machine's GPU facts.

pub mod channel;
pub mod gpu;
pub mod handoff;
mod lane;
mod link;
mod local;
mod memory;
pub mod protocol;
mod reads;
mod region;
mod request;
pub mod ring;
pub mod session;
mod socket;
mod transport;
pub mod wire;

pub use channel::{capabilities, StagedChannel};
/// The cudarc the GPU paths are built on, for callers that allocate `CudaSlice`s to register.
#[cfg(feature = "cuda")]
pub use cudarc;
pub use transport::StagedTransport;

/// Backend name used in transport ids (`staged:shm`, `staged:tcp`).
pub const BACKEND: &str = "staged";

/// Status code of work requests flushed because the connection broke.
pub const FLUSHED_STATUS: u32 = session::FLUSHED;
