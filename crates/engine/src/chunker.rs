//! Per-source hints and the transfer entry point.

use crate::error::{PlanError, TransferError};
use crate::pipeline::{Pipeline, TransferReport};
use crate::plan::{BlockSpec, ChunkPlan};
use crate::policy::PostPolicy;
use crate::transfer::Transfer;
use rdma_hint_core::{Capabilities, LocalRegion, MemoryKind, Transport};
use rdma_hint_core::{SizeHint, SourceId};
use std::collections::BTreeMap;
use std::time::Instant;

/// Chunks transfers by the hint of their source device and posts them through a [`Pipeline`].
///
/// Host regions use the hint of the configured host NUMA node (node 0 unless
/// [`set_host_node`](Chunker::set_host_node) says otherwise); CUDA regions the hint of their GPU.
#[derive(Debug)]
pub struct Chunker {
    hints: BTreeMap<SourceId, BlockSpec>,
    host_node: u32,
    latency_first: Option<f64>,
    pipeline: Pipeline,
}

impl Chunker {
    /// A chunker with no hints yet, posting with `policy` fitted to `caps`.
    pub fn new(policy: PostPolicy, caps: &Capabilities) -> Result<Chunker, TransferError> {
        Ok(Chunker {
            hints: BTreeMap::new(),
            host_node: 0,
            latency_first: None,
            pipeline: Pipeline::new(policy, caps)?,
        })
    }

    /// Sets the block spec for one source.
    pub fn set_hint(&mut self, source: SourceId, spec: BlockSpec) {
        self.hints.insert(source, spec);
    }

    /// Sets the block spec of `hint.source` from the hint.
    pub fn set_size_hint(&mut self, hint: &SizeHint) -> Result<(), TransferError> {
        self.hints.insert(hint.source, BlockSpec::from_hint(hint)?);
        Ok(())
    }

    /// Which NUMA node host regions belong to.
    pub fn set_host_node(&mut self, node: u32) {
        self.host_node = node;
    }

    /// Latency-first traffic: shrink every block to `fraction` of its hint (see
    /// [`BlockSpec::shrunk`]); `None` takes the full hint.
    pub fn set_latency_first(&mut self, fraction: Option<f64>) {
        self.latency_first = fraction;
    }

    /// The posting policy in use.
    pub fn policy(&self) -> PostPolicy {
        self.pipeline.policy()
    }

    /// The source a region of `kind` belongs to (`None` for dma-buf regions, whose device the
    /// chunker cannot know: name it with [`Transfer::from_source`]).
    pub fn source_of(&self, kind: MemoryKind) -> Option<SourceId> {
        match kind {
            MemoryKind::Host => Some(SourceId::Host(self.host_node)),
            MemoryKind::CudaDevice { ordinal } => Some(SourceId::Gpu(ordinal)),
            MemoryKind::DmaBuf => None,
        }
    }

    /// The block spec used for `source` (after the latency-first knob).
    pub fn spec_for(&self, source: SourceId) -> Result<BlockSpec, TransferError> {
        let spec = *self.hints.get(&source).ok_or(PlanError::NoHintForSource(source))?;
        Ok(self.latency_first.map_or(spec, |fraction| spec.shrunk(fraction)))
    }

    /// Plans `len` bytes at `offset` of `local` with the hint of `source`.
    pub fn plan_as(
        &self,
        source: SourceId,
        local: &LocalRegion,
        offset: u64,
        len: u64,
    ) -> Result<ChunkPlan, TransferError> {
        ChunkPlan::new(local.len, offset, len, self.spec_for(source)?)
    }

    /// Writes `transfer.len` bytes in blocks of the hint of the transfer's source: the one
    /// [`Transfer::from_source`] names, else the local region's device.
    pub async fn write<T: Transport + ?Sized>(
        &mut self,
        transport: &T,
        transfer: Transfer<'_>,
        deadline: Instant,
    ) -> Result<TransferReport, TransferError> {
        let source = transfer.source.or_else(|| self.source_of(transfer.local.kind)).ok_or_else(|| {
            PlanError::InvalidPolicy(
                "a dma-buf region has no known source device; name it with Transfer::from_source".into(),
            )
        })?;
        let plan = self.plan_as(source, transfer.local, transfer.local_offset, transfer.len)?;
        self.pipeline.run(transport, &plan, &transfer, deadline).await
    }

    /// [`write`](Chunker::write), blocking the calling thread (for callers without an async
    /// runtime; the thread parks while the transport waits).
    pub fn write_blocking<T: Transport + ?Sized>(
        &mut self,
        transport: &T,
        transfer: Transfer<'_>,
        deadline: Instant,
    ) -> Result<TransferReport, TransferError> {
        rdma_hint_backend_core::blocking::block_on(self.write(transport, transfer, deadline))
    }
}
