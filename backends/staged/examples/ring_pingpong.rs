//! The shm ring's own cost: half the round trip of an announcement ping-pong between two
//! threads through two [`OwnedRing`]s (publish, take, decode, admit), beside the floor of
//! one cache line bounced between the same two threads. Alternating runs; medians in µs.
//!
//! ```text
//! cargo run --release -p rdma-hint-staged --example ring_pingpong [ROUNDS] [RUNS]
//! ```

use rdma_hint_staged::protocol::Inbox;
use rdma_hint_staged::ring::{publish, take, Consumer, OwnedRing, Producer};
use rdma_hint_staged::wire::{ChannelKind, Frame, FrameKind, FLAG_IMM, FLAG_PLACED};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

fn announcement(imm: u32) -> Frame {
    Frame {
        kind: FrameKind::Write,
        flags: FLAG_PLACED | FLAG_IMM,
        status: 0,
        region: 0,
        offset: 0,
        len: 8,
        wr_id: 0,
        imm,
    }
}

/// Half the round trip of `rounds` bounces of one word (µs).
fn raw_line(rounds: u64) -> f64 {
    let line = AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for round in 0..rounds {
                while line.load(Ordering::Acquire) != 2 * round + 1 {}
                line.store(2 * round + 2, Ordering::Release);
            }
        });
        let started = Instant::now();
        for round in 0..rounds {
            line.store(2 * round + 1, Ordering::Release);
            while line.load(Ordering::Acquire) != 2 * round + 2 {}
        }
        started.elapsed().as_secs_f64() * 1e6 / rounds as f64 / 2.0
    })
}

/// Takes exactly one announcement off `ring`.
fn take_one(consumer: &mut Consumer, ring: &OwnedRing, inbox: &Inbox) {
    while take(consumer, &ring.view(), inbox, 1, |_| Ok(())).expect("a well-formed ring") == 0 {
        std::hint::spin_loop();
    }
}

/// Half the round trip of `rounds` announcements each way (µs).
fn ring(rounds: u64) -> f64 {
    let (there, back) = (OwnedRing::default(), OwnedRing::default());
    let inbox = || Inbox::new(ChannelKind::Shm, &[(0, 4096)], 1 << 20);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let (mut producer, mut consumer, inbox) = (Producer::default(), Consumer::default(), inbox());
            for _ in 0..rounds {
                take_one(&mut consumer, &there, &inbox);
                assert!(publish(&mut producer, &back.view(), &announcement(2)).expect("room"));
            }
        });
        let (mut producer, mut consumer, inbox) = (Producer::default(), Consumer::default(), inbox());
        let started = Instant::now();
        for _ in 0..rounds {
            assert!(publish(&mut producer, &there.view(), &announcement(1)).expect("room"));
            take_one(&mut consumer, &back, &inbox);
        }
        started.elapsed().as_secs_f64() * 1e6 / rounds as f64 / 2.0
    })
}

/// One thread publishing and taking in turn: the ring's instructions alone (µs per pair).
fn one_thread(rounds: u64) -> f64 {
    let ring_ = OwnedRing::default();
    let inbox = Inbox::new(ChannelKind::Shm, &[(0, 4096)], 1 << 20);
    let (mut producer, mut consumer) = (Producer::default(), Consumer::default());
    let started = Instant::now();
    for _ in 0..rounds {
        assert!(publish(&mut producer, &ring_.view(), &announcement(1)).expect("room"));
        take_one(&mut consumer, &ring_, &inbox);
    }
    started.elapsed().as_secs_f64() * 1e6 / rounds as f64
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1).map(|arg| arg.parse::<u64>().expect("a count"));
    let rounds = args.next().unwrap_or(200_000);
    let runs = args.next().unwrap_or(5).max(1);
    let (mut lines, mut rings) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        lines.push(raw_line(rounds));
        rings.push(ring(rounds));
    }
    println!("# half round trip between two threads, {rounds} rounds, median of {runs} runs (µs)");
    println!("raw cache line   {:.3}", median(lines));
    println!("ring             {:.3}", median(rings));
    println!("one thread       {:.3}", one_thread(rounds));
}
