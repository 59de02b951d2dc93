//! Real transfers through the loopback transport: random bytes, verified where they land.

use rdma_hint_core::SourceId;
use rdma_hint_core::{
    Arrival, LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, Transport, TransportError,
};
use rdma_hint_engine::{
    BlockSpec, Chunker, LoopbackTransport, PostPolicy, RequestError, Segment, TransferError, TransferRequest,
};
use rdma_hint_integration_tests::random_bytes;
use std::time::{Duration, Instant};

struct Setup {
    transport: LoopbackTransport,
    src: LocalRegion,
    dst: RemoteRegion,
}

fn setup(region_len: u64) -> Setup {
    let transport = LoopbackTransport::new(64);
    let src = transport.register(MemoryKind::Host, region_len).unwrap();
    let dst_local = transport.register(MemoryKind::Host, region_len).unwrap();
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let dst =
        rdma_hint_backend_core::blocking::block_on(transport.connect(listen, &[dst_local.id], deadline()))
            .unwrap()[0];
    Setup { transport, src, dst }
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

fn chunker(transport: &LoopbackTransport, block: u64, align: u64) -> Chunker {
    let mut chunker = Chunker::new(PostPolicy::default(), transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(block, align).unwrap());
    chunker
}

#[test]
fn random_sizes_arrive_byte_exact() {
    let block = 64 * 1024;
    let align = 4096;
    let sizes = [1, block - 1, block, block + 1, 4095, 1 << 20, 3 * (1 << 20) + 3, 8 << 20];
    // Offsets off the alignment too: the engine cuts from wherever a range starts.
    let offsets = [(0, 0), (4096, 8192), (block, 3 * 4096), (100, 7)];
    let s = setup(16 << 20);
    let mut chunker = chunker(&s.transport, block, align);
    let before = random_bytes(16 << 20, 99);
    for (i, &len) in sizes.iter().enumerate() {
        for (local_offset, remote_offset) in offsets {
            let data = random_bytes(len as usize, i as u64 * 31 + local_offset);
            s.transport.write_region(s.src.id, local_offset, &data).unwrap();
            s.transport.write_region(s.dst.id, 0, &before).unwrap();
            let imm = i as u32 * 100 + local_offset as u32 % 97;
            let request =
                TransferRequest::single(&s.src, local_offset, &s.dst, remote_offset, len).notify(imm);
            let delivered = chunker.transfer_blocking(&s.transport, request, deadline()).unwrap();
            assert_eq!(delivered.bytes, len);
            let mut arrivals = [Arrival::EMPTY; 2];
            assert_eq!(
                rdma_hint_backend_core::blocking::block_on(
                    s.transport.wait_arrivals(&mut arrivals, deadline())
                )
                .unwrap(),
                1
            );
            assert_eq!(
                (arrivals[0].imm, arrivals[0].region),
                (imm, s.dst.id),
                "one arrival, after the last block"
            );
            let mut arrived = vec![0u8; len as usize];
            s.transport.read_region(s.dst.id, remote_offset, &mut arrived).unwrap();
            assert!(arrived == data, "len {len} at {local_offset}->{remote_offset}: bytes differ");
            // Nothing before the destination range was touched.
            let mut head = vec![0u8; remote_offset as usize];
            s.transport.read_region(s.dst.id, 0, &mut head).unwrap();
            assert!(head[..] == before[..remote_offset as usize]);
            // Nor anything after it: the last block is what is left, never padded past it.
            let end = remote_offset + len;
            let mut tail = vec![0u8; (16 << 20) - end as usize];
            s.transport.read_region(s.dst.id, end, &mut tail).unwrap();
            assert!(tail[..] == before[end as usize..], "len {len} at {remote_offset}: bytes past the range");
        }
    }
}

#[test]
fn each_source_gets_its_own_hint() {
    let s = setup(4 << 20);
    let mut chunker = Chunker::new(PostPolicy::default(), s.transport.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(256 * 1024, 4096).unwrap());
    chunker.set_hint(SourceId::Host(1), BlockSpec::new(64 * 1024, 4096).unwrap());
    chunker.set_hint(SourceId::Gpu(3), BlockSpec::new(512 * 1024, 65536).unwrap());
    let data = random_bytes(1 << 20, 5);
    s.transport.write_region(s.src.id, 0, &data).unwrap();
    let whole = || TransferRequest::single(&s.src, 0, &s.dst, 0, 1 << 20);
    let node0 = chunker.transfer_blocking(&s.transport, whole(), deadline()).unwrap();
    chunker.set_host_node(1);
    let node1 = chunker.transfer_blocking(&s.transport, whole(), deadline()).unwrap();
    assert_eq!((node0.blocks, node1.blocks), (4, 16));
    assert_eq!(chunker.source_of(MemoryKind::CudaDevice { ordinal: 3 }), Some(SourceId::Gpu(3)));
    let as_gpu =
        chunker.transfer_blocking(&s.transport, whole().from_source(SourceId::Gpu(3)), deadline()).unwrap();
    assert_eq!(as_gpu.blocks, 2, "the GPU's 512 KiB hint");
    chunker.set_latency_first(Some(0.5));
    let shrunk = chunker.transfer_blocking(&s.transport, whole(), deadline()).unwrap();
    assert_eq!(shrunk.blocks, 32, "latency-first halves the 64 KiB hint of node 1");
    let mut arrived = vec![0u8; 1 << 20];
    s.transport.read_region(s.dst.id, 0, &mut arrived).unwrap();
    assert!(arrived == data);
}

/// The chunker moves what the engine moves: a read fetches the exposed range into the local
/// one, a scatter list lands each segment where it says and is announced once, bytes checked.
#[test]
fn the_chunker_reads_and_scatters() {
    let s = setup(4 << 20);
    let mut chunker = chunker(&s.transport, 64 * 1024, 4096);
    let theirs = random_bytes(1 << 20, 21);
    s.transport.write_region(s.dst.id, 0, &theirs).unwrap();
    let read = TransferRequest::single(&s.src, 8192, &s.dst, 4096, 300_000).read();
    let delivered = chunker.transfer_blocking(&s.transport, read, deadline()).unwrap();
    assert_eq!((delivered.bytes, delivered.blocks), (300_000, 5));
    let mut fetched = vec![0u8; 300_000];
    s.transport.read_region(s.src.id, 8192, &mut fetched).unwrap();
    assert!(fetched[..] == theirs[4096..4096 + 300_000], "the read fetched the exposed bytes");

    let ours = random_bytes(3 << 20, 22);
    s.transport.write_region(s.src.id, 0, &ours).unwrap();
    let segments = vec![
        Segment { local_offset: 0, remote_offset: 1 << 20, len: 5000 },
        Segment { local_offset: 100_000, remote_offset: 7, len: 200_000 },
        Segment { local_offset: 2 << 20, remote_offset: 3 << 20, len: 4096 },
    ];
    let scatter = TransferRequest::scatter(&s.src, &s.dst, segments.clone()).notify(5);
    let delivered = chunker.transfer_blocking(&s.transport, scatter, deadline()).unwrap();
    assert_eq!(delivered.bytes, 5000 + 200_000 + 4096);
    for segment in &segments {
        let mut landed = vec![0u8; segment.len as usize];
        s.transport.read_region(s.dst.id, segment.remote_offset, &mut landed).unwrap();
        let sent = &ours[segment.local_offset as usize..(segment.local_offset + segment.len) as usize];
        assert!(landed[..] == *sent, "{segment:?}");
    }
    let mut arrivals = [Arrival::EMPTY; 4];
    assert_eq!(s.transport.poll_arrivals(&mut arrivals).unwrap(), 1, "one arrival, for the scatter");
    assert_eq!(arrivals[0].imm, 5);
}

#[test]
fn bad_requests_are_typed_and_move_nothing() {
    let s = setup(1 << 20);
    let mut chunker = chunker(&s.transport, 65536, 4096);
    let marker = random_bytes(1 << 20, 7);
    s.transport.write_region(s.dst.id, 0, &marker).unwrap();
    let write = |chunker: &mut Chunker, local_offset, remote_offset, len| {
        let request = TransferRequest::single(&s.src, local_offset, &s.dst, remote_offset, len);
        match chunker.transfer_blocking(&s.transport, request, deadline()) {
            Err(TransferError::Refused(why)) => why,
            other => panic!("{local_offset} {remote_offset} {len}: not refused: {other:?}"),
        }
    };
    assert!(matches!(write(&mut chunker, 0, 0, 0), RequestError::ZeroLength { .. }));
    assert!(matches!(
        write(&mut chunker, 0, 0, (1 << 20) + 1),
        RequestError::OutOfRegion { side: "local", .. }
    ));
    assert!(matches!(write(&mut chunker, u64::MAX, 0, 2), RequestError::OutOfRegion { side: "local", .. }));
    assert!(matches!(
        write(&mut chunker, 0, (1 << 20) - 4096, 8192),
        RequestError::OutOfRegion { side: "remote", .. }
    ));
    let mut unknown = Chunker::new(PostPolicy::default(), s.transport.capabilities()).unwrap();
    assert!(matches!(write(&mut unknown, 0, 0, 10), RequestError::NoHint(_)));
    let mut arrivals = [Arrival::EMPTY; 1];
    assert_eq!(s.transport.poll_arrivals(&mut arrivals).unwrap(), 0, "no arrival for refused transfers");
    let mut after = vec![0u8; 1 << 20];
    s.transport.read_region(s.dst.id, 0, &mut after).unwrap();
    assert!(after == marker, "a refused transfer wrote nothing");
}

#[test]
fn unregistered_or_unexposed_memory_fails_before_posting() {
    let s = setup(1 << 20);
    let mut chunker = chunker(&s.transport, 65536, 4096);
    let private = s.transport.register(MemoryKind::Host, 1 << 20).unwrap();
    let not_exposed = RemoteRegion { id: private.id, len: private.len };
    let request = TransferRequest::single(&s.src, 0, &not_exposed, 0, 4096);
    let result = chunker.transfer_blocking(&s.transport, request, deadline());
    assert!(matches!(
        result,
        Err(TransferError::Transport { source: TransportError::UnregisteredRegion(_), confirmed_bytes: 0 })
    ));
    s.transport.deregister(s.src.id).unwrap();
    let result = chunker.transfer_blocking(
        &s.transport,
        TransferRequest::single(&s.src, 0, &s.dst, 0, 4096),
        deadline(),
    );
    assert!(matches!(
        result,
        Err(TransferError::Transport { source: TransportError::UnregisteredRegion(_), .. })
    ));
    assert!(matches!(s.transport.register(MemoryKind::Host, 0), Err(TransportError::Registration { .. })));
    assert!(matches!(
        s.transport.register(MemoryKind::Host, u64::MAX),
        Err(TransportError::Registration { .. })
    ));
    assert!(matches!(
        s.transport.register(MemoryKind::CudaDevice { ordinal: 0 }, 4096),
        Err(TransportError::UnsupportedMemory { .. })
    ));
}

/// A transfer whose future the caller drops mid-way (a `select!`, a `timeout`) posts nothing
/// more: the next transfer moves its own bytes only, and dropping more calls than the chunker
/// has slots never leaves it full.
#[test]
fn a_dropped_transfer_posts_nothing_more_and_gives_its_slot_back() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let s = setup(64 << 20);
    let mut chunker = chunker(&s.transport, 4096, 4096);
    s.transport.write_region(s.src.id, 0, &vec![0xaa; 60 << 20]).unwrap();
    s.transport.write_region(s.src.id, 60 << 20, &[0xbb; 4096]).unwrap();
    let whole = || TransferRequest::single(&s.src, 0, &s.dst, 0, 60 << 20);
    for call in 0..70 {
        let mut transfer = std::pin::pin!(chunker.transfer(&s.transport, whole(), deadline()));
        let polled = transfer.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending(), "call {call}: 60 MiB in 4 KiB blocks outlasts a time slice: {polled:?}");
    }
    let mut before = vec![0u8; 64 << 20];
    s.transport.read_region(s.dst.id, 0, &mut before).unwrap();
    let elsewhere = TransferRequest::single(&s.src, 60 << 20, &s.dst, 0, 4096);
    assert_eq!(chunker.transfer_blocking(&s.transport, elsewhere, deadline()).unwrap().bytes, 4096);
    let mut after = vec![0u8; 64 << 20];
    s.transport.read_region(s.dst.id, 0, &mut after).unwrap();
    assert!(after[..4096].iter().all(|b| *b == 0xbb));
    assert!(after[4096..] == before[4096..], "a dropped transfer's blocks were posted after it was dropped");
}

