//! What the embedder's tokio tests share: the 1 ms ticker that measures how late a runtime
//! wakes a sleeper.

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
