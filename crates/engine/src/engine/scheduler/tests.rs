//! The scheduler driven by scripted events, without any transport: what it asks to post,
//! and how each transfer ends.

use super::{Event, LaneConfig, LinkId, Poster, Scheduler};
use crate::engine::{Class, Delivered, RequestError, TransferId, TransferRequest};
use crate::plan::BlockSpec;
use crate::policy::PostPolicy;
use crate::TransferError;
use rdma_hint_core::{
    Capabilities, Completion, CompletionStatus, LocalRegion, MemoryKind, RegionId, RemoteRegion, SourceId,
    TransportError, TransportFacts, TransportId, TransportKind, WriteOp,
};
use std::time::{Duration, Instant};

const LOCAL: LocalRegion = LocalRegion { id: RegionId(1), kind: MemoryKind::Host, len: 1 << 30 };
const REMOTE: RemoteRegion = RemoteRegion { id: RegionId(2), len: 1 << 30 };
const BLOCK: u64 = 64 << 10;

pub(super) fn caps(max_sges: u32) -> Capabilities {
    Capabilities {
        facts: TransportFacts {
            id: TransportId::Loopback,
            kind: TransportKind::Loopback,
            wire_gbps: 10.0,
            nic_pcie: None,
            per_op_overhead_us: 0.05,
            mtu_bytes: None,
            max_msg_bytes: 1 << 30,
            max_payload_bytes: None,
            queried_from_backend: true,
            rate_note: None,
        },
        max_outstanding_wrs: 64,
        max_wrs_per_post: 64,
        max_sges,
        memory_kinds: vec![MemoryKind::Host],
        caller_memory: Vec::new(),
        posts_without_waiting: false,
    }
}

/// The clock, for the scheduler's tests outside this file (the scheduler reads none).
pub(super) fn clock() -> Instant {
    Instant::now()
}

/// A scheduler with one peer of `lanes` lanes, blocks of [`BLOCK`], and a roomy cap.
pub(super) fn scheduler(lanes: usize, control_lane: bool, now: Instant) -> Scheduler {
    scheduler_of(lanes, control_lane, 1, now)
}

/// [`scheduler`] over lanes that gather `max_sges` ranges per request.
fn scheduler_of(lanes: usize, control_lane: bool, max_sges: u32, now: Instant) -> Scheduler {
    let config = LaneConfig {
        policy: PostPolicy::default(),
        bytes_in_flight: 1 << 30,
        queue_time: Duration::from_micros(200),
        gather_entries: 64,
    };
    let mut sched = Scheduler::new(16, config, Duration::from_secs(10), control_lane, now);
    sched.set_hint(SourceId::Host(0), None, BlockSpec::new(BLOCK, 4096).unwrap());
    let caps = caps(max_sges);
    let lanes: Vec<&Capabilities> = (0..lanes).map(|_| &caps).collect();
    assert_eq!(sched.add_peer(&lanes, &[REMOTE], now).unwrap(), 0);
    sched
}

/// Queues `request` a second before its deadline (every script's deadline is a second ahead).
fn submit(sched: &mut Scheduler, request: TransferRequest, deadline: Instant) -> TransferId {
    submit_at(sched, request, deadline, deadline - Duration::from_secs(1))
}

pub(super) fn submit_at(
    sched: &mut Scheduler,
    mut request: TransferRequest,
    deadline: Instant,
    now: Instant,
) -> TransferId {
    let admitted = sched.admit(0, &mut request).unwrap();
    sched.queue(admitted, request, deadline, now)
}

pub(super) fn single(offset: u64, len: u64) -> TransferRequest {
    TransferRequest::single(&LOCAL, offset, &REMOTE, offset, len)
}

/// The ops of the next doorbell the driver would ring, rung successfully.
pub(super) fn post(sched: &mut Scheduler, now: Instant) -> (LinkId, Vec<WriteOp>) {
    let mut doorbell = sched.next_doorbell(now).expect("a doorbell to ring");
    let link = doorbell.link;
    let ops = writes(&mut doorbell);
    sched.finish_doorbell(doorbell, Ok(()));
    (link, ops)
}

pub(super) fn writes(doorbell: &mut super::Doorbell) -> Vec<WriteOp> {
    match doorbell.ring() {
        super::Ring::Writes(ops) => ops.to_vec(),
        other => panic!("plain writes expected: {}", describe(&other)),
    }
}

fn describe(ring: &super::Ring<'_>) -> String {
    match ring {
        super::Ring::Writes(ops) => format!("{} writes", ops.len()),
        super::Ring::Gathers(ops, entries) => format!("{} gathers of {} entries", ops.len(), entries.len()),
        super::Ring::Reads(ops) => format!("{} reads", ops.len()),
    }
}

pub(super) fn done(wr_id: u64) -> Completion {
    Completion { wr_id, status: CompletionStatus::Success }
}

fn events(sched: &mut Scheduler) -> Vec<Event> {
    std::iter::from_fn(|| sched.poll_event()).collect()
}

pub(super) fn lane(peer: u32, lane: u32) -> LinkId {
    LinkId { peer, lane }
}

