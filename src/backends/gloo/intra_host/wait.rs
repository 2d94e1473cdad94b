//! How a rank waits for its peers through shared memory (the collectives'
//! syncs and point-to-point alike): busy polls, then yields, then futex
//! sleeps, with two refinements that keep a short wait short.
//!
//! - A busy poll helps only while the awaited peer runs on another CPU.
//!   Each rank publishes the CPU it runs on when it arrives at a sync (a
//!   word beside its phase, on the same cache line, so publishing costs no
//!   extra transfer); a waiter that finds a late peer last seen on its own
//!   CPU yields at once instead of spinning: that peer cannot run until
//!   this rank lets go of the CPU. This is the case where the scheduler put
//!   two ranks on one CPU (measured before this rule: every 4-byte
//!   all_reduce then cost a whole spin budget, 55 µs, against 1 µs on two
//!   CPUs, for as long as the scheduler left them together).
//! - The spin budget adapts per comm: about twice the polls its recent
//!   waits needed (a running average), between [`MIN_SPINS`] and the most
//!   the host allows ([`MAX_SPINS`] when every rank can have a CPU of its
//!   own, 0 when there are more ranks than CPUs: busy polling then delays
//!   the very peers it waits for). A wait that outlasts the budget teaches
//!   it the budget, so steadily long waits (ranks out of balance by tens of
//!   microseconds) raise it back to the maximum, while a comm whose peers
//!   arrive within a microsecond or two wastes little when a peer is
//!   preempted.
//!
//! After the budget, [`YIELDS`] yields, then futex sleeps of at most 10 ms
//! between which the caller checks the deadline, the comm's abort and its
//! peers' processes.

use std::sync::atomic::{AtomicU32, Ordering};

/// The most busy polls a wait spends before yielding (about 50 µs here).
pub(super) const MAX_SPINS: u32 = 2000;
/// The fewest, once a comm has learnt that its waits are short.
const MIN_SPINS: u32 = 64;
/// Yielding polls before a wait goes to sleep.
const YIELDS: u32 = 64;
/// Busy polls between two looks at where the late peers run.
const LOOK_EVERY: u32 = 16;

/// The CPU this thread runs on, plus one (0: unknown). Reads the kernel's
/// per-thread copy (rseq) where the C library has one: a few nanoseconds.
pub(super) fn current_cpu() -> u32 {
    // SAFETY: no arguments; returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).map_or(0, |c| c + 1)
}

/// A comm's spin budget, learnt from its waits (one operation at a time
/// uses it, so relaxed atomics suffice).
pub(super) struct SpinBudget {
    max: u32,
    /// Running average of the busy polls a wait needed.
    average: AtomicU32,
}

impl SpinBudget {
    /// Starts at `max`: a fresh comm spins as long as the host allows
    /// until its waits show they are shorter.
    pub(super) fn new(max: u32) -> SpinBudget {
        SpinBudget {
            max,
            average: AtomicU32::new(max / 2),
        }
    }

    pub(super) fn get(&self) -> u32 {
        (MIN_SPINS + 2 * self.average.load(Ordering::Relaxed)).min(self.max)
    }

    /// A wait that ended after `patience`: learns from it unless a peer
    /// shared its CPU (it did not spin then, so it says nothing of how
    /// long spinning takes).
    pub(super) fn learn(&self, patience: &Patience) {
        if self.max == 0 || patience.shared_cpu {
            return;
        }
        let needed = patience.polls.min(patience.budget);
        let average = self.average.load(Ordering::Relaxed);
        let next = (average as i64 + (needed as i64 - average as i64) / 8).clamp(0, self.max as i64);
        self.average.store(next as u32, Ordering::Relaxed);
    }
}

/// One wait's polling before it sleeps.
pub(super) struct Patience {
    budget: u32,
    polls: u32,
    yields: u32,
    next_look: u32,
    /// This thread's CPU plus one, as [`current_cpu`].
    pub(super) cpu: u32,
    /// Whether a late peer was seen on this thread's CPU.
    shared_cpu: bool,
}

impl Patience {
    pub(super) fn new(budget: u32) -> Patience {
        Patience {
            budget,
            polls: 0,
            yields: 0,
            next_look: 1,
            cpu: current_cpu(),
            shared_cpu: false,
        }
    }

    /// Waits a little before the next poll; false once it is time to
    /// sleep. `on_cpu(c)`: whether a peer still awaited was last seen on
    /// CPU `c` (as [`current_cpu`] numbers them; never called with 0).
    #[inline]
    pub(super) fn poll_again(&mut self, on_cpu: impl FnOnce(u32) -> bool) -> bool {
        self.polls += 1;
        let mut here = false;
        if self.polls >= self.next_look && self.cpu != 0 {
            self.next_look = self.polls + LOOK_EVERY;
            here = on_cpu(self.cpu);
            self.shared_cpu |= here;
        }
        if self.polls <= self.budget && !here {
            std::hint::spin_loop();
            return true;
        }
        if self.yields < YIELDS {
            self.yields += 1;
            std::thread::yield_now();
            // Look again at once: the peer may have run meanwhile, or this
            // thread moved to another CPU.
            self.cpu = current_cpu();
            self.next_look = self.polls + 1;
            return true;
        }
        false
    }

    /// Whether the wait yielded the CPU at least once.
    pub(super) fn yielded(&self) -> bool {
        self.yields > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_on_this_cpu_makes_the_wait_yield_at_once() {
        let mut p = Patience::new(MAX_SPINS);
        assert!(p.poll_again(|_| true));
        assert!(p.yielded(), "the first poll must yield when the peer shares the CPU");
        let budget = SpinBudget::new(MAX_SPINS);
        let before = budget.get();
        budget.learn(&p);
        assert_eq!(budget.get(), before, "a shared-CPU wait must not teach the budget");
    }

    #[test]
    fn a_peer_elsewhere_gets_the_whole_budget_then_yields_then_sleep() {
        let budget = 100;
        let mut p = Patience::new(budget);
        for _ in 0..budget {
            assert!(p.poll_again(|_| false));
        }
        assert!(!p.yielded(), "within the budget it must only spin");
        for _ in 0..YIELDS {
            assert!(p.poll_again(|_| false));
        }
        assert!(p.yielded());
        assert!(!p.poll_again(|_| false), "after the yields it must sleep");
    }

    #[test]
    fn the_budget_follows_the_waits() {
        let budget = SpinBudget::new(MAX_SPINS);
        assert_eq!(budget.get(), MAX_SPINS, "a fresh comm spins as long as allowed");
        for _ in 0..100 {
            let mut p = Patience::new(budget.get());
            for _ in 0..5 {
                p.poll_again(|_| false);
            }
            budget.learn(&p);
        }
        let short = budget.get();
        assert!(short < MIN_SPINS + 20, "short waits must shrink the budget: {short}");
        for _ in 0..100 {
            let mut p = Patience::new(budget.get());
            while !p.yielded() {
                p.poll_again(|_| false);
            }
            budget.learn(&p);
        }
        assert_eq!(budget.get(), MAX_SPINS, "waits that outlast the budget must grow it back");
        let none = SpinBudget::new(0);
        assert_eq!(none.get(), 0, "more ranks than CPUs: no busy polls");
    }
}
