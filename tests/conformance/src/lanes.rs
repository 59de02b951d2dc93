//! The rules about lanes opened together and the transfer engine over them.

use crate::backend::Backend;
use crate::contract::shared;
use crate::pair::deadline;
use crate::Subject;
use rdma_hint_backend_core::blocking::{block_on, BlockingTransport};
use rdma_hint_core::{
    Arrival, CallerMemory, Completion, LocalRegion, MemoryKind, PeerEndpoint, RegionId, SourceId, Transport,
    TransportError, WriteOp,
};
use rdma_hint_engine::BlockSpec;
use rdma_hint_integration_tests::{first_mismatch, random_bytes};
use std::time::{Duration, Instant};

/// Lanes opened together on both sides: `lanes` transports each (fewer where the backend opens
/// no lanes), the receiver's exposing `len` bytes.
struct Lanes<T> {
    senders: Vec<std::sync::Arc<T>>,
    receivers: Vec<std::sync::Arc<T>>,
    source: LocalRegion,
    target: LocalRegion,
    remote: Vec<rdma_hint_core::RemoteRegion>,
}

fn open_lanes<B: Backend>(backend: &B, lanes: usize, len: u64) -> Lanes<B::Transport> {
    let first_receiver = backend.open(backend.token());
    let target = first_receiver.register(MemoryKind::Host, len).expect("register the target");
    let first_sender = backend.open(backend.token());
    let source = first_sender.register(MemoryKind::Host, len).expect("register the source");
    let mut receivers = vec![first_receiver];
    let mut senders = vec![first_sender];
    while receivers.len() < lanes {
        match (backend.open_lane(&receivers[0]), backend.open_lane(&senders[0])) {
            (Some(receiver), Some(sender)) => {
                receivers.push(receiver);
                senders.push(sender);
            }
            _ => break,
        }
    }
    let mut remote = Vec::new();
    let mut connected_receivers = Vec::new();
    for (receiver, sender) in receivers.into_iter().zip(&senders) {
        let address = receiver.bind(backend.listen_address()).expect("bind");
        let accepting = std::thread::spawn(move || {
            block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline(20)))
                .expect("accept the sender's lane");
            receiver
        });
        remote =
            block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline(20))).expect("dial a lane");
        connected_receivers.push(std::sync::Arc::new(accepting.join().expect("accepting thread")));
    }
    Lanes {
        senders: senders.into_iter().map(std::sync::Arc::new).collect(),
        receivers: connected_receivers,
        source,
        target,
        remote,
    }
}

fn engine_over<T: Transport + 'static>(
    block: u64,
    connections: &[&Lanes<T>],
) -> (rdma_hint_engine::Engine, Vec<rdma_hint_engine::PeerId>) {
    let engine = rdma_hint_engine::Engine::new(rdma_hint_engine::EngineConfig::default()).expect("engine");
    engine.set_hint(SourceId::Host(0), BlockSpec::new(block, 4096.min(block)).expect("block spec"));
    let peers = connections
        .iter()
        .map(|c| {
            let lanes = c.senders.iter().map(|lane| lane.clone() as std::sync::Arc<dyn Transport>).collect();
            engine.add_peer(lanes, &c.remote).expect("add the peer")
        })
        .collect();
    (engine, peers)
}

