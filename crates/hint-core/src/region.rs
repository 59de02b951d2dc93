//! Registered memory as the contract names it: which kind of memory, the id a region goes by,
//! and what each side knows of a region.

use serde::{Deserialize, Serialize};

/// Which kinds of memory a transport can register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryKind {
    /// Host memory.
    Host,
    /// CUDA device memory of the GPU with this ordinal.
    CudaDevice {
        /// CUDA device ordinal.
        ordinal: u32,
    },
    /// Memory exported as a dma-buf file descriptor (GPU memory through `ibv_reg_dmabuf_mr`).
    DmaBuf,
}

impl MemoryKind {
    /// The memory a source's regions are registered in: host memory for `host:N`, the GPU's
    /// device memory for `gpu:N`.
    ///
    /// ```
    /// use rdma_hint_core::MemoryKind;
    /// use rdma_hint_core::SourceId;
    /// assert_eq!(MemoryKind::of(SourceId::Gpu(1)), MemoryKind::CudaDevice { ordinal: 1 });
    /// ```
    pub fn of(source: crate::profile::SourceId) -> MemoryKind {
        match source {
            crate::profile::SourceId::Host(_) => MemoryKind::Host,
            crate::profile::SourceId::Gpu(ordinal) => MemoryKind::CudaDevice { ordinal },
        }
    }
}

/// Index of a registered region inside one transport instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RegionId(pub u32);

/// A region registered on this side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRegion {
    /// Handle for [`WriteOp::local`](crate::WriteOp::local).
    pub id: RegionId,
    /// Memory kind.
    pub kind: MemoryKind,
    /// Length in bytes.
    pub len: u64,
}

/// A region the peer exposed during [`Transport::connect`](crate::Transport::connect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// Handle for [`WriteOp::remote`](crate::WriteOp::remote).
    pub id: RegionId,
    /// Length in bytes the peer advertised.
    pub len: u64,
}
