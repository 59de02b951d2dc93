//! What a registered region is backed by: host memory (heap or shm) or, with feature `cuda`,
//! GPU memory staged through pinned buffers on its way to and from the wire.

use crate::memory::{Direction, Memory, PeerMapping};
use rdma_hint_core::{CallerMemory, MemoryKind, Refused, TransportError};
use rdma_hint_stream_copy::Run;
use std::net::TcpStream;

/// A registered region's memory.
#[derive(Debug)]
pub(crate) enum RegionMemory {
    Host(Memory),
    #[cfg(feature = "cuda")]
    Gpu(crate::gpu::DeviceBuffer, u32),
}

/// Per-thread copy state: staging for GPU regions, created on first use, and where this
/// thread's host copies into the peer's mappings have been landing.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    #[cfg(feature = "cuda")]
    socket: Option<crate::gpu::SocketStaging>,
    /// GPU → peer mapping copies of the shm channel (dropped before `in_flight`: it waits).
    #[cfg(feature = "cuda")]
    peer: Option<crate::gpu::PeerCopier>,
    /// Sources of queued copies, kept alive until they land (a deregistered region's GPU
    /// memory is not freed under the copy engine).
    #[cfg(feature = "cuda")]
    in_flight: Vec<std::sync::Arc<RegionMemory>>,
    /// The peer mappings `peer` has page-locked, kept mapped while it knows them (a peer that
    /// withdraws a region drops its mapping elsewhere: this keeps it until it is unpinned).
    #[cfg(feature = "cuda")]
    pinned: Vec<std::sync::Arc<PeerMapping>>,
    /// Whether the next host copy streams past the cache, and whether streamed stores are
    /// still unfenced.
    run: Run,
}

impl Staging {
    /// Whether copies may still be landing: queued GPU copies, or streamed stores not fenced.
    pub(crate) fn unsettled(&self) -> bool {
        self.run.unfenced() || self.gpu_queued()
    }

    fn gpu_queued(&self) -> bool {
        #[cfg(feature = "cuda")]
        {
            self.peer.as_ref().is_some_and(crate::gpu::PeerCopier::is_queued)
        }
        #[cfg(not(feature = "cuda"))]
        {
            false
        }
    }

    /// Orders this thread's streamed host stores before its next stores.
    pub(crate) fn fence_host(&mut self) {
        self.run.fence();
    }

    /// Returns once every copy into the peer's memory has landed.
    pub(crate) fn settle(&mut self) -> Result<(), TransportError> {
        self.fence_host();
        #[cfg(feature = "cuda")]
        {
            if let Some(peer) = self.peer.as_mut() {
                peer.wait()?;
            }
            self.in_flight.clear();
        }
        Ok(())
    }

    /// Lets go of the peer mappings GPU copies went into that nothing else holds any more (the
    /// peer withdrew the region, and no queued op names it): unpinned once every copy landed,
    /// then unmapped.
    pub(crate) fn release_withdrawn(&mut self) -> Result<(), TransportError> {
        #[cfg(feature = "cuda")]
        if self.pinned.iter().any(|mapping| std::sync::Arc::strong_count(mapping) == 1) {
            self.settle()?;
            let (peer, pinned) = (&mut self.peer, &mut self.pinned);
            pinned.retain(|mapping| {
                if std::sync::Arc::strong_count(mapping) > 1 {
                    return true;
                }
                if let (Some(peer), Ok(memory)) = (peer.as_mut(), mapping.get()) {
                    let (base, len) = memory.mapping();
                    // SAFETY: every copy has landed (settled above) and the mapping is still
                    // mapped: this is its last holder, and it is dropped only after this.
                    unsafe { peer.forget(base, len) };
                }
                false
            });
        }
        Ok(())
    }
}

