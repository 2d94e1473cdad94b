//! The host executor: what turns a host backend (one that runs an operation
//! to completion on the calling thread, [`HostBackend::run`]) into a
//! [`Backend`] that receives an operation and returns a work. It owns the
//! queue ([`queue`]), the progress thread that drains it, the inline fast
//! path for a blocking call with nothing ahead, the one-rank barrier that
//! completes at once, and the CUDA staging of device buffers ([`staging`]).
//! Any host backend is served by wrapping it: `HostExecutor::start(gloo,
//! &init)`.

mod batch;
pub mod queue;
mod recycled_works;
pub mod staging;

use super::submission::{CommEvents, CommLink, Submission};
use super::{Abilities, Backend, BackendInit, BufferHome};
use crate::error::{Error, Result};
use crate::op::Op;
use crate::util::{lock, Deadline};
use crate::work::{DoneWork, HostWork, WaitHelp, Work};
use queue::{completes_at_once, Claim, HostQueue, Job};
use recycled_works::RecycledWorks;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A backend that runs operations on the host, one at a time, to
/// completion on the calling thread; what else it answers is its
/// [`Abilities`], which the executor hands the comm as they are.
pub trait HostBackend: Abilities + 'static {
    /// Executes `op` to completion on the calling (progress) thread, failing
    /// by `deadline` (the operation's timeout from when it started). Called
    /// for one operation at a time, in issue order.
    fn run(&self, op: &Op, deadline: &Deadline) -> Result<()>;

    /// Whether `op` may complete at once on its caller's thread
    /// ([`HostBackend::run_at_once`]): a look at the operation alone, made
    /// before the running slot is claimed for it.
    fn may_run_at_once(&self, _op: &Op) -> bool {
        false
    }

    /// Runs `op` to completion now, on the calling thread, when no peer has
    /// to act first (a small send that fits its ring, a receive whose
    /// message is already there): `Some(outcome)`. None, with nothing
    /// done, when it would have to wait: an asynchronous call then goes to
    /// the progress thread, a blocking one to [`HostBackend::run`]. Called
    /// with the running slot held (nothing queued or running ahead of
    /// it), so issue order is kept.
    fn run_at_once(&self, _op: &Op) -> Option<Result<()>> {
        None
    }

    /// Whether `op` may run on the progress thread together with the
    /// operations queued right behind it ([`HostBackend::run_batch`]).
    fn may_batch(&self, _op: &Op) -> bool {
        false
    }

    /// Whether `later`, issued after `earlier`, may run together with it:
    /// nothing `later` does may depend on `earlier` having completed (a
    /// send of the buffer that a receive fills, say).
    fn independent(&self, _earlier: &Op, _later: &Op) -> bool {
        false
    }

    /// Runs `ops` (consecutive in issue order, each [`HostBackend::may_batch`]
    /// and [`HostBackend::independent`] of those before it) together to
    /// completion on the calling (progress) thread, failing within
    /// `timeout`, and calls `done(i, outcome)` once for each op `i` as soon
    /// as it completed, so that a waiter of one does not wait for the
    /// others.
    fn run_batch(&self, ops: &[&Op], timeout: Duration, done: &mut dyn FnMut(usize, Result<()>)) {
        for (i, op) in ops.iter().enumerate() {
            done(i, self.run(op, &Deadline::after(timeout)));
        }
    }

    /// Called by the progress thread while no job is there: whatever the
    /// backend's transports need done meanwhile (UCX windows progress their
    /// worker). Returns when to be called again (None: only after the next
    /// job, or once woken through the backend's [`IdleWake`]).
    fn idle(&self) -> Option<Duration> {
        None
    }

    /// Hands the backend what wakes its progress thread while idle (as the
    /// executor starts), for when [`HostBackend::idle`] would answer
    /// differently now.
    fn attach_idle_wake(&self, _wake: IdleWake) {}
}

