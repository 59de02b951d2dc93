//! What a pair that answers writes with writes must keep, where a transport may hold its
//! acknowledgement of a write back for the answer to carry (staged TCP in `BusyPoll` does): every
//! signalled write still completes once, with success, when the answers stop, and when the
//! receiver drops its transport right after the arrival.

use crate::backend::Backend;
use crate::contract::shared;
use crate::pair::deadline;
use crate::Subject;
use rdma_hint_backend_core::blocking::{block_on, BlockingTransport};
use rdma_hint_core::{
    Arrival, Completion, CompletionStatus, LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, Transport,
    WaitMode, WriteOp,
};
use rdma_hint_integration_tests::{first_mismatch, random_bytes};

/// Bytes of each write.
const LEN: u64 = 64;

/// One side of the pair: its transport, the region it writes from, the region its peer writes
/// into, and the peer's, as it knows it.
struct Side<T> {
    transport: T,
    source: LocalRegion,
    target: LocalRegion,
    remote: RemoteRegion,
}

/// Two sides in `BusyPoll`, each exposing a target to the other.
fn answering_pair<B: Backend>(backend: &B) -> [Side<B::Transport>; 2] {
    let open = || {
        let transport = backend.open(backend.token());
        transport.set_wait_mode(WaitMode::BusyPoll);
        let register = || transport.register(MemoryKind::Host, 4096).expect("register");
        let (source, target) = (register(), register());
        (transport, source, target)
    };
    let (listener, listener_source, listener_target) = open();
    let address = listener.bind(backend.listen_address()).expect("bind");
    let accepting = std::thread::spawn(move || {
        let remote =
            block_on(listener.connect(PeerEndpoint::Listen(address), &[listener_target.id], deadline(20)))
                .expect("accept")[0];
        Side { transport: listener, source: listener_source, target: listener_target, remote }
    });
    let (dialler, source, target) = open();
    let remote =
        block_on(dialler.connect(PeerEndpoint::Dial(address), &[target.id], deadline(20))).expect("dial")[0];
    [Side { transport: dialler, source, target, remote }, accepting.join().expect("accepting thread")]
}

/// `from` writes `LEN` bytes from `seed` into its peer's target, signalled, with `imm`.
fn write<T: Transport>(from: &Side<T>, seed: u64, imm: u32) -> Vec<u8> {
    let bytes = random_bytes(LEN as usize, seed);
    from.transport.write_region(from.source.id, 0, &bytes).expect("fill the source");
    let op = WriteOp {
        wr_id: seed,
        local: from.source.id,
        local_offset: 0,
        remote: from.remote.id,
        remote_offset: 0,
        len: LEN,
        signalled: true,
        imm: Some(imm),
    };
    from.transport.post_writes(&[op]).expect("post");
    bytes
}

/// `at` takes one arrival with `imm` and finds `expected` in its target.
fn arrive<T: Transport>(at: &Side<T>, imm: u32, expected: &[u8]) {
    let mut arrivals = [Arrival::EMPTY; 1];
    let got = at.transport.wait_arrivals_blocking(&mut arrivals, deadline(20)).expect("arrival");
    assert_eq!((got, arrivals[0].imm), (1, imm), "the arrival");
    let mut landed = vec![0u8; LEN as usize];
    at.transport.read_region(at.target.id, 0, &mut landed).expect("read the target");
    assert_eq!(first_mismatch(&landed, expected), None, "write {imm}: first wrong byte");
}

/// `at` takes the one completion of its write `wr_id`: a success.
fn complete<T: Transport>(at: &Side<T>, wr_id: u64) {
    let mut completions = [Completion::EMPTY; 2];
    let got = at.transport.wait_completions_blocking(&mut completions, deadline(20));
    let got = got.unwrap_or_else(|e| panic!("the completion of write {wr_id}: {e}"));
    assert_eq!(
        &completions[..got],
        &[Completion { wr_id, status: CompletionStatus::Success }],
        "write {wr_id} completes once, with success"
    );
}

/// A ping-pong of signalled writes, each answered by a write: every write completes once
/// with success and its bytes land. Then the answers stop: the last write still completes
/// while its receiver polls nothing; and a write whose receiver drops its transport as soon as it
/// took the arrival completes with success, not as flushed.
pub fn an_answered_write_and_one_taken_just_before_a_drop_both_complete<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let [asker, answerer] = answering_pair(s.backend);
    for round in 0..200u64 {
        let asked = write(&asker, 2 * round + 1, 1);
        arrive(&answerer, 1, &asked);
        let answer = write(&answerer, 2 * round + 2, 2);
        arrive(&asker, 2, &answer);
        complete(&asker, 2 * round + 1);
        complete(&answerer, 2 * round + 2);
    }
    // No answer, and the answerer polls nothing meanwhile: the write completes all the same.
    let unanswered = write(&asker, 1001, 3);
    arrive(&answerer, 3, &unanswered);
    complete(&asker, 1001);
    // Answered once more, so that its acks are held again, then the arrival and the drop.
    let asked = write(&asker, 1002, 4);
    arrive(&answerer, 4, &asked);
    let answer = write(&answerer, 1003, 5);
    arrive(&asker, 5, &answer);
    complete(&asker, 1002);
    let last = write(&asker, 1004, 6);
    complete(&answerer, 1003);
    arrive(&answerer, 6, &last);
    drop(answerer);
    complete(&asker, 1004);
}
