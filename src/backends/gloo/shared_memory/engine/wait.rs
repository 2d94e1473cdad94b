//! How a rank waits for its peers through shared memory (the collectives'
//! syncs and point-to-point alike): busy polls, then yields, then futex
//! sleeps, as follows.
//!
//! - A busy poll helps only while the awaited peer runs on another CPU.
//!   Each rank publishes the CPU it runs on when it waits at a sync, and
//!   at one sync in [`CPU_LOOK_EVERY`] where it does not (a word on its
//!   header's line of rarely written words, stored only when it changes,
//!   so that it stays in the waiters' caches); a waiter that finds a late peer last seen on its own
//!   CPU yields at once instead of spinning: that peer cannot run until
//!   this rank lets go of the CPU. This is the case where the scheduler put
//!   two ranks on one CPU (measured before this rule: every 4-byte
//!   all_reduce then cost a whole spin budget, 55 µs, against 0.5 µs on
//!   two CPUs, for as long as the scheduler left them together; 3.5 µs
//!   with it, two switches between the ranks).
//! - No busy polls at all when there are more ranks than CPUs (those the
//!   ranks may run on together, [`usable_cpus`]): busy polling then delays
//!   the very peers it waits for (measured 10x slower with 4 ranks on 2
//!   CPUs).
//!
//! Otherwise [`MAX_SPINS`] busy polls, then [`YIELDS`] yields, then futex
//! sleeps of at most 10 ms between which the caller checks the deadline,
//! the comm's abort and its peers' processes. The count is fixed: a budget
//! that adapts to the waits (halved by each wait that had to yield or
//! sleep, doubled by each that ended while polling) showed no difference
//! when it was tried (docs/performance.md, "Spinning").
//!
//! - Except when the CPUs are contended ([`WaitPolicy`]): once a wait
//!   lasted [`LONG_WAIT`] and another thread took this one's CPU during
//!   it (a yield handed the CPU over, or the thread was preempted: other
//!   processes or the application's own threads want the CPUs), the
//!   engine's waits go to sleep at once, neither polling nor yielding, but
//!   for one wait in [`PROBE_EVERY`] that waits as above: when that one
//!   ends sooner than [`LONG_WAIT`], or finds the CPU its own, the
//!   engine's waits poll again. A long wait with the CPU to itself is a
//!   peer busy elsewhere in its program, not contention: it changes
//!   nothing (it used to put the waits to sleep for the next 63, each then
//!   paying a futex wake: `tc-osu`'s ranks, which wait milliseconds for
//!   each other between its tests, measured 8-byte windows at 4.3 MB/s in
//!   one round and 29 in the next). A polling waiter
//!   competes for a CPU with what keeps its peer off one, and each yield
//!   hands a busy thread a whole time slice; a sleeping one is woken by the
//!   peer's bell as soon as the peer arrives. Two ranks beside two busy
//!   processes on 2 CPUs, 8 and 32 MiB all_reduce: 32-65 and 190-313 ms
//!   polling, 1.4-14 and 9-53 ms sleeping at once (Gloo over TCP: 8 and
//!   39 ms; docs/performance.md, "Under CPU contention"). Only where every
//!   rank can have a CPU: with more ranks than CPUs the waits keep
//!   yielding first and learn nothing.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A rank looks up the CPU it runs on (`sched_getcpu`) and publishes it
/// at every sync where it waits, and otherwise (its peers were all there:
/// none needed to know) at one sync in this many. A rank that never waits
/// keeps its published CPU this many syncs old at most; one that moved
/// onto a waiting peer's CPU makes that peer wait long, and then waits
/// itself (only one of two ranks sharing a CPU runs on), looking it up.
pub(super) const CPU_LOOK_EVERY: u64 = 16;
/// Busy polls a wait spends before yielding, when every rank can have a
/// CPU (about 50 µs here).
pub(super) const MAX_SPINS: u32 = 2000;
/// Yielding polls before a wait goes to sleep.
const YIELDS: u32 = 64;
/// Busy polls between two looks at where the late peers run.
const LOOK_EVERY: u32 = 16;
/// The poll from which a wait times itself: shorter waits (most small
/// collectives') never read the clock.
const TIME_FROM: u32 = 64;
/// A wait this long had a peer that was not running.
const LONG_WAIT: Duration = Duration::from_millis(1);
/// While waits sleep at once, one in this many polls as usual, to learn
/// whether the CPUs are free again.
const PROBE_EVERY: u32 = 64;

