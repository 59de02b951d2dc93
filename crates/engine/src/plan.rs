//! Block plans: how the engine cuts a range, in blocks of the hint from its start, the last
//! one shorter.

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
    /// Start in the region, in bytes.
    pub offset: u64,
    /// Bytes it carries: the block size, or what is left for the last one.
    pub len: u64,
}

/// The blocks the engine cuts a transfer of `len` bytes at `offset` of a region of
/// `region_len` bytes into: `block_bytes` each from `offset`, the last one what is left. No
/// byte outside the range is ever sent. Pure arithmetic (`Copy`, no block list).
///
/// ```
/// use rdma_hint_engine::{Block, BlockSpec, ChunkPlan};
/// let spec = BlockSpec::new(64 * 1024, 4096).unwrap();
/// let plan = ChunkPlan::new(1 << 20, 0, 150_000, spec).unwrap();
/// assert_eq!(plan.block_count(), 3);
/// assert_eq!(plan.block(2), Block { offset: 131_072, len: 18_928 });
/// assert_eq!(plan.blocks().map(|b| b.len).sum::<u64>(), 150_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ChunkPlan {
    offset: u64,
    len: u64,
    region_len: u64,
    spec: BlockSpec,
    block_count: u64,
}

impl ChunkPlan {
    /// Plans `len` bytes at `offset` of a region of `region_len` bytes.
    pub fn new(region_len: u64, offset: u64, len: u64, spec: BlockSpec) -> Result<ChunkPlan, TransferError> {
        if len == 0 {
            return Err(TransferError::from(PlanError::ZeroLength));
        }
        if offset.checked_add(len).is_none_or(|end| end > region_len) {
            return Err(PlanError::OutOfRegion { side: "local", offset, len, region_len }.into());
        }
        let block_count = len.div_ceil(spec.block_bytes);
        Ok(ChunkPlan { offset, len, region_len, spec, block_count })
    }

    /// Number of blocks.
    pub fn block_count(&self) -> u64 {
        self.block_count
    }

    /// Block `index` (< [`block_count`](Self::block_count)); indexes past the end give the last.
    pub fn block(&self, index: u64) -> Block {
        let index = index.min(self.block_count - 1);
        let start = index * self.spec.block_bytes;
        Block { offset: self.offset + start, len: (self.len - start).min(self.spec.block_bytes) }
    }

    /// Every block, in order.
    pub fn blocks(&self) -> Blocks {
        Blocks { cursor: self.offset, end: self.offset + self.len, block_bytes: self.spec.block_bytes }
    }

    /// Bytes carried by blocks `0..blocks` (what is confirmed once they complete).
    pub fn payload_through(&self, blocks: u64) -> u64 {
        blocks.saturating_mul(self.spec.block_bytes).min(self.len)
    }

    /// Transfer start in the region.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes moved.
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
}

/// Iterator over the blocks of a [`ChunkPlan`], in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocks {
    cursor: u64,
    end: u64,
    block_bytes: u64,
}

impl Iterator for Blocks {
    type Item = Block;

    fn next(&mut self) -> Option<Block> {
        let len = (self.end - self.cursor).min(self.block_bytes);
        if len == 0 {
            return None;
        }
        let block = Block { offset: self.cursor, len };
        self.cursor += len;
        Some(block)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining =
            usize::try_from((self.end - self.cursor).div_ceil(self.block_bytes)).unwrap_or(usize::MAX);
        (remaining, Some(remaining))
    }
}

impl ExactSizeIterator for Blocks {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    fn spec(block: u64, align: u64) -> BlockSpec {
        BlockSpec::new(block, align).unwrap()
    }

    #[test]
    fn edge_sizes() {
        let s = spec(4096, 512);
        let one = planned(8192, 0, 1, s).unwrap();
        assert_eq!(one.block_count(), 1);
        assert_eq!(one.block(0), Block { offset: 0, len: 1 });
        let exact = planned(8192, 0, 4096, s).unwrap();
        assert_eq!(exact.block_count(), 1);
        assert_eq!(exact.block(0).len, 4096);
        let plus_one = planned(8192, 0, 4097, s).unwrap();
        assert_eq!(plus_one.block_count(), 2);
        assert_eq!(plus_one.block(1), Block { offset: 4096, len: 1 });
        let minus_one = planned(8192, 0, 4095, s).unwrap();
        assert_eq!(minus_one.block(0), Block { offset: 0, len: 4095 });
        // The whole region, its length no multiple of the alignment: nothing past it is sent.
        let whole = planned(1000, 0, 1000, s).unwrap();
        assert_eq!(whole.block(0), Block { offset: 0, len: 1000 });
    }

    #[test]
    fn blocks_start_at_the_offset() {
        let plan = planned(1 << 20, 3 * 4096, 3 * 65536, spec(65536, 4096)).unwrap();
        let blocks: Vec<Block> = plan.blocks().collect();
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[0], Block { offset: 12288, len: 65536 });
        assert_eq!(blocks[2], Block { offset: 12288 + 2 * 65536, len: 65536 });
        assert_eq!(plan.payload_through(2), 2 * 65536);
        assert_eq!(plan.payload_through(plan.block_count()), 3 * 65536);
    }

    #[test]
    fn typed_errors() {
        let s = spec(4096, 512);
        assert_eq!(planned(8192, 0, 0, s), Err(PlanError::ZeroLength));
        assert!(matches!(planned(8192, 4096, 8192, s), Err(PlanError::OutOfRegion { .. })));
        assert!(matches!(planned(u64::MAX, u64::MAX - 1, 8, s), Err(PlanError::OutOfRegion { .. })));
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
            offset in 0u64..(1 << 20),
            len in 1u64..(1 << 22),
            slack in 0u64..(1 << 16),
        ) {
            let align = 1u64 << align_shift;
            let spec = spec(align * block_units, align);
            let region = offset + len + slack;
            let plan = planned(region, offset, len, spec).unwrap();
            let mut cursor = offset;
            for (i, block) in plan.blocks().enumerate() {
                prop_assert_eq!(block.offset, cursor, "contiguous coverage");
                prop_assert!(block.len > 0 && block.len <= spec.block_bytes());
                if i as u64 + 1 < plan.block_count() {
                    prop_assert_eq!(block.len, spec.block_bytes(), "fixed length");
                }
                cursor += block.len;
            }
            prop_assert_eq!(cursor, offset + len, "exactly len bytes, none past them");
            prop_assert_eq!(plan.blocks().len() as u64, plan.block_count());
            let indexed: Vec<Block> = (0..plan.block_count()).map(|i| plan.block(i)).collect();
            prop_assert_eq!(plan.blocks().collect::<Vec<_>>(), indexed, "cursor and index agree");
            prop_assert_eq!(plan.payload_through(plan.block_count()), len);
            let short = planned(offset + len - 1, offset, len, spec);
            prop_assert!(matches!(short, Err(PlanError::OutOfRegion { .. })), "{:?}", short);
        }
    }
}
