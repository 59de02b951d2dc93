//! The posting engine: batches per doorbell, selective signalling, a bounded window refilled
//! as completions arrive. Buffers are sized once; a transfer allocates nothing.

use crate::error::{PlanError, TransferError};
use crate::plan::{Blocks, ChunkPlan};
use crate::policy::{PostPolicy, SignalSchedule};
use crate::transfer::Transfer;
use rdma_hint_core::{
    Capabilities, Completion, CompletionStatus, RegionId, RemoteRegion, Transport, TransportError, WriteOp,
};
use serde::Serialize;
use std::time::Instant;

/// What a finished transfer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TransferReport {
    /// Payload bytes delivered (exactly the requested length).
    pub payload_bytes: u64,
    /// Bytes put on the wire (payload + tail padding).
    pub wire_bytes: u64,
    /// Blocks (work requests) posted.
    pub blocks: u64,
    /// `post_writes` calls (doorbells).
    pub doorbells: u64,
    /// Signalled work requests.
    pub signalled: u64,
}

/// Runs plans over a transport with one [`PostPolicy`].
#[derive(Debug)]
pub struct Pipeline {
    policy: PostPolicy,
    max_msg_bytes: u64,
    ops: Vec<WriteOp>,
    completions: Vec<Completion>,
    sequence: u32,
}

/// How long a transfer runs without waiting before it yields to its executor once.
pub(crate) const YIELD_AFTER: std::time::Duration = std::time::Duration::from_micros(200);
/// Blocks posted between two looks at the clock (deadline, time slice).
const CHECK_EVERY_BLOCKS: u64 = 256;

/// Returns `Pending` once (waking itself first), so the executor runs other tasks.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

const INDEX_BITS: u32 = 32;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

impl Pipeline {
    /// A pipeline for a transport with `caps`; the policy is fitted to the transport's limits.
    pub fn new(policy: PostPolicy, caps: &Capabilities) -> Result<Pipeline, TransferError> {
        policy.validate()?;
        let policy = policy.fitted_to(caps);
        policy.validate()?;
        Ok(Pipeline {
            policy,
            max_msg_bytes: caps.facts.max_msg_bytes,
            ops: vec![WriteOp::EMPTY; policy.wrs_per_doorbell as usize],
            completions: vec![Completion::EMPTY; policy.window as usize],
            sequence: 0,
        })
    }

    /// The policy in use (after fitting to the transport).
    pub fn policy(&self) -> PostPolicy {
        self.policy
    }

    fn check_remote(
        &self,
        plan: &ChunkPlan,
        remote: &RemoteRegion,
        remote_offset: u64,
    ) -> Result<(), PlanError> {
        let align_bytes = plan.spec().align_bytes();
        if !remote_offset.is_multiple_of(align_bytes) {
            return Err(PlanError::MisalignedOffset { side: "remote", offset: remote_offset, align_bytes });
        }
        let region_len = remote.len;
        let out_of_region =
            PlanError::OutOfRegion { side: "remote", offset: remote_offset, len: plan.len(), region_len };
        let payload_end = remote_offset.checked_add(plan.len()).ok_or(out_of_region.clone())?;
        if payload_end > region_len {
            return Err(out_of_region);
        }
        let padded_end = remote_offset.checked_add(plan.wire_bytes()).ok_or(out_of_region)?;
        if padded_end > region_len {
            return Err(PlanError::PaddingOutsideRegion {
                side: "remote",
                padded_end,
                region_len,
                padding: padded_end - region_len,
            });
        }
        if plan.spec().block_bytes() > self.max_msg_bytes {
            return Err(PlanError::InvalidPolicy(format!(
                "block {} B exceeds the transport's max message {} B",
                plan.spec().block_bytes(),
                self.max_msg_bytes
            )));
        }
        if plan.block_count() > INDEX_MASK {
            return Err(PlanError::InvalidPolicy(format!(
                "{} blocks exceed 2^32 per transfer; use a larger block",
                plan.block_count()
            )));
        }
        Ok(())
    }

