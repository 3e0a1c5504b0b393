//! A bound on the bytes a chunking thread has read and the backup still holds: the thread
//! claims bytes before it reads them, and each chunk's [`Claim`] goes with the chunk until the
//! writer lets the chunk go ([`Writer::store_holding`](custody_repository::writer::Writer::store_holding)).
//!
//! Without it the chunk being read, the chunk the tree stage holds and the chunk being sealed
//! are each up to 8 MiB, all resident when the writer waits for an upload.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// At most `most` bytes claimed, shared by the claims made from it.
pub struct Budget {
    held: Mutex<usize>,
    freed: Condvar,
    most: usize,
}

/// Bytes claimed from a [`Budget`] (none without one), given back when dropped.
pub struct Claim {
    budget: Option<Arc<Budget>>,
    bytes: usize,
}

/// Whether a claim holding `own` of the `held` bytes waits before claiming `more` under a
/// bound of `most`. It never waits for itself: when it alone holds bytes it may grow past the
/// bound (a chunk is never larger than the chunker's maximum, which the bound exceeds).
pub fn waits(held: usize, own: usize, more: usize, most: usize) -> bool {
    held.saturating_add(more) > most && held > own
}

/// How often a waiting claim looks at the backup's stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);

impl Budget {
    /// A budget of `most` bytes, none claimed.
    pub fn new(most: usize) -> Arc<Budget> {
        Arc::new(Budget {
            held: Mutex::new(0),
            freed: Condvar::new(),
            most,
        })
    }

    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        *self.held.lock().expect("budget")
    }
}

impl Claim {
    /// An empty claim on `budget`, or one bounded by nothing.
    pub fn new(budget: Option<&Arc<Budget>>) -> Claim {
        Claim {
            budget: budget.cloned(),
            bytes: 0,
        }
    }

    /// Claims `more` bytes, waiting while other claims hold too many; `false` when `stop` was
    /// set meanwhile (nothing claimed).
    pub fn grow(&mut self, more: usize, stop: &AtomicBool) -> bool {
        let Some(budget) = &self.budget else {
            self.bytes += more;
            return true;
        };
        let mut held = budget.held.lock().expect("budget");
        while waits(*held, self.bytes, more, budget.most) {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            held = budget
                .freed
                .wait_timeout(held, STOP_CHECK)
                .expect("budget")
                .0;
        }
        *held += more;
        self.bytes += more;
        true
    }

    /// Gives back `bytes` of this claim (at most what it holds).
    pub fn release(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        if let Some(budget) = &self.budget {
            *budget.held.lock().expect("budget") -= bytes;
            budget.freed.notify_all();
        }
    }

    /// Moves `bytes` of this claim (at most what it holds) to a new one, without waiting.
    pub fn split_off(&mut self, bytes: usize) -> Claim {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Claim {
            budget: self.budget.clone(),
            bytes,
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.release(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_claim_waits_only_while_others_would_take_it_past_the_bound() {
        // (held, own, more, most, waits)
        let table = [
            (0, 0, 8 * MIB, 16 * MIB, false),
            (8 * MIB, 0, 8 * MIB, 16 * MIB, false),
            (8 * MIB, 0, 8 * MIB + 1, 16 * MIB, true),
            (16 * MIB, 0, 1, 16 * MIB, true),
            // Its own bytes alone never make it wait, even past the bound.
            (16 * MIB, 16 * MIB, 1, 16 * MIB, false),
            (10 * MIB, 4 * MIB, 7 * MIB, 16 * MIB, true),
            (10 * MIB, 4 * MIB, 6 * MIB, 16 * MIB, false),
            (usize::MAX, 0, 1, 16 * MIB, true),
        ];
        for (held, own, more, most, expected) in table {
            assert_eq!(
                waits(held, own, more, most),
                expected,
                "held {held}, own {own}, more {more}, most {most}"
            );
        }
    }

    #[test]
    fn claims_give_their_bytes_back_when_released_split_or_dropped() {
        let budget = Budget::new(16 * MIB);
        let stop = AtomicBool::new(false);
        let mut claim = Claim::new(Some(&budget));
        assert!(claim.grow(6 * MIB, &stop));
        claim.release(MIB);
        let past = claim.split_off(2 * MIB);
        assert_eq!(
            (claim.bytes(), past.bytes(), budget.held()),
            (3 * MIB, 2 * MIB, 5 * MIB)
        );
        drop(claim);
        assert_eq!(budget.held(), 2 * MIB);
        drop(past);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_claim_past_the_bound_waits_until_another_is_dropped() {
        let budget = Budget::new(16 * MIB);
        let stop = AtomicBool::new(false);
        let mut first = Claim::new(Some(&budget));
        assert!(first.grow(12 * MIB, &stop));
        let (sender, grown) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut second = Claim::new(Some(&budget));
                let _ = sender.send(second.grow(8 * MIB, &stop));
                second
            });
            assert!(grown.recv_timeout(Duration::from_millis(300)).is_err());
            drop(first);
            assert_eq!(grown.recv_timeout(Duration::from_secs(5)), Ok(true));
        });
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_waiting_claim_gives_up_when_the_backup_stops() {
        let budget = Budget::new(16 * MIB);
        let stop = AtomicBool::new(false);
        let mut first = Claim::new(Some(&budget));
        assert!(first.grow(16 * MIB, &stop));
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| Claim::new(Some(&budget)).grow(MIB, &stop));
            std::thread::sleep(Duration::from_millis(200));
            stop.store(true, Ordering::Relaxed);
            assert!(!waiting.join().expect("the thread ends"));
        });
        assert_eq!(budget.held(), 16 * MIB);
    }

    #[test]
    fn a_claim_without_a_budget_never_waits() {
        let stop = AtomicBool::new(true);
        let mut claim = Claim::new(None);
        assert!(claim.grow(usize::MAX / 2, &stop));
    }
}
