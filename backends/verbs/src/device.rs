//! Devices and their capabilities: `ibv_query_device` / `ibv_query_port` as hint-model facts.

use crate::context::Context;
use crate::device_list::{DeviceList, ListedDevice};
use crate::status::unavailable;
use rdma_hint_core::TransportError;
use rdma_hint_core::{TransportFacts, TransportId, TransportKind};
use rdma_mummy_sys as ibv;
use std::ffi::CStr;

/// Fixed cost per posted work request on a hardware NIC in µs (doorbell + WQE fetch + CQE share).
const NIC_PER_OP_US: f64 = 0.35;
/// The same for Soft-RoCE, where the kernel does the NIC's work per packet.
const SOFT_ROCE_PER_OP_US: f64 = 5.0;

/// What the backend knows about one RDMA device's active port.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceFacts {
    /// Device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// The port used (the first active one).
    pub port: u8,
    /// Facts for the hint model, `queried_from_backend: true`.
    pub facts: TransportFacts,
    /// Firmware version as the device reports it.
    pub firmware: String,
    /// Work requests a QP may hold (`max_qp_wr`).
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request (`max_sge`).
    pub max_sge: u32,
    /// RDMA READs one QP keeps in flight, and serves for its peer at once: the device's
    /// `max_qp_rd_atom` and `max_qp_init_rd_atom`, at most 16 (what common NICs offer, so two
    /// sides on different devices agree without a negotiation), at least 1.
    pub max_reads_in_flight: u32,
    /// One line with every capability and its unit, for the probe.
    pub summary: String,
}

/// Opens `name`, or the first device when `None`.
pub(crate) fn open(name: Option<&str>) -> Result<Context, TransportError> {
    let list = DeviceList::get()?;
    Context::open(&list.find(name)?)
}

/// The device and port attributes of `context`'s first active port.
fn query(context: &Context) -> Result<(ibv::ibv_device_attr, u8, ibv::ibv_port_attr), TransportError> {
    // SAFETY: plain C structs, zero is a valid bit pattern; filled by the queries below.
    let mut device: ibv::ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the context is open; `device` is a valid out-pointer.
    if unsafe { ibv::ibv_query_device(context.raw(), &mut device) } != 0 {
        return Err(unavailable("ibv_query_device"));
    }
    for port in 1..=device.phys_port_cnt {
        // SAFETY: as above.
        let mut attr: ibv::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `port` is within phys_port_cnt; `attr` is a valid out-pointer.
        if unsafe { ibv::ibv_query_port(context.raw(), port, &mut attr) } != 0 {
            return Err(unavailable("ibv_query_port"));
        }
        if attr.state == ibv::ibv_port_state::IBV_PORT_ACTIVE {
            return Ok((device, port, attr));
        }
    }
    Err(TransportError::Unavailable {
        backend: crate::BACKEND,
        reason: format!("{}: no active port", context.name),
    })
}

/// Bytes of an `ibv_mtu` value (IBV_MTU_256 = 1 … IBV_MTU_4096 = 5).
pub(crate) fn mtu_bytes(mtu: u32) -> Option<u64> {
    (1..=5).contains(&mtu).then(|| 128u64 << mtu)
}

/// Link rate in Gb/s from `active_width` and `active_speed` codes (as `ibv_devinfo` decodes
/// them), `None` for codes it does not know.
pub(crate) fn link_gbits(width: u8, speed: u8) -> Option<f64> {
    let lanes = match width {
        1 => 1.0,
        2 => 4.0,
        4 => 8.0,
        8 => 12.0,
        16 => 2.0,
        _ => return None,
    };
    let per_lane = match speed {
        1 => 2.5,
        2 => 5.0,
        4 => 10.0,
        8 => 10.3125,
        16 => 14.0625,
        32 => 25.78125,
        64 => 53.125,
        128 => 106.25,
        _ => return None,
    };
    Some(lanes * per_lane)
}

