//! The host executor's queue: host backends ([`super::HostBackend::run`])
//! run one operation at a time, in issue order, on the executor's progress
//! thread — or, for a blocking call with nothing ahead of it, inline on the
//! caller's thread. This module owns that queue and its hand-offs; the
//! executor ([`super::HostExecutor`]) owns what runs a job and the thread.

use crate::op::Op;
use crate::util::lock;
use crate::work::HostWork;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
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
    stop: bool,
    /// Threads in [`HostQueue::wait_idle`].
    idle_waiters: usize,
    /// [`HostQueue::wake_idle`] was called since the progress thread last
    /// looked.
    woken: bool,
    /// The progress thread waits for a job and was not woken since.
    progress_waits: bool,
}

/// [`HostQueue::state`]: a job runs (taken by the progress thread or run
/// inline; one at a time).
const RUNNING: u32 = 1;
/// Jobs are queued (mirrors `!jobs.is_empty()`, changed under the lock).
const QUEUED: u32 = 2;
/// The queue was stopped (changed under the lock).
const STOPPED: u32 = 4;
/// Threads wait for the queue to be idle (changed under the lock).
const IDLE_WAITERS: u32 = 8;

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
/// notified only when someone may be waiting for that change. A blocking
/// call with nothing ahead takes and releases the running slot with one
/// atomic operation each, without the lock (a lock each cost about 35
/// instructions of a 4-byte call's 2,500).
#[derive(Default)]
pub struct HostQueue {
    queue: Mutex<Queue>,
    /// RUNNING, QUEUED, STOPPED and IDLE_WAITERS. Every change but
    /// RUNNING's is made under `queue`'s lock; RUNNING is set only while
    /// QUEUED and STOPPED are clear (a claim) or by the progress thread
    /// under the lock while QUEUED is set, so one job runs at a time and a
    /// claim never passes a queued job.
    state: AtomicU32,
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
        let mut seen = self.state.load(Ordering::Relaxed);
        loop {
            if seen & STOPPED != 0 {
                return Claim::Stopped;
            }
            if seen & (RUNNING | QUEUED) != 0 {
                return Claim::Busy;
            }
            // Acquire: the job that ran before (its release in `finished`).
            match self.state.compare_exchange_weak(
                seen,
                seen | RUNNING,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Claim::Inline,
                Err(now) => seen = now,
            }
        }
    }

    /// Queues `job` for the progress thread; hands it back, not run, once
    /// the queue was stopped.
    pub fn push(&self, job: Job) -> std::result::Result<(), Job> {
        let mut q = lock(&self.queue);
        if q.stop {
            return Err(job);
        }
        q.jobs.push_back(job);
        self.state.fetch_or(QUEUED, Ordering::AcqRel);
        // A notification is a system call: only a progress thread that
        // waits, not woken yet, needs one (a window's receives queue one
        // behind another).
        let wake = std::mem::take(&mut q.progress_waits);
        drop(q);
        if wake {
            self.changed.notify_all();
        }
        Ok(())
    }

    /// The next job for the progress thread (its running slot taken), once
    /// no job runs; None once the queue is stopped; Some(None) when `idle`
    /// passed without one (None: never) or [`HostQueue::wake_idle`] was
    /// called.
    pub fn next(&self, idle: Option<Duration>) -> Option<Option<Job>> {
        let mut q = lock(&self.queue);
        loop {
            // One operation at a time: a blocking call may be running inline
            // on its caller's thread. While jobs are queued no claim takes
            // the slot, so it stays free from this look to the taking.
            if let Some(job) = self.take_front(&mut q) {
                return Some(Some(job));
            }
            if q.stop {
                return None;
            }
            if std::mem::take(&mut q.woken) {
                return Some(None);
            }
            q.progress_waits = true;
            let timed_out;
            (q, timed_out) = match idle {
                None => (
                    self.changed.wait(q).unwrap_or_else(|e| e.into_inner()),
                    false,
                ),
                Some(t) => {
                    let (q, waited) = self
                        .changed
                        .wait_timeout(q, t)
                        .unwrap_or_else(|e| e.into_inner());
                    (q, waited.timed_out())
                }
            };
            q.progress_waits = false;
            if timed_out {
                return Some(None);
            }
        }
    }

    /// For a thread about to wait for a job: the front job, its running
    /// slot taken, when one is queued and none runs (the caller runs it,
    /// then calls [`HostQueue::finished`]).
    pub fn take_next(&self) -> Option<Job> {
        if self.state.load(Ordering::Acquire) & (RUNNING | QUEUED) != QUEUED {
            return None;
        }
        self.take_front(&mut lock(&self.queue))
    }

    /// The front job of `q` (the queue, locked), its running slot taken,
    /// when none runs.
    fn take_front(&self, q: &mut Queue) -> Option<Job> {
        if q.jobs.is_empty() || self.state.load(Ordering::Acquire) & RUNNING != 0 {
            return None;
        }
        self.state.fetch_or(RUNNING, Ordering::AcqRel);
        let job = q.jobs.pop_front();
        if q.jobs.is_empty() {
            self.state.fetch_and(!QUEUED, Ordering::AcqRel);
        }
        job
    }

    /// For the thread holding the running slot: moves the jobs
    /// at the front of the queue to the end of `taken`, in order, while
    /// `fits(taken, job)`.
    pub fn take_while(&self, taken: &mut Vec<Job>, fits: impl Fn(&[Job], &Job) -> bool) {
        let mut q = lock(&self.queue);
        while let Some(job) = q.jobs.front() {
            if !fits(taken, job) {
                break;
            }
            taken.extend(q.jobs.pop_front());
        }
        if q.jobs.is_empty() {
            self.state.fetch_and(!QUEUED, Ordering::AcqRel);
        }
    }

    /// Releases the running slot of a job taken by [`HostQueue::next`] or
    /// run inline.
    /// A blocking call run inline wakes nobody here when nothing is queued
    /// behind it (the common case of a program that waits for each call).
    #[inline]
    pub fn finished(&self) {
        // Release: the next job (claimed or taken) comes after this one.
        let before = self.state.fetch_and(!RUNNING, Ordering::AcqRel);
        if before & (QUEUED | IDLE_WAITERS) != 0 {
            self.wake_after_finish();
        }
    }

    /// [`HostQueue::finished`] with jobs or idle waiters there: through the
    /// lock, so that a thread that saw the slot taken under it is waiting
    /// by now, and hears the notification.
    fn wake_after_finish(&self) {
        let mut q = lock(&self.queue);
        let wake = std::mem::take(&mut q.progress_waits) || q.idle_waiters > 0;
        drop(q);
        if wake {
            self.changed.notify_all();
        }
    }

    /// Makes the progress thread's [`HostQueue::next`] return at once (or
    /// as soon as it waits), so that it asks its backend again what to do
    /// while idle.
    pub fn wake_idle(&self) {
        lock(&self.queue).woken = true;
        self.changed.notify_all();
    }

    /// Waits until no job is queued or running.
    pub fn wait_idle(&self) {
        let mut q = lock(&self.queue);
        q.idle_waiters += 1;
        self.state.fetch_or(IDLE_WAITERS, Ordering::AcqRel);
        while !q.jobs.is_empty() || self.state.load(Ordering::Acquire) & RUNNING != 0 {
            q = self.changed.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        q.idle_waiters -= 1;
        if q.idle_waiters == 0 {
            self.state.fetch_and(!IDLE_WAITERS, Ordering::AcqRel);
        }
    }

    /// Stops the queue and returns the jobs that never ran.
    pub fn stop(&self) -> Vec<Job> {
        let pending = {
            let mut q = lock(&self.queue);
            q.stop = true;
            self.state.fetch_or(STOPPED, Ordering::AcqRel);
            self.state.fetch_and(!QUEUED, Ordering::AcqRel);
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
        assert!(q.next(None).is_some(), "the queued job comes next");
        q.finished();
        // An asynchronous call always goes through the queue, and a
        // blocking one behind it too.
        assert!(q.push(job()).is_ok());
        assert_eq!(q.claim(), Claim::Busy);
        assert!(q.push(job()).is_ok());
        assert_eq!(q.stop().len(), 2, "the jobs that never ran come back");
        assert_eq!(q.claim(), Claim::Stopped);
        assert!(q.push(job()).is_err(), "handed back once stopped");
        assert!(q.next(None).is_none());
        q.wait_idle();
    }

    /// A job queued while a call runs inline waits for that call's
    /// `finished`, and a job queued (running or not) keeps later blocking
    /// calls from running inline ahead of it.
    #[test]
    fn a_queued_job_waits_for_the_inline_call_and_is_not_passed() {
        let q = Arc::new(HostQueue::default());
        assert_eq!(q.claim(), Claim::Inline);
        assert!(q.push(job()).is_ok());
        let (tx, rx) = std::sync::mpsc::channel();
        let progress = {
            let q = q.clone();
            std::thread::spawn(move || {
                while let Some(Some(j)) = q.next(None) {
                    tx.send(()).unwrap();
                    drop(j);
                    q.finished();
                }
            })
        };
        assert!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "taken while the inline call runs"
        );
        q.finished();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("taken once the inline call finished");
        q.wait_idle();
        assert_eq!(q.claim(), Claim::Inline, "idle again");
        q.finished();
        q.stop();
        progress.join().unwrap();
    }

    /// Threads issuing blocking calls (inline when they can, else queued
    /// and waited for) and asynchronous ones against a progress thread:
    /// never two jobs at once, every job runs, and `wait_idle` returns
    /// once all did.
    #[test]
    fn one_job_at_a_time_under_concurrent_callers() {
        use crate::work::Work;
        use std::sync::atomic::AtomicUsize;
        let q = Arc::new(HostQueue::default());
        let running = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        let run = {
            let (running, ran) = (running.clone(), ran.clone());
            move || {
                assert_eq!(
                    running.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two jobs at once"
                );
                // Long enough for a woken progress thread to overlap it.
                let t = std::time::Instant::now();
                while t.elapsed() < Duration::from_micros(50) {
                    assert_eq!(running.load(Ordering::SeqCst), 1, "two jobs at once");
                }
                running.fetch_sub(1, Ordering::SeqCst);
                ran.fetch_add(1, Ordering::SeqCst);
            }
        };
        let progress = {
            let (q, run) = (q.clone(), run.clone());
            std::thread::spawn(move || {
                while let Some(Some(job)) = q.next(None) {
                    job.work.start();
                    run();
                    job.work.complete(Ok(()));
                    q.finished();
                }
            })
        };
        let (threads, calls) = (4, 500);
        let callers: Vec<_> = (0..threads)
            .map(|t| {
                let (q, run) = (q.clone(), run.clone());
                std::thread::spawn(move || {
                    for i in 0..calls {
                        if (i + t) % 3 == 0 {
                            q.push(job()).map_err(|_| ()).unwrap();
                            continue;
                        }
                        match q.claim() {
                            Claim::Inline => {
                                run();
                                q.finished();
                            }
                            Claim::Busy => {
                                let j = job();
                                let work = j.work.clone();
                                q.push(j).map_err(|_| ()).unwrap();
                                work.wait_blocking().unwrap();
                            }
                            Claim::Stopped => panic!("not stopped"),
                        }
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        q.wait_idle();
        assert_eq!(ran.load(Ordering::SeqCst), threads * calls);
        assert!(q.stop().is_empty());
        progress.join().unwrap();
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
