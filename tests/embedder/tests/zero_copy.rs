//! The embedder's own memory, moved in place: a `Vec<u8>` this application allocated and
//! filled is registered as it is, written in the hint's blocks into a `Vec<u8>` the receiving
//! side allocated, read there in place after the arrival (`access_region_unchecked`: the
//! sender writes nothing more), and handed back intact. No `write_region` or
//! `read_region` anywhere, and the transports' own counters agree.

use rdma_hint::engine::{Chunker, PostPolicy, TransferRequest};
use rdma_hint::{
    block_on, get_low_latency_rdma_size_hint_with, open, Arrival, CallerMemory, Device, OpenOptions,
    PeerEndpoint, TransportError, TransportSelector,
};
use rdma_hint_embedder::{ids, payload};
use std::time::{Duration, Instant};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn an_application_s_own_vec_moves_into_its_own_vec_without_copies_in_or_out() {
    let len = env_or("RDMA_HINT_EMBEDDER_BYTES", 32 << 20);
    for id in ids() {
        let hint = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone()))
            .unwrap_or_else(|e| panic!("{id}: hint: {e}"));
        let options = OpenOptions::default().token(b"embedder");
        let sender = open(&id, &options).unwrap_or_else(|e| panic!("{id}: open: {e}"));
        let receiver = open(&id, &options).unwrap_or_else(|e| panic!("{id}: open: {e}"));
        let path = sender.capabilities().caller_memory_path(rdma_hint::MemoryKind::Host).copied();
        let path = path.unwrap_or_else(|| panic!("{id}: no caller-memory path for host memory"));

        // The tail block is padded to the alignment: the buffers have room for it.
        let region_len = len.next_multiple_of(hint.align_bytes) as usize;
        let mut mine = payload(7, len);
        mine.resize(region_len, 0);
        let expected = mine.clone();
        let source = sender.register_memory(CallerMemory::from(mine)).unwrap_or_else(|e| panic!("{id}: {e}"));
        let theirs = vec![0u8; region_len];
        let target =
            receiver.register_memory(CallerMemory::from(theirs)).unwrap_or_else(|e| panic!("{id}: {e}"));

        let deadline = Instant::now() + Duration::from_secs(60);
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        let (received, remote) = std::thread::scope(|scope| {
            let accepting = scope.spawn(|| {
                block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline))?;
                let mut arrivals = [Arrival::EMPTY; 1];
                block_on(receiver.wait_arrivals(&mut arrivals, deadline))?;
                Ok::<_, TransportError>(arrivals[0])
            });
            let remote = block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline))
                .unwrap_or_else(|e| panic!("{id}: dial: {e}"))[0];
            let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).expect("chunker");
            chunker.set_size_hint(&hint).expect("hint");
            block_on(chunker.transfer(
                &*sender,
                TransferRequest::single(&source, 0, &remote, 0, len).notify(77),
                deadline,
            ))
            .unwrap_or_else(|e| panic!("{id}: write: {e}"));
            (accepting.join().expect("receiver thread"), remote)
        });
        let arrival = received.unwrap_or_else(|e| panic!("{id}: receive: {e}"));
        assert_eq!((arrival.imm, arrival.region, remote.len), (77, target.id, region_len as u64));

        let busy = receiver.access_region(target.id, &mut |_| ());
        assert!(
            matches!(busy, Err(TransportError::RegionBusy { .. })),
            "{id}: lent while the peer may write"
        );
        let mut landed_right = false;
        let mut compare = |bytes: &mut [u8]| landed_right = bytes[..len as usize] == expected[..len as usize];
        // SAFETY: the sender writes nothing more after the arrival read here (this test is both
        // sides' protocol), as a receiver of RDMA writes orders its reads.
        unsafe { receiver.domain().access_region_unchecked(target.id, &mut compare) }
            .unwrap_or_else(|e| panic!("{id}: access: {e}"));
        assert!(landed_right, "{id}: the bytes in the receiver's own buffer differ from what was sent");
        let back: Vec<u8> = sender.release(source.id).expect("release").take().expect("the Vec comes back");
        assert!(back == expected, "{id}: the sender's buffer changed");
        for (side, transport) in [("sender", &sender), ("receiver", &receiver)] {
            let copied = transport.copied_bytes();
            assert_eq!((copied.write_region, copied.read_region), (0, 0), "{id} {side}");
            // The staged shm channel copies once per side; everything else copies nothing.
            let allowed = match side {
                "sender" => u64::from(path.send_copies) * len,
                _ => u64::from(path.receive_copies.unwrap_or(0)) * len,
            };
            assert!(
                copied.in_transit <= allowed,
                "{id} {side}: copied {} B in transit for {len} B",
                copied.in_transit
            );
        }
        println!("{id}: {len} B from the application's Vec into the application's Vec; copies {path:?}");
    }
}

/// A registration the transport refuses is a `TransportError` like any other (the one error of
/// links and memory), of its reason's kind, with the application's buffer handed back in it.
#[test]
fn refused_memory_comes_back_inside_the_transport_error() {
    for id in ids() {
        let transport =
            open(&id, &OpenOptions::default().token(b"embedder")).unwrap_or_else(|e| panic!("{id}: {e}"));
        let err = transport.register_memory(CallerMemory::from(Vec::<u8>::new())).expect_err("zero bytes");
        let kind = err.kind();
        let TransportError::MemoryRefused { error, memory } = err else { panic!("{id}: {err:?}") };
        assert_eq!(kind, error.kind(), "{id}: the refusal is of its reason's kind");
        assert!(matches!(*error, TransportError::Registration { len: 0, .. }), "{id}: {error}");
        assert_eq!(memory.take::<Vec<u8>>().expect("the buffer comes back"), Vec::<u8>::new());
    }
}