#[test]
fn a_transfer_goes_in_hinted_blocks_the_last_signalled_with_its_notice_and_ends_once() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let id = submit(&mut sched, single(0, 300_000).notify(9), now + Duration::from_secs(1));
    let (link, ops) = post(&mut sched, now);
    let lens: Vec<u64> = ops.iter().map(|op| op.len).collect();
    assert_eq!(lens, [BLOCK, BLOCK, BLOCK, BLOCK, 300_000 - 4 * BLOCK]);
    assert_eq!(
        ops.iter().map(|op| op.remote_offset).collect::<Vec<_>>(),
        [0, BLOCK, 2 * BLOCK, 3 * BLOCK, 4 * BLOCK]
    );
    assert!(ops[..4].iter().all(|op| !op.signalled && op.imm.is_none()));
    assert!(ops[4].signalled && ops[4].imm == Some(9));
    assert!(sched.next_doorbell(now).is_none(), "every block is posted");
    assert!(sched.collect(id).is_none(), "running until its completion");
    assert!(sched.handle_completions(link, &[done(ops[4].wr_id)], now));
    assert_eq!(events(&mut sched), [Event::Ended { slot: 0 }]);
    sched.want_room();
    assert!(matches!(sched.collect(id), Some(Ok(Delivered { bytes: 300_000, blocks: 5 }))));
    assert_eq!(events(&mut sched), [Event::Unhold { peer: 0, region: LOCAL.id }, Event::Room]);
    assert!(matches!(sched.collect(id), Some(Err(TransferError::UnknownTransfer))), "handed out once");
}

#[test]
fn completions_retire_cumulatively_in_any_order_and_stale_ones_credit_nothing() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    // Sixteen blocks: two doorbells of eight (the policy's requests per doorbell).
    let id = submit(&mut sched, single(0, 16 * BLOCK), now + Duration::from_secs(1));
    let (link, first) = post(&mut sched, now);
    let (_, second) = post(&mut sched, now);
    assert_eq!((first.len(), second.len()), (8, 8));
    assert!(first[7].signalled && second[7].signalled, "each doorbell asks for one completion");
    // The second doorbell's completion first: it vouches for everything before it.
    sched.handle_completions(link, &[done(second[7].wr_id)], now);
    assert!(matches!(sched.collect(id), Some(Ok(Delivered { bytes, blocks: 16 })) if bytes == 16 * BLOCK));
    // The first doorbell's completion after it, a repeat, and a number never posted.
    assert!(!sched.handle_completions(link, &[done(first[7].wr_id), done(second[7].wr_id), done(999)], now));
    let ended = events(&mut sched).into_iter().filter(|event| matches!(event, Event::Ended { .. })).count();
    assert_eq!(ended, 1, "a transfer ends once");
}

#[test]
fn a_lane_lost_mid_transfer_fails_what_it_carried_and_the_other_lane_goes_on() {
    let now = Instant::now();
    let mut sched = scheduler(2, false, now);
    let big = submit(&mut sched, single(0, 16 * BLOCK), now + Duration::from_secs(1));
    let (first, ops) = post(&mut sched, now);
    let (second, _) = post(&mut sched, now);
    assert_ne!(first, second, "the blocks stripe over both lanes");
    sched.handle_completions(first, &[done(ops[3].wr_id)], now);
    sched.lose_link(second, TransportError::PeerGone("reset".into()));
    match sched.collect(big) {
        Some(Err(TransferError::Transport { confirmed_bytes, source: TransportError::PeerGone(_) })) => {
            assert_eq!(confirmed_bytes, 4 * BLOCK, "what the live lane confirmed before")
        }
        other => panic!("{other:?}"),
    }
    // A transfer after it goes over the lane that lives.
    let small = submit(&mut sched, single(0, 4096), now + Duration::from_secs(1));
    let mut doorbell = sched.next_doorbell(now).unwrap();
    assert_eq!(doorbell.link, first);
    let wr_id = writes(&mut doorbell)[0].wr_id;
    sched.finish_doorbell(doorbell, Ok(()));
    // The big transfer's blocks on the live lane still retire (its slot comes free then).
    sched.handle_completions(first, &[done(wr_id)], now);
    assert!(matches!(sched.collect(small), Some(Ok(Delivered { bytes: 4096, blocks: 1 }))));
    // Both lanes gone: what is queued fails, and a submit is refused.
    let queued = submit(&mut sched, single(0, 4096), now + Duration::from_secs(1));
    sched.lose_link(first, TransportError::PeerGone("reset".into()));
    assert!(matches!(sched.collect(queued), Some(Err(TransferError::Transport { .. }))));
    let mut request = single(0, 4096);
    assert!(matches!(sched.admit(0, &mut request), Err(RequestError::PeerGone(_))));
}

#[test]
fn a_source_stays_held_while_a_doorbell_of_its_peer_rings() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let id = submit(&mut sched, single(0, 4 * BLOCK), now + Duration::from_secs(1));
    let doorbell = sched.next_doorbell(now).unwrap();
    // The lane fails (a poll elsewhere) while the doorbell is still being rung.
    sched.lose_link(doorbell.link, TransportError::PeerGone("gone".into()));
    assert!(matches!(sched.collect(id), Some(Err(TransferError::Transport { .. }))));
    let before: Vec<Event> = events(&mut sched);
    assert!(!before.iter().any(|event| matches!(event, Event::Unhold { .. })), "{before:?}");
    sched.finish_doorbell(doorbell, Err(TransportError::PeerGone("gone".into())));
    assert_eq!(events(&mut sched), [Event::Unhold { peer: 0, region: LOCAL.id }]);
}

