//! What every backend does with caller memory before its own registration call, and the
//! counter of the payload bytes its code copies.

use crate::MAX_REGION_BYTES;
use rdma_hint_core::{CallerMemory, CallerMemoryPath, CopiedBytes, Refused, RegionId, TransportError};
use std::sync::atomic::{AtomicU64, Ordering};

/// Admits `memory` for registration on a transport whose caller-memory paths are `paths`: its
/// kind must be one of them, and it must pass
/// [`ForeignMemory::validate`](rdma_hint_core::ForeignMemory::validate) (at most
/// [`MAX_REGION_BYTES`]). A refusal hands the memory back.
///
/// ```
/// use rdma_hint_core::{CallerMemory, CallerMemoryPath, MemoryKind, TransportError};
/// use rdma_hint_backend_core::caller_memory::admit;
/// let host = [CallerMemoryPath { kind: MemoryKind::Host, send_copies: 0, receive_copies: Some(0), medium_copies: 0 }];
/// assert!(admit(CallerMemory::from(vec![0u8; 4096]), &host).is_ok());
/// let refused = admit(CallerMemory::from(Vec::new()), &host).unwrap_err();
/// assert!(matches!(refused.error, TransportError::Registration { len: 0, .. }));
/// assert!(admit(CallerMemory::from(vec![0u8; 64]), &[]).is_err()); // no path for host memory
/// ```
pub fn admit(memory: CallerMemory, paths: &[CallerMemoryPath]) -> Result<CallerMemory, Refused> {
    let kind = memory.kind();
    if !paths.iter().any(|path| path.kind == kind) {
        return Err(Refused { error: TransportError::UnsupportedMemory { kind }, memory });
    }
    match memory.memory().validate(MAX_REGION_BYTES) {
        Ok(()) => Ok(memory),
        Err(error) => Err(Refused { error, memory }),
    }
}

/// Counts the payload bytes a transport's code copies, by site (relaxed atomics: a statistic,
/// not a synchronisation point).
///
/// ```
/// use rdma_hint_backend_core::caller_memory::CopyMeter;
/// let meter = CopyMeter::default();
/// meter.write_region(4096);
/// meter.in_transit(4096);
/// assert_eq!(meter.copied().total(), 8192);
/// ```
#[derive(Debug, Default)]
pub struct CopyMeter {
    write_region: AtomicU64,
    read_region: AtomicU64,
    in_transit: AtomicU64,
}

impl CopyMeter {
    /// `bytes` copied into a region by `write_region`.
    pub fn write_region(&self, bytes: usize) {
        self.write_region.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// `bytes` copied out of a region by `read_region`.
    pub fn read_region(&self, bytes: usize) {
        self.read_region.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// `bytes` copied while moving a write.
    pub fn in_transit(&self, bytes: u64) {
        self.in_transit.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn copied(&self) -> CopiedBytes {
        CopiedBytes {
            write_region: self.write_region.load(Ordering::Relaxed),
            read_region: self.read_region.load(Ordering::Relaxed),
            in_transit: self.in_transit.load(Ordering::Relaxed),
        }
    }
}

/// What `release` answers for a region the transport allocated.
pub fn not_caller_memory() -> TransportError {
    TransportError::InvalidArgument {
        what: "region",
        why: "the transport allocated it (register); release hands back caller memory only, deregister frees it"
            .into(),
    }
}

/// `RegionBusy`: an op this transport posted may still read `region`.
pub fn busy_in_flight(region: RegionId) -> TransportError {
    TransportError::RegionBusy { region, why: "writes are in flight; wait for their completions first" }
}

/// `RegionBusy`: the connected peer may write `region`.
pub fn busy_exposed(region: RegionId) -> TransportError {
    TransportError::RegionBusy {
        region,
        why: "exposed to the connected peer; it comes back once the peer has gone (or drop the transport)",
    }
}
