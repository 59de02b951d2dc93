//! Lanes across their edges, where only a stalled peer shows the hole: these tests hold a
//! peer lane's engine lock (its worker makes no progress, and it cannot notice a goodbye),
//! which no test from outside the crate can do. Real UCX on loopback throughout.

use super::UcxTransport;
use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_core::{CallerMemory, ForeignMemory, Transport, TransportError, WriteOp};
use rdma_hint_core::{Completion, CompletionStatus, MemoryKind, PeerEndpoint, RegionId, RemoteRegion};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &[u8] = b"rdma-hint ucx lane tests";

fn open(tls: &str) -> UcxTransport {
    assert!(std::env::var_os("UCX_NET_DEVICES").is_some(), "run the UCX tests with UCX_NET_DEVICES=lo");
    UcxTransport::open(Some(tls)).expect("UCX").with_token(TOKEN).expect("token")
}

fn deadline(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

/// Connects `dialer` to `listener`, which exposes `expose`; the dialer's view of them.
fn connect(listener: &UcxTransport, dialer: &UcxTransport, expose: &[RegionId]) -> Vec<RemoteRegion> {
    let address = listener.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    std::thread::scope(|scope| {
        let accepting = scope.spawn(|| {
            block_on(listener.connect(PeerEndpoint::Listen(address), expose, deadline(20))).expect("accept")
        });
        let remote = block_on(dialer.connect(PeerEndpoint::Dial(address), &[], deadline(20))).expect("dial");
        accepting.join().expect("accepting thread");
        remote
    })
}

/// Retries `attempt` until it is `Ok` or 20 s have passed.
fn eventually<T>(mut attempt: impl FnMut() -> Result<T, TransportError>) -> T {
    let until = deadline(20);
    loop {
        match attempt() {
            Ok(value) => return value,
            Err(e) if Instant::now() > until => panic!("still refused after 20 s: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Two lanes a side over shared memory; the first receiver's exposes `target` to the first
/// sender.
struct TwoLanes {
    first_receiver: UcxTransport,
    second_receiver: UcxTransport,
    first_sender: UcxTransport,
    second_sender: UcxTransport,
}

fn two_shm_lanes(first_receiver: UcxTransport, target: RegionId) -> TwoLanes {
    let second_receiver = first_receiver.open_lane().expect("lane");
    let first_sender = open("shm,self");
    let second_sender = first_sender.open_lane().expect("lane");
    connect(&first_receiver, &first_sender, &[target]);
    connect(&second_receiver, &second_sender, &[]);
    TwoLanes { first_receiver, second_receiver, first_sender, second_sender }
}

/// Caller memory that records when it is freed.
struct Watched {
    _buffer: Vec<u8>,
    freed: Arc<AtomicBool>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.freed.store(true, Ordering::SeqCst);
    }
}

fn watched_memory(len: usize) -> (CallerMemory, Arc<AtomicBool>) {
    let freed = Arc::new(AtomicBool::new(false));
    let mut buffer = vec![0u8; len];
    let memory = ForeignMemory::Host { address: buffer.as_mut_ptr() as usize, len: len as u64 };
    // SAFETY: the Vec's heap bytes stay put while the box owns it; nothing else touches them.
    let memory =
        unsafe { CallerMemory::owned(memory, Box::new(Watched { _buffer: buffer, freed: freed.clone() })) };
    (memory, freed)
}

/// A receiver of two lanes, the first exposing caller memory to a sender whose first lane
/// stalls (it cannot see a goodbye, and over shm could still write); the receiver's lanes are
/// then all dropped, the last on a thread of its own. Whether the memory was freed, `look`
/// after that drop began, and after the stall ended and the drop returned; whether the drop
/// had returned at the look.
fn last_lane_dropped_under_a_stalled_peer(look: Duration) -> Dropped {
    let first_receiver = open("shm,self");
    let (memory, freed) = watched_memory(64 << 10);
    let target = first_receiver.register_memory(memory).expect("caller memory");
    let TwoLanes { first_receiver, second_receiver, first_sender, second_sender: _second_sender } =
        two_shm_lanes(first_receiver, target.id);

    let stalled = first_sender.shared.engine();
    drop(first_receiver);
    let dropping = std::thread::spawn(move || drop(second_receiver));
    std::thread::sleep(look);
    let freed_while_stalled = freed.load(Ordering::SeqCst);
    let returned_while_stalled = dropping.is_finished();
    drop(stalled);
    dropping.join().expect("dropping thread");
    Dropped { freed_while_stalled, returned_while_stalled, freed_at_the_end: freed.load(Ordering::SeqCst) }
}

struct Dropped {
    freed_while_stalled: bool,
    returned_while_stalled: bool,
    freed_at_the_end: bool,
}

/// The last lane going must not free what the peer of a closed lane may still write: the
/// drop waits until that peer is seen to stop, and frees the memory then.
#[test]
fn the_last_lane_frees_what_a_peer_may_write_only_once_it_stopped() {
    let dropped = last_lane_dropped_under_a_stalled_peer(Duration::from_millis(300));
    assert!(!dropped.freed_while_stalled, "caller memory freed while a peer over shm may still write it");
    assert!(!dropped.returned_while_stalled, "the last lane's drop returned while its peer was stalled");
    assert!(dropped.freed_at_the_end, "the memory was not freed once the peer had stopped");
}

/// A peer that never says it stopped within the drop's bound leaves the memory leaked, not
/// freed under it, and the drop returns at its bound.
#[test]
fn the_last_lane_leaks_what_a_peer_that_never_stops_may_write() {
    let dropped = last_lane_dropped_under_a_stalled_peer(Duration::from_secs(4));
    assert!(dropped.returned_while_stalled, "the last lane's drop outwaited its bound");
    assert!(
        !dropped.freed_while_stalled && !dropped.freed_at_the_end,
        "caller memory freed while a peer may still write it"
    );
}

/// A lane that closes with a put its flush cannot finish must not say goodbye (which promises
/// the peer nothing of this side lands any more): its endpoint closes by force and the peer
/// reads a failure.
#[test]
fn an_unfinished_final_flush_is_not_a_goodbye() {
    const LEN: u64 = 32 << 20; // more than loopback's socket buffers hold
    let sender = open("tcp,self");
    let source = sender.register(MemoryKind::Host, LEN).expect("source");
    let receiver = open("tcp,self");
    let target = receiver.register(MemoryKind::Host, LEN).expect("target");
    let remote = connect(&receiver, &sender, &[target.id]);
    let mut stalled = receiver.shared.engine();
    let put = WriteOp {
        wr_id: 1,
        local: source.id,
        local_offset: 0,
        remote: remote[0].id,
        remote_offset: 0,
        len: LEN,
        signalled: false,
        imm: None,
    };
    sender.post_writes(&[put]).expect("post");
    drop(sender);
    let until = deadline(20);
    let loss = loop {
        if let Some(loss) = receiver.shared.control.get().expect("socket").peer_left() {
            break loss;
        }
        assert!(Instant::now() < until, "the sender's end never showed");
        std::thread::sleep(Duration::from_millis(2));
    };
    // The rest of the put must not be taken in: Debian's UCX (1.13) aborts the process when a
    // software put arrives whose acknowledgement can no longer be sent (`ucp_request_try_send`
    // treats the failed endpoint's error as fatal).
    stalled.fail("the test closes the receiver".into());
    drop(stalled);
    assert!(!loss.clean, "a goodbye although the put was still in flight: {loss:?}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A lane closes while its peer, over shared memory, can still write the region that lane
/// exposed (the peer has not seen the goodbye yet). Another lane of the same connection must
/// not hand the region back until the peer is seen to stop.
#[test]
fn a_closed_lane_keeps_guarding_what_its_peer_may_still_write() {
    let first_receiver = open("shm,self");
    let target = first_receiver.register(MemoryKind::Host, 1 << 20).expect("target");
    let TwoLanes { first_receiver, second_receiver, first_sender, second_sender: _second_sender } =
        two_shm_lanes(first_receiver, target.id);

    // The first sender stalls: it cannot see the goodbye, and over shm could still write.
    let stalled = first_sender.shared.engine();
    drop(first_receiver);
    let refused = second_receiver.deregister(target.id);
    assert!(
        matches!(refused, Err(TransportError::RegionBusy { why, .. }) if why.contains("exposed")),
        "released while the closed lane's peer may still write it: {refused:?}"
    );
    drop(stalled);
    // Once that peer has seen the goodbye it stops, and says so on its socket.
    eventually(|| second_receiver.deregister(target.id));
}

/// Releasing a region on one lane flushes every lane's unsignalled puts. A lane whose peer is
/// slow (its worker stalled, the flush still running at its bound) is busy, not broken: the
/// release is refused and the lane keeps working.
#[test]
fn a_slow_lane_is_busy_for_another_lanes_release_not_killed() {
    const LEN: u64 = 32 << 20; // more than loopback's socket buffers hold
    let first_sender = open("tcp,self");
    let source = first_sender.register(MemoryKind::Host, LEN).expect("source");
    let data = pattern(LEN as usize, 7);
    first_sender.write_region(source.id, 0, &data).expect("fill");
    let second_sender = first_sender.open_lane().expect("lane");
    let first_receiver = open("tcp,self");
    let target = first_receiver.register(MemoryKind::Host, LEN).expect("target");
    let second_receiver = first_receiver.open_lane().expect("lane");
    let remote = connect(&first_receiver, &first_sender, &[target.id]);
    connect(&second_receiver, &second_sender, &[]);

    let put = |wr_id, signalled| WriteOp {
        wr_id,
        local: source.id,
        local_offset: 0,
        remote: remote[0].id,
        remote_offset: 0,
        len: LEN,
        signalled,
        imm: None,
    };
    let stalled = first_receiver.shared.engine();
    first_sender.post_writes(&[put(1, false)]).expect("post an unsignalled put");
    let refused = second_sender.deregister(source.id);
    assert!(
        matches!(refused, Err(TransportError::RegionBusy { .. })),
        "released while a put still reads it: {refused:?}"
    );
    drop(stalled);
    assert!(first_sender.shared.engine().gone().is_none(), "the slow lane was killed");
    first_sender.post_writes(&[put(2, true)]).expect("the slow lane still posts");
    let mut completions = [Completion::EMPTY; 1];
    block_on(first_sender.wait_completions(&mut completions, deadline(60))).expect("completion");
    assert_eq!((completions[0].wr_id, completions[0].status), (2, CompletionStatus::Success));
    let mut landed = vec![0u8; LEN as usize];
    first_receiver.read_region(target.id, 0, &mut landed).expect("read");
    assert!(landed == data, "the bytes that arrived differ");
    eventually(|| second_sender.deregister(source.id));
}

/// A connection that fails with signalled writes in flight fails each of them, and a poll
/// answers `PeerGone` only once they are all delivered: never in the moment between the engine
/// marking itself gone and queuing the failed completions.
#[test]
fn every_signalled_write_completes_before_peer_gone() {
    for round in 0..20 {
        let sender = open("tcp,self");
        let source = sender.register(MemoryKind::Host, 1 << 20).expect("source");
        let receiver = open("tcp,self");
        let target = receiver.register(MemoryKind::Host, 1 << 20).expect("target");
        let remote = connect(&receiver, &sender, &[target.id]);
        let stalled = receiver.shared.engine();
        let ops: Vec<WriteOp> = (0..8)
            .map(|wr_id| WriteOp {
                wr_id,
                local: source.id,
                local_offset: 0,
                remote: remote[0].id,
                remote_offset: 0,
                len: 1 << 20,
                signalled: true,
                imm: None,
            })
            .collect();
        sender.post_writes(&ops).expect("post");
        let mut seen = 0;
        std::thread::scope(|scope| {
            let polling = scope.spawn(|| {
                let mut out = [Completion::EMPTY; 8];
                let until = deadline(20);
                loop {
                    match sender.poll_completions(&mut out) {
                        Ok(n) => seen += n,
                        Err(TransportError::PeerGone(_)) => return,
                        Err(e) => panic!("{e}"),
                    }
                    assert!(Instant::now() < until, "no PeerGone within 20 s");
                }
            });
            // The receiver's process "vanishes": its socket closes under it.
            receiver
                .shared
                .control
                .get()
                .expect("socket")
                .stream()
                .expect("the channel's own socket")
                .shutdown(std::net::Shutdown::Both)
                .expect("shutdown");
            polling.join().expect("polling thread");
        });
        assert_eq!(seen, ops.len(), "round {round}: PeerGone before every signalled write completed");
        drop(stalled);
    }
}

/// CPU time `transport`'s progress thread has used so far.
fn progress_thread_cpu(transport: &UcxTransport) -> Duration {
    use std::os::unix::thread::JoinHandleExt;
    let progress = transport.progress.lock().unwrap();
    let thread = progress.as_ref().expect("a progress thread").as_pthread_t();
    let mut clock: libc::clockid_t = 0;
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: the thread is alive (joined only when the transport drops, which the borrow
    // prevents); both out-pointers are valid.
    let read = unsafe {
        libc::pthread_getcpuclockid(thread, &mut clock) == 0 && libc::clock_gettime(clock, &mut now) == 0
    };
    assert!(read, "the progress thread's CPU clock");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// A `BusyPoll` transport whose peer has left keeps its progress thread asleep: the peer's
/// last byte stays unread on the socket, and a thread that polled it again would spin.
#[test]
fn a_busy_poll_lane_whose_peer_left_does_not_spin() {
    let receiver = open("tcp,self");
    let target = receiver.register(MemoryKind::Host, 4096).expect("target");
    let sender = open("tcp,self");
    connect(&receiver, &sender, &[target.id]);
    receiver.set_wait_mode(rdma_hint_core::WaitMode::BusyPoll);
    drop(sender);
    let until = deadline(20);
    while receiver.shared.engine().gone().is_none() {
        assert!(Instant::now() < until, "the peer's leaving was never noticed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (cpu, wall) = (progress_thread_cpu(&receiver), Instant::now());
    std::thread::sleep(Duration::from_millis(500));
    let share = (progress_thread_cpu(&receiver) - cpu).as_secs_f64() / wall.elapsed().as_secs_f64();
    assert!(share < 0.3, "the idle transport's progress thread used {:.0} % of a core", share * 100.0);
}
