//! Which slots of a [`RegionTable`](crate::RegionTable) hold a region, and how many queued or
//! running transfers name each: one atomic word per slot, shared with the domain outside the
//! table's lock. A transfer engine holds its source at every submit and lets it go at every
//! collect; through the table's read lock that was a lock, a count and an unlock each way
//! (six locked instructions a transfer). In one word, a hold and a removal still see each
//! other: whichever swaps the word first wins, and a removal only swaps a word that is live
//! and unheld.

use rdma_hint_core::{RegionId, TransportError};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// The word's bit that says a region lives in the slot; the bits below count its holds.
const LIVE: u32 = 1 << 31;

/// The hold words of one table's slots (cloned: the same words).
///
/// A held region cannot be removed, so neither its memory nor its id can change under the
/// transfer that names it:
///
/// ```
/// use rdma_hint_backend_core::RegionTable;
/// use rdma_hint_core::TransportError;
/// let mut table = RegionTable::new(4);
/// let id = table.insert_with(4096, || Ok("a")).unwrap();
/// let holds = table.holds(); // kept outside the table's lock
/// holds.hold(id).unwrap();
/// assert!(matches!(table.remove(id), Err(TransportError::RegionBusy { .. })));
/// holds.unhold(id);
/// assert_eq!(table.remove(id).unwrap(), "a");
/// assert!(holds.hold(id).is_err()); // nothing lives there now
/// ```
#[derive(Debug, Clone)]
pub struct Holds(Arc<[AtomicU32]>);

impl Holds {
    /// Words for `slots` slots, none live.
    pub(crate) fn new(slots: usize) -> Holds {
        Holds((0..slots).map(|_| AtomicU32::new(0)).collect())
    }

    fn word(&self, id: RegionId) -> Result<&AtomicU32, TransportError> {
        // Not `ok_or`: an error built and dropped on every hold costs more than the hold.
        match self.0.get(id.0 as usize) {
            Some(word) => Ok(word),
            None => Err(TransportError::UnregisteredRegion(id)),
        }
    }

    /// Counts one more transfer naming `id`; refused when no region lives there.
    pub fn hold(&self, id: RegionId) -> Result<(), TransportError> {
        let counted =
            self.word(id)?.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| match word & !LIVE {
                _ if word & LIVE == 0 => None,
                held if held == !LIVE => None,
                _ => Some(word + 1),
            });
        match counted {
            Ok(_) => Ok(()),
            Err(word) if word & LIVE == 0 => Err(TransportError::UnregisteredRegion(id)),
            Err(_) => {
                Err(TransportError::RegionBusy { region: id, why: "2 147 483 647 transfers already name it" })
            }
        }
    }

    /// Ends one [`hold`](Holds::hold) of `id` (none held, or nothing lives there: nothing).
    pub fn unhold(&self, id: RegionId) {
        if let Ok(word) = self.word(id) {
            let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                (word & !LIVE > 0).then(|| word - 1)
            });
        }
    }

    /// Whether a transfer holds `id`.
    pub(crate) fn held(&self, id: RegionId) -> bool {
        self.word(id).is_ok_and(|word| word.load(Ordering::Acquire) & !LIVE > 0)
    }

    /// A region lives in slot `index` from now on, unheld (the table's write lock is held).
    pub(crate) fn open(&self, index: usize) {
        self.0[index].store(LIVE, Ordering::Release);
    }

    /// Ends the region of `id` unless a transfer holds it: whether it ended.
    pub(crate) fn close(&self, id: RegionId) -> bool {
        self.word(id)
            .is_ok_and(|word| word.compare_exchange(LIVE, 0, Ordering::AcqRel, Ordering::Acquire).is_ok())
    }

    /// Ends every region, held or not (the table is drained).
    pub(crate) fn close_all(&self) {
        self.0.iter().for_each(|word| word.store(0, Ordering::Release));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_and_a_removal_racing_never_both_win() {
        // Two threads meet at a barrier each round and race: either the hold counted (and the
        // close failed) or the close ended the region (and the hold was refused); never both,
        // never neither.
        let holds = Holds::new(1);
        let id = RegionId(0);
        let rounds = 20_000;
        let (start, end) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|scope| {
            let holder = scope.spawn(|| {
                let mut won = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    start.wait();
                    won.push(holds.hold(id).is_ok());
                    end.wait();
                }
                won
            });
            let mut closed = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                holds.open(0);
                start.wait();
                closed.push(holds.close(id));
                end.wait();
                // Whatever the hold counted is let go before the next round.
                holds.unhold(id);
                holds.close(id);
            }
            let held = holder.join().unwrap();
            for (round, (held, closed)) in held.iter().zip(&closed).enumerate() {
                assert!(held != closed, "round {round}: held {held}, closed {closed}");
            }
        });
    }

    #[test]
    fn an_unhold_never_ends_a_region_nor_counts_below_zero() {
        let holds = Holds::new(2);
        holds.open(1);
        holds.unhold(RegionId(1));
        holds.unhold(RegionId(0)); // nothing lives there
        holds.unhold(RegionId(9)); // no such slot
        assert!(!holds.held(RegionId(1)));
        holds.hold(RegionId(1)).unwrap();
        assert!(holds.held(RegionId(1)));
        assert!(!holds.close(RegionId(1)));
        holds.unhold(RegionId(1));
        assert!(holds.close(RegionId(1)));
        assert!(matches!(holds.hold(RegionId(9)), Err(TransportError::UnregisteredRegion(RegionId(9)))));
    }
}