#[test]
fn a_deadline_passing_ends_the_transfer_with_what_was_confirmed_and_its_slot_waits_for_its_blocks() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let deadline = now + Duration::from_millis(5);
    let id = submit(&mut sched, single(0, 16 * BLOCK), deadline);
    assert_eq!(sched.next_timeout(), Some(deadline));
    let (link, ops) = post(&mut sched, now);
    let (_, later) = post(&mut sched, now);
    sched.handle_completions(link, &[done(ops[7].wr_id)], now);
    assert!(!sched.handle_timeout(deadline - Duration::from_millis(1)));
    assert!(sched.handle_timeout(deadline));
    match sched.collect(id) {
        Some(Err(TransferError::DeadlineExceeded { confirmed_bytes, len })) => {
            assert_eq!((confirmed_bytes, len), (8 * BLOCK, 16 * BLOCK))
        }
        other => panic!("{other:?}"),
    }
    assert!(sched.next_doorbell(deadline).is_none(), "nothing more of it is posted");
    sched.want_room();
    assert!(!events(&mut sched).contains(&Event::Room), "its posted blocks still hold the slot");
    sched.handle_completions(link, &[done(later[7].wr_id)], deadline);
    assert!(events(&mut sched).contains(&Event::Room), "freed once they retired");
    assert_eq!(sched.next_timeout(), None, "nothing runs, nothing is in flight");
}

#[test]
fn a_freed_slot_is_news_only_while_a_submitter_waits_for_room() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let deadline = now + Duration::from_secs(1);
    let round = |sched: &mut Scheduler| {
        let id = submit(sched, single(0, BLOCK), deadline);
        let (link, ops) = post(sched, now);
        sched.handle_completions(link, &[done(ops[0].wr_id)], now);
        assert!(sched.collect(id).is_some_and(|result| result.is_ok()));
        events(sched)
    };
    assert!(!round(&mut sched).contains(&Event::Room), "nobody waits: no event");
    sched.want_room();
    assert!(round(&mut sched).contains(&Event::Room), "a submitter waits: woken");
    assert!(!round(&mut sched).contains(&Event::Room), "once: a waiter still refused asks again");
}

#[test]
fn a_lane_that_stops_answering_is_lost_at_its_stall_time() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let id = submit(&mut sched, single(0, BLOCK), now + Duration::from_secs(60));
    post(&mut sched, now);
    let stall = now + Duration::from_secs(10);
    sched.want_room();
    assert_eq!(sched.next_timeout(), Some(stall));
    assert!(sched.handle_timeout(stall));
    match sched.collect(id) {
        Some(Err(TransferError::Transport { source: TransportError::DeadlineExceeded { .. }, .. })) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(events(&mut sched).last(), Some(&Event::Room), "its slot came free");
}

#[test]
fn cancel_ends_a_queued_or_half_posted_transfer_and_posts_nothing_more_of_it() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let half = submit(&mut sched, single(0, 16 * BLOCK), now + Duration::from_secs(1));
    let (link, ops) = post(&mut sched, now);
    let queued = submit(&mut sched, single(0, 4096), now + Duration::from_secs(1));
    assert!(sched.cancel(queued) && sched.cancel(half));
    assert!(!sched.cancel(half), "once");
    assert!(sched.next_doorbell(now).is_none());
    sched.want_room();
    assert!(matches!(sched.collect(queued), Some(Err(TransferError::Cancelled { confirmed_bytes: 0 }))));
    assert!(matches!(sched.collect(half), Some(Err(TransferError::Cancelled { confirmed_bytes: 0 }))));
    // The half-posted one's slot frees when its posted blocks retire.
    let before = events(&mut sched);
    assert_eq!(before.iter().filter(|event| **event == Event::Room).count(), 1, "{before:?}");
    sched.want_room();
    sched.handle_completions(link, &[done(ops[7].wr_id)], now);
    assert!(events(&mut sched).contains(&Event::Room));
}

#[test]
fn a_peers_latency_first_transfers_teach_how_long_a_waiter_may_poll() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let deadline = now + Duration::from_secs(1);
    let first = submit_at(&mut sched, single(0, 4096).latency_first(), deadline, now);
    assert_eq!(sched.expected_latency(first), None, "none ended yet");
    let (link, ops) = post(&mut sched, now);
    sched.handle_completions(link, &[done(ops[0].wr_id)], now + Duration::from_micros(80));
    assert!(matches!(sched.collect(first), Some(Ok(_))));
    let later = now + Duration::from_micros(100);
    let second = submit_at(&mut sched, single(0, 4096).latency_first(), deadline, later);
    assert_eq!(sched.expected_latency(second), Some(Duration::from_micros(80)));
    let (link, ops) = post(&mut sched, later);
    sched.handle_completions(link, &[done(ops[0].wr_id)], later + Duration::from_micros(16));
    assert_eq!(sched.expected_latency(second), None, "ended: nothing to wait for");
    let third = submit_at(&mut sched, single(0, 4096).latency_first(), deadline, later);
    // An average that weighs the latest by an eighth: (7 × 80 + 16) / 8.
    assert_eq!(sched.expected_latency(third), Some(Duration::from_micros(72)));
    let bulk = submit_at(&mut sched, single(0, 4096), deadline, later);
    assert_eq!(sched.expected_latency(bulk), None, "bulk waiters do not poll long");
}