    /// Writes `plan` (blocks of `transfer.local`) to `transfer.remote` at
    /// `transfer.remote_offset`; the last block carries `transfer.notify` as its immediate.
    ///
    /// Completes when every block is confirmed; on error reports how many payload bytes were
    /// confirmed, counted in order from the start.
    pub async fn run<T: Transport + ?Sized>(
        &mut self,
        transport: &T,
        plan: &ChunkPlan,
        transfer: &Transfer<'_>,
        deadline: Instant,
    ) -> Result<TransferReport, TransferError> {
        self.check_remote(plan, transfer.remote, transfer.remote_offset)?;
        // Held until this returns or is dropped: the source can be neither released nor its
        // id reused for other memory while blocks of it are still to be posted.
        let _held = SourceHold::take(transport, transfer.local.id)
            .map_err(|source| TransferError::Transport { source, confirmed_bytes: 0 })?;
        self.sequence = self.sequence.wrapping_add(1);
        let job = Job {
            plan: *plan,
            local: transfer.local.id,
            remote: transfer.remote.id,
            remote_offset: transfer.remote_offset,
            tag: u64::from(self.sequence) << INDEX_BITS,
            notify: transfer.notify,
        };
        // What every op of this transfer shares is written once; the loop fills in the rest.
        for slot in &mut self.ops {
            *slot = WriteOp { local: job.local, remote: job.remote, ..WriteOp::EMPTY };
        }
        let mut progress = Progress {
            blocks: plan.blocks(),
            posted: 0,
            retired: 0,
            doorbells: 0,
            schedule: SignalSchedule::new(&self.policy),
        };
        let count = plan.block_count();
        let failed = |source: TransportError, retired: u64| TransferError::Transport {
            source,
            confirmed_bytes: plan.payload_through(retired),
        };
        let deadline_passed = |retired: u64| TransferError::DeadlineExceeded {
            confirmed_bytes: plan.payload_through(retired),
            len: plan.len(),
        };

        // A transport whose completions are always ready (UCX over shm copies inside the post)
        // never waits, so every CHECK_EVERY_BLOCKS posted blocks (not every round:
        // `Instant::now` is on the posting path) the deadline is checked and, after a time
        // slice, the task yields to its executor: a long transfer does not starve the other
        // tasks on its thread.
        // A transport whose posts are slow themselves (Soft-RoCE does the NIC's work inside
        // `ibv_post_send`) gets its clock read after every doorbell instead, once
        // CHECK_EVERY_BLOCKS blocks alone took longer than a slice.
        let mut next_check = CHECK_EVERY_BLOCKS;
        let mut slice_start = Instant::now();
        let mut last_check = slice_start;
        let mut slow_posts = false;
        while progress.retired < count {
            if progress.posted >= next_check {
                next_check = progress.posted + CHECK_EVERY_BLOCKS;
                let now = Instant::now();
                if now >= deadline {
                    return Err(deadline_passed(progress.retired));
                }
                slow_posts |= now.duration_since(last_check) >= YIELD_AFTER;
                last_check = now;
                if now.duration_since(slice_start) >= YIELD_AFTER {
                    yield_now().await;
                    slice_start = Instant::now();
                }
            }
            let slice = slow_posts.then_some(slice_start);
            let yield_wanted = self
                .post_ready(transport, &job, &mut progress, slice)
                .map_err(|e| failed(e, progress.retired))?;
            if yield_wanted {
                yield_now().await;
                slice_start = Instant::now();
            }
            let mut ready =
                transport.poll_completions(&mut self.completions).map_err(|e| failed(e, progress.retired))?;
            if ready == 0 {
                if Instant::now() >= deadline {
                    return Err(deadline_passed(progress.retired));
                }
                ready = match transport.wait_completions(&mut self.completions, deadline).await {
                    Ok(ready) => ready,
                    Err(TransportError::DeadlineExceeded { .. }) => {
                        return Err(deadline_passed(progress.retired))
                    }
                    Err(other) => return Err(failed(other, progress.retired)),
                };
            }
            self.retire(ready, &job, &mut progress).map_err(|e| failed(e, progress.retired))?;
        }
        Ok(TransferReport {
            payload_bytes: plan.len(),
            wire_bytes: plan.wire_bytes(),
            blocks: count,
            doorbells: progress.doorbells,
            signalled: self.policy.signalled_count(count),
        })
    }