/// Copies `len` bytes at `from` of `memory` into the peer's mapped host memory at `to` (shm
/// channel), `target` the peer's region's mapping. Host memory is copied on return; GPU memory
/// may be queued: call [`Staging::settle`] before anyone may rely on the bytes.
pub(crate) fn copy_to_peer(
    memory: &std::sync::Arc<RegionMemory>,
    from: u64,
    target_mapping: &std::sync::Arc<PeerMapping>,
    (to, len): (u64, u64),
    staging: &mut Staging,
) -> Result<(), TransportError> {
    let target = target_mapping.get()?;
    match &**memory {
        RegionMemory::Host(host) => {
            // Queued GPU copies land first: a later write to the same bytes must win.
            if staging.gpu_queued() {
                staging.settle()?;
            }
            host.copy_to(from, target, to, len, Some(&mut staging.run))
        }
        #[cfg(feature = "cuda")]
        RegionMemory::Gpu(buffer, _) => {
            let gpu = buffer.gpu();
            // Streamed host stores land before the copy engine writes: a later write must win.
            staging.fence_host();
            if staging.peer.as_ref().is_none_or(|p| p.gpu().ordinal() != gpu.ordinal()) {
                staging.settle()?;
                staging.peer = Some(crate::gpu::PeerCopier::new(gpu)?);
            }
            let Some(peer) = staging.peer.as_mut() else {
                return Err(crate::gpu::invalid("no copier".into()));
            };
            let destination = (target.range_ptr(to, len)?, usize_of(len)?);
            // SAFETY: the peer mapping stays mapped while the copier knows it (kept in
            // `pinned` until `release_withdrawn` unpins it, or until the link's threads end, the
            // copier first); `memory` is kept in `in_flight` until `settle`, so the source stays
            // allocated while a copy is queued.
            unsafe { peer.copy(buffer, usize_of(from)?, destination, target.mapping()) }?;
            if !staging.pinned.iter().any(|kept| std::sync::Arc::ptr_eq(kept, target_mapping)) {
                staging.pinned.push(target_mapping.clone());
            }
            // One keep-alive per region, not per op: bounded by the region table.
            if peer.is_queued() && !staging.in_flight.iter().any(|m| std::sync::Arc::ptr_eq(m, memory)) {
                staging.in_flight.push(memory.clone());
            }
            Ok(())
        }
    }
}

#[cfg(feature = "cuda")]
impl Staging {
    fn for_buffer(
        &mut self,
        buffer: &crate::gpu::DeviceBuffer,
    ) -> std::io::Result<&mut crate::gpu::SocketStaging> {
        let gpu = buffer.gpu();
        if self.socket.as_ref().is_none_or(|s| s.gpu().ordinal() != gpu.ordinal()) {
            self.socket =
                Some(crate::gpu::SocketStaging::new(gpu).map_err(|e| std::io::Error::other(e.to_string()))?);
        }
        self.socket.as_mut().ok_or_else(|| std::io::Error::other("staging vanished"))
    }
}

#[cfg(feature = "cuda")]
fn usize_of(value: u64) -> Result<usize, TransportError> {
    usize::try_from(value)
        .map_err(|_| TransportError::MessageTooLarge { len: value, max_msg_bytes: usize::MAX as u64 })
}

impl RegionMemory {
    /// Registers `len` bytes of `kind` memory.
    pub(crate) fn allocate(kind: MemoryKind, len: u64, shared: bool) -> Result<RegionMemory, TransportError> {
        match kind {
            MemoryKind::Host if shared => Ok(RegionMemory::Host(Memory::shared(len)?)),
            MemoryKind::Host => Ok(RegionMemory::Host(Memory::host(len)?)),
            #[cfg(feature = "cuda")]
            MemoryKind::CudaDevice { ordinal } => {
                let size = usize_of(len)?;
                let unavailable = |e: TransportError| match e {
                    TransportError::Unavailable { .. } => e,
                    other => TransportError::Registration { len, reason: other.to_string() },
                };
                let gpu = crate::gpu::Gpu::open(ordinal).map_err(unavailable)?;
                Ok(RegionMemory::Gpu(
                    crate::gpu::DeviceBuffer::new(&gpu, size).map_err(unavailable)?,
                    ordinal,
                ))
            }
            other => Err(TransportError::UnsupportedMemory { kind: other }),
        }
    }

    /// The caller's memory, used in place (admitted already: non-empty, bounded, aligned).
    pub(crate) fn from_caller(memory: CallerMemory) -> Result<RegionMemory, Refused> {
        match memory.kind() {
            MemoryKind::Host => Memory::caller(memory).map(RegionMemory::Host).map_err(|memory| Refused {
                error: TransportError::Registration {
                    len: memory.len(),
                    reason: "not usable host memory".into(),
                },
                memory,
            }),
            #[cfg(feature = "cuda")]
            MemoryKind::CudaDevice { ordinal } => {
                let len = memory.len();
                let gpu = match crate::gpu::Gpu::open(ordinal) {
                    Ok(gpu) => gpu,
                    Err(e) => {
                        return Err(Refused {
                            error: TransportError::Registration { len, reason: e.to_string() },
                            memory,
                        })
                    }
                };
                match crate::gpu::DeviceBuffer::caller(&gpu, memory) {
                    Ok(buffer) => Ok(RegionMemory::Gpu(buffer, ordinal)),
                    Err((e, memory)) => Err(Refused {
                        error: TransportError::Registration { len, reason: e.to_string() },
                        memory,
                    }),
                }
            }
            kind => Err(Refused { error: TransportError::UnsupportedMemory { kind }, memory }),
        }
    }

