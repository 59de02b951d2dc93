//! Completions and failures reaching the scheduler: which posted blocks a completion retires,
//! which transfers that ends, what a lost lane takes down with it.

use super::super::Delivered;
use super::slot::{Phase, Posted};
use super::{Completed, Event, LinkId, Scheduler};
use crate::TransferError;
use rdma_hint_core::{Completion, CompletionStatus, ErrorKind, TransportError};
use std::time::Instant;

impl Scheduler {
    /// Retires, per completion of `link`, every work request posted on it up to its number
    /// (cumulatively: stale or repeated numbers retire nothing more). A failed completion of
    /// a request in flight fails the lane; numbers the lane never posted, and failures of
    /// requests no longer in flight, change nothing. Whether anything was retired or failed.
    pub(crate) fn handle_completions(
        &mut self,
        link: LinkId,
        completions: &[Completion],
        now: Instant,
    ) -> bool {
        let mut retired_bytes = 0;
        let mut worked = false;
        for completion in completions {
            let lane = self.lane(link);
            // A number the lane never posted vouches for nothing; a failure of a request no
            // longer in flight (lost with its lane, or a late answer to one an earlier
            // failure already took out) is not this lane's news any more.
            let posted = completion.wr_id < lane.next_seq;
            let (in_flight_before, retired_before) = (lane.in_flight.len(), retired_bytes);
            let in_flight = lane.in_flight.front().is_some_and(|oldest| oldest.seq <= completion.wr_id);
            match completion.status {
                _ if !posted => continue,
                CompletionStatus::Failed { .. } if !in_flight => continue,
                CompletionStatus::Failed { code } => {
                    self.lose_link(link, TransportError::Completion { wr_id: completion.wr_id, code });
                    return true;
                }
                CompletionStatus::Success => {}
            }
            // A run of one transfer's blocks at a time: a bulk transfer's window retires in a
            // few steps, not a step per block.
            loop {
                let lane = self.lane_mut(link);
                let Some(first) = lane.in_flight.front().copied().filter(|p| p.seq <= completion.wr_id)
                else {
                    break;
                };
                let (mut blocks, mut bytes) = (0, 0);
                while let Some(posted) = lane.in_flight.front().filter(|p| {
                    p.seq <= completion.wr_id && p.slot == first.slot && p.generation == first.generation
                }) {
                    (blocks, bytes) = (blocks + 1, bytes + posted.bytes);
                    lane.in_flight.pop_front();
                }
                lane.outstanding_bytes -= bytes;
                retired_bytes += bytes;
                worked = true;
                if self.retire_blocks(Posted { bytes, ..first }, blocks) {
                    self.learn_latency(first.slot, now);
                }
            }
            if self.observed {
                let requests = in_flight_before - self.lane(link).in_flight.len();
                self.record_completion(link, completion.wr_id, requests, retired_bytes - retired_before, now);
            }
        }
        if retired_bytes > 0 {
            self.lane_mut(link).retired(retired_bytes, now);
        }
        worked
    }

    /// What a poll of `link` (or a wait on it) answered: the one place the engine's
    /// completions reach the scheduler. Whether anything was retired or failed.
    pub(crate) fn take_polled(
        &mut self,
        link: LinkId,
        polled: Result<&[Completion], TransportError>,
        now: Instant,
    ) -> bool {
        match polled {
            Ok(completions) => self.handle_completions(link, completions, now),
            Err(error) => {
                self.lose_link(link, error);
                true
            }
        }
    }

    /// Observed: what completion `wr_id` of `link` retired (nothing, for one that retired
    /// none), timed from its doorbell's stamp (none for a doorbell built before the
    /// scheduler was observed).
    fn record_completion(&mut self, link: LinkId, wr_id: u64, requests: usize, bytes: u64, now: Instant) {
        let stamp = self.lane_mut(link).stamp_of(wr_id);
        if requests > 0 {
            let timed = stamp.map(|stamp| (now.saturating_duration_since(stamp.at), stamp.bytes_ahead));
            let reads = self.lane(link).reading;
            self.completed.push_back(Completed { link, requests: requests as u32, bytes, reads, timed });
        }
    }

    /// Retires one posted block; whether it was its transfer's last, which delivered it.
    pub(super) fn retire_block(&mut self, posted: Posted) -> bool {
        self.retire_blocks(posted, 1)
    }

