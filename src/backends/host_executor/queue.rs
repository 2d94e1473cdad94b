//! The host executor's queue: host backends ([`super::HostBackend::run`])
//! run one operation at a time, in issue order, on the executor's progress
//! thread — or, for a blocking call with nothing ahead of it, inline on the
//! caller's thread. This module owns that queue and its hand-offs; the
//! executor ([`super::HostExecutor`]) owns what runs a job and the thread.

use crate::op::Op;
use crate::util::lock;
use crate::work::HostWork;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Whether a host backend's `op` on a comm of `size` ranks has nothing to
/// do and completes at once, without a trip through the queue: a barrier of
/// one rank.
pub fn completes_at_once(op: &Op, size: i32) -> bool {
    size == 1 && matches!(op, Op::Barrier)
}

/// An operation waiting for the host progress thread.
pub struct Job {
    pub op: Op,
    pub timeout: Duration,
    pub work: Arc<HostWork>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs taken but not finished (0 or 1).
    running: usize,
    stop: bool,
    /// Threads in [`HostQueue::wait_idle`].
    idle_waiters: usize,
}

/// What [`HostQueue::claim`] answered a blocking call.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nothing queued or running: the caller runs its operation now, then
    /// calls [`HostQueue::finished`].
    Inline,
    /// Something is queued or running: the job goes through the queue.
    Busy,
    /// The queue was stopped.
    Stopped,
}

/// Waking a thread costs a system call and, on a loaded host, a core taken
/// from a rank that is polling for its peer: each condition variable is
/// notified only when someone may be waiting for that change.
#[derive(Default)]
pub struct HostQueue {
    queue: Mutex<Queue>,
    /// A job was queued, or the running one finished while jobs or idle
    /// waiters were there (the progress thread and `wait_idle`).
    changed: Condvar,
}

impl HostQueue {
    /// For a blocking call: takes the running slot when no operation is
    /// queued or running, so that the caller runs its operation inline:
    /// two thread hand-offs saved per call (the watchdog still guards it
    /// through its work), and no job built.
    pub fn claim(&self) -> Claim {
        let mut q = lock(&self.queue);
        if q.stop {
            return Claim::Stopped;
        }
        if q.jobs.is_empty() && q.running == 0 {
            q.running += 1;
            return Claim::Inline;
        }
        Claim::Busy
    }

    /// Queues `job` for the progress thread; hands it back, not run, once
    /// the queue was stopped.
    pub fn push(&self, job: Job) -> std::result::Result<(), Job> {
        let mut q = lock(&self.queue);
        if q.stop {
            return Err(job);
        }
        q.jobs.push_back(job);
        drop(q);
        self.changed.notify_all();
        Ok(())
    }

    /// The next job for the progress thread (its running slot taken), once
    /// no job runs; None once the queue is stopped.
    pub fn next(&self) -> Option<Job> {
        let mut q = lock(&self.queue);
        loop {
            // One operation at a time: a blocking call may be running inline
            // on its caller's thread.
            if q.running == 0 {
                if let Some(job) = q.jobs.pop_front() {
                    q.running += 1;
                    return Some(job);
                }
            }
            if q.stop {
                return None;
            }
            q = self.changed.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Releases the running slot of a job taken by [`HostQueue::next`] or
    /// run inline.
    /// A blocking call run inline wakes nobody here when nothing is queued
    /// behind it (the common case of a program that waits for each call).
    pub fn finished(&self) {
        let mut q = lock(&self.queue);
        q.running -= 1;
        let wanted = !q.jobs.is_empty() || q.idle_waiters > 0;
        drop(q);
        if wanted {
            self.changed.notify_all();
        }
    }

    /// Waits until no job is queued or running.
    pub fn wait_idle(&self) {
        let mut q = lock(&self.queue);
        q.idle_waiters += 1;
        while !q.jobs.is_empty() || q.running > 0 {
            q = self.changed.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        q.idle_waiters -= 1;
    }

    /// Stops the queue and returns the jobs that never ran.
    pub fn stop(&self) -> Vec<Job> {
        let pending = {
            let mut q = lock(&self.queue);
            q.stop = true;
            q.jobs.drain(..).collect()
        };
        self.changed.notify_all();
        pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        let timeout = Duration::from_secs(60);
        Job {
            op: Op::Barrier,
            timeout,
            work: Arc::new(HostWork::new("barrier", "test comm".into(), timeout)),
        }
    }

    #[test]
    fn a_blocking_call_runs_inline_only_with_nothing_ahead() {
        let q = HostQueue::default();
        assert_eq!(q.claim(), Claim::Inline);
        // One job runs (inline): the next blocking call waits its turn.
        assert_eq!(q.claim(), Claim::Busy);
        assert!(q.push(job()).is_ok());
        q.finished();
        assert!(q.next().is_some(), "the queued job comes next");
        q.finished();
        // An asynchronous call always goes through the queue, and a
        // blocking one behind it too.
        assert!(q.push(job()).is_ok());
        assert_eq!(q.claim(), Claim::Busy);
        assert!(q.push(job()).is_ok());
        assert_eq!(q.stop().len(), 2, "the jobs that never ran come back");
        assert_eq!(q.claim(), Claim::Stopped);
        assert!(q.push(job()).is_err(), "handed back once stopped");
        assert!(q.next().is_none());
        q.wait_idle();
    }

    #[test]
    fn only_a_one_rank_barrier_completes_at_once() {
        assert!(completes_at_once(&Op::Barrier, 1));
        assert!(!completes_at_once(&Op::Barrier, 2));
        let send = Op::send(
            crate::op::Ptr(std::ptr::null_mut()),
            0,
            crate::types::DType::U8,
            0,
            0,
        );
        assert!(!completes_at_once(&send, 1));
    }
}
