//! The scheduler observed ([`Scheduler::observe`]): which completion records a subscriber
//! gets, and how they are timed, when the engine is subscribed to during traffic and when the
//! transport refuses doorbells.

use super::tests::{clock, done, lane, post, scheduler, single, submit_at, writes};
use super::{Completed, Scheduler};
use rdma_hint_core::TransportError;
use std::time::Duration;

const BLOCK: u64 = 64 << 10;

fn records(sched: &mut Scheduler) -> Vec<Completed> {
    std::iter::from_fn(|| sched.poll_completed()).collect()
}

#[test]
fn a_request_posted_before_the_first_subscriber_is_not_timed_from_a_later_doorbell() {
    let start = clock();
    let mut sched = scheduler(1, false, start);
    let deadline = start + Duration::from_secs(1);
    submit_at(&mut sched, single(0, 4096), deadline, start);
    let (_, before) = post(&mut sched, start);
    sched.observe();
    submit_at(&mut sched, single(BLOCK, 4096), deadline, start);
    let later = start + Duration::from_millis(100);
    let (_, after) = post(&mut sched, later);
    let at = later + Duration::from_micros(5);
    sched.handle_completions(lane(0, 0), &[done(before[0].wr_id), done(after[0].wr_id)], at);
    let got = records(&mut sched);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].requests, got[0].bytes, got[0].timed), (1, 4096, None), "posted unobserved");
    assert_eq!(got[1].timed, Some((Duration::from_micros(5), 4096)), "the first still in flight ahead of it");
}

#[test]
fn a_doorbell_the_transport_refuses_leaves_no_stamp_and_its_retry_is_timed_from_the_retry() {
    let start = clock();
    let mut sched = scheduler(1, false, start);
    sched.observe();
    submit_at(&mut sched, single(0, 2 * BLOCK), start + Duration::from_secs(1), start);
    let refused = sched.next_doorbell(start).unwrap();
    sched.finish_doorbell(refused, Err(TransportError::QueueFull { given: 2, max: 0 }));
    // Refused again and again, as from a peer that stalls: no stamp is left behind.
    let mut at = start;
    for _ in 0..100 {
        at += Duration::from_millis(1);
        let Some(retry) = sched.next_doorbell(at) else { continue };
        sched.finish_doorbell(retry, Err(TransportError::QueueFull { given: 1, max: 0 }));
    }
    let stamps = |sched: &Scheduler| sched.peers[0].lanes[0].stamps.as_ref().map_or(0, |s| s.len());
    assert_eq!(stamps(&sched), 0, "refused doorbells keep no stamp");
    // Taken at last: each request goes alone, stamped when it went.
    at += Duration::from_millis(1);
    let mut first = sched.next_doorbell(at).unwrap();
    let first_ops = writes(&mut first);
    sched.finish_doorbell(first, Ok(()));
    at += Duration::from_millis(1);
    let (_, second) = post(&mut sched, at);
    assert_eq!(stamps(&sched), 2);
    let completed_at = at + Duration::from_micros(7);
    sched.handle_completions(lane(0, 0), &[done(first_ops[0].wr_id), done(second[0].wr_id)], completed_at);
    let got = records(&mut sched);
    let timed: Vec<_> = got.iter().map(|record| record.timed).collect();
    assert_eq!(
        timed,
        [Some((Duration::from_micros(1007), 0)), Some((Duration::from_micros(7), BLOCK))],
        "timed from each retry, not from the refused doorbell 100 ms before"
    );
    assert_eq!(stamps(&sched), 0, "every stamp retired with its request");
}
