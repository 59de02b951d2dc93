//! The rules about reads: a region the peer exposed comes back byte for byte, a read that
//! names what the peer did not expose (or runs past it) fails before anything moves, and
//! reads from a peer that went away end in time.

use crate::backend::Backend;
use crate::contract::shared;
use crate::pair::{deadline, pair, Pair};
use crate::Subject;
use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_core::{Completion, CompletionStatus, ReadOp, RegionId, Transport, TransportError};
use rdma_hint_integration_tests::{first_mismatch, random_bytes};
use std::time::Instant;

/// Reads `len` bytes of the peer's region into the sender's, from `remote_offset` to
/// `local_offset`, in `block`-byte reads: doorbells of up to 16 reads, the last of each
/// signalled, one doorbell in flight at a time.
fn read_into<T: Transport>(p: &Pair<T>, offsets: (u64, u64), len: u64, block: u64) {
    read_between(&p.sender, (p.source.id, p.remote.id), offsets, len, block);
}

/// [`read_into`] from the peer's region `remote` into `sender`'s `local`.
pub(crate) fn read_between<T: Transport>(
    sender: &T,
    (local, remote): (RegionId, RegionId),
    (local_offset, remote_offset): (u64, u64),
    len: u64,
    block: u64,
) {
    let per_post = u64::from(sender.capabilities().max_wrs_per_post.clamp(1, 16));
    let mut ops = [ReadOp::EMPTY; 16];
    let mut done = 0;
    let mut tag = 0;
    while done < len {
        let mut count = 0;
        while count < per_post && done < len {
            let this = block.min(len - done);
            ops[count as usize] = ReadOp {
                wr_id: tag,
                local,
                local_offset: local_offset + done,
                remote,
                remote_offset: remote_offset + done,
                len: this,
                signalled: false,
            };
            (done, tag, count) = (done + this, tag + 1, count + 1);
        }
        ops[count as usize - 1].signalled = true;
        sender.post_reads(&ops[..count as usize]).expect("post reads");
        let mut completions = [Completion::EMPTY; 1];
        let got =
            block_on(sender.wait_completions(&mut completions, deadline(60))).expect("a read completes");
        assert_eq!(got, 1);
        assert_eq!(completions[0].wr_id, tag - 1, "the doorbell's signalled read completes");
        assert_eq!(completions[0].status, CompletionStatus::Success, "read {}", tag - 1);
    }
}

/// The peer's exposed region (the backend's long transfer: 256 MiB, 32 MiB in the Soft-RoCE
/// VM), filled with pseudo-random bytes on the peer's side, is read back into this side's
/// region block by block and matches byte for byte; so do odd ranges at odd offsets.
pub fn reads_fetch_the_peers_exposed_bytes_exactly<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let len = s.backend.scale().long_transfer_bytes;
    let p = pair(s.backend, len, s.backend.listen_address());
    let expected = random_bytes(len as usize, 0x7ead);
    p.receiver.write_region(p.target.id, 0, &expected).expect("fill the peer's region");
    let started = Instant::now();
    read_into(&p, (0, 0), len, 1 << 20);
    let took = started.elapsed();
    let mut read = vec![0u8; len as usize];
    p.sender.read_region(p.source.id, 0, &mut read).expect("read the local region");
    assert_eq!(first_mismatch(&read, &expected), None, "{len} B read in 1 MiB reads: first wrong byte");
    eprintln!("read {len} B in {took:?} ({:.2} GB/s)", len as f64 / took.as_secs_f64() / 1e9);
    for (local_offset, remote_offset, len, block) in
        [(13, 4096 + 7, 4097, 4096), (0, len - 1, 1, 1), (4096, 1, 65_537, 8191)]
    {
        let sentinel = vec![0xa5u8; len as usize + 2];
        p.sender.write_region(p.source.id, local_offset - local_offset.min(1), &sentinel).expect("poison");
        read_into(&p, (local_offset, remote_offset), len, block);
        let mut got = vec![0u8; len as usize];
        p.sender.read_region(p.source.id, local_offset, &mut got).expect("read the local region");
        let want = &expected[remote_offset as usize..(remote_offset + len) as usize];
        assert_eq!(first_mismatch(&got, want), None, "{len} B from {remote_offset} to {local_offset}");
    }
}

