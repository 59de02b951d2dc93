//! Registered memory and its registrations ([`MemoryRegion`]s): host memory the transport
//! allocates (an anonymous mapping), the caller's host memory or a caller's dma-buf, each
//! registered once for local access and a second time with remote write once exposed.

use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::wire::ExposedRegion;
use memmap2::MmapMut;
use rdma_hint_backend_core::region_memory::{DomainRegion, Lease, MemorySource};
use rdma_hint_backend_core::region_table::RegionLen;
use rdma_hint_backend_core::MAX_REGION_BYTES;
use rdma_hint_core::transport::check_range;
use rdma_hint_core::{CallerMemory, CallerMemoryPath, ForeignMemory, MemoryKind, Refused, TransportError};
use rdma_mummy_sys as ibv;
use std::sync::Arc;

/// What a region's registrations cover.
#[derive(Debug)]
enum Backing {
    /// An anonymous mapping the region owns (never unmapped while registered).
    Mapping { _mapping: MmapMut },
    /// The caller's host memory (`None` once handed back).
    CallerHost(Option<CallerMemory>),
    /// The caller's dma-buf: `len` bytes at `offset` into `fd`, addressed from iova 0.
    CallerDmaBuf { memory: Option<CallerMemory>, fd: i32, offset: u64 },
}

/// Registered memory: one registration for local access; exposing it to the peer registers
/// it a second time with remote write (so regions never exposed have no remote key at all).
#[derive(Debug)]
pub(crate) struct Region {
    // Fields drop in declaration order: the remote registration, then the local one, then the
    // memory they cover.
    remote: Option<MemoryRegion>,
    local: MemoryRegion,
    backing: Backing,
    /// The address work requests name the first byte by: its virtual address for host memory,
    /// 0 (the iova it was registered at) for a dma-buf.
    base: *mut u8,
    len: u64,
}

// SAFETY: `base` points into memory the region keeps registered and mapped (its own mapping,
// or caller memory the `CallerMemory` contract keeps alive until release); the MRs are only
// deregistered on drop. Every access copies bytes through raw pointers after a bounds check,
// or lends them while no op is in flight; concurrent writers (the NIC, or two threads'
// `write_region` on overlapping ranges) can only leave mixed bytes, as on any RDMA target.
unsafe impl Send for Region {}
// SAFETY: see `Send`.
unsafe impl Sync for Region {}

const LOCAL_ACCESS: u32 = ibv::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
const REMOTE_ACCESS: u32 = ibv::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    | ibv::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
    | ibv::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;

impl Region {
    /// Allocates `len` zeroed bytes and registers them for local write.
    pub(crate) fn register(pd: &Arc<ProtectionDomain>, len: u64) -> Result<Region, TransportError> {
        if len == 0 || len > MAX_REGION_BYTES {
            return Err(TransportError::Registration {
                len,
                reason: format!("length must be 1 B … {MAX_REGION_BYTES} B"),
            });
        }
        let mut mapping = MmapMut::map_anon(len as usize)
            .map_err(|e| TransportError::Registration { len, reason: format!("mmap: {e}") })?;
        let base = mapping.as_mut_ptr();
        // SAFETY: `base..base+len` is `mapping`, which the region owns and unmaps only after
        // its registrations are gone (field order).
        let local = unsafe { MemoryRegion::register(pd, base, len, LOCAL_ACCESS)? };
        Ok(Region { remote: None, local, backing: Backing::Mapping { _mapping: mapping }, base, len })
    }

    /// Registers the caller's memory in place (`ibv_reg_mr` on its pages, `ibv_reg_dmabuf_mr`
    /// on its dma-buf); admitted already (non-empty, bounded, aligned). A refusal hands the
    /// memory back.
    pub(crate) fn register_caller(
        pd: &Arc<ProtectionDomain>,
        memory: CallerMemory,
    ) -> Result<Region, Refused> {
        let len = memory.len();
        let registered = match memory.memory() {
            ForeignMemory::Host { address, .. } => {
                let base = std::ptr::with_exposed_provenance_mut::<u8>(address);
                // SAFETY: the `CallerMemory` contract keeps `base..base+len` mapped until the
                // region is released, after its registrations are dropped (field order).
                unsafe { MemoryRegion::register(pd, base, len, LOCAL_ACCESS) }
                    .map(|local| (local, base, Backing::CallerHost(None)))
            }
            ForeignMemory::DmaBuf { fd, offset, .. } => {
                // SAFETY: the `CallerMemory` contract keeps `fd` open until release.
                unsafe { MemoryRegion::register_dmabuf(pd, (fd, offset), len, 0, LOCAL_ACCESS) }.map(
                    |local| (local, std::ptr::null_mut(), Backing::CallerDmaBuf { memory: None, fd, offset }),
                )
            }
            _ => Err(TransportError::UnsupportedMemory { kind: memory.kind() }),
        };
        match registered {
            Ok((local, base, mut backing)) => {
                match &mut backing {
                    Backing::CallerHost(slot) | Backing::CallerDmaBuf { memory: slot, .. } => {
                        *slot = Some(memory)
                    }
                    Backing::Mapping { .. } => {}
                }
                Ok(Region { remote: None, local, backing, base, len })
            }
            Err(error) => Err(Refused { error, memory }),
        }
    }

