//! GPU staging on real GPU memory. Needs libcuda and a GPU, so it is `#[ignore]`d in CI; run it
//! on a GPU machine with `cargo test -p rdma-hint-staged --features cuda --test gpu -- --ignored`.
#![cfg(feature = "cuda")]

use rdma_hint_core::TransportError;
use rdma_hint_integration_tests::random_bytes;
use rdma_hint_staged::gpu::{CopyDirection, DeviceBuffer, Gpu, StagingPipeline};

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
    assert!(matches!(DeviceBuffer::new(&gpu, 0), Err(TransportError::InvalidArgument { .. })));
    let small = DeviceBuffer::new(&gpu, 4096).unwrap();
    assert!(matches!(small.upload(4000, &[0; 200]), Err(TransportError::InvalidArgument { .. })));
    let mut pipeline = StagingPipeline::new(&gpu, 4096, 4, 4).unwrap();
    assert!(pipeline.run(CopyDirection::GpuToGpu, Some(&small), None, 4096).is_err());
    assert!(pipeline.run(CopyDirection::GpuToGpu, Some(&small), Some(&small), 8192).is_err(), "past the end");
    assert!(matches!(Gpu::open(4096), Err(TransportError::Driver { .. })), "no such ordinal");
}

#[test]
fn without_a_driver_the_error_says_so() {
    match Gpu::open(0) {
        Ok(_) => {}
        Err(e) => {
            assert!(matches!(e, TransportError::Unavailable { .. } | TransportError::Driver { .. }), "{e}")
        }
    }
}