    /// Whether the memory is the caller's.
    pub(crate) fn is_caller(&self) -> bool {
        match self {
            RegionMemory::Host(memory) => memory.is_caller(),
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(buffer, _) => buffer.is_caller(),
        }
    }

    /// Hands the caller's memory back (`Err(self)` for memory the transport allocated).
    pub(crate) fn into_caller(self) -> Result<CallerMemory, RegionMemory> {
        match self {
            RegionMemory::Host(memory) => memory.into_caller().map_err(RegionMemory::Host),
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(buffer, ordinal) => {
                buffer.into_caller().map_err(|b| RegionMemory::Gpu(b, ordinal))
            }
        }
    }

    /// Copies `offset..offset + len` of the bounce in front of this region into it (the one
    /// copy of a write into memory the peer cannot map); returns whether the CPU made it (host
    /// memory) rather than a copy engine (GPU memory, from the page-locked bounce).
    pub(crate) fn copy_from_bounce(
        &self,
        bounce: &Memory,
        offset: u64,
        len: u64,
    ) -> Result<bool, TransportError> {
        match self {
            RegionMemory::Host(memory) => bounce.copy_to(offset, memory, offset, len, None).map(|()| true),
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(buffer, _) => {
                let source = bounce.range_ptr(offset, len)?;
                // SAFETY: `source..+len` lies in the bounce (checked by `range_ptr`), mapped for
                // the call; the peer wrote it before announcing the write.
                unsafe { buffer.upload_raw(usize_of(offset)?, source, usize_of(len)?) }?;
                Ok(false)
            }
        }
    }

    /// The device pointer of a GPU region's first byte.
    pub(crate) fn device_pointer(&self) -> Option<u64> {
        match self {
            RegionMemory::Host(_) => None,
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(buffer, _) => Some(buffer.device_ptr()),
        }
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        match self {
            RegionMemory::Host(memory) => memory.len(),
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(buffer, _) => buffer.len() as u64,
        }
    }

    /// The memory kind.
    pub(crate) fn kind(&self) -> MemoryKind {
        match self {
            RegionMemory::Host(_) => MemoryKind::Host,
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(_, ordinal) => MemoryKind::CudaDevice { ordinal: *ordinal },
        }
    }

    /// The host memory, if this is a host region.
    pub(crate) fn host(&self) -> Option<&Memory> {
        match self {
            RegionMemory::Host(memory) => Some(memory),
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(..) => None,
        }
    }

    pub(crate) fn copy_in(&self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        match self {
            RegionMemory::Host(memory) => memory.copy_in(offset, data),
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(buffer, _) => buffer.upload(usize_of(offset)?, data),
        }
    }

    pub(crate) fn copy_out(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        match self {
            RegionMemory::Host(memory) => memory.copy_out(offset, out),
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(buffer, _) => buffer.download(usize_of(offset)?, out),
        }
    }

    /// Writes `len` bytes at `offset` to a socket or reads them from it (TCP channel); GPU
    /// memory goes through pinned halves, copy engine and socket overlapped.
    pub(crate) fn over_socket(
        &self,
        direction: Direction,
        offset: u64,
        len: u64,
        socket: &TcpStream,
        _staging: &mut Staging,
    ) -> std::io::Result<()> {
        match self {
            RegionMemory::Host(memory) => memory.over_socket(socket, direction, (offset, len)),
            #[cfg(feature = "cuda")]
            RegionMemory::Gpu(buffer, _) => {
                let (offset, len) = io_range(offset, len)?;
                let staging = _staging.for_buffer(buffer)?;
                match direction {
                    Direction::Send => staging.send(buffer, offset, len, &mut &*socket),
                    Direction::Receive => staging.receive(buffer, offset, len, &mut &*socket),
                }
            }
        }
    }
}

/// `offset` and `len` as host sizes, for the GPU staging calls of the socket paths.
#[cfg(feature = "cuda")]
fn io_range(offset: u64, len: u64) -> std::io::Result<(usize, usize)> {
    Ok((usize_of(offset).map_err(std::io::Error::other)?, usize_of(len).map_err(std::io::Error::other)?))
}
