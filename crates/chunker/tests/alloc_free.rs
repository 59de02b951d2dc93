//! The posting path allocates nothing: a whole chunked transfer on the loopback transport,
//! counted by a global allocator.

use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_chunker::{BlockSpec, Chunker, LoopbackTransport, PostPolicy, Transfer};
use rdma_hint_core::SourceId;
use rdma_hint_core::{MemoryKind, PeerEndpoint, Transport};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn a_transfer_allocates_nothing() {
    let transport = LoopbackTransport::new(64);
    let src = transport.register(MemoryKind::Host, 8 << 20).unwrap();
    let dst = transport.register(MemoryKind::Host, 8 << 20).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(transport.connect(listen, &[dst.id], deadline)).unwrap()[0];
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(16 * 1024, 4096).unwrap());
    // Warm up once (first-use initialisation in the runtime, if any).
    block_on(chunker.write(&transport, Transfer::new(&src, &remote, 1 << 20), deadline)).unwrap();

    COUNTING.store(true, Ordering::SeqCst);
    let report = block_on(chunker.write(&transport, Transfer::new(&src, &remote, (8 << 20) - 5), deadline));
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(report.unwrap().blocks, 512);
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0, "allocations during a 512-block transfer");
}