#[test]
fn a_latency_first_transfer_goes_before_bulk_blocks_not_yet_posted() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    submit(&mut sched, single(0, 1024 * BLOCK), now + Duration::from_secs(1));
    post(&mut sched, now);
    submit(&mut sched, single(0, 4096).latency_first(), now + Duration::from_secs(1));
    let (_, ops) = post(&mut sched, now);
    assert_eq!((ops[0].len, ops[0].signalled), (4096, true), "first in the next doorbell: {ops:?}");
}

#[test]
fn a_control_lane_carries_latency_first_transfers_alone() {
    let now = Instant::now();
    let mut sched = scheduler(2, true, now);
    submit(&mut sched, single(0, 64 * BLOCK), now + Duration::from_secs(1));
    submit(&mut sched, single(0, 4096).latency_first(), now + Duration::from_secs(1));
    let mut seen = Vec::new();
    while let Some(mut doorbell) = sched.next_doorbell(now) {
        seen.push((doorbell.link.lane, writes(&mut doorbell).iter().map(|op| op.len).collect::<Vec<_>>()));
        sched.finish_doorbell(doorbell, Ok(()));
    }
    assert!(seen.contains(&(1, vec![4096])), "{seen:?}");
    assert!(seen.iter().filter(|(lane, _)| *lane == 1).all(|(_, lens)| lens == &[4096]), "{seen:?}");
}

#[test]
fn callers_leave_a_lanes_first_doorbells_to_the_driver() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    submit(&mut sched, single(0, 4096), now + Duration::from_secs(1));
    assert!(sched.next_doorbell_for(0, Poster::Caller(Class::Bulk), now).is_none());
    assert!(sched.next_doorbell_for(0, Poster::Driver, now).is_some());
}

/// Posts and retires 4 KiB transfers of both classes on every lane until each has posted more
/// than the driver's share of first requests, so that callers post too.
fn warm(sched: &mut Scheduler, lanes: u32, now: Instant) {
    for round in 0..(super::WARM_WRS + 1) * 2 * u64::from(lanes) {
        let request = if round % 2 == 0 { single(0, 4096) } else { single(0, 4096).latency_first() };
        let id = submit(sched, request, now + Duration::from_secs(1));
        let (link, ops) = post(sched, now);
        assert!(sched.handle_completions(link, &[done(ops[0].wr_id)], now));
        assert!(matches!(sched.collect(id), Some(Ok(_))));
        events(sched);
    }
}

#[test]
fn a_latency_first_submit_rings_no_bulk_block_on_its_callers_thread() {
    // Bulk queued behind it must not ride the latency-first caller's doorbell: that caller would
    // copy (on the staged shm channel) half a lane's cap of someone else's bytes before its
    // submit returned. The driver posts the bulk.
    for (lanes, control_lane) in [(1, false), (2, true), (2, false)] {
        let now = Instant::now();
        let mut sched = scheduler(lanes, control_lane, now);
        warm(&mut sched, lanes as u32, now);
        submit(&mut sched, single(0, 64 * BLOCK), now + Duration::from_secs(1));
        submit(&mut sched, single(0, 4096).latency_first(), now + Duration::from_secs(1));
        let mut caller =
            sched.next_doorbell_for(0, Poster::Caller(Class::LatencyFirst), now).expect("its doorbell");
        assert_eq!(writes(&mut caller).iter().map(|op| op.len).collect::<Vec<_>>(), [4096], "{lanes} lanes");
        sched.finish_doorbell(caller, Ok(()));
        assert!(
            sched.next_doorbell_for(0, Poster::Caller(Class::LatencyFirst), now).is_none(),
            "{lanes} lanes"
        );
        let (_, bulk) = post(&mut sched, now);
        assert!(bulk.iter().all(|op| op.len == BLOCK), "{lanes} lanes: the driver posts the bulk");
    }
}

#[test]
fn a_refused_request_goes_again_from_the_driver_not_from_a_callers_submit() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    warm(&mut sched, 1, now);
    submit(&mut sched, single(0, 4 * BLOCK), now + Duration::from_secs(1));
    let refused = sched.next_doorbell(now).expect("the bulk's doorbell");
    sched.finish_doorbell(refused, Err(TransportError::UnregisteredRegion(RegionId(1))));
    submit(&mut sched, single(0, 4096).latency_first(), now + Duration::from_secs(1));
    assert!(
        sched.next_doorbell_for(0, Poster::Caller(Class::LatencyFirst), now).is_none(),
        "a caller would post the refused bulk request before its own submit returned"
    );
    let (_, retry) = post(&mut sched, now);
    assert_eq!(retry.iter().map(|op| op.len).collect::<Vec<_>>(), [BLOCK], "the driver's retry, alone");
}

