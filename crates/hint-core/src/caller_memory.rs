//! Memory the caller owns, registered in place: a transport reads and writes the caller's own
//! bytes, so no payload is copied into a transport-owned region first.
//!
//! Safe forms take a buffer by value ([`Vec<u8>`], `Box<[u8]>`, `bytes::BytesMut`, or anything a backend wraps, such as a cudarc `CudaSlice<u8>`) and hand it back on
//! [`Transport::release`](crate::Transport::release). Memory the caller keeps owning (a
//! framework's tensor, a pointer from another allocator, a dma-buf) is registered through the
//! `unsafe` constructors, whose contract the caller upholds.
//!
//! ```
//! use rdma_hint_core::{CallerMemory, MemoryKind};
//! let memory = CallerMemory::from(vec![7u8; 4096]);
//! assert_eq!((memory.kind(), memory.len()), (MemoryKind::Host, 4096));
//! let back: Vec<u8> = memory.take().unwrap(); // what the transport hands back on release
//! assert_eq!(back, vec![7u8; 4096]);
//! ```
//!
//! By address (memory that stays the caller's to free):
//!
//! ```
//! use rdma_hint_core::{CallerMemory, ForeignMemory};
//! let mut tensor = vec![0u64; 512]; // stands in for another allocator's buffer
//! // SAFETY: `tensor` outlives the registration and is not touched while ops are in flight.
//! let memory = unsafe { CallerMemory::host(tensor.as_mut_ptr().cast(), 4096) };
//! assert!(!memory.is_owned());
//! assert!(matches!(memory.memory(), ForeignMemory::Host { len: 4096, .. }));
//! assert!(memory.take::<Vec<u8>>().is_err()); // nothing to hand back but the address
//! ```
// The one place outside the backends that says `unsafe`: constructors that only record an
// address (no unsafe operation runs here) and whose contract the caller takes on, the way
// `ibv_reg_mr` wrappers document theirs. Everything else in this crate stays free of it.
#![allow(unsafe_code)]

use crate::region::MemoryKind;
use std::any::Any;
use std::fmt;

/// Alignment, in bytes, of the first byte of caller host and GPU memory (a `u64`'s, as RDMA
/// atomics need and every common allocator gives a buffer of 8 bytes or more).
pub const CALLER_ALIGN_BYTES: u64 = 8;

/// Alignment, in bytes, of a dma-buf offset: the kernel imports whole pages.
pub const DMA_BUF_ALIGN_BYTES: u64 = 4096;

/// Where caller memory lives. Plain data: addresses are integers, and nothing here reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForeignMemory {
    /// `len` bytes of host memory starting at `address`.
    Host {
        /// Address of the first byte.
        address: usize,
        /// Length in bytes.
        len: u64,
    },
    /// `len` bytes of CUDA device memory starting at `device_ptr` on GPU `ordinal`.
    CudaDevice {
        /// CUDA device ordinal.
        ordinal: u32,
        /// `CUdeviceptr` of the first byte.
        device_ptr: u64,
        /// Length in bytes.
        len: u64,
    },
    /// `len` bytes at `offset` into the dma-buf `fd` (exported by a GPU or accelerator driver).
    DmaBuf {
        /// The dma-buf file descriptor (the caller keeps it open).
        fd: i32,
        /// Offset into the dma-buf, in bytes.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
}

impl ForeignMemory {
    /// The memory kind, as [`Capabilities::memory_kinds`](crate::Capabilities) lists it.
    pub fn kind(&self) -> MemoryKind {
        match self {
            ForeignMemory::Host { .. } => MemoryKind::Host,
            ForeignMemory::CudaDevice { ordinal, .. } => MemoryKind::CudaDevice { ordinal: *ordinal },
            ForeignMemory::DmaBuf { .. } => MemoryKind::DmaBuf,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            ForeignMemory::Host { len, .. }
            | ForeignMemory::CudaDevice { len, .. }
            | ForeignMemory::DmaBuf { len, .. } => *len,
        }
    }

    /// Whether the memory is empty (which no transport registers).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What keeps caller memory alive while it is registered, handed back on release.
type Owner = Box<dyn Any + Send + Sync>;

/// Memory the caller owns, ready for
/// [`Transport::register_memory`](crate::Transport::register_memory): where it lives and, for
/// the safe forms, the buffer itself, which the transport holds (and never moves or frees)
/// until [`Transport::release`](crate::Transport::release) hands it back.
pub struct CallerMemory {
    memory: ForeignMemory,
    owner: Option<Owner>,
}

impl CallerMemory {
    /// Where the memory lives.
    pub fn memory(&self) -> ForeignMemory {
        self.memory
    }