thread_local! {
    /// Set on an executor's progress thread.
    static PROGRESS_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is a host executor's progress thread: the
/// operation it runs overlaps whatever the application's threads do
/// meanwhile (a blocking call runs on its caller's thread, which waits).
pub fn on_progress_thread() -> bool {
    PROGRESS_THREAD.with(|p| p.get())
}

/// Wakes an executor's idle progress thread, which then calls
/// [`HostBackend::idle`] again; does nothing once the executor is gone.
#[derive(Clone)]
pub struct IdleWake(Weak<HostQueue>);

impl IdleWake {
    pub fn wake(&self) {
        if let Some(queue) = self.0.upgrade() {
            queue.wake_idle();
        }
    }
}

/// What the progress thread shares with the callers.
struct Shared<B> {
    backend: B,
    queue: Arc<HostQueue>,
    link: CommLink,
}

/// A host backend served by a queue and a progress thread.
pub struct HostExecutor<B: HostBackend> {
    shared: Arc<Shared<B>>,
    progress: Mutex<Option<JoinHandle<()>>>,
    works: RecycledWorks,
    /// The work of every call that completed well without one of its own
    /// (a one-rank barrier, an operation run at once before any work was
    /// taken): shared, as nothing about it differs from one call to the
    /// next.
    done: Arc<dyn Work>,
    name: String,
    rank: i32,
    size: i32,
}

impl<B: HostBackend> HostExecutor<B> {
    /// Serves `backend`, made for `init`'s comm, and starts its progress
    /// thread.
    pub fn start(backend: B, init: &BackendInit) -> Result<HostExecutor<B>> {
        let shared = Arc::new(Shared {
            backend,
            queue: Arc::default(),
            link: init.link.clone(),
        });
        let wake = IdleWake(Arc::downgrade(&shared.queue));
        shared.backend.attach_idle_wake(wake);
        let progress = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("tc-progress-{}", init.name))
                .spawn(move || {
                    PROGRESS_THREAD.with(|p| p.set(true));
                    while let Some(job) = shared.queue.next(shared.backend.idle()) {
                        if let Some(job) = job {
                            shared.execute(job, &shared.link, None);
                        }
                    }
                })
                .map_err(|e| Error::system("spawning the progress thread", e))?
        };
        let help: Weak<dyn WaitHelp> = Arc::downgrade(&shared) as Weak<Shared<B>>;
        Ok(HostExecutor {
            shared,
            progress: Mutex::new(Some(progress)),
            works: RecycledWorks::helped_by(help),
            done: Arc::new(DoneWork(Ok(()))),
            name: init.name.clone(),
            rank: init.rank,
            size: init.size,
        })
    }
}

/// A waiter runs the jobs queued up to its own while none runs (and its
/// own with them), none behind it: the jobs ahead of it would run first
/// anyway, and a window of non-blocking calls waited for then runs on its
/// caller's thread, no progress thread to wake. Each is tried at once
/// first ([`HostBackend::run_at_once`]: a receive whose message came
/// meanwhile).
impl<B: HostBackend> WaitHelp for Shared<B> {
    fn help(&self, work: &HostWork) {
        while !work.known_finished() {
            let Some(job) = self.queue.take_next() else {
                return;
            };
            if self.backend.may_run_at_once(&job.op) {
                job.work.start();
                if self.try_at_once(&job.op, &job.work, &self.link) {
                    continue;
                }
            }
            self.execute(job, &self.link, Some(work));
        }
    }
}

impl<B: HostBackend> Shared<B> {
    /// Runs one queued job (its `running` slot already taken) for `comm`,
    /// with the jobs behind it that may run together with it (see
    /// [`batch`]), none after `until`'s, and releases the slot.
    fn execute(&self, job: Job, comm: &dyn CommEvents, until: Option<&HostWork>) {
        if !self.backend.may_batch(&job.op) {
            let d = Deadline::after(job.timeout);
            return self.run(&job.op, d, &job.work, true, comm);
        }
        self.execute_batch(job, comm, until);
    }

    /// Completes `work` with `result`, telling `comm` of a failure.
    #[inline]
    fn complete(&self, work: &HostWork, result: Result<()>, comm: &dyn CommEvents) {
        match result {
            Ok(()) => work.complete(Ok(())),
            Err(e) => Self::fail(work, e, comm),
        }
    }

    /// [`Shared::complete`] with an error, out of the way of the calls that
    /// succeed.
    #[cold]
    fn fail(work: &HostWork, e: Error, comm: &dyn CommEvents) {
        let e = e.context(work.description());
        comm.operation_failed(e.clone());
        work.complete(Err(e));
    }