#[test]
fn a_doorbell_the_transport_refuses_goes_again_a_request_at_a_time_and_only_the_bad_one_fails() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let first = submit(&mut sched, single(0, BLOCK), now + Duration::from_secs(1));
    let bad = submit(&mut sched, single(BLOCK, BLOCK), now + Duration::from_secs(1));
    let third = submit(&mut sched, single(2 * BLOCK, BLOCK), now + Duration::from_secs(1));
    let mut doorbell = sched.next_doorbell(now).unwrap();
    assert_eq!(writes(&mut doorbell).len(), 3);
    sched.finish_doorbell(doorbell, Err(TransportError::UnregisteredRegion(RegionId(1))));
    assert!(sched.queued(), "the refused requests wait to go again");
    let mut completed = Vec::new();
    for (index, outcome) in
        [Ok(()), Err(TransportError::UnregisteredRegion(RegionId(1))), Ok(())].into_iter().enumerate()
    {
        let mut doorbell = sched.next_doorbell(now).expect("one request per doorbell");
        let ops = writes(&mut doorbell);
        assert_eq!(ops.len(), 1);
        assert!(ops[0].signalled);
        assert_eq!(ops[0].remote_offset, index as u64 * BLOCK, "in their order");
        if outcome.is_ok() {
            completed.push(ops[0].wr_id);
        }
        sched.finish_doorbell(doorbell, outcome);
    }
    assert!(sched.next_doorbell(now).is_none());
    sched.handle_completions(lane(0, 0), &completed.iter().map(|id| done(*id)).collect::<Vec<_>>(), now);
    assert!(matches!(sched.collect(first), Some(Ok(_))));
    assert!(matches!(sched.collect(bad), Some(Err(TransferError::Transport { .. }))));
    assert!(matches!(sched.collect(third), Some(Ok(_))));
    assert_eq!(sched.lane_stats(0).unwrap()[0].posted_wrs, 2);
}

#[test]
fn a_submit_refused_changes_nothing_and_a_full_scheduler_says_so() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let mut outside = single(1 << 30, 1);
    assert!(matches!(sched.admit(0, &mut outside), Err(RequestError::OutOfRegion { .. })));
    let mut unknown =
        TransferRequest::single(&LOCAL, 0, &RemoteRegion { id: RegionId(7), len: 1 << 30 }, 0, 1);
    assert!(matches!(sched.admit(0, &mut unknown), Err(RequestError::UnknownRemoteRegion { .. })));
    assert!(matches!(sched.admit(3, &mut single(0, 1)), Err(RequestError::UnknownPeer(3))));
    for _ in 0..16 {
        submit(&mut sched, single(0, 4096), now + Duration::from_secs(1));
    }
    assert!(matches!(sched.admit(0, &mut single(0, 1)), Err(RequestError::Full { max_transfers: 16 })));
    assert!(events(&mut sched).is_empty());
}

fn reads(doorbell: &mut super::Doorbell) -> Vec<rdma_hint_core::ReadOp> {
    match doorbell.ring() {
        super::Ring::Reads(ops) => ops.to_vec(),
        other => panic!("reads expected: {}", describe(&other)),
    }
}

#[test]
fn a_read_goes_as_reads_of_one_range_each_and_cannot_notify() {
    let now = Instant::now();
    let mut sched = scheduler_of(1, false, 16, now);
    // Four 16 KiB pages landing back to back: a write packs them into one gather request.
    let pages: Vec<crate::engine::Segment> = (0..4u64)
        .map(|k| crate::engine::Segment {
            local_offset: k * 2 * 16_384,
            remote_offset: k * 16_384,
            len: 16_384,
        })
        .collect();
    let id = submit(
        &mut sched,
        TransferRequest::scatter(&LOCAL, &REMOTE, pages.clone()).read(),
        now + Duration::from_secs(1),
    );
    let mut doorbell = sched.next_doorbell(now).unwrap();
    let ops = reads(&mut doorbell);
    assert_eq!(
        ops.iter().map(|op| (op.local_offset, op.remote_offset, op.len)).collect::<Vec<_>>(),
        pages.iter().map(|p| (p.local_offset, p.remote_offset, p.len)).collect::<Vec<_>>()
    );
    assert!(ops[3].signalled && ops[..3].iter().all(|op| !op.signalled));
    sched.finish_doorbell(doorbell, Ok(()));
    sched.handle_completions(lane(0, 0), &[done(ops[3].wr_id)], now);
    assert!(matches!(sched.collect(id), Some(Ok(Delivered { bytes: 65_536, blocks: 4 }))));
    let mut announced = single(0, 4096).read().notify(1);
    assert!(matches!(sched.admit(0, &mut announced), Err(RequestError::NotifyOnRead)));
}

