//! What the embedder's tokio tests share: the 1 ms ticker that measures how late a runtime
//! wakes a sleeper, and the longest poll of a task.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a 1 ms ticker saw: the most a sleep overran, and when each sleep ended.
pub struct Ticks {
    pub worst: Duration,
    ends: Vec<Instant>,
}

impl Ticks {
    /// Sleeps that ended at `at` or later.
    #[allow(dead_code)] // each test binary compiles this module; tokio.rs judges the worst alone
    pub fn since(&self, at: Instant) -> usize {
        self.ends.iter().filter(|end| **end >= at).count()
    }
}

/// Sleeps 1 ms at a time until `stop`.
pub async fn tick(stop: Arc<AtomicBool>) -> Ticks {
    let mut ticks = Ticks { worst: Duration::ZERO, ends: Vec::new() };
    while !stop.load(Ordering::Relaxed) {
        let asked = Instant::now();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let end = Instant::now();
        ticks.worst = ticks.worst.max(end.duration_since(asked).saturating_sub(Duration::from_millis(1)));
        ticks.ends.push(end);
    }
    ticks
}

/// Whether a runtime's ticker slept and woke at least half as often as the same ticker on a
/// runtime of its own since `at`: workers that something blocked wake nobody, and both
/// tickers share whatever load the machine is under, so the verdict does not hang on how
/// fast the machine is at that moment (a bound on lateness did: beside two busy loops and a
/// build, 47 ms against 20 ms on the runtime of its own).
#[allow(dead_code)]
pub fn woke_freely(ours: &Ticks, theirs: &Ticks, at: Instant) -> bool {
    2 * ours.since(at) >= theirs.since(at)
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