/// How one engine's waits poll: as [`Patience`] says, or not at all while
/// the CPUs are contended (see the module docs).
pub(super) struct WaitPolicy {
    /// Busy polls a wait may spend when they may help: [`MAX_SPINS`], or 0
    /// when there are more ranks than usable CPUs.
    busy_spins: u32,
    /// 0 while waits poll; else waits sleep at once, and this counts
    /// them (from 1, set by a wait that lasted [`LONG_WAIT`]).
    asleep: AtomicU32,
}

impl WaitPolicy {
    pub(super) fn new(busy_spins: u32) -> WaitPolicy {
        WaitPolicy {
            busy_spins,
            asleep: AtomicU32::new(0),
        }
    }

    /// The polling of a wait starting now on CPU `cpu` (see
    /// [`Patience::new`]).
    pub(super) fn patience(&self, cpu: u32) -> Patience {
        let mut p = Patience::new(self.busy_spins, cpu);
        match self.count_wait() {
            Some(true) => p.probe = true,
            Some(false) => (p.budget, p.max_yields) = (0, 0),
            None => {}
        }
        p
    }

    /// Counts a wait while the waits sleep at once: Some(whether it is a
    /// probe, which polls), None while they poll.
    #[inline]
    fn count_wait(&self) -> Option<bool> {
        let n = self.asleep.load(Ordering::Relaxed);
        if n == 0 {
            return None;
        }
        // A load and a store: one wait at a time per engine, and a lost
        // count only moves the next probe.
        self.asleep
            .store(n.wrapping_add(1).max(1), Ordering::Relaxed);
        Some(n % PROBE_EVERY == 0)
    }

    /// Whether where ranks run matters to the waits: only where they may
    /// busy-poll (every rank can have a CPU). With more ranks than CPUs
    /// every wait yields at once wherever its peers run, so a sync need
    /// not look up its CPU (a `sched_getcpu` each).
    pub(super) fn tracks_cpus(&self) -> bool {
        self.busy_spins > 0
    }

    /// Counts a wait that found every peer there at its first look, as
    /// [`WaitPolicy::patience`] and [`WaitPolicy::waited`] would (a probe
    /// among them ended soon: waits poll again), without preparing its
    /// polling.
    #[inline]
    pub(super) fn ended_at_once(&self) {
        if self.count_wait() == Some(true) {
            // A probe that found the CPUs free (it did not even wait).
            self.learn(true, false);
        }
    }

    /// Whether waits busy-poll now: every rank can have a CPU and the
    /// CPUs were not found contended.
    pub(super) fn polls(&self) -> bool {
        self.busy_spins > 0 && self.asleep.load(Ordering::Relaxed) == 0
    }

    /// Learns from a wait that ended with `p`'s polling.
    pub(super) fn waited(&self, p: &Patience) {
        if self.busy_spins == 0 {
            // More ranks than CPUs: the waits yield to each other as the
            // module docs say (sleeping at once measured no better with
            // busy processes beside 4 ranks on 2 CPUs, and worse without).
            return;
        }
        let long = p.since.is_some_and(|t| t.elapsed() >= LONG_WAIT);
        self.learn(p.probe, long && p.cpu_taken());
    }

    /// After a wait (`probe`: one that polled while the others sleep at
    /// once) that found the CPUs `contended` or not.
    fn learn(&self, probe: bool, contended: bool) {
        if contended && self.asleep.load(Ordering::Relaxed) == 0 {
            self.asleep.store(1, Ordering::Relaxed);
        } else if !contended && probe {
            self.asleep.store(0, Ordering::Relaxed);
        }
    }
}

/// Words of a CPU set as the ranks exchange it ([`affinity`]): CPUs 0 to
/// 1023, as glibc's `cpu_set_t`.
pub(super) const CPU_SET_WORDS: usize = 16;

