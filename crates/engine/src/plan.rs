//! Block plans: fixed-length blocks on a grid anchored at the region start, tail padded to the
//! alignment.

use crate::error::{PlanError, TransferError};
use rdma_hint_core::validate::validate_shape;
use rdma_hint_core::SizeHint;
use serde::Serialize;

/// A validated block size and alignment: `block_bytes` is a non-zero multiple of the
/// power-of-two `align_bytes`.
///
/// ```
/// use rdma_hint_engine::{BlockSpec, PlanError, TransferError};
/// use rdma_hint_core::HintError;
/// assert!(BlockSpec::new(256 * 1024, 4096).is_ok());
/// assert!(matches!(BlockSpec::new(0, 4096), Err(TransferError::Plan(PlanError::Spec(HintError::ZeroBlock)))));
/// let uneven = BlockSpec::new(6000, 4096);
/// assert!(matches!(uneven, Err(TransferError::Plan(PlanError::Spec(HintError::BlockNotMultipleOfAlign { .. })))));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BlockSpec {
    block_bytes: u64,
    align_bytes: u64,
}

impl BlockSpec {
    /// Checks and builds a spec.
    pub fn new(block_bytes: u64, align_bytes: u64) -> Result<BlockSpec, TransferError> {
        validate_shape(block_bytes, align_bytes).map_err(PlanError::from)?;
        Ok(BlockSpec { block_bytes, align_bytes })
    }

    /// The block and alignment of a hint.
    pub fn from_hint(hint: &SizeHint) -> Result<BlockSpec, TransferError> {
        BlockSpec::new(hint.block_bytes, hint.align_bytes)
    }

    /// Latency-first variant: blocks shrunk to `fraction` of this one (rounded down to the
    /// alignment, never below one alignment unit). The seed's advice: when message sizes vary,
    /// leave headroom rather than take the full hint.
    ///
    /// ```
    /// use rdma_hint_engine::BlockSpec;
    /// let hint = BlockSpec::new(256 * 1024, 4096).unwrap();
    /// assert_eq!(hint.shrunk(0.5).block_bytes(), 128 * 1024);
    /// assert_eq!(hint.shrunk(0.0001).block_bytes(), 4096);
    /// assert_eq!(hint.shrunk(1.0), hint);
    /// ```
    pub fn shrunk(&self, fraction: f64) -> BlockSpec {
        let fraction = if fraction.is_finite() { fraction.clamp(0.0, 1.0) } else { 1.0 };
        let target = (self.block_bytes as f64 * fraction) as u64;
        let block_bytes = (target / self.align_bytes * self.align_bytes).max(self.align_bytes);
        BlockSpec { block_bytes, align_bytes: self.align_bytes }
    }

    /// Block size in bytes.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Alignment in bytes.
    pub fn align_bytes(&self) -> u64 {
        self.align_bytes
    }
}

/// One block of a plan, in offsets of the local region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Block {
    /// Start in the region, in bytes (always aligned).
    pub offset: u64,
    /// Bytes of the transfer this block carries.
    pub payload_len: u64,
    /// Bytes put on the wire: the payload, plus alignment padding on the tail.
    pub wire_len: u64,
}

/// The blocks of one transfer of `len` bytes at `offset` in a region of `region_len` bytes.
///
/// Blocks sit on a grid of `block_bytes` anchored at the region start, so repeated transfers
/// into the same region reuse the same boundaries. A transfer that starts mid-cell gets a
/// shorter first block; the last block is padded up to the alignment. The plan is pure
/// arithmetic (`Copy`, no block list).
///
/// ```
/// use rdma_hint_engine::{Block, BlockSpec, ChunkPlan};
/// let spec = BlockSpec::new(64 * 1024, 4096).unwrap();
/// let plan = ChunkPlan::new(1 << 20, 0, 150_000, spec).unwrap();
/// assert_eq!(plan.block_count(), 3);
/// assert_eq!(plan.block(2), Block { offset: 131_072, payload_len: 18_928, wire_len: 20_480 });
/// assert_eq!(plan.blocks().map(|b| b.payload_len).sum::<u64>(), 150_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ChunkPlan {
    offset: u64,
    len: u64,
    region_len: u64,
    spec: BlockSpec,
    first_cell: u64,
    block_count: u64,
    padded_end: u64,
}