/// Lanes of one connection share their regions and guard them across lanes (where the backend
/// opens lanes): a region registered on the first lane is written through the second;
/// releasing the source on the first lane while the second lane's writes from it are in
/// flight is refused as busy, or returns once they have landed, never while they still read
/// it; a target a live lane's peer may write cannot be released on any lane; and the regions
/// outlive the lane that registered them.
pub fn lanes_share_their_regions_and_guard_them_across_lanes<B: Backend>(s: &Subject<'_, B>) {
    let _process = shared();
    let len = s.backend.scale().ladder_max_bytes.clamp(1 << 20, 16 << 20);
    let mut c = open_lanes(s.backend, 2, len);
    if c.senders.len() < 2 {
        return; // one lane per connection: nothing is shared
    }
    let data = random_bytes(len as usize, 31);
    c.senders[0].write_region(c.source.id, 0, &data).expect("fill the source on the first lane");
    let (blocks, remote) = (16u64, c.remote[0]);
    let block = len / blocks;
    let ops: Vec<WriteOp> = (0..blocks)
        .map(|i| WriteOp {
            wr_id: i,
            local: c.source.id,
            local_offset: i * block,
            remote: remote.id,
            remote_offset: i * block,
            len: block,
            signalled: i + 1 == blocks,
            imm: None,
        })
        .collect();
    c.senders[1].post_writes(&ops).expect("post on the second lane");
    let mut completions = [Completion::EMPTY; 1];
    match c.senders[0].deregister(c.source.id) {
        Ok(()) => {
            let landed = read_all(&*c.receivers[0], c.target.id, len);
            assert!(
                first_mismatch(&landed, &data).is_none(),
                "the source was released on one lane while another lane's writes still read it"
            );
            block_on(c.senders[1].wait_completions(&mut completions, deadline(60))).expect("completion");
        }
        Err(TransportError::RegionBusy { .. }) => {
            block_on(c.senders[1].wait_completions(&mut completions, deadline(60))).expect("completion");
            c.senders[0].deregister(c.source.id).expect("released once the other lane's writes completed");
        }
        Err(other) => panic!("releasing a source another lane reads: {other}"),
    }
    assert_eq!(completions[0].status, rdma_hint_core::CompletionStatus::Success, "{:?}", completions[0]);
    let landed = read_all(&*c.receivers[1], c.target.id, len);
    assert!(first_mismatch(&landed, &data).is_none(), "the second lane's writes landed");
    for receiver in &c.receivers {
        let refused = receiver.deregister(c.target.id);
        assert!(
            matches!(refused, Err(TransportError::RegionBusy { .. })),
            "exposed to live peers: {refused:?}"
        );
    }
    // The first lanes go; the region they registered stays, guarded by the lane left.
    drop((c.receivers.remove(0), c.senders.remove(0)));
    let mut tail = [0u8; 64];
    c.receivers[0].read_region(c.target.id, len - 64, &mut tail).expect("the region outlives its first lane");
    assert_eq!(&tail[..], &data[data.len() - 64..]);
    let refused = c.receivers[0].deregister(c.target.id);
    assert!(
        matches!(refused, Err(TransportError::RegionBusy { .. })),
        "still exposed to a live peer: {refused:?}"
    );
}

fn read_all<T: Transport + ?Sized>(transport: &T, region: RegionId, len: u64) -> Vec<u8> {
    let mut landed = vec![0u8; len as usize];
    transport.read_region(region, 0, &mut landed).expect("read the target");
    landed
}

