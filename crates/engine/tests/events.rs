//! The engine's typed events, as a subscriber registered from outside sees them: every block
//! posted and completed, every transfer's end, arrivals and a lost lane, with the bytes they
//! moved checked where they landed.

use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_core::{Arrival, LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, SourceId, Transport};
use rdma_hint_engine::events::{
    ArrivalsTaken, BlocksCompleted, DoorbellRung, LaneLost, Subscriber, TracingSubscriber, TransferEnded,
};
use rdma_hint_engine::{
    BlockSpec, Engine, EngineConfig, LoopbackTransport, PeerId, TransferError, TransferRequest,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[allow(dead_code)] // each test binary uses part of it
mod wrapper;

const BLOCK: u64 = 64 * 1024;

/// Everything a subscriber was told, in order.
#[derive(Default)]
struct Recorder {
    doorbells: Mutex<Vec<DoorbellRung>>,
    completions: Mutex<Vec<BlocksCompleted>>,
    ended: Mutex<Vec<TransferEnded>>,
    lost: Mutex<Vec<LaneLost>>,
    arrivals: Mutex<Vec<ArrivalsTaken>>,
}

impl Subscriber for Recorder {
    fn doorbell_rung(&self, event: &DoorbellRung) {
        self.doorbells.lock().unwrap().push(*event);
    }
    fn blocks_completed(&self, event: &BlocksCompleted) {
        self.completions.lock().unwrap().push(*event);
    }
    fn transfer_ended(&self, event: &TransferEnded) {
        self.ended.lock().unwrap().push(*event);
    }
    fn lane_lost(&self, event: &LaneLost) {
        self.lost.lock().unwrap().push(*event);
    }
    fn arrivals_taken(&self, event: &ArrivalsTaken) {
        self.arrivals.lock().unwrap().push(*event);
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13) ^ (i >> 10) as u8).collect()
}

/// A loopback lane connected to itself, as an engine's one peer: a source of `len` bytes
/// holding `pattern(len)` and a destination as large.
struct Connected {
    src: LocalRegion,
    dst: LocalRegion,
    remote: Vec<RemoteRegion>,
    engine: Engine,
    peer: PeerId,
}

fn connected(lane: &Arc<LoopbackTransport>, len: u64) -> Connected {
    let src = lane.register(MemoryKind::Host, len).unwrap();
    let dst = lane.register(MemoryKind::Host, len).unwrap();
    lane.write_region(src.id, 0, &pattern(len)).unwrap();
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(lane.connect(listen, &[dst.id], soon())).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(BLOCK, 4096).unwrap());
    let peer = engine.add_peer(vec![lane.clone() as Arc<dyn Transport>], &remote).unwrap();
    Connected { src, dst, remote, engine, peer }
}

#[test]
fn a_subscriber_sees_every_block_posted_and_completed_and_each_transfers_end() {
    let lane = Arc::new(LoopbackTransport::new(256));
    let len = 3 * BLOCK + 100;
    let Connected { src, dst, remote, engine, peer } = connected(&lane, len);
    let recorder = Arc::new(Recorder::default());
    engine.subscribe(recorder.clone());
    engine.subscribe(Arc::new(TracingSubscriber));

    let started = Instant::now();
    let bulk = engine.submit(peer, TransferRequest::single(&src, 0, &remote[0], 0, len), soon()).unwrap();
    let small = TransferRequest::single(&src, 0, &remote[0], 0, 4096).latency_first().notify(7);
    let small = engine.submit(peer, small, soon()).unwrap();
    let delivered =
        [engine.wait_blocking(bulk, soon()).unwrap(), engine.wait_blocking(small, soon()).unwrap()];
    let mut arrivals = [Arrival::EMPTY; 4];
    let arrived = block_on(engine.wait_arrivals(peer, &mut arrivals, soon())).unwrap();
    let elapsed = started.elapsed();
    let mut landed = vec![0u8; len as usize];
    lane.read_region(dst.id, 0, &mut landed).unwrap();
    assert!(landed == pattern(len), "the bytes landed as sent");
    assert_eq!((arrived, arrivals[0].imm), (1, 7));

    let blocks: u64 = delivered.iter().map(|d| d.blocks).sum();
    let bytes = len + 4096;
    let doorbells = recorder.doorbells.lock().unwrap();
    assert!(doorbells.iter().all(|d| d.peer == peer && d.lane == 0 && d.refused.is_none()), "{doorbells:?}");
    assert_eq!(doorbells.iter().map(|d| u64::from(d.requests)).sum::<u64>(), blocks, "{doorbells:?}");
    assert_eq!(doorbells.iter().map(|d| d.bytes).sum::<u64>(), bytes);
    let completions = recorder.completions.lock().unwrap();
    assert_eq!(completions.iter().map(|c| u64::from(c.requests)).sum::<u64>(), blocks, "{completions:?}");
    assert_eq!(completions.iter().map(|c| c.bytes).sum::<u64>(), bytes);
    let timings: Vec<_> =
        completions.iter().map(|c| c.timing.expect("subscribed before the first post")).collect();
    assert!(timings.iter().all(|t| t.took <= elapsed), "{completions:?}");
    // The first doorbell went to an idle lane.
    assert_eq!(timings[0].bytes_ahead, 0, "{completions:?}");
    let ended = recorder.ended.lock().unwrap();
    let mut sizes: Vec<(u64, bool)> = ended.iter().map(|e| (e.bytes, e.latency_first)).collect();
    sizes.sort();
    assert_eq!(sizes, [(4096, true), (len, false)]);
    assert!(ended.iter().all(|e| e.failed.is_none() && e.took <= elapsed && e.peer == peer), "{ended:?}");
    assert_eq!(ended.iter().map(|e| e.blocks).sum::<u64>(), blocks);
    let taken: Vec<_> = recorder.arrivals.lock().unwrap().iter().map(|a| (a.peer, a.count)).collect();
    assert_eq!(taken, [(peer, 1)]);
    assert!(recorder.lost.lock().unwrap().is_empty());
}

