//! Work handles: the completion state of one operation.
//!
//! Host operations complete a [`HostWork`] from the comm's progress thread;
//! device backends provide their own [`Work`] (events on streams). The comm's
//! watchdog asks every outstanding work whether it has overrun its timeout.

use crate::error::{Error, ErrorKind, Result};
use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// Status of an operation, as `tc_work_status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum WorkStatus {
    NotStarted = 0,
    InProgress = 1,
    Completed = 2,
    TimedOut = 3,
    Error = 4,
}

impl WorkStatus {
    pub fn is_finished(self) -> bool {
        !matches!(self, WorkStatus::NotStarted | WorkStatus::InProgress)
    }

    fn from_i32(v: i32) -> WorkStatus {
        match v {
            0 => WorkStatus::NotStarted,
            1 => WorkStatus::InProgress,
            2 => WorkStatus::Completed,
            3 => WorkStatus::TimedOut,
            _ => WorkStatus::Error,
        }
    }
}

/// One operation's completion.
pub trait Work: Send + Sync {
    fn status(&self) -> WorkStatus;
    /// CPU work: blocks until the operation finished. Device work: makes
    /// `stream` wait for it without blocking the host.
    fn wait(&self, stream: *mut c_void) -> Result<()>;
    /// Blocks the host until the operation finished.
    fn wait_blocking(&self) -> Result<()>;
    /// Called by the watchdog: `Some(error)` once the operation has run longer
    /// than its timeout (marking it timed out).
    fn check_timeout(&self, now: Instant) -> Option<Error>;
    /// Whether the operation is known finished without asking anyone (a
    /// device work's status queries the driver): false when unsure.
    fn known_finished(&self) -> bool {
        false
    }
}

struct HostState {
    status: WorkStatus,
    error: Option<Error>,
    started: Option<Instant>,
    on_complete: Option<CompletionHook>,
    /// The operation finished and its completion hook runs: its duration
    /// delays the completion but is no part of the timeout.
    settling: bool,
    /// Threads in [`Work::wait_blocking`]: [`HostWork::complete`] notifies
    /// only when there are some (a call run inline has none).
    waiters: u32,
}

impl HostState {
    fn new() -> HostState {
        HostState {
            status: WorkStatus::NotStarted,
            error: None,
            started: None,
            on_complete: None,
            settling: false,
            waiters: 0,
        }
    }
}

/// Run once with the outcome when a [`HostWork`] completes, before its
/// waiters wake (the post hooks of [`crate::comm::hooks`]).
pub type CompletionHook = Box<dyn FnOnce(&Result<()>) + Send>;

/// What a thread about to wait for a [`HostWork`] does first: runs the
/// operations queued up to it itself when none is running (see
/// `host_executor`), sparing the hand-off to the progress thread and the
/// wake at completion.
pub trait WaitHelp: Send + Sync {
    fn help(&self, work: &HostWork);
}

/// Completion of an operation run on a comm's host progress thread.
pub struct HostWork {
    /// The operation's name and its comm's label; the description is only
    /// formatted when a message needs it, keeping the issue path free of it.
    op: &'static str,
    comm_label: Arc<str>,
    timeout: Duration,
    state: Mutex<HostState>,
    /// `state.status`, written with it under the lock: status queries (the
    /// caller's, the watchdog's pruning) and the wait for a work already
    /// completed take no lock.
    status: AtomicI32,
    done: Condvar,
    /// The executor whose queue a waiter may run (gone with its comm).
    help: Option<Weak<dyn WaitHelp>>,
}

impl HostWork {
    pub fn new(op: &'static str, comm_label: Arc<str>, timeout: Duration) -> HostWork {
        HostWork {
            op,
            comm_label,
            timeout,
            state: Mutex::new(HostState::new()),
            status: AtomicI32::new(WorkStatus::NotStarted as i32),
            done: Condvar::new(),
            help: None,
        }
    }

    /// This work, its waiters running `help`'s queue first (see
    /// [`WaitHelp`]).
    pub fn helped_by(mut self, help: Weak<dyn WaitHelp>) -> HostWork {
        self.help = Some(help);
        self
    }

    /// Makes this work what [`HostWork::new`] with these arguments makes,
    /// in place (`&mut`: nobody else can see it), and, with `started`, what
    /// [`HostWork::start_at`] then makes of it, without taking its lock.
    #[inline]
    pub fn renew(
        &mut self,
        op: &'static str,
        comm_label: &Arc<str>,
        timeout: Duration,
        started: Option<Instant>,
    ) {
        self.op = op;
        if !Arc::ptr_eq(&self.comm_label, comm_label) {
            self.comm_label = comm_label.clone();
        }
        self.timeout = timeout;
        let status = match started {
            Some(_) => WorkStatus::InProgress,
            None => WorkStatus::NotStarted,
        };
        match self.state.get_mut() {
            // Field by field: the error and hook are dropped only when
            // there is one (a work that completed well has neither).
            Ok(s) => {
                s.status = status;
                if s.error.is_some() {
                    s.error = None;
                }
                s.started = started;
                if s.on_complete.is_some() {
                    s.on_complete = None;
                }
                s.settling = false;
                s.waiters = 0;
            }
            // A completion hook panicked while the lock was held.
            Err(_) => {
                let mut state = HostState::new();
                state.status = status;
                state.started = started;
                self.state = Mutex::new(state);
            }
        }
        *self.status.get_mut() = status as i32;
    }

