//! The chunker's posting against a mocked transport: doorbell sizes, signalling, window, exact
//! tails, error and deadline handling. (Data movement itself is tested on the loopback
//! transport.)

use async_trait::async_trait;
use mockall::mock;
use rdma_hint_core::SourceId;
use rdma_hint_core::{
    Arrival, Capabilities, Completion, CompletionStatus, LocalRegion, MemoryKind, PeerEndpoint, RegionId,
    RemoteRegion, Transport, TransportError, WaitMode, WriteOp,
};
use rdma_hint_core::{TransportFacts, TransportKind};
use rdma_hint_engine::{
    BlockSpec, Chunker, Delivered, PostPolicy, RequestError, TransferError, TransferRequest,
};
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
        posts_without_waiting: false,
    }
}

/// A NIC model inside the mock: posted signalled WRs complete in order when polled; records
/// every doorbell and the peak number of outstanding WRs. Work request numbers are the lane's
/// sequence, from 1: block `i` of a first transfer is `wr_id` `i + 1`.
#[derive(Default)]
struct Wire {
    batches: Vec<Vec<WriteOp>>,
    pending: VecDeque<Completion>,
    outstanding: u64,
    peak_outstanding: u64,
}

fn nic_with_wire(caps: Capabilities, wire: Arc<Mutex<Wire>>, fail_block: Option<u64>) -> MockNic {
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
            let failed = fail_block == Some(op.wr_id - 1);
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
                let posted: u64 = wire.batches.iter().map(|b| b.len() as u64).sum();
                let retired_before = posted - wire.outstanding;
                wire.outstanding -= completion.wr_id.saturating_sub(retired_before);
                out[0] = completion;
                Ok(1)
            }
            None => Ok(0),
        }
    });
    nic
}

fn chunker(nic: &MockNic, policy: PostPolicy, block: u64) -> Chunker {
    let mut chunker = Chunker::new(policy, nic.capabilities()).unwrap();
    chunker.set_hint(SourceId::Host(0), BlockSpec::new(block, 4096).unwrap());
    chunker
}

fn run(nic: &MockNic, policy: PostPolicy, len: u64, block: u64) -> Result<Delivered, TransferError> {
    let local = LocalRegion { id: RegionId(0), kind: MemoryKind::Host, len: len + block };
    let remote = RemoteRegion { id: RegionId(1), len: len + block };
    let deadline = Instant::now() + Duration::from_secs(5);
    let request = TransferRequest::single(&local, 0, &remote, 0, len).notify(9);
    chunker(nic, policy, block).transfer_blocking(nic, request, deadline)
}

#[test]
fn doorbells_signalling_and_window() {
    let wire = Arc::new(Mutex::new(Wire::default()));
    let nic = nic_with_wire(caps(64, 16), wire.clone(), None);
    let policy = PostPolicy { wrs_per_doorbell: 8, signal_every: 4, window: 16 };
    // 45 blocks of 64 KiB, the last one partial.
    let delivered = run(&nic, policy, 44 * 65536 + 1000, 65536).unwrap();
    assert_eq!((delivered.bytes, delivered.blocks), (44 * 65536 + 1000, 45));
    let wire = wire.lock().unwrap();
    assert!(wire.batches.iter().all(|ops| !ops.is_empty() && ops.len() <= 8), "N per doorbell at most");
    assert_eq!(
        wire.batches[..2].iter().map(Vec::len).collect::<Vec<_>>(),
        [8, 8],
        "whole doorbells while the window has room"
    );
    for ops in &wire.batches {
        for (index, op) in ops.iter().enumerate() {
            let expected = (index + 1) % 4 == 0 || index + 1 == ops.len();
            assert_eq!(op.signalled, expected, "every 4th of a doorbell and its last: {ops:?}");
        }
    }
    assert!(wire.peak_outstanding <= 16, "window respected: peak {}", wire.peak_outstanding);
    let ops: Vec<&WriteOp> = wire.batches.iter().flatten().collect();
    assert!(ops
        .iter()
        .enumerate()
        .all(|(i, op)| op.local_offset == i as u64 * 65536 && op.remote_offset == op.local_offset));
    assert_eq!(ops.last().unwrap().len, 1000, "the tail is what is left: no byte past the range is sent");
    assert_eq!(ops.last().unwrap().imm, Some(9), "the notification rides on the last block");
    assert!(ops[..ops.len() - 1].iter().all(|op| op.imm.is_none()));
}

