//! The scheduler driven by random scripts of everything that can happen to it (submits,
//! doorbells rung, refused, answered a full queue or failed, doorbells still ringing while
//! other things happen, completions in any order, lanes lost, deadlines, cancels, collects):
//! every transfer ends once, a delivered one with its bytes, a failed one with no more
//! confirmed than asked for, every hold ends once and only after its result was handed out,
//! and nothing is lost.

use super::{Event, LaneConfig, LinkId, Poster, Scheduler};
use crate::engine::{Class, Delivered, TransferId, TransferRequest};
use crate::plan::BlockSpec;
use crate::policy::PostPolicy;
use crate::TransferError;
use proptest::prelude::*;
use rdma_hint_core::{
    Completion, CompletionStatus, LocalRegion, MemoryKind, RegionId, RemoteRegion, SourceId, TransportError,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const BLOCK: u64 = 64 << 10;
const SLOTS: u32 = 6;
const LANES: u32 = 2;

#[derive(Debug, Clone)]
enum Step {
    Submit {
        blocks: u64,
        short: u64,
        latency_first: bool,
        read: bool,
        deadline_ms: u64,
    },
    /// Scattered 16 KiB pages landing back to back: packed into gathers.
    SubmitPages {
        pages: u64,
    },
    Build,
    /// A caller's submit builds its doorbell (of its class), past the lanes' first requests.
    BuildCaller {
        latency_first: bool,
    },
    Finish {
        which: usize,
        outcome: u8,
    },
    Complete {
        which: usize,
    },
    Lose {
        lane: u32,
    },
    Advance {
        ms: u64,
    },
    Cancel {
        which: usize,
    },
    Collect {
        which: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u64..6, 0u64..4096, any::<bool>(), any::<bool>(), 1u64..50).prop_map(
            |(blocks, short, latency_first, read, deadline_ms)| Step::Submit {
                blocks,
                short,
                latency_first,
                read,
                deadline_ms
            }
        ),
        (1u64..12).prop_map(|pages| Step::SubmitPages { pages }),
        Just(Step::Build),
        Just(Step::Build),
        (0usize..4, 0u8..8).prop_map(|(which, outcome)| Step::Finish { which, outcome }),
        (0usize..16).prop_map(|which| Step::Complete { which }),
        (0u32..LANES).prop_map(|lane| Step::Lose { lane }),
        (0u64..20).prop_map(|ms| Step::Advance { ms }),
        (0usize..8).prop_map(|which| Step::Cancel { which }),
        (0usize..8).prop_map(|which| Step::Collect { which }),
    ]
}

/// [`step`], and callers' doorbells among the driver's.
fn step_with_callers() -> impl Strategy<Value = Step> {
    prop_oneof![step(), any::<bool>().prop_map(|latency_first| Step::BuildCaller { latency_first })]
}

/// What the script knows of one submitted transfer.
struct Tracked {
    total: u64,
    ended: u32,
    collected: bool,
    unholds: u32,
    /// Its result said every byte was delivered.
    delivered: bool,
}

struct Harness {
    sched: Scheduler,
    now: Instant,
    /// The script's first instant: no block was posted before it.
    started: Instant,
    ids: Vec<TransferId>,
    tracked: HashMap<TransferId, Tracked>,
    /// The transfer each slot holds now.
    slot_owner: HashMap<u32, TransferId>,
    ringing: Vec<super::Doorbell>,
    /// Signalled request numbers posted per lane.
    posted: Vec<(LinkId, u64)>,
    /// What the scheduler built, answered and handed out, step by step (see
    /// `a_lone_blocks_doorbell_is_what_the_queues_loop_builds`).
    trace: Vec<String>,
    /// Payload bytes the subscribers' completion events reported, and lanes reported lost.
    completed_bytes: u64,
    lanes_lost: Vec<LinkId>,
}

const LOCAL: LocalRegion = LocalRegion { id: RegionId(1), kind: MemoryKind::Host, len: 1 << 30 };
const REMOTE: RemoteRegion = RemoteRegion { id: RegionId(2), len: 1 << 30 };

impl Harness {
    fn new() -> Harness {
        Harness::with(false)
    }

