//! The memory side of the contract: a [`Domain`] (one per NIC's protection domain, UCX
//! context, shared-memory namespace or GPU) registers memory, owns the one region table with
//! its in-flight and exposure accounting, lends regions and takes them back. The links over it
//! (each a [`Transport`](crate::Transport): a connection, or one lane of one) post from its
//! regions and expose them.

use crate::admission::Refused;
use crate::caller_memory::{CallerMemory, CopiedBytes};
use crate::region::{LocalRegion, MemoryKind, RegionId};
use crate::transport_error::TransportError;

/// One memory domain and its regions (see the [module](self)); object safe, shared by the links
/// that post from it.
pub trait Domain: Send + Sync {
    /// Allocates and registers `len` bytes of `kind` memory for local use and remote exposure.
    fn register(&self, kind: MemoryKind, len: u64) -> Result<LocalRegion, TransportError>;

    /// Caps the bytes this domain may allocate for its live regions at `cap_bytes` (caller
    /// memory registered in place does not count). Without a cap, registrations are still
    /// refused past what the machine and this process's memory cgroups can spare
    /// ([`TransportError::OutOfMemory`]).
    ///
    /// The default, for domains without a cap of their own, refuses with
    /// [`TransportError::InvalidArgument`].
    fn cap_memory(&self, cap_bytes: u64) -> Result<(), TransportError> {
        let _ = cap_bytes;
        Err(TransportError::InvalidArgument { what: "memory cap", why: "this domain takes no cap".into() })
    }

    /// Releases a registered region (caller memory included: its buffer is dropped; use
    /// [`release`](Domain::release) to get it back).
    fn deregister(&self, region: RegionId) -> Result<(), TransportError>;

    /// Registers memory the caller owns in place, for local use and remote exposure: ops on the
    /// region read and write the caller's bytes, with the copies
    /// [`Capabilities::caller_memory`](crate::Capabilities::caller_memory) lists. Checked first
    /// ([`ForeignMemory::validate`](crate::ForeignMemory::validate): zero, oversized,
    /// misaligned); a refusal hands the memory back in [`TransportError::MemoryRefused`].
    ///
    /// The default, for transports whose [`Capabilities::caller_memory`](crate::Capabilities::caller_memory) is empty, refuses
    /// every kind with [`TransportError::UnsupportedMemory`].
    fn register_memory(&self, memory: CallerMemory) -> Result<LocalRegion, TransportError> {
        Err(Refused { error: TransportError::UnsupportedMemory { kind: memory.kind() }, memory }.into())
    }

    /// Unregisters a region made by [`register_memory`](Domain::register_memory) and hands
    /// its memory back. [`TransportError::RegionBusy`] while an op this transport posted may
    /// still read it, or while it is exposed to a connected peer; a transport-owned region is
    /// [`TransportError::InvalidArgument`] (use [`deregister`](Domain::deregister)).
    ///
    /// The default (no caller memory registered, ever) answers
    /// [`TransportError::UnregisteredRegion`].
    fn release(&self, region: RegionId) -> Result<CallerMemory, TransportError> {
        Err(TransportError::UnregisteredRegion(region))
    }

    /// Marks `region` as named by a transfer that is queued or in flight (a transfer engine
    /// calls it when it takes the transfer): until as many [`unhold`](Domain::unhold)s,
    /// [`release`](Domain::release) and [`deregister`](Domain::deregister) answer
    /// [`TransportError::RegionBusy`], so the memory cannot go, nor its id be handed to other
    /// memory, while something may still post from it. Counted: every hold needs its unhold.
    fn hold(&self, region: RegionId) -> Result<(), TransportError>;

    /// Ends one [`hold`](Domain::hold) of `region`.
    fn unhold(&self, region: RegionId);

    /// Lends `access` the bytes of a host region in place (no copy), to fill before sending or
    /// read once the peer is done. [`TransportError::RegionBusy`] while an op this transport
    /// posted may still read the region, and while the region is exposed to a connected (or
    /// connecting) peer, which may write it at any moment: read what an [`Arrival`](crate::Arrival) announced
    /// with [`access_region_unchecked`](Domain::access_region_unchecked), whose contract
    /// says the peer is not writing. A GPU region is [`TransportError::UnsupportedMemory`] (see
    /// [`device_pointer`](Domain::device_pointer)). `access` runs with the region table
    /// locked: it must not call back into this transport.
    ///
    /// The default lends nothing: [`TransportError::UnsupportedMemory`].
    fn access_region(
        &self,
        region: RegionId,
        access: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), TransportError> {
        let _ = (region, access);
        Err(TransportError::UnsupportedMemory { kind: MemoryKind::Host })
    }

    /// [`access_region`](Domain::access_region) for a region exposed to the connected
    /// peer: the receiving side's in-place read after an arrival. Still
    /// [`TransportError::RegionBusy`] while an op this transport posted may read it.
    ///
    /// # Safety
    ///
    /// The peer must not write the region while `access` runs: the application's protocol
    /// orders it (the peer writes nothing more after the arrival being read, until this side
    /// tells it to), as every RDMA receiver orders reads of its exposed memory.
    #[allow(unsafe_code)] // the contract above; implementations are the backends'
    unsafe fn access_region_unchecked(
        &self,
        region: RegionId,
        access: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), TransportError> {
        self.access_region(region, access)
    }

    /// The `CUdeviceptr` of a GPU region's first byte, so a kernel can fill it or read it in
    /// place; [`TransportError::UnsupportedMemory`] for a host region (and by default).
    fn device_pointer(&self, region: RegionId) -> Result<u64, TransportError> {
        let _ = region;
        Err(TransportError::UnsupportedMemory { kind: MemoryKind::Host })
    }

    /// Payload bytes the code of this domain and its links has copied with the CPU so far.
    fn copied_bytes(&self) -> CopiedBytes;

    /// Copies `data` into a local region at `offset` (staging it for GPU memory).
    fn write_region(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), TransportError>;

    /// Copies from a local region at `offset` into `out`.
    fn read_region(&self, region: RegionId, offset: u64, out: &mut [u8]) -> Result<(), TransportError>;
}