/// The CPUs this process may run on (its affinity), one bit each; all
/// zero when they cannot be read.
pub(super) fn affinity() -> [u64; CPU_SET_WORDS] {
    let mut words = [0u64; CPU_SET_WORDS];
    // SAFETY: a zeroed cpu_set_t is an empty set; valid out-pointer.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is writable and `size` bytes long.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return words;
    }
    for cpu in 0..CPU_SET_WORDS * 64 {
        // SAFETY: `cpu` is below the set's capacity (1024).
        if unsafe { libc::CPU_ISSET(cpu, &set) } {
            words[cpu / 64] |= 1 << (cpu % 64);
        }
    }
    words
}

/// The CPUs an engine's ranks can run on together: the union of their
/// affinities (`sets`, one per rank, as [`affinity`] gives them), within
/// `own_parallelism` (this process's [`std::thread::available_parallelism`])
/// where that is below its own affinity (a cgroup's CPU quota, which the
/// ranks share). A rank's own affinity alone is not the measure: ranks bound
/// one per CPU each see one CPU, and would never busy-poll. Unknown sets
/// (all zero): `own_parallelism`. `own` is this rank's set, one of `sets`.
pub(super) fn usable_cpus<'a>(
    mut sets: impl Iterator<Item = &'a [u64]>,
    own: &[u64],
    own_parallelism: usize,
) -> usize {
    let count = |set: &[u64]| set.iter().map(|w| w.count_ones() as usize).sum::<usize>();
    let mut union = [0u64; CPU_SET_WORDS];
    let all_known = sets.all(|set| {
        union.iter_mut().zip(set).for_each(|(u, w)| *u |= w);
        count(set) > 0
    });
    if !all_known {
        return own_parallelism;
    }
    let quota = match own_parallelism < count(own) {
        true => own_parallelism,
        false => usize::MAX,
    };
    count(&union).min(quota)
}

/// The CPU this thread runs on, plus one (0: unknown). Reads the kernel's
/// per-thread copy (rseq) where the C library has one: a few nanoseconds.
pub(super) fn current_cpu() -> u32 {
    // SAFETY: no arguments; returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).map_or(0, |c| c + 1)
}

/// How many times this thread was switched out while it could still run
/// (preempted, or a yield that handed the CPU to another thread): the
/// kernel's count of its involuntary context switches (0 when unknown).
fn involuntary_switches() -> u64 {
    // SAFETY: a zeroed rusage is valid; valid out-pointer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD fills `usage` for the calling thread.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return 0;
    }
    usage.ru_nivcsw as u64
}

/// One wait's polling before it sleeps.
pub(super) struct Patience {
    budget: u32,
    polls: u32,
    yields: u32,
    /// Yields before it sleeps: [`YIELDS`], or none when it sleeps at once.
    max_yields: u32,
    next_look: u32,
    /// This thread's CPU plus one, as [`current_cpu`]; 0 where it is not
    /// tracked ([`WaitPolicy::tracks_cpus`]): then it stays unknown.
    pub(super) cpu: u32,
    /// When the wait started timing itself (at poll [`TIME_FROM`], or when
    /// it first went to sleep).
    since: Option<Instant>,
    /// Whether it polls to learn if the CPUs are free again (see
    /// [`WaitPolicy`]).
    probe: bool,
    /// This thread's [`involuntary_switches`] at the wait's first yield
    /// (read only by waits that get that far after polling: a system
    /// call).
    switches_at_yield: Option<u64>,
}

impl Patience {
    /// `cpu`: this thread's CPU as [`current_cpu`] gave it (the caller
    /// has just published it).
    pub(super) fn new(budget: u32, cpu: u32) -> Patience {
        Patience {
            budget,
            polls: 0,
            yields: 0,
            max_yields: YIELDS,
            next_look: 1,
            cpu,
            since: None,
            probe: false,
            switches_at_yield: None,
        }
    }

    /// Whether another thread took this one's CPU since the wait's first
    /// yield (never, for a wait that did not yield).
    fn cpu_taken(&self) -> bool {
        self.switches_at_yield
            .is_some_and(|n| involuntary_switches() > n)
    }

    /// The caller goes to sleep (after [`Patience::poll_again`] said so).
    pub(super) fn sleeping(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }

    /// Waits a little before the next poll; false once it is time to
    /// sleep. `on_cpu(c)`: whether a peer still awaited was last seen on
    /// CPU `c` (as [`current_cpu`] numbers them; never called with 0).
    #[inline]
    pub(super) fn poll_again(&mut self, on_cpu: impl FnOnce(u32) -> bool) -> bool {
        self.polls += 1;
        if self.polls == TIME_FROM {
            self.since = Some(Instant::now());
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
        if self.yields < self.max_yields {
            // Only where the policy learns from the wait (every rank has a
            // CPU): with more ranks than CPUs every wait yields at once,
            // and a system call each cost 0.3-0.7 us a small collective.
            if self.yields == 0 && self.budget > 0 {
                self.switches_at_yield = Some(involuntary_switches());
            }
            self.yields += 1;
            std::thread::yield_now();
            // Look again at once: the peer may have run meanwhile, or this
            // thread moved to another CPU (unless its CPU is not tracked).
            if self.cpu != 0 {
                self.cpu = current_cpu();
            }
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

    fn set(cpus: &[usize]) -> [u64; CPU_SET_WORDS] {
        let mut words = [0u64; CPU_SET_WORDS];
        cpus.iter().for_each(|c| words[c / 64] |= 1 << (c % 64));
        words
    }

    fn usable(sets: &[[u64; CPU_SET_WORDS]], own_parallelism: usize) -> usize {
        usable_cpus(sets.iter().map(|s| &s[..]), &sets[0], own_parallelism)
    }

    #[test]
    fn ranks_bound_one_per_cpu_count_every_cpu() {
        assert_eq!(usable(&[set(&[0]), set(&[1])], 1), 2);
        assert_eq!(usable(&[set(&[3]), set(&[70]), set(&[3])], 1), 2);
        assert_eq!(usable(&[set(&[0, 1]), set(&[0, 1])], 2), 2);
        assert_eq!(
            usable(&[set(&[0]), set(&[0])], 1),
            1,
            "bound to one CPU together"
        );
    }

    #[test]
    fn a_cpu_quota_below_the_affinity_still_counts() {
        let all = set(&[0, 1, 2, 3]);
        assert_eq!(usable(&[all, all], 2), 2, "a quota of 2 CPUs");
        assert_eq!(usable(&[set(&[0]), set(&[1]), set(&[2])], 1), 3, "no quota");
    }

    #[test]
    fn an_unknown_set_leaves_the_own_count() {
        assert_eq!(usable(&[set(&[0]), set(&[])], 1), 1);
        assert_eq!(usable(&[set(&[]), set(&[1])], 4), 4);
    }

    #[test]
    fn this_process_has_an_affinity() {
        let own = affinity();
        let n = own.iter().map(|w| w.count_ones() as usize).sum::<usize>();
        let parallelism = std::thread::available_parallelism().map_or(1, |c| c.get());
        assert!(
            n >= parallelism,
            "{n} CPUs in the set, {parallelism} usable"
        );
    }

    #[test]
    fn a_peer_on_this_cpu_makes_the_wait_yield_at_once() {
        let mut p = Patience::new(MAX_SPINS, 1);
        assert!(p.poll_again(|_| true));
        assert!(
            p.yielded(),
            "the first poll must yield when the peer shares the CPU"
        );
    }

    fn bind_to(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is an empty set; `cpu` < 1024.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::CPU_SET(cpu, &mut set) };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: a valid set of `size` bytes, for the calling thread.
        assert_eq!(unsafe { libc::sched_setaffinity(0, size, &set) }, 0);
    }

    /// Binds this thread (for the rest of its life) and a spinning thread
    /// to this thread's CPU and yields until a yield handed the CPU over;
    /// whether this thread's [`involuntary_switches`] grew (within 10 s).
    fn hand_the_cpu_over() -> bool {
        use std::sync::atomic::AtomicBool;
        let before = involuntary_switches();
        // SAFETY: no arguments.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap();
        bind_to(cpu);
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let spinner = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                bind_to(cpu);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let give_up = Instant::now() + Duration::from_secs(10);
        while involuntary_switches() == before && Instant::now() < give_up {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        involuntary_switches() > before
    }

    #[test]
    fn a_yield_that_hands_the_cpu_over_counts() {
        let own = std::thread::spawn(hand_the_cpu_over);
        assert!(
            own.join().unwrap(),
            "a yield to a thread bound to the same CPU must count as an involuntary switch"
        );
    }

    /// A wait that ended `ago` after it started timing itself; `contended`:
    /// another thread took the CPU after its first yield (the caller's
    /// thread has had an involuntary switch: [`hand_the_cpu_over`]).
    fn waited_for(w: &WaitPolicy, ago: Duration, contended: bool) {
        let mut p = w.patience(1);
        p.since = Some(Instant::now() - ago);
        p.switches_at_yield = Some(match contended {
            true => 0,
            false => involuntary_switches(),
        });
        w.waited(&p);
    }

    #[test]
    fn a_long_wait_with_the_cpu_taken_makes_the_next_ones_sleep_at_once_but_for_probes() {
        std::thread::spawn(sleeping_at_once_but_for_probes)
            .join()
            .unwrap();
    }

    fn sleeping_at_once_but_for_probes() {
        assert!(hand_the_cpu_over());
        let w = WaitPolicy::new(MAX_SPINS);
        waited_for(&w, Duration::from_micros(200), true);
        assert!(
            w.patience(1).poll_again(|_| false),
            "a short wait changes nothing"
        );
        waited_for(&w, 10 * LONG_WAIT, false);
        assert!(
            w.polls() && w.patience(1).poll_again(|_| false),
            "a long wait with the CPU to itself changes nothing"
        );
        waited_for(&w, LONG_WAIT, true);
        assert!(!w.polls());
        for i in 1..3 * PROBE_EVERY {
            let mut p = w.patience(1);
            match i % PROBE_EVERY == 0 {
                // The probe polls as usual; it took long and lost the CPU:
                // still asleep.
                true => {
                    assert!(p.probe && p.poll_again(|_| false), "wait {i}");
                    p.since = Some(Instant::now() - LONG_WAIT);
                    p.switches_at_yield = Some(0);
                    w.waited(&p);
                }
                // Neither polls nor yields, even with the peer on this CPU.
                false => {
                    assert!(!p.poll_again(|_| true), "wait {i} polled");
                    assert!(!p.yielded(), "wait {i} yielded");
                    w.waited(&p);
                }
            }
        }
        // A probe that came back soon: polling again.
        let mut p = w.patience(1);
        while !p.probe {
            w.waited(&p);
            p = w.patience(1);
        }
        w.waited(&p);
        let mut p = w.patience(1);
        assert!(
            !p.probe && p.poll_again(|_| false),
            "polling resumes after a quick probe"
        );
        // Asleep again; a probe that took long with the CPU to itself (its
        // peer busy elsewhere): polling again too.
        waited_for(&w, LONG_WAIT, true);
        let mut p = w.patience(1);
        while !p.probe {
            w.waited(&p);
            p = w.patience(1);
        }
        p.since = Some(Instant::now() - LONG_WAIT);
        p.switches_at_yield = Some(involuntary_switches());
        w.waited(&p);
        assert!(w.polls(), "polling resumes after an uncontended probe");
    }

    #[test]
    fn a_wait_that_ends_at_once_counts_as_a_short_one() {
        // Sleeping at once: a wait that found its peers there counts toward
        // the next probe, and a probe among them makes the waits poll again,
        // as a short wait through `patience` and `waited` does.
        let (at_once, short) = (WaitPolicy::new(MAX_SPINS), WaitPolicy::new(MAX_SPINS));
        for w in [&at_once, &short] {
            w.learn(false, true);
            assert!(!w.polls());
        }
        for i in 0..2 * PROBE_EVERY {
            at_once.ended_at_once();
            short.waited(&short.patience(1));
            let asleep = |w: &WaitPolicy| w.asleep.load(Ordering::Relaxed);
            assert_eq!(asleep(&at_once), asleep(&short), "wait {i}");
        }
        assert!(
            at_once.polls(),
            "a probe that ended at once resumes polling"
        );
        let more = WaitPolicy::new(0);
        more.ended_at_once();
        assert!(!more.tracks_cpus() && !more.polls());
    }

    #[test]
    fn more_ranks_than_cpus_never_switch() {
        let w = WaitPolicy::new(0);
        waited_for(&w, 10 * LONG_WAIT, true);
        let mut p = w.patience(1);
        assert!(
            p.poll_again(|_| false) && p.yielded(),
            "they still yield first"
        );
        assert!(
            p.switches_at_yield.is_none(),
            "a wait the policy does not learn from reads no switch count (a system call)"
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