    /// A harness whose peer's last lane is a control lane, or not.
    fn with(control_lane: bool) -> Harness {
        let now = Instant::now();
        let config = LaneConfig {
            policy: PostPolicy { wrs_per_doorbell: 4, signal_every: 4, window: 16 },
            bytes_in_flight: 1 << 20,
            queue_time: Duration::from_micros(200),
            gather_entries: 4,
        };
        let mut sched = Scheduler::new(SLOTS, config, Duration::from_millis(30), control_lane, now);
        sched.observe();
        sched.set_hint(SourceId::Host(0), None, BlockSpec::new(BLOCK, 4096).unwrap());
        // The policy below keeps 16 requests outstanding and 4 per doorbell.
        let caps = super::tests::caps(4);
        sched.add_peer(&[&caps, &caps], &[REMOTE], now).unwrap();
        Harness {
            sched,
            now,
            started: now,
            ids: Vec::new(),
            tracked: HashMap::new(),
            slot_owner: HashMap::new(),
            ringing: Vec::new(),
            posted: Vec::new(),
            trace: Vec::new(),
            completed_bytes: 0,
            lanes_lost: Vec::new(),
        }
    }

    fn run(&mut self, step: &Step) {
        match *step {
            Step::Submit { blocks, short, latency_first, read, deadline_ms } => {
                let len = blocks * BLOCK - short;
                let mut request = TransferRequest::single(&LOCAL, 0, &REMOTE, 0, len);
                if latency_first {
                    request = request.latency_first();
                }
                if read {
                    request = request.read();
                }
                self.submit(request, len, deadline_ms);
            }
            Step::SubmitPages { pages } => {
                let page = 16 << 10;
                let segments = (0..pages)
                    .map(|k| crate::engine::Segment {
                        local_offset: (pages - k) * 2 * page,
                        remote_offset: k * page,
                        len: page,
                    })
                    .collect();
                self.submit(TransferRequest::scatter(&LOCAL, &REMOTE, segments), pages * page, 40);
            }
            Step::Build => {
                let doorbell = self.sched.next_doorbell(self.now);
                self.built(doorbell);
            }
            Step::BuildCaller { latency_first } => {
                let class = if latency_first { Class::LatencyFirst } else { Class::Bulk };
                let doorbell = self.sched.next_doorbell_for(0, Poster::Caller(class), self.now);
                self.built(doorbell);
            }
            Step::Finish { which, outcome } => {
                if self.ringing.is_empty() {
                    return;
                }
                let mut doorbell = self.ringing.remove(which % self.ringing.len());
                let rung = match outcome {
                    0 => Err(TransportError::UnregisteredRegion(RegionId(1))),
                    1 => Err(TransportError::PeerGone("reset".into())),
                    2 => Err(TransportError::TooManyEntries { given: 4, max_sges: 1 }),
                    3 => Err(TransportError::QueueFull { given: 4, max: 0 }),
                    _ => Ok(()),
                };
                if rung.is_ok() {
                    let signalled: Vec<u64> = match doorbell.ring() {
                        super::Ring::Writes(ops) => {
                            ops.iter().filter(|op| op.signalled).map(|op| op.wr_id).collect()
                        }
                        super::Ring::Reads(ops) => {
                            ops.iter().filter(|op| op.signalled).map(|op| op.wr_id).collect()
                        }
                        super::Ring::Gathers(ops, _) => {
                            ops.iter().filter(|op| op.signalled).map(|op| op.wr_id).collect()
                        }
                    };
                    self.posted.extend(signalled.into_iter().map(|wr_id| (doorbell.link, wr_id)));
                }
                self.sched.finish_doorbell(doorbell, rung);
            }
            Step::Complete { which } => {
                if self.posted.is_empty() {
                    return;
                }
                let (link, wr_id) = self.posted.remove(which % self.posted.len());
                self.sched.handle_completions(
                    link,
                    &[Completion { wr_id, status: CompletionStatus::Success }],
                    self.now,
                );
            }
            Step::Lose { lane } => {
                self.sched.lose_link(LinkId { peer: 0, lane }, TransportError::PeerGone("lost".into()))
            }
            Step::Advance { ms } => {
                self.now += Duration::from_millis(ms);
                self.sched.handle_timeout(self.now);
            }
            Step::Cancel { which } => {
                if let Some(id) = self.pick(which) {
                    self.sched.cancel(id);
                }
            }
            Step::Collect { which } => {
                if let Some(id) = self.pick(which) {
                    self.collect(id);
                }
            }
        }
        self.drain();
        let statuses: Vec<_> = self.ids.iter().map(|id| self.sched.status(*id)).collect();
        self.trace.push(format!("{:?} {statuses:?}", self.sched.lane_stats(0)));
    }

