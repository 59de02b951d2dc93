//! Errors of the hint computation and validation.

use thiserror::Error;

/// Why no hint could be produced, or why a hint is invalid.
///
/// There is no "zero" hint anywhere in this crate: a path that has no low-latency route is
/// [`HintError::Unsupported`], which names what to fall back to.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum HintError {
    /// The path has no low-latency route; use `fallback` instead.
    #[error("no low-latency path: {reason}; fall back to {fallback}")]
    Unsupported {
        /// Why the path does not qualify.
        reason: String,
        /// What to use instead (a backend, a NIC, a source placement).
        fallback: String,
    },
    /// A block size of zero bytes.
    #[error("block size is 0 bytes; a hint is always at least one aligned block")]
    ZeroBlock,
    /// An alignment that is zero or not a power of two.
    #[error("alignment {align_bytes} B is not a non-zero power of two")]
    AlignNotPowerOfTwo {
        /// The offending alignment in bytes.
        align_bytes: u64,
    },
    /// The block is not a whole number of alignment units.
    #[error("block {block_bytes} B is not a multiple of the alignment {align_bytes} B")]
    BlockNotMultipleOfAlign {
        /// Block size in bytes.
        block_bytes: u64,
        /// Alignment in bytes.
        align_bytes: u64,
    },
    /// The block exceeds the transport's largest message.
    #[error("block {block_bytes} B exceeds the transport's max message {max_msg_bytes} B")]
    BlockExceedsMaxMsg {
        /// Block size in bytes.
        block_bytes: u64,
        /// `max_msg_sz` in bytes.
        max_msg_bytes: u64,
    },
    /// The block exceeds the memory of the source device.
    #[error("block {block_bytes} B exceeds the device memory {memory_bytes} B")]
    BlockExceedsDeviceMemory {
        /// Block size in bytes.
        block_bytes: u64,
        /// Device memory in bytes.
        memory_bytes: u64,
    },
    /// A profile field is out of its valid range (NaN rate, zero max message…).
    #[error("invalid path profile: {field} = {value} ({why})")]
    InvalidProfile {
        /// Field name.
        field: &'static str,
        /// Value as text.
        value: String,
        /// What a valid value looks like.
        why: &'static str,
    },
    /// A policy field is out of its valid range.
    #[error("invalid hint policy: {field} = {value} ({why})")]
    InvalidPolicy {
        /// Field name.
        field: &'static str,
        /// Value as text.
        value: String,
        /// What a valid value looks like.
        why: &'static str,
    },
}
