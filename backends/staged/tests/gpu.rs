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
    use rdma_hint_core::SourceId;
    use rdma_hint_core::{Arrival, LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, Transport, WriteOp};
    use rdma_hint_staged::{StagedChannel, StagedTransport};
    use std::time::{Duration, Instant};

    /// Both ends of `channel` on this host, connected: the sender's regions of `sources`
    /// kinds and the receiver's one region of `target` kind, `len` bytes each.
    struct Pair {
        sender: StagedTransport,
        receiver: StagedTransport,
        sources: Vec<LocalRegion>,
        target: LocalRegion,
        remote: RemoteRegion,
        deadline: Instant,
    }

    fn connected(channel: StagedChannel, target: MemoryKind, sources: &[MemoryKind], len: u64) -> Pair {
        let receiver = StagedTransport::new(channel);
        let target = receiver.register(target, len).unwrap();
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let listening = std::thread::spawn(move || {
            rdma_hint_toolkit::blocking::block_on(receiver.connect(
                PeerEndpoint::Listen(address),
                &[target.id],
                deadline,
            ))
            .unwrap();
            receiver
        });
        let sender = StagedTransport::new(channel);
        let sources = sources.iter().map(|kind| sender.register(*kind, len).unwrap()).collect();
        let remote =
            rdma_hint_toolkit::blocking::block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline))
                .unwrap()[0];
        Pair { sender, receiver: listening.join().unwrap(), sources, target, remote, deadline }
    }

    impl Pair {
        /// Chunks `data` from source 0 in 320 KiB blocks with a notification, waits for it on
        /// the receiver and returns what landed.
        fn round_trip(&self, data: &[u8]) -> Vec<u8> {
            let (source, len) = (&self.sources[0], data.len() as u64);
            self.sender.write_region(source.id, 0, data).unwrap();
            let mut chunker = Chunker::new(PostPolicy::default(), self.sender.capabilities()).unwrap();
            chunker.set_hint(SourceId::Gpu(0), BlockSpec::new(320 * 1024, 64 * 1024).unwrap());
            rdma_hint_toolkit::blocking::block_on(chunker.write(
                &self.sender,
                Transfer::new(source, &self.remote, len).notify(1),
                self.deadline,
            ))
            .unwrap();
            self.landed_after_arrival(0, len)
        }

        fn landed_after_arrival(&self, offset: u64, len: u64) -> Vec<u8> {
            let mut arrivals = [Arrival::EMPTY; 1];
            let got = rdma_hint_toolkit::blocking::block_on(
                self.receiver.wait_arrivals(&mut arrivals, self.deadline),
            );
            assert_eq!(got.unwrap(), 1);
            let mut back = vec![0u8; len as usize];
            self.receiver.read_region(self.target.id, offset, &mut back).unwrap();
            back
        }

        fn op(&self, wr_id: u64, source: usize, (offset, len): (u64, u64), imm: Option<u32>) -> WriteOp {
            WriteOp {
                wr_id,
                local: self.sources[source].id,
                local_offset: offset,
                remote: self.remote.id,
                remote_offset: offset,
                len,
                imm,
                signalled: false,
            }
        }
    }

    const GPU: MemoryKind = MemoryKind::CudaDevice { ordinal: 0 };
    const SIZES: [u64; 5] = [1, 4095, 65536, (1 << 20) + 3, 64 << 20];

    /// GPU memory on both ends of a real TCP connection: sender stages D2H through pinned
    /// halves, receiver H2D; bytes checked after the arrival.
    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn gpu_regions_over_tcp_arrive_byte_exact() {
        for len in SIZES {
            let pair = connected(StagedChannel::Tcp, GPU, &[GPU], len.next_multiple_of(64 * 1024));
            let data = super::random_bytes(len as usize, len);
            assert!(pair.round_trip(&data) == data, "{len} B GPU -> TCP -> GPU");
        }
    }

    /// GPU memory into a same-host peer's host region over shm: the copies are queued into the
    /// page-locked peer mapping and land before the notification (and, for writes nobody is
    /// told about, once the link goes idle).
    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn gpu_regions_over_shm_arrive_byte_exact() {
        for len in SIZES {
            let pair = connected(
                StagedChannel::SharedMemory,
                MemoryKind::Host,
                &[GPU],
                len.next_multiple_of(64 * 1024),
            );
            let data = super::random_bytes(len as usize, len);
            assert!(pair.round_trip(&data) == data, "{len} B GPU -> shm -> host");
            // An unsignalled write without a notification: lands once the link is idle.
            let fresh = super::random_bytes(len as usize, len + 1);
            pair.sender.write_region(pair.sources[0].id, 0, &fresh).unwrap();
            pair.sender.post_writes(&[pair.op(7, 0, (0, len), None)]).unwrap();
            let mut landed = vec![0u8; len as usize];
            while Instant::now() < pair.deadline {
                pair.receiver.read_region(pair.target.id, 0, &mut landed).unwrap();
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
        let pair = connected(StagedChannel::SharedMemory, MemoryKind::Host, &[GPU, MemoryKind::Host], len);
        pair.sender.write_region(pair.sources[0].id, 0, &vec![0xAA; len as usize]).unwrap();
        pair.sender.write_region(pair.sources[1].id, 0, &vec![0x55; len as usize]).unwrap();
        // The GPU write covers the region; the host write, posted after it, its last 4 KiB,
        // which the copy engine reaches only after the host memcpy would have finished.
        let tail = len - 4096;
        for round in 0..20u64 {
            let ops = [
                pair.op(2 * round, 0, (0, len), None),
                pair.op(2 * round + 1, 1, (tail, 4096), Some(round as u32)),
            ];
            pair.sender.post_writes(&ops).unwrap();
            let landed = pair.landed_after_arrival(tail, 4096);
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
            rdma_hint_toolkit::blocking::block_on(listener.connect(
                PeerEndpoint::Listen(address),
                &[host.id],
                deadline,
            ))
            .map(|_| ())
        });
        let dialer = StagedTransport::new(StagedChannel::SharedMemory);
        let region = dialer.register(MemoryKind::CudaDevice { ordinal: 0 }, 1 << 20).unwrap();
        let error = rdma_hint_toolkit::blocking::block_on(dialer.connect(
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