#[test]
fn a_lane_carries_one_direction_at_a_time() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    let write = submit(&mut sched, single(0, 2 * BLOCK), now + Duration::from_secs(1));
    let read = submit(&mut sched, single(4 * BLOCK, BLOCK).read(), now + Duration::from_secs(1));
    // The write's first block; the read's turn comes next, so its second block waits too.
    let (link, ops) = post(&mut sched, now);
    assert_eq!(ops.len(), 1, "the write's first block alone: {ops:?}");
    assert!(sched.next_doorbell(now).is_none(), "the read waits while writes are in flight");
    sched.handle_completions(link, &[done(ops[0].wr_id)], now);
    let mut doorbell = sched.next_doorbell(now).unwrap();
    let fetched = reads(&mut doorbell);
    assert_eq!((fetched.len(), fetched[0].remote_offset), (1, 4 * BLOCK));
    sched.finish_doorbell(doorbell, Ok(()));
    sched.handle_completions(link, &[done(fetched[0].wr_id)], now);
    assert!(matches!(sched.collect(read), Some(Ok(Delivered { blocks: 1, .. }))));
    let (_, rest) = post(&mut sched, now);
    assert_eq!(rest[0].remote_offset, BLOCK, "then the write's second block");
    sched.handle_completions(link, &[done(rest[0].wr_id)], now);
    assert!(matches!(sched.collect(write), Some(Ok(Delivered { blocks: 2, .. }))));
}

#[test]
fn a_lane_stall_of_duration_max_turns_the_stall_watch_off_without_overflow() {
    let now = Instant::now();
    let config = LaneConfig {
        policy: PostPolicy::default(),
        bytes_in_flight: 1 << 30,
        queue_time: Duration::from_micros(200),
        gather_entries: 64,
    };
    let mut sched = Scheduler::new(4, config, Duration::MAX, false, now);
    sched.set_hint(SourceId::Host(0), None, BlockSpec::new(BLOCK, 4096).unwrap());
    sched.add_peer(&[&caps(1)], &[REMOTE], now).unwrap();
    let deadline = now + Duration::from_secs(3600);
    submit(&mut sched, single(0, BLOCK), deadline);
    post(&mut sched, now);
    assert_eq!(sched.next_timeout(), Some(deadline), "the deadline alone: no stall time");
    assert!(!sched.handle_timeout(now + Duration::from_secs(1800)));
}

#[test]
fn a_read_behind_a_stream_of_writes_goes_once_the_lane_drains() {
    let now = Instant::now();
    let mut sched = scheduler(1, false, now);
    submit(&mut sched, single(0, 8 * BLOCK), now + Duration::from_secs(1));
    let (link, first) = post(&mut sched, now);
    let read = submit(&mut sched, single(16 * BLOCK, BLOCK).read(), now + Duration::from_secs(1));
    // Writes keep coming: none of them passes the waiting read while the lane drains.
    submit(&mut sched, single(32 * BLOCK, 8 * BLOCK), now + Duration::from_secs(1));
    assert!(sched.next_doorbell(now).is_none(), "the lane drains before it turns");
    sched.handle_completions(link, &[done(first.last().unwrap().wr_id)], now);
    let mut doorbell = sched.next_doorbell(now).unwrap();
    let fetched = reads(&mut doorbell);
    assert_eq!((fetched.len(), fetched[0].remote_offset), (1, 16 * BLOCK));
    sched.finish_doorbell(doorbell, Ok(()));
    sched.handle_completions(link, &[done(fetched[0].wr_id)], now);
    assert!(matches!(sched.collect(read), Some(Ok(Delivered { blocks: 1, .. }))));
    // Then the writes that waited go.
    let (_, writes) = post(&mut sched, now);
    assert_eq!(writes[0].remote_offset, 32 * BLOCK);
}

/// A read that waited for the lane to turn and then ended (cancelled here; its deadline does
/// the same) leaves no turn behind: a write queued after it goes once the lane is empty, not
/// at its deadline.
#[test]
fn a_lane_turns_only_for_a_transfer_that_still_waits() {
    let now = Instant::now();
    let deadline = now + Duration::from_secs(1);
    let mut sched = scheduler(1, false, now);
    let write = submit(&mut sched, single(0, BLOCK), deadline);
    let (link, ops) = post(&mut sched, now);
    let read = submit(&mut sched, single(BLOCK, BLOCK).read(), deadline);
    assert!(sched.next_doorbell(now).is_none(), "the read waits for the write in flight");
    assert!(sched.cancel(read));
    sched.handle_completions(link, &[done(ops[0].wr_id)], now);
    assert!(matches!(sched.collect(write), Some(Ok(_))));
    assert!(matches!(sched.collect(read), Some(Err(TransferError::Cancelled { .. }))));
    submit(&mut sched, single(2 * BLOCK, BLOCK), deadline);
    let (_, ops) = post(&mut sched, now);
    assert_eq!(ops[0].remote_offset, 2 * BLOCK);
}

