//! Ring words out of fuzz input: words of up to eight bytes, and the numbers slots get.

/// The word `bytes` make (at most their first eight count).
pub fn word(bytes: &[u8]) -> u64 {
    let mut padded = [0u8; 8];
    padded[..bytes.len().min(8)].copy_from_slice(&bytes[..bytes.len().min(8)]);
    u64::from_le_bytes(padded)
}

/// The sequence number a ring slot gets from the input's word `chosen` where the slot's
/// announcement would be the `published`-th: mostly as published (the slots taken are the
/// interesting ones), else a near miss, none yet, or the input's own.
pub fn sequence(chosen: u64, published: u64) -> u64 {
    match chosen % 8 {
        0 => published - 1,
        1 => published + 1,
        2 => 0,
        3 => chosen,
        _ => published,
    }
}
