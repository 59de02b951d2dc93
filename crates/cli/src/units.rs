//! Byte counts in and out: `4096`, `4K`, `64KiB`, `1M`, `2GiB` (binary multiples throughout).

/// Parses a byte count with an optional binary suffix (K, KiB, M, MiB, G, GiB, T, TiB).
pub(crate) fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let value: u64 =
        digits.parse().map_err(|_| format!("`{text}` is not a byte count (e.g. 4096, 64K, 2GiB)"))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        other => return Err(format!("unknown size suffix `{other}` in `{text}` (use K, M, G, T)")),
    };
    value.checked_mul(1u64 << shift).ok_or_else(|| format!("`{text}` does not fit in 64 bits"))
}

/// Formats bytes in the largest binary unit that keeps it readable (`64 KiB`, `1.5 MiB`).
pub(crate) fn format_bytes(value: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match UNITS.iter().find(|(size, _)| value >= *size) {
        Some((size, unit)) if value % size == 0 => format!("{} {unit}", value / size),
        Some((size, unit)) => format!("{:.1} {unit}", value as f64 / *size as f64),
        None => format!("{value} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes_and_rejects_garbage() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1m"), Ok(1 << 20));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }

    #[test]
    fn formats_in_the_exact_unit() {
        assert_eq!(format_bytes(4096), "4 KiB");
        assert_eq!(format_bytes(2 << 20), "2 MiB");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(5465888 * 1024), "5.2 GiB");
    }
}