    /// Records a doorbell built, every request of it, and keeps it ringing.
    fn built(&mut self, doorbell: Option<super::Doorbell>) {
        let Some(mut doorbell) = doorbell else { return self.trace.push("no doorbell".into()) };
        let link = doorbell.link;
        let requests = match doorbell.ring() {
            super::Ring::Writes(ops) => format!("writes {ops:?}"),
            super::Ring::Reads(ops) => format!("reads {ops:?}"),
            super::Ring::Gathers(ops, entries) => format!("gathers {ops:?} of {entries:?}"),
        };
        self.trace.push(format!("{link:?} {requests}"));
        self.ringing.push(doorbell);
    }

    /// [`Harness::new`] past every lane's first requests (the driver's), so that callers
    /// build doorbells too: 4 KiB transfers of both classes posted, completed and collected
    /// outside the script's books.
    fn warmed() -> Harness {
        Harness::warmed_with(false)
    }

    /// [`Harness::warmed`] of [`Harness::with`] `control_lane`.
    fn warmed_with(control_lane: bool) -> Harness {
        let mut harness = Harness::with(control_lane);
        let sched = &mut harness.sched;
        for round in 0..(super::WARM_WRS + 1) * 2 * u64::from(LANES) {
            let mut request = TransferRequest::single(&LOCAL, 0, &REMOTE, 0, 4096);
            if round % 2 == 1 {
                request = request.latency_first();
            }
            let admitted = sched.admit(0, &mut request).expect("a free slot");
            let id = sched.queue(admitted, request, harness.now + Duration::from_secs(1), harness.now);
            let mut doorbell = sched.next_doorbell(harness.now).expect("its doorbell");
            let link = doorbell.link;
            let wr_id = match doorbell.ring() {
                super::Ring::Writes(ops) => ops[ops.len() - 1].wr_id,
                _ => unreachable!("a plain 4 KiB write"),
            };
            sched.finish_doorbell(doorbell, Ok(()));
            sched.handle_completions(
                link,
                &[Completion { wr_id, status: CompletionStatus::Success }],
                harness.now,
            );
            assert!(matches!(sched.collect(id), Some(Ok(_))));
            while sched.poll_event().is_some() {}
        }
        harness
    }

    fn submit(&mut self, mut request: TransferRequest, total: u64, deadline_ms: u64) {
        if let Ok(admitted) = self.sched.admit(0, &mut request) {
            let id =
                self.sched.queue(admitted, request, self.now + Duration::from_millis(deadline_ms), self.now);
            self.slot_owner.insert(id.slot, id);
            self.ids.push(id);
            self.tracked
                .insert(id, Tracked { total, ended: 0, collected: false, unholds: 0, delivered: false });
        }
    }

    fn pick(&self, which: usize) -> Option<TransferId> {
        (!self.ids.is_empty()).then(|| self.ids[which % self.ids.len()])
    }

    fn collect(&mut self, id: TransferId) {
        let result = self.sched.collect(id);
        self.trace.push(format!("{id:?}: {result:?}"));
        let tracked = self.tracked.get_mut(&id).unwrap();
        match result {
            None => assert!(!tracked.collected && tracked.ended == 0, "running after its end"),
            Some(Err(TransferError::UnknownTransfer)) => assert!(tracked.collected, "never handed out"),
            Some(result) => {
                assert!(!tracked.collected, "handed out twice");
                assert_eq!(tracked.ended, 1, "handed out without having ended once");
                tracked.collected = true;
                match result {
                    Ok(Delivered { bytes, .. }) => {
                        assert_eq!(bytes, tracked.total);
                        tracked.delivered = true;
                    }
                    Err(error) => assert!(error.confirmed_bytes() <= tracked.total, "{error}"),
                }
            }
        }
    }

