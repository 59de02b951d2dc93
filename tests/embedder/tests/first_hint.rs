//! The first hint of a process, asked by 16 tokio tasks on 2 workers right before their
//! transfers: discovery (sysfs, and the CUDA driver's start where there is one) runs off the
//! executor (`rdma_hint::hint(..).await`), so a 1 ms ticker on the same runtime wakes about as
//! often as the same ticker on a runtime of its own while the hints are asked (at least half
//! as often: blocked workers wake it not at all). The transfers that follow load both cores
//! with 16 pairs' threads and are not what is judged. On the 2-core machine the blocking hint
//! holds the ticker 34-38 ms against 4-5 ms on its own runtime, the async one 2.6-2.7 ms.
//! Alone in its file: the process must not have discovered the machine before.
//! `RDMA_HINT_EMBEDDER_SYNC_HINT=1` asks the blocking `get_low_latency_rdma_size_hint_with`
//! instead and asserts the opposite: the detector sees workers blocked by discovery.

mod common;
use common::{tick, woke_freely};
use rdma_hint::{get_low_latency_rdma_size_hint_with, hint, Device, TransportSelector};
use rdma_hint_embedder::{ids, Pair};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TASKS: u32 = 16;

#[test]
fn the_first_hint_is_discovered_off_the_executor() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let baseline_runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let baseline = baseline_runtime.handle().clone();
    let id = ids().into_iter().next().expect("a transport this build runs");
    let blocking = std::env::var_os("RDMA_HINT_EMBEDDER_SYNC_HINT").is_some();
    let (ours, theirs, started, first_hint) = runtime.block_on(async {
        // Set once every task has its hint: the tickers judge the discovery, not the transfers.
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU32::new(0));
        let ticker = tokio::spawn(tick(stop.clone()));
        let baseline = baseline.spawn(tick(stop.clone()));
        // Let both tickers start before the first hint is asked.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let (id, stop, answered) = (id.clone(), stop.clone(), answered.clone());
                tokio::spawn(async move {
                    let selector = TransportSelector::Id(id.clone());
                    let hint = if blocking {
                        get_low_latency_rdma_size_hint_with(Device::Host(0), &selector)
                    } else {
                        hint(Device::Host(0), &selector).await
                    };
                    let hinted = started.elapsed();
                    if answered.fetch_add(1, Ordering::AcqRel) + 1 == TASKS {
                        stop.store(true, Ordering::Relaxed);
                    }
                    let hint = hint.map_err(|e| format!("task {task}: hint: {e}"))?;
                    assert!(hint.block_bytes > 0 && hint.block_bytes % hint.align_bytes == 0);
                    // Opening, registering and filling are synchronous: off the workers, as a
                    // tokio embedder runs blocking set-up.
                    let pair = tokio::task::spawn_blocking(move || Pair::prepare(&id, task, 1 << 20))
                        .await
                        .expect("prepare")?;
                    pair.run().await?;
                    pair.verify()?;
                    Ok::<_, String>(hinted)
                })
            })
            .collect();
        let mut first_hint = Duration::MAX;
        for task in tasks {
            first_hint = first_hint.min(task.await.expect("task").unwrap_or_else(|e| panic!("{e}")));
        }
        (ticker.await.expect("ticker"), baseline.await.expect("baseline"), started, first_hint)
    });
    let free = woke_freely(&ours, &theirs, started);
    println!(
        "{id}, {} hint: {TASKS} tasks asked for the first hint (answered after {:.1} ms); meanwhile a 1 ms ticker woke {} times, late by at most {:.1} ms (on a runtime of its own: {} times, {:.1} ms)",
        if blocking { "blocking" } else { "async" },
        first_hint.as_secs_f64() * 1e3,
        ours.since(started),
        ours.worst.as_secs_f64() * 1e3,
        theirs.since(started),
        theirs.worst.as_secs_f64() * 1e3
    );
    if std::env::var_os("RDMA_HINT_EMBEDDER_SOFTWARE_NIC").is_some() {
        println!("reported, not asserted (emulated CPU)");
    } else if blocking {
        assert!(!free, "the blocking hint did not hold the runtime's workers: the detector sees nothing");
    } else {
        assert!(free, "the runtime's ticker woke less than half as often as on its own runtime: discovery blocked a worker");
    }
}
