//! A wait for a peer that never answers costs next to no CPU in `Adaptive` mode (it sleeps on
//! its event until the deadline) and ends at the deadline with a typed error; `BusyPoll` is
//! the mode that spins.

use rdma_hint::{
    open, Arrival, BlockingTransport, MemoryKind, OpenOptions, PeerEndpoint, Transport, TransportError,
    WaitMode,
};
use rdma_hint_embedder::ids;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// CPU is measured for the whole process: the two tests must not overlap.
static ALONE: Mutex<()> = Mutex::new(());

/// CPU seconds the live threads of this process have run: the scheduler's nanosecond run time
/// of each (`/proc/self/task/*/schedstat`), not tick samples, which an emulated guest skews.
fn cpu_seconds() -> f64 {
    let run_ns: Vec<f64> = std::fs::read_dir("/proc/self/task")
        .expect("tasks")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<f64>().ok())
        .collect();
    assert!(!run_ns.is_empty(), "no /proc/self/task/*/schedstat: cannot measure CPU here");
    run_ns.iter().sum::<f64>() / 1e9
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

/// Waits 2 s for an arrival the (connected, idle) peer never sends; returns the CPU share of
/// one core the whole process burnt meanwhile.
fn cpu_while_waiting(receiver: &dyn Transport) -> f64 {
    let mut arrivals = [Arrival::EMPTY; 4];
    let (cpu, wall) = (cpu_seconds(), Instant::now());
    let result = receiver.wait_arrivals_blocking(&mut arrivals, Instant::now() + Duration::from_secs(2));
    let share = (cpu_seconds() - cpu) / wall.elapsed().as_secs_f64();
    assert!(matches!(result, Err(TransportError::DeadlineExceeded { .. })), "{result:?}");
    assert!(wall.elapsed() >= Duration::from_secs(2) && wall.elapsed() < Duration::from_secs(4));
    share
}

#[test]
fn adaptive_waits_for_a_silent_peer_burn_under_five_percent_of_a_core() {
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for id in ids() {
        let (_sender, receiver) = connected(&id, WaitMode::Adaptive);
        let share = cpu_while_waiting(&*receiver);
        println!("{id}: adaptive wait for a silent peer used {:.1} % of a core over 2 s", share * 100.0);
        assert!(share < 0.05, "{id}: {:.1} % of a core", share * 100.0);
    }
}

#[test]
fn busy_poll_waits_spin_until_the_deadline() {
    // The contrast that shows the measurement above can fail: BusyPoll burns most of a core.
    let _alone = ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let id = rdma_hint::TransportId::STAGED_TCP;
    let (_sender, receiver) = connected(&id, WaitMode::BusyPoll);
    let share = cpu_while_waiting(&*receiver);
    println!("{id}: busy-poll wait used {:.1} % of a core over 2 s", share * 100.0);
    assert!(share > 0.5, "busy-poll used only {:.1} % of a core", share * 100.0);
}
