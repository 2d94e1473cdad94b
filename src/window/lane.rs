//! A window's lane: a FIFO of calls run one at a time by a thread of its
//! own, started on its first queued call (see the module docs of
//! [`super`]: the origin lane and the wait lane).

use crate::error::{Error, ErrorKind, Result};
use crate::work::{HostWork, Work};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

pub(super) type Task = Box<dyn FnOnce() -> Result<()> + Send>;

struct Job {
    op: &'static str,
    task: Task,
    work: Arc<HostWork>,
    /// Asynchronous (its failure is kept for the comm's finalize); a
    /// blocking call queued behind asynchronous ones reports to its caller.
    is_async: bool,
}

struct LaneState {
    jobs: VecDeque<Job>,
    /// Jobs queued or running on the lane's thread.
    pending: usize,
    /// Set when the window is dropped: the thread ends after its current job.
    closed: bool,
    /// Set when the comm is aborted: calls are refused, and the running one
    /// reports this error if it fails.
    aborted: Option<Error>,
    /// First failure of an asynchronous call, until the comm's finalize
    /// takes it.
    failure: Option<Error>,
    thread: Option<JoinHandle<()>>,
}

/// A FIFO of window calls run one at a time by a thread of its own.
pub(super) struct Lane {
    name: &'static str,
    st: Mutex<LaneState>,
    cv: Condvar,
}

impl Lane {
    pub(super) fn new(name: &'static str) -> Arc<Lane> {
        Arc::new(Lane {
            name,
            st: Mutex::new(LaneState {
                jobs: VecDeque::new(),
                pending: 0,
                closed: false,
                aborted: None,
                failure: None,
                thread: None,
            }),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LaneState> {
        crate::util::lock(&self.st)
    }

    /// The refusal of a call on a lane of an aborted comm's window.
    fn refused(op: &str, label: &str, aborted: &Error) -> Error {
        Error::new(
            ErrorKind::Aborted,
            format!("{op} on {label}: {}", aborted.message),
        )
    }

    /// Queues `task` (starting the lane's thread on first use) and returns
    /// its work, not yet started.
    pub(super) fn submit(
        self: &Arc<Self>,
        op: &'static str,
        label: &Arc<str>,
        timeout: Duration,
        is_async: bool,
        task: Task,
    ) -> Result<Arc<HostWork>> {
        let mut st = self.lock();
        if st.closed {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("{op} on {label}: the window was freed"),
            ));
        }
        if let Some(e) = &st.aborted {
            return Err(Lane::refused(op, label, e));
        }
        if st.thread.is_none() {
            let me = self.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tc-win-{}", self.name))
                .spawn(move || me.serve())
                .map_err(|e| {
                    Error::system(
                        format!(
                            "{op} on {label}: starting the window's {} thread",
                            self.name
                        ),
                        e,
                    )
                })?;
            st.thread = Some(thread);
        }
        let work = Arc::new(HostWork::new(op, label.clone(), timeout));
        st.jobs.push_back(Job {
            op,
            task,
            work: work.clone(),
            is_async,
        });
        st.pending += 1;
        drop(st);
        self.cv.notify_all();
        Ok(work)
    }

    /// Runs `task` on the caller's thread when nothing is queued or running
    /// on the lane; otherwise queues it behind and waits for it.
    /// Either way its work goes to `watch` (the comm's watchdog) while it
    /// runs.
    pub(super) fn run_blocking(
        self: &Arc<Self>,
        op: &'static str,
        label: &Arc<str>,
        timeout: Duration,
        watch: impl FnOnce(Arc<HostWork>),
        task: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let idle = {
            let st = self.lock();
            if let Some(e) = &st.aborted {
                return Err(Lane::refused(op, label, e));
            }
            st.pending == 0
        };
        let work = if idle {
            let work = Arc::new(HostWork::new(op, label.clone(), timeout));
            work.start();
            watch(work.clone());
            // A call the watchdog timed out keeps that outcome (it aborted
            // the comm, which ended the call).
            work.complete(task());
            work
        } else {
            let work = self.submit(op, label, timeout, false, Box::new(task))?;
            watch(work.clone());
            work
        };
        work.wait_blocking()
    }

    /// Blocks until nothing is queued or running on the lane.
    pub(super) fn wait_idle(&self) {
        let mut st = self.lock();
        while st.pending > 0 {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Takes the first failure of an asynchronous call, if any.
    pub(super) fn take_failure(&self) -> Option<Error> {
        self.lock().failure.take()
    }

    /// Closes the lane: returns the jobs not yet started; the thread ends
    /// after the one it runs.
    pub(super) fn stop(&self) -> Unstarted {
        let mut st = self.lock();
        st.closed = true;
        let left: Vec<Job> = st.jobs.drain(..).collect();
        st.pending -= left.len();
        drop(st);
        self.cv.notify_all();
        Unstarted(left)
    }

    /// The comm was aborted: refuses later calls and completes the queued
    /// ones with `err` (before they leave the pending count, so that a
    /// drain never returns ahead of their completion). The thread stays,
    /// idle, until the window is dropped.
    pub(super) fn abort(&self, err: &Error) {
        let mut st = self.lock();
        st.aborted.get_or_insert_with(|| err.clone());
        let left: Vec<Job> = st.jobs.drain(..).collect();
        for job in &left {
            job.work.complete(Err(Error::new(
                ErrorKind::Aborted,
                format!(
                    "{}: {} before the operation ran",
                    job.work.description(),
                    err.message
                ),
            )));
        }
        st.pending -= left.len();
        drop(st);
        self.cv.notify_all();
    }

    pub(super) fn join(&self) {
        let thread = self.lock().thread.take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    fn serve(&self) {
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if st.closed {
                        return;
                    }
                    if let Some(job) = st.jobs.pop_front() {
                        break job;
                    }
                    st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            job.work.start();
            let result = catch_unwind(AssertUnwindSafe(job.task)).unwrap_or_else(|payload| {
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(Error::new(
                    ErrorKind::Panic,
                    format!("{}: internal panic: {what}", job.op),
                ))
            });
            let mut st = self.lock();
            // A call that fails once its comm is aborted was (as far as can
            // be told) ended by the abort closing the backend.
            let result = match (result, &st.aborted) {
                (Err(e), Some(aborted)) => Err(Error::new(
                    ErrorKind::Aborted,
                    format!(
                        "{}: {} (the call ended with: {})",
                        job.work.description(),
                        aborted.message,
                        e.message
                    ),
                )),
                (result, _) => result,
            };
            if let (Err(e), true) = (&result, job.is_async) {
                st.failure.get_or_insert_with(|| e.clone());
            }
            // Completed before it leaves the pending count: a drain that
            // sees the lane idle sees every work complete.
            job.work.complete(result);
            st.pending -= 1;
            drop(st);
            self.cv.notify_all();
        }
    }
}

/// The jobs a stopped lane never started.
pub(super) struct Unstarted(Vec<Job>);

impl Unstarted {
    /// Completes each with `ErrorKind::Aborted`: the window (`label`) was
    /// freed first.
    pub(super) fn abandon(self, label: &str) {
        for job in self.0 {
            job.work.complete(Err(Error::new(
                ErrorKind::Aborted,
                format!(
                    "{} on {label}: the window was freed before the operation ran",
                    job.op
                ),
            )));
        }
    }
}
