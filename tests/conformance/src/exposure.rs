//! The rules about regions exposed and withdrawn after connect: a region registered once the
//! connection is up is exposed, written and read by the peer (bytes checked) and listed by it;
//! withdrawn, the peer's posts to it are typed errors and the owner may let it go; a withdrawal
//! waits for what the peer had posted to it; and a misuse of either is a typed error.

use crate::backend::Backend;
use crate::contract::shared;
use crate::pair::{chunker, deadline, pair, round_trip};
use crate::reads::read_between;
use crate::Subject;
use rdma_hint_backend_core::blocking::{block_on, BlockingTransport};
use rdma_hint_core::{
    Arrival, CallerMemory, Completion, CompletionStatus, MemoryKind, ReadOp, RegionId, RemoteRegion,
    Transport, TransportError, WriteOp,
};
use rdma_hint_engine::TransferRequest;
use rdma_hint_integration_tests::{first_mismatch, random_bytes};
use std::sync::mpsc;

/// The peer's region `id` as `transport` lists it now.
fn listed<T: Transport>(transport: &T, id: RegionId) -> Option<RemoteRegion> {
    transport.peer_regions().into_iter().find(|region| region.id == id)
}

/// A region the receiver registers after connect and exposes then is listed by the sender,
/// written by it (with an arrival) and read back, byte for byte; withdrawn, the sender's next
/// write and read to it are [`TransportError::RegionWithdrawn`] and it is listed no more, while
/// the owner may deregister it (before the withdrawal it is busy); the connection's first
/// region still moves bytes, and a region exposed after that is written again.
pub fn regions_exposed_after_connect_are_written_read_and_withdrawn<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let len = 1 << 20;
    let p = pair(s.backend, 64 * 1024, s.backend.listen_address());
    let late = p.receiver.register(MemoryKind::Host, len).expect("register after connect");
    let from = p.sender.register(MemoryKind::Host, len).expect("the sender's source");
    let back = p.sender.register(MemoryKind::Host, len).expect("where the sender reads to");
    assert_eq!(listed(&p.sender, late.id), None, "listed before it is exposed");

    p.receiver.expose_blocking(late.id, deadline(20)).expect("expose after connect");
    let remote = listed(&p.sender, late.id).expect("the sender lists what was exposed");
    assert_eq!(remote.len, len);
    let expected = random_bytes(len as usize, 0xe1);
    p.sender.write_region(from.id, 0, &expected).expect("fill the source");
    let mut chunks = chunker(&p.sender, 64 * 1024);
    block_on(chunks.transfer(
        &p.sender,
        TransferRequest::single(&from, 0, &remote, 0, len).notify(0x1a7e),
        deadline(60),
    ))
    .expect("write the late region");
    let mut arrivals = [Arrival::EMPTY; 1];
    block_on(p.receiver.wait_arrivals(&mut arrivals, deadline(60))).expect("the write's arrival");
    assert_eq!(arrivals[0].imm, 0x1a7e);
    let mut landed = vec![0u8; len as usize];
    p.receiver.read_region(late.id, 0, &mut landed).expect("read the late region");
    assert_eq!(first_mismatch(&landed, &expected), None, "written after connect: first wrong byte");
    read_between(&p.sender, (back.id, late.id), (0, 0), len, 256 * 1024);
    let mut read = vec![0u8; len as usize];
    p.sender.read_region(back.id, 0, &mut read).expect("read back");
    assert_eq!(first_mismatch(&read, &expected), None, "read after connect: first wrong byte");

    let busy = p.receiver.deregister(late.id);
    assert!(matches!(busy, Err(TransportError::RegionBusy { .. })), "an exposed region let go: {busy:?}");
    p.receiver.withdraw_blocking(late.id, deadline(20)).expect("withdraw");
    let write = WriteOp {
        wr_id: 1,
        local: from.id,
        local_offset: 0,
        remote: late.id,
        remote_offset: 0,
        len: 64,
        signalled: true,
        imm: None,
    };
    let refused = p.sender.post_writes(&[write]);
    assert!(matches!(refused, Err(TransportError::RegionWithdrawn(id)) if id == late.id), "{refused:?}");
    let read = ReadOp {
        wr_id: 2,
        local: back.id,
        local_offset: 0,
        remote: late.id,
        remote_offset: 0,
        len: 64,
        signalled: true,
    };
    let refused = p.sender.post_reads(&[read]);
    assert!(matches!(refused, Err(TransportError::RegionWithdrawn(id)) if id == late.id), "{refused:?}");
    assert_eq!(listed(&p.sender, late.id), None, "listed after its withdrawal");
    p.receiver.deregister(late.id).expect("a withdrawn region is let go");

    round_trip(&p, &mut chunker(&p.sender, 16 * 1024), 64 * 1024, 0xe2, 7);
    // The application's own memory this time (which a peer that writes this side's memory
    // directly may not be able to map: its writes then go through the backend's library).
    let again = p
        .receiver
        .register_memory(CallerMemory::from(vec![0u8; len as usize / 2]))
        .expect("register once more");
    p.receiver.expose_blocking(again.id, deadline(20)).expect("expose once more");
    let remote = listed(&p.sender, again.id).expect("listed once more");
    assert_eq!(remote.len, len / 2, "the id's new region, not its old one");
    block_on(chunks.transfer(
        &p.sender,
        TransferRequest::single(&from, 0, &remote, 0, len / 2).notify(0x1a7f),
        deadline(60),
    ))
    .expect("write the region exposed once more");
    block_on(p.receiver.wait_arrivals(&mut arrivals, deadline(60))).expect("its arrival");
    let mut landed = vec![0u8; len as usize / 2];
    p.receiver.read_region(again.id, 0, &mut landed).expect("read it");
    assert_eq!(
        first_mismatch(&landed, &expected[..len as usize / 2]),
        None,
        "exposed once more: first wrong byte"
    );
    // Withdrawn, the application's memory comes back as it is; the first region (then the one
    // exposed: verbs' arrivals name it) still moves bytes.
    p.receiver.withdraw_blocking(again.id, deadline(20)).expect("withdraw once more");
    let back: Vec<u8> = p.receiver.release(again.id).expect("release").take().expect("the Vec comes back");
    assert_eq!(first_mismatch(&back, &expected[..len as usize / 2]), None, "released: first wrong byte");
    round_trip(&p, &mut chunker(&p.sender, 16 * 1024), 64 * 1024, 0xe4, 8);
}