impl ChunkPlan {
    /// Plans `len` bytes at `offset` of a region of `region_len` bytes.
    pub fn new(region_len: u64, offset: u64, len: u64, spec: BlockSpec) -> Result<ChunkPlan, TransferError> {
        if len == 0 {
            return Err(TransferError::from(PlanError::ZeroLength));
        }
        let end = offset.checked_add(len).filter(|end| *end <= region_len).ok_or(PlanError::OutOfRegion {
            side: "local",
            offset,
            len,
            region_len,
        })?;
        if !offset.is_multiple_of(spec.align_bytes) {
            return Err(TransferError::from(PlanError::MisalignedOffset {
                side: "local",
                offset,
                align_bytes: spec.align_bytes,
            }));
        }
        let padded_end = end.div_ceil(spec.align_bytes).checked_mul(spec.align_bytes);
        let padded_end = padded_end.filter(|padded| *padded <= region_len).ok_or_else(|| {
            let padded_end = padded_end.unwrap_or(u64::MAX);
            PlanError::PaddingOutsideRegion {
                side: "local",
                padded_end,
                region_len,
                padding: padded_end.saturating_sub(region_len).max(1),
            }
        })?;
        let first_cell = offset / spec.block_bytes;
        let block_count = end.div_ceil(spec.block_bytes) - first_cell;
        Ok(ChunkPlan { offset, len, region_len, spec, first_cell, block_count, padded_end })
    }

    /// Number of blocks.
    pub fn block_count(&self) -> u64 {
        self.block_count
    }

    /// Block `index` (< [`block_count`](Self::block_count)); indexes past the end give the last.
    pub fn block(&self, index: u64) -> Block {
        let index = index.min(self.block_count - 1);
        let block = self.spec.block_bytes;
        let cell = self.first_cell + index;
        let start = if index == 0 { self.offset } else { cell * block };
        if index + 1 < self.block_count {
            // Every block but the last ends on a grid boundary.
            let len = (cell + 1) * block - start;
            Block { offset: start, payload_len: len, wire_len: len }
        } else {
            Block {
                offset: start,
                payload_len: self.offset + self.len - start,
                wire_len: self.padded_end - start,
            }
        }
    }

    /// Every block, in order (a cursor walking the grid: no division per block).
    pub fn blocks(&self) -> Blocks {
        Blocks {
            remaining: self.block_count,
            cursor: self.offset,
            boundary: (self.first_cell + 1) * self.spec.block_bytes,
            block_bytes: self.spec.block_bytes,
            end: self.offset + self.len,
            padded_end: self.padded_end,
        }
    }

    /// Payload bytes carried by blocks `0..blocks` (what is confirmed once they complete).
    pub fn payload_through(&self, blocks: u64) -> u64 {
        if blocks == 0 {
            return 0;
        }
        let last = self.block(blocks - 1);
        last.offset + last.payload_len - self.offset
    }

    /// Transfer start in the region.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Payload bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: a plan has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Region length the plan was checked against.
    pub fn region_len(&self) -> u64 {
        self.region_len
    }

    /// Block size and alignment.
    pub fn spec(&self) -> BlockSpec {
        self.spec
    }

    /// End of the padded tail, in region offsets.
    pub fn padded_end(&self) -> u64 {
        self.padded_end
    }

    /// Bytes put on the wire (payload + tail padding).
    pub fn wire_bytes(&self) -> u64 {
        self.padded_end - self.offset
    }
}

/// Iterator over the blocks of a [`ChunkPlan`], in order. `Copy`, so a pipeline can keep its
/// position between batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocks {
    remaining: u64,
    cursor: u64,
    boundary: u64,
    block_bytes: u64,
    end: u64,
    padded_end: u64,
}

impl Iterator for Blocks {
    type Item = Block;

