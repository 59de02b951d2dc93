//! An embedder's own buffer moved two ways, in one run, over each transport id:
//!
//! * **copy**: today's path without caller memory: `write_region` of the application's buffer
//!   into a transport-owned region, the transfer in the hint's blocks, `read_region` into the
//!   application's receive buffer;
//! * **in place**: the same buffers registered with `register_memory`; the transfer alone.
//!
//! Each path runs once to warm up (page faults, connection) and then `RUNS` times on one
//! connected pair; the median throughput (payload bytes per
//! second of the whole embedder step) and the CPU bytes the transports' code copied per payload
//! byte (their `copied_bytes` counters, both sides) are printed with the ratio. Every run's
//! bytes are verified where they landed. With `--gpu` the buffers are GPU memory: a transport-
//! owned GPU region (filled once) against a cudarc `CudaSlice` the application allocated, GPU
//! to GPU, transfer throughput only.
//!
//! `in_place_bw [--mib 1024] [--runs 5] [--ids staged:tcp,staged:shm] [--gpu]`

use rdma_hint::engine::{Chunker, PostPolicy, TransferRequest};
use rdma_hint::transport::CopiedBytes;
use rdma_hint::{
    block_on, get_low_latency_rdma_size_hint_with, open, Arrival, CallerMemory, Device, LocalRegion,
    MemoryKind, OpenOptions, PeerEndpoint, RemoteRegion, SizeHint, Transport, TransportId, TransportSelector,
};
use rdma_hint_benches::flags::Flags;
use std::time::{Duration, Instant};

struct Args {
    bytes: u64,
    runs: usize,
    ids: Vec<TransportId>,
    gpu: bool,
}

fn args() -> Args {
    let mut args = Args { bytes: 1 << 30, runs: 5, ids: Vec::new(), gpu: false };
    let mut given = Flags::from_env("usage: in_place_bw [--mib N] [--runs N] [--ids ID,ID] [--gpu]");
    while let Some(flag) = given.next_arg() {
        match flag.as_str() {
            "--mib" => args.bytes = given.value::<u64>(&flag) << 20,
            "--runs" => args.runs = given.value(&flag),
            "--ids" => args.ids = given.list(&flag),
            "--gpu" => args.gpu = true,
            other => given.fail(&format!("unknown argument {other}")),
        }
    }
    if args.ids.is_empty() {
        args.ids = vec![TransportId::STAGED_TCP, TransportId::STAGED_SHM];
    }
    args
}

/// A connected pair: `sender` writes `source` into the receiver's `target` (`remote` to it).
struct Pair {
    sender: Box<dyn Transport>,
    receiver: Box<dyn Transport>,
    source: LocalRegion,
    target: LocalRegion,
    remote: RemoteRegion,
    chunker: Chunker,
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

impl Pair {
    /// Opens both sides, lets `register` register each side's region, and connects.
    fn connect(
        id: &TransportId,
        hint: &SizeHint,
        register: impl FnOnce(&dyn Transport, &dyn Transport) -> (LocalRegion, LocalRegion),
    ) -> Pair {
        let options = OpenOptions::default().token(b"zero-copy bench");
        let sender = open(id, &options).unwrap_or_else(|e| panic!("{id}: open: {e}"));
        let receiver = open(id, &options).unwrap_or_else(|e| panic!("{id}: open: {e}"));
        let (source, target) = register(&*sender, &*receiver);
        let address = receiver.bind("127.0.0.1:0".parse().expect("address")).expect("bind");
        let remote = std::thread::scope(|scope| {
            let accepting = scope.spawn(|| {
                block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline()))
            });
            let remote =
                block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline())).expect("dial")[0];
            accepting.join().expect("accepting thread").expect("accept");
            remote
        });
        let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities()).expect("chunker");
        chunker.set_size_hint(hint).expect("hint");
        Pair { sender, receiver, source, target, remote, chunker }
    }

    /// One transfer of `len` bytes in the hint's blocks, until the receiver saw its arrival.
    fn transfer(&mut self, len: u64, imm: u32) {
        let Pair { sender, receiver, source, remote, chunker, .. } = self;
        std::thread::scope(|scope| {
            let arriving = scope.spawn(|| {
                let mut arrivals = [Arrival::EMPTY; 1];
                block_on(receiver.wait_arrivals(&mut arrivals, deadline())).expect("arrival");
                assert_eq!(arrivals[0].imm, imm, "the arrival of this run");
            });
            block_on(chunker.transfer(
                &**sender,
                TransferRequest::single(source, 0, remote, 0, len).notify(imm),
                deadline(),
            ))
            .expect("write");
            arriving.join().expect("arrival thread");
        });
    }

    fn copied(&self) -> (CopiedBytes, CopiedBytes) {
        (self.sender.copied_bytes(), self.receiver.copied_bytes())
    }
}