/// The loopback transport completes every write at once, so the chunker never waits; the
/// deadline must still end a transfer that outlives it.
#[test]
fn a_deadline_passes_even_when_completions_are_always_ready() {
    let s = setup(64 << 20);
    let mut chunker = chunker(&s.transport, 4096, 4096);
    let request = TransferRequest::single(&s.src, 0, &s.dst, 0, 64 << 20);
    let result = chunker.transfer_blocking(&s.transport, request, Instant::now());
    match result {
        Err(TransferError::DeadlineExceeded { confirmed_bytes, len }) => assert!(confirmed_bytes < len),
        other => panic!("expected the deadline, got {other:?}"),
    }
}

/// A read copies the exposed region's bytes into the local one and completes when asked; a
/// read from a region that was not exposed is refused and moves nothing.
#[test]
fn reads_copy_the_exposed_region_back_and_refuse_the_rest() {
    use rdma_hint_core::{Completion, CompletionStatus, ReadOp};
    let s = setup(1 << 20);
    let expected = random_bytes(1 << 20, 11);
    s.transport.write_region(s.dst.id, 0, &expected).unwrap();
    let read = ReadOp {
        wr_id: 3,
        local: s.src.id,
        local_offset: 4096,
        remote: s.dst.id,
        remote_offset: 100,
        len: 8192,
        signalled: true,
    };
    s.transport.post_reads(&[read]).unwrap();
    let mut completions = [Completion::EMPTY; 1];
    assert_eq!(s.transport.poll_completions(&mut completions).unwrap(), 1);
    assert_eq!((completions[0].wr_id, completions[0].status), (3, CompletionStatus::Success));
    let mut got = vec![0u8; 8192];
    s.transport.read_region(s.src.id, 4096, &mut got).unwrap();
    assert_eq!(got, expected[100..100 + 8192]);
    let refused = s.transport.post_reads(&[ReadOp { remote: s.src.id, local: s.dst.id, ..read }]);
    assert!(matches!(refused, Err(TransportError::UnregisteredRegion(_))), "{refused:?}");
}