    /// The memory kind.
    pub fn kind(&self) -> MemoryKind {
        self.memory.kind()
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.memory.len()
    }

    /// Whether the memory is empty (which no transport registers).
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    /// Whether a buffer came with the memory (the safe forms), rather than only an address.
    pub fn is_owned(&self) -> bool {
        self.owner.is_some()
    }

    /// The buffer back as the type it was given as (`Vec<u8>`, `Box<[u8]>`, or a backend's
    /// type such as `CudaSlice<u8>`); `Err(self)` for another type or memory registered by
    /// address.
    pub fn take<T: Any>(self) -> Result<T, CallerMemory> {
        match self.owner {
            Some(owner) if owner.is::<T>() => match owner.downcast::<T>() {
                Ok(buffer) => Ok(*buffer),
                Err(owner) => Err(CallerMemory { memory: self.memory, owner: Some(owner) }),
            },
            owner => Err(CallerMemory { memory: self.memory, owner }),
        }
    }

    /// Host memory the caller keeps owning: `len` bytes at `address`.
    ///
    /// # Safety
    ///
    /// From registration until [`release`](crate::Transport::release) returns (or the
    /// transport is dropped):
    /// - `address..address + len` stays allocated, mapped and writable, and is not moved or
    ///   freed;
    /// - the caller does not read bytes a peer may be writing into the region, nor write bytes
    ///   a posted op may still be reading (until its completion, or a later signalled op's);
    /// - no Rust reference to those bytes is held across a post or an arrival.
    pub unsafe fn host(address: *mut u8, len: u64) -> CallerMemory {
        CallerMemory { memory: ForeignMemory::Host { address: address as usize, len }, owner: None }
    }

    /// CUDA device memory the caller keeps owning: `len` bytes at `device_ptr` on GPU `ordinal`,
    /// allocated in that GPU's primary context (as cudarc, PyTorch and `cudaMalloc` do).
    ///
    /// # Safety
    ///
    /// As for [`host`](CallerMemory::host): the allocation outlives the registration and is
    /// neither freed nor reused for anything else, and no kernel or copy of the caller's writes
    /// the bytes a posted op is reading or reads those a peer may be writing.
    pub unsafe fn cuda_device(ordinal: u32, device_ptr: u64, len: u64) -> CallerMemory {
        CallerMemory { memory: ForeignMemory::CudaDevice { ordinal, device_ptr, len }, owner: None }
    }

    /// `len` bytes at `offset` into the dma-buf `fd`.
    ///
    /// # Safety
    ///
    /// `fd` stays open, and the exporter keeps the buffer's pages, until the registration is
    /// released; the access rules of [`host`](CallerMemory::host) apply to the bytes.
    pub unsafe fn dma_buf(fd: i32, offset: u64, len: u64) -> CallerMemory {
        CallerMemory { memory: ForeignMemory::DmaBuf { fd, offset, len }, owner: None }
    }

    /// Memory `owner` keeps alive, as a backend wraps a buffer type it knows (a cudarc
    /// `CudaSlice<u8>`); `owner` comes back from [`take`](CallerMemory::take).
    ///
    /// # Safety
    ///
    /// `memory` lies inside an allocation `owner` keeps alive and at a fixed address for as
    /// long as `owner` lives, and nothing else reaches those bytes while it is registered.
    pub unsafe fn owned(memory: ForeignMemory, owner: Box<dyn Any + Send + Sync>) -> CallerMemory {
        CallerMemory { memory, owner: Some(owner) }
    }

