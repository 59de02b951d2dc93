//! Posting behaviour against a mocked transport: batch sizes, signalling pattern, window,
//! error and deadline handling. (Data movement itself is tested on the loopback transport.)

use async_trait::async_trait;
use mockall::mock;
use rdma_hint_core::{
    Arrival, Capabilities, Completion, CompletionStatus, LocalRegion, MemoryKind, PeerEndpoint, RegionId,
    RemoteRegion, Transport, TransportError, WaitMode, WriteOp,
};
use rdma_hint_core::{TransportFacts, TransportKind};
use rdma_hint_engine::{BlockSpec, ChunkPlan, Pipeline, PostPolicy, Transfer, TransferError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mock! {
    Nic {}
    #[async_trait]
    impl Transport for Nic {
        fn capabilities(&self) -> &Capabilities;
        fn domain(&self) -> &dyn rdma_hint_core::Domain;
        fn bind(&self, address: std::net::SocketAddr) -> Result<std::net::SocketAddr, TransportError>;
        fn set_wait_mode(&self, mode: WaitMode);
        fn wait_mode(&self) -> WaitMode;
        fn register(&self, kind: MemoryKind, len: u64) -> Result<LocalRegion, TransportError>;
        fn deregister(&self, region: RegionId) -> Result<(), TransportError>;
        fn hold(&self, region: RegionId) -> Result<(), TransportError>;
        fn unhold(&self, region: RegionId);
        fn write_region(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), TransportError>;
        fn read_region(&self, region: RegionId, offset: u64, out: &mut [u8]) -> Result<(), TransportError>;
        fn copied_bytes(&self) -> rdma_hint_core::CopiedBytes;
        async fn connect(&self, peer: PeerEndpoint, expose: &[RegionId], deadline: Instant) -> Result<Vec<RemoteRegion>, TransportError>;
        fn peer_regions(&self) -> Vec<RemoteRegion>;
        fn post_writes(&self, ops: &[WriteOp]) -> Result<(), TransportError>;
        fn post_reads(&self, ops: &[rdma_hint_core::ReadOp]) -> Result<(), TransportError>;
        fn poll_completions(&self, out: &mut [Completion]) -> Result<usize, TransportError>;
        async fn wait_completions(&self, out: &mut [Completion], deadline: Instant) -> Result<usize, TransportError>;
        fn poll_arrivals(&self, out: &mut [Arrival]) -> Result<usize, TransportError>;
        async fn wait_arrivals(&self, out: &mut [Arrival], deadline: Instant) -> Result<usize, TransportError>;
    }
}

fn caps(max_outstanding: u32, max_per_post: u32) -> Capabilities {
    Capabilities {
        facts: TransportFacts {
            id: rdma_hint_core::TransportId::Custom("mock-nic".into()),
            kind: TransportKind::Verbs,
            wire_gbps: 50.0,
            nic_pcie: None,
            per_op_overhead_us: 0.35,
            mtu_bytes: Some(4096),
            max_msg_bytes: 1 << 30,
            max_payload_bytes: None,
            queried_from_backend: true,
            rate_note: None,
        },
        max_outstanding_wrs: max_outstanding,
        max_wrs_per_post: max_per_post,
        max_sges: 1,
        memory_kinds: vec![MemoryKind::Host],
        caller_memory: Vec::new(),
    }
}

/// A NIC model inside the mock: posted signalled WRs complete in order when polled; records
/// every batch and the peak number of outstanding WRs.
#[derive(Default)]
struct Wire {
    batches: Vec<Vec<WriteOp>>,
    pending: VecDeque<Completion>,
    outstanding: u64,
    peak_outstanding: u64,
}

fn nic_with_wire(caps: Capabilities, wire: Arc<Mutex<Wire>>, fail_wr: Option<u64>) -> MockNic {
    let mut nic = MockNic::new();
    nic.expect_hold().returning(|_| Ok(()));
    nic.expect_unhold().return_const(());
    nic.expect_capabilities().return_const(caps);
    let posting = wire.clone();
    nic.expect_post_writes().returning(move |ops| {
        let mut wire = posting.lock().unwrap();
        wire.batches.push(ops.to_vec());
        wire.outstanding += ops.len() as u64;
        wire.peak_outstanding = wire.peak_outstanding.max(wire.outstanding);
        for op in ops.iter().filter(|op| op.signalled) {
            let failed = fail_wr == Some(op.wr_id & 0xffff_ffff);
            let status =
                if failed { CompletionStatus::Failed { code: 10 } } else { CompletionStatus::Success };
            wire.pending.push_back(Completion { wr_id: op.wr_id, status });
        }
        Ok(())
    });
    let polling = wire.clone();
    nic.expect_poll_completions().returning(move |out| {
        let mut wire = polling.lock().unwrap();
        // Deliver one completion per poll, retiring everything up to it, as an RC QP would.
        match wire.pending.pop_front() {
            Some(completion) => {
                let last_index = completion.wr_id & 0xffff_ffff;
                let posted: u64 = wire.batches.iter().map(|b| b.len() as u64).sum();
                let retired_before = posted - wire.outstanding;
                wire.outstanding -= (last_index + 1).saturating_sub(retired_before);
                out[0] = completion;
                Ok(1)
            }
            None => Ok(0),
        }
    });
    nic
}

fn run(
    nic: &MockNic,
    policy: PostPolicy,
    len: u64,
    block: u64,
) -> Result<rdma_hint_engine::TransferReport, TransferError> {
    let mut pipeline = Pipeline::new(policy, nic.capabilities()).unwrap();
    let plan = ChunkPlan::new(len + block, 0, len, BlockSpec::new(block, 4096).unwrap()).unwrap();
    let remote = RemoteRegion { id: RegionId(1), len: len + block };
    let deadline = Instant::now() + Duration::from_secs(5);
    let local = LocalRegion { id: RegionId(0), kind: MemoryKind::Host, len: len + block };
    rdma_hint_backend_core::blocking::block_on(pipeline.run(
        nic,
        &plan,
        &Transfer::new(&local, &remote, len).notify(9),
        deadline,
    ))
}

#[test]
fn batches_signalling_and_window() {
    let wire = Arc::new(Mutex::new(Wire::default()));
    let nic = nic_with_wire(caps(64, 16), wire.clone(), None);
    let policy = PostPolicy { wrs_per_doorbell: 8, signal_every: 4, window: 16 };
    // 45 blocks of 64 KiB, the last one partial.
    let report = run(&nic, policy, 44 * 65536 + 1000, 65536).unwrap();
    assert_eq!(report.blocks, 45);
    assert_eq!(report.doorbells, 6);
    let wire = wire.lock().unwrap();
    let sizes: Vec<usize> = wire.batches.iter().map(Vec::len).collect();
    assert_eq!(sizes, [8, 8, 8, 8, 8, 5], "N per doorbell, remainder last");
    let signalled: Vec<u64> =
        wire.batches.iter().flatten().filter(|op| op.signalled).map(|op| op.wr_id & 0xffff_ffff).collect();
    assert_eq!(signalled, [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 44], "every 4th and the last");
    assert!(wire.peak_outstanding <= 16, "window respected: peak {}", wire.peak_outstanding);
    let ops: Vec<&WriteOp> = wire.batches.iter().flatten().collect();
    assert!(ops
        .iter()
        .enumerate()
        .all(|(i, op)| op.local_offset == i as u64 * 65536 && op.remote_offset == op.local_offset));
    assert_eq!(ops.last().unwrap().len, 4096, "tail padded to the 4 KiB alignment");
    assert_eq!(ops.last().unwrap().imm, Some(9), "the notification rides on the last block");
    assert!(ops[..ops.len() - 1].iter().all(|op| op.imm.is_none()));
    assert_eq!(report.signalled, 12);
}

#[test]
fn policy_is_fitted_to_the_transport() {
    let wire = Arc::new(Mutex::new(Wire::default()));
    let nic = nic_with_wire(caps(8, 4), wire.clone(), None);
    let policy = PostPolicy { wrs_per_doorbell: 32, signal_every: 16, window: 128 };
    let pipeline = Pipeline::new(policy, nic.capabilities()).unwrap();
    assert_eq!(pipeline.policy(), PostPolicy { wrs_per_doorbell: 4, signal_every: 8, window: 8 });
    run(&nic, policy, 20 * 65536, 65536).unwrap();
    let wire = wire.lock().unwrap();
    assert!(wire.batches.iter().all(|b| b.len() <= 4));
    assert!(wire.peak_outstanding <= 8);
}

#[test]
fn failed_completion_reports_confirmed_prefix() {
    let wire = Arc::new(Mutex::new(Wire::default()));
    // Block 11 (the third signalled one with k = 4) fails: blocks 0..=7 were confirmed.
    let nic = nic_with_wire(caps(64, 16), wire, Some(11));
    let policy = PostPolicy { wrs_per_doorbell: 8, signal_every: 4, window: 16 };
    match run(&nic, policy, 32 * 65536, 65536) {
        Err(TransferError::Transport {
            source: TransportError::Completion { code: 10, .. },
            confirmed_bytes,
        }) => {
            assert_eq!(confirmed_bytes, 8 * 65536)
        }
        other => panic!("expected a completion error, got {other:?}"),
    }
}

#[test]
fn silent_transport_hits_the_deadline_instead_of_hanging() {
    let mut nic = MockNic::new();
    nic.expect_hold().returning(|_| Ok(()));
    nic.expect_unhold().return_const(());
    nic.expect_capabilities().return_const(caps(64, 16));
    nic.expect_post_writes().returning(|_| Ok(()));
    nic.expect_poll_completions().returning(|_| Ok(0));
    nic.expect_wait_completions().returning(|_, deadline| {
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        Err(TransportError::DeadlineExceeded { what: "mock", waited_ms: 50 })
    });
    let mut pipeline = Pipeline::new(PostPolicy::default(), nic.capabilities()).unwrap();
    let plan = ChunkPlan::new(1 << 20, 0, 1 << 20, BlockSpec::new(65536, 4096).unwrap()).unwrap();
    let remote = RemoteRegion { id: RegionId(1), len: 1 << 20 };
    let started = Instant::now();
    let local = LocalRegion { id: RegionId(0), kind: MemoryKind::Host, len: 1 << 20 };
    let transfer = Transfer::new(&local, &remote, 1 << 20);
    let result = rdma_hint_backend_core::blocking::block_on(pipeline.run(
        &nic,
        &plan,
        &transfer,
        started + Duration::from_millis(50),
    ));
    assert!(
        matches!(result, Err(TransferError::DeadlineExceeded { confirmed_bytes: 0, len: 1048576 })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn post_error_stops_the_transfer() {
    let mut nic = MockNic::new();
    nic.expect_hold().returning(|_| Ok(()));
    nic.expect_unhold().return_const(());
    nic.expect_capabilities().return_const(caps(64, 16));
    nic.expect_post_writes().times(1).returning(|_| Err(TransportError::PeerGone("reset".into())));
    let result = run(&nic, PostPolicy::default(), 1 << 20, 65536);
    assert!(matches!(
        result,
        Err(TransferError::Transport { source: TransportError::PeerGone(_), confirmed_bytes: 0 })
    ));
}

#[test]
fn bad_remote_ranges_fail_before_posting() {
    let mut nic = MockNic::new();
    nic.expect_hold().returning(|_| Ok(()));
    nic.expect_unhold().return_const(());
    nic.expect_capabilities().return_const(caps(64, 16));
    nic.expect_post_writes().never();
    let mut pipeline = Pipeline::new(PostPolicy::default(), nic.capabilities()).unwrap();
    let plan = ChunkPlan::new(1 << 20, 0, 100_000, BlockSpec::new(65536, 4096).unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    for (remote_len, remote_offset) in
        [(99_999, 0), (100_000, 0), (1 << 20, 100), (1 << 20, (1 << 20) - 4096)]
    {
        let remote = RemoteRegion { id: RegionId(1), len: remote_len };
        let local = LocalRegion { id: RegionId(0), kind: MemoryKind::Host, len: 1 << 20 };
        let transfer = Transfer::new(&local, &remote, 100_000).at(0, remote_offset);
        let result =
            rdma_hint_backend_core::blocking::block_on(pipeline.run(&nic, &plan, &transfer, deadline));
        assert!(matches!(result, Err(TransferError::Plan(_))), "{remote_len} {remote_offset}: {result:?}");
    }
}

#[test]
fn invalid_policies_are_rejected() {
    let c = caps(64, 16);
    for policy in [
        PostPolicy { wrs_per_doorbell: 0, ..PostPolicy::default() },
        PostPolicy { window: 4, wrs_per_doorbell: 8, signal_every: 2 },
        PostPolicy { window: 8, wrs_per_doorbell: 8, signal_every: 16 },
    ] {
        assert!(Pipeline::new(policy, &c).is_err(), "{policy:?}");
    }
}