#[test]
fn policy_is_fitted_to_the_transport() {
    let wire = Arc::new(Mutex::new(Wire::default()));
    let nic = nic_with_wire(caps(8, 4), wire.clone(), None);
    let policy = PostPolicy { wrs_per_doorbell: 32, signal_every: 16, window: 128 };
    let chunker = Chunker::new(policy, nic.capabilities()).unwrap();
    assert_eq!(chunker.policy(), PostPolicy { wrs_per_doorbell: 4, signal_every: 8, window: 8 });
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
fn a_failed_transfer_leaves_the_chunker_usable() {
    let wire = Arc::new(Mutex::new(Wire::default()));
    let nic = nic_with_wire(caps(64, 16), wire.clone(), Some(3));
    let policy = PostPolicy { wrs_per_doorbell: 8, signal_every: 4, window: 16 };
    let mut chunker = chunker(&nic, policy, 65536);
    let local = LocalRegion { id: RegionId(0), kind: MemoryKind::Host, len: 1 << 20 };
    let remote = RemoteRegion { id: RegionId(1), len: 1 << 20 };
    let deadline = Instant::now() + Duration::from_secs(5);
    let first =
        chunker.transfer_blocking(&nic, TransferRequest::single(&local, 0, &remote, 0, 1 << 20), deadline);
    assert!(matches!(first, Err(TransferError::Transport { confirmed_bytes: 0, .. })), "{first:?}");
    // The failing number is behind the lane now: the next transfer goes through whole.
    let second =
        chunker.transfer_blocking(&nic, TransferRequest::single(&local, 0, &remote, 0, 1 << 20), deadline);
    assert_eq!(second.map(|d| d.bytes).ok(), Some(1 << 20));
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
    let local = LocalRegion { id: RegionId(0), kind: MemoryKind::Host, len: 1 << 20 };
    let remote = RemoteRegion { id: RegionId(1), len: 1 << 20 };
    let started = Instant::now();
    let request = TransferRequest::single(&local, 0, &remote, 0, 1 << 20);
    let result = chunker(&nic, PostPolicy::default(), 65536).transfer_blocking(
        &nic,
        request,
        started + Duration::from_millis(50),
    );
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
fn bad_ranges_fail_before_posting() {
    let mut nic = MockNic::new();
    nic.expect_hold().returning(|_| Ok(()));
    nic.expect_unhold().return_const(());
    nic.expect_capabilities().return_const(caps(64, 16));
    nic.expect_post_writes().never();
    let mut chunker = chunker(&nic, PostPolicy::default(), 65536);
    let deadline = Instant::now() + Duration::from_secs(1);
    let local = LocalRegion { id: RegionId(0), kind: MemoryKind::Host, len: 1 << 20 };
    for (local_offset, remote_len, remote_offset) in [
        (0, 99_999, 0),
        (0, 1 << 20, (1 << 20) - 4096),
        ((1 << 20) - 99_999, 1 << 20, 0),
        (0, 1 << 20, u64::MAX),
    ] {
        let remote = RemoteRegion { id: RegionId(1), len: remote_len };
        let request = TransferRequest::single(&local, local_offset, &remote, remote_offset, 100_000);
        let result = chunker.transfer_blocking(&nic, request, deadline);
        assert!(
            matches!(result, Err(TransferError::Refused(RequestError::OutOfRegion { .. }))),
            "{local_offset} {remote_len} {remote_offset}: {result:?}"
        );
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
        assert!(Chunker::new(policy, &c).is_err(), "{policy:?}");
    }
    // More per doorbell than a doorbell holds, on a transport that claims to take them.
    let roomy = caps(1024, 256);
    assert!(Chunker::new(PostPolicy { wrs_per_doorbell: 128, signal_every: 8, window: 256 }, &roomy).is_err());
}
