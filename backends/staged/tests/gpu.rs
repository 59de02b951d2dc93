//! GPU staging on real GPU memory. Needs libcuda and a GPU, so it is `#[ignore]`d in CI; run it
//! on a GPU machine with `cargo test -p rdma-hint-staged --features cuda --test gpu -- --ignored`.
#![cfg(feature = "cuda")]

use rdma_hint_staged::gpu::{CopyDirection, DeviceBuffer, Gpu, GpuProbeError, StagingPipeline};

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU and libcuda"]
fn gpu_to_gpu_staging_is_byte_exact_for_odd_sizes() {
    let gpu = Gpu::open(0).expect("a GPU with libcuda");
    for (len, block) in [(1, 4096), (4095, 4096), (65536, 4096), ((1 << 20) + 3, 65536), (64 << 20, 1 << 20)]
    {
        let data = random_bytes(len, len as u64);
        let source = DeviceBuffer::new(&gpu, len).unwrap();
        let target = DeviceBuffer::new(&gpu, len).unwrap();
        source.upload(0, &data).unwrap();
        target.upload(0, &vec![0u8; len]).unwrap();
        let mut pipeline = StagingPipeline::new(&gpu, block, 8, 4).unwrap();
        pipeline.run(CopyDirection::GpuToGpu, Some(&source), Some(&target), len).unwrap();
        let mut back = vec![0u8; len];
        target.download(0, &mut back).unwrap();
        assert!(back == data, "{len} B in {block} B blocks");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and libcuda"]
fn bad_gpu_requests_are_typed_errors() {
    let gpu = Gpu::open(0).expect("a GPU with libcuda");
    assert!(matches!(DeviceBuffer::new(&gpu, 0), Err(GpuProbeError::Invalid(_))));
    let small = DeviceBuffer::new(&gpu, 4096).unwrap();
    assert!(matches!(small.upload(4000, &[0; 200]), Err(GpuProbeError::Invalid(_))));
    let mut pipeline = StagingPipeline::new(&gpu, 4096, 4, 4).unwrap();
    assert!(pipeline.run(CopyDirection::GpuToGpu, Some(&small), None, 4096).is_err());
    assert!(pipeline.run(CopyDirection::GpuToGpu, Some(&small), Some(&small), 8192).is_err(), "past the end");
    assert!(matches!(Gpu::open(4096), Err(GpuProbeError::Driver { .. })), "no such ordinal");
}

#[test]
fn without_a_driver_the_error_says_so() {
    match Gpu::open(0) {
        Ok(_) => {}
        Err(e) => assert!(matches!(e, GpuProbeError::NoDriver | GpuProbeError::Driver { .. }), "{e}"),
    }
}
