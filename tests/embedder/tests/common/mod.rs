//! What the embedder's tokio tests share: the 1 ms ticker that measures how late a runtime
//! wakes a sleeper, and the longest poll of a task.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sleeps 1 ms at a time until `stop`; returns the most a sleep overran.
pub async fn tick(stop: Arc<AtomicBool>) -> Duration {
    let mut worst = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        let asked = Instant::now();
        tokio::time::sleep(Duration::from_millis(1)).await;
        worst = worst.max(asked.elapsed().saturating_sub(Duration::from_millis(1)));
    }
    worst
}

/// Runs `future`, returning its output and the longest single poll it took (wall time, so an
/// oversubscribed CPU shows up too).
#[allow(dead_code)] // each test binary compiles this module; first_hint.rs needs the ticker only
pub async fn longest_poll<F: std::future::Future>(future: F) -> (F::Output, Duration) {
    let mut future = std::pin::pin!(future);
    let mut longest = Duration::ZERO;
    let output = std::future::poll_fn(|cx| {
        let started = Instant::now();
        let poll = future.as_mut().poll(cx);
        longest = longest.max(started.elapsed());
        poll
    })
    .await;
    (output, longest)
}
