//! GPU → pinned ring → GPU staging on two copy-engine streams, several groups of blocks in
//! flight, submitted with `cuMemcpyBatchAsync` (one call per group, the copy-engine analogue of
//! many work requests per doorbell) where the driver has it.

use super::buffers::{DeviceBuffer, Gpu, PinnedBuffer};
use super::{driver_error, invalid};
use cudarc::driver::{result, sys};
use rdma_hint_core::TransportError;
use std::ffi::c_void;
use std::sync::Arc;

/// Which copies a [`StagingPipeline::run`] performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyDirection {
    /// Device → pinned ring only (the sender half).
    GpuToHost,
    /// Pinned ring → device only (the receiver half).
    HostToGpu,
    /// Device → pinned ring → device: both halves overlapped on two streams (PCIe is full
    /// duplex).
    GpuToGpu,
}

/// A pinned ring of `groups × group_blocks` slots of `block_bytes`, two streams and one event
/// pair per group. Buffers and pointer arrays are sized once; a run allocates nothing.
#[derive(Debug)]
pub struct StagingPipeline {
    gpu: Arc<Gpu>,
    d2h: sys::CUstream,
    h2d: sys::CUstream,
    ring: PinnedBuffer,
    block_bytes: usize,
    group_blocks: usize,
    d2h_done: Vec<sys::CUevent>,
    h2d_done: Vec<sys::CUevent>,
    batch: bool,
    dsts: Vec<sys::CUdeviceptr>,
    srcs: Vec<sys::CUdeviceptr>,
    sizes: Vec<usize>,
}

