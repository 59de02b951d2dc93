//! Test payloads.

/// `len` pseudo-random bytes from `seed` (xorshift64): cheap, and different for every seed so a
/// misplaced block shows up as a mismatch.
///
/// ```
/// use rdma_hint_integration_tests::random_bytes;
/// assert_eq!(random_bytes(5, 1), random_bytes(5, 1));
/// assert_ne!(random_bytes(64, 1), random_bytes(64, 2));
/// ```
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Index of the first byte where `arrived` differs from `expected` (or where lengths part).
pub fn first_mismatch(arrived: &[u8], expected: &[u8]) -> Option<usize> {
    arrived
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .or_else(|| (arrived.len() != expected.len()).then(|| arrived.len().min(expected.len())))
}
