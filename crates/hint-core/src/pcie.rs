//! PCIe link facts and their bandwidth.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Share of the raw PCIe data rate left after TLP/DLLP framing.
///
/// Calibrated on an H200 (Gen5 x16): 63 GB/s raw after 128b/130b encoding, 54–55 GB/s measured
/// D2H/H2D into pinned memory, i.e. ≈ 0.86. NCCL's `width × speed / 80` lands in the same range.
pub const PCIE_PROTOCOL_EFFICIENCY: f64 = 0.86;

/// One PCIe link as sysfs reports it (`current_link_speed`, `current_link_width`).
///
/// ```
/// use rdma_hint_core::PcieLink;
/// let gen5_x16 = PcieLink { speed_gts: 32.0, width: 16 };
/// assert!((gen5_x16.raw_gbps() - 63.0).abs() < 0.1);
/// assert!(gen5_x16.effective_gbps() > 50.0 && gen5_x16.effective_gbps() < 56.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PcieLink {
    /// Transfer rate per lane in GT/s (2.5, 5, 8, 16, 32, 64).
    pub speed_gts: f64,
    /// Number of lanes (1…32).
    pub width: u32,
}

impl PcieLink {
    /// Data rate after line encoding in GB/s (8b/10b up to Gen2, 128b/130b from Gen3).
    pub fn raw_gbps(&self) -> f64 {
        let encoding = if self.speed_gts <= 5.0 { 0.8 } else { 128.0 / 130.0 };
        self.speed_gts * f64::from(self.width) * encoding / 8.0
    }

    /// Payload bandwidth in GB/s after protocol overhead ([`PCIE_PROTOCOL_EFFICIENCY`]).
    pub fn effective_gbps(&self) -> f64 {
        self.raw_gbps() * PCIE_PROTOCOL_EFFICIENCY
    }

    /// PCIe generation implied by the lane rate, for display.
    pub fn generation(&self) -> u32 {
        match self.speed_gts {
            s if s <= 2.5 => 1,
            s if s <= 5.0 => 2,
            s if s <= 8.0 => 3,
            s if s <= 16.0 => 4,
            s if s <= 32.0 => 5,
            _ => 6,
        }
    }

    /// Parses sysfs `current_link_speed` + `current_link_width` contents
    /// (e.g. `"32.0 GT/s PCIe"` and `"16"`). `None` for unknown or zero values
    /// (`"Unknown"`, `"0"`, a link that trained down to nothing).
    pub fn from_sysfs(speed: &str, width: &str) -> Option<PcieLink> {
        let speed_gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
        let width: u32 = width.trim().parse().ok()?;
        let plausible = speed_gts.is_finite() && (0.1..=256.0).contains(&speed_gts);
        (plausible && (1..=64).contains(&width)).then_some(PcieLink { speed_gts, width })
    }
}

impl fmt::Display for PcieLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Gen{} x{} ({} GT/s, {:.1} GB/s effective)",
            self.generation(),
            self.width,
            self.speed_gts,
            self.effective_gbps()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sysfs_strings() {
        let link = PcieLink::from_sysfs("16.0 GT/s PCIe\n", "8\n").unwrap();
        assert_eq!(link, PcieLink { speed_gts: 16.0, width: 8 });
        assert_eq!(link.generation(), 4);
        assert!(PcieLink::from_sysfs("Unknown", "16").is_none());
        assert!(PcieLink::from_sysfs("8.0 GT/s", "0").is_none());
        assert!(PcieLink::from_sysfs("", "").is_none());
        assert!(PcieLink::from_sysfs("NaN GT/s", "4").is_none());
    }

    #[test]
    fn gen2_uses_8b10b() {
        let gen2_x1 = PcieLink { speed_gts: 5.0, width: 1 };
        assert!((gen2_x1.raw_gbps() - 0.5).abs() < 1e-9);
    }
}
