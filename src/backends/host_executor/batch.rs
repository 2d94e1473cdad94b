//! Jobs run together: a progress thread that takes a job the backend may
//! batch ([`HostBackend::may_batch`]) takes with it the jobs queued right
//! behind it that are independent of those taken
//! ([`HostBackend::independent`]) and have its timeout, and the backend
//! runs them as one ([`HostBackend::run_batch`]). A window of non-blocking
//! receives posted before their messages arrive then costs one hand-off
//! to the progress thread instead of one per receive, each work still
//! completing as soon as its own operation did.

use super::{HostBackend, Job, Shared};
use crate::backends::submission::CommEvents;
use crate::util::Deadline;
use crate::work::HostWork;

/// Most jobs run together (each joining one is checked against every one
/// taken before it).
const MAX_BATCH: usize = 64;

impl<B: HostBackend> Shared<B> {
    /// Runs `first` (its `running` slot taken, `may_batch`) with the jobs
    /// that may join it, none after `until`'s (a waiter of `until` runs
    /// the batch: it returns once the batch completed, which must not wait
    /// for an operation issued after its own), and releases the slot.
    pub(super) fn execute_batch(
        &self,
        first: Job,
        comm: &dyn CommEvents,
        until: Option<&HostWork>,
    ) {
        let timeout = first.timeout;
        let mut jobs = vec![first];
        self.queue.take_while(&mut jobs, |taken, job| {
            let reached = |w: &HostWork| taken.last().is_some_and(|t| std::ptr::eq(&*t.work, w));
            !until.is_some_and(reached)
                && taken.len() < MAX_BATCH
                && job.timeout == timeout
                && self.backend.may_batch(&job.op)
                && taken
                    .iter()
                    .all(|t| self.backend.independent(&t.op, &job.op))
        });
        if let [job] = &jobs[..] {
            return self.run(&job.op, Deadline::after(timeout), &job.work, true, comm);
        }
        let mut ready = Vec::with_capacity(jobs.len());
        for job in jobs {
            match comm.check_active() {
                Ok(()) => {
                    job.work.start();
                    crate::log_trace!("start {}", job.work.description());
                    ready.push(job);
                }
                Err(e) => self.complete(&job.work, Err(e), comm),
            }
        }
        if !ready.is_empty() {
            let ops: Vec<_> = ready.iter().map(|j| &j.op).collect();
            self.backend.run_batch(&ops, timeout, &mut |i, result| {
                self.complete(&ready[i].work, result, comm)
            });
        }
        self.queue.finished();
    }
}