    /// Runs `op` (its `running` slot already taken) on the calling thread
    /// when the backend can without waiting ([`HostBackend::run_at_once`]):
    /// its outcome, the slot still held. None, with nothing done, when it
    /// would wait.
    #[inline]
    fn at_once(&self, op: &Op, comm: &dyn CommEvents) -> Option<Result<()>> {
        match comm.check_active() {
            Ok(()) => self.backend.run_at_once(op),
            Err(e) => Some(Err(e)),
        }
    }

    /// Completes `op` (its `running` slot already taken, `work` started)
    /// on the calling thread when the backend can without waiting
    /// ([`Shared::at_once`]) and releases the slot: true. False, with
    /// nothing done and the slot still held, when it would wait.
    fn try_at_once(&self, op: &Op, work: &HostWork, comm: &dyn CommEvents) -> bool {
        let Some(result) = self.at_once(op, comm) else {
            return false;
        };
        self.complete(work, result, comm);
        self.queue.finished();
        true
    }

    /// The asynchronous `op` (its `running` slot already taken, `work`
    /// started) completed at once when `try_first` and it can
    /// ([`Shared::try_at_once`]: a hand-off to the progress thread and a
    /// wake of the caller at completion saved per small message), else
    /// queued for the progress thread. Hands the job back when the queue
    /// was stopped.
    fn run_at_once_or_queue(
        &self,
        op: Op,
        try_first: bool,
        timeout: Duration,
        work: &Arc<HostWork>,
        comm: &dyn CommEvents,
    ) -> std::result::Result<(), Job> {
        if try_first && self.try_at_once(&op, work, comm) {
            return Ok(());
        }
        let job = Job {
            op,
            timeout,
            work: work.clone(),
        };
        let queued = self.queue.push(job);
        // After the push: the progress thread takes the job once the slot
        // is free, and no claim passes it meanwhile.
        self.queue.finished();
        queued
    }

    /// Runs `op` (its `running` slot already taken) for `comm` by deadline
    /// `d`, completing `work` (which it starts first when `start`: a call
    /// run inline has its work started when taken), and releases the slot.
    #[inline]
    fn run(&self, op: &Op, d: Deadline, work: &HostWork, start: bool, comm: &dyn CommEvents) {
        let result = comm.check_active().and_then(|()| {
            if start {
                work.start();
            }
            crate::log_trace!("start {}", work.description());
            self.backend.run(op, &d)
        });
        self.complete(work, result, comm);
        self.queue.finished();
    }
}

impl<B: HostBackend> HostExecutor<B> {
    /// Ends the call of `op`, which failed at once on the calling thread
    /// with `e` (its `running` slot still held): its work holds the error.
    /// The flight recorder is told before the comm hears of the failure
    /// (its report then shows the operation), and before the slot is
    /// released (issue order).
    #[cold]
    fn failed_at_once(
        &self,
        op: &Op,
        sub: Submission<'_>,
        e: Error,
        at: Instant,
    ) -> Result<Arc<dyn Work>> {
        let e = e.context(format!("{} on {}", op.name(), sub.label));
        let work: Arc<dyn Work> = Arc::new(DoneWork(Err(e.clone())));
        sub.tell_at(op, super::Issue::Done(&work), at);
        sub.comm.operation_failed(e.clone());
        self.shared.queue.finished();
        match sub.opts.async_op {
            true => Ok(work),
            false => Err(e),
        }
    }

    /// Fails `work`, issued after the queue stopped; returns the error.
    #[cold]
    fn shutting_down(&self, work: &HostWork) -> Error {
        let e = Error::invalid_usage(format!("comm '{}' is shutting down", self.name));
        work.complete(Err(e.clone()));
        e
    }
}

impl<B: HostBackend> Drop for HostExecutor<B> {
    /// Ends the progress thread of an executor that was never stopped (a
    /// comm whose creation failed after its backend was made).
    fn drop(&mut self) {
        for job in self.shared.queue.stop() {
            job.work
                .complete(Err(Error::invalid_usage("the comm was destroyed")));
        }
    }
}

impl<B: HostBackend> Backend for HostExecutor<B> {
    fn buffer_home(&self) -> BufferHome {
        BufferHome::Host
    }

    fn abilities(&self) -> &dyn Abilities {
        &self.shared.backend
    }