    /// Registers the region for remote write (no remote read) and returns the rkey to send.
    pub(crate) fn expose(&mut self, pd: &Arc<ProtectionDomain>) -> Result<u32, TransportError> {
        if let Some(mr) = &self.remote {
            return Ok(mr.rkey());
        }
        let mr = match &self.backing {
            // SAFETY: the descriptor stays open while the region holds the caller's memory,
            // which outlives this registration (field order).
            Backing::CallerDmaBuf { fd, offset, .. } => unsafe {
                MemoryRegion::register_dmabuf(pd, (*fd, *offset), self.len, 0, REMOTE_ACCESS)?
            },
            // SAFETY: as in `register`: the memory outlives the registration (field order).
            _ => unsafe { MemoryRegion::register(pd, self.base, self.len, REMOTE_ACCESS)? },
        };
        Ok(self.remote.insert(mr).rkey())
    }

    /// Drops the remote registration once no peer may reach the region any more: the rkey
    /// sent for it is void from then on.
    pub(crate) fn unexpose(&mut self) {
        self.remote = None;
    }

    /// The lkey for work requests.
    pub(crate) fn lkey(&self) -> u32 {
        self.local.lkey()
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Address of byte `offset` (bound-checked by the caller).
    pub(crate) fn address(&self, offset: u64) -> u64 {
        self.base as u64 + offset
    }

    /// Host memory only: a dma-buf's pages are not mapped here.
    fn check(&self, offset: u64, len: usize) -> Result<(), TransportError> {
        if let Backing::CallerDmaBuf { .. } = self.backing {
            return Err(TransportError::UnsupportedMemory { kind: MemoryKind::DmaBuf });
        }
        check_range("local", offset, len as u64, self.len)
    }
}

impl DomainRegion for Region {
    fn kind(&self) -> MemoryKind {
        match self.backing {
            Backing::CallerDmaBuf { .. } => MemoryKind::DmaBuf,
            _ => MemoryKind::Host,
        }
    }

    fn is_caller(&self) -> bool {
        !matches!(self.backing, Backing::Mapping { .. })
    }

    /// Deregisters and hands the caller's memory back (`None` for memory allocated here).
    fn into_caller(mut self) -> Option<CallerMemory> {
        match &mut self.backing {
            Backing::CallerHost(memory) | Backing::CallerDmaBuf { memory, .. } => memory.take(),
            Backing::Mapping { .. } => None,
        }
    }

    fn copy_in(&self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        self.check(offset, data.len())?;
        // SAFETY: bounds checked; `data` is caller memory, not part of the region.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset as usize), data.len()) };
        Ok(())
    }

    fn copy_out(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        self.check(offset, out.len())?;
        // SAFETY: bounds checked; `out` is caller memory, not part of the region.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset as usize), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Host memory only.
    fn lend(&self, _lease: &Lease, access: &mut dyn FnMut(&mut [u8])) -> Result<(), TransportError> {
        self.check(0, 0)?;
        // SAFETY: host memory of `len` bytes at `base`, registered and mapped for the region's
        // life; the lease is the domain's word that no work request of any lane reads it and
        // none can be posted meanwhile, and that no lane's peer writes it (or the caller of
        // `access_region_unchecked` vouches for that).
        access(unsafe { std::slice::from_raw_parts_mut(self.base, self.len as usize) });
        Ok(())
    }
}

/// How the verbs backend makes region memory: mappings and caller memory registered in one
/// protection domain (for local access; `connect` adds the remote registration).
#[derive(Debug)]
pub(crate) struct VerbsMemory {
    pub(crate) pd: Arc<ProtectionDomain>,
}

impl MemorySource<Region> for VerbsMemory {
    /// Host memory only: GPU memory would go through `ibv_reg_dmabuf_mr` (not implemented: no
    /// NIC here to test it on).
    fn admit_kind(&self, kind: MemoryKind) -> Result<(), TransportError> {
        match kind {
            MemoryKind::Host => Ok(()),
            other => Err(TransportError::UnsupportedMemory { kind: other }),
        }
    }

    fn allocate(&self, _kind: MemoryKind, len: u64) -> Result<Region, TransportError> {
        Region::register(&self.pd, len)
    }

    fn register_caller(&self, memory: CallerMemory) -> Result<Region, Refused> {
        Region::register_caller(&self.pd, memory)
    }
}

impl RegionLen for Region {
    fn region_len(&self) -> u64 {
        self.len
    }
}

impl RegionLen for ExposedRegion {
    fn region_len(&self) -> u64 {
        self.len
    }
}
/// Host memory is registered in place everywhere; dma-bufs where the provider implements
/// `ibv_reg_dmabuf_mr`, which a probe with no descriptor tells apart: a provider without it
/// answers `EOPNOTSUPP` (rxe does), one with it rejects the descriptor.
pub(crate) fn caller_memory_paths(pd: &Arc<ProtectionDomain>) -> Vec<CallerMemoryPath> {
    let path = |kind| CallerMemoryPath { kind, send_copies: 0, receive_copies: Some(0), medium_copies: 0 };
    let mut paths = vec![path(MemoryKind::Host)];
    // SAFETY: fd -1 is never a descriptor: the call fails before anything is registered.
    let probe = unsafe { MemoryRegion::register_dmabuf(pd, (-1, 0), 4096, 0, 0) };
    if !matches!(probe, Err(TransportError::UnsupportedMemory { .. })) {
        paths.push(path(MemoryKind::DmaBuf));
    }
    paths
}