    #[inline]
    fn next(&mut self) -> Option<Block> {
        match self.remaining {
            0 => None,
            1 => {
                self.remaining = 0;
                let start = self.cursor;
                self.cursor = self.end;
                Some(Block {
                    offset: start,
                    payload_len: self.end - start,
                    wire_len: self.padded_end - start,
                })
            }
            _ => {
                self.remaining -= 1;
                let start = self.cursor;
                let len = self.boundary - start;
                self.cursor = self.boundary;
                self.boundary += self.block_bytes;
                Some(Block { offset: start, payload_len: len, wire_len: len })
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (remaining, Some(remaining))
    }
}

impl ExactSizeIterator for Blocks {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan, or the planning error a `TransferError::Plan` carries.
    fn planned(region_len: u64, offset: u64, len: u64, spec: BlockSpec) -> Result<ChunkPlan, PlanError> {
        ChunkPlan::new(region_len, offset, len, spec).map_err(plan_error)
    }

    fn plan_error(error: TransferError) -> PlanError {
        match error {
            TransferError::Plan(error) => error,
            other => panic!("not a planning error: {other}"),
        }
    }
    use proptest::prelude::*;

    fn spec(block: u64, align: u64) -> BlockSpec {
        BlockSpec::new(block, align).unwrap()
    }

    #[test]
    fn edge_sizes() {
        let s = spec(4096, 512);
        let one = planned(8192, 0, 1, s).unwrap();
        assert_eq!(one.block_count(), 1);
        assert_eq!(one.block(0), Block { offset: 0, payload_len: 1, wire_len: 512 });
        let exact = planned(8192, 0, 4096, s).unwrap();
        assert_eq!(exact.block_count(), 1);
        assert_eq!(exact.block(0).wire_len, 4096);
        let plus_one = planned(8192, 0, 4097, s).unwrap();
        assert_eq!(plus_one.block_count(), 2);
        assert_eq!(plus_one.block(1), Block { offset: 4096, payload_len: 1, wire_len: 512 });
        let minus_one = planned(8192, 0, 4095, s).unwrap();
        assert_eq!(minus_one.block(0), Block { offset: 0, payload_len: 4095, wire_len: 4096 });
    }

    #[test]
    fn mid_cell_start_keeps_the_grid() {
        let plan = planned(1 << 20, 3 * 4096, 3 * 65536, spec(65536, 4096)).unwrap();
        let blocks: Vec<Block> = plan.blocks().collect();
        assert_eq!(blocks[0], Block { offset: 12288, payload_len: 65536 - 12288, wire_len: 65536 - 12288 });
        assert_eq!(blocks[1].offset, 65536);
        assert_eq!(blocks.last().unwrap().offset, 3 * 65536);
        assert_eq!(plan.payload_through(plan.block_count()), 3 * 65536);
    }

    #[test]
    fn typed_errors() {
        let s = spec(4096, 512);
        assert_eq!(planned(8192, 0, 0, s), Err(PlanError::ZeroLength));
        assert!(matches!(planned(8192, 4096, 8192, s), Err(PlanError::OutOfRegion { .. })));
        assert!(matches!(planned(u64::MAX, u64::MAX - 1, 8, s), Err(PlanError::OutOfRegion { .. })));
        assert!(matches!(planned(8192, 100, 1, s), Err(PlanError::MisalignedOffset { .. })));
        assert_eq!(
            planned(1000, 0, 1000, s),
            Err(PlanError::PaddingOutsideRegion {
                side: "local",
                padded_end: 1024,
                region_len: 1000,
                padding: 24
            })
        );
        assert_eq!(
            BlockSpec::new(4096, 0).map_err(plan_error),
            Err(PlanError::Spec(rdma_hint_core::HintError::AlignNotPowerOfTwo { align_bytes: 0 }))
        );
    }

    proptest! {
        #[test]
        fn invariants_hold(
            align_shift in 0u32..16,
            block_units in 1u64..64,
            offset_units in 0u64..200,
            len in 1u64..(1 << 22),
            slack in 0u64..(1 << 16),
        ) {
            let align = 1u64 << align_shift;
            let spec = spec(align * block_units, align);
            let offset = offset_units * align;
            let region = offset + len + slack;
            match planned(region, offset, len, spec) {
                Ok(plan) => {
                    let mut cursor = offset;
                    for (i, block) in plan.blocks().enumerate() {
                        prop_assert_eq!(block.offset, cursor, "contiguous coverage");
                        prop_assert_eq!(block.offset % align, 0, "aligned start");
                        prop_assert!(block.payload_len > 0 && block.payload_len <= spec.block_bytes());
                        prop_assert!(block.wire_len >= block.payload_len);
                        prop_assert!(block.offset + block.wire_len <= region, "padding inside region");
                        let last = i as u64 + 1 == plan.block_count();
                        if last {
                            prop_assert_eq!((block.offset + block.wire_len) % align, 0);
                        } else {
                            prop_assert_eq!(block.wire_len, block.payload_len);
                            prop_assert_eq!((block.offset + block.payload_len) % spec.block_bytes(), 0, "grid boundary");
                        }
                        if i > 0 && !last {
                            prop_assert_eq!(block.payload_len, spec.block_bytes(), "fixed length");
                        }
                        cursor += block.payload_len;
                    }
                    prop_assert_eq!(cursor, offset + len, "exactly len bytes");
                    let indexed: Vec<Block> = (0..plan.block_count()).map(|i| plan.block(i)).collect();
                    prop_assert_eq!(plan.blocks().collect::<Vec<_>>(), indexed, "cursor and index agree");
                    prop_assert_eq!(plan.payload_through(plan.block_count()), len);
                }
                Err(PlanError::PaddingOutsideRegion { .. }) => {
                    prop_assert!((offset + len).div_ceil(align) * align > region);
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}