/// A late failure of a request no longer in flight (lost with its lane, here after an earlier
/// failure took the lane down) fails nothing the lane carries now, and a number the lane never
/// posted retires nothing: what is in flight ends by its own completions.
#[test]
fn stale_failures_and_numbers_never_posted_change_nothing() {
    let now = Instant::now();
    let deadline = now + Duration::from_secs(1);
    let mut sched = scheduler(1, false, now);
    let first = submit(&mut sched, single(0, 4 * BLOCK), deadline);
    let (link, ops) = post(&mut sched, now);
    let failed = |wr_id| Completion { wr_id, status: CompletionStatus::Failed { code: 5 } };
    sched.handle_completions(link, &[failed(ops[1].wr_id)], now);
    assert!(matches!(sched.collect(first), Some(Err(TransferError::Transport { .. }))));
    sched.revive_link(link);
    let second = submit(&mut sched, single(0, 2 * BLOCK), deadline);
    let (_, again) = post(&mut sched, now);
    sched.handle_completions(link, &[failed(ops[3].wr_id), done(u64::MAX), done(again[1].wr_id + 7)], now);
    assert!(sched.is_running(second), "stale and unposted numbers ended the second transfer");
    sched.handle_completions(link, &[done(again[1].wr_id)], now);
    assert!(matches!(sched.collect(second), Some(Ok(Delivered { bytes, blocks: 2 })) if bytes == 2 * BLOCK));
}

/// A one-block read alone in the queues (built without the queues' loop) turns an idle lane
/// that last carried writes: a write submitted while it is in flight waits for it.
#[test]
fn a_lone_read_turns_its_lane_and_a_write_waits_for_it() {
    let now = Instant::now();
    let deadline = now + Duration::from_secs(1);
    let mut sched = scheduler(1, false, now);
    let write = submit(&mut sched, single(0, BLOCK), deadline);
    let (link, ops) = post(&mut sched, now);
    sched.handle_completions(link, &[done(ops[0].wr_id)], now);
    assert!(matches!(sched.collect(write), Some(Ok(_))));
    let read = submit(&mut sched, single(4 * BLOCK, BLOCK).read(), deadline);
    let mut doorbell = sched.next_doorbell(now).unwrap();
    let fetched = reads(&mut doorbell);
    sched.finish_doorbell(doorbell, Ok(()));
    let later = submit(&mut sched, single(0, BLOCK), deadline);
    assert!(sched.next_doorbell(now).is_none(), "the write waits while the read is in flight");
    sched.handle_completions(link, &[done(fetched[0].wr_id)], now);
    assert!(matches!(sched.collect(read), Some(Ok(Delivered { blocks: 1, .. }))));
    let (_, writes) = post(&mut sched, now);
    sched.handle_completions(link, &[done(writes[0].wr_id)], now);
    assert!(matches!(sched.collect(later), Some(Ok(Delivered { blocks: 1, .. }))));
}

/// The random scripts compare `build_lone` with the queues' loop; this pins that the lone path
/// is the one a lone one-block transfer takes (and not one of two blocks, or of two transfers).
#[test]
fn a_lone_one_block_transfer_takes_the_lone_path_and_others_the_loop() {
    let now = Instant::now();
    let deadline = now + Duration::from_secs(1);
    let mut sched = scheduler(1, false, now);
    submit(&mut sched, single(0, 4096).notify(3), deadline);
    let (_, ops) = post(&mut sched, now);
    assert!(ops[0].signalled && ops[0].imm == Some(3));
    assert_eq!(sched.lone_built, Some(1));
    submit(&mut sched, single(0, 2 * BLOCK), deadline);
    post(&mut sched, now);
    submit(&mut sched, single(0, 4096), deadline);
    submit(&mut sched, single(0, 4096), deadline);
    post(&mut sched, now);
    assert_eq!(sched.lone_built, Some(1), "two blocks, or two transfers: the loop");
}

#[test]
fn a_full_queue_waits_longer_each_time_then_posts_the_same_requests_in_order_and_fails_nothing() {
    let start = Instant::now();
    let mut sched = scheduler(1, false, start);
    let id = submit(&mut sched, single(0, 3 * BLOCK).notify(7), start + Duration::from_secs(1));
    let mut doorbell = sched.next_doorbell(start).unwrap();
    let first = writes(&mut doorbell);
    assert_eq!(first.len(), 3, "one lane keeps its order: the notifying block goes with them");
    let full = || Err(TransportError::QueueFull { given: 3, max: 0 });
    sched.finish_doorbell(doorbell, full());
    assert!(sched.queued() && sched.is_running(id), "nothing fails, nothing is lost");
    // A transfer submitted meanwhile would find the lane free: it must not overtake them.
    let other = submit_at(&mut sched, single(4 * BLOCK, 4096), start + Duration::from_secs(1), start);
    // It waits 16 us, then 32 us after a second refusal: no doorbell before, and the driver's
    // next timeout is that moment, not the next scan.
    let mut at = start;
    for wait in [16, 32] {
        assert_eq!(sched.next_timeout(), Some(at + Duration::from_micros(wait)));
        assert!(sched.next_doorbell(at + Duration::from_micros(wait - 1)).is_none(), "too early");
        at += Duration::from_micros(wait);
        let mut retry = sched.next_doorbell(at).expect("the retry, once waited");
        assert_eq!(writes(&mut retry)[0].remote_offset, 0, "the oldest request first");
        sched.finish_doorbell(retry, full());
    }
    // Taken now: the requests go again in their order, one a doorbell, numbered afresh, the
    // notice last, and the newer transfer after them.
    at += Duration::from_micros(64);
    let retried: Vec<WriteOp> = (0..4).flat_map(|_| post(&mut sched, at).1).collect();
    let offsets: Vec<u64> = retried.iter().map(|op| op.remote_offset).collect();
    assert_eq!(offsets, [0, BLOCK, 2 * BLOCK, 4 * BLOCK]);
    assert_eq!(retried[2].imm, Some(7), "the notice still comes last");
    let numbers: Vec<u64> = retried.iter().map(|op| op.wr_id).collect();
    assert_eq!(numbers, (first[0].wr_id..first[0].wr_id + 4).collect::<Vec<_>>());
    sched.handle_completions(lane(0, 0), &[done(retried[3].wr_id)], at);
    assert!(matches!(sched.collect(other), Some(Ok(_))));
    assert!(matches!(sched.collect(id), Some(Ok(Delivered { bytes, blocks: 3 })) if bytes == 3 * BLOCK));
    assert!(sched.lane_stats(0).unwrap()[0].failed.is_none());
}