/// The engine keeps transfers of mixed sizes to two peers in flight at once, over two lanes
/// each where the backend opens lanes: every transfer ends, every byte lands where its
/// request said, every announced transfer arrives once.
pub fn the_engine_moves_mixed_transfers_to_two_peers_over_their_lanes<B: Backend>(s: &Subject<'_, B>) {
    let _process = shared();
    let max = s.backend.scale().ladder_max_bytes.min(16 << 20);
    let slot = max / 8;
    let connections: Vec<Lanes<B::Transport>> = (0..2).map(|_| open_lanes(s.backend, 2, max)).collect();
    let sources: Vec<Vec<u8>> = (0..2).map(|seed| random_bytes(max as usize, 40 + seed)).collect();
    for (connection, bytes) in connections.iter().zip(&sources) {
        connection.senders[0].write_region(connection.source.id, 0, bytes).expect("fill the source");
    }
    let (engine, peers) = engine_over(64 * 1024.min(max), &connections.iter().collect::<Vec<_>>());
    let sizes = [1, 4097, slot / 3, slot];
    let mut submitted = Vec::new();
    for (index, (peer, connection)) in peers.iter().zip(&connections).enumerate() {
        for k in 0..8u64 {
            let (offset, len) = (k * slot, sizes[k as usize % 4].clamp(1, slot));
            let request = rdma_hint_engine::TransferRequest::single(
                &connection.source,
                offset,
                &connection.remote[0],
                offset,
                len,
            );
            let id = engine.submit(*peer, request.notify(k as u32), deadline(60)).expect("submit");
            submitted.push((index, offset, len, id));
        }
    }
    for (index, offset, len, id) in submitted {
        let delivered = engine.wait_blocking(id, deadline(60)).expect("transfer");
        assert_eq!(delivered.bytes, len);
        let connection = &connections[index];
        let mut arrived = vec![0u8; len as usize];
        connection.receivers[0]
            .read_region(connection.target.id, offset, &mut arrived)
            .expect("read the target");
        let expected = &sources[index][offset as usize..(offset + len) as usize];
        assert_eq!(first_mismatch(&arrived, expected), None, "peer {index}, {len} B at {offset}");
    }
    for connection in &connections {
        let mut imms = Vec::new();
        let until = deadline(20);
        while imms.len() < 8 && Instant::now() < until {
            for lane in &connection.receivers {
                let mut arrivals = [Arrival::EMPTY; 16];
                let count = lane.poll_arrivals(&mut arrivals).expect("arrivals");
                imms.extend(arrivals[..count].iter().map(|arrival| arrival.imm));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        imms.sort_unstable();
        assert_eq!(imms, (0..8).collect::<Vec<u32>>(), "each transfer announced once");
    }
    if connections[0].senders.len() > 1 {
        let stats = engine.lane_stats(peers[0]).expect("lanes");
        assert!(stats.iter().all(|lane| lane.posted_bytes > 0), "every lane carried blocks: {stats:?}");
    }
}

/// A paged transfer (16 KiB pages scattered locally, back to back remotely) is packed into
/// work requests of the hinted block where the transport gathers (`max_sges` > 1), one request
/// per page where it does not; every page lands where its segment said.
pub fn the_engine_packs_scattered_pages_at_the_hint<B: Backend>(s: &Subject<'_, B>) {
    let _process = shared();
    let len = s.backend.scale().ladder_max_bytes.clamp(1 << 20, 8 << 20);
    let (page, block) = (16 * 1024u64, 64 * 1024u64);
    let pages = len / (2 * page);
    let connection = open_lanes(s.backend, 1, len);
    let source = random_bytes(len as usize, 71);
    connection.senders[0].write_region(connection.source.id, 0, &source).expect("fill the source");
    let (engine, peers) = engine_over(block, &[&connection]);
    let segments = scattered_pages(pages, page);
    let request = rdma_hint_engine::TransferRequest::scatter(
        &connection.source,
        &connection.remote[0],
        segments.clone(),
    );
    let id = engine.submit(peers[0], request.notify(5), deadline(60)).expect("submit");
    let delivered = engine.wait_blocking(id, deadline(60)).expect("the paged transfer");
    let max_sges = u64::from(connection.senders[0].capabilities().max_sges.min(64));
    let per_request = if max_sges > 1 { block.min(max_sges * page) } else { page };
    assert_eq!(delivered.bytes, pages * page);
    assert_eq!(delivered.blocks, (pages * page).div_ceil(per_request), "requests of {per_request} B");
    let mut arrivals = [Arrival::EMPTY; 4];
    let got = connection.receivers[0].wait_arrivals_blocking(&mut arrivals, deadline(20)).expect("arrival");
    assert_eq!(arrivals[..got].iter().map(|a| a.imm).collect::<Vec<_>>(), [5]);
    let mut arrived = vec![0u8; (pages * page) as usize];
    connection.receivers[0].read_region(connection.target.id, 0, &mut arrived).expect("read the target");
    for segment in &segments {
        let at = |offset: u64| offset as usize..(offset + page) as usize;
        let (landed, sent) = (&arrived[at(segment.remote_offset)], &source[at(segment.local_offset)]);
        assert_eq!(first_mismatch(landed, sent), None, "the page landing at {}", segment.remote_offset);
    }
}

/// The engine reads as it writes: scattered local pages fetched from memory the peer exposed
/// (its bytes, written there by the peer), each page's bytes where its segment says, in reads
/// of one local range each.
pub fn the_engine_reads_scattered_pages_the_peer_exposed<B: Backend>(s: &Subject<'_, B>) {
    let _process = shared();
    let len = s.backend.scale().ladder_max_bytes.clamp(1 << 20, 8 << 20);
    let page = 16 * 1024u64;
    let pages = len / (2 * page);
    let connection = open_lanes(s.backend, 1, len);
    let exposed = random_bytes(len as usize, 83);
    connection.receivers[0].write_region(connection.target.id, 0, &exposed).expect("fill the exposed region");
    let (engine, peers) = engine_over(64 * 1024, &[&connection]);
    let segments = scattered_pages(pages, page);
    let request = rdma_hint_engine::TransferRequest::scatter(
        &connection.source,
        &connection.remote[0],
        segments.clone(),
    );
    let id = engine.submit(peers[0], request.read(), deadline(60)).expect("submit the read");
    let delivered = engine.wait_blocking(id, deadline(60)).expect("the paged read");
    assert_eq!((delivered.bytes, delivered.blocks), (pages * page, pages), "a read per page");
    let mut fetched = vec![0u8; len as usize];
    connection.senders[0].read_region(connection.source.id, 0, &mut fetched).expect("read the source");
    for segment in &segments {
        let at = |offset: u64| offset as usize..(offset + page) as usize;
        let (landed, sent) = (&fetched[at(segment.local_offset)], &exposed[at(segment.remote_offset)]);
        assert_eq!(first_mismatch(landed, sent), None, "the page read from {}", segment.remote_offset);
    }
}

/// `pages` pages of `page` bytes, every other page of the local region in reverse order,
/// landing back to back remotely.
fn scattered_pages(pages: u64, page: u64) -> Vec<rdma_hint_engine::Segment> {
    (0..pages)
        .map(|k| rdma_hint_engine::Segment {
            local_offset: (pages - 1 - k) * 2 * page,
            remote_offset: k * page,
            len: page,
        })
        .collect()
}

/// Transfers in flight to a peer whose transports close end in a typed error within the
/// backend's report bound, and none of them hangs.
pub fn the_engine_fails_transfers_to_a_peer_that_goes_away_in_time<B: Backend>(s: &Subject<'_, B>) {
    let _process = shared();
    let scale = s.backend.scale();
    let len = scale.long_transfer_bytes;
    let connection = open_lanes(s.backend, 2, len);
    let (engine, peers) = engine_over(64 * 1024.min(len), &[&connection]);
    let ids: Vec<_> = (0..4)
        .map(|_| {
            let request = rdma_hint_engine::TransferRequest::single(
                &connection.source,
                0,
                &connection.remote[0],
                0,
                len,
            );
            engine.submit(peers[0], request, deadline(120)).expect("submit")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    let Lanes { receivers, .. } = connection;
    drop(receivers);
    let gone = Instant::now();
    for id in ids {
        match engine.wait_blocking(id, deadline(120)) {
            Err(rdma_hint_engine::TransferError::Transport { confirmed_bytes, .. }) => {
                assert!(confirmed_bytes < len)
            }
            // The first ones may have finished before the receiver went.
            Ok(delivered) => assert_eq!(delivered.bytes, len),
            other => panic!("expected a typed failure, got {other:?}"),
        }
    }
    let took = gone.elapsed();
    assert!(took < Duration::from_secs(scale.report_within_s), "failures reported after {took:?}");
}

/// A source an engine transfer names stays registered until the transfer is collected:
/// releasing or deregistering it is `RegionBusy`, so memory registered meanwhile never takes
/// its id, and the peer receives the source's bytes, not another buffer's.
pub fn a_source_an_engine_transfer_names_is_held_until_collected<B: Backend>(s: &Subject<'_, B>) {
    let _process = shared();
    let len = s.backend.scale().ladder_max_bytes.clamp(1 << 20, 64 << 20);
    let c = open_lanes(s.backend, 1, len);
    let data = random_bytes(len as usize, 83);
    let source =
        c.senders[0].register_memory(CallerMemory::from(data.clone())).expect("register caller memory");
    let (engine, peers) = engine_over(64 * 1024, &[&c]);
    let request = rdma_hint_engine::TransferRequest::single(&source, 0, &c.remote[0], 0, len);
    let id = engine.submit(peers[0], request, deadline(60)).expect("submit");
    let busy = |what: &str, result: Result<(), TransportError>| {
        assert!(
            matches!(result, Err(TransportError::RegionBusy { .. })),
            "{what} a source a queued transfer names: {result:?}"
        )
    };
    busy("released", c.senders[0].release(source.id).map(drop));
    busy("deregistered", c.senders[0].deregister(source.id));
    let decoy = c.senders[0]
        .register_memory(CallerMemory::from(vec![0xeeu8; len as usize]))
        .expect("register other memory");
    assert_ne!(decoy.id, source.id, "the held id went to other memory");
    let delivered = engine.wait_blocking(id, deadline(60)).expect("transfer");
    assert_eq!(delivered.bytes, len);
    let landed = read_all(&*c.receivers[0], c.target.id, len);
    assert_eq!(first_mismatch(&landed, &data), None, "the peer got other bytes than the source's");
    let back = c.senders[0].release(source.id).expect("released once collected");
    assert_eq!(back.take::<Vec<u8>>().expect("the Vec comes back").len(), len as usize);
    c.senders[0].release(decoy.id).expect("release the other memory");
}

/// Lanes opened together on one side, not yet connected: `lanes` transports (fewer where the
/// backend opens no lanes), as `Arc<dyn Transport>` for an engine.
fn unconnected_lanes<B: Backend>(backend: &B, lanes: usize) -> Vec<std::sync::Arc<dyn Transport>> {
    let first = backend.open(backend.token());
    let mut opened: Vec<std::sync::Arc<dyn Transport>> = Vec::new();
    while opened.len() + 1 < lanes {
        match backend.open_lane(&first) {
            Some(lane) => opened.push(std::sync::Arc::new(lane)),
            None => break,
        }
    }
    opened.insert(0, std::sync::Arc::new(first));
    opened
}

/// One call connects a peer over all its lanes on each side (the listener's lanes accepting on
/// one address at once); writes and reads go over them byte-exact; a region the receiver
/// exposes later through its engine is taken by the sender's engine without being told, and
/// once withdrawn no transfer reaches it.
pub fn the_engine_connects_a_peers_lanes_in_one_call_and_takes_regions_exposed_later<B: Backend>(
    s: &Subject<'_, B>,
) {
    let _process = shared();
    let len = s.backend.scale().ladder_max_bytes.clamp(1 << 20, 4 << 20);
    let (receivers, senders) = (unconnected_lanes(s.backend, 2), unconnected_lanes(s.backend, 2));
    let target = receivers[0].register(MemoryKind::Host, len).expect("register the target");
    let late = receivers[0].register(MemoryKind::Host, len).expect("register the region exposed later");
    let source = senders[0].register(MemoryKind::Host, len).expect("register the source");
    let back = senders[0].register(MemoryKind::Host, len).expect("register where reads land");
    let engine = |block: u64| {
        let engine =
            rdma_hint_engine::Engine::new(rdma_hint_engine::EngineConfig::default()).expect("engine");
        engine.set_hint(SourceId::Host(0), BlockSpec::new(block, 4096).expect("block spec"));
        engine
    };
    let (listening, dialling) = (std::sync::Arc::new(engine(64 * 1024)), engine(64 * 1024));
    let address = receivers[0].bind(s.backend.listen_address()).expect("bind");
    let accepting = std::thread::spawn({
        let (listening, receivers) = (listening.clone(), receivers.clone());
        move || {
            listening.connect_blocking(receivers, PeerEndpoint::Listen(address), &[target.id], deadline(20))
        }
    });
    let (peer, remote) = dialling
        .connect_blocking(senders.clone(), PeerEndpoint::Dial(address), &[], deadline(20))
        .expect("dial");
    let (their_peer, _) = accepting.join().expect("accepting thread").expect("accept every lane");
    assert_eq!(remote, [rdma_hint_core::RemoteRegion { id: target.id, len }]);

    let data = random_bytes(len as usize, 47);
    senders[0].write_region(source.id, 0, &data).expect("fill the source");
    let request = rdma_hint_engine::TransferRequest::single(&source, 0, &remote[0], 0, len);
    let id = dialling.submit(peer, request.clone().notify(0xc0), deadline(60)).expect("submit the write");
    assert_eq!(dialling.wait_blocking(id, deadline(60)).expect("the write").bytes, len);
    let mut arrivals = [Arrival::EMPTY; 1];
    block_on(listening.wait_arrivals(their_peer, &mut arrivals, deadline(60))).expect("the write's arrival");
    assert_eq!(arrivals[0].imm, 0xc0);
    assert_eq!(first_mismatch(&read_all(&*receivers[1], target.id, len), &data), None, "the write landed");
    let request = rdma_hint_engine::TransferRequest::single(&back, 0, &remote[0], 0, len);
    let id = dialling.submit(peer, request.read(), deadline(60)).expect("submit the read");
    assert_eq!(dialling.wait_blocking(id, deadline(60)).expect("the read").bytes, len);
    assert_eq!(first_mismatch(&read_all(&*senders[1], back.id, len), &data), None, "the read fetched");

    block_on(listening.expose(their_peer, late.id, deadline(20))).expect("expose on every lane");
    let later = rdma_hint_core::RemoteRegion { id: late.id, len };
    let request = rdma_hint_engine::TransferRequest::single(&source, 0, &later, 0, len);
    let id = dialling.submit(peer, request.clone(), deadline(60)).expect("a region exposed later is taken");
    assert_eq!(dialling.wait_blocking(id, deadline(60)).expect("the write to it").bytes, len);
    assert_eq!(first_mismatch(&read_all(&*receivers[0], late.id, len), &data), None, "it landed");

    block_on(listening.withdraw(their_peer, late.id, deadline(20))).expect("withdraw on every lane");
    receivers[0].write_region(late.id, 0, &vec![0u8; len as usize]).expect("clear the withdrawn region");
    match dialling.submit(peer, request, deadline(60)) {
        Err(rdma_hint_engine::TransferError::Refused(
            rdma_hint_engine::RequestError::UnknownRemoteRegion { .. },
        )) => {}
        Ok(id) => match dialling.wait_blocking(id, deadline(60)) {
            Err(rdma_hint_engine::TransferError::Transport { source, .. }) => {
                assert!(matches!(source, TransportError::RegionWithdrawn(_)), "{source}")
            }
            other => panic!("a transfer to a withdrawn region: {other:?}"),
        },
        Err(other) => panic!("a transfer to a withdrawn region refused as {other}"),
    }
    assert!(
        read_all(&*receivers[0], late.id, len).iter().all(|b| *b == 0),
        "bytes reached a withdrawn region"
    );
}
