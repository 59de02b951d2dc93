//! Arbitrary sysfs file contents through every parser: `None` or a sane value, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_hint_core::PcieLink;
use rdma_hint_discovery::sysfs::{
    parse_max_payload, parse_node_meminfo, parse_numa_node, parse_rate_gbits, PciPath,
};

fuzz_target!(|data: &[u8]| {
    if let Some(mps) = parse_max_payload(data) {
        assert!(mps.is_power_of_two() && (128..=4096).contains(&mps));
    }
    let text = String::from_utf8_lossy(data);
    let middle = (0..=text.len() / 2).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
    let (left, right) = text.split_at(middle);
    if let Some(link) = PcieLink::from_sysfs(left, right) {
        assert!(link.effective_gbps().is_finite() && link.effective_gbps() > 0.0);
    }
    if let Some(rate) = parse_rate_gbits(&text) {
        assert!(rate.is_finite() && rate > 0.0);
    }
    let _ = parse_node_meminfo(&text);
    let _ = parse_numa_node(&text);
    let _ = PciPath::from_components(text.split('/'));
});
