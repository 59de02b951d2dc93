//! Arbitrary gather writes on a connected staged pair (shm, where the posting thread copies
//! each piece into the peer's mapping, and TCP, where one frame's payload leaves from every
//! piece): the post is refused with a typed error and completes nothing, or every op's pieces
//! land back to back at its remote offset (checked where they landed) and its one signalled
//! completion comes back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_hint_core::{
    Completion, GatherEntry, GatherOp, LocalRegion, MemoryKind, PeerEndpoint, RegionId, RemoteRegion,
    Transport,
};
use rdma_hint_staged::{StagedChannel, StagedTransport};
use rdma_hint_backend_core::blocking::{block_on, BlockingTransport};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Region length: small, so random offsets land inside as often as outside.
const REGION: u64 = 1 << 16;

struct Pair {
    sender: StagedTransport,
    receiver: StagedTransport,
    source: LocalRegion,
    target: LocalRegion,
    remote: RemoteRegion,
    pattern: Vec<u8>,
}

fn pair(channel: StagedChannel) -> Pair {
    let receiver = StagedTransport::new(channel);
    let target = receiver.register(MemoryKind::Host, REGION).unwrap();
    let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let sender = StagedTransport::new(channel);
    let source = sender.register(MemoryKind::Host, REGION).unwrap();
    let pattern: Vec<u8> = (0..REGION).map(|i| (i * 13 + (i >> 8)) as u8).collect();
    sender.write_region(source.id, 0, &pattern).unwrap();
    let remote = std::thread::scope(|scope| {
        let accepting =
            scope.spawn(|| block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline)));
        let remote = block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline)).unwrap()[0];
        accepting.join().unwrap().unwrap();
        remote
    });
    Pair { sender, receiver, source, target, remote, pattern }
}

fn pairs() -> &'static [Pair; 2] {
    static PAIRS: OnceLock<[Pair; 2]> = OnceLock::new();
    PAIRS.get_or_init(|| [pair(StagedChannel::SharedMemory), pair(StagedChannel::Tcp)])
}

fn u16_at(data: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes([
        data.get(at).copied().unwrap_or(0),
        data.get(at + 1).copied().unwrap_or(0),
    ]))
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else { return };
    let p = &pairs()[usize::from(head & 1)];
    // 6 bytes per entry: offset, length (either may run past the region), and a region id that
    // is mostly the source; then up to 4 ops of (first, count, remote offset) from the head's
    // bits and the tail.
    let (entry_bytes, op_bytes) = rest.split_at(rest.len() * 3 / 4);
    let entries: Vec<GatherEntry> = entry_bytes
        .chunks(6)
        .take(80)
        .map(|c| GatherEntry {
            local: if u16_at(c, 4) % 17 == 0 { RegionId(u16_at(c, 4) as u32) } else { p.source.id },
            offset: u16_at(c, 0) * 2,
            len: u16_at(c, 2) % 9000,
        })
        .collect();
    let ops: Vec<GatherOp> = op_bytes
        .chunks(6)
        .take(4)
        .enumerate()
        .map(|(k, c)| GatherOp {
            wr_id: k as u64 + 1,
            first: (u16_at(c, 0) % 96) as u32,
            count: (u16_at(c, 2) % 40) as u32,
            remote: if head & 2 != 0 && k == 0 { RegionId(7) } else { p.remote.id },
            remote_offset: u16_at(c, 4) * 2,
            signalled: false,
            imm: None,
        })
        .collect();
    let Some(last) = ops.len().checked_sub(1) else { return };
    let mut ops = ops;
    ops[last].signalled = true;
    let mut completions = [Completion::EMPTY; 8];
    if p.sender.post_gather_writes(&ops, &entries).is_err() {
        assert_eq!(
            p.sender.poll_completions(&mut completions).unwrap(),
            0,
            "a refused post completes nothing"
        );
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let got =
        p.sender.wait_completions_blocking(&mut completions, deadline).expect("the signalled op completes");
    assert_eq!(&completions[..got], &[Completion { wr_id: last as u64 + 1, ..Completion::EMPTY }]);
    // Later ops may overwrite earlier ones' bytes: only the last op's landing is checked whole.
    let op = ops[last];
    let own = &entries[op.first as usize..(op.first + op.count) as usize];
    let expected: Vec<u8> =
        own.iter().flat_map(|e| p.pattern[e.offset as usize..(e.offset + e.len) as usize].to_vec()).collect();
    let mut landed = vec![0u8; expected.len()];
    p.receiver.read_region(p.target.id, op.remote_offset, &mut landed).unwrap();
    assert!(landed == expected, "op {op:?}");
});
