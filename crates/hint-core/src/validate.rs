//! Sanity checks for any hint, ours or a caller's.

use crate::error::HintError;
use crate::model::SizeHint;
use crate::profile::PathProfile;

/// Limits a hint must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HintLimits {
    /// Transport's largest message in bytes.
    pub max_msg_bytes: u64,
    /// Memory of the source device in bytes, if known.
    pub memory_bytes: Option<u64>,
}

impl HintLimits {
    /// The limits a profile implies.
    pub fn from_profile(profile: &PathProfile) -> HintLimits {
        HintLimits {
            max_msg_bytes: profile.transport.max_msg_bytes,
            memory_bytes: profile.source.memory_bytes,
        }
    }
}

/// Checks the shape of a block: non-zero, a power-of-two alignment, a whole number of alignment
/// units. What every block spec (a hint's, a chunker's) must be, whatever the path's limits.
///
/// ```
/// use rdma_hint_core::{validate::validate_shape, HintError};
/// assert!(validate_shape(12288, 4096).is_ok());
/// assert!(matches!(validate_shape(6000, 4096), Err(HintError::BlockNotMultipleOfAlign { .. })));
/// ```
pub fn validate_shape(block_bytes: u64, align_bytes: u64) -> Result<(), HintError> {
    if block_bytes == 0 {
        return Err(HintError::ZeroBlock);
    }
    if !align_bytes.is_power_of_two() {
        return Err(HintError::AlignNotPowerOfTwo { align_bytes });
    }
    if !block_bytes.is_multiple_of(align_bytes) {
        return Err(HintError::BlockNotMultipleOfAlign { block_bytes, align_bytes });
    }
    Ok(())
}

/// Checks a block size and alignment pair: non-zero block, power-of-two alignment, block a
/// multiple of the alignment, block within `max_msg` and device memory.
///
/// ```
/// use rdma_hint_core::{validate::validate_block, HintError, HintLimits};
/// let limits = HintLimits { max_msg_bytes: 1 << 30, memory_bytes: None };
/// assert!(validate_block(256 * 1024, 4096, &limits).is_ok());
/// assert_eq!(validate_block(0, 4096, &limits), Err(HintError::ZeroBlock));
/// assert!(matches!(validate_block(4096, 3000, &limits), Err(HintError::AlignNotPowerOfTwo { .. })));
/// ```
pub fn validate_block(block_bytes: u64, align_bytes: u64, limits: &HintLimits) -> Result<(), HintError> {
    validate_shape(block_bytes, align_bytes)?;
    if block_bytes > limits.max_msg_bytes {
        return Err(HintError::BlockExceedsMaxMsg { block_bytes, max_msg_bytes: limits.max_msg_bytes });
    }
    if let Some(memory_bytes) = limits.memory_bytes {
        if block_bytes > memory_bytes {
            return Err(HintError::BlockExceedsDeviceMemory { block_bytes, memory_bytes });
        }
    }
    Ok(())
}

/// Checks a [`SizeHint`] against `limits` ([`validate_block`] plus a sane efficiency).
pub fn validate_hint(hint: &SizeHint, limits: &HintLimits) -> Result<(), HintError> {
    validate_block(hint.block_bytes, hint.align_bytes, limits)?;
    // 1.0 is reachable: with a negligible fixed cost the ratio rounds to one.
    if !(hint.efficiency > 0.0 && hint.efficiency <= 1.0) {
        return Err(HintError::InvalidProfile {
            field: "efficiency",
            value: hint.efficiency.to_string(),
            why: "a hint's predicted efficiency lies in (0, 1]",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HintLimits = HintLimits { max_msg_bytes: 1 << 20, memory_bytes: Some(1 << 19) };

    #[test]
    fn each_rule_has_its_error() {
        assert_eq!(validate_block(0, 64, &LIMITS), Err(HintError::ZeroBlock));
        assert_eq!(validate_block(4096, 0, &LIMITS), Err(HintError::AlignNotPowerOfTwo { align_bytes: 0 }));
        assert_eq!(validate_block(4096, 96, &LIMITS), Err(HintError::AlignNotPowerOfTwo { align_bytes: 96 }));
        assert_eq!(
            validate_block(4096 + 64, 4096, &LIMITS),
            Err(HintError::BlockNotMultipleOfAlign { block_bytes: 4160, align_bytes: 4096 })
        );
        assert_eq!(
            validate_block(1 << 21, 4096, &LIMITS),
            Err(HintError::BlockExceedsMaxMsg { block_bytes: 1 << 21, max_msg_bytes: 1 << 20 })
        );
        assert_eq!(
            validate_block(1 << 20, 4096, &LIMITS),
            Err(HintError::BlockExceedsDeviceMemory { block_bytes: 1 << 20, memory_bytes: 1 << 19 })
        );
        assert_eq!(validate_block(1 << 19, 4096, &LIMITS), Ok(()));
    }
}
