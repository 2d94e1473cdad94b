//! The works an executor hands out, reused once nobody else holds them: a
//! blocking call's work outlives it in the flight recorder's ring (64
//! entries by default) and is freed 64 calls later, so that a fresh
//! allocation for every call missed the allocator's per-thread cache and
//! cost about 200 instructions of a 4-byte all_reduce's 2,900 (callgrind,
//! bench/call_cost.c). A work is reused only when this list holds its last
//! reference (no caller, recorder entry, watchdog list or weak reference
//! can see it), so that reuse is invisible.

use crate::util::lock;
use crate::work::{HostWork, WaitHelp};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Works kept at most: past this, the oldest is let go (whoever still
/// holds it frees it). Above the recorder's default ring of 64 plus the
/// few works the watchdog's list holds between its prunings.
const KEPT: usize = 128;

#[derive(Default)]
pub struct RecycledWorks {
    issued: Mutex<Issued>,
    /// What the works' waiters run first (see [`WaitHelp`]).
    help: Option<Weak<dyn WaitHelp>>,
}

/// The issued works in a ring: oldest first from `oldest` (wrapping), so
/// that renewing the oldest in place moves nothing (a queue popped and
/// pushed at every call cost about 30 instructions more).
#[derive(Default)]
struct Issued {
    works: Vec<Arc<HostWork>>,
    oldest: usize,
}

impl RecycledWorks {
    /// Works whose waiters run `help` first.
    pub fn helped_by(help: Weak<dyn WaitHelp>) -> RecycledWorks {
        RecycledWorks {
            issued: Mutex::default(),
            help: Some(help),
        }
    }

    /// A new work, as [`HostWork::new`] makes it (started at `started`, if
    /// given, as [`HostWork::start_at`] makes it): the oldest one issued,
    /// renewed, when nobody else holds it any more, else a fresh one.
    #[inline]
    pub fn take(
        &self,
        op: &'static str,
        comm_label: &Arc<str>,
        timeout: Duration,
        started: Option<Instant>,
    ) -> Arc<HostWork> {
        let mut issued = lock(&self.issued);
        let Issued { works, oldest } = &mut *issued;
        let at = *oldest;
        if let Some(unshared) = works.get_mut(at).and_then(Arc::get_mut) {
            unshared.renew(op, comm_label, timeout, started);
            // The renewed work is now the newest.
            *oldest = if at + 1 == works.len() { 0 } else { at + 1 };
            return works[at].clone();
        }
        self.fresh(&mut issued, op, comm_label, timeout, started)
    }

    /// How many works were issued and are kept (for tests).
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        lock(&self.issued).works.len()
    }

    /// [`RecycledWorks::take`] when the oldest work is still held: a new
    /// one, kept as the newest.
    #[inline(never)]
    fn fresh(
        &self,
        issued: &mut Issued,
        op: &'static str,
        comm_label: &Arc<str>,
        timeout: Duration,
        started: Option<Instant>,
    ) -> Arc<HostWork> {
        let Issued { works, oldest } = issued;
        let at = *oldest;
        let mut fresh = HostWork::new(op, comm_label.clone(), timeout);
        if let Some(help) = &self.help {
            fresh = fresh.helped_by(help.clone());
        }
        let fresh = Arc::new(fresh);
        if let Some(at) = started {
            fresh.start_at(at);
        }
        if works.len() < KEPT {
            // The newest, just before the oldest (still held, kept).
            works.insert(at, fresh.clone());
            *oldest = (at + 1) % works.len();
        } else {
            // Full: the oldest is let go (whoever holds it frees it).
            works[at] = fresh.clone();
            *oldest = if at + 1 == works.len() { 0 } else { at + 1 };
        }
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::work::{Work, WorkStatus};

    fn take(works: &RecycledWorks) -> Arc<HostWork> {
        works.take(
            "barrier",
            &"test comm".into(),
            Duration::from_secs(60),
            None,
        )
    }

    #[test]
    fn a_work_still_held_elsewhere_is_never_reused() {
        let works = RecycledWorks::default();
        let held = take(&works);
        held.start();
        held.complete(Ok(()));
        let weak = Arc::downgrade(&take(&works));
        let next = take(&works);
        assert!(
            !Arc::ptr_eq(&held, &next),
            "a work its caller holds must not be reused"
        );
        assert_eq!(
            held.status(),
            WorkStatus::Completed,
            "the held work keeps its outcome"
        );
        assert!(
            !std::ptr::eq(weak.as_ptr(), Arc::as_ptr(&next)),
            "nor one with a weak reference"
        );
        assert_eq!(next.status(), WorkStatus::NotStarted);
    }

    #[test]
    fn a_work_nobody_holds_is_reused_as_new() {
        let works = RecycledWorks::default();
        let first = take(&works);
        first.start();
        first.complete(Err(crate::error::Error::invalid_usage("failed")));
        let at = Arc::as_ptr(&first);
        drop(first);
        let again = take(&works);
        assert_eq!(Arc::as_ptr(&again), at, "the released work comes back");
        assert_eq!(again.status(), WorkStatus::NotStarted, "as a new one");
        again.start();
        again.complete(Ok(()));
        assert!(again.wait_blocking().is_ok(), "without its old error");
    }

    /// Round the ring and round again: works released are reused in the
    /// order they were issued, none made anew.
    #[test]
    fn released_works_come_back_oldest_first() {
        let works = RecycledWorks::default();
        let held: Vec<_> = (0..KEPT).map(|_| take(&works)).collect();
        let first: Vec<_> = held.iter().map(Arc::as_ptr).collect();
        drop(held);
        for round in 0..2 {
            for (i, at) in first.iter().enumerate() {
                let w = take(&works);
                assert_eq!(Arc::as_ptr(&w), *at, "round {round}, work {i}");
            }
        }
    }

    /// Taken started (a call run inline), fresh or renewed: in progress
    /// since the given time, which the watchdog's timeout counts from.
    #[test]
    fn a_work_taken_started_runs_since_then() {
        let works = RecycledWorks::default();
        let Some(long_ago) = Instant::now().checked_sub(Duration::from_secs(120)) else {
            return;
        };
        let mut seen = Vec::new();
        for _ in 0..2 {
            let w = works.take(
                "barrier",
                &"c".into(),
                Duration::from_secs(60),
                Some(long_ago),
            );
            seen.push(Arc::as_ptr(&w));
            assert_eq!(w.status(), WorkStatus::InProgress);
            let e = w.check_timeout(Instant::now()).expect("past its timeout");
            assert!(e.message.contains("timed out after"), "{}", e.message);
            assert_eq!(w.status(), WorkStatus::TimedOut);
        }
        assert_eq!(seen[0], seen[1], "the second one was renewed");
        let fresh = take(&works);
        assert_eq!(fresh.status(), WorkStatus::NotStarted);
    }

    #[test]
    fn at_most_kept_works_are_held() {
        let works = RecycledWorks::default();
        let held: Vec<_> = (0..KEPT + 10).map(|_| take(&works)).collect();
        assert_eq!(lock(&works.issued).works.len(), KEPT);
        assert!(held.iter().all(|w| Arc::strong_count(w) <= 2));
    }
}
