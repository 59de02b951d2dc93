//! GPU staging on real GPU memory. Needs libcuda and a GPU, so it is `#[ignore]`d in CI; run it
//! on a GPU machine with `cargo test -p rdma-hint-staged --features cuda --test gpu -- --ignored`.
#![cfg(feature = "cuda")]

use rdma_hint_integration_tests::random_bytes;
use rdma_hint_staged::gpu::{CopyDirection, DeviceBuffer, Gpu, GpuProbeError, StagingPipeline};

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

mod transport {
    use rdma_hint_chunker::{BlockSpec, Chunker, PostPolicy, Transfer};
    use rdma_hint_core::{Arrival, MemoryKind, PeerEndpoint, SourceId, Transport};
    use rdma_hint_staged::{StagedChannel, StagedTransport};
    use std::time::{Duration, Instant};

    /// GPU memory on both ends of a real TCP connection: sender stages D2H through pinned
    /// halves, receiver H2D; bytes checked after the arrival.
    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn gpu_regions_over_tcp_arrive_byte_exact() {
        for len in [1u64, 4095, 65536, (1 << 20) + 3, 64 << 20] {
            let padded = len.next_multiple_of(64 * 1024);
            let receiver = StagedTransport::new(StagedChannel::Tcp);
            let target = receiver.register(MemoryKind::CudaDevice { ordinal: 0 }, padded).unwrap();
            let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let listening = std::thread::spawn(move || {
                rdma_hint_core::blocking::block_on(receiver.connect(
                    PeerEndpoint::Listen(address),
                    &[target.id],
                    deadline,
                ))
                .unwrap();
                let mut arrivals = [Arrival::EMPTY; 1];
                assert_eq!(
                    rdma_hint_core::blocking::block_on(receiver.wait_arrivals(&mut arrivals, deadline))
                        .unwrap(),
                    1
                );
                let mut back = vec![0u8; len as usize];
                receiver.read_region(target.id, 0, &mut back).unwrap();
                back
            });
            let sender = StagedTransport::new(StagedChannel::Tcp);
            let source = sender.register(MemoryKind::CudaDevice { ordinal: 0 }, padded).unwrap();
            let data = super::random_bytes(len as usize, len);
            sender.write_region(source.id, 0, &data).unwrap();
            let remote = rdma_hint_core::blocking::block_on(sender.connect(
                PeerEndpoint::Dial(address),
                &[],
                deadline,
            ))
            .unwrap()[0];
            let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).unwrap();
            chunker.set_hint(SourceId::Gpu(0), BlockSpec::new(320 * 1024, 64 * 1024).unwrap());
            rdma_hint_core::blocking::block_on(chunker.write(
                &sender,
                Transfer::new(&source, &remote, len).notify(1),
                deadline,
            ))
            .unwrap();
            assert!(listening.join().unwrap() == data, "{len} B GPU -> TCP -> GPU");
        }
    }

    /// GPU memory into a same-host peer's host region over shm: the copies are queued into the
    /// page-locked peer mapping and land before the notification (and, for writes nobody is
    /// told about, once the link goes idle).
    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn gpu_regions_over_shm_arrive_byte_exact() {
        for len in [1u64, 4095, 65536, (1 << 20) + 3, 64 << 20] {
            let padded = len.next_multiple_of(64 * 1024);
            let receiver = StagedTransport::new(StagedChannel::SharedMemory);
            let target = receiver.register(MemoryKind::Host, padded).unwrap();
            let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let listening = std::thread::spawn(move || {
                rdma_hint_core::blocking::block_on(receiver.connect(
                    PeerEndpoint::Listen(address),
                    &[target.id],
                    deadline,
                ))
                .unwrap();
                let mut arrivals = [Arrival::EMPTY; 1];
                assert_eq!(
                    rdma_hint_core::blocking::block_on(receiver.wait_arrivals(&mut arrivals, deadline))
                        .unwrap(),
                    1
                );
                let mut back = vec![0u8; len as usize];
                receiver.read_region(target.id, 0, &mut back).unwrap();
                (receiver, target, back)
            });
            let sender = StagedTransport::new(StagedChannel::SharedMemory);
            let source = sender.register(MemoryKind::CudaDevice { ordinal: 0 }, padded).unwrap();
            let data = super::random_bytes(len as usize, len);
            sender.write_region(source.id, 0, &data).unwrap();
            let remote = rdma_hint_core::blocking::block_on(sender.connect(
                PeerEndpoint::Dial(address),
                &[],
                deadline,
            ))
            .unwrap()[0];
            let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).unwrap();
            chunker.set_hint(SourceId::Gpu(0), BlockSpec::new(320 * 1024, 64 * 1024).unwrap());
            rdma_hint_core::blocking::block_on(chunker.write(
                &sender,
                Transfer::new(&source, &remote, len).notify(1),
                deadline,
            ))
            .unwrap();
            let (receiver, target, back) = listening.join().unwrap();
            assert!(back == data, "{len} B GPU -> shm -> host");
            // An unsignalled write without a notification: lands once the link is idle.
            let fresh = super::random_bytes(len as usize, len + 1);
            sender.write_region(source.id, 0, &fresh).unwrap();
            let op = rdma_hint_core::WriteOp {
                wr_id: 7,
                local: source.id,
                local_offset: 0,
                remote: remote.id,
                remote_offset: 0,
                len,
                imm: None,
                signalled: false,
            };
            sender.post_writes(&[op]).unwrap();
            let mut landed = vec![0u8; len as usize];
            while Instant::now() < deadline {
                receiver.read_region(target.id, 0, &mut landed).unwrap();
                if landed == fresh {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(landed == fresh, "{len} B unsignalled GPU write never landed");
        }
    }

    /// Writes land in the order they were posted, whatever their source: a queued GPU copy
    /// must not overwrite a later host write to the same bytes.
    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn a_later_host_write_wins_over_an_earlier_queued_gpu_write() {
        let len = 8u64 << 20;
        let receiver = StagedTransport::new(StagedChannel::SharedMemory);
        let target = receiver.register(MemoryKind::Host, len).unwrap();
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let listening = std::thread::spawn(move || {
            rdma_hint_core::blocking::block_on(receiver.connect(
                PeerEndpoint::Listen(address),
                &[target.id],
                deadline,
            ))
            .unwrap();
            receiver
        });
        let sender = StagedTransport::new(StagedChannel::SharedMemory);
        let gpu = sender.register(MemoryKind::CudaDevice { ordinal: 0 }, len).unwrap();
        let host = sender.register(MemoryKind::Host, len).unwrap();
        sender.write_region(gpu.id, 0, &vec![0xAA; len as usize]).unwrap();
        sender.write_region(host.id, 0, &vec![0x55; len as usize]).unwrap();
        let remote =
            rdma_hint_core::blocking::block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline))
                .unwrap()[0];
        let receiver = listening.join().unwrap();
        // The GPU write covers the region; the host write, posted after it, its last 4 KiB,
        // which the copy engine reaches only after the host memcpy would have finished.
        let tail = len - 4096;
        let op = |wr_id, local, (offset, bytes), imm| rdma_hint_core::WriteOp {
            wr_id,
            local,
            local_offset: offset,
            remote: remote.id,
            remote_offset: offset,
            len: bytes,
            imm,
            signalled: false,
        };
        for round in 0..20u64 {
            sender
                .post_writes(&[
                    op(2 * round, gpu.id, (0, len), None),
                    op(2 * round + 1, host.id, (tail, 4096), Some(round as u32)),
                ])
                .unwrap();
            let mut arrivals = [Arrival::EMPTY; 1];
            assert_eq!(
                rdma_hint_core::blocking::block_on(receiver.wait_arrivals(&mut arrivals, deadline)).unwrap(),
                1
            );
            let mut landed = vec![0u8; 4096];
            receiver.read_region(target.id, tail, &mut landed).unwrap();
            assert!(
                landed.iter().all(|b| *b == 0x55),
                "round {round}: an earlier GPU write landed over a later host write"
            );
        }
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn gpu_regions_cannot_be_exposed_over_shm() {
        let listener = StagedTransport::new(StagedChannel::SharedMemory);
        let host = listener.register(MemoryKind::Host, 1 << 20).unwrap();
        let address = listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let accepting = std::thread::spawn(move || {
            rdma_hint_core::blocking::block_on(listener.connect(
                PeerEndpoint::Listen(address),
                &[host.id],
                deadline,
            ))
            .map(|_| ())
        });
        let dialer = StagedTransport::new(StagedChannel::SharedMemory);
        let region = dialer.register(MemoryKind::CudaDevice { ordinal: 0 }, 1 << 20).unwrap();
        let error = rdma_hint_core::blocking::block_on(dialer.connect(
            PeerEndpoint::Dial(address),
            &[region.id],
            deadline,
        ))
        .unwrap_err();
        assert!(error.to_string().contains("host regions only"), "{error}");
        drop(dialer);
        assert!(accepting.join().unwrap().is_err(), "the listener sees the dialer go");
    }
}
