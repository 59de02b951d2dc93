//! # rdma-hint-engine
//!
//! Moves data in exactly the blocks a hint asks for, over any [`Transport`].
//!
//! * [`ChunkPlan`] cuts a transfer into fixed-length blocks on a grid anchored at the region
//!   start; every block starts aligned and the tail is padded up to the alignment, so every round
//!   has the same alignment state (the fix for jitter). Plans are `Copy` arithmetic: no block list
//!   is ever allocated.
//! * [`PostPolicy`] groups blocks into batches of up to N work requests per doorbell, signals
//!   every k-th and the last, and keeps up to W outstanding.
//! * [`Chunker`] holds one hint per memory source (a GPU behind a switch and a direct GPU get
//!   different blocks) and runs the pipeline: pre-sized buffers, no allocation while posting.
//! * [`Engine`] keeps many transfers in flight over connections to many peers, each
//!   connection one or more lanes: `submit` never blocks, completions are routed back by
//!   `wr_id`, blocks of concurrent transfers interleave.
//! * [`LoopbackTransport`] is a real in-process transport (two regions, `memcpy` on post,
//!   completions through a crossbeam queue) for tests and benches.
//!
//! ```
//! use rdma_hint_engine::{BlockSpec, Chunker, LoopbackTransport, PostPolicy, Transfer};
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
//! let transfer = Transfer::new(&src, &remote, 100_000).notify(42);
//! let report = rdma_hint_backend_core::blocking::block_on(chunker.write(&transport, transfer, deadline)).unwrap();
//! assert_eq!(report.payload_bytes, 100_000);
//! assert_eq!(report.blocks, 2);
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
mod loopback;
mod pipeline;
mod plan;
mod policy;
mod transfer;

pub use chunker::Chunker;
pub use engine::{
    validate_segments, Class, Delivered, Engine, EngineConfig, LaneStats, PeerId, RequestError, Segment,
    TransferId, TransferRequest, TransferStatus, MAX_LANES, MAX_PEERS, MAX_SEGMENTS, MAX_TRANSFERS,
};
pub use error::{PlanError, TransferError};
pub use loopback::LoopbackTransport;
pub use pipeline::{Pipeline, TransferReport};
pub use plan::{Block, BlockSpec, Blocks, ChunkPlan};
pub use policy::{PostPolicy, SignalSchedule};
pub use transfer::Transfer;

#[doc(no_inline)]
pub use rdma_hint_core::Transport;
