//! Double-buffered staging between GPU memory and a byte stream (a socket): the copy engine
//! fills (or drains) one pinned half while the socket drains (or fills) the other.

use super::buffers::{DeviceBuffer, Gpu, PinnedBuffer};
use super::driver_error;
use cudarc::driver::{result, sys};
use rdma_hint_core::TransportError;
use std::ffi::c_void;
use std::io::{Read, Write};
use std::sync::Arc;

/// Bytes per staging half.
pub const STAGING_HALF_BYTES: usize = 4 << 20;

/// Two pinned halves, one stream, one event per half.
#[derive(Debug)]
pub struct SocketStaging {
    gpu: Arc<Gpu>,
    stream: sys::CUstream,
    halves: [PinnedBuffer; 2],
    done: [sys::CUevent; 2],
}

// SAFETY: the stream and events are owned handles used by one thread at a time (`&mut self`).
unsafe impl Send for SocketStaging {}

fn io_error(error: TransportError) -> std::io::Error {
    std::io::Error::other(error.to_string())
}

impl SocketStaging {
    /// Staging for `gpu`.
    pub fn new(gpu: &Arc<Gpu>) -> Result<SocketStaging, TransportError> {
        gpu.bind()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(driver_error("cuStreamCreate"))?;
        let event = || {
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(driver_error("cuEventCreate"))
        };
        Ok(SocketStaging {
            gpu: gpu.clone(),
            stream,
            halves: [
                PinnedBuffer::new(gpu, STAGING_HALF_BYTES)?,
                PinnedBuffer::new(gpu, STAGING_HALF_BYTES)?,
            ],
            done: [event()?, event()?],
        })
    }

    /// The GPU this staging serves.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn wait(&self, half: usize) -> Result<(), TransportError> {
        // SAFETY: live event.
        unsafe { result::event::synchronize(self.done[half]) }.map_err(driver_error("cuEventSynchronize"))
    }

    fn device_to_half(
        &self,
        buffer: &DeviceBuffer,
        offset: usize,
        len: usize,
        half: usize,
    ) -> Result<(), TransportError> {
        let source = buffer.address(offset, len)?;
        let target = self.halves[half].address(0, len)?;
        // SAFETY: both ranges were checked against their allocations; the half is not read until
        // its event completes.
        unsafe { sys::cuMemcpyDtoHAsync_v2(target.cast::<c_void>(), source, len, self.stream) }
            .result()
            .map_err(driver_error("cuMemcpyDtoHAsync"))?;
        // SAFETY: live handles.
        unsafe { result::event::record(self.done[half], self.stream) }.map_err(driver_error("cuEventRecord"))
    }

    /// Writes `buffer[offset..offset + len]` to `sink`, copying the next half from the GPU
    /// while the current one goes out.
    pub fn send(
        &mut self,
        buffer: &DeviceBuffer,
        offset: usize,
        len: usize,
        sink: &mut dyn Write,
    ) -> std::io::Result<()> {
        self.gpu.bind().map_err(io_error)?;
        let chunks = len.div_ceil(STAGING_HALF_BYTES);
        let span = |k: usize| {
            (offset + k * STAGING_HALF_BYTES, STAGING_HALF_BYTES.min(len - k * STAGING_HALF_BYTES))
        };
        if chunks > 0 {
            let (at, size) = span(0);
            self.device_to_half(buffer, at, size, 0).map_err(io_error)?;
        }
        for k in 0..chunks {
            let half = k % 2;
            self.wait(half).map_err(io_error)?;
            if k + 1 < chunks {
                let (at, size) = span(k + 1);
                self.device_to_half(buffer, at, size, (k + 1) % 2).map_err(io_error)?;
            }
            let (_, size) = span(k);
            let start = self.halves[half].address(0, size).map_err(io_error)?;
            // SAFETY: the half's copy completed (event waited) and nothing writes it until the
            // next `device_to_half` for this half, which happens after this write returns.
            let bytes = unsafe { std::slice::from_raw_parts(start, size) };
            sink.write_all(bytes)?;
        }
        Ok(())
    }

    /// Reads `len` bytes from `source` into `buffer[offset..]`, copying each half to the GPU
    /// while the next one is read.
    pub fn receive(
        &mut self,
        buffer: &DeviceBuffer,
        offset: usize,
        len: usize,
        source: &mut dyn Read,
    ) -> std::io::Result<()> {
        self.gpu.bind().map_err(io_error)?;
        buffer.address(offset, len).map_err(io_error)?;
        let chunks = len.div_ceil(STAGING_HALF_BYTES);
        for k in 0..chunks {
            let half = k % 2;
            let at = offset + k * STAGING_HALF_BYTES;
            let size = STAGING_HALF_BYTES.min(len - k * STAGING_HALF_BYTES);
            if k >= 2 {
                // The half's previous upload must finish before the socket overwrites it.
                self.wait(half).map_err(io_error)?;
            }
            let start = self.halves[half].address(0, size).map_err(io_error)?;
            // SAFETY: no copy reads this half now (waited above or never used yet).
            let bytes = unsafe { std::slice::from_raw_parts_mut(start, size) };
            source.read_exact(bytes)?;
            let target = buffer.address(at, size).map_err(io_error)?;
            // SAFETY: ranges checked; the half stays untouched until its event completes.
            unsafe { sys::cuMemcpyHtoDAsync_v2(target, start.cast::<c_void>(), size, self.stream) }
                .result()
                .map_err(|e| io_error(driver_error("cuMemcpyHtoDAsync")(e)))?;
            // SAFETY: live handles.
            unsafe { result::event::record(self.done[half], self.stream) }
                .map_err(|e| io_error(driver_error("cuEventRecord")(e)))?;
        }
        // SAFETY: live stream.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| io_error(driver_error("cuStreamSynchronize")(e)))
    }
}

impl Drop for SocketStaging {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: handles created in `new`, destroyed once, after the stream is drained.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            for event in self.done {
                let _ = result::event::destroy(event);
            }
            let _ = result::stream::destroy(self.stream);
        }
    }
}