    fn drain(&mut self) {
        while let Some(done) = self.sched.poll_completed() {
            assert!(done.requests > 0 && done.bytes > 0, "a completion retires blocks: {done:?}");
            let (took, _) = done.timed.expect("observed from the start: every doorbell was stamped");
            assert!(took <= self.now.saturating_duration_since(self.started), "{took:?}");
            self.completed_bytes += done.bytes;
        }
        while let Some(event) = self.sched.poll_event() {
            self.trace.push(format!("{event:?}"));
            match event {
                Event::Ended { slot } => {
                    let id = self.slot_owner[&slot];
                    let tracked = self.tracked.get_mut(&id).unwrap();
                    tracked.ended += 1;
                    assert_eq!(tracked.ended, 1, "{id:?} ended twice");
                }
                Event::Unhold { region, .. } => {
                    assert_eq!(region, LOCAL.id);
                    // Which transfer's: the one whose slot was freed, collected, not yet unheld.
                    let id = self
                        .ids
                        .iter()
                        .copied()
                        .find(|id| {
                            self.tracked[id].collected
                                && self.tracked[id].unholds == 0
                                && !self.sched.is_running(*id)
                        })
                        .expect("a hold ends only after its transfer's result was handed out");
                    self.tracked.get_mut(&id).unwrap().unholds += 1;
                }
                Event::Room => {}
                Event::LaneLost { link, .. } => self.lanes_lost.push(link),
            }
        }
    }

    /// Ends everything: every lane lost, every ringing doorbell finished, every result
    /// collected. Then every transfer ended once, was handed out once and let its hold go.
    fn settle(&mut self) {
        for lane in 0..LANES {
            self.sched.lose_link(LinkId { peer: 0, lane }, TransportError::PeerGone("end".into()));
        }
        for doorbell in std::mem::take(&mut self.ringing) {
            self.sched.finish_doorbell(doorbell, Err(TransportError::PeerGone("end".into())));
        }
        self.drain();
        for id in self.ids.clone() {
            if !self.tracked[&id].collected {
                self.collect(id);
            }
            self.drain();
        }
        // What completion events reported is what was posted and confirmed: no more than the
        // lanes took, no less than the transfers delivered.
        let posted: u64 = self.sched.lane_stats(0).unwrap().iter().map(|lane| lane.posted_bytes).sum();
        let delivered: u64 = self.tracked.values().filter(|t| t.delivered).map(|t| t.total).sum();
        assert!(
            delivered <= self.completed_bytes && self.completed_bytes <= posted,
            "{delivered} <= {} <= {posted}",
            self.completed_bytes
        );
        // Each lane was reported lost once per loss (a lane is lost again only once revived).
        for lane in 0..LANES {
            assert!(self.lanes_lost.contains(&LinkId { peer: 0, lane }), "lane {lane} lost unreported");
        }
        for (id, tracked) in &self.tracked {
            assert!(
                tracked.ended == 1 && tracked.collected && tracked.unholds == 1,
                "{id:?}: ended {}, collected {}, unheld {}",
                tracked.ended,
                tracked.collected,
                tracked.unholds
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn every_transfer_ends_once_and_lets_its_hold_go_once(steps in proptest::collection::vec(step(), 1..60)) {
        let mut harness = Harness::new();
        for step in &steps {
            harness.run(step);
        }
        harness.settle();
    }

    #[test]
    fn a_lone_blocks_doorbell_is_what_the_queues_loop_builds(
        steps in proptest::collection::vec(step_with_callers(), 1..60),
        control_lane in any::<bool>(),
    ) {
        let (mut lone, mut looped) = (Harness::warmed_with(control_lane), Harness::warmed_with(control_lane));
        looped.sched.lone_built = None;
        for step in &steps {
            lone.run(step);
            looped.run(step);
            prop_assert_eq!(&lone.trace, &looped.trace, "after {:?}", step);
        }
    }

    #[test]
    fn callers_and_the_driver_together_end_every_transfer_once(steps in proptest::collection::vec(step_with_callers(), 1..60)) {
        let mut harness = Harness::warmed();
        for step in &steps {
            harness.run(step);
        }
        harness.settle();
    }
}