mod transport {
    use rdma_hint_core::SourceId;
    use rdma_hint_core::{Arrival, LocalRegion, MemoryKind, PeerEndpoint, RemoteRegion, Transport, WriteOp};
    use rdma_hint_engine::{BlockSpec, Chunker, PostPolicy, TransferRequest};
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
            rdma_hint_backend_core::blocking::block_on(receiver.connect(
                PeerEndpoint::Listen(address),
                &[target.id],
                deadline,
            ))
            .unwrap();
            receiver
        });
        let sender = StagedTransport::new(channel);
        let sources = sources.iter().map(|kind| sender.register(*kind, len).unwrap()).collect();
        let remote = rdma_hint_backend_core::blocking::block_on(sender.connect(
            PeerEndpoint::Dial(address),
            &[],
            deadline,
        ))
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
            rdma_hint_backend_core::blocking::block_on(chunker.transfer(
                &self.sender,
                TransferRequest::single(source, 0, &self.remote, 0, len).notify(1),
                self.deadline,
            ))
            .unwrap();
            self.landed_after_arrival(0, len)
        }

        fn landed_after_arrival(&self, offset: u64, len: u64) -> Vec<u8> {
            let mut arrivals = [Arrival::EMPTY; 1];
            let got = rdma_hint_backend_core::blocking::block_on(
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

    /// GPU to GPU over shm: the peer cannot map GPU memory, so it writes a page-locked bounce
    /// the receiving side copies on with the copy engine as each write is announced.
    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn gpu_regions_receive_over_shm_through_a_bounce() {
        for len in SIZES {
            let pair = connected(StagedChannel::SharedMemory, GPU, &[GPU], len.next_multiple_of(64 * 1024));
            let data = super::random_bytes(len as usize, len + 2);
            assert!(pair.round_trip(&data) == data, "{len} B GPU -> shm -> GPU");
            assert_eq!(pair.receiver.copied_bytes().in_transit, 0, "the copy engine copied, not the CPU");
        }
    }
}

/// GPU memory the application allocated (a cudarc `CudaSlice<u8>`), registered in place: no
/// transport-owned GPU region in between, bytes verified where they land, the slice handed
/// back intact, and device memory the driver does not vouch for refused.
mod caller_memory {
    use rdma_hint_backend_core::blocking::block_on;
    use rdma_hint_core::{Arrival, CallerMemory, PeerEndpoint, SourceId, Transport, TransportError, WriteOp};
    use rdma_hint_engine::{BlockSpec, Chunker, PostPolicy, TransferRequest};
    use rdma_hint_staged::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
    use rdma_hint_staged::gpu::cuda_slice_memory;
    use rdma_hint_staged::{StagedChannel, StagedTransport};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn stream() -> Arc<CudaStream> {
        CudaContext::new(0).expect("a GPU with libcuda").default_stream()
    }

    fn device_ptr(slice: &CudaSlice<u8>) -> u64 {
        slice.device_ptr(slice.stream()).0
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn an_application_s_cuda_slice_moves_in_place_and_comes_back() {
        let stream = stream();
        for channel in [StagedChannel::Tcp, StagedChannel::SharedMemory] {
            let len = (8u64 << 20) + 65536; // a whole number of the 64 KiB alignment: no padding
            let data = super::random_bytes(len as usize, 27);
            let receiver = StagedTransport::new(channel);
            // Into the receiver's own CudaSlice (over shm through a page-locked bounce).
            let target_memory = cuda_slice_memory(stream.alloc_zeros::<u8>(len as usize).unwrap()).unwrap();
            let target = receiver.register_memory(target_memory).unwrap();
            let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let accepting = std::thread::spawn(move || {
                block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline)).unwrap();
                receiver
            });
            let sender = StagedTransport::new(channel);
            let slice = stream.clone_htod(&data).unwrap();
            let at = device_ptr(&slice);
            let source = sender.register_memory(cuda_slice_memory(slice).unwrap()).unwrap();
            assert_eq!(sender.device_pointer(source.id).unwrap(), at, "the region is the slice itself");
            let remote = block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline)).unwrap()[0];
            let receiver = accepting.join().unwrap();

            let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).unwrap();
            chunker.set_hint(SourceId::Gpu(0), BlockSpec::new(1 << 20, 64 * 1024).unwrap());
            block_on(chunker.transfer(
                &sender,
                TransferRequest::single(&source, 0, &remote, 0, len).notify(3),
                deadline,
            ))
            .unwrap();
            let mut arrivals = [Arrival::EMPTY; 1];
            block_on(receiver.wait_arrivals(&mut arrivals, deadline)).unwrap();
            assert!(receiver.release(target.id).is_err(), "exposed to the connected peer");
            let back: CudaSlice<u8> = sender.release(source.id).unwrap().take().unwrap();
            assert_eq!(device_ptr(&back), at, "the same allocation comes back");
            assert!(stream.clone_dtoh(&back).unwrap() == data, "the source slice changed");
            drop(sender);
            // The peer is gone: its writes are over, so the receiver's slice comes back.
            let until = Instant::now() + Duration::from_secs(10);
            let back = loop {
                match receiver.release(target.id) {
                    Ok(memory) => break memory,
                    Err(TransportError::RegionBusy { .. }) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => panic!("{e}"),
                }
            };
            let landed = stream.clone_dtoh(&back.take::<CudaSlice<u8>>().unwrap()).unwrap();
            assert!(landed == data, "{channel}: the bytes in the receiver's own memory differ");
            assert_eq!(receiver.copied_bytes().write_region + receiver.copied_bytes().read_region, 0);
        }
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn a_cuda_slice_with_an_op_in_flight_is_not_released() {
        let stream = stream();
        let len = 256u64 << 20;
        let receiver = StagedTransport::new(StagedChannel::Tcp);
        let target = receiver.register(rdma_hint_core::MemoryKind::Host, len).unwrap();
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let accepting = std::thread::spawn(move || {
            block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline)).unwrap();
            receiver
        });
        let sender = StagedTransport::new(StagedChannel::Tcp);
        let source = sender
            .register_memory(cuda_slice_memory(stream.alloc_zeros::<u8>(len as usize).unwrap()).unwrap())
            .unwrap();
        let remote = block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline)).unwrap()[0];
        let _receiver = accepting.join().unwrap();
        let op = WriteOp {
            wr_id: 1,
            local: source.id,
            local_offset: 0,
            remote: remote.id,
            remote_offset: 0,
            len,
            signalled: true,
            imm: None,
        };
        sender.post_writes(&[op]).unwrap();
        assert!(matches!(sender.release(source.id), Err(TransportError::RegionBusy { .. })));
        let mut completions = [rdma_hint_core::Completion::EMPTY; 1];
        block_on(sender.wait_completions(&mut completions, deadline)).unwrap();
        assert!(sender.release(source.id).unwrap().take::<CudaSlice<u8>>().is_ok());
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and libcuda"]
    fn device_memory_the_driver_does_not_vouch_for_is_refused() {
        let stream = stream();
        let slice = stream.alloc_zeros::<u8>(1 << 20).unwrap();
        let at = device_ptr(&slice);
        let transport = StagedTransport::new(StagedChannel::Tcp);
        let cases = [
            ("past the allocation's end", at, 2 << 20),
            ("an address the driver never handed out", 0x7f00_0000_0000, 4096),
            ("misaligned", at + 1, 4096),
        ];
        for (what, device_ptr, len) in cases {
            // SAFETY: each is refused before anything reads it (the test checks that).
            let memory = unsafe { CallerMemory::cuda_device(0, device_ptr, len) };
            let refused = transport.register_memory(memory).expect_err(what);
            let TransportError::MemoryRefused { error, .. } = refused else { panic!("{what}: {refused:?}") };
            assert!(
                matches!(*error, TransportError::Registration { .. } | TransportError::Misaligned { .. }),
                "{what}: {error:?}"
            );
        }
        drop(slice);
    }
}
