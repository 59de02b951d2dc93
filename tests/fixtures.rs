//! The fixture trees classified end to end: sysfs → topology → matrix → hints.

use rdma_hint::probe;
use rdma_hint::probing::{NicKind, ProbeOptions};
use rdma_hint_core::{PathClass, SourceId};
use rdma_hint_discovery::Topology;
use rdma_hint_integration_tests::sysfs_fixture;
use std::collections::BTreeMap;

fn matrix(tree: &str) -> BTreeMap<(String, String), PathClass> {
    let topology = Topology::discover(&sysfs_fixture(tree)).unwrap();
    topology.matrix().into_iter().map(|entry| ((entry.source.to_string(), entry.nic), entry.class)).collect()
}

fn expect(tree: &str, rows: &[(&str, &[(&str, PathClass)])]) {
    let got = matrix(tree);
    let mut want = BTreeMap::new();
    for (source, cells) in rows {
        for (nic, class) in *cells {
            want.insert((source.to_string(), nic.to_string()), *class);
        }
    }
    assert_eq!(got, want, "path matrix of {tree}");
}

#[test]
fn flat_vm_has_no_gpu_and_one_phb_row() {
    let topology = Topology::discover(&sysfs_fixture("flat-vm")).unwrap();
    assert!(topology.gpus.is_empty(), "the emulated VGA is not a GPU");
    let rxe = topology.nic("rxe0").unwrap();
    assert_eq!(rxe.pci.as_deref(), Some("0000:00:03.0"), "rxe0 sits on eth0's virtio function");
    assert_eq!(rxe.mtu_bytes, Some(1024), "RoCE MTU from a 1500 B Ethernet MTU");
    assert_eq!(rxe.rate_gbits, Some(10.0));
    assert!(topology.nic("lo").is_none(), "virtual interfaces are not NICs");
    use PathClass::*;
    expect("flat-vm", &[("host:0", &[("rxe0", Phb), ("eth0", Phb)])]);
}

#[test]
fn dgx_like_matrix() {
    use PathClass::*;
    expect(
        "dgx-like",
        &[
            ("host:0", &[("mlx5_0", Phb), ("mlx5_1", Phb), ("mlx5_2", Sys), ("eno1", Phb)]),
            ("host:1", &[("mlx5_0", Sys), ("mlx5_1", Sys), ("mlx5_2", Phb), ("eno1", Sys)]),
            ("gpu:0", &[("mlx5_0", Pix), ("mlx5_1", Node), ("mlx5_2", Sys), ("eno1", Phb)]),
            ("gpu:1", &[("mlx5_0", Pix), ("mlx5_1", Node), ("mlx5_2", Sys), ("eno1", Phb)]),
            ("gpu:2", &[("mlx5_0", Node), ("mlx5_1", Pix), ("mlx5_2", Sys), ("eno1", Node)]),
            ("gpu:3", &[("mlx5_0", Sys), ("mlx5_1", Sys), ("mlx5_2", Pix), ("eno1", Sys)]),
        ],
    );
    let topology = Topology::discover(&sysfs_fixture("dgx-like")).unwrap();
    assert_eq!(topology.gpus.len(), 4, "the ASPEED BMC display is not a GPU");
    let nic = topology.nic("mlx5_0").unwrap();
    assert_eq!(nic.kind, NicKind::Rdma);
    assert_eq!(nic.rate_gbits, Some(400.0));
    assert_eq!(nic.firmware.as_deref(), Some("28.39.1002"));
    assert_eq!(nic.driver_version.as_deref(), Some("24.10-1.1.4"));
}

#[test]
fn gpu_behind_extra_switch_is_pxb_and_gets_its_own_hint() {
    use PathClass::*;
    expect(
        "gpu-behind-switch",
        &[
            ("host:0", &[("mlx5_0", Phb), ("ens1np0", Phb)]),
            ("gpu:0", &[("mlx5_0", Pxb), ("ens1np0", Pxb)]),
            ("gpu:1", &[("mlx5_0", Pix), ("ens1np0", Pix)]),
        ],
    );
    let report = probe(&ProbeOptions::for_tree(sysfs_fixture("gpu-behind-switch"))).unwrap();
    let hint = |source| {
        report.hints.iter().find(|h| h.source == source && h.transport == "verbs:mlx5_0").cloned().unwrap()
    };
    let behind = hint(SourceId::Gpu(0));
    let direct = hint(SourceId::Gpu(1));
    assert_eq!(behind.path_class, Pxb);
    assert_eq!(direct.path_class, Pix);
    assert!(behind.fixed_cost_us > direct.fixed_cost_us, "two more bridges");
    assert!(behind.bandwidth_gbps < 0.6 * direct.bandwidth_gbps, "Gen4 link binds GPU 0");
    assert_ne!(behind.block_bytes, direct.block_bytes, "per-GPU hints differ");
    assert_eq!(direct.align_bytes, 64 * 1024, "GPUDirect page");
    // RoCE over a 9000 B MTU keeps a 4 KiB IB MTU.
    assert_eq!(report.nics.iter().find(|n| n.name == "mlx5_0").unwrap().mtu_bytes, Some(4096));
}

#[test]
fn dgx_gpu_across_sockets_has_no_hint_but_a_fallback() {
    let report = probe(&ProbeOptions::for_tree(sysfs_fixture("dgx-like"))).unwrap();
    let missing = report
        .no_hint
        .iter()
        .find(|m| m.source == SourceId::Gpu(0) && m.transport == "verbs:mlx5_2")
        .expect("GPU 0 ↔ mlx5_2 is SYS");
    assert!(missing.fallback.is_some());
    assert!(report.hints.iter().all(|h| h.block_bytes > 0 && h.block_bytes % h.align_bytes == 0));
    // Every source has the staged fallback.
    for source in &report.sources {
        assert!(report.hints.iter().any(|h| h.source == source.id && h.transport == "staged:tcp"));
    }
}

#[test]
fn a_gpu_source_over_staged_shm_is_bound_by_its_pcie_link_not_memcpy() {
    let report = probe(&ProbeOptions::for_tree(sysfs_fixture("gpu-behind-switch"))).unwrap();
    let hint = |source, transport: &str| {
        report.hints.iter().find(|h| h.source == source && h.transport == transport).cloned().unwrap()
    };
    let (gpu, host) = (hint(SourceId::Gpu(1), "staged:shm"), hint(SourceId::Host(0), "staged:shm"));
    assert!(
        gpu.bandwidth_gbps > 4.0 * host.bandwidth_gbps,
        "{} vs {}",
        gpu.bandwidth_gbps,
        host.bandwidth_gbps
    );
    assert!(gpu.reasons.iter().any(|r| r.why.contains("copy engine writes the peer")), "{:?}", gpu.reasons);
    assert!((gpu.fixed_cost_us - (rdma_hint::model::STAGED_SHM_GPU_PER_BLOCK_US + 0.25)).abs() < 1e-9);
    // Over TCP the socket still bounds a GPU source.
    let tcp = hint(SourceId::Gpu(1), "staged:tcp");
    assert!(tcp.bandwidth_gbps <= 3.0 + 1e-9, "{}", tcp.bandwidth_gbps);
}