    fn host_buffer<T: Any + Send + Sync>(address: *const u8, len: usize, buffer: T) -> CallerMemory {
        // The address is recorded before the buffer moves into its box: moving a Vec, a Box or
        // a BytesMut moves its handle, not its heap bytes.
        let memory = ForeignMemory::Host { address: address as usize, len: len as u64 };
        CallerMemory { memory, owner: Some(Box::new(buffer)) }
    }
}

/// The `Vec`'s initialised bytes (`len`, not capacity), handed back as the same `Vec`.
impl From<Vec<u8>> for CallerMemory {
    fn from(mut buffer: Vec<u8>) -> CallerMemory {
        let (address, len) = (buffer.as_mut_ptr().cast_const(), buffer.len());
        CallerMemory::host_buffer(address, len, buffer)
    }
}

/// A boxed slice, handed back as the same box.
impl From<Box<[u8]>> for CallerMemory {
    fn from(mut buffer: Box<[u8]>) -> CallerMemory {
        let (address, len) = (buffer.as_mut_ptr().cast_const(), buffer.len());
        CallerMemory::host_buffer(address, len, buffer)
    }
}

/// A `BytesMut`'s initialised bytes, handed back as the same `BytesMut`.
impl From<bytes::BytesMut> for CallerMemory {
    fn from(mut buffer: bytes::BytesMut) -> CallerMemory {
        let (address, len) = (buffer.as_mut_ptr().cast_const(), buffer.len());
        CallerMemory::host_buffer(address, len, buffer)
    }
}

impl fmt::Debug for CallerMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallerMemory").field("memory", &self.memory).field("owned", &self.is_owned()).finish()
    }
}

/// CPU copies of payload bytes one path makes, per payload byte: what
/// [`Capabilities::caller_memory`](crate::Capabilities) reports per memory kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallerMemoryPath {
    /// The memory kind the path takes from the caller.
    pub kind: MemoryKind,
    /// Copies rdma-hint makes on the sending side (caller memory to the medium).
    pub send_copies: u8,
    /// Copies rdma-hint makes on the receiving side (the medium into caller memory); `None`
    /// where caller memory of this kind cannot be exposed to the peer on this path.
    pub receive_copies: Option<u8>,
    /// Copies the medium itself makes of each byte (the kernel's socket buffers, a
    /// shared-memory `memcpy` inside UCX, CMA); 0 where a NIC moves the bytes by DMA.
    pub medium_copies: u8,
}

/// Payload bytes a transport's own code has copied with the CPU since it was opened (the
/// medium's copies, such as the kernel's socket buffers, are not counted): the data-plane cost
/// the caller-memory path removes.
///
/// ```
/// use rdma_hint_core::CopiedBytes;
/// let copied = CopiedBytes { write_region: 4096, read_region: 4096, in_transit: 4096 };
/// assert_eq!(copied.total(), 3 * 4096);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopiedBytes {
    /// Into regions by `write_region` (host copies, or host-to-device for GPU regions).
    pub write_region: u64,
    /// Out of regions by `read_region`.
    pub read_region: u64,
    /// While moving writes: the staged shm channel's copy into the peer's mapping, and the copy
    /// out of the channel into receiving caller memory.
    pub in_transit: u64,
}

impl CopiedBytes {
    /// All counted bytes.
    pub fn total(&self) -> u64 {
        self.write_region + self.read_region + self.in_transit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_as_what_they_were_and_only_that() {
        let memory = CallerMemory::from(vec![1u8, 2, 3, 4, 5, 6, 7, 8].into_boxed_slice());
        let memory = memory.take::<Vec<u8>>().unwrap_err();
        let back: Box<[u8]> = memory.take().unwrap();
        assert_eq!(&*back, &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn the_recorded_address_is_the_buffer_s() {
        let buffer = vec![0u8; 1 << 16];
        let address = buffer.as_ptr() as usize;
        let memory = CallerMemory::from(buffer);
        assert_eq!(memory.memory(), ForeignMemory::Host { address, len: 1 << 16 });
        let back: Vec<u8> = memory.take().unwrap();
        assert_eq!(back.as_ptr() as usize, address, "handed back without a copy");
    }

    #[test]
    fn bad_memory_is_refused_by_kind() {
        let max = 1 << 40;
        let cases = [
            ForeignMemory::Host { address: 0, len: 8 },
            ForeignMemory::Host { address: usize::MAX - 7, len: 16 },
            ForeignMemory::Host { address: 4096, len: max + 1 },
            ForeignMemory::CudaDevice { ordinal: 0, device_ptr: 0x1004, len: 8 },
            ForeignMemory::DmaBuf { fd: -1, offset: 0, len: 4096 },
            ForeignMemory::DmaBuf { fd: 3, offset: 512, len: 4096 },
        ];
        for bad in cases {
            assert!(bad.validate(max).is_err(), "{bad:?}");
        }
        assert!(ForeignMemory::DmaBuf { fd: 3, offset: 0, len: 4096 }.validate(max).is_ok());
    }
}
