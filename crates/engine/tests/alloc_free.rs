//! The posting path allocates nothing: a whole chunked transfer on the loopback transport,
//! counted by a global allocator.

use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_core::SourceId;
use rdma_hint_core::{MemoryKind, PeerEndpoint, Transport};
use rdma_hint_engine::{BlockSpec, Chunker, LoopbackTransport, PostPolicy, TransferRequest};
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

/// The count is process-wide: the tests take turns.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_transfer_allocates_nothing() {
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let transport = LoopbackTransport::new(64);
    let src = transport.register(MemoryKind::Host, 8 << 20).unwrap();
    let dst = transport.register(MemoryKind::Host, 8 << 20).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(transport.connect(listen, &[dst.id], deadline)).unwrap()[0];
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(16 * 1024, 4096).unwrap());
    // Warm up once (first-use initialisation in the runtime, if any).
    block_on(chunker.transfer(&transport, TransferRequest::single(&src, 0, &remote, 0, 1 << 20), deadline))
        .unwrap();

    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let request = TransferRequest::single(&src, 0, &remote, 0, (8 << 20) - 5);
    let delivered = block_on(chunker.transfer(&transport, request, deadline));
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(delivered.unwrap().blocks, 512);
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0, "allocations during a 512-block transfer");
}

/// The engine's submit and wait, once warm, allocate nothing either: a transfer is a slot
/// taken, a doorbell built, rung and recorded, its completion retired and its result handed
/// out, all in place (the scheduler reserves its queues and events when the peer is added).
#[test]
fn an_engine_transfer_allocates_nothing_once_warm() {
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    use rdma_hint_engine::{Engine, EngineConfig};
    use std::future::Future;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    let transport = Arc::new(LoopbackTransport::new(256));
    let src = transport.register(MemoryKind::Host, 1 << 20).unwrap();
    let dst = transport.register(MemoryKind::Host, 1 << 20).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(transport.connect(listen, &[dst.id], deadline)).unwrap()[0];
    let engine = Engine::new(EngineConfig::default()).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(16 * 1024, 4096).unwrap());
    let peer = engine.add_peer(vec![transport.clone() as Arc<dyn Transport>], &[remote]).unwrap();
    // Waited for without a runtime or a thread waker: polled with a no-op waker until ready.
    let transfer = |len: u64| {
        let id = engine.submit(peer, TransferRequest::single(&src, 0, &remote, 0, len), deadline).unwrap();
        let mut wait = std::pin::pin!(engine.wait(id, deadline));
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(result) = wait.as_mut().poll(&mut cx) {
                break result.unwrap();
            }
        }
    };
    // Past the lane's first 256 requests, which the engine leaves to its driver thread.
    for _ in 0..300 {
        transfer(64 * 1024);
    }
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let blocks: u64 = (0..100).map(|_| transfer(64 * 1024).blocks).sum();
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(blocks, 400);
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0, "allocations during 100 engine transfers");
    // A lone small transfer waited for with `wait_blocking`, announced, and its arrival taken
    // through the engine (the loopback's peer is itself): none either.
    let mut arrivals = [rdma_hint_core::Arrival::EMPTY; 4];
    let mut announced = |imm: u32| {
        let request = TransferRequest::single(&src, 0, &remote, 0, 4096).latency_first().notify(imm);
        let id = engine.submit(peer, request, deadline).unwrap();
        let delivered = engine.wait_blocking(id, deadline).unwrap();
        let mut wait = std::pin::pin!(engine.wait_arrivals(peer, &mut arrivals, deadline));
        let mut cx = Context::from_waker(Waker::noop());
        let arrived = loop {
            if let Poll::Ready(result) = wait.as_mut().poll(&mut cx) {
                break result.unwrap();
            }
        };
        (delivered.bytes, arrived)
    };
    announced(0);
    let mut moved = Vec::with_capacity(100);
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for imm in 1..=100 {
        moved.push(announced(imm));
    }
    COUNTING.store(false, Ordering::SeqCst);
    assert!(moved.iter().all(|&(bytes, arrived)| bytes == 4096 && arrived == 1), "{moved:?}");
    assert_eq!(
        ALLOCATIONS.load(Ordering::SeqCst),
        0,
        "allocations during 100 announced transfers and their arrivals"
    );
}