/// Copied bytes per payload byte between two counter readings, both sides together.
fn copies_per_byte(before: (CopiedBytes, CopiedBytes), after: (CopiedBytes, CopiedBytes), len: u64) -> f64 {
    let total = |(sender, receiver): (CopiedBytes, CopiedBytes)| sender.total() + receiver.total();
    (total(after) - total(before)) as f64 / len as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// One path's result: median GB/s over the runs, the runs, CPU copies per payload byte.
struct Measured {
    gbps: f64,
    runs: Vec<f64>,
    copies: f64,
}

fn gbps(len: u64, took: Duration) -> f64 {
    len as f64 / took.as_secs_f64() / 1e9
}

/// Marks run `run` in the first 8 bytes, so every run's bytes are new where they land.
fn stamp(buffer: &mut [u8], run: usize) {
    buffer[..8].copy_from_slice(&(run as u64 + 1).to_le_bytes());
}

fn pattern_byte(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(pattern_byte).collect()
}

fn host(id: &TransportId, args: &Args) -> (Measured, Measured) {
    let len = args.bytes;
    let hint = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone()))
        .unwrap_or_else(|e| panic!("{id}: hint: {e}"));
    let region_len = len.next_multiple_of(hint.align_bytes);
    let mut mine = pattern(region_len);
    let mut theirs = vec![0u8; region_len as usize];

    let mut copying = Pair::connect(id, &hint, |sender, receiver| {
        (
            sender.register(MemoryKind::Host, region_len).expect("register"),
            receiver.register(MemoryKind::Host, region_len).expect("register"),
        )
    });
    let (mut runs, mut copies) = (Vec::new(), Vec::new());
    for run in 0..=args.runs {
        stamp(&mut mine, run);
        let before = copying.copied();
        let started = Instant::now();
        copying.sender.write_region(copying.source.id, 0, &mine).expect("write_region");
        copying.transfer(len, run as u32);
        copying.receiver.read_region(copying.target.id, 0, &mut theirs).expect("read_region");
        if run > 0 {
            runs.push(gbps(len, started.elapsed()));
            copies.push(copies_per_byte(before, copying.copied(), len));
        }
        assert!(theirs[..len as usize] == mine[..len as usize], "{id}: copy path run {run}: bytes differ");
    }
    let copy = Measured { gbps: median(runs.clone()), runs, copies: median(copies) };
    drop(copying);

    let mut in_place = Pair::connect(id, &hint, |sender, receiver| {
        let source =
            sender.register_memory(CallerMemory::from(std::mem::take(&mut mine))).expect("register mine");
        let target = receiver
            .register_memory(CallerMemory::from(std::mem::take(&mut theirs)))
            .expect("register theirs");
        (source, target)
    });
    let (mut runs, mut copies) = (Vec::new(), Vec::new());
    let mut sent = Vec::new();
    let last = pattern_byte(len - 1);
    for run in 0..=args.runs {
        in_place.sender.access_region(in_place.source.id, &mut |bytes| stamp(bytes, run)).expect("lend mine");
        let before = in_place.copied();
        let started = Instant::now();
        in_place.transfer(len, run as u32);
        if run > 0 {
            runs.push(gbps(len, started.elapsed()));
            copies.push(copies_per_byte(before, in_place.copied(), len));
        }
        in_place
            .sender
            .access_region(in_place.source.id, &mut |bytes| sent = bytes[..64].to_vec())
            .expect("lend");
        let mut same = false;
        let mut check = |bytes: &mut [u8]| same = bytes[..64] == sent[..] && bytes[len as usize - 1] == last;
        // SAFETY: the sender writes nothing until the next run, which starts after this read.
        unsafe { in_place.receiver.domain().access_region_unchecked(in_place.target.id, &mut check) }
            .expect("lend theirs");
        assert!(same, "{id}: in-place run {run}: bytes differ");
    }
    let back: Vec<u8> = in_place.sender.release(in_place.source.id).expect("release").take().expect("mine");
    assert_eq!(back.len() as u64, region_len);
    (copy, Measured { gbps: median(runs.clone()), runs, copies: median(copies) })
}