/// A read past the peer's region, of nothing, from a region it did not expose, or into a
/// region this side does not have, fails before anything is posted, with a typed error; the
/// connection stays usable.
pub fn bad_reads_fail_before_posting<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let len = 64 * 1024;
    let p = pair(s.backend, len, s.backend.listen_address());
    let good = ReadOp {
        wr_id: 1,
        local: p.source.id,
        local_offset: 0,
        remote: p.remote.id,
        remote_offset: 0,
        len: 4096,
        signalled: true,
    };
    type Expect = fn(&TransportError) -> bool;
    let unregistered: Expect = |e| matches!(e, TransportError::UnregisteredRegion(_));
    let out_of_bounds: Expect = |e| matches!(e, TransportError::OutOfBounds { .. });
    let cases: [(&str, ReadOp, Expect); 6] = [
        ("a region the peer did not expose", ReadOp { remote: RegionId(999), ..good }, unregistered),
        ("into a region this side lacks", ReadOp { local: RegionId(999), ..good }, unregistered),
        ("past the peer's end", ReadOp { remote_offset: len - 100, ..good }, out_of_bounds),
        ("past the local end", ReadOp { local_offset: len - 100, ..good }, out_of_bounds),
        ("offset overflow", ReadOp { remote_offset: u64::MAX - 10, ..good }, out_of_bounds),
        ("empty", ReadOp { len: 0, ..good }, |e| matches!(e, TransportError::ZeroLength { .. })),
    ];
    p.sender.write_region(p.source.id, 0, &vec![7u8; len as usize]).expect("fill");
    for (what, op, expected) in cases {
        // Behind a good read in the same doorbell: a rejected batch posts nothing.
        match p.sender.post_reads(&[ReadOp { signalled: false, ..good }, op]) {
            Err(error) => assert!(expected(&error), "{what}: {error:?}"),
            Ok(()) => panic!("{what}: posted"),
        }
    }
    let mut untouched = vec![0u8; len as usize];
    p.sender.read_region(p.source.id, 0, &mut untouched).expect("read back");
    assert!(untouched.iter().all(|byte| *byte == 7), "a refused batch moved bytes");
    let mut completions = [Completion::EMPTY; 4];
    assert_eq!(p.sender.poll_completions(&mut completions).expect("poll"), 0, "a refused read completed");
    p.receiver.write_region(p.target.id, 0, &random_bytes(len as usize, 9)).expect("fill the peer's");
    read_into(&p, (0, 0), len, 4096);
}

/// Once the peer has gone, reads end in time: the post, a completion or the wait says so,
/// within the backend's report bound; never a hang.
pub fn reads_from_a_peer_that_went_away_end_in_time<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let len = 1 << 20;
    let p = pair(s.backend, len, s.backend.listen_address());
    read_into(&p, (0, 0), len, 64 * 1024);
    let Pair { sender, receiver, source, remote, .. } = p;
    drop(receiver);
    let within = s.backend.scale().report_within_s;
    let started = Instant::now();
    let op = ReadOp {
        wr_id: 77,
        local: source.id,
        local_offset: 0,
        remote: remote.id,
        remote_offset: 0,
        len: 4096,
        signalled: true,
    };
    let failed = loop {
        assert!(started.elapsed().as_secs() < within, "reads still succeed {within} s after the peer left");
        if let Err(error) = sender.post_reads(&[op]) {
            break error;
        }
        let mut completions = [Completion::EMPTY; 1];
        match block_on(sender.wait_completions(&mut completions, deadline(within))) {
            Err(error) => break error,
            Ok(_) if completions[0].status != CompletionStatus::Success => {
                break TransportError::PeerGone(format!("{:?}", completions[0].status))
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    assert!(
        matches!(failed, TransportError::PeerGone(_) | TransportError::Completion { .. }),
        "a read from a peer that left: {failed:?}"
    );
}