#[test]
fn a_lane_that_stops_answering_is_an_event_and_so_is_its_failed_transfer() {
    let silent = Arc::new(wrapper::Wrapper {
        inner: LoopbackTransport::new(64),
        silent: true,
        gate: None,
        pollers: None,
    });
    let src = silent.register(MemoryKind::Host, 1 << 20).unwrap();
    let dst = silent.register(MemoryKind::Host, 1 << 20).unwrap();
    let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
    let remote = block_on(silent.connect(listen, &[dst.id], soon())).unwrap();
    let config = EngineConfig { lane_stall: Duration::from_millis(100), ..EngineConfig::default() };
    let engine = Engine::new(config).unwrap();
    engine.set_hint(SourceId::Host(0), BlockSpec::new(BLOCK, 4096).unwrap());
    let peer = engine.add_peer(vec![silent.clone() as Arc<dyn Transport>], &remote).unwrap();
    let recorder = Arc::new(Recorder::default());
    engine.subscribe(recorder.clone());

    let id = engine.submit(peer, TransferRequest::single(&src, 0, &remote[0], 0, 4096), soon()).unwrap();
    let ended = engine.wait_blocking(id, soon());
    assert!(matches!(ended, Err(TransferError::Transport { .. })), "{ended:?}");
    let lost = recorder.lost.lock().unwrap();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!((lost[0].peer, lost[0].lane), (peer, 0));
    let ended = recorder.ended.lock().unwrap();
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!((ended[0].bytes, ended[0].failed.is_some()), (4096, true));
    assert!(recorder.completions.lock().unwrap().is_empty(), "nothing completed");
    assert_eq!(ended[0].failed, Some(lost[0].error), "the lane's failure is the transfer's");
}

/// Panics at its first completion.
struct Faulty;

impl Subscriber for Faulty {
    fn blocks_completed(&self, _: &BlocksCompleted) {
        panic!("a subscriber's bug");
    }
}

#[test]
fn a_subscriber_that_panics_is_dropped_and_the_engine_goes_on() {
    let lane = Arc::new(LoopbackTransport::new(256));
    let len = 16 * BLOCK;
    let Connected { src, dst, remote, engine, peer } = connected(&lane, len);
    engine.subscribe(Arc::new(Faulty));
    let recorder = Arc::new(Recorder::default());
    engine.subscribe(recorder.clone());
    // Past the lane's first requests (the driver thread's): a panic there ended the driver
    // for good, and every later transfer waited out its deadline.
    for round in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(5);
        let id = engine.submit(peer, TransferRequest::single(&src, 0, &remote[0], 0, len), deadline).unwrap();
        let delivered = engine.wait_blocking(id, deadline);
        assert!(matches!(delivered, Ok(d) if d.bytes == len), "round {round}: {delivered:?}");
    }
    let mut landed = vec![0u8; len as usize];
    lane.read_region(dst.id, 0, &mut landed).unwrap();
    assert!(landed == pattern(len));
    assert_eq!(recorder.ended.lock().unwrap().len(), 3, "the other subscriber was told of every transfer");
}