#[test]
fn a_transfer_whose_deadline_passes_while_the_queue_stays_full_ends_and_nothing_of_it_is_posted_after() {
    let start = Instant::now();
    let mut sched = scheduler(1, false, start);
    let deadline = start + Duration::from_millis(5);
    let id = submit_at(&mut sched, single(0, 2 * BLOCK), deadline, start);
    let doorbell = sched.next_doorbell(start).unwrap();
    sched.finish_doorbell(doorbell, Err(TransportError::QueueFull { given: 2, max: 0 }));
    let retry = sched.next_doorbell(start + Duration::from_micros(16)).expect("the first retry");
    sched.finish_doorbell(retry, Err(TransportError::QueueFull { given: 1, max: 0 }));
    let at = deadline;
    assert!(sched.handle_timeout(at), "the deadline ends it");
    assert!(matches!(
        sched.collect(id),
        Some(Err(TransferError::DeadlineExceeded { confirmed_bytes: 0, .. }))
    ));
    assert!(sched.queued(), "its refused blocks wait for the lane's next try");
    // At that try they are counted out, not posted, and a transfer submitted meanwhile goes
    // in that same turn.
    let next = submit_at(&mut sched, single(0, 4096), at + Duration::from_secs(1), at);
    let (_, ops) = post(&mut sched, at);
    let lens: Vec<u64> = ops.iter().map(|op| op.len).collect();
    assert_eq!(lens, [4096], "only the new transfer's block goes");
    assert!(!sched.queued(), "nothing of the ended transfer waits");
    assert!(sched.lane_stats(0).unwrap()[0].failed.is_none(), "a full queue loses no lane");
    sched.handle_completions(lane(0, 0), &[done(ops[0].wr_id)], at);
    assert!(matches!(sched.collect(next), Some(Ok(_))));
}

#[test]
fn a_queue_full_for_longer_than_the_stall_watch_is_a_wait_not_a_lost_lane() {
    let start = Instant::now();
    let mut sched = scheduler(1, false, start);
    let id = submit_at(&mut sched, single(0, 2 * BLOCK), start + Duration::from_secs(60), start);
    let doorbell = sched.next_doorbell(start).unwrap();
    sched.finish_doorbell(doorbell, Err(TransportError::QueueFull { given: 2, max: 0 }));
    // Past the 10 s stall watch, trying every millisecond; the driver looks at the timeouts
    // between building a doorbell and ringing it.
    let mut at = start;
    while at < start + Duration::from_secs(11) {
        at += Duration::from_millis(1);
        let retry = sched.next_doorbell(at);
        sched.handle_timeout(at);
        if let Some(retry) = retry {
            sched.finish_doorbell(retry, Err(TransportError::QueueFull { given: 1, max: 0 }));
        }
        assert!(sched.lane_stats(0).unwrap()[0].failed.is_none(), "lost after {:?}", at - start);
    }
    assert!(sched.is_running(id));
}

#[test]
fn a_lane_whose_queue_was_full_goes_last_among_the_lanes_with_room() {
    let start = Instant::now();
    let mut sched = scheduler(2, false, start);
    // One lane carries a block in flight; the other answers the next doorbell `QueueFull`.
    submit_at(&mut sched, single(0, BLOCK), start + Duration::from_secs(60), start);
    let (busy, _) = post(&mut sched, start);
    let doomed = submit_at(&mut sched, single(BLOCK, BLOCK), start + Duration::from_millis(5), start);
    let refused = sched.next_doorbell(start).unwrap();
    let full = refused.link;
    assert_ne!(full, busy, "the lane with nothing outstanding");
    sched.finish_doorbell(refused, Err(TransportError::QueueFull { given: 1, max: 0 }));
    let at = start + Duration::from_millis(5);
    sched.handle_timeout(at);
    assert!(matches!(sched.collect(doomed), Some(Err(TransferError::DeadlineExceeded { .. }))));
    // Its refused block counted out, the full lane has nothing outstanding; still, the next
    // transfer goes to the lane that takes posts.
    submit_at(&mut sched, single(2 * BLOCK, BLOCK), at + Duration::from_secs(60), at);
    let (link, ops) = post(&mut sched, at);
    assert_eq!((link, ops[0].remote_offset), (busy, 2 * BLOCK));
}