/// Facts of `context`'s active port, and that port's attributes as queried.
pub(crate) fn facts(context: &Context) -> Result<(DeviceFacts, ibv::ibv_port_attr), TransportError> {
    let (device, port, attr) = query(context)?;
    let soft_roce = context.name.starts_with("rxe") || device.vendor_id == 0xffffff;
    let gbits = link_gbits(attr.active_width, attr.active_speed).unwrap_or(10.0);
    let mtu = mtu_bytes(attr.active_mtu);
    // SAFETY: fw_ver is a NUL-terminated C string inside the struct.
    let firmware = unsafe { CStr::from_ptr(device.fw_ver.as_ptr()) }.to_string_lossy().into_owned();
    let facts = TransportFacts {
        id: TransportId::verbs(&context.name)
            .map_err(|e| TransportError::InvalidArgument { what: "device name", why: e.to_string() })?,
        kind: TransportKind::Verbs,
        wire_gbps: gbits / 8.0,
        nic_pcie: None,
        per_op_overhead_us: if soft_roce { SOFT_ROCE_PER_OP_US } else { NIC_PER_OP_US },
        mtu_bytes: mtu,
        max_msg_bytes: u64::from(attr.max_msg_sz),
        max_payload_bytes: None,
        queried_from_backend: true,
        rate_note: None,
    };
    let summary = format!(
        "port {port}: active MTU {} B, max_msg_sz {} B, max_qp_wr {}, max_sge {}, max_mr_size {} B, link {}x{} = {gbits:.1} Gb/s{}",
        mtu.unwrap_or(0),
        attr.max_msg_sz,
        device.max_qp_wr,
        device.max_sge,
        device.max_mr_size,
        attr.active_width,
        attr.active_speed,
        if soft_roce { " (Soft-RoCE: per-op cost of the kernel's rxe)" } else { "" }
    );
    let described = DeviceFacts {
        name: context.name.clone(),
        port,
        facts,
        firmware,
        max_qp_wr: device.max_qp_wr.max(1) as u32,
        max_sge: device.max_sge.max(1) as u32,
        max_reads_in_flight: device.max_qp_rd_atom.min(device.max_qp_init_rd_atom).clamp(1, 16) as u32,
        summary,
    };
    Ok((described, attr))
}

/// Picks the GID to address `port` by: `RDMA_HINT_GID_INDEX` if set, else the first
/// IPv4-mapped RoCE v2 entry (what rdma_cm and perftest's `-x` usually pick), else the first
/// IPv4-mapped one, else the first non-zero one.
pub(crate) fn choose_gid(
    context: &Context,
    port: u8,
    table_len: i32,
) -> Result<(i32, [u8; 16]), TransportError> {
    let query = |index: i32| context.query_gid(port, index);
    if let Some(index) = std::env::var("RDMA_HINT_GID_INDEX").ok().and_then(|v| v.parse::<i32>().ok()) {
        let gid = query(index).ok_or_else(|| unavailable("ibv_query_gid (RDMA_HINT_GID_INDEX)"))?;
        return Ok((index, gid));
    }
    let roce_v2 = |index: i32| {
        std::fs::read_to_string(format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
            context.name
        ))
        .is_ok_and(|kind| kind.trim().eq_ignore_ascii_case("RoCE v2"))
    };
    let ipv4_mapped =
        |gid: &[u8; 16]| gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    let table: Vec<(i32, [u8; 16])> = (0..table_len.clamp(0, 256))
        .filter_map(|i| query(i).map(|g| (i, g)))
        .filter(|(_, g)| g.iter().any(|b| *b != 0))
        .collect();
    table
        .iter()
        .find(|(i, g)| ipv4_mapped(g) && roce_v2(*i))
        .or_else(|| table.iter().find(|(_, g)| ipv4_mapped(g)))
        .or_else(|| table.first())
        .copied()
        .ok_or_else(|| TransportError::Unavailable {
            backend: crate::BACKEND,
            reason: format!(
                "{}: port {port} has no usable GID (is an IP address configured on its netdev?)",
                context.name
            ),
        })
}

/// Every RDMA device with an active port, or why there is none (no libibverbs, no device).
///
/// ```
/// // On a machine without rdma-core this is an error that says so, not a crash.
/// match rdma_hint_verbs::devices() {
///     Ok(devices) => println!("{} device(s)", devices.len()),
///     Err(why) => println!("no verbs devices: {why}"),
/// }
/// ```
pub fn devices() -> Result<Vec<DeviceFacts>, TransportError> {
    let list = DeviceList::get()?;
    if list.count == 0 {
        return Err(TransportError::Unavailable {
            backend: crate::BACKEND,
            reason: "no RDMA device (libibverbs loaded, ibv_get_device_list found none)".into(),
        });
    }
    let mut out = Vec::new();
    for ListedDevice { name, .. } in list.entries() {
        match list
            .find(Some(&name))
            .and_then(|device| Context::open(&device))
            .and_then(|context| facts(&context))
        {
            Ok((device, _)) => out.push(device),
            Err(err) => tracing::debug!(%name, %err, "verbs: device skipped"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_decode_as_ibv_devinfo_does() {
        assert_eq!(mtu_bytes(5), Some(4096));
        assert_eq!(mtu_bytes(3), Some(1024));
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(link_gbits(2, 32), Some(103.125)); // 4x EDR
        assert_eq!(link_gbits(2, 64), Some(212.5)); // 4x HDR
        assert_eq!(link_gbits(2, 128), Some(425.0)); // 4x NDR
        assert_eq!(link_gbits(1, 1), Some(2.5));
        assert_eq!(link_gbits(3, 1), None);
    }
}