/// A withdrawal answers only once what the peer had posted to the region has finished: a write
/// the peer posted before the withdrawal came is in the region, whole, when it returns (the
/// region is the application's own memory, so no backend's post copies it in place).
pub fn a_withdrawal_waits_for_what_the_peer_posted<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let p = pair(s.backend, 4096, s.backend.listen_address());
    let max_msg = p.sender.capabilities().facts.max_msg_bytes;
    let per_post = u64::from(p.sender.capabilities().max_wrs_per_post.clamp(1, 16));
    // One doorbell's worth, so that it is all posted before the withdrawal is asked for.
    let len = s.backend.scale().long_transfer_bytes.min(64 << 20).min(per_post * max_msg);
    // The application's own memory: a backend that writes the peer's memory directly maps
    // only its own, so the writes here go through its library and land later than the post.
    let late = p
        .receiver
        .register_memory(CallerMemory::from(vec![0u8; len as usize]))
        .expect("register after connect");
    let from = p.sender.register(MemoryKind::Host, len).expect("the sender's source");
    p.receiver.expose_blocking(late.id, deadline(20)).expect("expose");
    let expected = random_bytes(len as usize, 0xf3);
    p.sender.write_region(from.id, 0, &expected).expect("fill the source");
    let block = len.div_ceil(per_post).min(max_msg);
    let (posted_tx, posted) = mpsc::channel();
    std::thread::scope(|scope| {
        let sender = &p.sender;
        let writing = scope.spawn(move || {
            let mut writes = Vec::new();
            let mut at = 0;
            while at < len {
                let this = block.min(len - at);
                writes.push(WriteOp {
                    wr_id: at,
                    local: from.id,
                    local_offset: at,
                    remote: late.id,
                    remote_offset: at,
                    len: this,
                    signalled: false,
                    imm: None,
                });
                at += this;
            }
            if let Some(last) = writes.last_mut() {
                last.signalled = true;
            }
            sender.post_writes(&writes).expect("post the write before the withdrawal");
            posted_tx.send(()).expect("tell the owner");
            let mut completions = [Completion::EMPTY; 1];
            let done = block_on(sender.wait_completions(&mut completions, deadline(60)))
                .expect("the write completes");
            assert_eq!((done, completions[0].status), (1, CompletionStatus::Success));
        });
        posted.recv().expect("the write was posted");
        p.receiver.withdraw_blocking(late.id, deadline(60)).expect("withdraw");
        let mut landed = vec![0u8; len as usize];
        p.receiver.read_region(late.id, 0, &mut landed).expect("read the region");
        assert_eq!(
            first_mismatch(&landed, &expected),
            None,
            "withdrawn before the write had landed: first wrong byte"
        );
        writing.join().expect("the writer");
    });
}

/// Exposing what is exposed, an unregistered region or before connect, and withdrawing what is
/// not exposed, are typed errors that change nothing.
pub fn exposing_and_withdrawing_wrongly_are_typed_errors<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let alone = s.backend.open(s.backend.token());
    let region = alone.register(MemoryKind::Host, 4096).expect("register");
    let early = alone.expose_blocking(region.id, deadline(5));
    assert!(matches!(early, Err(TransportError::NotConnected)), "expose before connect: {early:?}");
    let early = alone.withdraw_blocking(region.id, deadline(5));
    assert!(matches!(early, Err(TransportError::NotConnected)), "withdraw before connect: {early:?}");
    assert!(alone.peer_regions().is_empty(), "peer regions before connect");

    let p = pair(s.backend, 4096, s.backend.listen_address());
    let twice = p.receiver.expose_blocking(p.target.id, deadline(5));
    assert!(matches!(twice, Err(TransportError::InvalidArgument { .. })), "exposed twice: {twice:?}");
    let unregistered = p.receiver.expose_blocking(RegionId(999), deadline(5));
    assert!(matches!(unregistered, Err(TransportError::UnregisteredRegion(_))), "{unregistered:?}");
    let never = p.sender.withdraw_blocking(p.source.id, deadline(5));
    assert!(
        matches!(never, Err(TransportError::InvalidArgument { .. })),
        "withdrew what was never exposed: {never:?}"
    );
    assert_eq!(p.sender.peer_regions(), vec![p.remote], "what the peer's connect exposed");
    round_trip(&p, &mut chunker(&p.sender, 4096), 4096, 0xe3, 9);
}
