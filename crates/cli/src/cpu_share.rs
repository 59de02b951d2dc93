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

    /// Idle reads near zero; another thread spinning on another core is counted (the share
    /// once read from `schedstat` per transfer missed it or multiplied it), and no reading
    /// exceeds the cores there are.
    #[test]
    fn another_threads_work_is_counted_and_no_share_exceeds_the_cores() {
        let idle = share_while(|| -> Result<(), ()> {
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        })
        .unwrap();
        assert!(idle < 0.1, "sleeping read {idle}");
        let stop = AtomicBool::new(false);
        let share = std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
            let share = share_while(|| -> Result<(), ()> {
                std::thread::sleep(Duration::from_micros(50));
                Ok(())
            });
            stop.store(true, Ordering::Relaxed);
            share.unwrap()
        });
        // Under load the spinning thread gets less than a core, never more than the machine.
        assert!(share > 0.2 && share <= cores() * 1.1, "a spinning thread read as {share} cores");
    }
}
