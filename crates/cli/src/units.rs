//! Byte counts in and out: `4096`, `4K`, `64KiB`, `1M`, `2GiB` (binary multiples throughout).

/// Parses a byte count with an optional binary suffix (K, KiB, M, MiB, G, GiB, T, TiB).
pub(crate) fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let value: u64 =
        digits.parse().map_err(|_| format!("`{text}` is not a byte count (e.g. 4096, 64K, 2GiB)"))?;
    let suffix = suffix.trim();
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        // KB/MB mean 10³/10⁶ to some and 2¹⁰/2²⁰ to others: refused rather than guessed.
        "kb" | "mb" | "gb" | "tb" => {
            let binary = &suffix[..1];
            return Err(format!(
                "`{text}`: {suffix} is ambiguous (decimal or binary?); sizes are binary: write {digits}{binary} or {digits}{binary}iB"
            ));
        }
        _ => return Err(format!("unknown size suffix `{suffix}` in `{text}` (use K, M, G, T)")),
    };
    value.checked_mul(1u64 << shift).ok_or_else(|| format!("`{text}` does not fit in 64 bits"))
}

/// [`parse_bytes`] for sizes that must be at least one byte.
pub(crate) fn parse_nonzero_bytes(text: &str) -> Result<u64, String> {
    match parse_bytes(text)? {
        0 => Err("must be at least 1 byte".into()),
        bytes => Ok(bytes),
    }
}

/// Parses a count (tokens, ranks, iterations): a whole number of at least 1, digits only, so
/// `1K` is refused rather than guessed as 1000 or 1024.
pub(crate) fn parse_count(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{text}` is not a whole number (digits only, e.g. 128; no K/M suffixes)"));
    }
    match text.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(count) => Ok(count),
        Err(_) => Err(format!("`{text}` does not fit in 64 bits")),
    }
}

/// A number of seconds for a timeout: a whole number from 1 to 10⁸ (about three years), so a
/// deadline computed from it cannot overflow.
pub(crate) fn parse_seconds(text: &str) -> Result<u64, String> {
    match parse_count(text)? {
        seconds if seconds > 100_000_000 => {
            Err(format!("`{text}` seconds is more than 10⁸ (about three years)"))
        }
        seconds => Ok(seconds),
    }
}

/// [`parse_count`] for flags whose value is a 32-bit count.
pub(crate) fn parse_count_u32(text: &str) -> Result<u32, String> {
    let count = parse_count(text)?;
    u32::try_from(count).map_err(|_| format!("`{text}` is larger than {}", u32::MAX))
}

/// How long a host name may take to resolve.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `HOST:PORT` as an address: an IP literal as it is, or a host name resolved (its first IPv4
/// address, else its first; `localhost` from `/etc/hosts`) on a thread of its own within 5 s,
/// so a resolver that never answers cannot hold the command.
pub(crate) fn parse_address(text: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    let (host, port) = text.rsplit_once(':').ok_or_else(|| format!("`{text}`: give HOST:PORT or IP:PORT"))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("`{text}`: give HOST:PORT or IP:PORT (a port is 0…65535)"));
    }
    let (answer, answered) = std::sync::mpsc::channel();
    let owned = text.to_string();
    std::thread::Builder::new()
        .name("resolve".into())
        .spawn(move || {
            let found = std::net::ToSocketAddrs::to_socket_addrs(&owned.as_str())
                .map(|found| found.collect::<Vec<_>>());
            let _ = answer.send(found);
        })
        .map_err(|e| format!("`{text}`: cannot resolve it: {e}"))?;
    match answered.recv_timeout(RESOLVE_TIMEOUT) {
        Ok(Ok(found)) => found
            .iter()
            .find(|address| address.is_ipv4())
            .or(found.first())
            .copied()
            .ok_or_else(|| format!("`{text}`: {host} has no address")),
        Ok(Err(error)) => Err(format!("`{text}`: cannot resolve {host}: {error}")),
        Err(_) => Err(format!("`{text}`: {host} did not resolve within {} s", RESOLVE_TIMEOUT.as_secs())),
    }
}

/// `1 block`, `2 blocks`: a count with its noun in the right number.
pub(crate) fn plural(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// Formats bytes in the largest binary unit that keeps it readable (`64 KiB`, `1.5 MiB`).
pub(crate) fn format_bytes(value: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match UNITS.iter().find(|(size, _)| value >= *size) {
        Some((size, unit)) if value.is_multiple_of(*size) => format!("{} {unit}", value / size),
        Some((size, unit)) => format!("{:.1} {unit}", value as f64 / *size as f64),
        None => format!("{value} B"),
    }
}

/// `412 ns`, `3.2 µs`, `18.4 ms`, `2.31 s`: a duration in seconds with its unit.
pub(crate) fn format_seconds(seconds: f64) -> String {
    match seconds {
        s if s < 1e-6 => format!("{:.0} ns", s * 1e9),
        s if s < 1e-3 => format!("{:.1} µs", s * 1e6),
        s if s < 1.0 => format!("{:.1} ms", s * 1e3),
        s => format!("{s:.2} s"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_carry_their_unit() {
        assert_eq!(super::format_seconds(412e-9), "412 ns");
        assert_eq!(super::format_seconds(3.2e-6), "3.2 µs");
        assert_eq!(super::format_seconds(18.4e-3), "18.4 ms");
        assert_eq!(super::format_seconds(2.314), "2.31 s");
    }

    #[test]
    fn suffix_errors_quote_the_input_as_given_and_decimal_units_are_refused() {
        let error = super::parse_bytes("8K,16K").unwrap_err();
        assert!(error.contains("`K,16K`") && error.contains("`8K,16K`"), "{error}");
        for ambiguous in ["1MB", "4kb", "2GB"] {
            let error = super::parse_bytes(ambiguous).unwrap_err();
            assert!(error.contains("ambiguous") && error.contains(ambiguous), "{error}");
        }
        assert_eq!(super::parse_bytes("1MiB"), Ok(1 << 20));
        assert_eq!(super::parse_bytes("1m"), Ok(1 << 20));
    }

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
    fn counts_are_whole_positive_numbers() {
        assert_eq!(parse_count("128"), Ok(128));
        assert!(parse_count("1K").unwrap_err().contains("whole number"));
        assert!(parse_count("0").is_err());
        assert!(parse_count("-3").is_err());
        assert!(parse_count("").is_err());
        assert!(parse_count_u32("5000000000").is_err());
        assert!(parse_nonzero_bytes("0").is_err());
        assert_eq!(parse_nonzero_bytes("1M"), Ok(1 << 20));
        assert_eq!(plural(1, "block"), "1 block");
        assert_eq!(plural(2, "doorbell"), "2 doorbells");
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
