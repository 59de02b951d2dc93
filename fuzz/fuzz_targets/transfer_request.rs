//! Arbitrary scatter lists → the engine either refuses them with a typed error before posting
//! anything, or moves exactly the bytes each segment names (checked where they landed). The
//! same list goes through `validate_segments` alone, whose accepted output must keep every
//! byte, stay inside both regions and leave no two segments that continue each other.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_hint_engine::{
    validate_segments, BlockSpec, Engine, EngineConfig, LoopbackTransport, PeerId, Segment, TransferRequest,
};
use rdma_hint_core::{LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, SourceId, Transport};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Region length: small, so random offsets land inside as often as outside.
const REGION: u64 = 1 << 16;

struct Rig {
    transport: Arc<LoopbackTransport>,
    engine: Engine,
    peer: PeerId,
    src: LocalRegion,
    dst: LocalRegion,
    remote: RemoteRegion,
    pattern: Vec<u8>,
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let transport = Arc::new(LoopbackTransport::new(256));
        let src = transport.register(MemoryKind::Host, REGION).unwrap();
        let dst = transport.register(MemoryKind::Host, REGION).unwrap();
        let pattern: Vec<u8> = (0..REGION).map(|i| (i * 7 + (i >> 8)) as u8).collect();
        transport.write_region(src.id, 0, &pattern).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let listen = PeerEndpoint::Listen("127.0.0.1:0".parse().unwrap());
        let remote =
            rdma_hint_backend_core::blocking::block_on(transport.connect(listen, &[dst.id], deadline)).unwrap()[0];
        let engine = Engine::new(EngineConfig::default()).unwrap();
        engine.set_hint(SourceId::Host(0), BlockSpec::new(4096, 64).unwrap());
        let peer = engine.add_peer(vec![transport.clone() as Arc<dyn Transport>], &[remote]).unwrap();
        Rig { transport, engine, peer, src, dst, remote, pattern }
    })
}

fn u32_at(data: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 4];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from(u32::from_le_bytes(bytes))
}

fuzz_target!(|data: &[u8]| {
    // 12 bytes per segment: local offset, remote offset, length (each may run past the region,
    // or wrap when widened: the top bit scales a value to near u64::MAX).
    let widen = |v: u64| if v & 0x8000_0000 != 0 { u64::MAX - (v & 0xffff) } else { v % (REGION + 4096) };
    let segments: Vec<Segment> = data
        .chunks(12)
        .take(64)
        .map(|c| Segment {
            local_offset: widen(u32_at(c, 0)),
            remote_offset: widen(u32_at(c, 4)),
            len: widen(u32_at(c, 8)) % (REGION + 1),
        })
        .collect();
    let before: u64 = segments.iter().fold(0u64, |sum, s| sum.saturating_add(s.len));
    let mut merged = segments.clone();
    if let Ok(total) = validate_segments(&mut merged, REGION, REGION) {
        assert_eq!(total, before);
        assert_eq!(merged.iter().map(|s| s.len).sum::<u64>(), before);
        for s in &merged {
            assert!(s.len > 0 && s.local_offset + s.len <= REGION && s.remote_offset + s.len <= REGION);
        }
        for pair in merged.windows(2) {
            let continues = pair[0].local_offset + pair[0].len == pair[1].local_offset
                && pair[0].remote_offset + pair[0].len == pair[1].remote_offset;
            assert!(!continues, "{pair:?} should have been merged");
        }
    }
    // Through the engine: a later segment may overwrite an earlier one's remote bytes, so only
    // lists whose remote ranges do not overlap are checked byte by byte.
    let rig = rig();
    rig.transport.write_region(rig.dst.id, 0, &vec![0u8; REGION as usize]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let request = TransferRequest::scatter(&rig.src, &rig.remote, segments.clone());
    let Ok(id) = rig.engine.submit(rig.peer, request, deadline) else {
        assert!(merged.is_empty() || validate_segments(&mut segments.clone(), REGION, REGION).is_err());
        return;
    };
    let delivered = rig.engine.wait_blocking(id, deadline).expect("an accepted request completes");
    assert_eq!(delivered.bytes, before);
    let mut sorted = segments.clone();
    sorted.sort_by_key(|s| s.remote_offset);
    if sorted.windows(2).any(|p| p[0].remote_offset + p[0].len > p[1].remote_offset) {
        return;
    }
    let mut landed = vec![0u8; REGION as usize];
    rig.transport.read_region(rig.dst.id, 0, &mut landed).unwrap();
    for s in &segments {
        let (l, r, n) = (s.local_offset as usize, s.remote_offset as usize, s.len as usize);
        assert!(landed[r..r + n] == rig.pattern[l..l + n], "segment {s:?}");
    }
});
