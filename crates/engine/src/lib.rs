//! # rdma-hint-engine
//!
//! Moves data in exactly the blocks a hint asks for, over any [`Transport`]: one scheduler,
//! one request type, one result and one error, whether a thread drives it or the caller.
//!
//! * [`Engine`] keeps many transfers in flight over connections to many peers, each
//!   connection one or more lanes: `submit` never blocks, completions are routed back by
//!   `wr_id`, blocks of concurrent transfers interleave; its driver thread rings the doorbells.
//! * [`Chunker`] is the same scheduler over one transport the caller lends it per transfer,
//!   driven inside [`Chunker::transfer`] by the caller's own task: no thread, no peer to add.
//! * A [`TransferRequest`] is a write or a read, of one range or scattered segments, announced
//!   to the receiver or not; it is cut at the hint of its source ([`BlockSpec`]), from its
//!   start, the last block what is left ([`ChunkPlan`] is that arithmetic, for display).
//! * [`PostPolicy`] groups blocks into doorbells of up to N work requests, signals every k-th
//!   and each doorbell's last, and keeps up to W outstanding.
//! * [`LoopbackTransport`] is a real in-process transport (two regions, `memcpy` on post,
//!   completions through a crossbeam queue) for tests and benches.
//!
//! ```
//! use rdma_hint_engine::{BlockSpec, Chunker, LoopbackTransport, PostPolicy, TransferRequest};
//! use rdma_hint_core::{MemoryKind, PeerEndpoint, Transport};
//! use rdma_hint_core::SourceId;
//! use std::time::{Duration, Instant};
//!
//! let transport = LoopbackTransport::new(64);
//! let src = transport.register(MemoryKind::Host, 1 << 20).unwrap();
//! let dst = transport.register(MemoryKind::Host, 1 << 20).unwrap();
//! transport.write_region(src.id, 0, &[7u8; 100_000]).unwrap();
//! let deadline = Instant::now() + Duration::from_secs(5);
//! let remote = rdma_hint_backend_core::blocking::block_on(transport.connect(
//!     PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap()), &[dst.id], deadline)).unwrap()[0];
//!
//! let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
//! chunker.set_hint(SourceId::Host(0), BlockSpec::new(64 * 1024, 4096).unwrap());
//! let request = TransferRequest::single(&src, 0, &remote, 0, 100_000).notify(42);
//! let delivered = chunker.transfer_blocking(&transport, request, deadline).unwrap();
//! assert_eq!((delivered.bytes, delivered.blocks), (100_000, 2));
//! // The receiver side learns that the whole transfer landed.
//! let mut arrivals = [rdma_hint_core::Arrival::EMPTY; 4];
//! assert_eq!(transport.poll_arrivals(&mut arrivals).unwrap(), 1);
//! assert_eq!(arrivals[0].imm, 42);
//! let mut arrived = vec![0u8; 100_000];
//! transport.read_region(dst.id, 0, &mut arrived).unwrap();
//! assert!(arrived.iter().all(|b| *b == 7));
//! ```
#![forbid(unsafe_code)]

mod chunker;
mod engine;
mod error;
pub mod events;
mod loopback;
mod plan;
mod policy;

pub use chunker::Chunker;
pub use engine::{
    validate_segments, Class, Delivered, Engine, EngineConfig, LaneStats, PeerId, RequestError, Segment,
    TransferId, TransferRequest, TransferStatus, MAX_LANES, MAX_PEERS, MAX_SEGMENTS, MAX_TRANSFERS,
};
pub use error::{PlanError, TransferError};
pub use loopback::LoopbackTransport;
pub use plan::{Block, BlockSpec, Blocks, ChunkPlan};
pub use policy::PostPolicy;

#[doc(no_inline)]
pub use rdma_hint_core::Transport;
