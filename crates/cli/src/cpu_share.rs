//! The process's CPU share while a path moves data: sweep's CPU column and its "CPU copy
//! suspected" flag.
//!
//! Read from the process CPU clock (`CLOCK_PROCESS_CPUTIME_ID`: every thread, exited ones
//! included, in nanoseconds) over one interval of at least [`WINDOW`]. The clock is exact for
//! the thread that reads it, but a thread running on another core is counted only up to its
//! last scheduler tick (the kernel does not bring it up to date for the read; per-thread
//! `schedstat` is as stale). Over one transfer of tens of microseconds that read 0 % or
//! thousands of percent (1258–12812 % of one core at 1 MiB on 2 cores); over a quarter of a
//! second, a tick of each of a few threads is a few percent.

use std::time::{Duration, Instant};

/// The shortest interval a CPU share is read over.
pub(crate) const WINDOW: Duration = Duration::from_millis(250);

/// CPU time the whole process has used, in seconds.
fn process_cpu_s() -> f64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

/// Runs `work` back to back (at least once) until [`WINDOW`] has passed, and answers the share
/// of one core the process used meanwhile (1.0: one core busy throughout), or `work`'s error.
pub(crate) fn share_while<E>(mut work: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    let (cpu, started) = (process_cpu_s(), Instant::now());
    loop {
        work()?;
        if started.elapsed() >= WINDOW {
            break;
        }
    }
    let used = (process_cpu_s() - cpu).max(0.0);
    Ok(used / started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn cores() -> f64 {
        std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
    }

    /// Idle reads near zero; another thread's work is counted (the share once read from
    /// `schedstat` per transfer missed it or multiplied it), and no reading exceeds the cores
    /// there are. The other thread does a fixed amount of CPU work (by its own thread clock),
    /// and the window lasts until it is done: the verdict holds however busy the machine is.
    #[test]
    fn another_threads_work_is_counted_and_no_share_exceeds_the_cores() {
        let idle = share_while(|| -> Result<(), ()> {
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        })
        .unwrap();
        assert!(idle < 0.1, "sleeping read {idle}");
        let thread_cpu_s = || {
            let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
            now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
        };
        const WORK_S: f64 = 0.05;
        let done = AtomicBool::new(false);
        let started = Instant::now();
        let share = std::thread::scope(|scope| {
            scope.spawn(|| {
                let start = thread_cpu_s();
                while thread_cpu_s() - start < WORK_S {
                    std::hint::spin_loop();
                }
                done.store(true, Ordering::Release);
            });
            share_while(|| -> Result<(), ()> {
                // Long sleeps: this thread's own wake-ups stay far below the other's work.
                while !done.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                std::thread::sleep(Duration::from_millis(5));
                Ok(())
            })
            .unwrap()
        });
        // The share times the window is the CPU read meanwhile, at least the other thread's
        // work less a scheduler tick of staleness (the outer clock's wall time bounds the window).
        let counted_s = share * started.elapsed().as_secs_f64();
        assert!(counted_s >= WORK_S / 2.0, "{WORK_S} s of another thread's work read as {counted_s} s");
        assert!(share <= cores() * 1.1, "a share of {share} cores exceeds the {} there are", cores());
    }
}
