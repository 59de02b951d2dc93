//! Values lent out of the transport to other threads (a connect's rendezvous thread, the event
//! thread), counted so that the transport's `Drop` can wait until every one is back: the verbs
//! objects they hold `Arc`s of are then released by the transport, in its field order.

use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Counts the values lent to other threads; the transport's `Drop` waits for zero.
#[derive(Debug, Default)]
pub(crate) struct Lending {
    out: Mutex<usize>,
    returned: Condvar,
}

impl Lending {
    /// Lends `value` until the returned guard drops.
    pub(crate) fn lend<T>(self: &Arc<Self>, value: T) -> Lent<T> {
        *self.out.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Lent { value, _loan: Loan(self.clone()) }
    }

    /// Blocks until everything lent has been returned (a rendezvous thread ends by its deadline).
    pub(crate) fn wait_returned(&self) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        while *out > 0 {
            out = self.returned.wait(out).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A value lent out of the transport; returned when this drops.
pub(crate) struct Lent<T> {
    /// The value lent.
    pub(crate) value: T,
    // Declared after `value`: the count goes down only once the value (and every `Arc` in it)
    // is gone.
    _loan: Loan,
}

impl<T> std::fmt::Debug for Lent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lent")
    }
}

/// One outstanding loan of a [`Lending`]; dropping it returns the loan.
struct Loan(Arc<Lending>);

impl Drop for Loan {
    fn drop(&mut self) {
        let mut out = self.0.out.lock().unwrap_or_else(PoisonError::into_inner);
        *out -= 1;
        self.0.returned.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drops and sees whether its loan was still out then.
    struct Probe(Arc<Lending>, Arc<Mutex<Option<usize>>>);

    impl Drop for Probe {
        fn drop(&mut self) {
            *self.1.lock().unwrap() = Some(*self.0.out.lock().unwrap());
        }
    }

    #[test]
    fn a_lent_value_is_gone_before_its_loan_is_returned() {
        let lending = Arc::new(Lending::default());
        let seen = Arc::new(Mutex::new(None));
        let lent = lending.lend(Probe(lending.clone(), seen.clone()));
        let thread = std::thread::spawn(move || drop(lent));
        lending.wait_returned();
        thread.join().unwrap();
        assert_eq!(*seen.lock().unwrap(), Some(1), "the value dropped while its loan was out");
        assert_eq!(*lending.out.lock().unwrap(), 0);
    }
}
