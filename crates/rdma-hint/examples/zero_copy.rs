//! The application's own memory, sent and received in place: a host `Vec` it allocated and
//! filled goes out of that `Vec` into a `Vec` the receiving side allocated, with no
//! `write_region` or `read_region`; with `--gpu` (feature `cuda`, a GPU), a cudarc
//! `CudaSlice<u8>` into another `CudaSlice<u8>`. Both buffers come back from `release`.
//!
//! ```text
//! cargo run -p rdma-hint --example zero_copy -- staged:tcp
//! cargo run -p rdma-hint --example zero_copy -- staged:shm
//! cargo run -p rdma-hint --features ucx --example zero_copy -- ucx:shm
//! cargo run -p rdma-hint --features cuda --example zero_copy -- staged:shm --gpu
//! ```

use rdma_hint::engine::{Chunker, PostPolicy, TransferRequest};
use rdma_hint::{
    get_low_latency_rdma_size_hint_with, open, Arrival, BlockingTransport, CallerMemory, Device, OpenOptions,
    PeerEndpoint, Transport, TransportId, TransportSelector,
};
use std::time::{Duration, Instant};

const LEN: u64 = 8 << 20;

/// Connects `receiver` (exposing `target`) and `sender`, writes `LEN` bytes of `source` in the
/// hint's blocks and waits until the receiver saw them land.
fn send(
    id: &TransportId,
    device: Device,
    (sender, source): (&dyn Transport, rdma_hint::LocalRegion),
    (receiver, target): (&dyn Transport, rdma_hint::LocalRegion),
) -> Result<(), Box<dyn std::error::Error>> {
    let hint = get_low_latency_rdma_size_hint_with(device, &TransportSelector::Id(id.clone()))?;
    let address = receiver.bind("127.0.0.1:0".parse()?)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    std::thread::scope(|scope| {
        let receiving = scope.spawn(|| {
            receiver.connect_blocking(PeerEndpoint::Listen(address), &[target.id], deadline)?;
            let mut arrivals = [Arrival::EMPTY; 1];
            receiver.wait_arrivals_blocking(&mut arrivals, deadline).map(|_| ())
        });
        let remote = sender.connect_blocking(PeerEndpoint::Dial(address), &[], deadline)?[0];
        let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities())?;
        chunker.set_size_hint(&hint)?;
        let report = chunker.transfer_blocking(
            sender,
            TransferRequest::single(&source, 0, &remote, 0, LEN).notify(1),
            deadline,
        )?;
        receiving.join().expect("receiver thread")?;
        println!(
            "{id}: {LEN} B in {} blocks of {} B, from the sender's memory into the receiver's",
            report.blocks, hint.block_bytes
        );
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}

/// The transports' own copies so far, to show there were none in or out.
fn copies(sender: &dyn Transport, receiver: &dyn Transport) -> String {
    let (s, r) = (sender.copied_bytes(), receiver.copied_bytes());
    format!(
        "copied in/out: {} B / {} B; in transit: sender {} B, receiver {} B",
        s.write_region + r.write_region,
        s.read_region + r.read_region,
        s.in_transit,
        r.in_transit
    )
}

fn host(id: &TransportId) -> Result<(), Box<dyn std::error::Error>> {
    let options = OpenOptions::default().token(b"example token");
    let (sender, receiver) = (open(id, &options)?, open(id, &options)?);
    // Room for the padded tail block: a whole number of any alignment up to 1 MiB.
    let len = LEN as usize;
    let mine: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let source = sender.register_memory(CallerMemory::from(mine))?;
    let target = receiver.register_memory(CallerMemory::from(vec![0u8; len]))?;
    send(id, Device::Host(0), (&*sender, source), (&*receiver, target))?;
    let mut landed = false;
    let mut check = |bytes: &mut [u8]| landed = bytes.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8);
    // SAFETY: the sender writes nothing more after the write whose arrival `send` waited for.
    unsafe { receiver.domain().access_region_unchecked(target.id, &mut check) }?;
    assert!(landed, "every byte landed in the receiver's Vec");
    let mine: Vec<u8> = sender.release(source.id)?.take().map_err(|_| "not the Vec given")?;
    assert_eq!(mine.len(), len);
    println!("{}", copies(&*sender, &*receiver));
    Ok(())
}

#[cfg(feature = "cuda")]
fn gpu(id: &TransportId) -> Result<(), Box<dyn std::error::Error>> {
    use rdma_hint::staged::cudarc::driver::{CudaContext, CudaSlice};
    let stream = CudaContext::new(0)?.default_stream();
    let data: Vec<u8> = (0..LEN as usize).map(|i| (i % 253) as u8).collect();
    let options = OpenOptions::default().token(b"example token");
    let (sender, receiver) = (open(id, &options)?, open(id, &options)?);
    let source = sender.register_memory(rdma_hint::staged::cuda_slice_memory(stream.clone_htod(&data)?)?)?;
    let target = receiver
        .register_memory(rdma_hint::staged::cuda_slice_memory(stream.alloc_zeros::<u8>(data.len())?)?)?;
    // A kernel could fill the source in place through `sender.device_pointer(source.id)`.
    send(id, Device::Gpu(0), (&*sender, source), (&*receiver, target))?;
    let _mine: CudaSlice<u8> = sender.release(source.id)?.take().map_err(|_| "not the slice given")?;
    println!("{}", copies(&*sender, &*receiver));
    drop(sender); // the peer has left, so the receiver's slice is no longer exposed to it
    let until = Instant::now() + Duration::from_secs(10);
    let theirs: CudaSlice<u8> = loop {
        match receiver.release(target.id) {
            Ok(memory) => break memory.take().map_err(|_| "not the slice given")?,
            Err(rdma_hint::TransportError::RegionBusy { .. }) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => return Err(e.into()),
        }
    };
    assert!(stream.clone_dtoh(&theirs)? == data, "every byte landed in the receiver's CudaSlice");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let id: TransportId =
        args.iter().find(|a| !a.starts_with("--")).map_or("staged:tcp", |a| a.as_str()).parse()?;
    if args.iter().any(|a| a == "--gpu") {
        #[cfg(feature = "cuda")]
        return gpu(&id);
        #[cfg(not(feature = "cuda"))]
        return Err("--gpu needs the `cuda` feature".into());
    }
    host(&id)
}