/// Where one side of a GPU pair keeps its memory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GpuMemory {
    /// A GPU region the transport allocates (`register`), filled once with `write_region`.
    Owned,
    /// A cudarc `CudaSlice<u8>` the application allocated, registered in place.
    Slice,
}

impl GpuMemory {
    fn name(self) -> &'static str {
        match self {
            GpuMemory::Owned => "owned",
            GpuMemory::Slice => "CudaSlice",
        }
    }
}

/// GPU → GPU transfers with `source` and `target` memory, verified after the last run.
fn gpu_path(
    id: &TransportId,
    args: &Args,
    (source, target): (GpuMemory, GpuMemory),
) -> Result<Measured, String> {
    use rdma_hint::staged::cudarc::driver::{CudaContext, CudaSlice};
    let len = args.bytes;
    let hint = get_low_latency_rdma_size_hint_with(Device::Gpu(0), &TransportSelector::Id(id.clone()))
        .map_err(|e| format!("{id}: hint: {e}"))?;
    let region_len = len.next_multiple_of(hint.align_bytes);
    let stream = CudaContext::new(0).map_err(|e| e.to_string())?.default_stream();
    let expected = pattern(region_len);
    let gpu = MemoryKind::CudaDevice { ordinal: 0 };
    let mut pair = Pair::connect(id, &hint, |sender, receiver| {
        let from = match source {
            GpuMemory::Owned => {
                let region = sender.register(gpu, region_len).expect("register GPU");
                sender.write_region(region.id, 0, &expected).expect("fill once");
                region
            }
            GpuMemory::Slice => {
                let slice = stream.clone_htod(&expected).expect("the application's CudaSlice");
                sender
                    .register_memory(rdma_hint::staged::cuda_slice_memory(slice).expect("caller memory"))
                    .expect("register")
            }
        };
        let to = match target {
            GpuMemory::Owned => receiver.register(gpu, region_len).expect("register GPU"),
            GpuMemory::Slice => {
                let slice = stream.alloc_zeros::<u8>(region_len as usize).expect("the receiver's CudaSlice");
                receiver
                    .register_memory(rdma_hint::staged::cuda_slice_memory(slice).expect("caller memory"))
                    .expect("register")
            }
        };
        (from, to)
    });
    let (mut runs, mut copies) = (Vec::new(), Vec::new());
    for run in 0..=args.runs {
        let before = pair.copied();
        let started = Instant::now();
        pair.transfer(len, run as u32);
        if run > 0 {
            runs.push(gbps(len, started.elapsed()));
            copies.push(copies_per_byte(before, pair.copied(), len));
        }
    }
    let mut landed = match target {
        GpuMemory::Owned => {
            let mut landed = vec![0u8; len as usize];
            pair.receiver.read_region(pair.target.id, 0, &mut landed).expect("read_region");
            landed
        }
        GpuMemory::Slice => {
            // The receiver's slice comes back once the sender has left (its writes are over).
            let Pair { sender, receiver, target, .. } = pair;
            drop(sender);
            let until = Instant::now() + Duration::from_secs(10);
            let back = loop {
                match receiver.release(target.id) {
                    Ok(memory) => break memory,
                    Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                    Err(e) => return Err(format!("{id}: release: {e}")),
                }
            };
            let slice: CudaSlice<u8> = back.take().map_err(|_| "not the slice".to_string())?;
            stream.clone_dtoh(&slice).map_err(|e| e.to_string())?
        }
    };
    landed.truncate(len as usize);
    if landed[..] != expected[..len as usize] {
        return Err(format!("{id}: {} -> {}: bytes differ", source.name(), target.name()));
    }
    Ok(Measured { gbps: median(runs.clone()), runs, copies: median(copies) })
}