    fn submit(&self, mut op: Op, mut sub: Submission<'_>) -> Result<Arc<dyn Work>> {
        if completes_at_once(&op, self.size) {
            let work = self.done.clone();
            sub.done_at_once(&op, &work);
            return Ok(work);
        }
        // CUDA buffers on a host backend run on pinned copies, synchronously.
        let staged = (sub.may_be_device && staging::may_stage(&op))
            .then(|| staging::stage_in(&mut op, self.rank, self.size, sub.opts.stream))
            .transpose();
        let staged = match staged {
            Ok(staged) => staged.flatten(),
            Err(e) => return Err(sub.refuse(&op, e)),
        };
        let blocking = !sub.opts.async_op || staged.is_some();
        // An asynchronous call with nothing ahead that may complete without
        // waiting for a peer is tried at once on this thread.
        let may_run_at_once = staged.is_none() && self.shared.backend.may_run_at_once(&op);
        let at_once = !blocking && may_run_at_once;
        let claim = match blocking || at_once {
            true => self.shared.queue.claim(),
            false => Claim::Busy,
        };
        // Run inline, the operation starts at once: one clock read for the
        // flight recorder's time of issue and its work's start, and the
        // work is taken started (its lock not taken for that).
        let started = (claim == Claim::Inline).then(Instant::now);
        // Tried now, before any work is taken, when no post hook needs one
        // (most small sends and receives end here): a work is taken only
        // for an operation that has to wait.
        let mut try_at_once = claim == Claim::Inline && may_run_at_once;
        if try_at_once && sub.post.is_none() {
            let at = started.unwrap_or_else(Instant::now);
            if let Some(result) = self.shared.at_once(&op, sub.comm) {
                return match result {
                    Ok(()) => {
                        let work = self.done.clone();
                        sub.tell_at(&op, super::Issue::Done(&work), at);
                        self.shared.queue.finished();
                        Ok(work)
                    }
                    Err(e) => self.failed_at_once(&op, sub, e, at),
                };
            }
            try_at_once = false;
        }
        let work = self.works.take(
            op.name(),
            sub.label,
            sub.timeout + self.shared.backend.watchdog_grace(),
            started,
        );
        if let Some(post) = sub.post.take() {
            work.on_complete(Box::new(move |r| post(r, true)));
        }
        let handle: Arc<dyn Work> = work.clone();
        match claim {
            Claim::Inline if at_once => {
                let at = started.unwrap_or_else(Instant::now);
                sub.tell_at(&op, super::Issue::Watched(&handle), at);
                let queued =
                    self.shared
                        .run_at_once_or_queue(op, try_at_once, sub.timeout, &work, sub.comm);
                if queued.is_err() {
                    return Err(self.shutting_down(&work));
                }
                return Ok(handle);
            }
            Claim::Inline => {
                let at = started.unwrap_or_else(Instant::now);
                sub.tell_at(&op, super::Issue::Watched(&handle), at);
                // A blocking call that needs no peer to act first (a send
                // that fits its ring, a receive whose message is there)
                // skips the backend's full run: its deadline, transport
                // table and progress loop.
                if !(try_at_once && self.shared.try_at_once(&op, &work, sub.comm)) {
                    let d = Deadline::since(at, sub.timeout);
                    self.shared.run(&op, d, &work, false, sub.comm);
                }
            }
            Claim::Busy => {
                sub.tell(&op, super::Issue::Watched(&handle));
                let job = Job {
                    op,
                    timeout: sub.timeout,
                    work: work.clone(),
                };
                if self.shared.queue.push(job).is_err() {
                    return Err(self.shutting_down(&work));
                }
            }
            Claim::Stopped => {
                sub.tell(&op, super::Issue::Watched(&handle));
                return Err(self.shutting_down(&work));
            }
        }
        if blocking {
            work.wait_blocking()?;
        }
        if let Some(staged) = staged {
            staged.finish()?;
        }
        Ok(handle)
    }

    fn wait_idle(&self) {
        self.shared.queue.wait_idle();
    }

    fn stop(&self, err: &Error) {
        for job in self.shared.queue.stop() {
            job.work.complete(Err(err.clone()));
        }
        let progress = lock(&self.progress).take();
        if let Some(t) = progress {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests;
