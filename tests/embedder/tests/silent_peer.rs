//! A wait for a peer that never answers costs next to no CPU in `Adaptive` mode (it sleeps on
//! its event until the deadline) and ends at the deadline with a typed error; `BusyPoll` is
//! the mode that spins.

use rdma_hint::transport::WaitMode;
use rdma_hint::{
    open, Arrival, BlockingTransport, MemoryKind, OpenOptions, PeerEndpoint, Transport, TransportError,
};
use rdma_hint_embedder::ids;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// CPU is measured for the whole process: the two tests must not overlap.
static ALONE: Mutex<()> = Mutex::new(());

/// Nanoseconds each live thread of this process has run, by thread id, with its name: the
/// scheduler's run time (`/proc/self/task/*/schedstat`), not tick samples, which an emulated
/// guest skews.
fn run_time_by_thread() -> BTreeMap<String, (String, u64)> {
    let threads: BTreeMap<String, (String, u64)> = std::fs::read_dir("/proc/self/task")
        .expect("tasks")
        .filter_map(|task| {
            let path = task.ok()?.path();
            let stat = std::fs::read_to_string(path.join("schedstat")).ok()?;
            let run_ns = stat.split_whitespace().next()?.parse::<u64>().ok()?;
            let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default().trim().to_string();
            Some((path.file_name()?.to_string_lossy().into_owned(), (name, run_ns)))
        })
        .collect();
    assert!(!threads.is_empty(), "no /proc/self/task/*/schedstat: cannot measure CPU here");
    threads
}

/// CPU seconds the threads of `after` ran since `before` (a thread born meanwhile counts
/// whole), and the busiest threads as "name: ms" for a failure message.
fn cpu_between(
    before: &BTreeMap<String, (String, u64)>,
    after: &BTreeMap<String, (String, u64)>,
) -> (f64, String) {
    let mut used: Vec<(u64, &str)> = after
        .iter()
        .map(|(tid, (name, run_ns))| {
            (run_ns - before.get(tid).map_or(0, |(_, ns)| *ns).min(*run_ns), name.as_str())
        })
        .collect();
    used.sort_unstable_by(|a, b| b.cmp(a));
    let busiest = used.iter().take(4).map(|(ns, name)| format!("{name}: {:.1} ms", *ns as f64 / 1e6));
    (used.iter().map(|(ns, _)| *ns).sum::<u64>() as f64 / 1e9, busiest.collect::<Vec<_>>().join(", "))
}

fn connected(id: &rdma_hint::TransportId, mode: WaitMode) -> (Box<dyn Transport>, Box<dyn Transport>) {
    let options = OpenOptions::default().token(b"embedder").wait_mode(mode);
    let (sender, receiver) = (open(id, &options).unwrap(), open(id, &options).unwrap());
    let target = receiver.register(MemoryKind::Host, 1 << 20).unwrap();
    let address = receiver.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let accepting = std::thread::spawn(move || {
        receiver.connect_blocking(PeerEndpoint::Listen(address), &[target.id], deadline).unwrap();
        receiver
    });
    sender.connect_blocking(PeerEndpoint::Dial(address), &[], deadline).unwrap();
    let receiver = accepting.join().unwrap();
    // Let the connect's helper threads finish before anything is measured.
    std::thread::sleep(Duration::from_millis(100));
    (sender, receiver)
}

/// Waits `window` for an arrival the (connected, idle) peer never sends; returns the CPU share
/// of one core the whole process burnt meanwhile, and its busiest threads.
fn cpu_while_waiting(receiver: &dyn Transport, window: Duration) -> (f64, String) {
    let mut arrivals = [Arrival::EMPTY; 4];
    let (before, wall) = (run_time_by_thread(), Instant::now());
    let result = receiver.wait_arrivals_blocking(&mut arrivals, Instant::now() + window);
    let elapsed = wall.elapsed();
    let (cpu, busiest) = cpu_between(&before, &run_time_by_thread());
    assert!(matches!(result, Err(TransportError::DeadlineExceeded { .. })), "{result:?}");
    assert!(elapsed >= window && elapsed < window * 2, "a {window:?} wait took {elapsed:?}");
    (cpu / elapsed.as_secs_f64(), busiest)
}

/// The median share of three waits of 2 s each: one hiccup of a shared host (a guest's vCPU
/// descheduled while it wakes) is not the wait's cost.
fn median_cpu_while_waiting(receiver: &dyn Transport) -> (f64, String) {
    let mut runs: Vec<(f64, String)> =
        (0..3).map(|_| cpu_while_waiting(receiver, Duration::from_secs(2))).collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs.swap_remove(1)
}

#[test]
fn adaptive_waits_for_a_silent_peer_burn_under_five_percent_of_a_core() {
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for id in ids() {
        let (_sender, receiver) = connected(&id, WaitMode::Adaptive);
        let (share, busiest) = median_cpu_while_waiting(&*receiver);
        println!(
            "{id}: adaptive waits for a silent peer used {:.1} % of a core (median of 3 waits of 2 s; {busiest})",
            share * 100.0
        );
        assert!(share < 0.05, "{id}: {:.1} % of a core ({busiest})", share * 100.0);
    }
}

/// Nanoseconds the calling thread has run (`/proc/thread-self/schedstat`).
fn own_run_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    stat.split_whitespace().next().and_then(|ns| ns.parse().ok()).expect("run time")
}

#[test]
fn busy_poll_waits_spin_until_the_deadline() {
    // The contrast that shows the measurement above can fail: a BusyPoll wait runs whenever the
    // scheduler lets it, as a plain spin loop beside it does. Compared with that loop, not with
    // a whole core: a busy machine gives both less, and the verdict must not depend on it.
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let id = rdma_hint::TransportId::STAGED_TCP;
    let (_sender, receiver) = connected(&id, WaitMode::BusyPoll);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (waiter, reference) = std::thread::scope(|scope| {
        let spinning = scope.spawn(|| {
            let (start, wall) = (own_run_ns(), Instant::now());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            (own_run_ns() - start) as f64 / 1e9 / wall.elapsed().as_secs_f64()
        });
        let mut arrivals = [Arrival::EMPTY; 4];
        let (start, wall) = (own_run_ns(), Instant::now());
        let result = receiver.wait_arrivals_blocking(&mut arrivals, Instant::now() + Duration::from_secs(2));
        let waiter = (own_run_ns() - start) as f64 / 1e9 / wall.elapsed().as_secs_f64();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(matches!(result, Err(TransportError::DeadlineExceeded { .. })), "{result:?}");
        (waiter, spinning.join().expect("the spinning thread"))
    });
    println!(
        "{id}: a busy-poll wait ran {:.1} % of a core, a spin loop beside it {:.1} %",
        waiter * 100.0,
        reference * 100.0
    );
    assert!(
        waiter > reference / 2.0,
        "a busy-poll wait ran {:.1} % of a core where a spin loop ran {:.1} %",
        waiter * 100.0,
        reference * 100.0
    );
}