/// `cuMemcpyBatchAsync` is CUDA 12.8+; a driver without the symbol makes cudarc panic on load,
/// so the first call is made under `catch_unwind` and a failure falls back to one call per copy.
fn batch_supported() -> bool {
    if std::env::var_os("RDMA_HINT_NO_BATCH_COPY").is_some() {
        return false;
    }
    std::panic::catch_unwind(|| {
        // SAFETY: a zero-count batch touches no memory; it only resolves the symbol and asks the
        // driver to validate arguments.
        unsafe {
            sys::cuMemcpyBatchAsync(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    })
    .is_ok()
}

impl StagingPipeline {
    /// A pipeline with `groups` groups of `group_blocks` blocks of `block_bytes` in flight.
    pub fn new(
        gpu: &Arc<Gpu>,
        block_bytes: usize,
        group_blocks: usize,
        groups: usize,
    ) -> Result<StagingPipeline, TransportError> {
        if block_bytes == 0 || group_blocks == 0 || groups == 0 {
            return Err(invalid("block, group and ring sizes must be at least 1".into()));
        }
        let ring_bytes = block_bytes
            .checked_mul(group_blocks)
            .and_then(|b| b.checked_mul(groups))
            .ok_or_else(|| invalid("ring size overflows".into()))?;
        gpu.bind()?;
        let ring = PinnedBuffer::new(gpu, ring_bytes)?;
        let stream = || {
            result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(driver_error("cuStreamCreate"))
        };
        let event = || {
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(driver_error("cuEventCreate"))
        };
        let (d2h, h2d) = (stream()?, stream()?);
        let d2h_done = (0..groups).map(|_| event()).collect::<Result<Vec<_>, _>>()?;
        let h2d_done = (0..groups).map(|_| event()).collect::<Result<Vec<_>, _>>()?;
        Ok(StagingPipeline {
            gpu: gpu.clone(),
            d2h,
            h2d,
            ring,
            block_bytes,
            group_blocks,
            d2h_done,
            h2d_done,
            batch: batch_supported(),
            dsts: vec![0; group_blocks],
            srcs: vec![0; group_blocks],
            sizes: vec![0; group_blocks],
        })
    }

    /// Whether groups go out as one `cuMemcpyBatchAsync` call.
    pub fn uses_batch_api(&self) -> bool {
        self.batch
    }

    /// Block size in bytes.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    fn location(&self, device: bool) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: if device {
                sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
            } else {
                sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST
            },
            id: if device { self.gpu.ordinal() as i32 } else { 0 },
        }
    }

    /// Submits the `count` copies in `dsts`/`srcs`/`sizes` on `stream`.
    /// Makes `stream` (one of this pipeline's) wait for `event` (one of its events) before the
    /// work queued on it next.
    fn stream_waits(&self, stream: sys::CUstream, event: sys::CUevent) -> Result<(), TransportError> {
        // SAFETY: the pipeline's streams and events live as long as `self`; only those are passed.
        unsafe { result::stream::wait_event(stream, event, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(driver_error("cuStreamWaitEvent"))
    }

    /// Records `event` (one of this pipeline's) on `stream` (one of its streams).
    fn record(&self, event: sys::CUevent, stream: sys::CUstream) -> Result<(), TransportError> {
        // SAFETY: as in `stream_waits`: live handles owned by `self`.
        unsafe { result::event::record(event, stream) }.map_err(driver_error("cuEventRecord"))
    }

    fn submit(&mut self, count: usize, to_device: bool, stream: sys::CUstream) -> Result<(), TransportError> {
        if self.batch {
            let mut attributes = sys::CUmemcpyAttributes {
                srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
                srcLocHint: self.location(!to_device),
                dstLocHint: self.location(to_device),
                flags: 0,
            };
            let mut attribute_index = 0usize;
            let mut failed_at = 0usize;
            // SAFETY: the three arrays hold `count` valid entries (count ≤ their length); every
            // address is inside a live device buffer or the pinned ring (checked when filled);
            // the attribute array has one entry applying from index 0.
            return unsafe {
                sys::cuMemcpyBatchAsync(
                    self.dsts.as_mut_ptr(),
                    self.srcs.as_mut_ptr(),
                    self.sizes.as_mut_ptr(),
                    count,
                    &mut attributes,
                    &mut attribute_index,
                    1,
                    &mut failed_at,
                    stream,
                )
            }
            .result()
            .map_err(driver_error("cuMemcpyBatchAsync"));
        }
        for i in 0..count {
            // SAFETY: as above, addresses were checked when the arrays were filled.
            let status = unsafe {
                if to_device {
                    sys::cuMemcpyHtoDAsync_v2(
                        self.dsts[i],
                        self.srcs[i] as *const c_void,
                        self.sizes[i],
                        stream,
                    )
                } else {
                    sys::cuMemcpyDtoHAsync_v2(
                        self.dsts[i] as *mut c_void,
                        self.srcs[i],
                        self.sizes[i],
                        stream,
                    )
                }
            };
            status.result().map_err(driver_error("cuMemcpyAsync"))?;
        }
        Ok(())
    }

    /// Moves `len` bytes in blocks (device → ring, ring → device, or both overlapped) and waits
    /// for the copies to finish.
    pub fn run(
        &mut self,
        direction: CopyDirection,
        source: Option<&DeviceBuffer>,
        target: Option<&DeviceBuffer>,
        len: usize,
    ) -> Result<(), TransportError> {
        let needs_source = direction != CopyDirection::HostToGpu;
        let needs_target = direction != CopyDirection::GpuToHost;
        if len == 0 || (needs_source && source.is_none()) || (needs_target && target.is_none()) {
            return Err(invalid(format!("{direction:?} of {len} B needs its buffers")));
        }
        // Check whole ranges before anything is enqueued, so a bad request moves nothing.
        for buffer in [source.filter(|_| needs_source), target.filter(|_| needs_target)].into_iter().flatten()
        {
            buffer.address(0, len)?;
        }
        self.gpu.bind()?;
        let groups = self.d2h_done.len();
        let blocks = len.div_ceil(self.block_bytes);
        let group_count = blocks.div_ceil(self.group_blocks);
        for group in 0..group_count {
            let ring_group = group % groups;
            let first = group * self.group_blocks;
            let count = self.group_blocks.min(blocks - first);
            if needs_source {
                if direction == CopyDirection::GpuToGpu && group >= groups {
                    // Reuse a ring group only once its previous contents reached the device.
                    self.stream_waits(self.d2h, self.h2d_done[ring_group])?;
                }
                self.fill(group, count, len, ring_group, false, source)?;
                self.submit(count, false, self.d2h)?;
                self.record(self.d2h_done[ring_group], self.d2h)?;
            }
            if needs_target {
                if direction == CopyDirection::GpuToGpu {
                    self.stream_waits(self.h2d, self.d2h_done[ring_group])?;
                }
                self.fill(group, count, len, ring_group, true, target)?;
                self.submit(count, true, self.h2d)?;
                self.record(self.h2d_done[ring_group], self.h2d)?;
            }
        }
        for stream in [self.d2h, self.h2d] {
            // SAFETY: live stream.
            unsafe { result::stream::synchronize(stream) }.map_err(driver_error("cuStreamSynchronize"))?;
        }
        Ok(())
    }

    /// Fills the pointer arrays for `count` blocks of `group`: device side from `buffer`, host
    /// side from ring group `ring_group`.
    #[allow(clippy::too_many_arguments)]
    fn fill(
        &mut self,
        group: usize,
        count: usize,
        len: usize,
        ring_group: usize,
        to_device: bool,
        buffer: Option<&DeviceBuffer>,
    ) -> Result<(), TransportError> {
        let buffer = buffer.ok_or_else(|| invalid("missing device buffer".into()))?;
        for i in 0..count {
            let offset = (group * self.group_blocks + i) * self.block_bytes;
            let size = self.block_bytes.min(len - offset);
            let device = buffer.address(offset, size)?;
            let slot =
                self.ring.address((ring_group * self.group_blocks + i) * self.block_bytes, size)? as u64;
            (self.dsts[i], self.srcs[i]) = if to_device { (device, slot) } else { (slot, device) };
            self.sizes[i] = size;
        }
        Ok(())
    }
}

impl Drop for StagingPipeline {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: every handle was created in `new` and is destroyed once here, after the
        // streams are idle (`run` synchronises before returning).
        unsafe {
            for event in self.d2h_done.iter().chain(&self.h2d_done) {
                let _ = result::event::destroy(*event);
            }
            let _ = result::stream::destroy(self.d2h);
            let _ = result::stream::destroy(self.h2d);
        }
    }
}
