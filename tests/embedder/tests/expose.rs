//! A cache that grows after start-up, as an embedder's would: the receiver registers its own
//! `Vec<u8>` once the connection is up, exposes it, the sender finds it among the peer's
//! regions and writes it in the hint's blocks with a notification; the receiver withdraws it,
//! after which the sender's posts to it are typed errors, and takes its `Vec` back intact.

use rdma_hint::engine::{Chunker, PostPolicy, TransferRequest};
use rdma_hint::{
    block_on, get_low_latency_rdma_size_hint_with, open, Arrival, CallerMemory, Device, MemoryKind,
    OpenOptions, PeerEndpoint, TransportError, TransportSelector, WriteOp,
};
use rdma_hint_embedder::{ids, payload};
use std::time::{Duration, Instant};

#[test]
fn memory_registered_after_connect_is_exposed_written_and_withdrawn() {
    let len: u64 = 1 << 20;
    for id in ids() {
        let hint = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone()))
            .unwrap_or_else(|e| panic!("{id}: hint: {e}"));
        let options = OpenOptions::default().token(b"embedder");
        let sender = open(&id, &options).unwrap_or_else(|e| panic!("{id}: open: {e}"));
        let receiver = open(&id, &options).unwrap_or_else(|e| panic!("{id}: open: {e}"));
        let first = receiver.register(MemoryKind::Host, 4096).expect("the region connect exposes");
        let source = sender.register(MemoryKind::Host, len).expect("the sender's region");
        let deadline = Instant::now() + Duration::from_secs(60);
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        std::thread::scope(|scope| {
            let accepting = scope
                .spawn(|| block_on(receiver.connect(PeerEndpoint::Listen(address), &[first.id], deadline)));
            block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline))
                .unwrap_or_else(|e| panic!("{id}: dial: {e}"));
            accepting.join().expect("receiver thread").unwrap_or_else(|e| panic!("{id}: accept: {e}"));
        });

        // The cache grows: the application's own buffer, registered in place after connect.
        let late = receiver
            .register_memory(CallerMemory::from(vec![0u8; len as usize]))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        block_on(receiver.expose(late.id, deadline)).unwrap_or_else(|e| panic!("{id}: expose: {e}"));
        let remote = (sender.peer_regions().into_iter().find(|region| region.id == late.id))
            .unwrap_or_else(|| panic!("{id}: the sender does not list the exposed region"));

        let expected = payload(3, len);
        sender.write_region(source.id, 0, &expected).expect("fill");
        let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).expect("chunker");
        chunker.set_size_hint(&hint).expect("hint");
        block_on(chunker.transfer(
            &*sender,
            TransferRequest::single(&source, 0, &remote, 0, len).notify(5),
            deadline,
        ))
        .unwrap_or_else(|e| panic!("{id}: write: {e}"));
        let mut arrivals = [Arrival::EMPTY; 1];
        block_on(receiver.wait_arrivals(&mut arrivals, deadline))
            .unwrap_or_else(|e| panic!("{id}: arrival: {e}"));
        assert_eq!(arrivals[0].imm, 5, "{id}");

        block_on(receiver.withdraw(late.id, deadline)).unwrap_or_else(|e| panic!("{id}: withdraw: {e}"));
        let write = WriteOp {
            wr_id: 9,
            local: source.id,
            local_offset: 0,
            remote: late.id,
            remote_offset: 0,
            len: 64,
            signalled: true,
            imm: None,
        };
        let refused = sender.post_writes(&[write]);
        assert!(matches!(refused, Err(TransportError::RegionWithdrawn(_))), "{id}: {refused:?}");
        let back: Vec<u8> =
            receiver.release(late.id).expect("release after the withdrawal").take().expect("a Vec");
        assert!(back == expected, "{id}: the bytes in the application's buffer differ from what was sent");
        println!("{id}: {len} B into memory registered after connect, then withdrawn");
    }
}