    /// A started work that a new thread named `thread` completes with
    /// `job`'s outcome: the async form of a call that runs outside a comm's
    /// progress thread.
    pub fn run_on_thread(
        op: &'static str,
        comm_label: Arc<str>,
        timeout: Duration,
        thread: &str,
        job: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<Arc<HostWork>> {
        let work = Arc::new(HostWork::new(op, comm_label, timeout));
        work.start();
        let done = work.clone();
        std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || done.complete(job()))
            .map_err(|e| Error::system(format!("starting the {op} thread"), e))?;
        Ok(work)
    }

    /// "all_reduce on comm 'x' (rank 0/4)", for messages.
    pub fn description(&self) -> String {
        format!("{} on {}", self.op, self.comm_label)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HostState> {
        crate::util::lock(&self.state)
    }

    /// Sets the status, `s` being this work's locked state.
    fn set_status(&self, s: &mut HostState, status: WorkStatus) {
        s.status = status;
        // Release: a reader that sees a finished status sees the error
        // stored before it (under the same lock).
        self.status.store(status as i32, Ordering::Release);
    }

    pub fn start(&self) {
        let mut s = self.lock();
        if s.status == WorkStatus::NotStarted {
            self.set_status(&mut s, WorkStatus::InProgress);
            s.started = Some(Instant::now());
        }
    }

    /// [`HostWork::start`] with the clock read the caller made just before
    /// (a call run at once on its caller's thread: its time of issue).
    pub fn start_at(&self, now: Instant) {
        let mut s = self.lock();
        if s.status == WorkStatus::NotStarted {
            self.set_status(&mut s, WorkStatus::InProgress);
            s.started = Some(now);
        }
    }

    /// Sets the function [`HostWork::complete`] runs first.
    pub fn on_complete(&self, hook: CompletionHook) {
        self.lock().on_complete = Some(hook);
    }

    /// Records the outcome (after running the completion hook, with no lock
    /// held, during which the watchdog no longer times the work out); a work
    /// already marked timed out keeps that status.
    #[inline]
    pub fn complete(&self, result: Result<()>) {
        // Inline, the common case: a success without a hook.
        if result.is_err() {
            return self.complete_with(result);
        }
        let mut s = self.lock();
        if s.on_complete.is_some() {
            drop(s);
            return self.complete_with(result);
        }
        if !s.status.is_finished() {
            self.set_status(&mut s, WorkStatus::Completed);
        }
        let waiters = s.waiters > 0;
        drop(s);
        if waiters {
            self.done.notify_all();
        }
    }

    /// [`HostWork::complete`] with an error or a completion hook.
    #[inline(never)]
    fn complete_with(&self, result: Result<()>) {
        let mut s = self.lock();
        if let Some(hook) = s.on_complete.take() {
            s.settling = true;
            drop(s);
            hook(&result);
            s = self.lock();
        }
        if !s.status.is_finished() {
            match result {
                Ok(()) => self.set_status(&mut s, WorkStatus::Completed),
                Err(e) => {
                    let status = if e.kind == ErrorKind::Timeout {
                        WorkStatus::TimedOut
                    } else {
                        WorkStatus::Error
                    };
                    s.error = Some(e);
                    self.set_status(&mut s, status);
                }
            }
        }
        let waiters = s.waiters > 0;
        drop(s);
        if waiters {
            self.done.notify_all();
        }
    }

    /// [`Work::wait_blocking`] for a work not known completed: runs the
    /// queue up to it when it may ([`WaitHelp`]), then waits.
    fn wait_unfinished(&self) -> Result<()> {
        if let Some(help) = self.help.as_ref().and_then(Weak::upgrade) {
            help.help(self);
        }
        let mut s = self.lock();
        if !s.status.is_finished() {
            s.waiters += 1;
            while !s.status.is_finished() {
                s = self.done.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.waiters -= 1;
        }
        HostWork::outcome(&s)
    }

    fn outcome(s: &HostState) -> Result<()> {
        match &s.error {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }
}

impl Work for HostWork {
    fn status(&self) -> WorkStatus {
        WorkStatus::from_i32(self.status.load(Ordering::Acquire))
    }

    fn known_finished(&self) -> bool {
        self.status().is_finished()
    }

    fn wait(&self, _stream: *mut c_void) -> Result<()> {
        self.wait_blocking()
    }

    #[inline]
    fn wait_blocking(&self) -> Result<()> {
        // Completed is final and carries no error (a call run inline has
        // completed by the time its caller waits).
        if self.status() == WorkStatus::Completed {
            return Ok(());
        }
        self.wait_unfinished()
    }

    fn check_timeout(&self, now: Instant) -> Option<Error> {
        let mut s = self.lock();
        let started = s.started?;
        if s.status != WorkStatus::InProgress
            || s.settling
            || now.duration_since(started) <= self.timeout
        {
            return None;
        }
        let err = Error::timeout(format!(
            "{} timed out after {} ms",
            self.description(),
            now.duration_since(started).as_millis()
        ));
        s.error = Some(err.clone());
        self.set_status(&mut s, WorkStatus::TimedOut);
        let waiters = s.waiters > 0;
        drop(s);
        if waiters {
            self.done.notify_all();
        }
        Some(err)
    }
}

/// A work that is already finished (used for operations with nothing to do).
pub struct DoneWork(pub Result<()>);

impl Work for DoneWork {
    fn status(&self) -> WorkStatus {
        match &self.0 {
            Ok(()) => WorkStatus::Completed,
            Err(_) => WorkStatus::Error,
        }
    }
    fn wait(&self, _stream: *mut c_void) -> Result<()> {
        self.0.clone()
    }
    fn wait_blocking(&self) -> Result<()> {
        self.0.clone()
    }
    fn check_timeout(&self, _now: Instant) -> Option<Error> {
        None
    }
    fn known_finished(&self) -> bool {
        true
    }
}