    /// Posts every whole batch the window has room for. Synchronous, and working on local
    /// copies, so the hot loop keeps its counters in registers rather than in the future's state.
    /// With `slice` (slow posts), stops after the doorbell that ends the time slice begun then
    /// and returns `true`: the caller yields before posting more.
    fn post_ready<T: Transport + ?Sized>(
        &mut self,
        transport: &T,
        job: &Job,
        progress: &mut Progress,
        slice: Option<Instant>,
    ) -> Result<bool, TransportError> {
        let mut p = *progress;
        let plan = &job.plan;
        let count = plan.block_count();
        let window = u64::from(self.policy.window);
        let remote_shift = job.remote_offset.wrapping_sub(plan.offset());
        while p.posted < count {
            let end = self.policy.batch_end(p.posted, count);
            if end - p.retired > window {
                break;
            }
            let ops = &mut self.ops[..(end - p.posted) as usize];
            for (slot, index) in ops.iter_mut().zip(p.posted..) {
                let Some(block) = p.blocks.next() else { break };
                slot.wr_id = job.tag | index;
                slot.local_offset = block.offset;
                slot.remote_offset = block.offset.wrapping_add(remote_shift);
                slot.len = block.wire_len;
                slot.signalled = p.schedule.next_is_signalled();
            }
            if end == count {
                // The last block always asks for a completion and carries the notification.
                if let Some(last) = ops.last_mut() {
                    last.signalled = true;
                    last.imm = job.notify;
                }
            }
            transport.post_writes(ops)?;
            p.posted = end;
            p.doorbells += 1;
            if slice.is_some_and(|start| start.elapsed() >= YIELD_AFTER) {
                *progress = p;
                return Ok(true);
            }
        }
        *progress = p;
        Ok(false)
    }

    /// Retires every block up to the newest successful completion of this transfer.
    fn retire(&self, ready: usize, job: &Job, progress: &mut Progress) -> Result<(), TransportError> {
        for completion in &self.completions[..ready] {
            if completion.wr_id & !INDEX_MASK != job.tag {
                // Left over from an earlier transfer that stopped early.
                continue;
            }
            match completion.status {
                CompletionStatus::Success => {
                    progress.retired =
                        progress.retired.max((completion.wr_id & INDEX_MASK) + 1).min(progress.posted)
                }
                CompletionStatus::Failed { code } => {
                    return Err(TransportError::Completion { wr_id: completion.wr_id, code })
                }
            }
        }
        Ok(())
    }
}

/// What one transfer writes where.
#[derive(Debug, Clone, Copy)]
struct Job {
    plan: ChunkPlan,
    local: RegionId,
    remote: RegionId,
    remote_offset: u64,
    tag: u64,
    notify: Option<u32>,
}

/// Counters of one transfer.
#[derive(Debug, Clone, Copy)]
struct Progress {
    blocks: Blocks,
    posted: u64,
    retired: u64,
    doorbells: u64,
    schedule: SignalSchedule,
}

/// A transfer's hold on its source region ([`Transport::hold`]), ended when dropped.
struct SourceHold<'t, T: Transport + ?Sized> {
    transport: &'t T,
    region: RegionId,
}

impl<'t, T: Transport + ?Sized> SourceHold<'t, T> {
    fn take(transport: &'t T, region: RegionId) -> Result<Self, TransportError> {
        transport.hold(region)?;
        Ok(SourceHold { transport, region })
    }
}

impl<T: Transport + ?Sized> Drop for SourceHold<'_, T> {
    fn drop(&mut self) {
        self.transport.unhold(self.region);
    }
}
