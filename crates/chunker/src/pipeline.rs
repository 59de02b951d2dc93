//! The posting engine: batches per doorbell, selective signalling, a bounded window refilled
//! as completions arrive. Buffers are sized once; a transfer allocates nothing.

use crate::error::{PlanError, TransferError};
use crate::plan::ChunkPlan;
use crate::policy::PostPolicy;
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

const INDEX_BITS: u32 = 32;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

impl Pipeline {
    /// A pipeline for a transport with `caps`; the policy is fitted to the transport's limits.
    pub fn new(policy: PostPolicy, caps: &Capabilities) -> Result<Pipeline, PlanError> {
        policy.validate()?;
        let policy = policy.fitted_to(caps);
        policy.validate()?;
        Ok(Pipeline {
            policy,
            max_msg_bytes: caps.facts.max_msg_bytes,
            ops: Vec::with_capacity(policy.wrs_per_doorbell as usize),
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
        if remote_offset % align_bytes != 0 {
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

    /// Writes `plan` (blocks of the local region `local`) to `remote` at `remote_offset`.
    ///
    /// Completes when every block is confirmed; on error reports how many payload bytes were
    /// confirmed, counted in order from the start.
    pub async fn run<T: Transport + ?Sized>(
        &mut self,
        transport: &T,
        plan: &ChunkPlan,
        local: RegionId,
        remote: &RemoteRegion,
        remote_offset: u64,
        deadline: Instant,
    ) -> Result<TransferReport, TransferError> {
        self.check_remote(plan, remote, remote_offset)?;
        self.sequence = self.sequence.wrapping_add(1);
        let tag = u64::from(self.sequence) << INDEX_BITS;
        let policy = self.policy;
        let count = plan.block_count();
        let batches = policy.batch_count(count);
        let window = u64::from(policy.window);
        let (mut next_batch, mut posted, mut retired, mut signalled) = (0u64, 0u64, 0u64, 0u64);
        let failed = |source: TransportError, retired: u64| TransferError::Transport {
            source,
            confirmed_bytes: plan.payload_through(retired),
        };

        while retired < count {
            while next_batch < batches {
                let range = policy.batch(next_batch, count);
                if posted - retired + (range.end - range.start) > window {
                    break;
                }
                self.ops.clear();
                for index in range {
                    let block = plan.block(index);
                    let is_signalled = policy.is_signalled(index, count);
                    signalled += u64::from(is_signalled);
                    self.ops.push(WriteOp {
                        wr_id: tag | index,
                        local,
                        local_offset: block.offset,
                        remote: remote.id,
                        remote_offset: remote_offset + (block.offset - plan.offset()),
                        len: block.wire_len,
                        signalled: is_signalled,
                        imm: None,
                    });
                }
                transport.post_writes(&self.ops).map_err(|e| failed(e, retired))?;
                posted += self.ops.len() as u64;
                next_batch += 1;
            }

            let mut ready =
                transport.poll_completions(&mut self.completions).map_err(|e| failed(e, retired))?;
            if ready == 0 {
                if Instant::now() >= deadline {
                    return Err(TransferError::DeadlineExceeded {
                        confirmed_bytes: plan.payload_through(retired),
                        len: plan.len(),
                    });
                }
                ready = match transport.wait_completions(&mut self.completions, deadline).await {
                    Ok(ready) => ready,
                    Err(TransportError::DeadlineExceeded { .. }) => {
                        return Err(TransferError::DeadlineExceeded {
                            confirmed_bytes: plan.payload_through(retired),
                            len: plan.len(),
                        })
                    }
                    Err(other) => return Err(failed(other, retired)),
                };
            }
            for completion in &self.completions[..ready] {
                if completion.wr_id & !INDEX_MASK != tag {
                    // Left over from an earlier transfer that stopped early.
                    continue;
                }
                match completion.status {
                    CompletionStatus::Success => {
                        retired = retired.max((completion.wr_id & INDEX_MASK) + 1).min(posted)
                    }
                    CompletionStatus::Failed { code } => {
                        return Err(failed(
                            TransportError::Completion { wr_id: completion.wr_id, code },
                            retired,
                        ))
                    }
                }
            }
        }
        Ok(TransferReport {
            payload_bytes: plan.len(),
            wire_bytes: plan.wire_bytes(),
            blocks: count,
            doorbells: batches,
            signalled,
        })
    }
}