    /// Retires `blocks` posted blocks of one transfer, `posted.bytes` of them in all; whether
    /// the last of them was its transfer's last, which delivered it.
    fn retire_blocks(&mut self, posted: Posted, blocks: u64) -> bool {
        let slot = &mut self.slots[posted.slot as usize];
        if slot.generation != posted.generation {
            return false;
        }
        slot.in_flight -= blocks;
        slot.confirmed += posted.bytes;
        match slot.phase {
            Phase::Running if slot.in_flight == 0 && slot.all_posted() => {
                let delivered = Delivered { bytes: slot.total, blocks: slot.blocks };
                self.end(posted.slot, Ok(delivered));
                return true;
            }
            Phase::Collected if slot.in_flight == 0 => self.release(posted.slot),
            _ => {}
        }
        false
    }

    /// A transfer delivered at `now`: a latency-first one's time from queue to end joins its
    /// peer's average (the latest weighs an eighth).
    fn learn_latency(&mut self, index: u32, now: Instant) {
        let slot = &self.slots[index as usize];
        if slot.latency_first {
            let took =
                u64::try_from(now.saturating_duration_since(slot.queued_at).as_nanos()).unwrap_or(u64::MAX);
            let peer = &mut self.peers[slot.peer as usize];
            peer.latency_first_took_ns = Some(
                peer.latency_first_took_ns
                    .map_or(took, |average| average.saturating_mul(7).saturating_add(took) / 8),
            );
        }
    }

    /// A lane that failed takes down every transfer with a block on it (posted, or refused and
    /// waiting to go again); the connection goes on over its other lanes, and with none left
    /// every transfer queued for the peer fails.
    pub(crate) fn lose_link(&mut self, link: LinkId, error: TransportError) {
        let reason = error.to_string();
        let mut error = Some(error);
        let lane = self.lane_mut(link);
        if lane.dead.is_some() {
            return;
        }
        lane.dead = Some(reason.clone());
        lane.outstanding_bytes = 0;
        if let Some(stamps) = &mut lane.stamps {
            stamps.clear();
        }
        if self.observed {
            self.events.push_back(Event::LaneLost {
                link,
                error: error.as_ref().map_or(ErrorKind::System, TransportError::kind),
            });
        }
        let lane = self.lane_mut(link);
        lane.refused_entries.clear();
        let refused = lane.refused.drain(..).map(|refused| refused.posted);
        let posted: Vec<Posted> = lane.in_flight.drain(..).chain(refused).collect();
        for posted in posted {
            let slot = &mut self.slots[posted.slot as usize];
            if slot.generation != posted.generation {
                continue;
            }
            let confirmed_bytes = slot.confirmed;
            slot.cancelled = true;
            let source = error.take().unwrap_or_else(|| TransportError::PeerGone(reason.clone()));
            self.end(posted.slot, Err(TransferError::Transport { source, confirmed_bytes }));
            // The block will never retire: count it out (with no bytes) so the slot can come
            // free.
            self.retire_block(Posted { bytes: 0, ..posted });
        }
        let peer_state = &mut self.peers[link.peer as usize];
        let all_dead = peer_state.lanes.iter().all(|lane| lane.dead.is_some());
        let (slots, events) = (&mut self.slots, &mut self.events);
        for queue in [&mut peer_state.latency, &mut peer_state.bulk] {
            queue.retain(|&index| {
                let slot = &mut slots[index as usize];
                let keep = !slot.cancelled && !all_dead;
                if !keep {
                    let source = TransportError::PeerGone(format!("every lane to the peer failed: {reason}"));
                    let confirmed_bytes = slot.confirmed;
                    if slot.end(Err(TransferError::Transport { source, confirmed_bytes })) {
                        events.push_back(Event::Ended { slot: index });
                    }
                }
                keep
            });
        }
    }

    /// Takes a lost lane back into service, empty (a chunker's borrowed transport: its next
    /// post says whether it still can). Its sequence numbers go on from where they were, so a
    /// late completion of a request lost with it retires nothing posted since.
    pub(crate) fn revive_link(&mut self, link: LinkId) {
        self.lane_mut(link).dead = None;
    }
}
