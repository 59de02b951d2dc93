//! Admitting caller memory: the checks every backend makes before it touches the memory, and
//! the refusal that hands it back. Apart from `caller_memory` because a refusal is a
//! [`TransportError`], which carries the memory it hands back.

use crate::caller_memory::{CallerMemory, ForeignMemory, CALLER_ALIGN_BYTES, DMA_BUF_ALIGN_BYTES};
use crate::transport_error::TransportError;

impl ForeignMemory {
    /// The checks every backend makes before it touches the memory: not empty, at most
    /// `max_bytes`, no address overflow, the first byte aligned ([`CALLER_ALIGN_BYTES`], or
    /// [`DMA_BUF_ALIGN_BYTES`] for a dma-buf offset), a descriptor that can be one.
    ///
    /// ```
    /// use rdma_hint_core::{ForeignMemory, TransportError};
    /// let ok = ForeignMemory::Host { address: 0x10000, len: 4096 };
    /// assert!(ok.validate(1 << 40).is_ok());
    /// let odd = ForeignMemory::Host { address: 0x10001, len: 4096 };
    /// assert!(matches!(odd.validate(1 << 40), Err(TransportError::Misaligned { .. })));
    /// let empty = ForeignMemory::Host { address: 0x10000, len: 0 };
    /// assert!(matches!(empty.validate(1 << 40), Err(TransportError::Registration { len: 0, .. })));
    /// ```
    pub fn validate(&self, max_bytes: u64) -> Result<(), TransportError> {
        let len = self.len();
        let refuse = |reason: String| TransportError::Registration { len, reason };
        if len == 0 {
            return Err(refuse("caller memory of zero bytes: register at least one byte".into()));
        }
        if len > max_bytes {
            return Err(refuse(format!("caller memory larger than the {max_bytes} B a region may hold")));
        }
        let (what, start, align) = match *self {
            ForeignMemory::Host { address, .. } => ("host address", address as u64, CALLER_ALIGN_BYTES),
            ForeignMemory::CudaDevice { device_ptr, .. } => {
                ("device pointer", device_ptr, CALLER_ALIGN_BYTES)
            }
            ForeignMemory::DmaBuf { fd, offset, .. } => {
                if fd < 0 {
                    return Err(refuse(format!("{fd} is not a file descriptor")));
                }
                ("dma-buf offset", offset, DMA_BUF_ALIGN_BYTES)
            }
        };
        if start == 0 && !matches!(self, ForeignMemory::DmaBuf { .. }) {
            return Err(refuse(format!("a null {what}")));
        }
        if start.checked_add(len).is_none() {
            return Err(refuse(format!("{what} {start:#x} + {len} B overflows")));
        }
        if start % align != 0 {
            return Err(TransportError::Misaligned { what, value: start, align_bytes: align });
        }
        Ok(())
    }
}

/// A refused registration inside a backend: why, and the memory, handed back untouched. It
/// reaches the caller as [`TransportError::MemoryRefused`].
#[derive(Debug)]
pub struct Refused {
    /// Why the transport refused.
    pub error: TransportError,
    /// The caller's memory, as it was given.
    pub memory: CallerMemory,
}

impl From<Refused> for TransportError {
    /// [`TransportError::MemoryRefused`]: the reason with the memory (never dropped).
    fn from(Refused { error, memory }: Refused) -> TransportError {
        TransportError::MemoryRefused { error: Box::new(error), memory }
    }
}
