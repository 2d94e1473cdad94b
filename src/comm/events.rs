//! The comm's side of the one way back from its backend
//! ([`CommEvents`]): an operation issued (recorded in the flight recorder,
//! its work put under the watchdog), whether the comm is still active, an
//! operation that failed.

use super::Comm;
use crate::backends::{CommEvents, Issue};
use crate::error::{Error, Result};
use crate::op::Op;
use std::time::Instant;

impl CommEvents for Comm {
    /// Records the operation in the flight recorder and puts its work
    /// under the watchdog: the watchdog looks at the works of the
    /// recorder's ring, so a work needs its own place on the watchdog's
    /// list only once the ring drops it unfinished (or when the recorder
    /// is off). Most works finish long before: no list to lock per call.
    #[inline]
    fn issued(&self, seq: u64, op: &Op, async_op: bool, issue: Issue<'_>, at: Instant) {
        let work = match issue {
            Issue::Refused(kind) => Err(kind),
            Issue::Done(work) => Ok(work),
            Issue::Watched(work) => {
                if !self.recorder.holds_works() {
                    self.watch(work.clone());
                }
                Ok(work)
            }
        };
        if let Some(unfinished) = self.recorder.record_as(seq, op, async_op, work, at) {
            self.watch(unfinished);
        }
    }

    fn check_active(&self) -> Result<()> {
        Comm::check_active(self)
    }

    fn operation_failed(&self, err: Error) {
        self.record_failure(err);
    }
}