/// Transport-owned GPU memory on both sides against the application's `CudaSlice`s on both
/// sides, each on `ROUNDS` fresh connections in the order owned, slice, slice, owned, ... (a
/// machine whose rate drifts during the run then favours neither; a loopback TCP connection's
/// rate also varies more between connections than between the runs of one), then each mixed
/// pairing once, against an owned pair right before it.
fn gpu(id: &TransportId, args: &Args) -> Result<(Measured, Measured), String> {
    use GpuMemory::{Owned, Slice};
    const ROUNDS: usize = 4;
    let (mut owned, mut slices) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 { [Owned, Slice] } else { [Slice, Owned] };
        for memory in order {
            let measured = gpu_path(id, args, (memory, memory))?;
            if memory == Owned {
                owned.push(measured)
            } else {
                slices.push(measured)
            }
        }
    }
    let pooled = |measured: Vec<Measured>| {
        let runs: Vec<f64> = measured.iter().flat_map(|m| m.runs.iter().copied()).collect();
        Measured {
            gbps: median(runs.clone()),
            runs,
            copies: median(measured.iter().map(|m| m.copies).collect()),
        }
    };
    let (owned, slices) = (pooled(owned), pooled(slices));
    for mixed in [(Slice, Owned), (Owned, Slice)] {
        let next_to = gpu_path(id, args, (Owned, Owned))?;
        let measured = gpu_path(id, args, mixed)?;
        println!(
            "#   {} -> {}: {:.2} GB/s ({:.2} of owned -> owned just before it)",
            mixed.0.name(),
            mixed.1.name(),
            measured.gbps,
            measured.gbps / next_to.gbps
        );
    }
    Ok((owned, slices))
}

fn main() {
    let args = args();
    let mib = args.bytes >> 20;
    let (before, after) = if args.gpu { ("owned GPU", "CudaSlice") } else { ("copy in/out", "in place") };
    println!(
        "# {mib} MiB per transfer, {} runs per path, medians; copies = CPU bytes copied per payload byte",
        args.runs
    );
    println!(
        "{:<12} | {:>12} {:>7} | {:>12} {:>7} | {:>6}",
        "id", before, "copies", after, "copies", "ratio"
    );
    for id in &args.ids {
        let measured = if args.gpu { gpu(id, &args) } else { Ok(host(id, &args)) };
        match measured {
            Ok((copy, in_place)) => {
                println!(
                    "{:<12} | {:>7.3} GB/s {:>7.2} | {:>7.3} GB/s {:>7.2} | {:>6.2}",
                    id.to_string(),
                    copy.gbps,
                    copy.copies,
                    in_place.gbps,
                    in_place.copies,
                    in_place.gbps / copy.gbps
                );
                let show =
                    |runs: &[f64]| runs.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(" ");
                println!("#   runs GB/s: {before}: {}; {after}: {}", show(&copy.runs), show(&in_place.runs));
            }
            Err(e) => println!("{id:<12} | skipped: {e}"),
        }
    }
}
