//! What every hello decoder target checks first.

/// Decodes a hello from the front of `data`; when it decodes, asserts that it re-encodes to
/// exactly the bytes it consumed, and hands it over for the target's own checks.
pub fn hello<H, E>(
    data: &[u8],
    decode: impl FnOnce(&mut &[u8]) -> Result<H, E>,
    encode: impl FnOnce(&H) -> Vec<u8>,
) -> Option<H> {
    let mut reader = data;
    let hello = decode(&mut reader).ok()?;
    let consumed = data.len() - reader.len();
    assert_eq!(encode(&hello), &data[..consumed], "hello round trip");
    Some(hello)
}
