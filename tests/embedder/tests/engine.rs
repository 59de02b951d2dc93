//! The transfer engine as an embedder drives it: on a 2-worker tokio runtime, 64 transfers of
//! mixed sizes to 4 peers over 2 lanes each (where the backend opens lanes), every byte checked
//! where it landed, while a 1 ms ticker on the same runtime must wake at least half as often as
//! the same ticker on a runtime of its own (a transfer that blocked a worker would hold it).

mod common;
use common::{longest_poll, tick, woke_freely};
use rdma_hint::engine::{Engine, EngineConfig, PeerId, TransferRequest};
use rdma_hint::{
    get_low_latency_rdma_size_hint_with, open_lanes, Device, Error, LocalRegion, MemoryKind, OpenOptions,
    PeerEndpoint, RemoteRegion, Transport, TransportId, TransportSelector,
};
use rdma_hint_embedder::{ids, payload};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PEERS: u32 = 4;
const LANES: usize = 2;
const TRANSFERS_PER_PEER: u64 = 16;
/// Each transfer's own range in the regions.
const SLOT: u64 = 2 << 20;
const SIZES: [u64; 4] = [4096, 65_539, 1 << 20, SLOT];

struct Connection {
    senders: Vec<Arc<dyn Transport>>,
    receivers: Vec<Arc<dyn Transport>>,
    source: LocalRegion,
    target: LocalRegion,
    remote: Vec<RemoteRegion>,
    payload: Vec<u8>,
}

/// `LANES` lanes where the backend opens them, else one.
fn lanes(id: &TransportId) -> Vec<Arc<dyn Transport>> {
    // UCX connects only authenticated peers; the staged backend takes the token too.
    let options = OpenOptions::default().token(b"embedder engine test");
    match open_lanes(id, &options, LANES) {
        Ok(lanes) => lanes,
        Err(Error::Lanes { .. }) => open_lanes(id, &options, 1).expect("one lane"),
        Err(other) => panic!("{id}: {other}"),
    }
}

async fn connect(id: &TransportId, peer: u32) -> Connection {
    let len = SLOT * TRANSFERS_PER_PEER;
    let receivers = lanes(id);
    let senders = lanes(id);
    let target = receivers[0].register(MemoryKind::Host, len).expect("register the target");
    let source = senders[0].register(MemoryKind::Host, len).expect("register the source");
    let payload = payload(peer, len);
    senders[0].write_region(source.id, 0, &payload).expect("fill the source");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut remote = Vec::new();
    for (receiver, sender) in receivers.iter().zip(&senders) {
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        let accepting = {
            let receiver = receiver.clone();
            tokio::spawn(async move {
                receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline).await
            })
        };
        remote = sender.connect(PeerEndpoint::Dial(address), &[], deadline).await.expect("dial");
        accepting.await.expect("task").expect("accept");
    }
    Connection { senders, receivers, source, target, remote, payload }
}

#[test]
fn sixty_four_transfers_to_four_peers_over_two_lanes_land_without_stalling_the_runtime() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let baseline_runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    for id in ids() {
        let hint = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone()))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let engine = Arc::new(Engine::new(EngineConfig::default()).expect("engine"));
        engine.set_size_hint(&hint).expect("the hint cuts blocks");
        let (connections, ours, theirs, started, elapsed, longest) = runtime.block_on(async {
            let mut connections = Vec::new();
            for peer in 0..PEERS {
                connections.push(connect(&id, peer).await);
            }
            let peers: Vec<PeerId> = connections
                .iter()
                .map(|c| engine.add_peer(c.senders.clone(), &c.remote).expect("add the peer"))
                .collect();
            let stop = Arc::new(AtomicBool::new(false));
            let ticker = tokio::spawn(tick(stop.clone()));
            let baseline = baseline_runtime.spawn(tick(stop.clone()));
            let started = Instant::now();
            let deadline = started + Duration::from_secs(60);
            // One task per transfer, as an application's request handlers would submit them.
            let mut tasks = Vec::new();
            for (peer, connection) in peers.iter().zip(&connections) {
                for k in 0..TRANSFERS_PER_PEER {
                    let offset = k * SLOT;
                    let len = SIZES[(k % 4) as usize];
                    let request = TransferRequest::single(
                        &connection.source,
                        offset,
                        &connection.remote[0],
                        offset,
                        len,
                    );
                    let (engine, peer) = (engine.clone(), *peer);
                    tasks.push(tokio::spawn(longest_poll(async move {
                        let submitted =
                            engine.submit_when_ready(peer, request.notify(k as u32), deadline).await;
                        let id = submitted.map_err(|e| e.to_string())?;
                        engine.wait(id, deadline).await.map_err(|e| e.to_string())
                    })));
                }
            }
            let mut longest = Duration::ZERO;
            for (index, task) in tasks.into_iter().enumerate() {
                let (result, poll) = task.await.expect("task");
                longest = longest.max(poll);
                let delivered = result.unwrap_or_else(|e| panic!("{id}: transfer {index}: {e}"));
                assert_eq!(delivered.bytes, SIZES[index % 4]);
            }
            let elapsed = started.elapsed();
            stop.store(true, Ordering::Relaxed);
            let machine = baseline.await.expect("baseline ticker");
            (connections, ticker.await.expect("ticker"), machine, started, elapsed, longest)
        });
        for (peer, connection) in connections.iter().enumerate() {
            let mut arrived = vec![0u8; SLOT as usize];
            for k in 0..TRANSFERS_PER_PEER {
                let (offset, len) = (k * SLOT, SIZES[(k % 4) as usize] as usize);
                connection.receivers[0]
                    .read_region(connection.target.id, offset, &mut arrived[..len])
                    .expect("read");
                let expected = &connection.payload[offset as usize..offset as usize + len];
                assert!(arrived[..len] == *expected, "{id}: peer {peer}, transfer {k}: wrong bytes");
            }
        }
        let lanes = connections[0].senders.len();
        println!(
            "{id}: {} transfers to {PEERS} peers over {lanes} lane(s) each verified in {:.2} s; 1 ms ticker woke {} times, late by at most {:.1} ms (on a runtime of its own: {} times, {:.1} ms); longest poll of a transfer's task {:.2} ms",
            PEERS as u64 * TRANSFERS_PER_PEER,
            elapsed.as_secs_f64(),
            ours.since(started),
            ours.worst.as_secs_f64() * 1e3,
            theirs.since(started),
            theirs.worst.as_secs_f64() * 1e3,
            longest.as_secs_f64() * 1e3
        );
        // In the Soft-RoCE VM the CPU is emulated and one `ibv_post_send` does the NIC's work
        // (~14 ms per doorbell), on whichever thread rings it: the bound is reported there, not
        // asserted (as tokio.rs does); the bytes still are.
        if std::env::var_os("RDMA_HINT_EMBEDDER_SOFTWARE_NIC").is_some() {
            println!("{id}: lateness reported, not asserted (software NIC on an emulated CPU)");
            continue;
        }
        assert!(
            woke_freely(&ours, &theirs, started),
            "{id}: the ticker on the engine's runtime woke less than half as often as on its own: a transfer blocked a worker"
        );
    }
}
