//! 16 pairs at once, 32 MiB each, through `rdma_hint::open` under a tokio multi-thread runtime
//! with 2 workers, for every backend this build can run, while a 1 ms sleep loop on the same
//! runtime measures how late it wakes: a connect or a wait that blocked a worker would show up
//! there. Every byte that landed is compared with what was sent.

use rdma_hint_embedder::{ids, Pair};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn sixteen_concurrent_pairs_move_verified_bytes_without_stalling_the_runtime() {
    let pairs = env_or("RDMA_HINT_EMBEDDER_PAIRS", 16) as u32;
    let len = env_or("RDMA_HINT_EMBEDDER_BYTES", 32 << 20);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for id in ids() {
        // Set-up before the clock runs, as an embedder does at start-up: discovery (the first
        // hint), opening, registering and filling memory are synchronous calls.
        let prepared: Vec<Arc<Pair>> = (0..pairs)
            .map(|pair| Arc::new(Pair::prepare(&id, pair, len).unwrap_or_else(|e| panic!("{e}"))))
            .collect();
        let (late, blocks, elapsed) = runtime.block_on(async {
            let stop = Arc::new(AtomicBool::new(false));
            let ticker = tokio::spawn({
                let stop = stop.clone();
                async move {
                    let mut worst = Duration::ZERO;
                    while !stop.load(Ordering::Relaxed) {
                        let asked = Instant::now();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        worst = worst.max(asked.elapsed().saturating_sub(Duration::from_millis(1)));
                    }
                    worst
                }
            });
            let started = Instant::now();
            let transfers: Vec<_> = prepared
                .iter()
                .map(|pair| {
                    let pair = pair.clone();
                    tokio::spawn(async move { pair.run().await })
                })
                .collect();
            let mut blocks = 0;
            for transfer in transfers {
                blocks += transfer.await.expect("task").unwrap_or_else(|e| panic!("{e}"));
            }
            let elapsed = started.elapsed();
            stop.store(true, Ordering::Relaxed);
            (ticker.await.expect("ticker"), blocks, elapsed)
        });
        for pair in &prepared {
            pair.verify().unwrap_or_else(|e| panic!("{e}"));
        }
        println!(
            "{id}: {pairs} pairs × {len} B verified in {:.2} s ({blocks} blocks); 1 ms ticker late by at most {:.1} ms",
            elapsed.as_secs_f64(),
            late.as_secs_f64() * 1e3
        );
        assert!(late < Duration::from_millis(50), "{id}: the 1 ms ticker was {late:?} late");
    }
}
