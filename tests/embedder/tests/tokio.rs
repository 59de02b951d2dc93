//! 16 pairs at once, 32 MiB each, through `rdma_hint::open` under a tokio multi-thread runtime
//! with 2 workers, for every backend this build can run. Every poll of a pair's task is timed:
//! a connect or a wait that blocked a worker holds one poll for its deadline or its peer. A 1 ms
//! sleep loop on the same runtime (and one on a runtime of its own) reports how late it woke.
//! Every byte that landed is compared with what was sent.

mod common;
use common::{longest_poll, tick};
use rdma_hint_embedder::{ids, Pair};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Worker threads of the runtime under test.
const WORKERS: u32 = 2;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn sixteen_concurrent_pairs_move_verified_bytes_without_stalling_the_runtime() {
    let pairs = env_or("RDMA_HINT_EMBEDDER_PAIRS", 16) as u32;
    let len = env_or("RDMA_HINT_EMBEDDER_BYTES", 32 << 20);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS as usize)
        .enable_all()
        .build()
        .unwrap();
    let baseline_runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let baseline = baseline_runtime.handle();
    // In the Soft-RoCE VM (RDMA_HINT_EMBEDDER_SOFTWARE_NIC set) the CPU is emulated and the NIC
    // is the kernel: one `ibv_post_send` does the NIC's work (~14 ms per doorbell there) and
    // starting a thread takes tens of ms, so the bound on a poll cannot hold and is reported,
    // not asserted; bytes and joined connects still are. The sharp test that waits
    // sleep there is silent_peer.rs (CPU of an adaptive wait, run in the VM too).
    let software_nic = std::env::var_os("RDMA_HINT_EMBEDDER_SOFTWARE_NIC").is_some();
    for id in ids() {
        // Set-up before the clock runs, as an embedder does at start-up: discovery (the first
        // hint), opening, registering and filling memory are synchronous calls.
        let prepared: Vec<Arc<Pair>> = (0..pairs)
            .map(|pair| Arc::new(Pair::prepare(&id, pair, len).unwrap_or_else(|e| panic!("{e}"))))
            .collect();
        let (late, machine, blocks, elapsed, longest) = runtime.block_on(async {
            let stop = Arc::new(AtomicBool::new(false));
            let ticker = tokio::spawn(tick(stop.clone()));
            // The same ticker on a runtime of its own: how late the machine itself (CPU load,
            // a software NIC in the kernel) makes a sleeper, whatever the library does.
            let baseline = baseline.spawn(tick(stop.clone()));
            let started = Instant::now();
            let transfers: Vec<_> = prepared
                .iter()
                .map(|pair| {
                    let pair = pair.clone();
                    tokio::spawn(async move { longest_poll(pair.run()).await })
                })
                .collect();
            let (mut blocks, mut longest) = (0, Duration::ZERO);
            for transfer in transfers {
                let (result, poll) = transfer.await.expect("task");
                blocks += result.unwrap_or_else(|e| panic!("{e}"));
                longest = longest.max(poll);
            }
            let elapsed = started.elapsed();
            stop.store(true, Ordering::Relaxed);
            let baseline = baseline.await.expect("baseline ticker").worst;
            (ticker.await.expect("ticker").worst, baseline, blocks, elapsed, longest)
        });
        for pair in &prepared {
            pair.verify().unwrap_or_else(|e| panic!("{e}"));
        }
        let longest_post = prepared.iter().map(|p| p.longest_post()).max().unwrap_or_default();
        println!(
            "{id}: {pairs} pairs × {len} B verified in {:.2} s ({blocks} blocks); 1 ms ticker late by at most {:.1} ms (on a runtime of its own: {:.1} ms); longest poll of a pair's task {:.1} ms, longest post_writes {:.1} ms",
            elapsed.as_secs_f64(),
            late.as_secs_f64() * 1e3,
            machine.as_secs_f64() * 1e3,
            longest.as_secs_f64() * 1e3,
            longest_post.as_secs_f64() * 1e3
        );
        if software_nic {
            println!("{id}: the longest poll reported, not asserted (software NIC on an emulated CPU)");
        } else {
            // 1 s: a wait or a handshake that blocked a worker holds its poll for its deadline or
            // its peer (seconds), far past this. A poll that is not blocking stays under it
            // however busy the machine: beside two busy loops, a build and a profiler, the
            // longest was 113 ms. The ticker's lateness is not the verdict: it waits behind every
            // task's poll on the two workers, so it grows with tasks times load (1.65 s there,
            // with no poll longer than 113 ms).
            assert!(longest < Duration::from_secs(1), "{id}: a poll of a pair's task took {longest:?}");
        }
    }
}
