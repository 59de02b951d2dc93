//! GPU staging throughput on a real GPU: device → pinned ring → device (both halves overlapped),
//! and each half alone, for block sizes 4 KiB … 64 MiB. Every GPU → GPU run is verified byte
//! for byte. Prints one JSON object per block size and a table.
//!
//! `gpu_staging [TOTAL_MIB]` (default 1024 MiB moved per block size; needs libcuda).

use rdma_hint::model::{compute_hint, HintPolicy, PathClass, PathProfile, SourceFacts, SourceKind};
use rdma_hint::probing::ProbeOptions;
use rdma_hint::staged::{CopyDirection, DeviceBuffer, Gpu, StagingPipeline};
use rdma_hint::transport::{TransportFacts, TransportKind};
use rdma_hint::Device;
use rdma_hint_benches::flags::Flags;
use std::time::Instant;

const BLOCKS: [usize; 8] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];

/// The model's hint for in-process GPU staging: B = the GPU's PCIe link (from sysfs, as `probe`
/// reads it), o = the copy-engine launch the model charges for GPU sources on the staged backend.
fn model_hint() -> Option<u64> {
    let report = rdma_hint::probe(&ProbeOptions::default()).ok()?;
    let gpu = report.sources.into_iter().find(|source| source.id == Device::Gpu(0))?;
    let (link, facts) = (gpu.pcie?, gpu.gpu?);
    let profile = PathProfile {
        source: SourceFacts {
            id: Device::Gpu(0),
            numa_node: None,
            memory_bytes: facts.memory_bytes,
            pcie: Some(link),
            kind: SourceKind::Gpu(facts),
        },
        transport: TransportFacts {
            id: rdma_hint::TransportId::Custom("copy-engine".into()),
            kind: TransportKind::Staged,
            wire_gbps: link.effective_gbps(),
            nic_pcie: None,
            per_op_overhead_us: 0.0,
            mtu_bytes: None,
            max_msg_bytes: 1 << 40,
            max_payload_bytes: None,
            queried_from_backend: false,
            rate_note: None,
        },
        path_class: PathClass::SameDevice,
        bridges: 0,
        versions: Default::default(),
    };
    let hint = compute_hint(&profile, &HintPolicy::default()).ok()?;
    for reason in &hint.reasons {
        println!("# {reason}");
    }
    Some(hint.block_bytes)
}

fn main() {
    let mut given = Flags::from_env("usage: gpu_staging [TOTAL_MIB] (default 1024)");
    let total: usize = match given.next_arg() {
        None => 1024 << 20,
        Some(text) => {
            text.parse::<usize>().unwrap_or_else(|e| given.fail(&format!("TOTAL_MIB {text}: {e}"))) << 20
        }
    };
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("gpu_staging: {e}");
            std::process::exit(2);
        }
    };
    let source = DeviceBuffer::new(&gpu, total).expect("source");
    let target = DeviceBuffer::new(&gpu, total).expect("target");
    let pattern: Vec<u8> = (0..total).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    source.upload(0, &pattern).expect("upload");
    let zeros = vec![0u8; total];
    let mut back = vec![0u8; total];
    let hint = model_hint();
    println!("HINT {}", hint.map_or("none".to_string(), |h| h.to_string()));
    let mut blocks = BLOCKS.to_vec();
    if let Some(hint) = hint {
        blocks.push(hint as usize);
        blocks.sort_unstable();
        blocks.dedup();
    }
    println!("{:>8} {:>12} {:>12} {:>12} {:>6}", "block", "GPU→GPU GB/s", "D2H GB/s", "H2D GB/s", "batch");
    for block in blocks {
        // GROUP_MIB per batch call (default 4: fewer cross-stream event waits per byte), and
        // ≥ 64 MiB of ring in flight so the receiving half never starves.
        let group_bytes =
            std::env::var("GROUP_MIB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(4) << 20;
        let group_blocks = (group_bytes / block).clamp(1, 1024);
        let groups = ((64 << 20) / (group_blocks * block)).clamp(4, 64);
        let mut pipeline = StagingPipeline::new(&gpu, block, group_blocks, groups).expect("pipeline");
        let mut best = [f64::MAX; 3];
        for (slot, direction) in [CopyDirection::GpuToGpu, CopyDirection::GpuToHost, CopyDirection::HostToGpu]
            .into_iter()
            .enumerate()
        {
            for round in 0..4 {
                let started = Instant::now();
                pipeline.run(direction, Some(&source), Some(&target), total).expect("run");
                let seconds = started.elapsed().as_secs_f64();
                if round > 0 {
                    best[slot] = best[slot].min(seconds);
                }
            }
        }
        // Verify a fresh GPU → GPU pass end to end.
        target.upload(0, &zeros).expect("clear");
        pipeline.run(CopyDirection::GpuToGpu, Some(&source), Some(&target), total).expect("run");
        target.download(0, &mut back).expect("download");
        let verified = back == pattern;
        assert!(verified, "GPU → GPU staging corrupted data at block {block}");
        let gbps = best.map(|s| total as f64 / s / 1e9);
        println!(
            "{:>8} {:>12.2} {:>12.2} {:>12.2} {:>6}",
            block,
            gbps[0],
            gbps[1],
            gbps[2],
            if pipeline.uses_batch_api() { "yes" } else { "no" }
        );
        println!(
            "JSON {{\"block_bytes\":{block},\"gpu_to_gpu_gbps\":{:.3},\"d2h_gbps\":{:.3},\"h2d_gbps\":{:.3},\"batch_api\":{},\"verified\":{verified}}}",
            gbps[0],
            gbps[1],
            gbps[2],
            pipeline.uses_batch_api()
        );
    }
}
