//! The hint for every memory source of this machine, over the transport `Auto` picks and over
//! every transport the probe found.
//!
//! ```text
//! cargo run -p rdma-hint --example hint                  # staged (the default backend)
//! cargo run -p rdma-hint --features ucx --example hint   # UCX hints too
//! ```

use rdma_hint::probing::ProbeOptions;
use rdma_hint::{get_low_latency_rdma_size_hint, probe};

fn main() -> Result<(), rdma_hint::Error> {
    let report = probe(&ProbeOptions::default())?;
    for source in &report.sources {
        match get_low_latency_rdma_size_hint(source.id) {
            Ok(hint) => println!(
                "{}: {} B blocks, {} B aligned, over {} ({:?}): {:.2} GB/s, {:.1} µs predicted",
                source.id,
                hint.block_bytes,
                hint.align_bytes,
                hint.transport,
                hint.origin,
                hint.predicted_gbps,
                hint.predicted_latency_us
            ),
            Err(err) => println!("{}: no hint: {err}", source.id),
        }
    }
    for hint in &report.hints {
        println!("  {} over {}: {} B", hint.source, hint.transport, hint.block_bytes);
    }
    Ok(())
}
