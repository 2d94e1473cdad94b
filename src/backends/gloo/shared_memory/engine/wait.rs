//! How a rank waits for its peers through shared memory (the collectives'
//! syncs and point-to-point alike): busy polls, then yields, then futex
//! sleeps, as follows.
//!
//! - A busy poll helps only while the awaited peer runs on another CPU.
//!   Each rank publishes the CPU it runs on when it arrives at a sync (a
//!   word on its header's line of rarely written words, stored only when
//!   it changes, so that it stays in the waiters' caches); a waiter that finds a late peer last seen on its own
//!   CPU yields at once instead of spinning: that peer cannot run until
//!   this rank lets go of the CPU. This is the case where the scheduler put
//!   two ranks on one CPU (measured before this rule: every 4-byte
//!   all_reduce then cost a whole spin budget, 55 µs, against 0.5 µs on
//!   two CPUs, for as long as the scheduler left them together; 3.5 µs
//!   with it, two switches between the ranks).
//! - No busy polls at all when there are more ranks than CPUs: busy
//!   polling then delays the very peers it waits for (measured 10x slower
//!   with 4 ranks on 2 CPUs).
//!
//! Otherwise [`MAX_SPINS`] busy polls, then [`YIELDS`] yields, then futex
//! sleeps of at most 10 ms between which the caller checks the deadline,
//! the comm's abort and its peers' processes. The count is fixed: a budget
//! that adapts to the waits (halved by each wait that had to yield or
//! sleep, doubled by each that ended while polling) showed no difference
//! when it was tried (docs/performance.md, "Spinning").

/// Busy polls a wait spends before yielding, when every rank can have a
/// CPU (about 50 µs here).
pub(super) const MAX_SPINS: u32 = 2000;
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

/// One wait's polling before it sleeps.
pub(super) struct Patience {
    budget: u32,
    polls: u32,
    yields: u32,
    next_look: u32,
    /// This thread's CPU plus one, as [`current_cpu`].
    pub(super) cpu: u32,
}

impl Patience {
    /// `cpu`: this thread's CPU as [`current_cpu`] gave it (the caller
    /// has just published it).
    pub(super) fn new(budget: u32, cpu: u32) -> Patience {
        Patience {
            budget,
            polls: 0,
            yields: 0,
            next_look: 1,
            cpu,
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
    #[cfg(test)]
    fn yielded(&self) -> bool {
        self.yields > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_on_this_cpu_makes_the_wait_yield_at_once() {
        let mut p = Patience::new(MAX_SPINS, 1);
        assert!(p.poll_again(|_| true));
        assert!(
            p.yielded(),
            "the first poll must yield when the peer shares the CPU"
        );
    }

    #[test]
    fn a_peer_elsewhere_gets_the_whole_budget_then_yields_then_sleep() {
        let budget = 100;
        let mut p = Patience::new(budget, 1);
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
}
