//! The works an executor hands out, reused once nobody else holds them: a
//! blocking call's work outlives it in the flight recorder's ring (64
//! entries by default) and is freed 64 calls later, so that a fresh
//! allocation for every call missed the allocator's per-thread cache and
//! cost about 200 instructions of a 4-byte all_reduce's 2,900 (callgrind,
//! bench/call_cost.c). A work is reused only when this list holds its last
//! reference (no caller, recorder entry, watchdog list or weak reference
//! can see it), so that reuse is invisible.

use crate::util::lock;
use crate::work::HostWork;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Works kept at most: past this, the oldest is let go (whoever still
/// holds it frees it). Above the recorder's default ring of 64 plus the
/// few works the watchdog's list holds between its prunings.
const KEPT: usize = 128;

#[derive(Default)]
pub struct RecycledWorks {
    /// Issued works, oldest first.
    issued: Mutex<VecDeque<Arc<HostWork>>>,
}

impl RecycledWorks {
    /// A new work, as [`HostWork::new`] makes it: the oldest one issued,
    /// renewed, when nobody else holds it any more, else a fresh one.
    pub fn take(
        &self,
        op: &'static str,
        comm_label: &Arc<str>,
        timeout: Duration,
    ) -> Arc<HostWork> {
        let mut issued = lock(&self.issued);
        let work = match issued.pop_front() {
            Some(mut oldest) => match Arc::get_mut(&mut oldest) {
                Some(unshared) => {
                    unshared.renew(op, comm_label, timeout);
                    oldest
                }
                None => {
                    issued.push_front(oldest);
                    Arc::new(HostWork::new(op, comm_label.clone(), timeout))
                }
            },
            None => Arc::new(HostWork::new(op, comm_label.clone(), timeout)),
        };
        if issued.len() >= KEPT {
            issued.pop_front();
        }
        issued.push_back(work.clone());
        work
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::work::{Work, WorkStatus};

    fn take(works: &RecycledWorks) -> Arc<HostWork> {
        works.take("barrier", &"test comm".into(), Duration::from_secs(60))
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

    #[test]
    fn at_most_kept_works_are_held() {
        let works = RecycledWorks::default();
        let held: Vec<_> = (0..KEPT + 10).map(|_| take(&works)).collect();
        assert_eq!(lock(&works.issued).len(), KEPT);
        assert!(held.iter().all(|w| Arc::strong_count(w) <= 2));
    }
}
