//! How a rank waits for its peers through shared memory (the collectives'
//! syncs and point-to-point alike): busy polls, then yields, then futex
//! sleeps, as follows.
//!
//! - A busy poll helps only while the awaited peer runs on another CPU.
//!   Each rank publishes the CPU it runs on when it arrives at a sync (a
//!   word beside its phase, on the same cache line, so publishing costs no
//!   extra transfer); a waiter that finds a late peer last seen on its own
//!   CPU stops spinning at once: that peer cannot run until this rank lets
//!   go of the CPU. This is the case where the scheduler put two ranks on
//!   one CPU (measured before this rule: every 4-byte all_reduce then cost
//!   a whole spin budget, 55 µs, against 0.5 µs on two CPUs, for as long
//!   as the scheduler left them together; 3.5 µs with a yield, two
//!   switches between the ranks).
//! - That waiter yields; but when every rank can have a CPU, one such
//!   wait in [`SLEEP_EVERY`] of a thread sleeps (futex) at once instead. A
//!   yield leaves both ranks runnable on one CPU, each run within the last
//!   microseconds, and the load balancer does not move a task that ran so
//!   recently (cache-hot): measured, 20,000 of 20,000 calls shared a CPU,
//!   with 10,000 yields a rank and no sleep. A sleeping rank is woken by
//!   its peer's bell, and the kernel places a woken task on an idle CPU
//!   when the waker's is busy, which separates the ranks; once apart, they
//!   spin. Sleeping at every such wait instead cost 7.5-8 µs a call against
//!   6 µs with yields where no CPU was idle (a loaded 2-CPU machine).
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
/// One in this many waits of a thread that find a late peer on its own
/// CPU sleeps at once instead of yielding (when every rank can have a
/// CPU): a chance for the kernel to move the ranks apart.
pub(super) const SLEEP_EVERY: u32 = 16;

thread_local! {
    /// This thread's waits that found a late peer on its own CPU.
    static SHARED_CPU_WAITS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether this wait, which found a late peer on its own CPU, is the one
/// in [`SLEEP_EVERY`] that sleeps.
fn sleep_this_time() -> bool {
    SHARED_CPU_WAITS.with(|n| {
        let k = n.get().wrapping_add(1);
        n.set(k);
        k % SLEEP_EVERY == 0
    })
}

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
    /// The last poll sent the wait to sleep: it may wake on another CPU.
    slept: bool,
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
            slept: false,
            cpu,
        }
    }

    /// Waits a little before the next poll; false once it is time to
    /// sleep. `on_cpu(c)`: whether a peer still awaited was last seen on
    /// CPU `c` (as [`current_cpu`] numbers them; never called with 0).
    #[inline]
    pub(super) fn poll_again(&mut self, on_cpu: impl FnOnce(u32) -> bool) -> bool {
        self.polls += 1;
        if self.slept {
            self.slept = false;
            self.cpu = current_cpu();
            self.next_look = self.polls;
        }
        let mut here = false;
        if self.polls >= self.next_look && self.cpu != 0 {
            self.next_look = self.polls + LOOK_EVERY;
            here = on_cpu(self.cpu);
        }
        if self.polls <= self.budget && !here {
            std::hint::spin_loop();
            return true;
        }
        if here && self.budget > 0 && self.yields == 0 && sleep_this_time() {
            // Every rank can have a CPU: sleep, so that the peer's wake
            // may place this rank on another one (see the module's notes).
            self.slept = true;
            return false;
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

    /// Waits that find the peer on this CPU: how many of them sleep at
    /// once (the others yield at once), with a spin `budget`.
    fn sleeping_waits(budget: u32, waits: u32) -> u32 {
        (0..waits)
            .filter(|_| {
                let mut p = Patience::new(budget, 1);
                let polling = p.poll_again(|_| true);
                assert!(polling == p.yielded(), "each first poll yields or sleeps");
                !polling
            })
            .count() as u32
    }

    #[test]
    fn a_peer_on_this_cpu_makes_one_wait_in_sleep_every_sleep_the_others_yield() {
        // Runs on its own thread: the count is per thread.
        std::thread::spawn(|| {
            assert_eq!(sleeping_waits(MAX_SPINS, 4 * SLEEP_EVERY), 4);
            assert_eq!(
                sleeping_waits(0, 4 * SLEEP_EVERY),
                0,
                "with more ranks than CPUs such waits only yield"
            );
        })
        .join()
        .unwrap();
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
