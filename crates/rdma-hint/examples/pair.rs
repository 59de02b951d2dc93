//! Two tasks exchange a verified buffer through `rdma_hint::open`, under tokio: the receiver
//! listens, the sender dials (both `connect`s joined in one task), the chunker writes 8 MiB in
//! the hint's blocks and the receiver's `wait_arrivals` learns that every byte landed.
//!
//! ```text
//! cargo run -p rdma-hint --example pair -- staged:tcp
//! cargo run -p rdma-hint --example pair -- staged:shm
//! cargo run -p rdma-hint --features ucx --example pair -- ucx:shm
//! ```
//!
//! Changing the backend is the cargo feature and the id; nothing else.

use rdma_hint::engine::{Chunker, PostPolicy, TransferRequest};
use rdma_hint::{
    get_low_latency_rdma_size_hint_with, open, Arrival, Device, MemoryKind, OpenOptions, PeerEndpoint,
    TransportId, TransportSelector,
};
use std::time::{Duration, Instant};

const LEN: u64 = 8 << 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let id: TransportId = std::env::args().nth(1).unwrap_or_else(|| "staged:tcp".into()).parse()?;
    let hint = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone()))?;
    println!("{id}: {} B blocks, {} B aligned ({:?})", hint.block_bytes, hint.align_bytes, hint.origin);

    let options = OpenOptions::default().token(b"example token");
    let (sender, receiver) = (open(&id, &options)?, open(&id, &options)?);
    let source = sender.register(MemoryKind::Host, LEN)?;
    let target = receiver.register(MemoryKind::Host, LEN)?;
    let payload: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    sender.write_region(source.id, 0, &payload)?;
    let address = receiver.bind("127.0.0.1:0".parse()?)?;
    let deadline = Instant::now() + Duration::from_secs(30);

    let exposed = [target.id];
    let (accepted, dialled) = tokio::join!(
        receiver.connect(PeerEndpoint::Listen(address), &exposed, deadline),
        sender.connect(PeerEndpoint::Dial(address), &[], deadline),
    );
    accepted?;
    let remote = dialled?[0];

    let mut chunker = Chunker::new(PostPolicy::default(), sender.capabilities())?;
    chunker.set_size_hint(&hint)?;
    let mut arrivals = [Arrival::EMPTY; 4];
    let started = Instant::now();
    let (written, arrived) = tokio::join!(
        chunker.transfer(&*sender, TransferRequest::single(&source, 0, &remote, 0, LEN).notify(42), deadline),
        receiver.wait_arrivals(&mut arrivals, deadline),
    );
    let delivered = written?;
    arrived?;
    let elapsed = started.elapsed();

    let mut landed = vec![0u8; LEN as usize];
    receiver.read_region(target.id, 0, &mut landed)?;
    assert_eq!(arrivals[0].imm, 42, "the arrival carries the immediate");
    assert!(landed == payload, "the bytes that arrived differ from those sent");
    println!(
        "{} B in {} blocks, {:.2} ms ({:.2} GB/s); bytes verified",
        delivered.bytes,
        delivered.blocks,
        elapsed.as_secs_f64() * 1e3,
        LEN as f64 / elapsed.as_secs_f64() / 1e9
    );
    Ok(())
}
