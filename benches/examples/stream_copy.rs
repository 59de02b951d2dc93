//! The shared-memory backends' copy into a peer's mapping: plain (`memcpy`, what they did
//! before) against streaming stores (`rdma_hint_stream_copy`), 64 MiB walked in pieces of
//! 16 KiB and of 1 MiB, the destination never read in between (as a peer's region that
//! outgrows the cache). Prints GB/s per piece size, the median of `--passes` passes after a
//! warm one. Run it in several processes: on a VM the plain copy's level moves from one
//! process to the next.
//!
//! `cargo build --release -p rdma-hint-benches --example stream_copy &&
//!  for run in 1 2 3 4 5; do target/release/examples/stream_copy; done`
#![forbid(unsafe_code)]

use rdma_hint_benches::flags::Flags;
use rdma_hint_stream_copy::{copy_slice, fence};
use std::time::Instant;

const REGION_BYTES: usize = 64 << 20;
const PIECES: [usize; 2] = [16 << 10, 1 << 20];

fn main() {
    let mut given = Flags::from_env("usage: stream_copy [--passes N] (1..=100, default 9)");
    let passes: usize = match given.next_arg().as_deref() {
        None => 9,
        Some("--passes") => given.value("--passes"),
        Some(other) => given.fail(&format!("unknown argument {other}")),
    };
    if !(1..=100).contains(&passes) {
        given.fail("--passes takes 1..=100");
    }
    let source: Vec<u8> = (0..REGION_BYTES).map(|i| (i % 251) as u8).collect();
    let mut target = vec![0u8; REGION_BYTES];
    let mut line = String::new();
    for stream in [false, true] {
        for piece in PIECES {
            let mut rates: Vec<f64> = (0..=passes)
                .map(|_| {
                    let started = Instant::now();
                    for (from, to) in source.chunks(piece).zip(target.chunks_mut(piece)) {
                        copy_slice(from, to, stream);
                    }
                    // Once per pass, as the backends fence once per announced batch.
                    fence();
                    REGION_BYTES as f64 / started.elapsed().as_secs_f64() / 1e9
                })
                .skip(1)
                .collect();
            assert!(source == target, "the copy lost bytes");
            target.fill(0);
            rates.sort_by(f64::total_cmp);
            let kind = if stream { "streamed" } else { "memcpy" };
            line += &format!("{kind} {} KiB {:5.2} GB/s   ", piece >> 10, rates[rates.len() / 2]);
        }
    }
    println!("{}", line.trim_end());
}
